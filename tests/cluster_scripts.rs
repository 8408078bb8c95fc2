//! Scripts in front of a Redis Cluster behave as in front of one Redis: a script runs on a
//! dedicated connection to the node owning its keys' slot (a keyless one where cluster mode
//! sends keyless commands), so while it keeps that node busy the other clients' commands are
//! answered (Redis's `-BUSY` on that node and for keyless commands, which go to a running
//! script's node, their replies on the others), and their `SCRIPT
//! KILL` / `FUNCTION KILL` reaches the node where it runs. A script whose slot moved follows
//! MOVED and ASK on its dedicated connection.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::cluster::{RedisCluster, begin_migration, end_migration, node_id, other_primary};
use common::{POLL, Proxy, Raw, load_spin_function, show};
use redis_policy_proxy::Config;
use redis_policy_proxy::cluster::slot;

/// Cluster mode for `seed`, with `upstream` lines added under `upstream:` (e.g. the
/// `script_acl`), the map refreshed only every minute (a test moving a slot wants the proxy's
/// map stale, so the nodes redirect).
fn config(seed: &str, upstream: &[&str]) -> Config {
    let mut text = String::from("upstream:\n  mode: cluster\n");
    for line in upstream {
        text.push_str(&format!("  {line}\n"));
    }
    text.push_str(&format!(
        "  cluster:\n    seeds: [{seed}]\n    refresh_interval_ms: 60000\n"
    ));
    redis_policy_proxy::setup::from_yaml(&text, std::path::Path::new("cluster-scripts.yaml"))
        .expect("cluster config parses")
}

/// Sends `probe` on `other` until the node answers `-BUSY` (the script is running there).
async fn wait_busy(other: &mut Raw, probe: &[&str], what: &str) {
    let mut reply = Vec::new();
    for _ in 0..500 {
        reply = other.call(probe).await;
        if reply.starts_with(b"-BUSY") {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("{what}: the node never became busy: {}", show(&reply));
}

/// For the script-user configuration (`confine`, the default) and for scripts run as the
/// proxy's user (`script_acl: off`): a script spinning on each primary in turn, and a keyless
/// one, holds only its own client; another client gets `-BUSY` from that node, its replies
/// from the others, any client's PING `-BUSY` (keyless commands go to the running script's
/// node), and ends the script with SCRIPT KILL (FUNCTION KILL for FCALL) sent through the
/// proxy. With nothing running, the kill is answered `NOTBUSY`, as by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_script_holds_only_its_client_and_its_kill_reaches_its_node() {
    let redis = RedisCluster::start_with(3, 0, &["--busy-reply-threshold", "50"]);
    let primaries = redis.primaries();
    for settings in [&[][..], &["script_acl: off"][..]] {
        let proxy = Proxy::start(config(&redis.live_addrs()[0], settings)).await;
        let mut other = Raw::connect(proxy.addr).await;
        load_spin_function(&mut other).await;
        let mut cases: Vec<(Option<String>, &str)> = Vec::new();
        for p in &primaries {
            for looping in ["EVAL", "FCALL"] {
                cases.push((Some(p.clone()), looping));
            }
        }
        cases.push((None, "EVAL"));
        for (primary, looping) in cases {
            let what = format!("{settings:?} {looping} on {primary:?}");
            let key = primary.as_ref().map(|p| redis.key_on(p, "spin"));
            let mut busy = Raw::connect(proxy.addr).await;
            let (numkeys, keys) = match &key {
                Some(k) => ("1", vec![k.as_str()]),
                None => ("0", vec![]),
            };
            let mut command = match looping {
                "EVAL" => vec!["EVAL", "while true do end", numkeys],
                _ => vec!["FCALL", "spin", numkeys],
            };
            command.extend(keys);
            busy.send(&common::resp(&command)).await;
            // The busy node answers BUSY; a key of another node is answered by it.
            match &primary {
                Some(p) => {
                    wait_busy(&mut other, &["GET", key.as_deref().unwrap()], &what).await;
                    let elsewhere = redis.key_on(&other_primary(&redis, p), "free");
                    assert_eq!(other.call(&["GET", &elsewhere]).await, b"$-1\r\n", "{what}");
                }
                None => wait_busy(&mut other, &["FLUSHALL"], &what).await,
            }
            // Keyless commands follow the running script, whichever node a client's would
            // go to otherwise: every client's PING is answered BUSY, as by one server.
            for _ in 0..3 {
                let mut fresh = Raw::connect(proxy.addr).await;
                let reply = fresh.call(&["PING"]).await;
                assert!(reply.starts_with(b"-BUSY"), "{what}: PING {}", show(&reply));
            }
            let kill = if looping == "EVAL" {
                "SCRIPT"
            } else {
                "FUNCTION"
            };
            assert_eq!(other.call(&[kill, "KILL"]).await, b"+OK\r\n", "{what}");
            let killed = busy.read_frame().await;
            assert!(
                String::from_utf8_lossy(&killed).contains("killed by user"),
                "{what}: {}",
                show(&killed)
            );
            // Both clients carry on.
            assert_eq!(busy.call(&["PING"]).await, b"+PONG\r\n", "{what}");
            assert_eq!(other.call(&["PING"]).await, b"+PONG\r\n", "{what}");
        }
        for kill in ["SCRIPT", "FUNCTION"] {
            let reply = other.call(&[kill, "KILL"]).await;
            assert!(reply.starts_with(b"-NOTBUSY"), "{kill}: {}", show(&reply));
        }
    }
}

/// A script whose key's slot moved since the proxy read the map gets MOVED on its dedicated
/// connection and runs on the new owner; one whose slot is being migrated (key not on the
/// source any more) gets ASK and runs on the target after ASKING. The client sees only the
/// script's reply, and the script's client goes on working; a pipeline mixing scripts and
/// plain commands of several nodes runs and answers in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_follows_moved_and_ask_on_its_dedicated_connection() {
    let redis = RedisCluster::start(3, 0);
    for settings in [&[][..], &["script_acl: off"][..]] {
        let proxy = Proxy::start(config(&redis.live_addrs()[0], settings)).await;
        let mut client = Raw::connect(proxy.addr).await;
        let set = "return redis.call('SET', KEYS[1], ARGV[1])";
        let source = redis.primaries()[0].clone();
        let target = other_primary(&redis, &source);
        let (source_id, target_id) = (node_id(&redis, &source), node_id(&redis, &target));

        // MOVED: the slot now belongs to the target; the proxy's map still says source.
        let moved = redis.key_on(&source, &format!("moved{}", settings.len()));
        let s = slot(moved.as_bytes());
        drop(begin_migration(s, (&source, &source_id), (&target, &target_id)).await);
        end_migration(&redis, s, (&source, &target), &target_id).await;
        let reply = client.call(&["EVAL", set, "1", &moved, "m"]).await;
        assert_eq!(reply, b"+OK\r\n", "{settings:?}: {}", show(&reply));
        assert_eq!(
            Raw::connect(&target).await.call(&["GET", &moved]).await,
            b"$1\r\nm\r\n",
            "{settings:?}"
        );

        // ASK: the slot is migrating from source to target and the key is not on the source.
        let asked = redis.key_on(&source, &format!("asked{}", settings.len()));
        let s = slot(asked.as_bytes());
        let (_to_source, _to_target) =
            begin_migration(s, (&source, &source_id), (&target, &target_id)).await;
        let reply = client.call(&["EVAL", set, "1", &asked, "a"]).await;
        assert_eq!(reply, b"+OK\r\n", "{settings:?}: {}", show(&reply));
        let mut on_target = Raw::connect(&target).await;
        on_target
            .send(&[common::resp(&["ASKING"]), common::resp(&["GET", &asked])].concat())
            .await;
        let frames = on_target.read_frames(2).await;
        assert_eq!(
            frames[1],
            b"$1\r\na\r\n",
            "{settings:?}: {}",
            show(&frames[1])
        );
        end_migration(&redis, s, (&source, &target), &target_id).await;

        // The client goes on: a plain command, and a script on another node.
        assert_eq!(client.call(&["GET", &moved]).await, b"$1\r\nm\r\n");
        let third = redis
            .primaries()
            .into_iter()
            .find(|p| *p != source && *p != target)
            .unwrap();
        let there = redis.key_on(&third, "third");
        assert_eq!(
            client.call(&["EVAL", set, "1", &there, "t"]).await,
            b"+OK\r\n"
        );
        assert_eq!(client.call(&["GET", &there]).await, b"$1\r\nt\r\n");

        // A pipeline mixing plain commands and scripts of several nodes keeps its order:
        // each script sees the writes before it, and the reads after it see its write.
        let incr = "return redis.call('INCR', KEYS[1])";
        let mut input = Vec::new();
        for p in redis.primaries() {
            let k = redis.key_on(&p, &format!("order{}", settings.len()));
            input.extend(common::resp(&["SET", &k, "1"]));
            input.extend(common::resp(&["EVAL", incr, "1", &k]));
            input.extend(common::resp(&["GET", &k]));
        }
        client.send(&input).await;
        for p in redis.primaries() {
            let got = client.read_frames(3).await.concat();
            assert_eq!(
                got,
                b"+OK\r\n:2\r\n$1\r\n2\r\n",
                "{settings:?} {p}: {}",
                show(&got)
            );
        }
    }
}

/// `SCRIPT EXISTS` asks every primary: a script an EVAL cached on its keys' node is known to
/// any client, as one Redis knows every script it ran (it asked one node, which often had
/// not run it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_exists_knows_a_script_any_node_ran() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(config(&redis.live_addrs()[0], &[])).await;
    let mut c = Raw::connect(proxy.addr).await;
    for (i, primary) in redis.primaries().iter().enumerate() {
        let key = redis.key_on(primary, "cached");
        // A script of its own per node, so only that node has it.
        let body = format!("return {i}");
        let ran = c.call(&["EVAL", &body, "1", &key]).await;
        assert_eq!(ran, format!(":{i}\r\n").as_bytes(), "{}", show(&ran));
        let sha = sha1_smol::Sha1::from(&body).digest().to_string();
        for _ in 0..3 {
            let mut other = Raw::connect(proxy.addr).await;
            let missing = "0".repeat(40);
            assert_eq!(
                other.call(&["SCRIPT", "EXISTS", &sha, &missing]).await,
                b"*2\r\n:1\r\n:0\r\n",
                "the script run on {primary}"
            );
        }
    }
}
