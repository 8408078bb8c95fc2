//! Which upstream connection each client id names. A client learns its id from the proxy
//! (`CLIENT ID`, HELLO), and hands it to another client's `CLIENT UNBLOCK` or `CLIENT TRACKING
//! … REDIRECT`, which Redis must apply to that client's own connection: its dedicated one, the
//! only one Redis can unblock or send invalidations on for it. A client without one is not
//! blocked, and a REDIRECT to it has its session open one first (`summon`). (`CLIENT KILL` is
//! the proxy's own business: it closes the client, `client_kill`.)
//!
//! A connection is named by its node and Redis's id on that node: in cluster mode (and with
//! routes) each node numbers its connections on its own, so the same id on two nodes names
//! two connections, and a command naming one must go to its node. Standalone and Sentinel
//! upstreams are node 0.
//!
//! In cluster mode a client may also hold a connection on other nodes that hears what its
//! dedicated one hears on its own node: the extra connections of a subscriber of keyspace
//! notifications or of `__redis__:invalidate` (`cluster::keyspace`). Those are its
//! *listeners*, one per node, so another client's `CLIENT TRACKING … REDIRECT` spread over
//! every primary can name, on each node, the connection there that gets the invalidations
//! (`cluster::tracking`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use dashmap::DashMap;

/// How many gone connections [`ClientIds::client`] still names: Redis keeps naming a
/// redirect target that quit (`CLIENT TRACKINGINFO`'s `redirect` with `broken_redirect`) until
/// the tracker turns tracking off, and the client knows that target by its proxy id. A
/// bounded memory of the latest, as such a question comes soon after the target left.
const GONE: usize = 256;

/// A client's dedicated connection as Redis knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Upstream {
    /// The node it is connected to (the session's `Dedicated::node`; 0 outside cluster mode).
    pub(crate) node: u16,
    /// Redis's id of the connection on that node (from its HELLO reply).
    pub(crate) id: u64,
}

/// Proxy client id → that client's dedicated connection, for clients that have one.
#[derive(Default)]
pub(crate) struct ClientIds {
    /// Proxy id → upstream connection.
    upstream: DashMap<u64, Upstream>,
    /// Upstream connection → proxy id, for replies that name a connection (`CLIENT
    /// GETREDIR`, `CLIENT TRACKINGINFO`'s redirect), listeners included.
    client: DashMap<Upstream, u64>,
    /// (Proxy id, node) → Redis's id of the client's listener there (module comment).
    listeners: DashMap<(u64, u16), u64>,
    /// Proxy id → the connection a client's XREAD … BLOCK across slots waits on (one of
    /// its one-off connections, `cluster::blocking_read`), for another client's `CLIENT
    /// UNBLOCK` alone: a REDIRECT there would break when the read ends.
    blocked: DashMap<u64, Upstream>,
    /// The latest connections that went, with their clients' ids, newest last ([`GONE`]).
    gone: Mutex<VecDeque<(Upstream, u64)>>,
}

impl ClientIds {
    /// `client`'s dedicated connection, if it has one.
    pub(crate) fn upstream(&self, client: u64) -> Option<Upstream> {
        self.upstream.get(&client).map(|u| *u)
    }

    /// The proxy's id of the client whose dedicated connection is (or, among the latest
    /// [`GONE`], was) `upstream`.
    pub(crate) fn client(&self, upstream: Upstream) -> Option<u64> {
        if let Some(id) = self.client.get(&upstream) {
            return Some(*id);
        }
        let gone = self.gone.lock().unwrap_or_else(PoisonError::into_inner);
        gone.iter()
            .rev()
            .find(|(u, _)| *u == upstream)
            .map(|(_, id)| *id)
    }

    /// The connection a `CLIENT UNBLOCK` of `client` must reach: the one its raced blocking
    /// read waits on, else its dedicated connection.
    pub(crate) fn unblockable(&self, client: u64) -> Option<Upstream> {
        match self.blocked.get(&client) {
            Some(u) => Some(*u),
            None => self.upstream(client),
        }
    }

    /// Redis's id, on `node`, of the connection of `client` that hears what its own
    /// connection would there: its dedicated connection if that is on `node`, else its
    /// listener there.
    pub(crate) fn on_node(&self, client: u64, node: u16) -> Option<u64> {
        match self.upstream(client) {
            Some(u) if u.node == node => Some(u.id),
            _ => self.listeners.get(&(client, node)).map(|id| *id),
        }
    }

    /// Records that `client`'s dedicated connection is `upstream` until the returned value
    /// is dropped (with the connection).
    pub(crate) fn register(self: &Arc<Self>, client: u64, upstream: Upstream) -> Registration {
        self.upstream.insert(client, upstream);
        self.entry(client, upstream, Kind::Dedicated)
    }

    /// Records `upstream` as the connection `client`'s raced blocking read waits on, for
    /// `CLIENT UNBLOCK` (`unblockable`), until the returned value is dropped.
    pub(crate) fn register_blocked(
        self: &Arc<Self>,
        client: u64,
        upstream: Upstream,
    ) -> Registration {
        self.blocked.insert(client, upstream);
        self.entry(client, upstream, Kind::Blocked)
    }

    /// Records `upstream` as `client`'s listener on its node (module comment) until the
    /// returned value is dropped (with the connection).
    pub(crate) fn register_listener(
        self: &Arc<Self>,
        client: u64,
        upstream: Upstream,
    ) -> Registration {
        self.listeners.insert((client, upstream.node), upstream.id);
        self.entry(client, upstream, Kind::Listener)
    }

    /// The reverse entry (not for a blocked read's connection, which names no client in a
    /// reply), and what removes both.
    fn entry(self: &Arc<Self>, client: u64, upstream: Upstream, kind: Kind) -> Registration {
        if kind != Kind::Blocked {
            self.client.insert(upstream, client);
        }
        Registration(Box::new(Entry {
            ids: self.clone(),
            client,
            upstream,
            kind,
        }))
    }
}

/// A client's entry in [`ClientIds`], removed when its connection goes. Boxed: it sits in the
/// session's dedicated connection, part of every client's task (`size_tests`), and with the
/// node its fields grew past the 24 bytes they took there; the box costs one allocation per
/// dedicated connection opened.
pub(crate) struct Registration(Box<Entry>);

/// What a [`Registration`] removes.
struct Entry {
    /// The map it is in.
    ids: Arc<ClientIds>,
    /// The proxy's id of the client.
    client: u64,
    /// The connection: the entry is removed only while it still names this one (a newer
    /// connection of the same client may have replaced it).
    upstream: Upstream,
    /// Which map holds it.
    kind: Kind,
}

/// Which of [`ClientIds`]'s maps an [`Entry`] is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `upstream` (and `client`): the client's dedicated connection.
    Dedicated,
    /// `listeners` (and `client`).
    Listener,
    /// `blocked` alone.
    Blocked,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Entry {
            ids,
            client,
            upstream,
            kind,
        } = &*self.0;
        match kind {
            Kind::Listener => {
                ids.listeners
                    .remove_if(&(*client, upstream.node), |_, id| *id == upstream.id);
            }
            Kind::Dedicated => {
                ids.upstream.remove_if(client, |_, u| u == upstream);
            }
            Kind::Blocked => {
                ids.blocked.remove_if(client, |_, u| u == upstream);
                return;
            }
        }
        if ids.client.remove_if(upstream, |_, c| c == client).is_some() {
            let mut gone = ids.gone.lock().unwrap_or_else(PoisonError::into_inner);
            if gone.len() == GONE {
                gone.pop_front();
            }
            gone.push_back((*upstream, *client));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_as_long_as_its_connection() {
        let ids = Arc::new(ClientIds::default());
        let on = |node, id| Upstream { node, id };
        let first = ids.register(7, on(0, 100));
        assert_eq!(ids.upstream(7), Some(on(0, 100)));
        assert_eq!(ids.client(on(0, 100)), Some(7));
        let second = ids.register(7, on(0, 101));
        drop(first);
        assert_eq!(
            ids.upstream(7),
            Some(on(0, 101)),
            "a replaced connection keeps the new one"
        );
        assert_eq!(
            ids.client(on(0, 100)),
            Some(7),
            "a gone connection still names its client"
        );
        drop(second);
        assert_eq!(ids.upstream(7), None);
        assert_eq!(ids.client(on(0, 101)), Some(7));
        assert_eq!(ids.client(on(1, 101)), None, "another node's never was");
        // Only the latest are remembered.
        for id in 0..GONE as u64 {
            drop(ids.register(9, on(0, 1000 + id)));
        }
        assert_eq!(ids.client(on(0, 101)), None);
        assert_eq!(ids.client(on(0, 1000 + GONE as u64 - 1)), Some(9));
    }

    #[test]
    fn a_raced_read_is_unblocked_where_it_waits_and_redirected_to_nowhere() {
        let ids = Arc::new(ClientIds::default());
        let on = |node, id| Upstream { node, id };
        assert_eq!(ids.unblockable(7), None);
        let own = ids.register(7, on(1, 100));
        let waits = ids.register_blocked(7, on(2, 55));
        assert_eq!(ids.unblockable(7), Some(on(2, 55)));
        assert_eq!(
            ids.upstream(7),
            Some(on(1, 100)),
            "REDIRECT goes on as before"
        );
        assert_eq!(ids.client(on(2, 55)), None);
        drop(waits);
        assert_eq!(ids.unblockable(7), Some(on(1, 100)));
        drop(own);
        assert_eq!(ids.unblockable(7), None);
    }

    #[test]
    fn one_id_on_two_nodes_names_two_connections() {
        let ids = Arc::new(ClientIds::default());
        let on = |node, id| Upstream { node, id };
        let _a = ids.register(7, on(1, 100));
        let b = ids.register(8, on(2, 100));
        assert_eq!(ids.client(on(1, 100)), Some(7));
        assert_eq!(ids.client(on(2, 100)), Some(8));
        drop(b);
        assert_eq!(ids.client(on(1, 100)), Some(7), "the other node's is kept");
        assert_eq!(ids.client(on(2, 100)), Some(8), "the gone one still named");
        assert_eq!(ids.upstream(7), Some(on(1, 100)));
    }

    #[test]
    fn listeners_name_a_client_on_the_other_nodes() {
        let ids = Arc::new(ClientIds::default());
        let on = |node, id| Upstream { node, id };
        let home = ids.register(7, on(1, 100));
        let other = ids.register_listener(7, on(2, 40));
        assert_eq!(ids.on_node(7, 1), Some(100));
        assert_eq!(ids.on_node(7, 2), Some(40));
        assert_eq!(ids.on_node(7, 3), None);
        assert_eq!(ids.client(on(2, 40)), Some(7), "GETREDIR maps it back");
        assert_eq!(ids.upstream(7), Some(on(1, 100)), "not the dedicated one");
        drop(other);
        assert_eq!(ids.on_node(7, 2), None);
        assert_eq!(ids.client(on(2, 40)), Some(7), "gone, still named");
        assert_eq!(ids.on_node(7, 1), Some(100));
        drop(home);
        assert_eq!(ids.on_node(7, 1), None);
    }
}
