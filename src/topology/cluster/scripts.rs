//! The cluster nodes running a script a session sent, so that keyless commands go to the
//! node of the oldest one while it runs.
//!
//! One Redis running a long script answers every other client `-BUSY` until it ends or
//! `SCRIPT KILL` ends it, and clients (and Redis's own suite) rely on that: a PING tells
//! whether the server is stuck in a script. A cluster's keyless commands may go to any
//! primary; spread by client id, a PING went to a node the script does not hold and got
//! PONG. While a script runs, keyless commands go to its node instead and get Redis's own
//! answer there (BUSY once the script passed `busy-reply-threshold`, the reply otherwise),
//! as from one server. Keyed commands still go to their slot's owner: a cluster serves the
//! other nodes' keys meanwhile, which no client can tell from a faster server.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The scripts in flight on sessions' dedicated connections, by node.
#[derive(Debug, Default)]
pub(crate) struct ScriptsRunning {
    /// How many are in flight: a keyless command reads this one atomic when none runs (the
    /// common case) and takes the lock only when one does.
    count: AtomicUsize,
    /// The scripts in flight by start order (a sequence number) and their nodes: the first is
    /// the oldest, the one most likely to hold its node busy.
    runs: Mutex<Runs>,
}

/// `ScriptsRunning`'s locked part.
#[derive(Debug, Default)]
struct Runs {
    /// Start order → node of each script in flight.
    by_start: BTreeMap<u64, u16>,
    /// The next start's sequence number.
    next: u64,
}

impl ScriptsRunning {
    /// A script was sent to `node`: it counts as running until the returned guard is dropped
    /// (its reply came, or its session ended).
    pub(crate) fn started(self: &Arc<Self>, node: u16) -> ScriptRun {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = runs.next;
        runs.next += 1;
        runs.by_start.insert(seq, node);
        self.count.fetch_add(1, Ordering::Relaxed);
        ScriptRun {
            scripts: self.clone(),
            seq,
        }
    }

    /// The node of the oldest script in flight, if any.
    pub(crate) fn node(&self) -> Option<u16> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        runs.by_start.first_key_value().map(|(_, &node)| node)
    }
}

/// A script in flight; dropped when it is answered or its session ends.
#[derive(Debug)]
pub(crate) struct ScriptRun {
    /// Where it is counted.
    scripts: Arc<ScriptsRunning>,
    /// Its start's sequence number, its key in `ScriptsRunning::runs`.
    seq: u64,
}

impl Drop for ScriptRun {
    fn drop(&mut self) {
        let mut runs = self
            .scripts
            .runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if runs.by_start.remove(&self.seq).is_some() {
            self.scripts.count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_running_script_names_the_node() {
        let scripts = Arc::new(ScriptsRunning::default());
        assert_eq!(scripts.node(), None);
        let first = scripts.started(2);
        let second = scripts.started(0);
        assert_eq!(scripts.node(), Some(2));
        drop(first);
        assert_eq!(scripts.node(), Some(0));
        let third = scripts.started(1);
        assert_eq!(scripts.node(), Some(0));
        drop(second);
        assert_eq!(scripts.node(), Some(1));
        drop(third);
        assert_eq!(scripts.node(), None);
        assert_eq!(scripts.count.load(Ordering::Relaxed), 0);
    }
}
