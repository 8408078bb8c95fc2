//! The built-in command table's own lookups: a top-level command through a fixed hash index,
//! a subcommand by binary search of its container's sorted list. Commands learned from the
//! server are `learned`'s; [`super::lookup`] asks both.

use std::cmp::Ordering;

use super::spec::CommandSpec;
use super::table;

/// Slots of the command-name index: a power of two, about four per command, so probe runs
/// stay short (the table is fixed, so the longest run is fixed too: no input can make a
/// lookup slower than that).
const INDEX_SLOTS: usize = 1024;

/// FNV-1a over the lower-cased name: a handful of cycles per byte, where a binary search
/// over the table costs eight case-insensitive comparisons (about 70 ns per command).
fn name_hash(name: &[u8]) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for &b in name {
        h ^= u32::from(b.to_ascii_lowercase());
        h = h.wrapping_mul(0x0100_0193);
    }
    h as usize % INDEX_SLOTS
}

/// Open-addressing index of the top-level commands: entry `i + 1` names `COMMANDS[i]`, 0 is
/// empty. Built once, on the first lookup.
fn command_index() -> &'static [u16; INDEX_SLOTS] {
    static INDEX: std::sync::OnceLock<Box<[u16; INDEX_SLOTS]>> = std::sync::OnceLock::new();
    INDEX.get_or_init(|| {
        let mut index = Box::new([0u16; INDEX_SLOTS]);
        for (i, c) in table::COMMANDS.iter().enumerate() {
            let mut slot = name_hash(c.name.as_bytes());
            while index[slot] != 0 {
                slot = (slot + 1) % INDEX_SLOTS;
            }
            index[slot] = i as u16 + 1;
        }
        index
    })
}

/// A top-level command of the built-in table.
pub(super) fn builtin_command(name: &[u8]) -> Option<&'static CommandSpec> {
    let index = command_index();
    let mut slot = name_hash(name);
    loop {
        let entry = usize::from(index[slot]);
        let spec = table::COMMANDS.get(entry.checked_sub(1)?)?;
        if spec.name.as_bytes().eq_ignore_ascii_case(name) {
            return Some(spec);
        }
        slot = (slot + 1) % INDEX_SLOTS;
    }
}

/// `container`'s subcommand `name` as its own table lists it (not learned ones).
pub(super) fn own_subcommand(container: &CommandSpec, name: &[u8]) -> Option<&'static CommandSpec> {
    let skip = container.name.len() + 1;
    find(container.subcommands, name, skip)
}

/// Binary search of `list` (sorted by lower-case name) for `name`, comparing the table's names
/// from byte `skip` on (past `container|` for subcommands).
fn find(list: &'static [CommandSpec], name: &[u8], skip: usize) -> Option<&'static CommandSpec> {
    list.binary_search_by(|c| cmp_lowercase(&c.name.as_bytes()[skip..], name))
        .ok()
        .map(|i| &list[i])
}

/// Compares a lower-case table name with `input`, lower-casing `input` byte by byte in place.
#[inline]
fn cmp_lowercase(table_name: &[u8], input: &[u8]) -> Ordering {
    for (t, i) in table_name.iter().zip(input) {
        match t.cmp(&i.to_ascii_lowercase()) {
            Ordering::Equal => {}
            other => return other,
        }
    }
    table_name.len().cmp(&input.len())
}
