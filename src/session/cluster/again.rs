//! A node's reply that asks for a command again elsewhere: MOVED and ASK (another node) or
//! TRYAGAIN (the same node, later), read from a reply frame.

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
    let redirect = |at: &[u8]| {
        at.starts_with(b"MOVED ") || at.starts_with(b"ASK ") || at.starts_with(b"TRYAGAIN")
    };
    // One pass over the replies for a line that starts an error (rare), rather than one per
    // redirection kind: three scans of every reply were 1.3% of the proxy's CPU at `-P 16`.
    // The searcher is built once: built per reply it was another 0.4%.
    static ERROR_LINE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\r\n-"));
    data.strip_prefix(b"-").is_some_and(redirect)
        || ERROR_LINE
            .find_iter(data)
            .any(|at| redirect(&data[at + 3..]))
}
