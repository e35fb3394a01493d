//! Google Cloud on the mock (issue 30): an OAuth token endpoint for service accounts and
//! Vertex AI's publisher endpoints.
//!
//! * `POST /token` (also under `/mock/{scenario}/`): takes the JWT-bearer grant
//!   (`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=…`), verifies the
//!   RS256 assertion with a public key the test trusted (`POST /_mock/trust`), its audience
//!   (this endpoint's URL), scope and lifetime, and answers `{access_token, expires_in,
//!   token_type}`; `ttl:S` sets `expires_in`, a `status:` refuses (`invalid_grant`).
//! * `POST /v1/projects/{p}/locations/{l}/publishers/google/models/{m}:generateContent` (and
//!   `:streamGenerateContent?alt=sse`): the Gemini wire; `…/publishers/anthropic/models/{m}:rawPredict`
//!   (and `:streamRawPredict`): the Messages wire, whose body must carry
//!   `anthropic_version: vertex-2023-10-16` and no `model`. Both need `Authorization: Bearer`
//!   with a token this mock issued and that has not expired (else 401 `UNAUTHENTICATED`).

use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use crate::{MockState, Scenario};

#[derive(Deserialize)]
struct Claims {
    iss: String,
    scope: String,
    iat: u64,
    exp: u64,
}

/// Google's OAuth error body.
fn refused(status: StatusCode, description: &str) -> HttpResponse {
    HttpResponse::build(status).json(json!({"error": "invalid_grant", "error_description": description}))
}

/// `POST …/token`.
pub(crate) fn token(
    req: &HttpRequest,
    status: StatusCode,
    scenario: &Scenario,
    body: &Bytes,
    state: &MockState,
) -> HttpResponse {
    if !status.is_success() {
        return refused(status, "mock refusal");
    }
    let form: std::collections::HashMap<String, String> =
        actix_web::web::Query::<std::collections::HashMap<String, String>>::from_query(&String::from_utf8_lossy(body))
            .map(|q| q.into_inner())
            .unwrap_or_default();
    if form.get("grant_type").map(String::as_str) != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
        return refused(StatusCode::BAD_REQUEST, "unsupported grant_type");
    }
    let Some(assertion) = form.get("assertion") else { return refused(StatusCode::BAD_REQUEST, "no assertion") };
    let host = req.connection_info().host().to_string();
    let audience = format!("http://{host}{}", req.path());
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_audience(&[audience.as_str()]);
    validation.set_required_spec_claims(&["exp", "aud", "iss"]);
    let keys = state.trust.lock().google_keys.clone();
    let claims = keys.iter().find_map(|pem| {
        let key = jsonwebtoken::DecodingKey::from_rsa_pem(pem.as_bytes()).ok()?;
        jsonwebtoken::decode::<Claims>(assertion, &key, &validation).ok().map(|data| data.claims)
    });
    let Some(claims) = claims else {
        return refused(StatusCode::BAD_REQUEST, "Invalid JWT Signature.");
    };
    if !claims.scope.split(' ').any(|s| s == "https://www.googleapis.com/auth/cloud-platform") {
        return refused(StatusCode::BAD_REQUEST, "the scope is not cloud-platform");
    }
    if claims.exp <= claims.iat || claims.exp - claims.iat > 3600 || claims.iss.is_empty() {
        return refused(StatusCode::BAD_REQUEST, "Invalid JWT: the lifetime is more than an hour");
    }
    let ttl = scenario.token_ttl.unwrap_or(3600);
    let token = format!("ya29.mock-{}", uuid::Uuid::new_v4().simple());
    state.trust.lock().tokens.insert(token.clone(), Instant::now() + Duration::from_secs(ttl));
    HttpResponse::Ok().json(json!({"access_token": token, "expires_in": ttl, "token_type": "Bearer"}))
}

/// The 401 Vertex answers unless the request carries a token this mock issued that has not
/// expired.
pub(crate) fn refuse_bearer(req: &HttpRequest, state: &MockState) -> Option<HttpResponse> {
    let sent = req.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let valid =
        sent.is_some_and(|token| state.trust.lock().tokens.get(token).is_some_and(|until| Instant::now() < *until));
    (!valid).then(|| {
        HttpResponse::Unauthorized().json(json!({"error": {"code": 401,
            "message": "Request had invalid authentication credentials. Expected OAuth 2 access token.",
            "status": "UNAUTHENTICATED"}}))
    })
}

/// `…/publishers/{publisher}/models/{model}:{method}` → (publisher, method).
pub(crate) fn vertex_call(rest: &str) -> Option<(&str, &str)> {
    if !rest.starts_with("/v1/projects/") {
        return None;
    }
    let (_, after) = rest.split_once("/publishers/")?;
    let (publisher, model) = after.split_once("/models/")?;
    let (_, method) = model.rsplit_once(':')?;
    Some((publisher, method))
}
