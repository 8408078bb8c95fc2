//! Cluster mode: client-side caching (`CLIENT TRACKING ON`, broadcasting or default mode)
//! over every primary.
//!
//! Redis sends an invalidation from the node where the key was written, to the clients that
//! connection tracks. Standalone, the proxy turns tracking on on the client's dedicated
//! connection and every command goes there. In a cluster one connection hears one node, so
//! a tracking client was pinned to one node (keys of the others got CROSSSLOT). In BCAST mode
//! the invalidations do not depend on what the client read, so the proxy turns tracking on,
//! with the command as the policy left it (a namespaced tenant's PREFIX included), on one
//! dedicated RESP3 connection per primary, and the session stays unpinned: its reads and
//! writes keep the shared connections of every node.
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
//! node), at its next command, after an error saying why. REDIRECT while on, and any
//! tracking command inside MULTI (the state is on every node, the transaction on one), are
//! refused with the reason.
//!
//! **Default mode** (`CLIENT TRACKING ON` without BCAST; NOLOOP too). Redis invalidates the
//! keys a connection read, and tells that connection only. So the tracking connections are
//! not only listened to: every command of the session for a node goes over its connection
//! there, instead of the node's shared connection (`Routing::tracking_conn`, asked by
//! `enqueue_to` and `send_shared`), and it is also the session's dedicated connection to
//! that node (MULTI, WATCH, blocking commands, scripts: `Session::tracking_dedicated`). Each
//! node's connection reads what the client reads of that node's keys, as the client's one
//! connection would on one Redis; the session is not pinned (a command for another node goes
//! over that node's), and NOLOOP holds as the client's writes go over the same connections.
//! While a RESP2 client (after `HELLO 2`) the session uses the shared connections as usual:
//! Redis sends no invalidations to a RESP2 client without REDIRECT. Fail closed: a client's
//! own AUTH (a connection of its own, untracked) is refused while on, and a primary without
//! a tracking connection answers the lost-tracking error before anything is read there.
//!
//! Not spread (the session is pinned to one node as before, docs/cluster.md): OPTIN/OPTOUT
//! (`CLIENT CACHING` is about one connection's next command), BCAST with NOLOOP (the client's
//! writes go over other connections), REDIRECT, RESP2, routes, replica reads (default mode),
//! a client logged in upstream as its own user, and a session already pinned.

use super::Gather;
use super::shard_subs::NodeConn;
use crate::commands::grammar;
use crate::policy::rewrite::Strip;
use crate::protocol::codec;
use crate::session::route::Args;
use crate::session::{Action, Effect, Holds, Session};
use crate::topology::cluster::Router;
use crate::upstream::{Batch, Expect, Reply, ReplyWait};
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

/// The `conn_id` bits of the tracking connections: `SHARD_CONN`'s (so no code takes their end
/// for the dedicated connection's) and bit 61, unlike shard (`1 << 63`) and keyspace
/// (`3 << 62`) connections.
const TRACKING_CONN: u64 = (1 << 63) | (1 << 61);

/// The bits that tell the per-node connections apart.
const CONN_KIND: u64 = 7 << 61;

/// Whether the connection id `id` (of a `Reply::PinnedClosed`) is a tracking connection's.
pub(in crate::session) fn is_tracking_conn(id: u64) -> bool {
    id & CONN_KIND == TRACKING_CONN
}

/// What an invalidation push starts with (RESP3): `>2`, then the bulk string `invalidate`.
const INVALIDATE: &[u8] = b">2\r\n$10\r\ninvalidate\r\n";

/// A session's tracking: one connection per primary.
pub(in crate::session) struct ClusterTracking {
    /// One RESP3 connection per primary of the map, tracking turned on there.
    conns: Vec<NodeConn>,
    /// Default mode (not BCAST): Redis tracks the keys each connection reads, so the
    /// session's RESP3 commands for a node go over its connection here (`conn_for`).
    keys: bool,
    /// The map's generation the connections were last checked against: a new map may name
    /// a primary without one. Atomic only so the check can note it from `&self` (placement).
    checked: AtomicU64,
}

/// Which connection a session's command for a node takes, as tracking decides it.
pub(in crate::session) enum OwnConn<'a> {
    /// Not decided by tracking: the node's shared connection, or a dedicated one.
    Any,
    /// Default-mode tracking: the session's tracking connection to the node.
    Tracking(&'a NodeConn),
    /// Default-mode tracking, and no tracking connection to the node (a primary the map
    /// gained): nothing may be read there untracked.
    Missing,
}

impl ClusterTracking {
    /// Which connection a command in protocol `proto` for `node` takes (see `OwnConn`).
    pub(in crate::session) fn conn_for(&self, proto: u8, node: u16) -> OwnConn<'_> {
        if !self.keys || proto != 3 {
            return OwnConn::Any;
        }
        match self.conns.iter().find(|c| c.node == node) {
            Some(c) => OwnConn::Tracking(c),
            None => OwnConn::Missing,
        }
    }

    /// Whether `tx` is one of the tracking connections (the session's dedicated connection
    /// borrowed one, default mode).
    pub(in crate::session) fn holds(&self, tx: &mpsc::Sender<Batch>) -> bool {
        self.conns.iter().any(|c| c.tx.same_channel(tx))
    }
}

/// A tracking command the session answers over the tracking connections.
pub(in crate::session) enum TrackingCommand {
    /// `CLIENT TRACKING ON …` while off: every primary gets a connection and the command (as
    /// it goes upstream); `keys`: the default mode (`ClusterTracking::keys`).
    Start {
        command: Bytes,
        keys: bool,
        /// A namespaced tenant's: its prefix taken out of an error quoting the prefixes.
        unquote: Option<Box<Strip>>,
    },
    /// A tracking command while on (more prefixes, TRACKINGINFO, GETREDIR, CACHING): sent to
    /// every tracking connection (`all`) or the first; the first reply is the client's.
    Ask {
        command: Bytes,
        all: bool,
        /// As `Start`'s.
        unquote: Option<Box<Strip>>,
    },
    /// `CLIENT TRACKING OFF`: the connections close, which turns tracking off on each node.
    Stop,
    /// Tracking cannot hold any more (a primary without a tracking connection): this error,
    /// and the session ends after it, as its cache may hold values whose invalidation it
    /// cannot get.
    Lost(Bytes),
}

impl Session {
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
        let on = self.routing.cluster().and_then(|c| c.tracking.as_deref());
        let gather = |command| Some(Action::Gather(Box::new(Gather::Tracking(command))));
        if let Some(tracking) = on {
            let generation = router.snapshot_id();
            if generation != tracking.checked.load(Ordering::Relaxed) {
                if let Some(node) = self.untracked_primary(router, tracking) {
                    let reply = crate::protocol::answers::tracking_lost(&router.addr(node));
                    return gather(TrackingCommand::Lost(reply));
                }
                tracking.checked.store(generation, Ordering::Relaxed);
            }
        }
        // Default mode: the client's own login would be one node's connection's, and one it
        // needs to itself reads untracked (fail closed; the module comment).
        if on.is_some_and(|t| t.keys)
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
            return self
                .tracking_start(router, args, command, unquote)
                .and_then(gather);
        };
        if self.conn.in_multi() {
            return Some(Action::Refused(
                crate::protocol::answers::tracking_in_multi(),
            ));
        }
        if !is(b"TRACKING") {
            return gather(TrackingCommand::Ask {
                command,
                all: is(b"CACHING"),
                unquote,
            });
        }
        match grammar::tracking_options(args) {
            Some(o) if o.redirect.is_some() => Some(Action::Refused(
                crate::protocol::answers::tracking_redirect_while_bcast(),
            )),
            // OFF as Redis reads it (strcasecmp: `off\0` is OFF; options it parses are
            // accepted and ignored).
            Some(_) if grammar::keyword(args.get(2), b"OFF") => {
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
        let spreads = options.redirect.is_none()
            && self.client.proto == 3
            && router.routes().is_none()
            && !self.stateful()
            && !self.conn.holds(Holds::OTHER_USER);
        // The invalidations do not depend on which connection reads or writes.
        let bcast = options.bcast && !options.per_client_modes;
        // The session's commands go over the tracking connections: NOLOOP holds, OPTIN and
        // OPTOUT do not (CACHING is about one connection's next command), nor do replica
        // reads (read on a replica's connection, untracked); PREFIX without BCAST is Redis's
        // error, on the pinned path.
        let keys = !options.bcast
            && !options.opt_in_out
            && options.prefixes.is_empty()
            && router.read_from() == crate::config::ReadFrom::Primary;
        (spreads && (bcast || keys)).then_some(TrackingCommand::Start {
            command,
            keys,
            unquote,
        })
    }

    /// A primary of the current map without a tracking connection, if any.
    fn untracked_primary(&self, router: &Router, tracking: &ClusterTracking) -> Option<u16> {
        let snapshot = router.snapshot();
        snapshot
            .primaries()
            .iter()
            .copied()
            .find(|&n| !tracking.conns.iter().any(|c| c.node == n))
    }

    /// Carries out a tracking command: the one reply the client gets.
    pub(in crate::session) async fn tracking_command(&mut self, command: TrackingCommand) -> Bytes {
        match command {
            TrackingCommand::Start {
                command,
                keys,
                unquote,
            } => unquoted(self.tracking_on(command, keys).await, unquote),
            TrackingCommand::Ask {
                command,
                all,
                unquote,
            } => {
                let Some(tracking) = self.routing.cluster().and_then(|c| c.tracking.as_deref())
                else {
                    return crate::protocol::answers::tracking_lost("the cluster");
                };
                let conns: Vec<_> = match all {
                    true => tracking.conns.iter().map(|c| c.tx.clone()).collect(),
                    false => tracking
                        .conns
                        .iter()
                        .take(1)
                        .map(|c| c.tx.clone())
                        .collect(),
                };
                match ask_all(&conns, &command).await {
                    Ok(reply) => unquoted(reply, unquote),
                    Err(reply) => {
                        // A connection that cannot answer cannot deliver invalidations.
                        self.input.closing = true;
                        reply
                    }
                }
            }
            TrackingCommand::Stop => {
                if let Some(c) = self.routing.cluster_mut()
                    && let Some(tracking) = c.tracking.take()
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

    /// Opens a tracking connection to every primary and sends `command` on each: `+OK` once
    /// every primary tracks, else the first refusal (and nothing is left on). `keys`: the
    /// default mode, where those connections carry the session's commands.
    async fn tracking_on(&mut self, command: Bytes, keys: bool) -> Bytes {
        let Some(router) = self.routing.router().cloned() else {
            return crate::protocol::answers::tracking_lost("the cluster");
        };
        let checked = AtomicU64::new(router.snapshot_id());
        let primaries: Vec<u16> = router.snapshot().primaries().to_vec();
        let Some(c) = self.routing.cluster_mut() else {
            return crate::protocol::answers::tracking_lost("the cluster");
        };
        // Ids never reused, so the end of a connection closed by an earlier OFF is not
        // taken for one of these.
        c.tracking_starts += 1;
        let start = c.tracking_starts << 16;
        let mut conns = Vec::with_capacity(primaries.len());
        for (i, node) in primaries.into_iter().enumerate() {
            let id = TRACKING_CONN | start | i as u64;
            let push = self.push_target(id);
            match self.open_node_conn(&router, node, id, push).await {
                Ok(conn) => conns.push(conn),
                Err(reply) => return reply,
            }
        }
        let senders: Vec<_> = conns.iter().map(|c| c.tx.clone()).collect();
        match ask_all(&senders, &command).await {
            Ok(reply) if reply.first() == Some(&b'+') => {
                if let Some(c) = self.routing.cluster_mut() {
                    c.tracking = Some(Box::new(ClusterTracking {
                        conns,
                        keys,
                        checked,
                    }));
                }
                if keys {
                    // A dedicated connection kept from a blocking command (not pinned:
                    // `tracking_start`) reads untracked; the next one is a tracking one.
                    self.conn.dedicated = None;
                }
                reply
            }
            Ok(reply) | Err(reply) => reply,
        }
    }

    /// Hook in `follow_redirects` for what is not a batch reply: an invalidation from a
    /// tracking connection is queued behind the replies still due (see the module comment);
    /// a tracking connection that ended ends the session. Returns `true`: consumed.
    pub(in crate::session) fn tracking_event(&mut self, msg: &mut Reply) -> bool {
        if self.routing.cluster().is_none_or(|c| c.tracking.is_none()) {
            return false;
        }
        match msg {
            Reply::Push(frame, permits) if frame.starts_with(INVALIDATE) => {
                let permits = std::mem::take(permits);
                if self.client.proto == 2 {
                    // Redis sends none to a RESP2 client without a redirect.
                    self.return_permits(permits);
                } else {
                    let frame = self.visible(std::mem::take(frame));
                    self.queue.behind_due(frame, permits);
                }
                true
            }
            Reply::PinnedClosed(id) if is_tracking_conn(*id) => {
                let id = *id;
                let ours = self
                    .routing
                    .cluster()
                    .and_then(|c| c.tracking.as_deref())
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
}

/// Redis's reply to a tracking command with a namespaced tenant's prefix taken out of the
/// names it quotes (`unquote`: the policy's strip, if any).
fn unquoted(reply: Bytes, unquote: Option<Box<Strip>>) -> Bytes {
    match unquote {
        Some(s) => s.apply(&reply),
        None => reply,
    }
}

/// Sends `command` on each connection and waits for every reply: the first reply when all
/// answered (an error reply of Redis included), else the error of a connection that could not.
async fn ask_all(conns: &[mpsc::Sender<Batch>], command: &Bytes) -> Result<Bytes, Bytes> {
    if conns.is_empty() {
        return Err(crate::protocol::answers::tracking_lost("a primary"));
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
            return Err(crate::protocol::answers::tracking_lost("a primary"));
        }
    }
    drop(reply_to);
    let mut first: Option<Bytes> = None;
    let mut refused: Option<Bytes> = None;
    for _ in conns {
        match rx.recv().await {
            Some(Reply::Batch {
                data, error: None, ..
            }) => {
                if data.first() == Some(&b'-') && refused.is_none() {
                    refused = Some(data.clone());
                }
                first.get_or_insert(data);
            }
            Some(Reply::Batch { error: Some(e), .. }) => {
                return Err(crate::protocol::error::error_reply(
                    &crate::protocol::error::ProxyError::Upstream(*e),
                ));
            }
            _ => return Err(crate::protocol::answers::tracking_lost("a primary")),
        }
    }
    Ok(refused.or(first).unwrap_or_default())
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
