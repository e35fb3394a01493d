//! The one validation error type: a JSON path and a reason a person can act on.

use serde::Serialize;

/// A validation failure naming the field (as a JSON path such as `auth.secret_ref` or
/// `rules[2].use[0]`) and why it was refused. Never contains a secret value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

/// Collects every problem in one pass so a form can show them field by field.
#[derive(Debug, Default)]
pub struct Problems(Vec<FieldError>);

impl Problems {
    pub fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError::new(field, message));
    }

    pub fn into_result(self) -> Result<(), Vec<FieldError>> {
        if self.0.is_empty() { Ok(()) } else { Err(self.0) }
    }
}
