//! The per-process circuit breaker of one target (ROUTING.md "Circuit breaker"): 5 breaker
//! failures within 60 s open the circuit for 30 s; then half-open admits exactly one probe;
//! its success closes the circuit, its failure re-opens it — for the probe interval (10 s),
//! not a fresh open window, so a provider that comes back is found again soon while one that
//! stays down gets at most one probe per interval. Targets may override all four
//! ([`BreakerSettings`]). Time is passed in (milliseconds on any monotonic clock), so every
//! transition is tested without sleeping.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// A target's breaker (`breaker` on the target; omitted: the seed's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BreakerSettings {
    /// Breaker failures within `window_s` that open the circuit.
    #[serde(default = "defaults::failures")]
    pub failures: u32,
    #[serde(default = "defaults::window_s")]
    pub window_s: u32,
    /// How long the circuit stays open when it opens.
    #[serde(default = "defaults::open_s")]
    pub open_s: u32,
    /// How long it re-opens after a failed half-open probe.
    #[serde(default = "defaults::probe_interval_s")]
    pub probe_interval_s: u32,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings {
            failures: defaults::failures(),
            window_s: defaults::window_s(),
            open_s: defaults::open_s(),
            probe_interval_s: defaults::probe_interval_s(),
        }
    }
}

mod defaults {
    pub fn failures() -> u32 {
        5
    }
    pub fn window_s() -> u32 {
        60
    }
    pub fn open_s() -> u32 {
        30
    }
    pub fn probe_interval_s() -> u32 {
        10
    }
}
/// `gateway_target_down` at most once per target per 10 minutes per process.
pub const DOWN_EVENT_EVERY_MS: u64 = 600_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Closed,
    Open,
    HalfOpen,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

/// What [`Breaker::acquire`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Closed: call as usual.
    Call,
    /// Half-open: this call is the one probe.
    Probe,
    /// Open, or half-open with its probe already out: skip without calling.
    Refused,
}

/// The breaker opened on this failure; `announce` is whether to emit `gateway_target_down`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub announce: bool,
    pub failures: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Breaker {
    failures: VecDeque<u64>,
    open_until: Option<u64>,
    probe_out: bool,
    half_open: bool,
    last_announced: Option<u64>,
}

impl Breaker {
    /// The state as of `now` (an open circuit whose time is up reads as half-open).
    pub fn state(&self, now: u64) -> State {
        match self.open_until {
            Some(until) if now < until => State::Open,
            Some(_) => State::HalfOpen,
            None if self.half_open => State::HalfOpen,
            None => State::Closed,
        }
    }

    /// Whether a plan may include this target now (an open circuit, or a half-open one whose
    /// probe is out, is excluded as `circuit_open`).
    pub fn admits(&self, now: u64) -> bool {
        match self.state(now) {
            State::Closed => true,
            State::HalfOpen => !self.probe_out,
            State::Open => false,
        }
    }

    /// Asks to call the target now. In half-open, exactly one caller gets the probe.
    pub fn acquire(&mut self, now: u64) -> Permit {
        match self.state(now) {
            State::Closed => Permit::Call,
            State::Open => Permit::Refused,
            State::HalfOpen if self.probe_out => Permit::Refused,
            State::HalfOpen => {
                self.open_until = None;
                self.half_open = true;
                self.probe_out = true;
                Permit::Probe
            }
        }
    }

    /// A call that was acquired ended without an outcome that counts (e.g. the client went
    /// away, or a class that is not a breaker failure): give the probe back.
    pub fn release(&mut self, permit: Permit) {
        if permit == Permit::Probe {
            self.probe_out = false;
        }
    }

    pub fn success(&mut self) {
        self.failures.clear();
        self.open_until = None;
        self.half_open = false;
        self.probe_out = false;
    }

    /// Records a breaker failure; returns `Some` when this failure opened the circuit.
    pub fn failure(&mut self, now: u64, settings: &BreakerSettings) -> Option<Opened> {
        if self.half_open {
            // The probe failed: re-open, for the probe interval.
            self.half_open = false;
            self.probe_out = false;
            return Some(self.open(now, u64::from(settings.probe_interval_s) * 1000));
        }
        if self.state(now) == State::Open {
            return None;
        }
        self.failures.push_back(now);
        let window = u64::from(settings.window_s) * 1000;
        while self.failures.front().is_some_and(|t| now.saturating_sub(*t) > window) {
            self.failures.pop_front();
        }
        let threshold = settings.failures.max(1) as usize;
        (self.failures.len() >= threshold).then(|| self.open(now, u64::from(settings.open_s) * 1000))
    }

    fn open(&mut self, now: u64, for_ms: u64) -> Opened {
        let failures = self.failures.len().max(1);
        self.failures.clear();
        self.open_until = Some(now + for_ms);
        let announce = self.last_announced.is_none_or(|at| now.saturating_sub(at) >= DOWN_EVENT_EVERY_MS);
        if announce {
            self.last_announced = Some(now);
        }
        Opened { announce, failures }
    }

    /// Failures counted in the current window (for health views).
    pub fn recent_failures(&self) -> usize {
        self.failures.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: BreakerSettings = BreakerSettings { failures: 5, window_s: 60, open_s: 30, probe_interval_s: 10 };

    fn failing(b: &mut Breaker, at: u64, n: usize) -> Option<Opened> {
        let mut opened = None;
        for _ in 0..n {
            assert_eq!(b.acquire(at), Permit::Call);
            opened = b.failure(at, &SEED);
        }
        opened
    }

    #[test]
    fn opens_after_five_failures_in_the_window() {
        let mut b = Breaker::default();
        assert_eq!(failing(&mut b, 0, 4), None);
        assert_eq!(b.state(0), State::Closed);
        assert_eq!(b.failure(1_000, &SEED), Some(Opened { announce: true, failures: 5 }));
        assert_eq!(b.state(1_000), State::Open);
        assert_eq!(b.acquire(1_000), Permit::Refused);
        assert!(!b.admits(30_999));
    }

    #[test]
    fn failures_outside_the_window_do_not_count() {
        let mut b = Breaker::default();
        failing(&mut b, 0, 4);
        assert_eq!(failing(&mut b, 60_001, 1), None, "the first four fell out of the 60 s window");
        let quick = BreakerSettings { failures: 2, window_s: 5, open_s: 7, probe_interval_s: 3 };
        let mut c = Breaker::default();
        assert_eq!(c.failure(0, &quick), None);
        assert!(c.failure(4_000, &quick).is_some(), "a target's own threshold and window");
        assert_eq!((c.state(10_999), c.state(11_000)), (State::Open, State::HalfOpen), "its own open window");
        assert_eq!(b.recent_failures(), 1);
        b.success();
        assert_eq!(b.recent_failures(), 0);
    }

    #[test]
    fn half_open_admits_exactly_one_probe_and_closes_on_success() {
        let mut b = Breaker::default();
        failing(&mut b, 0, 5);
        assert_eq!(b.state(30_000), State::HalfOpen);
        assert!(b.admits(30_000));
        assert_eq!(b.acquire(30_000), Permit::Probe);
        assert_eq!(b.acquire(30_001), Permit::Refused, "exactly one probe");
        assert!(!b.admits(30_001));
        b.success();
        assert_eq!(b.state(30_002), State::Closed);
        assert_eq!(b.acquire(30_002), Permit::Call);
    }

    #[test]
    fn a_failed_probe_reopens_and_announcements_are_throttled() {
        let mut b = Breaker::default();
        assert!(failing(&mut b, 0, 5).unwrap().announce);
        assert_eq!(b.acquire(30_000), Permit::Probe);
        let reopened = b.failure(30_000, &SEED).unwrap();
        assert!(!reopened.announce, "at most once per 10 minutes");
        assert_eq!(b.state(39_999), State::Open, "re-opened for the probe interval, not a fresh 30 s");
        assert_eq!(b.acquire(40_000), Permit::Probe);
        b.failure(40_000, &SEED);
        assert_eq!(b.acquire(600_000), Permit::Probe);
        assert!(b.failure(600_000, &SEED).unwrap().announce, "ten minutes later it is announced again");
    }

    proptest::proptest! {
        /// Issue 17, with the default settings and one request every 4 s against a provider
        /// that is down from 0 s for `down_s` seconds: once the first open window has passed,
        /// a provider that returns is served again within 30 s of its return (the probe
        /// interval plus the request spacing), and while down it gets at most one probe per
        /// probe interval.
        #[test]
        fn a_returning_provider_is_found_again_and_a_dead_one_is_not_hammered(down_s in 0u64..600) {
            let (mut b, settings) = (Breaker::default(), BreakerSettings::default());
            let mut probes: Vec<u64> = Vec::new();
            let mut first_open_end = None;
            let mut served_at = None;
            for step in 0..250u64 {
                let now = step * 4_000;
                let permit = b.acquire(now);
                if permit == Permit::Refused {
                    continue;
                }
                if permit == Permit::Probe {
                    probes.push(now);
                }
                if now >= down_s * 1000 {
                    b.success();
                    served_at.get_or_insert(now);
                } else if let Some(opened) = b.failure(now, &settings) {
                    first_open_end.get_or_insert(now + 30_000);
                    let _ = opened;
                }
            }
            let back = down_s * 1000;
            let served = served_at.expect("served again within the simulated 1,000 s");
            let after_first_window = first_open_end.is_none_or(|end| back >= end);
            proptest::prop_assert!(!after_first_window || served - back <= 30_000, "back at {back}, served at {served}");
            let down_probes: Vec<&u64> = probes.iter().filter(|p| **p < back).collect();
            for pair in down_probes.windows(2) {
                proptest::prop_assert!(pair[1] - pair[0] >= 10_000, "probes {pair:?} closer than the interval");
            }
        }
    }

    #[test]
    fn a_released_probe_can_be_taken_again() {
        let mut b = Breaker::default();
        failing(&mut b, 0, 5);
        let permit = b.acquire(30_000);
        b.release(permit);
        assert_eq!(b.acquire(30_001), Permit::Probe);
    }
}

/// Exhaustion cooldown (seed 002, ROUTING.md): a target that answered "out of quota" or a
/// rate limit with a reset hint is parked until then — 60 s without a hint, at most an hour —
/// and skipped (`exhausted`) rather than hammered. A shorter hint never shortens a cooldown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cooldown {
    until: Option<u64>,
}

pub const DEFAULT_COOLDOWN_MS: u64 = 60_000;
pub const MAX_COOLDOWN_MS: u64 = 3_600_000;

impl Cooldown {
    pub fn park(&mut self, now: u64, hint_ms: Option<u64>) {
        let until = now + hint_ms.unwrap_or(DEFAULT_COOLDOWN_MS).min(MAX_COOLDOWN_MS);
        self.until = Some(self.until.map_or(until, |current| current.max(until)));
    }

    pub fn is_parked(&self, now: u64) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// Milliseconds left, for health views.
    pub fn remaining(&self, now: u64) -> Option<u64> {
        self.until.filter(|until| now < *until).map(|until| until - now)
    }

    pub fn clear(&mut self) {
        self.until = None;
    }
}

/// The reset hint of a 429/402 answer, in milliseconds from now: `Retry-After` (seconds or an
/// HTTP date) or `x-ratelimit-reset-requests` / `-tokens` (`"20s"`, `"1m30s"`, `"250ms"`, or
/// plain seconds). The longest hint wins. `now_unix` is the caller's wall clock.
pub fn reset_hint_ms(headers: &[(String, String)], now_unix: u64) -> Option<u64> {
    let mut hints = Vec::new();
    for (name, value) in headers {
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "retry-after" => {
                if let Ok(seconds) = value.parse::<u64>() {
                    hints.push(seconds * 1000);
                } else if let Ok(at) = httpdate::parse_http_date(value) {
                    let at = at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
                    hints.push(at.saturating_sub(now_unix) * 1000);
                }
            }
            "x-ratelimit-reset-requests" | "x-ratelimit-reset-tokens" => {
                if let Some(ms) = duration_ms(value) {
                    hints.push(ms);
                }
            }
            // Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset`,
            // RFC 3339 times.
            name if name.starts_with("anthropic-ratelimit-") && name.ends_with("-reset") => {
                if let Ok(at) = humantime::parse_rfc3339_weak(value) {
                    let at = at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
                    hints.push(at.saturating_sub(now_unix) * 1000);
                }
            }
            _ => {}
        }
    }
    hints.into_iter().max()
}

/// `"1h2m3s"`, `"20s"`, `"250ms"`, `"1.5s"` or plain seconds.
fn duration_ms(text: &str) -> Option<u64> {
    if let Ok(seconds) = text.parse::<f64>() {
        return Some((seconds * 1000.0) as u64);
    }
    let mut total = 0.0;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let value: f64 = number.parse().ok()?;
        number.clear();
        total += match c {
            'h' => value * 3_600_000.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                value
            }
            'm' => value * 60_000.0,
            's' => value * 1000.0,
            _ => return None,
        };
    }
    number.is_empty().then_some(total as u64)
}

#[cfg(test)]
mod cooldown_tests {
    use super::*;

    #[test]
    fn parks_default_capped_and_never_shortened() {
        let mut c = Cooldown::default();
        c.park(0, None);
        assert!(c.is_parked(59_999) && !c.is_parked(60_000));
        c.park(0, Some(10_000_000));
        assert_eq!(c.remaining(0), Some(MAX_COOLDOWN_MS), "capped at an hour");
        c.park(1_000, Some(5_000));
        assert_eq!(c.remaining(0), Some(MAX_COOLDOWN_MS), "a shorter hint never shortens it");
        c.clear();
        assert!(!c.is_parked(0));
    }

    #[test]
    fn reset_hints() {
        let h = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        assert_eq!(reset_hint_ms(&h(&[("Retry-After", "7")]), 0), Some(7_000));
        assert_eq!(reset_hint_ms(&h(&[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")]), 784_111_767), Some(10_000));
        assert_eq!(
            reset_hint_ms(&h(&[("x-ratelimit-reset-requests", "1m30s"), ("x-ratelimit-reset-tokens", "250ms")]), 0),
            Some(90_000)
        );
        assert_eq!(reset_hint_ms(&h(&[("x-ratelimit-reset-tokens", "1.5s")]), 0), Some(1_500));
        assert_eq!(reset_hint_ms(&h(&[("retry-after", "soon")]), 0), None);
        assert_eq!(reset_hint_ms(&[], 0), None);
        // 2025-12-01T00:00:30Z is 30 s after 1_764_547_200.
        let anthropic = h(&[("anthropic-ratelimit-requests-reset", "2025-12-01T00:00:30Z")]);
        assert_eq!(reset_hint_ms(&anthropic, 1_764_547_200), Some(30_000));
        let fractional = h(&[("anthropic-ratelimit-tokens-reset", "2025-12-01T00:00:05.250Z")]);
        assert_eq!(reset_hint_ms(&fractional, 1_764_547_200), Some(5_000));
    }
}
