//! This process's view of each target's health: a circuit breaker and a latency EWMA per
//! (tenant, target), the last error and the last success. Decisions read it on the request path
//! (in memory, one short lock); the flusher writes it to `gw_health:{tenant}` for the portal.
//! Opening a circuit queues a `gateway_target_down` event (at most one per target per 10
//! minutes per process); a background task writes it to the `gw_events` stream.

use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};

use crate::FastMap as HashMap;
use std::time::Instant;

use shield_core::breaker::{Breaker, BreakerSettings, Cooldown, Permit};
use shield_core::outcome::Class;
use shield_core::plan::Ewma;
use shield_core::records::health::HealthRecord;

#[derive(Default)]
struct TargetHealth {
    breaker: Breaker,
    cooldown: Cooldown,
    latency: Ewma,
    last_error: Option<&'static str>,
    last_ok_at: Option<i64>,
    /// The failures that opened the circuit last (shown while it is not closed).
    failures_at_open: usize,
}

/// What planning reads of this process's health.
#[derive(Debug, Default)]
pub struct View {
    pub circuit_open: BTreeSet<String>,
    pub exhausted: BTreeSet<String>,
    pub latency_ms: BTreeMap<String, f64>,
}

/// `gateway_target_down`, to be written to `gw_events`.
#[derive(Debug, Clone)]
pub struct TargetDown {
    pub tenant: String,
    pub target: String,
    pub failures: usize,
    pub last_error: &'static str,
}

/// Tenant → target → health, looked up by borrowed names: the request path asks several times
/// per call, and a `(String, String)` key allocated both names on every lookup.
#[derive(Default)]
struct Targets(HashMap<String, HashMap<String, TargetHealth>>);

impl Targets {
    fn get(&self, tenant: &str, target: &str) -> Option<&TargetHealth> {
        self.0.get(tenant)?.get(target)
    }

    fn get_mut(&mut self, tenant: &str, target: &str) -> Option<&mut TargetHealth> {
        self.0.get_mut(tenant)?.get_mut(target)
    }

    /// `change` applied to the target's health, created (its names copied) the first time only.
    fn update<R>(&mut self, tenant: &str, target: &str, change: impl FnOnce(&mut TargetHealth) -> R) -> R {
        if let Some(health) = self.get_mut(tenant, target) {
            return change(health);
        }
        let mut health = TargetHealth::default();
        let out = change(&mut health);
        self.0.entry(tenant.to_string()).or_default().insert(target.to_string(), health);
        out
    }

    fn iter(&self) -> impl Iterator<Item = (&String, &String, &TargetHealth)> {
        self.0.iter().flat_map(|(tenant, targets)| targets.iter().map(move |(target, h)| (tenant, target, h)))
    }
}

pub struct Health {
    started: Instant,
    targets: Mutex<Targets>,
    events: tokio::sync::mpsc::Sender<TargetDown>,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

impl Health {
    pub fn new(events: tokio::sync::mpsc::Sender<TargetDown>) -> Health {
        Health { started: Instant::now(), targets: Mutex::default(), events }
    }

    /// Milliseconds on this process's monotonic clock (the breaker's time).
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// For planning: the targets among `ids` the breaker does not admit now, and the latency
    /// EWMA of those measured.
    pub fn view(&self, tenant: &str, ids: &[String]) -> View {
        let now = self.now();
        let targets = self.targets.lock();
        let mut view = View::default();
        for id in ids {
            if let Some(health) = targets.get(tenant, id) {
                if !health.breaker.admits(now) {
                    view.circuit_open.insert(id.clone());
                }
                if health.cooldown.is_parked(now) {
                    view.exhausted.insert(id.clone());
                }
                if let Some(ms) = health.latency.value() {
                    view.latency_ms.insert(id.clone(), ms);
                }
            }
        }
        view
    }

    /// Parks `target` after an exhaustion answer (ROUTING.md "Exhaustion cooldown").
    pub fn park(&self, tenant: &str, target: &str, hint_ms: Option<u64>) {
        let now = self.now();
        let mut targets = self.targets.lock();
        targets.update(tenant, target, |health| health.cooldown.park(now, hint_ms));
        tracing::info!(tenant, target, hint_ms, "target parked as exhausted");
    }

    /// An operator's reset (`POST …/targets/{id}/reset`): clears the cooldown and the breaker.
    pub fn reset(&self, tenant: &str, target: &str) {
        if let Some(health) = self.targets.lock().get_mut(tenant, target) {
            health.cooldown.clear();
            health.breaker.success();
        }
    }

    /// Asks the breaker to call `target` now.
    pub fn acquire(&self, tenant: &str, target: &str) -> Permit {
        let now = self.now();
        self.targets.lock().update(tenant, target, |health| health.breaker.acquire(now))
    }

    pub fn release(&self, tenant: &str, target: &str, permit: Permit) {
        if let Some(health) = self.targets.lock().get_mut(tenant, target) {
            health.breaker.release(permit);
        }
    }

    /// Records an attempt's outcome; `ms` feeds the latency EWMA on success.
    pub fn record(
        &self,
        tenant: &str,
        target: &str,
        settings: &BreakerSettings,
        permit: Permit,
        result: Result<(), Class>,
        ms: u64,
    ) {
        let now = self.now();
        let mut targets = self.targets.lock();
        targets.update(tenant, target, |health| match result {
            Ok(()) => {
                health.breaker.success();
                health.latency.observe(ms as f64);
                health.last_ok_at = Some(unix_now());
            }
            Err(class) if class.is_breaker_failure() => {
                health.last_error = Some(class.as_str());
                if let Some(opened) = health.breaker.failure(now, settings) {
                    health.failures_at_open = opened.failures;
                    tracing::warn!(
                        tenant,
                        target,
                        failures = opened.failures,
                        last_error = class.as_str(),
                        "circuit opened"
                    );
                    if opened.announce {
                        let down = TargetDown {
                            tenant: tenant.into(),
                            target: target.into(),
                            failures: opened.failures,
                            last_error: class.as_str(),
                        };
                        let _ = self.events.try_send(down);
                    }
                }
            }
            Err(class) => {
                health.last_error = Some(class.as_str());
                health.breaker.release(permit);
            }
        });
    }

    /// Every target this process knows, by tenant, as `gw_health` rows.
    pub fn rows(&self, process: &str) -> BTreeMap<String, Vec<(String, HealthRecord)>> {
        let now = self.now();
        let at = unix_now();
        let targets = self.targets.lock();
        let mut out: BTreeMap<String, Vec<(String, HealthRecord)>> = BTreeMap::new();
        for (tenant, target, health) in targets.iter() {
            let state = health.breaker.state(now);
            let parked = health.cooldown.is_parked(now) && state == shield_core::breaker::State::Closed;
            let failures = match state {
                shield_core::breaker::State::Closed => health.breaker.recent_failures(),
                _ => health.failures_at_open,
            };
            let row = HealthRecord {
                state: if parked { "exhausted" } else { state.as_str() }.to_string(),
                failures: failures as u64,
                last_error: health.last_error.map(str::to_string),
                last_ok_at: health.last_ok_at,
                at,
                process: process.to_string(),
            };
            out.entry(tenant.clone()).or_default().push((target.clone(), row));
        }
        out
    }
}

/// A breaker permit in flight, given back if the attempt holding it is abandoned (its future
/// dropped when the client goes away): a half-open probe must never stay out, or the target
/// would be refused by this process until it restarts.
pub struct HeldPermit<'a> {
    health: &'a Health,
    tenant: &'a str,
    target: &'a str,
    permit: Option<Permit>,
}

impl<'a> HeldPermit<'a> {
    pub fn new(health: &'a Health, tenant: &'a str, target: &'a str, permit: Permit) -> HeldPermit<'a> {
        HeldPermit { health, tenant, target, permit: Some(permit) }
    }

    /// The permit leaves the guard, for its outcome to be recorded (or handed on).
    pub fn take(&mut self) -> Permit {
        self.permit.take().unwrap_or(Permit::Call)
    }
}

impl Drop for HeldPermit<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.health.release(self.tenant, self.target, permit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shield_core::breaker::BreakerSettings;

    /// An attempt abandoned with the half-open probe out gives it back.
    #[test]
    fn an_abandoned_probe_is_given_back() {
        let (events, _rx) = tokio::sync::mpsc::channel(4);
        let health = Health::new(events);
        let settings = BreakerSettings { failures: 1, window_s: 60, open_s: 0, probe_interval_s: 1 };
        let permit = health.acquire("t", "a");
        health.record("t", "a", &settings, permit, Err(Class::ServerError), 1);
        let probe = health.acquire("t", "a");
        assert_eq!(probe, Permit::Probe, "open for 0 s: half-open at once");
        drop(HeldPermit::new(&health, "t", "a", probe));
        assert_eq!(health.acquire("t", "a"), Permit::Probe, "the dropped attempt's probe is available again");
    }
}
