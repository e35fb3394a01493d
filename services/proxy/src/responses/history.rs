//! A request's place in a stored conversation (issue 29): `previous_response_id` continues a
//! stored response (its input, then its output, come before this request's input) and
//! `item_reference` items are replaced by the stored items they name, so the typed request
//! always holds the whole conversation. A request with `store` (true unless it says false, as
//! in OpenAI's API) leaves a [`Keeper`] that keeps its answer for the tenant's retention.
//!
//! Only for routed requests: the default path relays the body as sent, and the upstream there
//! answers for its own stored state.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::store::{Gap, Kept, MAX_CHAIN, ResponseStore, StoreDown};
use crate::error::ProxyError;

/// Keeps one answered response, the input it was sent with and the response it continued.
pub struct Keeper {
    store: Arc<ResponseStore>,
    tenant: String,
    id: String,
    retention_s: u32,
    input: Vec<Value>,
    previous: Option<String>,
}

impl Keeper {
    /// Keeps `response` (Shield's own `x_shield` record is not part of it). A store that
    /// cannot be reached loses the stored copy, not the answer: logged, and a later
    /// `previous_response_id` naming it is answered 400 as for an expired one.
    pub async fn keep(self, response: &Value) {
        let mut response = response.clone();
        if let Some(fields) = response.as_object_mut() {
            fields.remove("x_shield");
        }
        let kept = Kept { response, input: self.input, previous: self.previous };
        if let Err(err) = self.store.keep(&self.tenant, &self.id, &kept, self.retention_s).await {
            tracing::warn!(tenant = %self.tenant, response = %self.id, error = %err.0, "could not store the response");
        }
    }
}

/// Expands `fields["input"]` in place to the whole conversation; returns the keeper when the
/// answer is to be stored. `id` is the response id this request will be answered under.
pub async fn expand(
    fields: &mut Map<String, Value>,
    tenant: &str,
    retention_s: u32,
    store: &Arc<ResponseStore>,
    id: &str,
) -> Result<Option<Keeper>, ProxyError> {
    let store_it = fields.get("store").and_then(Value::as_bool).unwrap_or(true) && retention_s > 0;
    let continues = fields.get("previous_response_id").is_some_and(|v| !v.is_null());
    let references_items = fields.get("input").and_then(Value::as_array).is_some_and(|items| {
        items.iter().any(|item| item.get("type").and_then(Value::as_str) == Some("item_reference"))
    });
    if !store_it && !continues && !references_items {
        // Codex's case (`store: false`, the whole history sent): nothing to read or keep.
        return Ok(None);
    }
    let mut input = match fields.get("input") {
        Some(Value::String(text)) => {
            vec![json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})]
        }
        Some(Value::Array(items)) => items.clone(),
        // Not a conversation: the parse names the problem.
        _ => return Ok(None),
    };
    let mut history = Vec::new();
    let mut previous_id = None;
    if let Some(previous) = fields.get("previous_response_id").filter(|v| !v.is_null()) {
        let Some(previous) = previous.as_str() else {
            return Err(ProxyError::BadRequest("`previous_response_id` must be a string".into()));
        };
        if retention_s == 0 {
            return Err(ProxyError::BadRequest(
                "`previous_response_id`: this tenant keeps no stored responses (retention 0); send the whole \
                 conversation in `input`"
                    .into(),
            ));
        }
        let found =
            store.history(tenant, previous, retention_s).await.map_err(|err| down("previous_response_id", err))?;
        history = match found {
            Ok(history) => history,
            Err(Gap::Missing) => {
                return Err(ProxyError::BadRequest(format!(
                    "`previous_response_id`: no stored response `{previous}` (never stored, expired or deleted)"
                )));
            }
            Err(Gap::Broken(at)) => {
                return Err(ProxyError::BadRequest(format!(
                    "`previous_response_id`: an earlier response of this conversation, `{at}`, is no longer stored \
                     (expired or deleted); send the whole conversation in `input`"
                )));
            }
            Err(Gap::TooLong) => {
                return Err(ProxyError::BadRequest(format!(
                    "`previous_response_id`: the conversation is longer than {MAX_CHAIN} stored responses; send the \
                     whole conversation in `input`"
                )));
            }
        };
        previous_id = Some(previous.to_string());
    }
    let references: Vec<(usize, String)> = input
        .iter()
        .enumerate()
        .filter(|(_, item)| item.get("type").and_then(Value::as_str) == Some("item_reference"))
        .map(|(i, item)| (i, item.get("id").and_then(Value::as_str).unwrap_or_default().to_string()))
        .collect();
    if let Some((at, _)) = references.first()
        && retention_s == 0
    {
        return Err(ProxyError::BadRequest(format!(
            "`input.{at}`: item_reference needs stored responses, and this tenant keeps none (retention 0)"
        )));
    }
    let ids: Vec<String> = references.iter().map(|(_, id)| id.clone()).collect();
    let found = store.items(tenant, &ids).await.map_err(|err| down("item_reference", err))?;
    for ((at, id), item) in references.iter().zip(found) {
        let Some(item) = item else {
            return Err(ProxyError::BadRequest(format!("`input.{at}.id`: no stored item `{id}`")));
        };
        if let Some(slot) = input.get_mut(*at) {
            *slot = item;
        }
    }
    let keeper = store_it.then(|| Keeper {
        store: store.clone(),
        tenant: tenant.to_string(),
        id: id.to_string(),
        retention_s,
        input: input.clone(),
        previous: previous_id,
    });
    history.extend(input);
    fields.insert("input".into(), Value::Array(history));
    Ok(keeper)
}

/// The store is needed and down: logged (the reason names no key or prompt), 503 to the caller.
fn down(field: &'static str, err: StoreDown) -> ProxyError {
    tracing::warn!(error = %err.0, "{field}: the response store is unreachable");
    ProxyError::StoreUnavailable(field)
}
