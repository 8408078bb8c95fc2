//! What the proxy tells operators about itself and its traffic, held by every session.
//!
//! - [`metrics`]: Prometheus metrics, pre-registered handles, and the `process_*` ones read
//!   from `/proc/self` by [`procfs`].
//! - [`keyspace`]: sampled, bounded statistics per tenant and key pattern and the hot keys.
//! - [`slowlog`]: the proxy's own slow log (`SLOWLOG`), latency measured at the proxy.
//! - [`audit`]: the audit trail: an entry per audited command, written by a thread of its own.
//! - [`heap`]: freed session memory given back to the system (glibc's `malloc_trim`).

pub mod audit;
pub(crate) mod heap;
pub(crate) mod keyspace;
pub mod metrics;
pub(crate) mod procfs;
pub(crate) mod slowlog;
