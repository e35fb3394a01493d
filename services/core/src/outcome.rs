//! What happened to one attempt, as a failure class of ROUTING.md's table, and what a route
//! does about it. The classifier reads status, headers' meaning and the provider's error body;
//! it never sees a secret.

use serde::{Serialize, Serializer};

use crate::route::FailoverOn;

/// ROUTING.md "Failure classes". `Ok` is not a failure; every other variant is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Timeout,
    Connect,
    RateLimited,
    /// A 429 (or a stream's error event) whose body says the quota is spent: governed by `429`.
    QuotaExhausted,
    /// A 402, credit spent (seed 002): governed by the opt-in `402` alone. ROUTING.md names one
    /// class, `quota_exhausted`, for both; they differ only in which `failover.on` entry
    /// lets the run move on, so both carry that label.
    CreditExhausted,
    ServerError,
    BadResponse,
    CredentialUnavailable,
    UnsafeUrl,
    ContextLength,
    ClientError,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Timeout => "timeout",
            Class::Connect => "connect",
            Class::RateLimited => "rate_limited",
            Class::QuotaExhausted | Class::CreditExhausted => "quota_exhausted",
            Class::ServerError => "server_error",
            Class::BadResponse => "bad_response",
            Class::CredentialUnavailable => "credential_unavailable",
            Class::UnsafeUrl => "unsafe_url",
            Class::ContextLength => "context_length",
            Class::ClientError => "client_error",
        }
    }

    /// Whether a route with `on` moves on to the next eligible target after this failure.
    pub fn fails_over(self, on: &[FailoverOn]) -> bool {
        let listed = |class| on.contains(&class);
        match self {
            Class::Timeout => listed(FailoverOn::Timeout),
            Class::Connect => listed(FailoverOn::Connect),
            Class::RateLimited => listed(FailoverOn::RateLimited),
            Class::QuotaExhausted => listed(FailoverOn::RateLimited),
            // Opt-in: the default `on` does not rescue a route from a 402 (ROUTING.md).
            Class::CreditExhausted => listed(FailoverOn::PaymentRequired),
            Class::ServerError => listed(FailoverOn::ServerError),
            // A 2xx that is not a completion, or a failure detected before sending: always
            // move on (ROUTING.md).
            Class::BadResponse | Class::CredentialUnavailable | Class::UnsafeUrl => true,
            Class::ContextLength => listed(FailoverOn::ContextLength),
            // Seed §7: the request or credential is wrong; another target would fail the same
            // way or leak a bad request further.
            Class::ClientError => false,
        }
    }

    /// Whether the target is parked as `exhausted` after this failure (ROUTING.md "Exhaustion
    /// cooldown"), whether or not the run moves on: a rate limit only when it says when it
    /// resets.
    pub fn parks(self, has_reset_hint: bool) -> bool {
        match self {
            Class::QuotaExhausted | Class::CreditExhausted => true,
            Class::RateLimited => has_reset_hint,
            _ => false,
        }
    }

    /// Whether the failure counts against the target's circuit breaker.
    pub fn is_breaker_failure(self) -> bool {
        !matches!(self, Class::ContextLength | Class::ClientError)
    }
}

impl Serialize for Class {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Classifies an upstream HTTP answer that is not a success. `body` is the provider's error
/// body (possibly not JSON).
pub fn classify_status(status: u16, body: &[u8]) -> Class {
    let code = error_code(body);
    let says = |needle: &str| code.as_deref().is_some_and(|c| c.contains(needle));
    match status {
        402 => Class::CreditExhausted,
        429 if says("insufficient_quota") || says("quota") => Class::QuotaExhausted,
        429 => Class::RateLimited,
        400 | 413 | 422 if says("context_length") || says("maximum context") || says("too many tokens") => {
            Class::ContextLength
        }
        500..=599 => Class::ServerError,
        // A redirect is not followed (egress policy) and is not a completion.
        300..=399 => Class::BadResponse,
        _ => Class::ClientError,
    }
}

/// Classifies an error a provider sent inside a 200 stream (`data: {"error": ...}`) before
/// any content: the provider's words decide, a server error otherwise.
pub fn classify_error_event(body: &[u8]) -> Class {
    let code = error_code(body).unwrap_or_default();
    if code.contains("insufficient_quota") || code.contains("quota") {
        Class::QuotaExhausted
    } else if code.contains("rate_limit") {
        Class::RateLimited
    } else if code.contains("context_length") || code.contains("maximum context") {
        Class::ContextLength
    } else {
        Class::ServerError
    }
}

/// The provider's machine-readable error, lower-cased: `error.code`, `error.type`, and for
/// bodies without either, `error.message` (vLLM puts the reason only there).
fn error_code(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error").unwrap_or(&value);
    let mut parts = Vec::new();
    for key in ["code", "type", "message"] {
        match error.get(key) {
            Some(serde_json::Value::String(s)) => parts.push(s.to_ascii_lowercase()),
            Some(serde_json::Value::Number(n)) => parts.push(n.to_string()),
            _ => {}
        }
    }
    if let serde_json::Value::String(s) = error {
        parts.push(s.to_ascii_lowercase());
    }
    (!parts.is_empty()).then(|| parts.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_provider_bodies() {
        let openai_quota = br#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        let openai_rate = br#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
        let openai_context = br#"{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        let azure_context = br#"{"error":{"code":"context_length_exceeded","message":"This model's maximum context length is 4096 tokens.","param":"messages","type":"invalid_request_error"}}"#;
        let vllm_context = br#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens","type":"BadRequestError","param":null,"code":400}"#;
        let openrouter_credits = br#"{"error":{"code":402,"message":"Insufficient credits"}}"#;
        let cases: [(u16, &[u8], Class); 12] = [
            (429, openai_quota, Class::QuotaExhausted),
            (429, openai_rate, Class::RateLimited),
            (429, b"slow down", Class::RateLimited),
            (402, openrouter_credits, Class::CreditExhausted),
            (400, openai_context, Class::ContextLength),
            (400, azure_context, Class::ContextLength),
            (400, vllm_context, Class::ContextLength),
            (400, br#"{"error":{"message":"bad","type":"invalid_request_error"}}"#, Class::ClientError),
            (403, br#"{"error":{"message":"quota of something"}}"#, Class::ClientError),
            (503, b"<html>unavailable</html>", Class::ServerError),
            (301, b"", Class::BadResponse),
            (404, b"", Class::ClientError),
        ];
        for (status, body, want) in cases {
            assert_eq!(classify_status(status, body), want, "{status} {}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn failover_follows_the_route() {
        let default = crate::route::Failover::default().on;
        assert!(Class::ServerError.fails_over(&default));
        assert!(Class::RateLimited.fails_over(&default));
        assert!(Class::QuotaExhausted.fails_over(&default));
        assert!(!Class::ContextLength.fails_over(&default));
        assert!(!Class::ClientError.fails_over(&default));
        assert!(Class::BadResponse.fails_over(&[]));
        assert!(!Class::ServerError.fails_over(&[FailoverOn::Timeout]));
        assert!(Class::ContextLength.fails_over(&[FailoverOn::ContextLength]));
    }

    /// Issue 14: {402, 429-quota} × {default on, on with 402, on without 429}.
    #[test]
    fn payment_required_is_opt_in_and_quota_follows_429() {
        use FailoverOn::*;
        let default = crate::route::Failover::default().on;
        let with_402: Vec<FailoverOn> = default.iter().copied().chain([PaymentRequired]).collect();
        let without_429 = vec![Timeout, Connect, ServerError, PaymentRequired];
        let credit = classify_status(402, br#"{"error":{"code":402,"message":"Insufficient credits"}}"#);
        let quota = classify_status(429, br#"{"error":{"code":"insufficient_quota"}}"#);
        let table = [
            (credit, &default, false),
            (credit, &with_402, true),
            (credit, &without_429, true),
            (quota, &default, true),
            (quota, &with_402, true),
            (quota, &without_429, false),
        ];
        for (class, on, moves_on) in table {
            assert_eq!(class.fails_over(on), moves_on, "{class:?} with on = {on:?}");
            // Parking is independent of failing over: both park, listed or not.
            assert!(class.parks(false), "{class:?} parks the target");
            assert_eq!(class.as_str(), "quota_exhausted");
        }
        assert!(!Class::RateLimited.parks(false) && Class::RateLimited.parks(true));
        assert_eq!(serde_json::to_value(Class::CreditExhausted).unwrap(), "quota_exhausted");
        assert_eq!(serde_json::to_value(Class::ServerError).unwrap(), "server_error");
    }

    #[test]
    fn error_events_in_a_stream() {
        assert_eq!(
            classify_error_event(br#"{"error":{"message":"overloaded","type":"server_error"}}"#),
            Class::ServerError
        );
        assert_eq!(classify_error_event(br#"{"error":{"code":"rate_limit_exceeded"}}"#), Class::RateLimited);
        assert_eq!(classify_error_event(br#"{"error":{"code":"insufficient_quota"}}"#), Class::QuotaExhausted);
    }
}
