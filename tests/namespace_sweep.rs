//! The namespace sweep: every command the server documents, in forms drawn from its own
//! argument grammar (`tests/common/docs_grammar.rs`), sent by tenant `a` (namespace `a:`)
//! through the proxy, in front of Debian's 7.0 and each matrix server (whose newer commands
//! the proxy knows from the table it learns at start). Another tenant's keys (`b:…`) and a
//! key outside every namespace hold marked values; after each command:
//!
//! - nothing outside `a:` changed: the same keys, each with the same `DUMP` and TTL;
//! - no reply of `a`'s carries a mark, or the other keys' names;
//! - the command was answered (its sentinel came).
//!
//! The invariant fuzzer (`tests/invariant_fuzz.rs`) holds the same promises with the default
//! policy's rules on a curated list; this asks every documented command, including the
//! newer servers' that no list names.
//!
//! Environment: `NAMESPACE_SWEEP_TRIES` (forms per command, default 3),
//! `NAMESPACE_SWEEP_SEED` (default: from the clock, printed).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::cluster::RedisCluster;
use common::docs_grammar::{Upstream, forms, sentinel_for, until_sentinel};
use common::{ALICE_SHA256, BOB_SHA256, Proxy, Raw, RedisServer, resp, show};

/// The marks in the values outside `a:`: none may reach tenant `a`.
const MARK: &str = "zq-mark";

/// The keys outside `a:`, of each type, and the names a reply must not carry.
const OUTSIDE: &[&str] = &["b:zqs", "b:zqh", "b:zql", "b:zqz", "b:zqx", "zqplain"];

/// What no command of tenant `a` may change: every key outside `a:` on each of `nodes`
/// (one server, or a cluster's primaries) with its `DUMP` and whether it has a TTL.
async fn outside(
    nodes: &mut [redis::aio::MultiplexedConnection],
) -> BTreeMap<String, (Vec<u8>, bool)> {
    let mut out = BTreeMap::new();
    for con in nodes {
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(con)
            .await
            .expect("KEYS");
        keys.retain(|k| !k.starts_with("a:"));
        for key in keys {
            let dump: Option<Vec<u8>> = redis::cmd("DUMP")
                .arg(&key)
                .query_async(con)
                .await
                .expect("DUMP");
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(con)
                .await
                .expect("PTTL");
            out.insert(key, (dump.unwrap_or_default(), ttl != -1));
        }
    }
    out
}

/// Fills the keys outside `a:` (`OUTSIDE`), each holding the mark, some with a TTL, on the
/// node `owner` names for each key.
async fn seed_outside(owner: impl Fn(&str) -> String) {
    let value = format!("{MARK}-value");
    for command in [
        vec!["SET", "b:zqs", value.as_str()],
        vec!["HSET", "b:zqh", MARK, value.as_str()],
        vec!["RPUSH", "b:zql", value.as_str(), MARK],
        vec!["ZADD", "b:zqz", "1", value.as_str()],
        vec!["XADD", "b:zqx", "1-1", MARK, value.as_str()],
        vec!["SET", "zqplain", value.as_str(), "EX", "100000"],
        vec!["EXPIRE", "b:zqh", "100000"],
    ] {
        let mut c = Raw::connect(owner(command[1])).await;
        let reply = c.call(&command).await;
        assert!(!reply.starts_with(b"-"), "{command:?}: {}", show(&reply));
    }
}

fn server_url(addr: &str) -> String {
    format!("redis://{addr}/")
}

/// The sweep in front of `bin`: what broke, one line per command form.
async fn sweep(
    label: &str,
    bin: &Path,
    upstream: Upstream,
    resp3: bool,
    seed: u64,
    tries: usize,
) -> Vec<String> {
    let tenants = format!(
        "access:\n  require_auth: true\n  users:\n    - {{name: alice, password_sha256: {ALICE_SHA256}}}\n    - {{name: bob, password_sha256: {BOB_SHA256}}}\n  identities:\n    - {{tenant: a, user: alice}}\n    - {{tenant: b, user: bob}}\n  namespaces:\n    a: 'a:'\n    b: 'b:'\n"
    );
    // Kept for the sweep's length: dropping either stops its servers.
    let (_server, _cluster, nodes, config) = match upstream {
        Upstream::Server => {
            let server = RedisServer::start_binary(bin, &[]);
            let addr = server.addr();
            seed_outside(|_| addr.clone()).await;
            let mut config = redis_policy_proxy::setup::from_yaml(&tenants, Path::new("ns.yaml"))
                .expect("ns config");
            config.set_upstream(server.addr());
            (Some(server), None, vec![server_url(&addr)], config)
        }
        Upstream::Cluster => {
            let cluster = RedisCluster::start_binary(bin, 3, 0, &[]);
            seed_outside(|key| {
                cluster.primary_for_slot(redis_policy_proxy::cluster::slot(key.as_bytes()))
            })
            .await;
            let yaml = format!(
                "upstream:\n  mode: cluster\n  cluster:\n    seeds: [{}]\n{tenants}",
                cluster.live_addrs()[0]
            );
            let config = redis_policy_proxy::setup::from_yaml(&yaml, Path::new("ns.yaml"))
                .expect("ns cluster config");
            let nodes = cluster.primaries().iter().map(|a| server_url(a)).collect();
            (None, Some(cluster), nodes, config)
        }
    };
    let label = &upstream.name(label);
    // The proxy serves once it has read the server's commands (its startup waits for them).
    let proxy = Proxy::spawn(config).await;
    let addr = proxy.addr;
    common::wait_until("the proxy serves", || async move {
        match Raw::try_connect(addr, common::DEADLINE).await {
            Some(mut c) => c.call(&["AUTH", "alice", "alicepw"]).await == b"+OK\r\n",
            None => false,
        }
    })
    .await;
    let docs = common::docs_grammar::documented(&nodes[0]).await;
    assert!(
        docs.len() > 150,
        "{label}: {} commands documented",
        docs.len()
    );

    let mut a = Raw::connect(proxy.addr).await;
    assert_eq!(a.call(&["AUTH", "alice", "alicepw"]).await, b"+OK\r\n");
    if resp3 {
        let hello = a.call(&["HELLO", "3"]).await;
        assert!(hello.starts_with(b"%"), "{}", show(&hello));
    }
    let mut direct = Vec::new();
    for url in &nodes {
        direct.push(common::connect(url).await);
    }
    let before = outside(&mut direct).await;
    assert_eq!(before.len(), OUTSIDE.len(), "{label}: {before:?}");

    let mut found = Vec::new();
    let mut step = 0u64;
    for (n, args) in forms(&docs, seed, tries) {
        step = n;
        let (ping, sentinel) = sentinel_for(step);
        let mut input = resp(&args);
        input.extend(ping);
        a.send(&input).await;
        let case = format!("{label}: {}", show(&resp(&args)));
        let replies = match until_sentinel(&mut a, &sentinel).await {
            Ok(frames) => frames.concat(),
            Err(why) => {
                found.push(format!("{case}: {why}"));
                return found;
            }
        };
        let reply = String::from_utf8_lossy(&replies);
        if let Some(leak) = std::iter::once(MARK)
            .chain(OUTSIDE.iter().copied())
            .find(|m| reply.contains(m))
        {
            found.push(format!(
                "{case}: the reply carries {leak:?}: {}",
                show(&replies)
            ));
        }
        let now = outside(&mut direct).await;
        if now != before {
            let changed: Vec<&String> = before
                .keys()
                .chain(now.keys())
                .filter(|k| before.get(*k) != now.get(*k))
                .collect();
            found.push(format!("{case}: changed outside a: {changed:?}"));
            return found;
        }
        if found.len() > 20 {
            return found;
        }
    }
    eprintln!(
        "namespace sweep in front of {label} ({}): {} commands, {step} forms, {} findings",
        if resp3 { "RESP3" } else { "RESP2" },
        docs.len(),
        found.len()
    );
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_command_stays_in_the_tenants_namespace() {
    let seed = common::docs_grammar::seed("NAMESPACE_SWEEP_SEED");
    let tries = std::env::var("NAMESPACE_SWEEP_TRIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut servers = vec![("redis-7.0", common::server_binary())];
    servers.extend(common::matrix_servers());
    let mut found = Vec::new();
    for (label, bin) in &servers {
        for resp3 in [false, true] {
            found.extend(sweep(label, bin, Upstream::Server, resp3, seed, tries).await);
        }
        // In front of a cluster too (its namespace works through placement, fan-out and
        // merged replies): RESP2, the protocol changes nothing the namespace reads.
        found.extend(sweep(label, bin, Upstream::Cluster, false, seed, tries).await);
    }
    assert!(
        found.is_empty(),
        "seed {seed}: the namespace did not hold:\n  {}",
        found.join("\n  ")
    );
}
