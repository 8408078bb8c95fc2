//! Sentinel mode with `read_from: replica`: which commands a replica may serve (cluster
//! mode's rules, docs/cluster.md), and reads sent again to the primary when their replica's
//! connection fails. Which replica is `upstream::replicas`' choice.

use bytes::Bytes;

use super::*;
use crate::commands::AclCategories;
use crate::upstream::replicas::Replicas;

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
        let Some(node) = replicas.pick(proto, self.id) else {
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
        !self.in_multi
            && spec.is_some_and(|s| {
                s.is_readonly()
                    && !s.is_blocking()
                    && !s.acl_categories.contains(AclCategories::SCRIPTING)
            })
            && rewrite.is_none_or(|r| r.after.is_empty())
            && queued.or(self.inflight_target) != Some(primary)
    }

    /// A batch sent to a replica whose connection failed (down before it was sent, or lost
    /// with replies missing) holds only reads: the commands without a reply are sent to the
    /// primary at once, whether or not the replica ran them, and the client sees no error.
    /// Leaves `msg` alone for any other reply, or when the primary cannot answer either
    /// (the client then gets the replica's error, as for any upstream failure).
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
        if sent.dedicated || sent.node == 0 || *missing == 0 {
            return;
        }
        let Some(rest) = unanswered(&sent.bytes, *missing, &self.ctx.codec) else {
            return;
        };
        let (reply_to, mut rx) = mpsc::unbounded_channel();
        let batch = Batch {
            bytes: rest,
            expect: Expect::Frames(*missing),
            wait: ReplyWait::Prompt,
            reply_to,
            seq: 0,
        };
        if enqueue(self.ctx.pool.shared(sent.proto, self.id), batch)
            .await
            .is_err()
        {
            return;
        }
        if let Some(Reply::Batch {
            data: replies,
            error: None,
            ..
        }) = rx.recv().await
        {
            *msg = Reply::Batch {
                data: [&data[..], &replies[..]].concat().into(),
                missing: 0,
                error: None,
                seq: *seq,
            };
        }
    }
}

/// The last `missing` commands of a batch's bytes; `None` when the batch holds fewer.
fn unanswered(bytes: &Bytes, missing: u32, limits: &CodecLimits) -> Option<Bytes> {
    let commands = split_commands(bytes, limits);
    let first = commands.len().checked_sub(missing as usize)?;
    // A slice of `bytes`: its offset there is where the unanswered tail starts.
    let start = commands.get(first)?.as_ptr() as usize - bytes.as_ptr() as usize;
    Some(bytes.slice(start..))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unanswered_tail_of_a_batch() {
        let bytes = Bytes::from_static(
            b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n\r\nGET b\r\n*2\r\n$3\r\nGET\r\n$1\r\nc\r\n",
        );
        let limits = CodecLimits::default();
        assert_eq!(
            unanswered(&bytes, 1, &limits).unwrap(),
            &b"*2\r\n$3\r\nGET\r\n$1\r\nc\r\n"[..]
        );
        assert_eq!(
            unanswered(&bytes, 2, &limits).unwrap(),
            &b"GET b\r\n*2\r\n$3\r\nGET\r\n$1\r\nc\r\n"[..]
        );
        assert_eq!(unanswered(&bytes, 3, &limits).unwrap(), bytes);
        assert!(unanswered(&bytes, 4, &limits).is_none());
    }
}
