//! Load with exact accounting: 100,000 requests (override with SHIELD_LOAD_REQUESTS) through
//! two proxy processes of one deployment, over a mix of routes, a target that fails 30 % of
//! its calls (exactly: `cycle:` in the mock), streaming and non-streaming. Afterwards the
//! flushed usage must reconcile exactly with what the mock received and what the responses
//! said, spend must equal the sum of per-call costs to the micro-dollar, no request may fail,
//! and the proxies' memory must stay flat (RSS before and after are printed).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shield_core::keys::RedisKeys;
use shield_e2e::stack::{Stack, StackOptions};
use shield_e2e::{eventually, redis_url};

const CONCURRENCY: usize = 32;
/// µUSD per successful call: 1000 × $0.15 + 500 × $0.60 per million tokens.
const STEADY_COST: i64 = 450;
/// 100 × $2.50 + 50 × $10.00 per million tokens.
const FLAKY_COST: i64 = 750;

#[derive(Default)]
struct Tally {
    ok: u64,
    failed: u64,
    failovers: u64,
    reported_cost: i64,
    by_target: BTreeMap<String, u64>,
    streams: u64,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.failovers += other.failovers;
        self.reported_cost += other.reported_cost;
        self.streams += other.streams;
        for (target, n) in other.by_target {
            *self.by_target.entry(target).or_default() += n;
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn drive(proxies: &[String], key: &str, range: std::ops::Range<usize>) -> Tally {
    // Idle connections are dropped well before the proxy's keep-alive ends: a request must
    // never go out on a connection the server is closing at that moment.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .pool_idle_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let next = Arc::new(AtomicUsize::new(range.start));
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let (client, next, proxies, key, end) =
            (client.clone(), next.clone(), proxies.to_vec(), key.to_string(), range.end);
        workers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    return tally;
                }
                let stream = i % 4 == 0;
                let route = if i % 3 == 0 { "direct" } else { "mixed" };
                let body = json!({"model": route, "stream": stream, "messages": [{"role": "user", "content": format!("request {i}")}]});
                let response = client
                    .post(format!("http://{}/v1/chat/completions", proxies[i % proxies.len()]))
                    .bearer_auth(&key)
                    .json(&body)
                    .send()
                    .await;
                let response = match response {
                    Ok(response) => response,
                    Err(err) => {
                        tally.failed += 1;
                        eprintln!("request {i}: not answered: {err:?}");
                        continue;
                    }
                };
                let status = response.status();
                let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                let (target, failovers) = (header("x-shield-target"), header("x-shield-failovers"));
                let text = response.text().await.unwrap_or_default();
                if !status.is_success() {
                    tally.failed += 1;
                    if i >= 12 {
                        eprintln!("request {i}: {status} {text}");
                    }
                    continue;
                }
                if stream {
                    assert!(text.trim_end().ends_with("data: [DONE]") && !text.contains("\"error\""), "stream {i}: {text}");
                    tally.streams += 1;
                    tally.reported_cost += if target == "steady" { STEADY_COST } else { FLAKY_COST };
                } else {
                    let answer: Value = serde_json::from_str(&text).expect("JSON answer");
                    let cost = answer["x_shield"]["routing"]["cost_micros"].as_i64().expect("cost_micros");
                    assert_eq!(cost, if target == "steady" { STEADY_COST } else { FLAKY_COST }, "{text}");
                    tally.reported_cost += cost;
                }
                tally.ok += 1;
                tally.failovers += failovers.parse::<u64>().expect("X-Shield-Failovers");
                *tally.by_target.entry(target).or_default() += 1;
            }
        }));
    }
    let mut total = Tally::default();
    for worker in workers {
        total.merge(worker.await.expect("worker"));
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_requests_through_two_proxies_reconcile_exactly() {
    let requests: usize = std::env::var("SHIELD_LOAD_REQUESTS").ok().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let mut stack = Stack::start_with(StackOptions { flush_s: 1, ..Default::default() }).await;
    let second = stack.extra_proxy().await;
    let proxies = vec![stack.proxy.clone(), second.clone()];
    stack
        .mock_target(
            "flaky",
            "cycle:503-200-200-503-200-200-200-503-200-200;usage:100-50;chunks:2",
            json!({"price": {"input_per_mtok": 2.5, "output_per_mtok": 10}}),
        )
        .await;
    stack
        .mock_target(
            "steady",
            "usage:1000-500;chunks:2",
            json!({"price": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}}),
        )
        .await;
    stack.put_route("mixed", json!({"targets": ["flaky", "steady"]})).await;
    stack.put_route("direct", json!({"targets": ["steady"]})).await;
    let (key, _) = stack.key(None).await;
    // Until both proxies serve both routes; what succeeded counts like any other request.
    let mut total = Tally::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let probe = drive(&proxies, &key, 0..12).await;
        let failed = probe.failed;
        total.merge(Tally { failed: 0, ..probe });
        if failed == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the routes never reached both proxies");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let pids = [stack.pid("proxy"), stack.pid(&format!("proxy-{second}"))];
    total.merge(drive(&proxies, &key, 0..2_000).await);
    let rss_before: Vec<u64> = pids.iter().map(|p| rss_kib(*p)).collect();
    let started = Instant::now();
    let main = drive(&proxies, &key, 2_000..2_000 + requests).await;
    let elapsed = started.elapsed();
    let rss_after: Vec<u64> = pids.iter().map(|p| rss_kib(*p)).collect();
    eprintln!(
        "load: {requests} requests in {:.1} s ({:.0}/s), {} streamed, {} failovers; RSS KiB before {:?} after {:?}",
        elapsed.as_secs_f64(),
        requests as f64 / elapsed.as_secs_f64(),
        main.streams,
        main.failovers,
        rss_before,
        rss_after
    );
    assert_eq!(total.failed + main.failed, 0, "no request failed: the 30 % of flaky's answers failed over");
    assert_eq!(main.ok, requests as u64);
    total.merge(main);

    // Everything sent, including the warm-up and the readiness probes.
    let mock_calls = |id: &'static str| {
        let (client, mock) = (stack.client.clone(), stack.mock.clone());
        async move {
            let v: Value =
                client.get(format!("http://{mock}/_mock/calls?id={id}")).send().await.unwrap().json().await.unwrap();
            v["calls"].as_u64().unwrap()
        }
    };
    let (flaky_calls, steady_calls) = (mock_calls("flaky").await, mock_calls("steady").await);
    let keys = RedisKeys::new(stack.prefix.clone());
    let redis = redis::Client::open(redis_url()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let usage_keys: Vec<String> =
        redis::cmd("KEYS").arg(keys.usage(&stack.tenant, "*")).query_async(&mut conn).await.unwrap();
    let rows = eventually(30, "the proxies to flush every call", || {
        let (mut conn, usage_keys) = (conn.clone(), usage_keys.clone());
        let (keys, tenant) = (keys.clone(), stack.tenant.clone());
        async move {
            let mut usage_keys = usage_keys;
            if usage_keys.is_empty() {
                usage_keys = redis::cmd("KEYS").arg(keys.usage(&tenant, "*")).query_async(&mut conn).await.ok()?;
            }
            let mut rows: BTreeMap<String, shield_core::usage::UsageRow> = BTreeMap::new();
            for key in usage_keys {
                let fields: Vec<(String, String)> = redis::cmd("HGETALL").arg(key).query_async(&mut conn).await.ok()?;
                for (field, json) in fields {
                    rows.entry(field).or_default().add(&serde_json::from_str(&json).ok()?);
                }
            }
            let calls: u64 = rows.values().map(|r| r.calls).sum();
            (calls == flaky_calls + steady_calls).then_some(rows)
        }
    })
    .await;
    let per_target = |target: &str| {
        rows.iter().filter(|(f, _)| f.ends_with(&format!("|{target}"))).map(|(_, r)| *r).fold(
            shield_core::usage::UsageRow::default(),
            |mut a, r| {
                a.add(&r);
                a
            },
        )
    };
    let (flaky, steady) = (per_target("flaky"), per_target("steady"));
    assert_eq!((flaky.calls, steady.calls), (flaky_calls, steady_calls), "Σ calls per target = what the mock received");
    assert_eq!(flaky.ok + steady.ok, total.ok, "Σ ok = the requests answered, which are all the requests sent");
    assert_eq!(
        flaky.failovers_from + steady.failovers_from,
        total.failovers,
        "Σ failovers_from = the failovers responses reported"
    );
    assert_eq!(flaky.errors, flaky.failovers_from, "every flaky error moved on to steady");
    assert_eq!(steady.errors, 0);
    let cycle_failures = |calls: u64| 3 * (calls / 10) + [0, 3, 7].iter().filter(|i| **i < calls % 10).count() as u64;
    assert_eq!(flaky.errors, cycle_failures(flaky.calls), "exactly 30 % of flaky's calls failed");
    assert_eq!(total.by_target.values().sum::<u64>(), total.ok);
    assert_eq!(total.by_target.get("steady").copied().unwrap_or(0), steady.ok);
    assert_eq!(flaky.cost_micros, flaky.ok as i64 * FLAKY_COST);
    assert_eq!(steady.cost_micros, steady.ok as i64 * STEADY_COST);

    let month = chrono::Utc::now().format("%Y%m").to_string();
    let spend: BTreeMap<String, i64> =
        redis::cmd("HGETALL").arg(keys.spend(&stack.tenant, &month)).query_async(&mut conn).await.unwrap();
    let stored_spend: i64 = spend.values().sum();
    assert_eq!(stored_spend, flaky.cost_micros + steady.cost_micros, "spend = Σ usage cost");
    assert_eq!(stored_spend, total.reported_cost, "spend = Σ per-call costs, to the micro-dollar");
    for (before, after) in rss_before.iter().zip(&rss_after) {
        assert!(*after < before + 64 * 1024, "RSS grew from {before} KiB to {after} KiB");
    }
}
