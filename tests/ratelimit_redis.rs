//! The Redis rate-limit backend against a real `redis-server`: the limit is enforced, replicas
//! share one budget, NOSCRIPT is recovered, state keys expire, and the Lua script decides
//! exactly like the local backend (same state machine, same integers) for any sequence.
//!
//! No test sleeps through a window: tests that need time to move pass it to the script with
//! `RedisLimiter::with_client_clock` and a `ManualClock`; tests on the server's own `TIME` use
//! a 60 s window and stay well inside it.
//!
//! Self-contained on purpose (no `tests/common`): one tiny `redis-server` fixture below.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis_policy_proxy::ratelimit::local::LocalLimiter;
use redis_policy_proxy::ratelimit::redis::{Frame, RedisLimiter, SCRIPT, Transport, script_sha1};
use redis_policy_proxy::ratelimit::{Decision, Limit, ManualClock, RateLimitError};

// ---------------------------------------------------------------------------------------------
// Fixture: a throwaway redis-server on a free loopback port
// ---------------------------------------------------------------------------------------------

/// A `redis-server` child process, killed on drop.
struct RedisServer {
    /// The process, to kill when the test ends.
    child: Child,
    /// The loopback port it listens on.
    port: u16,
}

impl RedisServer {
    /// Starts a server with persistence off and waits (bounded) until it answers PING. Retries
    /// on a new port if another process took the free port first.
    fn start() -> RedisServer {
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("bind 127.0.0.1:0")
                .port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server on PATH (.ci/run installs it)");
            let mut server = RedisServer { child, port };
            if server.wait_for_ping() {
                return server;
            }
        }
        panic!("redis-server did not start");
    }

    /// Polls PING every 10 ms for at most 10 s; false if the process exited (port taken).
    fn wait_for_ping(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return false;
            }
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                let mut buf = [0u8; 7];
                if s.write_all(b"PING\r\n").is_ok()
                    && s.read_exact(&mut buf).is_ok()
                    && &buf == b"+PONG\r\n"
                {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server on port {} never answered PING", self.port);
    }

    /// A new `redis` crate connection: each is one proxy replica's upstream connection.
    async fn connect(&self) -> MultiplexedConnection {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis-server")
    }

    /// A transport on a new connection.
    async fn transport(&self) -> RedisCrate {
        RedisCrate {
            conn: self.connect().await,
            sent: Arc::default(),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Transport implemented with the `redis` crate
// ---------------------------------------------------------------------------------------------

/// `Transport` over a `redis` crate connection, recording the name of every command sent.
#[derive(Clone)]
struct RedisCrate {
    /// The connection commands go on.
    conn: MultiplexedConnection,
    /// Command names sent so far (EVALSHA / EVAL), to observe NOSCRIPT recovery.
    sent: Arc<Mutex<Vec<String>>>,
}

impl Transport for RedisCrate {
    type Error = redis::RedisError;

    fn call(&self, args: &[&[u8]]) -> impl Future<Output = Result<Frame, Self::Error>> + Send {
        let mut cmd = redis::Cmd::new();
        for a in args {
            cmd.arg(*a);
        }
        self.sent
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(args[0]).into_owned());
        let mut conn = self.conn.clone();
        async move {
            match conn.req_packed_command(&cmd).await {
                Ok(value) => Ok(frame(value)),
                Err(e) => match e.code() {
                    Some(code) => Ok(Frame::Error(format!(
                        "{code} {}",
                        e.detail().unwrap_or_default()
                    ))),
                    None => Err(e),
                },
            }
        }
    }
}

fn frame(value: redis::Value) -> Frame {
    match value {
        redis::Value::Int(n) => Frame::Integer(n),
        redis::Value::BulkString(b) => Frame::String(b.into()),
        redis::Value::SimpleString(s) => Frame::String(s.into()),
        redis::Value::Okay => Frame::String("OK".into()),
        redis::Value::Array(items) => Frame::Array(items.into_iter().map(frame).collect()),
        redis::Value::ServerError(e) => {
            Frame::Error(format!("{} {}", e.code(), e.details().unwrap_or_default()))
        }
        _ => Frame::Nil,
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const PREFIX: &[u8] = b"rpp:rl:test:";

fn limit(requests: u32, window_ms: u64) -> Limit {
    Limit {
        requests,
        window: Duration::from_millis(window_ms),
    }
}

async fn query<T: redis::FromRedisValue>(conn: &mut MultiplexedConnection, args: &[&[u8]]) -> T {
    let mut cmd = redis::Cmd::new();
    for a in args {
        cmd.arg(*a);
    }
    cmd.query_async(conn).await.unwrap()
}

fn is_allowed(d: &Decision) -> bool {
    matches!(d, Decision::Allowed { .. })
}

/// A small deterministic pseudo-random sequence (64-bit LCG), so a failing run replays.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// One step of a replayed workload: set the clock, then check `key` `burst` times.
#[derive(Debug, Clone, Copy)]
struct Step {
    at_ms: u64,
    key: u8,
    burst: u64,
}

/// A workload over ~30 windows of 1 s around a realistic Unix time: bursts, gaps longer than
/// two windows, and clock steps backwards (a skewed replica).
fn workload(seed: u64) -> Vec<Step> {
    let mut rng = Lcg(seed);
    let mut at_ms = 1_700_000_000_000u64;
    (0..400)
        .map(|_| {
            at_ms = match rng.below(20) {
                0 => at_ms + 2_000 + rng.below(1_000),
                1 => at_ms - rng.below(1_500),
                _ => at_ms + rng.below(120),
            };
            Step {
                at_ms,
                key: rng.below(3) as u8,
                burst: 1 + rng.below(6),
            }
        })
        .collect()
}

/// Runs `steps` through a Redis limiter timed by the returned steps' clock.
async fn replay_redis(
    server: &RedisServer,
    prefix: &[u8],
    lim: Limit,
    steps: &[Step],
) -> Vec<Decision> {
    let clock = ManualClock::default();
    let limiter = RedisLimiter::new(server.transport().await, prefix, lim)
        .unwrap()
        .with_client_clock(clock.clone());
    let mut out = Vec::new();
    for s in steps {
        clock.set(Duration::from_millis(s.at_ms));
        for _ in 0..s.burst {
            out.push(limiter.check(&[b'k', s.key]).await.unwrap());
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn limit_is_enforced_with_the_servers_clock() {
    let server = RedisServer::start();
    let limiter = RedisLimiter::new(server.transport().await, PREFIX, limit(5, 60_000)).unwrap();
    for remaining in (0..5).rev() {
        assert_eq!(
            limiter.check(b"alice").await.unwrap(),
            Decision::Allowed { remaining }
        );
    }
    for _ in 0..3 {
        let Decision::Limited { retry_after } = limiter.check(b"alice").await.unwrap() else {
            panic!("6th request in the window was allowed");
        };
        // The window is full: at least the rest of it, at most W + W/N.
        assert!(
            retry_after > Duration::ZERO && retry_after <= Duration::from_millis(72_000),
            "{retry_after:?}"
        );
    }
    // Another key has its own budget.
    assert_eq!(
        limiter.check(b"bob").await.unwrap(),
        Decision::Allowed { remaining: 4 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_budget() {
    let server = RedisServer::start();
    let lim = limit(10, 60_000);
    let replica_a = Arc::new(RedisLimiter::new(server.transport().await, PREFIX, lim).unwrap());
    let replica_b = Arc::new(RedisLimiter::new(server.transport().await, PREFIX, lim).unwrap());
    let replica = |i: usize| Arc::clone(if i % 2 == 0 { &replica_a } else { &replica_b });

    let mut allowed = 0;
    for i in 0..30 {
        if is_allowed(&replica(i).check(b"tenant-a").await.unwrap()) {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 10, "both replicas together allow N, not 2N");
    assert!(!is_allowed(&replica_a.check(b"tenant-a").await.unwrap()));
    assert!(!is_allowed(&replica_b.check(b"tenant-a").await.unwrap()));

    // Concurrent checks from both replicas, on two threads: still exactly N (the script is
    // atomic).
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let limiter = replica(i);
        tasks.spawn(async move { limiter.check(b"tenant-b").await.unwrap() });
    }
    let decisions = tasks.join_all().await;
    assert_eq!(decisions.iter().filter(|d| is_allowed(d)).count(), 10);

    // A limiter with another prefix (another rule) does not share the budget.
    let other_rule = RedisLimiter::new(server.transport().await, b"rpp:rl:other:", lim).unwrap();
    assert!(is_allowed(&other_rule.check(b"tenant-a").await.unwrap()));
}

#[tokio::test]
async fn noscript_is_recovered_transparently() {
    let server = RedisServer::start();
    let transport = server.transport().await;
    let sent = Arc::clone(&transport.sent);
    let limiter = RedisLimiter::new(transport, PREFIX, limit(3, 60_000)).unwrap();
    let take = || std::mem::take(&mut *sent.lock().unwrap());

    // A fresh server has no script cached: EVALSHA, NOSCRIPT, EVAL.
    assert_eq!(
        limiter.check(b"k").await.unwrap(),
        Decision::Allowed { remaining: 2 }
    );
    assert_eq!(take(), ["EVALSHA", "EVAL"]);
    // EVAL cached it: EVALSHA alone from now on.
    assert_eq!(
        limiter.check(b"k").await.unwrap(),
        Decision::Allowed { remaining: 1 }
    );
    assert_eq!(take(), ["EVALSHA"]);

    // SCRIPT FLUSH (as after a restart or failover) keeps the counts but drops the script.
    let mut admin = server.connect().await;
    let () = query(&mut admin, &[b"SCRIPT", b"FLUSH"]).await;
    assert_eq!(
        limiter.check(b"k").await.unwrap(),
        Decision::Allowed { remaining: 0 }
    );
    assert_eq!(take(), ["EVALSHA", "EVAL"]);
    assert!(!is_allowed(&limiter.check(b"k").await.unwrap()));
    assert_eq!(take(), ["EVALSHA"]);
    let exists: Vec<i64> = query(
        &mut admin,
        &[b"SCRIPT", b"EXISTS", script_sha1().as_bytes()],
    )
    .await;
    assert_eq!(exists, [1]);
}

#[tokio::test]
async fn the_precomputed_sha1_is_the_one_redis_computes() {
    let server = RedisServer::start();
    let mut conn = server.connect().await;
    let sha: String = query(&mut conn, &[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()]).await;
    assert_eq!(sha, script_sha1());
}

#[tokio::test]
async fn state_is_one_hash_per_key_with_a_ttl_of_two_windows() {
    let server = RedisServer::start();
    let mut conn = server.connect().await;
    let window_ms = 60_000u64;
    let limiter = RedisLimiter::new(server.transport().await, PREFIX, limit(5, window_ms)).unwrap();

    let (before_s, before_us): (u64, u64) = query(&mut conn, &[b"TIME"]).await;
    limiter.check(b"carol").await.unwrap();
    let (after_s, after_us): (u64, u64) = query(&mut conn, &[b"TIME"]).await;

    let key = [PREFIX, b"carol"].concat();
    let pttl: i64 = query(&mut conn, &[b"PTTL", &key]).await;
    assert!(
        pttl > 2 * window_ms as i64 - 5_000 && pttl <= 2 * window_ms as i64,
        "PTTL {pttl}"
    );
    let kind: String = query(&mut conn, &[b"TYPE", &key]).await;
    assert_eq!(kind, "hash");
    // The window index comes from the server's TIME, in milliseconds.
    let (w, c, p): (u64, u32, u32) = query(&mut conn, &[b"HMGET", &key, b"w", b"c", b"p"]).await;
    let index = |s: u64, us: u64| (s * 1000 + us / 1000) / window_ms;
    assert!(
        (index(before_s, before_us)..=index(after_s, after_us)).contains(&w),
        "w = {w}"
    );
    assert_eq!((c, p), (1, 0));

    // Only state keys are written: one per limited key.
    limiter.check(b"dave").await.unwrap();
    let mut keys: Vec<Vec<u8>> = query(&mut conn, &[b"KEYS", b"*"]).await;
    keys.sort();
    assert_eq!(keys, [key, [PREFIX, b"dave"].concat()]);
}

#[tokio::test]
async fn the_script_decides_exactly_like_the_local_backend() {
    let server = RedisServer::start();
    for (seed, lim) in [
        (1, limit(7, 1_000)),
        (2, limit(1, 1_000)),
        (3, limit(100, 1_000)),
    ] {
        let steps = workload(seed);
        let redis = replay_redis(
            &server,
            format!("rpp:rl:cmp{seed}:").as_bytes(),
            lim,
            &steps,
        )
        .await;

        let clock = ManualClock::default();
        let local = LocalLimiter::new(lim, 100, clock.clone()).unwrap();
        let mut i = 0;
        for s in &steps {
            clock.set(Duration::from_millis(s.at_ms));
            for _ in 0..s.burst {
                let expected = local.check(&[b'k', s.key]).unwrap();
                assert_eq!(redis[i], expected, "seed {seed}, decision {i}, {s:?}");
                i += 1;
            }
        }
        let allowed = redis.iter().filter(|d| is_allowed(d)).count();
        assert!(
            allowed > 0 && allowed < redis.len(),
            "the workload must hit the limit and pass it"
        );
    }
}

#[tokio::test]
async fn the_script_is_deterministic_for_given_inputs() {
    let server = RedisServer::start();
    let lim = limit(5, 1_000);
    let steps = workload(42);
    let first = replay_redis(&server, b"rpp:rl:det1:", lim, &steps).await;
    let second = replay_redis(&server, b"rpp:rl:det2:", lim, &steps).await;
    assert_eq!(first, second);
    // And after the script cache and every key are gone, the same inputs give the same outputs.
    let mut admin = server.connect().await;
    let () = query(&mut admin, &[b"FLUSHALL"]).await;
    let () = query(&mut admin, &[b"SCRIPT", b"FLUSH"]).await;
    let third = replay_redis(&server, b"rpp:rl:det1:", lim, &steps).await;
    assert_eq!(first, third);
}

#[tokio::test]
async fn window_edges_and_previous_window_weighting_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(Duration::from_millis(1_700_000_000_000));
    let start = 1_700_000_000_000u64; // a multiple of the 1 s window
    let limiter = RedisLimiter::new(server.transport().await, PREFIX, limit(100, 1_000))
        .unwrap()
        .with_client_clock(clock.clone());
    let at = |ms: u64| clock.set(Duration::from_millis(start + ms));

    for key in [&b"a"[..], b"b", b"c"] {
        for _ in 0..100 {
            assert!(is_allowed(&limiter.check(key).await.unwrap()));
        }
        assert_eq!(
            limiter.check(key).await.unwrap(),
            Decision::Limited {
                retry_after: Duration::from_millis(1_010)
            }
        );
    }
    for (key, at_ms, expected) in [(&b"a"[..], 1_250, 25), (b"b", 1_500, 50), (b"c", 1_750, 75)] {
        at(at_ms);
        let mut allowed = 0;
        while is_allowed(&limiter.check(key).await.unwrap()) {
            allowed += 1;
        }
        assert_eq!(allowed, expected, "at {at_ms} ms");
    }
    at(1_250);
    assert_eq!(
        limiter.check(b"a").await.unwrap(),
        Decision::Limited {
            retry_after: Duration::from_millis(10)
        }
    );
}

#[tokio::test]
async fn errors_are_reported_not_guessed() {
    let server = RedisServer::start();
    let limiter = RedisLimiter::new(server.transport().await, PREFIX, limit(5, 60_000)).unwrap();
    let mut conn = server.connect().await;

    // Something else wrote the limiter's key: the script's error comes back as is.
    let key = [PREFIX, b"eve"].concat();
    let () = query(&mut conn, &[b"SET", &key, b"x"]).await;
    let err = limiter.check(b"eve").await.unwrap_err();
    assert!(
        matches!(&err, RateLimitError::Script(e) if e.starts_with("WRONGTYPE")),
        "{err:?}"
    );

    // Redis gone: a transport error, never a decision.
    drop(server);
    let err = limiter.check(b"frank").await.unwrap_err();
    assert!(matches!(err, RateLimitError::Transport(_)), "{err:?}");
}

#[test]
fn invalid_limits_are_refused_at_construction() {
    struct Unused;
    impl Transport for Unused {
        type Error = std::io::Error;
        async fn call(&self, _: &[&[u8]]) -> Result<Frame, std::io::Error> {
            unreachable!()
        }
    }
    let err = RedisLimiter::new(Unused, PREFIX, limit(0, 1_000)).unwrap_err();
    assert!(
        matches!(err, RateLimitError::InvalidLimit { .. }),
        "{err:?}"
    );
}
