//! Cluster mode: sharded pub/sub (`SSUBSCRIBE`) across nodes and through slot moves.
//!
//! A real cluster client holds one connection per node, so it may subscribe to shard channels
//! owned by several nodes. The proxy does the same for a session: one dedicated pub/sub
//! connection per node holding its shard subscriptions, opened with the session's reply
//! channel as push target, so messages from every node arrive where the session already
//! reads. The session, not the connections, answers the client's `SSUBSCRIBE` and
//! `SUNSUBSCRIBE`: a node's confirmations count only that node's channels, while Redis counts
//! every shard channel of the client.
//!
//! When a slot leaves a node (migration or failover), Redis tells the subscriber with an
//! unsolicited `sunsubscribe` for each channel of the slot; a node that fails ends its
//! connection. Either way the proxy hides it and subscribes the channels again on the slot's
//! new owner, found in the map or through the MOVED the old owner answers. Only when that
//! fails within a bounded time does the client get the `sunsubscribe` Redis would have sent.
//! Messages for a channel the session no longer tracks (the client unsubscribed while they
//! were on their way) are dropped, as Redis would not have sent them.
//!
//! Nothing here runs outside cluster mode: the hooks are reached from `place`,
//! `follow_redirects` and `execute`'s cluster-only action, and the session holds only an
//! empty `Option<Box<ShardSubs>>` until its first `SSUBSCRIBE`.

use super::plan::{Gather, ShardCommand};
use super::state::{NodeConn, Stock, confirmation};
use super::{ClusterSession, ClusterView};
use crate::commands::classify::Kind;
use crate::protocol::codec::Decoded;
use crate::protocol::error::{ProxyError, UpstreamError, error_reply};
use crate::protocol::reply::{PubSubFrame, SubKind};
use crate::session::action::Action;
use crate::session::conn::Holds;
use crate::session::conn::take_share;
use crate::session::effect::LocalEffect;
use crate::session::reply_queue::PUSH_BUDGET;
use crate::session::route::Args;
use crate::topology::cluster::{Redirect, Router};
use crate::upstream::conn::PushTarget;
use crate::upstream::{Batch, Expect, Reply, ReplyWait};
use crate::{commands::classify, protocol::answers, protocol::codec};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

use bytes::{Bytes, BytesMut};

/// Set in the `conn_id` of shard connections, so that their end (`Reply::PinnedClosed`) is
/// never taken for the end of the session's dedicated connection, whose ids count from 1.
const SHARD_CONN: u64 = 1 << 63;
/// Pause between two attempts to subscribe on a slot's owner, while the map catches up with
/// a failover or a migration.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Least time given to a client's own `SSUBSCRIBE` before it gets the error.
const MIN_RESUBSCRIBE: Duration = Duration::from_secs(1);
/// The node of a channel being subscribed again in the background: counted as held (the
/// client was not told otherwise), on no connection yet.
const PENDING: u16 = u16::MAX;
/// The `conn_id` of the wake-up a retry timer sends on the session's reply channel; it has
/// `SHARD_CONN` set and no connection's id reaches it.
const RETRY_WAKE: u64 = u64::MAX;
/// Pause between background attempts for channels whose owner could not take them yet (a
/// failover in progress): short, as each attempt costs one map lookup unless the owner is up.
pub(super) const RETRY_EVERY: Duration = Duration::from_millis(250);

/// Why subscribing on a node did not work.
enum Failure {
    /// The node no longer owns the slot: it is at this address.
    Moved(Arc<str>),
    /// Anything else (node down, migration in progress, an error reply): this reply, which
    /// the client gets if no attempt succeeds.
    Other(Bytes),
}

impl ClusterSession<'_> {
    /// Carries out a sharded pub/sub command; the reply is every confirmation, as Redis
    /// would give them.
    pub(in crate::session) async fn shard_command(&mut self, command: ShardCommand) -> Bytes {
        let router = self.cluster.router.clone();
        let reply = match command {
            ShardCommand::Subscribe { channels, slot } => {
                let within = resubscribe_within(&router);
                let reply = match self
                    .subscribe_on_owner(&router, slot, &channels, within)
                    .await
                {
                    Ok(node) => {
                        let Some(reply) = self.record_subscribed(node, channels) else {
                            return answers::shard_pubsub_needs_cluster();
                        };
                        reply
                    }
                    Err(reply) => reply,
                };
                self.adopt_orphans().await;
                reply
            }
            ShardCommand::Unsubscribe { channels } => {
                let Some(reply) = self.shard_unsubscribe(channels) else {
                    return answers::shard_pubsub_needs_cluster();
                };
                reply
            }
        };
        self.tidy_shard_subs();
        reply
    }

    /// `channels`, now subscribed on `node`, recorded as held there: the confirmations, each
    /// counting every shard channel of the session as Redis does. A channel held on another
    /// node before (its slot moved) is unsubscribed there. `None` outside cluster mode.
    fn record_subscribed(&mut self, node: u16, channels: Vec<Bytes>) -> Option<Bytes> {
        let proto = self.client.proto;
        let subs = self.cluster.shard_subs_or_new();
        let mut out = BytesMut::new();
        let mut stale = Vec::new();
        for c in channels {
            if let Some(old) = subs.channels.insert(c.clone(), node)
                && old != node
            {
                stale.push((old, c.clone()));
            }
            let count = subs.channels.len();
            out.extend_from_slice(&confirmation(proto, "ssubscribe", Some(&c), count));
        }
        for (old, c) in stale {
            self.unsubscribe_upstream(old, &c);
        }
        Some(self.visible(out.freeze()))
    }

    /// `SUNSUBSCRIBE` of `channels` (every shard channel when empty), upstream and in the
    /// session's record: the confirmations Redis would give. `None` outside cluster mode.
    fn shard_unsubscribe(&mut self, channels: Vec<Bytes>) -> Option<Bytes> {
        let proto = self.client.proto;
        let subs = self.cluster.shard_subs_or_new();
        let out = if channels.is_empty() {
            subs.unsubscribe_all(proto)
        } else {
            let (out, gone) = subs.unsubscribe_some(proto, channels);
            for (node, c) in gone {
                self.unsubscribe_upstream(node, &c);
            }
            out
        };
        Some(self.visible(out))
    }

    /// Hook in `follow_redirects` for what is not a batch reply: pushes and connection ends.
    /// Returns `true` when the message is consumed here (hidden from the client).
    pub(in crate::session) async fn shard_event(&mut self, msg: &mut Reply) -> bool {
        let resubscribe = match msg {
            Reply::Push(frame, permits, _) => {
                let (kind, channel) = match crate::protocol::reply::classify_pubsub(frame) {
                    PubSubFrame::Message
                        if crate::protocol::reply::element(frame, 0)
                            .is_some_and(|k| k.eq_ignore_ascii_case(b"smessage")) =>
                    {
                        (None, crate::protocol::reply::element(frame, 1))
                    }
                    PubSubFrame::Confirmation {
                        kind: SubKind::Shard,
                        subscribe,
                    } => (Some(subscribe), crate::protocol::reply::element(frame, 1)),
                    _ => return false,
                };
                let tracked = channel.and_then(|c| {
                    self.cluster
                        .shard_subs()
                        .and_then(|s| s.channels.get_key_value(c))
                });
                // Not one of the per-node connections' channels: the dedicated connection's
                // own (a client logged in as its own user subscribes there), Redis's to send.
                if tracked.is_none()
                    && (self.cluster.shard_subs().is_none()
                        || self.conn.holds(Holds::SHARD_SUBSCRIPTIONS))
                {
                    return false;
                }
                match (kind, tracked) {
                    // A message for a channel the client holds: delivered as it is, in the
                    // protocol the client speaks now. The connections speak the one it spoke
                    // when they opened; after a HELLO 2 a RESP3 push would reach a RESP2
                    // client, which reads `smessage` as an array. Its elements (bulk
                    // strings) are the same in both.
                    (None, Some(_)) => {
                        if self.client.proto == 2 && frame.first() == Some(&b'>') {
                            let mut resp2 = bytes::BytesMut::from(&frame[..]);
                            resp2[0] = b'*';
                            *frame = resp2.freeze();
                        }
                        return false;
                    }
                    // Redis dropped the channel (its slot left the node): subscribe again.
                    (Some(false), Some((c, _))) => {
                        let c = c.clone();
                        self.queue.return_permits(*permits);
                        if let Some(subs) = self.cluster.shard_subs_mut() {
                            subs.channels.remove(&c);
                        }
                        vec![c]
                    }
                    // A message the client unsubscribed from while it was on its way, or a
                    // confirmation that belongs to no client command: Redis would not have
                    // sent it to the client.
                    _ => {
                        self.queue.return_permits(*permits);
                        return true;
                    }
                }
            }
            Reply::PinnedClosed(RETRY_WAKE) => {
                Box::pin(self.retry_pending()).await;
                return true;
            }
            Reply::PinnedClosed(id) if *id & SHARD_CONN != 0 => {
                let id = *id;
                let Some(subs) = self.cluster.shard_subs_mut() else {
                    return true;
                };
                let Some(at) = subs.conns.iter().position(|c| c.id == id) else {
                    return true;
                };
                let node = subs.conns.swap_remove(at).node;
                let lost: Vec<Bytes> = subs
                    .channels
                    .iter()
                    .filter(|&(_, &n)| n == node)
                    .map(|(c, _)| c.clone())
                    .collect();
                subs.channels.retain(|_, n| *n != node);
                lost
            }
            _ => return false,
        };
        Box::pin(self.resubscribe(resubscribe)).await;
        self.adopt_orphans().await;
        true
    }

    /// The retry timer's wake-up: the pending channels not unsubscribed meanwhile are tried
    /// again.
    async fn retry_pending(&mut self) {
        let Some(subs) = self.cluster.shard_subs_mut() else {
            return;
        };
        subs.retry_scheduled = false;
        let due: Vec<(Bytes, tokio::time::Instant)> = std::mem::take(&mut subs.pending)
            .into_iter()
            // Unsubscribed (or subscribed anew by the client) meanwhile: done.
            .filter(|(c, _)| subs.channels.get(c) == Some(&PENDING))
            .collect();
        Box::pin(self.resubscribe_until(due)).await;
    }

    /// Subscribes again the channels found dropped while subscribing others (see
    /// `ShardSubs::orphans`); those may find more, hence the loop.
    async fn adopt_orphans(&mut self) {
        loop {
            let orphans = match self.cluster.shard_subs_mut() {
                Some(subs) if !subs.orphans.is_empty() => std::mem::take(&mut subs.orphans),
                _ => return,
            };
            Box::pin(self.resubscribe(orphans)).await;
        }
    }

    /// Subscribes again channels Redis dropped, each slot's on its owner, trying for up to
    /// `resubscribe_timeout_ms` (see `resubscribe_until`).
    async fn resubscribe(&mut self, channels: Vec<Bytes>) {
        let give_up = tokio::time::Instant::now() + self.cluster.router.resubscribe_timeout();
        let due = channels.into_iter().map(|c| (c, give_up)).collect();
        self.resubscribe_until(due).await;
    }

    /// One attempt per slot to subscribe `channels` again on the slot's owner (following
    /// MOVED). A channel whose owner cannot take it now (unknown, down: a failover in
    /// progress) stays held at `PENDING` and is tried again after `RETRY_EVERY` without
    /// holding the session; one past its deadline is announced to the client with the
    /// `sunsubscribe` Redis would have sent it.
    async fn resubscribe_until(&mut self, channels: Vec<(Bytes, tokio::time::Instant)>) {
        let router = self.cluster.router.clone();
        let mut by_slot: Vec<(u16, Vec<(Bytes, tokio::time::Instant)>)> = Vec::new();
        for (c, give_up) in channels {
            let s = router.slot_of(&c);
            match by_slot.iter_mut().find(|(t, _)| *t == s) {
                Some((_, group)) => group.push((c, give_up)),
                None => by_slot.push((s, vec![(c, give_up)])),
            }
        }
        let mut failed = Vec::new();
        for (s, group) in by_slot {
            // An owner whose shared connections are all down is not tried: connecting to it
            // could take the whole connect timeout, and the refresh will name its successor.
            let reachable = router
                .snapshot()
                .owner(s)
                .is_some_and(|n| router.pool(n).any_up());
            let names: Vec<Bytes> = group.iter().map(|(c, _)| c.clone()).collect();
            let attempt = if reachable {
                self.subscribe_on_owner(&router, s, &names, Duration::ZERO)
                    .await
            } else {
                router.refresh_soon();
                Err(answers::clusterdown())
            };
            let subs = self.cluster.shard_subs_or_new();
            match attempt {
                Ok(node) => {
                    for (c, _) in group {
                        subs.channels.insert(c, node);
                    }
                }
                Err(reply) => {
                    let now = tokio::time::Instant::now();
                    for (c, give_up) in group {
                        if now < give_up {
                            subs.channels.insert(c.clone(), PENDING);
                            subs.pending.push((c, give_up));
                        } else {
                            subs.channels.remove(&c);
                            tracing::warn!(
                                id = self.client.id,
                                slot = s,
                                reply = %String::from_utf8_lossy(&reply).trim_end(),
                                "shard channel not subscribed again in time; the client is told it is gone"
                            );
                            failed.push(c);
                        }
                    }
                }
            }
        }
        let held = self.cluster.shard_subs().map_or(0, |s| s.channels.len());
        for (i, c) in failed.iter().enumerate() {
            let left = held + failed.len() - 1 - i;
            let frame = confirmation(self.client.proto, "sunsubscribe", Some(c), left);
            let frame = self.visible(frame);
            self.queue.out.push(frame);
        }
        self.schedule_retry();
        self.tidy_shard_subs();
    }

    /// Wakes the session after `RETRY_EVERY` (through its own reply channel) to retry the
    /// pending channels, unless a wake-up is already on its way.
    fn schedule_retry(&mut self) {
        let due = self
            .cluster
            .shard_subs()
            .is_some_and(|s| !s.pending.is_empty() && !s.retry_scheduled);
        if !due {
            return;
        }
        if let Some(subs) = self.cluster.shard_subs_mut() {
            subs.retry_scheduled = true;
        }
        self.wake_after(RETRY_EVERY, RETRY_WAKE);
    }

    /// Sends `Reply::PinnedClosed(id)` on the session's own reply channel after `pause`: a
    /// timer's wake-up, told from a connection's end by an `id` no connection has.
    pub(super) fn wake_after(&mut self, pause: Duration, id: u64) {
        let wake = self.queue.reply_sender();
        tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            let _ = wake.send(Reply::PinnedClosed(id));
        });
    }

    /// Subscribes `channels` (all of `slot`) on the slot's owner, following MOVED, and
    /// trying again for up to `within` while the owner is unknown, unreachable or migrating.
    /// Returns the node, or the reply that explains why not.
    async fn subscribe_on_owner(
        &mut self,
        router: &Router,
        slot: u16,
        channels: &[Bytes],
        within: Duration,
    ) -> Result<u16, Bytes> {
        let give_up = tokio::time::Instant::now() + within;
        let mut node = router.snapshot().owner(slot);
        let mut redirects = 0;
        loop {
            let failure = match node {
                Some(n) => match self.subscribe_on(router, n, channels).await {
                    Ok(()) => return Ok(n),
                    Err(Failure::Moved(addr)) if redirects < router.max_redirects() => {
                        redirects += 1;
                        self.ctx.ops.metrics.redirections_moved.inc();
                        router.apply_moved(slot, &addr);
                        node = Some(router.node(&addr));
                        continue;
                    }
                    Err(Failure::Moved(_)) => answers::too_many_redirections(slot),
                    Err(Failure::Other(reply)) => reply,
                },
                None => answers::clusterdown(),
            };
            if tokio::time::Instant::now() + RETRY_PAUSE >= give_up {
                return Err(failure);
            }
            router.refresh_soon();
            tokio::time::sleep(RETRY_PAUSE).await;
            node = router.snapshot().owner(slot);
            redirects = 0;
        }
    }

    /// Sends `SSUBSCRIBE` for each channel (one command each, so an error reply is one frame
    /// as the connection expects) to `node` and waits for the confirmations.
    async fn subscribe_on(
        &mut self,
        router: &Router,
        node: u16,
        channels: &[Bytes],
    ) -> Result<(), Failure> {
        let unavailable = |reason: String| {
            Failure::Other(error_reply(&ProxyError::Upstream(
                UpstreamError::Unavailable {
                    addr: router.addr(node),
                    reason: reason.into(),
                },
            )))
        };
        let tx = self
            .shard_conn(router, node)
            .await
            .map_err(Failure::Other)?;
        let (reply_to, mut rx) = crate::upstream::reply_channel();
        for c in channels {
            let batch = Batch {
                bytes: codec::encode(&[b"SSUBSCRIBE", c]),
                expect: Expect::Confirmations(1),
                wait: ReplyWait::Prompt,
                reply_to: reply_to.clone(),
                seq: 0,
            };
            if tx.send(batch).await.is_err() {
                return Err(unavailable("connection closed".into()));
            }
        }
        drop(reply_to);
        let origin = router.addr(node);
        for _ in channels {
            match rx.recv().await {
                Some(Reply::Batch {
                    data, error: None, ..
                }) if data.first() == Some(&b'-') => {
                    return Err(match Redirect::parse(&data, &origin) {
                        Ok(Some(Redirect::Moved { addr, .. })) => Failure::Moved(addr),
                        _ => Failure::Other(data),
                    });
                }
                Some(Reply::Batch {
                    data, error: None, ..
                }) => self.note_orphan(&data),
                Some(Reply::Batch { error: Some(e), .. }) => {
                    return Err(Failure::Other(error_reply(&ProxyError::Upstream(*e))));
                }
                _ => return Err(unavailable("connection closed".into())),
            }
        }
        Ok(())
    }

    /// An `SSUBSCRIBE` answered with a `sunsubscribe`: Redis dropped a channel (its slot
    /// left the node) just as our command was waiting, and the connection matched the push
    /// to it. Our own confirmation follows as a push, which `shard_event` drops; the dropped
    /// channel is subscribed again after the command (`adopt_orphans`).
    fn note_orphan(&mut self, frame: &[u8]) {
        let dropped = matches!(
            crate::protocol::reply::classify_pubsub(frame),
            PubSubFrame::Confirmation {
                kind: SubKind::Shard,
                subscribe: false,
            }
        );
        let Some(channel) = crate::protocol::reply::element(frame, 1).filter(|_| dropped) else {
            return;
        };
        if let Some(subs) = self.cluster.shard_subs_mut()
            && let Some((c, _)) = subs.channels.remove_entry(channel)
        {
            subs.orphans.push(c);
        }
    }

    /// The session's pub/sub connection to `node`, opened if there is none (or it ended);
    /// the client's error reply when none could be.
    async fn shard_conn(
        &mut self,
        router: &Router,
        node: u16,
    ) -> Result<mpsc::Sender<Batch>, Bytes> {
        let subs = self.cluster.shard_subs_or_new();
        subs.conns.retain(|c| !c.tx.is_closed());
        if let Some(c) = subs.conns.iter().find(|c| c.node == node) {
            return Ok(c.tx.clone());
        }
        subs.next_id += 1;
        let id = SHARD_CONN | subs.next_id;
        let push = self.push_target(id);
        let conn = self
            .open_node_conn(router, node, id, push, Stock::Take)
            .await?;
        let tx = conn.tx.clone();
        let subs = self.cluster.shard_subs_or_new();
        subs.conns.push(conn);
        Ok(tx)
    }

    /// A dedicated connection of the session to `node` beside its own (shard channels,
    /// keyspace notifications), on a share of its tenant's dedicated connections; the
    /// client's error reply when the tenant holds all of its share or the node refuses.
    pub(super) async fn open_node_conn(
        &mut self,
        router: &Router,
        node: u16,
        id: u64,
        push: PushTarget,
        from: Stock,
    ) -> Result<NodeConn, Bytes> {
        let share = match Box::pin(take_share(self.ctx, self.client)).await {
            Ok(share) => share,
            Err(why) => {
                self.ctx.ops.metrics.dedicated_refused[0].inc();
                return Err(crate::protocol::error::simple_error("ERR", &why));
            }
        };
        // Boxed: the connect + handshake future is large and rare.
        let pool = router.pool(node);
        let opened = match from {
            Stock::Take => Box::pin(pool.dedicated(self.client.proto, push, false)).await,
            Stock::Dial => Box::pin(pool.dedicated_unstocked(self.client.proto, push)).await,
        }
        .map_err(|e| error_reply(&ProxyError::Upstream(e)))?;
        let mut conn = NodeConn {
            node,
            tx: opened.tx,
            id,
            confined: opened.confined,
            upstream_id: opened.upstream_id,
            _share: share,
            listener: None,
        };
        // Boxed: rare (a client logged in as its own user), and it awaits two replies.
        Box::pin(self.log_in_as_client(router, node, &mut conn)).await?;
        Ok(conn)
    }

    /// Closes connections that hold nothing, and forgets the whole state once no shard
    /// channel is left (the session is then as if it never subscribed).
    fn tidy_shard_subs(&mut self) {
        let c = &mut *self.cluster;
        if let Some(subs) = &mut c.shard_subs {
            subs.prune();
            if subs.channels.is_empty() {
                c.shard_subs = None;
            }
        }
    }

    /// Where a dedicated connection of the session with id `conn_id` sends its pushes and its
    /// end: the session's reply channel, within the session's push budget.
    pub(super) fn push_target(&mut self, conn_id: u64) -> PushTarget {
        PushTarget {
            to: self.queue.reply_sender(),
            budget: self.queue.push_budget(),
            budget_size: PUSH_BUDGET,
            conn_id,
        }
    }

    /// Sends `SUNSUBSCRIBE channel` to the node's connection without waiting for the reply:
    /// the client's confirmation is made by the session, and a message still on its way is
    /// dropped because the channel is no longer tracked. A connection left without channels
    /// is closed instead (by `tidy_shard_subs`), which unsubscribes it as well.
    fn unsubscribe_upstream(&self, node: u16, channel: &Bytes) {
        let Some(subs) = self.cluster.shard_subs() else {
            return;
        };
        let Some(conn) = subs.conns.iter().find(|c| c.node == node) else {
            return;
        };
        let (reply_to, _) = crate::upstream::reply_channel();
        let _ = conn.tx.try_send(Batch {
            bytes: codec::encode(&[b"SUNSUBSCRIBE", channel]),
            expect: Expect::Confirmations(1),
            wait: ReplyWait::Prompt,
            reply_to,
            seq: 0,
        });
    }

    /// A frame the proxy made, with the tenant's namespace removed from channel names.
    pub(super) fn visible(&self, frame: Bytes) -> Bytes {
        match self.client.policy.access.namespace(self.client.tenant) {
            Some(prefix) => crate::policy::namespace::strip_pubsub(prefix, &frame),
            None => frame,
        }
    }
}

impl ClusterView<'_> {
    /// Hook in `place`: sharded pub/sub commands become `Action::ShardPubSub`, and a RESP2
    /// client holding shard subscriptions (and no classic ones, whose connection would say
    /// it) is held to what Redis allows in subscribed mode. `None`: nothing to do here.
    pub(in crate::session) fn shard_route(
        &self,
        action: &Action,
        args: &Args<'_>,
    ) -> Option<Action> {
        // Every cluster command passes here: without shard channels only SSUBSCRIBE matters,
        // and one comparison tells it.
        if self.cluster.shard_subs().is_none() && !args.get(0).eq_ignore_ascii_case(b"SSUBSCRIBE") {
            return None;
        }
        let kind = classify::classify(args.get(0));
        match kind {
            // Inside MULTI the command is only queued (and Redis refuses it at EXEC). A
            // client logged in as its own user on one connection subscribes there, where
            // Redis checks its channel rules: the shard connections would be the pool's
            // login, and hear channels Redis refuses that user (fail closed; pinned
            // instead). A login over every primary logs them in as the user too
            // (`log_in_as_client`).
            Kind::Subscribe(SubKind::Shard)
                if !self.conn.in_multi() && !self.own_login_on_one_node() =>
            {
                let channels = self.upstream_channels(action, args)?;
                let first = self.key_place(channels.first()?);
                if let Some(other) = channels
                    .iter()
                    .map(|c| self.key_place(c))
                    .find(|s| *s != first)
                {
                    return Some(Action::Refused(self.cross_places(first, other)));
                }
                Some(Action::Gather(Box::new(Gather::ShardPubSub(
                    ShardCommand::Subscribe {
                        channels,
                        slot: first,
                    },
                ))))
            }
            Kind::Unsubscribe(SubKind::Shard)
                if self.cluster.shard_subs().is_some() && !self.conn.in_multi() =>
            {
                let channels = self.upstream_channels(action, args)?;
                let first = channels.first().map(|f| self.key_place(f));
                if let Some(other) = channels
                    .iter()
                    .map(|c| self.key_place(c))
                    .find(|s| Some(*s) != first)
                {
                    return Some(Action::Refused(
                        self.cross_places(first.unwrap_or(other), other),
                    ));
                }
                Some(Action::Gather(Box::new(Gather::ShardPubSub(
                    ShardCommand::Unsubscribe { channels },
                ))))
            }
            _ if self.cluster.shard_subs().is_none()
                || self.client.proto != 2
                || self.conn.holds(Holds::SUBSCRIPTIONS) =>
            {
                None
            }
            Kind::Subscribe(_) | Kind::Unsubscribe(_) | Kind::Quit | Kind::Reset => None,
            // PING itself refuses more than one argument (its arity in the table allows any
            // number), after the subscribed context let it through (state fuzzer).
            _ if args.get(0).eq_ignore_ascii_case(b"PING") && args.len() > 2 => {
                Some(Action::Refused(answers::wrong_arity("ping")))
            }
            _ if args.get(0).eq_ignore_ascii_case(b"PING") => {
                // Redis's PING reply in RESP2 subscribed mode.
                let arg = if args.len() == 2 { args.get(1) } else { b"" };
                let mut pong = BytesMut::from(&b"*2\r\n$4\r\npong\r\n"[..]);
                pong.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
                pong.extend_from_slice(arg);
                pong.extend_from_slice(b"\r\n");
                Some(Action::Local(pong.freeze(), LocalEffect::None))
            }
            _ => Some(crate::session::route::subscribed_context_refusal(args)),
        }
    }

    /// The channels of a forwarded (S)(UN)SUBSCRIBE as they go upstream (after a namespace
    /// rewrite); `None` for an action that is not forwarded (refused by the policy).
    pub(super) fn upstream_channels(&self, action: &Action, args: &Args<'_>) -> Option<Vec<Bytes>> {
        let (_, _, rewrite) = action.forwarded()?;
        match rewrite.and_then(|r| r.command.as_ref()) {
            Some(frame) => {
                let mut ranges = Vec::new();
                match codec::decode(frame, &self.ctx.codec, &mut ranges) {
                    Ok(Some(Decoded::Command { .. })) => {
                        Some(ranges[1..].iter().map(|r| frame.slice(r.clone())).collect())
                    }
                    _ => None,
                }
            }
            None => Some(args.iter().skip(1).map(Bytes::copy_from_slice).collect()),
        }
    }
}

/// How long subscribing may take before giving up: twice the connect timeout (a refused
/// connection or a map still naming a failed node is retried meanwhile), at least a second.
fn resubscribe_within(router: &Router) -> Duration {
    router
        .connect_timeout()
        .saturating_mul(2)
        .max(MIN_RESUBSCRIBE)
}

#[cfg(test)]
mod tests {
    use super::super::state::*;

    #[test]
    fn confirmations_as_redis_writes_them() {
        assert_eq!(
            &confirmation(2, "ssubscribe", Some(b"ch"), 2)[..],
            b"*3\r\n$10\r\nssubscribe\r\n$2\r\nch\r\n:2\r\n"
        );
        assert_eq!(
            &confirmation(3, "sunsubscribe", None, 0)[..],
            b">3\r\n$12\r\nsunsubscribe\r\n_\r\n:0\r\n"
        );
        assert_eq!(
            &confirmation(2, "sunsubscribe", None, 0)[..],
            b"*3\r\n$12\r\nsunsubscribe\r\n$-1\r\n:0\r\n"
        );
    }
}
