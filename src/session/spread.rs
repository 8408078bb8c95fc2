//! Cluster mode: a session's commands in flight on several nodes at once, per hash slot.
//!
//! Replies are matched to their batch by `seq` (see `Session::on_reply`), so batches for
//! different nodes may be in flight together. What must still wait is a command for a hash
//! slot whose earlier commands went to another connection: if the slot map changed in
//! between (a migration, a failover), sending it would let it overtake them — and if those
//! are redirected, run before them on the new owner. So the session counts, per hash slot,
//! the commands in flight and the connection they went to.

use std::collections::HashMap;

use super::conn::Target;

/// Per-slot in-flight commands of one cluster session.
#[derive(Default)]
pub(super) struct Spread {
    /// Hash slot -> the shared connection its in-flight commands went to, and how many are
    /// in flight. Entries are removed at zero, so the map holds only what is in flight.
    slots: HashMap<u16, (Target, u32), crate::internal_hash::BuildInternalHasher>,
    /// The hash slot a paused command waits for, so processing resumes once that slot's
    /// commands are answered rather than when everything is; `None` while not paused on a
    /// slot.
    waiting_for: Option<u16>,
}

impl Spread {
    /// Whether a command for `slot` sent to `target` would overtake commands of the same
    /// slot in flight on another connection.
    pub(super) fn elsewhere(&self, slot: u16, target: Target) -> bool {
        self.slots.get(&slot).is_some_and(|(t, _)| *t != target)
    }

    /// Whether commands for `slot` are in flight at all.
    pub(super) fn in_flight(&self, slot: u16) -> bool {
        self.slots.contains_key(&slot)
    }

    /// Records a batch sent to `target` holding commands for these slots.
    pub(super) fn sent(&mut self, target: Target, slots: &[u16]) {
        for &slot in slots {
            let entry = self.slots.entry(slot).or_insert((target, 0));
            // `elsewhere` kept every other connection out while the slot is in flight.
            debug_assert_eq!(entry.0, target);
            entry.1 += 1;
        }
    }

    /// Records that a batch's commands for these slots are resolved (answered, or failed).
    pub(super) fn answered(&mut self, slots: &[u16]) {
        for slot in slots {
            if let Some(entry) = self.slots.get_mut(slot) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    self.slots.remove(slot);
                }
            }
        }
    }

    /// Remembers that processing paused for `slot`.
    pub(super) fn wait_for(&mut self, slot: u16) {
        self.waiting_for = Some(slot);
    }

    /// Whether processing paused for a slot that has nothing in flight any more; clears the
    /// wait when so.
    pub(super) fn resumable(&mut self) -> bool {
        match self.waiting_for {
            Some(slot) if !self.slots.contains_key(&slot) => {
                self.waiting_for = None;
                true
            }
            _ => false,
        }
    }

    /// Forgets a wait once everything in flight is answered (the pause then ends anyway).
    pub(super) fn clear_wait(&mut self) {
        self.waiting_for = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_slot_and_connection() {
        let a = Target::Shared(2, 0);
        let b = Target::Shared(2, 1);
        let mut spread = Spread::default();
        spread.sent(a, &[7, 7, 9]);
        assert!(spread.elsewhere(7, b));
        assert!(!spread.elsewhere(7, a));
        assert!(!spread.elsewhere(8, b));
        spread.wait_for(7);
        spread.answered(&[7]);
        assert!(!spread.resumable());
        spread.answered(&[7, 9]);
        assert!(!spread.in_flight(7) && !spread.in_flight(9));
        assert!(spread.resumable());
        assert!(!spread.resumable());
    }
}
