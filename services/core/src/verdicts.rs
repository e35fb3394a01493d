//! Incremental input guardrails (issue 33). A coding agent resends its whole conversation on
//! every turn; the history was judged on the turn before. Each system part and each message is
//! a unit; a unit's findings are remembered per tenant under a keyed hash of its text and the
//! detectors that ran, so a turn scans only what is new and the cost of a session grows with
//! its length, not with its square.
//!
//! What is kept: a 128-bit hash and the findings (kind → count), never the text. Memos are per
//! tenant and never consulted for another. The hash is xxh3-128 under a 192-byte secret drawn
//! per process and never shown, so a caller cannot aim a text at another text's entry; the
//! modes are not
//! in the key because they do not change what is found, only what a finding does, so a mode
//! change takes effect on the next request without a rescan, and a detector switched on or off
//! (or a new detector revision) keys every text afresh.
//!
//! The bound is two generations of [`GENERATION`] entries: lookups promote an entry from the
//! older generation, and a full current generation becomes the older one, dropping the oldest.
//! Hand-rolled rather than a cache crate: it is twenty lines, needs no clock or background
//! task, and takes one lock per request for all its units.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use xxhash_rust::xxh3::{Xxh3, xxh3_128_with_secret};

use crate::exchange::{Part, Request};
use crate::guardrails::{GuardrailPolicy, Scanned};
use crate::json_read::CheckedSchemas;

/// Entries per generation per tenant: 80 agent sessions of 200 messages each fit in one. An
/// entry is a 16-byte hash and a pointer (null for the clean texts that nearly all are), so a
/// tenant's two generations stay under 2 MB.
pub const GENERATION: usize = 16_384;

/// Bumped whenever a detector's patterns change: findings remembered under the old patterns
/// are then never read.
const DETECTORS_REVISION: u8 = 1;

/// One text the guardrails judge on its own: a system part, or a message's text parts in
/// order (concatenated, as they are scanned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit<'r> {
    /// A system part or a one-part message: nearly every unit, and no allocation.
    One(&'r str),
    Parts(Vec<&'r str>),
}

impl Unit<'_> {
    /// The unit's text as one string (borrowed when it has one part).
    pub fn joined(&self) -> Cow<'_, str> {
        match self {
            Unit::One(one) => Cow::Borrowed(one),
            Unit::Parts(parts) => Cow::Owned(parts.concat()),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Unit::One(one) => one.is_empty(),
            Unit::Parts(parts) => parts.iter().all(|part| part.is_empty()),
        }
    }
}

/// The units of a request: the texts [`Request::text`] reads, split where one message ends.
/// Units with no text are left out.
pub fn units<'r>(request: &'r Request) -> Vec<Unit<'r>> {
    let text = |part: &'r Part| match part {
        Part::Text(said) | Part::Thinking { thinking: said, .. } => Some(said.as_str()),
        Part::ToolResult { content, .. } => Some(content.as_str()),
        Part::Opaque { text, .. } => Some(text.as_str()),
        Part::Image(_) | Part::ToolUse { .. } | Part::RedactedThinking(_) => None,
    };
    let system = request.system.iter().map(|part| Unit::One(part.as_str()));
    let messages = request.messages.iter().map(|message| {
        let mut texts = message.content.iter().filter_map(text);
        match (texts.next(), texts.next()) {
            (None, _) => Unit::One(""),
            (Some(one), None) => Unit::One(one),
            (Some(first), Some(second)) => Unit::Parts([first, second].into_iter().chain(texts).collect()),
        }
    });
    system.chain(messages).filter(|unit| !unit.is_empty()).collect()
}

/// Units judged, across all tenants since start: what `shield_guardrail_units_total` shows.
#[derive(Debug, Default)]
pub struct Counts {
    pub reused: AtomicU64,
    pub scanned: AtomicU64,
}

/// Every tenant's memo.
#[derive(Debug)]
pub struct Verdicts {
    secret: Arc<Secret>,
    tenants: RwLock<HashMap<String, Arc<Memo>>>,
    pub counts: Arc<Counts>,
}

impl Default for Verdicts {
    fn default() -> Self {
        let mut secret = [0u8; SECRET_BYTES];
        rand::fill(&mut secret[..]);
        Verdicts { secret: Arc::new(Secret(secret)), tenants: RwLock::default(), counts: Arc::default() }
    }
}

impl Verdicts {
    /// The memo of `tenant` (made on its first request).
    pub fn of(&self, tenant: &str) -> Arc<Memo> {
        if let Some(memo) = self.tenants.read().get(tenant) {
            return memo.clone();
        }
        let mut tenants = self.tenants.write();
        tenants
            .entry(tenant.to_string())
            .or_insert_with(|| {
                Arc::new(Memo {
                    secret: self.secret.clone(),
                    generations: Mutex::default(),
                    counts: self.counts.clone(),
                    schemas: CheckedSchemas::default(),
                })
            })
            .clone()
    }
}

/// One tenant's remembered findings.
#[derive(Debug)]
pub struct Memo {
    secret: Arc<Secret>,
    generations: Mutex<Generations>,
    counts: Arc<Counts>,
    schemas: CheckedSchemas,
}

const SECRET_BYTES: usize = 192;

/// The hash's key; never printed.
struct Secret([u8; SECRET_BYTES]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Findings, or `None` for a text the detectors found nothing in (nearly all: one pointer).
type Remembered = Option<Box<Scanned>>;

type Table = HashMap<u128, Remembered, foldhash::fast::FixedState>;

#[derive(Debug, Default)]
struct Generations {
    current: Table,
    previous: Table,
}

impl Generations {
    fn get(&mut self, key: u128) -> Option<Remembered> {
        if let Some(scanned) = self.current.get(&key) {
            return Some(scanned.clone());
        }
        let scanned = self.previous.remove(&key)?;
        self.insert(key, scanned.clone());
        Some(scanned)
    }

    fn insert(&mut self, key: u128, scanned: Remembered) {
        if self.current.len() >= GENERATION {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, scanned);
    }

    fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

impl Memo {
    /// The tool schemas this tenant sent that passed the check a tree reading would make
    /// ([`crate::json_read::checked`]): a resent schema is not walked again.
    pub fn schemas(&self) -> &CheckedSchemas {
        &self.schemas
    }

    /// Each unit's findings under `policy`: remembered ones read back, the rest scanned and
    /// remembered. One lock to read them all and one to store what was new.
    pub fn scan_all(&self, policy: &GuardrailPolicy, units: &[Unit<'_>]) -> Vec<Scanned> {
        let detectors = policy.detectors();
        let keys: Vec<u128> = units.iter().map(|unit| self.key(detectors, unit)).collect();
        let mut found: Vec<Option<Remembered>> = {
            let mut generations = self.generations.lock();
            keys.iter().map(|key| generations.get(*key)).collect()
        };
        let mut fresh = Vec::new();
        for ((slot, unit), key) in found.iter_mut().zip(units).zip(&keys) {
            if slot.is_none() {
                let scanned = policy.scan(&unit.joined());
                let remembered = (!scanned.is_clean()).then(|| Box::new(scanned));
                fresh.push((*key, remembered.clone()));
                *slot = Some(remembered);
            }
        }
        self.counts.reused.fetch_add((units.len() - fresh.len()) as u64, Ordering::Relaxed);
        self.counts.scanned.fetch_add(fresh.len() as u64, Ordering::Relaxed);
        if !fresh.is_empty() {
            let mut generations = self.generations.lock();
            for (key, scanned) in fresh {
                generations.insert(key, scanned);
            }
        }
        found.into_iter().map(|slot| slot.flatten().map(|scanned| *scanned).unwrap_or_default()).collect()
    }

    /// Units remembered (for tests and the bound's check).
    pub fn len(&self) -> usize {
        self.generations.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The text's keyed hash, with the detectors and their revision in its top byte. One call
    /// for the single-part units nearly all are.
    fn key(&self, detectors: u8, unit: &Unit<'_>) -> u128 {
        let text = match unit {
            Unit::One(one) => xxh3_128_with_secret(one.as_bytes(), &self.secret.0),
            Unit::Parts(parts) => {
                let mut hasher = Xxh3::with_secret(self.secret.0);
                for part in parts {
                    hasher.update(part.as_bytes());
                }
                hasher.digest128()
            }
        };
        text ^ (u128::from(DETECTORS_REVISION << 2 | detectors) << 120)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::{Message, Role};
    use crate::guardrails::{Detector, Mode};
    use proptest::prelude::*;

    fn policy(pii: Mode, secrets: Mode) -> GuardrailPolicy {
        GuardrailPolicy {
            pii_detection: Detector { mode: pii },
            secrets_detection: Detector { mode: secrets },
            ..Default::default()
        }
    }

    fn request(texts: &[&str]) -> Request {
        Request {
            system: vec!["You are a coding agent.".into()],
            messages: texts
                .iter()
                .enumerate()
                .map(|(i, text)| Message {
                    role: if i % 2 == 0 { Role::User } else { Role::Assistant },
                    content: vec![Part::Text(text.to_string())],
                })
                .collect(),
            ..Default::default()
        }
    }

    const SECRET: &str = "here is sk-proj-abcdefghijklmnopqrstuvwxyz012345";
    const MAIL: &str = "write to jane@example.com";

    #[test]
    fn a_resent_history_is_read_back_not_scanned() {
        let verdicts = Verdicts::default();
        let memo = verdicts.of("acme");
        let p = policy(Mode::Monitor, Mode::Monitor);
        let first = p.check_request(&request(&["hello", MAIL]), Some(&memo));
        assert_eq!(verdicts.counts.scanned.load(Ordering::Relaxed), 3);
        let second = p.check_request(&request(&["hello", MAIL, "next turn", SECRET]), Some(&memo));
        assert_eq!(verdicts.counts.scanned.load(Ordering::Relaxed), 5, "only the two new messages");
        assert_eq!(verdicts.counts.reused.load(Ordering::Relaxed), 3);
        assert_eq!(first.flagged, vec!["pii_detection"]);
        assert_eq!(second.flagged, vec!["pii_detection", "secrets_detection"], "a remembered finding still counts");
        assert_eq!(second, p.check_request(&request(&["hello", MAIL, "next turn", SECRET]), None));
    }

    #[test]
    fn detectors_switched_on_rescan_and_modes_apply_at_once() {
        let verdicts = Verdicts::default();
        let memo = verdicts.of("acme");
        let history = request(&[SECRET]);
        let off = policy(Mode::Monitor, Mode::Off);
        assert!(off.check_request(&history, Some(&memo)).flagged.is_empty());
        let on = policy(Mode::Monitor, Mode::Block);
        assert_eq!(on.check_request(&history, Some(&memo)).blocked_by, Some("secrets_detection"), "rescanned");
        let scanned = verdicts.counts.scanned.load(Ordering::Relaxed);
        let monitor = policy(Mode::Monitor, Mode::Monitor);
        assert_eq!(monitor.check_request(&history, Some(&memo)).flagged, vec!["secrets_detection"]);
        assert_eq!(verdicts.counts.scanned.load(Ordering::Relaxed), scanned, "a mode change needs no rescan");
    }

    #[test]
    fn tenants_never_share_a_memo() {
        let verdicts = Verdicts::default();
        let p = policy(Mode::Monitor, Mode::Monitor);
        p.check_request(&request(&[MAIL]), Some(&verdicts.of("acme")));
        assert!(verdicts.of("globex").is_empty());
        p.check_request(&request(&[MAIL]), Some(&verdicts.of("globex")));
        assert_eq!(verdicts.counts.reused.load(Ordering::Relaxed), 0, "globex's first sight of the text is a scan");
        assert!(Arc::ptr_eq(&verdicts.of("acme"), &verdicts.of("acme")));
    }

    #[test]
    fn the_memo_is_bounded_and_keeps_what_is_in_use() {
        let verdicts = Verdicts::default();
        let memo = verdicts.of("acme");
        let p = policy(Mode::Monitor, Mode::Monitor);
        let texts: Vec<String> = (0..3 * GENERATION).map(|i| format!("message {i}")).collect();
        for (i, text) in texts.iter().enumerate() {
            // the system prompt is resent with every message: it stays while in use
            p.check_request(&request(&[text]), Some(&memo));
            assert!(memo.len() <= 2 * GENERATION, "at {i}: {}", memo.len());
        }
        let before = verdicts.counts.scanned.load(Ordering::Relaxed);
        p.check_request(&request(&[]), Some(&memo));
        assert_eq!(verdicts.counts.scanned.load(Ordering::Relaxed), before, "the system prompt was kept");
        p.check_request(&request(&[&texts[0]]), Some(&memo));
        assert_eq!(verdicts.counts.scanned.load(Ordering::Relaxed), before + 1, "the oldest was dropped");
    }

    #[test]
    fn a_message_in_parts_is_one_unit_and_keeps_nothing_of_its_text() {
        let mut req = request(&[]);
        req.messages.push(Message {
            role: Role::User,
            content: vec![Part::Text("key sk-proj-abcdefghij".into()), Part::Text("klmnopqrstuvwxyz0123".into())],
        });
        let verdicts = Verdicts::default();
        let memo = verdicts.of("acme");
        let v = policy(Mode::Off, Mode::Block).check_request(&req, Some(&memo));
        assert_eq!(v.blocked_by, Some("secrets_detection"), "parts are read as the one text they make");
        assert!(!format!("{memo:?}").contains("sk-proj"), "the memo holds hashes and counts only");
    }

    fn texts() -> impl Strategy<Value = Vec<String>> {
        let piece = prop_oneof![
            Just("plain words".to_string()),
            Just(MAIL.to_string()),
            Just(SECRET.to_string()),
            Just("call +1 415 555 0100 now".to_string()),
            "[a-z @.0-9-]{0,40}",
        ];
        prop::collection::vec(piece, 0..12)
    }

    proptest! {
        /// Whatever the sessions before, a memo's verdict is the verdict of a fresh scan.
        #[test]
        fn remembered_verdicts_equal_fresh_ones(turns in prop::collection::vec((texts(), 0u8..4), 1..8)) {
            let verdicts = Verdicts::default();
            let memo = verdicts.of("acme");
            let modes = [Mode::Off, Mode::Monitor, Mode::Block, Mode::Warn];
            for (i, (texts, which)) in turns.iter().enumerate() {
                let p = policy(modes[usize::from(*which)], modes[(usize::from(*which) + i) % 4]);
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                let req = request(&texts);
                prop_assert_eq!(p.check_request(&req, Some(&memo)), p.check_request(&req, None));
            }
        }
    }
}
