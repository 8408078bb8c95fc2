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
//!   patterns, which name keys on any node; `blocking_read` XREAD … BLOCK across slots,
//!   which blocks on every slot at once in a task of its own;
//! - `redirect`: MOVED, ASK and TRYAGAIN followed, and a batch routed again after its node
//!   failed;
//! - `exchange`: a batch sent to one node outside the session's reply order and its replies
//!   awaited (`send_shared`, `receive`), for `gather` and `redirect` alike;
//! - `merge`: the nodes' replies made into the client's one: pure functions over reply bytes,
//!   no session;
//! - `transaction`, `subscriber`, `shard_subs`: pinned state that moves with its slot or node;
//! - `keyspace`: keyspace notifications, published only on the key's node, heard from every
//!   primary over extra pub/sub connections;
//! - `monitor`: MONITOR, which shows only its node's commands, opened on every primary;
//! - `tracking`, `login`: CLIENT TRACKING and the client's own login over every primary;
//!   `flush_news`: which of the primaries' invalidations of everything at a flush reach the
//!   client (held in `state`, heard by `tracking`).
//!
//! Below them all, data they share: `plan` (what `place` decides the cluster carries out:
//! `Gather`, `Spread`, `Prepare`, held by `Action`), `state` (`ClusterState` and the
//! session's own node connections), `view` (`ClusterSession`, `ClusterView`: the session as
//! the steps see it), `again` (a reply's MOVED/ASK/TRYAGAIN) and `gate` (the push gate of
//! the extra connections). They import each other one way only (`tests/import_cycles.rs`):
//! `place` → `gather` → `exchange`, `sort` → `gather`, `blocking_read` → `gather`, `redirect` → the concerns whose
//! connection ids it tells apart, and `merge` below the steps. Here: the hooks every
//! concern takes part in (`spread`, `prepare`, `conns_follow_proto`, `answer_to`).

use bytes::Bytes;
use plan::{Prepare, Spread};

mod again;
mod blocking_read;
mod exchange;
mod flush_news;
mod gate;
mod gather;
mod hll;
mod info;
pub(super) mod keyspace;
pub(super) mod login;
mod merge;
pub(super) mod monitor;
mod place;
pub(super) mod plan;
mod redirect;
pub(super) mod shard_subs;
mod sort;
pub(super) mod state;
mod subscriber;
pub(super) mod tracking;
mod transaction;
mod view;

pub(super) use place::as_standalone;
pub(super) use view::{ClusterSession, ClusterView};

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
    pub(super) async fn spread(&mut self, spread: Spread) {
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
