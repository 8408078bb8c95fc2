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
pub mod stream;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::rustls;

use crate::metrics::Metrics;
pub use stream::ClientStream;
pub use tls::TlsServer;

/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What a listener serves.
#[derive(Clone)]
pub enum Serving {
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
pub enum Refusal {
    /// Plaintext sent to a TLS-only listener.
    Plaintext,
    /// The client's certificate did not verify against `tls.client_ca_file`.
    Untrusted,
    /// The client's certificate is expired (or not valid yet).
    Expired,
    /// `client_certs: required` and the client sent none.
    NoCertificate,
    /// No first byte or no finished handshake within `tls.handshake_timeout_ms`.
    Timeout,
    /// Any other handshake failure (protocol version, cipher, malformed records…).
    Failed,
    /// The client closed before sending anything (port probes, health checks).
    Closed,
}

impl Refusal {
    /// Every refusal, in the order of [`crate::metrics::TLS_OUTCOMES`] after `ok`.
    pub const ALL: [Refusal; 7] = [
        Refusal::Plaintext,
        Refusal::Untrusted,
        Refusal::Expired,
        Refusal::NoCertificate,
        Refusal::Timeout,
        Refusal::Failed,
        Refusal::Closed,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
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
pub async fn establish(
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
    let handshake = handshake(tcp, server, plaintext);
    let outcome = match tokio::time::timeout(server.handshake_timeout(), handshake).await {
        Ok(outcome) => outcome,
        Err(_) => Err((
            Refusal::Timeout,
            "no finished TLS handshake in time".to_string(),
        )),
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

/// The first byte, then the handshake (or the plaintext client, where allowed).
async fn handshake(
    mut tcp: TcpStream,
    server: &TlsServer,
    plaintext: bool,
) -> Result<ClientStream, (Refusal, String)> {
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await {
        Ok(0) => return Err((Refusal::Closed, "closed before sending anything".into())),
        Ok(_) => {}
        Err(e) => return Err((Refusal::Closed, e.to_string())),
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        if plaintext {
            return Ok(ClientStream::plain(tcp));
        }
        // Told in RESP, so a redis-cli without --tls shows why instead of hanging.
        let _ = tcp.write_all(&crate::answers::tls_required()).await;
        let _ = tcp.shutdown().await;
        return Err((Refusal::Plaintext, "plaintext on a TLS port".into()));
    }
    let acceptor = server.acceptor();
    match acceptor.accept(tcp).await {
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
