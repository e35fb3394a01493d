//! Failover that recovers (issue 17), against the mock: same-target retry after a short
//! `Retry-After` or a jittered backoff (never a tight loop), a longer hint parking the target,
//! and the breaker's probe cadence bringing a provider back soon after it returns.
//!
//! The flap test runs in real time: `SHIELD_FLAP_DOWN_S` (default 60) seconds of outage, then
//! up to 30 s for the primary to serve again, one request every 4 s.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_e2e::stack::{Stack, chat_body};

fn retry(attempts: u32) -> Value {
    json!({"retry": {"attempts": attempts, "max_wait_s": 5}})
}

#[tokio::test]
async fn a_short_retry_after_is_waited_for_on_the_same_target() {
    let stack = Stack::start().await;
    stack.mock_target("a", "seq:429-200;retry-after:2", json!({})).await;
    stack.mock_target("b", "", json!({})).await;
    stack.mock_target("c", "seq:429-200;retry-after:2", json!({})).await;
    stack.put_route("r", json!({"targets": ["a", "b"], "failover": retry(1)})).await;
    stack.put_route("plain", json!({"targets": ["c", "b"]})).await;
    let (key, _) = stack.key(None).await;
    let started = Instant::now();
    let (status, headers, body) = stack.chat(&key, chat_body("r"), &[]).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (headers["x-shield-target"].to_str().unwrap(), headers["x-shield-failovers"].to_str().unwrap()),
        ("a", "0")
    );
    assert!(took >= Duration::from_millis(1_800), "waited for Retry-After: 2 ({took:?})");
    let attempts = body["x_shield"]["routing"]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!((attempts[0]["status"].clone(), attempts[0].get("retry")), (json!(429), None));
    assert_eq!((attempts[1]["target"].clone(), attempts[1]["retry"].clone()), (json!("a"), json!(true)));
    assert!(stack.received("b").await.is_empty(), "never left the target");
    // Without retry configured the same answer moves on at once (today's behaviour).
    let (_, headers, _) = stack.chat(&key, chat_body("plain"), &[]).await;
    assert_eq!(headers["x-shield-target"], "b");
}

/// Issue 27: retrying never costs a route its failover. With `max_attempts` equal to the number
/// of targets, a primary that answers 503 (or 429 without a hint) on every call gets one
/// attempt and the healthy fallback answers; with attempts to spare, the primary is retried
/// first, and the fallback still gets the last attempt.
#[tokio::test]
async fn retries_never_starve_the_failover() {
    let stack = Stack::start().await;
    for (primary, spec) in [("p503", "status:503"), ("p429", "status:429"), ("q503", "status:503")] {
        stack.mock_target(primary, spec, json!({})).await;
    }
    for fallback in ["f503", "f429", "g503"] {
        stack.mock_target(fallback, "", json!({})).await;
    }
    let failover = |max: u32| json!({"max_attempts": max, "retry": {"attempts": 2, "max_wait_s": 5}});
    stack.put_route("tight-503", json!({"targets": ["p503", "f503"], "failover": failover(2)})).await;
    stack.put_route("tight-429", json!({"targets": ["p429", "f429"], "failover": failover(2)})).await;
    stack.put_route("roomy-503", json!({"targets": ["q503", "g503"], "failover": failover(4)})).await;
    let (key, _) = stack.key(None).await;
    for (route, primary, fallback, primary_calls) in
        [("tight-503", "p503", "f503", 1), ("tight-429", "p429", "f429", 1), ("roomy-503", "q503", "g503", 3)]
    {
        let (status, headers, body) = stack.chat(&key, chat_body(route), &[]).await;
        assert_eq!(status, StatusCode::OK, "{route}: the fallback answers: {body}");
        assert_eq!(headers["x-shield-target"], fallback, "{route}");
        assert_eq!(headers["x-shield-failovers"], "1", "{route}");
        let attempts = body["x_shield"]["routing"]["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), primary_calls + 1, "{route}: {attempts:?}");
        assert_eq!(stack.received(primary).await.len(), primary_calls, "{route}");
        assert_eq!(stack.received(fallback).await.len(), 1, "{route}");
    }
}

#[tokio::test]
async fn a_500_once_is_retried_on_the_same_target_and_counted() {
    let stack = Stack::start().await;
    stack.mock_target("a", "seq:500-200", json!({})).await;
    stack.mock_target("b", "", json!({})).await;
    stack.put_route("r", json!({"targets": ["a", "b"], "failover": retry(2)})).await;
    let (key, _) = stack.key(None).await;
    let (status, headers, body) = stack.chat(&key, chat_body("r"), &[]).await;
    assert_eq!((status, headers["x-shield-target"].to_str().unwrap()), (StatusCode::OK, "a"), "{body}");
    assert_eq!(stack.received("a").await.len(), 2);
    assert!(stack.received("b").await.is_empty());
    // Usage counts the retry as a call, and not as a failover.
    let rows = shield_e2e::eventually(10, "the flushed usage", || async {
        let (_, body) = stack.admin_call(reqwest::Method::GET, "/v1/tenant/me/gateway/usage?route=r", None).await;
        let rows = body["rows"].as_array().cloned().unwrap_or_default();
        rows.iter().find(|r| r["target"] == "a" && r["calls"] == 2).cloned()
    })
    .await;
    assert_eq!(
        (rows["ok"].clone(), rows["errors"].clone(), rows["failovers_from"].clone()),
        (json!(1), json!(1), json!(0))
    );
}

#[tokio::test]
async fn retries_back_off_and_a_long_hint_parks_and_moves_on() {
    let stack = Stack::start().await;
    stack.mock_target("down", "status:500", json!({})).await;
    stack.mock_target("slow-reset", "status:429;retry-after:60", json!({})).await;
    stack.mock_target("b", "", json!({})).await;
    stack
        .put_route("down", json!({"targets": ["down"], "failover": {"max_attempts": 4, "retry": {"attempts": 3}}}))
        .await;
    stack.put_route("long", json!({"targets": ["slow-reset", "b"], "failover": retry(3)})).await;
    let (key, _) = stack.key(None).await;

    // Never a tight loop: 4 calls (1 + 3 retries) spread by 0.25 s × 2^n ± 50 %.
    let started = Instant::now();
    let (status, _, body) = stack.chat(&key, chat_body("down"), &[]).await;
    let took = started.elapsed().as_secs_f64();
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["error"]["attempts"].as_array().unwrap().len(), 4, "{body}");
    let calls = stack.received("down").await.len();
    assert_eq!(calls, 4);
    assert!(took >= 0.125 + 0.25 + 0.5, "backoff at its shortest is 0.875 s ({took:.3} s)");
    let per_second = calls as f64 / took;
    eprintln!("retry backoff: {calls} calls in {took:.3} s = {per_second:.1} calls/s at the mock");
    assert!(per_second < 5.0, "{per_second:.1} calls/s");

    // A Retry-After longer than max_wait_s: no retry, the target is parked, the next answers.
    let (status, headers, body) = stack.chat(&key, chat_body("long"), &[]).await;
    assert_eq!((status, headers["x-shield-target"].to_str().unwrap()), (StatusCode::OK, "b"), "{body}");
    assert_eq!(stack.received("slow-reset").await.len(), 1);
    let (_, _, body) = stack.chat(&key, chat_body("long"), &[]).await;
    assert_eq!(body["x_shield"]["routing"]["excluded"], json!([{"target": "slow-reset", "reason": "exhausted"}]));
}

/// A provider down for a minute, then back: the fallback serves every request meanwhile, the
/// primary gets no more than its breaker allows (five failures, then one probe per 10 s), and
/// it serves again within 30 s of its return.
#[tokio::test]
async fn a_provider_that_flaps_is_served_by_the_fallback_and_back_within_30_s() {
    let down_s: u64 = std::env::var("SHIELD_FLAP_DOWN_S").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let stack = Stack::start().await;
    stack.mock_target("primary", &format!("downfor:{down_s}"), json!({})).await;
    stack.mock_target("fallback", "", json!({})).await;
    stack.put_route("r", json!({"targets": ["primary", "fallback"]})).await;
    let (key, _) = stack.key(None).await;
    let started = Instant::now();
    let mut back_on_primary = None;
    let mut served_by = Vec::new();
    while started.elapsed() < Duration::from_secs(down_s + 40) {
        let (status, headers, body) = stack.chat(&key, chat_body("r"), &[]).await;
        assert_eq!(status, StatusCode::OK, "every request is served: {body}");
        let target = headers["x-shield-target"].to_str().unwrap().to_string();
        let at = started.elapsed().as_secs_f64();
        if target == "primary" && at > down_s as f64 && back_on_primary.is_none() {
            back_on_primary = Some(at);
        }
        served_by.push((at, target));
        if back_on_primary.is_some_and(|t| at - t > 8.0) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    let back = back_on_primary.unwrap_or_else(|| panic!("never back on the primary: {served_by:?}"));
    eprintln!("flap: down {down_s} s; back on the primary at {back:.1} s; requests {}", served_by.len());
    assert!(back - down_s as f64 <= 30.0, "back within 30 s of its return ({back:.1} s): {served_by:?}");
    // While down: 5 failures open the circuit, then at most one probe per 10 s.
    let while_down =
        stack.received("primary").await.len() as u64 - served_by.iter().filter(|(_, t)| t == "primary").count() as u64;
    let allowed = 5 + down_s / 10 + 1;
    assert!(while_down <= allowed, "{while_down} calls while down (at most {allowed})");
}
