//! What the cluster is asked to carry out, as decided by `place`: the plans `Action` holds
//! (`Gather`, `Spread`, `Prepare`) and their payloads. Data only: the files named in each
//! variant carry them out, so this file is below them and below `Action`.

use super::merge::{Join, Merge};
use crate::policy::rewrite::Strip;
use crate::protocol::codec;
use crate::protocol::reply::SubKind;
use crate::session::client_ids::ClientIds;
use crate::session::effect::{Effect, InfoEdit};
use crate::upstream::ReplyWait;
use bytes::{Bytes, BytesMut};

/// A cluster command the session answers itself, after every earlier command has run:
/// from several nodes (their replies gathered into one), or from its own state.
pub(in crate::session) enum Gather {
    /// A whole-keyspace command sent to every primary, the replies merged.
    Fanout(Fanout),
    /// A multi-key command split by slot, the parts' replies joined; or a set read across
    /// slots (SUNION…), its keys' members gathered and combined.
    Split(Split),
    /// One step of a SCAN over every primary.
    Scan(Scan),
    /// SORT with `BY`/`GET` patterns: the elements, their weights and values read from
    /// their nodes, sorted here (see `sort`).
    Sort(SortGather),
    /// SSUBSCRIBE/SUNSUBSCRIBE, answered over the per-node pub/sub connections (see
    /// `shard_subs`).
    ShardPubSub(ShardCommand),
    /// CLIENT TRACKING in broadcasting mode, answered over a tracking connection per
    /// primary (see `tracking`).
    Tracking(TrackingCommand),
    /// The client's own login (AUTH, HELLO AUTH), sent on a connection per primary (see
    /// `login`).
    Login(LoginCommand),
}

/// A forwarded command whose effect each primary has for itself only (it publishes its own
/// keys' notifications, shows its own commands): done on every other primary first, then
/// the command is forwarded as decided (`action::Spreading::then`).
pub(in crate::session) enum Spread {
    /// A classic (un)subscription of keyspace notifications (`keyspace`).
    Keyspace(KeyspaceSpread),
    /// MONITOR (`monitor`).
    Monitor(MonitorSpread),
}

/// What the session's own connections must do before a command can be placed: the map
/// changed under them. Carried out once nothing is in flight, then the command is decided
/// again (`ClusterSession::prepare`, reached through `Session::prepare`).
pub(in crate::session) enum Prepare {
    /// The client's own login has no connection to this primary, which the map gained (a
    /// failover, a new node): logged in there too (`login`).
    LoginJoin(u16),
}

impl Prepare {
    /// The client's reply (its connection then closes) when the command still needs this
    /// right after it was carried out: the map changed again meanwhile.
    pub(in crate::session) fn unmet(&self) -> Bytes {
        match self {
            Prepare::LoginJoin(_) => crate::protocol::answers::own_login_lost("a new primary"),
        }
    }
}

impl Gather {
    /// SSUBSCRIBE/SUNSUBSCRIBE: its confirmations reach the client even with CLIENT REPLY OFF
    /// or SKIP, as Redis pushes them like messages.
    pub(in crate::session) fn confirms_subscriptions(&self) -> bool {
        matches!(self, Gather::ShardPubSub(_))
    }

    /// XREAD … BLOCK of streams in several slots (`Split::then_block`): it may answer in its
    /// reply slot later (`blocking_read`), not at once as every other gather does.
    pub(in crate::session) fn blocks(&self) -> bool {
        matches!(self, Gather::Split(split) if split.then_block.is_some())
    }
}

/// A whole-keyspace command to send to every primary.
pub(in crate::session) struct Fanout {
    /// The command as it is sent (after the policy's rewrite).
    pub(super) bytes: Bytes,
    /// How the replies are combined.
    pub(super) merge: Merge,
    /// The namespace prefix to strip from the merged reply (a namespaced tenant's KEYS).
    pub(super) strip: Option<Box<Strip>>,
    /// INFO: what of the merged reply the proxy changes (`replies::info_as_seen`).
    pub(super) info: Option<InfoEdit>,
    /// WAIT/WAITAOF: each node gets it on a connection of its own (it blocks) after the
    /// `WAIT_BARRIER`, whose reply is dropped.
    pub(super) blocking: bool,
    /// How long WAIT may block (its own timeout), so the command timeout leaves it be.
    pub(super) wait: ReplyWait,
    /// CLIENT PAUSE's or UNPAUSE's effect, applied as the fan-out is sent (as a forwarded
    /// one's is): while a pause is in force the session sends what it holds back on
    /// dedicated connections (`route::around_pause`), so it holds only its own client.
    pub(super) pause: Option<Effect>,
    /// CONFIG SET of `slowlog-max-len`: the value set (`None`: one the proxy cannot read),
    /// for the router to learn once the primaries answer (`Router::learn_slowlog_max_len`).
    pub(super) sets_slowlog_max_len: Option<Option<u64>>,
    /// CONFIG SET of a node's own parameters beside shared ones: the whole command, for the
    /// node keyless commands go to, sent first; `bytes` (the shared ones) go to the others
    /// once it took it, as one server applies all or nothing.
    pub(super) home_first: Option<Bytes>,
}

/// One SCAN call across the cluster's primaries (the composite cursor: `merge::scan_position`).
pub(in crate::session) struct Scan {
    /// The client's composite cursor.
    pub(super) cursor: u64,
    /// MATCH/COUNT/TYPE as sent (MATCH already namespaced by the policy).
    pub(super) options: Vec<Bytes>,
    /// The tenant's namespace prefix, removed from the returned names.
    pub(super) strip: Option<Box<Strip>>,
}

/// A multi-key command whose keys are in several slots, as one sub-command per slot (or,
/// for a set read, one `SMEMBERS` per key).
pub(in crate::session) struct Split {
    /// Per node: the batch sent there (its sub-commands, then the policy's hidden commands
    /// for its keys) and, per sub-command, the positions of its keys in the client's command.
    pub(super) batches: Vec<NodeBatch>,
    /// How the parts' replies are joined.
    pub(super) join: Join,
    /// Keys in the client's command (MGET's reply length; a set command's keys, repeats
    /// included).
    pub(super) keys: usize,
    /// The namespace prefix to remove from the joined reply: a namespaced tenant's XREAD,
    /// whose reply names its streams.
    pub(super) strip: Option<Box<Strip>>,
    /// XREAD with BLOCK: what blocks when the split read (without BLOCK) found no entry
    /// (`blocking_read`).
    pub(super) then_block: Option<Box<BlockingRead>>,
}

/// At most this many slots block at once for one XREAD (`BlockingRead`): each is a
/// connection, counted against the client's tenant; past it the command gets CROSSSLOT.
pub(super) const MAX_BLOCKING_SLOTS: usize = 16;

/// XREAD … BLOCK of streams in several slots, once a read without BLOCK found no entry:
/// one `XREAD [COUNT n] BLOCK ms STREAMS …` per slot, each on a connection of its own, the
/// first reply with entries (or error) the client's (`blocking_read`).
pub(in crate::session) struct BlockingRead {
    /// Per slot of the streams: the slot's node and the command for its streams, encoded.
    pub(super) groups: Vec<(u16, Bytes)>,
    /// How long the command may block (its BLOCK), so the command timeout leaves it be.
    pub(super) wait: ReplyWait,
}

/// What one node gets of a split command.
pub(in crate::session) struct NodeBatch {
    /// The node.
    pub(super) node: u16,
    /// Sub-commands followed by hidden commands, encoded.
    pub(super) bytes: BytesMut,
    /// For each sub-command, the client-order positions of its keys; hidden commands come
    /// after them in the batch and their replies are dropped.
    pub(super) parts: Vec<Vec<usize>>,
    /// Hidden commands in the batch.
    pub(super) hidden: usize,
}

/// A SORT the proxy answers by gathering (module comment).
#[derive(Debug, PartialEq)]
pub(in crate::session) struct SortGather {
    /// The first step, for the sorted key's node: `SORT key` with the options as Redis
    /// ends up reading them (`BY nosort` for a constant BY, the last LIMIT, DESC, ALPHA) but
    /// the GETs, or `SORT key BY nosort` when `by` sorts; its LIMIT cut to one element past
    /// what `MAX_LOOKUPS` allows.
    pub(super) first: Bytes,
    /// The sorted key, whose node answers `first`.
    pub(super) key: Bytes,
    /// The `BY` pattern that sorts the elements (`None`: the node sorted them).
    pub(super) by: Option<Bytes>,
    /// The `GET` patterns, in order.
    pub(super) gets: Vec<Bytes>,
    /// DESC.
    pub(super) desc: bool,
    /// ALPHA.
    pub(super) alpha: bool,
    /// LIMIT offset and count as given (the last LIMIT counts).
    pub(super) limit: Option<(i64, i64)>,
}

/// A sharded pub/sub command the session answers itself (see the module comment).
pub(in crate::session) enum ShardCommand {
    /// `SSUBSCRIBE` of channels (as named upstream) that all hash to `slot`.
    Subscribe { channels: Vec<Bytes>, slot: u16 },
    /// `SUNSUBSCRIBE` of these channels; every shard channel when empty.
    Unsubscribe { channels: Vec<Bytes> },
}

/// A tracking command the session answers over the tracking connections.
pub(in crate::session) enum TrackingCommand {
    /// `CLIENT TRACKING ON …` while off: every primary gets a connection and the command (as
    /// it goes upstream); `carries`: as `ClusterTracking::carries`.
    Start {
        command: Bytes,
        carries: bool,
        /// A namespaced tenant's: its prefix taken out of an error quoting the prefixes.
        unquote: Option<Box<Strip>>,
        /// REDIRECT: the client named, and where its id is in the command.
        redirect: Option<Box<Redirect>>,
    },
    /// A tracking command while on (more prefixes, TRACKINGINFO, GETREDIR, CACHING): sent to
    /// every tracking connection (`all`) or the first; the first reply is the client's.
    Ask {
        command: Bytes,
        all: bool,
        /// As `Start`'s.
        unquote: Option<Box<Strip>>,
    },
    /// `CLIENT TRACKING ON …` while on, naming a redirect or none: sent to every tracking
    /// connection (with a REDIRECT, naming its client's connection on each node); once every
    /// node took it, the session's redirect is the one it names (Redis sets none without
    /// REDIRECT).
    Again {
        command: Bytes,
        redirect: Option<Box<Redirect>>,
        /// Whether its options need the session's commands on the tracking connections
        /// (NOLOOP): they then do from now on.
        carries: bool,
        /// As `Start`'s.
        unquote: Option<Box<Strip>>,
    },
    /// `CLIENT CACHING yes|no`: sent to every tracking connection, as the next command may
    /// go to any node; once Redis took it, the next command's placement clears it on the
    /// others (`caching_next`). `yes`: the argument is YES.
    Caching { command: Bytes, yes: bool },
    /// `CLIENT TRACKING OFF`: the connections close, which turns tracking off on each node.
    Stop,
    /// Tracking cannot hold any more (a primary without a tracking connection): this error,
    /// and the session ends after it, as its cache may hold values whose invalidation it
    /// cannot get.
    Lost(Bytes),
}

/// A client's login command: `AUTH …` or `HELLO … AUTH …`, as sent.
#[derive(Clone)]
pub(in crate::session) struct Login {
    /// The command's bytes.
    pub(super) command: Bytes,
    /// A HELLO's protocol version; `None` for AUTH.
    pub(super) hello: Option<u8>,
}

impl Login {
    /// A HELLO's options as Redis runs them (an error after its AUTH still logs in).
    pub(in crate::session) fn options(&self) -> Option<crate::commands::grammar::HelloOptions> {
        self.hello
            .map(|_| crate::commands::grammar::hello_options(&self.command))
    }
}

/// What the session does for a login in cluster mode, instead of forwarding it.
pub(in crate::session) enum LoginCommand {
    /// The login, to send on every primary.
    Login(Login),
    /// The map gained a primary without a login connection: this error, and the client is
    /// disconnected.
    Lost(Bytes),
}

/// A classic (un)subscription naming keyspace notifications, spread to the other primaries
/// before the command goes to the home connection as decided.
pub(in crate::session) struct KeyspaceSpread {
    /// Channels or patterns.
    pub(super) kind: SubKind,
    /// For a subscription, the home node (whose own notifications the home connection
    /// hears); `None` for an unsubscription.
    pub(super) home: Option<u16>,
    /// The names concerned, as named upstream; for an unsubscription, none means all.
    pub(super) names: Vec<Bytes>,
}

/// A MONITOR to spread to the other primaries before the MONITOR goes to the home node.
pub(in crate::session) struct MonitorSpread {
    /// The home node, whose own commands the dedicated connection's MONITOR shows.
    pub(super) home: u16,
}

/// `CLIENT TRACKING ON … REDIRECT <id>` spread over every primary: on each, the command names
/// the named client's connection there (its dedicated connection on its own node, its
/// listener on the others: `client_ids`).
pub(in crate::session) struct Redirect {
    /// The proxy's id of the client named.
    pub(super) client: u64,
    /// The client lacks a connection on some primary and speaks RESP3: it is asked to open
    /// them first (`summon`, `listen_everywhere`).
    pub(super) summon: bool,
    /// The command's arguments as the client sent them.
    pub(super) args: Vec<Bytes>,
    /// Index of the REDIRECT id among them.
    pub(super) at: usize,
}

impl Redirect {
    /// The command for `node`, naming the client's connection there; `None` when it has
    /// none (it ended since): Redis's answer for a client that is not there.
    pub(in crate::session) fn command_for(&self, ids: &ClientIds, node: u16) -> Option<Bytes> {
        let upstream = ids.on_node(self.client, node)?.to_string();
        let mut parts: Vec<&[u8]> = self.args.iter().map(|a| &a[..]).collect();
        parts[self.at] = upstream.as_bytes();
        Some(codec::encode(&parts))
    }
}
