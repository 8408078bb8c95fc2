//! The `scripts` rule: which Lua scripts and functions a tenant may run. A proxy cannot read
//! Lua, so it judges a script by its identity: the SHA1 of an EVAL body (what EVALSHA names),
//! or the name FCALL calls. `allow: listed` lets through only what the operator reviewed;
//! `none` refuses scripting altogether; `all` restricts nothing (with `tenants:` it documents
//! that a tenant, operators say, may run anything).
//!
//! Registering code is refused under `listed` and `none` too: `FUNCTION LOAD REPLACE` could
//! give a listed function name new code, and `SCRIPT LOAD` of an unlisted body is only useful
//! to run it. The ACL the proxy applies to its upstream user (`policy::acl`) bounds what even
//! a listed script can call.

use super::config::{ScriptsAllow, ScriptsConfig};
use super::line::CommandLine;
use crate::commands::CommandSpec;

/// The commands the rule is indexed by.
pub(crate) const COMMANDS: &[&str] = &[
    "eval",
    "eval_ro",
    "evalsha",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
    "script|load",
    "function|load",
    "function|restore",
    "function|delete",
    "function|flush",
];

/// A compiled `scripts:` rule.
#[derive(Debug)]
pub(crate) struct Scripts {
    /// What may run.
    allow: ScriptsAllow,
    /// SHA1 digests of the EVAL bodies (and so EVALSHA names) allowed under `listed`.
    sha1: Vec<[u8; 20]>,
    /// Function names FCALL/FCALL_RO may call under `listed` (Redis names functions
    /// globally, whatever library registered them).
    functions: Vec<Vec<u8>>,
}

impl Scripts {
    /// Compiles the section; `Err` names what is wrong.
    pub(crate) fn compile(c: &ScriptsConfig) -> Result<Scripts, String> {
        let mut sha1 = Vec::new();
        for hex in &c.sha1 {
            match parse_sha1(hex.trim().as_bytes()) {
                Some(d) => sha1.push(d),
                None => {
                    return Err(format!(
                        "`{hex}` is not a SHA1 digest (40 hex digits: sha1sum script.lua)"
                    ));
                }
            }
        }
        if c.allow != ScriptsAllow::Listed && (!c.sha1.is_empty() || !c.functions.is_empty()) {
            return Err("`sha1` and `functions` only go with `allow: listed`".into());
        }
        Ok(Scripts {
            allow: c.allow,
            sha1,
            functions: c.functions.iter().map(|f| f.as_bytes().to_vec()).collect(),
        })
    }

    /// The reason to refuse `line`, if the rule refuses it.
    pub(crate) fn refusal<L: CommandLine + ?Sized>(
        &self,
        spec: &CommandSpec,
        line: &L,
    ) -> Option<String> {
        let upper = || spec.name.to_ascii_uppercase().replace('|', " ");
        match self.allow {
            ScriptsAllow::All => None,
            ScriptsAllow::None => Some(format!("{} is not allowed: no scripts", upper())),
            ScriptsAllow::Listed => {
                let arg = |i: usize| (i < line.argc()).then(|| line.arg(i));
                match spec.name {
                    "eval" | "eval_ro" | "script|load" => {
                        let body = arg(if spec.name == "script|load" { 2 } else { 1 })?;
                        let digest = sha1_smol::Sha1::from(body).digest();
                        (!self.sha1.contains(&digest.bytes())).then(|| {
                            format!("{} of a script that is not listed (sha1 {digest})", upper())
                        })
                    }
                    "evalsha" | "evalsha_ro" => {
                        let named = arg(1)?;
                        let listed = parse_sha1(named).is_some_and(|d| self.sha1.contains(&d));
                        (!listed).then(|| {
                            format!(
                                "{} of a script that is not listed (sha1 {})",
                                upper(),
                                String::from_utf8_lossy(named)
                            )
                        })
                    }
                    "fcall" | "fcall_ro" => {
                        let name = arg(1)?;
                        (!self.functions.iter().any(|f| f == name)).then(|| {
                            format!(
                                "{} of function `{}`, which is not listed",
                                upper(),
                                String::from_utf8_lossy(name)
                            )
                        })
                    }
                    // FUNCTION LOAD/RESTORE/DELETE/FLUSH: would change what listed names run.
                    _ => Some(format!(
                        "{} would change the code that listed functions run",
                        upper()
                    )),
                }
            }
        }
    }
}

/// 40 hex digits (any case) as the 20 bytes of a SHA1.
fn parse_sha1(hex: &[u8]) -> Option<[u8; 20]> {
    if hex.len() != 40 {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16);
    let mut out = [0u8; 20];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = (digit(hex[2 * i])? * 16 + digit(hex[2 * i + 1])?) as u8;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands;

    fn rule(allow: ScriptsAllow, sha1: &[&str], functions: &[&str]) -> Scripts {
        Scripts::compile(&ScriptsConfig {
            allow,
            sha1: sha1.iter().map(|s| s.to_string()).collect(),
            functions: functions.iter().map(|s| s.to_string()).collect(),
        })
        .unwrap()
    }

    fn refusal(r: &Scripts, args: &[&str]) -> Option<String> {
        let spec = commands::lookup_args(args).unwrap();
        r.refusal(spec, args)
    }

    #[test]
    fn listed_scripts_and_functions_run_and_nothing_else() {
        // sha1("return 1")
        let sha = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db";
        let r = rule(ScriptsAllow::Listed, &[sha], &["put"]);
        assert_eq!(refusal(&r, &["EVAL", "return 1", "0"]), None);
        assert_eq!(refusal(&r, &["evalsha", &sha.to_uppercase(), "0"]), None);
        assert_eq!(refusal(&r, &["SCRIPT", "LOAD", "return 1"]), None);
        assert_eq!(refusal(&r, &["FCALL_RO", "put", "0"]), None);
        let no = refusal(&r, &["EVAL", "return 2", "0"]).unwrap();
        assert_eq!(
            no,
            "EVAL of a script that is not listed (sha1 7f923f79fe76194c868d7e1d0820de36700eb649)"
        );
        assert!(refusal(&r, &["EVALSHA", "nope", "0"]).is_some());
        assert!(
            refusal(&r, &["FCALL", "drop", "0"])
                .unwrap()
                .contains("function `drop`")
        );
        assert!(
            refusal(&r, &["FUNCTION", "LOAD", "x"])
                .unwrap()
                .contains("FUNCTION LOAD")
        );
        assert!(refusal(&r, &["FUNCTION", "FLUSH"]).is_some());
    }

    #[test]
    fn none_refuses_all_scripting_and_all_allows_it() {
        let none = rule(ScriptsAllow::None, &[], &[]);
        assert!(
            refusal(&none, &["EVAL_RO", "return 1", "0"])
                .unwrap()
                .contains("no scripts")
        );
        let all = rule(ScriptsAllow::All, &[], &[]);
        assert_eq!(refusal(&all, &["EVAL", "return 1", "0"]), None);
        assert!(
            Scripts::compile(&ScriptsConfig {
                allow: ScriptsAllow::All,
                sha1: vec!["e0e1f9fabfc9d4800c877a703b823ac0578ff8db".into()],
                functions: vec![],
            })
            .is_err()
        );
    }
}
