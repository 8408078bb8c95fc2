//! The reply order (`ReplyQueue`): each command's place, what is in flight, and the
//! replies written to the client in request order.

use super::conn::Target;
use super::effect::InfoEdit;
use crate::commands::CommandSpec;
use crate::upstream::{ReplyReceiver, ReplySender, ReplyWait};
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Bytes of push frames (pub/sub messages) a session may hold unwritten.
pub(super) const PUSH_BUDGET: u32 = 4 * 1024 * 1024;

/// A reply position in the client's stream.
pub(super) enum Slot {
    /// A reply the proxy made, written once everything before it is written.
    Local(Bytes),
    /// A push that must not overtake the replies before it (a cluster invalidation, see
    /// `cluster::tracking`), written once they are, and the push budget it holds until then.
    Push { frame: Bytes, permits: u32 },
    /// `commands` replies coming from upstream as one `Reply::Batch`; dropped unwritten when
    /// the client switched replies off. `read_at` (when the batch's bytes were read) and
    /// `handling.name` (its first command) feed the latency histogram and the slow log.
    Upstream {
        commands: u32,
        handling: Handling,
        read_at: Instant,
        /// Cluster mode, shared connections: what was sent and where, so commands answered
        /// with MOVED or ASK can be sent again to the right node.
        sent: Option<Box<Sent>>,
        /// The batch's `seq`, which its reply echoes: in cluster mode replies from different
        /// nodes come in any order and are put in their slot by it.
        seq: u16,
        /// Slots the batch's replies fill: 1 for most; on the first slot of a scattered
        /// cluster batch, how many segments it has (the others have 0; see `scatter`).
        parts: u16,
    },
}

/// A batch sent to a cluster node, kept (a refcounted slice, not a copy) until its replies
/// are in.
pub(super) struct Sent {
    /// The batch's bytes as sent.
    pub(super) bytes: Bytes,
    /// The RESP version of the connection it went over.
    pub(super) proto: u8,
    /// The node it went to.
    pub(super) node: u16,
    /// Sent on the session's dedicated connection (a blocking command): a redirection is
    /// followed on a dedicated connection to the new node, never on a shared one it would
    /// block.
    pub(super) dedicated: bool,
    /// Redirections followed so far for this batch (dedicated only; shared batches follow
    /// theirs in one go).
    pub(super) redirects: u32,
    /// How long the command may block, kept for the batch sent again after a redirection.
    pub(super) wait: ReplyWait,
    /// The hash slots of the batch's keyed commands (one entry per command), counted in the
    /// session's `spread` until the replies are in.
    pub(super) hash_slots: Vec<u16>,
    /// Part of a transaction: a redirection inside it means the whole transaction moves.
    pub(super) transaction: super::conn::InTransaction,
}

/// How the replies of one upstream slot are treated.
#[derive(Debug, Default)]
pub(super) struct Handling {
    /// Dropped unwritten: the client switched replies off (CLIENT REPLY OFF/SKIP).
    pub(super) suppress: bool,
    /// A blocking command that may never answer: if the client goes away, the dedicated
    /// connection is closed to unblock it instead of waiting.
    pub(super) blocking: bool,
    /// How long the upstream may legitimately stay silent before answering: the blocking
    /// command's own timeout, so the command timeout does not cut it short.
    pub(super) wait: ReplyWait,
    /// Which reply frames of the batch the client sees (`None`: all). The others answer
    /// commands the proxy added: TTL PEXPIREs, WAIT's barrier, the HELLO after a raw AUTH.
    pub(super) mask: Option<Vec<bool>>,
    /// A classic UNSUBSCRIBE/PUNSUBSCRIBE: when its last confirmation counts 0 in cluster
    /// mode, the session holds no subscription any more and is released from its dedicated
    /// connection (it could otherwise reach only the node it subscribed on).
    pub(super) unsubscribe: bool,
    /// CLIENT INFO: rewrite the reply to describe this client.
    pub(super) client_info: bool,
    /// CLIENT GETREDIR/TRACKINGINFO: the redirect connection's id made its client's.
    pub(super) names_redirect: bool,
    /// A SUBSCRIBE-family command: its confirmations' counts are the client's `sub=`,
    /// `psub=` and `ssub=` in CLIENT LIST (`sub_counts`).
    pub(super) sub_counts: bool,
    /// RESET forwarded (`Effect::Reset`): the session resets once Redis answered it.
    pub(super) reset: bool,
    /// A forwarded HELLO: its reply is shaped as the one the proxy answers itself
    /// (`hello_as_seen`); in cluster mode it said `mode: cluster` (state fuzzer), which makes
    /// a client switch to cluster mode and ask for CLUSTER SLOTS.
    pub(super) hello: bool,
    /// INFO: what of its reply the proxy changes (`replies::info_as_seen`).
    pub(super) info: Option<InfoEdit>,
    /// CONFIG GET: remove the secret parameters from the reply.
    pub(super) config_get: bool,
    /// While a mirror runs (`mirror:`): the batch as sent and the RESP version it went in,
    /// handed to the mirror with the primary's replies once they are in.
    pub(super) mirror: Option<Box<crate::operations::mirror::Capture>>,
    /// The command's table entry (a run's first command's), for the latency class and the
    /// slow log, and the mirror's judgement of a lone command.
    pub(super) name: Option<&'static CommandSpec>,
    /// What few batches need, boxed: see [`Unusual`].
    pub(super) unusual: Option<Box<Unusual>>,
}

/// The parts of a batch's [`Handling`] that few batches need, boxed so that the reply slot
/// every batch takes stays small: with them inline `Slot` was 192 bytes and `Handling` 160,
/// and each move of one (into the reply order, out of it, a cluster segment replaced by its
/// reply) a `memcpy` call, about 30 instructions, several per request (callgrind,
/// docs/performance.md).
#[derive(Debug, Default)]
pub(super) struct Unusual {
    /// HELLO with the client's own AUTH, forwarded: applied once Redis answered it.
    pub(super) hello_auth: Option<HelloAuth>,
    /// EXEC of a transaction with hidden commands queued: which elements of EXEC's array the
    /// client sees.
    pub(super) exec_mask: Option<Vec<bool>>,
    /// Answer this instead of the upstream's reply (EXECABORT for a DISCARDed EXEC).
    pub(super) replace: Option<Bytes>,
    /// Remove the tenant's namespace prefix from key names in the reply (SCAN, KEYS).
    pub(super) strip: Option<Box<crate::policy::rewrite::Strip>>,
    /// Cluster mode: a script in flight on its node, which keyless commands go to until this
    /// is dropped with the reply (`Routing::script_sent`).
    pub(super) _script: Option<crate::topology::cluster::ScriptRun>,
}

impl Unusual {
    /// `Some` when any part is set: the box a batch needs, if any.
    pub(super) fn boxed_if_any(self) -> Option<Box<Unusual>> {
        let any = self.hello_auth.is_some()
            || self.exec_mask.is_some()
            || self.replace.is_some()
            || self.strip.is_some()
            || self._script.is_some();
        any.then(|| Box::new(self))
    }
}

/// A forwarded HELLO with the client's own AUTH, settled by Redis's answer: Redis switches
/// the protocol only if it accepts the AUTH, and a refused AUTH leaves the client as it was.
/// Taken at dispatch, the session read the connection's RESP2 replies as RESP3.
#[derive(Clone, Debug)]
pub(super) struct HelloAuth {
    /// The protocol asked for, the client's once Redis accepted it.
    pub(super) proto: u8,
    /// The client was on the proxy's login before (`Holds::OTHER_USER` not held): refused,
    /// it is again, and the connection dialled for this AUTH is dropped.
    pub(super) first_login: bool,
    /// Its options as Redis runs them: the name once Redis accepted the login (refused,
    /// the name stays), and whether a bad option after the AUTH makes Redis log the client
    /// in and answer an error.
    pub(super) options: crate::commands::grammar::HelloOptions,
}

/// How Redis took a forwarded HELLO with AUTH, from its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HelloOutcome {
    /// Answered: logged in, named, the protocol switched.
    Accepted,
    /// An error for an option after the AUTH (`HelloOptions::bad_after_auth`): Redis had
    /// logged the client in and named it; the protocol stays.
    LoggedIn,
    /// Refused (WRONGPASS, or before the AUTH), or not answered: nothing changed.
    Refused,
}

/// Sent before WAIT/WAITAOF on a dedicated connection when the client's writes went over the
/// shared one. WAIT counts acknowledgements of the *connection's* last propagated write; a
/// PUBLISH is propagated to replicas without touching the keyspace, so after it the dedicated
/// connection's offset covers every earlier write of this client (the session waited for those
/// to be answered before switching connections).
pub(super) const WAIT_BARRIER: &[u8] =
    b"*3\r\n$7\r\nPUBLISH\r\n$27\r\n__redis-policy-proxy__:wait\r\n$0\r\n\r\n";

/// The ordered reply stream: every command's place in it, what is in flight, and the bytes
/// ready to write.
#[derive(Default)]
pub(super) struct ReplyQueue {
    /// Reply order: proxy-made replies waiting behind upstream ones.
    pub(super) slots: VecDeque<Slot>,
    /// Upstream commands not yet answered.
    pub(super) inflight: usize,
    /// Where the latest batch went while commands are in flight (`None`: nothing in flight).
    /// Standalone, and whenever a dedicated connection is involved, every in-flight command
    /// went there.
    pub(super) inflight_target: Option<Target>,
    /// `seq` of the next batch sent on the session's reply channel.
    pub(super) next_seq: u16,
    /// The channel every upstream connection answers this session on.
    /// Created with the first upstream command, so an idle client costs no channel.
    pub(super) reply_tx: Option<ReplySender>,
    /// The receiving end of a channel just created, for `serve` to take.
    pub(super) new_reply_rx: Option<ReplyReceiver>,
    /// Budget of unwritten push bytes, shared with the dedicated connection.
    /// Created with the first dedicated connection: most clients never get a push.
    pub(super) push_budget: Option<Arc<Semaphore>>,
    /// Replies ready to write.
    pub(super) out: Vec<Bytes>,
    /// Push permits to return once `out` is written.
    pub(super) out_permits: u32,
    /// When the bytes of the upstream reply that last reached `out` at the head of the order
    /// were read, until `out` is written: while the next slot due came in the same read
    /// (`holds_out`), the write waits for it, so one read's replies go out in one write as
    /// Redis writes them. A pipeline scattered over cluster nodes otherwise cost the client a
    /// write, and a wake-up, per node that answered first.
    pub(super) out_read: Option<Instant>,
    /// Replies put in the reply order so far (a slot each, or a proxy-made reply written at
    /// once): with `mark_at`, whether a reply lies between two pushes in the client's stream
    /// (`cluster::flush_news::FlushNews`), written or not.
    pub(super) queued: u64,
}

impl HelloOutcome {
    /// The outcome of a login, `AUTH` (`None`) or a HELLO with `options`.
    pub(super) fn of_login(
        options: Option<&crate::commands::grammar::HelloOptions>,
        reply: &[u8],
    ) -> HelloOutcome {
        match options {
            Some(o) => HelloOutcome::of(o, reply),
            None if reply.first() == Some(&b'-') => HelloOutcome::Refused,
            None => HelloOutcome::Accepted,
        }
    }

    /// The outcome Redis's `reply` says, for a HELLO with `options`.
    pub(super) fn of(
        options: &crate::commands::grammar::HelloOptions,
        reply: &[u8],
    ) -> HelloOutcome {
        if reply.first() != Some(&b'-') {
            HelloOutcome::Accepted
        } else if options.bad_after_auth && !reply.starts_with(b"-WRONGPASS") {
            HelloOutcome::LoggedIn
        } else {
            HelloOutcome::Refused
        }
    }
}

impl ReplyQueue {
    /// Gives back the push budget of a push that is not written to the client.
    pub(super) fn return_permits(&self, permits: u32) {
        if let Some(budget) = &self.push_budget {
            budget.add_permits(permits as usize);
        }
    }

    /// The batch the reply with this `seq` answers, as it was sent (recorded for the
    /// batches a redirection or a failed replica may need sent again).
    pub(super) fn sent_of(&self, seq: u16) -> Option<&Sent> {
        match self.slot_of(seq).and_then(|i| self.slots.get(i)) {
            Some(Slot::Upstream {
                sent: Some(sent), ..
            }) => Some(sent),
            _ => None,
        }
    }

    /// Takes the slot at `at` out of the reply order (the head is removed, a later one left
    /// as an empty placeholder until its reply is in).
    pub(super) fn take(&mut self, at: Option<usize>) -> Option<Slot> {
        match at {
            Some(0) => self.slots.pop_front(),
            Some(i) => Some(std::mem::replace(
                &mut self.slots[i],
                Slot::Local(Bytes::new()),
            )),
            None => None,
        }
    }

    /// The replies pushed to `out` from `mark` on answer the slot at `at`: written now when
    /// it heads the reply order (with the proxy-made replies behind it), else kept in its
    /// slot until the earlier ones are in.
    pub(super) fn settle(&mut self, at: usize, mark: usize) {
        if at == 0 {
            self.flush_local_slots();
            return;
        }
        let mut own = self.out.split_off(mark);
        let reply = match own.len() {
            1 => own.pop().unwrap_or_default(),
            _ => own.concat().into(),
        };
        self.slots[at] = Slot::Local(reply);
    }

    /// The budget of unwritten push bytes shared with dedicated connections, created on
    /// first use.
    pub(super) fn push_budget(&mut self) -> Arc<Semaphore> {
        self.push_budget
            .get_or_insert_with(|| Arc::new(Semaphore::new(PUSH_BUDGET as usize)))
            .clone()
    }
    /// The session's reply channel, created on first use.
    pub(super) fn reply_sender(&mut self) -> crate::upstream::ReplySender {
        match &self.reply_tx {
            Some(tx) => tx.clone(),
            None => {
                let (tx, rx) = crate::upstream::reply_channel();
                self.reply_tx = Some(tx.clone());
                self.new_reply_rx = Some(rx);
                tx
            }
        }
    }
    /// Whether `out` waits for the next slot due before it is written: that slot's commands
    /// came in the same read as the reply that last reached `out`, and Redis answers them
    /// promptly (not a blocking command, which may wait for its own timeout). Replies the
    /// client's earlier reads are owed never wait behind a later read's.
    pub(super) fn holds_out(&self) -> bool {
        self.out_read.is_some_and(|read| {
            matches!(
                self.slots.front(),
                Some(Slot::Upstream { read_at, handling, .. })
                    if *read_at == read
                        && !handling.blocking
                        && handling.wait == crate::upstream::ReplyWait::Prompt
            )
        })
    }

    /// Moves proxy-made replies and held pushes at the head of the order to the output.
    pub(super) fn flush_local_slots(&mut self) {
        while let Some(Slot::Local(_) | Slot::Push { .. }) = self.slots.front() {
            match self.slots.pop_front() {
                Some(Slot::Local(b)) if !b.is_empty() => self.out.push(b),
                Some(Slot::Push { frame, permits }) => {
                    self.out.push(frame);
                    self.out_permits += permits;
                }
                _ => {}
            }
        }
    }

    /// Where `behind_due` puts a push: before the first blocking command's slot, else last.
    pub(super) fn behind_due_at(&self) -> usize {
        self.slots
            .iter()
            .position(|s| matches!(s, Slot::Upstream { handling, .. } if handling.blocking))
            .unwrap_or(self.slots.len())
    }

    /// Queues a push behind every reply still due, but before the first blocking command's
    /// (which may wait forever): written at once when none is due before that.
    pub(super) fn behind_due(&mut self, frame: Bytes, permits: u32) {
        let at = self.behind_due_at();
        if at == 0 {
            self.out.push(frame);
            self.out_permits += permits;
        } else {
            self.slots.insert(at, Slot::Push { frame, permits });
        }
    }
    /// The position of the slot a reply with this `seq` answers.
    pub(super) fn slot_of(&self, seq: u16) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| matches!(s, Slot::Upstream { seq: q, .. } if *q == seq))
    }
    /// The replies before position `at` of the reply order (`slots[at]`; 0: `out`'s end),
    /// counted since the session began: two pushes with the same mark have no reply between.
    pub(super) fn mark_at(&self, at: usize) -> u64 {
        let after = self.slots.range(at..);
        self.queued - after.filter(|s| !matches!(s, Slot::Push { .. })).count() as u64
    }

    /// Queues a proxy-made reply in order.
    pub(super) fn local(&mut self, reply: Bytes) {
        self.queued += 1;
        if self.slots.is_empty() {
            self.out.push(reply);
        } else {
            self.slots.push_back(Slot::Local(reply));
        }
    }
}
