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
