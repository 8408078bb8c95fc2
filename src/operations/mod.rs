//! The entry layer: what builds and wires the parts, serves them, and the operator's tools.
//!
//! - [`setup`]: everything the file names checked, the policy compiled; [`server`]: accept
//!   loop, client limit, graceful shutdown ([`server::run`] is the test seam); [`startup`]:
//!   the one summary line the binary logs once it listens; [`admin`]: `/metrics`,
//!   `/healthz`, `/readyz` over HTTP.
//! - [`ops`]: what operators' tools share (metrics, slow log, reload, audit trail), held by
//!   every session; [`eviction`]: the upstream's maxmemory and eviction policy checked
//!   against the TTL rule.
//! - [`mirror`]: migrations: every acknowledged write sent to a second server too, reads
//!   compared, the cutover.
//! - [`tools`]: `--print-acl`, `--survey`, `replay`, `backfill`; [`fuzzing`]: the seams the
//!   fuzz targets drive.
//! - [`workers`]: `workers: N` as N current-thread runtimes, clients placed on the least
//!   loaded, each worker with its own share of the shared upstream connections.

pub(crate) mod admin;
pub(crate) mod eviction;
#[doc(hidden)]
pub mod fuzzing;
pub mod mirror;
pub mod ops;
pub(crate) mod server;
pub mod setup;
pub mod startup;
pub mod tools;
pub mod workers;
