//! Connections to the upstream Redis.
//!
//! - [`handshake`]: connect, authenticate and pick the RESP version.
//! - [`conn`]: the pipelined connection task: batched writes, FIFO reply matching on raw bytes,
//!   pub/sub-aware framing for dedicated connections.
//! - [`credentials`]: whether the upstream still accepts the proxy's own login, told once
//!   to the log and named in every error it causes.
//! - [`coalesce`]: identical concurrent reads sharing one reply (`upstream.coalesce_reads`).
//! - [`oom`]: the proxy's note appended to Redis's OOM errors.
//! - [`tls`]: the optional TLS layer.
//! - [`pool`]: the shared connections with reconnect and backoff.
//! - [`dedicated`]: each node's dedicated connections, capped and kept warm so a command that
//!   needs one reaches Redis no later than one sent after it over a shared connection.
//! - [`gate`]: what every batch passes before its queue; closed only during a cutover
//!   (`mirror::cutover`), so no batch crosses the switch from one server to another.
//! - [`address`]: where the pool's node is, fixed or followed through Sentinel failovers.
//! - [`outage`]: what the log says when a node goes down and comes back (once, not per
//!   connection per retry).
//! - [`replicas`]: Sentinel mode's replica pools and the replica one client reads from.
//! - [`mailbox`]: the channel on which upstream connections deliver a session's replies.
//! - [`stray`]: pushes on a shared connection, which answer no request: dropped, counted,
//!   logged.
//! - [`own_lines`]: the proxy's own commands (handshakes, control connections), kept out of
//!   its clients' MONITOR.

pub mod address;
pub(crate) mod coalesce;
pub(crate) mod conn;
pub(crate) mod credentials;
pub(crate) mod dedicated;
pub(crate) mod gate;
pub mod handshake;
pub(crate) mod mailbox;
pub(crate) mod oom;
pub(crate) mod outage;
pub(crate) mod own_lines;
pub mod pool;
pub(crate) mod replicas;
pub(crate) mod script_login;
pub(crate) mod server_probe;
pub(crate) mod stray;
pub(crate) mod tls;

use std::time::Duration;

use bytes::Bytes;

use crate::protocol::error::UpstreamError;
use crate::protocol::reply::SubKind;

/// Commands sent to an upstream connection together, and where their replies go.
#[derive(Debug)]
pub(crate) struct Batch {
    /// One or more complete commands, forwarded byte for byte.
    pub(crate) bytes: Bytes,
    /// How many reply frames the bytes produce, and how to recognise them.
    pub(crate) expect: Expect,
    /// How long Redis may legitimately take to answer, which sets when the connection's
    /// command timeout gives up on it.
    pub(crate) wait: ReplyWait,
    /// The session that waits for the replies; replies and pushes share it so that they
    /// reach the client in the order the upstream sent them.
    pub(crate) reply_to: ReplySender,
    /// Echoed in `Reply::Batch`: a cluster session with batches in flight on several nodes
    /// learns from it which batch a reply answers (replies from different nodes arrive in any
    /// order). Batches whose replies come on a private channel leave it 0.
    pub(crate) seq: u16,
}

/// The replies a batch produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// `n` commands, one reply frame each.
    Frames(u32),
    /// One (UN)SUBSCRIBE command with `n` channels: one confirmation per channel.
    Confirmations(u32),
    /// One UNSUBSCRIBE-family command without channels: one confirmation per channel of that
    /// kind subscribed at the moment it runs, or one if there are none.
    UnsubscribeAll(SubKind),
    /// MONITOR: one `+OK`, after which every frame is out of band.
    Monitor,
}

impl Expect {
    /// Commands in the batch, which is what the client counts replies by.
    pub(crate) fn commands(self) -> u32 {
        match self {
            Expect::Frames(n) => n,
            _ => 1,
        }
    }
}

/// How long a batch may legitimately go unanswered, so that `upstream.command_timeout_ms`
/// cuts a silent upstream without cutting a command that is waiting as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ReplyWait {
    /// Redis answers as soon as it runs the commands: the command timeout applies as it is.
    #[default]
    Prompt,
    /// A blocking command that Redis answers by itself after at most this long (its own
    /// timeout argument); the command timeout applies on top of it.
    Blocks(Duration),
    /// A blocking command that may wait forever (timeout 0, or an argument the proxy cannot
    /// read): no deadline, as a proxy error could come after Redis popped an element for it.
    Unbounded,
}

impl ReplyWait {
    /// How long after the batch reached the head of its connection's queue the connection
    /// is declared dead, given the command timeout; `None`: never.
    pub(crate) fn allowance(self, timeout: Duration) -> Option<Duration> {
        match self {
            ReplyWait::Prompt => Some(timeout),
            ReplyWait::Blocks(limit) => limit.checked_add(timeout),
            ReplyWait::Unbounded => None,
        }
    }

    /// The wait of a blocking command whose own timeout is `limit` (`None`: forever).
    pub(crate) fn blocking(limit: Option<Duration>) -> ReplyWait {
        limit.map_or(ReplyWait::Unbounded, ReplyWait::Blocks)
    }
}

/// What an upstream connection sends back to a session.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The replies of the batch sent with `seq` (the session's oldest unanswered batch on
    /// that connection), as raw bytes. When the upstream failed first, `missing` commands got
    /// no reply and `error` says why. `seq` is 16 bits so that the reply stays 48 bytes (the
    /// session keeps fewer batches than that in flight, see `session::SEQ_WINDOW`).
    Batch {
        data: Bytes,
        missing: u32,
        error: Option<Box<UpstreamError>>,
        seq: u16,
    },
    /// An out-of-band frame (pub/sub message, invalidation, MONITOR line), the flow-control
    /// permits the session returns once it has written the frame, and the id of the
    /// connection it came on (`PushTarget::conn_id`): in front of a cluster each primary
    /// sends its own invalidation of everything at a flush, and the session counts them per
    /// node (`cluster::flush_news::FlushNews`).
    Push(Bytes, u32, u64),
    /// The session's dedicated connection with this id is gone, and with it any state held
    /// on it. The id lets a session ignore the end of a connection it already replaced.
    PinnedClosed(u64),
    /// Sent just before `PinnedClosed` by a dedicated connection that failed (not one the
    /// session closed) while holding classic subscriptions: what they were, so a cluster
    /// session can subscribe again on another node (any node hears every PUBLISH).
    Subscriptions(u64, Box<Subscriptions>),
}

/// The classic pub/sub subscriptions of a dedicated connection, as Redis confirmed them.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions {
    /// SUBSCRIBE channels.
    pub(crate) channels: Vec<Bytes>,
    /// PSUBSCRIBE patterns.
    pub(crate) patterns: Vec<Bytes>,
}

/// Where an upstream connection delivers a session's replies.
pub(crate) type ReplySender = mailbox::Sender<Reply>;
/// Where a session receives them.
pub(crate) type ReplyReceiver = mailbox::Receiver<Reply>;

/// Queues one command on `tx` whose reply no one reads (it is dropped with the reply
/// channel): a HELLO a connection must follow, CLIENT CACHING's PING. `false` when the
/// connection's queue is full or closed.
pub(crate) fn unanswered(tx: &tokio::sync::mpsc::Sender<Batch>, command: bytes::Bytes) -> bool {
    let (reply_to, _) = reply_channel();
    tx.try_send(Batch {
        bytes: command,
        expect: Expect::Frames(1),
        wait: ReplyWait::Prompt,
        reply_to,
        seq: 0,
    })
    .is_ok()
}

/// `HELLO <proto>`, as sent to a connection that must speak the client's protocol.
pub(crate) fn hello_command(proto: u8) -> bytes::Bytes {
    crate::protocol::codec::encode(&[&b"HELLO"[..], proto.to_string().as_bytes()])
}

/// A session's reply channel, with nothing allocated for replies yet (`mailbox`).
pub(crate) fn reply_channel() -> (ReplySender, ReplyReceiver) {
    mailbox::channel()
}

/// Why [`read_reply`] returned no reply.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadReplyError {
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("connection closed before the reply")]
    Closed,
    #[error("reply larger than {0} bytes")]
    TooLarge(usize),
    /// Not RESP: the peer is not Redis, or the stream is out of step.
    #[error("{0}")]
    Malformed(#[from] crate::protocol::reply::ReplyError),
}

/// Reads until `buf` holds one complete reply and splits it off (anything after it stays in
/// `buf`). For the proxy's own one-off exchanges (handshake, topology, sentinels), where a
/// reply must be bounded by `max` bytes so a confused peer cannot grow memory.
pub(crate) async fn read_reply<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut bytes::BytesMut,
    max: usize,
) -> Result<bytes::BytesMut, ReadReplyError> {
    use tokio::io::AsyncReadExt;
    loop {
        if let Some(len) = crate::protocol::reply::scan(buf)? {
            return Ok(buf.split_to(len));
        }
        if buf.len() > max {
            return Err(ReadReplyError::TooLarge(max));
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(ReadReplyError::Closed);
        }
    }
}
