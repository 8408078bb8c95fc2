//! Dedicated connections of one node: capped, and kept warm.
//!
//! A session that needs a connection of its own (a blocking command, MULTI, WATCH, SUBSCRIBE,
//! another user's AUTH) takes one that is already connected and logged in, so its command
//! reaches Redis as soon as a command another client sends after it over a shared connection.
//! Dialled on demand, it would arrive a connect and a handshake later, and Redis would serve
//! the two clients in the other order (two `BRPOPLPUSH` and then an `LPUSH` from a third
//! client: the wrong one, or neither, is woken). Every dedicated connection of the node, the
//! stocked ones included, holds a permit: at most `max` exist, and a session that needs one
//! when none is left waits up to `wait`, then gets an error naming the limit.
//!
//! A stocked connection is a task waiting for its session: it watches its socket, so one that
//! Redis closed (its `timeout`, a restart) leaves the stock instead of failing the session
//! that takes it, and it is never handed out once Sentinel names another primary.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use super::address::{Address, Stop};
use super::conn::{self, PushTarget};
use super::handshake::{self, NodeSpec, UpstreamStream, hello_id, node_spec};
use super::own_lines;
use super::script_login::{OnStream, log_in};
use super::{Batch, Reply};
use crate::observe::metrics::Metrics;
use crate::protocol::error::UpstreamError;

/// How long after a stocked connection was taken the stock is refilled while over half of it
/// is left (see `refill`).
const REFILL_DELAY: Duration = Duration::from_millis(100);

/// How many dedicated connections a node may have, how many are kept ready, and how long a
/// session waits for one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DedicatedLimits {
    /// At most this many at once (stocked ones included), so clients that each need one
    /// cannot exhaust Redis's `maxclients` for everyone else.
    pub(crate) max: usize,
    /// Kept connected and logged in per RESP version in use.
    pub(crate) warm: usize,
    /// Longest wait for a free permit before the command gets an error.
    pub(crate) wait: Duration,
}

/// What a dedicated connection's task runs with, besides its socket.
#[derive(Clone)]
pub(super) struct Link {
    /// Errors and connect failures are counted here.
    pub(crate) metrics: Arc<Metrics>,
    /// Queue depth of the connection's channel.
    pub(crate) queue_depth: usize,
    /// Reply deadline (each batch adds its own blocking time).
    pub(crate) command_timeout: Option<Duration>,
    /// The node's login state (`upstream::credentials`), told of every handshake here, so
    /// a dedicated connection's refused login is logged and named as the shared ones' are.
    pub(crate) credentials: Arc<super::credentials::Credentials>,
}

/// The node's dedicated connections: the permits and the stock.
pub(super) struct Dedicated {
    /// Caps the node's dedicated connections; each connection's task holds one until it ends.
    permits: Arc<Semaphore>,
    /// `limits.max`, for the error that names it.
    limits: DedicatedLimits,
    /// Ready connections per RESP version (0: RESP2, 1: RESP3), oldest first.
    stock: [Mutex<Vec<Parked>>; 2],
    /// Wakes each version's refill task: a connection was taken, or one left the stock.
    refill: [Arc<Notify>; 2],
    /// Wakes sessions waiting for a connection: one was just stocked.
    stocked: Notify,
    /// Whether each version's stock is kept: RESP2 from the start, RESP3 once a RESP3 client
    /// first needed a connection, so a proxy whose clients never say `HELLO 3` keeps none.
    wanted: [std::sync::atomic::AtomicBool; 2],
    /// How to dial and log in, and where the node is now.
    spec: Arc<NodeSpec>,
    /// Where the node is (moves with the Sentinel-named primary).
    address: Address,
    /// What each connection's task needs.
    link: Link,
    /// Set while the node is out of the cluster map: the stock is not refilled.
    retired: watch::Receiver<bool>,
}

/// A dedicated connection as handed to its session.
pub(crate) struct Opened {
    /// The connection's command queue.
    pub(crate) tx: mpsc::Sender<Batch>,
    /// Redis's id of the connection (from its HELLO reply; `None` for a raw one), so the
    /// client's own id can name it in `CLIENT UNBLOCK` and `REDIRECT`.
    pub(crate) upstream_id: Option<u64>,
    /// Logged in as the script user (`script_user`): scripts sent on it are confined to the
    /// proxy user's rights minus the deny rules. `false` for a raw connection, and where the
    /// script user is off or unavailable.
    pub(crate) confined: bool,
}

/// A stocked connection, waiting in its own task.
struct Parked {
    /// Redis's id of the connection.
    upstream_id: Option<u64>,
    /// The node it is logged in to: a connection to a former primary is never handed out.
    addr: Arc<str>,
    /// Logged in as the script user (see [`Opened::confined`]); one parked before the user
    /// could be set up is not handed out once it can.
    confined: bool,
    /// The connection's command queue, handed to the session that takes it.
    tx: mpsc::Sender<Batch>,
    /// Gives the task its session; dropping it ends the task.
    handover: oneshot::Sender<PushTarget>,
}

impl Dedicated {
    /// Creates the node's dedicated connections' state and starts the refill tasks (RESP2
    /// fills at once); must run inside a tokio runtime.
    pub(super) fn start(
        spec: Arc<NodeSpec>,
        address: Address,
        limits: DedicatedLimits,
        link: Link,
        retired: watch::Receiver<bool>,
    ) -> Arc<Dedicated> {
        let dedicated = Arc::new(Dedicated {
            permits: Arc::new(Semaphore::new(limits.max)),
            limits,
            stock: [Mutex::new(Vec::new()), Mutex::new(Vec::new())],
            refill: [Arc::new(Notify::new()), Arc::new(Notify::new())],
            stocked: Notify::new(),
            wanted: [true.into(), false.into()],
            spec,
            address,
            link,
            retired,
        });
        if limits.warm > 0 {
            for index in 0..2 {
                tokio::spawn(refill(Arc::downgrade(&dedicated), index));
            }
            dedicated.refill[0].notify_one();
        }
        dedicated
    }

    /// A dedicated connection for one session: a stocked one when there is one, else dialled
    /// (`raw`: without any handshake, never stocked) once a permit is free. It lives until the
    /// session drops the sender or the connection fails; then the session gets
    /// `Reply::PinnedClosed`.
    pub(super) async fn open(
        &self,
        proto: u8,
        push: PushTarget,
        raw: bool,
    ) -> Result<Opened, UpstreamError> {
        self.open_from(proto, push, raw, !raw).await
    }

    /// `open`, but dialled even when the stock has one (`stocked: false`), with the proxy's
    /// login: for a session that takes one connection of every node at once (cluster
    /// tracking), whose takes would set every node's stock refilling, and a refill's HELLO
    /// shows in a MONITOR opened right after (Redis's `unit/other` through a cluster).
    pub(super) async fn open_unstocked(
        &self,
        proto: u8,
        push: PushTarget,
    ) -> Result<Opened, UpstreamError> {
        self.open_from(proto, push, false, false).await
    }

    /// `open`: `raw` without the proxy's login; `stocked`: a stocked connection may serve.
    async fn open_from(
        &self,
        proto: u8,
        push: PushTarget,
        raw: bool,
        stocked: bool,
    ) -> Result<Opened, UpstreamError> {
        let (push, permit) = match self.take_or_permit(proto, push, stocked).await? {
            Ok(opened) => return Ok(opened),
            Err(pair) => pair,
        };
        let mut address = self.address.clone();
        let spec = node_spec(&self.spec, &mut address)?;
        let connected = handshake::connect(&spec, (!raw).then_some(proto)).await;
        if !raw {
            self.link.credentials.observe(&spec.addr, &connected);
        }
        let (mut stream, hello) = connected.inspect_err(|_| {
            self.link.metrics.upstream_connect_errors.inc();
        })?;
        let confined = !raw && confine(&mut stream, &self.link, &spec.addr).await?;
        let (tx, rx) = mpsc::channel::<Batch>(self.link.queue_depth);
        let stop = address.moved_from(&spec.addr);
        tokio::spawn(serve(
            stream,
            rx,
            spec.addr.clone(),
            push,
            self.link.clone(),
            stop,
            permit,
            // Without a handshake the connection speaks Redis's default until a HELLO.
            if raw { 2 } else { proto },
        ));
        Ok(Opened {
            tx,
            upstream_id: hello_id(&hello),
            confined,
        })
    }

    /// Hands a stocked connection of `proto` to the session, or gives `push` back when none is
    /// ready; either way the stock is refilled behind it.
    fn take(&self, proto: u8, mut push: PushTarget) -> Result<Opened, PushTarget> {
        let index = usize::from(proto == 3);
        if !self.wanted[index].swap(true, std::sync::atomic::Ordering::Relaxed) {
            self.refill[index].notify_one();
        }
        let now = self.address.name();
        loop {
            let next = {
                let mut stock = self.stock[index]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if stock.is_empty() {
                    None
                } else {
                    Some(stock.remove(0))
                }
            };
            let Some(parked) = next else {
                self.refill[index].notify_one();
                return Err(push);
            };
            if parked.addr != now {
                // Stocked before the primary moved: dropping it ends its task.
                continue;
            }
            if !parked.confined && self.script_user_available() {
                // Stocked before the script user could be set up: scripts need one logged in
                // as it.
                continue;
            }
            match parked.handover.send(push) {
                Ok(()) => {
                    self.refill[index].notify_one();
                    return Ok(Opened {
                        tx: parked.tx,
                        upstream_id: parked.upstream_id,
                        confined: parked.confined,
                    });
                }
                // Its socket closed while it waited: the next one.
                Err(back) => push = back,
            }
        }
    }

    /// A stocked connection (when `stocked`: never for `raw`), or else a permit to dial one:
    /// whichever comes first within `limits.wait`. A connection the refill stocks meanwhile counts too (it
    /// may hold the last permit while it dials).
    async fn take_or_permit(
        &self,
        proto: u8,
        mut push: PushTarget,
        stocked: bool,
    ) -> Result<Result<Opened, (PushTarget, OwnedSemaphorePermit)>, UpstreamError> {
        let deadline = tokio::time::Instant::now() + self.limits.wait;
        loop {
            // Registered before looking, so a connection stocked in between is not missed.
            let stocked_now = self.stocked.notified();
            if stocked {
                match self.take(proto, push) {
                    Ok(opened) => return Ok(Ok(opened)),
                    Err(back) => push = back,
                }
            }
            tokio::select! {
                permit = self.permits.clone().acquire_owned() => {
                    if let Ok(permit) = permit {
                        return Ok(Err((push, permit)));
                    }
                    return Err(self.exhausted());
                }
                () = stocked_now, if stocked => {}
                () = tokio::time::sleep_until(deadline) => return Err(self.exhausted()),
            }
        }
    }

    /// The error for a command that found no dedicated connection within `limits.wait`.
    fn exhausted(&self) -> UpstreamError {
        self.link.metrics.dedicated_refused[1].inc();
        UpstreamError::Unavailable {
            addr: self.address.name(),
            reason: format!(
                "all {} dedicated connections (upstream.dedicated_max) are in use; waited {} ms \
                 (upstream.dedicated_wait_ms)",
                self.limits.max,
                self.limits.wait.as_millis()
            )
            .into(),
        }
    }

    /// Whether dedicated connections log in as the script user now.
    fn script_user_available(&self) -> bool {
        self.link
            .metrics
            .script_user
            .load()
            .as_ref()
            .is_some_and(|u| u.available())
    }

    /// Stocked connections ready now, per RESP version (for tests and metrics).
    pub(super) fn ready(&self) -> [usize; 2] {
        [0, 1].map(|i| {
            self.stock[i]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .filter(|p| !p.handover.is_closed())
                .count()
        })
    }
}

impl Drop for Dedicated {
    fn drop(&mut self) {
        // Wakes the refill tasks so they see the node is gone and end.
        for notify in &self.refill {
            notify.notify_one();
        }
    }
}

/// Keeps `warm` connections of one RESP version in the stock while the node exists and is in
/// use: woken whenever one is taken or leaves, it dials until the stock is full again, backing
/// off while the node refuses.
async fn refill(dedicated: Weak<Dedicated>, index: usize) {
    let Some(notify) = dedicated.upgrade().map(|d| d.refill[index].clone()) else {
        return;
    };
    let proto = if index == 1 { 3 } else { 2 };
    let mut backoff = Duration::from_millis(50);
    let mut first = true;
    loop {
        notify.notified().await;
        if !first
            && dedicated
                .upgrade()
                .is_some_and(|d| d.ready()[index] > d.limits.warm / 2)
        {
            // Over half the stock is left: refill a moment later, not at once, so a burst of
            // takes is refilled by one round of dials. (It once also kept a refill's HELLO
            // out of a MONITOR just opened; `own_lines` hides those lines now.) A further
            // take cuts the wait short.
            tokio::select! {
                () = tokio::time::sleep(REFILL_DELAY) => {}
                () = notify.notified() => {}
            }
        }
        first = false;
        loop {
            let Some(d) = dedicated.upgrade() else {
                return;
            };
            if !d.wanted[index].load(std::sync::atomic::Ordering::Relaxed) || *d.retired.borrow() {
                break;
            }
            let missing = {
                let mut stock = d.stock[index]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                stock.retain(|p| !p.handover.is_closed());
                d.limits.warm.saturating_sub(stock.len())
            };
            if missing == 0 {
                break;
            }
            // Only a free permit: the stock never makes a client wait for one.
            let Ok(permit) = d.permits.clone().try_acquire_owned() else {
                break;
            };
            match stock_one(&d, proto, permit).await {
                Ok(parked) => {
                    backoff = Duration::from_millis(50);
                    d.stock[index]
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(parked);
                    d.stocked.notify_waiters();
                }
                Err(e) => {
                    tracing::debug!(upstream = %d.spec.addr, error = %e, "warm dedicated connection failed");
                    drop(d);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

/// Dials and logs in one connection and parks it in its task.
async fn stock_one(
    d: &Dedicated,
    proto: u8,
    permit: OwnedSemaphorePermit,
) -> Result<Parked, UpstreamError> {
    let mut address = d.address.clone();
    let spec = node_spec(&d.spec, &mut address)?;
    let connected = handshake::connect(&spec, Some(proto)).await;
    d.link.credentials.observe(&spec.addr, &connected);
    let (mut stream, hello) = connected.inspect_err(|_| {
        d.link.metrics.upstream_connect_errors.inc();
    })?;
    let confined = confine(&mut stream, &d.link, &spec.addr).await?;
    let (tx, rx) = mpsc::channel::<Batch>(d.link.queue_depth);
    let (handover, taken) = oneshot::channel();
    let stop = address.moved_from(&spec.addr);
    let addr = spec.addr.clone();
    tokio::spawn(park(
        stream,
        rx,
        addr.clone(),
        taken,
        d.refill[usize::from(proto == 3)].clone(),
        d.link.clone(),
        stop,
        permit,
        proto,
    ));
    Ok(Parked {
        upstream_id: hello_id(&hello),
        addr,
        confined,
        tx,
        handover,
    })
}

/// Logs a freshly handshaken connection in as the script user when the proxy has one
/// (`upstream.script_acl: confine`); whether it is now.
async fn confine(
    stream: &mut UpstreamStream,
    link: &Link,
    addr: &Arc<str>,
) -> Result<bool, UpstreamError> {
    let Some(user) = link.metrics.script_user.load_full() else {
        return Ok(false);
    };
    let buf = bytes::BytesMut::with_capacity(1024);
    // The script user's AUTH is the proxy's own line, not a client's (`own_lines`).
    let _own = own_lines::speaking(
        stream.peer_addr(),
        stream.local_addr(),
        own_lines::Says::Handshake(own_lines::Sent {
            auth: true,
            ..Default::default()
        }),
    );
    let logged_in = match stream {
        UpstreamStream::Tcp(tcp) => log_in(&mut OnStream { stream: tcp, buf }, &user).await,
        UpstreamStream::Tls(tls) => {
            log_in(
                &mut OnStream {
                    stream: &mut **tls,
                    buf,
                },
                &user,
            )
            .await
        }
    };
    logged_in.map_err(|e| {
        link.metrics.upstream_connect_errors.inc();
        UpstreamError::Unavailable {
            addr: addr.clone(),
            reason: format!("could not log in as the proxy's script user: {e}").into(),
        }
    })
}

#[expect(
    clippy::too_many_arguments,
    reason = "the parked task owns each of these for its whole life and passes most on to `serve`"
)]
/// A stocked connection's task: waits for its session, then serves it. Ends without one when
/// the socket closes or has unexpected bytes, the primary moves, or the stock drops it.
async fn park(
    stream: UpstreamStream,
    rx: mpsc::Receiver<Batch>,
    addr: Arc<str>,
    taken: oneshot::Receiver<PushTarget>,
    refill: Arc<Notify>,
    link: Link,
    mut stop: Option<Stop>,
    permit: OwnedSemaphorePermit,
    proto: u8,
) {
    link.metrics.upstream_dedicated_ready.inc();
    let push = tokio::select! {
        push = taken => push.ok(),
        () = unusable(&stream) => None,
        _ = async { match &mut stop { Some(s) => s.await, None => std::future::pending().await } } => None,
    };
    link.metrics.upstream_dedicated_ready.dec();
    match push {
        Some(push) => serve(stream, rx, addr, push, link, stop, permit, proto).await,
        None => {
            drop(permit);
            // Leaves the stock (the refill task drops closed entries) and is replaced.
            refill.notify_one();
        }
    }
}

/// Resolves when a parked plain-TCP connection can no longer be handed out: Redis closed it
/// or sent something unasked. A TLS one is not watched (its bytes cannot be peeked without
/// decrypting them); a closed one fails its session as any lost connection does.
async fn unusable(stream: &UpstreamStream) {
    match stream {
        UpstreamStream::Tcp(tcp) => {
            let mut byte = [0u8; 1];
            // Peek: a clean connection has nothing to read, so this waits until EOF or data.
            let _ = tcp.peek(&mut byte).await;
        }
        UpstreamStream::Tls(_) => std::future::pending().await,
    }
}

/// Serves one session over its dedicated connection; when it ends, refuses the batches still
/// queued (never sent) and tells the session its connection is gone.
#[expect(
    clippy::too_many_arguments,
    reason = "the connection and what its task owns for its whole life, passed on to `conn::run`"
)]
async fn serve(
    stream: UpstreamStream,
    mut rx: mpsc::Receiver<Batch>,
    addr: Arc<str>,
    push: PushTarget,
    link: Link,
    stop: Option<Stop>,
    permit: OwnedSemaphorePermit,
    proto: u8,
) {
    let to = push.to.clone();
    let conn_id = push.conn_id;
    let reason = conn::run(
        stream,
        &mut rx,
        &addr,
        Some(push),
        Some(link.metrics),
        link.command_timeout,
        stop,
        false,
        proto,
    )
    .await;
    drop(permit);
    tracing::debug!(upstream = %addr, %reason, "dedicated connection ended");
    rx.close();
    while let Some(b) = rx.recv().await {
        let _ = b.reply_to.send(Reply::Batch {
            data: Bytes::new(),
            missing: b.expect.commands(),
            error: Some(Box::new(UpstreamError::Unavailable {
                addr: addr.clone(),
                reason: reason.clone().into(),
            })),
            seq: b.seq,
        });
    }
    let _ = to.send(Reply::PinnedClosed(conn_id));
}
