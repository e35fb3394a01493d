//! A request's body, until a handler reads it.
//!
//! A body a handler leaves unread (a request refused before its body mattered: a bad key, a
//! loop, a body over the limit) is read and dropped in the background, within bounds, while
//! the refusal goes out: a client still writing it would otherwise meet a closed connection
//! (hyper stops reading an abandoned body, and the kernel resets a socket closed with unread
//! bytes) and report a broken connection instead of the refusal. A client that sent
//! `Expect: 100-continue` is not invited to send it: hyper answers without `100 Continue`.

use std::time::Duration;

use bytes::Bytes;
use http::header::EXPECT;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};

/// How much of an unread body is read and dropped, at most, and for how long.
const DRAIN_BYTES: u64 = 32 * 1024 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(5);

pub struct Payload {
    body: Option<Incoming>,
    /// The client waits for `100 Continue` before it sends the body.
    expects_continue: bool,
}

impl Payload {
    pub fn new(body: Incoming, head: &http::request::Parts) -> Payload {
        let expects_continue =
            head.headers.get(EXPECT).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        Payload { body: Some(body), expects_continue }
    }

    /// The declared length (`Content-Length`), when there is one.
    pub fn declared(&self) -> Option<u64> {
        self.body.as_ref().and_then(|b| b.size_hint().exact())
    }

    /// The next frame; `None` at the end (or once an error was returned).
    pub async fn frame(&mut self) -> Option<Result<Frame<Bytes>, hyper::Error>> {
        self.body.as_mut()?.frame().await
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        let Some(body) = self.body.take() else { return };
        // A declared length past the bound would be cut off anyway: the connection closes.
        let too_long = body.size_hint().exact().is_some_and(|n| n > DRAIN_BYTES);
        if body.is_end_stream() || self.expects_continue || too_long {
            return;
        }
        // Outside a runtime (never on the request path) the body is simply dropped.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(drain(body));
        }
    }
}

/// Reads `body` to its end, up to [`DRAIN_BYTES`] or [`DRAIN_TIME`], and drops what it read.
async fn drain(mut body: Incoming) {
    let read = async {
        let mut drained = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            drained += frame.data_ref().map_or(0, |d| d.len() as u64);
            if drained > DRAIN_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, read).await;
}
