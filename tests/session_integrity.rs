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

/// A proxy with one shared upstream connection per RESP version and no warm dedicated ones,
/// so the shared connection's upstream id is the one `shared_resp3_id` finds.
async fn one_shared_connection(redis: &RedisServer) -> Proxy {
    let mut config = common::config_for(&redis.addr());
    config.upstream.connections.value = 1;
    config.upstream.dedicated_warm.value = 0;
    Proxy::start(config).await
}

/// A RESP3 push on a shared upstream connection (invalidations sent there by a `CLIENT
/// TRACKING … BCAST REDIRECT` set up directly on Redis) is dropped and counted, never taken
/// for the reply of the request at the head of the queue: every reply stays with its request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_on_a_shared_connection_is_never_a_reply() {
    let redis = RedisServer::start();
    let proxy = one_shared_connection(&redis).await;
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

const ADMIN_SHA256: &str = "5fcf82bc15aef42cd3ec93e6d4b51c04df110cf77ee715f62f3f172ff8ed9de9"; // adminpw
const APP_SHA256: &str = "71d3d4e36cf4bc4309fd7390ba79fc6a1d03d8d7b45ef26f04bcdff3ff116868"; // apppw

/// Two tenants, `ops` (user admin) and `app` (user app), told apart by their proxy users;
/// `extra` is appended to the YAML.
fn two_tenants(redis: &RedisServer, extra: &str) -> redis_policy_proxy::Config {
    let yaml = format!(
        "upstream:\n  address: {}\naccess:\n  users:\n    - {{name: admin, password_sha256: {ADMIN_SHA256}}}\n    - {{name: app, password_sha256: {APP_SHA256}}}\n  identities:\n    - {{tenant: ops, user: admin}}\n    - {{tenant: app, user: app}}\n{extra}",
        redis.addr()
    );
    redis_policy_proxy::setup::from_yaml(&yaml, std::path::Path::new("tenants.yaml")).unwrap()
}

/// A client logged in as `user`, subscribed (RESP2) to the invalidation channel, and its id.
async fn invalidation_subscriber(proxy: &Proxy, user: &str, password: &str) -> (Raw, String) {
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["AUTH", user, password]).await, b"+OK\r\n");
    let id = text(&c.call(&["CLIENT", "ID"]).await);
    let id = id.trim_start_matches(':').trim_end().to_string();
    let confirmed = c.call(&["SUBSCRIBE", "__redis__:invalidate"]).await;
    assert!(
        text(&confirmed).contains("subscribe"),
        "{}",
        show(&confirmed)
    );
    (c, id)
}

/// `REDIRECT\0` is REDIRECT to Redis: its id is a proxy client id like any other, so one of
/// the proxy's own shared connections cannot be named with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_redirect_spelled_with_a_nul_cannot_name_a_shared_connection() {
    let redis = RedisServer::start();
    let proxy = one_shared_connection(&redis).await;
    let shared = shared_resp3_id(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    c.call(&["HELLO", "3"]).await;
    let reply = c
        .call(&[
            &b"CLIENT"[..],
            b"TRACKING",
            b"on",
            b"BCAST\0",
            b"REDIRECT\0",
            shared.as_bytes(),
        ])
        .await;
    assert_eq!(
        text(&reply),
        "-ERR The client ID you want redirect to does not exist\r\n"
    );
    let list = text(&redis.direct(&["CLIENT", "LIST"]).await);
    assert!(!list.contains("flags=t"), "a connection tracks: {list}");
}

/// CLIENT KILL walks its options as Redis does and the last ID wins there: every ID is a
/// proxy client id (the proxy carries KILL out on its own clients), so a decoy first ID
/// cannot carry an upstream id in the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_maps_every_id_option() {
    let redis = RedisServer::start();
    let proxy = one_shared_connection(&redis).await;
    let shared = shared_resp3_id(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    let own = text(&c.call(&["CLIENT", "ID"]).await);
    let own = own.trim_start_matches(':').trim_end().to_string();
    let reply = c
        .call(&["CLIENT", "KILL", "ID", &own, "ID", &shared, "SKIPME", "no"])
        .await;
    assert_eq!(text(&reply), ":0\r\n");
    let list = text(&redis.direct(&["CLIENT", "LIST", "ID", &shared]).await);
    assert!(list.contains(&format!("id={shared} ")), "killed: {list}");
}

/// A client may redirect its invalidations only to a client of its own tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_redirect_stays_within_the_tenant() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(two_tenants(&redis, "")).await;
    let (_app, app_id) = invalidation_subscriber(&proxy, "app", "apppw").await;
    let (_ops, ops_id) = invalidation_subscriber(&proxy, "admin", "adminpw").await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["AUTH", "admin", "adminpw"]).await, b"+OK\r\n");
    assert_eq!(
        text(
            &c.call(&["CLIENT", "TRACKING", "on", "REDIRECT", &app_id])
                .await
        ),
        "-ERR The client ID you want redirect to does not exist\r\n"
    );
    assert_eq!(
        text(
            &c.call(&["CLIENT", "TRACKING", "on", "REDIRECT", &ops_id])
                .await
        ),
        "+OK\r\n"
    );
    assert_eq!(
        text(&c.call(&["CLIENT", "GETREDIR"]).await),
        format!(":{ops_id}\r\n")
    );
}

/// A namespaced tenant's tracking prefixes are confined by the namespace rule, which must
/// see every option Redis sees: `BCAST\0` (BCAST to Redis) is refused rather than
/// announcing every tenant's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_bcast_spelled_with_a_nul_stays_in_the_namespace() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(two_tenants(&redis, "  namespaces:\n    app: 'app:'\n")).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["AUTH", "app", "apppw"]).await, b"+OK\r\n");
    c.call(&["HELLO", "3"]).await;
    let reply = c
        .call(&[&b"CLIENT"[..], b"TRACKING", b"on", b"BCAST\0"])
        .await;
    assert_eq!(reply, b"+OK\r\n", "{}", show(&reply));
    // BCAST\0 is BCAST to Redis: the namespace's PREFIX must come with it, so a key outside
    // the namespace is never announced to this client.
    redis.direct(&["SET", "other", "v"]).await;
    redis.direct(&["SET", "app:mine", "v"]).await;
    let push = text(&c.read_frame().await);
    assert!(push.contains("mine") && !push.contains("other"), "{push}");
}

/// Through the binary: one user's failed logins from an address make that user wait, never
/// another user logging in correctly from the same address (clients behind one NAT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_throttling_is_per_address_and_user() {
    let redis = RedisServer::start();
    let dir = common::TempDir::new("auth-throttle");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "access:\n  users:\n    - {{name: admin, password_sha256: {ADMIN_SHA256}}}\n    - {{name: app, password_sha256: {APP_SHA256}}}\n  identities:\n    - {{tenant: ops, user: admin}}\n    - {{tenant: app, user: app}}\n"
        ),
    )
    .unwrap();
    let proxy =
        common::process::ProxyProcess::start(&policy, &redis, dir.path().join("proxy.log"), &[])
            .await;
    let mut attacker = Raw::connect(proxy.addr()).await;
    for _ in 0..8 {
        let r = text(&attacker.call(&["AUTH", "admin", "guess"]).await);
        assert!(
            r.starts_with("-WRONGPASS") || r.starts_with("-ERR too many"),
            "{r}"
        );
    }
    let r = text(&attacker.call(&["AUTH", "admin", "adminpw"]).await);
    assert!(r.starts_with("-ERR too many failed AUTH"), "{r}");
    let mut app = Raw::connect(proxy.addr()).await;
    assert_eq!(text(&app.call(&["AUTH", "app", "apppw"]).await), "+OK\r\n");
    assert_eq!(
        text(&app.call(&["HELLO", "3", "AUTH", "app", "apppw"]).await)[..1],
        *"%"
    );
}

/// One tenant's blocked BLPOP clients hold at most their tenant's share of the dedicated
/// connections: past it they get an error naming the limit, and the other tenant's BLPOP
/// still gets a connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_blocked_clients_cannot_take_every_dedicated_connection() {
    let redis = RedisServer::start();
    let mut config = two_tenants(&redis, "");
    config.upstream.dedicated_max.value = 4;
    config.upstream.dedicated_warm.value = 0;
    config.upstream.dedicated_wait_ms.value = 100;
    let proxy = Proxy::start(config).await;
    let mut app = Vec::new();
    for _ in 0..4 {
        let mut c = Raw::connect(proxy.addr).await;
        assert_eq!(c.call(&["AUTH", "app", "apppw"]).await, b"+OK\r\n");
        c.send(&resp(&["BLPOP", "appq", "0"])).await;
        app.push(c);
    }
    // Half of 4 (upstream.dedicated_caps.per_tenant_percent: 50) block; the others are told.
    redis.wait_blocked_clients(2).await;
    let mut refused = 0;
    for c in &mut app[2..] {
        let reply = text(&c.read_frame().await);
        assert!(
            reply.contains("tenant 'app' holds all 2 of its dedicated upstream connections")
                && reply.contains("upstream.dedicated_caps.per_tenant_percent"),
            "{reply}"
        );
        refused += 1;
    }
    assert_eq!(refused, 2);
    let mut ops = Raw::connect(proxy.addr).await;
    assert_eq!(ops.call(&["AUTH", "admin", "adminpw"]).await, b"+OK\r\n");
    ops.send(&resp(&["BLPOP", "opsq", "0"])).await;
    redis.wait_blocked_clients(3).await;
    redis.direct(&["LPUSH", "opsq", "v"]).await;
    assert_eq!(
        text(&ops.read_frame().await),
        "*2\r\n$4\r\nopsq\r\n$1\r\nv\r\n"
    );
    let (_, metrics) = common::http_get(proxy.admin, "/metrics").await;
    assert_eq!(
        common::sample(
            &metrics,
            "rpp_upstream_dedicated_refused_total{limit=\"tenant\"}"
        ),
        2.0
    );
}

/// Calls `args` on `c` until the reply contains `want` (a shared connection notices that
/// Redis closed it only when a command finds it gone), within the deadline; the last reply.
async fn call_until(c: &mut Raw, args: &[&str], want: &str) -> String {
    let until = std::time::Instant::now() + common::DEADLINE;
    loop {
        let reply = text(&c.call(args).await);
        if reply.contains(want) {
            return reply;
        }
        assert!(
            std::time::Instant::now() < until,
            "{args:?} never answered {want}: last {reply}"
        );
        tokio::time::sleep(common::POLL).await;
    }
}

/// Through the binary: after `CONFIG SET requirepass` sent through the proxy (which has no
/// upstream password), every new upstream connection is refused. A command that needs a new
/// dedicated connection and one queued for a shared connection that must reconnect (Redis
/// closed it, as its `timeout` does) get the same error, naming the proxy's credentials, and
/// the log says so once; a client's own AUTH still logs it in, and once the password is
/// cleared (through the proxy, as a test suite's teardown does) the proxy logs in again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_upstream_credentials_are_named_and_never_break_a_clients_auth() {
    let redis = RedisServer::start();
    let dir = common::TempDir::new("credentials");
    let policy = common::write_file(
        dir.path(),
        "proxy.yaml",
        "upstream:\n  dedicated_warm: 0\n  connections: 1\n  reconnect_max_ms: 50\n",
    );
    let proxy =
        common::process::ProxyProcess::start(&policy, &redis, dir.path().join("proxy.log"), &[])
            .await;
    let mut admin = Raw::connect(proxy.addr()).await;
    admin.call(&["HELLO", "3"]).await;
    let mut other = Raw::connect(proxy.addr()).await;
    other.call(&["HELLO", "3"]).await;
    assert_eq!(
        admin
            .call(&["CONFIG", "SET", "requirepass", "secret"])
            .await,
        b"+OK\r\n"
    );
    // A new dedicated connection.
    let blocked = text(&other.call(&["BLPOP", "q", "0"]).await);
    assert!(
        blocked.contains("refused the proxy's upstream credentials (NOAUTH"),
        "{blocked}"
    );
    // The shared connections, closed by Redis, cannot reconnect: the same error.
    let mut killer = redis.raw().await;
    assert_eq!(killer.call(&["AUTH", "secret"]).await, b"+OK\r\n");
    let killed = text(&killer.call(&["CLIENT", "KILL", "TYPE", "normal"]).await);
    assert!(killed.starts_with(':'), "{killed}");
    let refused = call_until(
        &mut other,
        &["GET", "k"],
        "refused the proxy's upstream credentials",
    )
    .await;
    assert!(!refused.contains("unavailable"), "{refused}");
    // The client's own AUTH logs it in regardless, on its own connection.
    assert_eq!(admin.call(&["AUTH", "default", "secret"]).await, b"+OK\r\n");
    assert_eq!(admin.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    // A wrong AUTH is Redis's answer to that client alone.
    let wrong = text(&other.call(&["AUTH", "default", "nope"]).await);
    assert!(wrong.starts_with("-WRONGPASS"), "{wrong}");
    // The teardown clears the password through the proxy: the proxy logs in again.
    assert_eq!(
        admin.call(&["CONFIG", "SET", "requirepass", ""]).await,
        b"+OK\r\n"
    );
    let mut fresh = Raw::connect(proxy.addr()).await;
    fresh.call(&["HELLO", "3"]).await;
    call_until(&mut fresh, &["GET", "k"], "$1\r\nv").await;
    let log = proxy.log_text();
    assert_eq!(
        log.matches("upstream refused the proxy's credentials")
            .count(),
        1,
        "{log}"
    );
    assert!(
        log.contains("upstream accepts the proxy's credentials again"),
        "{log}"
    );
}

/// Through the binary: when an operator changes the password the proxy logs in with, a
/// client that brings the new one is logged in by it (its AUTH no longer answered by the
/// proxy from the old credentials), while commands that need a new connection get the error
/// naming the proxy's credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_auth_works_after_the_proxys_password_changed() {
    let redis = RedisServer::start_with(&["--requirepass", "old"]);
    let dir = common::TempDir::new("credentials-changed");
    let policy = common::write_file(
        dir.path(),
        "proxy.yaml",
        "upstream:\n  password: old\n  dedicated_warm: 0\n",
    );
    let proxy =
        common::process::ProxyProcess::start(&policy, &redis, dir.path().join("proxy.log"), &[])
            .await;
    let mut operator = redis.raw().await;
    assert_eq!(
        operator
            .call(&["CONFIG", "SET", "requirepass", "new"])
            .await,
        b"+OK\r\n"
    );
    let mut c = Raw::connect(proxy.addr()).await;
    c.call(&["HELLO", "3"]).await;
    let refused = text(&c.call(&["BLPOP", "q", "0"]).await);
    assert!(
        refused.contains("refused the proxy's upstream credentials (WRONGPASS"),
        "{refused}"
    );
    // The old password is Redis's to refuse now, the new one logs the client in.
    let old = text(&c.call(&["AUTH", "default", "old"]).await);
    assert!(old.starts_with("-WRONGPASS"), "{old}");
    assert_eq!(c.call(&["AUTH", "default", "new"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["HGETALL", "none"]).await, b"%0\r\n");
    assert!(
        proxy
            .log_text()
            .contains("upstream refused the proxy's credentials"),
        "{}",
        proxy.log_text()
    );
}

/// SYNC, PSYNC and REPLCONF get an error from the proxy whatever the policy: forwarded on a
/// shared connection (Valkey 9.1's own suite does it in unit/hashexpire), the RDB and
/// replication stream that follow SYNC were read as replies, the connection was dropped and
/// every client's command in flight on it failed; REPLCONF ACK, never answered, handed the
/// next client's reply to its sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_commands_never_reach_a_shared_connection() {
    let redis = RedisServer::start();
    let proxy = one_shared_connection(&redis).await;
    let mut other = Raw::connect(proxy.addr).await;
    assert_eq!(other.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    let mut replica = Raw::connect(proxy.addr).await;
    // REPLCONF ACK and GETACK get no reply from Redis at all: forwarded, the next client's
    // reply on the shared connection was taken for theirs (a GET's value read by another).
    for command in [
        &["SYNC"][..],
        &["PSYNC", "?", "-1"],
        &["REPLCONF", "ACK", "0"],
        &["replconf", "getack", "*"],
        &["REPLCONF", "listening-port", "7000"],
    ] {
        let reply = String::from_utf8_lossy(&replica.call(command).await).into_owned();
        assert!(
            reply.starts_with("-ERR SYNC, PSYNC and REPLCONF cannot pass through"),
            "{reply}"
        );
        for _ in 0..20 {
            assert_eq!(other.call(&["GET", "k"]).await, b"$1\r\nv\r\n");
        }
    }
    assert_eq!(replica.call(&["PING"]).await, b"+PONG\r\n");
}

/// `SCRIPT DEBUG SYNC` and `YES`, however spelled, never reach a shared connection: there the
/// next EVAL of any client on it would start a debugger session (SYNC stops the whole server
/// until the debugger is told to go on; invariant fuzzer seed 735756934 hung every client).
/// `SCRIPT DEBUG NO` and the other SCRIPT subcommands pass as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lua_debugger_never_reaches_a_shared_connection() {
    let redis = RedisServer::start();
    let proxy = one_shared_connection(&redis).await;
    let mut debugger = Raw::connect(proxy.addr).await;
    let mut other = Raw::connect(proxy.addr).await;
    for mode in ["SYNC", "yes", "sync\0junk"] {
        let reply = text(&debugger.call(&["SCRIPT", "DEBUG", mode]).await);
        assert!(
            reply.starts_with("-ERR SCRIPT DEBUG YES and SYNC cannot pass through"),
            "{mode:?}: {reply}"
        );
        for client in [&mut debugger, &mut other] {
            assert_eq!(client.call(&["EVAL", "return 7", "0"]).await, b":7\r\n");
        }
    }
    assert_eq!(debugger.call(&["SCRIPT", "DEBUG", "NO"]).await, b"+OK\r\n");
    let sha = text(&debugger.call(&["SCRIPT", "LOAD", "return 8"]).await);
    let sha = sha.lines().nth(1).unwrap_or_default().to_string();
    assert_eq!(other.call(&["EVALSHA", &sha, "0"]).await, b":8\r\n");
    // Inside MULTI the refusal spoils the transaction, as a command Redis refuses at queue
    // time does.
    debugger.send(&resp(&["MULTI"])).await;
    debugger.send(&resp(&["SCRIPT", "DEBUG", "SYNC"])).await;
    debugger.send(&resp(&["EXEC"])).await;
    let got = text(&debugger.collect_frames(3, common::DEADLINE).await.joined());
    assert!(got.starts_with("+OK\r\n-ERR SCRIPT DEBUG"), "{got}");
    assert!(got.contains("-EXECABORT"), "{got}");
    assert_eq!(other.call(&["PING"]).await, b"+PONG\r\n");
}

/// A RESP2 subscriber's commands that Redis refuses in the subscribed context change nothing
/// on the proxy's side either: MULTI opened no transaction (the next PUNSUBSCRIBE was taken
/// for a queued command and its confirmation for a push, so the session hung), WATCH held
/// no key, CLIENT SETNAME and CLIENT ID were answered by the proxy itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp2_subscribers_refused_commands_change_nothing() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut direct = Raw::connect(redis.addr()).await;
    let mut through = Raw::connect(proxy.addr).await;
    let script: &[&[&str]] = &[
        &["PSUBSCRIBE", "p*"],
        &["MULTI"],
        &["WATCH", "k"],
        &["CLIENT", "SETNAME", "n"],
        &["CLIENT", "ID"],
        &["PING", "x"],
        &["PUNSUBSCRIBE", "p*"],
        &["EXEC"],
        &["SET", "k", "v"],
        &["CLIENT", "GETNAME"],
    ];
    for command in script {
        let want = direct.call(command).await;
        let got = through.call(command).await;
        assert_eq!(show(&got), show(&want), "{command:?}");
    }
}

/// A reply that only looks like a subscription confirmation, on a client's own dedicated
/// connection, is that command's reply. A list `subscribe ch x` (or `COMMAND LIST` when the
/// server's order puts `subscribe` first: the reply sweep's rare reset and stall,
/// docs/fuzzing.md) once marked the connection subscribed, so the next such reply was handed
/// on as a pushed message and every later reply went to the command before it: a PING
/// pipelined after it was never answered, and the last command always looked unanswered,
/// so the command timeout ended the connection and with it the client's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_shaped_like_a_confirmation_is_a_reply() {
    let redis = RedisServer::start();
    let mut config = common::config_for(&redis.addr());
    config.upstream.command_timeout_ms.value = 300;
    confirmation_shaped_replies(&Proxy::start(config).await).await;
}

/// The same in front of a cluster, where the session's dedicated connection goes to the
/// list's node (the reply sweep stalled there: a pipelined sentinel PING never answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_shaped_like_a_confirmation_is_a_reply_in_front_of_a_cluster() {
    let redis = common::cluster::RedisCluster::start(3, 0);
    let mut config = common::cluster::proxy_config(&redis.live_addrs()[0], &[]);
    config.upstream.command_timeout_ms.value = 300;
    confirmation_shaped_replies(&Proxy::start(config).await).await;
}

/// Pins a session to a dedicated connection, reads a list shaped like a confirmation twice,
/// the second time pipelined with a PING, and checks each command got its own reply and
/// none is left waiting, in RESP2 and RESP3.
async fn confirmation_shaped_replies(proxy: &Proxy) {
    for proto in ["2", "3"] {
        let mut c = Raw::connect(proxy.addr).await;
        if proto == "3" {
            let hello = c.call(&["HELLO", "3"]).await;
            assert!(hello.starts_with(b"%"), "{}", show(&hello));
        }
        // Connection state the proxy cannot read back: the session keeps a dedicated
        // connection from here on, where replies are told from pushes.
        assert_eq!(c.call(&["CLIENT", "NO-EVICT", "OFF"]).await, b"+OK\r\n");
        // In front of a cluster the session now reaches one node: a key of that node.
        let mut key = String::new();
        for n in 0..64 {
            key = format!("l{n}");
            if !c
                .call(&["DEL", key.as_str()])
                .await
                .starts_with(b"-CROSSSLOT")
            {
                break;
            }
        }
        let l = key.as_str();
        c.call(&["RPUSH", l, "subscribe", "ch", "x"]).await;
        let list = c.call(&["LRANGE", l, "0", "-1"]).await;
        assert_eq!(
            list, b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n$1\r\nx\r\n",
            "RESP{proto}"
        );
        let mut input = resp(&["LRANGE", l, "0", "-1"]);
        input.extend(resp(&["PING"]));
        c.send(&input).await;
        let got = c.collect_frames(2, std::time::Duration::from_secs(5)).await;
        assert_eq!(
            got.frames,
            vec![list.clone(), b"+PONG\r\n".to_vec()],
            "RESP{proto}: {}",
            show(&got.joined())
        );
        // Nothing is left waiting on the connection: past the command timeout (300 ms) the
        // session is still there. The wait is the point of the check, not a readiness wait.
        tokio::time::sleep(std::time::Duration::from_millis(900)).await;
        let pong = c.call(&["PING"]).await;
        assert_eq!(show(&pong), show(b"+PONG\r\n"), "RESP{proto}");
    }
}

/// `CLIENT TRACKING ON … BCAST` whose own prefixes overlap, the first prefix clear of the
/// others (`PREFIX 1 PREFIX x PREFIX x`): Redis 7.0–8.x reply with the overlap error and then
/// enable the tracking and add `+OK` (tracking.c returns the prefix's position as "no
/// collision"). Through the proxy: the error once, tracking still off, the connection open; in
/// MULTI the transaction is spoiled. Found by the invariant fuzzer (seed 75265683).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_tracking_prefixes_get_one_reply_and_change_nothing() {
    let redis = RedisServer::start();
    overlapping_prefixes(&Proxy::to(&redis).await).await;
}

/// The same in front of a cluster, where BCAST tracking is spread over every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_tracking_prefixes_get_one_reply_in_front_of_a_cluster() {
    let redis = common::cluster::RedisCluster::start(3, 0);
    let config = common::cluster::proxy_config(&redis.live_addrs()[0], &[]);
    overlapping_prefixes(&Proxy::start(config).await).await;
}

async fn overlapping_prefixes(proxy: &Proxy) {
    let mut c = Raw::connect(proxy.addr).await;
    assert!(c.call(&["HELLO", "3"]).await.starts_with(b"%"));
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "PREFIX", "1", "PREFIX", "x", "PREFIX", "x", "BCAST", "NOLOOP",
            ],
            "-ERR Prefix 'x' overlaps with another provided prefix 'x'. ",
        ),
        (
            &["BCAST", "PREFIX", "c", "PREFIX", "ab\0z", "PREFIX", "a"],
            "-ERR Prefix 'ab' overlaps with another provided prefix 'a'. ",
        ),
        // The first prefix overlaps: Redis answers once itself.
        (
            &["BCAST", "PREFIX", "a", "PREFIX", "ab"],
            "-ERR Prefix 'a' overlaps with another provided prefix 'ab'. ",
        ),
    ];
    for (options, error) in cases {
        let mut args = vec!["CLIENT", "TRACKING", "ON"];
        args.extend_from_slice(options);
        let mut input = resp(&args);
        input.extend(resp(&["PING", "after"]));
        c.send(&input).await;
        let got = c
            .collect_frames(3, std::time::Duration::from_millis(500))
            .await;
        let replies: Vec<String> = got.frames.iter().map(|f| text(f)).collect();
        assert_eq!(replies.len(), 2, "{options:?}: {replies:?}");
        assert!(
            replies[0].starts_with(error)
                && replies[0].ends_with("Prefixes for a single client must not overlap.\r\n"),
            "{options:?}: {replies:?}"
        );
        assert_eq!(replies[1], "$5\r\nafter\r\n", "{options:?}");
        let info = text(&c.call(&["CLIENT", "TRACKINGINFO"]).await);
        assert!(
            info.contains("off"),
            "{options:?}: tracking changed: {info}"
        );
    }
    // In MULTI: refused at once, and EXEC aborts.
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    let queued = c
        .call(&[
            "CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "c", "PREFIX", "a", "PREFIX", "a",
        ])
        .await;
    assert!(
        text(&queued).starts_with("-ERR Prefix 'a' overlaps"),
        "{}",
        text(&queued)
    );
    assert!(c.call(&["EXEC"]).await.starts_with(b"-EXECABORT"));
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
}

/// A RESP3 subscriber on a held connection (CLIENT NO-EVICT pins it) whose script returns
/// exactly a message's shape: RESP3 messages are `>` pushes, so the `*` reply is the script's
/// reply, and nothing is left unanswered (before, it was taken for a message, every later
/// reply went to the command before, and the command timeout ended the session). Then
/// HELLO 2 on the same connection: RESP2 messages are arrays again and still reach the client
/// as messages, and RESET goes back to RESP2 as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp3_subscribers_message_shaped_reply_is_a_reply() {
    let redis = RedisServer::start();
    let mut config = common::config_for(&redis.addr());
    config.upstream.command_timeout_ms.value = 300;
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert!(c.call(&["HELLO", "3"]).await.starts_with(b"%"));
    assert_eq!(c.call(&["CLIENT", "NO-EVICT", "OFF"]).await, b"+OK\r\n");
    let confirmed = c.call(&["SUBSCRIBE", "ch"]).await;
    assert!(
        confirmed.starts_with(b">3\r\n$9\r\nsubscribe"),
        "{}",
        show(&confirmed)
    );
    let shaped = b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nx\r\n".to_vec();
    let script = "return {'message','ch','x'}";
    let mut input = resp(&["EVAL", script, "0"]);
    input.extend(resp(&["PING", "after"]));
    c.send(&input).await;
    let got = c.collect_frames(2, std::time::Duration::from_secs(5)).await;
    assert_eq!(
        got.frames,
        vec![shaped.clone(), b"$5\r\nafter\r\n".to_vec()],
        "{}",
        show(&got.joined())
    );
    // Past the command timeout (300 ms) the session is still there: nothing was left
    // waiting. The wait is the point of the check, not a readiness wait.
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
    // A message is still a message.
    let mut publisher = Raw::connect(proxy.addr).await;
    assert_eq!(publisher.call(&["PUBLISH", "ch", "m"]).await, b":1\r\n");
    let pushed = c.collect_frames(1, std::time::Duration::from_secs(5)).await;
    assert_eq!(
        show(&pushed.joined()),
        show(b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nm\r\n")
    );
    // HELLO 2 while subscribed (Redis allows it from RESP3): messages come as arrays now.
    assert!(c.call(&["HELLO", "2"]).await.starts_with(b"*"));
    assert_eq!(publisher.call(&["PUBLISH", "ch", "n"]).await, b":1\r\n");
    let pushed = c.collect_frames(1, std::time::Duration::from_secs(5)).await;
    assert_eq!(
        show(&pushed.joined()),
        show(b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nn\r\n")
    );
    let pong = c.call(&["PING"]).await;
    assert_eq!(show(&pong), show(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"));
}
