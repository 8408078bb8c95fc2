//! What the log says about one upstream node going down and coming back.
//!
//! A pool has several connections to its node (a shared one per RESP version and the control
//! connection), each retried with backoff by its own supervisor. Logging every failure of every
//! connection gave three identical WARN lines per retry for as long as Redis was down. Instead
//! the pool's connections report to one [`Outage`]: the first failure is logged at WARN, then
//! while the node stays down one summary at growing intervals (how long, how many failures,
//! the latest error), and the recovery once at INFO. The metrics still count every failure.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Delay before the first "still down" summary; it doubles after each summary.
const FIRST_SUMMARY: Duration = Duration::from_secs(10);
/// Longest delay between two summaries of one outage.
const MAX_SUMMARY_INTERVAL: Duration = Duration::from_secs(300);

/// Which of a pool's connections reports: the log names it, so the proxy's own control
/// connection is never mistaken for one that carries clients' commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Carries clients' commands, pipelined.
    Shared,
    /// The proxy's own commands (shared rate-limit scripts, probes).
    Control,
}

impl Role {
    /// As logged.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Shared => "shared",
            Role::Control => "control",
        }
    }
}

/// What to log for one failure.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Report {
    /// The first failure of an outage: log it at WARN.
    First,
    /// The outage goes on: log a summary of `failures` since `down_for` ago at WARN.
    StillDown {
        /// Since the outage's first failure.
        down_for: Duration,
        /// Failures in the whole outage, this one included.
        failures: u64,
    },
    /// Already reported recently: count it, log nothing.
    Quiet,
}

/// What to log for a connection that came up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Up {
    /// The node's first connection since start: log it once at INFO.
    First,
    /// The end of an outage: log the recovery once at INFO.
    Recovered {
        /// How long the outage lasted.
        down_for: Duration,
        /// Failures it saw.
        failures: u64,
    },
    /// Another connection of a node already up: nothing worth an INFO line.
    Again,
}

/// One node's outage state, shared by the supervisors of its pool.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    /// Behind a lock: touched only when a connection fails or comes up, never per command.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Whether any connection to the node has come up since start, so the first one is
    /// logged and later ones are not.
    ever_up: bool,
    /// When the current outage's first failure was seen; `None` while the node is up.
    since: Option<Instant>,
    /// Failures in the current outage.
    failures: u64,
    /// When the next summary is due.
    next_summary: Option<Instant>,
    /// The delay after the next summary (doubles up to [`MAX_SUMMARY_INTERVAL`]).
    interval: Duration,
}

impl Outage {
    /// A connection failed (connect, handshake, or an established connection lost) at `now`.
    pub(crate) fn failed(&self, now: Instant) -> Report {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.failures += 1;
        let Some(since) = s.since else {
            s.since = Some(now);
            s.interval = FIRST_SUMMARY;
            s.next_summary = Some(now + FIRST_SUMMARY);
            return Report::First;
        };
        match s.next_summary {
            Some(due) if now >= due => {
                let interval = s.interval;
                s.interval = (interval * 2).min(MAX_SUMMARY_INTERVAL);
                s.next_summary = Some(now + s.interval);
                Report::StillDown {
                    down_for: now - since,
                    failures: s.failures,
                }
            }
            _ => Report::Quiet,
        }
    }

    /// A connection came up at `now`.
    pub(crate) fn up(&self, now: Instant) -> Up {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let first = !s.ever_up;
        s.ever_up = true;
        let failures = std::mem::take(&mut s.failures);
        s.next_summary = None;
        match s.since.take() {
            // Failures before the very first connection (Redis not up yet at start) end in
            // the first "connected" line; it carries no downtime of its own.
            Some(_) if first => Up::First,
            Some(since) => Up::Recovered {
                down_for: now - since,
                failures,
            },
            None if first => Up::First,
            None => Up::Again,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_then_summaries_at_growing_intervals_then_one_recovery() {
        let o = Outage::default();
        let t0 = Instant::now();
        assert_eq!(o.up(t0), Up::First);
        assert_eq!(o.up(t0), Up::Again, "a second connection of the same node");

        // Three connections fail every 50 ms retry: one line, then quiet.
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(o.failed(at(1000)), Report::First);
        assert_eq!(o.failed(at(1000)), Report::Quiet);
        assert_eq!(o.failed(at(1050)), Report::Quiet);
        assert_eq!(o.failed(at(10_999)), Report::Quiet);
        // 10 s after the first failure: a summary, the next one 20 s later, then 40 s…
        assert_eq!(
            o.failed(at(11_000)),
            Report::StillDown {
                down_for: Duration::from_secs(10),
                failures: 5
            }
        );
        assert_eq!(o.failed(at(30_999)), Report::Quiet);
        assert!(matches!(o.failed(at(31_000)), Report::StillDown { .. }));
        assert_eq!(o.failed(at(70_999)), Report::Quiet);
        assert!(matches!(o.failed(at(71_000)), Report::StillDown { .. }));

        // Back: the recovery once, with the outage's length and failures; then quiet again.
        assert_eq!(
            o.up(at(80_000)),
            Up::Recovered {
                down_for: Duration::from_secs(79),
                failures: 9
            }
        );
        assert_eq!(o.up(at(80_000)), Up::Again);
        // A new outage starts with a warning of its own.
        assert_eq!(o.failed(at(90_000)), Report::First);
    }

    #[test]
    fn the_interval_stops_growing_at_five_minutes() {
        let o = Outage::default();
        let mut now = Instant::now();
        assert_eq!(o.failed(now), Report::First);
        let mut gaps = Vec::new();
        let mut last = now;
        for _ in 0..20_000 {
            now += Duration::from_secs(1);
            if let Report::StillDown { .. } = o.failed(now) {
                gaps.push((now - last).as_secs());
                last = now;
            }
        }
        assert_eq!(&gaps[..6], &[10, 20, 40, 80, 160, 300]);
        assert!(gaps[6..].iter().all(|g| *g == 300), "{gaps:?}");
    }

    #[test]
    fn failures_before_the_first_connection_end_in_the_first_connected_line() {
        let o = Outage::default();
        let t0 = Instant::now();
        assert_eq!(o.failed(t0), Report::First);
        assert_eq!(o.up(t0 + Duration::from_secs(1)), Up::First);
        assert_eq!(o.up(t0 + Duration::from_secs(1)), Up::Again);
    }
}
