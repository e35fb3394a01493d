//! Routes (seed §3.2 plus ROUTING.md): the name callers send as `model`, the eligible set in
//! priority order, the strategy, failover limits, rules and the monthly budget.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::limits::Limits;
use crate::money::Usd;
use crate::profile::RequiredProfile;
use crate::target::Location;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// Taken from the path on write; when present in the body it must match.
    #[serde(default)]
    pub name: String,
    /// The eligible set, in priority order.
    pub targets: Vec<String>,
    #[serde(default)]
    pub strategy: Strategy,
    /// `weighted` only: target id → weight (a listed target without a weight gets 0 and is
    /// tried only after every weighted one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<BTreeMap<String, u32>>,
    #[serde(default)]
    pub failover: Failover,
    /// What a stream that breaks after its commit point does (issue 17); default `off`.
    #[serde(default, skip_serializing_if = "StreamResume::is_off")]
    pub stream_resume: StreamResume,
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// Requests and tokens per minute for every caller of this route together (issue 18).
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// Seed 004: every listed target must satisfy this envelope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required_profile: Option<RequiredProfile>,
    #[serde(default = "crate::target::defaults::yes")]
    pub enabled: bool,
    #[serde(default)]
    pub updated_at: i64,
    #[serde(default)]
    pub updated_by: String,
    /// Read-only: the month's spend against the budget, filled by route reads
    /// (`{spend, limit, percent, state, incomplete}`); ignored on input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub budget_state: Option<serde_json::Value>,
}

/// `stream_resume` (issue 17): after a break, an error event or silence past the commit point,
/// re-issue the request within `deadline_s` — first to the same target, then to the next
/// eligible ones — instead of ending the stream with an error.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamResume {
    /// End with the `stream_broken` error (today's behaviour).
    #[default]
    Off,
    /// Read a new answer, withhold it until it has reproduced the text already sent, then pass
    /// on only the rest; an answer that diverges is never shown.
    Regenerate,
    /// On targets declaring `capabilities.assistant_prefill`, send the text already sent as a
    /// trailing assistant message and stream the continuation; elsewhere, regenerate.
    Continue,
}

impl StreamResume {
    pub fn is_off(&self) -> bool {
        *self == StreamResume::Off
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    #[default]
    Priority,
    LowestLatency,
    LowestCost,
    Weighted,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Failover {
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    #[serde(default = "defaults::deadline_s")]
    pub deadline_s: u32,
    #[serde(default = "defaults::on")]
    pub on: Vec<FailoverOn>,
    /// Same-target retry before moving on (opt-in; omitted or `attempts: 0`: none).
    #[serde(default, skip_serializing_if = "Retry::is_off")]
    pub retry: Retry,
}

impl Default for Failover {
    fn default() -> Self {
        Failover {
            max_attempts: defaults::max_attempts(),
            deadline_s: defaults::deadline_s(),
            on: defaults::on(),
            retry: Retry::default(),
        }
    }
}

/// `failover.retry` (issue 17): retry the same target up to `attempts` times on the listed
/// classes, after its reset hint when that is at most `max_wait_s`, else after a jittered
/// backoff (0.25 s × 2^n, ±50 %). A longer hint parks the target and the run moves on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    #[serde(default)]
    pub attempts: u32,
    #[serde(default = "defaults::retry_on")]
    pub on: Vec<FailoverOn>,
    #[serde(default = "defaults::retry_max_wait_s")]
    pub max_wait_s: u32,
}

impl Default for Retry {
    fn default() -> Self {
        Retry { attempts: 0, on: defaults::retry_on(), max_wait_s: defaults::retry_max_wait_s() }
    }
}

impl Retry {
    pub fn is_off(&self) -> bool {
        *self == Retry::default()
    }
}

/// The closed set of failure classes a route may fail over on (ROUTING.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
pub enum FailoverOn {
    #[serde(rename = "timeout")]
    Timeout,
    #[serde(rename = "connect")]
    Connect,
    #[serde(rename = "429")]
    RateLimited,
    #[serde(rename = "5xx")]
    ServerError,
    /// Opt-in (seed 002): credit exhausted.
    #[serde(rename = "402")]
    PaymentRequired,
    /// Opt-in: move on only to targets with a larger declared context window.
    #[serde(rename = "context_length")]
    ContextLength,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default)]
    pub when: Conditions,
    /// Narrow the eligible set to these targets (a subset of the route's).
    #[serde(default, rename = "use", skip_serializing_if = "Option::is_none")]
    pub use_targets: Option<Vec<String>>,
    /// Refuse the call with this reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<String>,
}

/// All present conditions must hold (seed §3.2), except `location_required`, which narrows
/// rather than tests ("As built").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Conditions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flagged: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_class: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location_required: Option<Location>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_over: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub monthly: Usd,
    #[serde(default = "crate::target::defaults::currency")]
    pub currency: String,
    #[serde(default)]
    pub at_limit: AtLimit,
    #[serde(default)]
    pub fallback_targets: Vec<String>,
}

impl Rule {
    /// The rule in plain words, e.g. "If the prompt is flagged by PII detection → only
    /// onprem-qwen" (the portal and the simulator show it).
    pub fn describe(&self) -> String {
        let w = &self.when;
        let list = |values: &[String]| values.join(" or ");
        let mut conditions = Vec::new();
        if let Some(names) = &w.flagged {
            let titles: Vec<&str> = names.iter().map(|n| crate::guardrails::GuardrailPolicy::title(n)).collect();
            conditions.push(format!("the prompt is flagged by {}", titles.join(" or ")));
        }
        if let Some(values) = &w.data_class {
            conditions.push(format!("the data class is {}", list(values)));
        }
        if let Some(values) = &w.agent {
            conditions.push(format!("the agent is {}", list(values)));
        }
        if let Some(values) = &w.role {
            conditions.push(format!("the role is {}", list(values)));
        }
        if let Some(tokens) = w.prompt_tokens_over {
            conditions.push(format!("the prompt is over {tokens} tokens"));
        }
        let when =
            if conditions.is_empty() { "Always".to_string() } else { format!("If {}", conditions.join(" and ")) };
        let mut then = match (&self.deny, &self.use_targets) {
            (Some(reason), _) => format!("refuse: \"{reason}\""),
            (None, Some(targets)) => format!("only {}", targets.join(", ")),
            (None, None) => "any target".to_string(),
        };
        if let (None, Some(location)) = (&self.deny, w.location_required) {
            let place = match location {
                Location::Cloud => "cloud",
                Location::OnPrem => "on-prem",
            };
            then = format!("{then}, {place} only");
        }
        format!("{when} → {then}")
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AtLimit {
    /// Seed §7: warn is the default.
    #[default]
    Warn,
    Fallback,
    Block,
}

mod defaults {
    use super::FailoverOn;

    pub fn max_attempts() -> u32 {
        3
    }
    pub fn deadline_s() -> u32 {
        120
    }
    pub fn on() -> Vec<FailoverOn> {
        vec![FailoverOn::Timeout, FailoverOn::Connect, FailoverOn::RateLimited, FailoverOn::ServerError]
    }
    pub fn retry_on() -> Vec<FailoverOn> {
        vec![FailoverOn::RateLimited, FailoverOn::ServerError, FailoverOn::Timeout, FailoverOn::Connect]
    }
    pub fn retry_max_wait_s() -> u32 {
        5
    }
}
