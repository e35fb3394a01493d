//! Snapshot publishing: every committed write reaches `gw_snapshot:{tenant}` and `gw_config`;
//! a write while Redis is down still succeeds and is published when Redis returns; a stale
//! publish never overwrites a newer snapshot.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use shield_core::snapshot::Snapshot;
use shield_e2e::admin::{Admin, db_version, public_target};
use shield_e2e::eventually;
use shield_e2e::process::PrivateRedis;
use shield_e2e::stack::{Stack, StackOptions, chat_body};

const T: &str = "/v1/tenant/me/gateway/targets";

#[actix_web::test]
async fn each_write_publishes_a_versioned_digest_snapshot_and_announces_it() {
    publishes_and_announces(&shield_e2e::redis_url()).await;
}

/// The same on a Redis Cluster (issue 20): the snapshot script on the tenant's slot, its
/// PUBLISH heard on another node.
#[actix_web::test]
async fn each_write_publishes_and_announces_on_a_redis_cluster() {
    publishes_and_announces(&shield_e2e::cluster::shared().url()).await;
}

async fn publishes_and_announces(redis_url: &str) {
    let admin = Admin::start_with_redis(redis_url).await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let mut pubsub = shield_e2e::redis_subscribe(redis_url, &admin.keys.config_channel()).await;

    assert_eq!(admin.put(&format!("{T}/a"), &token, public_target("m")).await.0, StatusCode::CREATED);
    let message: String = tokio::time::timeout(Duration::from_secs(5), pubsub.on_message().next())
        .await
        .unwrap()
        .unwrap()
        .get_payload()
        .unwrap();
    let message: Value = serde_json::from_str(&message).unwrap();
    assert_eq!(message, json!({"tenant": slug, "version": db_version(&admin, &slug).await}));

    let snapshot = admin.snapshot(&slug).await.expect("snapshot in Redis");
    assert_eq!(snapshot["version"], db_version(&admin, &slug).await);
    assert_eq!(snapshot["targets"]["a"]["model"], "m");
    let parsed: Snapshot = serde_json::from_value(snapshot).unwrap();
    assert_eq!(parsed.digest, parsed.compute_digest(), "the digest covers the content");

    let before = parsed.version;
    admin.put("/v1/tenant/me/gateway/routes/smart", &token, json!({"targets": ["a"]})).await;
    let snapshot = admin.snapshot(&slug).await.unwrap();
    assert!(snapshot["version"].as_i64().unwrap() > before);
    assert_eq!(snapshot["routes"]["smart"]["targets"], json!(["a"]));
}

#[actix_web::test]
async fn a_stale_publish_never_overwrites_a_newer_snapshot() {
    let admin = Admin::start().await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    let client = redis::Client::open(admin.redis.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(admin.keys.snapshot(&slug))
        .arg(r#"{"version": 1000000, "marker": "newer"}"#)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(admin.put(&format!("{T}/a"), &token, public_target("m")).await.0, StatusCode::CREATED);
    assert_eq!(admin.snapshot(&slug).await.unwrap()["marker"], "newer");
}

#[actix_web::test]
async fn writes_while_redis_is_down_succeed_and_converge_when_it_returns() {
    let mut redis = PrivateRedis::start();
    let admin = Admin::start_with_redis(&redis.url()).await;
    let (slug, ..) = admin.tenant().await;
    let token = admin.owner(&slug);
    assert_eq!(admin.put(&format!("{T}/a"), &token, public_target("m")).await.0, StatusCode::CREATED);
    let (_, key) = admin.post("/v1/tenant/me/keys", &token, json!({"name": "k"})).await;
    let key_hash = shield_core::snapshot::key_hash(key["key"].as_str().unwrap());

    redis.stop();
    let (status, body) = admin.put(&format!("{T}/b"), &token, public_target("m2")).await;
    assert_eq!(status, StatusCode::CREATED, "Postgres is the truth; Redis being down does not fail the write: {body}");
    let (status, _) = admin.delete(&format!("/v1/tenant/me/keys/{}", key["id"].as_str().unwrap()), &token).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    redis.restart(); // comes back empty (no persistence): everything must be republished
    admin.state.publisher.clone().spawn(Duration::from_secs(30));
    let want = db_version(&admin, &slug).await;
    let snapshot = eventually(15, "the snapshot to be republished", || async {
        admin.snapshot(&slug).await.filter(|s| s["version"].as_i64() == Some(want))
    })
    .await;
    assert_eq!(snapshot["targets"]["b"]["model"], "m2");
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let record: String = redis::cmd("GET").arg(admin.keys.api_key(&key_hash)).query_async(&mut conn).await.unwrap();
    assert_eq!(serde_json::from_str::<Value>(&record).unwrap()["revoked"], true, "the revocation converged too");
}

#[actix_web::test]
async fn converge_republishes_only_lagging_tenants() {
    let mut redis = PrivateRedis::start();
    let admin = Admin::start_with_redis(&redis.url()).await;
    let (a, ..) = admin.tenant().await;
    let (b, ..) = admin.tenant().await;
    redis.stop();
    assert_eq!(admin.put(&format!("{T}/x"), &admin.owner(&a), public_target("m")).await.0, StatusCode::CREATED);
    redis.restart();
    let publisher = &admin.state.publisher;
    assert_eq!(publisher.converge().await.unwrap(), 2, "both tenants are missing from the new Redis");
    assert_eq!(publisher.converge().await.unwrap(), 0, "nothing lags any more");
    assert_eq!(admin.snapshot(&a).await.unwrap()["version"], db_version(&admin, &a).await);
    assert!(admin.snapshot(&b).await.is_some());
}

/// On a Redis Cluster (issue 20) the convergence check reads every tenant's snapshot from the
/// node of its slot, and the lost-data check sees every master.
#[actix_web::test]
async fn converge_works_across_the_nodes_of_a_redis_cluster() {
    let cluster = shield_e2e::cluster::shared();
    let admin = Admin::start_with_redis(&cluster.url()).await;
    let mut tenants = Vec::new();
    for _ in 0..6 {
        tenants.push(admin.tenant().await.0);
    }
    let masters: std::collections::BTreeSet<u16> =
        tenants.iter().map(|t| cluster.master_of(&admin.keys.snapshot(t))).collect();
    println!("6 tenants' snapshots on {} of the 3 masters", masters.len());
    let publisher = &admin.state.publisher;
    assert_eq!(publisher.converge().await.unwrap(), 6, "nothing was published yet");
    assert_eq!(publisher.converge().await.unwrap(), 0, "nothing lags any more");
    let mut conn = shield_e2e::redis_conn(&cluster.url()).await;
    for tenant in &tenants[..2] {
        let _: i64 = redis::cmd("DEL").arg(admin.keys.snapshot(tenant)).query_async(&mut conn).await.unwrap();
    }
    assert_eq!(publisher.converge().await.unwrap(), 2, "the two lost snapshots, wherever they lived");
    for tenant in &tenants {
        assert_eq!(admin.snapshot(tenant).await.unwrap()["version"], db_version(&admin, tenant).await);
    }
    let identity = admin.state.redis.identity().await.expect("every master answers INFO");
    assert_eq!(identity.split(',').count(), 3, "one run_id per master: {identity}");
}

/// A change reaches a running proxy through `gw_config` alone: the periodic refresh is an
/// hour away. Against one Redis and against a cluster (where the PUBLISH is sent to the
/// tenant's node and heard on whichever node the proxy listens to).
#[tokio::test]
async fn a_config_change_reaches_the_proxy_through_gw_config() {
    config_change_is_announced(StackOptions { cache_s: 3600, ..Default::default() }).await;
}

#[tokio::test]
async fn a_config_change_reaches_the_proxy_through_gw_config_on_a_redis_cluster() {
    config_change_is_announced(StackOptions { cache_s: 3600, ..StackOptions::on_cluster() }).await;
}

async fn config_change_is_announced(options: StackOptions) {
    let stack = Stack::start_with(options).await;
    stack.mock_target("a", "", json!({})).await;
    stack.mock_target("b", "", json!({})).await;
    stack.put_route("smart", json!({"targets": ["a"]})).await;
    let (key, _) = stack.key(None).await;
    let (status, headers, _) = stack.chat(&key, chat_body("smart"), &[]).await;
    assert_eq!((status, headers["x-shield-target"].to_str().unwrap()), (StatusCode::OK, "a"));
    let changed = std::time::Instant::now();
    stack.put_route("smart", json!({"targets": ["b"]})).await;
    eventually(5, "the proxy to route to b", || async {
        let (status, headers, _) = stack.chat(&key, chat_body("smart"), &[]).await;
        (status == StatusCode::OK && headers["x-shield-target"] == "b").then_some(())
    })
    .await;
    println!("the route change reached the proxy in {:?}", changed.elapsed());
}
