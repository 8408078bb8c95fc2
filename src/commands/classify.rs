//! Command classification: what the session must know about a command to route it.
//!
//! Only commands that change connection state or block need a kind of their own; everything
//! else is `Plain` and is forwarded as it is. Names are compared case-insensitively through a
//! stack buffer, so classifying costs no allocation.

use crate::commands::grammar;
use crate::protocol::reply::SubKind;

/// What a command means for routing and session state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Stateless for the connection: forwarded on the session's current connection.
    Plain,
    /// Blocks its connection (BLPOP, BZPOPMIN…): runs on a dedicated connection so that only its
    /// own client waits.
    Blocking,
    /// WAIT/WAITAOF: blocking, and about the writes the client made before.
    Wait,
    /// XREAD/XREADGROUP: blocking only with a BLOCK argument.
    StreamRead,
    /// EVAL/EVALSHA/FCALL and their read-only forms: a script may keep Redis busy past
    /// `busy-reply-threshold`, holding every command queued behind it on its connection.
    Script,
    /// MULTI: opens a transaction on the session's connection.
    Multi,
    /// EXEC: runs it (and ends it, as does a refused EXEC).
    Exec,
    /// DISCARD: ends it unrun.
    Discard,
    /// WATCH: keys whose change aborts the next EXEC; pins the connection.
    Watch,
    /// UNWATCH.
    Unwatch,
    /// SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE: the connection enters the subscribed context.
    Subscribe(SubKind),
    /// Their UNSUBSCRIBE forms.
    Unsubscribe(SubKind),
    /// HELLO: protocol, login and name, answered about the client.
    Hello,
    /// AUTH: the proxy's own login or the upstream's.
    Auth,
    /// SELECT: the connection's database.
    Select,
    /// CLIENT …: the subcommand decides.
    Client,
    /// QUIT: answered, then the connection closes.
    Quit,
    /// RESET: every state of the connection back to a fresh one.
    Reset,
    /// MONITOR: the connection becomes a feed.
    Monitor,
    /// SYNC, PSYNC, REPLCONF: between a replica and its server. SYNC's reply is a replication
    /// stream, not a reply; REPLCONF ACK and GETACK get no reply at all, so on a shared
    /// connection the next client's reply would be taken for theirs.
    Replication,
    /// INFO: the upstream's answer gains the proxy's own `# Proxy` section.
    Info,
    /// PROXY …: the proxy's own admin commands (not a Redis command).
    Proxy,
    /// SCRIPT …: `SCRIPT DEBUG YES|SYNC` would turn the connection it runs on into a Lua
    /// debugger session ([`script_debugger`]); the rest is plain.
    ScriptAdmin,
}

/// Longest command name worth looking up; longer names are unknown to this table.
const MAX_NAME: usize = 24;

/// Classifies a command by its name (first argument).
pub fn classify(name: &[u8]) -> Kind {
    let mut buf = [0u8; MAX_NAME];
    let Some(upper) = uppercase(name, &mut buf) else {
        return Kind::Plain;
    };
    match upper {
        b"GET" | b"SET" | b"INCR" | b"DEL" | b"MGET" | b"MSET" | b"HSET" | b"HGET" | b"EXPIRE"
        | b"LPUSH" | b"RPUSH" | b"LPOP" | b"RPOP" | b"SADD" | b"ZADD" | b"PING" => Kind::Plain,
        b"BLPOP" | b"BRPOP" | b"BRPOPLPUSH" | b"BLMOVE" | b"BLMPOP" | b"BZPOPMIN" | b"BZPOPMAX"
        | b"BZMPOP" => Kind::Blocking,
        b"WAIT" | b"WAITAOF" => Kind::Wait,
        b"XREAD" | b"XREADGROUP" => Kind::StreamRead,
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => Kind::Script,
        b"MULTI" => Kind::Multi,
        b"EXEC" => Kind::Exec,
        b"DISCARD" => Kind::Discard,
        b"WATCH" => Kind::Watch,
        b"UNWATCH" => Kind::Unwatch,
        b"SUBSCRIBE" => Kind::Subscribe(SubKind::Channel),
        b"PSUBSCRIBE" => Kind::Subscribe(SubKind::Pattern),
        b"SSUBSCRIBE" => Kind::Subscribe(SubKind::Shard),
        b"UNSUBSCRIBE" => Kind::Unsubscribe(SubKind::Channel),
        b"PUNSUBSCRIBE" => Kind::Unsubscribe(SubKind::Pattern),
        b"SUNSUBSCRIBE" => Kind::Unsubscribe(SubKind::Shard),
        b"HELLO" => Kind::Hello,
        b"AUTH" => Kind::Auth,
        b"SELECT" => Kind::Select,
        b"CLIENT" => Kind::Client,
        b"QUIT" => Kind::Quit,
        b"RESET" => Kind::Reset,
        b"MONITOR" => Kind::Monitor,
        b"SYNC" | b"PSYNC" | b"REPLCONF" => Kind::Replication,
        b"INFO" => Kind::Info,
        b"PROXY" => Kind::Proxy,
        b"SCRIPT" => Kind::ScriptAdmin,
        _ => Kind::Plain,
    }
}

/// ASCII-uppercases `name` into `buf`; `None` when it does not fit.
#[inline]
pub(crate) fn uppercase<'a>(name: &[u8], buf: &'a mut [u8; MAX_NAME]) -> Option<&'a [u8]> {
    if name.len() > MAX_NAME {
        return None;
    }
    let out = &mut buf[..name.len()];
    for (o, c) in out.iter_mut().zip(name) {
        *o = c.to_ascii_uppercase();
    }
    Some(out)
}

/// Whether an XREAD/XREADGROUP argument list asks to block, its options read as Redis reads
/// them ([`grammar::xread_options`]: `BLOCK\0` is BLOCK, a group named `STREAMS` is a name).
/// Arguments Redis would refuse count as blocking: such a command only costs a dedicated
/// connection, while a blocking read misjudged as quick would stall every client of a shared
/// one.
pub(crate) fn stream_read_blocks<'a>(args: impl Iterator<Item = &'a [u8]>) -> bool {
    let args: Vec<&[u8]> = args.collect();
    let group = args
        .first()
        .is_some_and(|n| n.eq_ignore_ascii_case(b"XREADGROUP"));
    grammar::xread_options(&args[..], group).is_none_or(|o| o.block.is_some())
}

/// How long a blocking command (a [`Kind::Blocking`], [`Kind::Wait`] or blocking
/// [`Kind::StreamRead`] command, all arguments given) may block before Redis answers it by
/// itself: `Some(limit)` from its own timeout argument, `None` when it may block forever
/// (timeout 0) or the argument is not one the proxy can read. An unreadable argument gets no
/// limit rather than a guessed one: cutting a command that is still waiting as asked could
/// lose the element it pops later. A value Redis refuses (negative, out of range) gets a zero
/// limit, as Redis answers it at once.
pub(crate) fn block_limit(args: &[&[u8]]) -> Option<std::time::Duration> {
    let mut buf = [0u8; MAX_NAME];
    let name = uppercase(args.first()?, &mut buf)?;
    match name {
        // Timeouts in seconds, possibly fractional: last argument, or first for the M forms.
        b"BLPOP" | b"BRPOP" | b"BRPOPLPUSH" | b"BLMOVE" | b"BZPOPMIN" | b"BZPOPMAX" => {
            seconds(args.last()?)
        }
        b"BLMPOP" | b"BZMPOP" => seconds(args.get(1)?),
        // Timeouts in milliseconds.
        b"WAIT" => millis(args.get(2)?),
        b"WAITAOF" => millis(args.get(3)?),
        b"XREAD" | b"XREADGROUP" => millis(stream_block_arg(args)?),
        _ => None,
    }
}

/// The argument of the `BLOCK` option of XREAD/XREADGROUP that Redis applies.
fn stream_block_arg<'a>(args: &[&'a [u8]]) -> Option<&'a [u8]> {
    let group = args.first()?.eq_ignore_ascii_case(b"XREADGROUP");
    let at = grammar::xread_options(args, group)?.block?;
    Some(args[at])
}

/// A timeout in seconds as Redis reads it (a float; 0 is forever).
fn seconds(arg: &[u8]) -> Option<std::time::Duration> {
    let secs: f64 = std::str::from_utf8(arg).ok()?.parse().ok()?;
    if secs == 0.0 {
        return None;
    }
    // Negative, infinite or beyond any deadline: Redis refuses it at once.
    Some(std::time::Duration::try_from_secs_f64(secs).unwrap_or_default())
}

/// A timeout in milliseconds as Redis reads it (an integer; 0 is forever).
fn millis(arg: &[u8]) -> Option<std::time::Duration> {
    let ms: i64 = std::str::from_utf8(arg).ok()?.parse().ok()?;
    match ms {
        0 => None,
        // Negative: Redis refuses it at once.
        ms => Some(std::time::Duration::from_millis(ms.max(0) as u64)),
    }
}

/// Whether a SCRIPT command asks for the Lua debugger: `SCRIPT DEBUG YES` or `SYNC`, read as
/// Redis reads them (the mode ends at a NUL byte: `strcasecmp`; a subcommand name with one
/// never gets here, `session::route::nul_in_name`). A debugger session is not one command
/// and one reply: the EVAL after it stops for debugger commands (SYNC stops the whole server
/// while it waits), the debugger's `redis` command runs commands no rule sees, and a forked
/// session ends by closing the connection. On a connection the proxy shares, or hands to
/// another client later, another client's EVAL would start it.
/// `sub` and `mode` are arguments 1 and 2 of a three-argument SCRIPT command (SCRIPT DEBUG's
/// arity is 3: any other count is Redis's arity error).
pub(crate) fn script_debugger(sub: &[u8], mode: &[u8]) -> bool {
    grammar::keyword(sub, b"DEBUG")
        && (grammar::keyword(mode, b"YES") || grammar::keyword(mode, b"SYNC"))
}

/// CLIENT subcommands the session handles or routes specially.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientSub {
    SetName,
    GetName,
    Id,
    Reply,
    /// INFO: answered by the upstream about the shared connection, then made about the client.
    Info,
    /// TRACKING, CACHING, NO-EVICT, NO-TOUCH: state of the upstream connection itself.
    ConnectionState,
    /// UNBLOCK <id>: names another client by the id the proxy gave it.
    Unblock,
    /// KILL: carried out by the proxy on its own clients (`session::client_kill`).
    Kill,
    /// PAUSE <ms> [WRITE|ALL]: the proxy routes around what Redis holds back.
    Pause,
    /// UNPAUSE.
    Unpause,
    /// LIST: answered by the proxy about its own clients.
    List,
    /// GETREDIR, TRACKINGINFO: the reply names the redirect client by its upstream id.
    Redirect,
    /// SETINFO: answered by the proxy where the server has it (forwarded to a server without
    /// it, for that server's own error).
    SetInfo,
    /// The rest: forwarded.
    Other,
}

/// Classifies the subcommand of CLIENT (a name with a NUL byte never gets here:
/// `session::route::nul_in_name` answers it as unknown).
pub(crate) fn classify_client(sub: &[u8]) -> ClientSub {
    let mut buf = [0u8; MAX_NAME];
    match uppercase(sub, &mut buf) {
        Some(b"SETNAME") => ClientSub::SetName,
        Some(b"GETNAME") => ClientSub::GetName,
        Some(b"ID") => ClientSub::Id,
        Some(b"REPLY") => ClientSub::Reply,
        Some(b"INFO") => ClientSub::Info,
        // CAPA (Valkey 8+: `redirect` changes what a paused or replica server answers) and
        // IMPORT-SOURCE (Valkey 8.1+) mark the connection too.
        Some(b"TRACKING" | b"CACHING" | b"NO-EVICT" | b"NO-TOUCH" | b"CAPA" | b"IMPORT-SOURCE") => {
            ClientSub::ConnectionState
        }
        Some(b"UNBLOCK") => ClientSub::Unblock,
        Some(b"KILL") => ClientSub::Kill,
        Some(b"PAUSE") => ClientSub::Pause,
        Some(b"UNPAUSE") => ClientSub::Unpause,
        Some(b"LIST") => ClientSub::List,
        Some(b"SETINFO") => ClientSub::SetInfo,
        Some(b"GETREDIR" | b"TRACKINGINFO") => ClientSub::Redirect,
        _ => ClientSub::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_is_case_insensitive() {
        assert_eq!(classify(b"get"), Kind::Plain);
        assert_eq!(classify(b"bLpOp"), Kind::Blocking);
        assert_eq!(classify(b"multi"), Kind::Multi);
        assert_eq!(classify(b"ssubscribe"), Kind::Subscribe(SubKind::Shard));
        assert_eq!(classify(&[b'x'; 100]), Kind::Plain);
        assert_eq!(classify_client(b"setname"), ClientSub::SetName);
        assert_eq!(classify_client(b"tracking"), ClientSub::ConnectionState);
        assert_eq!(classify(b"script"), Kind::ScriptAdmin);
    }

    #[test]
    fn valkeys_connection_marks_are_connection_state() {
        assert_eq!(classify_client(b"capa"), ClientSub::ConnectionState);
        assert_eq!(
            classify_client(b"IMPORT-SOURCE"),
            ClientSub::ConnectionState
        );
    }

    #[test]
    fn the_debugger_is_asked_for_in_every_spelling_redis_reads() {
        let asks = |parts: &[&[u8]]| matches!(parts, [_, sub, mode] if script_debugger(sub, mode));
        assert!(asks(&[b"SCRIPT", b"DEBUG", b"YES"]));
        assert!(asks(&[b"script", b"debug", b"sync"]));
        assert!(asks(&[b"SCRIPT", b"Debug", b"yes\0junk"]));
        assert!(!asks(&[b"SCRIPT", b"DEBUG", b"NO"]));
        assert!(!asks(&[b"SCRIPT", b"DEBUG", b"yess"]));
        assert!(!asks(&[b"SCRIPT", b"DEBUG", b"YES", b"x"]));
        assert!(!asks(&[b"SCRIPT", b"FLUSH", b"SYNC"]));
    }

    #[test]
    fn xread_blocks_only_with_block_before_streams() {
        let v = |s: &str| -> bool {
            let parts: Vec<&[u8]> = s.split(' ').map(str::as_bytes).collect();
            stream_read_blocks(parts.into_iter())
        };
        assert!(v("XREAD BLOCK 0 STREAMS s $"));
        assert!(!v("XREAD COUNT 1 STREAMS block 0"));
        assert!(v("XREADGROUP GROUP g c BLOCK 10 STREAMS s >"));
    }

    #[test]
    fn block_limits_come_from_each_command_own_timeout() {
        use std::time::Duration;
        let limit = |s: &str| {
            let parts: Vec<&[u8]> = s.split(' ').map(str::as_bytes).collect();
            block_limit(&parts)
        };
        assert_eq!(limit("BLPOP a b 2"), Some(Duration::from_secs(2)));
        assert_eq!(limit("brpop a 0.25"), Some(Duration::from_millis(250)));
        assert_eq!(limit("BLPOP a 0"), None);
        assert_eq!(
            limit("BLMOVE a b LEFT RIGHT 1.5"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(limit("BZMPOP 3 1 z MIN"), Some(Duration::from_secs(3)));
        assert_eq!(limit("BLMPOP 0 1 l LEFT"), None);
        assert_eq!(limit("WAIT 1 100"), Some(Duration::from_millis(100)));
        assert_eq!(limit("WAIT 1 0"), None);
        assert_eq!(limit("WAITAOF 1 0 250"), Some(Duration::from_millis(250)));
        assert_eq!(
            limit("XREAD COUNT 5 BLOCK 700 STREAMS s $"),
            Some(Duration::from_millis(700))
        );
        assert_eq!(limit("XREAD BLOCK 0 STREAMS s $"), None);
        assert_eq!(
            limit("XREADGROUP GROUP BLOCK 9 BLOCK 40 STREAMS s >"),
            Some(Duration::from_millis(40))
        );
        // Unreadable: no limit rather than a wrong one. Refused by Redis: answered at once.
        assert_eq!(limit("BLPOP a 0x10"), None);
        assert_eq!(limit("BLPOP a -1"), Some(Duration::ZERO));
        assert_eq!(limit("BLPOP a 1e300"), Some(Duration::ZERO));
        assert_eq!(limit("BLPOP a inf"), Some(Duration::ZERO));
    }
}
