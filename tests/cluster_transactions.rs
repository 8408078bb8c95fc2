//! Transactions through the proxy while their slot moves between primaries of a real Redis
//! Cluster. A node that redirects a queued command or EXEC has run nothing, so the proxy
//! replays the transaction on the new owner and the client, which knows nothing of clusters,
//! gets EXEC's real result; under WATCH it gets a null EXEC (retry), never a raw MOVED/ASK.
//! Each case moves a slot that holds no keys, so `CLUSTER SETSLOT … NODE` alone moves it;
//! the proxy refreshes its map only on redirections (no periodic refresh), so its map is
//! stale exactly as it would be right after a real reshard.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::cluster::{RedisCluster, begin_migration, end_migration, node_id, other_primary};
use common::{Proxy, Raw, resp, show};
use redis_policy_proxy::cluster::slot;

/// A cluster of three primaries and a proxy in front of it that never refreshes by itself.
async fn setup() -> (RedisCluster, Proxy) {
    let redis = RedisCluster::start(3, 0);
    let config =
        common::cluster::proxy_config(&redis.live_addrs()[0], &["refresh_interval_ms: 600000"]);
    let proxy = Proxy::start(config).await;
    (redis, proxy)
}

/// The slot of hash tag `tag`, its owner, another primary, and that primary's node id.
fn move_plan(redis: &RedisCluster, tag: &str) -> (u16, String, String, String) {
    let s = slot(tag.as_bytes());
    let source = redis.primary_for_slot(s);
    let target = other_primary(redis, &source);
    let target_id = node_id(redis, &target);
    (s, source, target, target_id)
}

/// A client connection speaking RESP `proto`.
async fn client(proxy: &Proxy, proto: u8) -> Raw {
    let mut c = Raw::connect(proxy.addr).await;
    if proto == 3 {
        let hello = c.call(&["HELLO", "3"]).await;
        assert!(hello.starts_with(b"%"), "{}", show(&hello));
    }
    c
}

async fn direct_get(node: &str, key: &str) -> Vec<u8> {
    Raw::connect(node).await.call(&["GET", key]).await
}

#[tokio::test]
async fn a_transaction_whose_slot_moves_while_queuing_runs_on_the_new_owner() {
    let (redis, proxy) = setup().await;
    for proto in [2u8, 3] {
        let tag = format!("{{txq{proto}}}");
        let (s, source, target, target_id) = move_plan(&redis, &tag);
        let (a, b, n) = (format!("{tag}a"), format!("{tag}b"), format!("{tag}n"));
        let mut c = client(&proxy, proto).await;
        assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
        assert_eq!(c.call(&["SET", &a, "1"]).await, b"+QUEUED\r\n");
        end_migration(&redis, s, (&source, &target), &target_id).await;
        // Still queued on the old owner, which now answers MOVED: hidden from the client.
        assert_eq!(c.call(&["SET", &b, "2"]).await, b"+QUEUED\r\n");
        assert_eq!(c.call(&["INCR", &n]).await, b"+QUEUED\r\n");
        assert_eq!(
            show(&c.call(&["EXEC"]).await),
            show(b"*3\r\n+OK\r\n+OK\r\n:1\r\n"),
            "RESP{proto}"
        );
        assert_eq!(direct_get(&target, &a).await, b"$1\r\n1\r\n");
        assert_eq!(direct_get(&target, &b).await, b"$1\r\n2\r\n");
        // Ran once: the old owner has nothing, the counter is 1.
        assert_eq!(direct_get(&target, &n).await, b"$1\r\n1\r\n");
        // The session is back to normal, on the new owner.
        assert_eq!(c.call(&["GET", &a]).await, b"$1\r\n1\r\n");
    }
}

#[tokio::test]
async fn a_transaction_whose_slot_moves_before_exec_runs_on_the_new_owner() {
    let (redis, proxy) = setup().await;
    let tag = "{txe}";
    let (s, source, target, target_id) = move_plan(&redis, tag);
    let mut c = client(&proxy, 2).await;
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["RPUSH", "{txe}l", "x", "y"]).await, b"+QUEUED\r\n");
    assert_eq!(
        c.call(&["LRANGE", "{txe}l", "0", "-1"]).await,
        b"+QUEUED\r\n"
    );
    end_migration(&redis, s, (&source, &target), &target_id).await;
    // EXEC itself gets MOVED (the old owner checks the queued keys) and is replayed.
    assert_eq!(
        show(&c.call(&["EXEC"]).await),
        show(b"*2\r\n:2\r\n*2\r\n$1\r\nx\r\n$1\r\ny\r\n")
    );
    assert_eq!(
        Raw::connect(&target).await.call(&["LLEN", "{txe}l"]).await,
        b":2\r\n"
    );
}

#[tokio::test]
async fn a_pipelined_transaction_on_a_stale_map_is_replayed() {
    let (redis, proxy) = setup().await;
    let tag = "{txp}";
    let (s, source, target, target_id) = move_plan(&redis, tag);
    end_migration(&redis, s, (&source, &target), &target_id).await;
    let mut c = client(&proxy, 2).await;
    let input = [
        resp(&["MULTI"]),
        resp(&["SET", "{txp}a", "1"]),
        resp(&["INCRBY", "{txp}n", "5"]),
        resp(&["EXEC"]),
        resp(&["MGET", "{txp}a", "{txp}n"]),
    ]
    .concat();
    let replies = c.request(&input, 5).await;
    assert_eq!(
        show(&replies),
        show(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:5\r\n*2\r\n$1\r\n1\r\n$1\r\n5\r\n")
    );
    assert_eq!(direct_get(&target, "{txp}n").await, b"$1\r\n5\r\n");
}

#[tokio::test]
async fn under_watch_a_moved_transaction_answers_null_and_a_retry_succeeds() {
    let (redis, proxy) = setup().await;
    for proto in [2u8, 3] {
        let tag = format!("{{txw{proto}}}");
        let (s, source, target, target_id) = move_plan(&redis, &tag);
        let key = format!("{tag}k");
        let mut c = client(&proxy, proto).await;
        assert_eq!(c.call(&["WATCH", &key]).await, b"+OK\r\n");
        assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
        assert_eq!(c.call(&["SET", &key, "1"]).await, b"+QUEUED\r\n");
        end_migration(&redis, s, (&source, &target), &target_id).await;
        let null: &[u8] = if proto == 3 { b"_\r\n" } else { b"*-1\r\n" };
        // The watch stayed on the old owner: the transaction cannot move with it.
        assert_eq!(show(&c.call(&["EXEC"]).await), show(null), "RESP{proto}");
        assert_eq!(direct_get(&target, &key).await, b"$-1\r\n");
        // What a client does after a null EXEC: watch again and retry, now on the new owner.
        assert_eq!(c.call(&["WATCH", &key]).await, b"+OK\r\n");
        assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
        assert_eq!(c.call(&["SET", &key, "2"]).await, b"+QUEUED\r\n");
        assert_eq!(show(&c.call(&["EXEC"]).await), show(b"*1\r\n+OK\r\n"));
        assert_eq!(direct_get(&target, &key).await, b"$1\r\n2\r\n");
    }
}

#[tokio::test]
async fn a_transaction_queued_during_a_migration_follows_ask() {
    let (redis, proxy) = setup().await;
    let tag = "{txa}";
    let (s, source, target, target_id) = move_plan(&redis, tag);
    let source_id = node_id(&redis, &source);
    let links = begin_migration(s, (&source, &source_id), (&target, &target_id)).await;
    let mut c = client(&proxy, 2).await;
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    // The source does not have the key: ASK, hidden; EXEC then aborts there and the
    // transaction runs on the importing target after ASKING.
    assert_eq!(c.call(&["SET", "{txa}new", "v"]).await, b"+QUEUED\r\n");
    assert_eq!(show(&c.call(&["EXEC"]).await), show(b"*1\r\n+OK\r\n"));
    assert_eq!(
        Raw::connect(&target)
            .await
            .request(&[resp(&["ASKING"]), resp(&["GET", "{txa}new"])].concat(), 2)
            .await,
        b"+OK\r\n$1\r\nv\r\n"
    );
    assert_eq!(c.call(&["GET", "{txa}new"]).await, b"$1\r\nv\r\n");
    drop(links);
}

#[tokio::test]
async fn transactions_that_cannot_run_still_abort() {
    let (redis, proxy) = setup().await;
    let mut c = client(&proxy, 2).await;
    // A command Redis refuses while queuing aborts the transaction: no replay.
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "{txr}a", "1"]).await, b"+QUEUED\r\n");
    let bad = c.call(&["LPUSH", "{txr}a"]).await;
    assert!(
        bad.starts_with(b"-ERR wrong number of arguments"),
        "{}",
        show(&bad)
    );
    let exec = c.call(&["EXEC"]).await;
    assert!(exec.starts_with(b"-EXECABORT"), "{}", show(&exec));
    // Keys in two slots cannot share a transaction (Redis says CROSSSLOT at EXEC).
    let (a, b) = ("{txr}a", "{txs}b");
    assert_ne!(slot(a.as_bytes()), slot(b.as_bytes()));
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", a, "1"]).await, b"+QUEUED\r\n");
    assert_eq!(
        c.call(&["SET", b, "1"]).await,
        b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"
    );
    let exec = c.call(&["EXEC"]).await;
    assert!(exec.starts_with(b"-EXECABORT"), "{}", show(&exec));
    let owner = redis.primary_for_slot(slot(a.as_bytes()));
    assert_eq!(direct_get(&owner, a).await, b"$-1\r\n", "nothing ran");
}

#[tokio::test]
async fn a_watch_sent_on_a_stale_map_starts_over_on_the_new_owner() {
    let (redis, proxy) = setup().await;
    let tag = "{txv}";
    let (s, source, target, target_id) = move_plan(&redis, tag);
    end_migration(&redis, s, (&source, &target), &target_id).await;
    let key = "{txv}k";
    let mut c = client(&proxy, 2).await;
    // The proxy's map still names the source: WATCH gets MOVED there, and is sent again to
    // the target instead of the client seeing the redirection.
    assert_eq!(c.call(&["WATCH", key]).await, b"+OK\r\n");
    // The watch is real, on the node that has the key: a change by another client voids it.
    assert_eq!(
        Raw::connect(&target)
            .await
            .call(&["SET", key, "other"])
            .await,
        b"+OK\r\n"
    );
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", key, "1"]).await, b"+QUEUED\r\n");
    assert_eq!(show(&c.call(&["EXEC"]).await), show(b"*-1\r\n"));
    assert_eq!(direct_get(&target, key).await, b"$5\r\nother\r\n");
    // Unchanged, the transaction runs.
    assert_eq!(c.call(&["WATCH", key]).await, b"+OK\r\n");
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", key, "2"]).await, b"+QUEUED\r\n");
    assert_eq!(show(&c.call(&["EXEC"]).await), show(b"*1\r\n+OK\r\n"));
    assert_eq!(direct_get(&target, key).await, b"$1\r\n2\r\n");
}

/// The same WATCH pipelined with the transaction it guards (a read before it and one after):
/// it waits for what was in flight, the commands after it wait for its reply, so it starts
/// over on the new owner before they are placed, and the client sees no redirection (it got
/// Redis's raw MOVED for the WATCH and the read, and a null EXEC, before).
#[tokio::test]
async fn a_watch_pipelined_on_a_stale_map_starts_over_with_what_follows() {
    let (redis, proxy) = setup().await;
    for proto in [2u8, 3] {
        let tag = format!("{{txw{proto}}}");
        let (s, source, target, target_id) = move_plan(&redis, &tag);
        end_migration(&redis, s, (&source, &target), &target_id).await;
        let key = format!("{tag}k");
        let k = key.as_str();
        let mut c = client(&proxy, proto).await;
        let mut input = Vec::new();
        // A read of another slot first: the WATCH waits for its reply too.
        for args in [
            &["GET", "{other}x"][..],
            &["WATCH", k],
            &["GET", k],
            &["MULTI"],
            &["SET", k, "1"],
            &["EXEC"],
        ] {
            input.extend(resp(args));
        }
        c.send(&input).await;
        let got = c
            .collect_frames(6, std::time::Duration::from_secs(10))
            .await;
        let null = if proto == 3 { "_\r\n" } else { "$-1\r\n" };
        let want = format!("{null}+OK\r\n{null}+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n");
        assert_eq!(show(&got.joined()), show(want.as_bytes()), "RESP{proto}");
        assert_eq!(direct_get(&target, k).await, b"$1\r\n1\r\n", "RESP{proto}");
    }
}

/// A hash tag of a key on each primary of `redis`.
fn a_tag_on_each_primary(redis: &RedisCluster) -> Vec<String> {
    let mut tags: Vec<(String, String)> = Vec::new();
    for i in 0.. {
        let tag = format!("{{k{i}}}");
        let owner = redis.primary_for_slot(slot(tag.as_bytes()));
        if !tags.iter().any(|(_, o)| *o == owner) {
            tags.push((tag, owner));
        }
        if tags.len() == 3 {
            break;
        }
    }
    tags.into_iter().map(|(t, _)| t).collect()
}

#[tokio::test]
async fn a_keyless_command_first_in_a_transaction_waits_for_the_first_key_to_pick_the_node() {
    let (redis, proxy) = setup().await;
    for proto in [2u8, 3] {
        // One key on each primary: whatever the client's home node, two are elsewhere.
        for tag in a_tag_on_each_primary(&redis) {
            let key = format!("{tag}held{proto}");
            let mut c = client(&proxy, proto).await;
            assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
            assert_eq!(c.call(&["PING"]).await, b"+QUEUED\r\n");
            assert_eq!(c.call(&["ECHO", "e"]).await, b"+QUEUED\r\n");
            assert_eq!(c.call(&["SET", &key, "v"]).await, b"+QUEUED\r\n");
            assert_eq!(c.call(&["PING"]).await, b"+QUEUED\r\n");
            assert_eq!(c.call(&["GET", &key]).await, b"+QUEUED\r\n");
            assert_eq!(
                c.call(&["EXEC"]).await,
                b"*5\r\n+PONG\r\n$1\r\ne\r\n+OK\r\n+PONG\r\n$1\r\nv\r\n",
                "RESP{proto} {key}"
            );
            let owner = redis.primary_for_slot(slot(key.as_bytes()));
            assert_eq!(direct_get(&owner, &key).await, b"$1\r\nv\r\n");
            // Keyless only: run on some node, as Redis would.
            assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
            assert_eq!(c.call(&["PING", "p"]).await, b"+QUEUED\r\n");
            assert_eq!(c.call(&["EXEC"]).await, b"*1\r\n$1\r\np\r\n");
            // Discarded: nothing runs, the session goes on.
            assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
            assert_eq!(c.call(&["PING"]).await, b"+QUEUED\r\n");
            assert_eq!(c.call(&["DISCARD"]).await, b"+OK\r\n");
            assert_eq!(c.call(&["GET", &key]).await, b"$1\r\nv\r\n");
        }
    }
}

#[tokio::test]
async fn a_transaction_of_many_keyless_commands_is_not_held_without_bound() {
    let (_redis, proxy) = setup().await;
    let mut c = client(&proxy, 2).await;
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    // Past the proxy's bound the transaction goes to a node, which queues the rest.
    for _ in 0..200 {
        assert_eq!(c.call(&["PING"]).await, b"+QUEUED\r\n");
    }
    let exec = c.call(&["EXEC"]).await;
    let mut expected = b"*200\r\n".to_vec();
    for _ in 0..200 {
        expected.extend_from_slice(b"+PONG\r\n");
    }
    assert_eq!(exec, expected);
}

/// A command every primary gets (CONFIG SET, FLUSHALL) queued in a transaction: it runs in
/// the transaction on its node, and once EXEC ran there, on every other primary; EXEC's
/// element for it is the merged answer, as for a read of every node's data (DBSIZE, KEYS,
/// SCRIPT EXISTS, INFO). A transaction that did not run (WATCH) sends it nowhere else, one
/// that failed on its node sends it nowhere else, and SCRIPT KILL stays refused in MULTI.
#[tokio::test]
async fn a_whole_keyspace_command_in_a_transaction_reaches_every_primary_after_exec() {
    let (redis, proxy) = setup().await;
    let primaries = redis.primaries();
    let samples = |node: String| async move {
        let reply = Raw::connect(&node)
            .await
            .call(&["CONFIG", "GET", "maxmemory-samples"])
            .await;
        String::from_utf8_lossy(&reply).into_owned()
    };
    let keys = a_tag_on_each_primary(&redis);
    for proto in [2, 3] {
        let mut c = client(&proxy, proto).await;
        // Refused on its node: EXEC says so in its element, and no other node is asked.
        let got = c
            .request(
                &[
                    resp(&["MULTI"]),
                    resp(&["SET", &format!("{}:k", keys[0]), "v"]),
                    resp(&["CONFIG", "SET", "maxmemory", "bla"]),
                    resp(&["EXEC"]),
                ]
                .concat(),
                4,
            )
            .await;
        let text = String::from_utf8_lossy(&got).into_owned();
        assert!(
            text.starts_with("+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n-ERR CONFIG SET failed"),
            "RESP{proto}: {text}"
        );
        // Taken: every primary has it, and FLUSHALL emptied every primary.
        for key in &keys {
            assert_eq!(c.call(&["SET", &format!("{key}:k"), "v"]).await, b"+OK\r\n");
        }
        let value = if proto == 2 { "7" } else { "9" };
        let got = c
            .request(
                &[
                    resp(&["MULTI"]),
                    resp(&["SET", &format!("{}:k", keys[1]), "v"]),
                    resp(&["CONFIG", "SET", "maxmemory-samples", value]),
                    resp(&["FLUSHALL"]),
                    resp(&["EXEC"]),
                ]
                .concat(),
                5,
            )
            .await;
        assert_eq!(
            show(&got),
            show(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n+OK\r\n+OK\r\n+OK\r\n")
        );
        for p in &primaries {
            assert!(
                samples(p.clone())
                    .await
                    .ends_with(&format!("\r\n{value}\r\n")),
                "{p}"
            );
            assert_eq!(
                Raw::connect(p).await.call(&["DBSIZE"]).await,
                b":0\r\n",
                "{p}"
            );
        }
        // Under WATCH, a changed key: nothing runs anywhere.
        let watched = format!("{}:w", keys[2]);
        for key in &keys {
            assert_eq!(c.call(&["SET", &format!("{key}:k"), "v"]).await, b"+OK\r\n");
        }
        assert_eq!(c.call(&["WATCH", &watched]).await, b"+OK\r\n");
        let mut other = client(&proxy, 2).await;
        assert_eq!(other.call(&["SET", &watched, "changed"]).await, b"+OK\r\n");
        let got = c
            .request(
                &[resp(&["MULTI"]), resp(&["FLUSHALL"]), resp(&["EXEC"])].concat(),
                3,
            )
            .await;
        let null = if proto == 2 { "*-1\r\n" } else { "_\r\n" };
        assert_eq!(
            show(&got),
            show(format!("+OK\r\n+QUEUED\r\n{null}").as_bytes())
        );
        for key in &keys {
            let node = redis.primary_for_slot(slot(key.as_bytes()));
            assert_eq!(
                direct_get(&node, &format!("{key}:k")).await,
                b"$1\r\nv\r\n",
                "{node}"
            );
        }
        // A read of every node's data: its EXEC element merges every primary's answer, as
        // outside MULTI (four keys over three primaries, and the one the transaction adds).
        let got = c
            .request(
                &[
                    resp(&["MULTI"]),
                    resp(&["SET", &format!("{}:x", keys[0]), "v"]),
                    resp(&["DBSIZE"]),
                    resp(&["KEYS", "*"]),
                    resp(&["SCRIPT", "EXISTS", &"0".repeat(40)]),
                    resp(&["INFO", "keyspace"]),
                    resp(&["EXEC"]),
                ]
                .concat(),
                7,
            )
            .await;
        let text = String::from_utf8_lossy(&got).into_owned();
        assert!(
            text.starts_with(
                "+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*5\r\n+OK\r\n:5\r\n*5\r\n"
            ),
            "RESP{proto}: {text}"
        );
        for key in &keys {
            assert!(
                text.contains(&format!("{key}:k\r\n")),
                "RESP{proto}: {text}"
            );
        }
        assert!(text.contains("*1\r\n:0\r\n"), "RESP{proto}: {text}");
        assert!(text.contains("db0:keys=5,"), "RESP{proto}: {text}");
        // SCRIPT KILL (a script runs while EXEC waits for it): still refused.
        assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
        let refused = c.call(&["SCRIPT", "KILL"]).await;
        assert!(
            refused.starts_with(b"-ERR SCRIPT inside MULTI is not supported"),
            "{}",
            show(&refused)
        );
        assert_eq!(c.call(&["DISCARD"]).await, b"+OK\r\n");
        assert_eq!(c.call(&["FLUSHALL"]).await, b"+OK\r\n");
    }
    for p in &primaries {
        let mut node = Raw::connect(p).await;
        assert_eq!(
            node.call(&["CONFIG", "SET", "maxmemory-samples", "5"])
                .await,
            b"+OK\r\n"
        );
    }
}
