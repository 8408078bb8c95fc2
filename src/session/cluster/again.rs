//! A node's reply that asks for a command again elsewhere: MOVED and ASK (another node) or
//! TRYAGAIN (the same node, later), read from a reply frame.

use crate::protocol::find::find;
use crate::topology::cluster::Redirect;
use std::sync::Arc;

/// A command to send again, and where. Here, not in `redirect`, because `transaction` acts on
/// it too (a transaction's queued commands redirected) and `redirect` imports `transaction`.
pub(super) enum Again {
    /// MOVED or ASK: to the node named.
    Redirect(Redirect),
    /// TRYAGAIN (a multi-key command whose keys are split by a migration in progress): to the
    /// same node, after a short wait.
    TryAgain(Arc<str>),
}

impl Again {
    pub(super) fn addr(&self) -> &Arc<str> {
        match self {
            Again::Redirect(r) => r.addr(),
            Again::TryAgain(addr) => addr,
        }
    }

    pub(super) fn is_ask(&self) -> bool {
        matches!(self, Again::Redirect(Redirect::Ask { .. }))
    }
}

/// Whether a reply frame asks for the command to be sent again.
pub(super) fn again_of(frame: &[u8], answered_by: &str) -> Option<Again> {
    if frame.starts_with(b"-TRYAGAIN") {
        return Some(Again::TryAgain(answered_by.into()));
    }
    redirect_of(frame, answered_by).map(Again::Redirect)
}

/// The redirection a reply frame is, if it is one.
pub(super) fn redirect_of(frame: &[u8], answered_by: &str) -> Option<Redirect> {
    if frame.first() != Some(&b'-') {
        return None;
    }
    Redirect::parse(frame, answered_by).ok().flatten()
}

/// Whether a batch's replies may hold a MOVED, ASK or TRYAGAIN (a cheap scan; values that
/// happen to contain the text are sorted out by parsing each frame).
pub(super) fn may_redirect(data: &[u8]) -> bool {
    // One pass over the replies for a line that starts an error (rare), rather than one per
    // redirection kind: three scans of every reply were 1.3% of the proxy's CPU at `-P 16`.
    // The searcher is built once: built per reply it was another 0.4%.
    static ERROR_LINE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\r\n-"));
    if data.strip_prefix(b"-").is_some_and(redirection_text) {
        return true;
    }
    if data.len() <= SHORT_REPLIES {
        return short_may_redirect(data);
    }
    ERROR_LINE
        .find_iter(data)
        .any(|at| redirection_text(&data[at + 3..]))
}

/// Replies up to this long are searched for `\r\n-` by their `-` bytes (`short_may_redirect`):
/// most batches' replies are a few short frames (`+OK`, `$-1`, a small bulk), where the
/// `memmem` searcher's setup per call cost more than the search, ~150 instructions per
/// request at cluster `-P 1` (callgrind, docs/performance.md).
const SHORT_REPLIES: usize = 128;

/// Whether `at` (what follows an error's `-`) is a MOVED, ASK or TRYAGAIN.
fn redirection_text(at: &[u8]) -> bool {
    at.starts_with(b"MOVED ") || at.starts_with(b"ASK ") || at.starts_with(b"TRYAGAIN")
}

/// [`may_redirect`]'s search past the first byte for a short `data`: each `-` found (in a
/// register, `protocol::find`) that follows a line end and starts a redirection.
fn short_may_redirect(data: &[u8]) -> bool {
    let mut from = 1;
    while let Some(i) = data.get(from..).and_then(|rest| find(b'-', rest)) {
        let at = from + i;
        if at >= 2 && data[at - 2..at] == *b"\r\n" && redirection_text(&data[at + 1..]) {
            return true;
        }
        from = at + 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The search as it was before the short path: the reference `may_redirect` must agree
    /// with on every input.
    fn by_memmem(data: &[u8]) -> bool {
        data.strip_prefix(b"-").is_some_and(redirection_text)
            || memchr::memmem::find_iter(data, b"\r\n-").any(|at| redirection_text(&data[at + 3..]))
    }

    #[test]
    fn the_short_search_agrees_with_the_memmem_search() {
        let pieces: [&[u8]; 12] = [
            b"+OK\r\n",
            b"$-1\r\n",
            b"-MOVED 1 127.0.0.1:7000\r\n",
            b"-ASK 2 127.0.0.1:7001\r\n",
            b"-TRYAGAIN Multiple keys\r\n",
            b"-ERR wrong\r\n",
            b"$6\r\n-MOVED\r\n",
            b":-1\r\n",
            b"\r\n-",
            b"-",
            b"MOVED ",
            b"$3\r\na-b\r\n",
        ];
        // Every sequence of up to four pieces, and every prefix of each (a cut anywhere).
        let mut checked = 0;
        let mut seqs: Vec<Vec<u8>> = vec![Vec::new()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for s in &seqs {
                for p in pieces {
                    let mut v = s.clone();
                    v.extend_from_slice(p);
                    next.push(v);
                }
            }
            for s in &next {
                for cut in 0..=s.len() {
                    let data = &s[..cut];
                    assert_eq!(
                        may_redirect(data),
                        by_memmem(data),
                        "{:?}",
                        String::from_utf8_lossy(data)
                    );
                    checked += 1;
                }
            }
            seqs = next;
        }
        assert!(checked > 100_000);
        // Long replies take the memmem path, with the same answers.
        let mut long = b"+OK\r\n".repeat(40);
        assert!(long.len() > SHORT_REPLIES && !may_redirect(&long));
        long.extend_from_slice(b"-MOVED 3 127.0.0.1:7002\r\n");
        assert!(may_redirect(&long));
    }
}
