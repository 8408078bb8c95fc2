//! Checking one command against the compiled policy: [`Policy::check`] runs the command's
//! plan phase by phase, refuses (enforce) or logs and counts (audit), spends rate budget,
//! composes the rewrites and applies the tenant's namespace, and logs refusals and audit-mode
//! events under the policy's log budgets. The `impl Policy` here is the per-command path.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::rewrite::Rewrite;
use super::{
    Act, Client, CommandLine, Kind, Mode, Outcome, Per, Policy, Rule, Verdict, act, namespace,
    refusal, ttl,
};
use crate::commands::{self, CommandSpec};
use crate::policy::ratelimit::{self, Clock, Decision, local::LocalLimiter};
use crate::protocol::error::simple_error;

impl Policy {
    fn allow(&self, client: &Client) -> Verdict {
        if client.again {
            return Verdict::Allow;
        }
        if let Some(n) = self.allowed.get(usize::from(client.tenant)) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        Verdict::Allow
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
    pub(crate) fn check_spec<L: CommandLine + ?Sized>(
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

    /// Forgets rate-limit state of clients idle for two windows; run periodically.
    pub(crate) fn sweep(&self) {
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
        let build = match rule.mode_for(client) {
            Mode::Enforce => ttl::Build::Commands,
            Mode::Audit => ttl::Build::NoteOnly,
        };
        match act(&rule.kind, spec, line, build)? {
            Act::Refuse(code, reason) => self.refuse(rule, spec, client, code, reason),
            Act::Rewrite(rw) => rewritten(self, rule, spec, client, rw),
        }
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
        match rule.mode_for(client) {
            // Counted and logged when first judged (`Client::again`).
            Mode::Audit if client.again => None,
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
        // Allowed when first judged, its budget spent then (`Client::again`).
        if client.again {
            return None;
        }
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
        match rule.mode_for(client) {
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

/// A rewrite by `rule`: forwarded (enforce), or logged and counted only (audit).
fn rewritten(
    policy: &Policy,
    rule: &Rule,
    spec: &CommandSpec,
    client: &Client,
    rw: Rewrite,
) -> Option<Verdict> {
    match rule.mode_for(client) {
        // Counted and logged when first judged (`Client::again`).
        Mode::Audit if client.again => None,
        Mode::Audit => {
            rule.counters.add(client.tenant, Outcome::Audited);
            policy.log_audit(&rule.id, spec.name, client, &rw.note);
            None
        }
        Mode::Enforce => {
            if !client.again {
                rule.counters.add(client.tenant, Outcome::Rewritten);
            }
            Some(Verdict::Rewrite(rw))
        }
    }
}

impl Policy {
    /// Logs what an audit-mode rule would have done, under the same per-second budget as
    /// denials (a separate one, so audits cannot crowd denials out).
    pub(crate) fn log_audit(&self, rule: &str, command: &str, client: &Client, change: &str) {
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
    pub(crate) fn log_denial(&self, rule: &str, command: &str, client: &Client, outcome: Outcome) {
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
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::Deserialize;

    use super::*;
    use crate::policy::ratelimit::MonotonicClock;
    use crate::policy::test_support::{File, check, check_as, policy, refused};
    use crate::policy::{RuleConfig, config};

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
            user: 0,
            again: false,
        };
        let args: Vec<&[u8]> = vec![b"EVAL", b"return 1", b"1", b"k"];
        let Verdict::Rewrite(rw) = p.check(&client, &args[..]) else {
            panic!("not rewritten");
        };
        assert_eq!(
            rw.after,
            [crate::protocol::codec::encode(&[
                b"PEXPIRE", b"app:k", b"3600000", b"NX"
            ])]
        );
    }
}
