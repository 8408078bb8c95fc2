//! Replays every input under `tests/fuzz_regressions/<target>/` through the checks of fuzz
//! target `<target>` (`redis_policy_proxy::fuzzing`, the same functions the targets in
//! `fuzz/` call), so crashes the fuzzer found stay fixed on stable Rust without cargo-fuzz.
//! Each directory also holds a few inputs from the fuzzing corpus, so no target is replayed
//! empty. See `docs/fuzzing.md`.

use std::path::Path;

use redis_policy_proxy::fuzzing;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_regressions")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no inputs in {}", dir.display());
    for file in files {
        let data = std::fs::read(&file).expect("readable input");
        let name = file.display().to_string();
        if let Err(panic) = std::panic::catch_unwind(|| check(&data)) {
            eprintln!("fuzz regression failed: {name}");
            std::panic::resume_unwind(panic);
        }
    }
}

#[test]
fn decode() {
    replay("decode", fuzzing::check_decode);
}

#[test]
fn inline() {
    replay("inline", fuzzing::check_inline);
}

#[test]
fn classify_keys() {
    replay("classify_keys", fuzzing::check_classify_keys);
}

#[test]
fn policy_rewrite() {
    replay("policy_rewrite", fuzzing::check_policy_rewrite);
}

#[test]
fn reply_rewrite() {
    replay("reply_rewrite", fuzzing::check_reply_rewrite);
}
