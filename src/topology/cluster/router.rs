//! The cluster router: one [`Pool`] per node, the current slot map, and the task that keeps
//! the map fresh.
//!
//! Sessions name nodes by a small index (`u16`) into an append-only list of pools, so a
//! routing target stays `Copy` and comparing two targets is comparing two integers. A node
//! keeps its index (and its pool) for the router's life: a node that leaves the map and comes
//! back (a restarted primary) reuses its connections, and an index a session still holds never
//! points at another node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Notify;

use super::scripts::{ScriptRun, ScriptsRunning};
use super::{SLOTS, SlotMap, discover};
use crate::config::{ClusterConfig, Config, ReadFrom, UpstreamMode};
use crate::observe::metrics::Metrics;
use crate::protocol::error::UpstreamError;
use crate::topology::routes::{ON_CLUSTER, RouteTable};
use crate::upstream::pool::{ControlRoute, Pool, PoolSettings};

/// Refresh requests closer together than this are served by one refresh, so a burst of
/// MOVED replies after a reshard costs one topology query, not one per command.
const COALESCE: Duration = Duration::from_millis(100);

/// How often every node's round trip is measured for `read_from: nearest`: often enough to
/// follow a node that slows down, rarely enough to cost nothing (one PING per node).
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The slot map and, per shard, the index of its primary's pool.
pub(crate) struct Snapshot {
    /// The topology as last learned (or patched by a MOVED).
    pub(crate) map: SlotMap,
    /// `owners[i]` is the node index of `map.shards()[i].primary`, so routing a slot is two
    /// loads: slot → shard → node.
    owners: Vec<u16>,
    /// `replicas[i]`: node indices of the replicas of `map.shards()[i]` that the map says are
    /// online, for replica reads; every list is empty with `read_from: primary`, so no
    /// replica ever gets a pool or a connection then.
    replicas: Vec<Vec<u16>>,
}

impl Snapshot {
    /// The node index of the primary that owns `slot`, if any.
    pub(crate) fn owner(&self, slot: u16) -> Option<u16> {
        self.map.owner_index(slot).map(|i| self.owners[i])
    }

    /// Node indices of every primary that owns slots, in the map's shard order.
    pub(crate) fn primaries(&self) -> &[u16] {
        &self.owners
    }

    /// Whether `node` is a primary of this map (a replica, or a node gone from it, is not).
    pub(crate) fn is_primary(&self, node: u16) -> bool {
        self.owners.contains(&node)
    }
}

/// Routes commands to the nodes of one Redis Cluster.
pub(crate) struct Router {
    /// Login, TLS and limits every node's pool is created with.
    settings: PoolSettings,
    /// Shared with the pools, which count connections and errors.
    metrics: Arc<Metrics>,
    /// The configured seeds, asked after the known nodes on every refresh (all known nodes
    /// may have been replaced since start).
    seeds: Vec<String>,
    /// Redirections followed per command before the client gets an error.
    max_redirects: u32,
    /// Where read-only commands may go (`upstream.cluster.read_from`).
    read_from: ReadFrom,
    /// How long a dropped shard channel is retried before the client is told
    /// (`upstream.cluster.resubscribe_timeout_ms`).
    resubscribe_timeout: Duration,
    /// Pools by node index; append-only, so an index never changes meaning.
    nodes: ArcSwap<Vec<Arc<Pool>>>,
    /// Node index by address; also serialises additions to `nodes`.
    index: Mutex<HashMap<Arc<str>, u16>>,
    /// The current routing table, read once per command without a lock.
    snapshot: ArcSwap<Snapshot>,
    /// Wakes the refresher early (after a MOVED, an unowned slot, a failed node). Shared with
    /// the refresher so it can wait without keeping the router (and its pools) alive.
    refresh: Arc<Notify>,
    /// Counts installed maps, so a waiter can tell that the map changed.
    generation: AtomicU64,
    /// Routes mode: keys are placed by prefix (see [`Routes`]); `None` for a cluster alone.
    routes: Option<Routes>,
    /// The scripts sessions have in flight, by node: keyless commands go to the oldest's
    /// node while it runs (see `scripts`).
    scripts: Arc<ScriptsRunning>,
    /// `slowlog-max-len` as last set through the proxy on every primary (`UNKNOWN_LEN`: never,
    /// or to a value the proxy could not read). Each node keeps that many slow log entries
    /// of its own; the merged SLOWLOG keeps that many in all, as one server would.
    slowlog_max_len: AtomicU64,
}

/// `Router::slowlog_max_len` not known.
const UNKNOWN_LEN: u64 = u64::MAX;

/// Routes mode's part of the router: fixed nodes (one per standalone or Sentinel upstream and
/// database a route uses) beside at most one Redis Cluster behind a route. The map is the
/// cluster's 16384 slots (empty without a cluster route), then fixed node `i` owning "slot"
/// `SLOTS + i` (whether a cluster is behind a route is the table's `has_cluster`): a cluster
/// route's keys keep their real hash slots, so MOVED, ASK and the
/// refresher work on the cluster part unchanged.
struct Routes {
    /// Key prefix → route → node or [`ON_CLUSTER`].
    table: Arc<RouteTable>,
    /// The fixed nodes' names (unique; node `i` is fixed node `i`), their shards' primaries
    /// in the map.
    fixed: Vec<Arc<str>>,
}

impl Router {
    /// Learns the topology from the configured seeds, creates a pool per primary and starts
    /// the refresher. A cluster that cannot be reached at start does not stop the proxy: the
    /// map starts empty (every command answers `CLUSTERDOWN`) and the refresher keeps trying.
    /// Fails only on a configuration that is not in cluster mode or unusable TLS files.
    pub(crate) async fn start(
        config: &Config,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Router>, String> {
        let u = &config.upstream;
        let cluster = match (u.mode.value, &u.cluster) {
            (UpstreamMode::Cluster, Some(c)) => c,
            _ => return Err("upstream.mode is not cluster".to_string()),
        };
        let mut settings = PoolSettings::from_config(config)?;
        settings.login.readonly = cluster.read_from() != ReadFrom::Primary;
        let seeds: Vec<String> = cluster.seeds.iter().map(|s| s.value.clone()).collect();
        let router = Router::build(settings, metrics, seeds, cluster, None, Vec::new());
        router.begin(cluster).await;
        Ok(router)
    }

    /// A router with no map yet: `routes` and its fixed `pools` (node `i` is `pools[i]`) in
    /// routes mode, the cluster's settings from `cluster` (defaults without a cluster).
    fn build(
        settings: PoolSettings,
        metrics: Arc<Metrics>,
        seeds: Vec<String>,
        cluster: &ClusterConfig,
        routes: Option<Routes>,
        pools: Vec<Arc<Pool>>,
    ) -> Arc<Router> {
        let index = routes.as_ref().map_or_else(HashMap::new, |r| {
            r.fixed
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i as u16))
                .collect()
        });
        // Replica reads are not offered behind a route (the configuration refuses them).
        let read_from = match routes {
            None => cluster.read_from(),
            Some(_) => ReadFrom::Primary,
        };
        Arc::new(Router {
            settings,
            metrics,
            seeds,
            max_redirects: cluster.max_redirects.value,
            read_from,
            resubscribe_timeout: Duration::from_millis(cluster.resubscribe_timeout_ms.value),
            nodes: ArcSwap::from_pointee(pools),
            index: Mutex::new(index),
            snapshot: ArcSwap::from_pointee(Snapshot {
                map: SlotMap::empty(),
                owners: Vec::new(),
                replicas: Vec::new(),
            }),
            refresh: Arc::new(Notify::new()),
            generation: AtomicU64::new(0),
            routes,
            scripts: Arc::default(),
            slowlog_max_len: AtomicU64::new(UNKNOWN_LEN),
        })
    }

    /// Learns the cluster's map from the seeds and starts the refresher (and the prober for
    /// `read_from: nearest`).
    async fn begin(self: &Arc<Self>, cluster: &ClusterConfig) {
        match discover(&self.seeds, &self.settings.login).await {
            Ok(map) => self.install(map),
            Err(e) => tracing::warn!(error = %e, "cluster topology unknown at start; retrying"),
        }
        let interval = Duration::from_millis(cluster.refresh_interval_ms.value);
        tokio::spawn(refresher(
            Arc::downgrade(self),
            self.refresh.clone(),
            interval,
        ));
        if self.read_from == ReadFrom::Nearest {
            tokio::spawn(prober(Arc::downgrade(self)));
        }
    }

    /// Routes mode: a router over the fixed `pools` (node `i` is `pools[i]`, named
    /// `names[i]`: unique), and with `cluster` (its configuration, with the upstream's pool
    /// settings) the nodes of the one Redis Cluster a route sends its keys to, discovered
    /// and refreshed as in cluster mode. No fixed node answers with a redirection.
    pub(crate) async fn start_routes(
        table: Arc<RouteTable>,
        pools: Vec<Arc<Pool>>,
        names: Vec<Arc<str>>,
        cluster: Option<(&ClusterConfig, PoolSettings)>,
        settings: PoolSettings,
        metrics: Arc<Metrics>,
    ) -> Arc<Router> {
        let routes = Routes {
            table,
            fixed: names,
        };
        let defaults = ClusterConfig::default();
        let with_cluster = cluster.is_some();
        let (config, settings) = cluster.unwrap_or((&defaults, settings));
        let seeds = config.seeds.iter().map(|s| s.value.clone()).collect();
        let router = Router::build(settings, metrics, seeds, config, Some(routes), pools);
        router.install(SlotMap::empty());
        if with_cluster {
            router.begin(config).await;
        }
        router
    }

    /// The route table in routes mode; `None` for a cluster alone.
    pub(crate) fn routes(&self) -> Option<&Arc<RouteTable>> {
        self.routes.as_ref().map(|r| &r.table)
    }

    /// The "slot" of a key as stored: its hash slot in a cluster, in routes mode its route's
    /// ([`Router::route_slot`]).
    pub(crate) fn slot_of(&self, key: &[u8]) -> u16 {
        match &self.routes {
            None => super::slot(key),
            Some(r) => self.route_slot(r.table.route_of(key), key),
        }
    }

    /// Routes mode: the slot of `key` on `route`: its hash slot on a cluster route, else
    /// `SLOTS + n` for the route's fixed node `n`.
    pub(crate) fn route_slot(&self, route: u16, key: &[u8]) -> u16 {
        let Some(r) = &self.routes else {
            return super::slot(key);
        };
        match r.table.node(route) {
            ON_CLUSTER => super::slot(key),
            node => SLOTS as u16 + node,
        }
    }

    /// Routes mode: the names of the routes whose keys are in `slot`, for errors.
    pub(crate) fn route_names(&self, slot: u16) -> String {
        match &self.routes {
            None => String::new(),
            Some(r) if usize::from(slot) < SLOTS => r.table.names_of_node(ON_CLUSTER),
            Some(r) => r.table.names_of_node(slot - SLOTS as u16),
        }
    }

    /// Routes mode: the names of the routes whose keys node `node` holds, for errors.
    pub(crate) fn node_route_names(&self, node: u16) -> String {
        match &self.routes {
            None => String::new(),
            Some(r) if usize::from(node) < r.fixed.len() => r.table.names_of_node(node),
            Some(r) => r.table.names_of_node(ON_CLUSTER),
        }
    }

    /// Routes mode: the pool of the cluster route's first primary (its eviction check asks
    /// it, as cluster mode asks its home node); `None` without a cluster route or map yet.
    pub(crate) fn cluster_route_pool(&self) -> Option<Arc<Pool>> {
        self.routes.as_ref().filter(|r| r.table.has_cluster())?;
        let map = self.cluster_map();
        let addr = &map.shards().first()?.primary.addr;
        let node = *self
            .index
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(addr)?;
        Some(self.pool(node))
    }

    /// The cluster's own map: in routes mode without the fixed nodes.
    fn cluster_map(&self) -> SlotMap {
        let snapshot = self.snapshot();
        match &self.routes {
            None => snapshot.map.clone(),
            Some(r) => snapshot.map.cluster_part(r.fixed.len()),
        }
    }

    /// For `/readyz`: ready when every one of the 16384 slots has an owner and every owning
    /// primary has a shared connection up, i.e. any key can be served now; otherwise what
    /// is missing (uncovered slots, primaries without a connection). In routes mode: every
    /// route's node connected, each route named.
    pub(crate) fn readiness(&self) -> Result<String, String> {
        if let Some(routes) = &self.routes {
            return self.routes_readiness(routes);
        }
        self.cluster_readiness(&self.snapshot().map)
    }

    /// Whether `map` (a cluster's) covers every slot with a connected primary.
    fn cluster_readiness(&self, map: &SlotMap) -> Result<String, String> {
        let covered = map.covered();
        if covered < SLOTS {
            return Err(format!("{covered} of {SLOTS} slots have an owner"));
        }
        let index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        let nodes = self.nodes.load();
        let down: Vec<String> = map
            .shards()
            .iter()
            .map(|s| &s.primary.addr)
            .filter(|addr| {
                index
                    .get(*addr)
                    .is_none_or(|&n| !nodes[usize::from(n)].any_up())
            })
            .map(|addr| addr.to_string())
            .collect();
        if !down.is_empty() {
            return Err(format!("no connection to primary {}", down.join(", ")));
        }
        Ok(format!(
            "{} primaries up, all {SLOTS} slots covered",
            map.shards().len()
        ))
    }

    /// [`Router::readiness`] in routes mode: each route by name, a cluster route as in
    /// cluster mode.
    fn routes_readiness(&self, routes: &Routes) -> Result<String, String> {
        let nodes = self.nodes.load();
        let table = &routes.table;
        let mut up = Vec::new();
        let mut down = Vec::new();
        for (route, name) in table.names().iter().enumerate() {
            match table.node(route as u16) {
                ON_CLUSTER => match self.cluster_readiness(&self.cluster_map()) {
                    Ok(what) => up.push(format!("route {name} (cluster): {what}")),
                    Err(what) => down.push(format!("route {name} (cluster): {what}")),
                },
                node => {
                    let pool = &nodes[usize::from(node)];
                    match pool.any_up() {
                        true => up.push(format!("route {name} ({}) connected", pool.addr())),
                        false => {
                            down.push(format!("route {name}: no connection to {}", pool.addr()))
                        }
                    }
                }
            }
        }
        match down.is_empty() {
            true => Ok(up.join("; ")),
            false => Err(down.into_iter().chain(up).collect::<Vec<_>>().join("; ")),
        }
    }

    /// The current routing table.
    pub(crate) fn snapshot(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    /// Identifies the current map: changes whenever a new one is installed.
    pub(crate) fn snapshot_id(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The connect timeout every node's pool uses.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.settings.login.connect_timeout
    }

    /// The pool of node `node` (an index handed out by this router).
    pub(crate) fn pool(&self, node: u16) -> Arc<Pool> {
        self.nodes.load()[usize::from(node)].clone()
    }

    /// Every node's pool, by index (append-only: an index a list has keeps its meaning in
    /// every later list), for a session to keep while it processes a read
    /// (`ClusterState::pools`).
    pub(crate) fn pools(&self) -> Arc<Vec<Arc<Pool>>> {
        self.nodes.load_full()
    }

    /// The pool sessions use for what is not about one node: HELLO replies, the control
    /// connection, credentials. The first primary's, or the first seed's before any map.
    pub(crate) fn home_pool(&self) -> Arc<Pool> {
        let node = self.snapshot().primaries().first().copied();
        match node {
            Some(n) => self.pool(n),
            None => {
                let seed = self.seeds.first().map_or("", String::as_str);
                self.pool(self.node(seed))
            }
        }
    }

    /// The node every session's classic pub/sub goes to (SUBSCRIBE, PSUBSCRIBE, PUBLISH): the
    /// owner of slot 0, else the first primary (in routes mode, those without a channel that
    /// names a route go to the default route's node). Redis Cluster delivers a message on
    /// every node, but PUBLISH counts only the receivers on the node it ran on; with all of
    /// this proxy's subscribers and publishers on one node the count includes every
    /// subscriber through the proxy, as on one server. Not simply the first primary: the
    /// shards' order is each node's answer to CLUSTER SHARDS (its own dictionary order), so a
    /// refresh that asked another node moved later PUBLISHes away from the subscribers
    /// (`PUBLISH/PSUBSCRIBE basics` through a cluster counted 0 now and then). `None` while
    /// no primary is known.
    pub(crate) fn pubsub_node(&self) -> Option<u16> {
        if let Some(r) = &self.routes {
            return Some(r.table.node(0));
        }
        let snapshot = self.snapshot();
        snapshot
            .owner(0)
            .or_else(|| snapshot.primaries().first().copied())
    }

    /// The node a client's keyless commands go to when nothing better is known: while a
    /// script a session sent runs, the oldest one's node, so a PING is answered `-BUSY` by
    /// a busy script's node as by one server (see `scripts`); else `home`.
    pub(crate) fn keyless(&self, client_id: u64) -> Option<u16> {
        match &self.routes {
            // A script on another route's server does not hold the default route's.
            None => self.scripts.node().or_else(|| self.home(client_id)),
            Some(_) => self.home(client_id),
        }
    }

    /// A script sent to `node` on a session's dedicated connection: keyless commands go there
    /// until the returned guard is dropped (`keyless`).
    pub(crate) fn script_started(&self, node: u16) -> ScriptRun {
        self.scripts.started(node)
    }

    /// The node a client's keyless commands go to when nothing better is known: spread by
    /// client id over the primaries (the default route's node in routes mode). `None` while no primary is known.
    pub(crate) fn home(&self, client_id: u64) -> Option<u16> {
        // Routes: a keyless command is the default route's, as on the one server it stands for.
        if let Some(r) = &self.routes {
            return Some(r.table.node(0));
        }
        let snapshot = self.snapshot();
        let primaries = snapshot.primaries();
        (!primaries.is_empty()).then(|| primaries[(client_id % primaries.len() as u64) as usize])
    }

    /// The node for a command the proxy sends on its own behalf: the owner of its first key's
    /// slot, or a primary for a keyless command; `None` while the slot has no owner.
    pub(crate) fn node_for(&self, args: &[&[u8]]) -> Option<u16> {
        let mut keys = crate::commands::KeyPositions::with_capacity(1);
        let first = crate::commands::keys_into(args, &mut keys)
            .ok()
            .and_then(|_| keys.indices().next());
        match first {
            Some(i) => self.snapshot().owner(self.slot_of(args[i])),
            None => self.home(0),
        }
    }

    /// Where read-only commands may go.
    pub(crate) fn read_from(&self) -> ReadFrom {
        self.read_from
    }

    /// The node a read-only command for `slot` goes to under `read_from` (the caller has
    /// checked the command may go to a replica): a replica whose shared connection for this
    /// client is up, chosen by client id so one client's reads stay on one replica and keep
    /// their order (`replica`), or the copy with the fastest probe (`nearest`). `None` means
    /// the primary: `read_from: primary`, no replica up, or no round trip known yet.
    pub(crate) fn read_node(
        &self,
        snapshot: &Snapshot,
        slot: u16,
        proto: u8,
        client: u64,
    ) -> Option<u16> {
        let shard = snapshot.map.owner_index(slot)?;
        let replicas = snapshot.replicas.get(shard)?;
        if replicas.is_empty() {
            return None;
        }
        let nodes = self.nodes.load();
        let up = |n: &u16| nodes[usize::from(*n)].shared_up(proto, client);
        match self.read_from {
            ReadFrom::Primary => None,
            ReadFrom::Replica => {
                let count = replicas.iter().filter(|n| up(n)).count() as u64;
                if count == 0 {
                    return None;
                }
                replicas
                    .iter()
                    .filter(|n| up(n))
                    .nth((client % count) as usize)
                    .copied()
            }
            ReadFrom::Nearest => {
                let primary = snapshot.owners[shard];
                let rtt = |n: u16| nodes[usize::from(n)].round_trip();
                let best = replicas
                    .iter()
                    .filter(|n| up(n))
                    .filter_map(|&n| rtt(n).map(|t| (t, n)))
                    .min()?;
                // Ties and unknowns go to the primary: consistent reads when nothing is gained.
                match rtt(primary) {
                    Some(p) if p <= best.0 => None,
                    _ => Some(best.1),
                }
            }
        }
    }

    /// How long a shard channel dropped by its node is retried before the client is told.
    pub(crate) fn resubscribe_timeout(&self) -> Duration {
        self.resubscribe_timeout
    }

    /// The slow log length one server would keep (`slowlog-max-len`), known once a client
    /// set it through the proxy; `None` before that.
    pub(crate) fn slowlog_max_len(&self) -> Option<usize> {
        match self.slowlog_max_len.load(Ordering::Relaxed) {
            UNKNOWN_LEN => None,
            n => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }

    /// Every primary took `CONFIG SET slowlog-max-len`: `len` is its value (`None`: one
    /// the proxy cannot read, which forgets the length).
    pub(crate) fn learn_slowlog_max_len(&self, len: Option<u64>) {
        let len = len.filter(|&n| n != UNKNOWN_LEN).unwrap_or(UNKNOWN_LEN);
        self.slowlog_max_len.store(len, Ordering::Relaxed);
    }

    /// Redirections a command may follow.
    pub(crate) fn max_redirects(&self) -> u32 {
        self.max_redirects
    }

    /// The index of the node at `addr`, creating its pool on first sight.
    pub(crate) fn node(&self, addr: &str) -> u16 {
        let mut index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = index.get(addr) {
            return i;
        }
        let addr: Arc<str> = addr.into();
        let pool = Pool::start_node(addr.clone(), &self.settings, self.metrics.clone());
        let mut nodes = Vec::clone(&self.nodes.load());
        nodes.push(pool);
        let i = (nodes.len() - 1) as u16;
        self.nodes.store(Arc::new(nodes));
        index.insert(addr, i);
        i
    }

    /// The address of node `node`, for messages.
    pub(crate) fn addr(&self, node: u16) -> Arc<str> {
        self.nodes.load()[usize::from(node)].addr().clone()
    }

    /// Applies a MOVED at once (so the next command for the slot goes to the right node
    /// without waiting for the refresh) and asks for a refresh.
    pub(crate) fn apply_moved(&self, slot: u16, addr: &str) {
        let mut map = self.cluster_map();
        if map
            .slot_owner(slot)
            .is_none_or(|s| *s.primary.addr != *addr)
        {
            map.apply_moved(slot, addr);
            self.install(map);
        }
        self.refresh_soon();
    }

    /// Asks the refresher to refresh now (coalesced with other requests).
    pub(crate) fn refresh_soon(&self) {
        self.refresh.notify_one();
    }

    /// Publishes `map` (a cluster's; in routes mode the fixed nodes are added after it),
    /// creating pools for nodes seen for the first time and retiring those
    /// of nodes no longer in it (see `Pool::set_retired`).
    fn install(&self, map: SlotMap) {
        let map = match &self.routes {
            Some(r) => map.with_fixed(&r.fixed),
            None => map,
        };
        let owners: Vec<u16> = map
            .shards()
            .iter()
            .map(|s| self.node(&s.primary.addr))
            .collect();
        let replicas: Vec<Vec<u16>> = map
            .shards()
            .iter()
            .map(|s| match self.read_from {
                ReadFrom::Primary => Vec::new(),
                ReadFrom::Replica | ReadFrom::Nearest => s
                    .replicas
                    .iter()
                    .filter(|r| r.online)
                    .map(|r| self.node(&r.addr))
                    .collect(),
            })
            .collect();
        tracing::debug!(
            covered = map.covered(),
            of = SLOTS,
            "cluster slot map installed"
        );
        let in_use: Vec<u16> = owners
            .iter()
            .chain(replicas.iter().flatten())
            .copied()
            .collect();
        for (i, pool) in self.nodes.load().iter().enumerate() {
            let retired = !in_use.contains(&(i as u16));
            if pool.set_retired(retired) {
                tracing::info!(
                    node = %pool.addr(),
                    retired,
                    "cluster node {} the slot map; its connections {}",
                    if retired { "left" } else { "is back in" },
                    if retired { "are not re-established while it is out" } else { "reconnect" },
                );
            }
        }
        self.snapshot.store(Arc::new(Snapshot {
            map,
            owners,
            replicas,
        }));
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Known primaries first, then the configured seeds.
    fn refresh_seeds(&self) -> Vec<String> {
        let mut seeds: Vec<String> = self
            .cluster_map()
            .shards()
            .iter()
            .map(|s| s.primary.addr.to_string())
            .collect();
        for seed in &self.seeds {
            if !seeds.contains(seed) {
                seeds.push(seed.clone());
            }
        }
        seeds
    }
}

/// The rate limiter's control commands go to the primary owning their key, so a limit counts
/// in one place.
impl ControlRoute for Router {
    fn pool_for(&self, args: &[&[u8]]) -> Result<Arc<Pool>, UpstreamError> {
        match self.node_for(args) {
            Some(node) => Ok(self.pool(node)),
            None => {
                self.refresh_soon();
                Err(UpstreamError::Unavailable {
                    addr: "cluster".into(),
                    reason: "no node serves the key's slot".into(),
                })
            }
        }
    }
}

/// Refreshes the map every `interval` and whenever asked; ends once the router is dropped.
async fn refresher(router: Weak<Router>, wake: Arc<Notify>, interval: Duration) {
    loop {
        // Notify keeps one permit: a request made while a refresh ran is not lost.
        if tokio::time::timeout(interval, wake.notified())
            .await
            .is_ok()
        {
            tokio::time::sleep(COALESCE).await;
        }
        let Some(r) = router.upgrade() else { return };
        let seeds = r.refresh_seeds();
        match discover(&seeds, &r.settings.login).await {
            Ok(map) => {
                if map != r.cluster_map() {
                    tracing::info!(covered = map.covered(), "cluster topology changed");
                    r.install(map);
                    r.metrics.map_refreshes_changed.inc();
                } else {
                    r.metrics.map_refreshes_unchanged.inc();
                }
            }
            Err(e) => {
                r.metrics.map_refreshes_failed.inc();
                tracing::warn!(error = %e, "cluster topology refresh failed");
            }
        }
    }
}

/// Measures the round trip of every primary and listed replica every [`PROBE_INTERVAL`], for
/// `read_from: nearest`; ends once the router is dropped.
async fn prober(router: Weak<Router>) {
    loop {
        tokio::time::sleep(PROBE_INTERVAL).await;
        let Some(r) = router.upgrade() else { return };
        let snapshot = r.snapshot();
        let nodes = snapshot
            .owners
            .iter()
            .chain(snapshot.replicas.iter().flatten());
        let pools: Vec<Arc<Pool>> = nodes.map(|&n| r.pool(n)).collect();
        drop(snapshot);
        drop(r);
        // One at a time, so each time is that node's reply alone, not time spent polling others.
        for pool in pools {
            pool.probe().await;
        }
    }
}
