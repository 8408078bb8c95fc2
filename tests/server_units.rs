//! The newer servers' own Tcl units through the proxy (the server matrix, docs/compatibility.md):
//! for Redis 8.0 and Valkey 9.1 as `scripts/build-servers.sh` builds them, the units of
//! `tests/conformance/servers/<name>/units.txt` (data types, hash field expiry, scripting,
//! pub/sub) from the server's own source tree run directly and through the proxy binary
//! (`tests/conformance/server-units.sh`). Fails when a test that passes directly does not pass
//! through the proxy, unless `servers/<name>/known-losses.txt` lists it, or when fewer than
//! 99.5% of the direct passes pass through the proxy.
//!
//! `CONFORMANCE=0` skips it, as it does `tests/conformance.rs`; `SERVER_UNITS="unit/pubsub"`
//! runs a subset. A server that is not built is skipped with a `SKIPPED:` line, or fails the
//! test under `RPP_SERVER_MATRIX=require` (`.ci/run` sets it once the build succeeded).

#![allow(
    clippy::disallowed_methods,
    reason = "the shared fixtures wait on real server processes in wall-clock time"
)]

use std::process::Command;

mod common;

#[test]
fn newer_servers_own_units_pass_through_the_proxy() {
    if std::env::var("CONFORMANCE").as_deref() == Ok("0") {
        eprintln!("server units skipped (CONFORMANCE=0)");
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let mut failed = Vec::new();
    for (name, _bin) in common::matrix_servers() {
        let out = format!("{root}/target/server-units/{name}");
        let status = Command::new("bash")
            .arg(format!("{root}/tests/conformance/server-units.sh"))
            .arg(name)
            .arg(env!("CARGO_BIN_EXE_redis-policy-proxy"))
            .arg(&out)
            .env("RPP_SERVER_CACHE", common::server_cache())
            .status()
            .expect("bash runs tests/conformance/server-units.sh");
        if !status.success() {
            failed.push(format!(
                "{name} (exit {status}; {out}/summary.tsv, logs in {out})"
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "the servers' own units lost tests through the proxy (see the output above): {}",
        failed.join(", ")
    );
}
