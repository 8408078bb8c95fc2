//! What every session shares (`Context`), and which kind of upstream it fronts.

use super::{client_ids, client_list, pause, tenant_quota};
use crate::policy::Policy;
use crate::protocol::codec::CodecLimits;
use crate::upstream::pool::Pool;
use crate::upstream::replicas::Replicas;
use arc_swap::ArcSwap;
use std::sync::Arc;

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

/// Most batches a cluster session may have in flight: below the 65,536 values of a 16-bit
/// `seq`, so a reply's `seq` names one batch. `max_inflight` (commands, at least one per
/// batch) is capped to it in cluster mode.
pub(crate) const SEQ_WINDOW: usize = 32 * 1024;

/// Which kind of upstream the proxy fronts, shared by every session.
pub(crate) enum Upstreams {
    /// One Redis server.
    Standalone,
    /// A Sentinel-managed primary; with `read_from: replica`, the replicas reads may go to.
    Sentinel {
        /// `None` unless `read_from: replica`, so other sessions take no replica branch.
        replicas: Option<Arc<Replicas>>,
    },
    /// A Redis Cluster, through its router (slot map, node pools).
    Cluster(Arc<crate::topology::cluster::Router>),
}
