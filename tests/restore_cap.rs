//! The value cap holds for RESTORE: a DUMP payload's strings may be LZF-compressed, so a
//! 56 KB payload can store a 5 MB string. Through `policy/default.yaml` (max-value-size,
//! 100 KiB) the payload's stored size is what counts.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::{Proxy, Raw, RedisServer};

/// What `DUMP` answers for a key set up by `setup` directly on `redis`, then deleted.
async fn dumped(redis: &RedisServer, setup: &[&[u8]]) -> Vec<u8> {
    let mut direct = Raw::connect(redis.addr()).await;
    let reply = direct.call(setup).await;
    assert!(
        !reply.starts_with(b"-"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let reply = direct.call(&[&b"DUMP"[..], setup[1]]).await;
    direct.call(&[&b"DEL"[..], setup[1]]).await;
    // `$<len>\r\n<payload>\r\n`
    let start = reply.iter().position(|&b| b == b'\n').unwrap() + 1;
    reply[start..reply.len() - 2].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_of_a_compressed_payload_is_held_to_the_value_cap() {
    let redis = RedisServer::start();
    let big = vec![b'a'; 5_000_000];
    let payload = dumped(&redis, &[b"SET", b"big", &big]).await;
    assert!(payload.len() < 102_400, "{} bytes", payload.len());
    let small = dumped(&redis, &[b"SET", b"small", b"hello"]).await;
    let stream = dumped(&redis, &[b"XADD", b"s", b"*", b"f", b"v"]).await;

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let mut config = redis_policy_proxy::setup::from_yaml(&yaml, &path).unwrap();
    config.set_upstream(redis.addr());
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;

    let reply = c.call(&[&b"RESTORE"[..], b"k", b"0", &payload]).await;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    assert!(
        reply.starts_with(
            "-ERR policy max-value-size: RESTORE payload holds a value of 5000000 bytes (uncompressed), above 102400"
        ),
        "{reply}"
    );
    let reply = c.call(&[&b"RESTORE"[..], b"s", b"0", &stream]).await;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    assert!(
        reply.starts_with("-ERR policy max-value-size: RESTORE refused: the size of the value in its payload cannot be checked"),
        "{reply}"
    );
    assert_eq!(redis.direct(&["DBSIZE"]).await, b":0\r\n");
    assert_eq!(
        c.call(&[&b"RESTORE"[..], b"small", b"0", &small]).await,
        b"+OK\r\n"
    );
    assert_eq!(redis.direct(&["GET", "small"]).await, b"$5\r\nhello\r\n");
}
