//! Connection state: what a dispatched command changes, and what that state means for routing.

use super::Session;
use super::client::ReplyMode;
use super::conn::{Holds, Target, Transaction};
use super::effect::Effect;
use super::reply_queue::Slot;
use crate::commands::classify::Kind;
use crate::protocol::reply::SubKind;
use crate::upstream::{Batch, Expect, ReplyWait};
use bytes::Bytes;
use tokio::sync::mpsc;

/// Sends `RESET` on each connection and waits for every answer (each bounded by its
/// connection's command timeout; a connection already gone answers nothing and holds
/// nothing). Redis drops a closed connection's subscriptions only once it reads the close,
/// so a command the client sends after its RESET, on another connection, could still count
/// them (a PUBLISH's receivers: state fuzzer); reset upstream first, they are gone.
pub(super) async fn reset_upstream<'a>(conns: impl Iterator<Item = &'a mpsc::Sender<Batch>>) {
    let (reply_to, mut rx) = crate::upstream::reply_channel();
    let mut sent = 0;
    for tx in conns {
        let batch = Batch {
            bytes: Bytes::from_static(b"*1\r\n$5\r\nRESET\r\n"),
            expect: Expect::Frames(1),
            wait: ReplyWait::Prompt,
            reply_to: reply_to.clone(),
            seq: 0,
        };
        if tx.send(batch).await.is_ok() {
            sent += 1;
        }
    }
    drop(reply_to);
    for _ in 0..sent {
        if rx.recv().await.is_none() {
            break;
        }
    }
}

impl Session {
    /// Sets the authenticated proxy user (`None`: anonymous) and the tenant that follows.
    pub(super) fn login(&mut self, user: Option<Bytes>) {
        self.client.names.set_user(user.clone());
        self.client.tenant = self.client.policy.access.tenant_of(
            self.client.peer.ip(),
            self.client.names.user().map(|u| &u[..]),
        );
        let tenant = self.client.tenant;
        self.ctx.client_list.update(self.client.id, |r| {
            r.names.set_user(user);
            r.tenant = tenant;
        });
    }

    /// Whether a command for `slot` (its hash slot, if keyed) must wait before going to
    /// `target`; when so, notes what it waits for. Standalone: any other target in flight.
    /// Cluster: between shared connections only a hash slot in flight on another one (its
    /// commands must run first, see `spread`); with a dedicated connection on either side,
    /// everything in flight, as standalone.
    pub(super) fn blocked(&mut self, target: Target, slot: Option<u16>) -> bool {
        // A dedicated connection about to be replaced (the client switched protocol since it
        // was opened, say) first answers what runs on it: replaced under a blocking command
        // it lost that command's reply (state fuzzer, `XREAD BLOCK … | HELLO 3 | CLIENT
        // TRACKING OFF`).
        if let Target::Dedicated(node) = target
            && self.queue.inflight > 0
            && self.conn.dedicated.is_some()
            && !self.dedicated_usable(false, node)
        {
            return true;
        }
        self.routing
            .blocks(self.queue.inflight_target, target, slot)
    }

    /// In front of a cluster a WATCH goes alone, once nothing else is in flight
    /// (`batch::joinable`, `forward`), and the commands after it wait for its reply
    /// (`watch_unanswered`): a WATCH the node answers MOVED (the proxy's map was stale) then
    /// starts over on the new owner with nothing sent after it (`cluster::redirect`), and
    /// the commands after it are placed with the map that redirection refreshed. Sent on,
    /// each got Redis's raw MOVED.
    pub(super) fn watch_goes_alone(&self, effect: Effect) -> bool {
        effect == Effect::Watch && self.routing.is_cluster()
    }

    /// A WATCH sent alone (`watch_goes_alone`) is not answered yet: its slot, which it has
    /// to itself and keeps while a redirection is followed, is still in the reply order.
    pub(super) fn watch_unanswered(&self) -> bool {
        self.conn.holds(Holds::WATCH)
            && self.routing.is_cluster()
            && self.queue.slots.iter().any(|s| {
                matches!(s, Slot::Upstream { handling, .. }
                    if handling.name.is_some_and(|spec| spec.name == "watch"))
            })
    }

    /// State held on the dedicated connection that keeps the session on it.
    pub(super) fn stateful(&self) -> bool {
        self.conn.stateful(self.client.db)
    }

    /// State that ties the session to its dedicated connection's node: `stateful` except a
    /// MULTI the proxy has not sent yet.
    pub(super) fn pinned(&self) -> bool {
        self.conn.pinned(self.client.db)
    }

    /// A RESP2 client in the subscribed context, where Redis runs only the SUBSCRIBE family,
    /// PING, QUIT and RESET (a MULTI that queued a SUBSCRIBE has not entered it yet). Not
    /// once Redis confirmed the last unsubscription: the connection stays the client's
    /// (`Holds::SUBSCRIPTIONS`), but Redis runs everything on it again (a CLIENT REPLY OFF
    /// forwarded as if refused turned the upstream connection's replies off; state fuzzer).
    pub(super) fn resp2_subscribed(&self) -> bool {
        self.client.proto == 2
            && self.conn.holds(Holds::SUBSCRIPTIONS)
            && !self.conn.in_multi()
            && self.ctx.client_list.subscribed(self.client.id)
    }

    /// A command that must wait to be decided, because how Redis reads it depends on a reply
    /// still due: a HELLO with AUTH in flight (the protocol changes only if Redis accepts
    /// it), or, for a RESP2 subscriber, a SUBSCRIBE-family command (whether Redis reads this
    /// one in the subscribed context). Slots are looked at only in those two rare states.
    pub(super) fn state_unsettled(&self, kind: Kind) -> bool {
        let subscriber = self.client.proto == 2
            && self.conn.holds(Holds::SUBSCRIPTIONS)
            && !matches!(kind, Kind::Subscribe(_) | Kind::Unsubscribe(_));
        (subscriber || self.conn.holds(Holds::OTHER_USER))
            && self.queue.slots.iter().any(|s| {
                matches!(s, Slot::Upstream { handling, .. }
                    if handling.unusual.as_ref().is_some_and(|u| u.hello_auth.is_some())
                        || (subscriber && handling.sub_counts))
            })
    }

    /// A RESP3 client whose only state is its subscriptions: its other commands need not go
    /// on the connection that holds them (RESP3 lets a subscriber run any command, and the
    /// messages are pushes), so they take the shared path, and in cluster mode reach any
    /// node instead of only the one it subscribed on. RESP2 subscribers stay: Redis answers
    /// their PING in the subscriber's format and refuses other commands.
    pub(super) fn resp3_subscriber_only(&self) -> bool {
        self.client.proto == 3
            && self.conn.holds(Holds::SUBSCRIPTIONS)
            && !self.conn.in_multi()
            && self.client.db == 0
            && !self
                .conn
                .held
                .other_than(Holds(Holds::SUBSCRIPTIONS.0 | Holds::SHARD_SUBSCRIPTIONS.0))
    }

    /// The dedicated connection as a target (in cluster mode `place` picks the node).
    pub(super) fn dedicated_target(&self) -> Target {
        Target::Dedicated(self.conn.dedicated.as_ref().map_or(0, |d| d.node))
    }

    /// Where a command that has no routing needs of its own goes (in cluster mode the node
    /// is then chosen by `place`).
    pub(super) fn current_target(&self) -> Target {
        if self.stateful() && !self.resp3_subscriber_only() {
            self.dedicated_target()
        } else {
            Target::Shared(self.client.proto, 0)
        }
    }

    /// Records the frames of a command queued in the open MULTI (see `multi_mask`).
    pub(super) fn note_queued(&mut self, effect: Effect, frames: Option<&[bool]>) {
        if let Some(multi) = &mut self.conn.multi
            && !matches!(effect, Effect::EndMulti | Effect::AbortExec | Effect::Multi)
        {
            match frames {
                Some(mask) => multi.mask.extend_from_slice(mask),
                None => multi.mask.push(true),
            }
            multi.subscribes |= matches!(effect, Effect::Subscribe(_) | Effect::Unsubscribe(_));
        }
    }

    /// Whether `effect` is the EXEC of a transaction with a SUBSCRIBE-family command queued.
    pub(super) fn exec_subscribes(&self, effect: Effect) -> bool {
        effect == Effect::EndMulti && self.conn.multi.as_ref().is_some_and(|m| m.subscribes)
    }

    /// The mask for EXEC's reply, when hidden commands were queued.
    pub(super) fn exec_mask(&self, effect: Effect) -> Option<Vec<bool>> {
        let mask = &self.conn.multi.as_ref()?.mask;
        (effect == Effect::EndMulti && mask.contains(&false)).then(|| mask.clone())
    }

    /// Applies the state change of a dispatched command.
    pub(super) fn apply(&mut self, effect: Effect) {
        match effect {
            Effect::None
            | Effect::Blocking(_)
            | Effect::Script
            | Effect::Wait(_)
            | Effect::ClientInfo
            | Effect::Info
            | Effect::InfoClients
            | Effect::ConfigGet => {}
            Effect::AbortExec => self.apply(Effect::EndMulti),
            // Waited for only once sent (`send_failed` resets at once).
            Effect::Reset => {
                self.conn.resetting = self.queue.slots.back().is_some_and(
                    |s| matches!(s, Slot::Upstream { handling, .. } if handling.reset),
                );
            }
            // A nested MULTI is refused by Redis and leaves the open transaction as it is: a
            // new `Transaction` would forget that the policy refused a queued command (EXEC
            // then ran the rest instead of aborting) and the frames hidden from EXEC's reply.
            Effect::Multi if self.conn.multi.is_some() => {}
            Effect::Multi => {
                self.conn.multi = Some(Transaction {
                    refused: std::mem::take(&mut self.conn.watch_lost),
                    ..Transaction::default()
                });
            }
            Effect::EndMulti => {
                self.conn.multi = None;
                self.conn.watch_lost = false;
                self.routing.multi_ended();
                self.conn.held.remove(Holds::WATCH);
            }
            Effect::Watch => self.conn.held.insert(Holds::WATCH),
            Effect::Unwatch => {
                self.conn.held.remove(Holds::WATCH);
                self.conn.watch_lost = false;
            }
            Effect::Subscribe(SubKind::Shard) => {
                self.list_flag('P');
                self.conn.held.insert(Holds::SUBSCRIPTIONS);
                self.conn.held.insert(Holds::SHARD_SUBSCRIPTIONS);
            }
            Effect::Subscribe(_) => {
                self.list_flag('P');
                self.conn.held.insert(Holds::SUBSCRIPTIONS);
            }
            Effect::Unsubscribe(_) => {}
            Effect::Select(db) => {
                self.ctx.client_list.update(self.client.id, |r| r.db = db);
                self.client.db = db;
            }
            Effect::Auth => {
                self.conn.held.insert(Holds::OTHER_USER);
                // `outgoing` followed the AUTH with a hidden `HELLO 3` for a RESP3 client, so
                // the connection speaks the client's protocol now even if it was dialled raw
                // (RESP2). Recorded as RESP2, the next command would see a mismatch and find
                // its pinned connection unusable (issue 33). Should the AUTH fail, Redis
                // refuses the HELLO too and the connection stays RESP2, but then it answers
                // every command with `-NOAUTH`, which reads the same in both protocols.
                if let Some(d) = &mut self.conn.dedicated {
                    d.proto = self.client.proto;
                }
            }
            // The protocol follows once Redis accepted the AUTH (`Handling::hello_auth`).
            Effect::AuthHello(_) => self.conn.held.insert(Holds::OTHER_USER),
            Effect::Hello(proto) => {
                self.client.set_proto(&self.ctx.client_list, proto);
                self.conn.follow_proto(proto);
                if let Some(mut cluster) = self.cluster_session() {
                    cluster.conns_follow_proto();
                }
            }
            Effect::Monitor => {
                self.list_flag('O');
                self.conn.held.insert(Holds::MONITOR);
            }
            Effect::ConnectionState | Effect::TracksToClient => {
                self.conn.held.insert(Holds::CLIENT_MODE)
            }
            Effect::Pause(mode, ms) => self.ctx.pause.start(mode, ms),
            Effect::Unpause => self.ctx.pause.end(),
            Effect::NamesRedirect | Effect::NamesClient => {}
        }
    }

    /// Sets this client's `CLIENT LIST` flag (`P` subscriber, `O` monitor, `N` neither).
    pub(super) fn list_flag(&self, flag: char) {
        self.ctx
            .client_list
            .update(self.client.id, |r| r.flag = flag);
    }

    /// RESET: back to a fresh connection's state; the dedicated connection is closed, which
    /// drops every subscription, transaction and watch on the upstream.
    /// Before the proxy answers a RESET itself: the subscriptions the client holds on the
    /// session's connections are dropped upstream (`reset_upstream`), on its dedicated
    /// connection and on the mode's own (a cluster's per-node shard connections).
    pub(super) async fn release_subscriptions(&mut self) {
        let subscribed =
            self.conn.holds(Holds::SUBSCRIPTIONS) || self.conn.holds(Holds::SHARD_SUBSCRIPTIONS);
        let own = self
            .conn
            .dedicated
            .as_ref()
            .filter(|_| subscribed)
            .map(|d| &d.tx);
        reset_upstream(own.into_iter().chain(self.routing.subscription_conns())).await;
    }

    pub(super) fn reset(&mut self) {
        self.ctx.client_list.update(self.client.id, |r| {
            r.names.set_name(None);
            r.db = 0;
            r.resp = 2;
            r.flag = 'N';
            r.subs = Default::default();
        });
        self.conn.dedicated = None;
        // The mirror follows the client's database and transaction from the commands it
        // sees; RESET never reaches it, so it forgets them here (back to database 0).
        self.ctx.ops.mirror.gone(self.client.id);
        self.login(None);
        self.client.proto = 2;
        self.client.db = 0;
        self.client.names.set_name(None);
        self.conn.multi = None;
        self.conn.watch_lost = false;
        self.routing.reset();
        self.conn.held = Holds::default();
        self.conn.resetting = false;
        self.client.reply_mode = ReplyMode::On;
    }
}
