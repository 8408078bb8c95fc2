//! Scripts run as the proxy's upstream user: at start and after each reload, the proxy asks
//! Redis whether that user may run the commands the policy denies (`ACL DRYRUN`), and warns
//! when it may (a log line, `rpp_script_acl_open_commands`, a `/readyz` detail). With
//! `upstream.script_acl: apply` it first sets the user's command permissions to the mirror of
//! the deny rules (`policy::acl`), so Lua cannot run what the proxy refuses.
//!
//! In cluster mode the node the proxy's home pool points at is checked (each node keeps its
//! own ACL: apply `--print-acl`'s line on every node, or use an ACL file); in Sentinel mode
//! the current primary.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::config::ScriptAclMode;
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::policy::acl::ScriptAcl;
use crate::resp_value::{self, Value};
use crate::upstream::pool::Control;

/// The latest check's outcome, in words, for `/readyz`; `None` before the first.
pub type Status = Arc<ArcSwapOption<String>>;

/// What one check found.
#[derive(Debug)]
pub struct Report {
    /// The upstream user (`ACL WHOAMI`).
    pub user: String,
    /// Whether this check set the user's ACL.
    pub applied: bool,
    /// Denied commands the user, and so a script, may run.
    pub open: Vec<&'static str>,
    /// Denials the ACL cannot mirror (rules for some tenants, commands the proxy needs).
    pub gaps: Vec<&'static str>,
}

impl Report {
    /// The report in one line, for the log and `/readyz`.
    pub fn summary(&self) -> String {
        let mut text = if self.open.is_empty() {
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
pub async fn watch(
    control: Control,
    policy: Arc<ArcSwap<Policy>>,
    mode: ScriptAclMode,
    metrics: Arc<Metrics>,
    status: Status,
) {
    if mode == ScriptAclMode::Off {
        return;
    }
    // The policy last checked, by identity: a reload stores a new one.
    let mut checked: Option<Arc<Policy>> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let current = policy.load_full();
        if checked.as_ref().is_some_and(|c| Arc::ptr_eq(c, &current)) {
            continue;
        }
        match check(&control, &current, mode).await {
            Ok(report) => {
                let summary = report.summary();
                if report.open.is_empty() {
                    tracing::info!(status = %summary, "script ACL checked");
                } else {
                    tracing::warn!(status = %summary, "script ACL: scripts can bypass the policy");
                }
                metrics.script_acl_open.set(report.open.len() as i64);
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
pub async fn check(
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
    if mode == ScriptAclMode::Apply {
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
    })
}

/// Sends one command on the control connection and decodes its reply.
async fn ask(control: &Control, args: &[&str]) -> Result<Value, String> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let reply = control.request(&args).await.map_err(|e| e.to_string())?;
    resp_value::decode(&reply, 4)
        .map(|(v, _)| v)
        .map_err(|e| e.to_string())
}
