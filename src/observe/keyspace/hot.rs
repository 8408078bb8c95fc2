//! Hot keys: the keys requested most over the last minute, in bounded memory. A count-min
//! sketch per 10-second slice (six slices make the sliding minute) counts every sampled key;
//! a short candidate list keeps the names of the keys whose estimate is among the highest.
//! Memory is fixed: `SLICES × DEPTH × WIDTH` counters and `candidates` names, whatever the
//! number of distinct keys.

use std::time::Duration;

/// Slices of the sliding window.
const SLICES: usize = 6;
/// Length of one slice: the window is `SLICES × SLICE`, one minute.
pub(crate) const SLICE: Duration = Duration::from_secs(10);
/// Rows of each sketch (independent hashes): the estimate is the smallest row's count.
const DEPTH: usize = 4;
/// Counters per row: the estimate overcounts by about `total / WIDTH` at most, per row.
const WIDTH: usize = 2048;

/// The sliding-minute counts and the current candidates.
pub(crate) struct HotKeys {
    /// `slices[s][row][column]`: requests seen in slice `s`.
    slices: Vec<[[u32; WIDTH]; DEPTH]>,
    /// Which 10-second period each slice counts (`period % SLICES` is its index); a slice
    /// of an older period is cleared before it is counted in again.
    periods: [u64; SLICES],
    /// Key names whose estimate was among the highest when last seen, each with its
    /// estimate (kept current as it is counted, recomputed when a new period starts); at
    /// most `keep`.
    candidates: Vec<(Vec<u8>, u64)>,
    /// The period the candidates' estimates were last recomputed in.
    refreshed: u64,
    /// How many candidates are kept: a few times the top asked for, so a key rising past
    /// another is not lost to a stale estimate.
    keep: usize,
}

impl HotKeys {
    /// Tracks the top `n` keys.
    pub(crate) fn new(n: usize) -> HotKeys {
        HotKeys {
            slices: vec![[[0; WIDTH]; DEPTH]; SLICES],
            periods: [u64::MAX; SLICES],
            candidates: Vec::new(),
            refreshed: 0,
            keep: (n * 4).max(8),
        }
    }

    /// Counts `weight` requests for `key` in the 10-second period `period`.
    pub(crate) fn add(&mut self, key: &[u8], weight: u32, period: u64) {
        let s = (period % SLICES as u64) as usize;
        if self.periods[s] != period {
            self.slices[s] = [[0; WIDTH]; DEPTH];
            self.periods[s] = period;
        }
        for (row, col) in columns(key).into_iter().enumerate() {
            self.slices[s][row][col] = self.slices[s][row][col].saturating_add(weight);
        }
        if self.refreshed != period {
            // Slices expired: the kept estimates only ever overstate until recomputed.
            self.refreshed = period;
            for i in 0..self.candidates.len() {
                self.candidates[i].1 = self.estimate(&self.candidates[i].0, period);
            }
        }
        if let Some(c) = self.candidates.iter_mut().find(|c| c.0 == key) {
            c.1 += u64::from(weight);
            return;
        }
        let estimate = self.estimate(key, period);
        if self.candidates.len() < self.keep {
            self.candidates.push((key.to_vec(), estimate));
            return;
        }
        // Replace the weakest candidate if this key now estimates above it.
        if let Some((i, weakest)) = self
            .candidates
            .iter()
            .enumerate()
            .map(|(i, c)| (i, c.1))
            .min_by_key(|(_, e)| *e)
            && estimate > weakest
        {
            self.candidates[i] = (key.to_vec(), estimate);
        }
    }

    /// Requests for `key` over the minute ending in `period` (an overestimate, never under).
    pub(crate) fn estimate(&self, key: &[u8], period: u64) -> u64 {
        let cols = columns(key);
        (0..DEPTH)
            .map(|row| {
                (0..SLICES)
                    .filter(|&s| {
                        self.periods[s] <= period && period - self.periods[s] < SLICES as u64
                    })
                    .map(|s| u64::from(self.slices[s][row][cols[row]]))
                    .sum::<u64>()
            })
            .min()
            .unwrap_or(0)
    }

    /// The top `n` keys over the minute ending in `period`, by estimate, highest first.
    pub(crate) fn top(&self, n: usize, period: u64) -> Vec<(Vec<u8>, u64)> {
        let mut all: Vec<(Vec<u8>, u64)> = self
            .candidates
            .iter()
            .map(|(c, _)| (c.clone(), self.estimate(c, period)))
            .filter(|(_, e)| *e > 0)
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }
}

/// The column of `key` in each row: FNV-1a 64 with a different seed per row, reduced to
/// `WIDTH`.
fn columns(key: &[u8]) -> [usize; DEPTH] {
    let mut out = [0; DEPTH];
    for (row, col) in out.iter_mut().enumerate() {
        let mut h: u64 =
            0xcbf2_9ce4_8422_2325 ^ (row as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for b in key {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Mix the high bits down: FNV's low bits alone spread short keys poorly.
        h ^= h >> 29;
        *col = (h % WIDTH as u64) as usize;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_skewed_keys_and_forgets_after_a_minute() {
        let mut hot = HotKeys::new(3);
        for i in 0..5000u32 {
            hot.add(format!("cold:{i}").as_bytes(), 1, 100);
            if i % 10 == 0 {
                hot.add(b"hot:a", 1, 100);
            }
            if i % 25 == 0 {
                hot.add(b"hot:b", 1, 100);
            }
        }
        let top = hot.top(2, 100);
        assert_eq!(top[0].0, b"hot:a");
        assert!(top[0].1 >= 500);
        assert_eq!(top[1].0, b"hot:b");
        assert!(top[1].1 >= 200);
        // Six periods later the minute holds none of it.
        assert_eq!(hot.estimate(b"hot:a", 106), 0);
        assert!(hot.top(2, 106).is_empty());
    }
}
