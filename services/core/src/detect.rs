//! Content detectors for the guardrails: personal data (`pii_detection`) and credentials
//! (`secrets_detection`). Precision matters as much as recall: a flagged prompt is routed
//! on-prem or refused, so every detector checks structure (Luhn for cards, mod-97 for IBANs,
//! valid SSN ranges, real key prefixes) rather than shape alone. Findings name the kind and
//! count only: the matched text never leaves this module.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::{Regex, RegexSet};

/// What a detector found: kind → count. Never the text.
pub type Findings = BTreeMap<&'static str, usize>;

#[allow(
    clippy::expect_used,
    reason = "the patterns are literals in this file, compiled by the tests; a bad one fails every test"
)]
fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("detector patterns are static and valid")
}

#[allow(
    clippy::expect_used,
    reason = "the patterns are literals in this file, compiled by the tests; a bad one fails every test"
)]
fn set(patterns: &[&str]) -> RegexSet {
    RegexSet::new(patterns).expect("detector patterns are static and valid")
}

#[allow(
    clippy::expect_used,
    reason = "the patterns are literals in this file, compiled by the tests; a bad one fails every test"
)]
/// The union of `patterns` as one automaton without a literal prefilter: the gate that clean
/// text (nearly all of it) stops at. The prefilter the `regex` crate picks for these patterns
/// (the literal prefixes of keys, `bearer` in every letter case) scanned slower than the lazy
/// DFA alone on ordinary prose (issue 19).
fn gate(patterns: &[&str]) -> regex_automata::meta::Regex {
    regex_automata::meta::Regex::builder()
        .configure(regex_automata::meta::Config::new().auto_prefilter(false))
        .build_many(patterns)
        .expect("detector patterns are static and valid")
}

const EMAIL_PATTERN: &str = r"(?i)\b[a-z0-9._%+-]+@([a-z0-9-]+\.)+([a-z]{2,24})\b(:?)";
static EMAIL: LazyLock<Regex> = LazyLock::new(|| re(EMAIL_PATTERN));
const PHONE_PATTERN: &str = r"(?x)
        (?:^|[^\w+])(
            \+[1-9]\d{0,2}[\s.-]?(?:\(?\d{1,4}\)?[\s.-]?){2,5}\d{2,4}   # +CC …
          | \(\d{3}\)\s?\d{3}[\s.-]\d{4}                              # (555) 123-4567
          | \b\d{3}[.-]\d{3}[.-]\d{4}\b                               # 555-123-4567
        )(?:$|[^\w])";
static PHONE: LazyLock<Regex> = LazyLock::new(|| re(PHONE_PATTERN));
const SSN_PATTERN: &str = r"\b(\d{3})-(\d{2})-(\d{4})\b";
static SSN: LazyLock<Regex> = LazyLock::new(|| re(SSN_PATTERN));
const CARD_PATTERN: &str = r"\b(?:\d[ -]?){12,18}\d\b";
static CARD: LazyLock<Regex> = LazyLock::new(|| re(CARD_PATTERN));
const IBAN_PATTERN: &str = r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b";
static IBAN: LazyLock<Regex> = LazyLock::new(|| re(IBAN_PATTERN));

const PROVIDER_KEY_PATTERN: &str = r"\bsk-(?:proj-|ant-(?:api\d{2}-)?|live-|or-v1-)?[A-Za-z0-9_-]{20,}\b";
static PROVIDER_KEY: LazyLock<Regex> = LazyLock::new(|| re(PROVIDER_KEY_PATTERN));
const AWS_KEY_PATTERN: &str = r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b";
static AWS_KEY: LazyLock<Regex> = LazyLock::new(|| re(AWS_KEY_PATTERN));
const GITHUB_TOKEN_PATTERN: &str = r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})\b";
static GITHUB_TOKEN: LazyLock<Regex> = LazyLock::new(|| re(GITHUB_TOKEN_PATTERN));
const PRIVATE_KEY_PATTERN: &str = r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----";
static PRIVATE_KEY: LazyLock<Regex> = LazyLock::new(|| re(PRIVATE_KEY_PATTERN));
const BEARER_PATTERN: &str = r"(?i)\bbearer\s+([A-Za-z0-9._~+/=-]{24,})";
static BEARER: LazyLock<Regex> = LazyLock::new(|| re(BEARER_PATTERN));

/// One pass per family first: for text with nothing in it (nearly all of it), a single scan of
/// the union of the family's patterns replaces one scan per pattern. A pattern the set did not
/// match cannot match alone, so the findings are the same.
static PII_SET: LazyLock<RegexSet> = LazyLock::new(|| set(&PII_PATTERNS));
static SECRETS_SET: LazyLock<RegexSet> = LazyLock::new(|| set(&SECRETS_PATTERNS));
const PII_PATTERNS: [&str; 5] = [EMAIL_PATTERN, PHONE_PATTERN, SSN_PATTERN, CARD_PATTERN, IBAN_PATTERN];
const SECRETS_PATTERNS: [&str; 5] =
    [PROVIDER_KEY_PATTERN, AWS_KEY_PATTERN, GITHUB_TOKEN_PATTERN, PRIVATE_KEY_PATTERN, BEARER_PATTERN];
/// Both families in one automaton: one pass over a text that both detectors read.
/// [`GuardrailPolicy::check`](crate::guardrails::GuardrailPolicy::check) asks it first and
/// runs [`pii`] and [`secrets`] only on text it matched.
static ANY_GATE: LazyLock<regex_automata::meta::Regex> =
    LazyLock::new(|| gate(&[PII_PATTERNS, SECRETS_PATTERNS].concat()));

/// Whether either detector could find anything in `text`: `false` means both find nothing
/// (checked in one pass; the guardrails then skip both).
pub fn may_find(text: &str) -> bool {
    ANY_GATE.is_match(text)
}

/// File and code suffixes that look like top-level domains in `name@2x.png` or `pkg@v1.ts`.
const NOT_TLDS: [&str; 12] = ["png", "jpg", "jpeg", "gif", "svg", "webp", "js", "ts", "py", "rs", "go", "json"];

pub fn pii(text: &str) -> Findings {
    let mut found = Findings::new();
    let hits = PII_SET.matches(text);
    let mut add = |kind, n: usize| {
        if n > 0 {
            *found.entry(kind).or_insert(0) += n;
        }
    };
    if hits.matched(0) {
        let emails = EMAIL.captures_iter(text).filter(|c| {
            // `git@github.com:org/repo` is an SSH remote, not a mailbox.
            let tld = c.get(2).map(|m| m.as_str().to_ascii_lowercase()).unwrap_or_default();
            c.get(3).is_none_or(|colon| colon.as_str().is_empty()) && !NOT_TLDS.contains(&tld.as_str())
        });
        add("email", emails.count());
    }
    if hits.matched(1) {
        let phones = PHONE.captures_iter(text).filter(|c| c.get(1).is_some_and(|m| digits(m.as_str()).len() >= 10));
        add("phone", phones.count());
    }
    if hits.matched(2) {
        add("us_ssn", SSN.captures_iter(text).filter(|c| valid_ssn(&c[1], &c[2], &c[3])).count());
    }
    if hits.matched(3) {
        let cards = CARD.find_iter(text).filter(|m| {
            let d = digits(m.as_str());
            (13..=19).contains(&d.len()) && card_prefix(&d) && luhn(&d) && standalone(text, m.start(), m.end())
        });
        add("payment_card", cards.count());
    }
    if hits.matched(4) {
        add("iban", IBAN.find_iter(text).filter(|m| iban_valid(m.as_str())).count());
    }
    found
}

pub fn secrets(text: &str) -> Findings {
    let mut found = Findings::new();
    let hits = SECRETS_SET.matches(text);
    for (i, (kind, regex)) in [
        ("provider_api_key", &*PROVIDER_KEY),
        ("aws_access_key", &*AWS_KEY),
        ("github_token", &*GITHUB_TOKEN),
        ("private_key", &*PRIVATE_KEY),
    ]
    .into_iter()
    .enumerate()
    {
        let n = if hits.matched(i) { regex.find_iter(text).count() } else { 0 };
        if n > 0 {
            found.insert(kind, n);
        }
    }
    if hits.matched(4) {
        // A bearer token is a credential when it looks random: letters and digits mixed.
        let bearer = BEARER
            .captures_iter(text)
            .filter(|c| {
                let token = &c[1];
                token.bytes().any(|b| b.is_ascii_digit()) && token.bytes().any(|b| b.is_ascii_alphabetic())
            })
            .count();
        if bearer > 0 {
            found.insert("bearer_token", bearer);
        }
    }
    found
}

/// `text` with every credential the secrets detector knows replaced by `[redacted]`: for an
/// upstream's error message relayed to a caller (providers echo parts of keys there).
pub fn redact_secrets(text: &str) -> String {
    if !SECRETS_SET.is_match(text) {
        return text.to_string();
    }
    let mut out = text.to_string();
    for regex in [&*PROVIDER_KEY, &*AWS_KEY, &*GITHUB_TOKEN, &*PRIVATE_KEY, &*BEARER] {
        out = regex.replace_all(&out, "[redacted]").into_owned();
    }
    out
}

/// A digit run is a candidate only as a whole: not the tail or head of a longer run of digit
/// groups (an IBAN, a long reference number).
fn standalone(text: &str, start: usize, end: usize) -> bool {
    let before = text.as_bytes().get(..start).unwrap_or_default();
    let after = text.as_bytes().get(end..).unwrap_or_default();
    let glued_before = matches!(before, [.., d, b' ' | b'-'] if d.is_ascii_digit());
    let glued_after = matches!(after, [b' ' | b'-', d, ..] if d.is_ascii_digit());
    !glued_before && !glued_after
}

fn digits(text: &str) -> String {
    text.chars().filter(char::is_ascii_digit).collect()
}

fn valid_ssn(area: &str, group: &str, serial: &str) -> bool {
    let area: u32 = area.parse().unwrap_or(0);
    area != 0 && area != 666 && area < 900 && group != "00" && serial != "0000"
}

/// Issuer prefixes of the card networks (Visa, Mastercard, Amex, Discover, JCB, Diners,
/// UnionPay, Maestro): a random digit run that happens to pass Luhn rarely has one.
fn card_prefix(d: &str) -> bool {
    let p = |n: usize| d.get(..n).and_then(|s| s.parse::<u32>().ok()).unwrap_or(0);
    d.starts_with('4')
        || (51..=55).contains(&p(2))
        || (2221..=2720).contains(&p(4))
        || matches!(p(2), 34 | 37 | 36 | 38 | 62 | 65)
        || p(4) == 6011
        || (3528..=3589).contains(&p(4))
        || (300..=305).contains(&p(3))
        || matches!(p(2), 50 | 56..=58)
}

pub fn luhn(d: &str) -> bool {
    let sum: u32 = d
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, b)| {
            let v = u32::from(b - b'0');
            if i % 2 == 1 {
                let doubled = v * 2;
                if doubled > 9 { doubled - 9 } else { doubled }
            } else {
                v
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// ISO 13616: move the first four characters to the end, letters to numbers, mod 97 == 1.
/// Works on characters, never byte offsets: the pattern's `\d` also matches digits of other
/// scripts (`٣`), which take several bytes and are never part of a valid IBAN (issue 27).
fn iban_valid(text: &str) -> bool {
    let compact: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
    if !(15..=34).contains(&compact.len()) || !compact.iter().all(char::is_ascii_alphanumeric) {
        return false;
    }
    let Some((country, rest)) = compact.split_first_chunk::<4>() else { return false };
    let mut remainder: u64 = 0;
    for &c in rest.iter().chain(country) {
        let value = match c {
            '0'..='9' => u64::from(c as u8 - b'0'),
            'A'..='Z' => u64::from(c as u8 - b'A') + 10,
            _ => return false,
        };
        remainder = if value >= 10 { (remainder * 100 + value) % 97 } else { (remainder * 10 + value) % 97 };
    }
    remainder == 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The one-pass prefilter never hides a match: for any text, the set says a pattern
        /// matched exactly when that pattern alone matches.
        #[test]
        fn the_family_sets_agree_with_each_pattern(
            parts in proptest::collection::vec(prop_oneof![
                Just("jane.doe@example.com".to_string()), Just("+1 415 555 2671".to_string()),
                Just("123-45-6789".to_string()), Just("4111 1111 1111 1111".to_string()),
                Just("GB82WEST12345698765432".to_string()), Just("sk-proj-abcdefghijklmnopqrstuvwx".to_string()),
                Just("AKIAABCDEFGHIJKLMNOP".to_string()), Just("-----BEGIN RSA PRIVATE KEY-----".to_string()),
                Just("Bearer abc123def456ghi789jkl012mno".to_string()), "[ -~]{0,24}", "\\PC{0,8}",
            ], 0..6)
        ) {
            let text = parts.join(" ");
            let pii_set = PII_SET.matches(&text);
            for (i, regex) in [&*EMAIL, &*PHONE, &*SSN, &*CARD, &*IBAN].into_iter().enumerate() {
                prop_assert_eq!(pii_set.matched(i), regex.is_match(&text), "pii pattern {} on {:?}", i, text);
            }
            let secrets_set = SECRETS_SET.matches(&text);
            for (i, regex) in [&*PROVIDER_KEY, &*AWS_KEY, &*GITHUB_TOKEN, &*PRIVATE_KEY, &*BEARER].into_iter().enumerate() {
                prop_assert_eq!(secrets_set.matched(i), regex.is_match(&text), "secrets pattern {} on {:?}", i, text);
            }
            // The gate stops only clean text: it matches exactly when some pattern does.
            prop_assert_eq!(may_find(&text), pii_set.matched_any() || secrets_set.matched_any(), "gate on {:?}", text);
        }
    }

    fn kinds(found: Findings) -> Vec<&'static str> {
        found.into_keys().collect()
    }

    #[test]
    fn pii_true_positives() {
        let cases = [
            ("write to jane.doe@example.com today", vec!["email"]),
            ("call +1 415 555 2671 or (415) 555-2671", vec!["phone"]),
            ("my SSN is 123-45-6789", vec!["us_ssn"]),
            ("card 4111 1111 1111 1111 exp 12/29", vec!["payment_card"]),
            ("amex 3782-822463-10005", vec!["payment_card"]),
            ("IBAN DE89 3704 0044 0532 0130 00 please", vec!["iban"]),
            ("GB82WEST12345698765432", vec!["iban"]),
        ];
        for (text, want) in cases {
            assert_eq!(kinds(pii(text)), want, "{text}");
        }
    }

    #[test]
    fn pii_look_alikes_do_not_fire() {
        for text in [
            "order number 4111 1111 1111 1112 shipped",       // 16 digits, fails Luhn
            "tracking 1234567812345678",                      // passes no issuer/Luhn check
            "git clone git@github.com:acme/shield.git",       // SSH remote, not a mailbox
            "use the icon logo@2x.png in the header",         // asset name
            "npm install left-pad@1.3.0",                     // package version
            "@app.route('/users') and x@y",                   // decorators and no TLD
            "ssn-like 000-12-3456 and 666-12-3456",           // invalid SSN areas
            "build 2024-11-29 took 12.5 s; version 10.2.3.4", // dates and versions
            "IBAN-like DE89 3704 0044 0532 0130 01",          // bad check digits
            "call extension 5551",                            // short number
        ] {
            assert_eq!(pii(text), Findings::new(), "{text}");
        }
    }

    #[test]
    fn secrets_true_positives() {
        let cases = [
            ("key sk-proj-abcdefghijklmnopqrstuvwxyz0123456789", "provider_api_key"),
            ("ANTHROPIC=sk-ant-api03-abcdefghijklmnopqrstuvwx", "provider_api_key"),
            ("aws AKIAIOSFODNN7EXAMPLE", "aws_access_key"),
            ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "github_token"),
            ("-----BEGIN RSA PRIVATE KEY-----\nMIIE...", "private_key"),
            ("-----BEGIN OPENSSH PRIVATE KEY-----", "private_key"),
            ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc123def456", "bearer_token"),
        ];
        for (text, want) in cases {
            assert_eq!(kinds(secrets(text)), vec![want], "{text}");
        }
    }

    #[test]
    fn secrets_look_alikes_do_not_fire() {
        for text in [
            "the sk-learn library (scikit-learn)",
            "task-1234 and desk-abc",
            "AKIA is the prefix of AWS access keys",
            "-----BEGIN PUBLIC KEY-----",
            "use a bearer token in the Authorization header",
            "the ghp_ prefix marks GitHub tokens",
        ] {
            assert_eq!(secrets(text), Findings::new(), "{text}");
        }
    }

    #[test]
    fn luhn_and_iban_checks() {
        assert!(luhn("4111111111111111"));
        assert!(!luhn("4111111111111112"));
        assert!(iban_valid("DE89 3704 0044 0532 0130 00"));
        assert!(!iban_valid("DE89 3704 0044 0532 0130 01"));
        // Issue 27: a digit of another script is not an IBAN's, and never a panic.
        assert!(!iban_valid("DE3\u{663} 3704 0044 0532 0130 00"));
        assert!(pii("IBAN DE3\u{663} 3704 0044 0532 0130 00").is_empty());
    }

    #[test]
    fn redaction_removes_every_credential_and_keeps_the_wording() {
        let said = "invalid x-api-key sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345 (also AKIAABCDEFGHIJKLMNOP, Bearer abc123def456ghi789jkl012mno)";
        let redacted = redact_secrets(said);
        assert_eq!(redacted, "invalid x-api-key [redacted] (also [redacted], [redacted])");
        assert!(secrets(&redacted).is_empty());
        assert_eq!(
            redact_secrets("prompt is too long: 210000 tokens > 200000 maximum"),
            "prompt is too long: 210000 tokens > 200000 maximum"
        );
    }
}
