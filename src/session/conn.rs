//! The session's upstream connections: which one a command goes to (`Target`), the
//! dedicated one, and the state the client holds on it (`ConnState`).

use super::client::ClientState;
use super::context::Context;
use super::{client_ids, tenant_quota};
use crate::protocol::answers;
use crate::upstream::Batch;
use tokio::sync::mpsc;

/// Which upstream connection a command goes to. The second field is the node (an index
/// from the cluster router; for a standalone or Sentinel upstream 0 is the primary and 1… the
/// Sentinel replicas of `upstream::replicas`). A change of target waits until the other
/// target has answered everything, except between shared connections of a cluster: replies
/// are then matched by `seq` and only a command whose hash slot is in flight on another
/// connection waits (see `spread`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// The shared connection for this RESP version, on this node.
    Shared(u8, u16),
    /// The session's dedicated connection, to this node.
    Dedicated(u16),
}

/// The dedicated upstream connection of a session.
pub(super) struct Dedicated {
    /// Where to send commands.
    pub(super) tx: mpsc::Sender<Batch>,
    /// RESP version the connection speaks now; a mismatch means reconnecting before reuse.
    pub(super) proto: u8,
    /// The node it is connected to (0 for a standalone upstream).
    pub(super) node: u16,
    /// Logged in as the script user (`script_user`): scripts sent on it cannot run what the
    /// deny rules refuse.
    pub(super) confined: bool,
    /// Maps the client's id to this connection while it lives (see `client_ids`).
    pub(super) _id: Option<client_ids::Registration>,
    /// Counts the connection against the client's tenant while it lives (`tenant_quota`).
    pub(super) _share: Option<tenant_quota::Share>,
}

/// The session's dedicated upstream connection and the state the client built on it.
#[derive(Default)]
pub(super) struct ConnState {
    /// The dedicated connection, kept for reuse while the session lives (blocking commands
    /// use it without pinning the session).
    pub(super) dedicated: Option<Dedicated>,
    /// Id of the latest dedicated connection, to ignore the end of older ones.
    pub(super) dedicated_gen: u64,
    /// The open MULTI, if any.
    pub(super) multi: Option<Transaction>,
    /// A WATCH could not be established (no dedicated connection): the next transaction must
    /// abort, since the keys it relies on were not watched. Cleared by UNWATCH, EXEC, DISCARD
    /// and RESET.
    pub(super) watch_lost: bool,
    /// State held on the dedicated connection, each of which pins the session to it.
    pub(super) held: Holds,
    /// A RESET forwarded on the dedicated connection is unanswered (`Effect::Reset`): every
    /// later command waits for it, as Redis runs them after the reset.
    pub(super) resetting: bool,
}

/// An open MULTI.
#[derive(Default)]
pub(super) struct Transaction {
    /// Cluster mode: MULTI was answered by the proxy and not sent yet, because the node it
    /// must run on is the owner of the first queued command's keys (see `docs/cluster.md`;
    /// the client's MULTI waits in `ClusterState::deferred_multi`).
    pub(super) deferred: bool,
    /// The policy refused a command inside it (or a WATCH before it was lost): EXEC must
    /// abort.
    pub(super) refused: bool,
    /// MULTI itself could not be sent (no dedicated connection): nothing is queued upstream,
    /// so the proxy answers every command up to EXEC/DISCARD itself and runs none of them.
    pub(super) unopened: bool,
    /// For each command queued (hidden ones included), whether the client sees its result:
    /// the mask applied to EXEC's reply.
    pub(super) mask: Vec<bool>,
    /// A SUBSCRIBE-family command is queued: EXEC's reply carries confirmations that change
    /// the client's subscription counts, and with them whether a RESP2 client is in the
    /// subscribed context.
    pub(super) subscribes: bool,
}

/// Connection state that lives on the dedicated upstream connection; any of it keeps the
/// session there (a set, because they combine: WATCH with tracking, a RESP3 subscriber in a
/// transaction…).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Holds(pub(super) u8);

/// A cluster batch's part in a transaction, decided when it is sent, for what a
/// redirection inside it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::session) enum InTransaction {
    /// Not part of a transaction: redirections are followed command by command.
    No,
    /// Part of a transaction without WATCH: replayed on the new owner after a redirection.
    Replayable,
    /// Part of a transaction under WATCH: EXEC answers null after a redirection.
    Watched,
}

impl Holds {
    /// WATCH is in force.
    pub(super) const WATCH: Holds = Holds(1);
    /// SUBSCRIBE/PSUBSCRIBE channels or patterns are held.
    pub(super) const SUBSCRIPTIONS: Holds = Holds(2);
    /// The connection is in MONITOR mode.
    pub(super) const MONITOR: Holds = Holds(4);
    /// CLIENT TRACKING/CACHING/NO-EVICT/NO-TOUCH was set.
    pub(super) const CLIENT_MODE: Holds = Holds(8);
    /// Authenticated upstream as a user other than the pool's.
    pub(super) const OTHER_USER: Holds = Holds(16);
    /// SSUBSCRIBE was sent on it (standalone): a classic UNSUBSCRIBE counting none left
    /// does not release the connection then, since its count omits shard channels.
    pub(super) const SHARD_SUBSCRIPTIONS: Holds = Holds(32);

    pub(super) fn insert(&mut self, h: Holds) {
        self.0 |= h.0;
    }

    pub(super) fn remove(&mut self, h: Holds) {
        self.0 &= !h.0;
    }

    pub(super) fn contains(self, h: Holds) -> bool {
        self.0 & h.0 != 0
    }

    pub(super) fn any(self) -> bool {
        self.0 != 0
    }

    /// Whether anything but `h` is held.
    pub(super) fn other_than(self, h: Holds) -> bool {
        self.0 & !h.0 != 0
    }
}

impl ConnState {
    /// Whether `h` is held on the dedicated connection.
    pub(super) fn holds(&self, h: Holds) -> bool {
        self.held.contains(h)
    }

    /// Whether MULTI is open (sent or deferred).
    pub(super) fn in_multi(&self) -> bool {
        self.multi.is_some()
    }

    /// Cluster mode: MULTI is open but not sent yet.
    pub(super) fn multi_deferred(&self) -> bool {
        self.multi.as_ref().is_some_and(|m| m.deferred)
    }

    /// The policy refused a command in the open MULTI.
    pub(super) fn multi_refused(&self) -> bool {
        self.multi.as_ref().is_some_and(|m| m.refused)
    }

    /// The open MULTI was never sent upstream (see `Transaction::unopened`).
    pub(super) fn multi_unopened(&self) -> bool {
        self.multi.as_ref().is_some_and(|m| m.unopened)
    }

    /// State held on the dedicated connection that keeps the session on it; `db` is the
    /// database the client selected (`ClientState::db`), which pins it too.
    pub(super) fn stateful(&self, db: i64) -> bool {
        self.in_multi() || self.pinned(db)
    }

    /// State that ties the session to its dedicated connection's node: `stateful` except a
    /// MULTI the proxy has not sent yet.
    pub(super) fn pinned(&self, db: i64) -> bool {
        (self.in_multi() && !self.multi_deferred()) || self.held.any() || db != 0
    }

    /// The client's protocol changed to `proto` (HELLO): its dedicated connection speaks it
    /// now too.
    pub(super) fn follow_proto(&mut self, proto: u8) {
        if let Some(d) = &mut self.dedicated {
            d.proto = proto;
        }
    }
}

/// Queues a batch for an upstream connection. The queue is rarely full, so the waiting send
/// (its future holds the batch and a semaphore waiter) is boxed: inline, it would sit in every
/// session's task state for the rare case.
pub(super) async fn enqueue(
    tx: &mpsc::Sender<Batch>,
    batch: Batch,
) -> Result<(), mpsc::error::SendError<Batch>> {
    match tx.try_send(batch) {
        Ok(()) => Ok(()),
        Err(mpsc::error::TrySendError::Closed(batch)) => Err(mpsc::error::SendError(batch)),
        Err(mpsc::error::TrySendError::Full(batch)) => Box::pin(tx.send(batch)).await,
    }
}

/// Maps the client's id to its new dedicated connection to `node`, Redis's `upstream` id
/// there (`client_ids`), for as long as the returned registration lives; every way a
/// session opens one (here, `summon`, a cluster redirection) goes through this.
pub(super) fn register_upstream(
    ctx: &Context,
    client: u64,
    node: u16,
    upstream: Option<u64>,
) -> Option<super::client_ids::Registration> {
    let upstream = super::client_ids::Upstream {
        node,
        id: upstream?,
    };
    Some(ctx.client_ids.register(client, upstream))
}

/// A share of the client's tenant's dedicated connections (`tenant_quota`), waiting up
/// to `upstream.dedicated_wait_ms` for one; the reason when none came.
pub(super) async fn take_share(
    ctx: &Context,
    client: &ClientState,
) -> Result<super::tenant_quota::Share, String> {
    let (max, caps, wait) = &ctx.dedicated_caps;
    let access = &client.policy.access;
    let limit = caps.per_tenant(*max, access.tenant_count());
    let tenant = client.tenant;
    match ctx.tenant_quota.take(tenant, limit, *wait).await {
        Some(share) => Ok(share),
        None => Err(answers::dedicated_tenant_limit(
            access.tenant_name(tenant),
            limit,
            *max,
            wait.as_millis(),
        )),
    }
}
