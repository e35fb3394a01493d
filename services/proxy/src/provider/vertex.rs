//! Google Cloud's Vertex AI as a target (`flavor: "vertex"`, issue 30; PROVIDERS.md §7, §8).
//! The base URL names the project and location
//! (`https://{region}-aiplatform.googleapis.com/v1/projects/{project}/locations/{region}`, or
//! the global endpoint); the target's `vertex.publisher` says whose model it calls:
//!
//! * Google's (Gemini): `{base_url}/publishers/google/models/{model}:generateContent`, or
//!   `:streamGenerateContent?alt=sse` — the Gemini API's body, answers, stream and errors
//!   ([`super::gemini`]), reused as they are.
//! * Anthropic's (Claude): `…/publishers/anthropic/models/{model}:rawPredict`, or
//!   `:streamRawPredict` — the Messages body ([`super::anthropic`]) without `model` (it is in
//!   the path) and with Vertex's `anthropic_version` in the body instead of the header; betas
//!   stay in `anthropic-beta`. Answers and streams are Anthropic's; errors come in Google's
//!   shape from Vertex itself or Anthropic's from the model, and each is read as such.
//!
//! The credential is a service account's key file, exchanged for access tokens by
//! [`token::TokenSource`].

mod token;

pub use token::TokenSource;

use http::header::HeaderMap;
use serde_json::Value;
use shield_core::spliced::Spliced;
use shield_core::target::Target;
use url::Url;

use super::anthropic::ANTHROPIC;
use super::gemini::GEMINI;
use super::{Answer, BodyBytes, Credential, Frames, Provider, Secret, StreamDecoder, join, with_method};
use crate::body::ChatRequest;
use crate::egress::Failure;

/// The Messages API version Vertex AI takes for Claude (in the body).
const ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

pub struct VertexGemini;
pub struct VertexClaude;

pub static VERTEX_GEMINI: VertexGemini = VertexGemini;
pub static VERTEX_CLAUDE: VertexClaude = VertexClaude;

/// `{base_url}/publishers/{publisher}/models/{model}`; the method is added per call.
fn model_url(target: &Target, publisher: &str) -> Result<Url, &'static str> {
    if target.model.is_empty() || target.model.contains(['/', '?', '#', ':']) {
        return Err("a vertex target's model is the publisher's model id");
    }
    join(target, &format!("/publishers/{publisher}/models/{}", target.model))
}

/// A service account's key file, shared with every target that uses the same file.
fn service_account(secret: &str) -> Result<Credential, &'static str> {
    TokenSource::shared(secret).map(|source| Credential(Secret::Google(source)))
}

impl Provider for VertexGemini {
    fn endpoint(&self, target: &Target) -> Result<Url, &'static str> {
        model_url(target, "google")
    }

    fn call_url<'u>(&self, endpoint: &'u Url, stream: bool) -> std::borrow::Cow<'u, Url> {
        GEMINI.call_url(endpoint, stream)
    }

    fn body(&self, request: &ChatRequest, target: &Target, stream: bool) -> Spliced {
        GEMINI.body(request, target, stream)
    }

    fn dropped(&self, request: &ChatRequest, target: &Target) -> Vec<String> {
        GEMINI.dropped(request, target)
    }

    fn credential(&self, _target: &Target, secret: &str) -> Result<Credential, &'static str> {
        service_account(secret)
    }

    fn answer(&self, body: Vec<u8>) -> Option<Answer> {
        GEMINI.answer(body)
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        GEMINI.decoder()
    }

    fn failure(&self, status: u16, headers: &HeaderMap, body: Vec<u8>) -> Failure {
        GEMINI.failure(status, headers, body)
    }
}

impl Provider for VertexClaude {
    fn endpoint(&self, target: &Target) -> Result<Url, &'static str> {
        model_url(target, "anthropic")
    }

    fn call_url<'u>(&self, endpoint: &'u Url, stream: bool) -> std::borrow::Cow<'u, Url> {
        with_method(endpoint, if stream { ":streamRawPredict" } else { ":rawPredict" })
    }

    fn frames(&self, body: BodyBytes) -> Frames {
        ANTHROPIC.frames(body)
    }

    /// The caller's `anthropic-beta` flags; the version goes in the body.
    fn headers(&self, target: &Target, request: &ChatRequest, headers: &mut HeaderMap) {
        ANTHROPIC.headers(target, request, headers);
        headers.remove("anthropic-version");
    }

    fn body(&self, request: &ChatRequest, target: &Target, stream: bool) -> Spliced {
        let mut body = ANTHROPIC.request_body(request, target, stream);
        body.fields.remove("model");
        body.fields.insert("anthropic_version".into(), Value::String(ANTHROPIC_VERSION.into()));
        body.to_vec().into()
    }

    fn dropped(&self, request: &ChatRequest, target: &Target) -> Vec<String> {
        ANTHROPIC.dropped(request, target)
    }

    fn credential(&self, _target: &Target, secret: &str) -> Result<Credential, &'static str> {
        service_account(secret)
    }

    fn answer(&self, body: Vec<u8>) -> Option<Answer> {
        ANTHROPIC.answer(body)
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        ANTHROPIC.decoder()
    }

    /// Vertex's own refusals (quota, permissions, a bad token) are Google's
    /// `{"error": {code, status, message}}`; the model's are Anthropic's.
    fn failure(&self, status: u16, headers: &HeaderMap, body: Vec<u8>) -> Failure {
        if google_error(&body) {
            GEMINI.failure(status, headers, body)
        } else {
            ANTHROPIC.failure(status, headers, body)
        }
    }
}

/// Whether an error body is Google's (`error.status` is a string such as `RESOURCE_EXHAUSTED`).
fn google_error(body: &[u8]) -> bool {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let value = match &value {
        Value::Array(items) if items.len() == 1 => items.first().unwrap_or(&Value::Null),
        other => other,
    };
    value.pointer("/error/status").is_some_and(Value::is_string)
}

#[cfg(test)]
mod tests;
