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
mod batch;
mod client_ids;
mod client_kill;
mod client_list;
mod cluster;
mod config_get;
mod forward;
mod io;
mod limiter_transport;
mod pause;
mod proxy_commands;
mod queue;
mod replica_reads;
mod replies;
mod route;
mod routing;
mod scatter;
mod spread;
mod state;
mod sub_counts;
mod summon;
mod tenant_quota;

pub(crate) use io::serve;

use crate::protocol::answers;
use routing::Routing;
pub(crate) use routing::Upstreams;

use replies::with_client_id;

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use tokio::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use tokio::sync::{Semaphore, mpsc};

use crate::commands::CommandSpec;
use crate::commands::classify::Kind;
use crate::policy::{Client, Policy};
use crate::protocol::codec::{self, CodecLimits, Decoded};
use crate::protocol::error::{ProxyError, UpstreamError, error_reply};
use crate::protocol::reply::SubKind;
use crate::upstream::pool::Pool;
use crate::upstream::{Batch, Expect, ReplyReceiver, ReplySender, ReplyWait};
use arc_swap::ArcSwap;

/// What every session shares: the upstream pool, limits and the shutdown signal.
pub(crate) struct Context {
    /// Shared and dedicated upstream connections; in cluster mode, the pool of one primary,
    /// used for what is not about one node (HELLO replies, the rate limiter's connection).
    pub(crate) pool: Arc<Pool>,
    /// The kind of upstream: standalone, Sentinel (with its replicas) or cluster (its router).
    pub(crate) upstreams: Upstreams,
    /// Request framing limits.
    pub(crate) codec: CodecLimits,
    /// Unanswered commands per client before the proxy stops reading it.
    pub(crate) max_inflight: usize,
    /// Unparsed request bytes per client before it is refused.
    pub(crate) max_query_buffer: usize,
    /// Credentials the upstream pool logs in with; a client AUTH with the same ones needs no
    /// dedicated connection.
    pub(crate) upstream_user: Option<String>,
    /// See `upstream_user`.
    pub(crate) upstream_password: Option<String>,
    /// Scripts (EVAL…, FCALL…) run on the session's dedicated connection rather than the
    /// shared one (`upstream.scripts_on_dedicated`, see `Kind::Script`).
    pub(crate) scripts_dedicated: bool,
    /// Which upstream connection each client id names (`CLIENT UNBLOCK`, `KILL ID`,
    /// `REDIRECT`).
    pub(crate) client_ids: Arc<client_ids::ClientIds>,
    /// Every client's row for `CLIENT LIST`.
    pub(crate) client_list: Arc<client_list::ClientList>,
    /// Dedicated connections held per tenant, against each tenant's share
    /// (`upstream.dedicated_caps`).
    pub(crate) tenant_quota: Arc<tenant_quota::TenantQuota>,
    /// Each tenant's share, and how long a command waits for one: the node's
    /// `dedicated_max`, the caps, and `dedicated_wait_ms`.
    pub(crate) dedicated_caps: (
        usize,
        crate::config::DedicatedCapsConfig,
        std::time::Duration,
    ),
    /// The `CLIENT PAUSE` in force, as forwarded through this proxy.
    pub(crate) pause: Arc<pause::Pause>,
    /// Set when the proxy drains for shutdown; `idle_tick` is notified right after, so
    /// sessions asleep notice at once and sessions awake see the flag on their next turn.
    pub(crate) stopping: std::sync::atomic::AtomicBool,
    /// Notified every `IDLE_TICK` by the server: a session that saw no traffic for a whole
    /// tick gives back its reply channel and spare buffers (see `Session::release_idle`).
    /// One process-wide signal instead of a timer per session, which would cost a timer-wheel
    /// update per request; shutdown rides on it too, so a session waits on one future for
    /// both (a watch channel's would add 136 bytes to every client's task).
    pub(crate) idle_tick: Arc<tokio::sync::Notify>,
    /// The rules every command is checked against before it is routed; swapped whole on
    /// reload.
    pub(crate) policy: Arc<ArcSwap<Policy>>,
    /// Metrics, slow log and reload, shared with the admin endpoint and `PROXY` commands.
    pub(crate) ops: crate::operations::ops::Ops,
}

/// How often idle sessions are asked to give memory back; a session is released after one to
/// two ticks without traffic.
pub const IDLE_TICK: std::time::Duration = std::time::Duration::from_secs(2);
/// Bytes of push frames (pub/sub messages) a session may hold unwritten.
const PUSH_BUDGET: u32 = 4 * 1024 * 1024;
/// Read buffer headroom requested before each read once a client's reads have filled the
/// buffer (it pipelines or sends large values).
const READ_CHUNK: usize = 16 * 1024;
/// Read buffer headroom of a client whose reads have all fitted so far. A 16 KiB buffer that
/// receives one small command touches a whole 4 KiB page of it: with every client's first
/// read at this size, 5,000 clients that each sent a command hold 1 KiB each instead
/// (docs/performance.md, Memory per idle client).
const FIRST_READ: usize = 1024;
/// Most batches a cluster session may have in flight: below the 65,536 values of a 16-bit
/// `seq`, so a reply's `seq` names one batch. `max_inflight` (commands, at least one per
/// batch) is capped to it in cluster mode.
pub(crate) const SEQ_WINDOW: usize = 32 * 1024;

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
    /// A push that must not overtake the replies before it (a cluster invalidation, see
    /// `cluster::tracking`), written once they are, and the push budget it holds until then.
    Push { frame: Bytes, permits: u32 },
    /// `commands` replies coming from upstream as one `Reply::Batch`; dropped unwritten when
    /// the client switched replies off. `read_at` (when the batch's bytes were read) and
    /// `handling.name` (its first command) feed the latency histogram and the slow log.
    Upstream {
        commands: u32,
        handling: Handling,
        read_at: Instant,
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

/// How the replies of one upstream slot are treated.
#[derive(Debug, Default)]
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
    /// A SUBSCRIBE-family command: its confirmations' counts are the client's `sub=`,
    /// `psub=` and `ssub=` in CLIENT LIST (`sub_counts`).
    sub_counts: bool,
    /// HELLO with the client's own AUTH, forwarded: applied once Redis answered it.
    hello_auth: Option<Box<HelloAuth>>,
    /// RESET forwarded (`Effect::Reset`): the session resets once Redis answered it.
    reset: bool,
    /// A forwarded HELLO: its reply is shaped as the one the proxy answers itself
    /// (`hello_as_seen`); in cluster mode it said `mode: cluster` (state fuzzer), which makes
    /// a client switch to cluster mode and ask for CLUSTER SLOTS.
    hello: bool,
    /// INFO: append the proxy's section to the upstream's text.
    info: bool,
    /// CONFIG GET: remove the secret parameters from the reply.
    config_get: bool,
    /// EXEC of a transaction with hidden commands queued: which elements of EXEC's array the
    /// client sees.
    exec_mask: Option<Vec<bool>>,
    /// Answer this instead of the upstream's reply (EXECABORT for a DISCARDed EXEC).
    replace: Option<Bytes>,
    /// Remove the tenant's namespace prefix from key names in the reply (SCAN, KEYS).
    strip: Option<Box<crate::policy::rewrite::Strip>>,
    /// While a mirror runs (`mirror:`): the batch as sent and the RESP version it went in,
    /// handed to the mirror with the primary's replies once they are in.
    mirror: Option<Box<crate::operations::mirror::Capture>>,
    /// The command's table entry (a run's first command's), for the latency class and the
    /// slow log, and the mirror's judgement of a lone command.
    name: Option<&'static CommandSpec>,
    /// Cluster mode: a script in flight on its node, which keyless commands go to until this
    /// is dropped with the reply (`Routing::script_sent`).
    _script: Option<crate::topology::cluster::ScriptRun>,
}

/// A forwarded HELLO with the client's own AUTH, settled by Redis's answer: Redis switches
/// the protocol only if it accepts the AUTH, and a refused AUTH leaves the client as it was.
/// Taken at dispatch, the session read the connection's RESP2 replies as RESP3.
#[derive(Clone, Debug)]
struct HelloAuth {
    /// The protocol asked for, the client's once Redis accepted it.
    proto: u8,
    /// The client was on the proxy's login before (`Holds::OTHER_USER` not held): refused,
    /// it is again, and the connection dialled for this AUTH is dropped.
    first_login: bool,
    /// Its options as Redis runs them: the name once Redis accepted the login (refused,
    /// the name stays), and whether a bad option after the AUTH makes Redis log the client
    /// in and answer an error.
    options: crate::commands::grammar::HelloOptions,
}

/// How Redis took a forwarded HELLO with AUTH, from its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HelloOutcome {
    /// Answered: logged in, named, the protocol switched.
    Accepted,
    /// An error for an option after the AUTH (`HelloOptions::bad_after_auth`): Redis had
    /// logged the client in and named it; the protocol stays.
    LoggedIn,
    /// Refused (WRONGPASS, or before the AUTH), or not answered: nothing changed.
    Refused,
}

impl HelloOutcome {
    /// The outcome of a login, `AUTH` (`None`) or a HELLO with `options`.
    fn of_login(
        options: Option<&crate::commands::grammar::HelloOptions>,
        reply: &[u8],
    ) -> HelloOutcome {
        match options {
            Some(o) => HelloOutcome::of(o, reply),
            None if reply.first() == Some(&b'-') => HelloOutcome::Refused,
            None => HelloOutcome::Accepted,
        }
    }

    /// The outcome Redis's `reply` says, for a HELLO with `options`.
    fn of(options: &crate::commands::grammar::HelloOptions, reply: &[u8]) -> HelloOutcome {
        if reply.first() != Some(&b'-') {
            HelloOutcome::Accepted
        } else if options.bad_after_auth && !reply.starts_with(b"-WRONGPASS") {
            HelloOutcome::LoggedIn
        } else {
            HelloOutcome::Refused
        }
    }
}

/// What `execute` carries out an action for: the command dispatched alone, passed down to
/// `forward` as a value (not stashed in the session for the next send to pick up).
#[derive(Clone, Copy)]
struct Lone {
    /// Its bytes in the read buffer.
    len: usize,
    /// Its table entry, for the slow log and the mirror (`Handling::name`).
    name: Option<&'static CommandSpec>,
    /// Cluster mode: the hash slot `decide` placed it on (keeps the slot's commands in order
    /// across nodes, `spread`).
    hash_slot: Option<u16>,
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
    /// RESET forwarded on the dedicated connection that holds the client's subscriptions:
    /// Redis drops them before anything after it runs (a connection merely closed keeps them
    /// until Redis reads the close, and a PUBLISH on another connection would still count
    /// them); the session resets once it is answered (`Handling::reset`).
    Reset,
    ConnectionState,
    /// No state change, but the command may block for as long as it says (see
    /// `Handling::blocking`).
    Blocking(ReplyWait),
    /// A script (EVAL, FCALL… on the session's own connection, `route_script`): blocking,
    /// answered when it ends; in cluster mode, while it runs, keyless commands go to its node
    /// (`Handling::script`).
    Script,
    /// WAIT/WAITAOF: blocking, and it must count the client's earlier writes (see
    /// `WAIT_BARRIER`).
    Wait(ReplyWait),
    /// CLIENT INFO: the reply describes the upstream connection; rewrite it to describe the
    /// client (id, name, addresses).
    ClientInfo,
    /// INFO asking for the default sections (or `proxy`): append the `# Proxy` section.
    Info,
    /// CONFIG GET: the secret parameters' pairs are removed from the reply (`config_get`).
    ConfigGet,
    /// EXEC of a transaction in which the policy refused a command: DISCARD it upstream and
    /// answer EXECABORT, as Redis does after a command rejected at queue time.
    AbortExec,
    /// CLIENT PAUSE for this long (ms): what it holds back is routed around (`pause`).
    Pause(pause::Paused, u64),
    /// CLIENT UNPAUSE.
    Unpause,
    /// CLIENT GETREDIR/TRACKINGINFO: the redirect id in the reply is made the client's.
    NamesRedirect,
    /// CLIENT UNBLOCK naming another client's dedicated connection (`client_ids`): Redis
    /// finds it only on its own node, which the target names; cluster placement keeps it.
    NamesClient,
    /// CLIENT TRACKING … REDIRECT naming another client's dedicated connection: the state of
    /// `ConnectionState`, on the connection's node, which the target names (Redis redirects
    /// invalidations only to a client of its own); cluster placement keeps it.
    TracksToClient,
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
    /// Not decided yet: how Redis reads it depends on replies still due (a RESP2 client's
    /// subscribed context while a SUBSCRIBE-family command is in flight). Decided again once
    /// everything in flight is answered.
    AwaitReplies,
    /// The policy refused the command: answer with this error (and spoil an open MULTI).
    Refused(Bytes),
    /// Forward, but as the policy rewrote it (TTL added or cut).
    Rewritten {
        target: Target,
        expect: Expect,
        effect: Effect,
        /// Boxed: rewrites are rare, and inline (120 bytes) they made every `Action` 160 bytes,
        /// moved several times per command with a `memcpy` call each (callgrind).
        rewrite: Box<crate::policy::rewrite::Rewrite>,
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
    /// CLIENT KILL, carried out by the proxy on its own clients (`client_kill`).
    Kill(Box<client_kill::KillFilter>),
    /// CLIENT TRACKING … REDIRECT to a client of the tenant that has no dedicated connection:
    /// its session is asked to open one, then the command goes on naming it (`summon`).
    Summon(Box<summon::Summon>),
    /// Cluster mode: a command whose effect each node has for itself only (a keyspace
    /// notification subscription, MONITOR): done on every other primary too, then forwarded
    /// as the action it carries (`cluster::Spread`).
    Spread(Box<cluster::Spread>),
    /// Cluster mode: the session's own connections must follow a changed map first (see
    /// `cluster::Prepare`); the command is then decided again (`Session::prepare_then`).
    Prepare(Box<cluster::Prepare>),
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
    /// Judged by the policy before and paused: decided again without spending its rate
    /// budget or counts again (`Input::judged`).
    again: bool,
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
    rewrite: Option<Box<crate::policy::rewrite::Rewrite>>,
}

/// Session state changed by a command the proxy answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LocalEffect {
    None,
    SetName(Option<Bytes>),
    /// CLIENT SETINFO: `LIB-VER` (true) or `LIB-NAME`, kept by the proxy for this client.
    SetLib(bool, Bytes),
    ReplyMode(ReplyMode),
    /// AUTH accepted by the proxy: the session is now this user (and its tenant).
    Login(Bytes),
    /// Cluster mode: MULTI answered by the proxy, sent later, as the client spelled it, with
    /// the first queued command.
    DeferMulti,
    /// Cluster mode: EXEC or DISCARD of a MULTI that was never sent (nothing queued).
    EndMulti,
    /// Cluster mode: a keyless command queued in a deferred MULTI, answered `+QUEUED` and
    /// held until a command with keys names the node (`ClusterState::held_in_multi`).
    HoldInMulti,
}

/// The dedicated upstream connection of a session.
struct Dedicated {
    /// Where to send commands.
    tx: mpsc::Sender<Batch>,
    /// RESP version the connection speaks now; a mismatch means reconnecting before reuse.
    proto: u8,
    /// The node it is connected to (0 for a standalone upstream).
    node: u16,
    /// Logged in as the script user (`script_user`): scripts sent on it cannot run what the
    /// deny rules refuse.
    confined: bool,
    /// Maps the client's id to this connection while it lives (see `client_ids`).
    _id: Option<client_ids::Registration>,
    /// Counts the connection against the client's tenant while it lives (`tenant_quota`).
    _share: Option<tenant_quota::Share>,
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
    /// This client's row in `CLIENT LIST`, removed when the session ends; its shared part
    /// takes the last command and carries other sessions' requests (KILL, REDIRECT).
    listed: client_list::Listed,
    /// Audited and sampled commands waiting for their replies (`audited`); boxed, made on
    /// the first.
    audit_trail: Option<Box<crate::observe::audit::Trail>>,
}

/// What the client negotiated and who it is: the connection's identity as Redis would see it.
struct ClientState {
    /// Proxy-assigned id, answered to CLIENT ID and used to pick the shared connection.
    id: u64,
    /// The client's address, for CLIENT INFO and per-address rate limits.
    peer: std::net::SocketAddr,
    /// The policy this batch of commands is checked against: loaded once per read, so a
    /// reload applies from the next read on and in-flight commands keep the policy they were
    /// checked with.
    policy: Arc<Policy>,
    /// The proxy user it authenticated as and its CLIENT SETNAME.
    names: client_list::Names,
    /// The client's tenant under `policy`, recomputed when the policy is reloaded.
    tenant: u16,
    /// RESP version the client negotiated with HELLO.
    proto: u8,
    /// Database selected on the dedicated connection; non-zero keeps the session there.
    db: i64,
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
    /// A RESET forwarded on the dedicated connection is unanswered (`Effect::Reset`): every
    /// later command waits for it, as Redis runs them after the reset.
    resetting: bool,
}

/// An open MULTI.
#[derive(Default)]
struct Transaction {
    /// Cluster mode: MULTI was answered by the proxy and not sent yet, because the node it
    /// must run on is the owner of the first queued command's keys (see `docs/cluster.md`;
    /// the client's MULTI waits in `ClusterState::deferred_multi`).
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
    /// A SUBSCRIBE-family command is queued: EXEC's reply carries confirmations that change
    /// the client's subscription counts, and with them whether a RESP2 client is in the
    /// subscribed context.
    subscribes: bool,
}

/// Connection state that lives on the dedicated upstream connection; any of it keeps the
/// session there (a set, because they combine: WATCH with tracking, a RESP3 subscriber in a
/// transaction…).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Holds(u8);

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
    reply_tx: Option<ReplySender>,
    /// The receiving end of a channel just created, for `serve` to take.
    new_reply_rx: Option<ReplyReceiver>,
    /// Budget of unwritten push bytes, shared with the dedicated connection.
    /// Created with the first dedicated connection: most clients never get a push.
    push_budget: Option<Arc<Semaphore>>,
    /// Replies ready to write.
    out: Vec<Bytes>,
    /// Push permits to return once `out` is written.
    out_permits: u32,
    /// When the bytes of the upstream reply that last reached `out` at the head of the order
    /// were read, until `out` is written: while the next slot due came in the same read
    /// (`holds_out`), the write waits for it, so one read's replies go out in one write as
    /// Redis writes them. A pipeline scattered over cluster nodes otherwise cost the client a
    /// write, and a wake-up, per node that answered first.
    out_read: Option<Instant>,
}

/// Request bytes read from the client and not yet dispatched, and whether to read more.
struct Input {
    /// Unparsed request bytes.
    rbuf: BytesMut,
    /// A read filled the buffer: the client pipelines or sends large values, so reads ask for
    /// `READ_CHUNK` from now on instead of `FIRST_READ` (until the idle release).
    big_reads: bool,
    /// Argument ranges of the command being classified, reused to avoid allocation.
    args: Vec<Range<usize>>,
    /// When the bytes being processed were read: the start of client-observed latency.
    read_at: Instant,
    /// No more requests are read; the session ends when replies are written.
    closing: bool,
    /// A CLIENT KILL named the client: the session ends at once, unanswered commands and
    /// all, as Redis frees a killed client.
    killed: bool,
    /// Request processing paused until in-flight commands on the other target are answered.
    paused: bool,
    /// The command processing paused at (first in the read buffer then) was judged by the
    /// policy already: decided again, it spends no rate budget and no count a second time
    /// (`policy::Client::again`). Set by `pause_decided`, taken by the next decision.
    judged: bool,
    /// Traffic since the last idle tick: only a session quiet for a whole tick releases its
    /// memory, so a busy client never pays for re-creating its reply channel.
    active: bool,
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
            // Forwarded once the other primaries are done: rate limits and the audit see the
            // command it carries.
            Action::Spread(spread) => spread.then().forwarded(),
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
                | Effect::Script
                | Effect::Wait(_)
                | Effect::Auth
                | Effect::AuthHello(_)
                | Effect::Hello(_)
                | Effect::ClientInfo
                | Effect::Info
                | Effect::ConfigGet
                | Effect::AbortExec
                | Effect::EndMulti
                | Effect::Unsubscribe(_)
                | Effect::NamesRedirect
                // Sent alone: the commands after it wait for its reply (`resetting`).
                | Effect::Reset
        )
    }
}

impl Session {
    /// Who the policy judges: this client's id, address, tenant and (only for a policy that
    /// shares a rule by user) its login's key, hashed per command rather than kept, so a
    /// reload that adds `share_by: user` needs nothing from the sessions.
    fn policy_client(&self) -> Client {
        Client {
            id: self.client.id,
            addr: self.client.peer.ip(),
            tenant: self.client.tenant,
            user: if self.client.policy.reads_user() {
                crate::policy::user_key(self.client.names.user().map(|u| &u[..]))
            } else {
                0
            },
            again: false,
        }
    }

    /// The policy's Redis-counted rate limits for the command being decided, run on the
    /// control connection of the upstream (any primary in cluster mode).
    async fn shared_limits(&self, command: &str, again: bool) -> Option<Bytes> {
        let client = Client {
            again,
            ..self.policy_client()
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

    /// Parses and dispatches every complete request in the read buffer, stopping early when
    /// order or backpressure requires waiting for replies.
    async fn process(&mut self) {
        self.follow_reload();
        // A cutover (`mirror::cutover`) closes the gate: no new command is taken until it
        // opens (the session is paused, and woken by the idle tick's notifier).
        if !self.ctx.ops.cutover.gate.enter() {
            self.input.paused = true;
            return;
        }
        let mut run = Run::default();
        while !self.input.closing {
            if self.ctx.ops.cutover.gate.is_closed() {
                self.input.paused = true;
                break;
            }
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
                        // Boxed: the commands that wait (dedicated connections, shared
                        // limits, transactions…) carry the largest futures, which would
                        // otherwise make every read's boxed `process` future large.
                        Now::Later(pending) => Box::pin(self.on_command(&mut run, pending)).await,
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
        self.ctx.ops.cutover.gate.leave();
    }

    /// Picks up a reloaded policy: from the next read on, commands are checked against it,
    /// and the client's tenant is the one it maps to.
    fn follow_reload(&mut self) {
        let policy = self.ctx.policy.load_full();
        if !Arc::ptr_eq(&policy, &self.client.policy) {
            self.client.policy = policy;
            let user = self.client.names.user().cloned();
            self.login(user);
        }
    }

    /// Pauses processing at the command just decided, which is decided again once resumed:
    /// the policy judged it already (`Input::judged`).
    fn pause_decided(&mut self) {
        self.input.paused = true;
        self.input.judged = true;
    }

    /// Carries out a non-batchable action for the command occupying the first `len` bytes of
    /// the read buffer. Returns `false` when processing must pause (nothing consumed).
    async fn execute(&mut self, action: Action, lone: Lone) -> bool {
        let len = lone.len;
        match action {
            Action::Forward {
                target,
                expect,
                effect,
            } => return self.forward(lone, target, expect, effect, None).await,
            Action::Rewritten {
                target,
                expect,
                effect,
                rewrite,
            } => {
                return self
                    .forward(lone, target, expect, effect, Some(*rewrite))
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
            Action::Gather(_) | Action::Reset | Action::AwaitReplies if self.queue.inflight > 0 => {
                self.pause_decided();
                return false;
            }
            Action::Gather(gather) => {
                self.input.rbuf.advance(len);
                let pushing = gather.confirms_subscriptions();
                let reply = Box::pin(self.gather(*gather)).await;
                if pushing && reply.first() != Some(&b'-') {
                    // Redis sends subscription confirmations as it sends messages, whatever
                    // CLIENT REPLY says (state fuzzer): the skip is still spent.
                    self.queue.local(reply);
                    if self.client.reply_mode == ReplyMode::Skip {
                        self.client.reply_mode = ReplyMode::On;
                    }
                } else {
                    self.answer(reply);
                }
            }
            // Nothing in flight: `decide` never asks for this then (its wait is for a reply).
            Action::AwaitReplies => {
                self.pause_decided();
                return false;
            }
            Action::Reset => {
                self.input.rbuf.advance(len);
                // Redis clears CLIENT REPLY OFF (RESET is answered) but not a SKIP already
                // in force for this very command (RESET is not answered).
                let skipped = self.client.reply_mode == ReplyMode::Skip;
                Box::pin(self.release_subscriptions()).await;
                self.reset();
                if !skipped {
                    self.queue.local(answers::reset());
                }
            }
            Action::Kill(filter) => {
                self.input.rbuf.advance(len);
                // Boxed: rare, and it may ask the upstream about a user.
                Box::pin(self.kill(*filter)).await;
            }
            Action::Summon(summon) => return Box::pin(self.summon(*summon, lone)).await,
            // `on_command` carries these out and decides the command again, so none comes
            // here; were one to, the command must not run unplaced: closed, with the reason.
            Action::Prepare(prepare) => {
                self.input.rbuf.advance(len);
                self.queue.local(prepare.unmet());
                self.input.closing = true;
            }
            Action::Spread(spread) => {
                let then = Box::pin(self.spread(*spread)).await;
                return Box::pin(self.execute(then, lone)).await;
            }
        }
        true
    }

    /// CLIENT KILL (consumed already): closes the clients `filter` names and answers. Without
    /// proxy users, a `USER` names one of the upstream's users, and Redis refuses a user it
    /// does not have: asked on the control connection (`ACL GETUSER`, null for none; an
    /// error there, such as a user without ACL rights, leaves the name to match nothing).
    async fn kill(&mut self, filter: client_kill::KillFilter) {
        if let Some(user) = &filter.user
            && !self.client.policy.access.has_users()
            && user.as_slice() != b"default"
        {
            let asked = self
                .ctx
                .pool
                .control()
                .request(&[b"ACL", b"GETUSER", user])
                .await;
            if asked.is_ok_and(|r| r.starts_with(b"$-1") || r.starts_with(b"*-1")) {
                self.answer(answers::no_such_user(user));
                return;
            }
        }
        let ctx = &self.ctx;
        let outcome =
            ctx.client_list
                .kill(self.client.id, self.client.tenant, &filter, &ctx.idle_tick);
        self.answer(filter.reply(outcome.killed));
        // Redis closes a client that killed itself once its reply is written.
        self.input.closing |= outcome.caller;
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
        // A held command, and a deferred MULTI, keep their bytes as the client sent them
        // (shared with the read buffer, not copied).
        let held = if matches!(effect, LocalEffect::HoldInMulti | LocalEffect::DeferMulti) {
            Some(self.input.rbuf.split_to(len).freeze())
        } else {
            self.input.rbuf.advance(len);
            None
        };
        if effect == LocalEffect::ReplyMode(ReplyMode::On) {
            // CLIENT REPLY ON is answered even while replies are off.
            self.client.reply_mode = ReplyMode::On;
        }
        self.answer(reply);
        match effect {
            LocalEffect::None | LocalEffect::ReplyMode(_) => {}
            LocalEffect::SetName(name) => self.name_client(name),
            LocalEffect::SetLib(version, value) => {
                self.ctx
                    .client_list
                    .update(self.client.id, |r| r.names.set_lib(version, value.clone()));
                self.client.names.set_lib(version, value);
            }
            LocalEffect::Login(user) => self.login(Some(user)),
            LocalEffect::DeferMulti => {
                self.routing.multi_ended();
                if let Some(multi) = held {
                    self.routing.defer_multi(multi);
                }
                self.conn.multi = Some(Transaction {
                    deferred: true,
                    refused: std::mem::take(&mut self.conn.watch_lost),
                    ..Transaction::default()
                });
            }
            LocalEffect::EndMulti => self.apply(Effect::EndMulti),
            LocalEffect::HoldInMulti => {
                if let Some(command) = held {
                    self.routing.hold_in_multi(command);
                }
            }
        }
    }

    /// HELLO answered by the proxy: the upstream's HELLO reply (as one server in cluster
    /// mode) with this client's id; the RESP version and name apply once it succeeded.
    /// Names the client (CLIENT SETNAME, HELLO SETNAME) in the session and in CLIENT LIST.
    fn name_client(&mut self, name: Option<Bytes>) {
        self.client.set_name(&self.ctx.client_list, name);
    }

    /// An upstream's HELLO reply as this client sees it: its own id (HELLO and CLIENT ID
    /// agree), and in cluster mode the `standalone` the proxy presents itself as.
    fn hello_as_seen(&self, reply: &Bytes) -> Bytes {
        let reply = with_client_id(reply, self.client.id);
        if self.routing.is_cluster() {
            cluster::as_standalone(reply)
        } else {
            reply
        }
    }

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
            Some(reply) => self.hello_as_seen(&reply),
            None => error_reply(&ProxyError::Upstream(UpstreamError::Unavailable {
                addr: self.ctx.pool.addr(),
                reason: "no connection established yet".into(),
            })),
        };
        let ok = reply.first() != Some(&b'-');
        self.answer(reply);
        if ok {
            self.client.proto = proto;
            if let Some(mut cluster) = self.cluster_session() {
                cluster.conns_follow_proto();
            }
            let named = name.is_some();
            if named {
                self.client.names.set_name(name.clone());
            }
            // CLIENT LIST shows what HELLO negotiated, as Redis's does.
            self.ctx.client_list.update(self.client.id, |r| {
                r.resp = proto;
                if named {
                    r.names.set_name(name);
                }
            });
        }
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
        let ops = crate::operations::ops::Ops::new(&config, policy.clone(), None);
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
            tenant_quota: Default::default(),
            dedicated_caps: (
                10_000,
                Default::default(),
                std::time::Duration::from_secs(1),
            ),
            pause: Default::default(),
            stopping: Default::default(),
            idle_tick: Default::default(),
            policy,
            ops,
        });
        let stream = crate::listen::ClientStream::plain(client);
        // What every read boxes (`io`): processing the read buffer. The send path builds no
        // future unless a queue is full, and commands that wait are boxed apart, so it stays
        // within glibc's per-thread cache of small blocks (up to 1,032 bytes): measured 2,648
        // bytes in release before, whose allocation, copy and free took about 800 of the
        // ~9,700 instructions of an unpipelined request.
        let mut session = Session::new(&stream, ctx.clone(), 2);
        let process = std::mem::size_of_val(&session.process());
        assert!(process <= 512, "{process}");
        drop(session);
        let fut = serve(stream, ctx, 1, ());
        // Measured 896 bytes in debug (release 920 with the server's 24-byte seat): `serve` is
        // an `async move` block holding its arguments once, a reply is placed without an
        // inline future (`on_message`), and the session keeps neither its local address nor
        // unboxed names (1024 before; 1168 before the session was in parts; 2216 before
        // processing a read was boxed per read; rare large futures, such as a dedicated
        // connect, the HELLO wait or a full upstream queue, are boxed too). In release the
        // client's whole task is then 1,024 bytes, eight of tokio's 128-byte-aligned blocks
        // (eleven before). What an idle client costs in all is pinned by tests/idle_memory.rs.
        assert!(
            std::mem::size_of_val(&fut) <= 920,
            "{}",
            std::mem::size_of_val(&fut)
        );
        // Moved several times per command (decided, joined, placed): past 128 bytes each move
        // is a `memcpy` call (160 bytes with a rewrite inline: ~90 instructions a command;
        // 80 with it boxed).
        let action = std::mem::size_of::<Action>();
        assert!(action <= 80, "{action}");
        // A session's reply channel holds one of these per batch in flight.
        assert!(std::mem::size_of::<crate::upstream::Reply>() <= 48);
    }
}
