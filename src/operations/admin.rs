//! The admin HTTP endpoint: `GET /metrics` (Prometheus), `/healthz` (the process serves),
//! `/readyz` (an upstream connection is up and a policy is loaded) and `/keyspace` (the
//! key-pattern report as JSON, when `keyspace.sample` is on); `HEAD` on each answers the
//! same status and headers without the body (load balancers and uptime checkers use it).
//!
//! Hand-written on tokio rather than a web framework: three fixed GET routes, one request per
//! connection, no bodies. `httparse` does the parsing; what remains is bounded reading and one
//! write, far less than the dependency tree of an HTTP server stack. Every connection is bounded
//! in size (8 KiB of request head) and time (5 s), so a scraper that misbehaves cannot hold
//! memory or tasks.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::observe::metrics::Metrics;

/// Largest request head read; scrapers send a few hundred bytes.
const MAX_HEAD: usize = 8 * 1024;
/// Time a client has to send its request and read the answer.
const DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once; the rest wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 64;

/// Serves the admin endpoint until `stop` flips to `true`.
/// Answers `/readyz`: `Ok` with what is up, or `Err` with what is missing. Given by the
/// server per upstream mode, so this module knows nothing of pools or clusters.
pub(crate) type ReadyCheck = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    ready: ReadyCheck,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    // At debug: the startup summary line names the admin address.
    if let Ok(addr) = listener.local_addr() {
        tracing::debug!(%addr, "admin endpoint: /metrics /healthz /readyz");
    }
    loop {
        let permit = tokio::select! {
            _ = stopped(&mut stop) => return,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let stream = tokio::select! {
            _ = stopped(&mut stop) => return,
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(DEADLINE, answer(stream, &metrics, &ready)).await;
            drop(permit);
        });
    }
}

/// Resolves once the proxy stops (or the sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// Reads one request head and writes the response.
async fn answer(
    mut stream: TcpStream,
    metrics: &Metrics,
    ready: &ReadyCheck,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut head_only = false;
    let (status, content_type, body) = loop {
        let mut chunk = [0u8; 1024];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                head_only = request.method == Some("HEAD");
                break route(request.method, request.path, metrics, ready);
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            Ok(httparse::Status::Partial) => {
                break (431, TEXT, "request header too large\n".to_string());
            }
            Err(e) => break (400, TEXT, format!("bad request: {e}\n")),
        }
    };
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        reason(status),
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if !head_only {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

const TEXT: &str = "text/plain; charset=utf-8";
/// `/keyspace`'s report.
const JSON: &str = "application/json";
/// What `prometheus_client` renders (OpenMetrics text), which Prometheus reads natively.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn route(
    method: Option<&str>,
    path: Option<&str>,
    metrics: &Metrics,
    ready: &ReadyCheck,
) -> (u16, &'static str, String) {
    if !matches!(method, Some("GET" | "HEAD")) {
        return (405, TEXT, "only GET and HEAD\n".into());
    }
    let path = path.unwrap_or("/");
    let path = path.split('?').next().unwrap_or(path);
    match path {
        "/metrics" => (200, OPENMETRICS, metrics.render()),
        "/healthz" => (200, TEXT, "ok\n".into()),
        "/keyspace" => match metrics.keyspace.load_full() {
            Some(keyspace) => (200, JSON, format!("{}\n", keyspace.report())),
            None => (
                404,
                TEXT,
                "keyspace statistics are off (keyspace.sample)\n".into(),
            ),
        },
        "/readyz" => match ready() {
            Ok(what) => (200, TEXT, format!("ready: {what}\n")),
            Err(why) => (503, TEXT, format!("not ready: {why}\n")),
        },
        _ => (
            404,
            TEXT,
            "not found; try /metrics, /healthz, /readyz or /keyspace\n".into(),
        ),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    }
}
