//! Cost, usage rows and budget states: the accounting that must be exact. Money is integer
//! micro-USD; a call's cost is rounded once (half up) and spend is the exact sum of call
//! costs, so stored totals reconcile with per-call figures to the micro-dollar.

use serde::{Deserialize, Serialize};

use crate::money::Usd;
use crate::route::{AtLimit, Budget};
use crate::target::Price;

/// Cost of one call in micro-USD: tokens × USD-per-million-tokens, rounded half up once.
pub fn cost_micros(price: Option<&Price>, input_tokens: u64, output_tokens: u64) -> i64 {
    cost_of(price, &TokenUsage { input: input_tokens, output: output_tokens, ..TokenUsage::default() })
}

/// The tokens of one answer, normalised across providers. `input` counts every prompt token,
/// cached ones included (OpenAI's `prompt_tokens`; Anthropic's `input_tokens` +
/// `cache_read_input_tokens` + `cache_creation_input_tokens`); `cache_read` and `cache_write`
/// say how many of them the provider read from or wrote to its prompt cache; `reasoning` how
/// many of the `output` tokens the model spent reasoning, where the provider says (OpenAI's
/// `completion_tokens_details.reasoning_tokens`; Anthropic counts thinking in `output_tokens`
/// without a separate figure): informational, already priced in `output`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub input: u64,
    pub output: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub reasoning: u64,
}

/// Cost of one call in micro-USD, cache reads and writes at their own prices where the target
/// sets them (the input price otherwise), rounded half up once.
pub fn cost_of(price: Option<&Price>, usage: &TokenUsage) -> i64 {
    let Some(price) = price else { return 0 };
    let cached = usage.cache_read.saturating_add(usage.cache_write).min(usage.input);
    let cache_read = usage.cache_read.min(cached);
    let cache_write = cached - cache_read;
    let per = |usd: Option<Usd>| i128::from(usd.unwrap_or(price.input_per_mtok).micros());
    // price (micro-USD per million tokens) × tokens / 1e6, in 128 bits: no overflow, no floats.
    let total = i128::from(price.input_per_mtok.micros()) * i128::from(usage.input - cached)
        + per(price.cache_read_per_mtok) * i128::from(cache_read)
        + per(price.cache_write_per_mtok) * i128::from(cache_write)
        + i128::from(price.output_per_mtok.micros()) * i128::from(usage.output);
    i64::try_from((total + 500_000) / 1_000_000).unwrap_or(i64::MAX)
}

/// One `(route, target)` counter row of `gw_usage:{tenant}:{yyyymmdd}` (ARCHITECTURE.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// Attempts made to the target (the sum of `calls` is what providers received).
    pub calls: u64,
    pub ok: u64,
    pub errors: u64,
    /// Failed attempts after which another target was tried.
    pub failovers_from: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micros: i64,
    pub latency_ms_sum: u64,
    /// Calls whose usage was estimated (4 characters a token), not reported.
    pub estimated: u64,
    pub stream_broken: u64,
    /// Attempts that resumed a broken stream (`stream_resume`).
    #[serde(default)]
    pub stream_resumed: u64,
    /// Requests refused by a rate limit before routing (issue 18): never calls. Their row's
    /// target is empty.
    #[serde(default)]
    pub rate_limited: u64,
}

impl UsageRow {
    pub fn add(&mut self, other: &UsageRow) {
        self.calls += other.calls;
        self.ok += other.ok;
        self.errors += other.errors;
        self.failovers_from += other.failovers_from;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_micros += other.cost_micros;
        self.latency_ms_sum += other.latency_ms_sum;
        self.estimated += other.estimated;
        self.stream_broken += other.stream_broken;
        self.stream_resumed += other.stream_resumed;
        self.rate_limited += other.rate_limited;
    }
}

/// ROUTING.md step 3.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetState {
    #[default]
    Ok,
    Warn,
    Fallback,
    Block,
}

impl BudgetState {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetState::Ok => "ok",
            BudgetState::Warn => "warn",
            BudgetState::Fallback => "fallback",
            BudgetState::Block => "block",
        }
    }
}

/// `warn` from 80 % whatever `at_limit` says (callers see it coming); at 100 % what `at_limit`
/// says. No budget: `ok`.
pub fn budget_state(budget: Option<&Budget>, spend: Usd) -> BudgetState {
    let Some(budget) = budget else { return BudgetState::Ok };
    let (spend, limit) = (i128::from(spend.micros()), i128::from(budget.monthly.micros()));
    if spend >= limit {
        match budget.at_limit {
            AtLimit::Warn => BudgetState::Warn,
            AtLimit::Fallback => BudgetState::Fallback,
            AtLimit::Block => BudgetState::Block,
        }
    } else if spend * 10 >= limit * 8 {
        BudgetState::Warn
    } else {
        BudgetState::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::from_json_field;

    fn price(input: &str, output: &str) -> Price {
        from_json_field(format!(r#"{{"input_per_mtok": {input}, "output_per_mtok": {output}}}"#).as_bytes()).unwrap()
    }

    #[test]
    fn costs_are_exact_integers() {
        let p = price("2.5", "10");
        assert_eq!(cost_micros(Some(&p), 1_000_000, 0), 2_500_000);
        assert_eq!(cost_micros(Some(&p), 10, 20), 225, "10 × 2.5 + 20 × 10 = 225 micro-USD");
        assert_eq!(cost_micros(Some(&price("0.15", "0.6")), 1, 1), 1, "0.75 micro-USD rounds half up to 1");
        assert_eq!(cost_micros(Some(&price("0.15", "0.6")), 1, 0), 0, "0.15 rounds to 0");
        assert_eq!(cost_micros(None, 1_000, 1_000), 0, "unpriced costs 0");
        assert_eq!(cost_micros(Some(&price("1000000", "1000000")), u64::MAX, u64::MAX), i64::MAX, "saturates");
    }

    #[test]
    fn cache_reads_and_writes_have_their_own_prices() {
        let mut p = price("3", "15");
        let usage = TokenUsage { input: 1_000, output: 100, cache_read: 600, cache_write: 200, reasoning: 0 };
        assert_eq!(cost_of(Some(&p), &usage), 4_500, "without cache prices: 1000 × 3 + 100 × 15");
        p.cache_read_per_mtok = Some(Usd(300_000));
        p.cache_write_per_mtok = Some(Usd(3_750_000));
        // 200 uncached × 3 + 600 × 0.3 + 200 × 3.75 + 100 × 15 = 600 + 180 + 750 + 1500
        assert_eq!(cost_of(Some(&p), &usage), 3_030);
        let odd = TokenUsage { input: 10, output: 0, cache_read: 50, cache_write: 50, reasoning: 0 };
        assert_eq!(cost_of(Some(&p), &odd), 3, "cached never exceeds input: 10 read at 0.3");
    }

    #[test]
    fn budget_states() {
        let budget = |at: &str| -> Budget {
            from_json_field(format!(r#"{{"monthly": 100, "at_limit": "{at}", "fallback_targets": ["x"]}}"#).as_bytes())
                .unwrap()
        };
        let usd = |n: i64| Usd(n * 1_000_000);
        assert_eq!(budget_state(None, usd(1_000)), BudgetState::Ok);
        assert_eq!(budget_state(Some(&budget("block")), usd(79)), BudgetState::Ok);
        assert_eq!(budget_state(Some(&budget("block")), usd(80)), BudgetState::Warn);
        assert_eq!(budget_state(Some(&budget("block")), usd(100)), BudgetState::Block);
        assert_eq!(budget_state(Some(&budget("fallback")), usd(150)), BudgetState::Fallback);
        assert_eq!(budget_state(Some(&budget("warn")), usd(100)), BudgetState::Warn);
    }

    #[test]
    fn rows_add_up() {
        let mut a = UsageRow { calls: 1, ok: 1, cost_micros: 5, ..Default::default() };
        a.add(&UsageRow { calls: 2, errors: 2, failovers_from: 1, cost_micros: 7, ..Default::default() });
        assert_eq!((a.calls, a.ok, a.errors, a.failovers_from, a.cost_micros), (3, 1, 2, 1, 12));
    }
}
