//! The compiled policy and what it is made of: [`Policy`] (its rules, indexes and plans),
//! `Rule` and its `Kind`, the `Phase`s in `PHASE_ORDER`, the [`Verdict`] on a command, the
//! [`Outcome`]s [`Counters`] count, and the [`Expectations`] `--survey` reads. The
//! `impl Policy` here reads the compiled policy (its version, rules, counters, and the plan
//! `check` runs for a command); compiling it is `compile`, checking a command `evaluate`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::plan::PlanOf;
use super::rewrite::Rewrite;
use super::{BuildPtrHasher, Client, LogBudget, Matcher, Mode, Per, Plan, access, scripts, ttl};
use crate::commands::{self, CommandSpec};
use crate::policy::ratelimit::{Clock, Limit, local::LocalLimiter};

/// A compiled rule.
pub(super) struct Rule {
    /// From the file; names the rule in replies, logs and metrics.
    pub(super) id: String,
    /// Which tenants the rule applies to, by tenant index; `None`: all.
    pub(super) tenants: Option<Vec<bool>>,
    /// Which routes the rule applies to, by route index (`routes:`); `None`: all.
    pub(super) routes: Option<Vec<bool>>,
    pub(super) mode: Mode,
    /// `share:`: enforced for this share of clients, audited for the rest (`mode_for`).
    pub(super) share: Option<super::Share>,
    /// Operator's advice, appended to the refusal.
    pub(super) message: Option<String>,
    pub(super) kind: Kind,
    /// How often the rule matched, by outcome; read by the metrics endpoint.
    pub(super) counters: Counters,
}

impl Rule {
    /// The rule's mode for `client`: its file mode, unless a `share` leaves `client` out of
    /// the enforced part (then audit).
    pub(super) fn mode_for(&self, client: &Client) -> Mode {
        match &self.share {
            None => self.mode,
            Some(share) => share.mode_for(self.mode, client),
        }
    }

    /// Whether the rule applies to `client`'s tenant.
    pub(super) fn applies_to(&self, client: &Client) -> bool {
        self.tenants.as_ref().is_none_or(|set| {
            set.get(usize::from(client.tenant))
                .copied()
                .unwrap_or(false)
        })
    }
}

/// What a rule did to a command, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Refused by a deny, guard, size or TTL rule.
    Denied,
    /// Refused by a rate limit.
    RateLimited,
    /// Changed (TTL added or cut, stream capped).
    Rewritten,
    /// Would have been refused or changed: the rule is in audit mode.
    Audited,
    /// Passed every rule unchanged (counted per tenant, not per rule).
    Allowed,
}

impl Outcome {
    /// Every outcome a rule counts.
    pub(crate) const OF_RULES: [Outcome; 4] = [
        Outcome::Denied,
        Outcome::RateLimited,
        Outcome::Rewritten,
        Outcome::Audited,
    ];

    /// The label metrics and INFO use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Outcome::Denied => "denied",
            Outcome::RateLimited => "rate_limited",
            Outcome::Rewritten => "rewritten",
            Outcome::Audited => "audited",
            Outcome::Allowed => "allowed",
        }
    }
}

/// Per-rule counters by tenant and outcome, kept in the engine so every front end (metrics,
/// INFO, PROXY POLICY) reads the same numbers. Tenants are few and fixed by the file, so the
/// table is small and never grows.
#[derive(Debug, Default)]
pub struct Counters {
    /// `[tenant * 4 + outcome]`, outcomes in [`Outcome::OF_RULES`] order.
    cells: Box<[AtomicU64]>,
}

impl Counters {
    pub(super) fn new(tenants: usize) -> Counters {
        Counters {
            cells: (0..tenants * Outcome::OF_RULES.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    fn cell(&self, tenant: u16, outcome: Outcome) -> Option<&AtomicU64> {
        let o = Outcome::OF_RULES.iter().position(|&x| x == outcome)?;
        self.cells
            .get(usize::from(tenant) * Outcome::OF_RULES.len() + o)
    }

    /// Counts one command of `tenant`.
    pub(crate) fn add(&self, tenant: u16, outcome: Outcome) {
        if let Some(c) = self.cell(tenant, outcome) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The count for one tenant.
    pub(crate) fn get(&self, tenant: u16, outcome: Outcome) -> u64 {
        self.cell(tenant, outcome)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    #[cfg(test)]
    /// The count over every tenant.
    pub(crate) fn total(&self, outcome: Outcome) -> u64 {
        (0..self.cells.len() / Outcome::OF_RULES.len())
            .map(|t| self.get(t as u16, outcome))
            .sum()
    }
}

pub(super) enum Kind {
    Deny {
        /// With this argument the command is allowed (`FLUSHALL ASYNC`).
        unless_arg: Option<Vec<u8>>,
    },
    MaxScanCount(u64),
    /// Refuse reads whose arguments do not bound how much they return (`ranges`).
    UnboundedReads,
    /// Refuse reads that can return more than this many elements, or an unbounded number.
    MaxRange(u64),
    MaxValueBytes(u64),
    MaxKeys(u64),
    RateLimit {
        limiter: LocalLimiter<Arc<dyn Clock>>,
        per: Per,
    },
    /// A rate limit counted in Redis; checked asynchronously by the session, after every
    /// synchronous rule (see [`Policy::shared_limits`]).
    SharedRateLimit {
        limit: Limit,
        per: Per,
        /// `rpp:rl:<rule id>:`, prefixed to the identity to form the Redis key.
        prefix: Vec<u8>,
    },
    Ttl(ttl::Ttl),
    StreamMaxLen(u64),
    KeyPattern(regex::bytes::Regex),
    /// Which scripts and functions may run (`scripts`).
    Scripts(scripts::Scripts),
}

impl Kind {
    /// Whether a rule of this kind can act on some command line of `spec`: `false` only where
    /// its check passes every such line unchanged (the test
    /// `a_plan_leaves_out_only_rules_that_cannot_act` holds `act` to it for every command).
    pub(super) fn may_act_on(&self, spec: &CommandSpec) -> bool {
        match self {
            // `oversized_value` and `grown_value` look at writes only; the TTL rule's commands
            // are writes, scripts and functions (`ttl::Ttl::apply`).
            Kind::MaxValueBytes(_) | Kind::Ttl(_) => spec.may_write(),
            Kind::MaxKeys(_) | Kind::KeyPattern(_) => spec.may_have_keys(),
            Kind::StreamMaxLen(_) => spec.name == "xadd",
            _ => true,
        }
    }

    /// The phase a rule of this kind runs in.
    pub(super) fn phase(&self) -> Phase {
        match self {
            Kind::Deny { .. } | Kind::Scripts(_) => Phase::Deny,
            Kind::MaxScanCount(_) | Kind::UnboundedReads | Kind::MaxRange(_) => {
                Phase::ArgumentGuards
            }
            Kind::RateLimit { .. } => Phase::RateLimit,
            Kind::MaxValueBytes(_)
            | Kind::MaxKeys(_)
            | Kind::KeyPattern(_)
            | Kind::SharedRateLimit { .. } => Phase::Limits,
            Kind::StreamMaxLen(_) => Phase::StreamCap,
            Kind::Ttl(_) => Phase::Ttl,
        }
    }
}

/// The fixed sequence of policy phases a command passes. `Identify` (the client's tenant) is
/// the session's, before the check; `Deny` and `ArgumentGuards` are the rules indexed by the
/// command, in file order; the phases after them apply to every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// The client's tenant, from its address and AUTH user (`access`).
    Identify,
    /// `deny` and `scripts` rules.
    Deny,
    /// Argument guards: `max_scan_count`, `deny_unbounded_reads`, `max_range`.
    ArgumentGuards,
    /// Rate limits counted in the proxy.
    RateLimit,
    /// Size limits (`max_value_bytes`, `max_keys`), the key-name pattern and the Redis-counted
    /// rate limit's marker (checked by the session afterwards): one phase, in file order, so a
    /// command breaking two of them gets the same refusal as before phases had names.
    Limits,
    /// `stream_maxlen`: XADD gets its cap.
    StreamCap,
    /// Forced TTLs, after every refusal (a refused command never gets a PEXPIRE).
    Ttl,
    /// The tenant's key prefix, on the command as every phase before rewrote it.
    Namespace,
}

/// The order the phases run in.
pub(super) const PHASE_ORDER: [Phase; 8] = [
    Phase::Identify,
    Phase::Deny,
    Phase::ArgumentGuards,
    Phase::RateLimit,
    Phase::Limits,
    Phase::StreamCap,
    Phase::Ttl,
    Phase::Namespace,
];

/// The compiled policy.
#[derive(Default)]
pub struct Policy {
    pub(super) rules: Vec<Rule>,
    /// Whether a rule shares by user (`share_by: user`): only then does a session hash its
    /// login per command (`Client::user`), so other policies pay nothing for it.
    pub(super) reads_user: bool,
    /// Rules that apply to a command, by the command's table entry (its address: the table
    /// is static). Commands without rules are absent.
    pub(super) by_command: HashMap<usize, Vec<usize>, BuildPtrHasher>,
    /// Rules that apply to every command with a value argument or keys (size limits), checked
    /// after the per-command rules, in `PHASE_ORDER` (file order within a phase).
    pub(super) global: Vec<usize>,
    /// What `check` runs for each command of the table, by its address: its indexed rules and
    /// the `global` rules that can act on it ([`Kind::may_act_on`]), so a GET is not checked
    /// for value sizes, TTLs or a stream cap (a third of the default policy's cost per GET,
    /// docs/performance.md "Policy cost"). Made once at compile from the two above.
    pub(super) plans: HashMap<usize, Plan, BuildPtrHasher>,
    /// Command-indexed rules that name commands the built-in table lacks, or categories:
    /// matched against commands learned from the server (`commands::learned`), which the
    /// compile-time index cannot hold.
    pub(super) learned_rules: Vec<(usize, Matcher)>,
    /// Plans of learned commands, made on first use (they arrive after the policy is
    /// compiled, and the same policy meets them for its whole life).
    pub(super) learned_plans: dashmap::DashMap<usize, Arc<Plan>, BuildPtrHasher>,
    /// Users, tenants and the identities mapping clients to tenants.
    pub(crate) access: access::Identities,
    /// Whether a rule counts in Redis; read per command, so computed once at compile.
    pub(super) shared_limits: bool,
    /// Commands that passed every rule unchanged, by tenant.
    pub(super) allowed: Box<[AtomicU64]>,
    /// Bounds the denial events logged per second.
    pub(super) denial_log: LogBudget,
    /// Bounds the audit-mode events logged per second (an audited rule may match every
    /// command).
    pub(super) audit_log: LogBudget,
    /// The policy file's version (a hash of its text), for metrics and INFO.
    pub(super) version: String,
    /// The routes rules may be scoped to (`routes:` in the config); `None` without routes.
    pub(super) route_table: Option<Arc<crate::topology::routes::RouteTable>>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.rules.iter().map(|r| r.id.as_str()).collect();
        f.debug_struct("Policy")
            .field("rules", &ids)
            .field("tenants", &self.access.tenant_count())
            .finish()
    }
}

/// What the policy decided about one command.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it.
    Allow,
    /// Answer with this error instead.
    Refuse(Bytes),
    /// Forward the command as rewritten (TTL added or cut).
    Rewrite(Rewrite),
}

/// The rules that say what stored data should look like, each with its id.
#[derive(Default)]
pub struct Expectations<'a> {
    /// Every key has a TTL (by prefix), none above `max`.
    pub(crate) ttl: Option<(&'a str, &'a ttl::Ttl)>,
    /// No value is longer.
    pub(crate) max_value_bytes: Option<(&'a str, u64)>,
    /// Every key name matches.
    pub(crate) key_pattern: Option<(&'a str, &'a regex::bytes::Regex)>,
}

impl Policy {
    /// Whether any rule reads `Client::user` (`share_by: user`).
    pub(crate) fn reads_user(&self) -> bool {
        self.reads_user
    }

    /// The policy file's version: a hash of its text.
    pub fn version(&self) -> &str {
        if self.version.is_empty() {
            "builtin"
        } else {
            &self.version
        }
    }

    /// How many rules enforce and how many only audit, for the startup line.
    pub fn mode_counts(&self) -> (usize, usize) {
        let audit = self.rules.iter().filter(|r| r.mode == Mode::Audit).count();
        (self.rules.len() - audit, audit)
    }

    /// Each rule with its mode, in file order (`deny-keys enforce, ttl-default audit, …`), for
    /// the startup and reload logs: an operator sees what is enforced without reading the file.
    pub fn rules_summary(&self) -> String {
        let mode = |m: Mode| match m {
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
        };
        let parts: Vec<String> = self
            .rules
            .iter()
            .map(|r| match &r.share {
                Some(share) => format!("{} {} {}", r.id, mode(r.mode), share.describe()),
                None => format!("{} {}", r.id, mode(r.mode)),
            })
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }

    /// Ids of the rules, in file order.
    pub(crate) fn rule_ids(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.id.as_str())
    }

    /// Calls `f(rule, tenant, outcome, count)` for every non-zero counter, then for the
    /// commands of each tenant that every rule let through (rule `-`).
    pub(crate) fn for_each_counter(&self, mut f: impl FnMut(&str, &str, Outcome, u64)) {
        for rule in &self.rules {
            for t in 0..self.access.tenant_count() {
                for outcome in Outcome::OF_RULES {
                    let n = rule.counters.get(t as u16, outcome);
                    if n > 0 {
                        f(&rule.id, self.access.tenant_name(t as u16), outcome, n);
                    }
                }
            }
        }
        for (t, n) in self.allowed.iter().enumerate() {
            let n = n.load(Ordering::Relaxed);
            if n > 0 {
                f("-", self.access.tenant_name(t as u16), Outcome::Allowed, n);
            }
        }
    }

    /// Whether there is nothing to check: no rules and no namespaced tenant.
    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty() && !self.access.has_namespaces()
    }

    /// What the file's first `ttl`, `max_value_bytes` and `key_pattern` rules expect of the
    /// data already stored, whatever their tenants and modes: what `--survey` checks.
    pub(crate) fn expectations(&self) -> Expectations<'_> {
        let mut e = Expectations::default();
        for rule in &self.rules {
            match &rule.kind {
                Kind::Ttl(t) if e.ttl.is_none() => e.ttl = Some((&rule.id, t)),
                Kind::MaxValueBytes(n) if e.max_value_bytes.is_none() => {
                    e.max_value_bytes = Some((&rule.id, *n))
                }
                Kind::KeyPattern(re) if e.key_pattern.is_none() => {
                    e.key_pattern = Some((&rule.id, re))
                }
                _ => {}
            }
        }
        e
    }

    /// Each `ttl` rule's id and mode, in file order: what the eviction check weighs
    /// `volatile-*` policies against.
    pub(crate) fn ttl_rules(&self) -> impl Iterator<Item = (&str, Mode)> {
        self.rules
            .iter()
            .filter(|r| matches!(r.kind, Kind::Ttl(_)))
            .map(|r| (r.id.as_str(), r.mode))
    }

    #[cfg(test)]
    /// Counters of a rule by id, for metrics and tests.
    pub(crate) fn counters(&self, id: &str) -> Option<&Counters> {
        self.rules.iter().find(|r| r.id == id).map(|r| &r.counters)
    }
}

impl Policy {
    /// A [`Plan`] for every command and subcommand of the table.
    pub(super) fn plan_every_command(&self) -> HashMap<usize, Plan, BuildPtrHasher> {
        commands::all_commands()
            .map(|spec| {
                let key = spec as *const _ as usize;
                let plan = Plan {
                    command: self
                        .by_command
                        .get(&key)
                        .map_or_else(Box::default, |r| r.as_slice().into()),
                    global: (self.global.iter().copied())
                        .filter(|&r| self.rules[r].kind.may_act_on(spec))
                        .collect(),
                };
                (key, plan)
            })
            .collect()
    }

    /// The rules `check` runs for `spec`: its plan, or (a policy made without one) every
    /// indexed and global rule.
    pub(super) fn plan_of(&self, spec: &'static CommandSpec) -> PlanOf<'_> {
        let key = spec as *const _ as usize;
        if let Some(plan) = self.plans.get(&key) {
            return PlanOf::Table(&plan.command, &plan.global);
        }
        if self.plans.is_empty() && self.learned_rules.is_empty() {
            return PlanOf::Table(
                self.by_command.get(&key).map_or(&[][..], Vec::as_slice),
                &self.global,
            );
        }
        // A command learned from the server: its plan is made once.
        let plan = self
            .learned_plans
            .entry(key)
            .or_insert_with(|| {
                let mut command: Vec<usize> =
                    self.by_command.get(&key).cloned().unwrap_or_default();
                for (r, matcher) in &self.learned_rules {
                    if matcher.matches(spec) && !command.contains(r) {
                        command.push(*r);
                    }
                }
                command.sort_unstable();
                Arc::new(Plan {
                    command: command.into(),
                    global: (self.global.iter().copied())
                        .filter(|&r| self.rules[r].kind.may_act_on(spec))
                        .collect(),
                })
            })
            .clone();
        PlanOf::Learned(plan)
    }
}
