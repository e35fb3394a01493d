//! The attempt loop as a pure state machine: which target to try next, when to stop and why
//! (ROUTING.md "Halts"). The proxy performs the calls and reports each outcome; this module
//! guarantees the invariants: attempts only go to the planned eligible set, each target at most
//! once, never more than `max_attempts`, never past the deadline.

use serde::Serialize;

use crate::outcome::Class;
use crate::route::{FailoverOn, Retry};

/// Why a run stopped (seed 001), in `x_shield.routing.halt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Halt {
    Succeeded,
    /// Every eligible target was tried and failed.
    Exhausted,
    NoEligibleTarget,
    /// A failure class that does not fail over on this route.
    IneligibleFailure,
    /// Failed after the commit point (streaming).
    VisibleOutput,
    Deadline,
    AttemptBound,
    Denied,
    BudgetBlocked,
    /// The client went away.
    Cancelled,
}

impl Halt {
    pub fn as_str(self) -> &'static str {
        match self {
            Halt::Succeeded => "succeeded",
            Halt::Exhausted => "exhausted",
            Halt::NoEligibleTarget => "no_eligible_target",
            Halt::IneligibleFailure => "ineligible_failure",
            Halt::VisibleOutput => "visible_output",
            Halt::Deadline => "deadline",
            Halt::AttemptBound => "attempt_bound",
            Halt::Denied => "denied",
            Halt::BudgetBlocked => "budget_blocked",
            Halt::Cancelled => "cancelled",
        }
    }
}

/// One attempt as recorded in `x_shield.routing.attempts[]` and the request log line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    pub n: u32,
    pub target: String,
    pub model: String,
    /// `ok` or `failed`.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<Class>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub ms: u64,
    /// Whether bytes of this attempt reached the client (streaming commit point).
    pub committed: bool,
    /// A same-target retry (`failover.retry`) of the attempt before it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub retry: bool,
    /// It resumed a stream that broke after its commit point (`stream_resume`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
}

/// Whether `attempts[i]` failed and another target was tried after it.
pub fn failed_over(attempts: &[Attempt], i: usize) -> bool {
    attempts.get(i).is_some_and(|a| a.outcome == "failed") && attempts.get(i + 1).is_some_and(|next| !next.retry)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Try(String),
    Stop(Halt),
}

#[derive(Debug, Clone)]
pub struct Run {
    order: Vec<String>,
    /// The next target never offered (an index into `order`).
    next: usize,
    /// The index `step` last offered, and whether that offer was a same-target retry.
    current: Option<usize>,
    offered_retry: bool,
    max_attempts: u32,
    on: Vec<FailoverOn>,
    retry: Retry,
    /// Same-target retries taken, per index of `order`.
    retries: Vec<u32>,
    /// The retry `step` offers next.
    retry_next: Option<usize>,
    /// Retries declined because the attempts left had to go to targets not yet tried (issue
    /// 27): `(index, wait_ms)`, offered once every target was tried, while attempts remain.
    deferred: std::collections::VecDeque<(usize, u64)>,
    /// The wait before the deferred retry `step` just offered (see [`Run::take_deferred_wait`]).
    deferred_wait: Option<u64>,
    pub attempts: Vec<Attempt>,
    halted: Option<Halt>,
}

/// The base of the retry backoff: 0.25 s × 2^n (issue 17).
pub const RETRY_BACKOFF_MS: u64 = 250;

impl Run {
    pub fn new(order: Vec<String>, max_attempts: u32, on: Vec<FailoverOn>) -> Run {
        Run {
            retries: vec![0; order.len()],
            order,
            next: 0,
            current: None,
            offered_retry: false,
            max_attempts,
            on,
            retry: Retry::default(),
            retry_next: None,
            deferred: std::collections::VecDeque::new(),
            deferred_wait: None,
            attempts: Vec::new(),
            halted: None,
        }
    }

    /// With the route's same-target retry.
    pub fn with_retry(mut self, retry: Retry) -> Run {
        self.retry = retry;
        self
    }

    /// After a failed attempt (already [`Run::record`]ed): whether to retry the same target,
    /// and after how long. Yes when the route retries this class and has retries left for
    /// this target, the attempt bound allows another, and the wait — the reset hint when there
    /// is one and it is at most `max_wait_s`, else the backoff 0.25 s × 2^n × `jitter` (the
    /// caller's draw from [0.5, 1.5)) — ends before `remaining_ms`. A hint longer than
    /// `max_wait_s` is no retry (the target is parked and the run moves on). Proven exhaustion
    /// (a spent quota or credit) is never retried.
    ///
    /// Retrying never costs the route its failover (issue 27): a retry is taken now only when
    /// the attempts left after it still allow one attempt on each target not yet tried (when
    /// the class fails over to them); otherwise the run moves on and the retry is deferred,
    /// offered by [`Run::step`] once every target was tried, if attempts remain.
    pub fn retry_after(&mut self, class: Class, hint_ms: Option<u64>, jitter: f64, remaining_ms: u64) -> Option<u64> {
        let current = self.current?;
        let listed = |on: FailoverOn| self.retry.on.contains(&on);
        let retryable = match class {
            Class::RateLimited => listed(FailoverOn::RateLimited),
            Class::ServerError | Class::BadResponse => listed(FailoverOn::ServerError),
            Class::Timeout => listed(FailoverOn::Timeout),
            Class::Connect => listed(FailoverOn::Connect),
            _ => false,
        };
        let used = self.retries.get(current).copied().unwrap_or(u32::MAX);
        let left = self.max_attempts.saturating_sub(self.attempts.len() as u32);
        if !retryable || left == 0 || used >= self.retry.attempts {
            return None;
        }
        let wait = match hint_ms {
            Some(hint) if hint > u64::from(self.retry.max_wait_s) * 1000 => return None,
            Some(hint) => hint,
            None => ((RETRY_BACKOFF_MS << used.min(8)) as f64 * jitter.clamp(0.5, 1.5)) as u64,
        };
        if wait >= remaining_ms {
            return None;
        }
        let untried = if class.fails_over(&self.on) { self.order.len().saturating_sub(self.next) } else { 0 };
        if ((left - 1) as usize) < untried {
            if !self.deferred.iter().any(|&(i, _)| i == current) {
                self.deferred.push_back((current, wait));
            }
            return None;
        }
        if let Some(n) = self.retries.get_mut(current) {
            *n += 1;
        }
        self.retry_next = Some(current);
        // The same target again: the failure does not end the run, whatever `on` says.
        if self.halted == Some(Halt::IneligibleFailure) {
            self.halted = None;
        }
        Some(wait)
    }

    /// The wait owed before the deferred retry [`Run::step`] just offered: the caller sleeps
    /// what is left of it since that target failed (or skips the retry past the deadline).
    pub fn take_deferred_wait(&mut self) -> Option<u64> {
        self.deferred_wait.take()
    }

    /// The next target to try, or why the run stops. `deadline_passed` is the caller's clock.
    pub fn step(&mut self, deadline_passed: bool) -> Step {
        if let Some(halt) = self.halted {
            return Step::Stop(halt);
        }
        self.deferred_wait = None;
        let nothing_left = self.retry_next.is_none() && self.next >= self.order.len() && self.deferred.is_empty();
        let halt = if self.order.is_empty() {
            Some(Halt::NoEligibleTarget)
        } else if deadline_passed {
            Some(Halt::Deadline)
        } else if nothing_left {
            Some(Halt::Exhausted)
        } else if self.attempts.len() as u32 >= self.max_attempts {
            Some(Halt::AttemptBound)
        } else {
            None
        };
        if let Some(halt) = halt {
            self.halted = Some(halt);
            return Step::Stop(halt);
        }
        let (index, retry) = if let Some(index) = self.retry_next.take() {
            (index, true)
        } else if self.next < self.order.len() {
            self.next += 1;
            (self.next - 1, false)
        } else if let Some((index, wait)) = self.deferred.pop_front() {
            if let Some(n) = self.retries.get_mut(index) {
                *n += 1;
            }
            self.deferred_wait = Some(wait);
            (index, true)
        } else {
            self.halted = Some(Halt::Exhausted);
            return Step::Stop(Halt::Exhausted);
        };
        self.current = Some(index);
        self.offered_retry = retry;
        match self.order.get(index) {
            Some(id) => Step::Try(id.clone()),
            None => Step::Stop(Halt::Exhausted),
        }
    }

    /// Records the outcome of the attempt `step` last returned. A success ends the run; a
    /// failure ends it when the route does not fail over on its class.
    pub fn record(&mut self, model: &str, result: Result<(), Class>, status: Option<u16>, ms: u64) {
        let target = self.current.and_then(|i| self.order.get(i)).cloned().unwrap_or_default();
        let retry = std::mem::take(&mut self.offered_retry);
        self.push_attempt(target, model, result, status, ms, retry, false);
        match result {
            Ok(()) => self.halted = Some(Halt::Succeeded),
            Err(class) if !class.fails_over(&self.on) => self.halted = Some(Halt::IneligibleFailure),
            Err(_) => {}
        }
    }

    /// Completes the attempt that reached the client (the commit point, already recorded as
    /// a success when its first event arrived): a clean end, or a failure after visible
    /// output, which never fails over.
    pub fn record_committed(&mut self, result: Result<(), Class>, ms: u64) {
        if let Some(last) = self.attempts.last_mut() {
            last.committed = true;
            last.ms = ms;
            if let Err(class) = result {
                last.outcome = "failed";
                last.class = Some(class);
            }
        }
        self.halted = Some(if result.is_ok() { Halt::Succeeded } else { Halt::VisibleOutput });
    }

    /// The committed attempt broke after the commit point and the stream will be resumed: it
    /// is recorded as failed (its bytes did reach the client), and the run goes on.
    pub fn record_break(&mut self, class: Class, ms: u64) {
        if let Some(last) = self.attempts.last_mut() {
            last.committed = true;
            last.ms = ms;
            last.outcome = "failed";
            last.class = Some(class);
        }
    }

    /// A resume attempt at `target` (its result, until it becomes the committed one).
    pub fn record_resumed(
        &mut self,
        target: &str,
        model: &str,
        result: Result<(), Class>,
        status: Option<u16>,
        ms: u64,
    ) {
        self.push_attempt(target.to_string(), model, result, status, ms, false, true);
    }

    #[allow(clippy::too_many_arguments, reason = "one attempt's record, field by field")]
    fn push_attempt(
        &mut self,
        target: String,
        model: &str,
        result: Result<(), Class>,
        status: Option<u16>,
        ms: u64,
        retry: bool,
        resumed: bool,
    ) {
        let (outcome, class) = match result {
            Ok(()) => ("ok", None),
            Err(class) => ("failed", Some(class)),
        };
        let n = self.attempts.len() as u32 + 1;
        let model = model.to_string();
        self.attempts.push(Attempt { n, target, model, outcome, class, status, ms, committed: false, retry, resumed });
    }

    /// A stream that broke ends broken after its resume attempts failed (each already
    /// recorded).
    pub fn end_broken(&mut self) {
        self.halted = Some(Halt::VisibleOutput);
    }

    /// The planned order of targets (for resuming a stream on the next eligible ones).
    pub fn order(&self) -> &[String] {
        &self.order
    }

    /// The client went away: nothing more is tried.
    pub fn cancel(&mut self) {
        self.halted = Some(Halt::Cancelled);
    }

    pub fn halt(&self) -> Option<Halt> {
        self.halted
    }

    /// Failed attempts after which another target was tried (a same-target retry is not a
    /// failover).
    pub fn failovers(&self) -> usize {
        (0..self.attempts.len()).filter(|i| failed_over(&self.attempts, *i)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn default_on() -> Vec<FailoverOn> {
        crate::route::Failover::default().on
    }

    #[test]
    fn fails_over_then_succeeds() {
        let mut run = Run::new(vec!["a".into(), "b".into()], 3, default_on());
        assert_eq!(run.step(false), Step::Try("a".into()));
        run.record("m", Err(Class::ServerError), Some(503), 3);
        assert_eq!(run.step(false), Step::Try("b".into()));
        run.record("m", Ok(()), Some(200), 4);
        assert_eq!(run.step(false), Step::Stop(Halt::Succeeded));
        assert_eq!(run.failovers(), 1);
        assert_eq!(run.attempts[0].class, Some(Class::ServerError));
    }

    fn retrying(attempts: u32) -> Run {
        let retry = Retry { attempts, ..Retry::default() };
        Run::new(vec!["a".into(), "b".into()], 5, default_on()).with_retry(retry)
    }

    /// Issue 17: the same target again after a short hint or the backoff; a long hint, an
    /// unlisted class, the retry budget, the attempt bound or the deadline move on instead.
    #[test]
    fn same_target_retry() {
        let mut run = retrying(1);
        assert_eq!(run.step(false), Step::Try("a".into()));
        run.record("m", Err(Class::RateLimited), Some(429), 5);
        assert_eq!(run.retry_after(Class::RateLimited, Some(2_000), 1.0, 60_000), Some(2_000), "after its Retry-After");
        assert_eq!(run.step(false), Step::Try("a".into()), "the same target");
        run.record("m", Ok(()), Some(200), 5);
        assert_eq!(run.attempts.iter().map(|a| a.retry).collect::<Vec<_>>(), [false, true]);
        assert_eq!(run.failovers(), 0, "a retry is not a failover");

        let mut run = retrying(2);
        run.step(false);
        run.record("m", Err(Class::ServerError), Some(500), 5);
        assert_eq!(run.retry_after(Class::ServerError, None, 0.5, 60_000), Some(125), "0.25 s × 2^0 × 0.5");
        run.step(false);
        run.record("m", Err(Class::ServerError), Some(500), 5);
        assert_eq!(run.retry_after(Class::ServerError, None, 1.5, 60_000), Some(750), "0.25 s × 2^1 × 1.5");
        run.step(false);
        run.record("m", Err(Class::ServerError), Some(500), 5);
        assert_eq!(run.retry_after(Class::ServerError, None, 1.0, 60_000), None, "two retries were allowed");
        assert_eq!(run.step(false), Step::Try("b".into()), "then the run moves on");
        run.record("m", Err(Class::ServerError), Some(500), 5);
        assert_eq!(run.retry_after(Class::ServerError, None, 1.0, 60_000), Some(250), "the budget is per target");

        let mut run = retrying(3);
        run.step(false);
        run.record("m", Err(Class::RateLimited), Some(429), 5);
        assert_eq!(run.retry_after(Class::RateLimited, Some(6_000), 1.0, 60_000), None, "longer than max_wait_s (5)");
        assert_eq!(run.retry_after(Class::QuotaExhausted, None, 1.0, 60_000), None, "a spent quota is not retried");
        assert_eq!(run.retry_after(Class::ClientError, None, 1.0, 60_000), None);
        assert_eq!(run.retry_after(Class::Timeout, None, 1.0, 100), None, "the wait must end before the deadline");
        assert_eq!(retrying(0).retry_after(Class::ServerError, None, 1.0, 60_000), None, "off by default");
    }

    /// A retry whose target is then skipped (its breaker opened) does not mark the next
    /// target's attempt as a retry, nor hide the failover.
    #[test]
    fn a_skipped_retry_is_a_failover() {
        let mut run = retrying(1);
        run.step(false);
        run.record("m", Err(Class::ServerError), Some(500), 5);
        assert!(run.retry_after(Class::ServerError, None, 1.0, 60_000).is_some());
        assert_eq!(run.step(false), Step::Try("a".into()), "offered again, but the caller skips it");
        assert_eq!(run.step(false), Step::Try("b".into()));
        run.record("m", Ok(()), Some(200), 5);
        assert_eq!(run.attempts.iter().map(|a| a.retry).collect::<Vec<_>>(), [false, false]);
        assert_eq!(run.failovers(), 1);
    }

    /// A retry may rescue a class the route does not fail over on: the same target, not another.
    #[test]
    fn a_retry_is_not_a_failover_to_another_target() {
        let on = vec![FailoverOn::Timeout];
        let mut run =
            Run::new(vec!["a".into(), "b".into()], 5, on).with_retry(Retry { attempts: 1, ..Retry::default() });
        run.step(false);
        run.record("m", Err(Class::ServerError), Some(503), 5);
        assert_eq!(run.halt(), Some(Halt::IneligibleFailure));
        assert!(run.retry_after(Class::ServerError, None, 1.0, 60_000).is_some());
        assert_eq!(run.step(false), Step::Try("a".into()));
        run.record("m", Err(Class::ServerError), Some(503), 5);
        assert_eq!(run.halt(), Some(Halt::IneligibleFailure), "5xx still does not move to b");
    }

    /// Issue 27: with the attempt budget equal to the number of targets, a retry would starve
    /// the failover, so the run moves on; with budget to spare it retries first, and a
    /// deferred retry comes back once every target was tried.
    #[test]
    fn retries_never_cost_a_route_its_failover() {
        let two = || vec!["a".to_string(), "b".to_string()];
        let retry = Retry { attempts: 2, ..Retry::default() };
        let mut run = Run::new(two(), 2, default_on()).with_retry(retry.clone());
        assert_eq!(run.step(false), Step::Try("a".into()));
        run.record("m", Err(Class::ServerError), Some(503), 5);
        assert_eq!(run.retry_after(Class::ServerError, None, 1.0, 60_000), None, "b still needs the last attempt");
        assert_eq!(run.step(false), Step::Try("b".into()));
        run.record("m", Ok(()), Some(200), 5);
        assert_eq!(run.failovers(), 1);

        // Budget 3: one retry of a fits (b keeps its attempt), a second does not.
        let mut run = Run::new(two(), 3, default_on()).with_retry(retry.clone());
        run.step(false);
        run.record("m", Err(Class::RateLimited), Some(429), 5);
        assert_eq!(run.retry_after(Class::RateLimited, None, 1.0, 60_000), Some(250));
        assert_eq!(run.step(false), Step::Try("a".into()));
        run.record("m", Err(Class::RateLimited), Some(429), 5);
        assert_eq!(run.retry_after(Class::RateLimited, None, 1.0, 60_000), None);
        assert_eq!(run.step(false), Step::Try("b".into()));
        run.record("m", Err(Class::ServerError), Some(503), 5);
        assert_eq!(run.step(false), Step::Stop(Halt::AttemptBound));

        // Budget 3 with three targets: a's retry is deferred (b and c need the attempts left);
        // b turns out skipped (its circuit opened), so after c there is budget for it.
        let mut run = Run::new(vec!["a".into(), "b".into(), "c".into()], 3, default_on()).with_retry(retry);
        run.step(false);
        run.record("m", Err(Class::ServerError), Some(503), 5);
        assert_eq!(run.retry_after(Class::ServerError, None, 1.0, 60_000), None, "deferred");
        assert_eq!(run.step(false), Step::Try("b".into()), "offered; the caller skips it");
        assert_eq!(run.step(false), Step::Try("c".into()));
        assert_eq!(run.take_deferred_wait(), None);
        run.record("m", Err(Class::ServerError), Some(503), 5);
        assert_eq!(run.retry_after(Class::ServerError, None, 1.0, 60_000), Some(250), "c is last: its retry fits");
        assert_eq!(run.step(false), Step::Try("c".into()));
        run.record("m", Err(Class::ServerError), Some(503), 5);
        assert_eq!(run.step(false), Step::Stop(Halt::AttemptBound));

        let mut run = Run::new(vec!["a".into(), "b".into(), "c".into()], 3, default_on())
            .with_retry(Retry { attempts: 1, ..Retry::default() });
        run.step(false);
        run.record("m", Err(Class::ServerError), Some(503), 5);
        assert_eq!(run.retry_after(Class::ServerError, None, 1.0, 60_000), None, "deferred");
        assert_eq!(run.step(false), Step::Try("b".into()), "offered; the caller skips it");
        assert_eq!(run.step(false), Step::Try("c".into()));
        run.record("m", Err(Class::RateLimited), Some(429), 5);
        assert_eq!(run.retry_after(Class::RateLimited, Some(30_000), 1.0, 60_000), None, "c says 30 s");
        assert_eq!(run.step(false), Step::Try("a".into()), "the deferred retry");
        assert_eq!(run.take_deferred_wait(), Some(250));
        run.record("m", Ok(()), Some(200), 5);
        assert_eq!(run.attempts.iter().map(|a| a.retry).collect::<Vec<_>>(), [false, false, true]);
        assert_eq!(run.step(false), Step::Stop(Halt::Succeeded));
    }

    #[test]
    fn halts() {
        let mut run = Run::new(vec![], 3, default_on());
        assert_eq!(run.step(false), Step::Stop(Halt::NoEligibleTarget));

        let mut run = Run::new(vec!["a".into(), "b".into()], 3, default_on());
        run.step(false);
        run.record("m", Err(Class::ClientError), Some(400), 1);
        assert_eq!(run.step(false), Step::Stop(Halt::IneligibleFailure));
        assert_eq!(run.failovers(), 0);

        let mut run = Run::new(vec!["a".into(), "b".into(), "c".into()], 2, default_on());
        for _ in 0..2 {
            run.step(false);
            run.record("m", Err(Class::Timeout), None, 1);
        }
        assert_eq!(run.step(false), Step::Stop(Halt::AttemptBound));
        assert_eq!(run.failovers(), 1);

        let mut run = Run::new(vec!["a".into()], 3, default_on());
        run.step(false);
        run.record("m", Err(Class::Connect), None, 1);
        assert_eq!(run.step(false), Step::Stop(Halt::Exhausted));

        let mut run = Run::new(vec!["a".into(), "b".into()], 3, default_on());
        run.step(false);
        run.record("m", Err(Class::Timeout), None, 1);
        assert_eq!(run.step(true), Step::Stop(Halt::Deadline));
    }

    #[test]
    fn a_stream_that_breaks_after_the_commit_point_never_fails_over() {
        let mut run = Run::new(vec!["a".into(), "b".into()], 3, default_on());
        run.step(false);
        run.record("m", Ok(()), Some(200), 1);
        run.record_committed(Err(Class::Connect), 5);
        assert_eq!(run.attempts.len(), 1, "the committed attempt is completed, not added");
        assert_eq!(run.step(false), Step::Stop(Halt::VisibleOutput));
        assert!(run.attempts[0].committed);
        assert_eq!(run.failovers(), 0);
    }

    proptest! {
        /// ROUTING.md invariants for any eligible set, bound and failure sequence: attempts stay
        /// inside the planned set, no target twice, never more than max_attempts, and the run
        /// always ends.
        #[test]
        fn attempts_stay_inside_the_plan(
            n_targets in 0usize..8,
            max_attempts in 1u32..6,
            outcomes in proptest::collection::vec(0u8..6, 0..10),
            deadline_after in 0usize..12,
        ) {
            let order: Vec<String> = (0..n_targets).map(|i| format!("t{i}")).collect();
            let mut run = Run::new(order.clone(), max_attempts, default_on());
            let mut tried = std::collections::BTreeSet::new();
            let mut steps = 0;
            loop {
                steps += 1;
                prop_assert!(steps < 100, "the run ends");
                match run.step(steps > deadline_after) {
                    Step::Try(id) => {
                        prop_assert!(order.contains(&id));
                        prop_assert!(tried.insert(id.clone()), "{} tried twice", id);
                        let result = match outcomes.get(tried.len() - 1).copied().unwrap_or(0) {
                            0 => Ok(()),
                            1 => Err(Class::ServerError),
                            2 => Err(Class::Timeout),
                            3 => Err(Class::ClientError),
                            4 => Err(Class::RateLimited),
                            _ => Err(Class::BadResponse),
                        };
                        run.record("m", result, None, 1);
                    }
                    Step::Stop(_) => break,
                }
            }
            prop_assert!(run.attempts.len() as u32 <= max_attempts);
            prop_assert!(run.attempts.len() <= n_targets);
            prop_assert!(run.failovers() <= run.attempts.len());
        }

        /// With same-target retries on (issue 27): never more than max_attempts, no target
        /// retried more than `retry.attempts` times, only planned targets, and when every
        /// attempt fails over, every target gets an attempt the budget allows before any retry
        /// takes one from it: `min(targets, max_attempts)` distinct targets are tried.
        #[test]
        fn retries_stay_in_budget_and_never_starve_failover(
            n_targets in 1usize..6,
            max_attempts in 1u32..8,
            retries in 0u32..4,
            failures in proptest::collection::vec(0u8..4, 0..16),
            hints in proptest::collection::vec(proptest::option::of(0u64..3000), 0..16),
        ) {
            let order: Vec<String> = (0..n_targets).map(|i| format!("t{i}")).collect();
            let retry = Retry { attempts: retries, ..Retry::default() };
            let mut run = Run::new(order.clone(), max_attempts, default_on()).with_retry(retry);
            let mut steps = 0;
            let mut all_fail_over = true;
            loop {
                steps += 1;
                prop_assert!(steps < 200, "the run ends");
                match run.step(false) {
                    Step::Try(id) => {
                        prop_assert!(order.contains(&id));
                        let n = run.attempts.len();
                        let class = match failures.get(n).copied().unwrap_or(0) {
                            0 => Class::ServerError,
                            1 => Class::RateLimited,
                            2 => Class::Timeout,
                            _ => Class::ClientError,
                        };
                        all_fail_over &= class.fails_over(&default_on());
                        run.record("m", Err(class), None, 1);
                        let _ = run.retry_after(class, hints.get(n).copied().flatten(), 1.0, 60_000);
                        let _ = run.take_deferred_wait();
                    }
                    Step::Stop(_) => break,
                }
            }
            prop_assert!(run.attempts.len() as u32 <= max_attempts);
            for id in &order {
                let tries = run.attempts.iter().filter(|a| &a.target == id).count() as u32;
                prop_assert!(tries <= 1 + retries, "{} tried {} times", id, tries);
            }
            if all_fail_over {
                let distinct: std::collections::BTreeSet<&str> = run.attempts.iter().map(|a| a.target.as_str()).collect();
                prop_assert_eq!(distinct.len(), n_targets.min(max_attempts as usize));
            }
        }
    }
}
