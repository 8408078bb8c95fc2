//! `redis-policy-proxy replay` end to end: traffic with known refusals goes through the real
//! binary in front of a real `redis-server` with the audit trail on, and the recorded log is
//! replayed against a stricter policy; a MONITOR capture taken from Redis is replayed too.
//! Every count in the reports is known from the traffic sent.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::process::ProxyProcess;
use common::{Raw, RedisServer, TempDir, wait_until, write_file};

const BIN: &str = env!("CARGO_BIN_EXE_redis-policy-proxy");

/// The policy the traffic ran under: nothing it sends is refused.
const OLD: &str = "
rules:
  - id: deny-flush
    deny: [FLUSHALL]
";

/// The stricter policy to try.
const NEW: &str = "
rules:
  - id: deny-keys
    deny: [KEYS]
  - id: per-connection
    rate_limit: {requests: 6, window_ms: 600000, per: connection}
  - id: small-values
    max_value_bytes: 50
  - id: key-names
    key_pattern: '^[a-z]+(:[a-z0-9]+)*$'
  - id: ttl-default
    ttl: {default: 1h, keys: written}
";

fn run_replay(args: &[&str]) -> String {
    let out = std::process::Command::new(BIN)
        .arg("replay")
        .args(args)
        .output()
        .expect("run replay");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "replay failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The report's line for `prefix`, e.g. `deny-keys [default] refuses`.
fn line<'a>(report: &'a str, prefix: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{report}"))
}

fn audit_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

#[tokio::test]
async fn an_audit_log_replayed_against_a_stricter_policy_shows_its_known_refusals() {
    let redis = RedisServer::start();
    let dir = TempDir::new("replay-audit");
    let log = dir.path().join("audit.jsonl");
    let old = write_file(
        dir.path(),
        "old.yaml",
        &format!(
            "audit:\n  commands: all\n  output: {}\n{OLD}",
            log.display()
        ),
    );
    let new = write_file(dir.path(), "new.yaml", NEW);
    let proxy = ProxyProcess::start(&old, &redis, dir.path().join("proxy.log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    let big = "v".repeat(100);
    for _ in 0..4 {
        assert_eq!(c.call(&["KEYS", "user:*"]).await, b"*0\r\n");
    }
    for i in 0..3 {
        assert_eq!(
            c.call(&["SET", &format!("big:{i}"), &big]).await,
            b"+OK\r\n"
        );
    }
    for _ in 0..2 {
        assert_eq!(c.call(&["SET", "BadKey", "v"]).await, b"+OK\r\n");
    }
    assert_eq!(c.call(&["SET", "user:1", "hello"]).await, b"+OK\r\n");
    for _ in 0..20 {
        assert_eq!(c.call(&["GET", "user:1"]).await, b"$5\r\nhello\r\n");
    }
    // The readiness probe's PING is one more entry.
    wait_until("31 audit entries", || async { audit_lines(&log) >= 31 }).await;
    drop(proxy);
    let log = log.to_str().unwrap();

    let report = run_replay(&["--policy", new.to_str().unwrap(), log]);
    assert!(report.starts_with("31 commands replayed"), "{report}");
    assert!(
        line(&report, "deny-keys [default] refuses").contains(": 4 commands"),
        "{report}"
    );
    assert!(
        line(&report, "small-values [default] refuses").contains(": 3 commands"),
        "{report}"
    );
    assert!(
        line(&report, "key-names [default] refuses").contains(": 2 commands"),
        "{report}"
    );
    // Rate-limited: the 6-request budget is spent by the 3 big SETs, the 2 bad-key SETs
    // (rate limits run before size and name rules) and the good SET; KEYS is refused before
    // it counts. Of the 20 GETs none gets through.
    assert!(
        line(&report, "per-connection [default] rate-limits").contains(": 20 commands"),
        "{report}"
    );
    // Examples show keys and sizes, never a value.
    assert!(report.contains("`SET big:0 <100 bytes>`"), "{report}");
    assert!(!report.contains("hello"), "{report}");
    // The TTL rule reads EX/PX options, which the audit log does not hold.
    assert!(
        line(&report, "not judged").contains("ttl-default [default] 1 commands"),
        "{report}"
    );

    let diff = run_replay(&[
        "--policy",
        old.to_str().unwrap(),
        "--policy",
        new.to_str().unwrap(),
        log,
    ]);
    let changes = line(&diff, "from ");
    assert!(
        changes.ends_with(": 29 commands treated differently"),
        "{diff}"
    );
    assert!(
        line(&diff, "allowed -> refused by deny-keys").contains(": 4 commands"),
        "{diff}"
    );
    assert!(
        line(&diff, "allowed -> rate-limited by per-connection").contains(": 20 commands"),
        "{diff}"
    );
}

#[tokio::test]
async fn a_monitor_capture_judges_the_rules_that_read_argument_values() {
    let redis = RedisServer::start();
    let dir = TempDir::new("replay-monitor");
    let mut monitor = redis.raw().await;
    assert_eq!(monitor.call(&["MONITOR"]).await, b"+OK\r\n");
    let mut c = redis.raw().await;
    assert_eq!(c.call(&["SET", "user:2", "v"]).await, b"+OK\r\n");
    assert_eq!(
        c.call(&["SET", "session:1", "v", "EX", "10"]).await,
        b"+OK\r\n"
    );
    assert_eq!(c.call(&["KEYS", "*"]).await.first(), Some(&b'*'));
    // MONITOR's lines are simple strings: `+<ts> [0 IP:port] "SET" …`, as redis-cli prints
    // them without the `+`.
    let capture: Vec<String> = monitor
        .read_frames(3)
        .await
        .iter()
        .map(|f| String::from_utf8_lossy(&f[1..f.len() - 2]).into_owned())
        .collect();
    let capture = write_file(
        dir.path(),
        "monitor.txt",
        &format!("OK\n{}\n", capture.join("\n")),
    );
    let new = write_file(dir.path(), "new.yaml", NEW);

    let report = run_replay(&["--policy", new.to_str().unwrap(), capture.to_str().unwrap()]);
    assert!(report.starts_with("3 commands replayed"), "{report}");
    assert!(
        report.contains("every argument (MONITOR capture)"),
        "{report}"
    );
    assert!(
        line(&report, "deny-keys [default] refuses").contains(": 1 commands"),
        "{report}"
    );
    // The SET without EX gets the default TTL; the one with EX 10 keeps its own.
    let ttl = line(&report, "ttl-default [default] rewrites");
    assert!(
        ttl.contains(": 1 commands") && ttl.contains("`SET user:2 v`"),
        "{report}"
    );
    assert!(!report.contains("not judged"), "{report}");
}
