//! Redis 7.0.15's own Tcl test suite through the proxy (`tests/conformance/run.sh`): fails when
//! a test that passes directly against Redis does not pass through the proxy, unless
//! `tests/conformance/known-losses.txt` lists it with its reason (docs/conformance.md).
//! Then the same against a Redis Cluster of three primaries (`CONFORMANCE_UPSTREAM=cluster`,
//! the units of `tests/conformance/cluster-units.txt`), against
//! `tests/conformance/cluster-known-losses.txt`.
//!
//! The longest test in the suite (about 15 minutes on 2 cores for one server, 12 more for the
//! cluster). It needs tclsh and the suite's files, which `run.sh` fetches once from Debian's
//! source package (root, apt); `.ci/run` provides both. `CONFORMANCE=0` skips it for a quick
//! local run, `CONFORMANCE_CLUSTER=0` skips the cluster part; CI sets neither.
//! `CONFORMANCE_UNITS="unit/multi unit/pubsub"` runs a subset (of both parts).
//!
//! One test, the two parts one after the other: the Tcl harness binds a fixed port for its
//! own test server, so two suites cannot run at once.

use std::process::Command;

/// Runs `run.sh` with `upstream` (`standalone` or `cluster`) into `target/conformance[-cluster]`.
fn run(upstream: &str) -> Result<(), String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = match upstream {
        "cluster" => format!("{root}/target/conformance-cluster"),
        _ => format!("{root}/target/conformance"),
    };
    let status = Command::new("bash")
        .arg(format!("{root}/tests/conformance/run.sh"))
        .arg(env!("CARGO_BIN_EXE_redis-policy-proxy"))
        .arg(&out)
        .env("CONFORMANCE_UPSTREAM", upstream)
        .status()
        .expect("bash runs tests/conformance/run.sh");
    if status.success() {
        return Ok(());
    }
    Err(format!(
        "Redis's test suite through the proxy in front of {upstream} Redis lost tests that pass \
         directly (see the output above and {out}/lost-vs-baseline.txt, logs in {out}/logs)"
    ))
}

#[test]
fn redis_own_test_suite_passes_through_the_proxy() {
    if std::env::var("CONFORMANCE").as_deref() == Ok("0") {
        eprintln!("conformance suite skipped (CONFORMANCE=0)");
        return;
    }
    let standalone = run("standalone");
    let cluster = match std::env::var("CONFORMANCE_CLUSTER").as_deref() {
        Ok("0") => {
            eprintln!("conformance suite in front of a cluster skipped (CONFORMANCE_CLUSTER=0)");
            Ok(())
        }
        _ => run("cluster"),
    };
    let failed: Vec<String> = [standalone, cluster]
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
