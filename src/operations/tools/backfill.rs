//! `backfill`: copies the keys one server holds to another, the first step of a migration, so
//! that the new server holds what was written before its writes began (and a comparison of
//! the two means something for old keys too).
//!
//! Per `SCAN` page (COUNT 100): `PTTL` and `DUMP` of each key from the source, pipelined, then
//! `RESTORE key ttl payload` of each on the target, pipelined. A key the target already holds
//! is kept (`BUSYKEY`): once writes reach the target, its value is the newer one; `--replace`
//! overwrites instead. A key gone between `SCAN` and `DUMP` is counted and skipped. At most
//! `--rate` keys a second, so the copy never competes with the application.
//!
//! Resumable: with `--state FILE` the cursor and the counts are written after every page
//! (to a temporary file renamed over the old, so a crash leaves the last whole page), and a
//! run given the same file goes on from there. `SCAN` returns every key present for the
//! whole scan at least once, so a resumed run misses none of them; a key written to the
//! source meanwhile may be copied or not, which the writes sent to the target cover.
//!
//! Limits, said where they matter: one node each side (a cluster is backfilled per primary,
//! into a standalone target or, per node, into the node that owns the slots); the target is
//! reached with the policy file's TLS settings; the TTL copied is the one left when `PTTL`
//! ran, so a copy may outlive its source by the milliseconds between `PTTL` and `RESTORE`;
//! `DUMP` payloads are the source's RDB format, which an older server may refuse (the run
//! stops, naming the error, when the target refuses every key of the first pages).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::node_link::{answer, connect, login_refused, probe};
use super::survey::Failure;
use crate::config::UpstreamMode;
use crate::protocol::resp_value::{self, Value};
use crate::upstream::pool::{Control, PoolSettings};

/// Keys asked for per `SCAN` page (Redis's `COUNT` hint).
const PAGE: &[u8] = b"100";

/// Failed keys (not `BUSYKEY`) after which, with none copied, the run stops: the target
/// refuses this source's payloads (an older RDB format, no memory, no rights) and every
/// further key would fail the same way.
const GIVE_UP_AFTER: u64 = 100;

/// Key names kept as examples of failed keys.
const EXAMPLES: usize = 5;

/// What to copy, where, how fast.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The source node; the policy file's upstream when not given.
    pub from: Option<String>,
    /// The target node.
    pub to: String,
    /// ACL user on the target (`default` when only a password is given).
    pub to_user: Option<String>,
    /// Password on the target.
    pub to_password: Option<String>,
    /// Keys copied per second at most.
    pub rate: u64,
    /// Stop after this many keys read (a trial, or a copy in parts); `--state` goes on.
    pub max_keys: Option<u64>,
    /// Where the progress is kept, to resume.
    pub state: Option<PathBuf>,
    /// Overwrite keys the target already holds.
    pub replace: bool,
    /// Only keys matching this glob (`SCAN MATCH`).
    pub pattern: Option<String>,
}

/// How far a backfill got: written to `--state` after every page, and reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The source node.
    pub(crate) source: String,
    /// The target node.
    pub(crate) target: String,
    /// The `SCAN` cursor to go on from ("0" before the first page).
    pub(crate) cursor: String,
    /// Whether the `SCAN` went round the whole keyspace.
    pub complete: bool,
    /// Keys the `SCAN` named.
    pub(crate) read: u64,
    /// Keys written to the target.
    pub(crate) copied: u64,
    /// Keys the target already held, kept (without `--replace`).
    pub(crate) kept: u64,
    /// Keys gone from the source between `SCAN` and `DUMP` (expired, deleted).
    pub(crate) gone: u64,
    /// Keys the target refused.
    pub failed: u64,
    /// A few refused keys and why (names, never values).
    pub failures: Vec<String>,
}

impl Progress {
    /// The counts in one line.
    pub fn summary(&self) -> String {
        format!(
            "{} → {}: {} keys read, {} copied, {} already on the target and kept, {} gone \
             before they were read, {} refused{}",
            self.source,
            self.target,
            self.read,
            self.copied,
            self.kept,
            self.gone,
            self.failed,
            if self.complete { "; complete" } else { "" }
        )
    }
}

/// Copies the keys, calling `report` with the progress about once a second; returns the
/// final progress (keys the target refused are in it: the caller decides the exit status).
/// Runs in a runtime of its own.
pub fn backfill(
    path: &Path,
    options: &Options,
    mut report: impl FnMut(&Progress),
) -> Result<Progress, Failure> {
    let mut config =
        crate::operations::setup::load(path).map_err(|e| Failure::Config(e.to_string()))?;
    match (&options.from, config.upstream.mode.value) {
        (Some(n), _) => config.set_upstream(n.clone()),
        (None, UpstreamMode::Standalone) => {}
        (None, _) => {
            return Err(Failure::Config(
                "backfill reads one node: give it with --from HOST:PORT (in a cluster, each primary)"
                    .into(),
            ));
        }
    }
    let settings = PoolSettings::from_config(&config).map_err(Failure::Config)?;
    let mut target = settings.clone();
    target.login.addr = options.to.as_str().into();
    target.login.username = options.to_user.clone();
    target.login.password = options.to_password.clone();
    let source = config.upstream.address.value.clone();
    let mut progress = match &options.state {
        Some(file) => resume(file, &source, &options.to)?,
        None => None,
    }
    .unwrap_or_else(|| Progress {
        source: source.clone(),
        target: options.to.clone(),
        cursor: "0".into(),
        ..Progress::default()
    });
    if progress.complete {
        return Ok(progress);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Upstream(format!("cannot start the backfill: {e}")))?;
    runtime.block_on(async {
        probe(&settings.login, |addr, reply| {
            login_refused(addr, reply, &config, "SCAN, PTTL and DUMP")
        })
        .await
        .map_err(Failure::Upstream)?;
        probe(&target.login, |addr, reply| {
            format!(
                "the target {addr} refused the login as user {}: {reply} (--to-user, \
                 --to-password-env; the user needs HELLO and RESTORE)",
                options.to_user.as_deref().unwrap_or("default")
            )
        })
        .await
        .map_err(Failure::Upstream)?;
        let from = connect(&settings, &source)
            .await
            .map_err(Failure::Upstream)?;
        let to = connect(&target, &options.to)
            .await
            .map_err(Failure::Upstream)?;
        copy(&from, &to, options, &mut progress, &mut report).await?;
        Ok(progress)
    })
}

/// The progress a `--state` file holds, if it exists; a file for another pair of nodes is
/// refused (its cursor means nothing elsewhere).
fn resume(file: &Path, source: &str, target: &str) -> Result<Option<Progress>, Failure> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Failure::Config(format!(
                "{}: cannot read the backfill state: {e}",
                file.display()
            )));
        }
    };
    let progress: Progress = serde_json::from_str(&text).map_err(|e| {
        Failure::Config(format!(
            "{}: not a backfill state file: {e} (delete it to start over)",
            file.display()
        ))
    })?;
    if progress.source != source || progress.target != target {
        return Err(Failure::Config(format!(
            "{}: the state of a backfill from {} to {}, not from {source} to {target} (another \
             --state file, or delete it to start over)",
            file.display(),
            progress.source,
            progress.target
        )));
    }
    Ok(Some(progress))
}

/// Writes the progress to `file` whole: a temporary file renamed over it.
fn save(file: &Path, progress: &Progress) -> Result<(), Failure> {
    let tmp = file.with_extension("tmp");
    let json = serde_json::to_string_pretty(progress).unwrap_or_default();
    std::fs::write(&tmp, json + "\n")
        .and_then(|()| std::fs::rename(&tmp, file))
        .map_err(|e| {
            Failure::Config(format!(
                "{}: cannot write the backfill state: {e}",
                file.display()
            ))
        })
}

/// The copy, page by page, from `progress.cursor` on.
async fn copy(
    from: &Control,
    to: &Control,
    options: &Options,
    progress: &mut Progress,
    report: &mut impl FnMut(&Progress),
) -> Result<(), Failure> {
    let started = Instant::now();
    let read_at_start = progress.read;
    let mut last_report = Instant::now();
    let source_failed =
        |e: String| Failure::Upstream(format!("reading {} stopped: {e}", progress.source));
    loop {
        let mut scan: Vec<&[u8]> = vec![b"SCAN", progress.cursor.as_bytes()];
        if let Some(p) = &options.pattern {
            scan.extend([&b"MATCH"[..], p.as_bytes()]);
        }
        scan.extend([&b"COUNT"[..], PAGE]);
        let page = request(from, &scan, "SCAN").await.map_err(source_failed)?;
        let (next, keys) = scan_page(page).map_err(source_failed)?;
        let copied = copy_page(from, to, &keys, options, progress).await?;
        progress.read += keys.len() as u64;
        progress.copied += copied.copied;
        progress.kept += copied.kept;
        progress.gone += copied.gone;
        progress.failed += copied.failed.len() as u64;
        for f in copied.failed {
            if progress.failures.len() < EXAMPLES {
                progress.failures.push(f);
            }
        }
        progress.cursor = next;
        progress.complete = progress.cursor == "0";
        if let Some(file) = &options.state {
            save(file, progress)?;
        }
        if progress.failed >= GIVE_UP_AFTER && progress.copied == 0 && progress.kept == 0 {
            return Err(Failure::Upstream(format!(
                "the target {} refused every key ({} so far), stopped: {}",
                progress.target,
                progress.failed,
                progress.failures.first().map_or("", String::as_str)
            )));
        }
        if progress.complete
            || options
                .max_keys
                .is_some_and(|max| progress.read - read_at_start >= max)
        {
            return Ok(());
        }
        if last_report.elapsed() >= Duration::from_secs(1) {
            report(progress);
            last_report = Instant::now();
        }
        // Stay under the rate: wait until the keys read so far are due.
        let due = Duration::from_secs_f64(
            (progress.read - read_at_start) as f64 / options.rate.max(1) as f64,
        );
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// What one page's keys came to.
#[derive(Debug, Default)]
struct PageOutcome {
    copied: u64,
    kept: u64,
    gone: u64,
    /// `key: error` per refused key.
    failed: Vec<String>,
}

/// Reads each key's TTL and payload from the source, and restores it on the target.
async fn copy_page(
    from: &Control,
    to: &Control,
    keys: &[Bytes],
    options: &Options,
    progress: &Progress,
) -> Result<PageOutcome, Failure> {
    let mut out = PageOutcome::default();
    let reads: Vec<Vec<Bytes>> = keys
        .iter()
        .flat_map(|k| {
            [
                vec![Bytes::from_static(b"PTTL"), k.clone()],
                vec![Bytes::from_static(b"DUMP"), k.clone()],
            ]
        })
        .collect();
    let replies = pipeline(from, reads)
        .await
        .map_err(|e| Failure::Upstream(format!("reading {} stopped: {e}", progress.source)))?;
    let mut restores = Vec::new();
    let mut restored_keys = Vec::new();
    for (key, pair) in keys.iter().zip(replies.chunks(2)) {
        let (pttl, dump) = (&pair[0], &pair[1]);
        let ttl = match pttl {
            Value::Integer(-2) => {
                out.gone += 1;
                continue;
            }
            Value::Integer(ms) if *ms > 0 => *ms,
            Value::Integer(_) => 0,
            Value::Error(e) => {
                return Err(Failure::Upstream(format!(
                    "PTTL was refused by {}: {e} (the source's user needs SCAN, PTTL and DUMP)",
                    progress.source
                )));
            }
            other => {
                return Err(Failure::Upstream(format!(
                    "PTTL answered {other:?} on {}",
                    progress.source
                )));
            }
        };
        let payload = match dump {
            Value::Nil => {
                out.gone += 1;
                continue;
            }
            Value::String(p) => p.clone(),
            Value::Error(e) => {
                return Err(Failure::Upstream(format!(
                    "DUMP was refused by {}: {e} (the source's user needs SCAN, PTTL and DUMP)",
                    progress.source
                )));
            }
            other => {
                return Err(Failure::Upstream(format!(
                    "DUMP answered {other:?} on {}",
                    progress.source
                )));
            }
        };
        let mut restore = vec![
            Bytes::from_static(b"RESTORE"),
            key.clone(),
            Bytes::from(ttl.to_string()),
            payload,
        ];
        if options.replace {
            restore.push(Bytes::from_static(b"REPLACE"));
        }
        restores.push(restore);
        restored_keys.push(key);
    }
    let replies = pipeline(to, restores)
        .await
        .map_err(|e| Failure::Upstream(format!("writing {} stopped: {e}", progress.target)))?;
    for (key, reply) in restored_keys.into_iter().zip(replies) {
        match reply {
            Value::Error(e) if e.starts_with("BUSYKEY") => out.kept += 1,
            Value::Error(e) => out
                .failed
                .push(format!("{}: {e}", String::from_utf8_lossy(key))),
            _ => out.copied += 1,
        }
    }
    Ok(out)
}

/// A `SCAN` reply's next cursor and keys.
fn scan_page(reply: Value) -> Result<(String, Vec<Bytes>), String> {
    let Value::Array(mut parts) = reply else {
        return Err("SCAN answered something other than a cursor and keys".into());
    };
    let keys = match parts.pop() {
        Some(Value::Array(keys)) => keys,
        _ => return Err("SCAN answered an unexpected shape".into()),
    };
    let Some(Value::String(cursor)) = parts.pop() else {
        return Err("SCAN answered an unexpected shape".into());
    };
    let keys = keys
        .into_iter()
        .filter_map(|k| match k {
            Value::String(k) => Some(k),
            _ => None,
        })
        .collect();
    Ok((String::from_utf8_lossy(&cursor).into_owned(), keys))
}

/// One command; an error reply as an error naming it.
async fn request(control: &Control, args: &[&[u8]], name: &str) -> Result<Value, String> {
    let reply = control.request(args).await.map_err(|e| e.to_string())?;
    answer(name, &reply, "")
}

/// Sends `commands` at once (each as its own request on the control connection, so they are
/// pipelined) and returns their decoded replies in order; error replies are values here.
async fn pipeline(control: &Control, commands: Vec<Vec<Bytes>>) -> Result<Vec<Value>, String> {
    let mut tasks = tokio::task::JoinSet::new();
    let n = commands.len();
    for (i, command) in commands.into_iter().enumerate() {
        let control = control.clone();
        tasks.spawn(async move {
            let args: Vec<&[u8]> = command.iter().map(|a| &a[..]).collect();
            let reply = control.request(&args).await.map_err(|e| e.to_string())?;
            let value = resp_value::decode(&reply, 4)
                .map(|(v, _)| v)
                .map_err(|e| format!("unreadable reply: {e}"))?;
            Ok::<_, String>((i, value))
        });
    }
    let mut out = vec![Value::Nil; n];
    while let Some(done) = tasks.join_next().await {
        let (i, value) = done.map_err(|e| e.to_string())??;
        out[i] = value;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_page_gives_its_cursor_and_keys() {
        let (v, _) =
            resp_value::decode(b"*2\r\n$2\r\n17\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n", 4).unwrap();
        let (cursor, keys) = scan_page(v).unwrap();
        assert_eq!(cursor, "17");
        assert_eq!(
            keys,
            vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]
        );
        assert!(scan_page(Value::Nil).is_err());
    }

    #[test]
    fn a_state_file_of_other_nodes_is_refused_and_a_missing_one_starts_over() {
        let dir = std::env::temp_dir().join(format!("rpp-backfill-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("state.json");
        assert_eq!(resume(&file, "a:1", "b:2").unwrap(), None);
        let p = Progress {
            source: "a:1".into(),
            target: "b:2".into(),
            cursor: "42".into(),
            read: 7,
            ..Progress::default()
        };
        save(&file, &p).unwrap();
        assert_eq!(resume(&file, "a:1", "b:2").unwrap(), Some(p));
        let err = resume(&file, "a:1", "c:3").unwrap_err().to_string();
        assert!(err.contains("not from a:1 to c:3"), "{err}");
        std::fs::write(&file, "{").unwrap();
        assert!(resume(&file, "a:1", "b:2").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
