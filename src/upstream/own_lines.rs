//! The proxy's own commands, kept out of its clients' MONITOR.
//!
//! Redis's MONITOR shows every command every connection runs, the proxy's own included: the
//! `HELLO` (and `READONLY`, `SELECT`, the script user's `AUTH`) of each connection it dials,
//! and the `INFO`, `COMMAND`, `PING`, `CLUSTER SHARDS` and rate-limit scripts of its control
//! connections. One Redis has none of them, and a client monitoring through the proxy is
//! watching what clients run (Redis's own `unit/introspection` reads the lines right after the
//! ones its commands caused, and lost them to a refill's `HELLO`). So the proxy notes each of
//! its connections while it speaks there on its own account, and the reader of a monitoring
//! connection drops a line that one of them caused.
//!
//! A line names its connection by the address Redis sees (`[0 127.0.0.1:50412]`): the
//! proxy's local address. The note holds it with the node's address, since one local port
//! can serve connections to several nodes at once. One registry for the process, not one per
//! pool: the connections that speak (pools, dedicated stocks, topology queries) and the
//! monitoring ones that read are made in different places, and the pair of addresses names
//! one live connection on this host. A line whose address Redis sees translated (NAT) matches
//! nothing and is shown, as before.
//!
//! A handshake's note stays for [`GRACE`] after the handshake ends: Redis writes the
//! monitor's line and the handshake's reply in the same turn of its loop, but the proxy may
//! read the monitoring connection later. Within that time only the commands the handshake
//! sent are dropped (by name), so a client's first commands on a fresh connection are shown
//! (but for one it sends within those seconds that has a handshake command's name: a `HELLO`
//! the proxy forwards, on a connection whose handshake sent one).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// How long a finished handshake's lines are still dropped: far longer than the proxy takes
/// to read two sockets that Redis wrote in one turn, short enough that a client's own
/// `HELLO` on that connection a moment later is shown.
const GRACE: Duration = Duration::from_secs(3);

/// The commands a handshake may send, as the proxy spells them (`handshake::hello`,
/// `script_login`): a [`Says::Handshake`] names the ones its connection sent, so a client's
/// own `SELECT` on a fresh connection is shown when the handshake selected nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sent {
    /// `HELLO` (with the proxy's `AUTH` inside it, which Redis redacts).
    pub(crate) hello: bool,
    /// `READONLY` (a cluster whose reads may go to replicas).
    pub(crate) readonly: bool,
    /// `SELECT` (a route's database).
    pub(crate) select: bool,
    /// `AUTH` as the script user (`script_login`).
    pub(crate) auth: bool,
}

impl Sent {
    /// Whether the command `name` is one of them.
    fn names(self, name: &[u8]) -> bool {
        (self.hello && name == b"HELLO")
            || (self.readonly && name == b"READONLY")
            || (self.select && name == b"SELECT")
            || (self.auth && name == b"AUTH")
    }
}

/// What of a connection's lines are the proxy's own.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Says {
    /// Every line: a control connection or a topology query carries nothing of a client's.
    Everything,
    /// The handshake's commands.
    Handshake(Sent),
}

/// One connection that speaks on the proxy's account.
struct Note {
    /// Which note, so the guard that ends it finds it.
    id: u64,
    /// The node's address: the monitoring connection's peer.
    node: SocketAddr,
    /// The proxy's local address, as a MONITOR line shows it (`SocketAddr`'s display is
    /// Redis's: `ip:port`, `[ipv6]:port`).
    local: Box<str>,
    /// Which of its lines to drop.
    says: Says,
    /// When the note lapses: `None` while its guard lives.
    until: Option<Instant>,
}

/// Every live note. A few at a time (a control connection per node, handshakes of the last
/// seconds); looked at only by monitoring connections, once per line.
static NOTES: Mutex<Vec<Note>> = Mutex::new(Vec::new());
/// The next note's id.
static NEXT: AtomicU64 = AtomicU64::new(0);

fn notes() -> MutexGuard<'static, Vec<Note>> {
    NOTES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps a note while the connection speaks on the proxy's account; dropped, the note lapses
/// after [`GRACE`].
#[must_use = "the note lasts as long as the guard"]
pub(crate) struct Speaking {
    /// The note's id; `None` when the connection had no address to note.
    id: Option<u64>,
}

impl Drop for Speaking {
    fn drop(&mut self) {
        let Some(id) = self.id else { return };
        let until = Instant::now() + GRACE;
        if let Some(note) = notes().iter_mut().find(|n| n.id == id) {
            note.until = Some(until);
        }
    }
}

/// Notes the connection from `local` to `node` (either `None`: an address the socket could
/// not give, so nothing is noted) until the guard is dropped, and for [`GRACE`] after.
pub(crate) fn speaking(
    node: Option<SocketAddr>,
    local: Option<SocketAddr>,
    says: Says,
) -> Speaking {
    let (Some(node), Some(local)) = (node, local) else {
        return Speaking { id: None };
    };
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut notes = notes();
    prune(&mut notes, Instant::now());
    notes.push(Note {
        id,
        node,
        local: local.to_string().into(),
        says,
        until: None,
    });
    Speaking { id: Some(id) }
}

/// Drops the notes that lapsed.
fn prune(notes: &mut Vec<Note>, now: Instant) {
    notes.retain(|n| n.until.is_none_or(|t| t > now));
}

/// What a monitoring connection does with a line (`judge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Judged {
    /// The line shows the proxy's own command: dropped.
    pub(crate) own: bool,
    /// It was one of the proxy's scripts (a Redis-counted rate limit's `EVALSHA`): the `lua`
    /// lines right after it are that script's calls, the proxy's too. Redis writes a
    /// script's line before its calls' (7.0 to 8.0, Valkey 9, 6.0 alike: checked by hand),
    /// and no other command runs in between.
    pub(crate) script_follows: bool,
}

/// How the MONITOR line `line`, read from a connection to `node`, is judged, the line before
/// it having been one of the proxy's scripts or its calls (`after_own_script`).
pub(crate) fn judge(node: SocketAddr, line: &[u8], after_own_script: bool) -> Judged {
    let client = Judged {
        own: false,
        script_follows: false,
    };
    let Some((local, name)) = parse(line) else {
        return client;
    };
    if local == b"lua" {
        return Judged {
            own: after_own_script,
            script_follows: after_own_script,
        };
    }
    let own = is_own(node, local, name);
    Judged {
        own,
        script_follows: own && SCRIPTS.iter().any(|s| name.eq_ignore_ascii_case(s)),
    }
}

/// The commands that run a script, whose calls MONITOR shows as `lua` lines after them.
const SCRIPTS: [&[u8]; 6] = [
    b"EVAL",
    b"EVALSHA",
    b"EVAL_RO",
    b"EVALSHA_RO",
    b"FCALL",
    b"FCALL_RO",
];

/// Whether a line of the connection at `local` naming the command `name`, read from a
/// connection to `node`, shows a command the proxy ran on its own account.
fn is_own(node: SocketAddr, local: &[u8], name: &[u8]) -> bool {
    let mut notes = notes();
    prune(&mut notes, Instant::now());
    notes.iter().any(|n| {
        n.node == node
            && n.local.as_bytes() == local
            && match n.says {
                Says::Everything => true,
                Says::Handshake(sent) => sent.names(name),
            }
    })
}

/// A MONITOR line's client address and command name: `+<time> [<db> <addr>] "<name>" …`
/// (a script's calls: `[<db> lua]`). `None` for a line of another shape.
fn parse(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let open = line.iter().position(|&b| b == b'[')?;
    let rest = &line[open + 1..];
    let space = rest.iter().position(|&b| b == b' ')?;
    let rest = &rest[space + 1..];
    // `] "` ends the address: an IPv6 address's own `]` is followed by `:`.
    let end = rest.windows(3).position(|w| w == b"] \"")?;
    let addr = &rest[..end];
    let rest = &rest[end + 3..];
    let close = rest.iter().position(|&b| b == b'"')?;
    Some((addr, &rest[..close]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Whether `line` is dropped when it comes on its own.
    fn hidden(node: SocketAddr, line: &[u8]) -> bool {
        judge(node, line, false).own
    }

    #[test]
    fn a_line_is_read_for_its_address_and_name() {
        let line = b"+1796684989.703528 [0 127.0.0.1:44084] \"HELLO\" \"2\"\r\n";
        assert_eq!(
            parse(line),
            Some((b"127.0.0.1:44084".as_slice(), b"HELLO".as_slice()))
        );
        let v6 = b"+1.0 [12 [::1]:6001] \"set\" \"a\" \"]\"\r\n";
        assert_eq!(
            parse(v6),
            Some((b"[::1]:6001".as_slice(), b"set".as_slice()))
        );
        assert_eq!(parse(b"+1.0 [0 lua] \"get\" \"k\"\r\n").unwrap().0, b"lua");
        assert_eq!(parse(b"+OK\r\n"), None);
    }

    #[test]
    fn a_handshake_hides_its_own_names_only_and_lapses() {
        let node = addr("127.0.0.1:7001");
        let local = addr("127.0.0.1:50001");
        let hello = b"+1.0 [0 127.0.0.1:50001] \"HELLO\" \"3\"\r\n";
        let auth = b"+1.0 [0 127.0.0.1:50001] \"AUTH\" \"(redacted)\"\r\n";
        let set = b"+1.0 [0 127.0.0.1:50001] \"SET\" \"k\" \"v\"\r\n";
        let other_port = b"+1.0 [0 127.0.0.1:50002] \"HELLO\" \"3\"\r\n";
        {
            let sent = Sent {
                hello: true,
                auth: true,
                ..Sent::default()
            };
            let _guard = speaking(Some(node), Some(local), Says::Handshake(sent));
            assert!(hidden(node, hello));
            assert!(hidden(node, auth));
            assert!(!hidden(node, set), "a client's command is shown");
            let select = b"+1.0 [0 127.0.0.1:50001] \"SELECT\" \"1\"\r\n";
            assert!(!hidden(node, select), "the handshake selected nothing");
            assert!(!hidden(node, other_port));
            assert!(
                !hidden(addr("127.0.0.1:7002"), hello),
                "the same port towards another node is another connection"
            );
        }
        // Dropped: still hidden within the grace.
        assert!(hidden(node, hello));
        let id = notes().iter().find(|n| n.node == node).map(|n| n.id);
        for note in notes().iter_mut().filter(|n| Some(n.id) == id) {
            note.until = Some(Instant::now() - Duration::from_millis(1));
        }
        assert!(!hidden(node, hello), "lapsed");
        assert!(notes().iter().all(|n| Some(n.id) != id), "pruned");
    }

    #[test]
    fn the_calls_of_the_proxys_own_script_are_its_own_too() {
        let node = addr("127.0.0.1:7004");
        let _control = speaking(Some(node), Some(addr("127.0.0.1:50021")), Says::Everything);
        let script = b"+1.0 [0 127.0.0.1:50021] \"EVALSHA\" \"abc\" \"1\" \"k\"\r\n";
        let call = b"+1.0 [0 lua] \"hincrby\" \"k\" \"f\" \"1\"\r\n";
        let client = b"+1.0 [0 127.0.0.1:50022] \"GET\" \"k\"\r\n";
        let judged = judge(node, script, false);
        assert!(judged.own && judged.script_follows);
        let judged = judge(node, call, true);
        assert!(judged.own && judged.script_follows, "its call");
        let judged = judge(node, client, true);
        assert!(
            !judged.own && !judged.script_follows,
            "a client's line ends it"
        );
        assert!(
            !judge(node, call, false).own,
            "a client's script's calls are shown"
        );
        let info = b"+1.0 [0 127.0.0.1:50021] \"INFO\" \"server\"\r\n";
        assert!(!judge(node, info, false).script_follows);
    }

    #[test]
    fn a_raw_connection_hides_only_its_select_and_a_control_one_everything() {
        let node = addr("127.0.0.1:7003");
        let select = Sent {
            select: true,
            ..Sent::default()
        };
        let raw = speaking(
            Some(node),
            Some(addr("127.0.0.1:50011")),
            Says::Handshake(select),
        );
        assert!(!hidden(
            node,
            b"+1.0 [2 127.0.0.1:50011] \"HELLO\" \"3\"\r\n"
        ));
        assert!(hidden(
            node,
            b"+1.0 [0 127.0.0.1:50011] \"SELECT\" \"2\"\r\n"
        ));
        assert!(!hidden(
            node,
            b"+1.0 [2 127.0.0.1:50011] \"AUTH\" \"x\"\r\n"
        ));
        let control = speaking(Some(node), Some(addr("127.0.0.1:50012")), Says::Everything);
        assert!(hidden(
            node,
            b"+1.0 [0 127.0.0.1:50012] \"INFO\" \"server\"\r\n"
        ));
        drop((raw, control));
        assert!(
            speaking(None, Some(addr("127.0.0.1:1")), Says::Everything)
                .id
                .is_none()
        );
    }
}
