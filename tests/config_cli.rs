//! The `redis-policy-proxy` binary: `--check`, start-up with a bad file, command-line
//! overrides, and serving real traffic as a separate process.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::process::ProxyProcess;
use common::*;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_redis-policy-proxy");

/// Exit code for a configuration problem (EX_USAGE).
const EX_USAGE: i32 = 64;

type Run = common::process::BinRun;

/// Runs the binary to completion, bounded by the deadline.
async fn run_bin(args: &[&str]) -> Run {
    run_bin_with(args, &[]).await
}

/// [`run_bin`] with `env` added to the environment.
async fn run_bin_with(args: &[&str], env: &[(&str, &str)]) -> Run {
    common::process::run_bin(args, env).await
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// True if `text` points at `line` of a file, in either `FILE:LINE` or "line LINE" style.
fn mentions_line(text: &str, file: &str, line: u32) -> bool {
    text.contains(&format!("{file}:{line}"))
        || text.contains(&format!("line {line}"))
        || text.contains(&format!(":{line}:"))
}

const GOOD: &str = "\
listen: 127.0.0.1:6380
upstream:
  address: 127.0.0.1:6379
  connections: 2
  connect_timeout_ms: 500
  reconnect_min_ms: 10
  reconnect_max_ms: 1000
  queue_depth: 256
limits:
  max_clients: 100
  max_bulk_len: 1048576
  max_multibulk_len: 1024
  max_inline_len: 4096
  max_query_buffer: 1048576
  max_inflight: 64
shutdown_grace_ms: 1000
workers: 1
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_accepts_a_good_file() {
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    let good = write_file(dir, "good.yaml", GOOD);
    let r = run_bin(&["--check", path_str(&good)]).await;
    assert_eq!(r.code, Some(0), "stderr: {} stdout: {}", r.stderr, r.stdout);
    let empty = write_file(dir, "empty.yaml", "");
    let r = run_bin(&["--check", path_str(&empty)]).await;
    assert_eq!(
        r.code,
        Some(0),
        "an empty file means defaults: {}",
        r.stderr
    );
    let auth = write_file(
        dir,
        "auth.yaml",
        "upstream:\n  address: localhost:6379\n  username: app\n  password: s3cret\n",
    );
    let r = run_bin(&["--check", path_str(&auth)]).await;
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    assert!(
        !r.stderr.contains("s3cret") && !r.stdout.contains("s3cret"),
        "the password must not be printed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_rejects_a_typo_naming_file_line_and_key() {
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    let bad = write_file(
        dir,
        "typo.yaml",
        "listen: 127.0.0.1:6380\nupstream:\n  adress: 127.0.0.1:6379\n",
    );
    let file = path_str(&bad);
    let r = run_bin(&["--check", file]).await;
    assert_eq!(r.code, Some(EX_USAGE), "stderr: {}", r.stderr);
    assert!(
        r.stderr.contains(file),
        "stderr must name the file: {}",
        r.stderr
    );
    assert!(
        r.stderr.contains("adress"),
        "stderr must name the key: {}",
        r.stderr
    );
    assert!(
        mentions_line(&r.stderr, file, 3),
        "stderr must name line 3: {}",
        r.stderr
    );

    let top = write_file(dir, "top.yaml", "listen: 127.0.0.1:6380\nworkerz: 2\n");
    let r = run_bin(&["--check", path_str(&top)]).await;
    assert_eq!(r.code, Some(EX_USAGE), "stderr: {}", r.stderr);
    assert!(r.stderr.contains("workerz"), "{}", r.stderr);
    assert!(mentions_line(&r.stderr, path_str(&top), 2), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_lists_every_invalid_value_with_file_line_and_field() {
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    let bad = write_file(
        dir,
        "invalid.yaml",
        "listen: nowhere\nupstream:\n  address: 127.0.0.1:6379\n  connections: 0\nlimits:\n  max_inflight: 0\n",
    );
    let file = path_str(&bad);
    let r = run_bin(&["--check", file]).await;
    assert_eq!(r.code, Some(EX_USAGE), "stderr: {}", r.stderr);
    for want in [
        format!("{file}:1: field `listen`"),
        format!("{file}:4: field `upstream.connections`"),
        format!("{file}:6: field `limits.max_inflight`"),
    ] {
        assert!(
            r.stderr.contains(&want),
            "missing {want:?} in: {}",
            r.stderr
        );
    }
}

/// Writes `text` as `name` in `dir` and runs `--check` on it: the file's path and the result.
async fn check(dir: &Path, name: &str, text: &str) -> (String, Run) {
    let file = path_str(&write_file(dir, name, text)).to_string();
    let r = run_bin(&["--check", &file]).await;
    (file, r)
}

/// Asserts that `--check` refused its file (exit 64) and printed each of `want`.
fn assert_refused(r: &Run, want: &[String]) {
    assert_eq!(r.code, Some(EX_USAGE), "stderr: {}", r.stderr);
    for w in want {
        assert!(
            r.stderr.contains(w.as_str()),
            "missing {w:?} in: {}",
            r.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_of_sentinel_mode_names_file_line_and_field() {
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    let sentinel = "upstream:\n  mode: sentinel\n  sentinel:\n    sentinels: [127.0.0.1:26379";
    let (_, r) = check(
        dir,
        "sentinel.yaml",
        &format!("{sentinel}, 127.0.0.1:26380]\n    master_name: mymaster\n"),
    )
    .await;
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);

    let (file, r) = check(
        dir,
        "typo.yaml",
        &format!("{sentinel}]\n    master_nmae: mymaster\n"),
    )
    .await;
    assert_refused(&r, &[file.clone(), "master_nmae".into()]);
    assert!(mentions_line(&r.stderr, &file, 5), "{}", r.stderr);

    let (file, r) = check(dir, "missing.yaml", &format!("{sentinel}]\n")).await;
    assert_refused(
        &r,
        &[format!(
            "{file}:2: field `upstream.sentinel.master_name`: is required"
        )],
    );
}

/// Two tenants' namespaces where one is a prefix of the other (`app:` and `app:2:`) are
/// refused: tenant `app`'s keys `2:x` are tenant `app2`'s `x`. File, line and field named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_refuses_overlapping_namespaces_naming_file_line_and_field() {
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    let access = "access:\n  identities:\n    - {tenant: app, cidr: 10.0.0.1/32}\n    - {tenant: app2, cidr: 10.0.0.2/32}\n    - {tenant: other, cidr: 10.0.0.3/32}\n  namespaces:\n";
    let (_, r) = check(
        dir,
        "apart.yaml",
        &format!("{access}    app: 'app:'\n    app2: 'app2:'\n    other: 'other:'\n"),
    )
    .await;
    assert_eq!(r.code, Some(0), "stderr: {}", r.stderr);
    let (file, r) = check(
        dir,
        "overlap.yaml",
        &format!("{access}    app: 'app:'\n    app2: 'app:2:'\n    other: 'other:'\n"),
    )
    .await;
    assert_refused(
        &r,
        &[format!(
            "{file}:8: field `access.namespaces.app2`: `app:2:` begins with tenant app's namespace `app:`"
        )],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_of_cluster_read_from_names_file_line_and_field() {
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    let cluster = "upstream:\n  mode: cluster\n  cluster:\n    seeds: [127.0.0.1:7000]\n";
    for value in ["primary", "replica", "nearest"] {
        let text = format!("{cluster}    read_from: {value}\n");
        let (_, r) = check(dir, &format!("{value}.yaml"), &text).await;
        assert_eq!(r.code, Some(0), "{value}: stderr: {}", r.stderr);
    }
    let (file, r) = check(dir, "bad.yaml", &format!("{cluster}    read_from: slave\n")).await;
    assert_refused(
        &r,
        &[format!(
            "{file}:5: field `upstream.cluster.read_from`: must be primary, replica or nearest"
        )],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_of_sentinel_read_from_names_file_line_and_field() {
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    let sentinel = "upstream:\n  mode: sentinel\n  sentinel:\n    sentinels: [127.0.0.1:26379]\n    master_name: mymaster\n";
    for value in ["primary", "replica"] {
        let text = format!("{sentinel}    read_from: {value}\n");
        let (_, r) = check(dir, &format!("{value}.yaml"), &text).await;
        assert_eq!(r.code, Some(0), "{value}: stderr: {}", r.stderr);
    }
    let (file, r) = check(
        dir,
        "nearest.yaml",
        &format!("{sentinel}    read_from: nearest\n"),
    )
    .await;
    assert_refused(
        &r,
        &[format!(
            "{file}:6: field `upstream.sentinel.read_from`: nearest is not supported in sentinel mode"
        )],
    );
    let (file, r) = check(
        dir,
        "bad.yaml",
        &format!("{sentinel}    read_from: slave\n"),
    )
    .await;
    assert_refused(
        &r,
        &[format!(
            "{file}:6: field `upstream.sentinel.read_from`: must be primary or replica"
        )],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_rejects_a_mistyped_value_naming_the_field() {
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    let bad = write_file(dir, "type.yaml", "limits:\n  max_clients: lots\n");
    let file = path_str(&bad);
    let r = run_bin(&["--check", file]).await;
    assert_eq!(r.code, Some(EX_USAGE), "stderr: {}", r.stderr);
    assert!(r.stderr.contains(file), "{}", r.stderr);
    assert!(r.stderr.contains("max_clients"), "{}", r.stderr);
    assert!(mentions_line(&r.stderr, file, 2), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_of_a_missing_file_fails_naming_it() {
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    let missing = dir.join("nope.yaml");
    let r = run_bin(&["--check", path_str(&missing)]).await;
    assert_ne!(r.code, Some(0));
    assert!(r.code.is_some(), "killed by a signal instead of exiting");
    assert!(r.stderr.contains(path_str(&missing)), "{}", r.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_with_a_bad_file_exits_64() {
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    let bad = write_file(dir, "bad.yaml", "upstream:\n  adress: x\n");
    let file = path_str(&bad);
    let r = run_bin(&["--config", file]).await;
    assert_eq!(r.code, Some(EX_USAGE), "stderr: {}", r.stderr);
    assert!(r.stderr.contains(file), "{}", r.stderr);
    assert!(r.stderr.contains("adress"), "{}", r.stderr);
    assert!(mentions_line(&r.stderr, file, 2), "{}", r.stderr);

    let invalid = write_file(dir, "invalid.yaml", "upstream:\n  connections: 1000\n");
    let r = run_bin(&["--config", path_str(&invalid)]).await;
    assert_eq!(r.code, Some(EX_USAGE), "stderr: {}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "{}:2: field `upstream.connections`",
            path_str(&invalid)
        )),
        "{}",
        r.stderr
    );
}

/// The binary running as a server, killed on drop.
struct Server {
    child: std::process::Child,
}

impl Server {
    fn spawn(args: &[&str]) -> Server {
        Server::spawn_logging(args, Stdio::null())
    }

    /// Like `spawn`, with the proxy's log (stderr) going to `log`. The admin endpoint is off
    /// unless `args` name one: its default port is fixed, and tests run in parallel.
    fn spawn_logging(args: &[&str], log: impl Into<Stdio>) -> Server {
        let admin_off: &[&str] = if args.contains(&"--admin") {
            &[]
        } else {
            &["--admin", "off"]
        };
        let child = Command::new(BIN)
            .args(args)
            .args(admin_off)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn redis-policy-proxy");
        Server { child }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    /// Polls until the proxy answers PONG, within the deadline, then checks with redis-cli.
    /// `Err` if the process exited first (e.g. it lost a race for the port).
    async fn wait_ready(&mut self, port: u16) -> Result<(), String> {
        let until = Instant::now() + DEADLINE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("redis-policy-proxy exited early: {status}"));
            }
            if let Some(mut c) = Raw::try_connect(format!("127.0.0.1:{port}"), DEADLINE).await {
                c.send(b"PING\r\n").await;
                let got = c.collect_frames(1, Duration::from_secs(2)).await;
                if got.frames.first().is_some_and(|f| f == b"+PONG\r\n") {
                    break;
                }
            }
            assert!(
                Instant::now() < until,
                "proxy on port {port} never answered PING"
            );
            tokio::time::sleep(POLL).await;
        }
        let out = redis_cli(port, &["PING"]).await;
        assert_eq!(out.stdout, "PONG\n", "stderr: {}", out.stderr);
        Ok(())
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(status.success());
        let until = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < until,
                "no exit within {DEADLINE:?} of SIGTERM"
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_and_upstream_flags_override_the_file() {
    let redis = RedisServer::start();
    let tmp = TempDir::new("cfg");
    let dir = tmp.path();
    // The file points at addresses where nothing works; the flags must win.
    let dead = free_port();
    let file = write_file(
        dir,
        "proxy.yaml",
        &format!(
            "listen: 127.0.0.1:{}\nupstream:\n  address: 127.0.0.1:{dead}\nshutdown_grace_ms: 1000\n",
            free_port()
        ),
    );
    let mut last = String::new();
    for _ in 0..5 {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut server = Server::spawn(&[
            "--config",
            path_str(&file),
            "--listen",
            &listen,
            "--upstream",
            &redis.addr(),
        ]);
        // A lost race for the port makes the binary exit; try another one.
        if let Err(e) = server.wait_ready(port).await {
            last = e;
            continue;
        }
        let out = redis_cli(port, &["SET", "via-binary", "yes"]).await;
        assert_eq!(out.stdout, "OK\n", "stderr: {}", out.stderr);
        assert_eq!(redis.direct(&["GET", "via-binary"]).await, b"$3\r\nyes\r\n");
        let status = server.terminate().await;
        assert!(status.success(), "exit after SIGTERM: {status}");
        return;
    }
    panic!("could not start the binary: {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_alone_are_enough() {
    let redis = RedisServer::start();
    let mut last = String::new();
    for _ in 0..5 {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut server = Server::spawn(&["--listen", &listen, "--upstream", &redis.addr()]);
        if let Err(e) = server.wait_ready(port).await {
            last = e;
            continue;
        }
        let out = redis_cli(port, &["-r", "3", "INCR", "n"]).await;
        assert_eq!(out.stdout, "1\n2\n3\n");
        let status = server.terminate().await;
        assert!(status.success(), "exit after SIGTERM: {status}");
        return;
    }
    panic!("could not start the binary: {last}");
}

/// Polls `cmd` through redis-cli until its output satisfies `ok`, within the deadline.
async fn eventually(port: u16, cmd: &[&str], ok: impl Fn(&str) -> bool, what: &str) {
    let until = Instant::now() + DEADLINE;
    loop {
        let out = redis_cli(port, cmd).await;
        if ok(&out.stdout) {
            return;
        }
        assert!(
            Instant::now() < until,
            "{what}: last output {:?}",
            out.stdout
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_rules_and_keeps_the_old_ones_when_the_file_is_broken() {
    let redis = RedisServer::start();
    let tmp = TempDir::new("reload");
    let dir = tmp.path();
    let rules = |cmd: &str| format!("rules:\n  - id: no-{cmd}\n    deny: [{cmd}]\n");
    let file = write_file(dir, "policy.yaml", &rules("KEYS"));
    let log_path = dir.join("proxy.log");
    let mut last = String::new();
    for _ in 0..5 {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(&log_path).unwrap();
        let args = [
            "--config",
            path_str(&file),
            "--listen",
            &listen,
            "--upstream",
            &redis.addr(),
        ];
        let mut server = Server::spawn_logging(&args, log);
        if let Err(e) = server.wait_ready(port).await {
            last = e;
            continue;
        }
        let out = redis_cli(port, &["KEYS", "*"]).await;
        assert!(
            out.stdout.contains("policy no-KEYS"),
            "{out:?}",
            out = out.stdout
        );

        // A new file, then SIGHUP: the new rules apply to the next commands.
        write_file(dir, "policy.yaml", &rules("DBSIZE"));
        server.signal("-HUP");
        eventually(
            port,
            &["DBSIZE"],
            |o| o.contains("policy no-DBSIZE"),
            "reload",
        )
        .await;
        assert!(
            !redis_cli(port, &["KEYS", "*"])
                .await
                .stdout
                .contains("policy")
        );

        // A broken file: the reload fails, the running rules stay, the log says why.
        write_file(
            dir,
            "policy.yaml",
            "rules:\n  - id: x\n    deny: [NOSUCHCOMMAND]\n",
        );
        server.signal("-HUP");
        let until = Instant::now() + DEADLINE;
        loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if log.contains("reload failed") {
                assert!(log.contains("NOSUCHCOMMAND"), "{log}");
                break;
            }
            assert!(Instant::now() < until, "no reload failure logged: {log}");
            tokio::time::sleep(POLL).await;
        }
        let out = redis_cli(port, &["DBSIZE"]).await;
        assert!(out.stdout.contains("policy no-DBSIZE"), "{}", out.stdout);

        // Without a signal: a changed file is picked up by itself (polled every second).
        write_file(dir, "policy.yaml", &rules("ECHO"));
        eventually(
            port,
            &["ECHO", "x"],
            |o| o.contains("policy no-ECHO"),
            "file watch",
        )
        .await;
        assert!(server.terminate().await.success());
        return;
    }
    panic!("could not start the binary: {last}");
}

/// Runs the binary with `stdin` as its standard input.
async fn run_bin_with_stdin(args: &[&str], stdin: &str) -> Run {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn redis-policy-proxy");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("redis-policy-proxy exited in time")
        .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_prints_what_the_policy_does_to_a_command() {
    // The default policy with its data-changing rules enforced, as after the rollout.
    let tmp = TempDir::new("explain-enforced");
    let default = write_file(tmp.path(), "default.yaml", &default_policy_enforced());
    let r = run_bin(&["--explain", path_str(&default), "KEYS user:*"]).await;
    assert_eq!(r.code, Some(1), "a refusal exits 1: {}", r.stderr);
    assert!(
        r.stdout.contains(
            "\n  deny-keys: refuses\n  refused: -NOPERM policy deny-keys: KEYS is not allowed"
        ),
        "{}",
        r.stdout
    );
    let r = run_bin(&["--explain", path_str(&default), "GET user:1"]).await;
    assert_eq!(r.code, Some(0));
    assert_eq!(
        r.stdout,
        "client 127.0.0.1 user (none) -> tenant default\n> GET user:1\n  forwarded unchanged\n"
    );
    // Enforced, the rewrite shows its rule, the prefix behind the TTL, and what is sent.
    let r = run_bin(&["--explain", path_str(&default), "SET session:1 \"a b\""]).await;
    assert_eq!(r.code, Some(0));
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines[2],
        "  ttl-default: rewrites: SET sent with KEEPTTL; a new key gets <ttl>, one that existed without a TTL keeps none (`session:1` 1d (prefix `session:`))"
    );
    assert!(
        lines[3]
            .starts_with("  first, reply hidden: EVAL \"redis.call('pexpire', KEYS[1], '1152921504606846976', 'NX')"),
        "{}",
        lines[3]
    );
    assert_eq!(lines[4], "  sent as: SET session:1 \"a b\" KEEPTTL");
    assert!(
        lines[5].starts_with(
            "  then, reply hidden: EVAL \"if redis.call('pexpire', KEYS[1], ARGV[1], 'NX')"
        ) && lines[5].ends_with("\" 1 session:1 86400000"),
        "{}",
        lines[5]
    );
    // `keys: written`: the PX appended in place, and a script's declared key its PEXPIRE NX.
    let written = write_file(
        tmp.path(),
        "written.yaml",
        &default_policy_enforced().replace("keys: created", "keys: written"),
    );
    let input = "SET user:1 v\nEVAL \"return redis.call('SET', KEYS[1], ARGV[1])\" 1 user:2 v\n";
    let r = run_bin_with_stdin(&["--explain", path_str(&written)], input).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("\n  sent as: SET user:1 v PX 3600000\n"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("\n  then, reply hidden: PEXPIRE user:2 3600000 NX\n"),
        "{}",
        r.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_a_tenants_view() {
    let tmp = TempDir::new("explain");
    let file = write_file(
        tmp.path(),
        "p.yaml",
        "access:\n  users:\n    - {name: app, password_sha256: 71d3d4e36cf4bc4309fd7390ba79fc6a1d03d8d7b45ef26f04bcdff3ff116868}\n  identities:\n    - {tenant: app, user: app}\n  namespaces:\n    app: 'app:'\n",
    );
    let r = run_bin(&["--explain", path_str(&file), "GET k", "--as-user", "app"]).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "client 127.0.0.1 user app -> tenant app\n> GET k\n  namespace: tenant `app`'s prefix `app:` on every key\n  sent as: GET app:k\n"
    );
    let r = run_bin(&["--explain", path_str(&file), "FLUSHALL", "--as-user", "app"]).await;
    assert_eq!(r.code, Some(1));
    assert!(
        r.stdout.contains("refused: -NOPERM policy namespace"),
        "{}",
        r.stdout
    );
}

/// policy/README.md's `--explain` example is exactly what `--explain` prints for its commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_explain_example_is_what_explain_prints() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("policy/README.md")).unwrap();
    let marker = "<!-- explain example: tests/config_cli.rs the_readmes_explain_example_is_what_explain_prints -->\n```\n";
    let start = readme
        .find(marker)
        .expect("the example in policy/README.md")
        + marker.len();
    let block = &readme[start..start + readme[start..].find("```\n").unwrap()];
    let (command_line, expected) = block.split_once('\n').unwrap();
    assert_eq!(
        command_line,
        "$ redis-policy-proxy --explain policy/default.yaml < commands.txt"
    );
    let commands: String = expected
        .lines()
        .filter_map(|l| l.strip_prefix("> "))
        .map(|c| format!("{c}\n"))
        .collect();
    let default = root.join("policy/default.yaml");
    let r = run_bin_with_stdin(&["--explain", path_str(&default)], &commands).await;
    assert_eq!(
        r.stdout, expected,
        "policy/README.md's example is out of date"
    );
    assert_eq!(r.code, Some(1), "the example has refusals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_and_metrics_record_denials_and_failed_reloads() {
    let redis = RedisServer::start();
    let tmp = TempDir::new("jsonlog");
    let dir = tmp.path();
    let file = write_file(
        dir,
        "policy.yaml",
        "rules:\n  - id: no-KEYS\n    deny: [KEYS]\n",
    );
    let log_path = dir.join("proxy.log");
    let admin = format!("127.0.0.1:{}", free_port());
    let args = ["--admin", admin.as_str(), "--log-format", "json"];
    let proxy = ProxyProcess::start(&file, &redis, log_path.clone(), &args).await;
    let port = proxy.port;
    {
        let admin: std::net::SocketAddr = admin.parse().unwrap();
        let out = redis_cli(port, &["KEYS", "secret-key-name*"]).await;
        assert!(out.stdout.contains("policy no-KEYS"), "{}", out.stdout);

        // One JSON object per line; the denial is a structured event without the key.
        let until = Instant::now() + DEADLINE;
        let denial = loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let events: Vec<serde_json::Value> = log
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect();
            if let Some(e) = events
                .iter()
                .find(|e| e["message"] == "policy denied a command")
            {
                assert!(
                    !log.contains("secret-key-name"),
                    "a key reached the log: {log}"
                );
                break e.clone();
            }
            assert!(Instant::now() < until, "no denial event: {log}");
            tokio::time::sleep(POLL).await;
        };
        assert_eq!(denial["rule"], "no-KEYS", "{denial}");
        assert_eq!(denial["command"], "keys", "{denial}");
        assert_eq!(denial["tenant"], "default", "{denial}");
        assert_eq!(denial["client"], "127.0.0.1", "{denial}");
        assert_eq!(denial["level"], "WARN", "{denial}");

        // A broken file on SIGHUP: counted as a failed reload, the old rules stay.
        let before = http_get(admin, "/metrics").await.1;
        let version = before
            .lines()
            .find(|l| l.starts_with("rpp_policy_info{"))
            .unwrap()
            .to_string();
        write_file(
            dir,
            "policy.yaml",
            "rules:\n  - id: x\n    deny: [NOSUCHCOMMAND]\n",
        );
        proxy.signal("-HUP");
        let until = Instant::now() + DEADLINE;
        loop {
            let text = http_get(admin, "/metrics").await.1;
            if sample(&text, r#"rpp_config_reloads_total{result="failed"}"#) >= 1.0 {
                assert!(
                    text.contains(&version),
                    "the policy version changed:\n{text}"
                );
                assert_eq!(
                    sample(&text, r#"rpp_config_reloads_total{result="ok"}"#),
                    0.0
                );
                break;
            }
            assert!(Instant::now() < until, "no failed reload counted:\n{text}");
            tokio::time::sleep(POLL).await;
        }
        let out = redis_cli(port, &["KEYS", "*"]).await;
        assert!(out.stdout.contains("policy no-KEYS"), "{}", out.stdout);
    }
}

/// `--print-acl` prints the `ACL SETUSER` line mirroring the policy's deny rules; applied to
/// Redis, it keeps a script from running KEYS while what the policy allows still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn print_acl_prints_the_line_that_keeps_scripts_from_running_denied_commands() {
    let default = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let r = run_bin(&["--print-acl", path_str(&default)]).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let line = r.stdout.trim_end();
    assert!(
        line.starts_with("ACL SETUSER default -")
            && !line.contains('+')
            && line.contains(" -keys ")
            && line.contains(" -flushall ")
            && line.contains(" -swapdb"),
        "{line}"
    );
    let redis = RedisServer::start();
    let args: Vec<&str> = line.split(' ').collect();
    assert_eq!(redis.direct(&args).await, b"+OK\r\n");
    let keys = redis
        .direct(&["EVAL", "return redis.call('KEYS','*')", "0"])
        .await;
    assert!(
        keys.starts_with(b"-ERR The user executing the script can't run this command"),
        "{}",
        String::from_utf8_lossy(&keys)
    );
    assert_eq!(
        redis
            .direct(&["EVAL", "return redis.call('SET', KEYS[1], 'v')", "1", "k"])
            .await,
        b"+OK\r\n"
    );
    // A file that does not validate: exit 64 with its problems.
    let tmp = TempDir::new("print-acl");
    let bad = write_file(
        tmp.path(),
        "bad.yaml",
        "rules:\n  - id: x\n    deny: [NOPE]\n",
    );
    let r = run_bin(&["--print-acl", path_str(&bad)]).await;
    assert_eq!(r.code, Some(EX_USAGE), "{}", r.stdout);
    assert!(r.stderr.contains("unknown command `NOPE`"), "{}", r.stderr);
}

/// `--print-acl`'s line only takes rights away: applied to a least-privilege user (GET and
/// SET on `app:*`), ACL DRYRUN still refuses it CONFIG SET, SHUTDOWN, ACL SETUSER and DEBUG
/// (a `+@all` first granted them), and what it had still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn print_acl_never_grants_a_least_privilege_user_anything() {
    let tmp = TempDir::new("print-acl-least");
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml"))
            .unwrap()
            .replace(
                "upstream:\n",
                "upstream:\n  username: app\n  password: app-secret\n",
            );
    let file = write_file(tmp.path(), "app.yaml", &text);
    let r = run_bin(&["--print-acl", path_str(&file)]).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let line = r.stdout.trim_end();
    assert!(line.starts_with("ACL SETUSER app -"), "{line}");
    assert!(!line.contains('+'), "{line}");
    let redis = RedisServer::start();
    assert_eq!(
        redis
            .direct(&[
                "ACL",
                "SETUSER",
                "app",
                "on",
                ">app-secret",
                "~app:*",
                "+get",
                "+set"
            ])
            .await,
        b"+OK\r\n"
    );
    let args: Vec<&str> = line.split(' ').collect();
    assert_eq!(redis.direct(&args).await, b"+OK\r\n");
    for cmd in [
        &["config", "set", "maxmemory", "1"][..],
        &["shutdown"],
        &["acl", "setuser", "x"],
        &["debug", "sleep", "0"],
        &["flushall"],
        &["keys", "*"],
    ] {
        let mut dry = vec!["ACL", "DRYRUN", "app"];
        dry.extend_from_slice(cmd);
        let reply = redis.direct(&dry).await;
        assert!(
            reply.starts_with(b"$"),
            "{cmd:?} allowed: {}",
            String::from_utf8_lossy(&reply)
        );
    }
    assert_eq!(
        redis
            .direct(&["ACL", "DRYRUN", "app", "get", "app:1"])
            .await,
        b"+OK\r\n"
    );
}

/// `--survey` reads a Redis seeded with known keys (read-only) and reports what the policy
/// would change: keys without a TTL by prefix, TTLs above the max, values above the cap,
/// names off the pattern, and keys left with the created-mode marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survey_reports_what_the_policy_would_change_in_existing_data() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    redis
        .direct(&["HSET", "config:features", "dark", "on"])
        .await;
    redis.direct(&["SET", "config:name", "shop"]).await;
    redis.direct(&["SET", "session:1", "u", "EX", "1000"]).await;
    redis
        .direct(&["SET", "cache:page", "v", "EX", "2592000"])
        .await;
    redis.direct(&["SET", "BadName", "v", "EX", "60"]).await;
    let blob = "x".repeat(200_000);
    redis.direct(&["SET", "blob:1", &blob]).await;
    redis.direct(&["SET", "marked:1", "v"]).await;
    redis
        .direct(&["PEXPIRE", "marked:1", "1152921504606846976"])
        .await;
    let before = redis.direct(&["DEBUG", "DIGEST"]).await;
    assert!(
        before.starts_with(b"+") && before.len() == 43,
        "{}",
        String::from_utf8_lossy(&before)
    );
    let tmp = TempDir::new("survey");
    let file = write_file(
        tmp.path(),
        "p.yaml",
        "rules:\n  - id: ttl\n    ttl: {default: 1h, prefixes: [{prefix: 'session:', ttl: 24h}], max: 7d, keys: created}\n  - id: big\n    max_value_bytes: 102400\n  - id: names\n    key_pattern: '^[a-z]+(:[A-Za-z0-9_-]+)+$'\n",
    );
    let addr = redis.addr();
    let r = run_bin(&[
        "--survey",
        path_str(&file),
        "--upstream",
        &addr,
        "--rate",
        "100000",
    ])
    .await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let out = &r.stdout;
    for line in [
        "7 keys read (the whole keyspace)",
        "keys without a TTL, by prefix (rule `ttl`, keys: created: writes leave them persistent",
        "  config:: 2 of 2 keys; TTL 1h\n",
        "  session:: 0 of 1 keys; TTL 1d\n",
        "  blob:: 1 of 1 keys; TTL 1h\n",
        "TTLs above the max 7d (rule `ttl`): 1 (",
        "  cache:page (",
        "string values above max_value_bytes 102400 (rule `big`): 1 (",
        "  blob:1 (200000 bytes)",
        "keys not matching key_pattern ^[a-z]+(:[A-Za-z0-9_-]+)+$ (rule `names`): 1 (",
        "  BadName\n",
        "marker's far expiry (a proxy stopped between its two scripts; PERSIST them): 1\n  marked:1\n",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    // Read-only: the dataset is exactly as it was.
    assert_eq!(redis.direct(&["DEBUG", "DIGEST"]).await, before);
    // A sample stops early and says so.
    let r = run_bin(&[
        "--survey",
        path_str(&file),
        "--upstream",
        &addr,
        "--sample",
        "2",
    ])
    .await;
    assert!(
        r.stdout
            .contains("2 keys read (a sample: raise --sample to read more)"),
        "{}",
        r.stdout
    );
}

/// `--survey` that cannot read its upstream says so in one line naming the address and the
/// cause, and exits 69 (64 stays "the file cannot be used"): a closed port, a server that
/// accepts but never answers, a password-protected server without credentials (NOAUTH) or
/// with the wrong ones (WRONGPASS, naming where the password came from), and an ACL user
/// without the survey's commands. Never the Rust debug form of an error (`Os { code: 111,
/// kind: ConnectionRefused … }`, `Err("…")`), never the connection pool's retry logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survey_failures_are_one_line_naming_the_upstream_and_the_cause() {
    let tmp = TempDir::new("survey-fail");
    let policy = |name: &str, upstream: &str| {
        write_file(
            tmp.path(),
            name,
            &format!("upstream:\n  connect_timeout_ms: 500\n{upstream}rules: []\n"),
        )
    };
    let one_line = |r: &Run, addr: &str, cause: &[&str]| {
        assert_eq!(r.code, Some(69), "{}", r.stderr);
        assert!(r.stdout.is_empty(), "{}", r.stdout);
        let err = r.stderr.trim_end();
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("redis-policy-proxy --survey: "), "{err}");
        assert!(err.contains(addr), "{addr} not in {err}");
        for c in cause {
            assert!(err.contains(c), "{c:?} not in {err}");
        }
        for debug in [
            "Os {", "Error {", "kind:", "Err(", "Some(", "\\\"", " WARN ", " ERROR ",
        ] {
            assert!(!err.contains(debug), "{debug:?} in {err}");
        }
    };
    let plain = policy("plain.yaml", "");

    // Nothing listens.
    let closed = format!("127.0.0.1:{}", free_port());
    let r = run_bin(&["--survey", path_str(&plain), "--upstream", &closed]).await;
    one_line(
        &r,
        &closed,
        &["cannot reach the upstream", "connection refused"],
    );

    // Something listens and never answers (the kernel accepts into the backlog).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let r = run_bin(&["--survey", path_str(&plain), "--upstream", &silent_addr]).await;
    one_line(&r, &silent_addr, &["did not answer HELLO within 500 ms"]);
    drop(silent);

    // A password-protected Redis.
    let redis = RedisServer::start_with(&["--requirepass", "s3cret"]);
    redis.direct(&["SET", "user:1", "alice"]).await;
    redis
        .direct(&["ACL", "SETUSER", "nosurvey", "on", ">pw", "+hello", "+ping"])
        .await;
    let addr = redis.addr();
    let r = run_bin(&["--survey", path_str(&plain), "--upstream", &addr]).await;
    one_line(&r, &addr, &["NOAUTH", "upstream.password"]);
    let wrong = policy("wrong.yaml", "  password: nope\n");
    let r = run_bin(&["--survey", path_str(&wrong), "--upstream", &addr]).await;
    one_line(&r, &addr, &["WRONGPASS", "upstream.password"]);
    let from_env = policy("env.yaml", "  password_env: RPP_TEST_SURVEY_PASSWORD\n");
    let args = ["--survey", path_str(&from_env), "--upstream", &addr];
    let r = run_bin_with(&args, &[("RPP_TEST_SURVEY_PASSWORD", "nope")]).await;
    one_line(
        &r,
        &addr,
        &["WRONGPASS", "password_env (RPP_TEST_SURVEY_PASSWORD)"],
    );
    let acl = policy("acl.yaml", "  username: nosurvey\n  password: pw\n");
    let r = run_bin(&["--survey", path_str(&acl), "--upstream", &addr]).await;
    one_line(
        &r,
        &addr,
        &["SCAN was refused: NOPERM", "upstream.username"],
    );
    // With the right password: the report, exit 0.
    let r = run_bin_with(&args, &[("RPP_TEST_SURVEY_PASSWORD", "s3cret")]).await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("1 keys read (the whole keyspace)"),
        "{}",
        r.stdout
    );
    // A file that cannot be used stays 64.
    let bad = policy("bad.yaml", "  connections: 0\n");
    let r = run_bin(&["--survey", path_str(&bad), "--upstream", &addr]).await;
    assert_eq!(r.code, Some(64), "{}", r.stderr);
}

/// The startup log names the policy file, its version, and each rule with its mode, so an
/// operator sees what is enforced and what is only audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_log_names_the_policy_file_its_version_and_each_rules_mode() {
    let redis = RedisServer::start();
    let tmp = TempDir::new("startup-log");
    let default = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let admin = format!("127.0.0.1:{}", free_port());
    let proxy = ProxyProcess::start(
        &default,
        &redis,
        tmp.path().join("log"),
        &["--admin", &admin],
    )
    .await;
    let log = proxy.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("redis-policy-proxy started"))
        .unwrap_or_else(|| panic!("no startup line in {log}"));
    for part in [
        path_str(&default),
        "version=",
        "deny-keys enforce",
        "unbounded-reads audit",
        "streams-capped audit",
        "ttl-default audit",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
}

/// `--check` reports every problem in one run, parse errors included, each with file, line and
/// field, in the operator's words, with a "did you mean" for misspelt settings and commands,
/// and without follow-on errors; `-c FILE --check` checks the --config file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_every_problem_once_in_the_operators_words() {
    let tmp = TempDir::new("check-all");
    let bad = write_file(
        tmp.path(),
        "bad.yaml",
        "listen: 127.0.0.1:6380\nupstream:\n  adress: 127.0.0.1:6379\n  connect_timeout_ms: 5s\nrules:\n  - id: a\n    denny: [KEYS]\n  - id: b\n    mode: enfroce\n    deny: [KEY]\n  - id: c\n    ttl: {default: 5x, keys: created}\n  - id: d\n    deny: ['@dangerus']\n",
    );
    let file = path_str(&bad);
    for args in [&["--check", file][..], &["-c", file, "--check"]] {
        let r = run_bin(args).await;
        assert_eq!(r.code, Some(EX_USAGE), "{args:?}: {}", r.stderr);
        let want = [
            format!(
                "{file}:3: field `upstream.adress`: unknown setting `adress`; did you mean `address`?"
            ),
            format!(
                "{file}:4: field `upstream.connect_timeout_ms`: expected a number of milliseconds like 2000 (this setting is in ms), got `5s`"
            ),
            format!(
                "{file}:7: field `rules[0].denny`: unknown setting `denny`; did you mean `deny`?"
            ),
            format!(
                "{file}:9: field `rules[1].mode`: `enfroce` is not one of enforce, audit; did you mean `enforce`?"
            ),
            format!(
                "{file}:10: field `rules[1].deny`: unknown command `KEY`; did you mean `KEYS`?"
            ),
            format!(
                "{file}:12: field `rules[2].ttl.default`: expected a duration like 500ms, 30s, 15m, 24h, 7d or none, got `5x`"
            ),
            format!(
                "{file}:14: field `rules[3].deny`: unknown category `@dangerus`; did you mean `@dangerous`?"
            ),
        ];
        let got: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(got, want, "{args:?}");
    }
    // A YAML syntax error is reported too, and says that what follows was not checked.
    let syntax = write_file(
        tmp.path(),
        "syntax.yaml",
        "rules:\n  - id: b\n    deny: [KEYS\n  - id: c\n",
    );
    let r = run_bin(&["--check", path_str(&syntax)]).await;
    assert_eq!(r.code, Some(EX_USAGE));
    assert!(
        r.stderr.contains("nothing after it was checked"),
        "{}",
        r.stderr
    );
    let r = run_bin(&["--check"]).await;
    assert_eq!(r.code, Some(EX_USAGE));
    assert!(r.stderr.contains("-c FILE --check"), "{}", r.stderr);
}

/// A reload that changes settings only a restart applies says so (log, PROXY RELOAD), names
/// them, and keeps running with the old ones; moving lines around is no change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reports_the_settings_that_need_a_restart() {
    let redis = RedisServer::start();
    let tmp = TempDir::new("reload-restart");
    let v1 = "# v1\nlimits:\n  max_clients: 100\nrules:\n  - id: no-KEYS\n    deny: [KEYS]\n";
    let file = write_file(tmp.path(), "p.yaml", v1);
    let proxy = ProxyProcess::start(&file, &redis, tmp.path().join("log"), &[]).await;
    // Comments and order changed, values the same: a plain reload.
    write_file(
        tmp.path(),
        "p.yaml",
        "rules:\n  - id: no-KEYS\n    deny: [KEYS]\n# limits moved\nlimits: {max_clients: 100}\n",
    );
    proxy.signal("-HUP");
    proxy.wait_for_log("policy reloaded", 1).await;
    assert!(
        !proxy.log_text().contains("need a restart"),
        "{}",
        proxy.log_text()
    );
    // listen and limits changed, and a rule: the rule applies, the rest is reported.
    write_file(
        tmp.path(),
        "p.yaml",
        "listen: 127.0.0.1:1\nlimits:\n  max_clients: 200\nrules:\n  - id: no-DBSIZE\n    deny: [DBSIZE]\n",
    );
    proxy.signal("-HUP");
    proxy.wait_for_log("need a restart", 1).await;
    let log = proxy.log_text();
    let line = log.lines().find(|l| l.contains("need a restart")).unwrap();
    assert!(line.contains("settings=listen, limits"), "{line}");
    let out = redis_cli(proxy.port, &["DBSIZE"]).await;
    assert!(out.stdout.contains("policy no-DBSIZE"), "{}", out.stdout);
}
