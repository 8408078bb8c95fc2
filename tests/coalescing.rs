//! Request coalescing (`upstream.coalesce_reads`) against a real redis-server: identical
//! concurrent reads of a hot key share one upstream reply, every read is accounted for
//! (sent upstream or shared), replies are right, and a client always reads its own writes.
//! The measurement (upstream commands per client read, client latency, coalescing on and
//! off with 500 clients on one key) is printed, not asserted on.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Proxy, Raw, RedisServer, http_get, sample};

const CLIENTS: usize = 500;
const READS: usize = 20;

fn config(redis: &RedisServer, coalesce: bool) -> redis_policy_proxy::Config {
    let yaml = format!(
        "upstream:\n  address: {}\n  coalesce_reads: {coalesce}\n",
        redis.addr()
    );
    redis_policy_proxy::setup::from_yaml(&yaml, Path::new("coalesce.yaml")).unwrap()
}

/// `CLIENTS` clients, each reading the hot key `READS` times one after the other, all at
/// once; every reply is checked. Returns each read's latency.
async fn hammer(proxy: &Proxy) -> Vec<Duration> {
    let took = common::all_at_once(proxy.addr, CLIENTS, |_, mut c| async move {
        let mut took = Vec::with_capacity(READS);
        for _ in 0..READS {
            let at = Instant::now();
            let reply = c.call(&["GET", "hot"]).await;
            took.push(at.elapsed());
            assert_eq!(reply, b"$5\r\nhello\r\n");
        }
        took
    })
    .await;
    took.into_iter().flatten().collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// Upstream GETs and coalesced reads for one run of [`hammer`], and its latencies.
async fn run(redis: &RedisServer, coalesce: bool) -> (u64, u64, Vec<Duration>) {
    let proxy = Proxy::start(config(redis, coalesce)).await;
    let before = redis.command_calls("get").await;
    let mut took = hammer(&proxy).await;
    let upstream = redis.command_calls("get").await - before;
    let (_, metrics) = http_get(proxy.admin, "/metrics").await;
    let coalesced = sample(&metrics, "rpp_coalesced_reads_total") as u64;
    took.sort();
    let reads = (CLIENTS * READS) as f64;
    eprintln!(
        "coalesce_reads {coalesce}: {CLIENTS} clients x {READS} GETs of one key: {upstream} GETs upstream ({:.3} per client read), {coalesced} shared; client latency p50 {:?} p99 {:?} max {:?}",
        upstream as f64 / reads,
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        took.last().unwrap(),
    );
    proxy.stop().await;
    (upstream, coalesced, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_key_reads_share_upstream_replies_only_when_enabled() {
    let redis = RedisServer::start();
    redis.direct(&["SET", "hot", "hello"]).await;
    let reads = (CLIENTS * READS) as u64;
    let (upstream, coalesced, _) = run(&redis, false).await;
    assert_eq!((upstream, coalesced), (reads, 0), "off: every read is sent");
    let (upstream, coalesced, _) = run(&redis, true).await;
    // Every read is accounted for: sent, or answered with a reply in flight.
    assert_eq!(upstream + coalesced, reads);
    assert!(
        coalesced > 0,
        "500 concurrent readers of one key share some replies"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reads_its_own_writes_while_others_share_reads() {
    let redis = RedisServer::start();
    redis.direct(&["SET", "hot", "hello"]).await;
    let proxy = Proxy::start(config(&redis, true)).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..100 {
        let mut c = Raw::connect(proxy.addr).await;
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let reply = c.call(&["GET", "hot"]).await;
                assert!(reply.starts_with(b"$"), "{reply:?}");
            }
        }));
    }
    // The writer writes on the shared connection, then through MULTI on its dedicated one,
    // and each time reads the value back: never an older one.
    let mut writer = Raw::connect(proxy.addr).await;
    for i in 0..300 {
        let value = format!("v{i}");
        if i % 2 == 0 {
            assert_eq!(writer.call(&["SET", "hot", &value]).await, b"+OK\r\n");
        } else {
            writer
                .send(format!("MULTI\r\nSET hot {value}\r\nEXEC\r\n").as_bytes())
                .await;
            let got = writer.collect_frames(3, common::DEADLINE).await;
            assert_eq!(got.joined(), b"+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n");
        }
        let expected = format!("${}\r\n{value}\r\n", value.len());
        assert_eq!(
            String::from_utf8_lossy(&writer.call(&["GET", "hot"]).await),
            expected,
            "write {i}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }
    let (_, metrics) = http_get(proxy.admin, "/metrics").await;
    eprintln!(
        "reads shared during the read-your-writes run: {}",
        sample(&metrics, "rpp_coalesced_reads_total")
    );
}
