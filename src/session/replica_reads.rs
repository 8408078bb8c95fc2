//! Sentinel mode with `read_from: replica`: which commands a replica may serve (cluster
//! mode's rules, docs/cluster.md), and reads sent again to the primary when their replica's
//! connection fails. Which replica is `upstream::replicas`' choice.
//!
//! Sentinel steps are methods of `ReplicaReads`, a shared view of the parts they read,
//! made by `Session::replica_reads` only in front of replicas, as cluster steps are of
//! `cluster::ClusterSession`; the rules both modes share are free functions here.

use std::sync::Arc;

use super::action::Action;
use super::client::ClientState;
use super::conn::enqueue;
use super::conn::{ConnState, Target};
use super::context::Context;
use super::effect::Effect;
use super::reply_queue::ReplyQueue;
use crate::commands::{AclCategories, CommandSpec};
use crate::protocol::codec::{CodecLimits, split_commands};
use crate::upstream::replicas::Replicas;
use crate::upstream::{Batch, Expect, Reply, ReplyWait};
use bytes::Bytes;

/// A Sentinel session with `read_from: replica`, as its replica steps see it.
pub(super) struct ReplicaReads<'s> {
    /// The pools (the primary's, for reads sent again) and the codec's limits.
    pub(super) ctx: &'s Arc<Context>,
    /// The client's id, which picks its replica and its shared connection.
    pub(super) client: &'s ClientState,
    /// The state held on the dedicated connection (no replica read inside MULTI).
    pub(super) conn: &'s ConnState,
    /// What is in flight, and each batch as sent (the reads a failed replica leaves).
    pub(super) queue: &'s ReplyQueue,
    /// The replicas reads may go to.
    pub(super) replicas: &'s Replicas,
}

impl ReplicaReads<'_> {
    /// Sends a read for the primary's shared connection to the client's replica instead,
    /// when the command qualifies and a replica connection is up; anything else unchanged.
    pub(super) fn place_read(
        &self,
        action: Action,
        spec: Option<&'static CommandSpec>,
        queued: Option<Target>,
    ) -> Action {
        let Some((target, effect, rewrite)) = action.forwarded() else {
            return action;
        };
        // Shared connection only: a pinned session (WATCH, SELECT n, a client's own AUTH…)
        // has its state on the primary and is already on its dedicated connection.
        let Target::Shared(proto, 0) = target else {
            return action;
        };
        if effect != Effect::None
            || !replica_may_serve(
                self.conn,
                self.queue,
                spec,
                rewrite,
                queued,
                Target::Shared(proto, 0),
            )
        {
            return action;
        }
        let Some(node) = self.replicas.pick(proto, self.client.id) else {
            return action;
        };
        let target = Target::Shared(proto, node);
        action.retarget(target)
    }

    /// A batch sent to a Sentinel replica whose connection failed: its reads without a
    /// reply are sent to the primary at once (see [`failed_reads`]); cluster mode's own is
    /// `ClusterSession::resend_failed_replica_reads`.
    pub(super) async fn resend_failed_replica_reads(&self, msg: &mut Reply) {
        // Node 0 is the primary, 1… the Sentinel replicas.
        let Some(failed) = failed_reads(self.queue, &self.ctx.codec, msg, |node| node != 0) else {
            return;
        };
        let (reply_to, mut rx) = crate::upstream::reply_channel();
        let batch = Batch {
            bytes: failed.commands.concat().into(),
            expect: Expect::Frames(failed.commands.len() as u32),
            wait: ReplyWait::Prompt,
            reply_to,
            seq: 0,
        };
        if enqueue(self.ctx.pool.shared(failed.proto, self.client.id), batch)
            .await
            .is_err()
        {
            return;
        }
        if let Some(Reply::Batch {
            data, error: None, ..
        }) = rx.recv().await
        {
            failed.answered(msg, &data);
        }
    }
}

/// The replica-read rule of both cluster and Sentinel mode: read-only in the command table,
/// not blocking, not a script (scripts are loaded on primaries only, so EVALSHA_RO would
/// answer NOSCRIPT forever), no hidden commands from the policy, outside MULTI (`conn`);
/// and not right behind commands queued or in flight on `primary` (its shared connection;
/// `queue`'s in-flight target), so a pipelined write then read of one key reads the write
/// and the session does not pause to switch.
pub(super) fn replica_may_serve(
    conn: &ConnState,
    queue: &ReplyQueue,
    spec: Option<&'static CommandSpec>,
    rewrite: Option<&crate::policy::rewrite::Rewrite>,
    queued: Option<Target>,
    primary: Target,
) -> bool {
    !conn.in_multi()
        && spec.is_some_and(|s| {
            s.is_readonly()
                && !s.is_blocking()
                && !s.acl_categories.contains(AclCategories::SCRIPTING)
        })
        && rewrite.is_none_or(|r| r.after.is_empty())
        && queued.or(queue.inflight_target) != Some(primary)
}

/// The reads of a batch whose replica failed, to be sent to their primary.
pub(super) struct FailedReads {
    /// The protocol the batch was sent in, which the primary's connection must speak.
    pub(super) proto: u8,
    /// The commands that got no reply, in order.
    pub(super) commands: Vec<Bytes>,
}

impl FailedReads {
    /// Puts the primary's `replies` after what the replica answered, as if one server had
    /// answered the whole batch.
    pub(super) fn answered(&self, msg: &mut Reply, replies: &[u8]) {
        if let Reply::Batch {
            data,
            missing,
            error,
            ..
        } = msg
        {
            *data = [&data[..], replies].concat().into();
            *missing = 0;
            *error = None;
        }
    }
}

/// A batch sent to a replica whose connection failed (down before it was sent, or lost with
/// replies missing) holds only reads (see `replica_may_serve`): the commands without a
/// reply, to be sent to their primary at once, whether or not the replica ran them, so the
/// client sees no error for a replica that dies. Sentinel and cluster mode alike; only which
/// node is a replica (`is_replica`) and where "the primary" is differ. `None` for any other
/// reply: `msg` is then left alone, as it is when the primary cannot answer either (the
/// client then gets the replica's error, as for any upstream failure).
pub(super) fn failed_reads(
    queue: &ReplyQueue,
    codec: &CodecLimits,
    msg: &Reply,
    is_replica: impl Fn(u16) -> bool,
) -> Option<FailedReads> {
    let Reply::Batch {
        missing,
        error: Some(_),
        seq,
        ..
    } = msg
    else {
        return None;
    };
    let sent = queue.sent_of(*seq)?;
    if sent.dedicated || *missing == 0 || !is_replica(sent.node) {
        return None;
    }
    let mut commands = split_commands(&sent.bytes, codec);
    let first = commands.len().checked_sub(*missing as usize)?;
    Some(FailedReads {
        proto: sent.proto,
        commands: commands.split_off(first),
    })
}
