//! Whether the upstream still accepts the proxy's own login (`upstream.username` and
//! `upstream.password`, or none).
//!
//! Redis keeps a connection logged in when its password changes (`CONFIG SET requirepass`,
//! `ACL SETUSER`), so after such a change the proxy's connections that are up keep serving,
//! and only new ones fail: a shared connection reconnecting (after a restart, a network cut,
//! or Redis's `timeout` closing it while idle), a dedicated connection dialled for a client,
//! the warm stock's refill. Each of those logins is refused with `NOAUTH`/`WRONGPASS`, and
//! every command that needed it gets the same error naming the cause
//! ([`UpstreamError::CredentialsRefused`], not "unavailable"), whether it was queued for a
//! shared connection or waited for a dedicated one. The node's connections report here, so
//! the log says it once when the refusals begin and once when a login succeeds again, not
//! once per connection per retry, and the metric `rpp_upstream_credentials_refused` and
//! INFO's `proxy_upstream_credentials_refused` follow the same state.

use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::metrics::gauge::Gauge;

use crate::observe::metrics::Metrics;
use crate::protocol::error::UpstreamError;

/// One node's login state, shared by all of its connections (shared, control, dedicated).
#[derive(Debug)]
pub(crate) struct Credentials {
    /// The latest login of the proxy's on this node was refused.
    refused: AtomicBool,
    /// This node's series of `rpp_upstream_credentials_refused`: 1 while `refused`.
    series: Gauge,
    /// The count of refused nodes (INFO), shared by every node's state.
    nodes: Gauge,
}

impl Credentials {
    /// The login state of the node at `addr`, reported in `metrics` (its series starts at 0).
    pub(crate) fn new(addr: &str, metrics: &Metrics) -> Credentials {
        let labels = vec![("upstream", addr.to_string())];
        Credentials {
            refused: AtomicBool::new(false),
            series: metrics
                .upstream_credentials_refused
                .get_or_create(&labels)
                .clone(),
            nodes: metrics.upstream_credentials_refused_nodes.clone(),
        }
    }

    /// Notes the outcome of a login attempt: an error that refuses the credentials starts the
    /// refused state (logged once at ERROR), a success ends it (logged once at INFO); other
    /// errors (the node is down) say nothing about the credentials.
    pub(crate) fn observe<T>(&self, addr: &str, outcome: &Result<T, UpstreamError>) {
        match outcome {
            Ok(_) => {
                if self.refused.swap(false, Ordering::AcqRel) {
                    self.series.dec();
                    self.nodes.dec();
                    tracing::info!(upstream = %addr, "upstream accepts the proxy's credentials again");
                }
            }
            Err(UpstreamError::CredentialsRefused { reply, .. }) => {
                if !self.refused.swap(true, Ordering::AcqRel) {
                    self.series.inc();
                    self.nodes.inc();
                    tracing::error!(
                        upstream = %addr,
                        reply = %reply,
                        "upstream refused the proxy's credentials (upstream.username / upstream.password): \
                         new upstream connections fail and the commands that need one get this error; \
                         connections already logged in keep serving"
                    );
                }
            }
            Err(_) => {}
        }
    }

    /// Whether the latest login was refused.
    pub(crate) fn refused(&self) -> bool {
        self.refused.load(Ordering::Acquire)
    }
}

impl Drop for Credentials {
    /// A node that goes away (a cluster node's pool dropped) no longer counts as refusing.
    fn drop(&mut self) {
        if *self.refused.get_mut() {
            self.series.dec();
            self.nodes.dec();
        }
    }
}

/// Whether a login reply refuses the credentials (rather than the command or the server's
/// state): `NOAUTH` (the server wants a password the proxy did not send), `WRONGPASS` (a
/// wrong password or a disabled user), `NOPERM` (the user may not run HELLO).
pub(crate) fn refuses_credentials(reply: &str) -> bool {
    ["NOAUTH", "WRONGPASS", "NOPERM"]
        .iter()
        .any(|code| reply.starts_with(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_of_the_login_are_told_apart() {
        assert!(refuses_credentials(
            "WRONGPASS invalid username-password pair or user is disabled."
        ));
        assert!(refuses_credentials(
            "NOAUTH HELLO must be called with the client already authenticated"
        ));
        assert!(!refuses_credentials(
            "ERR This instance has cluster support disabled"
        ));
        let policy = std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(
            crate::observe::metrics::NoPolicy,
        ));
        let metrics = Metrics::new(policy);
        let state = Credentials::new("a:1", &metrics);
        let other = Credentials::new("b:1", &metrics);
        let series = "rpp_upstream_credentials_refused{upstream=\"a:1\"}";
        assert!(metrics.render().contains(&format!("{series} 0\n")));
        let refused: Result<(), UpstreamError> = Err(UpstreamError::CredentialsRefused {
            addr: "a".into(),
            reply: "WRONGPASS x".into(),
        });
        state.observe("a", &refused);
        // Refused again by another connection of the node: still one node, one refusal.
        state.observe("a", &refused);
        other.observe("b", &refused);
        assert!(state.refused());
        assert!(metrics.render().contains(&format!("{series} 1\n")));
        assert_eq!(metrics.upstream_credentials_refused_nodes.get(), 2);
        // The node is down: nothing is said about the credentials.
        let down: Result<(), UpstreamError> = Err(UpstreamError::Unavailable {
            addr: "a".into(),
            reason: "Connection refused".into(),
        });
        state.observe("a", &down);
        assert!(state.refused());
        state.observe("a", &Ok::<(), UpstreamError>(()));
        assert!(!state.refused());
        assert!(metrics.render().contains(&format!("{series} 0\n")));
        assert_eq!(metrics.upstream_credentials_refused_nodes.get(), 1);
        drop(other);
        assert_eq!(metrics.upstream_credentials_refused_nodes.get(), 0);
    }
}
