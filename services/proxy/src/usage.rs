//! The usage buffer: per `(tenant, day, route, target)` counters kept in memory and flushed to
//! Redis every `SHIELD_LLM_ROUTING_FLUSH_S` by [`crate::flush`] with one atomic merge per tenant.
//! Beside them, the same counters per `(tenant, day, key id, route)` (issue 32): what each API
//! key used and spent. Each ledger is capped at 10,000 rows (seed §7): past that the oldest row
//! is dropped and counted. A flush that fails puts its rows back, so Redis being away delays
//! usage but does not lose it.

use parking_lot::Mutex;
use std::collections::BTreeMap;

use crate::FastMap as HashMap;

use shield_core::run::Attempt;
use shield_core::usage::UsageRow;

use crate::calendar::today;

pub const MAX_ROWS: usize = 10_000;

/// `(tenant, yyyymmdd, route, target)`; in the key ledger `(tenant, yyyymmdd, key id, route)`.
pub type RowKey = (String, String, String, String);

/// What a flush takes: the route ledger's rows and the key ledger's.
#[derive(Default)]
pub struct Taken {
    pub routes: BTreeMap<RowKey, UsageRow>,
    pub keys: BTreeMap<RowKey, UsageRow>,
}

impl Taken {
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty() && self.keys.is_empty()
    }

    /// The rows split by tenant, for one merge each.
    pub fn by_tenant(self) -> BTreeMap<String, Taken> {
        let mut out: BTreeMap<String, Taken> = BTreeMap::new();
        for (key, row) in self.routes {
            out.entry(key.0.clone()).or_default().routes.insert(key, row);
        }
        for (key, row) in self.keys {
            out.entry(key.0.clone()).or_default().keys.insert(key, row);
        }
        out
    }
}

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
    ledgers: Mutex<Ledgers>,
    dropped: std::sync::atomic::AtomicU64,
    /// Held for a whole flush ([`UsageBuffer::one_flush_at_a_time`]).
    flushing: tokio::sync::Mutex<()>,
}

/// Both ledgers under one lock: a call is recorded in both at once.
struct Ledgers {
    /// `(tenant, day, route, target)`; keeps the tenants' totals.
    routes: Rows,
    /// `(tenant, day, key id, route)`.
    keys: Rows,
}

impl Default for Ledgers {
    fn default() -> Self {
        // One ledger keeps the tenants' totals (both sum the same spend): the other would
        // only pay for a second copy on every call.
        Ledgers { routes: Rows { keeps_totals: true, ..Rows::default() }, keys: Rows::default() }
    }
}

/// A tenant's rows: day → route → target → row.
type Days = HashMap<String, HashMap<String, HashMap<String, UsageRow>>>;

/// Tenant → day → route → target → row, found by borrowed names: recording a call builds no
/// key (four `String`s per row did, on every call); a key is copied only for a new row.
#[derive(Default, Clone)]
struct RowMap {
    tenants: HashMap<String, Days>,
    len: usize,
}

impl RowMap {
    fn get_mut(&mut self, tenant: &str, day: &str, route: &str, target: &str) -> Option<&mut UsageRow> {
        self.tenants.get_mut(tenant)?.get_mut(day)?.get_mut(route)?.get_mut(target)
    }

    /// Adds `row` to its key's row, or makes it the key's row. `true` when it is new.
    fn add(&mut self, (tenant, day, route, target): (&str, &str, &str, &str), row: &UsageRow) -> bool {
        if let Some(existing) = self.get_mut(tenant, day, route, target) {
            existing.add(row);
            return false;
        }
        let days = self.tenants.entry(tenant.to_string()).or_default();
        let routes = days.entry(day.to_string()).or_default();
        routes.entry(route.to_string()).or_default().insert(target.to_string(), *row);
        self.len += 1;
        true
    }

    fn remove(&mut self, (tenant, day, route, target): &RowKey) -> Option<UsageRow> {
        let days = self.tenants.get_mut(tenant)?;
        let routes = days.get_mut(day)?;
        let targets = routes.get_mut(route)?;
        let row = targets.remove(target)?;
        self.len -= 1;
        if targets.is_empty() {
            routes.remove(route);
            if routes.is_empty() {
                days.remove(day);
                if days.is_empty() {
                    self.tenants.remove(tenant);
                }
            }
        }
        Some(row)
    }

    fn contains(&self, (tenant, day, route, target): &RowKey) -> bool {
        let found = self.tenants.get(tenant).and_then(|d| d.get(day)).and_then(|r| r.get(route));
        found.is_some_and(|targets| targets.contains_key(target))
    }

    /// Every row, keyed and sorted as a flush writes them.
    fn into_sorted(self) -> BTreeMap<RowKey, UsageRow> {
        let mut out = BTreeMap::new();
        for (tenant, days) in self.tenants {
            for (day, routes) in days {
                for (route, targets) in routes {
                    for (target, row) in targets {
                        out.insert((tenant.clone(), day.clone(), route.clone(), target), row);
                    }
                }
            }
        }
        out
    }
}

/// Spend per `(tenant, name)` (a route, or a key id in the key ledger) and per tenant, each
/// in month `yyyymm`: kept as rows change, so a budget check reads one entry instead of
/// scanning up to 10,000 rows on every call.
#[derive(Default)]
struct Spend {
    names: HashMap<String, HashMap<String, (String, i64)>>,
    totals: HashMap<String, (String, i64)>,
}

/// `target`'s row in `rows`, added when it has none yet (never `None`).
fn row_of<'r, 't>(rows: &'r mut Vec<(&'t str, UsageRow)>, target: &'t str) -> Option<&'r mut UsageRow> {
    let at = rows.iter().position(|(known, _)| *known == target).unwrap_or_else(|| {
        rows.push((target, UsageRow::default()));
        rows.len() - 1
    });
    rows.get_mut(at).map(|(_, row)| row)
}

/// Adds `micros` of `month` to `entry`; an entry of another month starts again from 0.
fn add_month(entry: &mut (String, i64), month: &str, micros: i64) {
    if entry.0 != month {
        *entry = (month.to_string(), 0);
    }
    entry.1 += micros;
}

fn of_month(entry: Option<&(String, i64)>, month: &str) -> i64 {
    match entry {
        Some((m, micros)) if m.as_str() == month => *micros,
        _ => 0,
    }
}

impl Spend {
    /// Adds `micros` of `month` to `(tenant, name)`, and to the tenant's total when `total`.
    fn add(&mut self, month: &str, (tenant, name): (&str, &str), micros: i64, total: bool) {
        if total {
            let entry = match self.totals.get_mut(tenant) {
                Some(entry) => entry,
                None => self.totals.entry(tenant.to_string()).or_insert_with(|| (month.to_string(), 0)),
            };
            add_month(entry, month, micros);
        }
        // Keys are copied only for a (tenant, name) not seen since the last flush.
        let names = match self.names.get_mut(tenant) {
            Some(names) => names,
            None => self.names.entry(tenant.to_string()).or_default(),
        };
        let entry = match names.get_mut(name) {
            Some(entry) => entry,
            None => names.entry(name.to_string()).or_insert_with(|| (month.to_string(), 0)),
        };
        add_month(entry, month, micros);
    }

    /// Moves everything into `into`, adding to what it holds.
    fn move_into(&mut self, into: &mut Spend) {
        for (tenant, names) in std::mem::take(&mut self.names) {
            for (name, (month, micros)) in names {
                into.add(&month, (&tenant, &name), micros, false);
            }
        }
        for (tenant, (month, micros)) in std::mem::take(&mut self.totals) {
            let entry = into.totals.entry(tenant).or_insert_with(|| (month.clone(), 0));
            add_month(entry, &month, micros);
        }
    }

    fn of(&self, month: &str, tenant: &str, name: &str) -> i64 {
        of_month(self.names.get(tenant).and_then(|names| names.get(name)), month)
    }

    fn total(&self, month: &str, tenant: &str) -> i64 {
        of_month(self.totals.get(tenant), month)
    }

    fn forget(&mut self, tenant: &str) {
        self.names.remove(tenant);
        self.totals.remove(tenant);
    }

    /// The tenants with spend other than 0 (a flush that failed puts back what it took, which
    /// leaves its entries at 0: nothing to read back for them).
    fn tenants(&self) -> impl Iterator<Item = &String> {
        let names = self.names.iter().filter(|(_, names)| names.values().any(|(_, micros)| *micros != 0));
        let totals = self.totals.iter().filter(|(_, (_, micros))| *micros != 0);
        names.map(|(tenant, _)| tenant).chain(totals.map(|(tenant, _)| tenant))
    }
}

#[derive(Default)]
struct Rows {
    map: RowMap,
    /// Keys in insertion order of their first use (for dropping the oldest).
    order: Vec<RowKey>,
    /// The spend of the rows held here.
    spend: Spend,
    /// The spend of rows a flush took, until the flusher has read the flushed totals back
    /// ([`UsageBuffer::landed`]). Without it, a budget check between the take and that read
    /// would see neither the rows here nor their spend in the cached totals: a call could pass
    /// a spent budget, a warning be missed.
    in_flight: Spend,
    /// Whether `spend` keeps the tenants' totals too.
    keeps_totals: bool,
}

impl Rows {
    /// Adds `micros` of row `(tenant, day, route)` to its route's unflushed spend when the row
    /// is of `month` (the current `yyyymm`, which the caller already has).
    fn add_spend(&mut self, month: &str, (tenant, day, route): (&str, &str, &str), micros: i64) {
        if micros == 0 || !day.starts_with(month) {
            return;
        }
        self.spend.add(month, (tenant, route), micros, self.keeps_totals);
    }

    /// Records `row` under its key: a new key is remembered in order, and past the cap the
    /// oldest row goes (its spend with it). `true` when a row was dropped.
    fn add(&mut self, month: &str, key: (&str, &str, &str, &str), row: &UsageRow) -> bool {
        let (tenant, day, route, target) = key;
        self.add_spend(month, (tenant, day, route), row.cost_micros);
        if let Some(existing) = self.map.get_mut(tenant, day, route, target) {
            existing.add(row);
            return false;
        }
        let mut dropped = false;
        if self.map.len >= MAX_ROWS && !self.order.is_empty() {
            let oldest = self.order.remove(0);
            if let Some(gone) = self.map.remove(&oldest) {
                self.add_spend(month, (&oldest.0, &oldest.1, &oldest.2), -gone.cost_micros);
            }
            dropped = true;
        }
        self.order.push((tenant.to_string(), day.to_string(), route.to_string(), target.to_string()));
        self.map.add(key, row);
        dropped
    }
}

impl Rows {
    /// Takes every row for a flush; their spend stays counted, in flight.
    fn take(&mut self) -> BTreeMap<RowKey, UsageRow> {
        self.order.clear();
        self.spend.move_into(&mut self.in_flight);
        std::mem::take(&mut self.map).into_sorted()
    }

    /// Puts rows back after a failed flush (merged with what arrived meanwhile); returns how
    /// many did not fit under the cap.
    fn restore(&mut self, month: &str, rows: BTreeMap<RowKey, UsageRow>) -> u64 {
        let mut dropped = 0;
        for (key, row) in rows {
            let (tenant, day, route, target) = &key;
            // No longer in flight: back here, or dropped.
            if row.cost_micros != 0 && day.starts_with(month) {
                self.in_flight.add(month, (tenant, route), -row.cost_micros, self.keeps_totals);
            }
            let known = self.map.contains(&key);
            if !known && self.map.len >= MAX_ROWS {
                dropped += 1;
                continue;
            }
            self.map.add((tenant, day, route, target), &row);
            self.add_spend(month, (tenant, day, route), row.cost_micros);
            if !known {
                // Restored rows are older than anything recorded since: first to go.
                self.order.insert(0, key);
            }
        }
        dropped
    }

    /// The unflushed spend of `(tenant, name)` in `month`: held here or in flight.
    fn unflushed(&self, month: &str, tenant: &str, name: &str) -> i64 {
        self.spend.of(month, tenant, name) + self.in_flight.of(month, tenant, name)
    }

    /// The tenant's unflushed spend in `month` (when `keeps_totals`).
    fn unflushed_total(&self, month: &str, tenant: &str) -> i64 {
        self.spend.total(month, tenant) + self.in_flight.total(month, tenant)
    }
}

impl UsageBuffer {
    /// Records a request a rate limit refused before routing (issue 18): a `rate_limited` row
    /// with no target, never a call.
    pub fn rate_limited(&self, tenant: &str, key_id: &str, route: &str) {
        let row = UsageRow { rate_limited: 1, ..UsageRow::default() };
        let day = today();
        let mut ledgers = self.ledgers.lock();
        let dropped = u64::from(ledgers.routes.add(day.month(), (tenant, &day, route, ""), &row))
            + u64::from(ledgers.keys.add(day.month(), (tenant, &day, key_id, route), &row));
        drop(ledgers);
        self.count_dropped(dropped);
    }

    fn count_dropped(&self, dropped: u64) {
        if dropped > 0 {
            self.dropped.fetch_add(dropped, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Records one routed call: every attempt counts a call to its target; a failed attempt
    /// followed by another is a failover from it; the answering target gets tokens and cost.
    /// The key's row of the route counts the request once, with its tokens and cost.
    pub fn record(&self, tenant: &str, key_id: &str, route: &str, attempts: &[Attempt], answered: &[Answered<'_>]) {
        let day = today();
        // Per target: a call has one or a few, so a list searched in order (a map's node was an
        // allocation and a walk on every call).
        let mut rows: Vec<(&str, UsageRow)> = Vec::with_capacity(attempts.len().max(answered.len()));
        for (i, attempt) in attempts.iter().enumerate() {
            let Some(row) = row_of(&mut rows, attempt.target.as_str()) else { continue };
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
            let Some(row) = row_of(&mut rows, answer.target) else { continue };
            row.input_tokens += answer.input_tokens;
            row.output_tokens += answer.output_tokens;
            row.cost_micros += answer.cost_micros;
            row.estimated += u64::from(answer.estimated);
            row.stream_broken += u64::from(answer.stream_broken);
        }
        // The key's row counts the request once (its attempts are the route rows' business):
        // a call, answered or failed, with its failovers, tokens and cost.
        let mut by_key = UsageRow::default();
        for (_, row) in &rows {
            by_key.add(row);
        }
        let answered_ok = attempts.iter().any(|a| a.outcome == "ok");
        by_key.calls = u64::from(!attempts.is_empty());
        by_key.ok = u64::from(answered_ok);
        by_key.errors = u64::from(!attempts.is_empty() && !answered_ok);
        let mut ledgers = self.ledgers.lock();
        let mut dropped = 0;
        for (target, row) in rows {
            dropped += u64::from(ledgers.routes.add(day.month(), (tenant, &day, route, target), &row));
        }
        dropped += u64::from(ledgers.keys.add(day.month(), (tenant, &day, key_id, route), &by_key));
        drop(ledgers);
        self.count_dropped(dropped);
    }

    /// Takes every row of both ledgers for a flush.
    pub fn take(&self) -> Taken {
        let mut ledgers = self.ledgers.lock();
        Taken { routes: ledgers.routes.take(), keys: ledgers.keys.take() }
    }

    /// Puts rows back after a failed flush (merged with what arrived meanwhile).
    pub fn restore(&self, taken: Taken) {
        let today = today();
        let mut ledgers = self.ledgers.lock();
        let dropped =
            ledgers.routes.restore(today.month(), taken.routes) + ledgers.keys.restore(today.month(), taken.keys);
        drop(ledgers);
        self.count_dropped(dropped);
    }

    /// This process's unflushed spend of `route` this month (added to the flushed total for
    /// budget decisions).
    pub fn unflushed_spend(&self, tenant: &str, route: &str) -> i64 {
        let today = today();
        self.ledgers.lock().routes.unflushed(today.month(), tenant, route)
    }

    /// This process's unflushed spend this month of the key, and of its whole tenant.
    pub fn unflushed_key_and_tenant(&self, tenant: &str, key_id: &str) -> (i64, i64) {
        let today = today();
        let ledgers = self.ledgers.lock();
        let total = ledgers.routes.unflushed_total(today.month(), tenant);
        (ledgers.keys.unflushed(today.month(), tenant, key_id), total)
    }

    /// Held by a flush from its take to its read-back. Two flushes at once (the periodic one
    /// and the one at shutdown) would let one's read-back release spend the other took and has
    /// not merged yet: it would count nowhere until the next read of the cached totals.
    pub async fn one_flush_at_a_time(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.flushing.lock().await
    }

    /// The tenants with spend in flight: taken by a flush, not yet [`landed`](Self::landed).
    pub fn in_flight(&self) -> Vec<String> {
        let ledgers = self.ledgers.lock();
        let mut tenants: Vec<String> =
            ledgers.routes.in_flight.tenants().chain(ledgers.keys.in_flight.tenants()).cloned().collect();
        tenants.sort_unstable();
        tenants.dedup();
        tenants
    }

    /// The tenant's flushed spend has been read back into the cached totals, so what a flush
    /// took of it no longer counts as unflushed. Call only after a read that started once the
    /// flush had landed.
    pub fn landed(&self, tenant: &str) {
        let mut ledgers = self.ledgers.lock();
        ledgers.routes.in_flight.forget(tenant);
        ledgers.keys.in_flight.forget(tenant);
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
        buffer.record("t", "k1", "smart", &[attempt("a", false), attempt("b", true)], &[answered]);
        let taken = buffer.take();
        let key_row = taken.keys.get(&("t".into(), today().to_string(), "k1".into(), "smart".into())).unwrap();
        assert_eq!(
            (
                key_row.calls,
                key_row.ok,
                key_row.errors,
                key_row.failovers_from,
                key_row.input_tokens,
                key_row.cost_micros
            ),
            (1, 1, 0, 1, 5, 3),
            "the key's row counts the request once"
        );
        let rows = taken.routes;
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
            let _guard = holder.ledgers.lock();
            panic!("a bug while recording");
        })
        .join();
        assert!(crashed.is_err(), "the thread panicked with the lock held");
        buffer.record("t", "k", "smart", &[attempt("a", true)], &[]);
        assert_eq!(buffer.take().routes.len(), 1, "the buffer still records and flushes");
    }

    #[test]
    fn the_buffer_is_capped_and_counts_what_it_drops() {
        let buffer = UsageBuffer::default();
        for i in 0..MAX_ROWS + 5 {
            buffer.record("t", "k", &format!("r{i}"), &[attempt("a", true)], &[]);
        }
        assert_eq!(buffer.take_dropped(), 10, "5 route rows and 5 key rows (one per key and route)");
        let rows = buffer.take().routes;
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

    /// The budget check's figure: every unflushed row of this month for (tenant, route) (for
    /// (tenant, key id) in the key ledger).
    fn scanned_spend(rows: &BTreeMap<RowKey, UsageRow>, tenant: &str, route: &str) -> i64 {
        let month = &today()[..6];
        rows.iter()
            .filter(|((t, day, r, _), _)| t == tenant && r == route && day.starts_with(month))
            .map(|(_, row)| row.cost_micros)
            .sum()
    }

    proptest::proptest! {
        /// Whatever is recorded, taken by a flush, put back after a failed flush, landed or
        /// dropped at the cap, the running unflushed spend equals the sum over the rows still
        /// buffered and those taken but not landed: per route, per key and for the tenant.
        #[test]
        fn unflushed_spend_is_always_the_sum_of_the_rows_not_landed(
            ops in proptest::collection::vec((0u8..5, 0usize..3, 0usize..3, 0i64..1_000), 1..200)
        ) {
            let buffer = UsageBuffer::default();
            let mut taken = Taken::default();
            for (op, tenant, route, cost) in ops {
                let (tenant, route) = (["t1", "t2", "t3"][tenant], ["a", "b", "c"][route]);
                match op {
                    0 | 1 => buffer.record(tenant, ["k1", "k2"][cost as usize % 2], route, &[attempt("x", true)], &[priced("x", cost)]),
                    2 => {
                        let more = buffer.take();
                        for (key, row) in more.routes {
                            taken.routes.entry(key).or_default().add(&row);
                        }
                        for (key, row) in more.keys {
                            taken.keys.entry(key).or_default().add(&row);
                        }
                    }
                    3 => buffer.restore(std::mem::take(&mut taken)),
                    _ => {
                        taken.routes.retain(|key, _| key.0 != tenant);
                        taken.keys.retain(|key, _| key.0 != tenant);
                        buffer.landed(tenant);
                    }
                }
                let mut rows = buffer.ledgers.lock().routes.map.clone().into_sorted();
                let mut keys = buffer.ledgers.lock().keys.map.clone().into_sorted();
                let unflushed = |held: &mut BTreeMap<RowKey, UsageRow>, away: &BTreeMap<RowKey, UsageRow>| {
                    for (key, row) in away {
                        // A distinct key per side, so that both are summed.
                        held.insert((key.0.clone(), key.1.clone(), key.2.clone(), format!("away {}", key.3)), *row);
                    }
                };
                unflushed(&mut rows, &taken.routes);
                unflushed(&mut keys, &taken.keys);
                for t in ["t1", "t2", "t3"] {
                    for r in ["a", "b", "c"] {
                        proptest::prop_assert_eq!(buffer.unflushed_spend(t, r), scanned_spend(&rows, t, r));
                    }
                    let total: i64 = ["a", "b", "c"].iter().map(|r| scanned_spend(&rows, t, r)).sum();
                    for k in ["k1", "k2"] {
                        let (key, tenant) = buffer.unflushed_key_and_tenant(t, k);
                        proptest::prop_assert_eq!(key, scanned_spend(&keys, t, k), "a key's spend is its rows'");
                        proptest::prop_assert_eq!(tenant, total, "the tenant's total is its routes'");
                    }
                }
                let in_flight = buffer.in_flight();
                for t in ["t1", "t2", "t3"] {
                    let month = &today()[..6];
                    let taken_spend: i64 = taken.routes.iter().chain(&taken.keys)
                        .filter(|(k, _)| k.0 == t && k.1.starts_with(month)).map(|(_, row)| row.cost_micros).sum();
                    if taken_spend != 0 {
                        proptest::prop_assert!(in_flight.iter().any(|i| i == t), "a tenant with spend taken is in flight");
                    }
                    if !taken.routes.keys().chain(taken.keys.keys()).any(|k| k.0 == t) {
                        proptest::prop_assert!(!in_flight.iter().any(|i| i == t), "nothing taken, nothing to read back");
                    }
                }
            }
        }
    }

    #[test]
    fn rows_dropped_at_the_cap_take_their_spend_with_them() {
        let buffer = UsageBuffer::default();
        buffer.record("t", "k", "r0", &[attempt("a", true)], &[priced("a", 7)]);
        for i in 1..MAX_ROWS + 1 {
            buffer.record("t", "k", &format!("r{i}"), &[attempt("a", true)], &[priced("a", 1)]);
        }
        assert_eq!(buffer.take_dropped(), 2, "one route row, one key row");
        assert_eq!(buffer.unflushed_spend("t", "r0"), 0, "the dropped row's spend is gone with it");
        assert_eq!(buffer.unflushed_spend("t", "r1"), 1);
    }
}
