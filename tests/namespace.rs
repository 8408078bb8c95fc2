//! Tenant isolation through key-prefix namespaces: a tenant's keys live under its prefix and
//! no command it can send reads, lists, changes or subscribes to anything outside it.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::{DEADLINE, Proxy, Raw, RedisServer};

const ALICE: &str = "6624974ea2baffac164422e4490376c1c31313cd97724ae8ce62fb3f0a0370f2"; // alicepw
const BOB: &str = "e8f318657ce39ec4edeecbbee28fd72dea2261d8a6b2155ce4977393e0ea721b"; // bobpw

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

async fn proxy_for(redis: &RedisServer, policy_file: Option<&str>) -> Proxy {
    proxy_with(redis, policy_file, "").await
}

/// `extra` is appended to the `access:` section.
async fn proxy_with(redis: &RedisServer, policy_file: Option<&str>, extra: &str) -> Proxy {
    let base = match policy_file {
        Some("policy/default.yaml") => common::default_policy_enforced(),
        Some(f) => std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(f)).unwrap(),
        None => String::new(),
    };
    let yaml = format!(
        "{base}\naccess:\n  require_auth: true\n  users:\n    - {{name: alice, password_sha256: {ALICE}}}\n    - {{name: bob, password_sha256: {BOB}}}\n  identities:\n    - {{tenant: a, user: alice}}\n    - {{tenant: b, user: bob}}\n  namespaces:\n    a: 'a:'\n    b: 'b:'\n{extra}"
    );
    let mut config = redis_policy_proxy::setup::from_yaml(&yaml, Path::new("ns.yaml")).unwrap();
    config.set_upstream(redis.addr());
    Proxy::spawn(config).await
}

async fn login(proxy: &Proxy, user: &str, password: &str) -> Raw {
    let mut c = Raw::connect(proxy.addr).await;
    let until = std::time::Instant::now() + DEADLINE;
    loop {
        if c.call(&["AUTH", user, password]).await == b"+OK\r\n" {
            return c;
        }
        assert!(
            std::time::Instant::now() < until,
            "AUTH {user} never succeeded"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        c = Raw::connect(proxy.addr).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_works_inside_its_namespace() {
    let redis = RedisServer::start();
    let proxy = proxy_for(&redis, None).await;
    let mut a = login(&proxy, "alice", "alicepw").await;
    assert_eq!(a.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    assert_eq!(a.call(&["GET", "k"]).await, b"$1\r\nv\r\n");
    assert_eq!(redis.direct(&["GET", "a:k"]).await, b"$1\r\nv\r\n");
    assert_eq!(redis.direct(&["EXISTS", "k"]).await, b":0\r\n");
    assert_eq!(a.call(&["MSET", "x", "1", "y", "2"]).await, b"+OK\r\n");
    assert_eq!(
        a.call(&["MGET", "x", "y"]).await,
        b"*2\r\n$1\r\n1\r\n$1\r\n2\r\n"
    );
    assert_eq!(a.call(&["RENAME", "x", "z"]).await, b"+OK\r\n");
    assert_eq!(redis.direct(&["EXISTS", "a:z"]).await, b":1\r\n");
    a.send(b"WATCH n\r\nMULTI\r\nINCR n\r\nEXEC\r\n").await;
    assert_eq!(
        a.collect_frames(4, DEADLINE).await.joined(),
        b"+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n:1\r\n"
    );
    assert_eq!(redis.direct(&["GET", "a:n"]).await, b"$1\r\n1\r\n");
    // SCAN and KEYS see the tenant's own names only; inside MULTI they are refused, since
    // EXEC's reply could not be cleaned.
    redis.direct(&["SET", "other", "x"]).await;
    let scan = text(&a.call(&["SCAN", "0", "COUNT", "1000"]).await);
    for name in ["\r\nk\r\n", "\r\nz\r\n", "\r\nn\r\n"] {
        assert!(scan.contains(name), "{name:?} missing from {scan}");
    }
    assert!(!scan.contains("other") && !scan.contains("a:"), "{scan}");
    assert_eq!(a.call(&["RPUSH", "q", "v"]).await, b":1\r\n");
    assert_eq!(
        a.call(&["BLPOP", "q", "1"]).await,
        b"*2\r\n$1\r\nq\r\n$1\r\nv\r\n"
    );
    let id = a.call(&["XADD", "s", "1-1", "f", "v"]).await;
    assert_eq!(id, b"$3\r\n1-1\r\n");
    assert_eq!(
        a.call(&["XREAD", "COUNT", "1", "STREAMS", "s", "0"]).await,
        b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n"
    );
    a.call(&["DEL", "s"]).await;
    let keys = text(&a.call(&["KEYS", "*"]).await);
    assert!(keys.starts_with("*4\r\n") && !keys.contains("a:"), "{keys}");
    a.send(b"MULTI\r\nSCAN 0\r\nEXEC\r\n").await;
    let got = a.collect_frames(3, DEADLINE).await.frames;
    assert!(
        text(&got[1]).starts_with("-NOPERM policy namespace"),
        "{}",
        text(&got[1])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_reaches_another_tenants_data() {
    let redis = RedisServer::start();
    let proxy = proxy_for(&redis, Some("policy/default.yaml")).await;
    let mut b = login(&proxy, "bob", "bobpw").await;
    assert_eq!(b.call(&["SET", "secret", "bob-value"]).await, b"+OK\r\n");
    assert_eq!(b.call(&["HSET", "h", "f", "v"]).await, b":1\r\n");
    assert_eq!(b.call(&["RPUSH", "list", "1", "2"]).await, b":2\r\n");
    assert!(
        b.call(&["XADD", "s", "*", "f", "v"])
            .await
            .starts_with(b"$")
    );
    let snapshot = |r: &RedisServer| {
        let r = r.addr();
        async move {
            let mut c = Raw::connect(r).await;
            let mut out = Vec::new();
            for cmd in [
                &["GET", "b:secret"][..],
                &["HGETALL", "b:h"],
                &["LRANGE", "b:list", "0", "-1"],
                &["XLEN", "b:s"],
                &["DBSIZE"],
                &["CONFIG", "GET", "maxmemory"],
            ] {
                out.push(c.call(cmd).await);
            }
            c.call(&["SELECT", "1"]).await;
            out.push(c.call(&["DBSIZE"]).await);
            out
        }
    };
    let before = snapshot(&redis).await;

    let mut a = login(&proxy, "alice", "alicepw").await;
    // Every attempt either is refused or stays inside `a:`.
    let refused: &[&[&str]] = &[
        &["KEYS", "*"],
        &["KEYS", "b:*"],
        &["RANDOMKEY"],
        &["DBSIZE"],
        &["INFO", "keyspace"],
        &["FLUSHDB"],
        &["FLUSHALL"],
        &["SWAPDB", "0", "1"],
        &["SELECT", "1"],
        &["MIGRATE", "127.0.0.1", "1", "b:secret", "0", "100"],
        &["EVAL", "return redis.call('get','b:secret')", "0"],
        &["EVAL", "return redis.call('get',KEYS[1])", "1", "x"],
        &["EVAL_RO", "return 1", "0"],
        &["EVALSHA", "0000000000000000000000000000000000000000", "0"],
        &["SCRIPT", "LOAD", "return 1"],
        &["FUNCTION", "LIST"],
        &["FCALL", "f", "1", "b:secret"],
        &["MONITOR"],
        &["PUBSUB", "NUMPAT"],
        &["CLIENT", "LIST"],
        &["CLIENT", "KILL", "ID", "1"],
        &["CLIENT", "TRACKING", "ON", "REDIRECT", "1"],
        &["CONFIG", "GET", "*"],
        &["CONFIG", "SET", "maxmemory", "1"],
        &["DEBUG", "OBJECT", "b:secret"],
        &["SLOWLOG", "GET"],
        &["ACL", "LIST"],
        &["SORT", "k", "BY", "b:*"],
        &["SORT", "k", "GET", "b:*"],
        &["OBJECT", "HELP"],
        &["LATENCY", "DOCTOR"],
        &["MEMORY", "DOCTOR"],
        &["CLUSTER", "KEYSLOT", "x"],
        &["SAVE"],
        &["BGSAVE"],
        &["SHUTDOWN", "NOSAVE"],
        &["REPLICAOF", "127.0.0.1", "1"],
        &["NOSUCHCOMMAND", "b:secret"],
    ];
    for cmd in refused {
        let reply = text(&a.call(cmd).await);
        assert!(
            reply.starts_with("-NOPERM policy"),
            "{cmd:?} was not refused: {reply}"
        );
    }
    // Keyed commands run, but on `a:`-prefixed keys only: bob's data is invisible.
    let confined: &[(&[&str], &[u8])] = &[
        (&["GET", "b:secret"], b"$-1\r\n"),
        (&["MGET", "b:secret", "secret"], b"*2\r\n$-1\r\n$-1\r\n"),
        (&["HGETALL", "b:h"], b"*0\r\n"),
        (&["EXISTS", "b:secret"], b":0\r\n"),
        (&["TYPE", "b:secret"], b"+none\r\n"),
        (&["DUMP", "b:secret"], b"$-1\r\n"),
        (&["OBJECT", "ENCODING", "b:secret"], b"$-1\r\n"),
        (&["MEMORY", "USAGE", "b:secret"], b"$-1\r\n"),
        (&["TTL", "b:secret"], b":-2\r\n"),
        (&["DEL", "b:secret", "b:h"], b":0\r\n"),
        (&["UNLINK", "b:list"], b":0\r\n"),
        (&["EXPIRE", "b:secret", "1"], b":0\r\n"),
        (&["LRANGE", "b:list", "0", "-1"], b"*0\r\n"),
        (&["XLEN", "b:s"], b":0\r\n"),
        (&["SET", "b:secret", "overwritten"], b"+OK\r\n"),
        (&["COPY", "b:secret", "b:copy"], b":1\r\n"),
        (&["RENAME", "b:copy", "b:h"], b"+OK\r\n"),
        (
            &["BLMOVE", "b:list", "mine", "LEFT", "RIGHT", "0.1"],
            b"*-1\r\n",
        ),
        (&["SORT", "b:list"], b"*0\r\n"),
        (&["WATCH", "b:secret"], b"+OK\r\n"),
        (&["UNWATCH"], b"+OK\r\n"),
    ];
    for (cmd, expected) in confined {
        assert_eq!(
            text(&a.call(cmd).await),
            text(expected),
            "{cmd:?} escaped or failed"
        );
    }
    // SCAN lists only alice's keys, under the names alice uses.
    let scan = text(&a.call(&["SCAN", "0", "COUNT", "1000"]).await);
    assert!(scan.contains("\r\nb:secret\r\n"), "{scan}");
    assert!(!scan.contains("a:"), "prefix leaked: {scan}");
    let scan = text(
        &a.call(&["SCAN", "0", "MATCH", "*secret*", "COUNT", "1000"])
            .await,
    );
    assert!(scan.ends_with("*1\r\n$8\r\nb:secret\r\n"), "{scan}");
    // Inline commands and transactions get the same treatment.
    a.send(b"KEYS *\r\nGET b:secret\r\n").await;
    let got = a.collect_frames(2, DEADLINE).await.frames;
    assert!(got[0].starts_with(b"-NOPERM"));
    assert_eq!(got[1], b"$11\r\noverwritten\r\n");
    a.send(b"MULTI\r\nGET b:secret\r\nKEYS *\r\nEXEC\r\n").await;
    let got = a.collect_frames(4, DEADLINE).await.frames;
    assert_eq!(
        got[3],
        b"-EXECABORT Transaction discarded because of previous errors.\r\n"
    );

    // Bob's data, the configuration and the other database are exactly as they were, and
    // every key alice made is under `a:`.
    assert_eq!(snapshot(&redis).await[..4], before[..4]);
    assert_eq!(snapshot(&redis).await[5..], before[5..]);
    let keys = text(&redis.direct(&["KEYS", "*"]).await);
    for line in keys
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
    {
        assert!(
            line.starts_with("a:") || line.starts_with("b:"),
            "stray key {line}"
        );
    }
    assert!(keys.contains("a:b:secret"));
    // The default policy's TTL applies inside the namespace too.
    let pttl = text(&redis.direct(&["PTTL", "a:b:secret"]).await);
    assert!(!pttl.starts_with(":-"), "a:b:secret has no TTL: {pttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pub_sub_channels_are_namespaced_too() {
    let redis = RedisServer::start();
    let proxy = proxy_for(&redis, None).await;
    // Bob listens to everything he can: his channel `news` and every pattern.
    let mut bob = login(&proxy, "bob", "bobpw").await;
    bob.send(b"SUBSCRIBE news\r\nPSUBSCRIBE *\r\n").await;
    assert_eq!(
        bob.collect_frames(2, DEADLINE).await.joined(),
        b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n*3\r\n$10\r\npsubscribe\r\n$1\r\n*\r\n:2\r\n"
    );
    // Alice's subscriber and publisher see their own names, and only their own messages.
    let mut listener = login(&proxy, "alice", "alicepw").await;
    listener.send(b"SUBSCRIBE news\r\n").await;
    assert_eq!(
        listener.collect_frames(1, DEADLINE).await.joined(),
        b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n"
    );
    let mut alice = login(&proxy, "alice", "alicepw").await;
    assert_eq!(alice.call(&["PUBLISH", "news", "hello"]).await, b":1\r\n");
    assert_eq!(
        listener.collect_frames(1, DEADLINE).await.joined(),
        b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nhello\r\n"
    );
    assert_eq!(
        alice.call(&["PUBSUB", "CHANNELS"]).await,
        b"*1\r\n$4\r\nnews\r\n"
    );
    assert_eq!(
        alice.call(&["PUBSUB", "NUMSUB", "news"]).await,
        b"*2\r\n$4\r\nnews\r\n:1\r\n"
    );
    // Bob publishing on `news` reaches bob's subscribers only, and nothing of alice's
    // message reached bob: his next frames are his own message (channel and pattern).
    let mut bob_pub = login(&proxy, "bob", "bobpw").await;
    assert_eq!(
        bob_pub.call(&["PUBLISH", "news", "from-bob"]).await,
        b":2\r\n"
    );
    let got = bob.collect_frames(2, DEADLINE).await.joined();
    let got = text(&got);
    assert!(got.contains("from-bob") && !got.contains("hello"), "{got}");
    listener
        .assert_quiet(std::time::Duration::from_millis(200))
        .await;
}

const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_listed_scripts_run_and_their_keys_are_prefixed() {
    let redis = RedisServer::start();
    let sha = sha1_hex(RELEASE);
    let proxy = proxy_with(&redis, None, &format!("  scripts: ['{sha}']\n")).await;
    let mut a = login(&proxy, "alice", "alicepw").await;
    assert_eq!(
        a.call(&["SET", "lock:job", "tok", "NX", "PX", "5000"])
            .await,
        b"+OK\r\n"
    );
    assert_eq!(redis.direct(&["EXISTS", "a:lock:job"]).await, b":1\r\n");
    assert_eq!(
        a.call(&["EVAL", RELEASE, "1", "lock:job", "tok"]).await,
        b":1\r\n"
    );
    assert_eq!(redis.direct(&["EXISTS", "a:lock:job"]).await, b":0\r\n");
    // The same script by SHA (loaded by the operator), and any other script refused.
    redis.direct(&["SCRIPT", "LOAD", RELEASE]).await;
    assert_eq!(
        a.call(&["EVALSHA", &sha, "1", "lock:job", "tok"]).await,
        b":0\r\n"
    );
    let other = text(
        &a.call(&["EVAL", "return redis.call('keys','*')", "0"])
            .await,
    );
    assert!(other.starts_with("-NOPERM policy namespace"), "{other}");
}

/// SHA1 of a script as an operator computes it for `access.scripts` (sha1sum).
fn sha1_hex(script: &str) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("printf %s \"$0\" | sha1sum")
        .arg(script)
        .output()
        .expect("sha1sum");
    String::from_utf8_lossy(&out.stdout)[..40].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_caching_sees_only_the_tenants_keys() {
    let redis = RedisServer::start();
    let proxy = proxy_for(&redis, None).await;
    let mut cached = login(&proxy, "alice", "alicepw").await;
    cached.send(b"HELLO 3\r\n").await;
    cached.collect_frames(1, DEADLINE).await;
    // Broadcast mode: without a PREFIX it would announce every tenant's writes.
    assert_eq!(
        cached.call(&["CLIENT", "TRACKING", "ON", "BCAST"]).await,
        b"+OK\r\n"
    );
    let mut bob = login(&proxy, "bob", "bobpw").await;
    assert_eq!(bob.call(&["SET", "k", "bob"]).await, b"+OK\r\n");
    let mut alice = login(&proxy, "alice", "alicepw").await;
    assert_eq!(alice.call(&["SET", "k", "alice"]).await, b"+OK\r\n");
    // Exactly one invalidation: alice's key, under alice's name for it.
    assert_eq!(
        cached.collect_frames(1, DEADLINE).await.joined(),
        b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n"
    );
    cached
        .assert_quiet(std::time::Duration::from_millis(200))
        .await;
}

/// A tenant's overlapping BCAST prefixes that Redis 7.0–8.x would answer twice are refused by
/// the proxy (README, Known differences) in the tenant's own names for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_tracking_prefixes_are_refused_in_the_tenants_names() {
    let redis = RedisServer::start();
    let proxy = proxy_for(&redis, None).await;
    let mut alice = login(&proxy, "alice", "alicepw").await;
    let refused = alice
        .call(&[
            "CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "c", "PREFIX", "ab", "PREFIX", "a",
        ])
        .await;
    assert_eq!(
        text(&refused),
        "-ERR Prefix 'ab' overlaps with another provided prefix 'a'. Prefixes for a single \
         client must not overlap.\r\n"
    );
    assert_eq!(alice.call(&["PING"]).await, b"+PONG\r\n");
}
