//! `--explain FILE [COMMAND]`: what the policy does to commands (inline syntax, quotes as in
//! redis-cli), for a client at an address and of a proxy user: every rule that acts, audited
//! ones included ("would refuse", "would rewrite"), with the prefix behind each TTL and the
//! tenant's namespace, then what is sent, in words. Without COMMAND, one command per line of
//! standard input. The exit status says whether any command would be refused.

use std::fmt::Write;
use std::io::BufRead;
use std::net::IpAddr;
use std::path::Path;

use crate::policy::{Client, Effect, Mode, Policy, Verdict};
use crate::protocol::codec::{self, CodecLimits, Decoded};

/// How `--explain` ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No command would be refused.
    Allowed,
    /// At least one would be.
    Refused,
}

/// Explains `command`, or each line of standard input when it is `None`; `Err` when the file
/// does not validate or a command's quotes do not balance.
pub fn explain(
    path: &Path,
    command: Option<&str>,
    addr: IpAddr,
    user: Option<&str>,
    out: &mut String,
) -> Result<Outcome, String> {
    let mut config =
        crate::operations::setup::load_without_secrets(path).map_err(|e| e.to_string())?;
    // The account is printed; the check's own denial and audit log lines would repeat it.
    config.admin.denial_logs_per_second.value = 0;
    let policy = crate::operations::setup::policy_or_report(&config, path)?;
    let tenant = policy.access.tenant_of(addr, user.map(str::as_bytes));
    let _ = writeln!(
        out,
        "client {addr} user {} -> tenant {}",
        user.unwrap_or("(none)"),
        policy.access.tenant_name(tenant)
    );
    let client = Client {
        id: 0,
        addr,
        tenant,
        user: crate::policy::user_key(user.map(str::as_bytes)),
        again: false,
    };
    let lines: Vec<String> = match command {
        Some(c) => vec![c.to_string()],
        None => std::io::stdin()
            .lock()
            .lines()
            .map_while(Result::ok)
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .collect(),
    };
    // A policy check needs a runtime for the rate limiter's clock.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    let _guard = runtime.enter();
    let script_note = script_note(&config.upstream);
    let mut outcome = Outcome::Allowed;
    for line in &lines {
        if one(&policy, &client, line, script_note, out)? {
            outcome = Outcome::Refused;
        }
    }
    Ok(outcome)
}

/// What a script may call under the file's `upstream.script_acl`, for the note under a script.
fn script_note(upstream: &crate::config::UpstreamConfig) -> &'static str {
    use crate::config::{ScriptAclMode, UnconfinedScripts};
    match (upstream.script_acl.value, upstream.unconfined_scripts.value) {
        (ScriptAclMode::Confine, UnconfinedScripts::Refuse) => {
            "the script runs as the proxy's script user, which cannot call what the deny rules refuse (refused where that user cannot be set up)"
        }
        (ScriptAclMode::Confine, UnconfinedScripts::Run) => {
            "the script runs as the proxy's script user, which cannot call what the deny rules refuse (as the upstream user where that user cannot be set up)"
        }
        _ => {
            "the script runs as the proxy's upstream user, whose ACL decides what it may call (--print-acl)"
        }
    }
}

/// Explains one command line; `Ok(true)` when it would be refused.
fn one(
    policy: &Policy,
    client: &Client,
    line: &str,
    script_note: &str,
    out: &mut String,
) -> Result<bool, String> {
    let args = codec::split_args(line.as_bytes())
        .ok_or_else(|| format!("unbalanced quotes in {line:?}"))?;
    let _ = writeln!(out, "> {line}");
    if args.is_empty() {
        return Ok(false);
    }
    for step in policy.explain(client, &args[..]) {
        let rule = match step.mode {
            Mode::Enforce => step.rule.clone(),
            Mode::Audit => format!("{} (audit)", step.rule),
        };
        let audit = step.mode == Mode::Audit;
        let text = match &step.what {
            Effect::Refuses(reply) if audit => format!("would refuse: {}", reply_text(reply)),
            Effect::Refuses(_) => "refuses".to_string(),
            Effect::Rewrites(note) if audit => format!("would rewrite: {note}"),
            Effect::Rewrites(note) => format!("rewrites: {note}"),
            // `explain` holds every argument: every rule is judged.
            Effect::Unjudged => "not judged".to_string(),
            Effect::Counts(limit) => format!(
                "counts it: {} requests per {} ms",
                limit.requests,
                limit.window.as_millis()
            ),
        };
        let _ = writeln!(out, "  {rule}: {text}");
    }
    if matches!(
        args[0].to_ascii_lowercase().as_slice(),
        b"eval" | b"evalsha" | b"fcall" | b"eval_ro" | b"evalsha_ro" | b"fcall_ro"
    ) {
        let _ = writeln!(out, "  note: {script_note}");
    }
    match policy.check(client, &args[..]) {
        Verdict::Allow => {
            let _ = writeln!(out, "  forwarded unchanged");
            Ok(false)
        }
        Verdict::Refuse(reply) => {
            let _ = writeln!(out, "  refused: {}", reply_text(&reply));
            Ok(true)
        }
        Verdict::Rewrite(rw) => {
            let rw = rw.materialize(&args[..]);
            if let Some(prefix) = policy.access.namespace(client.tenant) {
                let _ = writeln!(
                    out,
                    "  namespace: tenant `{}`'s prefix `{}` on every key",
                    policy.access.tenant_name(client.tenant),
                    String::from_utf8_lossy(prefix)
                );
            }
            for c in rw.before() {
                let _ = writeln!(out, "  first, reply hidden: {}", words(c));
            }
            match &rw.command {
                Some(c) => {
                    let _ = writeln!(out, "  sent as: {}", words(c));
                }
                None => {
                    let _ = writeln!(out, "  sent as written");
                }
            }
            for c in &rw.after {
                let _ = writeln!(out, "  then, reply hidden: {}", words(c));
            }
            Ok(false)
        }
    }
}

/// An error reply without its line ending.
fn reply_text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).trim_end().to_string()
}

/// A RESP command as redis-cli would take it: arguments separated by spaces, quoted where they
/// hold anything but plain characters.
pub(crate) fn words(command: &[u8]) -> String {
    let mut ranges = Vec::new();
    let Ok(Some(Decoded::Command { .. })) =
        codec::decode(command, &CodecLimits::default(), &mut ranges)
    else {
        return String::from_utf8_lossy(command).into_owned();
    };
    ranges
        .iter()
        .map(|r| quote(&command[r.clone()]))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One argument, double-quoted with redis-cli's escapes unless it is plain.
fn quote(arg: &[u8]) -> String {
    let plain = !arg.is_empty()
        && arg
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b":_-.*{}/@$+=,<>[]()~^!?".contains(&b));
    if plain {
        return String::from_utf8_lossy(arg).into_owned();
    }
    let mut out = String::from("\"");
    for &b in arg {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_read_back_as_redis_cli_words() {
        let c = codec::encode(&[b"SET", b"user:1", b"a b", b"say \"hi\"\n", b"\x01"]);
        assert_eq!(words(&c), r#"SET user:1 "a b" "say \"hi\"\n" "\x01""#);
        assert_eq!(words(&codec::encode(&[b"GET", b""])), r#"GET """#);
    }
}
