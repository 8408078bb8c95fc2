//! The session's side of the audit trail (`crate::observe::audit`) and the keyspace statistics
//! (`crate::observe::keyspace`): a draft made where a command is decided (its bytes are at hand),
//! completed where it is counted (its outcome is known) and, for forwarded commands, where
//! its reply comes back (its latency and size are known). Kept here so the session's own
//! code carries one call at each of those places.

use super::Session;
use super::action::{Action, Command, Decision, Joining};
use super::audit_draft::{Draft, Slot};
use super::conn::Target;
use crate::observe::audit::{self, Entry, Outcome};
use crate::observe::metrics::CommandOutcome;
use tokio::time::Instant;

impl Session {
    /// The draft of the command just decided from `frame`, when the audit trail or the
    /// keyspace statistics want it; `None` (no allocation) otherwise. Made at decision time
    /// because that is where the command's arguments are parsed; a paused command is decided
    /// again with a new draft, so only the dispatched one counts.
    pub(super) fn audit_draft(&self, frame: &[u8], command: &Command, decision: &Decision) -> Slot {
        Slot(
            self.draft(frame, command, decision)
                .map(|d| Box::new(std::sync::Mutex::new(Some(d)))),
        )
    }

    fn draft(&self, frame: &[u8], command: &Command, decision: &Decision) -> Option<Draft> {
        let ops = &self.ctx.ops;
        if ops.audit.is_none() && ops.keyspace.is_none() {
            return None;
        }
        let tenant = self.client.policy.access.tenant_name(self.client.tenant);
        let audited = ops.audit.as_ref().filter(|a| a.wants(command.spec, tenant));
        let sampled = ops.keyspace.as_ref().filter(|k| k.wants(command.spec));
        if audited.is_none() && sampled.is_none() {
            return None;
        }
        let args: Vec<&[u8]> = self.input.args.iter().map(|r| &frame[r.clone()]).collect();
        let keys = audit::key_indices(command.spec, &args);
        let measured = match (sampled, command.spec, &decision.action) {
            (Some(k), Some(spec), action) if action.forwarded().is_some() => {
                let ttl_added = matches!(action, Action::Rewritten { rewrite, .. }
                    if rewrite.append.is_some_and(|a| matches!(a.option, "PX" | "EX"))
                        || !rewrite.after.is_empty());
                k.measure(tenant, spec, &args, &keys, command.len, ttl_added)
            }
            _ => None,
        };
        let entry = audited.map(|a| self.audit_entry(a, &args, &keys, command, decision, tenant));
        (entry.is_some() || measured.is_some()).then_some(Draft { entry, measured })
    }

    /// The audit entry of a decided command, its outcome still to be set.
    fn audit_entry(
        &self,
        audit: &audit::Audit,
        args: &[&[u8]],
        keys: &[usize],
        command: &Command,
        decision: &Decision,
        tenant: &str,
    ) -> Entry {
        let (cmd, described) = audit.describe(command.spec, args, keys);
        let cluster = self.routing.router().is_some();
        let on = |kind: &str, node: u16| match cluster {
            true => format!("{kind}:{node}"),
            false => kind.to_string(),
        };
        let (route, rule) = match &decision.action {
            Action::Refused(reply) => ("proxy".to_string(), audit::entry::rule_of(reply)),
            action => match action.forwarded() {
                Some((Target::Shared(_, node), ..)) => (on("shared", node), None),
                Some((Target::Dedicated(node), ..)) => (on("dedicated", node), None),
                None if matches!(action, Action::Gather(_)) => ("nodes".to_string(), None),
                None => ("proxy".to_string(), None),
            },
        };
        Entry {
            ts: audit::now_ts(),
            client: self.client.peer,
            id: self.client.id,
            user: self
                .client
                .names
                .user()
                .map(|u| String::from_utf8_lossy(u).into_owned()),
            tenant: tenant.to_string(),
            route,
            cmd,
            args: described,
            argc: args.len(),
            // Set when the command is dispatched.
            outcome: Outcome::Forwarded,
            rule,
            latency_us: None,
        }
    }

    /// The command was dispatched with `outcome`: refusals and local replies are written
    /// now; forwarded commands are counted in the keyspace statistics and followed until
    /// their reply is in (`audit_answered`).
    pub(super) fn audit_dispatched(&mut self, command: &Command, outcome: CommandOutcome) {
        let Some(draft) = command.audit.take() else {
            return;
        };
        let ops = &self.ctx.ops;
        let Draft {
            mut entry,
            measured,
        } = draft;
        if let Some(e) = &mut entry {
            e.outcome = match outcome {
                CommandOutcome::Forwarded => Outcome::Forwarded,
                CommandOutcome::Rewritten => Outcome::Rewritten,
                CommandOutcome::Refused => Outcome::Refused,
                CommandOutcome::Local => Outcome::Local,
            };
        }
        let forwarded = matches!(
            outcome,
            CommandOutcome::Forwarded | CommandOutcome::Rewritten
        ) && entry.as_ref().is_none_or(|e| e.route != "proxy");
        if !forwarded {
            if let (Some(audit), Some(e)) = (&ops.audit, entry) {
                audit.record(e);
            }
            return;
        }
        let sample = match (&ops.keyspace, measured) {
            (Some(k), Some(m)) => Some(k.count(m)),
            _ => None,
        };
        let (audit, keyspace) = (ops.audit.clone(), ops.keyspace.clone());
        self.audit_trail
            .get_or_insert_with(|| Box::new(audit::Trail::new(audit, keyspace)))
            .sent(self.input.read_at, entry, sample);
    }

    /// The command joined a run: forwarded, or rewritten.
    pub(super) fn audit_joined(&mut self, command: &Command, join: &Joining) {
        let outcome = match join.rewrite {
            Some(_) => CommandOutcome::Rewritten,
            None => CommandOutcome::Forwarded,
        };
        self.audit_dispatched(command, outcome);
    }

    /// The command could not be sent (no dedicated connection): written as an error.
    pub(super) fn audit_failed(&mut self, command: &Command) {
        let (Some(draft), Some(audit)) = (command.audit.take(), &self.ctx.ops.audit) else {
            return;
        };
        if let Some(mut entry) = draft.entry {
            entry.outcome = Outcome::Error;
            audit.record(entry);
        }
    }

    /// A batch read at `read_at` was answered with `bytes` (`failed`: with an upstream
    /// error): the commands waiting for it get its latency and bytes.
    pub(super) fn audit_answered(
        &mut self,
        read_at: Instant,
        commands: u32,
        failed: bool,
        bytes: usize,
    ) {
        if let Some(trail) = &mut self.audit_trail {
            trail.answered(read_at, commands, failed, bytes);
        }
    }
}
