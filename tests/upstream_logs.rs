//! What the log says while the upstream is down: one warning for the outage however many
//! connections fail and retry, and one line when it is back, instead of a warning per
//! connection per retry. The link is cut with the test relay (`common::relay`); the proxy's
//! log is captured by a subscriber installed for this test binary.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use common::relay::Relay;
use common::*;

/// Everything the proxy logs in this process, as text lines.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Lines containing every one of `parts`.
    fn count(&self, parts: &[&str]) -> usize {
        self.text()
            .lines()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .count()
    }
}

/// Installs the capturing subscriber (once per process: this file has one test).
fn capture() -> Captured {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_env_filter("redis_policy_proxy=info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();
    captured
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_one_warning_and_one_recovery_however_many_retries() {
    let log = capture();
    let redis = RedisServer::start();
    let relay = Relay::start(&redis.addr()).await;
    let mut config = config_for(&relay.addr.to_string());
    // Fast retries: many failures, on each of the three connections (RESP2, RESP3, control).
    config.upstream.reconnect_min_ms.value = 5;
    config.upstream.reconnect_max_ms.value = 20;
    config.upstream.connect_timeout_ms.value = 500;
    let proxy = Proxy::start(config).await;
    let series = |text: &str, name: &str| sample(text, name);
    wait_until("three upstream connections", || async {
        series(
            &http_get(proxy.admin, "/metrics").await.1,
            "rpp_upstream_connections",
        ) >= 3.0
    })
    .await;
    assert_eq!(log.count(&["upstream connected"]), 1, "{}", log.text());

    relay.cut();
    let until = Instant::now() + DEADLINE;
    loop {
        let metrics = http_get(proxy.admin, "/metrics").await.1;
        let failures = series(&metrics, r#"rpp_upstream_errors_total{kind="connect"}"#)
            + series(&metrics, r#"rpp_upstream_errors_total{kind="lost"}"#);
        if failures >= 30.0 {
            break;
        }
        assert!(Instant::now() < until, "few failures: {metrics}");
        tokio::time::sleep(POLL).await;
    }
    // Thirty failures and more, one warning for them (summaries, every 10 s and more, are
    // another line: "upstream still down").
    let first_warnings = |text: &str| {
        text.lines()
            .filter(|l| {
                l.contains("WARN")
                    && (l.contains("upstream connect failed")
                        || l.contains("upstream connection lost"))
            })
            .count()
    };
    let recoveries = |text: &str| text.matches("upstream recovered").count();
    let before_heal = log.text();
    assert_eq!(first_warnings(&before_heal), 1, "{before_heal}");
    assert_eq!(recoveries(&before_heal), 0, "{before_heal}");
    assert!(
        !before_heal.contains("shared upstream connection"),
        "{before_heal}"
    );

    relay.heal();
    wait_until("three upstream connections again", || async {
        series(
            &http_get(proxy.admin, "/metrics").await.1,
            "rpp_upstream_connections",
        ) >= 3.0
    })
    .await;
    wait_until("the recovery line", || async {
        recoveries(&log.text()) >= 1
    })
    .await;
    // One recovery for the outage. (An attempt the cut link reset just before the heal may
    // fail after another connection recovered: a new, short outage, with its own warning and
    // its own recovery.)
    let after = log.text()[before_heal.len()..].to_string();
    assert_eq!(recoveries(&after), 1 + first_warnings(&after), "{after}");
    assert_eq!(log.count(&["upstream connected"]), 1, "{}", log.text());
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
}
