//! A client logged in upstream as its own Redis ACL user (its `AUTH user pass` or `HELLO 3
//! AUTH user pass`, forwarded to Redis) in front of a real Redis Cluster: it reaches the keys
//! of every primary as that user, and no connection the proxy opens for it elsewhere (shard
//! channels, keyspace notifications) runs with more rights than the user has.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::cluster::{RedisCluster, proxy_config};
use common::{Proxy, Raw, resp, show};

/// Creates the ACL user `rules[0]` on every primary of `redis`, with `rules` after `SETUSER`.
async fn create_user(redis: &RedisCluster, rules: &[&str]) {
    for p in &redis.primaries() {
        let command: Vec<&str> = ["ACL", "SETUSER"].iter().chain(rules).copied().collect();
        let reply = Raw::connect(p).await.call(&command).await;
        assert_eq!(reply, b"+OK\r\n", "{p}");
    }
}

/// The rules of `app` (password `pw`): every command, keys under `app:` only, channels
/// under `news` only.
const APP_RULES: [&str; 7] = [
    "on",
    ">pw",
    "resetkeys",
    "~app:*",
    "resetchannels",
    "&news*",
    "+@all",
];

/// Creates `app` on every primary (`APP_RULES`).
async fn create_app_user(redis: &RedisCluster) {
    create_user(redis, &[&["app"][..], &APP_RULES].concat()).await;
}

/// The ACL user Redis runs `client`'s commands as.
async fn whoami(client: &mut Raw) -> String {
    show(&client.call(&["ACL", "WHOAMI"]).await)
}

/// A 3-primary cluster with the `app` user on every primary, and the proxy in front of it.
async fn app_cluster() -> (RedisCluster, Proxy) {
    let redis = RedisCluster::start(3, 0);
    create_app_user(&redis).await;
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    (redis, proxy)
}

/// A 3-primary cluster with a replica each and the `app` user on every node (ACL users are
/// per node, replicas included: a failover promotes one), and the proxy in front of it with
/// one more cluster `setting`.
async fn app_cluster_with_replicas(setting: &str) -> (RedisCluster, Proxy) {
    let redis = RedisCluster::start(3, 1);
    for node in &redis.live_addrs() {
        let command: Vec<&str> = ["ACL", "SETUSER", "app"]
            .iter()
            .chain(&APP_RULES)
            .copied()
            .collect();
        assert_eq!(Raw::connect(node).await.call(&command).await, b"+OK\r\n");
    }
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[setting])).await;
    (redis, proxy)
}

/// A client of `proxy` logged in as `app`.
async fn app_client(proxy: &Proxy) -> Raw {
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["AUTH", "app", "pw"]).await, b"+OK\r\n");
    c
}

/// `command` then a key of stem `stem` on each primary, through `c`: NOPERM on every one.
async fn refused_on_every_primary(redis: &RedisCluster, c: &mut Raw, command: &str, stem: &str) {
    for p in &redis.primaries() {
        let key = redis.key_on(p, stem);
        let refused = c.call(&[command, &key]).await;
        assert!(refused.starts_with(b"-NOPERM"), "{p}: {}", show(&refused));
    }
}

/// A client logged in as its own user subscribes to shard channels as that user: the
/// proxy's per-node shard connections are logged in as the pool's user, so a channel Redis
/// refuses the client's user must not be subscribed over them.
#[tokio::test]
async fn a_shard_channel_refused_to_the_clients_own_user_stays_refused() {
    let (_redis, proxy) = app_cluster().await;
    let mut sub = app_client(&proxy).await;
    for channel in ["secret", "other{x}", "x"] {
        let refused = sub.call(&["SSUBSCRIBE", channel]).await;
        assert!(
            refused.starts_with(b"-NOPERM"),
            "{channel}: {}",
            show(&refused)
        );
    }
    assert_eq!(sub.call(&["PING"]).await, b"+PONG\r\n");
    proxy.stop().await;
}

/// `AUTH` as the client's own user reaches every primary: keys of every node are read and
/// written as that user (its key pattern holds on each), a transaction and a blocking
/// command on any node run as it, `ACL WHOAMI` names it, and RESET logs it out everywhere.
#[tokio::test]
async fn the_clients_own_login_reaches_every_primary() {
    let (redis, proxy) = app_cluster().await;
    let mut c = app_client(&proxy).await;
    assert_eq!(whoami(&mut c).await, show(b"$3\r\napp\r\n"));
    let primaries = redis.primaries();
    let mut keys = Vec::new();
    for p in &primaries {
        let key = redis.key_on(p, "app:k");
        assert_eq!(c.call(&["SET", &key, "v"]).await, b"+OK\r\n", "{p}");
        assert_eq!(c.call(&["GET", &key]).await, b"$1\r\nv\r\n", "{p}");
        // The user's key pattern holds on every node.
        let other = redis.key_on(p, "other:k");
        let refused = c.call(&["SET", &other, "v"]).await;
        assert!(refused.starts_with(b"-NOPERM"), "{p}: {}", show(&refused));
        keys.push(key);
    }
    let mget = c.call(&["MGET", &keys[0], &keys[1], &keys[2]]).await;
    assert_eq!(
        show(&mget),
        show(b"*3\r\n$1\r\nv\r\n$1\r\nv\r\n$1\r\nv\r\n")
    );
    // A transaction on the last node, then a blocking command on another: both as `app`.
    let last = &keys[2];
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(
        c.call(&["INCR", &format!("{last}:n")]).await,
        b"+QUEUED\r\n"
    );
    assert_eq!(c.call(&["ACL", "WHOAMI"]).await, b"+QUEUED\r\n");
    assert_eq!(
        show(&c.call(&["EXEC"]).await),
        show(b"*2\r\n:1\r\n$3\r\napp\r\n")
    );
    let list = redis.key_on(&primaries[0], "app:list");
    assert_eq!(c.call(&["RPUSH", &list, "a"]).await, b":1\r\n");
    assert_eq!(
        show(&c.call(&["BLPOP", &list, "1"]).await),
        show(format!("*2\r\n${}\r\n{list}\r\n$1\r\na\r\n", list.len()).as_bytes())
    );
    let forbidden = redis.key_on(&primaries[1], "other:list");
    let refused = c.call(&["BLPOP", &forbidden, "1"]).await;
    assert!(refused.starts_with(b"-NOPERM"), "{}", show(&refused));
    // WAIT runs on the client's own connections, which carried its writes.
    assert_eq!(c.call(&["WAIT", "0", "100"]).await, b":0\r\n");
    // RESET: the default user again, on every node.
    assert_eq!(c.call(&["RESET"]).await, b"+RESET\r\n");
    assert_eq!(whoami(&mut c).await, show(b"$7\r\ndefault\r\n"));
    for p in &primaries {
        let other = redis.key_on(p, "other:k");
        assert_eq!(c.call(&["SET", &other, "v"]).await, b"+OK\r\n", "{p}");
    }
    proxy.stop().await;
}

/// A wrong password is Redis's WRONGPASS, and the client stays logged in as it was: after a
/// good login, a bad one leaves it the user on every node.
#[tokio::test]
async fn a_refused_login_changes_nothing() {
    let (redis, proxy) = app_cluster().await;
    let mut c = Raw::connect(proxy.addr).await;
    let refused = c.call(&["AUTH", "app", "wrong"]).await;
    assert!(refused.starts_with(b"-WRONGPASS"), "{}", show(&refused));
    assert_eq!(whoami(&mut c).await, show(b"$7\r\ndefault\r\n"));
    assert_eq!(c.call(&["AUTH", "app", "pw"]).await, b"+OK\r\n");
    let refused = c.call(&["AUTH", "app", "wrong"]).await;
    assert!(refused.starts_with(b"-WRONGPASS"), "{}", show(&refused));
    refused_on_every_primary(&redis, &mut c, "GET", "other:k").await;
    proxy.stop().await;
}

/// `HELLO 3 AUTH user pass` (how RESP3 clients log in) reaches every primary too, and the
/// client speaks RESP3 on each.
#[tokio::test]
async fn hello_with_auth_reaches_every_primary() {
    let (redis, proxy) = app_cluster().await;
    let mut c = Raw::connect(proxy.addr).await;
    let hello = c
        .call(&["HELLO", "3", "AUTH", "app", "pw", "SETNAME", "worker"])
        .await;
    assert!(hello.starts_with(b"%"), "{}", show(&hello));
    assert_eq!(c.call(&["CLIENT", "GETNAME"]).await, b"$6\r\nworker\r\n");
    for p in &redis.primaries() {
        let key = redis.key_on(p, "app:h");
        assert_eq!(c.call(&["HSET", &key, "f", "1"]).await, b":1\r\n", "{p}");
        // RESP3's map, from every node.
        assert_eq!(
            show(&c.call(&["HGETALL", &key]).await),
            show(b"%1\r\n$1\r\nf\r\n$1\r\n1\r\n"),
            "{p}"
        );
    }
    refused_on_every_primary(&redis, &mut c, "HGETALL", "other:h").await;
    proxy.stop().await;
}

/// A shard channel the client's own user may use is subscribed on its own connection to the
/// channel's node, and its messages arrive; a script runs as the user too.
#[tokio::test]
async fn a_permitted_shard_channel_and_a_script_run_as_the_clients_user() {
    let (redis, proxy) = app_cluster().await;
    let mut c = app_client(&proxy).await;
    let other = redis.key_on(&redis.primaries()[1], "other:s");
    let refused = c
        .call(&["EVAL", "return redis.call('GET', KEYS[1])", "1", &other])
        .await;
    assert!(
        refused.starts_with(b"-NOPERM") || refused.starts_with(b"-ERR"),
        "{}",
        show(&refused)
    );
    assert!(show(&refused).contains("permission"), "{}", show(&refused));
    let mut sub = app_client(&proxy).await;
    assert_eq!(
        show(&sub.call(&["SSUBSCRIBE", "news1"]).await),
        show(b"*3\r\n$10\r\nssubscribe\r\n$5\r\nnews1\r\n:1\r\n")
    );
    assert_eq!(c.call(&["SPUBLISH", "news1", "hi"]).await, b":1\r\n");
    let message = sub.read_frames(1).await;
    assert_eq!(
        show(&message[0]),
        show(b"*3\r\n$8\r\nsmessage\r\n$5\r\nnews1\r\n$2\r\nhi\r\n")
    );
    proxy.stop().await;
}

/// A connection logged in as the client's user killed on its node: that node's keys would
/// be reached as the proxy's user, so the client is disconnected, as its own Redis
/// connection would have been.
#[tokio::test]
async fn a_killed_login_connection_disconnects_the_client() {
    let redis = RedisCluster::start(3, 0);
    create_app_user(&redis).await;
    let node = redis.primaries()[2].clone();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut c = app_client(&proxy).await;
    let mut admin = Raw::connect(&node).await;
    let killed = admin.call(&["CLIENT", "KILL", "USER", "app"]).await;
    assert_eq!(killed, b":1\r\n");
    let (_, closed) = c.read_to_close(common::DEADLINE).await;
    assert!(closed, "the client is disconnected");
}

/// A user made through the proxy (`ACL SETUSER`) exists on every primary, as on one server,
/// so it logs in everywhere; removed (`ACL DELUSER`), Redis closes its connections on every
/// node, and the client logged in as it is disconnected.
#[tokio::test]
async fn a_user_made_through_the_proxy_logs_in_on_every_primary() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut admin = Raw::connect(proxy.addr).await;
    let made = admin
        .call(&["ACL", "SETUSER", "u2", "on", ">pw", "~u2:*", "+@all"])
        .await;
    assert_eq!(made, b"+OK\r\n");
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["AUTH", "u2", "pw"]).await, b"+OK\r\n");
    for p in &redis.primaries() {
        let key = redis.key_on(p, "u2:k");
        assert_eq!(c.call(&["SET", &key, "v"]).await, b"+OK\r\n", "{p}");
    }
    assert_eq!(admin.call(&["ACL", "DELUSER", "u2"]).await, b":1\r\n");
    let (_, closed) = c.read_to_close(common::DEADLINE).await;
    assert!(closed, "the client is disconnected");
}

/// An attacker's sweep: a client logged in as a restricted Redis user, in every state that
/// changes where the proxy sends its commands (fresh, pinned by a WATCH before the login,
/// holding a WATCH after it, inside MULTI, RESP3), sends each command the proxy handles
/// across nodes (fan-outs, splits, gathers, SCAN, shard channels) or that its user is
/// refused. Every one is refused (by Redis or, with the reason, by the proxy), and afterwards
/// every primary still has its canary key, its configuration and no new user: nothing ran
/// with the proxy's rights.
#[tokio::test]
async fn a_restricted_user_gets_nothing_its_acl_refuses_in_any_state() {
    let redis = RedisCluster::start(3, 0);
    // `app`'s rules, less every command that reaches past the user's keys.
    let refused = [
        "-@dangerous",
        "-flushall",
        "-flushdb",
        "-keys",
        "-scan",
        "-dbsize",
        "-randomkey",
        "-config",
        "-script",
        "-function",
        "-client",
        "-slowlog",
        "-acl",
        "-wait",
    ];
    let rules = [&["ro"][..], &APP_RULES, &refused].concat();
    create_user(&redis, &rules).await;
    let primaries = redis.primaries();
    let canaries: Vec<String> = primaries
        .iter()
        .map(|p| redis.key_on(p, "canary"))
        .collect();
    let mut admin = Raw::connect(&primaries[0]).await;
    for (p, canary) in primaries.iter().zip(&canaries) {
        assert_eq!(
            Raw::connect(p).await.call(&["SET", canary, "v"]).await,
            b"+OK\r\n"
        );
    }
    let before = admin.call(&["CONFIG", "GET", "maxmemory-policy"]).await;
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let (a, b, c) = (&canaries[0], &canaries[1], &canaries[2]);
    let commands: Vec<Vec<&str>> = vec![
        vec!["FLUSHALL"],
        vec!["FLUSHDB", "ASYNC"],
        vec!["KEYS", "*"],
        vec!["SCAN", "0", "COUNT", "1000"],
        vec!["DBSIZE"],
        vec!["RANDOMKEY"],
        vec!["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
        vec!["SCRIPT", "FLUSH"],
        vec!["FUNCTION", "FLUSH"],
        vec!["CLIENT", "PAUSE", "10"],
        vec!["SLOWLOG", "RESET"],
        vec!["ACL", "SETUSER", "evil", "on", ">x", "+@all", "~*"],
        vec!["WAIT", "0", "0"],
        vec!["DEL", a, b, c],
        vec!["MSET", a, "x", b, "x", c, "x"],
        vec!["MGET", a, b, c],
        vec!["UNLINK", a, b],
        vec!["EXISTS", a, b, c],
        vec!["SUNION", a, b],
        vec!["SET", c, "x"],
        vec!["EVAL", "return redis.call('DEL', KEYS[1])", "1", b],
        vec!["SSUBSCRIBE", "secret"],
        vec!["PUBLISH", "secret", "x"],
    ];
    type Setup = &'static [&'static [&'static str]];
    let states: [(&str, Setup, Setup); 5] = [
        ("fresh", &[&["AUTH", "ro", "pw"]], &[]),
        (
            "WATCH before the login",
            &[&["WATCH", "app:w"], &["AUTH", "ro", "pw"]],
            &[],
        ),
        (
            "WATCH after the login",
            &[&["AUTH", "ro", "pw"], &["WATCH", "app:w"]],
            &[],
        ),
        ("RESP3", &[&["HELLO", "3", "AUTH", "ro", "pw"]], &[]),
        (
            "inside MULTI",
            &[&["AUTH", "ro", "pw"], &["MULTI"]],
            &[&["EXEC"]],
        ),
    ];
    for (state, setup, end) in states {
        for command in &commands {
            let mut client = Raw::connect(proxy.addr).await;
            for step in setup {
                let reply = client.call(step).await;
                assert!(
                    !reply.starts_with(b"-"),
                    "{state}: {step:?}: {}",
                    show(&reply)
                );
            }
            let reply = client.call(command).await;
            let mut replies = vec![reply];
            for step in end {
                replies.push(client.call(step).await);
            }
            // Refused at once, or queued and then refused inside EXEC's reply (or aborted).
            let text = show(&replies.concat());
            let refused = replies[0].starts_with(b"-")
                || (replies[0] == b"+QUEUED\r\n"
                    && (text.contains("NOPERM") || text.contains("EXECABORT")));
            assert!(refused, "{state}: {command:?}: {text}");
        }
    }
    for (p, canary) in primaries.iter().zip(&canaries) {
        let mut node = Raw::connect(p).await;
        assert_eq!(node.call(&["GET", canary]).await, b"$1\r\nv\r\n", "{p}");
        let user = node.call(&["ACL", "GETUSER", "evil"]).await;
        assert_eq!(user, b"$-1\r\n", "{p}: no user evil");
    }
    let after = admin.call(&["CONFIG", "GET", "maxmemory-policy"]).await;
    assert_eq!(show(&after), show(&before));
    proxy.stop().await;
}

/// A manual failover (`CLUSTER FAILOVER` on a replica, the step of every rolling upgrade)
/// gives the map a primary the client's login has no connection to: the proxy logs it in
/// there too (its last accepted login, in the protocol the client speaks now), so clients
/// logged in as their own user keep their connection, and the promoted node still runs their
/// commands as that user, not as the proxy's.
#[tokio::test]
async fn a_manual_failover_logs_the_client_in_on_the_promoted_primary() {
    let (mut redis, proxy) = app_cluster_with_replicas("refresh_interval_ms: 200").await;
    let victim = redis.primaries()[0].clone();
    let key = redis.key_on(&victim, "app:k");
    let other = redis.key_on(&victim, "other:k");
    let hash = redis.key_on(&victim, "app:h");
    // One client logged in with AUTH (RESP2); one with HELLO 3 AUTH that went back to RESP2
    // with a HELLO 2 of its own: the login replayed on the promoted node must not leave that
    // connection speaking RESP3.
    let mut auth = app_client(&proxy).await;
    let mut hello = Raw::connect(proxy.addr).await;
    assert!(
        hello
            .call(&["HELLO", "3", "AUTH", "app", "pw"])
            .await
            .starts_with(b"%"),
        "HELLO 3 AUTH"
    );
    assert!(hello.call(&["HELLO", "2"]).await.starts_with(b"*"));
    assert_eq!(auth.call(&["SET", &key, "before"]).await, b"+OK\r\n");
    assert_eq!(hello.call(&["GET", &key]).await, b"$6\r\nbefore\r\n");

    let replica = redis
        .live_addrs()
        .into_iter()
        .find(|n| {
            let info = redis
                .query(port_of(n), &["INFO", "replication"])
                .map(|v| format!("{v:?}"))
                .unwrap_or_default();
            info.contains(&format!("master_port:{}", port_of(&victim)))
        })
        .expect("the victim's replica");
    // The replica must have the key before it takes over.
    let until = std::time::Instant::now() + common::DEADLINE;
    loop {
        let mut r = Raw::connect(&replica).await;
        r.call(&["READONLY"]).await;
        if r.call(&["GET", &key]).await == b"$6\r\nbefore\r\n" {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the replica never synced"
        );
        tokio::time::sleep(common::POLL).await;
    }
    assert_eq!(
        Raw::connect(&replica)
            .await
            .call(&["CLUSTER", "FAILOVER"])
            .await,
        b"+OK\r\n"
    );
    let slot = redis_policy_proxy::cluster::slot(key.as_bytes());
    while redis.primary_for_slot(slot) != replica {
        assert!(std::time::Instant::now() < until, "no failover");
        tokio::time::sleep(common::POLL).await;
    }
    // Through the failover, each client keeps its connection and its user; the promoted
    // node runs its commands as `app` (the key pattern holds there).
    for (name, c) in [("AUTH", &mut auth), ("HELLO", &mut hello)] {
        let until = std::time::Instant::now() + common::DEADLINE;
        loop {
            let got = c.call(&["GET", &key]).await;
            // `before`, or what the client before this one wrote.
            if got == b"$6\r\nbefore\r\n" || got == b"$4\r\nAUTH\r\n" {
                break;
            }
            // A command may meet the old primary as a replica before the proxy's map
            // changes (Redis's own MOVED, followed); never an error that ends the client.
            assert!(!got.is_empty(), "{name}: the client was disconnected");
            assert!(std::time::Instant::now() < until, "{name}: {}", show(&got));
            tokio::time::sleep(common::POLL).await;
        }
        assert_eq!(c.call(&["SET", &key, name]).await, b"+OK\r\n", "{name}");
        let refused = c.call(&["SET", &other, "v"]).await;
        assert!(
            refused.starts_with(b"-NOPERM"),
            "{name}: {}",
            show(&refused)
        );
        assert_eq!(whoami(c).await, show(b"$3\r\napp\r\n"), "{name}");
        // RESP2 still on the promoted node: RESP3 would answer a map (`%1`).
        assert_eq!(c.call(&["HSET", &hash, "f", "v"]).await[..1], b":"[..]);
        assert_eq!(
            show(&c.call(&["HGETALL", &hash]).await),
            show(b"*2\r\n$1\r\nf\r\n$1\r\nv\r\n"),
            "{name}"
        );
    }
    // The demoted node goes (a rolling upgrade restarts it next): nothing to these clients,
    // once the proxy's map no longer has it as a primary (two refreshes after every node
    // agrees: Redis's own MOVED patches the map a slot at a time before that).
    while redis
        .live_addrs()
        .iter()
        .any(|n| redis.owners_seen_by(n).contains(&victim))
    {
        assert!(
            std::time::Instant::now() < until,
            "the old primary kept slots"
        );
        tokio::time::sleep(common::POLL).await;
    }
    let refreshes = |m: &str| {
        ["changed", "unchanged"]
            .iter()
            .map(|o| {
                common::sample(
                    m,
                    &format!("rpp_cluster_map_refreshes_total{{outcome=\"{o}\"}}"),
                )
            })
            .sum::<f64>()
    };
    let before = refreshes(&common::http_get(proxy.admin, "/metrics").await.1);
    while refreshes(&common::http_get(proxy.admin, "/metrics").await.1) < before + 2.0 {
        assert!(std::time::Instant::now() < until, "no map refresh");
        tokio::time::sleep(common::POLL).await;
    }
    let old = redis
        .nodes()
        .iter()
        .position(|n| n.addr() == victim)
        .expect("the old primary");
    redis.kill(old);
    for (name, c) in [("AUTH", &mut auth), ("HELLO", &mut hello)] {
        assert_eq!(c.call(&["GET", &key]).await, b"$5\r\nHELLO\r\n", "{name}");
        assert_eq!(whoami(c).await, show(b"$3\r\napp\r\n"), "{name}");
    }
    proxy.stop().await;
}

/// The lines of `node`'s CLIENT LIST that `pick` keeps.
async fn client_lines(node: &str, pick: impl Fn(&str) -> bool) -> Vec<String> {
    let reply = Raw::connect(node).await.call(&["CLIENT", "LIST"]).await;
    String::from_utf8_lossy(&reply)
        .lines()
        .filter(|l| l.starts_with("id=") && pick(l))
        .map(str::to_string)
        .collect()
}

/// A pub/sub frame of bulk strings with header `kind` (`*` RESP2, `>` RESP3 push).
fn pubsub_frame(kind: u8, parts: &[&str]) -> Vec<u8> {
    let mut frame = resp(parts);
    frame[0] = kind;
    frame
}

/// The port of `host:port`.
fn port_of(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

/// A client logged in as its own user over every primary subscribes to shard channels of
/// any node, each on a connection of the session's own logged in as that user: Redis checks
/// the user's channel rules on every node (before, the session was pinned to the node of
/// its first channel, and a channel of another node got CROSSSLOT).
#[tokio::test]
async fn shard_channels_of_every_node_run_as_the_clients_user() {
    let (redis, proxy) = app_cluster().await;
    let primaries = redis.primaries();
    let mut sub = app_client(&proxy).await;
    let mut publisher = app_client(&proxy).await;
    for (i, p) in primaries.iter().enumerate() {
        let channel = redis.key_on(p, "news");
        let confirmed = sub.call(&["SSUBSCRIBE", &channel]).await;
        assert_eq!(
            show(&confirmed),
            show(
                format!(
                    "*3\r\n$10\r\nssubscribe\r\n${}\r\n{channel}\r\n:{}\r\n",
                    channel.len(),
                    i + 1
                )
                .as_bytes()
            ),
            "{p}"
        );
        // A channel the user is refused, on the same node: refused there by Redis.
        let refused = sub.call(&["SSUBSCRIBE", &redis.key_on(p, "secret")]).await;
        assert!(refused.starts_with(b"-NOPERM"), "{p}: {}", show(&refused));
        assert_eq!(
            publisher.call(&["SPUBLISH", &channel, "hi"]).await,
            b":1\r\n",
            "{p}"
        );
        let message = sub.read_frames(1).await;
        let expected = pubsub_frame(b'*', &["smessage", &channel, "hi"]);
        assert_eq!(show(&message[0]), show(&expected), "{p}");
    }
    // Every node's connection holding the channels is the user's, none the proxy's.
    for p in &primaries {
        let subscribed = client_lines(p, |c| !c.contains("ssub=0")).await;
        assert!(!subscribed.is_empty(), "{p}");
        assert!(
            subscribed.iter().all(|c| c.contains("user=app ")),
            "{p}: {subscribed:?}"
        );
    }
    proxy.stop().await;
}

/// A client logged in as its own user over every primary hears the keyspace notifications
/// of every node, which each publishes for its own keys only: the session's extra
/// connections to the other primaries are logged in as its user (before, it heard its home
/// node's only, as those connections would have been the proxy's login).
#[tokio::test]
async fn keyspace_notifications_of_every_node_reach_the_clients_user() {
    let redis = RedisCluster::start(3, 0);
    create_user(
        &redis,
        &[
            "watcher",
            "on",
            ">pw",
            "resetkeys",
            "~app:*",
            "resetchannels",
            "&__keyspace@0__:app:*",
            "+@all",
        ],
    )
    .await;
    for p in &redis.primaries() {
        let set = ["CONFIG", "SET", "notify-keyspace-events", "KEA"];
        assert_eq!(Raw::connect(p).await.call(&set).await, b"+OK\r\n", "{p}");
    }
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut sub = Raw::connect(proxy.addr).await;
    assert_eq!(sub.call(&["AUTH", "watcher", "pw"]).await, b"+OK\r\n");
    let keys: Vec<String> = redis
        .primaries()
        .iter()
        .map(|p| redis.key_on(p, "app:k"))
        .collect();
    let channels: Vec<String> = keys.iter().map(|k| format!("__keyspace@0__:{k}")).collect();
    let mut command = vec!["SUBSCRIBE"];
    command.extend(channels.iter().map(String::as_str));
    sub.send(&common::resp(&command)).await;
    let confirmed = sub.read_frames(channels.len()).await;
    for (i, channel) in channels.iter().enumerate() {
        assert!(
            show(&confirmed[i]).contains(channel.as_str()),
            "{}",
            show(&confirmed[i])
        );
    }
    // Refused by the user's channel rules, as by Redis.
    let refused = sub.call(&["SUBSCRIBE", "__keyspace@0__:other:k"]).await;
    assert!(refused.starts_with(b"-NOPERM"), "{}", show(&refused));
    let mut writer = Raw::connect(proxy.addr).await;
    for k in &keys {
        assert_eq!(writer.call(&["SET", k, "v"]).await, b"+OK\r\n", "{k}");
        let heard = sub.read_frames(1).await;
        assert_eq!(
            show(&heard[0]),
            show(
                format!(
                    "*3\r\n$7\r\nmessage\r\n${}\r\n__keyspace@0__:{k}\r\n$3\r\nset\r\n",
                    k.len() + 15
                )
                .as_bytes()
            ),
            "{k}"
        );
    }
    proxy.stop().await;
}

/// With replica reads configured (`read_from: replica`), a client's own login is spread over
/// every primary all the same, and the client reads from the primaries over its login
/// connections: a replica's shared connection is the proxy's login, which would read what
/// the user may not (before, the login was pinned to one node and keys of the others got
/// CROSSSLOT). Other clients still read from replicas.
#[tokio::test]
async fn with_replica_reads_the_clients_login_reads_as_itself_on_every_primary() {
    let (redis, proxy) = app_cluster_with_replicas("read_from: replica").await;
    let replica_reads = || async {
        let metrics = common::http_get(proxy.admin, "/metrics").await.1;
        common::sample(&metrics, "rpp_replica_reads_total")
    };
    let mut c = app_client(&proxy).await;
    let before = replica_reads().await;
    for p in &redis.primaries() {
        let key = redis.key_on(p, "app:k");
        assert_eq!(c.call(&["SET", &key, "v"]).await, b"+OK\r\n", "{p}");
        assert_eq!(c.call(&["GET", &key]).await, b"$1\r\nv\r\n", "{p}");
        // Written by the pool's login: the user may not read it, on any node.
        let other = redis.key_on(p, "other:k");
        let mut plain = Raw::connect(proxy.addr).await;
        assert_eq!(plain.call(&["SET", &other, "v"]).await, b"+OK\r\n");
        let refused = c.call(&["GET", &other]).await;
        assert!(refused.starts_with(b"-NOPERM"), "{p}: {}", show(&refused));
    }
    assert_eq!(
        replica_reads().await,
        before,
        "the login's reads went to a replica"
    );
    // Another client's plain read still goes to a replica.
    let key = redis.key_on(&redis.primaries()[0], "app:k");
    let mut plain = Raw::connect(proxy.addr).await;
    let until = std::time::Instant::now() + common::DEADLINE;
    while replica_reads().await == before {
        assert!(std::time::Instant::now() < until, "no replica read");
        plain.call(&["GET", &key]).await;
    }
    proxy.stop().await;
}

/// Client-side caching (default mode) for a client logged in as its own user over every
/// primary: the tracking connections are logged in as the user too and carry its commands,
/// so it reads the keys of every node as itself (NOPERM where its ACL says so) and hears
/// the invalidations of every node (before, tracking was pinned to one node and keys of the
/// others got CROSSSLOT).
#[tokio::test]
async fn the_clients_login_and_tracking_reach_every_primary_together() {
    let (redis, proxy) = app_cluster().await;
    let primaries = redis.primaries();
    let keys: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "app:t")).collect();
    let mut writer = Raw::connect(proxy.addr).await;
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "v0"]).await, b"+OK\r\n");
    }
    let mut c = Raw::connect(proxy.addr).await;
    assert!(
        c.call(&["HELLO", "3", "AUTH", "app", "pw"])
            .await
            .starts_with(b"%")
    );
    assert_eq!(c.call(&["CLIENT", "TRACKING", "ON"]).await, b"+OK\r\n");
    for (p, key) in primaries.iter().zip(&keys) {
        assert_eq!(c.call(&["GET", key]).await, b"$2\r\nv0\r\n", "{p}");
        let other = redis.key_on(p, "other:t");
        let refused = c.call(&["GET", &other]).await;
        assert!(refused.starts_with(b"-NOPERM"), "{p}: {}", show(&refused));
    }
    assert_eq!(whoami(&mut c).await, show(b"$3\r\napp\r\n"));
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "v1"]).await, b"+OK\r\n");
        let pushed = c.read_frames(1).await;
        let expected = [&b">2\r\n$10\r\ninvalidate\r\n"[..], &resp(&[key])].concat();
        assert_eq!(show(&pushed[0]), show(&expected), "{key}");
    }
    // Every node's tracking connection is the user's.
    for p in &primaries {
        let tracking = client_lines(p, |c| c.contains("flags=t")).await;
        assert_eq!(tracking.len(), 1, "{p}: {tracking:?}");
        assert!(tracking[0].contains("user=app "), "{p}: {tracking:?}");
    }
    // Off: the login's own connections carry its commands again, as the user.
    assert_eq!(c.call(&["CLIENT", "TRACKING", "OFF"]).await, b"+OK\r\n");
    for (p, key) in primaries.iter().zip(&keys) {
        assert_eq!(c.call(&["GET", key]).await, b"$2\r\nv1\r\n", "{p}");
        let refused = c.call(&["GET", &redis.key_on(p, "other:t")]).await;
        assert!(refused.starts_with(b"-NOPERM"), "{p}: {}", show(&refused));
    }
    proxy.stop().await;
}
