//! Amazon Bedrock's Converse API as a target (`flavor: "bedrock"`, issue 30; PROVIDERS.md
//! §1–§4): `POST {base_url}/model/{modelId}/converse`, or `/converse-stream` for a stream, the
//! model id (a base model, an inference profile or an ARN) percent-encoded as one path segment.
//!
//! Credentials: the vault secret is either an AWS key pair as JSON (`access_key_id`,
//! `secret_access_key`, optional `session_token`), which signs every attempt with SigV4
//! (service `bedrock`, the target's region) over the final URL, headers and body; or a Bedrock
//! API key, sent as `Authorization: Bearer`. Signing uses the AWS SDK's own signer
//! (`aws-sigv4`) without the SDK.
//!
//! The body, answers and stream events are mapped to and from the typed exchange in
//! [`converse`]; a stream is AWS's binary event stream, framed in [`frames`] (CRCs checked by
//! `aws-smithy-eventstream`). Errors are AWS's: the type in `x-amzn-errortype` or the body's
//! `__type`, the words in `message`.

mod converse;
mod frames;

use std::sync::Arc;

use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::Value;
use shield_core::outcome::Class;
use shield_core::spliced::Spliced;
use shield_core::target::Target;
use url::Url;

use super::{Answer, BodyBytes, Credential, Frames, Provider, Secret, StreamDecoder, join, reset_hint, with_method};
use crate::body::ChatRequest;
use crate::egress::Failure;

pub struct Bedrock;

pub static BEDROCK: Bedrock = Bedrock;

/// SigV4's signing name for the Bedrock runtime (not `bedrock-runtime`).
const SIGNING_NAME: &str = "bedrock";

/// An AWS key pair and the region it signs for. Never formatted.
pub struct AwsKeys {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    region: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyPair {
    access_key_id: String,
    secret_access_key: String,
    #[serde(default)]
    session_token: Option<String>,
}

/// Characters kept as they are in the model id's path segment (RFC 3986's unreserved); every
/// other one, `:` and `/` included, is percent-encoded, so ARNs and profiles are one segment.
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

impl Provider for Bedrock {
    /// `{base_url}/model/{modelId}`; the method is added per call.
    fn endpoint(&self, target: &Target) -> Result<Url, &'static str> {
        if target.model.trim().is_empty() {
            return Err("a bedrock target's model is a model id, inference profile or ARN");
        }
        join(target, &format!("/model/{}", percent_encoding::utf8_percent_encode(&target.model, SEGMENT)))
    }

    fn call_url<'u>(&self, endpoint: &'u Url, stream: bool) -> std::borrow::Cow<'u, Url> {
        with_method(endpoint, if stream { "/converse-stream" } else { "/converse" })
    }

    fn frames(&self, body: BodyBytes) -> Frames {
        frames::event_stream(body)
    }

    /// The content type is set here so that it is signed with the rest; no `Accept` (AWS's
    /// clients send none: the method says whether the answer streams).
    fn headers(&self, _target: &Target, _request: &ChatRequest, headers: &mut HeaderMap) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.remove(http::header::ACCEPT);
    }

    fn body(&self, request: &ChatRequest, target: &Target, _stream: bool) -> Spliced {
        let mut body = converse::request(&request.exchange, target);
        for (key, value) in target.extra_body.iter().flatten() {
            body.insert(key.clone(), value.clone());
        }
        shield_core::json_write::map_to_vec(&body).into()
    }

    fn dropped(&self, request: &ChatRequest, target: &Target) -> Vec<String> {
        converse::dropped(request, target)
    }

    /// A key pair (JSON) signs; anything else is a Bedrock API key, sent as a bearer token.
    fn credential(&self, target: &Target, secret: &str) -> Result<Credential, &'static str> {
        if !secret.trim_start().starts_with('{') {
            return Credential::new("authorization", "Bearer", secret.trim())
                .ok_or("the API key is not a header value");
        }
        let pair: KeyPair = serde_json::from_str(secret)
            .map_err(|_| "the secret is not {access_key_id, secret_access_key, session_token?} nor an API key")?;
        if pair.access_key_id.is_empty() || pair.secret_access_key.is_empty() {
            return Err("the key pair's access_key_id and secret_access_key must not be empty");
        }
        let region = target.bedrock_region().ok_or("the target names no region (bedrock.region)")?;
        Ok(Credential(Secret::Aws(Arc::new(AwsKeys {
            access_key_id: pair.access_key_id,
            secret_access_key: pair.secret_access_key,
            session_token: pair.session_token.filter(|t| !t.is_empty()),
            region,
        }))))
    }

    /// SigV4 over the final request, on every attempt (a retry is signed anew).
    fn authenticate(&self, credential: &Credential, url: &Url, body: &Spliced, headers: &mut HeaderMap) {
        match &credential.0 {
            // One part: the body is written here, never relayed as sent.
            Secret::Aws(keys) => sign(keys, url, &body.contiguous(), headers),
            _ => credential.insert_header(headers),
        }
    }

    fn answer(&self, body: Vec<u8>) -> Option<Answer> {
        converse::answer(&body)
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(converse::Decoder::default())
    }

    fn failure(&self, status: u16, headers: &HeaderMap, body: Vec<u8>) -> Failure {
        let kind = error_type(headers, &body);
        let class = classify(status, &kind, &body);
        let reset_hint_ms = (class == Class::RateLimited).then(|| reset_hint(headers)).flatten();
        Failure { class, status: Some(status), body: Some(body), reset_hint_ms }
    }
}

/// Signs the request in place: `authorization`, `x-amz-date` and (session credentials)
/// `x-amz-security-token`, marked sensitive. A request that cannot be signed goes unsigned
/// and is refused upstream (its URL is one Shield built, so this does not happen).
fn sign(keys: &AwsKeys, url: &Url, body: &[u8], headers: &mut HeaderMap) {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let identity = aws_credential_types::Credentials::new(
        &keys.access_key_id,
        &keys.secret_access_key,
        keys.session_token.clone(),
        None,
        "shield-vault",
    )
    .into();
    let Ok(params) = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(&keys.region)
        .name(SIGNING_NAME)
        .time(std::time::SystemTime::now())
        .settings(SigningSettings::default())
        .build()
    else {
        return;
    };
    let params = params.into();
    let pairs: Vec<(&str, &str)> = headers.iter().filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?))).collect();
    let Ok(signable) = SignableRequest::new("POST", url.as_str(), pairs.into_iter(), SignableBody::Bytes(body)) else {
        return;
    };
    let Ok(signed) = sign(signable, &params) else { return };
    let (instructions, _) = signed.into_parts();
    let signed: Vec<(HeaderName, HeaderValue)> = instructions
        .headers()
        .filter_map(|(name, value)| {
            let name = HeaderName::from_bytes(name.as_bytes()).ok()?;
            let mut value = HeaderValue::from_str(value).ok()?;
            value.set_sensitive(name == http::header::AUTHORIZATION || name.as_str() == "x-amz-security-token");
            Some((name, value))
        })
        .collect();
    for (name, value) in signed {
        headers.insert(name, value);
    }
}

/// The error's type: `x-amzn-errortype`, else the body's `__type` or `code`, without the
/// namespace or the `:…` suffix AWS adds (`ThrottlingException:http://…`).
fn error_type(headers: &HeaderMap, body: &[u8]) -> String {
    let from_header = headers.get("x-amzn-errortype").and_then(|v| v.to_str().ok()).map(str::to_string);
    let from_body = || {
        let value: Value = serde_json::from_slice(body).ok()?;
        ["__type", "code", "Code"].iter().find_map(|k| value.get(*k).and_then(Value::as_str).map(str::to_string))
    };
    let kind = from_header.or_else(from_body).unwrap_or_default();
    let kind = kind.split(':').next().unwrap_or_default();
    kind.rsplit('#').next().unwrap_or_default().to_string()
}

/// The error's words (`message` or `Message`), lowercased.
fn message_of(body: &[u8]) -> String {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let message = value.get("message").or_else(|| value.get("Message")).and_then(Value::as_str);
    message.unwrap_or_default().to_ascii_lowercase()
}

/// Whether a validation error says the input does not fit the model's context.
fn too_long(message: &str) -> bool {
    message.contains("input is too long")
        || message.contains("too many total text bytes")
        || (message.contains("exceed") && message.contains("context"))
}

/// PROVIDERS.md §4: Bedrock's error types as failure classes. Access denied (a wrong or
/// unauthorised key) never fails over: every target with the same key would refuse it too.
fn classify(status: u16, kind: &str, body: &[u8]) -> Class {
    let kind = kind.to_ascii_lowercase();
    match kind.trim_end_matches("exception") {
        "throttling" => Class::RateLimited,
        "servicequotaexceeded" => Class::QuotaExhausted,
        "modelnotready" | "serviceunavailable" | "internalserver" | "modelerror" | "modelstreamerror" => {
            Class::ServerError
        }
        "modeltimeout" => Class::Timeout,
        "validation" if too_long(&message_of(body)) => Class::ContextLength,
        "validation" | "accessdenied" | "unrecognizedclient" | "resourcenotfound" | "expiredtoken" => {
            Class::ClientError
        }
        _ => match status {
            408 => Class::Timeout,
            429 => Class::RateLimited,
            400 if too_long(&message_of(body)) => Class::ContextLength,
            _ => shield_core::outcome::classify_status(status, body),
        },
    }
}

/// An exception frame inside a stream (`{"__type": …, "message": …}`) as a failure class;
/// one of a kind not known here is the service's fault.
fn classify_exception(data: &[u8]) -> Class {
    let value: Value = serde_json::from_slice(data).unwrap_or(Value::Null);
    classify(500, value.get("__type").and_then(Value::as_str).unwrap_or_default(), data)
}

#[cfg(test)]
mod tests;
