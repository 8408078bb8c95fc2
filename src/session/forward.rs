//! Forwarding: runs and commands sent to their upstream connection, and what a failed send
//! leaves behind.

use super::Session;
use super::action::{Lone, Outgoing};
use super::client::ReplyMode;
use super::cluster::state::{OwnConn, PoolRef};
use super::conn::{Dedicated, Holds, Target, Transaction};
use super::conn::{register_upstream, take_share};
use super::effect::Effect;
use super::reply_queue::{Handling, HelloAuth, PUSH_BUDGET, Sent, Slot, Unusual, WAIT_BARRIER};
use super::routing::Routing;
use super::run::Run;
use super::scatter::cut_segment;
use crate::protocol::answers;
use crate::protocol::error::{ProxyError, UpstreamError, error_reply};
use crate::protocol::reply::SubKind;
use crate::upstream::conn::PushTarget;
use crate::upstream::{Batch, Expect, ReplyWait};
use bytes::{Buf, Bytes, BytesMut};
use tokio::sync::mpsc;

/// A batch whose connection's queue was full: what `send_as_now` does once it is queued,
/// kept until the waiting send is done (`send_blocked`). The queue is rarely full, so the
/// common path queues at once and builds no future: every read's processing future stays
/// small (tcache-sized when boxed, see `Session::process`) instead of holding this path's
/// state for the rare case.
pub(super) struct Blocked {
    /// The full queue, waited on.
    tx: mpsc::Sender<Batch>,
    /// What is queued there once it has room.
    batch: Batch,
    /// The batch's record, kept once it is queued (`sent`) or turned into errors.
    sending: Sending,
    /// Runs of the same flush to send after it, in order (`flush_run`'s parked runs).
    pub(super) rest: Vec<Run>,
}

/// What `send_as` records of a batch: its reply slot, once the batch is queued.
struct Sending {
    /// `kept_batch`'s copy for redirections and replays.
    kept: Option<Box<Sent>>,
    /// The batch's sequence number in the reply order.
    seq: u16,
    /// Commands it carries (reply frames the client expects of it).
    commands: u32,
    /// How its replies are treated.
    handling: Handling,
    /// A scattered run's `seq` and first segment, whose slot is in place already.
    parts: Option<(u16, usize)>,
    /// Where it went, for `inflight_target`.
    target: Target,
}

/// What became of a batch offered to its connection's queue.
enum Enqueue {
    /// Queued.
    Queued,
    /// The connection is gone; the batch is dropped.
    Closed,
    /// The queue is full: wait on it (a clone of the sender, so no borrow of the session).
    Full(mpsc::Sender<Batch>, Batch),
}

/// Offers `batch` to `tx` without waiting.
fn try_enqueue(tx: &mpsc::Sender<Batch>, batch: Batch) -> Enqueue {
    match tx.try_send(batch) {
        Ok(()) => Enqueue::Queued,
        Err(mpsc::error::TrySendError::Closed(_)) => Enqueue::Closed,
        Err(mpsc::error::TrySendError::Full(batch)) => Enqueue::Full(tx.clone(), batch),
    }
}

impl Session {
    /// Sends one run as one batch; `Some` when its connection's queue is full (then nothing
    /// is recorded yet: `send_blocked` finishes it).
    pub(super) fn send_run_now(&mut self, mut run: Run) -> Option<Box<Blocked>> {
        let Some(target) = run.target else {
            // Only skipped empty requests: drop them.
            self.input.rbuf.advance(run.len);
            return None;
        };
        let parts = match run.seq {
            Some(seq) => {
                cut_segment(&mut self.queue, &mut run, self.input.read_at);
                run.head.map(|head| (seq, head))
            }
            None => None,
        };
        let bytes = match run.owned {
            Some(owned) => {
                self.input.rbuf.advance(run.len);
                owned.freeze()
            }
            None => self.input.rbuf.split_to(run.len).freeze(),
        };
        let handling = Handling {
            mask: run.mask,
            name: run.first,
            ..Handling::default()
        };
        self.send_as_now(
            target,
            bytes,
            Expect::Frames(run.frames),
            handling,
            run.hash_slots,
            parts,
        )
    }

    /// Sends a batch and records its slot; on failure answers every command with the error.
    /// `hash_slots`: cluster mode, the hash slots of its keyed commands for a shared
    /// connection (see `spread`).
    pub(super) async fn send(
        &mut self,
        target: Target,
        bytes: Bytes,
        expect: Expect,
        handling: Handling,
        hash_slots: Vec<u16>,
    ) {
        if let Some(blocked) = self.send_as_now(target, bytes, expect, handling, hash_slots, None) {
            Box::pin(self.send_blocked(blocked)).await;
        }
    }

    /// `send` without waiting, for a batch whose reply slots may be in place already:
    /// `parts` is then its `seq` and the position of its first segment (see `scatter`).
    /// `Some` when the connection's queue is full: nothing is recorded until
    /// `send_blocked` has queued it.
    pub(super) fn send_as_now(
        &mut self,
        target: Target,
        bytes: Bytes,
        expect: Expect,
        handling: Handling,
        hash_slots: Vec<u16>,
        parts: Option<(u16, usize)>,
    ) -> Option<Box<Blocked>> {
        let commands = expect.commands();
        let seq = match parts {
            Some((seq, _)) => seq,
            None => {
                let seq = self.queue.next_seq;
                self.queue.next_seq = seq.wrapping_add(1);
                seq
            }
        };
        let kept = self.kept_batch(target, expect, &bytes, hash_slots, handling.wait);
        let mut handling = handling;
        if self.ctx.ops.mirror.active() && matches!(expect, Expect::Frames(_)) {
            let (proto, node) = match target {
                Target::Shared(proto, node) => (proto, node),
                Target::Dedicated(node) => (self.client.proto, node),
            };
            // A lone command outside a transaction is judged by its table entry (the
            // planner counts every command inside one, so those are always captured).
            let sole = match expect {
                Expect::Frames(1) if !self.conn.in_multi() => handling.name,
                _ => None,
            };
            handling.mirror =
                self.ctx
                    .ops
                    .mirror
                    .capture(proto, &bytes, handling.blocking, sole, node);
        }
        let batch = Batch {
            bytes,
            expect,
            wait: handling.wait,
            reply_to: self.queue.reply_sender(),
            seq,
        };
        let sending = Sending {
            kept,
            seq,
            commands,
            handling,
            parts,
            target,
        };
        match self.try_enqueue_to(target, batch, commands) {
            Enqueue::Queued => self.sent(sending),
            Enqueue::Closed => self.send_failed(sending),
            Enqueue::Full(tx, batch) => {
                return Some(Box::new(Blocked {
                    tx,
                    batch,
                    sending,
                    rest: Vec::new(),
                }));
            }
        }
        None
    }

    /// Waits for room in a full queue and finishes what `send_as_now` started; returns the
    /// runs still to send after it.
    pub(super) async fn send_blocked(&mut self, blocked: Box<Blocked>) -> Vec<Run> {
        let Blocked {
            tx,
            batch,
            sending,
            rest,
        } = *blocked;
        match tx.send(batch).await {
            Ok(()) => self.sent(sending),
            Err(_) => self.send_failed(sending),
        }
        rest
    }

    /// A queued batch's reply slot (or, for a scattered run, what its head slot keeps), and
    /// its commands counted in flight.
    fn sent(&mut self, sending: Sending) {
        let Sending {
            kept,
            seq,
            commands,
            handling,
            parts,
            target,
        } = sending;
        match parts {
            Some((_, head)) => {
                // A scattered run's segments share the head's slot: the batch's mirror
                // capture waits there for its whole reply (`on_parts`).
                if let Some(Slot::Upstream {
                    sent, handling: h, ..
                }) = self.queue.slots.get_mut(head)
                {
                    *sent = kept;
                    h.mirror = handling.mirror;
                }
            }
            None => {
                self.queue.queued += 1;
                self.queue.slots.push_back(Slot::Upstream {
                    commands,
                    handling,
                    read_at: self.input.read_at,
                    sent: kept,
                    seq,
                    parts: 1,
                });
            }
        }
        self.queue.inflight += commands as usize;
        self.queue.inflight_target = Some(target);
    }

    /// What is kept of a batch until its replies are in, for what may have to be done with
    /// them: cluster batches, for redirections; a Sentinel replica's batch (node 1…), which
    /// holds only reads, so they can go to the primary if the replica fails
    /// (`resend_failed_replica_reads`); a cluster transaction's or blocking command's batch on
    /// the dedicated connection (`kept_dedicated`). `None` for the rest, whose hash slots are
    /// then not counted in flight either.
    pub(super) fn kept_batch(
        &mut self,
        target: Target,
        expect: Expect,
        bytes: &Bytes,
        hash_slots: Vec<u16>,
        wait: ReplyWait,
    ) -> Option<Box<Sent>> {
        let cluster = self.routing.is_cluster();
        let dedicated_kept = match (target, expect) {
            (Target::Dedicated(_), Expect::Frames(frames)) if cluster => {
                self.kept_dedicated(frames)
            }
            _ => None,
        };
        match (target, expect, dedicated_kept) {
            (Target::Shared(proto, node), Expect::Frames(_), _) if cluster || node != 0 => {
                Some(self.routing.boxed(Sent {
                    bytes: bytes.clone(),
                    proto,
                    node,
                    dedicated: false,
                    redirects: 0,
                    wait: ReplyWait::Prompt,
                    hash_slots,
                    transaction: super::conn::InTransaction::No,
                }))
            }
            (Target::Dedicated(node), _, Some(transaction)) => Some(Box::new(Sent {
                bytes: bytes.clone(),
                proto: self.client.proto,
                node,
                dedicated: true,
                redirects: 0,
                wait,
                hash_slots: Vec::new(),
                transaction,
            })),
            _ => {
                self.routing.answered(&hash_slots);
                None
            }
        }
    }

    /// Offers `batch` (of `commands` commands) to the connection `target` names, without
    /// waiting: the dedicated one, or the shared one of the node's pool (the primary's, a
    /// Sentinel replica's, a cluster node's).
    fn try_enqueue_to(&self, target: Target, batch: Batch, commands: u32) -> Enqueue {
        let (proto, node) = match target {
            Target::Shared(proto, node) => (proto, node),
            Target::Dedicated(_) => {
                return match &self.conn.dedicated {
                    Some(d) => try_enqueue(&d.tx, batch),
                    None => Enqueue::Closed,
                };
            }
        };
        match self.routing.own_conn(node) {
            OwnConn::Any => {}
            OwnConn::Own(conn) => return try_enqueue(&conn.tx, batch),
            // Failed in its place; the next command's placement ends the session.
            OwnConn::Missing => return Enqueue::Closed,
        }
        let (pool, replica) = match self.routing.node_pool(node) {
            Some(found) => found,
            None if node == 0 => {
                return try_enqueue(self.ctx.pool.shared(proto, self.client.id), batch);
            }
            // A replica chosen by `place_read` whose list is gone: the primary serves it.
            None => (PoolRef::Borrowed(&self.ctx.pool), true),
        };
        if replica {
            let metrics = &self.ctx.ops.metrics;
            metrics.replica_reads.inc_by(u64::from(commands));
        }
        try_enqueue(pool.shared(proto, self.client.id), batch)
    }

    /// A batch that could not be queued (its connection closed): every command it carries
    /// gets the error in its place in the reply order.
    fn send_failed(&mut self, sending: Sending) {
        let Sending {
            kept,
            seq,
            commands,
            handling,
            parts,
            ..
        } = sending;
        if let Some(sent) = kept {
            self.routing.finished(sent);
        }
        if handling.reset {
            // The RESET never reached Redis (its connection is gone, and its subscriptions
            // with it): the session resets now, and nothing waits for an answer.
            self.reset();
        }
        let e = ProxyError::Upstream(UpstreamError::Unavailable {
            addr: self.ctx.pool.addr(),
            reason: "connection closed".into(),
        });
        let reply = error_reply(&e);
        if let Some((_, head)) = parts {
            // Its segments already hold its place in the reply order.
            for slot in self.queue.slots.range_mut(head..) {
                if let Slot::Upstream {
                    commands, seq: s, ..
                } = slot
                    && *s == seq
                {
                    *slot = Slot::Local(reply.repeat(*commands as usize).into());
                }
            }
            return;
        }
        if !handling.suppress {
            let visible = match &handling.mask {
                Some(mask) => mask.iter().filter(|&&k| k).count() as u32,
                None => commands,
            };
            for _ in 0..visible {
                self.queue.local(reply.clone());
            }
        }
    }

    /// Cluster mode: whether a batch of `frames` commands for the dedicated connection is kept
    /// for what a redirection of it means, and its part in a transaction. Kept: a
    /// transaction's batches (MULTI with its first command, queued commands, EXEC), to replay
    /// the transaction if its slot moved, unless the connection holds other state (another
    /// user's AUTH, CLIENT TRACKING) that a replay on the node's shared connection would not
    /// have; a blocking command, followed to the new node; a WATCH, which may start over on
    /// another node if the map was stale (see `redirect_dedicated`), unless the connection is
    /// the client's own login.
    pub(super) fn kept_dedicated(&self, frames: u32) -> Option<super::conn::InTransaction> {
        if self.conn.in_multi() {
            (!self.conn.holds(Holds::OTHER_USER) && !self.conn.holds(Holds::CLIENT_MODE)).then_some(
                if self.conn.holds(Holds::WATCH) {
                    super::conn::InTransaction::Watched
                } else {
                    super::conn::InTransaction::Replayable
                },
            )
        } else {
            // Not under the client's own login on this connection: followed to the new
            // owner, the session would go on over a connection of the proxy's login there.
            (frames == 1
                && !self.conn.holds(Holds::OTHER_USER)
                && (!self.pinned() || self.conn.holds(Holds::WATCH)))
            .then_some(super::conn::InTransaction::No)
        }
    }

    /// Forwards the command occupying the first `len` bytes of the read buffer, as the policy
    /// may have rewritten it. Returns `false` when processing must pause.
    pub(super) async fn forward(
        &mut self,
        lone: Lone,
        target: Target,
        expect: Expect,
        effect: Effect,
        rewrite: Option<crate::policy::rewrite::Rewrite>,
    ) -> bool {
        // Pub/sub confirmations are pushed, so Redis sends them even with replies off.
        let pushed = matches!(effect, Effect::Subscribe(_))
            || matches!(expect, Expect::Confirmations(_) | Expect::UnsubscribeAll(_));
        let suppress = self.client.reply_mode != ReplyMode::On && !pushed;
        let Lone {
            len,
            name,
            hash_slot: slot,
        } = lone;
        if self.blocked(target, slot) {
            // Wait until the other connection has answered: commands must run in the
            // order they were sent.
            self.pause_decided();
            return false;
        }
        if self.watch_goes_alone(effect) && self.queue.inflight > 0 {
            // Answered MOVED, the WATCH moves the session's connection to the new owner
            // (`cluster::redirect`), which would fail whatever else was in flight on the
            // old one.
            self.pause_decided();
            return false;
        }
        if self.wait_after_failover(len, effect) {
            return true;
        }
        let auth = matches!(effect, Effect::Auth | Effect::AuthHello(_));
        // A client's own AUTH goes on a connection without the proxy's login when the proxy
        // has none, or when the upstream refuses it: the client's credentials decide, as on
        // a direct connection, and the pool's state never breaks them.
        let raw = auth && {
            let pool = self.node_pool(target);
            !pool.has_credentials() || pool.credentials_refused()
        };
        if let Target::Dedicated(node) = target
            && !self.ensure_dedicated(raw, node, effect).await
        {
            self.input.rbuf.advance(len);
            return true;
        }
        let command = self.input.rbuf.split_to(len).freeze();
        // HELLO's SETNAME: done now; with AUTH, once Redis accepted the login.
        let hello = match effect {
            Effect::Hello(_) => {
                let options = crate::commands::grammar::hello_options(&command);
                if options.name.is_some() {
                    self.name_client(options.name);
                }
                None
            }
            Effect::AuthHello(_) => Some(crate::commands::grammar::hello_options(&command)),
            _ => None,
        };
        let out = self.outgoing(command, target, effect, rewrite);
        let expect = match expect {
            Expect::Frames(_) => Expect::Frames(out.frames.len() as u32),
            other => other,
        };
        let exec_mask = self.exec_mask(effect);
        self.note_queued(effect, out.queued.as_deref());
        let (blocking, wait) = match effect {
            Effect::Blocking(wait) | Effect::Wait(wait) => (true, wait),
            Effect::Script => (true, ReplyWait::Prompt),
            _ => (false, ReplyWait::Prompt),
        };
        let handling = Handling {
            suppress,
            blocking,
            wait,
            mask: out.frames.contains(&false).then_some(out.frames),
            unsubscribe: matches!(
                effect,
                Effect::Unsubscribe(SubKind::Channel | SubKind::Pattern)
            ),
            client_info: effect == Effect::ClientInfo,
            names_redirect: effect == Effect::NamesRedirect,
            sub_counts: matches!(effect, Effect::Subscribe(_) | Effect::Unsubscribe(_))
                || self.exec_subscribes(effect),
            hello: matches!(effect, Effect::Hello(_) | Effect::AuthHello(_)),
            reset: effect == Effect::Reset,
            info: effect.info_edit(),
            config_get: effect == Effect::ConfigGet,
            mirror: None,
            name,
            unusual: Unusual {
                hello_auth: match effect {
                    Effect::AuthHello(proto) => Some(HelloAuth {
                        proto,
                        first_login: !self.conn.holds(Holds::OTHER_USER),
                        options: hello.unwrap_or_default(),
                    }),
                    _ => None,
                },
                exec_mask,
                replace: out.replace,
                strip: out.strip,
                _script: match effect {
                    Effect::Script => self.routing.script_sent(target),
                    _ => None,
                },
            }
            .boxed_if_any(),
        };
        let hash_slots = match slot {
            Some(slot) if self.routing.sent(target, slot) => vec![slot],
            _ => Vec::new(),
        };
        self.send(target, out.bytes, expect, handling, hash_slots)
            .await;
        self.apply(effect);
        if self.client.reply_mode == ReplyMode::Skip {
            self.client.reply_mode = ReplyMode::On;
        }
        true
    }

    /// Sentinel mode: a WAIT after a failover that came after the writes it would cover is
    /// answered with an error and the session closes; `true` when so. WAIT runs on a
    /// connection opened now, to the current primary, whose count would vouch for writes made
    /// on the previous one; Sentinel has Redis close the old primary's clients, and a WAIT
    /// retried on this connection would otherwise seem to vouch for those writes, while on a
    /// new connection it covers only writes made there.
    pub(super) fn wait_after_failover(&mut self, len: usize, effect: Effect) -> bool {
        let Routing::Sentinel(sentinel) = &self.routing else {
            return false;
        };
        if !matches!(effect, Effect::Wait(_))
            || self.stateful()
            || self.ctx.pool.epoch() == sentinel.wait_epoch
        {
            return false;
        }
        self.input.rbuf.advance(len);
        let e = ProxyError::Upstream(UpstreamError::PrimaryChanged);
        self.queue.local(error_reply(&e));
        self.input.closing = true;
        true
    }

    /// The bytes a forwarded command goes upstream as: the policy's rewrite, EXEC replaced by
    /// DISCARD for a spoiled transaction, and the commands the proxy adds (the TTL rule's, the
    /// HELLO after a raw AUTH, WAIT's barrier, a deferred MULTI), with which reply frames the
    /// client sees.
    pub(super) fn outgoing(
        &mut self,
        mut command: Bytes,
        target: Target,
        effect: Effect,
        rewrite: Option<crate::policy::rewrite::Rewrite>,
    ) -> Outgoing {
        let mut replace = None;
        if effect == Effect::AbortExec {
            if self.conn.multi_deferred() {
                // Nothing reached the node yet: the held commands are dropped and EXEC runs
                // the empty transaction (MONITOR shows it, as one Redis would).
                drop(self.routing.take_held_in_multi());
            } else {
                command = Bytes::from_static(b"*1\r\n$7\r\nDISCARD\r\n");
            }
            replace = Some(answers::execabort());
        }
        // One entry per reply frame: does the client see it?
        let mut frames = vec![true];
        let mut strip = None;
        if let Some(rw) = rewrite {
            strip = rw.strip;
            if let Some(c) = rw.command {
                command = c;
            } else if let Some(extra) = rw.append {
                let mut out = BytesMut::new();
                if extra.extend_frame(&command, &mut out) {
                    command = out.freeze();
                }
            }
            let before = rw.before.as_deref().map_or(&[][..], Vec::as_slice);
            if !rw.after.is_empty() || !before.is_empty() {
                let mut all = BytesMut::new();
                for c in before {
                    all.extend_from_slice(c);
                    frames.insert(0, false);
                }
                all.extend_from_slice(&command);
                for c in &rw.after {
                    all.extend_from_slice(c);
                    frames.push(false);
                }
                command = all.freeze();
            }
        }
        let bytes = if effect == Effect::Auth && self.client.proto == 3 {
            // A connection opened without handshake speaks RESP2: after the client's AUTH,
            // switch it to the client's RESP3 (reply hidden).
            frames.push(false);
            [
                command,
                Bytes::from_static(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n"),
            ]
            .concat()
            .into()
        } else if matches!(effect, Effect::Wait(_)) && !self.stateful() {
            frames.insert(0, false);
            [Bytes::from_static(WAIT_BARRIER), command].concat().into()
        } else {
            command
        };
        // What the transaction queues, before a deferred MULTI joins the frames.
        let mut queued = frames.contains(&false).then(|| frames.clone());
        let bytes = if self.conn.multi_deferred() && matches!(target, Target::Dedicated(_)) {
            if let Some(multi) = &mut self.conn.multi {
                multi.deferred = false;
            }
            let multi = self
                .routing
                .take_deferred_multi()
                .unwrap_or_else(|| Bytes::from_static(b"*1\r\n$5\r\nMULTI\r\n"));
            let held = self.routing.take_held_in_multi();
            // The held keyless commands are queued first, their `+QUEUED` hidden (the proxy
            // gave it) and their results in EXEC's reply.
            if !held.is_empty() {
                let mut mask = vec![true; held.len()];
                mask.extend_from_slice(&frames);
                queued = Some(mask);
            }
            frames.splice(0..0, std::iter::repeat_n(false, 1 + held.len()));
            let mut all = BytesMut::from(&multi[..]);
            for command in &held {
                all.extend_from_slice(command);
            }
            all.extend_from_slice(&bytes);
            all.freeze()
        } else {
            bytes
        };
        Outgoing {
            bytes,
            frames,
            queued,
            replace,
            strip,
        }
    }

    /// Makes sure a usable dedicated connection to `node` exists; on failure the command's
    /// slot gets the error, the state `effect` would have set is marked as not established
    /// (see `not_established`) and `false` is returned: the command is answered and must not
    /// be sent.
    pub(super) async fn ensure_dedicated(&mut self, raw: bool, node: u16, effect: Effect) -> bool {
        if self.dedicated_usable(raw, node) {
            return true;
        }
        if self.conn.dedicated.is_some() {
            if self.pinned() {
                self.queue.local(error_reply(&ProxyError::Upstream(
                    UpstreamError::Unavailable {
                        addr: self.ctx.pool.addr(),
                        reason: "dedicated connection lost".into(),
                    },
                )));
                self.input.closing = true;
                // The command got its one reply (the error): it must not be sent as well.
                return false;
            }
            self.conn.dedicated = None;
        }
        let mut opened = self.open_dedicated(raw, node).await;
        let auth = matches!(effect, Effect::Auth | Effect::AuthHello(_));
        if opened.is_err()
            && auth
            && !raw
            && self
                .node_pool(Target::Dedicated(node))
                .credentials_refused()
        {
            // The proxy's login was refused just now: the client's AUTH brings its own.
            opened = self.open_dedicated(true, node).await;
        }
        match opened {
            Ok(()) => true,
            Err(why) => {
                self.not_established(effect, &why);
                false
            }
        }
    }

    /// The pool of the node a target names (the standalone or Sentinel primary's pool
    /// outside cluster mode).
    pub(super) fn node_pool(&self, target: Target) -> std::sync::Arc<crate::upstream::pool::Pool> {
        let node = match target {
            Target::Shared(_, node) | Target::Dedicated(node) => node,
        };
        match self.routing.node_pool(node) {
            Some((pool, _)) => pool.into_owned(),
            None => self.ctx.pool.clone(),
        }
    }

    /// Opens the session's dedicated connection to `node` (`raw`: without a handshake), on a
    /// share of its tenant's connections, and maps the client's id to it (`client_ids`); the
    /// reason when it could not. Used by `ensure_dedicated` and by a session asked for its
    /// connection by another's REDIRECT (`summon`), which must not answer anything itself.
    pub(super) async fn open_dedicated(&mut self, raw: bool, node: u16) -> Result<(), String> {
        let proto = self.client.proto;
        if let Some(taken) = self
            .cluster_session()
            .and_then(|mut c| c.own_dedicated(raw, proto, node))
        {
            return taken.map(drop);
        }
        let push = PushTarget {
            to: self.queue.reply_sender(),
            budget: self.queue.push_budget(),
            budget_size: PUSH_BUDGET,
            conn_id: self.conn.dedicated_gen + 1,
        };
        // Boxed, as the connect below: rare, and it may wait.
        let share = match Box::pin(take_share(&self.ctx, &self.client)).await {
            Ok(share) => share,
            Err(why) => {
                self.ctx.ops.metrics.dedicated_refused[0].inc();
                return Err(why);
            }
        };
        // Boxed: the connect + TLS + handshake future is large and rare; inline it would grow
        // every idle session's task.
        let pool = self.node_pool(Target::Dedicated(node));
        let opened = Box::pin(pool.dedicated(self.client.proto, push, raw))
            .await
            .map_err(|e| e.to_string())?;
        self.conn.dedicated_gen += 1;
        let id = register_upstream(&self.ctx, self.client.id, node, opened.upstream_id);
        self.conn.dedicated = Some(Dedicated {
            tx: opened.tx,
            proto: if raw { 2 } else { self.client.proto },
            node,
            confined: opened.confined,
            _id: id,
            _share: Some(share),
        });
        Ok(())
    }

    /// Whether the session's dedicated connection can take a command for `node` as it is:
    /// open, to that node, and speaking the client's protocol (`raw`: any, since the command
    /// is an AUTH that sets the protocol after it).
    pub(super) fn dedicated_usable(&self, raw: bool, node: u16) -> bool {
        self.conn.dedicated.as_ref().is_some_and(|d| {
            (raw || d.proto == self.client.proto) && !d.tx.is_closed() && d.node == node
        })
    }

    /// The command that would have set up `effect` on a dedicated connection could not get
    /// one: it gets the error, and no later command runs in a state the client did not ask
    /// for. A MULTI leaves a transaction that was never opened (every command up to EXEC or
    /// DISCARD answered with an error and not run, EXEC aborted); a WATCH makes the next EXEC
    /// abort; a SELECT leaves the database the client had, and each error says so.
    pub(super) fn not_established(&mut self, effect: Effect, e: &dyn std::fmt::Display) {
        let consequence = match effect {
            Effect::Multi => {
                self.conn.multi = Some(Transaction {
                    unopened: true,
                    refused: true,
                    ..Transaction::default()
                });
                Some("the transaction is not open: the commands up to EXEC are not run and EXEC aborts".to_string())
            }
            Effect::Watch => {
                self.conn.watch_lost = true;
                Some("the keys are not watched: the next EXEC aborts".to_string())
            }
            Effect::Select(_) => Some(format!(
                "SELECT not done: the connection stays on db {}",
                self.client.db
            )),
            _ => None,
        };
        let reply = match consequence {
            Some(c) => crate::protocol::error::state_not_established(e, &c),
            None => crate::protocol::error::simple_error("ERR", &e.to_string()),
        };
        self.queue.local(reply);
    }
}
