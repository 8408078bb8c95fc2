//! The upstream mode a session routes through, and the per-session state only that mode
//! needs. A standalone session holds nothing here (a zero-sized variant), a Sentinel one the
//! primary's epoch and the replicas, a cluster one (boxed: one pointer in every other
//! session) the slot bookkeeping, parked runs, the transaction log and shard channels.
//! An enum rather than a trait object: nothing is boxed per call and the session future
//! stays small.

use super::cluster::state::{ClusterState, PoolRef};
use super::context::Upstreams;
use std::sync::Arc;

use super::conn::Target;
use super::reply_queue::Sent;
use super::run::Run;
use super::spread;
use tokio::sync::mpsc;

use crate::upstream::Batch;
use crate::upstream::replicas::Replicas;

/// One session's routing state, by upstream mode.
pub(super) enum Routing {
    /// One Redis: every command goes to the pool's primary.
    Standalone,
    /// A Sentinel-managed primary (see `Sentinel`).
    Sentinel(Sentinel),
    /// A Redis Cluster (see `ClusterState`).
    Cluster(Box<ClusterState>),
}

/// A Sentinel session's routing state.
pub(super) struct Sentinel {
    /// The replicas reads may go to (`read_from: replica`); `None` otherwise.
    pub(super) replicas: Option<Arc<Replicas>>,
    /// The upstream's address epoch when the session started; a different epoch at WAIT time
    /// means a failover came after writes the WAIT would cover.
    pub(super) wait_epoch: u64,
}

impl Routing {
    /// The routing state a new session starts with; `epoch` is the upstream's address epoch
    /// now.
    pub(super) fn new(upstreams: &Upstreams, epoch: u64) -> Routing {
        match upstreams {
            Upstreams::Standalone => Routing::Standalone,
            Upstreams::Sentinel { replicas } => Routing::Sentinel(Sentinel {
                replicas: replicas.clone(),
                wait_epoch: epoch,
            }),
            Upstreams::Cluster(router) => Routing::Cluster(Box::new(ClusterState {
                router: router.clone(),
                spread: spread::Spread::default(),
                parked: Vec::new(),
                parked_frames: 0,
                multi_slot: None,
                held_in_multi: Vec::new(),
                tx_log: None,
                shard_subs: None,
                keyspace: None,
                monitor: None,
                deferred_multi: None,
                tracking: None,
                listeners: None,
                own_starts: 0,
                login: None,
                spare: super::cluster::state::Spare::default(),
                map: None,
                pools: None,
                flush_news: None,
                blocked_read: None,
            })),
        }
    }

    /// The cluster's router, in cluster mode.
    pub(super) fn router(&self) -> Option<&Arc<crate::topology::cluster::Router>> {
        match self {
            Routing::Cluster(c) => Some(&c.router),
            _ => None,
        }
    }

    /// Whether this is a cluster session.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Routing::Cluster(_))
    }

    /// The Sentinel replicas reads may go to.
    pub(super) fn replicas(&self) -> Option<&Arc<Replicas>> {
        match self {
            Routing::Sentinel(s) => s.replicas.as_ref(),
            _ => None,
        }
    }

    /// The cluster state, in cluster mode.
    pub(super) fn cluster(&self) -> Option<&ClusterState> {
        match self {
            Routing::Cluster(c) => Some(c),
            _ => None,
        }
    }

    /// Frames parked for other nodes (always 0 outside cluster mode).
    pub(super) fn parked_frames(&self) -> usize {
        self.cluster().map_or(0, |c| c.parked_frames)
    }

    /// Whether the session holds per-node connections of its own that push to its reply
    /// channel (cluster mode: shard subscriptions, keyspace notifications, MONITOR, tracking,
    /// the client's own login, invalidation listeners): the idle release keeps the channel,
    /// whose end would fail their next push and end the connection under the client.
    pub(super) fn pushes_to_session(&self) -> bool {
        self.cluster().is_some_and(|c| {
            c.shard_subs.is_some()
                || c.keyspace.is_some()
                || c.monitor.is_some()
                || c.tracking.is_some()
                || c.login.is_some()
                || c.listeners.is_some()
        })
    }

    // Hooks: what the mode-neutral files (forward, batch, queue, io) tell the mode or ask it,
    // each one match here instead of a check of the mode at every call site.

    /// Commands for `hash_slots` were answered (or failed): in cluster mode they no longer
    /// hold back a later command for the same slot bound for another node.
    pub(super) fn answered(&mut self, hash_slots: &[u16]) {
        if let Routing::Cluster(c) = self {
            c.spread.answered(hash_slots);
        }
    }

    /// A kept batch is done with (answered, or failed): its hash slots are no longer in
    /// flight ([`Routing::answered`]), and in cluster mode what it allocated is kept for the
    /// next batches (`Spare`).
    pub(super) fn finished(&mut self, sent: Box<Sent>) {
        if let Routing::Cluster(c) = self {
            c.finished(sent);
        }
    }

    /// `sent` boxed, in cluster mode in a record an answered batch left (`Spare`).
    pub(super) fn boxed(&mut self, sent: Sent) -> Box<Sent> {
        match self {
            Routing::Cluster(c) => c.spare.boxed(sent),
            _ => Box::new(sent),
        }
    }

    /// An empty vector for a run's hash slots with room for `room` (cluster mode: one an
    /// answered batch left, when there is one).
    pub(super) fn hash_slots(&mut self, room: usize) -> Vec<u16> {
        match self {
            Routing::Cluster(c) => c.spare.slots(room),
            _ => Vec::with_capacity(room),
        }
    }

    /// A read is about to be processed: in cluster mode the session keeps the router's slot
    /// map for it (`ClusterState::map`).
    pub(super) fn keep_map(&mut self) {
        if let Routing::Cluster(c) = self {
            c.keep_map();
        }
    }

    /// Whether the mode keeps allocations for the next batches, or a slot map that may
    /// be an old one, which the idle release gives back ([`Routing::release_spare`]).
    pub(super) fn holds_spare(&self) -> bool {
        matches!(self, Routing::Cluster(c) if c.spare.holds() || c.map.is_some())
    }

    /// Gives back what [`Routing::holds_spare`] counts: a quiet session must not keep a map
    /// the router replaced alive.
    pub(super) fn release_spare(&mut self) {
        if let Routing::Cluster(c) = self {
            c.spare = super::cluster::state::Spare::default();
            c.map = None;
            c.pools = None;
        }
    }

    /// A command for `slot` is sent on `target` now; `true` when the mode keeps the slot in
    /// flight (cluster mode, a shared connection), so the caller records it with the batch
    /// and reports it to [`Routing::answered`] with the reply.
    pub(super) fn sent(&mut self, target: Target, slot: u16) -> bool {
        match (self, target) {
            (Routing::Cluster(c), Target::Shared(..)) => {
                c.spread.sent(target, &[slot]);
                true
            }
            _ => false,
        }
    }

    /// A script is sent on `target` now: in cluster mode it counts as running on its node
    /// (keyless commands go there, `Router::keyless`) until the returned guard is dropped
    /// with its reply.
    pub(super) fn script_sent(
        &self,
        target: Target,
    ) -> Option<crate::topology::cluster::ScriptRun> {
        match (self, target) {
            (Routing::Cluster(c), Target::Dedicated(node)) => Some(c.router.script_started(node)),
            _ => None,
        }
    }

    /// Every reply is in: nothing a paused command waited for is in flight any more.
    pub(super) fn drained(&mut self) {
        if let Routing::Cluster(c) = self {
            c.spread.clear_wait();
        }
    }

    /// Whether a paused command may go although replies are still due: in cluster mode, once
    /// the one slot it waited for was answered; never elsewhere (it waits for all of them).
    pub(super) fn resumable(&mut self) -> bool {
        match self {
            Routing::Cluster(c) => c.spread.resumable(),
            _ => false,
        }
    }

    /// An upstream connection failed: in cluster mode the node may have been replaced
    /// (failover), so the map is refreshed now rather than at the next periodic refresh.
    pub(super) fn upstream_failed(&self) {
        if let Routing::Cluster(c) = self {
            c.router.refresh_soon();
        }
    }

    /// The pool a command for `node` goes to, and whether that node is a replica (counted as
    /// a replica read); `None` for the primary's own pool (standalone, and node 0 of a
    /// Sentinel session), which the caller holds already.
    pub(super) fn node_pool(&self, node: u16) -> Option<(PoolRef<'_>, bool)> {
        match self {
            Routing::Cluster(c) => Some((
                c.pool(node),
                c.router.read_from() != crate::config::ReadFrom::Primary
                    && !c.map().is_primary(node),
            )),
            // Node ≥ 1 exists only when `place_read` chose a Sentinel replica.
            Routing::Sentinel(Sentinel {
                replicas: Some(replicas),
                ..
            }) if node != 0 => Some((PoolRef::Owned(replicas.pool(node)), true)),
            Routing::Standalone | Routing::Sentinel(_) => None,
        }
    }

    /// The client left: an XREAD … BLOCK across slots blocking in its own task stops, its
    /// connections closed (`cluster::blocking_read`); nothing in every other mode.
    pub(super) fn cancel_blocked_read(&mut self) {
        if let Routing::Cluster(c) = self {
            c.blocked_read = None;
        }
    }

    /// The keyless commands a cluster MULTI held until its first key chose the node
    /// (`cluster::place`), taken to be sent after MULTI; empty in every other mode.
    pub(super) fn take_held_in_multi(&mut self) -> Vec<bytes::Bytes> {
        match self {
            Routing::Cluster(c) => std::mem::take(&mut c.held_in_multi),
            _ => Vec::new(),
        }
    }

    /// Whether a push `frame` from connection `conn` is a flush's null the client already
    /// has, which only a cluster's nodes send (`flush_news::FlushNews`; `mark`: where it would
    /// go in the reply order).
    pub(super) fn repeated_flush(
        &mut self,
        frame: &[u8],
        conn: u64,
        mark: impl FnOnce() -> u64,
    ) -> bool {
        match self {
            Routing::Cluster(c) => c.repeated_flush(frame, conn, mark),
            _ => false,
        }
    }

    /// Whether a command for `target` may leave the current run parked instead of sending
    /// it: in cluster mode only (`scatter`).
    pub(super) fn may_scatter(&self, run: &Run, target: Target, hidden: bool) -> bool {
        match self {
            Routing::Cluster(_) => super::scatter::may_scatter(run, target, hidden),
            _ => false,
        }
    }

    /// Runs parked for other nodes (cluster mode), taken to be sent now.
    pub(super) fn take_parked(&mut self) -> Vec<Run> {
        match self {
            Routing::Cluster(c) if !c.parked.is_empty() => {
                c.parked_frames = 0;
                std::mem::take(&mut c.parked)
            }
            _ => Vec::new(),
        }
    }

    /// A keyed command of the open transaction was forwarded: in cluster mode the
    /// transaction is bound to the first one's hash slot.
    pub(super) fn bind_multi(&mut self, hash_slot: Option<u16>) {
        if let Routing::Cluster(c) = self {
            c.multi_slot = c.multi_slot.or(hash_slot);
        }
    }

    /// A MULTI the proxy answered (cluster mode), kept as the client spelled it until the
    /// first key picks the transaction's node.
    pub(super) fn defer_multi(&mut self, multi: bytes::Bytes) {
        if let Routing::Cluster(c) = self {
            c.deferred_multi = Some(multi);
        }
    }

    /// The deferred MULTI as the client spelled it, taken to be sent now (`defer_multi`).
    pub(super) fn take_deferred_multi(&mut self) -> Option<bytes::Bytes> {
        match self {
            Routing::Cluster(c) => c.deferred_multi.take(),
            _ => None,
        }
    }

    /// A keyless command of a cluster MULTI held until the first key picks the node.
    pub(super) fn hold_in_multi(&mut self, command: bytes::Bytes) {
        if let Routing::Cluster(c) = self {
            c.held_in_multi.push(command);
        }
    }

    /// A transaction began again or ended (EXEC, DISCARD, an error): what the mode kept for
    /// it (the cluster's bound slot and held commands) is dropped.
    pub(super) fn multi_ended(&mut self) {
        if let Routing::Cluster(c) = self {
            c.multi_slot = None;
            c.held_in_multi = Vec::new();
            c.deferred_multi = None;
        }
    }

    /// Which connection the session's command for `node` takes where the client's own login
    /// or tracking decides it (cluster mode, `ClusterState::own_conn`); `Any` elsewhere.
    pub(super) fn own_conn(&self, node: u16) -> super::cluster::state::OwnConn<'_> {
        match self {
            Routing::Cluster(c) => c.own_conn(node),
            _ => super::cluster::state::OwnConn::Any,
        }
    }

    /// The connections of the mode's own that hold the client's subscriptions (a cluster
    /// session's per-node shard connections), for a RESET to drop them upstream first.
    pub(super) fn subscription_conns(&self) -> impl Iterator<Item = &mpsc::Sender<Batch>> {
        let shard = match self {
            Routing::Cluster(c) => c.shard_subs.as_deref(),
            _ => None,
        };
        shard.into_iter().flat_map(|s| s.conns())
    }

    /// RESET: the mode's per-connection state (cluster: shard channels, keyspace
    /// notification names, tracking, the transaction's slot, held commands and log) is
    /// dropped, as Redis drops the connection's.
    pub(super) fn reset(&mut self) {
        self.multi_ended();
        if let Routing::Cluster(c) = self {
            c.shard_subs = None;
            c.keyspace = None;
            c.monitor = None;
            c.tracking = None;
            // RESET makes the client RESP2, which Redis sends no redirected invalidation
            // unless it subscribes (`tracking::listeners_follow_proto`).
            c.listeners = None;
            c.tx_log = None;
            // RESET logs the connection out: the default user again, the pool's login.
            c.login = None;
        }
    }

    /// Whether a command for `slot` (its hash slot, if keyed) must wait before going to
    /// `target` while `inflight` (the target of the commands in flight, if any) has not
    /// answered; when so, notes what it waits for. Standalone and Sentinel: any other target
    /// in flight. Cluster: between shared connections only a hash slot in flight on another
    /// one (its commands must run first, see `spread`); with a dedicated connection on
    /// either side, everything in flight, as standalone.
    pub(super) fn blocks(
        &mut self,
        inflight: Option<Target>,
        target: Target,
        slot: Option<u16>,
    ) -> bool {
        let Routing::Cluster(c) = self else {
            return inflight.is_some_and(|last| last != target);
        };
        let spread = &mut c.spread;
        if let Some(last) = inflight {
            let shared = matches!((last, target), (Target::Shared(..), Target::Shared(..)));
            if !shared && last != target {
                spread.clear_wait();
                return true;
            }
        }
        // The slot's commands may also be in a run not sent yet (counted when they joined).
        match slot {
            Some(s) if spread.elsewhere(s, target) => {
                spread.wait_for(s);
                true
            }
            _ => false,
        }
    }

    /// Where reads go (`PROXY INFO`): the cluster's `read_from`, `replica` in front of
    /// Sentinel replicas, `None` where every command goes to the primary.
    pub(super) fn read_from(&self) -> Option<crate::config::ReadFrom> {
        match self {
            Routing::Cluster(c) => Some(c.router.read_from()),
            Routing::Sentinel(Sentinel {
                replicas: Some(_), ..
            }) => Some(crate::config::ReadFrom::Replica),
            Routing::Sentinel(_) | Routing::Standalone => None,
        }
    }
}
