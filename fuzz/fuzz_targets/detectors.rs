//! Every detector over arbitrary Unicode text, through the entry points the proxy calls: the
//! PII and secrets detectors alone (ungated), then a guardrail policy on the input (`check` on
//! a parsed request's prompt text, as chat.rs), on a whole answer (`check_answer_parts` as
//! chat.rs, on a typed answer's text) and on a streamed answer (`StreamGuard` delta by delta,
//! as relay.rs), with the records and refusal texts the proxy writes from
//! them. The input's first byte chooses the policy's modes (off, monitor, warn, block for each
//! detector: every pair is one byte flip away) and the stream's chunk size; the rest of it is
//! text too (bytes that are not UTF-8 read as U+FFFD). One policy per input, not all sixteen:
//! on non-ASCII text the detectors cost milliseconds each under the sanitizer, and running
//! every pair on every input cut the fuzzer to a few inputs a second.
//!
//! Nothing panics; the one-pass gate never hides a finding; a verdict agrees with its modes
//! and with the detectors run alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use shield_core::chat_request::ChatRequest;
use shield_core::detect;
use shield_core::exchange::{Answer, Block, Delta};
use shield_core::guardrails::{Detector, GuardrailPolicy, Mode, Verdict};
use shield_core::output_guard::{self, StreamGuard};

const MODES: [Mode; 4] = [Mode::Off, Mode::Monitor, Mode::Warn, Mode::Block];

/// At most this many stream chunks per input (a long text is cut into longer pieces).
const MAX_CHUNKS: usize = 32;

fuzz_target!(|data: &[u8]| {
    let Some(&choice) = data.first() else { return };
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    // The detectors alone, ungated.
    let pii = detect::pii(text);
    let secrets = detect::secrets(text);
    if !detect::may_find(text) {
        assert!(pii.is_empty() && secrets.is_empty(), "the gate passed over text a detector flags");
    }

    let policy = GuardrailPolicy {
        pii_detection: Detector { mode: MODES[usize::from(choice % 4)] },
        secrets_detection: Detector { mode: MODES[usize::from(choice / 4 % 4)] },
        ..Default::default()
    };
    let role = Some("user");

    // Input, as chat.rs: check the prompt text of the parsed request, record the results,
    // refuse on a block.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": text}]});
    let request = ChatRequest::parse(body.to_string().as_bytes()).expect("a JSON object with a model parses");
    let input = policy.check(&request.prompt_text());
    agrees(&input, &policy);
    records(&input, "input");

    // A whole answer, as chat.rs (its text and tools): the findings are the detectors' alone.
    let (verdict, allowed) = output_guard::check_answer_parts(&policy, role, text, &[]);
    agrees(&verdict, &policy);
    records(&verdict, "output");
    for result in &verdict.results {
        let alone = if result.name == "pii_detection" { &pii } else { &secrets };
        assert_eq!(&result.findings, alone, "{} through the policy and alone", result.name);
    }
    assert_eq!(allowed.is_err(), verdict.blocked_by.is_some(), "without tools only a block refuses");
    // The same answer as a provider adapter types it.
    let answer = Answer { blocks: vec![Block::Text(text.to_string())], ..Answer::default() };
    let typed = output_guard::check_answer_parts(&policy, role, &answer.text(), &answer.tool_names());
    assert_eq!(typed, (verdict, allowed), "an answer is its text");

    // A streamed answer, as relay.rs: chunk by chunk until one is refused.
    let mut guard = StreamGuard::new(policy, role.map(str::to_string));
    for piece in chunks(text, 1 + usize::from(choice / 16)) {
        if guard.check(&[Delta::Text(piece)]).is_err() {
            break;
        }
    }
    let streamed = output_guard::results_json("output", &guard.results);
    serde_json::to_string(&streamed).expect("records serialise");
});

/// `text` cut at character boundaries into pieces of `step` characters (1 to 16), longer when
/// that would make more than [`MAX_CHUNKS`].
fn chunks(text: &str, step: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let step = step.max(chars.len().div_ceil(MAX_CHUNKS)).max(1);
    chars.chunks(step).map(|piece| piece.iter().collect()).collect()
}

/// A verdict as its modes make it: one result per detector not off, a failed one flagged
/// (monitor, warn) or blocking (block).
fn agrees(verdict: &Verdict, policy: &GuardrailPolicy) {
    let on = [("pii_detection", policy.pii_detection.mode), ("secrets_detection", policy.secrets_detection.mode)];
    let on: Vec<(&str, Mode)> = on.into_iter().filter(|(_, mode)| *mode != Mode::Off).collect();
    let ran: Vec<(&str, Mode)> = verdict.results.iter().map(|r| (r.name, r.mode)).collect();
    assert_eq!(ran, on, "one result per detector not off");
    for result in &verdict.results {
        assert_eq!(result.passed, result.findings.is_empty());
        assert!(result.findings.values().all(|n| *n > 0), "a kind is listed only when found");
        let flagged = verdict.flagged.contains(&result.name);
        let blocked = result.mode == Mode::Block && !result.passed;
        assert_eq!(flagged, !result.passed && !blocked, "{} flagged", result.name);
    }
    let first_block = verdict.results.iter().find(|r| r.mode == Mode::Block && !r.passed).map(|r| r.name);
    assert_eq!(verdict.blocked_by, first_block);
}

/// The records and refusal text the proxy writes from a verdict.
fn records(verdict: &Verdict, phase: &'static str) {
    let records = output_guard::results_json(phase, &verdict.results);
    let written: Value = serde_json::to_value(&records).expect("records serialise");
    assert_eq!(written.as_array().map(Vec::len), Some(verdict.results.len()));
    if let Some(name) = verdict.blocked_by {
        assert!(output_guard::blocked_reason(phase, name).starts_with("Blocked by "));
    }
}
