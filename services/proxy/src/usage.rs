//! The usage buffer: per `(tenant, day, route, target)` counters kept in memory and flushed to
//! Redis every `SHIELD_LLM_ROUTING_FLUSH_S` by [`crate::flush`] with one atomic merge per tenant.
//! Capped at 10,000 rows (seed §7): past that the oldest row is dropped and counted. A flush
//! that fails puts its rows back, so Redis being away delays usage but does not lose it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use shield_core::run::Attempt;
use shield_core::usage::UsageRow;

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

#[derive(Default)]
pub struct UsageBuffer {
    /// Rows in insertion order of their first use (for dropping the oldest).
    rows: Mutex<(BTreeMap<RowKey, UsageRow>, Vec<RowKey>)>,
    dropped: std::sync::atomic::AtomicU64,
}

fn today() -> String {
    chrono::Utc::now().format("%Y%m%d").to_string()
}

impl UsageBuffer {
    /// Records one routed call: every attempt counts a call to its target; a failed attempt
    /// followed by another is a failover from it; the answering target gets tokens and cost.
    pub fn record(&self, tenant: &str, route: &str, attempts: &[Attempt], answered: Option<Answered<'_>>) {
        let day = today();
        let mut rows: BTreeMap<&str, UsageRow> = BTreeMap::new();
        for (i, attempt) in attempts.iter().enumerate() {
            let row = rows.entry(attempt.target.as_str()).or_default();
            row.calls += 1;
            row.latency_ms_sum += attempt.ms;
            if attempt.outcome == "ok" {
                row.ok += 1;
            } else {
                row.errors += 1;
                if i + 1 < attempts.len() {
                    row.failovers_from += 1;
                }
            }
        }
        if let Some(answer) = answered {
            let row = rows.entry(answer.target).or_default();
            row.input_tokens += answer.input_tokens;
            row.output_tokens += answer.output_tokens;
            row.cost_micros += answer.cost_micros;
            row.estimated += u64::from(answer.estimated);
            row.stream_broken += u64::from(answer.stream_broken);
        }
        let mut guard = self.rows.lock().expect("usage lock");
        let (map, order) = &mut *guard;
        for (target, row) in rows {
            let key = (tenant.to_string(), day.clone(), route.to_string(), target.to_string());
            match map.get_mut(&key) {
                Some(existing) => existing.add(&row),
                None => {
                    if map.len() >= MAX_ROWS {
                        let oldest = order.remove(0);
                        map.remove(&oldest);
                        self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    order.push(key.clone());
                    map.insert(key, row);
                }
            }
        }
    }

    /// Takes every row for a flush.
    pub fn take(&self) -> BTreeMap<RowKey, UsageRow> {
        let mut guard = self.rows.lock().expect("usage lock");
        guard.1.clear();
        std::mem::take(&mut guard.0)
    }

    /// Puts rows back after a failed flush (merged with what arrived meanwhile).
    pub fn restore(&self, rows: BTreeMap<RowKey, UsageRow>) {
        let mut guard = self.rows.lock().expect("usage lock");
        let (map, order) = &mut *guard;
        for (key, row) in rows {
            if let Some(existing) = map.get_mut(&key) {
                existing.add(&row);
            } else if map.len() < MAX_ROWS {
                order.insert(0, key.clone());
                map.insert(key, row);
            } else {
                self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// This process's unflushed spend of `route` this month (added to the flushed total for
    /// budget decisions).
    pub fn unflushed_spend(&self, tenant: &str, route: &str) -> i64 {
        let month = chrono::Utc::now().format("%Y%m").to_string();
        let guard = self.rows.lock().expect("usage lock");
        guard
            .0
            .iter()
            .filter(|((t, day, r, _), _)| t == tenant && r == route && day.starts_with(&month))
            .map(|(_, row)| row.cost_micros)
            .sum()
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
        buffer.record("t", "smart", &[attempt("a", false), attempt("b", true)], Some(answered));
        let rows = buffer.take();
        let a = rows.iter().find(|(k, _)| k.3 == "a").unwrap().1;
        let b = rows.iter().find(|(k, _)| k.3 == "b").unwrap().1;
        assert_eq!((a.calls, a.errors, a.failovers_from, a.ok), (1, 1, 1, 0));
        assert_eq!((b.calls, b.ok, b.input_tokens, b.output_tokens, b.cost_micros), (1, 1, 5, 7, 3));
        assert!(buffer.take().is_empty());
    }

    #[test]
    fn the_buffer_is_capped_and_counts_what_it_drops() {
        let buffer = UsageBuffer::default();
        for i in 0..MAX_ROWS + 5 {
            buffer.record("t", &format!("r{i}"), &[attempt("a", true)], None);
        }
        assert_eq!(buffer.take_dropped(), 5);
        let rows = buffer.take();
        assert_eq!(rows.len(), MAX_ROWS);
        assert!(!rows.keys().any(|k| k.2 == "r0"), "the oldest went first");
    }
}
