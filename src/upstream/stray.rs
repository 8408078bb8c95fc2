//! Pushes that arrive where nothing asked for them: a shared connection never subscribes or
//! tracks, so a RESP3 push there (an invalidation sent by a `CLIENT TRACKING … REDIRECT` that
//! names the connection) answers no request. Taken for a reply, it would shift every later
//! reply onto the wrong client's request: one tenant reading another's values (issue 26). It
//! is dropped, counted and logged, at most once per `LOG_EVERY` per connection, so a flood of
//! them cannot flood the log.

use std::time::Duration;

use tokio::time::Instant;

use crate::observe::metrics::Metrics;
use crate::protocol::reply::{self, PubSubFrame};

/// Least time between two log lines about one connection's stray pushes.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether a frame read on a shared connection is a reply to the batch at the head of its
/// queue (`waiting`: one is). Every reply is a reply, except a push: the one push Redis
/// sends as a reply there is an UNSUBSCRIBE-family confirmation (a RESP3 client's
/// UNSUBSCRIBE without subscriptions takes the shared path); anything else pushed is stray.
pub(crate) fn is_reply(frame: &[u8], waiting: bool) -> bool {
    if frame.first() != Some(&b'>') {
        return true;
    }
    waiting
        && matches!(
            reply::classify_pubsub(frame),
            PubSubFrame::Confirmation {
                subscribe: false,
                ..
            }
        )
}

/// One shared connection's record of stray pushes, for its rate-limited log.
#[derive(Default)]
pub(crate) struct StrayPushes {
    /// When the last log line was written (`None`: never).
    logged_at: Option<Instant>,
    /// Pushes dropped since that line.
    unlogged: u64,
}

impl StrayPushes {
    /// Counts a dropped push of `len` bytes on the connection to `addr`, and logs it unless
    /// one was logged within `LOG_EVERY`.
    pub(crate) fn dropped(&mut self, addr: &str, frame: &[u8], metrics: Option<&Metrics>) {
        if let Some(m) = metrics {
            m.upstream_stray_pushes.inc();
        }
        self.unlogged += 1;
        let now = Instant::now();
        if self
            .logged_at
            .is_some_and(|at| now.duration_since(at) < LOG_EVERY)
        {
            return;
        }
        let kind = match reply::element(frame, 0) {
            Some(k) => String::from_utf8_lossy(&k[..k.len().min(32)]).into_owned(),
            None => "?".into(),
        };
        tracing::warn!(
            upstream = %addr,
            kind,
            dropped = self.unlogged,
            "push frame on a shared upstream connection dropped (a CLIENT TRACKING REDIRECT names it?); counted in rpp_upstream_stray_pushes_total"
        );
        self.logged_at = Some(now);
        self.unlogged = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unsubscribe_confirmation_is_a_pushed_reply() {
        let invalidate = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n";
        assert!(!is_reply(invalidate, true));
        assert!(!is_reply(invalidate, false));
        let message = b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n";
        assert!(!is_reply(message, true));
        let subscribe = b">3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n";
        assert!(!is_reply(subscribe, true));
        let unsubscribe = b">3\r\n$11\r\nunsubscribe\r\n_\r\n:0\r\n";
        assert!(is_reply(unsubscribe, true));
        assert!(!is_reply(unsubscribe, false), "nothing asked for it");
        assert!(is_reply(b"+OK\r\n", true));
        assert!(
            is_reply(b"*1\r\n$7\r\nmessage\r\n", true),
            "RESP2 arrays are replies"
        );
    }
}
