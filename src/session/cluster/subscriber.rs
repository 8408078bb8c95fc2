//! Cluster mode: a classic subscriber (`SUBSCRIBE`, `PSUBSCRIBE`) whose node fails moves to
//! another node. Redis Cluster sends every `PUBLISH` to every node over its bus, so the
//! subscriptions may live on any node; the session's dedicated connection went to its home
//! node, and when that connection fails the proxy subscribes the same channels and patterns
//! on another primary that is up instead of ending the session. Messages published in
//! between are lost, as on any Redis reconnect. A connection holding other state as well
//! (MULTI, WATCH, MONITOR, CLIENT TRACKING, a client's own AUTH) still ends the session:
//! that state cannot move.

use super::ClusterSession;
use crate::protocol::codec;
use crate::session::conn::{Dedicated, Holds};
use crate::upstream::{Batch, Expect, ReplySender, ReplyWait, Subscriptions};

impl ClusterSession<'_> {
    /// The dedicated connection `conn_id` failed holding `subs`: subscribe them again on a
    /// dedicated connection to another primary that is up, which becomes the session's
    /// (the old one's `PinnedClosed` is then ignored). Leaves the session to end as before
    /// when it holds other state or no node can take the subscriptions, and in routes mode.
    pub(in crate::session) async fn move_subscriber(&mut self, conn_id: u64, subs: Subscriptions) {
        let router = self.cluster.router.clone();
        // With routes a channel belongs to its route's server: subscribed anywhere else it
        // would miss that server's messages, so the session ends as in front of one server.
        if router.routes().is_some() {
            return;
        }
        let Some(old) = self
            .conn
            .dedicated
            .as_ref()
            .filter(|_| conn_id == self.conn.dedicated_gen)
        else {
            return;
        };
        let movable = self.conn.holds(Holds::SUBSCRIPTIONS)
            && !self.conn.in_multi()
            && !self.conn.held.other_than(Holds::SUBSCRIPTIONS);
        if !movable {
            return;
        }
        let (dead, proto) = (old.node, old.proto);
        let up = |n: u16| n != dead && router.pool(n).any_up();
        let snapshot = router.snapshot();
        let Some(node) = router
            .pubsub_node()
            .filter(|&n| up(n))
            .or_else(|| snapshot.primaries().iter().copied().find(|&n| up(n)))
        else {
            return;
        };
        drop(snapshot);
        let push = self.push_target(self.conn.dedicated_gen + 1);
        let Ok(crate::upstream::dedicated::Opened { tx, confined, .. }) =
            router.pool(node).dedicated(proto, push, false).await
        else {
            return;
        };
        // The confirmations are the proxy's, not the client's: they go to a channel nobody
        // reads. The connection tracks the subscriptions from them all the same.
        let (hidden, _) = crate::upstream::reply_channel();
        for batch in pubsub_batches(SUBSCRIBE, &subs, &hidden) {
            if tx.send(batch).await.is_err() {
                return;
            }
        }
        tracing::info!(
            id = self.client.id,
            from = %router.addr(dead),
            to = %router.addr(node),
            channels = subs.channels.len(),
            patterns = subs.patterns.len(),
            "subscriber's node failed; subscribed again on another node"
        );
        self.conn.dedicated_gen += 1;
        // The connection it replaces was counted against the tenant: this one is now.
        let share = self.conn.dedicated.take().and_then(|d| d._share);
        self.conn.dedicated = Some(Dedicated {
            tx,
            proto,
            node,
            confined,
            _id: None,
            _share: share,
        });
        // Notifications of the new node's keys now come on this connection: its extra one
        // goes, and nodes without one get one.
        Box::pin(self.keyspace_rehome(node)).await;
    }
}

/// `SUBSCRIBE` and `PSUBSCRIBE`, in the order `pubsub_batches` takes them.
pub(super) const SUBSCRIBE: [&[u8]; 2] = [b"SUBSCRIBE", b"PSUBSCRIBE"];
/// `UNSUBSCRIBE` and `PUNSUBSCRIBE`, likewise.
pub(super) const UNSUBSCRIBE: [&[u8]; 2] = [b"UNSUBSCRIBE", b"PUNSUBSCRIBE"];

/// One batch per kind of name in `subs` that has any: `commands[0]` with the channels,
/// `commands[1]` with the patterns, each expecting the confirmation per name Redis gives,
/// which goes to `reply_to` (the proxy's, not the client's).
pub(super) fn pubsub_batches(
    commands: [&[u8]; 2],
    subs: &Subscriptions,
    reply_to: &ReplySender,
) -> Vec<Batch> {
    let mut out = Vec::with_capacity(2);
    for (command, names) in commands.into_iter().zip([&subs.channels, &subs.patterns]) {
        if names.is_empty() {
            continue;
        }
        let mut args: Vec<&[u8]> = vec![command];
        args.extend(names.iter().map(|n| &n[..]));
        out.push(Batch {
            bytes: codec::encode(&args),
            expect: Expect::Confirmations(names.len() as u32),
            wait: ReplyWait::Prompt,
            reply_to: reply_to.clone(),
            seq: 0,
        });
    }
    out
}
