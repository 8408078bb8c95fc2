//! The key-pattern report and hot keys end to end: the real binary in front of a real
//! `redis-server` with `keyspace.sample: 1`, a seeded workload whose shares are known
//! (writes with and without a TTL, value sizes, a skewed read mix), read back from
//! `PROXY KEYSPACE`, the admin endpoint's `/keyspace` and `/metrics`.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::net::SocketAddr;

use common::process::ProxyProcess;
use common::{Raw, RedisServer, TempDir, free_port, http_get, pipeline, resp, sample, write_file};
use serde_json::Value;

/// Sends `commands` as one pipeline and checks every reply arrived.
async fn send_all(proxy: &ProxyProcess, commands: &[Vec<String>]) {
    let mut input = Vec::new();
    for c in commands {
        input.extend(resp(c));
    }
    let got = pipeline(proxy.addr(), input, commands.len()).await;
    assert_eq!(got.frames.len(), commands.len(), "{}", proxy.log_text());
    assert!(
        got.frames.iter().all(|f| !f.starts_with(b"-")),
        "an error reply"
    );
}

fn cmd(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// The row of `pattern` in `tenant`'s report.
fn row<'a>(report: &'a Value, tenant: &str, pattern: &str) -> &'a Value {
    report["tenants"][tenant]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["pattern"] == pattern))
        .unwrap_or_else(|| panic!("no {pattern} for {tenant} in {report}"))
}

#[tokio::test]
async fn a_seeded_workload_shows_its_known_shares_and_hot_keys() {
    let redis = RedisServer::start();
    let dir = TempDir::new("keyspace");
    let policy = write_file(
        dir.path(),
        "policy.yaml",
        "keyspace:\n  sample: 1\n  hot_keys: 2\naccess:\n  admin_tenants: [default]\n",
    );
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin_arg = admin.to_string();
    let proxy = ProxyProcess::start(
        &policy,
        &redis,
        dir.path().join("proxy.log"),
        &["--admin", &admin_arg],
    )
    .await;
    let addr = proxy.addr();

    // user:*: 30 writes with a TTL, 10 without; cache:*: 20 writes of 2000 bytes, no TTL.
    let mut writes = Vec::new();
    for i in 0..30 {
        writes.push(cmd(&["SET", &format!("user:{i}"), "v", "EX", "100"]));
    }
    for i in 30..40 {
        writes.push(cmd(&["SET", &format!("user:{i}"), "v"]));
    }
    let blob = "b".repeat(2000);
    for i in 0..20 {
        writes.push(cmd(&["SET", &format!("cache:{i}"), &blob]));
    }
    send_all(&proxy, &writes).await;
    // 50 reads of user:1 alone, so their reply bytes are known: `$1\r\nv\r\n` each.
    let reads: Vec<Vec<String>> = (0..50).map(|_| cmd(&["GET", "user:1"])).collect();
    send_all(&proxy, &reads).await;
    // A skewed read mix: hot:1 200 times, hot:2 100 times, 300 cold keys once each.
    let mut mix = Vec::new();
    for i in 0..300 {
        mix.push(cmd(&["GET", &format!("cold:{i}")]));
        if i % 3 == 0 {
            mix.push(cmd(&["GET", "hot:2"]));
        }
        if i % 3 != 2 {
            mix.push(cmd(&["GET", "hot:1"]));
        }
    }
    send_all(&proxy, &mix).await;

    let mut c = Raw::connect(&addr).await;
    let reply = c.call(&["PROXY", "KEYSPACE"]).await;
    let text = String::from_utf8_lossy(&reply);
    let json = text.split_once("\r\n").map(|(_, j)| j.trim_end()).unwrap();
    let report: Value = serde_json::from_str(json).expect("PROXY KEYSPACE is JSON");

    let user = row(&report, "default", "user:*");
    assert_eq!(user["commands"], 90);
    assert_eq!(user["writes"], 40);
    assert_eq!(user["writes_without_ttl"], 10);
    assert_eq!(user["writes_without_ttl_share"], 0.25);
    assert_eq!(user["value_sizes"]["<=64"], 40);
    assert_eq!(
        user["bytes_out"].as_u64().unwrap(),
        30 * 5 + 10 * 5 + 50 * 7
    );
    let cache = row(&report, "default", "cache:*");
    assert_eq!(cache["writes"], 20);
    assert_eq!(cache["writes_without_ttl_share"], 1.0);
    assert_eq!(cache["value_sizes"]["<=4k"], 20);
    let set_bytes = resp(&cmd(&["SET", "cache:10", &blob])).len() as u64;
    // 10 of the keys have one digit, 10 two.
    assert_eq!(cache["bytes_in"].as_u64().unwrap(), 20 * set_bytes - 10);
    // Patterns by commands: cold (300), hot (300), user (90), cache (20).
    let hot = &report["hot_keys"];
    assert_eq!(hot[0]["key"], "hot:1", "{report}");
    assert!(hot[0]["requests_last_minute"].as_u64().unwrap() >= 200);
    assert_eq!(hot[1]["key"], "hot:2", "{report}");
    assert_eq!(hot.as_array().unwrap().len(), 2);

    let (status, body) = http_get(admin, "/keyspace").await;
    assert_eq!(status, 200);
    let over_http: Value = serde_json::from_str(&body).expect("/keyspace is JSON");
    assert_eq!(row(&over_http, "default", "cache:*")["writes"], 20);

    let (_, metrics) = http_get(admin, "/metrics").await;
    let series = |name: &str, pattern: &str| {
        sample(
            &metrics,
            &format!("rpp_keyspace_{name}_total{{tenant=\"default\",pattern=\"{pattern}\"}}"),
        )
    };
    assert_eq!(series("commands", "user:*"), 90.0, "{metrics}");
    assert_eq!(series("writes_without_ttl", "user:*"), 10.0);
    assert_eq!(series("writes", "cache:*"), 20.0);
    // Only patterns are labels, never a key.
    assert!(!metrics.contains("hot:1"), "{metrics}");
}

#[tokio::test]
async fn off_by_default() {
    let redis = RedisServer::start();
    let dir = TempDir::new("keyspace-off");
    let policy = write_file(
        dir.path(),
        "policy.yaml",
        "access:\n  admin_tenants: [default]\n",
    );
    let proxy = ProxyProcess::start(&policy, &redis, dir.path().join("proxy.log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    let reply = c.call(&["PROXY", "KEYSPACE"]).await;
    assert!(
        reply.starts_with(b"-ERR keyspace statistics are off"),
        "{reply:?}"
    );
}
