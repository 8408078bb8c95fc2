//! Micro-benchmarks of the per-command hot path: request decoding, command classification and
//! reply scanning, reported per command.
//!
//! `cargo bench --bench codec` runs, in order:
//! 1. an allocation check: 10,000 decode+classify of a GET through a counting global allocator
//!    must allocate nothing once the argument `Vec` has grown (the codec's zero-allocation
//!    promise); it panics otherwise;
//! 2. the criterion benchmarks (`decode/*`, `classify/*`, `scan/*`), with throughput in
//!    commands (or replies) so the pipeline case reads per command too;
//! 3. a short self-timed summary printing ns per command for every case, for quick comparison.
//!
//! `cargo bench --bench codec -- --test` (and `cargo test --all-targets`) runs each benchmark
//! once plus the allocation check, and skips the summary.

#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark measures wall-clock time, which tokio's paused clock must not steer"
)]

use std::hint::black_box;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use redis_policy_proxy::codec::{self, CodecLimits, Decoded};
use redis_policy_proxy::commands::classify;
use redis_policy_proxy::reply;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::ALLOCATIONS;

// ---------------------------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------------------------

/// One command encoded as a RESP multibulk, as a client library sends it.
fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn get_request() -> Vec<u8> {
    resp(&[b"GET", b"key:000000012345"])
}

fn set_1k_request() -> Vec<u8> {
    resp(&[b"SET", b"key:000000012345", &[b'x'; 1024]])
}

/// 16 commands back to back, alternating SET (64-byte value) and GET, like a pipelining client.
fn pipeline_16() -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..16 {
        let key = format!("key:{i:012}");
        if i % 2 == 0 {
            out.extend(resp(&[b"SET", key.as_bytes(), &[b'v'; 64]]));
        } else {
            out.extend(resp(&[b"GET", key.as_bytes()]));
        }
    }
    out
}

fn bulk_reply() -> Vec<u8> {
    let mut out = b"$1024\r\n".to_vec();
    out.extend_from_slice(&[b'x'; 1024]);
    out.extend_from_slice(b"\r\n");
    out
}

/// A 100-element array of 16-byte bulk strings, like an MGET or LRANGE reply.
fn array_100_reply() -> Vec<u8> {
    let mut out = b"*100\r\n".to_vec();
    for i in 0..100 {
        out.extend_from_slice(format!("$16\r\nvalue:{i:010}\r\n").as_bytes());
    }
    out
}

const CLASSIFY_NAMES: &[&str] = &["GET", "set", "hset", "BLPOP", "subscribe", "XREADGROUP"];

// ---------------------------------------------------------------------------------------------
// The operations measured
// ---------------------------------------------------------------------------------------------

/// Decodes one complete request; panics if `buf` does not start with one.
#[inline]
fn decode_one(buf: &[u8], limits: &CodecLimits, args: &mut Vec<Range<usize>>) -> usize {
    match codec::decode(buf, limits, args) {
        Ok(Some(d)) => d.len(),
        other => panic!("benchmark input did not decode: {other:?}"),
    }
}

/// Decodes every request in `buf`; returns how many there were.
#[inline]
fn decode_all(buf: &[u8], limits: &CodecLimits, args: &mut Vec<Range<usize>>) -> usize {
    let mut pos = 0;
    let mut n = 0;
    while pos < buf.len() {
        pos += decode_one(&buf[pos..], limits, args);
        n += 1;
    }
    n
}

/// What the session does for every multibulk command: decode, then classify the name.
#[inline]
fn decode_classify(
    buf: &[u8],
    limits: &CodecLimits,
    args: &mut Vec<Range<usize>>,
) -> classify::Kind {
    match codec::decode(buf, limits, args) {
        Ok(Some(Decoded::Command { .. })) => classify::classify(&buf[args[0].clone()]),
        other => panic!("benchmark input did not decode as a command: {other:?}"),
    }
}

#[inline]
fn scan_one(buf: &[u8]) -> usize {
    match reply::scan(buf) {
        Ok(Some(n)) => n,
        other => panic!("benchmark reply did not scan: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Allocation check
// ---------------------------------------------------------------------------------------------

const ALLOC_ITERATIONS: usize = 10_000;

/// Counts allocations of `ALLOC_ITERATIONS` decode+classify of a GET after one warm-up call
/// has sized the argument `Vec`. Runs before criterion starts, on the main thread, with no
/// other thread of this process doing work.
fn allocation_check() {
    let limits = CodecLimits::default();
    let get = get_request();
    let mut args: Vec<Range<usize>> = Vec::new();
    black_box(decode_classify(&get, &limits, &mut args)); // warm-up: grows `args` once
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..ALLOC_ITERATIONS {
        black_box(decode_classify(black_box(&get), &limits, &mut args));
    }
    let total = ALLOCATIONS.load(Ordering::SeqCst) - before;
    println!(
        "allocations per decode+classify: {} ({total} in {ALLOC_ITERATIONS} iterations of a GET)",
        total / ALLOC_ITERATIONS
    );
    assert_eq!(
        total, 0,
        "decode+classify of a GET allocated {total} times in {ALLOC_ITERATIONS} iterations; \
         the hot path must not allocate"
    );

    let array = array_100_reply();
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..ALLOC_ITERATIONS {
        black_box(scan_one(black_box(&array)));
    }
    let total = ALLOCATIONS.load(Ordering::SeqCst) - before;
    println!(
        "allocations per reply scan (100-element array): {}",
        total / ALLOC_ITERATIONS
    );
    assert_eq!(total, 0, "reply::scan allocated {total} times");
}

// ---------------------------------------------------------------------------------------------
// Criterion benchmarks
// ---------------------------------------------------------------------------------------------

fn bench_decode(c: &mut Criterion) {
    let limits = CodecLimits::default();
    let mut args = Vec::with_capacity(8);
    let mut g = c.benchmark_group("decode");

    g.throughput(Throughput::Elements(1));
    let get = get_request();
    g.bench_function("get", |b| {
        b.iter(|| decode_one(black_box(&get), &limits, &mut args))
    });
    let set = set_1k_request();
    g.bench_function("set_1k", |b| {
        b.iter(|| decode_one(black_box(&set), &limits, &mut args))
    });
    g.bench_function("get+classify", |b| {
        b.iter(|| decode_classify(black_box(&get), &limits, &mut args))
    });

    let pipeline = pipeline_16();
    g.throughput(Throughput::Elements(16));
    g.bench_function("pipeline_16", |b| {
        b.iter(|| decode_all(black_box(&pipeline), &limits, &mut args))
    });
    g.finish();
}

fn bench_classify(c: &mut Criterion) {
    let mut g = c.benchmark_group("classify");
    g.throughput(Throughput::Elements(1));
    for name in CLASSIFY_NAMES {
        g.bench_function(*name, |b| {
            b.iter(|| classify::classify(black_box(name.as_bytes())))
        });
    }
    g.finish();
}

fn bench_scan(c: &mut Criterion) {
    let mut g = c.benchmark_group("scan");
    g.throughput(Throughput::Elements(1));
    let ok = b"+OK\r\n".to_vec();
    g.bench_function("ok", |b| b.iter(|| scan_one(black_box(&ok))));
    let bulk = bulk_reply();
    g.bench_function("bulk_1k", |b| b.iter(|| scan_one(black_box(&bulk))));
    let array = array_100_reply();
    g.bench_function("array_100", |b| b.iter(|| scan_one(black_box(&array))));
    g.finish();
}

// ---------------------------------------------------------------------------------------------
// Self-timed summary
// ---------------------------------------------------------------------------------------------

/// Median ns per operation of `f`, which performs `ops` operations per call: five batches,
/// each sized to take about 40 ms.
fn ns_per_op(ops: usize, mut f: impl FnMut()) -> f64 {
    let mut iters = 1u64;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        if t.elapsed() >= Duration::from_millis(10) {
            break;
        }
        iters *= 2;
    }
    iters *= 4;
    let mut samples: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / (iters as f64 * ops as f64)
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[2]
}

fn summary() {
    let limits = CodecLimits::default();
    let mut args = Vec::with_capacity(8);
    let get = get_request();
    let set = set_1k_request();
    let pipeline = pipeline_16();
    let ok = b"+OK\r\n".to_vec();
    let bulk = bulk_reply();
    let array = array_100_reply();

    println!();
    println!("summary (self-timed, median of 5 batches), ns per command:");
    let row = |label: &str, ns: f64| println!("  {label:<28} {ns:>8.1} ns");
    row(
        "decode GET",
        ns_per_op(1, || {
            black_box(decode_one(black_box(&get), &limits, &mut args));
        }),
    );
    row(
        "decode SET 1 KiB",
        ns_per_op(1, || {
            black_box(decode_one(black_box(&set), &limits, &mut args));
        }),
    );
    row(
        "decode+classify GET",
        ns_per_op(1, || {
            black_box(decode_classify(black_box(&get), &limits, &mut args));
        }),
    );
    row(
        "decode pipeline of 16",
        ns_per_op(16, || {
            black_box(decode_all(black_box(&pipeline), &limits, &mut args));
        }),
    );
    for name in CLASSIFY_NAMES {
        row(
            &format!("classify {name}"),
            ns_per_op(1, || {
                black_box(classify::classify(black_box(name.as_bytes())));
            }),
        );
    }
    row(
        "scan +OK",
        ns_per_op(1, || {
            black_box(scan_one(black_box(&ok)));
        }),
    );
    row(
        "scan bulk 1 KiB",
        ns_per_op(1, || {
            black_box(scan_one(black_box(&bulk)));
        }),
    );
    row(
        "scan array of 100",
        ns_per_op(1, || {
            black_box(scan_one(black_box(&array)));
        }),
    );
}

fn main() {
    // `--list` (test runners enumerating benchmarks) must print only the list; `--test`
    // (cargo test --all-targets, cargo bench -- --test) wants correctness, not timing.
    let list = std::env::args().any(|a| a == "--list");
    let test = std::env::args().any(|a| a == "--test");

    if !list {
        allocation_check();
    }

    let mut c = Criterion::default().configure_from_args();
    bench_decode(&mut c);
    bench_classify(&mut c);
    bench_scan(&mut c);
    c.final_summary();

    if !list && !test {
        summary();
    }
}
