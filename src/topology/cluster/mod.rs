//! Redis Cluster upstreams: the pieces the router is built from.
//!
//! - [`slot`](mod@slot): key → hash slot, exactly as Redis computes it (hash tags included).
//! - [`topology`]: the [`SlotMap`] (slot → shard of a primary and its replicas), built from
//!   `CLUSTER SHARDS` or `CLUSTER SLOTS`, and [`Redirect`] (`-MOVED`/`-ASK` errors).
//! - `seeds`: [`discover`] asks the seeds in turn for the topology.
//! - [`router`]: a pool per node, the current map, and the refresher that keeps it fresh.
//! - `error`: [`ClusterError`], why the topology could not be learned or used.
//!
//! `docs/cluster.md` describes how the session routes with these.

mod error;
pub(crate) mod router;
mod seeds;
pub mod slot;
pub(crate) mod topology;

pub use error::ClusterError;
pub(crate) use router::Router;
pub use seeds::discover;
pub use slot::{SLOTS, hash_tag, slot};
pub use topology::{Node, Redirect, Shard, SlotMap};
