//! The audit trail of a running proxy: what to record, the queue to the writer thread, and
//! the output file opened (and probed by `--check`) before serving.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};

use prometheus_client::metrics::counter::Counter;

use crate::commands::{AclCategories, CommandSpec};
use crate::config::{AuditCommands, AuditConfig, AuditKeys, Problem};
use crate::observe::metrics::Metrics;

use super::entry::{self, Arg, Entry};
use super::writer;

/// The audit trail of a running proxy: what to record, and the queue to the writer.
pub(crate) struct Audit {
    /// Which commands are recorded (never `Off`: then there is no `Audit`).
    commands: AuditCommands,
    /// With `All`, one read in this many is recorded.
    read_sample: u64,
    /// Reads seen, for the 1-in-N sample: one counter for the whole proxy, so the sample is
    /// of the traffic, not of each connection.
    reads: AtomicU64,
    /// Only these tenants' commands (empty: all); compared by name, so a reload that
    /// renumbers tenants keeps the filter right.
    tenants: Vec<String>,
    /// Key names are replaced by their hashes.
    hash_keys: bool,
    /// To the writer thread; bounded (`audit.queue`).
    tx: SyncSender<Entry>,
    /// Entries dropped because the queue was full (`rpp_audit_entries_total{result="dropped"}`).
    dropped: Counter,
}

impl Audit {
    /// Starts the writer thread for `config`, or `None` when the audit trail is off. Fails,
    /// naming the file, when the output file cannot be opened: better at start than silently
    /// without the trail an operator asked for.
    pub(crate) fn start(
        config: &AuditConfig,
        metrics: &Metrics,
    ) -> std::io::Result<Option<Arc<Audit>>> {
        if config.commands.value == AuditCommands::Off {
            return Ok(None);
        }
        let output = output_of(config);
        writer::open(&output)
            .map_err(|e| std::io::Error::new(e.kind(), output_problem(config, &e).to_string()))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(config.queue.value);
        let (written, failed) = (metrics.audit_written.clone(), metrics.audit_failed.clone());
        std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || writer::run(rx, output, written, failed))?;
        Ok(Some(Arc::new(Audit {
            commands: config.commands.value,
            read_sample: config.read_sample.value.max(1),
            reads: AtomicU64::new(0),
            tenants: config.tenants.clone(),
            hash_keys: config.keys.value == AuditKeys::Hash,
            tx,
            dropped: metrics.audit_dropped.clone(),
        })))
    }

    /// Whether a command of `spec` (`None`: unknown to the table) from `tenant` is recorded.
    /// Cheap: flags and, for sampled reads, one relaxed atomic add.
    pub(crate) fn wants(&self, spec: Option<&CommandSpec>, tenant: &str) -> bool {
        if !self.tenants.is_empty() && !self.tenants.iter().any(|t| t == tenant) {
            return false;
        }
        let write = spec.is_some_and(CommandSpec::is_write);
        let admin = spec.is_some_and(|s| s.is_admin() || s.in_categories(AclCategories::DANGEROUS));
        match self.commands {
            AuditCommands::Off => false,
            AuditCommands::Writes => write,
            AuditCommands::Admin => admin,
            AuditCommands::All if write || admin => true,
            AuditCommands::All => {
                self.read_sample == 1
                    || self.reads.fetch_add(1, Ordering::Relaxed) % self.read_sample == 0
            }
        }
    }

    /// The name and arguments of an entry for the command line `args` (the name at index 0):
    /// the arguments at `keys` (see [`key_indices`]) by name or hash, everything else by size.
    pub(crate) fn describe(
        &self,
        spec: Option<&CommandSpec>,
        args: &[&[u8]],
        keys: &[usize],
    ) -> (String, Vec<Arg>) {
        let upper = |a: &[u8]| String::from_utf8_lossy(a).to_ascii_uppercase();
        let (cmd, name_words) = match (spec.and_then(CommandSpec::subcommand_name), args) {
            (Some(_), [name, sub, ..]) => (format!("{} {}", upper(name), upper(sub)), 2),
            (_, [name, ..]) => (upper(name), 1),
            (_, []) => (String::new(), 0),
        };
        let described = args
            .iter()
            .enumerate()
            .skip(name_words)
            .take(entry::MAX_ARGS)
            .map(|(i, a)| match (keys.contains(&i), self.hash_keys) {
                (true, false) => Arg::Key(String::from_utf8_lossy(a).into_owned()),
                (true, true) => Arg::Key(entry::key_hash(a)),
                (false, _) => Arg::Size(a.len() as u64),
            })
            .collect();
        (cmd, described)
    }

    /// Hands `entry` to the writer; dropped and counted when the queue is full.
    pub(crate) fn record(&self, entry: Entry) {
        // Disconnected: the writer could not open its output (logged once, at start).
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(entry)
        {
            self.dropped.inc();
        }
    }
}

/// Where `config` sends the trail.
fn output_of(config: &AuditConfig) -> writer::Output {
    match config.output.value.as_str() {
        "stdout" | "-" => writer::Output::Stdout,
        path => writer::Output::File {
            path: PathBuf::from(path),
            max_bytes: config.max_file_bytes.value,
            keep: config.max_files.value,
        },
    }
}

/// The audit file of `config` (none when the trail is off or goes to stdout).
fn output_file(config: &AuditConfig) -> Option<&std::path::Path> {
    match (config.commands.value, config.output.value.as_str()) {
        (AuditCommands::Off, _) | (_, "stdout" | "-") => None,
        (_, path) => Some(std::path::Path::new(path)),
    }
}

/// Opens (creating it, as the writer will) the audit file `config` names, before the proxy
/// starts: a file that cannot be opened is a configuration problem with its line, field and
/// the system's reason, found before anything is served or logged as started, not an exit
/// after it (which a supervisor would restart in a loop).
pub(crate) fn open_output(config: &AuditConfig) -> Result<(), Problem> {
    if output_file(config).is_none() {
        return Ok(());
    }
    writer::open(&output_of(config)).map_err(|e| output_problem(config, &e))
}

/// What `--check` finds about the audit file `config` names, without leaving anything
/// behind: an existing file is opened for appending, a missing one created and removed
/// again. `None` when the trail is off, goes to stdout, or the file can be opened by the
/// user running the check (who may not be the proxy's: a warning, not a verdict).
pub(crate) fn probe_output(config: &AuditConfig) -> Option<Problem> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = output_file(config)?;
    let opened = if path.exists() {
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map(drop)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|_| std::fs::remove_file(path))
    };
    match opened {
        Ok(()) => None,
        // Created meanwhile by someone else (the proxy itself): it exists, which is fine.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
        Err(e) => Some(output_problem(config, &writer::open_error(path, &e))),
    }
}

/// `error` (from opening the audit file) as a problem of `audit.output`, with what usually
/// causes it.
fn output_problem(config: &AuditConfig, error: &std::io::Error) -> Problem {
    use std::io::ErrorKind;
    let path = std::path::Path::new(&config.output.value);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.display().to_string(),
        _ => ".".to_string(),
    };
    let hint = match error.kind() {
        ErrorKind::NotFound => format!(
            "; the directory {dir} does not exist: create it, writable by the proxy's user \
             (the systemd unit in deploy/systemd has LogsDirectory= create \
             /var/log/redis-policy-proxy)"
        ),
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => format!(
            "; the proxy's user cannot write in {dir} (under the systemd unit in \
             deploy/systemd, ProtectSystem=strict leaves only its LogsDirectory=, \
             /var/log/redis-policy-proxy, writable)"
        ),
        ErrorKind::NotADirectory => format!("; {dir} is not a directory"),
        ErrorKind::IsADirectory => "; it is a directory: name a file in it".to_string(),
        _ => String::new(),
    };
    Problem {
        line: config.output.referenced.line(),
        field: "audit.output".to_string(),
        message: format!("{error}{hint}"),
    }
}

/// The positions of the key arguments of `args` (the name at 0), as Redis's COMMAND GETKEYS
/// finds them with the command table; empty for keyless or unknown commands. Found once per
/// command for both the audit entry and the keyspace statistics.
pub(crate) fn key_indices(spec: Option<&CommandSpec>, args: &[&[u8]]) -> Vec<usize> {
    match spec {
        Some(s) if s.may_have_keys() => crate::commands::keys(args)
            .map(|k| k.indices().collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Seconds since the Unix epoch with microseconds, as MONITOR prints them.
pub(crate) fn now_ts() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_micros() as f64 / 1e6)
}

#[cfg(test)]
pub(in crate::observe::audit) mod tests {
    use super::*;
    use crate::observe::audit::Outcome;

    /// An audit of `commands` whose queue holds `queue` entries, and the writer's end.
    pub(in crate::observe::audit) fn audit(
        commands: AuditCommands,
        queue: usize,
    ) -> (Audit, std::sync::mpsc::Receiver<Entry>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(queue);
        let audit = Audit {
            commands,
            read_sample: 1,
            reads: AtomicU64::new(0),
            tenants: vec![],
            hash_keys: false,
            tx,
            dropped: Counter::default(),
        };
        (audit, rx)
    }

    /// A forwarded SET from 127.0.0.1:1 as connection `id`: the fixture of the audit tests.
    pub(in crate::observe::audit) fn entry_of(id: u64) -> Entry {
        Entry {
            ts: 0.0,
            client: std::net::SocketAddr::from(([127, 0, 0, 1], 1)),
            id,
            user: None,
            tenant: "default".into(),
            route: "shared".into(),
            cmd: "SET".into(),
            args: vec![],
            argc: 1,
            outcome: Outcome::Forwarded,
            rule: None,
            latency_us: None,
        }
    }

    fn entry() -> Entry {
        entry_of(1)
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let (audit, rx) = audit(AuditCommands::Writes, 1);
        audit.record(entry());
        audit.record(entry());
        audit.record(entry());
        assert_eq!(audit.dropped.get(), 2);
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn picks_commands_by_category_and_tenant() {
        let set = crate::commands::lookup(b"SET", None);
        let get = crate::commands::lookup(b"GET", None);
        let flushall = crate::commands::lookup(b"FLUSHALL", None);
        let config_set = crate::commands::lookup(b"CONFIG", Some(b"SET"));
        let (writes, _rx) = audit(AuditCommands::Writes, 1);
        assert!(writes.wants(set, "default"));
        assert!(!writes.wants(get, "default"));
        let (admin, _rx) = audit(AuditCommands::Admin, 1);
        assert!(admin.wants(config_set, "default"));
        assert!(admin.wants(flushall, "default"));
        assert!(!admin.wants(set, "default"));
        let (mut all, _rx) = audit(AuditCommands::All, 1);
        assert!(all.wants(get, "default") && all.wants(None, "default"));
        all.tenants = vec!["billing".into()];
        assert!(!all.wants(set, "default"));
        assert!(all.wants(set, "billing"));
    }

    #[test]
    fn describes_keys_at_their_positions_and_the_rest_by_size() {
        let (audit, _rx) = audit(AuditCommands::All, 1);
        let args: [&[u8]; 5] = [b"EVAL", b"return 1", b"1", b"k", b"argv"];
        let spec = crate::commands::lookup_args(&args);
        let (cmd, described) = audit.describe(spec, &args, &key_indices(spec, &args));
        assert_eq!(cmd, "EVAL");
        assert_eq!(
            described,
            vec![
                Arg::Size(8),
                Arg::Size(1),
                Arg::Key("k".into()),
                Arg::Size(4)
            ]
        );
        let args: [&[u8]; 3] = [b"client", b"kill", b"ID"];
        let spec = crate::commands::lookup_args(&args);
        let (cmd, described) = audit.describe(spec, &args, &key_indices(spec, &args));
        assert_eq!(
            (cmd.as_str(), described),
            ("CLIENT KILL", vec![Arg::Size(2)])
        );
    }
}
