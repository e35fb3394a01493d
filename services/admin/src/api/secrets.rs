//! `/v1/tenant/me/secrets`: the vault. A value goes in once and never comes out through the
//! API: reads return metadata (name, bindings, dates, at most a 4-character hint). Decode
//! errors about the value are reworded so they cannot echo it.

use actix_web::{HttpResponse, delete, get, put, web};
use serde::{Deserialize, Serialize};
use shield_core::names::check_secret_name;
use shield_core::url_safety::{self, check_binding};
use shield_core::vault::{hint, secret_aad};

use super::{Body, State, created_or_replaced};
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ApiResult};
use crate::random;
use crate::repo::audit::Action;
use crate::repo::config;
use crate::repo::secrets::{self, SecretMeta};
use crate::write::{ConfigWrite, digest_of};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretWrite {
    /// The secret (e.g. a provider API key). Write-only.
    pub value: String,
    /// Bare hosts or IPs the secret may be sent to (no scheme, no port).
    pub bindings: Vec<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct SecretList {
    pub secrets: Vec<SecretMeta>,
}

const MAX_VALUE_BYTES: usize = 8 * 1024;
const MAX_BINDINGS: usize = 20;

#[utoipa::path(get, path = "/v1/tenant/me/secrets", tag = "secrets", security(("bearer" = ["tenant:read"])),
    responses((status = 200, body = SecretList)))]
#[get("/v1/tenant/me/secrets")]
pub async fn list(state: State, principal: Principal) -> ApiResult<HttpResponse> {
    let tenant = principal.tenant(&state, Scope::TenantRead).await?;
    Ok(HttpResponse::Ok().json(SecretList { secrets: secrets::list(&state.db, tenant.id).await? }))
}

#[utoipa::path(get, path = "/v1/tenant/me/secrets/{name}", tag = "secrets", security(("bearer" = ["tenant:read"])),
    params(("name" = String, Path)), responses((status = 200, body = SecretMeta), (status = 404)))]
#[get("/v1/tenant/me/secrets/{name}")]
pub async fn get(state: State, principal: Principal, name: web::Path<String>) -> ApiResult<HttpResponse> {
    let name = name.into_inner();
    let tenant = principal.tenant(&state, Scope::TenantRead).await?;
    let meta = secrets::get(&state.db, tenant.id, &name).await?.ok_or_else(|| not_found(&name))?;
    Ok(HttpResponse::Ok().json(meta))
}

/// Create or replace. Refused (409) when a target using the secret would lose its host binding.
#[utoipa::path(put, path = "/v1/tenant/me/secrets/{name}", tag = "secrets", security(("bearer" = ["config:write"])),
    params(("name" = String, Path)), request_body = SecretWrite,
    responses((status = 200, body = SecretMeta, description = "replaced"), (status = 201, body = SecretMeta, description = "created"),
        (status = 409, description = "a target using it would lose its binding"), (status = 422)))]
#[put("/v1/tenant/me/secrets/{name}")]
pub async fn put(state: State, principal: Principal, name: web::Path<String>, body: Body) -> ApiResult<HttpResponse> {
    let name = name.into_inner();
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    check_secret_name(&name).map_err(|why| ApiError::validation("name", why))?;
    let request: SecretWrite = shield_core::parse::decode(&body).map_err(without_value)?;
    check_value(&request.value)?;
    let bindings = normalise_bindings(request.bindings)?;

    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let unbound: Vec<String> = targets_using(write.conn(), tenant.id, &name)
        .await?
        .into_iter()
        .filter(|(_, host)| !bindings.iter().any(|b| b == host))
        .map(|(id, host)| format!("{id} ({host})"))
        .collect();
    if !unbound.is_empty() {
        let message = format!("targets would lose their binding to secret {name:?}: {}", unbound.join(", "));
        return Err(ApiError::Conflict { message, key: "targets", names: unbound });
    }
    let sealed = state.keyring.seal(&secret_aad(&tenant.slug, &name), request.value.as_bytes(), random::bytes());
    let existed = secrets::get(write.conn(), tenant.id, &name).await?;
    let (meta, created) =
        secrets::put(write.conn(), tenant.id, &name, &sealed, &bindings, hint(&request.value).as_deref()).await?;
    // The digests cover metadata only: a hash of a secret value could be guessed offline.
    let metadata = |m: &SecretMeta| digest_of(&serde_json::json!({"bindings": m.bindings, "updated_at": m.updated_at}));
    write.commit(Action::SecretSet, &name, existed.as_ref().map(metadata), Some(metadata(&meta))).await?;
    Ok(created_or_replaced(created, meta))
}

/// Refused (409) while a target references the secret.
#[utoipa::path(delete, path = "/v1/tenant/me/secrets/{name}", tag = "secrets", security(("bearer" = ["config:write"])),
    params(("name" = String, Path)), responses((status = 204), (status = 404), (status = 409, description = "used by targets (named)")))]
#[delete("/v1/tenant/me/secrets/{name}")]
pub async fn delete(state: State, principal: Principal, name: web::Path<String>) -> ApiResult<HttpResponse> {
    let name = name.into_inner();
    let tenant = principal.tenant(&state, Scope::ConfigWrite).await?;
    let mut write = ConfigWrite::begin(&state.db, &state.publisher, &tenant, principal.actor()).await?;
    let users: Vec<String> =
        targets_using(write.conn(), tenant.id, &name).await?.into_iter().map(|(id, _)| id).collect();
    if !users.is_empty() {
        let message = format!("secret {name:?} is used by targets: {}; change their auth first", users.join(", "));
        return Err(ApiError::Conflict { message, key: "targets", names: users });
    }
    if !secrets::delete(write.conn(), tenant.id, &name).await? {
        return Err(not_found(&name));
    }
    write.commit(Action::SecretDeleted, &name, None, None).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Targets whose vault reference names `secret`, with the host each needs bound.
async fn targets_using(
    conn: &mut sqlx::PgConnection,
    tenant_id: i64,
    secret: &str,
) -> Result<Vec<(String, String)>, ApiError> {
    Ok(config::targets(conn, tenant_id)
        .await?
        .into_values()
        .filter(|t| t.auth.secret_name() == Some(secret))
        .map(|t| {
            let host = url_safety::parse_outbound_url(&t.base_url)
                .ok()
                .and_then(|u| url_safety::binding_host(&u))
                .unwrap_or_default();
            (t.id, host)
        })
        .collect())
}

fn check_value(value: &str) -> Result<(), ApiError> {
    if value.is_empty() || value.len() > MAX_VALUE_BYTES {
        return Err(ApiError::validation("value", format!("must be 1-{MAX_VALUE_BYTES} bytes")));
    }
    // A credential ends up in a header: CR/LF or other control characters would be injection.
    if value.chars().any(char::is_control) {
        return Err(ApiError::validation(
            "value",
            "must not contain control characters (it is sent as a header value)",
        ));
    }
    Ok(())
}

fn normalise_bindings(bindings: Vec<String>) -> Result<Vec<String>, ApiError> {
    if bindings.is_empty() || bindings.len() > MAX_BINDINGS {
        return Err(ApiError::validation(
            "bindings",
            format!("must list 1-{MAX_BINDINGS} hosts the secret may be sent to"),
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(bindings.len());
    for (i, binding) in bindings.into_iter().enumerate() {
        check_binding(&binding).map_err(|why| ApiError::validation(format!("bindings[{i}]"), why))?;
        let binding = binding.to_ascii_lowercase();
        if !out.contains(&binding) {
            out.push(binding);
        }
    }
    Ok(out)
}

fn without_value(err: shield_core::parse::DecodeError) -> ApiError {
    match err {
        shield_core::parse::DecodeError::Invalid(field) if field.field == "value" => {
            ApiError::validation("value", "must be a string")
        }
        shield_core::parse::DecodeError::Malformed(_) => ApiError::BadRequest("malformed JSON body".into()),
        other => other.into(),
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError::NotFound(format!("secret {name:?} does not exist"))
}
