//! The direct reading of a Messages body answers as the tree reading does, or not at all.

use super::*;
use crate::messages::request::{Headers, normalise, normalise_as_a_tree};
use proptest::prelude::*;
use shield_core::chat_request::ChatRequest;
use shield_core::remembered::ShapeReader;
use shield_core::target::Target;

/// JSON with repeated keys allowed (serde_json's own values cannot hold them).
#[derive(Debug, Clone)]
enum Json {
    Null,
    Bool(bool),
    Number(i32),
    Text(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(&n.to_string()),
            // Written with the escapes it holds (ones serde_json does not write, a surrogate
            // pair, a lone surrogate), as some clients do.
            Json::Text(t) if t.contains("\\u") || t.contains("\\/") => out.push_str(&format!("\"{t}\"")),
            Json::Text(t) => out.push_str(&serde_json::to_string(t).unwrap()),
            Json::Array(all) => {
                out.push('[');
                for (i, one) in all.iter().enumerate() {
                    out.push_str(if i > 0 { "," } else { "" });
                    one.write(out);
                }
                out.push(']');
            }
            Json::Object(fields) => {
                out.push('{');
                for (i, (key, value)) in fields.iter().enumerate() {
                    out.push_str(if i > 0 { ", " } else { "" });
                    if key.contains("\\u") {
                        // Written with an escape, as some clients do.
                        out.push_str(&format!("\"{key}\""));
                    } else {
                        out.push_str(&serde_json::to_string(key).unwrap());
                    }
                    out.push(':');
                    value.write(out);
                }
                out.push('}');
            }
        }
    }
}

const KEYS: [&str; 14] = [
    "type",
    "text",
    "role",
    "content",
    "id",
    "name",
    "input",
    "source",
    "media_type",
    "data",
    "url",
    "x",
    "cache_control",
    "typ\\u0065",
];
const TEXTS: [&str; 15] = [
    "text",
    "user",
    "assistant",
    "system",
    "tool_use",
    "image/png",
    "https://x.test/y.png",
    "a\nb",
    "é \"q\" \\",
    "",
    "{}",
    "AKIA",
    "x\\/y \\u00e9\\n\\\"q\\\"",
    "\\ud83d\\ude42 smile",
    "lone \\ud800",
];

fn json() -> BoxedStrategy<Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        (-3i32..3).prop_map(Json::Number),
        prop::sample::select(&TEXTS[..]).prop_map(|t| Json::Text(t.to_string())),
    ];
    leaf.prop_recursive(4, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Json::Array),
            prop::collection::vec((prop::sample::select(&KEYS[..]), inner), 0..5)
                .prop_map(|fields| Json::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
    .boxed()
}

/// An object with some of `fields` (each value as given, or now and then any JSON), now and
/// then a key repeated with another value.
fn object(fields: Vec<(&'static str, BoxedStrategy<Json>)>) -> BoxedStrategy<Json> {
    let each: Vec<_> = fields
        .into_iter()
        .map(|(key, value)| {
            prop::option::weighted(0.8, prop_oneof![12 => value, 1 => json()])
                .prop_map(move |value| value.map(|value| (key.to_string(), value)))
        })
        .collect();
    (each, prop::bool::weighted(0.1), json())
        .prop_map(|(fields, repeat, other)| {
            let mut fields: Vec<_> = fields.into_iter().flatten().collect();
            if let Some((key, _)) = fields.first().filter(|_| repeat).cloned() {
                fields.push((key, other));
            }
            Json::Object(fields)
        })
        .boxed()
}

fn one_of(texts: &'static [&'static str]) -> BoxedStrategy<Json> {
    prop::sample::select(texts).prop_map(|t| Json::Text(t.to_string())).boxed()
}

fn text() -> BoxedStrategy<Json> {
    one_of(&TEXTS)
}

fn array(of: BoxedStrategy<Json>) -> BoxedStrategy<Json> {
    prop_oneof![12 => prop::collection::vec(of, 0..4).prop_map(Json::Array), 1 => json()].boxed()
}

/// Mostly Messages-shaped: text, images, tool use and results, thinking, and now and then a
/// block only Anthropic reads.
fn messages() -> BoxedStrategy<Json> {
    const KINDS: [&str; 8] =
        ["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking", "document", "text"];
    let source = object(vec![
        ("type", one_of(&["base64", "url", "file"])),
        ("media_type", one_of(&["image/png", ""])),
        ("data", text()),
        ("url", text()),
    ]);
    let text_block = object(vec![("type", one_of(&["text"])), ("text", text())]);
    let block = object(vec![
        ("type", one_of(&KINDS)),
        ("text", text()),
        ("id", text()),
        ("name", text()),
        ("input", json()),
        ("tool_use_id", text()),
        ("content", prop_oneof![text(), array(text_block)].boxed()),
        ("is_error", any::<bool>().prop_map(Json::Bool).boxed()),
        ("thinking", text()),
        ("signature", text()),
        ("data", text()),
        ("source", source),
        ("cache_control", json()),
    ]);
    let message = object(vec![
        ("role", one_of(&["user", "assistant", "system", "tool"])),
        ("content", prop_oneof![text(), array(block)].boxed()),
    ]);
    prop_oneof![12 => prop::collection::vec(message, 1..6).prop_map(Json::Array), 1 => json()].boxed()
}

fn system() -> BoxedStrategy<Json> {
    let block = object(vec![("type", one_of(&["text"])), ("text", text()), ("cache_control", json())]);
    // Now and then a string among the blocks: no text there, though the same bytes as the whole
    // `system` are its text.
    let block = prop_oneof![8 => block, 1 => text()].boxed();
    prop_oneof![text(), array(block), Just(Json::Null).boxed()].boxed()
}

fn tools() -> BoxedStrategy<Json> {
    array(object(vec![
        ("type", one_of(&["custom", "web_search_20250305", "bash_20250124"])),
        ("name", text()),
        ("description", text()),
        ("input_schema", json()),
    ]))
}

fn target(flavor: &str) -> Target {
    serde_json::from_value(serde_json::json!({"base_url": "https://up.test/v1", "model": "m-up", "flavor": flavor}))
        .unwrap()
}

fn headers() -> Headers {
    Headers { beta: Some("b1".into()), version: Some("2023-06-01".into()) }
}

/// What a reading decided, as far as anything after it can tell.
fn seen(request: &ChatRequest) -> impl PartialEq + std::fmt::Debug {
    let origin = request.anthropic().unwrap();
    (
        request.model.clone(),
        request.exchange.clone(),
        origin.full().into_owned(),
        (origin.requires.clone(), origin.unmapped.clone(), origin.system_messages),
        (origin.beta.clone(), origin.version.clone(), origin.verbatim.is_some()),
        request.prompt_text(),
    )
}

/// The body each flavor's target is sent, as JSON.
fn upstream(request: &ChatRequest) -> Vec<Value> {
    ["anthropic", "openai", "gemini"]
        .into_iter()
        .map(|flavor| {
            let target = target(flavor);
            let body = crate::provider::for_target(&target).body(request, &target, true).to_vec();
            serde_json::from_slice(&body).unwrap()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Read directly or as a tree, a body gives the same typed request, the same fields, the
    /// same error, and the same upstream body for every flavor.
    #[test]
    fn reads_as_the_tree_does(
        messages in messages(), system in prop::option::of(system()), tools in prop::option::of(tools()),
        pretty in any::<bool>(), stream in any::<bool>()
    ) {
        let mut body = String::from(if pretty { "{ \"model\": \"team\",\n \"max_tokens\": 64, " } else { "{\"model\":\"team\",\"max_tokens\":64," });
        body.push_str("\"messages\": ");
        messages.write(&mut body);
        if let Some(system) = system {
            body.push_str(", \"system\" :");
            system.write(&mut body);
        }
        if let Some(tools) = tools {
            body.push_str(", \"tools\" :");
            tools.write(&mut body);
        }
        if stream {
            body.push_str(", \"stream\": true");
        }
        body.push_str(&format!(", \"pad\": \"{}\" }}", "p".repeat(shield_core::verbatim::WORTH_IT)));

        let direct = normalise(&bytes::Bytes::from(body.clone()), headers(), false);
        let tree = normalise_as_a_tree(&bytes::Bytes::from(body.clone()), headers(), false);
        match (&direct, &tree) {
            (Ok(direct), Ok(tree)) => {
                prop_assert_eq!(seen(direct), seen(tree));
                prop_assert_eq!(upstream(direct), upstream(tree));
            }
            (direct, tree) => prop_assert_eq!(direct.as_ref().err(), tree.as_ref().err()),
        }
        // With the tenant's memo, twice (each message read and remembered, then known by its
        // bytes and not read): the same request or the same error; the same characters, turns
        // and guardrail units before anything types the history.
        let memo = shield_core::verdicts::Verdicts::default().of("tenant");
        let shared = bytes::Bytes::from(body.clone());
        for turn in 0..2 {
            let again = crate::messages::request::normalise_remembering(&shared, headers(), false, Some(&memo));
            match (&again, &direct) {
                (Ok(again), Ok(direct)) => {
                    let (known, typed) = (&again.exchange, &direct.exchange);
                    prop_assert_eq!(known.prompt_chars(), typed.prompt_chars());
                    prop_assert_eq!(known.messages.turns(), typed.messages.turns());
                    prop_assert_eq!(known.tools.len(), typed.tools.len());
                    let units = |request| {
                        shield_core::verdicts::units(request).iter().map(|unit| memo.text_hash(unit)).collect::<Vec<_>>()
                    };
                    prop_assert_eq!(units(known), units(typed));
                    let by_spans = read(body.as_bytes(), None).is_some();
                    prop_assert!(!by_spans || known.messages.sent().is_some(), "read directly, not by spans (turn {})", turn);
                    if by_spans && turn == 1 {
                        let target = target("anthropic");
                        crate::provider::for_target(&target).body(again, &target, true);
                        prop_assert!(!known.messages.is_typed(), "the same-shape relay typed the history");
                        prop_assert!(known.tools.sent().is_none() || !known.tools.is_typed(), "or the tools");
                        prop_assert!(known.system.sent().is_none() || !known.system.is_typed(), "or the system prompt");
                    }
                    prop_assert_eq!(seen(again), seen(direct));
                    prop_assert_eq!(upstream(again), upstream(direct));
                }
                (again, direct) => prop_assert_eq!(again.as_ref().err(), direct.as_ref().err()),
            }
        }
        if let Some(read) = read(body.as_bytes(), None) {
            prop_assert!(tree.is_ok(), "read directly what a tree refuses: {:?}", tree.err());
            prop_assert!(!read.fields.contains_key("messages"));
        }
    }
}

/// One message of a Messages session (user text, an assistant's text and tool call, its
/// result), now and then with a secret or an address, so that the guardrails' units tell one
/// message from another. The first is the session's own (sessions that begin alike are the
/// chat property test's, `shield_core::remembered`).
fn session_message(session: usize, i: usize, variant: u8) -> Value {
    match i % 3 {
        0 => serde_json::json!({"role": "user", "content": if variant % 5 == 4 {
            format!("turn {i}: write to jane@example.com")
        } else {
            format!("session {session} turn {i} v{variant}: fix the build")
        }}),
        1 => serde_json::json!({"role": "assistant", "content": [{"type": "text", "text": format!("reading {i}")},
            {"type": "tool_use", "id": format!("t{i}"), "name": "Bash", "input": {"command": "ls"}}]}),
        _ => {
            serde_json::json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("t{}", i - 1),
            "content": if variant % 4 == 3 { format!("key sk-proj-abcdefghijklmnopqrstuvwxyz0{i:05}") } else { format!("out {i} v{variant}") }}]})
        }
    }
}

/// System prompts a session may send, in each form: a string, blocks (one with an address),
/// a block with a secret, none.
const SESSION_SYSTEMS: [&str; 4] = [
    r#""You are Claude Code.""#,
    r#"[{"type":"text","text":"You are Claude Code."},{"type":"text","text":"Mail jane@example.com","cache_control":{"type":"ephemeral"}}]"#,
    r#"[{"type":"text","text":"key sk-proj-abcdefghijklmnopqrstuvwxyz012345"}]"#,
    "null",
];

/// A step of a tenant's Messages traffic: a session's next turn (its history and `added`
/// messages more, with system prompt `system` under policy `policy`), or its history with
/// message `edit` changed.
#[derive(Debug, Clone)]
enum SessionStep {
    Turn { session: usize, added: usize, system: usize, policy: usize },
    Edit { session: usize, edit: usize },
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever a tenant's Messages sessions send, turn after turn (histories growing and
    /// edited, system prompts and detectors changing), each body read with the memo (its
    /// history found as the prefix its last turn left, the new messages after it) reads as it
    /// does alone, and is judged as a fresh scan judges it, without typing the history.
    #[test]
    fn a_messages_session_reads_and_is_judged_as_each_turn_alone(
        steps in prop::collection::vec(prop_oneof![
            6 => (0..3usize, 0..3usize, 0..4usize, 0..4usize)
                .prop_map(|(session, added, system, policy)| SessionStep::Turn { session, added, system, policy }),
            1 => (0..3usize, any::<usize>()).prop_map(|(session, edit)| SessionStep::Edit { session, edit }),
        ], 1..30),
    ) {
        use shield_core::guardrails::{Detector, GuardrailPolicy, Mode};
        let policies = [(Mode::Monitor, Mode::Monitor), (Mode::Off, Mode::Block), (Mode::Block, Mode::Off), (Mode::Warn, Mode::Monitor)]
            .map(|(pii, secrets)| GuardrailPolicy {
                pii_detection: Detector { mode: pii },
                secrets_detection: Detector { mode: secrets },
                ..Default::default()
            });
        let memo = shield_core::verdicts::Verdicts::default().of("tenant");
        let mut sessions: Vec<(Vec<Value>, usize, bool)> = vec![(Vec::new(), 0, false); 3];
        let pad = "p".repeat(shield_core::verbatim::WORTH_IT);
        let mut policy = &policies[0];
        for (n, step) in steps.iter().enumerate() {
            let (session, extends) = match step {
                SessionStep::Turn { session, added, system, policy: which } => {
                    let (history, kept_system, _) = &mut sessions[*session];
                    for _ in 0..=*added {
                        let i = history.len();
                        history.push(session_message(*session, i, (n % 7) as u8));
                    }
                    *kept_system = *system;
                    policy = &policies[*which];
                    (*session, sessions[*session].2)
                }
                SessionStep::Edit { session, edit } => {
                    let history = &mut sessions[*session].0;
                    if !history.is_empty() {
                        let at = edit % history.len();
                        history[at] = session_message(*session, at, 100 + (n % 50) as u8);
                    }
                    (*session, false)
                }
            };
            let (history, system, _) = &sessions[session];
            if history.is_empty() {
                continue;
            }
            let messages = Value::Array(history.clone());
            let sent = bytes::Bytes::from(format!(
                r#"{{"model":"team","max_tokens":64,"system":{},"messages":{messages},"pad":"{pad}"}}"#,
                SESSION_SYSTEMS[*system]
            ));
            sessions[session].2 = true;
            let typed = normalise(&sent, headers(), false).unwrap();
            let known = crate::messages::request::normalise_remembering(&sent, headers(), false, Some(&memo)).unwrap();
            let heads = known.exchange.messages.sent().and_then(|sent| sent.known.heads);
            prop_assert!(heads.is_some(), "read by its spans");
            prop_assert!(!extends || heads.and_then(|heads| heads.matched).is_some(), "step {}: the last turn's prefix found", n);
            let (found, fresh) = (policy.check_request(&known.exchange, Some(&memo)), policy.check_request(&typed.exchange, None));
            prop_assert_eq!(found.blocked_by, fresh.blocked_by);
            prop_assert_eq!(format!("{:?}", found.results), format!("{:?}", fresh.results), "step {}", n);
            prop_assert!(!known.exchange.messages.is_typed(), "judged without typing the history");
            prop_assert_eq!(seen(&known), seen(&typed));
        }
    }
}

fn padded(mut body: Value) -> String {
    body["pad"] = Value::String("p".repeat(shield_core::verbatim::WORTH_IT));
    body.to_string()
}

fn agent_turn() -> Value {
    serde_json::json!({"model": "team", "max_tokens": 64, "stream": true,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "Bash", "description": "Run", "input_schema": {"type": "object"}}],
    "messages": [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a.rs"}]}]},
    ]})
}

#[test]
fn a_common_agent_turn_is_read_directly() {
    let body = padded(agent_turn());
    let read = read(body.as_bytes(), None).expect("read directly");
    assert_eq!(read.messages.len(), 3);
    assert!(!read.fields.contains_key("messages") && !read.fields.contains_key("tools"));
    let request = normalise(&bytes::Bytes::from(body.clone()), headers(), false).unwrap();
    let origin = request.anthropic().unwrap();
    assert!(!origin.original.contains_key("messages"), "no tree of the history kept");
    assert_eq!(origin.full().get("messages"), serde_json::from_str::<Value>(&body).unwrap().get("messages"));
}

/// An agent's turn resent with thinking on: whether its last assistant turn breaks thinking
/// (tool calls without a thinking block first: `thinking` is dropped) is told from what is known
/// of the turns, as from the typed ones, and the same-shape body is relayed without typing the
/// history.
#[test]
fn thinking_is_judged_from_known_turns() {
    let memo = shield_core::verdicts::Verdicts::default().of("tenant");
    for starts_thinking in [true, false] {
        let mut turn = agent_turn();
        turn["thinking"] = serde_json::json!({"type": "enabled", "budget_tokens": 1024});
        if !starts_thinking {
            turn["messages"][1]["content"].as_array_mut().unwrap().remove(0);
        }
        let body = bytes::Bytes::from(padded(turn));
        let target = target("anthropic");
        let typed = normalise(&body, headers(), false).unwrap();
        let typed_body: Value =
            serde_json::from_slice(&crate::provider::for_target(&target).body(&typed, &target, true).to_vec()).unwrap();
        assert_eq!(typed_body.get("thinking").is_some(), starts_thinking);
        for _ in 0..2 {
            let known = crate::messages::request::normalise_remembering(&body, headers(), false, Some(&memo)).unwrap();
            let sent = crate::provider::for_target(&target).body(&known, &target, true).to_vec();
            assert_eq!(serde_json::from_slice::<Value>(&sent).unwrap(), typed_body);
            assert!(known.exchange.messages.sent().is_some() && !known.exchange.messages.is_typed());
        }
    }
}

/// The same message bytes are another message in another shape (a `tool_result` block is a
/// tool's result to Messages, an unknown part to Chat Completions): what one shape's reading
/// remembered is never taken for the other's, so the secret in the result is found.
#[test]
fn a_message_known_in_one_shape_is_read_again_in_the_other() {
    use shield_core::guardrails::{Detector, GuardrailPolicy, Mode};
    let memo = shield_core::verdicts::Verdicts::default().of("tenant");
    let message = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"key sk-proj-abcdefghijklmnopqrstuvwxyz012345"}]}"#;
    let pad = "p".repeat(shield_core::verbatim::WORTH_IT);
    let chat = format!(r#"{{"model":"team","messages":[{message}],"pad":"{pad}"}}"#);
    let messages = format!(r#"{{"model":"team","max_tokens":64,"messages":[{message}],"pad":"{pad}"}}"#);
    let policy = GuardrailPolicy { secrets_detection: Detector { mode: Mode::Block }, ..Default::default() };
    let chat = ChatRequest::parse_remembering(&bytes::Bytes::from(chat), Some(&memo)).unwrap();
    assert!(chat.exchange.messages.sent().is_some());
    assert_eq!(policy.check_request(&chat.exchange, Some(&memo)).blocked_by, None, "an unknown part: no text");
    let body = bytes::Bytes::from(messages);
    let known = crate::messages::request::normalise_remembering(&body, headers(), false, Some(&memo)).unwrap();
    assert!(known.exchange.messages.sent().is_some());
    assert_eq!(policy.check_request(&known.exchange, Some(&memo)).blocked_by, Some("secrets_detection"));
    assert_eq!(known.exchange.prompt_chars(), normalise(&body, headers(), false).unwrap().exchange.prompt_chars());
}

/// The same bytes are a system prompt's text as the whole `system`, and a block with no text
/// among its blocks: remembered as one, never taken for the other. A system prompt known by its
/// bytes is judged as the typed one (the secret in it is found on the second turn too, and
/// after a policy change that rescans it) and relayed without being typed.
#[test]
fn a_system_prompt_is_known_by_its_bytes_as_what_it_was_sent_as() {
    use shield_core::guardrails::{Detector, GuardrailPolicy, Mode};
    let memo = shield_core::verdicts::Verdicts::default().of("tenant");
    let said = r#""Be brief. sk-proj-abcdefghijklmnopqrstuvwxyz012345""#;
    let pad = "p".repeat(shield_core::verbatim::WORTH_IT);
    let body = |system: &str| {
        bytes::Bytes::from(format!(
            r#"{{"model":"team","max_tokens":64,"system":{system},"messages":[{{"role":"user","content":"hi"}}],"pad":"{pad}"}}"#
        ))
    };
    let monitor = GuardrailPolicy { secrets_detection: Detector { mode: Mode::Monitor }, ..Default::default() };
    let block = GuardrailPolicy { secrets_detection: Detector { mode: Mode::Block }, ..Default::default() };
    let pii = GuardrailPolicy { pii_detection: Detector { mode: Mode::Block }, ..block.clone() };
    let forms = [(said.to_string(), 1), (format!("[{said}]"), 0), (format!(r#"[{{"type":"text","text":{said}}}]"#), 1)];
    for (form, (system, texts)) in forms.into_iter().enumerate() {
        let sent = body(&system);
        let typed = normalise(&sent, headers(), false).unwrap();
        assert_eq!(typed.exchange.system.len(), texts, "{system}");
        for (turn, policy) in [&monitor, &block, &pii, &block].into_iter().enumerate() {
            let known = crate::messages::request::normalise_remembering(&sent, headers(), false, Some(&memo)).unwrap();
            assert!(known.exchange.system.sent().is_some(), "{system}: known by its spans");
            assert_eq!(known.exchange.system.len(), texts, "{system}");
            assert_eq!(known.exchange.prompt_chars(), typed.exchange.prompt_chars(), "{system}");
            let target = target("anthropic");
            crate::provider::for_target(&target).body(&known, &target, true);
            assert!(!known.exchange.system.is_typed(), "{system}: relayed without typing the system prompt");
            let (found, expected) =
                (policy.check_request(&known.exchange, Some(&memo)), policy.check_request(&typed.exchange, None));
            assert_eq!(found.blocked_by, expected.blocked_by, "{system}");
            assert_eq!(format!("{:?}", found.results), format!("{:?}", expected.results), "{system}");
            // Its text is read only to be scanned: the first time under each set of detectors
            // (turns 0 and 2), and never again in another form (its verdict is the text's).
            let scanned = form == 0 && (turn == 0 || turn == 2);
            assert_eq!(known.exchange.system.is_typed(), scanned, "{system}, turn {turn}");
            assert_eq!(seen(&known), seen(&typed), "{system}");
        }
    }
}

/// Each of these is read as a tree: the direct reading declines what only a tree types, and
/// what the tree reading refuses with its own words.
#[test]
fn what_only_a_tree_reads_is_read_as_a_tree() {
    use serde_json::json;
    let cases: [(&str, &str, Value); 9] = [
        (
            "a document block",
            "/messages/0/content",
            json!([{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "AKIA"}}]),
        ),
        (
            "an image by file id",
            "/messages/0/content",
            json!([{"type": "image", "source": {"type": "file", "file_id": "f"}}]),
        ),
        ("a block without a type", "/messages/0/content", json!([{"text": "x"}])),
        ("a role no API has", "/messages/0/role", json!("tool")),
        ("content missing", "/messages/0", json!({"role": "user"})),
        ("no messages", "/messages", json!([])),
        ("messages not an array", "/messages", json!("hi")),
        ("system of another type", "/system", json!(5)),
        ("the raw-value token", "/messages/0/content", json!({"$serde_json::private::RawValue": "\"x\""})),
    ];
    for (case, at, value) in cases {
        let mut body = agent_turn();
        *body.pointer_mut(at).unwrap() = value;
        let body = padded(body);
        assert!(read(body.as_bytes(), None).is_none(), "{case}: read directly");
        let tree = normalise_as_a_tree(&bytes::Bytes::from(body.clone()), headers(), false);
        let direct = normalise(&bytes::Bytes::from(body), headers(), false);
        assert_eq!(direct.as_ref().err(), tree.as_ref().err(), "{case}");
        if let (Ok(direct), Ok(tree)) = (direct, tree) {
            assert_eq!(seen(&direct), seen(&tree), "{case}");
        }
    }
}

#[test]
fn a_raw_value_key_reads_as_a_serde_json_server_reads_it() {
    let mut body = agent_turn();
    body["messages"][0] =
        serde_json::json!({"$serde_json::private::RawValue": r#"{"role": "user", "content": "AKIA in hiding"}"#});
    let request = normalise(&bytes::Bytes::from(padded(body)), headers(), false).unwrap();
    assert!(request.prompt_text().contains("AKIA in hiding"), "the guardrails read what a serde_json server would");
}

#[test]
fn nesting_past_the_recursion_limit_is_refused_as_the_tree_refuses_it() {
    // A tool's description (kept as sent when it is a string, issue 33), at every depth about
    // the limit: read as the tree reads it, or refused as the tree refuses it.
    for depth in 120..=130 {
        let mut body = agent_turn();
        body["tools"][0]["description"] = Value::from(1);
        let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let body = padded(body).replacen("\"description\":1", &format!("\"description\":{deep}"), 1);
        let tree = normalise_as_a_tree(&bytes::Bytes::from(body.clone()), headers(), false);
        let direct = normalise(&bytes::Bytes::from(body), headers(), false);
        assert_eq!(direct.is_ok(), tree.is_ok(), "description at depth {depth}");
        assert_eq!(direct.as_ref().err(), tree.as_ref().err(), "description at depth {depth}");
    }
    for depth in [100, 100_000] {
        let nested: Value = serde_json::from_str("1").unwrap();
        let mut body = agent_turn();
        body["messages"][1]["content"][1]["input"] = nested;
        let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let body = padded(body).replacen("\"input\":1", &format!("\"input\":{deep}"), 1);
        let tree = normalise_as_a_tree(&bytes::Bytes::from(body.clone()), headers(), false);
        let direct = normalise(&bytes::Bytes::from(body), headers(), false);
        assert_eq!(direct.is_ok(), depth == 100, "depth {depth}");
        assert_eq!(direct.as_ref().err(), tree.as_ref().err(), "depth {depth}");
        if let Err(refused) = direct {
            assert!(refused.0.contains("recursion limit"), "{refused}");
        }
    }
}

/// A tool's `input_schema` is kept as its text, never a tree (issue 33); what a tree reading
/// refuses in it (a lone surrogate, a number out of range, nesting past the recursion limit
/// counted from the body's root) is still refused, with the tree's words, and what it accepts
/// reaches the typed request as sent.
#[test]
fn a_schema_kept_as_text_is_refused_where_a_tree_refuses_it() {
    let with_schema = |schema: &str| {
        let mut body = agent_turn();
        body["tools"][0]["input_schema"] = Value::from("SCHEMA");
        padded(body).replacen("\"SCHEMA\"", schema, 1)
    };
    let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    let mut cases: Vec<(String, String)> = vec![
        ("a lone surrogate".into(), r#"{"type": "object", "description": "\ud800"}"#.into()),
        ("a number out of range".into(), r#"{"type": "object", "maximum": 1e999}"#.into()),
        ("the raw-value token".into(), r#"{"$serde_json::private::RawValue": "{}"}"#.into()),
    ];
    // Around the limit: the tree refuses 125 levels here (three enclose the schema).
    for depth in 120..=128 {
        cases.push((format!("nested {depth}"), nested(depth)));
    }
    let mut accepted = 0;
    for (case, schema) in &cases {
        let body = with_schema(schema);
        let tree = normalise_as_a_tree(&bytes::Bytes::from(body.clone()), headers(), false);
        let direct = normalise(&bytes::Bytes::from(body.clone()), headers(), false);
        assert_eq!(direct.as_ref().err(), tree.as_ref().err(), "{case}");
        if let (Ok(direct), Ok(tree)) = (direct, tree) {
            accepted += 1;
            // The tree reads the raw-value token as the JSON in its string: so does the direct
            // reading, by handing such a body to the tree.
            assert_eq!(read(body.as_bytes(), None).is_some(), !case.contains("raw-value"), "{case}: read directly");
            assert_eq!(seen(&direct), seen(&tree), "{case}");
            // As bytes: nested this deep in another flavor's body, a schema is past the limit
            // there (an upstream refuses it, whichever reading made it).
            let bodies = |request: &ChatRequest| {
                ["anthropic", "openai", "gemini"].map(|flavor| {
                    crate::provider::for_target(&target(flavor)).body(request, &target(flavor), true).to_vec()
                })
            };
            assert_eq!(bodies(&direct), bodies(&tree), "{case}");
        } else {
            assert!(read(body.as_bytes(), None).is_none(), "{case}: read directly");
        }
    }
    assert_eq!(accepted, 6, "the raw-value token and nesting 120 to 124 are accepted, and only those");
    let schema = r#"{"type": "object", "properties": {"path": {"type": "string", "description": "a \"quoted\" π"}}}"#;
    let request = normalise(&bytes::Bytes::from(with_schema(schema)), headers(), false).unwrap();
    assert_eq!(request.exchange.tools[0].schema.text(), schema, "kept as sent");
}

#[test]
fn a_malformed_large_body_is_refused_with_serde_json_s_reason() {
    let body = padded(agent_turn());
    let broken = &body[..body.len() - 1];
    let Err(refused) = normalise(&bytes::Bytes::from(broken.to_string()), headers(), false) else { panic!("accepted") };
    assert!(refused.0.starts_with("malformed JSON body: "), "{refused}");
}

/// Texts read directly (message text, a tool's result, the system prompt, a tool's description)
/// are written into a converted body as they came (issue 33: not unescaped and escaped again),
/// escapes serde_json does not write included, and mean what the tree reading's texts mean; a
/// surrogate pair is read as serde_json reads it.
#[test]
fn a_converted_history_carries_its_texts_as_sent() {
    let mut body = agent_turn();
    body["messages"][0]["content"] =
        serde_json::json!([{"type": "text", "text": "TEXT"}, {"type": "text", "text": "PAIR"}]);
    body["messages"][2]["content"][0]["content"] = serde_json::json!("RESULT");
    body["system"][0]["text"] = serde_json::json!("SYSTEM");
    body["tools"][0]["description"] = serde_json::json!("DESCRIPTION");
    let body = padded(body)
        .replace(r#""SYSTEM""#, r#""You are\nClaude \u0043ode""#)
        .replace(r#""DESCRIPTION""#, r#""Runs \"a\"\tcommand""#)
        .replace(r#""TEXT""#, r#""fix \/src\/a.rs\n\u00e9""#)
        .replace(r#""PAIR""#, r#""\ud83d\ude42 \/""#)
        .replace(r#""RESULT""#, r#""fn main() {\n\t\"hi\"\n}""#);
    let direct = normalise(&bytes::Bytes::from(body.clone()), headers(), false).unwrap();
    let tree = normalise_as_a_tree(&bytes::Bytes::from(body.clone()), headers(), false).unwrap();
    assert_eq!(upstream(&direct), upstream(&tree));
    let target = target("openai");
    let converted = crate::provider::for_target(&target).body(&direct, &target, true).to_vec();
    let converted = String::from_utf8(converted).unwrap();
    assert!(converted.contains(r#""content":"fn main() {\n\t\"hi\"\n}""#), "{converted}");
    assert!(converted.contains(r#""content":"fix \/src\/a.rs\n\u00e9\n🙂 /""#), "{converted}");
    assert!(converted.contains(r#"{"role":"system","content":"You are\nClaude \u0043ode"}"#), "{converted}");
    assert!(converted.contains(r#""description":"Runs \"a\"\tcommand""#), "{converted}");
    let Part::Text(text) = &direct.exchange.messages[0].content[0] else { panic!("a text") };
    assert_eq!(text.as_str(), "fix /src/a.rs\né");
    assert_eq!(direct.exchange.prompt_chars(), tree.exchange.prompt_chars());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A message the first reading typed is typed alike when it is typed again by a scan, or
    /// left to that reading (`None`), never typed otherwise.
    #[test]
    fn a_message_read_before_types_as_its_first_reading(history in messages()) {
        let Json::Array(all) = history else { return Ok(()) };
        for one in all {
            let mut span = String::new();
            one.write(&mut span);
            let Some(first) = MessagesShape::message(span.as_bytes()) else { continue };
            if let Some(again) = read_before::message(span.as_bytes()) {
                prop_assert_eq!(&again, &first, "{}", span);
                prop_assert_eq!(format!("{again:?}"), format!("{first:?}"), "{}", span);
            }
            prop_assert_eq!(MessagesShape::message_read_before(span.as_bytes()), Some(first));
        }
    }
}

/// Claude Code's messages (text, thinking, tool use, results as a string or as blocks, a
/// system reminder) are typed by the scan, as the first reading types them.
#[test]
fn an_agent_s_messages_read_before_are_typed_by_a_scan() {
    let mut messages = agent_turn()["messages"].as_array().unwrap().clone();
    messages.push(serde_json::json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t2", "content": "line 1\nline \"2\"\n\tend", "is_error": true},
        {"type": "text", "text": "go on \u{e9} \\u00e9", "cache_control": {"type": "ephemeral"}}]}));
    messages.push(serde_json::json!({"role": "system", "content": "<system-reminder>\nnote\n</system-reminder>"}));
    messages.push(serde_json::json!({"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"},
        {"type": "text", "text": ""}, {"type": "tool_use", "id": "t3", "name": "Read", "input": {"b": [1, 2.5], "a": null}}]}));
    for message in &messages {
        let span = message.to_string();
        let first = MessagesShape::message(span.as_bytes()).expect("read");
        assert_eq!(read_before::message(span.as_bytes()).as_ref(), Some(&first), "{span}");
    }
    // The tool result's text is kept as sent: written out again with its escapes as they came.
    let span = messages[3].to_string();
    let Some(Message { content, .. }) = read_before::message(span.as_bytes()) else { panic!("typed") };
    let Part::ToolResult { content, is_error: true, .. } = &content[0] else { panic!("{content:?}") };
    let mut out = Vec::new();
    content.push_json(&mut out);
    assert_eq!(out, br#""line 1\nline \"2\"\n\tend""#);
    // An image is typed by the scan too; what the first reading keeps opaque (a document) is
    // left to it.
    let image = serde_json::json!({"role": "user", "content": [{"type": "image",
        "source": {"type": "url", "url": "https://x.test/a.png"}}]});
    let first = MessagesShape::message(image.to_string().as_bytes()).expect("read");
    assert_eq!(read_before::message(image.to_string().as_bytes()), Some(first));
    let document = serde_json::json!({"role": "user", "content": [{"type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]});
    assert!(read_before::message(document.to_string().as_bytes()).is_none());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A tool read before is typed by a scan as it was typed then (its schema's text as sent),
    /// or left to that reading.
    #[test]
    fn a_tool_read_before_types_as_its_first_reading(tools in tools()) {
        let Json::Array(all) = tools else { return Ok(()) };
        for one in all {
            let mut span = String::new();
            one.write(&mut span);
            // Only a tool that reading typed is typed again.
            let Some(first) = tool_as_read_first(span.as_bytes()) else { continue };
            if let Some(again) = read_before::tool(span.as_bytes()) {
                prop_assert_eq!((&again.name, &again.description), (&first.name, &first.description), "{}", span);
                prop_assert_eq!(again.schema.text(), first.schema.text(), "{}", span);
            }
            let by_trait = MessagesShape::tool(span.as_bytes()).map(|tool| tool.schema.text().to_string());
            prop_assert_eq!(by_trait, Some(first.schema.text().to_string()));
        }
    }
}

proptest! {
    /// A system prompt's block read before is typed by a scan as it was typed then, or left to
    /// that reading.
    #[test]
    fn a_system_block_read_before_types_as_its_first_reading(system in system()) {
        let Json::Array(all) = system else { return Ok(()) };
        for one in all {
            let mut span = String::new();
            one.write(&mut span);
            let Some(first) = MessagesShape::system_block(span.as_bytes()) else { continue };
            if let Some(again) = read_before::system_block(span.as_bytes()) {
                prop_assert_eq!(&again, &first, "{}", span);
            }
            prop_assert_eq!(MessagesShape::system_block_read_before(span.as_bytes()), Some(first));
        }
    }
}
