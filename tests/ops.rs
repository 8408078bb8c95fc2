//! Operations: the admin endpoint scraped after specific commands, readiness following the
//! upstream, and the proxy's own INFO section and PROXY commands.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;
use std::time::Instant;

use common::{DEADLINE, POLL, Proxy, Raw, RedisServer, http_get, resp, resp_cmds, sample, show};

/// A proxy in front of `redis` with `policy/default.yaml`, plus `extra` YAML appended (e.g. an
/// `access:` section).
async fn proxy_with_default_policy(redis: &RedisServer, extra: &str) -> Proxy {
    proxy_with_default_policy_edited(redis, extra, ("", "")).await
}

/// Like `proxy_with_default_policy`, with one text replacement in the file first.
async fn proxy_with_default_policy_edited(
    redis: &RedisServer,
    extra: &str,
    (from, to): (&str, &str),
) -> Proxy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let mut text = common::default_policy_enforced();
    if !from.is_empty() {
        assert!(text.contains(from), "{from} not in default.yaml");
        text = text.replace(from, to);
    }
    text += extra;
    let mut config =
        redis_policy_proxy::setup::from_yaml(&text, &path).expect("default policy parses");
    config.set_upstream(redis.addr());
    Proxy::start(config).await
}

/// Scrapes until `ok` holds for the text (counters are updated as replies flow, so a scrape
/// right after a reply may race the last increment by a few microseconds).
async fn scrape_until(proxy: &Proxy, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + DEADLINE;
    loop {
        let (status, body) = http_get(proxy.admin, "/metrics").await;
        assert_eq!(status, 200);
        if ok(&body) {
            return body;
        }
        assert!(
            Instant::now() < until,
            "{what} never showed; last scrape:\n{body}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_commands_policy_decisions_and_latency() {
    let redis = RedisServer::start();
    let proxy = proxy_with_default_policy(&redis, "").await;
    let mut c = Raw::connect(proxy.addr).await;
    c.send(b"SET user:1 v\r\nGET user:1\r\nKEYS *\r\nSET c:1 v EX 60\r\n")
        .await;
    let got = c.collect_frames(4, DEADLINE).await;
    assert!(
        got.frames[2].starts_with(b"-NOPERM policy deny-keys"),
        "{}",
        show(&got.joined())
    );

    // The upstream connections come up on their own tasks (the control one too): wait for
    // them as for the counters, then check there are exactly three.
    let text = scrape_until(&proxy, "the GET and three upstream connections", |t| {
        sample(t, r#"rpp_request_duration_seconds_count"#) >= 3.0
            && sample(t, "rpp_upstream_connections") >= 3.0
    })
    .await;
    let series = |s: &str| sample(&text, s);
    assert_eq!(
        series(r#"rpp_commands_total{class="string",outcome="rewritten"}"#),
        1.0
    );
    // The GET and the SET with its own EX; the readiness probe's PING is `connection`.
    assert_eq!(
        series(r#"rpp_commands_total{class="string",outcome="forwarded"}"#),
        2.0
    );
    assert_eq!(
        series(r#"rpp_commands_total{class="generic",outcome="refused"}"#),
        1.0
    );
    assert_eq!(
        series(r#"rpp_policy_decisions_total{rule="deny-keys",tenant="default",outcome="denied"}"#),
        1.0
    );
    assert_eq!(
        series(
            r#"rpp_policy_decisions_total{rule="ttl-default",tenant="default",outcome="rewritten"}"#
        ),
        1.0
    );
    assert!(
        series(r#"rpp_policy_decisions_total{rule="-",tenant="default",outcome="allowed"}"#) >= 2.0
    );
    assert!(
        series("rpp_upstream_duration_seconds_count") >= 1.0,
        "{text}"
    );
    assert!(series(r#"rpp_request_duration_seconds_bucket{le="+Inf"}"#) >= 3.0);
    assert!(series("rpp_client_connections") >= 1.0);
    assert!(series("rpp_client_connections_accepted_total") >= 2.0);
    // Every family has one name: a gauge and a counter may not share it (OpenMetrics).
    let mut families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let n = families.len();
    families.sort_unstable();
    families.dedup();
    assert_eq!(families.len(), n, "duplicate metric families:\n{text}");
    assert!(series("rpp_client_received_bytes_total") >= 60.0);
    assert!(series("rpp_client_sent_bytes_total") > 0.0);
    assert_eq!(
        series("rpp_upstream_connections"),
        3.0,
        "two shared (RESP2, RESP3) and control"
    );
    assert!(text.contains("rpp_policy_info{version=\""), "{text}");
    // Never a key or a value in a label.
    assert!(!text.contains("user:1"), "{text}");

    // An error reply from Redis is counted as such.
    c.send(&resp(&["INCR", "user:1"])).await;
    let got = c.collect_frames(1, DEADLINE).await;
    assert!(
        got.frames[0].starts_with(b"-ERR"),
        "{}",
        show(&got.joined())
    );
    scrape_until(&proxy, "the error reply", |t| {
        sample(t, "rpp_upstream_error_replies_total") == 1.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_upstream_and_healthz_the_process() {
    let mut redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    assert_eq!(http_get(proxy.admin, "/healthz").await.0, 200);
    assert_eq!(http_get(proxy.admin, "/readyz").await.0, 200);
    assert_eq!(http_get(proxy.admin, "/nope").await.0, 404);

    redis.kill();
    let until = Instant::now() + DEADLINE;
    while http_get(proxy.admin, "/readyz").await.0 != 503 {
        assert!(Instant::now() < until, "/readyz stayed 200 with Redis gone");
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(http_get(proxy.admin, "/healthz").await.0, 200);

    redis.restart();
    let until = Instant::now() + DEADLINE;
    while http_get(proxy.admin, "/readyz").await.0 != 200 {
        assert!(Instant::now() < until, "/readyz never recovered");
        tokio::time::sleep(POLL).await;
    }
    let text = scrape_until(&proxy, "the reconnects", |t| {
        sample(t, "rpp_upstream_reconnects_total") >= 1.0
    })
    .await;
    assert!(
        sample(&text, r#"rpp_upstream_errors_total{kind="lost"}"#) >= 1.0,
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_refuses_what_it_does_not_serve() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut c = Raw::connect(proxy.admin).await;
    c.send(b"POST /metrics HTTP/1.1\r\n\r\n").await;
    let (out, _) = c.read_to_close(DEADLINE).await;
    assert!(out.starts_with(b"HTTP/1.1 405"), "{}", show(&out));
    let mut c = Raw::connect(proxy.admin).await;
    c.send(b"\x00\x01garbage\r\n\r\n").await;
    let (out, _) = c.read_to_close(DEADLINE).await;
    assert!(out.starts_with(b"HTTP/1.1 400"), "{}", show(&out));
    // A header that never ends is cut off at 8 KiB, not buffered without bound.
    let mut c = Raw::connect(proxy.admin).await;
    c.send(format!("GET /metrics HTTP/1.1\r\nx: {}", "a".repeat(20_000)).as_bytes())
        .await;
    let (out, _) = c.read_to_close(DEADLINE).await;
    assert!(out.starts_with(b"HTTP/1.1 431"), "{}", show(&out));
    // HEAD: the status and headers GET would give, no body (uptime checkers, balancers).
    for path in ["/healthz", "/readyz", "/metrics"] {
        let mut c = Raw::connect(proxy.admin).await;
        c.send(format!("HEAD {path} HTTP/1.1\r\nhost: test\r\n\r\n").as_bytes())
            .await;
        let (out, _) = c.read_to_close(DEADLINE).await;
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.starts_with("HTTP/1.1 200 OK\r\n"),
            "HEAD {path}: {text}"
        );
        assert!(text.contains("content-length: "), "HEAD {path}: {text}");
        assert!(
            text.ends_with("\r\n\r\n"),
            "HEAD {path} sent a body: {text}"
        );
    }
    // The proxy still serves Redis clients.
    assert_eq!(
        Raw::connect(proxy.addr).await.call(&["PING"]).await,
        b"+PONG\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_gains_a_proxy_section_and_proxy_commands_serve_admins_only() {
    let redis = RedisServer::start();
    // The slow log's threshold is out of reach, so its LEN/GET below do not depend on how
    // busy the machine is (a loaded CI runner can take 10 ms for a batch).
    let admin = "access:\n  identities:\n    - tenant: ops\n      cidr: 127.0.0.1/32\n  admin_tenants: [ops]\n";
    let threshold = (
        "slowlog_threshold_us: 10000",
        "slowlog_threshold_us: 3600000000",
    );
    let proxy = proxy_with_default_policy_edited(&redis, admin, threshold).await;
    let mut c = Raw::connect(proxy.addr).await;
    c.send(b"KEYS *\r\n").await;
    c.collect_frames(1, DEADLINE).await;

    // INFO: Redis's sections, then ours; a named Redis section stays Redis's alone.
    let info = String::from_utf8(c.call(&["INFO"]).await).unwrap();
    assert!(
        info.contains("# Server\r\n") && info.contains("redis_version:"),
        "{info}"
    );
    assert!(info.contains("\r\n\r\n# Proxy\r\nproxy_version:"), "{info}");
    assert!(info.contains("proxy_rule_deny-keys:denied=1,"), "{info}");
    let len: usize = info[1..info.find('\r').unwrap()].parse().unwrap();
    assert_eq!(
        len,
        info.len() - info.find('\n').unwrap() - 1 - 2,
        "bulk length matches"
    );
    let memory = String::from_utf8(c.call(&["INFO", "memory"]).await).unwrap();
    assert!(!memory.contains("# Proxy"), "{memory}");
    let ours = String::from_utf8(c.call(&["INFO", "proxy"]).await).unwrap();
    assert!(
        ours.contains("# Proxy\r\n") && !ours.contains("# Server"),
        "{ours}"
    );
    // RESP3: a verbatim string, still well formed.
    c.send(b"HELLO 3\r\n").await;
    c.collect_frames(1, DEADLINE).await;
    let v = String::from_utf8(c.call(&["INFO"]).await).unwrap();
    assert!(v.starts_with('=') && v.contains("# Proxy"), "{v}");
    c.send(b"HELLO 2\r\n").await;
    c.collect_frames(1, DEADLINE).await;

    let policy = String::from_utf8(c.call(&["PROXY", "POLICY"]).await).unwrap();
    assert!(policy.contains("rule deny-keys: denied=1"), "{policy}");
    let reload = c.call(&["PROXY", "RELOAD"]).await;
    assert!(
        reload.starts_with(b"-ERR no policy file"),
        "{}",
        show(&reload)
    );
    assert_eq!(c.call(&["PROXY", "SLOWLOG", "LEN"]).await, b":0\r\n");
    assert_eq!(c.call(&["PROXY", "SLOWLOG", "GET"]).await, b"*0\r\n");
    assert!(
        c.call(&["PROXY", "NOPE"])
            .await
            .starts_with(b"-ERR unknown subcommand")
    );

    // Anyone else: refused, naming the setting.
    let plain = proxy_with_default_policy(&redis, "").await;
    let refused = Raw::connect(plain.addr)
        .await
        .call(&["PROXY", "INFO"])
        .await;
    assert!(
        refused.starts_with(b"-NOPERM PROXY commands are for admin tenants"),
        "{}",
        show(&refused)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_batches_enter_the_slow_log() {
    let redis = RedisServer::start();
    let admin = "access:\n  identities:\n    - tenant: ops\n      cidr: 127.0.0.1/32\n  admin_tenants: [ops]\n";
    let every_batch = ("slowlog_threshold_us: 10000", "slowlog_threshold_us: 0");
    let proxy = proxy_with_default_policy_edited(&redis, admin, every_batch).await;
    let mut c = Raw::connect(proxy.addr).await;
    // One multibulk pipeline: one batch upstream (inline commands are batched one by one).
    c.send(&resp_cmds(&["GET a", "GET b", "GET c"])).await;
    c.collect_frames(3, DEADLINE).await;
    let log = c.call(&["PROXY", "SLOWLOG", "GET", "1"]).await;
    let text = show(&log);
    assert!(log.starts_with(b"*1\r\n*6\r\n"), "{text}");
    assert!(
        text.contains("GET") && text.contains("(+2 more in the same batch)"),
        "{text}"
    );
    assert!(
        !text.contains("$1\\r\\na"),
        "no arguments in the log: {text}"
    );
    assert_eq!(c.call(&["PROXY", "SLOWLOG", "RESET"]).await, b"+OK\r\n");
    let metrics = http_get(proxy.admin, "/metrics").await.1;
    assert!(
        sample(&metrics, "rpp_slow_commands_total") >= 1.0,
        "{metrics}"
    );
}
