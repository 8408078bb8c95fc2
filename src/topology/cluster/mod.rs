//! Redis Cluster upstreams: the pieces the router is built from.
//!
//! - [`slot`](mod@slot): key → hash slot, exactly as Redis computes it (hash tags included).
//! - [`topology`]: the [`SlotMap`] (slot → shard of a primary and its replicas), built from
//!   `CLUSTER SHARDS` or `CLUSTER SLOTS`, and [`Redirect`] (`-MOVED`/`-ASK` errors).
//! - `seeds`: [`discover`] asks the seeds in turn for the topology.
//! - [`router`]: a pool per node, the current map, and the refresher that keeps it fresh.
//! - `error`: [`ClusterError`], why the topology could not be learned or used.
//! - `scripts`: the nodes running a script a session sent, where keyless commands go
//!   meanwhile.
//!
//! `docs/cluster.md` describes how the session routes with these.

mod error;
pub(crate) mod router;
mod scripts;
mod seeds;
pub mod slot;
pub(crate) mod topology;

pub use error::ClusterError;
pub(crate) use router::Router;
pub(crate) use scripts::ScriptRun;
pub use seeds::discover;
pub use slot::{SLOTS, hash_tag, slot};
pub use topology::{Node, Redirect, Shard, SlotMap};
