//! One session's forwarded commands that the audit trail or the keyspace statistics follow,
//! waiting for their replies: an audit entry is written with its latency and whether the
//! upstream answered, a keyspace sample gets its reply's bytes. Bounded: past `MAX_WAITING`
//! the oldest is let go (its entry written without a latency) rather than held.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::time::Instant;

use super::{Audit, Entry, Outcome};
use crate::observe::keyspace::{Keyspace, Sample};

/// Commands one session keeps waiting for replies at most.
const MAX_WAITING: usize = 1024;

/// One followed command.
struct Waiting {
    /// When its bytes were read, which its batch's reply carries back
    /// (`Slot::Upstream::read_at`): the commands of one read share it.
    read_at: Instant,
    /// Its audit entry, if audited.
    entry: Option<Entry>,
    /// Its keyspace sample, if sampled.
    sample: Option<Sample>,
}

/// A session's followed commands in flight, in the order they were sent.
pub(crate) struct Trail {
    /// Where finished entries go.
    audit: Option<Arc<Audit>>,
    /// Where reply bytes are counted.
    keyspace: Option<Arc<Keyspace>>,
    /// In the order sent.
    waiting: VecDeque<Waiting>,
}

impl Trail {
    /// An empty trail writing to `audit` and counting in `keyspace`.
    pub(crate) fn new(audit: Option<Arc<Audit>>, keyspace: Option<Arc<Keyspace>>) -> Trail {
        Trail {
            audit,
            keyspace,
            waiting: VecDeque::new(),
        }
    }

    /// Follows a command read at `read_at` until its reply.
    pub(crate) fn sent(&mut self, read_at: Instant, entry: Option<Entry>, sample: Option<Sample>) {
        if self.waiting.len() >= MAX_WAITING
            && let Some(oldest) = self.waiting.pop_front()
        {
            self.finish(oldest, None, false, 0);
        }
        self.waiting.push_back(Waiting {
            read_at,
            entry,
            sample,
        });
    }

    /// A batch read at `read_at` with `commands` replies (`bytes` of them) came back
    /// (`failed`: the upstream failed before answering all of them). Commands read earlier
    /// belong to batches answered elsewhere (or never sent) and are let go; then up to
    /// `commands` of this read get the batch's latency and a share of its bytes.
    pub(crate) fn answered(&mut self, read_at: Instant, commands: u32, failed: bool, bytes: usize) {
        while self.waiting.front().is_some_and(|w| w.read_at < read_at) {
            if let Some(w) = self.waiting.pop_front() {
                self.finish(w, None, false, 0);
            }
        }
        let mine = self
            .waiting
            .iter()
            .take(commands as usize)
            .take_while(|w| w.read_at == read_at)
            .count();
        let took = read_at.elapsed().as_micros() as u64;
        let share = bytes / mine.max(1);
        for _ in 0..mine {
            if let Some(w) = self.waiting.pop_front() {
                self.finish(w, Some(took), failed, share);
            }
        }
    }

    fn finish(&self, w: Waiting, latency_us: Option<u64>, failed: bool, bytes: usize) {
        if let (Some(audit), Some(mut e)) = (&self.audit, w.entry) {
            e.latency_us = latency_us;
            if failed {
                e.outcome = Outcome::Error;
            }
            audit.record(e);
        }
        if let (Some(keyspace), Some(s)) = (&self.keyspace, w.sample) {
            keyspace.answered(&s, bytes);
        }
    }
}

impl Drop for Trail {
    /// The session ended with commands unanswered: their entries are written as they are.
    fn drop(&mut self) {
        while let Some(w) = self.waiting.pop_front() {
            self.finish(w, None, false, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64) -> Entry {
        crate::observe::audit::recorder::tests::entry_of(id)
    }

    #[test]
    fn replies_complete_the_entries_of_their_read_in_order() {
        let (audit, rx) =
            crate::observe::audit::recorder::tests::audit(crate::config::AuditCommands::All, 16);
        let audit = Arc::new(audit);
        let mut trail = Trail::new(Some(audit), None);
        let first = Instant::now();
        let second = first + std::time::Duration::from_millis(1);
        let third = second + std::time::Duration::from_millis(1);
        trail.sent(first, Some(entry(1)), None);
        trail.sent(second, Some(entry(2)), None);
        trail.sent(second, Some(entry(3)), None);
        trail.sent(third, Some(entry(4)), None);
        // The batch of the second read fails: its two entries are errors with a latency,
        // the first read's entry (answered elsewhere) is written without one.
        trail.answered(second, 2, true, 10);
        let got: Vec<Entry> = rx.try_iter().collect();
        assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(got[0].latency_us, None);
        assert!(got[1].latency_us.is_some() && got[1].outcome == Outcome::Error);
        // The session ends with the third read unanswered: written as it is.
        drop(trail);
        let rest: Vec<Entry> = rx.try_iter().collect();
        assert_eq!(rest.len(), 1);
        assert_eq!((rest[0].id, rest[0].outcome), (4, Outcome::Forwarded));
    }
}
