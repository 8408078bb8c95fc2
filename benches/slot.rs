//! The hash slot of a key, computed once per keyed command in cluster mode: the proxy's own
//! `cluster::slot` (table CRC16 + `memchr` for the hash tag) against `redis-protocol`'s
//! `redis_keyslot` (the `crc16` crate + a byte loop), ns per key.
//!
//! `cargo bench --bench slot` runs `slot/<impl>/<keys>` for:
//! - `short`: 1,000 keys like `user:1234` (9–10 bytes, no tag), the common case;
//! - `tagged`: 1,000 keys like `{user1234}:followers` (the tag is hashed);
//! - `long`: 1,000 keys of 100 bytes, no tag (the CRC loop dominates);
//! - `mixed_tags`: keys with empty tags `{}`, unclosed braces and nested braces.
//!
//! The numbers and the decision they led to are in docs/architecture.md.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use redis_policy_proxy::cluster::slot;
use redis_protocol::redis_keyslot;

fn key_sets() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let n = 1000;
    let short = (0..n).map(|i| format!("user:{i}").into_bytes()).collect();
    let tagged = (0..n)
        .map(|i| format!("{{user{i}}}:followers").into_bytes())
        .collect();
    let long = (0..n).map(|i| format!("{i:0>100}").into_bytes()).collect();
    let mixed = (0..n)
        .map(|i| match i % 4 {
            0 => format!("foo{{}}{{bar{i}}}"),
            1 => format!("foo{{bar{i}"),
            2 => format!("foo{{{{bar{i}}}}}zap"),
            _ => format!("tenant:{{u{i}}}.x"),
        })
        .map(String::into_bytes)
        .collect();
    vec![
        ("short", short),
        ("tagged", tagged),
        ("long", long),
        ("mixed_tags", mixed),
    ]
}

fn slots(c: &mut Criterion) {
    for (name, keys) in key_sets() {
        // Both must agree before their speed means anything.
        for k in &keys {
            assert_eq!(slot(k), redis_keyslot(k), "{k:?}");
        }
        let mut group = c.benchmark_group(format!("slot/{name}"));
        group.throughput(Throughput::Elements(keys.len() as u64));
        group.bench_function("ours", |b| {
            b.iter(|| {
                keys.iter()
                    .fold(0u32, |acc, k| acc ^ u32::from(slot(black_box(k))))
            })
        });
        group.bench_function("redis_protocol", |b| {
            b.iter(|| {
                keys.iter()
                    .fold(0u32, |acc, k| acc ^ u32::from(redis_keyslot(black_box(k))))
            })
        });
        group.finish();
    }
}

criterion_group!(benches, slots);
criterion_main!(benches);
