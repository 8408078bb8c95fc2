//! `CLIENT PAUSE` seen through the proxy. While Redis holds paused commands, each would hold
//! every command queued behind it on its connection: one client's paused write on a shared
//! connection held other clients' reads, and the `CLIENT UNPAUSE` meant to end it. So while a
//! pause the proxy forwarded is in force, the commands Redis pauses go on their client's
//! dedicated connection instead, where they hold only that client, as in Redis. Costs one
//! relaxed atomic load per command when no pause is in force. In cluster mode the pause is
//! sent to every primary (`cluster::gather`, a fan-out) and a held command goes on the
//! client's dedicated connection to its key's node.
//!
//! A pause the proxy did not see (sent to Redis directly, or by a failover) is not known
//! here: commands then wait on the shared connection behind the paused ones until it ends.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use crate::commands::CommandSpec;

/// What the latest forwarded pause holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Paused {
    /// No pause known.
    Nothing = 0,
    /// `CLIENT PAUSE … WRITE`: writes and commands that may replicate.
    Writes = 1,
    /// `CLIENT PAUSE …` (ALL): every command of a normal client.
    All = 2,
}

/// The pause in force, shared by every session.
#[derive(Default)]
pub(crate) struct Pause {
    /// A `Paused` as u8.
    mode: AtomicU8,
    /// Bumped by every PAUSE and UNPAUSE, so the timer of an earlier pause does not end a
    /// later one.
    generation: AtomicU64,
}

impl Pause {
    /// What is paused now.
    pub(super) fn current(&self) -> Paused {
        match self.mode.load(Ordering::Relaxed) {
            1 => Paused::Writes,
            2 => Paused::All,
            _ => Paused::Nothing,
        }
    }

    /// A `CLIENT PAUSE <ms> [WRITE|ALL]` was forwarded: in force until UNPAUSE or `ms` pass.
    /// Set before Redis answered (a pause Redis refused only sends commands the longer way
    /// until the timer ends it).
    pub(super) fn start(self: &std::sync::Arc<Self>, mode: Paused, ms: u64) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.mode.store(mode as u8, Ordering::Relaxed);
        let pause = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if pause.generation.load(Ordering::Relaxed) == generation {
                pause.mode.store(Paused::Nothing as u8, Ordering::Relaxed);
            }
        });
    }

    /// `CLIENT UNPAUSE` was forwarded.
    pub(super) fn end(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.mode.store(Paused::Nothing as u8, Ordering::Relaxed);
    }
}

/// Whether Redis holds `spec` back under `paused` (what `CLIENT PAUSE` documents: writes and
/// commands that may replicate for WRITE, everything but CLIENT for ALL in this proxy's view).
pub(super) fn holds(paused: Paused, spec: Option<&CommandSpec>) -> bool {
    let Some(spec) = spec else {
        return false;
    };
    match paused {
        Paused::Nothing => false,
        Paused::Writes => {
            spec.is_write() || matches!(spec.name, "publish" | "spublish" | "pfcount")
        }
        Paused::All => !spec.name.starts_with("client"),
    }
}
