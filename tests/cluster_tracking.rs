//! Client-side caching (`CLIENT TRACKING ON`, broadcasting and default mode) through the
//! proxy in front of a real Redis Cluster: tracking is turned on on every primary (one
//! connection each), the session is not pinned (MGET across nodes works), every primary's
//! writes are invalidated (in the default mode, of the keys the client read, which it reads
//! over those connections), an invalidation never overtakes the reply of a read that ran
//! before its write, and a tracking connection that ends disconnects the client (its cache
//! starts over).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::time::Duration;

use common::cluster::{RedisCluster, proxy_config};
use common::{Proxy, Raw, resp};

/// How long a client is watched for a frame that must not come.
const QUIET: Duration = Duration::from_millis(300);

/// A reply as text (binary-safe enough for these replies).
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The invalidation push of `key` as Redis sends it in RESP3.
fn invalidation(key: &str) -> Vec<u8> {
    format!(
        ">2\r\n$10\r\ninvalidate\r\n*1\r\n${}\r\n{key}\r\n",
        key.len()
    )
    .into_bytes()
}

/// A RESP3 client of `proxy` with broadcasting tracking on (`extra` options after BCAST).
async fn bcast_client(proxy: &Proxy, extra: &[&str]) -> Raw {
    let mut c = Raw::connect(proxy.addr).await;
    let hello = c.call(&["HELLO", "3"]).await;
    assert!(hello.starts_with(b"%"), "{}", text(&hello));
    let mut args = vec!["CLIENT", "TRACKING", "ON", "BCAST"];
    args.extend_from_slice(extra);
    assert_eq!(text(&c.call(&args).await), "+OK\r\n");
    c
}

/// Waits until every node of `nodes` counts `want` tracking clients (a connection closed by
/// the proxy ends on the node a moment later); `what` names the step in the panic.
async fn wait_tracking_clients(nodes: &[String], want: &str, what: &str) {
    for node in nodes {
        let until = std::time::Instant::now() + common::DEADLINE;
        while tracking_clients(node).await != want {
            assert!(
                std::time::Instant::now() < until,
                "{node} never counted {want} tracking clients: {what}"
            );
            tokio::time::sleep(common::POLL).await;
        }
    }
}

/// `tracking_clients` in `node`'s INFO.
async fn tracking_clients(node: &str) -> String {
    let mut c = Raw::connect(node).await;
    let info = String::from_utf8_lossy(&c.call(&["INFO", "clients"]).await).into_owned();
    info.lines()
        .find_map(|l| l.strip_prefix("tracking_clients:"))
        .unwrap_or("?")
        .trim()
        .to_string()
}

/// Tracking is on on every primary, the session is not pinned, each primary's writes are
/// invalidated once; TRACKINGINFO, GETREDIR and CACHING answer as Redis does; REDIRECT while
/// on and a tracking command queued in MULTI are refused with the reason; OFF turns it off on
/// every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bcast_tracking_hears_every_primary_without_pinning() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let keys: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "user")).collect();
    let mut c = bcast_client(&proxy, &["PREFIX", "user"]).await;
    for p in &primaries {
        assert_eq!(tracking_clients(p).await, "1", "tracking on {p}");
    }
    // Not pinned: one command reads keys of every node.
    let mget = text(&c.call(&["MGET", &keys[0], &keys[1], &keys[2]]).await);
    assert_eq!(mget, "*3\r\n_\r\n_\r\n_\r\n");

    // Every primary's write reaches the client, each once.
    let mut writer = Raw::connect(proxy.addr).await;
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "v"]).await, b"+OK\r\n");
        assert_eq!(text(&c.read_frame().await), text(&invalidation(key)));
    }
    // A key outside the prefix is not announced.
    assert_eq!(writer.call(&["SET", "other", "v"]).await, b"+OK\r\n");
    assert_eq!(text(&c.call(&["PING"]).await), "+PONG\r\n");

    let info = text(&c.call(&["CLIENT", "TRACKINGINFO"]).await);
    assert!(info.contains("bcast") && info.contains("user"), "{info}");
    assert_eq!(text(&c.call(&["CLIENT", "GETREDIR"]).await), ":0\r\n");
    // CACHING is for OPTIN/OPTOUT: Redis's own refusal.
    let caching = text(&c.call(&["CLIENT", "CACHING", "yes"]).await);
    assert!(caching.starts_with("-ERR"), "{caching}");
    // More prefixes reach every primary.
    assert_eq!(
        text(
            &c.call(&["CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "item"])
                .await
        ),
        "+OK\r\n"
    );
    let items: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "item")).collect();
    for key in &items {
        assert_eq!(writer.call(&["SET", key, "v"]).await, b"+OK\r\n");
        assert_eq!(text(&c.read_frame().await), text(&invalidation(key)));
    }
    let redirect = text(
        &c.call(&["CLIENT", "TRACKING", "ON", "BCAST", "REDIRECT", "1"])
            .await,
    );
    assert!(redirect.contains("REDIRECT is refused"), "{redirect}");
    assert_eq!(text(&c.call(&["MULTI"]).await), "+OK\r\n");
    let queued = text(&c.call(&["CLIENT", "TRACKINGINFO"]).await);
    assert!(queued.contains("cannot be queued in MULTI"), "{queued}");
    assert!(text(&c.call(&["EXEC"]).await).starts_with("-EXECABORT"));

    assert_eq!(
        text(&c.call(&["CLIENT", "TRACKING", "OFF"]).await),
        "+OK\r\n"
    );
    wait_tracking_clients(&primaries, "0", "after OFF").await;
    assert_eq!(text(&c.call(&["CLIENT", "GETREDIR"]).await), ":-1\r\n");
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "w"]).await, b"+OK\r\n");
    }
    c.assert_quiet(QUIET).await;
}

/// Over one Redis connection a read's reply precedes the invalidation of a later write of
/// its key; over two it need not. A 32 MB value read and then overwritten by the same client
/// (one pipeline): the invalidation, which reaches the proxy long before the value, comes
/// after the value's reply. Delivered first, the client would cache the old value for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_waits_for_a_large_reply_that_ran_before_its_write() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let key = redis.key_on(&redis.primaries()[1], "big");
    let value = "x".repeat(32 << 20);
    let mut writer = Raw::connect(proxy.addr).await;
    assert_eq!(writer.call(&["SET", &key, &value]).await, b"+OK\r\n");
    let mut c = bcast_client(&proxy, &[]).await;
    let mut pipeline = resp(&["GET", &key]);
    pipeline.extend(resp(&["SET", &key, "small"]));
    c.send(&pipeline).await;
    let frames = c.read_frames(3).await;
    assert!(
        frames[0].starts_with(format!("${}\r\n", value.len()).as_bytes()),
        "the value's reply first, got {}",
        text(&frames[0][..frames[0].len().min(80)])
    );
    let rest = [text(&frames[1]), text(&frames[2])];
    assert!(
        rest.contains(&"+OK\r\n".to_string()) && rest.contains(&text(&invalidation(&key))),
        "{rest:?}"
    );
}

/// A tracking connection killed on its node: the client cannot hear that node's writes any
/// more, so it is disconnected, as its own Redis connection would have been.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_tracking_connection_disconnects_the_client() {
    let redis = RedisCluster::start(3, 0);
    let node = redis.primaries()[2].clone();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut c = bcast_client(&proxy, &[]).await;
    let mut admin = Raw::connect(&node).await;
    let list = String::from_utf8_lossy(&admin.call(&["CLIENT", "LIST"]).await).into_owned();
    let id = list
        .lines()
        .find(|l| l.contains(" flags=t") || l.contains("flags=t "))
        .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .unwrap_or_else(|| panic!("no tracking connection on {node}: {list}"))
        .to_string();
    assert_eq!(admin.call(&["CLIENT", "KILL", "ID", &id]).await, b":1\r\n");
    let (_, closed) = c.read_to_close(common::DEADLINE).await;
    assert!(closed, "the client is disconnected");
}

/// A RESP3 client of `proxy` with default-mode tracking on (`extra` options after ON).
async fn keys_client(proxy: &Proxy, extra: &[&str]) -> Raw {
    let mut c = Raw::connect(proxy.addr).await;
    let hello = c.call(&["HELLO", "3"]).await;
    assert!(hello.starts_with(b"%"), "{}", text(&hello));
    let mut args = vec!["CLIENT", "TRACKING", "ON"];
    args.extend_from_slice(extra);
    assert_eq!(text(&c.call(&args).await), "+OK\r\n");
    c
}

/// Another client (`writer`) writes each of `keys`: `c` gets the invalidation of each, in
/// order.
async fn writes_invalidate(writer: &mut Raw, c: &mut Raw, keys: &[String]) {
    for key in keys {
        assert_eq!(writer.call(&["SET", key, "v1"]).await, b"+OK\r\n");
        assert_eq!(
            text(&c.read_frame().await),
            text(&invalidation(key)),
            "{key}"
        );
    }
}

/// Default-mode tracking (invalidations for the keys the client read) is spread over every
/// primary: the session's commands for a node go over its tracking connection there, so a
/// key the client read on any node (alone, in a MGET across nodes, in a script, inside
/// MULTI) is invalidated when another client writes it, and a key it did not read is not;
/// its own writes are invalidated too, after their reply. The session is not pinned. Its
/// own AUTH is refused while on (a connection of its own would read untracked). OFF turns
/// tracking off on every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_mode_tracking_hears_what_the_client_read_on_every_primary() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let keys: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "user")).collect();
    let unread: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "other")).collect();
    let mut writer = Raw::connect(proxy.addr).await;
    for key in keys.iter().chain(&unread) {
        assert_eq!(writer.call(&["SET", key, "v0"]).await, b"+OK\r\n");
    }
    let mut c = keys_client(&proxy, &[]).await;
    for p in &primaries {
        assert_eq!(tracking_clients(p).await, "1", "tracking on {p}");
    }
    // Reads of every node: one alone, two in a MGET split by node, one in a script.
    assert_eq!(text(&c.call(&["GET", &keys[0]]).await), "$2\r\nv0\r\n");
    let mget = text(&c.call(&["MGET", &keys[1], &keys[0]]).await);
    assert_eq!(mget, "*2\r\n$2\r\nv0\r\n$2\r\nv0\r\n");
    let script = "return redis.call('GET', KEYS[1])";
    let eval = text(&c.call(&["EVAL", script, "1", &keys[2]]).await);
    assert_eq!(eval, "$2\r\nv0\r\n");
    // Another client's writes: the keys read are invalidated, each once; the others not
    // (written first, so one of theirs would come before the expected frame).
    for key in &unread {
        assert_eq!(writer.call(&["SET", key, "v1"]).await, b"+OK\r\n");
    }
    writes_invalidate(&mut writer, &mut c, &keys).await;
    // A read inside a transaction is tracked too.
    assert_eq!(text(&c.call(&["MULTI"]).await), "+OK\r\n");
    assert_eq!(text(&c.call(&["GET", &keys[1]]).await), "+QUEUED\r\n");
    assert_eq!(text(&c.call(&["EXEC"]).await), "*1\r\n$2\r\nv1\r\n");
    assert_eq!(writer.call(&["SET", &keys[1], "v2"]).await, b"+OK\r\n");
    assert_eq!(text(&c.read_frame().await), text(&invalidation(&keys[1])));
    // Its own write of a key it read: the reply, then the invalidation.
    assert_eq!(text(&c.call(&["GET", &keys[2]]).await), "$2\r\nv1\r\n");
    c.send(&resp(&["SET", &keys[2], "mine"])).await;
    let frames = c.read_frames(2).await;
    assert_eq!(text(&frames[0]), "+OK\r\n");
    assert_eq!(text(&frames[1]), text(&invalidation(&keys[2])));
    c.assert_quiet(QUIET).await;
    for auth in [
        &["AUTH", "someone", "pw"][..],
        &["HELLO", "3", "AUTH", "someone", "pw"],
    ] {
        let reply = text(&c.call(auth).await);
        assert!(reply.contains("CLIENT TRACKING is on"), "{auth:?}: {reply}");
    }

    assert_eq!(
        text(&c.call(&["CLIENT", "TRACKING", "OFF"]).await),
        "+OK\r\n"
    );
    wait_tracking_clients(&primaries, "0", "after OFF").await;
    for key in &keys {
        assert_eq!(text(&c.call(&["GET", key]).await).get(..1), Some("$"));
        assert_eq!(writer.call(&["SET", key, "v3"]).await, b"+OK\r\n");
    }
    c.assert_quiet(QUIET).await;
}

/// NOLOOP in the default mode: the client's own writes go over its tracking connections
/// too, so they invalidate nothing for it, while another client's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_mode_noloop_hears_only_the_other_clients_writes() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let keys: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "user")).collect();
    let mut c = keys_client(&proxy, &["NOLOOP"]).await;
    let mut writer = Raw::connect(proxy.addr).await;
    for key in &keys {
        assert_eq!(text(&c.call(&["GET", key]).await), "_\r\n");
        assert_eq!(text(&c.call(&["SET", key, "mine"]).await), "+OK\r\n");
    }
    c.assert_quiet(QUIET).await;
    for key in &keys {
        assert_eq!(text(&c.call(&["GET", key]).await), "$4\r\nmine\r\n");
        assert_eq!(writer.call(&["SET", key, "theirs"]).await, b"+OK\r\n");
        assert_eq!(
            text(&c.read_frame().await),
            text(&invalidation(key)),
            "{key}"
        );
    }
}

/// A namespaced tenant's BCAST tracking is confined to its namespace on every primary (the
/// policy adds its PREFIX): it hears its own keys of every node, without the prefix, and
/// nothing of another tenant's writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_tenant_hears_only_its_keys_from_every_primary() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(common::cluster::namespaced_config(&redis.live_addrs()[0])).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert!(
        c.call(&["HELLO", "3", "AUTH", "alice", "alicepw"])
            .await
            .starts_with(b"%")
    );
    assert_eq!(
        text(&c.call(&["CLIENT", "TRACKING", "ON", "BCAST"]).await),
        "+OK\r\n"
    );
    // Keys of the tenant on every primary (their slot is that of the prefixed name).
    let keys: Vec<String> = primaries
        .iter()
        .map(|p| redis.key_on(p, "a:k").trim_start_matches("a:").to_string())
        .collect();
    for (key, node) in keys.iter().zip(&primaries) {
        // Another tenant's (here: a direct) write outside the namespace first: not heard.
        let mut direct = Raw::connect(node).await;
        let foreign = redis.key_on(node, "b:k");
        assert_eq!(direct.call(&["SET", &foreign, "v"]).await, b"+OK\r\n");
        assert_eq!(c.call(&["SET", key, "v"]).await, b"+OK\r\n");
        assert_eq!(text(&c.read_frame().await), text(&invalidation(key)));
    }
    c.assert_quiet(QUIET).await;
}

/// ON and OFF as Redis reads them (C's strcasecmp stops at a NUL): `on\0` spreads tracking
/// over every primary like ON, and `off\0`, or OFF with options Redis accepts and ignores,
/// turns it off on every one, so the proxy's view and the nodes' never differ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_and_off_are_read_as_redis_reads_them() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    for off in [&["off\0"][..], &["OFF", "BCAST"]] {
        let mut c = Raw::connect(proxy.addr).await;
        c.call(&["HELLO", "3"]).await;
        let on = c
            .call(&[&b"CLIENT"[..], b"TRACKING", b"on\0", b"BCAST"])
            .await;
        assert_eq!(text(&on), "+OK\r\n");
        for p in &primaries {
            assert_eq!(tracking_clients(p).await, "1", "tracking on {p}");
        }
        let mut args = vec!["CLIENT", "TRACKING"];
        args.extend_from_slice(off);
        assert_eq!(text(&c.call(&args).await), "+OK\r\n", "{off:?}");
        wait_tracking_clients(&primaries, "0", &format!("after {off:?}")).await;
        // Off in the proxy's view too: OPTIN tracking starts afresh on every primary (in a
        // view still "on" it would go to the closed tracking connections, and fail).
        assert_eq!(
            text(&c.call(&["CLIENT", "TRACKING", "ON", "OPTIN"]).await),
            "+OK\r\n"
        );
        for p in &primaries {
            assert_eq!(tracking_clients(p).await, "1", "{off:?}: tracking on {p}");
        }
        // The client leaves: nothing tracks any more before the next round.
        drop(c);
        wait_tracking_clients(&primaries, "0", "after the client left").await;
    }
}

/// A RESP2 subscriber's redirected invalidation of `key` (`message __redis__:invalidate`).
fn redirected(key: &str) -> String {
    format!(
        "*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n*1\r\n${}\r\n{key}\r\n",
        key.len()
    )
}

/// A client of `proxy` subscribed to `__redis__:invalidate` (after `HELLO 3` when `resp3`),
/// and its id.
async fn invalidation_sink(proxy: &Proxy, resp3: bool) -> (Raw, String) {
    let mut sink = Raw::connect(proxy.addr).await;
    if resp3 {
        assert!(sink.call(&["HELLO", "3"]).await.starts_with(b"%"));
    }
    let id = text(&sink.call(&["CLIENT", "ID"]).await);
    let id = id.trim_start_matches(':').trim_end().to_string();
    let subscribed = text(&sink.call(&["SUBSCRIBE", "__redis__:invalidate"]).await);
    assert!(subscribed.contains("subscribe"), "{subscribed}");
    (sink, id)
}

/// `CLIENT TRACKING on REDIRECT <id>` to a subscriber of `__redis__:invalidate` is spread
/// over every primary (Redis redirects to a connection of its own node only): the
/// subscriber listens on every primary, each node's tracking connection names the
/// subscriber's connection there, and the tracker, a RESP2 client, is not pinned: it reads
/// keys of every node, and every node's write of a key it read reaches the subscriber. Then:
/// GETREDIR and TRACKINGINFO name the subscriber by the proxy's id; HELLO 3 keeps what was
/// tracked (the connections follow it) and the replies come in RESP3; BCAST NOLOOP leaves
/// out the tracker's own writes; a new REDIRECT while on moves the invalidations to a RESP3
/// subscriber (pushes); OPTIN with `CLIENT CACHING yes` tracks the next read only, on
/// whichever node it goes to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirected_tracking_hears_every_primary() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let keys: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "user")).collect();
    let (mut sink, sink_id) = invalidation_sink(&proxy, false).await;
    let mut writer = Raw::connect(proxy.addr).await;
    let mut tracker = Raw::connect(proxy.addr).await;
    let on = ["CLIENT", "TRACKING", "on", "REDIRECT", &sink_id];
    assert_eq!(text(&tracker.call(&on).await), "+OK\r\n");
    for p in &primaries {
        assert_eq!(tracking_clients(p).await, "1", "tracking on {p}");
    }
    // Not pinned: every node's keys are read (before: CROSSSLOT off the subscriber's node).
    for key in &keys {
        assert_eq!(text(&tracker.call(&["GET", key]).await), "$-1\r\n", "{key}");
    }
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "v1"]).await, b"+OK\r\n");
        assert_eq!(text(&sink.read_frame().await), redirected(key), "{key}");
    }
    assert_eq!(
        text(&tracker.call(&["CLIENT", "GETREDIR"]).await),
        format!(":{sink_id}\r\n")
    );
    let info = text(&tracker.call(&["CLIENT", "TRACKINGINFO"]).await);
    assert!(
        info.contains(&format!("redirect\r\n:{sink_id}\r\n")),
        "{info}"
    );

    // HELLO 3: what was read in RESP2 stays tracked, replies follow the client's protocol.
    for key in &keys {
        assert_eq!(text(&tracker.call(&["GET", key]).await), "$2\r\nv1\r\n");
    }
    assert!(tracker.call(&["HELLO", "3"]).await.starts_with(b"%"));
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "v2"]).await, b"+OK\r\n");
        assert_eq!(text(&sink.read_frame().await), redirected(key), "{key}");
    }
    let hash = redis.key_on(&primaries[2], "hash");
    assert_eq!(writer.call(&["HSET", &hash, "f", "v"]).await, b":1\r\n");
    let map = text(&tracker.call(&["HGETALL", &hash]).await);
    assert_eq!(map, "%1\r\n$1\r\nf\r\n$1\r\nv\r\n", "a RESP3 reply");

    // BCAST NOLOOP: the tracker's own writes are left out on every node.
    assert_eq!(
        text(&tracker.call(&["CLIENT", "TRACKING", "off"]).await),
        "+OK\r\n"
    );
    let bcast = [
        "CLIENT", "TRACKING", "on", "BCAST", "NOLOOP", "REDIRECT", &sink_id,
    ];
    assert_eq!(text(&tracker.call(&bcast).await), "+OK\r\n");
    for key in &keys {
        assert_eq!(text(&tracker.call(&["SET", key, "mine"]).await), "+OK\r\n");
    }
    sink.assert_quiet(QUIET).await;
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "theirs"]).await, b"+OK\r\n");
        assert_eq!(text(&sink.read_frame().await), redirected(key), "{key}");
    }

    // A new REDIRECT while on, to a RESP3 subscriber: its invalidations are pushes.
    let (mut sink3, sink3_id) = invalidation_sink(&proxy, true).await;
    let again = ["CLIENT", "TRACKING", "on", "BCAST", "REDIRECT", &sink3_id];
    assert_eq!(text(&tracker.call(&again).await), "+OK\r\n");
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "again"]).await, b"+OK\r\n");
        assert_eq!(text(&sink3.read_frame().await), text(&invalidation(key)));
    }
    sink.assert_quiet(QUIET).await;

    // OPTIN: only the read right after CLIENT CACHING yes is tracked, whichever its node.
    assert_eq!(
        text(&tracker.call(&["CLIENT", "TRACKING", "off"]).await),
        "+OK\r\n"
    );
    let optin = ["CLIENT", "TRACKING", "on", "OPTIN", "REDIRECT", &sink_id];
    assert_eq!(text(&tracker.call(&optin).await), "+OK\r\n");
    assert_eq!(
        text(&tracker.call(&["GET", &keys[0]]).await).get(..1),
        Some("$")
    );
    for key in &keys[1..] {
        assert_eq!(
            text(&tracker.call(&["CLIENT", "CACHING", "yes"]).await),
            "+OK\r\n"
        );
        assert_eq!(text(&tracker.call(&["GET", key]).await).get(..1), Some("$"));
    }
    // A later read, after the flag was spent, is not tracked either.
    assert_eq!(
        text(&tracker.call(&["GET", &keys[0]]).await).get(..1),
        Some("$")
    );
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "optin"]).await, b"+OK\r\n");
    }
    for key in &keys[1..] {
        assert_eq!(text(&sink.read_frame().await), redirected(key), "{key}");
    }
    sink.assert_quiet(QUIET).await;
}

/// OPTOUT over every primary: `CLIENT CACHING no` leaves out the next read only, on its
/// node; the flag is cleared on the other nodes, so a later read there is tracked. Followed
/// by a command for several nodes it is refused, as the flag would stay where the command
/// does not go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optout_caching_no_applies_to_the_next_command_only() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let keys: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "user")).collect();
    let mut c = keys_client(&proxy, &["OPTOUT"]).await;
    let mut writer = Raw::connect(proxy.addr).await;
    assert_eq!(text(&c.call(&["CLIENT", "CACHING", "no"]).await), "+OK\r\n");
    assert_eq!(text(&c.call(&["GET", &keys[0]]).await), "_\r\n");
    // The flag was on every node's connection; these reads are tracked.
    for key in &keys[1..] {
        assert_eq!(text(&c.call(&["GET", key]).await), "_\r\n");
    }
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "v"]).await, b"+OK\r\n");
    }
    for key in &keys[1..] {
        assert_eq!(
            text(&c.read_frame().await),
            text(&invalidation(key)),
            "{key}"
        );
    }
    c.assert_quiet(QUIET).await;
    assert_eq!(text(&c.call(&["CLIENT", "CACHING", "no"]).await), "+OK\r\n");
    let mget = text(&c.call(&["MGET", &keys[0], &keys[1]]).await);
    assert!(mget.contains("CLIENT CACHING no"), "{mget}");
}

/// A REDIRECT to a RESP3 client that is not subscribed (it takes invalidations as pushes on
/// any connection of its own) and has no connection yet: it is asked to open one on every
/// primary (its listeners), and every node's invalidations of what the tracker read reach
/// it as pushes. The tracker is not pinned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp3_redirect_target_listens_on_every_primary() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let keys: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "user")).collect();
    let mut target = Raw::connect(proxy.addr).await;
    assert!(target.call(&["HELLO", "3"]).await.starts_with(b"%"));
    let id = text(&target.call(&["CLIENT", "ID"]).await);
    let id = id.trim_start_matches(':').trim_end().to_string();
    let mut tracker = Raw::connect(proxy.addr).await;
    let on = ["CLIENT", "TRACKING", "on", "REDIRECT", &id];
    assert_eq!(text(&tracker.call(&on).await), "+OK\r\n");
    for key in &keys {
        assert_eq!(text(&tracker.call(&["GET", key]).await), "$-1\r\n", "{key}");
    }
    let mut writer = Raw::connect(proxy.addr).await;
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "v"]).await, b"+OK\r\n");
        assert_eq!(text(&target.read_frame().await), text(&invalidation(key)));
    }
    // The target's own commands are unaffected.
    assert_eq!(text(&target.call(&["GET", &keys[0]]).await), "$1\r\nv\r\n");
    assert_eq!(
        text(&tracker.call(&["CLIENT", "GETREDIR"]).await),
        format!(":{id}\r\n")
    );
}

/// Tracking commands without their argument while tracking is on (state fuzzer: the session
/// read past the arguments and its task panicked, closing the client): Redis's arity error,
/// and the client goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_commands_without_arguments_get_redis_s_error() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut c = bcast_client(&proxy, &[]).await;
    for bare in [&["CLIENT", "TRACKING"][..], &["CLIENT", "CACHING"]] {
        let reply = text(&c.call(bare).await);
        assert!(reply.starts_with("-ERR"), "{bare:?}: {reply}");
        assert_eq!(text(&c.call(&["PING"]).await), "+PONG\r\n", "{bare:?}");
    }
}

/// With replica reads configured (`read_from: replica`), default-mode tracking is spread
/// over every primary all the same: the session reads from the primaries, over its tracking
/// connections (a replica's shared connection would read untracked), so another client's
/// write of a key it read on any node is invalidated. Before, it was pinned to one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_mode_tracking_with_replica_reads_hears_every_primary() {
    let redis = RedisCluster::start(3, 1);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(
        &redis.live_addrs()[0],
        &["read_from: replica"],
    ))
    .await;
    let keys: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "user")).collect();
    let mut writer = Raw::connect(proxy.addr).await;
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "v0"]).await, b"+OK\r\n");
    }
    let mut c = keys_client(&proxy, &[]).await;
    for key in &keys {
        // Its own write first: a read right after it sees it (it is read on the primary).
        assert_eq!(c.call(&["SET", key, "mine"]).await, b"+OK\r\n");
        assert_eq!(
            text(&c.call(&["GET", key]).await),
            "$4\r\nmine\r\n",
            "{key}"
        );
    }
    c.assert_quiet(QUIET).await;
    writes_invalidate(&mut writer, &mut c, &keys).await;
    c.assert_quiet(QUIET).await;
}

/// A tracking client quiet for a few idle ticks still hears every primary's invalidations,
/// and its next command is answered: the idle release gave back the session's reply channel
/// while its tracking connections (per primary, not the session's dedicated one) still held
/// a sender of it, so the next invalidation ended the connection ("session gone") and the
/// next command on it got a lost-connection error (invariant fuzzer, cluster, seed
/// 913059125, step 17,043). Nothing signals "released": it is a whole tick without traffic,
/// so the test waits that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_tracking_client_still_hears_invalidations() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(proxy_config(&redis.live_addrs()[0], &[])).await;
    let keys: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "quiet")).collect();
    let mut writer = Raw::connect(proxy.addr).await;
    let mut bcast = bcast_client(&proxy, &["PREFIX", "quiet"]).await;
    let mut reader = keys_client(&proxy, &[]).await;
    for key in &keys {
        assert_eq!(text(&reader.call(&["GET", key]).await), "_\r\n");
    }
    tokio::time::sleep(redis_policy_proxy::IDLE_TICK * 3).await;
    for key in &keys {
        assert_eq!(writer.call(&["SET", key, "v"]).await, b"+OK\r\n");
        assert_eq!(text(&bcast.read_frame().await), text(&invalidation(key)));
        assert_eq!(text(&reader.read_frame().await), text(&invalidation(key)));
    }
    for c in [&mut bcast, &mut reader] {
        for key in &keys {
            assert_eq!(text(&c.call(&["GET", key]).await), "$1\r\nv\r\n");
        }
    }
}
