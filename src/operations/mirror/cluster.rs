//! A Redis Cluster as the mirror: the planned commands of an answered batch placed on the
//! nodes that own their keys' slots, as a cluster-aware client places them.
//!
//! - A command goes to the primary of its first key's slot; a transaction (`MULTI` … `EXEC`,
//!   planned whole) goes where its first keyed command goes. Keys of several slots in one
//!   command or transaction are refused by the cluster (CROSSSLOT) and counted as mirror
//!   errors: the primary, a standalone server, took them atomically, which a cluster cannot.
//! - A keyless command that changes every node's state (`SCRIPT LOAD`, `SCRIPT FLUSH`,
//!   `FLUSHALL`, `FLUSHDB`, `FUNCTION …`) goes to every primary; any other keyless command
//!   to one.
//! - Each node's part keeps the batch's order, on one connection per node and RESP version,
//!   so one client's writes to one key stay in order (writes to keys on different nodes may
//!   apply in another order, as with any cluster client).
//! - `-MOVED` and `-ASK` to a single command are followed once (the command did not run
//!   where it was refused); inside a transaction they abort its EXEC, counted as an error.
//!
//! The mirror has database 0 only: the planner skips a client's commands in another database
//! (`Planner::one_database`).

use bytes::{Bytes, BytesMut};

use super::plan::Check;
use crate::commands::{self, KeyPositions};
use crate::protocol::codec::{self, CodecLimits};
use crate::topology::cluster::Router;

/// One node's part of a planned batch.
pub(super) struct Part {
    /// The node (the router's index).
    pub(crate) node: u16,
    /// Its commands, one after the other.
    pub(crate) bytes: BytesMut,
    /// What to do with each reply.
    pub(crate) checks: Vec<Check>,
    /// Each command alone, to resend after a redirection (empty for a transaction's
    /// commands, which are not resent).
    pub(crate) commands: Vec<Option<Bytes>>,
}

/// Splits a planned batch (`bytes`, one `checks` entry per command) by node; with the count
/// of writes that could not be placed (no node owns their slot right now: the map is being
/// learned or the cluster is down).
pub(super) fn place(
    router: &Router,
    bytes: &Bytes,
    checks: Vec<Check>,
    keys: &mut KeyPositions,
) -> (Vec<Part>, u64) {
    let commands = codec::split_commands(bytes, &CodecLimits::UNBOUNDED);
    let mut parts: Vec<Part> = Vec::new();
    let mut unplaced = 0;
    let mut items = commands.into_iter().zip(checks).peekable();
    while let Some((command, check)) = items.next() {
        let args = codec::split_args_of(&command).unwrap_or_default();
        let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        if argv
            .first()
            .is_some_and(|n| n.eq_ignore_ascii_case(b"MULTI"))
        {
            // The transaction, to its EXEC, goes where its first keyed command goes.
            let mut unit = vec![(command, check)];
            let mut node = None;
            for (command, check) in items.by_ref() {
                let args = codec::split_args_of(&command).unwrap_or_default();
                let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                let exec = argv
                    .first()
                    .is_some_and(|n| n.eq_ignore_ascii_case(b"EXEC"));
                if node.is_none() {
                    node = keyed_node(router, &argv, keys);
                }
                unit.push((command, check));
                if exec {
                    break;
                }
            }
            let placed = match node {
                Some(owner) => owner,
                None => router.home(0),
            };
            let Some(node) = placed else {
                unplaced += unit.iter().filter(|(_, c)| *c == Check::Write).count() as u64;
                continue;
            };
            for (command, check) in unit {
                add(&mut parts, node, &command, check, None);
            }
            continue;
        }
        let nodes: Vec<u16> = match keyed_node(router, &argv, keys) {
            Some(Some(node)) => vec![node],
            Some(None) => Vec::new(),
            None if everywhere(&argv) => router.snapshot().primaries().to_vec(),
            None => router.home(0).into_iter().collect(),
        };
        if nodes.is_empty() {
            if check == Check::Write {
                unplaced += 1;
            }
            continue;
        }
        for node in nodes {
            add(
                &mut parts,
                node,
                &command,
                check.clone(),
                Some(command.clone()),
            );
        }
    }
    (parts, unplaced)
}

/// Where a command with keys goes: `Some(Some(node))`, `Some(None)` when no node owns its
/// slot now; `None` for a command without keys.
fn keyed_node(router: &Router, argv: &[&[u8]], keys: &mut KeyPositions) -> Option<Option<u16>> {
    let first = commands::keys_into(argv, keys)
        .ok()
        .and_then(|_| keys.indices().next())?;
    Some(router.snapshot().owner(router.slot_of(argv[first])))
}

/// Keyless commands whose effect is on every node: the scripts and functions a later
/// EVALSHA/FCALL runs wherever its keys are, and flushing the whole dataset.
fn everywhere(argv: &[&[u8]]) -> bool {
    let Some(name) = argv.first() else {
        return false;
    };
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    is(b"SCRIPT") || is(b"FUNCTION") || is(b"FLUSHALL") || is(b"FLUSHDB")
}

/// Appends a command to `node`'s part.
fn add(parts: &mut Vec<Part>, node: u16, command: &[u8], check: Check, alone: Option<Bytes>) {
    let at = match parts.iter().position(|p| p.node == node) {
        Some(at) => at,
        None => {
            parts.push(Part {
                node,
                bytes: BytesMut::new(),
                checks: Vec::new(),
                commands: Vec::new(),
            });
            parts.len() - 1
        }
    };
    let part = &mut parts[at];
    part.bytes.extend_from_slice(command);
    part.checks.push(check);
    part.commands.push(alone);
}
