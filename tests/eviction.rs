//! Eviction awareness against real redis-servers: the upstream's maxmemory and eviction
//! policy checked against `upstream.role` and the TTL rule (metric, INFO, `/readyz`), and
//! an OOM error reaching the client with the proxy's note.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::{DEADLINE, POLL, Proxy, Raw, RedisServer, http_get, sample};

fn config(redis: &RedisServer, yaml: &str) -> redis_policy_proxy::Config {
    let text = format!(
        "upstream:\n  address: {}\n  memory_check_ms: 100\n{yaml}",
        redis.addr()
    );
    redis_policy_proxy::setup::from_yaml(&text, Path::new("eviction.yaml")).unwrap()
}

/// INFO's text once its `# Proxy` section has a line containing `line`, within the deadline.
async fn info_until(proxy: &Proxy, line: &str) -> String {
    let until = std::time::Instant::now() + DEADLINE;
    let mut c = Raw::connect(proxy.addr).await;
    loop {
        let info = String::from_utf8_lossy(&c.call(&["INFO"]).await).into_owned();
        if info.contains(line) {
            return info;
        }
        assert!(
            std::time::Instant::now() < until,
            "INFO never showed {line:?}:\n{info}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_with_noeviction_is_reported_and_oom_errors_say_why() {
    let redis =
        RedisServer::start_with(&["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"]);
    let proxy = Proxy::start(config(
        &redis,
        "  role: cache\nrules:\n  - id: ttl-default\n    mode: audit\n    ttl:\n      default: 1h\n      keys: written\n",
    ))
    .await;
    let info = info_until(&proxy, "proxy_eviction_findings:1").await;
    assert!(info.contains("proxy_upstream_role:cache\r\n"), "{info}");
    assert!(
        info.contains("proxy_upstream_maxmemory:3145728\r\n"),
        "{info}"
    );
    assert!(
        info.contains("proxy_upstream_maxmemory_policy:noeviction\r\n"),
        "{info}"
    );
    assert!(
        info.contains("proxy_eviction_finding_0:cache upstream has maxmemory-policy noeviction"),
        "{info}"
    );
    let (_, metrics) = http_get(proxy.admin, "/metrics").await;
    assert_eq!(sample(&metrics, "rpp_eviction_findings"), 1.0, "{metrics}");
    // A detail of readiness, not a failure.
    let (status, body) = http_get(proxy.admin, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("eviction: upstream") && body.contains("noeviction"),
        "{body}"
    );
    // Fill it up: the write that does not fit gets Redis's error plus what the proxy knows.
    let mut c = Raw::connect(proxy.addr).await;
    let value = "x".repeat(100_000);
    let mut oom = None;
    for i in 0..200 {
        let reply = c.call(&["SET", &format!("fill:{i}"), &value]).await;
        if reply != b"+OK\r\n" {
            oom = Some(String::from_utf8_lossy(&reply).into_owned());
            break;
        }
    }
    let oom = oom.expect("the upstream ran out of memory");
    assert!(
        oom.starts_with("-OOM command not allowed when used memory > 'maxmemory'. (proxy: at the last check upstream "),
        "{oom}"
    );
    assert!(
        oom.contains("(role cache)")
            && oom.contains("of maxmemory 3145728, maxmemory-policy noeviction")
            && oom.contains("TTL rule `ttl-default` in audit")
            && oom.ends_with(")\r\n"),
        "{oom}"
    );
    let (_, metrics) = http_get(proxy.admin, "/metrics").await;
    assert_eq!(sample(&metrics, "rpp_oom_replies_total"), 1.0, "{metrics}");
    // The connection still serves, and reads are not refused.
    assert_eq!(c.call(&["GET", "nothing"]).await, b"$-1\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn findings_follow_the_upstream_settings_and_the_ttl_rule() {
    let redis =
        RedisServer::start_with(&["--maxmemory", "50mb", "--maxmemory-policy", "volatile-lru"]);
    // Mixed (the default role), no TTL rule: volatile-lru never evicts keys without a TTL.
    let proxy = Proxy::start(config(&redis, "")).await;
    let info = info_until(&proxy, "proxy_eviction_findings:1").await;
    assert!(info.contains("proxy_upstream_role:mixed\r\n"), "{info}");
    assert!(
        info.contains("maxmemory-policy volatile-lru evicts only keys with a TTL, and no TTL rule"),
        "{info}"
    );
    // The periodic check follows a change made on Redis.
    redis
        .direct(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
        .await;
    let info = info_until(&proxy, "proxy_upstream_maxmemory_policy:allkeys-lru").await;
    assert!(
        info.contains("proxy_eviction_finding_0:upstream holding cache and queue data (role mixed) has maxmemory-policy allkeys-lru"),
        "{info}"
    );
    redis
        .direct(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .await;
    let info = info_until(&proxy, "proxy_upstream_maxmemory_policy:noeviction").await;
    assert!(info.contains("proxy_eviction_findings:0\r\n"), "{info}");
    let (_, metrics) = http_get(proxy.admin, "/metrics").await;
    assert_eq!(sample(&metrics, "rpp_eviction_findings"), 0.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_has_its_own_findings() {
    // A queue on allkeys-*: queued data can be evicted.
    let redis =
        RedisServer::start_with(&["--maxmemory", "50mb", "--maxmemory-policy", "allkeys-lfu"]);
    let proxy = Proxy::start(config(&redis, "  role: queue\n")).await;
    let info = info_until(&proxy, "proxy_eviction_findings:1").await;
    assert!(
        info.contains("proxy_eviction_finding_0:queue upstream has maxmemory-policy allkeys-lfu"),
        "{info}"
    );
    // A cache without maxmemory (Redis's default): it never evicts.
    let redis = RedisServer::start();
    let proxy = Proxy::start(config(&redis, "  role: cache\n")).await;
    let info = info_until(&proxy, "proxy_eviction_findings:2").await;
    assert!(info.contains("cache upstream has maxmemory 0"), "{info}");
    // volatile-* with the TTL rule enforced is what a mixed upstream should have.
    let redis =
        RedisServer::start_with(&["--maxmemory", "50mb", "--maxmemory-policy", "volatile-ttl"]);
    let proxy = Proxy::start(config(
        &redis,
        "rules:\n  - id: ttl\n    ttl:\n      default: 10m\n      keys: written\n",
    ))
    .await;
    let info = info_until(&proxy, "proxy_eviction_findings:0").await;
    assert!(
        info.contains("proxy_upstream_maxmemory_policy:volatile-ttl\r\n"),
        "{info}"
    );
}
