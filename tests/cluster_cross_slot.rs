//! Multi-key commands whose keys hash to several slots, through the proxy in front of a real
//! 3-primary Redis Cluster: the cross-slot writes refused say which command and how to fix
//! it (a hash tag).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::cluster::RedisCluster;
use common::{Proxy, Raw, show};

#[tokio::test]
async fn cross_slot_writes_are_refused_naming_the_command_and_the_fix() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(common::cluster::proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut c = Raw::connect(proxy.addr).await;
    let primaries = redis.primaries();
    let (a, b) = (
        redis.key_on(&primaries[0], "w"),
        redis.key_on(&primaries[1], "w"),
    );
    assert_eq!(c.call(&["SADD", &a, "1"]).await, b":1\r\n");
    assert_eq!(c.call(&["RPUSH", &b, "1"]).await, b":1\r\n");
    let refusal = |command: &str, why: &str| {
        format!(
            "-CROSSSLOT Keys in request don't hash to the same slot ({command} {why}: put its \
             keys in one slot with a hash tag, e.g. {{user1}}:a and {{user1}}:b)\r\n"
        )
    };
    let writes: &[&[&str]] = &[
        &["SUNIONSTORE", &a, &b],
        &["sinterstore", &a, &b],
        &["SDIFFSTORE", &a, &b],
        &["ZUNIONSTORE", &a, "1", &b],
        &["RENAME", &a, &b],
        &["COPY", &a, &b],
        &["SMOVE", &a, &b, "1"],
        &["LMOVE", &b, &a, "LEFT", "RIGHT"],
        &["MSETNX", &a, "1", &b, "2"],
    ];
    for args in writes {
        let name = args[0].to_ascii_uppercase();
        assert_eq!(
            show(&c.call(args).await),
            show(refusal(&name, "writes atomically and cannot span slots").as_bytes()),
        );
    }
    // Reads the proxy does not gather say so too, without claiming they write.
    assert_eq!(
        show(&c.call(&["PFCOUNT", &a, &b]).await),
        show(refusal("PFCOUNT", "cannot span slots").as_bytes())
    );
    // Nothing was written, and the same commands in one slot (a hash tag) run.
    assert_eq!(c.call(&["SMEMBERS", &a]).await, b"*1\r\n$1\r\n1\r\n");
    assert_eq!(c.call(&["LLEN", &b]).await, b":1\r\n");
    assert_eq!(c.call(&["SADD", "{user1}:a", "1", "2"]).await, b":2\r\n");
    assert_eq!(c.call(&["SADD", "{user1}:b", "2", "3"]).await, b":2\r\n");
    assert_eq!(
        c.call(&["SINTERSTORE", "{user1}:c", "{user1}:a", "{user1}:b"])
            .await,
        b":1\r\n"
    );
    proxy.stop().await;
}
