//! The admin API over real HTTP against real Postgres and Redis: gates, CRUD, validation,
//! limits, conflicts and the audit log (seed §8 items 1 and 10).

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_admin::auth::Scope;
use shield_e2e::admin::{Admin, public_target};

const T: &str = "/v1/tenant/me/gateway/targets";
const R: &str = "/v1/tenant/me/gateway/routes";

/// Every tenant endpoint with the scope it needs (API.md's table).
fn tenant_endpoints() -> Vec<(Method, &'static str, Scope, Option<Value>)> {
    vec![
        (Method::GET, "/v1/tenant/me/gateway/targets", Scope::TenantRead, None),
        (Method::GET, "/v1/tenant/me/gateway/targets/x", Scope::TenantRead, None),
        (Method::PUT, "/v1/tenant/me/gateway/targets/x", Scope::ConfigWrite, Some(public_target("m"))),
        (Method::DELETE, "/v1/tenant/me/gateway/targets/x", Scope::ConfigWrite, None),
        (Method::GET, "/v1/tenant/me/gateway/routes", Scope::TenantRead, None),
        (Method::GET, "/v1/tenant/me/gateway/routes/x", Scope::TenantRead, None),
        (Method::PUT, "/v1/tenant/me/gateway/routes/x", Scope::ConfigWrite, Some(json!({"targets": ["x"]}))),
        (Method::DELETE, "/v1/tenant/me/gateway/routes/x", Scope::ConfigWrite, None),
        (Method::GET, "/v1/tenant/me/secrets", Scope::TenantRead, None),
        (Method::GET, "/v1/tenant/me/secrets/x", Scope::TenantRead, None),
        (
            Method::PUT,
            "/v1/tenant/me/secrets/x",
            Scope::ConfigWrite,
            Some(json!({"value": "v", "bindings": ["api.example.com"]})),
        ),
        (Method::DELETE, "/v1/tenant/me/secrets/x", Scope::ConfigWrite, None),
        (Method::GET, "/v1/tenant/me/keys", Scope::ConfigWrite, None),
        (Method::POST, "/v1/tenant/me/keys", Scope::ConfigWrite, Some(json!({"name": "k"}))),
        (Method::DELETE, "/v1/tenant/me/keys/00000000-0000-0000-0000-000000000000", Scope::ConfigWrite, None),
        (
            Method::PATCH,
            "/v1/tenant/me/keys/00000000-0000-0000-0000-000000000000",
            Scope::ConfigWrite,
            Some(json!({"limits": {}})),
        ),
        (Method::GET, "/v1/tenant/me/limits", Scope::TenantRead, None),
        (Method::PUT, "/v1/tenant/me/limits", Scope::ConfigWrite, Some(json!({}))),
        (Method::GET, "/v1/tenant/me/guardrails", Scope::TenantRead, None),
        (Method::PUT, "/v1/tenant/me/guardrails", Scope::ConfigWrite, Some(json!({}))),
        (Method::GET, "/v1/tenant/me/audit", Scope::TenantRead, None),
        (Method::GET, "/v1/tenant/me/gateway/health", Scope::TenantRead, None),
        (Method::POST, "/v1/tenant/me/gateway/targets/x/reset", Scope::ConfigWrite, None),
        (Method::GET, "/v1/tenant/me/gateway/usage", Scope::TenantRead, None),
        (Method::GET, "/v1/tenant/me/webhooks", Scope::ConfigWrite, None),
        (
            Method::POST,
            "/v1/tenant/me/webhooks",
            Scope::ConfigWrite,
            Some(json!({"url": "https://hooks.example.com/x", "events": ["budget_exceeded"]})),
        ),
        (Method::DELETE, "/v1/tenant/me/webhooks/00000000-0000-0000-0000-000000000000", Scope::ConfigWrite, None),
        (
            Method::GET,
            "/v1/tenant/me/webhooks/00000000-0000-0000-0000-000000000000/deliveries",
            Scope::ConfigWrite,
            None,
        ),
        (Method::POST, "/v1/tenant/me/gateway/routes/x/simulate", Scope::ConfigWrite, Some(json!({}))),
    ]
}

#[actix_web::test]
async fn every_endpoint_is_gated_401_then_403() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let expired = admin.expired(Some(&slug), &[Scope::TenantRead, Scope::ConfigWrite]);
    let forged = {
        let (_, claims_sig) =
            admin.owner(&slug).split_once('.').map(|(h, rest)| (h.to_string(), rest.to_string())).unwrap();
        format!("eyJhbGciOiJub25lIn0.{claims_sig}")
    };
    let mut endpoints = tenant_endpoints();
    endpoints.push((Method::GET, "/v1/admin/tenants", Scope::Operator, None));
    endpoints.push((
        Method::POST,
        "/v1/admin/tenants",
        Scope::Operator,
        Some(json!({"slug": "x", "admin_email": "a@b.co"})),
    ));
    for (method, path, scope, body) in endpoints {
        for (what, token) in [
            ("no token", None),
            ("garbage", Some("nope")),
            ("expired", Some(expired.as_str())),
            ("alg none", Some(forged.as_str())),
        ] {
            let (status, body) = admin.call(method.clone(), path, token, body.clone()).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path} with {what}: {body}");
            assert_eq!(body["error"]["type"], "authentication_error");
        }
        let others: Vec<Scope> = [Scope::TenantRead, Scope::ConfigWrite, Scope::RegistryWrite, Scope::Operator]
            .into_iter()
            .filter(|s| *s != scope)
            .collect();
        let token = admin.token(Some(&slug), &others);
        let (status, response) = admin.call(method.clone(), path, Some(&token), body.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path} without {scope:?}: {response}");
        assert!(response["error"]["message"].as_str().unwrap().contains(scope.as_str()));
        let token = admin.token(Some(&slug), &[scope]);
        let (status, response) = admin.call(method.clone(), path, Some(&token), body).await;
        assert!(
            status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN,
            "{method} {path} with {scope:?}: {status} {response}"
        );
    }
    let expired_message = admin.call(Method::GET, T, Some(&expired), None).await.1;
    assert!(expired_message["error"]["message"].as_str().unwrap().contains("expired"));
}

#[actix_web::test]
async fn login_gives_a_scoped_token_and_throttles_guessing() {
    let admin = Admin::start().await;
    let (slug, email, password) = admin.tenant().await;
    let (status, body) =
        admin.call(Method::POST, "/v1/auth/login", None, Some(json!({"email": email, "password": password}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tenant"], slug);
    assert!(body["expires_at"].as_str().unwrap().contains('T'));
    let token = body["token"].as_str().unwrap();
    assert_eq!(admin.get(T, token).await.0, StatusCode::OK);
    assert_eq!(admin.get("/v1/admin/tenants", token).await.0, StatusCode::FORBIDDEN);

    let (status, body) =
        admin.call(Method::POST, "/v1/auth/login", None, Some(json!({"email": "nobody@x.io", "password": "x"}))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _) =
        admin.call(Method::POST, "/v1/auth/login", None, Some(json!({"email": email, "password": "wrong"}))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    for _ in 0..9 {
        admin.call(Method::POST, "/v1/auth/login", None, Some(json!({"email": email, "password": "wrong"}))).await;
    }
    let (status, body) =
        admin.call(Method::POST, "/v1/auth/login", None, Some(json!({"email": email, "password": password}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "the right password is refused too while throttled: {body}");
    let (status, body) = admin.call(Method::POST, "/v1/auth/login", None, Some(json!({"email": email}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "password");
}

#[actix_web::test]
async fn operator_creates_and_lists_tenants() {
    let admin = Admin::start().await;
    let operator = admin.token(None, &[Scope::Operator]);
    let slug = shield_e2e::unique("op-")[..20].to_string();
    let (status, body) = admin
        .post("/v1/admin/tenants", &operator, json!({"slug": slug, "name": "Op", "admin_email": "Boss@Op.example.com"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["tenant"], slug);
    assert_eq!(body["admin_email"], "boss@op.example.com");
    assert!(body["password"].as_str().unwrap().len() >= 20);
    let (status, body) =
        admin.post("/v1/admin/tenants", &operator, json!({"slug": slug, "admin_email": "other@op.example.com"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    for (bad, field) in [
        (json!({"slug": "Bad Slug", "admin_email": "a@b.co"}), "slug"),
        (json!({"slug": "ok-slug", "admin_email": "nope"}), "admin_email"),
    ] {
        let (status, body) = admin.post("/v1/admin/tenants", &operator, bad).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(body["error"]["field"], field);
    }
    let (status, body) = admin.get("/v1/admin/tenants", &operator).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["tenants"].as_array().unwrap().iter().any(|t| t["slug"] == slug));
    // An operator token is not a tenant token.
    assert_eq!(admin.get(T, &admin.token(None, &[Scope::Operator, Scope::TenantRead])).await.0, StatusCode::FORBIDDEN);
}

#[actix_web::test]
async fn targets_crud_with_validation_naming_fields() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let (status, body) = admin.put(&format!("{T}/openai-4o"), &token, public_target("gpt-4o")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["id"], "openai-4o");
    assert_eq!(body["timeout_s"], 60);
    assert_eq!(body["updated_by"], "tester@example.com");
    let mut replaced = public_target("gpt-4o-mini");
    replaced["price"] = json!({"input_per_mtok": 0.15, "output_per_mtok": 0.6});
    let (status, body) = admin.put(&format!("{T}/openai-4o"), &token, replaced).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["price"]["input_per_mtok"], 0.15);
    let (status, body) = admin.get(&format!("{T}/openai-4o"), &token).await;
    assert_eq!((status, body["model"].clone()), (StatusCode::OK, json!("gpt-4o-mini")));
    let (_, body) = admin.get(T, &token).await;
    assert_eq!(body["targets"].as_array().unwrap().len(), 1);
    // Issue 14: a default bounded by another field follows it; the read shows the effective value.
    let mut quick = public_target("gpt-4o-mini");
    quick["timeout_s"] = json!(5);
    let (status, body) = admin.put(&format!("{T}/quick"), &token, quick.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "timeout_s 5 alone is accepted: {body}");
    let (_, body) = admin.get(&format!("{T}/quick"), &token).await;
    assert_eq!((body["timeout_s"].clone(), body["first_byte_timeout_s"].clone()), (json!(5), json!(5)));
    quick["first_byte_timeout_s"] = json!(6);
    let (status, body) = admin.put(&format!("{T}/quick"), &token, quick).await;
    assert_eq!(
        (status, body["error"]["field"].clone()),
        (StatusCode::UNPROCESSABLE_ENTITY, json!("first_byte_timeout_s"))
    );
    assert_eq!(admin.delete(&format!("{T}/quick"), &token).await.0, StatusCode::NO_CONTENT);

    let cases = [
        (json!({"base_url": "ftp://x.example.com", "model": "m"}), "base_url"),
        (
            json!({"base_url": "https://x.example.com", "model": "m", "auth": {"mode": "vault", "secret_ref": "shield://none"}}),
            "auth.secret_ref",
        ),
        (json!({"base_url": "https://x.example.com", "model": "m", "surprise": 1}), "surprise"),
        (json!({"base_url": "https://x.example.com"}), "model"),
        (
            json!({"base_url": "https://x.example.com", "model": "m", "auth": {"mode": "passthrough", "header": "Bad Header"}}),
            "auth.header",
        ),
        (json!({"base_url": "http://169.254.169.254/v1", "model": "m"}), "base_url"),
    ];
    for (body, field) in cases {
        let (status, response) = admin.put(&format!("{T}/bad"), &token, body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{response}");
        assert_eq!(response["error"]["type"], "validation_error");
        assert_eq!(response["error"]["field"], field, "{response}");
        assert!(!response["error"]["message"].as_str().unwrap().is_empty());
    }
    let (status, body) = admin.put_raw(&format!("{T}/bad"), &token, b"{\"base_url\": ".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("malformed JSON"));
    let (status, body) = admin.put_raw(&format!("{T}/bad"), &token, vec![b' '; 2 * 1024 * 1024]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let (status, body) = admin.put(&format!("{T}/bad%7Cid"), &token, public_target("m")).await;
    assert_eq!((status, body["error"]["field"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("id")));
    let (status, _) = admin.get(&format!("{T}/bad"), &token).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was stored by refused writes");

    let (status, body) = admin.delete(&format!("{T}/openai-4o"), &token).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    assert_eq!(admin.delete(&format!("{T}/openai-4o"), &token).await.0, StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn allow_private_needs_registry_write() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let body = json!({"base_url": "http://127.0.0.1:9100/v1", "model": "m", "allow_private": true});
    let config_only = admin.token(Some(&slug), &[Scope::TenantRead, Scope::ConfigWrite]);
    let (status, response) = admin.put(&format!("{T}/local"), &config_only, body.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{response}");
    assert!(response["error"]["message"].as_str().unwrap().contains("registry:write"));
    let (status, response) = admin.put(&format!("{T}/local"), &admin.owner(&slug), body).await;
    assert_eq!(status, StatusCode::CREATED, "{response}");
    let (status, response) = admin
        .put(&format!("{T}/local2"), &config_only, json!({"base_url": "http://127.0.0.1:9100/v1", "model": "m"}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "private without allow_private: {response}");
    assert!(response["error"]["message"].as_str().unwrap().contains("loopback"));
}

#[actix_web::test]
async fn routes_crud_with_slash_names_subset_rules_and_delete_conflicts() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    for id in ["openai-4o", "onprem-qwen"] {
        assert_eq!(admin.put(&format!("{T}/{id}"), &token, public_target(id)).await.0, StatusCode::CREATED);
    }
    let route = json!({"targets": ["openai-4o", "onprem-qwen"], "rules": [{"when": {"flagged": ["pii_detection"]}, "use": ["onprem-qwen"]}]});
    let (status, body) = admin.put(&format!("{R}/shield%2Fcheap"), &token, route).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["name"], "shield/cheap");
    let (status, body) = admin.get(&format!("{R}/shield%2Fcheap"), &token).await;
    assert_eq!((status, body["failover"]["max_attempts"].clone()), (StatusCode::OK, json!(3)));

    let bad = json!({"targets": ["openai-4o"], "rules": [{"when": {}, "use": ["onprem-qwen"]}]});
    let (status, body) = admin.put(&format!("{R}/smart"), &token, bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["field"], "rules[0].use[0]");
    let (status, body) = admin.put(&format!("{R}/smart"), &token, json!({"targets": ["ghost"]})).await;
    assert_eq!((status, body["error"]["field"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("targets[0]")));
    let (status, body) =
        admin.put(&format!("{R}/smart"), &token, json!({"targets": ["openai-4o"], "weights": {"openai-4o": 1}})).await;
    assert_eq!((status, body["error"]["field"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("weights")));

    let (status, body) = admin.delete(&format!("{T}/onprem-qwen"), &token).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["routes"], json!(["shield/cheap"]));
    assert!(body["error"]["message"].as_str().unwrap().contains("shield/cheap"));
    assert_eq!(admin.delete(&format!("{R}/shield%2Fcheap"), &token).await.0, StatusCode::NO_CONTENT);
    assert_eq!(admin.delete(&format!("{T}/onprem-qwen"), &token).await.0, StatusCode::NO_CONTENT);
    assert_eq!(admin.delete(&format!("{R}/shield%2Fcheap"), &token).await.0, StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn envelope_changes_that_break_a_route_are_refused() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let mut eu = public_target("m");
    eu["profile"] = json!({"region": "eu", "zdr": true});
    admin.put(&format!("{T}/eu-1"), &token, eu.clone()).await;
    admin.put(&format!("{T}/us-1"), &token, public_target("m")).await;
    let (status, body) = admin
        .put(&format!("{R}/eu"), &token, json!({"targets": ["eu-1", "us-1"], "required_profile": {"region": "eu"}}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "required_profile.region");
    assert!(body["error"]["message"].as_str().unwrap().contains("us-1"));
    assert_eq!(
        admin
            .put(&format!("{R}/eu"), &token, json!({"targets": ["eu-1"], "required_profile": {"region": "eu"}}))
            .await
            .0,
        StatusCode::CREATED
    );
    eu["profile"]["region"] = json!("us");
    let (status, body) = admin.put(&format!("{T}/eu-1"), &token, eu).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("eu (region)"), "{body}");
    assert_eq!(admin.get(&format!("{T}/eu-1"), &token).await.1["profile"]["region"], "eu");
}

#[actix_web::test]
async fn tenant_limits_50_targets_100_routes() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    for i in 0..50 {
        let (status, body) = admin.put(&format!("{T}/t{i}"), &token, public_target("m")).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, body) = admin.put(&format!("{T}/t50"), &token, public_target("m")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("at most 50 targets"));
    assert_eq!(
        admin.put(&format!("{T}/t0"), &token, public_target("m2")).await.0,
        StatusCode::OK,
        "replacing is not adding"
    );
    for i in 0..100 {
        let (status, body) = admin.put(&format!("{R}/r{i}"), &token, json!({"targets": ["t0"]})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, body) = admin.put(&format!("{R}/r100"), &token, json!({"targets": ["t0"]})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("at most 100 routes"));
}

#[actix_web::test]
async fn keys_are_shown_once_stored_hashed_and_revocable() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let (status, body) =
        admin.post("/v1/tenant/me/keys", &token, json!({"name": "ci", "agent": "builder", "role": "contractor"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let key = body["key"].as_str().unwrap().to_string();
    assert!(key.starts_with("sk-shield-") && key.len() > 40);
    for field in ["id", "name", "agent", "role", "created_at"] {
        assert!(!body[field].is_null(), "{field}");
    }
    let (_, list) = admin.get("/v1/tenant/me/keys", &token).await;
    assert!(!list.to_string().contains(&key), "the list never shows the key");
    assert_eq!(list["keys"][0]["prefix"].as_str().unwrap(), &key[..14]);
    let stored: Vec<(String,)> =
        sqlx::query_as("SELECT key_hash FROM api_keys").fetch_all(&admin.db.pool).await.unwrap();
    assert_eq!(stored[0].0, shield_core::snapshot::key_hash(&key));

    let redis_key = admin.keys.api_key(&shield_core::snapshot::key_hash(&key));
    let record = shield_e2e::redis_dump(&redis_key).await;
    let record: Value = serde_json::from_str(&record[0].1).unwrap();
    assert_eq!(
        (record["tenant"].as_str(), record["revoked"].as_bool(), record["role"].as_str()),
        (Some(slug.as_str()), Some(false), Some("contractor"))
    );

    let id = body["id"].as_str().unwrap();
    assert_eq!(admin.delete(&format!("/v1/tenant/me/keys/{id}"), &token).await.0, StatusCode::NO_CONTENT);
    let record: Value = serde_json::from_str(&shield_e2e::redis_dump(&redis_key).await[0].1).unwrap();
    assert_eq!(record["revoked"], true);
    assert!(!admin.get("/v1/tenant/me/keys", &token).await.1["keys"][0]["revoked_at"].is_null());
    assert_eq!(admin.delete("/v1/tenant/me/keys/not-a-uuid", &token).await.0, StatusCode::NOT_FOUND);
    let (status, body) = admin.post("/v1/tenant/me/keys", &token, json!({"name": ""})).await;
    assert_eq!((status, body["error"]["field"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("name")));
}

#[actix_web::test]
async fn guardrails_round_trip_strictly() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let (status, body) = admin.get("/v1/tenant/me/guardrails", &token).await;
    assert_eq!((status, body["pii_detection"]["mode"].clone()), (StatusCode::OK, json!("off")));
    let policy = json!({"pii_detection": {"mode": "monitor"}, "secrets_detection": {"mode": "block"},
        "tools": {"kill_switch": false, "allowed_by_role": {"contractor": ["search"]}}});
    let (status, body) = admin.put("/v1/tenant/me/guardrails", &token, policy.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(admin.get("/v1/tenant/me/guardrails", &token).await.1, policy);
    let (status, body) =
        admin.put("/v1/tenant/me/guardrails", &token, json!({"pii_detection": {"mode": "loud"}})).await;
    assert_eq!(
        (status, body["error"]["field"].clone()),
        (StatusCode::UNPROCESSABLE_ENTITY, json!("pii_detection.mode"))
    );
    let (status, body) = admin.put("/v1/tenant/me/guardrails", &token, json!({"toxicity": {"mode": "block"}})).await;
    assert_eq!((status, body["error"]["field"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("toxicity")));
}

#[actix_web::test]
async fn every_write_is_audited_with_actor_and_time() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    admin
        .put(
            "/v1/tenant/me/secrets/prod",
            &token,
            json!({"value": "sk-audit-value-0123456789", "bindings": ["api.example.com"]}),
        )
        .await;
    admin.put(&format!("{T}/a"), &token, public_target("m")).await;
    admin.put(&format!("{R}/smart"), &token, json!({"targets": ["a"]})).await;
    let (_, key) = admin.post("/v1/tenant/me/keys", &token, json!({"name": "k"})).await;
    admin.delete(&format!("/v1/tenant/me/keys/{}", key["id"].as_str().unwrap()), &token).await;
    admin.delete(&format!("{R}/smart"), &token).await;
    admin.delete(&format!("{T}/a"), &token).await;
    admin.delete("/v1/tenant/me/secrets/prod", &token).await;
    let (status, body) = admin.get("/v1/tenant/me/audit", &token).await;
    assert_eq!(status, StatusCode::OK);
    let actions: Vec<&str> =
        body["entries"].as_array().unwrap().iter().rev().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions,
        [
            "tenant_created",
            "secret_set",
            "gateway_target_set",
            "gateway_route_set",
            "key_created",
            "key_revoked",
            "gateway_route_deleted",
            "gateway_target_deleted",
            "secret_deleted"
        ]
    );
    for entry in body["entries"].as_array().unwrap().iter().filter(|e| e["action"] != "tenant_created") {
        assert_eq!(entry["actor"], "tester@example.com");
        assert!(entry["at"].as_str().unwrap().starts_with("20"));
    }
    assert_eq!(body["entries"][0]["object"], "prod");
}

#[actix_web::test]
async fn unknown_paths_and_docs() {
    let admin = Admin::start().await;
    let (status, body) = admin.call(Method::GET, "/v1/nope", None, None).await;
    assert_eq!((status, body["error"]["type"].clone()), (StatusCode::NOT_FOUND, json!("not_found")));
    let (status, body) = admin.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["paths"]["/v1/tenant/me/gateway/targets/{id}"].is_object());
    let (status, _) = admin.call(Method::GET, "/docs/", None, None).await;
    assert_eq!(status, StatusCode::OK);
    // API.md: "a browsable UI at /docs" — the bare path redirects to Swagger UI's own.
    let plain = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let docs = plain.get(format!("{}/docs", admin.url)).send().await.unwrap();
    assert_eq!(
        (docs.status(), docs.headers()["location"].to_str().unwrap()),
        (StatusCode::PERMANENT_REDIRECT, "/docs/")
    );
    let followed = reqwest::get(format!("{}/docs", admin.url)).await.unwrap();
    assert_eq!(followed.status(), StatusCode::OK);
    assert!(followed.text().await.unwrap().contains("swagger-ui"), "/docs lands on the API browser");
    for portal in ["/portal", "/portal/"] {
        let home = plain.get(format!("{}{portal}", admin.url)).send().await.unwrap();
        assert_eq!(
            (home.status(), home.headers()["location"].to_str().unwrap()),
            (StatusCode::SEE_OTHER, "/portal/login"),
            "{portal}"
        );
    }
    let (status, index) = admin.call(Method::GET, "/", None, None).await;
    assert_eq!(
        (status, index["portal"].clone(), index["docs"].clone()),
        (StatusCode::OK, json!("/portal"), json!("/docs/"))
    );
    assert_eq!(admin.call(Method::GET, "/healthz", None, None).await.0, StatusCode::OK);
    assert_eq!(admin.call(Method::GET, "/readyz", None, None).await.0, StatusCode::OK);
    let metrics = admin.client_text("/metrics").await;
    assert!(
        metrics.contains(r#"shield_admin_requests_total{method="GET",route="/openapi.json",status="200"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"route="unmatched",status="404""#), "unknown paths are one label, not their raw path");
}

#[actix_web::test]
async fn simulate_explains_the_choice_without_calling_a_model() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let mut cloud = public_target("gpt-4o");
    cloud["price"] = json!({"input_per_mtok": 2.5, "output_per_mtok": 10});
    admin.put(&format!("{T}/openai-4o"), &token, cloud).await;
    let mut onprem = public_target("qwen");
    onprem["location"] = json!("on_prem");
    admin.put(&format!("{T}/onprem-qwen"), &token, onprem).await;
    admin
        .put(
            "/v1/tenant/me/secrets/prod",
            &token,
            json!({"value": "sk-simulate-secret-0123456789", "bindings": ["api.example.com"]}),
        )
        .await;
    let mut off = public_target("m");
    off["enabled"] = json!(false);
    off["auth"] = json!({"mode": "vault", "secret_ref": "shield://prod"});
    assert_eq!(admin.put(&format!("{T}/spare"), &token, off).await.0, StatusCode::CREATED);
    let route = json!({"targets": ["openai-4o", "spare", "onprem-qwen"], "rules": [
        {"when": {"flagged": ["pii_detection"]}, "use": ["onprem-qwen"]},
        {"when": {"role": ["contractor"]}, "deny": "Contractors cannot use this model"}],
        "budget": {"monthly": 100, "at_limit": "block"}});
    assert_eq!(admin.put(&format!("{R}/shield%2Fsmart"), &token, route).await.0, StatusCode::CREATED);
    let path = format!("{R}/shield%2Fsmart/simulate");

    let (status, body) =
        admin.post(&path, &token, json!({"sample": "mail jane@example.com", "flagged": ["pii_detection"]})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["route"], "shield/smart");
    assert_eq!(
        body["rule"],
        json!({"index": 0, "description": "If the prompt is flagged by PII detection → only onprem-qwen"})
    );
    assert_eq!(body["eligible"], json!(["onprem-qwen"]));
    assert_eq!(body["order"], json!(["onprem-qwen"]));
    let rejected: Vec<(String, Value)> = body["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["target"].as_str().unwrap().to_string(), c["rejected"].clone()))
        .collect();
    assert_eq!(
        rejected,
        vec![
            ("openai-4o".into(), json!(["rule"])),
            ("spare".into(), json!(["rule"])),
            ("onprem-qwen".into(), json!([]))
        ]
    );
    assert_eq!(body["candidates"][0]["price"]["input_per_mtok"], 2.5);
    assert_eq!(body["candidates"][0]["state"], "unknown");
    assert_eq!(body["budget"], json!({"state": "ok", "spend": 0.0, "limit": 100.0, "currency": "USD"}));
    assert!(body["refused"].is_null());
    assert_eq!(body["config_digest"].as_str().unwrap().len(), 64);
    assert!(!body.to_string().contains("jane"), "no prompt text in the explanation");
    assert!(!body.to_string().contains("sk-simulate-secret"), "no secret resolved into the explanation");
    assert_eq!(body["candidates"][1]["state"], "disabled");

    let (_, body) = admin.post(&path, &token, json!({"role": "contractor"})).await;
    assert_eq!(body["refused"], "Contractors cannot use this model");
    let (_, body) = admin.post(&path, &token, json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(body["order"], json!(["openai-4o", "onprem-qwen"]));
    assert_eq!(body["candidates"][1]["rejected"], json!(["disabled"]));
    // A /v1/messages call with `thinking` needs an Anthropic target: the others are out, by name.
    let (_, body) = admin.post(&path, &token, json!({"sample": "hi", "requires_flavor": "anthropic"})).await;
    assert_eq!(body["order"], json!([]), "{body}");
    assert_eq!(body["candidates"][0]["rejected"], json!(["unsupported_field"]));
    assert_eq!(body["candidates"][2]["rejected"], json!(["unsupported_field"]));
    let (status, body) = admin.post(&path, &token, json!({"prompt": "x"})).await;
    assert_eq!((status, body["error"]["field"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("prompt")));
    assert_eq!(admin.post(&format!("{R}/nope/simulate"), &token, json!({})).await.0, StatusCode::NOT_FOUND);
}

/// What a key's record in Redis (`gw_key:<sha256>`) says, as the proxy reads it.
async fn key_record(admin: &Admin, key: &str) -> Value {
    let dump = shield_e2e::redis_dump(&admin.keys.api_key(&shield_core::snapshot::key_hash(key))).await;
    serde_json::from_str(&dump[0].1).unwrap()
}

/// Bodies whose `limits` are wrong in every way a client can get them wrong, and the field the
/// 422 must name. `at` is where the limits sit in the body ("limits." or "" for the tenant's).
fn bad_limits(at: &str) -> Vec<(Value, String)> {
    vec![
        (json!({"rpm": 0}), format!("{at}rpm")),
        (json!({"rpm": -1}), format!("{at}rpm")),
        (json!({"rpm": "x"}), format!("{at}rpm")),
        (json!({"rpm": 1.5}), format!("{at}rpm")),
        (json!({"tpm": 0}), format!("{at}tpm")),
        (json!({"tpm": 10_000_000_001u64}), format!("{at}tpm")),
        (json!({"rpm": 10, "burst": 1}), format!("{at}burst")),
    ]
}

/// Issue 18: keys carry `limits {rpm?, tpm?}`, validated field by field, shown in every answer
/// (`{}` when none), replaced by PATCH, published in the key's record at once and audited.
#[actix_web::test]
async fn key_limits_are_validated_listed_patched_published_and_audited() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let (status, limited) =
        admin.post("/v1/tenant/me/keys", &token, json!({"name": "ci", "limits": {"rpm": 600, "tpm": 100_000}})).await;
    assert_eq!(status, StatusCode::CREATED, "{limited}");
    assert_eq!(limited["limits"], json!({"rpm": 600, "tpm": 100_000}));
    let (key, id) = (limited["key"].as_str().unwrap().to_string(), limited["id"].as_str().unwrap().to_string());
    let (status, plain) = admin.post("/v1/tenant/me/keys", &token, json!({"name": "plain", "limits": null})).await;
    assert_eq!((status, plain["limits"].clone()), (StatusCode::CREATED, json!({})), "{plain}");
    let (_, list) = admin.get("/v1/tenant/me/keys", &token).await;
    let limits: Vec<Value> = list["keys"].as_array().unwrap().iter().map(|k| k["limits"].clone()).collect();
    assert_eq!(limits, [json!({"rpm": 600, "tpm": 100_000}), json!({})], "{list}");

    let record = key_record(&admin, &key).await;
    assert_eq!(record["limits"], json!({"rpm": 600, "tpm": 100_000}), "the proxy's record carries them: {record}");
    let record = key_record(&admin, plain["key"].as_str().unwrap()).await;
    assert!(record.get("limits").is_none(), "no limits, no field: {record}");

    let path = format!("/v1/tenant/me/keys/{id}");
    let (status, body) = admin.call(Method::PATCH, &path, Some(&token), Some(json!({"limits": {"rpm": 60}}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((body["id"].as_str(), body["limits"].clone()), (Some(id.as_str()), json!({"rpm": 60})));
    assert!(!body.to_string().contains(&key), "the key itself is shown only at creation");
    assert_eq!(key_record(&admin, &key).await["limits"], json!({"rpm": 60}), "republished at once");
    assert_eq!(admin.get("/v1/tenant/me/keys", &token).await.1["keys"][0]["limits"], json!({"rpm": 60}));

    for (limits, field) in bad_limits("limits.") {
        let (status, body) =
            admin.post("/v1/tenant/me/keys", &token, json!({"name": "bad", "limits": limits.clone()})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "POST {limits}: {body}");
        assert_eq!(
            (body["error"]["type"].as_str(), body["error"]["field"].as_str()),
            (Some("validation_error"), Some(field.as_str())),
            "POST {limits}: {body}"
        );
        assert!(!body["error"]["message"].as_str().unwrap().is_empty());
        let (status, body) =
            admin.call(Method::PATCH, &path, Some(&token), Some(json!({"limits": limits.clone()}))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "PATCH {limits}: {body}");
        assert_eq!(body["error"]["field"].as_str(), Some(field.as_str()), "PATCH {limits}: {body}");
    }
    for (patch, field) in [(json!({}), "limits"), (json!({"limits": {}, "name": "x"}), "name")] {
        let (status, body) = admin.call(Method::PATCH, &path, Some(&token), Some(patch)).await;
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(field)),
            "{body}"
        );
    }
    assert_eq!(admin.get("/v1/tenant/me/keys", &token).await.1["keys"].as_array().unwrap().len(), 2, "nothing made");
    assert_eq!(key_record(&admin, &key).await["limits"], json!({"rpm": 60}), "refused patches change nothing");

    let (other, ..) = admin.tenant().await;
    let (_, foreign) = admin.post("/v1/tenant/me/keys", &admin.owner(&other), json!({"name": "theirs"})).await;
    let foreign = format!("/v1/tenant/me/keys/{}", foreign["id"].as_str().unwrap());
    for missing in
        [foreign.as_str(), "/v1/tenant/me/keys/00000000-0000-0000-0000-000000000000", "/v1/tenant/me/keys/nope"]
    {
        let (status, body) =
            admin.call(Method::PATCH, missing, Some(&token), Some(json!({"limits": {"rpm": 1}}))).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{missing}: {body}");
    }

    let (status, body) = admin.call(Method::PATCH, &path, Some(&token), Some(json!({"limits": {}}))).await;
    assert_eq!((status, body["limits"].clone()), (StatusCode::OK, json!({})), "{body}");
    assert!(key_record(&admin, &key).await.get("limits").is_none(), "cleared in the proxy's record too");
    let stored: Option<Value> = sqlx::query_scalar("SELECT limits FROM api_keys WHERE id = $1::uuid")
        .bind(&id)
        .fetch_one(&admin.db.pool)
        .await
        .unwrap();
    assert_eq!(stored, None, "no limits are stored as NULL");

    let (_, audit) = admin.get("/v1/tenant/me/audit", &token).await;
    let rows: Vec<(&str, &str, bool)> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .filter(|e| e["object"] == id.as_str())
        .map(|e| (e["action"].as_str().unwrap(), e["actor"].as_str().unwrap(), e["after_digest"].is_string()))
        .collect();
    assert_eq!(
        rows,
        [
            ("key_created", "tester@example.com", true),
            ("key_limits_set", "tester@example.com", true),
            ("key_limits_set", "tester@example.com", true)
        ],
        "{audit}"
    );
    assert!(!audit.to_string().contains(&key), "never the key in the audit log");
}

/// Issue 18: the tenant's ceiling, `GET/PUT /v1/tenant/me/limits`: validated (fields `rpm`,
/// `tpm`), a new config version, in the published snapshot, audited; `{}` clears it.
#[actix_web::test]
async fn tenant_limits_round_trip_into_the_snapshot() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let reader = admin.token(Some(&slug), &[Scope::TenantRead]);
    assert_eq!(admin.get("/v1/tenant/me/limits", &reader).await, (StatusCode::OK, json!({})));
    let version = shield_e2e::admin::db_version(&admin, &slug).await;
    let (status, body) = admin.put("/v1/tenant/me/limits", &token, json!({"rpm": 1000, "tpm": 50_000})).await;
    assert_eq!((status, body.clone()), (StatusCode::OK, json!({"rpm": 1000, "tpm": 50_000})), "{body}");
    assert_eq!(admin.get("/v1/tenant/me/limits", &reader).await.1, json!({"rpm": 1000, "tpm": 50_000}));
    let bumped = shield_e2e::admin::db_version(&admin, &slug).await;
    assert_eq!(bumped, version + 1, "a PUT is a config write");
    let snapshot = admin.snapshot(&slug).await.expect("published");
    assert_eq!(
        (snapshot["version"].as_i64(), snapshot["limits"].clone()),
        (Some(bumped), json!({"rpm": 1000, "tpm": 50_000}))
    );

    for (limits, field) in bad_limits("") {
        let (status, body) = admin.put("/v1/tenant/me/limits", &token, limits.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{limits}: {body}");
        assert_eq!(
            (body["error"]["type"].as_str(), body["error"]["field"].as_str()),
            (Some("validation_error"), Some(field.as_str())),
            "{limits}: {body}"
        );
    }
    assert_eq!(shield_e2e::admin::db_version(&admin, &slug).await, bumped, "refused writes change nothing");
    assert_eq!(admin.put("/v1/tenant/me/limits", &reader, json!({})).await.0, StatusCode::FORBIDDEN);

    let (status, body) = admin.put("/v1/tenant/me/limits", &token, json!({"tpm": 7})).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"tpm": 7})), "a PUT replaces, it does not merge");
    let (status, body) = admin.put("/v1/tenant/me/limits", &token, json!({})).await;
    assert_eq!((status, body), (StatusCode::OK, json!({})));
    assert!(admin.snapshot(&slug).await.unwrap().get("limits").is_none(), "cleared in the snapshot");
    let (_, audit) = admin.get("/v1/tenant/me/audit", &token).await;
    let sets = audit["entries"].as_array().unwrap().iter().filter(|e| e["action"] == "tenant_limits_set").count();
    assert_eq!(sets, 3, "{audit}");
    assert_eq!(audit["entries"][0]["object"], "limits");
}

/// Issue 18: a route's `limits` round-trip through PUT/GET into the snapshot, named on refusal.
#[actix_web::test]
async fn route_limits_round_trip_and_are_validated() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    admin.put(&format!("{T}/a"), &token, public_target("m")).await;
    let route = json!({"targets": ["a"], "limits": {"rpm": 100, "tpm": 20_000}});
    let (status, body) = admin.put(&format!("{R}/smart"), &token, route).await;
    assert_eq!((status, body["limits"].clone()), (StatusCode::CREATED, json!({"rpm": 100, "tpm": 20_000})), "{body}");
    assert_eq!(admin.get(&format!("{R}/smart"), &token).await.1["limits"], json!({"rpm": 100, "tpm": 20_000}));
    let snapshot = admin.snapshot(&slug).await.unwrap();
    assert_eq!(snapshot["routes"]["smart"]["limits"], json!({"rpm": 100, "tpm": 20_000}));
    for (limits, field) in bad_limits("limits.") {
        let (status, body) =
            admin.put(&format!("{R}/smart"), &token, json!({"targets": ["a"], "limits": limits})).await;
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(field.as_str())),
            "{body}"
        );
    }
    let (status, body) = admin.put(&format!("{R}/smart"), &token, json!({"targets": ["a"]})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("limits").is_none(), "no limits, no field: {body}");
}
