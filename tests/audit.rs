//! The audit trail end to end: the real binary in front of a real `redis-server`, with
//! `audit:` in its policy file; the JSON lines it writes are read back and checked field by
//! field (identity, command, key names or hashes, argument sizes, outcome, rule, latency) and
//! for what must never be in them (values).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::process::ProxyProcess;
use common::{Raw, RedisServer, TempDir, wait_until, write_file};
use redis_policy_proxy::audit::{Arg, Entry, Outcome};

/// The entries in the audit file so far (the last line may be half-written: ignored).
fn entries(path: &Path) -> Vec<Entry> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until the audit file holds `n` entries, and returns them.
async fn wait_entries(path: &Path, n: usize) -> Vec<Entry> {
    wait_until(
        &format!("{n} audit entries in {}", path.display()),
        || async { entries(path).len() >= n },
    )
    .await;
    entries(path)
}

const RULES: &str = "
rules:
  - id: deny-flush
    deny: [FLUSHALL]
    message: scope deletes by key pattern
  - id: small-values
    max_value_bytes: 10
";

#[tokio::test]
async fn writes_are_audited_with_identity_outcome_and_latency_never_values() {
    let redis = RedisServer::start();
    let dir = TempDir::new("audit-writes");
    let log = dir.path().join("audit.jsonl");
    let policy = write_file(
        dir.path(),
        "policy.yaml",
        &format!(
            "audit:\n  commands: writes\n  output: {}\n{RULES}",
            log.display()
        ),
    );
    let proxy = ProxyProcess::start(&policy, &redis, dir.path().join("proxy.log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["SET", "user:1", "hello"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["GET", "user:1"]).await, b"$5\r\nhello\r\n");
    let refused = c.call(&["SET", "user:2", "a-value-too-long"]).await;
    assert!(
        refused.starts_with(b"-ERR policy small-values"),
        "{refused:?}"
    );
    let refused = c.call(&["FLUSHALL"]).await;
    assert!(
        refused.starts_with(b"-NOPERM policy deny-flush"),
        "{refused:?}"
    );
    assert_eq!(c.call(&["MSET", "a", "1", "b", "22"]).await, b"+OK\r\n");

    // GET is a read: not in a writes-only trail.
    let got = wait_entries(&log, 4).await;
    assert_eq!(got.len(), 4, "{got:?}");
    let by_cmd = |cmd: &str, key: &str| {
        got.iter()
            .find(|e| e.cmd == cmd && e.args.first() == Some(&Arg::Key(key.into())))
            .unwrap_or_else(|| panic!("no {cmd} {key} in {got:?}"))
            .clone()
    };
    let set = by_cmd("SET", "user:1");
    assert_eq!(set.args, vec![Arg::Key("user:1".into()), Arg::Size(5)]);
    assert_eq!(set.argc, 3);
    assert_eq!(set.outcome, Outcome::Forwarded);
    assert_eq!(set.route, "shared");
    assert_eq!(set.tenant, "default");
    assert!(set.client.ip().is_loopback(), "{set:?}");
    assert!(
        set.latency_us.is_some(),
        "forwarded entries carry a latency: {set:?}"
    );
    assert!(set.ts > 1.0e9);

    let too_big = by_cmd("SET", "user:2");
    assert_eq!(too_big.outcome, Outcome::Refused);
    assert_eq!(too_big.rule.as_deref(), Some("small-values"));
    assert_eq!(too_big.args[1], Arg::Size(16));
    assert_eq!(too_big.route, "proxy");

    let flush = got.iter().find(|e| e.cmd == "FLUSHALL").expect("FLUSHALL");
    assert_eq!(flush.outcome, Outcome::Refused);
    assert_eq!(flush.rule.as_deref(), Some("deny-flush"));

    let mset = by_cmd("MSET", "a");
    assert_eq!(
        mset.args,
        vec![
            Arg::Key("a".into()),
            Arg::Size(1),
            Arg::Key("b".into()),
            Arg::Size(2)
        ]
    );
    // All entries come from one connection.
    assert!(got.iter().all(|e| e.id == set.id));

    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("hello"),
        "a value leaked into the audit log: {text}"
    );
    assert!(!text.contains("a-value-too-long"), "{text}");
}

#[tokio::test]
async fn all_commands_with_hashed_keys_and_sampled_reads() {
    let redis = RedisServer::start();
    let dir = TempDir::new("audit-sampled");
    let log = dir.path().join("audit.jsonl");
    let policy = write_file(
        dir.path(),
        "policy.yaml",
        &format!(
            "audit:\n  commands: all\n  read_sample: 4\n  keys: hash\n  output: {}\n",
            log.display()
        ),
    );
    let proxy = ProxyProcess::start(&policy, &redis, dir.path().join("proxy.log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["SET", "secret:name", "v"]).await, b"+OK\r\n");
    for _ in 0..8 {
        assert_eq!(c.call(&["GET", "secret:name"]).await, b"$1\r\nv\r\n");
    }
    // The marker write comes last: once it is in, every earlier entry is too (one writer,
    // entries of one connection in order).
    assert_eq!(c.call(&["DEL", "secret:name"]).await, b":1\r\n");
    wait_until("the DEL entry", || async {
        entries(&log).iter().any(|e| e.cmd == "DEL")
    })
    .await;
    let got = entries(&log);
    let gets = got.iter().filter(|e| e.cmd == "GET").count();
    // One read in four; PING and HELLO of the readiness probe are reads too, so the count
    // of GETs is 2 or 3, never all 8.
    assert!((1..=3).contains(&gets), "{gets} GETs audited of 8: {got:?}");
    let hash = redis_policy_proxy::audit::entry::key_hash(b"secret:name");
    let set = got.iter().find(|e| e.cmd == "SET").expect("SET");
    assert_eq!(set.args[0], Arg::Key(hash));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("secret:name"), "{text}");
}

#[tokio::test]
async fn an_unwritable_audit_file_stops_the_start_naming_it() {
    let dir = TempDir::new("audit-badpath");
    let policy = write_file(
        dir.path(),
        "policy.yaml",
        "audit:\n  commands: writes\n  output: /nonexistent-dir/audit.jsonl\n",
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redis-policy-proxy"))
        .args(["--config", policy.to_str().unwrap(), "--admin", "off"])
        .args(["--listen", &format!("127.0.0.1:{}", common::free_port())])
        .output()
        .expect("run the binary");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("audit.output /nonexistent-dir/audit.jsonl"),
        "{stderr}"
    );
}
