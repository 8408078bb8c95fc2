//! TLS to the upstream (rustls with ring: pure Rust apart from ring's small C/asm core,
//! no OpenSSL to match at deploy time).

use std::sync::Arc;

use rustls_pki_types::ServerName;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::ClientConfig;

use crate::config::TlsConfig;

/// A ready TLS client setup: trust anchors, optional client certificate, and the name the
/// upstream's certificate must carry.
#[derive(Clone)]
pub struct Tls {
    /// Shared rustls configuration (session resumption cache included).
    pub(crate) connector: TlsConnector,
    /// Name verified against the upstream certificate and sent as SNI.
    pub(crate) server_name: ServerName<'static>,
}

/// Builds the TLS setup; errors name the file that could not be used.
pub(crate) fn build(config: &TlsConfig, upstream_host: &str) -> Result<Tls, String> {
    let roots = crate::protocol::pem::roots(&config.ca_file.value)?;
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let client = match (&config.cert_file, &config.key_file) {
        (Some(cert), Some(key)) => {
            let chain = crate::protocol::pem::certs(cert)?;
            let key = crate::protocol::pem::key(key)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate: {e}"))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err("cert_file and key_file go together".to_string()),
    };
    let name = config.server_name.as_deref().unwrap_or(upstream_host);
    let server_name =
        ServerName::try_from(name.to_string()).map_err(|e| format!("server name {name:?}: {e}"))?;
    Ok(Tls {
        connector: TlsConnector::from(Arc::new(client)),
        server_name,
    })
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}
