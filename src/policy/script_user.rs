//! The upstream user scripts run as (`upstream.script_acl: confine`).
//!
//! A proxy cannot read Lua: `EVAL "return redis.call('FLUS'..'HALL')" 0` reaches Redis as
//! EVAL, and the script runs as the user of the connection it arrives on. So scripts (EVAL,
//! EVALSHA, FCALL, their `_RO` forms, and the FUNCTION LOAD'ed code FCALL runs) go on
//! dedicated connections logged in as a user the proxy manages: `rpp-scripts-<random>`, with a
//! random password held only in memory, whose ACL is the proxy's own upstream user's
//! (`ACL GETUSER` of `ACL WHOAMI`: commands, keys, channels, selectors) minus every command
//! the deny rules refuse to all tenants. It is never wider than the proxy's own user, and no
//! other upstream user is touched.
//!
//! This module holds the user's identity, what the current policy removes, and what the last
//! attempt to set it up found; [`setuser_args`] builds the `ACL SETUSER` from an `ACL GETUSER`
//! reply. `upstream::script_login` logs dedicated connections in as it (creating it on a node
//! that does not have it yet: a restarted Redis, a new primary, each cluster node), and
//! `script_acl::watch` sets it up at start and after each reload.

use std::io::Read;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::protocol::resp_value::Value;

/// Prefix of every user the proxy manages, so an operator reading `ACL LIST` knows whose it is.
pub(crate) const NAME_PREFIX: &str = "rpp-scripts-";

/// What the current policy takes away from the script user, beyond the proxy user's ACL;
/// made from the policy by `script_acl::denials`, so this module (read by every upstream
/// connection) does not depend on the policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Denials {
    /// `-<command>` per command the deny rules refuse to every tenant (`policy::acl`).
    pub(crate) removals: Vec<String>,
    /// `(command, first argument)` an `unless_arg` allows again (`flushall`, `async`): given
    /// back only when the proxy's user may run it, so the script user never gains a right.
    pub(crate) first_args: Vec<(String, String)>,
}

/// Whether scripts can run as the script user now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// Not tried yet: the next dedicated connection tries (and fails if it cannot).
    Pending,
    /// Set up (last on the node the proxy checks): scripts run confined.
    Ready {
        /// The proxy's own upstream user, whose rights the script user copies.
        proxy_user: String,
    },
    /// Cannot be set up (no right to `ACL GETUSER`/`SETUSER`, Redis before 7, an ACL the
    /// proxy cannot read): why, in the operator's words.
    Unavailable(String),
}

/// The user scripts run as, shared by the watcher, every node's dedicated connections and
/// every session.
#[derive(Debug)]
pub(crate) struct ScriptUser {
    /// `rpp-scripts-<16 hex digits>`: says it is the proxy's, and is unique per process, so
    /// two proxies in front of one Redis (with different policies) never share one.
    pub(crate) name: String,
    /// Random, held only in memory: nothing else can log in as the user.
    password: String,
    /// What the current policy removes; replaced on reload.
    denials: ArcSwap<Denials>,
    /// What the last attempt to set the user up found.
    state: ArcSwap<State>,
    /// `upstream.unconfined_scripts: run`: a script that cannot run confined runs as the
    /// proxy's own user (warned at start) instead of being refused.
    pub(crate) run_unconfined: bool,
}

impl ScriptUser {
    /// A new user (name and password drawn now) removing `denials`.
    pub(crate) fn new(denials: Denials, run_unconfined: bool) -> Arc<ScriptUser> {
        let id = random_hex(8);
        Arc::new(ScriptUser {
            name: format!("{NAME_PREFIX}{id}"),
            password: random_hex(32),
            denials: ArcSwap::from_pointee(denials),
            state: ArcSwap::from_pointee(State::Pending),
            run_unconfined,
        })
    }

    /// The password, for `AUTH` and `ACL SETUSER` only.
    pub(crate) fn password(&self) -> &str {
        &self.password
    }

    /// What the current policy removes.
    pub(crate) fn denials(&self) -> Arc<Denials> {
        self.denials.load_full()
    }

    /// A reload's denials: returns whether they differ (the user must be set again).
    pub(crate) fn set_denials(&self, next: Denials) -> bool {
        if *self.denials.load_full() == next {
            return false;
        }
        self.denials.store(Arc::new(next));
        true
    }

    /// The last attempt's outcome.
    pub(crate) fn state(&self) -> Arc<State> {
        self.state.load_full()
    }

    /// Records an attempt's outcome.
    pub(crate) fn set_state(&self, state: State) {
        self.state.store(Arc::new(state));
    }

    /// Whether a new dedicated connection would run scripts confined (or fail): not once the
    /// user is known to be unavailable.
    pub(crate) fn available(&self) -> bool {
        !matches!(*self.state.load_full(), State::Unavailable(_))
    }
}

/// `n` random bytes from the operating system, as hex.
fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        // No /dev/urandom: std's per-process random hash keys, one 64-bit draw per 8 bytes.
        use std::hash::{BuildHasher, Hasher};
        for chunk in bytes.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(chunk.as_ptr() as usize);
            chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `ACL SETUSER` arguments (after `ACL SETUSER`) that make `name` the proxy user's rights
/// (`getuser`: its `ACL GETUSER` reply, RESP2 or RESP3) minus `denials`. `first_args_ok`: the
/// `(command, argument)` pairs of `denials.first_args` the proxy user may run (ACL DRYRUN),
/// given back only when the user has no selectors (a root `+cmd|arg` could then reach keys
/// only a selector allowed). `Err` says why the ACL cannot be read.
pub(crate) fn setuser_args(
    name: &str,
    password: &str,
    getuser: &Value,
    denials: &Denials,
    first_args_ok: &[(String, String)],
) -> Result<Vec<String>, String> {
    let fields = getuser
        .fields()
        .ok_or_else(|| format!("ACL GETUSER answered {getuser:?}"))?;
    let field = |key: &str| lookup(&fields, key);
    let mut args = vec![
        name.to_string(),
        // Starts from nothing: no password, keys, channels, selectors or commands.
        "reset".into(),
        "resetchannels".into(),
        "on".into(),
        format!(">{password}"),
    ];
    if let Some(Value::Array(flags)) = field("flags") {
        for flag in flags.iter().filter_map(Value::as_str) {
            if flag.eq_ignore_ascii_case(b"skip-sanitize-payload")
                || flag.eq_ignore_ascii_case(b"sanitize-payload")
            {
                args.push(String::from_utf8_lossy(flag).into_owned());
            }
        }
    }
    args.extend(rules(&fields, "the user")?);
    let selectors = match field("selectors") {
        None | Some(Value::Nil) => &[][..],
        Some(Value::Array(s)) => &s[..],
        Some(other) => return Err(format!("ACL GETUSER's `selectors` is {other:?}")),
    };
    for selector in selectors {
        let sel = selector
            .fields()
            .ok_or_else(|| format!("ACL GETUSER's selector is {selector:?}"))?;
        let mut inner = rules(&sel, "a selector")?;
        // A command is allowed when the root or any selector allows it: each loses it.
        inner.extend(denials.removals.iter().cloned());
        args.push(format!("({})", inner.join(" ")));
    }
    args.extend(denials.removals.iter().cloned());
    if selectors.is_empty() {
        for (command, arg) in first_args_ok {
            args.push(format!("+{command}|{arg}"));
        }
    }
    Ok(args)
}

/// A record's field, by name.
fn lookup<'a>(fields: &[(&[u8], &'a Value)], key: &str) -> Option<&'a Value> {
    fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key.as_bytes()))
        .map(|(_, v)| *v)
}

/// A user's or selector's `commands`, `keys` and `channels` rule strings, as ACL rules.
/// Redis 7's layout only; anything else (Redis 6's key lists) is not read: a guess could
/// widen the user.
fn rules(fields: &[(&[u8], &Value)], what: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for key in ["commands", "keys", "channels"] {
        match lookup(fields, key) {
            Some(Value::String(s)) => out.extend(
                String::from_utf8_lossy(s)
                    .split(' ')
                    .filter(|t| !t.is_empty())
                    .map(str::to_string),
            ),
            other => {
                return Err(format!(
                    "ACL GETUSER's `{key}` of {what} is {other:?}, not Redis 7's rule string"
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(resp: &[u8]) -> Value {
        Value::from_resp(resp).unwrap()
    }

    fn denials() -> Denials {
        Denials {
            removals: vec!["-flushall".into(), "-keys".into()],
            first_args: vec![("flushall".into(), "async".into())],
        }
    }

    #[test]
    fn the_script_user_is_the_proxy_users_rights_minus_the_denials() {
        // Redis 7.0's ACL GETUSER of `ACL SETUSER app on >x ~app:* &* -@all +get +set`.
        let reply = value(
            b"*12\r\n$5\r\nflags\r\n*1\r\n$2\r\non\r\n$9\r\npasswords\r\n*1\r\n$3\r\nabc\r\n\
              $8\r\ncommands\r\n$15\r\n-@all +get +set\r\n$4\r\nkeys\r\n$6\r\n~app:*\r\n\
              $8\r\nchannels\r\n$2\r\n&*\r\n$9\r\nselectors\r\n*0\r\n",
        );
        let args = setuser_args("rpp-scripts-1", "pw", &reply, &denials(), &[]).unwrap();
        assert_eq!(
            args.join(" "),
            "rpp-scripts-1 reset resetchannels on >pw -@all +get +set ~app:* &* -flushall -keys"
        );
    }

    #[test]
    fn selectors_lose_the_denials_too_and_first_args_come_back_only_without_them() {
        let reply = value(
            b"%5\r\n+flags\r\n*2\r\n+on\r\n+skip-sanitize-payload\r\n+commands\r\n$5\r\n+@all\r\n\
              +keys\r\n+~*\r\n+channels\r\n+\r\n+selectors\r\n\
              *1\r\n%3\r\n+commands\r\n+-@all +flushall\r\n+keys\r\n+%R~x\r\n+channels\r\n+\r\n",
        );
        let ok = [("flushall".to_string(), "async".to_string())];
        let args = setuser_args("u", "pw", &reply, &denials(), &ok).unwrap();
        assert_eq!(
            args.join(" "),
            "u reset resetchannels on >pw skip-sanitize-payload +@all ~* \
             (-@all +flushall %R~x -flushall -keys) -flushall -keys"
        );
        let plain = value(
            b"%4\r\n+flags\r\n*1\r\n+on\r\n+commands\r\n$5\r\n+@all\r\n+keys\r\n+~*\r\n+channels\r\n+&*\r\n",
        );
        let args = setuser_args("u", "pw", &plain, &denials(), &ok).unwrap();
        assert!(args.ends_with(&["-keys".into(), "+flushall|async".into()]));
    }

    #[test]
    fn an_acl_in_another_layout_is_not_guessed() {
        // Redis 6.2: keys as a list.
        let reply = value(
            b"*8\r\n$5\r\nflags\r\n*0\r\n$9\r\npasswords\r\n*0\r\n$8\r\ncommands\r\n$5\r\n+@all\r\n$4\r\nkeys\r\n*1\r\n$1\r\n*\r\n",
        );
        let err = setuser_args("u", "pw", &reply, &denials(), &[]).unwrap_err();
        assert!(err.contains("`keys`"), "{err}");
        assert!(setuser_args("u", "pw", &Value::Nil, &denials(), &[]).is_err());
    }

    #[test]
    fn names_and_passwords_are_random() {
        let (a, b) = (random_hex(8), random_hex(8));
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
    }
}
