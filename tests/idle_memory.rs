//! The heap an idle client connection costs the proxy, counted exactly: a counting global
//! allocator tracks live bytes while the proxy runs in this process, and clients connect with
//! blocking std sockets, which allocate nothing on the heap. Unlike RSS (see
//! `scripts/idle_memory.py`), this does not depend on the allocator's free lists or on what
//! the machine is doing, so the bar (under 2 KiB per idle client) can be asserted.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;
#[path = "../benches/support/counting_alloc.rs"]
mod counting_alloc;

use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Proxy, RedisServer};
use counting_alloc::LIVE_BYTES;
use redis_policy_proxy::IDLE_TICK;

/// Clients per measurement: enough that one-off allocations (a tokio slab page, a grown
/// vector) are spread thin.
const CLIENTS: usize = 400;

/// The bar for one idle client connection.
const BAR: usize = 2048;

/// Both tests count process-wide: one at a time.
static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Live heap bytes once the proxy's tasks have settled: sampled until two readings 20 ms
/// apart agree (a task may still be finishing a write when the client has its reply).
async fn settled_live_bytes() -> usize {
    let mut last = LIVE_BYTES.load(Ordering::Relaxed);
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = LIVE_BYTES.load(Ordering::Relaxed);
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// Opens `n` connections to `addr`; with `ping`, each sends PING and reads its PONG. Then one
/// more connection's PING round trip proves the proxy has accepted every earlier one (the
/// listen queue is served in order).
async fn open(addr: std::net::SocketAddr, n: usize, ping: bool) -> Vec<std::net::TcpStream> {
    tokio::task::spawn_blocking(move || {
        let mut conns = Vec::with_capacity(n + 1);
        for _ in 0..n {
            let mut c = std::net::TcpStream::connect(addr).expect("connect");
            c.set_read_timeout(Some(common::DEADLINE)).unwrap();
            if ping {
                pong(&mut c);
            }
            conns.push(c);
        }
        let mut last = std::net::TcpStream::connect(addr).expect("connect");
        last.set_read_timeout(Some(common::DEADLINE)).unwrap();
        pong(&mut last);
        conns.push(last);
        conns
    })
    .await
    .unwrap()
}

fn pong(c: &mut std::net::TcpStream) {
    c.write_all(b"PING\r\n").unwrap();
    let mut buf = [0u8; 7];
    c.read_exact(&mut buf).expect("PONG in time");
    assert_eq!(&buf, b"+PONG\r\n");
}

/// Heap bytes per connection for `CLIENTS` new connections, measured after a warm-up round
/// that grows tokio's slabs and the proxy's shared structures once. A session that served a
/// command gives its reply channel back after one to two idle ticks: wait for that, bounded.
async fn per_client(proxy: &Proxy, ping: bool) -> usize {
    per_client_within(proxy, ping, 3 * IDLE_TICK).await
}

/// [`per_client`], waiting at most `release` for the sessions to give memory back.
async fn per_client_within(proxy: &Proxy, ping: bool, release: Duration) -> usize {
    drop(open(proxy.addr, CLIENTS, ping).await);
    let before = settled_live_bytes().await;
    let conns = open(proxy.addr, CLIENTS, ping).await;
    let deadline = Instant::now() + release;
    let per_client = loop {
        let after = settled_live_bytes().await;
        let per_client = after.saturating_sub(before) / (CLIENTS + 1);
        if per_client < BAR || Instant::now() > deadline {
            break per_client;
        }
        tokio::time::sleep(IDLE_TICK / 4).await;
    };
    drop(conns);
    per_client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_costs_under_two_kib_of_heap() {
    let _one_at_a_time = EXCLUSIVE.lock().await;
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let silent = per_client(&proxy, false).await;
    let pinged = per_client(&proxy, true).await;
    eprintln!(
        "heap per idle client: {silent} bytes connected and silent, {pinged} bytes after a PING"
    );
    assert!(silent < BAR, "{silent} bytes per silent client");
    assert!(pinged < BAR, "{pinged} bytes per client after a PING");
}

/// Heap per client right after its command, before any idle release: what a busy proxy
/// holds for each client that is using it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_right_after_a_command_costs_under_four_kib_of_heap() {
    let _one_at_a_time = EXCLUSIVE.lock().await;
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let used = per_client_within(&proxy, true, Duration::ZERO).await;
    eprintln!("heap per client right after a PING: {used} bytes");
    assert!(used < 2 * BAR, "{used} bytes per client right after a PING");
}

/// Heap allocations per GET forwarded to Redis and answered, on the proxy's default runtime
/// (one thread), with the client on a blocking-pool thread using stack buffers only. The one
/// allocation left per client read is the boxed processing future (it keeps idle sessions
/// small); everything else is reused: read buffer, batch queue, reply channel.
#[tokio::test(flavor = "current_thread")]
async fn allocations_per_forwarded_get() {
    let _one_at_a_time = EXCLUSIVE.lock().await;
    use counting_alloc::ALLOCATIONS;
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let addr = proxy.addr;
    let (p1, p16) = tokio::task::spawn_blocking(move || {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(common::DEADLINE)).unwrap();
        let get = b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n";
        let mut buf = [0u8; 5];
        let mut round = |n: usize, depth: usize| {
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            for _ in 0..n {
                let mut req = [0u8; 22 * 16];
                for i in 0..depth {
                    req[i * 22..(i + 1) * 22].copy_from_slice(get);
                }
                c.write_all(&req[..22 * depth]).unwrap();
                for _ in 0..depth {
                    c.read_exact(&mut buf).unwrap();
                }
            }
            (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / (n * depth) as f64
        };
        round(100, 1);
        (round(2000, 1), round(500, 16))
    })
    .await
    .unwrap();
    eprintln!("allocations per forwarded GET: {p1:.2} at -P 1, {p16:.2} at -P 16");
    assert!(p1 < 1.2, "{p1:.2} allocations per GET at -P 1");
    assert!(p16 < 0.2, "{p16:.2} allocations per GET at -P 16");
}
