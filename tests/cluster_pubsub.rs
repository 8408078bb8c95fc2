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

/// Sets a key of stem `stem` on every primary of `redis`, through `publisher`.
async fn set_on_every_primary(redis: &RedisCluster, publisher: &mut Raw, stem: &str) {
    for p in &redis.primaries() {
        let key = redis.key_on(p, stem);
        assert_eq!(publisher.call(&["SET", &key, "v"]).await, b"+OK\r\n");
    }
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

/// A pub/sub delivery as Redis writes it: `message` (channel, payload) or `pmessage`
/// (pattern, channel, payload), as a RESP3 push for `proto` 3.
fn delivery(proto: u8, parts: &[&str]) -> Vec<u8> {
    let head = if proto == 3 { '>' } else { '*' };
    let mut out = format!("{head}{}\r\n", parts.len());
    for p in parts {
        out.push_str(&bulk(p));
        out.push_str("\r\n");
    }
    out.into_bytes()
}

/// A SET of a key (named from `stem`) on each primary through `publisher`: the RESP2
/// subscriber `sub` of `__keyevent@0__:*` gets its `set` event, once each. `after` ends the
/// failure message.
async fn set_events_of_every_primary(
    redis: &RedisCluster,
    publisher: &mut Raw,
    sub: &mut Raw,
    stem: &str,
    after: &str,
) {
    for p in &redis.primaries() {
        let key = redis.key_on(p, stem);
        assert_eq!(publisher.call(&["SET", &key, "v"]).await, b"+OK\r\n");
        let want = vec![delivery(
            2,
            &["pmessage", "__keyevent@0__:*", "__keyevent@0__:set", &key],
        )];
        expect_frames(sub, want, &format!("SET {key} on {p}{after}")).await;
    }
}

/// Reads exactly `want.len()` frames (in any order: Redis orders a pattern's deliveries as
/// its dictionary does) within a bounded wait and compares them with `want`.
async fn expect_frames(sub: &mut Raw, mut want: Vec<Vec<u8>>, what: &str) {
    let got = sub.collect_frames(want.len(), Duration::from_secs(5)).await;
    let mut got = got.frames;
    got.sort();
    want.sort();
    let show_all = |f: &[Vec<u8>]| f.iter().map(|f| show(f)).collect::<Vec<_>>().join(" | ");
    assert_eq!(show_all(&got), show_all(&want), "{what}");
}

/// The PING reply a subscriber gets: RESP2 subscribed mode answers an array, RESP3 (or a
/// client no longer subscribed) a simple string. Coming right after the expected deliveries
/// it proves no extra delivery was queued before it.
async fn ping_next(sub: &mut Raw, proto: u8, subscribed: bool) {
    let pong: &[u8] = if proto == 2 && subscribed {
        b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"
    } else {
        b"+PONG\r\n"
    };
    assert_eq!(show(&sub.call(&["PING"]).await), show(pong));
}

/// Keyspace notifications are published only on the node that owns the key, never over the
/// cluster bus: a subscriber through the proxy hears them from every primary, each exactly
/// once; a regular PUBLISH matched by `*` (subscribed on every node) still arrives once, and
/// unsubscribing (by name, and all patterns at once) stops them everywhere. RESP2 and RESP3.
#[tokio::test]
async fn keyspace_notifications_from_every_primary_exactly_once() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    notify_everything(&primaries).await;
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut publisher = Raw::connect(proxy.addr).await;
    for proto in [2u8, 3] {
        let mut sub = Raw::connect(proxy.addr).await;
        if proto == 3 {
            assert!(sub.request(b"HELLO 3\r\n", 1).await.starts_with(b"%"));
        }
        let keys: Vec<String> = primaries
            .iter()
            .map(|p| redis.key_on(p, &format!("ks{proto}")))
            .collect();
        let space = |k: &str| format!("__keyspace@0__:{k}");
        assert_eq!(
            show(&sub.call(&["PSUBSCRIBE", "__keyspace@0__:*"]).await),
            show(&frame(proto, "psubscribe", "__keyspace@0__:*", &count(1)))
        );
        assert_eq!(
            show(&sub.call(&["SUBSCRIBE", "__keyevent@0__:set"]).await),
            show(&frame(proto, "subscribe", "__keyevent@0__:set", &count(2)))
        );
        for k in &keys {
            assert_eq!(publisher.call(&["SET", k, "v"]).await, b"+OK\r\n");
            let want = vec![
                delivery(proto, &["pmessage", "__keyspace@0__:*", &space(k), "set"]),
                delivery(proto, &["message", "__keyevent@0__:set", k]),
            ];
            expect_frames(&mut sub, want, &format!("SET {k} (RESP{proto})")).await;
        }
        ping_next(&mut sub, proto, true).await;

        // `*` is subscribed on every node: a PUBLISH (heard everywhere over the bus) still
        // arrives once, and each notification once per subscription that matches it.
        assert_eq!(
            show(&sub.call(&["PSUBSCRIBE", "*"]).await),
            show(&frame(proto, "psubscribe", "*", &count(3)))
        );
        let published = publisher.call(&["PUBLISH", "news", "hello"]).await;
        assert!(published.starts_with(b":"), "{}", show(&published));
        let want = vec![delivery(proto, &["pmessage", "*", "news", "hello"])];
        expect_frames(&mut sub, want, "PUBLISH news").await;
        for k in &keys {
            assert_eq!(publisher.call(&["DEL", k]).await, b":1\r\n");
            let want = vec![
                delivery(proto, &["pmessage", "__keyspace@0__:*", &space(k), "del"]),
                delivery(proto, &["pmessage", "*", &space(k), "del"]),
                delivery(proto, &["pmessage", "*", "__keyevent@0__:del", k]),
            ];
            expect_frames(&mut sub, want, &format!("DEL {k} (RESP{proto})")).await;
        }
        ping_next(&mut sub, proto, true).await;

        // PUNSUBSCRIBE without arguments: both patterns go (Redis's order), the channel stays.
        sub.send(&resp(&["PUNSUBSCRIBE"])).await;
        let confirmations = sub.read_frames(2).await;
        assert!(
            confirmations[0].ends_with(b":2\r\n") && confirmations[1].ends_with(b":1\r\n"),
            "{}",
            show(&confirmations.concat())
        );
        for k in &keys {
            assert_eq!(publisher.call(&["SET", k, "w"]).await, b"+OK\r\n");
            let want = vec![delivery(proto, &["message", "__keyevent@0__:set", k])];
            expect_frames(&mut sub, want, &format!("SET {k} after PUNSUBSCRIBE")).await;
        }
        ping_next(&mut sub, proto, true).await;
        assert_eq!(
            show(&sub.call(&["UNSUBSCRIBE", "__keyevent@0__:set"]).await),
            show(&frame(
                proto,
                "unsubscribe",
                "__keyevent@0__:set",
                &count(0)
            ))
        );
        for k in &keys {
            assert_eq!(publisher.call(&["SET", k, "x"]).await, b"+OK\r\n");
        }
        ping_next(&mut sub, proto, false).await;
        sub.assert_quiet(QUIET).await;
    }
    proxy.stop().await;
}

/// `CONFIG SET notify-keyspace-events KEA` on every primary, straight to each node.
async fn notify_everything(primaries: &[String]) {
    for p in primaries {
        let set = Raw::connect(p)
            .await
            .call(&["CONFIG", "SET", "notify-keyspace-events", "KEA"])
            .await;
        assert_eq!(set, b"+OK\r\n");
    }
}

/// Waits until no primary counts a pattern subscriber: the proxy's extra connections are
/// closed asynchronously to the client's RESET or disconnection.
async fn wait_no_patterns(primaries: &[String]) {
    let until = Instant::now() + DEADLINE;
    for p in primaries {
        let mut conn = Raw::connect(p).await;
        loop {
            let numpat = conn.call(&["PUBSUB", "NUMPAT"]).await;
            if numpat == b":0\r\n" {
                break;
            }
            assert!(Instant::now() < until, "{p} still counts {}", show(&numpat));
            // Polled with a round trip, not a sleep: the next answer is the next check.
            let _ = conn.call(&["PING"]).await;
        }
    }
}

/// The extra connections that hear other primaries' notifications end with the session's
/// subscriptions: on RESET (nothing more arrives, and no node keeps a subscriber) and when the
/// client disconnects.
#[tokio::test]
async fn keyspace_subscriptions_end_with_reset_and_disconnection() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    notify_everything(&primaries).await;
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut publisher = Raw::connect(proxy.addr).await;
    let mut sub = Raw::connect(proxy.addr).await;
    assert_eq!(
        show(&sub.call(&["PSUBSCRIBE", "__keyevent@0__:*"]).await),
        show(&frame(2, "psubscribe", "__keyevent@0__:*", &count(1)))
    );
    assert_eq!(sub.call(&["RESET"]).await, b"+RESET\r\n");
    set_on_every_primary(&redis, &mut publisher, "reset").await;
    ping_next(&mut sub, 2, false).await;
    sub.assert_quiet(QUIET).await;
    wait_no_patterns(&primaries).await;

    assert!(
        sub.call(&["PSUBSCRIBE", "__key*"])
            .await
            .ends_with(b":1\r\n")
    );
    drop(sub);
    wait_no_patterns(&primaries).await;
    proxy.stop().await;
}

/// The id of the pattern subscriber on `node` (the proxy's extra connection), once there is
/// exactly one and it is not `not`: polled with a round trip between looks.
async fn pattern_subscriber(node: &str, not: Option<&str>) -> String {
    let mut conn = Raw::connect(node).await;
    let until = Instant::now() + DEADLINE;
    loop {
        let list = conn.call(&["CLIENT", "LIST", "TYPE", "pubsub"]).await;
        let list = String::from_utf8_lossy(&list).into_owned();
        let ids: Vec<&str> = list
            .lines()
            .filter(|l| l.contains(" psub=1 "))
            .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
            .collect();
        if let [id] = ids[..]
            && Some(id) != not
        {
            return id.to_string();
        }
        assert!(
            Instant::now() < until,
            "{node}: pattern subscribers {ids:?}"
        );
        let _ = conn.call(&["PING"]).await;
    }
}

/// An extra connection that fails (killed on its node) ends neither the session nor brings
/// it frames of its own, and the node is listened to again: each primary's notification
/// still arrives exactly once.
#[tokio::test]
async fn a_failed_notification_connection_spares_the_session() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    notify_everything(&primaries).await;
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut publisher = Raw::connect(proxy.addr).await;
    let mut sub = Raw::connect(proxy.addr).await;
    // A plain channel lives on the home connection only: it tells the home node.
    assert!(sub.call(&["SUBSCRIBE", "plain"]).await.ends_with(b":1\r\n"));
    assert!(
        sub.call(&["PSUBSCRIBE", "__keyevent@0__:*"])
            .await
            .ends_with(b":2\r\n")
    );
    let mut home = None;
    for p in &primaries {
        let numsub = Raw::connect(p)
            .await
            .call(&["PUBSUB", "NUMSUB", "plain"])
            .await;
        if numsub.ends_with(b":1\r\n") {
            home = Some(p.clone());
        }
    }
    let home = home.expect("a node holds the subscription");
    let victim = primaries.iter().find(|p| **p != home).unwrap().clone();
    let extra = pattern_subscriber(&victim, None).await;
    let killed = Raw::connect(&victim)
        .await
        .call(&["CLIENT", "KILL", "ID", &extra])
        .await;
    assert_eq!(killed, b":1\r\n");
    ping_next(&mut sub, 2, true).await;
    pattern_subscriber(&victim, Some(&extra)).await;

    set_events_of_every_primary(&redis, &mut publisher, &mut sub, "failed", "").await;
    ping_next(&mut sub, 2, true).await;
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

/// A primary whose extra connection failed with it is listened to again once its replica is
/// promoted: the notifications of the keys it now owns reach the subscriber.
#[tokio::test]
async fn keyspace_notifications_follow_a_failover() {
    let mut redis = RedisCluster::start_with(3, 1, &["--cluster-node-timeout", "1000"]);
    // Every node, replicas included: one of them becomes a primary.
    notify_everything(&redis.live_addrs()).await;
    let config = proxy_config(&redis.live_addrs()[0], &["refresh_interval_ms: 500"]);
    let proxy = Proxy::start(config).await;
    let mut sub = Raw::connect(proxy.addr).await;
    // A plain channel lives on the home connection only: it tells the home node.
    assert!(sub.call(&["SUBSCRIBE", "plain"]).await.ends_with(b":1\r\n"));
    assert!(
        sub.call(&["PSUBSCRIBE", "__keyevent@0__:*"])
            .await
            .ends_with(b":2\r\n")
    );
    let primaries = redis.primaries();
    let mut home = None;
    for p in &primaries {
        let numsub = Raw::connect(p)
            .await
            .call(&["PUBSUB", "NUMSUB", "plain"])
            .await;
        if numsub.ends_with(b":1\r\n") {
            home = Some(p.clone());
        }
    }
    let home = home.expect("a node holds the subscription");
    let doomed = primaries.iter().find(|p| **p != home).unwrap().clone();
    let key = redis.key_on(&doomed, "failover");
    let s = slot(key.as_bytes());
    let index = redis
        .nodes()
        .iter()
        .position(|n| n.addr() == doomed)
        .unwrap();
    redis.kill(index);
    ping_next(&mut sub, 2, true).await;
    // Polled with a PING between looks (the proxy runs on this test's runtime).
    let mut live = Raw::connect(&home).await;
    let until = Instant::now() + DEADLINE;
    let promoted = loop {
        let owner = redis.primary_for_slot(s);
        if owner != doomed {
            break owner;
        }
        assert!(Instant::now() < until, "no replica was promoted");
        assert_eq!(live.call(&["PING"]).await, b"+PONG\r\n");
    };
    let mut direct = Raw::connect(&promoted).await;
    loop {
        if direct.call(&["PUBSUB", "NUMPAT"]).await == b":1\r\n" {
            break;
        }
        assert!(
            Instant::now() < until,
            "the promoted primary never got the pattern"
        );
        assert_eq!(live.call(&["PING"]).await, b"+PONG\r\n");
    }
    assert_eq!(direct.call(&["SET", &key, "v"]).await, b"+OK\r\n");
    let want = vec![delivery(
        2,
        &["pmessage", "__keyevent@0__:*", "__keyevent@0__:set", &key],
    )];
    expect_frames(&mut sub, want, "SET on the promoted primary").await;
    ping_next(&mut sub, 2, true).await;
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

/// A client logged in upstream as its own Redis user hears no notification Redis refuses
/// that user: its home node refuses the subscription, and nothing is spread to the other
/// primaries (whose extra connections would be logged in as the user too,
/// `tests/cluster_own_login.rs`).
#[tokio::test]
async fn notifications_refused_to_the_clients_own_user_stay_refused() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    notify_everything(&primaries).await;
    for p in &primaries {
        let user = Raw::connect(p)
            .await
            .call(&[
                "ACL",
                "SETUSER",
                "limited",
                "on",
                ">pw",
                "resetchannels",
                "&news*",
                "~*",
                "+@all",
            ])
            .await;
        assert_eq!(user, b"+OK\r\n");
    }
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut publisher = Raw::connect(proxy.addr).await;
    let mut sub = Raw::connect(proxy.addr).await;
    assert_eq!(sub.call(&["AUTH", "limited", "pw"]).await, b"+OK\r\n");
    let refused = sub.call(&["SUBSCRIBE", "__keyevent@0__:set"]).await;
    assert!(refused.starts_with(b"-NOPERM"), "{}", show(&refused));
    set_on_every_primary(&redis, &mut publisher, "limited").await;
    ping_next(&mut sub, 2, false).await;
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

/// A namespaced tenant's channel names carry its prefix upstream, so its PSUBSCRIBE of
/// `__keyspace@0__:*` names no notification channel there: nothing is spread to the other
/// primaries, and it hears no notifications (not even of its own keys), as in front of one
/// server; the confirmation shows the name without the prefix.
#[tokio::test]
async fn a_namespaced_tenant_hears_no_notifications() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    notify_everything(&primaries).await;
    let proxy = Proxy::start(common::cluster::namespaced_config(&redis.live_addrs()[0])).await;
    let mut sub = Raw::connect(proxy.addr).await;
    let mut writer = Raw::connect(proxy.addr).await;
    for c in [&mut sub, &mut writer] {
        assert_eq!(c.call(&["AUTH", "alice", "alicepw"]).await, b"+OK\r\n");
    }
    assert_eq!(
        show(&sub.call(&["PSUBSCRIBE", "__keyspace@0__:*"]).await),
        show(&frame(2, "psubscribe", "__keyspace@0__:*", &count(1)))
    );
    let mut patterns = 0;
    for p in &primaries {
        let numpat = Raw::connect(p).await.call(&["PUBSUB", "NUMPAT"]).await;
        patterns += usize::from(numpat == b":1\r\n");
    }
    assert_eq!(patterns, 1, "only the home node holds the pattern");
    for p in &primaries {
        // The tenant's key `k` is `a:k` upstream: placed by that name.
        let upstream = redis.key_on(p, "a:ns");
        let key = upstream.strip_prefix("a:").unwrap();
        assert_eq!(writer.call(&["SET", key, "v"]).await, b"+OK\r\n");
    }
    ping_next(&mut sub, 2, true).await;
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

/// A subscriber that switches RESP version (HELLO) keeps getting every primary's
/// notifications, in the version it speaks now: the extra connections are opened again in it.
#[tokio::test]
async fn keyspace_notifications_follow_a_hello() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    notify_everything(&primaries).await;
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut publisher = Raw::connect(proxy.addr).await;
    let mut sub = Raw::connect(proxy.addr).await;
    assert!(sub.request(b"HELLO 3\r\n", 1).await.starts_with(b"%"));
    assert_eq!(
        show(&sub.call(&["PSUBSCRIBE", "__keyevent@0__:*"]).await),
        show(&frame(3, "psubscribe", "__keyevent@0__:*", &count(1)))
    );
    let hello = sub.request(b"HELLO 2\r\n", 1).await;
    assert!(hello.starts_with(b"*"), "{}", show(&hello));
    // Every node's pattern subscriber speaks RESP2 now: the home connection, switched by the
    // HELLO, and the extra ones, opened again.
    for p in &primaries {
        let mut conn = Raw::connect(p).await;
        let until = Instant::now() + DEADLINE;
        loop {
            let list = conn.call(&["CLIENT", "LIST", "TYPE", "pubsub"]).await;
            let list = String::from_utf8_lossy(&list).into_owned();
            let subscribers: Vec<&str> = list.lines().filter(|l| l.contains(" psub=1 ")).collect();
            if let [one] = subscribers[..]
                && one.contains(" resp=2")
            {
                break;
            }
            assert!(Instant::now() < until, "{p}: {list}");
            let _ = conn.call(&["PING"]).await;
        }
    }
    set_events_of_every_primary(&redis, &mut publisher, &mut sub, "hello", " after HELLO 2").await;
    ping_next(&mut sub, 2, true).await;
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

/// A RESP3 subscriber's PUNSUBSCRIBE queued in MULTI (bound to the home node by a key of
/// its own): once EXEC has run it, no primary's notification arrives any more.
#[tokio::test]
async fn an_unsubscription_in_multi_stops_every_primary() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    notify_everything(&primaries).await;
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut publisher = Raw::connect(proxy.addr).await;
    let mut sub = Raw::connect(proxy.addr).await;
    assert!(sub.request(b"HELLO 3\r\n", 1).await.starts_with(b"%"));
    // A plain channel lives on the home connection only: it tells the home node.
    assert!(sub.call(&["SUBSCRIBE", "plain"]).await.ends_with(b":1\r\n"));
    assert_eq!(
        show(&sub.call(&["PSUBSCRIBE", "__keyevent@0__:*"]).await),
        show(&frame(3, "psubscribe", "__keyevent@0__:*", &count(2)))
    );
    let mut home = None;
    for p in &primaries {
        let numsub = Raw::connect(p)
            .await
            .call(&["PUBSUB", "NUMSUB", "plain"])
            .await;
        if numsub.ends_with(b":1\r\n") {
            home = Some(p.clone());
        }
    }
    let home = home.expect("a node holds the subscription");
    assert_eq!(sub.call(&["MULTI"]).await, b"+OK\r\n");
    let mine = redis.key_on(&home, "tx");
    // A read: a write would notify the subscriber inside EXEC's reply.
    assert_eq!(sub.call(&["GET", &mine]).await, b"+QUEUED\r\n");
    assert_eq!(
        sub.call(&["PUNSUBSCRIBE", "__keyevent@0__:*"]).await,
        b"+QUEUED\r\n"
    );
    let exec = sub.call(&["EXEC"]).await;
    assert!(exec.ends_with(b":1\r\n"), "{}", show(&exec));
    set_on_every_primary(&redis, &mut publisher, "multi").await;
    ping_next(&mut sub, 3, false).await;
    sub.assert_quiet(QUIET).await;
    proxy.stop().await;
}

/// A subscriber's MULTI in cluster mode, as Redis answers it: refused in RESP2 with every
/// other command but the SUBSCRIBE family, PING, QUIT and RESET, and in RESP3 a transaction whose
/// UNSUBSCRIBE is queued with one `+QUEUED` after the `+OK` of the MULTI the proxy deferred
/// (the connection was closed: it expected a confirmation, and got two frames).
#[tokio::test]
async fn a_subscribers_transaction_is_answered_as_redis_answers_it() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut resp2 = Raw::connect(proxy.addr).await;
    assert!(resp2.call(&["PSUBSCRIBE", "p*"]).await.starts_with(b"*3"));
    // Keys of every node, a split command, a subcommand, and the state changes Redis refuses
    // there (each one used to open a transaction, a WATCH or a name on the proxy's side, or
    // answer MOVED or CROSSSLOT).
    for (command, name) in [
        (&["MULTI"][..], "multi"),
        (&["WATCH", "{a}k"], "watch"),
        (&["WATCH", "{b}k"], "watch"),
        (&["MGET", "{a}k", "{b}k", "{c}k"], "mget"),
        (&["CLIENT", "SETNAME", "n"], "client|setname"),
        (&["CLIENT", "ID"], "client|id"),
        (&["SELECT", "1"], "select"),
    ] {
        let reply = resp2.call(command).await;
        let want = format!(
            "-ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT \
             / RESET are allowed in this context\r\n"
        );
        assert_eq!(show(&reply), show(want.as_bytes()), "{command:?}");
    }
    assert!(
        resp2
            .call(&["PUNSUBSCRIBE", "p*"])
            .await
            .ends_with(b":0\r\n")
    );
    assert_eq!(resp2.call(&["EXEC"]).await, b"-ERR EXEC without MULTI\r\n");
    for key in ["{a}k", "{b}k", "{c}k"] {
        assert_eq!(resp2.call(&["GET", key]).await, b"$-1\r\n", "{key}");
    }
    assert_eq!(resp2.call(&["CLIENT", "GETNAME"]).await, b"$-1\r\n");

    for (subscribe, unsubscribe, name) in [
        ("SUBSCRIBE", "UNSUBSCRIBE", "ch"),
        ("PSUBSCRIBE", "PUNSUBSCRIBE", "p*"),
    ] {
        let mut resp3 = Raw::connect(proxy.addr).await;
        assert!(resp3.request(b"HELLO 3\r\n", 1).await.starts_with(b"%"));
        assert!(resp3.call(&[subscribe, name]).await.starts_with(b">3"));
        assert_eq!(resp3.call(&["MULTI"]).await, b"+OK\r\n");
        assert_eq!(resp3.call(&[unsubscribe, name]).await, b"+QUEUED\r\n");
        let exec = resp3.call(&["EXEC"]).await;
        let confirmation = format!(
            "*1\r\n>3\r\n${}\r\n{}\r\n${}\r\n{name}\r\n:0\r\n",
            unsubscribe.len(),
            unsubscribe.to_lowercase(),
            name.len()
        );
        assert_eq!(exec, confirmation.as_bytes(), "{unsubscribe}");
        // Keys of every node answer afterwards.
        for key in ["{a}k", "{b}k", "{c}k"] {
            assert_eq!(resp3.call(&["GET", key]).await, b"_\r\n", "{key}");
        }
    }
}

/// The connections a session opens per node for shard channels count against its tenant's
/// share of the dedicated connections, as its own dedicated connection does (issue 26): one
/// tenant's subscribers cannot take every node's connections. Past the share the SSUBSCRIBE
/// gets the tenant-limit error; the other tenant still subscribes; a connection given back
/// (SUNSUBSCRIBE of its last channel) is the tenant's again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_channel_connections_count_against_the_tenants_share() {
    // sha256 of "adminpw" and "apppw".
    const ADMIN: &str = "5fcf82bc15aef42cd3ec93e6d4b51c04df110cf77ee715f62f3f172ff8ed9de9";
    const APP: &str = "71d3d4e36cf4bc4309fd7390ba79fc6a1d03d8d7b45ef26f04bcdff3ff116868";
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let yaml = format!(
        "upstream:\n  mode: cluster\n  cluster:\n    seeds: [{}]\n  dedicated_max: 4\n  dedicated_warm: 0\n  dedicated_wait_ms: 100\naccess:\n  users:\n    - {{name: admin, password_sha256: {ADMIN}}}\n    - {{name: app, password_sha256: {APP}}}\n  identities:\n    - {{tenant: ops, user: admin}}\n    - {{tenant: app, user: app}}\n",
        redis.live_addrs()[0]
    );
    let config =
        redis_policy_proxy::setup::from_yaml(&yaml, std::path::Path::new("tenants.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let channels: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "ch")).collect();

    let mut app = Raw::connect(proxy.addr).await;
    assert_eq!(app.call(&["AUTH", "app", "apppw"]).await, b"+OK\r\n");
    // Half of 4 (upstream.dedicated_caps.per_tenant_percent: 50): two nodes' connections.
    ssubscribe(&mut app, 2, &channels[0], 1).await;
    ssubscribe(&mut app, 2, &channels[1], 2).await;
    let refused = show(&app.call(&["SSUBSCRIBE", &channels[2]]).await);
    assert!(
        refused.contains("tenant 'app' holds all 2 of its dedicated upstream connections"),
        "{refused}"
    );
    // The other tenant's share is untouched.
    let mut ops = Raw::connect(proxy.addr).await;
    assert_eq!(ops.call(&["AUTH", "admin", "adminpw"]).await, b"+OK\r\n");
    ssubscribe(&mut ops, 2, &channels[2], 1).await;
    // The app client gives one connection back: its third node is its own again.
    assert_eq!(
        show(&app.call(&["SUNSUBSCRIBE", &channels[0]]).await),
        show(&frame(2, "sunsubscribe", &channels[0], ":1"))
    );
    let until = Instant::now() + DEADLINE;
    loop {
        let reply = app.call(&["SSUBSCRIBE", &channels[2]]).await;
        if reply == frame(2, "ssubscribe", &channels[2], ":2") {
            break;
        }
        assert!(
            Instant::now() < until,
            "the share given back never came back: {}",
            show(&reply)
        );
        tokio::time::sleep(common::POLL).await;
    }
}

/// A RESP3 client holding a shard channel that switches to RESP2 (`HELLO 2`) gets the
/// channel's messages as RESP2 arrays, as from Redis (the per-node connection still speaks
/// RESP3: its push is turned into the array; before, the RESP2 client got a `>` frame it
/// cannot read). It is then in RESP2's subscribed context.
#[tokio::test]
async fn a_shard_subscriber_that_switches_to_resp2_gets_resp2_messages() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut sub = Raw::connect(proxy.addr).await;
    assert!(sub.call(&["HELLO", "3"]).await.starts_with(b"%"));
    assert_eq!(
        show(&sub.call(&["SSUBSCRIBE", "ch"]).await),
        show(b">3\r\n$10\r\nssubscribe\r\n$2\r\nch\r\n:1\r\n")
    );
    assert!(sub.call(&["HELLO", "2"]).await.starts_with(b"*14\r\n"));
    let mut publisher = Raw::connect(proxy.addr).await;
    assert_eq!(publisher.call(&["SPUBLISH", "ch", "hi"]).await, b":1\r\n");
    assert_eq!(
        show(&sub.read_frames(1).await[0]),
        show(b"*3\r\n$8\r\nsmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n")
    );
    let refused = sub.call(&["GET", "k"]).await;
    assert!(
        refused.starts_with(b"-ERR Can't execute 'get'"),
        "{}",
        show(&refused)
    );
    proxy.stop().await;
}
