//! The gate a session passes to take new commands from its client, closed only while the
//! standalone upstream is switched to another server (a migration's cutover,
//! `mirror::cutover`): no command is decided and sent while it is closed, so none reaches the
//! old server after the switch began nor the new one before the old one answered everything
//! sent to it.
//!
//! A session counts itself in while it decides and sends commands ([`Gate::enter`], one
//! uncontended atomic add and a load) and out when done ([`Gate::leave`]); it looks at the gate
//! again before each command, and stops taking commands when it is closed, while it keeps
//! writing the replies of those in flight. The switch closes the gate, then waits for the
//! count to drain (Dekker-style: a session counts itself in, then looks; the switch closes,
//! then looks), and opens it with a wake-up of every session.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// The gate.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    /// Closed: a switch runs; sessions take no new command.
    closed: AtomicBool,
    /// Sessions deciding and sending commands now.
    passing: AtomicUsize,
    /// Wakes every session (it is the sessions' idle tick, `session::Context::idle_tick`):
    /// those that stopped at the closed gate go on when it opens.
    wake: Arc<Notify>,
}

impl Gate {
    /// The wake-up every session waits on (its idle tick).
    pub(crate) fn sessions_wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }

    /// Counts the session in to take commands; `false` (not counted) when the gate is closed.
    #[inline]
    pub(crate) fn enter(&self) -> bool {
        self.passing.fetch_add(1, Ordering::SeqCst);
        if !self.closed.load(Ordering::SeqCst) {
            return true;
        }
        self.leave();
        false
    }

    /// Counts a session that [entered](Gate::enter) out.
    #[inline]
    pub(crate) fn leave(&self) {
        self.passing.fetch_sub(1, Ordering::Release);
    }

    /// Whether a switch holds the gate closed now (checked before each command).
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Closes the gate and waits (at most `within`) until no session is deciding or sending
    /// commands; `false` if some still were by then.
    pub(crate) async fn close(&self, within: Duration) -> bool {
        self.closed.store(true, Ordering::SeqCst);
        // Sessions stop at their next command (or once a full upstream queue takes their
        // batch).
        drained(&self.passing, tokio::time::Instant::now() + within).await
    }

    /// Opens the gate and wakes every session, so those that stopped at it go on.
    pub(crate) fn open(&self) {
        self.closed.store(false, Ordering::SeqCst);
        self.wake.notify_waiters();
    }
}

/// Waits until `count` reads zero, or `until`; whether it did. A 1 ms poll: it runs only
/// during a switch, where a wake-up on every decrement would cost each session's hot path.
pub(crate) async fn drained(count: &AtomicUsize, until: tokio::time::Instant) -> bool {
    while count.load(Ordering::SeqCst) > 0 {
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closing_waits_for_sessions_inside_and_shuts_out_the_rest() {
        let gate = Arc::new(Gate::default());
        assert!(gate.enter());
        let closing = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.close(Duration::from_secs(5)).await })
        };
        tokio::task::yield_now().await;
        assert!(!closing.is_finished(), "a session is still inside");
        assert!(gate.is_closed());
        assert!(!gate.enter(), "closed to newcomers");
        gate.leave();
        assert!(closing.await.unwrap());
        let wake = gate.sessions_wake();
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        gate.open();
        woken.await;
        assert!(gate.enter());
    }

    #[tokio::test]
    async fn closing_gives_up_after_its_deadline() {
        let gate = Gate::default();
        assert!(gate.enter());
        assert!(!gate.close(Duration::from_millis(20)).await);
    }
}
