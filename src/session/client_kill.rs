//! `CLIENT KILL` about the proxy's own clients. The ids and addresses a client can know are
//! the ones `CLIENT LIST` shows it, which are the proxy's (`client_list`); forwarded, KILL
//! would name connections Redis has never heard of (`No such client`, `:0`), or, by id, one
//! of the proxy's own upstream connections. So the proxy reads the filter as Redis 7 reads
//! it and closes the matching clients of the caller's tenant itself.
//!
//! The walk is Redis's `clientKillCommand`: three arguments are the old form (`CLIENT KILL
//! ip:port`, which may kill the caller, answered `+OK` or `No such client`); more are
//! option/value pairs from argument 2, each keyword compared as `strcasecmp` compares it
//! (`commands::grammar::keyword`), an unknown option or one without its value a syntax error
//! at the point the walk meets it, and a repeated option's last value winning. `MAXAGE` is
//! read as Redis 7.4 reads it (7.0 knows no `MAXAGE`; the proxy's clients are its own).

use crate::commands::grammar::keyword;
use crate::policy::line::CommandLine;
use crate::protocol::answers;
use crate::protocol::codec;
use bytes::Bytes;

/// The clients a `CLIENT KILL` names; every field set narrows it, as in Redis.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct KillFilter {
    /// The old form (`CLIENT KILL addr`): the caller may be killed, the reply is `+OK` or
    /// `No such client` instead of a count.
    pub(crate) old_form: bool,
    /// `ADDR` (or the old form's address): the client's `ip:port` as CLIENT LIST shows it,
    /// compared up to a NUL as Redis's `strcmp` does.
    pub(crate) addr: Option<Vec<u8>>,
    /// `LADDR`: the proxy address the client connected to.
    pub(crate) laddr: Option<Vec<u8>>,
    /// `ID`: the proxy's id of the client.
    pub(crate) id: Option<u64>,
    /// `TYPE`: which kind of client.
    pub(crate) kind: Option<ClientType>,
    /// `USER`: the user CLIENT LIST shows for the client.
    pub(crate) user: Option<Vec<u8>>,
    /// `SKIPME yes` (the new form's default): the caller is never killed.
    pub(crate) skipme: bool,
    /// `MAXAGE`: only clients connected at least this many seconds (0: any).
    pub(crate) max_age: i64,
}

/// Redis's client types, as `TYPE` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientType {
    /// Not subscribed (a MONITOR client is normal too, as in Redis).
    Normal,
    /// Subscribed to something.
    Pubsub,
    /// A replica or a primary: none of the proxy's clients is either.
    Replication,
}

/// The filter of a `CLIENT KILL` line, or the error reply Redis gives for it.
pub(super) fn parse<L: CommandLine + ?Sized>(line: &L) -> Result<KillFilter, Bytes> {
    let argc = line.argc();
    if argc == 3 {
        return Ok(KillFilter {
            old_form: true,
            addr: Some(line.arg(2).to_vec()),
            ..KillFilter::default()
        });
    }
    if argc < 3 {
        return Err(answers::wrong_arity("client|kill"));
    }
    let mut filter = KillFilter {
        skipme: true,
        ..KillFilter::default()
    };
    let mut i = 2;
    while i < argc {
        let (option, more) = (line.arg(i), argc > i + 1);
        if !more {
            return Err(answers::syntax_error());
        }
        let value = line.arg(i + 1);
        if keyword(option, b"ID") {
            match codec::parse_int(value) {
                Some(id) if id >= 1 => filter.id = Some(id as u64),
                _ => return Err(answers::kill_bad_id()),
            }
        } else if keyword(option, b"TYPE") {
            filter.kind =
                Some(client_type(value).ok_or_else(|| answers::unknown_client_type(value))?);
        } else if keyword(option, b"ADDR") {
            filter.addr = Some(value.to_vec());
        } else if keyword(option, b"LADDR") {
            filter.laddr = Some(value.to_vec());
        } else if keyword(option, b"USER") {
            filter.user = Some(value.to_vec());
        } else if keyword(option, b"SKIPME") {
            if keyword(value, b"yes") {
                filter.skipme = true;
            } else if keyword(value, b"no") {
                filter.skipme = false;
            } else {
                return Err(answers::syntax_error());
            }
        } else if keyword(option, b"MAXAGE") {
            filter.max_age = codec::parse_int(value).ok_or_else(answers::kill_bad_maxage)?;
        } else {
            return Err(answers::syntax_error());
        }
        i += 2;
    }
    Ok(filter)
}

/// Redis's `getClientTypeByName` (`strcasecmp`, so `pubsub\0` is `pubsub`).
fn client_type(name: &[u8]) -> Option<ClientType> {
    if keyword(name, b"normal") {
        Some(ClientType::Normal)
    } else if keyword(name, b"pubsub") {
        Some(ClientType::Pubsub)
    } else if ["slave", "replica", "master"]
        .iter()
        .any(|t| keyword(name, t.as_bytes()))
    {
        Some(ClientType::Replication)
    } else {
        None
    }
}

/// C's `strcmp(shown, arg) == 0` where `arg` is a Redis argument: it ends at its first NUL.
pub(super) fn same_text(shown: &str, arg: &[u8]) -> bool {
    let end = arg.iter().position(|&b| b == 0).unwrap_or(arg.len());
    shown.as_bytes() == &arg[..end]
}

/// What one client looks like to the filter.
pub(super) struct Candidate<'a> {
    /// Its address, `ip:port`.
    pub(crate) addr: &'a str,
    /// The proxy address it connected to.
    pub(crate) laddr: &'a str,
    /// Its proxy id.
    pub(crate) id: u64,
    /// Subscribed (CLIENT LIST's `P` flag).
    pub(crate) pubsub: bool,
    /// The user CLIENT LIST shows.
    pub(crate) user: &'a [u8],
    /// Seconds since it connected.
    pub(crate) age: u64,
    /// It is the caller.
    pub(crate) is_caller: bool,
}

impl KillFilter {
    /// Whether the filter names `c`, in the order Redis checks (every check must pass).
    pub(super) fn matches(&self, c: &Candidate<'_>) -> bool {
        if self.addr.as_ref().is_some_and(|a| !same_text(c.addr, a))
            || self.laddr.as_ref().is_some_and(|a| !same_text(c.laddr, a))
        {
            return false;
        }
        match self.kind {
            Some(ClientType::Normal) if c.pubsub => return false,
            Some(ClientType::Pubsub) if !c.pubsub => return false,
            Some(ClientType::Replication) => return false,
            _ => {}
        }
        if self.id.is_some_and(|id| id != c.id)
            || self.user.as_ref().is_some_and(|u| u.as_slice() != c.user)
            || (c.is_caller && self.skipme)
        {
            return false;
        }
        // Redis 7.4: `max_age != 0 && age < max_age` skips the client.
        !(self.max_age != 0 && (c.age as i128) < i128::from(self.max_age))
    }

    /// The reply once `killed` clients are closed: the old form's `+OK` or `No such client`,
    /// the new form's count.
    pub(super) fn reply(&self, killed: usize) -> Bytes {
        match (self.old_form, killed) {
            (true, 0) => answers::no_such_client(),
            (true, _) => answers::ok(),
            (false, n) => answers::integer(n as i64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &[&[u8]]) -> Result<KillFilter, Bytes> {
        parse(args)
    }

    fn candidate(id: u64) -> Candidate<'static> {
        Candidate {
            addr: "127.0.0.1:5000",
            laddr: "127.0.0.1:6380",
            id,
            pubsub: false,
            user: b"default",
            age: 10,
            is_caller: false,
        }
    }

    #[test]
    fn the_old_form_is_three_arguments() {
        let f = parsed(&[b"CLIENT", b"KILL", b"127.0.0.1:5000"]).unwrap();
        assert!(f.old_form && !f.skipme);
        assert!(f.matches(&candidate(1)));
        // `CLIENT KILL ID` is the old form too: an address no client has.
        let f = parsed(&[b"CLIENT", b"KILL", b"ID"]).unwrap();
        assert!(!f.matches(&candidate(1)));
        assert_eq!(&f.reply(0)[..], b"-ERR No such client\r\n");
    }

    #[test]
    fn options_are_walked_as_redis_walks_them() {
        let f = parsed(&[b"CLIENT", b"KILL", b"id\0x", b"5", b"ID", b"7"]).unwrap();
        assert_eq!(f.id, Some(7), "the last ID wins");
        assert!(f.skipme);
        let f = parsed(&[b"CLIENT", b"KILL", b"TYPE", b"ID", b"SKIPME", b"no"]);
        assert_eq!(
            &f.unwrap_err()[..],
            b"-ERR Unknown client type 'ID'\r\n",
            "TYPE consumes the word after it"
        );
        assert_eq!(
            &parsed(&[b"CLIENT", b"KILL", b"ID", b"1", b"SKIPME"]).unwrap_err()[..],
            b"-ERR syntax error\r\n"
        );
        assert_eq!(
            &parsed(&[b"CLIENT", b"KILL", b"ID", b"0"]).unwrap_err()[..],
            b"-ERR client-id should be greater than 0\r\n"
        );
        assert_eq!(
            &parsed(&[b"CLIENT", b"KILL", b"SKIPME", b"maybe"]).unwrap_err()[..],
            b"-ERR syntax error\r\n"
        );
    }

    #[test]
    fn every_filter_narrows() {
        let f = parsed(&[
            b"CLIENT",
            b"KILL",
            b"ADDR",
            b"127.0.0.1:5000\0",
            b"TYPE",
            b"normal",
        ])
        .unwrap();
        assert!(f.matches(&candidate(1)));
        assert!(!f.matches(&Candidate {
            pubsub: true,
            ..candidate(1)
        }));
        assert!(!f.matches(&Candidate {
            is_caller: true,
            ..candidate(1)
        }));
        let f = parsed(&[b"CLIENT", b"KILL", b"LADDR", b"127.0.0.1:6381"]).unwrap();
        assert!(!f.matches(&candidate(1)));
        let f = parsed(&[b"CLIENT", b"KILL", b"USER", b"app", b"MAXAGE", b"5"]).unwrap();
        assert!(!f.matches(&candidate(1)));
        assert!(f.matches(&Candidate {
            user: b"app",
            ..candidate(1)
        }));
        assert!(!f.matches(&Candidate {
            user: b"app",
            age: 4,
            ..candidate(1)
        }));
        let f = parsed(&[b"CLIENT", b"KILL", b"TYPE", b"master"]).unwrap();
        assert!(!f.matches(&candidate(1)));
    }
}
