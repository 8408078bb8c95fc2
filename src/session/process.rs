//! The session's command path: `process` reads commands and `execute` carries out what
//! was decided for each.

use super::Session;
use super::action::{Action, Flow, Lone, Now, Spreading};
use super::client::ReplyMode;
use super::client_kill;
use super::cluster;
use super::conn::Transaction;
use super::effect::{Effect, LocalEffect};
use super::replies::with_client_id;
use super::run::Run;
use crate::policy::Client;
use crate::protocol::answers;
use crate::protocol::codec::{self, Decoded};
use crate::protocol::error::{ProxyError, UpstreamError, error_reply};
use bytes::{Buf, Bytes, BytesMut};
use std::sync::Arc;

impl Session {
    /// Who the policy judges: this client's id, address, tenant and (only for a policy that
    /// shares a rule by user) its login's key, hashed per command rather than kept, so a
    /// reload that adds `share_by: user` needs nothing from the sessions.
    pub(super) fn policy_client(&self) -> Client {
        Client {
            id: self.client.id,
            addr: self.client.peer.ip(),
            tenant: self.client.tenant,
            user: if self.client.policy.reads_user() {
                crate::policy::user_key(self.client.names.user().map(|u| &u[..]))
            } else {
                0
            },
            again: false,
        }
    }

    /// The policy's Redis-counted rate limits for the command being decided, run on the
    /// control connection of the upstream (any primary in cluster mode).
    pub(super) async fn shared_limits(&self, command: &str, again: bool) -> Option<Bytes> {
        let client = Client {
            again,
            ..self.policy_client()
        };
        let transport = || match self.routing.router() {
            None => self.ctx.pool.control(),
            Some(router) => crate::upstream::pool::Control::cluster(router.clone()),
        };
        let policy = self.client.policy.clone();
        policy
            .check_shared_limits(&client, command, transport)
            .await
    }

    /// Parses and dispatches every complete request in the read buffer, stopping early when
    /// order or backpressure requires waiting for replies.
    pub(super) async fn process(&mut self) {
        self.follow_reload();
        // A cutover (`mirror::cutover`) closes the gate: no new command is taken until it
        // opens (the session is paused, and woken by the idle tick's notifier).
        if !self.ctx.ops.cutover.gate.enter() {
            self.input.paused = true;
            return;
        }
        self.routing.keep_map();
        let mut run = Run::default();
        while !self.input.closing {
            if self.ctx.ops.cutover.gate.is_closed() {
                self.input.paused = true;
                break;
            }
            if self.queue.inflight + self.routing.parked_frames() + run.frames as usize
                >= self.ctx.max_inflight
            {
                break;
            }
            let Some(decoded) = self.next_request(&mut run).await else {
                break;
            };
            match decoded {
                Decoded::Empty { len } => {
                    // Redis ignores these; forwarding them with the run is harmless and keeps
                    // the run contiguous (a copied run simply leaves them out).
                    run.len += len;
                }
                Decoded::Command { len } => {
                    // Most commands join the run without waiting for anything: decided and
                    // added synchronously, so no future is built for them.
                    let flow = match self.on_command_now(&mut run, len) {
                        Now::Done(flow) => flow,
                        // Boxed: the commands that wait (dedicated connections, shared
                        // limits, transactions…) carry the largest futures, which would
                        // otherwise make every read's boxed `process` future large.
                        Now::Later(pending) => Box::pin(self.on_command(&mut run, pending)).await,
                    };
                    if flow == Flow::Stop {
                        break;
                    }
                }
                Decoded::Inline { len, args } => {
                    // Replace the inline form by its RESP encoding in the buffer, then decode
                    // it like any command: the upstream runs exactly what was classified.
                    self.flush_run(&mut run).await;
                    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                    let mut resp = BytesMut::from(&codec::encode(&refs)[..]);
                    resp.extend_from_slice(&self.input.rbuf[len..]);
                    self.input.rbuf = resp;
                }
            }
        }
        self.flush_run(&mut run).await;
        self.ctx.ops.cutover.gate.leave();
    }

    /// Picks up a reloaded policy: from the next read on, commands are checked against it,
    /// and the client's tenant is the one it maps to.
    pub(super) fn follow_reload(&mut self) {
        let policy = self.ctx.policy.load_full();
        if !Arc::ptr_eq(&policy, &self.client.policy) {
            self.client.policy = policy;
            let user = self.client.names.user().cloned();
            self.login(user);
        }
    }

    /// Pauses processing at the command just decided, which is decided again once resumed:
    /// the policy judged it already (`Input::judged`).
    pub(super) fn pause_decided(&mut self) {
        self.input.paused = true;
        self.input.judged = true;
    }

    /// Carries out a non-batchable action for the command occupying the first `len` bytes of
    /// the read buffer. Returns `false` when processing must pause (nothing consumed).
    pub(super) async fn execute(&mut self, action: Action, lone: Lone) -> bool {
        let len = lone.len;
        match action {
            Action::Forward {
                target,
                expect,
                effect,
            } => return self.forward(lone, target, expect, effect, None).await,
            Action::Rewritten {
                target,
                expect,
                effect,
                rewrite,
            } => {
                return self
                    .forward(lone, target, expect, effect, Some(*rewrite))
                    .await;
            }
            Action::Local(reply, effect) => self.answer_local(len, reply, effect),
            Action::LocalThenClose(reply) => {
                self.input.rbuf.advance(len);
                self.queue.local(reply);
                self.input.closing = true;
            }
            Action::Silent(mode) => {
                self.input.rbuf.advance(len);
                if self.client.reply_mode != ReplyMode::Off || mode == ReplyMode::Off {
                    self.client.reply_mode = mode;
                }
            }
            Action::Hello { proto, name, login } => {
                Box::pin(self.answer_hello(len, proto, name, login)).await;
            }
            Action::Refused(reply) => {
                self.input.rbuf.advance(len);
                if let Some(multi) = &mut self.conn.multi {
                    multi.refused = true;
                }
                self.answer(reply);
            }
            // Commands answered from several nodes (or, for sharded pub/sub, by the session),
            // and RESET: every earlier command must have run first, on whichever node (a SCAN
            // sees earlier writes; split parts go out at once).
            Action::Gather(_) | Action::Reset | Action::AwaitReplies if self.queue.inflight > 0 => {
                self.pause_decided();
                return false;
            }
            Action::Gather(gather) if gather.blocks() => {
                self.input.rbuf.advance(len);
                // XREAD … BLOCK across slots: answered now, or later in its reply slot.
                if let Some(reply) = Box::pin(self.blocking_read(*gather)).await {
                    self.answer(reply);
                }
            }
            Action::Gather(gather) => {
                self.input.rbuf.advance(len);
                let pushing = gather.confirms_subscriptions();
                let reply = Box::pin(self.gather(*gather)).await;
                if pushing && reply.first() != Some(&b'-') {
                    // Redis sends subscription confirmations as it sends messages, whatever
                    // CLIENT REPLY says (state fuzzer): the skip is still spent.
                    self.queue.local(reply);
                    if self.client.reply_mode == ReplyMode::Skip {
                        self.client.reply_mode = ReplyMode::On;
                    }
                } else {
                    self.answer(reply);
                }
            }
            // Nothing in flight: `decide` never asks for this then (its wait is for a reply).
            Action::AwaitReplies => {
                self.pause_decided();
                return false;
            }
            Action::Reset => {
                self.input.rbuf.advance(len);
                // Redis clears CLIENT REPLY OFF (RESET is answered) but not a SKIP already
                // in force for this very command (RESET is not answered).
                let skipped = self.client.reply_mode == ReplyMode::Skip;
                Box::pin(self.release_subscriptions()).await;
                self.reset();
                if !skipped {
                    self.queue.local(answers::reset());
                }
            }
            Action::Kill(filter) => {
                self.input.rbuf.advance(len);
                // Boxed: rare, and it may ask the upstream about a user.
                Box::pin(self.kill(*filter)).await;
            }
            Action::Summon(summon) => return Box::pin(self.summon(*summon, lone)).await,
            // `on_command` carries these out and decides the command again, so none comes
            // here; were one to, the command must not run unplaced: closed, with the reason.
            Action::Prepare(prepare) => {
                self.input.rbuf.advance(len);
                self.queue.local(prepare.unmet());
                self.input.closing = true;
            }
            Action::Spread(spreading) => {
                let Spreading { spread, then } = *spreading;
                Box::pin(self.spread(spread)).await;
                return Box::pin(self.execute(then, lone)).await;
            }
        }
        true
    }

    /// CLIENT KILL (consumed already): closes the clients `filter` names and answers. Without
    /// proxy users, a `USER` names one of the upstream's users, and Redis refuses a user it
    /// does not have: asked on the control connection (`ACL GETUSER`, null for none; an
    /// error there, such as a user without ACL rights, leaves the name to match nothing).
    pub(super) async fn kill(&mut self, filter: client_kill::KillFilter) {
        if let Some(user) = &filter.user
            && !self.client.policy.access.has_users()
            && user.as_slice() != b"default"
        {
            let asked = self
                .ctx
                .pool
                .control()
                .request(&[b"ACL", b"GETUSER", user])
                .await;
            if asked.is_ok_and(|r| r.starts_with(b"$-1") || r.starts_with(b"*-1")) {
                self.answer(answers::no_such_user(user));
                return;
            }
        }
        let ctx = &self.ctx;
        let outcome =
            ctx.client_list
                .kill(self.client.id, self.client.tenant, &filter, &ctx.idle_tick);
        self.answer(filter.reply(outcome.killed));
        // Redis closes a client that killed itself once its reply is written.
        self.input.closing |= outcome.caller;
    }

    /// Queues a reply the proxy made (or gathered) for the command just consumed, unless the
    /// client switched replies off; a CLIENT REPLY SKIP is used up by it.
    pub(super) fn answer(&mut self, reply: Bytes) {
        if self.client.reply_mode == ReplyMode::On {
            self.queue.local(reply);
        }
        if self.client.reply_mode == ReplyMode::Skip {
            self.client.reply_mode = ReplyMode::On;
        }
    }

    /// Answers a command the proxy handles itself, and applies the session state it changes.
    pub(super) fn answer_local(&mut self, len: usize, reply: Bytes, effect: LocalEffect) {
        // A held command, and a deferred MULTI, keep their bytes as the client sent them
        // (shared with the read buffer, not copied).
        let held = if matches!(effect, LocalEffect::HoldInMulti | LocalEffect::DeferMulti) {
            Some(self.input.rbuf.split_to(len).freeze())
        } else {
            self.input.rbuf.advance(len);
            None
        };
        if effect == LocalEffect::ReplyMode(ReplyMode::On) {
            // CLIENT REPLY ON is answered even while replies are off.
            self.client.reply_mode = ReplyMode::On;
        }
        self.answer(reply);
        match effect {
            LocalEffect::None | LocalEffect::ReplyMode(_) => {}
            LocalEffect::SetName(name) => self.name_client(name),
            LocalEffect::SetLib(version, value) => {
                self.ctx
                    .client_list
                    .update(self.client.id, |r| r.names.set_lib(version, value.clone()));
                self.client.names.set_lib(version, value);
            }
            LocalEffect::Login(user) => self.login(Some(user)),
            LocalEffect::DeferMulti => {
                self.routing.multi_ended();
                if let Some(multi) = held {
                    self.routing.defer_multi(multi);
                }
                self.conn.multi = Some(Transaction {
                    deferred: true,
                    refused: std::mem::take(&mut self.conn.watch_lost),
                    ..Transaction::default()
                });
            }
            LocalEffect::EndMulti => self.apply(Effect::EndMulti),
            LocalEffect::HoldInMulti => {
                if let Some(command) = held {
                    self.routing.hold_in_multi(command);
                }
            }
        }
    }

    /// HELLO answered by the proxy: the upstream's HELLO reply (as one server in cluster
    /// mode) with this client's id; the RESP version and name apply once it succeeded.
    /// Names the client (CLIENT SETNAME, HELLO SETNAME) in the session and in CLIENT LIST.
    pub(super) fn name_client(&mut self, name: Option<Bytes>) {
        self.client.set_name(&self.ctx.client_list, name);
    }

    /// An upstream's HELLO reply as this client sees it: its own id (HELLO and CLIENT ID
    /// agree), and in cluster mode the `standalone` the proxy presents itself as.
    pub(super) fn hello_as_seen(&self, reply: &Bytes) -> Bytes {
        let reply = with_client_id(reply, self.client.id);
        if self.routing.is_cluster() {
            cluster::as_standalone(reply)
        } else {
            reply
        }
    }

    pub(super) async fn answer_hello(
        &mut self,
        len: usize,
        proto: u8,
        name: Option<Bytes>,
        login: Option<Bytes>,
    ) {
        if login.is_some() {
            self.login(login);
        }
        self.input.rbuf.advance(len);
        let reply = match self.ctx.pool.hello(proto).await {
            Some(reply) => self.hello_as_seen(&reply),
            None => error_reply(&ProxyError::Upstream(UpstreamError::Unavailable {
                addr: self.ctx.pool.addr(),
                reason: "no connection established yet".into(),
            })),
        };
        let ok = reply.first() != Some(&b'-');
        self.answer(reply);
        if ok {
            self.client.proto = proto;
            if let Some(mut cluster) = self.cluster_session() {
                cluster.conns_follow_proto();
            }
            let named = name.is_some();
            if named {
                self.client.names.set_name(name.clone());
            }
            // CLIENT LIST shows what HELLO negotiated, as Redis's does.
            self.ctx.client_list.update(self.client.id, |r| {
                r.resp = proto;
                if named {
                    r.names.set_name(name);
                }
            });
        }
    }
}
