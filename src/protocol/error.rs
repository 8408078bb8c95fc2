//! Every error the proxy can meet, tagged with the side that failed, and the one function
//! that turns an error into the reply a client sees (the texts of replies the proxy makes
//! without an error value are named constructors in `answers`).

use std::sync::Arc;

use bytes::Bytes;

use crate::protocol::codec::ProtocolError;

/// Something went wrong between the proxy and Redis.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    /// No connection to the upstream; nothing was sent, so the command was not applied.
    #[error("upstream {addr} unavailable: {reason}")]
    Unavailable { addr: Arc<str>, reason: Arc<str> },
    /// The connection broke after the command was sent and before its reply came back: the
    /// command may or may not have run, so it is never retried.
    #[error(
        "upstream {addr} connection lost before the reply ({reason}); the command may have been applied"
    )]
    Lost { addr: Arc<str>, reason: Arc<str> },
    /// The upstream refused the proxy's handshake (AUTH/HELLO).
    #[error("upstream {addr} refused the handshake: {reply}")]
    Handshake { addr: Arc<str>, reply: Arc<str> },
    /// The upstream refused the proxy's own login (`NOAUTH`, `WRONGPASS`, `NOPERM` to its
    /// HELLO): its credentials no longer work there (`upstream::credentials`). Nothing was
    /// sent, so the command was not applied.
    #[error(
        "upstream {addr} refused the proxy's upstream credentials ({reply}); the command was not run: upstream.username/upstream.password must match the server's (requirepass or ACL changed?)"
    )]
    CredentialsRefused { addr: Arc<str>, reply: Arc<str> },
    /// WAIT after a Sentinel failover: the client's earlier writes may have gone to the
    /// previous primary (and be lost), so no count from the new one would be true. The
    /// session is closed after it, so a new connection's WAIT covers only its own writes.
    #[error(
        "upstream primary changed since this connection's earlier writes (failover); they may not have been replicated, reconnect"
    )]
    PrimaryChanged,
    /// The proxy is shutting down and will not send more commands.
    #[error("proxy is shutting down")]
    ShuttingDown,
}

/// Something went wrong on the client's side of the proxy.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The client broke the protocol; Redis answers and closes the connection.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The client buffered more unanswered request bytes than allowed.
    #[error("client query buffer limit of {limit} bytes exceeded")]
    QueryBufferFull { limit: usize },
    /// The connection limit was reached when this client connected.
    #[error("max number of clients reached")]
    TooManyClients,
}

/// An error the proxy itself answers with, in the command's slot of the reply stream.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProxyError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The RESP error reply for an error. The only place proxy-made errors become bytes, so the
/// wording stays consistent and Redis-like (`-ERR` plus a message on one line).
///
/// A command that could not be sent because the proxy has no connection to Redis (Redis
/// down, restarting, unreachable, or being reconnected to) gets `-LOADING` instead: the
/// error code client libraries take for "the server is there but cannot serve yet, try
/// again", Redis's own while it loads its dataset. go-redis retries it as it retries a
/// network error, and redis-py raises `BusyLoadingError`, a `ConnectionError`, which its
/// retry (and application code catching `ConnectionError`) treats as an outage. Only a
/// command that was never sent gets it, so such a retry cannot apply a command twice; one
/// whose connection broke after it was sent ([`UpstreamError::Lost`], may have been applied)
/// keeps `-ERR` (docs/operations.md, When Redis stops answering).
pub(crate) fn error_reply(err: &ProxyError) -> Bytes {
    match err {
        ProxyError::Upstream(e @ UpstreamError::Unavailable { .. }) => {
            simple_error("LOADING", &format!("{e}; the command was not run"))
        }
        ProxyError::Upstream(e) => simple_error("ERR", &e.to_string()),
        ProxyError::Client(e) => simple_error("ERR", &e.to_string()),
    }
}

/// The error for a command whose connection state could not be set up (no dedicated
/// connection), with what that means for the client's later commands.
pub(crate) fn state_not_established(err: &dyn std::fmt::Display, consequence: &str) -> Bytes {
    simple_error("ERR", &format!("{err}; {consequence}"))
}

/// `-<CODE> <message>\r\n` with any CR/LF in the message flattened, so a message can never
/// break the framing of the reply stream.
pub(crate) fn simple_error(code: &str, message: &str) -> Bytes {
    simple_error_bytes(code, message.as_bytes())
}

/// [`simple_error`] of a message that may carry the client's own bytes (not UTF-8).
pub(crate) fn simple_error_bytes(code: &str, message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(code.len() + message.len() + 4);
    out.push(b'-');
    out.extend_from_slice(code.as_bytes());
    out.push(b' ');
    out.extend(
        message
            .iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_single_line_errors() {
        let e = ProxyError::Upstream(UpstreamError::Unavailable {
            addr: "127.0.0.1:1".into(),
            reason: "Connection refused\r\nx".into(),
        });
        assert_eq!(
            &error_reply(&e)[..],
            &b"-LOADING upstream 127.0.0.1:1 unavailable: Connection refused  x; the command was not run\r\n"[..]
        );
        let lost = ProxyError::Upstream(UpstreamError::Lost {
            addr: "127.0.0.1:1".into(),
            reason: "Connection reset by peer".into(),
        });
        assert_eq!(
            &error_reply(&lost)[..],
            &b"-ERR upstream 127.0.0.1:1 connection lost before the reply (Connection reset by peer); the command may have been applied\r\n"[..]
        );
        let p = ProxyError::Client(ClientError::Protocol(ProtocolError::InvalidBulkLength));
        assert_eq!(
            &error_reply(&p)[..],
            b"-ERR Protocol error: invalid bulk length\r\n"
        );
    }
}
