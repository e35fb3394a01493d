//! Cross-tenant isolation: a token for tenant A can neither read nor write B's objects, on
//! every endpoint. Objects are addressed by the same ids in both tenants; A's calls must only
//! ever see and change A's rows, and B's state must be byte-for-byte unchanged afterwards.

use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_admin::auth::Scope;
use shield_e2e::admin::{Admin, public_target};

const T: &str = "/v1/tenant/me/gateway/targets";
const R: &str = "/v1/tenant/me/gateway/routes";

/// Everything B's own token can see.
async fn state_of(admin: &Admin, token: &str) -> Value {
    let mut out = serde_json::Map::new();
    for path in [
        T,
        R,
        "/v1/tenant/me/secrets",
        "/v1/tenant/me/keys",
        "/v1/tenant/me/guardrails",
        "/v1/tenant/me/webhooks",
        "/v1/tenant/me/limits",
    ] {
        out.insert(path.to_string(), admin.get(path, token).await.1);
    }
    Value::Object(out)
}

#[actix_web::test]
async fn tenant_a_cannot_read_or_write_tenant_b() {
    let admin = Admin::start().await;
    let (a, ..) = admin.tenant().await;
    let (b, ..) = admin.tenant().await;
    let token_a = admin.owner(&a);
    let token_b = admin.owner(&b);

    // B's objects.
    admin
        .put(
            "/v1/tenant/me/secrets/b-secret",
            &token_b,
            json!({"value": "sk-b-only-0123456789abcdef", "bindings": ["api.example.com"]}),
        )
        .await;
    let mut vaulted = public_target("b-model");
    vaulted["auth"] = json!({"mode": "vault", "secret_ref": "shield://b-secret"});
    assert_eq!(admin.put(&format!("{T}/b-target"), &token_b, vaulted).await.0, StatusCode::CREATED);
    assert_eq!(
        admin.put(&format!("{R}/b-route"), &token_b, json!({"targets": ["b-target"]})).await.0,
        StatusCode::CREATED
    );
    let (_, key) = admin.post("/v1/tenant/me/keys", &token_b, json!({"name": "b-key", "limits": {"rpm": 7}})).await;
    let b_key_id = key["id"].as_str().unwrap().to_string();
    admin.put("/v1/tenant/me/limits", &token_b, json!({"rpm": 77})).await;
    admin.put("/v1/tenant/me/guardrails", &token_b, json!({"pii_detection": {"mode": "block"}})).await;
    let (_, hook) = admin
        .post(
            "/v1/tenant/me/webhooks",
            &token_b,
            json!({"url": "https://hooks.example.com/b", "events": ["budget_exceeded"]}),
        )
        .await;
    let b_hook = hook["id"].as_str().unwrap().to_string();
    let b_before = state_of(&admin, &token_b).await;
    let b_audit_before = admin.get("/v1/tenant/me/audit", &token_b).await.1["entries"].as_array().unwrap().len();

    // Reads of B's ids from A: not found, and never B's data.
    for path in [format!("{T}/b-target"), format!("{R}/b-route"), "/v1/tenant/me/secrets/b-secret".to_string()] {
        let (status, body) = admin.get(&path, &token_a).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    for path in [T, R, "/v1/tenant/me/secrets", "/v1/tenant/me/keys", "/v1/tenant/me/audit"] {
        let (status, body) = admin.get(path, &token_a).await;
        assert_eq!(status, StatusCode::OK);
        let text = body.to_string();
        for b_thing in ["b-target", "b-route", "b-secret", "b-key", &b_key_id] {
            assert!(!text.contains(b_thing), "{path} shows B's {b_thing}: {text}");
        }
    }
    assert_eq!(admin.get("/v1/tenant/me/guardrails", &token_a).await.1["pii_detection"]["mode"], "off");

    // B's webhooks, deliveries, route simulation and target reset are not A's.
    assert!(!admin.get("/v1/tenant/me/webhooks", &token_a).await.1.to_string().contains(&b_hook));
    assert_eq!(
        admin.get(&format!("/v1/tenant/me/webhooks/{b_hook}/deliveries"), &token_a).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(admin.delete(&format!("/v1/tenant/me/webhooks/{b_hook}"), &token_a).await.0, StatusCode::NOT_FOUND);
    assert_eq!(admin.post(&format!("{R}/b-route/simulate"), &token_a, json!({})).await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        admin.call(reqwest::Method::POST, &format!("{T}/b-target/reset"), Some(&token_a), None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(admin.get("/v1/tenant/me/gateway/usage", &token_a).await.1["rows"], json!([]));
    assert_eq!(admin.get("/v1/tenant/me/webhooks", &token_b).await.1["webhooks"][0]["id"], b_hook.as_str());

    // Writes and deletes by B's ids from A touch A only, or are refused.
    assert_eq!(admin.delete(&format!("{T}/b-target"), &token_a).await.0, StatusCode::NOT_FOUND);
    assert_eq!(admin.delete(&format!("{R}/b-route"), &token_a).await.0, StatusCode::NOT_FOUND);
    assert_eq!(admin.delete("/v1/tenant/me/secrets/b-secret", &token_a).await.0, StatusCode::NOT_FOUND);
    assert_eq!(admin.delete(&format!("/v1/tenant/me/keys/{b_key_id}"), &token_a).await.0, StatusCode::NOT_FOUND);
    let patch = json!({"limits": {"rpm": 1}});
    let path = format!("/v1/tenant/me/keys/{b_key_id}");
    assert_eq!(admin.call(reqwest::Method::PATCH, &path, Some(&token_a), Some(patch)).await.0, StatusCode::NOT_FOUND);
    assert_eq!(admin.get("/v1/tenant/me/limits", &token_a).await.1, json!({}), "B's limits are B's");
    assert_eq!(admin.put("/v1/tenant/me/limits", &token_a, json!({"rpm": 1})).await.0, StatusCode::OK);
    // A route in A naming B's target: the target does not exist for A.
    let (status, body) = admin.put(&format!("{R}/b-route"), &token_a, json!({"targets": ["b-target"]})).await;
    assert_eq!((status, body["error"]["field"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("targets[0]")));
    // A target in A referencing B's secret: the secret does not exist for A.
    let mut stolen = public_target("m");
    stolen["auth"] = json!({"mode": "vault", "secret_ref": "shield://b-secret"});
    let (status, body) = admin.put(&format!("{T}/b-target"), &token_a, stolen).await;
    assert_eq!((status, body["error"]["field"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("auth.secret_ref")));
    // Same ids created in A live in A.
    assert_eq!(admin.put(&format!("{T}/b-target"), &token_a, public_target("a-model")).await.0, StatusCode::CREATED);
    assert_eq!(
        admin.put(&format!("{R}/b-route"), &token_a, json!({"targets": ["b-target"]})).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        admin
            .put("/v1/tenant/me/secrets/b-secret", &token_a, json!({"value": "a-value", "bindings": ["x.example.com"]}))
            .await
            .0,
        StatusCode::CREATED
    );
    assert_eq!(
        admin.put("/v1/tenant/me/guardrails", &token_a, json!({"secrets_detection": {"mode": "warn"}})).await.0,
        StatusCode::OK
    );
    assert_eq!(admin.post("/v1/tenant/me/keys", &token_a, json!({"name": "a-key"})).await.0, StatusCode::CREATED);
    assert_eq!(admin.delete(&format!("{R}/b-route"), &token_a).await.0, StatusCode::NO_CONTENT);
    assert_eq!(admin.delete(&format!("{T}/b-target"), &token_a).await.0, StatusCode::NO_CONTENT);

    // B is exactly as it was, and its audit log has nothing from A.
    assert_eq!(state_of(&admin, &token_b).await, b_before);
    assert_eq!(admin.get("/v1/tenant/me/audit", &token_b).await.1["entries"].as_array().unwrap().len(), b_audit_before);
    // B's snapshot in Redis is B's.
    let snapshot = admin.snapshot(&b).await.expect("B published");
    assert_eq!(snapshot["tenant"], b.as_str());
    assert_eq!(snapshot["targets"]["b-target"]["model"], "b-model");
    assert!(snapshot["secrets"]["shield://b-secret"].is_object());
    assert_eq!(snapshot["limits"], json!({"rpm": 77}));
    let snapshot_a = admin.snapshot(&a).await.expect("A published");
    assert!(snapshot_a["targets"].as_object().unwrap().is_empty());
}

#[actix_web::test]
async fn a_token_cannot_be_retargeted_at_another_tenant() {
    let admin = Admin::start().await;
    let (a, ..) = admin.tenant().await;
    let (b, ..) = admin.tenant().await;
    // Swap the tenant claim in A's token: the signature no longer matches.
    let token = admin.owner(&a);
    let parts: Vec<&str> = token.split('.').collect();
    use base64::Engine;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let claims = String::from_utf8(engine.decode(parts[1]).unwrap()).unwrap().replace(&a, &b);
    let forged = format!("{}.{}.{}", parts[0], engine.encode(claims), parts[2]);
    let (status, _) = admin.get(T, &forged).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A token for a tenant that does not exist.
    let (status, _) = admin.get(T, &admin.token(Some("ghost-tenant"), &[Scope::TenantRead])).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}
