//! Forced TTLs: every key a write creates gets an expiry, by key prefix; explicit TTLs above
//! the maximum are cut; PERSIST can be refused.
//!
//! Every form of Redis 7's command table that sets, keeps or removes a TTL is handled (see
//! also `policy/README.md`, which lists what is guaranteed):
//! - `SET` without `EX/PX/EXAT/PXAT/KEEPTTL`: `PX <ttl>` is appended to the command itself, so
//!   the write and its TTL are one atomic command, inside MULTI too. `SET k v NX PX 5000` (the
//!   lock pattern) keeps its own PX; EX/PX above the maximum are cut to it. `SET … KEEPTTL`
//!   keeps the TTL of an existing key and gets `PEXPIRE <key> <ttl> NX` after it, so a key it
//!   creates has one too.
//! - Relative expiries above the maximum (`SETEX`/`PSETEX`/`EXPIRE`/`PEXPIRE`/`GETEX EX|PX`,
//!   `SET EX|PX`): rewritten to the millisecond form with the maximum (same reply).
//! - Absolute expiries (`SET`/`GETEX` `EXAT|PXAT`, `EXPIREAT`, `PEXPIREAT`) further away than
//!   the maximum, by the proxy's wall clock: rewritten to the relative millisecond form with the
//!   maximum (`PX`, `PEXPIRE`; same reply).
//! - `RESTORE`/`RESTORE-ASKING` with TTL 0 (no expiry) get the key's TTL, with a TTL (relative
//!   or `ABSTTL`) above the maximum get the maximum: the TTL argument is rewritten, `ABSTTL`
//!   dropped.
//! - `PERSIST`, `GETEX … PERSIST`: refused when `deny_persist` is set.
//! - Every other write that may create a key (key spec flags insert, overwrite or update:
//!   HSET, SADD, ZADD, LPUSH, XADD, PFADD, INCR, SETNX, MSET, GETSET, COPY, RENAME's target,
//!   *STORE destinations…) and the declared keys of `EVAL`/`EVALSHA`/`FCALL` (their key specs
//!   say RW and UPDATE; the `_RO` forms cannot write): a `PEXPIRE <key> <ttl> NX` follows the
//!   command in the same batch and its reply is hidden. `NX` (Redis 7) only sets a TTL on a key
//!   that has none, so a TTL the application chose is never changed. Inside MULTI the PEXPIRE
//!   is queued in the same transaction and removed from EXEC's reply.
//! - `keys: created` (see [`TtlKeys`]): for writes that keep a key's TTL, [`MARK`] before and
//!   [`SETTLE`] after instead of `PEXPIRE NX`, so a key that existed without a TTL keeps none;
//!   SET and GETSET are sent with `KEEPTTL` between them.
//! - `COPY … DB n` copies into database `n`, which a PEXPIRE sent in the client's database
//!   cannot reach: a hidden script selects `n` for itself and gives the copy a TTL if it has
//!   none (`COPY_TTL`).
//! - Every option is read as Redis reads it (`commands::grammar`): `EX\0`, `PERSIST\0` and
//!   `ABSTTL\0` are the options they spell to Redis, and a repeated `EX` is cut in every
//!   occurrence, as Redis applies the last.

use std::borrow::Cow;

pub(crate) use super::config::TtlKeys;
use super::line::CommandLine;
use super::rewrite::{Appended, Rewrite};
use crate::commands::{self, CommandSpec, KeyPositions, KeySpecFlags, grammar};
use crate::protocol::codec::{encode, itoa_buf, parse_int};

thread_local! {
    /// The key positions `expire_written_keys` fills, one per thread: the rule is shared by
    /// every session, and collecting them afresh cost an allocation per write it checked
    /// (docs/performance.md, "Policy cost"). Dropped after a command with more than
    /// [`KEPT_KEY_POSITIONS`] keys, so one huge MSET does not pin its buffer for good.
    static WRITTEN_KEYS: std::cell::RefCell<KeyPositions> =
        std::cell::RefCell::new(KeyPositions::with_capacity(KEPT_KEY_POSITIONS));
}

/// How many key positions [`WRITTEN_KEYS`] keeps room for between commands.
const KEPT_KEY_POSITIONS: usize = 64;

/// A compiled `ttl:` rule.
pub(crate) struct Ttl {
    /// TTL for keys matching no prefix; `None` forces nothing.
    pub(crate) default_ms: Option<u64>,
    /// `(prefix, ttl)`, longest prefix first; a `None` TTL exempts the prefix (`lock:`).
    pub(crate) prefixes: Vec<(Vec<u8>, Option<u64>)>,
    /// Longest TTL a command may set.
    pub(crate) max_ms: Option<u64>,
    /// Refuse PERSIST and GETEX PERSIST.
    pub(crate) deny_persist: bool,
    /// Which keys get the TTL: created ones, or every key written without one.
    pub(crate) keys: TtlKeys,
    /// How forced TTLs are spread (`jitter`), so keys written together expire apart.
    pub(crate) jitter: Jitter,
    /// Unix time in milliseconds, read only for absolute expiries (EXAT, PXAT, EXPIREAT,
    /// RESTORE ABSTTL); a field so tests can fix it.
    pub(crate) clock: fn() -> u64,
}

/// `keys: created`, before a write that keeps a key's TTL: a key that exists without one is
/// marked with an expiry 2^60 ms (36 million years) away, which no application sets and the
/// write keeps. If the proxy dies before [`SETTLE`] runs, the key stays as good as persistent.
/// Expiries above this (2^59 ms) are [`MARK`]'s, left by a proxy that stopped between the two
/// scripts: `--survey` reports them.
pub(crate) const MARKED_ABOVE_MS: i64 = 576_460_752_303_423_488;

///
/// Writes only (`PEXPIRE … NX` sets an expiry only where there is none, and is a no-op on a
/// missing key): a read (`PTTL`) in the script would be tracked for the client under `CLIENT
/// TRACKING`, which would then get invalidations for keys it never read (state fuzzer).
const MARK: &[u8] = b"redis.call('pexpire', KEYS[1], '1152921504606846976', 'NX') return 0";

/// `keys: created`, after the write: a marked key (TTL above 2^59 ms) goes back to no TTL, a
/// key without one (the write created it) gets `ARGV[1]` ms, and a TTL the key had is kept.
/// Writes only, as [`MARK`]: `PEXPIRE … NX` gives a key without an expiry `ARGV[1]` ms; where
/// it had one, `PEXPIRE 2^59 LT` succeeds only over a mark (an expiry further than 2^59 ms),
/// which `PERSIST` then removes (a marked key thus gets one `expire` keyspace event more than
/// a read would have cost).
const SETTLE: &[u8] = b"if redis.call('pexpire', KEYS[1], ARGV[1], 'NX') == 0 and redis.call('pexpire', KEYS[1], '576460752303423488', 'LT') == 1 then redis.call('persist', KEYS[1]) end return 0";

/// After `COPY … DB n`: in database `ARGV[2]`, the copy gets `ARGV[1]` ms if it has no TTL.
/// Writes only, as [`MARK`].
const COPY_TTL: &[u8] =
    b"redis.call('select', ARGV[2]) redis.call('pexpire', KEYS[1], ARGV[1], 'NX') return 0";

/// The wall clock in Unix milliseconds, as Redis reads it for absolute expiries. The proxy and
/// Redis are assumed to agree within a few seconds (NTP); a skew only shifts where `max` cuts.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The spread of forced TTLs: a key's forced TTL is shortened by up to `fraction` of it, by
/// a hash of the key's name. A hash rather than a random draw: the same key in one command
/// gets one TTL (the hidden commands stay deduplicated), nothing is shared between threads,
/// and different keys, which is what is written together, spread evenly.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Jitter {
    /// Part of the TTL taken off at most, in millionths (0: no jitter).
    ppm: u64,
    /// Mixed into the hash, chosen at compile time, so clients cannot pick names that all
    /// land on the same TTL.
    seed: u64,
}

impl Jitter {
    /// `fraction` (validated: 0 to 0.9) with `seed`.
    pub(crate) fn new(fraction: f64, seed: u64) -> Jitter {
        Jitter {
            ppm: (fraction * 1_000_000.0).round() as u64,
            seed,
        }
    }

    /// `ms` as `key` gets it: in `(ms·(1 − fraction), ms]`, evenly spread over keys.
    pub(crate) fn apply(&self, key: &[u8], ms: u64) -> u64 {
        if self.ppm == 0 {
            return ms;
        }
        // FNV-1a, then splitmix64's finaliser: cheap, and even in every bit.
        let mut h = 0xcbf2_9ce4_8422_2325u64 ^ self.seed;
        for &b in key {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^= h >> 31;
        // A millionth of the spread, 0 to 999,999, scaled without overflow.
        let step = h % 1_000_000;
        let off = (u128::from(ms) * u128::from(self.ppm) * u128::from(step)) / 1_000_000_000_000;
        ms - off as u64
    }
}

/// What the rule does to one command.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TtlAction {
    /// Nothing to do.
    Keep,
    /// Refuse, with this reason.
    Refuse(String),
    /// Forward this instead.
    Rewrite(Rewrite),
}

/// Where an expiry argument is and how it is written.
#[derive(Clone)]
struct Expiry {
    /// Index of the number in the arguments.
    at: usize,
    /// Milliseconds per unit: 1000 for seconds, 1 for milliseconds.
    unit: u64,
    /// A Unix timestamp rather than a duration.
    absolute: bool,
    /// How the millisecond, relative form is written when the expiry is cut.
    form: Form,
}

/// How a cut expiry is written back.
#[derive(Clone)]
enum Form {
    /// The option before the number becomes `PX` (SET, GETEX).
    Option,
    /// The command is renamed (SETEX → PSETEX, EXPIREAT → PEXPIRE).
    Command(&'static str),
    /// The options before these numbers become `PX` (HSETEX, HGETEX: every occurrence).
    Options(Vec<usize>),
}

impl Ttl {
    /// The TTL a key gets when written without one.
    pub(crate) fn ttl_for(&self, key: &[u8]) -> Option<u64> {
        for (prefix, ttl) in &self.prefixes {
            if key.starts_with(prefix) {
                return *ttl;
            }
        }
        self.default_ms
    }

    /// The TTL the rule forces on `key` written without one: [`Ttl::ttl_for`], spread by
    /// the rule's `jitter`.
    pub(crate) fn forced_ms(&self, key: &[u8]) -> Option<u64> {
        self.ttl_for(key).map(|ms| self.jitter.apply(key, ms))
    }

    /// Where each key of a command gets its TTL from, for `--explain`:
    /// `` `session:1` 24h (prefix `session:`) ``, `` `user:1` 1h (default) ``, and with
    /// `jitter` the key's own value: `` `user:1` 1h (default), 3412345ms after jitter ``.
    pub(crate) fn sources<L: CommandLine + ?Sized>(&self, line: &L) -> String {
        let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
        let Ok(keys) = commands::keys(&args) else {
            return String::new();
        };
        let show = |ms: Option<u64>| ms.map_or("none".to_string(), super::config::format_duration);
        let mut parts = Vec::new();
        for index in keys.indices() {
            let key = args[index];
            let name = String::from_utf8_lossy(key);
            let part = match self.prefixes.iter().find(|(p, _)| key.starts_with(p)) {
                Some((p, ttl)) => format!(
                    "`{name}` {} (prefix `{}`)",
                    show(*ttl),
                    String::from_utf8_lossy(p)
                ),
                None => format!("`{name}` {} (default)", show(self.default_ms)),
            };
            let part = match self.forced_ms(key) {
                Some(ms) if self.jitter.ppm > 0 => format!("{part}, {ms}ms after jitter"),
                _ => part,
            };
            if !parts.contains(&part) {
                parts.push(part);
            }
        }
        parts.join(", ")
    }

    /// Applies the rule to one command. With [`Build::NoteOnly`] (an audited rule, `--explain`)
    /// a rewrite says what it would do and carries no commands: building the hidden commands
    /// of `keys: created` cost the default policy, whose TTL rule starts in audit, a fifth of
    /// the proxy's CPU per SET at `-P 16` for commands nobody sent (docs/performance.md).
    pub(crate) fn apply<L: CommandLine + ?Sized>(
        &self,
        spec: &CommandSpec,
        line: &L,
        build: Build,
    ) -> TtlAction {
        let mut stack: [&[u8]; 8] = [&[]; 8];
        let heap: Vec<&[u8]>;
        // Arguments as a slice without allocating for the usual short commands.
        let args: &[&[u8]] = if line.argc() <= stack.len() {
            for (i, slot) in stack.iter_mut().enumerate().take(line.argc()) {
                *slot = line.arg(i);
            }
            &stack[..line.argc()]
        } else {
            heap = (0..line.argc()).map(|i| line.arg(i)).collect();
            &heap
        };
        let relative = |at, unit, form| Expiry {
            at,
            unit,
            absolute: false,
            form,
        };
        let absolute = |at, unit| Expiry {
            at,
            unit,
            absolute: true,
            form: Form::Command("PEXPIRE"),
        };
        let absolute_hash = |at, unit| Expiry {
            at,
            unit,
            absolute: true,
            form: Form::Command("HPEXPIRE"),
        };
        match spec.name {
            "persist" if self.deny_persist => {
                TtlAction::Refuse("PERSIST would leave the key without a TTL".into())
            }
            "getex" => self.getex(args),
            "set" => self.set(args, build),
            "setex" => self.clamp(args, relative(2, 1000, Form::Command("PSETEX"))),
            "psetex" => self.clamp(args, relative(2, 1, Form::Command("PSETEX"))),
            "expire" => self.clamp(args, relative(2, 1000, Form::Command("PEXPIRE"))),
            "pexpire" => self.clamp(args, relative(2, 1, Form::Command("PEXPIRE"))),
            "expireat" => self.clamp(args, absolute(2, 1000)),
            "pexpireat" => self.clamp(args, absolute(2, 1)),
            "restore" | "restore-asking" => self.restore(args),
            // Hash field TTLs (Redis 7.4+/8, Valkey 9) stay under the maximum too.
            "hexpire" => self.clamp(args, relative(2, 1000, Form::Command("HPEXPIRE"))),
            "hpexpire" => self.clamp(args, relative(2, 1, Form::Command("HPEXPIRE"))),
            "hexpireat" => self.clamp(args, absolute_hash(2, 1000)),
            "hpexpireat" => self.clamp(args, absolute_hash(2, 1)),
            "hsetex" | "hgetex" | "msetex" => self.expiry_options(spec, args, build),
            "persist" => TtlAction::Keep,
            "copy" => match grammar::copy_db(args) {
                None => unreadable("COPY"),
                Some(Some(db)) => self.copy_to_db(args, db, build),
                Some(None) => self.expire_written_keys(spec, args, build),
            },
            // GETSET drops the key's TTL, so under `keys: created` it is sent as the SET that
            // keeps it (same reply), and a key that existed without one keeps none.
            "getset" if self.keys == TtlKeys::Created && args.len() == 3 => {
                self.set_keeping_ttl(args, &[b"KEEPTTL", b"GET"], build)
            }
            // Writes, and scripts and functions that may write: their declared keys, flagged RW
            // and UPDATE by Redis's key specs because a script may do anything with them.
            _ if spec.may_write() => self.expire_written_keys(spec, args, build),
            _ => TtlAction::Keep,
        }
    }

    fn set(&self, args: &[&[u8]], build: Build) -> TtlAction {
        if args.len() < 3 {
            return TtlAction::Keep;
        }
        // Options as Redis reads them: `EX\0` is EX, a repeated EX applies its last value.
        let Some(opts) = grammar::string_options(args, false) else {
            return unreadable("SET");
        };
        if opts.keepttl {
            // The TTL an existing key has is kept; a key the SET creates gets one.
            return self.expire_keys(args, [(1, false)], build);
        }
        if let Some(expiry) = opts.expiry {
            return self.clamp(args, expiry_of(expiry));
        }
        if self.keys == TtlKeys::Created {
            // A SET drops the TTL of the key it replaces: sent with KEEPTTL, a key that existed
            // without a TTL keeps none, one with a TTL keeps it, a new key gets the rule's.
            return self.set_keeping_ttl(args, &[b"KEEPTTL"], build);
        }
        match self.forced_ms(args[1]) {
            Some(ms) => TtlAction::Rewrite(Rewrite {
                command: None,
                append: Some(Appended {
                    option: "PX",
                    value: ms,
                }),
                before: None,
                after: Vec::new(),
                note: Cow::Borrowed("SET without a TTL gets PX <ttl of its key prefix>"),
                strip: None,
            }),
            None => TtlAction::Keep,
        }
    }

    /// HSETEX, HGETEX (field TTLs) and MSETEX (key TTLs): an expiry above the maximum is cut
    /// to it (every occurrence becomes `PX max`). Without one, HSETEX and MSETEX are writes
    /// like any other: the keys they create get their TTL (MSETEX … KEEPTTL too).
    fn expiry_options(&self, spec: &CommandSpec, args: &[&[u8]], build: Build) -> TtlAction {
        let (opts, name) = match spec.name {
            "msetex" => (grammar::msetex_options(args), "MSETEX"),
            "hsetex" => (grammar::hash_expiry(args), "HSETEX"),
            _ => (grammar::hash_expiry(args), "HGETEX"),
        };
        let Some(opts) = opts else {
            return unreadable(name);
        };
        let clamped = match opts.expiry {
            Some(e) => self.clamp(
                args,
                Expiry {
                    at: e.at,
                    unit: e.unit_ms,
                    absolute: e.absolute,
                    form: Form::Options(opts.values),
                },
            ),
            None => TtlAction::Keep,
        };
        // MSETEX's expiry is its keys' own TTL; HSETEX's is its fields', and the hash it
        // creates still gets the key TTL (fields expiring one by one leave it behind until
        // the last one goes).
        let keyed = match spec.name {
            "hsetex" => self.expire_written_keys(spec, args, build),
            "msetex" if opts.expiry.is_none() => self.expire_written_keys(spec, args, build),
            _ => TtlAction::Keep,
        };
        both(clamped, keyed)
    }

    fn getex(&self, args: &[&[u8]]) -> TtlAction {
        let Some(opts) = grammar::string_options(args, true) else {
            return unreadable("GETEX");
        };
        if opts.persist && self.deny_persist {
            return TtlAction::Refuse("GETEX PERSIST would leave the key without a TTL".into());
        }
        match opts.expiry {
            Some(expiry) => self.clamp(args, expiry_of(expiry)),
            None => TtlAction::Keep,
        }
    }

    /// Cuts the expiry at `args[e.at]` to the maximum: the command is then sent in its relative
    /// millisecond form with the maximum, which Redis answers exactly as the original.
    fn clamp(&self, args: &[&[u8]], e: Expiry) -> TtlAction {
        let (Some(max), Some(v)) = (self.max_ms, args.get(e.at).and_then(|a| parse_int(a))) else {
            return TtlAction::Keep;
        };
        if v <= 0 {
            return TtlAction::Keep;
        }
        let ms = (v as u64).saturating_mul(e.unit);
        let ttl = if e.absolute {
            ms.saturating_sub((self.clock)())
        } else {
            ms
        };
        if ttl <= max {
            return TtlAction::Keep;
        }
        let max_text = max.to_string();
        let mut new: Vec<&[u8]> = args.to_vec();
        match e.form {
            // Every occurrence of the option (Redis applies the last; a repeated one is
            // allowed only when it is the same option, so all become `PX max`).
            Form::Option => {
                let getex = args[0].eq_ignore_ascii_case(b"GETEX");
                for at in grammar::expiry_values(args, getex) {
                    new[at - 1] = b"PX";
                    new[at] = max_text.as_bytes();
                }
            }
            Form::Command(name) => new[0] = name.as_bytes(),
            Form::Options(values) => {
                for at in values {
                    new[at - 1] = b"PX";
                    new[at] = max_text.as_bytes();
                }
            }
        }
        new[e.at] = max_text.as_bytes();
        let what = if e.absolute {
            "an expiry time"
        } else {
            "a TTL"
        };
        TtlAction::Rewrite(Rewrite {
            command: Some(encode(&new)),
            note: format!(
                "{what} {} s away cut to the max {}",
                ttl / 1000,
                super::config::format_duration(max)
            )
            .into(),
            ..Rewrite::default()
        })
    }

    /// `RESTORE key ttl payload [REPLACE] [ABSTTL] …`: TTL 0 restores a key without expiry, so
    /// it gets the key's TTL; a TTL (relative or ABSTTL) above the maximum gets the maximum.
    /// Either way the TTL argument becomes relative milliseconds and ABSTTL is dropped.
    fn restore(&self, args: &[&[u8]]) -> TtlAction {
        let Some(v) = args.get(2).and_then(|a| parse_int(a)).filter(|&v| v >= 0) else {
            return TtlAction::Keep; // Redis refuses a negative or malformed TTL itself.
        };
        let Some(abs) = grammar::restore_absttl(args) else {
            return unreadable("RESTORE");
        };
        let ttl = match (v, abs) {
            (0, _) => None,
            (v, Some(_)) => Some((v as u64).saturating_sub((self.clock)())),
            (v, None) => Some(v as u64),
        };
        let new_ttl = match (ttl, self.max_ms) {
            (None, _) => match self.forced_ms(args[1]) {
                Some(ms) => ms,
                None => return TtlAction::Keep,
            },
            (Some(t), Some(max)) if t > max => max,
            _ => return TtlAction::Keep,
        };
        let text = new_ttl.to_string();
        let mut new: Vec<&[u8]> = args.to_vec();
        new[2] = text.as_bytes();
        if let Some(i) = abs {
            new.remove(i);
        }
        let note = match ttl {
            None => "RESTORE without a TTL gets <ttl of its key prefix>",
            Some(_) => "RESTORE TTL above `max` cut to `max`",
        };
        TtlAction::Rewrite(Rewrite {
            command: Some(encode(&new)),
            note: note.into(),
            ..Rewrite::default()
        })
    }

    /// A hidden `PEXPIRE <key> <ttl> NX` for every key the command may create (its key specs
    /// say insert, overwrite or update).
    fn expire_written_keys(&self, spec: &CommandSpec, args: &[&[u8]], build: Build) -> TtlAction {
        WRITTEN_KEYS.with_borrow_mut(|keys| {
            match spec.keys_into(args, keys) {
                Ok(()) => {}
                // A write learned from the server whose keys only the server can find: which
                // keys it creates is unknown, so it cannot be given its TTL (fail closed).
                Err(commands::KeyError::Unmirrored) => {
                    return TtlAction::Refuse(format!(
                        "{} finds its keys in a way the proxy cannot follow, so the keys it \
                         writes cannot be given their TTL",
                        spec.name.to_ascii_uppercase()
                    ));
                }
                // Redis refuses the command itself (arity, no keys).
                Err(_) => return TtlAction::Keep,
            }
            let creates = KeySpecFlags::INSERT
                .union(KeySpecFlags::OW)
                .union(KeySpecFlags::UPDATE);
            let written = keys
                .keys()
                .iter()
                .filter(|k| k.flags.intersects(creates))
                .map(|k| (k.index, k.flags.contains(KeySpecFlags::OW)));
            let action = self.expire_keys(args, written, build);
            if keys.keys().len() > KEPT_KEY_POSITIONS {
                *keys = KeyPositions::default();
            }
            action
        })
    }

    /// Hidden commands giving each of the keys at `(index, replaced)` whose prefix has a TTL
    /// one: `PEXPIRE <key> <ttl> NX` after the write (`keys: written`, and keys the write
    /// replaces, which drops their TTL anyway), or [`MARK`] before and [`SETTLE`] after it
    /// (`keys: created`, for writes that keep a key's TTL).
    fn expire_keys(
        &self,
        args: &[&[u8]],
        keys: impl IntoIterator<Item = (usize, bool)>,
        build: Build,
    ) -> TtlAction {
        let mut before = Vec::new();
        let mut after = Vec::new();
        // Build::NoteOnly: whether any key gets a TTL, and whether one is marked first.
        let (mut found, mut marks) = (false, false);
        for (index, replaced) in keys {
            let name = args[index];
            let Some(ms) = self.forced_ms(name) else {
                continue;
            };
            if build == Build::NoteOnly {
                found = true;
                marks |= self.keys == TtlKeys::Created && !replaced;
                continue;
            }
            let ms = itoa_buf(ms);
            let ms = ms.as_bytes();
            let (pre, post) = if self.keys == TtlKeys::Written || replaced {
                (None, encode(&[b"PEXPIRE", name, ms, b"NX"]))
            } else {
                (
                    Some(encode(&[b"EVAL", MARK, b"1", name])),
                    encode(&[b"EVAL", SETTLE, b"1", name, ms]),
                )
            };
            if !after.contains(&post) {
                after.push(post);
                before.extend(pre);
            }
        }
        if found {
            return TtlAction::Rewrite(Rewrite {
                note: Cow::Borrowed(note_for(marks)),
                ..Rewrite::default()
            });
        }
        if after.is_empty() {
            return TtlAction::Keep;
        }
        let note = Cow::Borrowed(note_for(!before.is_empty()));
        let mut rw = Rewrite {
            after,
            note,
            ..Rewrite::default()
        };
        rw.add_before(before);
        TtlAction::Rewrite(rw)
    }

    /// `COPY src dst DB n`: the copy lands in database `n` (which may be the client's own:
    /// the proxy does not know which database a client selected), where a `PEXPIRE` sent in
    /// the client's database cannot reach. A hidden script selects `n` for itself (a script's
    /// SELECT does not change its caller's database) and gives the copy a TTL if it has none:
    /// COPY replaces the destination whole, so it is a key the write made.
    fn copy_to_db(&self, args: &[&[u8]], db: usize, build: Build) -> TtlAction {
        let Some(ms) = self.forced_ms(args[2]) else {
            return TtlAction::Keep;
        };
        let note = Cow::Borrowed("the copy in database <n> gets <ttl> if it has none");
        if build == Build::NoteOnly {
            return TtlAction::Rewrite(Rewrite {
                note,
                ..Rewrite::default()
            });
        }
        let ms = itoa_buf(ms);
        TtlAction::Rewrite(Rewrite {
            after: vec![encode(&[
                b"EVAL",
                COPY_TTL,
                b"1",
                args[2],
                ms.as_bytes(),
                args[db],
            ])],
            note,
            ..Rewrite::default()
        })
    }

    /// `keys: created`: the SET (or GETSET) sent with `extra` options that keep the key's
    /// TTL, between [`MARK`] and [`SETTLE`].
    fn set_keeping_ttl(&self, args: &[&[u8]], extra: &[&[u8]], build: Build) -> TtlAction {
        let TtlAction::Rewrite(mut rw) = self.expire_keys(args, [(1, false)], build) else {
            return TtlAction::Keep;
        };
        rw.note = Cow::Borrowed(SET_KEEPING_TTL);
        if build == Build::NoteOnly {
            return TtlAction::Rewrite(rw);
        }
        let mut set: Vec<&[u8]> = Vec::with_capacity(args.len() + extra.len());
        set.push(b"SET");
        set.extend_from_slice(&args[1..]);
        set.extend_from_slice(extra);
        rw.command = Some(encode(&set));
        TtlAction::Rewrite(rw)
    }
}

/// Two actions on one command: a refusal wins; two rewrites become one (the first's command,
/// both's hidden commands).
fn both(first: TtlAction, second: TtlAction) -> TtlAction {
    match (first, second) {
        (TtlAction::Refuse(r), _) | (_, TtlAction::Refuse(r)) => TtlAction::Refuse(r),
        (TtlAction::Keep, other) | (other, TtlAction::Keep) => other,
        (TtlAction::Rewrite(mut a), TtlAction::Rewrite(b)) => {
            a.after.extend(b.after);
            if let Some(before) = b.before {
                a.add_before(*before);
            }
            a.note = format!("{}; {}", a.note, b.note).into();
            TtlAction::Rewrite(a)
        }
    }
}

/// Fail closed: options the proxy cannot read as the server reads them (the grammar knows
/// Redis 7.0's, and the newer servers' IFEQ/IFNE/IFDEQ/IFDNE, HSETEX/HGETEX and MSETEX
/// options). The server may accept a word the proxy does not know (before the grammar knew
/// IFEQ, Valkey's `SET k v IFEQ EX` compared with "EX" and dropped the key's TTL), and a TTL
/// rule that let it through would not know what it allowed.
fn unreadable(command: &str) -> TtlAction {
    TtlAction::Refuse(format!(
        "syntax error: {command} with options the TTL rule cannot read"
    ))
}

/// Whether a rewrite is built to be sent, or only to say what it would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Build {
    /// The commands that carry it out (an enforced rule).
    Commands,
    /// Its note only (an audited rule, `--explain`): nothing will be sent.
    NoteOnly,
}

/// `expire_keys`'s note: with `marks`, some key is marked before the write (`keys: created`).
fn note_for(marks: bool) -> &'static str {
    if marks {
        "each key it may create gets <ttl>; a key that existed without a TTL keeps none"
    } else {
        "each key it may create gets PEXPIRE <ttl> NX"
    }
}

/// `set_keeping_ttl`'s note.
const SET_KEEPING_TTL: &str =
    "SET sent with KEEPTTL; a new key gets <ttl>, one that existed without a TTL keeps none";

/// The clamp's view of an expiry option of SET or GETEX.
fn expiry_of(e: grammar::Expiry) -> Expiry {
    Expiry {
        at: e.at,
        unit: e.unit_ms,
        absolute: e.absolute,
        form: Form::Option,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn rule() -> Ttl {
        Ttl {
            default_ms: Some(3_600_000),
            prefixes: vec![
                (b"session:".to_vec(), Some(86_400_000)),
                (b"lock:".to_vec(), None),
            ],
            max_ms: Some(604_800_000),
            deny_persist: true,
            keys: TtlKeys::Written,
            jitter: Jitter::default(),
            clock: || NOW_MS,
        }
    }

    /// The fixed "now" of these tests: 2023-11-14T22:13:20Z.
    const NOW_MS: u64 = 1_700_000_000_000;

    fn run(line: &str) -> TtlAction {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let spec = commands::lookup_args(&args).unwrap();
        rule().apply(spec, &args[..], Build::Commands)
    }

    #[test]
    fn a_huge_write_gets_every_ttl_and_does_not_keep_its_key_buffer() {
        let keys: Vec<String> = (0..300).map(|i| format!("k{i} v")).collect();
        let (command, after) = rewritten(&format!("MSET {}", keys.join(" ")));
        assert_eq!(command, None);
        assert_eq!(after.len(), 300, "a PEXPIRE NX per key");
        assert!(after[299].contains("k299"), "{}", after[299]);
        let kept = WRITTEN_KEYS.with_borrow(|k| k.keys().len());
        assert_eq!(kept, 0, "the 300-key buffer was dropped");
        // The next write on this thread fills a buffer again.
        assert_eq!(rewritten("HSET h f v").1.len(), 1);
    }

    fn rewritten(line: &str) -> (Option<String>, Vec<String>) {
        match run(line) {
            TtlAction::Rewrite(r) => {
                let r = r.materialize(&line.split(' ').collect::<Vec<_>>()[..]);
                (
                    r.command.map(|c| String::from_utf8(c.to_vec()).unwrap()),
                    r.after
                        .iter()
                        .map(|c| String::from_utf8(c.to_vec()).unwrap())
                        .collect(),
                )
            }
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn set_gets_px_by_prefix_and_locks_keep_theirs() {
        assert_eq!(
            rewritten("SET user:1 v").0.unwrap(),
            "*5\r\n$3\r\nSET\r\n$6\r\nuser:1\r\n$1\r\nv\r\n$2\r\nPX\r\n$7\r\n3600000\r\n"
        );
        assert!(
            rewritten("SET session:9 v")
                .0
                .unwrap()
                .ends_with("$8\r\n86400000\r\n")
        );
        assert_eq!(run("SET lock:x v NX PX 5000"), TtlAction::Keep);
        assert_eq!(run("SET lock:x v NX"), TtlAction::Keep);
        assert_eq!(run("SET k v EX 60"), TtlAction::Keep);
        assert_eq!(run("SET lock:x v KEEPTTL"), TtlAction::Keep);
    }

    #[test]
    fn keepttl_keeps_an_existing_ttl_and_gives_a_created_key_one() {
        let (cmd, after) = rewritten("SET k v KEEPTTL");
        assert_eq!(cmd, None);
        assert_eq!(
            after,
            ["*4\r\n$7\r\nPEXPIRE\r\n$1\r\nk\r\n$7\r\n3600000\r\n$2\r\nNX\r\n"]
        );
    }

    #[test]
    fn absolute_expiries_beyond_the_maximum_become_the_maximum() {
        let week = 604_800_000;
        let far_s = (NOW_MS + 30 * 86_400_000) / 1000;
        let far_ms = NOW_MS + 30 * 86_400_000;
        let near_s = (NOW_MS + 60_000) / 1000;
        let px_week = "$2\r\nPX\r\n$9\r\n604800000\r\n";
        let set = rewritten(&format!("SET k v EXAT {far_s}")).0.unwrap();
        assert!(set.contains(px_week), "{set}");
        let set = rewritten(&format!("SET k v NX PXAT {far_ms} GET"))
            .0
            .unwrap();
        assert!(
            set.contains(px_week) && set.ends_with("$3\r\nGET\r\n"),
            "{set}"
        );
        assert_eq!(run(&format!("SET k v EXAT {near_s}")), TtlAction::Keep);
        let getex = rewritten(&format!("GETEX k PXAT {far_ms}")).0.unwrap();
        assert_eq!(
            getex,
            "*4\r\n$5\r\nGETEX\r\n$1\r\nk\r\n$2\r\nPX\r\n$9\r\n604800000\r\n"
        );
        let at = rewritten(&format!("EXPIREAT k {far_s} GT")).0.unwrap();
        assert_eq!(
            at,
            format!("*4\r\n$7\r\nPEXPIRE\r\n$1\r\nk\r\n$9\r\n{week}\r\n$2\r\nGT\r\n")
        );
        assert!(
            rewritten(&format!("PEXPIREAT k {far_ms}"))
                .0
                .unwrap()
                .starts_with("*3\r\n$7\r\nPEXPIRE\r\n")
        );
        assert_eq!(run(&format!("EXPIREAT k {near_s}")), TtlAction::Keep);
        // In the past: Redis deletes the key, nothing to cut.
        assert_eq!(run("PEXPIREAT k 1000"), TtlAction::Keep);
    }

    #[test]
    fn restore_gets_a_ttl_and_its_maximum() {
        // TTL 0 is "no expiry": the key's TTL goes in its place.
        let cmd = rewritten("RESTORE session:1 0 payload REPLACE").0.unwrap();
        assert_eq!(
            cmd,
            "*5\r\n$7\r\nRESTORE\r\n$9\r\nsession:1\r\n$8\r\n86400000\r\n$7\r\npayload\r\n$7\r\nREPLACE\r\n"
        );
        let cmd = rewritten("RESTORE k 0 payload ABSTTL").0.unwrap();
        assert!(!cmd.contains("ABSTTL") && cmd.contains("3600000"), "{cmd}");
        let cmd = rewritten("RESTORE k 999999999999 payload").0.unwrap();
        assert!(cmd.contains("604800000"), "{cmd}");
        let far = NOW_MS + 30 * 86_400_000;
        let cmd = rewritten(&format!("RESTORE-ASKING k {far} payload ABSTTL IDLETIME 5"))
            .0
            .unwrap();
        assert!(
            cmd.contains("604800000") && !cmd.contains("ABSTTL"),
            "{cmd}"
        );
        assert!(cmd.ends_with("$8\r\nIDLETIME\r\n$1\r\n5\r\n"), "{cmd}");
        assert_eq!(run("RESTORE k 60000 payload"), TtlAction::Keep);
        assert_eq!(run("RESTORE lock:k 0 payload"), TtlAction::Keep);
    }

    #[test]
    fn scripts_declared_keys_get_a_ttl_and_read_only_scripts_nothing() {
        let (_, after) = rewritten("EVAL body 2 a lock:b x");
        assert_eq!(
            after,
            ["*4\r\n$7\r\nPEXPIRE\r\n$1\r\na\r\n$7\r\n3600000\r\n$2\r\nNX\r\n"]
        );
        assert_eq!(rewritten("EVALSHA 0123 1 session:x").1.len(), 1);
        assert_eq!(rewritten("FCALL f 1 k arg").1.len(), 1);
        assert_eq!(run("EVAL body 0"), TtlAction::Keep);
        assert_eq!(run("EVAL_RO body 1 k"), TtlAction::Keep);
        assert_eq!(run("EVALSHA_RO 0123 1 k"), TtlAction::Keep);
        assert_eq!(run("FCALL_RO f 1 k"), TtlAction::Keep);
    }

    #[test]
    fn created_mode_marks_existing_persistent_keys_around_writes_that_keep_ttls() {
        let created = Ttl {
            keys: TtlKeys::Created,
            ..rule()
        };
        let run = |line: &str| {
            let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            let spec = commands::lookup_args(&args).unwrap();
            match created.apply(spec, &args[..], Build::Commands) {
                TtlAction::Rewrite(rw) => rw,
                other => panic!("{line}: {other:?}"),
            }
        };
        let eval = |script: &[u8], args: &[&[u8]]| {
            let mut all: Vec<&[u8]> = vec![b"EVAL", script, b"1"];
            all.extend_from_slice(args);
            encode(&all)
        };
        let hset = run("HSET config:x f v");
        assert_eq!(hset.command, None);
        assert_eq!(hset.before(), [eval(MARK, &[b"config:x"])]);
        assert_eq!(hset.after, [eval(SETTLE, &[b"config:x", b"3600000"])]);
        // SET and GETSET keep the key's TTL (none, for a key that had none).
        let set = run("SET k v NX");
        assert_eq!(
            set.command.clone().unwrap(),
            encode(&[b"SET", b"k", b"v", b"NX", b"KEEPTTL"])
        );
        assert_eq!(set.before().len(), 1);
        let getset = run("GETSET k v");
        assert_eq!(
            getset.command.unwrap(),
            encode(&[b"SET", b"k", b"v", b"KEEPTTL", b"GET"])
        );
        // A write that replaces its key (and drops its TTL) gets PEXPIRE NX as before.
        let mset = run("MSET a 1 b 2");
        assert!(mset.before().is_empty());
        assert_eq!(mset.after.len(), 2);
        // Lock keys are exempt, and an explicit TTL is as in `written`.
        let args: Vec<&[u8]> = vec![b"SET", b"lock:a", b"v"];
        assert_eq!(
            created.apply(
                commands::lookup_args(&args).unwrap(),
                &args[..],
                Build::Commands
            ),
            TtlAction::Keep
        );
    }

    #[test]
    fn copy_into_a_database_gets_its_ttl_there() {
        assert_eq!(rewritten("COPY a b").1.len(), 1);
        for line in [
            "COPY a b DB 1",
            "COPY a b db\0 0",
            "COPY a b DB 2 REPLACE DB 1",
        ] {
            let (command, after) = rewritten(line);
            assert_eq!(command, None);
            assert_eq!(after.len(), 1, "{line}");
            assert!(after[0].contains("select"), "{line}: {}", after[0]);
            assert!(
                after[0].ends_with("$1\r\n1\r\n") || after[0].ends_with("$1\r\n0\r\n"),
                "{}",
                after[0]
            );
        }
        assert!(matches!(run("COPY a b DB"), TtlAction::Refuse(_)));
    }

    #[test]
    fn options_are_read_as_redis_reads_them() {
        assert_eq!(
            run("GETEX k PERSIST\0"),
            TtlAction::Refuse("GETEX PERSIST would leave the key without a TTL".into())
        );
        for line in [
            "GETEX k EX\0 99999999999",
            "GETEX k ex\0junk 99999999999",
            "SET k v EX 10 EX 99999999999",
            "SET k v PXAT\0 99999999999999",
        ] {
            let (command, _) = rewritten(line);
            let command = command.unwrap_or_else(|| panic!("{line} was not cut"));
            assert!(command.contains("604800000"), "{line}: {command}");
            assert!(!command.contains("99999999999"), "{line}: {command}");
        }
        // Two different expiry options, or a word the grammar does not know: refused, not
        // forwarded unjudged (a newer server may read the word differently).
        assert!(matches!(
            run("SET k v EX 10 PX 99999999999"),
            TtlAction::Refuse(_)
        ));
        assert!(matches!(run("SET k v IFXX EX"), TtlAction::Refuse(_)));
        // Valkey's IFEQ takes the next word as the value compared: `EX` is no expiry, and the
        // SET gets the key's TTL like any other.
        assert!(matches!(run("SET k v IFEQ EX"), TtlAction::Rewrite(_)));
        // KEEPTTL\0 keeps the TTL: the key gets one only if the SET creates it.
        assert_eq!(rewritten("SET k v KEEPTTL\0").1.len(), 1);
    }

    #[test]
    fn long_ttls_are_cut_to_the_maximum() {
        assert!(
            rewritten("SET k v EX 99999999")
                .0
                .unwrap()
                .contains("$2\r\nPX\r\n$9\r\n604800000\r\n")
        );
        assert!(
            rewritten("SETEX k 99999999 v")
                .0
                .unwrap()
                .starts_with("*4\r\n$6\r\nPSETEX\r\n")
        );
        assert!(
            rewritten("EXPIRE k 99999999")
                .0
                .unwrap()
                .starts_with("*3\r\n$7\r\nPEXPIRE\r\n")
        );
        assert_eq!(run("EXPIRE k 60"), TtlAction::Keep);
        assert!(
            rewritten("PEXPIRE k 999999999999")
                .0
                .unwrap()
                .contains("604800000")
        );
    }

    #[test]
    fn appended_option_patches_the_header_of_any_argc() {
        let px = Appended {
            option: "PX",
            value: 3_600_000,
        };
        let mut out = BytesMut::new();
        assert!(px.extend_frame(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n", &mut out));
        assert_eq!(
            &out[..],
            b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nPX\r\n$7\r\n3600000\r\n"
        );
        // Two-digit headers grow in place; `9` becomes `11`.
        let nine: Vec<&[u8]> = vec![b"SET", b"k", b"v", b"NX", b"GET", b"a", b"b", b"c", b"d"];
        let mut out = BytesMut::new();
        assert!(px.extend_frame(&encode(&nine), &mut out));
        assert!(out.starts_with(b"*11\r\n$3\r\nSET\r\n"));
        // Not a multibulk frame: nothing written.
        let mut out = BytesMut::new();
        assert!(!px.extend_frame(b"SET k v\r\n", &mut out));
        assert!(!px.extend_frame(b"*x\r\n", &mut out));
        assert!(!px.extend_frame(b"*3", &mut out));
        assert!(out.is_empty());
    }

    #[test]
    fn persist_is_refused() {
        assert!(matches!(run("PERSIST k"), TtlAction::Refuse(_)));
        assert!(matches!(run("GETEX k PERSIST"), TtlAction::Refuse(_)));
    }

    #[test]
    fn other_writes_get_a_hidden_pexpire_nx_per_created_key() {
        let (cmd, after) = rewritten("HSET user:1 f v");
        assert_eq!(cmd, None);
        assert_eq!(
            after,
            vec!["*4\r\n$7\r\nPEXPIRE\r\n$6\r\nuser:1\r\n$7\r\n3600000\r\n$2\r\nNX\r\n"]
        );
        assert_eq!(rewritten("MSET a 1 session:b 2").1.len(), 2);
        // RENAME: only the destination is created.
        let after = rewritten("RENAME a b").1;
        assert_eq!(after.len(), 1);
        assert!(after[0].contains("$1\r\nb\r\n"));
        // Reads, deletes and pops create nothing; lock keys are exempt.
        assert_eq!(run("GET a"), TtlAction::Keep);
        assert_eq!(run("DEL a"), TtlAction::Keep);
        assert_eq!(run("LPOP a"), TtlAction::Keep);
        assert_eq!(run("SETNX lock:a 1"), TtlAction::Keep);
    }

    /// An audited rule (and `--explain`) needs only what the rewrite would do: the same note,
    /// no commands built.
    #[test]
    fn note_only_says_the_same_and_builds_nothing() {
        let mut created = rule();
        created.keys = TtlKeys::Created;
        for line in [
            "SET session:1 v",
            "SET k v KEEPTTL",
            "GETSET k v",
            "HSET h f v",
            "MSET cache:1 a cache:2 b",
            "LPUSH q a",
            "EVAL return 1 2 k1 k2",
        ] {
            let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            let spec = commands::lookup_args(&args).unwrap();
            for rule in [&rule(), &created] {
                let built = rule.apply(spec, &args[..], Build::Commands);
                let judged = rule.apply(spec, &args[..], Build::NoteOnly);
                match (built, judged) {
                    (TtlAction::Rewrite(b), TtlAction::Rewrite(j)) => {
                        assert_eq!(b.note, j.note, "{line}");
                        assert!(j.command.is_none() && j.after.is_empty(), "{line}");
                        assert!(j.before().is_empty(), "{line}");
                    }
                    (TtlAction::Keep, TtlAction::Keep) => {}
                    (b, j) => panic!("{line}: {b:?} vs {j:?}"),
                }
            }
        }
    }

    #[test]
    fn jitter_spreads_forced_ttls_evenly_and_never_lengthens_them() {
        let jittered = Ttl {
            jitter: Jitter::new(0.2, 42),
            ..rule()
        };
        let mut buckets = [0u32; 10];
        for i in 0..10_000 {
            let key = format!("user:{i}");
            let ms = jittered.forced_ms(key.as_bytes()).unwrap();
            assert!((2_880_000..=3_600_000).contains(&ms), "{key}: {ms}");
            // The same key always gets the same TTL.
            assert_eq!(jittered.forced_ms(key.as_bytes()), Some(ms));
            buckets[((3_600_000 - ms) / 72_000).min(9) as usize] += 1;
        }
        // Even: each tenth of the spread holds about a tenth of the keys.
        assert!(
            buckets.iter().all(|&n| (800..=1200).contains(&n)),
            "{buckets:?}"
        );
        // Explicit TTLs and cuts to `max` are the client's and the rule's: not spread.
        assert_eq!(
            run_with(&jittered, "SET k v EX 10"),
            TtlAction::Keep,
            "an explicit TTL stays"
        );
        assert_eq!(rule().forced_ms(b"user:1"), Some(3_600_000));
    }

    fn run_with(ttl: &Ttl, line: &str) -> TtlAction {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let spec = commands::lookup_args(&args).unwrap();
        ttl.apply(spec, &args[..], Build::Commands)
    }
}
