//! Safety envelopes (seed 004): a target's `profile` and a route's `required_profile`.
//! Availability may degrade; the envelope may not — every target a route lists must satisfy it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a target promises about where data goes and how it is treated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moderation_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_profile: Option<String>,
    /// Zero data retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zdr: Option<bool>,
}

pub const PROFILE_KEYS: [&str; 6] =
    ["region", "retention_class", "moderation_profile", "tool_profile", "log_profile", "zdr"];

/// One requirement of a route's envelope: a required value or a list of allowed values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Requirement {
    Flag(bool),
    Exactly(String),
    AnyOf(Vec<String>),
}

/// Route `required_profile`: profile key → requirement.
pub type RequiredProfile = BTreeMap<String, Requirement>;

impl Profile {
    fn text(&self, key: &str) -> Option<&str> {
        match key {
            "region" => self.region.as_deref(),
            "retention_class" => self.retention_class.as_deref(),
            "moderation_profile" => self.moderation_profile.as_deref(),
            "tool_profile" => self.tool_profile.as_deref(),
            "log_profile" => self.log_profile.as_deref(),
            _ => None,
        }
    }

    /// The profile keys (in `required` order) this profile fails. An undeclared value never
    /// satisfies a requirement: an envelope is preserved only by a promise, not by silence.
    pub fn unmet<'r>(&self, required: &'r RequiredProfile) -> Vec<&'r str> {
        required.iter().filter(|(key, want)| !self.meets(key, want)).map(|(key, _)| key.as_str()).collect()
    }

    fn meets(&self, key: &str, want: &Requirement) -> bool {
        match (key, want) {
            ("zdr", Requirement::Flag(flag)) => self.zdr == Some(*flag),
            (_, Requirement::Exactly(value)) => self.text(key) == Some(value.as_str()),
            (_, Requirement::AnyOf(values)) => self.text(key).is_some_and(|v| values.iter().any(|w| w == v)),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_checks() {
        let profile = Profile { region: Some("eu".into()), zdr: Some(true), ..Default::default() };
        let req: RequiredProfile = serde_json::from_str(r#"{"region": ["eu","ch"], "zdr": true}"#).unwrap();
        assert!(profile.unmet(&req).is_empty());
        let req: RequiredProfile = serde_json::from_str(r#"{"region": "us", "log_profile": "forensic"}"#).unwrap();
        assert_eq!(profile.unmet(&req), vec!["log_profile", "region"]);
        let req: RequiredProfile = serde_json::from_str(r#"{"zdr": false}"#).unwrap();
        assert_eq!(profile.unmet(&req), vec!["zdr"]);
    }
}
