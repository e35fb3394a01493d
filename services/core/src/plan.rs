//! Selection (ROUTING.md "Selection pipeline"): from a route, the tenant's targets and what is
//! known about this request, the eligible set in the order the strategy would try it, with the
//! reason for every excluded candidate. Pure: the proxy passes in everything it knows.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::route::{Route, Strategy};
use crate::target::{AuthMode, Target};

/// Why a candidate is not eligible for this request (a closed set; also a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Exclusion {
    Disabled,
    /// The route lists a target the snapshot does not have (defence in depth; writes refuse it).
    Unknown,
    CredentialUnavailable,
}

impl Exclusion {
    pub fn as_str(self) -> &'static str {
        match self {
            Exclusion::Disabled => "disabled",
            Exclusion::Unknown => "unknown_target",
            Exclusion::CredentialUnavailable => "credential_unavailable",
        }
    }
}

/// What the proxy knows about the request and its own state, as plain data.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The caller sent `X-Shield-Upstream-Key` (for passthrough targets).
    pub has_upstream_key: bool,
    /// Targets whose vault secret is in the snapshot, decrypts, and is bound to their host.
    pub vault_ready: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Excluded {
    pub target: String,
    pub reason: Exclusion,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The eligible set in the order attempts will go.
    pub order: Vec<String>,
    pub excluded: Vec<Excluded>,
}

pub fn plan(route: &Route, targets: &BTreeMap<String, Target>, facts: &Facts) -> Plan {
    let mut out = Plan::default();
    for id in &route.targets {
        match admit(targets.get(id), facts) {
            Ok(()) => out.order.push(id.clone()),
            Err(reason) => out.excluded.push(Excluded {
                target: id.clone(),
                reason,
            }),
        }
    }
    order(route.strategy, &mut out.order);
    out
}

fn admit(target: Option<&Target>, facts: &Facts) -> Result<(), Exclusion> {
    let target = target.ok_or(Exclusion::Unknown)?;
    if !target.enabled {
        return Err(Exclusion::Disabled);
    }
    let credential_ready = match target.auth.mode {
        AuthMode::None => true,
        AuthMode::Passthrough => facts.has_upstream_key,
        AuthMode::Vault => facts.vault_ready.contains(&target.id),
    };
    if !credential_ready {
        return Err(Exclusion::CredentialUnavailable);
    }
    Ok(())
}

/// The strategy's order. `priority` is the route's order. The health- and price-aware
/// strategies (`lowest_latency`, `lowest_cost`, `weighted`) need the breaker/EWMA and pricing
/// inputs that arrive with the streaming and budget work; until then they keep route order.
fn order(strategy: Strategy, _eligible: &mut [String]) {
    match strategy {
        Strategy::Priority
        | Strategy::LowestLatency
        | Strategy::LowestCost
        | Strategy::Weighted => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::from_json_field;

    fn target(id: &str, extra: serde_json::Value) -> Target {
        let mut body = serde_json::json!({"id": id, "base_url": "https://x.example.com/v1", "model": "m", "auth": {"mode": "none"}});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        from_json_field(body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn priority_keeps_route_order_and_names_every_exclusion() {
        let targets: BTreeMap<String, Target> = [
            target("a", serde_json::json!({})),
            target("off", serde_json::json!({"enabled": false})),
            target(
                "vault",
                serde_json::json!({"auth": {"mode": "vault", "secret_ref": "shield://s"}}),
            ),
            target("byok", serde_json::json!({"auth": {"mode": "passthrough"}})),
            target("b", serde_json::json!({})),
        ]
        .into_iter()
        .map(|t| (t.id.clone(), t))
        .collect();
        let route: Route = from_json_field(
            br#"{"name": "r", "targets": ["b", "off", "vault", "byok", "ghost", "a"]}"#,
        )
        .unwrap();
        let p = plan(&route, &targets, &Facts::default());
        assert_eq!(p.order, vec!["b", "a"]);
        let reasons: Vec<(&str, Exclusion)> = p
            .excluded
            .iter()
            .map(|e| (e.target.as_str(), e.reason))
            .collect();
        assert_eq!(
            reasons,
            vec![
                ("off", Exclusion::Disabled),
                ("vault", Exclusion::CredentialUnavailable),
                ("byok", Exclusion::CredentialUnavailable),
                ("ghost", Exclusion::Unknown)
            ]
        );
        let facts = Facts {
            has_upstream_key: true,
            vault_ready: BTreeSet::from(["vault".to_string()]),
        };
        assert_eq!(
            plan(&route, &targets, &facts).order,
            vec!["b", "vault", "byok", "a"]
        );
    }
}
