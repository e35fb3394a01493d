//! The caller's request body, read under a size limit. Parsing is shield-core's
//! ([`ChatRequest`]), pure so that it can be fuzzed on its own.

use bytes::{Bytes, BytesMut};
pub use shield_core::chat_request::{BadRequest, ChatRequest, MAX_MESSAGES};

use crate::error::ProxyError;
use crate::server::Payload;

/// Chat requests with images can be large; beyond this a body is refused with 413.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// The whole body. A declared length over the limit is refused before a byte is read; a body
/// without one (chunked) is refused once it passes the limit. What a refused body still has
/// to send is read and dropped by its connection after the answer ([`Payload`]).
pub async fn read(mut payload: Payload) -> Result<Bytes, ProxyError> {
    let unreadable =
        |e: crate::server::BodyError| ProxyError::BadRequest(format!("could not read the request body: {e}"));
    let declared = payload.declared();
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(ProxyError::TooLarge(MAX_BODY_BYTES));
    }
    // The whole body in one frame, the usual case for a small one: a slice of the connection's read
    // buffer, taken as it is rather than copied (issue 33).
    let mut first: Option<Bytes> = None;
    let mut gathered: Option<BytesMut> = None;
    while let Some(frame) = payload.frame().await {
        let data = frame.map_err(unreadable)?;
        let so_far = gathered.as_ref().map_or(0, BytesMut::len) + first.as_ref().map_or(0, Bytes::len);
        if so_far + data.len() > MAX_BODY_BYTES {
            return Err(ProxyError::TooLarge(MAX_BODY_BYTES));
        }
        match (&mut gathered, first.take()) {
            (Some(body), _) => body.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(one)) => {
                // Sized once from Content-Length (within the limit): a 150 KB agent body read
                // in frames otherwise grows its buffer several times over, copying it each time.
                let size = usize::try_from(declared.unwrap_or(0)).unwrap_or(0).max(one.len() + data.len());
                let mut body = BytesMut::with_capacity(size.min(MAX_BODY_BYTES));
                body.extend_from_slice(&one);
                body.extend_from_slice(&data);
                gathered = Some(body);
            }
        }
    }
    Ok(gathered.map(BytesMut::freeze).or(first).unwrap_or_default())
}
