//! Which arguments of a command line are keys, computed as Redis computes them for
//! `COMMAND GETKEYS`: the key specs first, then a mirror of Redis's `getkeys_proc`.

use super::grammar::{self, c_atoi, keyword as c_eq_ignore_case};
use super::lookup::find_command;
use super::spec::{
    BeginSearch, CommandFlags, CommandSpec, FindKeys, KeySpec, KeySpecFlags, KeysProc,
};

impl CommandSpec {
    /// The key positions of `args` (the command name at index 0) for this command: see
    /// [`keys_into`], which looks the command up first.
    pub(crate) fn keys_into<A: AsRef<[u8]>>(
        &self,
        args: &[A],
        out: &mut KeyPositions,
    ) -> Result<(), KeyError> {
        out.clear();
        if !self.arity_accepts(args.len()) {
            return Err(KeyError::WrongArity);
        }
        if let Some(key) = self.only_first_key(args) {
            out.keys.push(key);
            return Ok(());
        }
        self.search_keys(args, out)
    }

    /// Redis's key search for a command line of an accepted arity (`keys_into` without its
    /// shortcut for a lone first key).
    fn search_keys<A: AsRef<[u8]>>(
        &self,
        args: &[A],
        out: &mut KeyPositions,
    ) -> Result<(), KeyError> {
        if !self.may_have_keys() {
            return Ok(());
        }
        if self.keys_proc == KeysProc::Unmirrored {
            return Err(KeyError::Unmirrored);
        }

        // Redis's getKeysFromCommandWithSpecs: key specs when there is one that finds real
        // keys and none has variable flags; the procedure when the specs fail (unknown,
        // incomplete, or out of bounds) or when flags vary.
        let has_keyspec = self
            .key_specs
            .iter()
            .any(|s| !s.flags.contains(KeySpecFlags::NOT_KEY));
        let has_varflags = self
            .key_specs
            .iter()
            .any(|s| s.flags.contains(KeySpecFlags::VARIABLE_FLAGS));
        let mut found = false;
        if has_keyspec && !has_varflags {
            found = keys_from_specs(self, args, &mut out.keys);
            if !found {
                out.keys.clear();
            }
        }
        if !found {
            keys_from_proc(self, args, &mut out.keys);
        }

        if matches!(self.keys_proc, KeysProc::Sort | KeysProc::SortRo) {
            let mut patterns = std::mem::take(&mut out.patterns);
            let opts = grammar::sort_options_with(args, self.keys_proc == KeysProc::SortRo, |i| {
                if args[i].as_ref().contains(&b'*') {
                    patterns.push(i);
                }
            });
            out.patterns = patterns;
            let opts = opts.ok_or(KeyError::InvalidArguments)?;
            if self.keys_proc == KeysProc::Sort {
                written_destination(opts.store, out);
            }
        }
        if matches!(self.name, "xread" | "xreadgroup") {
            // The key spec searches for the first `STREAMS` from a fixed index, which may be a
            // group or consumer named STREAMS (`XREADGROUP COUNT 1 GROUP STREAMS c STREAMS k >`
            // reads `k`, GETKEYS reports `c` and `STREAMS`); the command reads the streams
            // after the `STREAMS` that ends its options.
            let opts = grammar::xread_options(args, self.name == "xreadgroup")
                .ok_or(KeyError::InvalidArguments)?;
            let first = opts.streams.ok_or(KeyError::InvalidArguments)?;
            let n = args.len() - first;
            let flags = out
                .keys
                .first()
                .map_or(KeySpecFlags::RO | KeySpecFlags::ACCESS, |k| k.flags);
            out.keys.clear();
            if n == 0 || n % 2 != 0 {
                return Err(KeyError::InvalidArguments);
            }
            out.keys
                .extend((first..first + n / 2).map(|index| KeyRef { index, flags }));
        }
        if matches!(self.name, "georadius" | "georadiusbymember") {
            let opts = grammar::geo_options(args, self.name).ok_or(KeyError::InvalidArguments)?;
            written_destination(opts.store, out);
        }

        // COMMAND GETKEYS: no keys is an error unless keys are optional for this command.
        if out.keys.is_empty() && !self.flags.contains(CommandFlags::NO_MANDATORY_KEYS) {
            return Err(KeyError::InvalidArguments);
        }
        Ok(())
    }
}

impl CommandSpec {
    /// Whether a command line of `argc` arguments (the name included) has one key, its
    /// first argument, as the general search of `keys_into` would find it: one key spec at
    /// index 1 naming one key, and no procedure but SET's and BITFIELD's (which only choose
    /// that key's flags). Most commands have this shape (GET, SET, HSET, INCR…), and the
    /// general search was most of the cost of finding a key's slot in cluster mode
    /// (docs/performance.md). The arity is the caller's to check.
    pub(crate) fn only_key_is_first(&self, argc: usize) -> bool {
        let [ks] = self.key_specs else {
            return false;
        };
        argc >= 2
            && ks.begin_search == BeginSearch::Index(1)
            && matches!(ks.find_keys, FindKeys::Range { lastkey: 0, .. })
            && match self.keys_proc {
                KeysProc::None => {
                    !ks.flags.contains(KeySpecFlags::NOT_KEY)
                        && !ks.flags.contains(KeySpecFlags::INCOMPLETE)
                        && !ks.flags.contains(KeySpecFlags::VARIABLE_FLAGS)
                }
                KeysProc::Set | KeysProc::Bitfield => true,
                _ => false,
            }
    }

    /// The key of a command of the shape [`CommandSpec::only_key_is_first`] tells, with its
    /// flags; `None` for any other shape.
    fn only_first_key<A: AsRef<[u8]>>(&self, args: &[A]) -> Option<KeyRef> {
        if !self.only_key_is_first(args.len()) {
            return None;
        }
        Some(match self.keys_proc {
            KeysProc::Set => set_get_key(args),
            KeysProc::Bitfield => bitfield_get_key(args),
            _ => KeyRef {
                index: 1,
                flags: self.key_specs[0].flags,
            },
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Key extraction
// ---------------------------------------------------------------------------------------------

/// Why the keys of a command line could not be determined. Every variant means "deny if you
/// need the keys": none of them is "the command has no keys".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The command line is empty.
    #[error("empty command")]
    Empty,
    /// The table does not know the command (a module command, or a newer Redis).
    #[error("unknown command")]
    UnknownCommand,
    /// The container is known but its subcommand is not.
    #[error("unknown subcommand")]
    UnknownSubcommand,
    /// The number of arguments does not fit the command's arity.
    #[error("wrong number of arguments")]
    WrongArity,
    /// The command needs keys but the arguments yield none (numkeys 0 or not a number, no
    /// STREAMS keyword…): Redis would reject it, and `COMMAND GETKEYS` says "Invalid
    /// arguments specified for command".
    #[error("invalid arguments: no keys where the command needs them")]
    InvalidArguments,
    /// A command learned from the server whose keys only the server's own procedure finds
    /// ([`KeysProc::Unmirrored`]).
    #[error("the server finds this command's keys in a way the proxy cannot follow")]
    Unmirrored,
}

/// One key argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRef {
    /// Index into the command line (the command name is 0).
    pub index: usize,
    /// How the command accesses this key (as `COMMAND GETKEYSANDFLAGS` reports it; where
    /// Redis's procedure reports no flags, every access flag of the command's key specs).
    pub flags: KeySpecFlags,
}

/// The keys of one command line, in the order Redis reports them. Reusable: [`keys_into`]
/// clears it and, once its buffers have grown, does not allocate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPositions {
    /// The key arguments.
    pub(super) keys: Vec<KeyRef>,
    /// Indices of arguments that are key-name patterns (SORT BY/GET with a `*`).
    patterns: Vec<usize>,
}

impl KeyPositions {
    /// An empty set with room for `keys` keys, so that [`keys_into`] need not allocate.
    pub fn with_capacity(keys: usize) -> KeyPositions {
        KeyPositions {
            keys: Vec::with_capacity(keys),
            patterns: Vec::new(),
        }
    }

    /// Empties the set, keeping its buffers.
    pub(crate) fn clear(&mut self) {
        self.keys.clear();
        self.patterns.clear();
    }

    /// The key arguments, in Redis's order (which is not always ascending: ZUNIONSTORE's
    /// procedure lists the destination last).
    pub fn keys(&self) -> &[KeyRef] {
        &self.keys
    }

    /// The argument indices of the keys, in Redis's order.
    pub fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.keys.iter().map(|k| k.index)
    }

    /// The number of key arguments.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are no key arguments.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    #[cfg(test)]
    /// Whether any key argument may be written.
    pub(crate) fn any_written(&self) -> bool {
        self.keys.iter().any(|k| k.flags.writes())
    }

    /// Whether the command may touch keys that are not among [`KeyPositions::keys`]: SORT and
    /// SORT_RO with a BY or GET pattern containing `*`, whose key names come from the sorted
    /// values. A namespacing caller must prefix [`KeyPositions::key_patterns`] or deny.
    pub(crate) fn incomplete(&self) -> bool {
        !self.patterns.is_empty()
    }

    /// Indices of key-name pattern arguments (SORT/SORT_RO `BY`/`GET` values containing `*`;
    /// `GET #` and patterns without `*` access no key and are not listed). Redis builds key
    /// names by replacing the first `*` with a sorted value (and reads a hash field after
    /// `->`), so prefixing the pattern namespaces the keys it reaches.
    pub(crate) fn key_patterns(&self) -> &[usize] {
        &self.patterns
    }
}

/// The key positions of a command line (the command name at index 0), exactly as Redis's
/// `COMMAND GETKEYS` reports them. Allocates the result; see [`keys_into`] to reuse one.
pub fn keys<A: AsRef<[u8]>>(args: &[A]) -> Result<KeyPositions, KeyError> {
    let mut out = KeyPositions::default();
    keys_into(args, &mut out)?;
    Ok(out)
}

/// Looks up the command of `args` (the command name at index 0) and writes its key positions
/// into `out`, exactly as Redis's `COMMAND GETKEYS` reports them; returns the command.
///
/// - Unknown command or subcommand, wrong arity: an error (fail closed).
/// - A command without key arguments (PING, CLIENT KILL): `Ok` with no keys.
/// - A command that needs keys but whose arguments give none (`ZUNIONSTORE d 0`): an error.
///
/// Does not allocate once `out`'s buffers are large enough.
pub fn keys_into<A: AsRef<[u8]>>(
    args: &[A],
    out: &mut KeyPositions,
) -> Result<&'static CommandSpec, KeyError> {
    out.clear();
    let name = args.first().ok_or(KeyError::Empty)?.as_ref();
    let base = find_command(name).ok_or(KeyError::UnknownCommand)?;
    let spec = match args.get(1) {
        Some(sub) if base.is_container() => base
            .subcommand(sub.as_ref())
            .ok_or(KeyError::UnknownSubcommand)?,
        _ => base,
    };
    spec.keys_into(args, out)?;
    Ok(spec)
}

/// Where Redis's `getKeysUsingKeySpecs` returns -1 (an unknown spec, an out-of-bounds range, a
/// bad numkeys, or an incomplete spec that matched): the caller falls back to the procedure.
struct SpecsFailed;

/// Redis's `getKeysUsingKeySpecs`. Returns false where Redis returns -1 (see [`SpecsFailed`]),
/// in which case the caller falls back to the procedure.
fn keys_from_specs<A: AsRef<[u8]>>(spec: &CommandSpec, args: &[A], out: &mut Vec<KeyRef>) -> bool {
    spec.key_specs
        .iter()
        .all(|ks| keys_from_spec(ks, args, out).is_ok())
}

/// One key spec's turn in `getKeysUsingKeySpecs`: pushes the keys it finds in `args`.
fn keys_from_spec<A: AsRef<[u8]>>(
    ks: &KeySpec,
    args: &[A],
    out: &mut Vec<KeyRef>,
) -> Result<(), SpecsFailed> {
    if ks.flags.contains(KeySpecFlags::NOT_KEY) {
        return Ok(());
    }
    let argc = args.len() as i64;
    let Some(first) = begin_search(ks.begin_search, args)? else {
        return Ok(()); // keyword absent: this spec has no keys
    };
    let (first, last, step) = find_keys(ks.find_keys, first, args)?;
    // An open range (`lastkey` < 0) that begins where the arguments end names no keys: what
    // the command does (`PFMERGE dest` creates `dest` with no sources), though Redis's
    // GETKEYS calls the spec out of bounds and reports no key at all, not even `dest`.
    if first == argc && matches!(ks.find_keys, FindKeys::Range { lastkey, .. } if lastkey < 0) {
        return Ok(());
    }
    if last >= argc || last < first || first >= argc || step <= 0 {
        return Err(SpecsFailed);
    }
    let mut i = first;
    while i <= last {
        out.push(KeyRef {
            index: i as usize,
            flags: ks.flags,
        });
        i += step;
    }
    if ks.flags.contains(KeySpecFlags::INCOMPLETE) {
        return Err(SpecsFailed);
    }
    Ok(())
}

/// The index where a key spec's keys begin, `None` when its keyword is absent (the spec then
/// finds no keys).
fn begin_search<A: AsRef<[u8]>>(
    begin: BeginSearch,
    args: &[A],
) -> Result<Option<i64>, SpecsFailed> {
    match begin {
        BeginSearch::Index(pos) => Ok(Some(i64::from(pos))),
        BeginSearch::Keyword { keyword, startfrom } => {
            Ok(keyword_search(keyword, i64::from(startfrom), args))
        }
        BeginSearch::Unknown => Err(SpecsFailed),
    }
}

/// One past the first argument equal to `keyword`, searching from `startfrom` towards the end,
/// or from `argc + startfrom` towards the start when it is negative, never at the command name.
fn keyword_search<A: AsRef<[u8]>>(keyword: &str, startfrom: i64, args: &[A]) -> Option<i64> {
    let argc = args.len() as i64;
    let (start, end) = if startfrom > 0 {
        (startfrom, argc - 1)
    } else {
        (argc + startfrom, 1)
    };
    let mut i = start;
    while i != end {
        if i >= argc || i < 1 {
            return None;
        }
        if c_eq_ignore_case(args[i as usize].as_ref(), keyword.as_bytes()) {
            return Some(i + 1);
        }
        i = if start <= end { i + 1 } else { i - 1 };
    }
    None
}

/// The first and last key index and the step between keys, for a spec whose search began at
/// `first`; not yet checked against the arguments' bounds.
fn find_keys<A: AsRef<[u8]>>(
    find: FindKeys,
    first: i64,
    args: &[A],
) -> Result<(i64, i64, i64), SpecsFailed> {
    let argc = args.len() as i64;
    match find {
        FindKeys::Range {
            lastkey,
            keystep,
            limit,
        } => {
            let lastkey = i64::from(lastkey);
            let last = if lastkey >= 0 {
                first + lastkey
            } else if limit == 0 {
                argc + lastkey
            } else {
                first + ((argc - first) / i64::from(limit) + lastkey)
            };
            Ok((first, last, i64::from(keystep)))
        }
        FindKeys::Keynum {
            keynumidx,
            firstkey,
            keystep,
        } => {
            let at = first + i64::from(keynumidx);
            let numkeys = args
                .get(at as usize)
                .filter(|_| at < argc)
                .and_then(|a| crate::protocol::codec::parse_int(a.as_ref()))
                .filter(|&n| n >= 0)
                .ok_or(SpecsFailed)?;
            let first = first + i64::from(firstkey);
            // The last key is `numkeys - 1` steps after the first, in C int arithmetic. A
            // step of 1 (every 7.0 command) hides the step: Valkey 9.1's MSETEX (`numkeys`
            // key/value pairs, step 2) read as `first + numkeys - 1` left its later keys
            // unprefixed by a tenant's namespace (namespace sweep, seed 451896339).
            let last = (first as i32).wrapping_add(
                (numkeys as i32)
                    .wrapping_sub(1)
                    .wrapping_mul(keystep as i32),
            );
            Ok((first, i64::from(last), i64::from(keystep)))
        }
        FindKeys::Unknown => Err(SpecsFailed),
    }
}

/// Runs the command's Redis key procedure (the fallback of `getKeysFromCommandWithSpecs`):
/// one small function per procedure, each mirroring its C original.
fn keys_from_proc<A: AsRef<[u8]>>(spec: &CommandSpec, args: &[A], out: &mut Vec<KeyRef>) {
    // Flags for procedures that report none (Redis leaves them 0).
    let unknown = || spec.all_key_flags();
    match spec.keys_proc {
        KeysProc::None | KeysProc::Unmirrored => {}
        KeysProc::ZunionInterDiffStore => generic_get_keys(1, 2, 3, 1, args, unknown(), out),
        KeysProc::ZunionInterDiff | KeysProc::Sintercard | KeysProc::Lmpop | KeysProc::Zmpop => {
            generic_get_keys(0, 1, 2, 1, args, unknown(), out)
        }
        KeysProc::Eval | KeysProc::Function | KeysProc::Blmpop | KeysProc::Bzmpop => {
            generic_get_keys(0, 2, 3, 1, args, unknown(), out)
        }
        KeysProc::SortRo => out.push(sorted_key()),
        KeysProc::Sort => sort_get_keys(args, out),
        KeysProc::Migrate => migrate_get_keys(args, out),
        KeysProc::Georadius => georadius_get_keys(args, unknown(), out),
        KeysProc::Xread => xread_get_keys(args, unknown(), out),
        KeysProc::Set => out.push(set_get_key(args)),
        KeysProc::Bitfield => out.push(bitfield_get_key(args)),
    }
}

/// Argument `i` of a command line, empty past its end (as a procedure sees a missing one).
fn arg_at<A: AsRef<[u8]>>(args: &[A], i: usize) -> &[u8] {
    args.get(i).map_or(&[][..], AsRef::as_ref)
}

/// The key SORT and SORT_RO sort: read, at index 1.
fn sorted_key() -> KeyRef {
    KeyRef {
        index: 1,
        flags: KeySpecFlags::RO | KeySpecFlags::ACCESS,
    }
}

/// Redis's `sortGetKeys`: the sorted key, then the `STORE` destination if any.
fn sort_get_keys<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<KeyRef>) {
    out.push(sorted_key());
    // sortGetKeys: LIMIT skips 2, GET and BY skip 1, anything else 0; the last STORE
    // with an argument after it wins (and its argument is scanned as an option too).
    let argc = args.len();
    let mut store = None;
    let mut i = 2;
    while i < argc {
        let a = arg_at(args, i);
        if c_eq_ignore_case(a, b"limit") {
            i += 2;
        } else if c_eq_ignore_case(a, b"store") && i + 1 < argc {
            store = Some(i + 1);
        } else if c_eq_ignore_case(a, b"get") || c_eq_ignore_case(a, b"by") {
            i += 1;
        }
        i += 1;
    }
    if let Some(index) = store {
        out.push(KeyRef {
            index,
            flags: KeySpecFlags::OW | KeySpecFlags::UPDATE,
        });
    }
}

/// Redis's `migrateGetKeys`: the key at 3, or the keys after `KEYS` when the key at 3 is
/// empty.
fn migrate_get_keys<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<KeyRef>) {
    let (first, num) = migrate_key_range(args);
    let flags = KeySpecFlags::RW | KeySpecFlags::ACCESS | KeySpecFlags::DELETE;
    out.extend((first..first + num).map(|index| KeyRef { index, flags }));
}

/// The first key index and the number of keys of a MIGRATE command line: the options after
/// index 5 are scanned for `KEYS` (skipping the arguments of `AUTH` and `AUTH2`).
fn migrate_key_range<A: AsRef<[u8]>>(args: &[A]) -> (usize, usize) {
    let argc = args.len();
    let mut i = 6;
    while i < argc {
        let a = arg_at(args, i);
        if c_eq_ignore_case(a, b"keys") {
            if !arg_at(args, 3).is_empty() {
                return (3, 0); // syntax error left to MIGRATE itself
            }
            return (i + 1, argc - (i + 1));
        }
        if c_eq_ignore_case(a, b"auth") {
            i += 1;
        } else if c_eq_ignore_case(a, b"auth2") {
            i += 2;
        }
        i += 1;
    }
    (3, 1)
}

/// Redis's `georadiusGetKeys`: the key, and the last `STORE`/`STOREDIST` destination.
fn georadius_get_keys<A: AsRef<[u8]>>(args: &[A], flags: KeySpecFlags, out: &mut Vec<KeyRef>) {
    let argc = args.len();
    let mut stored = None;
    let mut i = 5;
    while i < argc {
        let a = arg_at(args, i);
        if (c_eq_ignore_case(a, b"store") || c_eq_ignore_case(a, b"storedist")) && i + 1 < argc {
            stored = Some(i + 1);
            i += 1;
        }
        i += 1;
    }
    out.push(KeyRef { index: 1, flags });
    if let Some(index) = stored {
        out.push(KeyRef { index, flags });
    }
}

/// Redis's `xreadGetKeys`: the first half of the arguments after `STREAMS`, none when their
/// number is odd or zero.
fn xread_get_keys<A: AsRef<[u8]>>(args: &[A], flags: KeySpecFlags, out: &mut Vec<KeyRef>) {
    let argc = args.len();
    let Some(pos) = xread_streams_pos(args) else {
        return;
    };
    let num = argc - pos - 1;
    if num == 0 || num % 2 != 0 {
        return;
    }
    let num = num / 2;
    out.extend((pos + 1..argc - num).map(|index| KeyRef { index, flags }));
}

/// The index of XREAD's (or XREADGROUP's) `STREAMS` keyword, found by skipping the options
/// before it; `None` when an unknown option comes first.
fn xread_streams_pos<A: AsRef<[u8]>>(args: &[A]) -> Option<usize> {
    let mut i = 1;
    while i < args.len() {
        let a = arg_at(args, i);
        if c_eq_ignore_case(a, b"block") || c_eq_ignore_case(a, b"count") {
            i += 1;
        } else if c_eq_ignore_case(a, b"group") {
            i += 2;
        } else if c_eq_ignore_case(a, b"streams") {
            return Some(i);
        } else if !c_eq_ignore_case(a, b"noack") {
            return None;
        }
        i += 1;
    }
    None
}

/// Redis's `setGetKeys`: the key, read-write with `GET`, overwritten without.
fn set_get_key<A: AsRef<[u8]>>(args: &[A]) -> KeyRef {
    // setGetKeys compares the first three bytes and a NUL: "get" as a C string.
    let get = (3..args.len()).any(|i| c_eq_ignore_case(arg_at(args, i), b"get"));
    let flags = if get {
        KeySpecFlags::RW | KeySpecFlags::ACCESS | KeySpecFlags::UPDATE
    } else {
        KeySpecFlags::OW | KeySpecFlags::UPDATE
    };
    KeyRef { index: 1, flags }
}

/// Redis's `bitfieldGetKeys`: the key, read-only when only `GET` operations are given.
fn bitfield_get_key<A: AsRef<[u8]>>(args: &[A]) -> KeyRef {
    let flags = if bitfield_readonly(args) {
        KeySpecFlags::RO | KeySpecFlags::ACCESS
    } else {
        KeySpecFlags::RW | KeySpecFlags::ACCESS | KeySpecFlags::UPDATE
    };
    KeyRef { index: 1, flags }
}

/// Whether a BITFIELD command line has only `GET` (and `OVERFLOW`) operations, each with all
/// its arguments.
fn bitfield_readonly<A: AsRef<[u8]>>(args: &[A]) -> bool {
    let argc = args.len();
    let mut i = 2;
    while i < argc {
        let remaining = argc - i - 1;
        let a = arg_at(args, i);
        if c_eq_ignore_case(a, b"get") && remaining >= 2 {
            i += 2;
        } else if (c_eq_ignore_case(a, b"set") || c_eq_ignore_case(a, b"incrby")) && remaining >= 3
        {
            return false;
        } else if c_eq_ignore_case(a, b"overflow") && remaining >= 1 {
            i += 1;
        } else {
            return false; // syntax error: assume a write, as Redis does
        }
        i += 1;
    }
    true
}

/// Redis's `genericGetKeys`: `atoi(args[count_at])` keys from `first`, every `step`-th, then
/// the destination (if `store_at` is not 0); nothing when the count is below 1 or too large.
fn generic_get_keys<A: AsRef<[u8]>>(
    store_at: usize,
    count_at: usize,
    first: usize,
    step: usize,
    args: &[A],
    flags: KeySpecFlags,
    out: &mut Vec<KeyRef>,
) {
    let argc = args.len() as i64;
    let Some(count) = args.get(count_at) else {
        return;
    };
    let num = i64::from(c_atoi(count.as_ref()));
    if num < 1 || num > (argc - first as i64) / step as i64 {
        return;
    }
    out.extend((0..num as usize).map(|i| KeyRef {
        index: first + i * step,
        flags,
    }));
    if store_at != 0 {
        out.push(KeyRef {
            index: store_at,
            flags,
        });
    }
}

/// The destination a SORT or GEORADIUS(BYMEMBER) command really writes, in place of the one
/// `COMMAND GETKEYS` reports: Redis's key procedure and key specs take the first `STORE` (or
/// skip a `STORE` that follows `LIMIT`), while the command's own parser applies the last
/// (`SORT k STORE a STORE b` writes `b`). A namespace or a cluster route that followed GETKEYS
/// would prefix or route `a` and let `b` be written unconfined.
fn written_destination(store: Option<usize>, out: &mut KeyPositions) {
    out.keys.retain(|k| k.index == 1);
    if let Some(index) = store {
        out.keys.push(KeyRef {
            index,
            flags: KeySpecFlags::OW | KeySpecFlags::UPDATE,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::all_commands;

    /// A `numkeys` spec with a step: the keys are `numkeys` steps apart, as the server's own
    /// `COMMAND GETKEYS MSETEX 3 a x b v c w` answers `a b c` (Valkey 9.1).
    #[test]
    fn keynum_keys_are_numkeys_steps_apart() {
        let args: [&[u8]; 8] = [b"MSETEX", b"3", b"a", b"x", b"b", b"v", b"c", b"w"];
        let find = FindKeys::Keynum {
            keynumidx: 0,
            firstkey: 1,
            keystep: 2,
        };
        assert_eq!(find_keys(find, 1, &args[..]).ok(), Some((2, 6, 2)));
        // Step 1 (ZUNION, EVAL…) as before; no keys for numkeys 0.
        let eval: [&[u8]; 5] = [b"EVAL", b"s", b"2", b"k1", b"k2"];
        let find = FindKeys::Keynum {
            keynumidx: 0,
            firstkey: 1,
            keystep: 1,
        };
        assert_eq!(find_keys(find, 2, &eval[..]).ok(), Some((3, 4, 1)));
        let none: [&[u8]; 3] = [b"EVAL", b"s", b"0"];
        assert_eq!(find_keys(find, 2, &none[..]).ok(), Some((3, 2, 1)));
    }

    /// The lone-first-key shortcut finds what Redis's search finds, flags included, for every
    /// command of that shape, at every length its arity accepts up to 7 arguments, with
    /// arguments that include SET's `GET` and BITFIELD's operations.
    #[test]
    fn the_first_key_shortcut_agrees_with_the_search() {
        let words: [&[u8]; 7] = [b"cmd", b"k", b"GET", b"u8", b"0", b"get", b"x"];
        let mut shortcut = KeyPositions::default();
        let mut searched = KeyPositions::default();
        let mut shaped = 0;
        for spec in all_commands() {
            for argc in 1..=words.len() {
                if !spec.arity_accepts(argc) || !spec.only_key_is_first(argc) {
                    continue;
                }
                shaped += 1;
                let args = &words[..argc];
                let fast = spec.keys_into(args, &mut shortcut);
                searched.clear();
                let slow = spec.search_keys(args, &mut searched);
                assert_eq!(
                    (fast, &shortcut),
                    (slow, &searched),
                    "{} argc {argc}",
                    spec.name
                );
            }
        }
        // GET, SET, HSET, INCR… at several lengths: the shortcut is not vacuous.
        assert!(shaped > 200, "only {shaped} command lines had the shape");
        assert!(find_command(b"set").is_some_and(|s| s.only_key_is_first(3)));
        assert!(!find_command(b"mget").is_some_and(|s| s.only_key_is_first(3)));
        assert!(!find_command(b"eval").is_some_and(|s| s.only_key_is_first(4)));
    }
}
