//! Cluster redirections: a reply that is a MOVED, ASK or TRYAGAIN gets its command sent again
//! to the node named (on the shared connections outside the reply order, or on the session's
//! dedicated connection for a blocking command), up to `max_redirects` times; and a batch
//! refused because its node was down is routed again once the map has changed.

use super::again::{Again, again_of, may_redirect};
use super::exchange::lost_reply;
use super::transaction;
use super::{ClusterSession, ClusterView};
use crate::protocol::codec::split_commands;
use crate::protocol::codec::{CodecLimits, Decoded};
use crate::protocol::error::UpstreamError;
use crate::protocol::{answers, codec};
use crate::session::conn::InTransaction;
use crate::session::conn::register_upstream;
use crate::session::conn::{Dedicated, Holds, Target};
use crate::session::replica_reads::failed_reads;
use crate::session::reply_queue::{PUSH_BUDGET, Slot};
use crate::topology::cluster::{Redirect, Router};
use crate::upstream::conn::PushTarget;
use crate::upstream::{Batch, Expect, Reply};
use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

impl ClusterSession<'_> {
    /// A batch sent to a replica whose connection failed: its reads without a reply are sent
    /// to their primaries, each to its slot's (`replica_reads::failed_reads`, one rule for
    /// cluster and Sentinel mode).
    async fn resend_failed_replica_reads(&mut self, msg: &mut Reply) {
        let router = self.cluster.router.clone();
        let replica = |node| {
            router.read_from() != crate::config::ReadFrom::Primary
                && !router.snapshot().is_primary(node)
        };
        let Some(failed) = failed_reads(self.queue, &self.ctx.codec, msg, replica) else {
            return;
        };
        let Some(nodes) = failed
            .commands
            .iter()
            .map(|c| node_of_command(&router, c, &self.ctx.codec))
            .collect::<Option<Vec<u16>>>()
        else {
            return;
        };
        let sent = self.send_routed(&router, failed.proto, &failed.commands, &nodes);
        if let Some(replies) = sent.await {
            failed.answered(msg, &replies);
        }
    }

    /// Follows MOVED and ASK replies in a batch from a cluster node: each redirected command
    /// is sent again to the node named (after `ASKING` for ASK), up to `max_redirects` times,
    /// and its reply put where the redirection was. Resending is safe: a node that redirects
    /// has not run the command. Waits for the resent replies (redirections are rare and the
    /// session's later replies queue behind this one anyway).
    pub(in crate::session) async fn follow_redirects(&mut self, msg: &mut Reply) -> bool {
        let Reply::Batch { seq, .. } = *msg else {
            if let Reply::Subscriptions(id, subs) = msg {
                let subs = std::mem::take(&mut **subs);
                Box::pin(self.move_subscriber(*id, subs)).await;
                return true;
            }
            // Connection ends and the retry timer of the keyspace notifications' extra
            // connections (ids of their own), then pushes and connection ends: shard
            // subscriptions may need them.
            if let Reply::PinnedClosed(id) = msg
                && super::login::is_login_conn(*id)
            {
                self.login_ended(*id);
                return true;
            }
            if let Reply::PinnedClosed(id) = msg
                && super::tracking::is_listener_conn(*id)
            {
                self.listener_ended(*id);
                return true;
            }
            if let Reply::PinnedClosed(id) = msg
                && super::monitor::is_monitor_conn(*id)
            {
                return self.monitor_ended(*id);
            }
            if let Reply::PinnedClosed(id) = msg
                && super::keyspace::is_keyspace_conn(*id)
            {
                return Box::pin(self.keyspace_ended(*id)).await;
            }
            // Invalidations and the ends of tracking connections (whose ids the shard
            // connections' test would also match).
            if self.tracking_event(msg) {
                return true;
            }
            return self.shard_event(msg).await;
        };
        if let Some(how) = self
            .queue
            .sent_of(seq)
            .map(|sent| sent.transaction)
            .filter(|&how| how != InTransaction::No)
        {
            Box::pin(self.transaction_reply(msg, how)).await;
            return false;
        }
        if self.queue.sent_of(seq).is_some_and(|sent| sent.dedicated) {
            return Box::pin(self.redirect_dedicated(msg)).await;
        }
        Box::pin(self.resend_failed_replica_reads(msg)).await;
        let unsent = matches!(
            msg,
            Reply::Batch { data, error: Some(e), .. }
                if data.is_empty() && matches!(**e, UpstreamError::Unavailable { .. })
        );
        if unsent {
            // Nothing was sent (the node's connection is down): safe to route again.
            if let Some(data) = Box::pin(self.reroute_unsent(seq)).await {
                *msg = Reply::Batch {
                    data,
                    missing: 0,
                    error: None,
                    seq,
                };
            }
            return false;
        }
        let Reply::Batch {
            data, error: None, ..
        } = msg
        else {
            return false;
        };
        if !may_redirect(data) {
            return false;
        }
        let router = self.cluster.router.clone();
        let Some(sent) = self.queue.sent_of(seq) else {
            return false;
        };
        let (bytes, proto, from) = (sent.bytes.clone(), sent.proto, sent.node);
        let mut frames = crate::protocol::reply::split(data);
        let commands = split_commands(&bytes, &self.ctx.codec);
        if frames.len() != commands.len() {
            return false;
        }
        let origin = router.addr(from);
        self.redirect_frames(&router, proto, &origin, &commands, &mut frames)
            .await;
        *data = frames.concat().into();
        false
    }

    /// A blocking command answered MOVED, ASK or TRYAGAIN on the dedicated connection: sent
    /// again on a dedicated connection to the node named, with the session's own reply
    /// channel, so the session keeps serving (and noticing a client that leaves) while it
    /// blocks there. `true` when resent: the reply is then not the client's yet.
    async fn redirect_dedicated(&mut self, msg: &mut Reply) -> bool {
        let Reply::Batch {
            data,
            error: None,
            seq,
            ..
        } = msg
        else {
            return false;
        };
        let seq = *seq;
        let router = self.cluster.router.clone();
        let Some(sent) = self.queue.sent_of(seq) else {
            return false;
        };
        let origin = router.addr(sent.node);
        // After an ASK the batch also holds ASKING's reply: the command's is the last.
        let Some(again) = crate::protocol::reply::split(data)
            .last()
            .and_then(|frame| again_of(frame, &origin))
        else {
            return false;
        };
        if sent.redirects >= router.max_redirects() {
            if let Again::Redirect(r) = again {
                *data = too_many_redirections(&r);
                self.answer_alone(seq);
            }
            return false;
        }
        let (command, proto, wait) = (sent.bytes.clone(), sent.proto, sent.wait);
        self.note_redirect(&router, &again);
        if let Again::TryAgain(_) = again {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let node = router.node(again.addr());
        let moved = matches!(again, Again::Redirect(Redirect::Moved { .. }));
        let Some(tx) = self
            .dedicated_for_resend(&router, node, proto, moved, &command)
            .await
        else {
            return false;
        };
        let ask = again.is_ask();
        let frames: u32 = if ask { 2 } else { 1 };
        let batch = Batch {
            bytes: with_asking(command, ask),
            expect: Expect::Frames(frames),
            wait,
            reply_to: self.queue.reply_sender(),
            // The same batch, sent again: its reply goes to the same slot.
            seq,
        };
        if tx.send(batch).await.is_err() {
            return false;
        }
        self.note_resent(seq, node, frames, ask);
        true
    }

    /// The reply slot `seq`, whose batch is answered with a too-many-redirections error, now
    /// expects that one frame: the error stands for the command alone.
    fn answer_alone(&mut self, seq: u16) {
        if let Some(Slot::Upstream {
            commands, handling, ..
        }) = self
            .queue
            .slot_of(seq)
            .and_then(|i| self.queue.slots.get_mut(i))
        {
            self.queue.inflight -= (*commands - 1) as usize;
            *commands = 1;
            handling.mask = None;
        }
    }

    /// The dedicated connection a redirected command is sent again on (see `dedicated_to`).
    /// A WATCH answered MOVED watched nothing; when it is all the session has on its
    /// connection (nothing sent after it, no other state), the watch starts over on the
    /// slot's owner instead of the client getting a redirection it cannot follow.
    async fn dedicated_for_resend(
        &mut self,
        router: &Router,
        node: u16,
        proto: u8,
        moved: bool,
        command: &Bytes,
    ) -> Option<mpsc::Sender<Batch>> {
        let lone_watch = moved
            && self.conn.holds(Holds::WATCH)
            && self.queue.inflight == 1
            && !self.conn.in_multi()
            && !self.conn.held.other_than(Holds::WATCH)
            && transaction::command_name(command, &self.ctx.codec)
                .is_some_and(|n| n.eq_ignore_ascii_case(b"WATCH"));
        if lone_watch {
            self.conn.held.remove(Holds::WATCH);
        }
        let tx = self.dedicated_to(router, node, proto).await;
        if lone_watch {
            self.conn.held.insert(Holds::WATCH);
        }
        tx
    }

    /// Records that batch `seq` was sent again to `node` as `frames` commands (`ASKING`'s
    /// reply, when `ask`, hidden from the client): the slot, the in-flight count and where
    /// the session's commands now go.
    fn note_resent(&mut self, seq: u16, node: u16, frames: u32, ask: bool) {
        if let Some(Slot::Upstream {
            commands,
            handling,
            sent: Some(sent),
            ..
        }) = self
            .queue
            .slot_of(seq)
            .and_then(|i| self.queue.slots.get_mut(i))
        {
            self.queue.inflight = self.queue.inflight + frames as usize - *commands as usize;
            *commands = frames;
            handling.mask = ask.then(|| vec![false, true]);
            sent.node = node;
            sent.redirects += 1;
        }
        self.queue.inflight_target = Some(Target::Dedicated(node));
    }

    /// The session's dedicated connection, moved to `node` if it is elsewhere; `None` when
    /// the session is pinned to its node or the connection cannot be opened.
    async fn dedicated_to(
        &mut self,
        router: &Router,
        node: u16,
        proto: u8,
    ) -> Option<mpsc::Sender<Batch>> {
        if let Some(d) = &self.conn.dedicated
            && d.node == node
            && d.proto == proto
            && !d.tx.is_closed()
        {
            return Some(d.tx.clone());
        }
        if self.pinned() {
            return None;
        }
        if let Some(taken) = self.own_dedicated(false, proto, node) {
            return taken.ok();
        }
        let push = PushTarget {
            to: self.queue.reply_sender(),
            budget: self.queue.push_budget(),
            budget_size: PUSH_BUDGET,
            conn_id: self.conn.dedicated_gen + 1,
        };
        let opened = router.pool(node).dedicated(proto, push, false).await.ok()?;
        let tx = opened.tx;
        self.conn.dedicated_gen += 1;
        // Another client's CLIENT UNBLOCK must find the command blocked on this one.
        let id = register_upstream(self.ctx, self.client.id, node, opened.upstream_id);
        // The connection it replaces was counted against the tenant: this one is now.
        let share = self.conn.dedicated.take().and_then(|d| d._share);
        self.conn.dedicated = Some(Dedicated {
            tx: tx.clone(),
            proto,
            node,
            confined: opened.confined,
            _id: id,
            _share: share,
        });
        Some(tx)
    }

    /// Counts a redirection being followed in `rpp_upstream_redirections_total`.
    fn count_redirect(&self, redirect: &Redirect) {
        let metrics = &self.ctx.ops.metrics;
        match redirect {
            Redirect::Moved { .. } => metrics.redirections_moved.inc(),
            Redirect::Ask { .. } => metrics.redirections_ask.inc(),
        };
    }

    /// Counts a redirection being followed and, for MOVED, teaches the map the slot's new
    /// owner (ASK is for one command only; TRYAGAIN is no redirection).
    pub(super) fn note_redirect(&self, router: &Router, again: &Again) {
        if let Again::Redirect(r) = again {
            self.count_redirect(r);
            if let Redirect::Moved { slot, addr } = r {
                router.apply_moved(*slot, addr);
            }
        }
    }

    /// A batch refused because its node's connection is down (a primary failed) was never
    /// sent: after the map changes (the refresh a failure triggers learns the promoted
    /// replica), its commands are routed again by their keys. Waits at most twice the connect
    /// timeout, then gives up and the client gets the original error: no hang. `None` when
    /// the map did not change in time or the nodes failed again.
    async fn reroute_unsent(&self, seq: u16) -> Option<Bytes> {
        let router = self.cluster.router.clone();
        let sent = self.queue.sent_of(seq)?;
        let (bytes, proto, from) = (sent.bytes.clone(), sent.proto, sent.node);
        let commands = split_commands(&bytes, &self.ctx.codec);
        let give_up = tokio::time::Instant::now() + router.connect_timeout().saturating_mul(2);
        let before = router.snapshot_id();
        loop {
            router.refresh_soon();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let moved = router.snapshot_id() != before;
            let nodes: Vec<u16> = commands
                .iter()
                .map(|c| node_of_command(&router, c, &self.ctx.codec))
                .collect::<Option<Vec<u16>>>()?;
            if moved && !nodes.contains(&from) {
                return self.send_routed(&router, proto, &commands, &nodes).await;
            }
            if tokio::time::Instant::now() >= give_up {
                return None;
            }
        }
    }

    /// Sends `commands[i]` to `nodes[i]`, consecutive commands for one node as one batch, in
    /// order, following redirections; the replies concatenated, or `None` if a node is down.
    pub(in crate::session) async fn send_routed(
        &self,
        router: &Router,
        proto: u8,
        commands: &[Bytes],
        nodes: &[u16],
    ) -> Option<Bytes> {
        let mut out = Vec::with_capacity(commands.len());
        let mut start = 0;
        while start < commands.len() {
            let node = nodes[start];
            let end = nodes[start..]
                .iter()
                .position(|&n| n != node)
                .map_or(commands.len(), |n| start + n);
            let group = &commands[start..end];
            start = end;
            let bytes = group.concat().into();
            let (data, None) = self
                .exchange(router, node, proto, bytes, group.len() as u32)
                .await
            else {
                return None;
            };
            let mut frames = crate::protocol::reply::split(&data);
            if frames.len() != group.len() {
                return None;
            }
            if may_redirect(&data) {
                let origin = router.addr(node);
                self.redirect_frames(router, proto, &origin, group, &mut frames)
                    .await;
            }
            out.extend(frames);
        }
        Some(out.concat().into())
    }

    /// Sends again, to the node named, each command whose reply frame is a MOVED or ASK (after
    /// `ASKING` for ASK), up to `max_redirects` times, and puts the new replies in place.
    /// `commands[i]` is the command `frames[i]` answers; `origin` the node that answered.
    async fn redirect_frames(
        &self,
        router: &Router,
        proto: u8,
        origin: &str,
        commands: &[Bytes],
        frames: &mut [Bytes],
    ) {
        let mut todo: Vec<(usize, Again)> = frames
            .iter()
            .enumerate()
            .filter_map(|(i, f)| again_of(f, origin).map(|r| (i, r)))
            .collect();
        for round in 0..router.max_redirects() {
            if todo.is_empty() {
                break;
            }
            if todo.iter().any(|(_, a)| matches!(a, Again::TryAgain(_))) {
                // The slot is being migrated and the keys are split between the nodes for a
                // moment: back off a little more each round, as Redis Cluster clients do.
                let wait = 10 * u64::from(round + 1);
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            }
            let mut next = Vec::new();
            let mut start = 0;
            while start < todo.len() {
                let end = same_destination_end(&todo, start);
                self.resend_group(
                    router,
                    proto,
                    commands,
                    frames,
                    &todo[start..end],
                    &mut next,
                )
                .await;
                start = end;
            }
            todo = next;
        }
        for (i, r) in todo {
            // A TRYAGAIN that outlasted the retries stays Redis's own error: the client may
            // retry it later, as Redis intends.
            if let Again::Redirect(r) = r {
                frames[i] = too_many_redirections(&r);
            }
        }
    }

    /// One round of `redirect_frames` for a `group` of commands with one destination, all
    /// after ASK or none: sent there as one batch, each reply put in `frames`, and the ones
    /// redirected again pushed to `next` for the following round.
    async fn resend_group(
        &self,
        router: &Router,
        proto: u8,
        commands: &[Bytes],
        frames: &mut [Bytes],
        group: &[(usize, Again)],
        next: &mut Vec<(usize, Again)>,
    ) {
        let Some((_, first)) = group.first() else {
            return;
        };
        let (dest, ask) = (first.addr().clone(), first.is_ask());
        for (_, r) in group {
            self.note_redirect(router, r);
        }
        let node = router.node(&dest);
        let mut out = BytesMut::new();
        for (i, _) in group {
            if ask {
                out.extend_from_slice(b"*1\r\n$6\r\nASKING\r\n");
            }
            out.extend_from_slice(&commands[*i]);
        }
        let per = if ask { 2 } else { 1 };
        let expected = (group.len() * per) as u32;
        let (data, error) = self
            .exchange(router, node, proto, out.freeze(), expected)
            .await;
        let got = crate::protocol::reply::split(&data);
        for (k, (i, _)) in group.iter().enumerate() {
            let Some(frame) = got.get(k * per + per - 1) else {
                frames[*i] = lost_reply(error.as_deref(), &dest, "no reply after a redirection");
                continue;
            };
            if let Some(r) = again_of(frame, &dest) {
                next.push((*i, r));
            }
            frames[*i] = frame.clone();
        }
    }

    /// Follows the redirections among `frames`, the replies `node` gave to the batch `bytes`
    /// sent for this client; nothing when the replies do not match the batch's commands.
    pub(super) async fn redirect_batch(
        &self,
        router: &Router,
        node: u16,
        bytes: &Bytes,
        frames: &mut [Bytes],
    ) {
        let commands = split_commands(bytes, &self.ctx.codec);
        if commands.len() == frames.len() {
            let origin = router.addr(node);
            self.redirect_frames(router, self.client.proto, &origin, &commands, frames)
                .await;
        }
    }
}

/// The node owning the keys of one encoded command (a primary for a keyless one).
pub(in crate::session) fn node_of_command(
    router: &Router,
    command: &[u8],
    limits: &CodecLimits,
) -> Option<u16> {
    let mut ranges = Vec::new();
    match codec::decode(command, limits, &mut ranges) {
        Ok(Some(Decoded::Command { .. })) => {
            let argv: Vec<&[u8]> = ranges.iter().map(|r| &command[r.clone()]).collect();
            router.node_for(&argv)
        }
        _ => None,
    }
}

/// The error a command gets when it is still redirected after `max_redirects` resends.
fn too_many_redirections(redirect: &Redirect) -> Bytes {
    answers::too_many_redirections(redirect.slot())
}

/// `command` preceded by `ASKING` when it follows an ASK: the target node serves the slot
/// being imported only to a connection that said so, for the next command only.
fn with_asking(command: Bytes, ask: bool) -> Bytes {
    if ask {
        [Bytes::from_static(b"*1\r\n$6\r\nASKING\r\n"), command]
            .concat()
            .into()
    } else {
        command
    }
}

/// Where the run of `todo` entries starting at `start` ends: the entries sent to one node
/// in one batch share its address and whether they follow an ASK (each then needs `ASKING`).
fn same_destination_end(todo: &[(usize, Again)], start: usize) -> usize {
    let (dest, ask) = (todo[start].1.addr(), todo[start].1.is_ask());
    todo[start..]
        .iter()
        .position(|(_, r)| r.addr() != dest || r.is_ask() != ask)
        .map_or(todo.len(), |n| start + n)
}

impl ClusterView<'_> {
    /// Whether `follow_redirects` has anything to do with `msg`: every case it acts on (an
    /// event that is not a batch's reply, a failed batch, a transaction's or a dedicated
    /// connection's reply, a possible redirection). The gate that keeps an ordinary reply off
    /// the boxed path (`on_message`): a case added there must be added here.
    pub(in crate::session) fn cluster_step_due(&self, msg: &Reply) -> bool {
        let Reply::Batch {
            data, error, seq, ..
        } = msg
        else {
            return true;
        };
        error.is_some()
            || may_redirect(data)
            || self
                .queue
                .sent_of(*seq)
                .is_some_and(|sent| sent.dedicated || sent.transaction != InTransaction::No)
    }
}

#[cfg(test)]
mod tests {
    use super::super::again::redirect_of;
    use super::*;

    #[test]
    fn redirect_scan_ignores_values() {
        assert!(may_redirect(b"-MOVED 1 127.0.0.1:7000\r\n"));
        assert!(may_redirect(b"+OK\r\n-ASK 1 127.0.0.1:7000\r\n"));
        assert!(!may_redirect(b"+OK\r\n:1\r\n"));
        // A value containing the text is found by the scan but is not an error frame.
        let data = Bytes::from_static(b"$20\r\n\r\n-MOVED 1 x:1\r\nabcd\r\n");
        let frames = crate::protocol::reply::split(&data);
        assert_eq!(frames.len(), 1);
        assert!(redirect_of(&frames[0], "x:1").is_none());
    }
}
