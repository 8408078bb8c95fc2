//! At start and after each reload, what scripts may run (`upstream.script_acl`), told in a log
//! line, `rpp_script_acl_open_commands` and a `/readyz` detail.
//!
//! - `confine` (default): the script user (`script_user`) is set up, or updated to the new
//!   policy's denials, and checked with `ACL DRYRUN`; when it cannot be, the proxy says why
//!   and what scripts get (`upstream.unconfined_scripts`).
//! - `check`: scripts run as the proxy's upstream user; the proxy asks Redis whether that
//!   user may run the commands the policy denies (`ACL DRYRUN`) and warns when it may.
//! - `apply`: first removes those commands from the proxy's own user (`policy::acl`'s
//!   removals), then checks.
//!
//! In cluster mode the node the proxy's home pool points at is set up and checked here; every
//! other node gets the script user when the proxy first opens a dedicated connection to it
//! (`upstream::script_login`), each from its own ACL. In Sentinel mode the current primary
//! (a new one gets the user the same way).

use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::config::ScriptAclMode;
use crate::observe::metrics::Metrics;
use crate::policy::Policy;
use crate::policy::acl::ScriptAcl;
use crate::policy::script_user::{Denials, ScriptUser, State};
use crate::protocol::resp_value::{self, Value};
use crate::upstream::pool::Control;
use crate::upstream::script_login::{self, Ask, Failure};

/// Seconds between attempts to set up a script user found unavailable.
const RETRY_UNAVAILABLE: u32 = 30;

/// The latest check's outcome, in words, for `/readyz`; `None` before the first.
pub(crate) type Status = Arc<ArcSwapOption<String>>;

/// What one check found.
#[derive(Debug)]
pub(crate) struct Report {
    /// The upstream user (`ACL WHOAMI`).
    pub(crate) user: String,
    /// Whether this check set the user's ACL.
    pub(crate) applied: bool,
    /// Denied commands the user, and so a script, may run.
    pub(crate) open: Vec<&'static str>,
    /// Denials the ACL cannot mirror (rules for some tenants, commands the proxy needs).
    pub(crate) gaps: Vec<&'static str>,
    /// Under `confine`: the script user's name, and why scripts cannot run as it (`None`
    /// when they can).
    pub(crate) confine: Option<(String, Option<String>)>,
    /// Under `confine`: scripts that cannot run confined run anyway
    /// (`upstream.unconfined_scripts: run`).
    pub(crate) run_unconfined: bool,
}

impl Report {
    /// The report in one line, for the log and `/readyz`.
    pub(crate) fn summary(&self) -> String {
        let mut text = if let Some((name, Some(why))) = &self.confine {
            format!(
                "scripts cannot run as the proxy's script user `{name}`: {why}; {}",
                if self.run_unconfined {
                    format!(
                        "they run unconfined as upstream user `{}` and can run what the policy \
                         denies (upstream.unconfined_scripts: run)",
                        self.user
                    )
                } else {
                    "they are refused (upstream.unconfined_scripts: refuse)".to_string()
                }
            )
        } else if let Some((name, None)) = &self.confine {
            if self.open.is_empty() {
                format!(
                    "scripts run as `{name}`: upstream user `{}`'s rights without the commands \
                     the policy denies",
                    self.user
                )
            } else {
                format!(
                    "scripts run as `{name}`, which can still run what the policy denies: {}",
                    self.open.join(", ").to_ascii_uppercase()
                )
            }
        } else if self.open.is_empty() {
            format!(
                "upstream user `{}` cannot run the commands the policy denies{}",
                self.user,
                if self.applied { " (ACL applied)" } else { "" }
            )
        } else {
            format!(
                "scripts could run what the policy denies as upstream user `{}`: {} (redis-policy-proxy --print-acl FILE, or upstream.script_acl: apply)",
                self.user,
                self.open.join(", ").to_ascii_uppercase()
            )
        };
        if !self.gaps.is_empty() {
            text.push_str(&format!(
                "; not mirrored by the ACL: {}",
                self.gaps.join(", ").to_ascii_uppercase()
            ));
        }
        text
    }
}

/// Checks (and applies, per `mode`) the upstream user's ACL whenever the policy changes,
/// retrying every second until the upstream answers. Runs until the proxy stops.
pub(crate) async fn watch(
    control: Control,
    policy: Arc<ArcSwap<Policy>>,
    mode: ScriptAclMode,
    metrics: Arc<Metrics>,
    status: Status,
) {
    if mode == ScriptAclMode::Off {
        return;
    }
    let script_user = metrics.script_user.load_full();
    // The policy last checked, by identity: a reload stores a new one.
    let mut checked: Option<Arc<Policy>> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // Ticks since the script user was found unavailable: tried again every
    // `RETRY_UNAVAILABLE` (the operator may grant the rights, a loading Redis may finish).
    let mut unavailable_for = 0u32;
    loop {
        tick.tick().await;
        let current = policy.load_full();
        let retry = script_user
            .as_ref()
            .is_some_and(|u| matches!(*u.state(), State::Unavailable(_)))
            && {
                unavailable_for += 1;
                unavailable_for % RETRY_UNAVAILABLE == 0
            };
        if !retry && checked.as_ref().is_some_and(|c| Arc::ptr_eq(c, &current)) {
            continue;
        }
        let report = match (&script_user, mode) {
            (Some(user), ScriptAclMode::Confine) => confine(&control, &current, user).await,
            _ => check(&control, &current, mode).await,
        };
        match report {
            Ok(report) => {
                let summary = report.summary();
                let unconfined = report
                    .confine
                    .as_ref()
                    .is_some_and(|(_, why)| why.is_some());
                if report.open.is_empty() && !unconfined {
                    tracing::info!(status = %summary, "script ACL checked");
                } else {
                    tracing::warn!(status = %summary, "script ACL: scripts can bypass the policy");
                }
                metrics.script_acl_open.set(report.open.len() as i64);
                if unconfined {
                    // Refused scripts leave nothing open; unconfined ones leave every denial.
                    let open = if report.run_unconfined {
                        ScriptAcl::of(&current).denied.len()
                    } else {
                        0
                    };
                    metrics.script_acl_open.set(open as i64);
                }
                status.store(Some(Arc::new(summary)));
                checked = Some(current);
            }
            Err(why) => {
                // Logged once per policy, not every second.
                if status.load().as_deref().is_none_or(|s| !s.contains(&why)) {
                    tracing::warn!(error = %why, "script ACL not checked; retrying");
                }
                status.store(Some(Arc::new(format!("script ACL not checked: {why}"))));
            }
        }
    }
}

/// One check: who the user is, the ACL set if `mode` says so, then a DRYRUN per denied
/// command.
pub(crate) async fn check(
    control: &Control,
    policy: &Policy,
    mode: ScriptAclMode,
) -> Result<Report, String> {
    let acl = ScriptAcl::of(policy);
    let user = match ask(control, &["ACL", "WHOAMI"]).await? {
        Value::String(u) => String::from_utf8_lossy(&u).into_owned(),
        other => return Err(format!("ACL WHOAMI answered {other:?}")),
    };
    let mut applied = false;
    if mode == ScriptAclMode::Apply && !acl.denied.is_empty() {
        let mut args = vec!["ACL".to_string(), "SETUSER".into(), user.clone()];
        args.extend(acl.rules());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match ask(control, &args).await? {
            Value::String(ok) if &ok[..] == b"OK" => applied = true,
            Value::Error(e) => return Err(format!("ACL SETUSER {user} refused: {e}")),
            other => return Err(format!("ACL SETUSER answered {other:?}")),
        }
    }
    let mut open = Vec::new();
    for (spec, args) in acl.dryruns(&user) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match ask(control, &args).await? {
            // DRYRUN answers OK when the user may run the command, and the reason as a bulk
            // string when not.
            Value::String(ok) if &ok[..] == b"OK" => open.push(spec.name),
            Value::String(_) => {}
            Value::Error(e) => return Err(format!("ACL DRYRUN refused: {e}")),
            other => return Err(format!("ACL DRYRUN answered {other:?}")),
        }
    }
    Ok(Report {
        user,
        applied,
        open,
        gaps: acl.gaps.iter().map(|g| g.spec.name).collect(),
        confine: None,
        run_unconfined: false,
    })
}

/// What the script user loses under `policy`: the removals of its enforced deny rules, and
/// the first arguments their `unless_arg` gives back.
pub(crate) fn denials(policy: &Policy) -> Denials {
    let acl = ScriptAcl::of(policy);
    Denials {
        removals: acl.rules(),
        first_args: acl
            .denied
            .iter()
            .filter_map(|d| Some((d.spec.name.to_string(), d.first_arg.clone()?)))
            .collect(),
    }
}

/// `confine`: sets the script user up (or updates it to `policy`'s denials) on the node the
/// control connection reaches, then asks Redis (`ACL DRYRUN`) whether it may run any denied
/// command. A refusal is a report (scripts cannot be confined, and why); only a failed
/// connection is an error, retried.
pub(crate) async fn confine(
    control: &Control,
    policy: &Policy,
    user: &ScriptUser,
) -> Result<Report, String> {
    user.set_denials(denials(policy));
    let acl = ScriptAcl::of(policy);
    let mut ask = ControlAsk(control);
    let mut report = Report {
        user: String::new(),
        applied: false,
        open: Vec::new(),
        gaps: acl.gaps.iter().map(|g| g.spec.name).collect(),
        confine: Some((user.name.clone(), None)),
        run_unconfined: user.run_unconfined,
    };
    match script_login::set_up(&mut ask, user).await {
        Ok(proxy_user) => {
            report.user = proxy_user.clone();
            user.set_state(State::Ready { proxy_user });
        }
        Err(Failure::Refused(why)) => {
            report.user = match ask.ask(&["ACL", "WHOAMI"]).await {
                Ok(Value::String(u)) => String::from_utf8_lossy(&u).into_owned(),
                _ => "(unknown)".into(),
            };
            user.set_state(State::Unavailable(why.clone()));
            report.confine = Some((user.name.clone(), Some(why)));
            return Ok(report);
        }
        Err(Failure::Transient(e)) => return Err(e),
    }
    for (spec, args) in acl.dryruns(&user.name) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match ask.ask(&args).await? {
            Value::String(ok) if &ok[..] == b"OK" => report.open.push(spec.name),
            Value::Error(e) if script_login::is_transient(&e) => {
                return Err(format!("ACL DRYRUN: {e}"));
            }
            // The reason it may not, or an error (a command this Redis does not know).
            _ => {}
        }
    }
    Ok(report)
}

/// At a graceful shutdown, once every session is done: deletes the script user from the node
/// the control connection reaches (each start makes a new one), within `REMOVE_WITHIN`.
/// Other cluster nodes, and a proxy that crashed, leave theirs: a disabled-by-secrecy user
/// (its password was only in memory) named `rpp-scripts-…`, which an operator may delete.
/// A reply that is "not now" (the control connection reconnecting answers `LOADING` at once,
/// Redis busy) is asked again until `REMOVE_WITHIN` is up: answered at once, it left the user
/// behind in a CI run of 2026-12-07 although the deadline was far.
pub(crate) async fn remove(control: &Control, user: &ScriptUser) {
    let deadline = tokio::time::Instant::now() + REMOVE_WITHIN;
    loop {
        let deleted =
            tokio::time::timeout_at(deadline, ask(control, &["ACL", "DELUSER", &user.name])).await;
        let again = match &deleted {
            Ok(Ok(Value::Integer(_))) => {
                tracing::debug!(user = %user.name, "script user deleted");
                return;
            }
            Ok(Ok(Value::Error(e))) => script_login::is_transient(e),
            Ok(Err(_)) => true,
            _ => false,
        };
        if !again || tokio::time::Instant::now() + REMOVE_RETRY >= deadline {
            tracing::debug!(user = %user.name, outcome = ?deleted, "script user not deleted");
            return;
        }
        tokio::time::sleep(REMOVE_RETRY).await;
    }
}

/// Pause between two tries of the script user's deletion (`remove`).
const REMOVE_RETRY: Duration = Duration::from_millis(50);

/// How long a graceful shutdown waits for the script user's deletion: one round trip
/// normally, but the control connection may be reconnecting, or Redis busy (a second was
/// too short on a loaded 2-core machine: the user stayed; CI run of 2026-12-06).
const REMOVE_WITHIN: Duration = Duration::from_secs(5);

/// The control connection as [`Ask`], for `script_login`.
struct ControlAsk<'a>(&'a Control);

impl Ask for ControlAsk<'_> {
    async fn ask(&mut self, args: &[&str]) -> Result<Value, String> {
        ask(self.0, args).await
    }
}

/// Sends one command on the control connection and decodes its reply.
async fn ask(control: &Control, args: &[&str]) -> Result<Value, String> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let reply = control.request(&args).await.map_err(|e| e.to_string())?;
    resp_value::decode(&reply, 4)
        .map(|(v, _)| v)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::Report;

    fn report(confine: Option<(&str, Option<&str>)>, open: Vec<&'static str>) -> Report {
        Report {
            user: "app".into(),
            applied: false,
            open,
            gaps: Vec::new(),
            confine: confine.map(|(n, why)| (n.to_string(), why.map(str::to_string))),
            run_unconfined: false,
        }
    }

    #[test]
    fn the_summary_says_who_scripts_run_as_and_what_they_could_still_run() {
        assert_eq!(
            report(Some(("rpp-scripts-1", None)), vec![]).summary(),
            "scripts run as `rpp-scripts-1`: upstream user `app`'s rights without the commands \
             the policy denies"
        );
        assert_eq!(
            report(Some(("rpp-scripts-1", None)), vec!["keys"]).summary(),
            "scripts run as `rpp-scripts-1`, which can still run what the policy denies: KEYS"
        );
        assert!(
            report(Some(("rpp-scripts-1", Some("NOPERM"))), vec![])
                .summary()
                .ends_with("they are refused (upstream.unconfined_scripts: refuse)")
        );
        assert!(
            report(None, vec!["keys"])
                .summary()
                .starts_with("scripts could run what the policy denies as upstream user `app`")
        );
    }
}
