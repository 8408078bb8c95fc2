//! What a cluster session keeps (`ClusterState`: the router, the slots in flight, parked
//! runs, the transaction's log) and the sets of its own connections to the nodes (shard
//! channels, keyspace notifications, tracking, the client's login, MONITOR), with the
//! methods that only read or tidy them. The files named for each concern carry out the
//! steps on them through `ClusterSession`, so this file is below them all and below the
//! view.

use super::again::Again;
use super::plan::Login;
use crate::protocol::reply::{PubSubFrame, SubKind};
use crate::session::reply_queue::Sent;
use crate::session::run::Run;
use crate::session::spread;
use crate::session::tenant_quota::Share;
use crate::topology::cluster::router::Snapshot;
use crate::upstream::{Batch, Subscriptions};
use crate::upstream::{hello_command, unanswered};
use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;

/// A cluster session's routing state.
pub(in crate::session) struct ClusterState {
    /// The slot map and the nodes' pools.
    pub(in crate::session) router: Arc<crate::topology::cluster::Router>,
    /// The hash slots in flight and where, so a slot's commands run in order across nodes.
    pub(in crate::session) spread: spread::Spread,
    /// Runs for other nodes, parked while a pipeline alternates between nodes and sent with
    /// the current run (see `scatter`).
    pub(in crate::session) parked: Vec<Run>,
    /// Frames in `parked`, which count toward `max_inflight` like the current run's.
    pub(in crate::session) parked_frames: usize,
    /// The hash slot of the open MULTI's keyed commands, which must all share it; the
    /// transaction stays on its node even if the map moves the slot meanwhile.
    pub(in crate::session) multi_slot: Option<u16>,
    /// While MULTI is deferred: the keyless commands queued so far (answered `+QUEUED` by
    /// the proxy), sent after MULTI with the first command that names a node. Sent to the
    /// client's home node at once, a PING first in a transaction would decide the node and a
    /// later key of another node would be refused (CROSSSLOT). At most `HELD_IN_MULTI`;
    /// emptied when a MULTI is deferred and when its commands are sent.
    pub(in crate::session) held_in_multi: Vec<bytes::Bytes>,
    /// The transaction open on the dedicated connection as its replies show it, to replay it
    /// on another node if its slot moved (see `cluster::transaction`).
    pub(in crate::session) tx_log: Option<Box<TxLog>>,
    /// Shard channels subscribed on any node and their per-node connections (see
    /// `shard_subs`); `None` until the first SSUBSCRIBE.
    pub(in crate::session) shard_subs: Option<Box<ShardSubs>>,
    /// Keyspace notification names subscribed on the other primaries and their connections
    /// (see `keyspace`); `None` until the first subscription to one.
    pub(in crate::session) keyspace: Option<Box<KeyspaceSubs>>,
    /// While MULTI is deferred: the client's MULTI as it spelled it, sent with the first
    /// command that names a node (a MONITOR shows it so, as Redis's own suite checks).
    pub(in crate::session) deferred_multi: Option<bytes::Bytes>,
    /// MONITOR on the primaries other than the home node (see `monitor`); `None` while the
    /// client does not monitor.
    pub(in crate::session) monitor: Option<Box<ClusterMonitor>>,
    /// CLIENT TRACKING over every primary (see `tracking`); `None` while off.
    pub(in crate::session) tracking: Option<Box<ClusterTracking>>,
    /// Connections that only listen for the invalidations another client's tracking
    /// redirects to this RESP3 client, on the primaries where it had none (`tracking`,
    /// `listen_everywhere`); `None` until such a redirect names it.
    pub(in crate::session) listeners: Option<Box<Listeners>>,
    /// How many times tracking was started or a login spread (`cluster::tracking::
    /// open_everywhere`): their connections' ids include it, so the end of one closed
    /// earlier (an OFF, a RESET) is never taken for a live one's.
    pub(in crate::session) own_starts: u64,
    /// The client's own login over every primary (see `login`); `None` while it is on the
    /// pool's login (or on its dedicated connection's).
    pub(in crate::session) login: Option<Box<ClusterLogin>>,
    /// What answered batches allocated, for the next ones (see [`Spare`]).
    pub(in crate::session) spare: Spare,
    /// The slot map as of the start of the current read, and the router's generation it
    /// was (`map`): placing a command read it from the router's `ArcSwap` each time, ~65
    /// instructions per command at cluster `-P 16` (callgrind).
    pub(in crate::session) map: Option<(u64, Arc<Snapshot>)>,
    /// The nodes' pools as of `map` (kept with it): a batch's pool came from the router's
    /// `ArcSwap` and was cloned, ~75 instructions per batch at cluster `-P 1` (callgrind).
    /// Indexes are never reused, so a node added since is looked up in the router instead.
    pub(in crate::session) pools: Option<Arc<Vec<Arc<crate::upstream::pool::Pool>>>>,
    /// The flush invalidations the client was told of (see `flush_news::FlushNews`); `None`
    /// until the first one.
    pub(in crate::session) flush_news: Option<Box<super::flush_news::FlushNews>>,
    /// An XREAD … BLOCK across slots blocking in a task of its own (`blocking_read`):
    /// dropped (the client left, the session ended), the task closes its connections.
    pub(in crate::session) blocked_read: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The slot map a command is placed by: the session's copy, or the router's when that
/// changed since the read began.
pub(in crate::session) enum MapRef<'a> {
    /// `ClusterState::map`, still the router's.
    Kept(&'a Snapshot),
    /// Loaded from the router: it installed a new map during the read.
    Loaded(arc_swap::Guard<Arc<Snapshot>>),
}

impl std::ops::Deref for MapRef<'_> {
    type Target = Snapshot;
    fn deref(&self) -> &Snapshot {
        match self {
            MapRef::Kept(s) => s,
            MapRef::Loaded(g) => g,
        }
    }
}

/// A node's pool: borrowed from the session's kept list, or owned from the router (a node
/// added since the read began).
pub(in crate::session) type PoolRef<'a> = std::borrow::Cow<'a, Arc<crate::upstream::pool::Pool>>;

/// What a shared batch's bookkeeping allocated, kept for the next batches once its replies
/// are in: at cluster `-P 16` a pipeline is a batch per node, and each allocated its hash
/// slots and its record (`Sent`), freed with the reply (malloc and free were ~200
/// instructions per request, callgrind; standalone ~20). A few of each are kept, and given
/// back at the idle release. The batch's bytes are not: when they are a slice of an old read
/// buffer, the one reference left keeps the whole buffer (16 KiB) however little of it the
/// slice shows, which a kept buffer would pin per session.
#[derive(Default)]
pub(in crate::session) struct Spare {
    /// Emptied `Run::hash_slots` vectors.
    slots: Vec<Vec<u16>>,
    /// Batch records whose contents were taken: their boxes are what is reused (a batch
    /// keeps its record boxed in its reply slot, `Slot::Upstream::sent`).
    #[expect(clippy::vec_box, reason = "the boxes' allocations are what is kept")]
    sent: Vec<Box<Sent>>,
}

/// How many of each kind `Spare` keeps: a session's batches in flight at once (one per node
/// of a pipeline, a pipeline or two at a time).
const SPARE_KEPT: usize = 8;

impl Spare {
    /// A batch's record is done with: its hash slots and the record itself are kept, up to
    /// `SPARE_KEPT` of each; its bytes are dropped.
    pub(in crate::session) fn keep(&mut self, mut sent: Box<Sent>) {
        let mut slots = std::mem::take(&mut sent.hash_slots);
        if slots.capacity() > 0 && self.slots.len() < SPARE_KEPT {
            slots.clear();
            self.slots.push(slots);
        }
        sent.bytes = Bytes::new();
        if self.sent.len() < SPARE_KEPT {
            self.sent.push(sent);
        }
    }

    /// `sent` boxed, in a kept record when there is one.
    pub(in crate::session) fn boxed(&mut self, sent: Sent) -> Box<Sent> {
        match self.sent.pop() {
            Some(mut kept) => {
                *kept = sent;
                kept
            }
            None => Box::new(sent),
        }
    }

    /// An empty vector for a run's hash slots, with room for `room`.
    pub(in crate::session) fn slots(&mut self, room: usize) -> Vec<u16> {
        self.slots.pop().unwrap_or_else(|| Vec::with_capacity(room))
    }

    /// Whether anything is kept (what the idle release gives back).
    pub(in crate::session) fn holds(&self) -> bool {
        !(self.slots.is_empty() && self.sent.is_empty())
    }
}

impl ClusterState {
    /// A kept batch is done with: its hash slots leave the in-flight count and what it
    /// allocated is kept for the next batches (`Spare`).
    pub(in crate::session) fn finished(&mut self, sent: Box<Sent>) {
        self.spread.answered(&sent.hash_slots);
        self.spare.keep(sent);
    }

    /// The slot map now (see [`ClusterState::map`]).
    pub(in crate::session) fn map(&self) -> MapRef<'_> {
        match &self.map {
            Some((generation, map)) if *generation == self.router.snapshot_id() => {
                MapRef::Kept(map)
            }
            _ => MapRef::Loaded(self.router.snapshot()),
        }
    }

    /// Keeps the router's slot map for the read about to be processed, when it changed.
    pub(in crate::session) fn keep_map(&mut self) {
        // The generation first: a map installed in between is newer than the generation
        // says, so it is loaded again next time rather than kept as current while stale.
        let generation = self.router.snapshot_id();
        if self.map.as_ref().is_none_or(|(g, _)| *g != generation) {
            self.map = Some((generation, self.router.snapshot().clone()));
            self.pools = Some(self.router.pools());
        }
    }

    /// The pool of `node`: the kept one (see [`ClusterState::pools`]), or the router's for a
    /// node added since.
    pub(in crate::session) fn pool(&self, node: u16) -> PoolRef<'_> {
        match self.pools.as_ref().and_then(|p| p.get(usize::from(node))) {
            Some(pool) => PoolRef::Borrowed(pool),
            None => PoolRef::Owned(self.router.pool(node)),
        }
    }

    /// The shard subscriptions, once the first SSUBSCRIBE came.
    pub(in crate::session) fn shard_subs(&self) -> Option<&ShardSubs> {
        self.shard_subs.as_deref()
    }

    /// The shard subscriptions, once the first SSUBSCRIBE came.
    pub(in crate::session) fn shard_subs_mut(&mut self) -> Option<&mut ShardSubs> {
        self.shard_subs.as_deref_mut()
    }

    /// The shard subscriptions, created on first use.
    pub(in crate::session) fn shard_subs_or_new(&mut self) -> &mut ShardSubs {
        self.shard_subs.get_or_insert_with(Box::default)
    }

    /// The keyspace notification names spread to every primary, once the session
    /// subscribed to one.
    pub(in crate::session) fn keyspace(&self) -> Option<&KeyspaceSubs> {
        self.keyspace.as_deref()
    }

    /// The keyspace notification names spread to every primary, as `keyspace`.
    pub(in crate::session) fn keyspace_mut(&mut self) -> Option<&mut KeyspaceSubs> {
        self.keyspace.as_deref_mut()
    }

    /// The keyspace notification names, created on first use.
    pub(in crate::session) fn keyspace_or_new(&mut self) -> &mut KeyspaceSubs {
        self.keyspace.get_or_insert_with(Box::default)
    }

    /// Which connection the session's command for `node` takes where the client's own login
    /// or tracking decides it (`cluster::login`, `cluster::tracking`). With both, tracking
    /// that carries the session's commands takes them (its connections are logged in as the
    /// client too, and Redis tracks what each reads); else the login's.
    pub(in crate::session) fn own_conn(&self, node: u16) -> OwnConn<'_> {
        match (&self.login, &self.tracking) {
            (_, Some(t)) if t.carries() => t.conn_for(node),
            (Some(login), _) => login.conn_for(node),
            (None, Some(t)) => t.conn_for(node),
            (None, None) => OwnConn::Any,
        }
    }
}

/// The session's shard subscriptions and the connections holding them.
#[derive(Default)]
pub(in crate::session) struct ShardSubs {
    /// Every shard channel the session is subscribed to, as named upstream (namespaced), and
    /// the node holding it. Its size is the count Redis reports in confirmations.
    pub(in crate::session) channels: HashMap<Bytes, u16>,
    /// One pub/sub connection per node with subscriptions (a handful at most: one per
    /// primary), looked up by a scan.
    pub(in crate::session) conns: Vec<NodeConn>,
    /// Source of the connections' ids (below `SHARD_CONN`), to know which one ended.
    pub(in crate::session) next_id: u64,
    /// Channels Redis dropped whose `sunsubscribe` came while an `SSUBSCRIBE` of ours awaited
    /// its confirmation on the same connection, which took it for that reply: they are
    /// subscribed again once the command at hand is done.
    pub(in crate::session) orphans: Vec<Bytes>,
    /// Channels whose owner could not take them yet (held at node `PENDING` in `channels`),
    /// and when to stop trying and tell the client. Retried in the background, so the
    /// session keeps serving through a failover.
    pub(in crate::session) pending: Vec<(Bytes, tokio::time::Instant)>,
    /// A retry wake-up is on its way: one at a time.
    pub(in crate::session) retry_scheduled: bool,
}

/// Where a per-node connection comes from (`open_node_conn`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::session) enum Stock {
    /// The node's warm stock when it has one ready.
    Take,
    /// Dialled: a session taking one of every node at once (tracking) would set every
    /// node's stock refilling (see `Pool::dedicated_unstocked`).
    Dial,
}

/// A dedicated connection of the session's to one node (shard channels here, keyspace
/// notifications in `keyspace`, tracking and listeners in `tracking`).
pub(in crate::session) struct NodeConn {
    /// The node it is connected to.
    pub(in crate::session) node: u16,
    /// Where its commands go; its pushes come on the session's reply channel.
    pub(in crate::session) tx: mpsc::Sender<Batch>,
    /// Echoed in `Reply::PinnedClosed` when it ends, to find which channels it held.
    pub(in crate::session) id: u64,
    /// Logged in as the script user (`Opened::confined`): a default-mode tracking
    /// connection serves as the session's dedicated one, scripts included (`tracking`).
    pub(in crate::session) confined: bool,
    /// Redis's id of the connection, mapped to the client's id while it serves as the
    /// session's dedicated one (another client's CLIENT UNBLOCK must find it).
    pub(in crate::session) upstream_id: Option<u64>,
    /// Counts the connection against the client's tenant while it lives, as the session's
    /// own dedicated connection is counted: without it one tenant's subscribers could hold
    /// every node's dedicated connections (issue 26's guarantee).
    pub(in crate::session) _share: Share,
    /// Its entry as the client's listener on `node` while it has one (`client_ids`: a
    /// subscriber's keyspace connection, which another client's REDIRECT may name).
    pub(in crate::session) listener: Option<crate::session::client_ids::Registration>,
}

impl ShardSubs {
    /// Where the commands of each node connection go.
    pub(in crate::session) fn conns(&self) -> impl Iterator<Item = &mpsc::Sender<Batch>> {
        self.conns.iter().map(|c| &c.tx)
    }

    /// Closes the connections to nodes that hold none of the channels any more; Redis drops
    /// a connection's subscriptions with it.
    pub(in crate::session) fn prune(&mut self) {
        let channels = &self.channels;
        self.conns
            .retain(|c| !c.tx.is_closed() && channels.values().any(|&n| n == c.node));
    }

    /// Forgets every channel and connection: the confirmations of `SUNSUBSCRIBE` without
    /// channels, one per channel with the count left, or one without a channel when there
    /// was none.
    pub(in crate::session) fn unsubscribe_all(&mut self, proto: u8) -> Bytes {
        // Every connection goes: closing it unsubscribes everything upstream.
        let all: Vec<Bytes> = self.channels.drain().map(|(c, _)| c).collect();
        self.conns.clear();
        let mut out = BytesMut::new();
        if all.is_empty() {
            out.extend_from_slice(&confirmation(proto, "sunsubscribe", None, 0));
        }
        for (i, c) in all.iter().enumerate() {
            let left = all.len() - 1 - i;
            out.extend_from_slice(&confirmation(proto, "sunsubscribe", Some(c), left));
        }
        out.freeze()
    }

    /// Forgets `channels`: their confirmations, each with the count left, and the channels
    /// that were held, with their nodes, to unsubscribe upstream.
    pub(in crate::session) fn unsubscribe_some(
        &mut self,
        proto: u8,
        channels: Vec<Bytes>,
    ) -> (Bytes, Vec<(u16, Bytes)>) {
        let mut out = BytesMut::new();
        let mut gone = Vec::new();
        for c in channels {
            if let Some(node) = self.channels.remove(&c) {
                gone.push((node, c.clone()));
            }
            let count = self.channels.len();
            out.extend_from_slice(&confirmation(proto, "sunsubscribe", Some(&c), count));
        }
        (out.freeze(), gone)
    }
}

/// What every keyspace notification channel starts with (then the database number).
pub(in crate::session) const NOTIFICATION_PREFIXES: [&[u8]; 2] = [b"__keyspace@", b"__keyevent@"];

/// The channel Redis sends a RESP2 client's redirected invalidations on.
pub(in crate::session) const INVALIDATE_CHANNEL: &[u8] = b"__redis__:invalidate";

/// Whether `channel` is published by each node for its own keys only: a keyspace
/// notification channel, or `__redis__:invalidate`.
pub(in crate::session) fn is_notification_channel(channel: &[u8]) -> bool {
    channel == INVALIDATE_CHANNEL || NOTIFICATION_PREFIXES.iter().any(|p| channel.starts_with(p))
}

/// Whether the glob `pattern` may match a keyspace notification channel. Conservative: the
/// literal part before the first special character (`*`, `?`, `[`, or the escape `\`) must
/// agree with a notification prefix as far as both go. A pattern without special characters
/// matches only itself.
pub(in crate::session) fn may_match_notification(pattern: &[u8]) -> bool {
    let glob = pattern
        .iter()
        .position(|b| matches!(b, b'*' | b'?' | b'[' | b'\\'));
    let Some(at) = glob else {
        return is_notification_channel(pattern);
    };
    let literal = &pattern[..at];
    NOTIFICATION_PREFIXES
        .iter()
        .any(|p| p.starts_with(literal) || literal.starts_with(p))
}

/// The notification names the client holds, as named upstream, each with whether the home
/// connection confirmed it to the client: only then do the other primaries' deliveries for it
/// pass, so none comes before the client's confirmation, and a name the home node refused or
/// never got is never delivered from elsewhere.
#[derive(Default)]
pub(in crate::session) struct Names {
    /// Notification channels (`SUBSCRIBE`).
    pub(in crate::session) channels: HashMap<Bytes, bool>,
    /// Patterns that may match one (`PSUBSCRIBE`).
    pub(in crate::session) patterns: HashMap<Bytes, bool>,
}

impl Names {
    /// The names of `kind` (channels or patterns).
    pub(in crate::session) fn of(&mut self, kind: SubKind) -> &mut HashMap<Bytes, bool> {
        match kind {
            SubKind::Pattern => &mut self.patterns,
            _ => &mut self.channels,
        }
    }

    /// Whether the extra connection's push `frame` goes to the client: a notification
    /// delivered for a name held and confirmed. Anything else is heard on the home connection (a
    /// `PUBLISH` reaches every node) or is the proxy's own (confirmations).
    pub(in crate::session) fn admits(&self, frame: &[u8]) -> bool {
        let element = |i| crate::protocol::reply::element(frame, i);
        let (set, name, channel) = match element(0) {
            Some(k) if k.eq_ignore_ascii_case(b"message") => {
                (&self.channels, element(1), element(1))
            }
            Some(k) if k.eq_ignore_ascii_case(b"pmessage") => {
                (&self.patterns, element(1), element(2))
            }
            // A RESP3 subscriber's redirected invalidations (module comment).
            Some(k) if k == b"invalidate" => {
                let name = Bytes::from_static(INVALIDATE_CHANNEL);
                return self.channels.get(&name) == Some(&true);
            }
            _ => return false,
        };
        match (name, channel) {
            (Some(name), Some(channel)) => {
                is_notification_channel(channel) && set.get(name) == Some(&true)
            }
            _ => false,
        }
    }

    /// Marks as confirmed to the client the names that the home connection's reply `data`
    /// confirms subscribed.
    pub(in crate::session) fn confirm(&mut self, data: &[u8]) {
        for frame in crate::protocol::reply::frames(data) {
            let kind = match crate::protocol::reply::classify_pubsub(frame) {
                PubSubFrame::Confirmation {
                    kind: kind @ (SubKind::Channel | SubKind::Pattern),
                    subscribe: true,
                } => kind,
                _ => continue,
            };
            if let Some(name) = crate::protocol::reply::element(frame, 1)
                && let Some(confirmed) = self.of(kind).get_mut(name)
            {
                *confirmed = true;
            }
        }
    }

    /// Every name held, to subscribe on a new connection.
    pub(in crate::session) fn all(&self) -> Subscriptions {
        Subscriptions {
            channels: self.channels.keys().cloned().collect(),
            patterns: self.patterns.keys().cloned().collect(),
        }
    }
}

/// Locks the names; a poisoned lock still holds consistent sets (each critical section is
/// one insert, remove or lookup loop that cannot leave them half-changed).
pub(in crate::session) fn lock(names: &Mutex<Names>) -> MutexGuard<'_, Names> {
    names.lock().unwrap_or_else(|e| e.into_inner())
}

/// A session's notification names and the extra connections listening for them.
#[derive(Default)]
pub(in crate::session) struct KeyspaceSubs {
    /// The names, shared with the filters of the extra connections (`filtered`): a delivery
    /// passes only while its name is here and confirmed.
    pub(in crate::session) names: Arc<Mutex<Names>>,
    /// One connection per primary other than the home node (a handful: looked up by a scan).
    pub(in crate::session) conns: Vec<NodeConn>,
    /// Source of the connections' ids (under `KEYSPACE_CONN`), to know which one ended.
    pub(in crate::session) next_id: u64,
    /// Until when to keep trying to listen on every primary again after an extra connection
    /// ended: a failover promotes a replica meanwhile, and the map learns it. `None`: done.
    pub(in crate::session) retry_until: Option<tokio::time::Instant>,
    /// A retry wake-up is on its way: one at a time.
    pub(in crate::session) retry_scheduled: bool,
    /// The RESP version the extra connections speak (the client's when they were opened):
    /// after a HELLO that changed the client's they are opened again, as their pushes go to
    /// the client as they are.
    pub(in crate::session) proto: u8,
}

impl KeyspaceSubs {
    /// Where the commands of each extra connection go; each is logged in as the client
    /// when it has its own login (`login`), so a new login goes on them too.
    pub(in crate::session) fn conns(
        &self,
    ) -> impl Iterator<Item = &tokio::sync::mpsc::Sender<crate::upstream::Batch>> {
        self.conns.iter().map(|c| &c.tx)
    }
}

impl Drop for KeyspaceSubs {
    /// Whatever drops the state (RESET, the last unsubscribe, the session's end), the filters
    /// stop at once, before the connections' ends reach Redis.
    fn drop(&mut self) {
        *lock(&self.names) = Names::default();
    }
}

/// A session's tracking: one connection per primary.
pub(in crate::session) struct ClusterTracking {
    /// One connection per primary of the map, tracking turned on there.
    pub(in crate::session) conns: Vec<NodeConn>,
    /// The session's commands for a node go over its connection here (`conn_for`): in the
    /// default mode Redis tracks the keys each connection reads, and with NOLOOP only the
    /// tracking connection's own writes are left out.
    pub(in crate::session) carries: bool,
    /// REDIRECT: the proxy id of the client the invalidations go to (each node's connection
    /// names that client's connection there). The session's commands then take the tracking
    /// connections whatever its RESP version, and the connections follow its HELLO.
    pub(in crate::session) redirect: Option<u64>,
    /// The RESP version the connections speak.
    pub(in crate::session) proto: u8,
    /// A `CLIENT CACHING` Redis took and no command has followed yet: `CACHING_YES` or
    /// `CACHING_NO` (0: none). It is on every node's connection, and applies to the next
    /// command only: that command's placement clears it on the other nodes
    /// (`caching_next`). Atomic so placement, which borrows the session, can note it.
    pub(in crate::session) caching: AtomicU8,
    /// The map's generation the connections were last checked against: a new map may name
    /// a primary without one. Atomic only so the check can note it from `&self` (placement).
    pub(in crate::session) checked: AtomicU64,
}

/// Which connection a session's command for a node takes, as tracking or the client's own
/// login decides it.
pub(in crate::session) enum OwnConn<'a> {
    /// Not decided by tracking: the node's shared connection, or a dedicated one.
    Any,
    /// The session's own connection to the node: its tracking connection (default-mode
    /// tracking) or its login connection (`login`).
    Own(&'a NodeConn),
    /// Own connections, and none to the node (a primary the map gained): nothing may be
    /// read there untracked, nor as the proxy's user.
    Missing,
}

impl ClusterTracking {
    /// Where the commands of each tracking connection go (a new login of the client goes on
    /// them too: `login`).
    pub(in crate::session) fn conns(&self) -> impl Iterator<Item = &mpsc::Sender<Batch>> {
        self.conns.iter().map(|c| &c.tx)
    }

    /// Whether the session's commands go over the tracking connections (see `carries`).
    pub(in crate::session) fn carries(&self) -> bool {
        self.carries
    }

    /// Which connection a command for `node` takes (see `OwnConn`), in either protocol:
    /// Redis tracks what a RESP2 connection reads too, and sends the invalidations once it
    /// speaks RESP3 (the connections follow the client's HELLO: `own_conns_follow_proto`).
    pub(in crate::session) fn conn_for(&self, node: u16) -> OwnConn<'_> {
        if !self.carries {
            return OwnConn::Any;
        }
        match self.conns.iter().find(|c| c.node == node) {
            Some(c) => OwnConn::Own(c),
            None => OwnConn::Missing,
        }
    }

    /// Whether `tx` is one of the tracking connections (the session's dedicated connection
    /// borrowed one, default mode).
    pub(in crate::session) fn holds(&self, tx: &mpsc::Sender<Batch>) -> bool {
        self.conns.iter().any(|c| c.tx.same_channel(tx))
    }
}

/// A RESP3 client's connections that only listen for invalidations redirected to it, one
/// per primary where it had none (see `listen_everywhere`).
#[derive(Default)]
pub(in crate::session) struct Listeners {
    /// The connections, each mapped as the client's listener on its node (`client_ids`).
    pub(in crate::session) conns: Vec<NodeConn>,
    /// Source of their ids (under `LISTENER_CONN`), to know which one ended.
    pub(in crate::session) next_id: u64,
}

/// Queues `HELLO proto` on each of `conns` (speaking `spoken`, now `proto`) without waiting
/// for its reply; `false` when one could not take it. Nothing when they already speak it.
pub(in crate::session) fn follow_proto(conns: &[NodeConn], spoken: &mut u8, proto: u8) -> bool {
    if *spoken == proto {
        return true;
    }
    *spoken = proto;
    let hello = hello_command(proto);
    conns.iter().all(|conn| unanswered(&conn.tx, hello.clone()))
}

/// A session's own login: one connection per primary, each logged in as the client's user.
pub(in crate::session) struct ClusterLogin {
    /// One connection per primary of the map.
    pub(in crate::session) conns: Vec<NodeConn>,
    /// The RESP version the connections speak (they follow the client's HELLO).
    pub(in crate::session) proto: u8,
    /// The map's generation the connections were last checked against: a new map may name
    /// a primary without one. Atomic only so the check can note it from `&self` (placement).
    pub(in crate::session) checked: AtomicU64,
    /// The last login every node accepted: sent again on each connection the session
    /// opens to a node (`log_in_as_client`), as a client library logs in again on a new
    /// connection. Held for the session's life, as the client holds it.
    pub(in crate::session) replay: Login,
}

impl ClusterLogin {
    /// After a HELLO: the connections speak `proto` (see `own_conns_follow_proto`); `false`
    /// when one could not take it.
    pub(in crate::session) fn follow_proto(&mut self, proto: u8) -> bool {
        follow_proto(&self.conns, &mut self.proto, proto)
    }

    /// The connection a command for `node` takes.
    pub(in crate::session) fn conn_for(&self, node: u16) -> OwnConn<'_> {
        match self.conns.iter().find(|c| c.node == node) {
            Some(c) => OwnConn::Own(c),
            None => OwnConn::Missing,
        }
    }
}

/// The session's MONITOR on the primaries other than its home node.
pub(in crate::session) struct ClusterMonitor {
    /// One connection per other primary, in MONITOR mode.
    pub(in crate::session) conns: Vec<NodeConn>,
    /// The gate of every extra connection: opened when the home node's `+OK` is seen,
    /// closed when the client's RESET goes (`monitor_stops`).
    pub(in crate::session) open: Arc<Mutex<bool>>,
}

/// The transaction open on the session's dedicated connection, as its replies show it.
#[derive(Default)]
pub(in crate::session) struct TxLog {
    /// MULTI's reply has come back and EXEC's or DISCARD's has not: commands are being
    /// queued.
    pub(super) open: bool,
    /// The commands queued so far, as sent (the policy's hidden commands included), to
    /// send again if the transaction must move.
    pub(super) queued: Vec<Bytes>,
    /// The first redirection a queued command got: the node holding the transaction will
    /// abort it, and the replay goes where this says.
    pub(super) again: Option<Again>,
}

/// A `ssubscribe` / `sunsubscribe` confirmation in the client's RESP version; `channel`
/// `None` is the nil of an unsubscribe with nothing to unsubscribe.
pub(in crate::session) fn confirmation(
    proto: u8,
    kind: &str,
    channel: Option<&[u8]>,
    count: usize,
) -> Bytes {
    let mut out = BytesMut::with_capacity(32 + channel.map_or(0, <[u8]>::len));
    out.extend_from_slice(if proto == 3 { b">3\r\n" } else { b"*3\r\n" });
    out.extend_from_slice(format!("${}\r\n{kind}\r\n", kind.len()).as_bytes());
    match channel {
        Some(c) => {
            out.extend_from_slice(format!("${}\r\n", c.len()).as_bytes());
            out.extend_from_slice(c);
            out.extend_from_slice(b"\r\n");
        }
        None if proto == 3 => out.extend_from_slice(b"_\r\n"),
        None => out.extend_from_slice(b"$-1\r\n"),
    }
    out.extend_from_slice(format!(":{count}\r\n").as_bytes());
    out.freeze()
}

impl ClusterState {
    /// Whether `frame`, a push from connection `conn`, is a flush's null the client already
    /// has (`FlushNews`); `mark` gives where it would go in the reply order.
    pub(in crate::session) fn repeated_flush(
        &mut self,
        frame: &[u8],
        conn: u64,
        mark: impl FnOnce() -> u64,
    ) -> bool {
        if frame != super::flush_news::FLUSHED {
            return false;
        }
        let source = self.node_of_conn(conn).map_or(conn, |node| {
            super::flush_news::NODE_SOURCE | u64::from(node)
        });
        !self
            .flush_news
            .get_or_insert_with(Box::default)
            .pass(source, mark())
    }

    /// The node of the session's own connection `conn` that may carry invalidations (a
    /// tracking connection, a listener, a subscriber's on another primary).
    fn node_of_conn(&self, conn: u64) -> Option<u16> {
        let tracking = self.tracking.iter().flat_map(|t| t.conns.iter());
        let listeners = self.listeners.iter().flat_map(|l| l.conns.iter());
        let keyspace = self.keyspace.iter().flat_map(|k| k.conns.iter());
        tracking
            .chain(listeners)
            .chain(keyspace)
            .find(|c| c.id == conn)
            .map(|c| c.node)
    }
}

#[cfg(test)]
mod spare_tests {
    use super::*;
    use crate::session::conn::InTransaction;
    use crate::upstream::ReplyWait;

    fn sent(bytes: Bytes, hash_slots: Vec<u16>) -> Sent {
        Sent {
            bytes,
            proto: 2,
            node: 0,
            dedicated: false,
            redirects: 0,
            wait: ReplyWait::Prompt,
            hash_slots,
            transaction: InTransaction::No,
        }
    }

    #[test]
    fn an_answered_batch_lends_its_record_and_slots_to_the_next() {
        let mut spare = Spare::default();
        let slots = vec![1u16, 2, 3];
        let slots_at = slots.as_ptr();
        let bytes = Bytes::from(vec![7u8; 64]);
        let watch = bytes.clone();
        let record = Box::new(sent(bytes, slots));
        let record_at: *const Sent = &*record;
        spare.keep(record);
        assert!(spare.holds());
        // The bytes are not kept: the caller's clone is the only reference left.
        assert!(watch.is_unique());

        let reused = spare.slots(16);
        assert!(reused.is_empty(), "handed out empty");
        assert_eq!(reused.as_ptr(), slots_at, "the same allocation");
        let boxed = spare.boxed(sent(Bytes::new(), Vec::new()));
        assert_eq!(&*boxed as *const Sent, record_at, "the same record");
        assert!(!spare.holds());
        // Nothing kept: fresh ones.
        assert!(spare.slots(16).capacity() >= 16);
    }

    #[test]
    fn at_most_spare_kept_of_each() {
        let mut spare = Spare::default();
        for _ in 0..SPARE_KEPT + 3 {
            spare.keep(Box::new(sent(Bytes::new(), vec![1])));
        }
        assert_eq!(spare.slots.len(), SPARE_KEPT);
        assert_eq!(spare.sent.len(), SPARE_KEPT);
        // A record without hash slots lends no vector.
        let mut empty = Spare::default();
        empty.keep(Box::new(sent(Bytes::new(), Vec::new())));
        assert!(empty.slots.is_empty());
    }
}
