//! The audit writer: one thread that turns queued entries into JSON lines on stdout or in a
//! file rotated by size. A thread rather than a task: a slow disk blocks it, never the
//! runtime that serves clients, and sessions hand it entries through a bounded queue whose
//! `try_send` never waits.
//!
//! The thread wakes every `TICK`, drains the queue and writes once, rather than waiting on
//! the queue: a sleeping receiver costs every sender a futex wake-up and every entry its own
//! `write`, which doubled the proxy's CPU per audited command (docs/performance.md). An entry
//! reaches the file within a tick; `audit.queue` absorbs what arrives meanwhile.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use super::entry::Entry;

/// Where the lines go.
pub(crate) enum Output {
    /// Standard output, for a container's log collector.
    Stdout,
    /// A file, appended to and rotated.
    File {
        /// The current file; rotated ones are `PATH.1` (newest) … `PATH.keep`.
        path: PathBuf,
        /// Size at which the current file is rotated.
        max_bytes: u64,
        /// Rotated files kept.
        keep: u32,
    },
}

/// An open output: the writer and, for a file, how much it holds.
struct Sink {
    /// Buffered, flushed once per drain of the queue (every `TICK` at most).
    out: BufWriter<Box<dyn Write + Send>>,
    /// Bytes in the current file (0 for stdout, which is never rotated).
    size: u64,
}

/// How often the writer drains the queue.
pub(crate) const TICK: Duration = Duration::from_millis(20);

/// Opens `output`: the file is created (mode 0600: keys and users are not for everyone) or
/// appended to. Fails with the path, at start, so a wrong path stops the proxy there.
pub(crate) fn open(output: &Output) -> io::Result<()> {
    open_sink(output).map(|_| ())
}

fn open_sink(output: &Output) -> io::Result<Sink> {
    match output {
        Output::Stdout => Ok(Sink {
            out: BufWriter::new(Box::new(io::stdout())),
            size: 0,
        }),
        Output::File { path, .. } => {
            let file = open_file(path)?;
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            Ok(Sink {
                out: BufWriter::with_capacity(64 * 1024, Box::new(file)),
                size,
            })
        }
    }
}

fn open_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| open_error(path, &e))
}

/// An error opening the audit file at `path`, saying which file and what for (the writer
/// and `--check`'s probe word it the same).
pub(super) fn open_error(path: &Path, e: &io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "cannot open {} to append the audit trail: {e}",
            path.display()
        ),
    )
}

/// Shifts `PATH.(n-1)` to `PATH.n` … and `PATH` to `PATH.1`; the oldest beyond `keep` is
/// overwritten by the rename.
fn rotate(path: &Path, keep: u32) -> io::Result<()> {
    let numbered = |n: u32| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    };
    if keep == 0 {
        return std::fs::remove_file(path);
    }
    for n in (1..keep).rev() {
        let from = numbered(n);
        if from.exists() {
            std::fs::rename(&from, numbered(n + 1))?;
        }
    }
    std::fs::rename(path, numbered(1))
}

/// Writes entries until every sender is gone (the proxy stopped), then flushes. A write that
/// fails is counted in `failed` and warned about once per failure streak; the thread goes on,
/// so a full disk loses entries but never stops the proxy.
pub(crate) fn run(rx: Receiver<Entry>, output: Output, written: Counter, failed: Counter) {
    let mut sink = match open_sink(&output) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("audit trail off: {e}");
            return;
        }
    };
    let mut failing = false;
    let mut line = Vec::with_capacity(512);
    loop {
        // Drain what is queued, flush once, sleep a tick; stop when every sender is gone.
        let entry = match rx.try_recv() {
            Ok(e) => e,
            Err(TryRecvError::Empty) => {
                let _ = sink.out.flush();
                std::thread::sleep(TICK);
                continue;
            }
            Err(TryRecvError::Disconnected) => break,
        };
        line.clear();
        // Serializing plain data into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut line, &entry);
        line.push(b'\n');
        match write_line(&mut sink, &output, &line) {
            Ok(()) => {
                written.inc();
                failing = false;
            }
            Err(e) => {
                failed.inc();
                if !failing {
                    tracing::warn!("audit trail: cannot write an entry: {e}");
                }
                failing = true;
            }
        }
    }
    let _ = sink.out.flush();
}

fn write_line(sink: &mut Sink, output: &Output, line: &[u8]) -> io::Result<()> {
    if let Output::File {
        path,
        max_bytes,
        keep,
    } = output
        && sink.size > 0
        && sink.size + line.len() as u64 > *max_bytes
    {
        sink.out.flush()?;
        rotate(path, *keep)?;
        *sink = open_sink(output)?;
    }
    sink.out.write_all(line)?;
    sink.size += line.len() as u64;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_by_size_keeping_n_files() {
        let dir = std::env::temp_dir().join(format!("rpp-audit-rotate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.jsonl");
        let output = Output::File {
            path: path.clone(),
            max_bytes: 100,
            keep: 2,
        };
        let mut sink = open_sink(&output).unwrap();
        let line = [b'x'; 39];
        for _ in 0..10 {
            write_line(&mut sink, &output, &line).unwrap();
        }
        sink.out.flush().unwrap();
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
        // 2 lines a file: 10 lines make 5 files, of which the current one and 2 are kept.
        assert_eq!(size(&path), Some(78));
        assert_eq!(size(&dir.join("audit.jsonl.1")), Some(78));
        assert_eq!(size(&dir.join("audit.jsonl.2")), Some(78));
        assert_eq!(size(&dir.join("audit.jsonl.3")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
