//! In front of a production Redis (issue 28): the upstream password from an environment
//! variable or a file instead of the policy file, `--check` naming a missing one, `/readyz`
//! saying that the credentials are missing or refused (and the metric and INFO field that
//! say so), SIGHUP without a file, blocking commands kept out of the latency histogram, and
//! clients' own AUTH (the Redis password, a Redis ACL user) going on to Redis beside the
//! proxy's users.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::process::ProxyProcess;
use common::*;

const PASSWORD: &str = "prod-secret-28";

/// SHA-256 of `ops-pw`, the proxy user `ops`'s password.
const OPS_SHA256: &str = "e17304c364ead29fb2b55a09e7287d40873d79a2a2226f8fb6fcd25c9acce886";

/// Runs the binary to completion (bounded) with `env` added: exit code, stdout, stderr.
async fn run_bin(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let run = common::process::run_bin(args, env).await;
    (run.code, run.stdout, run.stderr)
}

/// `SET`/`GET` through the proxy process with redis-cli: the proxy logged in upstream.
async fn assert_serves(proxy: &ProxyProcess) {
    let out = redis_cli(proxy.port, &["SET", "k28", "v"]).await;
    assert_eq!(out.stdout, "OK\n", "stderr: {}", out.stderr);
    let out = redis_cli(proxy.port, &["GET", "k28"]).await;
    assert_eq!(out.stdout, "v\n", "log: {}", proxy.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_password_comes_from_an_environment_variable() {
    let redis = RedisServer::start_with(&["--requirepass", PASSWORD]);
    let tmp = TempDir::new("pw-env");
    let policy = write_file(
        tmp.path(),
        "policy.yaml",
        "upstream:\n  password_env: RPP_TEST_UPSTREAM_PASSWORD\n",
    );
    let proxy = ProxyProcess::start_with(
        Some(&policy),
        &redis,
        tmp.path().join("proxy.log"),
        &[],
        &[("RPP_TEST_UPSTREAM_PASSWORD", PASSWORD)],
    )
    .await;
    assert_serves(&proxy).await;
    assert!(
        !proxy.log_text().contains(PASSWORD),
        "the log shows the password: {}",
        proxy.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_user_and_password_come_from_the_environment_and_a_file() {
    let redis = RedisServer::start();
    redis
        .direct(&["ACL", "SETUSER", "app", "on", ">file-secret", "~*", "+@all"])
        .await;
    redis.direct(&["ACL", "SETUSER", "default", "off"]).await;
    let tmp = TempDir::new("pw-file");
    // As a mounted secret or `echo secret > file` writes it: one trailing newline.
    let secret = write_file(tmp.path(), "redis-password", "file-secret\n");
    let policy = write_file(
        tmp.path(),
        "policy.yaml",
        &format!(
            "upstream:\n  username_env: RPP_TEST_UPSTREAM_USER\n  password_file: {}\n  script_acl: off\n",
            secret.display()
        ),
    );
    let proxy = ProxyProcess::start_with(
        Some(&policy),
        &redis,
        tmp.path().join("proxy.log"),
        &[],
        &[("RPP_TEST_UPSTREAM_USER", "app")],
    )
    .await;
    assert_serves(&proxy).await;
    let out = redis_cli(proxy.port, &["ACL", "WHOAMI"]).await;
    assert_eq!(out.stdout, "app\n", "stderr: {}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_a_missing_password_variable_or_file_at_its_line() {
    let tmp = TempDir::new("pw-check");
    let missing = tmp.path().join("no-such-secret");
    let policy = write_file(
        tmp.path(),
        "policy.yaml",
        &format!(
            "listen: 127.0.0.1:6380\nupstream:\n  password_env: RPP_TEST_NOT_SET_28\nupstreams:\n  cache:\n    address: 127.0.0.1:6379\n    password_file: {}\nroutes:\n  - name: cache\n    prefixes: [\"cache:\"]\n    upstream: cache\n",
            missing.display()
        ),
    );
    let file = policy.display().to_string();
    let (code, _, stderr) = run_bin(&["--check", &file], &[]).await;
    assert_eq!(code, Some(64), "stderr: {stderr}");
    for want in [
        format!(
            "{file}:3: field `upstream.password_env`: the environment variable RPP_TEST_NOT_SET_28 \
             that should hold the upstream password is not set"
        ),
        format!(
            "{file}:7: field `upstreams.cache.password_file`: cannot read the upstream password from {}: No such file",
            missing.display()
        ),
    ] {
        assert!(stderr.contains(&want), "missing {want:?} in: {stderr}");
    }
    // Nothing else is blamed: no cascade onto the fields that are fine.
    assert_eq!(stderr.lines().count(), 2, "stderr: {stderr}");
    // With the variable set and the file there, the same file passes.
    std::fs::write(&missing, "x\n").unwrap();
    let (code, stdout, stderr) =
        run_bin(&["--check", &file], &[("RPP_TEST_NOT_SET_28", "pw")]).await;
    assert_eq!(code, Some(0), "stdout: {stdout} stderr: {stderr}");
}

/// `--explain` never connects, so a password variable that is not set where the policy is
/// explained (a CI job, a laptop) is no problem for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_needs_no_upstream_password() {
    let tmp = TempDir::new("pw-explain");
    let policy = write_file(
        tmp.path(),
        "policy.yaml",
        "upstream:\n  password_env: RPP_TEST_NOT_SET_28\nrules:\n  - id: no-keys\n    deny: [KEYS]\n",
    );
    let file = policy.display().to_string();
    let (code, stdout, stderr) = run_bin(&["--explain", &file, "KEYS *"], &[]).await;
    assert_eq!(code, Some(1), "stdout: {stdout} stderr: {stderr}");
    assert!(stdout.contains("no-keys"), "{stdout}");
}

/// Polls `/readyz` until its body contains `want`; it must stay 503 meanwhile.
async fn readyz_says(proxy: &Proxy, want: &str) {
    let until = Instant::now() + DEADLINE;
    loop {
        let (status, body) = http_get(proxy.admin, "/readyz").await;
        assert_eq!(status, 503, "/readyz: {body}");
        if body.contains(want) {
            return;
        }
        assert!(
            Instant::now() < until,
            "/readyz never said {want:?}: {body}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_the_upstream_credentials_are_missing_or_refused() {
    let redis = RedisServer::start_with(&["--requirepass", PASSWORD]);
    let none = Proxy::spawn(config_for(&redis.addr())).await;
    readyz_says(
        &none,
        &format!(
            "upstream {} requires a login and the proxy has no credentials (set upstream.password",
            redis.addr()
        ),
    )
    .await;
    // A client's command gets the reason too, not a NOAUTH about a HELLO it never sent.
    let mut c = Raw::connect(none.addr).await;
    let reply = String::from_utf8_lossy(&c.call(&["GET", "k"]).await).into_owned();
    assert!(
        reply.starts_with("-ERR upstream")
            && reply.contains("refused the proxy's upstream credentials"),
        "{reply}"
    );
    let mut config = config_for(&redis.addr());
    config.upstream.password = Some("wrong-password".into());
    let wrong = Proxy::spawn(config).await;
    readyz_says(
        &wrong,
        &format!("upstream {} refused the proxy's credentials", redis.addr()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_without_a_policy_file_is_logged_and_the_proxy_keeps_serving() {
    let redis = RedisServer::start();
    let tmp = TempDir::new("hup");
    let mut proxy =
        ProxyProcess::start_with(None, &redis, tmp.path().join("proxy.log"), &[], &[]).await;
    proxy.signal("-HUP");
    let until = Instant::now() + DEADLINE;
    while !proxy.log_text().contains("nothing to reload") {
        assert_eq!(proxy.exit_status(), None, "SIGHUP stopped the proxy");
        assert!(
            Instant::now() < until,
            "SIGHUP not logged: {}",
            proxy.log_text()
        );
        tokio::time::sleep(POLL).await;
    }
    let out = redis_cli(proxy.port, &["PING"]).await;
    assert_eq!(out.stdout, "PONG\n", "log: {}", proxy.log_text());
    assert_eq!(proxy.exit_status(), None);
}

/// The count of `rpp_{histogram}_seconds` observations above 0.5 s (`+Inf` minus `le="0.5"`).
fn slow_observations(metrics: &str, histogram: &str) -> f64 {
    sample(
        metrics,
        &format!("rpp_{histogram}_seconds_bucket{{le=\"+Inf\"}}"),
    ) - sample(
        metrics,
        &format!("rpp_{histogram}_seconds_bucket{{le=\"0.5\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_commands_stay_out_of_the_latency_histograms() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    // Each waits about a second, as a queue consumer's does, then gives up or is answered.
    let started = Instant::now();
    c.send(&resp_cmds(&["BLPOP queue:28 1"])).await;
    assert_eq!(
        c.collect_frames(1, DEADLINE).await.frames,
        [b"*-1\r\n".to_vec()]
    );
    c.send(&resp_cmds(&["XREAD BLOCK 1000 STREAMS stream:28 $"]))
        .await;
    assert_eq!(
        c.collect_frames(1, DEADLINE).await.frames,
        [b"*-1\r\n".to_vec()]
    );
    c.send(&resp_cmds(&["WAIT 1 1000"])).await;
    assert_eq!(
        c.collect_frames(1, DEADLINE).await.frames,
        [b":0\r\n".to_vec()]
    );
    assert!(
        started.elapsed() >= Duration::from_millis(2900),
        "the commands did not block"
    );
    // A plain command is still counted.
    c.send(&resp_cmds(&["GET k"])).await;
    assert_eq!(
        c.collect_frames(1, DEADLINE).await.frames,
        [b"$-1\r\n".to_vec()]
    );
    let (status, metrics) = http_get(proxy.admin, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        sample(&metrics, "rpp_request_duration_seconds_count") >= 1.0,
        "{metrics}"
    );
    for histogram in ["request_duration", "upstream_duration"] {
        assert_eq!(
            slow_observations(&metrics, histogram),
            0.0,
            "a blocking command's wait counted in rpp_{histogram}_seconds:\n{metrics}"
        );
    }
}

/// A policy for a password-protected Redis with one proxy user, `ops` (an admin tenant, for
/// the documented `PROXY …` commands), and `more` added under `access:`.
fn with_proxy_user(dir: &Path, more: &str) -> PathBuf {
    write_file(
        dir,
        "policy.yaml",
        &format!(
            "upstream:\n  password: {PASSWORD}\n  reconnect_max_ms: 50\naccess:\n  users:\n    - {{name: ops, password_sha256: {OPS_SHA256}}}\n  identities:\n    - {{tenant: ops, user: ops}}\n{more}  admin_tenants: [ops]\n"
        ),
    )
}

/// `ACL SETUSER` straight on Redis: a Redis ACL user the applications log in as.
async fn acl_user(redis: &RedisServer, user: &str, password: &str, keys: &str) {
    let pass = format!(">{password}");
    let reply = redis
        .direct(&["ACL", "SETUSER", user, "on", &pass, keys, "+@all"])
        .await;
    assert_eq!(reply, b"+OK\r\n", "{}", show(&reply));
}

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

/// Defining a proxy user does not take over the applications' logins: `AUTH <the Redis
/// password>`, `AUTH <Redis ACL user> <password>` and `HELLO 3 AUTH …` go on to Redis, which
/// checks them (a wrong one is Redis's WRONGPASS, never the proxy's brute-force throttle), and
/// the client's commands run as that Redis user; the proxy user still logs in, to its tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_user_does_not_take_over_the_clients_redis_logins() {
    let redis = RedisServer::start_with(&["--requirepass", PASSWORD]);
    acl_user(&redis, "app", "app-pw", "~*").await;
    let tmp = TempDir::new("auth-beside");
    let policy = with_proxy_user(tmp.path(), "");
    let proxy = ProxyProcess::start(&policy, &redis, tmp.path().join("proxy.log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    // The Redis password (the `default` user), as every client of a requirepass Redis sends.
    assert_eq!(c.call(&["AUTH", PASSWORD]).await, b"+OK\r\n");
    assert_eq!(c.call(&["ACL", "WHOAMI"]).await, b"$7\r\ndefault\r\n");
    // A Redis ACL user: the client's commands run as it.
    assert_eq!(c.call(&["AUTH", "app", "app-pw"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["ACL", "WHOAMI"]).await, b"$3\r\napp\r\n");
    assert_eq!(c.call(&["SET", "k28", "v"]).await, b"+OK\r\n");
    // A Redis login is not a proxy login: the client's tenant is still the default one.
    let refused = text(&c.call(&["PROXY", "INFO"]).await);
    assert!(refused.starts_with("-NOPERM PROXY commands"), "{refused}");
    // Wrong passwords are Redis's to refuse, however many: the proxy's throttle (a wait after
    // five failures) is not involved, and Redis logs each failure itself.
    for _ in 0..8 {
        let wrong = text(&c.call(&["AUTH", "app", "nope"]).await);
        assert!(wrong.starts_with("-WRONGPASS"), "{wrong}");
    }
    assert_eq!(c.call(&["AUTH", "app", "app-pw"]).await, b"+OK\r\n");
    let log = text(&redis.direct(&["ACL", "LOG"]).await);
    assert!(log.contains("auth") && log.contains("app"), "{log}");
    // HELLO … AUTH the same way.
    let mut h = Raw::connect(proxy.addr()).await;
    h.send(b"HELLO 3 AUTH app app-pw SETNAME worker\r\n").await;
    let hello = h.collect_frames(1, DEADLINE).await.joined();
    assert!(hello.starts_with(b"%"), "{}", show(&hello));
    assert_eq!(h.call(&["ACL", "WHOAMI"]).await, b"$3\r\napp\r\n");
    // Its SETNAME names the client once Redis accepted the login; a refused one names none.
    assert_eq!(h.call(&["CLIENT", "GETNAME"]).await, b"$6\r\nworker\r\n");
    h.send(b"HELLO 3 AUTH app nope SETNAME other\r\n").await;
    let wrong = h.collect_frames(1, DEADLINE).await.joined();
    assert!(wrong.starts_with(b"-WRONGPASS"), "{}", show(&wrong));
    assert_eq!(h.call(&["CLIENT", "GETNAME"]).await, b"$6\r\nworker\r\n");
    // The proxy's own user still logs in, to its own tenant, on the proxy's upstream login.
    let mut ops = Raw::connect(proxy.addr()).await;
    assert_eq!(ops.call(&["AUTH", "ops", "ops-pw"]).await, b"+OK\r\n");
    let info = text(&ops.call(&["PROXY", "INFO"]).await);
    assert!(info.contains("proxy_version:"), "{info}");
    assert_eq!(ops.call(&["ACL", "WHOAMI"]).await, b"$7\r\ndefault\r\n");
    let wrong = text(&ops.call(&["AUTH", "ops", "nope"]).await);
    assert!(wrong.starts_with("-WRONGPASS"), "{wrong}");
}

/// A client of a namespaced tenant that logs in as a Redis user keeps its tenant: its keys
/// are still prefixed (the Redis user here may only touch the prefix, so an unprefixed key
/// would be Redis's NOPERM), whether it sends the Redis password or an ACL user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_client_logged_in_as_a_redis_user_stays_in_its_namespace() {
    let redis = RedisServer::start_with(&["--requirepass", PASSWORD]);
    acl_user(&redis, "tenant-app", "app-pw", "~apps28:*").await;
    let tmp = TempDir::new("auth-namespace");
    let policy = with_proxy_user(
        tmp.path(),
        "    - {tenant: apps, cidr: 127.0.0.0/8}\n  namespaces:\n    apps: \"apps28:\"\n",
    );
    let proxy = ProxyProcess::start(&policy, &redis, tmp.path().join("proxy.log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    assert_eq!(c.call(&["AUTH", "tenant-app", "app-pw"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["GET", "k"]).await, b"$1\r\nv\r\n");
    assert_eq!(redis.direct(&["GET", "apps28:k"]).await, b"$1\r\nv\r\n");
    assert_eq!(redis.direct(&["EXISTS", "k"]).await, b":0\r\n");
    let mut d = Raw::connect(proxy.addr()).await;
    assert_eq!(d.call(&["AUTH", PASSWORD]).await, b"+OK\r\n");
    assert_eq!(d.call(&["SET", "k2", "v"]).await, b"+OK\r\n");
    assert_eq!(redis.direct(&["GET", "apps28:k2"]).await, b"$1\r\nv\r\n");
    assert_eq!(redis.direct(&["EXISTS", "k2"]).await, b":0\r\n");
}

/// Under `require_auth` the proxy's users are the only logins: a Redis password or ACL
/// user is refused by the proxy (Redis's own WRONGPASS text) and commands stay refused until
/// a proxy user logs in. (Unchanged behaviour, kept on purpose.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_require_auth_only_the_proxys_users_log_in() {
    let redis = RedisServer::start_with(&["--requirepass", PASSWORD]);
    acl_user(&redis, "app", "app-pw", "~*").await;
    let tmp = TempDir::new("auth-required");
    let policy = with_proxy_user(tmp.path(), "  require_auth: true\n");
    let proxy = ProxyProcess::start(&policy, &redis, tmp.path().join("proxy.log"), &[]).await;
    let mut c = Raw::connect(proxy.addr()).await;
    let wrongpass = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    assert_eq!(c.call(&["AUTH", PASSWORD]).await, wrongpass);
    assert_eq!(c.call(&["AUTH", "app", "app-pw"]).await, wrongpass);
    assert_eq!(
        c.call(&["HELLO", "3", "AUTH", "app", "app-pw"]).await,
        wrongpass
    );
    assert_eq!(
        c.call(&["GET", "k"]).await,
        b"-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(c.call(&["AUTH", "ops", "ops-pw"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["GET", "k"]).await, b"$-1\r\n");
}

/// Polls `/metrics` until `series` has `value`.
async fn metric_reaches(admin: SocketAddr, series: &str, value: f64) {
    let until = Instant::now() + DEADLINE;
    loop {
        let (status, metrics) = http_get(admin, "/metrics").await;
        assert_eq!(status, 200);
        if metrics.lines().any(|l| l.starts_with(series)) && sample(&metrics, series) == value {
            return;
        }
        assert!(
            Instant::now() < until,
            "{series} never became {value}:\n{metrics}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `PROXY INFO` on `c` until it has `line`.
async fn info_says(c: &mut Raw, line: &str) {
    let until = Instant::now() + DEADLINE;
    loop {
        let info = text(&c.call(&["PROXY", "INFO"]).await);
        if info.contains(line) {
            return;
        }
        assert!(
            Instant::now() < until,
            "PROXY INFO never said {line}: {info}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// When Redis stops accepting the proxy's login (an operator changed `requirepass`) the
/// metric and INFO say so, not only the log and `/readyz`; both return to 0 once the password
/// is restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_upstream_credentials_show_in_the_metrics_and_info() {
    let redis = RedisServer::start_with(&["--requirepass", PASSWORD]);
    let tmp = TempDir::new("refused-metric");
    let policy = with_proxy_user(tmp.path(), "");
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let proxy = ProxyProcess::start(
        &policy,
        &redis,
        tmp.path().join("proxy.log"),
        &["--admin", &admin.to_string()],
    )
    .await;
    let series = format!(
        "rpp_upstream_credentials_refused{{upstream=\"{}\"}}",
        redis.addr()
    );
    metric_reaches(admin, &series, 0.0).await;
    let mut ops = Raw::connect(proxy.addr()).await;
    assert_eq!(ops.call(&["AUTH", "ops", "ops-pw"]).await, b"+OK\r\n");
    info_says(&mut ops, "proxy_upstream_credentials_refused:0\r\n").await;
    // The operator's connection stays logged in across the change, as the proxy's do: Redis
    // closing them (its `timeout`, a restart) makes the proxy log in again.
    let mut operator = redis.raw().await;
    let changed = operator
        .call(&["CONFIG", "SET", "requirepass", "rotated-28"])
        .await;
    assert_eq!(changed, b"+OK\r\n");
    let killed = text(&operator.call(&["CLIENT", "KILL", "TYPE", "normal"]).await);
    assert!(killed.starts_with(':'), "{killed}");
    metric_reaches(admin, &series, 1.0).await;
    info_says(&mut ops, "proxy_upstream_credentials_refused:1\r\n").await;
    let restored = operator
        .call(&["CONFIG", "SET", "requirepass", PASSWORD])
        .await;
    assert_eq!(restored, b"+OK\r\n");
    metric_reaches(admin, &series, 0.0).await;
    info_says(&mut ops, "proxy_upstream_credentials_refused:0\r\n").await;
}

/// Polls `args` on `c` until the reply starts with `want`; every other reply must be one of
/// `allowed`'s prefixes. Returns the reply.
async fn call_until(c: &mut Raw, args: &[&str], want: &str, allowed: &[&str]) -> String {
    let until = Instant::now() + DEADLINE;
    loop {
        let reply = text(&c.call(args).await);
        if reply.starts_with(want) {
            return reply;
        }
        assert!(
            allowed.iter().any(|a| reply.starts_with(a)),
            "{args:?}: unexpected {reply:?}"
        );
        assert!(
            Instant::now() < until,
            "{args:?} never got {want:?}: {reply}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// While Redis is down a command the proxy cannot send gets `-LOADING …; the command was not
/// run` (the error code go-redis and redis-py retry as transient), not `-ERR`; the client's
/// connection stays open (its other commands, and the proxy's own answers, still come back in
/// order) and serves again once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_commands_get_a_transient_error_and_the_connection_stays() {
    let mut redis = RedisServer::start();
    let mut config = config_for(&redis.addr());
    config.upstream.reconnect_max_ms.value = 50;
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    redis.kill();
    // A command in flight when the connection broke may have run: that one stays `-ERR`.
    let lost = "-ERR upstream";
    let down = call_until(&mut c, &["GET", "k"], "-LOADING upstream", &[lost]).await;
    assert!(
        down.starts_with(&format!("-LOADING upstream {} unavailable: ", redis.addr()))
            && down.ends_with("; the command was not run\r\n"),
        "{down}"
    );
    // The same connection: pipelined commands each get their reply, in order.
    c.send(&resp_cmds(&["GET k", "CLIENT ID", "PING"])).await;
    let frames = c.collect_frames(3, DEADLINE).await.frames;
    assert!(frames[0].starts_with(b"-LOADING upstream"), "{frames:?}");
    assert!(frames[1].starts_with(b":"), "{}", show(&frames[1]));
    assert!(frames[2].starts_with(b"-LOADING upstream"), "{frames:?}");
    // redis-py sees an outage: a ConnectionError, retried by a client told to retry those.
    // Needs python3 with redis-py, as tests/fidelity.rs does (`.ci/run` installs it).
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/outage.py");
    let stdout = redis_py(&[script, "127.0.0.1", &proxy.port().to_string()]).await;
    assert_eq!(
        stdout.trim(),
        r#"{"error": "BusyLoadingError", "connection_error": true, "retries": 2}"#
    );
    redis.restart();
    call_until(&mut c, &["PING"], "+PONG", &["-LOADING upstream", lost]).await;
}
