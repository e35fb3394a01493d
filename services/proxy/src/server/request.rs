//! A request as the handlers read it: its head (the headers) and what the arrival layer decided
//! for it (its id, its [`Trail`]). The body travels separately ([`crate::body::read`]): a
//! handler reads it only once the caller is admitted.

use std::sync::Arc;

use http::header::{HeaderMap, HeaderValue};

use crate::context::Trail;

pub struct Request {
    head: http::request::Parts,
    request_id: HeaderValue,
    trail: Option<Arc<Trail>>,
}

impl Request {
    pub fn new(head: http::request::Parts, request_id: HeaderValue, trail: Option<Arc<Trail>>) -> Request {
        Request { head, request_id, trail }
    }

    pub fn headers(&self) -> &HeaderMap {
        &self.head.headers
    }

    /// The request's id (the caller's `X-Request-Id`, or the one Shield made).
    pub fn request_id(&self) -> &HeaderValue {
        &self.request_id
    }

    /// The request's trail; `None` for probes and scrapes.
    pub fn trail(&self) -> Option<&Arc<Trail>> {
        self.trail.as_ref()
    }
}
