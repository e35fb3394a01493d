//! Streaming end to end (seed §8 item 5, ROUTING.md "the commit point"): failover before the
//! first byte the client receives, none after; the relay's handling of silence, breaks,
//! malformed events, missing `[DONE]`, usage, and clients that go away.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_e2e::eventually;
use shield_e2e::stack::Stack;

fn stream_body(model: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hello"}]})
}

/// Sends a streaming request and reads the whole SSE answer: (status, headers, data payloads).
async fn stream(stack: &Stack, key: &str, body: Value) -> (StatusCode, reqwest::header::HeaderMap, Vec<String>) {
    let response = stack
        .client
        .post(format!("http://{}/v1/chat/completions", stack.proxy))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let data = text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect();
    (status, headers, data)
}

fn content(data: &[String]) -> String {
    data.iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.pointer("/choices/0/delta/content").and_then(Value::as_str).map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_stream_is_relayed_event_by_event_with_routing_headers() {
    let stack = Stack::start().await;
    stack.mock_target("a", "chunks:3", json!({})).await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    let (key, _) = stack.key(None).await;
    let (status, headers, data) = stream(&stack, &key, stream_body("smart")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(
        (headers["x-shield-route"].to_str().unwrap(), headers["x-shield-target"].to_str().unwrap()),
        ("smart", "a")
    );
    assert_eq!(headers["x-shield-failovers"], "0");
    assert_eq!(content(&data), "mock part1 part2 ");
    assert_eq!(data.last().unwrap(), "[DONE]");
    for chunk in &data[..data.len() - 1] {
        let chunk: Value = serde_json::from_str(chunk).unwrap();
        assert_eq!(chunk["model"], "model-a", "the target's model on every chunk");
        assert!(!chunk["choices"].as_array().unwrap().is_empty(), "the usage chunk Shield asked for is stripped");
    }
    let sent: Value = serde_json::from_str(stack.received("a").await[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["stream_options"], json!({"include_usage": true}), "usage is asked for upstream");

    // A client that asks for usage gets the usage chunk.
    let mut body = stream_body("smart");
    body["stream_options"] = json!({"include_usage": true});
    let (_, _, data) = stream(&stack, &key, body).await;
    let usage: Vec<Value> =
        data.iter().filter_map(|d| serde_json::from_str::<Value>(d).ok()).filter(|v| !v["usage"].is_null()).collect();
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0]["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn failures_before_the_first_byte_fail_over_and_leak_nothing() {
    let stack = Stack::start().await;
    let cases = [
        ("s503", "status:503"),
        ("errfirst", "errfirst"),
        ("slow", "ttfb:5000"),
        ("broken", "break:0"),
        ("silent", "stall:0"),
        ("empty", "empty"),
    ];
    stack.mock_target("good", "chunks:2", json!({})).await;
    for (id, scenario) in cases {
        stack.mock_target(id, scenario, json!({"timeout_s": 5, "first_byte_timeout_s": 1})).await;
        stack.put_route(&format!("r-{id}"), json!({"targets": [id, "good"]})).await;
    }
    let (key, _) = stack.key(None).await;
    for (id, _) in cases {
        let (status, headers, data) = stream(&stack, &key, stream_body(&format!("r-{id}"))).await;
        assert_eq!(status, StatusCode::OK, "{id}");
        assert_eq!(headers["x-shield-failovers"], "1", "{id}");
        assert_eq!(headers["x-shield-target"], "good", "{id}");
        assert_eq!(content(&data), "mock part1 ", "{id}: only the answering target's output");
        assert!(data.iter().all(|d| !d.contains("mock overloaded")), "{id}: the failed attempt's output is never sent");
        assert_eq!(data.last().unwrap(), "[DONE]");
    }
    assert_eq!(stack.received("good").await.len(), cases.len());
}

#[tokio::test]
async fn after_the_commit_point_there_is_no_failover_and_the_stream_ends_cleanly() {
    let stack = Stack::start().await;
    stack.mock_target("breaks", "chunks:5;break:2", json!({})).await;
    stack.mock_target("stalls", "chunks:5;stall:2", json!({"idle_timeout_s": 1})).await;
    stack.mock_target("backup", "", json!({})).await;
    stack.put_route("breaks", json!({"targets": ["breaks", "backup"]})).await;
    stack.put_route("stalls", json!({"targets": ["stalls", "backup"]})).await;
    let (key, _) = stack.key(None).await;
    for route in ["breaks", "stalls"] {
        let started = Instant::now();
        let (status, headers, data) = stream(&stack, &key, stream_body(route)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["x-shield-target"], route);
        assert_eq!(content(&data), "mock part1 ", "{route}: what was relayed before the break");
        let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
        assert_eq!(error["error"]["type"], "upstream_error", "{route}");
        assert_eq!(error["error"]["code"], "stream_broken");
        assert_eq!(data.last().unwrap(), "[DONE]");
        assert!(started.elapsed() < Duration::from_secs(10), "{route}: silence is bounded by idle_timeout_s");
    }
    assert_eq!(stack.received("backup").await.len(), 0, "no failover, no replay after the commit point");
}

#[tokio::test]
async fn malformed_events_are_dropped_and_a_missing_done_is_supplied() {
    let stack = Stack::start().await;
    stack.mock_target("malformed", "chunks:4;malformed:2", json!({})).await;
    stack.mock_target("nodone", "chunks:2;nodone", json!({})).await;
    stack.put_route("malformed", json!({"targets": ["malformed"]})).await;
    stack.put_route("nodone", json!({"targets": ["nodone"]})).await;
    let (key, _) = stack.key(None).await;
    let (_, _, data) = stream(&stack, &key, stream_body("malformed")).await;
    for d in &data[..data.len() - 1] {
        assert!(serde_json::from_str::<Value>(d).is_ok(), "only valid JSON reaches the client: {d}");
    }
    assert_eq!(content(&data), "mock part2 part3 ", "the malformed second event is dropped, the relay goes on");
    assert_eq!(data.last().unwrap(), "[DONE]");
    let started = Instant::now();
    let (_, _, data) = stream(&stack, &key, stream_body("nodone")).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    assert!(started.elapsed() < Duration::from_secs(5), "finished promptly");
}

#[tokio::test]
async fn a_client_that_goes_away_stops_the_upstream() {
    let stack = Stack::start().await;
    stack.mock_target("long", "chunks:200;chunkdelay:100", json!({})).await;
    stack.put_route("long", json!({"targets": ["long"]})).await;
    let (key, _) = stack.key(None).await;
    let response = stack
        .client
        .post(format!("http://{}/v1/chat/completions", stack.proxy))
        .bearer_auth(&key)
        .json(&stream_body("long"))
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    drop(body);
    let url = format!("http://{}/_mock/streams?id=long", stack.mock);
    let counts = eventually(10, "the upstream stream to be dropped", || async {
        let counts: Value = reqwest::get(&url).await.ok()?.json().await.ok()?;
        (counts["dropped"] == 1).then_some(counts)
    })
    .await;
    assert_eq!(counts["completed"], 0, "nothing kept generating for nobody: {counts}");
}

/// actix-web notices a vanished client when it writes, so a call abandoned before the first
/// token is dropped at its commit point at the latest: the upstream never streams for nobody.
#[tokio::test]
async fn a_client_that_goes_away_before_the_first_token_stops_the_upstream_too() {
    let stack = Stack::start().await;
    stack.mock_target("waiting", "ttfb:2000;chunks:100;chunkdelay:100", json!({})).await;
    stack.put_route("waiting", json!({"targets": ["waiting"]})).await;
    let (key, _) = stack.key(None).await;
    let request = stack
        .client
        .post(format!("http://{}/v1/chat/completions", stack.proxy))
        .bearer_auth(&key)
        .json(&stream_body("waiting"));
    // Give up while Shield waits for the first token.
    let _ = tokio::time::timeout(Duration::from_millis(500), request.send()).await;
    let url = format!("http://{}/_mock/streams?id=waiting", stack.mock);
    let counts = eventually(10, "the waiting upstream to be dropped", || async {
        let counts: Value = reqwest::get(&url).await.ok()?.json().await.ok()?;
        (counts["dropped"] == 1).then_some(counts)
    })
    .await;
    assert_eq!(counts["completed"], 0, "{counts}");
}

#[tokio::test]
async fn curl_n_and_the_official_sdk_stream_unchanged() {
    let stack = Stack::start().await;
    stack.mock_target("down", "status:503", json!({})).await;
    stack.mock_target("up", "chunks:3", json!({})).await;
    stack.put_route("smart", json!({"targets": ["down", "up"]})).await;
    let (key, _) = stack.key(None).await;
    let out = tokio::process::Command::new("curl")
        .args(["-sN", "-H", &format!("authorization: Bearer {key}"), "-H", "content-type: application/json"])
        .args(["-d", &stream_body("smart").to_string(), &format!("http://{}/v1/chat/completions", stack.proxy)])
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("part2") && text.trim_end().ends_with("data: [DONE]"), "{text}");

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/openai_stream.py");
    let out = tokio::process::Command::new("python3")
        .args([script, &format!("http://{}/v1", stack.proxy), &key, "smart"])
        .output()
        .await
        .expect("python3 runs");
    assert!(out.status.success(), "SDK stream failed: {}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["content"], "mock part1 part2 ");
    assert_eq!(result["failovers"], "1");
    assert_eq!(result["model"], "model-up");
}

/// TCP connections the stack's mock accepted so far, read on a connection of its own (counted
/// too, before the answer: consecutive readings differ by one more than the proxy opened).
async fn mock_connections(stack: &Stack) -> u64 {
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let body: Value =
        client.get(format!("http://{}/_mock/connections", stack.mock)).send().await.unwrap().json().await.unwrap();
    body["accepted"].as_u64().unwrap()
}

/// Issue 27: a connection's idle time starts when its answer's body ends, not when its head
/// arrived. Five sequential streams of ~5 s each (longer than the pool's 4 s idle timeout) go
/// over one upstream connection; a call after the idle timeout opens a fresh one.
#[tokio::test]
async fn long_streams_reuse_their_upstream_connection() {
    let stack = Stack::start().await;
    stack.mock_target("slow", "chunks:10;chunkdelay:500", json!({})).await;
    stack.put_route("slow", json!({"targets": ["slow"]})).await;
    let (key, _) = stack.key(None).await;
    let before = mock_connections(&stack).await;
    for _ in 0..5 {
        let (status, _, data) = stream(&stack, &key, stream_body("slow")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    }
    let after = mock_connections(&stack).await;
    assert_eq!(after - before - 1, 1, "five long streams, one upstream connection");
    // Idle past the pool's 4 s: the next call does not race the upstream's keep-alive expiry.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let (status, _, _) = stream(&stack, &key, stream_body("slow")).await;
    assert_eq!(status, StatusCode::OK);
    let last = mock_connections(&stack).await;
    assert_eq!(last - after - 1, 1, "a fresh connection after the idle timeout");
}
