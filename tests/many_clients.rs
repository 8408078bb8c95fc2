//! Ten thousand clients held at once, each served, then idle: the proxy stays up, answers
//! every one, and its memory per idle connection is measured (reported on stderr; bounded here
//! against regressions, the target is in docs/performance.md).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::time::{Duration, Instant};

use common::process::ProxyProcess;
use common::{DEADLINE, RedisServer, TempDir, write_file};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Raises this process's open-file limit to its hard limit (children inherit it) and returns
/// the limit.
#[allow(
    unsafe_code,
    reason = "getrlimit/setrlimit are FFI calls; std has no safe wrapper"
)]
fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    lim.rlim_cur
}

async fn ping(s: &mut TcpStream) {
    s.write_all(b"PING\r\n").await.unwrap();
    read_pong(s).await;
}

async fn read_pong(s: &mut TcpStream) {
    let mut buf = [0u8; 7];
    tokio::time::timeout(DEADLINE, s.read_exact(&mut buf))
        .await
        .expect("PONG in time")
        .unwrap();
    assert_eq!(&buf, b"+PONG\r\n");
}

/// A fresh proxy process for up to 20,000 clients, in front of its own Redis, and its first
/// client, served once (so the measured growth starts after the process's own warm-up).
async fn start(tag: &str) -> (RedisServer, TempDir, ProxyProcess, TcpStream) {
    let redis = RedisServer::start();
    let tmp = TempDir::new(tag);
    let policy = write_file(
        tmp.path(),
        "policy.yaml",
        "admin:\n  listen: \"off\"\nlimits:\n  max_clients: 20000\n",
    );
    let proxy = ProxyProcess::start(&policy, &redis, tmp.path().join("proxy.log"), &[]).await;
    let mut first = TcpStream::connect(proxy.addr()).await.unwrap();
    ping(&mut first).await;
    (redis, tmp, proxy, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_clients_are_held_and_served() {
    let limit = raise_fd_limit();
    // The test's sockets and the proxy's each need one descriptor per client.
    let n = 10_000.min(limit.saturating_sub(500) as usize);
    // CI raises the limit (.ci/run); a machine that cannot still tests what it can hold.
    assert!(
        n >= 200,
        "open-file hard limit {limit} is too low to test many clients"
    );
    if n < 10_000 {
        eprintln!("open-file limit {limit}: testing {n} clients instead of 10,000");
    }
    let (_redis, _tmp, proxy, mut first) = start("many-clients").await;
    let before = proxy.rss_kib();

    let started = Instant::now();
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(TcpStream::connect(proxy.addr()).await.expect("connect"));
    }
    // Every one is served (PING each, 100 at a time in flight).
    for chunk in clients.chunks_mut(100) {
        for s in chunk.iter_mut() {
            s.write_all(b"PING\r\n").await.unwrap();
        }
        for s in chunk.iter_mut() {
            read_pong(s).await;
        }
    }
    // Idle: let the proxy release per-read buffers, then measure.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = proxy.rss_kib();
    let per_client = (after.saturating_sub(before)) * 1024 / n as u64;
    eprintln!(
        "{n} clients connected and served in {:?}; proxy RSS {before} -> {after} KiB: {per_client} bytes per idle client",
        started.elapsed()
    );
    assert!(per_client < 16 * 1024, "{per_client} bytes per idle client");
    // Still responsive for a sample, and for the first client.
    for s in clients.iter_mut().step_by(997) {
        ping(s).await;
    }
    ping(&mut first).await;
    drop(clients);
    ping(&mut first).await;
}

/// The measure of a used connection: a fresh proxy process, clients that each
/// connected, sent one PING (all at once: the worst moment for the allocator, every session
/// holding its first read buffer and reply channel together), read the reply and went quiet.
/// Their cost is the growth of the process's RSS once the idle tick has released what a quiet
/// session does not need (`session::IDLE_TICK`, 2 s) and the tick after has given the freed
/// pages back to the system (`heap::trim`): sampled every 250 ms for 10 s, the last sample
/// counts (nothing the test waits for can signal "released": it is the absence of traffic for
/// a whole tick). The goal is 2 KiB per client: 2.0–2.1 KiB in the release build and 2.2 KiB
/// in this debug build (was 5.7; docs/performance.md, Memory per idle client); the bar, 3 KiB,
/// fails if the trim or the smaller task is lost. Measured too, and held to 4 KiB: the RSS
/// per client right after its PING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rss_per_client_that_pinged_once_is_measured() {
    // Right after the PING, before any release: 3.0–3.2 KiB in the release build at 5,000
    // clients (was 5.2–6.3 with tokio's reply channel and 16 KiB first reads).
    const USED_BAR: u64 = 4 * 1024;
    let limit = raise_fd_limit();
    let n = 2_000.min(limit.saturating_sub(500) as usize);
    assert!(n >= 200, "open-file hard limit {limit} is too low");
    let (_redis, _tmp, proxy, mut first) = start("rss-per-client").await;
    let before = proxy.rss_kib();
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(TcpStream::connect(proxy.addr()).await.expect("connect"));
    }
    for s in clients.iter_mut() {
        s.write_all(b"PING\r\n").await.unwrap();
    }
    for s in clients.iter_mut() {
        read_pong(s).await;
    }
    // Right after the command, every session still holds what it used (the goal: 4 KiB).
    let used = proxy.rss_kib().saturating_sub(before) * 1024 / n as u64;
    let mut samples = Vec::new();
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        samples.push(proxy.rss_kib());
    }
    let after = *samples.last().unwrap();
    let per_client = after.saturating_sub(before) * 1024 / n as u64;
    eprintln!(
        "{n} clients pinged once: proxy RSS {before} -> {after} KiB ({per_client} bytes per client, {used} right after the PING; samples {samples:?})"
    );
    assert!(
        per_client <= 3 * 1024,
        "{per_client} bytes of RSS per client"
    );
    assert!(
        used <= USED_BAR,
        "{used} bytes of RSS per client right after its PING"
    );
    ping(&mut first).await;
}
