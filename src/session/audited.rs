//! The session's side of the audit trail (`crate::audit`): a draft entry made where a
//! command is decided (its bytes are at hand), completed where it is counted (its outcome is
//! known) and, for forwarded commands, where its reply comes back (its latency is known).
//! Kept here so the session's own code carries one call at each of those places.

use super::*;
use crate::audit::{self, Entry, Outcome};

impl Session {
    /// The audit draft of the command just decided from `frame`, when the audit trail wants
    /// it; `None` (no allocation) otherwise. Made at decision time because that is where the
    /// command's arguments are parsed; a paused command is decided again with a new draft,
    /// so only the dispatched one is written.
    pub(super) fn audit_draft(
        &self,
        frame: &[u8],
        command: &Command,
        decision: &Decision,
    ) -> Option<Box<Entry>> {
        let audit = self.ctx.ops.audit.as_ref()?;
        let tenant = self.client.policy.access.tenant_name(self.client.tenant);
        if !audit.wants(command.spec, tenant) {
            return None;
        }
        let args: Vec<&[u8]> = self.input.args.iter().map(|r| &frame[r.clone()]).collect();
        let (cmd, described) = audit.describe(command.spec, &args);
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
        Some(Box::new(Entry {
            ts: audit::now_ts(),
            client: self.client.peer.to_string(),
            id: self.client.id,
            user: self
                .client
                .user
                .as_ref()
                .map(|u| String::from_utf8_lossy(u).into_owned()),
            tenant: tenant.to_string(),
            route,
            cmd,
            args: described,
            argc: args.len(),
            // Set when the command is counted.
            outcome: Outcome::Forwarded,
            rule,
            latency_us: None,
        }))
    }

    /// The command was dispatched with `outcome`: refusals and local replies are written
    /// now, forwarded commands when their reply is in (`audit_answered`).
    pub(super) fn audit_dispatched(&mut self, command: &Command, outcome: CommandOutcome) {
        let (Some(draft), Some(audit)) = (&command.audit, &self.ctx.ops.audit) else {
            return;
        };
        let mut entry = (**draft).clone();
        entry.outcome = match outcome {
            CommandOutcome::Forwarded => Outcome::Forwarded,
            CommandOutcome::Rewritten => Outcome::Rewritten,
            CommandOutcome::Refused => Outcome::Refused,
            CommandOutcome::Local => Outcome::Local,
        };
        match entry.outcome {
            Outcome::Forwarded | Outcome::Rewritten if !entry.route.starts_with("proxy") => self
                .audit_trail
                .get_or_insert_with(|| Box::new(audit::Trail::new(audit.clone())))
                .sent(self.input.read_at, entry),
            _ => audit.record(entry),
        }
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
        let (Some(draft), Some(audit)) = (&command.audit, &self.ctx.ops.audit) else {
            return;
        };
        let mut entry = (**draft).clone();
        entry.outcome = Outcome::Error;
        audit.record(entry);
    }

    /// A batch read at `read_at` was answered (`failed`: with an upstream error): the
    /// entries waiting for it are written with its latency.
    pub(super) fn audit_answered(&mut self, read_at: Instant, commands: u32, failed: bool) {
        if let Some(trail) = &mut self.audit_trail {
            trail.answered(read_at, commands, failed);
        }
    }
}
