//! The default path (seed §7): no route for the model, no routing config, or routing off. One
//! call to `SHIELD_DEFAULT_UPSTREAM_URL` with the body exactly as sent and no failover; the
//! answer (streamed or not) relayed as received. Without a default upstream: 404
//! `model_not_found`. Never sends the caller's key or any provider key.

use std::time::Duration;

use crate::server::Response;
use bytes::Bytes;
use http::StatusCode;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};

use crate::ProxyState;
use crate::egress::Egress;
use crate::error::ProxyError;

/// Today's path had a 300 s single attempt; a default call is bounded at 120 s (seed §2).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

pub async fn forward(
    state: &ProxyState,
    egress: &Egress,
    model: &str,
    path: &str,
    body: Bytes,
    next_hop: u32,
    request_id: Option<http::HeaderValue>,
) -> Result<Response, ProxyError> {
    let Some(base) = &state.config.default_upstream else {
        return Err(ProxyError::ModelNotFound(model.to_string()));
    };
    let url = url_of(base, path);
    let mut headers = HeaderMap::with_capacity(2);
    headers.insert(ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
    headers.insert(crate::dispatch::HOP, crate::dispatch::hop_value(next_hop));
    if let Some(id) = request_id {
        headers.insert(crate::dispatch::REQUEST_ID, id);
    }
    let (head, body) = egress.relay(url, headers, body, DEFAULT_TIMEOUT).await.map_err(ProxyError::DefaultUpstream)?;
    let status = StatusCode::from_u16(head.status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut out = Response::build(status);
    if let Some(content_type) = head.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        out.insert_header(("content-type", content_type));
    }
    Ok(out.streaming(futures_util::StreamExt::map(body, |chunk| chunk.map_err(std::io::Error::other))))
}

/// `path` (`chat/completions`, `responses`) under the default upstream's base URL.
pub fn url_of(base: &url::Url, path: &str) -> url::Url {
    let joined = format!("{}/{path}", base.as_str().trim_end_matches('/'));
    url::Url::parse(&joined).unwrap_or_else(|_| base.clone())
}
