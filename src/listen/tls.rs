//! The TLS server side: the proxy's certificate and key, the CA that signs client
//! certificates, and their reload when the files change.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::server::WebPkiClientVerifier;

use crate::config::{ClientCerts, ClientTlsConfig};
use crate::observe::metrics::Metrics;

/// What a TLS listener needs: the acceptor of the moment and the settings around it.
pub(crate) struct TlsServer {
    /// The acceptor built from the files as last loaded; swapped when they change, so new
    /// connections get the new certificate and established ones keep theirs.
    acceptor: ArcSwap<TlsAcceptor>,
    /// The section the acceptor is built from (the files are re-read from these paths).
    config: ClientTlsConfig,
}

impl TlsServer {
    /// Loads the files; the error names the file that could not be used.
    pub(crate) fn new(config: &ClientTlsConfig) -> Result<TlsServer, String> {
        Ok(TlsServer {
            acceptor: ArcSwap::from_pointee(build(config)?),
            config: config.clone(),
        })
    }

    /// The acceptor for a new connection.
    pub(crate) fn acceptor(&self) -> Arc<TlsAcceptor> {
        self.acceptor.load_full()
    }

    /// Bound on the first byte and the handshake.
    pub(crate) fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.config.handshake_timeout_ms.value)
    }

    /// Looks at the files every `reload_check_ms` and loads them again when one changed
    /// (modification time or size); a file that does not load leaves the acceptor in use,
    /// with a warning and `rpp_tls_reloads_total{result="failed"}`, and is tried again at
    /// its next change.
    pub(crate) async fn watch(self: Arc<Self>, metrics: Arc<Metrics>) {
        let every = Duration::from_millis(self.config.reload_check_ms.value);
        let mut seen = stamps(&self.files());
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = stamps(&self.files());
            if now == seen {
                continue;
            }
            seen = now;
            match build(&self.config) {
                Ok(acceptor) => {
                    self.acceptor.store(Arc::new(acceptor));
                    metrics.tls_reloads_ok.inc();
                    tracing::info!(cert = %self.config.cert_file.value.display(), "TLS certificate reloaded");
                }
                Err(e) => {
                    metrics.tls_reloads_failed.inc();
                    tracing::warn!(error = %e, "TLS files changed but do not load; the certificate in use stays");
                }
            }
        }
    }

    /// The files whose change triggers a reload.
    fn files(&self) -> Vec<PathBuf> {
        let c = &self.config;
        let mut files = vec![c.cert_file.value.clone(), c.key_file.value.clone()];
        files.extend(c.client_ca_file.iter().map(|f| f.value.clone()));
        files
    }
}

/// Modification time and size of each file (`None` for one that cannot be read): what
/// tells a rewritten or renamed-over file from an unchanged one.
fn stamps(files: &[PathBuf]) -> Vec<Option<(SystemTime, u64)>> {
    files
        .iter()
        .map(|f| {
            let meta = std::fs::metadata(f).ok()?;
            Some((meta.modified().ok()?, meta.len()))
        })
        .collect()
}

/// Builds the acceptor from the files; errors name the file.
pub(crate) fn build(config: &ClientTlsConfig) -> Result<TlsAcceptor, String> {
    let chain = crate::protocol::pem::certs(&config.cert_file.value)?;
    let key = crate::protocol::pem::key(&config.key_file.value)?;
    let builder = ServerConfig::builder();
    let builder = match &config.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = crate::protocol::pem::roots(&ca.value)?;
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots));
            let verifier = match config.client_certs.value {
                ClientCerts::Required => verifier,
                ClientCerts::Optional => verifier.allow_unauthenticated(),
            };
            let verifier = verifier
                .build()
                .map_err(|e| format!("{}: {e}", ca.value.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let server = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{}: {e}", config.cert_file.value.display()))?;
    Ok(TlsAcceptor::from(Arc::new(server)))
}
