//! `upstream.sentinel.read_from: replica` against a real Sentinel set-up (1 primary,
//! 1 replica, 3 sentinels): plain reads through the proxy are served by the replica the
//! sentinels list (proved with each node's own `INFO commandstats`), writes and reads inside
//! MULTI by the primary; a pipeline mixing both keeps its reply order; a killed replica costs
//! readers no error (reads fall back to the primary); after a failover writes go to the new
//! primary and reads to the new replica set, with no error beyond in-flight commands.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::time::{Duration, Instant};

use common::sentinel::{MASTER, SentinelSetup};
use common::{DEADLINE, Proxy, Raw, http_get, resp, show, wait_until};
use redis_policy_proxy::Config;

/// Sentinel mode for `setup` with `read_from: replica`, reconnecting quickly.
fn config(setup: &SentinelSetup) -> Config {
    let text = format!(
        "upstream:\n  mode: sentinel\n  sentinel:\n    sentinels: [{}]\n    master_name: {MASTER}\n    timeout_ms: 500\n    read_from: replica\n  reconnect_min_ms: 10\n  reconnect_max_ms: 200\n",
        setup.sentinel_addrs().join(", ")
    );
    redis_policy_proxy::setup::from_yaml(&text, std::path::Path::new("sentinel-replica-test.yaml"))
        .expect("config parses")
}

/// How many times `node` ran `command` since its stats were last reset (`INFO commandstats`).
async fn calls(node: &str, command: &str) -> u64 {
    let reply = Raw::connect(node)
        .await
        .call(&["INFO", "commandstats"])
        .await;
    let text = String::from_utf8_lossy(&reply).into_owned();
    let prefix = format!("cmdstat_{command}:calls=");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Zeroes `INFO commandstats` on every node.
async fn reset_stats(nodes: &[&str]) {
    for n in nodes {
        assert_eq!(
            Raw::connect(n).await.call(&["CONFIG", "RESETSTAT"]).await,
            b"+OK\r\n"
        );
    }
}

/// `$len\r\nvalue\r\n`.
fn bulk(v: &str) -> String {
    format!("${}\r\n{v}\r\n", v.len())
}

/// `proxy_replica_reads` from the proxy's INFO.
async fn replica_reads(c: &mut Raw) -> u64 {
    let text = String::from_utf8_lossy(&c.call(&["INFO", "proxy"]).await).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("proxy_replica_reads:"))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Polls GETs of `key` (expecting `value`) through fresh proxy connections until `node`
/// has run at least one GET: the proxy learns the replicas and connects in the background.
async fn wait_reads_on(proxy: &Proxy, node: &str, key: &str, value: &str, within: Duration) {
    let until = Instant::now() + within;
    loop {
        let mut c = Raw::connect(proxy.addr).await;
        let got = c.call(&["GET", key]).await;
        assert_eq!(show(&got), show(bulk(value).as_bytes()));
        if calls(node, "get").await > 0 {
            return;
        }
        assert!(Instant::now() < until, "reads never reached {node}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_the_replica_and_everything_else_to_the_primary() {
    let mut setup = SentinelSetup::start();
    let (primary, replica) = (setup.primary.addr(), setup.replica.addr());
    let both = [primary.as_str(), replica.as_str()];
    let proxy = Proxy::start(config(&setup)).await;
    let mut c = Raw::connect(proxy.addr).await;

    assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["WAIT", "1", "0"]).await, b":1\r\n");
    reset_stats(&both).await;
    wait_reads_on(&proxy, &replica, "k", "v", DEADLINE).await;

    // Reads: every GET on the replica, none on the primary.
    reset_stats(&both).await;
    for _ in 0..10 {
        assert_eq!(
            show(&c.call(&["GET", "k"]).await),
            show(bulk("v").as_bytes())
        );
    }
    assert_eq!(calls(&primary, "get").await, 0, "GETs on the primary");
    assert_eq!(calls(&replica, "get").await, 10, "GETs on the replica");

    // A write goes to the primary.
    reset_stats(&both).await;
    assert_eq!(c.call(&["SET", "k", "w"]).await, b"+OK\r\n");
    assert_eq!(calls(&primary, "set").await, 1);

    // Inside MULTI a read runs on the primary, with the transaction.
    reset_stats(&both).await;
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["GET", "k"]).await, b"+QUEUED\r\n");
    assert_eq!(
        show(&c.call(&["EXEC"]).await),
        show(format!("*1\r\n{}", bulk("w")).as_bytes())
    );
    assert_eq!(calls(&primary, "get").await, 1);
    assert_eq!(calls(&replica, "get").await, 0);
    assert_eq!(c.call(&["WAIT", "1", "0"]).await, b":1\r\n");

    // One pipeline mixing writes and reads: replies in request order, and a read right
    // after a write reads it (it stays on the primary).
    let mut input = Vec::new();
    let mut expected = Vec::new();
    for round in 0..10 {
        let key = format!("p{round}");
        input.extend(resp(&["GET", "k"]));
        expected.extend(bulk("w").into_bytes());
        input.extend(resp(&["SET", &key, &round.to_string()]));
        expected.extend_from_slice(b"+OK\r\n");
        input.extend(resp(&["GET", &key]));
        expected.extend(bulk(&round.to_string()).into_bytes());
        input.extend(resp(&["INCR", "n"]));
        expected.extend(format!(":{}\r\n", round + 1).into_bytes());
        input.extend(resp(&["EXISTS", "k"]));
        expected.extend_from_slice(b":1\r\n");
    }
    c.send(&input).await;
    assert_eq!(show(&c.read_frames(50).await.concat()), show(&expected));

    // Once WAIT says the replica has them, reads (from the replica) see the writes.
    assert_eq!(c.call(&["WAIT", "1", "0"]).await, b":1\r\n");
    reset_stats(&both).await;
    let mut input = Vec::new();
    let mut expected = Vec::new();
    for round in 0..10 {
        input.extend(resp(&["GET", &format!("p{round}")]));
        expected.extend(bulk(&round.to_string()).into_bytes());
    }
    let mut reader = Raw::connect(proxy.addr).await;
    reader.send(&input).await;
    assert_eq!(
        show(&reader.read_frames(10).await.concat()),
        show(&expected)
    );
    assert_eq!(
        calls(&replica, "get").await,
        10,
        "pipelined GETs on the replica"
    );
    assert_eq!(calls(&primary, "get").await, 0);

    // INFO says how reads are routed and counts them.
    let text = String::from_utf8_lossy(&c.call(&["INFO"]).await).into_owned();
    assert!(text.contains("proxy_read_from:replica\r\n"), "{text}");
    assert!(replica_reads(&mut c).await >= 20, "{text}");
    // Readiness is about the primary's connections, not the replicas'.
    let (status, body) = http_get(proxy.admin, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!("primary {primary} connected")),
        "{body}"
    );

    // The replica dies with reads in flight (stopped first, so they are surely sent and
    // unanswered when it dies): they are sent to the primary, the client sees only values.
    reset_stats(&[primary.as_str()]).await;
    let before = replica_reads(&mut c).await;
    setup.replica.signal("-STOP");
    let mut input = Vec::new();
    for _ in 0..10 {
        input.extend(resp(&["GET", "k"]));
    }
    reader.send(&input).await;
    wait_until("the reads sent to the stopped replica", || {
        let proxy = proxy.addr;
        async move { replica_reads(&mut Raw::connect(proxy).await).await >= before + 10 }
    })
    .await;
    setup.replica.kill();
    let got = reader.read_frames(10).await.concat();
    assert_eq!(show(&got), show(bulk("w").repeat(10).as_bytes()));
    assert_eq!(
        calls(&primary, "get").await,
        10,
        "the in-flight reads, resent"
    );

    // Later reads go to the primary directly, under a pipelined load.
    let mut served = 0;
    while calls(&primary, "get").await < 50 {
        let mut input = Vec::new();
        for _ in 0..10 {
            input.extend(resp(&["GET", "k"]));
        }
        reader.send(&input).await;
        let got = reader.read_frames(10).await.concat();
        assert_eq!(show(&got), show(bulk("w").repeat(10).as_bytes()));
        served += 10;
        assert!(served < 100_000, "reads never reached the primary");
    }
    proxy.stop().await;
}

/// What a reader saw during a failover.
#[derive(Default, Debug)]
struct Seen {
    reads: u64,
    errors: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_writes_go_to_the_new_primary_and_reads_to_the_new_replicas() {
    let setup = SentinelSetup::start();
    let (old_primary, old_replica) = (setup.primary.addr(), setup.replica.addr());
    let both = [old_primary.as_str(), old_replica.as_str()];
    let proxy = Proxy::start(config(&setup)).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["WAIT", "1", "0"]).await, b":1\r\n");
    reset_stats(&both).await;
    wait_reads_on(&proxy, &old_replica, "k", "v", DEADLINE).await;

    // A reader through the whole failover: one GET at a time, so at most one command is in
    // flight when something fails; every answer is the value or an upstream error.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (stop, addr) = (stop.clone(), proxy.addr);
        tokio::spawn(async move {
            let mut seen = Seen::default();
            let mut r = Raw::connect(addr).await;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                r.send(&resp(&["GET", "k"])).await;
                let got = r.collect_frames(1, Duration::from_secs(5)).await;
                match got.frames.first() {
                    Some(f) if *f == bulk("v").into_bytes() => seen.reads += 1,
                    Some(f) => seen.errors.push(show(f)),
                    None => {
                        seen.errors
                            .push(format!("no reply (closed: {})", got.closed));
                        r = Raw::connect(addr).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            seen
        })
    };

    let setup = tokio::task::spawn_blocking(move || {
        setup.failover();
        setup
    })
    .await
    .unwrap();
    let (new_primary, new_replica) = (old_replica.clone(), old_primary.clone());

    // Writes land on the new primary.
    let until = Instant::now() + DEADLINE * 2;
    let mut n = 0;
    loop {
        n += 1;
        let key = format!("after:{n}");
        let mut w = Raw::connect(proxy.addr).await;
        if w.call(&["SET", &key, "1"]).await == b"+OK\r\n"
            && Raw::connect(&new_primary).await.call(&["GET", &key]).await == b"$1\r\n1\r\n"
        {
            break;
        }
        assert!(Instant::now() < until, "writes never reached {new_primary}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The demoted primary, once resynced, is the replica reads go to.
    reset_stats(&[new_replica.as_str()]).await;
    wait_reads_on(&proxy, &new_replica, "k", "v", DEADLINE * 3).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = reader.await.unwrap();
    reset_stats(&[new_primary.as_str(), new_replica.as_str()]).await;
    let mut c = Raw::connect(proxy.addr).await;
    for _ in 0..5 {
        assert_eq!(
            show(&c.call(&["GET", "k"]).await),
            show(bulk("v").as_bytes())
        );
    }
    assert_eq!(calls(&new_replica, "get").await, 5);
    assert_eq!(calls(&new_primary, "get").await, 0);

    assert!(seen.reads > 0, "{seen:?}");
    // A failover costs in-flight commands at most: one per connection the switch closes.
    assert!(seen.errors.len() <= 2, "{seen:?}");
    for e in &seen.errors {
        assert!(
            e.contains("upstream") || e.starts_with("no reply"),
            "{seen:?}"
        );
    }
    drop(setup);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_read_from_primary_no_replica_is_read() {
    let setup = SentinelSetup::start();
    let (primary, replica) = (setup.primary.addr(), setup.replica.addr());
    let mut config = config(&setup);
    config.upstream.sentinel.as_mut().unwrap().read_from.value = "primary".into();
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    reset_stats(&[primary.as_str(), replica.as_str()]).await;
    for _ in 0..5 {
        assert_eq!(
            show(&c.call(&["GET", "k"]).await),
            show(bulk("v").as_bytes())
        );
    }
    assert_eq!(calls(&primary, "get").await, 5);
    assert_eq!(calls(&replica, "get").await, 0);
    let text = String::from_utf8_lossy(&c.call(&["INFO", "proxy"]).await).into_owned();
    assert!(!text.contains("proxy_read_from"), "{text}");
    proxy.stop().await;
}
