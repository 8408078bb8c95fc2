//! Opening an upstream connection: TCP connect, `HELLO <version> [AUTH …]`, all within the
//! connect timeout so an unreachable host fails fast.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::address::Address;
use super::own_lines::{self, Says, Sent};
use super::tls::Tls;

use crate::protocol::error::UpstreamError;

/// How to reach and log in to one upstream node.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// `host:port`, also used in every error message about this node.
    pub addr: Arc<str>,
    /// ACL user; `default` when only a password is set.
    pub username: Option<String>,
    /// Password, sent only inside HELLO.
    pub password: Option<String>,
    /// Bound on connect plus handshake.
    pub connect_timeout: Duration,
    /// TLS setup when the upstream requires TLS.
    pub tls: Option<Tls>,
    /// Send `READONLY` after `HELLO`: a cluster replica answers reads only on a connection
    /// that asked for it (MOVED otherwise). Set for every node when the cluster's
    /// `read_from` is not `primary` (on a primary it changes nothing), so a node's
    /// connections need no redoing when it changes role.
    pub readonly: bool,
    /// The database selected on every connection, after the login (a route's `db:`); 0
    /// selects nothing.
    pub db: u16,
}

/// A connected upstream stream, plain or TLS. An enum rather than a boxed trait object so the
/// plain-TCP hot path keeps `TcpStream`'s zero-cost split.
pub(crate) enum UpstreamStream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl UpstreamStream {
    /// The TCP connection's own end: what Redis names it by (CLIENT LIST, MONITOR).
    pub(crate) fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp().local_addr().ok()
    }

    /// The node's end of the TCP connection.
    pub(crate) fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.tcp().peer_addr().ok()
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            UpstreamStream::Tcp(tcp) => tcp,
            UpstreamStream::Tls(tls) => tls.get_ref().0,
        }
    }
}

impl NodeSpec {
    fn unavailable(&self, reason: impl ToString) -> UpstreamError {
        UpstreamError::Unavailable {
            addr: self.addr.clone(),
            reason: reason.to_string().into(),
        }
    }
}

/// The login of `base` aimed at `address`'s current node: `base` itself when the address is
/// fixed (no copy), a copy with the primary's address when followed, an error while no
/// primary is known.
pub(crate) fn node_spec(
    base: &Arc<NodeSpec>,
    address: &mut Address,
) -> Result<Arc<NodeSpec>, UpstreamError> {
    match address.current() {
        Some(addr) if addr == base.addr => Ok(base.clone()),
        Some(addr) => Ok(Arc::new(NodeSpec {
            addr,
            ..(**base).clone()
        })),
        None => Err(UpstreamError::Unavailable {
            addr: base.addr.clone(),
            reason: "no sentinel has named a reachable primary yet".into(),
        }),
    }
}

/// The connection id in a HELLO reply (its `id` field, in RESP2 and RESP3 alike); `None` for
/// an empty reply (no handshake) or one without it.
pub(crate) fn hello_id(hello: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"$2\r\nid\r\n:";
    let at = hello
        .windows(KEY.len())
        .position(|w| w.eq_ignore_ascii_case(KEY))?
        + KEY.len();
    let digits = hello[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    std::str::from_utf8(&hello[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// Connects and negotiates RESP `proto` (`None`: no handshake at all, for a client that
/// authenticates itself); returns the stream and the upstream's HELLO reply, which the proxy
/// replays to clients that send a plain `HELLO`.
pub(crate) async fn connect(
    spec: &NodeSpec,
    proto: Option<u8>,
) -> Result<(UpstreamStream, Bytes), UpstreamError> {
    match tokio::time::timeout(spec.connect_timeout, connect_inner(spec, proto)).await {
        Ok(r) => r,
        Err(_) => Err(spec.unavailable(format!(
            "connect timed out after {} ms",
            spec.connect_timeout.as_millis()
        ))),
    }
}

async fn connect_inner(
    spec: &NodeSpec,
    proto: Option<u8>,
) -> Result<(UpstreamStream, Bytes), UpstreamError> {
    let tcp = TcpStream::connect(&*spec.addr)
        .await
        .map_err(|e| spec.unavailable(e))?;
    tcp.set_nodelay(true).map_err(|e| spec.unavailable(e))?;
    // The handshake's lines are the proxy's own, not a client's (`own_lines`).
    let _own = (proto.is_some() || spec.db != 0).then(|| {
        own_lines::speaking(
            tcp.peer_addr().ok(),
            tcp.local_addr().ok(),
            Says::Handshake(Sent {
                hello: proto.is_some(),
                readonly: proto.is_some() && spec.readonly,
                select: spec.db != 0,
                auth: false,
            }),
        )
    });
    match &spec.tls {
        None => {
            let mut tcp = tcp;
            let hello = hello(spec, proto, &mut tcp).await?;
            Ok((UpstreamStream::Tcp(tcp), hello))
        }
        Some(tls) => {
            let mut stream = tls
                .connector
                .connect(tls.server_name.clone(), tcp)
                .await
                .map_err(|e| spec.unavailable(format!("TLS: {e}")))?;
            let hello = hello(spec, proto, &mut stream).await?;
            Ok((UpstreamStream::Tls(Box::new(stream)), hello))
        }
    }
}

/// Sends `HELLO <proto> [AUTH user pass]` and returns the reply, or the refusal as an error.
async fn hello<S: AsyncRead + AsyncWrite + Unpin>(
    spec: &NodeSpec,
    proto: Option<u8>,
    stream: &mut S,
) -> Result<Bytes, UpstreamError> {
    let Some(proto) = proto else {
        return select_alone(spec, stream).await.map(|()| Bytes::new());
    };
    let mut args: Vec<&[u8]> = vec![b"HELLO", if proto == 3 { b"3" } else { b"2" }];
    if let Some(password) = &spec.password {
        args.push(b"AUTH");
        args.push(spec.username.as_deref().unwrap_or("default").as_bytes());
        args.push(password.as_bytes());
    }
    let mut req = crate::protocol::codec::encode(&args).to_vec();
    if spec.readonly {
        // Pipelined with HELLO: no extra round trip.
        req.extend_from_slice(b"*1\r\n$8\r\nREADONLY\r\n");
    }
    if spec.db != 0 {
        req.extend_from_slice(&select(spec.db));
    }
    stream
        .write_all(&req)
        .await
        .map_err(|e| spec.unavailable(e))?;
    let mut buf = BytesMut::with_capacity(1024);
    let hello = super::read_reply(stream, &mut buf, 1024 * 1024)
        .await
        .map_err(|e| spec.unavailable(format!("HELLO: {e}")))?
        .freeze();
    login_refused(spec, &hello)?;
    if spec.readonly {
        let reply = super::read_reply(stream, &mut buf, 1024)
            .await
            .map_err(|e| spec.unavailable(format!("READONLY: {e}")))?;
        refused(spec, &reply)?;
    }
    if spec.db != 0 {
        let reply = super::read_reply(stream, &mut buf, 1024)
            .await
            .map_err(|e| spec.unavailable(format!("SELECT: {e}")))?;
        refused(spec, &reply)?;
    }
    Ok(hello)
}

/// `SELECT db` as RESP.
fn select(db: u16) -> Vec<u8> {
    let db = db.to_string();
    crate::protocol::codec::encode(&[b"SELECT".as_slice(), db.as_bytes()]).to_vec()
}

/// The database of a connection without a handshake (its client logs in itself): selected
/// before the client's first command, so a route's keys never land in database 0. Fails when
/// the server wants a login first; the client's command then gets that error.
async fn select_alone<S: AsyncRead + AsyncWrite + Unpin>(
    spec: &NodeSpec,
    stream: &mut S,
) -> Result<(), UpstreamError> {
    if spec.db == 0 {
        return Ok(());
    }
    stream
        .write_all(&select(spec.db))
        .await
        .map_err(|e| spec.unavailable(e))?;
    let mut buf = BytesMut::with_capacity(64);
    let reply = super::read_reply(stream, &mut buf, 1024)
        .await
        .map_err(|e| spec.unavailable(format!("SELECT: {e}")))?;
    refused(spec, &reply)
}

/// The handshake error for HELLO's reply: a refusal of the proxy's credentials is told apart
/// (`upstream::credentials`) from any other refusal.
fn login_refused(spec: &NodeSpec, reply: &[u8]) -> Result<(), UpstreamError> {
    match refused(spec, reply) {
        Err(UpstreamError::Handshake { addr, reply })
            if super::credentials::refuses_credentials(&reply) =>
        {
            Err(UpstreamError::CredentialsRefused { addr, reply })
        }
        other => other,
    }
}

/// The handshake error for an error reply (a refused login, READONLY on a server that is
/// not in cluster mode).
fn refused(spec: &NodeSpec, reply: &[u8]) -> Result<(), UpstreamError> {
    if reply.first() == Some(&b'-') {
        let text = String::from_utf8_lossy(&reply[1..]).trim_end().to_string();
        return Err(UpstreamError::Handshake {
            addr: spec.addr.clone(),
            reply: text.into(),
        });
    }
    Ok(())
}
