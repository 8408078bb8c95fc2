//! How large a value `RESTORE` would store, read from its DUMP payload.
//!
//! A DUMP payload is one RDB-encoded object, then a 2-byte RDB version and an 8-byte CRC64.
//! Strings in it may be LZF-compressed, and their header carries the uncompressed length: a
//! 56 KB payload can hold a 5 MB string, so the size of the argument says nothing about the
//! size of the value. This module reads the object's encoding (never decompresses anything)
//! and returns the largest single value it would store: a string's length, a collection's
//! largest element, or a bound on it where elements sit inside one packed blob (listpack,
//! ziplist, intset: no element is longer than its blob). What it cannot read to a bound
//! (streams, module types, newer encodings, a truncated payload) is [`Size::Unknown`], with
//! why, and the `max_value_bytes` rule refuses it (fail closed). A payload whose checksum
//! is wrong is [`Size::NotAPayload`]: Redis refuses it itself (`DUMP payload version or
//! checksum are wrong`), so it is let through to get Redis's own error.

use super::line::CommandLine;
use crate::commands::CommandSpec;

/// What a payload would store, at most, per value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Size {
    /// The largest value is exactly this long.
    Exactly(u64),
    /// No value is longer than this (elements inside a packed blob).
    AtMost(u64),
    /// Cannot be told from the payload; why.
    Unknown(&'static str),
    /// Not a DUMP payload (too short, or its CRC64 does not match): Redis stores nothing.
    NotAPayload,
}

/// RDB object types (Redis's `rdb.h`).
mod rdb {
    pub(super) const STRING: u8 = 0;
    pub(super) const LIST: u8 = 1;
    pub(super) const SET: u8 = 2;
    pub(super) const ZSET: u8 = 3;
    pub(super) const HASH: u8 = 4;
    pub(super) const ZSET_2: u8 = 5;
    pub(super) const HASH_ZIPMAP: u8 = 9;
    pub(super) const LIST_ZIPLIST: u8 = 10;
    pub(super) const SET_INTSET: u8 = 11;
    pub(super) const ZSET_ZIPLIST: u8 = 12;
    pub(super) const HASH_ZIPLIST: u8 = 13;
    pub(super) const LIST_QUICKLIST: u8 = 14;
    pub(super) const HASH_LISTPACK: u8 = 16;
    pub(super) const ZSET_LISTPACK: u8 = 17;
    pub(super) const LIST_QUICKLIST_2: u8 = 18;
    pub(super) const SET_LISTPACK: u8 = 20;
}

/// Version and checksum after the object.
const TRAILER: usize = 10;
/// Longest decimal form of a 64-bit integer (`-9223372036854775808`): an intset element, or
/// an integer-encoded string, is never longer.
const INT_DIGITS: u64 = 20;

/// The largest value the DUMP `payload` would store.
pub(crate) fn largest_value(payload: &[u8]) -> Size {
    if payload.len() < TRAILER + 1 || !checksum_matches(payload) {
        return Size::NotAPayload;
    }
    let mut r = Reader {
        data: &payload[..payload.len() - TRAILER],
        at: 1,
    };
    let read = match payload[0] {
        rdb::STRING => r.string().map(Size::Exactly),
        rdb::LIST | rdb::SET => r.strings(1, false),
        rdb::HASH => r.strings(2, false),
        rdb::ZSET => r.strings(1, true),
        rdb::ZSET_2 => r.members_with_binary_scores(),
        // One packed blob: no element is longer than the whole.
        rdb::HASH_ZIPMAP
        | rdb::LIST_ZIPLIST
        | rdb::ZSET_ZIPLIST
        | rdb::HASH_ZIPLIST
        | rdb::HASH_LISTPACK
        | rdb::ZSET_LISTPACK
        | rdb::SET_LISTPACK => r.string().map(Size::AtMost),
        rdb::SET_INTSET => r.string().map(|_| Size::AtMost(INT_DIGITS)),
        rdb::LIST_QUICKLIST => r.quicklist(false),
        rdb::LIST_QUICKLIST_2 => r.quicklist(true),
        _ => Err("its type (a stream, a module type or a newer encoding) cannot be sized"),
    };
    read.unwrap_or_else(Size::Unknown)
}

/// The `max_value_bytes` refusal reason for a RESTORE (or RESTORE-ASKING) whose payload would
/// store a value above `max`, or whose size cannot be told; `None` for anything else.
pub(crate) fn refusal<L: CommandLine + ?Sized>(
    spec: &'static CommandSpec,
    line: &L,
    max: u64,
) -> Option<String> {
    if !matches!(spec.name, "restore" | "restore-asking") || line.argc() < 4 {
        return None;
    }
    let command = spec.name.to_ascii_uppercase();
    match largest_value(line.arg(3)) {
        Size::Exactly(n) | Size::AtMost(n) if n <= max => None,
        Size::NotAPayload => None,
        Size::Exactly(n) => Some(crate::protocol::answers::restore_value_above(
            &command, n, max,
        )),
        Size::AtMost(n) => Some(crate::protocol::answers::restore_value_may_be_above(
            &command, n, max,
        )),
        Size::Unknown(why) => Some(crate::protocol::answers::restore_size_unknown(
            &command, why, max,
        )),
    }
}

/// Whether the payload's last 8 bytes are the CRC64 (Jones, as Redis's `crc64`) of the rest,
/// little-endian, as `verifyDumpPayload` checks.
fn checksum_matches(payload: &[u8]) -> bool {
    let (body, crc) = payload.split_at(payload.len() - 8);
    let mut want = [0u8; 8];
    want.copy_from_slice(crc);
    crc64(body) == u64::from_le_bytes(want)
}

/// CRC-64/Jones (reflected polynomial 0x95ac9329ac4bc9b5, initial value and final XOR 0),
/// bit by bit: payloads are checked once per RESTORE, where a table would cost 2 KB for
/// little gain.
fn crc64(data: &[u8]) -> u64 {
    const POLY: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
    for &byte in data {
        crc ^= u64::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// A cursor over the object's bytes.
struct Reader<'a> {
    /// The object, without the version and checksum.
    data: &'a [u8],
    /// Next byte to read.
    at: usize,
}

/// What a read failed on.
type Why = &'static str;

/// Cut short: the payload ends inside the object.
const TRUNCATED: Why = "the payload ends inside the object";

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, Why> {
        let b = *self.data.get(self.at).ok_or(TRUNCATED)?;
        self.at += 1;
        Ok(b)
    }

    fn skip(&mut self, n: u64) -> Result<(), Why> {
        let end = u64::try_from(self.at)
            .ok()
            .and_then(|at| at.checked_add(n))
            .filter(|&end| end <= self.data.len() as u64)
            .ok_or(TRUNCATED)?;
        self.at = end as usize;
        Ok(())
    }

    fn big_endian(&mut self, n: usize) -> Result<u64, Why> {
        let mut v = 0u64;
        for _ in 0..n {
            v = (v << 8) | u64::from(self.byte()?);
        }
        Ok(v)
    }

    /// An RDB length; `Err` for the special (string) encodings, which are no length.
    fn length(&mut self) -> Result<u64, Why> {
        match self.encoded_length()? {
            Len::Plain(n) => Ok(n),
            Len::Special(_) => Err("a length is encoded as a string"),
        }
    }

    /// An RDB length or a string's special encoding (`rdbLoadLenByRef`).
    fn encoded_length(&mut self) -> Result<Len, Why> {
        let first = self.byte()?;
        Ok(match first >> 6 {
            0 => Len::Plain(u64::from(first & 0x3F)),
            1 => Len::Plain((u64::from(first & 0x3F) << 8) | u64::from(self.byte()?)),
            2 => match first {
                0x80 => Len::Plain(self.big_endian(4)?),
                0x81 => Len::Plain(self.big_endian(8)?),
                _ => return Err("a length has an unknown encoding"),
            },
            _ => Len::Special(first & 0x3F),
        })
    }

    /// A string's stored length (an LZF-compressed one's uncompressed length), past it.
    fn string(&mut self) -> Result<u64, Why> {
        match self.encoded_length()? {
            Len::Plain(n) => {
                self.skip(n)?;
                Ok(n)
            }
            // RDB_ENC_INT8/16/32: an integer, stored as its decimal form.
            Len::Special(kind @ 0..=2) => {
                let bytes = 1usize << kind;
                let mut v: i64 = 0;
                for i in 0..bytes {
                    v |= i64::from(self.byte()?) << (8 * i);
                }
                // Sign-extend the little-endian integer.
                let shift = 64 - 8 * bytes as u32;
                let v = (v << shift) >> shift;
                Ok(v.to_string().len() as u64)
            }
            // RDB_ENC_LZF: compressed length, uncompressed length, compressed bytes.
            Len::Special(3) => {
                let compressed = self.length()?;
                let length = self.length()?;
                self.skip(compressed)?;
                Ok(length)
            }
            Len::Special(_) => Err("a string has an unknown encoding"),
        }
    }

    /// A count, then that many groups of `per` strings (a zset's member followed by a score
    /// written as a string when `scores`): the longest string.
    fn strings(&mut self, per: u64, scores: bool) -> Result<Size, Why> {
        let count = self.length()?;
        let mut largest = 0;
        for _ in 0..count {
            for _ in 0..per {
                largest = largest.max(self.string()?);
            }
            if scores {
                // RDB_TYPE_ZSET's score: a length byte, or 253..=255 for nan/+inf/-inf.
                let len = self.byte()?;
                if len < 253 {
                    self.skip(u64::from(len))?;
                }
            }
        }
        Ok(Size::Exactly(largest))
    }

    /// RDB_TYPE_ZSET_2: members, each followed by an 8-byte binary score.
    fn members_with_binary_scores(&mut self) -> Result<Size, Why> {
        let count = self.length()?;
        let mut largest = 0;
        for _ in 0..count {
            largest = largest.max(self.string()?);
            self.skip(8)?;
        }
        Ok(Size::Exactly(largest))
    }

    /// A quicklist: nodes, each a packed blob (bounding its elements) or, in the second
    /// version, a `PLAIN` node holding one element as it is.
    fn quicklist(&mut self, containers: bool) -> Result<Size, Why> {
        let count = self.length()?;
        let (mut exact, mut bound) = (0, 0);
        for _ in 0..count {
            // QUICKLIST_NODE_CONTAINER_PLAIN is 1, PACKED 2.
            let plain = containers && self.length()? == 1;
            let n = self.string()?;
            if plain {
                exact = exact.max(n);
            } else {
                bound = bound.max(n);
            }
        }
        Ok(if bound > exact {
            Size::AtMost(bound)
        } else {
            Size::Exactly(exact)
        })
    }
}

/// An RDB length, or the special encoding of a string.
enum Len {
    /// A length.
    Plain(u64),
    /// RDB_ENCVAL's kind: 0..=2 an 8/16/32-bit integer, 3 LZF.
    Special(u8),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload a real redis-server 7.0 answered to DUMP (testdata/dump/README.md).
    fn dump(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/src/policy/testdata/dump/{name}.hex",
            env!("CARGO_MANIFEST_DIR")
        );
        let hex = std::fs::read_to_string(&path).unwrap();
        (0..hex.trim().len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn strings_are_sized_by_their_stored_length_compressed_or_not() {
        // SET str_lzf <200000 × a>: a 2,299-byte payload.
        let lzf = dump("str_lzf");
        assert!(lzf.len() < 3000);
        assert_eq!(largest_value(&lzf), Size::Exactly(200_000));
        // SET str_int 12345: integer-encoded, stored as 5 digits.
        assert_eq!(largest_value(&dump("str_int")), Size::Exactly(5));
        assert_eq!(largest_value(&dump("str_raw")), Size::Exactly(5));
    }

    #[test]
    fn collections_are_sized_by_their_largest_element_or_their_blob() {
        // HSET hash_big f <150000 × v> g w: a hashtable, the value LZF-compressed.
        assert_eq!(largest_value(&dump("hash_big")), Size::Exactly(150_000));
        // RPUSH list_plain <20000 × x> y: Redis 7.0 packs the large element in a listpack
        // node of its own (PLAIN nodes start at 1 GB), compressed: bounded by that node.
        assert_eq!(largest_value(&dump("list_plain")), Size::AtMost(20_015));
        // Listpacks: bounded by the blob (a few dozen bytes).
        for packed in ["list_lp", "hash_lp", "zset_lp"] {
            match largest_value(&dump(packed)) {
                Size::AtMost(n) => assert!(n < 40, "{packed}: {n}"),
                other => panic!("{packed}: {other:?}"),
            }
        }
        assert_eq!(largest_value(&dump("set_int")), Size::AtMost(INT_DIGITS));
    }

    #[test]
    fn what_cannot_be_sized_says_why() {
        assert!(matches!(
            largest_value(&dump("stream")),
            Size::Unknown(why) if why.contains("stream")
        ));
        let mut cut = dump("str_lzf");
        cut.drain(100..cut.len() - TRAILER);
        // A payload Redis refuses (wrong checksum) is Redis's to refuse.
        assert_eq!(largest_value(&cut), Size::NotAPayload);
        assert_eq!(largest_value(b"\x00"), Size::NotAPayload);
        assert_eq!(
            largest_value(&signed(&cut[..cut.len() - 8])),
            Size::Unknown(TRUNCATED)
        );
        // A huge count with nothing behind it ends at the payload's end.
        let huge = [
            rdb::SET,
            0x81,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            10,
            0,
        ];
        assert_eq!(largest_value(&signed(&huge)), Size::Unknown(TRUNCATED));
    }

    /// `body` (object and RDB version) with its checksum appended.
    fn signed(body: &[u8]) -> Vec<u8> {
        let mut out = body.to_vec();
        out.extend_from_slice(&crc64(body).to_le_bytes());
        out
    }

    #[test]
    fn the_checksum_is_redis_crc64() {
        // Redis's own test vector (crc64.c): crc64("123456789") = 0xe9c6d914c4b8d9ca.
        assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
        for name in ["str_lzf", "stream", "set_int"] {
            assert!(checksum_matches(&dump(name)), "{name}");
        }
    }
}
