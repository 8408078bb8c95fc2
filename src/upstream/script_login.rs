//! Logging a dedicated connection in as the script user (`script_user`), creating the user
//! first on a node that does not have it (a restarted Redis, a new primary, each cluster
//! node keeps its own ACL).
//!
//! Runs right after the handshake (as the proxy's own user), before the connection carries
//! any client command: `AUTH <script user> <password>`; on `WRONGPASS`, the user is set up
//! ([`set_up`]: `ACL WHOAMI`, `ACL GETUSER`, `ACL SETUSER`) and `AUTH` sent again.

use std::future::Future;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::policy::script_user::{ScriptUser, State, setuser_args};
use crate::protocol::resp_value::{self, Value};

/// Why the script user could not be used.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Redis refused or answered something the proxy cannot use: retrying will not help
    /// (no ACL rights, Redis before 7, an unreadable ACL).
    Refused(String),
    /// The connection failed, or Redis could not take the command just now (busy running a
    /// script, loading, a primary down): the next attempt may work, so the user is not
    /// marked unavailable. (A reload during a long script used to mark it so, refusing every
    /// script for 30 seconds.)
    Transient(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(why) | Failure::Transient(why) => f.write_str(why),
        }
    }
}

/// One command and its decoded reply, on whatever carries it (a fresh connection's stream,
/// the control connection).
pub(crate) trait Ask {
    /// Sends `args` and decodes the reply; `Err` when the connection failed.
    fn ask(&mut self, args: &[&str]) -> impl Future<Output = Result<Value, String>> + Send;
}

/// A stream before the connection task owns it.
pub(crate) struct OnStream<'a, S> {
    /// The connection, logged in.
    pub(crate) stream: &'a mut S,
    /// Read buffer (replies here are small).
    pub(crate) buf: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Ask for OnStream<'_, S> {
    async fn ask(&mut self, args: &[&str]) -> Result<Value, String> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.stream
            .write_all(&crate::protocol::codec::encode(&args))
            .await
            .map_err(|e| e.to_string())?;
        let reply = super::read_reply(self.stream, &mut self.buf, 1024 * 1024)
            .await
            .map_err(|e| e.to_string())?;
        resp_value::decode(&reply, 4)
            .map(|(v, _)| v)
            .map_err(|e| e.to_string())
    }
}

/// Logs the connection in as the script user. `Ok(true)`: it is; `Ok(false)`: the user is
/// known to be unavailable, the connection stays the proxy's own user (its scripts are then
/// refused, or run unconfined under `upstream.unconfined_scripts: run`). A failure while the
/// user was believed usable is an error, so no connection a session counts on to be confined
/// is handed out unconfined.
pub(crate) async fn log_in(ask: &mut impl Ask, user: &ScriptUser) -> Result<bool, Failure> {
    if !user.available() {
        return Ok(false);
    }
    let was_ready = matches!(*user.state(), State::Ready { .. });
    let outcome = match auth(ask, user).await {
        Ok(true) => Ok(()),
        // Retired while this login was on its way (a graceful shutdown deletes the user):
        // not set up again.
        Ok(false) if !user.available() => return Ok(false),
        Ok(false) => match set_up(ask, user).await {
            Ok(proxy_user) => match auth(ask, user).await {
                Ok(true) => {
                    user.set_state(State::Ready { proxy_user });
                    Ok(())
                }
                Ok(false) => Err(Failure::Refused(format!(
                    "AUTH as `{}` refused right after ACL SETUSER",
                    user.name
                ))),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match outcome {
        Ok(()) => Ok(true),
        Err(Failure::Refused(why)) => {
            user.set_state(State::Unavailable(why.clone()));
            if was_ready {
                Err(Failure::Refused(why))
            } else {
                Ok(false)
            }
        }
        Err(e) => Err(e),
    }
}

/// `AUTH` as the script user: `Ok(false)` when Redis refused the login (no such user yet).
async fn auth(ask: &mut impl Ask, user: &ScriptUser) -> Result<bool, Failure> {
    match ask
        .ask(&["AUTH", &user.name, user.password()])
        .await
        .map_err(Failure::Transient)?
    {
        Value::String(ok) if &ok[..] == b"OK" => Ok(true),
        Value::Error(e) if e.starts_with("WRONGPASS") => Ok(false),
        Value::Error(e) => Err(refusal(format!("AUTH as the script user: {e}"), &e)),
        other => Err(Failure::Refused(format!("AUTH answered {other:?}"))),
    }
}

/// Creates (or updates) the script user on the node `ask` talks to, as the proxy's own user;
/// returns that user's name.
pub(crate) async fn set_up(ask: &mut impl Ask, user: &ScriptUser) -> Result<String, Failure> {
    let proxy_user = match call(ask, &["ACL", "WHOAMI"]).await? {
        Value::String(u) => String::from_utf8_lossy(&u).into_owned(),
        other => return Err(Failure::Refused(format!("ACL WHOAMI answered {other:?}"))),
    };
    let getuser = call(ask, &["ACL", "GETUSER", &proxy_user]).await?;
    let denials = user.denials();
    let mut first_args_ok = Vec::new();
    for (command, arg) in &denials.first_args {
        // Given back only when the proxy's user may run it; a user without DRYRUN rights
        // simply does not get it back.
        let dry = ask
            .ask(&["ACL", "DRYRUN", &proxy_user, command, arg])
            .await
            .map_err(Failure::Transient)?;
        match &dry {
            Value::String(ok) if &ok[..] == b"OK" => {
                first_args_ok.push((command.clone(), arg.clone()));
            }
            Value::Error(e) if is_transient(e) => {
                return Err(Failure::Transient(format!("ACL DRYRUN: {e}")));
            }
            _ => {}
        }
    }
    let mut args = setuser_args(
        &user.name,
        user.password(),
        &getuser,
        &denials,
        &first_args_ok,
    )
    .map_err(Failure::Refused)?;
    // A removal naming a command this Redis does not have is refused by ACL SETUSER; a
    // script cannot call it there either, so it is dropped and the rest sent again.
    for _ in 0..64 {
        let mut full = vec!["ACL", "SETUSER"];
        full.extend(args.iter().map(String::as_str));
        match ask.ask(&full).await.map_err(Failure::Transient)? {
            Value::String(ok) if &ok[..] == b"OK" => return Ok(proxy_user),
            Value::Error(e) => match unknown_removal(&e) {
                Some(bad) if args.iter().any(|a| a == bad) => {
                    let bad = bad.to_string();
                    args.retain(|a| *a != bad);
                }
                _ => {
                    return Err(refusal(
                        format!("ACL SETUSER {} refused: {e}", user.name),
                        &e,
                    ));
                }
            },
            other => return Err(Failure::Refused(format!("ACL SETUSER answered {other:?}"))),
        }
    }
    Err(Failure::Refused(
        "ACL SETUSER kept refusing removals".into(),
    ))
}

/// A command whose error reply is a refusal (or, for a busy or loading Redis, a transient
/// failure), not a reply.
async fn call(ask: &mut impl Ask, args: &[&str]) -> Result<Value, Failure> {
    match ask.ask(args).await.map_err(Failure::Transient)? {
        Value::Error(e) => Err(refusal(format!("{}: {e}", args.join(" ")), &e)),
        v => Ok(v),
    }
}

/// `what` failed with Redis's error `e`: transient when Redis only could not take the command
/// now, a refusal otherwise.
fn refusal(what: String, e: &str) -> Failure {
    if is_transient(e) {
        Failure::Transient(what)
    } else {
        Failure::Refused(what)
    }
}

/// Error codes that say "not now" rather than "no": a script running (`BUSY`), a dataset
/// loading (`LOADING`), a replica without its primary (`MASTERDOWN`), a cluster mid-change
/// (`TRYAGAIN`, `CLUSTERDOWN`).
pub(crate) fn is_transient(e: &str) -> bool {
    let code = e.split(' ').next().unwrap_or("");
    ["BUSY", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN"].contains(&code)
}

/// The `-command` modifier Redis's `ACL SETUSER` error names as an unknown command
/// (`ERR Error in ACL SETUSER modifier '-foo': Unknown command`).
fn unknown_removal(error: &str) -> Option<&str> {
    if !error.contains("Unknown command") {
        return None;
    }
    let start = error.find("modifier '")? + "modifier '".len();
    let end = start + error[start..].find('\'')?;
    let modifier = &error[start..end];
    modifier.starts_with('-').then_some(modifier)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unknown_removal_is_named() {
        assert_eq!(
            super::unknown_removal("ERR Error in ACL SETUSER modifier '-waitaof': Unknown command"),
            Some("-waitaof")
        );
        assert_eq!(
            super::unknown_removal("ERR Error in ACL SETUSER modifier '~x': Syntax error"),
            None
        );
    }

    #[test]
    fn busy_and_loading_are_not_refusals() {
        use super::{Failure, refusal};
        for e in [
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "LOADING Redis is loading the dataset in memory",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        ] {
            assert!(
                matches!(refusal("ACL GETUSER app".into(), e), Failure::Transient(_)),
                "{e}"
            );
        }
        for e in [
            "NOPERM User app has no permissions to run the 'acl|getuser' command",
            "BUSYKEY Target key name already exists.",
            "ERR unknown command",
        ] {
            assert!(
                matches!(refusal("ACL GETUSER app".into(), e), Failure::Refused(_)),
                "{e}"
            );
        }
    }
}
