//! Cluster mode: which node a command goes to, what the proxy answers itself because a
//! cluster cannot do it like one Redis, following MOVED/ASK, and whole-keyspace commands sent
//! to every primary. Nothing here runs for a standalone upstream (the session's `Routing` is
//! not `Cluster`, and `decide`/`serve` skip it).

use super::route::Args;
use super::{
    Action, Decision, Dedicated, Effect, Holds, LocalEffect, PUSH_BUDGET, Sent, Session, Slot,
    Target, WAIT_BARRIER,
};
use crate::codec::split_commands;
use crate::codec::{CodecLimits, Decoded};
use crate::commands::{CommandSpec, KeyPositions};
use crate::config::ReadFrom;
use crate::error::{ProxyError, UpstreamError, error_reply};
use crate::policy::rewrite::Strip;
use crate::upstream::conn::PushTarget;
use crate::upstream::{Batch, Expect, Reply, ReplyWait};
use crate::{answers, codec};
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use tokio::sync::mpsc;

use crate::cluster::{Redirect, Router, slot};

pub(super) mod shard_subs;
mod subscriber;
mod transaction;

pub(super) use transaction::{InTransaction, TxLog};

/// How the replies of a command sent to every primary become one reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Merge {
    /// Integer replies added up (DBSIZE).
    Sum,
    /// Array replies concatenated (KEYS).
    Concat,
    /// The first error, else the first reply (FLUSHALL, FLUSHDB).
    AllOk,
    /// The first non-nil reply, starting from a node that varies (RANDOMKEY).
    FirstNonNil,
    /// WAIT/WAITAOF: the smallest count (element-wise for WAITAOF's pair): the replicas (or
    /// fsyncs) every node the client may have written to has reached.
    Min,
    /// INFO: one node's text, with `# Keyspace` counts summed over the primaries and
    /// `cluster_enabled:0` (to its clients the proxy is one server).
    Info,
}

/// A cluster command the session answers itself, after every earlier command has run:
/// from several nodes (their replies gathered into one), or from its own state.
pub(super) enum Gather {
    /// A whole-keyspace command sent to every primary, the replies merged.
    Fanout(Fanout),
    /// A multi-key command split by slot, the parts' replies joined.
    Split(Split),
    /// One step of a SCAN over every primary.
    Scan(Scan),
    /// SSUBSCRIBE/SUNSUBSCRIBE, answered over the per-node pub/sub connections (see
    /// `shard_subs`).
    ShardPubSub(shard_subs::ShardCommand),
}

/// A whole-keyspace command to send to every primary.
pub(super) struct Fanout {
    /// The command as it is sent (after the policy's rewrite).
    bytes: Bytes,
    /// How the replies are combined.
    merge: Merge,
    /// The namespace prefix to strip from the merged reply (a namespaced tenant's KEYS).
    strip: Option<Box<Strip>>,
    /// INFO with the default sections: the proxy's own section is appended.
    proxy_section: bool,
    /// WAIT/WAITAOF: each node gets it on a connection of its own (it blocks) after the
    /// `WAIT_BARRIER`, whose reply is dropped.
    blocking: bool,
    /// How long WAIT may block (its own timeout), so the command timeout leaves it be.
    wait: ReplyWait,
}

/// Commands of classic (not sharded) pub/sub, which all go to `Router::pubsub_node`.
const CLASSIC_PUBSUB: [&str; 3] = ["subscribe", "psubscribe", "publish"];

/// How the replies of a multi-key command split by slot become the client's one reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Join {
    /// MGET: the values put back in the client's key order.
    Values,
    /// MSET: `+OK` when every part says so, else the first error.
    AllOk,
    /// DEL, UNLINK, EXISTS, TOUCH: the counts added up.
    Sum,
}

/// Bits of a composite SCAN cursor holding the node's own cursor; the bits above hold the
/// index of the primary (ordered by address). A node's cursor is a reverse-binary bucket
/// index, far below 2^48 for any real table.
const NODE_CURSOR_BITS: u32 = 48;
/// The node cursor's part of a composite cursor.
const NODE_CURSOR_MASK: u64 = (1 << NODE_CURSOR_BITS) - 1;

/// One SCAN call across the cluster's primaries.
pub(super) struct Scan {
    /// The client's composite cursor.
    cursor: u64,
    /// MATCH/COUNT/TYPE as sent (MATCH already namespaced by the policy).
    options: Vec<Bytes>,
    /// The tenant's namespace prefix, removed from the returned names.
    strip: Option<Box<Strip>>,
}

/// A multi-key command whose keys are in several slots, as one sub-command per slot.
pub(super) struct Split {
    /// Per node: the batch sent there (its sub-commands, then the policy's hidden commands
    /// for its keys) and, per sub-command, the positions of its keys in the client's command.
    batches: Vec<NodeBatch>,
    /// How the parts' replies are joined.
    join: Join,
    /// Keys in the client's command (MGET's reply length).
    keys: usize,
}

/// What one node gets of a split command.
struct NodeBatch {
    /// The node.
    node: u16,
    /// Sub-commands followed by hidden commands, encoded.
    bytes: BytesMut,
    /// For each sub-command, the client-order positions of its keys; hidden commands come
    /// after them in the batch and their replies are dropped.
    parts: Vec<Vec<usize>>,
    /// Hidden commands in the batch.
    hidden: usize,
}

impl Session {
    /// Carries out a `Gather`: the one reply the client gets.
    pub(super) async fn gather(&mut self, gather: Gather) -> Bytes {
        match gather {
            Gather::Fanout(fanout) => self.fanout(fanout).await,
            Gather::Split(split) => self.split(split).await,
            Gather::Scan(scan) => self.scan(scan).await,
            Gather::ShardPubSub(command) => self.shard_command(command).await,
        }
    }

    /// Counts a redirection being followed in `rpp_upstream_redirections_total`.
    fn count_redirect(&self, redirect: &Redirect) {
        let metrics = &self.ctx.ops.metrics;
        match redirect {
            Redirect::Moved { .. } => metrics.redirections_moved.inc(),
            Redirect::Ask { .. } => metrics.redirections_ask.inc(),
        };
    }

    /// Cluster mode: picks the node for a forwarded command, or answers what a cluster cannot
    /// run as one Redis would (keys in several slots, cluster-only commands, SELECT n).
    /// Runs after the policy, on the command as rewritten, because a namespace prefix changes
    /// a key's slot. `spec` and `queued` (the target of the run not sent yet) decide whether
    /// a read may go to a replica.
    pub(super) fn place(
        &self,
        router: &Router,
        action: Action,
        args: &Args<'_>,
        spec: Option<&'static CommandSpec>,
        queued: Option<Target>,
    ) -> Decision {
        if let Some(answer) = self.shard_route(&action, args) {
            return answer.into();
        }
        let Some((target, effect, rewrite)) = action.forwarded() else {
            return action.into();
        };
        if let Some(answer) = self.cluster_command(args, effect, rewrite) {
            return answer.into();
        }
        let rewritten = rewrite.and_then(|r| r.command.as_ref());
        let slot = match self.key_slot(router, args, rewritten) {
            Ok(slot) => slot,
            Err((a, b)) => {
                if !self.conn.in_multi() && matches!(target, Target::Shared(..)) {
                    if let Some(split) = split(router, args, rewrite) {
                        return split.into();
                    }
                }
                return Action::Refused(cross(router, a, b)).into();
            }
        };
        Decision {
            action: self.place_on_node(router, action, slot, spec, queued),
            hash_slot: slot,
        }
    }

    /// The node a forwarded command whose keys hash to `slot` (`None`: keyless) goes to, and
    /// through which connection; or the refusal when the session's state forbids it.
    fn place_on_node(
        &self,
        router: &Router,
        action: Action,
        slot: Option<u16>,
        spec: Option<&'static CommandSpec>,
        queued: Option<Target>,
    ) -> Action {
        let Some((target, _, rewrite)) = action.forwarded() else {
            return action;
        };
        let multi_slot = self.routing.cluster().and_then(|c| c.multi_slot);
        let snapshot = router.snapshot();
        let node = match slot {
            Some(s) => snapshot.owner(s),
            // Keyless: stay where the session already is, so it need not wait for a switch.
            None => match (target, self.queue.inflight_target, &self.conn.dedicated) {
                (Target::Dedicated(_), _, Some(d)) => Some(d.node),
                // Not on a replica, though: a keyless command may write (EVAL with no keys).
                (Target::Shared(..), Some(Target::Shared(_, n)), _)
                    if router.read_from() == ReadFrom::Primary || snapshot.is_primary(n) =>
                {
                    Some(n)
                }
                _ if spec.is_some_and(|s| CLASSIC_PUBSUB.contains(&s.name)) => router.pubsub_node(),
                _ => router.home(self.client.id),
            },
        };
        let Some(node) = node else {
            router.refresh_soon();
            return Action::Refused(answers::clusterdown());
        };
        let target = match target {
            Target::Shared(proto, _) => {
                let replica = match slot {
                    // A slot with commands in flight (on its primary) is read there too: the
                    // read must see them, and elsewhere it would wait for them.
                    Some(s)
                        if !self
                            .routing
                            .cluster()
                            .is_some_and(|c| c.spread.in_flight(s))
                            && self
                                .may_read_replica(router, spec, rewrite, queued, proto, node) =>
                    {
                        router.read_node(&snapshot, s, proto, self.client.id)
                    }
                    _ => None,
                };
                Target::Shared(proto, replica.unwrap_or(node))
            }
            Target::Dedicated(_) => match self.conn.dedicated.as_ref().filter(|_| self.pinned()) {
                // A transaction's keys must share one slot (Redis answers EXEC with CROSSSLOT
                // otherwise): refused while queuing, so EXEC aborts and nothing runs.
                _ if self.conn.in_multi()
                    && slot.is_some()
                    && ![None, slot].contains(&multi_slot) =>
                {
                    return Action::Refused(cross(router, multi_slot, slot));
                }
                // The transaction's slot stays with the node holding the transaction even
                // when the map says it moved: that node answers with a redirection, and EXEC
                // replays the whole transaction on the new owner (`transaction`).
                Some(d) if self.conn.in_multi() && slot.is_some() && slot == multi_slot => {
                    Target::Dedicated(d.node)
                }
                // A pinned session's state lives on one node; a key elsewhere cannot join it.
                Some(d) if slot.is_some() && d.node != node => {
                    return Action::Refused(cross_nodes(router, d.node, node));
                }
                Some(d) => Target::Dedicated(d.node),
                None => Target::Dedicated(node),
            },
        };
        action.retarget(target)
    }

    /// Whether a command for the shared connection may be served by a replica of its slot's
    /// shard (`primary` is the slot's primary). Only plain reads qualify: read-only in the
    /// command table, not blocking, not a script (scripts are loaded on primaries only, so
    /// EVALSHA_RO would loop on NOSCRIPT), without hidden commands from the policy, and never
    /// inside MULTI (a transaction runs on the primary) — pinned sessions do not use the
    /// shared connection at all. A read that follows commands still queued or in flight on
    /// its primary stays with them: a pipelined write then read of one key reads the write,
    /// and the session does not pause to switch nodes.
    fn may_read_replica(
        &self,
        router: &Router,
        spec: Option<&'static CommandSpec>,
        rewrite: Option<&crate::policy::rewrite::Rewrite>,
        queued: Option<Target>,
        proto: u8,
        primary: u16,
    ) -> bool {
        router.read_from() != ReadFrom::Primary
            && self.replica_may_serve(spec, rewrite, queued, Target::Shared(proto, primary))
    }

    /// Commands a cluster cannot take as they are: `Some(answer)` for those.
    fn cluster_command(
        &self,
        args: &Args<'_>,
        effect: Effect,
        rewrite: Option<&crate::policy::rewrite::Rewrite>,
    ) -> Option<Action> {
        if let Some(answer) = self.transaction_answer(args, effect) {
            return Some(answer);
        }
        if let Some(answer) = self.cluster_only_answer(args, rewrite) {
            return Some(answer);
        }
        let merge = self.fanout_merge(args, effect)?;
        Some(self.fanout_action(args, effect, rewrite, merge))
    }

    /// What the session answers itself about its own state before anything reaches a node:
    /// SELECT n, and MULTI (answered here, sent later with the first queued command, whose
    /// keys name the node) with the EXEC/DISCARD of a transaction that never reached one.
    fn transaction_answer(&self, args: &Args<'_>, effect: Effect) -> Option<Action> {
        match effect {
            Effect::Select(db) if db != 0 => Some(Action::Local(
                match self.routing.router().and_then(|r| r.routes()) {
                    Some(_) => answers::select_with_routes(),
                    None => answers::select_in_cluster(),
                },
                LocalEffect::None,
            )),
            Effect::Multi if !self.conn.in_multi() => {
                Some(Action::Local(answers::ok(), LocalEffect::DeferMulti))
            }
            Effect::Multi if self.conn.multi_deferred() => {
                Some(Action::Local(answers::nested_multi(), LocalEffect::None))
            }
            // With a WATCH on the connection, EXEC must run there even with nothing queued:
            // a watched key that changed makes it answer nil.
            Effect::EndMulti | Effect::AbortExec
                if self.conn.multi_deferred() && !self.conn.holds(Holds::WATCH) =>
            {
                Some(Action::Local(
                    self.unsent_transaction_end(args),
                    LocalEffect::EndMulti,
                ))
            }
            _ => None,
        }
    }

    /// The reply to EXEC or DISCARD ending a deferred MULTI that queued nothing upstream:
    /// Redis's own answers for an empty (or refused) transaction.
    fn unsent_transaction_end(&self, args: &Args<'_>) -> Bytes {
        let exec = args.get(0).eq_ignore_ascii_case(b"EXEC");
        if !exec {
            answers::ok()
        } else if self.conn.multi_refused() {
            answers::execabort()
        } else {
            answers::empty_array()
        }
    }

    /// Commands about the cluster itself, which the proxy hides (to its clients it is one
    /// server), and SCAN, which walks every primary with a composite cursor.
    fn cluster_only_answer(
        &self,
        args: &Args<'_>,
        rewrite: Option<&crate::policy::rewrite::Rewrite>,
    ) -> Option<Action> {
        let name = args.get(0);
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        let routes = self.routing.router().is_some_and(|r| r.routes().is_some());
        if is("CLUSTER") {
            // Routes front standalone servers, which answer every CLUSTER command so.
            if args.len() == 3 && args.get(1).eq_ignore_ascii_case(b"KEYSLOT") && !routes {
                let reply = answers::integer(i64::from(slot(args.get(2))));
                return Some(Action::Local(reply, LocalEffect::None));
            }
            return Some(Action::Local(
                answers::cluster_disabled(),
                LocalEffect::None,
            ));
        }
        if is("READONLY") || is("READWRITE") || is("ASKING") {
            return Some(Action::Local(
                answers::cluster_disabled(),
                LocalEffect::None,
            ));
        }
        if is("SCAN") {
            return Some(self.decide_scan(args, rewrite));
        }
        None
    }

    /// How the replies of a whole-keyspace command sent to every primary are merged; `None`
    /// for a command that goes to one node (and WAIT in a pinned session, which runs there).
    fn fanout_merge(&self, args: &Args<'_>, effect: Effect) -> Option<Merge> {
        let name = args.get(0);
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        let sub_in = |subs: &[&[u8]]| {
            args.len() > 1 && subs.iter().any(|sub| args.get(1).eq_ignore_ascii_case(sub))
        };
        if matches!(effect, Effect::Wait(_)) {
            // A transaction or WATCH holds the session on one node: WAIT runs there.
            return (!self.pinned()).then_some(Merge::Min);
        }
        if is("INFO") {
            Some(Merge::Info)
        } else if is("DBSIZE") {
            Some(Merge::Sum)
        } else if is("KEYS") {
            Some(Merge::Concat)
        } else if is("FLUSHALL") || is("FLUSHDB") {
            Some(Merge::AllOk)
        } else if is("CONFIG") && sub_in(&[b"SET", b"RESETSTAT", b"REWRITE"]) {
            // To its clients the proxy is one server: a setting changed through it applies
            // to the whole keyspace, so to every primary (CONFIG GET reads the home node's).
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
        } else {
            None
        }
    }

    /// The fan-out of a whole-keyspace command, merged as `merge` says; refused inside MULTI.
    fn fanout_action(
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
        let bytes = match rewrite.and_then(|r| r.command.clone()) {
            Some(command) => command,
            None => crate::codec::encode(&args.iter().collect::<Vec<_>>()),
        };
        Action::Gather(Box::new(Gather::Fanout(Fanout {
            bytes,
            merge,
            strip: rewrite.and_then(|r| r.strip.clone()),
            proxy_section: effect == Effect::Info,
            blocking: merge == Merge::Min,
            wait: match effect {
                Effect::Wait(wait) => wait,
                _ => ReplyWait::Prompt,
            },
        })))
    }

    /// SCAN over every primary with a composite cursor (see [`Scan`]).
    fn decide_scan(
        &self,
        args: &Args<'_>,
        rewrite: Option<&crate::policy::rewrite::Rewrite>,
    ) -> Action {
        if self.conn.in_multi() {
            return Action::Refused(answers::fanout_in_multi(b"SCAN"));
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

    /// Runs one step of a cluster SCAN: the node the cursor names, with the node's own
    /// cursor; the reply's cursor is made composite again.
    pub(super) async fn scan(&mut self, scan: Scan) -> Bytes {
        let Some(router) = self.routing.router().cloned() else {
            return answers::cluster_disabled();
        };
        // Ordered by address: stable across refreshes that keep the same primaries.
        let mut primaries: Vec<(Arc<str>, u16)> = router
            .snapshot()
            .primaries()
            .iter()
            .map(|&n| (router.addr(n), n))
            .collect();
        primaries.sort();
        primaries.dedup();
        let shard = (scan.cursor >> NODE_CURSOR_BITS) as usize;
        let node_cursor = scan.cursor & NODE_CURSOR_MASK;
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
        let composite = match scan_reply_cursor(&reply) {
            Err(()) if reply.first() == Some(&b'-') => return reply,
            Err(()) => return unexpected(&reply),
            Ok((0, _)) if shard + 1 < primaries.len() => ((shard + 1) as u64) << NODE_CURSOR_BITS,
            Ok((0, _)) => 0,
            Ok((c, _)) if c > NODE_CURSOR_MASK => {
                return answers::scan_cursor_too_large();
            }
            Ok((c, _)) => ((shard as u64) << NODE_CURSOR_BITS) | c,
        };
        let Ok((_, keys_at)) = scan_reply_cursor(&reply) else {
            return unexpected(&reply);
        };
        let cursor = composite.to_string();
        let mut out = BytesMut::from(format!("*2\r\n${}\r\n{cursor}\r\n", cursor.len()).as_bytes());
        out.extend_from_slice(&reply[keys_at..]);
        let out = out.freeze();
        match scan.strip {
            Some(strip) => strip.apply(&out),
            None => out,
        }
    }

    /// The one slot of the command's keys: `Ok(None)` for a command without keys (or one the
    /// table cannot read keys from: the node answers it, with MOVED followed if need be),
    /// `Err` with two of the slots when keys are in several. In routes mode a slot is a
    /// route's node, classic pub/sub channels count as keys (a channel is its route's), and
    /// the command is counted on the route of its first key.
    fn key_slot(
        &self,
        router: &Router,
        args: &Args<'_>,
        rewritten: Option<&Bytes>,
    ) -> Result<Option<u16>, (Option<u16>, Option<u16>)> {
        let mut ranges = Vec::new();
        let argv: Vec<&[u8]> = match rewritten {
            Some(frame) => match codec::decode(frame, &self.ctx.codec, &mut ranges) {
                Ok(Some(Decoded::Command { .. })) => {
                    ranges.iter().map(|r| &frame[r.clone()]).collect()
                }
                _ => args.iter().collect(),
            },
            None => args.iter().collect(),
        };
        let routes = router.routes();
        let mut keys = KeyPositions::with_capacity(4);
        let channels = channel_positions(&argv, routes.is_some());
        let indices: Vec<usize> = if !channels.is_empty() {
            channels.collect()
        } else if crate::commands::keys_into(&argv, &mut keys).is_ok() {
            keys.indices().collect()
        } else {
            return Ok(None);
        };
        let mut found = None;
        for i in indices {
            let s = match routes {
                Some(table) => {
                    let key = channel_literal(argv[0], argv[i]);
                    let route = table.route_of(key);
                    if found.is_none() {
                        table.count(route);
                    }
                    router.route_slot(route, key)
                }
                None => slot(argv[i]),
            };
            match found {
                None => found = Some(s),
                Some(f) if f != s => return Err((Some(f), Some(s))),
                Some(_) => {}
            }
        }
        if found.is_none() {
            if let Some(table) = routes {
                table.count(0);
            }
        }
        Ok(found)
    }

    /// The slot of `key` as stored, as the session's router places it: its hash slot, or its
    /// route's node in routes mode.
    pub(super) fn key_place(&self, key: &[u8]) -> u16 {
        match self.routing.router() {
            Some(router) => router.slot_of(key),
            None => slot(key),
        }
    }

    /// The refusal of keys placed in `a` and `b` (see [`cross`]).
    pub(super) fn cross_places(&self, a: u16, b: u16) -> Bytes {
        match self.routing.router() {
            Some(router) => cross(router, Some(a), Some(b)),
            None => answers::crossslot(),
        }
    }

    /// The cluster batch the reply with this `seq` answers, as it was sent.
    pub(super) fn sent_of(&self, seq: u16) -> Option<&Sent> {
        match self
            .queue
            .slot_of(seq)
            .and_then(|i| self.queue.slots.get(i))
        {
            Some(Slot::Upstream {
                sent: Some(sent), ..
            }) => Some(sent),
            _ => None,
        }
    }

    /// Whether `follow_redirects` has anything to do with `msg`: every case it acts on (an
    /// event that is not a batch's reply, a failed batch, a transaction's or a dedicated
    /// connection's reply, a possible redirection). The gate that keeps an ordinary reply off
    /// the boxed path (`on_message`): a case added there must be added here.
    pub(super) fn cluster_step_due(&self, msg: &Reply) -> bool {
        let Reply::Batch {
            data, error, seq, ..
        } = msg
        else {
            return true;
        };
        error.is_some()
            || may_redirect(data)
            || self
                .sent_of(*seq)
                .is_some_and(|sent| sent.dedicated || sent.transaction != InTransaction::No)
    }

    /// Follows MOVED and ASK replies in a batch from a cluster node: each redirected command
    /// is sent again to the node named (after `ASKING` for ASK), up to `max_redirects` times,
    /// and its reply put where the redirection was. Resending is safe: a node that redirects
    /// has not run the command. Waits for the resent replies (redirections are rare and the
    /// session's later replies queue behind this one anyway).
    pub(super) async fn follow_redirects(&mut self, msg: &mut Reply) -> bool {
        let Reply::Batch { seq, .. } = *msg else {
            if let Reply::Subscriptions(id, subs) = msg {
                let subs = std::mem::take(&mut **subs);
                Box::pin(self.move_subscriber(*id, subs)).await;
                return true;
            }
            // Pushes and connection ends: shard subscriptions may need them.
            return self.shard_event(msg).await;
        };
        if let Some(how) = self
            .sent_of(seq)
            .map(|sent| sent.transaction)
            .filter(|&how| how != InTransaction::No)
        {
            Box::pin(self.transaction_reply(msg, how)).await;
            return false;
        }
        if self.sent_of(seq).is_some_and(|sent| sent.dedicated) {
            return Box::pin(self.redirect_dedicated(msg)).await;
        }
        Box::pin(self.resend_failed_replica_reads(msg)).await;
        let unsent = matches!(
            msg,
            Reply::Batch { data, error: Some(e), .. }
                if data.is_empty() && matches!(**e, UpstreamError::Unavailable { .. })
        );
        if unsent {
            // Nothing was sent (the node's connection is down): safe to route again.
            if let Some(data) = Box::pin(self.reroute_unsent(seq)).await {
                *msg = Reply::Batch {
                    data,
                    missing: 0,
                    error: None,
                    seq,
                };
            }
            return false;
        }
        let Reply::Batch {
            data, error: None, ..
        } = msg
        else {
            return false;
        };
        if !may_redirect(data) {
            return false;
        }
        let (Some(router), Some(sent)) = (self.routing.router().cloned(), self.sent_of(seq)) else {
            return false;
        };
        let (bytes, proto, from) = (sent.bytes.clone(), sent.proto, sent.node);
        let mut frames = split_frames(data);
        let commands = split_commands(&bytes, &self.ctx.codec);
        if frames.len() != commands.len() {
            return false;
        }
        let origin = router.addr(from);
        self.redirect_frames(&router, proto, &origin, &commands, &mut frames)
            .await;
        *data = frames.concat().into();
        false
    }

    /// A blocking command answered MOVED, ASK or TRYAGAIN on the dedicated connection: sent
    /// again on a dedicated connection to the node named, with the session's own reply
    /// channel, so the session keeps serving (and noticing a client that leaves) while it
    /// blocks there. `true` when resent: the reply is then not the client's yet.
    async fn redirect_dedicated(&mut self, msg: &mut Reply) -> bool {
        let Reply::Batch {
            data,
            error: None,
            seq,
            ..
        } = msg
        else {
            return false;
        };
        let seq = *seq;
        let (Some(router), Some(sent)) = (self.routing.router().cloned(), self.sent_of(seq)) else {
            return false;
        };
        let origin = router.addr(sent.node);
        // After an ASK the batch also holds ASKING's reply: the command's is the last.
        let Some(again) = split_frames(data)
            .last()
            .and_then(|frame| again_of(frame, &origin))
        else {
            return false;
        };
        if sent.redirects >= router.max_redirects() {
            if let Again::Redirect(r) = again {
                *data = too_many_redirections(&r);
                self.answer_alone(seq);
            }
            return false;
        }
        let (command, proto, wait) = (sent.bytes.clone(), sent.proto, sent.wait);
        self.note_redirect(&router, &again);
        if let Again::TryAgain(_) = again {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let node = router.node(again.addr());
        let moved = matches!(again, Again::Redirect(Redirect::Moved { .. }));
        let Some(tx) = self
            .dedicated_for_resend(&router, node, proto, moved, &command)
            .await
        else {
            return false;
        };
        let ask = again.is_ask();
        let frames: u32 = if ask { 2 } else { 1 };
        let batch = Batch {
            bytes: with_asking(command, ask),
            expect: Expect::Frames(frames),
            wait,
            reply_to: self.queue.reply_sender(),
            // The same batch, sent again: its reply goes to the same slot.
            seq,
        };
        if tx.send(batch).await.is_err() {
            return false;
        }
        self.note_resent(seq, node, frames, ask);
        true
    }

    /// Counts a redirection being followed and, for MOVED, teaches the map the slot's new
    /// owner (ASK is for one command only; TRYAGAIN is no redirection).
    fn note_redirect(&self, router: &Router, again: &Again) {
        if let Again::Redirect(r) = again {
            self.count_redirect(r);
            if let Redirect::Moved { slot, addr } = r {
                router.apply_moved(*slot, addr);
            }
        }
    }

    /// The reply slot `seq`, whose batch is answered with a too-many-redirections error, now
    /// expects that one frame: the error stands for the command alone.
    fn answer_alone(&mut self, seq: u16) {
        if let Some(Slot::Upstream {
            commands, handling, ..
        }) = self
            .queue
            .slot_of(seq)
            .and_then(|i| self.queue.slots.get_mut(i))
        {
            self.queue.inflight -= (*commands - 1) as usize;
            *commands = 1;
            handling.mask = None;
        }
    }

    /// The dedicated connection a redirected command is sent again on (see `dedicated_to`).
    /// A WATCH answered MOVED watched nothing; when it is all the session has on its
    /// connection (nothing sent after it, no other state), the watch starts over on the
    /// slot's owner instead of the client getting a redirection it cannot follow.
    async fn dedicated_for_resend(
        &mut self,
        router: &Router,
        node: u16,
        proto: u8,
        moved: bool,
        command: &Bytes,
    ) -> Option<mpsc::Sender<Batch>> {
        let lone_watch = moved
            && self.conn.holds(Holds::WATCH)
            && self.queue.inflight == 1
            && !self.conn.in_multi()
            && !self.conn.held.other_than(Holds::WATCH)
            && transaction::command_name(command, &self.ctx.codec)
                .is_some_and(|n| n.eq_ignore_ascii_case(b"WATCH"));
        if lone_watch {
            self.conn.held.remove(Holds::WATCH);
        }
        let tx = self.dedicated_to(router, node, proto).await;
        if lone_watch {
            self.conn.held.insert(Holds::WATCH);
        }
        tx
    }

    /// Records that batch `seq` was sent again to `node` as `frames` commands (`ASKING`'s
    /// reply, when `ask`, hidden from the client): the slot, the in-flight count and where
    /// the session's commands now go.
    fn note_resent(&mut self, seq: u16, node: u16, frames: u32, ask: bool) {
        if let Some(Slot::Upstream {
            commands,
            handling,
            sent: Some(sent),
            ..
        }) = self
            .queue
            .slot_of(seq)
            .and_then(|i| self.queue.slots.get_mut(i))
        {
            self.queue.inflight = self.queue.inflight + frames as usize - *commands as usize;
            *commands = frames;
            handling.mask = ask.then(|| vec![false, true]);
            sent.node = node;
            sent.redirects += 1;
        }
        self.queue.inflight_target = Some(Target::Dedicated(node));
    }

    /// The session's dedicated connection, moved to `node` if it is elsewhere; `None` when
    /// the session is pinned to its node or the connection cannot be opened.
    async fn dedicated_to(
        &mut self,
        router: &Router,
        node: u16,
        proto: u8,
    ) -> Option<mpsc::Sender<Batch>> {
        if let Some(d) = &self.conn.dedicated
            && d.node == node
            && d.proto == proto
            && !d.tx.is_closed()
        {
            return Some(d.tx.clone());
        }
        if self.pinned() {
            return None;
        }
        let push = PushTarget {
            to: self.queue.reply_sender(),
            budget: self.queue.push_budget(),
            budget_size: PUSH_BUDGET,
            conn_id: self.conn.dedicated_gen + 1,
        };
        let opened = router.pool(node).dedicated(proto, push, false).await.ok()?;
        let tx = opened.tx;
        self.conn.dedicated_gen += 1;
        // The connection it replaces was counted against the tenant: this one is now.
        let share = self.conn.dedicated.take().and_then(|d| d._share);
        self.conn.dedicated = Some(Dedicated {
            tx: tx.clone(),
            proto,
            node,
            confined: opened.confined,
            _id: None,
            _share: share,
        });
        Some(tx)
    }

    /// A batch refused because its node's connection is down (a primary failed) was never
    /// sent: after the map changes (the refresh a failure triggers learns the promoted
    /// replica), its commands are routed again by their keys. Waits at most twice the connect
    /// timeout, then gives up and the client gets the original error: no hang. `None` when
    /// the map did not change in time or the nodes failed again.
    async fn reroute_unsent(&self, seq: u16) -> Option<Bytes> {
        let router = self.routing.router().cloned()?;
        let sent = self.sent_of(seq)?;
        let (bytes, proto, from) = (sent.bytes.clone(), sent.proto, sent.node);
        let commands = split_commands(&bytes, &self.ctx.codec);
        let give_up = tokio::time::Instant::now() + router.connect_timeout().saturating_mul(2);
        let before = router.snapshot_id();
        loop {
            router.refresh_soon();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let moved = router.snapshot_id() != before;
            let nodes: Vec<u16> = commands
                .iter()
                .map(|c| node_of_command(&router, c, &self.ctx.codec))
                .collect::<Option<Vec<u16>>>()?;
            if moved && !nodes.contains(&from) {
                return self.send_routed(&router, proto, &commands, &nodes).await;
            }
            if tokio::time::Instant::now() >= give_up {
                return None;
            }
        }
    }

    /// Sends `commands[i]` to `nodes[i]`, consecutive commands for one node as one batch, in
    /// order, following redirections; the replies concatenated, or `None` if a node is down.
    pub(super) async fn send_routed(
        &self,
        router: &Router,
        proto: u8,
        commands: &[Bytes],
        nodes: &[u16],
    ) -> Option<Bytes> {
        let mut out = Vec::with_capacity(commands.len());
        let mut start = 0;
        while start < commands.len() {
            let node = nodes[start];
            let end = nodes[start..]
                .iter()
                .position(|&n| n != node)
                .map_or(commands.len(), |n| start + n);
            let group = &commands[start..end];
            start = end;
            let bytes = group.concat().into();
            let (data, None) = self
                .exchange(router, node, proto, bytes, group.len() as u32)
                .await
            else {
                return None;
            };
            let mut frames = split_frames(&data);
            if frames.len() != group.len() {
                return None;
            }
            if may_redirect(&data) {
                let origin = router.addr(node);
                self.redirect_frames(router, proto, &origin, group, &mut frames)
                    .await;
            }
            out.extend(frames);
        }
        Some(out.concat().into())
    }

    /// Sends again, to the node named, each command whose reply frame is a MOVED or ASK (after
    /// `ASKING` for ASK), up to `max_redirects` times, and puts the new replies in place.
    /// `commands[i]` is the command `frames[i]` answers; `origin` the node that answered.
    async fn redirect_frames(
        &self,
        router: &Router,
        proto: u8,
        origin: &str,
        commands: &[Bytes],
        frames: &mut [Bytes],
    ) {
        let mut todo: Vec<(usize, Again)> = frames
            .iter()
            .enumerate()
            .filter_map(|(i, f)| again_of(f, origin).map(|r| (i, r)))
            .collect();
        for round in 0..router.max_redirects() {
            if todo.is_empty() {
                break;
            }
            if todo.iter().any(|(_, a)| matches!(a, Again::TryAgain(_))) {
                // The slot is being migrated and the keys are split between the nodes for a
                // moment: back off a little more each round, as Redis Cluster clients do.
                let wait = 10 * u64::from(round + 1);
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            }
            let mut next = Vec::new();
            let mut start = 0;
            while start < todo.len() {
                let end = same_destination_end(&todo, start);
                self.resend_group(
                    router,
                    proto,
                    commands,
                    frames,
                    &todo[start..end],
                    &mut next,
                )
                .await;
                start = end;
            }
            todo = next;
        }
        for (i, r) in todo {
            // A TRYAGAIN that outlasted the retries stays Redis's own error: the client may
            // retry it later, as Redis intends.
            if let Again::Redirect(r) = r {
                frames[i] = too_many_redirections(&r);
            }
        }
    }

    /// One round of `redirect_frames` for a `group` of commands with one destination, all
    /// after ASK or none: sent there as one batch, each reply put in `frames`, and the ones
    /// redirected again pushed to `next` for the following round.
    async fn resend_group(
        &self,
        router: &Router,
        proto: u8,
        commands: &[Bytes],
        frames: &mut [Bytes],
        group: &[(usize, Again)],
        next: &mut Vec<(usize, Again)>,
    ) {
        let Some((_, first)) = group.first() else {
            return;
        };
        let (dest, ask) = (first.addr().clone(), first.is_ask());
        for (_, r) in group {
            self.note_redirect(router, r);
        }
        let node = router.node(&dest);
        let mut out = BytesMut::new();
        for (i, _) in group {
            if ask {
                out.extend_from_slice(b"*1\r\n$6\r\nASKING\r\n");
            }
            out.extend_from_slice(&commands[*i]);
        }
        let per = if ask { 2 } else { 1 };
        let expected = (group.len() * per) as u32;
        let (data, error) = self
            .exchange(router, node, proto, out.freeze(), expected)
            .await;
        let got = split_frames(&data);
        for (k, (i, _)) in group.iter().enumerate() {
            let Some(frame) = got.get(k * per + per - 1) else {
                frames[*i] = lost_reply(error.as_deref(), &dest, "no reply after a redirection");
                continue;
            };
            if let Some(r) = again_of(frame, &dest) {
                next.push((*i, r));
            }
            frames[*i] = frame.clone();
        }
    }

    /// Sends `bytes` (`frames` replies expected) to `node` over its shared connection for
    /// this client, outside the session's reply order, and waits: the reply bytes (complete
    /// frames only when there is an error) and, if the node failed, why.
    async fn exchange(
        &self,
        router: &Router,
        node: u16,
        proto: u8,
        bytes: Bytes,
        frames: u32,
    ) -> (Bytes, Option<Box<UpstreamError>>) {
        let rx = self.send_shared(router, node, proto, bytes, frames).await;
        receive(rx, router, node).await
    }

    /// Sends `bytes` (`frames` replies expected) to `node` over its shared connection for
    /// this client, outside the session's reply order: where the replies will come, or
    /// `None` when the connection took nothing.
    async fn send_shared(
        &self,
        router: &Router,
        node: u16,
        proto: u8,
        bytes: Bytes,
        frames: u32,
    ) -> Option<mpsc::UnboundedReceiver<Reply>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let batch = Batch {
            bytes,
            expect: Expect::Frames(frames),
            wait: ReplyWait::Prompt,
            reply_to: tx,
            seq: 0,
        };
        let pool = router.pool(node);
        let sent = pool.shared(proto, self.client.id).send(batch).await;
        sent.is_ok().then_some(rx)
    }

    /// Sends the parts of a split multi-key command and joins their replies.
    pub(super) async fn split(&mut self, split: Split) -> Bytes {
        let Some(router) = self.routing.router().cloned() else {
            return answers::cluster_disabled();
        };
        let mut pending = Vec::with_capacity(split.batches.len());
        for b in split.batches {
            let frames = (b.parts.len() + b.hidden) as u32;
            let bytes = b.bytes.freeze();
            let proto = self.client.proto;
            let rx = self
                .send_shared(&router, b.node, proto, bytes.clone(), frames)
                .await;
            pending.push((b.node, b.parts, bytes, rx));
        }
        // Every part's reply, with the client-order positions of its keys.
        let mut parts: Vec<(Vec<usize>, Bytes)> = Vec::new();
        for (node, positions, bytes, rx) in pending {
            let (data, error) = receive(rx, &router, node).await;
            let mut frames = split_frames(&data);
            if error.is_none() && may_redirect(&data) {
                // The slot moved since the map was read: follow, as for any command.
                self.redirect_batch(&router, node, &bytes, &mut frames)
                    .await;
            }
            for (k, p) in positions.into_iter().enumerate() {
                let reply = match frames.get(k) {
                    Some(f) => f.clone(),
                    None => lost_reply(error.as_deref(), &router.addr(node), "no reply"),
                };
                parts.push((p, reply));
            }
        }
        join(split.join, split.keys, &parts, self.client.proto)
    }

    /// Follows the redirections among `frames`, the replies `node` gave to the batch `bytes`
    /// sent for this client; nothing when the replies do not match the batch's commands.
    async fn redirect_batch(
        &self,
        router: &Router,
        node: u16,
        bytes: &Bytes,
        frames: &mut [Bytes],
    ) {
        let commands = split_commands(bytes, &self.ctx.codec);
        if commands.len() == frames.len() {
            let origin = router.addr(node);
            self.redirect_frames(router, self.client.proto, &origin, &commands, frames)
                .await;
        }
    }

    /// Sends a whole-keyspace command to every primary and merges the replies.
    pub(super) async fn fanout(&mut self, fanout: Fanout) -> Bytes {
        let Some(router) = self.routing.router().cloned() else {
            return answers::cluster_disabled();
        };
        let primaries = router.snapshot().primaries().to_vec();
        if primaries.is_empty() {
            router.refresh_soon();
            return answers::clusterdown();
        }
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
        let mut replies = Vec::with_capacity(receivers.len());
        for (node, rx) in receivers {
            let reply = match receive(rx, &router, node).await {
                (_, Some(e)) => error_reply(&ProxyError::Upstream(*e)),
                // The barrier's reply comes first and is dropped.
                (data, None) if fanout.blocking => split_frames(&data).pop().unwrap_or(data),
                (data, None) => data,
            };
            replies.push(reply);
        }
        let merged = merge(fanout.merge, &replies, self.client.id);
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
    ) -> Option<mpsc::UnboundedReceiver<Reply>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let batch = Batch {
            bytes: [Bytes::from_static(WAIT_BARRIER), fanout.bytes.clone()]
                .concat()
                .into(),
            expect: Expect::Frames(2),
            wait: fanout.wait,
            reply_to: tx,
            seq: 0,
        };
        let (push_to, _) = mpsc::unbounded_channel();
        let push = PushTarget {
            to: push_to,
            budget: Arc::new(tokio::sync::Semaphore::new(PUSH_BUDGET as usize)),
            budget_size: PUSH_BUDGET,
            conn_id: 0,
        };
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
        let merged = if fanout.proxy_section && merged.first() != Some(&b'-') {
            super::replies::append_to_text(merged, &self.proxy_info())
        } else {
            merged
        };
        match fanout.strip {
            Some(strip) if merged.first() != Some(&b'-') => strip.apply(&merged),
            _ => merged,
        }
    }
}

/// A multi-key command Redis semantics allow to split by slot (MGET, MSET, DEL, UNLINK,
/// EXISTS, TOUCH), as one sub-command per slot grouped by node; `None` for any other command
/// (it gets CROSSSLOT), or when a slot has no owner or the policy's rewrite cannot be split.
fn split(
    router: &Router,
    args: &Args<'_>,
    rewrite: Option<&crate::policy::rewrite::Rewrite>,
) -> Option<Action> {
    if rewrite.is_some_and(|r| r.append.is_some() || r.strip.is_some() || r.before.is_some()) {
        return None;
    }
    let mut ranges = Vec::new();
    let argv: Vec<&[u8]> = match rewrite.and_then(|r| r.command.as_ref()) {
        Some(frame) => match codec::decode(frame, &CodecLimits::default(), &mut ranges) {
            Ok(Some(Decoded::Command { .. })) => ranges.iter().map(|r| &frame[r.clone()]).collect(),
            _ => return None,
        },
        None => args.iter().collect(),
    };
    let name = argv[0];
    let (join, step) = split_join(name)?;
    if argv.len() < 2 || (argv.len() - 1) % step != 0 {
        return None;
    }
    let snapshot = router.snapshot();
    let mut batches: Vec<NodeBatch> = Vec::new();
    for (s, positions) in slots_in_order(router, &argv, step) {
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
    }))))
}

/// The refusal of keys in two slots `a` and `b`: Redis Cluster's CROSSSLOT, or in routes
/// mode (unless both are slots of the cluster route) the routes they belong to, named.
pub(super) fn cross(router: &Router, a: Option<u16>, b: Option<u16>) -> Bytes {
    let (Some(a), Some(b)) = (a, b) else {
        return answers::crossslot();
    };
    let (first, second) = (router.route_names(a), router.route_names(b));
    // Two slots of one cluster route are Redis Cluster's own CROSSSLOT.
    if router.routes().is_none() || first == second {
        return answers::crossslot();
    }
    answers::crossroute(&first, &second)
}

/// [`cross`] for keys on nodes `a` and `b` (a pinned session's node and a key's).
fn cross_nodes(router: &Router, a: u16, b: u16) -> Bytes {
    let (first, second) = (router.node_route_names(a), router.node_route_names(b));
    if router.routes().is_none() || first == second {
        return answers::crossslot();
    }
    answers::crossroute(&first, &second)
}

/// Where the arguments that place a command are when they are not the command table's keys:
/// the shard channels of SSUBSCRIBE, SUNSUBSCRIBE and SPUBLISH (Redis routes them by slot),
/// and in routes mode the channels of SUBSCRIBE, PSUBSCRIBE and PUBLISH (a channel goes to
/// its route's server, where its subscribers are). Unsubscribing goes wherever the
/// subscriptions are, so it is placed as a keyless command.
fn channel_positions(argv: &[&[u8]], routes: bool) -> std::ops::Range<usize> {
    let name = argv[0];
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    if is(b"SSUBSCRIBE")
        || is(b"SUNSUBSCRIBE")
        || (routes && (is(b"SUBSCRIBE") || is(b"PSUBSCRIBE")))
    {
        1..argv.len()
    } else if (is(b"SPUBLISH") || (routes && is(b"PUBLISH"))) && argv.len() > 1 {
        1..2
    } else {
        0..0
    }
}

/// The part of argument `arg` of command `name` a route is chosen by: a PSUBSCRIBE pattern's
/// literal start (`events:*` is `events:`'s), any other argument whole.
fn channel_literal<'a>(name: &[u8], arg: &'a [u8]) -> &'a [u8] {
    if !name.eq_ignore_ascii_case(b"PSUBSCRIBE") {
        return arg;
    }
    let end = arg
        .iter()
        .position(|b| matches!(b, b'*' | b'?' | b'[' | b'\\'))
        .unwrap_or(arg.len());
    &arg[..end]
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

/// The slots of a split command's keys (every `step`-th argument), in the order they first
/// appear, each with the client-order positions of its keys: one sub-command per slot.
fn slots_in_order(router: &Router, argv: &[&[u8]], step: usize) -> Vec<(u16, Vec<usize>)> {
    let mut by_slot: Vec<(u16, Vec<usize>)> = Vec::new();
    for (position, i) in (1..argv.len()).step_by(step).enumerate() {
        let s = router.slot_of(argv[i]);
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

/// The upstream's HELLO reply with `mode` saying `standalone`: to the client the proxy is one
/// server, and a client that switched to cluster mode on seeing `cluster` would then ask for
/// `CLUSTER SLOTS` and be refused.
pub(super) fn as_standalone(hello: Bytes) -> Bytes {
    const CLUSTER: &[u8] = b"$4\r\nmode\r\n$7\r\ncluster\r\n";
    match memchr::memmem::find(&hello, CLUSTER) {
        None => hello,
        Some(at) => [
            &hello[..at],
            b"$4\r\nmode\r\n$10\r\nstandalone\r\n",
            &hello[at + CLUSTER.len()..],
        ]
        .concat()
        .into(),
    }
}

/// The node owning the keys of one encoded command (a primary for a keyless one).
pub(super) fn node_of_command(
    router: &Router,
    command: &[u8],
    limits: &CodecLimits,
) -> Option<u16> {
    let mut ranges = Vec::new();
    match codec::decode(command, limits, &mut ranges) {
        Ok(Some(Decoded::Command { .. })) => {
            let argv: Vec<&[u8]> = ranges.iter().map(|r| &command[r.clone()]).collect();
            router.node_for(&argv)
        }
        _ => None,
    }
}

/// Whether a batch's replies may hold a MOVED, ASK or TRYAGAIN (a cheap scan; values that
/// happen to contain the text are sorted out by parsing each frame).
fn may_redirect(data: &[u8]) -> bool {
    data.starts_with(b"-MOVED ")
        || data.starts_with(b"-ASK ")
        || data.starts_with(b"-TRYAGAIN")
        || memchr::memmem::find(data, b"\r\n-MOVED ").is_some()
        || memchr::memmem::find(data, b"\r\n-ASK ").is_some()
        || memchr::memmem::find(data, b"\r\n-TRYAGAIN").is_some()
}

/// The error a command gets when it is still redirected after `max_redirects` resends.
fn too_many_redirections(redirect: &Redirect) -> Bytes {
    answers::too_many_redirections(redirect.slot())
}

/// `command` preceded by `ASKING` when it follows an ASK: the target node serves the slot
/// being imported only to a connection that said so, for the next command only.
fn with_asking(command: Bytes, ask: bool) -> Bytes {
    if ask {
        [Bytes::from_static(b"*1\r\n$6\r\nASKING\r\n"), command]
            .concat()
            .into()
    } else {
        command
    }
}

/// Where the run of `todo` entries starting at `start` ends: the entries sent to one node
/// in one batch share its address and whether they follow an ASK (each then needs `ASKING`).
fn same_destination_end(todo: &[(usize, Again)], start: usize) -> usize {
    let (dest, ask) = (todo[start].1.addr(), todo[start].1.is_ask());
    todo[start..]
        .iter()
        .position(|(_, r)| r.addr() != dest || r.is_ask() != ask)
        .map_or(todo.len(), |n| start + n)
}

/// The reply for a command whose node answered nothing for it: the node's error if it
/// failed, else a lost connection (the command may have run, so it is not sent again).
fn lost_reply(error: Option<&UpstreamError>, addr: &Arc<str>, reason: &str) -> Bytes {
    let e = error.cloned().unwrap_or(UpstreamError::Lost {
        addr: addr.clone(),
        reason: reason.into(),
    });
    error_reply(&ProxyError::Upstream(e))
}

/// The replies a batch sent outside the session's reply order got (`rx`: where they come;
/// `None` when the batch was not taken), and why the node failed if it did.
async fn receive(
    rx: Option<mpsc::UnboundedReceiver<Reply>>,
    router: &Router,
    node: u16,
) -> (Bytes, Option<Box<UpstreamError>>) {
    let answer = match rx {
        Some(mut rx) => rx.recv().await,
        None => None,
    };
    match answer {
        Some(Reply::Batch { data, error, .. }) => (data, error),
        _ => (
            Bytes::new(),
            Some(Box::new(UpstreamError::Unavailable {
                addr: router.addr(node),
                reason: "connection closed".into(),
            })),
        ),
    }
}

/// A command to send again, and where.
enum Again {
    /// MOVED or ASK: to the node named.
    Redirect(Redirect),
    /// TRYAGAIN (a multi-key command whose keys are split by a migration in progress): to the
    /// same node, after a short wait.
    TryAgain(Arc<str>),
}

impl Again {
    fn addr(&self) -> &Arc<str> {
        match self {
            Again::Redirect(r) => r.addr(),
            Again::TryAgain(addr) => addr,
        }
    }

    fn is_ask(&self) -> bool {
        matches!(self, Again::Redirect(Redirect::Ask { .. }))
    }
}

/// Whether a reply frame asks for the command to be sent again.
fn again_of(frame: &[u8], answered_by: &str) -> Option<Again> {
    if frame.starts_with(b"-TRYAGAIN") {
        return Some(Again::TryAgain(answered_by.into()));
    }
    redirect_of(frame, answered_by).map(Again::Redirect)
}

/// The redirection a reply frame is, if it is one.
fn redirect_of(frame: &[u8], answered_by: &str) -> Option<Redirect> {
    if frame.first() != Some(&b'-') {
        return None;
    }
    Redirect::parse(frame, answered_by).ok().flatten()
}

/// Reply frames of a batch, as slices of its bytes.
fn split_frames(data: &Bytes) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        match crate::reply::scan(&data[pos..]) {
            Ok(Some(len)) => {
                out.push(data.slice(pos..pos + len));
                pos += len;
            }
            _ => break,
        }
    }
    out
}

/// Combines one reply per primary.
fn merge(how: Merge, replies: &[Bytes], seed: u64) -> Bytes {
    if let Some(e) = replies.iter().find(|r| r.first() == Some(&b'-')) {
        if how != Merge::FirstNonNil {
            return e.clone();
        }
    }
    match how {
        Merge::Sum => {
            let mut total: i64 = 0;
            for r in replies {
                match r
                    .strip_prefix(b":")
                    .and_then(|r| r.strip_suffix(b"\r\n"))
                    .and_then(codec::parse_int)
                {
                    Some(n) => total = total.saturating_add(n),
                    None => return unexpected(r),
                }
            }
            answers::integer(total)
        }
        Merge::Concat => {
            let mut count: i64 = 0;
            let mut body = BytesMut::new();
            for r in replies {
                let header_end = match memchr::memchr(b'\r', r) {
                    Some(i) if matches!(r.first(), Some(b'*' | b'~')) => i,
                    _ => return unexpected(r),
                };
                let Some(n) = codec::parse_int(&r[1..header_end]) else {
                    return unexpected(r);
                };
                count += n.max(0);
                body.extend_from_slice(&r[header_end + 2..]);
            }
            let mut out = BytesMut::from(format!("*{count}\r\n").as_bytes());
            out.extend_from_slice(&body);
            out.freeze()
        }
        Merge::AllOk => replies
            .first()
            .cloned()
            .unwrap_or_else(answers::clusterdown),
        Merge::Info => merge_info(replies),
        Merge::Min => merge_min(replies),
        Merge::FirstNonNil => {
            let n = replies.len();
            let start = (seed as usize).wrapping_add(n / 2) % n.max(1);
            let nil =
                |r: &Bytes| r.first() == Some(&b'-') || &r[..] == b"$-1\r\n" || &r[..] == b"_\r\n";
            (0..n)
                .map(|k| &replies[(start + k) % n])
                .find(|r| !nil(r))
                .or_else(|| replies.iter().find(|r| r.first() != Some(&b'-')))
                .or(replies.first())
                .cloned()
                .unwrap_or_else(answers::clusterdown)
        }
    }
}

/// Joins the replies of a split command's parts (see [`Join`]); the first error wins.
fn join(how: Join, keys: usize, parts: &[(Vec<usize>, Bytes)], proto: u8) -> Bytes {
    if how != Join::Values {
        let replies: Vec<Bytes> = parts.iter().map(|(_, r)| r.clone()).collect();
        return merge(
            if how == Join::Sum {
                Merge::Sum
            } else {
                Merge::AllOk
            },
            &replies,
            0,
        );
    }
    let nil: &[u8] = if proto == 3 {
        b"_
"
    } else {
        b"$-1
"
    };
    let mut values: Vec<Bytes> = vec![Bytes::from_static(b""); keys];
    for (positions, reply) in parts {
        if reply.first() != Some(&b'*') {
            return if reply.first() == Some(&b'-') {
                reply.clone()
            } else {
                unexpected(reply)
            };
        }
        let Some(cr) = memchr::memchr(b'\r', reply) else {
            return unexpected(reply);
        };
        if codec::parse_int(&reply[1..cr]) != Some(positions.len() as i64) {
            return unexpected(reply);
        }
        let elements = split_frames(&reply.slice(cr + 2..));
        if elements.len() != positions.len() {
            return unexpected(reply);
        }
        for (&p, v) in positions.iter().zip(elements) {
            if let Some(slot) = values.get_mut(p) {
                *slot = v;
            }
        }
    }
    let mut out = BytesMut::from(format!("*{keys}\r\n").as_bytes());
    for v in values {
        out.extend_from_slice(if v.is_empty() { nil } else { &v });
    }
    out.freeze()
}

/// The cursor of a SCAN reply (`*2`, a bulk cursor, the array of names) and where the array
/// starts.
fn scan_reply_cursor(reply: &[u8]) -> Result<(u64, usize), ()> {
    let rest = reply.strip_prefix(b"*2\r\n$").ok_or(())?;
    let nl = memchr::memchr(b'\n', rest).ok_or(())?;
    let len: usize = std::str::from_utf8(rest.get(..nl.checked_sub(1).ok_or(())?).ok_or(())?)
        .map_err(|_| ())?
        .parse()
        .map_err(|_| ())?;
    let digits = rest.get(nl + 1..nl + 1 + len).ok_or(())?;
    let cursor = std::str::from_utf8(digits)
        .map_err(|_| ())?
        .parse()
        .map_err(|_| ())?;
    // "*2\r\n$" + header + digits + CRLF
    Ok((cursor, 5 + nl + 1 + len + 2))
}

/// The smallest integer reply, or for arrays of integers (WAITAOF) the element-wise minimum.
fn merge_min(replies: &[Bytes]) -> Bytes {
    let ints = |r: &Bytes| -> Option<Vec<i64>> {
        let frames: Vec<Bytes> = match r.first() {
            Some(b':') => vec![r.clone()],
            Some(b'*') => {
                let cr = memchr::memchr(b'\r', r)?;
                split_frames(&r.slice(cr + 2..))
            }
            _ => return None,
        };
        frames
            .iter()
            .map(|f| {
                f.strip_prefix(b":")
                    .and_then(|f| f.strip_suffix(b"\r\n"))
                    .and_then(codec::parse_int)
            })
            .collect()
    };
    let Some(first) = replies.first() else {
        return answers::clusterdown();
    };
    let Some(mut min) = ints(first) else {
        return unexpected(first);
    };
    for r in &replies[1..] {
        match ints(r) {
            Some(v) if v.len() == min.len() => {
                for (m, x) in min.iter_mut().zip(v) {
                    *m = (*m).min(x);
                }
            }
            _ => return unexpected(r),
        }
    }
    if first.first() == Some(&b':') {
        answers::integer(min[0])
    } else {
        let mut out = format!("*{}\r\n", min.len());
        for m in min {
            out.push_str(&format!(":{m}\r\n"));
        }
        Bytes::from(out)
    }
}

/// The first node's INFO text with every `dbN:keys=…,expires=…` line's counts summed over all
/// nodes and `cluster_enabled:1` turned to 0.
fn merge_info(replies: &[Bytes]) -> Bytes {
    let Some(first) = replies.first() else {
        return answers::clusterdown();
    };
    let Some((verbatim, text)) = super::replies::text_of(first) else {
        return unexpected(first);
    };
    let sums = keyspace_sums(replies);
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    for line in text.split_inclusive(|&b| b == b'\n') {
        merged_info_line(line, &sums, &mut out);
    }
    super::replies::text_reply(verbatim, &out)
}

/// Per database, a keyspace count summed over every node's INFO.
type KeyspaceSums = Vec<(Vec<u8>, &'static str, i64)>;

/// (db, field) → sum over the nodes' INFO replies, for the integer fields worth adding up.
fn keyspace_sums(replies: &[Bytes]) -> KeyspaceSums {
    let mut sums = KeyspaceSums::new();
    for reply in replies {
        let Some((_, body)) = super::replies::text_of(reply) else {
            continue;
        };
        for line in body.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some((db, fields)) = keyspace_line(line) {
                add_keyspace_counts(&mut sums, db, fields);
            }
        }
    }
    sums
}

/// Adds the `keys` and `expires` counts of one node's keyspace line for `db` to `sums`.
fn add_keyspace_counts(sums: &mut KeyspaceSums, db: &[u8], fields: &[u8]) {
    for field in fields.split(|&b| b == b',') {
        for name in ["keys", "expires"] {
            let Some(v) = field
                .strip_prefix(name.as_bytes())
                .and_then(|r| r.strip_prefix(b"="))
                .and_then(codec::parse_int)
            else {
                continue;
            };
            match sums.iter_mut().find(|(d, n, _)| d == db && *n == name) {
                Some((_, _, total)) => *total += v,
                None => sums.push((db.to_vec(), name, v)),
            }
        }
    }
}

/// One line of the first node's INFO text (with its line ending) as the client gets it:
/// `cluster_enabled:0`, a keyspace line with the summed counts, any other line as it is.
fn merged_info_line(line: &[u8], sums: &KeyspaceSums, out: &mut Vec<u8>) {
    let bare = line.strip_suffix(b"\n").unwrap_or(line);
    let bare = bare.strip_suffix(b"\r").unwrap_or(bare);
    let ending = &line[bare.len()..];
    if bare == b"cluster_enabled:1" {
        out.extend_from_slice(b"cluster_enabled:0");
        out.extend_from_slice(ending);
        return;
    }
    let Some((db, fields)) = keyspace_line(bare) else {
        out.extend_from_slice(line);
        return;
    };
    out.extend_from_slice(db);
    out.push(b':');
    for (i, field) in fields.split(|&b| b == b',').enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let name = field.split(|&b| b == b'=').next().unwrap_or(b"");
        match sums
            .iter()
            .find(|(d, n, _)| d == db && n.as_bytes() == name)
        {
            Some((_, n, total)) => out.extend_from_slice(format!("{n}={total}").as_bytes()),
            None => out.extend_from_slice(field),
        }
    }
    out.extend_from_slice(ending);
}

/// `dbN` and its fields, for a `# Keyspace` line such as `db0:keys=3,expires=1,avg_ttl=0`.
fn keyspace_line(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = memchr::memchr(b':', line)?;
    let (db, fields) = (&line[..colon], &line[colon + 1..]);
    (db.len() > 2
        && db.starts_with(b"db")
        && db[2..].iter().all(u8::is_ascii_digit)
        && fields.starts_with(b"keys="))
    .then_some((db, fields))
}

/// A node's reply that does not have the shape its command promises.
fn unexpected(reply: &[u8]) -> Bytes {
    answers::unexpected_node_reply(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges() {
        let b = |s: &'static [u8]| Bytes::from_static(s);
        assert_eq!(
            &merge(Merge::Sum, &[b(b":3\r\n"), b(b":0\r\n"), b(b":4\r\n")], 0)[..],
            b":7\r\n"
        );
        assert_eq!(
            &merge(
                Merge::Concat,
                &[
                    b(b"*1\r\n$1\r\na\r\n"),
                    b(b"*0\r\n"),
                    b(b"*2\r\n$1\r\nb\r\n$1\r\nc\r\n")
                ],
                0
            )[..],
            b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"
        );
        assert_eq!(
            &merge(Merge::AllOk, &[b(b"+OK\r\n"), b(b"-ERR no\r\n")], 0)[..],
            b"-ERR no\r\n"
        );
        for seed in 0..3 {
            assert_eq!(
                &merge(
                    Merge::FirstNonNil,
                    &[b(b"$-1\r\n"), b(b"$1\r\nk\r\n"), b(b"$-1\r\n")],
                    seed
                )[..],
                b"$1\r\nk\r\n"
            );
        }
        assert_eq!(
            &merge(Merge::FirstNonNil, &[b(b"$-1\r\n"), b(b"$-1\r\n")], 1)[..],
            b"$-1\r\n"
        );
        assert!(merge(Merge::Sum, &[b(b"+OK\r\n")], 0).starts_with(b"-ERR unexpected"));
    }

    #[test]
    fn wait_takes_the_smallest_count() {
        let b = |s: &'static [u8]| Bytes::from_static(s);
        assert_eq!(
            &merge(Merge::Min, &[b(b":2\r\n"), b(b":1\r\n"), b(b":3\r\n")], 0)[..],
            b":1\r\n"
        );
        assert_eq!(
            &merge(
                Merge::Min,
                &[b(b"*2\r\n:1\r\n:2\r\n"), b(b"*2\r\n:0\r\n:3\r\n")],
                0
            )[..],
            b"*2\r\n:0\r\n:2\r\n"
        );
    }

    #[test]
    fn info_sums_the_keyspace() {
        let info = |keys: u32, expires: u32| {
            let text = format!(
                "# Server\r\nredis_version:7.2\r\n\r\n# Cluster\r\ncluster_enabled:1\r\n\r\n# Keyspace\r\ndb0:keys={keys},expires={expires},avg_ttl=5\r\n"
            );
            Bytes::from(format!("${}\r\n{text}\r\n", text.len()))
        };
        let merged = merge(Merge::Info, &[info(3, 1), info(4, 0), info(10, 2)], 0);
        let text = String::from_utf8_lossy(&merged).into_owned();
        assert!(
            text.contains("db0:keys=17,expires=3,avg_ttl=5\r\n"),
            "{text}"
        );
        assert!(text.contains("cluster_enabled:0\r\n"), "{text}");
        assert!(text.contains("redis_version:7.2\r\n"), "{text}");
        let header = format!(
            "${}\r\n",
            merged.len() - 2 - format!("{}", merged.len()).len() - 3
        );
        assert!(merged.starts_with(header.as_bytes()), "{text}");
    }

    #[test]
    fn scan_reply_cursor_and_array() {
        let reply = b"*2\r\n$5\r\n12345\r\n*1\r\n$1\r\nk\r\n";
        let (cursor, at) = scan_reply_cursor(reply).unwrap();
        assert_eq!(cursor, 12345);
        assert_eq!(&reply[at..], b"*1\r\n$1\r\nk\r\n");
        assert!(scan_reply_cursor(b"-ERR no\r\n").is_err());
        assert!(scan_reply_cursor(b"*2\r\n$3\r\nabc\r\n*0\r\n").is_err());
    }

    #[test]
    fn redirect_scan_ignores_values() {
        assert!(may_redirect(b"-MOVED 1 127.0.0.1:7000\r\n"));
        assert!(may_redirect(b"+OK\r\n-ASK 1 127.0.0.1:7000\r\n"));
        assert!(!may_redirect(b"+OK\r\n:1\r\n"));
        // A value containing the text is found by the scan but is not an error frame.
        let data = Bytes::from_static(b"$20\r\n\r\n-MOVED 1 x:1\r\nabcd\r\n");
        let frames = split_frames(&data);
        assert_eq!(frames.len(), 1);
        assert!(redirect_of(&frames[0], "x:1").is_none());
    }
}
