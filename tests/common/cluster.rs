//! A real Redis Cluster on loopback: `redis-server` processes in cluster mode on free ports,
//! joined by `redis-cli --cluster create`, ready only once every node agrees the cluster is
//! whole. Killed and removed on drop.
//!
//! Independent of the proxy's own cluster code on purpose (replies are read with the `redis`
//! crate), so tests can check the proxy against it rather than against itself.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::Value;

use super::{POLL, free_port, temp_dir};

/// Bound on bringing a whole cluster up. Longer than [`super::DEADLINE`]: six servers start,
/// meet over the cluster bus and replicate, on a machine that may be running other tests.
const CLUSTER_DEADLINE: Duration = Duration::from_secs(40);

/// One `redis-server` of the cluster.
pub(crate) struct ClusterNode {
    /// Client port on 127.0.0.1.
    pub port: u16,
    /// Cluster bus port, set explicitly: Redis's default (port + 10000) may be taken or above
    /// 65535 for a port picked by the OS.
    pub bus_port: u16,
    /// The process; `None` once killed.
    child: Option<Child>,
}

impl ClusterNode {
    /// `127.0.0.1:port`.
    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Whether the process has not been killed by the test.
    pub(crate) fn is_alive(&self) -> bool {
        self.child.is_some()
    }
}

/// A running cluster of `primaries` shards with `replicas_per_primary` replicas each.
pub(crate) struct RedisCluster {
    /// Holds every node's config file, log and the `redis-cli --cluster create` output.
    dir: PathBuf,
    /// Every node, in start order (which is not necessarily primaries first: roles are
    /// whatever `redis-cli --cluster create` chose; ask [`RedisCluster::primary_for_slot`]).
    nodes: Vec<ClusterNode>,
    /// The server binary of every node ([`super::server_binary`] unless a test named one).
    bin: PathBuf,
}

/// The proxy's configuration for cluster mode with `seed`, plus `settings`: lines under
/// `upstream.cluster`, e.g. `refresh_interval_ms: 500`.
pub(crate) fn proxy_config(seed: &str, settings: &[&str]) -> redis_policy_proxy::Config {
    let mut text = format!("upstream:\n  mode: cluster\n  cluster:\n    seeds: [{seed}]\n");
    for line in settings {
        text.push_str(&format!("    {line}\n"));
    }
    redis_policy_proxy::setup::from_yaml(&text, std::path::Path::new("cluster-test.yaml"))
        .expect("cluster config parses")
}

/// The proxy's config in front of the cluster seeded at `seed` with one namespaced tenant:
/// user `alice` (password `alicepw`), tenant `a`, keys and channels under `a:`.
pub(crate) fn namespaced_config(seed: &str) -> redis_policy_proxy::Config {
    const ALICE: &str = "6624974ea2baffac164422e4490376c1c31313cd97724ae8ce62fb3f0a0370f2"; // alicepw
    let yaml = format!(
        "upstream:\n  mode: cluster\n  cluster:\n    seeds: [{seed}]\naccess:\n  users:\n    - {{name: alice, password_sha256: {ALICE}}}\n  identities:\n    - {{tenant: a, user: alice}}\n  namespaces:\n    a: 'a:'\n"
    );
    redis_policy_proxy::setup::from_yaml(&yaml, std::path::Path::new("ns.yaml"))
        .expect("namespaced cluster config parses")
}

impl RedisCluster {
    /// Starts the cluster and waits until it is ready: every node reports `cluster_state:ok`,
    /// knows every other node, sees all 16384 slots served, and every replica's link to its
    /// primary is up. Panics (after cleaning up) if that does not happen within the deadline.
    pub(crate) fn start(primaries: usize, replicas_per_primary: usize) -> RedisCluster {
        Self::start_with(primaries, replicas_per_primary, &[])
    }

    /// As [`RedisCluster::start`], with extra `redis-server` arguments for every node (e.g.
    /// `["--cluster-node-timeout", "1000"]` for a failover test).
    pub(crate) fn start_with(
        primaries: usize,
        replicas_per_primary: usize,
        args: &[&str],
    ) -> RedisCluster {
        Self::start_binary(
            &super::server_binary(),
            primaries,
            replicas_per_primary,
            args,
        )
    }

    /// As [`RedisCluster::start_with`], every node running `bin` (a server of the matrix,
    /// [`super::matrix_servers`]) whatever `RPP_REDIS_SERVER` says.
    pub(crate) fn start_binary(
        bin: &Path,
        primaries: usize,
        replicas_per_primary: usize,
        args: &[&str],
    ) -> RedisCluster {
        assert!(
            primaries >= 3,
            "redis-cli --cluster create needs 3 primaries"
        );
        let until = Instant::now() + CLUSTER_DEADLINE;
        let mut cluster = RedisCluster {
            dir: temp_dir("cluster"),
            nodes: Vec::new(),
            bin: bin.to_path_buf(),
        };
        let mut taken = HashSet::new();
        for _ in 0..primaries * (1 + replicas_per_primary) {
            let node = cluster.spawn_node(&mut taken, args, until);
            cluster.nodes.push(node);
        }
        cluster.create(replicas_per_primary, until);
        cluster.wait_ready(until);
        cluster
    }

    /// Starts one node on fresh ports, retrying when a port was grabbed by someone else
    /// between `free_port` and the bind.
    fn spawn_node(&self, taken: &mut HashSet<u16>, args: &[&str], until: Instant) -> ClusterNode {
        let mut last_err = String::new();
        for _ in 0..8 {
            let port = fresh_port(taken);
            let bus_port = fresh_port(taken);
            let log = self.dir.join(format!("redis-{port}.log"));
            let mut child = Command::new(&self.bin)
                .arg("--port")
                .arg(port.to_string())
                .arg("--cluster-port")
                .arg(bus_port.to_string())
                .args(["--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(self.dir.join(format!("nodes-{port}.conf")))
                .args(["--cluster-node-timeout", "5000"])
                // A replica is `loading` in CLUSTER SHARDS until its replication offset moves
                // off zero, which on an idle primary happens at its next ping to replicas
                // (every 10 s by default): ping every second so readiness comes quickly.
                .args(["--repl-ping-replica-period", "1"])
                // Redis waits 5 s for more replicas before a diskless full sync; here every
                // replica attaches at once and the wait would only slow readiness.
                .args(["--repl-diskless-sync-delay", "0"])
                .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&self.dir)
                .arg("--logfile")
                .arg(&log)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", self.bin.display()));
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    last_err = format!(
                        "redis-server on port {port} exited ({status}): {}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                    break;
                }
                if ping(port) {
                    return ClusterNode {
                        port,
                        bus_port,
                        child: Some(child),
                    };
                }
                if Instant::now() > until {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("redis-server on port {port} did not answer PING in time");
                }
                std::thread::sleep(POLL);
            }
        }
        panic!("could not start a cluster node: {last_err}");
    }

    /// `redis-cli --cluster create`, bounded by the deadline.
    fn create(&self, replicas: usize, until: Instant) {
        let out = self.dir.join("create.out");
        let mut child = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(self.nodes.iter().map(ClusterNode::addr))
            .arg("--cluster-replicas")
            .arg(replicas.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("create.out"))
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn redis-cli");
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break status;
            }
            if Instant::now() > until {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-cli --cluster create did not finish in time: {}",
                    std::fs::read_to_string(&out).unwrap_or_default()
                );
            }
            std::thread::sleep(POLL);
        };
        assert!(
            status.success(),
            "redis-cli --cluster create failed ({status}): {}",
            std::fs::read_to_string(&out).unwrap_or_default()
        );
    }

    /// Polls every node until the cluster is whole as every node sees it.
    fn wait_ready(&self, until: Instant) {
        let total = self.nodes.len();
        for node in &self.nodes {
            while let Err(why) = node_ready(node.port, total) {
                assert!(
                    Instant::now() < until,
                    "cluster node {} not ready within {CLUSTER_DEADLINE:?}: {why}",
                    node.addr()
                );
                std::thread::sleep(POLL);
            }
        }
    }

    /// Every node, killed ones included (see [`ClusterNode::is_alive`]).
    pub(crate) fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// A key whose slot is owned by `primary`, built from `stem`.
    pub(crate) fn key_on(&self, primary: &str, stem: &str) -> String {
        (0..)
            .map(|i| format!("{stem}:{i}"))
            .find(|k| {
                self.primary_for_slot(redis_policy_proxy::cluster::slot(k.as_bytes())) == primary
            })
            .unwrap()
    }

    /// `host:port` of every node that is still running.
    pub(crate) fn live_addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.is_alive())
            .map(ClusterNode::addr)
            .collect()
    }

    /// The address of the primary serving `slot`, by `CLUSTER SLOTS` of the first live node
    /// that answers.
    pub(crate) fn primary_for_slot(&self, slot: u16) -> String {
        for node in self.nodes.iter().filter(|n| n.is_alive()) {
            let Ok(Value::Array(ranges)) = query(node.port, &["CLUSTER", "SLOTS"]) else {
                continue;
            };
            for (start, end, owner) in slot_ranges(&ranges) {
                if (start..=end).contains(&i64::from(slot)) {
                    return owner;
                }
            }
        }
        panic!("no live node knows the owner of slot {slot}");
    }

    /// The addresses of the nodes that own slots as `node` (`host:port`) sees them, by its
    /// `CLUSTER SLOTS` (none when it does not answer).
    pub(crate) fn owners_seen_by(&self, node: &str) -> Vec<String> {
        let port = node.rsplit(':').next().and_then(|p| p.parse().ok());
        match port.map(|p| query(p, &["CLUSTER", "SLOTS"])) {
            Some(Ok(Value::Array(ranges))) => slot_ranges(&ranges)
                .into_iter()
                .map(|(_, _, o)| o)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The addresses of the nodes that own slots (the primaries), by `CLUSTER SLOTS`.
    pub(crate) fn primaries(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for node in self.nodes.iter().filter(|n| n.is_alive()) {
            if let Ok(Value::Array(ranges)) = query(node.port, &["CLUSTER", "SLOTS"]) {
                for (_, _, owner) in slot_ranges(&ranges) {
                    if !out.contains(&owner) {
                        out.push(owner);
                    }
                }
                return out;
            }
        }
        panic!("no live node answered CLUSTER SLOTS");
    }

    /// Kills node `index` (SIGKILL) and waits for it to exit.
    pub(crate) fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.nodes[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs one command on the node listening on `port` (blocking), as the `redis` crate reads
    /// the reply. Error replies come back as `Err`.
    pub(crate) fn query(&self, port: u16, args: &[&str]) -> redis::RedisResult<Value> {
        query(port, args)
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port that `free_port` says is free and this cluster has not used yet.
fn fresh_port(taken: &mut HashSet<u16>) -> u16 {
    loop {
        let p = free_port();
        if taken.insert(p) {
            return p;
        }
    }
}

fn ping(port: u16) -> bool {
    matches!(query(port, &["PING"]), Ok(Value::SimpleString(s)) if s == "PONG")
}

/// A blocking command on a fresh connection, every step bounded.
fn query(port: u16, args: &[&str]) -> redis::RedisResult<Value> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut con = client.get_connection_with_timeout(Duration::from_millis(500))?;
    con.set_read_timeout(Some(Duration::from_secs(2)))?;
    con.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut con)
}

/// `(start, end, primary host:port)` of each `CLUSTER SLOTS` entry.
pub(crate) fn slot_ranges(ranges: &[Value]) -> Vec<(i64, i64, String)> {
    let mut out = Vec::new();
    for range in ranges {
        let Value::Array(items) = range else { continue };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (items.first(), items.get(1), items.get(2))
        else {
            continue;
        };
        let (Some(host), Some(Value::Int(port))) = (primary.first(), primary.get(1)) else {
            continue;
        };
        let host = match host {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::SimpleString(s) => s.clone(),
            _ => continue,
        };
        out.push((*start, *end, format!("{host}:{port}")));
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

/// `Ok` when the node on `port` sees a whole, healthy cluster of `total` nodes; otherwise
/// what is still missing.
fn node_ready(port: u16, total: usize) -> Result<(), String> {
    let info = text(&query(port, &["CLUSTER", "INFO"]).map_err(|e| e.to_string())?);
    if !info.contains("cluster_state:ok") {
        return Err("cluster_state is not ok".into());
    }
    if !info.contains(&format!("cluster_known_nodes:{total}\r")) {
        return Err(format!("does not know all {total} nodes yet"));
    }
    let Value::Array(ranges) = query(port, &["CLUSTER", "SLOTS"]).map_err(|e| e.to_string())?
    else {
        return Err("CLUSTER SLOTS is not an array".into());
    };
    let covered: i64 = slot_ranges(&ranges).iter().map(|(s, e, _)| e - s + 1).sum();
    if covered != 16384 {
        return Err(format!("CLUSTER SLOTS covers {covered} slots"));
    }
    let replication = text(&query(port, &["INFO", "replication"]).map_err(|e| e.to_string())?);
    if replication.contains("role:slave") && !replication.contains("master_link_status:up") {
        return Err("replica not yet synchronised with its primary".into());
    }
    // A replica counts as `loading` in CLUSTER SHARDS until its replication offset, gossiped
    // over the bus, moves off zero; tests of replica reads need it `online` everywhere.
    let Value::Array(shards) = query(port, &["CLUSTER", "SHARDS"]).map_err(|e| e.to_string())?
    else {
        return Err("CLUSTER SHARDS is not an array".into());
    };
    // A replica whose shard id has not reached this node over the bus yet shows up as a shard
    // of its own without slots: the map would lack it. Ready only once every node sits in a
    // shard that serves slots.
    let in_serving_shards: usize = shards
        .iter()
        .filter(|shard| {
            field(shard, "slots")
                .and_then(as_array)
                .is_some_and(|s| !s.is_empty())
        })
        .map(|shard| {
            field(shard, "nodes")
                .and_then(as_array)
                .map_or(0, <[Value]>::len)
        })
        .sum();
    if in_serving_shards != total {
        return Err(format!(
            "{in_serving_shards} of {total} nodes in shards that serve slots"
        ));
    }
    for shard in &shards {
        for node in field(shard, "nodes").and_then(as_array).unwrap_or(&[]) {
            let health = field(node, "health").map(text).unwrap_or_default();
            if health != "online" {
                let port = field(node, "port").map(text).unwrap_or_default();
                return Err(format!("node with port {port} has health {health:?}"));
            }
        }
    }
    Ok(())
}

/// The value after `name` in a flat RESP2 record.
fn field<'a>(record: &'a Value, name: &str) -> Option<&'a Value> {
    let Value::Array(items) = record else {
        return None;
    };
    items
        .chunks_exact(2)
        .find(|kv| text(&kv[0]) == name)
        .map(|kv| &kv[1])
}

fn as_array(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(items) => Some(items),
        _ => None,
    }
}

/// `CLUSTER SETSLOT slot state node`, encoded.
pub(crate) fn setslot(slot: u16, state: &str, node: &str) -> Vec<u8> {
    super::resp(&["CLUSTER", "SETSLOT", &slot.to_string(), state, node])
}

/// Starts moving `slot` from `source` to `target` (each `(address, node id)`) as
/// `redis-cli --cluster reshard` does: IMPORTING on the target, then MIGRATING on the source.
/// Returns connections to the source and the target for the rest of the migration.
pub(crate) async fn begin_migration(
    slot: u16,
    (source, source_id): (&str, &str),
    (target, target_id): (&str, &str),
) -> (super::Raw, super::Raw) {
    let mut to_source = super::Raw::connect(source).await;
    let mut to_target = super::Raw::connect(target).await;
    assert_eq!(
        to_target
            .request(&setslot(slot, "IMPORTING", source_id), 1)
            .await,
        b"+OK\r\n"
    );
    assert_eq!(
        to_source
            .request(&setslot(slot, "MIGRATING", target_id), 1)
            .await,
        b"+OK\r\n"
    );
    (to_source, to_target)
}

/// `CLUSTER MYID` of the node at `addr`.
/// Ends moving `slot` from `source` to `target` (node id `target_id`), as `redis-cli --cluster
/// reshard` does: SETSLOT NODE on the target, the source, then every primary.
pub(crate) async fn end_migration(
    redis: &RedisCluster,
    slot: u16,
    (source, target): (&str, &str),
    target_id: &str,
) {
    for p in [target.to_string(), source.to_string()]
        .into_iter()
        .chain(redis.primaries())
    {
        let reply = super::Raw::connect(&p)
            .await
            .request(&setslot(slot, "NODE", target_id), 1)
            .await;
        assert_eq!(reply, b"+OK\r\n", "{p}");
    }
}

/// A primary other than `than`, to move a slot to.
pub(crate) fn other_primary(redis: &RedisCluster, than: &str) -> String {
    redis
        .primaries()
        .into_iter()
        .find(|p| p != than)
        .expect("another primary")
}

pub(crate) fn node_id(redis: &RedisCluster, addr: &str) -> String {
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    match redis.query(port, &["CLUSTER", "MYID"]).unwrap() {
        Value::BulkString(b) => String::from_utf8(b).unwrap(),
        other => panic!("CLUSTER MYID: {other:?}"),
    }
}

/// Polls `INFO clients` of each of `nodes` until their `blocked_clients` add up to exactly
/// `total`, within the deadline: a blocking command spread over them blocked (or every
/// connection it blocked on went).
pub(crate) async fn wait_blocked_on(nodes: &[String], total: usize) {
    let until = Instant::now() + super::DEADLINE;
    let mut conns = Vec::new();
    for n in nodes {
        conns.push(super::Raw::connect(n).await);
    }
    loop {
        let mut blocked = 0;
        for c in &mut conns {
            let info = c.call(&["INFO", "clients"]).await;
            blocked += String::from_utf8_lossy(&info)
                .lines()
                .find_map(|l| l.strip_prefix("blocked_clients:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
        }
        if blocked == total {
            return;
        }
        assert!(
            Instant::now() < until,
            "blocked clients over {nodes:?}: {blocked}, not {total}, within {:?}",
            super::DEADLINE
        );
        tokio::time::sleep(POLL).await;
    }
}
