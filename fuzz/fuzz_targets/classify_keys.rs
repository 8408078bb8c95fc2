#![no_main]
//! See `docs/fuzzing.md` and `redis_policy_proxy::fuzzing::check_classify_keys`.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| redis_policy_proxy::fuzzing::check_classify_keys(data));
