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

/// One guardrail's verdict on a text, as reported in `x_shield.guardrail_results`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuardrailResult {
    pub name: &'static str,
    pub mode: Mode,
    /// `false` when the detector found something (whatever the mode made of it).
    pub passed: bool,
    /// Kind → count; never the matched text.
    pub findings: crate::detect::Findings,
}

/// The guardrails' verdict on one text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    pub results: Vec<GuardrailResult>,
    /// Guardrails that did not pass but allowed the text (monitor, warn): what rules' `flagged`
    /// condition reads.
    pub flagged: Vec<&'static str>,
    /// The first guardrail in `block` mode that did not pass.
    pub blocked_by: Option<&'static str>,
}

/// The findings of the detectors a policy runs, for one text: `None` for a detector that is
/// off. Kinds and counts only, never the text: this is what the verdict memo keeps
/// ([`crate::verdicts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scanned {
    pub pii: Option<crate::detect::Findings>,
    pub secrets: Option<crate::detect::Findings>,
}

impl Scanned {
    /// Whether no detector found anything.
    pub fn is_clean(&self) -> bool {
        [&self.pii, &self.secrets].into_iter().flatten().all(|found| found.is_empty())
    }

    /// The findings of `scans` added up, kind by kind; a detector is `None` only where it was
    /// in no scan.
    pub fn sum<'s>(scans: impl IntoIterator<Item = &'s Scanned>) -> Scanned {
        let mut sum = Scanned::default();
        for scan in scans {
            for (total, found) in [(&mut sum.pii, &scan.pii), (&mut sum.secrets, &scan.secrets)] {
                if let Some(found) = found {
                    let total = total.get_or_insert_with(Default::default);
                    for (kind, n) in found {
                        *total.entry(kind).or_insert(0) += n;
                    }
                }
            }
        }
        sum
    }
}

impl GuardrailPolicy {
    /// Runs every enabled detector over `text`.
    pub fn check(&self, text: &str) -> Verdict {
        self.verdict([&self.scan(text)])
    }

    /// The verdict on a request: each system part and each message scanned on its own (a
    /// finding never spans two messages), their findings summed. With `memo`, a text this
    /// tenant sent before under the same detectors is not scanned again (issue 33).
    pub fn check_request(&self, request: &crate::exchange::Request, memo: Option<&crate::verdicts::Memo>) -> Verdict {
        if self.detectors() == 0 {
            return Verdict::default();
        }
        let scans = match memo {
            Some(memo) => memo.scan_all(self, request),
            None => crate::verdicts::units(request).iter().map(|unit| self.scan(&unit.joined())).collect(),
        };
        self.verdict(scans.iter())
    }

    /// Which detectors run, as bits (pii 1, secrets 2): what findings depend on besides the
    /// text. The modes do not change what is found, only what a finding does.
    pub fn detectors(&self) -> u8 {
        u8::from(self.pii_detection.mode != Mode::Off) | (u8::from(self.secrets_detection.mode != Mode::Off) << 1)
    }

    /// Every enabled detector's findings on `text`.
    pub fn scan(&self, text: &str) -> Scanned {
        let detectors = self.detectors();
        if detectors == 0 {
            return Scanned::default();
        }
        // One pass over clean text (nearly all of it) answers for every detector.
        let clean = !crate::detect::may_find(text);
        let run = |on: bool, detect: fn(&str) -> crate::detect::Findings| {
            on.then(|| if clean { crate::detect::Findings::new() } else { detect(text) })
        };
        Scanned {
            pii: run(detectors & 1 != 0, crate::detect::pii),
            secrets: run(detectors & 2 != 0, crate::detect::secrets),
        }
    }

    /// The modes applied to findings summed over `scans`.
    pub fn verdict<'s>(&self, scans: impl IntoIterator<Item = &'s Scanned>) -> Verdict {
        let sum = Scanned::sum(scans);
        let (pii, secrets) = (sum.pii.unwrap_or_default(), sum.secrets.unwrap_or_default());
        let mut verdict = Verdict::default();
        for (name, detector, findings) in
            [("pii_detection", &self.pii_detection, pii), ("secrets_detection", &self.secrets_detection, secrets)]
        {
            if detector.mode == Mode::Off {
                continue;
            }
            let passed = findings.is_empty();
            if !passed {
                match detector.mode {
                    Mode::Block => {
                        verdict.blocked_by.get_or_insert(name);
                    }
                    _ => verdict.flagged.push(name),
                }
            }
            verdict.results.push(GuardrailResult { name, mode: detector.mode, passed, findings });
        }
        verdict
    }

    /// Tool RBAC on an answer: with the kill switch every tool call is refused; a role listed in
    /// `allowed_by_role` may call only its tools; other roles are not restricted. Returns the
    /// first tool refused.
    pub fn refused_tool<'t>(&self, role: Option<&str>, tools: &[&'t str]) -> Option<&'t str> {
        if self.tools.kill_switch {
            return tools.first().copied();
        }
        let allowed = role.and_then(|r| self.tools.allowed_by_role.get(r))?;
        tools.iter().find(|tool| !allowed.iter().any(|a| a == *tool)).copied()
    }

    /// Human-readable name of a guardrail, for refusal messages.
    pub fn title(name: &str) -> &'static str {
        match name {
            "pii_detection" => "PII detection",
            "secrets_detection" => "secrets detection",
            _ => "a guardrail",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(pii: Mode, secrets: Mode) -> GuardrailPolicy {
        GuardrailPolicy {
            pii_detection: Detector { mode: pii },
            secrets_detection: Detector { mode: secrets },
            ..Default::default()
        }
    }

    #[test]
    fn modes_decide_flagged_or_blocked() {
        let text = "mail jane@example.com, key sk-proj-abcdefghijklmnopqrstuvwxyz012345";
        let v = policy(Mode::Monitor, Mode::Block).check(text);
        assert_eq!(v.flagged, vec!["pii_detection"]);
        assert_eq!(v.blocked_by, Some("secrets_detection"));
        assert!(v.results.iter().all(|r| !r.passed));
        let v = policy(Mode::Off, Mode::Off).check(text);
        assert!(v.results.is_empty() && v.flagged.is_empty() && v.blocked_by.is_none());
        let v = policy(Mode::Warn, Mode::Monitor).check("nothing to see");
        assert!(v.results.iter().all(|r| r.passed) && v.flagged.is_empty());
        assert!(!format!("{v:?}").contains("jane"), "findings never carry the text");
    }

    #[test]
    fn tool_rbac() {
        let mut p = GuardrailPolicy::default();
        p.tools.allowed_by_role.insert("contractor".into(), vec!["search".into()]);
        assert_eq!(p.refused_tool(Some("contractor"), &["search"]), None);
        assert_eq!(p.refused_tool(Some("contractor"), &["search", "shell"]), Some("shell"));
        assert_eq!(p.refused_tool(Some("admin"), &["shell"]), None, "roles without a list are not restricted");
        assert_eq!(p.refused_tool(None, &["shell"]), None);
        p.tools.kill_switch = true;
        assert_eq!(p.refused_tool(Some("admin"), &["search"]), Some("search"));
        assert_eq!(p.refused_tool(Some("admin"), &[]), None);
    }
}
