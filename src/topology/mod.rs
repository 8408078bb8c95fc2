//! Where keys live: the upstream modes' maps of the servers behind the proxy.
//!
//! - [`cluster`]: Redis Cluster: key slots, the slot map, MOVED/ASK, discovery from seeds,
//!   the per-node pools and the refresher (docs/cluster.md).
//! - [`sentinel`]: Sentinel-managed upstreams: the primary found, confirmed and followed,
//!   and the usable replicas (docs/sentinel.md).
//! - [`routes`]: several upstreams behind one proxy: the route of a key by its prefix (and
//!   tenant namespace), read by the policy and by the router (docs/routes.md).

pub mod cluster;
pub(crate) mod routes;
pub mod sentinel;
