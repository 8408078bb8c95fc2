//! The Redis ACL that mirrors the policy's deny rules for the proxy's own upstream user.
//!
//! A proxy cannot read Lua: `EVAL "return redis.call('KEYS','*')" 0` reaches Redis as EVAL,
//! and the script runs KEYS as the user the proxy logged in as. Redis applies ACLs inside
//! scripts too, so the user's ACL is where a script's reach is closed: every command the
//! policy refuses to every tenant, and that a script can call (it lacks Redis's `noscript`
//! flag), is removed from the user with `-<command>`. The proxy itself never sends those
//! commands for clients (it refuses them), so the ACL changes nothing else.
//!
//! What the ACL cannot mirror is reported as a [`Gap`]: a rule that applies to some tenants
//! only (one upstream user serves every tenant), and a command the proxy itself needs.

use std::fmt::Write;

use super::{Kind, Mode, Policy};
use crate::commands::{self, CommandFlags, CommandSpec};

/// Commands the proxy sends on its own behalf (TTL rule, rate limits, topology, health,
/// survey): never removed from its user, whatever the rules say.
const PROXY_NEEDS: &[&str] = &[
    "pexpire",
    "persist",
    "ping",
    "info",
    "role",
    "hello",
    "auth",
    "select",
    "reset",
    "readonly",
    "asking",
    "cluster|shards",
    "cluster|slots",
    "evalsha",
    "eval",
    "script|load",
    "scan",
    "type",
    "pttl",
    "strlen",
    "memory|usage",
    "acl|whoami",
    "acl|dryrun",
    "acl|setuser",
];

/// One command the ACL removes from the proxy's user.
#[derive(Debug, Clone)]
pub(crate) struct Denied {
    /// The command or subcommand (`keys`, `config|set`).
    pub(crate) spec: &'static CommandSpec,
    /// A rule's `unless_arg`, allowed again as the first argument (`+flushall|async`): ACLs
    /// can allow a first argument, not a word anywhere.
    pub(crate) first_arg: Option<String>,
}

/// A denial the ACL does not mirror: scripts can still run the command.
#[derive(Debug, Clone)]
pub(crate) struct Gap {
    /// The command.
    pub(crate) spec: &'static CommandSpec,
    /// The rule that denies it to clients.
    pub(crate) rule: String,
    /// Why the ACL cannot deny it too.
    pub(crate) why: &'static str,
}

/// The ACL for the proxy's upstream user, and what it leaves open.
#[derive(Debug, Default)]
pub(crate) struct ScriptAcl {
    /// Commands removed from the user, in command-table order.
    pub(crate) denied: Vec<Denied>,
    /// Denials scripts can still get around.
    pub(crate) gaps: Vec<Gap>,
}

impl ScriptAcl {
    /// The ACL mirroring `policy`'s enforced deny rules.
    pub(crate) fn of(policy: &Policy) -> ScriptAcl {
        let mut acl = ScriptAcl::default();
        for spec in commands::all_commands() {
            // A script cannot call a `noscript` command (ACL, CONFIG SET, MULTI, SUBSCRIBE…),
            // and a container is named by its subcommands.
            if spec.is_container() || spec.flags.contains(CommandFlags::NOSCRIPT) {
                continue;
            }
            let Some(rules) = policy.by_command.get(&(spec as *const _ as usize)) else {
                continue;
            };
            let enforced =
                rules
                    .iter()
                    .map(|&r| &policy.rules[r])
                    .filter_map(|rule| match &rule.kind {
                        Kind::Deny { unless_arg } if rule.mode == Mode::Enforce => {
                            Some((rule, unless_arg))
                        }
                        _ => None,
                    });
            let needed = PROXY_NEEDS.contains(&spec.name);
            let mut gaps = Vec::new();
            let mut mirrored = None;
            for (rule, unless_arg) in enforced {
                let why = if rule.tenants.is_some() {
                    "the rule applies to some tenants only; one upstream user serves all"
                } else if rule.share.is_some() {
                    "the rule is enforced for a share of clients only; one upstream user serves all"
                } else if needed {
                    "the proxy sends it itself"
                } else {
                    mirrored = Some(Denied {
                        spec,
                        first_arg: unless_arg
                            .as_ref()
                            .map(|w| String::from_utf8_lossy(w).to_ascii_lowercase()),
                    });
                    break;
                };
                gaps.push(Gap {
                    spec,
                    rule: rule.id.clone(),
                    why,
                });
            }
            match mirrored {
                Some(d) => acl.denied.push(d),
                None => acl.gaps.extend(gaps),
            }
        }
        acl
    }

    /// The ACL rules: only removals, one `-<command>` per denied command, so that applied
    /// to any user (a least-privilege one included) they take rights away and never grant
    /// one. An `unless_arg` cannot be mirrored by removals alone (`+flushdb|async` would grant
    /// FLUSHDB ASYNC to a user that never had FLUSHDB): the whole command is removed, and
    /// [`ScriptAcl::narrowed`] names what that refuses beyond the policy.
    pub(crate) fn rules(&self) -> Vec<String> {
        self.denied
            .iter()
            .map(|d| format!("-{}", d.spec.name))
            .collect()
    }

    /// The commands the removals refuse although the policy allows them with their
    /// `unless_arg` (`FLUSHDB ASYNC`), as `COMMAND ARG`, for the operator's notes.
    pub(crate) fn narrowed(&self) -> Vec<String> {
        self.denied
            .iter()
            .filter_map(|d| {
                let word = d.first_arg.as_ref()?;
                Some(format!(
                    "{} {}",
                    d.spec.name.to_ascii_uppercase().replace('|', " "),
                    word.to_ascii_uppercase()
                ))
            })
            .collect()
    }

    /// `ACL SETUSER <user> <rules…>`, as one line for redis-cli.
    pub(crate) fn setuser_line(&self, user: &str) -> String {
        let mut line = format!("ACL SETUSER {user}");
        for r in self.rules() {
            let _ = write!(line, " {r}");
        }
        line
    }

    /// `ACL DRYRUN <user> <command…>` for each denied command, with placeholder arguments up
    /// to its arity (DRYRUN checks the arity too). `OK` means the user, and so a script, may
    /// run it.
    pub(crate) fn dryruns(&self, user: &str) -> Vec<(&'static CommandSpec, Vec<String>)> {
        self.denied
            .iter()
            .map(|d| {
                let mut args = vec!["ACL".to_string(), "DRYRUN".into(), user.to_string()];
                args.extend(d.spec.name.split('|').map(str::to_string));
                let needed = d.spec.arity.unsigned_abs() as usize;
                while args.len() - 3 < needed {
                    args.push("x".into());
                }
                (d.spec, args)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::RuleConfig;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct File {
        rules: Vec<RuleConfig>,
        #[serde(default)]
        access: crate::policy::config::Access,
    }

    fn acl(yaml: &str) -> ScriptAcl {
        let f: File = serde_saphyr::from_str(yaml).unwrap();
        let p = Policy::compile_full(
            &f.rules,
            &f.access,
            std::sync::Arc::new(crate::policy::ratelimit::MonotonicClock::new()),
        )
        .unwrap();
        ScriptAcl::of(&p)
    }

    #[test]
    fn scriptable_denials_become_acl_rules_and_noscript_ones_are_left_out() {
        let a = acl(
            "rules:\n  - id: k\n    deny: [KEYS, FLUSHALL, config|set, MULTI]\n  - id: f\n    deny: [FLUSHDB]\n    unless_arg: async\n  - id: audit\n    deny: [DEBUG]\n    mode: audit\n",
        );
        assert_eq!(
            a.setuser_line("proxy"),
            "ACL SETUSER proxy -flushall -flushdb -keys"
        );
        assert!(a.gaps.is_empty(), "{:?}", a.gaps);
        assert_eq!(a.narrowed(), ["FLUSHDB ASYNC"]);
        let runs = a.dryruns("proxy");
        assert_eq!(runs[2].1, ["ACL", "DRYRUN", "proxy", "keys", "x"]);
    }

    #[test]
    fn what_the_acl_cannot_mirror_is_a_gap() {
        let a = acl(
            "access:\n  identities:\n    - {tenant: admin, cidr: 10.0.0.0/8}\nrules:\n  - id: k\n    deny: [KEYS, PEXPIRE]\n    except_tenants: [admin]\n  - id: p\n    deny: [PEXPIRE]\n",
        );
        assert!(a.rules().is_empty());
        let gaps: Vec<(&str, &str)> = a
            .gaps
            .iter()
            .map(|g| (g.spec.name, g.rule.as_str()))
            .collect();
        assert_eq!(gaps, [("keys", "k"), ("pexpire", "k"), ("pexpire", "p")]);
    }
}
