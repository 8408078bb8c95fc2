//! A client that pipelines without reading its replies must not make the proxy buffer without
//! bound: the proxy stops reading a client whose replies are not drained (at most
//! `limits.max_inflight` commands in flight), so its memory stays flat. Measured on the real
//! binary's resident memory, the way issue 7 measured twemproxy (2.5 GB) and predixy (280 MB).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::time::{Duration, Instant};

use common::process::ProxyProcess;
use common::{Raw, RedisServer, TempDir, resp, write_file};
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_cannot_grow_the_proxy() {
    let redis = RedisServer::start();
    let mut direct = redis.raw().await;
    let value = "x".repeat(1024);
    assert_eq!(direct.call(&["SET", "big", &value]).await, b"+OK\r\n");
    let tmp = TempDir::new("slow-consumer");
    let policy = write_file(tmp.path(), "policy.yaml", "admin:\n  listen: \"off\"\n");
    let proxy = ProxyProcess::start(&policy, &redis, tmp.path().join("proxy.log"), &[]).await;
    let before = proxy.rss_kib();

    // 200,000 GETs of the 1 KB value, written as fast as the proxy takes them, never read:
    // 200 MB of replies if the proxy buffered them all.
    let mut slow = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let one = resp(&["GET", "big"]);
    let chunk: Vec<u8> = one.iter().copied().cycle().take(one.len() * 1000).collect();
    let mut sent = 0;
    while sent < 200_000 {
        // Once the proxy stops reading, the kernel buffers fill and the write blocks.
        match tokio::time::timeout(Duration::from_secs(2), slow.write_all(&chunk)).await {
            Ok(Ok(())) => sent += 1000,
            Ok(Err(e)) => panic!("write failed: {e}"),
            Err(_) => break,
        }
    }
    assert!(
        sent < 200_000,
        "the proxy read everything: its memory holds the replies"
    );

    // The proxy is not stuck: another client is served while the slow one is parked.
    let mut other = Raw::connect(proxy.addr()).await;
    assert_eq!(other.call(&["GET", "big"]).await.len(), 1024 + 9);
    let mut peak = 0;
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        peak = peak.max(proxy.rss_kib());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "slow consumer: {sent} GETs accepted before the proxy stopped reading; proxy RSS {before} KiB -> peak {peak} KiB"
    );
    assert!(
        peak < 64 * 1024,
        "proxy RSS {peak} KiB with a slow consumer (limit 64 MiB)"
    );

    // Gone: the proxy drops its state and keeps serving.
    drop(slow);
    assert_eq!(other.call(&["PING"]).await, b"+PONG\r\n");
}
