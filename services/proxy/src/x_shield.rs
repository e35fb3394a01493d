//! `x_shield`, Shield's record in an answer's body: how the call was routed and what the
//! guardrails found.
//!
//! The record is serialised straight from the run, without building a JSON tree first
//! (building and dropping that tree was the largest cost of Shield's own on the answer path,
//! issue 19). An answer kept as its upstream sent it ([`crate::provider::as_sent`], every
//! same-shape answer) has it written by hand ([`XShieldJson::write_json`]): serde_json escapes
//! every key and short value byte by byte, which was ~4 % of a small request's instructions
//! (issue 33). The derived `Serialize` stays, for the trees of the rarer paths, and is the
//! oracle the hand writer is tested against.

use serde::Serialize;
use serde_json::Value;
use shield_core::json_write::{push_array, push_str};
use shield_core::plan::Excluded;
use shield_core::run::{Attempt, Halt};

use crate::dispatch::{Routed, RoutedResult};
use crate::guard::GuardrailRecord;

/// `x_shield.routing`.
#[derive(Serialize)]
pub struct RoutingRecord<'a> {
    route: &'a str,
    target: Option<&'a str>,
    attempts: &'a [Attempt],
    excluded: &'a [Excluded],
    rule: &'a Option<Value>,
    reason: Option<&'a str>,
    /// USD; the exact figure is `cost_micros`.
    cost: Option<f64>,
    cost_micros: Option<i64>,
    halt: Halt,
    budget: &'static str,
}

/// `x_shield` of an answer: how it was routed and what the guardrails found.
#[derive(Serialize)]
pub struct XShield<'a> {
    pub routing: RoutingRecord<'a>,
    pub guardrail_results: &'a [GuardrailRecord],
}

pub fn routing_record<'a>(routed: &'a Routed, target: Option<&'a str>) -> RoutingRecord<'a> {
    let reason = match &routed.result {
        RoutedResult::Refusal { reason, .. } => Some(reason.as_str()),
        _ => None,
    };
    RoutingRecord {
        route: &routed.route,
        target,
        attempts: &routed.attempts,
        excluded: &routed.excluded,
        rule: &routed.rule,
        reason,
        // Micro-dollars are exact in an f64 division: the nearest double to the decimal.
        cost: routed.cost_micros.map(|micros| micros as f64 / 1_000_000.0),
        cost_micros: routed.cost_micros,
        halt: routed.halt,
        budget: routed.budget.as_str(),
    }
}

/// A value spliced into an answer as its `x_shield`: Shield's record written by hand, any
/// other value (tests, error bodies) as serde_json writes it.
pub trait XShieldJson: Serialize {
    /// Appends the value's JSON text, as `serde_json::to_writer` would write it.
    fn write_json(&self, out: &mut Vec<u8>) {
        serde(out, self);
    }
}

impl XShieldJson for Value {}

impl XShieldJson for XShield<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"routing\":");
        self.routing.write_json(out);
        out.extend_from_slice(b",\"guardrail_results\":");
        push_array(out, self.guardrail_results, |out, record| record.write_json(out));
        out.push(b'}');
    }
}

impl RoutingRecord<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        let RoutingRecord { route, target, attempts, excluded, rule, reason, cost, cost_micros, halt, budget } = self;
        out.extend_from_slice(b"{\"route\":");
        push_str(out, route);
        out.extend_from_slice(b",\"target\":");
        optional_str(out, *target);
        out.extend_from_slice(b",\"attempts\":");
        push_array(out, attempts.iter(), write_attempt);
        out.extend_from_slice(b",\"excluded\":");
        // Rare (an exclusion), and its reasons are serde's names.
        push_array(out, excluded.iter(), serde);
        out.extend_from_slice(b",\"rule\":");
        serde(out, rule);
        out.extend_from_slice(b",\"reason\":");
        optional_str(out, *reason);
        out.extend_from_slice(b",\"cost\":");
        // serde_json's own float writing, so the figure reads the same as before.
        serde(out, cost);
        out.extend_from_slice(b",\"cost_micros\":");
        match cost_micros {
            Some(micros) => out.extend_from_slice(itoa::Buffer::new().format(*micros).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"halt\":");
        push_str(out, halt.as_str());
        out.extend_from_slice(b",\"budget\":");
        push_str(out, budget);
        out.push(b'}');
    }
}

/// One attempt, as its derived `Serialize` writes it (fields in order, the optional ones
/// skipped as it skips them).
fn write_attempt(out: &mut Vec<u8>, attempt: &Attempt) {
    let Attempt { n, target, model, outcome, class, status, ms, committed, retry, resumed } = attempt;
    let mut digits = itoa::Buffer::new();
    out.extend_from_slice(b"{\"n\":");
    out.extend_from_slice(digits.format(*n).as_bytes());
    out.extend_from_slice(b",\"target\":");
    push_str(out, target);
    out.extend_from_slice(b",\"model\":");
    push_str(out, model);
    out.extend_from_slice(b",\"outcome\":");
    push_str(out, outcome);
    if let Some(class) = class {
        out.extend_from_slice(b",\"class\":");
        push_str(out, class.as_str());
    }
    if let Some(status) = status {
        out.extend_from_slice(b",\"status\":");
        out.extend_from_slice(digits.format(*status).as_bytes());
    }
    out.extend_from_slice(b",\"ms\":");
    out.extend_from_slice(digits.format(*ms).as_bytes());
    out.extend_from_slice(if *committed { b",\"committed\":true" } else { b",\"committed\":false" });
    if *retry {
        out.extend_from_slice(b",\"retry\":true");
    }
    if *resumed {
        out.extend_from_slice(b",\"resumed\":true");
    }
    out.push(b'}');
}

fn optional_str(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        Some(text) => push_str(out, text),
        None => out.extend_from_slice(b"null"),
    }
}

/// Appends `value` as serde_json writes it.
fn serde(out: &mut Vec<u8>, value: &(impl Serialize + ?Sized)) {
    // Writing to a Vec cannot fail; the values written here have no map with non-string keys.
    let _ = serde_json::to_writer(out, value);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;
    use shield_core::detect::Findings;
    use shield_core::guardrails::Mode;
    use shield_core::outcome::Class;
    use shield_core::plan::Exclusion;

    use super::*;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![Just(String::new()), "[a-z0-9-]{1,12}", any::<String>(), Just("quote \" back \\ nl \n é 😀".into())]
    }

    fn attempt() -> impl Strategy<Value = Attempt> {
        let class = prop::option::of(prop::sample::select(vec![
            Class::Timeout,
            Class::Connect,
            Class::RateLimited,
            Class::QuotaExhausted,
            Class::CreditExhausted,
            Class::ServerError,
            Class::ContextLength,
        ]));
        (
            (any::<u32>(), text(), text(), prop::sample::select(vec!["ok", "failed"])),
            (class, any::<Option<u16>>(), any::<u64>(), any::<[bool; 3]>()),
        )
            .prop_map(|((n, target, model, outcome), (class, status, ms, [committed, retry, resumed]))| {
                Attempt { n, target, model, outcome, class, status, ms, committed, retry, resumed }
            })
    }

    fn record() -> impl Strategy<Value = GuardrailRecord> {
        (
            prop::sample::select(shield_core::guardrails::GUARDRAIL_NAMES.to_vec()),
            prop::sample::select(vec![Mode::Off, Mode::Monitor, Mode::Warn, Mode::Block]),
            any::<bool>(),
            prop::sample::select(vec!["input", "output"]),
            any::<bool>(),
        )
            .prop_map(|(name, mode, passed, phase, found)| {
                let findings: Findings = if found { [("email", 2), ("us_ssn", 1)].into() } else { Findings::new() };
                GuardrailRecord { findings, mode, name, passed, phase }
            })
    }

    proptest! {
        /// The hand writer writes what the derived `Serialize` writes, byte for byte.
        #[test]
        fn the_hand_written_record_is_serdes(
            route in text(),
            target in prop::option::of(text()),
            attempts in prop::collection::vec(attempt(), 0..4),
            excluded in prop::collection::vec((text(), prop::sample::select(vec![Exclusion::Rule, Exclusion::Budget])), 0..3),
            rule in prop::option::of(Just(json!({"index": 0, "description": "a rule \"quoted\""}))),
            reason in prop::option::of(text()),
            cost_micros in prop::option::of(prop_oneof![Just(0i64), any::<i64>(), 0i64..10_000_000]),
            halt in prop::sample::select(vec![Halt::Succeeded, Halt::Exhausted, Halt::NoEligibleTarget, Halt::Denied, Halt::Cancelled]),
            budget in prop::sample::select(vec!["ok", "warned", "blocked"]),
            records in prop::collection::vec(record(), 0..5),
        ) {
            let excluded: Vec<Excluded> = excluded.into_iter().map(|(target, reason)| Excluded { target, reason }).collect();
            let routing = RoutingRecord {
                route: &route,
                target: target.as_deref(),
                attempts: &attempts,
                excluded: &excluded,
                rule: &rule,
                reason: reason.as_deref(),
                cost: cost_micros.map(|micros| micros as f64 / 1_000_000.0),
                cost_micros,
                halt,
                budget,
            };
            let x_shield = XShield { routing, guardrail_results: &records };
            let mut written = Vec::new();
            x_shield.write_json(&mut written);
            prop_assert_eq!(String::from_utf8(written).unwrap(), serde_json::to_string(&x_shield).unwrap());
        }
    }

    #[test]
    fn any_other_value_is_written_as_serde_writes_it() {
        let mut written = Vec::new();
        json!({"routing": [null, "x\n", 1.5]}).write_json(&mut written);
        assert_eq!(written, br#"{"routing":[null,"x\n",1.5]}"#);
    }
}
