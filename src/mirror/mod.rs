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

mod compare;
mod plan;
mod task;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;
use tokio::sync::mpsc;

use crate::config::{Config, MirrorConfig};
use crate::metrics::{Metrics, NoPolicy};
use crate::upstream::pool::Pool;

/// What a session tells the mirror.
enum Message {
    /// A batch the primary answered: the commands as sent and the replies as received.
    Answered {
        client: u64,
        proto: u8,
        commands: Bytes,
        replies: Bytes,
    },
    /// The client is gone: forget its database and open transaction.
    Gone(u64),
}

impl Message {
    /// Bytes it holds, against `max_queue_bytes`.
    fn size(&self) -> usize {
        match self {
            Message::Answered {
                commands, replies, ..
            } => commands.len() + replies.len(),
            Message::Gone(_) => 0,
        }
    }
}

/// One running mirror: its queue and what it was started from.
struct Mirror {
    /// The mirror task's queue.
    tx: mpsc::UnboundedSender<Message>,
    /// Bytes queued and not yet taken by the task.
    queued: Arc<AtomicUsize>,
    /// `max_queue_bytes`.
    max_queued: usize,
    /// Where drops are counted.
    metrics: Arc<Metrics>,
    /// The settings it runs with (values only), so a reload that keeps them keeps it.
    fingerprint: String,
    /// The mirror's address and phase, for INFO.
    summary: String,
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
    pub fn active(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// A batch `client` sent in RESP `proto` was answered: `commands` as sent, `replies` as
    /// the primary sent them (fewer when its connection failed). Never waits.
    pub fn answered(&self, client: u64, proto: u8, commands: Bytes, replies: Bytes, count: u32) {
        let current = self.current.load();
        let Some(mirror) = current.as_ref() else {
            return;
        };
        let queued = mirror.queue(Message::Answered {
            client,
            proto,
            commands,
            replies,
        });
        if !queued {
            mirror.metrics.mirror.dropped[0].inc_by(u64::from(count));
        }
    }

    /// The client `client` is gone.
    pub fn gone(&self, client: u64) {
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

    /// `INFO proxy` lines: the phase, the mirror and what it was sent, dropped and found.
    pub fn info(&self, metrics: &Metrics) -> String {
        let m = &metrics.mirror;
        let current = self.current.load();
        let target = current.as_ref().map_or("", |c| c.summary.as_str());
        let dropped: u64 = m.dropped.iter().map(|c| c.get()).sum();
        format!(
            "proxy_mirror_phase:{}\r\nproxy_mirror:{target}\r\nproxy_mirror_writes:{}\r\n\
             proxy_mirror_dropped:{dropped}\r\nproxy_mirror_errors:{}\r\n\
             proxy_mirror_compared:{}\r\nproxy_mirror_divergent:{}\r\n",
            m.phase(),
            m.sent[0].get(),
            m.errors.get(),
            m.compared.get(),
            m.divergent_all.get(),
        )
    }
}

/// Starts a mirror's connections and task.
fn start(config: &Config, wanted: &MirrorConfig, metrics: &Arc<Metrics>) -> Result<Mirror, String> {
    let as_upstream = wanted.as_upstream_of(config);
    // The mirror's connections count in metrics of their own: the primary's connection
    // gauges, which readiness reads, must not include them.
    let own_metrics = Metrics::new(Arc::new(ArcSwap::from_pointee(NoPolicy)));
    let pool = Pool::start(&as_upstream, own_metrics)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let compare = wanted.compare.as_ref().map(|c| task::CompareSettings {
        below: c.hundredths(),
        log_per_minute: c.log_per_minute.value,
    });
    let summary = match &wanted.compare {
        Some(c) => format!(
            "{} (writes, and {} of reads compared)",
            wanted.upstream.address.value, c.share.value
        ),
        None => format!("{} (writes)", wanted.upstream.address.value),
    };
    tokio::spawn(task::run(task::Running {
        rx,
        queued: queued.clone(),
        pool,
        metrics: metrics.clone(),
        compare,
        address: wanted.upstream.address.value.clone(),
    }));
    Ok(Mirror {
        tx,
        queued,
        max_queued: usize::try_from(wanted.max_queue_bytes.value).unwrap_or(usize::MAX),
        metrics: metrics.clone(),
        fingerprint: wanted.fingerprint(),
        summary,
    })
}
