//! Mirroring for migrations (`mirror:`, docs/migration.md): every write the primary
//! acknowledged is sent to a second server as well, and a share of the reads is sent to both
//! and the answers compared, so an operator watches the new server agree before switching.
//!
//! - [`plan`]: what the mirror is sent for an answered batch (pure: which commands, in which
//!   database, transactions at EXEC, blocking pops as what they did).
//! - [`compare`]: whether two replies to a read agree.
//! - [`task`]: the task that sends to the mirror and checks its replies.
//!
//! The client's reply always comes from the primary, and the client never waits for the
//! mirror: a session hands each answered batch (two refcounted slices, no copy) to
//! [`MirrorSlot::answered`], which queues it unless the queue already holds
//! `max_queue_bytes`; then it is dropped and counted. Everything else happens on the mirror's
//! own task and connection.

mod cluster;
mod compare;
pub mod cutover;
mod message;
mod plan;
mod task;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;
use tokio::sync::mpsc;

use crate::commands::CommandSpec;
use crate::config::{Config, MirrorConfig, UpstreamMode};
use crate::observe::metrics::{Metrics, NoPolicy};
use crate::upstream::address::Address;
use crate::upstream::pool::{Pool, PoolSettings};
use message::{Lost, Message};

/// One running mirror: its queue and what it was started from.
struct Mirror {
    /// The mirror task's queue.
    tx: mpsc::UnboundedSender<Message>,
    /// Bytes queued and not yet taken by the task.
    queued: Arc<AtomicUsize>,
    /// Clients whose batches were dropped here, for the task.
    lost: Arc<Lost>,
    /// `max_queue_bytes`.
    max_queued: usize,
    /// Where drops are counted.
    metrics: Arc<Metrics>,
    /// The settings it runs with (values only), so a reload that keeps them keeps it.
    fingerprint: String,
    /// The mirror's address and phase, for INFO.
    summary: String,
    /// Captures of batches that answer promptly, not yet answered: a cutover waits for none
    /// to be left (a blocking command's capture is not counted: it may never be answered).
    outstanding: AtomicUsize,
    /// A Sentinel-managed mirror: the task following its primary, stopped with the mirror.
    follower: Option<tokio::task::AbortHandle>,
    /// Whether reads are compared: a batch of one read is then captured (the planner samples
    /// it), else left alone (see [`MirrorSlot::capture`]).
    compares: bool,
    /// With routes (`mirror.route`): the one router node whose batches are captured, the
    /// server the mirror replaces; `None`: every batch.
    only: Option<u16>,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        if let Some(follower) = &self.follower {
            follower.abort();
        }
    }
}

impl Mirror {
    /// Queues `message` unless that would pass `max_queue_bytes`; returns whether it was.
    fn queue(&self, message: Message) -> bool {
        let size = message.size();
        let before = self.queued.fetch_add(size, Ordering::Relaxed);
        if before + size > self.max_queued && size > 0 {
            self.queued.fetch_sub(size, Ordering::Relaxed);
            return false;
        }
        if self.tx.send(message).is_err() {
            self.queued.fetch_sub(size, Ordering::Relaxed);
            return false;
        }
        true
    }
}

impl Mirror {
    /// Waits (at most `within`) until no batch captured for this mirror is still unanswered
    /// (only `mirror` itself holds it then) and the mirror has replied to everything it was
    /// sent; `false` if that took longer.
    async fn settle(mirror: Arc<Mirror>, within: std::time::Duration) -> bool {
        let until = tokio::time::Instant::now() + within;
        // Captures end as their batches are answered (the sessions keep reading replies
        // while the gate is closed).
        if !crate::upstream::gate::drained(&mirror.outstanding, until).await {
            return false;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if mirror.tx.send(Message::Flush(tx)).is_err() {
            return false;
        }
        matches!(tokio::time::timeout_at(until, rx).await, Ok(Ok(())))
    }
}

/// A batch sent while a mirror ran, kept with that mirror until the primary answers it:
/// its writes go to the mirror of the moment it was sent, even if a cutover replaced the
/// mirror meanwhile.
pub(crate) struct Capture {
    /// The mirror running when the batch was sent.
    mirror: Arc<Mirror>,
    /// Counted in the mirror's `outstanding` (not a blocking command).
    counted: bool,
    /// The RESP version the batch went in.
    proto: u8,
    /// The batch as sent.
    commands: Bytes,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Capture({} bytes, RESP{})",
            self.commands.len(),
            self.proto
        )
    }
}

impl Capture {
    /// The primary answered the batch with `replies` (fewer when its connection failed);
    /// `count` commands. Never waits.
    pub(crate) fn answered(&self, client: u64, replies: Bytes, count: u32) {
        let queued = self.mirror.queue(Message::Answered {
            client,
            proto: self.proto,
            commands: self.commands.clone(),
            replies,
        });
        if !queued {
            self.mirror.metrics.mirror.dropped[0].inc_by(u64::from(count));
            self.mirror.lost.add(client);
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if self.counted {
            self.mirror.outstanding.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Where sessions find the mirror of the moment: none, or one started from the
/// configuration, replaced on reload.
#[derive(Default)]
pub struct MirrorSlot {
    /// Whether a mirror runs: one relaxed load on each batch's path when none does.
    on: AtomicBool,
    /// The running mirror.
    current: ArcSwapOption<Mirror>,
}

impl MirrorSlot {
    /// Whether a mirror runs, so a session keeps each batch's bytes until it is answered.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Keeps a batch sent in RESP `proto` for the running mirror (`None`: none runs);
    /// `blocking`: a blocking command, which may never be answered.
    ///
    /// `sole`: the batch's only command, when it is one command outside a transaction. A
    /// batch that cannot concern the mirror (one read, and reads not compared) is not
    /// captured: unpipelined reads then cost the mirror nothing (no queue, no second decode
    /// in the task; `plan::concerns`).
    ///
    /// `node`: the router node the batch went to (0 in front of one server); with routes,
    /// only the mirrored route's node is captured.
    pub(crate) fn capture(
        &self,
        proto: u8,
        commands: &Bytes,
        blocking: bool,
        sole: Option<&'static CommandSpec>,
        node: u16,
    ) -> Option<Box<Capture>> {
        let mirror = self.current.load_full()?;
        if sole.is_some_and(|spec| !plan::concerns(spec, mirror.compares))
            || mirror.only.is_some_and(|only| only != node)
        {
            return None;
        }
        if !blocking {
            mirror.outstanding.fetch_add(1, Ordering::SeqCst);
        }
        Some(Box::new(Capture {
            mirror,
            counted: !blocking,
            proto,
            commands: commands.clone(),
        }))
    }

    /// With routes, the one router node whose writes the running mirror copies (`None`:
    /// every node's, or no mirror): a fan-out hands over that node's own reply.
    pub(crate) fn only(&self) -> Option<u16> {
        self.current.load().as_ref()?.only
    }

    /// Takes the running mirror out (a cutover, which starts the next one itself).
    fn detach(&self) -> Option<Arc<Mirror>> {
        self.on.store(false, Ordering::Relaxed);
        self.current.swap(None)
    }

    /// Puts back a mirror taken out by [`MirrorSlot::detach`] (a cutover called off).
    fn reattach(&self, mirror: Arc<Mirror>) {
        self.current.store(Some(mirror));
        self.on.store(true, Ordering::Relaxed);
    }

    /// The client `client` is gone.
    pub(crate) fn gone(&self, client: u64) {
        if !self.active() {
            return;
        }
        if let Some(mirror) = self.current.load().as_ref() {
            mirror.queue(Message::Gone(client));
        }
    }

    /// Starts, replaces or stops the mirror as `config` says; a mirror whose settings did
    /// not change keeps running. Returns what changed, for the log (`None`: nothing). Must
    /// run inside the tokio runtime.
    pub fn apply(&self, config: &Config, metrics: &Arc<Metrics>) -> Result<Option<String>, String> {
        let wanted = config.mirror.as_ref();
        let running = self.current.load();
        let same = match (wanted, running.as_ref()) {
            (None, None) => true,
            (Some(w), Some(r)) => w.fingerprint() == r.fingerprint,
            _ => false,
        };
        if same {
            return Ok(None);
        }
        let Some(wanted) = wanted else {
            self.on.store(false, Ordering::Relaxed);
            self.current.store(None);
            metrics.mirror.set_phase("off");
            tracing::info!("mirror stopped: writes go to the primary only");
            return Ok(Some("mirror stopped".into()));
        };
        let mirror = start(config, wanted, metrics)?;
        let summary = mirror.summary.clone();
        self.current.store(Some(Arc::new(mirror)));
        self.on.store(true, Ordering::Relaxed);
        metrics.mirror.set_phase(wanted.phase());
        tracing::info!(mirror = %summary, "mirroring");
        Ok(Some(format!("mirroring to {summary}")))
    }

    /// One line for `/readyz` while a mirror runs: where, the phase, and its counts.
    pub(crate) fn summary(&self, metrics: &Metrics) -> Option<String> {
        let current = self.current.load();
        let mirror = current.as_ref()?;
        let c = Counts::of(metrics);
        Some(format!(
            "mirror {}: {} writes sent, {} dropped, {} errors, {} reads compared, {} divergent",
            mirror.summary, c.sent, c.dropped, c.errors, c.compared, c.divergent,
        ))
    }

    /// `INFO proxy` lines: the phase, the mirror and what it was sent, dropped and found.
    pub(crate) fn info(&self, metrics: &Metrics) -> String {
        let current = self.current.load();
        let target = current.as_ref().map_or("", |c| c.summary.as_str());
        let c = Counts::of(metrics);
        format!(
            "proxy_mirror_phase:{}\r\nproxy_mirror:{target}\r\nproxy_mirror_writes:{}\r\n\
             proxy_mirror_dropped:{}\r\nproxy_mirror_errors:{}\r\n\
             proxy_mirror_compared:{}\r\nproxy_mirror_divergent:{}\r\n",
            metrics.mirror.phase(),
            c.sent,
            c.dropped,
            c.errors,
            c.compared,
            c.divergent,
        )
    }
}

/// What the mirror was sent, dropped and found since the proxy started, as `INFO proxy` and
/// `/readyz` both report it.
struct Counts {
    /// Writes sent to the mirror.
    sent: u64,
    /// Writes dropped, every reason together.
    dropped: u64,
    /// Writes the mirror refused.
    errors: u64,
    /// Reads compared.
    compared: u64,
    /// Compared reads the mirror answered differently.
    divergent: u64,
}

impl Counts {
    fn of(metrics: &Metrics) -> Counts {
        let m = &metrics.mirror;
        Counts {
            sent: m.sent[0].get(),
            dropped: m.dropped.iter().map(|c| c.get()).sum(),
            errors: m.errors.get(),
            compared: m.compared.get(),
            divergent: m.divergent_all.get(),
        }
    }
}

/// Starts a mirror's connections and task.
fn start(config: &Config, wanted: &MirrorConfig, metrics: &Arc<Metrics>) -> Result<Mirror, String> {
    let as_upstream = wanted.as_upstream_of(config);
    // The mirror's connections count in metrics of their own: the primary's connection
    // gauges, which readiness reads, must not include them.
    let own_metrics = Metrics::new(Arc::new(ArcSwap::from_pointee(NoPolicy)));
    let mut settings = PoolSettings::from_config(&as_upstream)?;
    // One connection per RESP version keeps each client's writes in order; the mirror never
    // pins a client, so it keeps no dedicated connections warm.
    settings.connections = 1;
    settings.dedicated.warm = 0;
    settings.coalesce = false;
    let (upstream, follower, name) = match wanted.upstream.mode.value {
        UpstreamMode::Sentinel => {
            let sentinel = wanted
                .upstream
                .sentinel
                .as_ref()
                .ok_or("mirror.upstream.sentinel is missing")?;
            let spec = crate::topology::sentinel::SentinelSpec::of(sentinel);
            let label: Arc<str> = format!("sentinel:{}", spec.master_name).into();
            let (tx, primary) = tokio::sync::watch::channel(None);
            // The mirror follows its primary through failovers as a Sentinel upstream does.
            let follower = tokio::spawn(crate::topology::sentinel::follow_primary(spec, tx));
            let address = Address::Followed {
                primary,
                label: label.clone(),
            };
            let pool = Pool::start_at(address, &settings, own_metrics);
            (
                task::Upstream::Node(pool),
                Some(follower.abort_handle()),
                label.to_string(),
            )
        }
        UpstreamMode::Cluster => {
            let cluster = wanted
                .upstream
                .cluster
                .as_ref()
                .ok_or("mirror.upstream.cluster is missing")?;
            let seeds: Vec<&str> = cluster.seeds.iter().map(|s| s.value.as_str()).collect();
            let mut for_nodes = as_upstream.clone();
            // As for one server: a connection per node and RESP version, none kept warm.
            for_nodes.upstream.connections.value = 1;
            for_nodes.upstream.dedicated_warm.value = 0;
            for_nodes.upstream.coalesce_reads.value = false;
            let upstream = task::Upstream::Cluster(Box::new(for_nodes), own_metrics);
            (upstream, None, format!("cluster:{}", seeds.join(",")))
        }
        _ => {
            let address = wanted.upstream.address.value.as_str();
            let pool = Pool::start_node(address.into(), &settings, own_metrics);
            (task::Upstream::Node(pool), None, address.to_string())
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let lost = Arc::new(Lost::default());
    let compare = wanted.compare.as_ref().map(|c| task::CompareSettings {
        below: c.hundredths(),
        log_per_minute: c.log_per_minute.value,
    });
    let shown = match &wanted.route {
        Some(route) => format!("{name} for route {}", route.value),
        None => name.clone(),
    };
    let summary = match &wanted.compare {
        Some(c) => format!("{shown} (writes, and {} of reads compared)", c.share.value),
        None => format!("{shown} (writes)"),
    };
    tokio::spawn(task::run(task::Running {
        rx,
        queued: queued.clone(),
        lost: lost.clone(),
        upstream,
        metrics: metrics.clone(),
        compare,
        address: name,
    }));
    Ok(Mirror {
        tx,
        queued,
        lost,
        max_queued: usize::try_from(wanted.max_queue_bytes.value).unwrap_or(usize::MAX),
        metrics: metrics.clone(),
        fingerprint: wanted.fingerprint(),
        summary,
        outstanding: AtomicUsize::new(0),
        follower,
        compares: wanted.compare.as_ref().is_some_and(|c| c.hundredths() > 0),
        only: wanted.mirrored_node(config).map(|(node, _)| node),
    })
}
