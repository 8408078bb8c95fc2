//! Proxy-side users, identities and tenant-scoped rules, through the proxy.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::{DEADLINE, Proxy, Raw, RedisServer};
use redis_policy_proxy::Config;

const ADMIN_SHA256: &str = "5fcf82bc15aef42cd3ec93e6d4b51c04df110cf77ee715f62f3f172ff8ed9de9"; // adminpw
const APP_SHA256: &str = "71d3d4e36cf4bc4309fd7390ba79fc6a1d03d8d7b45ef26f04bcdff3ff116868"; // apppw

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

fn config(redis: &RedisServer, require_auth: bool) -> Config {
    let yaml = format!(
        "upstream:\n  address: {}\naccess:\n  require_auth: {require_auth}\n  users:\n    - {{name: admin, password_sha256: {ADMIN_SHA256}}}\n    - {{name: app, password_sha256: {APP_SHA256}}}\n  identities:\n    - {{tenant: admin, user: admin}}\n    - {{tenant: app, user: app}}\nrules:\n  - id: deny-admin\n    deny: [config|set, DEBUG]\n    except_tenants: [admin]\n    message: reserved for operators\n  - id: app-no-keys\n    deny: [KEYS]\n    tenants: [app]\n",
        redis.addr()
    );
    redis_policy_proxy::setup::from_yaml(&yaml, Path::new("access.yaml")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_auth_refuses_until_the_proxy_accepts_credentials() {
    let redis = RedisServer::start();
    // No readiness probe: every probe command would be refused before AUTH.
    let proxy = Proxy::spawn(config(&redis, true)).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(
        c.call(&["GET", "k"]).await,
        b"-NOAUTH Authentication required.\r\n"
    );
    assert!(text(&c.call(&["HELLO", "3"]).await).starts_with("-NOAUTH HELLO must be called"));
    assert_eq!(
        c.call(&["AUTH", "app", "wrong"]).await,
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
    );
    assert_eq!(
        c.call(&["AUTH", "nobody", "apppw"]).await[..10],
        b"-WRONGPASS"[..]
    );
    assert_eq!(c.call(&["AUTH", "app", "apppw"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    assert_eq!(redis.direct(&["GET", "k"]).await, b"$1\r\nv\r\n");
    // The app tenant gets both rules.
    let reply = text(&c.call(&["CONFIG", "SET", "maxmemory", "0"]).await);
    assert!(
        reply.starts_with("-NOPERM policy deny-admin: CONFIG SET is not allowed"),
        "{reply}"
    );
    assert!(text(&c.call(&["KEYS", "*"]).await).starts_with("-NOPERM policy app-no-keys"));
    // RESET logs out, as it does on Redis.
    assert_eq!(c.call(&["RESET"]).await, b"+RESET\r\n");
    assert_eq!(
        c.call(&["GET", "k"]).await,
        b"-NOAUTH Authentication required.\r\n"
    );

    // The admin tenant, authenticated inside HELLO, is exempt from deny-admin and app-no-keys.
    let mut admin = Raw::connect(proxy.addr).await;
    admin.send(b"HELLO 3 AUTH admin adminpw\r\n").await;
    let hello = admin.collect_frames(1, DEADLINE).await.joined();
    assert!(hello.starts_with(b"%"), "{}", text(&hello));
    assert_eq!(
        admin.call(&["CONFIG", "SET", "maxmemory", "0"]).await,
        b"+OK\r\n"
    );
    assert!(admin.call(&["KEYS", "*"]).await.starts_with(b"*"));
    let wrong = admin.call(&["HELLO", "3", "AUTH", "admin", "nope"]).await;
    assert_eq!(&wrong[..10], b"-WRONGPASS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_require_auth_anonymous_clients_are_the_default_tenant() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(config(&redis, false)).await;
    let mut c = Raw::connect(proxy.addr).await;
    // default tenant: deny-admin applies (it excepts only admin), app-no-keys does not.
    assert!(text(&c.call(&["CONFIG", "SET", "maxmemory", "0"]).await).starts_with("-NOPERM"));
    assert!(c.call(&["KEYS", "*"]).await.starts_with(b"*"));
    // The proxy answers AUTH itself: the upstream has no password and never sees it.
    assert_eq!(c.call(&["AUTH", "app", "apppw"]).await, b"+OK\r\n");
    assert!(text(&c.call(&["KEYS", "*"]).await).starts_with("-NOPERM policy app-no-keys"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networks_pick_the_tenant() {
    let redis = RedisServer::start();
    let yaml = format!(
        "upstream:\n  address: {}\naccess:\n  identities:\n    - {{tenant: remote, cidr: 10.0.0.0/8}}\n    - {{tenant: local, cidr: 127.0.0.0/8}}\nrules:\n  - id: local-no-flush\n    deny: [FLUSHDB]\n    tenants: [local]\n  - id: remote-no-get\n    deny: [GET]\n    tenants: [remote]\n",
        redis.addr()
    );
    let proxy =
        Proxy::start(redis_policy_proxy::setup::from_yaml(&yaml, Path::new("n.yaml")).unwrap())
            .await;
    let mut c = Raw::connect(proxy.addr).await;
    assert!(text(&c.call(&["FLUSHDB"]).await).starts_with("-NOPERM policy local-no-flush"));
    assert_eq!(c.call(&["GET", "x"]).await, b"$-1\r\n");
}

#[test]
fn access_mistakes_are_reported_with_their_fields() {
    let yaml = "access:\n  require_auth: true\n  users:\n    - {name: a, password_sha256: nothex}\n  identities:\n    - {tenant: t, user: ghost, cidr: 300.0.0.0/8}\nrules:\n  - id: r\n    deny: [KEYS]\n    tenants: [nosuch]\n";
    let err = redis_policy_proxy::setup::from_yaml(yaml, Path::new("bad.yaml"))
        .unwrap_err()
        .to_string();
    for needle in [
        "bad.yaml:4: field `access.users[0].password_sha256`",
        "field `access.identities[0].cidr`",
        "field `access.identities[0].user`: no user `ghost`",
        "field `rules[0].tenants`: no tenant `nosuch`",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_brute_force_is_throttled_per_address_and_user() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(config(&redis, false)).await;
    let mut c = Raw::connect(proxy.addr).await;
    for _ in 0..6 {
        let r = c.call(&["AUTH", "app", "guess"]).await;
        assert!(text(&r).starts_with("-WRONGPASS"), "{}", text(&r));
    }
    // Now even the right password must wait; a new connection from the same address too.
    let r = c.call(&["AUTH", "app", "apppw"]).await;
    assert!(
        text(&r).starts_with(
            "-ERR too many failed AUTH attempts for this user from this address; retry in "
        ),
        "{}",
        text(&r)
    );
    let mut other = Raw::connect(proxy.addr).await;
    let r = other.call(&["HELLO", "3", "AUTH", "app", "apppw"]).await;
    assert!(
        text(&r).starts_with("-ERR too many failed AUTH"),
        "{}",
        text(&r)
    );
    // The first wait is short; then the right password works.
    let until = std::time::Instant::now() + common::DEADLINE;
    loop {
        let r = c.call(&["AUTH", "app", "apppw"]).await;
        if r == b"+OK\r\n" {
            break;
        }
        assert!(std::time::Instant::now() < until, "{}", text(&r));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
