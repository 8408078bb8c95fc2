//! `--print-acl FILE`: the `ACL SETUSER` line that makes the proxy's upstream user unable to
//! run, from a script, what the policy denies (`policy::acl`). The line on stdout, so it can be
//! piped to `redis-cli`; what the ACL cannot mirror on stderr.

use std::path::Path;

use crate::policy::acl::ScriptAcl;

/// The line for the policy at `path`, and notes about what it cannot mirror; `Err` with every
/// problem of the file.
pub fn print_acl(path: &Path) -> Result<(String, Vec<String>), String> {
    let config = crate::setup::load(path).map_err(|e| e.to_string())?;
    let policy = crate::setup::policy_or_report(&config, path)?;
    let acl = ScriptAcl::of(&policy);
    let user = config.upstream.username.as_deref().unwrap_or("default");
    let notes = acl
        .gaps
        .iter()
        .map(|g| {
            format!(
                "# not in the ACL: {} (rule {}): {}",
                g.spec.name.to_ascii_uppercase().replace('|', " "),
                g.rule,
                g.why
            )
        })
        .collect();
    Ok((acl.setuser_line(user), notes))
}
