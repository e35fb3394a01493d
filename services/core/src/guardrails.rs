//! The tenant's guardrail policy as stored and published (enforcement comes with the
//! guardrails issue). Modes apply to input and output alike.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The guardrails a rule's `flagged` condition may name.
pub const GUARDRAIL_NAMES: [&str; 2] = ["pii_detection", "secrets_detection"];

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GuardrailPolicy {
    #[serde(default)]
    pub pii_detection: Detector,
    #[serde(default)]
    pub secrets_detection: Detector,
    #[serde(default)]
    pub tools: ToolPolicy,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Detector {
    #[serde(default)]
    pub mode: Mode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Off,
    Monitor,
    Warn,
    Block,
}

/// Tool RBAC: per role, the tool names an answer may call; the kill switch disables tool calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolPolicy {
    #[serde(default)]
    pub kill_switch: bool,
    #[serde(default)]
    pub allowed_by_role: BTreeMap<String, Vec<String>>,
}

impl GuardrailPolicy {
    pub fn validate(&self) -> Result<(), Vec<crate::FieldError>> {
        let mut problems = crate::error::Problems::default();
        for (role, tools) in &self.tools.allowed_by_role {
            if role.trim().is_empty() || role.len() > 64 {
                problems.push("tools.allowed_by_role", format!("role name {role:?} must be 1-64 characters"));
            }
            for (i, tool) in tools.iter().enumerate() {
                if tool.trim().is_empty() || tool.len() > 128 {
                    problems.push(format!("tools.allowed_by_role.{role}[{i}]"), "tool name must be 1-128 characters");
                }
            }
        }
        problems.into_result()
    }
}
