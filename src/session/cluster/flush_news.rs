//! Cluster mode: which RESP3 invalidations of every key (a flush's null) reach a client
//! (see [`FlushNews`]). Its own module so that `state`, which holds it, and `tracking`,
//! which hears the nulls, need not import each other.

/// The invalidation of every key (a flush), in RESP3.
pub(in crate::session) const FLUSHED: &[u8] = b">2\r\n$10\r\ninvalidate\r\n_\r\n";

/// Where the nulls of a connection known to be a node's are counted (`FlushNews::heard`):
/// bit 60, which no connection id of a session has (kinds are bits 61–63, counters stay far
/// below).
pub(in crate::session) const NODE_SOURCE: u64 = 1 << 60;

/// At most this many sources counted; past it the counts start over (a client that turned
/// tracking on and off on pinned connections many times), which can only pass more nulls.
const FLUSH_SOURCES: usize = 64;

/// Which RESP3 invalidations of every key (a flush's null) reach a client in front of a
/// cluster. A FLUSHALL or FLUSHDB goes to every primary, and each node tells its connection
/// "everything", where one Redis tells the client once per flush. Two rules, both needed:
/// - *Count*: the nulls are counted per node; one is news when its node has now sent more
///   than any node had (the cluster made another flush), so two flushes are two nulls, as
///   from one Redis, whichever node's comes first.
/// - *Safety*: a null that is not news is dropped only when no reply lies between it and
///   the last null passed, in the client's reply order (`ReplyQueue::mark_at`). A client
///   caches only what replies bring, so it holds nothing the dropped null would clear. With
///   a reply between (a read on a node whose flush had not run yet: a cluster's flush is not
///   atomic) the null is passed, late and safe.
///
/// An earlier rule dropped a null only while the one before it was unwritten, so a null
/// that came once the first was written went through: two for one FLUSHDB (state fuzzer,
/// seed 98716988, in CI).
#[derive(Default)]
pub(in crate::session) struct FlushNews {
    /// Nulls heard per source (`NODE_SOURCE | node`, or the connection id of one that is no
    /// node's known connection, such as a pinned session's dedicated one).
    heard: Vec<(u64, u32)>,
    /// The most nulls any one source sent: the flushes the client was told of.
    most: u32,
    /// The reply-order mark of the last null passed (`ReplyQueue::mark_at`).
    last: Option<u64>,
}

impl FlushNews {
    /// Whether the null from `source`, at reply-order mark `mark`, goes to the client.
    pub(in crate::session) fn pass(&mut self, source: u64, mark: u64) -> bool {
        if self.heard.len() >= FLUSH_SOURCES && !self.heard.iter().any(|(s, _)| *s == source) {
            self.heard.clear();
            self.most = 0;
        }
        let count = match self.heard.iter_mut().find(|(s, _)| *s == source) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.heard.push((source, 1));
                1
            }
        };
        let news = count > self.most;
        self.most = self.most.max(count);
        let pass = news || self.last != Some(mark);
        if pass {
            self.last = Some(mark);
        }
        pass
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_flush_is_one_null_however_many_nodes_tell_it() {
        let mut news = FlushNews::default();
        // Three nodes tell one flush; no reply between (mark 5 throughout).
        assert!(news.pass(NODE_SOURCE | 1, 5));
        assert!(!news.pass(NODE_SOURCE | 2, 5));
        assert!(!news.pass(NODE_SOURCE | 3, 5));
        // Two flushes: node 1 tells both before the others tell any.
        assert!(news.pass(NODE_SOURCE | 1, 5));
        assert!(news.pass(NODE_SOURCE | 1, 5));
        for node in [2, 3, 2, 3] {
            assert!(!news.pass(NODE_SOURCE | node, 5), "node {node}");
        }
    }

    #[test]
    fn a_null_after_a_reply_is_passed_though_it_is_no_news() {
        let mut news = FlushNews::default();
        assert!(news.pass(NODE_SOURCE | 1, 5));
        // A read on node 2 answered before node 2's flush ran: its null must follow it.
        assert!(news.pass(NODE_SOURCE | 2, 6));
        assert!(!news.pass(NODE_SOURCE | 3, 6));
    }

    #[test]
    fn counts_start_over_past_the_sources_kept() {
        let mut news = FlushNews::default();
        for conn in 0..FLUSH_SOURCES as u64 {
            news.pass(conn, 1);
        }
        assert_eq!(news.heard.len(), FLUSH_SOURCES);
        assert!(
            news.pass(FLUSH_SOURCES as u64, 1),
            "counting again from one"
        );
        assert_eq!(news.heard.len(), 1);
    }
}
