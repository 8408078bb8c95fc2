//! One pipelined upstream connection.
//!
//! A writer half drains queued batches into one buffer and writes it with one syscall; a reader
//! half scans reply boundaries and hands each batch its replies as one zero-copy slice of the
//! read buffer. Both run in one task and share the FIFO of batches awaiting replies (behind an
//! uncontended mutex, needed only because the task may move between threads), so a batch is
//! registered before its bytes can reach Redis and no channel hop sits between them.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

use super::address::Stop;
use super::handshake::UpstreamStream;
use super::{Batch, Expect, Reply, ReplySender, ReplyWait, Subscriptions};
use crate::observe::metrics::Metrics;
use crate::protocol::error::UpstreamError;
use crate::protocol::reply::{self, PubSubFrame, SubKind};

/// Writes smaller than this are copied into the coalescing buffer; larger ones are written
/// from their own bytes to avoid copying big values.
const COPY_LIMIT: usize = 16 * 1024;
/// Coalesce at most this many bytes before writing, bounding the buffer and the latency of
/// the first command in a burst.
const WRITE_BATCH: usize = 256 * 1024;
/// Read buffer headroom requested before each read.
const READ_CHUNK: usize = 32 * 1024;

/// Out-of-band delivery for a dedicated connection: the session it belongs to, and the permits
/// that bound how many push bytes it may hold unwritten (a subscriber that stops reading
/// makes the proxy stop reading Redis, so Redis's own output limits apply, not our memory).
#[derive(Clone)]
pub(crate) struct PushTarget {
    /// The owning session's reply channel.
    pub(crate) to: ReplySender,
    /// Byte budget for pushes not yet written to the client.
    pub(crate) budget: Arc<Semaphore>,
    /// Size of the budget; a larger push takes the whole budget rather than waiting forever.
    pub(crate) budget_size: u32,
    /// The session's id for this connection, echoed in `Reply::PinnedClosed`.
    pub(crate) conn_id: u64,
}

/// A batch sent and waiting for its replies.
struct Pending {
    expect: Expect,
    /// Reply frames expected; resolved from `expect` when the batch reaches the head.
    total: Option<u32>,
    /// Reply frames received so far.
    got: u32,
    reply_to: ReplySender,
    /// The batch's `seq`, echoed in its reply.
    seq: u16,
    /// When the batch was queued for writing, for the upstream round-trip histogram.
    sent: Instant,
    /// How long Redis may take to answer it (a blocking command waits as asked).
    wait: ReplyWait,
    /// When Redis could start answering it: when it was queued or, behind a command that
    /// blocked, when that one was answered. Its command timeout counts from here, so a
    /// command is not blamed for the wait of a blocking command ahead of it.
    since: Instant,
    /// With coalescing, a shareable read and the identical reads that joined it; boxed, as
    /// coalescing is off by default: a `Pending` is moved into the queue and out of it for
    /// every batch, a `memcpy` call each while it was 144 bytes (now 88).
    coalesced: Option<Box<Coalesced>>,
}

/// A shareable read sent with coalescing on (`coalesce`), see [`Pending::coalesced`].
struct Coalesced {
    /// Its bytes and the other connections' reply count when it was sent: an identical
    /// read may join it while it is the last batch sent.
    share: (Bytes, u64),
    /// Identical reads that joined this batch: each gets a copy of its reply (the
    /// session's reply channel and `seq`). Empty, so unallocated, almost always.
    followers: Vec<(ReplySender, u16)>,
}

/// Per-connection pub/sub state, needed to frame replies on a subscribed connection.
#[derive(Default)]
struct PubSub {
    /// Subscribed names per [`SubKind`], to know how many confirmations an UNSUBSCRIBE without
    /// arguments produces and whether RESP2 arrays may be messages.
    subs: [HashSet<Bytes>; 3],
    /// After MONITOR every frame is a log line.
    monitoring: bool,
    /// The node's socket address: a log line caused by one of the proxy's own connections to
    /// it is dropped (`own_lines`). Read once, when a dedicated connection starts.
    node: Option<SocketAddr>,
    /// The last log line was one of the proxy's scripts or its calls: the `lua` lines that
    /// follow are its calls (`own_lines::Judged::script_follows`).
    in_own_script: bool,
}

impl PubSub {
    fn subscribed(&self) -> bool {
        self.subs.iter().any(|s| !s.is_empty())
    }
}

/// Runs the connection until it fails, every sender is gone or `stop` resolves (the node is
/// no longer the one to use: Sentinel moved the primary). Returns why it ended; batches still
/// unanswered have had their error replies by then, and queued ones stay in `rx`.
#[expect(
    clippy::too_many_arguments,
    reason = "the connection task's settings, each used by one half of it"
)]
pub(crate) async fn run(
    stream: UpstreamStream,
    rx: &mut mpsc::Receiver<Batch>,
    addr: &Arc<str>,
    push: Option<PushTarget>,
    metrics: Option<Arc<Metrics>>,
    timeout: Option<Duration>,
    stop: Option<Stop>,
    coalesce: bool,
    proto: u8,
) -> String {
    let node = push.as_ref().and_then(|_| stream.peer_addr());
    let pubsub = PubSub {
        node,
        ..PubSub::default()
    };
    match stream {
        UpstreamStream::Tcp(mut tcp) => {
            let (r, w) = tcp.split();
            run_split(
                r, w, rx, addr, push, pubsub, metrics, timeout, stop, coalesce, proto,
            )
            .await
        }
        UpstreamStream::Tls(tls) => {
            let (r, w) = tokio::io::split(*tls);
            run_split(
                r, w, rx, addr, push, pubsub, metrics, timeout, stop, coalesce, proto,
            )
            .await
        }
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "the two stream halves plus the connection task's own arguments, passed through unchanged"
)]
async fn run_split<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: R,
    w: W,
    rx: &mut mpsc::Receiver<Batch>,
    addr: &Arc<str>,
    push: Option<PushTarget>,
    pubsub: PubSub,
    metrics: Option<Arc<Metrics>>,
    timeout: Option<Duration>,
    stop: Option<Stop>,
    coalesce: bool,
    proto: u8,
) -> String {
    let pending: Mutex<VecDeque<Pending>> = Mutex::new(VecDeque::new());
    // Batches this connection answered, for `coalesce::epoch`.
    let own = AtomicU64::new(0);
    let writer_metrics = metrics.clone();
    let mut reader = Reader {
        pos: 0,
        acc: BytesMut::new(),
        rbuf: BytesMut::with_capacity(READ_CHUNK),
        pubsub,
        push,
        stray: Default::default(),
        addr: addr.clone(),
        metrics,
        oom: false,
        timeout,
        resp3: proto == 3,
    };
    // Without a stop future the branch is disabled once, when `select!` starts, and never
    // polled: a fixed-address connection pays nothing per wake-up.
    let stoppable = stop.is_some();
    let (reason, by_proxy) = tokio::select! {
        r = write_loop(w, rx, &pending, coalesce.then_some(&own), writer_metrics.as_deref()) => match r {
            Ok(()) => ("closed by the proxy".to_string(), true),
            Err(e) => (format!("write failed: {e}"), false),
        },
        r = reader.read_loop(r, &pending, &own) => (r, false),
        r = async move {
            match stop {
                Some(stop) => stop.await,
                None => std::future::pending().await,
            }
        }, if stoppable => (r, false),
    };
    if !by_proxy {
        reader.report_subscriptions();
    }
    // Every batch that was registered may have reached Redis: answer each with an error and
    // never resend it (it may have been applied).
    let lost = UpstreamError::Lost {
        addr: addr.clone(),
        reason: reason.clone().into(),
    };
    let pending = pending.into_inner().unwrap_or_else(|e| e.into_inner());
    fail_pending(pending, &mut reader, &lost);
    reason
}

/// Answers every batch still waiting with `lost`: the head with the replies it got (they
/// are complete and delivered), the rest with none. Never resent: each may have been applied.
fn fail_pending(mut pending: VecDeque<Pending>, reader: &mut Reader, lost: &UpstreamError) {
    if let Some(head) = pending.pop_front() {
        let mut data = std::mem::take(&mut reader.acc);
        data.extend_from_slice(&reader.rbuf[..reader.pos]);
        let done_commands = match head.expect {
            Expect::Frames(_) => head.got,
            _ => 0,
        };
        let _ = head.reply_to.send(Reply::Batch {
            data: if done_commands > 0 {
                data.freeze()
            } else {
                Bytes::new()
            },
            missing: head.expect.commands() - done_commands,
            error: Some(Box::new(lost.clone())),
            seq: head.seq,
        });
        fail_followers(head.coalesced, lost);
    }
    for p in pending {
        let _ = p.reply_to.send(Reply::Batch {
            data: Bytes::new(),
            missing: p.expect.commands(),
            error: Some(Box::new(lost.clone())),
            seq: p.seq,
        });
        fail_followers(p.coalesced, lost);
    }
}

/// The reads that joined a lost batch (`coalesce`), if any: one command each, without a
/// reply.
fn fail_followers(coalesced: Option<Box<Coalesced>>, lost: &UpstreamError) {
    for (to, seq) in coalesced.map(|c| c.followers).unwrap_or_default() {
        let _ = to.send(Reply::Batch {
            data: Bytes::new(),
            missing: 1,
            error: Some(Box::new(lost.clone())),
            seq,
        });
    }
}

/// Puts `batch` in the reply queue and hands back its bytes to write; `None` when it is a
/// shareable read identical to the last batch sent (same bytes, no other connection's reply
/// since: `share`), which it joins instead of being sent.
fn register(
    pending: &Mutex<VecDeque<Pending>>,
    batch: Batch,
    share: Option<(Bytes, u64)>,
    now: Instant,
) -> Option<Bytes> {
    let mut queue = lock(pending);
    if let (Some((bytes, epoch)), Some(last)) = (&share, queue.back_mut()) {
        if let Some(c) = last.coalesced.as_mut()
            && c.share.0 == bytes
            && c.share.1 == *epoch
        {
            c.followers.push((batch.reply_to, batch.seq));
            return None;
        }
    }
    queue.push_back(Pending {
        expect: batch.expect,
        total: None,
        got: 0,
        reply_to: batch.reply_to,
        seq: batch.seq,
        sent: now,
        wait: batch.wait,
        since: now,
        coalesced: share.map(|share| {
            Box::new(Coalesced {
                share,
                followers: Vec::new(),
            })
        }),
    });
    Some(batch.bytes)
}

/// Writes queued batches. `coalesce`: this connection's reply count when identical reads
/// may share a reply (`coalesce`), `None` otherwise.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    rx: &mut mpsc::Receiver<Batch>,
    pending: &Mutex<VecDeque<Pending>>,
    coalesce: Option<&AtomicU64>,
    metrics: Option<&Metrics>,
) -> std::io::Result<()> {
    let mut buf = BytesMut::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(batch) = next {
            let now = Instant::now();
            let share = match coalesce {
                Some(own)
                    if batch.expect == Expect::Frames(1)
                        && super::coalesce::shareable(&batch.bytes) =>
                {
                    Some((batch.bytes.clone(), super::coalesce::epoch(own)))
                }
                _ => None,
            };
            let Some(bytes) = register(pending, batch, share, now) else {
                // The same read, sent last and not answered: it shares that reply.
                if let Some(m) = metrics {
                    m.coalesced_reads.inc();
                }
                next = rx.try_recv().ok();
                continue;
            };
            if bytes.len() >= COPY_LIMIT {
                if !buf.is_empty() {
                    w.write_all(&buf).await?;
                    buf.clear();
                }
                w.write_all(&bytes).await?;
            } else {
                buf.extend_from_slice(&bytes);
            }
            if buf.len() >= WRITE_BATCH {
                break;
            }
            next = rx.try_recv().ok();
        }
        if !buf.is_empty() {
            w.write_all(&buf).await?;
            buf.clear();
        }
        // Let an idle connection give its coalescing buffer back.
        if buf.capacity() > WRITE_BATCH {
            buf = BytesMut::new();
        }
    }
    Ok(())
}

struct Reader {
    /// End of the frames already counted for the head batch; they stay in `rbuf` so the whole
    /// batch can be split off without copying.
    pos: usize,
    /// Head-batch replies moved out of `rbuf` because a push frame interrupted them.
    acc: BytesMut,
    /// Bytes read from Redis and not yet handed out.
    rbuf: BytesMut,
    /// Subscription state; used only when `push` is set (dedicated connections).
    pubsub: PubSub,
    /// Where out-of-band frames go; `None` on shared connections, which never subscribe.
    push: Option<PushTarget>,
    /// Shared connections: the pushes that arrived anyway, dropped (see `stray`).
    stray: super::stray::StrayPushes,
    /// The node, for the log line about a stray push.
    addr: Arc<str>,
    /// Counts error replies, and round trips on shared connections (a dedicated one carries
    /// blocking commands, whose wait is not the upstream's latency).
    metrics: Option<Arc<Metrics>>,
    /// The head batch has an OOM error among its replies: the proxy's note is added to it
    /// when the batch is handed out (`oom`).
    oom: bool,
    /// Longest wait for the oldest unanswered batch before the connection is declared dead
    /// (a stopped or partitioned Redis would otherwise hang every client on it), on top of
    /// the wait a blocking command asked for (see [`ReplyWait`]).
    timeout: Option<Duration>,
    /// Whether the connection speaks RESP3, where every push is a `>` frame: a `*` frame is
    /// then a reply, however much it looks like a message (a script's `{'message','ch','x'}`
    /// while subscribed). Set by the handshake, changed by a HELLO's or RESET's reply (`track`).
    resp3: bool,
}

impl Reader {
    async fn read_loop<R: AsyncRead + Unpin>(
        &mut self,
        mut r: R,
        pending: &Mutex<VecDeque<Pending>>,
        own: &AtomicU64,
    ) -> String {
        // How long the next read may wait before the oldest batch is looked at.
        let mut wait = self.timeout.unwrap_or_default();
        loop {
            if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
                self.rbuf.reserve(READ_CHUNK);
            }
            let read = match self.timeout {
                None => r.read_buf(&mut self.rbuf).await,
                // One timer per read, not per command: wakes when the upstream has been silent
                // for `wait` to look at the oldest batch; reads are cancel-safe, so a wake-up
                // loses nothing.
                Some(t) => match tokio::time::timeout(wait, r.read_buf(&mut self.rbuf)).await {
                    Ok(read) => {
                        wait = t;
                        read
                    }
                    Err(_) => match overdue(lock(pending).front(), t) {
                        Overdue::Yes(limit) => return timed_out(t, limit),
                        // Sleep only until the oldest batch is due, so a silent upstream is
                        // noticed about `timeout` after its deadline, not up to twice that.
                        Overdue::In(left) => {
                            wait = left;
                            continue;
                        }
                    },
                },
            };
            match read {
                Ok(0) => return "connection closed by upstream".to_string(),
                Ok(_) => {}
                Err(e) => return format!("read failed: {e}"),
            }
            if let Err(e) = self.process(pending, own).await {
                return e;
            }
        }
    }

    /// Hands out every complete reply in the buffer.
    async fn process(
        &mut self,
        pending: &Mutex<VecDeque<Pending>>,
        own: &AtomicU64,
    ) -> Result<(), String> {
        loop {
            let len = match reply::scan(&self.rbuf[self.pos..]) {
                Ok(Some(len)) => len,
                Ok(None) => return Ok(()),
                Err(e) => return Err(e.to_string()),
            };
            let start = self.pos;
            if self.push.is_some() && self.is_push(&self.rbuf[start..start + len], pending) {
                if self.pubsub.monitoring
                    && let Some(node) = self.pubsub.node
                {
                    let line = &self.rbuf[start..start + len];
                    let judged = super::own_lines::judge(node, line, self.pubsub.in_own_script);
                    self.pubsub.in_own_script = judged.script_follows;
                    if judged.own {
                        self.skip(len);
                        continue;
                    }
                }
                self.forward_push(len).await?;
                continue;
            }
            // A push on a shared connection (only `>` frames: no lock taken for the rest).
            if self.push.is_none()
                && self.rbuf[start] == b'>'
                && !super::stray::is_reply(
                    &self.rbuf[start..start + len],
                    !lock(pending).is_empty(),
                )
            {
                self.drop_stray(len);
                continue;
            }
            let mut queue = lock(pending);
            let Some(head) = queue.front_mut() else {
                return Err("reply without a request".to_string());
            };
            let total = *head.total.get_or_insert_with(|| match head.expect {
                Expect::Frames(n) | Expect::Confirmations(n) => n,
                Expect::UnsubscribeAll(kind) => self.pubsub.subs[kind.index()].len().max(1) as u32,
                Expect::Monitor => 1,
            });
            if self.push.is_some() {
                let expect = head.expect;
                self.track(expect, start, len);
            }
            head.got += 1;
            self.pos = start + len;
            if let Some(m) = &self.metrics {
                if self.rbuf[start] == b'-' {
                    m.upstream_error_replies.inc();
                    if super::oom::is_oom(&self.rbuf[start..start + len]) {
                        m.oom_replies.inc();
                        self.oom = true;
                    }
                }
            }
            if head.got >= total {
                let Some(head) = queue.pop_front() else {
                    return Err("reply queue changed underneath".to_string());
                };
                if head.wait != ReplyWait::Prompt {
                    // The next batch could not be answered while this one blocked: its
                    // command timeout starts now (only after a blocking command, so the
                    // shared connections' path reads no clock here).
                    if let Some(next) = queue.front_mut() {
                        next.since = Instant::now();
                    }
                }
                drop(queue);
                self.deliver(head, total, own);
            }
        }
    }

    /// Hands the batch whose last reply ends at `pos` to its session (and to the reads that
    /// joined it), as one slice of the read buffer.
    fn deliver(&mut self, head: Pending, total: u32, own: &AtomicU64) {
        // A blocking command's time (BLPOP, XREAD BLOCK, WAIT) is the wait its client asked
        // for, not the upstream's latency: kept out, so latency alerts do not fire for
        // queue consumers.
        if let (Some(m), None, ReplyWait::Prompt) = (&self.metrics, &self.push, head.wait) {
            m.upstream_duration
                .observe_n(head.sent.elapsed(), u64::from(total));
        }
        let data = if self.acc.is_empty() {
            self.rbuf.split_to(self.pos).freeze()
        } else {
            self.acc.extend_from_slice(&self.rbuf[..self.pos]);
            self.rbuf.advance(self.pos);
            self.acc.split().freeze()
        };
        self.pos = 0;
        let data = match (std::mem::take(&mut self.oom), &self.metrics) {
            (true, Some(m)) => match m.memory_report.load().as_deref() {
                Some(report) => super::oom::annotate(data, &report.oom_note),
                None => data,
            },
            _ => data,
        };
        if super::coalesce::enabled() {
            super::coalesce::answered(own);
        }
        // In the order the batches were sent: a session whose own reads joined gets its
        // replies in order.
        let followers = head.coalesced.map(|c| c.followers).unwrap_or_default();
        let shared = (!followers.is_empty()).then(|| data.clone());
        let _ = head.reply_to.send(Reply::Batch {
            data,
            missing: 0,
            error: None,
            seq: head.seq,
        });
        for (to, seq) in followers {
            let _ = to.send(Reply::Batch {
                data: shared.clone().unwrap_or_default(),
                missing: 0,
                error: None,
                seq,
            });
        }
    }

    /// Whether a frame on a dedicated connection is out of band rather than a reply.
    fn is_push(&self, frame: &[u8], pending: &Mutex<VecDeque<Pending>>) -> bool {
        let queue = lock(pending);
        let head = queue.front();
        if self.pubsub.monitoring {
            // MONITOR lines are `+<timestamp> …`; anything else answers a command (RESET, QUIT).
            let log_line =
                frame.first() == Some(&b'+') && frame.get(1).is_some_and(u8::is_ascii_digit);
            return log_line || head.is_none();
        }
        let awaits_confirmation = head.is_some_and(|h| {
            matches!(
                h.expect,
                Expect::Confirmations(_) | Expect::UnsubscribeAll(_)
            )
        });
        match frame.first() {
            Some(b'>') => match reply::classify_pubsub(frame) {
                PubSubFrame::Confirmation { .. } => !awaits_confirmation,
                _ => true,
            },
            Some(b'*') if self.pubsub.subscribed() && !self.resp3 => {
                match reply::classify_pubsub(frame) {
                    PubSubFrame::Message => true,
                    PubSubFrame::Confirmation { .. } => !awaits_confirmation,
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// Tells the session which classic subscriptions this failed connection held (see
    /// `Reply::Subscriptions`); nothing for a connection without any.
    fn report_subscriptions(&self) {
        let Some(push) = &self.push else {
            return;
        };
        let [channels, patterns, _] = &self.pubsub.subs;
        if channels.is_empty() && patterns.is_empty() {
            return;
        }
        let subs = Subscriptions {
            channels: channels.iter().cloned().collect(),
            patterns: patterns.iter().cloned().collect(),
        };
        let _ = push
            .to
            .send(Reply::Subscriptions(push.conn_id, Box::new(subs)));
    }

    /// Updates subscription state from a reply frame of the head batch, by what the batch
    /// asked: only a (un)subscribe command's own replies say what the connection is
    /// subscribed to. Any other reply may merely look like a confirmation: `COMMAND LIST`
    /// starts with `subscribe` in some servers' orders, and a list or a script reply can be
    /// made to. Taken for one, it made the connection "subscribed", so the next such reply
    /// was handed on as a pushed message and every reply after it went to the command before
    /// (the reply sweep's rare reset and stall, docs/fuzzing.md).
    fn track(&mut self, expect: Expect, start: usize, len: usize) {
        let frame = &self.rbuf[start..start + len];
        match expect {
            Expect::Monitor => self.pubsub.monitoring = frame.first() == Some(&b'+'),
            Expect::Confirmations(_) | Expect::UnsubscribeAll(_) => {
                if let PubSubFrame::Confirmation { kind, subscribe } = reply::classify_pubsub(frame)
                    && let Some(name) = reply::element(frame, 1).map(Bytes::copy_from_slice)
                {
                    self.update(kind, subscribe, &name);
                }
            }
            // A forwarded RESET (`Effect::Reset`) ends every subscription and MONITOR, and
            // goes back to RESP2. A script's status reply can spell `+RESET` too; taken for
            // one, it only clears this state, so no later frame is taken for a push. A HELLO
            // (forwarded on a held connection) switches the protocol; a script can shape its
            // reply like one only as RESP3 (`*`), which is taken for RESP2 then: a message-
            // shaped reply of its own while subscribed could then shift only its own replies.
            Expect::Frames(_) => {
                if frame == b"+RESET\r\n" {
                    self.pubsub = PubSub::default();
                    self.resp3 = false;
                } else if let Some(proto) = reply::hello_proto(frame) {
                    self.resp3 = proto == 3;
                }
            }
        }
    }

    fn update(&mut self, kind: SubKind, subscribe: bool, name: &[u8]) {
        let set = &mut self.pubsub.subs[kind.index()];
        if subscribe {
            set.insert(Bytes::copy_from_slice(name));
        } else {
            set.remove(name);
        }
    }

    /// Drops the push frame at `pos..pos+len` from a shared connection (see `stray`),
    /// keeping the head batch's partial replies intact.
    fn drop_stray(&mut self, len: usize) {
        let frame = &self.rbuf[self.pos..self.pos + len];
        self.stray
            .dropped(&self.addr, frame, self.metrics.as_deref());
        self.skip(len);
    }

    /// Drops the frame at `pos..pos+len`, keeping the head batch's partial replies intact.
    fn skip(&mut self, len: usize) {
        self.set_aside();
        self.rbuf.advance(len);
    }

    /// Moves the head batch's replies read so far (before `pos`) to `acc`, so the frame at
    /// `pos` starts the read buffer and can leave it on its own.
    fn set_aside(&mut self) {
        if self.pos > 0 {
            self.acc.extend_from_slice(&self.rbuf[..self.pos]);
            self.rbuf.advance(self.pos);
            self.pos = 0;
        }
    }

    /// Sends the push frame at `pos..pos+len` to the session, keeping the head batch's
    /// partial replies intact.
    async fn forward_push(&mut self, len: usize) -> Result<(), String> {
        let frame = &self.rbuf[self.pos..self.pos + len];
        if let PubSubFrame::Confirmation { kind, subscribe } = reply::classify_pubsub(frame) {
            // Redis may unsubscribe a client on its own (e.g. a shard channel's slot moved).
            if let Some(name) = reply::element(frame, 1).map(Bytes::copy_from_slice) {
                self.update(kind, subscribe, &name);
            }
        }
        self.set_aside();
        let frame = self.rbuf.split_to(len).freeze();
        let Some(target) = self.push.as_ref() else {
            return Err("push frame on a shared connection".to_string());
        };
        let permits = (frame.len() as u32).clamp(1, target.budget_size);
        match target.budget.acquire_many(permits).await {
            Ok(p) => p.forget(),
            Err(_) => return Err("session gone".to_string()),
        }
        if target
            .to
            .send(Reply::Push(frame, permits, target.conn_id))
            .is_err()
        {
            return Err("session gone".to_string());
        }
        Ok(())
    }
}

/// Whether the oldest unanswered batch is past its deadline.
enum Overdue {
    /// Yes, and how long its command was allowed to block on top of the timeout.
    Yes(ReplyWait),
    /// Not yet: look again after this long (the full timeout when nothing can be overdue).
    In(Duration),
}

/// Why a connection is declared dead after `timeout` without a reply to its oldest batch,
/// which could wait `limit` on its own.
fn timed_out(timeout: Duration, limit: ReplyWait) -> String {
    match limit {
        ReplyWait::Blocks(limit) => format!(
            "no reply within {} ms (upstream.command_timeout_ms) after the command's own {} ms \
             timeout",
            timeout.as_millis(),
            limit.as_millis()
        ),
        _ => format!(
            "no reply within {} ms (upstream.command_timeout_ms)",
            timeout.as_millis()
        ),
    }
}

/// Judges the oldest unanswered batch: overdue once `timeout` has passed since it reached
/// the head of the queue, plus whatever its command may block for. Nothing in flight (an idle
/// or subscribed connection: pushes need no request) or a command that may block forever is
/// never overdue.
fn overdue(head: Option<&Pending>, timeout: Duration) -> Overdue {
    let Some((head, allowance)) = head.and_then(|p| Some((p, p.wait.allowance(timeout)?))) else {
        return Overdue::In(timeout);
    };
    match allowance.checked_sub(head.since.elapsed()) {
        Some(left) if !left.is_zero() => Overdue::In(left.min(timeout)),
        _ => Overdue::Yes(head.wait),
    }
}

/// Locks the pending FIFO; a poisoned lock (a panic elsewhere in this task) still holds a
/// consistent queue, because every critical section is a single push or pop.
fn lock(m: &Mutex<VecDeque<Pending>>) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod size_tests {
    /// Every batch's record is moved into the reply queue and out of it: small enough to be
    /// copied inline rather than by a `memcpy` call (144 bytes with coalescing's parts inline).
    #[test]
    fn a_pending_batch_stays_small() {
        let size = std::mem::size_of::<super::Pending>();
        assert!(size <= 88, "{size}");
    }
}
