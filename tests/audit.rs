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

/// The binary with `args`, to its exit (killed past the deadline: a proxy that starts
/// instead of refusing its file must fail the test, not hang it): the exit code and what
/// it printed on stdout and stderr.
fn run_to_exit(args: &[&str]) -> (Option<i32>, String, String) {
    use std::process::{Command, Stdio};
    let dir = TempDir::new("audit-run");
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_redis-policy-proxy"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("run the binary");
    let until = std::time::Instant::now() + common::DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(common::POLL);
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (status, read(&out), read(&err))
}

/// An audit file the proxy cannot open is the file's problem, found before anything starts:
/// exit 64 (which the systemd unit does not restart on), the policy file, the line and the
/// field, the path and the system's reason; never "started" followed by exit 1 (issue 28:
/// under systemd's read-only /var/log the unit was restarted ten times). `--check` warns
/// about it and still passes (the directory may be made at start: LogsDirectory=).
#[test]
fn an_unwritable_audit_file_stops_the_start_naming_it() {
    let dir = TempDir::new("audit-badpath");
    let not_a_dir = write_file(dir.path(), "plain-file", "");
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    let mut cases = vec![
        (
            dir.path().join("missing/audit.jsonl"),
            "No such file or directory",
            "does not exist",
        ),
        (
            not_a_dir.join("audit.jsonl"),
            "Not a directory",
            "is not a directory",
        ),
    ];
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
        // Root writes there all the same: the permission case needs an ordinary user.
        if std::fs::write(locked.join("probe"), "").is_ok() {
            println!("SKIPPED the permission-denied case: this test runs as root");
        } else {
            cases.push((
                locked.join("audit.jsonl"),
                "Permission denied",
                "cannot write in",
            ));
        }
    }
    let closed = format!("127.0.0.1:{}", common::free_port());
    for (i, (output, os_error, hint)) in cases.iter().enumerate() {
        let policy = write_file(
            dir.path(),
            &format!("policy-{i}.yaml"),
            &format!(
                "audit:\n  commands: writes\n  output: {}\n",
                output.display()
            ),
        );
        let policy = policy.to_str().unwrap();
        let listen = format!("127.0.0.1:{}", common::free_port());
        let args = ["--config", policy, "--admin", "off", "--listen", &listen];
        let (code, stdout, stderr) = run_to_exit(&[&args[..], &["--upstream", &closed]].concat());
        assert_eq!(code, Some(64), "{output:?}: {stderr}");
        let want = format!(
            "{policy}:3: field `audit.output`: cannot open {} to append the audit trail: {os_error}",
            output.display()
        );
        assert!(stderr.contains(&want), "want {want}\ngot {stderr}");
        assert!(stderr.contains(hint), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(
            !stderr.contains("started") && !stdout.contains("started"),
            "{stderr}"
        );

        // --check: the same finding as a warning, and the file passes.
        let (code, stdout, stderr) = run_to_exit(&["--check", policy]);
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(stdout.trim(), format!("{policy}: OK"));
        let want = format!(
            "{policy}:3: warning: field `audit.output`: cannot open {}",
            output.display()
        );
        assert!(
            stderr.contains(&want) && stderr.contains(os_error),
            "want {want}\ngot {stderr}"
        );
    }

    // A file that can be written: no warning, and --check leaves nothing behind.
    let output = dir.path().join("audit.jsonl");
    let policy = write_file(
        dir.path(),
        "good.yaml",
        &format!(
            "audit:\n  commands: writes\n  output: {}\n",
            output.display()
        ),
    );
    let (code, _, stderr) = run_to_exit(&["--check", policy.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert!(!output.exists(), "--check left {output:?} behind");
}
