//! Building runs: decoded commands joined into one batch per upstream connection, or sent alone.

use super::Session;
use super::action::{Action, Command, Decision, Dispatch, Flow, Joining, Lone, Now, Pending};
use super::client::ReplyMode;
use super::conn::Target;
use super::effect::Effect;
use super::forward::Blocked;
use super::run::Run;
use crate::observe::metrics::CommandOutcome;
use crate::protocol::codec::Decoded;
use crate::protocol::error::{ClientError, ProxyError, error_reply};
use crate::upstream::Expect;
use crate::{commands::classify, protocol::codec};
use bytes::{Buf, BytesMut};

impl Run {
    /// Adds a command that is forwarded as the client sent it: `bytes` are the next bytes of
    /// the read buffer.
    pub(super) fn push_plain(&mut self, bytes: &[u8], target: Target) {
        if let Some(owned) = &mut self.owned {
            owned.extend_from_slice(bytes);
        }
        if let Some(mask) = &mut self.mask {
            mask.push(true);
        }
        self.len += bytes.len();
        self.frames += 1;
        self.target = Some(target);
    }

    /// Adds a command the policy rewrote; `consumed` are its bytes in the read buffer and
    /// `prefix` the run's bytes so far (copied once, when the first rewrite joins), and
    /// `capacity_hint` how many bytes may still follow.
    pub(super) fn push_rewritten(
        &mut self,
        prefix: &[u8],
        consumed: &[u8],
        capacity_hint: usize,
        rewrite: &crate::policy::rewrite::Rewrite,
        target: Target,
    ) {
        let owned = self.owned.get_or_insert_with(|| {
            // Room for the rest of the read buffer and its appended TTLs, so a pipeline of
            // rewritten SETs grows the buffer once, not by doubling.
            let mut owned = BytesMut::with_capacity(prefix.len() + capacity_hint);
            owned.extend_from_slice(prefix);
            owned
        });
        for c in rewrite.before() {
            owned.extend_from_slice(c);
        }
        match (&rewrite.command, &rewrite.append) {
            (Some(command), _) => owned.extend_from_slice(command),
            (None, Some(extra)) => {
                if !extra.extend_frame(consumed, owned) {
                    owned.extend_from_slice(consumed);
                }
            }
            (None, None) => owned.extend_from_slice(consumed),
        }
        for c in &rewrite.after {
            owned.extend_from_slice(c);
        }
        let hidden = rewrite.before().len() + rewrite.after.len();
        if hidden > 0 || self.mask.is_some() {
            let frames = self.frames as usize;
            let mask = self.mask.get_or_insert_with(|| vec![true; frames]);
            mask.extend(std::iter::repeat_n(false, rewrite.before().len()));
            mask.push(true);
            mask.extend(std::iter::repeat_n(false, rewrite.after.len()));
        }
        self.len += consumed.len();
        self.frames += 1 + hidden as u32;
        self.target = Some(target);
    }
}

impl Joining {
    /// Whether the policy added hidden commands around it (their replies are masked).
    pub(super) fn hidden(&self) -> bool {
        self.rewrite
            .as_ref()
            .is_some_and(|r| !r.after.is_empty() || !r.before().is_empty())
    }

    /// The action it was made from.
    pub(super) fn into_action(self) -> Action {
        match self.rewrite {
            None => Action::Forward {
                target: self.target,
                expect: Expect::Frames(1),
                effect: self.effect,
            },
            Some(rewrite) => Action::Rewritten {
                target: self.target,
                expect: Expect::Frames(1),
                effect: self.effect,
                rewrite,
            },
        }
    }
}

/// Room for the hash slots of a run's first commands (`Run::hash_slots`): a pipeline of 16
/// over three nodes puts five or six on each.
const HASH_SLOTS_FIRST: usize = 16;

impl Session {
    /// The next complete request after the run's bytes; `None` when there is none yet, or
    /// when the client broke the protocol or filled its query buffer (answered, and the
    /// session closes).
    pub(super) async fn next_request(&mut self, run: &mut Run) -> Option<Decoded> {
        let decoded = codec::decode(
            &self.input.rbuf[run.len..],
            &self.ctx.codec,
            &mut self.input.args,
        );
        let e = match decoded {
            Ok(Some(d)) => return Some(d),
            Ok(None) if self.input.rbuf.len() - run.len <= self.ctx.max_query_buffer => {
                return None;
            }
            Ok(None) => ClientError::QueryBufferFull {
                limit: self.ctx.max_query_buffer,
            },
            Err(e) => e.into(),
        };
        self.flush_run(run).await;
        self.queue.local(error_reply(&ProxyError::Client(e)));
        self.input.closing = true;
        None
    }

    /// Decides the command of `len` bytes after the run and, when that needs no waiting (it
    /// joins the run for the same shared connection, or another node's run in cluster mode),
    /// carries it out; otherwise hands the decided command to `on_command`, nothing changed.
    pub(super) fn on_command_now(&mut self, run: &mut Run, len: usize) -> Now {
        // Only the first command decided after a pause can be the one paused at.
        let again = std::mem::take(&mut self.input.judged);
        let mut command = {
            let frame = &self.input.rbuf[run.len..run.len + len];
            let arg = |i: usize| self.input.args.get(i).map(|r| &frame[r.clone()]);
            let name = arg(0).unwrap_or_default();
            Command {
                len,
                spec: crate::commands::lookup(name, arg(1)),
                kind: classify::classify(name),
                audit: super::audit_draft::Slot::default(),
                again,
            }
        };
        if let Some(spec) = command.spec {
            // CLIENT LIST's `cmd=`: one relaxed store, no lookup.
            self.listed.live().note_command(spec);
        }
        let decision = self.decide(
            &self.input.rbuf[run.len..run.len + len],
            &command,
            run.target,
        );
        command.audit = self.audit_draft(&self.input.rbuf[run.len..], &command, &decision);
        if decision.action.forwarded().is_some() && self.client.policy.has_shared_limits() {
            return Now::Later(Pending { command, decision });
        }
        let Decision { action, hash_slot } = decision;
        self.note_multi_slot(&action, hash_slot);
        let join = match self.joinable(action) {
            Dispatch::Join(join) if self.joins_without_waiting(run, &join) => join,
            Dispatch::Join(join) => {
                return Now::Later(Pending {
                    command,
                    decision: Decision {
                        action: join.into_action(),
                        hash_slot,
                    },
                });
            }
            Dispatch::Alone(action) => {
                return Now::Later(Pending {
                    command,
                    decision: Decision { action, hash_slot },
                });
            }
        };
        if run.target.is_some_and(|t| t != join.target)
            && let Some(mut cluster) = self.cluster_session()
        {
            cluster.switch_run(run, join.target);
        }
        Now::Done(self.join_prepared(run, &command, hash_slot, join))
    }

    /// Carries out a decided command that may have to wait: for the Redis-counted rate limit,
    /// for the run to be sent first, for a dedicated connection, or for `execute`.
    pub(super) async fn on_command(&mut self, run: &mut Run, pending: Pending) -> Flow {
        let Pending { command, decision } = pending;
        let Decision {
            mut action,
            hash_slot,
        } = decision;
        if let Action::Prepare(prepare) = action {
            return Box::pin(self.prepare_then(run, command, *prepare)).await;
        }
        if action.forwarded().is_some() && self.client.policy.has_shared_limits() {
            let name = command.spec.map_or("-", |s| s.name);
            // Boxed: only policies with `backend: redis` limits get here.
            if let Some(refusal) = Box::pin(self.shared_limits(name, command.again)).await {
                action = Action::Refused(refusal);
            }
            self.note_multi_slot(&action, hash_slot);
        }
        match self.joinable(action) {
            Dispatch::Join(join) => self.join_run(run, &command, hash_slot, join).await,
            Dispatch::Alone(action) => self.dispatch_alone(run, &command, hash_slot, action).await,
        }
    }

    /// The session's own connections follow a changed map (`cluster::plan::Prepare`), once
    /// nothing is in flight; then the command is decided again, and carried out as any
    /// (rate limits, audit). A second `Prepare` for it (the map changed again meanwhile)
    /// closes the client with the reason rather than loop.
    async fn prepare_then(
        &mut self,
        run: &mut Run,
        mut command: Command,
        prepare: super::cluster::plan::Prepare,
    ) -> Flow {
        self.flush_run(run).await;
        if self.queue.inflight > 0 {
            // Decided again from the start once the replies are in.
            self.pause_decided();
            return Flow::Stop;
        }
        // Judged already: decided again, it spends nothing twice.
        command.again = true;
        let decision = match self.prepare(prepare).await {
            Ok(()) => self.decide(&self.input.rbuf[..command.len], &command, None),
            Err(reply) => Action::LocalThenClose(reply).into(),
        };
        let decision = match decision.action {
            Action::Prepare(again) => Action::LocalThenClose(again.unmet()).into(),
            _ => decision,
        };
        command.audit = self.audit_draft(&self.input.rbuf[..], &command, &decision);
        self.on_command(run, Pending { command, decision }).await
    }

    /// Cluster mode: an open transaction is bound to the hash slot of its first keyed command.
    pub(super) fn note_multi_slot(&mut self, action: &Action, hash_slot: Option<u16>) {
        if self.conn.in_multi() && hash_slot.is_some() && action.forwarded().is_some() {
            self.routing.bind_multi(hash_slot);
        }
    }

    /// Whether `join` can be added to the run without waiting: a shared connection, and the
    /// run either goes there too (and may take its hidden frames) or can be parked
    /// (`scatter`) instead of sent.
    pub(super) fn joins_without_waiting(&self, run: &Run, join: &Joining) -> bool {
        let hidden = join.hidden();
        matches!(join.target, Target::Shared(..))
            && match run.target {
                Some(t) if t != join.target => self.routing.may_scatter(run, join.target, hidden),
                _ => !(hidden && run.seq.is_some()),
            }
    }

    /// A forwarded command that may join the current run of plain commands (one reply frame,
    /// no effect needing `execute`, replies on, no deferred MULTI), as its target, effect and
    /// rewrite; the action back otherwise.
    pub(super) fn joinable(&self, action: Action) -> Dispatch {
        let joins = |effect: Effect| {
            self.client.reply_mode == ReplyMode::On
                && effect.batchable()
                && !self.conn.multi_deferred()
                && !self.watch_goes_alone(effect)
        };
        match action {
            Action::Forward {
                target,
                expect: Expect::Frames(1),
                effect,
            } if joins(effect) => Dispatch::Join(Joining {
                target,
                effect,
                rewrite: None,
            }),
            Action::Rewritten {
                target,
                expect: Expect::Frames(1),
                effect,
                rewrite,
            } if joins(effect) && rewrite.strip.is_none() => Dispatch::Join(Joining {
                target,
                effect,
                rewrite: Some(rewrite),
            }),
            other => Dispatch::Alone(other),
        }
    }

    /// Adds a command to the run (sending the run first when it goes elsewhere), or pauses
    /// when it must wait for replies from another connection.
    pub(super) async fn join_run(
        &mut self,
        run: &mut Run,
        command: &Command,
        hash_slot: Option<u16>,
        join: Joining,
    ) -> Flow {
        let target = join.target;
        let hidden = join.hidden();
        if run.target.is_some_and(|t| t != target) {
            if self.routing.may_scatter(run, target, hidden)
                && let Some(mut cluster) = self.cluster_session()
            {
                cluster.switch_run(run, target);
            } else {
                // Another connection: the runs so far go out first.
                self.flush_run(run).await;
            }
        } else if hidden && run.seq.is_some() {
            // Segments carry no mask: hidden frames start a new batch.
            self.flush_run(run).await;
        }
        if let Target::Dedicated(node) = target {
            if self.blocked(target, hash_slot) {
                // Decided again once resumed.
                self.pause_decided();
                return Flow::Stop;
            }
            if run.target.is_some() && !self.dedicated_usable(false, node) {
                // The run goes out before the command's error can take its slot, so its
                // replies keep their place ahead of it.
                self.flush_run(run).await;
            }
            if !self.ensure_dedicated(false, node, join.effect).await {
                self.count_joined(command, &join);
                self.audit_failed(command);
                self.flush_run(run).await;
                self.input.rbuf.advance(command.len);
                return Flow::Next;
            }
        }
        self.join_prepared(run, command, hash_slot, join)
    }

    /// Counts a command that joined a run as forwarded or rewritten.
    pub(super) fn count_joined(&self, command: &Command, join: &Joining) {
        let outcome = match join.rewrite {
            Some(_) => CommandOutcome::Rewritten,
            None => CommandOutcome::Forwarded,
        };
        let class = crate::observe::metrics::class_of(command.spec);
        self.ctx.ops.metrics.command(class, outcome);
    }

    /// The part of joining a run that never waits, once the run goes where the command goes
    /// (and a dedicated connection is up): pauses if the command must wait for replies from
    /// another connection, else counts it and appends it.
    pub(super) fn join_prepared(
        &mut self,
        run: &mut Run,
        command: &Command,
        hash_slot: Option<u16>,
        join: Joining,
    ) -> Flow {
        if self.blocked(join.target, hash_slot) {
            // Decided again once resumed.
            self.pause_decided();
            return Flow::Stop;
        }
        self.count_joined(command, &join);
        self.audit_joined(command, &join);
        let Joining {
            target,
            effect,
            rewrite,
        } = join;
        if run.first.is_none() {
            run.first = command.spec;
        }
        // Counted from now: a later command for the slot must not join another node's run.
        if let Some(slot) = hash_slot
            && self.routing.sent(target, slot)
        {
            if run.hash_slots.capacity() == 0 {
                // One allocation for a pipeline's share of a node, not a growth from 4 per
                // doubling (cluster `-P 16`: 0.13 reallocations per request), or none: an
                // answered batch's vector.
                run.hash_slots = self.routing.hash_slots(HASH_SLOTS_FIRST);
            }
            run.hash_slots.push(slot);
        }
        self.push_to_run(run, command.len, target, effect, rewrite);
        self.apply(effect);
        Flow::Next
    }

    /// Appends the command of `len` bytes after the run to it, as sent or as rewritten, and
    /// notes its frames in an open transaction.
    pub(super) fn push_to_run(
        &mut self,
        run: &mut Run,
        len: usize,
        target: Target,
        effect: Effect,
        rewrite: Option<Box<crate::policy::rewrite::Rewrite>>,
    ) {
        let base = run.len;
        let Some(rewrite) = rewrite else {
            run.push_plain(&self.input.rbuf[base..base + len], target);
            self.note_queued(effect, None);
            return;
        };
        let (prefix, rest) = self.input.rbuf.split_at(base);
        let hint = rest.len() + rest.len() / 2;
        run.push_rewritten(prefix, &rest[..len], hint, &rewrite, target);
        if rewrite.after.is_empty() && rewrite.before().is_empty() {
            self.note_queued(effect, None);
        } else {
            let mut frames = vec![false; rewrite.before().len()];
            frames.push(true);
            frames.extend(std::iter::repeat_n(false, rewrite.after.len()));
            self.note_queued(effect, Some(&frames));
        }
    }

    /// Sends the run, then carries out a command that cannot join one (MULTI, SUBSCRIBE,
    /// refusals, replies the proxy makes…).
    pub(super) async fn dispatch_alone(
        &mut self,
        run: &mut Run,
        command: &Command,
        hash_slot: Option<u16>,
        action: Action,
    ) -> Flow {
        let outcome = match &action {
            Action::Forward { .. } => CommandOutcome::Forwarded,
            Action::Rewritten { .. } => CommandOutcome::Rewritten,
            Action::Spread(spread) if matches!(spread.then, Action::Rewritten { .. }) => {
                CommandOutcome::Rewritten
            }
            Action::Spread(_) => CommandOutcome::Forwarded,
            Action::Refused(_) => CommandOutcome::Refused,
            _ => CommandOutcome::Local,
        };
        let closes = matches!(action, Action::LocalThenClose(_));
        self.flush_run(run).await;
        let before = self.input.rbuf.len();
        // Boxed: the path for commands that cannot join a run (MULTI, SUBSCRIBE, refusals,
        // local replies) carries the largest futures, which would otherwise sit in every
        // session's state.
        let lone = Lone {
            len: command.len,
            name: command.spec,
            hash_slot,
        };
        let done = Box::pin(self.execute(action, lone)).await;
        // Counted once dispatched: a paused command is decided again.
        if done || closes || self.input.rbuf.len() != before {
            let class = crate::observe::metrics::class_of(command.spec);
            self.ctx.ops.metrics.command(class, outcome);
            self.audit_dispatched(command, outcome);
        }
        if done { Flow::Next } else { Flow::Stop }
    }

    /// Sends the current run of forwardable commands as one batch, and the parked ones.
    /// Not an `async fn`: what it does is synchronous unless a connection's queue is full,
    /// and only that rare wait is a (boxed) future, so the futures that flush a run, every
    /// read's among them, stay small.
    pub(super) fn flush_run(&mut self, run: &mut Run) -> impl Future<Output = ()> + Send + '_ {
        let blocked = self.flush_run_now(run);
        async move {
            if let Some((blocked, parked)) = blocked {
                Box::pin(self.flush_blocked(blocked, parked)).await;
            }
        }
    }

    /// `flush_run` up to a full queue: `Some` with the batch that waits (the runs after it in
    /// its `rest`) and whether there were parked runs.
    fn flush_run_now(&mut self, run: &mut Run) -> Option<(Box<Blocked>, bool)> {
        let run = std::mem::take(run);
        let parked = self.routing.take_parked();
        let had_parked = !parked.is_empty();
        if let Some(blocked) = self.send_in_turn(run, parked.into_iter()) {
            return Some((blocked, had_parked));
        }
        if had_parked {
            // Segments answered with an error right away may now head the reply order.
            self.queue.flush_local_slots();
        }
        None
    }

    /// Sends `first`, then `rest`, in order, until a queue is full: the batch that waits,
    /// with the runs after it in its `rest`.
    fn send_in_turn(
        &mut self,
        first: Run,
        mut rest: std::vec::IntoIter<Run>,
    ) -> Option<Box<Blocked>> {
        let mut next = Some(first);
        while let Some(run) = next {
            if let Some(mut blocked) = self.send_run_now(run) {
                blocked.rest = rest.collect();
                return Some(blocked);
            }
            next = rest.next();
        }
        None
    }

    /// The rest of a flush once a queue was full: each batch waits for room in turn.
    async fn flush_blocked(&mut self, mut blocked: Box<Blocked>, parked: bool) {
        loop {
            let mut rest = self.send_blocked(blocked).await.into_iter();
            let Some(first) = rest.next() else { break };
            match self.send_in_turn(first, rest) {
                Some(next) => blocked = next,
                None => break,
            }
        }
        if parked {
            // As in `flush_run_now`.
            self.queue.flush_local_slots();
        }
    }
}
