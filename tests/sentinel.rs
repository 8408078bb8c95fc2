//! Sentinel mode against a real Sentinel set-up (1 primary, 1 replica, 3 sentinels): the
//! primary is resolved and confirmed, a dead or ignorant sentinel is skipped, a failover is
//! followed through `+switch-master`; and the proxy in `upstream.mode: sentinel` serves plain
//! clients with the policy applied, through a failover under a write load (nothing hangs,
//! no WAIT-confirmed write is lost), closing pinned sessions of the old primary.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::sentinel::{MASTER, SentinelSetup};
use common::{DEADLINE, Proxy, Raw, free_port, http_get, resp, show, wait_until};
use redis_policy_proxy::Config;
use redis_policy_proxy::sentinel::{Primary, SentinelSpec, follow_primary, resolve_primary};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

fn spec(sentinels: Vec<String>, name: &str) -> SentinelSpec {
    SentinelSpec {
        sentinels,
        master_name: name.to_string(),
        timeout: Duration::from_secs(2),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_is_resolved_and_a_failover_followed() {
    let setup = SentinelSetup::start();
    let primary = setup.primary.addr();
    let replica = setup.replica.addr();

    // A closed port first: skipped.
    let mut sentinels = vec![format!("127.0.0.1:{}", free_port())];
    sentinels.extend(setup.sentinel_addrs());
    let spec = spec(sentinels, MASTER);
    assert_eq!(resolve_primary(&spec).await.unwrap(), primary);

    let (tx, mut rx) = watch::channel(None);
    let follower = tokio::spawn(follow_primary(spec.clone(), tx));
    let until = Instant::now() + DEADLINE;
    let addr = |p: &Option<Primary>| p.as_ref().map(|p| p.addr.to_string());
    while addr(&rx.borrow_and_update()) != Some(primary.clone()) {
        assert!(Instant::now() < until, "initial primary not published");
        let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
    }

    setup.failover();
    let until = Instant::now() + DEADLINE * 2;
    while addr(&rx.borrow_and_update()) != Some(replica.clone()) {
        assert!(
            Instant::now() < until,
            "switch not followed; still {:?}",
            rx.borrow()
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
    }
    assert_eq!(
        rx.borrow().as_ref().unwrap().epoch,
        1,
        "one change, one epoch"
    );
    // Resolving again agrees, confirmed by ROLE on the new primary.
    let until = Instant::now() + DEADLINE;
    loop {
        match resolve_primary(&spec).await {
            Ok(addr) if addr == replica => break,
            other => assert!(Instant::now() < until, "{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(rx);
    follower.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_name_or_no_sentinel_is_an_error_naming_each_attempt() {
    let setup = SentinelSetup::start();
    let err = resolve_primary(&spec(setup.sentinel_addrs(), "nosuch"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`nosuch`") && err.matches("does not monitor").count() == 3,
        "{err}"
    );
    let dead = format!("127.0.0.1:{}", free_port());
    let err = resolve_primary(&spec(vec![dead.clone()], MASTER))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&dead) && err.contains("connect failed"),
        "{err}"
    );
}

/// The YAML of `upstream` in sentinel mode for `setup`.
fn sentinel_upstream(setup: &SentinelSetup) -> String {
    format!(
        "  mode: sentinel\n  sentinel:\n    sentinels: [{}]\n    master_name: {MASTER}\n    timeout_ms: 500\n",
        setup.sentinel_addrs().join(", ")
    )
}

/// `policy/default.yaml` with its upstream replaced by sentinel mode for `setup`.
fn default_policy_config(setup: &SentinelSetup) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    // Its data-changing rules enforced, as after the rollout the file describes.
    let text = common::default_policy_enforced();
    let upstream = "  address: 127.0.0.1:6379\n";
    assert!(text.contains(upstream));
    let text = text.replace(upstream, &sentinel_upstream(setup));
    redis_policy_proxy::setup::from_yaml(&text, &path).expect("default policy in sentinel mode")
}

/// Sentinel mode with no rules: reconnect quickly, as a failover test wants.
fn plain_config(setup: &SentinelSetup) -> Config {
    let text = format!(
        "upstream:\n{}  reconnect_min_ms: 10\n  reconnect_max_ms: 200\n",
        sentinel_upstream(setup)
    );
    redis_policy_proxy::setup::from_yaml(&text, Path::new("sentinel-test.yaml"))
        .expect("sentinel config parses")
}

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

/// `ROLE` straight to `node`: `master` or `slave`.
async fn role(node: &str) -> String {
    let reply = text(&Raw::connect(node).await.call(&["ROLE"]).await);
    reply.lines().nth(2).unwrap_or_default().to_string()
}

/// Polls through the proxy until a SET succeeds and lands on `primary` (read back directly).
async fn wait_served_by(proxy: &Proxy, primary: &str) {
    let until = Instant::now() + DEADLINE * 2;
    let mut n = 0;
    loop {
        n += 1;
        let key = format!("probe:{n}");
        if let Some(mut c) = Raw::try_connect(proxy.addr, DEADLINE).await {
            let got = {
                c.send(&resp(&["SET", &key, "1"])).await;
                c.collect_frames(1, DEADLINE).await
            };
            if got.frames.first().map(Vec::as_slice) == Some(b"+OK\r\n")
                && Raw::connect(primary).await.call(&["GET", &key]).await == b"$1\r\n1\r\n"
            {
                return;
            }
        }
        assert!(
            Instant::now() < until,
            "proxy never served writes from {primary}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_serves_the_sentinel_primary_with_the_policy_applied() {
    let setup = SentinelSetup::start();
    let primary = setup.primary.addr();
    let proxy = Proxy::start(default_policy_config(&setup)).await;
    let mut c = Raw::connect(proxy.addr).await;

    let keys = text(&c.call(&["KEYS", "*"]).await);
    assert!(
        keys.starts_with("-NOPERM policy deny-keys: KEYS is not allowed"),
        "{keys}"
    );
    assert_eq!(c.call(&["SET", "s:k", "v"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["GET", "s:k"]).await, b"$1\r\nv\r\n");
    // On the primary, with the default TTL the policy added.
    let mut direct = Raw::connect(&primary).await;
    assert_eq!(direct.call(&["GET", "s:k"]).await, b"$1\r\nv\r\n");
    let ttl = text(&direct.call(&["PTTL", "s:k"]).await);
    assert!(ttl.starts_with(':') && !ttl.starts_with(":-"), "{ttl}");

    let info = text(&c.call(&["INFO"]).await);
    assert!(
        info.contains(&format!("proxy_upstream:{primary}")),
        "{info}"
    );
    let (status, body) = http_get(proxy.admin, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    proxy.stop().await;
}

/// What one writer saw.
#[derive(Default, Debug)]
struct Counts {
    sent: u64,
    acked: u64,
    errored: u64,
    hung: u64,
    /// WAITs answered 1 or more: the writes since the previous WAIT are on a replica.
    waits_ok: u64,
    /// WAITs answered 0 or an error: the writes since the previous WAIT are unconfirmed.
    waits_failed: u64,
    /// Acknowledged writes a WAIT confirmed: (key, value).
    confirmed: Vec<(String, String)>,
    /// Every acknowledged write: (key, value).
    acked_writes: Vec<(String, String)>,
    /// Failed SET and WAIT answers by their first words, for the report.
    answers: std::collections::BTreeMap<String, u64>,
}

/// The start of a reply, enough to tell errors apart.
fn first_words(reply: &[u8]) -> String {
    text(reply)
        .split(';')
        .next()
        .unwrap_or_default()
        .trim_end()
        .chars()
        .take(90)
        .collect()
}

/// Bound on any one reply: above the proxy's connect timeout and Sentinel's failover steps,
/// far below "hung".
const REPLY_BOUND: Duration = Duration::from_secs(5);

/// SETs distinct keys through the proxy until `stop`, a `WAIT 1 500` after every 20 acked
/// writes; reconnects when the proxy closes the connection.
async fn writer(
    proxy: std::net::SocketAddr,
    id: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Counts {
    let mut counts = Counts::default();
    let mut c = Raw::connect(proxy).await;
    let mut unconfirmed: Vec<(String, String)> = Vec::new();
    let mut n = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        n += 1;
        let (key, value) = (format!("w{id}:{n}"), format!("v{n}"));
        counts.sent += 1;
        if c.stream
            .write_all(&resp(&["SET", &key, &value]))
            .await
            .is_err()
        {
            counts.errored += 1;
            c = Raw::connect(proxy).await;
            unconfirmed.clear();
            continue;
        }
        let got = c.collect_frames(1, REPLY_BOUND).await;
        match got.frames.first() {
            Some(f) if f == b"+OK\r\n" => {
                counts.acked += 1;
                counts.acked_writes.push((key.clone(), value.clone()));
                unconfirmed.push((key, value));
            }
            Some(f) => {
                *counts.answers.entry(first_words(f)).or_default() += 1;
                counts.errored += 1;
            }
            None if got.closed => {
                counts.errored += 1;
                c = Raw::connect(proxy).await;
                unconfirmed.clear();
                continue;
            }
            None => {
                counts.hung += 1;
                c = Raw::connect(proxy).await;
                unconfirmed.clear();
                continue;
            }
        }
        if unconfirmed.len() >= 20 {
            let _ = c.stream.write_all(&resp(&["WAIT", "1", "500"])).await;
            let got = c.collect_frames(1, REPLY_BOUND).await;
            match got.frames.first() {
                Some(f) if f.starts_with(b":") && f != b":0\r\n" => {
                    counts.waits_ok += 1;
                    counts.confirmed.append(&mut unconfirmed);
                }
                Some(f) => {
                    *counts.answers.entry(first_words(f)).or_default() += 1;
                    counts.waits_failed += 1;
                    unconfirmed.clear();
                }
                None => {
                    // Closed (the proxy closes after a WAIT spanning a failover) or hung.
                    if !got.closed {
                        counts.hung += 1;
                    }
                    counts.waits_failed += 1;
                    unconfirmed.clear();
                    c = Raw::connect(proxy).await;
                }
            }
            if got.closed {
                c = Raw::connect(proxy).await;
            }
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_writes_loses_no_confirmed_write_and_nothing_hangs() {
    let setup = SentinelSetup::start();
    let (old, new) = (setup.primary.addr(), setup.replica.addr());
    let proxy = Proxy::start(plain_config(&setup)).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|i| tokio::spawn(writer(proxy.addr, i, stop.clone())))
        .collect();
    // Writes flowing (and confirmed) before the failover starts.
    wait_until("writes on the primary", || async {
        let size = text(&Raw::connect(&old).await.call(&["DBSIZE"]).await);
        size.trim_start_matches(':')
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
            > 100
    })
    .await;

    let started = Instant::now();
    let setup = tokio::task::spawn_blocking(move || {
        setup.failover();
        setup
    })
    .await
    .unwrap();
    let failover_took = started.elapsed();
    // Service resumes: writes through the proxy land on the new primary, which ROLE confirms.
    wait_served_by(&proxy, &new).await;
    let resumed_after = started.elapsed();
    assert_eq!(role(&new).await, "master");
    // A little more load on the new primary, then stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = Counts::default();
    for w in writers {
        let c = tokio::time::timeout(DEADLINE * 2, w)
            .await
            .expect("writer finished")
            .unwrap();
        total.sent += c.sent;
        total.acked += c.acked;
        total.errored += c.errored;
        total.hung += c.hung;
        total.waits_ok += c.waits_ok;
        total.waits_failed += c.waits_failed;
        total.confirmed.extend(c.confirmed);
        total.acked_writes.extend(c.acked_writes);
        for (answer, n) in c.answers {
            *total.answers.entry(answer).or_default() += n;
        }
    }

    // Every confirmed write is on the new primary; acknowledged but unconfirmed writes may
    // be lost (acknowledged by the old primary after the promotion), and are only counted.
    let mut direct = Raw::connect(&new).await;
    let mut lost = Vec::new();
    for (key, value) in &total.confirmed {
        if direct.call(&["GET", key]).await != common::bulk(value.as_bytes()) {
            lost.push(key.clone());
        }
    }
    let mut acked_missing = 0;
    for (key, value) in &total.acked_writes {
        if direct.call(&["GET", key]).await != common::bulk(value.as_bytes()) {
            acked_missing += 1;
        }
    }
    eprintln!(
        "sentinel failover under load: sent {} acked {} errored {} hung {} | WAIT ok {} failed {} \
         | confirmed {} lost {} | acked but missing on the new primary {} | failover {:?}, \
         writes on the new primary {:?} after it began",
        total.sent,
        total.acked,
        total.errored,
        total.hung,
        total.waits_ok,
        total.waits_failed,
        total.confirmed.len(),
        lost.len(),
        acked_missing,
        failover_took,
        resumed_after,
    );
    eprintln!(
        "failed answers (SET errors, WAIT :0 or errors): {:?}",
        total.answers
    );
    assert_eq!(
        total.hung, 0,
        "every command answered within {REPLY_BOUND:?}"
    );
    assert_eq!(
        total.sent,
        total.acked + total.errored,
        "each write acked or errored"
    );
    assert!(lost.is_empty(), "confirmed writes lost: {lost:?}");
    assert!(
        total.confirmed.len() > 100,
        "too few confirmed writes to mean anything"
    );
    // Every shared connection (one per RESP version, and the control one) is up again, on
    // the new primary, and the gauge did not drift through the switch.
    wait_until("3 upstream connections after the failover", || async {
        let metrics = http_get(proxy.admin, "/metrics").await.1;
        common::sample(&metrics, "rpp_upstream_connections") == 3.0
    })
    .await;
    assert_eq!(http_get(proxy.admin, "/readyz").await.0, 200);
    drop(setup);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_sessions_on_the_old_primary_are_closed_by_a_failover() {
    let setup = SentinelSetup::start();
    let (old, new) = (setup.primary.addr(), setup.replica.addr());
    let proxy = Proxy::start(plain_config(&setup)).await;

    let mut subscriber = Raw::connect(proxy.addr).await;
    let confirm = subscriber.call(&["SUBSCRIBE", "news"]).await;
    assert!(text(&confirm).contains("subscribe"), "{}", show(&confirm));
    let mut tx = Raw::connect(proxy.addr).await;
    assert_eq!(tx.call(&["MULTI"]).await, b"+OK\r\n");
    assert_eq!(tx.call(&["SET", "multi:k", "1"]).await, b"+QUEUED\r\n");
    let mut watcher = Raw::connect(proxy.addr).await;
    assert_eq!(watcher.call(&["WATCH", "watched"]).await, b"+OK\r\n");
    // A session with nothing pinned keeps working.
    let mut plain = Raw::connect(proxy.addr).await;
    assert_eq!(plain.call(&["SET", "plain:k", "1"]).await, b"+OK\r\n");

    let setup = tokio::task::spawn_blocking(move || {
        setup.failover();
        setup
    })
    .await
    .unwrap();

    // The subscriber's connection is closed: no silent subscription to a demoted node.
    let (rest, closed) = subscriber.read_to_close(DEADLINE).await;
    assert!(closed, "subscriber not closed; got {}", show(&rest));
    // The transaction's connection too: EXEC never runs on the old primary.
    let (rest, closed) = tx.read_to_close(DEADLINE).await;
    assert!(closed, "MULTI session not closed; got {}", show(&rest));
    let (rest, closed) = watcher.read_to_close(DEADLINE).await;
    assert!(closed, "WATCH session not closed; got {}", show(&rest));
    assert_eq!(
        Raw::connect(&old).await.call(&["EXISTS", "multi:k"]).await,
        b":0\r\n"
    );

    // The unpinned session is still open and reaches the new primary.
    wait_served_by(&proxy, &new).await;
    let reply = plain.call(&["SET", "plain:k", "2"]).await;
    assert_eq!(reply, b"+OK\r\n", "{}", show(&reply));
    assert_eq!(
        Raw::connect(&new).await.call(&["GET", "plain:k"]).await,
        b"$1\r\n2\r\n"
    );
    // Pub/sub resumes on the new primary for a client that subscribes again.
    let mut subscriber = Raw::connect(proxy.addr).await;
    subscriber.call(&["SUBSCRIBE", "news"]).await;
    assert_eq!(plain.call(&["PUBLISH", "news", "hello"]).await, b":1\r\n");
    let message = subscriber.read_frame().await;
    assert!(text(&message).contains("hello"), "{}", show(&message));
    drop(setup);
    proxy.stop().await;
}
