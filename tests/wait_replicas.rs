//! WAIT through the proxy counts the client's own earlier writes, even though those went over
//! a shared connection and WAIT runs on a dedicated one.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::time::{Duration, Instant};

use common::{DEADLINE, Proxy, Raw, RedisServer};

/// Polls `INFO replication` on `server` until it contains `needle`, within the deadline.
async fn wait_info(server: &RedisServer, needle: &str) {
    let until = Instant::now() + DEADLINE;
    loop {
        let info = server.direct(&["INFO", "replication"]).await;
        if String::from_utf8_lossy(&info).contains(needle) {
            return;
        }
        assert!(Instant::now() < until, "no `{needle}` in INFO replication");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pid(server: &RedisServer) -> String {
    let info = server.direct(&["INFO", "server"]).await;
    let info = String::from_utf8_lossy(&info).to_string();
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .expect("process_id in INFO server")
        .trim()
        .to_string()
}

fn signal(pid: &str, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, pid])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_counts_writes_made_over_the_shared_connection() {
    let primary = RedisServer::start();
    let port = primary.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    wait_info(&replica, "master_link_status:up").await;
    wait_info(&primary, "connected_slaves:1").await;
    let proxy = Proxy::to(&primary).await;
    let mut c = Raw::connect(proxy.addr).await;

    // Freeze the replica, then write through the shared connection: no replica can have
    // acknowledged this write, so WAIT must time out with 0. (Run on a fresh connection
    // without the barrier, WAIT would count acknowledgements of nothing and answer 1.)
    let replica_pid = pid(&replica).await;
    signal(&replica_pid, "-STOP");
    assert_eq!(c.call(&["SET", "wait:k", "v"]).await, b"+OK\r\n");
    let reply = c.call(&["WAIT", "1", "300"]).await;
    signal(&replica_pid, "-CONT");
    assert_eq!(reply, b":0\r\n", "WAIT ignored the client's write");

    // Once the replica runs again, the same write is acknowledged.
    assert_eq!(c.call(&["WAIT", "1", "5000"]).await, b":1\r\n");
    // And the session is back on the shared connection for ordinary commands.
    assert_eq!(c.call(&["GET", "wait:k"]).await, b"$1\r\nv\r\n");
}
