//! Deciding what to do with one command: the policy verdict, then the route (shared or
//! dedicated connection, proxy-answered, refused) and the session state it changes.

use super::action::{Action, Command, Decision};
use super::client::ReplyMode;
use super::conn::{Holds, Target};
use super::effect::{Effect, LocalEffect};
use super::pause::Paused;
use super::{Session, client_kill, client_list, config_get, replies};
use crate::commands::classify::{ClientSub, Kind};
use crate::commands::{CommandSpec, grammar};
use crate::policy::script_user::State;
use crate::policy::{Client, Verdict};
use crate::upstream::{Expect, ReplyWait};
use crate::{commands::classify, protocol::answers, protocol::codec};
use bytes::Bytes;
use std::ops::Range;

use crate::policy::access::{AuthFailure, constant_time_eq};

impl Session {
    /// Decides what to do with a command; pure, so a paused command is decided again later.
    /// `spec` is the command's table entry, looked up once by the caller; `queued` the
    /// target of the commands decided but not sent yet (cluster replica reads look at it).
    pub(super) fn decide(
        &self,
        frame: &[u8],
        command: &Command,
        queued: Option<Target>,
    ) -> Decision {
        let spec = command.spec;
        let args = Args {
            frame,
            ranges: &self.input.args,
        };
        if let Some(refusal) = nul_in_name(&args, spec) {
            return Action::Refused(refusal).into();
        }
        if self.client.policy.access.require_auth
            && self.client.names.user().is_none()
            && !matches!(
                command.kind,
                Kind::Auth | Kind::Hello | Kind::Quit | Kind::Reset
            )
        {
            return Action::Refused(answers::noauth()).into();
        }
        if self.conn.multi_unopened() {
            return unopened_multi(command.kind).into();
        }
        if self.conn.resetting || self.watch_unanswered() || self.state_unsettled(command.kind) {
            return Action::AwaitReplies.into();
        }
        // The proxy's own commands are not Redis commands: no policy rule applies to them.
        if args.get(0).eq_ignore_ascii_case(b"PROXY") {
            return Action::Local(self.proxy_command(&args), LocalEffect::None).into();
        }
        let mut rewrite = None;
        if !self.client.policy.is_empty() {
            let client = Client {
                again: command.again,
                ..self.policy_client()
            };
            match self.client.policy.check_spec(&client, spec, &args) {
                Verdict::Allow => {}
                // Inside MULTI the refused command must still spoil the transaction, as a
                // command Redis rejects at queue time does (see `Effect::AbortExec`).
                Verdict::Refuse(reply) => return Action::Refused(reply).into(),
                Verdict::Rewrite(rw) => rewrite = Some(rw),
            }
        }
        let action = match (self.route(&args, command.kind, spec), rewrite) {
            (
                Action::Forward {
                    target,
                    expect,
                    effect,
                },
                Some(rewrite),
            ) if expect == Expect::Frames(1) || rewrite.strip.is_some() => {
                if rewrite.strip.as_ref().is_some_and(|s| s.names_data()) && self.conn.in_multi() {
                    // EXEC's reply would carry the unstripped names.
                    return Action::Refused(answers::namespace_scan_in_multi()).into();
                }
                Action::Rewritten {
                    target,
                    expect,
                    effect,
                    rewrite: Box::new(rewrite),
                }
            }
            // The route's own refusal stands, rewrite or not.
            (refused @ Action::Refused(_), Some(_)) => refused,
            // A rewrite the route cannot carry (a pub/sub or local command) must never turn
            // into forwarding the original: refuse instead.
            (_, Some(_)) => Action::Refused(answers::cannot_rewrite()),
            (action, None) => action,
        };
        let action = if self.conn.in_multi() && answered_by_proxy(&action) {
            // Redis would queue it and answer it inside EXEC's array; the proxy answers it
            // itself, at once, and cannot put that answer into EXEC's reply (a CLIENT GETNAME
            // answered `$-1` where Redis says +QUEUED leaves the client's count of EXEC's
            // replies one short; state fuzzer). Refused, which spoils the transaction as a
            // command Redis rejects at queue time does.
            Action::Refused(answers::proxy_answered_in_multi(
                spec.map_or("this command", |s| s.name),
            ))
        } else {
            action
        };
        let action = self.around_pause(action, spec);
        match (self.cluster_view(), self.replica_reads()) {
            (None, None) => action.into(),
            (Some(cluster), _) => cluster.place(action, &args, spec, queued),
            (None, Some(reads)) => reads.place_read(action, spec, queued).into(),
        }
    }

    /// While a forwarded `CLIENT PAUSE` is in force, a command Redis holds back goes on the
    /// client's dedicated connection (see `pause`), so it holds only its own client.
    fn around_pause(&self, action: Action, spec: Option<&CommandSpec>) -> Action {
        let paused = self.ctx.pause.current();
        if paused == Paused::Nothing || !super::pause::holds(paused, spec) {
            return action;
        }
        match action.forwarded() {
            Some((Target::Shared(..), Effect::None, _)) => action.rerouted(
                self.dedicated_target(),
                Effect::Blocking(ReplyWait::Unbounded),
            ),
            _ => action,
        }
    }

    /// Where a command goes and what it changes, policy aside.
    fn route(&self, args: &Args<'_>, kind: Kind, spec: Option<&CommandSpec>) -> Action {
        let current = self.current_target();
        if spec.is_some_and(|s| !s.arity_accepts(args.len())) {
            // Redis refuses a command whose argument count its arity does not allow before
            // anything else (subscribed context, MULTI's own checks): it changes no state, so
            // none is recorded here. `MULTI x` opening a transaction in the proxy's view only
            // made a RESP3 SUBSCRIBE after it wait for a +QUEUED that never came (fuzzer seed
            // 52316624), and `RESET x` was answered +RESET while Redis answers an error.
            if let Some(s) = spec
                && self.conn.multi_deferred()
            {
                // In front of a cluster, a transaction's keyless commands before its first
                // key are answered `+QUEUED` by the proxy and held (docs/cluster.md); Redis
                // refuses this one at queue time, which spoils the transaction (state fuzzer),
                // or, for EXEC, ends it with EXECABORT.
                if kind == Kind::Exec {
                    let why = answers::wrong_arity(s.name);
                    return Action::Local(answers::exec_rejected(&why), LocalEffect::EndMulti);
                }
                return Action::Refused(answers::wrong_arity(s.name));
            }
            // Except EXEC: Redis answers EXECABORT and discards the transaction, so commands
            // pipelined after it are no longer queued (state fuzzer: a SUBSCRIBE after `EXEC
            // extra`, taken for queued, left the next replies waited for in vain).
            if kind == Kind::Exec && self.conn.in_multi() {
                return forward(current, Effect::EndMulti);
            }
            return forward(current, Effect::None);
        }
        if spec.is_none() && self.conn.multi_deferred() {
            // Likewise a command Redis does not know.
            let container = crate::commands::lookup(args.get(0), None)
                .is_some_and(|c| c.is_container() && args.len() > 1);
            return Action::Refused(if container {
                answers::unknown_subcommand(args.get(0), args.get(1))
            } else {
                answers::unknown_command(args.get(0), args.iter().skip(1))
            });
        }
        if self.resp2_subscribed() && !runs_while_subscribed(args, kind) {
            // Redis refuses it: nothing it would change (MULTI, WATCH, SELECT, CLIENT
            // SETNAME…) changes, and the proxy answers none of it itself. In front of one
            // server, in the server's own words; a cluster node would first redirect a key
            // it does not own, so the proxy answers as the node would for one it owns.
            if self.routing.router().is_none() {
                return forward(self.dedicated_target(), Effect::None);
            }
            return subscribed_context_refusal(args);
        }
        match kind {
            Kind::Plain
                if args.len() >= 2 && config_get::is_config_get(args.get(0), args.get(1)) =>
            {
                if self.conn.in_multi() {
                    Action::Refused(answers::config_get_in_multi())
                } else {
                    forward(current, Effect::ConfigGet)
                }
            }
            Kind::Plain => forward(current, Effect::None),
            Kind::Info => forward(current, info_effect(args)),
            Kind::Proxy => Action::Local(self.proxy_command(args), LocalEffect::None),
            Kind::Blocking => forward(self.dedicated_target(), Effect::Blocking(self.wait(args))),
            Kind::Script => self.route_script(current),
            Kind::Wait => forward(self.dedicated_target(), Effect::Wait(self.wait(args))),
            Kind::StreamRead => {
                if classify::stream_read_blocks(args.iter()) {
                    forward(self.dedicated_target(), Effect::Blocking(self.wait(args)))
                } else {
                    forward(current, Effect::None)
                }
            }
            Kind::Multi => forward(self.dedicated_target(), Effect::Multi),
            Kind::Exec if self.conn.in_multi() && self.conn.multi_refused() => {
                forward(self.dedicated_target(), Effect::AbortExec)
            }
            Kind::Exec | Kind::Discard => forward(current, Effect::EndMulti),
            Kind::Watch => forward(self.dedicated_target(), Effect::Watch),
            Kind::Unwatch => forward(current, Effect::Unwatch),
            Kind::Subscribe(_) | Kind::Unsubscribe(_) => self.decide_pubsub(args, kind, current),
            Kind::Hello => self.decide_hello(args, current),
            Kind::Auth => self.decide_auth(args, current),
            Kind::Select => self.decide_select(args, current),
            Kind::Client => self.decide_client(args, current),
            Kind::Quit => Action::LocalThenClose(answers::ok()),
            // Answered by the proxy, whatever the policy: on a shared connection the RDB and
            // the replication stream that follow would be read as replies of every client's
            // commands, dropping the connection for all of them.
            Kind::Replication => Action::Refused(answers::replication_not_proxied()),
            Kind::ScriptAdmin
                if args.len() == 3 && classify::script_debugger(args.get(1), args.get(2)) =>
            {
                Action::Refused(answers::script_debugger_not_proxied())
            }
            Kind::ScriptAdmin => forward(current, Effect::None),
            Kind::Reset => self.decide_reset(),
            Kind::Monitor => Action::Forward {
                target: self.dedicated_target(),
                expect: Expect::Monitor,
                effect: Effect::Monitor,
            },
        }
    }

    /// Scripts go on the session's own connection (not pinned, like a blocking command):
    /// while a script keeps Redis busy, other clients' commands on the shared connection get
    /// Redis's `-BUSY` and `SCRIPT KILL`/`FUNCTION KILL` get through, as they would directly,
    /// instead of waiting behind the script until the command timeout declares the shared
    /// connection dead. Under `upstream.script_acl: confine` that connection is logged in as
    /// the script user (in cluster mode too), so the deny rules hold inside the script; one
    /// that cannot be (the user is unavailable, the client logged in as another upstream
    /// user) is refused unless `upstream.unconfined_scripts: run`. In cluster mode `place`
    /// picks the node (its keys' slot's owner) and a cluster SCRIPT KILL / FUNCTION KILL
    /// asks every primary (`cluster::gather`), so it reaches the node running the script.
    fn route_script(&self, current: Target) -> Action {
        let unconfined = |current| {
            if self.ctx.scripts_dedicated {
                forward(self.dedicated_target(), Effect::Script)
            } else {
                forward(current, Effect::None)
            }
        };
        let user = self.ctx.ops.metrics.script_user.load();
        let Some(user) = user.as_deref() else {
            return unconfined(current);
        };
        let why = if self.own_login() {
            // A client logged in as its own upstream user runs scripts with that user's
            // rights; with no deny rule to hold (`policy/passthrough.yaml`) that is exactly
            // what it would get from Redis directly, so nothing is refused.
            if user.denials().removals.is_empty() {
                return unconfined(current);
            }
            Some("this connection is logged in as another upstream user".to_string())
        } else {
            let state = user.state();
            let unavailable = match &*state {
                State::Unavailable(why) => Some(why.replace(['\r', '\n'], " ")),
                _ => None,
            };
            match &self.conn.dedicated {
                // A live connection keeps the login it was opened with.
                Some(d) if !d.tx.is_closed() && d.confined => None,
                Some(d) if !d.tx.is_closed() => Some(unavailable.unwrap_or_else(|| {
                    "this client's upstream connection was opened before the script user was \
                     set up; reconnect"
                        .to_string()
                })),
                // A new connection is logged in as the script user, or fails.
                _ => unavailable,
            }
        };
        match why {
            None => forward(self.dedicated_target(), Effect::Script),
            Some(_) if user.run_unconfined => unconfined(current),
            Some(why) => Action::Refused(answers::script_unconfined(&why)),
        }
    }

    /// SUBSCRIBE-family commands go to the dedicated connection, which then holds the
    /// subscriptions; an UNSUBSCRIBE expects as many confirmations as Redis sends (one per
    /// channel named even when not subscribed, one per subscription for a bare one).
    fn decide_pubsub(&self, args: &Args<'_>, kind: Kind, current: Target) -> Action {
        if self.conn.in_multi() && self.confirms_several(args, kind) {
            // Redis queues it with one `+QUEUED`, then EXEC's array carries one
            // confirmation per channel for one command (redis/redis#12207): more frames than
            // the array counts, which no client, and no session view, can read in step.
            return Action::Refused(answers::pubsub_several_in_multi(args.get(0)));
        }
        // Queued inside MULTI, it is answered `+QUEUED` (one frame, which a MULTI the proxy
        // deferred in cluster mode precedes with its own `+OK`); EXEC's array carries the
        // confirmation.
        let queued = self.conn.in_multi();
        if let Kind::Unsubscribe(sub) = kind {
            let expect = match (args.len(), self.conn.holds(Holds::SUBSCRIPTIONS)) {
                _ if queued => Expect::Frames(1),
                (1, true) => Expect::UnsubscribeAll(sub),
                // One confirmation with a nil channel. Counted as a confirmation, not a
                // plain reply: in RESP3 it is a push frame, which a dedicated connection
                // awaiting a plain reply hands on as a push, giving the command's slot the
                // next command's reply (every reply after it one late; state fuzzer).
                (1, false) => Expect::Confirmations(1),
                // Subscribed or not, Redis confirms each channel named: one command whose
                // reply is n frames (not n commands, which would hand the later frames to
                // the replies of the commands after it).
                (n, _) => Expect::Confirmations(n as u32 - 1),
            };
            // To the connection that holds the subscriptions (a RESP3 subscriber's other
            // commands take the shared path).
            let target = if self.conn.holds(Holds::SUBSCRIPTIONS) {
                self.dedicated_target()
            } else {
                current
            };
            return Action::Forward {
                target,
                expect,
                effect: Effect::Unsubscribe(sub),
            };
        }
        let Kind::Subscribe(sub) = kind else {
            return forward(current, Effect::None);
        };
        let expect = if args.len() > 1 && !queued {
            Expect::Confirmations(args.len() as u32 - 1)
        } else {
            Expect::Frames(1)
        };
        Action::Forward {
            target: self.dedicated_target(),
            expect,
            effect: Effect::Subscribe(sub),
        }
    }

    /// Whether a SUBSCRIBE-family command may be confirmed by more than one frame: several
    /// channels named, or an UNSUBSCRIBE of all on a connection that holds subscriptions
    /// (their number at the moment it runs is not known here).
    fn confirms_several(&self, args: &Args<'_>, kind: Kind) -> bool {
        match kind {
            Kind::Unsubscribe(_) if args.len() == 1 => self.conn.holds(Holds::SUBSCRIPTIONS),
            _ => args.len() > 2,
        }
    }

    /// AUTH: checked by the proxy when it names one of the proxy's users (or, under
    /// `require_auth`, whatever it names: see `proxy_checks_login`); otherwise the client's
    /// own Redis login, as without proxy users: answered `OK` when it names the pool's own
    /// credentials, else sent on a dedicated connection, which then holds another user's
    /// login. A Redis login never changes the client's proxy user or tenant.
    fn decide_auth(&self, args: &Args<'_>, current: Target) -> Action {
        let (user, pass) = match args.len() {
            2 => ("default".as_bytes(), args.get(1)),
            3 => (args.get(1), args.get(2)),
            _ => return forward(current, Effect::None),
        };
        if self.proxy_checks_login(user) {
            // The proxy checks AUTH; upstream credentials stay the pool's own.
            return match self.client.policy.access.authenticate_from(
                self.client.peer.ip(),
                user,
                pass,
            ) {
                Ok(()) => Action::Local(
                    answers::ok(),
                    LocalEffect::Login(Bytes::copy_from_slice(user)),
                ),
                Err(failure) => Action::Local(auth_refusal(failure), LocalEffect::None),
            };
        }
        let pool_user = self.ctx.upstream_user.as_deref().unwrap_or("default");
        match &self.ctx.upstream_password {
            // Answered OK only while the upstream accepts those credentials: after a change
            // of password Redis must say whether the client's AUTH works.
            Some(p)
                if !self.own_login()
                    && !self.ctx.pool.credentials_refused()
                    && constant_time_eq(user, pool_user.as_bytes())
                    && constant_time_eq(pass, p.as_bytes()) =>
            {
                Action::Local(answers::ok(), LocalEffect::None)
            }
            _ => forward(self.dedicated_target(), Effect::Auth),
        }
    }

    /// Whether an AUTH (or HELLO AUTH) naming `user` is the proxy's to check rather than
    /// Redis's: when it names one of the proxy's users (`access.users`, `access.cert_users`),
    /// and under `require_auth`, whatever it names — the proxy's users are then the only
    /// logins, so any other name is refused by the proxy with the WRONGPASS of a wrong
    /// password (which tells a guesser nothing about which names the proxy has) instead of
    /// reaching Redis, where it could never satisfy `require_auth` anyway. Every other AUTH
    /// is the client's own Redis login (the Redis password, a Redis ACL user): it goes on
    /// exactly as without proxy users, and the proxy's throttle is not consumed by it.
    fn proxy_checks_login(&self, user: &[u8]) -> bool {
        let access = &self.client.policy.access;
        access.require_auth || access.knows_user(user)
    }

    /// RESET: answered by the proxy, which drops the dedicated connection and with it what
    /// the client held there; but subscriptions outlive a closed connection until Redis reads
    /// the close, so a PUBLISH pipelined after the RESET (on the shared connection) could
    /// still count the client as a subscriber (state fuzzer). With subscriptions held, the
    /// RESET goes to Redis on their connection first, once nothing else is in flight, and the
    /// session resets when it is answered (`Effect::Reset`). Inside MULTI, with replies
    /// switched off, or with subscriptions on the mode's connections too (a cluster's shard
    /// channels), the proxy answers it, once each of those connections answered a RESET of
    /// its own (`release_subscriptions`). MONITOR the same way: a monitoring connection
    /// dropped by the proxy still carried lines Redis fed it before it read the close, which
    /// reached the client after its `+RESET` (one run in five of
    /// `cluster_routing::monitor_shows_every_primary`); Redis's own RESET stops the lines
    /// before its reply.
    fn decide_reset(&self) -> Action {
        let subscribed = self.conn.holds(Holds::SUBSCRIPTIONS)
            || self.conn.holds(Holds::SHARD_SUBSCRIPTIONS)
            || self.conn.holds(Holds::MONITOR);
        if !subscribed
            || self.conn.dedicated.is_none()
            || self.routing.subscription_conns().next().is_some()
            || self.conn.in_multi()
            || self.client.reply_mode != ReplyMode::On
        {
            return Action::Reset;
        }
        if self.queue.inflight > 0 {
            return Action::AwaitReplies;
        }
        Action::Forward {
            target: self.dedicated_target(),
            expect: Expect::Frames(1),
            effect: Effect::Reset,
        }
    }

    /// SELECT 0 on the shared connection is answered by the proxy; any other database pins
    /// the session to a dedicated connection where it is selected.
    fn decide_select(&self, args: &Args<'_>, current: Target) -> Action {
        if args.len() != 2 {
            return forward(current, Effect::None);
        }
        match codec::parse_int(args.get(1)) {
            Some(0) if !matches!(current, Target::Dedicated(_)) => {
                Action::Local(answers::ok(), LocalEffect::None)
            }
            Some(db) if db >= 0 => forward(self.dedicated_target(), Effect::Select(db)),
            _ => forward(current, Effect::None),
        }
    }

    /// How long a blocking command may keep its connection silent: its own timeout, except
    /// inside MULTI, where it is only queued (and EXEC never blocks).
    fn wait(&self, args: &Args<'_>) -> ReplyWait {
        if self.conn.in_multi() {
            return ReplyWait::Prompt;
        }
        let argv: Vec<&[u8]> = args.iter().collect();
        ReplyWait::blocking(classify::block_limit(&argv))
    }

    fn decide_hello(&self, args: &Args<'_>, current: Target) -> Action {
        if self.conn.in_multi() {
            // Redis queues it and switches the protocol at EXEC; the proxy reads every reply
            // before that in the protocol it knows, so it cannot follow (answered by the proxy
            // or forwarded, the same refusal).
            return Action::Refused(answers::proxy_answered_in_multi("hello"));
        }
        let mut proto = self.client.proto;
        // Credentials Redis checks (not one of the proxy's users).
        let mut auth = false;
        // One of the proxy's users, whose credentials the proxy checked.
        let mut login: Option<Bytes> = None;
        let mut name = None;
        // Redis's helloCommand runs the options in order, each as it comes: an AUTH or
        // SETNAME before a bad option has been done when the error is answered, and an AUTH
        // refused before a bad option is what is answered.
        let failed = |reply: Bytes, auth: bool, login: Option<Bytes>, name: Option<&[u8]>| {
            if auth {
                // Redis ran the AUTH it was given; its own error follows.
                return Action::Forward {
                    target: self.dedicated_target(),
                    expect: Expect::Frames(1),
                    effect: Effect::AuthHello(self.client.proto),
                };
            }
            let effect = match (login, name) {
                (Some(user), _) => LocalEffect::Login(user),
                (None, Some(n)) => LocalEffect::SetName(Some(Bytes::copy_from_slice(n))),
                (None, None) => LocalEffect::None,
            };
            Action::Local(reply, effect)
        };
        // A RESP2 subscriber's session may be in the subscribed context without the proxy
        // counting its subscriptions (a SUBSCRIBE run by EXEC), where Redis refuses any HELLO
        // before reading its version: a version Redis refuses is then Redis's to answer, on
        // the connection holding the subscriptions (state fuzzer, seed 22006596). It changes
        // nothing either way.
        let refused_version = |local: Bytes| {
            if self.client.proto == 2
                && self.conn.holds(Holds::SUBSCRIPTIONS)
                && !self.conn.in_multi()
            {
                forward(self.dedicated_target(), Effect::None)
            } else {
                Action::Local(local, LocalEffect::None)
            }
        };
        if args.len() >= 2 {
            match codec::parse_int(args.get(1)) {
                Some(v @ 2..=3) => proto = v as u8,
                Some(_) => return refused_version(answers::noproto()),
                None => return refused_version(answers::hello_bad_version()),
            }
            let mut j = 2;
            while j < args.len() {
                let more = args.len() - 1 - j;
                let opt = args.get(j);
                // Read as Redis's helloCommand reads them (`strcasecmp`: `AUTH\0` is AUTH).
                if grammar::keyword(opt, b"AUTH") && more >= 2 {
                    let (user, pass) = (args.get(j + 1), args.get(j + 2));
                    if self.proxy_checks_login(user) {
                        // The proxy checks the credentials; the upstream never sees them.
                        if let Err(failure) = self.client.policy.access.authenticate_from(
                            self.client.peer.ip(),
                            user,
                            pass,
                        ) {
                            return failed(auth_refusal(failure), auth, login, name);
                        }
                        // The last AUTH is who the client is, as after Redis's loop.
                        login = Some(Bytes::copy_from_slice(user));
                        auth = false;
                    } else {
                        login = None;
                        auth = true;
                    }
                    j += 3;
                } else if grammar::keyword(opt, b"SETNAME") && more >= 1 {
                    let n = args.get(j + 1);
                    if !grammar::valid_client_name(n) {
                        return failed(answers::bad_client_name(), auth, login, name);
                    }
                    name = Some(n);
                    j += 2;
                } else {
                    return failed(answers::hello_bad_option(opt), auth, login, name);
                }
            }
        }
        if !auth
            && login.is_none()
            && self.client.policy.access.require_auth
            && self.client.names.user().is_none()
        {
            return Action::Local(answers::hello_noauth(), LocalEffect::None);
        }
        // A session holding state (a RESP3 subscriber's commands take the shared path) changes
        // protocol on the connection that holds it, as Redis would.
        let holding = matches!(current, Target::Dedicated(_)) || self.stateful();
        if login.is_some() && holding && proto != self.client.proto {
            // Forwarded, the proxy user's credentials went to Redis (which refused them) and
            // the login was lost; answered here, the held connection would keep its protocol.
            return Action::Refused(answers::hello_login_switch_held());
        }
        // A proxy user's login on a held connection in the protocol it has: the proxy's own.
        if auth || (holding && login.is_none()) {
            return Action::Forward {
                target: self.dedicated_target(),
                expect: Expect::Frames(1),
                effect: if auth {
                    Effect::AuthHello(proto)
                } else {
                    Effect::Hello(proto)
                },
            };
        }
        Action::Hello {
            proto,
            name: name.map(Bytes::copy_from_slice),
            login,
        }
    }

    fn decide_client(&self, args: &Args<'_>, current: Target) -> Action {
        if args.len() < 2 {
            return Action::Forward {
                target: current,
                expect: Expect::Frames(1),
                effect: Effect::None,
            };
        }
        match classify::classify_client(args.get(1)) {
            ClientSub::SetName if args.len() == 3 => {
                let name = args.get(2);
                if grammar::valid_client_name(name) {
                    let name = (!name.is_empty()).then(|| Bytes::copy_from_slice(name));
                    Action::Local(answers::ok(), LocalEffect::SetName(name))
                } else {
                    Action::Local(answers::bad_client_name(), LocalEffect::None)
                }
            }
            ClientSub::GetName if args.len() == 2 => Action::Local(
                match self.client.names.name() {
                    Some(n) => answers::bulk(n),
                    None => answers::null(self.client.proto),
                },
                LocalEffect::None,
            ),
            // Answered by the proxy when the server has it (7.2+): on a shared connection
            // one client's library would show in every other client's CLIENT INFO.
            ClientSub::SetInfo
                if args.len() == 4
                    && crate::commands::lookup(b"client", Some(b"setinfo")).is_some() =>
            {
                set_info(args.get(2), args.get(3))
            }
            ClientSub::Id if args.len() == 2 => {
                Action::Local(answers::integer(self.client.id as i64), LocalEffect::None)
            }
            // Kept by the proxy, so it cannot be queued: refused inside MULTI (spoiling the
            // transaction) as Valkey 8+ refuses it (Redis queues it and changes the mode at
            // EXEC, which a shared connection cannot do).
            ClientSub::Reply if args.len() == 3 && self.conn.in_multi() => {
                Action::Refused(answers::client_reply_in_multi())
            }
            ClientSub::Reply if args.len() == 3 => reply_mode(args.get(2)),
            ClientSub::Info if args.len() == 2 => forward(current, Effect::ClientInfo),
            ClientSub::ConnectionState => {
                let target = self.dedicated_target();
                if self.no_touch_stops_the_server(args) {
                    return Action::Refused(answers::no_touch_stops_the_server());
                }
                if !args.get(1).eq_ignore_ascii_case(b"TRACKING") {
                    return forward(target, Effect::ConnectionState);
                }
                // Overlapping prefixes Redis 7.0–8.x would refuse and then apply, answering
                // twice (`grammar::tracking_prefixes_answered_twice`): refused here, once, as
                // Redis words it, and nothing applied. A refusal spoils an open MULTI (queued,
                // EXEC's reply would carry the extra `+OK`) and stands over a namespace's
                // rewrite (the prefixes are the tenant's own names: the same overlaps).
                if let Some((i, j)) = grammar::tracking_prefixes_answered_twice(args) {
                    let (p, q) = (args.get(i), args.get(j));
                    return Action::Refused(answers::tracking_prefixes_overlap(p, q));
                }
                // The REDIRECT Redis reads (`REDIRECT\0` too; a namespaced tenant's was refused
                // by the policy); options Redis refuses go on as written and Redis refuses them.
                let redirects: Vec<usize> = grammar::tracking_options(args)
                    .and_then(|o| o.redirect)
                    .into_iter()
                    .collect();
                if let Some(summon) = self.summon_for(args, &redirects, target) {
                    return Action::Summon(Box::new(summon));
                }
                self.with_upstream_ids(args, &redirects, target, Effect::ConnectionState, false)
            }
            ClientSub::Unblock if args.len() >= 3 => {
                self.with_upstream_ids(args, &[2], current, Effect::None, true)
            }
            ClientSub::Pause if args.len() >= 3 => forward(current, pause_effect(args)),
            ClientSub::Unpause => forward(current, Effect::Unpause),
            ClientSub::Redirect => forward(current, Effect::NamesRedirect),
            ClientSub::List => self.client_list(args),
            ClientSub::Kill => self.decide_kill(args),
            _ => forward(current, Effect::None),
        }
    }

    /// CLIENT KILL: carried out by the proxy on its own clients (`client_kill`); a filter
    /// Redis would refuse gets Redis's error. A `USER` the proxy's own users do not include
    /// is Redis's `No such user` (without proxy users the names are the upstream's, checked
    /// there when the KILL is carried out, `Session::kill`).
    fn decide_kill(&self, args: &Args<'_>) -> Action {
        let filter = match client_kill::parse(args) {
            Ok(filter) => filter,
            Err(reply) => return Action::Local(reply, LocalEffect::None),
        };
        let access = &self.client.policy.access;
        if let Some(user) = &filter.user
            && access.has_users()
            && user.as_slice() != b"default"
            && !access.knows_user(user)
        {
            return Action::Local(answers::no_such_user(user), LocalEffect::None);
        }
        Action::Kill(Box::new(filter))
    }

    /// A `CLIENT TRACKING … REDIRECT id` whose id is a live client of the caller's tenant
    /// without a dedicated connection (so no upstream id to name): that client's session is
    /// asked for one (`summon`). Standalone and Sentinel only: cluster connections are per
    /// node and not mapped (`client_ids`).
    fn summon_for(
        &self,
        args: &Args<'_>,
        redirects: &[usize],
        target: Target,
    ) -> Option<super::action::Summon> {
        if self.routing.router().is_some() {
            return None;
        }
        let &at = redirects.last()?;
        let id = codec::parse_int(args.get(at)).filter(|&id| id > 0)? as u64;
        let ids = &self.ctx.client_ids;
        let live = self.ctx.client_list.tenant(id) == Some(self.client.tenant);
        (live && id != self.client.id && ids.upstream(id).is_none()).then(|| {
            super::action::Summon {
                client: id,
                at,
                args: args.iter().map(Bytes::copy_from_slice).collect(),
                target,
            }
        })
    }

    /// CLIENT LIST, answered by the proxy about its own clients (see `client_list`).
    fn client_list(&self, args: &Args<'_>) -> Action {
        let filter = match list_filter(args) {
            Some(filter) => filter,
            // Valkey 8.1+ filters CLIENT LIST as CLIENT KILL filters (USER, ADDR, LADDR,
            // SKIPME, MAXAGE…); the proxy reads them the same way, caller included unless
            // `SKIPME yes`.
            None if self.server_filters_client_list() => match client_kill::parse(args) {
                Ok(mut kill) if !kill.old_form => {
                    kill.skipme = (2..args.len()).step_by(2).any(|i| {
                        grammar::keyword(args.get(i), b"SKIPME")
                            && grammar::keyword(args.get(i + 1), b"yes")
                    });
                    client_list::Filter::Kill(Box::new(kill))
                }
                Ok(_) => return Action::Local(answers::syntax_error(), LocalEffect::None),
                Err(reply) => return Action::Local(reply, LocalEffect::None),
            },
            None => return Action::Local(answers::syntax_error(), LocalEffect::None),
        };
        let text = self.ctx.client_list.render(
            self.client.id,
            self.client.tenant,
            args.frame.len(),
            &filter,
        );
        Action::Local(
            replies::text_reply(self.client.proto == 3, text.as_bytes()),
            LocalEffect::None,
        )
    }

    /// `CLIENT NO-TOUCH ON` where the server stops (SIGSEGV in `lookupKey`) when a no-touch
    /// client's write serves a client blocked on the key (BLPOP, XREAD BLOCK, BZPOPMIN…):
    /// any tenant could stop the server for every other. Measured on Redis 8.0.6; the fixes
    /// (redis/redis#14415, valkey-io/valkey#2347) name where it came in: Redis 8, Valkey 8.1.
    /// Which Redis 8 patch releases carry the fix is not measured, so every Redis 8 is
    /// treated alike. Valkey 9.1 takes it (measured).
    fn no_touch_stops_the_server(&self, args: &Args<'_>) -> bool {
        args.len() == 3
            && args.get(1).eq_ignore_ascii_case(b"NO-TOUCH")
            && grammar::keyword(args.get(2), b"ON")
            && (self.upstream_server_is("redis", |v| v.0 == 8)
                || self.upstream_server_is("valkey", |v| (v.0, v.1) == (8, 1)))
    }

    /// Whether the server filters CLIENT LIST by more than TYPE and ID (Valkey 8.1+).
    fn server_filters_client_list(&self) -> bool {
        self.upstream_server_is("valkey", |v| v >= (8, 1, 0))
    }

    /// Whether the upstream server read at start (`server_facts`) is `name` (`redis`,
    /// `valkey`) at a version `version` accepts; `false` while it is not read yet.
    pub(super) fn upstream_server_is(
        &self,
        name: &str,
        version: impl FnOnce((u32, u32, u32)) -> bool,
    ) -> bool {
        self.ctx
            .ops
            .metrics
            .upstream_server
            .load()
            .as_ref()
            .is_some_and(|s| s.name == name && version(s.parsed))
    }

    /// A CLIENT subcommand whose arguments at `positions` are client ids the proxy gave out,
    /// forwarded with Redis's ids of those clients' dedicated connections instead (see
    /// `client_ids`). An id with no such connection behind it, or of a client of another
    /// tenant, becomes one no connection has (Redis's largest), so Redis answers as for a
    /// client that is not there — and parses the rest of the command as always — instead of
    /// acting on an unrelated upstream connection that happens to carry the id (one of the
    /// proxy's shared ones), or on another tenant's client. In cluster mode the connection
    /// must also be one the command can reach from its node (`toward_named`, in
    /// `cluster::place`). `unblock`: CLIENT UNBLOCK, which also reaches the connection a
    /// client's XREAD … BLOCK across slots waits on (`ClientIds::unblockable`).
    fn with_upstream_ids(
        &self,
        args: &Args<'_>,
        positions: &[usize],
        mut target: Target,
        mut effect: Effect,
        unblock: bool,
    ) -> Action {
        let mapped: Vec<(usize, String)> = positions
            .iter()
            .filter_map(|&at| {
                // Not an id Redis accepts: left for Redis's own error.
                let id = codec::parse_int(args.get(at)).filter(|&id| id > 0)? as u64;
                let ids = &self.ctx.client_ids;
                let named = if unblock {
                    ids.unblockable(id)
                } else {
                    ids.upstream(id)
                };
                let named =
                    named.filter(|_| self.ctx.client_list.tenant(id) == Some(self.client.tenant));
                let named = match (named, self.cluster_view()) {
                    (Some(named), Some(cluster)) => {
                        cluster.toward_named(named, target).map(|placed| {
                            (target, effect) = placed;
                            named
                        })
                    }
                    (named, _) => named,
                };
                let upstream = named.map_or(i64::MAX as u64, |named| named.id);
                Some((at, upstream.to_string()))
            })
            .collect();
        if mapped.is_empty() {
            return forward(target, effect);
        }
        let mut parts: Vec<&[u8]> = args.iter().collect();
        for (at, id) in &mapped {
            parts[*at] = id.as_bytes();
        }
        Action::Rewritten {
            target,
            expect: Expect::Frames(1),
            effect,
            rewrite: Box::new(crate::policy::rewrite::Rewrite {
                command: Some(crate::protocol::codec::encode(&parts)),
                note: "client id mapped to its upstream connection".into(),
                ..Default::default()
            }),
        }
    }
}

/// Arguments of the command being decided, as slices of its frame.
pub(super) struct Args<'a> {
    /// The command's bytes; the ranges index into it.
    frame: &'a [u8],
    ranges: &'a [Range<usize>],
}

impl crate::policy::line::CommandLine for Args<'_> {
    fn argc(&self) -> usize {
        self.len()
    }
    fn arg(&self, i: usize) -> &[u8] {
        self.get(i)
    }
}

impl<'a> Args<'a> {
    pub(super) fn len(&self) -> usize {
        self.ranges.len()
    }

    pub(super) fn get(&self, i: usize) -> &'a [u8] {
        let r = &self.ranges[i];
        &self.frame[r.start..r.end]
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}

/// A command forwarded to `target` as it is, one reply expected.
fn forward(target: Target, effect: Effect) -> Action {
    Action::Forward {
        target,
        expect: Expect::Frames(1),
        effect,
    }
}

/// Whether INFO gets the proxy's section: sections named explicitly (`INFO memory`) are
/// Redis's alone; the default set, `all`, `everything` and `proxy` include the proxy's. Any
/// of those or `clients` shows the proxy's count of clients.
fn info_effect(args: &Args<'_>) -> Effect {
    let named = |names: &[&[u8]]| {
        args.iter()
            .skip(1)
            .any(|a| names.iter().any(|s| a.eq_ignore_ascii_case(s)))
    };
    if args.len() == 1 || named(&[b"default", b"all", b"everything", b"proxy"]) {
        Effect::Info
    } else if named(&[b"clients"]) {
        Effect::InfoClients
    } else {
        Effect::None
    }
}

/// A command or subcommand name with a NUL byte in it, answered as Redis answers an unknown
/// one, before anything else (Redis looks names up before it checks AUTH). Redis finds
/// command names in a hash table hashed over the whole name but compared with `strcasecmp`,
/// which stops at the NUL: whether `FLUSHALL\0<junk>` runs FLUSHALL depends on the server's
/// random hash seed and the junk (about one spelling in 200 does, on Redis 7.0), so an
/// attacker trying spellings would get past any deny rule; and a `CLIENT REPLY\0 OFF` the
/// session took for an unknown subcommand went to a shared connection. No client sends one
/// otherwise.
fn nul_in_name(args: &Args<'_>, spec: Option<&CommandSpec>) -> Option<Bytes> {
    let name = args.get(0);
    if name.contains(&0) {
        return Some(answers::unknown_command(name, args.iter().skip(1)));
    }
    if args.len() > 1 && spec.is_some_and(|s| s.name.contains('|')) && args.get(1).contains(&0) {
        return Some(answers::unknown_subcommand(name, args.get(1)));
    }
    None
}

/// Whether the session answers the command itself instead of Redis (QUIT and RESET aside,
/// which Redis does not queue inside MULTI either).
fn answered_by_proxy(action: &Action) -> bool {
    matches!(
        action,
        Action::Local(..)
            | Action::Silent(_)
            | Action::Hello { .. }
            | Action::Kill(_)
            | Action::Summon(_)
    )
}

/// CLIENT REPLY ON/OFF/SKIP: kept by the proxy, since the upstream connection is shared.
fn reply_mode(mode: &[u8]) -> Action {
    // As Redis reads them (`strcasecmp`: `ON\0` is ON), like every keyword below.
    if grammar::keyword(mode, b"ON") {
        Action::Local(answers::ok(), LocalEffect::ReplyMode(ReplyMode::On))
    } else if grammar::keyword(mode, b"OFF") {
        Action::Silent(ReplyMode::Off)
    } else if grammar::keyword(mode, b"SKIP") {
        Action::Silent(ReplyMode::Skip)
    } else {
        Action::Local(answers::syntax_error(), LocalEffect::None)
    }
}

/// CLIENT PAUSE's effect: what it holds back and for how long; none when Redis will refuse
/// the command (a timeout or mode it does not read, an argument too many), which pauses
/// nothing.
fn pause_effect(args: &Args<'_>) -> Effect {
    let mode = match args.len() {
        3 => Paused::All,
        4 if grammar::keyword(args.get(3), b"WRITE") => Paused::Writes,
        4 if grammar::keyword(args.get(3), b"ALL") => Paused::All,
        _ => return Effect::None,
    };
    match codec::parse_int(args.get(2)).and_then(|ms| u64::try_from(ms).ok()) {
        Some(ms) => Effect::Pause(mode, ms),
        None => Effect::None,
    }
}

/// Redis's rule for client names and library info: printable ASCII without spaces.
/// CLIENT SETINFO LIB-NAME|LIB-VER <value>, answered as Redis 7.2 answers it.
fn set_info(attr: &[u8], value: &[u8]) -> Action {
    let version = if grammar::keyword(attr, b"LIB-VER") {
        true
    } else if grammar::keyword(attr, b"LIB-NAME") {
        false
    } else {
        let text = format!("Unrecognized option '{}'", String::from_utf8_lossy(attr));
        return Action::Local(
            crate::protocol::error::simple_error("ERR", &text),
            LocalEffect::None,
        );
    };
    if !grammar::valid_client_name(value) {
        let text = format!(
            "{} cannot contain spaces, newlines or special characters.",
            String::from_utf8_lossy(attr)
        );
        return Action::Local(
            crate::protocol::error::simple_error("ERR", &text),
            LocalEffect::None,
        );
    }
    Action::Local(
        answers::ok(),
        LocalEffect::SetLib(version, Bytes::copy_from_slice(value)),
    )
}

/// The reply to a refused proxy-side AUTH: Redis's own for wrong credentials; a throttled
/// address is told how long to wait (its attempt was not checked).
fn auth_refusal(failure: AuthFailure) -> Bytes {
    match failure {
        AuthFailure::Wrong => answers::wrongpass(),
        AuthFailure::Throttled(wait) => answers::auth_throttled(wait),
    }
}

/// A command inside a transaction whose MULTI could not be sent: nothing reaches Redis until
/// the transaction ends (EXEC aborts, DISCARD ends it), so none of its commands runs outside
/// the transaction the client believes is open. QUIT and RESET act as always.
fn unopened_multi(kind: Kind) -> Action {
    match kind {
        Kind::Exec => Action::Local(answers::execabort(), LocalEffect::EndMulti),
        Kind::Discard => Action::Local(answers::ok(), LocalEffect::EndMulti),
        Kind::Multi => Action::Local(answers::nested_multi(), LocalEffect::None),
        Kind::Quit => Action::LocalThenClose(answers::ok()),
        Kind::Reset => Action::Reset,
        _ => Action::Local(answers::not_queued_unopened_multi(), LocalEffect::None),
    }
}

/// The filter of `CLIENT LIST [TYPE t] [ID id …]`; `None` for arguments Redis would refuse.
fn list_filter(args: &Args<'_>) -> Option<client_list::Filter> {
    use client_list::Filter;
    match args.len() {
        2 => Some(Filter::All),
        4 if grammar::keyword(args.get(2), b"TYPE") => {
            let t = args.get(3);
            if grammar::keyword(t, b"normal") {
                Some(Filter::Pubsub(false))
            } else if grammar::keyword(t, b"pubsub") {
                Some(Filter::Pubsub(true))
            } else if grammar::keyword(t, b"master")
                || grammar::keyword(t, b"replica")
                || grammar::keyword(t, b"slave")
            {
                Some(Filter::Nothing)
            } else {
                None
            }
        }
        n if n > 3 && grammar::keyword(args.get(2), b"ID") => (3..n)
            .map(|i| codec::parse_int(args.get(i)).and_then(|id| u64::try_from(id).ok()))
            .collect::<Option<Vec<u64>>>()
            .map(Filter::Ids),
        _ => None,
    }
}

/// What a RESP2 subscriber may send besides the SUBSCRIBE family: PING, QUIT and RESET, as
/// Redis allows (the proxy's own commands are answered before any routing, in `decide`).
fn runs_while_subscribed(args: &Args<'_>, kind: Kind) -> bool {
    match kind {
        Kind::Subscribe(_) | Kind::Unsubscribe(_) | Kind::Quit | Kind::Reset => true,
        _ => args.get(0).eq_ignore_ascii_case(b"PING"),
    }
}

/// Redis's refusal of a command a RESP2 subscriber may not send, naming it as Redis does
/// (`client|id` for a subcommand), after the name and argument count Redis checks first; EXEC's
/// refusal is an aborted transaction, as Redis answers any rejected EXEC (state fuzzer, in
/// front of a cluster).
pub(super) fn subscribed_context_refusal(args: &Args<'_>) -> Action {
    let sub = (args.len() > 1).then(|| args.get(1));
    let spec = crate::commands::lookup(args.get(0), sub);
    let name = spec.map_or(args.get(0), |s| s.name.as_bytes());
    let error = match spec {
        Some(s) if !s.arity_accepts(args.len()) => answers::wrong_arity(s.name),
        Some(_) => answers::not_in_subscribed_context(name),
        None => answers::unknown_command(args.get(0), args.iter().skip(1)),
    };
    if spec.is_some_and(|s| s.name == "exec") {
        return Action::Refused(answers::exec_rejected(&error));
    }
    Action::Refused(error)
}
