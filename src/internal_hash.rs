//! A hasher for keys the proxy made itself (command-table addresses, hash slots): no client
//! chooses them, so one multiplication is enough where std's SipHash, built against chosen
//! keys, costs per command (the policy's plan lookup; the cluster's in-flight slot map, where
//! SipHash was 2.2% of the proxy's CPU at `-P 16`, perf 2026-12-05).

/// See the module: integers are mixed by one multiplication, bytes (never hashed on a hot
/// path) by FNV-1a.
#[derive(Default, Clone, Copy)]
pub(crate) struct InternalHasher(u64);

/// Fibonacci hashing, rotated so that both the low bits (the table's bucket) and the high
/// bits (its control byte) depend on every bit of `n`.
fn mix(n: u64) -> u64 {
    n.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29)
}

impl std::hash::Hasher for InternalHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u16(&mut self, n: u16) {
        self.0 = mix(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = mix(n as u64);
    }
}

/// The `BuildHasher` of [`InternalHasher`], for `HashMap`/`DashMap` type parameters.
pub(crate) type BuildInternalHasher = std::hash::BuildHasherDefault<InternalHasher>;
