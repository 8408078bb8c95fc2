//! The client's socket: the `select!` loop of one session, reads, writes and idle release.

use super::Session;
use super::client::{ClientState, ReplyMode};
use super::conn::ConnState;
use super::context::Context;
use super::input::{FIRST_READ, Input, READ_CHUNK};
use super::reply_queue::{ReplyQueue, Slot};
use super::routing::Routing;
use crate::listen::ClientStream;
use crate::listen::stream::{ClientRead, ClientWrite};
use crate::upstream::{Reply, ReplyReceiver};
use bytes::{Buf, Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

impl Session {
    /// A session for the client on `stream`, with nothing negotiated yet.
    pub(super) fn new(stream: &ClientStream, ctx: Arc<Context>, id: u64) -> Session {
        let unknown = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
        let peer = stream.peer_addr().unwrap_or(unknown);
        let policy = ctx.policy.load_full();
        let tenant = policy.access.tenant_of(peer.ip(), None);
        let local = stream.local_addr().unwrap_or(unknown);
        Session {
            listed: ctx.client_list.join(id, peer, local, tenant),
            routing: Routing::new(&ctx.upstreams, ctx.pool.epoch()),
            client: ClientState {
                id,
                peer,
                policy,
                names: Default::default(),
                tenant,
                proto: 2,
                db: 0,
                reply_mode: ReplyMode::On,
            },
            ctx,
            conn: ConnState::default(),
            queue: ReplyQueue::default(),
            input: Input {
                rbuf: BytesMut::new(),
                big_reads: false,
                args: Vec::new(),
                read_at: Instant::now(),
                closing: false,
                killed: false,
                paused: false,
                judged: false,
                active: false,
            },
            audit_trail: None,
        }
    }

    /// Starts closing when the proxy drains for shutdown (`ctx` is the session's context,
    /// through the handle `serve` keeps for the tick).
    pub(super) fn note_stopping(&mut self, ctx: &Context) {
        if ctx.stopping.load(std::sync::atomic::Ordering::Acquire) {
            self.input.closing = true;
        }
        // Another session's CLIENT KILL rides on the same wake-up.
        if self.listed.live().killed() {
            self.input.killed = true;
            self.input.closing = true;
        }
    }

    /// Writes the replies ready in `queue.out` and gives their push bytes back to the
    /// budget; `false` when the client's socket failed.
    pub(super) async fn write_out(&mut self, wr: &mut ClientWrite<'_>) -> bool {
        let bytes: usize = self.queue.out.iter().map(Bytes::len).sum();
        if write_all(wr, &mut self.queue.out).await.is_err() {
            return false;
        }
        self.ctx.ops.metrics.bytes_out.inc_by(bytes as u64);
        if self.queue.out_permits > 0 {
            if let Some(budget) = &self.queue.push_budget {
                budget.add_permits(self.queue.out_permits as usize);
            }
            self.queue.out_permits = 0;
        }
        self.queue.out_read = None;
        true
    }

    /// Handles `msg` and every other message already waiting on the reply channel, then
    /// resumes reading the requests that waited for them.
    pub(super) async fn on_messages(&mut self, msg: Reply, reply_rx: &mut Option<ReplyReceiver>) {
        self.input.active = true;
        let mut next = Some(msg);
        while let Some(msg) = next
            .take()
            .or_else(|| reply_rx.as_mut().and_then(|rx| rx.try_recv()))
        {
            self.on_message(msg).await;
        }
        if self.queue.inflight == 0 {
            self.input.paused = false;
            self.routing.drained();
        } else if self.input.paused && self.routing.resumable() {
            // Only the slot the paused command waits for had to be answered.
            self.input.paused = false;
        }
        if !self.input.paused
            && !self.input.rbuf.is_empty()
            && self.queue.inflight < self.ctx.max_inflight
        {
            Box::pin(self.process()).await;
        }
    }

    /// One message from an upstream connection: its place in the reply order, after what
    /// the mode does with it first when it has to (`reply_step_due`).
    /// Not an `async fn`: its state would sit in every client's task (`size_tests`); the
    /// returned future is ready at once unless a step is due, which is boxed.
    pub(super) fn on_message(&mut self, msg: Reply) -> impl Future<Output = ()> + Send + '_ {
        // Before the reply is queued for the client (pointer tests outside cluster mode and
        // for sessions without keyspace notifications or MONITOR).
        if let Some(mut cluster) = self.cluster_session() {
            cluster.spread_confirmed(&msg);
        }
        let stepped = if self.reply_step_due(&msg) {
            Some(Box::pin(self.on_message_stepped(msg)))
        } else {
            self.on_reply(msg);
            None
        };
        async move {
            if let Some(step) = stepped {
                step.await;
            }
        }
    }

    /// Whether the mode acts on `msg` before its place in the reply order: in cluster mode
    /// `cluster_step_due`; in front of replicas, a failed batch (its replica reads are resent
    /// to the primary). Anything else (nearly every message) goes straight to `on_reply`,
    /// with no allocation.
    fn reply_step_due(&self, msg: &Reply) -> bool {
        match &self.routing {
            Routing::Cluster(_) => self.cluster_view().is_some_and(|c| c.cluster_step_due(msg)),
            Routing::Sentinel(s) => {
                s.replicas.is_some() && matches!(msg, Reply::Batch { error: Some(_), .. })
            }
            Routing::Standalone => false,
        }
    }

    /// [`on_message`](Self::on_message) when [`reply_step_due`](Self::reply_step_due).
    async fn on_message_stepped(&mut self, mut msg: Reply) {
        let resent = if let Some(mut cluster) = self.cluster_session() {
            cluster.follow_redirects(&mut msg).await
        } else {
            if let Some(reads) = self.replica_reads() {
                reads.resend_failed_replica_reads(&mut msg).await;
            }
            false
        };
        if !resent {
            self.on_reply(msg);
        }
    }

    /// The client's socket is readable (`ready`): reads what it holds and processes it.
    pub(super) async fn on_readable(
        &mut self,
        ready: std::io::Result<()>,
        rd: &mut ClientRead<'_>,
    ) {
        if ready.is_err() {
            self.input.closing = true;
            return;
        }
        let want = if self.input.big_reads {
            READ_CHUNK
        } else {
            FIRST_READ
        };
        if self.input.rbuf.capacity() - self.input.rbuf.len() < want / 4 {
            self.input.rbuf.reserve(want);
        }
        let room = self.input.rbuf.capacity() - self.input.rbuf.len();
        match read_now(rd, &mut self.input.rbuf).await {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Readiness can be stale (edge-triggered events already consumed by an
                // earlier read): a client that never sent anything must not keep the buffer
                // just reserved for it.
                if !self.input.active && self.input.rbuf.is_empty() {
                    self.input.rbuf = BytesMut::new();
                }
            }
            Ok(0) | Err(_) => {
                // Half-closed: answer what was already sent, then close. A blocked command
                // would never answer; like Redis dropping a client on EOF, close its
                // dedicated connection, which unblocks it upstream.
                self.input.closing = true;
                let blocked = self.queue.slots.iter().any(
                    |slot| matches!(slot, Slot::Upstream { handling, .. } if handling.blocking),
                );
                if blocked {
                    self.conn.dedicated = None;
                    self.routing.cancel_blocked_read();
                }
            }
            Ok(n) => {
                self.input.big_reads |= n == room;
                self.input.read_at = Instant::now();
                self.input.active = true;
                self.ctx.ops.metrics.bytes_in.inc_by(n as u64);
                // Boxed, one allocation per read: processing needs the largest future of the
                // session, and inline it would sit in every idle client's task.
                Box::pin(self.process()).await;
            }
        }
    }

    /// The process-wide idle tick: a session quiet for a whole tick gives its memory back.
    /// `true` when its reply channel was dropped, so `serve` drops the receiving end too.
    pub(super) fn on_idle_tick(&mut self, reply_rx: Option<&ReplyReceiver>) -> bool {
        let released =
            !self.input.active && reply_rx.is_none_or(|rx| rx.is_empty()) && self.release_idle();
        self.input.active = false;
        released
    }

    /// Whether an idle tick could give anything back: a reply channel or spare capacity.
    pub(super) fn holds_idle_memory(&self) -> bool {
        self.queue.reply_tx.is_some()
            || self.input.rbuf.capacity() > 0
            || self.queue.out.capacity() > 0
            || self.input.args.capacity() > 0
            || self.queue.slots.capacity() > 0
            || self.routing.holds_spare()
    }

    /// Gives back what a quiet client does not need: the read buffer (1 or 16 KiB), the reply
    /// channel (its shared state and queue) and the capacity of the per-request
    /// vectors, all re-created on the next request. A busy client keeps them: its read buffer
    /// is reused in place once the upstream has dropped the batches that shared it, so a read
    /// costs no allocation. Only when nothing is owed: no command in flight, no reply waiting, no
    /// connection holding a sender of the channel for its pushes (the dedicated one; in cluster
    /// mode the per-node ones, `Routing::pushes_to_session`). Returns whether
    /// the channel was dropped, so the caller drops its receiving end too.
    pub(super) fn release_idle(&mut self) -> bool {
        if self.queue.inflight != 0
            || !self.queue.slots.is_empty()
            || self.conn.dedicated.is_some()
            || self.routing.pushes_to_session()
        {
            return false;
        }
        if !self.queue.out.is_empty() || !self.input.rbuf.is_empty() || self.conn.in_multi() {
            return false;
        }
        if self.holds_idle_memory() {
            crate::observe::heap::released();
        }
        self.input.rbuf = BytesMut::new();
        self.input.big_reads = false;
        self.queue.out = Vec::new();
        self.input.args = Vec::new();
        self.queue.slots = VecDeque::new();
        self.routing.release_spare();
        self.queue.new_reply_rx = None;
        self.queue.reply_tx.take().is_some()
    }
}

/// Serves one client until it disconnects, QUITs, breaks the protocol or the proxy shuts down.
///
/// The session is set up before the returned future exists, and the future is an `async move`
/// block rather than an `async fn`: an `async fn` keeps each argument twice in its state (the
/// argument and the local it is moved to), and this state is what every connected client
/// costs (`size_tests`); for the same reason the caller's guard of the client's place
/// (`seat`, dropped when the session ends) is held in it rather than in a wrapping future,
/// which would hold this one twice (moved into its `.await`).
pub(crate) fn serve<Seat: Send + 'static>(
    mut stream: ClientStream,
    ctx: Arc<Context>,
    id: u64,
    seat: Seat,
) -> impl std::future::Future<Output = ()> + Send {
    let _ = stream.set_nodelay(true);
    // The idle tick is read through its own handle: `s` is borrowed mutably by the handlers.
    let ticks = ctx.clone();
    let mut s = Session::new(&stream, ctx, id);
    if let Some(user) = s.client.policy.access.cert_user(stream.cert_names()) {
        s.login(Some(Bytes::copy_from_slice(user)));
    }
    async move {
        // Moved in (an `async move` block takes what it names), dropped when it ends.
        let _seat = &seat;
        let s = &mut s;
        let ticks = &*ticks;
        let mut reply_rx: Option<ReplyReceiver> = None;
        let (mut rd, mut wr) = stream.split();
        // The tick is waited on by a future kept across iterations: made anew in each `select!`,
        // it would join and leave the notifier's waiter list (a lock each time) on every
        // wake-up, 4% of the proxy's CPU at `-P 1` (with the shutdown watch it replaced).
        let tick = ticks.idle_tick.notified();
        tokio::pin!(tick);
        // A `Notified` sees every `notify_waiters` after its creation; one before it set the flag
        // first, so looking at the flag now leaves no gap.
        s.note_stopping(ticks);
        loop {
            if s.input.killed {
                break;
            }
            if !s.queue.out.is_empty() && !s.queue.holds_out() && !s.write_out(&mut wr).await {
                break;
            }
            if s.input.closing && s.queue.inflight == 0 && s.queue.slots.is_empty() {
                break;
            }
            if let Some(rx) = s.queue.new_reply_rx.take() {
                reply_rx = Some(rx);
            }
            let can_read =
                !s.input.closing && !s.input.paused && s.queue.inflight < s.ctx.max_inflight;
            tokio::select! {
                biased;
                msg = recv(&mut reply_rx) => {
                    let Some(msg) = msg else { break };
                    s.on_messages(msg, &mut reply_rx).await;
                }
                // Wait for readability before touching the buffer: an idle client holds no read
                // buffer at all (see `release_idle`).
                ready = rd.readable(), if can_read => s.on_readable(ready, &mut rd).await,
                _ = tick.as_mut(), if !s.input.closing || s.holds_idle_memory() => {
                    tick.set(ticks.idle_tick.notified());
                    s.note_stopping(ticks);
                    if s.input.paused && s.queue.inflight == 0 && !s.input.rbuf.is_empty() {
                        // Only a cutover's closed gate pauses a session with nothing in
                        // flight (`process`); it woke everyone when it opened.
                        s.input.paused = false;
                        Box::pin(s.process()).await;
                    }
                    if s.listed.live().summoned() {
                        // Boxed: rare, and it may dial a connection.
                        Box::pin(s.answer_summons()).await;
                    }
                    if s.on_idle_tick(reply_rx.as_ref()) {
                        reply_rx = None;
                    }
                }
            }
        }
        s.ctx.ops.mirror.gone(s.client.id);
        let _ = wr.shutdown().await;
        crate::observe::heap::released();
    }
}

/// Reads what the socket holds, without waiting: `WouldBlock` when nothing is there. Goes
/// through `AsyncRead::poll_read` rather than `try_read_buf` because tokio's `poll_read`
/// clears the socket's readiness when a read does not fill the buffer (the kernel had no
/// more): the next wait then goes straight to epoll instead of a `recvfrom` that fails with
/// EAGAIN, which was one wasted syscall per request at `-P 1` (strace: 101,054 `recvfrom`
/// for 50,000 GETs, half of them EAGAIN).
pub(super) async fn read_now(
    rd: &mut ClientRead<'_>,
    buf: &mut BytesMut,
) -> std::io::Result<usize> {
    let mut read = std::pin::pin!(rd.read_buf(buf));
    std::future::poll_fn(|cx| match read.as_mut().poll(cx) {
        std::task::Poll::Pending => {
            std::task::Poll::Ready(Err(std::io::ErrorKind::WouldBlock.into()))
        }
        ready => ready,
    })
    .await
}

/// The next reply, or never when no channel exists yet.
pub(super) async fn recv(rx: &mut Option<ReplyReceiver>) -> Option<Reply> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Writes every buffer with vectored writes, so many small replies cost one syscall. The
/// slice array is built on the stack inside each poll, never held across an await: it would
/// otherwise add 1 KiB to every session's task, idle or not.
pub(super) async fn write_all(
    wr: &mut ClientWrite<'_>,
    out: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    const MAX_SLICES: usize = 64;
    let mut first = 0;
    while first < out.len() {
        let mut n = std::future::poll_fn(|cx| {
            let pending = &out[first..];
            if pending.len() == 1 {
                return std::pin::Pin::new(&mut *wr).poll_write(cx, &pending[0]);
            }
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let count = pending.len().min(MAX_SLICES);
            for (slot, b) in slices.iter_mut().zip(pending) {
                *slot = IoSlice::new(b);
            }
            std::pin::Pin::new(&mut *wr).poll_write_vectored(cx, &slices[..count])
        })
        .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let head = &mut out[first];
            if n >= head.len() {
                n -= head.len();
                first += 1;
            } else {
                head.advance(n);
                n = 0;
            }
        }
    }
    out.clear();
    // TLS keeps what it encrypted until flushed; plain TCP's flush does nothing.
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *wr).poll_flush(cx)).await
}
