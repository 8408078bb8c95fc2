//! Per-client rate limits: a sliding window, estimated from two fixed windows.
//!
//! The policy engine calls a limiter once per command with a key it chose (tenant, client
//! address, user or connection id) and gets a [`Decision`]; a refusal becomes the error reply
//! formatted by [`refusal`]. Two backends share one algorithm:
//!
//! - [`local::LocalLimiter`]: in the proxy's memory (a `DashMap`), about 50 ns per check plus
//!   a clock reading, and no allocation once a key is known; each replica counts on its own.
//! - [`redis::RedisLimiter`]: the same arithmetic in a Lua script (`lua/sliding_window.lua`)
//!   run atomically on Redis with EVALSHA, so every proxy replica draws on one budget.
//!
//! # The estimate
//!
//! Time is cut into fixed windows of length `W` (window `i` is `[i·W, (i+1)·W)`). Per key we
//! keep only the count of requests allowed in the current window and in the one before. At
//! offset `o` into the current window, the number of requests in the sliding window
//! `(now − W, now]` is estimated by assuming the previous window's requests were spread
//! evenly over it, so that the fraction `(W − o) / W` of them still falls inside:
//!
//! ```text
//! estimate = previous · (W − o) / W + current
//! ```
//!
//! A request is allowed, and counted, when `estimate + 1 ≤ N`; a refused request is not
//! counted, so a client retrying after `retry_after` is not kept out by its own refusals. All of
//! it is integer arithmetic in milliseconds (the comparison is multiplied through by `W`), which
//! is why [`Limit::validate`] requires `N · W_ms ≤ 2^53`: every product then fits both a `u64`
//! and the exact-integer range of the Lua script's doubles, and the two backends decide alike.
//!
//! This is the approach of Cloudflare's rate limiter and of `pingora-limits`' `Rate`.
//!
//! # What it guarantees
//!
//! It is an estimate, exact only when the previous window's traffic was even. For one key:
//!
//! - **At most `N` requests are allowed in any fixed window**, because `estimate ≥ current`.
//!   So any interval of length `W`, which overlaps at most two fixed windows, sees **at most
//!   `2N`** allowed requests (the worst case: `N` allowed at the very end of one window, then
//!   the estimate lets the next window admit more as that burst's weight decays). Over `k`
//!   consecutive windows at most `k · N` are allowed: the long-run rate never exceeds `N / W`.
//! - **It can refuse early**: a burst at the start of the previous window still weighs on the
//!   estimate although it has left the true sliding window, so a client may be refused with
//!   fewer than `N` requests in the last `W`. It is never refused with 0 requests in the last
//!   two fixed windows.
//! - **A client that never stops gets `N − 1` per window**, not `N`: the previous window's
//!   weight reaches 0 only at the window's end, so one slot stays taken. This matters for small
//!   `N`: with `N = 1`, a request blocks the rest of its window and all of the next (one
//!   request per `2W` for a client retrying constantly). Prefer `N ≥ 10` with a proportionally
//!   longer window when the exact count matters.
//! - **`retry_after` is exact for the estimate**: the smallest number of milliseconds after
//!   which a request would be allowed if none is sent meanwhile; at most `W + W/N`, so `2W`.
//!
//! On real traffic the error is small: Cloudflare's write-up of this limiter reports 0.003 % of
//! 400 million requests wrongly allowed or limited.
//!
//! # Why not a sliding log
//!
//! A sliding log (one timestamp per request, in a Redis sorted set or a ring buffer) is exact,
//! but costs `O(N)` memory per key, `O(log N)` work per request, and, on Redis, a sorted set
//! that grows with the limit (ZREMRANGEBYSCORE on every call). The two-window estimate is
//! `O(1)` in memory (16 bytes per key locally, one small hash in Redis) and in time, whatever
//! `N` is, and its error is bounded as above. For a proxy that checks every command of every
//! client, and must never grow memory without bound, that trade is the right one.
//!
//! # Time
//!
//! Time comes from a [`Clock`] (milliseconds since the clock's epoch), so tests move it by
//! hand with [`ManualClock`] instead of sleeping through windows. The proxy uses
//! [`MonotonicClock`] locally; the Redis backend uses the Redis server's own `TIME` unless it
//! is given a clock (see [`redis::RedisLimiter::with_client_clock`]).

pub mod local;
pub mod redis;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The largest `requests × window_ms` a limit may have: every product the algorithm forms then
/// fits a `u64` and is an exact integer in the Lua script's doubles.
const MAX_PRODUCT: u64 = 1 << 53;

/// How many requests one key may make per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Requests allowed in any window (estimated, see the module docs); at least 1.
    pub requests: u32,
    /// Length of the window; a whole number of milliseconds, because both backends count time
    /// in milliseconds, the unit of the retry hint and of the Redis keys' PEXPIRE.
    pub window: Duration,
}

impl Limit {
    /// Checks the limit can be enforced exactly by both backends: at least one request, a
    /// window of at least 1 ms that is a whole number of milliseconds, and
    /// `requests × window_ms ≤ 2^53` (e.g. 100 million requests per day is fine).
    pub(crate) fn validate(&self) -> Result<(), RateLimitError> {
        let invalid = |reason| {
            Err(RateLimitError::InvalidLimit {
                requests: self.requests,
                window: self.window,
                reason,
            })
        };
        if self.requests == 0 {
            return invalid("at least one request per window is needed; deny the command instead");
        }
        if self.window < Duration::from_millis(1) || self.window.subsec_nanos() % 1_000_000 != 0 {
            return invalid("the window must be a whole number of milliseconds, at least 1 ms");
        }
        let window_ms = u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX);
        if u64::from(self.requests).saturating_mul(window_ms) > MAX_PRODUCT {
            return invalid("requests x window in milliseconds must not exceed 2^53");
        }
        Ok(())
    }

    /// The limit in the units the arithmetic uses; only valid after [`Limit::validate`].
    fn params(&self) -> Params {
        Params {
            requests: u64::from(self.requests),
            window_ms: self.window.as_millis() as u64,
        }
    }
}

/// What a limiter says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The request may go on; it has been counted.
    Allowed {
        /// Requests the key may still make right now (the estimate's headroom, rounded down);
        /// for metrics and `X-RateLimit-Remaining`-style hints.
        remaining: u32,
    },
    /// The request must be refused with [`refusal`]; it has not been counted.
    Limited {
        /// How long until a request would be allowed if the client sends nothing meanwhile,
        /// exact to the millisecond: the client's "retry in … ms".
        retry_after: Duration,
    },
}

/// The message of the error reply for a limited command, for `error::simple_error("ERR", …)`:
/// `policy ratelimit-default: 100 requests per 60s exceeded; retry in 1800 ms`.
///
/// `retry_after` is rounded up to whole milliseconds, so a client that waits exactly that long
/// is allowed. Allocates, which is fine: it runs only when a command is refused.
pub(crate) fn refusal(rule_id: &str, limit: &Limit, retry_after: Duration) -> String {
    let noun = if limit.requests == 1 {
        "request"
    } else {
        "requests"
    };
    format!(
        "policy {rule_id}: {} {noun} per {} exceeded; retry in {} ms",
        limit.requests,
        WindowLength(limit.window),
        retry_after.as_nanos().div_ceil(1_000_000),
    )
}

/// A window length as an operator writes it: `60s`, or `1500ms` when not whole seconds.
struct WindowLength(Duration);

impl fmt::Display for WindowLength {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            write!(f, "{}s", d.as_secs())
        } else if d.subsec_nanos() % 1_000_000 == 0 {
            write!(f, "{}ms", d.as_millis())
        } else {
            write!(f, "{d:?}")
        }
    }
}

/// Why a limiter could not decide, or could not be built.
///
/// At check time ([`RateLimitError::TooManyKeys`], and the Redis errors) the limiter has no
/// answer: the policy engine decides whether that rule fails open (allow) or closed (refuse).
#[derive(Debug, thiserror::Error)]
pub enum RateLimitError {
    /// The configured limit cannot be enforced (see [`Limit::validate`]); a config error.
    #[error("invalid rate limit of {requests} per {window:?}: {reason}")]
    InvalidLimit {
        /// The requests of the rejected limit, to name it in the message.
        requests: u32,
        /// The window of the rejected limit, to name it in the message.
        window: Duration,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A local limiter already tracks its maximum number of keys and this key is new; it is
    /// not tracked (see [`local::LocalLimiter`]). Known keys are unaffected.
    #[error(
        "rate limiter tracks its maximum of {max_keys} keys; no room for a new key until a sweep"
    )]
    TooManyKeys {
        /// The cap that was reached, for the log line.
        max_keys: usize,
    },
    /// The command could not be sent to Redis or its reply was lost.
    #[error("rate limiter could not reach Redis: {0}")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// Redis answered the script with an error (other than NOSCRIPT, which is handled), e.g.
    /// WRONGTYPE if something else wrote the limiter's key, or OOM.
    #[error("rate limit script failed on Redis: {0}")]
    Script(String),
    /// Redis answered with something the script never returns.
    #[error("unexpected reply to the rate limit script: {0}")]
    UnexpectedReply(String),
}

/// Where limiters get the time from: milliseconds since the clock's own epoch, never
/// decreasing. A trait so that tests drive time by hand ([`ManualClock`]) instead of sleeping.
pub trait Clock: Send + Sync {
    /// Milliseconds since this clock's epoch.
    fn now_ms(&self) -> u64;
}

/// The real clock for the local backend: tokio's monotonic `Instant`, so it never jumps with
/// NTP and it follows tokio's paused time in tests that use `tokio::time::pause`. One vDSO
/// `clock_gettime` per reading: 20–40 ns, often the largest part of a local check.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    /// When this clock reads 0. Only differences matter locally: window edges fall at whole
    /// multiples of the window after it.
    epoch: tokio::time::Instant,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        MonotonicClock {
            epoch: tokio::time::Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ms(&self) -> u64 {
        tokio::time::Instant::now()
            .duration_since(self.epoch)
            .as_millis() as u64
    }
}

/// A clock that moves only when told to: tests set it to a window edge or a fraction of a
/// window and check the exact decision, without sleeping. Clones share one time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    /// The current reading in milliseconds, shared by every clone.
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Duration) -> Self {
        let clock = ManualClock::default();
        clock.set(start);
        clock
    }

    #[cfg(test)]
    /// Moves the clock forward by `by` (whole milliseconds; the rest is dropped).
    pub(crate) fn advance(&self, by: Duration) {
        self.now_ms
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets the reading to `to` since the epoch (whole milliseconds).
    pub fn set(&self, to: Duration) {
        self.now_ms.store(to.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> u64 {
        (**self).now_ms()
    }
}

/// A validated [`Limit`] as the integers the arithmetic uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Params {
    /// `N`, the requests per window.
    requests: u64,
    /// `W`, the window length in milliseconds.
    window_ms: u64,
}

/// One key's whole state: the counts of two fixed windows. 16 bytes. `lua/sliding_window.lua`
/// implements exactly the same transitions on a Redis hash (`w`, `c`, `p`); keep them in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    /// Which fixed window `current` counts (`now_ms / window_ms`); `previous` counts the one
    /// before it.
    index: u64,
    /// Requests allowed in window `index`.
    current: u32,
    /// Requests allowed in window `index - 1`.
    previous: u32,
}

impl Window {
    /// The state of a key first seen in window `index`: nothing counted yet.
    fn new(index: u64) -> Self {
        Window {
            index,
            current: 0,
            previous: 0,
        }
    }

    /// Decides one request at `now_ms`, counting it if allowed. A refusal leaves the state
    /// untouched (the script writes nothing then either), so the two backends stay identical
    /// even when a clock steps back.
    #[inline]
    fn check(&mut self, now_ms: u64, p: Params) -> Decision {
        let w = p.window_ms;
        let mut index = now_ms / w;
        let mut offset = now_ms % w;
        let (current, previous) = if index == self.index {
            (self.current, self.previous)
        } else if index == self.index + 1 {
            (0, self.current)
        } else if index > self.index {
            (0, 0)
        } else {
            // The clock reads before the stored window (only a manual clock can do this
            // locally; on Redis, a replica's clock skew): read the stored window at its
            // start, where the previous window weighs most. The strictest reading.
            index = self.index;
            offset = 0;
            (self.current, self.previous)
        };

        // `previous · (W − o)`: the previous window's share of the estimate, times W.
        let weighted = u64::from(previous) * (w - offset);
        // Allowed iff weighted / W + current + 1 ≤ N, i.e. weighted ≤ (N − current − 1) · W.
        // `current ≤ N` always holds here (a count never passes N), so nothing overflows.
        let current_wide = u64::from(current);
        if current_wide < p.requests {
            let headroom = (p.requests - current_wide - 1) * w;
            if weighted <= headroom {
                *self = Window {
                    index,
                    current: current + 1,
                    previous,
                };
                return Decision::Allowed {
                    remaining: ((headroom - weighted) / w) as u32,
                };
            }
            // Limited with room in this window's count: wait for the previous window's weight
            // to decay. The first `d` with previous · (W − o − d) ≤ headroom is
            // W − o − ⌊headroom / previous⌋; `previous > 0` because weighted > headroom ≥ 0,
            // and the result is at most W − o, i.e. at the latest the next window's start.
            let d = w - offset - headroom / u64::from(previous);
            return Decision::Limited {
                retry_after: Duration::from_millis(d),
            };
        }
        // This window's count is full: wait for the next window, where `current` becomes the
        // previous count and must decay until current · (W − o') ≤ (N − 1) · W, i.e.
        // o' = ⌈W · (current − N + 1) / current⌉ into that window (W / N when current = N).
        let into_next = (w * (current_wide - p.requests + 1)).div_ceil(current_wide);
        Decision::Limited {
            retry_after: Duration::from_millis(w - offset + into_next),
        }
    }

    /// Whether the state says nothing any more at `now_ms`: its last request is two or more
    /// windows back, so both counts would read as 0. Dropping such a state changes no
    /// decision.
    #[inline]
    fn is_expired(&self, now_ms: u64, p: Params) -> bool {
        now_ms / p.window_ms >= self.index.saturating_add(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(requests: u64, window_ms: u64) -> Params {
        Params {
            requests,
            window_ms,
        }
    }

    fn limited(ms: u64) -> Decision {
        Decision::Limited {
            retry_after: Duration::from_millis(ms),
        }
    }

    #[test]
    fn refusal_message_names_rule_limit_and_wait() {
        let limit = Limit {
            requests: 100,
            window: Duration::from_secs(60),
        };
        assert_eq!(
            refusal("ratelimit-default", &limit, Duration::from_millis(1800)),
            "policy ratelimit-default: 100 requests per 60s exceeded; retry in 1800 ms"
        );
        let one = Limit {
            requests: 1,
            window: Duration::from_millis(1500),
        };
        // Rounded up: waiting the printed time is always enough.
        assert_eq!(
            refusal("login", &one, Duration::from_micros(1001)),
            "policy login: 1 request per 1500ms exceeded; retry in 2 ms"
        );
    }

    #[test]
    fn validate_rejects_limits_the_backends_cannot_enforce_exactly() {
        let ok = |requests, window| Limit { requests, window }.validate().is_ok();
        assert!(ok(1, Duration::from_millis(1)));
        assert!(ok(100_000_000, Duration::from_secs(86_400)));
        assert!(!ok(0, Duration::from_secs(1)));
        assert!(!ok(1, Duration::ZERO));
        assert!(!ok(1, Duration::from_micros(1500)));
        assert!(!ok(u32::MAX, Duration::from_secs(86_400 * 365)));
        assert!(!ok(1, Duration::MAX));
        let err = Limit {
            requests: 0,
            window: Duration::from_secs(1),
        }
        .validate()
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid rate limit of 0 per 1s")
        );
    }

    #[test]
    fn full_window_waits_for_next_window_plus_one_slot() {
        let p = params(5, 1000);
        let mut s = Window::new(0);
        for remaining in (0..5).rev() {
            assert_eq!(s.check(0, p), Decision::Allowed { remaining });
        }
        assert_eq!(s.check(0, p), limited(1200));
        assert_eq!(s.check(999, p), limited(201));
        // At 1199 ms the 5 previous requests still weigh 5 · 801/1000 > 4.
        assert_eq!(s.check(1199, p), limited(1));
        assert_eq!(s.check(1200, p), Decision::Allowed { remaining: 0 });
    }

    /// `retry_after` is the first instant at which a request is allowed, for every reachable
    /// state of small limits: checked by stepping a copy of the state one ms at a time.
    #[test]
    fn retry_after_is_exactly_the_first_allowed_instant() {
        for n in 1..=6u32 {
            for w in [1u64, 2, 3, 7, 10] {
                let p = params(u64::from(n), w);
                for previous in 0..=n {
                    for current in 0..=n {
                        for offset in 0..w {
                            let state = Window {
                                index: 1,
                                current,
                                previous,
                            };
                            let now = w + offset;
                            let at = |t: u64| {
                                let mut s = state;
                                s.check(t, p)
                            };
                            let Decision::Limited { retry_after } = at(now) else {
                                continue;
                            };
                            let d = retry_after.as_millis() as u64;
                            let most = w + w.div_ceil(u64::from(n));
                            assert!(d >= 1 && d <= most, "{state:?} at {now}: {d}");
                            let first = (1..=2 * w)
                                .find(|t| matches!(at(now + t), Decision::Allowed { .. }))
                                .unwrap();
                            assert_eq!(d, first, "{state:?} at {now} (N={n}, W={w})");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_client_that_never_stops_gets_n_minus_one_per_window() {
        let p = params(5, 1000);
        let mut s = Window::new(0);
        let mut per_window = [0u32; 6];
        for t in 0..6000u64 {
            while let Decision::Allowed { .. } = s.check(t, p) {
                per_window[(t / 1000) as usize] += 1;
            }
        }
        assert_eq!(per_window, [5, 4, 4, 4, 4, 4]);
    }

    #[test]
    fn a_refusal_leaves_the_state_untouched() {
        let p = params(2, 1000);
        let mut s = Window::new(0);
        s.check(0, p);
        s.check(0, p);
        let full = s;
        // Refused in the next window: the roll-over is not stored either.
        assert!(matches!(s.check(1000, p), Decision::Limited { .. }));
        assert_eq!(s, full);
    }

    #[test]
    fn expiry_is_two_windows_after_the_last_counted_window() {
        let p = params(3, 100);
        let s = Window::new(5);
        assert!(!s.is_expired(500, p));
        assert!(!s.is_expired(699, p));
        assert!(s.is_expired(700, p));
    }
}
