//! Cluster mode: which node a command goes to, what the proxy answers itself because a
//! cluster cannot do it like one Redis, following MOVED/ASK, and whole-keyspace commands sent
//! to every primary. Nothing here runs for a standalone upstream (the session's `Routing` is
//! not `Cluster`, and `decide`/`serve` skip it).
//!
//! The files, each one concern:
//! - `place`: the node a forwarded command goes to (its keys' slot, a replica for a read, a
//!   pinned session's node), and what the proxy answers itself (CLUSTER, SELECT n, a
//!   deferred MULTI, keys in several slots);
//! - `gather`: commands answered from several nodes (`Gather`): a whole-keyspace command
//!   sent to every primary, a multi-key command split by slot, a set read across slots
//!   answered from its keys' members, one step of a SCAN; `sort` SORT with `BY`/`GET`
//!   patterns, which name keys on any node;
//! - `redirect`: MOVED, ASK and TRYAGAIN followed, and a batch routed again after its node
//!   failed;
//! - `exchange`: a batch sent to one node outside the session's reply order and its replies
//!   awaited (`send_shared`, `receive`), for `gather` and `redirect` alike;
//! - `merge`: the nodes' replies made into the client's one: pure functions over reply bytes,
//!   no session;
//! - `transaction`, `subscriber`, `shard_subs`: pinned state that moves with its slot or node;
//! - `keyspace`: keyspace notifications, published only on the key's node, heard from every
//!   primary over extra pub/sub connections;
//! - `monitor`: MONITOR, which shows only its node's commands, opened on every primary.
//!
//! They import each other one way only: `place` → `gather` → `redirect` → `transaction`,
//! and `exchange` and `merge` below them all. What two of them share is here.

use crate::topology::cluster::Redirect;
use bytes::Bytes;
use std::sync::Arc;

mod exchange;
mod gather;
mod hll;
mod info;
pub(super) mod keyspace;
pub(super) mod login;
mod merge;
pub(super) mod monitor;
mod place;
mod redirect;
pub(super) mod shard_subs;
mod sort;
mod subscriber;
pub(super) mod tracking;
mod transaction;
mod view;

use gather::{Fanout, Scan, Split};
pub(super) use place::as_standalone;
pub(super) use transaction::TxLog;
pub(super) use view::{ClusterSession, ClusterView};

/// A cluster command the session answers itself, after every earlier command has run:
/// from several nodes (their replies gathered into one), or from its own state.
pub(super) enum Gather {
    /// A whole-keyspace command sent to every primary, the replies merged.
    Fanout(Fanout),
    /// A multi-key command split by slot, the parts' replies joined; or a set read across
    /// slots (SUNION…), its keys' members gathered and combined.
    Split(Split),
    /// One step of a SCAN over every primary.
    Scan(Scan),
    /// SORT with `BY`/`GET` patterns: the elements, their weights and values read from
    /// their nodes, sorted here (see `sort`).
    Sort(sort::SortGather),
    /// SSUBSCRIBE/SUNSUBSCRIBE, answered over the per-node pub/sub connections (see
    /// `shard_subs`).
    ShardPubSub(shard_subs::ShardCommand),
    /// CLIENT TRACKING in broadcasting mode, answered over a tracking connection per
    /// primary (see `tracking`).
    Tracking(tracking::TrackingCommand),
    /// The client's own login (AUTH, HELLO AUTH), sent on a connection per primary (see
    /// `login`).
    Login(login::LoginCommand),
}

/// A forwarded command whose effect each primary has for itself only (it publishes its own
/// keys' notifications, shows its own commands): done on every other primary first, then
/// forwarded as the action it carries.
pub(super) enum Spread {
    /// A classic (un)subscription of keyspace notifications (`keyspace`).
    Keyspace(keyspace::Fanout),
    /// MONITOR (`monitor`).
    Monitor(monitor::Fanout),
}

impl Spread {
    /// The command as decided, taken to be forwarded.
    pub(super) fn into_then(self) -> super::action::Action {
        match self {
            Spread::Keyspace(f) => f.then,
            Spread::Monitor(f) => f.then,
        }
    }

    /// The command as decided, forwarded once the other primaries are done.
    pub(super) fn then(&self) -> &super::action::Action {
        match self {
            Spread::Keyspace(f) => &f.then,
            Spread::Monitor(f) => &f.then,
        }
    }
}

/// What the session's own connections must do before a command can be placed: the map
/// changed under them. Carried out once nothing is in flight, then the command is decided
/// again (`ClusterSession::prepare`, reached through `Session::prepare`).
pub(super) enum Prepare {
    /// The client's own login has no connection to this primary, which the map gained (a
    /// failover, a new node): logged in there too (`login`).
    LoginJoin(u16),
}

impl Prepare {
    /// The client's reply (its connection then closes) when the command still needs this
    /// right after it was carried out: the map changed again meanwhile.
    pub(super) fn unmet(&self) -> Bytes {
        match self {
            Prepare::LoginJoin(_) => crate::protocol::answers::own_login_lost("a new primary"),
        }
    }
}

impl ClusterSession<'_> {
    /// Hook after the client's protocol changed (HELLO): the session's own connections to
    /// the nodes (keyspace notifications, tracking and login, listeners) follow it.
    pub(super) fn conns_follow_proto(&mut self) {
        self.keyspace_follow_proto();
        self.own_conns_follow_proto();
        self.listeners_follow_proto();
    }

    /// Carries out the other primaries' part of `spread`; returns the command for the home
    /// connection.
    pub(super) async fn spread(&mut self, spread: Spread) -> super::action::Action {
        match spread {
            Spread::Keyspace(fanout) => self.keyspace_fanout(fanout).await,
            Spread::Monitor(fanout) => self.monitor_fanout(fanout).await,
        }
    }

    /// Hook before an upstream message is handled, for what the other primaries wait on:
    /// the home connection's confirmation of a keyspace subscription or of MONITOR.
    pub(super) fn spread_confirmed(&mut self, msg: &crate::upstream::Reply) {
        self.keyspace_confirmed(msg);
        self.monitor_confirmed(msg);
    }

    /// Carries out `prepare`; the client's reply when it could not be (the connection then
    /// closes).
    pub(super) async fn prepare(&mut self, prepare: Prepare) -> Result<(), Bytes> {
        match prepare {
            Prepare::LoginJoin(node) => self.login_join(node).await,
        }
    }

    /// The reply `msg` carries when it answers, with no connection error, a command named
    /// one of `names` (by the reply slot of its sequence number): what the spread hooks wait
    /// for from the home connection.
    fn answer_to<'m>(
        &self,
        msg: &'m crate::upstream::Reply,
        names: &[&str],
    ) -> Option<&'m bytes::Bytes> {
        let crate::upstream::Reply::Batch {
            data,
            error: None,
            seq,
            ..
        } = msg
        else {
            return None;
        };
        let slot = self
            .queue
            .slot_of(*seq)
            .and_then(|i| self.queue.slots.get(i));
        matches!(slot, Some(super::reply_queue::Slot::Upstream { handling, .. })
            if handling.name.is_some_and(|spec| names.contains(&spec.name)))
        .then_some(data)
    }
}

impl Gather {
    /// SSUBSCRIBE/SUNSUBSCRIBE: its confirmations reach the client even with CLIENT REPLY OFF
    /// or SKIP, as Redis pushes them like messages.
    pub(super) fn confirms_subscriptions(&self) -> bool {
        matches!(self, Gather::ShardPubSub(_))
    }
}

/// A per-node connection's push target (keyspace notifications, MONITOR): `push` behind a
/// task that passes a push only while `admits(gate, frame)`, judged and sent under the gate's
/// lock, so a change the session makes to the gate is seen either before a push is judged or
/// after it is in the session's channel; the push budget of what it drops is given back. The
/// connection's end passes; the proxy's own subscriptions (`Reply::Subscriptions`) have
/// nowhere to move and are dropped.
fn gated<T: Send + 'static>(
    push: crate::upstream::conn::PushTarget,
    gate: Arc<std::sync::Mutex<T>>,
    admits: fn(&T, &[u8]) -> bool,
) -> crate::upstream::conn::PushTarget {
    use crate::upstream::Reply;
    let (tx, mut rx) = crate::upstream::reply_channel();
    let to = push.to.clone();
    let budget = push.budget.clone();
    tokio::spawn(async move {
        while let Some(reply) = rx.recv().await {
            match reply {
                Reply::Push(frame, permits) => {
                    // A poisoned lock still holds a consistent gate (each change is one
                    // assignment or set operation).
                    let gate = gate.lock().unwrap_or_else(|e| e.into_inner());
                    if !admits(&gate, &frame) {
                        budget.add_permits(permits as usize);
                    } else if to.send(Reply::Push(frame, permits)).is_err() {
                        return;
                    }
                }
                Reply::Subscriptions(..) => {}
                other => {
                    if to.send(other).is_err() {
                        return;
                    }
                }
            }
        }
    });
    crate::upstream::conn::PushTarget { to: tx, ..push }
}

/// A command to send again, and where. Here, not in `redirect`, because `transaction` acts on
/// it too (a transaction's queued commands redirected) and `redirect` imports `transaction`.
enum Again {
    /// MOVED or ASK: to the node named.
    Redirect(Redirect),
    /// TRYAGAIN (a multi-key command whose keys are split by a migration in progress): to the
    /// same node, after a short wait.
    TryAgain(Arc<str>),
}

impl Again {
    fn addr(&self) -> &Arc<str> {
        match self {
            Again::Redirect(r) => r.addr(),
            Again::TryAgain(addr) => addr,
        }
    }

    fn is_ask(&self) -> bool {
        matches!(self, Again::Redirect(Redirect::Ask { .. }))
    }
}

/// Whether a reply frame asks for the command to be sent again.
fn again_of(frame: &[u8], answered_by: &str) -> Option<Again> {
    if frame.starts_with(b"-TRYAGAIN") {
        return Some(Again::TryAgain(answered_by.into()));
    }
    redirect_of(frame, answered_by).map(Again::Redirect)
}

/// The redirection a reply frame is, if it is one.
fn redirect_of(frame: &[u8], answered_by: &str) -> Option<Redirect> {
    if frame.first() != Some(&b'-') {
        return None;
    }
    Redirect::parse(frame, answered_by).ok().flatten()
}
