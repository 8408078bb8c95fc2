//! A batch sent to one cluster node outside the session's reply order, and its replies
//! awaited: what `gather` (fan-outs, splits, SCAN) and `redirect` (commands sent again) send
//! through, one pair, `send_shared` and `receive`.

use super::ClusterSession;
use super::state::OwnConn;
use crate::protocol::error::{ProxyError, UpstreamError, error_reply};
use crate::topology::cluster::Router;
use crate::upstream::{Batch, Expect, Reply, ReplyWait};
use bytes::Bytes;
use std::sync::Arc;

impl ClusterSession<'_> {
    /// Sends `bytes` (`frames` replies expected) to `node` over its shared connection for
    /// this client, outside the session's reply order, and waits: the reply bytes (complete
    /// frames only when there is an error) and, if the node failed, why.
    pub(super) async fn exchange(
        &self,
        router: &Router,
        node: u16,
        proto: u8,
        bytes: Bytes,
        frames: u32,
    ) -> (Bytes, Option<Box<UpstreamError>>) {
        let rx = self.send_shared(router, node, proto, bytes, frames).await;
        receive(rx, router, node).await
    }

    /// Sends `bytes` (`frames` replies expected) to `node` over its shared connection for
    /// this client, outside the session's reply order: where the replies will come, or
    /// `None` when the connection took nothing.
    pub(super) async fn send_shared(
        &self,
        router: &Router,
        node: u16,
        proto: u8,
        bytes: Bytes,
        frames: u32,
    ) -> Option<crate::upstream::ReplyReceiver> {
        let (tx, rx) = crate::upstream::reply_channel();
        let batch = Batch {
            bytes,
            expect: Expect::Frames(frames),
            wait: ReplyWait::Prompt,
            reply_to: tx,
            seq: 0,
        };
        // Default-mode tracking: over the session's tracking connection to the node, where
        // Redis tracks what it reads (`tracking`).
        let sent = match self.cluster.own_conn(node) {
            OwnConn::Any => {
                router
                    .pool(node)
                    .shared(proto, self.client.id)
                    .send(batch)
                    .await
            }
            OwnConn::Own(conn) => conn.tx.send(batch).await,
            OwnConn::Missing => return None,
        };
        sent.is_ok().then_some(rx)
    }
}

/// The replies a batch sent outside the session's reply order got (`rx`: where they come;
/// `None` when the batch was not taken), and why the node failed if it did.
pub(super) async fn receive(
    rx: Option<crate::upstream::ReplyReceiver>,
    router: &Router,
    node: u16,
) -> (Bytes, Option<Box<UpstreamError>>) {
    let answer = match rx {
        Some(mut rx) => rx.recv().await,
        None => None,
    };
    match answer {
        Some(Reply::Batch { data, error, .. }) => (data, error),
        _ => (
            Bytes::new(),
            Some(Box::new(UpstreamError::Unavailable {
                addr: router.addr(node),
                reason: "connection closed".into(),
            })),
        ),
    }
}

/// The reply for a command whose node answered nothing for it: the node's error if it
/// failed, else a lost connection (the command may have run, so it is not sent again).
pub(super) fn lost_reply(error: Option<&UpstreamError>, addr: &Arc<str>, reason: &str) -> Bytes {
    let e = error.cloned().unwrap_or(UpstreamError::Lost {
        addr: addr.clone(),
        reason: reason.into(),
    });
    error_reply(&ProxyError::Upstream(e))
}

/// The push target of a one-off connection that blocks for one reply (WAIT over every
/// primary, a raced XREAD across slots): no one listens, as such a connection never
/// subscribes or tracks; a push there would end it ("session gone"), its one command
/// answered with the connection's error, which is where a frame with no place belongs.
pub(super) fn unheard_push() -> crate::upstream::conn::PushTarget {
    let (to, _) = crate::upstream::reply_channel();
    let budget_size = crate::session::reply_queue::PUSH_BUDGET;
    crate::upstream::conn::PushTarget {
        to,
        budget: Arc::new(tokio::sync::Semaphore::new(budget_size as usize)),
        budget_size,
        conn_id: 0,
    }
}
