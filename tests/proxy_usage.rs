//! Usage and cost end to end (seed §8 item 8, first half): per-call cost from prices and
//! reported usage in integer micro-USD, the usage buffer flushed to `gw_usage`/`gw_spend` and
//! read back through the admin API, and nothing lost on a graceful stop.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::eventually;
use shield_e2e::process::PrivateRedis;
use shield_e2e::stack::{Stack, StackOptions, chat_body};

async fn priced_route(stack: &Stack) {
    stack.mock_target("down", "status:503", json!({"price": {"input_per_mtok": 1, "output_per_mtok": 1}})).await;
    stack.mock_target("up", "usage:10-20", json!({"price": {"input_per_mtok": 2.5, "output_per_mtok": 10}})).await;
    stack.put_route("smart", json!({"targets": ["down", "up"]})).await;
}

async fn usage(stack: &Stack) -> Vec<Value> {
    let (status, body) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/usage?route=smart", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["rows"].as_array().cloned().unwrap_or_default()
}

fn row<'a>(rows: &'a [Value], target: &str) -> &'a Value {
    rows.iter().find(|r| r["target"] == target).unwrap_or_else(|| panic!("no row for {target}: {rows:?}"))
}

#[tokio::test]
async fn costs_and_usage_are_exact_and_flushed() {
    costs_and_usage(StackOptions::default()).await;
}

/// The same on a Redis Cluster (issue 20): the merge script runs on the tenant's slot.
#[tokio::test]
async fn costs_and_usage_are_exact_and_flushed_on_a_redis_cluster() {
    costs_and_usage(StackOptions::on_cluster()).await;
}

async fn costs_and_usage(options: StackOptions) {
    let redis_url = options.redis_url.clone();
    let stack = Stack::start_with(options).await;
    priced_route(&stack).await;
    let (key, _) = stack.key(None).await;
    let mut reported = 0;
    for _ in 0..4 {
        let (status, _, body) = stack.chat(&key, chat_body("smart"), &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["x_shield"]["routing"]["cost_micros"], 225, "10 × 2.5 + 20 × 10 micro-USD");
        assert_eq!(body["x_shield"]["routing"]["cost"], 0.000225);
        reported += body["x_shield"]["routing"]["cost_micros"].as_i64().unwrap();
    }
    // A streamed call is costed from the usage chunk Shield asked for.
    let mut streamed = chat_body("smart");
    streamed["stream"] = json!(true);
    let response = stack
        .client
        .post(format!("http://{}/v1/chat/completions", stack.proxy))
        .bearer_auth(&key)
        .json(&streamed)
        .send()
        .await
        .unwrap();
    assert!(response.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    reported += 225;

    let rows = eventually(10, "the flushed usage", || async {
        let rows = usage(&stack).await;
        (rows.len() == 2 && row(&rows, "up")["calls"] == 5).then_some(rows)
    })
    .await;
    let (down, up) = (row(&rows, "down"), row(&rows, "up"));
    assert_eq!(
        (down["calls"].as_u64(), down["errors"].as_u64(), down["failovers_from"].as_u64()),
        (Some(5), Some(5), Some(5))
    );
    assert_eq!(
        (up["calls"].as_u64(), up["ok"].as_u64(), up["input_tokens"].as_u64(), up["output_tokens"].as_u64()),
        (Some(5), Some(5), Some(50), Some(100))
    );
    assert_eq!(up["cost_micros"].as_i64(), Some(reported), "stored cost equals the sum of per-call costs");
    assert_eq!(up["cost"], 0.001125);
    assert_eq!(up["estimated"], 0);
    // The sum of calls equals what the providers received.
    let received = stack.received("down").await.len() + stack.received("up").await.len();
    assert_eq!(down["calls"].as_u64().unwrap() + up["calls"].as_u64().unwrap(), received as u64);

    let mut conn = shield_e2e::redis_conn(&redis_url).await;
    let month = chrono_month();
    let spend: i64 = redis::cmd("HGET")
        .arg(format!("{}gw_spend:{{{}}}:{month}", stack.prefix, stack.tenant))
        .arg("smart")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(spend, reported);
}

#[tokio::test]
async fn a_graceful_stop_flushes_what_is_buffered() {
    let mut stack = Stack::start_with(StackOptions { flush_s: 3600, ..Default::default() }).await;
    priced_route(&stack).await;
    let (key, _) = stack.key(None).await;
    for _ in 0..7 {
        assert_eq!(stack.chat(&key, chat_body("smart"), &[]).await.0, StatusCode::OK);
    }
    assert!(usage(&stack).await.is_empty(), "nothing flushed yet (hourly flush)");
    stack.terminate_proxy().await;
    let rows = usage(&stack).await;
    assert_eq!(row(&rows, "up")["calls"], 7, "SIGTERM flushed every call: {rows:?}");
    assert_eq!(row(&rows, "up")["cost_micros"], 7 * 225);
    // After five failures the breaker opened: the last two calls never reached `down`.
    assert_eq!(
        (row(&rows, "down")["calls"].as_u64(), row(&rows, "down")["failovers_from"].as_u64()),
        (Some(5), Some(5))
    );
}

#[tokio::test]
async fn usage_made_while_redis_is_down_is_flushed_when_it_returns() {
    let mut redis = PrivateRedis::start();
    let stack = Stack::start_with(StackOptions { redis_url: redis.url(), ..Default::default() }).await;
    priced_route(&stack).await;
    let (key, _) = stack.key(None).await;
    assert_eq!(stack.chat(&key, chat_body("smart"), &[]).await.0, StatusCode::OK);
    eventually(10, "the first flush", || async { (!usage(&stack).await.is_empty()).then_some(()) }).await;
    redis.stop();
    for _ in 0..3 {
        assert_eq!(stack.chat(&key, chat_body("smart"), &[]).await.0, StatusCode::OK, "cached config keeps serving");
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await; // flushes fail meanwhile
    redis.restart(); // empty: only what the buffer kept can appear
    let rows = eventually(15, "the buffered usage", || async {
        let (status, body) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/usage?route=smart", None).await;
        let rows = body["rows"].as_array().cloned().unwrap_or_default();
        (status == StatusCode::OK && rows.iter().any(|r| r["target"] == "up")).then_some(rows)
    })
    .await;
    assert_eq!(row(&rows, "up")["calls"], 3, "the three calls made while Redis was away, none lost: {rows:?}");
    assert_eq!(row(&rows, "up")["cost_micros"], 3 * 225);
}

/// ROUTING/ARCHITECTURE: losing a process loses at most one flush interval of usage. With a
/// 1 s interval: calls flushed before the kill are all stored; calls made in the last interval
/// may be lost, and nothing else is.
#[tokio::test]
async fn a_sigkill_loses_at_most_the_last_flush_interval() {
    let mut stack = Stack::start().await;
    priced_route(&stack).await;
    let (key, _) = stack.key(None).await;
    for _ in 0..6 {
        assert_eq!(stack.chat(&key, chat_body("smart"), &[]).await.0, StatusCode::OK);
    }
    eventually(10, "the first six calls flushed", || async {
        let rows = usage(&stack).await;
        rows.iter().any(|r| r["target"] == "up" && r["calls"] == 6).then_some(())
    })
    .await;
    for _ in 0..4 {
        assert_eq!(stack.chat(&key, chat_body("smart"), &[]).await.0, StatusCode::OK);
    }
    stack.kill_proxy().await;
    let up = row(&usage(&stack).await, "up")["calls"].as_u64().unwrap();
    println!("SIGKILL with a 1 s flush interval: 10 calls made, {up} stored, {} lost", 10 - up.min(10));
    assert!(
        (6..=10).contains(&up),
        "stored {up}: everything flushed before the kill survives, at most the last interval is lost"
    );
}

fn chrono_month() -> String {
    let out = std::process::Command::new("date").args(["-u", "+%Y%m"]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
