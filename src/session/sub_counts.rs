//! A client's subscription counts for `CLIENT LIST` (`sub=`, `psub=`, `ssub=`), read from the
//! confirmations Redis sends for its SUBSCRIBE-family commands as they pass through. Each
//! confirmation carries a count after the change: for (P)SUBSCRIBE and (P)UNSUBSCRIBE the
//! client's channels plus patterns, for SSUBSCRIBE/SUNSUBSCRIBE its shard channels. Only one
//! kind changes per confirmation, so the other kind's count and the total give both, with no
//! set of names kept.

/// How many channels, patterns and shard channels a client is subscribed to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct SubCounts {
    /// SUBSCRIBE channels.
    pub(crate) sub: u64,
    /// PSUBSCRIBE patterns.
    pub(crate) psub: u64,
    /// SSUBSCRIBE shard channels.
    pub(crate) ssub: u64,
}

impl SubCounts {
    /// Applies every confirmation in `data` (a reply of one or more frames), those in an
    /// EXEC's reply (an array of its commands' replies) included; anything else in it (an
    /// error, a PONG) changes nothing.
    pub(super) fn confirmed(&mut self, data: &[u8]) {
        for frame in frames(data) {
            if !self.apply(frame) {
                // One level only: a confirmation is never nested deeper than EXEC's reply.
                frames(exec_elements(frame).unwrap_or_default()).for_each(|f| {
                    self.apply(f);
                });
            }
        }
    }

    /// Applies `frame` if it is a confirmation; says whether it was.
    fn apply(&mut self, frame: &[u8]) -> bool {
        let Some((kind, count)) = confirmation(frame) else {
            return false;
        };
        match kind {
            Kind::Channel => self.sub = count.saturating_sub(self.psub),
            Kind::Pattern => self.psub = count.saturating_sub(self.sub),
            Kind::Shard => self.ssub = count,
        }
        true
    }

    /// Whether the client is subscribed to anything.
    pub(super) fn any(&self) -> bool {
        self.sub + self.psub + self.ssub > 0
    }
}

/// Which count a confirmation is about.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// (UN)SUBSCRIBE.
    Channel,
    /// P(UN)SUBSCRIBE.
    Pattern,
    /// S(UN)SUBSCRIBE.
    Shard,
}

/// The kind and count of a confirmation frame (`*3`/`>3`: kind, channel or null, count).
fn confirmation(frame: &[u8]) -> Option<(Kind, u64)> {
    let rest = frame
        .strip_prefix(b"*3\r\n")
        .or_else(|| frame.strip_prefix(b">3\r\n"))?;
    let (name, rest) = bulk(rest)?;
    let kind = match name.to_ascii_lowercase().as_slice() {
        b"subscribe" | b"unsubscribe" => Kind::Channel,
        b"psubscribe" | b"punsubscribe" => Kind::Pattern,
        b"ssubscribe" | b"sunsubscribe" => Kind::Shard,
        _ => return None,
    };
    // The channel: a bulk, or a null when an UNSUBSCRIBE found nothing to remove.
    let rest = match rest.first()? {
        b'$' if rest.starts_with(b"$-1\r\n") => &rest[5..],
        b'$' => bulk(rest)?.1,
        b'_' => rest.strip_prefix(b"_\r\n")?,
        _ => return None,
    };
    let digits = rest.strip_prefix(b":")?.strip_suffix(b"\r\n")?;
    Some((kind, std::str::from_utf8(digits).ok()?.parse().ok()?))
}

/// The complete frames of `data`, in order.
fn frames(mut data: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let len = crate::protocol::reply::scan(data).ok()??;
        let (frame, rest) = data.split_at(len);
        data = rest;
        Some(frame)
    })
}

/// The elements of an array frame (an EXEC's reply): what follows its header.
fn exec_elements(frame: &[u8]) -> Option<&[u8]> {
    let rest = frame.strip_prefix(b"*")?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    if rest[..end].first() == Some(&b'-') {
        return None;
    }
    Some(&rest[end + 2..])
}

/// A bulk string at the start of `s` and what follows it.
fn bulk(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let s = s.strip_prefix(b"$")?;
    let end = s.windows(2).position(|w| w == b"\r\n")?;
    let len: usize = std::str::from_utf8(&s[..end]).ok()?.parse().ok()?;
    let body = s.get(end + 2..end + 2 + len)?;
    let rest = s.get(end + 4 + len..)?;
    Some((body, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_confirmations() {
        let mut c = SubCounts::default();
        c.confirmed(
            b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n",
        );
        assert_eq!((c.sub, c.psub, c.ssub), (2, 0, 0));
        c.confirmed(b">3\r\n$10\r\npsubscribe\r\n$2\r\nx*\r\n:3\r\n");
        assert_eq!((c.sub, c.psub), (2, 1));
        c.confirmed(b">3\r\n$10\r\nssubscribe\r\n$1\r\ns\r\n:1\r\n");
        assert_eq!(c.ssub, 1);
        c.confirmed(b"*3\r\n$11\r\nunsubscribe\r\n$1\r\na\r\n:2\r\n");
        assert_eq!((c.sub, c.psub), (1, 1));
        c.confirmed(b"*3\r\n$12\r\npunsubscribe\r\n$-1\r\n:1\r\n-ERR x\r\n");
        assert_eq!((c.sub, c.psub), (1, 0));
        c.confirmed(b">3\r\n$12\r\nsunsubscribe\r\n_\r\n:0\r\n");
        assert_eq!(c.ssub, 0);
        assert!(c.any());
    }

    #[test]
    fn confirmations_inside_exec_count() {
        let mut c = SubCounts::default();
        c.confirmed(
            b"*3\r\n:1\r\n*3\r\n$12\r\npunsubscribe\r\n$-1\r\n:0\r\n*3\r\n$9\r\nsubscribe\r\n$2\r\nc2\r\n:1\r\n",
        );
        assert_eq!((c.sub, c.psub), (1, 0));
        // A nested array is not looked into: only EXEC's own elements are replies.
        c.confirmed(b"*1\r\n*1\r\n*3\r\n$11\r\nunsubscribe\r\n$2\r\nc2\r\n:0\r\n");
        assert_eq!(c.sub, 1);
    }
}
