//! The leaser: a background task that keeps every active bucket supplied from the fleet's
//! windows in Redis and gives back what idle buckets hold, and what busy ones hold beyond
//! their block (settled reservations' surplus). It wakes when a request leaves a
//! bucket low, and every 100 ms for expiries, probes and give-backs. All the leases it needs
//! go out in one pipelined round trip (one per tenant in a Redis Cluster), one script call
//! each ([`LeaseStore`]); a store that fails or does not answer within 500 ms puts those
//! buckets offline (they admit their share of the limit from memory until a probe succeeds).

use std::sync::Arc;
use std::time::Duration;

use shield_core::limits::{GIVE_BACK_SCRIPT, LEASE_SCRIPT, LeaseAsk, LeaseReply, WINDOW_MS};

use super::{Entry, Limiter, now_ms};

const TICK: Duration = Duration::from_millis(100);
const STORE_TIMEOUT: Duration = Duration::from_millis(500);

/// One lease to ask for.
pub struct LeaseCall<'a> {
    pub entry: &'a Entry,
    pub ask: LeaseAsk,
    pub limit: u64,
}

/// Where the fleet's windows live. One implementation per backend ([`RedisLeases`]: a single
/// Redis or a Redis Cluster, behind [`shield_store::Pool`]).
pub trait LeaseStore: Send + Sync + 'static {
    /// Every lease in `calls`, in order; `Err` when the store did not answer.
    fn lease(
        &self,
        process: &str,
        calls: &[LeaseCall<'_>],
    ) -> impl Future<Output = Result<Vec<LeaseReply>, String>> + Send;

    /// Gives units back to leases of `entry`'s window (`(seq, units)` each); the units
    /// given back.
    fn give_back(
        &self,
        process: &str,
        entry: &Entry,
        leases: &[(u64, u64)],
    ) -> impl Future<Output = Result<u64, String>> + Send;
}

/// The windows in Redis: one server, or a Redis Cluster where each tenant's windows share the
/// tenant's slot (the `{tenant}` hash tag).
pub struct RedisLeases {
    pub pool: shield_store::Pool,
    lease: redis::Script,
    give_back: redis::Script,
    keys: shield_core::keys::RedisKeys,
}

impl RedisLeases {
    pub fn new(pool: shield_store::Pool, keys: shield_core::keys::RedisKeys) -> RedisLeases {
        RedisLeases {
            pool,
            lease: redis::Script::new(LEASE_SCRIPT),
            give_back: redis::Script::new(GIVE_BACK_SCRIPT),
            keys,
        }
    }

    /// One pipeline: the script loaded, then one call per lease of `group` (indexes in `calls`).
    async fn lease_pipeline(
        &self,
        conn: &mut shield_store::Connection,
        process: &str,
        calls: &[LeaseCall<'_>],
        group: &[usize],
    ) -> Result<Vec<LeaseReply>, String> {
        let mut pipe = redis::pipe();
        // Loaded every time: cheap beside the round trip, and a flushed script cache (a
        // restarted or failed-over Redis) never fails a lease. `SCRIPT LOAD` names no key, so
        // in a cluster the pipeline goes to the node of the calls' slot: the script is loaded
        // where it runs (a `SCRIPT LOAD` alone would go to any node).
        pipe.load_script(&self.lease).ignore();
        let invocations: Vec<redis::ScriptInvocation<'_>> = group
            .iter()
            .filter_map(|&i| calls.get(i))
            .map(|call| {
                let mut invocation = self.lease.prepare_invoke();
                for key in window_keys(call.entry) {
                    invocation.key(key);
                }
                invocation
                    .key(self.keys.rate_processes(&call.entry.tenant))
                    .arg(call.limit)
                    .arg(WINDOW_MS)
                    .arg(call.ask.want)
                    .arg(call.ask.need)
                    .arg(process)
                    .arg(call.ask.seq);
                invocation
            })
            .collect();
        for invocation in &invocations {
            pipe.invoke_script(invocation);
        }
        let replies: Vec<Vec<i64>> = pipe.query_async(conn).await.map_err(|e| e.to_string())?;
        replies.iter().map(|r| LeaseReply::decode(r).ok_or_else(|| "malformed lease reply".to_string())).collect()
    }
}

fn window_keys(entry: &Entry) -> [String; 3] {
    [entry.window.clone(), format!("{}:units", entry.window), format!("{}:sum", entry.window)]
}

/// Which calls share a pipeline: all of them on a single server; one tenant's in a cluster,
/// where a pipeline must stay within one slot.
fn pipeline_groups(calls: &[LeaseCall<'_>], cluster: bool) -> Vec<Vec<usize>> {
    if !cluster {
        return vec![(0..calls.len()).collect()];
    }
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        match groups.iter_mut().find(|(tenant, _)| *tenant == call.entry.tenant) {
            Some((_, group)) => group.push(i),
            None => groups.push((&call.entry.tenant, vec![i])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

impl LeaseStore for RedisLeases {
    async fn lease(&self, process: &str, calls: &[LeaseCall<'_>]) -> Result<Vec<LeaseReply>, String> {
        let mut conn = self.pool.get().await.map_err(|e| e.to_string())?;
        let mut replies: Vec<Option<LeaseReply>> = calls.iter().map(|_| None).collect();
        for group in pipeline_groups(calls, self.pool.is_cluster()) {
            let answers = self.lease_pipeline(&mut conn, process, calls, &group).await?;
            if answers.len() != group.len() {
                return Err("short reply".into());
            }
            for (i, reply) in group.into_iter().zip(answers) {
                if let Some(slot) = replies.get_mut(i) {
                    *slot = Some(reply);
                }
            }
        }
        replies.into_iter().map(|r| r.ok_or_else(|| "short reply".to_string())).collect()
    }

    async fn give_back(&self, process: &str, entry: &Entry, leases: &[(u64, u64)]) -> Result<u64, String> {
        let mut conn = self.pool.get().await.map_err(|e| e.to_string())?;
        let [window, units_key, sum] = window_keys(entry);
        let mut invocation = self.give_back.key(window);
        invocation.key(units_key).key(sum);
        for (seq, units) in leases {
            invocation.arg(format!("{process}:{seq}")).arg(*units);
        }
        invocation.invoke_async(&mut conn).await.map_err(|e| e.to_string())
    }
}

/// Runs the leaser until the process stops.
pub fn spawn<S: LeaseStore>(limiter: Arc<Limiter>, store: S, process: String) {
    tokio::spawn(async move {
        let mut last_sweep = now_ms();
        let mut logged_down = false;
        loop {
            tokio::select! {
                _ = limiter.wake.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
            let entries = limiter.entries();
            let now = now_ms();
            let mut asks = Vec::new();
            let mut returns = Vec::new();
            for entry in &entries {
                let mut bucket = entry.bucket.lock();
                if let Some(ask) = bucket.lease_wanted(now) {
                    asks.push((entry.clone(), ask, bucket.limit()));
                } else {
                    let back = bucket.give_back(now);
                    if !back.is_empty() {
                        returns.push((entry.clone(), back));
                    }
                }
            }
            if !asks.is_empty() {
                let calls: Vec<LeaseCall<'_>> =
                    asks.iter().map(|(entry, ask, limit)| LeaseCall { entry, ask: *ask, limit: *limit }).collect();
                let result = tokio::time::timeout(STORE_TIMEOUT, store.lease(&process, &calls)).await;
                let now = now_ms();
                match result {
                    Ok(Ok(replies)) if replies.len() == calls.len() => {
                        if logged_down {
                            tracing::info!("rate-limit leases are answered again");
                            logged_down = false;
                        }
                        for (call, reply) in calls.iter().zip(replies) {
                            call.entry.bucket.lock().leased(call.ask, reply, now);
                        }
                    }
                    failed => {
                        if !logged_down {
                            let why = match failed {
                                Ok(Err(why)) => why,
                                Ok(Ok(_)) => "short reply".into(),
                                Err(_) => "timed out".into(),
                            };
                            tracing::warn!(error = %why, "rate-limit leases failed; admitting each limit's share from memory");
                            logged_down = true;
                        }
                        for call in &calls {
                            call.entry.bucket.lock().lease_failed(now);
                        }
                    }
                }
            }
            if !asks.is_empty() {
                limiter.leased.notify_waiters();
            }
            for (entry, leases) in returns {
                match tokio::time::timeout(STORE_TIMEOUT, store.give_back(&process, &entry, &leases)).await {
                    Ok(Ok(back)) => entry.bucket.lock().returned(back),
                    // Not given back: held again, to give back at a later turn (dropped, the
                    // units would stay counted in the fleet's window for nothing).
                    _ => entry.bucket.lock().give_back_failed(&leases),
                }
            }
            if now.saturating_sub(last_sweep) > WINDOW_MS {
                last_sweep = now;
                limiter.forget_idle(|bucket| bucket.idle_for(now) > 2 * WINDOW_MS && bucket.is_settled());
            }
        }
    });
}
