//! Micro-benchmarks of the local rate limiter, the check the policy engine makes for every
//! command: ns per `LocalLimiter::check`.
//!
//! `cargo bench --bench ratelimit` runs, in order:
//! 1. an allocation check: 10,000 checks of a known key through a counting global allocator
//!    must allocate nothing (the hot-path promise); it panics otherwise;
//! 2. the criterion benchmarks `ratelimit/*`:
//!    - `existing_key`: one known key, allowed, real clock (the common case);
//!    - `existing_key_limited`: one known key over its limit (a client being refused);
//!    - `existing_key_check_at`: as `existing_key` with the clock read once outside the loop
//!      (`check_at`, as a session checking a batch would), to show what the clock costs;
//!    - `10k_keys`: round-robin over 10,000 known keys (cache misses, as with many clients).
//!
//! `cargo bench --bench ratelimit -- --test` (and `cargo test --all-targets`) runs each
//! benchmark once plus the allocation check.

use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use redis_policy_proxy::ratelimit::local::LocalLimiter;
use redis_policy_proxy::ratelimit::{Clock, Decision, Limit, MonotonicClock};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::ALLOCATIONS;

/// A limit no benchmark loop reaches: every check takes the "allowed" path.
const GENEROUS: Limit = Limit {
    requests: 1_000_000_000,
    window: Duration::from_secs(60),
};

/// A limit the first check exhausts: every later check in the window takes the "limited" path.
const TIGHT: Limit = Limit {
    requests: 1,
    window: Duration::from_secs(3600),
};

/// Client-address-like keys, as the policy engine would pass for a per-address rule.
fn keys(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("10.{}.{}.{}:6379", i >> 16, (i >> 8) & 255, i & 255).into_bytes())
        .collect()
}

fn limiter<C: Clock>(limit: Limit, clock: C, keys: &[Vec<u8>]) -> LocalLimiter<C> {
    let l = LocalLimiter::new(limit, 1 << 20, clock).unwrap();
    for k in keys {
        l.check(k).unwrap();
    }
    l
}

#[inline]
fn check<C: Clock>(l: &LocalLimiter<C>, key: &[u8]) -> Decision {
    l.check(key).unwrap()
}

const ALLOC_ITERATIONS: usize = 10_000;

/// Counts allocations of `ALLOC_ITERATIONS` checks of a known key, allowed and limited. Runs
/// before criterion starts, on the main thread, with no other thread of this process working.
fn allocation_check() {
    let key = keys(1);
    for (name, limit) in [("allowed", GENEROUS), ("limited", TIGHT)] {
        let l = limiter(limit, MonotonicClock::new(), &key);
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        for _ in 0..ALLOC_ITERATIONS {
            black_box(check(&l, black_box(&key[0])));
        }
        let total = ALLOCATIONS.load(Ordering::SeqCst) - before;
        println!("allocations per check of a known key ({name}): {total} in {ALLOC_ITERATIONS}");
        assert_eq!(
            total, 0,
            "LocalLimiter::check allocated on the hot path ({name})"
        );
    }
}

fn bench_local(c: &mut Criterion) {
    let mut g = c.benchmark_group("ratelimit");
    g.throughput(Throughput::Elements(1));

    let one = keys(1);
    let l = limiter(GENEROUS, MonotonicClock::new(), &one);
    g.bench_function("existing_key", |b| b.iter(|| check(&l, black_box(&one[0]))));

    let l = limiter(TIGHT, MonotonicClock::new(), &one);
    g.bench_function("existing_key_limited", |b| {
        b.iter(|| check(&l, black_box(&one[0])))
    });

    let l = limiter(GENEROUS, MonotonicClock::new(), &one);
    let now = l.now_ms();
    g.bench_function("existing_key_check_at", |b| {
        b.iter(|| l.check_at(black_box(&one[0]), now).unwrap())
    });

    let many = keys(10_000);
    let l = limiter(GENEROUS, MonotonicClock::new(), &many);
    let mut i = 0;
    g.bench_function("10k_keys", |b| {
        b.iter(|| {
            i = (i + 1) % many.len();
            check(&l, black_box(&many[i]))
        })
    });
    g.finish();
}

fn main() {
    // `--list` (test runners enumerating benchmarks) must print only the list.
    if !std::env::args().any(|a| a == "--list") {
        allocation_check();
    }
    let mut c = Criterion::default().configure_from_args();
    bench_local(&mut c);
    c.final_summary();
}
