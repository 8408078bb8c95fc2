//! Redis 7.0.15's own Tcl test suite through the proxy (`tests/conformance/run.sh`): fails when
//! a test that passes directly against Redis does not pass through the proxy, unless
//! `tests/conformance/known-losses.txt` lists it with its reason (docs/conformance.md).
//!
//! The longest test in the suite (about 15 minutes on 2 cores). It needs tclsh and the
//! suite's files, which `run.sh` fetches once from Debian's source package (root, apt);
//! `.ci/run` provides both. `CONFORMANCE=0` skips it for a quick local run; CI never sets it.
//! `CONFORMANCE_UNITS="unit/multi unit/pubsub"` runs a subset.

use std::process::Command;

#[test]
fn redis_own_test_suite_passes_through_the_proxy() {
    if std::env::var("CONFORMANCE").as_deref() == Ok("0") {
        eprintln!("conformance suite skipped (CONFORMANCE=0)");
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let out = format!("{root}/target/conformance");
    let status = Command::new("bash")
        .arg(format!("{root}/tests/conformance/run.sh"))
        .arg(env!("CARGO_BIN_EXE_redis-policy-proxy"))
        .arg(&out)
        .status()
        .expect("bash runs tests/conformance/run.sh");
    assert!(
        status.success(),
        "Redis's test suite through the proxy lost tests that pass directly (see the output \
         above and {out}/lost-vs-baseline.txt, logs in {out}/logs)"
    );
}
