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
    assert!(bucket.idle_return(1000).is_none(), "still in use");
    assert_eq!(bucket.idle_return(2200), Some((ask.seq, 48)));
    assert_eq!(bucket.held(), 0);
    assert!(bucket.lease_wanted(2300).is_none(), "an idle key holds none and asks for none");
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
                if let Some((seq, units)) = bucket.idle_return(now) {
                    let back = window.give_back(p as u64, seq, units);
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
