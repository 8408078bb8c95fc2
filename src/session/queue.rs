//! The reply stream: upstream replies put in their place, shaped, and written in request order.

use super::conn::Holds;
use super::effect::InfoEdit;
use super::replies::{apply_mask, filter_exec};
use super::reply_queue::{Handling, Slot};
use super::{Session, replies};
use crate::commands::CommandSpec;
use crate::operations::ops::Ops;
use crate::protocol::error::{ProxyError, UpstreamError, error_reply};
use crate::upstream::Reply;
use bytes::Bytes;
use tokio::time::Instant;

impl Session {
    /// Handles one message from an upstream connection.
    pub(super) fn on_reply(&mut self, msg: Reply) {
        match msg {
            Reply::Batch {
                data,
                missing,
                error,
                seq,
            } => self.on_batch_reply(seq, data, missing, error),
            Reply::Push(frame, permits, conn) => {
                let queue = &self.queue;
                if self
                    .routing
                    .repeated_flush(&frame, conn, || queue.mark_at(0))
                {
                    self.queue.return_permits(permits);
                    return;
                }
                // A namespaced subscriber sees channel names without its prefix.
                let frame = match self.client.policy.access.namespace(self.client.tenant) {
                    Some(prefix) => crate::policy::namespace::strip_pubsub(prefix, &frame),
                    None => frame,
                };
                self.queue.out.push(frame);
                self.queue.out_permits += permits;
            }
            // Cluster sessions act on it before (`cluster::subscriber`); elsewhere the
            // `PinnedClosed` that follows ends the session.
            Reply::Subscriptions(..) => {}
            Reply::PinnedClosed(conn_id) => {
                // The end of a connection the session dropped itself (RESET, a refused HELLO
                // AUTH…) says nothing about the state it holds now: in front of a cluster a
                // MULTI pipelined after RESET waits for its first key with no connection yet,
                // and the old one's end closed the session (state fuzzer).
                if conn_id != self.conn.dedicated_gen || self.conn.dedicated.is_none() {
                    return;
                }
                self.conn.dedicated = None;
                if self.stateful() {
                    // The state the client built on that connection is gone; like Redis
                    // closing the connection, end the session so the client starts over.
                    self.input.closing = true;
                }
            }
        }
    }

    /// The replies of the batch `seq`: shaped as its slot says, written if the slot heads the
    /// reply order, else kept in it until the earlier ones are in.
    pub(super) fn on_batch_reply(
        &mut self,
        seq: u16,
        data: Bytes,
        missing: u32,
        error: Option<Box<UpstreamError>>,
    ) {
        // Standalone (and on one node) the reply answers the oldest slot; in cluster mode
        // another node's batch may be older and still unanswered.
        let at = self.queue.slot_of(seq);
        if let Some(i) = at
            && matches!(self.queue.slots[i], Slot::Upstream { parts, .. } if parts > 1)
        {
            if let Some(mut cluster) = self.cluster_session() {
                cluster.on_parts(i, data, missing, error);
            }
            return;
        }
        let Some(Slot::Upstream {
            commands,
            mut handling,
            read_at,
            sent,
            ..
        }) = self.queue.take(at)
        else {
            // Anything else is a bug we must not turn into a misattributed reply.
            tracing::error!(id = self.client.id, "upstream reply without a waiting slot");
            self.input.closing = true;
            return;
        };
        let at = at.unwrap_or(0);
        if let Some(capture) = handling.mirror.take() {
            capture.answered(self.client.id, data.clone(), commands);
        }
        if let Some(sent) = sent {
            self.routing.finished(sent);
        }
        // Where this reply's output starts: kept in its slot if earlier ones are due.
        let mark = self.queue.out.len();
        self.queue.inflight -= commands as usize;
        if self.queue.inflight == 0 {
            self.queue.inflight_target = None;
        }
        if error.is_some() {
            self.routing.upstream_failed();
        }
        // A blocking command's time (BLPOP, XREAD BLOCK, WAIT…) is the wait its client asked
        // for: kept out of the latency histogram and the slow log, as Redis keeps it out of
        // its SLOWLOG.
        if !handling.blocking {
            observe(
                &self.ctx.ops,
                self.client.peer,
                read_at,
                commands,
                handling.name,
            );
        }
        self.audit_answered(read_at, commands, error.is_some(), data.len());
        let (data, missing) = match &handling.mask {
            None => (data, missing),
            Some(mask) => apply_mask(data, commands - missing, mask),
        };
        let data = match &error {
            None => self.shape_reply(&handling, data),
            Some(_) => data,
        };
        if handling.sub_counts && !data.is_empty() {
            self.note_sub_counts(&data);
        }
        if handling.reset {
            // Answered or failed, the client asked for a fresh connection state; the
            // connection the RESET ran on (now logged out upstream) is dropped.
            self.reset();
        }
        if let Some(hello) = handling.unusual.as_mut().and_then(|u| u.hello_auth.take()) {
            let outcome = match &error {
                Some(_) => super::reply_queue::HelloOutcome::Refused,
                None => super::reply_queue::HelloOutcome::of(&hello.options, &data),
            };
            self.settle_hello_auth(hello, outcome);
        }
        // Cluster mode only: there a pinned session reaches one node. Standalone, it keeps its
        // connection, and with it the identity Redis knows it by (a REDIRECT target that
        // unsubscribes, says HELLO 3 and subscribes again must stay the same connection).
        // Nor does a subscription that left the client with none: refused by Redis (NOPERM
        // for a channel the client's own user may not use), or queued in a transaction that
        // was discarded or aborted (state fuzzer: MULTI, SUBSCRIBE, DISCARD left the session
        // held as a subscriber, and a later shard subscriber's PING was not answered as one).
        let none_left = handling.sub_counts
            && !handling.unsubscribe
            && !self.conn.in_multi()
            && !self.ctx.client_list.subscribed(self.client.id);
        if (none_left
            || handling.unsubscribe
                && data.ends_with(b":0\r\n")
                && !self.conn.holds(Holds::SHARD_SUBSCRIPTIONS))
            && self.routing.router().is_some()
            && error.is_none()
            // A SUBSCRIBE pipelined after it subscribes again (its effect was applied when
            // it was sent): the session stays a subscriber (state fuzzer, in front of a
            // cluster: an EXEC after it was sent on as if it were not).
            && !self.queue.slots.iter().any(|s| {
                matches!(s, Slot::Upstream { handling, .. } if handling.sub_counts)
            })
        {
            self.conn.held.remove(Holds::SUBSCRIPTIONS);
            if none_left {
                self.conn.held.remove(Holds::SHARD_SUBSCRIPTIONS);
            }
            self.list_flag('N');
        }
        if at == 0 {
            self.queue.out_read = Some(read_at);
        }
        if !handling.suppress {
            if !data.is_empty() {
                self.queue.out.push(data);
            }
            if let Some(e) = error {
                let reply = error_reply(&ProxyError::Upstream(*e));
                for _ in 0..missing {
                    self.queue.out.push(reply.clone());
                }
            }
        }
        self.queue.settle(at, mark);
    }

    /// A forwarded HELLO with AUTH, answered: accepted, the client speaks the protocol it
    /// asked for; refused, a client that was on the proxy's login is again (the connection
    /// dialled for its AUTH, left in RESP2 or unauthenticated, is dropped unless other state
    /// holds it).
    fn settle_hello_auth(
        &mut self,
        hello: super::reply_queue::HelloAuth,
        outcome: super::reply_queue::HelloOutcome,
    ) {
        match outcome {
            super::reply_queue::HelloOutcome::Accepted => {
                self.apply(super::effect::Effect::Hello(hello.proto));
                if hello.options.name.is_some() {
                    self.name_client(hello.options.name);
                }
            }
            // Logged in and named, then refused a later option: the protocol stays. The
            // connection the HELLO ran on may have been dialled raw (RESP2) for the client's
            // own credentials; it is told the client's protocol before anything else of the
            // session reaches it (later commands wait for this reply to be decided), or the
            // next command would find it unusable (state fuzzer, seed 70117499).
            super::reply_queue::HelloOutcome::LoggedIn => {
                if hello.options.name.is_some() {
                    self.name_client(hello.options.name);
                }
                let proto = self.client.proto;
                if let Some(d) = &mut self.conn.dedicated
                    && d.proto != proto
                    && crate::upstream::unanswered(&d.tx, crate::upstream::hello_command(proto))
                {
                    d.proto = proto;
                }
            }
            super::reply_queue::HelloOutcome::Refused if hello.first_login => {
                self.conn.held.remove(Holds::OTHER_USER);
                if !self.pinned() {
                    self.conn.dedicated = None;
                }
            }
            super::reply_queue::HelloOutcome::Refused => {}
        }
    }

    /// CLIENT LIST's subscription counts and flag, from the confirmations in `data`
    /// (`sub_counts`): a client left with no subscription is not `P` any more, as in Redis.
    fn note_sub_counts(&self, data: &[u8]) {
        self.ctx.client_list.update(self.client.id, |r| {
            r.subs.confirmed(data);
            if r.subs.any() {
                r.flag = 'P';
            } else if r.flag == 'P' {
                r.flag = 'N';
            }
        });
    }

    /// A complete reply as the client sees it, per its slot's `handling`: replaced (EXECABORT),
    /// namespace stripped, EXEC's hidden results removed, CLIENT INFO made about the client,
    /// INFO with the proxy's section; as Redis sent it otherwise.
    pub(super) fn shape_reply(&self, handling: &Handling, data: Bytes) -> Bytes {
        let unusual = handling.unusual.as_deref();
        if let Some(r) = unusual.and_then(|u| u.replace.as_ref()) {
            r.clone()
        } else if let Some(strip) = unusual.and_then(|u| u.strip.as_ref()) {
            strip.apply(&data)
        } else if let Some(mask) = unusual.and_then(|u| u.exec_mask.as_ref()) {
            filter_exec(data, mask)
        } else if handling.client_info {
            self.rewrite_client_info(data)
        } else if handling.names_redirect {
            // Asked on the dedicated connection (its tracking state is there): its node's ids.
            let node = self.conn.dedicated.as_ref().map_or(0, |d| d.node);
            replies::map_redirect(data, |id| {
                let upstream = super::client_ids::Upstream { node, id };
                self.ctx.client_ids.client(upstream)
            })
        } else if let Some(edit) = handling.info {
            let clients = self.ctx.client_list.connected(self.client.tenant);
            let section = (edit == InfoEdit::CountAndSection).then(|| self.proxy_info());
            replies::info_as_seen(data, section.as_deref(), clients)
        } else if handling.config_get {
            super::config_get::without_secrets(data)
        } else if handling.hello {
            self.hello_as_seen(&data)
        } else {
            data
        }
    }
}

/// Records the latency of an answered upstream batch of `commands` read at `read_at` from
/// the client at `peer`: histogram, and slow log above its threshold.
pub(super) fn observe(
    ops: &Ops,
    peer: std::net::SocketAddr,
    read_at: Instant,
    commands: u32,
    name: Option<&'static CommandSpec>,
) {
    let took = read_at.elapsed();
    ops.metrics
        .request_duration
        .observe_n(took, u64::from(commands));
    if ops.slowlog.is_slow(took) {
        ops.metrics.slow_commands.inc();
        let others = commands.saturating_sub(1);
        let name = name.map_or("(unknown)", |s| s.name);
        ops.slowlog.record(took, name, others, peer);
    }
}
