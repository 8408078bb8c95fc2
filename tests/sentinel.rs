//! Sentinel discovery against a real Sentinel set-up (1 primary, 1 replica, 3 sentinels):
//! the primary is resolved and confirmed, a dead or ignorant sentinel is skipped, and a
//! failover is followed through `+switch-master`.

mod common;

use std::time::{Duration, Instant};

use common::sentinel::{MASTER, SentinelSetup};
use common::{DEADLINE, free_port};
use redis_policy_proxy::sentinel::{Primary, SentinelSpec, follow_primary, resolve_primary};
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
    assert_eq!(rx.borrow().as_ref().unwrap().epoch, 1, "one change, one epoch");
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
