//! Cluster mode: transactions whose slot moved. A node that answers MOVED, ASK or TRYAGAIN
//! to a command queued in MULTI, or to EXEC itself, has run nothing of the transaction
//! (Redis checks slot ownership before queuing, and again for the whole transaction before
//! EXEC runs it, then discards it). So the proxy keeps the commands it queued and, when the
//! transaction ends that way, sends `MULTI`, the same commands and `EXEC` to the node the
//! redirection names, and answers the client's EXEC with that result. Queued commands that
//! were redirected are answered `+QUEUED`: to the client they are queued, and they run in the
//! replay. Under WATCH the watch cannot move with the slot, so EXEC answers a null array,
//! which every client already reads as "a watched key changed: retry".
//!
//! This watches the replies of the session's dedicated connection, not its requests: the
//! proxy keeps reading and queuing while replies are on their way, so the request side may
//! already be in the next transaction when this one's replies come back.

use super::ClusterSession;
use super::again::{Again, again_of};
use super::merge::{Merge, unexpected};
use super::state::TxLog;
use crate::protocol::codec::split_commands;
use crate::protocol::codec::{CodecLimits, Decoded};
use crate::protocol::error::{ProxyError, error_reply};
use crate::protocol::{answers, codec};
use crate::session::conn::InTransaction;
use crate::topology::cluster::Router;
use crate::upstream::Reply;
use bytes::{Bytes, BytesMut};

/// Redis's answer to a command queued in MULTI.
const QUEUED: &[u8] = b"+QUEUED\r\n";

/// Sent before `MULTI` in a replay that follows an ASK: the flag lasts through the
/// transaction (Redis keeps `ASKING` set while the client is in MULTI), so EXEC may run
/// on the importing node.
const ASKING: &[u8] = b"*1\r\n$6\r\nASKING\r\n";

const MULTI: &[u8] = b"*1\r\n$5\r\nMULTI\r\n";
const EXEC: &[u8] = b"*1\r\n$4\r\nEXEC\r\n";

/// What a transaction's EXEC reply becomes.
enum ExecOutcome {
    /// Ran (or failed) as Redis said: passed on.
    AsIs,
    /// Nothing ran because the slot moved: replay, starting from this redirection.
    Replay(Again),
}

impl ClusterSession<'_> {
    /// Reads the replies of a batch that is part of a transaction (`how`), recording what
    /// was queued and, where a redirection means nothing ran, answering in its place: queued
    /// commands `+QUEUED`, EXEC with the replayed transaction's result (or null under WATCH).
    pub(in crate::session) async fn transaction_reply(
        &mut self,
        msg: &mut Reply,
        how: InTransaction,
    ) {
        let Reply::Batch { data, seq, .. } = msg else {
            return;
        };
        let router = self.cluster.router.clone();
        let Some(sent) = self.queue.sent_of(*seq) else {
            return;
        };
        let (bytes, proto, from) = (sent.bytes.clone(), sent.proto, sent.node);
        let commands = split_commands(&bytes, &self.ctx.codec);
        let mut frames = crate::protocol::reply::split(data);
        let origin = router.addr(from);
        let mut log = self.cluster.tx_log.take().unwrap_or_default();
        let mut changed = false;
        for (command, frame) in commands.iter().zip(frames.iter_mut()) {
            match command_name(command, &self.ctx.codec) {
                Some(n) if n.eq_ignore_ascii_case(b"MULTI") => {
                    *log = TxLog {
                        open: true,
                        ..TxLog::default()
                    };
                }
                Some(n) if n.eq_ignore_ascii_case(b"EXEC") && log.open => {
                    if let Some(again) = again_of(frame, &origin) {
                        self.note_redirect(&router, &again);
                    }
                    let outcome = exec_outcome(frame, &origin, log.again.take());
                    let mut ran_on = from;
                    if let ExecOutcome::Replay(again) = outcome {
                        (*frame, ran_on) = match how {
                            InTransaction::Watched => (answers::null_array(proto), from),
                            _ => self.replay(&router, proto, &log.queued, again).await,
                        };
                        changed = true;
                    }
                    if self
                        .spread_after_exec(&router, proto, &log.queued, ran_on, frame)
                        .await
                    {
                        changed = true;
                    }
                    *log = TxLog::default();
                }
                Some(n) if n.eq_ignore_ascii_case(b"DISCARD") => *log = TxLog::default(),
                _ if log.open => {
                    log.queued.push(command.clone());
                    if let Some(again) = again_of(frame, &origin) {
                        self.note_redirect(&router, &again);
                        log.again.get_or_insert(again);
                        *frame = Bytes::from_static(QUEUED);
                        changed = true;
                    }
                }
                _ => {}
            }
        }
        if log.open {
            self.cluster.tx_log = Some(log);
        }
        if changed {
            *data = frames.concat().into();
        }
    }

    /// After EXEC ran a transaction on `ran_on` (its reply `exec`): each command queued in
    /// it that goes to every primary (`gather::keyspace_merge`: FLUSHALL, FLUSHDB, CONFIG
    /// SET, SCRIPT LOAD, SLOWLOG RESET…, and the reads DBSIZE, KEYS, INFO, SLOWLOG GET/LEN,
    /// SCRIPT EXISTS, RANDOMKEY) and succeeded there is sent to each other primary, and its
    /// element of the reply becomes the merged answer as outside MULTI (the first error, the
    /// sum, the keys of every node…), as one server's transaction would have applied it to,
    /// or read it from, the whole keyspace. Not atomic across nodes: the others run it after
    /// EXEC, as a split MGET reads each node in turn. Nothing is sent when the transaction
    /// did not run (a null or an error). Whether `exec` changed.
    async fn spread_after_exec(
        &self,
        router: &Router,
        proto: u8,
        queued: &[Bytes],
        ran_on: u16,
        exec: &mut Bytes,
    ) -> bool {
        let spread: Vec<(usize, Merge)> = queued
            .iter()
            .enumerate()
            .filter_map(|(i, command)| {
                spread_merge(command, &self.ctx.codec, router.slowlog_max_len()).map(|m| (i, m))
            })
            .collect();
        if spread.is_empty() {
            return false;
        }
        let Some(mut elements) = crate::protocol::reply::array_elements(exec) else {
            return false;
        };
        let Some(header_end) = memchr::memchr(b'\n', exec) else {
            return false;
        };
        let others: Vec<u16> = router
            .snapshot()
            .primaries()
            .iter()
            .copied()
            .filter(|&node| node != ran_on)
            .collect();
        let mut changed = false;
        for (i, merge) in spread {
            let Some(element) = elements.get(i).filter(|e| !e.starts_with(b"-")).cloned() else {
                continue;
            };
            let mut replies = vec![element];
            for &node in &others {
                replies.push(
                    match self
                        .exchange(router, node, proto, queued[i].clone(), 1)
                        .await
                    {
                        (_, Some(e)) => error_reply(&ProxyError::Upstream(*e)),
                        (data, None) => data,
                    },
                );
            }
            elements[i] = super::merge::merge(merge, &replies, 0);
            changed = true;
        }
        let mut out = BytesMut::from(&exec[..=header_end]);
        for element in &elements {
            out.extend_from_slice(element);
        }
        *exec = out.freeze();
        changed
    }

    /// Sends `MULTI`, `queued` and `EXEC` where `again` says, following further
    /// redirections up to `max_redirects`, and returns EXEC's reply and the node that
    /// answered it. The replay goes over
    /// the node's shared connection as one batch: nothing of another client's can come
    /// between its commands, and the connection is out of MULTI again after EXEC.
    async fn replay(
        &self,
        router: &Router,
        proto: u8,
        queued: &[Bytes],
        mut again: Again,
    ) -> (Bytes, u16) {
        for round in 0..router.max_redirects() {
            if let Again::TryAgain(_) = again {
                // The slot's keys are split by a migration for a moment.
                let wait = 10 * u64::from(round + 1);
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            } else if round > 0 {
                self.note_redirect(router, &again);
            }
            let dest = again.addr().clone();
            let ask = again.is_ask();
            let mut out = BytesMut::new();
            if ask {
                out.extend_from_slice(ASKING);
            }
            out.extend_from_slice(MULTI);
            for command in queued {
                out.extend_from_slice(command);
            }
            out.extend_from_slice(EXEC);
            let frames = queued.len() + 2 + usize::from(ask);
            let node = router.node(&dest);
            let data = match self
                .exchange(router, node, proto, out.freeze(), frames as u32)
                .await
            {
                (_, Some(e)) => return (error_reply(&ProxyError::Upstream(*e)), node),
                (data, None) => data,
            };
            let got = crate::protocol::reply::split(&data);
            let Some(exec) = got.last() else {
                return (unexpected(&data), node);
            };
            let first_queued = 1 + usize::from(ask);
            let redirected = got[first_queued.min(got.len() - 1)..got.len() - 1]
                .iter()
                .find_map(|f| again_of(f, &dest));
            match exec_outcome(exec, &dest, redirected) {
                ExecOutcome::AsIs => return (exec.clone(), node),
                ExecOutcome::Replay(next) => again = next,
            }
        }
        let slot = match &again {
            Again::Redirect(r) => r.slot().to_string(),
            Again::TryAgain(_) => "in migration".to_string(),
        };
        // Nothing ran: the error's node is not used.
        (answers::too_many_redirections(slot), u16::MAX)
    }
}

/// Whether a transaction whose queued commands got `queued_again` (their first
/// redirection) and whose EXEC got `exec` ran nothing because its slot is elsewhere.
fn exec_outcome(exec: &[u8], answered_by: &str, queued_again: Option<Again>) -> ExecOutcome {
    if let Some(again) = again_of(exec, answered_by) {
        return ExecOutcome::Replay(again);
    }
    match queued_again {
        // Only a redirection explains this EXECABORT: any other error while queuing would
        // have reached the client as it was, and aborts the replay as well.
        Some(again) if exec.starts_with(b"-EXECABORT") => ExecOutcome::Replay(again),
        _ => ExecOutcome::AsIs,
    }
}

/// How a command queued in a transaction is merged once EXEC ran it and each other primary
/// answered it too (`Session::spread_after_exec`); `None` for one that stays on the
/// transaction's node. `slowlog_len`: the length one server's slow log keeps.
fn spread_merge(command: &[u8], limits: &CodecLimits, slowlog_len: Option<usize>) -> Option<Merge> {
    let mut ranges = Vec::new();
    if !matches!(
        codec::decode(command, limits, &mut ranges),
        Ok(Some(Decoded::Command { .. }))
    ) {
        return None;
    }
    let argv: Vec<&[u8]> = ranges.iter().map(|r| &command[r.clone()]).collect();
    super::gather::keyspace_merge(&argv[..], slowlog_len).filter(|m| m.runs_after_exec())
}

/// The name of one encoded command.
pub(super) fn command_name<'a>(command: &'a [u8], limits: &CodecLimits) -> Option<&'a [u8]> {
    let mut ranges = Vec::new();
    match codec::decode(command, limits, &mut ranges) {
        Ok(Some(Decoded::Command { .. })) => ranges.first().map(|r| &command[r.clone()]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_outcome_replays_only_after_a_redirection() {
        let moved = b"-MOVED 3999 127.0.0.1:7001\r\n";
        let abort = b"-EXECABORT Transaction discarded because of previous errors.\r\n";
        let queued_moved = || again_of(moved, "127.0.0.1:7000");
        assert!(matches!(
            exec_outcome(moved, "127.0.0.1:7000", None),
            ExecOutcome::Replay(_)
        ));
        assert!(matches!(
            exec_outcome(abort, "127.0.0.1:7000", queued_moved()),
            ExecOutcome::Replay(_)
        ));
        // A transaction aborted for another reason stays aborted.
        assert!(matches!(
            exec_outcome(abort, "127.0.0.1:7000", None),
            ExecOutcome::AsIs
        ));
        assert!(matches!(
            exec_outcome(b"*1\r\n+OK\r\n", "127.0.0.1:7000", queued_moved()),
            ExecOutcome::AsIs
        ));
        assert!(matches!(
            exec_outcome(
                b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
                "a:1",
                None
            ),
            ExecOutcome::Replay(Again::TryAgain(_))
        ));
    }

    #[test]
    fn command_names() {
        let limits = CodecLimits::default();
        assert_eq!(command_name(MULTI, &limits), Some(&b"MULTI"[..]));
        assert_eq!(
            command_name(b"*1\r\n$4\r\nexec\r\n", &limits),
            Some(&b"exec"[..])
        );
        assert_eq!(command_name(b"*1\r\n$4\r\nEX", &limits), None);
    }
}
