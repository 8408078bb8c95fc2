//! `redis-policy-proxy replay --policy NEW.yaml LOG`: what a policy would have done to
//! recorded traffic (an audit log, or a MONITOR capture), per rule and tenant, with
//! examples; with two `--policy` files, which commands the change would treat differently.
//! Nothing is sent to Redis: rules run on the recorded command lines (`input`), rate limits
//! on the recorded times.

pub(crate) mod input;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use crate::policy::ratelimit::local::LocalLimiter;
use crate::policy::ratelimit::{Decision, Limit, ManualClock};
use crate::policy::{Client, Effect, Evidence, Mode, Per, Policy};
use input::Record;

/// Examples kept per row of the report by default.
pub const EXAMPLES: usize = 3;

/// Identities tracked per rate-limit rule: a log's distinct connections, addresses or
/// tenants, far above what a capture holds.
const MAX_TRACKED: usize = 1 << 20;

/// What one policy made of one command, as the difference between two policies shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    /// Passed unchanged (audited rules aside).
    Allowed,
    /// Rewritten by this enforced rule (the first that rewrote it).
    Rewritten(String),
    /// Refused by this enforced rate limit.
    RateLimited(String),
    /// Refused by this enforced rule.
    Refused(String),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Allowed => write!(f, "allowed"),
            Verdict::Rewritten(r) => write!(f, "rewritten by {r}"),
            Verdict::RateLimited(r) => write!(f, "rate-limited by {r}"),
            Verdict::Refused(r) => write!(f, "refused by {r}"),
        }
    }
}

/// One row of a policy's report: a rule, a tenant, what the rule did.
#[derive(Default)]
struct Row {
    /// Commands it did this to.
    count: u64,
    /// The first few, as `example` shows them.
    examples: Vec<String>,
}

/// One policy replayed over the log: its rules, their rate limits' state, its tallies.
struct Run {
    /// The file, for the report.
    name: String,
    /// The compiled policy, on `clock`.
    policy: Policy,
    /// Set to each record's time before it is judged.
    clock: ManualClock,
    /// Each rate-limit rule's limiter, made at its first command.
    limiters: HashMap<String, LocalLimiter<ManualClock>>,
    /// `(rule, tenant, action)` → commands and examples.
    rows: BTreeMap<(String, String, &'static str), Row>,
    /// Commands by verdict.
    verdicts: BTreeMap<Verdict, u64>,
}

/// Replays `log` (a path, or `-` for standard input) against each of `policies` (one or
/// two files) and returns the report. `Err` names the file that could not be used.
pub fn replay(policies: &[&Path], log: &Path, examples: usize) -> Result<String, String> {
    let mut runs = policies
        .iter()
        .map(|p| Run::new(p))
        .collect::<Result<Vec<_>, _>>()?;
    let reader: Box<dyn BufRead> = if log.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(log).map_err(|e| format!("{}: {e}", log.display()))?;
        Box::new(std::io::BufReader::new(file))
    };
    let (mut replayed, mut skipped) = (0u64, 0u64);
    let mut evidence = Evidence::Full;
    // Commands the two policies treat differently: (old, new) → commands and examples.
    let mut changes: BTreeMap<(Verdict, Verdict), Row> = BTreeMap::new();
    for line in reader.lines() {
        let line = line.map_err(|e| format!("{}: {e}", log.display()))?;
        let Some(record) = input::parse(&line) else {
            skipped += u64::from(!line.trim().is_empty());
            continue;
        };
        replayed += 1;
        evidence = evidence.min(record.evidence);
        let verdicts: Vec<Verdict> = runs
            .iter_mut()
            .map(|r| r.judge(&record, examples))
            .collect();
        if let [old, new] = &verdicts[..]
            && old != new
        {
            let row = changes.entry((old.clone(), new.clone())).or_default();
            row.count += 1;
            if row.examples.len() < examples {
                row.examples.push(example(&record));
            }
        }
    }
    let mut out = String::new();
    let source = match evidence {
        Evidence::Full => "every argument (MONITOR capture)",
        Evidence::Names => "key names and argument sizes, no values (audit log)",
        Evidence::Sizes => "hashed keys and argument sizes (audit log with keys: hash)",
    };
    let _ = writeln!(
        out,
        "{replayed} commands replayed from {}; {source}",
        log.display()
    );
    if skipped > 0 {
        let _ = writeln!(
            out,
            "{skipped} lines skipped (neither an audit entry nor a client's MONITOR line)"
        );
    }
    for run in &runs {
        run.report(&mut out);
    }
    if let [old, new] = &runs[..] {
        report_changes(&mut out, old, new, &changes);
    }
    Ok(out)
}

impl Run {
    fn new(path: &Path) -> Result<Run, String> {
        let config =
            crate::operations::setup::load_without_secrets(path).map_err(|e| e.to_string())?;
        let clock = ManualClock::new(Duration::ZERO);
        let policy = Policy::compile_full(
            &config.rules,
            &config.access,
            std::sync::Arc::new(clock.clone()),
        )
        .map_err(|problems| {
            let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
            format!("{}: {}", path.display(), text.join("; "))
        })?;
        Ok(Run {
            name: path.display().to_string(),
            policy,
            clock,
            limiters: HashMap::new(),
            rows: BTreeMap::new(),
            verdicts: BTreeMap::new(),
        })
    }

    /// Judges one command: every rule's part tallied, and the command's verdict.
    fn judge(&mut self, record: &Record, examples: usize) -> Verdict {
        self.clock
            .set(Duration::from_micros((record.ts * 1e6).max(0.0) as u64));
        let tenant = self
            .policy
            .access
            .tenant_of(record.addr, record.user.as_deref().map(str::as_bytes));
        let client = Client {
            id: 0,
            addr: record.addr,
            tenant,
            user: crate::policy::user_key(record.user.as_deref().map(str::as_bytes)),
            again: false,
        };
        let tenant_name = self.policy.access.tenant_name(tenant).to_string();
        let steps = self
            .policy
            .explain_judged(&client, &record.line[..], record.evidence);
        let mut verdict = Verdict::Allowed;
        for step in steps {
            let enforced = step.mode == Mode::Enforce;
            let action = match &step.what {
                Effect::Unjudged => "not judged",
                Effect::Refuses(_) if enforced => "refuses",
                Effect::Refuses(_) => "audit: would refuse",
                Effect::Rewrites(_) if enforced => "rewrites",
                Effect::Rewrites(_) => "audit: would rewrite",
                Effect::Counts(limit) => {
                    if !self.limited(&step.rule, *limit, step.per, record, tenant) {
                        continue;
                    }
                    match enforced {
                        true => "rate-limits",
                        false => "audit: would rate-limit",
                    }
                }
            };
            if enforced {
                verdict = verdict.max(match &step.what {
                    Effect::Refuses(_) => Verdict::Refused(step.rule.clone()),
                    Effect::Counts(_) => Verdict::RateLimited(step.rule.clone()),
                    Effect::Rewrites(_) => Verdict::Rewritten(step.rule.clone()),
                    Effect::Unjudged => Verdict::Allowed,
                });
            }
            let row = self
                .rows
                .entry((step.rule, tenant_name.clone(), action))
                .or_default();
            row.count += 1;
            if row.examples.len() < examples {
                row.examples.push(example(record));
            }
        }
        *self.verdicts.entry(verdict.clone()).or_default() += 1;
        verdict
    }

    /// Counts the command against `rule`'s limit at the record's time; whether it is over.
    fn limited(&mut self, rule: &str, limit: Limit, per: Per, r: &Record, tenant: u16) -> bool {
        let key = match per {
            Per::Connection => r.conn.as_bytes().to_vec(),
            Per::Address => r.addr.to_string().into_bytes(),
            Per::Tenant => tenant.to_be_bytes().to_vec(),
        };
        let limiter = match self.limiters.get(rule) {
            Some(l) => l,
            None => {
                let Ok(l) = LocalLimiter::new(limit, MAX_TRACKED, self.clock.clone()) else {
                    return false;
                };
                self.limiters.entry(rule.to_string()).or_insert(l)
            }
        };
        matches!(limiter.check(&key), Ok(Decision::Limited { .. }))
    }

    fn report(&self, out: &mut String) {
        let _ = writeln!(out, "\n{}:", self.name);
        let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
        for (verdict, n) in &self.verdicts {
            let kind = match verdict {
                Verdict::Allowed => "allowed",
                Verdict::Rewritten(_) => "rewritten",
                Verdict::RateLimited(_) => "rate-limited",
                Verdict::Refused(_) => "refused",
            };
            *kinds.entry(kind).or_default() += n;
        }
        let summary: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let _ = writeln!(out, "  commands: {}", summary.join(", "));
        let mut rows: Vec<_> = self
            .rows
            .iter()
            .filter(|((_, _, a), _)| *a != "not judged")
            .collect();
        rows.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
        if rows.is_empty() {
            let _ = writeln!(out, "  no rule acted on these commands");
        }
        for ((rule, tenant, action), row) in rows {
            let _ = writeln!(
                out,
                "  {rule} [{tenant}] {action}: {} commands, e.g. {}",
                row.count,
                row.examples.join(" | ")
            );
        }
        let unjudged: Vec<String> = self
            .rows
            .iter()
            .filter(|((_, _, a), _)| *a == "not judged")
            .map(|((rule, tenant, _), row)| format!("{rule} [{tenant}] {} commands", row.count))
            .collect();
        if !unjudged.is_empty() {
            let _ = writeln!(
                out,
                "  not judged (the rule reads argument values the log does not hold; replay a MONITOR capture): {}",
                unjudged.join(", ")
            );
        }
    }
}

fn report_changes(
    out: &mut String,
    old: &Run,
    new: &Run,
    changes: &BTreeMap<(Verdict, Verdict), Row>,
) {
    let total: u64 = changes.values().map(|r| r.count).sum();
    let _ = writeln!(
        out,
        "\nfrom {} to {}: {total} commands treated differently",
        old.name, new.name
    );
    let mut rows: Vec<_> = changes.iter().collect();
    rows.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(b.0)));
    for ((was, now), row) in rows {
        let _ = writeln!(
            out,
            "  {was} -> {now}: {} commands, e.g. {}",
            row.count,
            row.examples.join(" | ")
        );
    }
}

/// A command as the report shows it: arguments cut at 32 bytes, placeholders as sizes,
/// with the client and time.
fn example(r: &Record) -> String {
    let args: Vec<String> = r
        .line
        .iter()
        .zip(&r.placeholders)
        .map(|(a, placeholder)| {
            if *placeholder || a.len() > 32 {
                format!("<{} bytes>", a.len())
            } else {
                String::from_utf8_lossy(a).into_owned()
            }
        })
        .collect();
    format!("`{}` from {} at {:.3}", args.join(" "), r.addr, r.ts)
}
