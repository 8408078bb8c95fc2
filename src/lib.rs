//! # redis-policy-proxy
//!
//! A Redis-protocol proxy that clients cannot tell from Redis, except where a policy says no.
//!
//! # Layout
//!
//! Data flows one way; each module has one job. The top level groups the modules in wings
//! along that path: `protocol` (the wire: [`codec`], [`reply`], `resp_value`, `answers`,
//! `error`, `pem`), `commands` (the command table, classification, the server's facts),
//! [`config`], [`listen`], `session`, [`policy`] (with its rate limiter and script users),
//! `topology` (cluster, Sentinel, routes: where keys live), [`upstream`], `observe` (metrics,
//! keyspace statistics, slow log, audit trail) and `operations` (setup, server, admin, mirror,
//! tools: the entry layer). The modules the binary, tests and benches use are re-exported at
//! the root under their short names (`redis_policy_proxy::codec`, `::cluster`, `::setup`…).
//!
//! ```text
//! client socket
//!   -> listen     plain TCP or TLS (handshake bounded, client certificate verified)
//!   -> codec      request framing with limits checked before buffering (RESP + inline)
//!   -> commands   command name -> kind (classify), without allocating; the table's key specs
//!   -> session    per connection: ClientState, ConnState, ReplyQueue, Input; one Command
//!                 value per command, decided (Decision) then carried out
//!   -> policy     phases in a fixed order (Phase): deny, guards, rate limits, limits,
//!                 stream cap, TTL, namespace; the Redis-counted rate limit last
//!   -> routing    by upstream mode (session::routing): standalone, Sentinel (replicas),
//!                 cluster (slot, node, redirections, fan-out)
//!   -> upstream   shared pipelined connections (pool) or a dedicated one per stateful
//!                 session; reply boundaries found by `reply::scan`, raw bytes forwarded
//!   -> reply      shaped where the policy or mode must (session::replies), written back in
//!                 request order; replies the proxy makes itself come from [`protocol::answers`]
//! ```
//!
//! - [`config`]: the YAML file as plain data (the rules' format in `config::rules`), strict and
//!   validated with file/line/field messages;
//!   [`operations::setup`] checks everything the file names (TLS files, rules) and compiles the policy;
//!   [`config::recovery`] reports every parse error of a file, not only the first, each once,
//!   in words, at the line of its key (found through `config::yaml`, a lenient second reading
//!   of the file as a tree of keys and items with their lines).
//! - [`protocol::codec`]: request decoding (RESP multibulk and inline), Redis's protocol errors.
//! - [`protocol::reply`]: cheap scanner for RESP2/RESP3 reply boundaries, pub/sub frame classification.
//! - [`protocol::resp_value`]: the one bounded decoder of replies the proxy reads itself (topology,
//!   Sentinel, rate-limit scripts), `redis-protocol` behind depth and completeness checks.
//! - [`commands::classify`]: command classification and the routing facts the session needs.
//! - [`session`]: one client connection: read, batch, forward, reply in order. `session` itself
//!   is the module map and `Session`; its parts have files of their own below everything
//!   that works on them (`session::context`, `client`, `conn`, `reply_queue`, `input`, `run`,
//!   `effect`, `action`), `session::process` runs the command path and `session::modes`
//!   makes the views mode code runs on (`cluster::ClusterSession`, `ClusterView`,
//!   `replica_reads::ReplicaReads`); `session::io` is the socket loop, `session::batch` joins commands into runs,
//!   `session::forward` sends them, `session::queue` puts replies in order, `session::state`
//!   applies what a command changes on the connection; `session::route`
//!   decides each command (policy verdict, then route), `session::routing` holds what the
//!   upstream mode keeps per session, `session::replies` shapes replies (hidden replies
//!   removed, EXEC filtered, CLIENT INFO/HELLO made about the client, `session::config_get`
//!   the upstream's secret parameters removed from CONFIG GET); in cluster mode
//!   `session::cluster` places commands on nodes and follows redirections (its plans in
//!   `session::cluster::plan`, its per-session state in `session::cluster::state`),
//!   `session::scatter` sends a pipeline as one batch per node and `session::spread` keeps
//!   each hash slot's commands in order across nodes. `session::client_ids` maps the ids the
//!   proxy gives to its clients' upstream connections, `session::client_list` answers
//!   CLIENT LIST (with `session::sub_counts`, a subscriber's counts from its confirmations),
//!   `session::client_kill` carries out CLIENT KILL on the proxy's own clients,
//!   `session::summon` gets a REDIRECT target without a connection of its own one,
//!   `session::pause` routes around a forwarded CLIENT PAUSE.
//! - [`upstream`]: connections to Redis: handshake, the pipelined connection task, the pool,
//!   and `upstream::dedicated`, each node's capped, warm stock of dedicated connections.
//! - [`topology::routes`]: several upstreams behind one proxy: the route of a key by its prefix (and
//!   tenant namespace), read by the policy (rules' `routes:`) and by the router, which in
//!   routes mode is a fixed map of one node per upstream and database (docs/routes.md).
//! - [`topology::cluster`]: Redis Cluster upstreams: key slots, the slot map from `CLUSTER SHARDS`/`SLOTS`,
//!   MOVED/ASK redirections, topology discovery from seed nodes, the node a read goes to
//!   under `read_from` (replica reads, docs/cluster.md).
//! - [`topology::sentinel`]: Sentinel-managed upstreams: the primary found through the sentinels (asked
//!   through fred) and confirmed with `ROLE`, followed through `+switch-master`; published as
//!   an `upstream::address::AddrEpoch`, which `upstream::address` makes the pool's connections
//!   follow. With `read_from: replica`, `sentinel::replicas` lists the
//!   usable replicas, `upstream::replicas` keeps their pools and picks one per client, and
//!   `session::replica_reads` says which commands may go there (docs/sentinel.md).
//! - [`commands`]: the Redis 7 command table (generated): flags, ACL categories, key specs.
//! - [`policy`]: rules compiled from the policy file, checked for every command before routing.
//! - [`policy::ratelimit`]: per-client sliding-window rate limits, in the proxy (DashMap) or shared on
//!   Redis (Lua), used by the policy's `rate_limit` rules.
//! - [`observe::metrics`]: Prometheus metrics, pre-registered handles, plus the standard `process_*`
//!   ones read from `/proc/self` by [`observe::procfs`]; [`operations::admin`] serves them over HTTP with
//!   `/healthz` and `/readyz`.
//! - [`protocol::error`]: every error, tagged with the side that failed, and the one mapping to replies;
//!   [`protocol::answers`]: every reply the proxy makes itself, as named constructors.
//! - [`operations::eviction`]: at start and periodically, the upstream's maxmemory and eviction policy
//!   checked against `upstream.role` and the TTL rule (log, metric, INFO, `/readyz`, the
//!   note `upstream::oom` adds to OOM errors).
//! - [`policy::script_acl`]: at start and after each reload, how scripts are kept within the deny
//!   rules: sets up [`policy::script_user`] (the user scripts run as: the proxy user's rights minus
//!   the denied commands, logged in by `upstream::script_login` on every dedicated
//!   connection), or checks / applies `policy::acl`'s removals on the proxy's own user.
//! - [`operations::mirror`]: migrations (`mirror:`, docs/migration.md): every write the primary
//!   acknowledged sent to a second server too, a share of the reads compared, from a task of
//!   its own that no client waits for; `mirror::cutover` switches the standalone upstream to
//!   another server by reload, behind `upstream::gate`.
//! - [`operations::ops`]: what operators' tools share (metrics, slow log, reload, audit trail), held by
//!   every session.
//! - [`observe::audit`]: the audit trail: an entry per audited command (identity, command, key names
//!   or hashes, argument sizes, outcome, latency; never values), queued without waiting to a
//!   writer thread that writes JSON lines to stdout or a size-rotated file.
//! - [`observe::keyspace`]: sampled, bounded statistics per tenant and key pattern (commands, bytes,
//!   writes without a TTL, value sizes) and the hot keys of the last minute (a count-min
//!   sketch per 10 s slice), for `PROXY KEYSPACE`, `/keyspace` and the top patterns' metrics.
//! - [`listen`]: where clients come in: plain TCP or TLS (same port or a second one), the
//!   client stream the session reads, certificate reloads, client-certificate names.
//! - [`protocol::pem`]: the PEM certificates, keys and CA roots both TLS sides load.
//! - `protocol::double_text` (crate-private): doubles as each server writes them (Redis 7.0's
//!   `%.17g`, the Grisu2 digits of Redis 7.2+ and Valkey), for the scores cluster mode computes.
//! - `internal_hash` (crate-private): the cheap hasher for keys the proxy made itself (table
//!   addresses, hash slots), where SipHash would cost per command.
//! - [`observe::heap`]: freed session memory given back to the system (glibc's `malloc_trim`, after
//!   idle releases).
//! - [`operations::tools`]: the operator's commands beside serving: `--print-acl`, `--survey`, `replay`
//!   (a policy over recorded traffic), `backfill` (a server's keys copied to another);
//!   `tools::node_link` is their probed connection to a node.
//! - [`operations::server`]: accept loop, client limit, graceful shutdown; [`operations::server::run`] is the test seam;
//!   [`operations::startup`]: the one summary line the binary logs once it listens;
//!   [`operations::workers`]: `workers: N` as N current-thread runtimes, each client on the
//!   least loaded, each with its own share of the shared upstream connections.

//!
//! # Public surface
//!
//! Crate-private by default (`unreachable_pub` in Cargo.toml): the modules declared `pub` or
//! re-exported below are what the binary, the integration tests, the benches and the fuzz
//! targets use, and inside them only what those reach is `pub`; everything else is
//! `pub(crate)` (docs/architecture.md, "Public surface"). The wings themselves are private
//! folders: a public module keeps its short root name whichever wing holds it.

#![deny(
    unsafe_code,
    reason = "the proxy parses hostile input; safe Rust is its first line of defence; one \
              FFI call is allowed where it says why (`heap::trim`)"
)]

pub mod commands;
pub mod config;
mod internal_hash;
pub mod listen;
mod observe;
mod operations;
pub mod policy;
mod protocol;
mod session;
mod topology;
pub mod upstream;

// The public surface under the names the binary, tests, benches and fuzz targets know.
pub use observe::{audit, metrics};
#[doc(hidden)]
pub use operations::fuzzing;
pub use operations::{mirror, ops, setup, startup, tools, workers};
pub use policy::ratelimit;
pub use protocol::{codec, reply};
pub use topology::{cluster, sentinel};

pub use config::Config;
pub use operations::server::{run, run_with_admin, serve};
pub use session::IDLE_TICK;

/// The crate's version (Cargo.toml).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit the binary was built from (`build.rs`: `git rev-parse`, `RPP_GIT_COMMIT`, or
/// `unknown`), so `--version`, the startup line and `rpp_build_info` say which code runs.
pub const COMMIT: &str = env!("RPP_COMMIT");
/// `VERSION (COMMIT)`, as `--version` prints it.
pub const LONG_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("RPP_COMMIT"), ")");
