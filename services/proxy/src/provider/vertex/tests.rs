use super::*;
use serde_json::json;
use shield_core::outcome::Class;

use super::token::GOOGLE_TOKEN_URL;

fn target(publisher: &str, model: &str) -> Target {
    serde_json::from_value(json!({"flavor": "vertex", "model": model, "vertex": {"publisher": publisher},
        "base_url": "https://us-east5-aiplatform.googleapis.com/v1/projects/acme/locations/us-east5"}))
    .unwrap()
}

#[test]
fn urls_name_the_publisher_the_model_and_the_method() {
    let gemini = target("google", "gemini-2.5-flash");
    let provider = crate::provider::for_target(&gemini);
    let endpoint = provider.endpoint(&gemini).unwrap();
    assert_eq!(
        provider.call_url(&endpoint, true).as_str(),
        "https://us-east5-aiplatform.googleapis.com/v1/projects/acme/locations/us-east5/publishers/google/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
    let claude = target("anthropic", "claude-sonnet-4@20250514");
    let provider = crate::provider::for_target(&claude);
    let endpoint = provider.endpoint(&claude).unwrap();
    assert_eq!(
        provider.call_url(&endpoint, false).path(),
        "/v1/projects/acme/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:rawPredict"
    );
    assert!(provider.call_url(&endpoint, true).path().ends_with(":streamRawPredict"));
    assert!(provider.endpoint(&target("anthropic", "a/b")).is_err());
}

#[test]
fn claude_gets_the_messages_body_with_vertex_version_and_no_model() {
    let claude = target("anthropic", "claude-sonnet-4@20250514");
    let request = crate::messages::request::normalise(
        &r#"{"model": "r", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}"#.into(),
        crate::messages::request::Headers {
            beta: Some("context-1m-2025-08-07".into()),
            version: Some("2023-06-01".into()),
        },
        false,
    )
    .unwrap();
    let body: Value = serde_json::from_slice(&VERTEX_CLAUDE.body(&request, &claude, true).to_vec()).unwrap();
    assert_eq!(body["anthropic_version"], "vertex-2023-10-16");
    assert!(body.get("model").is_none(), "the model is in the path");
    assert_eq!((body["stream"].as_bool(), body["max_tokens"].as_u64()), (Some(true), Some(50)));
    let mut headers = HeaderMap::new();
    VERTEX_CLAUDE.headers(&claude, &request, &mut headers);
    assert!(headers.get("anthropic-version").is_none(), "the version is in the body");
    assert_eq!(headers["anthropic-beta"], "context-1m-2025-08-07");
}

#[test]
fn errors_are_read_in_googles_shape_or_anthropics() {
    let google = json!({"error": {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED",
        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3s"}]}});
    let failure = VERTEX_CLAUDE.failure(429, &HeaderMap::new(), google.to_string().into_bytes());
    assert_eq!((failure.class, failure.reset_hint_ms), (Class::RateLimited, Some(3000)));
    let anthropic = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let failure = VERTEX_CLAUDE.failure(529, &HeaderMap::new(), anthropic.to_string().into_bytes());
    assert_eq!(failure.class, Class::ServerError);
    let denied = json!({"error": {"code": 403, "message": "Permission denied", "status": "PERMISSION_DENIED"}});
    assert_eq!(
        VERTEX_GEMINI.failure(403, &HeaderMap::new(), denied.to_string().into_bytes()).class,
        Class::ClientError
    );
}

/// A fresh RSA key in PEM (PKCS#8), made by openssl.
fn rsa_key() -> String {
    let out = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])
        .output()
        .expect("openssl makes test keys");
    String::from_utf8(out.stdout).unwrap()
}

fn key_file(pem: &str, token_uri: Option<&str>) -> String {
    let mut file = json!({"type": "service_account", "project_id": "acme", "private_key_id": "k1",
        "private_key": pem, "client_email": "shield@acme.iam.gserviceaccount.com"});
    if let Some(uri) = token_uri {
        file["token_uri"] = json!(uri);
    }
    file.to_string()
}

#[test]
fn a_key_file_is_refused_when_it_names_another_token_endpoint_or_is_not_one() {
    let claude = target("anthropic", "m");
    let pem = rsa_key();
    assert!(VERTEX_CLAUDE.credential(&claude, &key_file(&pem, Some(GOOGLE_TOKEN_URL))).is_ok());
    assert!(VERTEX_CLAUDE.credential(&claude, &key_file(&pem, None)).is_ok());
    let evil = VERTEX_CLAUDE.credential(&claude, &key_file(&pem, Some("https://evil.example.com/token"))).unwrap_err();
    assert!(evil.contains("token_uri"), "{evil}");
    assert!(VERTEX_GEMINI.credential(&claude, "ya29.just-a-token").is_err());
    assert!(VERTEX_GEMINI.credential(&claude, &key_file("not a key", None)).is_err());
    // The same file is one source (one token) for every target that uses it.
    let a = TokenSource::shared(&key_file(&pem, None)).unwrap();
    let b = TokenSource::shared(&key_file(&pem, None)).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
}

/// A token endpoint on a local port: counts exchanges, answers after `delay` with a token
/// that lives `ttl` seconds, or refuses when `refuse` is set.
struct FakeEndpoint {
    url: Url,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    refuse: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

async fn fake_endpoint(ttl: u64, delay: std::time::Duration) -> FakeEndpoint {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = Url::parse(&format!("http://{}/token", listener.local_addr().unwrap())).unwrap();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let refuse = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (counted, refusing) = (calls.clone(), refuse.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let (counted, refusing) = (counted.clone(), refusing.clone());
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 8192];
                // Read the head and the form (the assertion is a few hundred bytes).
                while let Ok(n) = socket.read(&mut buffer).await {
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buffer[..n]);
                    let text = String::from_utf8_lossy(&request);
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let length = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if body.len() >= length {
                            assert!(body.contains(
                                "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=ey"
                            ));
                            break;
                        }
                    }
                }
                let n = counted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                let (status, body) = if refusing.load(Ordering::SeqCst) {
                    ("400 Bad Request", json!({"error": "invalid_grant"}).to_string())
                } else {
                    (
                        "200 OK",
                        json!({"access_token": format!("ya29.t{n}"), "expires_in": ttl, "token_type": "Bearer"})
                            .to_string(),
                    )
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    FakeEndpoint { url, calls, refuse }
}

#[tokio::test]
async fn tokens_are_fetched_once_for_all_concurrent_callers_cached_and_refreshed_early() {
    use std::sync::atomic::Ordering;
    let endpoint = fake_endpoint(3600, std::time::Duration::from_millis(200)).await;
    let source = TokenSource::shared_at(&key_file(&rsa_key(), None), endpoint.url.clone()).unwrap();
    let egress = crate::egress::Egress::default();
    let tokens = futures_util::future::join_all((0..20).map(|_| source.token(&egress, true))).await;
    assert_eq!(endpoint.calls.load(Ordering::SeqCst), 1, "one exchange for twenty callers");
    assert!(tokens.iter().all(|t| t.as_ref().unwrap() == "Bearer ya29.t0"));
    assert!(tokens[0].as_ref().unwrap().is_sensitive());
    source.token(&egress, true).await.unwrap();
    assert_eq!(endpoint.calls.load(Ordering::SeqCst), 1, "cached");

    // A token that lives 2 s is refreshed after half its life.
    let short = fake_endpoint(2, std::time::Duration::ZERO).await;
    let source = TokenSource::shared_at(&key_file(&rsa_key(), None), short.url.clone()).unwrap();
    assert_eq!(source.token(&egress, true).await.unwrap(), "Bearer ya29.t0");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(source.token(&egress, true).await.unwrap(), "Bearer ya29.t1");
}

#[tokio::test]
async fn an_absurd_token_lifetime_is_bounded_not_a_panic() {
    let endpoint = fake_endpoint(u64::MAX, std::time::Duration::ZERO).await;
    let source = TokenSource::shared_at(&key_file(&rsa_key(), None), endpoint.url.clone()).unwrap();
    let egress = crate::egress::Egress::default();
    assert_eq!(source.token(&egress, true).await.unwrap(), "Bearer ya29.t0");
    source.token(&egress, true).await.unwrap();
    assert_eq!(endpoint.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_refresh_is_a_credential_failure_fast_and_a_private_endpoint_needs_allow_private() {
    use std::sync::atomic::Ordering;
    let endpoint = fake_endpoint(3600, std::time::Duration::ZERO).await;
    endpoint.refuse.store(true, Ordering::SeqCst);
    let source = TokenSource::shared_at(&key_file(&rsa_key(), None), endpoint.url.clone()).unwrap();
    let egress = crate::egress::Egress::default();
    let failure = source.token(&egress, true).await.unwrap_err();
    assert_eq!(failure.class, Class::CredentialUnavailable);
    let failures = futures_util::future::join_all((0..10).map(|_| source.token(&egress, true))).await;
    assert!(failures.iter().all(|f| f.as_ref().is_err_and(|f| f.class == Class::CredentialUnavailable)));
    assert_eq!(endpoint.calls.load(Ordering::SeqCst), 1, "no new exchange within the back-off");

    let guarded = fake_endpoint(3600, std::time::Duration::ZERO).await;
    let source = TokenSource::shared_at(&key_file(&rsa_key(), None), guarded.url.clone()).unwrap();
    assert_eq!(source.token(&egress, false).await.unwrap_err().class, Class::CredentialUnavailable);
    assert_eq!(guarded.calls.load(Ordering::SeqCst), 0, "the SSRF check refused the private address");
}
