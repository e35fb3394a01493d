//! `openapi/openapi.json` is what the code generates. Regenerate with
//! `UPDATE_OPENAPI=1 cargo test -p shield-e2e --test openapi_drift`.

use utoipa::OpenApi;

#[test]
fn committed_openapi_matches_the_code() {
    let generated = shield_admin::openapi::ApiDoc::openapi().to_pretty_json().expect("serialises") + "\n";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    if std::env::var("UPDATE_OPENAPI").is_ok_and(|v| v == "1") {
        std::fs::write(path, &generated).expect("write openapi.json");
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json differs from the code; regenerate it with UPDATE_OPENAPI=1 cargo test -p shield-e2e --test openapi_drift"
    );
    let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
    for path in [
        "/v1/auth/login",
        "/v1/admin/tenants",
        "/v1/tenant/me/gateway/targets/{id}",
        "/v1/tenant/me/gateway/routes/{name}",
        "/v1/tenant/me/secrets/{name}",
        "/v1/tenant/me/keys",
        "/v1/tenant/me/keys/{id}",
        "/v1/tenant/me/limits",
        "/v1/tenant/me/guardrails",
        "/v1/tenant/me/audit",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
}
