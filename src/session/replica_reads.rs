//! Sentinel mode with `read_from: replica`: which commands a replica may serve (cluster
//! mode's rules, docs/cluster.md), and reads sent again to the primary when their replica's
//! connection fails. Which replica is `upstream::replicas`' choice.

use super::forward::enqueue;
use super::routing::Routing;
use super::{Action, Effect, Session, Target, cluster};
use crate::commands::{AclCategories, CommandSpec};
use crate::protocol::codec::split_commands;
use crate::upstream::replicas::Replicas;
use crate::upstream::{Batch, Expect, Reply, ReplyWait};
use bytes::Bytes;

impl Session {
    /// Sends a read for the primary's shared connection to the client's replica instead,
    /// when the command qualifies and a replica connection is up; anything else unchanged.
    pub(super) fn place_read(
        &self,
        replicas: &Replicas,
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
            || !self.replica_may_serve(spec, rewrite, queued, Target::Shared(proto, 0))
        {
            return action;
        }
        let Some(node) = replicas.pick(proto, self.client.id) else {
            return action;
        };
        let target = Target::Shared(proto, node);
        action.retarget(target)
    }

    /// The replica-read rule of both cluster and Sentinel mode: read-only in the command
    /// table, not blocking, not a script (scripts are loaded on primaries only, so EVALSHA_RO
    /// would answer NOSCRIPT forever), no hidden commands from the policy, outside MULTI; and
    /// not right behind commands queued or in flight on `primary` (its shared connection), so
    /// a pipelined write then read of one key reads the write and the session does not pause
    /// to switch.
    pub(super) fn replica_may_serve(
        &self,
        spec: Option<&'static CommandSpec>,
        rewrite: Option<&crate::policy::rewrite::Rewrite>,
        queued: Option<Target>,
        primary: Target,
    ) -> bool {
        !self.conn.in_multi()
            && spec.is_some_and(|s| {
                s.is_readonly()
                    && !s.is_blocking()
                    && !s.acl_categories.contains(AclCategories::SCRIPTING)
            })
            && rewrite.is_none_or(|r| r.after.is_empty())
            && queued.or(self.queue.inflight_target) != Some(primary)
    }

    /// A batch sent to a replica whose connection failed (down before it was sent, or lost
    /// with replies missing) holds only reads (see `replica_may_serve`): the commands without
    /// a reply are sent to their primary at once, whether or not the replica ran them, and
    /// the client sees no error for a replica that dies. Sentinel and cluster mode alike; only
    /// where "the primary" is differs (`to_primaries`). Leaves `msg` alone for any other
    /// reply, or when the primary cannot answer either (the client then gets the replica's
    /// error, as for any upstream failure).
    pub(super) async fn resend_failed_replica_reads(&self, msg: &mut Reply) {
        let Reply::Batch {
            data,
            missing,
            error: Some(_),
            seq,
        } = msg
        else {
            return;
        };
        let Some(sent) = self.sent_of(*seq) else {
            return;
        };
        if sent.dedicated || *missing == 0 || !self.is_replica(sent.node) {
            return;
        }
        let commands = split_commands(&sent.bytes, &self.ctx.codec);
        let Some(first) = commands.len().checked_sub(*missing as usize) else {
            return;
        };
        let Some(replies) = self.to_primaries(sent.proto, &commands[first..]).await else {
            return;
        };
        *msg = Reply::Batch {
            data: [&data[..], &replies[..]].concat().into(),
            missing: 0,
            error: None,
            seq: *seq,
        };
    }

    /// Whether `node` (of a shared batch) is a replica.
    fn is_replica(&self, node: u16) -> bool {
        match &self.routing {
            Routing::Cluster(c) => {
                c.router.read_from() != crate::config::ReadFrom::Primary
                    && !c.router.snapshot().is_primary(node)
            }
            // Node 0 is the primary, 1… the Sentinel replicas.
            _ => node != 0,
        }
    }

    /// Sends `commands` to their primary (in cluster mode, each to its slot's) and returns
    /// their replies, in order; `None` when any of them got no reply.
    async fn to_primaries(&self, proto: u8, commands: &[Bytes]) -> Option<Bytes> {
        if let Some(router) = self.routing.router() {
            let nodes = commands
                .iter()
                .map(|c| cluster::node_of_command(router, c, &self.ctx.codec))
                .collect::<Option<Vec<u16>>>()?;
            return self.send_routed(router, proto, commands, &nodes).await;
        }
        let (reply_to, mut rx) = crate::upstream::reply_channel();
        let batch = Batch {
            bytes: commands.concat().into(),
            expect: Expect::Frames(commands.len() as u32),
            wait: ReplyWait::Prompt,
            reply_to,
            seq: 0,
        };
        enqueue(self.ctx.pool.shared(proto, self.client.id), batch)
            .await
            .ok()?;
        match rx.recv().await {
            Some(Reply::Batch {
                data, error: None, ..
            }) => Some(data),
            _ => None,
        }
    }
}
