//! One reading of a command's arguments, as Redis's own parsers read them.
//!
//! Redis compares option keywords with C's `strcasecmp` on the argument's bytes, so the
//! comparison stops at the first NUL byte: `EX\0junk`, `persist\0` and `COUNT\0` are the
//! keywords `EX`, `PERSIST` and `COUNT` to Redis. Its parsers walk options positionally from a
//! fixed start, each option consuming its own values, and most let a repeated option's last
//! occurrence win. A rule that compares bytes exactly, or searches for a keyword from the end,
//! disagrees with Redis on some spelling, and every disagreement is a way around the rule.
//! Every rule, the router and the session read options through this module.

/// What Redis 7.0's helloCommand does with a HELLO command frame's options, which it runs in
/// order, each as it comes, stopping at the first bad one with an error.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct HelloOptions {
    /// The name its SETNAME options give before any bad one (the last): done even when a
    /// later option is refused.
    pub(crate) name: Option<bytes::Bytes>,
    /// An AUTH came before a bad option (or a bad SETNAME name): Redis logged the client in
    /// (unless the credentials were wrong: WRONGPASS) and then answered the error, so the
    /// login holds and the protocol does not change.
    pub(crate) bad_after_auth: bool,
}

/// The options of a HELLO command frame as Redis runs them (see [`HelloOptions`]). A
/// forwarded HELLO names the client upstream; the proxy answers CLIENT GETNAME and LIST from
/// its own record, so it notes the name too (it answered `$-1` after it; state fuzzer). Not
/// on the data path.
pub(crate) fn hello_options(command: &[u8]) -> HelloOptions {
    let Some(args) = crate::protocol::codec::split_args_of(command) else {
        return HelloOptions::default();
    };
    let mut out = HelloOptions::default();
    let mut auth = false;
    let mut j = 2;
    while j < args.len() {
        let more = args.len() - 1 - j;
        if keyword(&args[j], b"AUTH") && more >= 2 {
            auth = true;
            j += 3;
        } else if keyword(&args[j], b"SETNAME") && more >= 1 && valid_client_name(&args[j + 1]) {
            out.name = Some(bytes::Bytes::copy_from_slice(&args[j + 1]));
            j += 2;
        } else {
            out.bad_after_auth = auth;
            break;
        }
    }
    out
}

/// Whether Redis takes `name` for CLIENT SETNAME (or HELLO's SETNAME): printable ASCII
/// without spaces.
pub(crate) fn valid_client_name(name: &[u8]) -> bool {
    name.iter().all(|&c| (b'!'..=b'~').contains(&c))
}

/// C's `strcasecmp(arg, keyword) == 0` on a Redis argument: the argument ends at its first NUL
/// byte, as Redis's own parsing sees it.
pub(crate) fn keyword(arg: &[u8], keyword: &[u8]) -> bool {
    let end = arg.iter().position(|&b| b == 0).unwrap_or(arg.len());
    arg[..end].eq_ignore_ascii_case(keyword)
}

/// C's `atoi` as glibc implements it, `(int) strtol(s, NULL, 10)`: leading white space, an
/// optional sign, digits up to the first non-digit, saturating at the `long` range, then
/// truncated to `int`. Redis's procedures parse numkeys with it.
pub(crate) fn c_atoi(s: &[u8]) -> i32 {
    let mut i = 0;
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        i += 1;
    }
    let mut negative = false;
    if i < s.len() && (s[i] == b'+' || s[i] == b'-') {
        negative = s[i] == b'-';
        i += 1;
    }
    let mut v: i128 = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        if v <= i128::from(i64::MAX) + 1 {
            v = v * 10 + i128::from(s[i] - b'0');
        }
        i += 1;
    }
    let v = if negative { -v } else { v };
    let long = v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    long as i32
}

/// A command line as the readers see it: argument `i` through a function, so callers keep
/// their own argument storage (the session's frame ranges, a test's string slices) and
/// nothing is copied to read an option.
pub trait CommandLine {
    /// Number of arguments, the command name included.
    fn argc(&self) -> usize;
    /// Argument `i` (0 is the command name).
    fn arg(&self, i: usize) -> &[u8];
    /// Argument `i`, or nothing past the last one (for a reader that compares words).
    fn arg_or_empty(&self, i: usize) -> &[u8] {
        if i < self.argc() { self.arg(i) } else { &[] }
    }
}

impl<A: AsRef<[u8]>> CommandLine for [A] {
    fn argc(&self) -> usize {
        self.len()
    }
    fn arg(&self, i: usize) -> &[u8] {
        self[i].as_ref()
    }
}

/// Argument `i` as Redis's `string2ll` reads a number (the whole argument, no NUL cut).
fn int_at<L: CommandLine + ?Sized>(line: &L, i: usize) -> Option<i64> {
    (i < line.argc())
        .then(|| crate::protocol::codec::parse_int(line.arg(i)))
        .flatten()
}

// ---------------------------------------------------------------------------------------------
// SET and GETEX: `parseExtendedStringArgumentsOrReply`
// ---------------------------------------------------------------------------------------------

/// An expiry option (`EX`, `PX`, `EXAT`, `PXAT`) as SET and GETEX read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expiry {
    /// Index of the number: the value of the option's last occurrence, which Redis applies.
    pub(crate) at: usize,
    /// Milliseconds per unit: 1000 for `EX`/`EXAT`, 1 for `PX`/`PXAT`.
    pub(crate) unit_ms: u64,
    /// `EXAT`/`PXAT`: a Unix time rather than a duration.
    pub(crate) absolute: bool,
}

/// What SET (from argument 3) or GETEX (from argument 2) asks for, read as Redis reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StringOptions {
    /// The expiry option Redis applies, if any.
    pub(crate) expiry: Option<Expiry>,
    /// SET `KEEPTTL`: an existing key keeps its TTL.
    pub(crate) keepttl: bool,
    /// GETEX `PERSIST`: the key's TTL is removed.
    pub(crate) persist: bool,
    /// SET `NX`: only a new key is written (the lock pattern).
    pub(crate) nx: bool,
    /// SET `GET`: the old value is returned.
    pub(crate) get: bool,
    /// SET `IFEQ`/`IFNE`/`IFDEQ`/`IFDNE <value>`: written only when the current value (or
    /// its digest) compares so; like `XX`, never creates a key.
    pub(crate) compare: bool,
}

/// SET's compare-and-set options of newer servers, each followed by the value compared.
fn compare_option(opt: &[u8]) -> bool {
    [&b"IFEQ"[..], b"IFNE", b"IFDEQ", b"IFDNE"]
        .iter()
        .any(|k| keyword(opt, k))
}

/// SET's options (`get: false`) or GETEX's (`get: true`), as Redis 7's
/// `parseExtendedStringArgumentsOrReply` walks them: each keyword compared up to a NUL byte; an
/// expiry option repeated is applied from its last occurrence, two different ones (or one with
/// KEEPTTL/PERSIST) are a syntax error. `None` where Redis refuses the command.
pub(crate) fn string_options<L: CommandLine + ?Sized>(
    line: &L,
    getex: bool,
) -> Option<StringOptions> {
    let mut o = StringOptions::default();
    // Which expiry keyword was given (its unit and form), so a different one is refused.
    let mut kind: Option<(u64, bool)> = None;
    let mut xx = false;
    let mut j = if getex { 2 } else { 3 };
    while j < line.argc() {
        let opt = line.arg(j);
        let has_next = j + 1 < line.argc();
        let expiry = if keyword(opt, b"EX") {
            Some((1000, false))
        } else if keyword(opt, b"PX") {
            Some((1, false))
        } else if keyword(opt, b"EXAT") {
            Some((1000, true))
        } else if keyword(opt, b"PXAT") {
            Some((1, true))
        } else {
            None
        };
        if let Some(k) = expiry {
            if o.keepttl || o.persist || kind.is_some_and(|given| given != k) || !has_next {
                return None;
            }
            kind = Some(k);
            o.expiry = Some(Expiry {
                at: j + 1,
                unit_ms: k.0,
                absolute: k.1,
            });
            j += 2;
            continue;
        }
        if !getex && compare_option(opt) {
            // `IFEQ <value>` (Valkey 8.1+), `IFNE/IFDEQ/IFDNE <value>` (Redis 8.4+): the word
            // after it is the value compared, never an option (`SET k v IFEQ EX`).
            if !has_next || o.nx || xx {
                return None;
            }
            o.compare = true;
            j += 2;
            continue;
        }
        if !getex && keyword(opt, b"NX") && !xx && !o.compare {
            o.nx = true;
        } else if !getex && keyword(opt, b"XX") && !o.nx && !o.compare {
            xx = true;
        } else if !getex && keyword(opt, b"GET") {
            o.get = true;
        } else if !getex && keyword(opt, b"KEEPTTL") && kind.is_none() {
            o.keepttl = true;
        } else if getex && keyword(opt, b"PERSIST") && kind.is_none() {
            o.persist = true;
        } else {
            return None;
        }
        j += 1;
    }
    Some(o)
}

/// Every index of an expiry option's number in SET/GETEX (a repeated option has several; Redis
/// applies the last), for a rewrite that must change them all.
pub(crate) fn expiry_values<L: CommandLine + ?Sized>(line: &L, getex: bool) -> Vec<usize> {
    let mut out = Vec::new();
    let mut j = if getex { 2 } else { 3 };
    while j < line.argc() {
        let opt = line.arg(j);
        if [&b"EX"[..], b"PX", b"EXAT", b"PXAT"]
            .iter()
            .any(|k| keyword(opt, k))
            && j + 1 < line.argc()
        {
            out.push(j + 1);
            j += 2;
        } else if !getex && compare_option(opt) {
            j += 2;
        } else {
            j += 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// HSETEX, HGETEX (Redis 8, Valkey 9): options between the key and `FIELDS`
// ---------------------------------------------------------------------------------------------

/// What HSETEX or HGETEX asks for before `FIELDS`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HashExpiry {
    /// The expiry the fields get (the last one given).
    pub(crate) expiry: Option<Expiry>,
    /// Every index of an expiry option's number, for a rewrite that must change them all.
    pub(crate) values: Vec<usize>,
    /// `KEEPTTL` (HSETEX): fields keep the TTLs they have.
    pub(crate) keepttl: bool,
    /// `PERSIST` (HGETEX): the fields' TTLs are removed.
    pub(crate) persist: bool,
}

/// The options of HSETEX/HGETEX from argument 2 up to `FIELDS`, walked positionally: the
/// expiry options take a value, `NX`/`XX`/`FNX`/`FXX`/`KEEPTTL`/`PERSIST` none. `None` for a
/// word the walk does not know or no `FIELDS` (the rule then refuses: fail closed).
pub(crate) fn hash_expiry<L: CommandLine + ?Sized>(line: &L) -> Option<HashExpiry> {
    expiry_options(line, 2, true)
}

/// MSETEX's options (Valkey 9.1, Redis 8.4): after `numkeys` key/value pairs, the same words
/// as HSETEX's to the end of the line. `None` where the walk cannot read them.
pub(crate) fn msetex_options<L: CommandLine + ?Sized>(line: &L) -> Option<HashExpiry> {
    let numkeys: usize = std::str::from_utf8(line.arg(1)).ok()?.parse().ok()?;
    let from = numkeys.checked_mul(2)?.checked_add(2)?;
    if numkeys == 0 || from > line.argc() {
        return None;
    }
    expiry_options(line, from, false)
}

/// The expiry options from argument `from`, up to `FIELDS` (`fields`: it must come) or the
/// end of the line.
fn expiry_options<L: CommandLine + ?Sized>(
    line: &L,
    from: usize,
    fields: bool,
) -> Option<HashExpiry> {
    let mut o = HashExpiry::default();
    let mut j = from;
    while j < line.argc() {
        let opt = line.arg(j);
        if fields && keyword(opt, b"FIELDS") {
            return Some(o);
        }
        let unit = [
            (&b"EX"[..], 1000, false),
            (b"PX", 1, false),
            (b"EXAT", 1000, true),
            (b"PXAT", 1, true),
        ]
        .into_iter()
        .find(|(k, _, _)| keyword(opt, k));
        if let Some((_, unit_ms, absolute)) = unit {
            if j + 1 >= line.argc() {
                return None;
            }
            o.expiry = Some(Expiry {
                at: j + 1,
                unit_ms,
                absolute,
            });
            o.values.push(j + 1);
            j += 2;
            continue;
        }
        if keyword(opt, b"KEEPTTL") {
            o.keepttl = true;
        } else if keyword(opt, b"PERSIST") {
            o.persist = true;
        } else if ![&b"NX"[..], b"XX", b"FNX", b"FXX"]
            .iter()
            .any(|k| keyword(opt, k))
        {
            return None;
        }
        j += 1;
    }
    (!fields).then_some(o)
}

// ---------------------------------------------------------------------------------------------
// SCAN, SSCAN, HSCAN, ZSCAN: `scanGenericCommand`
// ---------------------------------------------------------------------------------------------

/// The options of a SCAN-family command, as Redis applies them (the last of each wins).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ScanOptions {
    /// Index of the `COUNT` value Redis applies.
    pub(crate) count: Option<usize>,
    /// Index of the `MATCH` pattern Redis applies.
    pub(crate) pattern: Option<usize>,
}

/// SCAN's options from argument 2, SSCAN/HSCAN/ZSCAN's from 3 (`from`); `None` where Redis
/// refuses them (an unknown word, a missing value).
pub(crate) fn scan_options<L: CommandLine + ?Sized>(line: &L, from: usize) -> Option<ScanOptions> {
    let mut o = ScanOptions::default();
    let mut i = from;
    while i < line.argc() {
        let more = i + 1 < line.argc();
        if keyword(line.arg(i), b"COUNT") && more {
            o.count = Some(i + 1);
        } else if keyword(line.arg(i), b"MATCH") && more {
            o.pattern = Some(i + 1);
        } else if keyword(line.arg(i), b"TYPE") && more && from == 2 {
        } else if keyword(line.arg(i), b"NOVALUES") && from == 3 {
            // HSCAN NOVALUES (Redis 7.4+): takes no value.
            i += 1;
            continue;
        } else {
            return None;
        }
        i += 2;
    }
    Some(o)
}

// ---------------------------------------------------------------------------------------------
// Range reads: ZRANGE family, XRANGE, *MPOP, SORT, GEO searches
// ---------------------------------------------------------------------------------------------

/// ZRANGE-family options after the range (`zrangeGenericCommand`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ZrangeOptions {
    /// BYSCORE or BYLEX: the range is of values, bounded only by LIMIT.
    pub(crate) by_value: bool,
    /// Index of the LIMIT count Redis applies (the last LIMIT wins).
    pub(crate) limit_count: Option<usize>,
}

/// The options of ZRANGE (`first_option` 4), ZRANGESTORE (5) or a ZRANGEBY*/ZREVRANGE* form
/// (`fixed_by_value`: BYSCORE/BYLEX are implied and refused as words). `None`: Redis refuses.
pub(crate) fn zrange_options<L: CommandLine + ?Sized>(
    line: &L,
    first_option: usize,
    fixed: bool,
) -> Option<ZrangeOptions> {
    let mut o = ZrangeOptions {
        by_value: fixed,
        limit_count: None,
    };
    let mut rev = fixed;
    let mut j = first_option;
    while j < line.argc() {
        let a = line.arg(j);
        let left = line.argc() - j - 1;
        if keyword(a, b"WITHSCORES") {
        } else if keyword(a, b"LIMIT") && left >= 2 {
            int_at(line, j + 1)?;
            int_at(line, j + 2)?;
            o.limit_count = Some(j + 2);
            j += 2;
        } else if !rev && keyword(a, b"REV") {
            rev = true;
        } else if !o.by_value && (keyword(a, b"BYSCORE") || keyword(a, b"BYLEX")) {
            o.by_value = true;
        } else {
            return None;
        }
        j += 1;
    }
    Some(o)
}

/// The index of XRANGE/XREVRANGE's COUNT value Redis applies (the last; options from 4);
/// `None` where Redis refuses the options.
pub(crate) fn xrange_count<L: CommandLine + ?Sized>(line: &L) -> Option<Option<usize>> {
    let mut count = None;
    let mut j = 4;
    while j < line.argc() {
        if keyword(line.arg(j), b"COUNT") && j + 1 < line.argc() {
            count = Some(j + 1);
            j += 2;
        } else {
            return None;
        }
    }
    Some(count)
}

/// The index of LMPOP/BLMPOP/ZMPOP/BZMPOP's COUNT value (`numkeys_at`: 1, or 2 for the
/// blocking forms); `None` where Redis refuses the options (COUNT may be given once).
pub(crate) fn mpop_count<L: CommandLine + ?Sized>(
    line: &L,
    numkeys_at: usize,
) -> Option<Option<usize>> {
    let numkeys = int_at(line, numkeys_at).filter(|&n| n >= 1)?;
    let where_at = usize::try_from(numkeys)
        .ok()
        .and_then(|n| n.checked_add(numkeys_at + 1))
        .filter(|&w| w < line.argc())?;
    let mut count = None;
    let mut j = where_at + 1;
    while j < line.argc() {
        if count.is_none() && keyword(line.arg(j), b"COUNT") && j + 1 < line.argc() {
            count = Some(j + 1);
            j += 2;
        } else {
            return None;
        }
    }
    Some(count)
}

/// SORT and SORT_RO as `sortCommandGeneric` reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SortOptions {
    /// Index of the LIMIT count Redis applies (the last LIMIT wins).
    pub(crate) limit_count: Option<usize>,
    /// Index of the STORE destination Redis writes (the last STORE wins; SORT only).
    pub(crate) store: Option<usize>,
    /// How many BY and GET patterns there are (they name keys derived from the sorted
    /// values); [`sort_options_with`] hands their indices to a caller that needs them.
    pub(crate) patterns: usize,
}

/// SORT's options from argument 2 (`readonly`: SORT_RO, which has no STORE). `None` where
/// Redis refuses them.
pub(crate) fn sort_options<L: CommandLine + ?Sized>(
    line: &L,
    readonly: bool,
) -> Option<SortOptions> {
    sort_options_with(line, readonly, |_| {})
}

/// [`sort_options`], handing each BY/GET pattern's index to `pattern` as the walk finds it
/// (no allocation: key extraction runs it per SORT).
pub(crate) fn sort_options_with<L: CommandLine + ?Sized>(
    line: &L,
    readonly: bool,
    mut pattern: impl FnMut(usize),
) -> Option<SortOptions> {
    let mut o = SortOptions::default();
    let mut j = 2;
    while j < line.argc() {
        let a = line.arg(j);
        let left = line.argc() - j - 1;
        if keyword(a, b"ASC") || keyword(a, b"DESC") || keyword(a, b"ALPHA") {
        } else if keyword(a, b"LIMIT") && left >= 2 {
            int_at(line, j + 1)?;
            int_at(line, j + 2)?;
            o.limit_count = Some(j + 2);
            j += 2;
        } else if !readonly && keyword(a, b"STORE") && left >= 1 {
            o.store = Some(j + 1);
            j += 1;
        } else if (keyword(a, b"BY") || keyword(a, b"GET")) && left >= 1 {
            o.patterns += 1;
            pattern(j + 1);
            j += 1;
        } else {
            return None;
        }
        j += 1;
    }
    Some(o)
}

/// The GEO search family as `georadiusGeneric` reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GeoOptions {
    /// Index of the COUNT value Redis applies (the last wins).
    pub(crate) count: Option<usize>,
    /// Index of the STORE/STOREDIST destination of GEORADIUS/GEORADIUSBYMEMBER (the last
    /// wins); GEOSEARCHSTORE's destination is its argument 1.
    pub(crate) store: Option<usize>,
}

/// GEORADIUS (`name` "georadius", options from 6), GEORADIUSBYMEMBER (5), their `_ro` forms
/// (no STORE), GEOSEARCH (2) and GEOSEARCHSTORE (3). `None` where Redis refuses the options or
/// the command is not one of these.
pub(crate) fn geo_options<L: CommandLine + ?Sized>(line: &L, name: &str) -> Option<GeoOptions> {
    let (base, search, store_allowed, searchstore) = match name {
        "georadius" => (6, false, true, false),
        "georadius_ro" => (6, false, false, false),
        "georadiusbymember" => (5, false, true, false),
        "georadiusbymember_ro" => (5, false, false, false),
        "geosearch" => (2, true, false, false),
        "geosearchstore" => (3, true, false, true),
        _ => return None,
    };
    let mut o = GeoOptions::default();
    let remaining = line.argc().saturating_sub(base);
    let mut i = 0;
    while i < remaining {
        let a = line.arg(base + i);
        let at = |n: usize| i + n < remaining;
        if ["WITHDIST", "WITHHASH", "WITHCOORD", "ANY", "ASC", "DESC"]
            .iter()
            .any(|k| keyword(a, k.as_bytes()))
        {
        } else if keyword(a, b"COUNT") && at(1) {
            int_at(line, base + i + 1).filter(|&c| c > 0)?;
            o.count = Some(base + i + 1);
            i += 1;
        } else if !search
            && store_allowed
            && (keyword(a, b"STORE") || keyword(a, b"STOREDIST"))
            && at(1)
        {
            o.store = Some(base + i + 1);
            i += 1;
        } else if search && searchstore && keyword(a, b"STOREDIST") {
        } else if search && keyword(a, b"FROMMEMBER") && at(1) {
            i += 1;
        } else if search && (keyword(a, b"FROMLONLAT") || keyword(a, b"BYRADIUS")) && at(2) {
            i += 2;
        } else if search && keyword(a, b"BYBOX") && at(3) {
            i += 3;
        } else {
            return None;
        }
        i += 1;
    }
    Some(o)
}

// ---------------------------------------------------------------------------------------------
// Streams: XREAD/XREADGROUP (`xreadCommand`), XADD (`streamParseAddOrTrimArgsOrReply`)
// ---------------------------------------------------------------------------------------------

/// XREAD and XREADGROUP as `xreadCommand` reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct XreadOptions {
    /// Index of the BLOCK value Redis applies (the last BLOCK before STREAMS).
    pub(crate) block: Option<usize>,
    /// Index of the first stream key (after the `STREAMS` that ends the options).
    pub(crate) streams: Option<usize>,
}

/// XREAD's (`group: false`) or XREADGROUP's options; `None` where Redis refuses them. A
/// group or consumer named `STREAMS` or `BLOCK` is read as the name it is.
pub(crate) fn xread_options<L: CommandLine + ?Sized>(
    line: &L,
    group: bool,
) -> Option<XreadOptions> {
    let mut o = XreadOptions::default();
    let mut i = 1;
    while i < line.argc() {
        let more = line.argc() - i - 1;
        let a = line.arg(i);
        if keyword(a, b"BLOCK") && more > 0 {
            o.block = Some(i + 1);
            i += 1;
        } else if keyword(a, b"COUNT") && more > 0 {
            i += 1;
        } else if keyword(a, b"STREAMS") && more > 0 {
            o.streams = Some(i + 1);
            break;
        } else if keyword(a, b"GROUP") && more >= 2 && group {
            i += 2;
        } else if keyword(a, b"NOACK") && group {
        } else {
            return None;
        }
        i += 1;
    }
    Some(o)
}

/// Whether XADD (options from argument 2) or XTRIM names a trim strategy (`MAXLEN`/`MINID`) as
/// Redis reads its options; `None` where Redis refuses them.
pub(crate) fn xadd_trims<L: CommandLine + ?Sized>(line: &L) -> Option<bool> {
    let mut trims = false;
    let mut i = 2;
    while i < line.argc() {
        let a = line.arg(i);
        let more = line.argc() - i - 1;
        if a.first() == Some(&b'*') && a.get(1).is_none_or(|&b| b == 0) {
            break; // the auto id: options end
        } else if (keyword(a, b"MAXLEN") || keyword(a, b"MINID")) && more > 0 {
            let next = line.arg(i + 1);
            if more >= 2
                && (next == b"~"
                    || next == b"="
                    || next.starts_with(b"~\0")
                    || next.starts_with(b"=\0"))
            {
                i += 1;
            }
            trims = true;
            i += 2;
        } else if keyword(a, b"LIMIT") && more > 0 {
            i += 2;
        } else if keyword(a, b"NOMKSTREAM") {
            i += 1;
        } else {
            break; // the entry id
        }
    }
    Some(trims)
}

// ---------------------------------------------------------------------------------------------
// BITFIELD (`bitfieldGeneric`), RESTORE, COPY, CLIENT TRACKING
// ---------------------------------------------------------------------------------------------

/// The bytes BITFIELD's SET and INCRBY operations reach, as Redis reads the operations: a
/// field of type `i<bits>`/`u<bits>` (the width read up to a NUL byte, as `strlen` sees it) at
/// bit offset `n`, or `#n` fields, ends at bit `offset + bits`. `None` when nothing is written
/// or Redis refuses the command.
pub(crate) fn bitfield_reach<L: CommandLine + ?Sized>(line: &L) -> Option<u64> {
    let mut reach = 0u64;
    let mut j = 2;
    while j < line.argc() {
        let op = line.arg(j);
        let rem = line.argc() - j - 1;
        let write = if keyword(op, b"GET") && rem >= 2 {
            false
        } else if (keyword(op, b"SET") || keyword(op, b"INCRBY")) && rem >= 3 {
            true
        } else if keyword(op, b"OVERFLOW") && rem >= 1 {
            j += 2;
            continue;
        } else {
            return None;
        };
        let bits = bitfield_bits(line.arg(j + 1))?;
        let offset = line.arg(j + 2);
        let offset = match offset.strip_prefix(b"#") {
            Some(n) => u64::try_from(crate::protocol::codec::parse_int(n)?)
                .ok()?
                .saturating_mul(bits),
            None => u64::try_from(crate::protocol::codec::parse_int(offset)?).ok()?,
        };
        if write {
            int_at(line, j + 3)?;
            reach = reach.max(offset.saturating_add(bits).div_ceil(8));
            j += 4;
        } else {
            j += 3;
        }
    }
    (reach > 0).then_some(reach)
}

/// A BITFIELD type's width (`getBitfieldTypeFromArgument`): `i` or `u` (lower case only), then
/// digits read as a C string (up to a NUL byte).
fn bitfield_bits(ty: &[u8]) -> Option<u64> {
    let (&sign, rest) = ty.split_first()?;
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let bits = u64::try_from(crate::protocol::codec::parse_int(&rest[..end])?).ok()?;
    let max = match sign {
        b'i' => 64,
        b'u' => 63,
        _ => return None,
    };
    (1..=max).contains(&bits).then_some(bits)
}

/// RESTORE's options from argument 4 (`restoreCommand`): the index of `ABSTTL` if given (the
/// TTL is then a Unix time in ms); `None` where Redis refuses them.
pub(crate) fn restore_absttl<L: CommandLine + ?Sized>(line: &L) -> Option<Option<usize>> {
    let mut abs = None;
    let (mut idle, mut freq) = (false, false);
    let mut j = 4;
    while j < line.argc() {
        let a = line.arg(j);
        let more = line.argc() - j - 1;
        if keyword(a, b"REPLACE") {
        } else if keyword(a, b"ABSTTL") {
            abs = Some(j);
        } else if keyword(a, b"IDLETIME") && more >= 1 && !freq {
            idle = true;
            j += 1;
        } else if keyword(a, b"FREQ") && more >= 1 && !idle {
            freq = true;
            j += 1;
        } else {
            return None;
        }
        j += 1;
    }
    Some(abs)
}

/// COPY's options from argument 3 (`copyCommand`): the index of the `DB` value Redis applies,
/// if any; `None` where Redis refuses them.
pub(crate) fn copy_db<L: CommandLine + ?Sized>(line: &L) -> Option<Option<usize>> {
    let mut db = None;
    let mut j = 3;
    while j < line.argc() {
        if keyword(line.arg(j), b"REPLACE") {
        } else if keyword(line.arg(j), b"DB") && j + 1 < line.argc() {
            db = Some(j + 1);
            j += 1;
        } else {
            return None;
        }
        j += 1;
    }
    Some(db)
}

/// CLIENT TRACKING's options from argument 3, as `clientCommand` reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TrackingOptions {
    /// Index of the REDIRECT client id (Redis refuses a second REDIRECT).
    pub(crate) redirect: Option<usize>,
    /// BCAST: invalidations for every key under the prefixes, not only keys the client read.
    pub(crate) bcast: bool,
    /// Indices of the PREFIX values.
    pub(crate) prefixes: Vec<usize>,
    /// OPTIN, OPTOUT or NOLOOP: modes that depend on which connection reads or writes, so
    /// tracking spread over several connections cannot keep them (cluster `tracking`).
    pub(crate) per_client_modes: bool,
    /// OPTIN or OPTOUT: `CLIENT CACHING` applies to the connection's next command, which in
    /// front of a cluster may go to another node's connection (cluster `tracking`).
    pub(crate) opt_in_out: bool,
    /// NOLOOP: the client's own writes invalidate nothing for it, which holds only while
    /// they go over the connection that tracks (cluster `tracking`).
    pub(crate) noloop: bool,
}

/// `CLIENT TRACKING ON|OFF [options]` from argument 3; `None` where Redis refuses them.
pub(crate) fn tracking_options<L: CommandLine + ?Sized>(line: &L) -> Option<TrackingOptions> {
    let mut o = TrackingOptions::default();
    let mut j = 3;
    while j < line.argc() {
        let a = line.arg(j);
        let more = j + 1 < line.argc();
        if keyword(a, b"REDIRECT") && more {
            if o.redirect.is_some() {
                return None;
            }
            o.redirect = Some(j + 1);
            j += 1;
        } else if keyword(a, b"BCAST") {
            o.bcast = true;
        } else if keyword(a, b"OPTIN") || keyword(a, b"OPTOUT") {
            o.per_client_modes = true;
            o.opt_in_out = true;
        } else if keyword(a, b"NOLOOP") {
            o.per_client_modes = true;
            o.noloop = true;
        } else if keyword(a, b"PREFIX") && more {
            o.prefixes.push(j + 1);
            j += 1;
        } else {
            return None;
        }
        j += 1;
    }
    Some(o)
}

/// `CLIENT TRACKING ON … BCAST` whose own prefixes overlap (one begins with another, as
/// `stringCheckPrefix` compares them), where Redis 7.0–8.x answer twice: the arguments' indices
/// of the pair Redis names, `(i, j)`, when the first prefix that overlaps a later one is not
/// the first given. tracking.c's `checkPrefixCollisionsOrReply` returns that prefix's position
/// as its "no collision" result, so after the error Redis enables the tracking and adds `+OK`
/// (Valkey returns 0). When it is the first prefix, Redis answers once: `None`.
pub(crate) fn tracking_prefixes_answered_twice<L: CommandLine + ?Sized>(
    line: &L,
) -> Option<(usize, usize)> {
    if line.argc() < 3 || !keyword(line.arg(2), b"ON") {
        return None;
    }
    let o = tracking_options(line).filter(|o| o.bcast && !o.opt_in_out)?;
    let overlap = |a: &[u8], b: &[u8]| {
        let n = a.len().min(b.len());
        a[..n] == b[..n]
    };
    let (i, j) = o.prefixes.iter().enumerate().find_map(|(n, &i)| {
        let later = o.prefixes[n + 1..].iter();
        later
            .copied()
            .find(|&j| overlap(line.arg(i), line.arg(j)))
            .map(|j| (i, j))
    })?;
    (i != o.prefixes[0]).then_some((i, j))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_options_run_in_order_up_to_a_bad_one() {
        let parse = |line: &str| {
            let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            hello_options(&crate::protocol::codec::encode(&args))
        };
        let named = |n: &str| Some(bytes::Bytes::copy_from_slice(n.as_bytes()));
        assert_eq!(parse("HELLO 3 AUTH u p SETNAME a").name, named("a"));
        let after = parse("HELLO 2 AUTH u p SETNAME fz extra");
        assert_eq!((after.name, after.bad_after_auth), (named("fz"), true));
        let before = parse("HELLO 2 bogus AUTH u p SETNAME fz");
        assert_eq!((before.name, before.bad_after_auth), (None, false));
        assert!(parse("HELLO 3 AUTH u p SETNAME").bad_after_auth);
        assert!(!parse("HELLO 3 SETNAME a extra").bad_after_auth);
    }

    fn line(s: &str) -> Vec<&[u8]> {
        s.split(' ').map(str::as_bytes).collect()
    }

    #[test]
    fn tracking_prefixes_redis_answers_twice() {
        let twice = |s: &str| tracking_prefixes_answered_twice(&line(s)[..]);
        assert_eq!(
            twice("CLIENT TRACKING ON PREFIX 1 PREFIX x PREFIX x BCAST"),
            Some((6, 8))
        );
        assert_eq!(
            twice("CLIENT TRACKING on\0 BCAST PREFIX c PREFIX ab PREFIX a"),
            Some((7, 9))
        );
        // The first prefix overlaps (Redis answers once), none overlap, not BCAST, OPTIN (an
        // earlier error), OFF, a syntax error: Redis's own single answer.
        assert_eq!(
            twice("CLIENT TRACKING ON BCAST PREFIX a PREFIX b PREFIX ab"),
            None
        );
        assert_eq!(
            twice("CLIENT TRACKING ON BCAST PREFIX a PREFIX b PREFIX c"),
            None
        );
        assert_eq!(twice("CLIENT TRACKING ON PREFIX c PREFIX a PREFIX a"), None);
        assert_eq!(
            twice("CLIENT TRACKING ON BCAST OPTIN PREFIX c PREFIX a PREFIX a"),
            None
        );
        assert_eq!(
            twice("CLIENT TRACKING OFF BCAST PREFIX c PREFIX a PREFIX a"),
            None
        );
        assert_eq!(
            twice("CLIENT TRACKING ON BCAST PREFIX c PREFIX a PREFIX a bogus"),
            None
        );
    }

    #[test]
    fn keywords_end_at_nul_as_in_strcasecmp() {
        assert!(keyword(b"count\0", b"COUNT"));
        assert!(keyword(b"COUNT\0junk", b"COUNT"));
        assert!(!keyword(b"COUNTX", b"COUNT"));
        assert!(!keyword(b"\0COUNT", b"COUNT"));
    }

    #[test]
    fn decoys_are_values_and_the_last_option_wins() {
        let l = line("SCAN 0 COUNT 5000 MATCH COUNT MATCH *");
        let o = scan_options(&l[..], 2).unwrap();
        assert_eq!((o.count, o.pattern), (Some(3), Some(7)));
        assert_eq!(
            scan_options(&line("SCAN 0 COUNT\0 5000")[..], 2)
                .unwrap()
                .count,
            Some(3)
        );
        assert_eq!(scan_options(&line("SCAN 0 COUNT")[..], 2), None);
        assert_eq!(scan_options(&line("SSCAN s 0 TYPE string")[..], 3), None);
    }

    #[test]
    fn compare_values_of_newer_servers_are_not_options() {
        // Valkey 8.1's `SET k v IFEQ EX`: `EX` is the value compared, no expiry is given.
        let o = string_options(&line("SET k v IFEQ EX")[..], false).unwrap();
        assert_eq!((o.expiry, o.compare), (None, true));
        assert!(expiry_values(&line("SET k v IFEQ EX")[..], false).is_empty());
        let o = string_options(&line("SET k v ifdeq\0 PX PX 100")[..], false).unwrap();
        assert_eq!(o.expiry.map(|e| e.at), Some(6));
        assert_eq!(
            expiry_values(&line("SET k v IFNE PX PX 100")[..], false),
            [6]
        );
        assert_eq!(string_options(&line("SET k v IFEQ")[..], false), None);
        assert_eq!(string_options(&line("SET k v NX IFEQ x")[..], false), None);
    }

    #[test]
    fn hash_field_expiry_options_end_at_fields() {
        let o = hash_expiry(&line("HSETEX h FNX EX 10 PX 20 FIELDS 1 f v")[..]).unwrap();
        assert_eq!(o.values, [4, 6]);
        assert_eq!(o.expiry.map(|e| (e.at, e.unit_ms)), Some((6, 1)));
        let o = hash_expiry(&line("HGETEX h PERSIST FIELDS 1 EX")[..]).unwrap();
        assert!(o.persist && o.expiry.is_none());
        assert_eq!(hash_expiry(&line("HSETEX h NOPE FIELDS 1 f v")[..]), None);
        assert_eq!(hash_expiry(&line("HSETEX h EX 10")[..]), None);
        let o = msetex_options(&line("MSETEX 2 a EX b PX NX EX 5")[..]).unwrap();
        assert_eq!(o.values, [8]);
        assert_eq!(
            msetex_options(&line("MSETEX 2 a EX b PX")[..]),
            Some(HashExpiry::default())
        );
        assert_eq!(msetex_options(&line("MSETEX 3 a EX b PX")[..]), None);
    }

    #[test]
    fn stream_reads_are_walked_like_xread() {
        let l = line("XREADGROUP GROUP STREAMS c1 BLOCK 0 STREAMS xs >");
        let o = xread_options(&l[..], true).unwrap();
        assert_eq!((o.block, o.streams), (Some(5), Some(7)));
        let o = xread_options(&line("XREAD BLOCK\0 0 STREAMS s 0")[..], false).unwrap();
        assert_eq!(o.block, Some(2));
        // XREAD has no GROUP: Redis refuses it.
        assert_eq!(
            xread_options(&line("XREAD GROUP g c STREAMS s 0")[..], false),
            None
        );
    }

    #[test]
    fn tracking_and_bitfield_read_nul_suffixed_words() {
        let l = line("CLIENT TRACKING on BCAST\0 REDIRECT\0 7 PREFIX\0 a");
        let o = tracking_options(&l[..]).unwrap();
        assert_eq!((o.bcast, o.redirect, o.prefixes), (true, Some(5), vec![7]));
        assert_eq!(
            tracking_options(&line("CLIENT TRACKING on REDIRECT 1 REDIRECT 2")[..]),
            None
        );
        assert_eq!(
            bitfield_reach(&line("BITFIELD k SET u8\0 8000000 1")[..]),
            Some(1_000_001)
        );
        assert_eq!(
            bitfield_reach(&line("BITFIELD k set i8 #10 1")[..]),
            Some(11)
        );
        assert_eq!(
            bitfield_reach(&line("BITFIELD k SET U8 0 1")[..]),
            None,
            "upper case is refused"
        );
    }

    #[test]
    fn xadd_caps_and_geo_stores() {
        assert_eq!(
            xadd_trims(&line("XADD s MAXLEN\0 ~ 10 * f v")[..]),
            Some(true)
        );
        assert_eq!(
            xadd_trims(&line("XADD s NOMKSTREAM * MAXLEN 1")[..]),
            Some(false)
        );
        let o = geo_options(
            &line("GEORADIUS g 1 2 3 km STORE a STOREDIST b")[..],
            "georadius",
        )
        .unwrap();
        assert_eq!(o.store, Some(9));
        assert_eq!(
            geo_options(&line("GEORADIUS_RO g 1 2 3 km STORE a")[..], "georadius_ro"),
            None
        );
    }
}
