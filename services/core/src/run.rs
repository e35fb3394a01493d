//! The attempt loop as a pure state machine: which target to try next, when to stop and why
//! (ROUTING.md "Halts"). The proxy performs the calls and reports each outcome; this module
//! guarantees the invariants: attempts only go to the planned eligible set, each target at most
//! once, never more than `max_attempts`, never past the deadline.

use serde::Serialize;

use crate::outcome::Class;
use crate::route::FailoverOn;

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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Try(String),
    Stop(Halt),
}

#[derive(Debug, Clone)]
pub struct Run {
    order: Vec<String>,
    next: usize,
    max_attempts: u32,
    on: Vec<FailoverOn>,
    pub attempts: Vec<Attempt>,
    halted: Option<Halt>,
}

impl Run {
    pub fn new(order: Vec<String>, max_attempts: u32, on: Vec<FailoverOn>) -> Run {
        Run { order, next: 0, max_attempts, on, attempts: Vec::new(), halted: None }
    }

    /// The next target to try, or why the run stops. `deadline_passed` is the caller's clock.
    pub fn step(&mut self, deadline_passed: bool) -> Step {
        if let Some(halt) = self.halted {
            return Step::Stop(halt);
        }
        let halt = if self.order.is_empty() {
            Some(Halt::NoEligibleTarget)
        } else if deadline_passed {
            Some(Halt::Deadline)
        } else if self.next >= self.order.len() {
            Some(Halt::Exhausted)
        } else if self.attempts.len() as u32 >= self.max_attempts {
            Some(Halt::AttemptBound)
        } else {
            None
        };
        match halt {
            Some(halt) => {
                self.halted = Some(halt);
                Step::Stop(halt)
            }
            None => {
                let id = self.order[self.next].clone();
                self.next += 1;
                Step::Try(id)
            }
        }
    }

    /// Records the outcome of the attempt `step` last returned. A success ends the run; a
    /// failure ends it when the route does not fail over on its class.
    pub fn record(&mut self, model: &str, result: Result<(), Class>, status: Option<u16>, ms: u64) {
        let target = self.order[self.next - 1].clone();
        let n = self.attempts.len() as u32 + 1;
        let (outcome, class) = match result {
            Ok(()) => ("ok", None),
            Err(class) => ("failed", Some(class)),
        };
        self.attempts.push(Attempt {
            n,
            target,
            model: model.to_string(),
            outcome,
            class,
            status,
            ms,
            committed: false,
        });
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

    /// The client went away: nothing more is tried.
    pub fn cancel(&mut self) {
        self.halted = Some(Halt::Cancelled);
    }

    pub fn halt(&self) -> Option<Halt> {
        self.halted
    }

    /// Failed attempts after which another target was tried.
    pub fn failovers(&self) -> usize {
        let failed = self.attempts.iter().filter(|a| a.outcome == "failed").count();
        match self.halted {
            Some(Halt::Succeeded) => failed,
            _ => failed.saturating_sub(1),
        }
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
    }
}
