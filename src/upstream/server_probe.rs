//! Reads the upstream server's name, version and commands ([`crate::commands::server_facts`]) before
//! clients are served and whenever the server changes, through the pool's control
//! connection, into `Metrics::upstream_server` and the command model.

use std::sync::Arc;
use std::time::Duration;

use super::pool::Control;
use crate::commands::learned;
use crate::commands::server_facts::parse_info;
use crate::observe::metrics::Metrics;
use crate::protocol::resp_value::{Value, decode};

/// How deep a `COMMAND` reply nests: commands, a command, its key specs, a key spec, its
/// `begin_search`, that one's `spec`; subcommands add two levels.
const COMMAND_REPLY_DEPTH: usize = 10;

/// How often the server's `run_id` is compared with the one learned from.
const RECHECK: Duration = Duration::from_secs(5);

/// Reads the server's facts now and whenever its `run_id` changes; stores them in
/// `metrics.upstream_server`. Runs until aborted.
pub(crate) async fn watch(control: Control, metrics: Arc<Metrics>) {
    let mut tick = tokio::time::interval(RECHECK);
    // The last error logged, so a server that stays down is not logged every tick.
    let mut last_error: Option<String> = None;
    loop {
        tick.tick().await;
        if let Err(e) = read(&control, &metrics).await {
            if last_error.as_deref() != Some(e.as_str()) {
                tracing::warn!(error = %e, "could not read the upstream server's version and commands");
                last_error = Some(e);
            }
        } else {
            last_error = None;
        }
    }
}

/// The first [`read`], before clients are served, so the first commands are judged with the
/// server's table; bounded by `within` (an upstream that is down is read later by [`watch`]).
pub(crate) async fn first(control: &Control, metrics: &Arc<Metrics>, within: Duration) {
    let _ = tokio::time::timeout(within, read(control, metrics)).await;
}

/// Reads `INFO server`, and `COMMAND` when the server is new (a `run_id` not read before).
async fn read(control: &Control, metrics: &Arc<Metrics>) -> Result<(), String> {
    let slot = &metrics.upstream_server;
    let info = control
        .request(&[b"INFO", b"server"])
        .await
        .map_err(|e| e.to_string())?;
    let mut facts = parse_info(&info).ok_or("INFO server gave no version")?;
    if slot
        .load()
        .as_ref()
        .is_some_and(|old| old.run_id == facts.run_id)
    {
        return Ok(());
    }
    let reply = control
        .request(&[b"COMMAND"])
        .await
        .map_err(|e| e.to_string())?;
    match decode(&reply, COMMAND_REPLY_DEPTH) {
        Ok((Value::Error(e), _)) => facts.learned.unreadable.push(format!("COMMAND: {e}")),
        Ok((value, _)) => facts.learned = learned::learn(&value),
        Err(e) => facts.learned.unreadable.push(format!("COMMAND: {e}")),
    }
    match facts.refusal() {
        Some(why) => tracing::error!("{why}"),
        None => tracing::info!(server = %facts.label(), "{}", facts.summary()),
    }
    slot.store(Some(Arc::new(facts)));
    Ok(())
}
