//! The proxy in front of a real Redis Cluster, used by clients that know nothing about
//! clusters: commands reach the node owning their keys, replies come back in request order,
//! multi-key commands are split by slot or get Redis's CROSSSLOT, whole-keyspace commands
//! (SCAN, DBSIZE, INFO, KEYS) cover every primary, a slot migrated live (also under a write
//! load) and a primary failover are followed without the client seeing errors, transactions,
//! blocking commands and pub/sub run on the right node, and the policies (default policy,
//! namespaces, the shared rate limiter) still apply.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::collections::HashSet;
use std::path::Path;

use common::cluster::{
    RedisCluster, begin_migration, end_migration, node_id, other_primary, setslot,
};
use common::{Proxy, Raw, resp, show};
use redis_policy_proxy::Config;
use redis_policy_proxy::cluster::slot;

/// Cluster-mode configuration for `seed`, refreshing the map every `refresh_ms`.
fn cluster_config(seed: &str, refresh_ms: u64) -> Config {
    common::cluster::proxy_config(seed, &[&format!("refresh_interval_ms: {refresh_ms}")])
}

/// `GET key` sent straight to `node`, bypassing the proxy.
async fn direct_get(node: &str, key: &str) -> Vec<u8> {
    Raw::connect(node).await.call(&["GET", key]).await
}

/// A node's `CONFIG GET name`, asked directly.
async fn config_get(node: &str, name: &str) -> Vec<u8> {
    Raw::connect(node)
        .await
        .call(&["CONFIG", "GET", name])
        .await
}

#[tokio::test]
async fn single_slot_commands_reach_their_owner_in_order() {
    let redis = RedisCluster::start(3, 1);
    let primaries = redis.primaries();
    assert_eq!(primaries.len(), 3);
    let proxy = Proxy::start(cluster_config(&redis.live_addrs()[0], 1000)).await;

    // Keys over the whole slot range, through the `redis` crate: every SET lands on the
    // node that owns the key (read back directly), every GET through the proxy sees it.
    let mut con = common::connect(&proxy.url()).await;
    let keys: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    let slots: HashSet<u16> = keys.iter().map(|k| slot(k.as_bytes())).collect();
    assert!(slots.len() > 250);
    for k in &keys {
        let _: () = redis::cmd("SET")
            .arg(k)
            .arg(format!("v-{k}"))
            .query_async(&mut con)
            .await
            .unwrap();
    }
    for k in keys.iter().step_by(7) {
        let v: String = redis::cmd("GET")
            .arg(k)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(v, format!("v-{k}"));
        let owner = redis.primary_for_slot(slot(k.as_bytes()));
        let direct = direct_get(&owner, k).await;
        let v = format!("v-{k}");
        assert_eq!(
            direct,
            format!("${}\r\n{v}\r\n", v.len()).into_bytes(),
            "{k} on {owner}"
        );
    }

    // One pipeline mixing keys of all three primaries: replies byte for byte in order.
    let on: Vec<String> = primaries
        .iter()
        .enumerate()
        .map(|(i, p)| redis.key_on(p, &format!("pipe{i}")))
        .collect();
    let mut input = Vec::new();
    let mut expected = Vec::new();
    for round in 0..5 {
        for (i, k) in on.iter().enumerate() {
            input.extend(resp(&["SET", k, &format!("{round}-{i}")]));
            expected.extend_from_slice(b"+OK\r\n");
            input.extend(resp(&["GET", k]));
            let v = format!("{round}-{i}");
            expected.extend(format!("${}\r\n{v}\r\n", v.len()).into_bytes());
            input.extend(resp(&["PING"]));
            expected.extend_from_slice(b"+PONG\r\n");
            input.extend(resp(&["INCR", &format!("{k}:n")]));
            expected.extend(format!(":{}\r\n", round + 1).into_bytes());
        }
    }
    let mut c = Raw::connect(proxy.addr).await;
    c.send(&input).await;
    let got = c.read_frames(5 * 3 * 4).await.concat();
    assert_eq!(show(&got), show(&expected));

    // Keys in two slots: split by slot where Redis semantics allow, the replies joined in
    // the client's key order; Redis's CROSSSLOT (nothing sent) where they do not.
    let (a, b) = (&on[0], &on[1]);
    let (x, y) = (&on[2], "missing:key");
    assert_eq!(
        show(&c.call(&["MGET", b, y, a, x, a]).await),
        show(b"*5\r\n$3\r\n4-1\r\n$-1\r\n$3\r\n4-0\r\n$3\r\n4-2\r\n$3\r\n4-0\r\n")
    );
    assert_eq!(c.call(&["EXISTS", a, b, y, a]).await, b":3\r\n");
    assert_eq!(
        c.call(&[
            "MSET", "s:1", "one", "s:2", "two", "s:3", "three", "s:4", "four"
        ])
        .await,
        b"+OK\r\n"
    );
    let spread: HashSet<String> = ["s:1", "s:2", "s:3", "s:4"]
        .iter()
        .map(|k| redis.primary_for_slot(slot(k.as_bytes())))
        .collect();
    assert!(spread.len() > 1, "test keys all on one node");
    for (k, v) in [("s:1", "one"), ("s:4", "four")] {
        let owner = redis.primary_for_slot(slot(k.as_bytes()));
        assert_eq!(
            direct_get(&owner, k).await,
            format!("${}\r\n{v}\r\n", v.len()).into_bytes()
        );
    }
    assert_eq!(c.call(&["TOUCH", "s:1", "s:2", y]).await, b":2\r\n");
    assert_eq!(
        c.call(&["DEL", "s:1", "s:2", "s:3", "s:4", y]).await,
        b":4\r\n"
    );
    assert_eq!(c.call(&["UNLINK", "s:1", "s:2"]).await, b":0\r\n");
    // Split commands keep their place in a pipeline.
    let got = c
        .request(
            &[
                resp(&["SET", "p:1", "1"]),
                resp(&["MGET", "p:1", "p:2", a]),
                resp(&["SET", "p:2", "2"]),
                resp(&["MGET", "p:2", "p:1"]),
                resp(&["DEL", "p:1", "p:2"]),
            ]
            .concat(),
            5,
        )
        .await;
    assert_eq!(
        show(&got),
        show(
            b"+OK\r\n*3\r\n$1\r\n1\r\n$-1\r\n$3\r\n4-0\r\n+OK\r\n*2\r\n$1\r\n2\r\n$1\r\n1\r\n:2\r\n"
        )
    );
    for cmd in [
        vec!["RENAME", a.as_str(), b.as_str()],
        vec!["MSETNX", a.as_str(), "1", b.as_str(), "2"],
        vec!["SUNIONSTORE", a.as_str(), b.as_str()],
    ] {
        let refused = String::from_utf8(c.call(&cmd[..]).await).unwrap();
        assert!(
            refused.starts_with("-CROSSSLOT Keys in request don't hash to the same slot (")
                && refused.contains(&format!("{} writes atomically", cmd[0])),
            "{cmd:?}: {refused}"
        );
    }
    assert_eq!(c.call(&["GET", a]).await, b"$3\r\n4-0\r\n");
    assert_eq!(
        c.call(&["MSET", "{u1}.a", "1", "{u1}.b", "2"]).await,
        b"+OK\r\n"
    );
    assert_eq!(
        c.call(&["MGET", "{u1}.a", "{u1}.b"]).await,
        b"*2\r\n$1\r\n1\r\n$1\r\n2\r\n"
    );

    // What a cluster cannot do as one Redis: answered by the proxy in Redis's words.
    assert_eq!(
        c.call(&["SELECT", "1"]).await,
        b"-ERR SELECT is not allowed in cluster mode\r\n"
    );
    assert_eq!(c.call(&["SELECT", "0"]).await, b"+OK\r\n");
    assert_eq!(
        c.call(&["CLUSTER", "KEYSLOT", a]).await,
        format!(":{}\r\n", slot(a.as_bytes())).into_bytes()
    );
    assert_eq!(
        c.call(&["CLUSTER", "SLOTS"]).await,
        b"-ERR This instance has cluster support disabled\r\n"
    );
    assert_eq!(c.call(&["SCAN", "x"]).await, b"-ERR invalid cursor\r\n");
    assert_eq!(c.call(&["ECHO", "hi"]).await, b"$2\r\nhi\r\n");

    // Whole-keyspace commands visit every primary.
    let mut total = 0;
    for p in &primaries {
        let reply = Raw::connect(p).await.call(&["DBSIZE"]).await;
        total += String::from_utf8_lossy(&reply[1..reply.len() - 2])
            .parse::<i64>()
            .unwrap();
    }
    assert!(total > 300);
    assert_eq!(
        c.call(&["DBSIZE"]).await,
        format!(":{total}\r\n").into_bytes()
    );
    let info = String::from_utf8_lossy(&c.call(&["INFO", "keyspace"]).await).into_owned();
    assert!(info.contains(&format!("db0:keys={total},")), "{info}");
    let info = String::from_utf8_lossy(&c.call(&["INFO"]).await).into_owned();
    assert!(info.contains("cluster_enabled:0\r\n"), "{info}");
    assert!(info.contains("# Proxy"), "{info}");
    // A setting changed through the proxy applies to every primary.
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "12345"])
            .await,
        b"+OK\r\n"
    );
    for p in &primaries {
        let reply = config_get(p, "slowlog-log-slower-than").await;
        assert!(reply.ends_with(b"$5\r\n12345\r\n"), "{p}: {}", show(&reply));
    }
    // A node's own parameters (its port, its name in the cluster, its files) go to the home
    // node, whose CONFIG GET the client reads: set to the home node's port, the others could
    // not listen; set to one `dir`, every node would write the same file.
    let reply = c.call(&["CONFIG", "GET", "port"]).await;
    let text = String::from_utf8_lossy(&reply).into_owned();
    let home: &str = text.split("\r\n").nth(4).unwrap();
    assert_eq!(c.call(&["CONFIG", "SET", "port", home]).await, b"+OK\r\n");
    let name = "home.example";
    assert_eq!(
        c.call(&["CONFIG", "SET", "cluster-announce-hostname", name])
            .await,
        b"+OK\r\n"
    );
    for p in &primaries {
        let reply = config_get(p, "cluster-announce-hostname").await;
        let at_home = p.ends_with(&format!(":{home}"));
        assert_eq!(
            show(&reply).contains(name),
            at_home,
            "{p}: {}",
            show(&reply)
        );
    }
    // Mixed with a shared one: the whole command on the home node first, then the shared
    // parameters on the others; refused where the home node refuses it (a protected
    // parameter here), nothing set anywhere.
    let mixed = [
        "maxmemory-samples",
        "6",
        "cluster-announce-hostname",
        "mixed.example",
    ];
    let config_set = |pairs: &[&'static str]| {
        let mut argv = vec!["CONFIG", "SET"];
        argv.extend_from_slice(pairs);
        argv
    };
    assert_eq!(c.call(&config_set(&mixed)).await, b"+OK\r\n");
    for p in &primaries {
        let at_home = p.ends_with(&format!(":{home}"));
        let samples = config_get(p, "maxmemory-samples").await;
        assert!(samples.ends_with(b"$1\r\n6\r\n"), "{p}: {}", show(&samples));
        let name = config_get(p, "cluster-announce-hostname").await;
        assert_eq!(show(&name).contains("mixed.example"), at_home, "{p}");
    }
    let refused = c
        .call(&config_set(&["maxmemory-samples", "7", "dir", "/tmp"]))
        .await;
    assert!(refused.starts_with(b"-ERR"), "{}", show(&refused));
    for p in &primaries {
        let samples = config_get(p, "maxmemory-samples").await;
        assert!(samples.ends_with(b"$1\r\n6\r\n"), "{p}: {}", show(&samples));
    }
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    let in_multi = c.call(&config_set(&mixed)).await;
    assert!(
        in_multi.starts_with(b"-ERR CONFIG SET inside MULTI of cluster-announce-hostname"),
        "{}",
        show(&in_multi)
    );
    assert_eq!(c.call(&["DISCARD"]).await, b"+OK\r\n");
    assert_eq!(
        c.call(&["CONFIG", "SET", "maxmemory-samples", "5"]).await,
        b"+OK\r\n"
    );
    let keys_reply = c.call(&["KEYS", "pipe*"]).await;
    assert!(keys_reply.starts_with(b"*6\r\n"), "{}", show(&keys_reply));
    // SCAN walks every primary with one cursor and returns every key exactly once.
    let mut everything = HashSet::new();
    for p in &primaries {
        let mut conn = common::connect(&format!("redis://{p}/")).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        everything.extend(keys);
    }
    let mut proxied = common::connect(&proxy.url()).await;
    let mut seen = Vec::new();
    let mut cursor: u64 = 0;
    let mut calls = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(50)
            .query_async(&mut proxied)
            .await
            .unwrap();
        seen.extend(batch);
        calls += 1;
        assert!(calls < 1000, "SCAN does not end");
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let unique: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "a key returned twice");
    assert_eq!(unique, everything);
    let (_, matched): (u64, Vec<String>) = {
        let mut cursor = 0u64;
        let mut all = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg("pipe*:n")
                .query_async(&mut proxied)
                .await
                .unwrap();
            all.extend(batch);
            if next == 0 {
                break (0, all);
            }
            cursor = next;
        }
    };
    assert_eq!(matched.len(), 3, "{matched:?}");
    // A script loaded through the proxy runs by its digest on every node.
    let script = "return redis.call('GET', KEYS[1])";
    let sha = c.call(&["SCRIPT", "LOAD", script]).await;
    assert!(sha.starts_with(b"$40\r\n"), "{}", show(&sha));
    let sha = String::from_utf8_lossy(&sha[5..45]).into_owned();
    for (i, k) in on.iter().enumerate() {
        assert_eq!(
            c.call(&["EVALSHA", &sha, "1", k]).await,
            format!("$3\r\n4-{i}\r\n").into_bytes()
        );
    }
    let random = c.call(&["RANDOMKEY"]).await;
    assert!(random.starts_with(b"$"), "{}", show(&random));

    // A transaction on one slot runs on its node; EXEC answers everything queued.
    let t = redis.key_on(&primaries[2], "tx");
    let tx = [
        resp(&["MULTI"]),
        resp(&["SET", &t, "1"]),
        resp(&["INCR", &t]),
        resp(&["GET", &t]),
        resp(&["EXEC"]),
    ]
    .concat();
    let got = c.request(&tx, 5).await;
    assert_eq!(
        show(&got),
        show(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n+OK\r\n:2\r\n$1\r\n2\r\n")
    );
    assert_eq!(direct_get(&primaries[2], &t).await, b"$1\r\n2\r\n");
    // A key of another node inside the transaction: CROSSSLOT, and EXEC aborts.
    let other = redis.key_on(&primaries[0], "tx");
    let tx = [
        resp(&["MULTI"]),
        resp(&["SET", &t, "5"]),
        resp(&["SET", &other, "5"]),
        resp(&["EXEC"]),
    ]
    .concat();
    let got = c.request(&tx, 4).await;
    assert_eq!(
        show(&got),
        show(
            b"+OK\r\n+QUEUED\r\n-CROSSSLOT Keys in request don't hash to the same slot\r\n-EXECABORT Transaction discarded because of previous errors.\r\n"
        )
    );
    assert_eq!(direct_get(&primaries[2], &t).await, b"$1\r\n2\r\n");
    // An empty transaction never reaches a node.
    assert_eq!(
        c.request(&[resp(&["MULTI"]), resp(&["EXEC"])].concat(), 2)
            .await,
        b"+OK\r\n*0\r\n"
    );
    assert_eq!(c.call(&["GET", a]).await, b"$3\r\n4-0\r\n");
    proxy.stop().await;
}

#[tokio::test]
async fn a_live_migration_is_followed_without_errors() {
    let redis = RedisCluster::start(3, 1);
    // No periodic refresh during the test: only MOVED can teach the proxy the new owner.
    let mut config = cluster_config(&redis.live_addrs()[0], 600_000);
    // Room for TRYAGAIN retries (10 ms more per round) while the test moves the keys.
    config
        .upstream
        .cluster
        .as_mut()
        .unwrap()
        .max_redirects
        .value = 16;
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;

    let s = slot(b"{mig}");
    let source = redis.primary_for_slot(s);
    let target = other_primary(&redis, &source);
    let (source_id, target_id) = (node_id(&redis, &source), node_id(&redis, &target));
    for i in 0..5 {
        assert_eq!(
            c.call(&["SET", &format!("{{mig}}{i}"), &format!("v{i}")])
                .await,
            b"+OK\r\n"
        );
    }

    // Mid-migration: keys still on the source are served there; a key the source does not
    // have is answered with ASK, which the proxy follows with ASKING on the target.
    let (mut to_source, mut to_target) =
        begin_migration(s, (&source, &source_id), (&target, &target_id)).await;
    assert_eq!(c.call(&["GET", "{mig}0"]).await, b"$2\r\nv0\r\n");
    assert_eq!(c.call(&["SET", "{mig}new", "n"]).await, b"+OK\r\n");
    assert_eq!(
        to_target
            .request(&[resp(&["ASKING"]), resp(&["GET", "{mig}new"])].concat(), 2)
            .await,
        b"+OK\r\n$1\r\nn\r\n"
    );

    // A multi-key command whose keys the migration has split between the nodes gets
    // TRYAGAIN from Redis; the proxy retries it until the keys have moved (then ASK).
    let mut waiting = Raw::connect(proxy.addr).await;
    waiting.send(&resp(&["MGET", "{mig}0", "{mig}new"])).await;
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;

    // The keys move, then the slot: every primary learns the new owner. The proxy's map
    // still names the source, which now answers MOVED: followed, the client sees values.
    let (host, port) = target.rsplit_once(':').unwrap();
    let mut migrate = vec!["MIGRATE", host, port, "", "0", "5000", "KEYS"];
    let keys: Vec<String> = (0..5).map(|i| format!("{{mig}}{i}")).collect();
    migrate.extend(keys.iter().map(String::as_str));
    assert_eq!(to_source.call(&migrate[..]).await, b"+OK\r\n");
    assert_eq!(
        show(&waiting.read_frame().await),
        show(b"*2\r\n$2\r\nv0\r\n$1\r\nn\r\n")
    );
    for p in redis.primaries() {
        let mut conn = Raw::connect(&p).await;
        assert_eq!(
            conn.request(&setslot(s, "NODE", &target_id), 1).await,
            b"+OK\r\n",
            "{p}"
        );
    }
    let mut input = Vec::new();
    let mut expected = Vec::new();
    for i in 0..5 {
        input.extend(resp(&["GET", &format!("{{mig}}{i}")]));
        expected.extend(format!("$2\r\nv{i}\r\n").into_bytes());
        input.extend(resp(&["PING"]));
        expected.extend_from_slice(b"+PONG\r\n");
    }
    input.extend(resp(&["GET", "{mig}new"]));
    expected.extend_from_slice(b"$1\r\nn\r\n");
    c.send(&input).await;
    assert_eq!(show(&c.read_frames(11).await.concat()), show(&expected));
    // Writes go to the new owner too, and a fresh client is routed there directly.
    assert_eq!(c.call(&["SET", "{mig}after", "a"]).await, b"+OK\r\n");
    assert_eq!(to_target.call(&["GET", "{mig}after"]).await, b"$1\r\na\r\n");
    let mut fresh = Raw::connect(proxy.addr).await;
    assert_eq!(fresh.call(&["GET", "{mig}3"]).await, b"$2\r\nv3\r\n");

    // A blocking command sent with a stale map: the old owner answers MOVED on the dedicated
    // connection; the proxy sends it again on a dedicated connection to the new owner, where
    // it blocks until a push wakes it.
    let b = slot(b"{blk}");
    let b_source = redis.primary_for_slot(b);
    let b_target = other_primary(&redis, &b_source);
    let b_target_id = node_id(&redis, &b_target);
    for p in redis.primaries() {
        let reply = Raw::connect(&p)
            .await
            .call(&["CLUSTER", "SETSLOT", &b.to_string(), "NODE", &b_target_id])
            .await;
        assert_eq!(reply, b"+OK\r\n", "{p}");
    }
    let mut blocked = Raw::connect(proxy.addr).await;
    blocked.send(&resp(&["BLPOP", "{blk}list", "5"])).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(c.call(&["RPUSH", "{blk}list", "x"]).await, b":1\r\n");
    assert_eq!(
        show(&blocked.read_frame().await),
        show(b"*2\r\n$9\r\n{blk}list\r\n$1\r\nx\r\n")
    );
    assert_eq!(
        Raw::connect(&b_target)
            .await
            .call(&["EXISTS", "{blk}list"])
            .await,
        b":0\r\n"
    );
    assert_eq!(blocked.call(&["PING"]).await, b"+PONG\r\n");
    proxy.stop().await;
}

#[tokio::test]
async fn the_default_policy_applies_in_cluster_mode() {
    let redis = RedisCluster::start(3, 0);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let text = common::default_policy_enforced();
    let upstream = "  address: 127.0.0.1:6379\n";
    assert!(text.contains(upstream));
    let seeds = redis.live_addrs().join(", ");
    let text = text.replace(
        upstream,
        &format!("  mode: cluster\n  cluster:\n    seeds: [{seeds}]\n"),
    );
    let config =
        redis_policy_proxy::setup::from_yaml(&text, &path).expect("default policy in cluster mode");
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;

    let keys = c.call(&["KEYS", "*"]).await;
    assert!(keys.starts_with(b"-"), "{}", show(&keys));
    assert!(
        String::from_utf8_lossy(&keys).contains("KEYS blocks the server"),
        "{}",
        show(&keys)
    );
    // SET without a TTL gets the default hour (`keys: created`: sent with KEEPTTL between two
    // hidden scripts), on the node owning the key; so does HSET, whose hidden replies the
    // client never sees.
    for primary in redis.primaries() {
        let key = redis.key_on(&primary, "ttl");
        assert_eq!(c.call(&["SET", &key, "v"]).await, b"+OK\r\n");
        let hash = redis.key_on(&primary, "hash");
        assert_eq!(c.call(&["HSET", &hash, "f", "v"]).await, b":1\r\n");
        let mut direct = Raw::connect(&primary).await;
        for k in [&key, &hash] {
            let pttl = direct.call(&["PTTL", k]).await;
            let ms: i64 = String::from_utf8_lossy(&pttl[1..pttl.len() - 2])
                .parse()
                .unwrap();
            assert!(ms > 3_500_000 && ms <= 3_600_000, "{k}: {ms}");
        }
    }
    // MSET split over several nodes: each key gets its TTL on its own node.
    let pairs: Vec<String> = (0..6).map(|i| format!("m:{i}")).collect();
    let mut mset = vec!["MSET".to_string()];
    for k in &pairs {
        mset.push(k.clone());
        mset.push("v".to_string());
    }
    assert_eq!(c.call(&mset[..]).await, b"+OK\r\n");
    for k in &pairs {
        let owner = redis.primary_for_slot(slot(k.as_bytes()));
        let pttl = Raw::connect(&owner).await.call(&["PTTL", k]).await;
        assert!(
            pttl.starts_with(b":3") && pttl.len() > 8,
            "{k}: {}",
            show(&pttl)
        );
    }
    // PERSIST is refused by the policy before any routing.
    let persist = c.call(&["PERSIST", "ttl:0"]).await;
    assert!(persist.starts_with(b"-"), "{}", show(&persist));
    proxy.stop().await;
}

#[tokio::test]
async fn stateful_sessions_and_shared_limits_in_cluster_mode() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let mut config = cluster_config(&redis.live_addrs()[0], 1000);
    let proxy = Proxy::start(config.clone()).await;
    let mut c = Raw::connect(proxy.addr).await;

    // To its clients the proxy is one server, whatever HELLO the nodes give.
    let hello = Raw::connect(proxy.addr).await.call(&["HELLO", "3"]).await;
    let hello = String::from_utf8_lossy(&hello).into_owned();
    assert!(
        hello.contains("$4\r\nmode\r\n$10\r\nstandalone\r\n"),
        "{hello}"
    );

    // A blocking pop waits on the node owning its key and is woken by a push from another
    // client; other clients are not blocked meanwhile.
    let list = redis.key_on(&primaries[1], "queue");
    let mut blocked = Raw::connect(proxy.addr).await;
    blocked.send(&resp(&["BLPOP", &list, "5"])).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
    assert_eq!(c.call(&["RPUSH", &list, "job"]).await, b":1\r\n");
    let popped = blocked.read_frame().await;
    assert_eq!(
        show(&popped),
        show(format!("*2\r\n${}\r\n{list}\r\n$3\r\njob\r\n", list.len()).as_bytes())
    );

    // Classic pub/sub: the cluster carries a PUBLISH to subscribers on every node.
    let mut sub = Raw::connect(proxy.addr).await;
    assert_eq!(
        sub.call(&["SUBSCRIBE", "news"]).await,
        b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n"
    );
    // Sharded pub/sub: subscribed on the channel's slot owner.
    let mut ssub = Raw::connect(proxy.addr).await;
    assert_eq!(
        ssub.call(&["SSUBSCRIBE", "{s}orders"]).await,
        b"*3\r\n$10\r\nssubscribe\r\n$9\r\n{s}orders\r\n:1\r\n"
    );
    for k in 0..3 {
        // From clients whose keyless commands land on different nodes.
        let mut publisher = Raw::connect(proxy.addr).await;
        let published = publisher.call(&["PUBLISH", "news", &format!("n{k}")]).await;
        assert!(published.starts_with(b":"), "{}", show(&published));
        assert_eq!(
            show(&sub.read_frame().await),
            show(format!("*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$2\r\nn{k}\r\n").as_bytes())
        );
    }
    assert_eq!(c.call(&["SPUBLISH", "{s}orders", "o1"]).await, b":1\r\n");
    assert_eq!(
        show(&ssub.read_frame().await),
        show(b"*3\r\n$8\r\nsmessage\r\n$9\r\n{s}orders\r\n$2\r\no1\r\n")
    );

    // WATCH pins the session to the key's node; a change by another client makes EXEC nil,
    // with or without queued commands.
    let w = redis.key_on(&primaries[2], "watched");
    let mut other = Raw::connect(proxy.addr).await;
    for queued in [true, false] {
        assert_eq!(c.call(&["WATCH", &w]).await, b"+OK\r\n");
        assert_eq!(other.call(&["SET", &w, "changed"]).await, b"+OK\r\n");
        let mut tx = vec![resp(&["MULTI"])];
        if queued {
            tx.push(resp(&["SET", &w, "mine"]));
        }
        tx.push(resp(&["EXEC"]));
        let n = tx.len();
        let got = c.request(&tx.concat(), n).await;
        assert!(got.ends_with(b"*-1\r\n"), "{}", show(&got));
    }
    assert_eq!(c.call(&["GET", &w]).await, b"$7\r\nchanged\r\n");
    assert_eq!(c.call(&["WATCH", &w]).await, b"+OK\r\n");
    let got = c
        .request(
            &[
                resp(&["MULTI"]),
                resp(&["SET", &w, "mine"]),
                resp(&["EXEC"]),
            ]
            .concat(),
            3,
        )
        .await;
    assert_eq!(show(&got), show(b"+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n"));
    proxy.stop().await;

    // The redis rate-limit backend counts on the node owning the limiter's key.
    config.rules = redis_policy_proxy::setup::from_yaml(
        "rules:\n  - id: shared-limit\n    rate_limit: {requests: 5, window_ms: 60000, per: address, backend: redis}\n",
        Path::new("limit.yaml"),
    )
    .unwrap()
    .rules;
    let proxy = Proxy::spawn(config).await;
    let limiter_key = "rpp:rl:shared-limit:127.0.0.1";
    let owner = redis.primary_for_slot(slot(limiter_key.as_bytes()));
    let mut c = Raw::connect(proxy.addr).await;
    // The first commands may race the control connections' first handshakes (a limiter
    // outage fails open): wait until the budget is counted on the key's owner.
    let mut to_owner = Raw::connect(&owner).await;
    let until = std::time::Instant::now() + common::DEADLINE;
    while to_owner.call(&["EXISTS", limiter_key]).await != b":1\r\n" {
        assert!(
            std::time::Instant::now() < until,
            "the limiter never counted"
        );
        let _ = c.call(&["PING"]).await;
    }
    let mut refused = 0;
    for _ in 0..20 {
        let reply = c.call(&["PING"]).await;
        if reply.starts_with(b"-") {
            refused += 1;
        }
    }
    // At most the 5 of the budget get through once counting started.
    assert!(refused >= 15, "only {refused} of 20 refused");
    assert_eq!(
        Raw::connect(&owner)
            .await
            .call(&["EXISTS", limiter_key])
            .await,
        b":1\r\n"
    );
    proxy.stop().await;
    // Namespaces: routing follows the prefixed key, hash tags keep working under the
    // prefix, and SCAN/KEYS over every primary show the tenant its own names only.
    const ALICE: &str = "6624974ea2baffac164422e4490376c1c31313cd97724ae8ce62fb3f0a0370f2"; // alicepw
    let access = |prefix: &str| {
        format!(
            "upstream:\n  mode: cluster\n  cluster:\n    seeds: [{}]\naccess:\n  users:\n    - {{name: alice, password_sha256: {ALICE}}}\n  identities:\n    - {{tenant: a, user: alice}}\n  namespaces:\n    a: '{prefix}'\n",
            redis.live_addrs()[0]
        )
    };
    let err = redis_policy_proxy::setup::from_yaml(&access("{a}:"), Path::new("ns.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("field `access.namespaces.a`"), "{err}");
    let config = redis_policy_proxy::setup::from_yaml(&access("a:"), Path::new("ns.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut alice = Raw::connect(proxy.addr).await;
    assert_eq!(alice.call(&["AUTH", "alice", "alicepw"]).await, b"+OK\r\n");
    let mut other = Raw::connect(proxy.addr).await;
    let names: Vec<String> = (0..20).map(|i| format!("n{i}")).collect();
    for n in &names {
        assert_eq!(alice.call(&["SET", n, n]).await, b"+OK\r\n");
        assert_eq!(other.call(&["SET", n, "not alice's"]).await, b"+OK\r\n");
        let owner = redis.primary_for_slot(slot(format!("a:{n}").as_bytes()));
        assert_eq!(
            direct_get(&owner, &format!("a:{n}")).await,
            format!("${}\r\n{n}\r\n", n.len()).into_bytes()
        );
    }
    assert_eq!(
        show(&alice.call(&["MGET", "n1", "n2", "n3"]).await),
        show(b"*3\r\n$2\r\nn1\r\n$2\r\nn2\r\n$2\r\nn3\r\n")
    );
    let tagged = [
        resp(&["MULTI"]),
        resp(&["SET", "{u}.x", "1"]),
        resp(&["INCR", "{u}.x"]),
        resp(&["EXEC"]),
    ];
    assert_eq!(
        show(&alice.request(&tagged.concat(), 4).await),
        show(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:2\r\n")
    );
    assert_eq!(
        direct_get(&redis.primary_for_slot(slot(b"u")), "a:{u}.x").await,
        b"$1\r\n2\r\n"
    );
    let mut seen = HashSet::new();
    let mut cursor = "0".to_string();
    loop {
        let reply = alice.call(&["SCAN", &cursor, "COUNT", "7"]).await;
        let frames = String::from_utf8_lossy(&reply).into_owned();
        let lines: Vec<&str> = frames.split("\r\n").collect();
        cursor = lines[2].to_string();
        for name in lines[4..].iter().skip(1).step_by(2) {
            if !name.is_empty() {
                seen.insert(name.to_string());
            }
        }
        if cursor == "0" {
            break;
        }
    }
    let mut expected: HashSet<String> = names.iter().cloned().collect();
    expected.insert("{u}.x".to_string());
    assert_eq!(seen, expected);
    let keys = alice.call(&["KEYS", "n1*"]).await;
    assert!(keys.starts_with(b"*11\r\n"), "{}", show(&keys));
    assert!(!keys.windows(2).any(|w| w == b"a:"), "{}", show(&keys));
    // XREAD of the tenant's streams in several slots: gathered, the names without the prefix.
    let (s1, s2) = (0..)
        .map(|i| format!("s{i}"))
        .try_fold(None::<String>, |first, name| match first {
            None => std::ops::ControlFlow::Continue(Some(name)),
            Some(f)
                if slot(format!("a:{f}").as_bytes()) != slot(format!("a:{name}").as_bytes()) =>
            {
                std::ops::ControlFlow::Break((f, name))
            }
            Some(f) => std::ops::ControlFlow::Continue(Some(f)),
        })
        .break_value()
        .unwrap();
    for s in [&s1, &s2] {
        assert_eq!(
            alice.call(&["XADD", s, "1-1", "f", "v"]).await,
            b"$3\r\n1-1\r\n"
        );
    }
    let entry = "*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n";
    let pair = |s: &str| format!("*2\r\n${}\r\n{s}\r\n{entry}", s.len());
    assert_eq!(
        show(&alice.call(&["XREAD", "STREAMS", &s2, &s1, "0", "0"]).await),
        show(format!("*2\r\n{}{}", pair(&s2), pair(&s1)).as_bytes())
    );
    // And with BLOCK, once it blocked on each slot: the entry that woke it, its stream
    // named as the tenant names it.
    alice
        .send(&common::resp(&[
            "XREAD", "BLOCK", "0", "STREAMS", &s1, &s2, "$", "$",
        ]))
        .await;
    let mut writer = Raw::connect(proxy.addr).await;
    assert_eq!(writer.call(&["AUTH", "alice", "alicepw"]).await, b"+OK\r\n");
    common::cluster::wait_blocked_on(&redis.primaries(), 2).await;
    assert_eq!(
        writer.call(&["XADD", &s2, "2-1", "f", "v"]).await,
        b"$3\r\n2-1\r\n"
    );
    let woke = alice
        .collect_frames(1, common::DEADLINE)
        .await
        .frames
        .concat();
    assert_eq!(
        show(&woke),
        show(
            format!(
                "*1\r\n*2\r\n${}\r\n{s2}\r\n*1\r\n*2\r\n$3\r\n2-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n",
                s2.len()
            )
            .as_bytes()
        )
    );
    proxy.stop().await;
}

#[tokio::test]
async fn the_proxy_recovers_from_a_primary_failover_without_restart() {
    let mut redis = RedisCluster::start_with(3, 1, &["--cluster-node-timeout", "1000"]);
    let mut config = cluster_config(&redis.live_addrs()[0], 500);
    // A dead node not yet retired is dialled every 100 ms, which the end of the test sees.
    config.upstream.reconnect_max_ms.value = 100;
    let proxy = Proxy::start(config).await;
    let primaries = redis.primaries();
    let keys: Vec<String> = primaries
        .iter()
        .map(|p| redis.key_on(p, "failover"))
        .collect();
    let mut c = Raw::connect(proxy.addr).await;
    for k in &keys {
        assert_eq!(c.call(&["SET", k, "before"]).await, b"+OK\r\n");
    }
    // WAIT through the proxy counts the replicas of every primary the writes went to: each
    // shard has one, so every write is on two nodes before the kill.
    assert_eq!(c.call(&["WAIT", "1", "2000"]).await, b":1\r\n");
    assert_eq!(c.call(&["WAIT", "2", "100"]).await, b":1\r\n");

    // A steady write load from other clients while the primary dies: every SET is
    // acknowledged or answered with an error (never hangs: each call is bounded), and a WAIT
    // every 50 writes marks which acknowledged writes are on a replica too.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|t| {
            let stop = stop.clone();
            let addr = proxy.addr;
            tokio::spawn(async move {
                let mut c = Raw::connect(addr).await;
                let (mut sent, mut errors, mut durable) = (0usize, 0usize, 0usize);
                let mut acked: Vec<String> = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let k = format!("load:{t}:{sent}");
                    sent += 1;
                    if c.call(&["SET", &k, "v"]).await == b"+OK\r\n" {
                        acked.push(k);
                    } else {
                        errors += 1;
                    }
                    if sent % 50 == 0 && c.call(&["WAIT", "1", "500"]).await == b":1\r\n" {
                        durable = acked.len();
                    }
                }
                (sent, errors, acked, durable)
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let victim = &primaries[0];
    let index = redis
        .nodes()
        .iter()
        .position(|n| n.addr() == *victim)
        .unwrap();
    redis.kill(index);

    // Until the replica is promoted the key's commands fail (at most); then they succeed
    // again on the same client connection, without restarting the proxy.
    let started = std::time::Instant::now();
    let mut errors = 0;
    loop {
        let reply = c.call(&["GET", &keys[0]]).await;
        if reply == b"$6\r\nbefore\r\n" {
            break;
        }
        assert!(reply.starts_with(b"-"), "{}", show(&reply));
        errors += 1;
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "no recovery after {errors} errors; last {}",
            show(&reply)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!(
        "failover: {errors} error replies, recovered {:?} after the kill",
        started.elapsed()
    );
    // The proxy may follow the promotion before the node this asks has heard of it (gossip
    // reaches the other shards a little later): wait, bounded, for the cluster to agree.
    let promoted_by = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while redis.primary_for_slot(slot(keys[0].as_bytes())) == *victim {
        assert!(
            std::time::Instant::now() < promoted_by,
            "the cluster never promoted a replica of {victim}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Every key, on every shard, through the same connection; writes too.
    for k in &keys {
        assert_eq!(c.call(&["GET", k]).await, b"$6\r\nbefore\r\n", "{k}");
        assert_eq!(c.call(&["SET", k, "after"]).await, b"+OK\r\n", "{k}");
    }
    let mut fresh = Raw::connect(proxy.addr).await;
    assert_eq!(fresh.call(&["GET", &keys[0]]).await, b"$5\r\nafter\r\n");

    // The dead node left the map: its pool stops dialling it (connect errors stop rising).
    let connect_errors = || async {
        let (_, metrics) = common::http_get(proxy.admin, "/metrics").await;
        common::sample(&metrics, "rpp_upstream_errors_total{kind=\"connect\"}")
    };
    let mut settled = connect_errors().await;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let now = connect_errors().await;
        if now == settled {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(40),
            "the dead node is still dialled: {now} connect errors"
        );
        settled = now;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        connect_errors().await,
        settled,
        "the dead node was dialled again"
    );

    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut sent, mut errors, mut acked_total, mut missing, mut missing_durable) = (0, 0, 0, 0, 0);
    let mut durable_total = 0;
    for w in writers {
        let (s, e, acked, durable) = w.await.unwrap();
        sent += s;
        errors += e;
        acked_total += acked.len();
        durable_total += durable;
        for (i, chunk) in acked.chunks(100).enumerate() {
            let mut mget = vec!["MGET"];
            mget.extend(chunk.iter().map(String::as_str));
            let reply = fresh.call(&mget[..]).await;
            let values = common::split_frames(&reply[format!("*{}\r\n", chunk.len()).len()..]).0;
            assert_eq!(values.len(), chunk.len(), "{}", show(&reply));
            for (j, v) in values.iter().enumerate() {
                if v != b"$1\r\nv\r\n" {
                    missing += 1;
                    if i * 100 + j < durable {
                        missing_durable += 1;
                    }
                }
            }
        }
    }
    eprintln!(
        "failover under load: {sent} sent, {acked_total} acknowledged, {errors} errors, \
         {durable_total} confirmed by WAIT; {missing} acknowledged writes missing, \
         {missing_durable} of them confirmed"
    );
    assert_eq!(sent, acked_total + errors);
    assert_eq!(missing_durable, 0);
    assert!(durable_total > 0);
    proxy.stop().await;
}

#[tokio::test]
async fn a_slot_resharded_under_load_loses_nothing() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(cluster_config(&redis.live_addrs()[0], 600_000)).await;
    let s = slot(b"{hot}");
    let source = redis.primary_for_slot(s);
    let target = other_primary(&redis, &source);
    let (source_id, target_id) = (node_id(&redis, &source), node_id(&redis, &target));

    // Writers on keys of the migrating slot: each SET is read back at once.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|t| {
            let stop = stop.clone();
            let addr = proxy.addr;
            tokio::spawn(async move {
                let mut c = Raw::connect(addr).await;
                let (mut acked, mut errors) = (Vec::new(), Vec::new());
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let k = format!("{{hot}}:{t}:{i}");
                    i += 1;
                    let set = c.call(&["SET", &k, "v"]).await;
                    let get = c.call(&["GET", &k]).await;
                    if set == b"+OK\r\n" && get == b"$1\r\nv\r\n" {
                        acked.push(k);
                    } else {
                        errors.push(format!("{k}: {} / {}", show(&set), show(&get)));
                    }
                }
                (acked, errors)
            })
        })
        .collect();
    // A transaction writer on a counter in the slot: a queued command or EXEC redirected
    // mid-migration makes the proxy replay the transaction on the node named, which must
    // apply it exactly once.
    let transactions = {
        let stop = stop.clone();
        let addr = proxy.addr;
        tokio::spawn(async move {
            let mut c = Raw::connect(addr).await;
            let (mut acked, mut errors) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let tx = [
                    resp(&["MULTI"]),
                    resp(&["INCR", "{hot}ctr"]),
                    resp(&["INCR", "{hot}ctr"]),
                    resp(&["EXEC"]),
                ]
                .concat();
                let replies = c.request(&tx, 4).await;
                let (first, second) = (2 * acked + 1, 2 * acked + 2);
                let expected =
                    format!("+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:{first}\r\n:{second}\r\n");
                if replies == expected.as_bytes() {
                    acked += 1;
                } else {
                    errors.push(show(&replies));
                    break;
                }
            }
            (acked, errors)
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    // The migration, as redis-cli --cluster reshard does it, while the writers run.
    let (mut to_source, _to_target) =
        begin_migration(s, (&source, &source_id), (&target, &target_id)).await;
    let (host, port) = target.rsplit_once(':').unwrap();
    let mut rounds = 0;
    loop {
        let mut conn = common::connect(&format!("redis://{source}/")).await;
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(s)
            .arg(50)
            .query_async(&mut conn)
            .await
            .unwrap();
        rounds += 1;
        if keys.is_empty() && rounds > 3 {
            break;
        }
        if !keys.is_empty() {
            let mut migrate = vec!["MIGRATE", host, port, "", "0", "5000", "KEYS"];
            migrate.extend(keys.iter().map(String::as_str));
            assert_eq!(to_source.call(&migrate[..]).await, b"+OK\r\n");
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    end_migration(&redis, s, (&source, &target), &target_id).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);

    let mut c = Raw::connect(proxy.addr).await;
    let (mut acked_total, mut all_errors) = (0, Vec::new());
    for w in writers {
        let (acked, errors) = w.await.unwrap();
        acked_total += acked.len();
        all_errors.extend(errors);
        for k in &acked {
            assert_eq!(c.call(&["GET", k]).await, b"$1\r\nv\r\n", "{k}");
        }
    }
    eprintln!(
        "reshard under load: {acked_total} writes acknowledged and read back, {} errors",
        all_errors.len()
    );
    assert!(all_errors.is_empty(), "{all_errors:?}");
    assert!(acked_total > 0);
    let (tx_acked, tx_errors) = transactions.await.unwrap();
    eprintln!("reshard under load: {tx_acked} transactions acknowledged, {tx_errors:?}");
    assert!(tx_errors.is_empty(), "{tx_errors:?}");
    assert!(tx_acked > 0);
    // Every acknowledged transaction ran once, and no other did.
    assert_eq!(
        c.call(&["GET", "{hot}ctr"]).await,
        format!(
            "${}\r\n{}\r\n",
            (2 * tx_acked).to_string().len(),
            2 * tx_acked
        )
        .into_bytes()
    );
    let on_target = Raw::connect(&target)
        .await
        .call(&["CLUSTER", "COUNTKEYSINSLOT", &s.to_string()])
        .await;
    assert_eq!(on_target, format!(":{}\r\n", acked_total + 1).into_bytes());
    proxy.stop().await;
}

/// `INFO`'s counters of the whole dataset and of every client are the nodes' sums, as one
/// Redis holding every key would report them: a client blocked on a key of any primary is
/// in `blocked_clients` (Redis's own suite waits for it before pushing), and keyspace hits
/// and misses, and the command statistics, count every node's. RANDOMKEY, asked of one node
/// first, starts from another node at each call.
#[tokio::test]
async fn info_counts_and_randomkey_cover_every_node() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(cluster_config(&redis.primaries()[0], 1000)).await;
    let mut c = Raw::connect(proxy.addr).await;
    let field = |info: &[u8], name: &str| -> i64 {
        let text = String::from_utf8_lossy(info).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .parse()
            .unwrap()
    };
    let hits = field(&c.call(&["INFO", "stats"]).await, "keyspace_misses");
    for primary in redis.primaries() {
        let key = redis.key_on(&primary, "blocked");
        let mut blocked = Raw::connect(proxy.addr).await;
        blocked.send(&resp(&["BLPOP", &key, "0"])).await;
        let mut waited = 0;
        while field(&c.call(&["INFO", "clients"]).await, "blocked_clients") != 1 {
            waited += 1;
            assert!(waited < 500, "the BLPOP on {primary} is not in INFO");
            tokio::time::sleep(common::POLL).await;
        }
        assert_eq!(c.call(&["RPUSH", &key, "x"]).await, b":1\r\n");
        let popped = blocked.read_frame().await;
        assert!(show(&popped).contains('x'), "{}", show(&popped));
        let missing = redis.key_on(&primary, "missing");
        assert_eq!(c.call(&["GET", &missing]).await, b"$-1\r\n");
    }
    let now = field(&c.call(&["INFO", "stats"]).await, "keyspace_misses");
    assert!(now >= hits + 3, "misses on every node: {hits} then {now}");
    // One BLPOP ran on each node: the command statistics count all three.
    let stats = String::from_utf8_lossy(&c.call(&["INFO", "commandstats"]).await).into_owned();
    assert!(stats.contains("cmdstat_blpop:calls=3,"), "{stats}");

    // RANDOMKEY from one client returns the keys of every node, not one node's forever.
    assert_eq!(c.call(&["FLUSHALL"]).await, b"+OK\r\n");
    let keys: Vec<String> = redis
        .primaries()
        .iter()
        .map(|p| redis.key_on(p, "random"))
        .collect();
    for key in &keys {
        assert_eq!(c.call(&["SET", key, "1"]).await, b"+OK\r\n");
    }
    let mut seen = HashSet::new();
    for _ in 0..200 {
        seen.insert(show(&c.call(&["RANDOMKEY"]).await));
        if seen.len() == keys.len() {
            break;
        }
    }
    assert_eq!(seen.len(), keys.len(), "RANDOMKEY saw {seen:?}");
}

/// `CLIENT PAUSE … WRITE` through the proxy holds the writes of every node, as one Redis holds
/// all of them, while reads go on; `CLIENT UNPAUSE` releases them and they apply. (It reached
/// one node before, so writes to the others went through during the pause.)
#[tokio::test]
async fn client_pause_holds_the_writes_of_every_node() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(cluster_config(&redis.primaries()[0], 1000)).await;
    let mut c = Raw::connect(proxy.addr).await;
    let keys: Vec<String> = redis
        .primaries()
        .iter()
        .map(|p| redis.key_on(p, "paused"))
        .collect();
    for key in &keys {
        assert_eq!(c.call(&["SET", key, "before"]).await, b"+OK\r\n");
    }
    assert_eq!(
        c.call(&["CLIENT", "PAUSE", "60000", "WRITE"]).await,
        b"+OK\r\n"
    );
    let mut writers = Vec::new();
    for key in &keys {
        let mut w = Raw::connect(proxy.addr).await;
        w.send(&resp(&["SET", key, "after"])).await;
        writers.push(w);
    }
    // Held: reads see the old values for a while (a write that got through shows at once).
    for _ in 0..20 {
        for key in &keys {
            assert_eq!(
                c.call(&["GET", key]).await,
                b"$6\r\nbefore\r\n",
                "{key} was written during the pause"
            );
        }
        tokio::time::sleep(common::POLL).await;
    }
    assert_eq!(c.call(&["CLIENT", "UNPAUSE"]).await, b"+OK\r\n");
    for (w, key) in writers.iter_mut().zip(&keys) {
        assert_eq!(w.read_frame().await, b"+OK\r\n", "{key}");
        assert_eq!(c.call(&["GET", key]).await, b"$5\r\nafter\r\n");
    }
}

/// `PUBSUB NUMPAT`, `NUMSUB` and `CHANNELS` are asked of the node that holds the proxy's
/// classic subscribers, so they count them (they went to the asking client's own node, which
/// holds none).
#[tokio::test]
async fn pubsub_introspection_counts_the_proxys_subscribers() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(cluster_config(&redis.primaries()[0], 1000)).await;
    let mut subscribers = Vec::new();
    for (i, pattern) in ["foo*", "bar*", "baz*"].iter().enumerate() {
        let mut s = Raw::connect(proxy.addr).await;
        let reply = s.call(&["PSUBSCRIBE", pattern]).await;
        assert!(show(&reply).contains(pattern), "{}", show(&reply));
        let channel = format!("chan{i}");
        let reply = s.call(&["SUBSCRIBE", &channel]).await;
        assert!(show(&reply).contains(&channel), "{}", show(&reply));
        subscribers.push(s);
    }
    // From several clients: each may have another home node.
    for _ in 0..6 {
        let mut c = Raw::connect(proxy.addr).await;
        assert_eq!(c.call(&["PUBSUB", "NUMPAT"]).await, b":3\r\n");
        assert_eq!(
            c.call(&["PUBSUB", "NUMSUB", "chan1"]).await,
            b"*2\r\n$5\r\nchan1\r\n:1\r\n"
        );
        let channels = show(&c.call(&["PUBSUB", "CHANNELS", "chan*"]).await);
        assert!(channels.starts_with("\"*3"), "{channels}");
    }
}

/// `SLOWLOG GET`, `LEN` and `RESET` cover every node's log, as one Redis's covers every
/// command (they reached one node, which logged only its own keys' commands).
#[tokio::test]
async fn slowlog_covers_every_node() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(cluster_config(&redis.primaries()[0], 1000)).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "0"])
            .await,
        b"+OK\r\n"
    );
    assert_eq!(c.call(&["SLOWLOG", "RESET"]).await, b"+OK\r\n");
    let keys: Vec<String> = redis
        .primaries()
        .iter()
        .map(|p| redis.key_on(p, "slow"))
        .collect();
    for key in &keys {
        assert_eq!(c.call(&["SET", key, "v"]).await, b"+OK\r\n");
    }
    let log = String::from_utf8_lossy(&c.call(&["SLOWLOG", "GET", "-1"]).await).into_owned();
    for key in &keys {
        assert!(log.contains(&format!("\r\n{key}\r\n")), "{key} in {log}");
    }
    let len = c.call(&["SLOWLOG", "LEN"]).await;
    let len: i64 = String::from_utf8_lossy(&len[1..len.len() - 2])
        .parse()
        .unwrap();
    assert!(len >= 3, "SLOWLOG LEN {len}");
    let newest = c.call(&["SLOWLOG", "GET", "1"]).await;
    assert!(newest.starts_with(b"*1\r\n"), "{}", show(&newest));
    // `slowlog-max-len` set through the proxy: each node keeps that many, the merged log
    // as many as one server would keep (which ones, within a second, is each node's
    // order: entries carry seconds and per-node ids).
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-max-len", "3"]).await,
        b"+OK\r\n"
    );
    assert_eq!(c.call(&["SLOWLOG", "RESET"]).await, b"+OK\r\n");
    for round in ["a", "b"] {
        for key in &keys {
            assert_eq!(c.call(&["SET", key, round]).await, b"+OK\r\n");
        }
    }
    assert_eq!(c.call(&["SLOWLOG", "LEN"]).await, b":3\r\n");
    let all = String::from_utf8_lossy(&c.call(&["SLOWLOG", "GET", "-1"]).await).into_owned();
    assert!(all.starts_with("*3\r\n"), "{all}");
    let two = c.call(&["SLOWLOG", "GET", "2"]).await;
    assert!(two.starts_with(b"*2\r\n"), "{}", show(&two));
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-max-len", "128"]).await,
        b"+OK\r\n"
    );
    assert_eq!(
        c.call(&["CONFIG", "SET", "slowlog-log-slower-than", "10000"])
            .await,
        b"+OK\r\n"
    );
    assert_eq!(c.call(&["SLOWLOG", "RESET"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SLOWLOG", "LEN"]).await, b":0\r\n");
}

/// MONITOR shows the commands of every primary, as one Redis's shows every command (it
/// reached the home node only, which showed only its own keys' commands); none of another
/// node's lines comes before the client's `+OK`; RESET stops it on every node, and the
/// client's own connections to the other nodes go.
#[tokio::test]
async fn monitor_shows_every_primary() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(cluster_config(&primaries[0], 1000)).await;
    let keys: Vec<String> = primaries
        .iter()
        .map(|p| redis.key_on(p, "watched"))
        .collect();
    let monitors = |node: &str| {
        let node = node.to_string();
        async move {
            let list = Raw::connect(&node).await.call(&["CLIENT", "LIST"]).await;
            String::from_utf8_lossy(&list)
                .lines()
                .filter(|l| l.contains("cmd=monitor"))
                .count()
        }
    };
    for proto in [2, 3] {
        let mut m = Raw::connect(proxy.addr).await;
        if proto == 3 {
            assert!(m.call(&["HELLO", "3"]).await.starts_with(b"%"));
        }
        // Another client's commands right before MONITOR: none may show.
        let mut c = Raw::connect(proxy.addr).await;
        for key in &keys {
            assert_eq!(c.call(&["SET", key, "before"]).await, b"+OK\r\n");
        }
        assert_eq!(m.call(&["MONITOR"]).await, b"+OK\r\n");
        for p in &primaries {
            assert_eq!(monitors(p).await, 1, "{p} monitored (RESP{proto})");
        }
        for key in &keys {
            assert_eq!(c.call(&["SET", key, "v"]).await, b"+OK\r\n");
        }
        let mut seen = String::new();
        let deadline = std::time::Instant::now() + common::DEADLINE;
        while !keys
            .iter()
            .all(|k| seen.contains(&format!("\"SET\" \"{k}\" \"v\"")))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "RESP{proto}: every primary's SET in {seen}"
            );
            let got = m.collect_frames(1, common::DEADLINE).await;
            let line = String::from_utf8_lossy(&got.frames.concat()).into_owned();
            assert!(line.starts_with('+'), "a MONITOR line: {line}");
            assert!(!line.contains("\"before\""), "before MONITOR: {line}");
            seen.push_str(&line);
        }
        // A transaction shows as the client spelled it, although the proxy sends its MULTI
        // only with the first keyed command (Redis's own `unit/introspection` checks it).
        assert_eq!(c.call(&["multi"]).await, b"+OK\r\n");
        assert_eq!(c.call(&["set", &keys[1], "in-multi"]).await, b"+QUEUED\r\n");
        assert_eq!(c.call(&["exec"]).await, b"*1\r\n+OK\r\n");
        assert_eq!(
            transaction_lines(&mut m, proto).await,
            [
                "\"multi\"".to_string(),
                format!("\"set\" \"{}\" \"in-multi\"", keys[1]),
                "\"exec\"".to_string()
            ],
            "RESP{proto}"
        );
        // A transaction that reached no node (keyless commands are held until a key names
        // the node) still runs on one, as one Redis shows it: an empty one, and one spoiled
        // by a command Redis does not know, whose held PING never runs (`unit/introspection`,
        // "MONITOR correctly handles multi-exec cases").
        assert_eq!(c.call(&["multi"]).await, b"+OK\r\n");
        assert_eq!(c.call(&["exec"]).await, b"*0\r\n");
        assert_eq!(
            transaction_lines(&mut m, proto).await,
            ["\"multi\"", "\"exec\""],
            "RESP{proto}: an empty transaction"
        );
        assert_eq!(c.call(&["multi"]).await, b"+OK\r\n");
        assert_eq!(c.call(&["ping"]).await, b"+QUEUED\r\n");
        assert!(
            c.call(&["syntax", "error"])
                .await
                .starts_with(b"-ERR unknown command")
        );
        assert_eq!(
            c.call(&["exec"]).await,
            b"-EXECABORT Transaction discarded because of previous errors.\r\n"
        );
        assert_eq!(
            transaction_lines(&mut m, proto).await,
            ["\"multi\"", "\"exec\""],
            "RESP{proto}: a spoiled transaction"
        );
        // Lines may still come before RESET's reply (the proxy's warm connections show their
        // handshakes), none after.
        m.send(&resp(&["RESET"])).await;
        loop {
            let got = m.collect_frames(1, common::DEADLINE).await;
            assert_eq!(got.frames.len(), 1, "RESP{proto}: RESET answered");
            if got.frames[0] == b"+RESET\r\n" {
                break;
            }
            assert!(got.frames[0].starts_with(b"+1"), "{}", show(&got.frames[0]));
        }
        for p in &primaries {
            let deadline = std::time::Instant::now() + common::DEADLINE;
            while monitors(p).await != 0 {
                assert!(std::time::Instant::now() < deadline, "{p} still monitored");
                tokio::task::yield_now().await;
            }
        }
        for key in &keys {
            assert_eq!(c.call(&["SET", key, "after"]).await, b"+OK\r\n");
        }
        assert_eq!(m.call(&["PING"]).await, b"+PONG\r\n");
    }
}

/// The MONITOR lines of the connection that ran the next EXEC, up to it (lines of other
/// connections come between: a warm connection the proxy opens meanwhile shows its
/// handshake), from the last `multi` on.
async fn transaction_lines(m: &mut Raw, proto: u8) -> Vec<String> {
    let mut lines = Vec::new();
    // The proxy's health checks keep lines coming: a missing `exec` shows as a deadline.
    let deadline = std::time::Instant::now() + common::DEADLINE;
    while !lines
        .last()
        .is_some_and(|l: &String| l.contains("\"exec\""))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "RESP{proto}: no exec in {lines:?}"
        );
        let got = m.collect_frames(1, common::DEADLINE).await;
        assert_eq!(
            got.frames.len(),
            1,
            "RESP{proto}: the transaction in {lines:?}"
        );
        lines.push(String::from_utf8_lossy(&got.frames[0]).into_owned());
    }
    let conn = |l: &str| {
        l.split_once(" [")
            .and_then(|(_, r)| r.split_once("] "))
            .map(|(c, cmd)| (c.to_string(), cmd.trim_end().to_string()))
    };
    let (exec_conn, _) = conn(lines.last().unwrap()).unwrap();
    let mine: Vec<String> = lines
        .iter()
        .filter_map(|l| conn(l))
        .filter(|(c, _)| *c == exec_conn)
        .map(|(_, cmd)| cmd)
        .collect();
    let from = mine.iter().rposition(|l| l == "\"multi\"").unwrap_or(0);
    mine[from..].to_vec()
}
