//! The caller's request body, read under a size limit. Parsing is shield-core's
//! ([`ChatRequest`]), pure so that it can be fuzzed on its own.

use actix_web::web::{self, Bytes};
use futures_util::StreamExt;
pub use shield_core::chat_request::{BadRequest, ChatRequest, MAX_MESSAGES};

use crate::error::ProxyError;

/// Chat requests with images can be large; beyond this a body is refused with 413.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

pub async fn read(req: &actix_web::HttpRequest, mut payload: web::Payload) -> Result<Bytes, ProxyError> {
    let unreadable =
        |e: actix_web::error::PayloadError| ProxyError::BadRequest(format!("could not read the request body: {e}"));
    let first = match payload.next().await {
        None => return Ok(Bytes::new()),
        Some(chunk) => chunk.map_err(unreadable)?,
    };
    if first.len() > MAX_BODY_BYTES {
        return Err(ProxyError::TooLarge(MAX_BODY_BYTES));
    }
    // The whole body in one chunk, the usual case below actix's 128 KB read ceiling: a slice of
    // actix's read buffer, taken as it is rather than copied (issue 33).
    let Some(second) = payload.next().await else { return Ok(first) };
    let second = second.map_err(unreadable)?;
    // Sized once from Content-Length (within the limit): a 150 KB agent body read in chunks
    // otherwise grows its buffer several times over, copying it each time (issue 33).
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = web::BytesMut::with_capacity(declared.max(first.len() + second.len()).min(MAX_BODY_BYTES));
    body.extend_from_slice(&first);
    let mut next = Some(Ok(second));
    while let Some(chunk) = next {
        let chunk = chunk.map_err(unreadable)?;
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(ProxyError::TooLarge(MAX_BODY_BYTES));
        }
        body.extend_from_slice(&chunk);
        next = payload.next().await;
    }
    Ok(body.freeze())
}
