//! The slow log: the latest commands whose reply took longer than a threshold, like Redis's
//! SLOWLOG, read with `PROXY SLOWLOG`. Entries name the command, never its keys or values.
//!
//! Latency is measured per upstream batch (read to reply ready), so an entry is one batch: its
//! first command and how many others shared the wait.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One slow batch.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Increasing id, as Redis's.
    pub id: u64,
    /// Unix time (seconds) the reply came.
    pub(crate) at: u64,
    /// Read to reply ready.
    pub(crate) duration: Duration,
    /// The batch's first command (upper case, subcommand included).
    pub(crate) command: String,
    /// Commands in the batch besides the first.
    pub(crate) others: u32,
    /// The client.
    pub client: SocketAddr,
}

/// The bounded log.
#[derive(Debug)]
pub(crate) struct SlowLog {
    /// Entries are kept for batches at least this slow; `Duration::MAX` turns the log off.
    threshold: Duration,
    /// Most entries kept; the oldest go first.
    max_len: usize,
    /// Newest first.
    entries: Mutex<VecDeque<Entry>>,
    next_id: AtomicU64,
}

impl SlowLog {
    pub(crate) fn new(threshold: Duration, max_len: usize) -> SlowLog {
        SlowLog {
            threshold,
            max_len,
            entries: Mutex::new(VecDeque::new()),
            next_id: AtomicU64::new(0),
        }
    }

    /// Whether a batch this slow is logged; checked before building an entry.
    #[inline]
    pub(crate) fn is_slow(&self, d: Duration) -> bool {
        d >= self.threshold && self.max_len > 0
    }

    /// Records a slow batch.
    pub(crate) fn record(
        &self,
        duration: Duration,
        command: &str,
        others: u32,
        client: SocketAddr,
    ) {
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let entry = Entry {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            at,
            duration,
            command: command.to_ascii_uppercase().replace('|', " "),
            others,
            client,
        };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.push_front(entry);
        entries.truncate(self.max_len);
    }

    /// The newest `n` entries.
    pub(crate) fn latest(&self, n: usize) -> Vec<Entry> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.iter().take(n).cloned().collect()
    }

    /// Entries kept.
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    #[cfg(test)]
    /// Whether nothing is logged.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every entry.
    pub(crate) fn reset(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_entries_up_to_max_len() {
        let log = SlowLog::new(Duration::from_millis(10), 2);
        assert!(!log.is_slow(Duration::from_millis(9)));
        assert!(log.is_slow(Duration::from_millis(10)));
        let client = SocketAddr::from(([127, 0, 0, 1], 1));
        for name in ["get", "client|list", "hgetall"] {
            log.record(Duration::from_millis(20), name, 0, client);
        }
        let got = log.latest(10);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].command, "HGETALL");
        assert_eq!(got[1].command, "CLIENT LIST");
        assert_eq!(got[0].id, 2);
        log.reset();
        assert!(log.is_empty());
    }
}
