//! Budgets of log events: `LogBudget` bounds how many events are logged a second and counts
//! the rest. The policy keeps two (denials, and audit-mode events, so audits cannot crowd
//! denials out); `evaluate` logs under them.

use std::sync::atomic::{AtomicU64, Ordering};

/// A per-second budget of log events, lock-free: the second and the count of events in it.
#[derive(Debug)]
pub(super) struct LogBudget {
    /// Events allowed per second; 0 logs nothing.
    pub(super) per_second: u32,
    /// Seconds since the budget was made, in the high 32 bits; events logged that second in
    /// the low 32. One word, so one compare-exchange updates both.
    state: AtomicU64,
    /// Events left out since the last one logged.
    suppressed: AtomicU64,
    /// Origin of the second count.
    origin: tokio::time::Instant,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget {
            per_second: 10,
            state: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            origin: tokio::time::Instant::now(),
        }
    }
}

impl LogBudget {
    /// `Some(events left out before this one)` when this event may be logged.
    pub(super) fn take(&self) -> Option<u64> {
        let now = self.origin.elapsed().as_secs() & 0xffff_ffff;
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            let (second, count) = (state >> 32, state & 0xffff_ffff);
            let next = if second == now {
                if count >= u64::from(self.per_second) {
                    self.suppressed.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                state + 1
            } else if self.per_second == 0 {
                self.suppressed.fetch_add(1, Ordering::Relaxed);
                return None;
            } else {
                (now << 32) | 1
            };
            match self.state.compare_exchange_weak(
                state,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(self.suppressed.swap(0, Ordering::Relaxed)),
                Err(actual) => state = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_log_budget_logs_its_events_per_second_and_counts_the_rest() {
        let budget = LogBudget {
            per_second: 2,
            ..LogBudget::default()
        };
        assert_eq!(budget.take(), Some(0));
        assert_eq!(budget.take(), Some(0));
        assert_eq!(
            budget.take(),
            None,
            "the third event of the second is left out"
        );
        assert_eq!(budget.take(), None);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(budget.take(), None, "still the same second");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            budget.take(),
            Some(3),
            "the next one logged reports the three left out"
        );
        assert_eq!(budget.take(), Some(0));
        assert_eq!(budget.take(), None);
        let silent = LogBudget {
            per_second: 0,
            ..LogBudget::default()
        };
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(silent.take(), None);
        assert_eq!(silent.take(), None);
    }
}
