//! Cluster mode: keyspace notifications (`__keyspace@<db>__:<key>`, `__keyevent@<db>__:<event>`)
//! and redirected invalidations (`__redis__:invalidate`) from every primary.
//!
//! Redis Cluster carries a `PUBLISH` to every node over its bus, so the session's one classic
//! subscriber connection (to its home node, see `subscriber`) hears every message. Keyspace
//! notifications are the exception: a node publishes them locally, for its own keys only. So
//! when a session subscribes to a notification channel, or to a pattern that may match one,
//! the proxy subscribes the same names on every other primary too, over one extra dedicated
//! pub/sub connection per node (as `shard_subs` holds shard channels), whose pushes come on
//! the session's reply channel.
//!
//! The client sees Redis's own frames: the home connection confirms every (un)subscription
//! with the counts Redis gives, as before; the extra connections' confirmations go nowhere.
//! A filter between each extra connection and the session lets through only notifications
//! for a name the client holds and the home connection confirmed: every other message (a
//! `PUBLISH` matched by a pattern such as `*`) is heard on the home connection already, and
//! would arrive twice. The names are shared with the filters; a name passes once the session
//! sees the home connection's confirmation of it (before queueing it for the client), and
//! stops before the client's unsubscribe goes upstream. So no extra connection's delivery
//! comes before the client's subscribe confirmation or after its unsubscribe confirmation,
//! and a name the home node refused or never got is never delivered from elsewhere.
//!
//! An extra connection that ends (its node failed, or the connection was killed) costs the
//! session nothing but that node's notifications: the session tries again, every
//! `RETRY_EVERY` for up to `resubscribe_timeout_ms`, to listen on every primary of the map,
//! so a restarted node or the replica promoted in a failed primary's place is heard again.
//! The same retry opens them again after a HELLO changed the client's RESP version: their
//! pushes go to the client as they are, so they must speak its version.
//!
//! **Invalidations.** A client that another client's `CLIENT TRACKING … REDIRECT` names gets
//! the invalidations of the keys that client read, from the node where each was written, and
//! a node sends them only to a connection of its own. So `__redis__:invalidate` is spread as
//! the notification channels are, and each extra connection is the subscriber's *listener*
//! on its node (`client_ids`): a REDIRECT spread over every primary names it there
//! (`tracking`). A RESP3 subscriber gets them as `invalidate` pushes, which the filter lets
//! through while the channel is held and confirmed.
//!
//! Limits: a primary that joins otherwise (resharding to a new node) is not listened to
//! until the session subscribes to a notification name again. Subscriptions queued in MULTI
//! are not spread (EXEC runs them on the home node only); unsubscriptions queued there stop
//! the other primaries' deliveries when queued. Nor are the subscriptions of a session
//! logged in upstream as its own Redis user on one connection only (`Holds::OTHER_USER`):
//! the extra connections would be the pool's user, which may hear what Redis refuses the
//! client. A login over every primary (`login`) logs each extra connection in as the user
//! as it opens, so Redis checks the user's channel rules on every node. In routes mode nothing is
//! spread, as classic pub/sub stays with its route's server. A namespaced tenant's channel
//! names carry its prefix upstream, so they never name a notification channel: nothing is
//! spread for it, and it hears no notifications, as in front of one server.

use super::plan::{KeyspaceSpread, Spread};
use super::shard_subs::RETRY_EVERY;
use super::state::Stock;
use super::state::{Names, is_notification_channel, lock, may_match_notification};
use super::subscriber::{SUBSCRIBE, UNSUBSCRIBE, pubsub_batches};
use super::{ClusterSession, ClusterView};
use crate::protocol::reply::SubKind;
use crate::session::action::{Action, Spreading};
use crate::session::conn::Target;
use crate::session::effect::Effect;
use crate::session::route::Args;
use crate::topology::cluster::Router;
use crate::upstream::conn::PushTarget;
use crate::upstream::{Reply, Subscriptions};
use bytes::Bytes;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The `conn_id` bits of the extra connections: `SHARD_CONN` (so no code takes their end for
/// the dedicated connection's) and one more, to tell them from shard connections.
const KEYSPACE_CONN: u64 = 3 << 62;

/// The `conn_id` of the wake-up a retry timer sends on the session's reply channel: it has
/// the `KEYSPACE_CONN` bits, no connection's id reaches it, and it is not shard_subs's.
const KEYSPACE_WAKE: u64 = u64::MAX - 1;

/// Whether the connection id `id` (of a `Reply::PinnedClosed`) is an extra connection's or
/// the retry timer's.
pub(in crate::session) fn is_keyspace_conn(id: u64) -> bool {
    id & KEYSPACE_CONN == KEYSPACE_CONN && id != u64::MAX
}

/// `names` of one `kind`, as `pubsub_batches` takes them.
fn one_kind(kind: SubKind, names: Vec<Bytes>) -> Subscriptions {
    match kind {
        SubKind::Pattern => Subscriptions {
            channels: Vec::new(),
            patterns: names,
        },
        _ => Subscriptions {
            channels: names,
            patterns: Vec::new(),
        },
    }
}

/// The extra connection's push target: `push` behind a filter that passes only the
/// notifications `names` admits (and the connection's end), returning the push budget of
/// what it drops. Judged and sent under the names' lock (`super::gated`): a name confirmed
/// or unsubscribed by the session changes either before the delivery is judged or after it
/// is in the session's channel, so it keeps its place against the home connection's
/// confirmations.
fn filtered(push: PushTarget, names: Arc<Mutex<Names>>) -> PushTarget {
    super::gate::gated(push, names, |names, frame| names.admits(frame))
}

impl ClusterSession<'_> {
    /// Carries out the other primaries' part of `fanout`; returns the command for the home
    /// connection.
    pub(in crate::session) async fn keyspace_fanout(&mut self, fanout: KeyspaceSpread) {
        match fanout.home {
            Some(home) => {
                self.keyspace_subscribe(home, fanout.kind, fanout.names)
                    .await
            }
            None => self.keyspace_unsubscribe(fanout.kind, fanout.names),
        }
    }

    /// Records `names` as held (passing once the home connection confirms them) and
    /// subscribes them on every primary but `home`.
    async fn keyspace_subscribe(&mut self, home: u16, kind: SubKind, names: Vec<Bytes>) {
        let subs = self.cluster.keyspace_or_new();
        let fresh: Vec<Bytes> = {
            let mut held = lock(&subs.names);
            let set = held.of(kind);
            names
                .into_iter()
                .filter(|n| set.insert(n.clone(), false).is_none())
                .collect()
        };
        self.keyspace_spread(home, one_kind(kind, fresh)).await;
    }

    /// The subscriber's connection moved to `home` (`subscriber`): the extra connection there
    /// goes, as the new home connection hears that node's notifications.
    pub(in crate::session) async fn keyspace_rehome(&mut self, home: u16) {
        if self.cluster.keyspace().is_some() {
            self.keyspace_spread(home, Subscriptions::default()).await;
        }
    }

    /// Makes the extra connections those of the primaries but `home` that are up (opening
    /// the missing ones with every name held), subscribes `fresh` on the others, and waits
    /// for every confirmation, so the client's own confirmation comes after them all.
    async fn keyspace_spread(&mut self, home: u16, fresh: Subscriptions) {
        let router = self.cluster.router.clone();
        let opened = self.keyspace_connect(&router, home).await;
        let Some(subs) = self.cluster.keyspace() else {
            return;
        };
        let all = lock(&subs.names).all();
        let mut waits = Vec::new();
        let mut failed = Vec::new();
        for conn in &subs.conns {
            let names = if opened.contains(&conn.id) {
                &all
            } else {
                &fresh
            };
            let (reply_to, rx) = crate::upstream::reply_channel();
            let batches = pubsub_batches(SUBSCRIBE, names, &reply_to);
            // A full queue (a connection stuck on a node that stopped answering) or a closed
            // one: the node's notifications would not be heard, so its connection goes.
            if !batches.into_iter().all(|b| conn.tx.try_send(b).is_ok()) {
                failed.push(conn.id);
            }
            drop(reply_to);
            waits.push((conn.id, conn.node, rx));
        }
        for (id, node, mut rx) in waits {
            while let Some(reply) = rx.recv().await {
                if let Reply::Batch { error: Some(e), .. } = reply {
                    tracing::warn!(
                        id = self.client.id,
                        node = %router.addr(node),
                        error = %e,
                        "a primary's keyspace notifications not subscribed; not heard"
                    );
                    failed.push(id);
                }
            }
        }
        if let Some(subs) = self.cluster.keyspace_mut() {
            subs.conns.retain(|c| !failed.contains(&c.id));
        }
    }

    /// Opens an extra connection to every primary but `home` that is up and has none, and
    /// closes the one to `home`; returns the ids of those opened.
    async fn keyspace_connect(&mut self, router: &Router, home: u16) -> Vec<u64> {
        let primaries: Vec<u16> = router.snapshot().primaries().to_vec();
        let mut opened = Vec::new();
        let proto = self.client.proto;
        if let Some(subs) = self.cluster.keyspace_mut() {
            if subs.proto != proto {
                subs.conns.clear();
                subs.proto = proto;
            }
            subs.conns.retain(|c| !c.tx.is_closed() && c.node != home);
        }
        for node in primaries {
            let Some(subs) = self.cluster.keyspace_mut() else {
                return opened;
            };
            // A node whose shared connections are all down could take the whole connect
            // timeout; its notifications are not heard until it is subscribed again.
            if node == home
                || subs.conns.iter().any(|c| c.node == node)
                || !router.pool(node).any_up()
            {
                continue;
            }
            subs.next_id += 1;
            let id = KEYSPACE_CONN | subs.next_id;
            let names = subs.names.clone();
            let push = filtered(self.push_target(id), names);
            match self
                .open_node_conn(router, node, id, push, Stock::Take)
                .await
            {
                Ok(mut conn) => {
                    // The client's listener on `node` (module comment).
                    conn.listener = conn.upstream_id.map(|upstream| {
                        let upstream = crate::session::client_ids::Upstream { node, id: upstream };
                        self.ctx
                            .client_ids
                            .register_listener(self.client.id, upstream)
                    });
                    if let Some(subs) = self.cluster.keyspace_mut() {
                        subs.conns.push(conn);
                        opened.push(id);
                    }
                }
                Err(e) => tracing::warn!(
                    id = self.client.id,
                    node = %router.addr(node),
                    error = %String::from_utf8_lossy(&e).trim_end(),
                    "no connection for a primary's keyspace notifications; its events are not heard"
                ),
            }
        }
        opened
    }

    /// Forgets `names` (of `kind`; every one of them when empty) and unsubscribes them on the
    /// extra connections, without waiting: the filters drop their deliveries from now on.
    /// With nothing left the state goes, and with it the connections.
    fn keyspace_unsubscribe(&mut self, kind: SubKind, names: Vec<Bytes>) {
        let c = &mut *self.cluster;
        let Some(subs) = c.keyspace.as_deref() else {
            return;
        };
        let (gone, left) = {
            let mut held = lock(&subs.names);
            let set = held.of(kind);
            let gone: Vec<Bytes> = if names.is_empty() {
                set.drain().map(|(n, _)| n).collect()
            } else {
                names
                    .into_iter()
                    .filter(|n| set.remove(n).is_some())
                    .collect()
            };
            (gone, !held.channels.is_empty() || !held.patterns.is_empty())
        };
        if !left {
            c.keyspace = None;
            return;
        }
        let (reply_to, _) = crate::upstream::reply_channel();
        let batches = || pubsub_batches(UNSUBSCRIBE, &one_kind(kind, gone.clone()), &reply_to);
        for conn in &subs.conns {
            for batch in batches() {
                let _ = conn.tx.try_send(batch);
            }
        }
    }

    /// Hook in `follow_redirects` for `id`s that `is_keyspace_conn`: an extra connection ended
    /// (logged; the session goes on) or the retry timer woke up. Either way the session tries
    /// again to listen on every primary, for up to `resubscribe_timeout_ms`. Returns `true`:
    /// consumed.
    pub(in crate::session) async fn keyspace_ended(&mut self, id: u64) -> bool {
        let router = self.cluster.router.clone();
        let Some(subs) = self.cluster.keyspace_mut() else {
            return true;
        };
        if id == KEYSPACE_WAKE {
            subs.retry_scheduled = false;
        } else if let Some(at) = subs.conns.iter().position(|c| c.id == id) {
            let node = subs.conns.swap_remove(at).node;
            subs.retry_until = Some(tokio::time::Instant::now() + router.resubscribe_timeout());
            tracing::warn!(
                id = self.client.id,
                node = %router.addr(node),
                "keyspace notification connection ended; listening again when up"
            );
        } else {
            // One the session closed itself.
            return true;
        }
        self.keyspace_retry(&router).await;
        true
    }

    /// Hook after a HELLO took effect: when it changed the client's RESP version, the extra
    /// connections are opened again in the new one (right away, through the retry timer, so
    /// a failed attempt is retried as after a connection's end).
    pub(in crate::session) fn keyspace_follow_proto(&mut self) {
        let proto = self.client.proto;
        let timeout = self.cluster.router.resubscribe_timeout();
        let Some(subs) = self.cluster.keyspace_mut() else {
            return;
        };
        if subs.proto == proto || subs.conns.is_empty() {
            return;
        }
        subs.retry_until = Some(tokio::time::Instant::now() + timeout);
        if !subs.retry_scheduled {
            subs.retry_scheduled = true;
            self.wake_after(Duration::ZERO, KEYSPACE_WAKE);
        }
    }

    /// One attempt to listen on every primary but the home node; while some primary is not
    /// listened to and the retry time is not over, another after `RETRY_EVERY`, with a map
    /// refresh asked for (a failed primary's replica is promoted meanwhile).
    async fn keyspace_retry(&mut self, router: &Router) {
        let Some(home) = self.conn.dedicated.as_ref().map(|d| d.node) else {
            return;
        };
        self.keyspace_spread(home, Subscriptions::default()).await;
        let Some(subs) = self.cluster.keyspace_mut() else {
            return;
        };
        let heard = |n: u16| n == home || subs.conns.iter().any(|c| c.node == n);
        let complete = router.snapshot().primaries().iter().all(|&n| heard(n));
        let now = tokio::time::Instant::now();
        match subs.retry_until {
            Some(until) if !complete && now < until => {
                if !subs.retry_scheduled {
                    subs.retry_scheduled = true;
                    router.refresh_soon();
                    self.wake_after(RETRY_EVERY, KEYSPACE_WAKE);
                }
            }
            _ => subs.retry_until = None,
        }
    }

    /// Hook before an upstream message is handled: a reply to a SUBSCRIBE or PSUBSCRIBE (the
    /// home connection's: those go nowhere else) lets the other primaries' deliveries for the
    /// names it confirms pass from now on. Done before the reply is queued for the client,
    /// and the filters forward under the same lock, so those deliveries come after the
    /// confirmation.
    pub(in crate::session) fn keyspace_confirmed(&self, msg: &Reply) {
        let Some(subs) = self.cluster.keyspace() else {
            return;
        };
        if let Some(data) = self.answer_to(msg, &["subscribe", "psubscribe"]) {
            lock(&subs.names).confirm(data);
        }
    }
}

impl ClusterView<'_> {
    /// Hook in `place`: a classic (un)subscription naming notification channels, or
    /// patterns that may match them, becomes `Action::Spread`; anything else stays as it is.
    pub(in crate::session) fn keyspace_route(
        &self,
        router: &Router,
        action: Action,
        args: &Args<'_>,
    ) -> Action {
        let (target, kind, subscribe) = match action.forwarded() {
            Some((t, Effect::Subscribe(k), _)) if k != SubKind::Shard => (t, k, true),
            Some((t, Effect::Unsubscribe(k), _)) if k != SubKind::Shard => (t, k, false),
            _ => return action,
        };
        // With routes a channel belongs to its route's server. Inside MULTI a subscription
        // is only queued (and stays on the home node), but an unsubscription stops the other
        // primaries' deliveries at once: should the transaction not run, notifications from
        // them are missed rather than delivered after the client's unsubscribe.
        if router.routes().is_some() || (subscribe && self.conn.in_multi()) {
            return action;
        }
        // The home connection is logged in as the client's own Redis user, the extra ones
        // would be the pool's: they could hear what Redis refuses that user (fail closed).
        // A login over every primary logs them in as the user too (`log_in_as_client`).
        if subscribe && self.own_login_on_one_node() {
            return action;
        }
        if !subscribe && self.cluster.keyspace().is_none() {
            return action;
        }
        let home = match (subscribe, target) {
            (true, Target::Dedicated(home)) => Some(home),
            (true, Target::Shared(..)) => return action,
            (false, _) => None,
        };
        let Some(names) = self.upstream_channels(&action, args) else {
            return action;
        };
        let all = names.is_empty();
        let names: Vec<Bytes> = names
            .into_iter()
            .filter(|n| match kind {
                SubKind::Pattern => may_match_notification(n),
                _ => is_notification_channel(n),
            })
            .collect();
        // An unsubscription of all names of a kind (no names) concerns the notifications.
        if names.is_empty() && (subscribe || !all) {
            return action;
        }
        Action::Spread(Box::new(Spreading {
            spread: Spread::Keyspace(KeyspaceSpread { kind, home, names }),
            then: action,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::*;
    use super::*;

    #[test]
    fn notification_channels() {
        assert!(is_notification_channel(b"__keyspace@0__:k"));
        assert!(is_notification_channel(b"__keyevent@3__:set"));
        assert!(!is_notification_channel(b"news"));
        assert!(!is_notification_channel(b"__keyspace"));
    }

    #[test]
    fn patterns_that_may_match_a_notification() {
        for yes in [
            &b"*"[..],
            b"__key*",
            b"__keyevent@0__:*",
            b"__keyspace@*__:k",
            b"_?keyspace@0__:*",
            b"[_]*",
            b"__keyspace@0__:k",
        ] {
            assert!(
                may_match_notification(yes),
                "{}",
                String::from_utf8_lossy(yes)
            );
        }
        for no in [&b"news.*"[..], b"t1:__keyspace@0__:*", b"__key", b"x*"] {
            assert!(
                !may_match_notification(no),
                "{}",
                String::from_utf8_lossy(no)
            );
        }
    }

    #[test]
    fn filters_admit_only_held_notifications() {
        let mut names = Names::default();
        names
            .of(SubKind::Pattern)
            .insert(Bytes::from_static(b"*"), false);
        names
            .of(SubKind::Channel)
            .insert(Bytes::from_static(b"__keyevent@0__:set"), false);
        let pmessage = |channel: &str| {
            format!(
                "*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n${}\r\n{channel}\r\n$1\r\nv\r\n",
                channel.len()
            )
        };
        // Not confirmed to the client yet.
        assert!(!names.admits(pmessage("__keyspace@0__:k").as_bytes()));
        names.confirm(
            b"*3\r\n$10\r\npsubscribe\r\n$1\r\n*\r\n:1\r\n\
              >3\r\n$9\r\nsubscribe\r\n$18\r\n__keyevent@0__:set\r\n:2\r\n",
        );
        assert!(names.admits(pmessage("__keyspace@0__:k").as_bytes()));
        // A PUBLISH the home connection hears over the bus.
        assert!(!names.admits(pmessage("news").as_bytes()));
        assert!(names.admits(b">3\r\n$7\r\nmessage\r\n$18\r\n__keyevent@0__:set\r\n$1\r\nk\r\n"));
        assert!(!names.admits(b"*3\r\n$7\r\nmessage\r\n$18\r\n__keyevent@0__:del\r\n$1\r\nk\r\n"));
        // Confirmations are the proxy's.
        assert!(!names.admits(b"*3\r\n$9\r\nsubscribe\r\n$18\r\n__keyevent@0__:set\r\n:1\r\n"));
        names.of(SubKind::Pattern).clear();
        assert!(!names.admits(pmessage("__keyspace@0__:k").as_bytes()));
    }

    #[test]
    fn redirected_invalidations_pass_while_the_channel_is_held() {
        assert!(is_notification_channel(b"__redis__:invalidate"));
        assert!(!is_notification_channel(b"__redis__:invalidatex"));
        let mut names = Names::default();
        let resp2 = b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n$1\r\nk\r\n";
        let resp3 = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n";
        assert!(!names.admits(resp3), "nothing held");
        names
            .of(SubKind::Channel)
            .insert(Bytes::from_static(INVALIDATE_CHANNEL), false);
        assert!(
            !names.admits(resp2) && !names.admits(resp3),
            "not confirmed yet"
        );
        names.confirm(b"*3\r\n$9\r\nsubscribe\r\n$20\r\n__redis__:invalidate\r\n:1\r\n");
        assert!(names.admits(resp2));
        assert!(names.admits(resp3));
    }
}
