//! The caller's request body, read under a size limit. Parsing is shield-core's
//! ([`ChatRequest`]), pure so that it can be fuzzed on its own.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
pub use shield_core::chat_request::{BadRequest, ChatRequest, MAX_MESSAGES};

use crate::error::ProxyError;
use crate::server::Request;

/// Chat requests with images can be large; beyond this a body is refused with 413.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// The whole body. A declared length over the limit is refused before a byte is read; a body
/// without one (chunked) is refused once it passes the limit.
pub async fn read(_req: &Request, mut payload: Incoming) -> Result<Bytes, ProxyError> {
    let unreadable = |e: hyper::Error| ProxyError::BadRequest(format!("could not read the request body: {e}"));
    let declared = payload.size_hint().exact();
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large(payload).await);
    }
    // The whole body in one frame, the usual case for a small one: a slice of hyper's read
    // buffer, taken as it is rather than copied (issue 33).
    let mut first: Option<Bytes> = None;
    let mut gathered: Option<BytesMut> = None;
    while let Some(frame) = payload.frame().await {
        let Ok(data) = frame.map_err(unreadable)?.into_data() else { continue };
        let so_far = gathered.as_ref().map_or(0, BytesMut::len) + first.as_ref().map_or(0, Bytes::len);
        if so_far + data.len() > MAX_BODY_BYTES {
            return Err(too_large(payload).await);
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

/// Refuses a body over the limit, once what the client is still sending has been read and
/// dropped (up to [`DRAIN_BYTES`] or [`DRAIN_TIME`]): a connection closed with unread bytes is
/// reset, and the client would see a broken connection instead of the 413.
async fn too_large(mut payload: Incoming) -> ProxyError {
    let drain = async {
        let mut drained = 0usize;
        while let Some(Ok(frame)) = payload.frame().await {
            drained += frame.data_ref().map_or(0, Bytes::len);
            if drained > DRAIN_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
    ProxyError::TooLarge(MAX_BODY_BYTES)
}

/// How much of a refused body is read and dropped, at most.
const DRAIN_BYTES: usize = 4 * MAX_BODY_BYTES;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(5);
