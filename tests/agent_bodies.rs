//! Agent-sized bodies (issue 33): a coding agent's 150 KB request reaches a target of its own
//! shape as the caller wrote it — every field but `model` (and what the target sets) byte for
//! byte, numbers and escapes as sent — on `/v1/chat/completions` and `/v1/messages`, streamed
//! and not; a body resumed after a broken stream is written afresh (its text as sent no longer
//! stands for it); the input guardrails still judge the whole history.

use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_e2e::stack::Stack;

/// About `size` bytes of conversation: tool calls and their long results, with escapes and
/// non-ASCII text, and numbers written in ways a re-serialiser would change.
fn history(size: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "user", "content": "Fix the failing test in src/lib.rs, please."})];
    let mut turn = 0;
    while serde_json::to_string(&messages).unwrap().len() < size {
        turn += 1;
        messages.push(json!({"role": "assistant", "content": format!("Reading file {turn}.")}));
        let file = format!("fn f{turn}() -> &'static str {{\n\t\"caf\u{e9} \\\\ {turn}\"\n}}\n").repeat(40);
        messages.push(json!({"role": "user", "content": file}));
    }
    messages
}

/// `POST path` with `body` as these exact bytes.
async fn post_raw(stack: &Stack, key: &str, path: &str, body: String) -> (StatusCode, String) {
    let response = stack
        .client
        .post(format!("http://{}{path}", stack.proxy))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    stack.evidence.response(&format!("POST proxy {path}"), status, &headers, &text);
    (status, text)
}

/// The raw body the mock received last for target `id`.
async fn received_text(stack: &Stack, id: &str) -> String {
    let received = stack.received(id).await;
    received.last().unwrap()["body"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_agents_body_reaches_a_same_shape_target_as_written() {
    let stack = Stack::start().await;
    let (status, body) = stack
        .admin_call(
            reqwest::Method::PUT,
            "/v1/tenant/me/guardrails",
            Some(json!({"pii_detection": {"mode": "monitor"}, "secrets_detection": {"mode": "monitor"}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    stack.mock_target("oai", "", json!({})).await;
    stack.mock_target("claude", "", json!({"flavor": "anthropic", "extra_body": {"top_k": 7}})).await;
    stack.put_route("agent", json!({"targets": ["oai"]})).await;
    stack.put_route("agent-claude", json!({"targets": ["claude"]})).await;
    let (key, _) = stack.key(None).await;

    // Chat Completions, 150 KB, with its numbers spelled as a re-serialiser would not.
    let messages = serde_json::to_string(&history(150_000)).unwrap();
    let sent = format!(
        r#"{{"model": "agent", "temperature": 1e0, "seed": 12345678901234567890123, "x_shield": {{"note": 1}},
            "messages": {messages}, "max_tokens": 64}}"#
    );
    assert!(sent.len() > 150_000);
    let (status, answer) = post_raw(&stack, &key, "/v1/chat/completions", sent.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let got = received_text(&stack, "oai").await;
    assert!(got.contains(&format!(r#""messages":{messages}"#)), "the history byte for byte");
    assert!(got.contains(r#""temperature":1e0"#) && got.contains(r#""seed":12345678901234567890123"#), "as spelled");
    let got: Value = serde_json::from_str(&got).unwrap();
    assert_eq!(got["model"], "model-oai");
    assert!(got.get("x_shield").is_none(), "Shield's own fields never go upstream");

    // Streamed: the target is asked for usage, the rest as sent.
    let streamed = sent.replacen(r#""max_tokens": 64"#, r#""max_tokens": 64, "stream": true"#, 1);
    let (status, text) = post_raw(&stack, &key, "/v1/chat/completions", streamed).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    let got = received_text(&stack, "oai").await;
    assert!(got.contains(&format!(r#""messages":{messages}"#)) && got.contains(r#""stream":true"#));
    assert_eq!(serde_json::from_str::<Value>(&got).unwrap()["stream_options"], json!({"include_usage": true}));

    // Messages, 150 KB, to an Anthropic target: the target's model and extra_body set.
    let sent = format!(
        r#"{{"model": "agent-claude", "max_tokens": 64, "top_k": 1e0, "system": [{{"type": "text", "text": "You are a coding agent.\n\u00e9"}}],
            "messages": {messages}}}"#
    );
    let (status, answer) = post_raw(&stack, &key, "/v1/messages", sent).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let got = received_text(&stack, "claude").await;
    assert!(got.contains(&format!(r#""messages":{messages}"#)), "the history byte for byte");
    assert!(got.contains(r#""text": "You are a coding agent.\n\u00e9""#), "escapes as written");
    let got: Value = serde_json::from_str(&got).unwrap();
    assert_eq!(
        (got["model"].as_str(), got["top_k"].as_i64()),
        (Some("model-claude"), Some(7)),
        "the target's fields win"
    );

    // The guardrails read the whole history: a secret deep inside it is still found.
    let mut with_secret = history(150_000);
    with_secret.insert(3, json!({"role": "user", "content": "token ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"}));
    let (status, _, answer) = stack.chat(&key, json!({"model": "agent", "messages": with_secret}), &[]).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let flagged = answer["x_shield"]["guardrail_results"].as_array().unwrap();
    assert!(
        flagged.iter().any(|r| r["name"] == "secrets_detection" && r["passed"] == false),
        "{:?}",
        answer["x_shield"]["guardrail_results"]
    );
}

/// A stream that breaks after the commit point is continued with what was sent so far as an
/// assistant prefill: that body is written afresh from its fields, so the prefill is in it.
#[tokio::test]
async fn a_continued_agent_body_carries_its_prefill() {
    let stack = Stack::start().await;
    stack.mock_target("a", "chunks:60;breakonce:40", json!({"capabilities": {"assistant_prefill": true}})).await;
    stack.put_route("agent", json!({"targets": ["a"], "stream_resume": "continue"})).await;
    let (key, _) = stack.key(None).await;
    let sent = history(20_000);
    let (status, _, data) = stack.chat_stream(&key, json!({"model": "agent", "stream": true, "messages": sent})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(shield_e2e::stack::stream_content(&data).contains("part59"), "completed: {data:?}");
    let received = stack.received("a").await;
    assert_eq!(received.len(), 2, "the first attempt and its continuation");
    let resumed: Value = serde_json::from_str(received[1]["body"].as_str().unwrap()).unwrap();
    let messages = resumed["messages"].as_array().unwrap();
    assert_eq!(messages.len(), sent.len() + 1);
    assert_eq!(messages.last().unwrap()["role"], "assistant", "the prefill went with the continued body");
    assert_eq!(&messages[..sent.len()], &sent[..], "the history unchanged");
}
