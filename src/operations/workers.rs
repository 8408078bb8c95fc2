//! Per-core workers: `workers: N` (N > 1) runs N current-thread tokio runtimes, one OS thread
//! each, instead of one multi-threaded runtime.
//!
//! Why: tokio's multi-threaded scheduler cost 26–27% more CPU per request than one
//! current-thread runtime on the same load, and one of its two workers did three quarters of
//! the work (docs/performance.md, "Scaling past one core"): a session's reply is delivered by
//! its upstream connection's task, which often ran on the other thread, and the worker that
//! polls the I/O driver queues every task it wakes on itself. Here nothing on a request's path
//! crosses threads: each worker runs the sessions placed on it *and* its own share of every
//! node's shared upstream connections (the pool asks [`spawn_lane`] where to run connection
//! `j`, and a session on worker `w` only uses the connections on `w`, see [`lane`]). Only the
//! policy's shared state (atomics, sharded maps) and the rarer dedicated connections are
//! shared between threads.
//!
//! Placement: the main thread accepts and gives each connection to the worker with the
//! fewest sessions ([`place`]). The alternative, one `SO_REUSEPORT` listener per worker,
//! leaves the spread to the kernel's hash of the client's address and port, which is uneven
//! at the connection counts a proxy sees (measured in docs/performance.md, "Accept models");
//! counting costs one atomic increment per connection, none per command.
//!
//! With `workers: 1` (the default) nothing here is installed: the proxy is one current-thread
//! runtime on the main thread, as before, and [`lane`] keeps the pool's old choice.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The running workers, installed once by the binary before the upstream starts.
static INSTALLED: OnceLock<Workers> = OnceLock::new();

thread_local! {
    /// The index of the worker this thread runs, on a worker thread; `usize::MAX` elsewhere
    /// (the main thread: acceptor, admin endpoint, background checks).
    static CURRENT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The workers' runtimes and how many sessions each runs now.
struct Workers {
    /// One runtime handle per worker: where its sessions and connections are spawned.
    handles: Vec<Handle>,
    /// Sessions running on each worker now (same indexing), for [`place`].
    sessions: Vec<Arc<AtomicUsize>>,
}

/// The worker threads of a running proxy; dropping it stops them (their runtimes are shut
/// down in the background: sessions left after the shutdown grace are dropped).
pub struct Running {
    /// One stop signal per worker thread.
    stops: Vec<oneshot::Sender<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}

/// Starts `count` worker threads (`rpp-worker-0`…), each a current-thread runtime, and
/// installs them for [`place`], [`spawn_lane`] and [`lane`]. Called once, by the binary,
/// before anything is spawned on them.
pub fn start(count: usize) -> std::io::Result<Running> {
    let mut handles = Vec::with_capacity(count);
    let mut stops = Vec::with_capacity(count);
    for index in 0..count {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        handles.push(runtime.handle().clone());
        let (stop, stopped) = oneshot::channel::<()>();
        stops.push(stop);
        std::thread::Builder::new()
            .name(format!("rpp-worker-{index}"))
            .spawn(move || {
                CURRENT.with(|c| c.set(index));
                // A current-thread runtime runs its spawned tasks only while its thread
                // blocks on it: this thread does nothing else until told to stop.
                let _ = runtime.block_on(stopped);
                runtime.shutdown_background();
            })?;
    }
    let workers = Workers {
        sessions: (0..count).map(|_| Arc::new(AtomicUsize::new(0))).collect(),
        handles,
    };
    INSTALLED
        .set(workers)
        .map_err(|_| std::io::Error::other("workers started twice"))?;
    Ok(Running { stops })
}

/// How many workers share the shared upstream connections: each pool opens its
/// `upstream.connections` once per worker. 1 when none are installed.
pub(crate) fn count() -> usize {
    INSTALLED.get().map_or(1, |w| w.handles.len())
}

/// Spawns the task of shared connection `index` of a pool on worker `index % count()`, the
/// worker whose sessions [`lane`] sends to it; on the current runtime when none are installed.
pub(crate) fn spawn_lane<F>(index: usize, task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match INSTALLED.get() {
        Some(w) => drop(w.handles[index % w.handles.len()].spawn(task)),
        None => drop(tokio::spawn(task)),
    }
}

/// Which of a pool's `total` shared connections (per RESP version) a client uses: always the
/// same one (its commands run in the order it sent them), and on a worker one of those that
/// [`spawn_lane`] placed on that worker, so a request and its reply never cross threads.
pub(crate) fn lane(client_id: u64, total: usize) -> usize {
    let worker = CURRENT.with(Cell::get);
    let workers = count();
    if worker < workers && total % workers == 0 {
        let per_worker = total / workers;
        worker + workers * (client_id % per_worker as u64) as usize
    } else {
        (client_id % total as u64) as usize
    }
}

/// Runs a client's session on the worker with the fewest sessions, or on the current runtime
/// when no workers are installed. `serve` gets the client's socket registered with the
/// worker's own I/O driver (a socket stays with the driver that registered it, so one
/// registered on the acceptor's would wake the acceptor's thread on every read).
pub(crate) fn place<S, F>(stream: tokio::net::TcpStream, serve: S)
where
    S: FnOnce(tokio::net::TcpStream) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let Some(w) = INSTALLED.get() else {
        tokio::spawn(serve(stream));
        return;
    };
    let (index, load) = w
        .sessions
        .iter()
        .enumerate()
        .min_by_key(|(_, n)| n.load(Ordering::Relaxed))
        .map(|(i, n)| (i, n.clone()))
        .unwrap_or_else(|| (0, w.sessions[0].clone()));
    let stream = match stream.into_std() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "client socket could not move to a worker");
            return;
        }
    };
    load.fetch_add(1, Ordering::Relaxed);
    w.handles[index].spawn(async move {
        // Uncounted when the session ends, however it ends (a panic included).
        let _seated = Seated(load);
        match tokio::net::TcpStream::from_std(stream) {
            Ok(stream) => serve(stream).await,
            Err(e) => tracing::warn!(error = %e, "client socket could not join its worker"),
        }
    });
}

/// A session's place in its worker's count, given back on drop.
struct Seated(Arc<AtomicUsize>);

impl Drop for Seated {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Sessions running on each worker now (empty without workers), for
/// `rpp_worker_sessions{worker}`.
pub(crate) fn sessions() -> Vec<usize> {
    INSTALLED.get().map_or_else(Vec::new, |w| {
        w.sessions
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_workers_a_client_keeps_the_pools_old_choice() {
        // Not installed in unit tests: the lane is the client id modulo the connections.
        assert_eq!(lane(7, 3), 1);
        assert_eq!(lane(8, 1), 0);
        assert_eq!(count(), 1);
    }
}
