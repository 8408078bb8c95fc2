//! The upstream pool: a few shared pipelined connections per RESP version, each kept alive by a
//! supervisor that reconnects with backoff, and the node's dedicated connections for stateful
//! sessions (capped and kept warm: [`super::dedicated`]). With a followed address (Sentinel),
//! every connection is opened to the current primary and given up when the primary moves.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use super::address::{AddrEpoch, Address};
use super::conn::{self, PushTarget};
use super::credentials::Credentials;
use super::dedicated::{Dedicated, DedicatedLimits, Link as DedicatedLink, Opened};
use super::handshake::{self, NodeSpec, node_spec};
use super::outage::{Outage, Report, Role, Up};
use super::own_lines::{self, Says};
use super::tls;
use super::{Batch, Reply};
use crate::config::Config;
use crate::observe::metrics::Metrics;
use crate::protocol::error::UpstreamError;

/// The shared connections to one upstream node.
pub struct Pool {
    /// How to log in to the node; its `addr` is the one connections use when the address is
    /// fixed (a followed one is read from `address` at each connect).
    spec: Arc<NodeSpec>,
    /// Where the node is: fixed, or the primary Sentinel names now.
    address: Address,
    /// Queues of the shared connections, indexed by RESP version (0: RESP2, 1: RESP3), so a
    /// reply is always in the protocol its client negotiated and is forwarded untouched.
    shared: [Vec<mpsc::Sender<Batch>>; 2],
    /// Whether each shared connection (same indexing as `shared`) is established now, so a
    /// cluster replica read can go to the primary at once instead of to a replica whose
    /// connection would refuse it. Written by the supervisors on connect and loss only.
    up: [Vec<Arc<AtomicBool>>; 2],
    /// Round trip of the latest [`Pool::probe`] in microseconds (0: none yet, or the probe
    /// failed), for `read_from: nearest`; never measured otherwise.
    rtt_us: AtomicU64,
    /// The upstream's latest HELLO reply per RESP version, replayed to clients' plain HELLO.
    hello: [watch::Receiver<Option<Bytes>>; 2],
    /// The node's dedicated connections: capped, with a warm stock (see [`dedicated`]).
    dedicated: Arc<Dedicated>,
    /// The proxy's own connection for control commands (shared rate-limit scripts), so they
    /// never sit in a client's reply order.
    control: mpsc::Sender<Batch>,
    /// Whether the node accepts the proxy's login, as its connections last found
    /// (`upstream::credentials`): a client's AUTH then brings its own.
    credentials: Arc<Credentials>,
    /// A cluster node that left the slot map (failed for good, removed): its supervisors stop
    /// reconnecting until it is back in a map, so a node gone for good costs no connect
    /// attempts, error counts or log lines every backoff. Never set outside cluster mode.
    retired: watch::Sender<bool>,
}

impl Pool {
    /// Creates the pool of the standalone upstream and starts its supervisors; must run inside
    /// a tokio runtime. Fails only when the TLS files cannot be used (validation has already
    /// checked them once).
    pub(crate) fn start(config: &Config, metrics: Arc<Metrics>) -> Result<Arc<Pool>, String> {
        let settings = PoolSettings::from_config(config)?;
        Ok(Pool::start_node(
            config.upstream.address.value.as_str().into(),
            &settings,
            metrics,
        ))
    }

    /// Creates the pool of one node (the standalone upstream, or one node of a cluster) and
    /// starts its supervisors; must run inside a tokio runtime.
    pub fn start_node(addr: Arc<str>, settings: &PoolSettings, metrics: Arc<Metrics>) -> Arc<Pool> {
        Pool::start_at(Address::Fixed(addr), settings, metrics)
    }

    /// The standalone upstream's pool, at an address a cutover may move
    /// (`mirror::cutover`): the sender publishes the next one. Until then it is the
    /// configured address, as with [`Pool::start`].
    pub(crate) fn start_movable(
        config: &Config,
        metrics: Arc<Metrics>,
    ) -> Result<(Arc<Pool>, watch::Sender<Option<AddrEpoch>>), String> {
        let settings = PoolSettings::from_config(config)?;
        let addr: Arc<str> = config.upstream.address.value.as_str().into();
        let (mover, primary) = watch::channel(Some(AddrEpoch {
            addr: addr.clone(),
            epoch: 0,
        }));
        let address = Address::Followed {
            primary,
            label: addr,
        };
        Ok((Pool::start_at(address, &settings, metrics), mover))
    }

    /// Resolves once every shared connection has answered a PING queued behind everything
    /// queued on it before: from then on, nothing sent earlier is still unanswered (answered
    /// by the node, or failed with the connection). `false` when that took longer than
    /// `within`.
    pub(crate) async fn barrier(&self, within: Duration) -> bool {
        let (tx, mut rx) = crate::upstream::reply_channel();
        let connections = self.shared.iter().flatten();
        let until = tokio::time::Instant::now() + within;
        let mut sent = 0usize;
        for queue in connections {
            let batch = Batch {
                bytes: Bytes::from_static(b"*1\r\n$4\r\nPING\r\n"),
                expect: super::Expect::Frames(1),
                wait: super::ReplyWait::Prompt,
                reply_to: tx.clone(),
                seq: 0,
            };
            match tokio::time::timeout_at(until, queue.send(batch)).await {
                Ok(Ok(())) => sent += 1,
                Ok(Err(_)) => {}
                Err(_) => return false,
            }
        }
        for _ in 0..sent {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(_)) => {}
                _ => return false,
            }
        }
        true
    }

    /// [`Pool::start_node`] for an address that may move (the primary Sentinel names).
    pub fn start_at(address: Address, settings: &PoolSettings, metrics: Arc<Metrics>) -> Arc<Pool> {
        let spec = Arc::new(NodeSpec {
            addr: address.name(),
            ..settings.login.clone()
        });
        let (hello2_tx, hello2) = watch::channel(None);
        let (hello3_tx, hello3) = watch::channel(None);
        let hello_tx = [Arc::new(hello2_tx), Arc::new(hello3_tx)];
        let (retired, retired_rx) = watch::channel(false);
        let credentials = Arc::new(Credentials::new(&spec.addr, &metrics));
        let dedicated = Dedicated::start(
            spec.clone(),
            address.clone(),
            settings.dedicated,
            DedicatedLink {
                metrics: metrics.clone(),
                queue_depth: settings.queue_depth,
                command_timeout: settings.command_timeout,
                credentials: credentials.clone(),
            },
            retired_rx.clone(),
        );
        let node_credentials = credentials.clone();
        let outage = Arc::new(Outage::default());
        // Every connection of the node (shared and control) is one supervisor task; shared
        // connection `j` runs on worker `j % workers` (`operations::workers`), the control
        // connection where the pool starts.
        let start = |lane: Option<usize>, link, rx, hello, up| {
            let task = supervise(
                spec.clone(),
                address.clone(),
                link,
                rx,
                hello,
                settings.backoff,
                metrics.clone(),
                settings.command_timeout,
                up,
                retired_rx.clone(),
            );
            match lane {
                Some(j) => crate::operations::workers::spawn_lane(j, task),
                None => drop(tokio::spawn(task)),
            }
        };
        let mut shared: [Vec<mpsc::Sender<Batch>>; 2] = [Vec::new(), Vec::new()];
        let mut up: [Vec<Arc<AtomicBool>>; 2] = [Vec::new(), Vec::new()];
        for (index, proto) in [2u8, 3].into_iter().enumerate() {
            // `upstream.connections` per worker: each worker's sessions have their own.
            for j in 0..settings.connections * crate::operations::workers::count() {
                let (tx, rx) = mpsc::channel(settings.queue_depth);
                shared[index].push(tx);
                let flag = Arc::new(AtomicBool::new(false));
                up[index].push(flag.clone());
                let link = Link {
                    proto,
                    role: Role::Shared,
                    outage: outage.clone(),
                    coalesce: settings.coalesce,
                    credentials: credentials.clone(),
                };
                start(Some(j), link, rx, hello_tx[index].clone(), flag);
            }
        }
        let (control, control_rx) = mpsc::channel(settings.queue_depth);
        let (control_hello, _) = watch::channel(None);
        let link = Link {
            proto: 2,
            role: Role::Control,
            outage,
            coalesce: false,
            credentials,
        };
        start(
            None,
            link,
            control_rx,
            Arc::new(control_hello),
            Arc::new(AtomicBool::new(false)),
        );
        Arc::new(Pool {
            spec,
            address,
            shared,
            up,
            rtt_us: AtomicU64::new(0),
            hello: [hello2, hello3],
            dedicated,
            control,
            credentials: node_credentials,
            retired,
        })
    }

    /// Marks the node as gone from the cluster map (or back in it); `true` when that changed.
    /// A retired node's connections that fail are not re-established until it is back.
    pub fn set_retired(&self, retired: bool) -> bool {
        self.retired.send_if_modified(|r| {
            let changed = *r != retired;
            *r = retired;
            changed
        })
    }

    /// The upstream's address now, for messages and INFO.
    pub(crate) fn addr(&self) -> Arc<str> {
        self.address.name()
    }

    /// How many times the upstream's address has moved (Sentinel failovers; 0 when fixed).
    pub(crate) fn epoch(&self) -> u64 {
        self.address.epoch()
    }

    /// The shared connection a client uses. A client always uses the same one, so its
    /// commands run in the order it sent them.
    pub(crate) fn shared(&self, proto: u8, client_id: u64) -> &mpsc::Sender<Batch> {
        let conns = &self.shared[usize::from(proto == 3)];
        &conns[crate::operations::workers::lane(client_id, conns.len())]
    }

    /// Whether any shared connection is established now (for readiness).
    pub fn any_up(&self) -> bool {
        self.up.iter().flatten().any(|f| f.load(Ordering::Relaxed))
    }

    /// Whether the shared connection [`Pool::shared`] gives this client is established now.
    pub(crate) fn shared_up(&self, proto: u8, client_id: u64) -> bool {
        let flags = &self.up[usize::from(proto == 3)];
        flags[crate::operations::workers::lane(client_id, flags.len())].load(Ordering::Relaxed)
    }

    /// Times a `PING` on the control connection and keeps the result for
    /// [`Pool::round_trip`]; a failed probe clears it, so a node that stops answering stops
    /// being the nearest.
    pub(crate) async fn probe(&self) {
        let (reply_to, mut rx) = crate::upstream::reply_channel();
        let batch = Batch {
            bytes: Bytes::from_static(b"*1\r\n$4\r\nPING\r\n"),
            expect: super::Expect::Frames(1),
            reply_to,
            wait: super::ReplyWait::Prompt,
            seq: 0,
        };
        let start = tokio::time::Instant::now();
        let ok = self.control.send(batch).await.is_ok()
            && matches!(
                tokio::time::timeout(self.spec.connect_timeout, rx.recv()).await,
                Ok(Some(Reply::Batch { error: None, .. }))
            );
        // At least 1 µs, so 0 keeps meaning "unknown".
        let us = if ok {
            (start.elapsed().as_micros() as u64).max(1)
        } else {
            0
        };
        self.rtt_us.store(us, Ordering::Relaxed);
    }

    /// The latest probe's round trip; `None` before the first or after a failed one.
    pub(crate) fn round_trip(&self) -> Option<Duration> {
        match self.rtt_us.load(Ordering::Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// The upstream's HELLO reply for a RESP version. Right after start the first handshake
    /// may still be under way: wait for it, bounded by the connect timeout.
    pub(crate) async fn hello(&self, proto: u8) -> Option<Bytes> {
        let mut rx = self.hello[usize::from(proto == 3)].clone();
        let wait = rx.wait_for(Option::is_some);
        match tokio::time::timeout(self.spec.connect_timeout, wait).await {
            Ok(Ok(h)) => h.clone(),
            _ => None,
        }
    }

    /// A handle for the proxy's own commands on the control connection.
    pub fn control(&self) -> Control {
        Control {
            to: ControlTo::Node(self.control.clone()),
        }
    }

    /// How long a connect and handshake may take (`upstream.connect_timeout_ms`).
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.spec.connect_timeout
    }

    /// Whether the node refused the proxy's latest login (`upstream::credentials`).
    pub(crate) fn credentials_refused(&self) -> bool {
        self.credentials.refused()
    }

    /// Whether the pool logs in with its own credentials. Without them, a client's AUTH runs
    /// on a connection that has had no handshake at all, exactly as on a direct connection.
    pub(crate) fn has_credentials(&self) -> bool {
        self.spec.password.is_some()
    }

    /// A dedicated connection for one session, from the warm stock when one is ready (see
    /// [`dedicated`]). It lives until the session drops the returned sender or the connection
    /// fails; then the session gets `Reply::PinnedClosed`. `raw` skips the handshake: the
    /// connection starts as a fresh RESP2 one, unauthenticated.
    pub(crate) async fn dedicated(
        &self,
        proto: u8,
        push: PushTarget,
        raw: bool,
    ) -> Result<Opened, UpstreamError> {
        self.dedicated.open(proto, push, raw).await
    }

    /// `dedicated`, with the proxy's login, dialled even when the stock has one (see
    /// `Dedicated::open_unstocked`).
    pub(crate) async fn dedicated_unstocked(
        &self,
        proto: u8,
        push: PushTarget,
    ) -> Result<Opened, UpstreamError> {
        self.dedicated.open_unstocked(proto, push).await
    }
}

/// What every node's pool is built with, read once from `upstream` so a cluster's pools
/// (created as nodes appear) all share the same login, TLS setup and limits.
#[derive(Clone)]
pub struct PoolSettings {
    /// Login, TLS and connect timeout; its `addr` is replaced per node.
    pub(crate) login: NodeSpec,
    /// Shared connections per RESP version.
    pub(crate) connections: usize,
    /// Queued batches per connection before senders wait.
    pub(crate) queue_depth: usize,
    /// First and largest reconnect delay.
    pub(crate) backoff: (Duration, Duration),
    /// Reply deadline for commands that do not block (`None`: wait forever).
    pub(crate) command_timeout: Option<Duration>,
    /// Cap, warm stock and wait of the dedicated connections.
    pub(crate) dedicated: DedicatedLimits,
    /// Identical concurrent reads share one reply on the shared connections
    /// (`upstream.coalesce_reads`: standalone upstreams, and standalone route upstreams).
    pub(crate) coalesce: bool,
}

impl PoolSettings {
    /// The settings `config.upstream` describes. Fails only when the TLS files cannot be used.
    pub fn from_config(config: &Config) -> Result<PoolSettings, String> {
        let u = &config.upstream;
        let tls = u
            .tls
            .as_ref()
            .map(|t| tls::build(t, &config.tls_host()))
            .transpose()?;
        Ok(PoolSettings {
            login: NodeSpec {
                addr: u.address.value.as_str().into(),
                username: u.username.clone(),
                password: u.password.clone(),
                connect_timeout: Duration::from_millis(u.connect_timeout_ms.value),
                tls,
                readonly: false,
                db: u.db,
            },
            connections: u.connections.value,
            queue_depth: u.queue_depth.value,
            backoff: (
                Duration::from_millis(u.reconnect_min_ms.value),
                Duration::from_millis(u.reconnect_max_ms.value),
            ),
            command_timeout: (u.command_timeout_ms.value > 0)
                .then(|| Duration::from_millis(u.command_timeout_ms.value)),
            dedicated: DedicatedLimits {
                max: u.dedicated_max.value,
                warm: u.dedicated_warm.value,
                wait: Duration::from_millis(u.dedicated_wait_ms.value),
            },
            coalesce: u.coalesce_reads.value
                && u.mode.value == crate::config::UpstreamMode::Standalone,
        })
    }
}

/// Which connection of a pool a supervisor keeps, and where it reports failures so that the
/// log tells an outage once rather than once per connection per retry.
struct Link {
    /// RESP version of the handshake.
    proto: u8,
    /// Shared (clients' commands) or control (the proxy's own), as the log names it.
    role: Role,
    /// The node's outage state, shared by all of the pool's supervisors.
    outage: Arc<Outage>,
    /// Identical reads on this connection share one reply (`upstream.coalesce_reads`; shared
    /// connections only).
    coalesce: bool,
    /// The node's login state, told of every handshake, so a refused login is logged once
    /// for the node and not as an outage of this connection alone.
    credentials: Arc<Credentials>,
}

impl Link {
    /// Logs a connection that came up: the node's first at INFO, the end of an outage at
    /// INFO once, any other at debug.
    fn came_up(&self, addr: &str) {
        let (proto, role) = (self.proto, self.role.name());
        match self.outage.up(tokio::time::Instant::now()) {
            Up::First => tracing::info!(upstream = %addr, "upstream connected"),
            Up::Recovered { down_for, failures } => tracing::info!(
                upstream = %addr,
                down_for_ms = down_for.as_millis() as u64,
                failures,
                "upstream recovered"
            ),
            Up::Again => {}
        }
        tracing::debug!(upstream = %addr, proto, role, "upstream connection up");
    }

    /// Logs a failure (`what`: "connect failed" or "connection lost") under the outage's
    /// budget: the first at WARN, then a summary at growing intervals, the rest at debug.
    fn failed(&self, addr: &str, what: &str, error: &dyn std::fmt::Display) {
        let role = self.role.name();
        match self.outage.failed(tokio::time::Instant::now()) {
            Report::First => {
                tracing::warn!(upstream = %addr, role, error = %error, "upstream {what}; retrying with backoff (further failures summarised)");
            }
            Report::StillDown { down_for, failures } => tracing::warn!(
                upstream = %addr,
                down_for_ms = down_for.as_millis() as u64,
                failures,
                last_error = %error,
                "upstream still down"
            ),
            Report::Quiet => {
                tracing::debug!(upstream = %addr, role, error = %error, "upstream {what}");
            }
        }
    }
}

/// Keeps one shared (or control) connection alive: connect, serve until it fails, then
/// refuse queued commands immediately (they were never sent, so an error is honest and
/// nothing waits) until the next attempt, with exponential backoff. When the address moves, the connection
/// is given up (its in-flight commands get the usual "may have been applied" error, never a
/// resend) and the new node connected at once.
#[expect(
    clippy::too_many_arguments,
    reason = "the supervisor task owns each of these for its whole life; a struct would only be unpacked again"
)]
async fn supervise(
    base: Arc<NodeSpec>,
    mut address: Address,
    link: Link,
    mut rx: mpsc::Receiver<Batch>,
    hello: Arc<watch::Sender<Option<Bytes>>>,
    (min_backoff, max_backoff): (Duration, Duration),
    metrics: Arc<Metrics>,
    command_timeout: Option<Duration>,
    up: Arc<AtomicBool>,
    mut retired: watch::Receiver<bool>,
) {
    let mut backoff = min_backoff;
    let mut was_up = false;
    // A followed address may not be named yet when the pool starts (a mirror is started while
    // the config loads, before its sentinels have answered): the first batches wait in `rx`
    // for the first primary, at most as long as a connect may take, instead of being refused
    // milliseconds before it is known.
    let mut first_wait = Some(base.connect_timeout);
    loop {
        let named = node_spec(&base, &mut address);
        let first = first_wait.take();
        let spec = match named {
            Ok(spec) => spec,
            Err(e) => {
                if let Some(within) = first {
                    let _ = tokio::time::timeout(within, address.changed()).await;
                    continue;
                }
                if !wait_to_retry(&mut rx, &mut address, &e, None, &mut retired).await {
                    return;
                }
                continue;
            }
        };
        let proto = link.proto;
        let connected = handshake::connect(&spec, Some(proto)).await;
        link.credentials.observe(&spec.addr, &connected);
        let error = match connected {
            Ok((stream, reply)) => {
                hello.send_replace(Some(reply));
                link.came_up(&spec.addr);
                backoff = min_backoff;
                metrics.upstream_connections.inc();
                if was_up {
                    metrics.upstream_reconnects.inc();
                }
                was_up = true;
                up.store(true, Ordering::Relaxed);
                // A control connection's every line is the proxy's own (`own_lines`).
                let _own = (link.role == Role::Control).then(|| {
                    own_lines::speaking(stream.peer_addr(), stream.local_addr(), Says::Everything)
                });
                let reason = conn::run(
                    stream,
                    &mut rx,
                    &spec.addr,
                    None,
                    Some(metrics.clone()),
                    command_timeout,
                    address.moved_from(&spec.addr),
                    link.coalesce,
                    proto,
                )
                .await;
                up.store(false, Ordering::Relaxed);
                metrics.upstream_connections.dec();
                if rx.is_closed() {
                    return;
                }
                if address.name() != spec.addr {
                    // Queued batches were never sent to the old node: they go to the new one.
                    let role = link.role.name();
                    tracing::info!(upstream = %spec.addr, proto, role, %reason, "upstream connection follows the primary");
                    continue;
                }
                metrics.upstream_lost.inc();
                link.failed(&spec.addr, "connection lost", &reason);
                UpstreamError::Unavailable {
                    addr: spec.addr.clone(),
                    reason: reason.into(),
                }
            }
            Err(e) => {
                metrics.upstream_connect_errors.inc();
                link.failed(&spec.addr, "connect failed", &e);
                e
            }
        };
        let retry_at = tokio::time::Instant::now() + backoff;
        backoff = (backoff * 2).min(max_backoff);
        if !wait_to_retry(&mut rx, &mut address, &error, Some(retry_at), &mut retired).await {
            return;
        }
    }
}

/// Until `retry_at` (or, without one, until the address changes), answers queued batches
/// with `error`: they were never sent. A new address ends the wait at once, so a failover is
/// followed without waiting out the backoff. While the node is retired (gone from the
/// cluster map) the wait lasts until it is back or a batch comes for it. `false` when the
/// pool is gone.
async fn wait_to_retry(
    rx: &mut mpsc::Receiver<Batch>,
    address: &mut Address,
    error: &UpstreamError,
    retry_at: Option<tokio::time::Instant>,
    retired: &mut watch::Receiver<bool>,
) -> bool {
    // A refused login is said as such: the node is up, the proxy's credentials are not.
    let unavailable = match error {
        UpstreamError::Unavailable { .. } | UpstreamError::CredentialsRefused { .. } => {
            error.clone()
        }
        other => UpstreamError::Unavailable {
            addr: address.name(),
            reason: other.to_string().into(),
        },
    };
    let parked = *retired.borrow();
    let until = async {
        while *retired.borrow_and_update() {
            if retired.changed().await.is_err() {
                // The pool is gone; `rx` says so too.
                std::future::pending::<()>().await;
            }
        }
        match retry_at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until);
    loop {
        tokio::select! {
            _ = &mut until => return true,
            _ = address.changed() => return true,
            batch = rx.recv() => match batch {
                Some(b) => {
                    let _ = b.reply_to.send(Reply::Batch {
                        data: Bytes::new(),
                        missing: b.expect.commands(),
                        error: Some(Box::new(unavailable.clone())),
                        seq: b.seq,
                    });
                    if parked {
                        // Something still wants the retired node (an ASK to a node that owns
                        // no slot yet): try it again for what comes next.
                        return true;
                    }
                }
                None => return false,
            },
        }
    }
}

/// The proxy's control connection: one command in, its raw reply out, never in a client's
/// reply order. The rate limiter's `Transport` is built on it (`session::limiter_transport`).
#[derive(Clone)]
pub struct Control {
    /// Where commands go.
    to: ControlTo,
}

/// The control connection of one node, or of whichever node a route picks per command.
#[derive(Clone)]
enum ControlTo {
    /// Queue of the standalone upstream's control connection supervisor.
    Node(mpsc::Sender<Batch>),
    /// Cluster mode: each command goes to the control connection of the pool the route
    /// names (the primary owning the command's key: the limiter's EVALSHA names one key, so
    /// a limit counts in one place).
    Routed(Arc<dyn ControlRoute>),
}

/// Picks the pool whose control connection serves a command. A trait so the pool needs no
/// knowledge of who routes (`cluster::Router` implements it).
pub(crate) trait ControlRoute: Send + Sync {
    /// The pool of the node that serves `args` (a whole command), or why none does now.
    fn pool_for(&self, args: &[&[u8]]) -> Result<Arc<Pool>, UpstreamError>;
}

impl Control {
    /// A control handle that sends each command to the pool `router` picks for it (a
    /// cluster's router: by the slot of the command's key).
    pub(crate) fn cluster(router: Arc<impl ControlRoute + 'static>) -> Control {
        Control {
            to: ControlTo::Routed(router),
        }
    }

    /// Sends `args` as one command and returns its one raw reply (an error reply is `Ok`).
    pub async fn request(&self, args: &[&[u8]]) -> Result<Bytes, UpstreamError> {
        let bytes = crate::protocol::codec::encode(args);
        let (reply_to, mut rx) = crate::upstream::reply_channel();
        let closed = || UpstreamError::Unavailable {
            addr: "control".into(),
            reason: "control connection closed".into(),
        };
        let tx = match &self.to {
            ControlTo::Node(tx) => tx.clone(),
            ControlTo::Routed(route) => route.pool_for(args)?.control.clone(),
        };
        tx.send(Batch {
            bytes,
            expect: super::Expect::Frames(1),
            wait: super::ReplyWait::Prompt,
            reply_to,
            seq: 0,
        })
        .await
        .map_err(|_| closed())?;
        match rx.recv().await {
            Some(Reply::Batch {
                data, error: None, ..
            }) => Ok(data),
            Some(Reply::Batch { error: Some(e), .. }) => Err(*e),
            _ => Err(closed()),
        }
    }
}
