//! A table of malformed and unusual requests, each sent to Redis and to the proxy followed by
//! the client's EOF: the proxy must answer byte for byte as Redis does (or, where a proxy limit
//! applies, with its documented error), close like Redis, and stay up. The same table is then
//! replayed many times against the real binary with its memory measured before and after.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::process::ProxyProcess;
use common::*;

/// `(name, input)`; inputs end where the client closes its side.
fn cases() -> Vec<(&'static str, Vec<u8>)> {
    let mut v: Vec<(&'static str, Vec<u8>)> = vec![
        ("empty", b"".to_vec()),
        ("lone star", b"*".to_vec()),
        ("header only", b"*1\r\n".to_vec()),
        ("truncated bulk header", b"*1\r\n$3".to_vec()),
        ("truncated bulk", b"*1\r\n$4\r\nPI".to_vec()),
        ("missing final crlf", b"*1\r\n$4\r\nPING".to_vec()),
        ("null multibulk", b"*-1\r\nPING\r\n".to_vec()),
        ("zero multibulk", b"*0\r\nPING\r\n".to_vec()),
        ("non-numeric multibulk", b"*abc\r\n".to_vec()),
        ("negative multibulk", b"*-5\r\n".to_vec()),
        ("plus sign multibulk", b"*+1\r\n$4\r\nPING\r\n".to_vec()),
        ("multibulk with space", b"*1 \r\n$4\r\nPING\r\n".to_vec()),
        ("non-numeric bulk", b"*1\r\n$x\r\n".to_vec()),
        ("negative bulk", b"*1\r\n$-1\r\n".to_vec()),
        ("bulk over 512 MB", b"*1\r\n$536870913\r\n".to_vec()),
        ("bulk over 4 GB", b"*1\r\n$4294967296\r\n".to_vec()),
        ("bulk with leading zero", b"*1\r\n$04\r\nPING\r\n".to_vec()),
        ("simple string in array", b"*1\r\n+PING\r\n".to_vec()),
        ("integer in array", b"*2\r\n$4\r\nECHO\r\n:1\r\n".to_vec()),
        ("nested array", b"*1\r\n*1\r\n$4\r\nPING\r\n".to_vec()),
        ("deep nesting", b"*1\r\n".repeat(1000)),
        ("bare bulk", b"$4\r\nPING\r\n".to_vec()),
        ("bare integer", b":1\r\n".to_vec()),
        ("bare simple string", b"+PING\r\n".to_vec()),
        ("bare error", b"-ERR x\r\n".to_vec()),
        ("resp3 map", b"%1\r\n+a\r\n+b\r\n".to_vec()),
        ("empty command name", b"*1\r\n$0\r\n\r\n".to_vec()),
        (
            "unknown command",
            b"*2\r\n$6\r\nFOOBAR\r\n$1\r\nx\r\n".to_vec(),
        ),
        (
            "binary command name",
            b"*1\r\n$3\r\n\x00\xff\x01\r\n".to_vec(),
        ),
        ("invalid utf-8 inline", b"\xff\xfe\xfd\r\n".to_vec()),
        ("nul in inline", b"PI\x00NG\r\n".to_vec()),
        ("wrong arity", b"*1\r\n$3\r\nGET\r\n".to_vec()),
        ("lower case", b"*1\r\n$4\r\nping\r\n".to_vec()),
        ("mixed case", b"*2\r\n$4\r\nEcHo\r\n$2\r\nhi\r\n".to_vec()),
        ("inline ping", b"PING\r\n".to_vec()),
        ("inline lf only", b"PING\n".to_vec()),
        ("inline no newline", b"PING".to_vec()),
        ("blank lines", b"\r\n\r\n  \r\nPING\r\n".to_vec()),
        ("inline quotes", b"ECHO \"a b\" 'c d'\r\n".to_vec()),
        ("inline escapes", b"ECHO \"\\x41\\n\\t\"\r\n".to_vec()),
        ("inline unbalanced quotes", b"ECHO \"abc\r\n".to_vec()),
        (
            "inline quote not followed by space",
            b"ECHO \"a\"b\r\n".to_vec(),
        ),
        ("inline many spaces", b"   ECHO     x    \r\n".to_vec()),
        (
            "inline vertical tab and form feed",
            b"\x0b\x0cECHO \"a\"\x0bb\x0cc\r\n".to_vec(),
        ),
        (
            "inline vertical tab inside a word",
            b"ECHO a\x0bb\r\n".to_vec(),
        ),
        ("pipeline then garbage", b"PING\r\n*x\r\nPING\r\n".to_vec()),
        ("quit mid pipeline", b"PING\r\nQUIT\r\nPING\r\n".to_vec()),
        (
            "nul bytes in args",
            b"*2\r\n$4\r\nECHO\r\n$3\r\n\x00\x00\x00\r\n".to_vec(),
        ),
        ("long arg list", {
            let mut c = b"*1001\r\n$4\r\nMGET\r\n".to_vec();
            for i in 0..1000 {
                c.extend(bulk(format!("k{i}").as_bytes()));
            }
            c
        }),
        ("hello 4", b"HELLO 4\r\n".to_vec()),
        ("hello garbage", b"HELLO x\r\n".to_vec()),
        ("select out of range", b"SELECT 99999\r\n".to_vec()),
        ("client reply garbage", b"CLIENT REPLY MAYBE\r\n".to_vec()),
        ("multi nested", b"MULTI\r\nMULTI\r\nEXEC\r\n".to_vec()),
        ("exec without multi", b"EXEC\r\n".to_vec()),
        ("discard without multi", b"DISCARD\r\n".to_vec()),
        (
            "watch inside multi",
            b"MULTI\r\nWATCH k\r\nEXEC\r\n".to_vec(),
        ),
        (
            "subscribe then ping",
            b"SUBSCRIBE c\r\nPING\r\nGET k\r\n".to_vec(),
        ),
        ("unsubscribe not subscribed", b"UNSUBSCRIBE\r\n".to_vec()),
        ("auth without password set", b"AUTH x\r\n".to_vec()),
    ];
    // Big declared sizes on the header line itself, past the inline limit.
    v.push(("huge inline line", vec![b'a'; 70 * 1024]));
    v.push(("huge multibulk header line", {
        let mut c = b"*".to_vec();
        c.extend(vec![b'1'; 70 * 1024]);
        c
    }));
    v
}

/// Cases where the proxy's limits answer differently from Redis's, with the reply expected.
/// (Redis accepts multibulk counts up to 2^31; the proxy stops at `limits.max_multibulk_len`.)
fn proxy_limit(name: &str) -> Option<&'static [u8]> {
    match name {
        "huge multibulk header line" => {
            Some(b"-ERR Protocol error: too big mbulk count string\r\n")
        }
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_input_gets_what_redis_answers() {
    let pair = Pair::start().await;
    let cases = cases();
    assert!(cases.len() >= 55, "{} cases", cases.len());
    let mut failures = Vec::new();
    for (name, input) in &cases {
        let (want, got) = pair.compare_half_closed(input).await;
        let ok = match proxy_limit(name) {
            Some(expected) => got == expected,
            None => got == want,
        };
        if !ok {
            failures.push(format!(
                "{name}: input {}\n  redis: {}\n  proxy: {}",
                show(&input[..input.len().min(80)]),
                show(&want[..want.len().min(300)]),
                show(&got[..got.len().min(300)])
            ));
        }
        // Still serving.
        assert_eq!(
            exchange(pair.proxy.addr, b"PING\r\n", 1).await,
            b"+PONG\r\n",
            "after {name}"
        );
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaying_the_table_many_times_does_not_grow_the_proxy() {
    let redis = RedisServer::start();
    let tmp = TempDir::new("malformed");
    let policy = write_file(tmp.path(), "policy.yaml", "admin:\n  listen: \"off\"\n");
    let proxy = ProxyProcess::start(&policy, &redis, tmp.path().join("proxy.log"), &[]).await;
    let cases = cases();
    // Warm up once (allocator arenas, the reply channel, buffers), then measure.
    for (_, input) in &cases {
        exchange_half_closed(proxy.addr(), input).await;
    }
    let before = proxy.rss_kib();
    for _ in 0..20 {
        for (_, input) in &cases {
            exchange_half_closed(proxy.addr(), input).await;
        }
    }
    let after = proxy.rss_kib();
    eprintln!(
        "{} malformed inputs x 20: proxy RSS {before} -> {after} KiB",
        cases.len()
    );
    assert!(
        after <= before + 4 * 1024,
        "RSS grew {before} -> {after} KiB"
    );
    assert_eq!(exchange(proxy.addr(), b"PING\r\n", 1).await, b"+PONG\r\n");
}
