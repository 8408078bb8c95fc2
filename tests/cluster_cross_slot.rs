//! Multi-key commands whose keys hash to several slots, through the proxy in front of a real
//! 3-primary Redis Cluster: the reads the proxy gathers (SUNION, SINTER, SDIFF, SINTERCARD,
//! ZUNION, ZINTER, ZDIFF, ZINTERCARD, PFCOUNT) answer what Redis answers for the same keys in
//! one slot, byte for byte where Redis defines the order, which Redis itself computes here
//! (copies of the keys under one hash tag are the oracle), in the client's RESP version, with
//! Redis's WRONGTYPE and missing-key rules; and the cross-slot writes still refused say which
//! command and how to fix it (a hash tag).

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
/// scores such as 0.30000000000000004), `zb` (every fourth of m0…m39, scored 0…39) and
/// `zi` (m0…m4 scored inf, -inf, 1e300, -0, 2.5); and the same keys under the hash tag
/// `{one}` (the oracle). Returns (keys, copies), in the order a, b, c, string, missing, za,
/// zb, zi.
async fn sets(c: &mut Raw, redis: &RedisCluster, stem: &str) -> (Vec<String>, Vec<String>) {
    let primaries = redis.primaries();
    let names = ["a", "b", "c", "s", "none", "za", "zb", "zi"];
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
        let zi = [
            "ZADD", &names[7], "inf", "m0", "-inf", "m1", "1e300", "m2", "-0", "m3", "2.5", "m4",
        ];
        assert_eq!(c.call(&zi).await, b":5\r\n");
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
    // ZUNION and ZINTER: scores computed by the proxy, in Redis's order and format.
    &["ZUNION", "2", "$k5", "$k6", "WITHSCORES"],
    &["ZUNION", "2", "$k5", "$k6"],
    &["ZUNION", "3", "$k5", "$k6", "$k0", "WITHSCORES"],
    &[
        "ZUNION",
        "3",
        "$k5",
        "$k6",
        "$k0",
        "WEIGHTS",
        "0.1",
        "2",
        "-1",
        "WITHSCORES",
    ],
    &[
        "ZUNION",
        "3",
        "$k5",
        "$k1",
        "$k4",
        "AGGREGATE",
        "MIN",
        "WITHSCORES",
    ],
    &[
        "zunion",
        "2",
        "$k5",
        "$k6",
        "aggregate",
        "max",
        "weights",
        "1.5",
        "0.3",
        "withscores",
    ],
    &[
        "ZUNION",
        "3",
        "$k5",
        "$k6",
        "$k5",
        "WITHSCORES",
        "AGGREGATE",
        "SUM",
    ],
    &[
        "ZUNION",
        "2",
        "$k5",
        "$k6",
        "WEIGHTS",
        "1",
        "1",
        "WEIGHTS",
        "0x1p-3",
        "3",
        "WITHSCORES",
    ],
    &[
        "ZUNION",
        "2",
        "$k7",
        "$k5",
        "WEIGHTS",
        "0",
        "1",
        "WITHSCORES",
    ],
    &[
        "ZUNION",
        "2",
        "$k7",
        "$k0",
        "WEIGHTS",
        "1",
        "-inf",
        "WITHSCORES",
    ],
    &[
        "ZUNION",
        "2",
        "$k7",
        "$k0",
        "WEIGHTS",
        "10",
        "inf",
        "AGGREGATE",
        "MAX",
        "WITHSCORES",
    ],
    &[
        "ZUNION",
        "2",
        "$k7",
        "$k6",
        "WEIGHTS",
        "-1",
        "1",
        "WITHSCORES",
    ],
    &["ZUNION", "2", "$k4", "$k7", "WITHSCORES"],
    &["ZINTER", "2", "$k5", "$k6", "WITHSCORES"],
    &["ZINTER", "2", "$k5", "$k6"],
    &[
        "ZINTER",
        "3",
        "$k5",
        "$k0",
        "$k6",
        "WEIGHTS",
        "1",
        "0.5",
        "3",
        "WITHSCORES",
    ],
    &[
        "ZINTER",
        "2",
        "$k5",
        "$k2",
        "AGGREGATE",
        "MAX",
        "WITHSCORES",
    ],
    &[
        "ZINTER",
        "2",
        "$k7",
        "$k0",
        "WEIGHTS",
        "1",
        "0",
        "WITHSCORES",
    ],
    &[
        "ZINTER",
        "2",
        "$k7",
        "$k5",
        "WEIGHTS",
        "0",
        "-2",
        "AGGREGATE",
        "MIN",
        "WITHSCORES",
    ],
    &["ZINTER", "2", "$k5", "$k4", "WITHSCORES"],
    &["ZINTER", "2", "$k0", "$k1", "WITHSCORES"],
    &["ZUNION", "2", "$k5", "$k3", "WITHSCORES"],
    &["ZINTER", "2", "$k4", "$k3"],
    &["zinter", "3", "$k3", "$k5", "$k6"],
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

/// PFADDs `elements` (`e0`, `e1`…) to `key`, a thousand per command.
async fn pfadd(c: &mut Raw, key: &str, elements: impl Iterator<Item = u32>) {
    let elements: Vec<String> = elements.map(|e| format!("e{e}")).collect();
    for chunk in elements.chunks(1000) {
        let mut args = vec!["PFADD".to_string(), key.to_string()];
        args.extend(chunk.iter().cloned());
        let added = c.call(&args).await;
        assert!(added.starts_with(b":"), "{}", show(&added));
    }
}

#[tokio::test]
async fn pfcount_across_slots_counts_as_one_redis() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(common::cluster::proxy_config(&redis.live_addrs()[0], &[])).await;
    let mut c = Raw::connect(proxy.addr).await;
    let primaries = redis.primaries();
    // Per case, 3 keys on 3 primaries (and their one-slot copies) sharing `n` elements:
    // each element in one key, every seventh in the next key too. Small cases stay sparse,
    // large ones turn dense; the last mixes a dense key, a sparse one and a missing one.
    let mut cases: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    for n in [0u32, 1, 100, 5000, 200_000] {
        let stem = format!("hll{n}");
        let keys: Vec<String> = (0..3)
            .map(|i| redis.key_on(&primaries[i], &format!("{stem}:{i}")))
            .collect();
        let copies: Vec<String> = (0..3).map(|i| format!("{{one}}:{stem}:{i}")).collect();
        for names in [&keys, &copies] {
            for (i, key) in names.iter().enumerate() {
                let i = i as u32;
                let mine = (0..n).filter(|e| e % 3 == i || (e % 7 == 0 && (e + 1) % 3 == i));
                pfadd(&mut c, key, mine).await;
            }
        }
        cases.push((keys, copies));
    }
    let keys: Vec<String> = (0..3)
        .map(|i| redis.key_on(&primaries[i], &format!("mixed:{i}")))
        .collect();
    let copies: Vec<String> = (0..3).map(|i| format!("{{one}}:mixed:{i}")).collect();
    for names in [&keys, &copies] {
        pfadd(&mut c, &names[0], 0..20_000).await;
        pfadd(&mut c, &names[1], 19_990..20_010).await;
    }
    cases.push((keys, copies));
    // Not HyperLogLogs: a string, a set; and a sparse one whose runs stop one register short.
    let (text, set, corrupt) = (
        redis.key_on(&primaries[1], "hll:text"),
        redis.key_on(&primaries[2], "hll:set"),
        redis.key_on(&primaries[0], "hll:corrupt"),
    );
    let short: &[u8] = b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\0\x7f\xfe";
    let tagged = ["{one}:text", "{one}:set", "{one}:corrupt"].map(String::from);
    for [t, s, x] in [
        [&text, &set, &corrupt],
        [&tagged[0], &tagged[1], &tagged[2]],
    ] {
        assert_eq!(c.call(&["SET", t, "not an hll value"]).await, b"+OK\r\n");
        assert_eq!(c.call(&["SADD", s, "x"]).await, b":1\r\n");
        let set_corrupt: [&[u8]; 3] = [b"SET", x.as_bytes(), short];
        assert_eq!(c.call(&set_corrupt).await, b"+OK\r\n");
    }
    for proto in ["2", "3"] {
        let hello = c.call(&["HELLO", proto]).await;
        assert!(
            hello.starts_with(b"%") || hello.starts_with(b"*"),
            "{}",
            show(&hello)
        );
        for (keys, copies) in &cases {
            let mut keys = keys.clone();
            let mut copies = copies.clone();
            keys.extend([text.clone(), set.clone(), corrupt.clone()]);
            copies.extend(tagged.iter().cloned());
            for args in [
                &["PFCOUNT", "$k0", "$k1", "$k2"][..],
                &["PFCOUNT", "$k1", "$k2"],
                &["pfcount", "$k2", "$k0", "$k0"],
                &["PFCOUNT", "$k0", "$k3"],
                &["PFCOUNT", "$k4", "$k1", "$k3"],
                &["PFCOUNT", "$k1", "$k5"],
                &["PFCOUNT", "$k5", "$k3"],
            ] {
                same_as_one_slot(&mut c, args, &keys, &copies).await;
            }
        }
    }
    // Both encodings were read: the small cases' keys are sparse, the large ones dense.
    let encoding = |key: &String| ["GETRANGE".to_string(), key.clone(), "4".into(), "4".into()];
    assert_eq!(c.call(&encoding(&cases[2].0[0])).await, b"$1\r\n\x01\r\n");
    assert_eq!(c.call(&encoding(&cases[4].0[0])).await, b"$1\r\n\x00\r\n");
    assert_eq!(c.call(&encoding(&cases[5].0[1])).await, b"$1\r\n\x01\r\n");
    // Known counts, not only "as Redis": nothing, and one element.
    assert_eq!(
        c.call(&["PFCOUNT", &cases[0].0[0], &cases[0].0[1]]).await,
        b":0\r\n"
    );
    let one = &cases[1].0;
    assert_eq!(
        c.call(&["PFCOUNT", &one[0], &one[1], &one[2]]).await,
        b":1\r\n"
    );
    assert_eq!(
        c.call(&["PFCOUNT", &one[1], &corrupt]).await,
        b"-INVALIDOBJ Corrupted HLL object detected\r\n"
    );
    assert_eq!(
        c.call(&["PFCOUNT", &text, &one[0]]).await,
        b"-WRONGTYPE Key is not a valid HyperLogLog string value.\r\n"
    );
    let big = c
        .call(&["PFCOUNT", &cases[4].0[0], &cases[4].0[1], &cases[4].0[2]])
        .await;
    let big: f64 = String::from_utf8_lossy(&big[1..big.len() - 2])
        .parse()
        .unwrap();
    assert!((big - 200_000.0).abs() < 200_000.0 * 0.02, "{big}");
    proxy.stop().await;
}

/// Random doubles over the whole range (any exponent, subnormals, integers, short
/// decimals), none infinite or NaN: a xorshift from `seed`, so a failure repeats.
fn random_doubles(seed: u64, n: usize) -> Vec<f64> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let r = next();
        let v = match r % 4 {
            0 => f64::from_bits(next()),
            1 => (next() % 2_000_000) as f64 / 1000.0 - 1000.0,
            2 => (next() % (1 << 62)) as f64 * if r & 8 == 0 { 1.0 } else { 1e-9 },
            _ => f64::from_bits(next() >> 1) * if r & 16 == 0 { 1.0 } else { -1.0 },
        };
        if v.is_finite() {
            out.push(v);
        }
    }
    out
}

/// On every server of the matrix (Redis 8.0 and Valkey 9.1 write doubles in their own
/// shortest form, Redis 7.0 as `%.17g`), ZUNION and ZINTER across slots answer byte for byte
/// what the server answers for the same keys in one slot, in RESP2 and RESP3: the fixed
/// forms of `GATHERED`, and 20,000 random scores, each written back as it is (AGGREGATE MAX
/// against -inf) and added to another (SUM). PFCOUNT, whose reply is an integer, is gathered
/// there too.
#[tokio::test]
async fn zunion_scores_read_as_each_server_writes_them() {
    let mut servers = vec![("default", common::server_binary())];
    servers.extend(common::matrix_servers());
    for (name, bin) in servers {
        let redis = RedisCluster::start_binary(&bin, 3, 0, &[]);
        let proxy = Proxy::start(common::cluster::proxy_config(&redis.live_addrs()[0], &[])).await;
        let mut c = Raw::connect(proxy.addr).await;
        let (keys, copies) = sets(&mut c, &redis, "fmt").await;
        let primaries = redis.primaries();
        let random: Vec<String> = (0..2)
            .map(|i| redis.key_on(&primaries[i], &format!("fmt:r{i}")))
            .collect();
        let random_copies = ["{one}:fmt:r0".to_string(), "{one}:fmt:r1".to_string()];
        let scores = random_doubles(0x5eed_0000 + name.len() as u64, 20_000);
        for names in [&random[..], &random_copies[..]] {
            for (k, half) in scores.chunks(10_000).enumerate() {
                let mut zadd = vec!["ZADD".to_string(), names[k].clone()];
                for (i, v) in half.iter().enumerate() {
                    zadd.push(format!("{v:e}"));
                    zadd.push(format!("m{i}"));
                }
                assert_eq!(c.call(&zadd).await, b":10000\r\n", "{name}");
            }
        }
        let forms: Vec<Vec<&str>> = [
            "ZUNION 2 $k0 $k1 WEIGHTS 1 -inf AGGREGATE MAX WITHSCORES",
            "ZUNION 2 $k1 $k0 WEIGHTS 1 -inf AGGREGATE MAX WITHSCORES",
            "ZUNION 2 $k0 $k1 WITHSCORES",
            "ZINTER 2 $k0 $k1 WEIGHTS 0.1 3 WITHSCORES",
        ]
        .iter()
        .map(|f| f.split(' ').collect())
        .collect();
        for proto in [2, 3] {
            if proto == 3 {
                assert!(c.call(&["HELLO", "3"]).await.starts_with(b"%"));
            }
            for args in GATHERED.iter().filter(|a| a[0].starts_with(['Z', 'z'])) {
                let hex = args
                    .iter()
                    .any(|a| a.to_ascii_lowercase().starts_with("0x"));
                if hex && name.starts_with("valkey") {
                    // Valkey reads no hexadecimal float, so its one-slot answer is an error;
                    // across slots Redis Cluster checks the slots first.
                    let spread: Vec<&str> = args
                        .iter()
                        .map(|a| match a.strip_prefix("$k") {
                            Some(i) => keys[i.parse::<usize>().unwrap()].as_str(),
                            None => a,
                        })
                        .collect();
                    let refused = c.call(&spread).await;
                    assert!(
                        refused.starts_with(b"-CROSSSLOT"),
                        "{name}: {}",
                        show(&refused)
                    );
                    continue;
                }
                same_as_one_slot(&mut c, args, &keys, &copies).await;
            }
            for args in &forms {
                same_as_one_slot(&mut c, args, &random, &random_copies).await;
            }
        }
        let mut c = Raw::connect(proxy.addr).await;
        let hll = [
            redis.key_on(&primaries[1], "fmt:hll"),
            redis.key_on(&primaries[2], "fmt:nohll"),
        ];
        pfadd(&mut c, &hll[0], 0..3000).await;
        pfadd(&mut c, "{one}:fmt:hll", 0..3000).await;
        let hll_copies = ["{one}:fmt:hll".to_string(), "{one}:fmt:nohll".to_string()];
        same_as_one_slot(&mut c, &["PFCOUNT", "$k0", "$k1"], &hll, &hll_copies).await;
        proxy.stop().await;
    }
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
        &["ZINTERSTORE", &a, "2", &a, &b, "WEIGHTS", "1", "2"],
        &["ZDIFFSTORE", &a, "1", &b],
        &["PFMERGE", &a, &b],
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
        show(&c.call(&["LCS", &a, &b]).await),
        show(refusal("LCS", "cannot span slots").as_bytes())
    );
    // A gathered read with options Redis refuses is not gathered: CROSSSLOT, as Redis
    // Cluster answers it.
    assert_eq!(
        show(&c.call(&["ZUNION", "2", &a, &b, "WEIGHTS", "1"]).await),
        show(refusal("ZUNION", "cannot span slots").as_bytes())
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

/// Each of `forms` through the proxy (`c`) answers byte for byte what the oracle (`o`, one
/// standalone Redis holding the same data) answers, in RESP2 and then RESP3; none is a form
/// the oracle refuses as a syntax error (the test would then compare nothing).
async fn answer_as_the_oracle<'a, F: AsRef<[&'a str]>>(c: &mut Raw, o: &mut Raw, forms: &[F]) {
    for proto in ["2", "3"] {
        if proto == "3" {
            assert!(c.call(&["HELLO", "3"]).await.starts_with(b"%"));
            assert!(o.call(&["HELLO", "3"]).await.starts_with(b"%"));
        }
        for form in forms {
            let form = form.as_ref();
            let want = o.call(form).await;
            assert!(
                !want.starts_with(b"-ERR syntax"),
                "the oracle refused {form:?}: {}",
                show(&want)
            );
            assert_eq!(
                show(&c.call(form).await),
                show(&want),
                "RESP{proto}: {form:?}"
            );
        }
    }
}

/// SORT with `BY` and `GET` patterns, whose keys are on every node, which Redis Cluster
/// refuses to any client: through the proxy it answers byte for byte what one Redis answers
/// for the same data (the oracle, a standalone server written the same way), in RESP2 and
/// RESP3: sorted by weight (floats, missing ones, ones of another type), by hash field, with
/// LIMIT, DESC, ALPHA, `GET #`, missing and constant GETs, Redis's errors; with STORE it stays
/// refused (a write across slots).
#[tokio::test]
async fn sort_by_and_get_patterns_answer_as_one_redis() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(common::cluster::proxy_config(&redis.live_addrs()[0], &[])).await;
    let oracle = common::RedisServer::start();
    let mut c = Raw::connect(proxy.addr).await;
    let mut o = Raw::connect(oracle.addr()).await;
    let mut rng = common::Rng(0x5eed_5012);
    let words = [
        "apple", "kiwi", "fig", "date", "lime", "pear", "plum", "yuzu",
    ];
    let mut writes: Vec<Vec<String>> = Vec::new();
    for i in 0..40u64 {
        writes.push(vec!["RPUSH".into(), "tosort".into(), (i % 37).to_string()]);
        writes.push(vec!["SADD".into(), "myset".into(), format!("m{i}")]);
        writes.push(vec![
            "ZADD".into(),
            "zs".into(),
            rng.below(100).to_string(),
            format!("z{i}"),
        ]);
        let w = match rng.below(10) {
            // Missing (0 when sorting, nil when got), of another type (the same), a float.
            0 => None,
            1 => {
                writes.push(vec!["LPUSH".into(), format!("weight_{i}"), "x".into()]);
                None
            }
            n => Some(format!("{}.{}", rng.below(1000), n)),
        };
        if let Some(w) = &w {
            writes.push(vec!["SET".into(), format!("weight_{i}"), w.clone()]);
        }
        writes.push(vec![
            "HSET".into(),
            format!("wobj_{i}"),
            "weight".into(),
            rng.below(50).to_string(),
        ]);
        writes.push(vec![
            "SET".into(),
            format!("word_{i}"),
            // Distinct: Redis leaves the order of equal ALPHA weights undefined.
            format!("{}{i}", words[rng.below(words.len())]),
        ]);
        writes.push(vec![
            "SET".into(),
            format!("bad_{i}"),
            if i == 7 { "nope".into() } else { i.to_string() },
        ]);
    }
    writes.push(vec!["SET".into(), "str".into(), "v".into()]);
    for w in &writes {
        let reply = c.call(w).await;
        assert_eq!(reply, o.call(w).await, "{w:?}");
    }
    let forms: &[&[&str]] = &[
        &["SORT", "tosort", "BY", "weight_*"],
        &[
            "SORT", "tosort", "BY", "weight_*", "DESC", "LIMIT", "3", "7",
        ],
        &["SORT", "tosort", "BY", "weight_*", "LIMIT", "-5", "-1"],
        &["SORT", "tosort", "BY", "weight_*", "LIMIT", "60", "5"],
        &[
            "SORT",
            "tosort",
            "BY",
            "wobj_*->weight",
            "GET",
            "#",
            "GET",
            "weight_*",
        ],
        &[
            "SORT",
            "tosort",
            "GET",
            "wobj_*->weight",
            "GET",
            "nokey",
            "GET",
            "missing_*",
        ],
        &["SORT", "tosort", "GET", "#", "DESC"],
        &[
            "SORT", "tosort", "BY", "nosort", "GET", "weight_*", "LIMIT", "2", "5",
        ],
        // A constant BY first: nothing is sorted, the later pattern is never read.
        &[
            "SORT", "tosort", "BY", "nosort", "BY", "weight_*", "GET", "#", "DESC",
        ],
        &[
            "SORT_RO", "tosort", "BY", "word_*", "ALPHA", "GET", "#", "GET", "word_*",
        ],
        &[
            "SORT", "tosort", "BY", "word_*", "ALPHA", "DESC", "LIMIT", "0", "10",
        ],
        &["SORT", "myset", "BY", "score:*"],
        &[
            "SORT",
            "myset",
            "BY",
            "weight_*",
            "GET",
            "#",
            "GET",
            "wobj_*->weight",
        ],
        &["SORT", "zs", "BY", "wobj_*->weight", "GET", "#"],
        &[
            "SORT", "zs", "BY", "nosort", "DESC", "LIMIT", "0", "4", "GET", "#",
        ],
        &["SORT", "tosort", "BY", "bad_*"],
        &["SORT", "str", "BY", "weight_*"],
        &["SORT", "nokey", "BY", "weight_*", "GET", "#"],
    ];
    answer_as_the_oracle(&mut c, &mut o, forms).await;
    let store = c
        .call(&["SORT", "tosort", "BY", "weight_*", "STORE", "dst"])
        .await;
    assert!(store.starts_with(b"-CROSSSLOT"), "{}", show(&store));
    // The proxy reads at most 100,000 keys for one SORT (40 elements x 2,501 GETs is more):
    // refused, saying why, and the connection goes on.
    let mut huge = vec!["SORT", "tosort"];
    for _ in 0..2_501 {
        huge.extend(["GET", "weight_*"]);
    }
    let refused = c.call(&huge).await;
    assert!(
        refused.starts_with(b"-ERR SORT with BY/GET patterns across a cluster"),
        "{}",
        show(&refused)
    );
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
    // A list with a weight to read for more elements than that: refused, its node asked for
    // one element past the bound, not the whole list; a window the node cuts is answered.
    let numbers: Vec<String> = (0..=100_000).map(|n| n.to_string()).collect();
    let mut push = vec!["RPUSH", "long"];
    push.extend(numbers.iter().map(String::as_str));
    assert_eq!(c.call(&push).await, b":100001\r\n");
    for form in [
        &["SORT", "long", "BY", "weight_*"][..],
        &["SORT", "long", "BY", "weight_*", "LIMIT", "0", "1"],
        &["SORT", "long", "GET", "#"],
    ] {
        let refused = c.call(form).await;
        assert!(
            refused.starts_with(b"-ERR SORT with BY/GET patterns across a cluster"),
            "{form:?}: {}",
            show(&refused)
        );
    }
    assert_eq!(
        c.call(&["SORT", "long", "GET", "#", "DESC", "LIMIT", "0", "2"])
            .await,
        b"*2\r\n$6\r\n100000\r\n$5\r\n99999\r\n"
    );
}

/// XREAD of streams in several slots (without BLOCK) answers byte for byte what one Redis
/// answers for the same streams (the oracle, a standalone server written the same way), in
/// RESP2 and RESP3: the streams with entries in the order asked, COUNT per stream, a null
/// when none has any, Redis's errors; with BLOCK the same when any stream has entries, and a
/// null once the timeout passed when none has.
#[tokio::test]
async fn xread_across_slots_answers_as_one_redis() {
    let redis = RedisCluster::start(3, 0);
    let proxy = Proxy::start(common::cluster::proxy_config(&redis.live_addrs()[0], &[])).await;
    let oracle = common::RedisServer::start();
    let mut c = Raw::connect(proxy.addr).await;
    let mut o = Raw::connect(oracle.addr()).await;
    // One stream on each primary and one with no entries, in an order that crosses nodes.
    let mut streams: Vec<String> = redis
        .primaries()
        .iter()
        .map(|p| redis.key_on(p, "stream"))
        .collect();
    streams.reverse();
    streams.push("empty-stream".into());
    for (i, s) in streams.iter().take(3).enumerate() {
        for e in 1..=3 {
            let (id, value) = (format!("{e}-{i}"), format!("v{i}.{e}"));
            let add = ["XADD", s.as_str(), id.as_str(), "f", value.as_str()];
            assert_eq!(c.call(&add).await, o.call(&add).await, "{add:?}");
        }
    }
    let set = ["SET", "a-string", "v"];
    assert_eq!(c.call(&set).await, o.call(&set).await);
    let s: Vec<&str> = streams.iter().map(String::as_str).collect();
    let forms: Vec<Vec<&str>> = vec![
        vec![
            "XREAD", "STREAMS", s[0], s[1], s[2], s[3], "0", "0", "0", "0",
        ],
        vec!["xread", "count", "2", "streams", s[2], s[0], "1-0", "0"],
        vec![
            "XREAD", "COUNT", "1", "COUNT", "5", "STREAMS", s[1], s[3], "0", "0",
        ],
        vec!["XREAD", "STREAMS", s[0], s[1], "9-0", "9-0"],
        vec!["XREAD", "STREAMS", s[3], s[0], "$", "$"],
        vec!["XREAD", "STREAMS", s[0], s[1], "0", "not-an-id"],
        vec!["XREAD", "STREAMS", s[0], "a-string", "0", "0"],
        vec!["XREAD", "BLOCK", "10", "STREAMS", s[0], s[1], "0", "0"],
        vec![
            "XREAD", "COUNT", "1", "BLOCK", "0", "STREAMS", s[2], s[3], s[1], "0", "0", "2-1",
        ],
        vec![
            "XREAD", "BLOCK", "20", "STREAMS", s[0], s[1], s[3], "9-0", "9-0", "$",
        ],
        vec![
            "XREAD", "BLOCK", "20", "STREAMS", s[0], "a-string", "9-0", "0",
        ],
    ];
    answer_as_the_oracle(&mut c, &mut o, &forms).await;
}

/// XREAD … BLOCK of streams in several slots blocks on each slot's node until one stream
/// gets an entry, which answers it (the streams without one are not named, as one Redis
/// answers); commands pipelined after it are answered after it; and a client that leaves
/// while it blocks leaves no blocked connection on any node.
#[tokio::test]
async fn xread_block_across_slots_waits_for_any_stream() {
    let redis = RedisCluster::start(3, 0);
    let primaries = redis.primaries();
    let proxy = Proxy::start(common::cluster::proxy_config(&primaries[0], &[])).await;
    let streams: Vec<String> = primaries
        .iter()
        .map(|p| redis.key_on(p, "waited"))
        .collect();
    let s: Vec<&str> = streams.iter().map(String::as_str).collect();
    let mut writer = Raw::connect(proxy.addr).await;
    for proto in ["2", "3"] {
        let mut c = Raw::connect(proxy.addr).await;
        if proto == "3" {
            assert!(c.call(&["HELLO", "3"]).await.starts_with(b"%"));
        }
        let mut read = vec!["XREAD", "BLOCK", "0", "STREAMS"];
        read.extend(&s);
        read.extend(["$", "$", "$"]);
        let mut pipeline = common::resp(&read);
        pipeline.extend(common::resp(&["PING"]));
        c.send(&pipeline).await;
        common::cluster::wait_blocked_on(&primaries, 3).await;
        let id = format!("{proto}-1");
        assert_eq!(
            writer.call(&["XADD", s[1], &id, "f", "v"]).await,
            format!("${}\r\n{id}\r\n", id.len()).as_bytes()
        );
        let got = c.collect_frames(2, common::DEADLINE).await.frames;
        let entry = format!(
            "*1\r\n*2\r\n${}\r\n{id}\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n",
            id.len()
        );
        let stream = format!("${}\r\n{}\r\n", s[1].len(), s[1]);
        let want = match proto {
            "2" => format!("*1\r\n*2\r\n{stream}{entry}"),
            _ => format!("%1\r\n{stream}{entry}"),
        };
        assert_eq!(got.len(), 2, "RESP{proto}: {got:?}");
        assert_eq!(show(&got[0]), show(want.as_bytes()), "RESP{proto}");
        assert_eq!(got[1], b"+PONG\r\n", "RESP{proto}");
        // Every slot's connection was closed: nothing stays blocked.
        common::cluster::wait_blocked_on(&primaries, 0).await;
        // A timeout with no entry: a null.
        let null = c
            .call(&["XREAD", "BLOCK", "30", "STREAMS", s[0], s[2], "$", "$"])
            .await;
        let want: &[u8] = if proto == "2" { b"*-1\r\n" } else { b"_\r\n" };
        assert_eq!(null, want, "RESP{proto}");
    }
    // A client that leaves while it blocks: every node's connection goes with it.
    let mut gone = Raw::connect(proxy.addr).await;
    gone.send(&common::resp(&[
        "XREAD", "BLOCK", "0", "STREAMS", s[0], s[2], "$", "$",
    ]))
    .await;
    common::cluster::wait_blocked_on(&primaries, 2).await;
    drop(gone);
    common::cluster::wait_blocked_on(&primaries, 0).await;
    assert_eq!(writer.call(&["PING"]).await, b"+PONG\r\n");

    // Another client's CLIENT UNBLOCK ends it as one Redis would: a null (TIMEOUT, the
    // default) or the -UNBLOCKED error, and every slot's connection closes.
    for (how, want) in [
        (None, &b"*-1\r\n"[..]),
        (
            Some("ERROR"),
            b"-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n",
        ),
    ] {
        let mut blocked = Raw::connect(proxy.addr).await;
        let id = String::from_utf8(blocked.call(&["CLIENT", "ID"]).await).unwrap();
        let id = id.trim_start_matches(':').trim_end().to_string();
        blocked
            .send(&common::resp(&[
                "XREAD", "BLOCK", "0", "STREAMS", s[0], s[2], "$", "$",
            ]))
            .await;
        common::cluster::wait_blocked_on(&primaries, 2).await;
        let mut unblock = vec!["CLIENT", "UNBLOCK", id.as_str()];
        unblock.extend(how);
        assert_eq!(writer.call(&unblock).await, b":1\r\n", "{how:?}");
        assert_eq!(blocked.read_frame().await, want, "{how:?}");
        common::cluster::wait_blocked_on(&primaries, 0).await;
        assert_eq!(blocked.call(&["PING"]).await, b"+PONG\r\n");
    }
}
