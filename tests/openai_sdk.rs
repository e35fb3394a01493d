//! The official OpenAI Python SDK against the real proxy (seed §1's observable success): with
//! the first target of `smart` answering 503, the SDK's call is answered by the second target
//! with `X-Shield-Failovers: 1`. Needs `python3 -m pip install openai` (scripts/test does it).

use serde_json::{Value, json};
use shield_e2e::stack::Stack;

#[tokio::test]
async fn the_official_sdk_sees_the_failover() {
    let stack = Stack::start().await;
    stack.mock_target("openai-4o", "status:503", json!({})).await;
    stack.mock_target("azure-4o", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["openai-4o", "azure-4o"]})).await;
    let (key, _) = stack.key(None).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/openai_failover.py");
    let out = tokio::process::Command::new("python3")
        .args([script, &format!("http://{}/v1", stack.proxy), &key, "smart"])
        .output()
        .await
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the SDK script failed (is the openai package installed?): {stderr}");
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["failovers"], "1");
    assert_eq!(lines[0]["target"], "azure-4o");
    assert_eq!(lines[0]["route"], "smart");
    assert_eq!(lines[0]["model"], "model-azure-4o");
    assert_eq!(lines[0]["content"], "mock answer to: hello from the SDK");
    assert_eq!(lines[1]["auth"], "AuthenticationError");
    assert_eq!((stack.received("openai-4o").await.len(), stack.received("azure-4o").await.len()), (1, 1));
}

/// Issue 18 as SDK users meet it: `x-ratelimit-*` on answers, `RateLimitError` (429) with
/// Shield's message and `Retry-After` from both official SDKs, and no upstream call for it.
#[tokio::test]
async fn the_official_sdks_read_rate_limits() {
    let stack = Stack::start().await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("two", json!({"targets": ["a"], "limits": {"rpm": 2}})).await;
    let (key, _) = stack.key(None).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/sdk/rate_limits.py");
    let out = tokio::process::Command::new("python3")
        .args([script, &format!("http://{}", stack.proxy), &key, "two"])
        .output()
        .await
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the SDK script failed (are openai and anthropic installed?): {stderr}");
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!((lines[0]["limit"].as_str(), lines[0]["remaining"].as_str()), (Some("2"), Some("1")), "{lines:?}");
    assert!(lines[0]["reset"].as_str().is_some_and(|r| r.ends_with('s')), "{lines:?}");
    assert_eq!(lines[1]["remaining"], "0");
    assert_eq!(lines[2]["error"], "RateLimitError", "{lines:?}");
    assert_eq!(lines[2]["status"], 429);
    assert_eq!(lines[2]["code"], "rate_limit_exceeded");
    assert!(lines[2]["message"].as_str().unwrap().contains("route `two`: 2 requests per minute"), "{lines:?}");
    let retry: u64 = lines[2]["retry_after"].as_str().unwrap().parse().unwrap();
    assert!((55..=60).contains(&retry), "{retry}");
    assert_eq!(lines[3]["error"], "RateLimitError", "{lines:?}");
    assert_eq!(lines[3]["type"], "rate_limit_error");
    assert_eq!(stack.received("a").await.len(), 2, "the refused calls never reached the upstream");
}
