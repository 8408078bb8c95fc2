//! Redis Cluster upstreams: the pieces the router is built from.
//!
//! - [`slot`]: key → hash slot, exactly as Redis computes it (hash tags included).

pub mod slot;

pub use slot::{SLOTS, hash_tag, slot};
