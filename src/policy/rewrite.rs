//! A command as the proxy forwards it after the policy's rewrites (TTL added or cut, key
//! namespace prefixed), and how its reply is cleaned on the way back ([`Strip`]). Its own
//! module because every rewriting phase (`ttl`, `namespace`, the stream cap) makes one and
//! the session carries it to the upstream; the phases do not depend on each other.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

use super::line::CommandLine;
use crate::protocol::codec::{encode, itoa_buf, parse_int, put_bulk, put_len};

/// A command as the proxy will forward it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rewrite {
    /// Replacement for the client's command; `None` forwards it as sent.
    pub(crate) command: Option<Bytes>,
    /// Arguments added at the end of the command as sent (`PX <ttl>` on SET): the session
    /// patches the frame's header and appends them while copying it into the upstream batch,
    /// so the commonest rewrite costs neither an allocation nor an encoding. Never set
    /// together with `command` (see [`Rewrite::materialize`]).
    pub(crate) append: Option<Appended>,
    /// Commands sent right before it, whose replies the client never sees (the TTL rule's
    /// check of what existed, `keys: created`); read through [`Rewrite::before`]. Rare, so
    /// boxed: a rewrite is held by every pending command and the session's future.
    #[allow(
        clippy::box_collection,
        reason = "one pointer instead of a Vec's three words in every rewrite (see above)"
    )]
    pub(crate) before: Option<Box<Vec<Bytes>>>,
    /// Commands sent right after it, whose replies the client never sees.
    pub(crate) after: Vec<Bytes>,
    /// What was done, for audit logs and `--explain` (static on the hot SET path).
    pub(crate) note: Cow<'static, str>,
    /// The reply names keys under a namespace prefix the client must not see.
    pub(crate) strip: Option<Box<Strip>>,
}

/// An option and its integer value to append to a command (`PX <ttl>`), kept as values and
/// encoded while the frame is copied: 24 bytes, held across the session's awaits, so no
/// pre-encoded buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Appended {
    /// The option's name, e.g. `PX`.
    pub(crate) option: &'static str,
    /// Its argument.
    pub(crate) value: u64,
}

impl Appended {
    /// Writes the multibulk `frame` with the option appended to `out`; `false` (nothing
    /// written) when `frame` does not start with a `*<argc>\r\n` header, which the decoder
    /// never lets through.
    pub(crate) fn extend_frame(&self, frame: &[u8], out: &mut BytesMut) -> bool {
        let Some(end) = frame.iter().position(|&b| b == b'\r') else {
            return false;
        };
        let Some(argc) = frame
            .strip_prefix(b"*")
            .and_then(|f| parse_int(&f[..end - 1]))
            .filter(|&n| n >= 0)
        else {
            return false;
        };
        let value = itoa_buf(self.value);
        let value = value.as_bytes();
        let option = self.option.as_bytes();
        out.reserve(frame.len() + option.len() + value.len() + 16);
        put_len(out, b'*', argc as usize + 2);
        // The frame after its header: the arguments.
        out.extend_from_slice(frame.get(end + 2..).unwrap_or_default());
        put_bulk(out, option);
        put_bulk(out, value);
        true
    }
}

impl Rewrite {
    /// The hidden commands sent before the command.
    pub(crate) fn before(&self) -> &[Bytes] {
        self.before.as_deref().map_or(&[], Vec::as_slice)
    }

    /// Adds hidden commands to send before the command.
    pub(crate) fn add_before(&mut self, commands: Vec<Bytes>) {
        if commands.is_empty() {
            return;
        }
        match &mut self.before {
            Some(b) => b.extend(commands),
            None => self.before = Some(Box::new(commands)),
        }
    }

    /// The same rewrite with `append` folded into `command`, for the paths that need the whole
    /// command as bytes (namespacing, `--explain`): `line` is the command as the client sent it.
    pub(crate) fn materialize<L: CommandLine + ?Sized>(mut self, line: &L) -> Rewrite {
        if let Some(extra) = self.append.take() {
            let base = match self.command.take() {
                Some(c) => c,
                None => {
                    let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
                    encode(&args)
                }
            };
            let mut out = BytesMut::new();
            if extra.extend_frame(&base, &mut out) {
                self.command = Some(out.freeze());
            } else {
                self.command = Some(base);
            }
        }
        self
    }
}

/// How a reply naming keys is cleaned of the namespace prefix (applied by
/// `policy::namespace`, which makes them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Strip {
    /// The prefix to remove.
    pub(crate) prefix: Bytes,
    /// Where the key names are in the reply.
    pub(crate) shape: Shape,
}

impl Strip {
    /// Whether the names are the reply's data (not only quoted in an error): inside MULTI,
    /// EXEC's array would carry them with the prefix, so such a command is refused there.
    pub(crate) fn names_data(&self) -> bool {
        self.shape != Shape::Quoted
    }
}

/// Reply shapes that carry key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// KEYS, PUBSUB CHANNELS: an array of names.
    Names,
    /// SCAN: `[cursor, [names…]]`.
    Scan,
    /// BLPOP, BZPOPMIN, LMPOP…: an array whose first element is the key (or nil).
    FirstElement,
    /// XREAD/XREADGROUP: streams by name, `[[name, entries]…]` (RESP2) or `{name: entries}`
    /// (RESP3), or nil.
    Streams,
    /// (Un)subscribe confirmations and messages: channel and pattern names.
    PubSub,
    /// PUBSUB NUMSUB/SHARDNUMSUB: `[channel, count, …]`.
    ChannelCounts,
    /// CLIENT TRACKING: an error that quotes the prefixes as sent (`Prefix 'a:k' overlaps
    /// …`).
    Quoted,
}
