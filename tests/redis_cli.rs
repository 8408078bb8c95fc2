//! `redis-cli` against the proxy: its output must be what it prints against Redis itself.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::*;

/// Runs the same redis-cli invocation against direct Redis and through the proxy; asserts
/// identical stdout, stderr and exit status; returns the proxy's stdout.
async fn cli_same(pair: &Pair, args: &[&str]) -> String {
    cli_same_stdin(pair, args, b"").await
}

async fn cli_same_stdin(pair: &Pair, args: &[&str], stdin: &[u8]) -> String {
    let want = redis_cli_with_stdin(pair.direct.port, args, stdin).await;
    let got = redis_cli_with_stdin(pair.proxy.port(), args, stdin).await;
    assert_eq!(
        (got.stdout.as_str(), got.stderr.as_str(), got.status.code()),
        (
            want.stdout.as_str(),
            want.stderr.as_str(),
            want.status.code()
        ),
        "redis-cli {args:?}: proxy (left) differs from Redis (right)"
    );
    got.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_commands_match_redis() {
    let pair = Pair::start().await;
    assert_eq!(cli_same(&pair, &["SET", "k", "v"]).await, "OK\n");
    assert_eq!(cli_same(&pair, &["GET", "k"]).await, "v\n");
    assert_eq!(cli_same(&pair, &["GET", "missing"]).await, "\n");
    assert_eq!(cli_same(&pair, &["PING"]).await, "PONG\n");
    assert_eq!(cli_same(&pair, &["INCR", "n"]).await, "1\n");
    cli_same(&pair, &["RPUSH", "l", "a", "b", "c"]).await;
    cli_same(&pair, &["HSET", "h", "f", "v", "g", "2"]).await;
    for args in [
        &["LRANGE", "l", "0", "-1"][..],
        &["HGETALL", "h"],
        &["TYPE", "l"],
        &["DBSIZE"],
        &["ECHO", "with space"],
        &["GET"],
        &["INCR", "k"],
        &["NOSUCHCOMMAND"],
        &["-n", "2", "SET", "in2", "x"],
        &["-n", "2", "GET", "in2"],
        &["GET", "in2"],
    ] {
        cli_same(&pair, args).await;
    }
    assert_eq!(
        pair.upstream.direct(&["GET", "k"]).await,
        b"$1\r\nv\r\n",
        "the SET went to the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_from_stdin_match_redis() {
    let pair = Pair::start().await;
    let out = cli_same_stdin(
        &pair,
        &[],
        b"SET a 1\nGET a\nRPUSH l x y\nLRANGE l 0 -1\nGET nope\nSELECT 1\nGET a\n",
    )
    .await;
    assert_eq!(out, "OK\n1\n2\nx\ny\n\nOK\n\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_formatted_output_match_redis() {
    let pair = Pair::start().await;
    cli_same(&pair, &["RPUSH", "l", "a", "b"]).await;
    cli_same(&pair, &["HSET", "h", "f", "v"]).await;
    assert_eq!(
        cli_same(&pair, &["--raw", "LRANGE", "l", "0", "-1"]).await,
        "a\nb\n"
    );
    assert_eq!(
        cli_same(&pair, &["--no-raw", "LRANGE", "l", "0", "-1"]).await,
        "1) \"a\"\n2) \"b\"\n"
    );
    assert_eq!(
        cli_same(&pair, &["--no-raw", "GET", "nope"]).await,
        "(nil)\n"
    );
    for args in [
        &["--no-raw", "HGETALL", "h"][..],
        &["--no-raw", "INCR", "l"],
        &["--no-raw", "LLEN", "l"],
        &["--raw", "HGETALL", "h"],
    ] {
        cli_same(&pair, args).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_and_resp3_output_match_redis() {
    let pair = Pair::start().await;
    cli_same(&pair, &["HSET", "h", "f", "v", "g", "2"]).await;
    cli_same(&pair, &["ZADD", "z", "1.5", "m"]).await;
    assert_eq!(
        cli_same(&pair, &["--json", "HGETALL", "h"]).await,
        "{\"f\":\"v\",\"g\":\"2\"}\n"
    );
    assert_eq!(
        cli_same(&pair, &["-2", "--json", "HGETALL", "h"]).await,
        "[\"f\",\"v\",\"g\",\"2\"]\n"
    );
    assert_eq!(cli_same(&pair, &["--json", "GET", "nope"]).await, "null\n");
    assert_eq!(
        cli_same(&pair, &["--json", "ZRANGE", "z", "0", "-1", "WITHSCORES"]).await,
        "[[\"m\",1.5]]\n"
    );
    assert_eq!(
        cli_same(&pair, &["-3", "--no-raw", "HGETALL", "h"]).await,
        "1# \"f\" => \"v\"\n2# \"g\" => \"2\"\n"
    );
    assert_eq!(
        cli_same(&pair, &["-3", "--no-raw", "GET", "nope"]).await,
        "(nil)\n"
    );
    cli_same(&pair, &["-3", "--no-raw", "ZSCORE", "z", "m"]).await;
    cli_same(&pair, &["-3", "--no-raw", "SMEMBERS", "nope"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_incr() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let out = redis_cli(proxy.port(), &["-r", "5", "INCR", "k"]).await;
    assert_eq!(out.stdout, "1\n2\n3\n4\n5\n", "stderr: {}", out.stderr);
    assert_eq!(redis.direct(&["GET", "k"]).await, b"$1\r\n5\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_lists_every_key() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut input = Vec::new();
    for i in 0..300 {
        input.extend_from_slice(&resp(&["SET".to_string(), format!("key:{i}"), "v".into()]));
    }
    input.extend_from_slice(&resp(&["SET", "other", "v"]));
    let got = pipeline(redis.addr(), input, 301).await;
    assert_eq!(got.frames.len(), 301);

    let out = redis_cli(proxy.port(), &["--scan", "--pattern", "key:*"]).await;
    assert!(out.status.success(), "stderr: {}", out.stderr);
    let mut keys: Vec<&str> = out.stdout.lines().collect();
    keys.sort_unstable();
    keys.dedup();
    let mut want: Vec<String> = (0..300).map(|i| format!("key:{i}")).collect();
    want.sort_unstable();
    assert_eq!(keys, want);

    let all = redis_cli(proxy.port(), &["--scan"]).await;
    assert_eq!(all.stdout.lines().count(), 301);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipe_mass_insertion() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let n = 10_000;
    let mut input = Vec::new();
    for i in 0..n {
        input.extend_from_slice(&resp(&[
            "SET".to_string(),
            format!("mass:{i}"),
            format!("value-{i}"),
        ]));
    }
    let out = redis_cli_with_stdin(proxy.port(), &["--pipe"], &input).await;
    assert!(
        out.status.success(),
        "stdout: {} stderr: {}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stdout.contains(&format!("errors: 0, replies: {n}")),
        "stdout: {}",
        out.stdout
    );
    assert_eq!(
        redis.direct(&["DBSIZE"]).await,
        format!(":{n}\r\n").as_bytes()
    );
    assert_eq!(
        redis.direct(&["GET", "mass:9999"]).await,
        b"$10\r\nvalue-9999\r\n"
    );

    // Errors are counted too.
    let bad = resp_cmds(&["SET a 1", "INCR a", "LPUSH a x", "GET a"]);
    let out = redis_cli_with_stdin(proxy.port(), &["--pipe"], &bad).await;
    assert!(
        out.stdout.contains("errors: 1, replies: 4"),
        "stdout: {}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_flag_reads_last_argument_from_stdin() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let out =
        redis_cli_with_stdin(proxy.port(), &["-x", "SET", "xk"], b"line1\nline2\r\n\0end").await;
    assert_eq!(out.stdout, "OK\n", "stderr: {}", out.stderr);
    assert_eq!(
        redis.direct(&["GET", "xk"]).await,
        b"$17\r\nline1\nline2\r\n\0end\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_is_redis_info() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    redis.direct(&["SET", "a", "1"]).await;
    let out = redis_cli(proxy.port(), &["INFO"]).await;
    assert!(out.stdout.contains("# Server"), "{}", out.stdout);
    assert!(out.stdout.contains("redis_version:7."), "{}", out.stdout);
    assert!(
        out.stdout.contains(&format!("tcp_port:{}", redis.port)),
        "{}",
        out.stdout
    );
    let keyspace = redis_cli(proxy.port(), &["INFO", "keyspace"]).await;
    assert!(
        keyspace.stdout.contains("db0:keys=1,"),
        "{}",
        keyspace.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_shows_commands_from_other_clients() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut monitor = CliProcess::spawn(proxy.port(), &["MONITOR"]);
    assert_eq!(monitor.next_line().await, "OK");
    let mut other = Raw::connect(proxy.addr).await;
    assert_eq!(
        other.request(b"SET monitored-key 42\r\n", 1).await,
        b"+OK\r\n"
    );
    let lines = monitor
        .read_until(|l| l.contains("\"SET\" \"monitored-key\" \"42\""))
        .await;
    assert!(lines.iter().all(|l| l.contains('"')), "{lines:?}");
    // The monitoring connection does not disturb normal clients.
    assert_eq!(
        other.request(b"GET monitored-key\r\n", 1).await,
        b"$2\r\n42\r\n"
    );
    monitor.kill().await;
    assert_eq!(other.request(b"PING\r\n", 1).await, b"+PONG\r\n");
}

/// A MONITOR straight on Redis, the oracle (it shows every connection's commands, the
/// proxy's own included), and one through the proxy.
struct Monitors {
    direct: CliProcess,
    via: CliProcess,
}

/// The line the monitor tests end with.
fn marker(line: &str) -> bool {
    line.contains("\"monitor-marker\"")
}

impl Monitors {
    async fn start(redis: &RedisServer, proxy: &Proxy) -> Monitors {
        let mut direct = CliProcess::spawn(redis.port, &["MONITOR"]);
        assert_eq!(direct.next_line().await, "OK");
        let mut via = CliProcess::spawn(proxy.port(), &["MONITOR"]);
        assert_eq!(via.next_line().await, "OK");
        Monitors { direct, via }
    }

    /// Sends the marker on `c`, then checks that the proxy's monitor showed exactly the
    /// lines of Redis's (`seen` so far, and what follows up to the marker) that `clients`
    /// picks, `count` of them; returns Redis's lines.
    async fn end(
        mut self,
        c: &mut Raw,
        mut seen: Vec<String>,
        clients: impl Fn(&str) -> bool,
        count: usize,
    ) -> Vec<String> {
        assert_eq!(c.request(b"SET monitor-marker 1\r\n", 1).await, b"+OK\r\n");
        seen.extend(self.direct.read_until(marker).await);
        let shown = self.via.read_until(marker).await;
        let want: Vec<&String> = seen.iter().filter(|l| clients(l) || marker(l)).collect();
        assert_eq!(want.len(), count + 1, "{seen:?}");
        assert_eq!(
            shown.iter().collect::<Vec<_>>(),
            want,
            "through the proxy (left) against Redis's clients' lines (right); Redis showed {seen:?}"
        );
        self.via.kill().await;
        self.direct.kill().await;
        seen
    }
}

/// MONITOR through the proxy shows the clients' commands as Redis's own MONITOR shows them,
/// and none of the proxy's: the handshakes of the connections it dials (here the dedicated
/// connections scripts take, past the warm stock) and its control connection's probes
/// (`upstream::own_lines`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_shows_clients_commands_and_none_of_the_proxys_own() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut monitors = Monitors::start(&redis, &proxy).await;
    let mut clients = Vec::new();
    for i in 0..8 {
        let mut c = Raw::connect(proxy.addr).await;
        let script = format!("EVAL \"return {i}\" 0\r\n");
        assert_eq!(
            c.request(script.as_bytes(), 1).await,
            format!(":{i}\r\n").as_bytes()
        );
        clients.push(c);
    }
    // The proxy's control connection asks INFO every 5 s; wait for one, seen directly.
    let seen = monitors.direct.read_until(|l| l.contains("\"INFO\"")).await;
    assert!(
        seen.iter().any(|l| l.contains("\"HELLO\"")),
        "the proxy dialled connections while both monitored: {seen:?}"
    );
    // Every script, then the marker.
    let scripts = |l: &str| l.contains("\"EVAL\"");
    monitors.end(&mut clients[0], seen, scripts, 8).await;
}

/// A Redis-counted rate limit runs the proxy's script (EVALSHA on its control connection)
/// for every command it judges: MONITOR through the proxy shows neither that line nor the
/// script's calls (the `[0 lua]` lines after it), which a MONITOR on Redis shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_shows_nothing_of_the_proxys_rate_limit_script() {
    let redis = RedisServer::start();
    let yaml = format!(
        "upstream:\n  address: {}\nrules:\n  - id: shared\n    rate_limit: {{requests: 1000, window_ms: 60000, per: address, backend: redis}}\n",
        redis.addr()
    );
    let config =
        redis_policy_proxy::setup::from_yaml(&yaml, std::path::Path::new("rl.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let monitors = Monitors::start(&redis, &proxy).await;
    let mut c = Raw::connect(proxy.addr).await;
    for i in 0..3 {
        let set = format!("SET limited {i}\r\n");
        assert_eq!(c.request(set.as_bytes(), 1).await, b"+OK\r\n");
    }
    let sets = |l: &str| l.contains("\"SET\" \"limited\"") && !l.contains(" lua]");
    let seen = monitors.end(&mut c, Vec::new(), sets, 3).await;
    assert!(
        seen.iter()
            .any(|l| l.to_lowercase().contains("\"evalsha\""))
            && seen.iter().any(|l| l.contains(" lua]")),
        "Redis shows the limit's script and its calls: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_receives_published_messages() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut sub = CliProcess::spawn(proxy.port(), &["SUBSCRIBE", "ch"]);
    assert_eq!(
        [
            sub.next_line().await,
            sub.next_line().await,
            sub.next_line().await
        ],
        ["subscribe", "ch", "1"]
    );
    let out = redis_cli(proxy.port(), &["PUBLISH", "ch", "hello"]).await;
    assert_eq!(out.stdout, "1\n");
    assert_eq!(
        [
            sub.next_line().await,
            sub.next_line().await,
            sub.next_line().await
        ],
        ["message", "ch", "hello"]
    );
    // A publish straight to Redis reaches the proxied subscriber too.
    assert_eq!(redis.direct(&["PUBLISH", "ch", "direct"]).await, b":1\r\n");
    assert_eq!(
        [
            sub.next_line().await,
            sub.next_line().await,
            sub.next_line().await
        ],
        ["message", "ch", "direct"]
    );
    sub.kill().await;
}
