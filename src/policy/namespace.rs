//! Key-prefix namespacing: a namespaced tenant's keys live under its prefix, and it cannot
//! read, list, modify or subscribe to anything outside it.
//!
//! Fail closed: a command is allowed for a namespaced tenant only when the proxy can confine
//! it — every key position is known from the command table (key patterns of SORT included)
//! and its reply carries no key names — or when it touches no keyspace at all (the short list
//! in [`KEYLESS`]). SCAN and KEYS are confined by prefixing their pattern, and the prefix is
//! stripped from the key names in their replies ([`Strip`]; refused inside MULTI, where the
//! reply is part of EXEC's). Everything else is refused: RANDOMKEY,
//! blocking pops and XREAD (reply key names), scripts and functions (may touch any key),
//! pub/sub (channel names), MIGRATE, SELECT n, FLUSH*, DBSIZE, INFO, CLIENT LIST/KILL,
//! MONITOR, CONFIG, DEBUG and any command the table does not know.

use bytes::Bytes;

use super::line::CommandLine;
use super::rewrite::{Rewrite, Shape, Strip};
use crate::commands::{self, CommandSpec, grammar};
use crate::protocol::codec::encode;
use crate::protocol::codec::{self, CodecLimits, Decoded};

/// Commands that touch no key and reveal nothing of other tenants.
const KEYLESS: &[&str] = &[
    "ping",
    "echo",
    "time",
    "multi",
    "exec",
    "discard",
    "unwatch",
    "wait",
    "waitaof",
    "hello",
    "auth",
    "quit",
    "reset",
    "client|setname",
    "client|getname",
    "client|id",
    "client|info",
    "client|reply",
    "client|setinfo",
    "client|no-touch",
    "command",
    "command|count",
    "command|info",
    "command|docs",
    "command|list",
    "command|getkeys",
    "command|getkeysandflags",
    "lolwut",
    "readonly",
    "readwrite",
];

/// Keyed commands refused outright: MIGRATE moves keys to another server; SORT with BY/GET
/// patterns reads keys named by data.
const UNCONFINABLE: &[&str] = &["migrate", "sort", "sort_ro"];

/// Keyed commands whose reply starts with the name of the key they popped from.
const POPS: &[&str] = &[
    "blpop", "brpop", "bzpopmin", "bzpopmax", "blmpop", "lmpop", "zmpop", "bzmpop",
];

/// Why a command cannot be confined to the namespace.
pub(crate) fn refusal_reason(spec: &CommandSpec) -> String {
    format!(
        "{} cannot be confined to this client's key namespace",
        spec.name.to_ascii_uppercase().replace('|', " ")
    )
}

/// Applies the namespace `prefix` to a command (as the policy may already have rewritten it):
/// `Ok` with the rewrite to send, or `Err` when it must be refused.
pub(crate) fn apply<L: CommandLine + ?Sized>(
    prefix: &[u8],
    spec: Option<&'static CommandSpec>,
    line: &L,
    rewrite: Option<Rewrite>,
    script_allowed: &dyn Fn(&[u8]) -> bool,
) -> Result<Rewrite, String> {
    let Some(spec) = spec else {
        return Err("unknown commands cannot be confined to this client's key namespace".into());
    };
    if KEYLESS.contains(&spec.name) {
        return Ok(rewrite.unwrap_or_default());
    }
    if spec.name == "select" && line.argc() == 2 && line.arg(1) == b"0" {
        return Ok(rewrite.unwrap_or_default());
    }
    if spec.name == "scan" || spec.name == "keys" {
        return listing(prefix, spec, line).ok_or_else(|| refusal_reason(spec));
    }
    if UNCONFINABLE.contains(&spec.name) && !sort_without_patterns(spec, line) {
        return Err(refusal_reason(spec));
    }
    if spec.is_pubsub() {
        return pubsub(prefix, spec, line).ok_or_else(|| refusal_reason(spec));
    }
    if spec.name == "client|tracking" {
        return tracking(prefix, line).ok_or_else(|| refusal_reason(spec));
    }
    let strip_shape = if POPS.contains(&spec.name) {
        Some(Shape::FirstElement)
    } else if matches!(spec.name, "xread" | "xreadgroup") {
        Some(Shape::Streams)
    } else {
        None
    };
    if !spec.may_have_keys() || spec.is_pubsub() {
        return Err(refusal_reason(spec));
    }
    if allowed_script(spec, line, script_allowed) {
        let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
        // EVAL with no keys is allowed as is; with keys they get the prefix, and so do the
        // TTL rule's hidden commands for them.
        if commands::keys(&args).is_ok_and(|k| k.is_empty()) {
            return Ok(rewrite.unwrap_or_default());
        }
        return keyed(prefix, line, rewrite, None).ok_or_else(|| refusal_reason(spec));
    }
    if spec
        .acl_categories
        .contains(commands::AclCategories::SCRIPTING)
    {
        return Err(refusal_reason(spec));
    }
    keyed(prefix, line, rewrite, strip_shape).ok_or_else(|| refusal_reason(spec))
}

/// A keyed command (and the policy's hidden commands after it) with every key prefixed, and
/// the reply's key names stripped where `shape` says they come back; `None` when a key cannot
/// be found.
fn keyed<L: CommandLine + ?Sized>(
    prefix: &[u8],
    line: &L,
    rewrite: Option<Rewrite>,
    shape: Option<Shape>,
) -> Option<Rewrite> {
    let mut rw = rewrite.map(|rw| rw.materialize(line)).unwrap_or_default();
    let command = match rw.command.take() {
        Some(bytes) => prefixed_bytes(prefix, &bytes)?,
        None => {
            let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
            prefixed(prefix, &args)?
        }
    };
    rw.command = Some(command);
    if rw.note.is_empty() {
        rw.note = "keys prefixed with the tenant's namespace".into();
    }
    let prefix_all = |hidden: &[Bytes]| {
        hidden
            .iter()
            .map(|c| prefixed_bytes(prefix, c))
            .collect::<Option<Vec<_>>>()
    };
    rw.after = prefix_all(&rw.after)?;
    if let Some(before) = &mut rw.before {
        **before = prefix_all(before)?;
    }
    if let Some(shape) = shape {
        rw.strip = Some(Box::new(Strip {
            prefix: Bytes::copy_from_slice(prefix),
            shape,
        }));
    }
    Some(rw)
}

/// SCAN/KEYS confined to the prefix: the pattern (MATCH, or KEYS's argument) gets the
/// prefix, glob characters in the prefix escaped so they match literally.
fn listing<L: CommandLine + ?Sized>(
    prefix: &[u8],
    spec: &CommandSpec,
    line: &L,
) -> Option<Rewrite> {
    let escaped = escape_glob(prefix);
    let mut args: Vec<Vec<u8>> = (0..line.argc()).map(|i| line.arg(i).to_vec()).collect();
    let shape = if spec.name == "keys" {
        if args.len() != 2 {
            return None;
        }
        args[1] = [escaped.as_slice(), &args[1]].concat();
        Shape::Names
    } else {
        // The pattern Redis applies is the last MATCH as its parser walks the options
        // (`MATCH\0` is MATCH); every MATCH value gets the prefix, and a SCAN without one
        // gets `MATCH <prefix>*`, last, so it is the one applied. Options Redis refuses are
        // refused here too.
        let opts = grammar::scan_options(&args[..], 2)?;
        let mut i = 2;
        while i + 1 < args.len() {
            if grammar::keyword(&args[i], b"MATCH") {
                args[i + 1] = [escaped.as_slice(), &args[i + 1]].concat();
            }
            i += 2;
        }
        if opts.pattern.is_none() {
            args.push(b"MATCH".to_vec());
            args.push([escaped.as_slice(), b"*"].concat());
        }
        Shape::Scan
    };
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    Some(Rewrite {
        command: Some(encode(&refs)),
        append: None,
        before: None,
        after: Vec::new(),
        note: "pattern confined to the namespace".into(),
        strip: Some(Box::new(Strip {
            prefix: Bytes::copy_from_slice(prefix),
            shape,
        })),
    })
}

impl Strip {
    /// The reply with the prefix removed from every key name. A name without the prefix is
    /// dropped (it cannot belong to the tenant); a reply of another shape (an error) is
    /// returned as is.
    pub(crate) fn apply(&self, reply: &[u8]) -> Bytes {
        let rebuilt = match self.shape {
            Shape::FirstElement => self.first_element(reply),
            Shape::Streams => self.streams(reply),
            Shape::PubSub => Some(strip_pubsub(&self.prefix, &Bytes::copy_from_slice(reply))),
            Shape::ChannelCounts => strip_even_elements(&self.prefix, reply),
            Shape::Quoted => Some(unquote_prefix(&self.prefix, reply)),
            _ => None,
        };
        if let Some(r) = rebuilt {
            return r;
        }
        if matches!(
            self.shape,
            Shape::FirstElement
                | Shape::Streams
                | Shape::PubSub
                | Shape::ChannelCounts
                | Shape::Quoted
        ) {
            return Bytes::copy_from_slice(reply);
        }
        let (head, names) = match self.shape {
            Shape::Names => (0, reply),
            Shape::FirstElement
            | Shape::Streams
            | Shape::PubSub
            | Shape::ChannelCounts
            | Shape::Quoted => (0, reply),
            Shape::Scan => {
                // `*2`, then the cursor bulk string, then the names array.
                let Some(after_header) = reply.strip_prefix(b"*2\r\n") else {
                    return Bytes::copy_from_slice(reply);
                };
                let Ok(Some(cursor)) = crate::protocol::reply::scan(after_header) else {
                    return Bytes::copy_from_slice(reply);
                };
                (4 + cursor, &after_header[cursor..])
            }
        };
        let Some(stripped) = strip_names(&self.prefix, names) else {
            return Bytes::copy_from_slice(reply);
        };
        let mut out = Vec::with_capacity(reply.len());
        out.extend_from_slice(&reply[..head]);
        out.extend_from_slice(&stripped);
        Bytes::from(out)
    }
}

impl Strip {
    /// `*N`, a key name, the rest raw: the name without the prefix.
    fn first_element(&self, reply: &[u8]) -> Option<Bytes> {
        if reply.first() != Some(&b'*') {
            return None;
        }
        let cr = memchr::memchr(b'\r', reply)?;
        if codec::parse_int(&reply[1..cr])? < 1 {
            return None;
        }
        let (name, used) = bulk(&reply[cr + 2..])?;
        let name = name.strip_prefix(self.prefix.as_ref())?;
        let mut out = Vec::with_capacity(reply.len());
        out.extend_from_slice(&reply[..cr + 2]);
        push_bulk(&mut out, name);
        out.extend_from_slice(&reply[cr + 2 + used..]);
        Some(Bytes::from(out))
    }

    /// Every stream name of an XREAD reply without the prefix.
    fn streams(&self, reply: &[u8]) -> Option<Bytes> {
        let kind = *reply.first()?;
        if kind != b'*' && kind != b'%' {
            return None;
        }
        let cr = memchr::memchr(b'\r', reply)?;
        let n = codec::parse_int(&reply[1..cr])?;
        let mut out = Vec::with_capacity(reply.len());
        out.extend_from_slice(&reply[..cr + 2]);
        let mut pos = cr + 2;
        for _ in 0..n.max(0) {
            if kind == b'*' {
                // Each stream is `*2`, name, entries.
                if !reply.get(pos..)?.starts_with(b"*2\r\n") {
                    return None;
                }
                out.extend_from_slice(b"*2\r\n");
                pos += 4;
            }
            let (name, used) = bulk(&reply[pos..])?;
            push_bulk(&mut out, name.strip_prefix(self.prefix.as_ref())?);
            pos += used;
            let entries = crate::protocol::reply::scan(&reply[pos..]).ok()??;
            out.extend_from_slice(&reply[pos..pos + entries]);
            pos += entries;
        }
        (pos == reply.len()).then(|| Bytes::from(out))
    }
}

/// Pub/sub commands confined to the prefix: channels and patterns prefixed (patterns with the
/// prefix's glob characters escaped), names stripped from confirmations and listings.
fn pubsub<L: CommandLine + ?Sized>(prefix: &[u8], spec: &CommandSpec, line: &L) -> Option<Rewrite> {
    let escaped = escape_glob(prefix);
    let mut args: Vec<Vec<u8>> = (0..line.argc()).map(|i| line.arg(i).to_vec()).collect();
    let shape = match spec.name {
        "subscribe" | "ssubscribe" | "unsubscribe" | "sunsubscribe" => {
            for a in &mut args[1..] {
                *a = [prefix, a.as_slice()].concat();
            }
            Shape::PubSub
        }
        "psubscribe" | "punsubscribe" => {
            for a in &mut args[1..] {
                *a = [escaped.as_slice(), a.as_slice()].concat();
            }
            Shape::PubSub
        }
        "publish" | "spublish" if args.len() == 3 => {
            args[1] = [prefix, args[1].as_slice()].concat();
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            return Some(Rewrite {
                command: Some(encode(&refs)),
                ..Rewrite::default()
            });
        }
        "pubsub|channels" | "pubsub|shardchannels" => {
            let pattern = args.get(2).cloned().unwrap_or_else(|| b"*".to_vec());
            args.truncate(2);
            args.push([escaped.as_slice(), pattern.as_slice()].concat());
            Shape::Names
        }
        "pubsub|numsub" | "pubsub|shardnumsub" => {
            for a in &mut args[2..] {
                *a = [prefix, a.as_slice()].concat();
            }
            Shape::ChannelCounts
        }
        _ => return None,
    };
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    Some(Rewrite {
        command: Some(encode(&refs)),
        append: None,
        before: None,
        after: Vec::new(),
        note: "channels confined to the namespace".into(),
        strip: Some(Box::new(Strip {
            prefix: Bytes::copy_from_slice(prefix),
            shape,
        })),
    })
}

/// CLIENT TRACKING for a namespaced client: RESP3 invalidations on its own connection only
/// (REDIRECT would deliver them to a connection the proxy cannot tell apart), BCAST prefixes
/// confined to the namespace (BCAST without PREFIX would announce every tenant's keys), and
/// the prefix stripped from invalidated key names ([`strip_pubsub`]).
fn tracking<L: CommandLine + ?Sized>(prefix: &[u8], line: &L) -> Option<Rewrite> {
    // Options as Redis reads them: `REDIRECT\0` is REDIRECT, `BCAST\0` is BCAST.
    let opts = grammar::tracking_options(line)?;
    if opts.redirect.is_some() {
        return None;
    }
    let mut args: Vec<Vec<u8>> = (0..line.argc()).map(|i| line.arg(i).to_vec()).collect();
    for &at in &opts.prefixes {
        args[at] = [prefix, args[at].as_slice()].concat();
    }
    if opts.bcast && opts.prefixes.is_empty() {
        args.push(b"PREFIX".to_vec());
        args.push(prefix.to_vec());
    }
    let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    Some(Rewrite {
        command: Some(encode(&refs)),
        note: "tracking confined to the namespace".into(),
        // Redis's refusal of overlapping prefixes quotes them as sent (state fuzzer).
        strip: Some(Box::new(Strip {
            prefix: Bytes::copy_from_slice(prefix),
            shape: Shape::Quoted,
        })),
        ..Rewrite::default()
    })
}

/// An error reply with `'<prefix>` made `'` wherever it occurs: one that quotes the names the
/// proxy sent shows them as the client wrote them. Any other reply passes unchanged.
fn unquote_prefix(prefix: &[u8], reply: &[u8]) -> Bytes {
    if reply.first() != Some(&b'-') || prefix.is_empty() {
        return Bytes::copy_from_slice(reply);
    }
    let needle = [&b"'"[..], prefix].concat();
    let mut out = Vec::with_capacity(reply.len());
    let mut rest = reply;
    while let Some(i) = memchr::memmem::find(rest, &needle) {
        out.extend_from_slice(&rest[..=i]);
        rest = &rest[i + needle.len()..];
    }
    out.extend_from_slice(rest);
    Bytes::from(out)
}

/// `>2 invalidate [keys…]` without the prefix; keys outside it are dropped. A nil key list
/// (everything invalidated, after a flush) passes unchanged.
fn strip_invalidate(prefix: &[u8], frame: &[u8]) -> Option<Vec<u8>> {
    let cr = memchr::memchr(b'\r', frame)?;
    let mut pos = cr + 2;
    let kind_len = crate::protocol::reply::scan(&frame[pos..]).ok()??;
    pos += kind_len;
    let keys = &frame[pos..];
    // Only `[invalidate, keys]`: the key list must end the frame, or rebuilding it would drop
    // the elements after it and leave the client a frame shorter than its header.
    if !keys.starts_with(b"*") || crate::protocol::reply::scan(keys) != Ok(Some(keys.len())) {
        return None;
    }
    let stripped = strip_names(prefix, keys)?;
    let mut out = Vec::with_capacity(frame.len());
    out.extend_from_slice(&frame[..pos]);
    out.extend_from_slice(&stripped);
    Some(out)
}

fn escape_glob(prefix: &[u8]) -> Vec<u8> {
    let mut escaped = Vec::with_capacity(prefix.len() + 4);
    for &c in prefix {
        if matches!(c, b'*' | b'?' | b'[' | b']' | b'\\') {
            escaped.push(b'\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Every pub/sub frame in `data` (confirmations, messages) with the prefix removed from its
/// channel and pattern names. Other frames (a PING reply in subscribed mode) pass unchanged; a
/// message on a channel outside the prefix cannot belong to the client and is dropped.
pub(crate) fn strip_pubsub(prefix: &[u8], data: &Bytes) -> Bytes {
    let mut out = Vec::with_capacity(data.len());
    let mut pos = 0;
    while let Ok(Some(len)) = crate::protocol::reply::scan(&data[pos..]) {
        let frame = &data[pos..pos + len];
        pos += len;
        let names: &[usize] = match crate::protocol::reply::element(frame, 0) {
            Some(k) if k.eq_ignore_ascii_case(b"invalidate") => {
                match strip_invalidate(prefix, frame) {
                    Some(rebuilt) => out.extend_from_slice(&rebuilt),
                    None => out.extend_from_slice(frame),
                }
                continue;
            }
            Some(k) if k.eq_ignore_ascii_case(b"pmessage") => &[1, 2],
            Some(k)
                if [
                    &b"message"[..],
                    b"smessage",
                    b"subscribe",
                    b"unsubscribe",
                    b"psubscribe",
                    b"punsubscribe",
                    b"ssubscribe",
                    b"sunsubscribe",
                ]
                .iter()
                .any(|n| k.eq_ignore_ascii_case(n)) =>
            {
                &[1]
            }
            _ => {
                out.extend_from_slice(frame);
                continue;
            }
        };
        match strip_elements(prefix, frame, names) {
            Some(rebuilt) => out.extend_from_slice(&rebuilt),
            None => {
                let is_message = crate::protocol::reply::classify_pubsub(frame)
                    == crate::protocol::reply::PubSubFrame::Message;
                if !is_message {
                    out.extend_from_slice(frame);
                }
            }
        }
    }
    out.extend_from_slice(&data[pos..]);
    Bytes::from(out)
}

/// A flat array or push frame with the prefix removed from the bulk strings at `indices`;
/// `None` when one of them lacks the prefix. Nil names (an UNSUBSCRIBE with nothing to
/// unsubscribe) are kept.
fn strip_elements(prefix: &[u8], frame: &[u8], indices: &[usize]) -> Option<Vec<u8>> {
    let cr = memchr::memchr(b'\r', frame)?;
    let n = codec::parse_int(&frame[1..cr])?;
    let mut out = Vec::with_capacity(frame.len());
    out.extend_from_slice(&frame[..cr + 2]);
    let mut pos = cr + 2;
    for i in 0..n.max(0) as usize {
        let len = crate::protocol::reply::scan(&frame[pos..]).ok()??;
        let element = &frame[pos..pos + len];
        if indices.contains(&i) && element.starts_with(b"$") && !element.starts_with(b"$-1") {
            let (name, _) = bulk(element)?;
            push_bulk(&mut out, name.strip_prefix(prefix)?);
        } else {
            out.extend_from_slice(element);
        }
        pos += len;
    }
    Some(out)
}

/// `[name, count, name, count…]` with the prefix removed from every name.
fn strip_even_elements(prefix: &[u8], reply: &[u8]) -> Option<Bytes> {
    if reply.first() != Some(&b'*') {
        return None;
    }
    let cr = memchr::memchr(b'\r', reply)?;
    let n = codec::parse_int(&reply[1..cr])?.max(0) as usize;
    let even: Vec<usize> = (0..n).step_by(2).collect();
    strip_elements(prefix, reply, &even).map(Bytes::from)
}

/// A bulk string at the start of `buf`: its bytes and the length of the whole frame.
fn bulk(buf: &[u8]) -> Option<(&[u8], usize)> {
    if buf.first() != Some(&b'$') {
        return None;
    }
    let cr = memchr::memchr(b'\r', buf)?;
    let len = usize::try_from(codec::parse_int(&buf[1..cr])?).ok()?;
    Some((buf.get(cr + 2..cr + 2 + len)?, cr + 2 + len + 2))
}

fn push_bulk(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", s.len()).as_bytes());
    out.extend_from_slice(s);
    out.extend_from_slice(b"\r\n");
}

/// Re-encodes a flat array of bulk strings without `prefix`; `None` if it is not one.
fn strip_names(prefix: &[u8], array: &[u8]) -> Option<Vec<u8>> {
    if array.first() != Some(&b'*') {
        return None;
    }
    let cr = memchr::memchr(b'\r', array)?;
    let n = codec::parse_int(&array[1..cr])?;
    let mut pos = cr + 2;
    let mut kept: Vec<&[u8]> = Vec::with_capacity(n.max(0) as usize);
    for _ in 0..n.max(0) {
        if array.get(pos) != Some(&b'$') {
            return None;
        }
        let cr = pos + memchr::memchr(b'\r', &array[pos..])?;
        let len = usize::try_from(codec::parse_int(&array[pos + 1..cr])?).ok()?;
        let name = array.get(cr + 2..cr + 2 + len)?;
        if let Some(rest) = name.strip_prefix(prefix) {
            kept.push(rest);
        }
        pos = cr + 2 + len + 2;
    }
    let mut out = format!("*{}\r\n", kept.len()).into_bytes();
    for k in kept {
        out.extend_from_slice(format!("${}\r\n", k.len()).as_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(b"\r\n");
    }
    Some(out)
}

/// EVAL/EVALSHA (and the _RO forms) of a script on the operator's list.
fn allowed_script<L: CommandLine + ?Sized>(
    spec: &CommandSpec,
    line: &L,
    script_allowed: &dyn Fn(&[u8]) -> bool,
) -> bool {
    if line.argc() < 3 {
        return false;
    }
    match spec.name {
        "eval" | "eval_ro" => {
            let digest = sha1_smol::Sha1::from(line.arg(1)).digest().to_string();
            script_allowed(digest.as_bytes())
        }
        "evalsha" | "evalsha_ro" => script_allowed(line.arg(1)),
        _ => false,
    }
}

/// SORT/SORT_RO without BY/GET patterns and without STORE reply only values: allowed.
fn sort_without_patterns<L: CommandLine + ?Sized>(spec: &CommandSpec, line: &L) -> bool {
    if !matches!(spec.name, "sort" | "sort_ro") {
        return false;
    }
    // BY and GET as SORT's parser reads them (`GET\0` is GET); options Redis refuses are
    // refused here too.
    grammar::sort_options(line, spec.name == "sort_ro").is_some_and(|o| o.patterns == 0)
}

/// Re-encodes a command with every key argument prefixed; `None` when its keys cannot be
/// determined (the caller refuses it).
fn prefixed(prefix: &[u8], args: &[&[u8]]) -> Option<Bytes> {
    let keys = commands::keys(args).ok()?;
    if keys.is_empty() || keys.incomplete() {
        return None;
    }
    let owned: Vec<Vec<u8>> = args
        .iter()
        .enumerate()
        .map(|(i, a)| {
            if keys.indices().any(|k| k == i) {
                [prefix, a].concat()
            } else {
                a.to_vec()
            }
        })
        .collect();
    let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
    Some(encode(&refs))
}

/// [`prefixed`] for a command already encoded (one the policy rewrote or added).
fn prefixed_bytes(prefix: &[u8], bytes: &[u8]) -> Option<Bytes> {
    let mut ranges = Vec::new();
    match codec::decode(bytes, &CodecLimits::default(), &mut ranges) {
        Ok(Some(Decoded::Command { .. })) => {}
        _ => return None,
    }
    let args: Vec<&[u8]> = ranges.iter().map(|r| &bytes[r.clone()]).collect();
    prefixed(prefix, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_quoting_tracking_prefixes_loses_the_namespace() {
        let strip = Strip {
            prefix: Bytes::from_static(b"t1:"),
            shape: Shape::Quoted,
        };
        let e = b"-ERR Prefix 't1:k' overlaps with an existing prefix 't1:k'. Prefixes for a single client must not overlap.\r\n";
        assert_eq!(
            &strip.apply(e)[..],
            &b"-ERR Prefix 'k' overlaps with an existing prefix 'k'. Prefixes for a single client must not overlap.\r\n"[..]
        );
        // Only errors, and only the prefix right after a quote.
        assert_eq!(&strip.apply(b"+OK\r\n")[..], b"+OK\r\n");
        assert_eq!(
            &strip.apply(b"-ERR t1:k 't2:k'\r\n")[..],
            b"-ERR t1:k 't2:k'\r\n"
        );
        assert!(!strip.names_data());
    }

    fn run(line: &str) -> Result<String, String> {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let spec = commands::lookup_args(&args);
        apply(b"t1:", spec, &args[..], None, &|_| false).map(|rw| {
            rw.command
                .map(|c| String::from_utf8_lossy(&c).replace("\r\n", " "))
                .unwrap_or_default()
        })
    }

    #[test]
    fn replies_lose_the_prefix_and_foreign_names() {
        let strip = Strip {
            prefix: Bytes::from_static(b"t1:"),
            shape: Shape::Scan,
        };
        let reply = b"*2\r\n$2\r\n17\r\n*3\r\n$4\r\nt1:a\r\n$3\r\nb:x\r\n$5\r\nt1:bc\r\n";
        assert_eq!(
            &strip.apply(reply)[..],
            b"*2\r\n$2\r\n17\r\n*2\r\n$1\r\na\r\n$2\r\nbc\r\n"
        );
        let keys = Strip {
            prefix: Bytes::from_static(b"t1:"),
            shape: Shape::Names,
        };
        assert_eq!(
            &keys.apply(b"*1\r\n$4\r\nt1:k\r\n")[..],
            b"*1\r\n$1\r\nk\r\n"
        );
        assert_eq!(&keys.apply(b"-ERR x\r\n")[..], b"-ERR x\r\n");
    }

    #[test]
    fn pops_and_stream_reads_lose_the_prefix() {
        let first = Strip {
            prefix: Bytes::from_static(b"t1:"),
            shape: Shape::FirstElement,
        };
        assert_eq!(
            &first.apply(b"*2\r\n$4\r\nt1:q\r\n$1\r\nv\r\n")[..],
            b"*2\r\n$1\r\nq\r\n$1\r\nv\r\n"
        );
        assert_eq!(&first.apply(b"*-1\r\n")[..], b"*-1\r\n");
        let streams = Strip {
            prefix: Bytes::from_static(b"t1:"),
            shape: Shape::Streams,
        };
        let entries = b"*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n";
        let resp2 = [&b"*1\r\n*2\r\n$4\r\nt1:s\r\n"[..], entries].concat();
        let want2 = [&b"*1\r\n*2\r\n$1\r\ns\r\n"[..], entries].concat();
        assert_eq!(&streams.apply(&resp2)[..], &want2[..]);
        let resp3 = [&b"%1\r\n$4\r\nt1:s\r\n"[..], entries].concat();
        let want3 = [&b"%1\r\n$1\r\ns\r\n"[..], entries].concat();
        assert_eq!(&streams.apply(&resp3)[..], &want3[..]);
    }

    #[test]
    fn invalidations_with_extra_elements_pass_unchanged() {
        // Found by fuzz/reply_rewrite: the rebuilt frame lost the element after the key list
        // (`_` here) but kept the header `>3`, so the client's stream was desynchronized.
        let frame = b">3\r\n$10\r\ninvalidate\r\n*1\r\n$4\r\nt1:k\r\n_\r\n";
        let out = strip_pubsub(b"t1:", &Bytes::from_static(frame));
        assert_eq!(&out[..], &frame[..]);
        let usual = b">2\r\n$10\r\ninvalidate\r\n*2\r\n$4\r\nt1:k\r\n$3\r\nx:y\r\n";
        let out = strip_pubsub(b"t1:", &Bytes::from_static(usual));
        assert_eq!(&out[..], b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n");
    }

    #[test]
    fn keys_are_prefixed_and_the_rest_is_refused() {
        assert_eq!(run("GET k").unwrap(), "*2 $3 GET $4 t1:k ");
        assert_eq!(
            run("MSET a 1 b 2").unwrap(),
            "*5 $4 MSET $4 t1:a $1 1 $4 t1:b $1 2 "
        );
        assert_eq!(run("PING").unwrap(), "");
        assert!(run("ZUNIONSTORE d 2 a b").unwrap().contains("t1:d"));
        assert_eq!(
            run("SCAN 0 COUNT 10").unwrap(),
            "*6 $4 SCAN $1 0 $5 COUNT $2 10 $5 MATCH $4 t1:* "
        );
        assert_eq!(run("KEYS u*").unwrap(), "*2 $4 KEYS $5 t1:u* ");
        for refused in [
            "RANDOMKEY",
            "DBSIZE",
            "FLUSHDB",
            "FLUSHALL",
            "EVAL x 1 k",
            "FCALL f 1 k",
            "SELECT 1",
            "MIGRATE h 1 k 0 1",
            "SORT k BY w*",
            "CLIENT LIST",
            "INFO",
            "NOPE",
            "CONFIG GET x",
            "MONITOR",
            "SWAPDB 0 1",
            "SCRIPT LOAD x",
            "OBJECT HELP",
        ] {
            assert!(run(refused).is_err(), "{refused} must be refused");
        }
        assert!(run("SORT k LIMIT 0 10").unwrap().contains("t1:k"));
        assert!(run("SELECT 0").is_ok());
    }
}
