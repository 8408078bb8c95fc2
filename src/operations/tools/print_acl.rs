//! `--print-acl FILE`: the `ACL SETUSER` line that makes the proxy's upstream user unable to
//! run, from a script, what the policy denies (`policy::acl`). The line only takes rights
//! away (`-<command>` each), so it is safe on a least-privilege user. The line on stdout, so it
//! can be piped to `redis-cli`; what the ACL cannot mirror, or refuses beyond the policy, on
//! stderr.

use std::path::Path;

use crate::policy::acl::ScriptAcl;

/// The line for the policy at `path`, and notes about what it cannot mirror; `Err` with every
/// problem of the file.
pub fn print_acl(path: &Path) -> Result<(String, Vec<String>), String> {
    let config = crate::operations::setup::load(path).map_err(|e| e.to_string())?;
    let policy = crate::operations::setup::policy_or_report(&config, path)?;
    let acl = ScriptAcl::of(&policy);
    let user = config.upstream.username.as_deref().unwrap_or("default");
    let mut notes: Vec<String> = acl
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
    notes.extend(acl.narrowed().into_iter().map(|n| {
        format!(
            "# refused by the ACL though the policy allows it: {n} (the line only removes \
             commands; add `+{}` yourself if the user had the command)",
            n.to_ascii_lowercase()
                .replacen(' ', "|", 1)
                .replace(' ', "|")
        )
    }));
    Ok((acl.setuser_line(user), notes))
}
