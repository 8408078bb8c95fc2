//! `workers: 2` (two worker threads, each a current-thread runtime with its own share of the
//! upstream connections: `operations::workers`) through the real binary and a real
//! redis-server, under load from many clients at once: clients spread evenly over the
//! workers, each client's replies in its own order, transactions whole, pub/sub messages all
//! delivered in order (publisher and subscriber on different workers), and a rate limit
//! counted once for clients whose sessions run on different threads.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::process::ProxyProcess;
use common::{Raw, RedisServer, TempDir, resp};

/// The proxy binary with `workers: 2` and `rules`, in front of `redis`.
async fn proxy(redis: &RedisServer, dir: &TempDir, rules: &str) -> ProxyProcess {
    let config = dir.path().join("workers.yaml");
    std::fs::write(&config, format!("workers: 2\n{rules}")).unwrap();
    ProxyProcess::start(&config, redis, dir.path().join("proxy.log"), &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_keep_order_transactions_and_pubsub_under_load() {
    let redis = RedisServer::start();
    let dir = TempDir::new("workers");
    let proxy = proxy(&redis, &dir, "").await;
    let addr = proxy.addr();
    // A subscriber, and a publisher whose messages it must get all of, in order.
    let mut sub = Raw::connect(&addr).await;
    assert!(sub.call(&["SUBSCRIBE", "news"]).await.starts_with(b"*3"));
    const MESSAGES: usize = 500;
    let publisher = {
        let addr = addr.clone();
        tokio::spawn(async move {
            let mut p = Raw::connect(&addr).await;
            for i in 0..MESSAGES {
                assert_eq!(
                    p.call(&["PUBLISH", "news", &i.to_string()]).await,
                    b":1\r\n"
                );
            }
        })
    };
    // 40 clients, each a pipeline of INCRs on its own key (replies must count up), and a
    // transaction of two INCRs on a shared key (EXEC's pair must be consecutive).
    const CLIENTS: usize = 40;
    const DEPTH: usize = 200;
    common::all_at_once(&addr, CLIENTS, |c, mut conn| async move {
        let key = format!("counter:{c}");
        let input: Vec<u8> = (0..DEPTH).flat_map(|_| resp(&["INCR", &key])).collect();
        conn.send(&input).await;
        let replies = conn.read_frames(DEPTH).await;
        for (i, r) in replies.iter().enumerate() {
            assert_eq!(r, format!(":{}\r\n", i + 1).as_bytes(), "client {c}");
        }
        for _ in 0..10 {
            let got = conn
                .request(
                    &common::resp_cmds(&["MULTI", "INCR shared", "INCR shared", "EXEC"]),
                    4,
                )
                .await;
            let text = String::from_utf8_lossy(&got).into_owned();
            let tail = text.rsplit("*2\r\n").next().unwrap().to_string();
            let n: Vec<i64> = tail
                .split("\r\n")
                .filter_map(|l| l.strip_prefix(':'))
                .map(|v| v.parse().unwrap())
                .collect();
            assert_eq!(n.len(), 2, "{text}");
            assert_eq!(n[1], n[0] + 1, "a transaction was interleaved: {text}");
        }
    })
    .await;
    publisher.await.unwrap();
    for i in 0..MESSAGES {
        let frame = sub.read_frame().await;
        let expected = format!(
            "*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n${}\r\n{i}\r\n",
            i.to_string().len()
        );
        assert_eq!(frame, expected.as_bytes(), "message {i}");
    }
    assert_eq!(
        redis.direct(&["GET", "shared"]).await,
        format!(
            "${}\r\n{}\r\n",
            (CLIENTS * 20).to_string().len(),
            CLIENTS * 20
        )
        .as_bytes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limit_is_one_budget_across_worker_threads() {
    let redis = RedisServer::start();
    let dir = TempDir::new("workers-rl");
    let rules = "rules:\n  - id: per-address\n    rate_limit:\n      requests: 300\n      \
                 window_ms: 600000\n      per: address\n";
    let proxy = proxy(&redis, &dir, rules).await;
    let addr = proxy.addr();
    // 30 clients from one address, 20 commands each (600 in all) at once: the budget's 300
    // pass, whichever threads their sessions run on, less the readiness PINGs the start
    // sent from the same address (one or two). Never more: that would be a budget counted
    // twice across threads.
    const CLIENTS: usize = 30;
    let passed: usize = common::all_at_once(&addr, CLIENTS, |_, mut conn| async move {
        let mut passed = 0;
        for _ in 0..20 {
            let reply = conn.call(&["INCR", "hits"]).await;
            if reply.starts_with(b":") {
                passed += 1;
            } else {
                assert!(
                    String::from_utf8_lossy(&reply).contains("per-address"),
                    "{}",
                    String::from_utf8_lossy(&reply)
                );
            }
        }
        passed
    })
    .await
    .into_iter()
    .sum();
    assert!(
        (295..=300).contains(&passed),
        "{passed} of 600 passed a budget of 300"
    );
    let hits = format!("${}\r\n{passed}\r\n", passed.to_string().len());
    assert_eq!(redis.direct(&["GET", "hits"]).await, hits.as_bytes());
}

/// `rpp_worker_sessions{worker}` from the admin endpoint at `admin`, in worker order.
async fn worker_sessions(admin: std::net::SocketAddr) -> Vec<u64> {
    let (status, body) = common::http_get(admin, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|l| l.starts_with("rpp_worker_sessions{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test]
async fn clients_are_spread_evenly_over_the_worker_threads() {
    let redis = RedisServer::start();
    let dir = TempDir::new("workers-spread");
    let config = dir.path().join("workers.yaml");
    std::fs::write(&config, "workers: 2\n").unwrap();
    let admin: std::net::SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let admin_arg = admin.to_string();
    let proxy = ProxyProcess::start(
        &config,
        &redis,
        dir.path().join("proxy.log"),
        &["--admin", &admin_arg],
    )
    .await;
    let names = proxy.thread_names();
    for worker in ["rpp-worker-0", "rpp-worker-1"] {
        assert!(names.iter().any(|n| n == worker), "{names:?}");
    }
    // Ten clients, one after another (each answered before the next connects): the acceptor
    // gives each to the worker with fewer sessions, so five run on each. A client on either
    // worker sees what one on the other wrote.
    let mut clients = Vec::new();
    for c in 0..10 {
        let mut conn = Raw::connect(&proxy.addr()).await;
        assert_eq!(conn.call(&["SET", &format!("k{c}"), "v"]).await, b"+OK\r\n");
        if c > 0 {
            assert_eq!(
                conn.call(&["GET", &format!("k{}", c - 1)]).await,
                b"$1\r\nv\r\n"
            );
        }
        clients.push(conn);
    }
    assert_eq!(worker_sessions(admin).await, [5, 5]);
    // Closed clients leave their worker's count.
    clients.truncate(3);
    let until = std::time::Instant::now() + common::DEADLINE;
    loop {
        let now = worker_sessions(admin).await;
        if now.iter().sum::<u64>() == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "{now:?} after 7 of 10 left"
        );
        tokio::time::sleep(common::POLL).await;
    }
}
