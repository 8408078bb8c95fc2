//! A client's connection, plain TCP or TLS, with the two halves the session reads and writes
//! through. The session waits for readability before it touches its read buffer (an idle
//! client holds none); plain TCP keeps exactly that, TLS needs its own notion of "readable".

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// Bytes a TLS client's decrypted data is read into while the session has not asked for it
/// yet: one TLS record's worth (16 KiB at most).
const TLS_CHUNK: usize = 16 * 1024;

/// One accepted client connection.
pub(crate) struct ClientStream {
    /// The transport.
    io: Io,
}

/// Plain TCP or TLS over TCP.
enum Io {
    /// Plain TCP: the session reads the socket directly.
    Tcp(TcpStream),
    /// TLS, terminated here. Boxed: rustls's connection state is large, and plain clients
    /// should not carry its size (nor that of the certificate's names).
    Tls(Box<Tls>),
}

/// A TLS client's stream and what its certificate says.
struct Tls {
    /// The stream.
    stream: TlsStream<TcpStream>,
    /// Names of the client's verified certificate (subject CN first, then the SANs), which
    /// `access.cert_users` can map to a proxy user; empty without a certificate.
    cert_names: Vec<String>,
}

impl ClientStream {
    /// A plaintext client.
    pub(crate) fn plain(tcp: TcpStream) -> ClientStream {
        ClientStream { io: Io::Tcp(tcp) }
    }

    /// A client whose TLS handshake finished; `cert_names` from its verified certificate.
    pub(crate) fn tls(tls: TlsStream<TcpStream>, cert_names: Vec<String>) -> ClientStream {
        ClientStream {
            io: Io::Tls(Box::new(Tls {
                stream: tls,
                cert_names,
            })),
        }
    }

    /// The TCP socket underneath.
    fn tcp(&self) -> &TcpStream {
        match &self.io {
            Io::Tcp(tcp) => tcp,
            Io::Tls(tls) => tls.stream.get_ref().0,
        }
    }

    /// `TCP_NODELAY`: replies go out as soon as they are written.
    pub(crate) fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.tcp().set_nodelay(on)
    }

    /// The client's address.
    pub(crate) fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().peer_addr()
    }

    /// The proxy's address the client connected to.
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp().local_addr()
    }

    /// Whether the client speaks TLS.
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self.io, Io::Tls(_))
    }

    /// The verified client certificate's names (empty without one).
    pub(crate) fn cert_names(&self) -> &[String] {
        match &self.io {
            Io::Tcp(_) => &[],
            Io::Tls(tls) => &tls.cert_names,
        }
    }

    /// The halves the session reads and writes through, borrowed from the stream.
    pub(crate) fn split(&mut self) -> (ClientRead<'_>, ClientWrite<'_>) {
        match &mut self.io {
            Io::Tcp(tcp) => {
                let (r, w) = tcp.split();
                (ClientRead::Tcp(r), ClientWrite::Tcp(w))
            }
            Io::Tls(tls) => {
                let (r, w) = tokio::io::split(&mut tls.stream);
                let read = TlsRead {
                    half: r,
                    pending: Box::default(),
                    start: 0,
                    end: 0,
                    eof: false,
                };
                (
                    ClientRead::Tls(Box::new(read)),
                    ClientWrite::Tls(Box::new(w)),
                )
            }
        }
    }
}

/// The reading half of a client connection.
pub(crate) enum ClientRead<'a> {
    /// Plain TCP.
    Tcp(tokio::net::tcp::ReadHalf<'a>),
    /// TLS.
    Tls(Box<TlsRead<'a>>),
}

/// The reading half of a TLS client, with the decrypted bytes read while waiting for
/// readability.
pub(crate) struct TlsRead<'a> {
    /// The stream's read side.
    half: ReadHalf<&'a mut TlsStream<TcpStream>>,
    /// Decrypted bytes read while waiting for readability, `start..end` not handed to the
    /// session yet. Readability of the socket says nothing about a TLS stream (rustls may
    /// hold a decrypted record already, or the bytes that came may be half a record), so
    /// waiting for readability is a read, kept here. Allocated at the first read.
    pending: Box<[u8]>,
    /// First byte of `pending` not handed over.
    start: usize,
    /// End of the bytes read into `pending`.
    end: usize,
    /// The client closed (or the stream failed): readable at once, reads return 0.
    eof: bool,
}

impl ClientRead<'_> {
    /// Waits until a read would return data, end of stream or an error.
    pub(crate) async fn readable(&mut self) -> io::Result<()> {
        match self {
            ClientRead::Tcp(r) => r.readable().await,
            ClientRead::Tls(t) => std::future::poll_fn(|cx| t.poll_fill(cx)).await,
        }
    }
}

impl TlsRead<'_> {
    /// Reads decrypted bytes into `pending` unless some are there already.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.start < self.end || self.eof {
            return Poll::Ready(Ok(()));
        }
        if self.pending.is_empty() {
            self.pending = vec![0; TLS_CHUNK].into_boxed_slice();
        }
        let mut buf = ReadBuf::new(&mut self.pending);
        let result = ready!(Pin::new(&mut self.half).poll_read(cx, &mut buf));
        let n = buf.filled().len();
        (self.start, self.end) = (0, n);
        match result {
            Ok(()) if n == 0 => self.eof = true,
            Ok(()) => {}
            Err(e) => {
                self.eof = true;
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for ClientRead<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientRead::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            ClientRead::Tls(t) => {
                ready!(t.poll_fill(cx))?;
                let n = (t.end - t.start).min(buf.remaining());
                buf.put_slice(&t.pending[t.start..t.start + n]);
                t.start += n;
                Poll::Ready(Ok(()))
            }
        }
    }
}

/// The writing half of a client connection.
pub(crate) enum ClientWrite<'a> {
    /// Plain TCP.
    Tcp(tokio::net::tcp::WriteHalf<'a>),
    /// TLS: writes are encrypted into rustls's buffer, so the session flushes after them.
    /// Boxed, like the reading half, so plain clients' halves stay two words.
    Tls(Box<WriteHalf<&'a mut TlsStream<TcpStream>>>),
}

impl AsyncWrite for ClientWrite<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientWrite::Tcp(w) => Pin::new(w).poll_write(cx, buf),
            ClientWrite::Tls(w) => Pin::new(&mut **w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientWrite::Tcp(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            ClientWrite::Tls(w) => Pin::new(&mut **w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientWrite::Tcp(w) => Pin::new(w).poll_flush(cx),
            ClientWrite::Tls(w) => Pin::new(&mut **w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientWrite::Tcp(w) => Pin::new(w).poll_shutdown(cx),
            ClientWrite::Tls(w) => Pin::new(&mut **w).poll_shutdown(cx),
        }
    }
}
