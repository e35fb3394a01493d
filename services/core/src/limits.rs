//! Rate limits (issue 18): `{rpm?, tpm?}` on an API key, on the tenant and on a route, and
//! the per-process [`Bucket`] that admits against one of them without a Redis round trip.
//!
//! Semantics: a **sliding 60 s window**. At any moment the fleet has admitted at most the
//! limit over the last 60 s, plus a bounded slack (below); a unit leaves the window 60 s after
//! it was counted. There is no fixed-window boundary, so no double burst: a key at 600 rpm
//! that sends 600 requests at 12:00:59 gets nothing more at 12:01:00.
//!
//! Fleet-wide without a Redis round trip on the request path (seed §2): Redis keeps one window
//! per limit as a sorted set of *leases*. Each process leases blocks of units in the
//! background ([`LEASE_SCRIPT`], one script call per lease, every key in the tenant's hash
//! slot) and admits from what it holds. A block is sized to about one second of the process's
//! own traffic, at most [`Bucket::max_block`] (1.25 % of the limit, at least 1), and an idle
//! bucket gives its unused units back ([`GIVE_BACK_SCRIPT`]): an idle key holds none.
//!
//! Slack: a request that finds the bucket empty while the fleet is not known to be full is
//! admitted on credit (the next lease pays it back), up to one block per process (or one
//! request, if a single request is larger). At any moment a process holds at most one block
//! ahead of use or owes at most one: a window can open on a held block (leased before it,
//! used inside it) and close on an owed one, so in any 60 s window the fleet admits at most
//! `limit + processes × 2 × max_block` — 2.5 % of the limit per process — plus, for tokens,
//! what reported usage exceeded the reservations by. The property test in `limits/tests.rs`
//! checks that bound on a simulated fleet.
//!
//! Redis unreachable (a lease fails or times out): the bucket admits against its own window,
//! at most `limit ÷ processes` (the processes the tenant's leases saw in the last minute),
//! never unlimited and never all refused; what it admits meanwhile is owed, and leased back
//! once Redis answers. Pure: time is passed in as milliseconds of a monotonic clock.

use serde::{Deserialize, Serialize};

use crate::FieldError;
use crate::error::Problems;

/// The window every limit is counted over.
pub const WINDOW_MS: u64 = 60_000;
/// A bucket untouched this long gives its unused units back.
pub const IDLE_MS: u64 = 2_000;
/// How often an offline bucket tries Redis again.
pub const PROBE_MS: u64 = 1_000;
/// How often a bucket that found the fleet's window full asks again while requests are being
/// refused: other processes may have given units back since (issue 27).
pub const RECHECK_MS: u64 = 250;
/// The leases a bucket remembers (to give units back to); older ones' units leave the window
/// on their own.
const MAX_LEASES: usize = 128;
pub const MAX_RPM: u64 = 10_000_000;
pub const MAX_TPM: u64 = 10_000_000_000;
/// A token reservation's output part when the request sets no `max_tokens` (issue 18).
pub const DEFAULT_OUTPUT_TOKENS: u64 = 256;

/// `limits` on a key, a tenant or a route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Requests per minute (sliding 60 s window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10_000_000)]
    pub rpm: Option<u64>,
    /// Tokens per minute: prompt (estimated at admission, reported at the end) plus output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10_000_000_000_u64)]
    pub tpm: Option<u64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.rpm.is_none() && self.tpm.is_none()
    }

    pub fn get(&self, kind: Kind) -> Option<u64> {
        match kind {
            Kind::Requests => self.rpm,
            Kind::Tokens => self.tpm,
        }
    }

    /// Positive integers within bounds; `at` is the field's path (`limits`).
    pub fn check(&self, p: &mut Problems, at: &str) {
        for (name, value, max) in [("rpm", self.rpm, MAX_RPM), ("tpm", self.tpm, MAX_TPM)] {
            match value {
                Some(0) => p.push(format!("{at}.{name}"), "must be a positive integer"),
                Some(v) if v > max => p.push(format!("{at}.{name}"), format!("must be at most {max}")),
                _ => {}
            }
        }
    }

    pub fn validate(&self, at: &str) -> Result<(), Vec<FieldError>> {
        let mut p = Problems::default();
        self.check(&mut p, at);
        p.into_result()
    }
}

/// Whose limit: the caller's key, its tenant, or the route it named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Key,
    Tenant,
    Route,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Key => "key",
            Scope::Tenant => "tenant",
            Scope::Route => "route",
        }
    }
}

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Requests,
    Tokens,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Requests, Kind::Tokens];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Requests => "requests",
            Kind::Tokens => "tokens",
        }
    }

    /// The Redis key suffix and the field name.
    pub fn per_minute(self) -> &'static str {
        match self {
            Kind::Requests => "rpm",
            Kind::Tokens => "tpm",
        }
    }
}

/// What a lease call returns (the script's reply, in its order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseReply {
    pub granted: u64,
    /// When `granted` fell short: milliseconds until the window frees the units asked for.
    pub wait_ms: u64,
    /// Units of the fleet's window not leased after this grant.
    pub room: u64,
    /// Processes that leased for this tenant in the last minute (this one included).
    pub processes: u64,
    /// Milliseconds until the window holds nothing.
    pub reset_ms: u64,
}

impl LeaseReply {
    pub fn decode(values: &[i64]) -> Option<LeaseReply> {
        let n = |i: usize| values.get(i).map(|&v| u64::try_from(v).unwrap_or(0));
        Some(LeaseReply { granted: n(0)?, wait_ms: n(1)?, room: n(2)?, processes: n(3)?, reset_ms: n(4)? })
    }
}

/// A lease the bucket asks for: `want` units; `need` is the largest single request that was
/// refused (so a short grant says when that much will be free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAsk {
    pub want: u64,
    pub need: u64,
    /// Sequence number of this lease: with the process id, the lease's name in Redis.
    pub seq: u64,
}

/// A refusal: how long until there may be room, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub retry_after_ms: u64,
    /// Not a full window: this process used its block of credit and its lease is in flight.
    /// The caller may wait briefly for the lease instead of refusing.
    pub pending: bool,
}

impl Refused {
    fn after(retry_after_ms: u64) -> Refused {
        Refused { retry_after_ms, pending: false }
    }
}

impl Refused {
    /// `Retry-After`: whole seconds, at least one.
    pub fn retry_after_s(&self) -> u64 {
        self.retry_after_ms.div_ceil(1000).max(1)
    }
}

/// What an answer's `x-ratelimit-*` headers say about one limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub limit: u64,
    pub remaining: u64,
    /// Until the window is back to its full limit.
    pub reset_ms: u64,
}

/// One second of this process's admissions, for the offline share and the block size.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    second: u64,
    units: u64,
}

const SLOTS: usize = (WINDOW_MS / 1000) as usize;

/// A lease this process holds units of in the fleet's window.
#[derive(Debug, Clone, Copy)]
struct Lease {
    seq: u64,
    units: u64,
    at: u64,
}

/// One process's state for one limit. See the module comment for the protocol.
#[derive(Debug, Clone)]
pub struct Bucket {
    limit: u64,
    /// Units leased from the fleet and not yet used.
    held: u64,
    /// Units admitted that no lease covers yet (paid back by the next grant).
    debt: u64,
    /// The next lease's size.
    block: u64,
    /// The fleet's window was full: nothing beyond `held` until then.
    exhausted_until: u64,
    /// The fleet's unleased room at the last lease.
    fleet_room: u64,
    /// When the fleet's window empties, as of the last lease.
    reset_at: u64,
    /// Redis did not answer the last lease: admit against `limit ÷ processes`.
    offline: bool,
    next_probe: u64,
    processes: u64,
    last_used: Option<u64>,
    /// The largest single request refused since the last lease.
    need: u64,
    /// The largest single request admitted while the bucket has been busy.
    largest: u64,
    seq: u64,
    /// This process's leases still in the window, oldest first. Give-backs go to them (issue 27: a settled reservation's surplus may have
    /// come from any of them, not only the last).
    leases: std::collections::VecDeque<Lease>,
    /// The fleet's window was found full: no new lease is asked before this (see RECHECK_MS).
    recheck_at: u64,
    leasing: bool,
    local: [Slot; SLOTS],
}

impl Bucket {
    pub fn new(limit: u64) -> Bucket {
        Bucket {
            limit: limit.max(1),
            held: 0,
            debt: 0,
            block: 1,
            exhausted_until: 0,
            fleet_room: limit,
            reset_at: 0,
            offline: false,
            next_probe: 0,
            processes: 1,
            last_used: None,
            need: 0,
            largest: 0,
            seq: 0,
            leases: std::collections::VecDeque::new(),
            recheck_at: 0,
            leasing: false,
            local: [Slot::default(); SLOTS],
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// A changed limit applies from the next admission; the window keeps what it counted.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit.max(1);
        self.block = self.block.min(self.max_block());
    }

    /// The largest lease, and the most a process may owe the fleet: 1.25 % of the limit.
    pub fn max_block(&self) -> u64 {
        (self.limit / 80).max(1)
    }

    pub fn is_offline(&self) -> bool {
        self.offline
    }

    /// Units leased and not used.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Nothing held, nothing owed: the bucket can be forgotten once idle.
    pub fn is_settled(&self) -> bool {
        self.held == 0 && self.debt == 0 && !self.leasing
    }

    /// Milliseconds since the bucket last admitted anything (all of them if it never did).
    pub fn idle_for(&self, now: u64) -> u64 {
        self.last_used.map_or(now, |at| now.saturating_sub(at))
    }

    /// May `n` units be admitted now?
    pub fn check(&self, n: u64, now: u64) -> Result<(), Refused> {
        if n > self.limit {
            // Never fits: the whole window is smaller than this one request.
            return Err(Refused::after(WINDOW_MS));
        }
        if n <= self.held {
            return Ok(());
        }
        if self.offline {
            let share = self.offline_share();
            let used = self.local_sum(now);
            return if used + n <= share {
                Ok(())
            } else {
                Err(Refused::after(self.local_wait(used + n - share, now)))
            };
        }
        if now < self.exhausted_until {
            // Known full as of the last lease; worth asking again once RECHECK_MS has passed
            // (units given back since may have made room), so the caller may wait for it.
            let pending = !self.leasing && now >= self.recheck_at;
            return Err(Refused { retry_after_ms: self.exhausted_until - now, pending });
        }
        let owed = self.debt + (n - self.held);
        let allowance = if self.debt == 0 { self.max_block().max(n) } else { self.max_block() };
        if owed <= allowance {
            Ok(())
        } else {
            // Waiting for the lease in flight: the fleet had room when last asked.
            Err(Refused { retry_after_ms: 1000, pending: true })
        }
    }

    /// Notes a refusal of `n` units, so the next lease asks when that much is free.
    pub fn refused(&mut self, n: u64) {
        self.need = self.need.max(n);
    }

    /// Admits `n` units (after [`Bucket::check`]; settlements call it unchecked).
    pub fn take(&mut self, n: u64, now: u64) {
        self.local_add(n, now);
        self.largest =
            if self.last_used.is_some_and(|at| now.saturating_sub(at) <= IDLE_MS) { self.largest.max(n) } else { n };
        self.last_used = Some(now);
        let from_held = n.min(self.held);
        self.held -= from_held;
        self.debt += n - from_held;
    }

    /// A token reservation settles to what was reported: the difference is taken, or given
    /// back to what this process holds (and what it holds beyond its block goes back to the
    /// fleet's window at the leaser's next turn: [`Bucket::give_back`]).
    pub fn settle(&mut self, reserved: u64, actual: u64, now: u64) {
        if actual > reserved {
            self.take(actual - reserved, now);
            return;
        }
        let back = reserved - actual;
        self.local_sub(back, now);
        let repaid = back.min(self.debt);
        self.debt -= repaid;
        self.held += back - repaid;
    }

    /// Whether [`Bucket::lease_wanted`] would ask for a lease now (the request path's cue to
    /// wake the leaser).
    pub fn needs_lease(&self, now: u64) -> bool {
        if self.leasing {
            return false;
        }
        if self.offline {
            if now < self.next_probe {
                return false;
            }
        } else if now < self.exhausted_until {
            // Asked again only while requests are being refused, at most every RECHECK_MS.
            return self.need > 0 && now >= self.recheck_at;
        }
        let active = self.last_used.is_some_and(|at| now.saturating_sub(at) <= IDLE_MS);
        self.debt > 0 || (active && self.held < self.block.div_ceil(2))
    }

    /// The lease this bucket needs now, if any (marks it in flight).
    pub fn lease_wanted(&mut self, now: u64) -> Option<LeaseAsk> {
        if !self.needs_lease(now) {
            return None;
        }
        // About one second of this process's own traffic, and at least two of its largest
        // recent requests (a token lease that covers less than a request is no lease), within
        // [1, max_block].
        let rate = self.local_recent(now).max(2 * self.largest);
        self.block = rate.clamp(1, self.max_block());
        self.leasing = true;
        self.seq += 1;
        Some(LeaseAsk { want: self.debt + self.block.saturating_sub(self.held), need: self.need.max(1), seq: self.seq })
    }

    /// A lease came back.
    pub fn leased(&mut self, ask: LeaseAsk, reply: LeaseReply, now: u64) {
        self.leasing = false;
        self.offline = false;
        self.processes = reply.processes.max(1);
        let repaid = reply.granted.min(self.debt);
        self.debt -= repaid;
        let kept = reply.granted - repaid;
        self.held += kept;
        if reply.granted > 0 {
            if self.leases.len() == MAX_LEASES {
                self.leases.pop_front();
            }
            self.leases.push_back(Lease { seq: ask.seq, units: reply.granted, at: now });
        }
        self.fleet_room = reply.room;
        self.reset_at = now + reply.reset_ms;
        let short = reply.granted < ask.want;
        self.exhausted_until = if short { now + reply.wait_ms.max(1) } else { 0 };
        self.recheck_at = if short { now + RECHECK_MS } else { 0 };
        self.need = 0;
    }

    /// Redis did not answer a lease: admit against this process's share until it does.
    pub fn lease_failed(&mut self, now: u64) {
        self.leasing = false;
        self.offline = true;
        self.next_probe = now + PROBE_MS;
    }

    /// Units to give back to the fleet's window now, as `(lease seq, units)` (oldest lease
    /// first): everything held once the bucket is idle; while busy, once it holds more than
    /// two blocks, all but one block (issue 27: a settled reservation's surplus must reach the fleet, or a burst
    /// of large reservations locks a key out for the rest of the window). Held units no live
    /// lease covers are dropped: they have left the window already.
    pub fn give_back(&mut self, now: u64) -> Vec<(u64, u64)> {
        let idle = self.last_used.is_none_or(|at| now.saturating_sub(at) > IDLE_MS);
        let keep = if idle { 0 } else { self.block };
        if self.leasing || self.held == 0 || (!idle && self.held <= 2 * self.block.max(1)) {
            return Vec::new();
        }
        let mut surplus = self.held - keep;
        self.held = keep;
        self.leases.retain(|lease| lease.at + WINDOW_MS > now && lease.units > 0);
        let mut back = Vec::new();
        for lease in self.leases.iter_mut() {
            if surplus == 0 {
                break;
            }
            let units = lease.units.min(surplus);
            lease.units -= units;
            surplus -= units;
            back.push((lease.seq, units));
        }
        back
    }

    /// A give-back the store did not take: its units are held again, against their leases.
    pub fn give_back_failed(&mut self, leases: &[(u64, u64)]) {
        for &(seq, units) in leases {
            self.held += units;
            if let Some(lease) = self.leases.iter_mut().find(|lease| lease.seq == seq) {
                lease.units += units;
            }
        }
    }

    /// Units this bucket gave back to the fleet's window: room for every process again, so a
    /// window this process found full is no longer known to be.
    pub fn returned(&mut self, units: u64) {
        self.fleet_room = (self.fleet_room + units).min(self.limit);
        if units > 0 {
            self.exhausted_until = 0;
            self.recheck_at = 0;
        }
    }

    /// For the `x-ratelimit-*` headers.
    pub fn status(&self, now: u64) -> Status {
        let last = self.last_used.map(|at| at + WINDOW_MS).unwrap_or(0);
        if self.offline {
            let remaining = self.offline_share().saturating_sub(self.local_sum(now));
            return Status { limit: self.limit, remaining, reset_ms: last.saturating_sub(now) };
        }
        let room = if now < self.exhausted_until { 0 } else { self.fleet_room };
        let remaining = (room + self.held).saturating_sub(self.debt).min(self.limit);
        Status { limit: self.limit, remaining, reset_ms: last.max(self.reset_at).saturating_sub(now) }
    }

    fn offline_share(&self) -> u64 {
        (self.limit / self.processes.max(1)).max(1)
    }

    fn local_add(&mut self, n: u64, now: u64) {
        let second = now / 1000;
        let Some(slot) = self.local.get_mut((second % SLOTS as u64) as usize) else { return };
        if slot.second != second {
            *slot = Slot { second, units: 0 };
        }
        slot.units += n;
    }

    fn local_sub(&mut self, n: u64, now: u64) {
        let second = now / 1000;
        let Some(slot) = self.local.get_mut((second % SLOTS as u64) as usize) else { return };
        if slot.second == second {
            slot.units = slot.units.saturating_sub(n);
        }
    }

    fn live(&self, now: u64) -> impl Iterator<Item = &Slot> {
        let second = now / 1000;
        self.local.iter().filter(move |s| s.units > 0 && s.second + (SLOTS as u64) > second && s.second <= second)
    }

    fn local_sum(&self, now: u64) -> u64 {
        self.live(now).map(|s| s.units).sum()
    }

    /// Units admitted in the last full second and this one, per second.
    fn local_recent(&self, now: u64) -> u64 {
        let second = now / 1000;
        self.live(now).filter(|s| s.second + 1 >= second).map(|s| s.units).sum::<u64>().div_ceil(2)
    }

    /// Milliseconds until `excess` units of this process's window have left it.
    fn local_wait(&self, excess: u64, now: u64) -> u64 {
        let mut slots: Vec<&Slot> = self.live(now).collect();
        slots.sort_by_key(|s| s.second);
        let mut freed = 0;
        for slot in slots {
            freed += slot.units;
            if freed >= excess {
                return ((slot.second + SLOTS as u64) * 1000).saturating_sub(now).max(1);
            }
        }
        WINDOW_MS
    }
}

/// Leases up to `want` units from one limit's window. KEYS: the window's leases (sorted set,
/// score = Redis time in ms), their units (hash), the window's total (string), the tenant's
/// leasing processes (sorted set). ARGV: limit, window ms, want, need, process, lease seq.
/// Returns `{granted, wait_ms, room, processes, reset_ms}` ([`LeaseReply`]). Redis's own clock
/// (`TIME`) dates every lease, so processes' clocks never disagree about the window.
pub const LEASE_SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, need = tonumber(ARGV[3]), tonumber(ARGV[4])
local cutoff = now - window
local sum = tonumber(redis.call('GET', KEYS[3]))
if sum == nil then
  sum = 0
  for _, units in ipairs(redis.call('HVALS', KEYS[2])) do sum = sum + tonumber(units) end
end
for _, lease in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cutoff)) do
  sum = sum - (tonumber(redis.call('HGET', KEYS[2], lease)) or 0)
  redis.call('HDEL', KEYS[2], lease)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
if sum < 0 or redis.call('ZCARD', KEYS[1]) == 0 then sum = 0 end
local grant = math.min(want, math.max(limit - sum, 0))
if grant > 0 then
  local lease = ARGV[5] .. ':' .. ARGV[6]
  redis.call('ZADD', KEYS[1], now, lease)
  redis.call('HSET', KEYS[2], lease, grant)
  sum = sum + grant
end
redis.call('SET', KEYS[3], sum, 'PX', window * 2)
redis.call('PEXPIRE', KEYS[1], window * 2)
redis.call('PEXPIRE', KEYS[2], window * 2)
redis.call('ZADD', KEYS[4], now, ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', cutoff)
redis.call('PEXPIRE', KEYS[4], window * 2)
local processes = redis.call('ZCARD', KEYS[4])
local wait = 0
if grant < want then
  wait = window
  local freed = math.max(limit - sum, 0)
  local leases = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #leases, 2 do
    freed = freed + (tonumber(redis.call('HGET', KEYS[2], leases[i])) or 0)
    if freed >= need then
      wait = tonumber(leases[i + 1]) + window - now
      break
    end
  end
end
local reset = 0
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #newest > 0 then reset = tonumber(newest[2]) + window - now end
return {grant, math.max(wait, 0), math.max(limit - sum, 0), processes, math.max(reset, 0)}
"#;

/// Gives units back to leases (what a process did not use): ARGV holds pairs of a lease name
/// and its units. KEYS as [`LEASE_SCRIPT`]'s first three. A lease that has left the window is
/// gone already. Returns the units given back.
pub const GIVE_BACK_SCRIPT: &str = r#"
local total = 0
for i = 1, #ARGV, 2 do
  local have = tonumber(redis.call('HGET', KEYS[2], ARGV[i]))
  if have ~= nil then
    local back = math.min(have, tonumber(ARGV[i + 1]))
    if back > 0 then
      redis.call('HINCRBY', KEYS[2], ARGV[i], -back)
      total = total + back
    end
  end
end
if total > 0 and redis.call('EXISTS', KEYS[3]) == 1 then redis.call('DECRBY', KEYS[3], total) end
return total
"#;

#[cfg(test)]
mod tests;
