//! XREAD … BLOCK of streams in several slots (`Split::then_block`): first the split read
//! without BLOCK, which answers at once when any stream has entries (as Redis does), then,
//! when none has, one `XREAD … BLOCK` per slot, each on a one-off connection of its own,
//! raced by a task of its own: the first reply with entries (or an error) answers the client,
//! the others are dropped with their connections (XREAD consumes nothing, so nothing is lost:
//! the client reads those entries next time, from the ids it still holds). The task answers
//! through the session's reply channel in the command's place in the reply order, so the
//! session keeps reading while it blocks: a client that leaves is noticed
//! (`io::on_readable` cancels the task, which closes the connections, unblocking them
//! upstream) instead of holding a connection per slot until an entry comes.
//!
//! Another client's `CLIENT UNBLOCK` of this client reaches the first slot's connection
//! (`ClientIds::register_blocked`): Redis answers the XREAD there with its null (`TIMEOUT`)
//! or its `-UNBLOCKED` error, which the race answers the client with, as one Redis would. So
//! the first null ends the race: the slots' reads block for the same time, so the first to
//! time out is every slot's timeout.

use super::ClusterSession;
use super::again::may_redirect;
use super::plan::{BlockingRead, Split};
use crate::protocol::answers;
use crate::protocol::error::{ProxyError, UpstreamError, error_reply};
use crate::session::client::ReplyMode;
use crate::session::client_ids::{Registration, Upstream};
use crate::session::conn::Target;
use crate::session::reply_queue::{Handling, Slot, Unusual};
use crate::upstream::{Batch, Expect, Reply, ReplyReceiver, ReplySender};
use bytes::Bytes;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// The target the session's commands after a raced read are measured against
/// (`ReplyQueue::inflight_target`): no connection is it, so each waits for the race's reply
/// (`Routing::blocks`), as commands pipelined after a blocking command run after it on one
/// Redis.
const RACE_TARGET: Target = Target::Dedicated(u16::MAX);

impl ClusterSession<'_> {
    /// Carries out an XREAD … BLOCK split by slot (`split.then_block` is set): `Some` reply
    /// when the client is answered now (entries, an error, or the race could not start),
    /// `None` when the race answers its reply slot later.
    pub(in crate::session) async fn blocking_read(&mut self, mut split: Split) -> Option<Bytes> {
        let block = split.then_block.take()?;
        let strip = split.strip.clone();
        let reply = self.split(split).await;
        if !is_null(&reply) {
            return Some(reply);
        }
        let (conns, rx) = match self.open_race(&block).await {
            Ok(opened) => opened,
            Err(reply) => return Some(reply),
        };
        let seq = self.queue.next_seq;
        self.queue.next_seq = seq.wrapping_add(1);
        let handling = Handling {
            suppress: self.client.reply_mode != ReplyMode::On,
            blocking: true,
            wait: block.wait,
            unusual: Unusual {
                strip,
                ..Unusual::default()
            }
            .boxed_if_any(),
            ..Handling::default()
        };
        self.queue.queued += 1;
        self.queue.slots.push_back(Slot::Upstream {
            commands: 1,
            handling,
            read_at: self.input.read_at,
            sent: None,
            seq,
            parts: 1,
        });
        self.queue.inflight += 1;
        self.queue.inflight_target = Some(RACE_TARGET);
        let (cancel, cancelled) = oneshot::channel();
        self.cluster.blocked_read = Some(cancel);
        let race = Race {
            conns,
            rx,
            reply_to: self.queue.reply_sender(),
            seq,
            router: self.cluster.router.clone(),
        };
        tokio::spawn(race.run(cancelled));
        if self.client.reply_mode == ReplyMode::Skip {
            self.client.reply_mode = ReplyMode::On;
        }
        None
    }

    /// One connection per slot of `block`, each counted against the client's tenant, its
    /// command sent with the race's reply channel (`seq`: the group's index); the client's
    /// reply when one could not be opened (those opened are closed, unblocking them).
    async fn open_race(
        &mut self,
        block: &BlockingRead,
    ) -> Result<(Vec<Held>, ReplyReceiver), Bytes> {
        let router = self.cluster.router.clone();
        let proto = self.client.proto;
        let (tx, rx) = crate::upstream::reply_channel();
        let mut conns = Vec::with_capacity(block.groups.len());
        for (i, (node, command)) in block.groups.iter().enumerate() {
            let unavailable = |reason: &str| {
                error_reply(&ProxyError::Upstream(UpstreamError::Unavailable {
                    addr: router.addr(*node),
                    reason: reason.into(),
                }))
            };
            let share = Box::pin(crate::session::conn::take_share(self.ctx, self.client))
                .await
                .map_err(|why| unavailable(&why))?;
            let push = super::exchange::unheard_push();
            let opened = Box::pin(router.pool(*node).dedicated(proto, push, false))
                .await
                .map_err(|e| error_reply(&ProxyError::Upstream(e)))?;
            let batch = Batch {
                bytes: command.clone(),
                expect: Expect::Frames(1),
                wait: block.wait,
                reply_to: tx.clone(),
                seq: i as u16,
            };
            if opened.tx.send(batch).await.is_err() {
                return Err(unavailable("connection closed"));
            }
            let named = match opened.upstream_id {
                Some(id) if conns.is_empty() => Some(
                    self.ctx
                        .client_ids
                        .register_blocked(self.client.id, Upstream { node: *node, id }),
                ),
                _ => None,
            };
            conns.push(Held {
                _tx: opened.tx,
                _share: share,
                _named: named,
            });
        }
        Ok((conns, rx))
    }
}

/// One slot's blocking connection, held while the race runs.
struct Held {
    /// The connection: dropped, it closes, which unblocks its XREAD upstream.
    _tx: mpsc::Sender<Batch>,
    /// Counts the connection against the client's tenant while it lives (`tenant_quota`).
    _share: crate::session::tenant_quota::Share,
    /// The first slot's: where another client's `CLIENT UNBLOCK` of this one goes (module
    /// comment).
    _named: Option<Registration>,
}

/// The task that waits for the slots' replies.
struct Race {
    /// The slots' connections, closed when the race ends.
    conns: Vec<Held>,
    /// Where their replies come (`Reply::Batch::seq`: the slot's index).
    rx: ReplyReceiver,
    /// The session's reply channel, which takes the one answer.
    reply_to: ReplySender,
    /// The reply slot the session keeps for it.
    seq: u16,
    /// For the nodes' addresses in errors, and a map refresh when a slot moved.
    router: Arc<crate::topology::cluster::Router>,
}

impl Race {
    /// Waits for the first reply: entries, an error, or a null (the slots timed out, or
    /// another client's `CLIENT UNBLOCK`), or for `cancelled` (the client left: its sender
    /// dropped); answers the session and closes every connection.
    async fn run(mut self, mut cancelled: oneshot::Receiver<()>) {
        let data = loop {
            let msg = tokio::select! {
                _ = &mut cancelled => break answers::blocking_read_cancelled(),
                msg = self.rx.recv() => msg,
            };
            let (data, error) = match msg {
                Some(Reply::Batch { data, error, .. }) => (data, error),
                // A connection's end (`PinnedClosed` goes to its own push channel, not here).
                Some(_) => continue,
                // Every connection ended without a reply.
                None => break answers::blocking_read_lost(),
            };
            if let Some(e) = error.filter(|_| data.is_empty()) {
                break error_reply(&ProxyError::Upstream(*e));
            }
            if may_redirect(&data) {
                // A stream's slot moved while the read blocked: a redirection the client
                // could not follow. Nothing was read; it may send the command again.
                self.router.refresh_soon();
                break answers::blocking_read_moved();
            }
            break data;
        };
        drop(self.conns);
        let _ = self.reply_to.send(Reply::Batch {
            data,
            missing: 0,
            error: None,
            seq: self.seq,
        });
    }
}

/// Whether `reply` is XREAD's "no entries" (a null array in RESP2, a null in RESP3).
fn is_null(reply: &[u8]) -> bool {
    reply == b"*-1\r\n" || reply == b"_\r\n"
}
