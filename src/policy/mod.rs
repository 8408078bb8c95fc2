//! The policy engine: rules compiled from the policy file and checked in-line for every
//! command, before it is routed.
//!
//! Phases run in a fixed order (`Phase`, `PHASE_ORDER`: identify → deny → argument guards →
//! rate limit → size and key-name limits → stream cap → TTL → namespace); the first refusal
//! answers the command in its reply slot. A rule in `audit` mode logs and counts what it would
//! have refused and lets the command through. With no rules the check is one branch.

pub mod access;
pub mod acl;
/// The rules' file format, plain data read by `config` (which knows nothing of the compiled
/// policy); re-exported under its old name, `policy::config`.
pub use crate::config::rules as config;
pub mod line;
pub mod namespace;
pub mod ranges;
pub mod restore_size;
pub mod rewrite;
mod route_scope;
pub mod scripts;
mod shared_limits;
pub mod ttl;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use crate::commands::{self, AclCategories, CommandSpec};
use crate::config::Problem;
use crate::error::simple_error;
use crate::ratelimit::{self, Clock, Decision, Limit, MonotonicClock, local::LocalLimiter};
pub use config::{Mode, Per, RuleConfig};
pub use line::CommandLine;
use rewrite::Rewrite;

/// Who sent a command, for rules that count per client.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    /// The proxy's id for the connection.
    pub id: u64,
    /// The client's IP address.
    pub addr: IpAddr,
    /// The client's tenant (see [`Policy::tenant_of`]); 0 is `default`.
    pub tenant: u16,
}

/// A compiled rule.
struct Rule {
    /// From the file; names the rule in replies, logs and metrics.
    id: String,
    /// Which tenants the rule applies to, by tenant index; `None`: all.
    tenants: Option<Vec<bool>>,
    /// Which routes the rule applies to, by route index (`routes:`); `None`: all.
    routes: Option<Vec<bool>>,
    mode: Mode,
    /// Operator's advice, appended to the refusal.
    message: Option<String>,
    kind: Kind,
    /// How often the rule matched, by outcome; read by the metrics endpoint.
    counters: Counters,
}

/// A per-second budget of log events, lock-free: the second and the count of events in it.
#[derive(Debug)]
struct LogBudget {
    /// Events allowed per second; 0 logs nothing.
    per_second: u32,
    /// Seconds since the budget was made, in the high 32 bits; events logged that second in
    /// the low 32. One word, so one compare-exchange updates both.
    state: AtomicU64,
    /// Events left out since the last one logged.
    suppressed: AtomicU64,
    /// Origin of the second count.
    origin: tokio::time::Instant,
}

impl Default for LogBudget {
    fn default() -> Self {
        LogBudget {
            per_second: 10,
            state: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            origin: tokio::time::Instant::now(),
        }
    }
}

impl LogBudget {
    /// `Some(events left out before this one)` when this event may be logged.
    fn take(&self) -> Option<u64> {
        let now = self.origin.elapsed().as_secs() & 0xffff_ffff;
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            let (second, count) = (state >> 32, state & 0xffff_ffff);
            let next = if second == now {
                if count >= u64::from(self.per_second) {
                    self.suppressed.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                state + 1
            } else if self.per_second == 0 {
                self.suppressed.fetch_add(1, Ordering::Relaxed);
                return None;
            } else {
                (now << 32) | 1
            };
            match self.state.compare_exchange_weak(
                state,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(self.suppressed.swap(0, Ordering::Relaxed)),
                Err(actual) => state = actual,
            }
        }
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
    pub const OF_RULES: [Outcome; 4] = [
        Outcome::Denied,
        Outcome::RateLimited,
        Outcome::Rewritten,
        Outcome::Audited,
    ];

    /// The label metrics and INFO use.
    pub fn name(self) -> &'static str {
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
    fn new(tenants: usize) -> Counters {
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
    pub fn add(&self, tenant: u16, outcome: Outcome) {
        if let Some(c) = self.cell(tenant, outcome) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The count for one tenant.
    pub fn get(&self, tenant: u16, outcome: Outcome) -> u64 {
        self.cell(tenant, outcome)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// The count over every tenant.
    pub fn total(&self, outcome: Outcome) -> u64 {
        (0..self.cells.len() / Outcome::OF_RULES.len())
            .map(|t| self.get(t as u16, outcome))
            .sum()
    }
}

enum Kind {
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

/// The compiled policy.
#[derive(Default)]
pub struct Policy {
    rules: Vec<Rule>,
    /// Rules that apply to a command, by the command's table entry (its address: the table
    /// is static). Commands without rules are absent.
    by_command: HashMap<usize, Vec<usize>, BuildPtrHasher>,
    /// Rules that apply to every command with a value argument or keys (size limits), checked
    /// after the per-command rules, in `PHASE_ORDER` (file order within a phase).
    global: Vec<usize>,
    /// What `check` runs for each command of the table, by its address: its indexed rules and
    /// the `global` rules that can act on it ([`Kind::may_act_on`]), so a GET is not checked
    /// for value sizes, TTLs or a stream cap (a third of the default policy's cost per GET,
    /// docs/performance.md "Policy cost"). Made once at compile from the two above.
    plans: HashMap<usize, Plan, BuildPtrHasher>,
    /// Command-indexed rules that name commands the built-in table lacks, or categories:
    /// matched against commands learned from the server (`commands::learned`), which the
    /// compile-time index cannot hold.
    learned_rules: Vec<(usize, Matcher)>,
    /// Plans of learned commands, made on first use (they arrive after the policy is
    /// compiled, and the same policy meets them for its whole life).
    learned_plans: dashmap::DashMap<usize, Arc<Plan>, BuildPtrHasher>,
    /// Users, tenants and the identities mapping clients to tenants.
    pub access: access::Identities,
    /// Whether a rule counts in Redis; read per command, so computed once at compile.
    shared_limits: bool,
    /// Commands that passed every rule unchanged, by tenant.
    allowed: Box<[AtomicU64]>,
    /// Bounds the denial events logged per second.
    denial_log: LogBudget,
    /// Bounds the audit-mode events logged per second (an audited rule may match every
    /// command).
    audit_log: LogBudget,
    /// The policy file's version (a hash of its text), for metrics and INFO.
    version: String,
    /// The routes rules may be scoped to (`routes:` in the config); `None` without routes.
    route_table: Option<Arc<crate::routes::RouteTable>>,
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

/// Hasher for table-entry addresses: they are not chosen by clients, so a multiply is enough
/// and SipHash's cost per command is not needed.
#[derive(Default, Clone, Copy)]
struct PtrHasher(u64);

impl std::hash::Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

type BuildPtrHasher = std::hash::BuildHasherDefault<PtrHasher>;

/// The rules `check` runs for one command, in the order it runs them.
#[derive(Debug, Default)]
struct Plan {
    /// Phases `Deny` and `ArgumentGuards`: the rules indexed by the command.
    command: Box<[usize]>,
    /// The phases after them: the `global` rules that can act on the command.
    global: Box<[usize]>,
}

/// Which commands learned from the server a command-indexed rule concerns.
#[derive(Debug, Default)]
struct Matcher {
    /// Full lower-case names (`hsetex`, `commandlog|reset`; a container names its
    /// subcommands too).
    names: Vec<String>,
    /// `@category` entries of `deny`: a command in any of them.
    categories: Vec<AclCategories>,
    /// `deny_newer_in`: a learned command in any of these categories…
    newer_in: Vec<AclCategories>,
    /// …unless named here (`allow_newer`).
    allow_newer: Vec<String>,
}

impl Matcher {
    fn is_empty(&self) -> bool {
        self.names.is_empty() && self.categories.is_empty() && self.newer_in.is_empty()
    }

    fn matches(&self, spec: &CommandSpec) -> bool {
        let named = |names: &[String]| {
            names
                .iter()
                .any(|n| n == spec.name || n == spec.container_name())
        };
        named(&self.names)
            || self.categories.iter().any(|&c| spec.in_categories(c))
            || (self.newer_in.iter().any(|&c| spec.in_categories(c)) && !named(&self.allow_newer))
    }
}

/// The rules `check` runs for one command: the table's plan, or a learned command's.
enum PlanOf<'a> {
    Table(&'a [usize], &'a [usize]),
    Learned(Arc<Plan>),
}

impl PlanOf<'_> {
    fn parts(&self) -> (&[usize], &[usize]) {
        match self {
            PlanOf::Table(c, g) => (c, g),
            PlanOf::Learned(plan) => (&plan.command, &plan.global),
        }
    }
}

/// One Redis-counted rate limit to check for a command.
pub struct SharedCheck<'a> {
    /// The rule's id, for the refusal.
    pub rule: &'a str,
    /// Requests per window.
    pub limit: Limit,
    /// Redis key prefix of the rule.
    pub prefix: &'a [u8],
    /// The identity counted (address or tenant name).
    pub key: Vec<u8>,
    /// Audit mode: log and count, never refuse.
    pub audit: bool,
    /// The operator's advice for the refusal.
    pub message: Option<&'a str>,
    /// The rule's counters.
    pub counters: &'a Counters,
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

impl Policy {
    /// Compiles rules; every problem (unknown command or category, rule without a kind or with
    /// two, duplicate id) is collected with its line.
    pub fn compile(rules: &[RuleConfig]) -> Result<Policy, Vec<Problem>> {
        Policy::compile_with_clock(rules, Arc::new(MonotonicClock::new()))
    }

    /// [`Policy::compile`] with the clock rate limits read (a manual clock in tests).
    pub fn compile_with_clock(
        rules: &[RuleConfig],
        clock: Arc<dyn Clock>,
    ) -> Result<Policy, Vec<Problem>> {
        Policy::compile_full(rules, &config::Access::default(), clock)
    }

    /// The policy of a policy file: its rules and its `access:` section, named `version` (in
    /// `PROXY POLICY` and the metrics), logging at most `logs_per_second` denials and as many
    /// audits. `setup::policy` calls it with a whole configuration.
    pub fn from_parts(
        rules: &[RuleConfig],
        access: &config::Access,
        version: String,
        logs_per_second: u32,
        routes: Option<Arc<crate::routes::RouteTable>>,
    ) -> Result<Policy, Vec<Problem>> {
        let clock = Arc::new(MonotonicClock::new());
        let mut policy = Policy::compile_scoped(rules, access, clock, routes)?;
        policy.version = version;
        policy.denial_log.per_second = logs_per_second;
        policy.audit_log.per_second = logs_per_second;
        Ok(policy)
    }

    /// Logs what an audit-mode rule would have done, under the same per-second budget as
    /// denials (a separate one, so audits cannot crowd denials out).
    pub fn log_audit(&self, rule: &str, command: &str, client: &Client, change: &str) {
        if let Some(suppressed) = self.audit_log.take() {
            tracing::info!(
                rule,
                tenant = self.access.tenant_name(client.tenant),
                command,
                client = %client.addr,
                change,
                suppressed,
                "policy audit: the rule would have acted"
            );
        }
    }

    /// Logs one denial as a structured event (rule, tenant, command, client address; never
    /// keys or values), at most `admin.denial_logs_per_second` a second; the events left out
    /// are counted and reported with the next one logged (metrics count them all).
    pub fn log_denial(&self, rule: &str, command: &str, client: &Client, outcome: Outcome) {
        if let Some(suppressed) = self.denial_log.take() {
            tracing::warn!(
                rule,
                tenant = self.access.tenant_name(client.tenant),
                command,
                client = %client.addr,
                outcome = outcome.name(),
                suppressed,
                "policy denied a command"
            );
        }
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
            .map(|r| format!("{} {}", r.id, mode(r.mode)))
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }

    /// Ids of the rules, in file order.
    pub fn rule_ids(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.id.as_str())
    }

    /// Calls `f(rule, tenant, outcome, count)` for every non-zero counter, then for the
    /// commands of each tenant that every rule let through (rule `-`).
    pub fn for_each_counter(&self, mut f: impl FnMut(&str, &str, Outcome, u64)) {
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

    fn allow(&self, client: &Client) -> Verdict {
        if let Some(n) = self.allowed.get(usize::from(client.tenant)) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        Verdict::Allow
    }

    /// Compiles rules and access together: rules may name tenants the identities define.
    pub fn compile_full(
        rules: &[RuleConfig],
        access: &config::Access,
        clock: Arc<dyn Clock>,
    ) -> Result<Policy, Vec<Problem>> {
        Policy::compile_scoped(rules, access, clock, None)
    }

    /// [`Policy::compile_full`] with the routes rules may name in `routes:`.
    pub fn compile_scoped(
        rules: &[RuleConfig],
        access: &config::Access,
        clock: Arc<dyn Clock>,
        routes: Option<Arc<crate::routes::RouteTable>>,
    ) -> Result<Policy, Vec<Problem>> {
        let mut problems = Vec::new();
        let mut policy = Policy {
            access: access::Identities::compile(access, &mut problems),
            route_table: routes,
            ..Policy::default()
        };
        policy.allowed = (0..policy.access.tenant_count())
            .map(|_| AtomicU64::new(0))
            .collect();
        let mut ids = HashMap::new();
        let mut global = Vec::new();
        for (index, rc) in rules.iter().enumerate() {
            let mut out = Problems {
                list: &mut problems,
                field: format!("rules[{index}]"),
                line: rc.id.referenced.line(),
            };
            check_id(rc, &mut ids, &mut out);
            let Some(mut compiled) = compile_rule(rc, &policy.access, &clock, &mut out) else {
                continue;
            };
            compiled.rule.routes = route_scope::route_set(
                rc,
                &compiled.rule.kind,
                policy.route_table.as_deref(),
                &mut out,
            );
            if let Some(rule_index) = policy.register(compiled) {
                global.push(rule_index);
            }
        }
        policy.global = in_phase_order(&policy.rules, &global);
        policy.plans = policy.plan_every_command();
        policy.shared_limits = policy
            .rules
            .iter()
            .any(|r| matches!(r.kind, Kind::SharedRateLimit { .. }));
        if problems.is_empty() {
            Ok(policy)
        } else {
            Err(problems)
        }
    }

    /// Adds a compiled rule and indexes it by command; `Some(index)` when it applies to every
    /// command (its place among those is decided by its phase).
    fn register(&mut self, compiled: Compiled) -> Option<usize> {
        let rule_index = self.rules.len();
        self.rules.push(compiled.rule);
        if !compiled.matcher.is_empty() {
            self.learned_rules.push((rule_index, compiled.matcher));
        }
        for spec in compiled.commands {
            let list = self
                .by_command
                .entry(spec as *const _ as usize)
                .or_default();
            if !list.contains(&rule_index) {
                list.push(rule_index);
            }
        }
        compiled.global.then_some(rule_index)
    }

    /// A [`Plan`] for every command and subcommand of the table.
    fn plan_every_command(&self) -> HashMap<usize, Plan, BuildPtrHasher> {
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
    fn plan_of(&self, spec: &'static CommandSpec) -> PlanOf<'_> {
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

    /// Whether there is nothing to check: no rules and no namespaced tenant.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && !self.access.has_namespaces()
    }

    /// Checks one command from `client`. Phases run in a fixed order: the command's own rules
    /// (deny, argument guards), then rate limits, then size limits, so a refused command never
    /// spends rate budget. Unknown commands pass (Redis answers them with its own error).
    pub fn check<L: CommandLine + ?Sized>(&self, client: &Client, line: &L) -> Verdict {
        if line.argc() == 0 {
            return Verdict::Allow;
        }
        let spec = commands::lookup(line.arg(0), (line.argc() > 1).then(|| line.arg(1)));
        self.check_spec(client, spec, line)
    }

    /// [`Policy::check`] for a caller that has already looked the command up in the table
    /// (`spec`, `None` when unknown), so the lookup is not done twice per command.
    pub fn check_spec<L: CommandLine + ?Sized>(
        &self,
        client: &Client,
        spec: Option<&'static CommandSpec>,
        line: &L,
    ) -> Verdict {
        if line.argc() == 0 {
            return Verdict::Allow;
        }
        let namespace = self.access.namespace(client.tenant);
        if self.rules.is_empty() && namespace.is_none() {
            return self.allow(client);
        }
        // Rewrites compose: the stream cap changes XADD's arguments, the TTL rule then adds its
        // PEXPIRE after it, and the namespace finally prefixes every key of both.
        let mut rewrite: Option<Rewrite> = None;
        if let Some(spec) = spec {
            let plan = self.plan_of(spec);
            let (command, global) = plan.parts();
            if let Some(refusal) = self.command_rules(command, spec, client, line) {
                return refusal;
            }
            if let Err(refusal) = self.global_rules(global, spec, client, line, &mut rewrite) {
                return refusal;
            }
        } else if !commands::learned::have_server_table() {
            // Before the server's COMMAND was read (the upstream was down at start), a
            // command the built-in table lacks may be a newer one the rules would judge.
            return Verdict::Refuse(simple_error(
                "ERR",
                &format!(
                    "policy: the proxy has not read the server's commands yet, so it cannot \
                     judge '{}'; retry once the upstream is reachable",
                    String::from_utf8_lossy(line.arg(0))
                ),
            ));
        } else if let Some(refusal) = self.unknown_command_rate(client, line) {
            return refusal;
        }
        if let Some(prefix) = namespace {
            return self.namespaced(prefix, spec, client, line, rewrite);
        }
        match rewrite {
            Some(rw) => Verdict::Rewrite(rw),
            None => self.allow(client),
        }
    }

    /// A command neither the table nor the server knows: no rule can tell what it does (the
    /// server answers it with its own error), but it still spends rate budget, so a client
    /// cannot flood the server with commands the proxy does not know.
    fn unknown_command_rate<L: CommandLine + ?Sized>(
        &self,
        client: &Client,
        line: &L,
    ) -> Option<Verdict> {
        self.global.iter().find_map(|&r| {
            let rule = &self.rules[r];
            let Kind::RateLimit { limiter, per } = &rule.kind else {
                return None;
            };
            if !rule.applies_to(client) || !self.in_scope(rule, client, line) {
                return None;
            }
            self.rate_limit(rule, limiter, *per, client, "(unknown command)")
        })
    }

    /// Phases `Deny` and `ArgumentGuards`: the rules indexed by the command; the first that
    /// answers (a refusal) ends the check.
    fn command_rules<L: CommandLine + ?Sized>(
        &self,
        rules: &[usize],
        spec: &'static CommandSpec,
        client: &Client,
        line: &L,
    ) -> Option<Verdict> {
        rules
            .iter()
            .find_map(|&r| self.apply(r, spec, client, line))
    }

    /// The phases of rules that apply to every command, in [`PHASE_ORDER`]: a refusal ends
    /// the check (`Err`), rewrites are composed into `rewrite`.
    fn global_rules<L: CommandLine + ?Sized>(
        &self,
        rules: &[usize],
        spec: &'static CommandSpec,
        client: &Client,
        line: &L,
        rewrite: &mut Option<Rewrite>,
    ) -> Result<(), Verdict> {
        for &r in rules {
            match self.apply(r, spec, client, line) {
                None => {}
                Some(Verdict::Rewrite(rw)) => compose(rewrite, rw),
                Some(other) => return Err(other),
            }
        }
        Ok(())
    }

    /// Phase `Namespace`: the tenant's prefix on every key of the command as rewritten so far.
    fn namespaced<L: CommandLine + ?Sized>(
        &self,
        prefix: &[u8],
        spec: Option<&'static CommandSpec>,
        client: &Client,
        line: &L,
        rewrite: Option<Rewrite>,
    ) -> Verdict {
        let scripts = |sha: &[u8]| self.access.script_allowed(sha);
        match namespace::apply(prefix, spec, line, rewrite, &scripts) {
            Ok(rw) if rw.command.is_none() && rw.after.is_empty() => self.allow(client),
            Ok(rw) => Verdict::Rewrite(rw),
            Err(reason) => Verdict::Refuse(simple_error(
                "NOPERM",
                &format!(
                    "policy namespace: {reason}; tenant `{}`",
                    self.access.tenant_name(client.tenant)
                ),
            )),
        }
    }

    /// Whether any rule counts in Redis (the session then awaits [`Policy::shared_limits`]).
    pub fn has_shared_limits(&self) -> bool {
        self.shared_limits
    }

    /// The Redis-counted rate limits that apply to `client`, for the session to check after the
    /// synchronous rules passed.
    pub fn shared_limits(&self, client: &Client) -> Vec<SharedCheck<'_>> {
        let mut out = Vec::new();
        for rule in &self.rules {
            let Kind::SharedRateLimit { limit, per, prefix } = &rule.kind else {
                continue;
            };
            if let Some(set) = &rule.tenants {
                if !set
                    .get(usize::from(client.tenant))
                    .copied()
                    .unwrap_or(false)
                {
                    continue;
                }
            }
            let key = match per {
                Per::Tenant => self.access.tenant_name(client.tenant).as_bytes().to_vec(),
                _ => client.addr.to_string().into_bytes(),
            };
            out.push(SharedCheck {
                rule: &rule.id,
                limit: *limit,
                prefix,
                key,
                audit: rule.mode == Mode::Audit,
                message: rule.message.as_deref(),
                counters: &rule.counters,
            });
        }
        out
    }

    /// Forgets rate-limit state of clients idle for two windows; run periodically.
    pub fn sweep(&self) {
        for rule in &self.rules {
            if let Kind::RateLimit { limiter, .. } = &rule.kind {
                limiter.sweep();
            }
        }
    }

    /// Runs one rule; `Some` when it refuses in enforce mode.
    fn apply<L: CommandLine + ?Sized>(
        &self,
        index: usize,
        spec: &'static CommandSpec,
        client: &Client,
        line: &L,
    ) -> Option<Verdict> {
        let rule = &self.rules[index];
        if !rule.applies_to(client) || !self.in_scope(rule, client, line) {
            return None;
        }
        if let Kind::RateLimit { limiter, per } = &rule.kind {
            return self.rate_limit(rule, limiter, *per, client, spec.name);
        }
        let build = match rule.mode {
            Mode::Enforce => ttl::Build::Commands,
            Mode::Audit => ttl::Build::NoteOnly,
        };
        match act(&rule.kind, spec, line, build)? {
            Act::Refuse(code, reason) => self.refuse(rule, spec, client, code, reason),
            Act::Rewrite(rw) => rewritten(self, rule, spec, client, rw),
        }
    }

    /// What every rule would do to one command from `client`, audited ones included, without
    /// counting or logging anything: `--explain`'s account. Rules run in the order `check`
    /// runs them; the account stops at the first enforced refusal, which answers the command.
    /// Rate limits are listed, not spent.
    pub fn explain<L: CommandLine + ?Sized>(&self, client: &Client, line: &L) -> Vec<Step> {
        self.explain_judged(client, line, Evidence::Full)
    }

    /// [`Policy::explain`] for a command line that holds only `evidence` of what the client
    /// sent (`replay` of an audit log: key names and argument sizes, no values). A rule that
    /// needs more is not run and is listed as [`Effect::Unjudged`]: the line's placeholder
    /// arguments would make it act, or not, on something the client never sent.
    pub fn explain_judged<L: CommandLine + ?Sized>(
        &self,
        client: &Client,
        line: &L,
        evidence: Evidence,
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        let Some(spec) = (line.argc() > 0)
            .then(|| commands::lookup(line.arg(0), (line.argc() > 1).then(|| line.arg(1))))
            .flatten()
        else {
            return steps;
        };
        let plan = self.plan_of(spec);
        let (command, global) = plan.parts();
        for &r in command.iter().chain(global) {
            let rule = &self.rules[r];
            if !rule.applies_to(client) || !self.in_scope(rule, client, line) {
                continue;
            }
            let per = match &rule.kind {
                Kind::RateLimit { per, .. } | Kind::SharedRateLimit { per, .. } => *per,
                _ => Per::Connection,
            };
            let what = match &rule.kind {
                _ if !judged(&rule.kind, spec, evidence) => Some(Effect::Unjudged),
                Kind::RateLimit { limiter, .. } => Some(Effect::Counts(*limiter.limit())),
                Kind::SharedRateLimit { limit, .. } => Some(Effect::Counts(*limit)),
                kind => act(kind, spec, line, ttl::Build::NoteOnly).map(|a| match a {
                    Act::Refuse(code, reason) => Effect::Refuses(refusal(rule, code, &reason)),
                    Act::Rewrite(rw) => match kind {
                        // Which prefix gave each key its TTL.
                        Kind::Ttl(t) if rw.note.contains("<ttl") => {
                            Effect::Rewrites(format!("{} ({})", rw.note, t.sources(line)))
                        }
                        _ => Effect::Rewrites(rw.note.into_owned()),
                    },
                }),
            };
            let Some(what) = what else { continue };
            let stops = rule.mode == Mode::Enforce && matches!(what, Effect::Refuses(_));
            steps.push(Step {
                rule: rule.id.clone(),
                mode: rule.mode,
                what,
                per,
            });
            if stops {
                break;
            }
        }
        steps
    }

    /// Refuses (enforce) or logs and counts (audit).
    fn refuse(
        &self,
        rule: &Rule,
        spec: &'static CommandSpec,
        client: &Client,
        code: &'static str,
        reason: String,
    ) -> Option<Verdict> {
        match rule.mode {
            Mode::Audit => {
                rule.counters.add(client.tenant, Outcome::Audited);
                self.log_audit(&rule.id, spec.name, client, &reason);
                None
            }
            Mode::Enforce => {
                rule.counters.add(client.tenant, Outcome::Denied);
                self.log_denial(&rule.id, spec.name, client, Outcome::Denied);
                Some(Verdict::Refuse(refusal(rule, code, &reason)))
            }
        }
    }

    fn rate_limit(
        &self,
        rule: &Rule,
        limiter: &LocalLimiter<Arc<dyn Clock>>,
        per: Per,
        client: &Client,
        command: &str,
    ) -> Option<Verdict> {
        let mut key = [0u8; 17];
        let key: &[u8] = match (per, client.addr) {
            (Per::Connection, _) => {
                key[..8].copy_from_slice(&client.id.to_be_bytes());
                &key[..8]
            }
            (Per::Address, IpAddr::V4(a)) => {
                key[..4].copy_from_slice(&a.octets());
                &key[..4]
            }
            (Per::Address, IpAddr::V6(a)) => {
                key[..16].copy_from_slice(&a.octets());
                &key[..16]
            }
            (Per::Tenant, _) => {
                key[..2].copy_from_slice(&client.tenant.to_be_bytes());
                &key[..2]
            }
        };
        let retry_after = match limiter.check(key) {
            Ok(Decision::Allowed { .. }) => return None,
            Ok(Decision::Limited { retry_after }) => retry_after,
            Err(e) => {
                // Fail open: more identities than tracked must not lock clients out.
                tracing::warn!(rule = %rule.id, error = %e, "rate limit not applied");
                return None;
            }
        };
        let text = ratelimit::refusal(&rule.id, limiter.limit(), retry_after);
        match rule.mode {
            Mode::Audit => {
                rule.counters.add(client.tenant, Outcome::Audited);
                self.log_audit(&rule.id, command, client, "would rate-limit");
                None
            }
            Mode::Enforce => {
                rule.counters.add(client.tenant, Outcome::RateLimited);
                self.log_denial(&rule.id, command, client, Outcome::RateLimited);
                let text = match &rule.message {
                    Some(m) => format!("{text}; {m}"),
                    None => text,
                };
                Some(Verdict::Refuse(simple_error("ERR", &text)))
            }
        }
    }

    /// What the file's first `ttl`, `max_value_bytes` and `key_pattern` rules expect of the
    /// data already stored, whatever their tenants and modes: what `--survey` checks.
    pub fn expectations(&self) -> Expectations<'_> {
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
    pub fn ttl_rules(&self) -> impl Iterator<Item = (&str, Mode)> {
        self.rules
            .iter()
            .filter(|r| matches!(r.kind, Kind::Ttl(_)))
            .map(|r| (r.id.as_str(), r.mode))
    }

    /// Counters of a rule by id, for metrics and tests.
    pub fn counters(&self, id: &str) -> Option<&Counters> {
        self.rules.iter().find(|r| r.id == id).map(|r| &r.counters)
    }
}

/// The rules that say what stored data should look like, each with its id.
#[derive(Default)]
pub struct Expectations<'a> {
    /// Every key has a TTL (by prefix), none above `max`.
    pub ttl: Option<(&'a str, &'a ttl::Ttl)>,
    /// No value is longer.
    pub max_value_bytes: Option<(&'a str, u64)>,
    /// Every key name matches.
    pub key_pattern: Option<(&'a str, &'a regex::bytes::Regex)>,
}

/// One rule's part in `--explain`'s account of a command.
#[derive(Debug)]
pub struct Step {
    /// The rule's id.
    pub rule: String,
    /// Enforced, or only audited (it would have done `what`).
    pub mode: Mode,
    /// What it does.
    pub what: Effect,
    /// Whose budget a rate limit counts against (`Connection` for other rules), so a replay
    /// can count the way the proxy does.
    pub per: Per,
}

/// How much of the client's command a command line holds, for [`Policy::explain_judged`].
/// Ordered: each holds what the one before it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Evidence {
    /// The name, the argument count and each argument's size; keys hashed (an audit log
    /// with `keys: hash`).
    Sizes,
    /// And the key names at their positions (an audit log with `keys: names`).
    Names,
    /// Every argument as sent (a MONITOR capture, `--explain`).
    Full,
}

/// Whether a rule of `kind` can be judged on a command line holding `evidence`: the rules
/// that read argument values (options such as COUNT, EX, MAXLEN, ranges, script bodies) need
/// them all; key-name rules need names, and on a command whose key positions depend on its
/// arguments (EVAL's numkeys, XREAD's STREAMS) the arguments too.
fn judged(kind: &Kind, spec: &CommandSpec, evidence: Evidence) -> bool {
    let keys_movable = spec.has_movable_keys();
    let needs = match kind {
        Kind::Deny { unless_arg: None }
        | Kind::RateLimit { .. }
        | Kind::SharedRateLimit { .. }
        | Kind::MaxValueBytes(_) => Evidence::Sizes,
        Kind::MaxKeys(_) if !keys_movable => Evidence::Sizes,
        Kind::KeyPattern(_) if !keys_movable => Evidence::Names,
        // They act on writes only: any other command is judged (untouched) on its name.
        Kind::Ttl(_) | Kind::StreamMaxLen(_) if !spec.is_write() => Evidence::Sizes,
        Kind::Deny {
            unless_arg: Some(_),
        }
        | Kind::MaxKeys(_)
        | Kind::KeyPattern(_)
        | Kind::MaxScanCount(_)
        | Kind::UnboundedReads
        | Kind::MaxRange(_)
        | Kind::Ttl(_)
        | Kind::StreamMaxLen(_)
        | Kind::Scripts(_) => Evidence::Full,
    };
    evidence >= needs
}

/// What a rule does to a command, as `--explain` shows it.
#[derive(Debug)]
pub enum Effect {
    /// Answers with this error.
    Refuses(Bytes),
    /// Changes the command, as this note says.
    Rewrites(String),
    /// Counts it against a rate limit.
    Counts(Limit),
    /// Cannot tell: the rule reads what the command line does not hold (see
    /// [`Policy::explain_judged`]).
    Unjudged,
}

/// What a rule of `kind` (not a rate limit) does to a command, if anything.
enum Act {
    /// Refuse with this code and reason.
    Refuse(&'static str, String),
    /// Forward as rewritten.
    Rewrite(Rewrite),
}

/// The rule's verdict on a command before its mode is considered: pure, so `check` and
/// `explain` share it. Rate limits are not here (checking one spends budget).
/// `build` says whether a rewrite's commands are needed or only its note.
fn act<L: CommandLine + ?Sized>(
    kind: &Kind,
    spec: &'static CommandSpec,
    line: &L,
    build: ttl::Build,
) -> Option<Act> {
    match kind {
        Kind::StreamMaxLen(n) => stream_cap(spec, line, *n).map(Act::Rewrite),
        Kind::Ttl(t) => match t.apply(spec, line, build) {
            ttl::TtlAction::Keep => None,
            ttl::TtlAction::Refuse(reason) => Some(Act::Refuse("NOPERM", reason)),
            ttl::TtlAction::Rewrite(rw) => Some(Act::Rewrite(rw)),
        },
        kind => violation(kind, spec, line).map(|(code, reason)| Act::Refuse(code, reason)),
    }
}

/// The error reply refusing a command: the rule, the reason, the operator's advice.
fn refusal(rule: &Rule, code: &'static str, reason: &str) -> Bytes {
    let text = match &rule.message {
        Some(m) => format!("policy {}: {reason}; {m}", rule.id),
        None => format!("policy {}: {reason}", rule.id),
    };
    simple_error(code, &text)
}

impl Rule {
    /// Whether the rule applies to `client`'s tenant.
    fn applies_to(&self, client: &Client) -> bool {
        self.tenants.as_ref().is_none_or(|set| {
            set.get(usize::from(client.tenant))
                .copied()
                .unwrap_or(false)
        })
    }
}

/// The fixed sequence of policy phases a command passes. `Identify` (the client's tenant) is
/// the session's, before the check; `Deny` and `ArgumentGuards` are the rules indexed by the
/// command, in file order; the phases after them apply to every command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
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
const PHASE_ORDER: [Phase; 8] = [
    Phase::Identify,
    Phase::Deny,
    Phase::ArgumentGuards,
    Phase::RateLimit,
    Phase::Limits,
    Phase::StreamCap,
    Phase::Ttl,
    Phase::Namespace,
];

impl Kind {
    /// Whether a rule of this kind can act on some command line of `spec`: `false` only where
    /// its check passes every such line unchanged (the test
    /// `a_plan_leaves_out_only_rules_that_cannot_act` holds `act` to it for every command).
    fn may_act_on(&self, spec: &CommandSpec) -> bool {
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
    fn phase(&self) -> Phase {
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

/// `global` (rule indices in file order) by phase, file order kept within a phase.
fn in_phase_order(rules: &[Rule], global: &[usize]) -> Vec<usize> {
    let mut ordered = Vec::with_capacity(global.len());
    for phase in PHASE_ORDER {
        if ordered.len() == global.len() {
            break;
        }
        ordered.extend(global.iter().filter(|&&r| rules[r].kind.phase() == phase));
    }
    ordered
}

/// Folds the rewrite of a later phase into the rewrites so far.
fn compose(acc: &mut Option<Rewrite>, rw: Rewrite) {
    let Some(acc) = acc else {
        *acc = Some(rw);
        return;
    };
    if rw.command.is_some() {
        acc.command = rw.command;
        acc.append = None;
    }
    if let Some(extra) = rw.append {
        match &acc.command {
            Some(base) => {
                let mut out = bytes::BytesMut::new();
                if extra.extend_frame(base, &mut out) {
                    acc.command = Some(out.freeze());
                }
            }
            None => acc.append = Some(extra),
        }
    }
    if let Some(before) = rw.before {
        acc.add_before(*before);
    }
    acc.after.extend(rw.after);
    acc.note = format!("{}; {}", acc.note, rw.note).into();
}

/// Where one rule's problems go: the list, the rule's field (`rules[3]`) and its line.
struct Problems<'a> {
    /// Every problem of the file so far.
    list: &'a mut Vec<Problem>,
    /// `rules[<index>]`, the prefix of every field named.
    field: String,
    /// The rule's `id:` line, for problems without a line of their own.
    line: u64,
}

impl Problems<'_> {
    /// A problem at `field` (under the rule's) on `line`.
    fn push(&mut self, field: &str, line: u64, message: String) {
        let field = if field.is_empty() {
            self.field.clone()
        } else {
            format!("{}.{field}", self.field)
        };
        self.list.push(Problem {
            line,
            field,
            message,
        });
    }
}

/// A rule compiled, before it is registered in the policy.
struct Compiled {
    /// The rule.
    rule: Rule,
    /// The commands its phase indexes it by (deny, argument guards).
    commands: Vec<&'static CommandSpec>,
    /// Whether it applies to every command (the phases after the argument guards).
    global: bool,
    /// Which learned commands it concerns besides `commands`.
    matcher: Matcher,
}

/// What one rule's fields compile to: its kinds (exactly one is valid), the commands it is
/// indexed by, and whether it applies to every command.
#[derive(Default)]
struct Parts {
    /// Every kind the rule gives; more or fewer than one is a problem.
    kinds: Vec<Kind>,
    /// Commands the rule is indexed by.
    commands: Vec<&'static CommandSpec>,
    /// Whether a kind applies to every command.
    global: bool,
    /// Which learned commands the rule concerns besides `commands`.
    matcher: Matcher,
}

impl Parts {
    /// A kind that applies to every command.
    fn global(&mut self, kind: Kind) {
        self.kinds.push(kind);
        self.global = true;
    }
}

/// The id must be one word, and not used by an earlier rule.
fn check_id(rc: &RuleConfig, ids: &mut HashMap<String, u64>, out: &mut Problems<'_>) {
    let line = out.line;
    if rc.id.value.is_empty() || rc.id.value.contains(|c: char| c.is_whitespace()) {
        out.push("id", line, "must be a non-empty word".into());
    }
    if let Some(first) = ids.insert(rc.id.value.clone(), line) {
        out.push(
            "id",
            line,
            format!("`{}` is already used on line {first}", rc.id.value),
        );
    }
}

/// One rule; `None` (with problems) when it does not have exactly one kind. A rule with
/// other problems is still returned: the file fails as a whole, with all of them.
fn compile_rule(
    rc: &RuleConfig,
    access: &access::Identities,
    clock: &Arc<dyn Clock>,
    out: &mut Problems<'_>,
) -> Option<Compiled> {
    let mut parts = Parts::default();
    command_kinds(rc, &mut parts, out);
    limit_kinds(rc, clock, &mut parts, out);
    rewrite_kinds(rc, &mut parts, out);
    // Counted as written, not as compiled: a kind that failed to compile has its own problem
    // already, and must not add "found 0" after it.
    let given = kinds_given(rc);
    if given != 1 {
        let line = out.line;
        out.push(
            "",
            line,
            format!(
                "rule `{}` needs exactly one of deny, max_scan_count, \
                 deny_unbounded_reads, max_range, max_value_bytes, max_keys, rate_limit, ttl, stream_maxlen, key_pattern, scripts (found {given})",
                rc.id.value,
            ),
        );
        return None;
    }
    if parts.kinds.len() != 1 {
        return None;
    }
    let tenants = tenant_set(rc, access, out);
    Some(Compiled {
        rule: Rule {
            id: rc.id.value.clone(),
            tenants,
            routes: None,
            mode: rc.mode,
            message: rc.message.clone(),
            kind: parts.kinds.pop().expect("one kind"),
            counters: Counters::new(access.tenant_count()),
        },
        commands: parts.commands,
        global: parts.global,
        matcher: parts.matcher,
    })
}

/// How many kind fields the rule sets (`deny_unbounded_reads: false` sets none).
fn kinds_given(rc: &RuleConfig) -> usize {
    [
        rc.deny.is_some() || rc.deny_newer_in.is_some(),
        rc.max_scan_count.is_some(),
        rc.deny_unbounded_reads.as_ref().is_some_and(|on| on.value),
        rc.max_range.is_some(),
        rc.max_value_bytes.is_some(),
        rc.max_keys.is_some(),
        rc.rate_limit.is_some(),
        rc.ttl.is_some(),
        rc.stream_maxlen.is_some(),
        rc.key_pattern.is_some(),
        rc.scripts.is_some(),
    ]
    .iter()
    .filter(|&&set| set)
    .count()
}

/// Phases `Deny` and `ArgumentGuards`: kinds indexed by the commands they concern.
fn command_kinds(rc: &RuleConfig, parts: &mut Parts, out: &mut Problems<'_>) {
    if rc.deny.is_some() || rc.deny_newer_in.is_some() {
        if let Some(deny) = &rc.deny {
            for name in &deny.value {
                match resolve(&name.value, &mut parts.matcher) {
                    Ok(specs) => parts.commands.extend(specs),
                    Err(e) => out.push("deny", name.referenced.line(), e),
                }
            }
        }
        if let Some(newer) = &rc.deny_newer_in {
            for name in &newer.value {
                match AclCategories::from_category(name.as_bytes()) {
                    Some(cat) if name.starts_with('@') => parts.matcher.newer_in.push(cat),
                    _ => out.push(
                        "deny_newer_in",
                        newer.referenced.line(),
                        format!("`{name}` is not a category (write `@admin`, `@dangerous`…)"),
                    ),
                }
            }
        }
        for name in rc.allow_newer.iter().flat_map(|a| &a.value) {
            if commands::newer::is_known(name) {
                parts.matcher.allow_newer.push(name.to_ascii_lowercase());
            } else {
                let line = rc
                    .allow_newer
                    .as_ref()
                    .map_or(out.line, |a| a.referenced.line());
                out.push(
                    "allow_newer",
                    line,
                    format!("`{name}` is not a command newer than Redis 7.0 that the proxy knows"),
                );
            }
        }
        parts.kinds.push(Kind::Deny {
            unless_arg: rc
                .unless_arg
                .as_ref()
                .map(|a| a.to_ascii_uppercase().into()),
        });
    } else if rc.unless_arg.is_some() {
        let line = out.line;
        out.push("unless_arg", line, "only goes with `deny`".into());
    }
    if let Some(s) = &rc.scripts {
        match scripts::Scripts::compile(&s.value) {
            Ok(rule) => {
                for name in scripts::COMMANDS {
                    parts
                        .commands
                        .extend(commands::lookup_name(name.as_bytes()));
                }
                parts.kinds.push(Kind::Scripts(rule));
            }
            Err(e) => out.push("scripts", s.referenced.line(), e),
        }
    }
    if let Some(n) = &rc.max_scan_count {
        for name in ["scan", "sscan", "hscan", "zscan"] {
            parts
                .commands
                .extend(commands::lookup_name(name.as_bytes()));
        }
        parts.kinds.push(Kind::MaxScanCount(n.value));
    }
    let range_commands = |matcher: &mut Matcher| {
        for n in ranges::COMMANDS {
            if commands::lookup_name(n.as_bytes()).is_none() {
                matcher.names.push((*n).to_string());
            }
        }
        ranges::COMMANDS
            .iter()
            .flat_map(|n| commands::lookup_name(n.as_bytes()))
    };
    if rc.deny_unbounded_reads.as_ref().is_some_and(|on| on.value) {
        parts.commands.extend(range_commands(&mut parts.matcher));
        parts.kinds.push(Kind::UnboundedReads);
    }
    if let Some(n) = &rc.max_range {
        parts.commands.extend(range_commands(&mut parts.matcher));
        parts.kinds.push(Kind::MaxRange(n.value));
    }
}

/// Phases `RateLimit` and `Limits`: size limits and rate limits (in the proxy or in Redis).
fn limit_kinds(rc: &RuleConfig, clock: &Arc<dyn Clock>, parts: &mut Parts, out: &mut Problems<'_>) {
    if let Some(n) = &rc.max_value_bytes {
        parts.global(Kind::MaxValueBytes(n.value));
    }
    if let Some(n) = &rc.max_keys {
        parts.global(Kind::MaxKeys(n.value));
    }
    let Some(rl) = &rc.rate_limit else {
        return;
    };
    let limit = Limit {
        requests: rl.value.requests,
        window: Duration::from_millis(rl.value.window_ms),
    };
    // Placed at the `rate_limit:` key's line by `setup` (the value's own location is its
    // first setting's line).
    let at = 0;
    if rl.value.backend != config::Backend::Redis {
        match LocalLimiter::new(limit, rl.value.max_tracked, clock.clone()) {
            Ok(limiter) => parts.global(Kind::RateLimit {
                limiter,
                per: rl.value.per,
            }),
            Err(e) => out.push("rate_limit", at, e.to_string()),
        }
    } else if let Err(e) = limit.validate() {
        out.push("rate_limit", at, e.to_string());
    } else if rl.value.per == Per::Connection {
        out.push(
            "rate_limit.per",
            at,
            "a shared (redis) limit counts per address or per tenant; connections \
             are not shared between proxies"
                .into(),
        );
    } else {
        parts.global(Kind::SharedRateLimit {
            limit,
            per: rl.value.per,
            prefix: format!("rpp:rl:{}:", rc.id.value).into_bytes(),
        });
    }
}

/// Phases `Ttl`, `StreamCap` and the key-name pattern (`Limits`), in the order the file's
/// fields were always read.
fn rewrite_kinds(rc: &RuleConfig, parts: &mut Parts, out: &mut Problems<'_>) {
    if let Some(t) = &rc.ttl {
        match compile_ttl(&t.value) {
            Ok(rule) => parts.global(Kind::Ttl(rule)),
            // The settings inside `ttl:` carry no location: `setup` places the problem at
            // the line of the setting it names (`ttl.max`), else of `ttl:`.
            Err((field, e)) => out.push(&format!("ttl{field}"), 0, e),
        }
    }
    if let Some(n) = &rc.stream_maxlen {
        if n.value == 0 {
            out.push(
                "stream_maxlen",
                n.referenced.line(),
                "must be above 0".into(),
            );
        } else {
            parts.global(Kind::StreamMaxLen(n.value));
        }
    }
    if let Some(pattern) = &rc.key_pattern {
        match regex::bytes::Regex::new(&pattern.value) {
            Ok(re) => parts.global(Kind::KeyPattern(re)),
            Err(e) => out.push(
                "key_pattern",
                pattern.referenced.line(),
                format!("not a valid regular expression: {e}"),
            ),
        }
    }
}

/// `tenants:` or `except_tenants:` as a set by tenant index; `None`: every tenant.
fn tenant_set(
    rc: &RuleConfig,
    access: &access::Identities,
    out: &mut Problems<'_>,
) -> Option<Vec<bool>> {
    let line = out.line;
    let (only, except) = (&rc.tenants, &rc.except_tenants);
    if only.is_some() && except.is_some() {
        out.push(
            "",
            line,
            "give `tenants` or `except_tenants`, not both".into(),
        );
        return None;
    }
    let names = only.as_ref().or(except.as_ref())?;
    let field = if only.is_some() {
        "tenants"
    } else {
        "except_tenants"
    };
    let mut set = vec![except.is_some(); access.tenant_count()];
    for name in names {
        match access.tenant_index(name) {
            Some(i) => set[usize::from(i)] = only.is_some(),
            // Placed at the key's line by `setup`.
            None => out.push(
                field,
                0,
                format!("no tenant `{name}` in access.identities (or `default`)"),
            ),
        }
    }
    Some(set)
}

/// The error code and reason when `kind` refuses the command, else `None`.
fn violation<L: CommandLine + ?Sized>(
    kind: &Kind,
    spec: &'static CommandSpec,
    line: &L,
) -> Option<(&'static str, String)> {
    let upper = || spec.name.to_ascii_uppercase().replace('|', " ");
    match kind {
        Kind::Deny { unless_arg } => {
            if let Some(word) = unless_arg {
                if (1..line.argc()).any(|i| commands::grammar::keyword(line.arg(i), word)) {
                    return None;
                }
            }
            Some(("NOPERM", format!("{} is not allowed", upper())))
        }
        Kind::MaxScanCount(max) => {
            let from = if spec.name == "scan" { 2 } else { 3 };
            let count = commands::grammar::scan_options(line, from)?.count?;
            let n = crate::codec::parse_int(line.arg(count))?;
            (n > *max as i64).then(|| ("ERR", format!("{} COUNT {n} is above {max}", upper())))
        }
        Kind::UnboundedReads => match ranges::read_size(spec, line)? {
            ranges::Size::Whole => Some(("ERR", format!("{} reads a whole collection", upper()))),
            ranges::Size::AtMost(_) => None,
        },
        Kind::MaxRange(max) => match ranges::read_size(spec, line)? {
            ranges::Size::Whole => Some((
                "ERR",
                format!(
                    "{} reads a whole collection; ask for at most {max}",
                    upper()
                ),
            )),
            ranges::Size::AtMost(n) if n > *max => Some((
                "ERR",
                format!("{} asks for up to {n} elements, above {max}", upper()),
            )),
            ranges::Size::AtMost(_) => None,
        },
        Kind::MaxValueBytes(max) => {
            if let Some(reason) = restore_size::refusal(spec, line, *max) {
                return Some(("ERR", reason));
            }
            if let Some(n) = grown_value(spec, line).filter(|n| n > max) {
                return Some((
                    "ERR",
                    format!("{} would grow the value to {n} bytes, above {max}", upper()),
                ));
            }
            oversized_value(spec, line, *max).map(|largest| {
                (
                    "ERR",
                    format!("{} value of {largest} bytes is above {max}", upper()),
                )
            })
        }
        Kind::RateLimit { .. }
        | Kind::SharedRateLimit { .. }
        | Kind::Ttl(_)
        | Kind::StreamMaxLen(_) => None,
        Kind::KeyPattern(re) => bad_key_name(spec, line, re).map(|message| ("ERR", message)),
        Kind::Scripts(s) => s.refusal(spec, line).map(|r| ("NOPERM", r)),
        Kind::MaxKeys(max) => too_many_keys(spec, line, *max)
            .map(|n| ("ERR", format!("{} names {n} keys, above {max}", upper()))),
    }
}

/// The largest value argument of a write (any argument that is not the name or a key) when
/// it is above `max` bytes. Scripts that may write (EVAL, EVALSHA, FCALL) count as writes:
/// their arguments after the keys are the values a script can store; the script body or name
/// is not a value.
fn oversized_value<L: CommandLine + ?Sized>(
    spec: &'static CommandSpec,
    line: &L,
    max: u64,
) -> Option<usize> {
    // Cheap exits first: most commands have no argument that long.
    if !(1..line.argc()).any(|i| line.arg(i).len() as u64 > max) {
        return None;
    }
    if !spec.may_write() {
        return None;
    }
    let scripted = spec.runs_writable_script();
    let mut keys = commands::KeyPositions::with_capacity(0);
    let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
    let _ = commands::keys_into(&args, &mut keys);
    let first_value = if scripted { 2 } else { 1 };
    let largest = (first_value..args.len())
        .filter(|i| !keys.indices().any(|k| k == *i))
        .map(|i| args[i].len())
        .max()?;
    (largest as u64 > max).then_some(largest)
}

/// The length in bytes a string value reaches at least after a write that extends it at an
/// offset the arguments give: SETRANGE (offset + length of the value; an empty value extends
/// nothing), SETBIT (the byte of the bit) and BITFIELD's SET and INCRBY (the last byte of the
/// field). APPEND is not here: what it reaches depends on the value already stored.
fn grown_value<L: CommandLine + ?Sized>(spec: &'static CommandSpec, line: &L) -> Option<u64> {
    let number = |i: usize| {
        (i < line.argc())
            .then(|| crate::codec::parse_int(line.arg(i)))
            .flatten()
            .and_then(|n| u64::try_from(n).ok())
    };
    match spec.name {
        "setrange" if line.argc() == 4 && !line.arg(3).is_empty() => {
            Some(number(2)?.saturating_add(line.arg(3).len() as u64))
        }
        "setbit" => Some(number(2)? / 8 + 1),
        "bitfield" => commands::grammar::bitfield_reach(line),
        // Redis 8's `VADD key [REDUCE dim] VALUES n v1 … vn element`: a vector of n floats
        // (4 bytes each), whatever the arguments that follow hold; a count far beyond them
        // made Redis 8.0.6 abort allocating it.
        "vadd" => (1..line.argc().saturating_sub(1))
            .find(|&i| commands::grammar::keyword(line.arg(i), b"VALUES"))
            .and_then(|i| number(i + 1))
            .map(|n| n.saturating_mul(4)),
        _ => None,
    }
}

/// The refusal for the first key that does not match the naming pattern `re`.
fn bad_key_name<L: CommandLine + ?Sized>(
    spec: &'static CommandSpec,
    line: &L,
    re: &regex::bytes::Regex,
) -> Option<String> {
    if !spec.may_have_keys() {
        return None;
    }
    let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
    let keys = match commands::keys(&args) {
        Ok(keys) => keys,
        Err(commands::KeyError::Unmirrored) => {
            return Some(format!(
                "{} finds its keys in a way the proxy cannot follow, so their names cannot \
                 be checked",
                spec.name.to_ascii_uppercase()
            ));
        }
        Err(_) => return None,
    };
    let bad = keys.indices().map(|i| args[i]).find(|k| !re.is_match(k))?;
    Some(format!(
        "key '{}' does not match the naming pattern {}",
        String::from_utf8_lossy(bad),
        re.as_str()
    ))
}

/// How many keys the command names, when above `max`.
fn too_many_keys<L: CommandLine + ?Sized>(
    spec: &'static CommandSpec,
    line: &L,
    max: u64,
) -> Option<usize> {
    // A command cannot name more keys than it has arguments.
    if !spec.may_have_keys() || (line.argc() as u64).saturating_sub(1) <= max {
        return None;
    }
    let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
    match commands::keys(&args) {
        Ok(keys) => (keys.len() as u64 > max).then_some(keys.len()),
        // Keys only the server can find: every argument may be one (fail closed).
        Err(commands::KeyError::Unmirrored) => Some(line.argc() - 1),
        Err(_) => None,
    }
}

/// A rewrite by `rule`: forwarded (enforce), or logged and counted only (audit).
fn rewritten(
    policy: &Policy,
    rule: &Rule,
    spec: &CommandSpec,
    client: &Client,
    rw: Rewrite,
) -> Option<Verdict> {
    match rule.mode {
        Mode::Audit => {
            rule.counters.add(client.tenant, Outcome::Audited);
            policy.log_audit(&rule.id, spec.name, client, &rw.note);
            None
        }
        Mode::Enforce => {
            rule.counters.add(client.tenant, Outcome::Rewritten);
            Some(Verdict::Rewrite(rw))
        }
    }
}

/// XADD without MAXLEN/MINID, rewritten with `MAXLEN ~ n` right after the key (Redis reads
/// XADD's options up to the entry id, in any order).
fn stream_cap<L: CommandLine + ?Sized>(spec: &CommandSpec, line: &L, n: u64) -> Option<Rewrite> {
    if spec.name != "xadd" || line.argc() < 3 {
        return None;
    }
    // Already capped as Redis reads it (`MAXLEN\0` is MAXLEN); options Redis refuses are
    // left to Redis. The cap goes first, so an option the client gives wins as its last.
    if commands::grammar::xadd_trims(line)? {
        return None;
    }
    let n = n.to_string();
    let mut args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
    args.splice(2..2, [&b"MAXLEN"[..], b"~", n.as_bytes()]);
    Some(Rewrite {
        command: Some(crate::codec::encode(&args)),
        note: "XADD gets MAXLEN ~ <n>".into(),
        ..Rewrite::default()
    })
}

/// Compiles a `ttl:` rule; checks every duration and that none exceeds `max`.
/// The TTL rule of `c`, or what is wrong with it: the setting under `ttl` it concerns
/// (`.max`, `.prefixes[1].ttl`, or empty for `ttl` itself) and the problem.
fn compile_ttl(c: &config::TtlConfig) -> Result<ttl::Ttl, (String, String)> {
    let at = |field: &str, e: String| (field.to_string(), e);
    let Some(keys) = c.keys else {
        return Err(at(
            ".keys",
            "is required: choose which keys get the TTL, `keys: created` (keys a write \
             creates; keys that exist without a TTL keep none) or `keys: written` (every key \
             a write touches without a TTL, existing persistent keys included)"
                .into(),
        ));
    };
    let default_ms = config::parse_duration(&c.default).map_err(|e| at(".default", e))?;
    let max_ms = match &c.max {
        Some(m) => Some(
            config::parse_duration(m)
                .map_err(|e| at(".max", e))?
                .ok_or_else(|| at(".max", "cannot be `none`".into()))?,
        ),
        None => None,
    };
    let mut prefixes = Vec::new();
    for (i, p) in c.prefixes.iter().enumerate() {
        prefixes.push((
            p.prefix.as_bytes().to_vec(),
            config::parse_duration(&p.ttl).map_err(|e| {
                at(
                    &format!(".prefixes[{i}].ttl"),
                    format!("prefix `{}`: {e}", p.prefix),
                )
            })?,
        ));
    }
    if let Some(max) = max_ms {
        let over = std::iter::once(default_ms)
            .chain(prefixes.iter().map(|(_, t)| *t))
            .flatten()
            .any(|t| t > max);
        if over {
            return Err(at(".max", "a default or prefix TTL is above `max`".into()));
        }
    }
    let jitter = c.jitter.unwrap_or(0.0);
    if !(0.0..=0.9).contains(&jitter) {
        return Err(at(
            ".jitter",
            "must be a fraction between 0 and 0.9 (0.1: up to 10% shorter)".into(),
        ));
    }
    // Longest prefix first, so `session:admin:` can override `session:`.
    prefixes.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    Ok(ttl::Ttl {
        default_ms,
        prefixes,
        max_ms,
        deny_persist: c.deny_persist,
        keys,
        jitter: ttl::Jitter::new(jitter, ttl::unix_ms()),
        clock: ttl::unix_ms,
    })
}

/// Commands named by a `deny` entry: a command (`KEYS`), a subcommand (`config|set`) or a
/// category (`@dangerous`).
///
/// Learned commands are matched later through `matcher`: a category's, a newer command's
/// name (`commands::newer`), the newer spellings of a built-in one (`commandlog|reset` for
/// `slowlog|reset`).
fn resolve(name: &str, matcher: &mut Matcher) -> Result<Vec<&'static CommandSpec>, String> {
    if commands::lookup_name(name.as_bytes()).is_none() && commands::newer::is_known(name) {
        matcher.names.push(name.to_ascii_lowercase());
        return Ok(Vec::new());
    }
    matcher.names.extend(
        commands::newer::aliases_of(name)
            .iter()
            .map(|a| (*a).to_string()),
    );
    if let Some(cat) = name.strip_prefix('@') {
        let cat = AclCategories::from_category(cat.as_bytes()).ok_or_else(|| {
            let names: Vec<&str> = AclCategories::NAMES.iter().map(|(_, n)| *n).collect();
            match crate::config_recovery::closest(cat, &names) {
                Some(s) => format!("unknown category `{name}`; did you mean `@{s}`?"),
                None => format!("unknown category `{name}`"),
            }
        })?;
        matcher.categories.push(cat);
        return Ok(commands::all_commands()
            .filter(|c| c.in_categories(cat))
            .collect());
    }
    let spec = commands::lookup_name(name.as_bytes()).ok_or_else(|| {
        let names: Vec<&str> = commands::all_commands().map(|c| c.name).collect();
        match crate::config_recovery::closest(name, &names) {
            Some(s) => format!(
                "unknown command `{name}`; did you mean `{}`?",
                s.to_ascii_uppercase()
            ),
            None => format!("unknown command `{name}`"),
        }
    })?;
    // Denying a container denies every subcommand too.
    Ok(std::iter::once(spec)
        .chain(spec.subcommands.iter())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct File {
        rules: Vec<RuleConfig>,
    }

    fn policy(yaml: &str) -> Policy {
        let f: File = serde_saphyr::from_str(yaml).unwrap();
        Policy::compile(&f.rules).unwrap()
    }

    fn check(p: &Policy, line: &str) -> Verdict {
        check_as(p, 1, line)
    }

    fn check_as(p: &Policy, id: u64, line: &str) -> Verdict {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let client = Client {
            id,
            addr: IpAddr::from([127, 0, 0, 1]),
            tenant: 0,
        };
        p.check(&client, &args[..])
    }

    fn refused(v: Verdict) -> String {
        match v {
            Verdict::Refuse(b) => String::from_utf8(b.to_vec()).unwrap(),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn deny_names_the_rule_and_the_better_pattern() {
        let p = policy(
            "rules:\n  - id: deny-keys\n    deny: [KEYS]\n    message: KEYS blocks the server; use SCAN\n",
        );
        assert_eq!(
            refused(check(&p, "keys *")),
            "-NOPERM policy deny-keys: KEYS is not allowed; KEYS blocks the server; use SCAN\r\n"
        );
        assert_eq!(check(&p, "GET k"), Verdict::Allow);
        assert_eq!(p.counters("deny-keys").unwrap().total(Outcome::Denied), 1);
    }

    #[test]
    fn subcommands_categories_and_unless_arg() {
        let p = policy(
            "rules:\n  - id: no-config-set\n    deny: [config|set]\n  - id: flush\n    deny: [FLUSHALL]\n    unless_arg: async\n  - id: danger\n    deny: ['@admin']\n    mode: audit\n",
        );
        assert!(refused(check(&p, "CONFIG SET maxmemory 1")).contains("CONFIG SET"));
        assert_eq!(check(&p, "CONFIG GET maxmemory"), Verdict::Allow);
        assert!(refused(check(&p, "FLUSHALL")).contains("policy flush"));
        assert_eq!(check(&p, "FLUSHALL ASYNC"), Verdict::Allow);
        // Audit: allowed, counted (CONFIG GET above is @admin too).
        assert_eq!(check(&p, "DEBUG SLEEP 0"), Verdict::Allow);
        assert_eq!(p.counters("danger").unwrap().total(Outcome::Audited), 2);
    }

    #[test]
    fn rules_apply_to_every_command_in_phase_order_and_file_order_within_a_phase() {
        let p = policy(
            "rules:\n  - id: ttl\n    ttl:\n      default: 60s\n      keys: written\n  - id: cap\n    stream_maxlen: 10\n  - id: names\n    key_pattern: '^[a-z]+:'\n  - id: big\n    max_value_bytes: 10\n  - id: rate\n    rate_limit:\n      requests: 100\n      window_ms: 1000\n",
        );
        let order: Vec<&str> = p.global.iter().map(|&r| p.rules[r].id.as_str()).collect();
        assert_eq!(order, ["rate", "names", "big", "cap", "ttl"]);
        let phases: Vec<Phase> = p.global.iter().map(|&r| p.rules[r].kind.phase()).collect();
        let rank = |phase: &Phase| PHASE_ORDER.iter().position(|p| p == phase);
        assert!(phases.windows(2).all(|w| rank(&w[0]) <= rank(&w[1])));
    }

    #[test]
    fn guards_and_size_limits() {
        let p = policy(
            "rules:\n  - id: scan\n    max_scan_count: 1000\n  - id: reads\n    deny_unbounded_reads: true\n  - id: big\n    max_value_bytes: 10\n  - id: keys\n    max_keys: 2\n",
        );
        assert!(refused(check(&p, "SCAN 0 COUNT 5000")).contains("COUNT 5000 is above 1000"));
        assert_eq!(check(&p, "SCAN 0 COUNT 100"), Verdict::Allow);
        assert!(refused(check(&p, "HSCAN h 0 count 5000")).contains("policy scan"));
        assert!(refused(check(&p, "LRANGE l 0 -1")).contains("policy reads"));
        assert!(refused(check(&p, "ZRANGE z -inf +inf BYSCORE")).contains("policy reads"));
        assert_eq!(check(&p, "LRANGE l 0 99"), Verdict::Allow);
        let r = policy("rules:\n  - id: range\n    max_range: 1000\n");
        assert!(
            refused(check(&r, "LRANGE l 0 999999999"))
                .contains("LRANGE asks for up to 1000000000 elements, above 1000")
        );
        assert!(refused(check(&r, "SRANDMEMBER s -5000")).contains("up to 5000 elements"));
        assert!(refused(check(&r, "ZREVRANGE z 0 -1")).contains("reads a whole collection"));
        assert_eq!(check(&r, "ZRANGE z 0 999"), Verdict::Allow);
        assert_eq!(check(&r, "HRANDFIELD h 10"), Verdict::Allow);
        assert!(refused(check(&p, "SET k 12345678901")).contains("policy big"));
        // A long key name is not a value.
        assert_eq!(check(&p, "SET kkkkkkkkkkkkkkkk v"), Verdict::Allow);
        assert_eq!(check(&p, "GET kkkkkkkkkkkkkkkkkkkk"), Verdict::Allow);
        // Writes at an offset: the size they reach is known from the arguments.
        assert!(refused(check(&p, "SETRANGE k 8 abc")).contains("grow the value to 11 bytes"));
        assert_eq!(check(&p, "SETRANGE k 7 abc"), Verdict::Allow);
        assert_eq!(check(&p, "SETRANGE k 99 "), Verdict::Allow);
        assert!(refused(check(&p, "SETBIT k 80 1")).contains("to 11 bytes"));
        assert_eq!(check(&p, "SETBIT k 79 1"), Verdict::Allow);
        assert!(refused(check(&p, "BITFIELD k GET u8 0 SET u8 #10 1")).contains("to 11 bytes"));
        assert_eq!(
            check(&p, "BITFIELD k INCRBY i16 64 1 GET u8 #99"),
            Verdict::Allow
        );
        // A script's values are its arguments after the keys; the body is not one.
        assert!(refused(check(&p, "EVAL s 1 k 12345678901")).contains("policy big"));
        assert_eq!(check(&p, "EVAL return_a_long_body 1 k v"), Verdict::Allow);
        assert_eq!(check(&p, "EVAL_RO s 1 k 12345678901"), Verdict::Allow);
        assert!(refused(check(&p, "MGET a b c")).contains("names 3 keys"));
        assert_eq!(check(&p, "MGET a b"), Verdict::Allow);
    }

    #[test]
    fn rate_limit_per_connection_with_a_manual_clock() {
        let f: File = serde_saphyr::from_str(
            "rules:\n  - id: rl\n    rate_limit: {requests: 3, window_ms: 1000}\n",
        )
        .unwrap();
        let clock = Arc::new(ratelimit::ManualClock::new(Duration::from_secs(10)));
        let p = Policy::compile_with_clock(&f.rules, clock.clone()).unwrap();
        for _ in 0..3 {
            assert_eq!(check_as(&p, 1, "GET k"), Verdict::Allow);
        }
        let refusal = refused(check_as(&p, 1, "GET k"));
        assert_eq!(
            refusal,
            // The next window opens in 1000 ms, but the previous window's 3 requests still
            // weigh 3 × (1 - 334/1000) < 2 only 334 ms into it.
            "-ERR policy rl: 3 requests per 1s exceeded; retry in 1334 ms\r\n"
        );
        // Another connection has its own budget.
        assert_eq!(check_as(&p, 2, "GET k"), Verdict::Allow);
        // Two windows later the first connection is allowed again.
        clock.advance(Duration::from_millis(2000));
        assert_eq!(check_as(&p, 1, "GET k"), Verdict::Allow);
    }

    #[test]
    fn streams_are_capped_and_key_names_checked() {
        let p = policy(
            "rules:\n  - id: cap\n    stream_maxlen: 1000\n  - id: names\n    key_pattern: '^[a-z]+(:[A-Za-z0-9_-]+)+$'\n",
        );
        match check(&p, "XADD events:1 * f v") {
            Verdict::Rewrite(rw) => assert_eq!(
                rw.command.unwrap(),
                crate::codec::encode(&[
                    b"XADD",
                    b"events:1",
                    b"MAXLEN",
                    b"~",
                    b"1000",
                    b"*",
                    b"f",
                    b"v"
                ])
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(check(&p, "XADD events:1 MAXLEN 10 * f v"), Verdict::Allow);
        assert_eq!(
            check(&p, "XADD events:1 NOMKSTREAM MINID 5 * f v"),
            Verdict::Allow
        );
        assert!(refused(check(&p, "GET Bad_Key")).contains("key 'Bad_Key' does not match"));
        assert_eq!(check(&p, "GET user:42"), Verdict::Allow);
        assert_eq!(check(&p, "PING"), Verdict::Allow);
    }

    #[test]
    fn a_namespaced_tenants_listed_script_gets_the_ttl_of_its_prefixed_keys() {
        #[derive(Deserialize)]
        struct WithAccess {
            rules: Vec<RuleConfig>,
            access: config::Access,
        }
        // sha1("return 1")
        let f: WithAccess = serde_saphyr::from_str(
            "access:\n  identities:\n    - {tenant: app, cidr: 127.0.0.1/32}\n  namespaces:\n    app: 'app:'\n  scripts: [e0e1f9fabfc9d4800c877a703b823ac0578ff8db]\nrules:\n  - id: ttl\n    ttl: {default: 1h, keys: written}\n",
        )
        .unwrap();
        let p = Policy::compile_full(&f.rules, &f.access, Arc::new(MonotonicClock::new())).unwrap();
        let client = Client {
            id: 1,
            addr: IpAddr::from([127, 0, 0, 1]),
            tenant: p.access.tenant_of(IpAddr::from([127, 0, 0, 1]), None),
        };
        let args: Vec<&[u8]> = vec![b"EVAL", b"return 1", b"1", b"k"];
        let Verdict::Rewrite(rw) = p.check(&client, &args[..]) else {
            panic!("not rewritten");
        };
        assert_eq!(
            rw.after,
            [crate::codec::encode(&[
                b"PEXPIRE", b"app:k", b"3600000", b"NX"
            ])]
        );
    }

    #[test]
    fn compile_reports_every_problem_with_lines() {
        let f: File = serde_saphyr::from_str(
            "rules:\n  - id: a\n    deny: [NOPE]\n  - id: a\n    max_keys: 1\n  - id: b\n  - id: c\n    deny: ['@nosuch']\n",
        )
        .unwrap();
        let problems = Policy::compile(&f.rules).unwrap_err();
        let text: Vec<String> = problems
            .iter()
            .map(|p| format!("{}:{}:{}", p.line, p.field, p.message))
            .collect();
        let all = text.join("\n");
        assert!(
            all.contains("3:rules[0].deny:unknown command `NOPE`"),
            "{all}"
        );
        assert!(
            all.contains("4:rules[1].id:`a` is already used on line 2"),
            "{all}"
        );
        assert!(
            all.contains("6:rules[2]:rule `b` needs exactly one"),
            "{all}"
        );
        assert!(all.contains("unknown category `@nosuch`"), "{all}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_log_budget_logs_its_events_per_second_and_counts_the_rest() {
        let budget = LogBudget {
            per_second: 2,
            ..LogBudget::default()
        };
        assert_eq!(budget.take(), Some(0));
        assert_eq!(budget.take(), Some(0));
        assert_eq!(
            budget.take(),
            None,
            "the third event of the second is left out"
        );
        assert_eq!(budget.take(), None);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(budget.take(), None, "still the same second");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            budget.take(),
            Some(3),
            "the next one logged reports the three left out"
        );
        assert_eq!(budget.take(), Some(0));
        assert_eq!(budget.take(), None);
        let silent = LogBudget {
            per_second: 0,
            ..LogBudget::default()
        };
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(silent.take(), None);
        assert_eq!(silent.take(), None);
    }

    #[test]
    fn a_plan_leaves_out_only_rules_that_cannot_act() {
        // Every kind `may_act_on` filters, at limits any argument breaks; both TTL modes.
        let p = policy(
            "rules:\n  - id: created\n    ttl: {default: 60s, max: 1h, deny_persist: true, keys: created}\n  - id: written\n    ttl: {default: 60s, max: 1h, keys: written}\n  - id: cap\n    stream_maxlen: 1\n  - id: names\n    key_pattern: '^never$'\n  - id: big\n    max_value_bytes: 1\n  - id: many\n    max_keys: 1\n",
        );
        let big: &[u8] = b"12345678";
        let shapes: [&[&[u8]]; 14] = [
            &[],
            &[b"k"],
            &[b"k", big],
            &[b"k", b"100", big],
            &[b"k", b"f", big, b"g", big],
            &[b"2", b"k1", b"k2", big],
            &[b"1", b"k", big],
            &[b"k", b"EX", b"99999999"],
            &[b"k", big, b"KEEPTTL"],
            &[b"k", b"PERSIST"],
            &[b"k", b"*", b"f", big],
            &[b"k1", b"k2", b"k3"],
            &[b"k", b"SET", b"u8", b"800", b"1"],
            &[b"k", b"0", b"-1"],
        ];
        let mut left_out = 0;
        for spec in commands::all_commands() {
            let plan = p.plan_of(spec);
            let (_, planned) = plan.parts();
            for (r, rule) in p.rules.iter().enumerate() {
                if planned.contains(&r) {
                    continue;
                }
                left_out += 1;
                for shape in shapes {
                    let mut line: Vec<&[u8]> = spec.name.split('|').map(str::as_bytes).collect();
                    line.extend_from_slice(shape);
                    for build in [ttl::Build::Commands, ttl::Build::NoteOnly] {
                        assert!(
                            act(&rule.kind, spec, &line[..], build).is_none(),
                            "rule {} left out of {}'s plan acts on {:?}",
                            rule.id,
                            spec.name,
                            String::from_utf8_lossy(&line.join(&b' '))
                        );
                    }
                }
            }
        }
        assert!(
            left_out > 1000,
            "the plans leave out {left_out} rule checks"
        );
        let global_ids = |name: &str| -> Vec<&str> {
            let spec = commands::lookup_name(name.as_bytes()).unwrap();
            (p.plan_of(spec).parts().1.iter())
                .map(|&r| p.rules[r].id.as_str())
                .collect()
        };
        assert_eq!(global_ids("get"), ["names", "many"]);
        assert_eq!(global_ids("ping"), Vec::<&str>::new());
        assert_eq!(
            global_ids("xadd"),
            ["names", "big", "many", "cap", "created", "written"]
        );
        assert_eq!(
            global_ids("evalsha"),
            ["names", "big", "many", "created", "written"]
        );
        assert_eq!(global_ids("evalsha_ro"), ["names", "many"]);
    }
}
