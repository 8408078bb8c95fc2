//! Sentinel-managed upstreams: which node is the primary now, and when that changes.
//!
//! Follows Redis's guidelines for Sentinel clients: ask the sentinels in turn for the primary's
//! address (`SENTINEL GET-MASTER-ADDR-BY-NAME`), confirm with `ROLE` on that address that it
//! really is a primary (a sentinel may be partitioned away and stale), and learn about
//! failovers from the `+switch-master` channel of any reachable sentinel rather than by
//! polling. [`follow_primary`] publishes each new address with an epoch (a count of
//! changes) on a `watch` channel; `upstream::address` is the pool's side of it (connections
//! follow the address, dedicated ones close when it moves), and `server` starts both in
//! `upstream.mode: sentinel`. This module has no pool knowledge.
//!
//! Hand-written on tokio: a few commands and one subscription, on plain connections with
//! timeouts, using the project's RESP encoder and reply decoder. [`replicas`] lists the
//! primary's usable replicas for `read_from: replica`.

pub mod replicas;

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::codec::encode;
use crate::ratelimit::redis::Frame;
use crate::upstream::read_reply;

/// Where the sentinels are and what they watch.
#[derive(Debug, Clone)]
pub struct SentinelSpec {
    /// `host:port` of each sentinel, tried in order.
    pub sentinels: Vec<String>,
    /// The monitored primary's name (`sentinel monitor <name> …`).
    pub master_name: String,
    /// Bound on connecting and on each reply, so a dead sentinel costs at most this.
    pub timeout: Duration,
}

/// The primary as last published by [`follow_primary`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Primary {
    /// `host:port` to connect to.
    pub addr: Arc<str>,
    /// How many times the address has changed since the first one; a WAIT compares epochs to
    /// know whether the writes it would cover may have gone to a previous primary.
    pub epoch: u64,
}

/// Why the primary could not be found.
#[derive(Debug, thiserror::Error)]
pub enum SentinelError {
    /// No sentinel gave a usable answer; each one's failure is listed.
    #[error("no sentinel knows a reachable primary for `{master}`: {}", .tried.join("; "))]
    NoPrimary { master: String, tried: Vec<String> },
}

/// One request/reply exchange on a fresh or given connection, bounded by `timeout`.
async fn call(stream: &mut TcpStream, args: &[&[u8]], timeout: Duration) -> Result<Frame, String> {
    let request = encode(args);
    tokio::time::timeout(timeout, stream.write_all(&request))
        .await
        .map_err(|_| "write timed out".to_string())?
        .map_err(|e| format!("write failed: {e}"))?;
    read_frame(stream, &mut BytesMut::new(), timeout).await
}

/// Reads one complete reply (leaving anything after it in `buf`).
async fn read_frame(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    timeout: Duration,
) -> Result<Frame, String> {
    let frame = tokio::time::timeout(timeout, read_reply(stream, buf, 1024 * 1024))
        .await
        .map_err(|_| "no reply in time".to_string())?
        .map_err(|e| e.to_string())?;
    Frame::from_resp(&frame).map_err(|e| e.to_string())
}

async fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, String> {
    tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect failed: {e}"))
}

fn text(frame: &Frame) -> Option<String> {
    match frame {
        Frame::String(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Frame::Integer(n) => Some(n.to_string()),
        _ => None,
    }
}

/// `host:port`, bracketing IPv6 hosts.
fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Asks one sentinel for the primary's address, then confirms it with `ROLE`.
async fn ask(sentinel: &str, spec: &SentinelSpec) -> Result<String, String> {
    let mut s = connect(sentinel, spec.timeout).await?;
    let reply = call(
        &mut s,
        &[
            b"SENTINEL",
            b"GET-MASTER-ADDR-BY-NAME",
            spec.master_name.as_bytes(),
        ],
        spec.timeout,
    )
    .await?;
    let addr = match reply {
        Frame::Array(items) if items.len() == 2 => match (text(&items[0]), text(&items[1])) {
            (Some(host), Some(port)) => join_host_port(&host, &port),
            _ => return Err("malformed address reply".into()),
        },
        Frame::Nil => return Err(format!("does not monitor `{}`", spec.master_name)),
        Frame::Error(e) => return Err(e),
        _ => return Err("unexpected reply".into()),
    };
    confirm_primary(&addr, spec.timeout).await?;
    Ok(addr)
}

/// Checks with `ROLE` that `addr` is a primary now.
async fn confirm_primary(addr: &str, timeout: Duration) -> Result<(), String> {
    let mut node = connect(addr, timeout)
        .await
        .map_err(|e| format!("primary {addr}: {e}"))?;
    match call(&mut node, &[b"ROLE"], timeout).await {
        Ok(Frame::Array(items)) if items.first().and_then(text).as_deref() == Some("master") => {
            Ok(())
        }
        Ok(Frame::Error(e)) if e.starts_with("NOAUTH") => {
            // A password-protected primary: ROLE needs the pool's credentials, which the pool
            // checks anyway when it connects. Accept the sentinel's answer.
            Ok(())
        }
        Ok(_) => Err(format!("{addr} is not a primary (stale sentinel)")),
        Err(e) => Err(format!("primary {addr}: {e}")),
    }
}

/// The current primary's address, from the first sentinel with a confirmed answer.
pub async fn resolve_primary(spec: &SentinelSpec) -> Result<String, SentinelError> {
    let mut tried = Vec::new();
    for sentinel in &spec.sentinels {
        match ask(sentinel, spec).await {
            Ok(addr) => return Ok(addr),
            Err(e) => tried.push(format!("{sentinel}: {e}")),
        }
    }
    Err(SentinelError::NoPrimary {
        master: spec.master_name.clone(),
        tried,
    })
}

/// Publishes the primary's address on `tx` until every receiver is gone: first as resolved,
/// then after every `+switch-master` for this name announced by any reachable sentinel. A
/// lost subscription is re-established on the next sentinel, and the address re-resolved,
/// so a failover that happened meanwhile is not missed.
pub async fn follow_primary(spec: SentinelSpec, tx: watch::Sender<Option<Primary>>) {
    let mut next = 0;
    while !tx.is_closed() {
        match resolve_primary(&spec).await {
            Ok(addr) => publish(&tx, &spec.master_name, addr, "resolved"),
            Err(e) => tracing::warn!(error = %e, "sentinel: primary not resolved"),
        }
        let Some(sentinel) = spec.sentinels.get(next % spec.sentinels.len().max(1)) else {
            return;
        };
        next += 1;
        let ended = tokio::select! {
            r = subscribe(sentinel, &spec, &tx) => r,
            r = recheck(&spec, &tx) => r,
        };
        if let Err(e) = ended {
            tracing::debug!(%sentinel, error = %e, "sentinel subscription ended");
        }
        tokio::time::sleep(spec.timeout.min(Duration::from_secs(1))).await;
    }
}

/// How often the published primary is confirmed with `ROLE` while subscribed.
const RECHECK: Duration = Duration::from_secs(2);

/// Confirms the published primary every [`RECHECK`], and resolves it again when it is no
/// longer a primary or unreachable: a `+switch-master` missed (a sentinel that restarted, a
/// resolve that asked a stale sentinel during a failover) is corrected within seconds. A
/// primary that still says `master` is kept, so a sentinel that has not yet heard of a
/// failover cannot move the proxy back to a primary about to be demoted.
async fn recheck(spec: &SentinelSpec, tx: &watch::Sender<Option<Primary>>) -> Result<(), String> {
    loop {
        tokio::time::sleep(RECHECK).await;
        if tx.is_closed() {
            return Ok(());
        }
        let current = tx.borrow().as_ref().map(|p| p.addr.clone());
        let confirmed = match &current {
            Some(addr) => confirm_primary(addr, spec.timeout).await.is_ok(),
            None => false,
        };
        if !confirmed {
            match resolve_primary(spec).await {
                Ok(addr) => publish(tx, &spec.master_name, addr, "recheck"),
                Err(e) => tracing::warn!(error = %e, "sentinel: primary not resolved"),
            }
        }
    }
}

/// Publishes `addr` if it differs from the current one, one epoch later, and logs the change
/// (operators correlate errors clients saw with this line).
fn publish(tx: &watch::Sender<Option<Primary>>, master: &str, addr: String, via: &str) {
    tx.send_if_modified(|cur| {
        let epoch = match cur {
            Some(old) if *old.addr == *addr => return false,
            Some(old) => {
                tracing::info!(master, old = %old.addr, new = %addr, via, "sentinel: primary changed");
                old.epoch + 1
            }
            None => {
                tracing::info!(master, primary = %addr, "sentinel: primary found");
                0
            }
        };
        *cur = Some(Primary {
            addr: addr.as_str().into(),
            epoch,
        });
        true
    });
}

/// Listens for `+switch-master <name> <old-ip> <old-port> <new-ip> <new-port>` on one
/// sentinel; returns when the connection fails.
async fn subscribe(
    sentinel: &str,
    spec: &SentinelSpec,
    tx: &watch::Sender<Option<Primary>>,
) -> Result<(), String> {
    let mut s = connect(sentinel, spec.timeout).await?;
    s.write_all(&encode(&[b"SUBSCRIBE", b"+switch-master"]))
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = BytesMut::new();
    // The confirmation, then messages; no timeout while idle (failovers are rare), but the
    // sentinel's own pings are absent on pub/sub, so liveness comes from TCP errors.
    read_frame(&mut s, &mut buf, spec.timeout).await?;
    loop {
        let frame = read_frame(&mut s, &mut buf, Duration::from_secs(24 * 3600)).await?;
        let Frame::Array(items) = frame else { continue };
        let Some(payload) = items.get(2).and_then(text) else {
            continue;
        };
        let parts: Vec<&str> = payload.split(' ').collect();
        if let [name, _, _, ip, port] = parts[..] {
            if name == spec.master_name {
                publish(tx, name, join_host_port(ip, port), "+switch-master");
            }
        }
        if tx.is_closed() {
            return Ok(());
        }
    }
}
