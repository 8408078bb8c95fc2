//! Client ids in front of a Redis Cluster work as in front of one Redis: `CLIENT ID` is the id
//! `CLIENT INFO` and `CLIENT LIST` show through the proxy, another client's `CLIENT UNBLOCK
//! <id>` wakes a command blocked on whichever node it went to (answered 1, or 0 when nothing
//! is blocked, as by Redis), `CLIENT KILL ID <id>` ends that client, and `CLIENT TRACKING …
//! REDIRECT <id>` sends invalidations to that client.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::cluster::{RedisCluster, proxy_config};
use common::{DEADLINE, POLL, Proxy, Raw, show};

/// The proxy's id of `client` (`CLIENT ID`).
async fn client_id(client: &mut Raw) -> String {
    let reply = String::from_utf8(client.call(&["CLIENT", "ID"]).await).unwrap();
    reply.trim_start_matches(':').trim_end().to_string()
}

/// `CLIENT UNBLOCK id` (with `mode`) from `other` until it answers 1: the blocking command
/// reached its node.
async fn unblock(other: &mut Raw, id: &str, mode: &[&str], what: &str) {
    let mut command = vec!["CLIENT", "UNBLOCK", id];
    command.extend(mode);
    let mut reply = Vec::new();
    for _ in 0..500 {
        reply = other.call(&command).await;
        if reply == b":1\r\n" {
            return;
        }
        assert_eq!(reply, b":0\r\n", "{what}");
        tokio::time::sleep(POLL).await;
    }
    panic!("{what}: never unblocked: {}", show(&reply));
}

/// Polls `CLIENT LIST ID id` through the proxy until the client's last command is BLPOP
/// (sent, so it reached its node or is on its way).
async fn wait_blocked(other: &mut Raw, id: &str) {
    for _ in 0..500 {
        let list = other.call(&["CLIENT", "LIST", "ID", id]).await;
        if String::from_utf8_lossy(&list).contains("cmd=blpop") {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    panic!("client {id} never ran BLPOP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ids_name_the_clients_connection_on_its_node() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut blocked = Raw::connect(proxy.addr).await;
    let id = client_id(&mut blocked).await;
    let info = String::from_utf8(blocked.call(&["CLIENT", "INFO"]).await).unwrap();
    assert!(info.contains(&format!("id={id} ")), "{info}");
    let mut other = Raw::connect(proxy.addr).await;
    let list = String::from_utf8(other.call(&["CLIENT", "LIST"]).await).unwrap();
    assert!(list.contains(&format!("id={id} ")), "{list}");
    // Not blocked (no connection of its own yet): 0, as Redis says for a client not blocked.
    assert_eq!(other.call(&["CLIENT", "UNBLOCK", &id]).await, b":0\r\n");

    // A command blocked on each primary in turn, woken from another client, both modes.
    for primary in redis.primaries() {
        let key = redis.key_on(&primary, "queue");
        let what = format!("BLPOP on {primary}");
        blocked.send(&common::resp(&["BLPOP", &key, "0"])).await;
        unblock(&mut other, &id, &[], &what).await;
        assert_eq!(blocked.read_frame().await, b"*-1\r\n", "{what}");
        blocked.send(&common::resp(&["BLPOP", &key, "0"])).await;
        unblock(&mut other, &id, &["ERROR"], &what).await;
        let err = blocked.read_frame().await;
        assert!(err.starts_with(b"-UNBLOCKED"), "{what}: {}", show(&err));
        // Nothing blocked any more: 0.
        assert_eq!(
            other.call(&["CLIENT", "UNBLOCK", &id]).await,
            b":0\r\n",
            "{what}"
        );
    }
    // The same id read as another node's connection never unblocks an unrelated client:
    // a second blocked client, on another node, is not woken by the first one's id.
    let mut second = Raw::connect(proxy.addr).await;
    let second_id = client_id(&mut second).await;
    let primaries = redis.primaries();
    second
        .send(&common::resp(&[
            "BLPOP",
            &redis.key_on(&primaries[1], "q2"),
            "0",
        ]))
        .await;
    blocked
        .send(&common::resp(&[
            "BLPOP",
            &redis.key_on(&primaries[0], "q1"),
            "0",
        ]))
        .await;
    unblock(&mut other, &second_id, &[], "second").await;
    assert_eq!(second.read_frame().await, b"*-1\r\n");
    unblock(&mut other, &id, &[], "first").await;
    assert_eq!(blocked.read_frame().await, b"*-1\r\n");

    // CLIENT KILL ID ends the client, blocked or not.
    blocked
        .send(&common::resp(&[
            "BLPOP",
            &redis.key_on(&primaries[2], "q3"),
            "0",
        ]))
        .await;
    // Blocked there (the UNBLOCK that would wake it says so), then killed.
    wait_blocked(&mut other, &id).await;
    assert_eq!(other.call(&["CLIENT", "KILL", "ID", &id]).await, b":1\r\n");
    let (_, closed) = blocked.read_to_close(DEADLINE).await;
    assert!(closed, "the killed client's connection is closed");
    assert_eq!(other.call(&["CLIENT", "UNBLOCK", &id]).await, b":0\r\n");
}

/// `CLIENT TRACKING on REDIRECT <id>` names a subscriber through the proxy (Redis sends a
/// RESP2 client in pub/sub mode its redirected invalidations, whatever it subscribed to).
/// This one is not subscribed to `__redis__:invalidate`, so it listens on its own node only
/// (one that is hears every primary: `cluster_tracking.rs`): the tracking client's
/// connection is opened on the subscriber's node (Redis redirects invalidations only to a
/// client of its own), its reads of keys there are tracked, and a write of one from another
/// client sends the subscriber the invalidation; `CLIENT GETREDIR` names the subscriber by
/// the proxy's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_redirects_to_a_subscriber_on_its_node() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut sink = Raw::connect(proxy.addr).await;
    let sink_id = client_id(&mut sink).await;
    let subscribed = sink.call(&["SUBSCRIBE", "news"]).await;
    assert!(
        subscribed.starts_with(b"*3\r\n$9\r\nsubscribe"),
        "{}",
        show(&subscribed)
    );
    let mut tracker = Raw::connect(proxy.addr).await;
    assert_eq!(
        tracker
            .call(&["CLIENT", "TRACKING", "on", "REDIRECT", &sink_id])
            .await,
        b"+OK\r\n"
    );
    // The tracker is now on the subscriber's node: its keys are read, the others' refused.
    let mut tracked = None;
    for p in redis.primaries() {
        let key = redis.key_on(&p, "tracked");
        let reply = tracker.call(&["GET", &key]).await;
        match &reply[..] {
            b"$-1\r\n" => tracked = Some(key),
            r => assert!(r.starts_with(b"-CROSSSLOT"), "{p}: {}", show(r)),
        }
    }
    let tracked = tracked.expect("one node serves the tracker");
    let mut other = Raw::connect(proxy.addr).await;
    assert_eq!(other.call(&["SET", &tracked, "1"]).await, b"+OK\r\n");
    let invalidation = sink.read_frame().await;
    assert!(
        invalidation.starts_with(b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate")
            && String::from_utf8_lossy(&invalidation).contains(&tracked),
        "{}",
        show(&invalidation)
    );
    // The redirect is reported by the id the proxy gave, as it was given.
    assert_eq!(
        tracker.call(&["CLIENT", "GETREDIR"]).await,
        format!(":{sink_id}\r\n").as_bytes()
    );
}
