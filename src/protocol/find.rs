//! Finding one byte in the short stretches the wire is made of: a RESP line's end (`$5`,
//! `+OK`, `:1000`, a command's `*3`) and a key's hash-tag braces. `memchr` sets up a vector
//! search per call, which costs more than such a line holds; eight bytes at a time in a
//! register are cheaper there, and `memchr` takes over past the first `IN_REGISTER` bytes.
//! Measured with callgrind (instructions per request, `-P 16` GET/SET; docs/performance.md,
//! "Redis Cluster, placement and line ends").

use memchr::memchr;

/// Bytes searched eight at a time before `memchr` takes over: longer than the lines of a
/// request or a reply usually are (a bulk length, a status, an integer), short enough that a
/// long line (an error message, an inline command) reaches the vector search soon.
const IN_REGISTER: usize = 32;

/// The index of the first `b` in `haystack`.
#[inline]
pub(crate) fn find(b: u8, haystack: &[u8]) -> Option<usize> {
    let head = &haystack[..haystack.len().min(IN_REGISTER)];
    match find_in_words(b, head) {
        Some(i) => Some(i),
        None if haystack.len() > IN_REGISTER => {
            memchr(b, &haystack[IN_REGISTER..]).map(|i| i + IN_REGISTER)
        }
        None => None,
    }
}

/// The first `b` in `within`, eight bytes at a time: a byte of `x = word ^ (b * 0x01…01)` is
/// zero where `b` is, and `(x - 0x01…01) & !x & 0x80…80` sets the top bit of the lowest zero
/// byte (a higher byte may be flagged wrongly, by the borrow, only above a real zero, so the
/// lowest flag is exact).
#[inline]
fn find_in_words(b: u8, within: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const TOPS: u64 = ONES << 7;
    let pattern = ONES * u64::from(b);
    let mut chunks = within.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word) ^ pattern;
        let found = x.wrapping_sub(ONES) & !x & TOPS;
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| c == b)
        .map(|i| at + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length around the register part and the vector part, the byte at every place
    /// (and twice), between neighbours where a borrow or a top bit would flag the wrong byte.
    #[test]
    fn finds_the_first_byte_as_a_byte_loop_does() {
        let fill = [
            b'a',
            b'z',
            b'|',
            b'\n',
            b'\r' ^ 0x80,
            0x0c,
            0xff,
            0x00,
            0x01,
            b'~',
        ];
        for target in [b'{', b'\r', 0x00, 0xff] {
            for len in 0..=IN_REGISTER * 2 + 9 {
                for f in fill.into_iter().filter(|&f| f != target) {
                    let mut hay = vec![f; len];
                    assert_eq!(find(target, &hay), None);
                    for first in 0..len {
                        for second in [first, (first + 1).min(len - 1), len - 1] {
                            hay.fill(f);
                            hay[second] = target;
                            hay[first] = target;
                            assert_eq!(find(target, &hay), Some(first), "{hay:?}");
                        }
                    }
                }
            }
        }
    }
}
