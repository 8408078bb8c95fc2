//! Where a CLIENT subcommand names client ids, read as Redis reads its options: keywords
//! compared as `strcasecmp` compares them (`REDIRECT\0` is `REDIRECT` to Redis, see
//! `commands::grammar`), options walked positionally from where Redis starts, each consuming
//! its own value. The session maps every id found to its client's upstream connection
//! (`client_ids`); an id left unmapped would reach Redis as written and name one of the
//! proxy's own connections: `CLIENT TRACKING … REDIRECT <shared connection>` sent every
//! invalidation to a shared connection (issue 26).

use crate::commands::grammar::keyword;
use crate::policy::line::CommandLine;

/// What `CLIENT TRACKING` asks for, as far as the session needs to know.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Tracking {
    /// Positions of the values of every `REDIRECT` option (Redis refuses a second one, but
    /// each is mapped so none reaches Redis unmapped).
    pub redirects: Vec<usize>,
    /// A keyword spelled other than the plain word (a NUL and bytes after it): Redis reads
    /// it as the keyword, a reader comparing exactly does not.
    pub odd_spelling: bool,
}

/// `CLIENT TRACKING ON|OFF [REDIRECT id] [PREFIX p]… [BCAST] [OPTIN] [OPTOUT] [NOLOOP]`,
/// walked as `clientCommand` walks it from argument 3: REDIRECT and PREFIX take the next
/// argument when there is one; anything else is a flag or a syntax error Redis reports.
pub(super) fn tracking<L: CommandLine + ?Sized>(line: &L) -> Tracking {
    let mut out = Tracking::default();
    let mut j = 3;
    while j < line.argc() {
        let arg = line.arg(j);
        let more = j + 1 < line.argc();
        let word = [
            &b"REDIRECT"[..],
            b"PREFIX",
            b"BCAST",
            b"OPTIN",
            b"OPTOUT",
            b"NOLOOP",
        ]
        .into_iter()
        .find(|k| keyword(arg, k));
        if let Some(k) = word {
            out.odd_spelling |= !arg.eq_ignore_ascii_case(k);
        }
        match word {
            Some(b"REDIRECT") if more => {
                out.redirects.push(j + 1);
                j += 1;
            }
            Some(b"PREFIX") if more => j += 1,
            _ => {}
        }
        j += 1;
    }
    out
}

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
    fn tracking_redirects_are_found_as_redis_walks_the_options() {
        let t = tracking(&*line(&[b"CLIENT", b"TRACKING", b"on", b"REDIRECT", b"7"]));
        assert_eq!(t.redirects, [4]);
        assert!(!t.odd_spelling);
        // strcasecmp stops at the NUL: Redis reads REDIRECT and BCAST here.
        let t = tracking(&*line(&[
            b"CLIENT",
            b"TRACKING",
            b"on",
            b"BCAST\0",
            b"redirect\0x",
            b"7",
        ]));
        assert_eq!(t.redirects, [5]);
        assert!(t.odd_spelling);
        // A PREFIX's value is not an option, whatever it spells.
        let t = tracking(&*line(&[
            b"CLIENT",
            b"TRACKING",
            b"on",
            b"PREFIX",
            b"REDIRECT",
            b"BCAST",
        ]));
        assert!(t.redirects.is_empty());
        // Every REDIRECT, not only the first or the last.
        let t = tracking(&*line(&[
            b"CLIENT",
            b"TRACKING",
            b"on",
            b"REDIRECT",
            b"1",
            b"REDIRECT",
            b"2",
        ]));
        assert_eq!(t.redirects, [4, 6]);
        // REDIRECT without a value is Redis's syntax error, not an id.
        let t = tracking(&*line(&[b"CLIENT", b"TRACKING", b"on", b"REDIRECT"]));
        assert!(t.redirects.is_empty());
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
