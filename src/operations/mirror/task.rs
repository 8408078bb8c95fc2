//! The mirror's task: plans each answered batch, sends it over the mirror's own pipelined
//! connection (one per RESP version, so one client's commands keep their order), and checks
//! the replies: errors to acknowledged writes counted, compared reads counted and, a few a
//! minute, logged by command and key name (never values).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Message;
use super::compare::same;
use super::plan::{Check, Compared, Planner};
use crate::commands::KeyPositions;
use crate::observe::metrics::Metrics;
use crate::protocol::codec;
use crate::topology::cluster::{Redirect, Router};
use crate::upstream::pool::Pool;
use crate::upstream::{Batch, Expect, Reply, ReplyWait};

/// Shadow reads.
pub(super) struct CompareSettings {
    /// Reads compared per 10,000.
    pub(crate) below: u64,
    /// Divergences logged per minute at most.
    pub(crate) log_per_minute: u32,
}

/// What the task runs with.
pub(super) struct Running {
    /// Answered batches from the sessions.
    pub(crate) rx: mpsc::UnboundedReceiver<Message>,
    /// Bytes in `rx`, given back as the task takes them.
    pub(crate) queued: Arc<AtomicUsize>,
    /// Clients whose batches were dropped before the task got them.
    pub(crate) lost: Arc<super::Lost>,
    /// The mirror's connections.
    pub(crate) upstream: Upstream,
    /// The proxy's metrics, where the mirror's counters are.
    pub(crate) metrics: Arc<Metrics>,
    /// Shadow reads, if on.
    pub(crate) compare: Option<CompareSettings>,
    /// The mirror's address, for the log.
    pub(crate) address: String,
}

/// Where the mirror's commands go.
pub(super) enum Upstream {
    /// One server (standalone, or the primary a Sentinel names).
    Node(Arc<Pool>),
    /// A Redis Cluster: started by the task (learning the map takes a round trip), from
    /// this configuration (the mirror's upstream, one connection per node and RESP version)
    /// and with these metrics (the mirror's own).
    Cluster(Box<crate::config::Config>, Arc<Metrics>),
}

/// The mirror's connections, once started.
enum Started {
    /// One server's pool.
    Node(Arc<Pool>),
    /// A cluster's router, with key positions reused to place commands.
    Cluster(Arc<Router>, KeyPositions),
}

/// Batches sent to the mirror and not answered yet, at most: past it the mirror is too slow
/// and batches are dropped (counted), so its backlog cannot grow the proxy's memory.
const MAX_PENDING: usize = 4_096;

/// Distinct key prefixes labelled in the divergence metric; later ones count as `(other)`.
const MAX_PREFIXES: usize = 50;

/// A batch sent to the mirror.
struct Pending {
    /// Its connection's RESP version.
    proto: u8,
    /// What to do with each reply.
    checks: Vec<Check>,
    /// A cluster mirror: the node it went to, and each command alone where a `-MOVED` or
    /// `-ASK` may resend it (`None` inside a transaction, and for a resent one: followed
    /// once).
    cluster: Option<(u16, Vec<Option<Bytes>>)>,
}

/// The task's state besides its queue.
struct State {
    /// The mirror's connections.
    upstream: Started,
    /// The proxy's metrics.
    metrics: Arc<Metrics>,
    /// Where the mirror's connections deliver their replies.
    reply_tx: crate::upstream::ReplySender,
    /// The mirror's address, for the log.
    address: String,
    /// What each answered batch asks of the mirror.
    planner: Planner,
    /// Batches sent, by `seq`, with what to check in their replies.
    pending: HashMap<u16, Pending>,
    /// The next batch's `seq`.
    next_seq: u16,
    /// Key prefixes labelled so far in the divergence metric.
    prefixes: HashSet<Vec<u8>>,
    /// How many more divergences and errors the log takes this minute.
    log: LogBudget,
}

/// Lines logged a minute, at most.
struct LogBudget {
    /// Start of the current minute, and lines logged in it.
    window: (Instant, u32),
    /// Lines a minute at most.
    per_minute: u32,
}

impl LogBudget {
    /// Whether one more line may be logged this minute.
    fn allow(&mut self) -> bool {
        let (start, logged) = &mut self.window;
        if start.elapsed() >= Duration::from_secs(60) {
            *start = Instant::now();
            *logged = 0;
        }
        if *logged >= self.per_minute {
            return false;
        }
        *logged += 1;
        true
    }
}

/// Runs until the mirror is replaced or stopped (its queue closed).
pub(super) async fn run(running: Running) {
    let Running {
        mut rx,
        queued,
        lost,
        upstream,
        metrics,
        compare,
        address,
    } = running;
    let compare_below = compare.as_ref().map_or(0, |c| c.below);
    let (upstream, planner) = match upstream {
        Upstream::Node(pool) => (Started::Node(pool), Planner::new(compare_below)),
        Upstream::Cluster(config, own) => match Router::start(&config, own).await {
            Ok(router) => (
                Started::Cluster(router, KeyPositions::default()),
                Planner::new(compare_below).one_database(),
            ),
            Err(e) => {
                // Checked at load (`mirror_problems`); a mirror that cannot start drops
                // everything it is given, counted.
                tracing::error!(mirror = address, error = %e, "the cluster mirror cannot start");
                return;
            }
        },
    };
    let (reply_tx, mut replies) = crate::upstream::reply_channel();
    // Flushes waiting for the batches sent before them to be answered.
    let mut flushes: Vec<tokio::sync::oneshot::Sender<()>> = Vec::new();
    let mut state = State {
        upstream,
        metrics,
        reply_tx,
        address,
        planner,
        pending: HashMap::new(),
        next_seq: 0,
        prefixes: HashSet::new(),
        log: LogBudget {
            window: (Instant::now(), 0),
            per_minute: compare.as_ref().map_or(10, |c| c.log_per_minute),
        },
    };
    loop {
        tokio::select! {
            message = rx.recv() => {
                let Some(message) = message else { break };
                queued.fetch_sub(message.size(), Ordering::Relaxed);
                match message {
                    Message::Gone(client) => state.planner.forget(client),
                    Message::Flush(done) => flushes.push(done),
                    Message::Answered { client, proto, commands, replies } => {
                        if lost.any() {
                            for client in lost.take() {
                                state.planner.untrack(client);
                            }
                        }
                        state.send(client, proto, &commands, &replies);
                    }
                }
            }
            Some(reply) = replies.recv() => state.check(reply),
        }
        if !flushes.is_empty() && state.pending.is_empty() {
            for done in flushes.drain(..) {
                let _ = done.send(());
            }
        }
    }
    // Replaced or stopped: the replies still due are read, so what was sent is counted.
    let deadline = tokio::time::sleep(Duration::from_secs(5));
    tokio::pin!(deadline);
    while !state.pending.is_empty() {
        tokio::select! {
            reply = replies.recv() => match reply {
                Some(reply) => state.check(reply),
                None => break,
            },
            _ = &mut deadline => break,
        }
    }
}

impl State {
    /// Plans one answered batch and sends the mirror its part.
    fn send(&mut self, client: u64, proto: u8, commands: &Bytes, replies: &Bytes) {
        let metrics = self.metrics.clone();
        let m = &metrics.mirror;
        let planned = self.planner.plan(client, proto, commands, replies);
        m.skipped.inc_by(planned.skipped);
        m.dropped[2].inc_by(planned.unknown);
        m.dropped[0].inc_by(planned.lost);
        if planned.checks.is_empty() {
            return;
        }
        let (router, keys) = match &mut self.upstream {
            Started::Node(pool) => {
                let pool = pool.clone();
                let writes = planned.writes;
                let bytes = planned.bytes.freeze();
                if self.submit(&pool, proto, bytes, planned.checks, None) {
                    m.sent[0].inc_by(writes);
                    m.sent[1].inc_by(planned.reads);
                } else {
                    m.dropped[1].inc_by(writes);
                    self.planner.lost_track(proto);
                }
                return;
            }
            Started::Cluster(router, keys) => (router.clone(), keys),
        };
        let bytes = planned.bytes.freeze();
        let (parts, unplaced) = super::cluster::place(&router, &bytes, planned.checks, keys);
        m.dropped[1].inc_by(unplaced);
        m.sent[1].inc_by(planned.reads);
        for part in parts {
            let writes = part.checks.iter().filter(|c| **c == Check::Write).count() as u64;
            let pool = router.pool(part.node);
            let cluster = Some((part.node, part.commands));
            if self.submit(&pool, proto, part.bytes.freeze(), part.checks, cluster) {
                m.sent[0].inc_by(writes);
            } else {
                m.dropped[1].inc_by(writes);
            }
        }
    }

    /// Sends one batch on `pool`'s connection for `proto` and keeps what to check in its
    /// replies; `false` when it was not sent (too many pending, or the connection's queue
    /// is full), and nothing is kept.
    fn submit(
        &mut self,
        pool: &Pool,
        proto: u8,
        bytes: Bytes,
        checks: Vec<Check>,
        cluster: Option<(u16, Vec<Option<Bytes>>)>,
    ) -> bool {
        let seq = self.next_seq;
        if self.pending.len() >= MAX_PENDING || self.pending.contains_key(&seq) {
            return false;
        }
        let batch = Batch {
            bytes,
            expect: Expect::Frames(checks.len() as u32),
            wait: ReplyWait::Prompt,
            reply_to: self.reply_tx.clone(),
            seq,
        };
        // One connection per RESP version (client id 0): a client's batches stay in order.
        if pool.shared(proto, 0).try_send(batch).is_err() {
            return false;
        }
        self.next_seq = seq.wrapping_add(1);
        self.pending.insert(
            seq,
            Pending {
                proto,
                checks,
                cluster,
            },
        );
        true
    }

    /// A cluster mirror's `-MOVED`/`-ASK` to a single command: sent again where the
    /// cluster says, once (the command did not run where it was refused); `false` when it
    /// is not a redirection or cannot be followed.
    fn follow(&mut self, proto: u8, node: u16, frame: &[u8], command: Option<&Bytes>) -> bool {
        let (Started::Cluster(router, _), Some(command)) = (&self.upstream, command) else {
            return false;
        };
        let router = router.clone();
        let Ok(Some(redirect)) = Redirect::parse(frame, &router.addr(node)) else {
            return false;
        };
        let (to, bytes, checks) = match &redirect {
            Redirect::Moved { slot, addr } => {
                router.apply_moved(*slot, addr);
                (router.node(addr), command.clone(), vec![Check::Write])
            }
            Redirect::Ask { addr, .. } => {
                let mut bytes = BytesMut::from(&codec::encode(&[b"ASKING"])[..]);
                bytes.extend_from_slice(command);
                (
                    router.node(addr),
                    bytes.freeze(),
                    vec![Check::Ignore, Check::Write],
                )
            }
        };
        let pool = router.pool(to);
        let resent = vec![None; checks.len()];
        self.submit(&pool, proto, bytes, checks, Some((to, resent)))
    }

    /// Checks the mirror's replies to one batch.
    fn check(&mut self, reply: Reply) {
        let Reply::Batch {
            data,
            missing,
            error,
            seq,
        } = reply
        else {
            return;
        };
        let Some(pending) = self.pending.remove(&seq) else {
            return;
        };
        let metrics = self.metrics.clone();
        let m = &metrics.mirror;
        let mut frames = crate::protocol::reply::frames(&data);
        let (node, alone) = match pending.cluster {
            Some((node, alone)) => (node, alone),
            None => (0, Vec::new()),
        };
        let mut checks = pending.checks.into_iter();
        for (i, check) in checks.by_ref().enumerate() {
            let Some(frame) = frames.next() else {
                // No reply: the connection failed; counted below with the others.
                if matches!(check, Check::Write) {
                    m.dropped[1].inc();
                }
                break;
            };
            match check {
                Check::Ignore => {}
                Check::Write => {
                    let command = alone.get(i).and_then(Option::as_ref);
                    if (frame.starts_with(b"-MOVED ") || frame.starts_with(b"-ASK "))
                        && self.follow(pending.proto, node, frame, command)
                    {
                        // Counted as sent once, when first sent; checked when answered.
                        continue;
                    }
                    if frame.first() == Some(&b'-') {
                        m.errors.inc();
                        if self.log.allow() {
                            tracing::warn!(
                                mirror = self.address,
                                error = %String::from_utf8_lossy(frame.strip_suffix(b"\r\n").unwrap_or(frame)),
                                "the mirror refused a write the primary acknowledged"
                            );
                        }
                    }
                }
                Check::Compare(c) => {
                    m.compared.inc();
                    if !same(c.how, &c.primary, frame) {
                        diverged(
                            &self.metrics,
                            &mut self.prefixes,
                            &mut self.log,
                            &self.address,
                            &c,
                        );
                    }
                }
            }
        }
        let unanswered = checks.filter(|c| matches!(c, Check::Write)).count();
        m.dropped[1].inc_by(unanswered as u64);
        if missing > 0 || error.is_some() {
            self.planner.lost_track(pending.proto);
            if let Some(e) = error
                && self.log.allow()
            {
                tracing::warn!(mirror = self.address, error = %e, "mirror connection failed; its unanswered writes are counted as dropped");
            }
        }
    }
}

/// Counts and (a few a minute) logs a compared read the mirror answered differently.
fn diverged(
    metrics: &Metrics,
    prefixes: &mut HashSet<Vec<u8>>,
    log: &mut LogBudget,
    address: &str,
    c: &Compared,
) {
    let prefix = match c.key.iter().position(|&b| b == b':') {
        Some(i) => &c.key[..=i],
        None => &b"(none)"[..],
    };
    let label = if prefixes.contains(prefix) || prefixes.len() < MAX_PREFIXES {
        prefixes.insert(prefix.to_vec());
        String::from_utf8_lossy(prefix).into_owned()
    } else {
        "(other)".to_string()
    };
    metrics.mirror.diverged(c.command, label);
    if log.allow() {
        tracing::warn!(
            mirror = address,
            command = c.command,
            key = %String::from_utf8_lossy(&c.key),
            "the mirror answered a read differently from the primary"
        );
    }
}
