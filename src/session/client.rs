//! The client's side of a session: who it is and what it negotiated (`ClientState`).

use super::client_list;
use super::client_list::ClientList;
use crate::policy::Policy;
use bytes::Bytes;
use std::sync::Arc;

/// CLIENT REPLY state, kept by the proxy because upstream connections are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReplyMode {
    On,
    Off,
    /// Drop the reply of the next command only.
    Skip,
}

/// What the client negotiated and who it is: the connection's identity as Redis would see it.
pub(super) struct ClientState {
    /// Proxy-assigned id, answered to CLIENT ID and used to pick the shared connection.
    pub(super) id: u64,
    /// The client's address, for CLIENT INFO and per-address rate limits.
    pub(super) peer: std::net::SocketAddr,
    /// The policy this batch of commands is checked against: loaded once per read, so a
    /// reload applies from the next read on and in-flight commands keep the policy they were
    /// checked with.
    pub(super) policy: Arc<Policy>,
    /// The proxy user it authenticated as and its CLIENT SETNAME.
    pub(super) names: client_list::Names,
    /// The client's tenant under `policy`, recomputed when the policy is reloaded.
    pub(super) tenant: u16,
    /// RESP version the client negotiated with HELLO.
    pub(super) proto: u8,
    /// Database selected on the dedicated connection; non-zero keeps the session there.
    pub(super) db: i64,
    /// CLIENT REPLY state, kept by the proxy because upstream connections are shared.
    pub(super) reply_mode: ReplyMode,
}

impl ClientState {
    /// The client's CLIENT SETNAME (or HELLO SETNAME), in its `CLIENT LIST` row too.
    pub(super) fn set_name(&mut self, list: &ClientList, name: Option<Bytes>) {
        list.update(self.id, |r| r.names.set_name(name.clone()));
        self.names.set_name(name);
    }

    /// The protocol the client negotiated with HELLO, in its `CLIENT LIST` row too.
    pub(super) fn set_proto(&mut self, list: &ClientList, proto: u8) {
        list.update(self.id, |r| r.resp = proto);
        self.proto = proto;
    }
}
