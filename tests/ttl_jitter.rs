//! TTL jitter against a real redis-server: 10,000 keys written through the proxy within about
//! a second get forced TTLs spread over the configured fraction, so they do not all expire
//! together. Asserted on the distribution of their expiry times (Redis's PEXPIRETIME), not
//! on timing.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::{Proxy, RedisServer, pipeline, split_frames};

const KEYS: usize = 10_000;
/// The default TTL (1 h) and its jitter.
const TTL_MS: i64 = 3_600_000;
const JITTER: f64 = 0.2;
const BUCKETS: usize = 10;

fn proxy_config(redis: &RedisServer, jitter: &str) -> redis_policy_proxy::Config {
    let yaml = format!(
        "upstream:\n  address: {}\nrules:\n  - id: ttl\n    ttl:\n      default: 1h\n      keys: written\n{jitter}",
        redis.addr()
    );
    redis_policy_proxy::setup::from_yaml(&yaml, Path::new("jitter.yaml")).unwrap()
}

/// Writes `KEYS` keys through the proxy in one pipeline (half SET, which gets `PX`, half
/// HSET, which gets a hidden `PEXPIRE … NX`), then reads every key's absolute expiry
/// (`PEXPIRETIME`, Unix ms) straight from Redis.
async fn expiry_times(redis: &RedisServer, proxy: &Proxy, tag: &str) -> Vec<i64> {
    let mut writes = Vec::new();
    for i in 0..KEYS {
        let line = if i % 2 == 0 {
            format!("SET {tag}:{i} v\r\n")
        } else {
            format!("HSET {tag}:{i} f v\r\n")
        };
        writes.extend_from_slice(line.as_bytes());
    }
    let replies = pipeline(proxy.addr, writes, KEYS).await;
    assert_eq!(replies.frames.len(), KEYS);
    let mut reads = Vec::new();
    for i in 0..KEYS {
        reads.extend_from_slice(format!("PEXPIRETIME {tag}:{i}\r\n").as_bytes());
    }
    let mut direct = redis.raw().await;
    direct.send(&reads).await;
    let got = direct.collect_frames(KEYS, common::DEADLINE * 3).await;
    let (frames, _) = split_frames(&got.joined());
    assert_eq!(frames.len(), KEYS);
    frames
        .iter()
        .map(|f| {
            let text = String::from_utf8_lossy(f);
            text.trim_start_matches(':').trim().parse::<i64>().unwrap()
        })
        .collect()
}

/// Counts of `times` in `BUCKETS` equal buckets from `hi - span` to `hi`.
fn histogram(times: &[i64], hi: i64, span: i64) -> [usize; BUCKETS] {
    let mut buckets = [0; BUCKETS];
    for &t in times {
        let from_top = (hi - t).clamp(0, span - 1);
        buckets[(from_top * BUCKETS as i64 / span) as usize] += 1;
    }
    buckets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jitter_spreads_the_expiry_of_keys_written_together() {
    let redis = RedisServer::start();
    let plain = Proxy::start(proxy_config(&redis, "")).await;
    let jittered = Proxy::start(proxy_config(&redis, &format!("      jitter: {JITTER}\n"))).await;

    // Without jitter every key expires within the time the writes took of each other.
    let times = expiry_times(&redis, &plain, "plain").await;
    let (lo, hi) = (*times.iter().min().unwrap(), *times.iter().max().unwrap());
    let span = (TTL_MS as f64 * JITTER) as i64;
    eprintln!(
        "without jitter: expiries within {} ms of each other",
        hi - lo
    );
    assert!(times.iter().all(|&t| t > 0), "every key has a TTL");
    assert!(hi - lo < span / BUCKETS as i64, "{} ms", hi - lo);

    // With jitter 0.2 the same writes expire over the last fifth of the hour, evenly.
    let times = expiry_times(&redis, &jittered, "jit").await;
    let hi = *times.iter().max().unwrap();
    let lo = *times.iter().min().unwrap();
    let buckets = histogram(&times, hi, span);
    eprintln!(
        "with jitter {JITTER}: expiries over {} ms; keys per {} ms bucket, latest first: {buckets:?}",
        hi - lo,
        span / BUCKETS as i64
    );
    // Spread over (nearly) the whole 20%, and no longer than the TTL itself allows.
    assert!(hi - lo > span * 9 / 10, "{} ms", hi - lo);
    assert!(hi - lo <= span + 60_000, "{} ms", hi - lo);
    // Even: each tenth of the spread holds a tenth of the keys, give or take (a uniform
    // spread puts 1000 ± 30 in each; the writes' own duration blurs the edges a little).
    let expected = KEYS / BUCKETS;
    assert!(
        buckets
            .iter()
            .all(|&n| n > expected * 7 / 10 && n < expected * 13 / 10),
        "{buckets:?}"
    );
    // No second holds more than a small share: the point of the jitter.
    let mut per_second = std::collections::HashMap::new();
    for t in &times {
        *per_second.entry(t / 1000).or_insert(0usize) += 1;
    }
    let worst = per_second.values().max().copied().unwrap_or(0);
    eprintln!("with jitter: at most {worst} of {KEYS} keys expire in the same second");
    assert!(worst < KEYS / 50, "{worst} keys expire in one second");
}
