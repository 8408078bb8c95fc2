//! What the upstream server says of its commands, merged with the built-in table.
//!
//! The built-in table is Redis 7.0.15's. Newer servers (Redis 7.2–8.x, Valkey 8–9) have
//! commands it does not know (HSETEX, WAITAOF, COMMANDLOG, CLIENT SETINFO…) and wider arities
//! for some it does (`ZRANK k m WITHSCORE`). At connect, [`crate::commands::server_facts`] reads the
//! server's `COMMAND` reply and [`learn`]s it:
//!
//! - a command, or a subcommand of a known container, the table lacks becomes a
//!   [`CommandSpec`] with the server's arity, flags, ACL categories, tips and key specs, so
//!   [`super::lookup`] finds it and every rule judges it by those facts (a write whose key
//!   specs may create a key gets the TTL, its non-key arguments count against the value cap,
//!   its categories meet `deny_newer_in`). Where its key specs cannot give its keys (unknown,
//!   incomplete, variable flags) the server has a procedure the proxy does not mirror
//!   ([`KeysProc::Unmirrored`]), and key extraction fails closed;
//! - a built-in command whose server arity accepts more argument counts gets that arity
//!   ([`wider_arity`], asked only when the built-in arity refuses a command line, so the hot
//!   path never looks here).
//!
//! Built-in facts always win otherwise: their key procedures and grammar are checked against
//! Redis's own, the server's are taken on trust.
//!
//! # Memory
//!
//! Specs are `&'static` everywhere (the policy indexes rules by spec address), so learned
//! ones are leaked. [`intern`] leaks each distinct spec once: a server reconnecting, failing
//! over or reporting the same table again costs nothing, and the total is bounded by the
//! distinct command definitions of the servers the proxy has met (a few hundred KiB).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use arc_swap::ArcSwap;

use super::builtin::{builtin_command, own_subcommand};
use super::{
    AclCategories, BeginSearch, CommandFlags, CommandSpec, FindKeys, KeySpec, KeySpecFlags,
    KeysProc,
};
use crate::protocol::resp_value::Value;

/// Commands learned from the servers met so far.
#[derive(Default)]
struct Learned {
    /// Top-level commands the built-in table lacks, by lower-case name.
    commands: HashMap<Box<[u8]>, &'static CommandSpec>,
    /// Subcommands the built-in containers lack, by lower-case `container|sub`.
    subcommands: HashMap<Box<[u8]>, &'static CommandSpec>,
    /// Built-in commands (by full lower-case name) whose server arity is wider.
    arity: HashMap<&'static str, i32>,
}

static LEARNED: LazyLock<ArcSwap<Learned>> =
    LazyLock::new(|| ArcSwap::from_pointee(Learned::default()));

/// Whether a server's command table has been read: until then a command the built-in table
/// does not know may be one the server has, and the policy cannot judge it.
static READ_A_SERVER: AtomicBool = AtomicBool::new(false);

/// Whether some server's command table has been learned (see [`READ_A_SERVER`]).
pub(crate) fn have_server_table() -> bool {
    READ_A_SERVER.load(Ordering::Acquire)
}

/// Every spec leaked so far, by its full description: one leak per distinct definition.
static INTERNED: LazyLock<Mutex<HashMap<String, &'static CommandSpec>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// A learned top-level command the built-in table lacks (ASCII case-insensitive).
pub(super) fn command(name: &[u8]) -> Option<&'static CommandSpec> {
    let learned = LEARNED.load();
    if learned.commands.is_empty() {
        return None;
    }
    learned.commands.get(&*name.to_ascii_lowercase()).copied()
}

/// A learned subcommand of the built-in container `container` (ASCII case-insensitive).
pub(super) fn subcommand(container: &str, sub: &[u8]) -> Option<&'static CommandSpec> {
    let learned = LEARNED.load();
    if learned.subcommands.is_empty() {
        return None;
    }
    let mut full = Vec::with_capacity(container.len() + 1 + sub.len());
    full.extend_from_slice(container.as_bytes());
    full.push(b'|');
    full.extend(sub.iter().map(u8::to_ascii_lowercase));
    learned.subcommands.get(&*full).copied()
}

/// The server's arity of the built-in command `name` where it accepts more argument counts
/// than the built-in one (`zrank`: 3 in 7.0, -3 from 7.2 for `WITHSCORE`).
pub(super) fn wider_arity(name: &str) -> Option<i32> {
    LEARNED.load().arity.get(name).copied()
}

/// What [`learn`] found in one server's table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Commands and subcommands the built-in table lacks, now known.
    pub(crate) added: usize,
    /// Built-in commands given the server's wider arity.
    pub(crate) widened: usize,
    /// Entries that could not be read (logged by the caller; the command stays unknown,
    /// so rules that need it refuse it).
    pub(crate) unreadable: Vec<String>,
}

/// Merges a server's `COMMAND` (or `COMMAND INFO`) reply into the learned table. Learning is
/// additive: what one server taught stays (with routes, several servers may be behind one
/// proxy; a command only one of them has is answered by the others' own errors).
pub(crate) fn learn(reply: &Value) -> Summary {
    let mut summary = Summary::default();
    let Some(entries) = reply.as_array() else {
        summary.unreadable.push("the reply is not an array".into());
        return summary;
    };
    let current = LEARNED.load_full();
    let mut next = Learned {
        commands: current.commands.clone(),
        subcommands: current.subcommands.clone(),
        arity: current.arity.clone(),
    };
    for entry in entries {
        let Some(parsed) = parse_entry(entry, "") else {
            summary.unreadable.push(entry_name(entry));
            continue;
        };
        match builtin_command(parsed.name.as_bytes()) {
            None => {
                let spec = intern(parsed);
                summary.added += 1 + spec.subcommands.len();
                next.commands.insert(spec.name.as_bytes().into(), spec);
            }
            Some(builtin) => {
                widen(builtin, &parsed, &mut next, &mut summary);
                for sub in parsed.subcommands {
                    let short = sub.name.split_once('|').map_or("", |(_, s)| s);
                    match own_subcommand(builtin, short.as_bytes()) {
                        Some(known) => widen(known, &sub, &mut next, &mut summary),
                        None => {
                            let spec = intern(sub);
                            summary.added += 1;
                            next.subcommands.insert(spec.name.as_bytes().into(), spec);
                        }
                    }
                }
            }
        }
    }
    LEARNED.store(Arc::new(next));
    READ_A_SERVER.store(true, Ordering::Release);
    summary
}

/// Records the server's arity of a built-in command where it accepts argument counts the
/// built-in one refuses.
fn widen(
    builtin: &'static CommandSpec,
    server: &Parsed,
    next: &mut Learned,
    summary: &mut Summary,
) {
    if wider(server.arity, builtin.arity) && next.arity.insert(builtin.name, server.arity).is_none()
    {
        summary.widened += 1;
    }
}

/// Whether arity `a` accepts an argument count that `b` refuses.
fn wider(a: i32, b: i32) -> bool {
    match (a >= 0, b >= 0) {
        (true, true) => a != b,
        (false, true) => true,
        (true, false) => a < -b,
        (false, false) => -a < -b,
    }
}

/// A command entry as read, before it is leaked.
#[derive(Debug)]
struct Parsed {
    name: String,
    arity: i32,
    flags: CommandFlags,
    acl_categories: AclCategories,
    tips: Vec<String>,
    key_specs: Vec<ParsedKeySpec>,
    subcommands: Vec<Parsed>,
}

#[derive(Debug)]
struct ParsedKeySpec {
    notes: String,
    flags: KeySpecFlags,
    begin_search: ParsedBegin,
    find_keys: FindKeys,
}

#[derive(Debug)]
enum ParsedBegin {
    Index(u32),
    Keyword { keyword: String, startfrom: i32 },
    Unknown,
}

/// The name of an entry that could not be read, for the log.
fn entry_name(entry: &Value) -> String {
    entry
        .as_array()
        .and_then(|a| a.first())
        .and_then(Value::as_str)
        .map_or_else(
            || "(no name)".into(),
            |n| String::from_utf8_lossy(n).into_owned(),
        )
}

/// One `COMMAND INFO` entry: `[name, arity, flags, first, last, step, categories, tips,
/// key specs, subcommands]` (Redis 7+; a 6.2 entry stops after the categories).
fn parse_entry(entry: &Value, container: &str) -> Option<Parsed> {
    let items = entry.as_array()?;
    let name = std::str::from_utf8(items.first()?.as_str()?)
        .ok()?
        .to_ascii_lowercase();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    if !container.is_empty() && !name.starts_with(&format!("{container}|")) {
        return None;
    }
    let arity = i32::try_from(items.get(1)?.as_int()?).ok()?;
    let mut flags = CommandFlags::EMPTY;
    for f in items.get(2)?.as_array()? {
        // A flag this proxy has no name for (Valkey 9's `skip_commandlog`) says nothing any
        // rule reads; it is left out rather than refusing the whole table.
        if let Some(flag) = f.as_str().and_then(CommandFlags::from_name) {
            flags |= flag;
        }
    }
    let mut acl_categories = AclCategories::EMPTY;
    for c in items.get(6).and_then(Value::as_array).unwrap_or(&[]) {
        if let Some(cat) = c.as_str().and_then(AclCategories::from_category) {
            acl_categories |= cat;
        }
    }
    let tips = items
        .get(7)
        .and_then(Value::as_array)
        .unwrap_or(&[])
        .iter()
        .filter_map(|t| t.as_str())
        .map(|t| String::from_utf8_lossy(t).to_ascii_lowercase())
        .collect();
    let key_specs = match items.get(8) {
        Some(specs) => specs
            .as_array()?
            .iter()
            .map(parse_key_spec)
            .collect::<Option<Vec<_>>>()?,
        // Redis 6.2: no key specs, only first/last/step.
        None => legacy_key_spec(items, flags)?,
    };
    let subcommands = match items.get(9) {
        Some(subs) => subs
            .as_array()
            .unwrap_or(&[])
            .iter()
            .map(|s| parse_entry(s, &name))
            .collect::<Option<Vec<_>>>()?,
        None => Vec::new(),
    };
    Some(Parsed {
        name,
        arity,
        flags,
        acl_categories,
        tips,
        key_specs,
        subcommands,
    })
}

/// A 6.2 entry's `first, last, step` as one key spec of unknown access (every access flag:
/// a rule reading it assumes the worst).
fn legacy_key_spec(items: &[Value], flags: CommandFlags) -> Option<Vec<ParsedKeySpec>> {
    let first = items.get(3)?.as_int()?;
    let last = items.get(4)?.as_int()?;
    let step = items.get(5)?.as_int()?;
    if first <= 0 {
        return Some(Vec::new());
    }
    let mut access = KeySpecFlags::RW
        .union(KeySpecFlags::ACCESS)
        .union(KeySpecFlags::UPDATE)
        .union(KeySpecFlags::INSERT);
    if flags.contains(CommandFlags::MOVABLE_KEYS) {
        access |= KeySpecFlags::INCOMPLETE;
    }
    Some(vec![ParsedKeySpec {
        notes: String::new(),
        flags: access,
        begin_search: ParsedBegin::Index(u32::try_from(first).ok()?),
        find_keys: FindKeys::Range {
            lastkey: i32::try_from(if last < 0 { last } else { last - first }).ok()?,
            keystep: u32::try_from(step.max(1)).ok()?,
            limit: 0,
        },
    }])
}

fn field<'a>(fields: &[(&[u8], &'a Value)], name: &str) -> Option<&'a Value> {
    fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, v)| *v)
}

fn int_field<T: TryFrom<i64>>(fields: &[(&[u8], &Value)], name: &str) -> Option<T> {
    T::try_from(field(fields, name)?.as_int()?).ok()
}

fn parse_key_spec(spec: &Value) -> Option<ParsedKeySpec> {
    let fields = spec.fields()?;
    let notes = field(&fields, "notes")
        .and_then(Value::as_str)
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .unwrap_or_default();
    let mut flags = KeySpecFlags::EMPTY;
    for f in field(&fields, "flags")?.as_array()? {
        match f.as_str().and_then(KeySpecFlags::from_name) {
            Some(flag) => flags |= flag,
            // An access flag this proxy cannot read: the spec's access is not known, so the
            // keys are the server's business (fail closed below).
            None => flags |= KeySpecFlags::VARIABLE_FLAGS,
        }
    }
    let begin = field(&fields, "begin_search")?.fields()?;
    let begin_spec = field(&begin, "spec")
        .and_then(Value::fields)
        .unwrap_or_default();
    let begin_search = match field(&begin, "type")?.as_str()? {
        b"index" => ParsedBegin::Index(int_field(&begin_spec, "index")?),
        b"keyword" => ParsedBegin::Keyword {
            keyword: String::from_utf8(field(&begin_spec, "keyword")?.as_str()?.to_vec()).ok()?,
            startfrom: int_field(&begin_spec, "startfrom")?,
        },
        _ => ParsedBegin::Unknown,
    };
    let find = field(&fields, "find_keys")?.fields()?;
    let find_spec = field(&find, "spec")
        .and_then(Value::fields)
        .unwrap_or_default();
    let find_keys = match field(&find, "type")?.as_str()? {
        b"range" => FindKeys::Range {
            lastkey: int_field(&find_spec, "lastkey")?,
            keystep: int_field(&find_spec, "keystep")?,
            limit: int_field(&find_spec, "limit")?,
        },
        b"keynum" => FindKeys::Keynum {
            keynumidx: int_field(&find_spec, "keynumidx")?,
            firstkey: int_field(&find_spec, "firstkey")?,
            keystep: int_field(&find_spec, "keystep")?,
        },
        _ => FindKeys::Unknown,
    };
    Some(ParsedKeySpec {
        notes,
        flags,
        begin_search,
        find_keys,
    })
}

/// Leaks `parsed` as a `&'static CommandSpec`, once per distinct definition.
fn intern(parsed: Parsed) -> &'static CommandSpec {
    let fingerprint = format!("{parsed:?}");
    let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(spec) = interned.get(&fingerprint) {
        return spec;
    }
    let spec: &'static CommandSpec = Box::leak(Box::new(to_spec(parsed)));
    interned.insert(fingerprint, spec);
    spec
}

fn leak_str(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Builds the spec. A command whose keys the specs cannot give (an unknown begin or find, an
/// incomplete spec, variable flags) gets [`KeysProc::Unmirrored`]: the server computes them
/// with a procedure of its own, which the proxy does not have.
fn to_spec(parsed: Parsed) -> CommandSpec {
    let unmirrored = parsed.key_specs.iter().any(|s| {
        matches!(s.begin_search, ParsedBegin::Unknown)
            || matches!(s.find_keys, FindKeys::Unknown)
            || s.flags
                .intersects(KeySpecFlags::INCOMPLETE.union(KeySpecFlags::VARIABLE_FLAGS))
    });
    let key_specs: Vec<KeySpec> = parsed
        .key_specs
        .into_iter()
        .map(|s| KeySpec {
            notes: leak_str(s.notes),
            flags: s.flags,
            begin_search: match s.begin_search {
                ParsedBegin::Index(i) => BeginSearch::Index(i),
                ParsedBegin::Keyword { keyword, startfrom } => BeginSearch::Keyword {
                    keyword: leak_str(keyword),
                    startfrom,
                },
                ParsedBegin::Unknown => BeginSearch::Unknown,
            },
            find_keys: s.find_keys,
        })
        .collect();
    let mut subcommands: Vec<CommandSpec> = parsed.subcommands.into_iter().map(to_spec).collect();
    subcommands.sort_by(|a, b| a.name.cmp(b.name));
    CommandSpec {
        name: leak_str(parsed.name),
        arity: parsed.arity,
        flags: parsed.flags,
        acl_categories: parsed.acl_categories,
        tips: Box::leak(
            parsed
                .tips
                .into_iter()
                .map(leak_str)
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        ),
        key_specs: Box::leak(key_specs.into_boxed_slice()),
        keys_proc: if unmirrored {
            KeysProc::Unmirrored
        } else {
            KeysProc::None
        },
        subcommands: Box::leak(subcommands.into_boxed_slice()),
    }
}
