//! Rate-limit admission (issue 18), before routing: the caller's key, its tenant and the route
//! it named may each set `{rpm?, tpm?}`. [`Limiter::admit`] checks every applicable limit
//! against this process's [`Bucket`] for it and admits all or none — with no Redis call: the
//! buckets are filled by the background leaser ([`lease`]). A token limit reserves the
//! estimated prompt plus `max_tokens` (or 256) and [`Admission::settle`] corrects it to the
//! reported usage when the request ends. [`Admission::headers`] renders OpenAI's
//! `x-ratelimit-*` headers for the tightest applicable limits.
//!
//! Never blocks on I/O and never panics: locks are `parking_lot` (no poisoning), held for a
//! few arithmetic steps, always taken in one order (key, tenant, route; requests, tokens).

pub mod lease;

use std::sync::{Arc, LazyLock};
use std::time::Instant;

use bytes::BytesMut;
use http::header::{HeaderName, HeaderValue};
use parking_lot::{Mutex, RwLock};
use shield_core::keys::RedisKeys;
use shield_core::limits::{Bucket, Kind, Limits, Scope, Status};

/// Milliseconds of this process's monotonic clock (the buckets' time).
pub fn now_ms() -> u64 {
    static START: LazyLock<Instant> = LazyLock::new(Instant::now);
    u64::try_from(START.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One limit's bucket and where its window lives in Redis.
pub struct Entry {
    pub tenant: String,
    /// `gw_rl:{tenant}:<scope>:<rpm|tpm>` (with the prefix): the window's key, and this
    /// entry's name in the registry.
    pub window: String,
    pub bucket: Mutex<Bucket>,
}

/// Every bucket this process has used, by its window's key.
pub struct Limiter {
    keys: RedisKeys,
    entries: RwLock<crate::FastMap<String, Arc<Entry>>>,
    /// Wakes the leaser when a bucket runs low.
    pub wake: tokio::sync::Notify,
    /// The leaser finished a round of leases (requests waiting on one retry).
    pub leased: tokio::sync::Notify,
}

/// How long a request that outran its process's block waits for the lease in flight before
/// it is refused (the fleet had room when last asked: refusing would be a false 429).
pub const LEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// A limit that applies to a request.
struct Applicable<'a> {
    scope: Scope,
    kind: Kind,
    limit: u64,
    /// The key's id or the route's name (`None` for the tenant).
    name: Option<&'a str>,
}

/// A request over a limit: which one, and when to come back.
#[derive(Debug, Clone)]
pub struct RateLimited {
    pub scope: Scope,
    pub kind: Kind,
    pub limit: u64,
    /// The name of the key or route, for the message (never the key itself).
    pub name: String,
    pub retry_after_s: u64,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Only waiting for a lease in flight: worth a short wait ([`Limiter::admit_waiting`]).
    pub pending: bool,
}

impl RateLimited {
    pub fn message(&self) -> String {
        let whose = match self.scope {
            Scope::Key => format!("API key `{}`", self.name),
            Scope::Tenant => "this tenant".to_string(),
            Scope::Route => format!("route `{}`", self.name),
        };
        format!(
            "Rate limit reached for {whose}: {} {} per minute. Retry in {} s.",
            self.limit,
            self.kind.as_str(),
            self.retry_after_s
        )
    }
}

/// What one admitted request holds: its grants, to settle and to report. Settled once,
/// however the request ends (issue 27): by its end's reported usage, or — when it is dropped
/// unsettled (its client went away mid-call) — to the prompt's estimate, which was sent.
pub struct Admission {
    grants: Vec<Grant>,
    /// The prompt's share of a token reservation (the rest is `max_tokens` or 256).
    prompt_tokens: u64,
    settled: std::sync::atomic::AtomicBool,
}

struct Grant {
    entry: Arc<Entry>,
    kind: Kind,
    reserved: u64,
}

impl Limiter {
    pub fn new(keys: RedisKeys) -> Limiter {
        Limiter {
            keys,
            entries: RwLock::new(crate::FastMap::default()),
            wake: tokio::sync::Notify::new(),
            leased: tokio::sync::Notify::new(),
        }
    }

    /// The limits that apply: the key's, the tenant's, the route's (in this order).
    fn applicable<'a>(
        key_id: &'a str,
        key: &Limits,
        tenant: &Limits,
        route: Option<(&'a str, &Limits)>,
    ) -> Vec<Applicable<'a>> {
        let mut out = Vec::with_capacity(6);
        let mut add = |scope: Scope, name: Option<&'a str>, limits: &Limits| {
            for kind in Kind::ALL {
                if let Some(limit) = limits.get(kind) {
                    out.push(Applicable { scope, kind, limit, name });
                }
            }
        };
        add(Scope::Key, Some(key_id), key);
        add(Scope::Tenant, None, tenant);
        if let Some((name, limits)) = route {
            add(Scope::Route, Some(name), limits);
        }
        out
    }

    fn entry(&self, tenant: &str, applicable: &Applicable<'_>) -> Arc<Entry> {
        thread_local! {
            static WINDOW: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        let scope = (applicable.scope.as_str(), applicable.name);
        let per_minute = applicable.kind.per_minute();
        let found = WINDOW.with_borrow_mut(|window| {
            self.keys.write_rate_window(window, tenant, scope, per_minute);
            self.entries.read().get(window.as_str()).cloned()
        });
        if let Some(entry) = found {
            return entry;
        }
        let mut window = String::new();
        self.keys.write_rate_window(&mut window, tenant, scope, per_minute);
        self.entries
            .write()
            .entry(window.clone())
            .or_insert_with(|| {
                Arc::new(Entry {
                    tenant: tenant.to_string(),
                    window,
                    bucket: Mutex::new(Bucket::new(applicable.limit)),
                })
            })
            .clone()
    }

    /// Admits a request of `tokens` estimated tokens against every applicable limit, or names
    /// the one it is over. `None` when no limit applies.
    pub fn admit(
        &self,
        tenant: &str,
        key: (&str, &str, &Limits),
        tenant_limits: &Limits,
        route: Option<(&str, &Limits)>,
        (prompt_tokens, output_tokens): (u64, u64),
    ) -> Result<Option<Admission>, RateLimited> {
        let tokens = prompt_tokens + output_tokens;
        let (key_id, key_name, key_limits) = key;
        if key_limits.is_empty() && tenant_limits.is_empty() && route.is_none_or(|(_, l)| l.is_empty()) {
            return Ok(None);
        }
        let applicable = Self::applicable(key_id, key_limits, tenant_limits, route);
        let entries: Vec<Arc<Entry>> = applicable.iter().map(|a| self.entry(tenant, a)).collect();
        let now = now_ms();
        let mut buckets: Vec<_> = entries.iter().map(|e| e.bucket.lock()).collect();
        let units = |kind: Kind| if kind == Kind::Tokens { tokens } else { 1 };
        let mut worst: Option<(usize, u64)> = None;
        let mut pending = true;
        for (i, (bucket, a)) in buckets.iter_mut().zip(&applicable).enumerate() {
            if bucket.limit() != a.limit {
                bucket.set_limit(a.limit);
            }
            if let Err(refused) = bucket.check(units(a.kind), now) {
                bucket.refused(units(a.kind));
                pending &= refused.pending;
                if worst.is_none_or(|(_, ms)| refused.retry_after_ms > ms) {
                    worst = Some((i, refused.retry_after_ms));
                }
            }
        }
        if let Some((a, ms)) = worst.and_then(|(i, ms)| Some((applicable.get(i)?, ms))) {
            let statuses: Vec<(Kind, Status)> =
                buckets.iter().zip(&applicable).map(|(b, a)| (a.kind, b.status(now))).collect();
            let name = match a.scope {
                Scope::Key => key_name.to_string(),
                Scope::Tenant => tenant.to_string(),
                Scope::Route => route.map(|(name, _)| name.to_string()).unwrap_or_default(),
            };
            let retry_after_s = shield_core::limits::Refused { retry_after_ms: ms, pending }.retry_after_s();
            return Err(RateLimited {
                scope: a.scope,
                kind: a.kind,
                limit: a.limit,
                name,
                retry_after_s,
                headers: headers(&statuses),
                pending,
            });
        }
        let mut low = false;
        for (bucket, a) in buckets.iter_mut().zip(&applicable) {
            bucket.take(units(a.kind), now);
            low |= bucket.needs_lease(now);
        }
        drop(buckets);
        if low {
            self.wake.notify_one();
        }
        let grants = entries
            .into_iter()
            .zip(&applicable)
            .map(|(entry, a)| Grant { entry, kind: a.kind, reserved: units(a.kind) })
            .collect();
        Ok(Some(Admission { grants, prompt_tokens, settled: std::sync::atomic::AtomicBool::new(false) }))
    }

    /// [`Limiter::admit`], waiting up to [`LEASE_WAIT`] when the only obstacle is a lease in
    /// flight: a burst that outruns this process's block is admitted once its lease lands,
    /// instead of being refused while the fleet has room. A full window or a spent offline
    /// share is refused at once.
    pub async fn admit_waiting(
        &self,
        tenant: &str,
        key: (&str, &str, &Limits),
        tenant_limits: &Limits,
        route: Option<(&str, &Limits)>,
        tokens: (u64, u64),
    ) -> Result<Option<Admission>, RateLimited> {
        match self.admit(tenant, key, tenant_limits, route, tokens) {
            Err(limited) if limited.pending => {}
            other => return other,
        }
        let deadline = tokio::time::Instant::now() + LEASE_WAIT;
        loop {
            let leased = self.leased.notified();
            tokio::pin!(leased);
            leased.as_mut().enable();
            match self.admit(tenant, key, tenant_limits, route, tokens) {
                Err(limited) if limited.pending && tokio::time::Instant::now() < deadline => {
                    self.wake.notify_one();
                    if tokio::time::timeout_at(deadline, leased).await.is_err() {
                        return self.admit(tenant, key, tenant_limits, route, tokens);
                    }
                }
                other => return other,
            }
        }
    }

    /// A snapshot of the registry, for the leaser.
    pub fn entries(&self) -> Vec<Arc<Entry>> {
        self.entries.read().values().cloned().collect()
    }

    /// Forgets buckets nobody used for two windows (they hold nothing by then).
    pub fn forget_idle(&self, idle: impl Fn(&Bucket) -> bool) {
        self.entries.write().retain(|_, entry| !idle(&entry.bucket.lock()));
    }

    pub fn keys(&self) -> &RedisKeys {
        &self.keys
    }
}

impl Admission {
    /// The request's end: token reservations become the tokens reported (`actual`). Only
    /// the first call counts.
    pub fn settle(&self, actual: u64) {
        if self.settled.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let now = now_ms();
        for grant in self.grants.iter().filter(|g| g.kind == Kind::Tokens) {
            grant.entry.bucket.lock().settle(grant.reserved, actual, now);
        }
    }

    /// The reservation stands as the request's count (the default path reads no usage).
    pub fn keep_reservation(&self) {
        self.settled.store(true, std::sync::atomic::Ordering::Release);
    }

    /// `x-ratelimit-*` for the tightest applicable limit of each kind: what is counted against
    /// each limit when the headers are written. A non-streamed answer has settled its tokens by
    /// then; a stream's head goes out before its output is known, so it counts the prompt
    /// (estimated) but not the reservation for output still to come — the headers a caller
    /// reads therefore only go down within a window, as it would read them from OpenAI.
    pub fn headers(&self, streaming: bool) -> Vec<(HeaderName, HeaderValue)> {
        let now = now_ms();
        let statuses: Vec<(Kind, Status)> = self
            .grants
            .iter()
            .map(|g| {
                let mut status = g.entry.bucket.lock().status(now);
                if streaming && g.kind == Kind::Tokens {
                    let pending = g.reserved.saturating_sub(self.prompt_tokens);
                    status.remaining = (status.remaining + pending).min(status.limit);
                }
                (g.kind, status)
            })
            .collect();
        headers(&statuses)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        // Ended without a settlement (the request's future was dropped: its client went away
        // before an answer): the prompt was sent, the output is unknown.
        self.settle(self.prompt_tokens);
    }
}

// OpenAI's names, parsed once (a custom name's `from_static` checks it against every standard
// name at run time).
static REQUEST_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-requests"),
    HeaderName::from_static("x-ratelimit-remaining-requests"),
    HeaderName::from_static("x-ratelimit-reset-requests"),
];
static TOKEN_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-tokens"),
    HeaderName::from_static("x-ratelimit-remaining-tokens"),
    HeaderName::from_static("x-ratelimit-reset-tokens"),
];

/// OpenAI's names: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`; the tightest limit
/// of a kind is the one with the least remaining.
///
/// Every value is written into one buffer and the header values are slices of it: one
/// allocation for up to six values, where formatting and allocating each value apiece made the
/// headers most of what rate limits cost per answer (issue 19).
fn headers(statuses: &[(Kind, Status)]) -> Vec<(HeaderName, HeaderValue)> {
    let mut text = BytesMut::with_capacity(64);
    let mut spans: Vec<(&HeaderName, std::ops::Range<usize>)> = Vec::with_capacity(6);
    for kind in Kind::ALL {
        let Some(status) = statuses.iter().filter(|(k, _)| *k == kind).map(|(_, s)| *s).min_by_key(|s| s.remaining)
        else {
            continue;
        };
        let [limit, remaining, reset] = match kind {
            Kind::Requests => &REQUEST_HEADERS,
            Kind::Tokens => &TOKEN_HEADERS,
        };
        spans.push((limit, written(&mut text, |out| put_number(out, status.limit))));
        spans.push((remaining, written(&mut text, |out| put_number(out, status.remaining))));
        spans.push((reset, written(&mut text, |out| write_reset(out, status.reset_ms))));
    }
    let text = text.freeze();
    spans
        .into_iter()
        .filter_map(|(name, span)| {
            let value = HeaderValue::from_maybe_shared(text.slice(span)).ok()?;
            Some((name.clone(), value))
        })
        .collect()
}

/// A reset time as OpenAI writes it: `250ms`, `1.5s`, `59s`, `1m0s`.
fn write_reset(out: &mut BytesMut, ms: u64) {
    if ms < 1000 {
        put_number(out, ms);
        out.extend_from_slice(b"ms");
        return;
    }
    if ms >= 60_000 {
        put_number(out, ms / 60_000);
        out.extend_from_slice(b"m");
        put_number(out, (ms % 60_000) / 1000);
        out.extend_from_slice(b"s");
        return;
    }
    // Seconds with the milliseconds' trailing zeros dropped, in integers (a float formatted
    // to three places gave the same text at several times the cost, on every answer).
    let (seconds, mut millis, mut places) = (ms / 1000, ms % 1000, 3usize);
    put_number(out, seconds);
    if millis != 0 {
        while millis % 10 == 0 {
            millis /= 10;
            places -= 1;
        }
        let mut buffer = itoa::Buffer::new();
        let digits = buffer.format(millis);
        out.extend_from_slice(b".");
        out.extend_from_slice(b"00".get(..places.saturating_sub(digits.len())).unwrap_or_default());
        out.extend_from_slice(digits.as_bytes());
    }
    out.extend_from_slice(b"s");
}

/// Where `write` put its bytes in `text`.
fn written(text: &mut BytesMut, write: impl FnOnce(&mut BytesMut)) -> std::ops::Range<usize> {
    let start = text.len();
    write(text);
    start..text.len()
}

fn put_number(out: &mut BytesMut, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Inserts headers into a response (rate-limit headers, `Retry-After`).
pub fn apply(response: &mut crate::server::Response, headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>) {
    let headers = headers.into_iter();
    let map = response.headers_mut();
    map.reserve(headers.size_hint().0);
    for (name, value) in headers {
        map.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reset_text(ms: u64) -> String {
        let mut out = BytesMut::new();
        write_reset(&mut out, ms);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn reset_texts_are_the_three_place_seconds_trimmed() {
        for ms in 0..200_000u64 {
            let expected = match ms {
                ..1000 => format!("{ms}ms"),
                60_000.. => format!("{}m{}s", ms / 60_000, (ms % 60_000) / 1000),
                _ => {
                    let text = format!("{:.3}", ms as f64 / 1000.0);
                    format!("{}s", text.trim_end_matches('0').trim_end_matches('.'))
                }
            };
            assert_eq!(reset_text(ms), expected, "{ms}");
        }
    }

    #[test]
    fn header_values_are_the_tightest_limit_of_each_kind() {
        let status = |limit, remaining, reset_ms| Status { limit, remaining, reset_ms };
        let statuses = [
            (Kind::Requests, status(100, 40, 1500)),
            (Kind::Tokens, status(10_000_000_000, 9_999_999_938, 61_000)),
            (Kind::Requests, status(50, 7, 250)),
        ];
        let rendered: Vec<(String, String)> =
            headers(&statuses).iter().map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string())).collect();
        let expected = [
            ("x-ratelimit-limit-requests", "50"),
            ("x-ratelimit-remaining-requests", "7"),
            ("x-ratelimit-reset-requests", "250ms"),
            ("x-ratelimit-limit-tokens", "10000000000"),
            ("x-ratelimit-remaining-tokens", "9999999938"),
            ("x-ratelimit-reset-tokens", "1m1s"),
        ];
        assert_eq!(rendered, expected.map(|(n, v)| (n.to_string(), v.to_string())));
        assert!(headers(&[]).is_empty());
    }

    #[test]
    fn resets_read_like_openais() {
        assert_eq!(reset_text(250), "250ms");
        assert_eq!(reset_text(1500), "1.5s");
        assert_eq!(reset_text(59_000), "59s");
        assert_eq!(reset_text(60_000), "1m0s");
    }

    /// Issue 27: an admission settles once, however its request ends: by its usage, or —
    /// dropped unsettled (the client went away) — to its prompt's estimate.
    #[test]
    fn an_admission_settles_once_and_when_dropped() {
        let limiter = Limiter::new(RedisKeys::new("t:"));
        let key = Limits { rpm: None, tpm: Some(100_000) };
        let remaining = |limiter: &Limiter| {
            let entry = limiter.entry("acme", &Limiter::applicable("7", &key, &Limits::default(), None)[0]);
            let bucket = entry.bucket.lock();
            bucket.status(now_ms()).remaining + bucket.held()
        };
        let admission =
            limiter.admit("acme", ("7", "ci", &key), &Limits::default(), None, (10, 1000)).unwrap().unwrap();
        let reserved = remaining(&limiter);
        admission.settle(30);
        admission.settle(0);
        assert_eq!(remaining(&limiter), reserved + 1010 - 30, "the second settlement is ignored");
        drop(admission);
        assert_eq!(remaining(&limiter), reserved + 1010 - 30, "dropped after settling: nothing more");
        let admission =
            limiter.admit("acme", ("7", "ci", &key), &Limits::default(), None, (10, 1000)).unwrap().unwrap();
        let before = remaining(&limiter);
        drop(admission);
        assert_eq!(remaining(&limiter), before + 1000, "dropped unsettled: the prompt's 10 stand");
    }

    #[test]
    fn all_or_nothing_and_the_tightest_limit_named() {
        let limiter = Limiter::new(RedisKeys::new("t:"));
        let key = Limits { rpm: Some(1000), tpm: None };
        let route = Limits { rpm: None, tpm: Some(80) };
        // 80 tpm: one block of credit is 1 token, but a first request may owe its own size.
        let admitted = limiter.admit("acme", ("7", "ci", &key), &Limits::default(), Some(("smart", &route)), (10, 40));
        let admission = admitted.unwrap().unwrap();
        let refused = limiter
            .admit("acme", ("7", "ci", &key), &Limits::default(), Some(("smart", &route)), (10, 40))
            .err()
            .unwrap();
        assert_eq!((refused.scope, refused.kind, refused.limit), (Scope::Route, Kind::Tokens, 80));
        assert!(refused.message().contains("route `smart`"), "{}", refused.message());
        // The refused request took nothing from the key's bucket.
        let entry = limiter.entry("acme", &Limiter::applicable("7", &key, &Limits::default(), None)[0]);
        assert_eq!(entry.window, "t:gw_rl:{acme}:key:7:rpm");
        assert_eq!(entry.bucket.lock().status(now_ms()).remaining, 1000 - 1);
        let names: Vec<String> = admission.headers(false).iter().map(|(n, _)| n.to_string()).collect();
        assert!(names.contains(&"x-ratelimit-remaining-requests".to_string()), "{names:?}");
        assert!(names.contains(&"x-ratelimit-reset-tokens".to_string()), "{names:?}");
        assert!(
            limiter
                .admit("acme", ("8", "other", &Limits::default()), &Limits::default(), None, (5, 0))
                .unwrap()
                .is_none()
        );
    }
}
