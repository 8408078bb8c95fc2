//! `--survey FILE`: what the policy would change in the data a Redis already holds, the first
//! thing to run before putting the proxy in front of it. Read-only: `SCAN` (COUNT 100, at most
//! `--sample` keys, at most `--rate` keys a second), then per key `PTTL`, `TYPE` and, for
//! strings under a size rule, `STRLEN`. Reported: keys without a TTL by prefix (and what the
//! TTL rule's `keys` choice does to them), TTLs above the rule's `max`, string values above
//! `max_value_bytes`, key names that do not match `key_pattern`, and keys left with the
//! created-mode marker's far expiry.
//!
//! One node: the standalone upstream, or the node `--upstream` names (in a cluster, run it
//! once per primary).
//!
//! Before anything is read, one connection logs in the way the proxy would (`probe`), so
//! that an upstream that cannot be reached, does not answer or refuses the login is one
//! line naming the address and the cause (exit [`EXIT_UPSTREAM`]), not the pool's retries.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use super::node_link::{connect, login_refused, probe};
use crate::config::UpstreamMode;
use crate::policy::Policy;
use crate::policy::ttl::{MARKED_ABOVE_MS, TtlKeys};
use crate::protocol::resp_value::Value;
use crate::upstream::pool::{Control, PoolSettings};

/// Exit status when the upstream could not be surveyed (unreachable, no answer, login
/// refused, a command refused): sysexits' EX_UNAVAILABLE, apart from 64 (the file or the
/// flags cannot be used), so a script can tell "fix the file" from "fix the network or the
/// credentials".
pub const EXIT_UPSTREAM: u8 = 69;

/// Why a survey did not run to its report.
#[derive(Debug)]
pub enum Failure {
    /// The policy file or the flags cannot be used (exit 64); every problem, one a line.
    Config(String),
    /// The upstream could not be read (exit [`EXIT_UPSTREAM`]): one line naming its
    /// address and the cause.
    Upstream(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Config(s) | Failure::Upstream(s) => f.write_str(s),
        }
    }
}

/// How much of the keyspace to read, and how fast.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Keys read at most.
    pub sample: u64,
    /// Keys read per second at most, so the survey never competes with the application.
    pub rate: u64,
}

/// Examples kept per finding.
const EXAMPLES: usize = 5;

/// A finding: how many keys, and a few of them.
#[derive(Debug, Default)]
pub(crate) struct Finding {
    /// Keys found.
    pub(crate) count: u64,
    /// The first few, with a detail (bytes, TTL).
    pub(crate) examples: Vec<(String, String)>,
}

impl Finding {
    fn add(&mut self, key: &[u8], detail: String) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples
                .push((String::from_utf8_lossy(key).into_owned(), detail));
        }
    }
}

/// Keys of one prefix.
#[derive(Debug, Default)]
pub(crate) struct PrefixCount {
    /// Keys read.
    pub(crate) keys: u64,
    /// Of which without a TTL.
    pub(crate) without_ttl: u64,
}

/// What the survey found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// Keys read.
    pub(crate) scanned: u64,
    /// Whether the SCAN went round the whole keyspace (not stopped by `sample`).
    pub(crate) complete: bool,
    /// By prefix (the TTL rule's, else up to the first `:`).
    pub(crate) prefixes: BTreeMap<String, PrefixCount>,
    /// TTLs above the rule's max.
    pub(crate) ttl_over_max: Finding,
    /// String values above max_value_bytes.
    pub(crate) over_cap: Finding,
    /// Names not matching key_pattern.
    pub(crate) bad_names: Finding,
    /// Keys with the created-mode marker's expiry.
    pub(crate) marked: Finding,
}

/// Runs the survey for the policy file at `path` against `node` (or the file's standalone
/// upstream), in a runtime of its own.
pub fn survey(path: &Path, node: Option<&str>, options: Options) -> Result<String, Failure> {
    let mut config =
        crate::operations::setup::load(path).map_err(|e| Failure::Config(e.to_string()))?;
    match (node, config.upstream.mode.value) {
        (Some(n), _) => config.set_upstream(n.to_string()),
        (None, UpstreamMode::Standalone) => {}
        (None, _) => {
            return Err(Failure::Config(
                "--survey reads one node: give it with --upstream HOST:PORT (in a cluster, each primary)"
                    .into(),
            ));
        }
    }
    let policy = crate::operations::setup::policy(&config).map_err(|p| {
        Failure::Config(
            p.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        )
    })?;
    let settings = PoolSettings::from_config(&config).map_err(Failure::Config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Upstream(format!("cannot start the survey: {e}")))?;
    let addr = config.upstream.address.value.clone();
    runtime.block_on(async {
        probe(&settings.login, |addr, reply| {
            login_refused(
                addr,
                reply,
                &config,
                "the survey's SCAN, PTTL, TYPE and STRLEN",
            )
        })
        .await
        .map_err(Failure::Upstream)?;
        let control = connect(&settings, &addr).await.map_err(Failure::Upstream)?;
        let report = scan(&control, &policy, options)
            .await
            .map_err(|e| Failure::Upstream(format!("survey of {addr} stopped: {e}")))?;
        Ok(render(&report, &policy, &addr, path))
    })
}

/// SCANs and checks each key against the policy's expectations.
async fn scan(control: &Control, policy: &Policy, options: Options) -> Result<Report, String> {
    let expect = policy.expectations();
    let mut report = Report::default();
    let mut cursor = b"0".to_vec();
    let started = tokio::time::Instant::now();
    loop {
        let reply = ask(control, &[b"SCAN", &cursor, b"COUNT", b"100"]).await?;
        let Value::Array(parts) = reply else {
            return Err("SCAN answered something other than a cursor and keys".into());
        };
        let (Some(Value::String(next)), Some(Value::Array(keys))) = (parts.first(), parts.get(1))
        else {
            return Err("SCAN answered an unexpected shape".into());
        };
        for key in keys {
            let Value::String(key) = key else { continue };
            if report.scanned >= options.sample {
                return Ok(report);
            }
            report.scanned += 1;
            check_key(control, &expect, key, &mut report).await?;
        }
        if &next[..] == b"0" {
            report.complete = true;
            return Ok(report);
        }
        cursor = next.to_vec();
        // Stay under the rate: wait until the keys read so far are due.
        let due = Duration::from_secs_f64(report.scanned as f64 / options.rate.max(1) as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Reads one key's TTL, type and (for strings under a size rule) length.
async fn check_key(
    control: &Control,
    expect: &crate::policy::Expectations<'_>,
    key: &[u8],
    report: &mut Report,
) -> Result<(), String> {
    let pttl = match ask(control, &[b"PTTL", key]).await? {
        Value::Integer(n) => n,
        _ => return Ok(()),
    };
    if pttl == -2 {
        return Ok(()); // expired or deleted since SCAN named it
    }
    let prefix = prefix_of(expect, key);
    let entry = report.prefixes.entry(prefix).or_default();
    entry.keys += 1;
    if pttl == -1 {
        entry.without_ttl += 1;
    }
    if pttl > MARKED_ABOVE_MS {
        report.marked.add(key, String::new());
    } else if let Some((_, ttl)) = expect.ttl {
        if let Some(max) = ttl.max_ms.filter(|&m| pttl > 0 && pttl as u64 > m) {
            report
                .ttl_over_max
                .add(key, format!("{} s, max {} s", pttl / 1000, max / 1000));
        }
    }
    if let Some((_, re)) = expect.key_pattern {
        if !re.is_match(key) {
            report.bad_names.add(key, String::new());
        }
    }
    if let Some((_, cap)) = expect.max_value_bytes {
        let is_string =
            matches!(ask(control, &[b"TYPE", key]).await?, Value::String(t) if &t[..] == b"string");
        if is_string {
            if let Value::Integer(len) = ask(control, &[b"STRLEN", key]).await? {
                if len as u64 > cap {
                    report.over_cap.add(key, format!("{len} bytes"));
                }
            }
        }
    }
    Ok(())
}

/// The TTL rule's prefix a key matches, else its name up to the first `:` (included), else
/// `(no prefix)`.
fn prefix_of(expect: &crate::policy::Expectations<'_>, key: &[u8]) -> String {
    if let Some((_, ttl)) = expect.ttl {
        if let Some((p, _)) = ttl.prefixes.iter().find(|(p, _)| key.starts_with(p)) {
            return String::from_utf8_lossy(p).into_owned();
        }
    }
    match key.iter().position(|&b| b == b':') {
        Some(i) => String::from_utf8_lossy(&key[..=i]).into_owned(),
        None => "(no prefix)".into(),
    }
}

/// The report in words.
fn render(r: &Report, policy: &Policy, node: &str, path: &Path) -> String {
    let expect = policy.expectations();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "survey of {node} against {}: {} keys read ({})",
        path.display(),
        r.scanned,
        if r.complete {
            "the whole keyspace"
        } else {
            "a sample: raise --sample to read more"
        }
    );
    let what = match expect.ttl {
        Some((id, t)) if t.keys == TtlKeys::Written => format!(
            "rule `{id}`, keys: written: each gets the TTL of its prefix when it is next written"
        ),
        Some((id, _)) => format!(
            "rule `{id}`, keys: created: writes leave them persistent (MSET, RESTORE and other replacing writes excepted)"
        ),
        None => "no ttl rule".into(),
    };
    let _ = writeln!(out, "keys without a TTL, by prefix ({what}):");
    for (prefix, c) in &r.prefixes {
        let ttl = expect.ttl.map_or(String::new(), |(_, t)| {
            let p = if prefix == "(no prefix)" {
                &b""[..]
            } else {
                prefix.as_bytes()
            };
            match t.ttl_for(p) {
                Some(ms) => format!("; TTL {}", crate::config::rules::format_duration(ms)),
                None => "; TTL none (exempt)".into(),
            }
        });
        let _ = writeln!(out, "  {prefix}: {} of {} keys{ttl}", c.without_ttl, c.keys);
    }
    let max = expect.ttl.and_then(|(id, t)| {
        t.max_ms.map(|m| {
            format!(
                "max {} (rule `{id}`)",
                crate::config::rules::format_duration(m)
            )
        })
    });
    finding(
        &mut out,
        "TTLs above the",
        max,
        &r.ttl_over_max,
        "cut to the max when next set",
    );
    let cap = expect
        .max_value_bytes
        .map(|(id, n)| format!("max_value_bytes {n} (rule `{id}`)"));
    finding(
        &mut out,
        "string values above",
        cap,
        &r.over_cap,
        "writes this size are refused",
    );
    let pattern = expect
        .key_pattern
        .map(|(id, re)| format!("key_pattern {} (rule `{id}`)", re.as_str()));
    finding(
        &mut out,
        "keys not matching",
        pattern,
        &r.bad_names,
        "every command naming them is refused",
    );
    let _ = writeln!(
        out,
        "keys with the keys: created marker's far expiry (a proxy stopped between its two scripts; PERSIST them): {}",
        r.marked.count
    );
    for (k, _) in &r.marked.examples {
        let _ = writeln!(out, "  {k}");
    }
    out
}

/// One finding's lines; `rule` is `None` when the policy has no such rule.
fn finding(out: &mut String, what: &str, rule: Option<String>, f: &Finding, effect: &str) {
    let Some(rule) = rule else {
        let _ = writeln!(out, "{what} …: no such rule");
        return;
    };
    let _ = writeln!(out, "{what} {rule}: {} ({effect})", f.count);
    for (k, detail) in &f.examples {
        if detail.is_empty() {
            let _ = writeln!(out, "  {k}");
        } else {
            let _ = writeln!(out, "  {k} ({detail})");
        }
    }
}

/// Sends one command and decodes its reply; an error reply is an error (`PTTL` refused:
/// NOPERM…), naming the command.
async fn ask(control: &Control, args: &[&[u8]]) -> Result<Value, String> {
    let name = String::from_utf8_lossy(args.first().copied().unwrap_or_default()).into_owned();
    let reply = control.request(args).await.map_err(|e| e.to_string())?;
    answer(&name, &reply)
}

/// The reply to the command `name`, decoded; an error reply as an error naming it.
fn answer(name: &str, reply: &[u8]) -> Result<Value, String> {
    super::node_link::answer(
        name,
        reply,
        "the survey runs PING, SCAN, PTTL, TYPE and STRLEN as upstream.username",
    )
}
