//! Resuming a stream that broke after its commit point (issue 17, `stream_resume`), against
//! the mock: a 60-piece answer cut after 40 pieces is completed in full, exactly once, by
//! `regenerate` and by `continue`; a fallback that refuses the prefill still completes it; an
//! answer that diverges is never shown and the stream ends cleanly with the error; a stall is
//! resumed; resumed attempts are recorded and counted.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::eventually;
use shield_e2e::stack::{Stack, stream_content as content};

/// The 60-piece answer the mock streams: "mock part1 part2 … part59 ".
fn full_answer(alt: bool) -> String {
    let word = if alt { "alt" } else { "part" };
    std::iter::once("mock ".to_string()).chain((1..60).map(|n| format!("{word}{n} "))).collect()
}

fn stream(model: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "tell me"}]})
}

#[tokio::test]
async fn regenerate_completes_a_cut_stream_exactly_once() {
    let stack = Stack::start().await;
    stack.mock_target("a", "chunks:60;breakonce:40", json!({})).await;
    stack.mock_target("b", "chunks:60;breakonce:40", json!({})).await;
    stack.put_route("r", json!({"targets": ["a"], "stream_resume": "regenerate"})).await;
    stack.put_route("off", json!({"targets": ["b"]})).await;
    let (key, _) = stack.key(None).await;
    let (status, _, data) = stack.chat_stream(&key, stream("r")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content(&data), full_answer(false), "every piece once, none twice");
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert!(!data.iter().any(|d| d.contains("stream_broken")));
    assert_eq!(stack.received("a").await.len(), 2, "the same target regenerated it");

    // Without stream_resume the same cut ends with the error chunk (today's behaviour).
    let (_, _, data) = stack.chat_stream(&key, stream("off")).await;
    assert!(data.iter().any(|d| d.contains("stream_broken")), "{data:?}");

    // Usage counts the resumed attempt, and the broken stream is not counted broken.
    let rows = eventually(10, "the flushed usage", || async {
        let (_, body) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/usage?route=r", None).await;
        body["rows"].as_array().cloned().filter(|rows| rows.iter().any(|r| r["calls"] == 2))
    })
    .await;
    let row = &rows[0];
    assert_eq!(
        (row["calls"].clone(), row["stream_resumed"].clone(), row["stream_broken"].clone()),
        (json!(2), json!(1), json!(0)),
        "{row}"
    );
}

#[tokio::test]
async fn continue_sends_the_prefill_and_streams_the_continuation() {
    let stack = Stack::start().await;
    stack.mock_target("a", "chunks:60;breakonce:40", json!({"capabilities": {"assistant_prefill": true}})).await;
    stack.put_route("r", json!({"targets": ["a"], "stream_resume": "continue"})).await;
    let (key, _) = stack.key(None).await;
    let (status, _, data) = stack.chat_stream(&key, stream("r")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content(&data), full_answer(false));
    let received = stack.received("a").await;
    assert_eq!(received.len(), 2);
    let resumed: Value = serde_json::from_str(received[1]["body"].as_str().unwrap()).unwrap();
    let last = resumed["messages"].as_array().unwrap().last().unwrap().clone();
    let sent: String = full_answer(false).split_inclusive(' ').take(40).collect();
    assert_eq!(last, json!({"role": "assistant", "content": sent.trim_end()}), "the text already sent, as a prefill");
}

#[tokio::test]
async fn a_fallback_that_refuses_the_prefill_still_completes_the_stream() {
    let stack = Stack::start().await;
    let prefill = json!({"capabilities": {"assistant_prefill": true}});
    stack.mock_target("a", "chunks:60;break:40", prefill.clone()).await;
    stack.mock_target("b", "chunks:60;noprefill", prefill).await;
    stack.put_route("r", json!({"targets": ["a", "b"], "stream_resume": "continue"})).await;
    let (key, _) = stack.key(None).await;
    let (status, _, data) = stack.chat_stream(&key, stream("r")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content(&data), full_answer(false), "b regenerated it after refusing the prefill");
    assert!(!data.iter().any(|d| d.contains("prefill")), "the caller never sees the prefill refusal");
    assert_eq!(stack.received("b").await.len(), 2, "the refused prefill, then the regeneration");
}

#[tokio::test]
async fn an_answer_that_diverges_is_never_shown() {
    let stack = Stack::start().await;
    stack.mock_target("a", "chunks:60;break:40", json!({})).await;
    stack.mock_target("b", "chunks:60;alt", json!({})).await;
    stack.put_route("r", json!({"targets": ["a", "b"], "stream_resume": "regenerate"})).await;
    stack.put_route("b-only", json!({"targets": ["b"]})).await;
    let (key, _) = stack.key(None).await;
    let (status, _, data) = stack.chat_stream(&key, stream("r")).await;
    assert_eq!(status, StatusCode::OK);
    let sent: String = full_answer(false).split_inclusive(' ').take(40).collect();
    assert_eq!(content(&data), sent, "only what a had sent; nothing of b's different answer");
    let error = data.iter().find(|d| d.contains("stream_broken")).expect("ends with the error chunk");
    assert!(error.contains("target `a` broke"), "the error names the original break: {error}");
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    // A different answer is not a failure of b: five more divergences leave its breaker shut.
    for _ in 0..5 {
        stack.chat_stream(&key, stream("r")).await;
    }
    let (status, headers, body) = stack.chat(&key, shield_e2e::stack::chat_body("b-only"), &[]).await;
    assert_eq!((status, headers["x-shield-target"].to_str().unwrap()), (StatusCode::OK, "b"), "{body}");
}

#[tokio::test]
async fn a_stall_is_resumed() {
    let stack = Stack::start().await;
    stack.mock_target("a", "chunks:60;stallonce:40", json!({"idle_timeout_s": 1})).await;
    stack.put_route("r", json!({"targets": ["a"], "stream_resume": "regenerate"})).await;
    let (key, _) = stack.key(None).await;
    let (status, _, data) = stack.chat_stream(&key, stream("r")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content(&data), full_answer(false));
}

#[tokio::test]
async fn the_route_reads_back_its_resume_setting_and_bad_values_are_refused() {
    let stack = Stack::start().await;
    stack.mock_target("a", "", json!({})).await;
    stack
        .put_route("r", json!({"targets": ["a"], "stream_resume": "continue", "failover": {"retry": {"attempts": 2}}}))
        .await;
    let (_, route) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/routes/r", None).await;
    assert_eq!(route["stream_resume"], "continue");
    assert_eq!(
        route["failover"]["retry"],
        json!({"attempts": 2, "on": ["429", "5xx", "timeout", "connect"], "max_wait_s": 5})
    );
    let (status, body) = stack
        .admin_call(
            Method::PUT,
            "/v1/tenant/me/gateway/routes/r",
            Some(json!({"targets": ["a"], "stream_resume": "sometimes"})),
        )
        .await;
    assert_eq!((status, body["error"]["field"].clone()), (StatusCode::UNPROCESSABLE_ENTITY, json!("stream_resume")));
}
