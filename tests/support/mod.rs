//! Test support: a database per test, unique Redis prefixes, free ports, a private Redis
//! server for outage tests, child processes that are always killed, and an in-process admin
//! server over real HTTP. Everything is safe to run in parallel and twice in a row.

pub mod admin;
pub mod agents;
pub mod clouds;
pub mod cluster;
pub mod evidence;
pub mod logs;
pub mod process;
pub mod stack;
pub mod webhook;

use std::net::TcpListener;

/// Postgres server URL without a database (trust auth here; CI sets the same).
pub fn postgres_base() -> String {
    std::env::var("SHIELD_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

pub fn redis_url() -> String {
    std::env::var("SHIELD_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

/// A port that was free a moment ago, for a child process to listen on. Drawn at random below
/// the kernel's ephemeral range (32768 and up on Linux): a port from that range (what binding
/// port 0 returns) can be taken by any outgoing connection's local end before the child binds
/// it — under the load tests that happened, and a test then talked to another test's server.
/// A port is handed out once per test process: tests run in parallel threads, and two stacks
/// drawn the same still-unbound port raced for it (the loser's admin then answered as the
/// winner's proxy, and a test failed on another stack's 404).
pub fn free_port() -> u16 {
    use rand::Rng;
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = rand::rng();
    for _ in 0..200 {
        let port = rng.random_range(20_000..32_000);
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A database name reserved for one test; the database (if anything created it) is dropped
/// when this is dropped, even on panic.
pub struct DbName {
    pub name: String,
    pub url: String,
    base: String,
}

impl DbName {
    pub fn reserve() -> DbName {
        DbName::reserve_on(&postgres_base())
    }

    /// On another server (e.g. a [`process::PrivatePostgres`]).
    pub fn reserve_on(base: &str) -> DbName {
        let name = unique("shield_t_");
        DbName { url: format!("{base}/{name}"), name, base: base.to_string() }
    }
}

/// A database of its own, migrated; dropped when the value is dropped (even on panic).
pub struct TestDb {
    pub url: String,
    pub pool: sqlx::PgPool,
    _name: DbName,
}

impl TestDb {
    /// Creates an empty database (no migrations).
    pub async fn empty() -> TestDb {
        let name = DbName::reserve();
        let admin_url = format!("{}/postgres", postgres_base());
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin_url)
            .await
            .expect("Postgres must be running for the tests");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{}\"", name.name)))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let pool = shield_admin::connect_db(&name.url).await.expect("connect test database");
        TestDb { url: name.url.clone(), pool, _name: name }
    }

    pub async fn migrated() -> TestDb {
        let db = TestDb::empty().await;
        shield_admin::MIGRATOR.run(&db.pool).await.expect("migrations apply");
        db
    }
}

impl Drop for DbName {
    fn drop(&mut self) {
        let name = self.name.clone();
        let admin_url = format!("{}/postgres", self.base);
        // Drop runs inside the test's runtime, which cannot be blocked on; use a thread.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async {
                if let Ok(mut conn) = <sqlx::PgConnection as sqlx::Connection>::connect(&admin_url).await {
                    let _ =
                        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")))
                            .execute(&mut conn)
                            .await;
                }
            });
        })
        .join();
    }
}

/// Every Redis key under `prefix`, with its value as text (strings) or field=value lines.
pub async fn redis_dump(prefix: &str) -> Vec<(String, String)> {
    redis_dump_from(&redis_url(), prefix).await.expect("Redis must be running for the tests")
}

/// A connection to the Redis at `url`: one server, or a cluster (`redis+cluster://…`), where
/// each command goes to the node of its key.
pub async fn redis_conn(url: &str) -> shield_store::Connection {
    let pool = shield_store::Pool::open(url, 2).expect("a valid Redis URL");
    pool.get().await.expect("Redis answers")
}

/// A pub/sub connection subscribed to `channel` at `url` (in a cluster, on one node: every
/// node hears every PUBLISH).
pub async fn redis_subscribe(url: &str, channel: &str) -> redis::aio::PubSub {
    let pool = shield_store::Pool::open(url, 2).expect("a valid Redis URL");
    let node = pool.subscribe_urls().await.into_iter().next().expect("a node");
    let mut pubsub = redis::Client::open(node).unwrap().get_async_pubsub().await.expect("Redis answers");
    pubsub.subscribe(channel).await.unwrap();
    pubsub
}

/// [`redis_dump`] from the Redis at `url` (a cluster: `KEYS` on every master, combined).
pub async fn redis_dump_from(url: &str, prefix: &str) -> redis::RedisResult<Vec<(String, String)>> {
    let pool =
        shield_store::Pool::open(url, 2).map_err(|e| redis::RedisError::from((redis::ErrorKind::Io, "pool", e)))?;
    let mut conn =
        pool.get().await.map_err(|e| redis::RedisError::from((redis::ErrorKind::Io, "pool", e.to_string())))?;
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut conn).await?;
    let mut out = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await?;
        let value = match kind.as_str() {
            "string" => redis::cmd("GET").arg(&key).query_async::<String>(&mut conn).await.unwrap_or_default(),
            "hash" => {
                let map: Vec<(String, String)> =
                    redis::cmd("HGETALL").arg(&key).query_async(&mut conn).await.unwrap_or_default();
                map.into_iter().map(|(k, v)| format!("{k}={v}\n")).collect()
            }
            "stream" => {
                let entries: redis::Value =
                    redis::cmd("XRANGE").arg(&key).arg("-").arg("+").query_async(&mut conn).await?;
                let mut text = String::new();
                flatten(&entries, &mut text);
                text
            }
            "list" => {
                let items: Vec<String> = redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query_async(&mut conn).await?;
                items.join("\n")
            }
            "set" => {
                let items: Vec<String> = redis::cmd("SMEMBERS").arg(&key).query_async(&mut conn).await?;
                items.join("\n")
            }
            other => format!("<{other}>"),
        };
        out.push((key, value));
    }
    Ok(out)
}

/// Every string inside a Redis reply, one per line (stream entries are nested arrays).
fn flatten(value: &redis::Value, out: &mut String) {
    match value {
        redis::Value::BulkString(bytes) => {
            out.push_str(&String::from_utf8_lossy(bytes));
            out.push('\n');
        }
        redis::Value::SimpleString(text) => {
            out.push_str(text);
            out.push('\n');
        }
        redis::Value::Array(items) | redis::Value::Set(items) => items.iter().for_each(|item| flatten(item, out)),
        redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        other => {
            out.push_str(&format!("{other:?}"));
            out.push('\n');
        }
    }
}

/// Polls `check` until it returns `Some`, or panics after `seconds` naming `what`.
pub async fn eventually<T, F, Fut>(seconds: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(seconds);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {seconds} s waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
