//! Login throttling: at most 10 failed sign-ins per e-mail per 5 minutes, in process. Enough to
//! make password guessing through one admin replica slow; a fleet puts a WAF in front too.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(300);
const MAX_FAILURES: u32 = 10;

#[derive(Default)]
pub struct LoginLimiter {
    failures: Mutex<HashMap<String, (Instant, u32)>>,
}

impl LoginLimiter {
    pub fn allowed(&self, email: &str, now: Instant) -> bool {
        let map = self.failures.lock();
        map.get(email).is_none_or(|(since, count)| now.duration_since(*since) > WINDOW || *count < MAX_FAILURES)
    }

    pub fn failed(&self, email: &str, now: Instant) {
        let mut map = self.failures.lock();
        if map.len() > 100_000 {
            map.retain(|_, (since, _)| now.duration_since(*since) <= WINDOW);
        }
        let entry = map.entry(email.to_string()).or_insert((now, 0));
        if now.duration_since(entry.0) > WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
    }

    pub fn succeeded(&self, email: &str) {
        self.failures.lock().remove(email);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_after_ten_failures_and_forgets_after_the_window() {
        let limiter = LoginLimiter::default();
        let t0 = Instant::now();
        for _ in 0..10 {
            assert!(limiter.allowed("a@b.c", t0));
            limiter.failed("a@b.c", t0);
        }
        assert!(!limiter.allowed("a@b.c", t0));
        assert!(limiter.allowed("other@b.c", t0));
        assert!(limiter.allowed("a@b.c", t0 + WINDOW + Duration::from_secs(1)));
    }
}
