//! The proxy's answers: a status, headers, and a body that is whole or streamed.
//!
//! The builder keeps the shape the handlers were written against (`insert_header`, `json`,
//! `body`, `streaming`), so that rendering an outcome reads the same in every ingress shape.

use std::pin::Pin;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};

/// What a streamed body may fail with (the client sees the connection end early).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An answer's body.
pub enum Body {
    /// Known in full before the head is written (`None`: no body).
    Whole(Option<Bytes>),
    /// Written as it comes: a relayed stream. Dropped, and so ended, when the client goes.
    Streamed(Pin<Box<dyn Stream<Item = Result<Bytes, BoxError>>>>),
}

/// An answer, as a handler returns it.
pub struct Response(http::Response<Body>);

impl Response {
    /// A `200 OK` answer's builder.
    pub fn ok() -> ResponseBuilder {
        ResponseBuilder::new(StatusCode::OK)
    }

    pub fn build(status: StatusCode) -> ResponseBuilder {
        ResponseBuilder::new(status)
    }

    pub fn status(&self) -> StatusCode {
        self.0.status()
    }

    pub fn headers(&self) -> &HeaderMap {
        self.0.headers()
    }

    pub fn headers_mut(&mut self) -> &mut HeaderMap {
        self.0.headers_mut()
    }

    pub fn into_inner(self) -> http::Response<Body> {
        self.0
    }

    /// The whole body, read (tests).
    #[cfg(test)]
    pub async fn into_bytes(self) -> Bytes {
        match self.0.into_body() {
            Body::Whole(bytes) => bytes.unwrap_or_default(),
            Body::Streamed(mut stream) => {
                let mut out = bytes::BytesMut::new();
                while let Some(Ok(chunk)) = stream.next().await {
                    out.extend_from_slice(&chunk);
                }
                out.freeze()
            }
        }
    }
}

/// A status and headers, before the body.
pub struct ResponseBuilder {
    status: StatusCode,
    headers: HeaderMap,
}

impl ResponseBuilder {
    fn new(status: StatusCode) -> ResponseBuilder {
        ResponseBuilder { status, headers: HeaderMap::new() }
    }

    /// Sets a header. A name or value that is not valid HTTP is left out (they are Shield's own
    /// names and values: route and target names are checked when an admin saves them).
    pub fn insert_header<K, V>(&mut self, (name, value): (K, V)) -> &mut Self
    where
        K: TryInto<HeaderName>,
        V: TryInto<HeaderValue>,
    {
        if let (Ok(name), Ok(value)) = (name.try_into(), value.try_into()) {
            self.headers.insert(name, value);
        }
        self
    }

    pub fn content_type<V: TryInto<HeaderValue>>(&mut self, value: V) -> &mut Self {
        self.insert_header((CONTENT_TYPE, value))
    }

    /// The answer with `value` as JSON (`application/json`).
    pub fn json(&mut self, value: impl serde::Serialize) -> Response {
        match serde_json::to_vec(&value) {
            Ok(json) => {
                self.headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                self.body(json)
            }
            Err(err) => {
                tracing::error!(error = %err, "an answer could not be written as JSON");
                self.status = StatusCode::INTERNAL_SERVER_ERROR;
                self.finish()
            }
        }
    }

    pub fn body(&mut self, body: impl Into<Bytes>) -> Response {
        self.with(Body::Whole(Some(body.into())))
    }

    /// The answer with no body.
    pub fn finish(&mut self) -> Response {
        self.with(Body::Whole(None))
    }

    /// The answer with a body written as `stream` yields it.
    pub fn streaming<S, E>(&mut self, stream: S) -> Response
    where
        S: Stream<Item = Result<Bytes, E>> + 'static,
        E: Into<BoxError> + 'static,
    {
        self.with(Body::Streamed(Box::pin(stream.map(|chunk| chunk.map_err(Into::into)))))
    }

    fn with(&mut self, body: Body) -> Response {
        let mut response = http::Response::new(body);
        *response.status_mut() = self.status;
        *response.headers_mut() = std::mem::take(&mut self.headers);
        Response(response)
    }
}
