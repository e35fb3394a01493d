//! Budgets end to end (seed §8 item 8, second half; ROUTING.md step 3): decisions use the
//! flushed month spend plus this process's unflushed spend; `warn` from 80 %, `block` refuses,
//! `fallback` narrows; route reads show the state; `budget_exceeded` is claimed exactly once
//! per route and month even with two proxy processes flushing at the same time.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_e2e::eventually;
use shield_e2e::stack::{Stack, StackOptions, chat_body};

/// 10 prompt + 20 completion tokens at 2.5 / 10 USD per million: 225 micro-USD a call.
async fn priced(stack: &Stack, id: &str, extra: Value) {
    let mut body = json!({"price": {"input_per_mtok": 2.5, "output_per_mtok": 10}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    stack.mock_target(id, "usage:10-20", body).await;
}

#[tokio::test]
async fn block_refuses_once_spent_and_warns_before() {
    let stack = Stack::start().await;
    priced(&stack, "a", json!({})).await;
    stack.put_route("capped", json!({"targets": ["a"], "budget": {"monthly": 0.0005, "at_limit": "block"}})).await;
    let (key, _) = stack.key(None).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let (status, headers, body) = stack.chat(&key, chat_body("capped"), &[]).await;
        assert_eq!(status, StatusCode::OK);
        seen.push((
            headers["x-shield-budget"].to_str().unwrap().to_string(),
            body["choices"][0]["finish_reason"].as_str().unwrap().to_string(),
        ));
        if seen.len() == 4 {
            assert_eq!(body["choices"][0]["message"]["content"], "This route's monthly budget is spent");
            assert_eq!(body["x_shield"]["routing"]["halt"], "budget_blocked");
        }
    }
    // 0, 225 (45 %), 450 (90 %: warn), 675 (≥ 500: block).
    let want = [("ok", "stop"), ("ok", "stop"), ("warn", "stop"), ("block", "content_filter")];
    assert_eq!(seen, want.map(|(a, b)| (a.to_string(), b.to_string())));
    assert_eq!(stack.received("a").await.len(), 3, "a blocked call reaches no target");

    let route = eventually(10, "the route read to show the spend", || async {
        let (_, route) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/routes/capped", None).await;
        (route["budget_state"]["spend_micros"] == 675).then_some(route)
    })
    .await;
    assert_eq!(route["budget_state"]["state"], "block");
    assert_eq!(route["budget_state"]["percent"], 135.0);
    assert_eq!(route["budget_state"]["incomplete"], false);
}

#[tokio::test]
async fn fallback_narrows_to_the_fallback_targets() {
    let stack = Stack::start().await;
    priced(&stack, "premium", json!({})).await;
    stack.mock_target("local", "", json!({"location": "on_prem"})).await;
    stack
        .put_route(
            "smart",
            json!({"targets": ["premium", "local"],
            "budget": {"monthly": 0.0004, "at_limit": "fallback", "fallback_targets": ["local"]}}),
        )
        .await;
    let (key, _) = stack.key(None).await;
    let mut answered = Vec::new();
    for _ in 0..4 {
        let (_, headers, _) = stack.chat(&key, chat_body("smart"), &[]).await;
        answered.push((
            headers["x-shield-target"].to_str().unwrap().to_string(),
            headers["x-shield-budget"].to_str().unwrap().to_string(),
        ));
    }
    // 0, 225 (56 %), then 450 ≥ 400: fallback.
    let want = [("premium", "ok"), ("premium", "ok"), ("local", "fallback"), ("local", "fallback")];
    assert_eq!(answered, want.map(|(a, b)| (a.to_string(), b.to_string())));
    let (_, route) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/routes/smart", None).await;
    assert_eq!(route["budget_state"]["incomplete"], true, "`local` has no price: spend is incomplete");
}

#[tokio::test]
async fn budget_exceeded_is_claimed_once_with_two_processes_flushing() {
    budget_exceeded_once(StackOptions::default()).await;
}

/// The same on a Redis Cluster (issue 20): the HSETNX claim inside the tenant's merge script,
/// the event on `gw_events` in its own slot.
#[tokio::test]
async fn budget_exceeded_is_claimed_once_on_a_redis_cluster() {
    budget_exceeded_once(StackOptions::on_cluster()).await;
}

async fn budget_exceeded_once(options: StackOptions) {
    let redis_url = options.redis_url.clone();
    let mut stack = Stack::start_with(options).await;
    priced(&stack, "a", json!({})).await;
    stack.put_route("shared", json!({"targets": ["a"], "budget": {"monthly": 0.001, "at_limit": "warn"}})).await;
    let (key, _) = stack.key(None).await;
    let second = stack.extra_proxy().await;
    let url = |addr: &str| format!("http://{addr}/v1/chat/completions");
    for i in 0..12 {
        let addr = if i % 2 == 0 { stack.proxy.clone() } else { second.clone() };
        let response = stack.client.post(url(&addr)).bearer_auth(&key).json(&chat_body("shared")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    // 12 × 225 = 2,700 micro-USD ≥ 1,000: both processes' flushes cross the limit.
    let mut conn = shield_e2e::redis_conn(&redis_url).await;
    let events_key = format!("{}gw_events", stack.prefix);
    let spend_key = format!("{}gw_spend:{{{}}}:{}", stack.prefix, stack.tenant, month());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while redis::cmd("HGET").arg(&spend_key).arg("shared").query_async::<Option<i64>>(&mut conn).await.ok().flatten()
        != Some(2_700)
    {
        assert!(std::time::Instant::now() < deadline, "both processes to flush");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await; // one more flush round from each
    let entries: Vec<(String, Vec<(String, String)>)> =
        redis::cmd("XRANGE").arg(&events_key).arg("-").arg("+").query_async(&mut conn).await.unwrap();
    let exceeded: Vec<Value> = entries
        .iter()
        .filter(|(_, fields)| fields.iter().any(|(k, v)| k == "type" && v == "budget_exceeded"))
        .map(|(_, fields)| serde_json::from_str(&fields.iter().find(|(k, _)| k == "data").unwrap().1).unwrap())
        .collect();
    assert_eq!(exceeded.len(), 1, "exactly once per route per month: {exceeded:?}");
    assert_eq!(exceeded[0]["route"], "shared");
    assert_eq!(exceeded[0]["limit"], 0.001);
    assert!(exceeded[0]["spend"].as_f64().unwrap() >= 0.001);
    assert_eq!(exceeded[0]["month"], month());
    // Both processes' rows merged without losing an increment.
    let usage: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{}gw_usage:{{{}}}:{}", stack.prefix, stack.tenant, today()))
        .query_async(&mut conn)
        .await
        .unwrap();
    let row: Value = serde_json::from_str(&usage["shared|a"]).unwrap();
    assert_eq!(
        (row["calls"].as_u64(), row["ok"].as_u64(), row["cost_micros"].as_i64()),
        (Some(12), Some(12), Some(2_700))
    );
}

fn today() -> String {
    let out = std::process::Command::new("date").args(["-u", "+%Y%m%d"]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn month() -> String {
    let out = std::process::Command::new("date").args(["-u", "+%Y%m"]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
