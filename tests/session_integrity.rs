//! Exactly one reply per request, in order, whatever happens to the upstream connections
//! underneath, and one client's state never reaching another's: a client's own AUTH on a
//! RESP3 connection (issue 33), pushes on shared connections, CLIENT TRACKING REDIRECT,
//! dedicated connection caps (issue 26). Through the proxy and a real redis-server.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::{Proxy, Raw, RedisServer, resp, show};

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

/// `HELLO 3`, then the client's own `AUTH` (what redis-py's `r.auth()` sends), pipelined with
/// the commands after it: each gets its one reply, in order, and the connection stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_after_hello_3_gets_one_reply_per_command() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    let mut input = resp(&["HELLO", "3"]);
    for args in [
        &["AUTH", "default", "x"][..],
        &["PING"],
        &["SET", "k", "v"],
        &["GET", "k"],
        &["AUTH", "default", "y"],
        &["HGETALL", "nothing"],
        &["ECHO", "end"],
    ] {
        input.extend_from_slice(&resp(args));
    }
    c.send(&input).await;
    let frames = c.read_frames(8).await;
    assert!(frames[0].starts_with(b"%7\r\n"), "{}", show(&frames[0]));
    let rest: Vec<String> = frames[1..].iter().map(|f| text(f)).collect();
    assert_eq!(
        rest,
        [
            "+OK\r\n",
            "+PONG\r\n",
            "+OK\r\n",
            "$1\r\nv\r\n",
            "+OK\r\n",
            // RESP3 after the AUTH: an empty map, not RESP2's empty array.
            "%0\r\n",
            "$3\r\nend\r\n"
        ]
    );
    // Still open and in order afterwards.
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
}

/// The id and address of one of the proxy's shared RESP3 connections, read from Redis's
/// CLIENT LIST (the proxy's shared connections are the RESP3 ones that ran HELLO).
async fn shared_resp3_id(redis: &RedisServer) -> String {
    let list = text(&redis.direct(&["CLIENT", "LIST"]).await);
    list.lines()
        .find(|l| l.contains(" resp=3") && l.contains("cmd=hello"))
        .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .unwrap_or_else(|| panic!("no shared RESP3 connection in {list}"))
        .to_string()
}

/// A RESP3 push on a shared upstream connection (invalidations sent there by a `CLIENT
/// TRACKING … BCAST REDIRECT` set up directly on Redis) is dropped and counted, never taken
/// for the reply of the request at the head of the queue: every reply stays with its request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_on_a_shared_connection_is_never_a_reply() {
    let redis = RedisServer::start();
    let mut config = common::config_for(&redis.addr());
    config.upstream.connections.value = 1;
    config.upstream.dedicated_warm.value = 0;
    let proxy = Proxy::start(config).await;
    let shared = shared_resp3_id(&redis).await;
    let mut tracker = redis.raw().await;
    assert_eq!(
        tracker
            .call(&["CLIENT", "TRACKING", "on", "BCAST", "REDIRECT", &shared])
            .await,
        b"+OK\r\n"
    );
    let mut a = Raw::connect(proxy.addr).await;
    let mut b = Raw::connect(proxy.addr).await;
    a.call(&["HELLO", "3"]).await;
    b.call(&["HELLO", "3"]).await;
    for i in 0..20 {
        let (ka, va) = (format!("a:{i}"), format!("secret-a-{i}"));
        let (kb, vb) = (format!("b:{i}"), format!("secret-b-{i}"));
        // Each write sends an invalidation to the shared connection after its reply.
        assert_eq!(a.call(&["SET", &ka, &va]).await, b"+OK\r\n");
        assert_eq!(b.call(&["SET", &kb, &vb]).await, b"+OK\r\n");
        assert_eq!(
            text(&a.call(&["GET", &ka]).await),
            format!("${}\r\n{va}\r\n", va.len())
        );
        assert_eq!(
            text(&b.call(&["GET", &kb]).await),
            format!("${}\r\n{vb}\r\n", vb.len())
        );
    }
    // RESP3 UNSUBSCRIBE without subscriptions takes the shared path: its pushed confirmation
    // is its reply.
    assert_eq!(
        text(&a.call(&["UNSUBSCRIBE", "nothing"]).await),
        ">3\r\n$11\r\nunsubscribe\r\n$7\r\nnothing\r\n:0\r\n"
    );
    assert_eq!(a.call(&["PING"]).await, b"+PONG\r\n");
    let (_, metrics) = common::http_get(proxy.admin, "/metrics").await;
    assert!(
        common::sample(&metrics, "rpp_upstream_stray_pushes_total") >= 40.0,
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("stray"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
