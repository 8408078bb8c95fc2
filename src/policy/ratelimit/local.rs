//! The in-proxy backend: one two-window state per key in a `DashMap`, checked under the key's
//! shard lock. Each proxy replica enforces the limit on its own; use [`super::redis`] for a
//! budget shared by replicas.
//!
//! # Cost
//!
//! A check of a known key is one clock reading, one hash of the key (SipHash, the standard
//! library's: keys such as client addresses and user names are chosen by clients, so the map
//! must resist hash flooding), one shard write-lock and a few integer operations: no
//! allocation. Only the first check of a new key allocates (the boxed key, and the map's
//! growth). The clock reading is the biggest part (a `clock_gettime`); callers checking a
//! batch of commands can read it once with [`LocalLimiter::now_ms`] and use
//! [`LocalLimiter::check_at`].
//!
//! # Memory
//!
//! Bounded two ways:
//! - [`LocalLimiter::sweep`], which the caller runs periodically (once per window is plenty),
//!   drops every key whose state has expired: no request counted in the current or previous
//!   window, which is certainly the case for a key idle for more than two windows. Such a state
//!   reads as zero anyway, so eviction never changes a decision.
//! - `max_keys` caps the map. When it is reached, a **new** key is not tracked and its check
//!   returns [`RateLimitError::TooManyKeys`] (keys already tracked are checked as usual), until
//!   a sweep frees room. The limiter does not guess whether an untracked client should pass: the
//!   policy engine applies the rule's fail-open or fail-closed choice, as for an unreachable
//!   Redis. A short key costs about 80 bytes (its map slot plus the boxed key's own allocation).

use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use super::{Clock, Decision, Limit, MonotonicClock, Params, RateLimitError, Window};

/// A sliding-window limiter whose counts live in this process, keyed by caller-chosen bytes.
///
/// One limiter enforces one [`Limit`]; a policy with several rate-limit rules holds one per
/// rule. Share it between sessions behind an `Arc`: every method takes `&self`.
#[derive(Debug)]
pub struct LocalLimiter<C: Clock = MonotonicClock> {
    /// Each key's two-window state. Boxed byte keys let a lookup borrow the caller's `&[u8]`
    /// (no allocation for a known key); the shard locks make a check atomic per key.
    windows: DashMap<Box<[u8]>, Window>,
    /// How many keys `windows` holds, kept beside it because `DashMap::len` locks every shard.
    /// A new key reserves its place here before it is inserted, so the cap is never exceeded.
    tracked: AtomicUsize,
    /// The most keys tracked at once: the bound on this limiter's memory.
    max_keys: usize,
    /// The limit as configured, for [`LocalLimiter::limit`] and refusal messages.
    limit: Limit,
    /// The limit as the integers the arithmetic uses, computed once.
    params: Params,
    /// Where "now" comes from; a [`super::ManualClock`] in tests.
    clock: C,
}

impl<C: Clock> LocalLimiter<C> {
    /// A limiter enforcing `limit`, tracking at most `max_keys` keys, reading time from
    /// `clock`. Fails if the limit is invalid (see [`Limit::validate`]).
    pub fn new(limit: Limit, max_keys: usize, clock: C) -> Result<Self, RateLimitError> {
        limit.validate()?;
        Ok(LocalLimiter {
            windows: DashMap::new(),
            tracked: AtomicUsize::new(0),
            max_keys,
            params: limit.params(),
            limit,
            clock,
        })
    }

    /// Decides one request for `key` now, counting it if allowed. Fails only with
    /// [`RateLimitError::TooManyKeys`], for a new key while `max_keys` keys are tracked.
    #[inline]
    pub fn check(&self, key: &[u8]) -> Result<Decision, RateLimitError> {
        self.check_at(key, self.clock.now_ms())
    }

    /// [`LocalLimiter::check`] at a time the caller already read with
    /// [`LocalLimiter::now_ms`]. Reading a clock costs about as much as the rest of a check, so
    /// a session can read it once per batch of pipelined commands and check each with it.
    #[inline]
    pub fn check_at(&self, key: &[u8], now_ms: u64) -> Result<Decision, RateLimitError> {
        if let Some(mut window) = self.windows.get_mut(key) {
            return Ok(window.check(now_ms, self.params));
        }
        self.check_new(key, now_ms)
    }

    /// This limiter's clock reading, for [`LocalLimiter::check_at`].
    #[inline]
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The first check of a key: reserve a place under the cap, then insert. Another thread
    /// may insert the same key first; then its entry is used and the place given back.
    #[cold]
    fn check_new(&self, key: &[u8], now: u64) -> Result<Decision, RateLimitError> {
        if self.tracked.fetch_add(1, Ordering::AcqRel) >= self.max_keys {
            self.tracked.fetch_sub(1, Ordering::AcqRel);
            return Err(RateLimitError::TooManyKeys {
                max_keys: self.max_keys,
            });
        }
        Ok(match self.windows.entry(Box::from(key)) {
            Entry::Occupied(mut entry) => {
                self.tracked.fetch_sub(1, Ordering::AcqRel);
                entry.get_mut().check(now, self.params)
            }
            Entry::Vacant(entry) => {
                let mut window = Window::new(now / self.params.window_ms);
                let decision = window.check(now, self.params);
                entry.insert(window);
                decision
            }
        })
    }

    /// Drops every key whose state has expired (nothing counted in the current or previous
    /// window), returning how many. Never changes a decision. Takes each shard's lock in turn,
    /// `O(keys)` in all: run it from a timer, about once per window, not per command.
    pub(crate) fn sweep(&self) -> usize {
        let now = self.clock.now_ms();
        let mut removed = 0;
        self.windows.retain(|_, window| {
            let expired = window.is_expired(now, self.params);
            removed += usize::from(expired);
            !expired
        });
        self.tracked.fetch_sub(removed, Ordering::AcqRel);
        removed
    }

    #[cfg(test)]
    /// How many keys are tracked now (for metrics). Reads one counter; no shard is locked.
    pub(crate) fn len(&self) -> usize {
        self.tracked.load(Ordering::Acquire)
    }

    #[cfg(test)]
    /// Whether no key is tracked.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The limit this limiter enforces, e.g. for [`super::refusal`].
    pub(crate) fn limit(&self) -> &Limit {
        &self.limit
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::policy::ratelimit::{ManualClock, refusal};

    fn limiter(
        requests: u32,
        window_ms: u64,
        max_keys: usize,
    ) -> (LocalLimiter<ManualClock>, ManualClock) {
        let clock = ManualClock::default();
        let limit = Limit {
            requests,
            window: Duration::from_millis(window_ms),
        };
        (
            LocalLimiter::new(limit, max_keys, clock.clone()).unwrap(),
            clock,
        )
    }

    fn at(clock: &ManualClock, ms: u64) {
        clock.set(Duration::from_millis(ms));
    }

    fn allowed(d: Result<Decision, RateLimitError>) -> bool {
        matches!(d.unwrap(), Decision::Allowed { .. })
    }

    fn retry_ms(d: Result<Decision, RateLimitError>) -> u128 {
        match d.unwrap() {
            Decision::Limited { retry_after } => retry_after.as_millis(),
            other => panic!("expected Limited, got {other:?}"),
        }
    }

    /// Checks `key` until the first refusal; returns how many were allowed.
    fn allowed_until_limited(l: &LocalLimiter<ManualClock>, key: &[u8]) -> u32 {
        let mut n = 0;
        while allowed(l.check(key)) {
            n += 1;
            assert!(n <= l.limit().requests, "more than N allowed");
        }
        n
    }

    #[test]
    fn exactly_n_per_window_then_refused_with_exact_retry_after() {
        let (l, clock) = limiter(100, 60_000, 1000);
        at(&clock, 0);
        for expected in (0..100).rev() {
            assert_eq!(
                l.check(b"tenant-a").unwrap(),
                Decision::Allowed {
                    remaining: expected
                }
            );
        }
        // The 101st: this window's count is full, so wait for the next window (60 s) plus the
        // time for these 100 to decay by one slot there (W/N = 600 ms).
        let d = l.check(b"tenant-a").unwrap();
        assert_eq!(
            d,
            Decision::Limited {
                retry_after: Duration::from_millis(60_600)
            }
        );
        let Decision::Limited { retry_after } = d else {
            unreachable!()
        };
        assert_eq!(
            refusal("ratelimit-default", l.limit(), retry_after),
            "policy ratelimit-default: 100 requests per 60s exceeded; retry in 60600 ms"
        );

        // Last ms of the window: still full.
        at(&clock, 59_999);
        assert_eq!(retry_ms(l.check(b"tenant-a")), 601);
        // First ms of the next window: the previous 100 weigh fully, still refused.
        at(&clock, 60_000);
        assert_eq!(retry_ms(l.check(b"tenant-a")), 600);
        at(&clock, 60_599);
        assert_eq!(retry_ms(l.check(b"tenant-a")), 1);
        // Exactly when retry_after said: one request, then one more every W/N.
        at(&clock, 60_600);
        assert_eq!(
            l.check(b"tenant-a").unwrap(),
            Decision::Allowed { remaining: 0 }
        );
        assert_eq!(retry_ms(l.check(b"tenant-a")), 600);
    }

    #[test]
    fn refused_requests_are_not_counted() {
        let (l, clock) = limiter(2, 1000, 10);
        at(&clock, 0);
        assert!(allowed(l.check(b"k")));
        assert!(allowed(l.check(b"k")));
        for _ in 0..1000 {
            assert_eq!(retry_ms(l.check(b"k")), 1500);
        }
        at(&clock, 1500);
        assert!(allowed(l.check(b"k")));
    }

    #[test]
    fn check_at_decides_at_the_given_reading() {
        let (l, clock) = limiter(1, 1000, 10);
        at(&clock, 5000);
        assert_eq!(l.now_ms(), 5000);
        assert!(allowed(l.check_at(b"k", 0)));
        // Counted in window 0: refused in window 0, allowed again in window 2.
        assert_eq!(retry_ms(l.check_at(b"k", 999)), 1001);
        assert!(allowed(l.check(b"k")));
    }

    #[test]
    fn previous_window_weighs_by_its_remaining_overlap() {
        let (l, clock) = limiter(100, 1000, 10);
        at(&clock, 0);
        for key in [b"a", b"b", b"c"] {
            assert_eq!(allowed_until_limited(&l, key), 100);
        }
        // 25 % into the next window, 75 % of the previous 100 still count: 25 more fit.
        at(&clock, 1250);
        assert_eq!(allowed_until_limited(&l, b"a"), 25);
        // Then one more each time another 1/N of the previous window slides out: 10 ms.
        assert_eq!(retry_ms(l.check(b"a")), 10);
        at(&clock, 1500);
        assert_eq!(allowed_until_limited(&l, b"b"), 50);
        at(&clock, 1750);
        assert_eq!(allowed_until_limited(&l, b"c"), 75);
        // "a" at 50 %: 50 of the previous count plus its own 25 → 25 more.
        at(&clock, 1500);
        assert_eq!(allowed_until_limited(&l, b"a"), 25);
    }

    #[test]
    fn a_gap_of_two_windows_forgets_everything() {
        let (l, clock) = limiter(3, 1000, 10);
        at(&clock, 500);
        assert_eq!(allowed_until_limited(&l, b"k"), 3);
        at(&clock, 2000);
        assert_eq!(allowed_until_limited(&l, b"k"), 3);
    }

    #[test]
    fn many_keys_are_independent() {
        let (l, clock) = limiter(3, 1000, 10_000);
        at(&clock, 0);
        let keys: Vec<Vec<u8>> = (0..1000)
            .map(|i| format!("10.0.{}.{}", i / 256, i % 256).into_bytes())
            .collect();
        for key in &keys {
            assert_eq!(l.check(key).unwrap(), Decision::Allowed { remaining: 2 });
        }
        for key in &keys {
            assert_eq!(l.check(key).unwrap(), Decision::Allowed { remaining: 1 });
            assert_eq!(l.check(key).unwrap(), Decision::Allowed { remaining: 0 });
            assert_eq!(retry_ms(l.check(key)), 1334);
        }
        assert_eq!(l.len(), 1000);
    }

    #[test]
    fn sweep_evicts_keys_idle_for_two_windows_without_changing_decisions() {
        let (l, clock) = limiter(4, 1000, 10);
        let (unswept, clock2) = limiter(4, 1000, 10);
        let both = |ms| {
            at(&clock, ms);
            at(&clock2, ms);
        };
        both(900);
        for _ in 0..4 {
            l.check(b"old").unwrap();
            unswept.check(b"old").unwrap();
        }
        both(1900);
        l.check(b"recent").unwrap();
        unswept.check(b"recent").unwrap();

        both(1999);
        assert_eq!(l.sweep(), 0, "\"old\" still weighs on window 1");
        both(2000);
        assert_eq!(l.sweep(), 1, "\"old\" has no count in windows 1 and 2");
        assert_eq!(l.len(), 1);
        // The evicted key decides exactly as if it had been kept.
        for _ in 0..5 {
            assert_eq!(l.check(b"old").unwrap(), unswept.check(b"old").unwrap());
            assert_eq!(
                l.check(b"recent").unwrap(),
                unswept.check(b"recent").unwrap()
            );
        }
        both(10_000);
        assert_eq!(l.sweep(), 2);
        assert!(l.is_empty());
    }

    #[test]
    fn new_keys_past_the_cap_are_reported_not_tracked() {
        let (l, clock) = limiter(2, 1000, 2);
        at(&clock, 0);
        assert!(allowed(l.check(b"a")));
        assert!(allowed(l.check(b"b")));
        let err = l.check(b"c").unwrap_err();
        assert!(
            matches!(err, RateLimitError::TooManyKeys { max_keys: 2 }),
            "{err}"
        );
        // Known keys are unaffected.
        assert!(allowed(l.check(b"a")));
        assert_eq!(retry_ms(l.check(b"a")), 1500);
        assert_eq!(l.len(), 2);
        // Once idle keys are swept, new ones fit again.
        at(&clock, 2000);
        assert_eq!(l.sweep(), 2);
        assert!(allowed(l.check(b"c")));
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn concurrent_checks_allow_exactly_n_and_respect_the_cap() {
        let (l, clock) = limiter(500, 1000, 64);
        at(&clock, 0);
        let l = Arc::new(l);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let l = Arc::clone(&l);
                std::thread::spawn(move || {
                    let mut allowed_one = 0;
                    let mut refused_new = 0;
                    for i in 0..1000u32 {
                        if matches!(l.check(b"shared").unwrap(), Decision::Allowed { .. }) {
                            allowed_one += 1;
                        }
                        // 4 threads × 50 distinct keys each = 200 new keys for 63 free places.
                        if i < 50 && l.check(format!("{t}-{i}").as_bytes()).is_err() {
                            refused_new += 1;
                        }
                    }
                    (allowed_one, refused_new)
                })
            })
            .collect();
        let (allowed_total, refused_total) = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .fold((0, 0), |(a, r), (x, y)| (a + x, r + y));
        assert_eq!(allowed_total, 500);
        assert_eq!(l.len(), 64);
        assert_eq!(refused_total, 200 - 63);
    }

    #[tokio::test(start_paused = true)]
    async fn monotonic_clock_follows_tokio_paused_time() {
        let clock = MonotonicClock::new();
        let limit = Limit {
            requests: 1,
            window: Duration::from_secs(10),
        };
        let l = LocalLimiter::new(limit, 10, clock).unwrap();
        assert!(allowed(l.check(b"k")));
        assert!(!allowed(l.check(b"k")));
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(clock.now_ms(), 20_000);
        assert!(allowed(l.check(b"k")));
    }
}
