//! `mirror:` with real redis-servers: the writes the primary acknowledged reach the mirror as
//! the primary ran them (rewrites, transactions, databases, blocking pops), refused and
//! aborted ones do not; a stopped or dead mirror costs the clients nothing; shadow reads catch
//! a planted difference; the phases change by reload.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server processes in wall-clock time"
)]

mod common;

use std::time::Instant;

use common::process::{ProxyProcess, run_bin};
use common::{DEADLINE, POLL, Raw, RedisServer, TempDir, write_file};

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

/// The proxy's `INFO proxy` field `name`.
async fn info_field(proxy: &mut Raw, name: &str) -> String {
    let info = text(&proxy.call(&["INFO", "proxy"]).await);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {info}"))
        .to_string()
}

/// Waits until `redis` answers `args` with `want`: the mirror is written a little after the
/// primary answered.
async fn wait_for(redis: &RedisServer, args: &[&str], want: &[u8]) {
    let until = Instant::now() + DEADLINE;
    loop {
        let got = redis.direct(args).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < until,
            "{args:?} on {}: {} (want {})",
            redis.addr(),
            text(&got),
            text(want)
        );
        tokio::time::sleep(POLL).await;
    }
}

fn mirror_section(mirror: &RedisServer, compare: Option<&str>) -> String {
    let compare = compare.map_or(String::new(), |share| {
        format!("  compare:\n    share: {share}\n")
    });
    format!(
        "mirror:\n  upstream:\n    address: {}\n{compare}",
        mirror.addr()
    )
}

#[tokio::test]
async fn writes_reach_the_mirror_as_the_primary_ran_them() {
    let primary = RedisServer::start();
    let mirror = RedisServer::start();
    let tmp = TempDir::new("mirror-writes");
    // A TTL rule: the mirror gets the rewritten SET (with the TTL the policy added).
    let policy = write_file(
        tmp.path(),
        "p.yaml",
        &format!(
            "upstream:\n  address: {}\n{}rules:\n  - id: ttl\n    ttl:\n      default: none\n      prefixes:\n        - {{prefix: \"cache:\", ttl: 1000s}}\n      keys: created\n",
            primary.addr(),
            mirror_section(&mirror, None)
        ),
    );
    let proxy = ProxyProcess::start(&policy, &primary, tmp.path().join("log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    // A key the primary holds as a string: LPUSH to it fails there, and must not be mirrored
    // (the mirror, without the key, would run it).
    primary.direct(&["SET", "str", "x"]).await;
    assert_eq!(c.call(&["SET", "plain", "1"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "cache:page", "html"]).await, b"+OK\r\n");
    assert!(text(&c.call(&["LPUSH", "str", "a"]).await).starts_with("-WRONGTYPE"));
    // Pipelined writes and reads in one batch.
    let out = c
        .request(
            &common::resp_cmds(&["INCR n", "GET plain", "HSET h f v", "RPUSH q a b c"]),
            4,
        )
        .await;
    assert_eq!(text(&out), ":1\r\n$1\r\n1\r\n:1\r\n:3\r\n");
    // A transaction that ran, and one WATCH aborted.
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "tx", "1"]).await, b"+QUEUED\r\n");
    assert_eq!(c.call(&["INCR", "n"]).await, b"+QUEUED\r\n");
    assert_eq!(c.call(&["EXEC"]).await, b"*2\r\n+OK\r\n:2\r\n");
    assert_eq!(c.call(&["WATCH", "w"]).await, b"+OK\r\n");
    primary.direct(&["SET", "w", "changed"]).await;
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "aborted", "1"]).await, b"+QUEUED\r\n");
    assert_eq!(c.call(&["EXEC"]).await, b"*-1\r\n");
    // A blocking pop, mirrored as the pop it was.
    assert_eq!(
        c.call(&["BLPOP", "empty", "q", "1"]).await,
        b"*2\r\n$1\r\nq\r\n$1\r\na\r\n"
    );
    // Another database.
    let mut other = Raw::connect(proxy.addr()).await;
    assert_eq!(other.call(&["SELECT", "2"]).await, b"+OK\r\n");
    assert_eq!(other.call(&["SET", "in2", "x"]).await, b"+OK\r\n");
    // RESET (answered by the proxy) takes the client back to database 0, on the mirror too.
    assert_eq!(other.call(&["RESET"]).await, b"+RESET\r\n");
    assert_eq!(other.call(&["SET", "after_reset", "x"]).await, b"+OK\r\n");
    drop(other);
    assert_eq!(c.call(&["SET", "done", "1"]).await, b"+OK\r\n");

    wait_for(&mirror, &["GET", "done"], b"$1\r\n1\r\n").await;
    assert_eq!(mirror.direct(&["GET", "plain"]).await, b"$1\r\n1\r\n");
    assert_eq!(
        mirror.direct(&["GET", "cache:page"]).await,
        b"$4\r\nhtml\r\n"
    );
    let ttl = text(&mirror.direct(&["TTL", "cache:page"]).await);
    let ttl: i64 = ttl.trim().trim_start_matches(':').parse().unwrap();
    assert!(
        (990..=1000).contains(&ttl),
        "the policy's TTL on the mirror: {ttl}"
    );
    assert_eq!(
        mirror.direct(&["EXISTS", "str"]).await,
        b":0\r\n",
        "refused write"
    );
    assert_eq!(mirror.direct(&["GET", "n"]).await, b"$1\r\n2\r\n");
    assert_eq!(mirror.direct(&["HGET", "h", "f"]).await, b"$1\r\nv\r\n");
    assert_eq!(mirror.direct(&["GET", "tx"]).await, b"$1\r\n1\r\n");
    assert_eq!(
        mirror.direct(&["EXISTS", "aborted"]).await,
        b":0\r\n",
        "aborted EXEC"
    );
    assert_eq!(
        mirror.direct(&["LRANGE", "q", "0", "-1"]).await,
        b"*2\r\n$1\r\nb\r\n$1\r\nc\r\n",
        "BLPOP popped on the mirror too"
    );
    let mut m2 = mirror.raw().await;
    assert_eq!(m2.call(&["SELECT", "2"]).await, b"+OK\r\n");
    assert_eq!(m2.call(&["GET", "in2"]).await, b"$1\r\nx\r\n");
    assert_eq!(
        mirror.direct(&["EXISTS", "in2"]).await,
        b":0\r\n",
        "not in db 0"
    );
    assert_eq!(
        mirror.direct(&["GET", "after_reset"]).await,
        b"$1\r\nx\r\n",
        "after RESET, in db 0"
    );
    assert_eq!(info_field(&mut c, "proxy_mirror_phase").await, "writes");
    assert_eq!(info_field(&mut c, "proxy_mirror_dropped").await, "0");
    assert_eq!(info_field(&mut c, "proxy_mirror_errors").await, "0");
}

#[tokio::test]
async fn a_stopped_or_dead_mirror_costs_the_clients_nothing() {
    let primary = RedisServer::start();
    let mut mirror = RedisServer::start();
    let tmp = TempDir::new("mirror-dead");
    let policy = write_file(
        tmp.path(),
        "p.yaml",
        &format!(
            "upstream:\n  address: {}\n{}    command_timeout_ms: 1000\n  max_queue_bytes: 1000000\n",
            primary.addr(),
            mirror_section(&mirror, None)
        ),
    );
    let proxy = ProxyProcess::start(&policy, &primary, tmp.path().join("log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["SET", "before", "1"]).await, b"+OK\r\n");
    wait_for(&mirror, &["GET", "before"], b"$1\r\n1\r\n").await;
    // Stopped (a mirror that stalls): every client command is still answered by the primary.
    mirror.signal("-STOP");
    let value = "v".repeat(1000);
    for round in 0..4 {
        let mut batch = Vec::new();
        for i in 0..500 {
            batch.extend(common::resp(&["SET", &format!("k:{round}:{i}"), &value]));
        }
        let out = c.request(&batch, 500).await;
        assert_eq!(out, b"+OK\r\n".repeat(500), "round {round}");
    }
    mirror.signal("-CONT");
    // Dead: the same.
    mirror.kill();
    for i in 0..200 {
        assert_eq!(
            c.call(&["SET", &format!("dead:{i}"), "1"]).await,
            b"+OK\r\n"
        );
    }
    // What the mirror missed is counted, never silent.
    let until = Instant::now() + DEADLINE;
    loop {
        let dropped: u64 = info_field(&mut c, "proxy_mirror_dropped")
            .await
            .parse()
            .unwrap();
        if dropped > 0 {
            break;
        }
        assert!(Instant::now() < until, "nothing counted as dropped");
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(primary.direct(&["DBSIZE"]).await, b":2201\r\n");
}

#[tokio::test]
async fn shadow_reads_catch_a_planted_difference() {
    let primary = RedisServer::start();
    let mirror = RedisServer::start();
    let tmp = TempDir::new("mirror-compare");
    let policy = write_file(
        tmp.path(),
        "p.yaml",
        &format!(
            "upstream:\n  address: {}\n{}",
            primary.addr(),
            mirror_section(&mirror, Some("100%"))
        ),
    );
    let admin = format!("127.0.0.1:{}", common::free_port());
    let proxy = ProxyProcess::start(
        &policy,
        &primary,
        tmp.path().join("log"),
        &["--admin", &admin],
    )
    .await;
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["SET", "user:1", "alice"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "user:2", "bob"]).await, b"+OK\r\n");
    assert_eq!(
        c.call(&["SADD", "set:s", "a", "b", "c", "d"]).await,
        b":4\r\n"
    );
    wait_for(&mirror, &["GET", "user:2"], b"$3\r\nbob\r\n").await;
    // The planted difference.
    mirror.direct(&["SET", "user:2", "mallory"]).await;
    assert_eq!(c.call(&["GET", "user:1"]).await, b"$5\r\nalice\r\n");
    assert_eq!(
        c.call(&["GET", "user:2"]).await,
        b"$3\r\nbob\r\n",
        "the primary answers"
    );
    assert!(text(&c.call(&["SMEMBERS", "set:s"]).await).starts_with("*4"));
    let until = Instant::now() + DEADLINE;
    while info_field(&mut c, "proxy_mirror_compared").await != "3" {
        assert!(Instant::now() < until, "reads not compared");
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(info_field(&mut c, "proxy_mirror_divergent").await, "1");
    assert_eq!(info_field(&mut c, "proxy_mirror_phase").await, "compare");
    let (status, ready) = common::http_get(admin.parse().unwrap(), "/readyz").await;
    assert_eq!(status, 200, "{ready}");
    assert!(
        ready.contains(&format!(
            "mirror {} (writes, and 100% of reads compared)",
            mirror.addr()
        )) && ready.contains("3 reads compared, 1 divergent"),
        "{ready}"
    );
    proxy
        .wait_for_log("the mirror answered a read differently", 1)
        .await;
    let log = proxy.log_text();
    assert!(log.contains("user:2"), "the key is named: {log}");
    assert!(
        !log.contains("mallory") && !log.contains("bob"),
        "never values: {log}"
    );
}

#[tokio::test]
async fn phases_change_by_reload() {
    let primary = RedisServer::start();
    let mirror = RedisServer::start();
    let tmp = TempDir::new("mirror-reload");
    let base = format!(
        "upstream:\n  address: {}\naccess:\n  admin_tenants: [default]\n",
        primary.addr()
    );
    let policy = write_file(tmp.path(), "p.yaml", &base);
    let proxy = ProxyProcess::start(&policy, &primary, tmp.path().join("log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["SET", "a", "1"]).await, b"+OK\r\n");
    // Primary only → writes.
    write_file(
        tmp.path(),
        "p.yaml",
        &format!("{base}{}", mirror_section(&mirror, None)),
    );
    let reply = text(&c.call(&["PROXY", "RELOAD"]).await);
    assert!(reply.contains("mirroring to"), "{reply}");
    assert_eq!(info_field(&mut c, "proxy_mirror_phase").await, "writes");
    assert_eq!(c.call(&["SET", "b", "1"]).await, b"+OK\r\n");
    wait_for(&mirror, &["GET", "b"], b"$1\r\n1\r\n").await;
    assert_eq!(mirror.direct(&["EXISTS", "a"]).await, b":0\r\n");
    // Writes → compare.
    write_file(
        tmp.path(),
        "p.yaml",
        &format!("{base}{}", mirror_section(&mirror, Some("100%"))),
    );
    let _ = c.call(&["PROXY", "RELOAD"]).await;
    assert_eq!(info_field(&mut c, "proxy_mirror_phase").await, "compare");
    assert_eq!(c.call(&["GET", "b"]).await, b"$1\r\n1\r\n");
    let until = Instant::now() + DEADLINE;
    while info_field(&mut c, "proxy_mirror_compared").await != "1" {
        assert!(Instant::now() < until, "the read was not compared");
        tokio::time::sleep(POLL).await;
    }
    // Compare → primary only.
    write_file(tmp.path(), "p.yaml", &base);
    let reply = text(&c.call(&["PROXY", "RELOAD"]).await);
    assert!(reply.contains("mirror stopped"), "{reply}");
    assert_eq!(info_field(&mut c, "proxy_mirror_phase").await, "off");
    assert_eq!(c.call(&["SET", "c", "1"]).await, b"+OK\r\n");
    assert_eq!(mirror.direct(&["EXISTS", "c"]).await, b":0\r\n");
}

#[tokio::test]
async fn check_names_each_mirror_problem_and_passes_the_example() {
    let tmp = TempDir::new("mirror-check");
    let bad = write_file(
        tmp.path(),
        "bad.yaml",
        "upstream:\n  address: 127.0.0.1:6379\nmirror:\n  upstream:\n    address: 127.0.0.1:6379\n  compare:\n    share: 200%\n",
    );
    let run = run_bin(&["--check", bad.to_str().unwrap()], &[]).await;
    assert_ne!(run.code, Some(0));
    let all = format!("{}{}", run.stdout, run.stderr);
    assert!(
        all.contains("mirror.upstream.address") && all.contains("the primary itself"),
        "{all}"
    );
    assert!(
        all.contains("mirror.compare.share") && all.contains("200%"),
        "{all}"
    );
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/policy/examples/migration.yaml"
    );
    let run = run_bin(&["--check", example], &[]).await;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
}

/// One client of the load: writes its own keys over and over and remembers the last value
/// each key was acknowledged with; counts every reply that is not the expected one.
async fn load_client(
    addr: String,
    client: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    counting: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (std::collections::BTreeMap<String, String>, u64, Vec<String>) {
    use std::sync::atomic::Ordering;
    let mut c = Raw::connect(&addr).await;
    let mut last = std::collections::BTreeMap::new();
    let mut increments = 0u64;
    let mut wrong = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let key = format!("load:{client}:{}", i % 40);
        let value = format!("{client}-{i}");
        let reply = c.call(&["SET", &key, &value]).await;
        if reply == b"+OK\r\n" {
            last.insert(key, value);
        } else {
            wrong.push(text(&reply));
        }
        // Counters only once the mirror gets every write (a relative write to a key that
        // existed before mirroring began is what backfill cannot reconcile; docs/migration.md).
        if counting.load(Ordering::SeqCst) {
            let reply = c.call(&["INCR", &format!("counter:{client}")]).await;
            if reply.first() == Some(&b':') {
                increments += 1;
            } else {
                wrong.push(text(&reply));
            }
        }
        i += 1;
    }
    (last, increments, wrong)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_under_load_moves_every_key_and_switches_by_reload() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let old = RedisServer::start();
    // Redis 7.0 to Valkey 9 where the server matrix is built (CI), else to a second Redis.
    let new = match common::matrix_server("valkey-9.1") {
        Some(valkey) => RedisServer::start_binary(&valkey, &[]),
        None => RedisServer::start(),
    };
    common::keys::fill(&old, 300).await;
    let tmp = TempDir::new("mirror-migration");
    let admin = "access:\n  admin_tenants: [default]\n";
    let phase = |primary: &RedisServer, mirror: Option<(&RedisServer, Option<&str>)>| {
        let mirror = mirror.map_or(String::new(), |(m, compare)| mirror_section(m, compare));
        format!("upstream:\n  address: {}\n{admin}{mirror}", primary.addr())
    };
    let policy = write_file(tmp.path(), "p.yaml", &phase(&old, None));
    let proxy = ProxyProcess::start_as_filed(&policy, tmp.path().join("log")).await;
    let addr = proxy.addr();
    let (stop, counting) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let clients: Vec<_> = (0..4)
        .map(|i| tokio::spawn(load_client(addr.clone(), i, stop.clone(), counting.clone())))
        .collect();
    // redis-benchmark beside them, through every phase (SETs of random keys).
    let port = proxy.port.to_string();
    let bench = tokio::process::Command::new("redis-benchmark")
        .args([
            "-p", &port, "-t", "set", "-r", "500", "-n", "60000", "-c", "4", "-q",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("redis-benchmark (redis-tools)");
    let mut c = Raw::connect(&addr).await;
    // 1. Primary only → 2. writes mirrored.
    write_file(tmp.path(), "p.yaml", &phase(&old, Some((&new, None))));
    let r = text(&c.call(&["PROXY", "RELOAD"]).await);
    assert!(r.contains("mirroring to"), "{r}");
    counting.store(true, Ordering::SeqCst);
    // The keys written before: copied while the writes flow.
    let run = run_bin(
        &[
            "-c",
            policy.to_str().unwrap(),
            "backfill",
            "--to",
            &new.addr(),
        ],
        &[],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    // 3. Reads compared.
    write_file(
        tmp.path(),
        "p.yaml",
        &phase(&old, Some((&new, Some("10%")))),
    );
    let _ = text(&c.call(&["PROXY", "RELOAD"]).await);
    assert_eq!(info_field(&mut c, "proxy_mirror_phase").await, "compare");
    // The guide's patterns meanwhile (a Lua rate limit, a stream read by a consumer group,
    // pub/sub): answered as without a mirror, their keys compared at the end.
    let mut patterns = Raw::connect(&addr).await;
    common::guide_patterns(&mut patterns, addr.parse().unwrap(), "during the migration").await;
    // 4. The switch: the new server answers, the old one is the mirror (a way back).
    write_file(tmp.path(), "p.yaml", &phase(&new, Some((&old, None))));
    let r = text(&c.call(&["PROXY", "RELOAD"]).await);
    assert!(r.contains("switching the upstream"), "{r}");
    proxy.wait_for_log("cutover: switched", 1).await;
    assert_eq!(info_field(&mut c, "proxy_upstream").await, new.addr());
    let switch = info_field(&mut c, "proxy_upstream_switch").await;
    assert!(switch.starts_with("switched from"), "{switch}");
    println!("{switch}");
    let before: u64 = new.command_calls("set").await;
    // Writes now reach the new server first.
    let until = Instant::now() + DEADLINE;
    while new.command_calls("set").await < before + 100 {
        assert!(Instant::now() < until, "no load on the new server");
        tokio::time::sleep(POLL).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut acknowledged = std::collections::BTreeMap::new();
    let mut increments = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let (last, n, wrong) = client.await.unwrap();
        assert!(wrong.is_empty(), "client {i} saw {wrong:?}");
        acknowledged.extend(last);
        increments.push((i, n));
    }
    let bench = bench.wait_with_output().await.unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&bench.stdout),
        String::from_utf8_lossy(&bench.stderr)
    );
    // redis-benchmark stops at the first error reply.
    assert!(
        bench.status.success() && out.contains("requests per second") && !out.contains("Error"),
        "redis-benchmark: {out}"
    );
    // 5. Primary only: the mirror stops once it has everything.
    write_file(tmp.path(), "p.yaml", &phase(&new, None));
    let _ = c.call(&["PROXY", "RELOAD"]).await;
    assert_eq!(info_field(&mut c, "proxy_mirror_dropped").await, "0");
    assert_eq!(info_field(&mut c, "proxy_mirror_errors").await, "0");
    // Nothing acknowledged is lost, on either server; both hold the same keys.
    for (key, value) in &acknowledged {
        let want = format!("${}\r\n{value}\r\n", value.len());
        assert_eq!(
            text(&new.direct(&["GET", key]).await),
            want,
            "{key} on the new server"
        );
        wait_for(&old, &["GET", key], want.as_bytes()).await;
    }
    for (client, n) in increments {
        let want = format!("${}\r\n{n}\r\n", n.to_string().len());
        let key = format!("counter:{client}");
        assert_eq!(text(&new.direct(&["GET", &key]).await), want, "{key}");
        wait_for(&old, &["GET", &key], want.as_bytes()).await;
    }
    common::keys::assert_same(&new, &old, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_managed_mirror_is_followed_through_its_failover() {
    use common::sentinel::{MASTER, SentinelSetup};
    let primary = RedisServer::start();
    let setup = SentinelSetup::start();
    let tmp = TempDir::new("mirror-sentinel");
    let policy = write_file(
        tmp.path(),
        "p.yaml",
        &format!(
            "upstream:\n  address: {}\nmirror:\n  upstream:\n    mode: sentinel\n    sentinel:\n      sentinels: [{}]\n      master_name: {MASTER}\n      timeout_ms: 500\n    reconnect_min_ms: 10\n    reconnect_max_ms: 200\n",
            primary.addr(),
            setup.sentinel_addrs().join(", ")
        ),
    );
    let proxy = ProxyProcess::start(&policy, &primary, tmp.path().join("log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["SET", "before", "1"]).await, b"+OK\r\n");
    wait_for(&setup.primary, &["GET", "before"], b"$1\r\n1\r\n").await;
    assert!(
        info_field(&mut c, "proxy_mirror")
            .await
            .starts_with("sentinel:"),
        "the mirror is named by its Sentinel group"
    );
    // The mirror's primary fails over: the writes that follow reach the new one.
    setup.failover();
    let until = Instant::now() + DEADLINE * 3;
    let mut i = 0;
    loop {
        i += 1;
        assert_eq!(c.call(&["SET", "after", &i.to_string()]).await, b"+OK\r\n");
        let want = format!("${}\r\n{i}\r\n", i.to_string().len());
        if setup.replica.direct(&["GET", "after"]).await == want.as_bytes() {
            break;
        }
        assert!(
            Instant::now() < until,
            "writes never reached the new mirror primary"
        );
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(
        setup.replica.direct(&["GET", "before"]).await,
        b"$1\r\n1\r\n"
    );
}

/// A Redis Cluster as the mirror (a standalone → cluster migration): each acknowledged write
/// lands on the node that owns its key's slot; a transaction on one slot runs there; scripts
/// loaded reach every primary (an EVALSHA then runs wherever its key is); a write in another
/// database is skipped (a cluster has database 0 only); a multi-key write across slots is
/// refused by the cluster and counted as a mirror error; a slot moved behind the mirror's
/// back is followed (`-MOVED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_mirror_gets_each_write_on_the_node_that_owns_its_key() {
    use common::cluster::{RedisCluster, end_migration, node_id, other_primary};
    let primary = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let seed = cluster.primaries()[0].clone();
    let tmp = TempDir::new("mirror-cluster");
    // The mirror's map is refreshed rarely, so the moved slot below is learned from -MOVED.
    let policy = write_file(
        tmp.path(),
        "p.yaml",
        &format!(
            "upstream:\n  address: {}\nmirror:\n  upstream:\n    mode: cluster\n    cluster:\n      seeds: [{seed}]\n      refresh_interval_ms: 600000\n",
            primary.addr()
        ),
    );
    let proxy = ProxyProcess::start(&policy, &primary, tmp.path().join("log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    let primaries = cluster.primaries();
    let keys: Vec<String> = primaries.iter().map(|p| cluster.key_on(p, "k")).collect();
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(c.call(&["SET", key, &i.to_string()]).await, b"+OK\r\n");
    }
    let out = c
        .request(
            &common::resp_cmds(&[
                &format!("INCR {}", keys[0]),
                &format!("HSET h:{} f v", keys[1]),
                "MULTI",
                "SET {t}a 1",
                "INCR {t}b",
                "EXEC",
            ]),
            6,
        )
        .await;
    assert_eq!(
        text(&out),
        ":1\r\n:1\r\n+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:1\r\n"
    );
    let sha = load_set_script(&mut c).await;
    assert_eq!(
        c.call(&["EVALSHA", &sha, "1", "scripted", "s"]).await,
        b"+OK\r\n"
    );
    // Skipped: database 2 does not exist on a cluster.
    let mut other = Raw::connect(proxy.addr()).await;
    assert_eq!(other.call(&["SELECT", "2"]).await, b"+OK\r\n");
    assert_eq!(other.call(&["SET", "in2", "x"]).await, b"+OK\r\n");
    // RESET (answered by the proxy) takes the client back to database 0, on the mirror too.
    assert_eq!(other.call(&["RESET"]).await, b"+RESET\r\n");
    assert_eq!(other.call(&["SET", "after_reset", "x"]).await, b"+OK\r\n");
    drop(other);
    // Refused by the cluster (CROSSSLOT), counted as a mirror error.
    assert_eq!(
        c.call(&["MSET", &keys[0], "m", &keys[1], "m"]).await,
        b"+OK\r\n"
    );
    // Move an empty slot to another primary behind the mirror's back, then write to it.
    let moved_from = primaries[2].clone();
    let moved = cluster.key_on(&moved_from, "moved");
    let slot = redis_policy_proxy::cluster::slot(moved.as_bytes());
    let to = other_primary(&cluster, &moved_from);
    end_migration(&cluster, slot, (&moved_from, &to), &node_id(&cluster, &to)).await;
    assert_eq!(c.call(&["SET", &moved, "here"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", &keys[2], "done"]).await, b"+OK\r\n");

    // Each key on the node that owns it.
    let on = |addr: &str, args: &[&str]| -> String {
        let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
        match cluster.query(port, args) {
            Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
            Ok(redis::Value::Int(n)) => n.to_string(),
            Ok(redis::Value::Array(items)) => format!("{items:?}"),
            Ok(redis::Value::Nil) => "nil".to_string(),
            Ok(other) => format!("{other:?}"),
            Err(e) => format!("error: {e}"),
        }
    };
    let owner =
        |key: &str| cluster.primary_for_slot(redis_policy_proxy::cluster::slot(key.as_bytes()));
    let until = Instant::now() + common::DEADLINE;
    while on(&owner(&keys[2]), &["GET", &keys[2]]) != "done" {
        assert!(
            Instant::now() < until,
            "the last write never reached the mirror"
        );
        tokio::time::sleep(POLL).await;
    }
    let mut mc = Raw::connect(proxy.addr()).await;
    assert_eq!(
        info_field(&mut mc, "proxy_mirror_errors").await,
        "1",
        "the cross-slot MSET, only"
    );
    assert_eq!(on(&owner(&keys[0]), &["GET", &keys[0]]), "1");
    assert_eq!(on(&owner(&keys[1]), &["GET", &keys[1]]), "1");
    let h = format!("h:{}", keys[1]);
    assert_eq!(on(&owner(&h), &["HGET", &h, "f"]), "v");
    assert_eq!(on(&owner("{t}a"), &["GET", "{t}a"]), "1");
    assert_eq!(on(&owner("{t}b"), &["GET", "{t}b"]), "1");
    assert_eq!(on(&owner("scripted"), &["GET", "scripted"]), "s");
    assert_eq!(owner(&moved), to);
    assert_eq!(
        on(&to, &["GET", &moved]),
        "here",
        "the moved slot's key on its new owner"
    );
    for p in &primaries {
        assert!(
            on(p, &["SCRIPT", "EXISTS", &sha]) == "[int(1)]",
            "SCRIPT LOAD on {p}: {}",
            on(p, &["SCRIPT", "EXISTS", &sha])
        );
    }
    assert_eq!(
        on(&owner("in2"), &["EXISTS", "in2"]),
        "0",
        "database 2's write"
    );
}

/// A Redis Cluster as the primary (a cluster → standalone migration, or a check that a new
/// server holds what the cluster holds): every write the cluster acknowledged reaches the
/// mirror, whichever path the proxy took to run it. A pipeline over keys of every node
/// (batches per node, replies cut back into the client's order), an `MSET` and a `DEL` split
/// by slot (the mirror gets the parts), `FLUSHALL` and `SCRIPT LOAD` sent to every primary
/// (the mirror gets them once), a transaction, scripts and a blocking pop on dedicated
/// connections, and a write whose slot moved behind the proxy's back (followed through
/// `-MOVED`). A write the cluster refused is not mirrored. At the end every key is the same,
/// `DUMP` for `DUMP`, and the mirror refused nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_primary_mirrors_every_acknowledged_write() {
    use common::cluster::{RedisCluster, end_migration, node_id, other_primary};
    let cluster = RedisCluster::start(3, 0);
    let mirror = RedisServer::start();
    let seed = cluster.primaries()[0].clone();
    let tmp = TempDir::new("mirror-cluster-primary");
    // The proxy's map is refreshed rarely, so the moved slot below is learned from -MOVED.
    let policy = write_file(
        tmp.path(),
        "p.yaml",
        &format!(
            "upstream:\n  mode: cluster\n  cluster:\n    seeds: [{seed}]\n    refresh_interval_ms: 600000\nmirror:\n  upstream:\n    address: {}\n",
            mirror.addr()
        ),
    );
    // On the mirror only: FLUSHALL through the proxy must remove it.
    assert_eq!(mirror.direct(&["SET", "stale", "x"]).await, b"+OK\r\n");
    let proxy = ProxyProcess::start_as_filed(&policy, tmp.path().join("log")).await;
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["FLUSHALL"]).await, b"+OK\r\n");
    wait_for(&mirror, &["EXISTS", "stale"], b":0\r\n").await;

    let primaries = cluster.primaries();
    let keys: Vec<String> = primaries.iter().map(|p| cluster.key_on(p, "k")).collect();
    let (a, b, d) = (&keys[0], &keys[1], &keys[2]);
    // One pipeline alternating between the nodes: one batch per node.
    let out = c
        .request(
            &common::resp_cmds(&[
                &format!("SET {a} 1"),
                &format!("SET {b} 2"),
                &format!("INCR {a}"),
                &format!("SET {d} 3"),
                &format!("RPUSH l:{b} x y z"),
                &format!("GET {d}"),
                &format!("HSET h:{d} f v g w"),
            ]),
            7,
        )
        .await;
    assert_eq!(
        text(&out),
        "+OK\r\n+OK\r\n:2\r\n+OK\r\n:3\r\n$1\r\n3\r\n:2\r\n"
    );
    // Split by slot.
    let split: Vec<String> = keys.iter().map(|k| format!("m:{k}")).collect();
    assert_eq!(
        c.call(&["MSET", &split[0], "0", &split[1], "1", &split[2], "2"])
            .await,
        b"+OK\r\n"
    );
    assert_eq!(c.call(&["DEL", &split[0], &split[1]]).await, b":2\r\n");
    // A transaction on one slot, a refused write, scripts, a blocking pop.
    transaction(&mut c, "{t}a", "{t}b").await;
    assert_eq!(c.call(&["INCR", "l:{t}"]).await, b":1\r\n");
    assert!(
        c.call(&["LPUSH", "l:{t}", "x"])
            .await
            .starts_with(b"-WRONGTYPE")
    );
    let sha = load_set_script(&mut c).await;
    for (i, k) in keys.iter().enumerate() {
        let key = format!("s:{k}");
        assert_eq!(
            c.call(&["EVALSHA", &sha, "1", &key, &i.to_string()]).await,
            b"+OK\r\n"
        );
    }
    assert_eq!(
        c.call(&["EVAL", "return redis.call('incrby', KEYS[1], 5)", "1", "e"])
            .await,
        b":5\r\n"
    );
    let popped = c.call(&["BLPOP", &format!("l:{b}"), "1"]).await;
    assert!(text(&popped).ends_with("$1\r\nx\r\n"), "{}", text(&popped));
    // A slot moved behind the proxy's back: the node answers -MOVED, the proxy follows.
    let moved_from = primaries[2].clone();
    let moved = cluster.key_on(&moved_from, "moved");
    let slot = redis_policy_proxy::cluster::slot(moved.as_bytes());
    let to = other_primary(&cluster, &moved_from);
    end_migration(&cluster, slot, (&moved_from, &to), &node_id(&cluster, &to)).await;
    assert_eq!(c.call(&["SET", &moved, "here"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "done", "1"]).await, b"+OK\r\n");
    wait_for(&mirror, &["GET", "done"], b"$1\r\n1\r\n").await;

    // The same keys, each the same to the byte.
    let mut names: Vec<String> = Vec::new();
    for p in &primaries {
        let mut node = Raw::connect(p).await;
        let all = text(&node.call(&["KEYS", "*"]).await);
        names.extend(
            all.lines()
                .filter(|l| !l.starts_with(['*', '$']))
                .map(str::to_string),
        );
    }
    names.sort();
    let on_mirror = text(&mirror.direct(&["KEYS", "*"]).await);
    let mut mirrored: Vec<String> = on_mirror
        .lines()
        .filter(|l| !l.starts_with(['*', '$']))
        .map(str::to_string)
        .collect();
    mirrored.sort();
    assert_eq!(names, mirrored, "the keys on the cluster and on the mirror");
    assert!(
        names.contains(&moved) && names.contains(&split[2]),
        "{names:?}"
    );
    assert!(!names.contains(&split[0]), "{names:?}");
    for name in &names {
        assert_eq!(
            text(&c.call(&["DUMP", name]).await),
            text(&mirror.direct(&["DUMP", name]).await),
            "{name}"
        );
    }
    let mut mc = Raw::connect(proxy.addr()).await;
    assert_eq!(info_field(&mut mc, "proxy_mirror_errors").await, "0");
    assert_eq!(info_field(&mut mc, "proxy_mirror_dropped").await, "0");
}

/// `SCRIPT LOAD` of a script that SETs its key to its argument: its sha.
async fn load_set_script(c: &mut Raw) -> String {
    let loaded = c
        .call(&[
            "SCRIPT",
            "LOAD",
            "return redis.call('set', KEYS[1], ARGV[1])",
        ])
        .await;
    let sha = text(&loaded).lines().last().unwrap_or_default().to_string();
    assert_eq!(sha.len(), 40, "{}", text(&loaded));
    sha
}

/// `MULTI`, `SET set 1`, `INCR incr`, `EXEC` in one request, answered as by Redis.
async fn transaction(c: &mut Raw, set: &str, incr: &str) {
    let out = c
        .request(
            &common::resp_cmds(&[
                "MULTI",
                &format!("SET {set} 1"),
                &format!("INCR {incr}"),
                "EXEC",
            ]),
            4,
        )
        .await;
    assert_eq!(
        text(&out),
        "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:1\r\n"
    );
}

/// Every key of one database of `redis`, each with its `DUMP`, sorted.
async fn dumps(addr: &str, db: &str) -> Vec<(String, String)> {
    let mut c = Raw::connect(addr).await;
    assert_eq!(c.call(&["SELECT", db]).await, b"+OK\r\n");
    let all = text(&c.call(&["KEYS", "*"]).await);
    let mut names: Vec<String> = all
        .lines()
        .filter(|l| !l.starts_with(['*', '$']))
        .map(str::to_string)
        .collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let dump = text(&c.call(&["DUMP", &name]).await);
        out.push((name, dump));
    }
    out
}

/// With `routes:`, a mirror copies one route's server (`mirror.route`): the writes that went
/// to it, in its database (the route's `db: 2`), whichever way they ran (a pipeline over both
/// servers, an MSET split across routes, a transaction, a script, a blocking pop, FLUSHALL
/// with that server's own reply), and nothing of the other routes'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_of_one_route_copies_that_servers_writes_only() {
    let main = RedisServer::start();
    let queue = RedisServer::start();
    let mirror = RedisServer::start();
    let tmp = TempDir::new("mirror-route");
    let policy = write_file(
        tmp.path(),
        "p.yaml",
        &format!(
            "upstream:\n  address: {}\nupstreams:\n  queue:\n    address: {}\nroutes:\n  - name: queue\n    upstream: queue\n    prefixes: [\"queue:\"]\n    db: 2\n  - name: cache\n    prefixes: [\"cache:\"]\nmirror:\n  upstream:\n    address: {}\n  route: queue\n",
            main.addr(),
            queue.addr(),
            mirror.addr()
        ),
    );
    let mut on_mirror = Raw::connect(&mirror.addr()).await;
    assert_eq!(on_mirror.call(&["SELECT", "2"]).await, b"+OK\r\n");
    assert_eq!(on_mirror.call(&["SET", "stale", "x"]).await, b"+OK\r\n");
    let proxy = ProxyProcess::start_as_filed(&policy, tmp.path().join("log")).await;
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["FLUSHALL"]).await, b"+OK\r\n");
    let until = Instant::now() + DEADLINE;
    while on_mirror.call(&["EXISTS", "stale"]).await != b":0\r\n" {
        assert!(Instant::now() < until, "FLUSHALL never reached the mirror");
        tokio::time::sleep(POLL).await;
    }
    let out = c
        .request(
            &common::resp_cmds(&[
                "SET queue:a 1",
                "SET cache:x 1",
                "RPUSH queue:l a b c",
                "SET plain 1",
                "INCR queue:n",
                "HSET queue:h f v",
            ]),
            6,
        )
        .await;
    assert_eq!(text(&out), "+OK\r\n+OK\r\n:3\r\n+OK\r\n:1\r\n:1\r\n");
    assert_eq!(
        c.call(&["MSET", "queue:m", "1", "cache:m", "2", "plain:m", "3"])
            .await,
        b"+OK\r\n"
    );
    transaction(&mut c, "queue:t", "queue:t2").await;
    assert_eq!(
        c.call(&[
            "EVAL",
            "return redis.call('incrby', KEYS[1], 5)",
            "1",
            "queue:e"
        ])
        .await,
        b":5\r\n"
    );
    assert_eq!(
        c.call(&[
            "EVAL",
            "return redis.call('set', KEYS[1], 1)",
            "1",
            "cache:e"
        ])
        .await,
        b"+OK\r\n"
    );
    let popped = c.call(&["BLPOP", "queue:l", "1"]).await;
    assert!(text(&popped).ends_with("$1\r\na\r\n"), "{}", text(&popped));
    assert_eq!(c.call(&["SET", "queue:done", "1"]).await, b"+OK\r\n");
    while on_mirror.call(&["GET", "queue:done"]).await != b"$1\r\n1\r\n" {
        assert!(
            Instant::now() < until,
            "the last write never reached the mirror"
        );
        tokio::time::sleep(POLL).await;
    }
    let route = dumps(&queue.addr(), "2").await;
    assert!(route.len() >= 8, "{route:?}");
    assert_eq!(
        dumps(&mirror.addr(), "2").await,
        route,
        "the route's database"
    );
    assert_eq!(
        dumps(&mirror.addr(), "0").await,
        vec![],
        "nothing in database 0"
    );
    assert_eq!(
        dumps(&main.addr(), "0").await.len(),
        5,
        "the other routes' keys"
    );
    let mut mc = Raw::connect(proxy.addr()).await;
    assert!(
        info_field(&mut mc, "proxy_mirror")
            .await
            .contains("for route queue"),
        "INFO names the route"
    );
    assert_eq!(info_field(&mut mc, "proxy_mirror_errors").await, "0");

    // The route must be named, and exist, and a file without routes names none.
    for (text_of, want) in [
        (
            "upstream:\n  address: 127.0.0.1:1\nroutes:\n  - name: queue\n    prefixes: [\"q:\"]\nmirror:\n  upstream:\n    address: 127.0.0.1:2\n",
            "name the route",
        ),
        (
            "upstream:\n  address: 127.0.0.1:1\nroutes:\n  - name: queue\n    prefixes: [\"q:\"]\nmirror:\n  route: nope\n  upstream:\n    address: 127.0.0.1:2\n",
            "`nope` is not a route (routes: default, queue)",
        ),
        (
            "upstream:\n  address: 127.0.0.1:1\nmirror:\n  route: queue\n  upstream:\n    address: 127.0.0.1:2\n",
            "the file has no `routes:`",
        ),
    ] {
        let file = write_file(tmp.path(), "bad.yaml", text_of);
        let run = run_bin(&["--check", file.to_str().unwrap()], &[]).await;
        let all = format!("{}{}", run.stdout, run.stderr);
        assert_ne!(run.code, Some(0), "{all}");
        assert!(all.contains("mirror.route") && all.contains(want), "{all}");
    }
}
