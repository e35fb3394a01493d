//! The usage buffer: per `(tenant, day, route, target)` counters kept in memory and flushed to
//! Redis every `SHIELD_LLM_ROUTING_FLUSH_S` by [`crate::flush`] with one atomic merge per tenant.
//! Capped at 10,000 rows (seed §7): past that the oldest row is dropped and counted. A flush
//! that fails puts its rows back, so Redis being away delays usage but does not lose it.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

use shield_core::run::Attempt;
use shield_core::usage::UsageRow;

use crate::calendar::today;

pub const MAX_ROWS: usize = 10_000;

/// `(tenant, yyyymmdd, route, target)`.
pub type RowKey = (String, String, String, String);

/// The answer a call returned, for tokens and cost.
pub struct Answered<'a> {
    pub target: &'a str,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micros: i64,
    pub estimated: bool,
    pub stream_broken: bool,
}

/// One answer's tokens and cost, priced once: what a request paid an upstream for (a
/// non-streamed answer, each attempt of a resumed stream).
#[derive(Debug, Clone)]
pub struct Paid {
    pub target: String,
    pub usage: shield_core::usage::TokenUsage,
    pub cost_micros: i64,
    /// The usage was estimated (4 characters a token), not reported.
    pub estimated: bool,
}

impl Paid {
    pub fn new(
        target: &str,
        usage: shield_core::usage::TokenUsage,
        price: Option<&shield_core::target::Price>,
        estimated: bool,
    ) -> Paid {
        Paid { target: target.to_string(), usage, cost_micros: shield_core::usage::cost_of(price, &usage), estimated }
    }

    pub fn answered(&self, stream_broken: bool) -> Answered<'_> {
        Answered {
            target: &self.target,
            input_tokens: self.usage.input,
            output_tokens: self.usage.output,
            cost_micros: self.cost_micros,
            estimated: self.estimated,
            stream_broken,
        }
    }
}

#[derive(Default)]
pub struct UsageBuffer {
    rows: Mutex<Rows>,
    dropped: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct Rows {
    map: BTreeMap<RowKey, UsageRow>,
    /// Keys in insertion order of their first use (for dropping the oldest).
    order: Vec<RowKey>,
    /// Unflushed spend per `(tenant, route)` in month `yyyymm`: kept as rows change, so a
    /// budget check reads one entry instead of scanning up to 10,000 rows on every call.
    spend: HashMap<String, HashMap<String, (String, i64)>>,
}

impl Rows {
    /// Adds `micros` of row `key` to its route's unflushed spend when the row is of `month`
    /// (the current `yyyymm`, which the caller already has).
    fn add_spend(&mut self, month: &str, key: &RowKey, micros: i64) {
        let (tenant, day, route, _) = key;
        if micros == 0 || !day.starts_with(month) {
            return;
        }
        // Keys are cloned only for a (tenant, route) not seen since the last flush.
        let routes = match self.spend.get_mut(tenant) {
            Some(routes) => routes,
            None => self.spend.entry(tenant.clone()).or_default(),
        };
        let entry = match routes.get_mut(route) {
            Some(entry) => entry,
            None => routes.entry(route.clone()).or_insert_with(|| (month.to_string(), 0)),
        };
        if entry.0 != month {
            *entry = (month.to_string(), 0);
        }
        entry.1 += micros;
    }
}

impl UsageBuffer {
    /// Records a request a rate limit refused before routing (issue 18): a `rate_limited` row
    /// with no target, never a call.
    pub fn rate_limited(&self, tenant: &str, route: &str) {
        let row = UsageRow { rate_limited: 1, ..UsageRow::default() };
        let day = today();
        let key = (tenant.to_string(), day, route.to_string(), String::new());
        let mut state = self.rows.lock();
        match state.map.get_mut(&key) {
            Some(existing) => existing.add(&row),
            None => {
                state.order.push(key.clone());
                state.map.insert(key, row);
            }
        }
    }

    /// Records one routed call: every attempt counts a call to its target; a failed attempt
    /// followed by another is a failover from it; the answering target gets tokens and cost.
    pub fn record(&self, tenant: &str, route: &str, attempts: &[Attempt], answered: &[Answered<'_>]) {
        let day = today();
        let mut rows: BTreeMap<&str, UsageRow> = BTreeMap::new();
        for (i, attempt) in attempts.iter().enumerate() {
            let row = rows.entry(attempt.target.as_str()).or_default();
            row.calls += 1;
            row.latency_ms_sum += attempt.ms;
            row.stream_resumed += u64::from(attempt.resumed);
            if attempt.outcome == "ok" {
                row.ok += 1;
            } else {
                row.errors += 1;
                if shield_core::run::failed_over(attempts, i) {
                    row.failovers_from += 1;
                }
            }
        }
        for answer in answered {
            let row = rows.entry(answer.target).or_default();
            row.input_tokens += answer.input_tokens;
            row.output_tokens += answer.output_tokens;
            row.cost_micros += answer.cost_micros;
            row.estimated += u64::from(answer.estimated);
            row.stream_broken += u64::from(answer.stream_broken);
        }
        let mut guard = self.rows.lock();
        let state = &mut *guard;
        for (target, row) in rows {
            let key = (tenant.to_string(), day.clone(), route.to_string(), target.to_string());
            state.add_spend(&day[..6], &key, row.cost_micros);
            match state.map.get_mut(&key) {
                Some(existing) => existing.add(&row),
                None => {
                    if state.map.len() >= MAX_ROWS {
                        let oldest = state.order.remove(0);
                        if let Some(dropped) = state.map.remove(&oldest) {
                            state.add_spend(&day[..6], &oldest, -dropped.cost_micros);
                        }
                        self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    state.order.push(key.clone());
                    state.map.insert(key, row);
                }
            }
        }
    }

    /// Takes every row for a flush.
    pub fn take(&self) -> BTreeMap<RowKey, UsageRow> {
        let mut guard = self.rows.lock();
        guard.order.clear();
        guard.spend.clear();
        std::mem::take(&mut guard.map)
    }

    /// Puts rows back after a failed flush (merged with what arrived meanwhile).
    pub fn restore(&self, rows: BTreeMap<RowKey, UsageRow>) {
        let today = today();
        let mut guard = self.rows.lock();
        let state = &mut *guard;
        for (key, row) in rows {
            let cost = row.cost_micros;
            if let Some(existing) = state.map.get_mut(&key) {
                existing.add(&row);
            } else if state.map.len() < MAX_ROWS {
                state.order.insert(0, key.clone());
                state.map.insert(key.clone(), row);
            } else {
                self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                continue;
            }
            state.add_spend(&today[..6], &key, cost);
        }
    }

    /// This process's unflushed spend of `route` this month (added to the flushed total for
    /// budget decisions).
    pub fn unflushed_spend(&self, tenant: &str, route: &str) -> i64 {
        let month = today();
        let guard = self.rows.lock();
        match guard.spend.get(tenant).and_then(|routes| routes.get(route)) {
            Some((m, micros)) if m.as_str() == &month[..6] => *micros,
            _ => 0,
        }
    }

    /// Rows dropped since the last call (for the metric).
    pub fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shield_core::outcome::Class;

    fn attempt(target: &str, ok: bool) -> Attempt {
        Attempt {
            n: 1,
            target: target.into(),
            model: "m".into(),
            outcome: if ok { "ok" } else { "failed" },
            class: (!ok).then_some(Class::ServerError),
            status: None,
            ms: 10,
            committed: false,
            retry: false,
            resumed: false,
        }
    }

    #[test]
    fn a_failover_counts_calls_errors_and_the_failover() {
        let buffer = UsageBuffer::default();
        let answered = Answered {
            target: "b",
            input_tokens: 5,
            output_tokens: 7,
            cost_micros: 3,
            estimated: false,
            stream_broken: false,
        };
        buffer.record("t", "smart", &[attempt("a", false), attempt("b", true)], &[answered]);
        let rows = buffer.take();
        let a = rows.iter().find(|(k, _)| k.3 == "a").unwrap().1;
        let b = rows.iter().find(|(k, _)| k.3 == "b").unwrap().1;
        assert_eq!((a.calls, a.errors, a.failovers_from, a.ok), (1, 1, 1, 0));
        assert_eq!((b.calls, b.ok, b.input_tokens, b.output_tokens, b.cost_micros), (1, 1, 5, 7, 3));
        assert!(buffer.take().is_empty());
    }

    #[test]
    fn a_panic_while_the_lock_is_held_does_not_poison_the_buffer() {
        // Issue 14: with std's Mutex and `.expect("lock")`, every later request would panic.
        let buffer = std::sync::Arc::new(UsageBuffer::default());
        let holder = buffer.clone();
        let crashed = std::thread::spawn(move || {
            let _guard = holder.rows.lock();
            panic!("a bug while recording");
        })
        .join();
        assert!(crashed.is_err(), "the thread panicked with the lock held");
        buffer.record("t", "smart", &[attempt("a", true)], &[]);
        assert_eq!(buffer.take().len(), 1, "the buffer still records and flushes");
    }

    #[test]
    fn the_buffer_is_capped_and_counts_what_it_drops() {
        let buffer = UsageBuffer::default();
        for i in 0..MAX_ROWS + 5 {
            buffer.record("t", &format!("r{i}"), &[attempt("a", true)], &[]);
        }
        assert_eq!(buffer.take_dropped(), 5);
        let rows = buffer.take();
        assert_eq!(rows.len(), MAX_ROWS);
        assert!(!rows.keys().any(|k| k.2 == "r0"), "the oldest went first");
    }

    fn priced(target: &str, cost: i64) -> Answered<'_> {
        Answered {
            target,
            input_tokens: 1,
            output_tokens: 1,
            cost_micros: cost,
            estimated: false,
            stream_broken: false,
        }
    }

    /// The budget check's figure: every unflushed row of this month for (tenant, route).
    fn scanned_spend(rows: &BTreeMap<RowKey, UsageRow>, tenant: &str, route: &str) -> i64 {
        let month = &today()[..6];
        rows.iter()
            .filter(|((t, day, r, _), _)| t == tenant && r == route && day.starts_with(month))
            .map(|(_, row)| row.cost_micros)
            .sum()
    }

    proptest::proptest! {
        /// Whatever is recorded, flushed, put back after a failed flush or dropped at the cap,
        /// the running unflushed spend equals the sum over the rows still buffered.
        #[test]
        fn unflushed_spend_is_always_the_sum_of_the_buffered_rows(
            ops in proptest::collection::vec((0u8..4, 0usize..3, 0usize..3, 0i64..1_000), 1..200)
        ) {
            let buffer = UsageBuffer::default();
            let mut taken = BTreeMap::new();
            for (op, tenant, route, cost) in ops {
                let (tenant, route) = (["t1", "t2", "t3"][tenant], ["a", "b", "c"][route]);
                match op {
                    0 | 1 => buffer.record(tenant, route, &[attempt("x", true)], &[priced("x", cost)]),
                    2 => taken = buffer.take(),
                    _ => buffer.restore(std::mem::take(&mut taken)),
                }
                let rows = buffer.rows.lock().map.clone();
                for t in ["t1", "t2", "t3"] {
                    for r in ["a", "b", "c"] {
                        proptest::prop_assert_eq!(buffer.unflushed_spend(t, r), scanned_spend(&rows, t, r));
                    }
                }
            }
        }
    }

    #[test]
    fn rows_dropped_at_the_cap_take_their_spend_with_them() {
        let buffer = UsageBuffer::default();
        buffer.record("t", "r0", &[attempt("a", true)], &[priced("a", 7)]);
        for i in 1..MAX_ROWS + 1 {
            buffer.record("t", &format!("r{i}"), &[attempt("a", true)], &[priced("a", 1)]);
        }
        assert_eq!(buffer.take_dropped(), 1);
        assert_eq!(buffer.unflushed_spend("t", "r0"), 0, "the dropped row's spend is gone with it");
        assert_eq!(buffer.unflushed_spend("t", "r1"), 1);
    }
}
