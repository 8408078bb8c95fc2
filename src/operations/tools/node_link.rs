//! One connection to a node for the operator's tools (`--survey`, `backfill`): probed first,
//! so that a node that cannot be reached, does not answer or refuses the login is one line
//! naming the address and the cause, then a control connection of a pool of its own.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::policy::Policy;
use crate::protocol::error::UpstreamError;
use crate::protocol::resp_value::{self, Value};
use crate::upstream::handshake::NodeSpec;
use crate::upstream::pool::{Control, Pool, PoolSettings};

/// One connection to the node, logged in as `login` says, and closed: why it cannot be, in
/// one line naming the address and the cause (`refused` words a refused login: which
/// setting gave the credentials).
pub(crate) async fn probe(
    login: &NodeSpec,
    refused: impl FnOnce(&str, &str) -> String,
) -> Result<(), String> {
    let addr = &login.addr;
    let limit = login.connect_timeout;
    let ms = limit.as_millis();
    match tokio::time::timeout(limit, tokio::net::TcpStream::connect(&**addr)).await {
        Err(_) => {
            return Err(format!(
                "cannot reach the upstream {addr}: no connection within {ms} ms \
                 (upstream.connect_timeout_ms); is the address right, and reachable from here?"
            ));
        }
        Ok(Err(e)) => {
            return Err(format!(
                "cannot reach the upstream {addr}: {}",
                io_cause(&e)
            ));
        }
        Ok(Ok(_)) => {}
    }
    // The handshake's own deadline is set past ours, so that ours tells a silent server.
    let patient = NodeSpec {
        connect_timeout: limit * 2,
        ..login.clone()
    };
    let hello = crate::upstream::handshake::connect(&patient, Some(2));
    match tokio::time::timeout(limit, hello).await {
        Ok(Ok(_)) => Ok(()),
        Err(_) => Err(format!(
            "the upstream {addr} accepted the connection but did not answer HELLO within {ms} ms \
             (upstream.connect_timeout_ms): is it a Redis server, and not overloaded?"
        )),
        Ok(Err(UpstreamError::CredentialsRefused { reply, .. })) => Err(refused(addr, &reply)),
        Ok(Err(UpstreamError::Handshake { reply, .. })) => Err(format!(
            "the upstream {addr} refused the proxy's login: {reply}"
        )),
        Ok(Err(UpstreamError::Unavailable { reason, .. } | UpstreamError::Lost { reason, .. })) => {
            Err(format!(
                "the upstream {addr} did not complete the handshake: {reason} (is it a Redis \
                 server, and is upstream.tls set as it needs?)"
            ))
        }
        Ok(Err(e)) => Err(e.to_string()),
    }
}

/// A connection error in words: the kinds an operator meets, then the system's own text.
fn io_cause(e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    let what = match e.kind() {
        ErrorKind::ConnectionRefused => {
            "connection refused: nothing listens there (is Redis running, and is --upstream \
             or upstream.address right?)"
        }
        ErrorKind::TimedOut => "connection timed out",
        ErrorKind::HostUnreachable => "host unreachable",
        ErrorKind::NetworkUnreachable => "network unreachable",
        ErrorKind::PermissionDenied => "connection not permitted here (a firewall rule?)",
        _ => return e.to_string(),
    };
    what.to_string()
}

/// A refused login to the policy file's upstream in words: what the server said, and which
/// setting to change; `needs` names what the tool runs (for an ACL user without it).
pub(crate) fn login_refused(addr: &str, reply: &str, config: &Config, needs: &str) -> String {
    let u = &config.upstream;
    let source = match (&u.password_env, &u.password_file) {
        (Some(var), _) => format!("upstream.password_env ({})", var.value),
        (_, Some(file)) => format!("upstream.password_file ({})", file.value.display()),
        _ => "upstream.password".to_string(),
    };
    let user = u.username.as_deref().unwrap_or("default");
    if reply.starts_with("NOAUTH") {
        format!(
            "the upstream {addr} requires a login and the policy gives none (NOAUTH): set \
             upstream.password, or password_env / password_file to keep it out of the file \
             (and upstream.username for an ACL user)"
        )
    } else if reply.starts_with("WRONGPASS") {
        format!(
            "the upstream {addr} refused the proxy's credentials (WRONGPASS): user {user} with \
             the password from {source} does not match the server's requirepass or ACL user"
        )
    } else {
        format!(
            "the upstream {addr} refused the proxy's login as user {user}: {reply} (the ACL user \
             needs HELLO and {needs})"
        )
    }
}

/// A control connection to the upstream, once it answers PING (within twice the connect
/// timeout: the probe has just logged in, so this is the pool's own first connection).
pub(crate) async fn connect(settings: &PoolSettings, addr: &str) -> Result<Control, String> {
    let metrics =
        crate::observe::metrics::Metrics::new(Arc::new(ArcSwap::from_pointee(Policy::default())));
    let pool = Pool::start_node(addr.into(), settings, metrics);
    let control = pool.control();
    let until = tokio::time::Instant::now() + settings.login.connect_timeout * 2;
    loop {
        // A refusal (NOPERM) is final; a connection not up yet is waited for.
        match control.request(&[b"PING"]).await {
            Ok(reply) => {
                return answer("PING", &reply, "")
                    .map(|_| control)
                    .map_err(|e| format!("the upstream {addr}: {e}"));
            }
            Err(_) if tokio::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("the upstream {addr} did not answer PING: {e}")),
        }
    }
}

/// The reply to the command `name`, decoded; an error reply as an error naming it, with
/// `rights` (what the tool runs, as which user) after a NOPERM.
pub(crate) fn answer(name: &str, reply: &[u8], rights: &str) -> Result<Value, String> {
    match resp_value::decode(reply, 4) {
        Ok((Value::Error(e), _)) if e.starts_with("NOPERM") && !rights.is_empty() => {
            Err(format!("{name} was refused: {e} ({rights})"))
        }
        Ok((Value::Error(e), _)) => Err(format!("{name} was refused: {e}")),
        Ok((v, _)) => Ok(v),
        Err(e) => Err(format!("{name}: unreadable reply: {e}")),
    }
}
