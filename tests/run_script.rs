//! `scripts/run.sh`, the README's first command, run as a user would: it prints the proxy's
//! pid and how to connect, reload, stop and find the logs once the proxy answers (and refuses
//! a listen port something else holds), a SIGHUP sent to the script reloads the proxy instead
//! of stopping it, and SIGTERM stops the proxy and the Redis the script started.
//! The script runs the test build of the binary (RPP_BIN) instead of building its own.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_redis-policy-proxy");

/// `scripts/run.sh` running in its own process group (so that whatever it started can be
/// stopped with it if a test fails), its stderr and the proxy's log in files.
struct RunScript {
    child: Child,
    /// The script's own messages.
    out: PathBuf,
    /// The proxy's log (the script's LOG).
    log: PathBuf,
    _dir: TempDir,
}

impl RunScript {
    /// Starts the script with `upstream` as UPSTREAM, `config` as CONFIG, `args` for the
    /// proxy and `env` (RPP_BIN or CARGO_TARGET_DIR: which binary it runs), with SIGHUP's
    /// default action whatever this test was started with (under nohup it is ignored, and
    /// bash cannot trap a signal ignored on entry).
    fn start(upstream: &str, config: &Path, args: &[&str], env: &[(&str, &str)]) -> RunScript {
        RunScript::start_as(upstream, config, args, env, "--default-signal=HUP")
    }

    /// [`start`](Self::start) with `hup` (an `env` option) deciding SIGHUP's disposition.
    fn start_as(
        upstream: &str,
        config: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        hup: &str,
    ) -> RunScript {
        let dir = TempDir::new("runsh");
        let out = dir.path().join("run.out");
        let log = dir.path().join("proxy.log");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/run.sh");
        let out_file = std::fs::File::create(&out).unwrap();
        let child = Command::new("env")
            .args([hup, "bash"])
            .arg(script)
            .args(args)
            .env("UPSTREAM", upstream)
            .env("CONFIG", config)
            .env("LOG", &log)
            .env_remove("RPP_BIN")
            .env_remove("CARGO_TARGET_DIR")
            .envs(env.iter().copied())
            .env_remove("RPP_LISTEN")
            .env_remove("RPP_ADMIN")
            .env_remove("RPP_CONFIG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(out_file.try_clone().unwrap())
            .stderr(out_file)
            .process_group(0)
            .spawn()
            .expect("run scripts/run.sh");
        RunScript {
            child,
            out,
            log,
            _dir: dir,
        }
    }

    fn out(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Both files, for failure messages.
    fn both(&self) -> String {
        format!("run.sh:\n{}\nproxy log:\n{}", self.out(), self.log())
    }

    /// Sends `signal` (e.g. `-HUP`) to the script itself, not its group.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Polls until `ok` holds for the script's output and the proxy's log, or fails.
    async fn wait_for(&mut self, what: &str, ok: impl Fn(&str, &str) -> bool) {
        let until = Instant::now() + DEADLINE;
        while !ok(&self.out(), &self.log()) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "run.sh exited ({status}) waiting for {what}: {}",
                    self.both()
                );
            }
            assert!(Instant::now() < until, "no {what}: {}", self.both());
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits (bounded) for the script to exit.
    async fn exit_status(&mut self) -> std::process::ExitStatus {
        let until = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < until,
                "run.sh still running: {}",
                self.both()
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for RunScript {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // The whole group: the script, the proxy and the Redis it may have started.
            let group = format!("-{}", self.child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = self.child.wait();
        }
    }
}

/// A policy denying KEYS.
fn policy(dir: &Path) -> PathBuf {
    write_file(
        dir,
        "policy.yaml",
        "rules:\n  - id: no-keys\n    deny: [KEYS]\n",
    )
}

/// The proxy's pid as the script printed it.
fn printed_pid(out: &str) -> u32 {
    out.lines()
        .find_map(|l| l.strip_prefix("run.sh: redis-policy-proxy pid "))
        .and_then(|rest| rest.split(':').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid printed: {out}"))
}

/// Runs the script until it serves, HUPs the script, and checks the proxy reloaded (the
/// reload counter and the log's trigger) and still serves. Returns the script for the caller
/// to stop.
async fn serve_and_reload(upstream: &str, env: &[(&str, &str)]) -> (RunScript, u16, TempDir) {
    let tmp = TempDir::new("runsh-policy");
    let admin = format!("127.0.0.1:{}", free_port());
    let config = policy(tmp.path());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let args = ["--listen", &listen, "--admin", &admin];
    let mut run = RunScript::start(upstream, &config, &args, env);
    // Serving, and done printing (the metrics line is the script's last).
    run.wait_for("the startup summary and the script's hints", |out, log| {
        log.contains("redis-policy-proxy started") && out.contains("  metrics: ")
    })
    .await;
    let mut c = Raw::connect(&listen).await;
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
    assert!(
        c.call(&["KEYS", "*"])
            .await
            .starts_with(b"-NOPERM policy no-keys"),
        "{}",
        run.both()
    );

    // What the script tells the user.
    let out = run.out();
    let pid = printed_pid(&out);
    for hint in [
        format!("kill -HUP {pid}"),
        format!("kill {pid}"),
        format!("redis-cli -p {port}"),
        run.log.display().to_string(),
        format!("http://{admin}/metrics"),
    ] {
        assert!(out.contains(&hint), "run.sh did not print {hint:?}: {out}");
    }

    // SIGHUP to the script: the proxy reloads (the file did not change, so the file watch
    // cannot be what reloaded it) and keeps serving.
    run.signal("-HUP");
    run.wait_for("a SIGHUP reload", |_, log| {
        log.lines()
            .any(|l| l.contains("policy reloaded") && l.contains("SIGHUP"))
    })
    .await;
    let admin: std::net::SocketAddr = admin.parse().unwrap();
    let metrics = http_get(admin, "/metrics").await.1;
    assert_eq!(
        sample(&metrics, r#"rpp_config_reloads_total{result="ok"}"#),
        1.0,
        "{metrics}"
    );
    assert!(run.child.try_wait().unwrap().is_none(), "{}", run.both());
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
    (run, port, tmp)
}

/// No Redis on UPSTREAM: the script starts one, runs the proxy as its child and forwards
/// SIGHUP to it; SIGTERM stops both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sh_forwards_sighup_to_the_proxy_it_runs_beside_its_own_redis() {
    let redis_port = free_port();
    let upstream = format!("127.0.0.1:{redis_port}");
    let (mut run, port, _policy) = serve_and_reload(&upstream, &[("RPP_BIN", BIN)]).await;
    assert!(run.out().contains("using RPP_BIN="), "{}", run.both());
    let out = run.out();
    assert!(out.contains("starting redis-server"), "{out}");
    assert!(
        out.contains(&format!("or kill -HUP {}, this script", run.child.id())),
        "{out}"
    );
    assert_ne!(
        printed_pid(&out),
        run.child.id(),
        "the proxy is a child here"
    );

    run.signal("-TERM");
    let status = run.exit_status().await;
    assert!(status.success(), "{status}: {}", run.both());
    assert!(
        run.log().contains("SIGTERM: draining clients"),
        "{}",
        run.both()
    );
    assert!(
        run.out().contains("stopping the redis-server"),
        "{}",
        run.both()
    );
    // Both are gone: nothing answers on either port.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    assert!(std::net::TcpStream::connect(("127.0.0.1", redis_port)).is_err());
}

/// A Redis already answers: the script becomes the proxy (same pid), so SIGHUP reaches it
/// directly. The binary of the default `quick` profile it finds is newer than every source:
/// it runs it without building.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sh_in_front_of_a_running_redis_becomes_the_proxy() {
    let redis = RedisServer::start();
    let target = TempDir::new("runsh-target");
    std::fs::create_dir(target.path().join("quick")).unwrap();
    // A symlink made now: `find -newer` compares the link's own time, which is after any
    // source's.
    std::os::unix::fs::symlink(BIN, target.path().join("quick/redis-policy-proxy")).unwrap();
    let env = [("CARGO_TARGET_DIR", target.path().to_str().unwrap())];
    let (mut run, _, _policy) = serve_and_reload(&redis.addr(), &env).await;
    let out = run.out();
    assert!(out.contains("using the Redis already answering"), "{out}");
    assert!(out.contains("quick binary up to date"), "{out}");
    assert!(!out.contains("building"), "{out}");
    assert_eq!(
        printed_pid(&out),
        run.child.id(),
        "the script execs the proxy"
    );
    run.signal("-TERM");
    assert!(run.exit_status().await.success(), "{}", run.both());
}

/// Started with SIGHUP ignored (as under nohup), the script cannot forward a HUP: it says so
/// and names the proxy's pid, which reloads on its own SIGHUP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sh_under_nohup_names_only_the_proxy_for_reloads() {
    let redis_port = free_port();
    let upstream = format!("127.0.0.1:{redis_port}");
    let tmp = TempDir::new("runsh-policy");
    let config = policy(tmp.path());
    let listen = format!("127.0.0.1:{}", free_port());
    let args = ["--listen", &listen, "--admin", "off"];
    let env = [("RPP_BIN", BIN)];
    let mut run = RunScript::start_as(&upstream, &config, &args, &env, "--ignore-signal=HUP");
    run.wait_for("the startup summary and the script's hints", |out, log| {
        log.contains("redis-policy-proxy started") && out.contains("  metrics: ")
    })
    .await;
    let out = run.out();
    let pid = printed_pid(&out);
    assert!(out.contains("started with SIGHUP ignored"), "{out}");
    assert!(!out.contains("which forwards it"), "{out}");
    let status = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    run.wait_for("a SIGHUP reload of the proxy", |_, log| {
        log.lines()
            .any(|l| l.contains("policy reloaded") && l.contains("SIGHUP"))
    })
    .await;
    run.signal("-TERM");
    assert!(run.exit_status().await.success(), "{}", run.both());
}

/// The hints (`try: redis-cli -p PORT`) come only once the proxy answers there: a stand-in
/// binary that starts the real one only when the test opens its gate shows nothing printed
/// before, and a proxy answering PING as soon as the hints are out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sh_prints_how_to_connect_only_once_the_proxy_answers() {
    let redis = RedisServer::start();
    let tmp = TempDir::new("runsh-gate");
    let config = policy(tmp.path());
    let started = tmp.path().join("started");
    let gate = tmp.path().join("gate");
    let wrapper = write_file(
        tmp.path(),
        "slow-proxy",
        &format!(
            "#!/bin/sh\n: > '{started}'\nwhile [ ! -e '{gate}' ]; do sleep 0.05; done\nexec '{BIN}' \"$@\"\n",
            started = started.display(),
            gate = gate.display(),
        ),
    );
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let args = ["--listen", &listen, "--admin", "off"];
    let mut run = RunScript::start(
        &redis.addr(),
        &config,
        &args,
        &[("RPP_BIN", wrapper.to_str().unwrap())],
    );
    let until = Instant::now() + DEADLINE;
    while !started.exists() {
        assert!(
            Instant::now() < until,
            "the binary never started: {}",
            run.both()
        );
        tokio::time::sleep(POLL).await;
    }
    assert!(
        !run.out().contains("try:"),
        "hints printed before the proxy serves: {}",
        run.both()
    );
    std::fs::write(&gate, "").unwrap();
    run.wait_for("the hints", |out, _| out.contains("  try: "))
        .await;
    // No wait here: the hints promise the port answers now.
    let mut c = Raw::connect(&listen).await;
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n", "{}", run.both());
    assert!(
        run.out().contains(&format!("redis-cli -p {port}")),
        "{}",
        run.both()
    );
    run.signal("-TERM");
    assert!(run.exit_status().await.success(), "{}", run.both());
}

/// The listen port already answers (here a second Redis): the script says so and stops,
/// instead of printing a `redis-cli -p` hint that would reach that server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sh_refuses_a_listen_port_that_belongs_to_something_else() {
    let redis = RedisServer::start();
    let squatter = RedisServer::start();
    let tmp = TempDir::new("runsh-taken");
    let config = policy(tmp.path());
    let taken = squatter.addr();
    let args = ["--listen", &taken, "--admin", "off"];
    let mut run = RunScript::start(&redis.addr(), &config, &args, &[("RPP_BIN", BIN)]);
    let status = run.exit_status().await;
    assert!(!status.success(), "{status}: {}", run.both());
    let out = run.out();
    assert!(
        out.contains(&format!("{taken} is already in use by another process")),
        "{out}"
    );
    assert!(!out.contains("try:"), "{out}");
    assert!(!out.contains("redis-policy-proxy pid"), "{out}");
}
