//! Sharded pub/sub (SSUBSCRIBE) through the proxy in front of a real Redis Cluster: one client
//! holds shard channels on several primaries, as a cluster client with a connection per node
//! would; a slot moved to another primary while subscribed is followed without the client
//! seeing Redis's `sunsubscribe` or the proxy's own re-subscription; SUNSUBSCRIBE answers as
//! Redis does, counting shard channels over every node.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::time::{Duration, Instant};

use common::cluster::{
    RedisCluster, begin_migration, end_migration, node_id, other_primary, proxy_config,
};
use common::{DEADLINE, Proxy, Raw, resp, show};
use redis_policy_proxy::cluster::slot;

/// How long a client is watched for a frame that must not come.
const QUIET: Duration = Duration::from_millis(300);

/// A shard-channel confirmation or message as Redis writes it (`>` for RESP3).
fn frame(proto: u8, kind: &str, channel: &str, last: &str) -> Vec<u8> {
    let head = if proto == 3 { ">3" } else { "*3" };
    format!(
        "{head}\r\n${}\r\n{kind}\r\n${}\r\n{channel}\r\n{last}\r\n",
        kind.len(),
        channel.len()
    )
    .into_bytes()
}

fn count(n: usize) -> String {
    format!(":{n}")
}

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}", s.len())
}

/// `SSUBSCRIBE channel` through `client` (speaking RESP `proto`), answered with the
/// confirmation Redis would give a client holding `held` shard channels after it.
async fn ssubscribe(client: &mut Raw, proto: u8, channel: &str, held: usize) {
    assert_eq!(
        show(&client.call(&["SSUBSCRIBE", channel]).await),
        show(&frame(proto, "ssubscribe", channel, &count(held)))
    );
}

/// Waits until `node` counts `want` subscribers of shard channel `channel`: the proxy's
/// re-subscription is asynchronous to the test, and a message published before it lands
/// would be lost (as on any Redis reconnect).
async fn wait_subscribers(node: &str, channel: &str, want: usize) {
    let mut conn = Raw::connect(node).await;
    let until = Instant::now() + DEADLINE;
    let expected = format!("*2\r\n${}\r\n{channel}\r\n:{want}\r\n", channel.len());
    loop {
        let got = conn.call(&["PUBSUB", "SHARDNUMSUB", channel]).await;
        if got == expected.as_bytes() {
            return;
        }
        assert!(
            Instant::now() < until,
            "{node} never counted {want} subscribers of {channel}: {}",
            show(&got)
        );
        // Polled with a command round trip, not a sleep: the next answer is the next check.
        let _ = conn.call(&["PING"]).await;
    }
}

#[tokio::test]
async fn one_client_holds_shard_channels_on_several_primaries() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let (a, b) = (&primaries[0], &primaries[1]);
    let ch_a = redis.key_on(a, "news");
    let ch_b = redis.key_on(b, "sport");
    let mut sub = Raw::connect(proxy.addr).await;

    // Two commands, two nodes: each confirmed with the session's count of shard channels.
    ssubscribe(&mut sub, 2, &ch_a, 1).await;
    ssubscribe(&mut sub, 2, &ch_b, 2).await;
    // Subscribing again to a held channel changes no count, as in Redis.
    ssubscribe(&mut sub, 2, &ch_a, 2).await;
    // One command naming channels of two slots is still refused, in Redis's words.
    assert_eq!(
        show(&sub.call(&["SSUBSCRIBE", &ch_a, &ch_b]).await),
        show(b"-CROSSSLOT Keys in request don't hash to the same slot\r\n")
    );
    // RESP2 subscribed mode, as Redis has it: PING answers an array, GET is refused.
    assert_eq!(
        show(&sub.call(&["PING"]).await),
        show(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n")
    );
    let get = sub.call(&["GET", "k"]).await;
    assert!(
        get.starts_with(b"-ERR Can't execute 'get'"),
        "{}",
        show(&get)
    );

    // Published through the proxy and straight to each node: both arrive.
    let mut publisher = Raw::connect(proxy.addr).await;
    assert_eq!(publisher.call(&["SPUBLISH", &ch_a, "p1"]).await, b":1\r\n");
    assert_eq!(
        show(&sub.read_frame().await),
        show(&frame(2, "smessage", &ch_a, &bulk("p1")))
    );
    assert_eq!(publisher.call(&["SPUBLISH", &ch_b, "p2"]).await, b":1\r\n");
    assert_eq!(
        show(&sub.read_frame().await),
        show(&frame(2, "smessage", &ch_b, &bulk("p2")))
    );
    for (node, ch) in [(a, &ch_a), (b, &ch_b)] {
        let mut direct = Raw::connect(node).await;
        assert_eq!(direct.call(&["SPUBLISH", ch, "d"]).await, b":1\r\n");
        assert_eq!(
            show(&sub.read_frame().await),
            show(&frame(2, "smessage", ch, &bulk("d")))
        );
    }

    // SUNSUBSCRIBE of one channel: Redis's count of what is left.
    assert_eq!(
        show(&sub.call(&["SUNSUBSCRIBE", &ch_b]).await),
        show(&frame(2, "sunsubscribe", &ch_b, &count(1)))
    );
    assert_eq!(
        publisher.call(&["SPUBLISH", &ch_b, "gone"]).await,
        b":0\r\n"
    );
    ssubscribe(&mut sub, 2, &ch_b, 2).await;

    // Without arguments: one confirmation per channel (in any order), counting down to 0.
    sub.send(&resp(&["SUNSUBSCRIBE"])).await;
    let frames = sub.read_frames(2).await;
    let first_a = frames[0] == frame(2, "sunsubscribe", &ch_a, &count(1));
    let expected = if first_a {
        [
            frame(2, "sunsubscribe", &ch_a, &count(1)),
            frame(2, "sunsubscribe", &ch_b, &count(0)),
        ]
    } else {
        [
            frame(2, "sunsubscribe", &ch_b, &count(1)),
            frame(2, "sunsubscribe", &ch_a, &count(0)),
        ]
    };
    assert_eq!(show(&frames.concat()), show(&expected.concat()));
    // Nothing is subscribed any more, on either node; the client is back to commands.
    assert_eq!(publisher.call(&["SPUBLISH", &ch_a, "x"]).await, b":0\r\n");
    assert_eq!(publisher.call(&["SPUBLISH", &ch_b, "x"]).await, b":0\r\n");
    assert_eq!(sub.call(&["SET", &ch_a, "v"]).await, b"+OK\r\n");
    assert_eq!(sub.call(&["GET", &ch_a]).await, b"$1\r\nv\r\n");
    assert_eq!(sub.call(&["PING"]).await, b"+PONG\r\n");
    // With nothing subscribed, Redis's own answer.
    assert_eq!(
        show(&sub.call(&["SUNSUBSCRIBE"]).await),
        show(b"*3\r\n$12\r\nsunsubscribe\r\n$-1\r\n:0\r\n")
    );
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

#[tokio::test]
async fn classic_and_shard_subscriptions_together_and_reset() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let ch_a = redis.key_on(&primaries[0], "orders");
    let ch_b = redis.key_on(&primaries[2], "stock");
    let mut sub = Raw::connect(proxy.addr).await;
    assert_eq!(
        show(&sub.call(&["SUBSCRIBE", "news"]).await),
        show(b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n")
    );
    // Shard channels count apart from classic ones, as in Redis 7.
    ssubscribe(&mut sub, 2, &ch_a, 1).await;
    ssubscribe(&mut sub, 2, &ch_b, 2).await;
    let mut publisher = Raw::connect(proxy.addr).await;
    // The count is the publishing node's own subscribers; the bus carries it to the others.
    let published = publisher.call(&["PUBLISH", "news", "n"]).await;
    assert!(published.starts_with(b":"), "{}", show(&published));
    assert_eq!(
        show(&sub.read_frame().await),
        show(b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$1\r\nn\r\n")
    );
    assert_eq!(publisher.call(&["SPUBLISH", &ch_b, "s"]).await, b":1\r\n");
    assert_eq!(
        show(&sub.read_frame().await),
        show(&frame(2, "smessage", &ch_b, &bulk("s")))
    );
    assert_eq!(
        show(&sub.call(&["PING"]).await),
        show(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n")
    );
    // RESET drops every subscription on every node.
    assert_eq!(sub.call(&["RESET"]).await, b"+RESET\r\n");
    assert_eq!(publisher.call(&["SPUBLISH", &ch_a, "x"]).await, b":0\r\n");
    assert_eq!(publisher.call(&["SPUBLISH", &ch_b, "x"]).await, b":0\r\n");
    assert_eq!(sub.call(&["GET", &ch_b]).await, b"$-1\r\n");
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

#[tokio::test]
async fn a_moved_slot_keeps_its_subscribers_in_resp2_and_resp3() {
    let redis = RedisCluster::start(3, 0);
    // No periodic refresh: only the old owner's MOVED can name the new one.
    let proxy = Proxy::start(proxy_config(
        &redis.live_addrs()[0],
        &["refresh_interval_ms: 600000"],
    ))
    .await;
    let source = redis.primaries()[0].clone();
    let target = other_primary(&redis, &source);
    let channel = redis.key_on(&source, "feed");
    let s = slot(channel.as_bytes());
    // A channel of another node, which the move must leave alone.
    let other = redis.key_on(&target, "other");

    let mut v2 = Raw::connect(proxy.addr).await;
    let mut v3 = Raw::connect(proxy.addr).await;
    let hello = v3.call(&["HELLO", "3"]).await;
    assert!(hello.starts_with(b"%"), "{}", show(&hello));
    for (c, proto) in [(&mut v2, 2), (&mut v3, 3)] {
        ssubscribe(c, proto, &channel, 1).await;
        ssubscribe(c, proto, &other, 2).await;
    }

    // Moved there and back: each time Redis drops the channel's subscribers on the old
    // owner with a `sunsubscribe` the clients must not see.
    for (from, to) in [(&source, &target), (&target, &source)] {
        let (from_id, to_id) = (node_id(&redis, from), node_id(&redis, to));
        drop(begin_migration(s, (from, &from_id), (to, &to_id)).await);
        end_migration(&redis, s, (from, to), &to_id).await;
        wait_subscribers(to, &channel, 2).await;

        let mut direct = Raw::connect(to).await;
        assert_eq!(
            direct.call(&["SPUBLISH", &channel, "after"]).await,
            b":2\r\n"
        );
        for (c, proto) in [(&mut v2, 2), (&mut v3, 3)] {
            assert_eq!(
                show(&c.read_frame().await),
                show(&frame(proto, "smessage", &channel, &bulk("after"))),
                "RESP{proto} after the move to {to}"
            );
        }
        // Through the proxy, whose map learnt the move.
        let mut publisher = Raw::connect(proxy.addr).await;
        assert_eq!(
            publisher.call(&["SPUBLISH", &channel, "via"]).await,
            b":2\r\n"
        );
        assert_eq!(publisher.call(&["SPUBLISH", &other, "o"]).await, b":2\r\n");
        for (c, proto) in [(&mut v2, 2), (&mut v3, 3)] {
            assert_eq!(
                show(&c.read_frames(2).await.concat()),
                show(
                    &[
                        frame(proto, "smessage", &channel, &bulk("via")),
                        frame(proto, "smessage", &other, &bulk("o")),
                    ]
                    .concat()
                )
            );
            // Neither Redis's sunsubscribe nor the proxy's re-subscription confirmation.
            c.assert_quiet(QUIET).await;
        }
    }

    // The counts still hold both channels: SUNSUBSCRIBE of both answers 1 then 0.
    for (c, proto) in [(&mut v2, 2), (&mut v3, 3)] {
        c.send(&resp(&["SUNSUBSCRIBE", &channel])).await;
        assert_eq!(
            show(&c.read_frame().await),
            show(&frame(proto, "sunsubscribe", &channel, &count(1)))
        );
        assert_eq!(
            show(&c.call(&["SUNSUBSCRIBE", &other]).await),
            show(&frame(proto, "sunsubscribe", &other, &count(0)))
        );
        assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
        c.assert_quiet(QUIET).await;
    }
    proxy.stop().await;
}

#[tokio::test]
async fn a_channel_that_cannot_be_subscribed_again_is_announced_gone() {
    let mut redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    // Gives up on the dead node after 3 s of background retries.
    let config = proxy_config(&redis.live_addrs()[0], &["resubscribe_timeout_ms: 3000"]);
    let proxy = Proxy::start(config).await;
    let doomed = &primaries[1];
    let ch_dead = redis.key_on(doomed, "dead");
    let ch_live = redis.key_on(&primaries[2], "live");
    let mut sub = Raw::connect(proxy.addr).await;
    ssubscribe(&mut sub, 2, &ch_dead, 1).await;
    ssubscribe(&mut sub, 2, &ch_live, 2).await;
    // The owner dies and nothing replaces it (no replicas): after trying for a bounded time
    // the proxy says what Redis would have said of a channel it dropped, and nothing hangs.
    let index = redis
        .nodes()
        .iter()
        .position(|n| &n.addr() == doomed)
        .unwrap();
    redis.kill(index);
    // The retries run in the background: the session answers meanwhile (RESP2 subscribed
    // mode's PING), long before the channel is given up.
    assert_eq!(
        show(&sub.call(&["PING"]).await),
        show(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n")
    );
    assert_eq!(
        show(&sub.read_frame().await),
        show(&frame(2, "sunsubscribe", &ch_dead, &count(1)))
    );
    // The other node's channel is still held and counted.
    assert_eq!(
        show(&sub.call(&["SUNSUBSCRIBE", &ch_live]).await),
        show(&frame(2, "sunsubscribe", &ch_live, &count(0)))
    );
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

#[tokio::test]
async fn a_failover_moves_the_subscription_to_the_promoted_replica() {
    let mut redis = RedisCluster::start_with(3, 1, &["--cluster-node-timeout", "1000"]);
    // Default retry bound (30 s): ample for the election (node timeout 1 s here).
    let config = proxy_config(&redis.live_addrs()[0], &["refresh_interval_ms: 500"]);
    let proxy = Proxy::start(config).await;
    let doomed = redis.primaries()[0].clone();
    let channel = redis.key_on(&doomed, "alerts");
    let s = slot(channel.as_bytes());
    let mut sub = Raw::connect(proxy.addr).await;
    let hello = sub.call(&["HELLO", "3"]).await;
    assert!(hello.starts_with(b"%"), "{}", show(&hello));
    ssubscribe(&mut sub, 3, &channel, 1).await;
    let index = redis
        .nodes()
        .iter()
        .position(|n| n.addr() == doomed)
        .unwrap();
    redis.kill(index);
    // The session keeps serving while its channel waits for the promotion.
    assert_eq!(sub.call(&["PING"]).await, b"+PONG\r\n");
    // Polled with a PING between looks (the map query blocks, and the proxy runs on this
    // test's runtime: the PING's await lets it work meanwhile).
    let mut live = Raw::connect(&redis.live_addrs()[0]).await;
    let until = Instant::now() + DEADLINE;
    let promoted = loop {
        let owner = redis.primary_for_slot(s);
        if owner != doomed {
            break owner;
        }
        assert!(Instant::now() < until, "no replica was promoted");
        assert_eq!(live.call(&["PING"]).await, b"+PONG\r\n");
    };
    wait_subscribers(&promoted, &channel, 1).await;
    let mut direct = Raw::connect(&promoted).await;
    assert_eq!(direct.call(&["SPUBLISH", &channel, "up"]).await, b":1\r\n");
    assert_eq!(
        show(&sub.read_frame().await),
        show(&frame(3, "smessage", &channel, &bulk("up")))
    );
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

/// A classic subscriber whose node fails is moved: Redis Cluster sends every PUBLISH to every
/// node, so the proxy subscribes the same channels and patterns on another primary and the
/// client, which saw nothing, keeps receiving messages published anywhere.
#[tokio::test]
async fn a_classic_subscriber_whose_node_fails_moves_to_another_node() {
    let mut redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut sub = Raw::connect(proxy.addr).await;
    assert_eq!(
        show(&sub.call(&["SUBSCRIBE", "news"]).await),
        show(&frame(2, "subscribe", "news", &count(1)))
    );
    assert_eq!(
        show(&sub.call(&["PSUBSCRIBE", "sport.*"]).await),
        show(&frame(2, "psubscribe", "sport.*", &count(2)))
    );
    // The node holding the subscription: the one that counts a subscriber of `news`.
    let mut home = None;
    for p in redis.primaries() {
        let numsub = Raw::connect(&p)
            .await
            .call(&["PUBSUB", "NUMSUB", "news"])
            .await;
        if numsub.ends_with(b":1\r\n") {
            home = Some(p);
        }
    }
    let home = home.expect("a node holds the subscription");
    let index = redis.nodes().iter().position(|n| n.addr() == home).unwrap();
    redis.kill(index);

    // Some other node takes the subscriptions; publish there once it has them.
    let until = Instant::now() + DEADLINE;
    let (publisher, mut direct) = 'found: loop {
        for p in redis.primaries().into_iter().filter(|p| *p != home) {
            let mut c = Raw::connect(&p).await;
            let numsub = c.call(&["PUBSUB", "NUMSUB", "news"]).await;
            let numpat = c.call(&["PUBSUB", "NUMPAT"]).await;
            if numsub.ends_with(b":1\r\n") && numpat == b":1\r\n" {
                break 'found (p, c);
            }
        }
        assert!(Instant::now() < until, "no node took the subscriptions");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(direct.call(&["PUBLISH", "news", "hello"]).await, b":1\r\n");
    assert_eq!(
        show(&sub.read_frame().await),
        show(&frame(2, "message", "news", &bulk("hello")))
    );
    // Every node hears a PUBLISH: one sent to a third node arrives too.
    let third = redis
        .primaries()
        .into_iter()
        .find(|p| *p != home && *p != publisher)
        .expect("a third primary");
    Raw::connect(&third)
        .await
        .call(&["PUBLISH", "sport.chess", "mate"])
        .await;
    let got = sub.read_frame().await;
    let pmessage = b"*4\r\n$8\r\npmessage\r\n$7\r\nsport.*\r\n$11\r\nsport.chess\r\n$4\r\nmate\r\n";
    assert_eq!(show(&got), show(pmessage));
    // Still subscribed mode, with the counts Redis gives.
    assert_eq!(
        show(&sub.call(&["UNSUBSCRIBE", "news"]).await),
        show(&frame(2, "unsubscribe", "news", &count(1)))
    );
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

/// PUBLISH through the proxy counts the subscribers through the proxy, as on one server: every
/// session's classic pub/sub goes to one node, so publishers whose other keyless commands are
/// spread over the primaries (by client id) all publish where the subscribers are. (Redis
/// Cluster delivers everywhere but counts only the node's own receivers: spread, PUBLISH
/// answered 0 for most publishers while a subscriber listened; the guide checks the count.)
#[tokio::test]
async fn publish_counts_subscribers_through_the_proxy() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut subs = Vec::new();
    for _ in 0..3 {
        let mut sub = Raw::connect(proxy.addr).await;
        assert!(sub.call(&["SUBSCRIBE", "orders"]).await.starts_with(b"*3"));
        subs.push(sub);
    }
    // Publishers with consecutive ids land on every primary for their keyless commands.
    for round in 0..6 {
        let mut publisher = Raw::connect(proxy.addr).await;
        let message = format!("m{round}");
        assert_eq!(
            publisher.call(&["PUBLISH", "orders", &message]).await,
            b":3\r\n",
            "publisher {round}"
        );
        for sub in &mut subs {
            let got = sub.read_frame().await;
            assert!(
                got.ends_with(format!("{message}\r\n").as_bytes()),
                "{}",
                show(&got)
            );
        }
    }
}

/// A session that unsubscribed from everything, or a RESP3 subscriber, reaches keys on every
/// node: neither stays pinned to the node it subscribed on (keys elsewhere got CROSSSLOT until
/// RESET). A RESP3 subscriber still gets its messages meanwhile.
#[tokio::test]
async fn subscribers_are_not_pinned_to_one_node() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    // Keys owned by different primaries (slots 0..16383 are split over 3 nodes).
    let keys = ["{a}k", "{b}k", "{c}k", "{d}k", "{e}k", "{f}k"];
    let mut client = Raw::connect(proxy.addr).await;
    assert!(client.call(&["SUBSCRIBE", "ch"]).await.starts_with(b"*3"));
    assert!(client.call(&["PSUBSCRIBE", "p*"]).await.starts_with(b"*3"));
    assert!(
        client
            .call(&["UNSUBSCRIBE", "ch"])
            .await
            .ends_with(b":1\r\n")
    );
    assert!(client.call(&["PUNSUBSCRIBE"]).await.ends_with(b":0\r\n"));
    for key in keys {
        assert_eq!(client.call(&["SET", key, "v"]).await, b"+OK\r\n", "{key}");
    }
    let mut resp3 = Raw::connect(proxy.addr).await;
    assert!(resp3.request(b"HELLO 3\r\n", 1).await.starts_with(b"%"));
    assert!(resp3.call(&["SUBSCRIBE", "news"]).await.starts_with(b">3"));
    for key in keys {
        assert_eq!(resp3.call(&["GET", key]).await, b"$1\r\nv\r\n", "{key}");
    }
    let mut publisher = Raw::connect(proxy.addr).await;
    assert_eq!(publisher.call(&["PUBLISH", "news", "hi"]).await, b":1\r\n");
    let message = resp3.read_frame().await;
    assert!(
        message.starts_with(b">3\r\n$7\r\nmessage"),
        "{}",
        show(&message)
    );
    assert!(
        resp3
            .call(&["UNSUBSCRIBE", "news"])
            .await
            .ends_with(b":0\r\n")
    );
    assert_eq!(resp3.call(&["GET", "{a}k"]).await, b"$1\r\nv\r\n");
}
