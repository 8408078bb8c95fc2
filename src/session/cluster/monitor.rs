//! Cluster mode: MONITOR shows the commands of every primary.
//!
//! A node's MONITOR shows only the commands that node runs, and a client of the proxy sees
//! one server: its `MONITOR` must show every command of the keyspace, whichever node ran it.
//! So before the client's MONITOR goes to its home node (on the session's dedicated
//! connection, as in front of one Redis), the proxy opens one extra connection to every other
//! primary that is up and sends MONITOR there too, waiting for each `+OK`. A gate between
//! those connections and the session passes their lines only once the home node's `+OK` has
//! been seen (before it is queued for the client), so no line of another node comes before
//! the client's `+OK`. Lines of several nodes interleave as they arrive: each node's stay in
//! its order, and the times they carry are the nodes' own.
//!
//! The extra connections are dialled, not taken from the warm stock: taking one of every
//! node's would set every node's stock refilling, and the refills' handshakes would show in
//! the very MONITOR just opened (Redis's own `unit/introspection` checks the next lines).
//!
//! Limits: a primary the map gains later (a failover, a new node) is not monitored, and an
//! extra connection that ends (its node failed) is not opened again: the client keeps the
//! lines of the others (logged). Not spread, as in front of one node before: inside MULTI
//! (Redis refuses MONITOR in a transaction), with routes (each route is its own server),
//! for a session logged in upstream as its own Redis user on one connection only
//! (`Holds::OTHER_USER`: the extra connections would be the pool's user, which may see what
//! Redis refuses the client's; a login over every primary logs them in as the user), and a
//! second MONITOR while monitoring (Redis ignores it). RESET and the client's end close them.

use super::plan::{MonitorSpread, Spread};
use super::state::ClusterMonitor;
use super::state::Stock;
use super::{ClusterSession, ClusterView};
use crate::protocol::codec;
use crate::session::action::{Action, Spreading};
use crate::session::conn::Target;
use crate::session::effect::Effect;
use crate::topology::cluster::Router;
use crate::upstream::conn::PushTarget;
use crate::upstream::{Batch, Expect, Reply, ReplyWait};
use std::sync::{Arc, Mutex, MutexGuard};

/// The `conn_id` bits of the extra connections: bit 62 alone, which no other kind of the
/// session's per-node connections has (`shard_subs`, `keyspace`, `tracking`, `login`).
const MONITOR_CONN: u64 = 1 << 62;

/// The three bits that tell the kinds of per-node connections apart.
const KIND_BITS: u64 = 7 << 61;

/// Whether the connection id `id` (of a `Reply::PinnedClosed`) is an extra MONITOR
/// connection's.
pub(in crate::session) fn is_monitor_conn(id: u64) -> bool {
    id & KIND_BITS == MONITOR_CONN
}

/// Locks a gate; a poisoned lock still holds a consistent flag.
fn lock(gate: &Mutex<bool>) -> MutexGuard<'_, bool> {
    gate.lock().unwrap_or_else(|e| e.into_inner())
}

/// The extra connection's push target: `push` behind the gate, which passes its lines while
/// `open` and returns the push budget of those it drops. A line passes under the gate's lock
/// (`super::gated`), so once the gate is closed no line is on its way: one that passed is in
/// the session's channel already, before the reply of the RESET that closed it.
fn gated(push: PushTarget, open: Arc<Mutex<bool>>) -> PushTarget {
    super::gate::gated(push, open, |open, _| *open)
}

impl ClusterSession<'_> {
    /// Opens a MONITOR on every primary but `fanout.home` that is up; returns the MONITOR
    /// for the home connection.
    pub(in crate::session) async fn monitor_fanout(&mut self, fanout: MonitorSpread) {
        let router = self.cluster.router.clone();
        let open = Arc::new(Mutex::new(false));
        let mut conns = Vec::new();
        let mut waits = Vec::new();
        let primaries: Vec<u16> = router.snapshot().primaries().to_vec();
        for node in primaries {
            // A node whose shared connections are all down could take the whole connect
            // timeout; its commands are not shown.
            if node == fanout.home || !router.pool(node).any_up() {
                continue;
            }
            let id = MONITOR_CONN | u64::from(node);
            let push = gated(self.push_target(id), open.clone());
            let conn = match self
                .open_node_conn(&router, node, id, push, Stock::Dial)
                .await
            {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(
                        id = self.client.id,
                        node = %router.addr(node),
                        error = %String::from_utf8_lossy(&e).trim_end(),
                        "no connection to monitor a primary; its commands are not shown"
                    );
                    continue;
                }
            };
            let (reply_to, rx) = crate::upstream::reply_channel();
            let sent = conn.tx.try_send(Batch {
                bytes: codec::encode(&[b"MONITOR"]),
                expect: Expect::Monitor,
                wait: ReplyWait::Prompt,
                reply_to,
                seq: 0,
            });
            if sent.is_ok() {
                waits.push((node, rx));
                conns.push(conn);
            }
        }
        // Every `+OK` before the client's MONITOR goes: from then on every node shows the
        // commands it runs.
        let mut failed = Vec::new();
        for (node, mut rx) in waits {
            let ok = match rx.recv().await {
                Some(Reply::Batch {
                    data, error: None, ..
                }) => data.starts_with(b"+OK"),
                _ => false,
            };
            if !ok {
                tracing::warn!(
                    id = self.client.id,
                    node = %router.addr(node),
                    "a primary refused MONITOR; its commands are not shown"
                );
                failed.push(node);
            }
        }
        conns.retain(|c| !failed.contains(&c.node));
        self.cluster.monitor = Some(Box::new(ClusterMonitor { conns, open }));
    }

    /// Hook before an upstream message is handled: the home connection's `+OK` to the
    /// client's MONITOR opens the gate of the other primaries' lines (before the reply is
    /// queued for the client, so they come after it); its error (the client is not
    /// monitoring) closes the other primaries' MONITORs.
    pub(in crate::session) fn monitor_confirmed(&mut self, msg: &Reply) {
        let Some(monitor) = self.cluster.monitor.as_deref() else {
            return;
        };
        let Some(data) = self.answer_to(msg, &["monitor"]) else {
            return;
        };
        if data.starts_with(b"+OK") {
            *lock(&monitor.open) = true;
        } else if data.first() == Some(&b'-') {
            self.cluster.monitor = None;
        }
    }

    /// Hook for a `Reply::PinnedClosed` of an extra MONITOR connection: that node's commands
    /// are no longer shown (logged); the session goes on. Returns `true`: consumed.
    pub(in crate::session) fn monitor_ended(&mut self, id: u64) -> bool {
        let Some(monitor) = self.cluster.monitor.as_deref_mut() else {
            return true;
        };
        if let Some(at) = monitor.conns.iter().position(|c| c.id == id) {
            let conn = monitor.conns.swap_remove(at);
            tracing::warn!(
                id = self.client.id,
                node = conn.node,
                "a primary's MONITOR connection ended; its commands are no longer shown"
            );
        }
        true
    }
}

impl ClusterView<'_> {
    /// Hook in `place`: a MONITOR for the home node becomes `Action::Spread` when it is to
    /// show every primary's commands (module comment); anything else stays as it is.
    pub(in crate::session) fn monitor_route(&self, router: &Router, action: Action) -> Action {
        let home = match action.forwarded() {
            Some((Target::Dedicated(home), Effect::Monitor, _)) => home,
            _ => return action,
        };
        let monitoring = self.cluster.monitor.is_some();
        if monitoring
            || router.routes().is_some()
            || self.conn.in_multi()
            || self.own_login_on_one_node()
        {
            return action;
        }
        Action::Spread(Box::new(Spreading {
            spread: Spread::Monitor(MonitorSpread { home }),
            then: action,
        }))
    }

    /// Hook in `place`: a RESET about to go closes the gate, so no other node's line comes
    /// after its reply (the home node's stop with it; RESET then drops the connections).
    pub(in crate::session) fn monitor_stops(&self, action: &Action) {
        if let Some(monitor) = self.cluster.monitor.as_deref()
            && matches!(action.forwarded(), Some((_, Effect::Reset, _)))
        {
            *lock(&monitor.open) = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_connection_ids_are_no_other_kinds() {
        for n in [0u64, 1, 2, 15] {
            let id = MONITOR_CONN | n;
            assert!(is_monitor_conn(id));
            assert!(!super::super::keyspace::is_keyspace_conn(id));
            assert!(!super::super::login::is_login_conn(id));
            assert!(!super::super::tracking::is_listener_conn(id));
            assert!(!super::super::tracking::is_tracking_conn(id));
            assert_eq!(id & (1 << 63), 0, "a shard connection's bit");
        }
        assert!(!is_monitor_conn(3 << 62));
        assert!(!is_monitor_conn(7));
    }
}
