//! The operator's command-line tools beside serving: `--explain` (what the policy does to
//! commands), `--print-acl` (the upstream ACL that mirrors the policy) and `--survey` (what
//! the policy would change in an existing Redis), `replay` (what a policy would have done to
//! recorded traffic), `backfill` (a server's keys, with their TTLs, copied to another before a
//! migration); `node_link` is the probed connection to one node that `--survey` and
//! `backfill` share.
//! Here rather than in `main.rs`, so they are tested as library code and `main` only
//! dispatches.

pub mod backfill;
pub mod explain;
pub(crate) mod node_link;
pub mod print_acl;
pub mod replay;
pub mod survey;
