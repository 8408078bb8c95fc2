//! Pipelines across the nodes of a real Redis Cluster: the proxy sends each node its part
//! without waiting for the others, and still answers in request order; commands for one hash
//! slot still run in request order while that slot migrates live (MOVED/ASK followed).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use common::cluster::{
    RedisCluster, begin_migration, end_migration, node_id, other_primary, setslot,
};
use common::{Proxy, Raw, pipeline, resp, show};
use redis_policy_proxy::Config;
use redis_policy_proxy::cluster::slot;

/// Cluster-mode configuration for `seed`; no periodic refresh during a test, so the proxy
/// learns slot moves from MOVED only.
fn cluster_config(seed: &str) -> Config {
    common::cluster::proxy_config(seed, &["refresh_interval_ms: 600000", "max_redirects: 16"])
}

/// A small deterministic generator, so a failing sequence can be replayed.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A pipeline of `commands` random commands over `keys` keys named with `prefix`, and the
/// replies one Redis gives them: strings (SET/GET/DEL) and counters (INCR/DEL) modelled
/// here, now and then a keyless command, one the proxy answers, and an MGET split over nodes.
fn mixed_pipeline(seed: u64, prefix: &str, keys: u64, commands: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut rng = Lcg(seed);
    let mut strings: HashMap<u64, String> = HashMap::new();
    let mut counters: HashMap<u64, i64> = HashMap::new();
    let (mut input, mut expected) = (Vec::new(), Vec::new());
    for i in 0..commands {
        let k = rng.below(keys);
        let (command, reply) = match rng.below(40) {
            // Now and then commands that are not one node's: keyless (stays with a node in
            // flight), answered by the proxy, and split over the nodes (waits for the rest).
            37 => (resp(&["PING"]), b"+PONG\r\n".to_vec()),
            38 => (resp(&["CLIENT", "GETNAME"]), b"$-1\r\n".to_vec()),
            39 => {
                let other = rng.below(keys);
                let mut r = b"*2\r\n".to_vec();
                for k in [k, other] {
                    r.extend(match strings.get(&k) {
                        Some(v) => format!("${}\r\n{v}\r\n", v.len()).into_bytes(),
                        None => b"$-1\r\n".to_vec(),
                    });
                }
                let (a, b) = (format!("s:{prefix}{k}"), format!("s:{prefix}{other}"));
                (resp(&["MGET", &a, &b]), r)
            }
            n => match n % 6 {
                0 => {
                    let v = format!("v{i}");
                    let r = b"+OK\r\n".to_vec();
                    strings.insert(k, v.clone());
                    (resp(&["SET", &format!("s:{prefix}{k}"), &v]), r)
                }
                1 => {
                    let r = match strings.get(&k) {
                        Some(v) => format!("${}\r\n{v}\r\n", v.len()).into_bytes(),
                        None => b"$-1\r\n".to_vec(),
                    };
                    (resp(&["GET", &format!("s:{prefix}{k}")]), r)
                }
                2 => {
                    let r = format!(":{}\r\n", u8::from(strings.remove(&k).is_some())).into_bytes();
                    (resp(&["DEL", &format!("s:{prefix}{k}")]), r)
                }
                3 | 4 => {
                    let n = counters.entry(k).or_insert(0);
                    *n += 1;
                    (
                        resp(&["INCR", &format!("c:{prefix}{k}")]),
                        format!(":{n}\r\n").into_bytes(),
                    )
                }
                _ => {
                    let r = match counters.remove(&k) {
                        Some(_) => b":1\r\n".to_vec(),
                        None => b":0\r\n".to_vec(),
                    };
                    (resp(&["DEL", &format!("c:{prefix}{k}")]), r)
                }
            },
        };
        input.extend(command);
        expected.push(reply);
    }
    (input, expected)
}

#[tokio::test]
async fn a_pipeline_across_primaries_keeps_reply_order() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(cluster_config(&redis.live_addrs()[0])).await;

    // Strings (SET/GET/DEL) and counters (INCR/GET/DEL) on random keys, modelled here.
    let keys = 300;
    let owners: std::collections::HashSet<String> = (0..keys)
        .map(|k| redis.primary_for_slot(slot(format!("s:{k}").as_bytes())))
        .collect();
    assert_eq!(owners.len(), 3, "the keys cover every primary");
    let (input, expected) = mixed_pipeline(7, "", keys, 4000);
    // One write: the proxy gets the whole mix at once.
    let got = pipeline(proxy.addr, input, expected.len()).await;
    assert_eq!(got.frames.len(), expected.len());
    for (i, (got, want)) in got.frames.iter().zip(&expected).enumerate() {
        assert_eq!(show(got), show(want), "reply {i}");
    }

    // The figure for docs/performance.md: 3000 GETs over the three primaries, and over one
    // (a hash tag) for comparison. Not asserted: the machine is shared.
    for (label, key) in [("3 primaries", "g:"), ("1 primary", "{g}:")] {
        let mut input = Vec::new();
        for i in 0..3000 {
            input.extend(resp(&["GET", &format!("{key}{}", i % 100)]));
        }
        // Once to warm the connections, then timed.
        pipeline(proxy.addr, input.clone(), 3000).await;
        let start = Instant::now();
        let got = pipeline(proxy.addr, input, 3000).await;
        eprintln!("3000 pipelined GETs over {label}: {:?}", start.elapsed());
        assert_eq!(got.frames.len(), 3000);
    }
    proxy.stop().await;
}

/// `upstream.queue_depth: 1`: a node's queue is full whenever a batch for it is still
/// waiting, so sessions keep waiting for room in the middle of sending a pipeline's parts
/// (the run that fills a queue, then the runs parked for the other nodes). Every client's
/// replies still come back whole and in its order.
#[tokio::test]
async fn full_upstream_queues_keep_each_clients_reply_order() {
    let redis = RedisCluster::start(3, 0);
    let mut config = cluster_config(&redis.live_addrs()[0]);
    config.upstream.queue_depth.value = 1;
    let proxy = Proxy::start(config).await;
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..8u64 {
        let addr = proxy.addr;
        clients.spawn(async move {
            let (input, expected) = mixed_pipeline(c + 100, &format!("{c}:"), 200, 1500);
            let got = pipeline(addr, input, expected.len()).await;
            assert_eq!(got.frames.len(), expected.len(), "client {c}");
            for (i, (got, want)) in got.frames.iter().zip(&expected).enumerate() {
                assert_eq!(show(got), show(want), "client {c}, reply {i}");
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }
    proxy.stop().await;
}

#[tokio::test]
async fn per_slot_order_holds_across_a_live_migration() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(cluster_config(&redis.live_addrs()[0])).await;
    let s = slot(b"{pm}");
    let source = redis.primary_for_slot(s);
    let target = other_primary(&redis, &source);
    let (source_id, target_id) = (node_id(&redis, &source), node_id(&redis, &target));
    // Keys on the other nodes, interleaved with the migrating slot's.
    let others: Vec<String> = (0..)
        .map(|i| format!("other:{i}"))
        .filter(|k| redis.primary_for_slot(slot(k.as_bytes())) != source)
        .take(8)
        .collect();

    // Clients pipeline INCRs; each checks that every key's replies go 1, 2, 3…
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..2)
        .map(|t| {
            let stop = stop.clone();
            let addr = proxy.addr;
            let others = others.clone();
            tokio::spawn(async move {
                let mut keys: Vec<String> = (0..6).map(|j| format!("{{pm}}{t}:{j}")).collect();
                keys.extend(others.iter().map(|o| format!("{o}:{t}")));
                let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                let (rd, mut wr) = stream.into_split();
                // Up to four pipelines written ahead of the replies read: a pipeline goes out
                // while the previous ones' commands are still in flight, on the old owner
                // too once the proxy learns the new one.
                let (ahead, mut written) = tokio::sync::mpsc::channel::<Vec<String>>(4);
                let writer = tokio::spawn(async move {
                    let mut rng = Lcg(t + 1);
                    let mut rounds = 0;
                    while !stop.load(Ordering::Relaxed) || rounds < 3 {
                        rounds += 1;
                        let picks: Vec<String> = (0..100)
                            .map(|_| keys[rng.below(keys.len() as u64) as usize].clone())
                            .collect();
                        let input: Vec<u8> =
                            picks.iter().flat_map(|k| resp(&["INCR", k])).collect();
                        wr.write_all(&input).await.unwrap();
                        if ahead.send(picks).await.is_err() {
                            break;
                        }
                    }
                    rounds
                });
                let mut lines = tokio::io::BufReader::new(rd).lines();
                let mut counts: HashMap<String, i64> = HashMap::new();
                let mut errors = Vec::new();
                while let Some(picks) = written.recv().await {
                    for k in picks {
                        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
                            .await
                            .expect("reply in time")
                            .unwrap()
                            .expect("connection open");
                        let n = counts.entry(k.clone()).or_insert(0);
                        *n += 1;
                        let got = line.strip_prefix(':').and_then(|v| v.parse::<i64>().ok());
                        if got != Some(*n) {
                            errors.push(format!("{k}: expected {n}, got {line}"));
                            // Resynchronise on what Redis says, to report each fault once.
                            if let Some(v) = got {
                                *n = v;
                            }
                        }
                    }
                }
                let rounds = writer.await.unwrap();
                (counts, errors, rounds)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The migration, as redis-cli --cluster reshard does it, a few keys at a time.
    let (mut to_source, _to_target) =
        begin_migration(s, (&source, &source_id), (&target, &target_id)).await;
    let (host, port) = target.rsplit_once(':').unwrap();
    let mut empty_rounds = 0;
    while empty_rounds < 3 {
        let keys = match to_source
            .call(&["CLUSTER", "GETKEYSINSLOT", &s.to_string(), "3"])
            .await
        {
            r if r == b"*0\r\n" => Vec::new(),
            r => common::split_frames(&r[4..]).0,
        };
        if keys.is_empty() {
            empty_rounds += 1;
        } else {
            let names: Vec<String> = keys
                .iter()
                .map(|f| {
                    let text = String::from_utf8_lossy(f).to_string();
                    text.split("\r\n").nth(1).unwrap().to_string()
                })
                .collect();
            let mut migrate = vec!["MIGRATE", host, port, "", "0", "5000", "KEYS"];
            migrate.extend(names.iter().map(String::as_str));
            assert_eq!(to_source.call(&migrate[..]).await, b"+OK\r\n");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    end_migration(&redis, s, (&source, &target), &target_id).await;
    // Pipelines keep going while the proxy learns the new owner from MOVED.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);

    let mut c = Raw::connect(proxy.addr).await;
    let mut all_errors = Vec::new();
    for client in clients {
        let (counts, errors, rounds) = client.await.unwrap();
        eprintln!("client: {rounds} pipelines of 100 INCRs");
        all_errors.extend(errors);
        for (k, n) in counts {
            let got = c.call(&["GET", &k]).await;
            assert_eq!(
                show(&got),
                show(format!("${}\r\n{n}\r\n", n.to_string().len()).as_bytes()),
                "{k}"
            );
        }
    }
    assert!(all_errors.is_empty(), "{all_errors:?}");
    let on_target = Raw::connect(&target)
        .await
        .call(&["CLUSTER", "COUNTKEYSINSLOT", &s.to_string()])
        .await;
    assert_eq!(on_target, b":12\r\n");
    proxy.stop().await;
}

/// The per-slot rule, made to matter: a command for a slot in flight on a stalled old owner
/// must not be sent to the new owner the proxy learned meanwhile, or it would run first.
#[tokio::test]
async fn a_command_waits_for_its_slot_in_flight_on_the_old_owner() {
    let redis = RedisCluster::start_with(3, 0, &["--enable-debug-command", "yes"]);
    let k = "{ord}k";
    let s = slot(k.as_bytes());
    let old = redis.primary_for_slot(s);
    let primaries = redis.primaries();
    let new = primaries.iter().find(|p| **p != old).unwrap().clone();
    let seed = new.clone();
    // A short connect timeout: the refresh below skips the stalled node quickly.
    let text = format!(
        "upstream:\n  mode: cluster\n  connect_timeout_ms: 100\n  cluster:\n    seeds: [{seed}]\n    refresh_interval_ms: 600000\n"
    );
    let config =
        redis_policy_proxy::setup::from_yaml(&text, Path::new("cluster-test.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut x = Raw::connect(proxy.addr).await;
    assert_eq!(x.call(&["INCR", k]).await, b":1\r\n");

    // The slot moves with its key; the proxy's map still names the old owner.
    let (old_id, new_id) = (node_id(&redis, &old), node_id(&redis, &new));
    let (mut to_old, _to_new) = begin_migration(s, (&old, &old_id), (&new, &new_id)).await;
    let (host, port) = new.rsplit_once(':').unwrap();
    let migrate = ["MIGRATE", host, port, k, "0", "5000"];
    assert_eq!(to_old.call(&migrate).await, b"+OK\r\n");
    for p in &primaries {
        let reply = Raw::connect(p)
            .await
            .request(&setslot(s, "NODE", &new_id), 1)
            .await;
        assert_eq!(reply, b"+OK\r\n", "{p}");
    }

    // An empty slot elsewhere changes owner too (done now: the stalled node could not
    // answer), for another client to teach the proxy the new map below: its MOVED makes the
    // proxy refresh from the nodes that answer.
    let other = primaries.iter().find(|p| **p != old && **p != new).unwrap();
    let s2 = (0..16384u16)
        .find(|&n| redis.primary_for_slot(n) == *other)
        .unwrap();
    for p in &primaries {
        let reply = Raw::connect(p)
            .await
            .request(&setslot(s2, "NODE", &new_id), 1)
            .await;
        assert_eq!(reply, b"+OK\r\n", "{p}");
    }
    let key2 = (0..)
        .map(|i| format!("s2:{i}"))
        .find(|key| slot(key.as_bytes()) == s2)
        .unwrap();
    // The old owner stalls with this client's INCR queued on it.
    let mut sleeper = Raw::connect(&old).await;
    sleeper.send(&resp(&["DEBUG", "SLEEP", "3"])).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    x.send(&resp(&["INCR", k])).await;

    let mut y = Raw::connect(proxy.addr).await;
    assert_eq!(y.call(&["GET", &key2]).await, b"$-1\r\n");
    tokio::time::sleep(Duration::from_millis(1000)).await;

    // The second INCR must wait for the first, which the old owner answers with MOVED when
    // it wakes up; the proxy then sends it to the new owner.
    x.send(&resp(&["INCR", k])).await;
    let replies = x.read_frames(2).await.concat();
    assert_eq!(show(&replies), show(b":2\r\n:3\r\n"));
    assert_eq!(sleeper.read_frame().await, b"+OK\r\n");
    proxy.stop().await;
}

/// The replies to one read's commands reach the client in one write, as one Redis writes
/// them, even when its nodes answer at different times: a pipeline scattered over three
/// nodes cost the client a write and a wake-up per node (and the proxy a third of its CPU per
/// request at `-P 16`, docs/performance.md). Here one node is paused, so the other node's
/// reply comes first by a second; it was written alone before.
#[tokio::test]
async fn one_reads_replies_go_out_together_when_nodes_answer_apart() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(cluster_config(&redis.live_addrs()[0])).await;
    let key_on = |node: &str| {
        (0..)
            .map(|i| format!("apart:{i}"))
            .find(|k| redis.primary_for_slot(slot(k.as_bytes())) == node)
            .unwrap()
    };
    let primaries = redis.primaries();
    let (fast, slow) = (key_on(&primaries[0]), key_on(&primaries[1]));
    let mut client = Raw::connect(proxy.addr).await;
    // Both nodes' connections exist before the pause.
    assert_eq!(client.call(&["SET", &fast, "f"]).await, b"+OK\r\n");
    assert_eq!(client.call(&["SET", &slow, "s"]).await, b"+OK\r\n");

    let mut pauser = Raw::connect(&primaries[1]).await;
    assert_eq!(pauser.call(&["CLIENT", "PAUSE", "1000"]).await, b"+OK\r\n");
    let started = Instant::now();
    client
        .send(&[resp(&["GET", &fast]), resp(&["GET", &slow])].concat())
        .await;
    let mut first = vec![0u8; 4096];
    let n = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read(&mut client.stream, &mut first),
    )
    .await
    .expect("replies within 10 s")
    .expect("a read");
    assert_eq!(
        show(&first[..n]),
        show(b"$1\r\nf\r\n$1\r\ns\r\n"),
        "the first read holds both replies"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the paused node answered the pipeline"
    );
    proxy.stop().await;
}
