//! The policy engine: rules compiled from the policy file and checked in-line for every
//! command, before it is routed.
//!
//! Phases run in a fixed order (`Phase`, `PHASE_ORDER`: identify → deny → argument guards →
//! rate limit → size and key-name limits → stream cap → TTL → namespace); the first refusal
//! answers the command in its reply slot. A rule in `audit` mode logs and counts what it would
//! have refused and lets the command through. With no rules the check is one branch.
//!
//! The engine by job: `model` (the compiled [`Policy`], its rules and what they count),
//! `compile` (from the file to the `Policy`), `plan` (which rules run for which command),
//! `evaluate` ([`Policy::check`], one command), `act` (what a rule's kind does to a command
//! line, shared by check and explain), `shared_limits` (the Redis-counted rate limits),
//! `explain` (`--explain`'s [`Step`]s), `log_budget` (denial and audit logs per second);
//! `route_scope` scopes rules to routes, `share` enforces a rule for a share of clients;
//! `client` is who sent a command, `problems` where compile problems go. The other modules
//! are the phases' parts.

pub(crate) mod access;
pub(crate) mod acl;
mod act;
mod client;
mod compile;
/// The rules' file format, plain data read by `config` (which knows nothing of the compiled
/// policy); re-exported under its old name, `policy::config`.
pub(crate) use crate::config::rules as config;
mod evaluate;
mod explain;
pub(crate) mod line;
mod log_budget;
mod model;
pub(crate) mod namespace;
mod plan;
mod problems;
pub(crate) mod ranges;
pub mod ratelimit;
pub(crate) mod restore_size;
pub(crate) mod rewrite;
mod route_scope;
pub(crate) mod script_acl;
pub(crate) mod script_user;
pub(crate) mod scripts;
mod share;
mod shared_limits;
#[cfg(test)]
mod test_support;
pub(crate) mod ttl;

pub use client::Client;
pub use config::{Mode, Per, RuleConfig};
pub(crate) use explain::{Effect, Evidence};
pub(crate) use line::CommandLine;
pub use model::{Counters, Expectations, Outcome, Policy, Verdict};

// What the engine's files share with each other; each reaches it as `super::…`.
use act::{Act, act, refusal};
use log_budget::LogBudget;
use model::{Kind, PHASE_ORDER, Rule};
use plan::{BuildPtrHasher, Matcher, Plan};
use problems::Problems;
use share::Share;
pub(crate) use share::user_key;
