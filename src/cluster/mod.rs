//! Redis Cluster upstreams: the pieces the router is built from.
//!
//! - [`slot`]: key → hash slot, exactly as Redis computes it (hash tags included).
//! - [`topology`]: the [`SlotMap`] (slot → shard of a primary and its replicas), built from
//!   `CLUSTER SHARDS` or `CLUSTER SLOTS`, and [`Redirect`] (`-MOVED`/`-ASK` errors).
//! - [`discover`]: asks the seeds in turn for the topology.
//!
//! `docs/cluster.md` describes how the session routes with these.

pub mod slot;
pub mod topology;
mod value;

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub use slot::{SLOTS, hash_tag, slot};
pub use topology::{Node, Redirect, Shard, SlotMap};
pub use value::DecodeError;

use crate::error::UpstreamError;
use crate::reply;
use crate::upstream::handshake::{self, NodeSpec, UpstreamStream};

/// Largest topology reply accepted. `CLUSTER SHARDS` costs a few hundred bytes per node, so
/// this allows clusters far larger than Redis supports while bounding what a broken node can
/// make the proxy buffer.
const MAX_REPLY: usize = 16 * 1024 * 1024;

/// Why the cluster's topology could not be learned or used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
    /// Connecting or logging in to a node failed.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The connection failed or timed out after the handshake.
    #[error("{addr}: {reason}")]
    Io { addr: Arc<str>, reason: String },
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

/// Learns the cluster's slot map from the first seed that gives a complete one.
///
/// Seeds are tried in order, each with `node`'s login, TLS setup and timeout (its `addr` is
/// ignored); each attempt, connect plus query, is bounded by twice the connect timeout, so a
/// dead or hung seed costs at most that before the next one is tried. A seed whose map leaves
/// slots unowned (a shard down with no replica to take over, or a node that has not caught
/// up) does not stop the search, but the best such map is returned when no seed has a
/// complete one: the slots it covers can still be served.
pub async fn discover(seeds: &[String], node: &NodeSpec) -> Result<SlotMap, ClusterError> {
    if seeds.is_empty() {
        return Err(ClusterError::NoSeeds);
    }
    let mut best: Option<SlotMap> = None;
    let mut failures = Vec::new();
    for seed in seeds {
        let spec = NodeSpec {
            addr: seed.as_str().into(),
            ..node.clone()
        };
        match query_topology(&spec).await {
            Ok(map) if map.is_complete() => return Ok(map),
            Ok(map) => {
                failures.push(format!("{seed}: covers {} of {SLOTS} slots", map.covered()));
                if map.covered() > best.as_ref().map_or(0, SlotMap::covered) {
                    best = Some(map);
                }
            }
            Err(e) => failures.push(format!("{seed}: {e}")),
        }
    }
    best.ok_or_else(|| ClusterError::NoTopology(failures.join("; ")))
}

/// Connects to one node and asks it for the topology.
async fn query_topology(spec: &NodeSpec) -> Result<SlotMap, ClusterError> {
    // RESP2 on purpose: it is what every server since Redis 3 speaks, and the parsers take
    // both shapes anyway.
    let attempt = async {
        let (stream, _) = handshake::connect(spec, Some(2)).await?;
        match stream {
            UpstreamStream::Tcp(mut tcp) => ask(&mut tcp, spec).await,
            UpstreamStream::Tls(mut tls) => ask(&mut *tls, spec).await,
        }
    };
    let bound = spec.connect_timeout.saturating_mul(2);
    tokio::time::timeout(bound, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(ClusterError::Io {
                addr: spec.addr.clone(),
                reason: format!("no topology within {} ms", bound.as_millis()),
            })
        })
}

/// `CLUSTER SHARDS`, or `CLUSTER SLOTS` when the node is older than Redis 7.
async fn ask<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    spec: &NodeSpec,
) -> Result<SlotMap, ClusterError> {
    let tls = spec.tls.is_some();
    let reply = request(stream, spec, &[b"CLUSTER", b"SHARDS"]).await?;
    match SlotMap::from_cluster_shards(&reply, &spec.addr, tls) {
        Err(ClusterError::Refused(message)) if unknown_command(&message) => {
            let reply = request(stream, spec, &[b"CLUSTER", b"SLOTS"]).await?;
            SlotMap::from_cluster_slots(&reply, &spec.addr)
        }
        other => other,
    }
}

/// Whether an error means "this server does not have that command": Redis 7 says
/// `unknown subcommand 'SHARDS'`, Redis 6 `Unknown subcommand or wrong number of arguments`,
/// and a proxy or a managed service may say `unknown command`.
fn unknown_command(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("unknown subcommand") || m.contains("unknown command")
}

/// Sends one command and reads its one reply.
async fn request<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    spec: &NodeSpec,
    args: &[&[u8]],
) -> Result<BytesMut, ClusterError> {
    let io = |reason: String| ClusterError::Io {
        addr: spec.addr.clone(),
        reason,
    };
    stream
        .write_all(&crate::codec::encode(args))
        .await
        .map_err(|e| io(format!("write failed: {e}")))?;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    loop {
        if let Some(len) = reply::scan(&buf).map_err(DecodeError::from)? {
            buf.truncate(len);
            return Ok(buf);
        }
        if buf.len() > MAX_REPLY {
            return Err(io(format!("topology reply over {MAX_REPLY} bytes")));
        }
        let n = stream
            .read_buf(&mut buf)
            .await
            .map_err(|e| io(format!("read failed: {e}")))?;
        if n == 0 {
            return Err(io("closed before the topology reply".to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_command_errors_of_each_version() {
        assert!(unknown_command(
            "ERR unknown subcommand 'SHARDS'. Try CLUSTER HELP."
        ));
        assert!(unknown_command(
            "ERR Unknown subcommand or wrong number of arguments for 'SHARDS'. Try CLUSTER HELP."
        ));
        assert!(unknown_command(
            "ERR unknown command 'CLUSTER', with args beginning with: 'SHARDS' "
        ));
        assert!(!unknown_command(
            "ERR This instance has cluster support disabled"
        ));
        assert!(!unknown_command(
            "NOPERM this user has no permissions to run the 'cluster|shards' command"
        ));
    }
}
