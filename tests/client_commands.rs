//! CLIENT KILL, CLIENT LIST and CLIENT TRACKING REDIRECT about the proxy's own clients, as a
//! client library's suite uses them (issue 33): the ids and addresses a client reads from
//! CLIENT LIST through the proxy are the ones it can kill and redirect to, and a subscriber's
//! row shows what Redis's would. Through the proxy and a real redis-server, RESP3 clients.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::{DEADLINE, POLL, Proxy, Raw, RedisServer, resp, show};

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

/// A RESP3 client of the proxy (it said `HELLO 3`, as today's libraries do).
async fn resp3(proxy: &Proxy) -> Raw {
    let mut c = Raw::connect(proxy.addr).await;
    let hello = c.call(&["HELLO", "3"]).await;
    assert!(hello.starts_with(b"%"), "{}", show(&hello));
    c
}

/// A field of a CLIENT LIST line (`id`, `addr`…).
fn field(line: &str, name: &str) -> String {
    let key = format!("{name}=");
    line.split(' ')
        .find_map(|f| f.strip_prefix(key.as_str()))
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        .trim_end()
        .to_string()
}

/// The client's own CLIENT LIST line, as it reads it through the proxy (RESP3: a verbatim
/// string, `=N\r\ntxt:` before the text).
async fn own_row(c: &mut Raw) -> String {
    let id = text(&c.call(&["CLIENT", "ID"]).await);
    let id = id.trim_start_matches(':').trim_end().to_string();
    row(c, &id).await
}

/// Client `id`'s CLIENT LIST line, asked by `c`.
async fn row(c: &mut Raw, id: &str) -> String {
    let list = text(&c.call(&["CLIENT", "LIST", "ID", id]).await);
    list.lines()
        .map(|l| l.split_once("txt:").map_or(l, |(_, rest)| rest))
        .find(|l| l.starts_with("id="))
        .unwrap_or_else(|| panic!("no row for {id}: {list}"))
        .to_string()
}

/// Whether the proxy closed `c` (it reads EOF within the deadline).
async fn closed(c: &mut Raw) -> bool {
    c.read_to_close(DEADLINE).await.1
}

/// Every form of CLIENT KILL names the proxy's clients by the id and addresses CLIENT LIST
/// shows, and closes them: the old form (`+OK`), ADDR, LADDR with TYPE, ID (`:1`); a client
/// blocked in BLPOP is unblocked upstream; SKIPME keeps the caller unless `SKIPME no`; USER
/// and MAXAGE narrow as in Redis. Nothing reaches Redis's own CLIENT KILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_by_address_and_id_closes_the_proxys_client() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut killer = resp3(&proxy).await;
    let mine = own_row(&mut killer).await;

    let mut old = resp3(&proxy).await;
    let addr = field(&own_row(&mut old).await, "addr");
    assert_eq!(
        text(&killer.call(&["CLIENT", "KILL", &addr]).await),
        "+OK\r\n"
    );
    assert!(closed(&mut old).await, "old form: not closed");
    assert_eq!(
        text(&killer.call(&["CLIENT", "KILL", &addr]).await),
        "-ERR No such client\r\n"
    );

    let mut by_addr = resp3(&proxy).await;
    let addr = field(&own_row(&mut by_addr).await, "addr");
    assert_eq!(
        text(&killer.call(&["CLIENT", "KILL", "addr", &addr]).await),
        ":1\r\n"
    );
    assert!(closed(&mut by_addr).await, "ADDR: not closed");

    // A blocked client: killing it unblocks its command upstream, as Redis frees it.
    let mut blocked = resp3(&proxy).await;
    let id = field(&own_row(&mut blocked).await, "id");
    blocked.send(&resp(&["BLPOP", "nothing", "0"])).await;
    redis.wait_blocked_clients(1).await;
    assert_eq!(
        text(&killer.call(&["CLIENT", "KILL", "ID", &id]).await),
        ":1\r\n"
    );
    assert!(closed(&mut blocked).await, "ID: not closed");
    let until = std::time::Instant::now() + DEADLINE;
    while !text(&redis.direct(&["INFO", "clients"]).await).contains("blocked_clients:0") {
        assert!(std::time::Instant::now() < until, "BLPOP still blocked");
        tokio::time::sleep(POLL).await;
    }

    // LADDR names every client of the listener; TYPE pubsub keeps only the subscriber, and
    // SKIPME (yes by default) the caller.
    let mut subscriber = resp3(&proxy).await;
    let confirmed = subscriber.call(&["SUBSCRIBE", "news"]).await;
    assert!(
        text(&confirmed).contains("subscribe"),
        "{}",
        show(&confirmed)
    );
    let mut bystander = resp3(&proxy).await;
    let laddr = field(&mine, "laddr");
    assert_eq!(
        text(
            &killer
                .call(&["CLIENT", "KILL", "LADDR", &laddr, "TYPE", "pubsub"])
                .await
        ),
        ":1\r\n"
    );
    assert!(closed(&mut subscriber).await, "TYPE pubsub: not closed");
    assert_eq!(bystander.call(&["PING"]).await, b"+PONG\r\n");

    // USER and MAXAGE narrow: nobody has been connected for a day.
    assert_eq!(
        text(
            &killer
                .call(&["CLIENT", "KILL", "USER", "default", "MAXAGE", "86400"])
                .await
        ),
        ":0\r\n"
    );
    assert_eq!(bystander.call(&["PING"]).await, b"+PONG\r\n");
    // Options are keywords as Redis reads them; a bad one is Redis's error, an unknown user
    // (without proxy users, the upstream's) and a missing argument too.
    assert_eq!(
        text(&killer.call(&["CLIENT", "KILL", "USER", "wrong_user"]).await),
        "-ERR No such user 'wrong_user'\r\n"
    );
    assert_eq!(
        text(&killer.call(&["CLIENT", "KILL"]).await),
        "-ERR wrong number of arguments for 'client|kill' command\r\n"
    );
    assert_eq!(
        text(
            &killer
                .call(&["CLIENT", "KILL", "TYPE", "ID", "SKIPME", "no"])
                .await
        ),
        "-ERR Unknown client type 'ID'\r\n"
    );

    // The caller itself: skipped by default, killed (after its reply) with SKIPME no.
    let own = field(&mine, "id");
    assert_eq!(
        text(&killer.call(&["CLIENT", "KILL", "ID", &own]).await),
        ":0\r\n"
    );
    let reply = killer
        .call(&[
            &b"CLIENT"[..],
            b"KILL",
            b"ID",
            own.as_bytes(),
            b"SKIPME\0",
            b"no",
        ])
        .await;
    assert_eq!(text(&reply), ":1\r\n");
    assert!(
        closed(&mut killer).await,
        "SKIPME no: the caller stays open"
    );
    assert_eq!(redis.command_calls("client|kill").await, 0);
}

const ADMIN_SHA256: &str = "5fcf82bc15aef42cd3ec93e6d4b51c04df110cf77ee715f62f3f172ff8ed9de9"; // adminpw
const APP_SHA256: &str = "71d3d4e36cf4bc4309fd7390ba79fc6a1d03d8d7b45ef26f04bcdff3ff116868"; // apppw

/// A client kills only within its tenant: another tenant's client is not there for it, by id,
/// by address or by a filter that names every client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_stays_within_the_tenant() {
    let redis = RedisServer::start();
    let yaml = format!(
        "upstream:\n  address: {}\naccess:\n  users:\n    - {{name: admin, password_sha256: {ADMIN_SHA256}}}\n    - {{name: app, password_sha256: {APP_SHA256}}}\n  identities:\n    - {{tenant: ops, user: admin}}\n    - {{tenant: app, user: app}}\n",
        redis.addr()
    );
    let config =
        redis_policy_proxy::setup::from_yaml(&yaml, std::path::Path::new("tenants.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut ops = resp3(&proxy).await;
    assert_eq!(ops.call(&["AUTH", "admin", "adminpw"]).await, b"+OK\r\n");
    let ops_row = own_row(&mut ops).await;
    let mut app = resp3(&proxy).await;
    assert_eq!(app.call(&["AUTH", "app", "apppw"]).await, b"+OK\r\n");
    let mut app_peer = resp3(&proxy).await;
    assert_eq!(app_peer.call(&["AUTH", "app", "apppw"]).await, b"+OK\r\n");
    for kill in [
        vec!["CLIENT", "KILL", "ID", &field(&ops_row, "id")],
        vec!["CLIENT", "KILL", "USER", "admin"],
    ] {
        assert_eq!(text(&app.call(&kill).await), ":0\r\n", "{kill:?}");
    }
    assert_eq!(
        text(
            &app.call(&["CLIENT", "KILL", &field(&ops_row, "addr")])
                .await
        ),
        "-ERR No such client\r\n"
    );
    assert_eq!(
        text(&app.call(&["CLIENT", "KILL", "USER", "nobody"]).await),
        "-ERR No such user 'nobody'\r\n"
    );
    // CLIENT LIST and INFO show the same clients: its own tenant's.
    let listed = text(&app.call(&["CLIENT", "LIST"]).await);
    assert_eq!(listed.matches("id=").count(), 2, "{listed}");
    assert!(
        !listed.contains(&format!("id={} ", field(&ops_row, "id"))),
        "{listed}"
    );
    assert_eq!(connected_clients(&mut app, &["INFO", "clients"]).await.0, 2);
    let everyone = text(&ops.call(&["CLIENT", "LIST"]).await);
    assert_eq!(everyone.matches("id=").count(), 1, "{everyone}");
    // Every client of the listener but itself: only its own tenant's peer.
    let laddr = field(&ops_row, "laddr");
    assert_eq!(
        text(&app.call(&["CLIENT", "KILL", "LADDR", &laddr]).await),
        ":1\r\n"
    );
    assert!(closed(&mut app_peer).await);
    assert_eq!(ops.call(&["PING"]).await, b"+PONG\r\n");
}

/// A subscriber's CLIENT LIST row shows its last command and its subscription counts as
/// Redis 7.0's does (`sub=`, `psub=`, `ssub=`), for a RESP2 subscriber and a RESP3 one, and
/// drops the `P` flag once nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_list_shows_a_subscribers_last_command_and_counts() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut observer = resp3(&proxy).await;

    let mut classic = Raw::connect(proxy.addr).await;
    let id = text(&classic.call(&["CLIENT", "ID"]).await);
    let id = id.trim_start_matches(':').trim_end().to_string();
    classic
        .request(&resp(&["SUBSCRIBE", "a", "b", "a"]), 3)
        .await;
    classic.request(&resp(&["PSUBSCRIBE", "p*"]), 1).await;
    let line = row(&mut observer, &id).await;
    for want in ["flags=P", "sub=2 psub=1 ssub=0", "cmd=psubscribe"] {
        assert!(line.contains(want), "{want} in {line}");
    }
    classic.request(&resp(&["UNSUBSCRIBE", "a"]), 1).await;
    let line = row(&mut observer, &id).await;
    assert!(
        line.contains("sub=1 psub=1 ") && line.contains("cmd=unsubscribe"),
        "{line}"
    );

    let mut modern = resp3(&proxy).await;
    let id = text(&modern.call(&["CLIENT", "ID"]).await);
    let id = id.trim_start_matches(':').trim_end().to_string();
    modern.call(&["SUBSCRIBE", "x"]).await;
    modern.call(&["SSUBSCRIBE", "s"]).await;
    assert_eq!(modern.call(&["PING"]).await, b"+PONG\r\n");
    let line = row(&mut observer, &id).await;
    for want in ["flags=P", "sub=1 psub=0 ssub=1", "cmd=ping"] {
        assert!(line.contains(want), "{want} in {line}");
    }
    modern.call(&["UNSUBSCRIBE", "x"]).await;
    modern.call(&["SUNSUBSCRIBE", "s"]).await;
    let line = row(&mut observer, &id).await;
    for want in ["flags=N", "sub=0 psub=0 ssub=0", "cmd=sunsubscribe"] {
        assert!(line.contains(want), "{want} in {line}");
    }
}

/// CLIENT TRACKING REDIRECT to a live RESP3 client of the proxy that never needed a dedicated
/// connection: accepted, as Redis accepts any live client id, and the target gets the
/// invalidation pushes; CLIENT GETREDIR names it by its proxy id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_redirect_to_a_client_without_its_own_connection() {
    let redis = RedisServer::start();
    let mut config = common::config_for(&redis.addr());
    config.upstream.dedicated_warm.value = 0;
    let proxy = Proxy::start(config).await;
    let mut target = resp3(&proxy).await;
    let id = text(&target.call(&["CLIENT", "ID"]).await);
    let id = id.trim_start_matches(':').trim_end().to_string();
    let mut tracker = resp3(&proxy).await;
    assert_eq!(
        text(
            &tracker
                .call(&["CLIENT", "TRACKING", "on", "REDIRECT", &id])
                .await
        ),
        "+OK\r\n"
    );
    assert_eq!(
        text(&tracker.call(&["CLIENT", "GETREDIR"]).await),
        format!(":{id}\r\n")
    );
    redis.direct(&["SET", "k", "v"]).await;
    assert_eq!(tracker.call(&["GET", "k"]).await, b"$1\r\nv\r\n");
    redis.direct(&["SET", "k", "w"]).await;
    assert_eq!(
        text(&target.read_frame().await),
        ">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n"
    );
    // The target's own commands are answered as before, in order.
    assert_eq!(target.call(&["ECHO", "still"]).await, b"$5\r\nstill\r\n");

    // The target leaves: Redis tells the tracker the redirect broke, and CLIENT
    // TRACKINGINFO still names the target, by the id the tracker gave (Redis names the
    // connection that is gone; the proxy maps it back though its client left).
    assert_eq!(tracker.call(&["GET", "k"]).await, b"$1\r\nw\r\n");
    assert_eq!(target.call(&["QUIT"]).await, b"+OK\r\n");
    assert!(closed(&mut target).await);
    redis.direct(&["SET", "k", "x"]).await;
    let broken = text(&tracker.read_frame().await);
    assert!(broken.contains("tracking-redir-broken"), "{broken}");
    let info = text(&tracker.call(&["CLIENT", "TRACKINGINFO"]).await);
    assert!(info.contains("broken_redirect\r\n"), "{info}");
    assert!(
        info.contains(&format!("$8\r\nredirect\r\n:{id}\r\n")),
        "redirect named {id}: {info}"
    );
}

/// The number a client asks `connected_clients` of the whole INFO, or of `INFO clients`.
async fn connected_clients(c: &mut Raw, args: &[&str]) -> (usize, String) {
    let info = text(&c.call(args).await);
    let count = info
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .unwrap_or_else(|| panic!("no connected_clients in {info}"))
        .trim()
        .parse()
        .unwrap();
    (count, info)
}

/// INFO's `connected_clients` counts the proxy's clients, the ones CLIENT LIST shows and
/// CLIENT KILL names (Redis's own count, of the proxy's upstream connections, is in the
/// proxy's section as `proxy_upstream_connected_clients`), so `CLIENT KILL SKIPME yes`
/// closes that many less one, as Redis's own `unit/introspection` expects. Before, INFO
/// counted Redis's connections: 11 against the 3 clients here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_counts_the_proxys_clients_as_client_kill_names_them() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut me = Raw::connect(proxy.addr).await;
    let mut others = vec![resp3(&proxy).await, resp3(&proxy).await];
    // The readiness probe's connections leave the list as their sessions end.
    let until = std::time::Instant::now() + DEADLINE;
    let info = loop {
        let (count, info) = connected_clients(&mut me, &["INFO"]).await;
        if count == 3 {
            break info;
        }
        assert!(std::time::Instant::now() < until, "{info}");
        tokio::time::sleep(POLL).await;
    };
    let upstream = info
        .lines()
        .find_map(|l| l.strip_prefix("proxy_upstream_connected_clients:"))
        .unwrap_or_else(|| panic!("no upstream count in {info}"));
    let direct = text(&redis.direct(&["INFO", "clients"]).await);
    assert!(
        upstream.trim().parse::<usize>().unwrap() >= 2,
        "Redis's count of the proxy's connections: {upstream}; directly {direct}"
    );
    assert_eq!(connected_clients(&mut me, &["INFO", "clients"]).await.0, 3);
    let (count, resp3_info) = connected_clients(&mut others[0], &["INFO", "CLIENTS"]).await;
    assert_eq!(count, 3, "{resp3_info}");
    assert!(
        !resp3_info.contains("# Proxy"),
        "INFO clients is Redis's section alone"
    );

    assert_eq!(
        text(&me.call(&["CLIENT", "KILL", "SKIPME", "yes"]).await),
        ":2\r\n"
    );
    for c in &mut others {
        assert!(closed(c).await, "not closed");
    }
    wait_count(&mut me, 1).await;
}

/// Polls INFO until `connected_clients` is `want`.
async fn wait_count(c: &mut Raw, want: usize) {
    let until = std::time::Instant::now() + DEADLINE;
    loop {
        let (count, info) = connected_clients(c, &["INFO", "clients"]).await;
        if count == want {
            return;
        }
        assert!(std::time::Instant::now() < until, "want {want}: {info}");
        tokio::time::sleep(POLL).await;
    }
}
