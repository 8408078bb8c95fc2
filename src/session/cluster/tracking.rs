//! Cluster mode: client-side caching (`CLIENT TRACKING ON`, broadcasting or default mode,
//! with or without REDIRECT, OPTIN, OPTOUT, NOLOOP) over every primary.
//!
//! Redis sends an invalidation from the node where the key was written, to the clients that
//! connection tracks. Standalone, the proxy turns tracking on on the client's dedicated
//! connection and every command goes there. In a cluster one connection hears one node, so
//! a tracking client was pinned to one node (keys of the others got CROSSSLOT). Instead the
//! proxy turns tracking on, with the command as the policy left it (a namespaced tenant's
//! PREFIX included), on one dedicated connection per primary, speaking the client's RESP
//! version, and the session stays unpinned. In BCAST mode the invalidations do not depend on
//! what the client read: its reads and writes keep the shared connections of every node.
//!
//! **Order.** Over one Redis connection a read's reply comes before the invalidation of a
//! later write of that key. Over two connections it need not: the invalidation could reach
//! the client before the stale value it invalidates, which the client would then cache for
//! good. So an invalidation is queued behind every reply still due when it arrives (before
//! the first blocking command's, which may wait forever: `ReplyQueue::behind_due`). Later is
//! always safe (a fresh value dropped from the cache costs one miss); earlier is not.
//!
//! **Fail closed.** A tracking connection that ends (its node failed, the connection was
//! killed) would leave writes on that node unheard: the client is disconnected, as Redis's
//! own connection would have ended, and its cache starts over. So is a client whose cluster
//! gained a primary without a tracking connection (a failover's promoted replica, a new
//! node), at its next command, after an error saying why; and one whose tracking connection
//! cannot follow its HELLO. Any tracking command inside MULTI (the state is on every node,
//! the transaction on one) is refused with the reason.
//!
//! **Default mode** (`CLIENT TRACKING ON` without BCAST) and **BCAST with NOLOOP**. Redis
//! invalidates the keys a connection read, and tells that connection only; NOLOOP leaves out
//! that connection's own writes. So the tracking connections are not only listened to: every
//! command of the session for a node goes over its connection there, instead of the node's
//! shared connection (`Routing::own_conn`, asked by `enqueue_to` and `send_shared`), and
//! it is also the session's dedicated connection to that node (MULTI, WATCH, blocking
//! commands, scripts: `Session::own_dedicated`). Each node's connection reads and
//! writes what the client reads and writes of that node's keys, as the client's one
//! connection would on one Redis; the session is not pinned (a command for another node goes
//! over that node's). In RESP2 too: Redis tracks what a RESP2 connection reads and sends the
//! invalidations once it speaks RESP3, so the connections follow the client's HELLO
//! (`own_conns_follow_proto`). Fail closed: a client's own AUTH (a connection of its own,
//! untracked) is refused while on, and a primary without a tracking connection answers the
//! lost-tracking error before anything is read there.
//!
//! **REDIRECT.** Redis sends a redirected invalidation only to a connection on its own node.
//! A client subscribed to `__redis__:invalidate` listens on every primary (`keyspace`: one
//! connection per other primary, each its *listener* there in `client_ids`), so a REDIRECT
//! to it is spread: each node's tracking connection names the subscriber's connection on
//! that node (`Redirect`). `CLIENT GETREDIR` and TRACKINGINFO name it by its proxy id, and
//! TRACKINGINFO shows the redirect broken when any node found it so. ON again while on (a
//! new redirect, none, more prefixes) goes to every node the same way. A RESP3 client takes
//! redirected invalidations as pushes on any connection of its own, subscribed or not: one
//! named without a connection on every primary is asked to open the missing ones (its
//! `Listeners`, through `summon`), and is then named the same way.
//!
//! **OPTIN/OPTOUT.** `CLIENT CACHING yes|no` is about the connection's next command, which
//! may go to any node: it is sent to every tracking connection, and the next command's
//! placement sends the others a PING, which clears it there (`caching_next`). After `no`, a
//! next command for several nodes is refused: the flag would stay where it does not go.
//!
//! Not spread (the session is pinned to one node as before, docs/cluster.md): a REDIRECT to
//! a RESP2 client that does not subscribe to `__redis__:invalidate`, PREFIX without BCAST (Redis's
//! error), routes, a client logged in upstream as its own user on one connection only, and
//! a session already holding state on a dedicated connection. A client logged in as its own
//! user over every primary (`login`) tracks over connections logged in as that user
//! (`log_in_as_client`), which then carry its commands in place of the login's. With replica reads configured (`read_from`), a
//! session whose commands go over the tracking connections reads from the primaries: reads
//! on a replica's connection would be untracked.

use super::plan::{Gather, Redirect, TrackingCommand};
use super::state::{ClusterTracking, OwnConn, follow_proto};
use super::state::{NodeConn, Stock};
use super::{ClusterSession, ClusterView};
use crate::commands::grammar;
use crate::policy::rewrite::Strip;
use crate::protocol::{answers, codec};
use crate::session::action::{Action, Decision};
use crate::session::client_ids::ClientIds;
use crate::session::conn::register_upstream;
use crate::session::conn::{Dedicated, Holds, Target};
use crate::session::effect::Effect;
use crate::session::route::Args;
use crate::topology::cluster::Router;
use crate::upstream::{Batch, Expect, Reply, ReplyWait, unanswered};
use bytes::Bytes;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use tokio::sync::mpsc;

/// The `conn_id` bits of the tracking connections: `SHARD_CONN`'s (so no code takes their end
/// for the dedicated connection's) and bit 61, unlike shard (`1 << 63`) and keyspace
/// (`3 << 62`) connections.
const TRACKING_CONN: u64 = (1 << 63) | (1 << 61);

/// The bits that tell the per-node connections apart.
pub(super) const CONN_KIND: u64 = 7 << 61;

/// The `conn_id` bits of a summoned client's listeners (`listen_everywhere`): all three
/// kind bits, and a counter below 2^48 (the retry wake-ups of the other kinds have every bit
/// set).
const LISTENER_CONN: u64 = 7 << 61;

/// Whether the connection id `id` (of a `Reply::PinnedClosed`) is a listener's.
pub(in crate::session) fn is_listener_conn(id: u64) -> bool {
    id & CONN_KIND == LISTENER_CONN && id & !CONN_KIND < 1 << 48
}

/// Whether the connection id `id` (of a `Reply::PinnedClosed`) is a tracking connection's.
pub(in crate::session) fn is_tracking_conn(id: u64) -> bool {
    id & CONN_KIND == TRACKING_CONN
}

/// `ClusterTracking::caching`: a `CLIENT CACHING yes` is pending.
const CACHING_YES: u8 = 1;
/// `ClusterTracking::caching`: a `CLIENT CACHING no` is pending.
const CACHING_NO: u8 = 2;

/// What an invalidation push starts with (RESP3): `>2`, then the bulk string `invalidate`.
const INVALIDATE: &[u8] = b">2\r\n$10\r\ninvalidate\r\n";

impl ClusterSession<'_> {
    /// Cluster mode, CLIENT TRACKING on in the default mode or the client's own login over
    /// every primary: the session's dedicated connection to `node` is its own connection
    /// there (Redis tracks what each connection reads, so a transaction's, a script's or a
    /// blocking command's reads must be read on it: `cluster::tracking`; and it is the one
    /// logged in as the client's user: `cluster::login`), made the dedicated one and
    /// returned; the reason where none may be (`raw`: the client's own AUTH, a connection of
    /// its own; a primary without one). `None` where neither decides the connection.
    pub(in crate::session) fn own_dedicated(
        &mut self,
        raw: bool,
        proto: u8,
        node: u16,
    ) -> Option<Result<mpsc::Sender<Batch>, String>> {
        let (tx, confined, upstream) = match self.cluster.own_conn(node) {
            OwnConn::Any => return None,
            OwnConn::Missing => {
                let addr = self.cluster.router.pool(node).addr();
                return Some(Err(if self.view().own_login() {
                    answers::own_login_lost_reason(&addr)
                } else {
                    answers::tracking_lost_reason(&addr)
                }));
            }
            OwnConn::Own(_) if raw => return Some(Err(answers::tracking_own_login())),
            OwnConn::Own(conn) => (conn.tx.clone(), conn.confined, conn.upstream_id),
        };
        self.conn.dedicated_gen += 1;
        let id = register_upstream(self.ctx, self.client.id, node, upstream);
        self.conn.dedicated = Some(Dedicated {
            tx: tx.clone(),
            proto,
            node,
            confined,
            _id: id,
            // The own connection holds its share.
            _share: None,
        });
        Some(Ok(tx))
    }

    /// Target side of a summon in cluster mode: a connection of this client's own on every
    /// primary where it has none, mapped as its listener there, whose pushes (the
    /// invalidations another client's tracking redirects to it) reach the client as any
    /// push does. RESP3 only: Redis sends a RESP2 client redirected invalidations only while
    /// it is subscribed, on the connection that is. Kept while the session lives; one that
    /// ends is gone (Redis then reports the redirect broken to the tracker, as for a client
    /// that left), and opened again by the next summon. Answers 0: the caller names each
    /// node's connection (`client_ids::on_node`).
    pub(in crate::session) async fn listen_everywhere(&mut self) -> Result<u64, String> {
        if self.input.closing {
            return Err("it is disconnecting".into());
        }
        if self.client.proto != 3 {
            return Err("it speaks RESP2 and is not subscribed to __redis__:invalidate".into());
        }
        let router = self.cluster.router.clone();
        let primaries: Vec<u16> = router.snapshot().primaries().to_vec();
        for node in primaries {
            if self.ctx.client_ids.on_node(self.client.id, node).is_some() {
                continue;
            }
            let listeners = self.cluster.listeners.get_or_insert_with(Box::default);
            listeners.conns.retain(|l| !l.tx.is_closed());
            listeners.next_id += 1;
            let id = LISTENER_CONN | listeners.next_id;
            let push = self.push_target(id);
            let mut conn = self
                .open_node_conn(&router, node, id, push, Stock::Dial)
                .await
                .map_err(|e| String::from_utf8_lossy(&e).trim().to_string())?;
            conn.listener = conn.upstream_id.map(|upstream| {
                let upstream = crate::session::client_ids::Upstream { node, id: upstream };
                self.ctx
                    .client_ids
                    .register_listener(self.client.id, upstream)
            });
            if let Some(l) = &mut self.cluster.listeners {
                l.conns.push(conn);
            }
        }
        Ok(0)
    }

    /// Hook after a HELLO took effect: listeners are for a RESP3 client, whose pushes they
    /// carry as they are; after `HELLO 2` they close (Redis sends a RESP2 client that is not
    /// subscribed no redirected invalidations), and the trackers' nodes report the redirect
    /// broken, as for a client that left.
    pub(in crate::session) fn listeners_follow_proto(&mut self) {
        if self.client.proto != 3 {
            self.cluster.listeners = None;
        }
    }

    /// Hook in `follow_redirects`: listener `id` ended (its node failed, it was killed).
    pub(in crate::session) fn listener_ended(&mut self, id: u64) {
        if let Some(l) = &mut self.cluster.listeners {
            l.conns.retain(|c| c.id != id);
        }
    }

    /// `TrackingCommand::Again`: Redis's reply (the first refusal, if any).
    async fn tracking_again(
        &mut self,
        command: Bytes,
        redirect: Option<Box<Redirect>>,
        carries: bool,
    ) -> Bytes {
        if let Some(r) = redirect.as_deref().filter(|r| r.summon)
            && let Err(reply) = self.summon_listeners(r.client).await
        {
            return reply;
        }
        let Some(tracking) = self.cluster.tracking.as_deref() else {
            return crate::protocol::answers::tracking_lost("the cluster");
        };
        let asked = ask_each(
            &tracking.conns,
            &self.ctx.client_ids,
            &command,
            redirect.as_deref(),
        )
        .await;
        match asked {
            Ok(reply) if reply.first() == Some(&b'+') => {
                if let Some(t) = self.cluster.tracking.as_deref_mut() {
                    t.redirect = redirect.map(|r| r.client);
                    t.carries |= carries;
                }
                reply
            }
            Ok(reply) => reply,
            Err(reply) => {
                // A connection that cannot answer cannot deliver invalidations.
                self.input.closing = true;
                reply
            }
        }
    }

    /// Hook after a HELLO took effect (answered by the proxy, or forwarded on the dedicated
    /// connection and accepted): the tracking (and login) connections speak the client's RESP version
    /// again (Redis keeps a connection's tracking across HELLO), so what they carry is
    /// answered as the client now reads it, and a RESP3 client's invalidations come as
    /// pushes. `HELLO <version>` is queued on each without waiting for its reply: nothing of
    /// the session's after the HELLO has gone out yet (the run before it was flushed, and a
    /// forwarded HELLO is waited for), so it comes first on every connection. One that
    /// cannot take it ends the session, as after a lost tracking connection.
    pub(in crate::session) fn own_conns_follow_proto(&mut self) {
        let proto = self.client.proto;
        let c = &mut *self.cluster;
        // The client's own login's connections (`login`) likewise.
        let followed = [
            c.tracking
                .as_deref_mut()
                .map(|t| follow_proto(&t.conns, &mut t.proto, proto)),
            c.login.as_deref_mut().map(|l| l.follow_proto(proto)),
        ];
        if followed.contains(&Some(false)) {
            tracing::warn!(
                id = self.client.id,
                "a tracking or login connection could not follow HELLO; the client is disconnected"
            );
            self.input.closing = true;
        }
    }

    /// Carries out a tracking command: the one reply the client gets.
    pub(in crate::session) async fn tracking_command(&mut self, command: TrackingCommand) -> Bytes {
        match command {
            TrackingCommand::Start {
                command,
                carries,
                unquote,
                redirect,
            } => unquoted(self.tracking_on(command, carries, redirect).await, unquote),
            TrackingCommand::Ask {
                command,
                all,
                unquote,
            } => {
                let Some(tracking) = self.cluster.tracking.as_deref() else {
                    return crate::protocol::answers::tracking_lost("the cluster");
                };
                // With a redirect, the redirect's state is per node: a node that could not
                // deliver an invalidation (its client gone) flags the redirect broken, the
                // others do not yet, so TRACKINGINFO asks them all.
                let every = all || tracking.redirect.is_some();
                let conns: Vec<_> = match every {
                    true => tracking.conns.iter().map(|c| c.tx.clone()).collect(),
                    false => tracking
                        .conns
                        .iter()
                        .take(1)
                        .map(|c| c.tx.clone())
                        .collect(),
                };
                let asked = match (tracking.redirect, all) {
                    (Some(client), false) => ask_every(&conns, &command).await.map(|replies| {
                        let broken =
                            |r: &&Bytes| memchr::memmem::find(r, b"broken_redirect").is_some();
                        let reply = replies.iter().find(broken).or(replies.first());
                        // Each node names the redirect's connection there: its client.
                        crate::session::replies::map_redirect(
                            reply.cloned().unwrap_or_default(),
                            |_| Some(client),
                        )
                    }),
                    _ => ask_all(&conns, &command).await,
                };
                match asked {
                    Ok(reply) => unquoted(reply, unquote),
                    Err(reply) => {
                        // A connection that cannot answer cannot deliver invalidations.
                        self.input.closing = true;
                        reply
                    }
                }
            }
            TrackingCommand::Again {
                command,
                redirect,
                unquote,
                carries,
            } => {
                let reply = self.tracking_again(command, redirect, carries).await;
                unquoted(reply, unquote)
            }
            TrackingCommand::Caching { command, yes } => {
                let Some(tracking) = self.cluster.tracking.as_deref() else {
                    return crate::protocol::answers::tracking_lost("the cluster");
                };
                let conns: Vec<_> = tracking.conns.iter().map(|c| c.tx.clone()).collect();
                match ask_all(&conns, &command).await {
                    Ok(reply) => {
                        if reply.first() == Some(&b'+') {
                            let pending = if yes { CACHING_YES } else { CACHING_NO };
                            tracking.caching.store(pending, Ordering::Relaxed);
                        }
                        reply
                    }
                    Err(reply) => {
                        self.input.closing = true;
                        reply
                    }
                }
            }
            TrackingCommand::Stop => {
                if let Some(tracking) = self.cluster.tracking.take()
                    && self
                        .conn
                        .dedicated
                        .as_ref()
                        .is_some_and(|d| tracking.holds(&d.tx))
                {
                    // It would keep a tracking connection open (checked unpinned in
                    // `tracking_route`).
                    self.conn.dedicated = None;
                }
                Bytes::from_static(b"+OK\r\n")
            }
            TrackingCommand::Lost(reply) => {
                self.input.closing = true;
                reply
            }
        }
    }

    /// Opens a tracking connection to every primary and sends `command` on each (with a
    /// redirect, the one naming the redirect's connection on that node): `+OK` once every
    /// primary tracks, else the first refusal (and nothing is left on). `carries`: those
    /// connections carry the session's commands.
    async fn tracking_on(
        &mut self,
        command: Bytes,
        carries: bool,
        redirect: Option<Box<Redirect>>,
    ) -> Bytes {
        let (conns, checked) = match Box::pin(self.open_everywhere(TRACKING_CONN)).await {
            Ok(opened) => opened,
            Err(reply) => return reply,
        };
        if let Some(r) = redirect.as_deref().filter(|r| r.summon)
            && let Err(reply) = self.summon_listeners(r.client).await
        {
            return reply;
        }
        let asked = ask_each(&conns, &self.ctx.client_ids, &command, redirect.as_deref()).await;
        match asked {
            Ok(reply) if reply.first() == Some(&b'+') => {
                let proto = self.client.proto;
                self.cluster.tracking = Some(Box::new(ClusterTracking {
                    conns,
                    carries,
                    redirect: redirect.map(|r| r.client),
                    proto,
                    caching: AtomicU8::new(0),
                    checked,
                }));
                if carries {
                    // A dedicated connection kept from a blocking command (not pinned:
                    // `tracking_start`) reads untracked; the next one is a tracking one.
                    self.conn.dedicated = None;
                }
                reply
            }
            Ok(reply) | Err(reply) => reply,
        }
    }

    /// A connection of the session's own to every primary of the map (tracking's, or the
    /// client's login's: `kind`, their `conn_id` bits), and the map generation they were
    /// opened against; the client's error reply when one could not be opened.
    pub(super) async fn open_everywhere(
        &mut self,
        kind: u64,
    ) -> Result<(Vec<NodeConn>, AtomicU64), Bytes> {
        let router = self.cluster.router.clone();
        let checked = AtomicU64::new(router.snapshot_id());
        let primaries: Vec<u16> = router.snapshot().primaries().to_vec();
        let c = &mut *self.cluster;
        // Ids never reused, so the end of a connection closed earlier (an OFF, a RESET) is
        // not taken for one of these.
        c.own_starts += 1;
        let start = c.own_starts << 16;
        let mut conns = Vec::with_capacity(primaries.len());
        for (i, node) in primaries.into_iter().enumerate() {
            let id = kind | start | i as u64;
            let push = self.push_target(id);
            let conn = self
                .open_node_conn(&router, node, id, push, Stock::Dial)
                .await?;
            conns.push(conn);
        }
        Ok((conns, checked))
    }

    /// Hook in `follow_redirects` for what is not a batch reply: an invalidation from a
    /// tracking connection is queued behind the replies still due (see the module comment);
    /// a tracking connection that ended ends the session. Returns `true`: consumed.
    pub(in crate::session) fn tracking_event(&mut self, msg: &mut Reply) -> bool {
        if self.cluster.tracking.is_none() {
            return false;
        }
        match msg {
            Reply::Push(frame, permits, conn) if frame.starts_with(INVALIDATE) => {
                let permits = std::mem::take(permits);
                let queue = &self.queue;
                if self.client.proto == 2 {
                    // Redis sends none to a RESP2 client without a redirect.
                    self.queue.return_permits(permits);
                } else if self
                    .cluster
                    .repeated_flush(frame, *conn, || queue.mark_at(queue.behind_due_at()))
                {
                    self.queue.return_permits(permits);
                } else {
                    let frame = self.visible(std::mem::take(frame));
                    self.queue.behind_due(frame, permits);
                }
                true
            }
            Reply::PinnedClosed(id) if is_tracking_conn(*id) => {
                let id = *id;
                let ours = self
                    .cluster
                    .tracking
                    .as_deref()
                    .is_some_and(|t| t.conns.iter().any(|c| c.id == id));
                if ours {
                    tracing::warn!(
                        id = self.client.id,
                        "a tracking connection ended; the client is disconnected so its cache starts over"
                    );
                    self.input.closing = true;
                }
                true
            }
            _ => false,
        }
    }

    /// Caller side: asks client `client` to listen on every primary (`listen_everywhere`),
    /// waiting as long as `summon` does; the error to answer when it cannot.
    async fn summon_listeners(&self, client: u64) -> Result<(), Bytes> {
        let ctx = &self.ctx;
        let Some(rx) = ctx
            .client_list
            .summon(client, self.client.tenant, &ctx.idle_tick)
        else {
            return Err(crate::protocol::answers::tracking_redirect_gone());
        };
        let wait = ctx.dedicated_caps.2 + ctx.pool.connect_timeout();
        let why = match tokio::time::timeout(wait, rx).await {
            Ok(Ok(Ok(_))) => return Ok(()),
            Ok(Ok(Err(why))) => why,
            Ok(Err(_)) => return Err(crate::protocol::answers::tracking_redirect_gone()),
            Err(_) => format!("it did not answer within {} ms", wait.as_millis()),
        };
        Err(crate::protocol::answers::redirect_target_unreachable(
            client, &why,
        ))
    }
}

impl ClusterView<'_> {
    /// Hook in `place`, after the policy: a RESP3 client's `CLIENT TRACKING ON BCAST` without
    /// REDIRECT, OPTIN/OPTOUT or NOLOOP becomes `Gather::Tracking`, and so does every
    /// tracking command while such tracking is on. `None`: nothing to do here (one pointer
    /// test and one comparison for a session without it).
    pub(in crate::session) fn tracking_route(
        &self,
        router: &Router,
        action: &Action,
        args: &Args<'_>,
    ) -> Option<Action> {
        let on = self.cluster.tracking.as_deref();
        let gather = |command| Some(Action::Gather(Box::new(Gather::Tracking(command))));
        if let Some(node) = on.and_then(|t| primary_without(router, &t.conns, &t.checked)) {
            let reply = crate::protocol::answers::tracking_lost(&router.addr(node));
            return gather(TrackingCommand::Lost(reply));
        }
        // Default mode: the client's own login would be one node's connection's, and one it
        // needs to itself reads untracked (fail closed; the module comment).
        if on.is_some_and(|t| t.carries)
            && matches!(
                action.forwarded(),
                Some((_, Effect::Auth | Effect::AuthHello(_), _))
            )
        {
            let why = crate::protocol::answers::tracking_own_login();
            return Some(Action::Refused(crate::protocol::error::simple_error(
                "ERR", &why,
            )));
        }
        if !args.get(0).eq_ignore_ascii_case(b"CLIENT") || args.len() < 2 {
            return None;
        }
        let sub = args.get(1);
        // The subcommand's first argument (ON, OFF, YES…), empty when there is none: Redis
        // answers the arity error, and nothing here may index past the arguments.
        let first = if args.len() > 2 { args.get(2) } else { &[] };
        let is = |name: &[u8]| sub.eq_ignore_ascii_case(name);
        if !(is(b"TRACKING") || is(b"TRACKINGINFO") || is(b"GETREDIR") || is(b"CACHING")) {
            return None;
        }
        // Refused by the policy: its refusal stands.
        let (_, _, rewrite) = action.forwarded()?;
        let unquote = rewrite.and_then(|r| r.strip.clone());
        let command = match rewrite.and_then(|r| r.command.as_ref()) {
            Some(frame) => frame.clone(),
            None => codec::encode(&args.iter().collect::<Vec<_>>()),
        };
        let Some(_) = on else {
            // OFF while off: Redis does nothing. Forwarded, it would hold the session on a
            // dedicated connection for nothing (`Holds::CLIENT_MODE`), which pins it to one
            // node and keeps later tracking from being spread.
            if is(b"TRACKING")
                && grammar::keyword(first, b"OFF")
                && grammar::tracking_options(args).is_some()
                && !self.conn.holds(Holds::CLIENT_MODE)
                && !self.conn.in_multi()
            {
                return Some(Action::Local(
                    Bytes::from_static(b"+OK\r\n"),
                    crate::session::effect::LocalEffect::None,
                ));
            }
            return self
                .tracking_start(router, args, command, unquote)
                .and_then(gather);
        };
        if self.conn.in_multi() {
            return Some(Action::Refused(
                crate::protocol::answers::tracking_in_multi(),
            ));
        }
        if is(b"CACHING") {
            return gather(TrackingCommand::Caching {
                command,
                yes: grammar::keyword(first, b"YES"),
            });
        }
        if !is(b"TRACKING") {
            return gather(TrackingCommand::Ask {
                command,
                all: false,
                unquote,
            });
        }
        match grammar::tracking_options(args) {
            // ON again, with or without a redirect (Redis replaces it): every node's
            // connection takes it, naming the redirect's connection there.
            Some(o) if grammar::keyword(first, b"ON") && spread_carries(&o).is_some() => {
                let redirect = match o.redirect {
                    None => None,
                    Some(at) => match self.redirect_everywhere(router, args, at) {
                        Some(r) if unquote.is_none() => Some(Box::new(r)),
                        _ => {
                            return Some(Action::Refused(
                                crate::protocol::answers::tracking_redirect_while_bcast(),
                            ));
                        }
                    },
                };
                gather(TrackingCommand::Again {
                    command,
                    redirect,
                    unquote,
                    carries: spread_carries(&o).unwrap_or(true),
                })
            }
            Some(o) if o.redirect.is_some() => Some(Action::Refused(
                crate::protocol::answers::tracking_redirect_while_bcast(),
            )),
            // OFF as Redis reads it (strcasecmp: `off\0` is OFF; options it parses are
            // accepted and ignored).
            Some(_) if grammar::keyword(first, b"OFF") => {
                // Default mode: the dedicated connection may be a tracking connection, which
                // OFF closes, with what the client holds on it.
                if self.pinned()
                    && let (Some(t), Some(d)) = (on, &self.conn.dedicated)
                    && t.holds(&d.tx)
                {
                    return Some(Action::Refused(
                        crate::protocol::answers::tracking_off_while_pinned(),
                    ));
                }
                gather(TrackingCommand::Stop)
            }
            // More prefixes, a mode switch Redis refuses, a syntax error: Redis answers.
            _ => gather(TrackingCommand::Ask {
                command,
                all: true,
                unquote,
            }),
        }
    }

    /// `CLIENT TRACKING ON …` that can be spread over every primary (see the module comment):
    /// BCAST, or the default mode; `None` for anything else, which keeps the pinned path.
    fn tracking_start(
        &self,
        router: &Router,
        args: &Args<'_>,
        command: Bytes,
        unquote: Option<Box<Strip>>,
    ) -> Option<TrackingCommand> {
        if args.len() < 3
            || !args.get(1).eq_ignore_ascii_case(b"TRACKING")
            || !grammar::keyword(args.get(2), b"ON")
        {
            return None;
        }
        let options = grammar::tracking_options(args)?;
        let redirect = match options.redirect {
            None => None,
            // A namespaced tenant's REDIRECT is refused by the policy; kept pinned anyway.
            Some(_) if unquote.is_some() => return None,
            Some(at) => Some(Box::new(self.redirect_everywhere(router, args, at)?)),
        };
        // A client logged in as its own user over every primary: the tracking connections
        // are logged in as the user as they open (`log_in_as_client`), and carry its commands
        // in place of the login's (`Routing::own_conn`). On one connection only, pinned.
        let spreads =
            router.routes().is_none() && !self.stateful() && !self.own_login_on_one_node();
        let carries = spread_carries(&options)?;
        spreads.then_some(TrackingCommand::Start {
            command,
            carries,
            unquote,
            redirect,
        })
    }

    /// A REDIRECT to client `args[at]` that can be spread: a live client of this tenant,
    /// not this one, with a connection on every primary that hears the invalidations sent
    /// to it (its subscription to `__redis__:invalidate` is on every primary: `keyspace`),
    /// or a RESP3 one, which takes them as pushes on any connection of its own and is asked
    /// to open the missing ones (`Redirect::summon`). `None` keeps the pinned path (the
    /// named client's one node): a RESP2 client hears them only while subscribed.
    fn redirect_everywhere(&self, router: &Router, args: &Args<'_>, at: usize) -> Option<Redirect> {
        let client = codec::parse_int(args.get(at)).filter(|&id| id > 0)? as u64;
        let ids = &self.ctx.client_ids;
        let ours = self.ctx.client_list.tenant(client) == Some(self.client.tenant);
        let everywhere = router
            .snapshot()
            .primaries()
            .iter()
            .all(|&node| ids.on_node(client, node).is_some());
        let summon = !everywhere && self.ctx.client_list.resp(client) == Some(3);
        (ours && client != self.client.id && (everywhere || summon)).then(|| Redirect {
            client,
            summon,
            args: args.iter().map(Bytes::copy_from_slice).collect(),
            at,
        })
    }

    /// Hook in `place`, for each command that goes upstream: the one placed after a `CLIENT
    /// CACHING` is the one it applies to. Sent to one node, every other node's connection
    /// gets a `PING`, which clears the flag there (Redis clears it after any command but
    /// CLIENT), before any later command of the session reaches them. Sent to several nodes
    /// (a split, a fan-out), the flag stays where the command does not go: harmless after
    /// `yes` (a key read there is tracked, and one needless invalidation may come), but after
    /// `no` a later read there would not be tracked and the client's cache would keep a stale
    /// value, so that command is refused (fail closed). Commands the proxy answers itself
    /// leave it pending.
    pub(in crate::session) fn caching_next(&self, decision: Decision, args: &Args<'_>) -> Decision {
        let Some(tracking) = self.cluster.tracking.as_deref() else {
            return decision;
        };
        let pending = tracking.caching.load(Ordering::Relaxed);
        // Redis keeps the flag past CLIENT commands (CACHING again, TRACKINGINFO…).
        if pending == 0 || args.get(0).eq_ignore_ascii_case(b"CLIENT") {
            return decision;
        }
        let node = match decision.action.forwarded() {
            Some((Target::Shared(_, node) | Target::Dedicated(node), ..)) => Some(node),
            None if matches!(decision.action, Action::Gather(_)) => None,
            None => return decision,
        };
        tracking.caching.store(0, Ordering::Relaxed);
        let Some(node) = node else {
            if pending == CACHING_NO {
                return Action::Refused(crate::protocol::answers::caching_no_over_nodes()).into();
            }
            return decision;
        };
        for conn in tracking.conns.iter().filter(|c| c.node != node) {
            unanswered(&conn.tx, Bytes::from_static(b"*1\r\n$4\r\nPING\r\n"));
        }
        decision
    }
}

/// Whether tracking with `options` can be spread over every primary, and if so whether the
/// session's commands go over the tracking connections (`ClusterTracking::carries`); `None`
/// keeps the pinned path.
fn spread_carries(options: &grammar::TrackingOptions) -> Option<bool> {
    // The default mode: the session's commands go over the tracking connections, so NOLOOP
    // holds; OPTIN and OPTOUT do not (CACHING is about one connection's next command);
    // PREFIX without BCAST is Redis's error, on the pinned path. Replica reads would be
    // untracked: a session whose commands go over them reads from the primaries
    // (`may_read_replica`).
    let keys = !options.bcast && options.prefixes.is_empty();
    // BCAST: the invalidations do not depend on which connection reads; NOLOOP leaves out
    // the tracking connection's own writes, so the session's commands go over it then too.
    let bcast = options.bcast && !options.opt_in_out;
    (keys || bcast).then_some(keys || options.noloop)
}

/// Redis's reply to a tracking command with a namespaced tenant's prefix taken out of the
/// names it quotes (`unquote`: the policy's strip, if any).
fn unquoted(reply: Bytes, unquote: Option<Box<Strip>>) -> Bytes {
    match unquote {
        Some(s) => s.apply(&reply),
        None => reply,
    }
}

/// A primary of the current map without one of `conns`, looked for only when the map changed
/// since `checked` (which then notes the new map once every primary has one).
pub(super) fn primary_without(
    router: &Router,
    conns: &[NodeConn],
    checked: &AtomicU64,
) -> Option<u16> {
    let generation = router.snapshot_id();
    if generation == checked.load(Ordering::Relaxed) {
        return None;
    }
    let snapshot = router.snapshot();
    let missing = snapshot
        .primaries()
        .iter()
        .copied()
        .find(|&n| !conns.iter().any(|c| c.node == n));
    if missing.is_none() {
        checked.store(generation, Ordering::Relaxed);
    }
    missing
}

/// `command` on every connection, as `ask_all`; with a redirect, each connection's names the
/// redirect's connection on its node, and a client no longer there on some node is Redis's
/// error for it before anything is sent.
async fn ask_each(
    conns: &[NodeConn],
    ids: &ClientIds,
    command: &Bytes,
    redirect: Option<&Redirect>,
) -> Result<Bytes, Bytes> {
    let Some(redirect) = redirect else {
        let senders: Vec<_> = conns.iter().map(|c| c.tx.clone()).collect();
        return ask_all(&senders, command).await;
    };
    let mut commands = Vec::with_capacity(conns.len());
    for conn in conns {
        match redirect.command_for(ids, conn.node) {
            Some(command) => commands.push((conn.tx.clone(), command)),
            None => return Ok(crate::protocol::answers::tracking_redirect_gone()),
        }
    }
    let mut refused = None;
    let mut first = None;
    for (tx, command) in &commands {
        let reply = ask_all(std::slice::from_ref(tx), command).await?;
        if reply.first() == Some(&b'-') {
            refused.get_or_insert(reply.clone());
        }
        first.get_or_insert(reply);
    }
    Ok(refused.or(first).unwrap_or_default())
}

/// Sends `command` on each connection and waits for every reply: the first reply when all
/// answered (an error reply of Redis included), else the error of a connection that could not.
async fn ask_all(conns: &[mpsc::Sender<Batch>], command: &Bytes) -> Result<Bytes, Bytes> {
    let replies = ask_every(conns, command).await?;
    let refused = replies.iter().find(|r| r.first() == Some(&b'-'));
    Ok(refused.or(replies.first()).cloned().unwrap_or_default())
}

/// Sends `command` on each connection and returns every reply, in the order they came
/// (Redis's error replies included), or the error of a connection that could not answer.
async fn ask_every(conns: &[mpsc::Sender<Batch>], command: &Bytes) -> Result<Vec<Bytes>, Bytes> {
    ask_every_or(conns, command, crate::protocol::answers::tracking_lost).await
}

/// `ask_every`, with `lost` making the error for a connection that is gone (tracking's or
/// the login's words).
pub(super) async fn ask_every_or(
    conns: &[mpsc::Sender<Batch>],
    command: &Bytes,
    lost: fn(&str) -> Bytes,
) -> Result<Vec<Bytes>, Bytes> {
    if conns.is_empty() {
        return Err(lost("a primary"));
    }
    let (reply_to, mut rx) = crate::upstream::reply_channel();
    for tx in conns {
        let batch = Batch {
            bytes: command.clone(),
            expect: Expect::Frames(1),
            wait: ReplyWait::Prompt,
            reply_to: reply_to.clone(),
            seq: 0,
        };
        if tx.send(batch).await.is_err() {
            return Err(lost("a primary"));
        }
    }
    drop(reply_to);
    let mut replies = Vec::with_capacity(conns.len());
    for _ in conns {
        match rx.recv().await {
            Some(Reply::Batch {
                data, error: None, ..
            }) => replies.push(data),
            Some(Reply::Batch { error: Some(e), .. }) => {
                return Err(crate::protocol::error::error_reply(
                    &crate::protocol::error::ProxyError::Upstream(*e),
                ));
            }
            _ => return Err(lost("a primary")),
        }
    }
    Ok(replies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracking_connection_ids_are_told_from_the_others() {
        assert!(is_tracking_conn(TRACKING_CONN | 5));
        assert!(!is_tracking_conn((1 << 63) | 5), "a shard connection");
        assert!(!is_tracking_conn((3 << 62) | 5), "a keyspace connection");
        assert!(!is_tracking_conn(5), "the dedicated connection");
        assert!(!crate::session::cluster::keyspace::is_keyspace_conn(
            TRACKING_CONN | 5
        ));
    }
}
