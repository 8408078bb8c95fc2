//! `upstream.cluster.read_from`: with `replica`, plain reads through the proxy are served by a
//! replica of the key's shard (proved with the nodes' own `INFO commandstats`), while writes,
//! reads inside MULTI and reads pipelined right after a write on their primary stay on the
//! primary; replies keep request order across the switches; a killed replica costs its
//! clients no error (reads fall back to the primary). `nearest` serves correct reads too.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::cluster::RedisCluster;
use common::{Proxy, Raw, resp, show, wait_until};
use redis_policy_proxy::Config;

/// Cluster-mode configuration for `seed` with `read_from`.
fn config(seed: &str, read_from: &str) -> Config {
    let read_from = format!("read_from: {read_from}");
    common::cluster::proxy_config(seed, &["refresh_interval_ms: 1000", &read_from])
}

/// The text of `INFO <section>` asked of `node` directly.
async fn info(node: &str, section: &str) -> String {
    let reply = Raw::connect(node).await.call(&["INFO", section]).await;
    String::from_utf8_lossy(&reply).into_owned()
}

/// How many times `node` ran `command` since its stats were last reset (`INFO commandstats`).
async fn calls(node: &str, command: &str) -> u64 {
    let text = info(node, "commandstats").await;
    let prefix = format!("cmdstat_{command}:calls=");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Zeroes `INFO commandstats` on every node.
async fn reset_stats(nodes: &[String]) {
    for n in nodes {
        assert_eq!(
            Raw::connect(n).await.call(&["CONFIG", "RESETSTAT"]).await,
            b"+OK\r\n"
        );
    }
}

/// The address of the replica of `primary` (one replica per primary in these tests).
async fn replica_of(redis: &RedisCluster, primary: &str) -> String {
    let port = primary.rsplit_once(':').unwrap().1;
    for node in redis.live_addrs() {
        let text = info(&node, "replication").await;
        if text.contains("role:slave") && text.contains(&format!("master_port:{port}\r\n")) {
            return node;
        }
    }
    panic!("no replica of {primary}");
}

/// `$len\r\nvalue\r\n`.
fn bulk(v: &str) -> String {
    format!("${}\r\n{v}\r\n", v.len())
}

#[tokio::test]
async fn reads_go_to_replicas_and_everything_else_to_primaries() {
    let mut redis = RedisCluster::start(3, 1);
    let primaries = redis.primaries();
    let mut replicas = Vec::new();
    for p in &primaries {
        replicas.push(replica_of(&redis, p).await);
    }
    let all: Vec<String> = primaries.iter().chain(&replicas).cloned().collect();
    let proxy = Proxy::start(config(&redis.live_addrs()[0], "replica")).await;
    let mut c = Raw::connect(proxy.addr).await;

    // Keys of every shard, written through the proxy and replicated (WAIT through the proxy
    // asks every primary).
    let keys: Vec<String> = primaries
        .iter()
        .enumerate()
        .map(|(i, p)| redis.key_on(p, &format!("r{i}")))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(c.call(&["SET", k, &format!("v{i}")]).await, b"+OK\r\n");
    }
    assert_eq!(c.call(&["WAIT", "1", "0"]).await, b":1\r\n");

    // The proxy connects to the replicas in the background: wait until reads land there.
    let (k0, p0, r0) = (&keys[0], &primaries[0], &replicas[0]);
    reset_stats(&all).await;
    wait_until("reads served by every replica", || {
        let (keys, replicas) = (keys.clone(), replicas.clone());
        let proxy = proxy.addr;
        async move {
            let mut c = Raw::connect(proxy).await;
            for (i, k) in keys.iter().enumerate() {
                let want = bulk(&format!("v{i}"));
                assert_eq!(show(&c.call(&["GET", k]).await), show(want.as_bytes()));
            }
            for r in &replicas {
                if calls(r, "get").await == 0 {
                    return false;
                }
            }
            true
        }
    })
    .await;

    // Reads: every GET on the replica of its shard, none on a primary.
    reset_stats(&all).await;
    for _ in 0..10 {
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(
                show(&c.call(&["GET", k]).await),
                show(bulk(&format!("v{i}")).as_bytes())
            );
        }
    }
    for (p, r) in primaries.iter().zip(&replicas) {
        assert_eq!(calls(p, "get").await, 0, "GETs on primary {p}");
        assert_eq!(calls(r, "get").await, 10, "GETs on replica {r}");
    }

    // A write goes to the primary; the replica only applies it through replication.
    reset_stats(&all).await;
    assert_eq!(c.call(&["SET", k0, "w"]).await, b"+OK\r\n");
    assert_eq!(calls(p0, "set").await, 1);

    // Inside MULTI a read runs on the primary, with the transaction.
    reset_stats(&all).await;
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["GET", k0]).await, b"+QUEUED\r\n");
    assert_eq!(
        show(&c.call(&["EXEC"]).await),
        show(format!("*1\r\n{}", bulk("w")).as_bytes())
    );
    assert_eq!(calls(p0, "get").await, 1);
    assert_eq!(calls(r0, "get").await, 0);
    assert_eq!(c.call(&["WAIT", "1", "0"]).await, b":1\r\n");

    // One pipeline mixing writes and reads over every shard: replies in request order. A
    // read right after a write of its shard stays on that primary (it reads the write);
    // the other reads go to replicas.
    reset_stats(&all).await;
    let writes: Vec<String> = primaries
        .iter()
        .enumerate()
        .map(|(i, p)| redis.key_on(p, &format!("w{i}")))
        .collect();
    let mut input = Vec::new();
    let mut expected = Vec::new();
    for round in 0..5 {
        for i in 0..3 {
            let other = (i + 1) % 3;
            input.extend(resp(&["SET", &writes[i], &format!("{round}-{i}")]));
            expected.extend_from_slice(b"+OK\r\n");
            input.extend(resp(&["GET", &writes[i]]));
            expected.extend(bulk(&format!("{round}-{i}")).into_bytes());
            input.extend(resp(&["GET", &keys[other]]));
            let v = if other == 0 {
                "w".to_string()
            } else {
                format!("v{other}")
            };
            expected.extend(bulk(&v).into_bytes());
            input.extend(resp(&["INCR", &format!("{}:n", writes[i])]));
            expected.extend(format!(":{}\r\n", round + 1).into_bytes());
            input.extend(resp(&["EXISTS", &keys[i]]));
            expected.extend_from_slice(b":1\r\n");
        }
    }
    c.send(&input).await;
    let got = c.read_frames(5 * 3 * 5).await.concat();
    assert_eq!(show(&got), show(&expected));
    let mut on_replicas = 0;
    for (p, r) in primaries.iter().zip(&replicas) {
        assert_eq!(calls(p, "set").await, 5, "SETs on {p}");
        assert_eq!(calls(r, "get").await + calls(p, "get").await, 10);
        on_replicas += calls(r, "get").await + calls(r, "exists").await;
    }
    assert!(on_replicas > 0, "no read of the pipeline reached a replica");

    // INFO says how reads are routed and counts them.
    let text = String::from_utf8_lossy(&c.call(&["INFO"]).await).into_owned();
    assert!(text.contains("proxy_read_from:replica\r\n"), "{text}");
    let counted = text
        .lines()
        .find_map(|l| l.strip_prefix("proxy_replica_reads:"))
        .map(|n| n.trim().parse::<u64>().unwrap());
    assert!(counted.is_some_and(|n| n >= 30), "{text}");

    // A replica killed under a read load: its reads go to the primary, no client error.
    let mut reader = Raw::connect(proxy.addr).await;
    for _ in 0..20 {
        assert_eq!(
            show(&reader.call(&["GET", k0]).await),
            show(bulk("w").as_bytes())
        );
    }
    reset_stats(&primaries).await;
    let index = redis.nodes().iter().position(|n| n.addr() == *r0).unwrap();
    redis.kill(index);
    let mut served = 0;
    while calls(p0, "get").await < 50 {
        // Pipelined, so some reads are in flight on the replica when it dies.
        let mut input = Vec::new();
        for _ in 0..10 {
            input.extend(resp(&["GET", k0]));
        }
        reader.send(&input).await;
        let got = reader.read_frames(10).await.concat();
        assert_eq!(show(&got), show(bulk("w").repeat(10).as_bytes()));
        served += 10;
        assert!(served < 100_000, "reads never reached the primary");
    }
    // The other shards still read from their replicas.
    reset_stats(&replicas[1..]).await;
    assert_eq!(
        show(&reader.call(&["GET", &keys[1]]).await),
        show(bulk("v1").as_bytes())
    );
    assert_eq!(calls(&replicas[1], "get").await, 1);

    // `nearest`: reads answered correctly by whichever copy is chosen.
    let nearest = Proxy::start(config(&redis.live_addrs()[0], "nearest")).await;
    let mut n = Raw::connect(nearest.addr).await;
    for _ in 0..5 {
        for (i, k) in keys.iter().enumerate().skip(1) {
            assert_eq!(
                show(&n.call(&["GET", k]).await),
                show(bulk(&format!("v{i}")).as_bytes())
            );
        }
    }
    let text = String::from_utf8_lossy(&n.call(&["INFO", "proxy"]).await).into_owned();
    assert!(text.contains("proxy_read_from:nearest\r\n"), "{text}");
}
