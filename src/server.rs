//! The accept loop: client limit, one task per client, graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::codec::CodecLimits;
use crate::config::{Config, ReadFrom, UpstreamMode};
use crate::error::{ClientError, ProxyError, error_reply};
use crate::metrics::Metrics;
use crate::ops::Ops;
use crate::policy::Policy;
use crate::session::{self, Context};
use crate::upstream::address::Address;
use crate::upstream::pool::{Pool, PoolSettings};
use crate::upstream::replicas::Replicas;
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
    run_inner(listener, None, config, shutdown).await
}

/// [`run`] with the admin endpoint served on `admin` (tests bind it to a free port).
pub async fn run_with_admin(
    listener: TcpListener,
    admin: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    run_inner(listener, Some(admin), config, shutdown).await
}

async fn run_inner(
    listener: TcpListener,
    admin: Option<TcpListener>,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let policy = crate::setup::policy(&config).map_err(|problems| {
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        std::io::Error::other(text.join("; "))
    })?;
    let policy = Arc::new(ArcSwap::from_pointee(policy));
    let ops = Ops::new(&config, policy.clone(), None);
    serve(listener, admin, config, policy, ops, shutdown).await
}

/// [`run`] with a policy the caller can replace while the proxy runs (hot reload): store a
/// new `Policy` and every client's next read is checked against it. `admin`, when given,
/// serves `/metrics`, `/healthz` and `/readyz` until shutdown.
pub async fn serve(
    listener: TcpListener,
    admin: Option<TcpListener>,
    config: Config,
    policy: Arc<ArcSwap<Policy>>,
    mut ops: Ops,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let metrics = ops.metrics.clone();
    if ops.audit.is_none() {
        ops.audit = crate::audit::Audit::start(&config.audit, &metrics)?;
    }
    if ops.keyspace.is_none() {
        ops.keyspace = crate::keyspace::Keyspace::new(&config.keyspace).map(Arc::new);
    }
    metrics.keyspace.store(ops.keyspace.clone());
    let mut followers = Vec::new();
    let mut replicas = None;
    let (pool, cluster) = match config.upstream.mode.value {
        UpstreamMode::Cluster => {
            let router = crate::cluster::Router::start(&config, metrics.clone())
                .await
                .map_err(std::io::Error::other)?;
            (router.home_pool(), Some(router))
        }
        UpstreamMode::Sentinel => {
            let sentinel = start_sentinel(&config, metrics.clone()).await?;
            followers = sentinel.tasks;
            replicas = sentinel.replicas;
            (sentinel.pool, None)
        }
        UpstreamMode::Standalone => {
            let pool = Pool::start(&config, metrics.clone()).map_err(std::io::Error::other)?;
            (pool, None)
        }
    };
    let ready: crate::admin::ReadyCheck = match &cluster {
        Some(router) => {
            let router = router.clone();
            Arc::new(move || router.readiness())
        }
        // With replica pools the connection gauge counts replicas too: ready means the
        // primary's own shared connections.
        None if replicas.is_some() => {
            let pool = pool.clone();
            Arc::new(move || match pool.any_up() {
                true => Ok(format!("primary {} connected", pool.addr())),
                false => Err(format!("no connection to the primary {}", pool.addr())),
            })
        }
        None => {
            let metrics = metrics.clone();
            Arc::new(move || match metrics.upstream_connections.get() {
                0 => Err("no upstream connection".into()),
                up => Ok(format!("{up} upstream connections up")),
            })
        }
    };
    // Scripts run as the proxy's upstream user: its ACL is checked (or applied) whenever the
    // policy changes, and `/readyz` says what the check found.
    let acl_status = crate::script_acl::Status::default();
    let ready: crate::admin::ReadyCheck = {
        let status = acl_status.clone();
        Arc::new(move || {
            ready().map(|what| match status.load().as_deref() {
                Some(acl) => format!("{what}; {acl}"),
                None => what,
            })
        })
    };
    let acl_task = tokio::spawn(crate::script_acl::watch(
        pool.control(),
        policy.clone(),
        config.upstream.script_acl.value,
        metrics.clone(),
        acl_status,
    ));
    let admin_task = admin.map(|l| {
        tokio::spawn(crate::admin::serve(
            l,
            metrics.clone(),
            ready,
            stop_rx.clone(),
        ))
    });
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
    // A cluster session matches replies to batches by a 16-bit `seq`.
    let max_inflight = match &cluster {
        Some(_) => limits.max_inflight.value.min(crate::session::SEQ_WINDOW),
        None => limits.max_inflight.value,
    };
    let ctx = Arc::new(Context {
        pool,
        upstreams: match (cluster, config.upstream.mode.value) {
            (Some(router), _) => crate::session::Upstreams::Cluster(router),
            (None, UpstreamMode::Sentinel) => crate::session::Upstreams::Sentinel { replicas },
            (None, _) => crate::session::Upstreams::Standalone,
        },
        codec: CodecLimits {
            max_bulk_len: limits.max_bulk_len.value,
            max_multibulk_len: limits.max_multibulk_len.value,
            max_inline_len: limits.max_inline_len.value,
        },
        max_inflight,
        max_query_buffer: limits.max_query_buffer.value,
        upstream_user: config.upstream.username.clone(),
        upstream_password: config.upstream.password.clone(),
        scripts_dedicated: config.upstream.scripts_on_dedicated.value,
        client_ids: Default::default(),
        client_list: Default::default(),
        pause: Default::default(),
        stopping: Default::default(),
        idle_tick: tokio::sync::Notify::new(),
        policy,
        ops,
    });
    let idle_ticker = {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(session::IDLE_TICK);
            loop {
                tick.tick().await;
                ctx.idle_tick.notify_waiters();
            }
        })
    };
    let max_clients = limits.max_clients.value;
    let clients = Arc::new(AtomicUsize::new(0));
    let next_id = AtomicU64::new(1);
    // Every session holds a clone; when all are dropped, `recv` returns `None`: drained.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    // At debug: the binary's startup summary (`startup::log`) says this and more.
    tracing::debug!(listen = %listener.local_addr()?, upstream = %config.upstream_nodes().join(","), "serving");
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
                    metrics.clients_rejected.inc();
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
                metrics.clients_total.inc();
                metrics.clients.inc();
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    session::serve(stream, ctx, id).await;
                    clients.fetch_sub(1, Ordering::AcqRel);
                    metrics.clients.dec();
                    drop(alive);
                });
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    ctx.stopping
        .store(true, std::sync::atomic::Ordering::Release);
    ctx.idle_tick.notify_waiters();
    drop(alive_tx);
    sweeper.abort();
    idle_ticker.abort();
    acl_task.abort();
    for task in followers {
        task.abort();
    }
    if let Some(task) = admin_task {
        // It stops on the same signal; awaiting it keeps the port until `serve` returns.
        let _ = task.await;
    }
    let grace = Duration::from_millis(config.shutdown_grace_ms.value);
    if tokio::time::timeout(grace, alive_rx.recv()).await.is_err() {
        tracing::warn!(
            remaining = clients.load(Ordering::Acquire),
            "shutdown grace period over; closing remaining clients"
        );
    }
    Ok(())
}

/// What sentinel mode runs: the primary's pool, the replicas reads may use, and the tasks
/// that follow both.
struct SentinelUpstream {
    /// Connections to the primary of the moment.
    pool: Arc<Pool>,
    /// With `read_from: replica`, the listed replicas' pools; `None` otherwise, so sessions
    /// take no replica branch at all.
    replicas: Option<Arc<Replicas>>,
    /// The follower tasks, aborted at shutdown.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Sentinel mode: follows the primary the sentinels name and starts a pool that connects to
/// it. Waits for the first answer at most `connect_timeout_ms`, as standalone mode's first
/// handshake does; without one the proxy serves anyway, answering
/// `-ERR upstream … unavailable` until a sentinel names a reachable primary (the follower
/// keeps asking). With `read_from: replica`, the replicas are followed too (in the
/// background: until one is connected, reads go to the primary).
async fn start_sentinel(
    config: &Config,
    metrics: Arc<Metrics>,
) -> std::io::Result<SentinelUpstream> {
    let settings = PoolSettings::from_config(config).map_err(std::io::Error::other)?;
    let sentinel = config
        .upstream
        .sentinel
        .as_ref()
        .ok_or_else(|| std::io::Error::other("upstream.sentinel is missing"))?;
    let spec = sentinel.spec();
    let label: Arc<str> = format!("sentinel:{}", spec.master_name).into();
    let (tx, mut primary) = watch::channel(None);
    let mut tasks = Vec::new();
    let mut replicas = None;
    if sentinel.read_from() == ReadFrom::Replica {
        let set = Replicas::new(settings.clone(), metrics.clone());
        let (list_tx, list) = watch::channel(Vec::new());
        tasks.push(tokio::spawn(crate::sentinel::replicas::follow_replicas(
            spec.clone(),
            primary.clone(),
            list_tx,
        )));
        tasks.push(tokio::spawn(set.clone().follow(list)));
        replicas = Some(set);
    }
    tasks.push(tokio::spawn(crate::sentinel::follow_primary(spec, tx)));
    let first = primary.wait_for(Option::is_some);
    if tokio::time::timeout(settings.login.connect_timeout, first)
        .await
        .is_err()
    {
        tracing::warn!(upstream = %label, "no primary named by the sentinels yet; serving errors until one is");
    }
    let pool = Pool::start_at(Address::Followed { primary, label }, &settings, metrics);
    Ok(SentinelUpstream {
        pool,
        replicas,
        tasks,
    })
}
