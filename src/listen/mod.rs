//! Where clients come in: plain TCP, or TLS terminated by the proxy (on `listen` itself or
//! on `tls.listen` beside it), and what a client that cannot be served that way gets.
//!
//! - [`stream`]: the client connection the session reads and writes, plain or TLS.
//! - [`tls`]: the certificate, key and client CA, reloaded when the files change.
//! - [`cert_name`]: the names of a verified client certificate (CN, SANs).
//!
//! A TLS client is established in its own task before its session starts, within
//! `tls.handshake_timeout_ms`, so a slow or silent client delays nobody else.

pub mod cert_name;
pub(crate) mod stream;
pub(crate) mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::rustls;

use crate::observe::metrics::Metrics;
pub(crate) use stream::ClientStream;
pub(crate) use tls::TlsServer;

/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What a listener serves.
#[derive(Clone)]
pub(crate) enum Serving {
    /// Plain TCP only.
    Plain,
    /// TLS; with `plaintext`, plain clients too (told apart by their first byte).
    Tls {
        /// The certificate and settings.
        server: Arc<TlsServer>,
        /// Whether a client whose first byte is not a TLS handshake is served in plaintext
        /// instead of refused.
        plaintext: bool,
    },
}

/// Why a client was closed before its session started; the metric label and the log's
/// reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Plaintext sent to a TLS-only listener.
    Plaintext,
    /// The client's certificate did not verify against `tls.client_ca_file`.
    Untrusted,
    /// The client's certificate is expired (or not valid yet).
    Expired,
    /// `client_certs: required` and the client sent none.
    NoCertificate,
    /// No finished handshake within `tls.handshake_timeout_ms` (on a TLS-only listener, no
    /// first byte either).
    Timeout,
    /// Any other handshake failure (protocol version, cipher, malformed records…).
    Failed,
    /// The client closed before sending anything (port probes, health checks).
    Closed,
}

impl Refusal {
    /// Every refusal, in the order of [`crate::observe::metrics::TLS_OUTCOMES`] after `ok`.
    pub(crate) const ALL: [Refusal; 7] = [
        Refusal::Plaintext,
        Refusal::Untrusted,
        Refusal::Expired,
        Refusal::NoCertificate,
        Refusal::Timeout,
        Refusal::Failed,
        Refusal::Closed,
    ];

    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::Plaintext => "plaintext",
            Refusal::Untrusted => "untrusted",
            Refusal::Expired => "expired",
            Refusal::NoCertificate => "no_certificate",
            Refusal::Timeout => "timeout",
            Refusal::Failed => "failed",
            Refusal::Closed => "closed",
        }
    }
}

/// Makes `tcp` a client stream as `serving` says: at once for plain TCP; for TLS, after the
/// handshake, bounded by `tls.handshake_timeout_ms`. `None` when the client was refused
/// (logged with the reason and counted in `rpp_tls_handshakes_total`).
pub(crate) async fn establish(
    tcp: TcpStream,
    peer: SocketAddr,
    serving: &Serving,
    metrics: &Metrics,
) -> Option<ClientStream> {
    let Serving::Tls { server, plaintext } = serving else {
        return Some(ClientStream::plain(tcp));
    };
    // Boxed: a handshake in progress holds rustls's whole connection state, which would
    // otherwise sit in every client's task, plain ones included, for its whole life.
    Box::pin(establish_tls(tcp, peer, server, *plaintext, metrics)).await
}

/// [`establish`] for a TLS listener.
async fn establish_tls(
    tcp: TcpStream,
    peer: SocketAddr,
    server: &TlsServer,
    plaintext: bool,
    metrics: &Metrics,
) -> Option<ClientStream> {
    let bound = server.handshake_timeout();
    let outcome = if plaintext {
        // Where plaintext is served too, a client that connects and says nothing yet is a
        // plain client like any other (pools open connections ahead of use; Redis keeps them
        // with `timeout 0`): only a TLS handshake, once begun, is bounded.
        match first_byte(&tcp).await {
            Err(refused) => Err(refused),
            Ok(b) if b != TLS_HANDSHAKE_RECORD => Ok(ClientStream::plain(tcp)),
            Ok(_) => bounded(bound, accept(tcp, server)).await,
        }
    } else {
        let tls_only = async {
            if first_byte(&tcp).await? != TLS_HANDSHAKE_RECORD {
                return Err(refuse_plaintext(tcp).await);
            }
            accept(tcp, server).await
        };
        bounded(bound, tls_only).await
    };
    match outcome {
        Ok(stream) => {
            if stream.is_tls() {
                metrics.tls_handshakes[0].inc();
            }
            Some(stream)
        }
        Err((refusal, detail)) => {
            let index = Refusal::ALL.iter().position(|r| *r == refusal).unwrap_or(0);
            metrics.tls_handshakes[index + 1].inc();
            tracing::info!(%peer, reason = refusal.label(), detail, "TLS client closed");
            None
        }
    }
}

/// What a step of establishing a client ends with: the stream, or why it was refused.
type Outcome<T> = Result<T, (Refusal, String)>;

/// `step` within `bound`, else [`Refusal::Timeout`].
async fn bounded(
    bound: std::time::Duration,
    step: impl std::future::Future<Output = Outcome<ClientStream>>,
) -> Outcome<ClientStream> {
    match tokio::time::timeout(bound, step).await {
        Ok(outcome) => outcome,
        Err(_) => Err((Refusal::Timeout, "no finished TLS handshake in time".into())),
    }
}

/// The client's first byte, left in the socket.
async fn first_byte(tcp: &TcpStream) -> Outcome<u8> {
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await {
        Ok(0) => Err((Refusal::Closed, "closed before sending anything".into())),
        Ok(_) => Ok(first[0]),
        Err(e) => Err((Refusal::Closed, e.to_string())),
    }
}

/// Plaintext on a TLS-only listener: told in RESP, so a redis-cli without `--tls` shows why
/// instead of hanging, then closed.
async fn refuse_plaintext(mut tcp: TcpStream) -> (Refusal, String) {
    let _ = tcp
        .write_all(&crate::protocol::answers::tls_required())
        .await;
    let _ = tcp.shutdown().await;
    (Refusal::Plaintext, "plaintext on a TLS port".into())
}

/// The TLS handshake, and the names of the client's verified certificate.
async fn accept(tcp: TcpStream, server: &TlsServer) -> Outcome<ClientStream> {
    match server.acceptor().accept(tcp).await {
        Ok(tls) => {
            let names = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|cert| cert_name::names(cert))
                .unwrap_or_default();
            Ok(ClientStream::tls(tls, names))
        }
        Err(e) => Err((classify(&e), e.to_string())),
    }
}

/// Which refusal a failed handshake is.
fn classify(e: &std::io::Error) -> Refusal {
    use rustls::CertificateError as C;
    let Some(err) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return Refusal::Failed;
    };
    match err {
        rustls::Error::NoCertificatesPresented => Refusal::NoCertificate,
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => Refusal::Expired,
        rustls::Error::InvalidCertificate(_) => Refusal::Untrusted,
        _ => Refusal::Failed,
    }
}
