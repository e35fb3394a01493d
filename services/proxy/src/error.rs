//! The data plane's errors, each with its HTTP status and OpenAI error `type`/`code`, rendered
//! as `{"error": {"message", "type", "code", "param", ...}}` (API.md). Messages never carry a
//! key or a prompt.

use crate::server::Response;
use http::StatusCode;
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0}")]
    InvalidApiKey(&'static str),
    #[error("the API key cannot be verified right now (the configuration store is unreachable); retry shortly")]
    AuthUnavailable,
    #[error("{0}")]
    BadRequest(String),
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("The model `{0}` does not exist")]
    ModelNotFound(String),
    #[error("this request has passed through {0} Shield gateways (X-Shield-Hop); refusing to loop")]
    LoopDetected(u32),
    #[error("the default upstream failed: {0}")]
    DefaultUpstream(String),
    /// The data plane's store is needed (a stored response) and cannot be reached.
    #[error("{0}: the store is unreachable right now; retry shortly")]
    StoreUnavailable(&'static str),
    /// A stored object (a response, issue 29) that this tenant does not have.
    #[error("{0}")]
    NotFound(String),
    /// Over a rate limit (issue 18): refused before routing, no upstream called.
    #[error("{}", .0.message())]
    RateLimited(Box<crate::limits::RateLimited>),
    /// The key's `expires_at` passed, or a rotation's grace for this old secret ended (issue 32).
    #[error("{}", expired_message(*.rotated, *.at))]
    KeyExpired { rotated: bool, at: i64 },
    /// The key's route allow-list does not name this model. The message is the same whether
    /// or not such a route exists: it reveals nothing about the tenant's routes.
    #[error("this API key may not use model `{0}` (it is not in the key's route allow-list)")]
    PermissionDenied(String),
    /// A monthly budget with `action: block` is spent (issue 32): the key's own, or the cap
    /// the platform operator set on the tenant. Refused before any upstream call.
    #[error("{}", .0.message())]
    BudgetExceeded(BudgetExceeded),
}

/// Which budget refused a call, and until when.
#[derive(Debug)]
pub struct BudgetExceeded {
    /// `key` or `tenant`.
    pub scope: &'static str,
    /// The budget, USD.
    pub monthly: shield_core::money::Usd,
    /// Seconds until the month ends (UTC), when the budget starts again.
    pub retry_after_s: u64,
}

impl BudgetExceeded {
    fn message(&self) -> String {
        let whose = match self.scope {
            "key" => "this API key reached its monthly budget",
            _ => "this tenant reached the monthly spend cap its platform operator set",
        };
        format!(
            "{whose} of {} USD; calls are refused until the month ends (UTC), in {} s",
            self.monthly.to_decimal(),
            self.retry_after_s
        )
    }
}

fn expired_message(rotated: bool, at: i64) -> String {
    let at = chrono::DateTime::from_timestamp(at, 0).map(|t| t.to_rfc3339()).unwrap_or_default();
    if rotated {
        format!("this API key was rotated: its old secret stopped working at {at}; use the new secret")
    } else {
        format!("this API key expired at {at}; ask its owner for a new key")
    }
}

impl ProxyError {
    fn kind_and_code(&self) -> (&'static str, &'static str) {
        match self {
            ProxyError::InvalidApiKey(_) => ("invalid_request_error", "invalid_api_key"),
            ProxyError::AuthUnavailable => ("service_unavailable", "auth_unavailable"),
            ProxyError::BadRequest(_) => ("invalid_request_error", "invalid_request"),
            ProxyError::TooLarge(_) => ("invalid_request_error", "request_too_large"),
            ProxyError::ModelNotFound(_) => ("invalid_request_error", "model_not_found"),
            ProxyError::LoopDetected(_) => ("invalid_request_error", "loop_detected"),
            ProxyError::DefaultUpstream(_) => ("upstream_error", "upstream_error"),
            ProxyError::StoreUnavailable(_) => ("service_unavailable", "store_unavailable"),
            ProxyError::NotFound(_) => ("invalid_request_error", "not_found"),
            // OpenAI's own shape: `type` is what ran out, `code` says it was a rate limit.
            ProxyError::RateLimited(limited) => (limited.kind.as_str(), "rate_limit_exceeded"),
            ProxyError::KeyExpired { .. } => ("invalid_request_error", "expired_api_key"),
            ProxyError::PermissionDenied(_) => ("permission_denied", "permission_denied"),
            ProxyError::BudgetExceeded(_) => ("budget_exceeded", "budget_exceeded"),
        }
    }
}

impl ProxyError {
    pub fn status_code(&self) -> StatusCode {
        match self {
            ProxyError::InvalidApiKey(_) => StatusCode::UNAUTHORIZED,
            ProxyError::AuthUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ProxyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::ModelNotFound(_) => StatusCode::NOT_FOUND,
            ProxyError::LoopDetected(_) => StatusCode::LOOP_DETECTED,
            ProxyError::DefaultUpstream(_) => StatusCode::BAD_GATEWAY,
            ProxyError::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::NotFound(_) => StatusCode::NOT_FOUND,
            ProxyError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::KeyExpired { .. } => StatusCode::UNAUTHORIZED,
            ProxyError::PermissionDenied(_) => StatusCode::FORBIDDEN,
            ProxyError::BudgetExceeded(_) => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The error as an answer in OpenAI's shape.
    pub fn error_response(&self) -> Response {
        let (kind, code) = self.kind_and_code();
        let param = match self {
            ProxyError::ModelNotFound(_) | ProxyError::PermissionDenied(_) => json!("model"),
            _ => Value::Null,
        };
        let mut body = openai_error(&self.to_string(), kind, code, param);
        if let ProxyError::RateLimited(limited) = self {
            crate::json::set(
                &mut body,
                &["error", "limit"],
                json!({"scope": limited.scope, "kind": limited.kind, "limit": limited.limit}),
            );
        }
        let mut response = Response::build(self.status_code()).json(body);
        self.decorate(&mut response);
        response
    }
}

impl ProxyError {
    /// Headers an error carries in every endpoint's shape: a rate limit's `Retry-After` and
    /// `x-ratelimit-*`; a spent budget's `Retry-After` (the month's end) and
    /// `x-should-retry: false`, so the SDKs do not retry a refusal that lasts for days.
    pub fn decorate(&self, response: &mut Response) {
        if let ProxyError::BudgetExceeded(exceeded) = self {
            use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
            if let Ok(value) = HeaderValue::try_from(exceeded.retry_after_s.to_string()) {
                response.headers_mut().insert(RETRY_AFTER, value);
            }
            response.headers_mut().insert(HeaderName::from_static("x-should-retry"), HeaderValue::from_static("false"));
        }
        if let ProxyError::RateLimited(limited) = self {
            crate::limits::apply(response, limited.headers.iter().cloned());
            if let Ok(value) = http::header::HeaderValue::try_from(limited.retry_after_s.to_string()) {
                response.headers_mut().insert(http::header::RETRY_AFTER, value);
            }
        }
    }
}

/// The OpenAI error body.
pub fn openai_error(message: &str, kind: &str, code: &str, param: Value) -> Value {
    json!({"error": {"message": message, "type": kind, "code": code, "param": param}})
}

impl From<shield_core::chat_request::BadRequest> for ProxyError {
    fn from(err: shield_core::chat_request::BadRequest) -> ProxyError {
        ProxyError::BadRequest(err.0)
    }
}
