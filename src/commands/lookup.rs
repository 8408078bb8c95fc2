//! Finding a command by name (and subcommand), case-insensitively and without allocating:
//! the built-in table through a fixed hash index, then the commands learned from the server.

use super::builtin::{builtin_command, own_subcommand};
use super::spec::CommandSpec;
use super::{learned, table};

impl CommandSpec {
    /// This container's subcommand `name` (ASCII case-insensitive).
    ///
    /// The name ends at a NUL byte: Valkey 9.1 runs `CONFIG "SET\0" …` as CONFIG SET (its
    /// subcommand lookup compares as `strcasecmp`), so a rule must judge it as CONFIG SET; a
    /// server that refuses the spelling refuses it either way.
    pub(crate) fn subcommand(&self, name: &[u8]) -> Option<&'static CommandSpec> {
        let name = name.split(|&b| b == 0).next().unwrap_or(name);
        own_subcommand(self, name).or_else(|| learned::subcommand(self.name, name))
    }

    /// Whether `argc` arguments (the command name included) satisfy the arity.
    /// A built-in command whose server arity is wider ([`learned`]: `ZRANK … WITHSCORE`
    /// from 7.2) accepts what the server accepts; that is asked only when the built-in arity
    /// refuses.
    pub fn arity_accepts(&self, argc: usize) -> bool {
        arity_fits(self.arity, argc)
            || learned::wider_arity(self.name).is_some_and(|arity| arity_fits(arity, argc))
    }
}

// ---------------------------------------------------------------------------------------------
// Lookup
// ---------------------------------------------------------------------------------------------

/// Every top-level command, sorted by name. Subcommands are in each container's
/// [`CommandSpec::subcommands`]; [`all_commands`] walks both.
pub fn commands() -> &'static [CommandSpec] {
    &table::COMMANDS
}

/// Every command and every subcommand (containers before their subcommands).
pub fn all_commands() -> impl Iterator<Item = &'static CommandSpec> {
    table::COMMANDS
        .iter()
        .flat_map(|c| std::iter::once(c).chain(c.subcommands.iter()))
}

/// Finds a command by name and, for containers, subcommand — the way Redis resolves a command
/// line: ASCII case-insensitive, without allocating.
///
/// - `subcommand` is ignored for commands without subcommands (`lookup(b"GET", Some(b"k"))` is
///   GET), as Redis ignores it.
/// - For a container (CONFIG, CLIENT…), `Some(sub)` finds that subcommand or `None` when it is
///   unknown; `None` returns the container itself (its arity then rejects the command line).
pub fn lookup(name: &[u8], subcommand: Option<&[u8]>) -> Option<&'static CommandSpec> {
    let base = find_command(name)?;
    match subcommand {
        Some(sub) if base.is_container() => base.subcommand(sub),
        _ => Some(base),
    }
}

/// [`lookup`] for a command line: the name is `args[0]`, the subcommand `args[1]`.
pub fn lookup_args<A: AsRef<[u8]>>(args: &[A]) -> Option<&'static CommandSpec> {
    let name = args.first()?.as_ref();
    lookup(name, args.get(1).map(AsRef::as_ref))
}

/// Finds a command by its full name, `get` or `client|kill` (as ACL rules and policies write
/// them), ASCII case-insensitive. A container's name alone finds the container.
pub fn lookup_name(full_name: &[u8]) -> Option<&'static CommandSpec> {
    match full_name.iter().position(|&b| b == b'|') {
        Some(bar) => {
            let base = find_command(&full_name[..bar])?;
            base.subcommand(&full_name[bar + 1..])
        }
        None => find_command(full_name),
    }
}

/// Whether `argc` arguments (the name included) fit Redis's `arity`: exactly `n`, or at
/// least `n` for `-n`.
const fn arity_fits(arity: i32, argc: usize) -> bool {
    let arity = arity as i64;
    let argc = argc as i64;
    if arity >= 0 {
        argc == arity
    } else {
        argc >= -arity
    }
}

/// A top-level command of the built-in table or, failing that, one learned from the server.
pub(super) fn find_command(name: &[u8]) -> Option<&'static CommandSpec> {
    builtin_command(name).or_else(|| learned::command(name))
}
