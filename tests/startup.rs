//! What the binary does and says when it starts: the one summary line, the warning when no
//! policy is in force, flags over their RPP_* variables, and a start that fails with the
//! address when a port is taken. (What the container image runs, its defaults in RPP_*
//! variables, is tests/deploy.rs's.)

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_redis-policy-proxy");

/// The environment variables the binary reads; cleared for every child so the test runner's
/// own environment cannot change what a test sees.
const RPP_VARS: [&str; 5] = [
    "RPP_CONFIG",
    "RPP_LISTEN",
    "RPP_UPSTREAM",
    "RPP_ADMIN",
    "RPP_LOG_FORMAT",
];

/// The summary line's message.
const STARTED: &str = "redis-policy-proxy started";

fn default_policy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml")
}

/// The binary started with `args` and `env`, its stderr in a file; killed on drop.
struct Started {
    child: Child,
    log: PathBuf,
    _dir: TempDir,
}

impl Started {
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Started {
        let dir = TempDir::new("startup");
        let log = dir.path().join("proxy.log");
        let mut cmd = Command::new(BIN);
        for var in RPP_VARS {
            cmd.env_remove(var);
        }
        let child = cmd
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the log"))
            .spawn()
            .expect("spawn redis-policy-proxy");
        Started {
            child,
            log,
            _dir: dir,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The summary line, once logged (bounded by the deadline; panics if the process exits
    /// first).
    async fn summary(&mut self) -> String {
        let until = Instant::now() + DEADLINE;
        loop {
            let log = self.log_text();
            if let Some(line) = log.lines().find(|l| l.contains(STARTED)) {
                return line.to_string();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("exited ({status}) before the summary line: {log}");
            }
            assert!(Instant::now() < until, "no summary line: {log}");
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits (bounded) for the exit status.
    async fn exit_code(&mut self) -> Option<i32> {
        let until = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(Instant::now() < until, "still running: {}", self.log_text());
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of `key=value` in a text log line (values may be quoted).
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let start = line
        .find(&format!(" {key}="))
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
        + key.len()
        + 2;
    let rest = &line[start..];
    match rest.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"').unwrap_or(quoted.len())],
        None => rest.split(' ').next().unwrap_or(""),
    }
}

/// PING on `addr` until PONG, bounded.
async fn wait_pong(addr: &str) {
    let until = Instant::now() + DEADLINE;
    loop {
        if let Some(mut c) = Raw::try_connect(addr, DEADLINE).await {
            c.send(b"PING\r\n").await;
            let got = c.collect_frames(1, Duration::from_secs(2)).await;
            if got.frames.first().is_some_and(|f| f == b"+PONG\r\n") {
                return;
            }
        }
        assert!(Instant::now() < until, "no PONG from {addr}");
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_logs_one_summary_line_with_version_addresses_and_policy() {
    let redis = RedisServer::start();
    let policy = default_policy();
    let policy_arg = policy.to_str().unwrap();
    let mut proxy = Started::spawn(
        &[
            "--config",
            policy_arg,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--upstream",
            &redis.addr(),
        ],
        &[],
    );
    let line = proxy.summary().await;
    let listen = field(&line, "listen").to_string();
    wait_pong(&listen).await;

    let config = redis_policy_proxy::setup::load(&policy).expect("default policy loads");
    let compiled = redis_policy_proxy::setup::policy(&config).expect("default policy compiles");
    let (enforce, audit) = compiled.mode_counts();
    assert!(line.contains(" INFO "), "{line}");
    assert_eq!(field(&line, "version"), redis_policy_proxy::LONG_VERSION);
    assert!(
        listen.starts_with("127.0.0.1:") && !listen.ends_with(":0"),
        "{line}"
    );
    assert!(field(&line, "admin").starts_with("127.0.0.1:"), "{line}");
    assert_eq!(field(&line, "upstream_mode"), "standalone");
    assert_eq!(field(&line, "upstream"), redis.addr());
    assert_eq!(field(&line, "policy_file"), policy_arg);
    assert_eq!(field(&line, "policy_version"), compiled.version());
    assert_eq!(field(&line, "rules"), (enforce + audit).to_string());
    assert_eq!(field(&line, "enforce"), enforce.to_string());
    assert_eq!(field(&line, "audit"), audit.to_string());
    assert!(audit >= 1, "the default policy audits unbounded reads");

    // One summary; the upstream's first connection is one line too, not one per connection.
    let until = Instant::now() + DEADLINE;
    while !proxy.log_text().contains("upstream connected") {
        assert!(Instant::now() < until, "{}", proxy.log_text());
        tokio::time::sleep(POLL).await;
    }
    let log = proxy.log_text();
    assert_eq!(log.matches(STARTED).count(), 1, "{log}");
    assert_eq!(log.matches("upstream connected").count(), 1, "{log}");
    assert!(!log.contains("shared upstream connection"), "{log}");
    assert!(!log.contains("no policy in force"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_config_file_the_proxy_warns_that_no_policy_is_in_force() {
    let redis = RedisServer::start();
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "off",
        "--upstream",
        &redis.addr(),
    ];
    // No --config at all, and an empty RPP_CONFIG (which counts as unset).
    for env in [&[][..], &[("RPP_CONFIG", "")][..]] {
        let mut proxy = Started::spawn(&args, env);
        let line = proxy.summary().await;
        wait_pong(field(&line, "listen")).await;
        assert!(line.contains("NO POLICY IN FORCE"), "{line}");
        assert_eq!(field(&line, "rules"), "0", "{line}");
        assert_eq!(field(&line, "admin"), "off", "{line}");
        let log = proxy.log_text();
        let warning = log
            .lines()
            .find(|l| l.contains("no policy in force"))
            .unwrap_or_else(|| panic!("no warning: {log}"));
        assert!(warning.contains(" WARN "), "{warning}");
        assert!(warning.contains("--config"), "{warning}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flag_wins_over_its_environment_variable() {
    let redis = RedisServer::start();
    // The variables name addresses that cannot be bound; the flags must win over them.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let env = [
        ("RPP_LISTEN", taken.as_str()),
        ("RPP_ADMIN", taken.as_str()),
    ];
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "off",
        "--upstream",
        &redis.addr(),
    ];
    let mut proxy = Started::spawn(&args, &env);
    let line = proxy.summary().await;
    assert_ne!(field(&line, "listen"), taken, "{line}");
    assert_eq!(field(&line, "admin"), "off", "{line}");
    wait_pong(field(&line, "listen")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_occupied_client_port_stops_the_start_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut proxy = Started::spawn(&["--listen", &addr, "--admin", "off"], &[]);
    assert_eq!(proxy.exit_code().await, Some(1), "{}", proxy.log_text());
    let log = proxy.log_text();
    assert!(
        log.contains(&format!("cannot listen for clients on {addr}")),
        "{log}"
    );
    assert!(log.contains("in use"), "{log}");
    assert!(!log.contains(STARTED), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_occupied_admin_port_stops_the_start_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut proxy = Started::spawn(&["--listen", "127.0.0.1:0", "--admin", &addr], &[]);
    assert_eq!(proxy.exit_code().await, Some(1), "{}", proxy.log_text());
    let log = proxy.log_text();
    assert!(
        log.contains(&format!("cannot start the admin endpoint on {addr}")),
        "{log}"
    );
    assert!(log.contains("admin.listen") && log.contains("off"), "{log}");
    assert!(!log.contains(STARTED), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_names_the_commit_and_help_explains_every_flag() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        version.trim(),
        format!("redis-policy-proxy {}", redis_policy_proxy::LONG_VERSION)
    );
    let commit = redis_policy_proxy::COMMIT;
    assert!(
        commit == "unknown" || commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{commit}"
    );
    // In a git checkout the commit is HEAD's.
    if let Ok(head) = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
    {
        let head = String::from_utf8_lossy(&head.stdout);
        if std::env::var_os("RPP_GIT_COMMIT").is_none() && !head.trim().is_empty() {
            assert!(head.starts_with(commit), "{commit} is not HEAD {head}");
        }
    }

    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--listen",
        "--upstream",
        "--admin",
        "--log-format",
        "--check",
        "--explain",
        "--as-user",
        "--from",
    ] {
        let section = help_sections(&help)
            .into_iter()
            .find(|s| {
                s.lines()
                    .next()
                    .is_some_and(|h| h.contains(&format!("{flag} ")))
            })
            .unwrap_or_else(|| panic!("{flag} not in --help:\n{help}"));
        assert!(
            section.contains("Example:"),
            "{flag} has no example:\n{section}"
        );
    }
    for var in ["RPP_CONFIG", "RPP_LISTEN", "RPP_UPSTREAM", "RPP_ADMIN"] {
        assert!(help.contains(&format!("[env: {var}=")), "{var}:\n{help}");
    }
    assert!(help.contains("Examples:"), "{help}");
}

/// `--help` cut into one text per option: its header line (`  -c, --config <FILE>`,
/// `      --listen <IP:PORT>`) and the lines up to the next one.
fn help_sections(help: &str) -> Vec<String> {
    let mut sections: Vec<String> = Vec::new();
    for line in help.lines() {
        let header = line.starts_with("  -") || line.starts_with("      --");
        match sections.last_mut() {
            Some(s) if !header => {
                s.push('\n');
                s.push_str(line);
            }
            _ if header => sections.push(line.to_string()),
            _ => {}
        }
    }
    sections
}
