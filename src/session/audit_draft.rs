//! Where a command keeps what the audit trail and keyspace statistics took from it until it
//! is dispatched (`Slot`, `Draft`; filled and completed by `audited`).

use crate::observe::audit::Entry;

/// What the audit trail and the keyspace statistics took from a decided command.
pub(super) struct Draft {
    /// Its audit entry so far (the outcome is set when it is dispatched).
    pub(super) entry: Option<Entry>,
    /// Its keyspace measurement, counted if it is forwarded.
    pub(super) measured: Option<crate::observe::keyspace::Measured>,
}

/// Where a command keeps its draft until it is dispatched: taken (not copied) by the one
/// place that completes it. A lock around it rather than a plain `Option` because the
/// command is only borrowed there, across awaits (so it must be `Sync`); boxed, so the
/// pending command grows by one word, and a command without a draft (nearly all: no audit
/// trail, no keyspace statistics) touches no atomic at all. An `ArcSwapOption` did the job
/// before, but its swap and its drop wait for readers on every command: 1.9% of the
/// proxy's CPU at `-P 16` in cluster mode (perf, 2026-12-05).
#[derive(Default)]
pub(super) struct Slot(pub(super) Option<Box<std::sync::Mutex<Option<Draft>>>>);

impl Slot {
    /// The draft, once.
    pub(super) fn take(&self) -> Option<Draft> {
        let lock = self.0.as_ref()?;
        lock.lock().map_or(None, |mut d| d.take())
    }
}
