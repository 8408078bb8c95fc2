//! What the mirror is sent for one answered batch: a pure function of the commands the
//! primary ran, its replies, and the state of the client that sent them (its database, its
//! open transaction), so every rule of what is mirrored is unit-tested without a server.
//!
//! The rules (docs/migration.md says the same to operators):
//! - A write is mirrored once the primary has answered it, and only if the primary did not
//!   refuse it: an error from the primary means nothing ran (a script is the exception: it may
//!   have written before failing, so it is mirrored whatever it answered).
//! - A transaction is mirrored at its EXEC, whole (`MULTI`, its writes, `EXEC`), and only if
//!   the primary ran it: an EXEC aborted by WATCH or by an error queues nothing.
//! - A blocking pop is mirrored as its non-blocking form on the key the primary popped from
//!   (`BLPOP a b 0` that popped from `b` becomes `LPOP b`), never as a blocking command that
//!   would hold the mirror's shared connection; one that timed out is not mirrored. Blocking
//!   commands without such a form are skipped and counted.
//! - `SELECT` is followed: the client's commands reach the mirror in the client's database.
//! - A share of the reads is compared: sent to the mirror too, the replies compared by
//!   [`super::compare`].

use std::collections::HashMap;
use std::ops::Range;

use bytes::{Bytes, BytesMut};

use super::compare::How;
use crate::commands::{self, CommandSpec, KeyPositions};
use crate::protocol::codec::{self, CodecLimits, Decoded};
use crate::protocol::resp_value::Value;

/// What to do with each reply the mirror sends back for a planned batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Check {
    /// Not looked at: a `SELECT` the mirror needed, `MULTI`, a `+QUEUED`.
    Ignore,
    /// A write (or EXEC) the primary acknowledged: an error here is counted.
    Write,
    /// A read to compare with the primary's reply.
    Compare(Compared),
}

/// A read sent to both servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Compared {
    /// The primary's reply, as its client got it.
    pub(crate) primary: Bytes,
    /// How the two replies are compared.
    pub(crate) how: How,
    /// The command, for the metrics and the log.
    pub(crate) command: &'static str,
    /// Its first key, for the prefix label and the log (a name, never a value).
    pub(crate) key: Bytes,
}

/// The mirror's part of one answered batch.
#[derive(Debug, Default)]
pub(super) struct Planned {
    /// The commands to send, one after the other.
    pub(crate) bytes: BytesMut,
    /// One entry per command in `bytes`, in order.
    pub(crate) checks: Vec<Check>,
    /// Writes among them (EXEC counts its transaction's writes).
    pub(crate) writes: u64,
    /// Reads among them, sent to be compared.
    pub(crate) reads: u64,
    /// Writes whose reply from the primary never came: whether they ran is unknown, so they
    /// are not mirrored.
    pub(crate) unknown: u64,
    /// Commands never mirrored by design (blocking commands without a non-blocking form).
    pub(crate) skipped: u64,
    /// Writes not mirrored because an earlier batch of the client was dropped.
    pub(crate) lost: u64,
}

/// One command of the batch and the primary's reply to it.
struct Step<'a> {
    /// The command's table entry (`None`: unknown to the table, never mirrored).
    spec: Option<&'static CommandSpec>,
    /// Its arguments, the name first.
    argv: &'a [&'a [u8]],
    /// Its bytes as the primary received them.
    frame: Bytes,
    /// The primary's reply.
    reply: Bytes,
}

/// What the mirror must remember of one client between its batches.
#[derive(Debug, Default)]
struct Client {
    /// The client's database (`SELECT`).
    db: i64,
    /// The transaction open since MULTI; `None` outside one.
    multi: Option<Queued>,
    /// A batch of this client never reached the planner (the queue was full): its database
    /// and transaction are not known any more, so none of its later writes is mirrored
    /// (each counted as dropped) until it is gone.
    untracked: bool,
}

/// What a client queued since MULTI.
#[derive(Debug, Default)]
struct Queued {
    /// Commands queued so far (`+QUEUED`), reads included: EXEC's reply has an element
    /// for each.
    seen: usize,
    /// The writes among them, with their position, to send with EXEC.
    writes: Vec<(usize, Bytes)>,
    /// More than [`MAX_QUEUED`] writes: the transaction is not mirrored (counted skipped).
    overflowed: bool,
}

/// A database the mirror connection may be in but the planner cannot know: after a batch
/// was dropped or the connection failed.
const UNKNOWN_DB: i64 = -1;

/// The planner's state: each client's, and each mirror connection's database.
#[derive(Debug)]
pub(super) struct Planner {
    /// Clients with state (a database other than 0, an open transaction); others have none.
    clients: HashMap<u64, Client>,
    /// The database each mirror connection (per RESP version) is in, as far as known.
    conn_db: [i64; 2],
    /// Reads compared per 10,000.
    compare_below: u64,
    /// Reads seen, which picks the compared ones (every `10,000 / share`-th).
    reads_seen: u64,
    /// For decoding the client's bytes (limits as wide as they come: the primary took them).
    limits: CodecLimits,
    /// Argument ranges of the command being planned, reused.
    args: Vec<Range<usize>>,
    /// Key positions of the command being planned, reused.
    keys: KeyPositions,
    /// The mirror has database 0 only (a Redis Cluster): a client's commands in another
    /// database are not mirrored (counted skipped) instead of sent after a `SELECT`.
    one_db: bool,
}

/// The most commands one client may have queued in a transaction for the mirror; a longer
/// transaction is not mirrored (counted as skipped), so a client cannot grow this memory.
const MAX_QUEUED: usize = 10_000;

impl Planner {
    /// A planner comparing `compare_below` reads in 10,000.
    pub(super) fn new(compare_below: u64) -> Planner {
        Planner {
            clients: HashMap::new(),
            conn_db: [0, 0],
            compare_below,
            reads_seen: 0,
            limits: CodecLimits::UNBOUNDED,
            args: Vec::new(),
            keys: KeyPositions::default(),
            one_db: false,
        }
    }

    /// The same, for a mirror with database 0 only (see `Planner::one_db`).
    pub(super) fn one_database(mut self) -> Planner {
        self.one_db = true;
        self
    }

    /// A batch of `client` was dropped before it was planned: stop mirroring it (see
    /// `Client::untracked`).
    pub(super) fn untrack(&mut self, client: u64) {
        self.clients.entry(client).or_default().untracked = true;
    }

    /// The client is gone: forget what was kept for it.
    pub(super) fn forget(&mut self, client: u64) {
        self.clients.remove(&client);
    }

    /// A batch for this RESP version's connection was not sent, or the connection failed:
    /// the database it is in is not known any more.
    pub(super) fn lost_track(&mut self, proto: u8) {
        self.conn_db[usize::from(proto == 3)] = UNKNOWN_DB;
    }

    /// Plans the mirror's part of a batch `client` sent in RESP `proto`: `commands` as the
    /// primary received them, `replies` as it answered (possibly fewer, when its connection
    /// failed).
    pub(super) fn plan(
        &mut self,
        client: u64,
        proto: u8,
        commands: &Bytes,
        replies: &Bytes,
    ) -> Planned {
        let mut out = Planned::default();
        let mut state = self.clients.remove(&client).unwrap_or_default();
        let conn = usize::from(proto == 3);
        let mut cpos = 0;
        let mut rpos = 0;
        while cpos < commands.len() {
            let decoded = match codec::decode(&commands[cpos..], &self.limits, &mut self.args) {
                Ok(Some(d)) => d,
                // A batch the primary ran is whole commands; anything else ends the plan.
                _ => break,
            };
            let frame = commands.slice(cpos..cpos + decoded.len());
            cpos += decoded.len();
            let whole = frame.clone();
            let inline_args;
            let argv: Vec<&[u8]> = match &decoded {
                Decoded::Empty { .. } => continue,
                Decoded::Command { .. } => self.args.iter().map(|r| &whole[r.clone()]).collect(),
                Decoded::Inline { args, .. } => {
                    inline_args = args.clone();
                    inline_args.iter().map(Vec::as_slice).collect()
                }
            };
            let reply = match crate::protocol::reply::scan(&replies[rpos..]) {
                Ok(Some(len)) => {
                    let r = replies.slice(rpos..rpos + len);
                    rpos += len;
                    Some(r)
                }
                _ => None,
            };
            let Some(name) = argv.first() else { continue };
            let spec = commands::lookup(name, argv.get(1).copied());
            let Some(reply) = reply else {
                if spec.is_some_and(|s| s.may_write()) || state.multi.is_some() {
                    out.unknown += 1;
                }
                continue;
            };
            let step = Step {
                spec,
                argv: &argv,
                frame,
                reply,
            };
            self.one(&mut out, &mut state, conn, step);
        }
        if state.untracked {
            out.lost = out.writes;
            out.writes = 0;
            out.reads = 0;
            out.bytes.clear();
            out.checks.clear();
        }
        if state.db != 0 || state.multi.is_some() || state.untracked {
            self.clients.insert(client, state);
        }
        out
    }

    /// Plans one command and its reply from the primary.
    fn one(&mut self, out: &mut Planned, state: &mut Client, conn: usize, step: Step<'_>) {
        let Step {
            spec,
            argv,
            frame,
            reply,
        } = step;
        let refused = reply.first() == Some(&b'-') || reply.first() == Some(&b'!');
        let name = spec.map_or("", |s| s.name);
        match name {
            "multi" => {
                if !refused {
                    state.multi = Some(Queued::default());
                }
                return;
            }
            "discard" => {
                state.multi = None;
                return;
            }
            "exec" => {
                if let Some(queued) = state.multi.take() {
                    self.exec(out, state, conn, queued, &frame, &reply);
                }
                return;
            }
            _ => {}
        }
        if let Some(queued) = &mut state.multi {
            // Inside MULTI the primary answers `+QUEUED` (or refuses the command, and EXEC
            // will abort): keep what the mirror must run at EXEC.
            if !reply.starts_with(b"+QUEUED") {
                return;
            }
            let at = queued.seen;
            queued.seen += 1;
            let mirrored =
                spec.is_some_and(|s| s.may_write() || is_mirrored_admin(s)) || name == "select";
            if mirrored && !queued.overflowed {
                if queued.writes.len() < MAX_QUEUED {
                    queued.writes.push((at, frame));
                } else {
                    queued.overflowed = true;
                    queued.writes = Vec::new();
                    out.skipped += 1;
                }
            }
            return;
        }
        if reply.starts_with(b"+QUEUED") {
            // Queued in a transaction whose MULTI the planner never saw: not run (yet).
            return;
        }
        let Some(spec) = spec else { return };
        if name == "select" {
            if !refused && let Some(db) = argv.get(1).and_then(|a| codec::parse_int(a)) {
                state.db = db;
            }
            return;
        }
        if spec.is_blocking() && spec.may_write() {
            match nonblocking_form(name, argv, &reply) {
                Form::NotRun => {}
                Form::Command(command) => {
                    if !self.select(out, state.db, conn) {
                        out.skipped += 1;
                        return;
                    }
                    push(out, &command, Check::Write);
                    out.writes += 1;
                }
                Form::None => out.skipped += 1,
            }
            return;
        }
        if spec.may_write() || is_mirrored_admin(spec) {
            if refused && !spec.runs_writable_script() {
                return;
            }
            let command = match as_it_ran(name, argv, &reply) {
                AsItRan::Sent => frame,
                AsItRan::Instead(command) => command,
                AsItRan::Nothing => return,
            };
            if !self.select(out, state.db, conn) {
                out.skipped += 1;
                return;
            }
            push(out, &command, Check::Write);
            out.writes += 1;
            return;
        }
        if self.compare_below > 0
            && let Some(how) = comparable(spec)
        {
            self.reads_seen += 1;
            if (self.reads_seen * self.compare_below) % 10_000 >= self.compare_below {
                return;
            }
            let key = match commands::keys_into(argv, &mut self.keys) {
                Ok(_) => match self.keys.keys().first() {
                    Some(k) => Bytes::copy_from_slice(argv[k.index]),
                    None => return,
                },
                Err(_) => return,
            };
            if !self.select(out, state.db, conn) {
                return;
            }
            push(
                out,
                &frame,
                Check::Compare(Compared {
                    primary: reply,
                    how,
                    command: spec.name,
                    key,
                }),
            );
            out.reads += 1;
        }
    }

    /// A transaction's EXEC that the primary answered with `reply`: the queued writes, each
    /// as it ran (its element of EXEC's array), between MULTI and EXEC; nothing if it did not
    /// run.
    fn exec(
        &mut self,
        out: &mut Planned,
        state: &mut Client,
        conn: usize,
        queued: Queued,
        frame: &Bytes,
        reply: &Bytes,
    ) {
        if queued.overflowed || queued.writes.is_empty() || !ran(reply) {
            return;
        }
        let results = crate::protocol::reply::array_elements(reply).unwrap_or_default();
        let mut commands = Vec::with_capacity(queued.writes.len());
        for (at, command) in queued.writes {
            let result = results.get(at).cloned().unwrap_or_default();
            let Some(args) = codec::split_args_of(&command) else {
                continue;
            };
            let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let name = commands::lookup(argv[0], argv.get(1).copied()).map_or("", |s| s.name);
            match as_it_ran(name, &argv, &result) {
                AsItRan::Sent => commands.push(command),
                AsItRan::Instead(instead) => commands.push(instead),
                AsItRan::Nothing => {}
            }
        }
        if commands.is_empty() {
            return;
        }
        let db_before = state.db;
        let mut selects = false;
        for command in &commands {
            if let Some(db) = select_target(command) {
                state.db = db;
                selects = true;
            }
        }
        if (self.one_db && selects) || !self.select(out, db_before, conn) {
            out.skipped += commands.len() as u64;
            return;
        }
        push(out, &codec::encode(&[b"MULTI"]), Check::Ignore);
        out.writes += commands.len() as u64;
        for command in &commands {
            push(out, command, Check::Ignore);
        }
        push(out, frame, Check::Write);
    }

    /// Puts the mirror connection in database `db` before a command of a client there;
    /// `false` when it cannot (a mirror with one database and `db` not 0). A client in a
    /// database other than 0 always gets its `SELECT` (the connection may have reconnected
    /// to 0 since); one in 0 gets it when the connection may be elsewhere.
    fn select(&mut self, out: &mut Planned, db: i64, conn: usize) -> bool {
        if self.one_db {
            return db == 0;
        }
        if db == 0 && self.conn_db[conn] == 0 {
            return true;
        }
        let db_text = db.to_string();
        push(
            out,
            &codec::encode(&[b"SELECT", db_text.as_bytes()]),
            Check::Ignore,
        );
        self.conn_db[conn] = db;
        true
    }
}

/// Appends one command and what to do with its reply.
fn push(out: &mut Planned, command: &[u8], check: Check) {
    out.bytes.extend_from_slice(command);
    out.checks.push(check);
}

/// Whether an EXEC reply says the transaction ran (an array, not a nil or an error).
fn ran(reply: &[u8]) -> bool {
    reply.first() == Some(&b'*') && !reply.starts_with(b"*-1")
}

/// The database a queued `SELECT n` moves to, if `command` is one.
fn select_target(command: &Bytes) -> Option<i64> {
    let args = codec::split_args_of(command)?;
    match args.as_slice() {
        [name, db] if name.eq_ignore_ascii_case(b"select") => codec::parse_int(db),
        _ => None,
    }
}

/// Whether a command alone in a batch, outside a transaction, can matter to the planner:
/// a write, a command the mirror also runs, one that changes what the planner tracks of the
/// client (its database, a transaction), or a read that may be compared. What it returns
/// `false` for, `Planner::one` plans to nothing whatever the reply (tested over the whole
/// command table).
pub(super) fn concerns(spec: &CommandSpec, compare: bool) -> bool {
    spec.may_write()
        || is_mirrored_admin(spec)
        || matches!(spec.name, "multi" | "exec" | "discard" | "select")
        || (compare && comparable(spec).is_some())
}

/// Commands that change what the mirror must hold although Redis does not flag them as
/// writes: scripts loaded for a later EVALSHA.
fn is_mirrored_admin(spec: &CommandSpec) -> bool {
    matches!(spec.name, "script|load" | "script|flush")
}

/// A write whose effect the command alone does not fix, sent as the effect it had on the
/// primary (what Redis's own replication does): `XADD key *` with the id the primary gave
/// the entry, `SPOP` as an `SREM` of the members it popped.
enum AsItRan {
    /// The command as the client sent it does the same on the mirror.
    Sent,
    /// This command does what the primary did.
    Instead(Bytes),
    /// It changed nothing (SPOP of an empty set).
    Nothing,
}

/// How `name` with `argv`, answered `reply` by the primary, is sent to the mirror.
fn as_it_ran(name: &str, argv: &[&[u8]], reply: &[u8]) -> AsItRan {
    match name {
        "xadd" => match (xadd_id_position(argv), Value::from_resp(reply)) {
            (Some(at), Ok(Value::String(id))) if argv[at].ends_with(b"*") => {
                let mut args = argv.to_vec();
                args[at] = &id;
                AsItRan::Instead(codec::encode(&args))
            }
            _ => AsItRan::Sent,
        },
        "spop" => {
            let popped: Vec<Bytes> = match Value::from_resp(reply) {
                Ok(Value::String(member)) => vec![member],
                Ok(Value::Array(members)) => members
                    .into_iter()
                    .filter_map(|m| m.as_str().map(Bytes::copy_from_slice))
                    .collect(),
                _ => Vec::new(),
            };
            if popped.is_empty() {
                return AsItRan::Nothing;
            }
            let mut args: Vec<&[u8]> = vec![b"SREM", argv[1]];
            args.extend(popped.iter().map(|m| &m[..]));
            AsItRan::Instead(codec::encode(&args))
        }
        _ => AsItRan::Sent,
    }
}

/// Where XADD's id is: after the key and the options (`NOMKSTREAM`, `MAXLEN`/`MINID` with an
/// optional `=`/`~` and a threshold, `LIMIT` and a count), read as Redis reads them.
fn xadd_id_position(argv: &[&[u8]]) -> Option<usize> {
    use crate::commands::grammar::keyword;
    let mut i = 2;
    loop {
        let arg = argv.get(i)?;
        if keyword(arg, b"nomkstream") {
            i += 1;
        } else if keyword(arg, b"maxlen") || keyword(arg, b"minid") {
            i += 1;
            if argv.get(i).is_some_and(|a| *a == b"=" || *a == b"~") {
                i += 1;
            }
            i += 1;
        } else if keyword(arg, b"limit") {
            i += 2;
        } else {
            return Some(i);
        }
    }
}

/// A blocking pop's mirror form.
enum Form {
    /// It timed out (nil): nothing ran.
    NotRun,
    /// The non-blocking command that does what the primary did.
    Command(Bytes),
    /// The command has no non-blocking form the proxy builds.
    None,
}

/// The non-blocking form of a blocking write that the primary answered with `reply`.
fn nonblocking_form(name: &str, argv: &[&[u8]], reply: &[u8]) -> Form {
    if reply.starts_with(b"*-1") || reply.starts_with(b"$-1") || reply.starts_with(b"_") {
        return Form::NotRun;
    }
    if reply.first() == Some(&b'-') {
        return Form::NotRun;
    }
    // The key a pop of several keys popped from: the reply's first element.
    let popped_key = || -> Option<Bytes> {
        let value = Value::from_resp(reply).ok()?;
        match value.as_array()?.first()? {
            Value::String(key) => Some(key.clone()),
            _ => None,
        }
    };
    let command = match name {
        "blpop" | "brpop" | "bzpopmin" | "bzpopmax" => {
            let verb: &[u8] = match name {
                "blpop" => b"LPOP",
                "brpop" => b"RPOP",
                "bzpopmin" => b"ZPOPMIN",
                _ => b"ZPOPMAX",
            };
            popped_key().map(|key| codec::encode(&[verb, &key]))
        }
        // BLMOVE src dst wherefrom whereto timeout: LMOVE src dst wherefrom whereto.
        "blmove" if argv.len() == 6 => Some(codec::encode(&[
            b"LMOVE", argv[1], argv[2], argv[3], argv[4],
        ])),
        // BRPOPLPUSH src dst timeout: RPOPLPUSH src dst.
        "brpoplpush" if argv.len() == 4 => Some(codec::encode(&[b"RPOPLPUSH", argv[1], argv[2]])),
        _ => return Form::None,
    };
    command.map_or(Form::None, Form::Command)
}

/// How a read is compared, or `None` for reads not compared: replies that differ between
/// two servers holding the same data (encodings, idle times, cursors, random picks, the
/// server's own state) and keyless commands.
fn comparable(spec: &CommandSpec) -> Option<How> {
    if !spec.is_readonly() || spec.is_blocking() {
        return None;
    }
    // Redis tips the time a key has left as nondeterministic; it is compared within a margin.
    match spec.name {
        "ttl" | "expiretime" => return Some(How::Near(2)),
        "pttl" | "pexpiretime" => return Some(How::Near(2_000)),
        _ if spec.has_tip("nondeterministic_output") => return None,
        _ => {}
    }
    let container = spec.container_name();
    if matches!(container, "object" | "memory" | "xinfo" | "debug")
        || matches!(
            spec.name,
            "dump" | "xpending" | "scan" | "sscan" | "hscan" | "zscan" | "lcs"
        )
    {
        return None;
    }
    if !spec.may_have_keys() {
        return None;
    }
    Some(if spec.has_tip("nondeterministic_output_order") {
        How::Unordered
    } else {
        How::Exact
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> Bytes {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        codec::encode(&args)
    }

    fn batch(commands: &[&[&str]]) -> Bytes {
        commands
            .iter()
            .flat_map(|c| cmd(c).to_vec())
            .collect::<Vec<u8>>()
            .into()
    }

    fn sent(planned: &Planned) -> Vec<Vec<String>> {
        let bytes = planned.bytes.clone().freeze();
        codec::split_commands(&bytes, &CodecLimits::default())
            .iter()
            .map(|c| {
                codec::split_args_of(c)
                    .unwrap()
                    .iter()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect()
            })
            .collect()
    }

    /// What `concerns` says does not matter plans to nothing, whatever the primary answered:
    /// the session may leave such a lone command uncaptured.
    #[test]
    fn a_command_that_does_not_concern_the_mirror_plans_to_nothing() {
        let replies: [&[u8]; 5] = [
            b"+OK\r\n",
            b":1\r\n",
            b"$-1\r\n",
            b"*1\r\n$1\r\nx\r\n",
            b"-ERR no\r\n",
        ];
        let mut checked = 0;
        for spec in commands::all_commands() {
            for compare in [false, true] {
                if concerns(spec, compare) {
                    continue;
                }
                let mut argv: Vec<&str> = spec.name.split('|').collect();
                argv.extend(["k", "v", "1"]);
                for reply in replies {
                    let mut p = Planner::new(if compare { 10_000 } else { 0 });
                    let planned = p.plan(1, 2, &cmd(&argv), &Bytes::from_static(reply));
                    assert!(
                        planned.bytes.is_empty() && planned.writes + planned.reads == 0,
                        "{} (compare {compare}) planned {:?}",
                        spec.name,
                        sent(&planned)
                    );
                    // Nor does it change what the planner keeps of the client.
                    assert!(p.clients.is_empty(), "{}", spec.name);
                    checked += 1;
                }
            }
        }
        assert!(checked > 1_000, "{checked}");
    }

    /// A mirror with database 0 only (a cluster): a client's writes in another database are
    /// skipped, never sent after a SELECT the mirror would refuse; database 0's still go.
    #[test]
    fn one_database_skips_the_other_databases_writes() {
        let mut p = Planner::new(0).one_database();
        let commands = batch(&[
            &["SET", "a", "1"],
            &["SELECT", "2"],
            &["SET", "b", "1"],
            &["MULTI"],
            &["INCR", "c"],
            &["EXEC"],
            &["SELECT", "0"],
            &["MULTI"],
            &["SELECT", "3"],
            &["INCR", "d"],
            &["EXEC"],
            &["SET", "e", "1"],
        ]);
        let replies = Bytes::from_static(
            b"+OK\r\n+OK\r\n+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n:1\r\n+OK\r\n\
              +OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n:1\r\n+OK\r\n",
        );
        let planned = p.plan(1, 2, &commands, &replies);
        assert_eq!(
            sent(&planned),
            [vec!["SET", "a", "1"]],
            "nothing after the SELECT 3 inside the last transaction either"
        );
        // SET b, INCR c, the last transaction's two commands, SET e (in database 3).
        assert_eq!(planned.skipped, 5);
    }

    #[test]
    fn acknowledged_writes_are_mirrored_and_refused_ones_and_reads_are_not() {
        let mut p = Planner::new(0);
        let commands = batch(&[
            &["SET", "a", "1"],
            &["GET", "a"],
            &["INCR", "s"],
            &["EVAL", "return redis.call('set','b','2') and error", "0"],
        ]);
        let replies = Bytes::from_static(b"+OK\r\n$1\r\n1\r\n-WRONGTYPE x\r\n-ERR script\r\n");
        let planned = p.plan(1, 2, &commands, &replies);
        assert_eq!(
            sent(&planned),
            [
                vec!["SET", "a", "1"],
                vec!["EVAL", "return redis.call('set','b','2') and error", "0"]
            ]
        );
        assert_eq!(planned.writes, 2);
        assert_eq!(planned.checks, [Check::Write, Check::Write]);
    }

    #[test]
    fn writes_without_a_reply_are_unknown_and_not_mirrored() {
        let mut p = Planner::new(0);
        let commands = batch(&[&["SET", "a", "1"], &["SET", "b", "2"]]);
        let planned = p.plan(1, 2, &commands, &Bytes::from_static(b"+OK\r\n"));
        assert_eq!(sent(&planned), [vec!["SET", "a", "1"]]);
        assert_eq!(planned.unknown, 1);
    }

    #[test]
    fn a_transaction_is_mirrored_whole_at_exec_and_only_if_it_ran() {
        let mut p = Planner::new(0);
        let open = p.plan(7, 2, &batch(&[&["MULTI"]]), &Bytes::from_static(b"+OK\r\n"));
        assert!(open.checks.is_empty());
        let queued = p.plan(
            7,
            2,
            &batch(&[&["SET", "a", "1"], &["GET", "a"], &["INCR", "n"]]),
            &Bytes::from_static(b"+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n"),
        );
        assert!(queued.checks.is_empty(), "nothing before EXEC");
        let exec = p.plan(
            7,
            2,
            &batch(&[&["EXEC"]]),
            &Bytes::from_static(b"*3\r\n+OK\r\n$1\r\n1\r\n:1\r\n"),
        );
        assert_eq!(
            sent(&exec),
            [
                vec!["MULTI"],
                vec!["SET", "a", "1"],
                vec!["INCR", "n"],
                vec!["EXEC"]
            ]
        );
        assert_eq!(exec.writes, 2);
        // Aborted by WATCH: nothing.
        p.plan(7, 2, &batch(&[&["MULTI"]]), &Bytes::from_static(b"+OK\r\n"));
        p.plan(
            7,
            2,
            &batch(&[&["SET", "a", "2"]]),
            &Bytes::from_static(b"+QUEUED\r\n"),
        );
        let aborted = p.plan(7, 2, &batch(&[&["EXEC"]]), &Bytes::from_static(b"*-1\r\n"));
        assert!(aborted.checks.is_empty());
        // Discarded: nothing, and no state kept.
        p.plan(7, 2, &batch(&[&["MULTI"]]), &Bytes::from_static(b"+OK\r\n"));
        p.plan(
            7,
            2,
            &batch(&[&["DISCARD"]]),
            &Bytes::from_static(b"+OK\r\n"),
        );
        assert!(p.clients.is_empty());
    }

    #[test]
    fn a_client_in_another_database_writes_there_on_the_mirror() {
        let mut p = Planner::new(0);
        p.plan(
            3,
            2,
            &batch(&[&["SELECT", "5"]]),
            &Bytes::from_static(b"+OK\r\n"),
        );
        let write = p.plan(
            3,
            2,
            &batch(&[&["SET", "a", "1"]]),
            &Bytes::from_static(b"+OK\r\n"),
        );
        assert_eq!(sent(&write), [vec!["SELECT", "5"], vec!["SET", "a", "1"]]);
        // Another client, in database 0, after it: the connection is moved back.
        let other = p.plan(
            4,
            2,
            &batch(&[&["SET", "b", "1"]]),
            &Bytes::from_static(b"+OK\r\n"),
        );
        assert_eq!(sent(&other), [vec!["SELECT", "0"], vec!["SET", "b", "1"]]);
        let again = p.plan(
            4,
            2,
            &batch(&[&["SET", "c", "1"]]),
            &Bytes::from_static(b"+OK\r\n"),
        );
        assert_eq!(sent(&again), [vec!["SET", "c", "1"]]);
        // Client 3 still in 5, even on the RESP3 connection's first use.
        let resp3 = p.plan(
            3,
            3,
            &batch(&[&["DEL", "a"]]),
            &Bytes::from_static(b":1\r\n"),
        );
        assert_eq!(sent(&resp3), [vec!["SELECT", "5"], vec!["DEL", "a"]]);
        p.forget(3);
        assert!(p.clients.is_empty());
        // Lost track: the next client in 0 selects it again.
        p.lost_track(2);
        let after = p.plan(
            4,
            2,
            &batch(&[&["SET", "d", "1"]]),
            &Bytes::from_static(b"+OK\r\n"),
        );
        assert_eq!(sent(&after), [vec!["SELECT", "0"], vec!["SET", "d", "1"]]);
    }

    #[test]
    fn blocking_pops_are_mirrored_as_what_they_did() {
        let mut p = Planner::new(0);
        let popped = p.plan(
            1,
            2,
            &batch(&[&["BLPOP", "q1", "q2", "0"]]),
            &Bytes::from_static(b"*2\r\n$2\r\nq2\r\n$1\r\nx\r\n"),
        );
        assert_eq!(sent(&popped), [vec!["LPOP", "q2"]]);
        let timed_out = p.plan(
            1,
            2,
            &batch(&[&["BRPOP", "q1", "1"]]),
            &Bytes::from_static(b"*-1\r\n"),
        );
        assert!(timed_out.checks.is_empty() && timed_out.skipped == 0);
        let moved = p.plan(
            1,
            3,
            &batch(&[&["BLMOVE", "a", "b", "LEFT", "RIGHT", "0"]]),
            &Bytes::from_static(b"$1\r\nx\r\n"),
        );
        assert_eq!(sent(&moved), [vec!["LMOVE", "a", "b", "LEFT", "RIGHT"]]);
        let other = p.plan(
            1,
            2,
            &batch(&[&["BLMPOP", "0", "1", "q", "LEFT"]]),
            &Bytes::from_static(b"*2\r\n$1\r\nq\r\n*1\r\n$1\r\nx\r\n"),
        );
        assert!(other.checks.is_empty());
        assert_eq!(other.skipped, 1);
    }

    #[test]
    fn a_client_with_a_dropped_batch_is_not_mirrored_any_more() {
        let mut p = Planner::new(0);
        p.untrack(5);
        let after = p.plan(
            5,
            2,
            &batch(&[&["SET", "a", "1"]]),
            &Bytes::from_static(b"+OK\r\n"),
        );
        assert!(after.checks.is_empty() && after.bytes.is_empty());
        assert_eq!((after.writes, after.lost), (0, 1));
        // Commands queued in a transaction whose MULTI was dropped are never sent.
        let mut q = Planner::new(0);
        let queued = q.plan(
            6,
            2,
            &batch(&[&["SET", "a", "1"]]),
            &Bytes::from_static(b"+QUEUED\r\n"),
        );
        assert!(queued.checks.is_empty());
        p.forget(5);
        assert!(p.clients.is_empty());
    }

    #[test]
    fn writes_the_command_does_not_fix_are_sent_as_they_ran() {
        let mut p = Planner::new(0);
        let added = p.plan(
            1,
            2,
            &batch(&[&["XADD", "s", "MAXLEN\0", "~", "100", "*", "f", "v"]]),
            &Bytes::from_static(b"$15\r\n1700000000000-0\r\n"),
        );
        assert_eq!(
            sent(&added),
            [vec![
                "XADD",
                "s",
                "MAXLEN\0",
                "~",
                "100",
                "1700000000000-0",
                "f",
                "v"
            ]]
        );
        let explicit = p.plan(
            1,
            2,
            &batch(&[&["XADD", "s", "5-1", "f", "v"]]),
            &Bytes::from_static(b"$3\r\n5-1\r\n"),
        );
        assert_eq!(sent(&explicit), [vec!["XADD", "s", "5-1", "f", "v"]]);
        let popped = p.plan(
            1,
            2,
            &batch(&[&["SPOP", "set", "2"], &["SPOP", "empty"]]),
            &Bytes::from_static(b"*2\r\n$1\r\na\r\n$1\r\nc\r\n$-1\r\n"),
        );
        assert_eq!(sent(&popped), [vec!["SREM", "set", "a", "c"]]);
        // In a transaction, from EXEC's array.
        p.plan(2, 2, &batch(&[&["MULTI"]]), &Bytes::from_static(b"+OK\r\n"));
        p.plan(
            2,
            2,
            &batch(&[
                &["GET", "k"],
                &["XADD", "s", "*", "f", "v"],
                &["SPOP", "set"],
            ]),
            &Bytes::from_static(b"+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n"),
        );
        let exec = p.plan(
            2,
            2,
            &batch(&[&["EXEC"]]),
            &Bytes::from_static(b"*3\r\n$-1\r\n$3\r\n9-0\r\n$1\r\nb\r\n"),
        );
        assert_eq!(
            sent(&exec),
            [
                vec!["MULTI"],
                vec!["XADD", "s", "9-0", "f", "v"],
                vec!["SREM", "set", "b"],
                vec!["EXEC"]
            ]
        );
    }

    #[test]
    fn a_share_of_keyed_deterministic_reads_is_compared() {
        let mut p = Planner::new(5_000);
        let mut compared = 0;
        for _ in 0..10 {
            let planned = p.plan(
                1,
                2,
                &batch(&[&["GET", "user:1"], &["RANDOMKEY"], &["TIME"]]),
                &Bytes::from_static(b"$1\r\nx\r\n$1\r\nk\r\n*2\r\n$1\r\n1\r\n$1\r\n2\r\n"),
            );
            for check in &planned.checks {
                let Check::Compare(c) = check else {
                    panic!("only reads")
                };
                assert_eq!(
                    (c.command, &c.key[..], c.how),
                    ("get", &b"user:1"[..], How::Exact)
                );
                compared += 1;
            }
        }
        assert_eq!(compared, 5, "half of the GETs, never RANDOMKEY or TIME");
        let mut all = Planner::new(10_000);
        let planned = all.plan(
            1,
            2,
            &batch(&[
                &["SMEMBERS", "s"],
                &["PTTL", "k"],
                &["OBJECT", "ENCODING", "k"],
            ]),
            &Bytes::from_static(b"*0\r\n:100\r\n$3\r\nraw\r\n"),
        );
        let hows: Vec<How> = planned
            .checks
            .iter()
            .map(|c| match c {
                Check::Compare(c) => c.how,
                _ => panic!(),
            })
            .collect();
        assert_eq!(hows, [How::Unordered, How::Near(2_000)]);
    }
}
