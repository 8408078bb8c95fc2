//! Compiling the policy file's rules and `access:` section into a [`Policy`]: each rule's
//! kind, the commands it is indexed by, its tenants and routes, every problem collected with
//! its line. The `impl Policy` here holds the constructors.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::problems::Problems;
use super::{
    Counters, Kind, Matcher, PHASE_ORDER, Per, Policy, Rule, RuleConfig, access, config, ranges,
    route_scope, scripts, ttl,
};
use crate::commands::{self, AclCategories, CommandSpec};
use crate::config::Problem;
use crate::policy::ratelimit::{Clock, Limit, MonotonicClock, local::LocalLimiter};

impl Policy {
    /// Compiles rules; every problem (unknown command or category, rule without a kind or with
    /// two, duplicate id) is collected with its line.
    pub fn compile(rules: &[RuleConfig]) -> Result<Policy, Vec<Problem>> {
        Policy::compile_with_clock(rules, Arc::new(MonotonicClock::new()))
    }

    /// [`Policy::compile`] with the clock rate limits read (a manual clock in tests).
    pub(crate) fn compile_with_clock(
        rules: &[RuleConfig],
        clock: Arc<dyn Clock>,
    ) -> Result<Policy, Vec<Problem>> {
        Policy::compile_full(rules, &config::Access::default(), clock)
    }

    /// The policy of a policy file: its rules and its `access:` section, named `version` (in
    /// `PROXY POLICY` and the metrics), logging at most `logs_per_second` denials and as many
    /// audits. `setup::policy` calls it with a whole configuration.
    pub(crate) fn from_parts(
        rules: &[RuleConfig],
        access: &config::Access,
        version: String,
        logs_per_second: u32,
        routes: Option<Arc<crate::topology::routes::RouteTable>>,
    ) -> Result<Policy, Vec<Problem>> {
        let clock = Arc::new(MonotonicClock::new());
        let mut policy = Policy::compile_scoped(rules, access, clock, routes)?;
        policy.version = version;
        policy.denial_log.per_second = logs_per_second;
        policy.audit_log.per_second = logs_per_second;
        Ok(policy)
    }

    /// Compiles rules and access together: rules may name tenants the identities define.
    pub(crate) fn compile_full(
        rules: &[RuleConfig],
        access: &config::Access,
        clock: Arc<dyn Clock>,
    ) -> Result<Policy, Vec<Problem>> {
        Policy::compile_scoped(rules, access, clock, None)
    }

    /// [`Policy::compile_full`] with the routes rules may name in `routes:`.
    pub(crate) fn compile_scoped(
        rules: &[RuleConfig],
        access: &config::Access,
        clock: Arc<dyn Clock>,
        routes: Option<Arc<crate::topology::routes::RouteTable>>,
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
        policy.reads_user = policy
            .rules
            .iter()
            .any(|r| r.share.as_ref().is_some_and(super::Share::by_user));
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
    let share = share_of(rc, access, out);
    Some(Compiled {
        rule: Rule {
            id: rc.id.value.clone(),
            tenants,
            routes: None,
            mode: rc.mode,
            share,
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
/// `share:` and `share_by:`: `None` when the rule is enforced for every client (no share,
/// or 100%).
fn share_of(
    rc: &RuleConfig,
    access: &access::Identities,
    out: &mut Problems<'_>,
) -> Option<super::Share> {
    let line = out.line;
    let Some(text) = &rc.share else {
        if rc.share_by.is_some() {
            out.push(
                "share_by",
                line,
                "needs `share:` (a percentage of clients)".into(),
            );
        }
        return None;
    };
    let hundredths = match super::share::parse(&text.value) {
        Ok(h) => h,
        Err(why) => {
            out.push("share", line, why);
            return None;
        }
    };
    if rc.mode != super::Mode::Enforce {
        out.push(
            "share",
            line,
            "needs `mode: enforce` (the share is the part enforced; the rest is audited)".into(),
        );
        return None;
    }
    if hundredths == 10_000 {
        return None;
    }
    let by = rc.share_by.as_ref().map(|b| b.value).unwrap_or_default();
    let names: Vec<&str> = (0..access.tenant_count())
        .map(|i| access.tenant_name(i as u16))
        .collect();
    Some(super::Share::new(&rc.id.value, hundredths, by, &names))
}

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
            match crate::config::recovery::closest(cat, &names) {
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
        match crate::config::recovery::closest(name, &names) {
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
    use crate::policy::model::Phase;
    use crate::policy::test_support::{File, policy};

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
}
