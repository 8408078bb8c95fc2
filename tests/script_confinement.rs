//! Scripts cannot run what the deny rules refuse (`upstream.script_acl: confine`, the
//! default): through `policy/default.yaml` as shipped, in front of a stock redis-server, a
//! script or a function calling FLUSHALL changes nothing, while scripts the policy allows run;
//! where the proxy cannot set up its script user it says so and refuses scripts.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::process::ProxyProcess;
use common::{DEADLINE, Proxy, Raw, RedisServer, http_get};

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

/// A proxy running `policy/default.yaml` exactly as shipped, in front of `redis`, with
/// `edit` applied to its `upstream` (credentials).
async fn shipped_policy(
    redis: &RedisServer,
    edit: impl FnOnce(&mut redis_policy_proxy::Config),
) -> Proxy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let mut config = redis_policy_proxy::setup::from_yaml(&yaml, &path).expect("policy loads");
    config.set_upstream(redis.addr());
    edit(&mut config);
    Proxy::start(config).await
}

/// `/readyz`'s body once it mentions `what`.
async fn readyz_saying(proxy: &Proxy, what: &str) -> String {
    let until = std::time::Instant::now() + DEADLINE;
    loop {
        let (status, body) = http_get(proxy.admin, "/readyz").await;
        if status == 200 && body.contains(what) {
            return body;
        }
        assert!(std::time::Instant::now() < until, "/readyz: {body}");
        tokio::time::sleep(common::POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_cannot_flush_through_the_shipped_policy() {
    let redis = RedisServer::start();
    redis.direct(&["SET", "a", "1"]).await;
    redis.direct(&["SET", "b", "2"]).await;
    let proxy = shipped_policy(&redis, |_| {}).await;
    let mut c = Raw::connect(proxy.addr).await;
    let reply = text(
        &c.call(&["EVAL", "return redis.call('FLUS'..'HALL')", "0"])
            .await,
    );
    assert!(reply.starts_with("-"), "{reply}");
    assert_eq!(redis.direct(&["DBSIZE"]).await, b":2\r\n");
    // Inside a transaction too: EXEC runs the script on the same confined connection.
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(
        c.call(&["EVAL", "return redis.call('FLUSHDB')", "0"]).await,
        b"+QUEUED\r\n"
    );
    let exec = text(&c.call(&["EXEC"]).await);
    assert!(exec.starts_with("*1\r\n-"), "{exec}");
    assert_eq!(redis.direct(&["DBSIZE"]).await, b":2\r\n");
    // What the policy allows still runs inside a script.
    assert_eq!(
        c.call(&[
            "EVAL",
            "return redis.call('SET', KEYS[1], ARGV[1])",
            "1",
            "c",
            "3"
        ])
        .await,
        b"+OK\r\n"
    );
    assert_eq!(redis.direct(&["GET", "c"]).await, b"$1\r\n3\r\n");
    // A function someone loaded that calls FLUSHALL is refused when called.
    let lib = "#!lua name=wipe\nredis.register_function('wipe', function() return redis.call('FLUSHALL') end)";
    assert_eq!(
        redis.direct(&["FUNCTION", "LOAD", lib]).await,
        b"$4\r\nwipe\r\n"
    );
    let reply = text(&c.call(&["FCALL", "wipe", "0"]).await);
    assert!(reply.starts_with("-"), "{reply}");
    assert_eq!(redis.direct(&["DBSIZE"]).await, b":3\r\n");
    // RESP3 clients' scripts are confined as well.
    let mut c3 = Raw::connect(proxy.addr).await;
    assert!(c3.call(&["HELLO", "3"]).await.starts_with(b"%"));
    let reply = text(
        &c3.call(&["EVAL", "return redis.call('FLUSHALL')", "0"])
            .await,
    );
    assert!(reply.starts_with("-"), "{reply}");
    assert_eq!(redis.direct(&["DBSIZE"]).await, b":3\r\n");
    let body = readyz_saying(&proxy, "scripts run as `rpp-scripts-").await;
    assert!(body.contains("upstream user `default`'s rights"), "{body}");
    // The default user itself is untouched.
    assert!(
        text(&redis.direct(&["ACL", "LIST"]).await).contains("user default on nopass ~* &* +@all")
    );
    // A graceful shutdown deletes the script user: each start makes its own.
    drop((c, c3));
    proxy.stop().await;
    assert_eq!(
        redis.direct(&["ACL", "USERS"]).await,
        b"*1\r\n$7\r\ndefault\r\n"
    );
}

/// The script user is never wider than the proxy's own: a least-privilege proxy user's
/// scripts keep its limits (keys and commands) as well as losing the denied commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_user_is_never_wider_than_the_proxys_own() {
    let redis = RedisServer::start();
    redis
        .direct(&[
            "ACL", "SETUSER", "app", "on", ">app-pw", "~app:*", "&*", "+@all", "-debug",
        ])
        .await;
    let proxy = shipped_policy(&redis, |c| {
        c.upstream.username = Some("app".into());
        c.upstream.password = Some("app-pw".into());
    })
    .await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(
        c.call(&[
            "EVAL",
            "return redis.call('SET', KEYS[1], 'v')",
            "1",
            "app:1"
        ])
        .await,
        b"+OK\r\n"
    );
    let outside = text(
        &c.call(&[
            "EVAL",
            "return redis.call('SET', KEYS[1], 'v')",
            "1",
            "other",
        ])
        .await,
    );
    assert!(outside.starts_with("-"), "{outside}");
    let flush = text(
        &c.call(&["EVAL", "return redis.call('FLUSHALL')", "0"])
            .await,
    );
    assert!(flush.starts_with("-"), "{flush}");
    assert_eq!(redis.direct(&["DBSIZE"]).await, b":1\r\n");
    let list = text(&redis.direct(&["ACL", "LIST"]).await);
    let script_user = list
        .lines()
        .find(|l| l.starts_with("user rpp-scripts-"))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        script_user.contains("~app:*") && script_user.contains("-flushall"),
        "{script_user}"
    );
    // The proxy's own user is unchanged.
    assert!(
        list.contains("user app on #") && list.contains("~app:* &* +@all -debug"),
        "{list}"
    );
}

/// A proxy user that may not read ACLs cannot have a script user: the proxy says so in
/// /readyz and refuses scripts with a message saying why (the default), or runs them
/// unconfined when the operator chose `unconfined_scripts: run`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_acl_rights_scripts_are_refused_and_the_proxy_says_why() {
    let redis = RedisServer::start();
    redis
        .direct(&[
            "ACL", "SETUSER", "app", "on", ">app-pw", "~*", "&*", "+@all", "-@admin",
        ])
        .await;
    let creds = |c: &mut redis_policy_proxy::Config| {
        c.upstream.username = Some("app".into());
        c.upstream.password = Some("app-pw".into());
    };
    let proxy = shipped_policy(&redis, creds).await;
    let body = readyz_saying(&proxy, "scripts cannot run as the proxy's script user").await;
    assert!(body.contains("they are refused"), "{body}");
    let mut c = Raw::connect(proxy.addr).await;
    let reply = text(&c.call(&["EVAL", "return 1", "0"]).await);
    assert!(
        reply.starts_with(
            "-NOPERM policy script-acl: scripts are refused because they cannot run confined"
        ) && reply.contains("upstream.unconfined_scripts: run"),
        "{reply}"
    );
    assert_eq!(c.call(&["GET", "k"]).await, b"$-1\r\n");
    let proxy = shipped_policy(&redis, |c| {
        creds(c);
        c.upstream.unconfined_scripts.value = redis_policy_proxy::config::UnconfinedScripts::Run;
    })
    .await;
    let body = readyz_saying(&proxy, "scripts cannot run as the proxy's script user").await;
    assert!(body.contains("they run unconfined"), "{body}");
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["EVAL", "return 1", "0"]).await, b":1\r\n");
}

/// In front of a Redis Cluster each node keeps its own ACL: the proxy creates the script user
/// on every node it opens a dedicated connection to, from that node's ACL, so a script that
/// flushes is refused on whichever node its key lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_confined_on_every_cluster_node() {
    let redis = common::cluster::RedisCluster::start(3, 0);
    let yaml = format!(
        "upstream:\n  mode: cluster\n  cluster:\n    seeds: [{}]\nrules:\n  - id: deny-flush\n    deny: [FLUSHALL, FLUSHDB]\n",
        redis.live_addrs()[0]
    );
    let config =
        redis_policy_proxy::setup::from_yaml(&yaml, Path::new("cluster-scripts.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    let primaries = redis.primaries();
    let keys: Vec<String> = primaries.iter().map(|p| redis.key_on(p, "k")).collect();
    for key in &keys {
        let reply = c
            .call(&["EVAL", "return redis.call('SET', KEYS[1], 'v')", "1", key])
            .await;
        assert_eq!(reply, b"+OK\r\n", "{key}: {}", text(&reply));
    }
    for key in &keys {
        let reply = text(
            &c.call(&["EVAL", "return redis.call('FLUSHALL')", "1", key])
                .await,
        );
        assert!(reply.starts_with("-"), "{key}: {reply}");
    }
    for primary in &primaries {
        let mut direct = Raw::connect(primary).await;
        assert_eq!(direct.call(&["DBSIZE"]).await, b":1\r\n", "{primary}");
        let users = text(&direct.call(&["ACL", "USERS"]).await);
        assert!(users.contains("rpp-scripts-"), "{primary}: {users}");
    }
}

/// A restarted Redis has forgotten the script user: the next dedicated connection creates it
/// again (its login is refused, so it is set up first), and scripts stay confined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_upstream_gets_the_script_user_again() {
    let mut redis = RedisServer::start();
    let proxy = shipped_policy(&redis, |_| {}).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["EVAL", "return 1", "0"]).await, b":1\r\n");
    redis.restart();
    redis.direct(&["SET", "kept", "1"]).await;
    // Until the proxy is connected again, a script gets an upstream error; then it runs.
    let until = std::time::Instant::now() + DEADLINE;
    let mut c = loop {
        let mut c = Raw::connect(proxy.addr).await;
        if c.call(&["EVAL", "return 1", "0"]).await == b":1\r\n" {
            break c;
        }
        assert!(std::time::Instant::now() < until, "scripts never ran again");
        tokio::time::sleep(common::POLL).await;
    };
    let reply = text(
        &c.call(&["EVAL", "return redis.call('FLUSHALL')", "0"])
            .await,
    );
    assert!(reply.starts_with("-"), "{reply}");
    assert_eq!(redis.direct(&["DBSIZE"]).await, b":1\r\n");
    assert!(text(&redis.direct(&["ACL", "USERS"]).await).contains("rpp-scripts-"));
}

/// A reload while a script keeps Redis busy: setting the script user up gets `BUSY`, which
/// says "not now", not "no". The proxy retries once the script ends, and scripts keep running
/// confined to the new policy. (`BUSY` was read as a refusal: every script was refused, as
/// "cannot run confined", until the next attempt 30 seconds later.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_a_busy_script_is_retried_not_taken_as_a_refusal() {
    let redis = RedisServer::start_with(&["--busy-reply-threshold", "50"]);
    let tmp = common::TempDir::new("busy-reload");
    let policy = |denied: &str| format!("rules:\n  - id: no-{denied}\n    deny: [{denied}]\n");
    let file = common::write_file(tmp.path(), "p.yaml", &policy("KEYS"));
    let proxy = ProxyProcess::start(&file, &redis, tmp.path().join("log"), &[]).await;
    proxy.wait_for_log("script ACL checked", 1).await;
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["EVAL", "return 1", "0"]).await, b":1\r\n");

    // Redis busy with a script of another client's, sent directly.
    let mut spin = Raw::connect(redis.addr()).await;
    spin.send(b"EVAL \"while true do end\" 0\r\n").await;
    let until = std::time::Instant::now() + DEADLINE;
    while !redis.direct(&["PING"]).await.starts_with(b"-BUSY") {
        assert!(std::time::Instant::now() < until, "Redis never got busy");
        tokio::time::sleep(common::POLL).await;
    }
    std::fs::write(&file, policy("DBSIZE")).unwrap();
    proxy.signal("-HUP");
    proxy.wait_for_log("policy reloaded", 1).await;
    proxy
        .wait_for_log("script ACL not checked; retrying", 1)
        .await;
    assert!(
        !proxy.log_text().contains("scripts can bypass the policy"),
        "{}",
        proxy.log_text()
    );

    assert_eq!(redis.direct(&["SCRIPT", "KILL"]).await, b"+OK\r\n");
    assert!(text(&spin.read_frame().await).contains("killed by user"));
    proxy.wait_for_log("script ACL checked", 2).await;
    assert_eq!(c.call(&["EVAL", "return 1", "0"]).await, b":1\r\n");
    let reply = text(&c.call(&["EVAL", "return redis.call('DBSIZE')", "0"]).await);
    assert!(reply.starts_with("-"), "{reply}");
    assert!(!reply.contains("cannot run confined"), "{reply}");
}
