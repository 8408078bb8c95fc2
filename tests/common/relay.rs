//! A TCP relay between the proxy and Redis that a test can freeze or cut: the network faults
//! a process signal cannot produce, without root or network namespaces.
//!
//! - `freeze()`: no byte moves in either direction, both TCP connections stay open, as when a
//!   link silently drops packets. Bytes the peers send meanwhile wait in their socket buffers
//!   (as TCP would retransmit them) and flow on `heal()`; new connections are accepted but
//!   carry nothing until then.
//! - `cut()`: every relayed connection is closed abortively on both sides (SO_LINGER 0, so
//!   each peer sees a reset), and new connections are reset as soon as they are accepted.
//! - `heal()`: bytes flow and connections are relayed again.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the link currently does; every relayed connection watches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Link {
    /// Bytes may move; false while frozen.
    flowing: bool,
    /// New connections are reset instead of relayed; true from a cut until the heal.
    refusing: bool,
    /// Cuts so far: a connection that sees this change resets both of its sockets.
    cuts: u64,
}

/// Shared between the relay handle, the accept loop and every connection task.
struct Shared {
    /// The Redis address connections are relayed to.
    target: SocketAddr,
    /// The link state, changed by the test and obeyed by every task.
    link: watch::Sender<Link>,
    /// Connections accepted since start, to show the proxy really reconnected.
    accepted: AtomicUsize,
    /// Connections being relayed now.
    live: AtomicUsize,
}

/// The relay, listening on a free loopback port; it stops (and resets what it relays) on drop.
pub(crate) struct Relay {
    /// Where the proxy connects instead of Redis.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    /// The accept loop, aborted on drop so the port closes with the test.
    accept: JoinHandle<()>,
}

impl Relay {
    /// Listens on 127.0.0.1:0 and relays every connection to `target`.
    pub(crate) async fn start(target: &str) -> Relay {
        let target: SocketAddr = target.parse().expect("relay target is an ip:port");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay address");
        let (link, _) = watch::channel(Link {
            flowing: true,
            refusing: false,
            cuts: 0,
        });
        let shared = Arc::new(Shared {
            target,
            link,
            accepted: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Relay {
            addr,
            shared,
            accept,
        }
    }

    /// Stops moving bytes, keeping every connection open.
    pub(crate) fn freeze(&self) {
        self.shared.link.send_modify(|l| l.flowing = false);
    }

    /// Resets every relayed connection on both sides and refuses new ones until `heal`.
    pub(crate) fn cut(&self) {
        self.shared.link.send_modify(|l| {
            l.refusing = true;
            l.cuts += 1;
        });
    }

    /// Moves bytes again and relays new connections.
    pub(crate) fn heal(&self) {
        self.shared.link.send_modify(|l| {
            l.flowing = true;
            l.refusing = false;
        });
    }

    /// Connections accepted since start.
    pub(crate) fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Connections relayed right now.
    pub(crate) fn live(&self) -> usize {
        self.shared.live.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        if shared.link.borrow().refusing {
            reset(client);
            continue;
        }
        tokio::spawn(relay_one(client, shared.clone()));
    }
}

/// Relays one connection until both sides have closed, either fails, or a cut resets it.
async fn relay_one(mut client: TcpStream, shared: Arc<Shared>) {
    let mut link = shared.link.subscribe();
    let cuts = link.borrow_and_update().cuts;
    let Ok(mut server) = TcpStream::connect(shared.target).await else {
        reset(client);
        return;
    };
    server.set_nodelay(true).ok();
    client.set_nodelay(true).ok();
    let _live = LiveGuard::new(&shared.live);
    let (mut client_rd, mut client_wr) = client.split();
    let (mut server_rd, mut server_wr) = server.split();
    let up = pump(&mut client_rd, &mut server_wr, shared.link.subscribe());
    let down = pump(&mut server_rd, &mut client_wr, shared.link.subscribe());
    let cut = tokio::select! {
        _ = async { tokio::try_join!(up, down) } => false,
        _ = link.wait_for(|l| l.cuts != cuts) => true,
    };
    if cut {
        reset(client);
        reset(server);
    }
}

/// Copies `from` to `to` while the link flows, passing a half-close on. Waits for the link
/// before reading as well as before writing, so a frozen link leaves the sender's bytes in
/// the kernel (its writes stall as over a dead link) instead of draining them into the relay.
async fn pump<R, W>(from: &mut R, to: &mut W, mut link: watch::Receiver<Link>) -> io::Result<()>
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        flowing(&mut link).await;
        let n = from.read(&mut buf).await?;
        flowing(&mut link).await;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
    }
}

async fn flowing(link: &mut watch::Receiver<Link>) {
    // The sender lives as long as the relay; if it is gone the test is over anyway.
    let _ = link.wait_for(|l| l.flowing).await;
}

/// Closes `stream` abortively: the peer gets a reset, not an orderly end of stream.
fn reset(stream: TcpStream) {
    stream.set_zero_linger().ok();
    drop(stream);
}

/// Counts a relayed connection for as long as it lives.
struct LiveGuard<'a>(&'a AtomicUsize);

impl<'a> LiveGuard<'a> {
    fn new(live: &'a AtomicUsize) -> Self {
        live.fetch_add(1, Ordering::Relaxed);
        LiveGuard(live)
    }
}

impl Drop for LiveGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
