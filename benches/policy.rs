//! Cost of the policy check per command with `policy/default.yaml` (ns/command).

use std::hint::black_box;
use std::net::IpAddr;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use redis_policy_proxy::policy::{Client, Policy};

fn policy_check(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let config = redis_policy_proxy::setup::load(&path).expect("default policy");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let policy = redis_policy_proxy::setup::policy(&config).expect("compiles");
    let empty = Policy::compile(&[]).unwrap();
    let client = Client {
        id: 1,
        addr: IpAddr::from([127, 0, 0, 1]),
        tenant: 0,
        user: 0,
        again: false,
    };
    let value = vec![b'x'; 64];
    let lines: Vec<(&str, Vec<&[u8]>)> = vec![
        ("GET", vec![b"GET", b"user:1"]),
        ("SET (PX added)", vec![b"SET", b"user:1", &value]),
        (
            "SET EX (kept)",
            vec![b"SET", b"user:1", &value, b"EX", b"60"],
        ),
        (
            "HSET (PEXPIRE NX added)",
            vec![b"HSET", b"session:1", b"f", &value],
        ),
        (
            "MGET 10 keys",
            vec![
                b"MGET", b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h", b"i", b"j",
            ],
        ),
        ("KEYS (refused)", vec![b"KEYS", b"*"]),
    ];
    let mut group = c.benchmark_group("policy_check");
    group.bench_function("passthrough GET", |b| {
        b.iter(|| black_box(empty.check(&client, &lines[0].1[..])))
    });
    for (name, line) in &lines {
        group.bench_function(format!("default {name}"), |b| {
            b.iter(|| black_box(policy.check(&client, &line[..])))
        });
    }
    group.finish();
}

criterion_group!(benches, policy_check);
criterion_main!(benches);
