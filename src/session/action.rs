//! What the session does with a decided command (`Action`, `Decision`), and the command
//! and run types the command path passes along.

use super::client::ReplyMode;
use super::client_kill;
use super::cluster::plan::{Gather, Prepare, Spread};
use super::conn::Target;
use super::effect::{Effect, LocalEffect};
use crate::commands::CommandSpec;
use crate::commands::classify::Kind;
use crate::upstream::Expect;
use bytes::Bytes;

/// What `execute` carries out an action for: the command dispatched alone, passed down to
/// `forward` as a value (not stashed in the session for the next send to pick up).
#[derive(Clone, Copy)]
pub(super) struct Lone {
    /// Its bytes in the read buffer.
    pub(super) len: usize,
    /// Its table entry, for the slow log and the mirror (`Handling::name`).
    pub(super) name: Option<&'static CommandSpec>,
    /// Cluster mode: the hash slot `decide` placed it on (keeps the slot's commands in order
    /// across nodes, `spread`).
    pub(super) hash_slot: Option<u16>,
}

/// What to do with one command.
pub(super) enum Action {
    Forward {
        target: Target,
        expect: Expect,
        effect: Effect,
    },
    Local(Bytes, LocalEffect),
    /// Reply, then close once everything before it is written (QUIT).
    LocalThenClose(Bytes),
    /// No reply at all: CLIENT REPLY OFF/SKIP, which sets this mode.
    Silent(ReplyMode),
    /// RESET: needs everything in flight answered first.
    Reset,
    /// Not decided yet: how Redis reads it depends on replies still due (a RESP2 client's
    /// subscribed context while a SUBSCRIBE-family command is in flight). Decided again once
    /// everything in flight is answered.
    AwaitReplies,
    /// The policy refused the command: answer with this error (and spoil an open MULTI).
    Refused(Bytes),
    /// Forward, but as the policy rewrote it (TTL added or cut).
    Rewritten {
        target: Target,
        expect: Expect,
        effect: Effect,
        /// Boxed: rewrites are rare, and inline (120 bytes) they made every `Action` 160 bytes,
        /// moved several times per command with a `memcpy` call each (callgrind).
        rewrite: Box<crate::policy::rewrite::Rewrite>,
    },
    /// Cluster mode: a command answered from several nodes, or by the session itself (see
    /// `Gather`).
    Gather(Box<Gather>),
    /// HELLO answered by the proxy: the upstream's reply with this client's id; `login` is
    /// the proxy user its AUTH option authenticated.
    Hello {
        proto: u8,
        name: Option<Bytes>,
        login: Option<Bytes>,
    },
    /// CLIENT KILL, carried out by the proxy on its own clients (`client_kill`).
    Kill(Box<client_kill::KillFilter>),
    /// CLIENT TRACKING … REDIRECT to a client of the tenant that has no dedicated connection:
    /// its session is asked to open one, then the command goes on naming it (`summon`).
    Summon(Box<Summon>),
    /// Cluster mode: a command whose effect each node has for itself only (a keyspace
    /// notification subscription, MONITOR): done on every other primary too, then forwarded
    /// as the action it carries (`Spread`).
    Spread(Box<Spreading>),
    /// Cluster mode: the session's own connections must follow a changed map first (see
    /// `Prepare`); the command is then decided again (`Session::prepare_then`).
    Prepare(Box<Prepare>),
}

/// What `decide` made of one command: the action, and in cluster mode the hash slot its keys
/// hash to (`None`: keyless, or not a cluster), which orders it against the slot's other
/// commands in flight (`spread`) and binds an open transaction to one slot.
pub(super) struct Decision {
    /// What to do with the command.
    pub(super) action: Action,
    /// The command's hash slot, found while placing it on a node.
    pub(super) hash_slot: Option<u16>,
}

/// One decoded command, looked up once: where it ends in the read buffer, its command-table
/// entry and what it means for routing.
pub(super) struct Command {
    /// Its bytes in the read buffer, after the current run's.
    pub(super) len: usize,
    /// Its entry in the command table (`None`: unknown to Redis 7).
    pub(super) spec: Option<&'static CommandSpec>,
    /// Its routing and session-state kind.
    pub(super) kind: Kind,
    /// Its audit entry and keyspace measurement so far, when either follows it (`audited`).
    pub(super) audit: super::audit_draft::Slot,
    /// Judged by the policy before and paused: decided again without spending its rate
    /// budget or counts again (`Input::judged`).
    pub(super) again: bool,
}

/// Whether `process` goes on to the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    /// The command was dispatched (or answered): decode the next one.
    Next,
    /// Stop reading requests for now: paused, waiting for replies, or closing.
    Stop,
}

/// A forwarded command as it goes upstream (see `Session::outgoing`).
pub(super) struct Outgoing {
    /// The bytes sent.
    pub(super) bytes: Bytes,
    /// One entry per reply frame the bytes produce: whether the client sees it.
    pub(super) frames: Vec<bool>,
    /// What an open transaction queues (hidden commands included), before a deferred MULTI
    /// joined the frames; `None` when the client sees every frame.
    pub(super) queued: Option<Vec<bool>>,
    /// The reply the client gets instead of Redis's (EXECABORT for a spoiled EXEC).
    pub(super) replace: Option<Bytes>,
    /// The namespace prefix to remove from the reply's key names.
    pub(super) strip: Option<Box<crate::policy::rewrite::Strip>>,
}

/// What `Session::on_command_now` did with a command.
pub(super) enum Now {
    /// Carried out without waiting.
    Done(Flow),
    /// Decided, to be carried out by `on_command`, which may wait.
    Later(Pending),
}

/// A decided command `process` must wait for (see `Session::on_command`).
pub(super) struct Pending {
    /// The command.
    pub(super) command: Command,
    /// What `decide` made of it.
    pub(super) decision: Decision,
}

/// How a decided command is carried out.
pub(super) enum Dispatch {
    /// With the current run of plain commands.
    Join(Joining),
    /// On its own, once the run is sent.
    Alone(Action),
}

/// A forwarded command that joins the current run.
pub(super) struct Joining {
    /// Where it goes.
    pub(super) target: Target,
    /// The state it changes once dispatched.
    pub(super) effect: Effect,
    /// The policy's rewrite, if any.
    pub(super) rewrite: Option<Box<crate::policy::rewrite::Rewrite>>,
}

impl From<Action> for Decision {
    fn from(action: Action) -> Decision {
        Decision {
            action,
            hash_slot: None,
        }
    }
}

impl Action {
    /// Where a forwarded command goes, its effect and the policy's rewrite; `None` for the
    /// actions the proxy answers or handles itself.
    pub(super) fn forwarded(
        &self,
    ) -> Option<(Target, Effect, Option<&crate::policy::rewrite::Rewrite>)> {
        match self {
            Action::Forward { target, effect, .. } => Some((*target, *effect, None)),
            Action::Rewritten {
                target,
                effect,
                rewrite,
                ..
            } => Some((*target, *effect, Some(rewrite))),
            // Forwarded once the other primaries are done: rate limits and the audit see the
            // command it carries.
            Action::Spread(spread) => spread.then.forwarded(),
            _ => None,
        }
    }

    /// The same action sent to `target` instead (cluster placement, replica reads); other
    /// actions have no target and stay as they are.
    pub(super) fn retarget(self, target: Target) -> Action {
        match self.forwarded() {
            Some((_, effect, _)) => self.rerouted(target, effect),
            None => self,
        }
    }

    /// The same forwarded command sent to `target` with `effect` instead (a write held back by
    /// CLIENT PAUSE goes to the dedicated connection as a blocking command); other actions
    /// stay as they are.
    pub(super) fn rerouted(self, target: Target, effect: Effect) -> Action {
        match self {
            Action::Forward { expect, .. } => Action::Forward {
                target,
                expect,
                effect,
            },
            Action::Rewritten {
                expect, rewrite, ..
            } => Action::Rewritten {
                target,
                expect,
                effect,
                rewrite,
            },
            other => other,
        }
    }
}

/// A `CLIENT TRACKING` waiting for its redirect target's upstream id.
pub(super) struct Summon {
    /// The proxy id of the target client.
    pub(crate) client: u64,
    /// The position of the redirect's id in the command.
    pub(crate) at: usize,
    /// The command's arguments, to send with the id replaced once it is known.
    pub(crate) args: Vec<Bytes>,
    /// Where the TRACKING goes (the caller's dedicated connection).
    pub(crate) target: Target,
}

/// A forwarded command whose effect each primary has for itself (`Spread`): the
/// other primaries' part, then the command as decided. `then` is here rather than in the
/// plan so the cluster's plans stay below `Action`.
pub(super) struct Spreading {
    /// What the other primaries do first.
    pub(super) spread: Spread,
    /// The command as decided, forwarded once the other primaries are done.
    pub(super) then: Action,
}
