//! The cutover: a reload that changes the standalone `upstream.address` switches the proxy to
//! the new server without a restart, and in an order that loses no acknowledged write and
//! applies none twice (docs/migration.md, "Switching"):
//!
//! 1. The gate closes ([`Gate`]): new batches wait; clients see a pause, not an error.
//! 2. Every shared connection answers a PING queued behind what was sent before
//!    ([`Pool::barrier`]): the old server has answered everything.
//! 3. The old mirror (usually the new server) has been handed every answered batch and has
//!    replied to all of them ([`super::Mirror::settle`]): the new server holds every write
//!    the old one acknowledged.
//! 4. The pool's address moves: its connections reconnect to the new server (dedicated ones
//!    close, as in a Sentinel failover; a client in a transaction or subscribed starts over).
//! 5. The next mirror starts (usually the old server, to keep it in step for a way back).
//! 6. The gate opens.
//!
//! When step 1, 2 or 3 does not finish in time (the old server or the mirror is down), the
//! switch is called off: the gate opens, the proxy stays on the old server with its mirror,
//! and the log says why. A later reload tries again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::MirrorSlot;
use crate::config::Config;
use crate::observe::metrics::Metrics;
use crate::upstream::address::AddrEpoch;
use crate::upstream::gate::Gate;
use crate::upstream::pool::Pool;

/// How long each step of a switch may take before it is called off.
const STEP_LIMIT: Duration = Duration::from_secs(10);

/// What a switch needs, kept from start.
#[derive(Default)]
pub struct Cutover {
    /// Every batch passes it before its queue (`session::forward`).
    pub(crate) gate: Gate,
    /// The standalone upstream's pool and what moves its address; unset in other modes,
    /// where `upstream.address` still needs a restart.
    movable: OnceLock<(Arc<Pool>, watch::Sender<Option<AddrEpoch>>)>,
    /// A switch runs: a reload meanwhile changes the policy only.
    running: AtomicBool,
    /// The latest switch's outcome, for INFO.
    last: Mutex<String>,
}

impl Cutover {
    /// Makes the standalone pool switchable, unless its address came from the command line
    /// (`--upstream`): the file's address is then not the one in use, and a reload of the
    /// file never moves it.
    pub(crate) fn install(
        &self,
        config: &Config,
        pool: Arc<Pool>,
        mover: watch::Sender<Option<AddrEpoch>>,
    ) {
        if config.overridden.contains(&"upstream.address") {
            return;
        }
        let _ = self.movable.set((pool, mover));
    }

    /// The address the standalone upstream is at now; `None` in other modes.
    pub(crate) fn address(&self) -> Option<Arc<str>> {
        let (_, mover) = self.movable.get()?;
        mover.borrow().as_ref().map(|a| a.addr.clone())
    }

    /// Whether a switch runs now.
    pub fn busy(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    /// Whether `config` asks for a switch: a standalone upstream (without routes) at another
    /// address than the one in use.
    pub fn wanted_by(&self, config: &Config) -> bool {
        config.upstream.mode.value == crate::config::UpstreamMode::Standalone
            && !config.has_routes()
            && self
                .address()
                .is_some_and(|now| *now != *config.upstream.address.value)
    }

    /// The latest switch's outcome (empty before the first).
    pub(crate) fn last(&self) -> String {
        self.last.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Starts switching to `config`'s `upstream.address` (and its mirror) and returns at
    /// once with what the reload reports; the switch goes on in its own task. Must run
    /// inside the tokio runtime.
    pub fn start(
        self: &Arc<Self>,
        config: Config,
        mirror: Arc<MirrorSlot>,
        metrics: Arc<Metrics>,
    ) -> Result<String, String> {
        let Some(from) = self.address() else {
            return Err("only a standalone upstream can be switched by reload".into());
        };
        let to = config.upstream.address.value.clone();
        if self.running.swap(true, Ordering::SeqCst) {
            return Err(format!(
                "a switch of the upstream is running; the switch to {to} was not started \
                 (reload again once it is done)"
            ));
        }
        let cutover = self.clone();
        let reply = format!("switching the upstream from {from} to {to}");
        tokio::spawn(async move {
            let outcome = cutover.switch(&from, &config, &mirror, &metrics).await;
            if let Ok(mut last) = cutover.last.lock() {
                *last = outcome;
            }
            cutover.running.store(false, Ordering::SeqCst);
        });
        Ok(reply)
    }

    /// The switch itself; returns its outcome in one line.
    async fn switch(
        &self,
        from: &str,
        config: &Config,
        mirror: &MirrorSlot,
        metrics: &Arc<Metrics>,
    ) -> String {
        let Some((pool, mover)) = self.movable.get() else {
            return "no switchable upstream".into();
        };
        let to = config.upstream.address.value.as_str();
        let started = Instant::now();
        tracing::info!(
            from,
            to,
            "cutover: holding new commands until the old server has answered the rest"
        );
        let called_off = |why: &str| {
            self.gate.open();
            let line = format!("switch from {from} to {to} called off: {why}; still on {from}");
            tracing::error!(
                from,
                to,
                "cutover called off: {why}; the proxy stays on the old server"
            );
            line
        };
        if !self.gate.close(STEP_LIMIT).await {
            return called_off("commands being queued did not finish");
        }
        if !pool.barrier(STEP_LIMIT).await {
            return called_off("the old server did not answer what was sent to it");
        }
        if let Some(old) = mirror.detach() {
            if !super::Mirror::settle(old.clone(), STEP_LIMIT).await {
                mirror.reattach(old);
                return called_off("the mirror did not confirm every write sent to it");
            }
            let dropped: u64 = metrics.mirror.dropped.iter().map(|c| c.get()).sum();
            if dropped > 0 {
                tracing::warn!(
                    dropped,
                    "cutover: the mirror missed {dropped} writes while mirroring (rpp_mirror_dropped_total); keys they wrote may differ on the new server"
                );
            }
        }
        let epoch = mover.borrow().as_ref().map_or(0, |a| a.epoch) + 1;
        mover.send_replace(Some(AddrEpoch {
            addr: to.into(),
            epoch,
        }));
        let next_mirror = mirror.apply(config, metrics);
        self.gate.open();
        let held = started.elapsed();
        if let Err(e) = next_mirror {
            tracing::error!(error = %e, "cutover: the next mirror could not start; the proxy runs without one");
        }
        tracing::info!(
            from,
            to,
            held_ms = held.as_millis() as u64,
            "cutover: switched; new commands go to the new server"
        );
        // The new server's version and commands judge the next commands.
        crate::upstream::server_probe::first(&pool.control(), metrics, STEP_LIMIT).await;
        format!(
            "switched from {from} to {to} (commands held {} ms)",
            held.as_millis()
        )
    }
}
