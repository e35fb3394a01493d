//! Attacks from the outside: SSRF in every spelling at write time, DNS rebinding and a redirect
//! at call time,
//! forged and tampered admin tokens, and request limits on both planes (body size, JSON depth,
//! header size, message count). Each refusal names the problem and the process keeps serving.
//! Cross-tenant attempts on every endpoint are in isolation.rs and proxy_auth.rs; secret leaks
//! in secrets_never_leak.rs.

use base64::Engine;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_admin::auth::{Scope, Tokens};
use shield_e2e::admin::Admin;
use shield_e2e::stack::{Stack, chat_body};

const T: &str = "/v1/tenant/me/gateway/targets/probe";

#[actix_web::test]
async fn private_destinations_are_refused_in_every_spelling() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let refused = [
        "http://127.0.0.1/v1",
        "http://127.1/v1",
        "http://2130706433/v1",
        "http://0x7f000001/v1",
        "http://0177.0.0.1/v1",
        "http://0/v1",
        "http://10.1.2.3/v1",
        "http://172.16.0.1/v1",
        "http://192.168.1.1/v1",
        "http://100.64.0.1/v1",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/v1",
        "http://[::]/v1",
        "http://[::ffff:127.0.0.1]/v1",
        "http://[::ffff:a9fe:a9fe]/v1",
        "http://[64:ff9b::a9fe:a9fe]/v1",
        "http://[2002:a00:1::1]/v1",
        "http://[fd00:ec2::254]/v1",
        "http://[fe80::1]/v1",
        "http://224.0.0.1/v1",
        "http://localhost/v1",
        "http://localhost./v1",
        "http://user:password@api.example.com/v1",
        "file:///etc/passwd",
        "gopher://api.example.com/",
        "ftp://api.example.com/",
    ];
    for url in refused {
        let body = json!({"base_url": url, "model": "m", "auth": {"mode": "none"}});
        let (status, answer) = admin.put(T, &token, body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{url} was accepted: {answer}");
        assert_eq!(answer["error"]["field"], "base_url", "{url}: {answer}");
    }
    let (_, targets) = admin.get("/v1/tenant/me/gateway/targets", &token).await;
    assert_eq!(targets["targets"], json!([]), "nothing was stored");

    // A private model host is possible, deliberately: allow_private, which needs registry:write.
    let private =
        json!({"base_url": "http://10.1.2.3/v1", "model": "m", "auth": {"mode": "none"}, "allow_private": true});
    let writer = admin.token(Some(&slug), &[Scope::TenantRead, Scope::ConfigWrite]);
    assert_eq!(admin.put(T, &writer, private.clone()).await.0, StatusCode::FORBIDDEN);
    assert_eq!(admin.put(T, &token, private).await.0, StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_redirect_is_not_followed() {
    let stack = Stack::start().await;
    stack.mock_target("redir", "redirect:leak", json!({})).await;
    stack.mock_target("good", "", json!({})).await;
    stack.put_route("r", json!({"targets": ["redir", "good"]})).await;
    let (key, _) = stack.key(None).await;
    shield_e2e::eventually(10, "the route", || async {
        let (status, headers, _) = stack.chat(&key, chat_body("r"), &[]).await;
        (status != StatusCode::NOT_FOUND && headers.contains_key("x-shield-route")).then_some(())
    })
    .await;
    let (_, headers, body) = stack.chat(&key, chat_body("r"), &[]).await;
    assert_ne!(headers.get("x-shield-target").map(|v| v.to_str().unwrap()), Some("leak"), "{body}");
    assert!(!stack.received("redir").await.is_empty(), "the redirecting target was called");
    assert!(stack.received("leak").await.is_empty(), "the redirect was never followed");
}

/// A line of `/etc/hosts` naming `host`, removed when dropped (even when the test fails). The
/// system resolver reads the file on every lookup, so this is real DNS as both services see it.
struct HostsEntry {
    host: String,
}

impl HostsEntry {
    const FILE: &str = "/etc/hosts";

    fn add(ip: &str, host: &str) -> HostsEntry {
        let mut hosts = std::fs::read_to_string(Self::FILE).expect("read /etc/hosts");
        if !hosts.ends_with('\n') {
            hosts.push('\n');
        }
        hosts.push_str(&format!("{ip} {host}\n"));
        std::fs::write(Self::FILE, hosts).expect("this test rebinds a name in /etc/hosts and must run as root");
        HostsEntry { host: host.to_string() }
    }
}

impl Drop for HostsEntry {
    fn drop(&mut self) {
        if let Ok(hosts) = std::fs::read_to_string(Self::FILE) {
            let kept: String = hosts
                .lines()
                .filter(|l| !l.split_whitespace().any(|w| w == self.host))
                .map(|l| format!("{l}\n"))
                .collect();
            let _ = std::fs::write(Self::FILE, kept);
        }
    }
}

/// DNS rebinding: a name that did not resolve when the target was written (accepted: the proxy
/// checks every call) later resolves to loopback. The proxy's resolver refuses it at call time
/// (`unsafe_url`, failover, nothing reaches the address), while the same name on a target with
/// `allow_private` does reach the mock — so the refusal is the check, not a failed lookup — and
/// writing the target again is now refused at write time.
#[actix_web::test]
async fn a_name_rebound_to_a_private_address_is_refused_at_call_time() {
    let stack = Stack::start().await;
    let host = format!("rebind-{}.shield-test", uuid::Uuid::new_v4().simple());
    let port = stack.mock.rsplit(':').next().unwrap().to_string();
    let target = |id: &str, allow_private: bool| {
        json!({"base_url": format!("http://{host}:{port}/mock/id:{id}/v1"), "model": "m", "allow_private": allow_private,
            "auth": {"mode": "none"}})
    };
    stack.put_target("rebound", target("rebound", false)).await;
    stack.put_target("allowed", target("allowed", true)).await;
    stack.mock_target("good", "", json!({})).await;
    stack.put_route("r", json!({"targets": ["rebound", "good"]})).await;
    stack.put_route("private-ok", json!({"targets": ["allowed"]})).await;
    // Written last: once it answers, the snapshot holds every route above (not called yet, so
    // no breaker has seen a failure of `rebound`).
    stack.put_route("ready", json!({"targets": ["good"]})).await;
    let (key, _) = stack.key(None).await;
    shield_e2e::eventually(10, "the routes", || async {
        let (status, headers, _) = stack.chat(&key, chat_body("ready"), &[]).await;
        (status == StatusCode::OK && headers.contains_key("x-shield-route")).then_some(())
    })
    .await;

    let _rebound = HostsEntry::add("127.0.0.1", &host);
    let (status, headers, body) = stack.chat(&key, chat_body("r"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["x-shield-target"], "good", "{body}");
    assert_eq!(body["x_shield"]["routing"]["attempts"][0]["class"], "unsafe_url", "{body}");
    assert!(stack.received("rebound").await.is_empty(), "nothing reached the rebound address");

    let (status, headers, body) = stack.chat(&key, chat_body("private-ok"), &[]).await;
    assert_eq!((status, &headers["x-shield-target"]), (StatusCode::OK, &"allowed".parse().unwrap()), "{body}");
    assert_eq!(stack.received("allowed").await.len(), 1, "the name resolves to the mock");

    let (status, body) =
        stack.admin_call(Method::PUT, &T.replace("probe", "rebound"), Some(target("rebound", false))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("resolves to 127.0.0.1"), "{body}");
}

fn b64(value: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap())
}

#[actix_web::test]
async fn forged_and_tampered_admin_tokens_are_refused() {
    let admin = Admin::start().await;
    let (victim, ..) = admin.tenant().await;
    let (attacker, ..) = admin.tenant().await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let all = vec![Scope::TenantRead, Scope::ConfigWrite, Scope::RegistryWrite];
    let wrong_key = Tokens::new("another-secret-that-is-at-least-32-bytes-long")
        .unwrap()
        .issue("x@example.com", Some(&victim), all.clone(), std::time::Duration::from_secs(600), now)
        .0;
    // The attacker's own, valid token with its payload rewritten: another tenant, more scopes.
    let own = admin.token(Some(&attacker), &[Scope::TenantRead]);
    let parts: Vec<&str> = own.split('.').collect();
    let claims = |tenant: &str, scopes: Value| json!({"sub": "x@example.com", "tenant": tenant, "scopes": scopes, "iat": now, "exp": now + 600, "iss": "shield-admin"});
    let swapped = format!("{}.{}.{}", parts[0], b64(&claims(&victim, json!(["tenant:read"]))), parts[2]);
    let escalated = format!(
        "{}.{}.{}",
        parts[0],
        b64(&claims(&attacker, json!(["tenant:read", "config:write", "operator"]))),
        parts[2]
    );
    let none_alg =
        format!("{}.{}.", b64(&json!({"alg": "none", "typ": "JWT"})), b64(&claims(&victim, json!(["operator"]))));
    let hs512 = format!("{}.{}.{}", b64(&json!({"alg": "HS512", "typ": "JWT"})), parts[1], parts[2]);
    let wrong_issuer = {
        use jsonwebtoken::{EncodingKey, Header, encode};
        let mut c = claims(&victim, json!(["tenant:read"]));
        c["iss"] = json!("someone-else");
        encode(&Header::default(), &c, &EncodingKey::from_secret(shield_e2e::admin::JWT_SECRET.as_bytes()).unwrap())
            .unwrap()
    };
    for (what, token) in [
        ("wrong key", wrong_key),
        ("tenant swapped", swapped),
        ("scopes escalated", escalated),
        ("alg none", none_alg),
        ("algorithm switched", hs512),
        ("wrong issuer", wrong_issuer),
    ] {
        for (method, path) in [(Method::GET, "/v1/tenant/me/gateway/targets"), (Method::GET, "/v1/admin/tenants")] {
            let (status, body) = admin.call(method, path, Some(&token), None).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{what} on {path}: {body}");
        }
    }
    // A valid token never reaches another tenant, whatever the request says.
    let (status, body) = admin
        .call(Method::GET, &format!("/v1/tenant/{victim}/gateway/targets"), Some(&admin.owner(&attacker)), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "there is no path naming a tenant: {body}");
}

#[actix_web::test]
async fn the_admin_refuses_oversized_and_deeply_nested_bodies_and_keeps_serving() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    // Nested where any JSON is allowed (extra_body), so only the depth limit can stop it.
    let deep = format!(
        "{{\"base_url\": \"https://api.example.com/v1\", \"model\": \"m\", \"extra_body\": {{\"x\": {}1{}}}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let (status, body) = admin.put_raw(T, &token, deep.into_bytes()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("recursion limit"), "{body}");
    let big =
        format!("{{\"base_url\": \"https://api.example.com/v1\", \"model\": \"{}\"}}", "m".repeat(2 * 1024 * 1024));
    let (status, _) = admin.put_raw(T, &token, big.into_bytes()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, _) = admin.get("/v1/tenant/me/gateway/targets", &token).await;
    assert_eq!(status, StatusCode::OK, "still serving");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_refuses_oversized_deep_or_endless_requests_by_name_and_keeps_serving() {
    let stack = Stack::start().await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("r", json!({"targets": ["a"]})).await;
    let (key, _) = stack.key(None).await;
    shield_e2e::eventually(10, "the route", || async {
        (stack.chat(&key, chat_body("r"), &[]).await.0 == StatusCode::OK).then_some(())
    })
    .await;
    let url = format!("http://{}/v1/chat/completions", stack.proxy);
    let send = |body: Vec<u8>| {
        let (client, url, key) = (stack.client.clone(), url.clone(), key.clone());
        async move {
            let r = client
                .post(url)
                .bearer_auth(key)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap_or_default())
        }
    };

    let deep = format!("{{\"model\": \"r\", \"messages\": {}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let (status, text) = send(deep.into_bytes()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("recursion limit"), "{text}");

    let (status, text) = send(vec![b' '; 9 * 1024 * 1024]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");

    let message = json!({"role": "user", "content": "hi"});
    let too_many = json!({"model": "r", "messages": vec![message.clone(); 2049]});
    let (status, text) = send(serde_json::to_vec(&too_many).unwrap()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("at most 2048"), "{text}");
    let most = json!({"model": "r", "messages": vec![message; 2048]});
    assert_eq!(send(serde_json::to_vec(&most).unwrap()).await.0, StatusCode::OK);

    // Its own client: the server closes that connection, which must not be pooled for the next call.
    let huge_header = reqwest::Client::new()
        .post(&url)
        .bearer_auth(&key)
        .header("x-padding", "p".repeat(256 * 1024))
        .json(&chat_body("r"))
        .send()
        .await;
    match huge_header {
        Ok(response) => assert!(response.status().is_client_error(), "{}", response.status()),
        Err(err) => assert!(err.is_request() || err.is_connect() || err.to_string().contains("closed"), "{err}"),
    }

    assert_eq!(stack.chat(&key, chat_body("r"), &[]).await.0, StatusCode::OK, "still serving");
    assert_eq!(stack.received("a").await.len(), 3, "only the good requests reached the target");
}
