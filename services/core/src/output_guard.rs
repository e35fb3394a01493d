//! Guardrails on the data plane: the input is checked once before routing; the output once on
//! the answer actually returned (whichever target produced it), and for streams on the text as
//! it flows. A block is final: there is never "try another model until one passes" (seed §5),
//! since that would turn routing into a guardrail bypass. Tool RBAC is checked on the answer's
//! tool calls. Results carry kinds and counts, never the matched text.

use crate::exchange::Delta;
use crate::guardrails::{GuardrailPolicy, GuardrailResult, Verdict};

/// One `x_shield.guardrail_results` entry: a result with the phase it ran in. Serialised
/// straight into the answer (fields in the order they always had on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardrailRecord {
    pub findings: crate::detect::Findings,
    pub mode: crate::guardrails::Mode,
    pub name: &'static str,
    pub passed: bool,
    pub phase: &'static str,
}

/// A record as the derived shape would write it.
#[derive(serde::Serialize)]
struct RecordShape<'a> {
    findings: &'a crate::detect::Findings,
    mode: crate::guardrails::Mode,
    name: &'a str,
    passed: bool,
    phase: &'a str,
}

impl GuardrailRecord {
    fn shape(&self) -> RecordShape<'_> {
        RecordShape {
            findings: &self.findings,
            mode: self.mode,
            name: self.name,
            passed: self.passed,
            phase: self.phase,
        }
    }
}

/// Every record that found nothing, written once: nearly every answer carries only these, and
/// writing them field by field was a large part of serialising `x_shield` (issue 19).
static CLEAN_RECORDS: std::sync::LazyLock<Vec<(GuardrailRecord, Box<serde_json::value::RawValue>)>> =
    std::sync::LazyLock::new(|| {
        use crate::guardrails::{GUARDRAIL_NAMES, Mode};
        let mut records = Vec::new();
        for name in GUARDRAIL_NAMES {
            for mode in [Mode::Off, Mode::Monitor, Mode::Warn, Mode::Block] {
                for phase in ["input", "output"] {
                    let record = GuardrailRecord { findings: Default::default(), mode, name, passed: true, phase };
                    let written = serde_json::to_string(&record.shape()).ok();
                    if let Some(raw) = written.and_then(|json| serde_json::value::RawValue::from_string(json).ok()) {
                        records.push((record, raw));
                    }
                }
            }
        }
        records
    });

impl GuardrailRecord {
    /// The record written once, when it found nothing.
    fn clean(&self) -> Option<&'static serde_json::value::RawValue> {
        if !self.passed || !self.findings.is_empty() {
            return None;
        }
        let found =
            CLEAN_RECORDS.iter().find(|(r, _)| r.name == self.name && r.mode == self.mode && r.phase == self.phase);
        found.map(|(_, raw)| &**raw)
    }

    /// Appends the record's JSON, as its `Serialize` writes it: a clean record's bytes straight
    /// from the table, without serde_json's serializer in between (issue 33: `x_shield` is
    /// written on every answer).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self.clean() {
            Some(raw) => out.extend_from_slice(raw.get().as_bytes()),
            // Writing to a Vec cannot fail.
            None => {
                let _ = serde_json::to_writer(out, &self.shape());
            }
        }
    }
}

impl serde::Serialize for GuardrailRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.clean() {
            Some(raw) => raw.serialize(serializer),
            None => self.shape().serialize(serializer),
        }
    }
}

/// `x_shield.guardrail_results` entries of one phase (`input`, `output`).
pub fn results_json(phase: &'static str, results: &[GuardrailResult]) -> Vec<GuardrailRecord> {
    results
        .iter()
        .map(|r| GuardrailRecord { findings: r.findings.clone(), mode: r.mode, name: r.name, passed: r.passed, phase })
        .collect()
}

/// The refusal message for a blocking verdict.
pub fn blocked_reason(phase: &str, guardrail: &str) -> String {
    format!("Blocked by {} ({phase})", GuardrailPolicy::title(guardrail))
}

/// Checks a whole answer on what it reads of it, its text and the tools it calls: output
/// guardrails, then tool RBAC. `Err` is the refusal reason.
pub fn check_answer_parts(
    policy: &GuardrailPolicy,
    role: Option<&str>,
    text: &str,
    tools: &[String],
) -> (Verdict, Result<(), String>) {
    let verdict = policy.check(text);
    if let Some(name) = verdict.blocked_by {
        return (verdict, Err(blocked_reason("output", name)));
    }
    let tools: Vec<&str> = tools.iter().map(String::as_str).collect();
    let refused = policy.refused_tool(role, &tools).map(|tool| tool_refusal(policy, role, tool));
    (verdict, refused.map_or(Ok(()), Err))
}

pub fn tool_refusal(policy: &GuardrailPolicy, role: Option<&str>, tool: &str) -> String {
    if policy.tools.kill_switch {
        "Tool calls are disabled for this tenant".to_string()
    } else {
        format!("Tool `{tool}` is not allowed for role {}", role.unwrap_or("(none)"))
    }
}

/// Output guardrails over a stream, chunk by chunk. Detection runs on each new piece of text
/// together with the tail of what came before, so a finding split across two chunks is
/// still caught (the chunk that completes it is held back and the stream ends).
pub struct StreamGuard {
    policy: GuardrailPolicy,
    role: Option<String>,
    tail: String,
    pub results: Vec<GuardrailResult>,
}

/// Enough context for any finding the detectors know (keys, card numbers, IBANs, e-mails).
const TAIL_CHARS: usize = 256;

impl StreamGuard {
    pub fn new(policy: GuardrailPolicy, role: Option<String>) -> StreamGuard {
        StreamGuard { policy, role, tail: String::new(), results: Vec::new() }
    }

    /// `Err(reason)` when these deltas (one upstream event's) must not be forwarded and the
    /// stream must end.
    pub fn check(&mut self, deltas: &[Delta]) -> Result<(), String> {
        let tools: Vec<&str> = deltas
            .iter()
            .filter_map(|delta| match delta {
                Delta::ToolCall { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        if let Some(tool) = self.policy.refused_tool(self.role.as_deref(), &tools) {
            return Err(tool_refusal(&self.policy, self.role.as_deref(), tool));
        }
        let text: String = deltas.iter().filter_map(Delta::text).collect();
        if text.is_empty() {
            return Ok(());
        }
        let window = format!("{}{text}", self.tail);
        let verdict = self.policy.check(&window);
        let skip = window.len().saturating_sub(TAIL_CHARS);
        let start = window.char_indices().map(|(i, _)| i).find(|i| *i >= skip).unwrap_or(window.len());
        self.tail = window.get(start..).unwrap_or_default().to_string();
        for result in verdict.results.into_iter().filter(|r| !r.passed) {
            if !self.results.iter().any(|seen| seen.name == result.name) {
                self.results.push(result);
            }
        }
        match verdict.blocked_by {
            Some(name) => Err(blocked_reason("output", name)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn records_serialise_as_the_derived_shape_whether_written_once_or_field_by_field() {
        use crate::guardrails::{GUARDRAIL_NAMES, Mode};
        for name in GUARDRAIL_NAMES {
            for mode in [Mode::Off, Mode::Monitor, Mode::Warn, Mode::Block] {
                for phase in ["input", "output"] {
                    for found in [0, 2] {
                        let mut findings = crate::detect::Findings::new();
                        if found > 0 {
                            findings.insert("email", found);
                        }
                        let passed = found == 0;
                        let record = super::GuardrailRecord { findings, mode, name, passed, phase };
                        let expected = serde_json::to_string(&record.shape()).unwrap();
                        assert_eq!(serde_json::to_string(&record).unwrap(), expected);
                        assert_eq!(
                            serde_json::to_value(&record).unwrap(),
                            serde_json::from_str::<serde_json::Value>(&expected).unwrap()
                        );
                        assert_eq!(
                            serde_json::to_string(&vec![record.clone(), record]).unwrap(),
                            format!("[{expected},{expected}]")
                        );
                    }
                }
            }
        }
    }

    use super::*;
    use crate::guardrails::{Detector, Mode};

    #[test]
    fn a_secret_split_across_chunks_is_caught() {
        let policy = GuardrailPolicy { secrets_detection: Detector { mode: Mode::Block }, ..Default::default() };
        let mut guard = StreamGuard::new(policy, None);
        let chunk = |text: &str| [Delta::Text(text.into())];
        assert!(guard.check(&chunk("your key is sk-proj-abcdefghij")).is_ok());
        let blocked = guard.check(&chunk("klmnopqrstuvwxyz0123 enjoy")).unwrap_err();
        assert_eq!(blocked, "Blocked by secrets detection (output)");
        let mut guard = StreamGuard::new(
            GuardrailPolicy { secrets_detection: Detector { mode: Mode::Block }, ..Default::default() },
            None,
        );
        let thinking =
            [Delta::ThinkingStart, Delta::Thinking("the key is sk-proj-abcdefghijklmnopqrstuvwxyz0123".into())];
        assert!(guard.check(&thinking).is_err(), "thinking reaches some callers: it is guarded too");
    }

    #[test]
    fn tool_calls_in_answers_and_deltas() {
        let mut policy = GuardrailPolicy::default();
        policy.tools.allowed_by_role.insert("contractor".into(), vec!["search".into()]);
        let (_, result) = check_answer_parts(&policy, Some("contractor"), "", &["shell".to_string()]);
        assert_eq!(result.unwrap_err(), "Tool `shell` is not allowed for role contractor");
        let mut guard = StreamGuard::new(policy, Some("contractor".into()));
        let call = |name: &str| [Delta::ToolCall { index: 0, id: "t".into(), name: name.into() }];
        assert!(guard.check(&call("search")).is_ok());
        assert!(guard.check(&call("shell")).is_err());
    }
}
