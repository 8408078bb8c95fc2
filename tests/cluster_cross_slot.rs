//! Multi-key commands whose keys hash to several slots, through the proxy in front of a real
//! 3-primary Redis Cluster: the reads the proxy gathers (SUNION, SINTER, SDIFF, SINTERCARD,
//! ZDIFF, ZINTERCARD) answer what Redis answers for the same keys in one slot, which Redis
//! itself computes here (copies of the keys under one hash tag are the oracle), in the
//! client's RESP version, with Redis's WRONGTYPE and missing-key rules; and the cross-slot
//! writes still refused say which command and how to fix it (a hash tag).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::collections::HashSet;
use std::path::Path;

use common::cluster::RedisCluster;
use common::{Proxy, Raw, show};
use redis_policy_proxy::cluster::slot;

/// The kind byte of a reply (`*`, `~`, `:`, `-`…) and, for an array or set of bulk strings,
/// its members as a set: Redis leaves the order of SUNION and friends undefined.
fn as_set(reply: &[u8]) -> (u8, HashSet<String>) {
    let kind = reply[0];
    if !matches!(kind, b'*' | b'~') {
        return (kind, HashSet::new());
    }
    let header = reply.iter().position(|&b| b == b'\n').unwrap() + 1;
    let count: usize = String::from_utf8_lossy(&reply[1..header - 2])
        .parse()
        .unwrap();
    let (frames, used) = common::split_frames(&reply[header..]);
    assert_eq!(used, reply.len() - header, "{}", show(reply));
    assert_eq!(frames.len(), count, "{}", show(reply));
    let members: HashSet<String> = frames
        .iter()
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    assert_eq!(members.len(), count, "a member twice: {}", show(reply));
    (kind, members)
}

/// Asserts that `args` through the proxy, with `keys` where the `$k0`, `$k1`… placeholders
/// are, answers what Redis answers with the one-slot `copies` in their place: the same
/// error, count or set of members, of the same reply kind.
async fn same_as_one_slot(c: &mut Raw, args: &[&str], keys: &[String], copies: &[String]) {
    let fill = |names: &[String]| -> Vec<String> {
        args.iter()
            .map(|a| match a.strip_prefix("$k") {
                Some(i) => names[i.parse::<usize>().unwrap()].clone(),
                None => a.to_string(),
            })
            .collect()
    };
    let (spread, together) = (fill(keys), fill(copies));
    let slots: HashSet<u16> = (1..spread.len())
        .filter(|&i| args[i].starts_with("$k"))
        .map(|i| slot(spread[i].as_bytes()))
        .collect();
    assert!(slots.len() > 1, "{spread:?} in one slot");
    let got = c.call(&spread).await;
    let want = c.call(&together).await;
    // A sorted set's range has an order Redis defines: byte for byte. A set's has none.
    let sorted = args[0].starts_with(['Z', 'z']);
    match want[0] {
        b'*' | b'~' if !sorted => {
            assert_eq!(as_set(&got), as_set(&want), "{spread:?}: {}", show(&got))
        }
        _ => assert_eq!(show(&got), show(&want), "{spread:?}"),
    }
}

/// Sets on three primaries, members overlapping: `a` = m0…m29, `b` = every other of
/// m10…m49, `c` = every third of m0…m59; a string key on another primary; a missing key;
/// sorted sets `za` (m0…m24 scored 0, 0.1, 0.2… 0.6 over and over, so with ties and
/// scores such as 0.30000000000000004) and `zb` (every fourth of m0…m39, scored 0…39);
/// and the same keys under the hash tag `{one}` (the oracle). Returns (keys, copies), in
/// the order a, b, c, string, missing, za, zb.
async fn sets(c: &mut Raw, redis: &RedisCluster, stem: &str) -> (Vec<String>, Vec<String>) {
    let primaries = redis.primaries();
    let names = ["a", "b", "c", "s", "none", "za", "zb"];
    let keys: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, k)| redis.key_on(&primaries[i % 3], &format!("{stem}:{k}")))
        .collect();
    let copies: Vec<String> = names
        .iter()
        .map(|k| format!("{{one}}:{stem}:{k}"))
        .collect();
    let members = [
        (0..30).collect::<Vec<u32>>(),
        (10..50).step_by(2).collect(),
        (0..60).step_by(3).collect(),
    ];
    for names in [&keys, &copies] {
        for (key, ms) in names.iter().zip(&members) {
            let mut sadd = vec!["SADD".to_string(), key.clone()];
            sadd.extend(ms.iter().map(|m| format!("m{m}")));
            let added = c.call(&sadd).await;
            assert_eq!(added, format!(":{}\r\n", ms.len()).into_bytes());
        }
        assert_eq!(c.call(&["SET", &names[3], "text"]).await, b"+OK\r\n");
        let mut za = vec!["ZADD".to_string(), names[5].clone()];
        for i in 0..25u32 {
            za.push(format!("{}", f64::from(i % 7) * 0.1));
            za.push(format!("m{i}"));
        }
        assert_eq!(c.call(&za).await, b":25\r\n");
        let mut zb = vec!["ZADD".to_string(), names[6].clone()];
        for i in (0..40u32).step_by(4) {
            zb.push(i.to_string());
            zb.push(format!("m{i}"));
        }
        assert_eq!(c.call(&zb).await, b":10\r\n");
    }
    (keys, copies)
}

/// Every gathered command and argument shape checked against the one-slot oracle.
const GATHERED: &[&[&str]] = &[
    &["SUNION", "$k0", "$k1", "$k2"],
    &["SUNION", "$k0", "$k4"],
    &["SUNION", "$k4", "$k1", "$k4"],
    &["SINTER", "$k0", "$k1", "$k2"],
    &["SINTER", "$k2", "$k0"],
    &["SINTER", "$k0", "$k1", "$k4"],
    &["SINTER", "$k0", "$k0", "$k1"],
    &["SDIFF", "$k0", "$k1", "$k2"],
    &["SDIFF", "$k2", "$k0"],
    &["SDIFF", "$k0", "$k4"],
    &["SDIFF", "$k4", "$k0"],
    &["SINTERCARD", "3", "$k0", "$k1", "$k2"],
    &["SINTERCARD", "2", "$k0", "$k1", "LIMIT", "3"],
    &["SINTERCARD", "2", "$k0", "$k1", "LIMIT", "0"],
    &["SINTERCARD", "2", "$k0", "$k1", "LIMIT", "1000"],
    &["SINTERCARD", "2", "$k0", "$k4"],
    &["sunion", "$k1", "$k2"],
    // WRONGTYPE from the string key wherever it is, even next to a missing key.
    &["SUNION", "$k0", "$k3"],
    &["SINTER", "$k4", "$k3"],
    &["SDIFF", "$k3", "$k0"],
    &["SDIFF", "$k0", "$k4", "$k3"],
    &["SINTERCARD", "2", "$k3", "$k1"],
    // Sorted sets, and sets where a sorted set is expected (their members score 1).
    &["ZDIFF", "2", "$k5", "$k6", "WITHSCORES"],
    &["ZDIFF", "2", "$k5", "$k6"],
    &["ZDIFF", "3", "$k5", "$k1", "$k4", "WITHSCORES"],
    &["ZDIFF", "2", "$k0", "$k5", "WITHSCORES", "WITHSCORES"],
    &["ZDIFF", "2", "$k6", "$k0"],
    &["ZDIFF", "2", "$k4", "$k5"],
    &["zdiff", "2", "$k5", "$k3"],
    &["ZINTERCARD", "2", "$k5", "$k6"],
    &["ZINTERCARD", "3", "$k5", "$k0", "$k6", "LIMIT", "2"],
    &["ZINTERCARD", "2", "$k5", "$k4"],
    &["ZINTERCARD", "2", "$k4", "$k3"],
];

#[tokio::test]
async fn set_reads_across_slots_answer_as_one_slot_would() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(common::cluster::proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut c = Raw::connect(proxy.addr).await;
    let (keys, copies) = sets(&mut c, &redis, "xs").await;
    for args in GATHERED {
        same_as_one_slot(&mut c, args, &keys, &copies).await;
    }
    // Known members, not only "as Redis": the union, the intersection, the difference.
    let (_, union) = as_set(&c.call(&["SUNION", &keys[0], &keys[1]]).await);
    assert_eq!(union.len(), 30 + 10);
    let (_, inter) = as_set(&c.call(&["SINTER", &keys[0], &keys[1], &keys[2]]).await);
    let want: HashSet<String> = ["m12", "m18", "m24"]
        .iter()
        .map(|m| format!("${}\r\n{m}\r\n", m.len()))
        .collect();
    assert_eq!(inter, want);
    assert_eq!(
        c.call(&[
            "SINTERCARD",
            "3",
            &keys[0],
            &keys[1],
            &keys[2],
            "LIMIT",
            "2"
        ])
        .await,
        b":2\r\n"
    );
    // RESP3: a set reply (`~`), as Redis gives it, and the count still an integer.
    let hello = c.call(&["HELLO", "3"]).await;
    assert!(hello.starts_with(b"%"), "{}", show(&hello));
    for args in GATHERED {
        same_as_one_slot(&mut c, args, &keys, &copies).await;
    }
    let union = c.call(&["SUNION", &keys[0], &keys[1]]).await;
    assert!(union.starts_with(b"~40\r\n"), "{}", show(&union));
    // The gathered reply keeps its place in a pipeline between single-slot commands.
    let got = c
        .request(
            &[
                common::resp(&["SADD", &keys[4], "late"]),
                common::resp(&["SINTER", &keys[4], &keys[0]]),
                common::resp(&["SDIFF", &keys[4], &keys[1]]),
                common::resp(&["DEL", &keys[4]]),
            ]
            .concat(),
            4,
        )
        .await;
    assert_eq!(
        show(&got),
        show(b":1\r\n~0\r\n~1\r\n$4\r\nlate\r\n:1\r\n"),
        "pipeline"
    );
    // Inside MULTI a transaction runs on one node: refused, saying so, and EXEC aborts.
    assert_eq!(c.call(&["MULTI"]).await, b"+OK\r\n");
    let refused = c.call(&["SUNION", &keys[0], &keys[1]]).await;
    assert_eq!(
        show(&refused),
        show(
            b"-CROSSSLOT Keys in request don't hash to the same slot (SUNION cannot span slots \
              inside MULTI: put its keys in one slot with a hash tag, e.g. {user1}:a and \
              {user1}:b)\r\n"
        )
    );
    let exec = c.call(&["EXEC"]).await;
    assert!(exec.starts_with(b"-EXECABORT"), "{}", show(&exec));
    // Under WATCH the session is held on the watched key's node: refused, saying why, and
    // gathered again once the watch is gone.
    assert_eq!(c.call(&["WATCH", &keys[0]]).await, b"+OK\r\n");
    let refused = String::from_utf8(c.call(&["SUNION", &keys[0], &keys[1]]).await).unwrap();
    assert!(
        refused.starts_with(
            "-CROSSSLOT Keys in request don't hash to the same slot (SUNION cannot span slots \
             while the connection holds state on one node"
        ),
        "{refused}"
    );
    assert_eq!(c.call(&["UNWATCH"]).await, b"+OK\r\n");
    let union = c.call(&["SUNION", &keys[0], &keys[1]]).await;
    assert!(union.starts_with(b"~40\r\n"), "{}", show(&union));
    proxy.stop().await;

    // A namespaced tenant: its keys are prefixed before they are placed, so the sets are
    // found under the prefix, and the members come back without one (they are not names).
    const ALICE: &str = "6624974ea2baffac164422e4490376c1c31313cd97724ae8ce62fb3f0a0370f2"; // alicepw
    let yaml = format!(
        "upstream:\n  mode: cluster\n  cluster:\n    seeds: [{}]\naccess:\n  users:\n    - {{name: alice, password_sha256: {ALICE}}}\n  identities:\n    - {{tenant: a, user: alice}}\n  namespaces:\n    a: 'a:'\n",
        redis.live_addrs()[0]
    );
    let config = redis_policy_proxy::setup::from_yaml(&yaml, Path::new("ns.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut alice = Raw::connect(proxy.addr).await;
    assert_eq!(alice.call(&["AUTH", "alice", "alicepw"]).await, b"+OK\r\n");
    let (mine, theirs) = (["n1", "n2"], ["a:n1", "a:n2"]);
    assert_ne!(slot(theirs[0].as_bytes()), slot(theirs[1].as_bytes()));
    assert_eq!(alice.call(&["SADD", mine[0], "x", "y"]).await, b":2\r\n");
    assert_eq!(alice.call(&["SADD", mine[1], "y", "z"]).await, b":2\r\n");
    let owner = redis.primary_for_slot(slot(theirs[0].as_bytes()));
    assert_eq!(
        Raw::connect(&owner).await.call(&["SCARD", theirs[0]]).await,
        b":2\r\n"
    );
    let (_, union) = as_set(&alice.call(&["SUNION", mine[0], mine[1]]).await);
    let want: HashSet<String> = ["x", "y", "z"]
        .iter()
        .map(|m| format!("$1\r\n{m}\r\n"))
        .collect();
    assert_eq!(union, want);
    assert_eq!(
        show(&alice.call(&["SDIFF", mine[0], mine[1]]).await),
        show(b"*1\r\n$1\r\nx\r\n")
    );
    proxy.stop().await;
}

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
