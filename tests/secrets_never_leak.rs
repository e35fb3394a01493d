//! A provider key put in the vault never comes back out: not in any API response, audit row,
//! log line (captured at TRACE), Redis value, or Postgres column in plaintext. The positive
//! control at the end proves the value is really there, encrypted, for the data plane.

use reqwest::StatusCode;
use serde_json::json;
use shield_core::snapshot::SnapshotSecret;
use shield_core::vault::secret_aad;
use shield_e2e::admin::{Admin, keyring, public_target};
use shield_e2e::{logs, redis_dump, unique};

#[actix_web::test]
async fn a_vault_secret_never_leaks() {
    logs::capture();
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let secret = unique("sk-live-leakcheck-");
    let mut responses = Vec::new();

    let put = |body| admin.put("/v1/tenant/me/secrets/openai_prod", &token, body);
    let (status, body) = put(json!({"value": secret, "bindings": ["api.openai.com"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    responses.push(body.to_string());
    assert_eq!(body["hint"], format!("…{}", &secret[secret.len() - 4..]), "at most the last 4 characters");
    // Refused writes that carry the value must not echo it.
    for bad in [
        json!({"value": secret, "bindings": ["https://api.openai.com"]}),
        json!({"value": secret, "bindings": []}),
        json!({"value": secret, "bindings": ["api.openai.com"], "note": "x"}),
        json!({"value": format!("{secret}\r\nX-Evil: 1"), "bindings": ["api.openai.com"]}),
        json!({"value": [secret], "bindings": ["api.openai.com"]}),
    ] {
        let (status, body) = put(bad).await;
        assert!(status.is_client_error(), "{body}");
        responses.push(body.to_string());
    }
    let raw = format!("{{\"value\": \"{secret}\", \"bindings\": [\"api.openai.com\"");
    responses.push(admin.put_raw("/v1/tenant/me/secrets/openai_prod", &token, raw.into_bytes()).await.1.to_string());

    let mut target = public_target("gpt-4o");
    target["base_url"] = json!("https://api.openai.com/v1");
    target["auth"] = json!({"mode": "vault", "secret_ref": "shield://openai_prod"});
    let (status, body) = admin.put("/v1/tenant/me/gateway/targets/openai-4o", &token, target).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    responses.push(body.to_string());
    // Rebinding away from the target's host is refused, naming the target.
    let (status, body) = put(json!({"value": secret, "bindings": ["other.example.com"]})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["targets"], json!(["openai-4o (api.openai.com)"]));
    responses.push(body.to_string());
    let (status, body) = admin.delete("/v1/tenant/me/secrets/openai_prod", &token).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    responses.push(body.to_string());
    for path in [
        "/v1/tenant/me/secrets",
        "/v1/tenant/me/secrets/openai_prod",
        "/v1/tenant/me/gateway/targets",
        "/v1/tenant/me/gateway/targets/openai-4o",
        "/v1/tenant/me/audit",
    ] {
        let (status, body) = admin.get(path, &token).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        responses.push(body.to_string());
    }

    for response in &responses {
        assert!(!response.contains(&secret), "a response contains the secret: {response}");
    }
    let audit: Vec<(String,)> =
        sqlx::query_as("SELECT row_to_json(a)::text FROM audit_log a").fetch_all(&admin.db.pool).await.unwrap();
    assert!(audit.len() >= 2);
    assert!(audit.iter().all(|(row,)| !row.contains(&secret)), "an audit row contains the secret");
    let plaintext_columns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM secrets s WHERE row_to_json(s)::text LIKE '%' || $1 || '%' OR position(convert_to($1, 'UTF8') in s.ciphertext) > 0",
    )
    .bind(&secret)
    .fetch_one(&admin.db.pool)
    .await
    .unwrap();
    assert_eq!(plaintext_columns, 0, "the secrets table holds the plaintext");
    let redis = redis_dump(&admin.prefix).await;
    assert!(!redis.is_empty());
    for (key, value) in &redis {
        assert!(!value.contains(&secret) && !key.contains(&secret), "Redis {key} contains the secret");
    }
    assert!(logs::len() > 0, "logs were captured");
    assert!(!logs::contains(&secret), "a log line contains the secret");

    // Positive control: the snapshot carries the sealed value, and only the right AAD opens it.
    let snapshot = admin.snapshot(&slug).await.expect("published");
    let sealed: SnapshotSecret = serde_json::from_value(snapshot["secrets"]["shield://openai_prod"].clone()).unwrap();
    assert_eq!(sealed.bindings, vec!["api.openai.com"]);
    let opened = keyring().open(&secret_aad(&slug, "openai_prod"), &sealed.sealed().unwrap()).unwrap();
    assert_eq!(String::from_utf8(opened).unwrap(), secret);
    assert!(keyring().open(&secret_aad("other-tenant", "openai_prod"), &sealed.sealed().unwrap()).is_err());
}
