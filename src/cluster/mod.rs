//! Redis Cluster upstreams: the pieces the router is built from.
//!
//! - [`slot`]: key → hash slot, exactly as Redis computes it (hash tags included).
//! - [`topology`]: the [`SlotMap`] (slot → shard of a primary and its replicas), built from
//!   `CLUSTER SHARDS` or `CLUSTER SLOTS`, and [`Redirect`] (`-MOVED`/`-ASK` errors).
//!
//! `docs/cluster.md` describes how the session routes with these.

pub mod slot;
pub mod topology;
mod value;

pub use slot::{SLOTS, hash_tag, slot};
pub use topology::{Node, Redirect, Shard, SlotMap};
pub use value::DecodeError;

/// Why the cluster's topology could not be learned or used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
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
}
