//! Faults in the stores under a running deployment (real binary, loopback only, bounded):
//! Postgres stopped (the admin answers 503 naming it, the data plane keeps serving), Redis
//! frozen in the middle of continuous traffic (no call fails or waits, no usage is lost or
//! counted twice) and the admin killed in the middle of a stream of writes (the snapshots
//! converge on what Postgres holds). Redis stopped and restarted, proxy SIGKILL/SIGTERM and
//! misbehaving upstreams are covered by publishing.rs, proxy_auth.rs, proxy_usage.rs,
//! proxy_routing.rs and proxy_streaming.rs.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use shield_core::keys::RedisKeys;
use shield_e2e::eventually;
use shield_e2e::process::{PrivatePostgres, PrivateRedis};
use shield_e2e::redis_url;
use shield_e2e::stack::{Stack, StackOptions, chat_body};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_postgres_stopped_the_admin_says_so_and_the_data_plane_keeps_serving() {
    let mut pg = PrivatePostgres::start();
    let stack = Stack::start_with(StackOptions { postgres_base: Some(pg.base()), ..Default::default() }).await;
    stack.mock_target("a", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    let (key, _) = stack.key(None).await;
    eventually(10, "the route to reach the proxy", || async {
        (stack.chat(&key, chat_body("smart"), &[]).await.0 == StatusCode::OK).then_some(())
    })
    .await;

    pg.stop();

    let started = std::time::Instant::now();
    let (status, body) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/targets", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["type"], "store_unavailable");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("Postgres is unavailable"), "{body}");
    assert!(started.elapsed().as_secs() < 10, "answered promptly, not hung: {:?}", started.elapsed());
    let (status, body) =
        stack.admin_call(Method::PUT, "/v1/tenant/me/gateway/routes/later", Some(json!({"targets": ["a"]}))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body["error"]["message"].as_str().unwrap().contains("the change was not made"), "{body}");
    let ready = stack.client.get(format!("http://{}/readyz", stack.admin)).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let login = stack
        .client
        .post(format!("http://{}/v1/auth/login", stack.admin))
        .json(&json!({"email": stack.owner_email, "password": stack.owner_password}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::SERVICE_UNAVAILABLE, "a login cannot be checked, and says why");
    let portal = stack
        .client
        .get(format!("http://{}/portal/targets", stack.admin))
        .header("cookie", format!("shield_session={}", stack.token()))
        .send()
        .await
        .unwrap();
    assert_eq!(portal.status(), StatusCode::SERVICE_UNAVAILABLE);
    let page = portal.text().await.unwrap();
    assert!(page.contains("Temporarily unavailable") && page.contains("Postgres is unavailable"), "{page}");
    let live = stack.client.get(format!("http://{}/healthz", stack.admin)).send().await.unwrap();
    assert_eq!(live.status(), StatusCode::OK, "the admin process itself is alive");

    // The data plane never touches Postgres: every call still answers.
    for _ in 0..50 {
        let (status, headers, body) = stack.chat(&key, chat_body("smart"), &[]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(headers["x-shield-target"], "a");
    }
    assert_eq!(stack.received("a").await.len(), 51);

    pg.restart();
    eventually(30, "the admin to use Postgres again", || async {
        (stack.admin_call(Method::GET, "/v1/tenant/me/gateway/targets", None).await.0 == StatusCode::OK).then_some(())
    })
    .await;
    stack.put_route("later", json!({"targets": ["a"]})).await;
    eventually(10, "the new route to be served", || async {
        (stack.chat(&key, chat_body("later"), &[]).await.0 == StatusCode::OK).then_some(())
    })
    .await;
    let logs = stack.all_logs();
    assert!(logs.contains("Postgres unavailable"), "the outage is logged");
}

/// Target bodies of the writer: a distinct model per write, so the last write is recognisable.
/// Redis frozen (SIGSTOP: it holds every connection and answers nothing, as in a partition)
/// for 3 s in the middle of continuous traffic from four clients, then thawed. No call fails,
/// none waits for Redis (the request path reads memory), and once Redis answers again the
/// stored usage equals exactly the calls made — a flush that timed out while its script was
/// still queued in Redis must not be counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_mid_traffic_fails_no_call_and_loses_or_doubles_no_usage() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    let redis = PrivateRedis::start();
    let stack = Arc::new(Stack::start_with(StackOptions { redis_url: redis.url(), ..Default::default() }).await);
    let price = json!({"price": {"input_per_mtok": 2.5, "output_per_mtok": 10}});
    stack.mock_target("steady", "usage:10-20", price).await;
    stack.put_route("smart", json!({"targets": ["steady"]})).await;
    let (key, _) = stack.key(None).await;
    eventually(10, "the route to reach the proxy", || async {
        (stack.chat(&key, chat_body("smart"), &[]).await.0 == StatusCode::OK).then_some(())
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stack, key, stop) = (stack.clone(), key.clone(), stop.clone());
            tokio::spawn(async move {
                let mut calls = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let (status, _, body) = stack.chat(&key, chat_body("smart"), &[]).await;
                    calls.push((status, started.elapsed(), body));
                }
                calls
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.freeze();
    let ping = async {
        let client = redis::Client::open(redis.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await
    };
    assert!(tokio::time::timeout(Duration::from_millis(500), ping).await.is_err(), "frozen Redis still answers");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    redis.thaw();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut calls = Vec::new();
    for client in clients {
        calls.extend(client.await.unwrap());
    }

    let failed: Vec<_> = calls.iter().filter(|(status, _, _)| *status != StatusCode::OK).collect();
    assert!(failed.is_empty(), "{} of {} calls failed: {:?}", failed.len(), calls.len(), failed.first());
    // Not a speed target: a call that waited on Redis would take the store's 2 s timeout.
    let slowest = calls.iter().map(|(_, took, _)| *took).max().unwrap();
    assert!(slowest < Duration::from_millis(1900), "a call waited {slowest:?}: the request path touched Redis");
    let made = calls.len() as u64 + 1; // and the call that found the route
    let stored = eventually(20, "usage to reach Redis after the thaw", || async {
        let (status, body) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/usage?route=smart", None).await;
        let calls = body["rows"].as_array()?.iter().find(|r| r["target"] == "steady")?["calls"].as_u64()?;
        (status == StatusCode::OK && calls >= made).then_some(calls)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // any late double count would land now
    let (_, body) = stack.admin_call(Method::GET, "/v1/tenant/me/gateway/usage?route=smart", None).await;
    let settled = body["rows"][0]["calls"].as_u64().unwrap();
    println!(
        "redis frozen 3 s under traffic: {made} calls made, {stored} stored, {settled} after 3 s more; slowest call {slowest:?}"
    );
    assert_eq!((stored, settled), (made, made), "usage lost or counted twice");
    assert_eq!(body["rows"][0]["cost_micros"].as_i64().unwrap(), made as i64 * 225, "spend is exact too");
}

fn target(stack: &Stack, n: usize) -> Value {
    json!({"base_url": format!("http://{}/mock/id:w/v1", stack.mock), "model": format!("model-{n}"),
           "allow_private": true, "auth": {"mode": "none"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_admin_during_writes_leaves_snapshots_that_converge_on_postgres() {
    let mut stack = Stack::start_with(StackOptions::default()).await;
    let keys = RedisKeys::new(stack.prefix.clone());
    let writer = {
        let (client, admin, token) = (stack.client.clone(), stack.admin.clone(), stack.token().to_string());
        let bodies: Vec<Value> = (0..400).map(|n| target(&stack, n)).collect();
        tokio::spawn(async move {
            let mut accepted = Vec::new();
            for (n, body) in bodies.into_iter().enumerate() {
                let id = format!("t{}", n % 5);
                let sent = client
                    .put(format!("http://{admin}/v1/tenant/me/gateway/targets/{id}"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await;
                if sent.is_ok_and(|r| r.status().is_success()) {
                    accepted.push(n);
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            accepted
        })
    };
    for _ in 0..3 {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        stack.restart_admin().await;
    }
    let accepted = writer.await.unwrap();
    assert!(accepted.len() > 100, "writes went through between the restarts: {}", accepted.len());

    // What Postgres holds is the truth; the published snapshot must converge on it.
    let db = sqlx::PgPool::connect(&stack.db.url).await.unwrap();
    let version: i64 = sqlx::query_scalar("SELECT config_version FROM tenants WHERE slug = $1")
        .bind(&stack.tenant)
        .fetch_one(&db)
        .await
        .unwrap();
    let stored: Vec<(String, String)> = sqlx::query_as(
        "SELECT id, body->>'model' FROM targets WHERE tenant_id = (SELECT id FROM tenants WHERE slug = $1) ORDER BY id",
    )
    .bind(&stack.tenant)
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(stored.len(), 5);
    let redis = redis::Client::open(redis_url()).unwrap();
    let conn = redis.get_multiplexed_async_connection().await.unwrap();
    let snapshot: Value = eventually(40, "the snapshot to reach Postgres's version", || {
        let (mut conn, key) = (conn.clone(), keys.snapshot(&stack.tenant));
        async move {
            let text: Option<String> = redis::cmd("GET").arg(key).query_async(&mut conn).await.ok()?;
            let snapshot: Value = serde_json::from_str(&text?).ok()?;
            (snapshot["version"].as_i64() == Some(version)).then_some(snapshot)
        }
    })
    .await;
    let published: Vec<(String, String)> = stored
        .iter()
        .map(|(id, _)| (id.clone(), snapshot["targets"][id]["model"].as_str().unwrap_or("missing").to_string()))
        .collect();
    assert_eq!(published, stored, "the snapshot carries exactly what Postgres holds");
    let last = *accepted.last().unwrap();
    assert!(stored.iter().any(|(_, model)| *model == format!("model-{last}")), "the last accepted write is stored");
}
