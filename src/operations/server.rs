//! The accept loop: client limit, one task per client (TLS established in it), graceful
//! shutdown.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::config::{Config, ReadFrom, UpstreamMode};
use crate::listen::{ClientStream, Serving, TlsServer};
use crate::observe::metrics::Metrics;
use crate::operations::ops::Ops;
use crate::operations::workers;
use crate::policy::Policy;
use crate::protocol::codec::CodecLimits;
use crate::protocol::error::{ClientError, ProxyError, error_reply};
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
    let policy = crate::operations::setup::policy(&config).map_err(|problems| {
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
        ops.audit = crate::observe::audit::Audit::start(&config.audit, &metrics)?;
    }
    if ops.keyspace.is_none() {
        ops.keyspace = crate::observe::keyspace::Keyspace::new(&config.keyspace).map(Arc::new);
    }
    metrics.keyspace.store(ops.keyspace.clone());
    if config.upstream.script_acl.value == crate::config::ScriptAclMode::Confine {
        // Before the upstream starts: its first dedicated connections log in as this user.
        metrics
            .script_user
            .store(Some(crate::policy::script_user::ScriptUser::new(
                crate::policy::script_acl::denials(&policy.load()),
                config.upstream.unconfined_scripts.value == crate::config::UnconfinedScripts::Run,
            )));
    }
    let upstream = start_upstream(&config, &metrics, &ops.cutover).await?;
    ops.mirror
        .apply(&config, &metrics)
        .map_err(std::io::Error::other)?;
    // Scripts are confined to the deny rules (or the upstream user's ACL checked or applied)
    // whenever the policy changes, and `/readyz` says what was found.
    let acl_status = crate::policy::script_acl::Status::default();
    let ready = with_acl_status(upstream.readiness(&metrics), acl_status.clone());
    let ready = with_server_facts(ready, metrics.clone());
    let ready = with_memory_report(ready, metrics.clone());
    let ready = with_mirror_report(ready, ops.mirror.clone(), metrics.clone());
    // The shutdown signal is polled from here on, so a SIGTERM during the first read is
    // caught (its handler is installed on first poll) rather than killing the process.
    let mut shutdown = Box::pin(shutdown);
    let control = upstream.pool.control();
    let stopped_early = tokio::select! {
        () = crate::upstream::server_probe::first(
            &control,
            &metrics,
            Duration::from_millis(config.upstream.connect_timeout_ms.value),
        ) => false,
        () = &mut shutdown => true,
    };
    let mut tasks = vec![
        tokio::spawn(crate::upstream::server_probe::watch(
            upstream.pool.control(),
            metrics.clone(),
        ))
        .abort_handle(),
        tokio::spawn(crate::policy::script_acl::watch(
            upstream.pool.control(),
            policy.clone(),
            config.upstream.script_acl.value,
            metrics.clone(),
            acl_status,
        ))
        .abort_handle(),
    ];
    let admin_task = admin.map(|l| {
        tokio::spawn(crate::operations::admin::serve(
            l,
            metrics.clone(),
            ready,
            stop_rx.clone(),
        ))
    });
    tasks.extend(eviction_checks(&config, &upstream, &policy, &metrics));
    tasks.extend(upstream.followers.iter().map(|t| t.abort_handle()));
    let (serving, tls_listener, tls_watch) = listeners(&config, &metrics).await?;
    tasks.extend(tls_watch.map(|t| t.abort_handle()));
    let ctx = context(&config, upstream, policy, ops);
    tasks.extend(spawn_ticks(&ctx));
    // At debug: the binary's startup summary (`startup::log`) says this and more.
    tracing::debug!(listen = %listener.local_addr()?, upstream = %config.upstream_nodes().join(","), "serving");
    let mut clients = Clients::new(config.limits.max_clients.value);
    let tls = tls_listener.as_ref();
    if !stopped_early {
        accept(&listener, &serving, tls, &ctx, &mut clients, shutdown).await;
    }
    drop(listener);
    drop(tls_listener);
    let _ = stop_tx.send(true);
    ctx.stopping.store(true, Ordering::Release);
    ctx.idle_tick.notify_waiters();
    for task in tasks {
        task.abort();
    }
    if let Some(task) = admin_task {
        // It stops on the same signal; awaiting it keeps the port until `serve` returns.
        let _ = task.await;
    }
    clients
        .drain(Duration::from_millis(config.shutdown_grace_ms.value))
        .await;
    if let Some(user) = ctx.ops.metrics.script_user.load_full() {
        // First, so that no connection still logging in (a warm stock's refill) sets the
        // user up again once it is deleted (`script_login::log_in` recreates a missing one).
        user.set_state(crate::policy::script_user::State::Unavailable(
            "the proxy is shutting down".to_string(),
        ));
        crate::policy::script_acl::remove(&ctx.pool.control(), &user).await;
    }
    Ok(())
}

/// The upstream side as the configured mode starts it.
struct Upstream {
    /// The pool sessions use first: the standalone node, Sentinel's primary, or the cluster's
    /// home node (its control connection runs the proxy's own commands).
    pool: Arc<Pool>,
    /// Cluster mode: the slot map and every node's pool.
    cluster: Option<Arc<crate::topology::cluster::Router>>,
    /// Sentinel mode with `read_from: replica`: the replicas' pools.
    replicas: Option<Arc<Replicas>>,
    /// Sentinel mode: the tasks that follow the primary and replicas, aborted at shutdown.
    followers: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts the upstream side of the configured mode.
/// A standalone upstream's pool is made switchable by reload through `cutover`.
async fn start_upstream(
    config: &Config,
    metrics: &Arc<Metrics>,
    cutover: &crate::operations::mirror::cutover::Cutover,
) -> std::io::Result<Upstream> {
    if config.has_routes() {
        return start_routes(config, metrics).await;
    }
    Ok(match config.upstream.mode.value {
        UpstreamMode::Cluster => {
            let router = crate::topology::cluster::Router::start(config, metrics.clone())
                .await
                .map_err(std::io::Error::other)?;
            Upstream {
                pool: router.home_pool(),
                cluster: Some(router),
                replicas: None,
                followers: Vec::new(),
            }
        }
        UpstreamMode::Sentinel => {
            let sentinel = start_sentinel(config, metrics.clone()).await?;
            Upstream {
                pool: sentinel.pool,
                cluster: None,
                replicas: sentinel.replicas,
                followers: sentinel.tasks,
            }
        }
        UpstreamMode::Standalone => Upstream {
            pool: {
                if config.upstream.coalesce_reads.value {
                    crate::upstream::coalesce::enable();
                }
                let (pool, mover) =
                    Pool::start_movable(config, metrics.clone()).map_err(std::io::Error::other)?;
                cutover.install(config, pool.clone(), mover);
                pool
            },
            cluster: None,
            replicas: None,
            followers: Vec::new(),
        },
    })
}

/// The eviction check of the upstream, or with routes of each route's upstream and database
/// (under its own `role` and `memory_check_ms`), all reporting to one board.
fn eviction_checks(
    config: &Config,
    upstream: &Upstream,
    policy: &Arc<ArcSwap<Policy>>,
    metrics: &Arc<Metrics>,
) -> Vec<tokio::task::AbortHandle> {
    use crate::operations::eviction::{Board, Watched, watch};
    let mut checked = Vec::new();
    match (&upstream.cluster, config.has_routes()) {
        (Some(router), true) => {
            let table = router.routes().cloned();
            for (i, node) in config.route_nodes().iter().enumerate() {
                let Some(u) = config.named_upstream(&node.upstream) else {
                    continue;
                };
                let label = table.as_ref().map(|t| t.names_of_node(i as u16));
                checked.push((router.pool(i as u16), u, label));
            }
            let cluster = config
                .route_cluster()
                .and_then(|n| config.named_upstream(n));
            if let (Some(u), Some(pool)) = (cluster, router.cluster_route_pool()) {
                let label = table
                    .as_ref()
                    .map(|t| t.names_of_node(crate::topology::routes::ON_CLUSTER));
                checked.push((pool, u, label));
            }
        }
        _ => checked.push((upstream.pool.clone(), &config.upstream, None)),
    }
    let board = Board::new(checked.iter().map(|(_, _, l)| l.clone()).collect());
    let mut tasks = Vec::new();
    for (index, (pool, u, _)) in checked.into_iter().enumerate() {
        if u.memory_check_ms.value == 0 {
            continue;
        }
        let watched = Watched {
            control: pool.control(),
            addr: pool.addr().to_string(),
            role: u.role.value,
            index,
        };
        let every = Duration::from_millis(u.memory_check_ms.value);
        let task = tokio::spawn(watch(
            watched,
            board.clone(),
            every,
            policy.clone(),
            metrics.clone(),
        ));
        tasks.push(task.abort_handle());
    }
    tasks
}

/// Routes mode: one pool per (upstream, database) the routes use, in `Config::route_nodes`
/// order (the route table's node numbers), and the nodes of the one cluster a route may
/// name, behind one router.
async fn start_routes(config: &Config, metrics: &Arc<Metrics>) -> std::io::Result<Upstream> {
    let table = crate::operations::setup::route_table(config)
        .ok_or_else(|| std::io::Error::other("routes: without a route table"))?;
    let mut pools = Vec::new();
    let mut names: Vec<Arc<str>> = Vec::new();
    let mut followers = Vec::new();
    for node in config.route_nodes() {
        let one = config
            .for_upstream(&node)
            .ok_or_else(|| std::io::Error::other(format!("no upstream `{}`", node.upstream)))?;
        let pool = match one.upstream.mode.value {
            UpstreamMode::Sentinel => {
                let sentinel = start_sentinel(&one, metrics.clone()).await?;
                followers.extend(sentinel.tasks);
                sentinel.pool
            }
            _ => {
                if one.upstream.coalesce_reads.value {
                    crate::upstream::coalesce::enable();
                }
                Pool::start(&one, metrics.clone()).map_err(std::io::Error::other)?
            }
        };
        // Unique, as the router names nodes by them: the database, and a number if two
        // upstreams share an address.
        let mut name = match node.db {
            0 => pool.addr().to_string(),
            db => format!("{} db {db}", pool.addr()),
        };
        if names.iter().any(|n| **n == *name) {
            name = format!("{name} #{}", names.len());
        }
        names.push(name.into());
        pools.push(pool);
    }
    // The configuration of the cluster a route names, read as `upstream:` would be.
    let cluster_config = config.route_cluster().and_then(|upstream| {
        config.for_upstream(&crate::config::RouteNode {
            upstream: upstream.to_string(),
            db: 0,
        })
    });
    let cluster = match &cluster_config {
        None => None,
        Some(one) => Some((
            one.upstream
                .cluster
                .as_ref()
                .ok_or_else(|| std::io::Error::other("a cluster route without `cluster:`"))?,
            PoolSettings::from_config(one).map_err(std::io::Error::other)?,
        )),
    };
    metrics.routes.store(Some(table.clone()));
    let settings = PoolSettings::from_config(config).map_err(std::io::Error::other)?;
    let router = crate::topology::cluster::Router::start_routes(
        table,
        pools,
        names,
        cluster,
        settings,
        metrics.clone(),
    )
    .await;
    Ok(Upstream {
        pool: router.pool(0),
        cluster: Some(router),
        replicas: None,
        followers,
    })
}

impl Upstream {
    /// What `/readyz` reports: the cluster's coverage, the Sentinel primary's connections,
    /// or the standalone node's.
    fn readiness(&self, metrics: &Arc<Metrics>) -> crate::operations::admin::ReadyCheck {
        match &self.cluster {
            Some(router) => {
                let router = router.clone();
                Arc::new(move || router.readiness())
            }
            // With replica pools the connection gauge counts replicas too: ready means the
            // primary's own shared connections.
            None if self.replicas.is_some() => {
                let pool = self.pool.clone();
                Arc::new(move || match pool.any_up() {
                    true => Ok(format!("primary {} connected", pool.addr())),
                    false => Err(not_connected(
                        &pool,
                        format!("no connection to the primary {}", pool.addr()),
                    )),
                })
            }
            None => {
                let metrics = metrics.clone();
                let pool = self.pool.clone();
                Arc::new(move || match metrics.upstream_connections.get() {
                    0 => Err(not_connected(&pool, "no upstream connection".into())),
                    up => Ok(format!("{up} upstream connections up")),
                })
            }
        }
    }
}

/// Why `pool` has no connection, for `/readyz`: `what`, and when the server refused the
/// proxy's login, that the credentials are missing or refused (not an outage).
fn not_connected(pool: &Pool, what: String) -> String {
    if !pool.credentials_refused() {
        return what;
    }
    let addr = pool.addr();
    if pool.has_credentials() {
        format!(
            "{what}: upstream {addr} refused the proxy's credentials \
             (upstream.username / upstream.password, password_env or password_file)"
        )
    } else {
        format!(
            "{what}: upstream {addr} requires a login and the proxy has no credentials \
             (set upstream.password, password_env or password_file)"
        )
    }
}

/// `ready` with what the script ACL check found appended.
fn with_acl_status(
    ready: crate::operations::admin::ReadyCheck,
    status: crate::policy::script_acl::Status,
) -> crate::operations::admin::ReadyCheck {
    Arc::new(move || {
        ready().map(|what| match status.load().as_deref() {
            Some(acl) => format!("{what}; {acl}"),
            None => what,
        })
    })
}

/// `ready` with the upstream server's name and version (`server_facts`) first; a server
/// older than the supported minimum fails it.
fn with_server_facts(
    ready: crate::operations::admin::ReadyCheck,
    metrics: Arc<Metrics>,
) -> crate::operations::admin::ReadyCheck {
    Arc::new(move || {
        let what = ready()?;
        match metrics.upstream_server.load().as_deref() {
            Some(facts) => match facts.refusal() {
                Some(why) => Err(why),
                None => Ok(format!("{}; {what}", facts.summary())),
            },
            None => Ok(what),
        }
    })
}

/// `ready` with what the eviction check found appended: a detail of `/readyz`, never a
/// failure.
fn with_memory_report(
    ready: crate::operations::admin::ReadyCheck,
    metrics: Arc<Metrics>,
) -> crate::operations::admin::ReadyCheck {
    Arc::new(move || {
        ready().map(|what| match metrics.memory_report.load().as_deref() {
            Some(report) => format!("{what}; {}", report.summary),
            None => what,
        })
    })
}

/// `/readyz` names the migration's mirror and its counts while one runs (informational: a
/// mirror that is down never makes the proxy unready, as no client waits for it).
fn with_mirror_report(
    ready: crate::operations::admin::ReadyCheck,
    mirror: Arc<crate::operations::mirror::MirrorSlot>,
    metrics: Arc<Metrics>,
) -> crate::operations::admin::ReadyCheck {
    Arc::new(move || {
        ready().map(|what| match mirror.summary(&metrics) {
            Some(summary) => format!("{what}; {summary}"),
            None => what,
        })
    })
}

/// What every session shares.
fn context(
    config: &Config,
    upstream: Upstream,
    policy: Arc<ArcSwap<Policy>>,
    ops: Ops,
) -> Arc<Context> {
    let limits = &config.limits;
    // A cluster session matches replies to batches by a 16-bit `seq`.
    let max_inflight = match &upstream.cluster {
        Some(_) => limits.max_inflight.value.min(crate::session::SEQ_WINDOW),
        None => limits.max_inflight.value,
    };
    Arc::new(Context {
        pool: upstream.pool,
        upstreams: match (upstream.cluster, config.upstream.mode.value) {
            (Some(router), _) => crate::session::Upstreams::Cluster(router),
            (None, UpstreamMode::Sentinel) => crate::session::Upstreams::Sentinel {
                replicas: upstream.replicas,
            },
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
        tenant_quota: Default::default(),
        dedicated_caps: (
            config.upstream.dedicated_max.value,
            config.upstream.dedicated_caps.clone(),
            std::time::Duration::from_millis(config.upstream.dedicated_wait_ms.value),
        ),
        pause: Default::default(),
        stopping: Default::default(),
        // Also what a cutover's gate wakes every session with when it opens.
        idle_tick: ops.cutover.gate.sessions_wake(),
        policy,
        ops,
    })
}

/// The periodic tasks: idle clients' rate-limit state dropped (bounding its memory) and the
/// idle tick that lets quiet sessions give their buffers back (and the heap give them to the
/// system, `heap`).
fn spawn_ticks(ctx: &Arc<Context>) -> [tokio::task::AbortHandle; 2] {
    let policy = ctx.policy.clone();
    let sweeper = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            policy.load().sweep();
        }
    });
    let ctx = ctx.clone();
    let idle_ticker = tokio::spawn(async move {
        let mut tick = tokio::time::interval(session::IDLE_TICK);
        loop {
            tick.tick().await;
            // What the sessions released at the previous tick (or by ending) goes back to
            // the system before this tick asks for more.
            if crate::observe::heap::trim_due() {
                tokio::task::spawn_blocking(crate::observe::heap::trim);
            }
            ctx.idle_tick.notify_waiters();
        }
    });
    [sweeper.abort_handle(), idle_ticker.abort_handle()]
}

/// The clients being served: how many, under which cap, and the signal that all are gone.
struct Clients {
    /// Sessions running now, against `max`.
    count: Arc<AtomicUsize>,
    /// `limits.max_clients`: one more is answered with an error and closed.
    max: usize,
    /// The id of the next session (`CLIENT ID`).
    next_id: AtomicU64,
    /// Every session holds a clone; when all are dropped, `alive_rx` returns `None`: drained.
    alive_tx: Option<mpsc::Sender<()>>,
    /// See `alive_tx`.
    alive_rx: mpsc::Receiver<()>,
}

impl Clients {
    fn new(max: usize) -> Clients {
        let (alive_tx, alive_rx) = mpsc::channel::<()>(1);
        Clients {
            count: Arc::new(AtomicUsize::new(0)),
            max,
            next_id: AtomicU64::new(1),
            alive_tx: Some(alive_tx),
            alive_rx,
        }
    }

    /// Waits up to `grace` for every session to finish what it already read.
    async fn drain(mut self, grace: Duration) {
        self.alive_tx = None;
        if tokio::time::timeout(grace, self.alive_rx.recv())
            .await
            .is_err()
        {
            tracing::warn!(
                remaining = self.count.load(Ordering::Acquire),
                "shutdown grace period over; closing remaining clients"
            );
        }
    }
}

/// Accepts clients until `shutdown` completes, one task each: on `listener` (served as
/// `serving` says) and on the TLS-only listener of `tls.listen`, if any.
async fn accept(
    listener: &TcpListener,
    serving: &Serving,
    tls: Option<&(TcpListener, Serving)>,
    ctx: &Arc<Context>,
    clients: &mut Clients,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (accepted, serving) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => (accepted, serving),
            accepted = accept_on(tls) => match tls {
                Some((_, tls)) => (accepted, tls),
                None => continue,
            },
        };
        match accepted {
            Ok((stream, peer)) => admit(stream, peer, serving, ctx, clients),
            Err(e) => {
                // Out of file descriptors and the like: back off briefly instead of
                // spinning, and keep serving the clients we have.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// The next client on `listener`; never without one.
async fn accept_on(
    listener: Option<&(TcpListener, Serving)>,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    match listener {
        Some((l, _)) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Starts the session of an accepted client, or refuses it past `limits.max_clients`.
fn admit(
    mut stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    serving: &Serving,
    ctx: &Arc<Context>,
    clients: &Clients,
) {
    let metrics = ctx.ops.metrics.clone();
    if clients.count.fetch_add(1, Ordering::AcqRel) >= clients.max {
        clients.count.fetch_sub(1, Ordering::AcqRel);
        metrics.clients_rejected.inc();
        tracing::warn!(%peer, max_clients = clients.max, "client refused: max clients reached");
        tokio::spawn(async move {
            let reply = error_reply(&ProxyError::Client(ClientError::TooManyClients));
            let _ = stream.write_all(&reply).await;
            let _ = stream.shutdown().await;
        });
        return;
    }
    let id = clients.next_id.fetch_add(1, Ordering::Relaxed);
    let ctx = ctx.clone();
    let seat = Seat {
        count: clients.count.clone(),
        alive: clients.alive_tx.clone(),
        metrics,
        served: false,
    };
    // A plain client's task is its session alone: what it holds is what every connected
    // client costs (tests/many_clients.rs), so the TLS path's state is not in it.
    // With `workers: N`, on the worker running the fewest sessions (`operations::workers`).
    if let Serving::Plain = serving {
        workers::place(stream, move |stream| {
            session::serve(ClientStream::plain(stream), ctx, id, seat.served())
        });
        return;
    }
    let serving = serving.clone();
    workers::place(stream, move |stream| async move {
        // The TLS handshake runs here, in the client's own task: a slow one holds only its
        // own client (and its slot of max_clients, for at most the handshake timeout).
        if let Some(stream) = crate::listen::establish(stream, peer, &serving, &seat.metrics).await
        {
            session::serve(stream, ctx, id, seat.served()).await;
        }
    });
}

/// An admitted client's place: its slot of `max_clients` and of the drain signal, and in
/// `rpp_clients` once its session runs; all given back when the task ends.
struct Seat {
    /// `Clients::count`, decremented on drop.
    count: Arc<AtomicUsize>,
    /// A clone of `Clients::alive_tx`: shutdown waits until every seat is gone.
    alive: Option<mpsc::Sender<()>>,
    /// For `rpp_clients` and `rpp_clients_total`.
    metrics: Arc<crate::observe::metrics::Metrics>,
    /// Counted in `rpp_clients` (its session started), so the drop uncounts it.
    served: bool,
}

impl Seat {
    /// The session starts: counted as a client until the seat is dropped.
    fn served(mut self) -> Seat {
        self.metrics.clients_total.inc();
        self.metrics.clients.inc();
        self.served = true;
        self
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        if self.served {
            self.metrics.clients.dec();
        }
        self.count.fetch_sub(1, Ordering::AcqRel);
        drop(self.alive.take());
    }
}

/// What the client listeners serve: `listen` (plain, or TLS when `tls` has no `listen` of
/// its own), the TLS-only listener of `tls.listen` if any, and the task that reloads the TLS
/// files.
async fn listeners(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> std::io::Result<(
    Serving,
    Option<(TcpListener, Serving)>,
    Option<tokio::task::JoinHandle<()>>,
)> {
    let Some(tls) = &config.tls else {
        return Ok((Serving::Plain, None, None));
    };
    let server = Arc::new(TlsServer::new(tls).map_err(std::io::Error::other)?);
    let watch = tokio::spawn(server.clone().watch(metrics.clone()));
    match &tls.listen {
        None => {
            let serving = Serving::Tls {
                server,
                plaintext: tls.plaintext.value,
            };
            Ok((serving, None, Some(watch)))
        }
        Some(at) => {
            let listener = TcpListener::bind(&at.value).await.map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot listen for TLS clients on {} (tls.listen): {e}",
                        at.value
                    ),
                )
            })?;
            tracing::info!(listen = %at.value, "serving TLS clients");
            let serving = Serving::Tls {
                server,
                plaintext: false,
            };
            Ok((Serving::Plain, Some((listener, serving)), Some(watch)))
        }
    }
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
    let spec = crate::topology::sentinel::SentinelSpec::of(sentinel);
    let label: Arc<str> = format!("sentinel:{}", spec.master_name).into();
    let (tx, mut primary) = watch::channel(None);
    let mut tasks = Vec::new();
    let mut replicas = None;
    if sentinel.read_from() == ReadFrom::Replica {
        let set = Replicas::new(settings.clone(), metrics.clone());
        let (list_tx, list) = watch::channel(Vec::new());
        tasks.push(tokio::spawn(
            crate::topology::sentinel::replicas::follow_replicas(
                spec.clone(),
                primary.clone(),
                list_tx,
            ),
        ));
        tasks.push(tokio::spawn(set.clone().follow(list)));
        replicas = Some(set);
    }
    tasks.push(tokio::spawn(crate::topology::sentinel::follow_primary(
        spec, tx,
    )));
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
