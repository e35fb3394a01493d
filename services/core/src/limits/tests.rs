use super::*;
use proptest::prelude::*;

/// The lease script's semantics in Rust: a sliding window of leases, each dated when granted.
#[derive(Default)]
struct Window {
    limit: u64,
    leases: Vec<(u64, u64, u64)>, // (at, process·seq id, units)
    processes: Vec<(u64, u64)>,   // (process, last seen)
}

impl Window {
    fn new(limit: u64) -> Window {
        Window { limit, ..Window::default() }
    }

    fn lease(&mut self, process: u64, ask: LeaseAsk, now: u64) -> LeaseReply {
        self.leases.retain(|&(at, _, _)| at + WINDOW_MS > now);
        self.processes.retain(|&(p, _)| p != process);
        self.processes.push((process, now));
        self.processes.retain(|&(_, at)| at + WINDOW_MS > now);
        let sum: u64 = self.leases.iter().map(|l| l.2).sum();
        let grant = ask.want.min(self.limit.saturating_sub(sum));
        if grant > 0 {
            self.leases.push((now, process * 1_000_000 + ask.seq, grant));
        }
        let room = self.limit.saturating_sub(sum + grant);
        let mut wait = 0;
        if grant < ask.want {
            wait = WINDOW_MS;
            let mut freed = room;
            for &(at, _, units) in &self.leases {
                freed += units;
                if freed >= ask.need {
                    wait = at + WINDOW_MS - now;
                    break;
                }
            }
        }
        let reset = self.leases.last().map(|l| l.0 + WINDOW_MS - now).unwrap_or(0);
        LeaseReply { granted: grant, wait_ms: wait, room, processes: self.processes.len() as u64, reset_ms: reset }
    }

    /// Units counted in the window now.
    fn sum(&self, now: u64) -> u64 {
        self.leases.iter().filter(|l| l.0 + WINDOW_MS > now).map(|l| l.2).sum()
    }

    fn give_back(&mut self, process: u64, seq: u64, units: u64) -> u64 {
        match self.leases.iter_mut().find(|l| l.1 == process * 1_000_000 + seq) {
            Some(lease) => {
                let back = lease.2.min(units);
                lease.2 -= back;
                back
            }
            None => 0,
        }
    }
}

fn max_in_any_window(admitted: &mut [u64]) -> usize {
    admitted.sort_unstable();
    let mut best = 0;
    let mut start = 0;
    for end in 0..admitted.len() {
        while admitted[end] >= admitted[start] + WINDOW_MS {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

#[test]
fn limits_are_positive_integers_named_by_field() {
    assert!(Limits { rpm: Some(600), tpm: Some(100_000) }.validate("limits").is_ok());
    let errors = Limits { rpm: Some(0), tpm: Some(MAX_TPM + 1) }.validate("limits").unwrap_err();
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["limits.rpm", "limits.tpm"]);
    assert!(errors[0].message.contains("positive"));
    let parsed: Result<Limits, _> = serde_json::from_str(r#"{"rpm": 5, "rps": 1}"#);
    assert!(parsed.is_err(), "unknown fields are refused");
    let parsed: Result<Limits, _> = serde_json::from_str(r#"{"rpm": -5}"#);
    assert!(parsed.is_err(), "negative numbers are refused");
    assert!(Limits::default().is_empty());
}

#[test]
fn a_fresh_bucket_admits_one_block_on_credit_then_waits_for_its_lease() {
    let mut bucket = Bucket::new(800); // max_block 10
    for _ in 0..10 {
        bucket.check(1, 0).unwrap();
        bucket.take(1, 0);
    }
    assert_eq!(bucket.check(1, 0), Err(Refused { retry_after_ms: 1000, pending: true }));
    let ask = bucket.lease_wanted(0).unwrap();
    // Ten a second so far: the block is half that (about one second's traffic, over two).
    assert_eq!(ask.want, 10 + 5, "the debt plus a block");
    assert!(bucket.lease_wanted(0).is_none(), "one lease in flight");
    bucket.leased(ask, LeaseReply { granted: 15, wait_ms: 0, room: 785, processes: 1, reset_ms: 60_000 }, 5);
    assert_eq!(bucket.held(), 5);
    bucket.check(1, 5).unwrap();
}

#[test]
fn a_full_window_refuses_until_the_script_says_there_is_room() {
    let mut bucket = Bucket::new(100);
    bucket.take(1, 0);
    let ask = bucket.lease_wanted(0).unwrap();
    bucket.leased(ask, LeaseReply { granted: 0, wait_ms: 12_345, room: 0, processes: 2, reset_ms: 40_000 }, 0);
    let refused = bucket.check(1, 1000).unwrap_err();
    assert_eq!(refused.retry_after_ms, 11_345);
    assert_eq!(refused.retry_after_s(), 12);
    assert!(bucket.lease_wanted(1000).is_none(), "no lease while the window is known full");
    assert!(bucket.lease_wanted(12_345).is_some(), "the debt is leased when room is due");
    assert_eq!(bucket.status(1000).remaining, 0);
}

#[test]
fn a_request_larger_than_the_whole_limit_never_fits() {
    let bucket = Bucket::new(1000);
    assert_eq!(bucket.check(1001, 0), Err(Refused { retry_after_ms: WINDOW_MS, pending: false }));
    bucket.check(1000, 0).unwrap();
}

#[test]
fn offline_a_process_admits_its_share_of_the_limit_and_owes_it() {
    let mut bucket = Bucket::new(600);
    bucket.take(1, 0);
    let ask = bucket.lease_wanted(0).unwrap();
    bucket.leased(ask, LeaseReply { granted: 2, wait_ms: 0, room: 598, processes: 3, reset_ms: 60_000 }, 0);
    bucket.take(1, 10);
    let ask = bucket.lease_wanted(10);
    assert!(ask.is_some());
    bucket.lease_failed(10);
    assert!(bucket.is_offline());
    let mut admitted = 2;
    for i in 0..1000 {
        let now = 10 + i * 50; // 20 a second for 50 s
        if bucket.check(1, now).is_ok() {
            bucket.take(1, now);
            admitted += 1;
        }
    }
    assert_eq!(admitted, 200, "600 ÷ 3 processes over the window");
    let refused = bucket.check(1, 50_000).unwrap_err();
    assert!(refused.retry_after_ms > 9_000 && refused.retry_after_ms <= 11_000, "{refused:?}");
    let probe = bucket.lease_wanted(50_000).unwrap();
    assert!(probe.want >= 199, "what it admitted offline is leased back: {probe:?}");
}

#[test]
fn a_token_reservation_settles_to_the_reported_usage() {
    let mut bucket = Bucket::new(10_000);
    bucket.take(1, 0);
    let ask = bucket.lease_wanted(0).unwrap();
    bucket.leased(ask, LeaseReply { granted: 1000, wait_ms: 0, room: 9000, processes: 1, reset_ms: 60_000 }, 0);
    let before = bucket.status(0).remaining;
    bucket.check(300, 1).unwrap();
    bucket.take(300, 1);
    assert_eq!(bucket.status(1).remaining, before - 300);
    bucket.settle(300, 120, 2);
    assert_eq!(bucket.status(2).remaining, before - 120);
    bucket.settle(100, 150, 3);
    assert_eq!(bucket.status(3).remaining, before - 170);
}

#[test]
fn an_idle_bucket_gives_back_what_it_holds() {
    let mut bucket = Bucket::new(8000);
    bucket.take(1, 0);
    let ask = bucket.lease_wanted(0).unwrap();
    bucket.leased(ask, LeaseReply { granted: 50, wait_ms: 0, room: 7950, processes: 1, reset_ms: 60_000 }, 0);
    bucket.take(1, 100);
    // Still in use: it keeps its block (two a second: two units) and gives back the rest.
    assert_eq!(bucket.give_back(1000), [(ask.seq, 46)]);
    assert!(bucket.give_back(1100).is_empty(), "nothing beyond its block");
    assert_eq!(bucket.give_back(2200), [(ask.seq, 2)], "idle: the rest");
    bucket.give_back_failed(&[(ask.seq, 2)]);
    assert_eq!(bucket.held(), 2, "a give-back the store did not take is held again");
    assert_eq!(bucket.give_back(2300), [(ask.seq, 2)], "and given back at the next turn");
    assert_eq!(bucket.held(), 0);
    assert!(bucket.lease_wanted(2300).is_none(), "an idle key holds none and asks for none");
}

/// Issue 27's scenario: a key at 3000 tpm, six requests reserving ~1010 tokens each at once.
/// Three are admitted; their answers use 15 tokens each. Once they settle, the surplus goes back
/// to the fleet's window and the next request is admitted at once, with the headers counting
/// what was used, not what was reserved.
#[test]
fn settled_reservations_give_their_surplus_back_to_the_fleet() {
    let mut window = Window::new(3000);
    let mut bucket = Bucket::new(3000);
    let mut now = 0;
    let mut admitted = 0;
    let cycle = |bucket: &mut Bucket, window: &mut Window, now: u64| {
        if let Some(ask) = bucket.lease_wanted(now) {
            let reply = window.lease(0, ask, now);
            bucket.leased(ask, reply, now);
        }
        let leases = bucket.give_back(now);
        let back = leases.iter().map(|&(seq, units)| window.give_back(0, seq, units)).sum();
        bucket.returned(back);
    };
    for _ in 0..6 {
        // A refusal that only waits for a lease is retried after it (admit_waiting).
        for _ in 0..2 {
            match bucket.check(1010, now) {
                Ok(()) => {
                    bucket.take(1010, now);
                    admitted += 1;
                    break;
                }
                Err(refused) => {
                    bucket.refused(1010);
                    if !refused.pending {
                        break;
                    }
                    cycle(&mut bucket, &mut window, now);
                }
            }
        }
        now += 1;
    }
    assert_eq!(admitted, 3, "three fit, then the window is full");
    for _ in 0..admitted {
        bucket.settle(1010, 15, now);
    }
    now += 100;
    cycle(&mut bucket, &mut window, now);
    assert!(window.sum(now) <= 3 * 15 + bucket.block, "the surplus went back: {} in the window", window.sum(now));
    let status = bucket.status(now);
    assert!(status.remaining >= 3000 - 3 * 15 - bucket.block, "{status:?}");
    // The next request: at most one lease away (a re-check of the window).
    let mut ok = bucket.check(1010, now);
    if ok.as_ref().is_err_and(|r| r.pending) {
        cycle(&mut bucket, &mut window, now);
        ok = bucket.check(1010, now);
    }
    assert!(ok.is_ok(), "admitted within a second of the burst: {ok:?}");
    bucket.take(1010, now);
    for _ in 0..3 {
        now += 100;
        cycle(&mut bucket, &mut window, now);
    }
    bucket.settle(1010, 15, now);
    for _ in 0..30 {
        now += 100;
        cycle(&mut bucket, &mut window, now);
    }
    assert_eq!(bucket.held(), 0, "idle: everything given back");
    assert!(window.sum(now) <= 4 * 15, "{} in the window", window.sum(now));
    let mut ok = bucket.check(1010, now);
    if ok.as_ref().is_err_and(|r| r.pending) {
        cycle(&mut bucket, &mut window, now);
        ok = bucket.check(1010, now);
    }
    assert!(ok.is_ok(), "admitted once idle: {ok:?} {bucket:?}");
}

/// A bucket that found the window full asks again after RECHECK_MS while requests are being
/// refused (another process may have given units back), not only when the window said.
#[test]
fn a_full_window_is_asked_again_while_requests_wait() {
    let mut bucket = Bucket::new(100);
    bucket.take(1, 0);
    let ask = bucket.lease_wanted(0).unwrap();
    bucket.leased(ask, LeaseReply { granted: 0, wait_ms: 50_000, room: 0, processes: 2, reset_ms: 50_000 }, 0);
    assert!(bucket.lease_wanted(10).is_none(), "nobody waits");
    let refused = bucket.check(1, 10).unwrap_err();
    assert!(!refused.pending, "too soon to ask again");
    bucket.refused(1);
    let refused = bucket.check(1, RECHECK_MS).unwrap_err();
    assert!(refused.pending, "worth waiting for a lease");
    assert!(bucket.lease_wanted(RECHECK_MS).is_some());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Issue 27, the window arithmetic under any interleaving of admissions, settlements and
    /// time: once every request has settled and the bucket has been idle, the fleet's window
    /// counts no more than the tokens actually used in it (no reservation is left standing),
    /// and this process holds nothing.
    #[test]
    fn settled_windows_count_what_was_used(
        limit in 100u64..20_000,
        ops in proptest::collection::vec((0u8..4, 1u64..2000, 0u64..2000, 0u64..400), 1..80),
        delay in 0u64..3,
    ) {
        let mut window = Window::new(limit);
        let mut bucket = Bucket::new(limit);
        let mut in_flight: Vec<(u64, u64)> = Vec::new(); // (reserved, actual)
        let mut used: Vec<(u64, u64)> = Vec::new(); // (at, tokens)
        let mut leases: Vec<(u64, LeaseAsk)> = Vec::new();
        let mut now = 0u64;
        let step = |bucket: &mut Bucket, window: &mut Window, leases: &mut Vec<(u64, LeaseAsk)>, now: u64| {
            for (due, ask) in std::mem::take(leases) {
                if due <= now {
                    let reply = window.lease(0, ask, now);
                    bucket.leased(ask, reply, now);
                } else {
                    leases.push((due, ask));
                }
            }
            if let Some(ask) = bucket.lease_wanted(now) {
                leases.push((now + delay * 10, ask));
            }
            let back: u64 = bucket.give_back(now).iter().map(|&(seq, units)| window.give_back(0, seq, units)).sum();
            bucket.returned(back);
        };
        for (op, size, actual, wait) in ops {
            match op {
                0 | 1 => {
                    if bucket.check(size, now).is_ok() {
                        bucket.take(size, now);
                        in_flight.push((size, actual));
                    } else {
                        bucket.refused(size);
                    }
                }
                2 if !in_flight.is_empty() => {
                    let (reserved, actual) = in_flight.remove((size as usize) % in_flight.len());
                    bucket.settle(reserved, actual, now);
                    used.push((now, actual));
                }
                _ => now += wait,
            }
            step(&mut bucket, &mut window, &mut leases, now);
            now += 1;
        }
        for (reserved, actual) in std::mem::take(&mut in_flight) {
            bucket.settle(reserved, actual, now);
            used.push((now, actual));
        }
        for _ in 0..40 {
            now += 100;
            step(&mut bucket, &mut window, &mut leases, now);
        }
        let used_in_window: u64 = used.iter().filter(|(at, _)| at + WINDOW_MS > now).map(|(_, t)| t).sum();
        prop_assert_eq!(bucket.held(), 0);
        prop_assert!(
            window.sum(now) <= used_in_window,
            "the window counts {} with {} used in it", window.sum(now), used_in_window
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The fleet bound: however requests arrive at however many processes, and however late
    /// leases come back, no 60 s window admits more than `limit + processes × 2 × max_block`.
    /// Under steady overload the window also admits at least the limit (nothing starves).
    #[test]
    fn a_fleet_admits_at_most_the_limit_plus_two_blocks_a_process(
        limit in 5u64..3000,
        processes in 1usize..4,
        rates in proptest::collection::vec(0u64..40, 1..4),
        delay_ticks in 0u64..6,
        pause_at in 0u64..18_000,
    ) {
        let tick = 10u64; // ms
        let mut window = Window::new(limit);
        let mut buckets: Vec<Bucket> = (0..processes).map(|_| Bucket::new(limit)).collect();
        let mut in_flight: Vec<(u64, usize, LeaseAsk)> = Vec::new();
        let mut admitted = Vec::new();
        let mut rng = 0x2545F4914F6CDD1Du64;
        for step in 0..18_000u64 {
            let now = step * tick;
            for (due, process, ask) in std::mem::take(&mut in_flight) {
                if due <= now {
                    let reply = window.lease(process as u64, ask, now);
                    buckets[process].leased(ask, reply, now);
                } else {
                    in_flight.push((due, process, ask));
                }
            }
            for (p, bucket) in buckets.iter_mut().enumerate() {
                let rate = rates[p % rates.len()];
                // A quiet spell from `pause_at` for 5 s exercises idle give-backs.
                let quiet = step >= pause_at && step < pause_at + 500;
                rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
                let arrivals = if quiet || rate == 0 { 0 } else { rng % (rate / 10 + 2) };
                for _ in 0..arrivals {
                    match bucket.check(1, now) {
                        Ok(()) => { bucket.take(1, now); admitted.push(now); }
                        Err(_) => bucket.refused(1),
                    }
                }
                if let Some(ask) = bucket.lease_wanted(now) {
                    in_flight.push((now + delay_ticks * tick, p, ask));
                }
                let leases = bucket.give_back(now);
                if !leases.is_empty() {
                    let back = leases.iter().map(|&(seq, units)| window.give_back(p as u64, seq, units)).sum();
                    bucket.returned(back);
                }
            }
        }
        let max_block = Bucket::new(limit).max_block();
        let bound = limit as usize + processes * 2 * max_block as usize;
        let most = max_in_any_window(&mut admitted);
        prop_assert!(most <= bound, "{most} admitted in one window; bound {bound}");
    }
}

#[test]
fn under_steady_overload_two_processes_admit_the_limit_in_a_minute() {
    // The shape of the end-to-end test: 600 rpm, 25 requests a second shared by two processes.
    let limit = 600;
    let mut window = Window::new(limit);
    let mut buckets = [Bucket::new(limit), Bucket::new(limit)];
    let mut admitted = 0;
    let mut in_flight: Vec<(u64, usize, LeaseAsk)> = Vec::new();
    for i in 0..1500u64 {
        let now = i * 40;
        for (due, p, ask) in std::mem::take(&mut in_flight) {
            if due <= now {
                let reply = window.lease(p as u64, ask, now);
                buckets[p].leased(ask, reply, now);
            } else {
                in_flight.push((due, p, ask));
            }
        }
        let p = (i % 2) as usize;
        if buckets[p].check(1, now).is_ok() {
            buckets[p].take(1, now);
            admitted += 1;
        }
        for (p, bucket) in buckets.iter_mut().enumerate() {
            if let Some(ask) = bucket.lease_wanted(now) {
                in_flight.push((now + 2, p, ask));
            }
        }
    }
    assert!((600..=600 + 2 * 2 * 7).contains(&admitted), "{admitted}");
}
