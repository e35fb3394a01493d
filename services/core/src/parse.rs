//! Strict JSON decoding that names the offending field as a JSON path.

use serde::de::DeserializeOwned;

use crate::FieldError;

/// Why a body could not be decoded: not JSON at all, or JSON with a field that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("malformed JSON: {0}")]
    Malformed(String),
    #[error(transparent)]
    Invalid(FieldError),
}

/// Decodes `body`, refusing unknown fields (the types say `deny_unknown_fields`) and reporting
/// the path of the first problem, e.g. `auth.mode: unknown variant "key"…`.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    match from_json(body) {
        Ok(value) => Ok(value),
        Err((field, true)) => Err(DecodeError::Invalid(field)),
        Err((field, false)) => Err(DecodeError::Malformed(field.message)),
    }
}

/// Like [`decode`], for callers that only need the field error.
pub fn from_json_field<T: DeserializeOwned>(body: &[u8]) -> Result<T, FieldError> {
    from_json(body).map_err(|(field, _)| field)
}

/// The error's second half says whether the JSON itself was well formed.
fn from_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, (FieldError, bool)> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let well_formed = err.inner().classify() == serde_json::error::Category::Data;
        let path = err.path().to_string();
        let path = if path == "." { String::new() } else { path };
        // A value in the wrong shape is named by its path; broken JSON by its position.
        let message = if well_formed { clean_message(&err.inner().to_string()) } else { err.inner().to_string() };
        // serde reports a missing field at its parent; name the field itself.
        let field = match message.strip_prefix("missing field `").and_then(|m| m.split('`').next()) {
            Some(missing) if path.is_empty() => missing.to_string(),
            Some(missing) => format!("{path}.{missing}"),
            None => path,
        };
        (FieldError::new(field, message), well_formed)
    })?;
    de.end().map_err(|e| (FieldError::new("", e.to_string()), false))?;
    Ok(value)
}

/// serde_json appends " at line 1 column 42"; the field path says more than the position.
fn clean_message(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) if message.get(i..).is_some_and(|at| at.contains("column")) => {
            message.get(..i).unwrap_or(message).to_string()
        }
        _ => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Target;

    fn from_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, FieldError> {
        from_json_field(body)
    }

    #[test]
    fn unknown_fields_are_named_with_their_path() {
        let err =
            from_json::<Target>(br#"{"base_url":"https://x.io","model":"m","auth":{"mode":"none","colour":"red"}}"#)
                .unwrap_err();
        assert_eq!(err.field, "auth.colour");
        assert!(err.message.contains("unknown field `colour`"), "{}", err.message);
        let err = from_json::<Target>(br#"{"base_url":"https://x.io","model":"m","auth":{"mode":"key"}}"#).unwrap_err();
        assert_eq!(err.field, "auth.mode");
        let err = from_json::<Target>(br#"{"base_url":"https://x.io","model":"m","timeout_s":-1}"#).unwrap_err();
        assert_eq!(err.field, "timeout_s");
        let err = from_json::<Target>(br#"{"base_url": "#).unwrap_err();
        assert!(err.message.contains("EOF"), "{}", err.message);
        assert!(matches!(decode::<Target>(b"{nope"), Err(DecodeError::Malformed(_))));
        assert!(matches!(decode::<Target>(br#"{"model": 1}"#), Err(DecodeError::Invalid(_))));
    }
}
