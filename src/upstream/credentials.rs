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
//! once per connection per retry.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::UpstreamError;

/// One node's login state, shared by all of its connections (shared, control, dedicated).
#[derive(Debug, Default)]
pub struct Credentials {
    /// The latest login of the proxy's on this node was refused.
    refused: AtomicBool,
}

impl Credentials {
    /// Notes the outcome of a login attempt: an error that refuses the credentials starts the
    /// refused state (logged once at ERROR), a success ends it (logged once at INFO); other
    /// errors (the node is down) say nothing about the credentials.
    pub fn observe<T>(&self, addr: &str, outcome: &Result<T, UpstreamError>) {
        match outcome {
            Ok(_) => {
                if self.refused.swap(false, Ordering::AcqRel) {
                    tracing::info!(upstream = %addr, "upstream accepts the proxy's credentials again");
                }
            }
            Err(UpstreamError::CredentialsRefused { reply, .. }) => {
                if !self.refused.swap(true, Ordering::AcqRel) {
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
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Acquire)
    }
}

/// Whether a login reply refuses the credentials (rather than the command or the server's
/// state): `NOAUTH` (the server wants a password the proxy did not send), `WRONGPASS` (a
/// wrong password or a disabled user), `NOPERM` (the user may not run HELLO).
pub fn refuses_credentials(reply: &str) -> bool {
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
        let state = Credentials::default();
        let refused: Result<(), UpstreamError> = Err(UpstreamError::CredentialsRefused {
            addr: "a".into(),
            reply: "WRONGPASS x".into(),
        });
        state.observe("a", &refused);
        assert!(state.refused());
        state.observe("a", &Ok::<(), UpstreamError>(()));
        assert!(!state.refused());
    }
}
