//! Sentinel mode's replica pools (`upstream.sentinel.read_from: replica`): one ordinary
//! [`Pool`] per replica address the sentinels list, and the choice of replica for one
//! client's read. Replicas are numbered from 1 so that a session's `Target` node 0 stays
//! the primary: a switch between the primary and a replica is a change of target, which
//! keeps replies in request order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::pool::{Pool, PoolSettings};
use crate::observe::metrics::Metrics;

/// The replicas reads may go to.
pub(crate) struct Replicas {
    /// What every replica pool is built with: the primary's login, TLS and limits (a
    /// replica of a password-protected primary takes the same credentials).
    settings: PoolSettings,
    /// Shared with every pool, for connection gauges and errors.
    metrics: Arc<Metrics>,
    /// Node number of every address seen so far: a replica that leaves the list and comes
    /// back (or a demoted primary that becomes one) reuses its pool instead of opening more.
    index: Mutex<HashMap<Arc<str>, u16>>,
    /// Pools by node number minus one; only grows, so a number stays valid for sessions
    /// that hold it while the list changes.
    pools: ArcSwap<Vec<Arc<Pool>>>,
    /// Node numbers of the replicas listed now, which reads choose among; read once per
    /// replica read, replaced whole on each change.
    listed: ArcSwap<Vec<u16>>,
}

impl Replicas {
    /// An empty set; [`Replicas::follow`] fills it.
    pub(crate) fn new(settings: PoolSettings, metrics: Arc<Metrics>) -> Arc<Replicas> {
        Arc::new(Replicas {
            settings,
            metrics,
            index: Mutex::new(HashMap::new()),
            pools: ArcSwap::from_pointee(Vec::new()),
            listed: ArcSwap::from_pointee(Vec::new()),
        })
    }

    /// Keeps the set equal to the addresses published on `list` (by
    /// `sentinel::replicas::follow_replicas`) until the publisher is gone.
    pub(crate) async fn follow(self: Arc<Self>, mut list: watch::Receiver<Vec<Arc<str>>>) {
        loop {
            let addrs = list.borrow_and_update().clone();
            self.set(&addrs);
            if list.changed().await.is_err() {
                return;
            }
        }
    }

    /// Makes `addrs` the listed replicas, starting pools for addresses not seen before.
    pub(crate) fn set(&self, addrs: &[Arc<str>]) {
        let nodes = addrs.iter().map(|a| self.node(a)).collect();
        self.listed.store(Arc::new(nodes));
    }

    /// The node number of `addr`, starting its pool on first sight (fixed address: a
    /// replica does not move, it leaves the list).
    fn node(&self, addr: &Arc<str>) -> u16 {
        let mut index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&n) = index.get(addr) {
            return n;
        }
        let pool = Pool::start_node(addr.clone(), &self.settings, self.metrics.clone());
        let mut pools = Vec::clone(&self.pools.load());
        pools.push(pool);
        let n = pools.len() as u16;
        self.pools.store(Arc::new(pools));
        index.insert(addr.clone(), n);
        n
    }

    /// The pool of replica node `node` (1-based, as [`Replicas::pick`] returns).
    pub(crate) fn pool(&self, node: u16) -> Arc<Pool> {
        self.pools.load()[usize::from(node) - 1].clone()
    }

    /// The replica a client's read goes to: among the listed replicas whose shared
    /// connection for this client is up, client id modulo their number, so one client's
    /// reads stay on one replica (and in order) while the set holds. `None` (read from the
    /// primary) when none is up: a missing replica is never an error.
    pub(crate) fn pick(&self, proto: u8, client: u64) -> Option<u16> {
        let listed = self.listed.load();
        if listed.is_empty() {
            return None;
        }
        let pools = self.pools.load();
        let up = |n: &&u16| pools[usize::from(**n) - 1].shared_up(proto, client);
        let count = listed.iter().filter(up).count() as u64;
        if count == 0 {
            return None;
        }
        listed
            .iter()
            .filter(up)
            .nth((client % count) as usize)
            .copied()
    }
}
