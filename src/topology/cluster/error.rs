//! Why the cluster's topology could not be learned or used.

use std::sync::Arc;

use crate::protocol::error::UpstreamError;
use crate::protocol::resp_value::DecodeError;

/// Why the cluster's topology could not be learned or used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
    /// Connecting or logging in to a node failed.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The connection failed or timed out after the handshake.
    #[error("{addr}: {reason}")]
    Io {
        /// The node, so a discovery error says which seed did what.
        addr: Arc<str>,
        /// What failed, for the log and the error message.
        reason: String,
    },
    /// The reply is not well-formed RESP.
    #[error("invalid topology reply: {0}")]
    Decode(#[from] DecodeError),
    /// The reply is RESP but not a topology this proxy can route with.
    #[error("malformed cluster topology: {0}")]
    Malformed(String),
    /// The node answered with an error (cluster mode disabled, missing ACL permission,
    /// unknown command); the text is Redis's.
    #[error("node refused: {0}")]
    Refused(String),
    /// Discovery was asked with no seed at all.
    #[error("no cluster seed nodes given")]
    NoSeeds,
    /// No seed gave a topology with any slot assigned; says what each seed did.
    #[error("no cluster seed gave a usable topology: {0}")]
    NoTopology(String),
}
