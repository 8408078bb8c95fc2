//! CONFIG GET never hands a client the upstream's credentials: the secret parameters' pairs
//! are removed from the reply (RESP2 arrays and RESP3 maps), whatever pattern matched them,
//! and everything else comes back as Redis sent it.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::{Proxy, Raw, RedisServer};

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_get_never_answers_the_upstreams_secrets() {
    let redis = RedisServer::start_with(&[
        "--requirepass",
        "upstream-secret-1",
        "--masterauth",
        "replication-secret-2",
        "--masteruser",
        "replicator",
    ]);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let mut config = redis_policy_proxy::setup::from_yaml(&yaml, &path).unwrap();
    config.set_upstream(redis.addr());
    config.upstream.password = Some("upstream-secret-1".into());
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    let secrets = ["upstream-secret-1", "replication-secret-2", "replicator"];
    for pattern in [
        "requirepass",
        "masterauth",
        "MASTERUSER",
        "*",
        "*pass*",
        "*auth*",
        "re*",
    ] {
        let reply = text(&c.call(&["CONFIG", "GET", pattern]).await);
        assert!(reply.starts_with('*'), "{pattern}: {reply}");
        for secret in secrets {
            assert!(!reply.contains(secret), "{pattern}: {reply}");
        }
    }
    assert_eq!(
        c.call(&["CONFIG", "GET", "requirepass"]).await,
        b"*0\r\n".to_vec()
    );
    // Everything else, as Redis sends it.
    assert_eq!(
        c.call(&["CONFIG", "GET", "maxmemory-policy"]).await,
        b"*2\r\n$16\r\nmaxmemory-policy\r\n$10\r\nnoeviction\r\n".to_vec()
    );
    let all = text(&c.call(&["CONFIG", "GET", "*"]).await);
    assert!(
        all.contains("maxmemory-policy") && all.contains("appendonly"),
        "{all}"
    );
    // RESP3: a map.
    let mut c3 = Raw::connect(proxy.addr).await;
    assert!(c3.call(&["HELLO", "3"]).await.starts_with(b"%"));
    let reply = text(&c3.call(&["CONFIG", "GET", "*"]).await);
    assert!(
        reply.starts_with('%') && reply.contains("maxmemory-policy"),
        "{reply}"
    );
    for secret in secrets {
        assert!(!reply.contains(secret), "{reply}");
    }
    assert_eq!(
        c3.call(&["CONFIG", "GET", "requirepass", "maxmemory-policy"])
            .await,
        b"%1\r\n$16\r\nmaxmemory-policy\r\n$10\r\nnoeviction\r\n".to_vec()
    );
    // Inside MULTI the reply would come back in EXEC's: refused, saying why.
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    let reply = text(&c.call(&["CONFIG", "GET", "*"]).await);
    assert!(
        reply.starts_with("-ERR CONFIG GET is not available inside MULTI"),
        "{reply}"
    );
    assert!(c.call(&["EXEC"]).await.starts_with(b"-EXECABORT"));
}
