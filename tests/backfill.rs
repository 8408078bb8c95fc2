//! `backfill` copies one real redis-server's keys to another: every type, with its TTL, keys the
//! target already holds kept (or replaced with `--replace`), resumable from its state file, and
//! a target that cannot be reached or refuses the login is one line and exit 69.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server processes in wall-clock time"
)]

mod common;

use common::keys::{assert_same, fill, text};
use common::process::run_bin;
use common::{RedisServer, TempDir, write_file};

const EX_USAGE: i32 = 64;
const EX_UNAVAILABLE: i32 = 69;

/// A policy file whose upstream is `redis`.
fn policy_for(tmp: &TempDir, redis: &RedisServer) -> String {
    let file = write_file(
        tmp.path(),
        "p.yaml",
        &format!(
            "upstream:\n  address: {}\nrules:\n  - id: no-KEYS\n    deny: [KEYS]\n",
            redis.addr()
        ),
    );
    file.to_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_is_copied_with_its_ttl_and_the_targets_own_are_kept() {
    let (from, to) = (RedisServer::start(), RedisServer::start());
    fill(&from, 250).await;
    // Written to the target meanwhile (by mirrored writes): newer, kept.
    to.direct(&["SET", "s:plain", "newer"]).await;
    let tmp = TempDir::new("backfill");
    let policy = policy_for(&tmp, &from);
    let r = run_bin(&["-c", &policy, "backfill", "--to", &to.addr()], &[]).await;
    assert_eq!(r.code, Some(0), "{} {}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("257 keys read, 256 copied, 1 already on the target and kept"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("complete"), "{}", r.stdout);
    assert_same(&from, &to, &["s:plain"]).await;
    assert_eq!(to.direct(&["GET", "s:plain"]).await, b"$5\r\nnewer\r\n");
    // --replace: the source's value wins.
    let r = run_bin(
        &["-c", &policy, "backfill", "--to", &to.addr(), "--replace"],
        &[],
    )
    .await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("257 copied"), "{}", r.stdout);
    assert_same(&from, &to, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_backfill_resumes_from_its_state_file() {
    let (from, to) = (RedisServer::start(), RedisServer::start());
    fill(&from, 600).await;
    let tmp = TempDir::new("backfill-resume");
    let policy = policy_for(&tmp, &from);
    let state = tmp.path().join("state.json");
    let state = state.to_str().unwrap();
    let args = [
        "-c",
        &policy,
        "backfill",
        "--to",
        &to.addr(),
        "--state",
        state,
    ];
    let first = run_bin(&[&args[..], &["--max-keys", "200"]].concat(), &[]).await;
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    assert!(first.stdout.contains("run again"), "{}", first.stdout);
    let part = text(&to.direct(&["DBSIZE"]).await);
    let copied: u64 = part[1..].trim().parse().unwrap();
    assert!((200..607).contains(&copied), "{part}");
    let saved = std::fs::read_to_string(state).unwrap();
    assert!(saved.contains("\"complete\": false"), "{saved}");
    // Again: goes on from the cursor, and ends with every key.
    let rest = run_bin(&args, &[]).await;
    assert_eq!(rest.code, Some(0), "{}", rest.stderr);
    assert!(rest.stdout.contains("607 keys read"), "{}", rest.stdout);
    assert!(rest.stdout.contains("complete"), "{}", rest.stdout);
    assert_same(&from, &to, &[]).await;
    // A finished state file says so and copies nothing more.
    let again = run_bin(&args, &[]).await;
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert!(again.stdout.contains("607 keys read"), "{}", again.stdout);
    // Another target with this file: refused, not a cursor used elsewhere.
    let other = RedisServer::start();
    let wrong = run_bin(
        &[
            "-c",
            &policy,
            "backfill",
            "--to",
            &other.addr(),
            "--state",
            state,
        ],
        &[],
    )
    .await;
    assert_eq!(wrong.code, Some(EX_USAGE), "{}", wrong.stderr);
    assert!(
        wrong.stderr.contains("delete it to start over"),
        "{}",
        wrong.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_refusing_target_is_one_line_and_exit_69() {
    let from = RedisServer::start();
    fill(&from, 0).await;
    let tmp = TempDir::new("backfill-refused");
    let policy = policy_for(&tmp, &from);
    let port = common::free_port();
    let r = run_bin(
        &[
            "-c",
            &policy,
            "backfill",
            "--to",
            &format!("127.0.0.1:{port}"),
        ],
        &[],
    )
    .await;
    assert_eq!(r.code, Some(EX_UNAVAILABLE), "{}", r.stderr);
    assert!(r.stderr.contains("connection refused"), "{}", r.stderr);
    let locked = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let addr = locked.addr();
    let with_password = |pw: &'static str| {
        let args = [
            "-c",
            &policy,
            "backfill",
            "--to",
            &addr,
            "--to-password-env",
            "RPP_T_PW",
        ]
        .map(str::to_string);
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_bin(&args, &[("RPP_T_PW", pw)]).await
        }
    };
    let r = with_password("wrong").await;
    assert_eq!(r.code, Some(EX_UNAVAILABLE), "{}", r.stderr);
    assert!(r.stderr.contains("refused the login"), "{}", r.stderr);
    let r = with_password("s3cret").await;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_same(&from, &locked, &[]).await;
}

/// Keys the target refuses (here: a target with no memory to spare) are counted, named, and
/// make the exit status 69, the copied ones kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_keys_are_named_and_fail_the_run() {
    let (from, to) = (RedisServer::start(), RedisServer::start());
    fill(&from, 0).await;
    to.direct(&["CONFIG", "SET", "maxmemory", "1"]).await;
    to.direct(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .await;
    let tmp = TempDir::new("backfill-oom");
    let policy = policy_for(&tmp, &from);
    let r = run_bin(&["-c", &policy, "backfill", "--to", &to.addr()], &[]).await;
    assert_eq!(r.code, Some(EX_UNAVAILABLE), "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains("7 refused"), "{}", r.stdout);
    assert!(
        r.stdout.contains("refused: ") && r.stdout.contains("OOM"),
        "{}",
        r.stdout
    );
    assert!(
        r.stderr.contains("the target refused 7 keys"),
        "{}",
        r.stderr
    );
}
