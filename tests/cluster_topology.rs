//! The cluster foundation against a real Redis Cluster (3 primaries, 3 replicas): slots agree
//! with `CLUSTER KEYSLOT`, the discovered slot map names the node that serves each key, other
//! nodes redirect with MOVED (and ASK during a migration) as the parser says, and discovery
//! survives dead seeds.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::cluster::RedisCluster;
use common::{Raw, Rng, free_port, resp, show};
use redis_policy_proxy::cluster::{self, Redirect, SLOTS, SlotMap, slot};
use redis_policy_proxy::upstream::handshake::NodeSpec;

/// Login settings for discovery: no password, no TLS, a short connect bound so dead seeds
/// cost little.
fn login() -> NodeSpec {
    NodeSpec {
        addr: "unused".into(),
        username: None,
        password: None,
        connect_timeout: Duration::from_secs(2),
        tls: None,
        readonly: false,
        db: 0,
    }
}

/// Keys of every shape that matters for hashing: plain, hash-tagged, empty or odd tags,
/// binary bytes.
fn keys(n: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng(0x5eed_c105_7e12_0001);
    (0..n)
        .map(|i| match i % 5 {
            0 => format!("key:{}", rng.next()).into_bytes(),
            1 => format!("{{user{}}}.following", rng.below(50)).into_bytes(),
            2 => format!("foo{{}}{{{}}}", rng.below(1000)).into_bytes(),
            3 => format!("a{{{{b{}}}}}c", rng.below(1000)).into_bytes(),
            _ => (0..1 + rng.below(24))
                .map(|_| [b'{', b'}', b'x', 0, 0xff][rng.below(5)].wrapping_add(rng.below(2) as u8))
                .collect(),
        })
        .collect()
}

/// Sends `requests` on one connection as a pipeline and returns one reply frame each.
async fn pipelined(addr: &str, requests: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut c = Raw::connect(addr).await;
    c.send(&requests.concat()).await;
    c.read_frames(requests.len()).await
}

fn owners(map: &SlotMap) -> Vec<Option<String>> {
    (0..SLOTS as u16)
        .map(|s| {
            map.slot_owner(s)
                .map(|shard| shard.primary.addr.to_string())
        })
        .collect()
}

#[tokio::test]
async fn slot_map_routes_like_the_cluster() {
    let mut redis = RedisCluster::start(3, 1);
    let nodes = redis.live_addrs();
    let primaries: HashSet<String> = redis.primaries().into_iter().collect();
    assert_eq!(primaries.len(), 3);

    // Discovery from one seed sees the whole cluster: three shards of a primary and one
    // replica, every node exactly once.
    let map = cluster::discover(&nodes[..1], &login()).await.unwrap();
    assert!(map.is_complete(), "{map:?}");
    assert_eq!(map.shards().len(), 3, "{map:?}");
    let mut seen = HashSet::new();
    for shard in map.shards() {
        assert!(primaries.contains(&*shard.primary.addr), "{map:?}");
        assert_eq!(shard.replicas.len(), 1, "{map:?}");
        assert!(shard.primary.id.as_ref().is_some_and(|id| id.len() == 40));
        // Replica health is Redis's gossip, not this parser's doing (the unit tests cover
        // reading it); a primary that serves slots is online.
        assert!(shard.primary.online, "{map:?}");
        for node in std::iter::once(&shard.primary).chain(&shard.replicas) {
            assert!(seen.insert(node.addr.to_string()), "{map:?}");
        }
    }
    assert_eq!(seen, nodes.iter().cloned().collect::<HashSet<_>>());
    for slot in [0, 5000, 16383] {
        assert_eq!(
            &*map.slot_owner(slot).unwrap().primary.addr,
            redis.primary_for_slot(slot)
        );
    }

    // Our slot function agrees with the server's for every key.
    let keys = keys(200);
    let keyslot: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| resp(&[&b"CLUSTER"[..], b"KEYSLOT", k]))
        .collect();
    let server_slots = pipelined(&nodes[0], &keyslot).await;
    for (key, reply) in keys.iter().zip(&server_slots) {
        assert_eq!(
            *reply,
            format!(":{}\r\n", slot(key)).into_bytes(),
            "key {}",
            show(key)
        );
    }

    // The owner in the map serves each key; every other primary redirects to it with a MOVED
    // that parses to the key's slot and the owner's address.
    let gets: Vec<Vec<u8>> = keys.iter().map(|k| resp(&[&b"GET"[..], k])).collect();
    let mut replies = HashMap::new();
    for primary in &primaries {
        replies.insert(primary.clone(), pipelined(primary, &gets).await);
    }
    for (i, key) in keys.iter().enumerate() {
        let s = slot(key);
        let owner = map.slot_owner(s).unwrap().primary.addr.to_string();
        for (primary, replies) in &replies {
            let reply = &replies[i];
            let redirect = Redirect::parse(reply, primary).unwrap();
            if *primary == owner {
                assert_eq!(*reply, b"$-1\r\n", "key {} on its owner", show(key));
            } else {
                assert_eq!(
                    redirect,
                    Some(Redirect::Moved {
                        slot: s,
                        addr: owner.as_str().into()
                    }),
                    "key {} on {primary}: {}",
                    show(key),
                    show(reply)
                );
            }
        }
    }

    // A slot being migrated: the source answers ASK for a key it no longer has, and the target
    // serves it after ASKING.
    let key = b"{migrating}k";
    let s = slot(key);
    let source = map.slot_owner(s).unwrap().primary.addr.to_string();
    let target = map
        .shards()
        .iter()
        .map(|shard| shard.primary.addr.to_string())
        .find(|a| *a != source)
        .unwrap();
    let id = |addr: &str| {
        let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
        match redis.query(port, &["CLUSTER", "MYID"]).unwrap() {
            redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
            other => panic!("CLUSTER MYID: {other:?}"),
        }
    };
    let (source_id, target_id) = (id(&source), id(&target));
    let mut to_target = Raw::connect(&target).await;
    let mut to_source = Raw::connect(&source).await;
    let setslot = |state: &'static str, node: String| {
        resp(&["CLUSTER", "SETSLOT", &s.to_string(), state, &node])
    };
    assert_eq!(
        to_target.request(&setslot("IMPORTING", source_id), 1).await,
        b"+OK\r\n"
    );
    assert_eq!(
        to_source.request(&setslot("MIGRATING", target_id), 1).await,
        b"+OK\r\n"
    );
    let reply = to_source.call(&[&b"GET"[..], key]).await;
    assert_eq!(
        Redirect::parse(&reply, &source).unwrap(),
        Some(Redirect::Ask {
            slot: s,
            addr: target.as_str().into()
        }),
        "{}",
        show(&reply)
    );
    let asked = to_target
        .request(&[resp(&["ASKING"]), resp(&[&b"GET"[..], key])].concat(), 2)
        .await;
    assert_eq!(asked, b"+OK\r\n$-1\r\n");
    for c in [&mut to_target, &mut to_source] {
        let stable = resp(&["CLUSTER", "SETSLOT", &s.to_string(), "STABLE"]);
        assert_eq!(c.request(&stable, 1).await, b"+OK\r\n");
    }

    // Dead seeds first: nothing listening, then a killed node; the live seed still answers
    // with the same slot ownership.
    let replica = map.shards()[0].replicas[0].addr.to_string();
    let index = redis
        .nodes()
        .iter()
        .position(|n| n.addr() == replica)
        .unwrap();
    redis.kill(index);
    let dead = format!("127.0.0.1:{}", free_port());
    let live = redis
        .live_addrs()
        .into_iter()
        .find(|a| *a != nodes[0])
        .unwrap();
    let again = cluster::discover(&[dead.clone(), replica.clone(), live], &login())
        .await
        .unwrap();
    assert_eq!(owners(&again), owners(&map));

    // No live seed at all: an error that names every seed.
    let err = cluster::discover(&[dead.clone(), replica.clone()], &login())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&dead) && err.contains(&replica), "{err}");
}

#[tokio::test]
async fn unknown_endpoint_resolves_to_the_seed_host() {
    let redis = RedisCluster::start(3, 0);
    let seed = &redis.nodes()[0];
    redis
        .query(
            seed.port,
            &[
                "CONFIG",
                "SET",
                "cluster-preferred-endpoint-type",
                "unknown-endpoint",
            ],
        )
        .unwrap();
    // Reached by name, the node does not say its own address: every node is reached at the
    // seed's host.
    let by_name = format!("localhost:{}", seed.port);
    let map = cluster::discover(std::slice::from_ref(&by_name), &login())
        .await
        .unwrap();
    assert!(map.is_complete());
    for shard in map.shards() {
        assert!(shard.primary.addr.starts_with("localhost:"), "{map:?}");
    }
    // And its MOVED errors leave the host out: `-MOVED <slot> :<port>`.
    let mut c = Raw::connect(&by_name).await;
    let key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| *map.slot_owner(slot(k.as_bytes())).unwrap().primary.addr != *by_name)
        .unwrap();
    let reply = c.call(&["GET", &key]).await;
    assert!(reply.starts_with(b"-MOVED ") && reply.windows(2).any(|w| w == b" :"));
    let Some(Redirect::Moved { addr, .. }) = Redirect::parse(&reply, &by_name).unwrap() else {
        panic!("not a MOVED: {}", show(&reply));
    };
    assert_eq!(
        addr,
        map.slot_owner(slot(key.as_bytes())).unwrap().primary.addr
    );
}

/// `/readyz` in cluster mode reports slot coverage: ready while every slot has an owner with a
/// connection up, 503 naming the gap once a slot is unassigned (on every node), ready again
/// when it is assigned back, without a restart.
#[tokio::test]
async fn readyz_follows_slot_coverage() {
    let redis = RedisCluster::start(3, 0);
    let config =
        common::cluster::proxy_config(&redis.live_addrs()[0], &["refresh_interval_ms: 200"]);
    let proxy = common::Proxy::start(config).await;
    // Ready once every primary's shared connection is up (the proxy's own readiness PING
    // reached one node only).
    let body = poll_readyz(&proxy, 200).await;
    assert!(body.contains("all 16384 slots covered"), "{body}");

    let owner = redis.primary_for_slot(0);
    let port = |addr: &str| addr.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    for addr in redis.live_addrs() {
        // Unassigned everywhere, so no node's gossip still names an owner.
        let _ = redis.query(port(&addr), &["CLUSTER", "DELSLOTS", "0"]);
    }
    let body = poll_readyz(&proxy, 503).await;
    assert!(
        body.contains("16383 of 16384 slots have an owner"),
        "{body}"
    );

    redis
        .query(port(&owner), &["CLUSTER", "ADDSLOTS", "0"])
        .expect("slot 0 assigned back");
    let body = poll_readyz(&proxy, 200).await;
    assert!(body.contains("all 16384 slots covered"), "{body}");
}

/// Polls `/readyz` until it answers `status` (bounded), returning the body.
async fn poll_readyz(proxy: &common::Proxy, status: u16) -> String {
    let until = std::time::Instant::now() + common::DEADLINE;
    loop {
        let (got, body) = common::http_get(proxy.admin, "/readyz").await;
        if got == status {
            return body;
        }
        assert!(
            std::time::Instant::now() < until,
            "/readyz still {got} ({body}), waiting for {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Redirections the proxy follows are counted in `rpp_upstream_redirections_total`: an ASK
/// while a slot is being imported, a MOVED once it has moved behind the proxy's back (its map
/// is not refreshed on a timer here). The client sees plain replies either way.
#[tokio::test]
async fn redirections_are_followed_and_counted() {
    let redis = RedisCluster::start(3, 0);
    let config =
        common::cluster::proxy_config(&redis.live_addrs()[0], &["refresh_interval_ms: 600000"]);
    let proxy = common::Proxy::start(config).await;
    let port = |addr: &str| addr.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let key = "redirected-key";
    let s = slot(key.as_bytes());
    let from = redis.primary_for_slot(s);
    let to = common::cluster::other_primary(&redis, &from);
    let (from_id, to_id) = (
        common::cluster::node_id(&redis, &from),
        common::cluster::node_id(&redis, &to),
    );
    let s = s.to_string();
    let counted = |metrics: &str, kind: &str| {
        common::sample(
            metrics,
            &format!("rpp_upstream_redirections_total{{kind=\"{kind}\"}}"),
        )
    };
    let mut client = Raw::connect(&proxy.addr.to_string()).await;

    // Importing: the owner answers ASK for a key it does not hold.
    redis
        .query(
            port(&to),
            &["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id],
        )
        .expect("importing");
    redis
        .query(
            port(&from),
            &["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id],
        )
        .expect("migrating");
    assert_eq!(client.call(&["GET", key]).await, b"$-1\r\n");
    let (_, metrics) = common::http_get(proxy.admin, "/metrics").await;
    assert!(counted(&metrics, "ask") >= 1.0, "{metrics}");
    // Refreshes run on MOVED here (no timer): whether the nodes' map then differs from the
    // proxy's patched one depends on timing, so both outcomes count.
    let refreshes = |metrics: &str| {
        ["changed", "unchanged"]
            .iter()
            .map(|o| {
                common::sample(
                    metrics,
                    &format!("rpp_cluster_map_refreshes_total{{outcome=\"{o}\"}}"),
                )
            })
            .sum::<f64>()
    };
    let before = refreshes(&metrics);

    // Moved (the slot is empty, so every node can be told at once): MOVED, then the new owner.
    for addr in redis.live_addrs() {
        redis
            .query(port(&addr), &["CLUSTER", "SETSLOT", &s, "NODE", &to_id])
            .expect("setslot node");
    }
    assert_eq!(client.call(&["SET", key, "v"]).await, b"+OK\r\n");
    assert_eq!(client.call(&["GET", key]).await, b"$1\r\nv\r\n");
    let direct = Raw::connect(&to).await.call(&["GET", key]).await;
    assert_eq!(direct, b"$1\r\nv\r\n", "the write reached the new owner");
    let (_, metrics) = common::http_get(proxy.admin, "/metrics").await;
    assert!(counted(&metrics, "moved") >= 1.0, "{metrics}");

    // The MOVED asked for a refresh, which asks the nodes for the map.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, metrics) = common::http_get(proxy.admin, "/metrics").await;
        if refreshes(&metrics) > before {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
