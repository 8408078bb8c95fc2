//! Upstream faults under load: a Redis that stops answering (SIGSTOP) or dies. Every command
//! gets a reply (a result or a clear error) within the command timeout, nothing hangs, and
//! every write the proxy acknowledged is in Redis afterwards.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::time::{Duration, Instant};

use common::{DEADLINE, Proxy, Raw, RedisServer, config_for, resp, show};

/// The proxy's upstream errors: `-ERR upstream …` for a command whose connection was lost
/// after it was sent, `-LOADING upstream …` for one that could not be sent.
fn is_upstream_error(reply: &[u8]) -> bool {
    reply.starts_with(b"-ERR upstream") || reply.starts_with(b"-LOADING upstream")
}

/// Pipelines `n` SETs of `key:i`, returns the indexes acknowledged with +OK and the number of
/// error replies; panics if any reply is missing after the deadline (a hang).
async fn pipeline_sets(proxy: &Proxy, tag: &str, n: usize) -> (Vec<usize>, usize) {
    let mut c = Raw::connect(proxy.addr).await;
    let mut input = Vec::new();
    for i in 0..n {
        input.extend(resp(&["SET", &format!("{tag}:{i}"), "v"]));
    }
    c.send(&input).await;
    let got = c.collect_frames(n, DEADLINE).await;
    assert_eq!(
        got.frames.len(),
        n,
        "replies missing (hung): {}",
        show(&got.joined()[..200.min(got.joined().len())])
    );
    let mut acked = Vec::new();
    let mut errors = 0;
    for (i, f) in got.frames.iter().enumerate() {
        if f == b"+OK\r\n" {
            acked.push(i);
        } else {
            assert!(is_upstream_error(f), "unexpected reply: {}", show(f));
            errors += 1;
        }
    }
    (acked, errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_upstream_fails_commands_within_the_timeout_then_service_resumes() {
    let redis = RedisServer::start();
    let mut config = config_for(&redis.addr());
    config.upstream.command_timeout_ms.value = 300;
    let proxy = Proxy::start(config).await;
    let (acked, _) = pipeline_sets(&proxy, "before", 1000).await;
    assert_eq!(acked.len(), 1000);

    redis.signal("-STOP");
    let started = Instant::now();
    let mut c = Raw::connect(proxy.addr).await;
    let reply = c.call(&["SET", "during", "v"]).await;
    let waited = started.elapsed();
    assert!(
        reply.starts_with(b"-ERR upstream") && show(&reply).contains("command_timeout_ms"),
        "{}",
        show(&reply)
    );
    assert!(
        waited >= Duration::from_millis(250),
        "answered before the timeout: {waited:?}"
    );
    redis.signal("-CONT");

    // The shared connection reconnects; a fresh pipeline is served in full.
    let until = Instant::now() + DEADLINE;
    loop {
        let (acked, errors) = pipeline_sets(&proxy, "after", 500).await;
        if errors == 0 {
            assert_eq!(acked.len(), 500);
            break;
        }
        assert!(Instant::now() < until, "service never resumed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every acknowledged write is there.
    let mut direct = redis.raw().await;
    for i in (0..1000).step_by(97) {
        assert_eq!(
            direct.call(&["EXISTS", &format!("before:{i}")]).await,
            b":1\r\n"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_killed_mid_pipeline_loses_no_acknowledged_write() {
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let proxy = Proxy::to(&redis).await;
    let writer = {
        let addr = proxy.addr;
        tokio::spawn(async move {
            let mut c = Raw::connect(addr).await;
            let n = 20_000;
            let mut input = Vec::new();
            for i in 0..n {
                input.extend(resp(&["SET", &format!("k:{i}"), "v"]));
            }
            c.send(&input).await;
            c.collect_frames(n, DEADLINE * 2).await.frames
        })
    };
    // Kill Redis while the pipeline is in flight (it takes a while with fsync always).
    tokio::time::sleep(Duration::from_millis(30)).await;
    redis.kill();
    let frames = writer.await.unwrap();
    assert_eq!(frames.len(), 20_000, "every command got a reply; none hung");
    let acked: Vec<usize> = (0..frames.len())
        .filter(|&i| frames[i] == b"+OK\r\n")
        .collect();
    let errors = frames.len() - acked.len();
    for f in &frames {
        assert!(f == b"+OK\r\n" || is_upstream_error(f), "{}", show(f));
    }
    assert!(
        errors > 0,
        "the kill came too late to test anything ({} acked)",
        acked.len()
    );
    // Replies stay in order: once one failed, none after it succeeded on that connection.
    if let Some(first_error) = (0..frames.len()).find(|&i| frames[i] != b"+OK\r\n") {
        assert!(
            acked.iter().all(|&i| i < first_error),
            "a reply out of order"
        );
    }
    redis.restart();
    let mut direct = redis.raw().await;
    for &i in &acked {
        assert_eq!(
            direct.call(&["EXISTS", &format!("k:{i}")]).await,
            b":1\r\n",
            "acknowledged write k:{i} lost"
        );
    }
}

/// A cluster node that left the slot map is retired: once its connections fail they are not
/// re-established (no connect attempt, error count or log line every backoff for a node gone
/// for good) until it is back in a map, when they reconnect at once.
#[tokio::test]
async fn a_retired_pool_stops_redialling_until_it_is_back() {
    use redis_policy_proxy::metrics::Metrics;
    use redis_policy_proxy::policy::Policy;
    use redis_policy_proxy::upstream::pool::{Pool, PoolSettings};
    use std::sync::Arc;

    let mut redis = RedisServer::start();
    let mut config = config_for(&redis.addr());
    config.upstream.reconnect_min_ms.value = 10;
    config.upstream.reconnect_max_ms.value = 20;
    let metrics = Metrics::new(Arc::new(arc_swap::ArcSwap::from_pointee(Policy::default())));
    let settings = PoolSettings::from_config(&config).unwrap();
    let pool = Pool::start_node(redis.addr().into(), &settings, metrics.clone());
    let errors = || metrics.upstream_connect_errors.get();
    let until = Instant::now() + DEADLINE;
    while !pool.any_up() {
        assert!(Instant::now() < until, "pool never connected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Not retired: a dead node is dialled every backoff (20 ms here).
    redis.kill();
    let before = errors();
    while errors() < before + 5 {
        assert!(Instant::now() < until, "no reconnect attempts");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Retired: each connection makes at most the attempt it was waiting for, then none.
    assert!(pool.set_retired(true));
    assert!(!pool.set_retired(true), "no change the second time");
    let mut settled = errors();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = errors();
        if now == settled {
            break;
        }
        assert!(Instant::now() < until, "still dialling a retired node");
        settled = now;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(errors(), settled, "a retired node was dialled again");

    // Back in the map: connected again without waiting for a command.
    redis.restart();
    assert!(pool.set_retired(false));
    while !pool.any_up() {
        assert!(Instant::now() < until, "pool did not reconnect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A pool whose primary Sentinel has not named yet (a mirror starts while its config loads,
/// before the sentinels answer) keeps its first commands until a primary is named, rather
/// than refusing them milliseconds before it is known (CI lost a mirror's first write so);
/// with no primary named, it refuses them once a connect would have timed out, never hangs.
#[tokio::test]
async fn a_pool_waits_for_its_first_primary_only_as_long_as_a_connect_may_take() {
    use redis_policy_proxy::metrics::Metrics;
    use redis_policy_proxy::policy::Policy;
    use redis_policy_proxy::upstream::address::{AddrEpoch, Address};
    use redis_policy_proxy::upstream::pool::{Pool, PoolSettings};
    use std::sync::Arc;

    let redis = RedisServer::start();
    let mut config = config_for(&redis.addr());
    config.upstream.connect_timeout_ms.value = 5_000;
    let metrics = Metrics::new(Arc::new(arc_swap::ArcSwap::from_pointee(Policy::default())));
    let settings = PoolSettings::from_config(&config).unwrap();
    let (name, primary) = tokio::sync::watch::channel(None);
    let address = Address::Followed {
        primary,
        label: "sentinel:m".into(),
    };
    let pool = Pool::start_at(address, &settings, metrics.clone());
    let control = pool.control();
    let asked = tokio::spawn(async move { control.request(&[b"PING"]).await });
    // The command is sent before the primary is known; it waits for it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!asked.is_finished(), "refused before the first primary");
    name.send_replace(Some(AddrEpoch {
        addr: redis.addr().into(),
        epoch: 0,
    }));
    let reply = tokio::time::timeout(DEADLINE, asked)
        .await
        .expect("answered once the primary is named")
        .unwrap();
    assert_eq!(&reply.expect("a reply, not an error")[..], b"+PONG\r\n");

    // Never named: refused after connect_timeout_ms, with the reason.
    config.upstream.connect_timeout_ms.value = 300;
    let settings = PoolSettings::from_config(&config).unwrap();
    let (_name, primary) = tokio::sync::watch::channel(None);
    let address = Address::Followed {
        primary,
        label: "sentinel:m".into(),
    };
    let pool = Pool::start_at(address, &settings, metrics);
    let started = Instant::now();
    let refused = tokio::time::timeout(DEADLINE, pool.control().request(&[b"PING"]))
        .await
        .expect("refused, not hung");
    let error = refused.expect_err("no primary: an error").to_string();
    assert!(error.contains("no sentinel has named"), "{error}");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "refused before a connect could have timed out"
    );
}
