//! The accept loop: client limit, one task per client, graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::codec::CodecLimits;
use crate::config::Config;
use crate::error::{ClientError, ProxyError, error_reply};
use crate::policy::Policy;
use crate::session::{self, Context};
use crate::upstream::pool::Pool;
use arc_swap::ArcSwap;

/// Serves clients on `listener` until `shutdown` completes, then stops accepting, lets every
/// session finish the commands it already read (up to `shutdown_grace_ms`) and returns.
///
/// This is the seam tests use: bind `127.0.0.1:0`, pass the listener, resolve the future to
/// stop.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let policy = Policy::from_config(&config).map_err(|problems| {
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        std::io::Error::other(text.join("; "))
    })?;
    serve(
        listener,
        config,
        Arc::new(ArcSwap::from_pointee(policy)),
        shutdown,
    )
    .await
}

/// [`run`] with a policy the caller can replace while the proxy runs (hot reload): store a
/// new `Policy` and every client's next read is checked against it.
pub async fn serve(
    listener: TcpListener,
    config: Config,
    policy: Arc<ArcSwap<Policy>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let pool = Pool::start(&config).map_err(std::io::Error::other)?;
    // Rate-limit state of idle clients is dropped in the background, bounding its memory.
    let sweeper = {
        let policy = policy.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                policy.load().sweep();
            }
        })
    };
    let limits = &config.limits;
    let ctx = Arc::new(Context {
        pool,
        codec: CodecLimits {
            max_bulk_len: limits.max_bulk_len.value,
            max_multibulk_len: limits.max_multibulk_len.value,
            max_inline_len: limits.max_inline_len.value,
        },
        max_inflight: limits.max_inflight.value,
        max_query_buffer: limits.max_query_buffer.value,
        upstream_user: config.upstream.username.clone(),
        upstream_password: config.upstream.password.clone(),
        shutdown: stop_rx,
        policy,
    });
    let max_clients = limits.max_clients.value;
    let clients = Arc::new(AtomicUsize::new(0));
    let next_id = AtomicU64::new(1);
    // Every session holds a clone; when all are dropped, `recv` returns `None`: drained.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    tracing::info!(listen = %listener.local_addr()?, upstream = %config.upstream.address.value, "serving");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (mut stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off briefly instead of
                        // spinning, and keep serving the clients we have.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                if clients.fetch_add(1, Ordering::AcqRel) >= max_clients {
                    clients.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(%peer, max_clients, "client refused: max clients reached");
                    tokio::spawn(async move {
                        let reply = error_reply(&ProxyError::Client(ClientError::TooManyClients));
                        let _ = stream.write_all(&reply).await;
                        let _ = stream.shutdown().await;
                    });
                    continue;
                }
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                let ctx = ctx.clone();
                let clients = clients.clone();
                let alive = alive_tx.clone();
                tokio::spawn(async move {
                    session::serve(stream, ctx, id).await;
                    clients.fetch_sub(1, Ordering::AcqRel);
                    drop(alive);
                });
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(alive_tx);
    sweeper.abort();
    let grace = Duration::from_millis(config.shutdown_grace_ms.value);
    if tokio::time::timeout(grace, alive_rx.recv()).await.is_err() {
        tracing::warn!(
            remaining = clients.load(Ordering::Acquire),
            "shutdown grace period over; closing remaining clients"
        );
    }
    Ok(())
}
