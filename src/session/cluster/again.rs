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
