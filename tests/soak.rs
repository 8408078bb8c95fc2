//! Soak: a mixed workload (strings, hashes, lists, sets, pipelines, pub/sub, MULTI, refused
//! commands, reconnecting clients) through the real binary with the default policy, with the
//! proxy's RSS sampled every second. After warm-up, memory must not keep growing.
//!
//! CI runs it for `SOAK_SECS` (default 15). The long run, from a developer session:
//!     SOAK_SECS=3600 cargo test --release --test soak -- --nocapture
//! prints the RSS curve (one sample a second, summarised every minute).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::process::ProxyProcess;
use common::{DEADLINE, RedisServer, TempDir, resp, write_file};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `commands` pipelined and reads exactly one reply per command (scanned with the
/// proxy's own reply scanner); returns how many were error replies.
async fn round(
    s: &mut TcpStream,
    commands: &[Vec<u8>],
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let bytes: Vec<u8> = commands.concat();
    s.write_all(&bytes).await?;
    buf.clear();
    let (mut seen, mut pos, mut errors) = (0, 0, 0);
    while seen < commands.len() {
        let mut chunk = [0u8; 16 * 1024];
        let n = tokio::time::timeout(DEADLINE, s.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::other("reply timed out"))??;
        if n == 0 {
            return Err(std::io::Error::other("closed"));
        }
        buf.extend_from_slice(&chunk[..n]);
        while let Ok(Some(len)) = redis_policy_proxy::reply::scan(&buf[pos..]) {
            if buf[pos] == b'-' {
                errors += 1;
            }
            pos += len;
            seen += 1;
        }
    }
    Ok(errors)
}

/// One client's loop: a mix of commands, a new connection every 200 rounds.
async fn client(addr: String, id: usize, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) {
    let value = "v".repeat(100 + id * 37 % 900);
    let mut buf = Vec::new();
    let mut i: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(&addr).await else {
            continue;
        };
        for _ in 0..200 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            i += 1;
            let k = format!("soak:{id}:{}", i % 1000);
            let cmds = vec![
                resp(&["SET", &k, &value]),
                resp(&["GET", &k]),
                resp(&["HSET", &format!("h:{id}"), &format!("f{}", i % 50), "1"]),
                resp(&["LPUSH", &format!("l:{id}"), "x"]),
                resp(&["LTRIM", &format!("l:{id}"), "0", "99"]),
                resp(&["SADD", &format!("s:{id}"), &format!("{}", i % 100)]),
                resp(&["INCR", &format!("c:{id}")]),
                resp(&["KEYS", "*"]),
                resp(&["MULTI"]),
                resp(&["INCR", &format!("c:{id}")]),
                resp(&["EXEC"]),
                resp(&["PUBLISH", "soak", "m"]),
            ];
            match round(&mut s, &cmds, &mut buf).await {
                // KEYS is refused by the default policy: exactly one error per round.
                Ok(1) => {
                    done.fetch_add(cmds.len() as u64, Ordering::Relaxed);
                }
                Ok(e) => panic!("{e} error replies in a round (expected only KEYS's)"),
                Err(e) => panic!("client {id}: {e}"),
            }
            // Paced so a long run measures leaks, not saturation.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_under_a_mixed_workload() {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let redis = RedisServer::start();
    let tmp = TempDir::new("soak");
    let default = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let text = std::fs::read_to_string(default)
        .unwrap()
        .replace("listen: 127.0.0.1:8379", "listen: \"off\"");
    let policy = write_file(tmp.path(), "policy.yaml", &text);
    let proxy = ProxyProcess::start(&policy, &redis, tmp.path().join("proxy.log"), &[]).await;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for id in 0..20 {
        tasks.push(tokio::spawn(client(
            proxy.addr(),
            id,
            stop.clone(),
            done.clone(),
        )));
    }
    // A subscriber that reads everything published.
    let mut sub = TcpStream::connect(proxy.addr()).await.unwrap();
    sub.write_all(&resp(&["SUBSCRIBE", "soak"])).await.unwrap();
    let sub_task = tokio::spawn(async move {
        let mut chunk = [0u8; 64 * 1024];
        while let Ok(n) = sub.read(&mut chunk).await {
            if n == 0 {
                break;
            }
        }
    });

    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(proxy.rss_kib());
        if samples.len() % 60 == 0 {
            eprintln!(
                "soak {:>5} s: rss {} KiB, {} commands",
                samples.len(),
                samples.last().unwrap(),
                done.load(Ordering::Relaxed)
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("client task");
    }
    sub_task.abort();
    let warm = samples.len() / 3;
    let after_warmup = samples[..=warm].iter().copied().max().unwrap();
    let end = *samples.last().unwrap();
    let peak = samples.iter().copied().max().unwrap();
    eprintln!(
        "soak: {secs} s, {} commands; rss after warm-up {after_warmup} KiB, peak {peak} KiB, end {end} KiB; curve (KiB, per second): {:?}",
        done.load(Ordering::Relaxed),
        if samples.len() <= 120 {
            samples.clone()
        } else {
            samples.iter().step_by(60).copied().collect()
        }
    );
    assert!(
        done.load(Ordering::Relaxed) > 1000,
        "the workload did not run"
    );
    assert!(
        end <= after_warmup + 8 * 1024,
        "RSS grew after warm-up: {after_warmup} KiB -> {end} KiB"
    );
}
