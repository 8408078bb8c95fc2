//! A Sentinel-managed Redis for tests: one primary, one replica, three sentinels on free
//! loopback ports, ready once every sentinel knows the primary, the replica and the other
//! sentinels (so a failover can elect a leader). Everything is killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{DEADLINE, POLL, RedisServer, free_port, server_binary, temp_dir};

/// The name the sentinels monitor.
pub(crate) const MASTER: &str = "mymaster";

pub(crate) struct SentinelSetup {
    pub primary: RedisServer,
    pub replica: RedisServer,
    /// Sentinel ports.
    pub sentinels: Vec<u16>,
    children: Vec<Child>,
    /// Holds each sentinel's config file (sentinels rewrite it).
    dir: PathBuf,
}

/// Runs redis-cli against `port` and returns its stdout.
pub(crate) fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl SentinelSetup {
    pub(crate) fn start() -> SentinelSetup {
        Self::start_binary(&server_binary())
    }

    /// As [`SentinelSetup::start`], the primary, the replica and the sentinels running `bin`
    /// (a server of the matrix, [`super::matrix_servers`]) whatever `RPP_REDIS_SERVER` says.
    pub(crate) fn start_binary(bin: &Path) -> SentinelSetup {
        // No 5 s wait for more replicas before the first (diskless) sync; on both nodes, since
        // the replica becomes the primary of the old one after a failover.
        let fast_sync = ["--repl-diskless-sync-delay", "0"];
        let primary = RedisServer::start_binary(bin, &fast_sync);
        let port = primary.port.to_string();
        let replica = RedisServer::start_binary(
            bin,
            &[&fast_sync[..], &["--replicaof", "127.0.0.1", &port]].concat(),
        );
        let dir = temp_dir("sentinels");
        let mut setup = SentinelSetup {
            primary,
            replica,
            sentinels: Vec::new(),
            children: Vec::new(),
            dir,
        };
        for i in 0..3 {
            let (port, child) = setup.spawn_sentinel(bin, i);
            setup.children.push(child);
            setup.sentinels.push(port);
        }
        setup.wait_ready(bin);
        setup
    }

    /// Starts sentinel `i` on a free port; its port and process.
    fn spawn_sentinel(&self, bin: &Path, i: usize) -> (u16, Child) {
        let port = free_port();
        let conf = self.dir.join(format!("sentinel-{i}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nsentinel monitor {MASTER} 127.0.0.1 {p} 2\nsentinel down-after-milliseconds {MASTER} 1000\nsentinel failover-timeout {MASTER} 5000\nsentinel parallel-syncs {MASTER} 1\n",
                dir = self.dir.display(),
                p = self.primary.port
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {} --sentinel: {e}", bin.display()));
        (port, child)
    }

    /// `host:port` of each sentinel.
    pub(crate) fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// Polls until the replica has finished its first sync (before it, WAIT counts no replica
    /// and a failover would promote an empty node) and every sentinel sees the primary, the
    /// replica and two other sentinels.
    fn wait_ready(&mut self, bin: &Path) {
        let until = Instant::now() + DEADLINE * 3;
        loop {
            // A sentinel that exited lost its free port to another test between the pick and
            // its bind (tests run in parallel): it starts again on another port.
            for i in 0..self.children.len() {
                if matches!(self.children[i].try_wait(), Ok(Some(_))) {
                    let (port, child) = self.spawn_sentinel(bin, i);
                    self.children[i] = child;
                    self.sentinels[i] = port;
                }
            }
            let synced =
                cli(self.replica.port, &["INFO", "replication"]).contains("master_link_status:up");
            let ready = synced
                && self.sentinels.iter().all(|&s| {
                    let master = cli(s, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]);
                    let replicas = cli(s, &["SENTINEL", "REPLICAS", MASTER]);
                    let others = cli(s, &["SENTINEL", "SENTINELS", MASTER]);
                    master.contains(&self.primary.port.to_string())
                        && replicas.contains(&self.replica.port.to_string())
                        && !replicas.contains("s_down")
                        && others.lines().filter(|l| *l == "name").count() >= 2
                });
            if ready {
                return;
            }
            assert!(
                Instant::now() < until,
                "sentinels not ready in time: replica synced {synced}; {}",
                self.sentinels
                    .iter()
                    .map(|&s| format!(
                        "sentinel {s}: master {:?}, sentinels {}",
                        cli(s, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]).trim(),
                        cli(s, &["SENTINEL", "SENTINELS", MASTER])
                            .lines()
                            .filter(|l| *l == "name")
                            .count()
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
            std::thread::sleep(POLL * 10);
        }
    }

    /// Asks the sentinels for a failover (the replica is promoted) and waits until they all
    /// report the replica as the primary and the old primary replicates from it. The second
    /// wait matters: a sentinel converts the demoted primary some 8 s after the switch with
    /// `SLAVEOF` + `CLIENT KILL TYPE normal`, which would otherwise close a test's own direct
    /// connection to that node at a moment of the sentinel's choosing.
    pub(crate) fn failover(&self) {
        let until = Instant::now() + DEADLINE * 3;
        let mut asked = false;
        loop {
            if !asked {
                asked = cli(self.sentinels[0], &["SENTINEL", "FAILOVER", MASTER]).starts_with("OK");
            }
            let done = self.sentinels.iter().all(|&s| {
                cli(s, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])
                    .contains(&self.replica.port.to_string())
            }) && {
                let demoted = cli(self.primary.port, &["INFO", "replication"]);
                let port = format!("master_port:{}", self.replica.port);
                let has = |want: &str| demoted.lines().any(|l| l.trim_end() == want);
                has("role:slave") && has(&port) && has("master_link_status:up")
            };
            if done {
                return;
            }
            assert!(Instant::now() < until, "failover did not complete in time");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for SentinelSetup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
