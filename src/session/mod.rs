//! One client connection: read requests, decide where each goes, and write replies in request
//! order.
//!
//! Consecutive commands bound for the same upstream connection are forwarded as one batch: a
//! zero-copy slice of the read buffer, one channel message, one upstream write. Commands the
//! proxy answers itself (HELLO, CLIENT SETNAME, QUIT…) take a slot in the reply order like any
//! other. A session whose state lives on an upstream connection (MULTI, WATCH, subscriptions,
//! SELECT n, AUTH as another user…) gets a dedicated connection; switching between shared and
//! dedicated waits until the other side has answered everything, so commands still run in the
//! order the client sent them.

mod action;
mod audit_draft;
mod audited;
mod batch;
mod client;
mod client_ids;
mod client_kill;
mod client_list;
mod cluster;
mod config_get;
mod conn;
mod context;
mod effect;
mod forward;
mod input;
mod io;
mod limiter_transport;
mod modes;
mod pause;
mod process;
mod proxy_commands;
mod queue;
mod replica_reads;
mod replies;
mod reply_queue;
mod route;
mod routing;
mod run;
mod scatter;
mod spread;
mod state;
mod sub_counts;
mod summon;
mod tenant_quota;

pub(crate) use io::serve;

use client::ClientState;
use conn::ConnState;
pub use context::IDLE_TICK;
pub(crate) use context::{Context, SEQ_WINDOW, Upstreams};
use input::Input;
use reply_queue::ReplyQueue;
use routing::Routing;

use std::sync::Arc;

/// One client connection, in parts with one job each: what the client negotiated
/// (`client`), the upstream connection state it holds (`conn`), the ordered reply stream
/// (`queue`) and the request bytes being read (`input`); mode-specific state (cluster) beside
/// them.
struct Session {
    /// Everything sessions share: pools, router, limits, policy, metrics.
    ctx: Arc<Context>,
    /// What the client negotiated and who it is.
    client: ClientState,
    /// The dedicated upstream connection and the state the client holds on it.
    conn: ConnState,
    /// The reply stream, in request order.
    queue: ReplyQueue,
    /// Request bytes read and not yet dispatched, and whether to read more.
    input: Input,
    /// The upstream mode and what only that mode keeps per session.
    routing: Routing,
    /// This client's row in `CLIENT LIST`, removed when the session ends; its shared part
    /// takes the last command and carries other sessions' requests (KILL, REDIRECT).
    listed: client_list::Listed,
    /// Audited and sampled commands waiting for their replies (`audited`); boxed, made on
    /// the first.
    audit_trail: Option<Box<crate::observe::audit::Trail>>,
}

#[cfg(test)]
mod size_tests {
    use super::action::Action;
    use super::{Context, Session, Upstreams, serve};
    use crate::policy::Policy;
    use crate::protocol::codec::CodecLimits;
    use crate::upstream::pool::Pool;
    use arc_swap::ArcSwap;
    use std::sync::Arc;

    /// Idle clients cost what their task holds: keep the session future small.
    #[tokio::test]
    async fn session_future_size() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let config = crate::Config::default();
        let policy = Arc::new(ArcSwap::from_pointee(Policy::default()));
        let ops = crate::operations::ops::Ops::new(&config, policy.clone(), None);
        let ctx = Arc::new(Context {
            pool: Pool::start(&config, ops.metrics.clone()).unwrap(),
            upstreams: Upstreams::Standalone,
            codec: CodecLimits::default(),
            max_inflight: 16,
            max_query_buffer: 1 << 20,
            upstream_user: None,
            upstream_password: None,
            scripts_dedicated: true,
            client_ids: Default::default(),
            client_list: Default::default(),
            tenant_quota: Default::default(),
            dedicated_caps: (
                10_000,
                Default::default(),
                std::time::Duration::from_secs(1),
            ),
            pause: Default::default(),
            stopping: Default::default(),
            idle_tick: Default::default(),
            policy,
            ops,
        });
        let stream = crate::listen::ClientStream::plain(client);
        // What every read boxes (`io`): processing the read buffer. The send path builds no
        // future unless a queue is full, and commands that wait are boxed apart, so it stays
        // within glibc's per-thread cache of small blocks (up to 1,032 bytes): measured 2,648
        // bytes in release before, whose allocation, copy and free took about 800 of the
        // ~9,700 instructions of an unpipelined request.
        let mut session = Session::new(&stream, ctx.clone(), 2);
        let process = std::mem::size_of_val(&session.process());
        assert!(process <= 512, "{process}");
        drop(session);
        let fut = serve(stream, ctx, 1, ());
        // Measured 896 bytes in debug (release 920 with the server's 24-byte seat): `serve` is
        // an `async move` block holding its arguments once, a reply is placed without an
        // inline future (`on_message`), and the session keeps neither its local address nor
        // unboxed names (1024 before; 1168 before the session was in parts; 2216 before
        // processing a read was boxed per read; rare large futures, such as a dedicated
        // connect, the HELLO wait or a full upstream queue, are boxed too). In release the
        // client's whole task is then 1,024 bytes, eight of tokio's 128-byte-aligned blocks
        // (eleven before). What an idle client costs in all is pinned by tests/idle_memory.rs.
        assert!(
            std::mem::size_of_val(&fut) <= 920,
            "{}",
            std::mem::size_of_val(&fut)
        );
        // Moved several times per command (decided, joined, placed): past 128 bytes each move
        // is a `memcpy` call (160 bytes with a rewrite inline: ~90 instructions a command;
        // 80 with it boxed).
        let action = std::mem::size_of::<Action>();
        assert!(action <= 80, "{action}");
        // A session's reply channel holds one of these per batch in flight.
        assert!(std::mem::size_of::<crate::upstream::Reply>() <= 48);
        // Every batch's reply slot is moved into the reply order and out of it, and in cluster
        // mode each segment of a scattered batch is one (192 and 160 bytes before the rare
        // parts were boxed: `reply_queue::Unusual`).
        let slot = std::mem::size_of::<super::reply_queue::Slot>();
        assert!(slot <= 112, "{slot}");
        let handling = std::mem::size_of::<super::reply_queue::Handling>();
        assert!(handling <= 80, "{handling}");
    }
}
