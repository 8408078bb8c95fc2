//! Cluster gathering: commands one node cannot answer for the whole keyspace. `place` asks
//! here what such a command becomes (`fanout_merge`, `decide_scan`, `split`: an
//! `Action::Gather`), and `gather` carries it out after every earlier command has run: a
//! whole-keyspace command sent to every primary (`Fanout`), a multi-key command split by slot
//! (`Split`), one step of a SCAN over the primaries (`Scan`). `merge` combines the replies.

use super::again::may_redirect;
use super::exchange::{lost_reply, receive};
use super::merge::{Combine, Join, Merge, SetOp, ZOp, join, merge, scan_position, scan_step_reply};
use super::plan::{BlockingRead, Fanout, Gather, MAX_BLOCKING_SLOTS, NodeBatch, Scan, Split};
use super::state::OwnConn;
use super::{ClusterSession, ClusterView};
use crate::commands::grammar::keyword;
use crate::policy::line::CommandLine;
use crate::policy::rewrite::Strip;
use crate::protocol::codec::{CodecLimits, Decoded};
use crate::protocol::double_text::ServerDoubles;
use crate::protocol::error::{ProxyError, error_reply};
use crate::protocol::{answers, codec};
use crate::session::action::Action;
use crate::session::conn::Holds;
use crate::session::effect::{Effect, InfoEdit, LocalEffect};
use crate::session::proxy_commands::proxy_info;
use crate::session::reply_queue::WAIT_BARRIER;
use crate::session::route::Args;
use crate::topology::cluster::Router;
use crate::upstream::{Batch, Expect, ReplyWait};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use tokio::sync::mpsc;

impl ClusterSession<'_> {
    /// Carries out a `Gather`: the one reply the client gets.
    pub(in crate::session) async fn gather(&mut self, gather: Gather) -> Bytes {
        match gather {
            Gather::Fanout(fanout) => self.fanout(fanout).await,
            Gather::Split(split) => self.split(split).await,
            Gather::Scan(scan) => self.scan(scan).await,
            Gather::Sort(sort) => Box::pin(self.sort(sort)).await,
            Gather::ShardPubSub(command) => self.shard_command(command).await,
            Gather::Tracking(command) => self.tracking_command(command).await,
            Gather::Login(command) => Box::pin(self.login_command(command)).await,
        }
    }

    /// Runs one step of a cluster SCAN: the node the cursor names, with the node's own
    /// cursor; the reply's cursor is made composite again.
    pub(super) async fn scan(&mut self, scan: Scan) -> Bytes {
        let router = self.cluster.router.clone();
        // Ordered by address: stable across refreshes that keep the same primaries.
        let mut primaries: Vec<(Arc<str>, u16)> = router
            .snapshot()
            .primaries()
            .iter()
            .map(|&n| (router.addr(n), n))
            .collect();
        primaries.sort();
        primaries.dedup();
        let (shard, node_cursor) = scan_position(scan.cursor);
        let Some(&(_, node)) = primaries.get(shard) else {
            // The cluster has fewer primaries than when the scan started: nothing left.
            return Bytes::from_static(b"*2\r\n$1\r\n0\r\n*0\r\n");
        };
        let node_cursor = node_cursor.to_string();
        let mut argv: Vec<&[u8]> = vec![b"SCAN", node_cursor.as_bytes()];
        argv.extend(scan.options.iter().map(|o| &o[..]));
        let reply = match self
            .exchange(&router, node, self.client.proto, codec::encode(&argv), 1)
            .await
        {
            (_, Some(e)) => return error_reply(&ProxyError::Upstream(*e)),
            (data, None) => data,
        };
        let out = match scan_step_reply(&reply, shard, primaries.len()) {
            Ok(out) => out,
            // The node's error, a reply of the wrong shape, a cursor too large: as it is.
            Err(reply) => return reply,
        };
        match scan.strip {
            Some(strip) => strip.apply(&out),
            None => out,
        }
    }

    /// Sends the parts of a split multi-key command and joins their replies.
    pub(super) async fn split(&mut self, split: Split) -> Bytes {
        let router = self.cluster.router.clone();
        let mut pending = Vec::with_capacity(split.batches.len());
        for b in split.batches {
            let frames = (b.parts.len() + b.hidden) as u32;
            let bytes = b.bytes.freeze();
            let proto = self.client.proto;
            let rx = self
                .send_shared(&router, b.node, proto, bytes.clone(), frames)
                .await;
            // Each part is a command of one slot: the mirror gets the parts as they ran,
            // which a cluster mirror can place (the client's whole command it could not).
            let capture = (self.ctx.ops.mirror).capture(proto, &bytes, false, None, b.node);
            pending.push((b.node, b.parts, bytes, rx, capture, frames));
        }
        // Every part's reply, with the client-order positions of its keys.
        let mut parts: Vec<(Vec<usize>, Bytes)> = Vec::new();
        for (node, positions, bytes, rx, capture, sent) in pending {
            let (data, error) = receive(rx, &router, node).await;
            let mut frames = crate::protocol::reply::split(&data);
            if error.is_none() && may_redirect(&data) {
                // The slot moved since the map was read: follow, as for any command.
                self.redirect_batch(&router, node, &bytes, &mut frames)
                    .await;
            }
            if let Some(capture) = capture {
                capture.answered(self.client.id, frames.concat().into(), sent);
            }
            for (k, p) in positions.into_iter().enumerate() {
                let reply = match frames.get(k) {
                    Some(f) => f.clone(),
                    None => lost_reply(error.as_deref(), &router.addr(node), "no reply"),
                };
                parts.push((p, reply));
            }
        }
        let joined = join(split.join, split.keys, &parts, self.client.proto);
        match split.strip {
            Some(strip) if joined.first() != Some(&b'-') => strip.apply(&joined),
            _ => joined,
        }
    }

    /// Sends a whole-keyspace command to every primary and merges the replies.
    pub(super) async fn fanout(&mut self, fanout: Fanout) -> Bytes {
        let router = self.cluster.router.clone();
        let primaries = router.snapshot().primaries().to_vec();
        if primaries.is_empty() {
            router.refresh_soon();
            return answers::clusterdown();
        }
        match fanout.pause {
            Some(Effect::Pause(mode, ms)) => self.ctx.pause.start(mode, ms),
            Some(Effect::Unpause) => self.ctx.pause.end(),
            _ => {}
        }
        let mut replies = Vec::with_capacity(primaries.len());
        let mut home = None;
        if let Some(full) = &fanout.home_first {
            let Some(node) = router.keyless(self.client.id) else {
                router.refresh_soon();
                return answers::clusterdown();
            };
            let reply = match self
                .exchange(&router, node, self.client.proto, full.clone(), 1)
                .await
            {
                (_, Some(e)) => error_reply(&ProxyError::Upstream(*e)),
                (data, None) => data,
            };
            if reply.first() == Some(&b'-') {
                // Refused there, nothing of it applied: the others are not asked.
                return reply;
            }
            replies.push(reply);
            home = Some(node);
        }
        let primaries: Vec<u16> = primaries.into_iter().filter(|&n| Some(n) != home).collect();
        let mut receivers = Vec::with_capacity(primaries.len());
        // One-off connections of a blocking fan-out; dropped (closed) once answered.
        let mut connections = Vec::new();
        for &node in &primaries {
            let rx = if fanout.blocking {
                self.send_blocking(&router, node, &fanout, &mut connections)
                    .await
            } else {
                let (proto, bytes) = (self.client.proto, fanout.bytes.clone());
                self.send_shared(&router, node, proto, bytes, 1).await
            };
            receivers.push((node, rx));
        }
        // With routes the mirror copies one node: it gets that node's own reply.
        let mirrored = self.ctx.ops.mirror.only();
        let mut mirrored_reply = None;
        for (node, rx) in receivers {
            let reply = match receive(rx, &router, node).await {
                (_, Some(e)) => error_reply(&ProxyError::Upstream(*e)),
                // The barrier's reply comes first and is dropped.
                (data, None) if fanout.blocking => {
                    crate::protocol::reply::split(&data).pop().unwrap_or(data)
                }
                (data, None) => data,
            };
            if mirrored == Some(node) {
                mirrored_reply = Some(reply.clone());
            }
            replies.push(reply);
        }
        if let Some(len) = fanout.sets_slowlog_max_len {
            // Redis sets all of a CONFIG SET's parameters or none, per node: where only some
            // nodes took it, their lengths differ and none is the one to keep.
            let took = |r: &Bytes| r.starts_with(b"+OK");
            if replies.iter().all(took) {
                router.learn_slowlog_max_len(len);
            } else if replies.iter().any(took) {
                router.learn_slowlog_max_len(None);
            }
        }
        let merged = merge(fanout.merge, &replies, varying_seed());
        // Once, with the merged reply (a mirror that is a cluster sends the whole-keyspace
        // writes, FLUSHALL, SCRIPT LOAD…, to each of its primaries itself), or with the
        // mirrored route's node's own.
        let node = mirrored.unwrap_or_default();
        if !fanout.blocking
            && (mirrored.is_none() || mirrored_reply.is_some())
            && let Some(capture) =
                (self.ctx.ops.mirror).capture(self.client.proto, &fanout.bytes, false, None, node)
        {
            capture.answered(
                self.client.id,
                mirrored_reply.unwrap_or_else(|| merged.clone()),
                1,
            );
        }
        self.finish_fanout(fanout, merged)
    }

    /// Sends a blocking fan-out's command (WAIT, WAITAOF) to `node` on a one-off dedicated
    /// connection, as it blocks, after the `WAIT_BARRIER`; the connection goes to
    /// `connections`, to live until answered. Where the replies will come, or `None` when
    /// nothing could be sent.
    async fn send_blocking(
        &self,
        router: &Router,
        node: u16,
        fanout: &Fanout,
        connections: &mut Vec<mpsc::Sender<Batch>>,
    ) -> Option<crate::upstream::ReplyReceiver> {
        let (tx, rx) = crate::upstream::reply_channel();
        // The session's own connection to the node (the client's login, tracking): its
        // writes went over it, so WAIT counts them there, with the client's rights (a
        // one-off connection is the proxy's login, which would run what the user may not).
        match self.cluster.own_conn(node) {
            OwnConn::Own(own) => {
                let batch = Batch {
                    bytes: fanout.bytes.clone(),
                    expect: Expect::Frames(1),
                    wait: fanout.wait,
                    reply_to: tx,
                    seq: 0,
                };
                return own.tx.send(batch).await.is_ok().then_some(rx);
            }
            // None there (a primary the map gained): not with the proxy's rights either.
            OwnConn::Missing => return None,
            OwnConn::Any => {}
        }
        let batch = Batch {
            bytes: [Bytes::from_static(WAIT_BARRIER), fanout.bytes.clone()]
                .concat()
                .into(),
            expect: Expect::Frames(2),
            wait: fanout.wait,
            reply_to: tx,
            seq: 0,
        };
        let push = super::exchange::unheard_push();
        let conn = Box::pin(router.pool(node).dedicated(self.client.proto, push, false))
            .await
            .ok()?
            .tx;
        let sent = conn.send(batch).await.is_ok();
        connections.push(conn);
        sent.then_some(rx)
    }

    /// A fan-out's merged reply as the client gets it: with the proxy's own INFO section
    /// and without the tenant's namespace, neither added to an error.
    fn finish_fanout(&self, fanout: Fanout, merged: Bytes) -> Bytes {
        let merged = if let Some(edit) = fanout.info
            && merged.first() != Some(&b'-')
        {
            let section = (edit == InfoEdit::CountAndSection)
                .then(|| proxy_info(self.ctx, self.client, Some(self.cluster.router.read_from())));
            crate::session::replies::info_as_seen(
                merged,
                section.as_deref(),
                self.ctx.client_list.connected(self.client.tenant),
            )
        } else {
            merged
        };
        match fanout.strip {
            Some(strip) if merged.first() != Some(&b'-') => strip.apply(&merged),
            _ => merged,
        }
    }
}

impl ClusterView<'_> {
    /// How the replies of a whole-keyspace command sent to every primary are merged; `None`
    /// for a command that goes to one node (and WAIT in a pinned session, which runs there).
    pub(super) fn fanout_merge(&self, args: &Args<'_>, effect: Effect) -> Option<Merge> {
        if matches!(effect, Effect::Wait(_)) {
            // A transaction or WATCH holds the session on one node: WAIT runs there.
            return (!self.pinned()).then_some(Merge::Min);
        }
        if matches!(effect, Effect::Pause(..) | Effect::Unpause) {
            // To its clients the proxy is one server: a pause holds back every node's
            // commands, as one Redis would hold back all of them. Inside MULTI it is queued
            // on the transaction's node (EXEC's reply cannot hold every node's answer).
            return (!self.conn.in_multi()).then_some(Merge::AllOk);
        }
        keyspace_merge(args, self.slowlog_max_len())
    }

    /// The slow log length one server would keep (see `Router::slowlog_max_len`).
    fn slowlog_max_len(&self) -> Option<usize> {
        self.cluster.router.slowlog_max_len()
    }

    /// How the upstream writes and reads doubles (`ServerDoubles::of_server`), for the
    /// scores the proxy computes (ZUNION's, ZINTER's) to read as its own would. Unknown (the server not read
    /// yet, or one not measured): those commands are not gathered (CROSSSLOT, as Redis
    /// Cluster answers) rather than answered with scores whose text may differ.
    pub(super) fn doubles(&self) -> Option<ServerDoubles> {
        let server = self.ctx.ops.metrics.upstream_server.load();
        let server = server.as_ref()?;
        ServerDoubles::of_server(&server.name, server.parsed)
    }

    /// The fan-out of a whole-keyspace command, merged as `merge` says; refused inside MULTI.
    pub(super) fn fanout_action(
        &self,
        args: &Args<'_>,
        effect: Effect,
        rewrite: Option<&crate::policy::rewrite::Rewrite>,
        merge: Merge,
    ) -> Action {
        if self.conn.in_multi() {
            // EXEC's reply would hold one node's answer only.
            return Action::Refused(answers::fanout_in_multi(args.get(0)));
        }
        // Fail closed: the shared connections are the proxy's login.
        if self.conn.holds(Holds::OTHER_USER) {
            return Action::Refused(answers::fanout_own_login(args.get(0)));
        }
        let bytes = match rewrite.and_then(|r| r.command.clone()) {
            Some(command) => command,
            None => crate::protocol::codec::encode(&args.iter().collect::<Vec<_>>()),
        };
        let (bytes, home_first) = match mixes_node_own_config(args) {
            Some(_) => (shared_config_set(args), Some(bytes)),
            None => (bytes, None),
        };
        Action::Gather(Box::new(Gather::Fanout(Fanout {
            bytes,
            merge,
            strip: rewrite.and_then(|r| r.strip.clone()),
            info: effect.info_edit(),
            blocking: merge == Merge::Min,
            wait: match effect {
                Effect::Wait(wait) => wait,
                _ => ReplyWait::Prompt,
            },
            pause: matches!(effect, Effect::Pause(..) | Effect::Unpause).then_some(effect),
            sets_slowlog_max_len: sets_slowlog_max_len(args),
            home_first,
        })))
    }

    /// SCAN over every primary with a composite cursor (see [`Scan`]).
    pub(super) fn decide_scan(
        &self,
        args: &Args<'_>,
        rewrite: Option<&crate::policy::rewrite::Rewrite>,
    ) -> Action {
        if self.conn.in_multi() {
            return Action::Refused(answers::fanout_in_multi(b"SCAN"));
        }
        if self.conn.holds(Holds::OTHER_USER) {
            return Action::Refused(answers::fanout_own_login(b"SCAN"));
        }
        let mut ranges = Vec::new();
        let argv: Vec<Bytes> = match rewrite.and_then(|r| r.command.as_ref()) {
            Some(frame) => match codec::decode(frame, &self.ctx.codec, &mut ranges) {
                Ok(Some(Decoded::Command { .. })) => {
                    ranges.iter().map(|r| frame.slice(r.clone())).collect()
                }
                _ => return Action::Refused(answers::crossslot()),
            },
            None => args.iter().map(Bytes::copy_from_slice).collect(),
        };
        let cursor = argv
            .get(1)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.parse::<u64>().ok());
        let Some(cursor) = cursor else {
            return Action::Local(answers::invalid_cursor(), LocalEffect::None);
        };
        Action::Gather(Box::new(Gather::Scan(Scan {
            cursor,
            options: argv.into_iter().skip(2).collect(),
            strip: rewrite.and_then(|r| r.strip.clone()),
        })))
    }
}

/// How the replies of a command sent to every primary for the whole keyspace are merged,
/// by its name (WAIT and CLIENT PAUSE, known by their effect, aside: `Session::fanout_merge`);
/// `None` for a command that goes to one node. `slowlog_len`: `Router::slowlog_max_len`.
pub(super) fn keyspace_merge<L: CommandLine + ?Sized>(
    args: &L,
    slowlog_len: Option<usize>,
) -> Option<Merge> {
    let arg = |i: usize| args.arg_or_empty(i);
    let name = arg(0);
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    let sub_in =
        |subs: &[&[u8]]| args.argc() > 1 && subs.iter().any(|sub| arg(1).eq_ignore_ascii_case(sub));
    if is("INFO") {
        Some(Merge::Info)
    } else if is("DBSIZE") {
        Some(Merge::Sum)
    } else if is("KEYS") {
        Some(Merge::Concat)
    } else if is("FLUSHALL") || is("FLUSHDB") {
        Some(Merge::AllOk)
    } else if is("CONFIG") && sub_in(&[b"SET"]) && config_set_params(args).all(node_own) {
        // Each node's own address, files and identity: the home node's, whose CONFIG
        // GET the client reads (every primary set to the home node's port could not
        // listen; every primary set to one `dir` would write one file).
        None
    } else if is("CONFIG") && sub_in(&[b"SET", b"RESETSTAT", b"REWRITE"]) {
        // To its clients the proxy is one server: a setting changed through it applies
        // to the whole keyspace, so to every primary (CONFIG GET reads the home node's).
        Some(Merge::AllOk)
    } else if is("ACL") && sub_in(&[b"SETUSER", b"DELUSER"]) {
        // ACL users are per node, and a client's own login goes to every primary
        // (`login`): a user made or removed through the proxy is made or removed there
        // all, as on one server (removed, Redis closes its connections on each).
        Some(Merge::AllOk)
    } else if is("RANDOMKEY") {
        Some(Merge::FirstNonNil)
    } else if (is("SCRIPT") || is("FUNCTION"))
        && sub_in(&[b"LOAD", b"FLUSH", b"DELETE", b"RESTORE"])
    {
        // Scripts and functions live per node, and a command using one may go to any
        // node: load (and remove) them everywhere, or a client's SCRIPT LOAD + EVALSHA
        // gets NOSCRIPT for keys on the other nodes, forever.
        Some(Merge::AllOk)
    } else if is("SLOWLOG") && sub_in(&[b"RESET"]) {
        // Node-local logs, one log to the clients: every node's.
        Some(Merge::AllOk)
    } else if is("SLOWLOG") && sub_in(&[b"LEN"]) {
        Some(Merge::SumAtMost(slowlog_len))
    } else if is("SLOWLOG") && sub_in(&[b"GET"]) {
        // Redis's default of 10 entries; -1 (or any count it refuses, which every node
        // then answers with its error) for all: all one server would keep.
        let count = match args.argc() {
            2 => Some(10),
            _ => codec::parse_int(arg(2)).and_then(|n| usize::try_from(n).ok()),
        };
        let limit = match (count, slowlog_len) {
            (Some(count), Some(len)) => Some(count.min(len)),
            (count, len) => count.or(len),
        };
        Some(Merge::Slowlog(limit))
    } else if is("SCRIPT") && sub_in(&[b"EXISTS"]) {
        Some(Merge::Max)
    } else if (is("SCRIPT") || is("FUNCTION")) && sub_in(&[b"KILL"]) {
        // A script runs on a dedicated connection to its keys' node (a keyless one
        // wherever keyless commands go), which the killer cannot name: every primary is
        // asked, and the one running it kills it.
        Some(Merge::Kill)
    } else {
        None
    }
}

/// The parameter names of a `CONFIG SET` (every other argument from the third).
fn config_set_params<L: CommandLine + ?Sized>(args: &L) -> impl Iterator<Item = &[u8]> {
    (2..args.argc()).step_by(2).map(|i| args.arg(i))
}

/// Configuration parameters that are each node's own: where it listens and how it names
/// itself to the cluster and its replicas, and its files. Set through the proxy, they go to
/// the home node only (see `Session::fanout_merge`).
const NODE_OWN: &[&str] = &[
    "port",
    "tls-port",
    "bind",
    "bind-source-addr",
    "unixsocket",
    "unixsocketperm",
    "cluster-port",
    "cluster-config-file",
    "cluster-announce-ip",
    "cluster-announce-port",
    "cluster-announce-bus-port",
    "cluster-announce-tls-port",
    "cluster-announce-hostname",
    "cluster-announce-human-nodename",
    "cluster-announce-client-ipv4",
    "cluster-announce-client-ipv6",
    "replica-announce-ip",
    "slave-announce-ip",
    "replica-announce-port",
    "slave-announce-port",
    "replicaof",
    "slaveof",
    "dir",
    "dbfilename",
    "logfile",
    "pidfile",
    "appendfilename",
    "appenddirname",
    "syslog-ident",
];

/// Whether a configuration parameter is each node's own (`NODE_OWN`).
fn node_own(name: &[u8]) -> bool {
    NODE_OWN
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
}

/// The `CONFIG SET` of the shared parameters of `args` (every pair whose name is not a
/// node's own), for the primaries other than the one that took the whole command.
fn shared_config_set(args: &Args<'_>) -> Bytes {
    let mut argv: Vec<&[u8]> = vec![args.get(0), args.get(1)];
    for pair in (2..args.len().saturating_sub(1)).step_by(2) {
        if !node_own(args.get(pair)) {
            argv.extend([args.get(pair), args.get(pair + 1)]);
        }
    }
    codec::encode(&argv)
}

/// A `CONFIG SET` that names a node's own parameter (returned) beside ones every primary
/// shares: it can go neither to the home node alone nor to every primary as it is.
pub(super) fn mixes_node_own_config<'a>(args: &'a Args<'_>) -> Option<&'a [u8]> {
    let config_set = args.len() > 3
        && args.get(0).eq_ignore_ascii_case(b"CONFIG")
        && args.get(1).eq_ignore_ascii_case(b"SET");
    if !config_set {
        return None;
    }
    let own = config_set_params(args).find(|p| node_own(p))?;
    config_set_params(args).any(|p| !node_own(p)).then_some(own)
}

/// For `CONFIG SET` naming `slowlog-max-len` (its last value, as Redis applies them in
/// order): that value as Redis reads it (`string2ll`, 0 to `LONG_MAX`), `None` when it does
/// not read so. `None` (outer) for any other command.
fn sets_slowlog_max_len<L: CommandLine + ?Sized>(args: &L) -> Option<Option<u64>> {
    let arg = |i: usize| args.arg_or_empty(i);
    if !(arg(0).eq_ignore_ascii_case(b"CONFIG") && arg(1).eq_ignore_ascii_case(b"SET")) {
        return None;
    }
    let mut set = None;
    for pair in (2..args.argc().saturating_sub(1)).step_by(2) {
        if arg(pair).eq_ignore_ascii_case(b"slowlog-max-len") {
            let value = codec::parse_int(arg(pair + 1));
            set = Some(value.and_then(|n| u64::try_from(n).ok()));
        }
    }
    set
}

/// A multi-key command Redis semantics allow to split by slot (MGET, MSET, DEL, UNLINK,
/// EXISTS, TOUCH; XREAD without BLOCK, one per stream), as one sub-command per slot grouped by
/// node, or a read answered from its keys' contents (SUNION, SINTER, SDIFF, SINTERCARD, ZUNION, ZINTER, ZDIFF, ZINTERCARD,
/// PFCOUNT: `gather_members`); `None` for any other command (it gets CROSSSLOT), or when a
/// slot has no owner or the policy's rewrite cannot be split. ZUNION and ZINTER only when
/// `doubles` says how the upstream reads and writes their scores (`Session::doubles`).
pub(super) fn split(
    router: &Router,
    args: &Args<'_>,
    rewrite: Option<&crate::policy::rewrite::Rewrite>,
    doubles: Option<ServerDoubles>,
    blocking: Option<ReplyWait>,
) -> Option<Action> {
    let argv = decided_argv(args, rewrite)?;
    let strip = rewrite.and_then(|r| r.strip.clone());
    if let Some(streams) = xread(&argv) {
        // A read has no hidden commands to place; one it had would be dropped here. BLOCK
        // is gathered only where the caller said it may block (`blocking`: not in MULTI,
        // where Redis reads without blocking and the transaction's node takes it whole).
        if rewrite.is_some_and(|r| !r.after.is_empty())
            || (streams.block.is_some() && blocking.is_none())
        {
            return None;
        }
        return read_streams(router, &argv, streams, strip, blocking);
    }
    // No other split or gathered reply names keys: a namespace to strip is not expected.
    if strip.is_some() {
        return None;
    }
    if let Some((join, keys)) = set_command(&argv, doubles) {
        // A read has no hidden commands to place; one it had would be dropped here.
        if rewrite.is_some_and(|r| !r.after.is_empty()) {
            return None;
        }
        return gather_members(router, &argv[keys], join);
    }
    let name = argv[0];
    let (join, step) = split_join(name)?;
    if argv.len() < 2 || (argv.len() - 1) % step != 0 {
        return None;
    }
    let snapshot = router.snapshot();
    let mut batches: Vec<NodeBatch> = Vec::new();
    // Every `step`-th argument is a key.
    let keys = argv[1..].iter().step_by(step).copied();
    for (s, positions) in slots_in_order(router, keys) {
        let b = batch_for(&mut batches, snapshot.owner(s)?);
        b.bytes
            .extend_from_slice(&sub_command(&argv, step, &positions));
        b.parts.push(positions);
    }
    // The policy's hidden commands (a TTL per key after MSET) go to their own key's node,
    // after that node's sub-commands.
    for hidden in rewrite.map_or(&[][..], |r| &r.after[..]) {
        let mut ranges = Vec::new();
        let Ok(Some(Decoded::Command { .. })) =
            codec::decode(hidden, &CodecLimits::default(), &mut ranges)
        else {
            return None;
        };
        let key = &hidden[ranges.get(1)?.clone()];
        let b = batch_for(&mut batches, snapshot.owner(router.slot_of(key))?);
        b.bytes.extend_from_slice(hidden);
        b.hidden += 1;
    }
    Some(Action::Gather(Box::new(Gather::Split(Split {
        batches,
        join,
        keys: (argv.len() - 1) / step,
        strip: None,
        then_block: None,
    }))))
}

/// A command's arguments as decided: the policy's rewrite of it when it has one, else the
/// client's; `None` when the rewrite does more than replace the command (appends to it,
/// sends a command before it), which a split or gathered command cannot carry. Hidden
/// commands after it (`Rewrite::after`) and a namespace to strip from the reply
/// (`Rewrite::strip`) are the caller's.
pub(super) fn decided_argv<'a>(
    args: &'a Args<'_>,
    rewrite: Option<&'a crate::policy::rewrite::Rewrite>,
) -> Option<Vec<&'a [u8]>> {
    if rewrite.is_some_and(|r| r.append.is_some() || r.before.is_some()) {
        return None;
    }
    let mut ranges = Vec::new();
    Some(match rewrite.and_then(|r| r.command.as_ref()) {
        Some(frame) => match codec::decode(frame, &CodecLimits::default(), &mut ranges) {
            Ok(Some(Decoded::Command { .. })) => ranges.iter().map(|r| &frame[r.clone()]).collect(),
            _ => return None,
        },
        None => args.iter().collect(),
    })
}

/// Where an XREAD's parts are, as `xreadCommand` reads them (see `xread`).
#[derive(Debug, PartialEq, Eq)]
struct XreadShape {
    /// The last COUNT's value (the one that counts).
    count: Option<usize>,
    /// The last BLOCK's value, a timeout Redis accepts (an integer, not negative).
    block: Option<usize>,
    /// The stream names; their ids follow them.
    keys: std::ops::Range<usize>,
}

/// XREAD as `xreadCommand` reads it: its last COUNT and BLOCK (each value checked as Redis
/// checks it) and where its keys are; `None` for any other command, or with arguments Redis
/// would refuse (the command then gets CROSSSLOT, as Redis Cluster checks the slots before
/// the arguments).
fn xread(argv: &[&[u8]]) -> Option<XreadShape> {
    if !argv.first()?.eq_ignore_ascii_case(b"XREAD") {
        return None;
    }
    let options = crate::commands::grammar::xread_options(argv, false)?;
    let first = options.streams?;
    let mut count = None;
    for (i, a) in argv.iter().enumerate().take(first).skip(1) {
        if keyword(a, b"COUNT") && i + 1 < first {
            codec::parse_int(argv[i + 1])?;
            count = Some(i + 1);
        }
    }
    if let Some(b) = options.block
        && codec::parse_int(argv[b])? < 0
    {
        return None;
    }
    let n = argv.len() - first;
    (n > 0 && n % 2 == 0).then_some(XreadShape {
        count,
        block: options.block,
        keys: first..first + n / 2,
    })
}

/// XREAD of streams in several slots: one `XREAD [COUNT n] STREAMS key id` per stream, grouped
/// by node, the streams that have entries put back in the client's order (`Join::Streams`),
/// a namespaced tenant's prefix removed from their names (`strip`). With BLOCK (`blocking`,
/// its wait), that read does not block; if it finds nothing, one `XREAD [COUNT n] BLOCK ms
/// STREAMS …` per slot blocks (`then_block`).
fn read_streams(
    router: &Router,
    argv: &[&[u8]],
    shape: XreadShape,
    strip: Option<Box<Strip>>,
    blocking: Option<ReplyWait>,
) -> Option<Action> {
    let XreadShape { count, block, keys } = shape;
    let then_block = match (block, blocking) {
        (Some(b), Some(wait)) => Some(Box::new(blocking_groups(
            router, argv, count, b, &keys, wait,
        )?)),
        _ => None,
    };
    let snapshot = router.snapshot();
    let mut batches: Vec<NodeBatch> = Vec::new();
    let n = keys.len();
    for (position, k) in keys.enumerate() {
        let b = batch_for(&mut batches, snapshot.owner(router.slot_of(argv[k]))?);
        let mut sub: Vec<&[u8]> = vec![argv[0]];
        if let Some(c) = count {
            sub.extend([argv[c - 1], argv[c]]);
        }
        sub.extend([argv[k - position - 1], argv[k], argv[k + n]]);
        b.bytes.extend_from_slice(&codec::encode(&sub));
        b.parts.push(vec![position]);
    }
    Some(Action::Gather(Box::new(Gather::Split(Split {
        batches,
        join: Join::Streams,
        keys: n,
        strip,
        then_block,
    }))))
}

/// The blocking half of an XREAD … BLOCK of streams in several slots: one `XREAD [COUNT n]
/// BLOCK ms STREAMS key… id…` per slot (a node refuses keys of two slots in one command),
/// the streams in the client's order within it; `None` when a slot has no owner.
fn blocking_groups(
    router: &Router,
    argv: &[&[u8]],
    count: Option<usize>,
    block: usize,
    keys: &std::ops::Range<usize>,
    wait: ReplyWait,
) -> Option<BlockingRead> {
    let snapshot = router.snapshot();
    let n = keys.len();
    let slots = slots_in_order(router, argv[keys.clone()].iter().copied());
    if slots.len() > MAX_BLOCKING_SLOTS {
        return None;
    }
    let mut groups = Vec::with_capacity(slots.len());
    for (slot, ks) in slots {
        let mut sub: Vec<&[u8]> = vec![argv[0]];
        if let Some(c) = count {
            sub.extend([argv[c - 1], argv[c]]);
        }
        sub.extend([argv[block - 1], argv[block], argv[keys.start - 1]]);
        // Positions in the keys: each stream's id is `n` arguments after it.
        sub.extend(ks.iter().map(|&p| argv[keys.start + p]));
        sub.extend(ks.iter().map(|&p| argv[keys.start + p + n]));
        groups.push((snapshot.owner(slot)?, codec::encode(&sub)));
    }
    Some(BlockingRead { groups, wait })
}

/// A read whose keys the proxy gathers across slots (SUNION, SINTER, SDIFF, SINTERCARD,
/// ZUNION, ZINTER, ZDIFF, ZINTERCARD, PFCOUNT), how its keys' contents are combined, and
/// where its keys are in `argv`; `None` for any other command, and for arguments Redis
/// would refuse (the command then gets CROSSSLOT, as Redis Cluster checks the slots before
/// the arguments).
fn set_command(
    argv: &[&[u8]],
    doubles: Option<ServerDoubles>,
) -> Option<(Join, std::ops::Range<usize>)> {
    let name = argv.first()?;
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    let op = if is(b"SUNION") {
        SetOp::Union
    } else if is(b"SINTER") {
        SetOp::Inter
    } else if is(b"SDIFF") {
        SetOp::Diff
    } else if is(b"SINTERCARD") {
        let (limit, keys) = intercard(argv)?;
        return Some((Join::Sets(SetOp::InterCard(limit)), keys));
    } else if is(b"ZINTERCARD") {
        let (limit, keys) = intercard(argv)?;
        return Some((Join::Sorted(ZOp::InterCard(limit)), keys));
    } else if is(b"ZDIFF") {
        return zdiff(argv);
    } else if is(b"ZUNION") || is(b"ZINTER") {
        return zcombine(argv, is(b"ZUNION"), doubles?);
    } else if is(b"PFCOUNT") {
        return (argv.len() > 1).then_some((Join::HllCount, 1..argv.len()));
    } else {
        return None;
    };
    (argv.len() > 1).then_some((Join::Sets(op), 1..argv.len()))
}

/// Where the keys of a `numkeys key [key …] …` command are, when Redis would accept
/// numkeys (from 1 to the arguments left), and the arguments after them.
fn numkeys<'a, 'b>(argv: &'a [&'b [u8]]) -> Option<(std::ops::Range<usize>, &'a [&'b [u8]])> {
    let numkeys = usize::try_from(codec::parse_int(argv.get(1)?)?).ok()?;
    if numkeys == 0 || numkeys > argv.len() - 2 {
        return None;
    }
    Some((2..2 + numkeys, &argv[2 + numkeys..]))
}

/// SINTERCARD or ZINTERCARD numkeys key [key …] [LIMIT limit]: its limit (0: none) and where
/// its keys are, when Redis would accept the arguments (LIMIT not negative; it may be given
/// again, the last one counts).
fn intercard(argv: &[&[u8]]) -> Option<(u64, std::ops::Range<usize>)> {
    let (keys, options) = numkeys(argv)?;
    let mut limit = 0;
    for option in options.chunks(2) {
        match option {
            [name, value] if keyword(name, b"LIMIT") => {
                limit = u64::try_from(codec::parse_int(value)?).ok()?;
            }
            _ => return None,
        }
    }
    Some((limit, keys))
}

/// ZDIFF numkeys key [key …] [WITHSCORES] (the option may be repeated, as Redis allows).
fn zdiff(argv: &[&[u8]]) -> Option<(Join, std::ops::Range<usize>)> {
    let (keys, options) = numkeys(argv)?;
    if !options.iter().all(|o| keyword(o, b"WITHSCORES")) {
        return None;
    }
    let scores = !options.is_empty();
    Some((Join::Sorted(ZOp::Diff { scores }), keys))
}

/// ZUNION (`union`) or ZINTER numkeys key [key …] [WEIGHTS w …] [AGGREGATE SUM|MIN|MAX]
/// [WITHSCORES], its options as Redis 7.0 takes them (`Combine::parse`).
fn zcombine(
    argv: &[&[u8]],
    union: bool,
    doubles: ServerDoubles,
) -> Option<(Join, std::ops::Range<usize>)> {
    let (keys, options) = numkeys(argv)?;
    let combine = Combine::parse(options, keys.len(), doubles)?;
    let op = if union {
        ZOp::Union(combine)
    } else {
        ZOp::Inter(combine)
    };
    Some((Join::Sorted(op), keys))
}

/// A gathered read: for each distinct key of `keys`, `SMEMBERS` (a set command),
/// `ZRANGE key 0 -1` then `SMEMBERS` (a sorted-set command, which takes sets too: one of the
/// two answers WRONGTYPE, the other is the key's) or `GET` (PFCOUNT: the HyperLogLog's
/// bytes), grouped by node, combined by `join` once all are in; `None` when a slot has no
/// owner.
fn gather_members(router: &Router, keys: &[&[u8]], join: Join) -> Option<Action> {
    let snapshot = router.snapshot();
    // Each distinct key once, with its positions among the command's keys.
    let mut distinct: Vec<(&[u8], Vec<usize>)> = Vec::new();
    for (position, &key) in keys.iter().enumerate() {
        match distinct.iter_mut().find(|(k, _)| *k == key) {
            Some((_, positions)) => positions.push(position),
            None => distinct.push((key, vec![position])),
        }
    }
    let mut batches: Vec<NodeBatch> = Vec::new();
    for (key, positions) in distinct {
        let b = batch_for(&mut batches, snapshot.owner(router.slot_of(key))?);
        if join == Join::HllCount {
            b.bytes.extend_from_slice(&codec::encode(&[b"GET", key]));
            b.parts.push(positions);
        } else if let Join::Sorted(op) = &join {
            let range: [&[u8]; 4] = [b"ZRANGE", key, b"0", b"-1"];
            let with_scores = [&range[..], &[b"WITHSCORES"]].concat();
            let zrange = if op.scores() {
                &with_scores[..]
            } else {
                &range[..]
            };
            b.bytes.extend_from_slice(&codec::encode(zrange));
            // SMEMBERS's reply stands at the key's positions past the keys (`merge::Join`).
            let shifted = positions.iter().map(|p| p + keys.len()).collect();
            b.bytes
                .extend_from_slice(&codec::encode(&[b"SMEMBERS", key]));
            b.parts.push(positions);
            b.parts.push(shifted);
        } else {
            b.bytes
                .extend_from_slice(&codec::encode(&[b"SMEMBERS", key]));
            b.parts.push(positions);
        }
    }
    Some(Action::Gather(Box::new(Gather::Split(Split {
        batches,
        join,
        keys: keys.len(),
        strip: None,
        then_block: None,
    }))))
}

/// How a splittable command's parts are joined, and how many arguments make one key's
/// share of it (MSET's key and value); `None` for a command that cannot be split.
fn split_join(name: &[u8]) -> Option<(Join, usize)> {
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    if is(b"MGET") {
        Some((Join::Values, 1))
    } else if is(b"MSET") {
        Some((Join::AllOk, 2))
    } else if is(b"DEL") || is(b"UNLINK") || is(b"EXISTS") || is(b"TOUCH") {
        Some((Join::Sum, 1))
    } else {
        None
    }
}

/// The slots of `keys`, in the order they first appear, each with the positions (in `keys`)
/// of its keys: one sub-command per slot.
fn slots_in_order<'a>(
    router: &Router,
    keys: impl Iterator<Item = &'a [u8]>,
) -> Vec<(u16, Vec<usize>)> {
    let mut by_slot: Vec<(u16, Vec<usize>)> = Vec::new();
    for (position, key) in keys.enumerate() {
        let s = router.slot_of(key);
        match by_slot.iter_mut().find(|(slot, _)| *slot == s) {
            Some((_, positions)) => positions.push(position),
            None => by_slot.push((s, vec![position])),
        }
    }
    by_slot
}

/// The encoded sub-command of `argv` (its name, then `step` arguments per key) for the
/// keys at `positions`.
fn sub_command(argv: &[&[u8]], step: usize, positions: &[usize]) -> Bytes {
    let mut sub: Vec<&[u8]> = Vec::with_capacity(1 + positions.len() * step);
    sub.push(argv[0]);
    for &p in positions {
        let i = 1 + p * step;
        sub.extend_from_slice(&argv[i..i + step]);
    }
    codec::encode(&sub)
}

/// The batch for `node` among a split command's, added empty if it has none yet: one batch
/// per node, however many slots of it the keys are in.
fn batch_for(batches: &mut Vec<NodeBatch>, node: u16) -> &mut NodeBatch {
    let i = match batches.iter().position(|b| b.node == node) {
        Some(i) => i,
        None => {
            batches.push(NodeBatch {
                node,
                bytes: BytesMut::new(),
                parts: Vec::new(),
                hidden: 0,
            });
            batches.len() - 1
        }
    };
    &mut batches[i]
}

/// A number that differs at every call: where RANDOMKEY starts looking (`Merge::FirstNonNil`).
/// A seed per client would ask the same node first every time, so a client would never see
/// a key of the later nodes while that one holds any (Redis's suite calls RANDOMKEY until it
/// has seen both of two keys). Each `RandomState` is keyed anew (std's SipHash keys), which
/// is enough spread for picking a node and needs no random-number package.
fn varying_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}

#[cfg(test)]
mod tests {
    use super::{sets_slowlog_max_len, xread};

    #[test]
    fn config_set_of_the_slowlog_length_is_read_as_redis_reads_it() {
        let of = |line: &str| {
            let argv: Vec<&str> = line.split(' ').collect();
            sets_slowlog_max_len(&argv[..])
        };
        assert_eq!(of("CONFIG SET slowlog-max-len 10"), Some(Some(10)));
        assert_eq!(
            of("config set SLOWLOG-MAX-LEN 3 maxmemory 0 slowlog-max-len 7"),
            Some(Some(7))
        );
        assert_eq!(of("CONFIG SET slowlog-max-len 1kb"), Some(None));
        assert_eq!(of("CONFIG SET slowlog-max-len -1"), Some(None));
        assert_eq!(of("CONFIG SET maxmemory 0"), None);
        assert_eq!(of("CONFIG SET slowlog-max-len"), None);
        assert_eq!(of("CONFIG GET slowlog-max-len"), None);
        assert_eq!(of("DBSIZE"), None);
    }

    fn of(line: &str) -> Option<(Option<usize>, Option<usize>, std::ops::Range<usize>)> {
        let argv: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        xread(&argv).map(|x| (x.count, x.block, x.keys))
    }

    #[test]
    fn xread_is_read_as_xread_command_reads_it() {
        assert_eq!(of("XREAD STREAMS a b 0 0"), Some((None, None, 2..4)));
        // The last COUNT counts; each must be a number.
        assert_eq!(
            of("xread count 1 COUNT 5 streams a b 0 0"),
            Some((Some(4), None, 6..8))
        );
        assert_eq!(of("XREAD COUNT x COUNT 5 STREAMS a b 0 0"), None);
        // Keywords as stream names, and NUL-suffixed keywords as strcasecmp reads them.
        assert_eq!(
            of("XREAD COUNT 1 STREAMS COUNT STREAMS 0 0"),
            Some((Some(2), None, 4..6))
        );
        assert_eq!(
            of("XREAD COUNT\0 1 STREAMS\0x a b 0 0"),
            Some((Some(2), None, 4..6))
        );
        // BLOCK anywhere before STREAMS, the last one counting; a timeout Redis refuses (not
        // an integer, negative) and an odd count of keys and ids: refused.
        assert_eq!(
            of("XREAD COUNT 1 BLOCK 0 STREAMS a b 0 0"),
            Some((Some(2), Some(4), 6..8))
        );
        assert_eq!(
            of("XREAD block\0 10 BLOCK 20 STREAMS a b 0 0"),
            Some((None, Some(4), 6..8))
        );
        assert_eq!(of("XREAD BLOCK -1 STREAMS a b 0 0"), None);
        assert_eq!(of("XREAD BLOCK 1.5 STREAMS a b 0 0"), None);
        assert_eq!(of("XREAD STREAMS a b 0"), None);
        assert_eq!(of("XREADGROUP GROUP g c STREAMS a b > >"), None);
    }
}
