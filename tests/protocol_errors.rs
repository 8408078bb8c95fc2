//! Malformed requests and limits: the proxy answers Redis's exact protocol errors, closes
//! only the offending connection and keeps serving everyone else.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::*;

/// Sends `input` to Redis and to the proxy, expects identical bytes ending in `error` and a
/// closed connection, then checks the proxy still serves a new client.
async fn malformed_matches_redis(pair: &Pair, input: &[u8], error: &str) {
    let got = pair.compare_until_close(input).await;
    let want_tail = format!("-ERR Protocol error: {error}\r\n");
    assert!(
        got.ends_with(want_tail.as_bytes()),
        "expected the reply to end with {want_tail:?}, got {}",
        show(&got)
    );
    assert_eq!(
        exchange(pair.proxy.addr, b"PING\r\n", 1).await,
        b"+PONG\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_type_byte_inside_multibulk() {
    let pair = Pair::start().await;
    malformed_matches_redis(&pair, b"*1\r\n+foo\r\n", "expected '$', got '+'").await;
    malformed_matches_redis(
        &pair,
        b"*2\r\n$4\r\nECHO\r\n:12\r\n",
        "expected '$', got ':'",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_bulk_lengths() {
    let pair = Pair::start().await;
    for input in [
        &b"*1\r\n$-5\r\n"[..],
        b"*1\r\n$999999999999\r\n",
        b"*1\r\n$abc\r\n",
        b"*2\r\n$4\r\nECHO\r\n$-1\r\n",
    ] {
        malformed_matches_redis(&pair, input, "invalid bulk length").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_multibulk_lengths() {
    let pair = Pair::start().await;
    for input in [&b"*99999999999\r\n"[..], b"*abc\r\n", b"*3000000000\r\n"] {
        malformed_matches_redis(&pair, input, "invalid multibulk length").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_big_inline_request() {
    let pair = Pair::start().await;
    let input = vec![b'a'; 70 * 1024];
    malformed_matches_redis(&pair, &input, "too big inline request").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbalanced_quotes_in_inline_request() {
    let pair = Pair::start().await;
    malformed_matches_redis(&pair, b"SET \"foo bar\r\n", "unbalanced quotes in request").await;
    malformed_matches_redis(&pair, b"ECHO 'x\r\n", "unbalanced quotes in request").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_before_the_error_arrive_first_and_in_order() {
    let pair = Pair::start().await;
    let got = pair
        .compare_until_close(b"PING\r\nSET a 1\r\n*2\r\n$3\r\nGET\r\n$1\r\na\r\n*1\r\n$-5\r\n")
        .await;
    assert_eq!(
        got,
        b"+PONG\r\n+OK\r\n$1\r\n1\r\n-ERR Protocol error: invalid bulk length\r\n"
    );
    // Commands after the malformed one in the same write are never executed.
    let got = pair
        .compare_until_close(b"INCR n\r\n*1\r\n+foo\r\nINCR n\r\n")
        .await;
    assert_eq!(got, b":1\r\n-ERR Protocol error: expected '$', got '+'\r\n");
    assert_eq!(pair.upstream.direct(&["GET", "n"]).await, b"$1\r\n1\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_and_odd_but_valid_inputs_match_redis() {
    let pair = Pair::start().await;
    pair.compare(b"*0\r\n*-1\r\n\r\n\n\r\nPING\n", 1).await;
    pair.compare(b"$3\r\nfoo\r\n", 2).await;
    pair.compare(b"ECHO \"a\\x41\\n\\\"q\\\"\"\r\n", 1).await;
    pair.compare(b"   PING   \r\n", 1).await;
    pair.compare(b"ping\r\nEcHo MiXeD\r\n", 2).await;
    // A request split into one-byte writes.
    let req = resp(&["ECHO", "hello world"]);
    for input in [&pair.direct.addr(), &pair.proxy.addr.to_string()] {
        let mut c = Raw::connect(input).await;
        for b in &req {
            c.send(std::slice::from_ref(b)).await;
        }
        assert_eq!(c.read_frame().await, b"$11\r\nhello world\r\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_client_does_not_disturb_others() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut good = Raw::connect(proxy.addr).await;
    assert_eq!(good.request(b"SET k v\r\n", 1).await, b"+OK\r\n");
    // Half a command from the good client is outstanding while the bad ones misbehave.
    good.send(b"*2\r\n$3\r\nGET\r\n").await;
    for bad in [
        &b"*1\r\n+foo\r\n"[..],
        b"*1\r\n$-5\r\n",
        b"*99999999999\r\n",
        b"SET \"x\r\n",
    ] {
        let bytes = exchange_until_close(proxy.addr, bad).await;
        assert!(
            bytes.starts_with(b"-ERR Protocol error"),
            "{}",
            show(&bytes)
        );
    }
    let mut big = Raw::connect(proxy.addr).await;
    big.send(&vec![b'z'; 70 * 1024]).await;
    let (bytes, closed) = big.read_to_close(DEADLINE).await;
    assert!(closed, "too big inline request did not close");
    assert_eq!(bytes, b"-ERR Protocol error: too big inline request\r\n");

    good.send(b"$1\r\nk\r\n").await;
    assert_eq!(good.read_frame().await, b"$1\r\nv\r\n");
    assert_eq!(good.request(b"PING\r\n", 1).await, b"+PONG\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_request_limits() {
    let redis = RedisServer::start();
    let mut config = config_for(&redis.addr());
    config.limits.max_multibulk_len.value = 8;
    config.limits.max_bulk_len.value = 16;
    config.limits.max_inline_len.value = 64;
    config.limits.max_query_buffer.value = 4096;
    let proxy = Proxy::start(config).await;
    let addr = proxy.addr;

    // Within the limits everything works.
    let ok = [
        resp(&["RPUSH", "l", "a", "b", "c", "d", "e", "f"]),
        resp(&["ECHO", "0123456789abcdef"]),
        b"ECHO inline-ok\r\n".to_vec(),
    ]
    .concat();
    assert_eq!(
        exchange(addr, &ok, 3).await,
        b":6\r\n$16\r\n0123456789abcdef\r\n$9\r\ninline-ok\r\n"
    );

    // Beyond them: Redis's error for the same kind of violation, and the close.
    let cases: [(&[u8], &str); 3] = [
        (b"*9\r\n", "invalid multibulk length"),
        (b"*2\r\n$4\r\nECHO\r\n$17\r\n", "invalid bulk length"),
        (&[b'i'; 200], "too big inline request"),
    ];
    for (input, error) in cases {
        let got = exchange_until_close(addr, input).await;
        assert_eq!(
            got,
            format!("-ERR Protocol error: {error}\r\n").as_bytes(),
            "input {}",
            show(input)
        );
    }
    assert_eq!(exchange(addr, b"PING\r\n", 1).await, b"+PONG\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_clients_exceeded_gets_redis_error() {
    let redis = RedisServer::start();
    let mut config = config_for(&redis.addr());
    config.limits.max_clients.value = 2;
    // No readiness probe: its connections would count against the limit.
    let proxy = Proxy::spawn(config).await;
    let addr = proxy.addr;
    let mut c1 = Raw::connect(addr).await;
    let mut c2 = Raw::connect(addr).await;
    assert_eq!(c1.request(b"PING\r\n", 1).await, b"+PONG\r\n");
    assert_eq!(c2.request(b"PING\r\n", 1).await, b"+PONG\r\n");

    let mut c3 = Raw::connect(addr).await;
    c3.send(b"PING\r\n").await;
    let (bytes, closed) = c3.read_to_close(DEADLINE).await;
    assert_eq!(
        bytes,
        b"-ERR max number of clients reached\r\n",
        "{}",
        show(&bytes)
    );
    assert!(closed, "the rejected client must be closed");

    // The admitted clients are unaffected; a slot freed is a slot reusable.
    assert_eq!(c2.request(b"PING\r\n", 1).await, b"+PONG\r\n");
    drop(c1);
    wait_until("a freed client slot to be reusable", || async move {
        let Some(mut c) = Raw::try_connect(addr, DEADLINE).await else {
            return false;
        };
        c.send(b"PING\r\n").await;
        let got = c.collect_frames(1, DEADLINE).await;
        match got.frames.first() {
            Some(f) if f == b"+PONG\r\n" => true,
            Some(f) if f == b"-ERR max number of clients reached\r\n" => false,
            other => panic!("unexpected answer {other:?} (closed: {})", got.closed),
        }
    })
    .await;
}
