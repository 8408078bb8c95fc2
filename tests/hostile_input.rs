//! Randomised inputs for the request decoder, the reply scanner and the policy: whatever the
//! bytes, they answer without panicking and never claim bytes they were not given. A fixed
//! seed keeps every run identical, so a failure reproduces.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

use std::net::IpAddr;
use std::path::Path;

mod common;

use common::Rng;
use redis_policy_proxy::codec::{self, CodecLimits, Decoded};
use redis_policy_proxy::policy::Client;
use redis_policy_proxy::reply;

/// Fragments RESP is made of, so random inputs look like protocol often enough to go deep.
const PIECES: &[&[u8]] = &[
    b"*",
    b"$",
    b"+",
    b"-",
    b":",
    b">",
    b"%",
    b"~",
    b"|",
    b"_",
    b"#",
    b",",
    b"(",
    b"!",
    b"=",
    b"\r\n",
    b"\r",
    b"\n",
    b"0",
    b"1",
    b"2",
    b"3",
    b"-1",
    b"-2",
    b"999999999999",
    b"2147483648",
    b"GET",
    b"SET",
    b"k",
    b"\"",
    b"'",
    b"\\x4",
    b" ",
    b"\x00",
    b"\xff",
    b"OK",
];

fn random_input(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.below(24) {
        if rng.below(4) == 0 {
            out.push(rng.next() as u8);
        } else {
            out.extend_from_slice(PIECES[rng.below(PIECES.len())]);
        }
    }
    out
}

#[test]
fn request_decoder_never_panics_or_overreads() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let limits = CodecLimits::default();
    let mut args = Vec::new();
    let mut complete = 0;
    for _ in 0..300_000 {
        let input = random_input(&mut rng);
        if let Ok(Some(d)) = codec::decode(&input, &limits, &mut args) {
            complete += 1;
            assert!(d.len() <= input.len(), "{input:?}");
            if let Decoded::Command { len } = d {
                for r in &args {
                    assert!(r.end <= len, "{input:?}");
                }
            }
        }
    }
    assert!(
        complete > 1000,
        "the generator must reach complete frames ({complete})"
    );
}

#[test]
fn reply_scanner_never_panics_or_overreads() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let mut complete = 0;
    for _ in 0..300_000 {
        let input = random_input(&mut rng);
        if let Ok(Some(len)) = reply::scan(&input) {
            complete += 1;
            assert!(len <= input.len(), "{input:?}");
            // A complete frame stays complete with anything after it.
            let mut longer = input.clone();
            longer.extend_from_slice(b"+tail\r\n");
            assert_eq!(reply::scan(&longer), Ok(Some(len)), "{input:?}");
        }
        let _ = reply::classify_pubsub(&input);
    }
    assert!(
        complete > 1000,
        "the generator must reach complete frames ({complete})"
    );
}

#[test]
fn default_policy_accepts_any_argument_bytes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let config = redis_policy_proxy::setup::load(&path).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let policy = redis_policy_proxy::setup::policy(&config).unwrap();
    let client = Client {
        id: 1,
        addr: IpAddr::from([127, 0, 0, 1]),
        tenant: 0,
        user: 0,
        again: false,
    };
    let names: &[&[u8]] = &[
        b"SET",
        b"GET",
        b"XADD",
        b"EXPIRE",
        b"SETEX",
        b"GETEX",
        b"SCAN",
        b"MSET",
        b"EVAL",
        b"SORT",
        b"MIGRATE",
        b"ZUNIONSTORE",
        b"XREAD",
        b"CLIENT",
        b"CONFIG",
        b"OBJECT",
        b"HSET",
    ];
    let mut rng = Rng(42);
    for _ in 0..100_000 {
        let mut line: Vec<Vec<u8>> = vec![names[rng.below(names.len())].to_vec()];
        for _ in 0..rng.below(8) {
            line.push(random_input(&mut rng));
        }
        // Only the absence of a panic matters here; verdicts are tested elsewhere.
        let _ = policy.check(&client, &line[..]);
    }
}
