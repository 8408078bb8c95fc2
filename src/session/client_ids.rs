//! Which upstream connection each client id names. A client learns its id from the proxy
//! (`CLIENT ID`, HELLO), and hands it to another client's `CLIENT UNBLOCK` or `CLIENT TRACKING
//! … REDIRECT`, which Redis must apply to that client's own connection: its dedicated one, the
//! only one Redis can unblock or send invalidations on for it. A client without one is not
//! blocked, and a REDIRECT to it has its session open one first (`summon`). (`CLIENT KILL` is
//! the proxy's own business: it closes the client, `client_kill`.)

use std::sync::Arc;

use dashmap::DashMap;

/// Proxy client id → Redis's id of that client's dedicated connection, for clients that have
/// one (standalone and Sentinel upstreams; cluster connections are per node, not mapped).
#[derive(Default)]
pub struct ClientIds {
    /// Proxy id → upstream id.
    upstream: DashMap<u64, u64>,
    /// Upstream id → proxy id, for replies that name a connection (`CLIENT GETREDIR`,
    /// `CLIENT TRACKINGINFO`'s redirect).
    client: DashMap<u64, u64>,
}

impl ClientIds {
    /// Redis's id of `client`'s dedicated connection, if it has one.
    pub fn upstream(&self, client: u64) -> Option<u64> {
        self.upstream.get(&client).map(|id| *id)
    }

    /// The proxy's id of the client whose dedicated connection Redis calls `upstream`.
    pub fn client(&self, upstream: u64) -> Option<u64> {
        self.client.get(&upstream).map(|id| *id)
    }

    /// Records that `client`'s dedicated connection is `upstream` until the returned value
    /// is dropped (with the connection).
    pub fn register(self: &Arc<Self>, client: u64, upstream: u64) -> Registration {
        self.upstream.insert(client, upstream);
        self.client.insert(upstream, client);
        Registration {
            ids: self.clone(),
            client,
            upstream,
        }
    }
}

/// A client's entry in [`ClientIds`], removed when its connection goes.
pub struct Registration {
    /// The map it is in.
    ids: Arc<ClientIds>,
    /// The proxy's id of the client.
    client: u64,
    /// Redis's id of the connection: the entry is removed only while it still names this one
    /// (a newer connection of the same client may have replaced it).
    upstream: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.ids
            .upstream
            .remove_if(&self.client, |_, upstream| *upstream == self.upstream);
        self.ids.client.remove(&self.upstream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_as_long_as_its_connection() {
        let ids = Arc::new(ClientIds::default());
        let first = ids.register(7, 100);
        assert_eq!(ids.upstream(7), Some(100));
        assert_eq!(ids.client(100), Some(7));
        let second = ids.register(7, 101);
        drop(first);
        assert_eq!(
            ids.upstream(7),
            Some(101),
            "a replaced connection keeps the new one"
        );
        assert_eq!(ids.client(100), None);
        drop(second);
        assert_eq!(ids.upstream(7), None);
        assert_eq!(ids.client(101), None);
    }
}
