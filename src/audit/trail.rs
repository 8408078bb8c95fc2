//! One session's forwarded, audited commands waiting for their replies, so each entry is
//! written with its latency and whether the upstream answered. Bounded: past `MAX_WAITING`
//! the oldest is written without a latency rather than held.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::time::Instant;

use super::{Audit, Entry, Outcome};

/// Entries one session keeps waiting for replies at most.
const MAX_WAITING: usize = 1024;

/// A session's audited commands in flight, in the order they were sent.
pub struct Trail {
    /// Where finished entries go.
    audit: Arc<Audit>,
    /// Each entry with the instant its command's bytes were read, which its batch's reply
    /// carries back (`Slot::Upstream::read_at`): commands of one read share it.
    waiting: VecDeque<(Instant, Entry)>,
}

impl Trail {
    /// An empty trail writing to `audit`.
    pub fn new(audit: Arc<Audit>) -> Trail {
        Trail {
            audit,
            waiting: VecDeque::new(),
        }
    }

    /// Keeps `entry`, read at `read_at`, until its reply.
    pub fn sent(&mut self, read_at: Instant, entry: Entry) {
        if self.waiting.len() >= MAX_WAITING
            && let Some((_, oldest)) = self.waiting.pop_front()
        {
            self.audit.record(oldest);
        }
        self.waiting.push_back((read_at, entry));
    }

    /// A batch read at `read_at` with `commands` replies came back (`failed`: the upstream
    /// failed before answering all of them). Entries read earlier belong to batches answered
    /// elsewhere (or never sent) and are written without a latency; then up to `commands`
    /// entries of this read get the batch's latency.
    pub fn answered(&mut self, read_at: Instant, commands: u32, failed: bool) {
        let took = read_at.elapsed();
        while let Some((at, _)) = self.waiting.front() {
            if *at >= read_at {
                break;
            }
            if let Some((_, e)) = self.waiting.pop_front() {
                self.audit.record(e);
            }
        }
        for _ in 0..commands {
            match self.waiting.front() {
                Some((at, _)) if *at == read_at => {}
                _ => break,
            }
            if let Some((_, mut e)) = self.waiting.pop_front() {
                e.latency_us = Some(took.as_micros() as u64);
                if failed {
                    e.outcome = Outcome::Error;
                }
                self.audit.record(e);
            }
        }
    }
}

impl Drop for Trail {
    /// The session ended with commands unanswered: their entries are written as they are.
    fn drop(&mut self) {
        for (_, e) in self.waiting.drain(..) {
            self.audit.record(e);
        }
    }
}
