//! What a tenant API key may do beyond its rate limits (issue 32): which routes it may name,
//! until when it works, what it may spend a month, and the labels its holder is known by.
//! The same monthly budget shape is the operator's cap on a whole tenant.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::Problems;
use crate::money::Usd;

/// At most this many route patterns on one key.
pub const MAX_ROUTE_PATTERNS: usize = 50;
/// A rotated key's old secret keeps working at most this long (7 days).
pub const MAX_GRACE_S: u64 = 7 * 86_400;
/// Metadata: at most this many entries, of these sizes.
pub const MAX_METADATA_ENTRIES: usize = 20;
const MAX_METADATA_KEY: usize = 64;
const MAX_METADATA_VALUE: usize = 256;

/// A monthly spend budget in the tenant's currency (USD): a key's own, or the cap the platform
/// operator puts on a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MonthlyBudget {
    /// USD per calendar month (UTC), e.g. `25` or `0.5`.
    pub monthly: Usd,
    /// `block` refuses calls once the month's spend reaches `monthly`; `warn` only tells
    /// (a header past 80 %, and the `budget_exceeded` webhook at 100 %).
    #[serde(default)]
    pub action: BudgetAction,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetAction {
    #[default]
    Block,
    Warn,
}

/// Where a month's spend stands against a [`MonthlyBudget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Under 80 %.
    Within,
    /// 80 % or more; or past 100 % with `warn`.
    Warn,
    /// 100 % or more with `block`: refuse.
    Blocked,
}

impl MonthlyBudget {
    /// The standing of `spent` micro-USD this month.
    pub fn standing(&self, spent: i64) -> Standing {
        let (spent, limit) = (i128::from(spent), i128::from(self.monthly.micros()));
        if spent >= limit && self.action == BudgetAction::Block {
            Standing::Blocked
        } else if spent * 10 >= limit * 8 {
            Standing::Warn
        } else {
            Standing::Within
        }
    }

    pub fn check(&self, p: &mut Problems, at: &str) {
        if self.monthly.micros() <= 0 {
            p.push(format!("{at}.monthly"), "must be a positive amount of USD");
        }
    }
}

/// Whether a key whose allow-list is `patterns` may name `route` (`None`: every route). A
/// pattern is a route name in which `*` stands for any run of characters (`team-*`).
pub fn allows(patterns: Option<&[String]>, route: &str) -> bool {
    patterns.is_none_or(|patterns| patterns.iter().any(|p| glob(p.as_bytes(), route.as_bytes())))
}

/// `*`-only wildcard matching, iterative (no recursion, no allocation): on a mismatch after a
/// `*`, the star takes one more character and matching resumes.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(c) if Some(c) == text.get(t) => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern.get(p..).is_some_and(|rest| rest.iter().all(|&c| c == b'*'))
}

/// An allow-list's problems: each pattern is a route name (`names::check_route_name`) in
/// which `*` may also appear, never two in a row.
pub fn check_routes(patterns: &[String], p: &mut Problems, at: &str) {
    if patterns.len() > MAX_ROUTE_PATTERNS {
        p.push(at, format!("at most {MAX_ROUTE_PATTERNS} route patterns"));
    }
    for (i, pattern) in patterns.iter().enumerate() {
        let field = format!("{at}[{i}]");
        if pattern.contains("**") {
            p.push(field, "must not contain `**` (one `*` already matches any run of characters)");
            continue;
        }
        if pattern == "*" {
            continue;
        }
        // A pattern is a route name once its stars are read as a letter.
        if let Err(message) = crate::names::check_route_name(&pattern.replace('*', "x")) {
            p.push(field, format!("{message}; `*` matches any run of characters"));
        }
    }
}

/// Metadata's problems: short keys of letters, digits, `.`, `_`, `-`; short printable values.
pub fn check_metadata(metadata: &BTreeMap<String, String>, p: &mut Problems, at: &str) {
    if metadata.len() > MAX_METADATA_ENTRIES {
        p.push(at, format!("at most {MAX_METADATA_ENTRIES} entries"));
    }
    for (key, value) in metadata {
        let ok_key = (1..=MAX_METADATA_KEY).contains(&key.len())
            && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok_key {
            p.push(format!("{at}.{key}"), format!("keys are 1-{MAX_METADATA_KEY} letters, digits, '.', '_' or '-'"));
        }
        if value.chars().count() > MAX_METADATA_VALUE || value.chars().any(char::is_control) {
            p.push(
                format!("{at}.{key}"),
                format!("values are at most {MAX_METADATA_VALUE} characters, without control characters"),
            );
        }
    }
}

/// A rotation's grace: 0 to 7 days.
pub fn check_grace(grace_s: i64, p: &mut Problems, at: &str) {
    if !(0..=MAX_GRACE_S as i64).contains(&grace_s) {
        p.push(at, format!("must be between 0 and {MAX_GRACE_S} seconds (7 days)"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(patterns: &[&str]) -> Vec<String> {
        patterns.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn patterns_match_names_and_stars() {
        let list = owned(&["smart", "team-*", "shield/*-mini"]);
        for (name, allowed) in [
            ("smart", true),
            ("smarter", false),
            ("team-", true),
            ("team-a", true),
            ("team-a/b", true),
            ("xteam-a", false),
            ("shield/gpt-mini", true),
            ("shield/gpt-max", false),
        ] {
            assert_eq!(allows(Some(&list), name), allowed, "{name}");
        }
        assert!(allows(None, "anything"), "no allow-list: every route");
        assert!(!allows(Some(&[]), "smart"), "an empty allow-list allows nothing");
        assert!(allows(Some(&owned(&["*"])), "x"));
        assert!(allows(Some(&owned(&["a*b*c"])), "aXXbYYbc"));
        assert!(!allows(Some(&owned(&["a*b*c"])), "aXXbYYb"));
    }

    #[test]
    fn malformed_patterns_name_their_index() {
        let mut p = Problems::default();
        check_routes(&owned(&["ok-*", "", "a**", "bad name", "/x"]), &mut p, "routes");
        let fields: Vec<String> = p.into_result().unwrap_err().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["routes[1]", "routes[2]", "routes[3]", "routes[4]"]);
    }

    #[test]
    fn budgets_stand_at_80_and_100_percent() {
        let budget = |action| MonthlyBudget { monthly: Usd(1_000_000), action };
        assert_eq!(budget(BudgetAction::Block).standing(799_999), Standing::Within);
        assert_eq!(budget(BudgetAction::Block).standing(800_000), Standing::Warn);
        assert_eq!(budget(BudgetAction::Block).standing(1_000_000), Standing::Blocked);
        assert_eq!(budget(BudgetAction::Warn).standing(5_000_000), Standing::Warn);
        let parsed: MonthlyBudget = serde_json::from_str(r#"{"monthly": 2.5}"#).unwrap();
        assert_eq!(parsed, MonthlyBudget { monthly: Usd(2_500_000), action: BudgetAction::Block });
        assert!(serde_json::from_str::<MonthlyBudget>(r#"{"monthly": 1, "action": "stop"}"#).is_err());
        assert!(serde_json::from_str::<MonthlyBudget>(r#"{"monthly": "x"}"#).is_err());
        let mut p = Problems::default();
        MonthlyBudget { monthly: Usd(-1), action: BudgetAction::Warn }.check(&mut p, "budget");
        assert_eq!(p.into_result().unwrap_err()[0].field, "budget.monthly");
    }

    #[test]
    fn metadata_and_grace_bounds() {
        let mut p = Problems::default();
        let ok: BTreeMap<String, String> = [("owner".into(), "alice".into()), ("team".into(), "ml".into())].into();
        check_metadata(&ok, &mut p, "metadata");
        check_grace(0, &mut p, "grace_s");
        check_grace(MAX_GRACE_S as i64, &mut p, "grace_s");
        assert!(p.into_result().is_ok());
        let mut p = Problems::default();
        let bad: BTreeMap<String, String> = [("no spaces".into(), "x".into()), ("k".into(), "a\nb".into())].into();
        check_metadata(&bad, &mut p, "metadata");
        check_grace(-1, &mut p, "grace_s");
        check_grace(MAX_GRACE_S as i64 + 1, &mut p, "grace_s");
        assert_eq!(p.into_result().unwrap_err().len(), 4);
    }

    proptest::proptest! {
        /// A pattern without stars matches exactly itself; `*` alone matches everything; a
        /// prefix pattern matches exactly the names with that prefix.
        #[test]
        fn globbing_agrees_with_plain_string_tests(name in "[a-z/-]{0,12}", prefix in "[a-z-]{0,6}") {
            proptest::prop_assert!(allows(Some(std::slice::from_ref(&name)), &name));
            proptest::prop_assert!(allows(Some(&["*".to_string()]), &name));
            proptest::prop_assert_eq!(allows(Some(&[format!("{prefix}*")]), &name), name.starts_with(&prefix));
            proptest::prop_assert_eq!(allows(Some(&[format!("*{prefix}")]), &name), name.ends_with(&prefix));
        }
    }
}
