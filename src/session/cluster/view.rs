//! What cluster code sees of a session: the parts it reads and changes, borrowed, with the
//! cluster's own state in place of the mode-neutral `Routing`. Cluster steps are methods of
//! these views, not of `Session`, so the compiler lists what the mode depends on (the parts
//! below and nothing else of the session: not its client-list row, not its audit trail), and cluster code cannot reach another mode's state or ask which mode it is in.
//!
//! Two views because `decide` is pure: it holds the session shared (the command's bytes are
//! borrowed from the read buffer while it runs), so placement gets a shared view; every
//! step that changes something gets the exclusive one, which lends itself as a shared view
//! (`view`) to ask placement's questions.

use std::sync::Arc;

use super::state::ClusterState;
use crate::session::client::ClientState;
use crate::session::conn::ConnState;
use crate::session::context::Context;
use crate::session::input::Input;
use crate::session::reply_queue::ReplyQueue;

/// A cluster session's parts, borrowed exclusively: for the steps that send, receive and
/// change state (gather, redirect, subscriptions, tracking, login).
pub(in crate::session) struct ClusterSession<'s> {
    /// What every session shares (pools, metrics, client ids), for the steps that open
    /// connections or register them.
    pub(in crate::session) ctx: &'s Arc<Context>,
    /// The client's negotiated state (protocol, id, policy), which the nodes' connections
    /// follow.
    pub(in crate::session) client: &'s mut ClientState,
    /// The dedicated connection and the state held on it, which pins a session to a node.
    pub(in crate::session) conn: &'s mut ConnState,
    /// The reply order, where gathered and redirected replies take their place.
    pub(in crate::session) queue: &'s mut ReplyQueue,
    /// The unread requests, which a step that must wait for its replies stops reading.
    pub(in crate::session) input: &'s mut Input,
    /// The cluster's per-session state: the router, slots in flight, parked runs, the
    /// per-node connections.
    pub(in crate::session) cluster: &'s mut ClusterState,
}

/// A cluster session's parts, borrowed shared: for placement (`place` and the routes it
/// asks), which decides and changes nothing.
#[derive(Clone, Copy)]
pub(in crate::session) struct ClusterView<'s> {
    /// As `ClusterSession::ctx`.
    pub(in crate::session) ctx: &'s Arc<Context>,
    /// As `ClusterSession::client`.
    pub(in crate::session) client: &'s ClientState,
    /// As `ClusterSession::conn`.
    pub(in crate::session) conn: &'s ConnState,
    /// As `ClusterSession::queue`.
    pub(in crate::session) queue: &'s ReplyQueue,
    /// As `ClusterSession::cluster`.
    pub(in crate::session) cluster: &'s ClusterState,
}

impl ClusterSession<'_> {
    /// The same parts, shared, to ask placement's questions from a step that changes state.
    pub(in crate::session) fn view(&self) -> ClusterView<'_> {
        ClusterView {
            ctx: self.ctx,
            client: self.client,
            conn: self.conn,
            queue: self.queue,
            cluster: self.cluster,
        }
    }
}

impl ClusterSession<'_> {
    /// State that ties the session to its dedicated connection's node (`ConnState::pinned`).
    pub(in crate::session) fn pinned(&self) -> bool {
        self.conn.pinned(self.client.db)
    }

    /// State held on the dedicated connection (`ConnState::stateful`).
    pub(in crate::session) fn stateful(&self) -> bool {
        self.conn.stateful(self.client.db)
    }
}

impl ClusterView<'_> {
    /// As `ClusterSession::pinned`.
    pub(in crate::session) fn pinned(&self) -> bool {
        self.conn.pinned(self.client.db)
    }

    /// As `ClusterSession::stateful`.
    pub(in crate::session) fn stateful(&self) -> bool {
        self.conn.stateful(self.client.db)
    }
}
