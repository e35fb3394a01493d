//! Incremental input guardrails (issue 33). A coding agent resends its whole conversation on
//! every turn; the history was judged on the turn before. Each system part and each message is
//! a unit; a unit's findings are remembered per tenant under a keyed hash of its text and the
//! detectors that ran, so a turn scans only what is new and the cost of a session grows with
//! its length, not with its square.
//!
//! What is kept: a 128-bit hash and the findings (kind → count), never the text. Memos are per
//! tenant and never consulted for another. The hash is [`crate::keyed_hash`]'s, under a key
//! drawn per process and never shown, so a caller cannot aim a text at another text's entry;
//! the modes are not in the key because they do not change what is found, only what a
//! finding does, so a mode change takes effect on the next request without a rescan, and a
//! detector switched on or off (or a new detector revision) keys every text afresh.
//!
//! A request's units are also remembered as one: the keyed hash of its units' keys in order (a
//! *prefix* of the next turn's units) with the findings summed over them. An agent's next turn
//! is the same units and a few more, so it finds its longest remembered prefix in a few lookups
//! from its end ([`PREFIX_WINDOW`]) and reads the units before it as one sum, not one lookup
//! each: past the hash of the text, the cost of a turn is what is new, not the length of the
//! history (a lookup in a memo of thousands of entries is a cache miss; a history has hundreds
//! of units). A history edited anywhere but its end finds no prefix and is judged unit by unit,
//! as before. A prefix entry is a hash and summed counts, like a unit's.
//!
//! A history read from its body with the memo names the prefix as the body's own
//! ([`crate::exchange::Heads`]: the keyed hash of the bytes its last turn sent): the same bytes
//! are the same units, so that prefix is looked up by one hash of it and the system prompt's
//! units' keys, and only the units after it are keyed at all. What a turn costs the stage is
//! then what it adds, not a 16-byte key per unit of its history.
//!
//! The bound is two generations of [`GENERATION`] entries: lookups promote an entry from the
//! older generation, and a full current generation becomes the older one, dropping the oldest.
//! Hand-rolled rather than a cache crate: it is twenty lines, needs no clock or background
//! task, and takes one lock per request to read and one to store.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::exchange::{Heads, History, Message, Part, Request, Role, SystemPrompt, Turn};
use crate::guardrails::{GuardrailPolicy, Scanned};
use crate::json_read::CheckedSchemas;
use crate::keyed_hash::HashKey;

/// Entries per generation per tenant: 80 agent sessions of 200 messages each fit in one. An
/// entry is a 16-byte hash and a pointer (null for the clean texts that nearly all are), so a
/// tenant's two generations stay under 2 MB.
pub const GENERATION: usize = 16_384;

/// How many `tools` arrays' lengths a memo keeps ([`Memo::tools_lengths`]): a tenant's agents
/// and their versions send a few different tool lists at a time.
pub const RECENT_TOOLS: usize = 4;

/// How many `messages` arrays a memo keeps as prefixes of the next ([`SentPrefix`]), the
/// extended ones ([`RECENT_EXTENDED`]) among them: one per agent session of the tenant running
/// at a time; a session beyond these is read message by message, by the sent table, as before.
pub const RECENT_PREFIXES: usize = 64;

/// How many prefixes a later turn extended a memo keeps besides ([`Prefixes::extended`]): a
/// session that began as another did (agents of one tenant often send the same first message)
/// may find its own last prefix extended by the other's turn, and finds it there on its next.
pub const RECENT_EXTENDED: usize = 8;

/// How many items the kept prefixes hold in all, at most: ~43 bytes an item (its span, its
/// unit and its turn), so a tenant's prefixes stay under 1 MB however long its histories.
pub const PREFIX_ITEMS: usize = 20_000;

/// A `messages` array as a tenant sent it, up to the end of its last item: the prefix of its
/// session's next turn, which resends it and adds a few messages. A body whose `messages`
/// starts with the same bytes has these items, known as they were then, without a scan or a
/// lookup of each ([`crate::remembered`]).
///
/// Known by a chain of keyed hashes, one link a turn: `key` is the keyed hash of the previous
/// prefix's key and of the hash of the bytes this one added (its last segment), so a match
/// hashes the prefix's bytes once, segment by segment, and the next prefix hashes only what is
/// new. What is kept is what the messages' entries in the sent table keep, and where they stand.
#[derive(Debug)]
pub struct SentPrefix {
    /// Where each segment ends, from the `[`; the last is the prefix's length.
    pub segments: Vec<usize>,
    /// The chain of the segments' hashes ([`crate::remembered`] computes it).
    pub key: u128,
    /// The keyed hash of its last bytes ([`TAIL`]): a prefix that cannot be this one is told
    /// by hashing those few bytes, not the prefix (the bytes themselves are text, which the
    /// memo never keeps).
    pub tail: u128,
    /// Each item's span, from the `[`.
    pub spans: Vec<std::ops::Range<usize>>,
    /// What is known of the items.
    pub told: crate::exchange::Told,
}

/// How many of a prefix's last bytes [`SentPrefix::tail`] hashes.
pub const TAIL: usize = 32;

/// Bumped whenever a detector's patterns change: findings remembered under the old patterns
/// are then never read.
const DETECTORS_REVISION: u8 = 1;

/// How many of a request's last units may be new for its earlier ones to be read back as one
/// remembered prefix: an agent's turn adds a reply and its tool results, rarely more than a few.
pub const PREFIX_WINDOW: usize = 16;

/// One text the guardrails judge on its own: a system part, or a message's text parts in
/// order (concatenated, as they are scanned).
#[derive(Debug, Clone, PartialEq)]
pub enum Unit<'r> {
    /// A system part or a one-part message: nearly every unit, and no allocation.
    One(&'r str),
    Parts(Vec<&'r str>),
    /// A message or system prompt part known by its span ([`crate::exchange::Lazy`]): the
    /// keyed hash of its text, remembered with it, and where it stands, typed only if its text
    /// is read.
    Known {
        hash: u128,
        from: Sent<'r>,
    },
}

/// Where a unit known by its span stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sent<'r> {
    /// Message `index` of the history.
    Message(&'r History, usize),
    /// Part `index` of the system prompt (counting only parts with text).
    System(&'r SystemPrompt, usize),
}

impl<'r> Unit<'r> {
    /// The unit's text as one string (borrowed when it has one part).
    pub fn joined(&self) -> Cow<'r, str> {
        match self {
            Unit::One(one) => Cow::Borrowed(one),
            Unit::Parts(parts) => Cow::Owned(parts.concat()),
            Unit::Known { from: Sent::Message(history, index), .. } => match history.one(*index) {
                Some(Cow::Borrowed(message)) => Unit::of(message).joined(),
                Some(Cow::Owned(message)) => Cow::Owned(Unit::into_joined(message)),
                None => Cow::Borrowed(""),
            },
            Unit::Known { from: Sent::System(system, index), .. } => {
                Cow::Borrowed(system.get(*index).map_or("", crate::exchange::Text::as_str))
            }
        }
    }

    /// The text of a message typed for this alone (from its span), as [`Unit::joined`] reads
    /// it: a one-text message's string moved out, not copied (it was copied out of the body
    /// once already; a turn's new tool result is kilobytes).
    fn into_joined(message: Message) -> String {
        let mut texts = message.content.into_iter().filter_map(Part::into_guarded_text);
        let mut joined = texts.next().unwrap_or_default();
        for more in texts {
            joined.push_str(&more);
        }
        joined
    }

    /// The unit of a message: its text parts.
    pub fn of(message: &'r Message) -> Unit<'r> {
        let mut texts = message.content.iter().filter_map(Part::guarded_text);
        match (texts.next(), texts.next()) {
            (None, _) => Unit::One(""),
            (Some(one), None) => Unit::One(one),
            (Some(first), Some(second)) => Unit::Parts([first, second].into_iter().chain(texts).collect()),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Unit::One(one) => one.is_empty(),
            Unit::Parts(parts) => parts.iter().all(|part| part.is_empty()),
            Unit::Known { .. } => false,
        }
    }
}

/// The units of a request: the texts [`Request::text`] reads, split where one message ends.
/// Units with no text are left out. A history known by its spans gives its units' hashes.
pub fn units<'r>(request: &'r Request) -> Vec<Unit<'r>> {
    // Into one vector sized once: an agent's history is hundreds of units, and growing the
    // vector (and filtering it into another) was most of what a turn's judging cost beyond
    // scanning its new text.
    let mut units = Vec::with_capacity(request.system.len() + request.messages.len());
    system_units(request, &mut units);
    message_units(request, 0, &mut units);
    units
}

/// The units of a request's system prompt, onto `units`.
fn system_units<'r>(request: &'r Request, units: &mut Vec<Unit<'r>>) {
    match request.system.sent() {
        Some(sent) => {
            let known = sent.known.units.iter().flatten().enumerate();
            units.extend(known.map(|(index, &hash)| Unit::Known { hash, from: Sent::System(&request.system, index) }));
        }
        None => {
            let parts = request.system.iter().filter(|part| !part.is_empty());
            units.extend(parts.map(|part| Unit::One(part.as_str())));
        }
    }
}

/// The units of a request's messages from message `from` on, onto `units`.
fn message_units<'r>(request: &'r Request, from: usize, units: &mut Vec<Unit<'r>>) {
    match request.messages.sent() {
        Some(sent) => {
            let (history, known) = (&request.messages, sent.known.units.iter().enumerate().skip(from));
            units.extend(known.filter_map(|(index, hash)| {
                hash.map(|hash| Unit::Known { hash, from: Sent::Message(history, index) })
            }));
        }
        None => {
            let messages = request.messages.iter().skip(from).map(Unit::of);
            units.extend(messages.filter(|unit| !unit.is_empty()));
        }
    }
}

/// What is remembered of a message as sent, under the keyed hash of its bytes: the hash of its
/// guardrail unit's text (`None`: it has none) and its share of the prompt's characters. Its
/// findings are the unit's, remembered under that hash. Bytes remembered here were read whole
/// by serde_json once, so the same bytes again are a message that reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    pub unit: Option<u128>,
    pub chars: usize,
    pub turn: Turn,
}

/// An entry of the table of bodies' parts as sent: a message ([`Known`]), or a `tools` array
/// (how many tools it reads to). 32 bytes: the unit's hash without its `Option` tag (a hash of
/// zero is taken for one of one, a chance of 2^-128), the counts in 32 bits.
#[derive(Debug, Clone, Copy)]
enum Told {
    Message { unit: Option<std::num::NonZeroU128>, chars: u32, turn: Turn },
    Tools { count: u32 },
}

impl Told {
    fn message(known: Known) -> Told {
        let unit = known.unit.map(|hash| std::num::NonZeroU128::new(hash).unwrap_or(std::num::NonZeroU128::MIN));
        Told::Message { unit, chars: u32::try_from(known.chars).unwrap_or(u32::MAX), turn: known.turn }
    }
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
    key: Arc<HashKey>,
    tenants: RwLock<HashMap<String, Arc<Memo>>>,
    pub counts: Arc<Counts>,
}

impl Default for Verdicts {
    fn default() -> Self {
        Verdicts { key: Arc::new(HashKey::random()), tenants: RwLock::default(), counts: Arc::default() }
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
                    key: self.key.clone(),
                    generations: Mutex::default(),
                    sent: Mutex::default(),
                    tools_lengths: Mutex::default(),
                    prefixes: Mutex::default(),
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
    key: Arc<HashKey>,
    generations: Mutex<Generations<Remembered>>,
    /// Messages and `tools` arrays as sent, by the keyed hash of their bytes.
    sent: Mutex<Generations<Told>>,
    /// The lengths of the `tools` arrays remembered last, newest first, distinct: where a
    /// body's `tools` may end if it is one of them ([`Memo::tools_lengths`]).
    tools_lengths: Mutex<[usize; RECENT_TOOLS]>,
    /// The `messages` arrays sent last ([`SentPrefix`]).
    prefixes: Mutex<Prefixes>,
    counts: Arc<Counts>,
    schemas: CheckedSchemas,
}

/// The `messages` arrays a memo keeps as prefixes of the next.
#[derive(Debug, Default)]
struct Prefixes {
    /// Those no later turn extended, newest first: nearly always one per session running.
    latest: VecDeque<Arc<SentPrefix>>,
    /// Those a later turn extended, most recently extended first. Its session will not send
    /// one again as it was, but another session that began with the same messages may still
    /// be at it: its next turn finds it here. Evicted before any of `latest`.
    extended: VecDeque<Arc<SentPrefix>>,
}

impl Prefixes {
    fn iter(&self) -> impl Iterator<Item = &Arc<SentPrefix>> {
        self.latest.iter().chain(&self.extended)
    }

    /// Both lists without `prefix`; whether it was in one.
    fn remove(&mut self, prefix: impl Fn(&SentPrefix) -> bool) -> bool {
        let before = self.latest.len() + self.extended.len();
        self.latest.retain(|kept| !prefix(kept));
        self.extended.retain(|kept| !prefix(kept));
        self.latest.len() + self.extended.len() < before
    }

    /// Within the bounds ([`RECENT_PREFIXES`], [`RECENT_EXTENDED`], [`PREFIX_ITEMS`]): the
    /// extended ones go first, oldest first, then the oldest latest ones; one is kept however
    /// long.
    fn bound(&mut self) {
        self.extended.truncate(RECENT_EXTENDED);
        let mut items: usize = self.iter().map(|kept| kept.spans.len()).sum();
        while self.latest.len() + self.extended.len() > RECENT_PREFIXES || items > PREFIX_ITEMS {
            let latest = &mut self.latest;
            let oldest = || if latest.len() > 1 { latest.pop_back() } else { None };
            let Some(evicted) = self.extended.pop_back().or_else(oldest) else { break };
            items = items.saturating_sub(evicted.spans.len());
        }
    }
}

/// Findings, or `None` for a text the detectors found nothing in (nearly all: one pointer).
type Remembered = Option<Box<Scanned>>;

type Table<V> = HashMap<u128, V, foldhash::fast::FixedState>;

/// The findings of `scans` added up, as remembered (`None` when nothing was found).
fn summed(scans: &[Scanned]) -> Remembered {
    let sum = Scanned::sum(scans);
    (!sum.is_clean()).then(|| Box::new(sum))
}

#[derive(Debug)]
struct Generations<V> {
    current: Table<V>,
    previous: Table<V>,
    /// Lookups made: what the tests read to see a prefix stand for the units before it.
    #[cfg(test)]
    lookups: usize,
}

impl<V> Default for Generations<V> {
    fn default() -> Self {
        Generations {
            current: Table::default(),
            previous: Table::default(),
            #[cfg(test)]
            lookups: 0,
        }
    }
}

impl<V: Clone> Generations<V> {
    fn get(&mut self, key: u128) -> Option<V> {
        #[cfg(test)]
        {
            self.lookups += 1;
        }
        if let Some(scanned) = self.current.get(&key) {
            return Some(scanned.clone());
        }
        let scanned = self.previous.remove(&key)?;
        self.insert(key, scanned.clone());
        Some(scanned)
    }

    fn insert(&mut self, key: u128, scanned: V) {
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

    /// Findings under `policy` whose sum is the sum of `request`'s units' findings: a
    /// remembered prefix of the units as one sum, then each later unit's own, remembered or
    /// scanned (and then remembered, with the whole request as a prefix).
    ///
    /// The prefix is the history's remembered body prefix where it has one ([`Heads`]): the
    /// same bytes are the same units, so its key is one hash of the system prompt's units' keys
    /// and the body prefix's key, and only the units after it are keyed and looked up (a turn
    /// costs what it adds, not one key per unit of its history). Otherwise, the longest of the
    /// units' own prefixes remembered ([`Memo::prefix_keys`]).
    pub fn scan_all(&self, policy: &GuardrailPolicy, request: &Request) -> Vec<Scanned> {
        let detectors = policy.detectors();
        // Sized once for every unit, as [`units`] does, whichever way the units are read; the
        // system prompt's units keyed once, for the body prefix's key and for their own.
        let mut units = Vec::with_capacity(request.system.len() + request.messages.len());
        system_units(request, &mut units);
        let system = units.len();
        let mut keys: Vec<u128> = Vec::with_capacity(units.capacity());
        keys.extend(units.iter().map(|unit| self.key(detectors, unit)));
        let told = request.messages.sent().map(|sent| &sent.known);
        let heads = told.and_then(|told| told.heads);
        let head = |keys: &[u128], prefix: u128| self.head_key(detectors, keys, prefix);
        let whole = heads.and_then(|heads| heads.whole).map(|whole| head(&keys, whole));
        if let (Some(told), Some(Heads { matched: Some((items, prefix)), .. })) = (told, heads) {
            let matched = head(&keys, prefix);
            let sum = self.generations.lock().get(matched);
            if let Some(sum) = sum {
                let covered = system + told.units.get(..items).unwrap_or_default().iter().flatten().count();
                units.clear();
                message_units(request, items, &mut units);
                keys.clear();
                keys.extend(units.iter().map(|unit| self.key(detectors, unit)));
                let wholes = [whole.filter(|whole| *whole != matched), None];
                return self.scan_after(policy, (covered, sum), &units, &keys, wholes);
            }
        }
        message_units(request, 0, &mut units);
        keys.extend(units.get(system..).unwrap_or_default().iter().map(|unit| self.key(detectors, unit)));
        let prefixes = self.prefix_keys(&keys);
        let prefix = {
            let mut generations = self.generations.lock();
            prefixes.iter().find_map(|(len, key)| generations.get(*key).map(|sum| (*len, sum)))
        };
        let (covered, sum) = prefix.unwrap_or((0, None));
        // The whole request as a prefix of the next turn's, unless it was one already.
        let own = prefixes.first().filter(|(len, _)| *len == units.len() && covered < units.len());
        let wholes = [own.map(|(_, key)| *key), whole];
        let (units, keys) = (units.get(covered..).unwrap_or_default(), keys.get(covered..).unwrap_or_default());
        self.scan_after(policy, (covered, sum), units, keys, wholes)
    }

    /// The findings of `units` (keyed by `keys`) after a prefix of `covered` units whose sum is
    /// known: each unit's remembered, or scanned and remembered; the sum of all remembered under
    /// `wholes`, the keys the whole request is a prefix by. One lock to read and one to store.
    fn scan_after(
        &self,
        policy: &GuardrailPolicy,
        (covered, prefix_sum): (usize, Remembered),
        units: &[Unit<'_>],
        keys: &[u128],
        wholes: [Option<u128>; 2],
    ) -> Vec<Scanned> {
        let mut found: Vec<Option<Remembered>> = {
            let mut generations = self.generations.lock();
            keys.iter().map(|key| generations.get(*key)).collect()
        };
        let mut fresh = Vec::new();
        for ((slot, unit), key) in found.iter_mut().zip(units).zip(keys) {
            if slot.is_none() {
                let scanned = policy.scan(&unit.joined());
                let remembered = (!scanned.is_clean()).then(|| Box::new(scanned));
                fresh.push((*key, remembered.clone()));
                *slot = Some(remembered);
            }
        }
        self.counts.reused.fetch_add((covered + units.len() - fresh.len()) as u64, Ordering::Relaxed);
        self.counts.scanned.fetch_add(fresh.len() as u64, Ordering::Relaxed);
        let mut sums: Vec<Scanned> = std::iter::once(prefix_sum)
            .chain(found.into_iter().flatten())
            .map(|remembered| remembered.map(|scanned| *scanned).unwrap_or_default())
            .collect();
        let any_whole = wholes.iter().any(Option::is_some);
        if !fresh.is_empty() || any_whole {
            let sum = if any_whole { summed(&sums) } else { None };
            let mut generations = self.generations.lock();
            for (key, scanned) in fresh {
                generations.insert(key, scanned);
            }
            for whole in wholes.into_iter().flatten() {
                generations.insert(whole, sum.clone());
            }
        }
        sums.retain(|scanned| !scanned.is_clean());
        sums
    }

    /// The key of the units of a request's system prompt (their keys, `system`) and of its
    /// history's first messages, the body prefix known by `prefix`, as one prefix under
    /// `detectors`. Its input is 16 bytes a key and one more, so it is never the input of a
    /// prefix of units' keys ([`Memo::prefix_keys`]: 16 bytes a key).
    fn head_key(&self, detectors: u8, system: &[u128], prefix: u128) -> u128 {
        // On the stack for the few system parts a prompt has (Claude Code's: two).
        let len = 1 + 16 * (system.len() + 1);
        let (mut stack, mut heap) = ([0u8; 1 + 16 * 5], Vec::new());
        let input: &mut [u8] = match stack.get_mut(..len) {
            Some(input) => input,
            None => {
                heap.resize(len, 0);
                &mut heap
            }
        };
        let (revision, words) = input.split_at_mut(1);
        revision.fill(DETECTORS_REVISION << 2 | detectors);
        for (word, key) in words.chunks_exact_mut(16).zip(system.iter().chain([&prefix])) {
            word.copy_from_slice(&key.to_le_bytes());
        }
        self.key.hash(input)
    }

    /// The keys of the units' prefixes that may be remembered, longest first: the whole and
    /// those that leave up to [`PREFIX_WINDOW`] units after them (none of no units). A prefix's
    /// key is the keyed hash of its units' keys in order, so it stands for their texts, in
    /// order, under the detectors and revision each unit's key carries.
    fn prefix_keys(&self, keys: &[u128]) -> Vec<(usize, u128)> {
        let shortest = keys.len().saturating_sub(PREFIX_WINDOW).max(1);
        let mut hasher = self.key.hasher();
        let mut prefixes = Vec::with_capacity(keys.len() + 1 - shortest.min(keys.len()));
        for (at, key) in keys.iter().enumerate() {
            hasher.update(&key.to_le_bytes());
            let len = at + 1;
            if len >= shortest {
                prefixes.push((len, hasher.digest128()));
            }
        }
        prefixes.reverse();
        prefixes
    }

    #[cfg(test)]
    fn lookups(&self) -> usize {
        self.generations.lock().lookups
    }

    /// Units remembered (for tests and the bound's check).
    pub fn len(&self) -> usize {
        self.generations.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The text's keyed hash, with the detectors and their revision in its top byte.
    fn key(&self, detectors: u8, unit: &Unit<'_>) -> u128 {
        self.text_hash(unit) ^ (u128::from(DETECTORS_REVISION << 2 | detectors) << 120)
    }

    /// The keyed hash of a unit's text. One call for the single-part units nearly all are.
    pub fn text_hash(&self, unit: &Unit<'_>) -> u128 {
        match unit {
            Unit::One(one) => self.key.hash(one.as_bytes()),
            Unit::Parts(parts) => {
                let mut hasher = self.key.hasher();
                for part in parts {
                    hasher.update(part.as_bytes());
                }
                hasher.digest128()
            }
            Unit::Known { hash, .. } => *hash,
        }
    }

    /// What this tenant's earlier requests told of each message as sent, by the keyed hash of
    /// its bytes (in the domain of its shape, [`crate::remembered`]): one lock for a whole
    /// history.
    pub fn known(&self, keys: &[u128]) -> Vec<Option<Known>> {
        let mut sent = self.sent.lock();
        let known = |told| match told {
            Some(Told::Message { unit, chars, turn }) => {
                Some(Known { unit: unit.map(std::num::NonZeroU128::get), chars: chars as usize, turn })
            }
            _ => None,
        };
        keys.iter().map(|key| known(sent.get(*key))).collect()
    }

    /// Remembers messages as sent, each read whole by serde_json.
    pub fn remember(&self, read: impl IntoIterator<Item = (u128, Known)>) {
        let mut sent = self.sent.lock();
        for (key, known) in read {
            sent.insert(key, Told::message(known));
        }
    }

    /// How many tools a `tools` array this tenant sent before read to, by the keyed hash of its
    /// bytes (in the domain of its shape, [`crate::remembered`]).
    pub fn known_tools(&self, key: u128) -> Option<usize> {
        match self.sent.lock().get(key) {
            Some(Told::Tools { count }) => Some(count as usize),
            _ => None,
        }
    }

    /// Remembers a `tools` array as sent, `len` bytes read whole (its schemas checked) to
    /// `count` tools.
    pub fn remember_tools(&self, key: u128, len: usize, count: usize) {
        self.sent.lock().insert(key, Told::Tools { count: u32::try_from(count).unwrap_or(u32::MAX) });
        let mut lengths = self.tools_lengths.lock();
        let at = lengths.iter().position(|known| *known == len).unwrap_or(RECENT_TOOLS - 1);
        lengths.copy_within(..at, 1);
        if let Some(newest) = lengths.first_mut() {
            *newest = len;
        }
    }

    /// The byte lengths of the `tools` arrays this tenant sent last (0: none), newest first. An
    /// agent sends the same tools on every turn: a body's `tools` that is one of these is found
    /// by hashing that many bytes from where it starts, without scanning it
    /// ([`crate::remembered`]).
    pub fn tools_lengths(&self) -> [usize; RECENT_TOOLS] {
        *self.tools_lengths.lock()
    }

    /// The `messages` arrays this tenant sent last, newest first, then those a later turn
    /// extended ([`RECENT_EXTENDED`]).
    pub fn prefixes(&self) -> Vec<Arc<SentPrefix>> {
        self.candidates(|_| true)
    }

    /// Those of [`Memo::prefixes`] that `may_be` (a cheap test, made under the memo's lock).
    pub fn candidates(&self, may_be: impl Fn(&SentPrefix) -> bool) -> Vec<Arc<SentPrefix>> {
        self.prefixes.lock().iter().filter(|prefix| may_be(prefix)).cloned().collect()
    }

    /// Remembers a `messages` array as sent, grown from `extended`: that one is kept as
    /// extended ([`RECENT_EXTENDED`]), for a session that began alike.
    pub fn remember_prefix(&self, prefix: SentPrefix, extended: Option<&Arc<SentPrefix>>) {
        let mut prefixes = self.prefixes.lock();
        prefixes.remove(|kept| kept.key == prefix.key);
        if let Some(extended) = extended
            && prefixes.remove(|kept| std::ptr::eq(kept, &**extended))
        {
            prefixes.extended.push_front(extended.clone());
        }
        prefixes.latest.push_front(Arc::new(prefix));
        prefixes.bound();
    }

    /// The keyed hash of a part of a body as sent, a [`Memo::known`] key.
    pub fn bytes_hash(&self, bytes: &[u8]) -> u128 {
        self.key.hash(bytes)
    }

    /// What a system prompt part read from its bytes tells (`None`: it has no text, and is no
    /// part): its text's hash and its characters.
    pub fn know_system_part(&self, text: Option<&str>) -> Known {
        Known {
            unit: text.map(|text| self.text_hash(&Unit::One(text))),
            chars: text.map_or(0, str::len),
            turn: Turn { role: Role::System, calls_tools: false, starts_thinking: false },
        }
    }

    /// What a message typed from its bytes tells: its unit's text hash and its characters.
    pub fn know(&self, message: &Message) -> Known {
        let unit = Unit::of(message);
        Known {
            unit: (!unit.is_empty()).then(|| self.text_hash(&unit)),
            chars: message.prompt_chars(),
            turn: Turn::of(message),
        }
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
            system: vec![crate::exchange::Text::from("You are a coding agent.")].into(),
            messages: texts
                .iter()
                .enumerate()
                .map(|(i, text)| Message {
                    role: if i % 2 == 0 { Role::User } else { Role::Assistant },
                    content: vec![Part::Text((*text).into())],
                })
                .collect(),
            ..Default::default()
        }
    }

    /// The table of bodies' parts as sent stays at 48 bytes an entry (README, Guardrails).
    #[test]
    fn a_remembered_part_is_small() {
        assert_eq!(std::mem::size_of::<(u128, Told)>(), 48);
    }

    /// A body prefix's key is one keyed hash of the detectors, the system units' keys and the
    /// prefix's key, laid end to end, however many system parts there are (on the stack or not).
    #[test]
    fn a_head_key_is_one_hash_of_its_parts_however_many() {
        let memo = Verdicts::default().of("tenant");
        for parts in [0u128, 1, 4, 5, 9] {
            let system: Vec<u128> = (0..parts).map(|i| i * 7 + 1).collect();
            let mut input = vec![DETECTORS_REVISION << 2 | 3];
            for key in system.iter().chain([&42]) {
                input.extend_from_slice(&key.to_le_bytes());
            }
            assert_eq!(memo.head_key(3, &system, 42), memo.key.hash(&input), "{parts} parts");
        }
    }

    /// The kept prefixes are bounded in number and in items, newest kept; one is kept however
    /// long.
    #[test]
    fn prefixes_are_bounded() {
        let memo = Verdicts::default().of("tenant");
        let prefix = |key: u128, items: usize| SentPrefix {
            segments: vec![items],
            key,
            tail: 0,
            spans: vec![0..1; items],
            told: crate::exchange::Told::default(),
        };
        for key in 0..(RECENT_PREFIXES as u128 + 5) {
            memo.remember_prefix(prefix(key, 10), None);
        }
        assert_eq!(memo.prefixes().len(), RECENT_PREFIXES);
        assert_eq!(memo.prefixes()[0].key, RECENT_PREFIXES as u128 + 4, "newest first");
        memo.remember_prefix(prefix(1000, PREFIX_ITEMS - 15), None);
        let kept = memo.prefixes();
        assert_eq!(kept.iter().map(|kept| kept.spans.len()).sum::<usize>(), PREFIX_ITEMS - 5);
        memo.remember_prefix(prefix(1001, PREFIX_ITEMS * 2), None);
        assert_eq!(memo.prefixes().len(), 1, "one kept however long");
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

    /// A tenant's verdicts, a policy that monitors both detectors, and a history of MAIL,
    /// SECRET and `n` numbered messages.
    fn a_session(n: usize) -> (Verdicts, GuardrailPolicy, Vec<String>) {
        let mut history: Vec<String> = vec![MAIL.into(), SECRET.into()];
        history.extend((0..n).map(|i| format!("message {i}")));
        (Verdicts::default(), policy(Mode::Monitor, Mode::Monitor), history)
    }

    #[test]
    fn a_turn_reads_its_history_back_as_one_prefix() {
        let (verdicts, p, history) = a_session(40);
        let memo = verdicts.of("acme");
        let texts = |n: usize| history[..n].iter().map(String::as_str).collect::<Vec<_>>();
        p.check_request(&request(&texts(40)), Some(&memo));
        assert_eq!(memo.len(), 41 + 1, "each unit, and the request as one prefix");
        let lookups = memo.lookups();
        let next = p.check_request(&request(&texts(42)), Some(&memo));
        assert_eq!(memo.lookups() - lookups, 3 + 2, "two prefixes tried, then the two new units");
        assert_eq!(next.flagged, vec!["pii_detection", "secrets_detection"], "the prefix's findings count");
        assert_eq!(verdicts.counts.scanned.load(Ordering::Relaxed), 41 + 2);
        assert_eq!(verdicts.counts.reused.load(Ordering::Relaxed), 41);
        assert_eq!(next, p.check_request(&request(&texts(42)), None));

        // an edit before the end: no prefix is remembered, each unit is read back on its own
        let mut edited = texts(42);
        edited[5] = "an edited message";
        let lookups = memo.lookups();
        p.check_request(&request(&edited), Some(&memo));
        assert_eq!(memo.lookups() - lookups, 17 + 43, "the window's prefixes, then every unit");
        assert_eq!(verdicts.counts.scanned.load(Ordering::Relaxed), 41 + 2 + 1, "only the edited one is new");

        // the same request again: its whole is a prefix
        let lookups = memo.lookups();
        assert_eq!(p.check_request(&request(&edited), Some(&memo)), p.check_request(&request(&edited), None));
        assert_eq!(memo.lookups() - lookups, 1);

        // detectors switched off: another prefix, another verdict
        let off = policy(Mode::Monitor, Mode::Off);
        assert_eq!(off.check_request(&request(&texts(42)), Some(&memo)).flagged, vec!["pii_detection"]);
    }

    /// A chat body of a system message and `texts`, large enough to be read by its spans.
    fn chat_body(texts: &[&str]) -> bytes::Bytes {
        let mut messages = vec![serde_json::json!({"role": "system", "content": "You are a coding agent."})];
        messages.extend(texts.iter().enumerate().map(
            |(i, text)| serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": text}),
        ));
        let pad = "p".repeat(crate::verbatim::WORTH_IT);
        bytes::Bytes::from(serde_json::json!({"model": "m", "messages": messages, "pad": pad}).to_string())
    }

    /// A turn read from its body with the memo finds its history as the body prefix its last
    /// turn left, and the guardrail stage reads that prefix's units as one sum: one lookup for
    /// it and one for each new unit, however long the history; the verdict is a fresh scan's.
    #[test]
    fn a_history_found_as_a_body_prefix_is_judged_as_one() {
        use crate::chat_request::ChatRequest;
        let (verdicts, p, history) = a_session(60);
        let memo = verdicts.of("acme");
        let texts = |n: usize| history[..n].iter().map(String::as_str).collect::<Vec<_>>();
        let judge = |texts: &[&str], p: &GuardrailPolicy| {
            let body = chat_body(texts);
            let known = ChatRequest::parse_remembering(&body, Some(&memo)).unwrap();
            let fresh = p.check_request(&ChatRequest::parse(&body).unwrap().exchange, None);
            let lookups = memo.lookups();
            let found = p.check_request(&known.exchange, Some(&memo));
            assert_eq!(found, fresh, "judged as a fresh scan judges it");
            assert!(!known.exchange.messages.is_typed(), "without typing the history");
            (known.exchange.messages.sent().and_then(|sent| sent.known.heads), memo.lookups() - lookups)
        };
        let (heads, _) = judge(&texts(40), &p);
        assert!(heads.is_some_and(|heads| heads.matched.is_none() && heads.whole.is_some()), "a first turn: {heads:?}");
        for (n, new) in [(42, 2), (45, 3), (60, 15)] {
            let scanned = verdicts.counts.scanned.load(Ordering::Relaxed);
            let (heads, lookups) = judge(&texts(n), &p);
            assert!(heads.is_some_and(|heads| heads.matched.is_some()), "found its last turn's prefix");
            assert_eq!(lookups, 1 + new, "the body prefix, then each new unit");
            assert_eq!(
                verdicts.counts.scanned.load(Ordering::Relaxed),
                scanned + new as u64,
                "only the new units scanned"
            );
        }
        // The same body again: its whole is the prefix, looked up once.
        assert_eq!(judge(&texts(60), &p).1, 1);
        // Other detectors: the body prefix's sum is not theirs; judged unit by unit, then as one.
        let off = policy(Mode::Monitor, Mode::Off);
        assert!(judge(&texts(61), &off).1 > 2);
        assert_eq!(judge(&texts(62), &off).1, 2);
        // A history edited before its end matches no body prefix, and is judged as fresh.
        let mut edited = texts(62);
        edited[1] = "an edited message";
        let (heads, _) = judge(&edited, &p);
        assert!(heads.is_some_and(|heads| heads.matched.is_none()));
        assert_eq!(judge(&texts(62), &p).0.and_then(|heads| heads.matched).map(|(items, _)| items), Some(63));
    }

    /// Two sessions that begin with the same messages share their first prefix: one session's
    /// next turn extends it, and the other's next turn still finds it, as it does an edited
    /// session's. Found in CI by the Messages session property test (seed c7fd46df).
    #[test]
    fn sessions_that_began_alike_each_find_the_prefix_they_share() {
        use crate::chat_request::ChatRequest;
        let memo = Verdicts::default().of("acme");
        let matched = |texts: &[&str]| {
            let known = ChatRequest::parse_remembering(&chat_body(texts), Some(&memo)).unwrap();
            known.exchange.messages.sent().and_then(|sent| sent.known.heads).and_then(|heads| heads.matched)
        };
        let items = |matched: Option<(usize, u128)>| matched.map(|(items, _)| items);
        assert_eq!(matched(&["fix the build"]), None, "the first session's first turn");
        assert_eq!(items(matched(&["fix the build"])), Some(2), "the second's: the same bytes");
        assert_eq!(items(matched(&["fix the build", "B reads"])), Some(2), "the second's next turn extends it");
        assert_eq!(items(matched(&["fix the build", "A reads"])), Some(2), "and the first's still finds it");
        assert_eq!(items(matched(&["fix the build", "B reads", "B edits"])), Some(3), "each its own");
        assert_eq!(items(matched(&["fix the build", "A reads", "A edits"])), Some(3));

        // Extended prefixes are kept besides the latest, a few: a session's own turns fill them
        // and push out the oldest.
        let long: Vec<String> = (0..RECENT_EXTENDED + 3).map(|i| format!("message {i}")).collect();
        for n in 1..=long.len() {
            matched(&long[..n].iter().map(String::as_str).collect::<Vec<_>>());
        }
        let kept = memo.prefixes();
        assert_eq!(kept.len(), 2 + 1 + RECENT_EXTENDED, "A's, B's, the long one's, and the extended");
        assert_eq!(kept[0].spans.len(), long.len() + 1, "newest first");
        assert!(kept.iter().skip(3).all(|kept| kept.spans.len() > 3), "the oldest extended ones went first");
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
        req.messages.to_mut().push(Message {
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

    /// A text in either form: plain, or a JSON string as sent ([`crate::exchange::Text`]).
    fn text_in(said: String, as_sent: bool) -> crate::exchange::Text {
        let token = serde_json::to_string(&said).unwrap();
        match as_sent {
            true => crate::exchange::Text::json(serde_json::from_str(&token).unwrap()).unwrap(),
            false => said.into(),
        }
    }

    /// Any part: with text the guardrails read, or without.
    fn part() -> impl Strategy<Value = Part> {
        let text = "[a-z @.0-9-]{0,12}";
        let escaped = "[a-z @.0-9\n\\\"-]{0,12}";
        prop_oneof![
            (escaped, any::<bool>()).prop_map(|(said, as_sent)| Part::Text(text_in(said, as_sent))),
            (text, text).prop_map(|(thinking, signature)| Part::Thinking { thinking, signature }),
            (escaped, any::<bool>(), any::<bool>()).prop_map(|(content, as_sent, is_error)| Part::ToolResult {
                id: "t".into(),
                content: text_in(content, as_sent),
                is_error
            }),
            text.prop_map(|text| Part::Opaque { kind: "document".into(), text }),
            text.prop_map(|input| Part::ToolUse { id: "t".into(), name: "Read".into(), input }),
            text.prop_map(Part::RedactedThinking),
            Just(Part::Image(crate::exchange::Image::Url("https://example.com/a.png".into()))),
        ]
    }

    /// What a session does to its history between two turns.
    #[derive(Debug, Clone)]
    enum Step {
        /// An agent's turn: the same history and these after it.
        Append(Vec<String>),
        /// The history cut after this many (as compaction or a rewind does).
        Truncate(usize),
        /// One message rewritten.
        Edit(usize, String),
        /// The detectors or modes changed (an index into the modes).
        Policy(u8),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let step = prop_oneof![
            4 => texts().prop_map(Step::Append),
            1 => (0usize..40).prop_map(Step::Truncate),
            1 => (0usize..40, "[a-z @.0-9-]{0,40}").prop_map(|(at, text)| Step::Edit(at, text)),
            1 => (0u8..16).prop_map(Step::Policy),
        ];
        prop::collection::vec(step, 1..24)
    }

    proptest! {
        /// One session's turns, the history appended to, cut and edited, the policy changed:
        /// every verdict read with the memo (whole prefixes, units, both) is a fresh scan's.
        #[test]
        fn a_session_read_back_by_prefixes_is_judged_as_fresh(steps in steps()) {
            let verdicts = Verdicts::default();
            let memo = verdicts.of("acme");
            let modes = [Mode::Off, Mode::Monitor, Mode::Block, Mode::Warn];
            let mut history: Vec<String> = Vec::new();
            let mut p = policy(Mode::Monitor, Mode::Monitor);
            for step in steps {
                match step {
                    Step::Append(texts) => history.extend(texts),
                    Step::Truncate(len) => history.truncate(len),
                    Step::Edit(at, text) => {
                        if let Some(said) = history.get_mut(at) {
                            *said = text;
                        }
                    }
                    Step::Policy(which) => {
                        p = policy(modes[usize::from(which % 4)], modes[usize::from(which / 4)]);
                    }
                }
                let texts: Vec<&str> = history.iter().map(String::as_str).collect();
                let req = request(&texts);
                prop_assert_eq!(p.check_request(&req, Some(&memo)), p.check_request(&req, None));
            }
        }

        /// A message typed from its span gives up its text as the same string a borrowed
        /// reading joins, whatever its parts.
        #[test]
        fn a_typed_message_moved_out_joins_as_one_borrowed(parts in prop::collection::vec(part(), 0..5)) {
            let message = Message { role: Role::User, content: parts };
            let borrowed = Unit::of(&message).joined().into_owned();
            prop_assert_eq!(Unit::into_joined(message), borrowed);
        }

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
