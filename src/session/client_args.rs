//! Where CLIENT KILL names client ids, read as Redis reads its options: keywords
//! compared as `strcasecmp` compares them (`REDIRECT\0` is `REDIRECT` to Redis, see
//! `commands::grammar`), options walked positionally from where Redis starts, each consuming
//! its own value. The session maps every id found to its client's upstream connection
//! (`client_ids`); an id left unmapped would reach Redis as written and name one of the
//! proxy's own connections: `CLIENT TRACKING … REDIRECT <shared connection>` sent every
//! invalidation to a shared connection (issue 26).

use crate::commands::grammar::keyword;
use crate::policy::line::CommandLine;

/// The positions of `CLIENT KILL`'s `ID` values. The old form (`CLIENT KILL addr`, three
/// arguments) names none; the new one is option/value pairs from argument 2, each option
/// taking the argument after it (so in `TYPE ID ID 5` the id is 5), and the last ID wins in
/// Redis, so every one is mapped.
pub(super) fn kill_ids<L: CommandLine + ?Sized>(line: &L) -> Vec<usize> {
    let mut ids = Vec::new();
    if line.argc() <= 3 {
        return ids;
    }
    let mut i = 2;
    while i + 1 < line.argc() {
        if keyword(line.arg(i), b"ID") {
            ids.push(i + 1);
        }
        i += 2;
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&'static [u8]]) -> Vec<&'static [u8]> {
        args.to_vec()
    }

    #[test]
    fn kill_ids_are_the_values_of_id_options() {
        assert!(kill_ids(&*line(&[b"CLIENT", b"KILL", b"127.0.0.1:5"])).is_empty());
        assert_eq!(kill_ids(&*line(&[b"CLIENT", b"KILL", b"ID", b"5"])), [3]);
        assert_eq!(
            kill_ids(&*line(&[b"CLIENT", b"KILL", b"TYPE", b"ID", b"id\0", b"5"])),
            [5]
        );
        assert_eq!(
            kill_ids(&*line(&[b"CLIENT", b"KILL", b"ID", b"5", b"ID", b"9"])),
            [3, 5]
        );
    }
}
