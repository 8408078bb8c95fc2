//! What `--explain` and `replay` print: the [`Step`]s every rule takes on one command, each
//! with its [`Effect`], judged on the [`Evidence`] a command line holds. The `impl Policy`
//! here walks the command's plan as `check` does, without counting or logging.

use bytes::Bytes;

use super::{Act, Client, CommandLine, Kind, Mode, Per, Policy, act, refusal, ttl};
use crate::commands::{self, CommandSpec};
use crate::policy::ratelimit::Limit;

impl Policy {
    /// What every rule would do to one command from `client`, audited ones included, without
    /// counting or logging anything: `--explain`'s account. Rules run in the order `check`
    /// runs them; the account stops at the first enforced refusal, which answers the command.
    /// Rate limits are listed, not spent.
    pub(crate) fn explain<L: CommandLine + ?Sized>(&self, client: &Client, line: &L) -> Vec<Step> {
        self.explain_judged(client, line, Evidence::Full)
    }

    /// [`Policy::explain`] for a command line that holds only `evidence` of what the client
    /// sent (`replay` of an audit log: key names and argument sizes, no values). A rule that
    /// needs more is not run and is listed as [`Effect::Unjudged`]: the line's placeholder
    /// arguments would make it act, or not, on something the client never sent.
    pub(crate) fn explain_judged<L: CommandLine + ?Sized>(
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
            let stops =
                rule.mode_for(client) == Mode::Enforce && matches!(what, Effect::Refuses(_));
            steps.push(Step {
                rule: rule.id.clone(),
                mode: rule.mode_for(client),
                what,
                per,
            });
            if stops {
                break;
            }
        }
        steps
    }
}

/// One rule's part in `--explain`'s account of a command.
#[derive(Debug)]
pub(crate) struct Step {
    /// The rule's id.
    pub(crate) rule: String,
    /// Enforced, or only audited (it would have done `what`).
    pub(crate) mode: Mode,
    /// What it does.
    pub(crate) what: Effect,
    /// Whose budget a rate limit counts against (`Connection` for other rules), so a replay
    /// can count the way the proxy does.
    pub(crate) per: Per,
}

/// How much of the client's command a command line holds, for [`Policy::explain_judged`].
/// Ordered: each holds what the one before it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Evidence {
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
pub(crate) enum Effect {
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
