//! The proxy binary as a separate process, for tests that need its own memory, signals or
//! log.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{DEADLINE, POLL, Raw, RedisServer, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_redis-policy-proxy");

/// The proxy binary as a child process, killed on drop so a failed assertion leaves nothing
/// running.
pub(crate) struct ProxyProcess {
    child: Child,
    /// The client port.
    pub port: u16,
    /// Where its stderr goes.
    log: PathBuf,
}

impl ProxyProcess {
    /// Starts the binary with `--config policy` in front of `redis` on a free port, plus
    /// `extra` arguments (`--admin off` unless they name an admin address), retrying on
    /// another port when it loses the race for one.
    pub(crate) async fn start(
        policy: &Path,
        redis: &RedisServer,
        log: PathBuf,
        extra: &[&str],
    ) -> ProxyProcess {
        ProxyProcess::start_with(Some(policy), redis, log, extra, &[]).await
    }

    /// Like [`ProxyProcess::start`], with `--config` only when `policy` is given and `env`
    /// added to the process's environment.
    pub(crate) async fn start_with(
        policy: Option<&Path>,
        redis: &RedisServer,
        log: PathBuf,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> ProxyProcess {
        ProxyProcess::spawn_ready(policy, Some(&redis.addr()), log, extra, env).await
    }

    /// Starts the binary with `--config policy` and the upstream the file names (no
    /// `--upstream`): what a reload of the file may move (a cutover).
    pub(crate) async fn start_as_filed(policy: &Path, log: PathBuf) -> ProxyProcess {
        ProxyProcess::spawn_ready(Some(policy), None, log, &[], &[]).await
    }

    async fn spawn_ready(
        policy: Option<&Path>,
        upstream: Option<&str>,
        log: PathBuf,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> ProxyProcess {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let log_file = std::fs::File::create(&log).expect("create the proxy log");
            // The admin endpoint's default port is fixed and tests run in parallel: off
            // unless the test names one (a failed admin bind stops the start).
            let admin_off: &[&str] = if extra.contains(&"--admin") {
                &[]
            } else {
                &["--admin", "off"]
            };
            let config: Vec<&std::ffi::OsStr> = match policy {
                Some(p) => vec!["--config".as_ref(), p.as_os_str()],
                None => Vec::new(),
            };
            let child = Command::new(BIN)
                .args(config)
                .envs(env.iter().copied())
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(upstream.map(|u| ["--upstream", u]).into_iter().flatten())
                .args(admin_off)
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log_file)
                .spawn()
                .expect("spawn redis-policy-proxy");
            let mut proxy = ProxyProcess {
                child,
                port,
                log: log.clone(),
            };
            match proxy.wait_ready().await {
                Ok(()) => return proxy,
                Err(e) => last = e,
            }
        }
        panic!("could not start redis-policy-proxy: {last}");
    }

    /// Polls PING until it answers PONG (or NOAUTH), within the deadline; `Err` if the process exited
    /// first (e.g. its port was taken meanwhile).
    async fn wait_ready(&mut self) -> Result<(), String> {
        let until = Instant::now() + DEADLINE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited early ({status}): {}", self.log_text()));
            }
            if let Some(mut c) = Raw::try_connect(self.addr(), DEADLINE).await {
                c.send(b"PING\r\n").await;
                let got = c.collect_frames(1, Duration::from_secs(2)).await;
                // Under `require_auth` PING gets NOAUTH, which proves the proxy serves too.
                if got
                    .frames
                    .first()
                    .is_some_and(|f| f == b"+PONG\r\n" || f.starts_with(b"-NOAUTH"))
                {
                    return Ok(());
                }
            }
            if Instant::now() > until {
                return Err(format!("no PONG within {DEADLINE:?}: {}", self.log_text()));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Sends `signal` (e.g. `-HUP`) to the process.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Waits until the log holds `text` at least `n` times.
    pub(crate) async fn wait_for_log(&self, text: &str, n: usize) {
        let until = Instant::now() + DEADLINE;
        while self.log_text().matches(text).count() < n {
            assert!(
                Instant::now() < until,
                "no {text:?} in the log: {}",
                self.log_text()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// How the process ended, if it has (a crash is a finding for tests that must keep the
    /// proxy up, such as the invariant fuzzer).
    pub(crate) fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The names of the process's threads (from /proc), e.g. `rpp-worker-0`.
    pub(crate) fn thread_names(&self) -> Vec<String> {
        let tasks = format!("/proc/{}/task", self.child.id());
        std::fs::read_dir(tasks)
            .expect("proxy process tasks")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|n| n.trim().to_string())
            .collect()
    }

    /// Resident memory of the process, in KiB (from /proc).
    pub(crate) fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("proxy process status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc status")
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a run of the binary as a command-line tool (`--check`, `--survey`, `--explain`…)
/// gave: its exit code and output.
pub(crate) struct BinRun {
    /// `None` when a signal ended it.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the binary with `args`, `env` added to its environment, to completion; a run that
/// outlives the deadline fails the test instead of hanging it.
pub(crate) async fn run_bin(args: &[&str], env: &[(&str, &str)]) -> BinRun {
    let child = tokio::process::Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn redis-policy-proxy");
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("redis-policy-proxy {args:?} did not exit within {DEADLINE:?}"))
        .expect("wait for redis-policy-proxy");
    BinRun {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
