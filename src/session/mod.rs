//! One client connection: read requests, decide where each goes, and write replies in request
//! order.
//!
//! Consecutive commands bound for the same upstream connection are forwarded as one batch: a
//! zero-copy slice of the read buffer, one channel message, one upstream write. Commands the
//! proxy answers itself (HELLO, CLIENT SETNAME, QUIT…) take a slot in the reply order like any
//! other. A session whose state lives on an upstream connection (MULTI, WATCH, subscriptions,
//! SELECT n, AUTH as another user…) gets a dedicated connection; switching between shared and
//! dedicated waits until the other side has answered everything, so commands still run in the
//! order the client sent them.

mod audited;
mod client_ids;
mod client_list;
mod cluster;
mod pause;
mod proxy_commands;
mod replica_reads;
mod replies;
mod route;
mod routing;
mod scatter;
mod spread;

use crate::answers;
use routing::Routing;
pub use routing::Upstreams;

use replies::{apply_mask, filter_exec, with_client_id};

use std::collections::VecDeque;
use std::io::IoSlice;
use std::ops::Range;
use std::sync::Arc;
use tokio::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc};

use crate::codec::{self, CodecLimits, Decoded};
use crate::command::{self, ClientSub, Kind};
use crate::commands::CommandSpec;
use crate::error::{ClientError, ProxyError, UpstreamError, error_reply};
use crate::metrics::CommandOutcome;
use crate::policy::{Client, Policy, Verdict};
use crate::reply::SubKind;
use crate::upstream::conn::PushTarget;
use crate::upstream::pool::Pool;
use crate::upstream::{Batch, Expect, Reply, ReplyWait};
use arc_swap::ArcSwap;

/// What every session shares: the upstream pool, limits and the shutdown signal.
pub struct Context {
    /// Shared and dedicated upstream connections; in cluster mode, the pool of one primary,
    /// used for what is not about one node (HELLO replies, the rate limiter's connection).
    pub pool: Arc<Pool>,
    /// The kind of upstream: standalone, Sentinel (with its replicas) or cluster (its router).
    pub upstreams: Upstreams,
    /// Request framing limits.
    pub codec: CodecLimits,
    /// Unanswered commands per client before the proxy stops reading it.
    pub max_inflight: usize,
    /// Unparsed request bytes per client before it is refused.
    pub max_query_buffer: usize,
    /// Credentials the upstream pool logs in with; a client AUTH with the same ones needs no
    /// dedicated connection.
    pub upstream_user: Option<String>,
    /// See `upstream_user`.
    pub upstream_password: Option<String>,
    /// Scripts (EVAL…, FCALL…) run on the session's dedicated connection rather than the
    /// shared one (`upstream.scripts_on_dedicated`, see `Kind::Script`).
    pub scripts_dedicated: bool,
    /// Which upstream connection each client id names (`CLIENT UNBLOCK`, `KILL ID`,
    /// `REDIRECT`).
    pub client_ids: Arc<client_ids::ClientIds>,
    /// Every client's row for `CLIENT LIST`.
    pub client_list: Arc<client_list::ClientList>,
    /// The `CLIENT PAUSE` in force, as forwarded through this proxy.
    pub pause: Arc<pause::Pause>,
    /// Set when the proxy drains for shutdown; `idle_tick` is notified right after, so
    /// sessions asleep notice at once and sessions awake see the flag on their next turn.
    pub stopping: std::sync::atomic::AtomicBool,
    /// Notified every `IDLE_TICK` by the server: a session that saw no traffic for a whole
    /// tick gives back its reply channel and spare buffers (see `Session::release_idle`).
    /// One process-wide signal instead of a timer per session, which would cost a timer-wheel
    /// update per request; shutdown rides on it too, so a session waits on one future for
    /// both (a watch channel's would add 136 bytes to every client's task).
    pub idle_tick: tokio::sync::Notify,
    /// The rules every command is checked against before it is routed; swapped whole on
    /// reload.
    pub policy: Arc<ArcSwap<Policy>>,
    /// Metrics, slow log and reload, shared with the admin endpoint and `PROXY` commands.
    pub ops: crate::ops::Ops,
}

/// How often idle sessions are asked to give memory back; a session is released after one to
/// two ticks without traffic.
pub const IDLE_TICK: std::time::Duration = std::time::Duration::from_secs(2);
/// Bytes of push frames (pub/sub messages) a session may hold unwritten.
const PUSH_BUDGET: u32 = 4 * 1024 * 1024;
/// Read buffer headroom requested before each read.
const READ_CHUNK: usize = 16 * 1024;
/// Most batches a cluster session may have in flight: below the 65,536 values of a 16-bit
/// `seq`, so a reply's `seq` names one batch. `max_inflight` (commands, at least one per
/// batch) is capped to it in cluster mode.
pub const SEQ_WINDOW: usize = 32 * 1024;

/// Which upstream connection a command goes to. The second field is the node (an index
/// from the cluster router; for a standalone or Sentinel upstream 0 is the primary and 1… the
/// Sentinel replicas of `upstream::replicas`). A change of target waits until the other
/// target has answered everything, except between shared connections of a cluster: replies
/// are then matched by `seq` and only a command whose hash slot is in flight on another
/// connection waits (see `spread`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The shared connection for this RESP version, on this node.
    Shared(u8, u16),
    /// The session's dedicated connection, to this node.
    Dedicated(u16),
}

/// A reply position in the client's stream.
enum Slot {
    /// A reply the proxy made, written once everything before it is written.
    Local(Bytes),
    /// `commands` replies coming from upstream as one `Reply::Batch`; dropped unwritten when
    /// the client switched replies off. `read_at` (when the batch's bytes were read) and
    /// `name` (its first command) feed the latency histogram and the slow log.
    Upstream {
        commands: u32,
        handling: Handling,
        read_at: Instant,
        name: Option<&'static CommandSpec>,
        /// Cluster mode, shared connections: what was sent and where, so commands answered
        /// with MOVED or ASK can be sent again to the right node.
        sent: Option<Box<Sent>>,
        /// The batch's `seq`, which its reply echoes: in cluster mode replies from different
        /// nodes come in any order and are put in their slot by it.
        seq: u16,
        /// Slots the batch's replies fill: 1 for most; on the first slot of a scattered
        /// cluster batch, how many segments it has (the others have 0; see `scatter`).
        parts: u16,
    },
}

/// A batch sent to a cluster node, kept (a refcounted slice, not a copy) until its replies
/// are in.
struct Sent {
    /// The batch's bytes as sent.
    bytes: Bytes,
    /// The RESP version of the connection it went over.
    proto: u8,
    /// The node it went to.
    node: u16,
    /// Sent on the session's dedicated connection (a blocking command): a redirection is
    /// followed on a dedicated connection to the new node, never on a shared one it would
    /// block.
    dedicated: bool,
    /// Redirections followed so far for this batch (dedicated only; shared batches follow
    /// theirs in one go).
    redirects: u32,
    /// How long the command may block, kept for the batch sent again after a redirection.
    wait: ReplyWait,
    /// The hash slots of the batch's keyed commands (one entry per command), counted in the
    /// session's `spread` until the replies are in.
    hash_slots: Vec<u16>,
    /// Part of a transaction: a redirection inside it means the whole transaction moves.
    transaction: cluster::InTransaction,
}

/// Commands of a batch as sent, as slices of its bytes (empty lines left out; a client's
/// inline command, forwarded as it came, counts like any other). Stops at bytes that are not
/// a whole command, which a batch the proxy built never holds.
fn split_commands(bytes: &Bytes, limits: &CodecLimits) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut ranges = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        match codec::decode(&bytes[pos..], limits, &mut ranges) {
            Ok(Some(Decoded::Empty { len })) => pos += len,
            Ok(Some(decoded)) => {
                out.push(bytes.slice(pos..pos + decoded.len()));
                pos += decoded.len();
            }
            _ => break,
        }
    }
    out
}

/// How the replies of one upstream slot are treated.
#[derive(Debug, Clone, Default)]
struct Handling {
    /// Dropped unwritten: the client switched replies off (CLIENT REPLY OFF/SKIP).
    suppress: bool,
    /// A blocking command that may never answer: if the client goes away, the dedicated
    /// connection is closed to unblock it instead of waiting.
    blocking: bool,
    /// How long the upstream may legitimately stay silent before answering: the blocking
    /// command's own timeout, so the command timeout does not cut it short.
    wait: ReplyWait,
    /// Which reply frames of the batch the client sees (`None`: all). The others answer
    /// commands the proxy added: TTL PEXPIREs, WAIT's barrier, the HELLO after a raw AUTH.
    mask: Option<Vec<bool>>,
    /// A classic UNSUBSCRIBE/PUNSUBSCRIBE: when its last confirmation counts 0 in cluster
    /// mode, the session holds no subscription any more and is released from its dedicated
    /// connection (it could otherwise reach only the node it subscribed on).
    unsubscribe: bool,
    /// CLIENT INFO: rewrite the reply to describe this client.
    client_info: bool,
    /// CLIENT GETREDIR/TRACKINGINFO: the redirect connection's id made its client's.
    names_redirect: bool,
    /// INFO: append the proxy's section to the upstream's text.
    info: bool,
    /// EXEC of a transaction with hidden commands queued: which elements of EXEC's array the
    /// client sees.
    exec_mask: Option<Vec<bool>>,
    /// Answer this instead of the upstream's reply (EXECABORT for a DISCARDed EXEC).
    replace: Option<Bytes>,
    /// Remove the tenant's namespace prefix from key names in the reply (SCAN, KEYS).
    strip: Option<Box<crate::policy::rewrite::Strip>>,
}

/// Sent before WAIT/WAITAOF on a dedicated connection when the client's writes went over the
/// shared one. WAIT counts acknowledgements of the *connection's* last propagated write; a
/// PUBLISH is propagated to replicas without touching the keyspace, so after it the dedicated
/// connection's offset covers every earlier write of this client (the session waited for those
/// to be answered before switching connections).
const WAIT_BARRIER: &[u8] =
    b"*3\r\n$7\r\nPUBLISH\r\n$27\r\n__redis-policy-proxy__:wait\r\n$0\r\n\r\n";

/// CLIENT REPLY state, kept by the proxy because upstream connections are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplyMode {
    On,
    Off,
    /// Drop the reply of the next command only.
    Skip,
}

/// State changes a command makes once it is actually dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    None,
    Multi,
    EndMulti,
    Watch,
    Unwatch,
    /// SUBSCRIBE-family: the dedicated connection holds subscriptions of this kind.
    Subscribe(SubKind),
    /// UNSUBSCRIBE-family: once the confirmations count none left, classic subscriptions
    /// stop pinning the session (see `Handling::unsubscribe`).
    Unsubscribe(SubKind),
    Select(i64),
    Auth,
    /// HELLO with AUTH: authenticates and switches RESP version.
    AuthHello(u8),
    Hello(u8),
    Monitor,
    ConnectionState,
    /// No state change, but the command may block for as long as it says (see
    /// `Handling::blocking`).
    Blocking(ReplyWait),
    /// WAIT/WAITAOF: blocking, and it must count the client's earlier writes (see
    /// `WAIT_BARRIER`).
    Wait(ReplyWait),
    /// CLIENT INFO: the reply describes the upstream connection; rewrite it to describe the
    /// client (id, name, addresses).
    ClientInfo,
    /// INFO asking for the default sections (or `proxy`): append the `# Proxy` section.
    Info,
    /// EXEC of a transaction in which the policy refused a command: DISCARD it upstream and
    /// answer EXECABORT, as Redis does after a command rejected at queue time.
    AbortExec,
    /// CLIENT PAUSE for this long (ms): what it holds back is routed around (`pause`).
    Pause(pause::Paused, u64),
    /// CLIENT UNPAUSE.
    Unpause,
    /// CLIENT GETREDIR/TRACKINGINFO: the redirect id in the reply is made the client's.
    NamesRedirect,
}

/// What to do with one command.
enum Action {
    Forward {
        target: Target,
        expect: Expect,
        effect: Effect,
    },
    Local(Bytes, LocalEffect),
    /// Reply, then close once everything before it is written (QUIT).
    LocalThenClose(Bytes),
    /// No reply at all: CLIENT REPLY OFF/SKIP, which sets this mode.
    Silent(ReplyMode),
    /// RESET: needs everything in flight answered first.
    Reset,
    /// The policy refused the command: answer with this error (and spoil an open MULTI).
    Refused(Bytes),
    /// Forward, but as the policy rewrote it (TTL added or cut).
    Rewritten {
        target: Target,
        expect: Expect,
        effect: Effect,
        rewrite: crate::policy::rewrite::Rewrite,
    },
    /// Cluster mode: a command answered from several nodes, or by the session itself (see
    /// `cluster::Gather`).
    Gather(Box<cluster::Gather>),
    /// HELLO answered by the proxy: the upstream's reply with this client's id; `login` is
    /// the proxy user its AUTH option authenticated.
    Hello {
        proto: u8,
        name: Option<Bytes>,
        login: Option<Bytes>,
    },
}

/// What `decide` made of one command: the action, and in cluster mode the hash slot its keys
/// hash to (`None`: keyless, or not a cluster), which orders it against the slot's other
/// commands in flight (`spread`) and binds an open transaction to one slot.
struct Decision {
    /// What to do with the command.
    action: Action,
    /// The command's hash slot, found while placing it on a node.
    hash_slot: Option<u16>,
}

impl From<Action> for Decision {
    fn from(action: Action) -> Decision {
        Decision {
            action,
            hash_slot: None,
        }
    }
}

/// One decoded command, looked up once: where it ends in the read buffer, its command-table
/// entry and what it means for routing.
struct Command {
    /// Its bytes in the read buffer, after the current run's.
    len: usize,
    /// Its entry in the command table (`None`: unknown to Redis 7).
    spec: Option<&'static CommandSpec>,
    /// Its routing and session-state kind.
    kind: Kind,
    /// Its audit entry and keyspace measurement so far, when either follows it (`audited`).
    audit: audited::Slot,
}

/// Whether `process` goes on to the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// The command was dispatched (or answered): decode the next one.
    Next,
    /// Stop reading requests for now: paused, waiting for replies, or closing.
    Stop,
}

/// A forwarded command as it goes upstream (see `Session::outgoing`).
struct Outgoing {
    /// The bytes sent.
    bytes: Bytes,
    /// One entry per reply frame the bytes produce: whether the client sees it.
    frames: Vec<bool>,
    /// What an open transaction queues (hidden commands included), before a deferred MULTI
    /// joined the frames; `None` when the client sees every frame.
    queued: Option<Vec<bool>>,
    /// The reply the client gets instead of Redis's (EXECABORT for a spoiled EXEC).
    replace: Option<Bytes>,
    /// The namespace prefix to remove from the reply's key names.
    strip: Option<Box<crate::policy::rewrite::Strip>>,
}

/// What `Session::on_command_now` did with a command.
enum Now {
    /// Carried out without waiting.
    Done(Flow),
    /// Decided, to be carried out by `on_command`, which may wait.
    Later(Pending),
}

/// A decided command `process` must wait for (see `Session::on_command`).
struct Pending {
    /// The command.
    command: Command,
    /// What `decide` made of it.
    decision: Decision,
}

/// How a decided command is carried out.
enum Dispatch {
    /// With the current run of plain commands.
    Join(Joining),
    /// On its own, once the run is sent.
    Alone(Action),
}

/// A forwarded command that joins the current run.
struct Joining {
    /// Where it goes.
    target: Target,
    /// The state it changes once dispatched.
    effect: Effect,
    /// The policy's rewrite, if any.
    rewrite: Option<crate::policy::rewrite::Rewrite>,
}

impl Joining {
    /// Whether the policy added hidden commands around it (their replies are masked).
    fn hidden(&self) -> bool {
        self.rewrite
            .as_ref()
            .is_some_and(|r| !r.after.is_empty() || !r.before().is_empty())
    }

    /// The action it was made from.
    fn into_action(self) -> Action {
        match self.rewrite {
            None => Action::Forward {
                target: self.target,
                expect: Expect::Frames(1),
                effect: self.effect,
            },
            Some(rewrite) => Action::Rewritten {
                target: self.target,
                expect: Expect::Frames(1),
                effect: self.effect,
                rewrite,
            },
        }
    }
}

/// Session state changed by a command the proxy answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LocalEffect {
    None,
    SetName(Option<Bytes>),
    ReplyMode(ReplyMode),
    /// AUTH accepted by the proxy: the session is now this user (and its tenant).
    Login(Bytes),
    /// Cluster mode: MULTI answered by the proxy, sent later with the first queued command.
    DeferMulti,
    /// Cluster mode: EXEC or DISCARD of a MULTI that was never sent (nothing queued).
    EndMulti,
}

/// The dedicated upstream connection of a session.
struct Dedicated {
    /// Where to send commands.
    tx: mpsc::Sender<Batch>,
    /// RESP version the connection speaks now; a mismatch means reconnecting before reuse.
    proto: u8,
    /// The node it is connected to (0 for a standalone upstream).
    node: u16,
    /// Maps the client's id to this connection while it lives (see `client_ids`).
    _id: Option<client_ids::Registration>,
}

/// A run of consecutive commands forwarded together: the first `len` bytes of the read buffer,
/// sent as they are (zero copy) or, once the policy rewrote one of them, copied into `owned`.
#[derive(Default)]
struct Run {
    /// Bytes of the read buffer the run has consumed.
    len: usize,
    /// Reply frames the run's bytes produce (client commands plus hidden ones).
    frames: u32,
    /// The connection the run goes to; `None` while empty.
    target: Option<Target>,
    /// The bytes to send when they differ from the read buffer (a rewritten command).
    owned: Option<BytesMut>,
    /// Which frames the client sees, once a hidden command joined the run.
    mask: Option<Vec<bool>>,
    /// The run's first command, for the slow log.
    first: Option<&'static CommandSpec>,
    /// Cluster mode: the hash slots of the run's keyed commands, for `Sent::hash_slots`.
    hash_slots: Vec<u16>,
    /// Cluster mode, once parked (see `scatter`): the batch's `seq`, taken when its first
    /// segment got its slot.
    seq: Option<u16>,
    /// Where its first segment's slot is in `Session::slots` (stable while runs are
    /// pending: nothing leaves the reply order during `process`).
    head: Option<usize>,
    /// Frames already given a segment slot.
    cut: u32,
}

impl Run {
    /// Adds a command that is forwarded as the client sent it: `bytes` are the next bytes of
    /// the read buffer.
    fn push_plain(&mut self, bytes: &[u8], target: Target) {
        if let Some(owned) = &mut self.owned {
            owned.extend_from_slice(bytes);
        }
        if let Some(mask) = &mut self.mask {
            mask.push(true);
        }
        self.len += bytes.len();
        self.frames += 1;
        self.target = Some(target);
    }

    /// Adds a command the policy rewrote; `consumed` are its bytes in the read buffer and
    /// `prefix` the run's bytes so far (copied once, when the first rewrite joins), and
    /// `capacity_hint` how many bytes may still follow.
    fn push_rewritten(
        &mut self,
        prefix: &[u8],
        consumed: &[u8],
        capacity_hint: usize,
        rewrite: &crate::policy::rewrite::Rewrite,
        target: Target,
    ) {
        let owned = self.owned.get_or_insert_with(|| {
            // Room for the rest of the read buffer and its appended TTLs, so a pipeline of
            // rewritten SETs grows the buffer once, not by doubling.
            let mut owned = BytesMut::with_capacity(prefix.len() + capacity_hint);
            owned.extend_from_slice(prefix);
            owned
        });
        for c in rewrite.before() {
            owned.extend_from_slice(c);
        }
        match (&rewrite.command, &rewrite.append) {
            (Some(command), _) => owned.extend_from_slice(command),
            (None, Some(extra)) => {
                if !extra.extend_frame(consumed, owned) {
                    owned.extend_from_slice(consumed);
                }
            }
            (None, None) => owned.extend_from_slice(consumed),
        }
        for c in &rewrite.after {
            owned.extend_from_slice(c);
        }
        let hidden = rewrite.before().len() + rewrite.after.len();
        if hidden > 0 || self.mask.is_some() {
            let frames = self.frames as usize;
            let mask = self.mask.get_or_insert_with(|| vec![true; frames]);
            mask.extend(std::iter::repeat_n(false, rewrite.before().len()));
            mask.push(true);
            mask.extend(std::iter::repeat_n(false, rewrite.after.len()));
        }
        self.len += consumed.len();
        self.frames += 1 + hidden as u32;
        self.target = Some(target);
    }
}

/// One client connection, in parts with one job each: what the client negotiated
/// (`client`), the upstream connection state it holds (`conn`), the ordered reply stream
/// (`queue`) and the request bytes being read (`input`); mode-specific state (cluster) beside
/// them.
struct Session {
    /// Everything sessions share: pools, router, limits, policy, metrics.
    ctx: Arc<Context>,
    /// What the client negotiated and who it is.
    client: ClientState,
    /// The dedicated upstream connection and the state the client holds on it.
    conn: ConnState,
    /// The reply stream, in request order.
    queue: ReplyQueue,
    /// Request bytes read and not yet dispatched, and whether to read more.
    input: Input,
    /// The upstream mode and what only that mode keeps per session.
    routing: Routing,
    /// This client's row in `CLIENT LIST`, removed when the session ends.
    _listed: client_list::Listed,
    /// Audited and sampled commands waiting for their replies (`audited`); boxed, made on
    /// the first.
    audit_trail: Option<Box<crate::audit::Trail>>,
}

/// What the client negotiated and who it is: the connection's identity as Redis would see it.
struct ClientState {
    /// Proxy-assigned id, answered to CLIENT ID and used to pick the shared connection.
    id: u64,
    /// The client's address, for CLIENT INFO and per-address rate limits.
    peer: std::net::SocketAddr,
    /// The proxy's address the client connected to, for CLIENT INFO.
    local: std::net::SocketAddr,
    /// The policy this batch of commands is checked against: loaded once per read, so a
    /// reload applies from the next read on and in-flight commands keep the policy they were
    /// checked with.
    policy: Arc<Policy>,
    /// The proxy user the client authenticated as (proxy-side users only).
    user: Option<Bytes>,
    /// The client's tenant under `policy`, recomputed when the policy is reloaded.
    tenant: u16,
    /// RESP version the client negotiated with HELLO.
    proto: u8,
    /// Database selected on the dedicated connection; non-zero keeps the session there.
    db: i64,
    /// CLIENT SETNAME value, answered by CLIENT GETNAME.
    name: Option<Bytes>,
    /// CLIENT REPLY state, kept by the proxy because upstream connections are shared.
    reply_mode: ReplyMode,
}

/// The session's dedicated upstream connection and the state the client built on it.
#[derive(Default)]
struct ConnState {
    /// The dedicated connection, kept for reuse while the session lives (blocking commands
    /// use it without pinning the session).
    dedicated: Option<Dedicated>,
    /// Id of the latest dedicated connection, to ignore the end of older ones.
    dedicated_gen: u64,
    /// The open MULTI, if any.
    multi: Option<Transaction>,
    /// A WATCH could not be established (no dedicated connection): the next transaction must
    /// abort, since the keys it relies on were not watched. Cleared by UNWATCH, EXEC, DISCARD
    /// and RESET.
    watch_lost: bool,
    /// State held on the dedicated connection, each of which pins the session to it.
    held: Holds,
}

/// An open MULTI.
#[derive(Default)]
struct Transaction {
    /// Cluster mode: MULTI was answered by the proxy and not sent yet, because the node it
    /// must run on is the owner of the first queued command's keys (see `docs/cluster.md`).
    deferred: bool,
    /// The policy refused a command inside it (or a WATCH before it was lost): EXEC must
    /// abort.
    refused: bool,
    /// MULTI itself could not be sent (no dedicated connection): nothing is queued upstream,
    /// so the proxy answers every command up to EXEC/DISCARD itself and runs none of them.
    unopened: bool,
    /// For each command queued (hidden ones included), whether the client sees its result:
    /// the mask applied to EXEC's reply.
    mask: Vec<bool>,
}

/// Connection state that lives on the dedicated upstream connection; any of it keeps the
/// session there (a set, because they combine: WATCH with tracking, a RESP3 subscriber in a
/// transaction…).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Holds(u8);

impl Holds {
    /// WATCH is in force.
    const WATCH: Holds = Holds(1);
    /// SUBSCRIBE/PSUBSCRIBE channels or patterns are held.
    const SUBSCRIPTIONS: Holds = Holds(2);
    /// The connection is in MONITOR mode.
    const MONITOR: Holds = Holds(4);
    /// CLIENT TRACKING/CACHING/NO-EVICT/NO-TOUCH was set.
    const CLIENT_MODE: Holds = Holds(8);
    /// Authenticated upstream as a user other than the pool's.
    const OTHER_USER: Holds = Holds(16);
    /// SSUBSCRIBE was sent on it (standalone): a classic UNSUBSCRIBE counting none left
    /// does not release the connection then, since its count omits shard channels.
    const SHARD_SUBSCRIPTIONS: Holds = Holds(32);

    fn insert(&mut self, h: Holds) {
        self.0 |= h.0;
    }

    fn remove(&mut self, h: Holds) {
        self.0 &= !h.0;
    }

    fn contains(self, h: Holds) -> bool {
        self.0 & h.0 != 0
    }

    fn any(self) -> bool {
        self.0 != 0
    }

    /// Whether anything but `h` is held.
    fn other_than(self, h: Holds) -> bool {
        self.0 & !h.0 != 0
    }
}

impl ConnState {
    /// Whether `h` is held on the dedicated connection.
    fn holds(&self, h: Holds) -> bool {
        self.held.contains(h)
    }

    /// Whether MULTI is open (sent or deferred).
    fn in_multi(&self) -> bool {
        self.multi.is_some()
    }

    /// Cluster mode: MULTI is open but not sent yet.
    fn multi_deferred(&self) -> bool {
        self.multi.as_ref().is_some_and(|m| m.deferred)
    }

    /// The policy refused a command in the open MULTI.
    fn multi_refused(&self) -> bool {
        self.multi.as_ref().is_some_and(|m| m.refused)
    }

    /// The open MULTI was never sent upstream (see `Transaction::unopened`).
    fn multi_unopened(&self) -> bool {
        self.multi.as_ref().is_some_and(|m| m.unopened)
    }
}

/// The ordered reply stream: every command's place in it, what is in flight, and the bytes
/// ready to write.
#[derive(Default)]
struct ReplyQueue {
    /// Reply order: proxy-made replies waiting behind upstream ones.
    slots: VecDeque<Slot>,
    /// Upstream commands not yet answered.
    inflight: usize,
    /// Where the latest batch went while commands are in flight (`None`: nothing in flight).
    /// Standalone, and whenever a dedicated connection is involved, every in-flight command
    /// went there.
    inflight_target: Option<Target>,
    /// `seq` of the next batch sent on the session's reply channel.
    next_seq: u16,
    /// The channel every upstream connection answers this session on.
    /// Created with the first upstream command, so an idle client costs no channel.
    reply_tx: Option<mpsc::UnboundedSender<Reply>>,
    /// The receiving end of a channel just created, for `serve` to take.
    new_reply_rx: Option<mpsc::UnboundedReceiver<Reply>>,
    /// Budget of unwritten push bytes, shared with the dedicated connection.
    /// Created with the first dedicated connection: most clients never get a push.
    push_budget: Option<Arc<Semaphore>>,
    /// Replies ready to write.
    out: Vec<Bytes>,
    /// Push permits to return once `out` is written.
    out_permits: u32,
}

/// Request bytes read from the client and not yet dispatched, and whether to read more.
struct Input {
    /// Unparsed request bytes.
    rbuf: BytesMut,
    /// Argument ranges of the command being classified, reused to avoid allocation.
    args: Vec<Range<usize>>,
    /// When the bytes being processed were read: the start of client-observed latency.
    read_at: Instant,
    /// No more requests are read; the session ends when replies are written.
    closing: bool,
    /// Request processing paused until in-flight commands on the other target are answered.
    paused: bool,
    /// Traffic since the last idle tick: only a session quiet for a whole tick releases its
    /// memory, so a busy client never pays for re-creating its reply channel.
    active: bool,
    /// The command (or first of the run) the next `send` carries, for the slow log.
    batch_name: Option<&'static CommandSpec>,
}

/// Serves one client until it disconnects, QUITs, breaks the protocol or the proxy shuts down.
pub async fn serve(mut stream: TcpStream, ctx: Arc<Context>, id: u64) {
    let _ = stream.set_nodelay(true);
    let mut reply_rx: Option<mpsc::UnboundedReceiver<Reply>> = None;
    // The idle tick is read through its own handle: `s` is borrowed mutably by the handlers.
    let ticks = ctx.clone();
    let mut s = Session::new(&stream, ctx, id);
    let (mut rd, mut wr) = stream.split();
    // The tick is waited on by a future kept across iterations: made anew in each `select!`,
    // it would join and leave the notifier's waiter list (a lock each time) on every
    // wake-up, 4% of the proxy's CPU at `-P 1` (with the shutdown watch it replaced).
    let tick = ticks.idle_tick.notified();
    tokio::pin!(tick);
    // A `Notified` sees every `notify_waiters` after its creation; one before it set the flag
    // first, so looking at the flag now leaves no gap.
    s.note_stopping(&ticks);
    loop {
        if !s.queue.out.is_empty() && !s.write_out(&mut wr).await {
            break;
        }
        if s.input.closing && s.queue.inflight == 0 && s.queue.slots.is_empty() {
            break;
        }
        if let Some(rx) = s.queue.new_reply_rx.take() {
            reply_rx = Some(rx);
        }
        let can_read = !s.input.closing && !s.input.paused && s.queue.inflight < s.ctx.max_inflight;
        tokio::select! {
            biased;
            msg = recv(&mut reply_rx) => {
                let Some(msg) = msg else { break };
                s.on_messages(msg, &mut reply_rx).await;
            }
            // Wait for readability before touching the buffer: an idle client holds no read
            // buffer at all (see `release_idle`).
            ready = rd.readable(), if can_read => s.on_readable(ready, &mut rd).await,
            _ = tick.as_mut(), if !s.input.closing || s.holds_idle_memory() => {
                tick.set(ticks.idle_tick.notified());
                s.note_stopping(&ticks);
                if s.on_idle_tick(reply_rx.as_ref()) {
                    reply_rx = None;
                }
            }
        }
    }
    let _ = wr.shutdown().await;
}

impl Session {
    /// A session for the client on `stream`, with nothing negotiated yet.
    fn new(stream: &TcpStream, ctx: Arc<Context>, id: u64) -> Session {
        let unknown = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
        let peer = stream.peer_addr().unwrap_or(unknown);
        let policy = ctx.policy.load_full();
        let tenant = policy.access.tenant_of(peer.ip(), None);
        let local = stream.local_addr().unwrap_or(unknown);
        Session {
            _listed: ctx.client_list.join(id, peer, local),
            routing: Routing::new(&ctx.upstreams, ctx.pool.epoch()),
            client: ClientState {
                id,
                peer,
                local,
                policy,
                user: None,
                tenant,
                proto: 2,
                db: 0,
                name: None,
                reply_mode: ReplyMode::On,
            },
            ctx,
            conn: ConnState::default(),
            queue: ReplyQueue::default(),
            input: Input {
                rbuf: BytesMut::new(),
                args: Vec::new(),
                read_at: Instant::now(),
                closing: false,
                paused: false,
                active: false,
                batch_name: None,
            },
            audit_trail: None,
        }
    }

    /// Starts closing when the proxy drains for shutdown (`ctx` is the session's context,
    /// through the handle `serve` keeps for the tick).
    fn note_stopping(&mut self, ctx: &Context) {
        if ctx.stopping.load(std::sync::atomic::Ordering::Acquire) {
            self.input.closing = true;
        }
    }

    /// Writes the replies ready in `queue.out` and gives their push bytes back to the
    /// budget; `false` when the client's socket failed.
    async fn write_out(&mut self, wr: &mut tokio::net::tcp::WriteHalf<'_>) -> bool {
        let bytes: usize = self.queue.out.iter().map(Bytes::len).sum();
        if write_all(wr, &mut self.queue.out).await.is_err() {
            return false;
        }
        self.ctx.ops.metrics.bytes_out.inc_by(bytes as u64);
        if self.queue.out_permits > 0 {
            if let Some(budget) = &self.queue.push_budget {
                budget.add_permits(self.queue.out_permits as usize);
            }
            self.queue.out_permits = 0;
        }
        true
    }

    /// Handles `msg` and every other message already waiting on the reply channel, then
    /// resumes reading the requests that waited for them.
    async fn on_messages(
        &mut self,
        msg: Reply,
        reply_rx: &mut Option<mpsc::UnboundedReceiver<Reply>>,
    ) {
        self.input.active = true;
        self.on_message(msg).await;
        while let Some(msg) = reply_rx.as_mut().and_then(|rx| rx.try_recv().ok()) {
            self.on_message(msg).await;
        }
        if self.queue.inflight == 0 {
            self.input.paused = false;
            if let Some(spread) = self.routing.spread_mut() {
                spread.clear_wait();
            }
        } else if self.input.paused && self.routing.spread_mut().is_some_and(|sp| sp.resumable()) {
            // Only the slot the paused command waits for had to be answered.
            self.input.paused = false;
        }
        if !self.input.paused
            && !self.input.rbuf.is_empty()
            && self.queue.inflight < self.ctx.max_inflight
        {
            Box::pin(self.process()).await;
        }
    }

    /// One message from an upstream connection: what the mode does with it first (resend a
    /// failed replica's reads, follow a redirection), then its place in the reply order.
    async fn on_message(&mut self, mut msg: Reply) {
        // Boxed: rare, and large enough to matter in every idle session's task.
        if self.routing.replicas().is_some() {
            Box::pin(self.resend_failed_replica_reads(&mut msg)).await;
        }
        let resent = self.routing.is_cluster() && Box::pin(self.follow_redirects(&mut msg)).await;
        if !resent {
            self.on_reply(msg);
        }
    }

    /// The client's socket is readable (`ready`): reads what it holds and processes it.
    async fn on_readable(
        &mut self,
        ready: std::io::Result<()>,
        rd: &mut tokio::net::tcp::ReadHalf<'_>,
    ) {
        if ready.is_err() {
            self.input.closing = true;
            return;
        }
        if self.input.rbuf.capacity() - self.input.rbuf.len() < READ_CHUNK / 4 {
            self.input.rbuf.reserve(READ_CHUNK);
        }
        match read_now(rd, &mut self.input.rbuf).await {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Readiness can be stale (edge-triggered events already consumed by an
                // earlier read): a client that never sent anything must not keep the buffer
                // just reserved for it.
                if !self.input.active && self.input.rbuf.is_empty() {
                    self.input.rbuf = BytesMut::new();
                }
            }
            Ok(0) | Err(_) => {
                // Half-closed: answer what was already sent, then close. A blocked command
                // would never answer; like Redis dropping a client on EOF, close its
                // dedicated connection, which unblocks it upstream.
                self.input.closing = true;
                let blocked = self.queue.slots.iter().any(
                    |slot| matches!(slot, Slot::Upstream { handling, .. } if handling.blocking),
                );
                if blocked {
                    self.conn.dedicated = None;
                }
            }
            Ok(n) => {
                self.input.read_at = Instant::now();
                self.input.active = true;
                self.ctx.ops.metrics.bytes_in.inc_by(n as u64);
                // Boxed, one allocation per read: processing needs the largest future of the
                // session, and inline it would sit in every idle client's task.
                Box::pin(self.process()).await;
            }
        }
    }

    /// The process-wide idle tick: a session quiet for a whole tick gives its memory back.
    /// `true` when its reply channel was dropped, so `serve` drops the receiving end too.
    fn on_idle_tick(&mut self, reply_rx: Option<&mpsc::UnboundedReceiver<Reply>>) -> bool {
        let released =
            !self.input.active && reply_rx.is_none_or(|rx| rx.is_empty()) && self.release_idle();
        self.input.active = false;
        released
    }
}

/// Reads what the socket holds, without waiting: `WouldBlock` when nothing is there. Goes
/// through `AsyncRead::poll_read` rather than `try_read_buf` because tokio's `poll_read`
/// clears the socket's readiness when a read does not fill the buffer (the kernel had no
/// more): the next wait then goes straight to epoll instead of a `recvfrom` that fails with
/// EAGAIN, which was one wasted syscall per request at `-P 1` (strace: 101,054 `recvfrom`
/// for 50,000 GETs, half of them EAGAIN).
async fn read_now(
    rd: &mut tokio::net::tcp::ReadHalf<'_>,
    buf: &mut BytesMut,
) -> std::io::Result<usize> {
    let mut read = std::pin::pin!(rd.read_buf(buf));
    std::future::poll_fn(|cx| match read.as_mut().poll(cx) {
        std::task::Poll::Pending => {
            std::task::Poll::Ready(Err(std::io::ErrorKind::WouldBlock.into()))
        }
        ready => ready,
    })
    .await
}

/// Queues a batch for an upstream connection. The queue is rarely full, so the waiting send
/// (its future holds the batch and a semaphore waiter) is boxed: inline, it would sit in every
/// session's task state for the rare case.
async fn enqueue(
    tx: &mpsc::Sender<Batch>,
    batch: Batch,
) -> Result<(), mpsc::error::SendError<Batch>> {
    match tx.try_send(batch) {
        Ok(()) => Ok(()),
        Err(mpsc::error::TrySendError::Closed(batch)) => Err(mpsc::error::SendError(batch)),
        Err(mpsc::error::TrySendError::Full(batch)) => Box::pin(tx.send(batch)).await,
    }
}

/// The next reply, or never when no channel exists yet.
async fn recv(rx: &mut Option<mpsc::UnboundedReceiver<Reply>>) -> Option<Reply> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Writes every buffer with vectored writes, so many small replies cost one syscall. The
/// slice array is built on the stack inside each poll, never held across an await: it would
/// otherwise add 1 KiB to every session's task, idle or not.
async fn write_all(
    wr: &mut tokio::net::tcp::WriteHalf<'_>,
    out: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    const MAX_SLICES: usize = 64;
    let mut first = 0;
    while first < out.len() {
        let mut n = std::future::poll_fn(|cx| {
            let pending = &out[first..];
            if pending.len() == 1 {
                return std::pin::Pin::new(&mut *wr).poll_write(cx, &pending[0]);
            }
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let count = pending.len().min(MAX_SLICES);
            for (slot, b) in slices.iter_mut().zip(pending) {
                *slot = IoSlice::new(b);
            }
            std::pin::Pin::new(&mut *wr).poll_write_vectored(cx, &slices[..count])
        })
        .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let head = &mut out[first];
            if n >= head.len() {
                n -= head.len();
                first += 1;
            } else {
                head.advance(n);
                n = 0;
            }
        }
    }
    out.clear();
    Ok(())
}

impl Action {
    /// Where a forwarded command goes, its effect and the policy's rewrite; `None` for the
    /// actions the proxy answers or handles itself.
    fn forwarded(&self) -> Option<(Target, Effect, Option<&crate::policy::rewrite::Rewrite>)> {
        match self {
            Action::Forward { target, effect, .. } => Some((*target, *effect, None)),
            Action::Rewritten {
                target,
                effect,
                rewrite,
                ..
            } => Some((*target, *effect, Some(rewrite))),
            _ => None,
        }
    }

    /// The same action sent to `target` instead (cluster placement, replica reads); other
    /// actions have no target and stay as they are.
    fn retarget(self, target: Target) -> Action {
        match self.forwarded() {
            Some((_, effect, _)) => self.rerouted(target, effect),
            None => self,
        }
    }

    /// The same forwarded command sent to `target` with `effect` instead (a write held back by
    /// CLIENT PAUSE goes to the dedicated connection as a blocking command); other actions
    /// stay as they are.
    fn rerouted(self, target: Target, effect: Effect) -> Action {
        match self {
            Action::Forward { expect, .. } => Action::Forward {
                target,
                expect,
                effect,
            },
            Action::Rewritten {
                expect, rewrite, ..
            } => Action::Rewritten {
                target,
                expect,
                effect,
                rewrite,
            },
            other => other,
        }
    }
}

impl Effect {
    /// Whether a command with this effect may join a run of plain commands; the others need
    /// `execute` (extra commands, a raw connection, or the blocking mark).
    fn batchable(self) -> bool {
        !matches!(
            self,
            Effect::Blocking(_)
                | Effect::Wait(_)
                | Effect::Auth
                | Effect::AuthHello(_)
                | Effect::ClientInfo
                | Effect::Info
                | Effect::AbortExec
                | Effect::EndMulti
                | Effect::Unsubscribe(_)
                | Effect::NamesRedirect
        )
    }
}

impl ReplyQueue {
    /// Takes the slot at `at` out of the reply order (the head is removed, a later one left
    /// as an empty placeholder until its reply is in).
    fn take(&mut self, at: Option<usize>) -> Option<Slot> {
        match at {
            Some(0) => self.slots.pop_front(),
            Some(i) => Some(std::mem::replace(
                &mut self.slots[i],
                Slot::Local(Bytes::new()),
            )),
            None => None,
        }
    }

    /// The replies pushed to `out` from `mark` on answer the slot at `at`: written now when
    /// it heads the reply order (with the proxy-made replies behind it), else kept in its
    /// slot until the earlier ones are in.
    fn settle(&mut self, at: usize, mark: usize) {
        if at == 0 {
            self.flush_local_slots();
            return;
        }
        let mut own = self.out.split_off(mark);
        let reply = match own.len() {
            1 => own.pop().unwrap_or_default(),
            _ => own.concat().into(),
        };
        self.slots[at] = Slot::Local(reply);
    }

    /// The budget of unwritten push bytes shared with dedicated connections, created on
    /// first use.
    fn push_budget(&mut self) -> Arc<Semaphore> {
        self.push_budget
            .get_or_insert_with(|| Arc::new(Semaphore::new(PUSH_BUDGET as usize)))
            .clone()
    }
    /// The session's reply channel, created on first use.
    fn reply_sender(&mut self) -> mpsc::UnboundedSender<Reply> {
        match &self.reply_tx {
            Some(tx) => tx.clone(),
            None => {
                let (tx, rx) = mpsc::unbounded_channel();
                self.reply_tx = Some(tx.clone());
                self.new_reply_rx = Some(rx);
                tx
            }
        }
    }
    /// Moves proxy-made replies at the head of the order to the output.
    fn flush_local_slots(&mut self) {
        while let Some(Slot::Local(_)) = self.slots.front() {
            if let Some(Slot::Local(b)) = self.slots.pop_front()
                && !b.is_empty()
            {
                self.out.push(b);
            }
        }
    }
    /// The position of the slot a reply with this `seq` answers.
    fn slot_of(&self, seq: u16) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| matches!(s, Slot::Upstream { seq: q, .. } if *q == seq))
    }
    /// Queues a proxy-made reply in order.
    fn local(&mut self, reply: Bytes) {
        if self.slots.is_empty() {
            self.out.push(reply);
        } else {
            self.slots.push_back(Slot::Local(reply));
        }
    }
}

impl Session {
    /// The policy's Redis-counted rate limits for the command being decided, run on the
    /// control connection of the upstream (any primary in cluster mode).
    async fn shared_limits(&self, command: &str) -> Option<Bytes> {
        let client = Client {
            id: self.client.id,
            addr: self.client.peer.ip(),
            tenant: self.client.tenant,
        };
        let transport = || match self.routing.router() {
            None => self.ctx.pool.control(),
            Some(router) => crate::upstream::pool::Control::cluster(router.clone()),
        };
        let policy = self.client.policy.clone();
        policy
            .check_shared_limits(&client, command, transport)
            .await
    }

    /// Sets the authenticated proxy user (`None`: anonymous) and the tenant that follows.
    fn login(&mut self, user: Option<Bytes>) {
        self.ctx
            .client_list
            .update(self.client.id, |r| r.user = user.clone());
        self.client.user = user;
        self.client.tenant = self
            .client
            .policy
            .access
            .tenant_of(self.client.peer.ip(), self.client.user.as_deref());
    }

    /// Whether an idle tick could give anything back: a reply channel or spare capacity.
    fn holds_idle_memory(&self) -> bool {
        self.queue.reply_tx.is_some()
            || self.input.rbuf.capacity() > 0
            || self.queue.out.capacity() > 0
            || self.input.args.capacity() > 0
            || self.queue.slots.capacity() > 0
    }

    /// Gives back what a quiet client does not need: the read buffer (16 KiB), the reply
    /// channel (its first block alone is 32 replies) and the capacity of the per-request
    /// vectors, all re-created on the next request. A busy client keeps them: its read buffer
    /// is reused in place once the upstream has dropped the batches that shared it, so a read
    /// costs no allocation. Only when nothing is owed: no command in flight, no reply waiting, no
    /// dedicated connection (it holds a sender of the channel for its pushes). Returns whether
    /// the channel was dropped, so the caller drops its receiving end too.
    fn release_idle(&mut self) -> bool {
        if self.queue.inflight != 0
            || !self.queue.slots.is_empty()
            || self.conn.dedicated.is_some()
            || self.routing.shard_subs().is_some()
        {
            return false;
        }
        if !self.queue.out.is_empty() || !self.input.rbuf.is_empty() || self.conn.in_multi() {
            return false;
        }
        self.input.rbuf = BytesMut::new();
        self.queue.out = Vec::new();
        self.input.args = Vec::new();
        self.queue.slots = VecDeque::new();
        self.queue.new_reply_rx = None;
        self.queue.reply_tx.take().is_some()
    }

    /// Handles one message from an upstream connection.
    fn on_reply(&mut self, msg: Reply) {
        match msg {
            Reply::Batch {
                data,
                missing,
                error,
                seq,
            } => self.on_batch_reply(seq, data, missing, error),
            Reply::Push(frame, permits) => {
                // A namespaced subscriber sees channel names without its prefix.
                let frame = match self.client.policy.access.namespace(self.client.tenant) {
                    Some(prefix) => crate::policy::namespace::strip_pubsub(prefix, &frame),
                    None => frame,
                };
                self.queue.out.push(frame);
                self.queue.out_permits += permits;
            }
            // Cluster sessions act on it before (`cluster::subscriber`); elsewhere the
            // `PinnedClosed` that follows ends the session.
            Reply::Subscriptions(..) => {}
            Reply::PinnedClosed(conn_id) => {
                if conn_id != self.conn.dedicated_gen {
                    return;
                }
                self.conn.dedicated = None;
                if self.stateful() {
                    // The state the client built on that connection is gone; like Redis
                    // closing the connection, end the session so the client starts over.
                    self.input.closing = true;
                }
            }
        }
    }

    /// The replies of the batch `seq`: shaped as its slot says, written if the slot heads the
    /// reply order, else kept in it until the earlier ones are in.
    fn on_batch_reply(
        &mut self,
        seq: u16,
        data: Bytes,
        missing: u32,
        error: Option<Box<UpstreamError>>,
    ) {
        // Standalone (and on one node) the reply answers the oldest slot; in cluster mode
        // another node's batch may be older and still unanswered.
        let at = self.queue.slot_of(seq);
        if let Some(i) = at
            && matches!(self.queue.slots[i], Slot::Upstream { parts, .. } if parts > 1)
        {
            self.on_parts(i, data, missing, error);
            return;
        }
        let Some(Slot::Upstream {
            commands,
            handling,
            read_at,
            name,
            sent,
            ..
        }) = self.queue.take(at)
        else {
            // Anything else is a bug we must not turn into a misattributed reply.
            tracing::error!(id = self.client.id, "upstream reply without a waiting slot");
            self.input.closing = true;
            return;
        };
        let at = at.unwrap_or(0);
        if let (Some(spread), Some(sent)) = (self.routing.spread_mut(), &sent) {
            spread.answered(&sent.hash_slots);
        }
        // Where this reply's output starts: kept in its slot if earlier ones are due.
        let mark = self.queue.out.len();
        self.queue.inflight -= commands as usize;
        if self.queue.inflight == 0 {
            self.queue.inflight_target = None;
        }
        if let (Some(router), Some(_)) = (self.routing.router(), &error) {
            // A node that failed may have been replaced (failover): learn it now rather than
            // at the next periodic refresh.
            router.refresh_soon();
        }
        self.observe(read_at, commands, name);
        self.audit_answered(read_at, commands, error.is_some(), data.len());
        let (data, missing) = match &handling.mask {
            None => (data, missing),
            Some(mask) => apply_mask(data, commands - missing, mask),
        };
        let data = match &error {
            None => self.shape_reply(&handling, data),
            Some(_) => data,
        };
        // Cluster mode only: there a pinned session reaches one node. Standalone, it keeps its
        // connection, and with it the identity Redis knows it by (a REDIRECT target that
        // unsubscribes, says HELLO 3 and subscribes again must stay the same connection).
        if handling.unsubscribe
            && self.routing.router().is_some()
            && error.is_none()
            && data.ends_with(b":0\r\n")
            && !self.conn.holds(Holds::SHARD_SUBSCRIPTIONS)
        {
            self.conn.held.remove(Holds::SUBSCRIPTIONS);
            self.list_flag('N');
        }
        if !handling.suppress {
            if !data.is_empty() {
                self.queue.out.push(data);
            }
            if let Some(e) = error {
                let reply = error_reply(&ProxyError::Upstream(*e));
                for _ in 0..missing {
                    self.queue.out.push(reply.clone());
                }
            }
        }
        self.queue.settle(at, mark);
    }

    /// A complete reply as the client sees it, per its slot's `handling`: replaced (EXECABORT),
    /// namespace stripped, EXEC's hidden results removed, CLIENT INFO made about the client,
    /// INFO with the proxy's section; as Redis sent it otherwise.
    fn shape_reply(&self, handling: &Handling, data: Bytes) -> Bytes {
        if let Some(r) = &handling.replace {
            r.clone()
        } else if let Some(strip) = &handling.strip {
            strip.apply(&data)
        } else if let Some(mask) = &handling.exec_mask {
            filter_exec(data, mask)
        } else if handling.client_info {
            self.rewrite_client_info(data)
        } else if handling.names_redirect {
            replies::map_redirect(data, |upstream| self.ctx.client_ids.client(upstream))
        } else if handling.info {
            replies::append_to_text(data, &self.proxy_info())
        } else {
            data
        }
    }

    /// Records the latency of an answered upstream batch: histogram, and slow log above its
    /// threshold.
    fn observe(&self, read_at: Instant, commands: u32, name: Option<&'static CommandSpec>) {
        let took = read_at.elapsed();
        let ops = &self.ctx.ops;
        ops.metrics
            .request_duration
            .observe_n(took, u64::from(commands));
        if ops.slowlog.is_slow(took) {
            ops.metrics.slow_commands.inc();
            let others = commands.saturating_sub(1);
            let name = name.map_or("(unknown)", |s| s.name);
            ops.slowlog.record(took, name, others, self.client.peer);
        }
    }

    /// Whether a command for `slot` (its hash slot, if keyed) must wait before going to
    /// `target`; when so, notes what it waits for. Standalone: any other target in flight.
    /// Cluster: between shared connections only a hash slot in flight on another one (its
    /// commands must run first, see `spread`); with a dedicated connection on either side,
    /// everything in flight, as standalone.
    fn blocked(&mut self, target: Target, slot: Option<u16>) -> bool {
        let Some(spread) = self.routing.spread_mut() else {
            return self
                .queue
                .inflight_target
                .is_some_and(|last| last != target);
        };
        if let Some(last) = self.queue.inflight_target {
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

    /// State held on the dedicated connection that keeps the session on it.
    fn stateful(&self) -> bool {
        self.conn.in_multi() || self.pinned()
    }

    /// State that ties the session to its dedicated connection's node: `stateful` except a
    /// MULTI the proxy has not sent yet.
    fn pinned(&self) -> bool {
        (self.conn.in_multi() && !self.conn.multi_deferred())
            || self.conn.held.any()
            || self.client.db != 0
    }

    /// A RESP3 client whose only state is its subscriptions: its other commands need not go
    /// on the connection that holds them (RESP3 lets a subscriber run any command, and the
    /// messages are pushes), so they take the shared path, and in cluster mode reach any
    /// node instead of only the one it subscribed on. RESP2 subscribers stay: Redis answers
    /// their PING in the subscriber's format and refuses other commands.
    fn resp3_subscriber_only(&self) -> bool {
        self.client.proto == 3
            && self.conn.holds(Holds::SUBSCRIPTIONS)
            && !self.conn.in_multi()
            && self.client.db == 0
            && !self
                .conn
                .held
                .other_than(Holds(Holds::SUBSCRIPTIONS.0 | Holds::SHARD_SUBSCRIPTIONS.0))
    }

    /// The dedicated connection as a target (in cluster mode `place` picks the node).
    fn dedicated_target(&self) -> Target {
        Target::Dedicated(self.conn.dedicated.as_ref().map_or(0, |d| d.node))
    }

    /// Where a command that has no routing needs of its own goes (in cluster mode the node
    /// is then chosen by `place`).
    fn current_target(&self) -> Target {
        if self.stateful() && !self.resp3_subscriber_only() {
            self.dedicated_target()
        } else {
            Target::Shared(self.client.proto, 0)
        }
    }

    /// Parses and dispatches every complete request in the read buffer, stopping early when
    /// order or backpressure requires waiting for replies.
    async fn process(&mut self) {
        self.follow_reload();
        let mut run = Run::default();
        while !self.input.closing {
            if self.queue.inflight + self.routing.parked_frames() + run.frames as usize
                >= self.ctx.max_inflight
            {
                break;
            }
            let Some(decoded) = self.next_request(&mut run).await else {
                break;
            };
            match decoded {
                Decoded::Empty { len } => {
                    // Redis ignores these; forwarding them with the run is harmless and keeps
                    // the run contiguous (a copied run simply leaves them out).
                    run.len += len;
                }
                Decoded::Command { len } => {
                    // Most commands join the run without waiting for anything: decided and
                    // added synchronously, so no future is built for them.
                    let flow = match self.on_command_now(&mut run, len) {
                        Now::Done(flow) => flow,
                        Now::Later(pending) => self.on_command(&mut run, pending).await,
                    };
                    if flow == Flow::Stop {
                        break;
                    }
                }
                Decoded::Inline { len, args } => {
                    // Replace the inline form by its RESP encoding in the buffer, then decode
                    // it like any command: the upstream runs exactly what was classified.
                    self.flush_run(&mut run).await;
                    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                    let mut resp = BytesMut::from(&codec::encode(&refs)[..]);
                    resp.extend_from_slice(&self.input.rbuf[len..]);
                    self.input.rbuf = resp;
                }
            }
        }
        self.flush_run(&mut run).await;
    }

    /// Picks up a reloaded policy: from the next read on, commands are checked against it,
    /// and the client's tenant is the one it maps to.
    fn follow_reload(&mut self) {
        let policy = self.ctx.policy.load_full();
        if !Arc::ptr_eq(&policy, &self.client.policy) {
            self.client.policy = policy;
            let user = self.client.user.take();
            self.login(user);
        }
    }

    /// The next complete request after the run's bytes; `None` when there is none yet, or
    /// when the client broke the protocol or filled its query buffer (answered, and the
    /// session closes).
    async fn next_request(&mut self, run: &mut Run) -> Option<Decoded> {
        let decoded = codec::decode(
            &self.input.rbuf[run.len..],
            &self.ctx.codec,
            &mut self.input.args,
        );
        let e = match decoded {
            Ok(Some(d)) => return Some(d),
            Ok(None) if self.input.rbuf.len() - run.len <= self.ctx.max_query_buffer => {
                return None;
            }
            Ok(None) => ClientError::QueryBufferFull {
                limit: self.ctx.max_query_buffer,
            },
            Err(e) => e.into(),
        };
        self.flush_run(run).await;
        self.queue.local(error_reply(&ProxyError::Client(e)));
        self.input.closing = true;
        None
    }

    /// Decides the command of `len` bytes after the run and, when that needs no waiting (it
    /// joins the run for the same shared connection, or another node's run in cluster mode),
    /// carries it out; otherwise hands the decided command to `on_command`, nothing changed.
    fn on_command_now(&mut self, run: &mut Run, len: usize) -> Now {
        let mut command = {
            let frame = &self.input.rbuf[run.len..run.len + len];
            let arg = |i: usize| self.input.args.get(i).map(|r| &frame[r.clone()]);
            let name = arg(0).unwrap_or_default();
            Command {
                len,
                spec: crate::commands::lookup(name, arg(1)),
                kind: command::classify(name),
                audit: audited::Slot::default(),
            }
        };
        let decision = self.decide(
            &self.input.rbuf[run.len..run.len + len],
            &command,
            run.target,
        );
        command.audit = self.audit_draft(&self.input.rbuf[run.len..], &command, &decision);
        if decision.action.forwarded().is_some() && self.client.policy.has_shared_limits() {
            return Now::Later(Pending { command, decision });
        }
        let Decision { action, hash_slot } = decision;
        self.note_multi_slot(&action, hash_slot);
        let join = match self.joinable(action) {
            Dispatch::Join(join) if self.joins_without_waiting(run, &join) => join,
            Dispatch::Join(join) => {
                return Now::Later(Pending {
                    command,
                    decision: Decision {
                        action: join.into_action(),
                        hash_slot,
                    },
                });
            }
            Dispatch::Alone(action) => {
                return Now::Later(Pending {
                    command,
                    decision: Decision { action, hash_slot },
                });
            }
        };
        if run.target.is_some_and(|t| t != join.target) {
            self.switch_run(run, join.target);
        }
        Now::Done(self.join_prepared(run, &command, hash_slot, join))
    }

    /// Carries out a decided command that may have to wait: for the Redis-counted rate limit,
    /// for the run to be sent first, for a dedicated connection, or for `execute`.
    async fn on_command(&mut self, run: &mut Run, pending: Pending) -> Flow {
        let Pending { command, decision } = pending;
        let Decision {
            mut action,
            hash_slot,
        } = decision;
        if action.forwarded().is_some() && self.client.policy.has_shared_limits() {
            let name = command.spec.map_or("-", |s| s.name);
            // Boxed: only policies with `backend: redis` limits get here.
            if let Some(refusal) = Box::pin(self.shared_limits(name)).await {
                action = Action::Refused(refusal);
            }
            self.note_multi_slot(&action, hash_slot);
        }
        match self.joinable(action) {
            Dispatch::Join(join) => self.join_run(run, &command, hash_slot, join).await,
            Dispatch::Alone(action) => self.dispatch_alone(run, &command, hash_slot, action).await,
        }
    }

    /// Cluster mode: an open transaction is bound to the hash slot of its first keyed command.
    fn note_multi_slot(&mut self, action: &Action, hash_slot: Option<u16>) {
        if self.conn.in_multi()
            && hash_slot.is_some()
            && action.forwarded().is_some()
            && let Some(c) = self.routing.cluster_mut()
        {
            c.multi_slot = c.multi_slot.or(hash_slot);
        }
    }

    /// Whether `join` can be added to the run without waiting: a shared connection, and the
    /// run either goes there too (and may take its hidden frames) or can be parked
    /// (`scatter`) instead of sent.
    fn joins_without_waiting(&self, run: &Run, join: &Joining) -> bool {
        let hidden = join.hidden();
        matches!(join.target, Target::Shared(..))
            && match run.target {
                Some(t) if t != join.target => self.may_scatter(run, join.target, hidden),
                _ => !(hidden && run.seq.is_some()),
            }
    }

    /// A forwarded command that may join the current run of plain commands (one reply frame,
    /// no effect needing `execute`, replies on, no deferred MULTI), as its target, effect and
    /// rewrite; the action back otherwise.
    fn joinable(&self, action: Action) -> Dispatch {
        let joins = |effect: Effect| {
            self.client.reply_mode == ReplyMode::On
                && effect.batchable()
                && !self.conn.multi_deferred()
        };
        match action {
            Action::Forward {
                target,
                expect: Expect::Frames(1),
                effect,
            } if joins(effect) => Dispatch::Join(Joining {
                target,
                effect,
                rewrite: None,
            }),
            Action::Rewritten {
                target,
                expect: Expect::Frames(1),
                effect,
                rewrite,
            } if joins(effect) && rewrite.strip.is_none() => Dispatch::Join(Joining {
                target,
                effect,
                rewrite: Some(rewrite),
            }),
            other => Dispatch::Alone(other),
        }
    }

    /// Adds a command to the run (sending the run first when it goes elsewhere), or pauses
    /// when it must wait for replies from another connection.
    async fn join_run(
        &mut self,
        run: &mut Run,
        command: &Command,
        hash_slot: Option<u16>,
        join: Joining,
    ) -> Flow {
        let target = join.target;
        let hidden = join.hidden();
        if run.target.is_some_and(|t| t != target) {
            if self.may_scatter(run, target, hidden) {
                self.switch_run(run, target);
            } else {
                // Another connection: the runs so far go out first.
                self.flush_run(run).await;
            }
        } else if hidden && run.seq.is_some() {
            // Segments carry no mask: hidden frames start a new batch.
            self.flush_run(run).await;
        }
        if let Target::Dedicated(node) = target {
            if self.blocked(target, hash_slot) {
                // Decided again once resumed.
                self.input.paused = true;
                return Flow::Stop;
            }
            if !self.ensure_dedicated(false, node, join.effect).await {
                self.count_joined(command, &join);
                self.audit_failed(command);
                self.flush_run(run).await;
                self.input.rbuf.advance(command.len);
                return Flow::Next;
            }
        }
        self.join_prepared(run, command, hash_slot, join)
    }

    /// Counts a command that joined a run as forwarded or rewritten.
    fn count_joined(&self, command: &Command, join: &Joining) {
        let outcome = match join.rewrite {
            Some(_) => CommandOutcome::Rewritten,
            None => CommandOutcome::Forwarded,
        };
        let class = crate::metrics::class_of(command.spec);
        self.ctx.ops.metrics.command(class, outcome);
    }

    /// The part of joining a run that never waits, once the run goes where the command goes
    /// (and a dedicated connection is up): pauses if the command must wait for replies from
    /// another connection, else counts it and appends it.
    fn join_prepared(
        &mut self,
        run: &mut Run,
        command: &Command,
        hash_slot: Option<u16>,
        join: Joining,
    ) -> Flow {
        if self.blocked(join.target, hash_slot) {
            // Decided again once resumed.
            self.input.paused = true;
            return Flow::Stop;
        }
        self.count_joined(command, &join);
        self.audit_joined(command, &join);
        let Joining {
            target,
            effect,
            rewrite,
        } = join;
        if run.first.is_none() {
            run.first = command.spec;
        }
        if let (Some(slot), Target::Shared(..), Some(spread)) =
            (hash_slot, target, self.routing.spread_mut())
        {
            // Counted from now: a later command for the slot must not join another node's run.
            spread.sent(target, &[slot]);
            run.hash_slots.push(slot);
        }
        self.push_to_run(run, command.len, target, effect, rewrite);
        self.apply(effect);
        Flow::Next
    }

    /// Appends the command of `len` bytes after the run to it, as sent or as rewritten, and
    /// notes its frames in an open transaction.
    fn push_to_run(
        &mut self,
        run: &mut Run,
        len: usize,
        target: Target,
        effect: Effect,
        rewrite: Option<crate::policy::rewrite::Rewrite>,
    ) {
        let base = run.len;
        let Some(rewrite) = rewrite else {
            run.push_plain(&self.input.rbuf[base..base + len], target);
            self.note_queued(effect, None);
            return;
        };
        let (prefix, rest) = self.input.rbuf.split_at(base);
        let hint = rest.len() + rest.len() / 2;
        run.push_rewritten(prefix, &rest[..len], hint, &rewrite, target);
        if rewrite.after.is_empty() && rewrite.before().is_empty() {
            self.note_queued(effect, None);
        } else {
            let mut frames = vec![false; rewrite.before().len()];
            frames.push(true);
            frames.extend(std::iter::repeat_n(false, rewrite.after.len()));
            self.note_queued(effect, Some(&frames));
        }
    }

    /// Sends the run, then carries out a command that cannot join one (MULTI, SUBSCRIBE,
    /// refusals, replies the proxy makes…).
    async fn dispatch_alone(
        &mut self,
        run: &mut Run,
        command: &Command,
        hash_slot: Option<u16>,
        action: Action,
    ) -> Flow {
        let outcome = match &action {
            Action::Forward { .. } => CommandOutcome::Forwarded,
            Action::Rewritten { .. } => CommandOutcome::Rewritten,
            Action::Refused(_) => CommandOutcome::Refused,
            _ => CommandOutcome::Local,
        };
        let closes = matches!(action, Action::LocalThenClose(_));
        self.flush_run(run).await;
        self.input.batch_name = command.spec;
        if let Some(c) = self.routing.cluster_mut() {
            c.batch_slot = hash_slot;
        }
        let before = self.input.rbuf.len();
        // Boxed: the path for commands that cannot join a run (MULTI, SUBSCRIBE, refusals,
        // local replies) carries the largest futures, which would otherwise sit in every
        // session's state.
        let done = Box::pin(self.execute(action, command.len)).await;
        // Counted once dispatched: a paused command is decided again.
        if done || closes || self.input.rbuf.len() != before {
            let class = crate::metrics::class_of(command.spec);
            self.ctx.ops.metrics.command(class, outcome);
            self.audit_dispatched(command, outcome);
        }
        if done { Flow::Next } else { Flow::Stop }
    }

    /// Sends the current run of forwardable commands as one batch, and the parked ones.
    async fn flush_run(&mut self, run: &mut Run) {
        let run = std::mem::take(run);
        self.send_run(run).await;
        let parked = match self.routing.cluster_mut() {
            Some(c) if !c.parked.is_empty() => {
                c.parked_frames = 0;
                std::mem::take(&mut c.parked)
            }
            _ => Vec::new(),
        };
        if !parked.is_empty() {
            for run in parked {
                self.send_run(run).await;
            }
            // Segments answered with an error right away may now head the reply order.
            self.queue.flush_local_slots();
        }
    }

    /// Sends one run as one batch.
    async fn send_run(&mut self, mut run: Run) {
        let Some(target) = run.target else {
            // Only skipped empty requests: drop them.
            self.input.rbuf.advance(run.len);
            return;
        };
        let parts = match run.seq {
            Some(seq) => {
                self.cut_segment(&mut run);
                run.head.map(|head| (seq, head))
            }
            None => None,
        };
        let bytes = match run.owned {
            Some(owned) => {
                self.input.rbuf.advance(run.len);
                owned.freeze()
            }
            None => self.input.rbuf.split_to(run.len).freeze(),
        };
        let handling = Handling {
            mask: run.mask,
            ..Handling::default()
        };
        self.input.batch_name = run.first;
        self.send_as(
            target,
            bytes,
            Expect::Frames(run.frames),
            handling,
            run.hash_slots,
            parts,
        )
        .await;
    }

    /// Sends a batch and records its slot; on failure answers every command with the error.
    /// `hash_slots`: cluster mode, the hash slots of its keyed commands for a shared
    /// connection (see `spread`).
    async fn send(
        &mut self,
        target: Target,
        bytes: Bytes,
        expect: Expect,
        handling: Handling,
        hash_slots: Vec<u16>,
    ) {
        self.send_as(target, bytes, expect, handling, hash_slots, None)
            .await;
    }

    /// `send`, for a batch whose reply slots may be in place already: `parts` is then its
    /// `seq` and the position of its first segment (see `scatter`).
    async fn send_as(
        &mut self,
        target: Target,
        bytes: Bytes,
        expect: Expect,
        handling: Handling,
        hash_slots: Vec<u16>,
        parts: Option<(u16, usize)>,
    ) {
        let commands = expect.commands();
        let seq = match parts {
            Some((seq, _)) => seq,
            None => {
                let seq = self.queue.next_seq;
                self.queue.next_seq = seq.wrapping_add(1);
                seq
            }
        };
        let kept = self.kept_batch(target, expect, &bytes, hash_slots, handling.wait);
        let batch = Batch {
            bytes,
            expect,
            wait: handling.wait,
            reply_to: self.queue.reply_sender(),
            seq,
        };
        if self.enqueue_to(target, batch, commands).await.is_err() {
            self.send_failed(kept, seq, commands, &handling, parts);
            return;
        }
        match parts {
            Some((_, head)) => {
                if let Some(Slot::Upstream { sent, .. }) = self.queue.slots.get_mut(head) {
                    *sent = kept;
                }
            }
            None => self.queue.slots.push_back(Slot::Upstream {
                commands,
                handling,
                read_at: self.input.read_at,
                name: self.input.batch_name,
                sent: kept,
                seq,
                parts: 1,
            }),
        }
        self.queue.inflight += commands as usize;
        self.queue.inflight_target = Some(target);
    }

    /// What is kept of a batch until its replies are in, for what may have to be done with
    /// them: cluster batches, for redirections; a Sentinel replica's batch (node 1…), which
    /// holds only reads, so they can go to the primary if the replica fails
    /// (`resend_failed_replica_reads`); a cluster transaction's or blocking command's batch on
    /// the dedicated connection (`kept_dedicated`). `None` for the rest, whose hash slots are
    /// then not counted in flight either.
    fn kept_batch(
        &mut self,
        target: Target,
        expect: Expect,
        bytes: &Bytes,
        hash_slots: Vec<u16>,
        wait: ReplyWait,
    ) -> Option<Box<Sent>> {
        let cluster = self.routing.is_cluster();
        let dedicated_kept = match (target, expect) {
            (Target::Dedicated(_), Expect::Frames(frames)) if cluster => {
                self.kept_dedicated(frames)
            }
            _ => None,
        };
        match (target, expect, dedicated_kept) {
            (Target::Shared(proto, node), Expect::Frames(_), _) if cluster || node != 0 => {
                Some(Box::new(Sent {
                    bytes: bytes.clone(),
                    proto,
                    node,
                    dedicated: false,
                    redirects: 0,
                    wait: ReplyWait::Prompt,
                    hash_slots,
                    transaction: cluster::InTransaction::No,
                }))
            }
            (Target::Dedicated(node), _, Some(transaction)) => Some(Box::new(Sent {
                bytes: bytes.clone(),
                proto: self.client.proto,
                node,
                dedicated: true,
                redirects: 0,
                wait,
                hash_slots: Vec::new(),
                transaction,
            })),
            _ => {
                if let Some(spread) = self.routing.spread_mut() {
                    spread.answered(&hash_slots);
                }
                None
            }
        }
    }

    /// Queues `batch` (of `commands` commands) on the connection `target` names: the
    /// dedicated one, or the shared one of the node's pool (the primary's, a Sentinel
    /// replica's, a cluster node's).
    async fn enqueue_to(
        &self,
        target: Target,
        batch: Batch,
        commands: u32,
    ) -> Result<(), mpsc::error::SendError<Batch>> {
        let (proto, node) = match target {
            Target::Shared(proto, node) => (proto, node),
            Target::Dedicated(_) => {
                return match &self.conn.dedicated {
                    Some(d) => enqueue(&d.tx, batch).await,
                    None => Err(mpsc::error::SendError(batch)),
                };
            }
        };
        let (pool, replica) = match self.routing.router() {
            None if node == 0 => {
                return enqueue(self.ctx.pool.shared(proto, self.client.id), batch).await;
            }
            // Node ≥ 1 exists only when `place_read` chose a Sentinel replica.
            None => match self.routing.replicas() {
                Some(replicas) => (replicas.pool(node), true),
                None => (self.ctx.pool.clone(), true),
            },
            Some(router) => (
                router.pool(node),
                router.read_from() != crate::config::ReadFrom::Primary
                    && !router.snapshot().is_primary(node),
            ),
        };
        if replica {
            let metrics = &self.ctx.ops.metrics;
            metrics.replica_reads.inc_by(u64::from(commands));
        }
        enqueue(pool.shared(proto, self.client.id), batch).await
    }

    /// A batch that could not be queued (its connection closed): every command it carries
    /// gets the error in its place in the reply order.
    fn send_failed(
        &mut self,
        kept: Option<Box<Sent>>,
        seq: u16,
        commands: u32,
        handling: &Handling,
        parts: Option<(u16, usize)>,
    ) {
        if let (Some(spread), Some(sent)) = (self.routing.spread_mut(), &kept) {
            spread.answered(&sent.hash_slots);
        }
        let e = ProxyError::Upstream(UpstreamError::Unavailable {
            addr: self.ctx.pool.addr(),
            reason: "connection closed".into(),
        });
        let reply = error_reply(&e);
        if let Some((_, head)) = parts {
            // Its segments already hold its place in the reply order.
            for slot in self.queue.slots.range_mut(head..) {
                if let Slot::Upstream {
                    commands, seq: s, ..
                } = slot
                    && *s == seq
                {
                    *slot = Slot::Local(reply.repeat(*commands as usize).into());
                }
            }
            return;
        }
        if !handling.suppress {
            let visible = match &handling.mask {
                Some(mask) => mask.iter().filter(|&&k| k).count() as u32,
                None => commands,
            };
            for _ in 0..visible {
                self.queue.local(reply.clone());
            }
        }
    }

    /// Cluster mode: whether a batch of `frames` commands for the dedicated connection is kept
    /// for what a redirection of it means, and its part in a transaction. Kept: a
    /// transaction's batches (MULTI with its first command, queued commands, EXEC), to replay
    /// the transaction if its slot moved, unless the connection holds other state (another
    /// user's AUTH, CLIENT TRACKING) that a replay on the node's shared connection would not
    /// have; a blocking command, followed to the new node; a WATCH, which may start over on
    /// another node if the map was stale (see `redirect_dedicated`).
    fn kept_dedicated(&self, frames: u32) -> Option<cluster::InTransaction> {
        if self.conn.in_multi() {
            (!self.conn.holds(Holds::OTHER_USER) && !self.conn.holds(Holds::CLIENT_MODE)).then_some(
                if self.conn.holds(Holds::WATCH) {
                    cluster::InTransaction::Watched
                } else {
                    cluster::InTransaction::Replayable
                },
            )
        } else {
            (frames == 1 && (!self.pinned() || self.conn.holds(Holds::WATCH)))
                .then_some(cluster::InTransaction::No)
        }
    }

    /// Carries out a non-batchable action for the command occupying the first `len` bytes of
    /// the read buffer. Returns `false` when processing must pause (nothing consumed).
    async fn execute(&mut self, action: Action, len: usize) -> bool {
        match action {
            Action::Forward {
                target,
                expect,
                effect,
            } => return self.forward(len, target, expect, effect, None).await,
            Action::Rewritten {
                target,
                expect,
                effect,
                rewrite,
            } => {
                return self
                    .forward(len, target, expect, effect, Some(rewrite))
                    .await;
            }
            Action::Local(reply, effect) => self.answer_local(len, reply, effect),
            Action::LocalThenClose(reply) => {
                self.input.rbuf.advance(len);
                self.queue.local(reply);
                self.input.closing = true;
            }
            Action::Silent(mode) => {
                self.input.rbuf.advance(len);
                if self.client.reply_mode != ReplyMode::Off || mode == ReplyMode::Off {
                    self.client.reply_mode = mode;
                }
            }
            Action::Hello { proto, name, login } => {
                Box::pin(self.answer_hello(len, proto, name, login)).await;
            }
            Action::Refused(reply) => {
                self.input.rbuf.advance(len);
                if let Some(multi) = &mut self.conn.multi {
                    multi.refused = true;
                }
                self.answer(reply);
            }
            // Commands answered from several nodes (or, for sharded pub/sub, by the session),
            // and RESET: every earlier command must have run first, on whichever node (a SCAN
            // sees earlier writes; split parts go out at once).
            Action::Gather(_) | Action::Reset if self.queue.inflight > 0 => {
                self.input.paused = true;
                return false;
            }
            Action::Gather(gather) => {
                self.input.rbuf.advance(len);
                let reply = Box::pin(self.gather(*gather)).await;
                self.answer(reply);
            }
            Action::Reset => {
                self.input.rbuf.advance(len);
                self.reset();
                self.queue.local(answers::reset());
            }
        }
        true
    }

    /// Queues a reply the proxy made (or gathered) for the command just consumed, unless the
    /// client switched replies off; a CLIENT REPLY SKIP is used up by it.
    fn answer(&mut self, reply: Bytes) {
        if self.client.reply_mode == ReplyMode::On {
            self.queue.local(reply);
        }
        if self.client.reply_mode == ReplyMode::Skip {
            self.client.reply_mode = ReplyMode::On;
        }
    }

    /// Answers a command the proxy handles itself, and applies the session state it changes.
    fn answer_local(&mut self, len: usize, reply: Bytes, effect: LocalEffect) {
        self.input.rbuf.advance(len);
        if effect == LocalEffect::ReplyMode(ReplyMode::On) {
            // CLIENT REPLY ON is answered even while replies are off.
            self.client.reply_mode = ReplyMode::On;
        }
        self.answer(reply);
        match effect {
            LocalEffect::None | LocalEffect::ReplyMode(_) => {}
            LocalEffect::SetName(name) => {
                self.ctx
                    .client_list
                    .update(self.client.id, |r| r.name = name.clone());
                self.client.name = name;
            }
            LocalEffect::Login(user) => self.login(Some(user)),
            LocalEffect::DeferMulti => {
                self.conn.multi = Some(Transaction {
                    deferred: true,
                    refused: std::mem::take(&mut self.conn.watch_lost),
                    ..Transaction::default()
                });
            }
            LocalEffect::EndMulti => self.apply(Effect::EndMulti),
        }
    }

    /// HELLO answered by the proxy: the upstream's HELLO reply (as one server in cluster
    /// mode) with this client's id; the RESP version and name apply once it succeeded.
    async fn answer_hello(
        &mut self,
        len: usize,
        proto: u8,
        name: Option<Bytes>,
        login: Option<Bytes>,
    ) {
        if login.is_some() {
            self.login(login);
        }
        self.input.rbuf.advance(len);
        let reply = match self.ctx.pool.hello(proto).await {
            Some(reply) if self.routing.is_cluster() => {
                cluster::as_standalone(with_client_id(&reply, self.client.id))
            }
            Some(reply) => with_client_id(&reply, self.client.id),
            None => error_reply(&ProxyError::Upstream(UpstreamError::Unavailable {
                addr: self.ctx.pool.addr(),
                reason: "no connection established yet".into(),
            })),
        };
        let ok = reply.first() != Some(&b'-');
        self.answer(reply);
        if ok {
            self.client.proto = proto;
            if name.is_some() {
                self.client.name = name;
            }
        }
    }

    /// Forwards the command occupying the first `len` bytes of the read buffer, as the policy
    /// may have rewritten it. Returns `false` when processing must pause.
    async fn forward(
        &mut self,
        len: usize,
        target: Target,
        expect: Expect,
        effect: Effect,
        rewrite: Option<crate::policy::rewrite::Rewrite>,
    ) -> bool {
        // Pub/sub confirmations are pushed, so Redis sends them even with replies off.
        let pushed = matches!(effect, Effect::Subscribe(_))
            || matches!(expect, Expect::Confirmations(_) | Expect::UnsubscribeAll(_));
        let suppress = self.client.reply_mode != ReplyMode::On && !pushed;
        let slot = self.routing.cluster_mut().and_then(|c| c.batch_slot.take());
        if self.blocked(target, slot) {
            // Wait until the other connection has answered: commands must run in the
            // order they were sent.
            self.input.paused = true;
            return false;
        }
        if self.wait_after_failover(len, effect) {
            return true;
        }
        let auth = matches!(effect, Effect::Auth | Effect::AuthHello(_));
        let raw = auth && !self.ctx.pool.has_credentials();
        if let Target::Dedicated(node) = target
            && !self.ensure_dedicated(raw, node, effect).await
        {
            self.input.rbuf.advance(len);
            return true;
        }
        let command = self.input.rbuf.split_to(len).freeze();
        let out = self.outgoing(command, target, effect, rewrite);
        let expect = match expect {
            Expect::Frames(_) => Expect::Frames(out.frames.len() as u32),
            other => other,
        };
        let exec_mask = self.exec_mask(effect);
        self.note_queued(effect, out.queued.as_deref());
        let (blocking, wait) = match effect {
            Effect::Blocking(wait) | Effect::Wait(wait) => (true, wait),
            _ => (false, ReplyWait::Prompt),
        };
        let handling = Handling {
            suppress,
            blocking,
            wait,
            mask: out.frames.contains(&false).then_some(out.frames),
            unsubscribe: matches!(
                effect,
                Effect::Unsubscribe(SubKind::Channel | SubKind::Pattern)
            ),
            client_info: effect == Effect::ClientInfo,
            names_redirect: effect == Effect::NamesRedirect,
            info: effect == Effect::Info,
            replace: out.replace,
            exec_mask,
            strip: out.strip,
        };
        let hash_slots = match (slot, target, self.routing.spread_mut()) {
            (Some(slot), Target::Shared(..), Some(spread)) => {
                spread.sent(target, &[slot]);
                vec![slot]
            }
            _ => Vec::new(),
        };
        self.send(target, out.bytes, expect, handling, hash_slots)
            .await;
        self.apply(effect);
        if self.client.reply_mode == ReplyMode::Skip {
            self.client.reply_mode = ReplyMode::On;
        }
        true
    }

    /// Sentinel mode: a WAIT after a failover that came after the writes it would cover is
    /// answered with an error and the session closes; `true` when so. WAIT runs on a
    /// connection opened now, to the current primary, whose count would vouch for writes made
    /// on the previous one; Sentinel has Redis close the old primary's clients, and a WAIT
    /// retried on this connection would otherwise seem to vouch for those writes, while on a
    /// new connection it covers only writes made there.
    fn wait_after_failover(&mut self, len: usize, effect: Effect) -> bool {
        let Routing::Sentinel(sentinel) = &self.routing else {
            return false;
        };
        if !matches!(effect, Effect::Wait(_))
            || self.stateful()
            || self.ctx.pool.epoch() == sentinel.wait_epoch
        {
            return false;
        }
        self.input.rbuf.advance(len);
        let e = ProxyError::Upstream(UpstreamError::PrimaryChanged);
        self.queue.local(error_reply(&e));
        self.input.closing = true;
        true
    }

    /// The bytes a forwarded command goes upstream as: the policy's rewrite, EXEC replaced by
    /// DISCARD for a spoiled transaction, and the commands the proxy adds (the TTL rule's, the
    /// HELLO after a raw AUTH, WAIT's barrier, a deferred MULTI), with which reply frames the
    /// client sees.
    fn outgoing(
        &mut self,
        mut command: Bytes,
        target: Target,
        effect: Effect,
        rewrite: Option<crate::policy::rewrite::Rewrite>,
    ) -> Outgoing {
        let mut replace = None;
        if effect == Effect::AbortExec {
            command = Bytes::from_static(b"*1\r\n$7\r\nDISCARD\r\n");
            replace = Some(answers::execabort());
        }
        // One entry per reply frame: does the client see it?
        let mut frames = vec![true];
        let mut strip = None;
        if let Some(rw) = rewrite {
            strip = rw.strip;
            if let Some(c) = rw.command {
                command = c;
            } else if let Some(extra) = rw.append {
                let mut out = BytesMut::new();
                if extra.extend_frame(&command, &mut out) {
                    command = out.freeze();
                }
            }
            let before = rw.before.as_deref().map_or(&[][..], Vec::as_slice);
            if !rw.after.is_empty() || !before.is_empty() {
                let mut all = BytesMut::new();
                for c in before {
                    all.extend_from_slice(c);
                    frames.insert(0, false);
                }
                all.extend_from_slice(&command);
                for c in &rw.after {
                    all.extend_from_slice(c);
                    frames.push(false);
                }
                command = all.freeze();
            }
        }
        let bytes = if effect == Effect::Auth && self.client.proto == 3 {
            // A connection opened without handshake speaks RESP2: after the client's AUTH,
            // switch it to the client's RESP3 (reply hidden).
            frames.push(false);
            [
                command,
                Bytes::from_static(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n"),
            ]
            .concat()
            .into()
        } else if matches!(effect, Effect::Wait(_)) && !self.stateful() {
            frames.insert(0, false);
            [Bytes::from_static(WAIT_BARRIER), command].concat().into()
        } else {
            command
        };
        // What the transaction queues, before a deferred MULTI joins the frames.
        let queued = frames.contains(&false).then(|| frames.clone());
        let bytes = if self.conn.multi_deferred() && matches!(target, Target::Dedicated(_)) {
            if let Some(multi) = &mut self.conn.multi {
                multi.deferred = false;
            }
            frames.insert(0, false);
            [Bytes::from_static(b"*1\r\n$5\r\nMULTI\r\n"), bytes]
                .concat()
                .into()
        } else {
            bytes
        };
        Outgoing {
            bytes,
            frames,
            queued,
            replace,
            strip,
        }
    }

    /// Makes sure a usable dedicated connection to `node` exists; on failure the command's
    /// slot gets the error, the state `effect` would have set is marked as not established
    /// (see `not_established`) and `false` is returned.
    async fn ensure_dedicated(&mut self, raw: bool, node: u16, effect: Effect) -> bool {
        if let Some(d) = &self.conn.dedicated {
            if (raw || d.proto == self.client.proto) && !d.tx.is_closed() && d.node == node {
                return true;
            }
            if self.pinned() {
                self.queue.local(error_reply(&ProxyError::Upstream(
                    UpstreamError::Unavailable {
                        addr: self.ctx.pool.addr(),
                        reason: "dedicated connection lost".into(),
                    },
                )));
                self.input.closing = true;
                return true;
            }
            self.conn.dedicated = None;
        }
        let push = PushTarget {
            to: self.queue.reply_sender(),
            budget: self.queue.push_budget(),
            budget_size: PUSH_BUDGET,
            conn_id: self.conn.dedicated_gen + 1,
        };
        // Boxed: the connect + TLS + handshake future is large and rare; inline it would grow
        // every idle session's task.
        let pool = match self.routing.router() {
            None => self.ctx.pool.clone(),
            Some(router) => router.pool(node),
        };
        match Box::pin(pool.dedicated(self.client.proto, push, raw)).await {
            Ok(opened) => {
                self.conn.dedicated_gen += 1;
                let id = match (self.routing.router(), opened.upstream_id) {
                    (None, Some(upstream)) => {
                        Some(self.ctx.client_ids.register(self.client.id, upstream))
                    }
                    _ => None,
                };
                self.conn.dedicated = Some(Dedicated {
                    tx: opened.tx,
                    proto: if raw { 2 } else { self.client.proto },
                    node,
                    _id: id,
                });
                true
            }
            Err(e) => {
                self.not_established(effect, &e);
                false
            }
        }
    }

    /// The command that would have set up `effect` on a dedicated connection could not get
    /// one: it gets the error, and no later command runs in a state the client did not ask
    /// for. A MULTI leaves a transaction that was never opened (every command up to EXEC or
    /// DISCARD answered with an error and not run, EXEC aborted); a WATCH makes the next EXEC
    /// abort; a SELECT leaves the database the client had, and each error says so.
    fn not_established(&mut self, effect: Effect, e: &UpstreamError) {
        let consequence = match effect {
            Effect::Multi => {
                self.conn.multi = Some(Transaction {
                    unopened: true,
                    refused: true,
                    ..Transaction::default()
                });
                Some("the transaction is not open: the commands up to EXEC are not run and EXEC aborts".to_string())
            }
            Effect::Watch => {
                self.conn.watch_lost = true;
                Some("the keys are not watched: the next EXEC aborts".to_string())
            }
            Effect::Select(_) => Some(format!(
                "SELECT not done: the connection stays on db {}",
                self.client.db
            )),
            _ => None,
        };
        let reply = match consequence {
            Some(c) => crate::error::state_not_established(e, &c),
            None => error_reply(&ProxyError::Upstream(e.clone())),
        };
        self.queue.local(reply);
    }

    /// Records the frames of a command queued in the open MULTI (see `multi_mask`).
    fn note_queued(&mut self, effect: Effect, frames: Option<&[bool]>) {
        if let Some(multi) = &mut self.conn.multi
            && !matches!(effect, Effect::EndMulti | Effect::AbortExec | Effect::Multi)
        {
            match frames {
                Some(mask) => multi.mask.extend_from_slice(mask),
                None => multi.mask.push(true),
            }
        }
    }

    /// The mask for EXEC's reply, when hidden commands were queued.
    fn exec_mask(&self, effect: Effect) -> Option<Vec<bool>> {
        let mask = &self.conn.multi.as_ref()?.mask;
        (effect == Effect::EndMulti && mask.contains(&false)).then(|| mask.clone())
    }

    /// Applies the state change of a dispatched command.
    fn apply(&mut self, effect: Effect) {
        match effect {
            Effect::None
            | Effect::Blocking(_)
            | Effect::Wait(_)
            | Effect::ClientInfo
            | Effect::Info => {}
            Effect::AbortExec => self.apply(Effect::EndMulti),
            Effect::Multi => {
                self.conn.multi = Some(Transaction {
                    refused: std::mem::take(&mut self.conn.watch_lost),
                    ..Transaction::default()
                });
            }
            Effect::EndMulti => {
                self.conn.multi = None;
                self.conn.watch_lost = false;
                if let Some(c) = self.routing.cluster_mut() {
                    c.multi_slot = None;
                }
                self.conn.held.remove(Holds::WATCH);
            }
            Effect::Watch => self.conn.held.insert(Holds::WATCH),
            Effect::Unwatch => {
                self.conn.held.remove(Holds::WATCH);
                self.conn.watch_lost = false;
            }
            Effect::Subscribe(SubKind::Shard) => {
                self.list_flag('P');
                self.conn.held.insert(Holds::SUBSCRIPTIONS);
                self.conn.held.insert(Holds::SHARD_SUBSCRIPTIONS);
            }
            Effect::Subscribe(_) => {
                self.list_flag('P');
                self.conn.held.insert(Holds::SUBSCRIPTIONS);
            }
            Effect::Unsubscribe(_) => {}
            Effect::Select(db) => {
                self.ctx.client_list.update(self.client.id, |r| r.db = db);
                self.client.db = db;
            }
            Effect::Auth => self.conn.held.insert(Holds::OTHER_USER),
            Effect::AuthHello(proto) => {
                self.conn.held.insert(Holds::OTHER_USER);
                self.apply(Effect::Hello(proto));
            }
            Effect::Hello(proto) => {
                self.ctx
                    .client_list
                    .update(self.client.id, |r| r.resp = proto);
                self.client.proto = proto;
                if let Some(d) = &mut self.conn.dedicated {
                    d.proto = proto;
                }
            }
            Effect::Monitor => {
                self.list_flag('O');
                self.conn.held.insert(Holds::MONITOR);
            }
            Effect::ConnectionState => self.conn.held.insert(Holds::CLIENT_MODE),
            Effect::Pause(mode, ms) => self.ctx.pause.start(mode, ms),
            Effect::Unpause => self.ctx.pause.end(),
            Effect::NamesRedirect => {}
        }
    }

    /// Sets this client's `CLIENT LIST` flag (`P` subscriber, `O` monitor, `N` neither).
    fn list_flag(&self, flag: char) {
        self.ctx
            .client_list
            .update(self.client.id, |r| r.flag = flag);
    }

    /// RESET: back to a fresh connection's state; the dedicated connection is closed, which
    /// drops every subscription, transaction and watch on the upstream.
    fn reset(&mut self) {
        self.ctx.client_list.update(self.client.id, |r| {
            r.name = None;
            r.db = 0;
            r.resp = 2;
            r.flag = 'N';
        });
        self.conn.dedicated = None;
        self.login(None);
        self.client.proto = 2;
        self.client.db = 0;
        self.client.name = None;
        self.conn.multi = None;
        self.conn.watch_lost = false;
        if let Some(c) = self.routing.cluster_mut() {
            c.shard_subs = None;
            c.multi_slot = None;
            c.tx_log = None;
        }
        self.conn.held = Holds::default();
        self.client.reply_mode = ReplyMode::On;
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// Idle clients cost what their task holds: keep the session future small.
    #[tokio::test]
    async fn session_future_size() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let config = crate::Config::default();
        let policy = Arc::new(ArcSwap::from_pointee(Policy::default()));
        let ops = crate::ops::Ops::new(&config, policy.clone(), None);
        let ctx = Arc::new(Context {
            pool: Pool::start(&config, ops.metrics.clone()).unwrap(),
            upstreams: Upstreams::Standalone,
            codec: CodecLimits::default(),
            max_inflight: 16,
            max_query_buffer: 1 << 20,
            upstream_user: None,
            upstream_password: None,
            scripts_dedicated: true,
            client_ids: Default::default(),
            client_list: Default::default(),
            pause: Default::default(),
            stopping: Default::default(),
            idle_tick: tokio::sync::Notify::new(),
            policy,
            ops,
        });
        let fut = serve(client, ctx, 1);
        // Measured 1024 bytes in debug since the session is in parts with its mode state in
        // `Routing` (1168 before; 2216 before processing a read was boxed per read; rare large
        // futures, such as a dedicated connect, the HELLO wait or a full upstream queue, are
        // boxed too). What an idle client costs in all is pinned by tests/idle_memory.rs.
        assert!(
            std::mem::size_of_val(&fut) <= 1088,
            "{}",
            std::mem::size_of_val(&fut)
        );
        // 32 of these make the first block of a session's reply channel.
        assert!(std::mem::size_of::<Reply>() <= 48);
    }
}
