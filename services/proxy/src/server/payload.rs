//! A request's body, until a handler reads it.
//!
//! It is read from the request's connection as the handler asks ([`super::conn`]). A body the
//! handler leaves unread (a request refused before its body mattered: a bad key, a loop, a body
//! over the limit) is the connection's to read and drop after the answer, within bounds. A
//! client that sent `Expect: 100-continue` is invited to send its body only when the handler
//! first reads it: a refusal before that goes out without `100 Continue`.

use bytes::Bytes;

pub use super::conn::BodyError;
use super::conn::Reader;

pub struct Payload {
    reader: Reader,
    declared: Option<u64>,
}

impl Payload {
    pub(super) fn new(reader: Reader, declared: Option<u64>) -> Payload {
        Payload { reader, declared }
    }

    /// The declared length (`Content-Length`), when there is one.
    pub fn declared(&self) -> Option<u64> {
        self.declared
    }

    /// The next piece of the body; `None` at its end (or once an error was returned).
    pub async fn frame(&mut self) -> Option<Result<Bytes, BodyError>> {
        std::future::poll_fn(|cx| self.reader.poll_data(cx)).await
    }
}
