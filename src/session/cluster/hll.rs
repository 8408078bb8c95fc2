//! PFCOUNT of keys in several slots: each key's HyperLogLog, read with GET from its node, is
//! decoded here, the registers merged (the largest value per register) and the cardinality
//! estimated as one Redis estimates the union of several keys.
//!
//! Written by hand from the format's and the estimator's descriptions because no maintained
//! crate reads Redis's own encoding (its header, its sparse opcodes) or gives the same
//! estimate: the value a client gets must equal what one Redis answers for the same keys.
//!
//! The format: a 16-byte header (`HYLL`, an encoding byte, 3 unused bytes, an 8-byte cached
//! cardinality) then 16384 registers of 6 bits, either dense (packed little-endian, 12288
//! bytes) or sparse (runs: ZERO `00xxxxxx` = 1..64 zero registers, XZERO `01xxxxxx yyyyyyyy` =
//! 1..16384 zero registers, VAL `1vvvvvxx` = 1..4 registers of value 1..32). The estimate is
//! Otmar Ertl's improved raw estimator over the histogram of register values ("New
//! cardinality estimation algorithms for HyperLogLog sketches", arXiv:1702.01284), which
//! Redis uses since 5.0.

/// Registers of a Redis HyperLogLog (2^14: 14 bits of the hash pick the register).
pub(super) const REGISTERS: usize = 1 << 14;
/// Bits of the hash left to count leading zeros in (64 - 14): a register holds at most
/// `Q + 1`.
const Q: usize = 64 - 14;
/// Bytes of the header before the registers.
const HEADER: usize = 16;
/// Bytes of a dense HyperLogLog (header and 16384 6-bit registers).
const DENSE_SIZE: usize = HEADER + REGISTERS * 6 / 8;
/// The estimator's constant for a large number of registers, 1 / (2 ln 2).
const ALPHA_INF: f64 = 0.721_347_520_444_481_7;

/// Why a value could not be merged; each is a different Redis error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Invalid {
    /// Not a HyperLogLog at all (too short, no `HYLL` magic, an unknown encoding, a dense
    /// value of the wrong size): Redis's `WRONGTYPE Key is not a valid HyperLogLog…`.
    NotHll,
    /// A sparse value whose runs do not cover the registers exactly: Redis's `INVALIDOBJ`.
    Corrupt,
}

impl Invalid {
    /// The error Redis answers PFCOUNT with for such a value.
    pub(super) fn reply(self) -> &'static [u8] {
        match self {
            Invalid::NotHll => b"-WRONGTYPE Key is not a valid HyperLogLog string value.\r\n",
            Invalid::Corrupt => b"-INVALIDOBJ Corrupted HLL object detected\r\n",
        }
    }
}

/// The registers of several HyperLogLogs merged, one value per register.
pub(super) struct Registers(
    /// Each register's largest value over the merged keys (0 to 63), boxed: 16 KiB.
    Box<[u8; REGISTERS]>,
);

impl Default for Registers {
    fn default() -> Self {
        Registers(Box::new([0; REGISTERS]))
    }
}

impl Registers {
    /// Merges one key's value (a GET reply's content) into the registers: each register
    /// keeps the larger of its value and the key's.
    pub(super) fn merge(&mut self, value: &[u8]) -> Result<(), Invalid> {
        if value.len() < HEADER || &value[..4] != b"HYLL" {
            return Err(Invalid::NotHll);
        }
        match value[4] {
            0 if value.len() == DENSE_SIZE => {
                self.merge_dense(&value[HEADER..]);
                Ok(())
            }
            1 => self.merge_sparse(&value[HEADER..]),
            _ => Err(Invalid::NotHll),
        }
    }

    /// Dense registers: register `i` is the 6 bits from bit `6 i`, least significant first.
    fn merge_dense(&mut self, packed: &[u8]) {
        for (i, register) in self.0.iter_mut().enumerate() {
            let (byte, bit) = (i * 6 / 8, i * 6 % 8);
            let low = u16::from(packed.get(byte).copied().unwrap_or(0));
            let high = u16::from(packed.get(byte + 1).copied().unwrap_or(0));
            let value = (((high << 8) | low) >> bit) as u8 & 0x3f;
            *register = (*register).max(value);
        }
    }

    /// Sparse runs; they must cover exactly the registers (Redis refuses the value
    /// otherwise, after merging what it read: the refusal fails the whole command anyway).
    fn merge_sparse(&mut self, runs: &[u8]) -> Result<(), Invalid> {
        let mut i = 0usize;
        let mut p = 0usize;
        while let Some(&op) = runs.get(p) {
            if op & 0xc0 == 0 {
                // ZERO: 1..64 zero registers.
                i += usize::from(op & 0x3f) + 1;
                p += 1;
            } else if op & 0xc0 == 0x40 {
                // XZERO: 1..16384 zero registers, over two bytes. Redis reads a missing
                // second byte as the string's terminating zero.
                let low = usize::from(runs.get(p + 1).copied().unwrap_or(0));
                i += ((usize::from(op & 0x3f) << 8) | low) + 1;
                p += 2;
            } else {
                // VAL: 1..4 registers of value 1..32.
                let value = ((op >> 2) & 0x1f) + 1;
                let len = usize::from(op & 0x03) + 1;
                let Some(registers) = self.0.get_mut(i..i + len) else {
                    return Err(Invalid::Corrupt);
                };
                for r in registers {
                    *r = (*r).max(value);
                }
                i += len;
                p += 1;
            }
        }
        if i == REGISTERS {
            Ok(())
        } else {
            Err(Invalid::Corrupt)
        }
    }

    /// The cardinality estimate of the merged registers (Ertl's improved raw estimator).
    pub(super) fn count(&self) -> u64 {
        let mut histogram = [0u32; 64];
        for &r in self.0.iter() {
            histogram[usize::from(r & 0x3f)] += 1;
        }
        let m = REGISTERS as f64;
        let mut z = m * tau((m - f64::from(histogram[Q + 1])) / m);
        for k in (1..=Q).rev() {
            z += f64::from(histogram[k]);
            z *= 0.5;
        }
        z += m * sigma(f64::from(histogram[0]) / m);
        // The same order of operations as Redis, so the same rounding; `round` is half away
        // from zero, as C's llround.
        let estimate = (ALPHA_INF * m * m / z).round();
        if estimate.is_finite() && estimate >= 0.0 {
            estimate as u64
        } else {
            0
        }
    }
}

/// The estimator's σ(x) = x + Σ_{k≥1} x^(2^k) 2^(k-1), summed until it stops changing
/// (infinite for x = 1: every register zero, which gives an estimate of 0).
fn sigma(x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let (mut x, mut y, mut z) = (x, 1.0, x);
    loop {
        x *= x;
        let before = z;
        z += x * y;
        y += y;
        if z == before {
            return z;
        }
    }
}

/// The estimator's τ(x) = (1 - x - Σ_{k≥1} (1 - x^(2^-k))² 2^-k) / 3, summed until it stops
/// changing.
fn tau(x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let (mut x, mut y, mut z) = (x, 1.0, 1.0 - x);
    loop {
        x = x.sqrt();
        let before = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if z == before {
            return z / 3.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value with the header and `encoding`, then `body`.
    fn value(encoding: u8, body: &[u8]) -> Vec<u8> {
        let mut v = b"HYLL".to_vec();
        v.extend_from_slice(&[encoding, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        v.extend_from_slice(body);
        v
    }

    /// An empty sparse HyperLogLog, as PFADD writes one: one XZERO run of 16384.
    fn empty_sparse() -> Vec<u8> {
        value(1, &[0x7f, 0xff])
    }

    /// A dense value with the given registers set.
    fn dense(set: &[(usize, u8)]) -> Vec<u8> {
        let mut packed = vec![0u8; REGISTERS * 6 / 8 + 1];
        for &(i, v) in set {
            let (byte, bit) = (i * 6 / 8, i * 6 % 8);
            let word = u16::from(v) << bit;
            packed[byte] |= word as u8;
            packed[byte + 1] |= (word >> 8) as u8;
        }
        packed.pop();
        value(0, &packed)
    }

    #[test]
    fn empty_values_count_zero() {
        let mut r = Registers::default();
        assert_eq!(r.count(), 0);
        r.merge(&empty_sparse()).unwrap();
        r.merge(&dense(&[])).unwrap();
        assert_eq!(r.count(), 0);
    }

    #[test]
    fn sparse_and_dense_decode_to_the_same_registers() {
        // Registers 0 and 16383 at 3, register 100 at 32: sparse VAL runs around zero runs.
        let mut sparse = Registers::default();
        // An XZERO run of `n` registers, written as n - 1 over 14 bits.
        let xzero = |n: usize| [0x40 | ((n - 1) >> 8) as u8, ((n - 1) & 0xff) as u8];
        let mut runs = vec![0x80 | (2 << 2)]; // VAL 3, once (register 0)
        runs.extend_from_slice(&xzero(99)); // registers 1..=99
        runs.push(0x80 | (31 << 2)); // VAL 32, once (register 100)
        runs.extend_from_slice(&xzero(16282)); // registers 101..=16382
        runs.push(0x80 | (2 << 2)); // VAL 3, once (register 16383)
        sparse.merge(&value(1, &runs)).unwrap();
        let mut packed = Registers::default();
        packed
            .merge(&dense(&[(0, 3), (100, 32), (16383, 3)]))
            .unwrap();
        assert_eq!(sparse.0[..], packed.0[..]);
        assert_eq!((sparse.0[0], sparse.0[100], sparse.0[16383]), (3, 32, 3));
        assert_eq!(sparse.0.iter().filter(|&&r| r != 0).count(), 3);
    }

    #[test]
    fn merge_keeps_the_largest_value_per_register() {
        let mut r = Registers::default();
        r.merge(&dense(&[(5, 2), (6, 7)])).unwrap();
        r.merge(&dense(&[(5, 4), (6, 1), (63, 63)])).unwrap();
        assert_eq!((r.0[5], r.0[6], r.0[63]), (4, 7, 63));
    }

    #[test]
    fn invalid_values_are_refused_as_redis_does() {
        let mut r = Registers::default();
        assert_eq!(r.merge(b"text"), Err(Invalid::NotHll));
        assert_eq!(
            r.merge(b"HYLX\x01\0\0\0\0\0\0\0\0\0\0\0\x7f\xff"),
            Err(Invalid::NotHll)
        );
        assert_eq!(r.merge(&value(2, &[0x7f, 0xff])), Err(Invalid::NotHll));
        // Dense of the wrong size.
        assert_eq!(r.merge(&value(0, &[0; 100])), Err(Invalid::NotHll));
        // Sparse runs short of, or past, the 16384 registers.
        assert_eq!(r.merge(&value(1, &[0x7f, 0xfe])), Err(Invalid::Corrupt));
        assert_eq!(
            r.merge(&value(1, &[0x7f, 0xff, 0x80])),
            Err(Invalid::Corrupt)
        );
        assert_eq!(r.merge(&value(1, &[])), Err(Invalid::Corrupt));
        // A VAL run crossing the end.
        assert_eq!(
            r.merge(&value(1, &[0x7f, 0xfe, 0x83])),
            Err(Invalid::Corrupt)
        );
        assert_eq!(
            Invalid::NotHll.reply(),
            b"-WRONGTYPE Key is not a valid HyperLogLog string value.\r\n"
        );
    }

    #[test]
    fn the_estimate_follows_the_register_histogram() {
        // One register at 1, the rest zero: linear counting's regime, about 1.
        let mut r = Registers::default();
        r.merge(&dense(&[(7, 1)])).unwrap();
        assert_eq!(r.count(), 1);
        // Every register at 1: around 1.4 m by the estimator (the exact value, as Redis's,
        // is checked against real servers in tests/cluster_cross_slot.rs).
        let all: Vec<(usize, u8)> = (0..REGISTERS).map(|i| (i, 1)).collect();
        let mut full = Registers::default();
        full.merge(&dense(&all)).unwrap();
        let n = full.count();
        assert!((20_000..30_000).contains(&n), "{n}");
        assert_eq!(sigma(1.0), f64::INFINITY);
        assert_eq!(tau(0.0), 0.0);
        assert_eq!(tau(1.0), 0.0);
    }
}
