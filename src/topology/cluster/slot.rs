//! Key → hash slot, exactly as Redis Cluster computes it (`keyHashSlot` in Redis's
//! `cluster.c`): CRC16 of the key, or of its hash tag, modulo 16384.
//!
//! The CRC is written here rather than taken from the `crc16` crate: that crate has had no
//! release since 2018, and the whole algorithm is lookup tables built at compile time plus a
//! short loop, which is less to audit than a dependency. `redis-protocol`'s
//! `redis_keyslot` computes the same slots (a test compares them) but measured 1.1–1.7×
//! slower on tagged and long keys (`benches/slot.rs`, docs/architecture.md), and this runs
//! once per keyed command. A wrong slot would send every
//! command to the wrong node (and then through a MOVED), so the tests pin the function to
//! published check values and the integration test compares it with `CLUSTER KEYSLOT`.

use crate::protocol::find::find;

/// Number of hash slots in a Redis Cluster; fixed by the protocol.
pub const SLOTS: usize = 16384;

/// CRC16-CCITT in the XMODEM variant: polynomial 0x1021, initial value 0, no reflection, no
/// final XOR. Redis's `crc16.c` names it "CRC-CCITT (XModem)"; its check value over the ASCII
/// bytes `123456789` is 0x31C3.
const POLY: u16 = 0x1021;

/// The byte-at-a-time lookup table (`SLICES[0]`, also used alone for a key's last bytes): the
/// CRC of one byte `v` from a zero state, `(v << 8)` shifted through eight bits. Computed by
/// the compiler so startup costs nothing.
const fn byte_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ POLY
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

/// Slicing by eight: `SLICES[k][v]` is the CRC of byte `v` followed by `k` zero bytes, from a
/// zero state. The CRC is linear, so eight bytes fold into the state at once as the XOR of
/// eight independent lookups (the first two bytes XORed with the state's two) instead of a
/// chain of eight dependent ones: a 16-byte key costs two steps, not sixteen (the byte loop
/// was 4% of the proxy's CPU at cluster `-P 16`; `benches/slot.rs`). 4 KiB of tables.
static SLICES: [[u16; 256]; 8] = {
    let mut slices = [[0u16; 256]; 8];
    slices[0] = byte_table();
    let mut k = 1;
    while k < 8 {
        let mut v = 0;
        while v < 256 {
            // One more zero byte after the CRC of the shorter run.
            let prev = slices[k - 1][v];
            slices[k][v] = (prev << 8) ^ slices[0][(prev >> 8) as usize];
            v += 1;
        }
        k += 1;
    }
    slices
};

/// CRC16 (XMODEM) of `data`.
pub(crate) fn crc16(data: &[u8]) -> u16 {
    let mut chunks = data.chunks_exact(8);
    let mut crc = 0u16;
    for c in &mut chunks {
        let [hi, lo] = crc.to_be_bytes();
        crc = SLICES[7][usize::from(hi ^ c[0])]
            ^ SLICES[6][usize::from(lo ^ c[1])]
            ^ SLICES[5][usize::from(c[2])]
            ^ SLICES[4][usize::from(c[3])]
            ^ SLICES[3][usize::from(c[4])]
            ^ SLICES[2][usize::from(c[5])]
            ^ SLICES[1][usize::from(c[6])]
            ^ SLICES[0][usize::from(c[7])];
    }
    chunks.remainder().iter().fold(crc, |crc, &b| {
        (crc << 8) ^ SLICES[0][usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The part of `key` that Redis hashes: the bytes between the first `{` and the first `}`
/// after it, when there are any; otherwise the whole key. `{}` (an empty tag) means "no tag",
/// so `foo{}{bar}` hashes whole, and `foo{{bar}}` hashes `{bar`.
///
/// Exposed because namespacing must keep a client's hash tag working: a prefix added in front
/// of a tagged key leaves the tag (and so the slot) as it was, but a prefix in front of an
/// untagged key changes its slot.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    // Most keys are short: `find` searches them in a register (docs/performance.md).
    if let Some(open) = find(b'{', key) {
        let rest = &key[open + 1..];
        if let Some(close) = find(b'}', rest) {
            if close > 0 {
                return &rest[..close];
            }
        }
    }
    key
}

/// The hash slot of `key`, in `0..16384`.
pub fn slot(key: &[u8]) -> u16 {
    // 16384 is a power of two, so the modulo is a mask (as in Redis).
    crc16(hash_tag(key)) & (SLOTS as u16 - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bit-at-a-time CRC with no table, to check the table against.
    fn crc16_bitwise(data: &[u8]) -> u16 {
        let mut crc = 0u16;
        for &b in data {
            crc ^= u16::from(b) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ POLY
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    #[test]
    fn crc16_check_value() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn table_matches_the_bitwise_definition() {
        let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for end in 0..data.len() {
            assert_eq!(crc16(&data[..end]), crc16_bitwise(&data[..end]));
        }
    }

    #[test]
    fn slots_of_known_keys() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"hello"), 866);
        assert_eq!(slot(b""), 0);
        assert_eq!(slot(b"123456789"), 0x31C3 & 0x3FFF);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // An empty tag means no tag: the whole key is hashed.
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") & 0x3FFF);
        // The tag ends at the first `}` after the first `{`.
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        // An unclosed brace is no tag.
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar");
        assert_eq!(hash_tag(b"}foo{bar}"), b"bar");
        // A prefix in front of a tagged key keeps its slot; in front of an untagged one it
        // does not (in general).
        assert_eq!(slot(b"tenant:{user1}.x"), slot(b"{user1}.x"));
        assert_ne!(slot(b"tenant:foo"), slot(b"foo"));
    }

    #[test]
    fn agrees_with_redis_protocol() {
        // Every shape of brace placement over a small alphabet, plus long and binary keys.
        let alphabet = [b'a', b'{', b'}', b'x'];
        let mut keys: Vec<Vec<u8>> = vec![Vec::new()];
        for len in 1..=6 {
            let mut i = 0usize;
            while i < alphabet.len().pow(len) {
                let mut n = i;
                keys.push(
                    (0..len)
                        .map(|_| {
                            let b = alphabet[n % alphabet.len()];
                            n /= alphabet.len();
                            b
                        })
                        .collect(),
                );
                i += 1;
            }
        }
        for i in 0..2000u32 {
            keys.push(format!("user:{i}").into_bytes());
            keys.push(format!("{{user{i}}}:followers").into_bytes());
            keys.push(format!("foo{{}}{{bar{i}}}").into_bytes());
            keys.push(i.to_le_bytes().repeat(40));
        }
        for k in &keys {
            assert_eq!(slot(k), redis_protocol::redis_keyslot(k), "{k:?}");
        }
    }
}
