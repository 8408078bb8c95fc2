//! Hot reload of a policy mounted from a Kubernetes ConfigMap.
//!
//! The kubelet never edits a mounted ConfigMap file in place. The volume directory holds one
//! timestamped directory per version (`..2026_v1/policy.yaml`), a symlink `..data` to the
//! current one, and a symlink per key (`policy.yaml -> ..data/policy.yaml`). An update writes
//! a new timestamped directory, points a temporary symlink at it, `rename()`s that symlink
//! over `..data` (atomic: a reader sees the old file or the new one, never a mix) and then
//! deletes the old directory. The path the proxy was given never changes, so only a watcher
//! that follows symlinks to the file they resolve to can see the update. This test builds
//! that layout, swaps versions exactly as the kubelet does, and drives the real binary in
//! front of a real `redis-server`.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::process::ProxyProcess;
use common::{DEADLINE, POLL, Raw, RedisServer, TempDir, show};

/// How long a reload may take to be visible: the proxy polls the file once a second, so the
/// common deadline leaves room for a loaded CI machine.
const RELOAD_DEADLINE: Duration = DEADLINE;

/// A ConfigMap volume as the kubelet lays it out, with one key, `policy.yaml`.
struct ConfigMapVolume {
    dir: PathBuf,
    /// Name of the timestamped directory `..data` points at now.
    current: Option<String>,
}

impl ConfigMapVolume {
    /// Creates the volume with its first version.
    fn new(dir: &Path, version: &str, policy: &str) -> ConfigMapVolume {
        let mut volume = ConfigMapVolume {
            dir: dir.to_path_buf(),
            current: None,
        };
        volume.publish(version, policy);
        // The per-key symlink goes through `..data` and is never touched again: updates only
        // move `..data`.
        std::os::unix::fs::symlink("..data/policy.yaml", dir.join("policy.yaml"))
            .expect("symlink policy.yaml -> ..data/policy.yaml");
        volume
    }

    /// The path the proxy is started with, as a pod's container sees it.
    fn policy_path(&self) -> PathBuf {
        self.dir.join("policy.yaml")
    }

    /// Publishes a new version the way the kubelet's atomic writer does: write the files into a
    /// fresh timestamped directory, point `..data_tmp` at it, rename it over `..data`, then
    /// remove the previous directory.
    fn publish(&mut self, version: &str, policy: &str) {
        let name = format!("..2026_{version}");
        let versioned = self.dir.join(&name);
        std::fs::create_dir(&versioned).expect("create the timestamped directory");
        std::fs::write(versioned.join("policy.yaml"), policy).expect("write the policy");
        let tmp = self.dir.join("..data_tmp");
        // Relative target, as the kubelet writes it, so the volume can be mounted anywhere.
        std::os::unix::fs::symlink(&name, &tmp).expect("symlink ..data_tmp");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("rename ..data_tmp over ..data");
        if let Some(old) = self.current.replace(name) {
            std::fs::remove_dir_all(self.dir.join(old)).expect("remove the previous version");
        }
    }
}

/// A policy with one rule, `no-<cmd>`, denying `cmd`. The admin endpoint is off: tests run in
/// parallel and must not compete for its fixed default port.
fn deny(cmd: &str) -> String {
    format!("admin:\n  listen: \"off\"\nrules:\n  - id: no-{cmd}\n    deny: [{cmd}]\n")
}

/// Sends `args` on `c` until the reply satisfies `ok`, within the reload deadline. The same
/// connection is reused on purpose: a client connected before the swap must get the new
/// policy on its next command, as long-lived pooled connections do in production.
async fn until_reply(
    c: &mut Raw,
    args: &[&str],
    ok: impl Fn(&str) -> bool,
    what: &str,
    log: &Path,
) {
    let until = Instant::now() + RELOAD_DEADLINE;
    loop {
        let reply = c.call(args).await;
        if ok(&String::from_utf8_lossy(&reply)) {
            return;
        }
        assert!(
            Instant::now() < until,
            "{what}: still {} after {RELOAD_DEADLINE:?}; proxy log:\n{}",
            show(&reply),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_symlink_swaps_reload_the_policy_and_a_broken_version_keeps_the_old_one() {
    let redis = RedisServer::start();
    let tmp = TempDir::new("reload-symlink");
    let volume_dir = tmp.path().join("config");
    std::fs::create_dir(&volume_dir).expect("create the volume directory");
    let mut volume = ConfigMapVolume::new(&volume_dir, "v1", &deny("KEYS"));
    let log = tmp.path().join("proxy.log");
    let proxy = ProxyProcess::start(&volume.policy_path(), &redis, log.clone(), &[]).await;

    // Version 1 denies KEYS only: DBSIZE goes through to Redis.
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["DBSIZE"]).await, b":0\r\n");
    let reply = String::from_utf8_lossy(&c.call(&["KEYS", "*"]).await).into_owned();
    assert!(reply.starts_with("-NOPERM policy no-KEYS: "), "{reply}");

    // Version 2 denies DBSIZE. No signal is sent: the file watcher alone must notice that
    // `policy.yaml` now resolves to another file.
    volume.publish("v2", &deny("DBSIZE"));
    until_reply(
        &mut c,
        &["DBSIZE"],
        |r| r.starts_with("-NOPERM policy no-DBSIZE: DBSIZE is not allowed"),
        "DBSIZE refused after the ..data swap to v2",
        &log,
    )
    .await;
    assert_eq!(
        c.call(&["KEYS", "*"]).await,
        b"*0\r\n",
        "v1's rule must be gone after the swap"
    );

    // Version 3 names a command Redis does not have: the reload is refused and logged, and
    // v2 keeps serving.
    volume.publish(
        "v3",
        "admin:\n  listen: \"off\"\nrules:\n  - id: broken\n    deny: [NOSUCHCOMMAND]\n",
    );
    let until = Instant::now() + RELOAD_DEADLINE;
    loop {
        let text = proxy.log_text();
        if text.contains("reload failed") {
            assert!(
                text.contains("NOSUCHCOMMAND"),
                "the log must say why: {text}"
            );
            break;
        }
        assert!(
            Instant::now() < until,
            "no reload failure logged within {RELOAD_DEADLINE:?} of the v3 swap:\n{text}"
        );
        tokio::time::sleep(POLL).await;
    }
    let reply = String::from_utf8_lossy(&c.call(&["DBSIZE"]).await).into_owned();
    assert!(
        reply.starts_with("-NOPERM policy no-DBSIZE: "),
        "v2 must keep serving after the broken v3: {reply}"
    );
    let fresh = String::from_utf8_lossy(&Raw::connect(proxy.addr()).await.call(&["DBSIZE"]).await)
        .into_owned();
    assert!(
        fresh.starts_with("-NOPERM policy no-DBSIZE: "),
        "a new client gets v2 as well: {fresh}"
    );

    // Version 4 is valid again: a failed version must not stop the watcher.
    volume.publish("v4", &deny("ECHO"));
    until_reply(
        &mut c,
        &["DBSIZE"],
        |r| r == ":0\r\n",
        "DBSIZE allowed again after the swap to v4",
        &log,
    )
    .await;
    let reply = String::from_utf8_lossy(&c.call(&["ECHO", "x"]).await).into_owned();
    assert!(reply.starts_with("-NOPERM policy no-ECHO: "), "{reply}");
}
