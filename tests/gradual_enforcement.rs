//! A rule enforced for a share of clients (`share: 10%`) and audited for the rest: through a
//! real proxy process, clients from 200 loopback addresses, the share refused is about the
//! share asked, the same clients across a reload, and raising the share keeps them; the file
//! says what is wrong with a share it cannot use.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::process::{ProxyProcess, run_bin};
use common::{Raw, RedisServer, TempDir, write_file};

const CLIENTS: u8 = 200;

fn policy(share: &str) -> String {
    format!(
        "rules:\n  - id: no-DBSIZE\n    deny: [DBSIZE]\n    share: '{share}'\n    message: use INFO keyspace\n"
    )
}

/// Which of the 200 addresses 127.0.1.1..=200 are refused DBSIZE; the others must be
/// answered (audited, not refused).
async fn refused(proxy: &ProxyProcess) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 1..=CLIENTS {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 1, i));
        let mut c = Raw::connect_from(proxy.addr(), from).await;
        let reply = c.call(&["DBSIZE"]).await;
        if reply.starts_with(b"-") {
            let text = String::from_utf8_lossy(&reply).into_owned();
            assert!(
                text.contains("no-DBSIZE") && text.contains("INFO keyspace"),
                "{text}"
            );
            out.push(i);
        } else {
            assert!(
                reply.starts_with(b":"),
                "{}",
                String::from_utf8_lossy(&reply)
            );
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_of_client_addresses_is_refused_the_same_ones_across_reloads() {
    let redis = RedisServer::start();
    let tmp = TempDir::new("share");
    let file = write_file(tmp.path(), "p.yaml", &policy("10%"));
    let proxy = ProxyProcess::start(&file, &redis, tmp.path().join("log"), &[]).await;
    assert!(
        proxy
            .log_text()
            .contains("no-DBSIZE enforce 10% of client addresses"),
        "{}",
        proxy.log_text()
    );
    let ten = refused(&proxy).await;
    // 10% of 200 is 20; the hash is fixed, so this count is too: a wide band, not a guess.
    assert!(
        (8..=35).contains(&ten.len()),
        "{} refused: {ten:?}",
        ten.len()
    );

    // A reload that changes nothing of the rule: the same clients.
    write_file(
        tmp.path(),
        "p.yaml",
        &format!("# touched\n{}", policy("10%")),
    );
    proxy.signal("-HUP");
    proxy.wait_for_log("policy reloaded", 1).await;
    assert_eq!(refused(&proxy).await, ten);

    // 50%: everyone refused at 10% still is, and more.
    write_file(tmp.path(), "p.yaml", &policy("50%"));
    proxy.signal("-HUP");
    proxy.wait_for_log("policy reloaded", 2).await;
    let fifty = refused(&proxy).await;
    assert!(
        ten.iter().all(|i| fifty.contains(i)),
        "{ten:?} not all in {fifty:?}"
    );
    assert!(
        (70..=130).contains(&fifty.len()),
        "{} refused at 50%",
        fifty.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_the_file_cannot_use_is_named_with_its_line() {
    let tmp = TempDir::new("share-check");
    for (rule, says) in [
        ("    share: 'ten'\n", "is not a share"),
        ("    share: '120%'\n", "is not a share"),
        (
            "    share: '10%'\n    mode: audit\n",
            "needs `mode: enforce`",
        ),
        ("    share_by: tenant\n", "needs `share:`"),
    ] {
        let file = write_file(
            tmp.path(),
            "p.yaml",
            &format!("rules:\n  - id: r\n    deny: [DBSIZE]\n{rule}"),
        );
        let r = run_bin(&["--check", file.to_str().unwrap()], &[]).await;
        assert_eq!(r.code, Some(64), "{rule}: {}", r.stderr);
        assert!(
            r.stderr.contains(says) && r.stderr.contains("p.yaml:"),
            "{rule}: {}",
            r.stderr
        );
    }
}

/// `share_by: user`: `--explain --as-user` shows each user's part (the proxy judges a logged-in
/// client the same way), about the share of 100 users enforced, the same user always alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_user_explain_shows_each_users_part() {
    let tmp = TempDir::new("share-user");
    let file = write_file(
        tmp.path(),
        "p.yaml",
        "rules:\n  - id: no-DBSIZE\n    deny: [DBSIZE]\n    share: '30%'\n    share_by: user\n",
    );
    let path = file.to_str().unwrap();
    let mut enforced = Vec::new();
    for i in 0..100 {
        let user = format!("user{i}");
        let r = run_bin(&["--explain", path, "DBSIZE", "--as-user", &user], &[]).await;
        match r.code {
            // Exit 1: the command would be refused, so this user is in the enforced part.
            Some(1) => {
                assert!(r.stdout.contains("no-DBSIZE: refuses"), "{}", r.stdout);
                enforced.push(i);
            }
            _ => {
                assert_eq!(r.code, Some(0), "{}", r.stderr);
                assert!(r.stdout.contains("no-DBSIZE (audit)"), "{}", r.stdout);
            }
        }
    }
    assert!(
        (15..=45).contains(&enforced.len()),
        "{} of 100 users at 30%",
        enforced.len()
    );
    let again = run_bin(&["--explain", path, "DBSIZE", "--as-user", "user7"], &[]).await;
    assert_eq!(again.code == Some(1), enforced.contains(&7));
}
