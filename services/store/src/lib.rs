//! shield-store: how the admin and the proxy reach Redis. `REDIS_URL` names one server or a
//! Redis Cluster ([`url`]); either way callers get a [`Pool`] whose [`Connection`] is a
//! `redis::aio::ConnectionLike`, so every command, script and pipeline is written once.
//!
//! The cluster side is the `redis` crate's cluster client (slots learned from the cluster,
//! `MOVED`/`ASK` followed, reconnects and slot refreshes after a failover) pooled by
//! deadpool-redis. What it cannot do, callers must not ask: a pipeline or a script whose keys
//! span two slots. Every tenant key carries the `{tenant}` hash tag, so one tenant's commands
//! share a slot; a batch over several tenants is one pipeline per tenant ([`Pool::is_cluster`]).
//!
//! Never logs or returns a URL with its credentials: [`redacted`] is what a log line may show.

mod url;

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

pub use deadpool_redis::PoolError;
pub use url::{Target, parse, redacted};

const POOL_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest one cluster command may take, redirects and retries included. A single
/// server's connection has the `redis` crate's own bound (500 ms per answer); the cluster
/// client has none by default, and during a failover it would retry for minutes.
pub const CLUSTER_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on the `CLUSTER NODES` look-up behind [`Pool::subscribe_urls`].
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(1);

/// A pool of connections to one Redis server or to a Redis Cluster. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Inner,
    /// The URL of each node `REDIS_URL` named (one for a single server).
    seeds: Vec<String>,
}

#[derive(Clone)]
enum Inner {
    Single(deadpool_redis::Pool),
    Cluster(deadpool_redis::cluster::Pool),
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("cluster", &self.is_cluster()).field("nodes", &self.seeds.len()).finish()
    }
}

fn pool_config(max_size: usize) -> deadpool_redis::PoolConfig {
    deadpool_redis::PoolConfig {
        max_size,
        timeouts: deadpool_redis::Timeouts {
            wait: Some(POOL_TIMEOUT),
            create: Some(POOL_TIMEOUT),
            recycle: Some(POOL_TIMEOUT),
        },
        ..Default::default()
    }
}

impl Pool {
    /// A pool of at most `max_size` connections for `REDIS_URL`. Connects lazily: Redis may be
    /// down when this is built.
    pub fn open(url: &str, max_size: usize) -> Result<Pool, String> {
        let invalid = |e: &dyn std::fmt::Display| format!("invalid REDIS_URL ({}): {e}", redacted(url));
        match url::parse(url).map_err(|e| invalid(&e))? {
            Target::Single(url) => {
                let mut cfg = deadpool_redis::Config::from_url(url.clone());
                cfg.pool = Some(pool_config(max_size));
                let pool = cfg.create_pool(Some(deadpool_redis::Runtime::Tokio1)).map_err(|e| invalid(&e))?;
                Ok(Pool { inner: Inner::Single(pool), seeds: vec![url] })
            }
            Target::Cluster(nodes) => {
                let mut cfg = deadpool_redis::cluster::Config::from_urls(nodes.clone());
                cfg.pool = Some(pool_config(max_size));
                let pool = cfg.create_pool(Some(deadpool_redis::Runtime::Tokio1)).map_err(|e| invalid(&e))?;
                Ok(Pool { inner: Inner::Cluster(pool), seeds: nodes })
            }
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.inner, Inner::Cluster(_))
    }

    /// A connection from the pool (a fresh one when none is idle).
    pub async fn get(&self) -> Result<Connection, PoolError> {
        Ok(match &self.inner {
            Inner::Single(pool) => Connection::Single(pool.get().await?),
            Inner::Cluster(pool) => Connection::Cluster(pool.get().await?),
        })
    }

    /// Where a subscriber may listen for classic `PUBLISH` messages: the server itself, or in
    /// a cluster every node it reports healthy followed by the seeds (a cluster propagates
    /// every `PUBLISH` to all its nodes, so any one will do; when it goes away, take another).
    pub async fn subscribe_urls(&self) -> Vec<String> {
        let Inner::Cluster(_) = &self.inner else { return self.seeds.clone() };
        let mut urls = Vec::new();
        if let Ok(Ok(nodes)) = tokio::time::timeout(DISCOVERY_TIMEOUT, self.cluster_nodes()).await
            && let Some(template) = self.seeds.first()
        {
            urls.extend(nodes.iter().filter_map(|addr| url::with_address(template, addr)));
        }
        for seed in &self.seeds {
            if !urls.contains(seed) {
                urls.push(seed.clone());
            }
        }
        urls
    }

    /// `host:port` of every node `CLUSTER NODES` does not flag as failing or unreachable.
    async fn cluster_nodes(&self) -> RedisResult<Vec<String>> {
        let mut conn = self.get().await.map_err(|e| RedisError::from((ErrorKind::Io, "pool", e.to_string())))?;
        let text: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await?;
        Ok(healthy_nodes(&text))
    }

    /// The `run_id` of every server (each master of a cluster), sorted and joined: it changes
    /// when a server restarts or a replica takes a master's place, i.e. whenever Redis may have
    /// lost data. `None` when Redis (or any master) cannot be asked.
    pub async fn identity(&self) -> Option<String> {
        let mut conn = self.get().await.ok()?;
        let info: Value = redis::cmd("INFO").arg("server").query_async(&mut conn).await.ok()?;
        let mut ids = run_ids(&info)?;
        ids.sort();
        Some(ids.join(","))
    }
}

/// `run_id`s in an `INFO server` answer: one server's text, or a cluster's map of node → text.
fn run_ids(info: &Value) -> Option<Vec<String>> {
    let text_id = |value: &Value| -> Option<String> {
        let text = match value {
            Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            Value::SimpleString(text) => text.clone(),
            Value::VerbatimString { text, .. } => text.clone(),
            _ => return None,
        };
        text.lines().find_map(|l| l.strip_prefix("run_id:")).map(|id| id.trim().to_string())
    };
    match info {
        Value::Map(nodes) => nodes.iter().map(|(_, value)| text_id(value)).collect(),
        single => text_id(single).map(|id| vec![id]),
    }
}

fn healthy_nodes(cluster_nodes: &str) -> Vec<String> {
    cluster_nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (address, flags) = (fields.get(1)?, fields.get(2)?);
            if flags.split(',').any(|f| matches!(f, "fail" | "fail?" | "handshake" | "noaddr")) {
                return None;
            }
            let addr = address.split(['@', ',']).next()?;
            let (host, port) = addr.rsplit_once(':')?;
            (!host.is_empty() && port != "0").then(|| addr.to_string())
        })
        .collect()
}

/// A pooled connection to the server or the cluster; returned to the pool on drop.
pub enum Connection {
    Single(deadpool_redis::Connection),
    Cluster(deadpool_redis::cluster::Connection),
}

fn timed_out() -> RedisError {
    RedisError::from((ErrorKind::Io, "Redis Cluster did not answer in time"))
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(conn) => conn.req_packed_command(cmd),
            // Dropping the request on time-out also stops the cluster client's retries of it.
            Connection::Cluster(conn) => Box::pin(async move {
                tokio::time::timeout(CLUSTER_COMMAND_TIMEOUT, conn.req_packed_command(cmd))
                    .await
                    .unwrap_or_else(|_| Err(timed_out()))
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(conn) => Box::pin(async move {
                tokio::time::timeout(CLUSTER_COMMAND_TIMEOUT, conn.req_packed_commands(pipeline, offset, count))
                    .await
                    .unwrap_or_else(|_| Err(timed_out()))
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(conn) => conn.get_db(),
            Connection::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_skips_failing_and_unknown_addresses() {
        let text = "\
a1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:30002@40002,redis-b master,fail - 0 0 2 connected
c3 127.0.0.1:30003@40003 slave a1 0 0 1 connected
d4 :0@0 master,noaddr - 0 0 0 disconnected
e5 127.0.0.1:30005@40005 master,fail? - 0 0 3 connected 5461-10922
";
        assert_eq!(healthy_nodes(text), vec!["127.0.0.1:30001", "127.0.0.1:30003"]);
    }

    #[test]
    fn run_ids_of_one_server_or_every_master() {
        let info =
            |id: &str| Value::BulkString(format!("# Server\r\nredis_version:7.0\r\nrun_id:{id}\r\n").into_bytes());
        assert_eq!(run_ids(&info("abc")).unwrap(), vec!["abc"]);
        let map = Value::Map(vec![
            (Value::BulkString(b"n1".to_vec()), info("x")),
            (Value::BulkString(b"n2".to_vec()), info("y")),
        ]);
        assert_eq!(run_ids(&map).unwrap(), vec!["x", "y"]);
        assert_eq!(run_ids(&Value::Nil), None);
    }

    #[test]
    fn a_pool_is_built_for_either_form_without_connecting() {
        assert!(!Pool::open("redis://127.0.0.1:1/0", 4).unwrap().is_cluster());
        assert!(Pool::open("redis+cluster://127.0.0.1:1,127.0.0.1:2", 4).unwrap().is_cluster());
        let err = Pool::open("redis+cluster://user:secret@", 4).unwrap_err();
        assert!(err.contains("invalid REDIS_URL") && !err.contains("secret"), "{err}");
    }
}
