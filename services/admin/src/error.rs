//! The admin API's one error type. Each variant knows its HTTP status and its `type`; the body
//! is always `{"error": {"type", "message", ...}}`. Messages never carry a secret: store errors
//! are logged here and answered with a fixed sentence.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;
use shield_core::FieldError;
use shield_core::parse::DecodeError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    /// `names` are listed in the body under `key` (e.g. `routes`), so a client can show them.
    #[error("{message}")]
    Conflict { message: String, key: &'static str, names: Vec<String> },
    #[error("{}", .0.first().map(|e| e.to_string()).unwrap_or_default())]
    Validation(Vec<FieldError>),
    #[error("{0}")]
    BadRequest(String),
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("too many attempts; try again in a minute")]
    RateLimited,
    #[error("Postgres is unavailable; the change was not made. Try again when the database is back.")]
    DatabaseUnavailable,
    #[error("Redis is unavailable; this view is read from it. Try again when it is back.")]
    RedisUnavailable,
    #[error("internal error")]
    Internal,
}

impl ApiError {
    fn kind(&self) -> &'static str {
        match self {
            ApiError::Unauthorized(_) => "authentication_error",
            ApiError::Forbidden(_) => "permission_error",
            ApiError::NotFound(_) => "not_found",
            ApiError::Conflict { .. } => "conflict",
            ApiError::Validation(_) => "validation_error",
            ApiError::BadRequest(_) => "invalid_request_error",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::RateLimited => "rate_limited",
            ApiError::DatabaseUnavailable | ApiError::RedisUnavailable => "store_unavailable",
            ApiError::Internal => "internal_error",
        }
    }

    pub fn validation(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::Validation(vec![FieldError::new(field, message)])
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            ApiError::DatabaseUnavailable | ApiError::RedisUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut error = json!({"type": self.kind(), "message": self.to_string()});
        match self {
            ApiError::Validation(errors) => {
                error["field"] = json!(errors.first().map(|e| e.field.as_str()).unwrap_or(""));
                error["errors"] = json!(errors);
            }
            ApiError::Conflict { key, names, .. } if !names.is_empty() => error[*key] = json!(names),
            _ => {}
        }
        let mut response = HttpResponse::build(self.status_code());
        if matches!(self, ApiError::Unauthorized(_)) {
            response.insert_header(("WWW-Authenticate", "Bearer"));
        }
        response.json(json!({ "error": error }))
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> ApiError {
        match err {
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::Tls(_) => {
                tracing::warn!(error = %err, "Postgres unavailable");
                ApiError::DatabaseUnavailable
            }
            other => {
                tracing::error!(error = %other, "database error");
                ApiError::Internal
            }
        }
    }
}

impl From<DecodeError> for ApiError {
    fn from(err: DecodeError) -> ApiError {
        match err {
            DecodeError::Malformed(why) => ApiError::BadRequest(format!("malformed JSON: {why}")),
            DecodeError::Invalid(field) => ApiError::Validation(vec![field]),
        }
    }
}

impl From<Vec<FieldError>> for ApiError {
    fn from(errors: Vec<FieldError>) -> ApiError {
        ApiError::Validation(errors)
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
