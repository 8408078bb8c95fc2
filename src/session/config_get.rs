//! CONFIG GET never hands a client the upstream's credentials: the pairs of secret
//! parameters (`requirepass`, `masterauth`…) are removed from the reply, so `CONFIG GET *`
//! still works for tools and shows everything else byte for byte. Inside MULTI the reply
//! would come back inside EXEC's, so CONFIG GET is refused there.
//!
//! The reply's names are what is filtered, not the patterns asked for: whatever pattern
//! matched (`*`, `*pass*`, `REQUIREPASS`), a secret's pair never reaches the client.

use bytes::{Bytes, BytesMut};

use crate::commands::grammar::keyword;

/// Parameters whose value is a credential, in Redis 7/8 and Valkey (which adds the
/// `primary*` names). `masteruser` is an identity rather than a secret, but names the
/// account `masterauth` logs in to: hidden with it.
const SECRETS: &[&[u8]] = &[
    b"requirepass",
    b"masterauth",
    b"masteruser",
    b"primaryauth",
    b"primaryuser",
    b"tls-key-file-pass",
    b"tls-client-key-file-pass",
];

/// Whether `name`, as a CONFIG GET reply names it, is a secret parameter.
pub(super) fn is_secret(name: &[u8]) -> bool {
    SECRETS.iter().any(|s| name.eq_ignore_ascii_case(s))
}

/// Whether the command whose first arguments are `command` and `sub` is CONFIG GET (as Redis
/// reads the words: case-insensitively, up to a NUL).
pub(super) fn is_config_get(command: &[u8], sub: &[u8]) -> bool {
    command.len() >= 6 && keyword(command, b"CONFIG") && keyword(sub, b"GET")
}

/// The CONFIG GET reply `data` without the secret parameters' pairs: a RESP2 flat array
/// (`*<2n>` of name, value) or a RESP3 map (`%<n>`). Anything else (an error) is returned as
/// it is, as is a reply with nothing secret in it (no copy).
pub(super) fn without_secrets(data: Bytes) -> Bytes {
    let (map, count) = match header(&data) {
        Some(h) => h,
        None => return data,
    };
    let Some(cr) = memchr::memchr(b'\r', &data) else {
        return data;
    };
    let pairs = if map { count } else { count / 2 };
    let mut kept: Vec<(usize, usize)> = Vec::with_capacity(pairs);
    let mut pos = cr + 2;
    let mut dropped = false;
    for _ in 0..pairs {
        let start = pos;
        let Some(name) = element(&data, &mut pos) else {
            return refuse_unreadable();
        };
        if element(&data, &mut pos).is_none() {
            return refuse_unreadable();
        }
        if name.is_some_and(is_secret) {
            dropped = true;
        } else {
            kept.push((start, pos));
        }
    }
    if !dropped {
        return data;
    }
    let mut out = BytesMut::with_capacity(data.len());
    let n = if map { kept.len() } else { kept.len() * 2 };
    out.extend_from_slice(format!("{}{n}\r\n", if map { '%' } else { '*' }).as_bytes());
    for (start, end) in kept {
        out.extend_from_slice(&data[start..end]);
    }
    out.freeze()
}

/// An aggregate header: whether it is a map, and its count.
fn header(data: &[u8]) -> Option<(bool, usize)> {
    let map = match data.first()? {
        b'*' => false,
        b'%' => true,
        _ => return None,
    };
    let cr = memchr::memchr(b'\r', data)?;
    let count = crate::protocol::codec::parse_int(&data[1..cr]).filter(|&n| n >= 0)? as usize;
    Some((map, count))
}

/// The element at `pos` (advancing past it): `Some(Some(name))` for a string (bulk,
/// simple or verbatim), `Some(None)` for anything else; `None` when it cannot be read.
fn element<'a>(data: &'a [u8], pos: &mut usize) -> Option<Option<&'a [u8]>> {
    let rest = data.get(*pos..)?;
    let len = crate::protocol::reply::scan(rest).ok()??;
    let frame = &rest[..len];
    *pos += len;
    let text = match frame.first()? {
        b'$' | b'=' => {
            let cr = memchr::memchr(b'\r', frame)?;
            let body = frame.get(cr + 2..len - 2)?;
            // A verbatim string starts with its 3-letter format and a colon.
            Some(if frame[0] == b'=' {
                body.get(4..)?
            } else {
                body
            })
        }
        b'+' => Some(&frame[1..len - 2]),
        _ => None,
    };
    Some(text)
}

/// A CONFIG GET reply the proxy cannot read: it might hold a secret, so the client gets an
/// error instead.
fn refuse_unreadable() -> Bytes {
    crate::protocol::answers::config_get_unreadable()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filtered(reply: &[u8]) -> Vec<u8> {
        without_secrets(Bytes::copy_from_slice(reply)).to_vec()
    }

    #[test]
    fn secret_pairs_leave_resp2_and_resp3_replies() {
        let resp2 = b"*6\r\n$10\r\nmasterauth\r\n$2\r\nm1\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n$11\r\nrequirepass\r\n$6\r\nsecret\r\n";
        assert_eq!(
            filtered(resp2),
            b"*2\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n".to_vec()
        );
        let resp3 = b"%2\r\n$11\r\nREQUIREPASS\r\n$6\r\nsecret\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n";
        assert_eq!(
            filtered(resp3),
            b"%1\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n".to_vec()
        );
        assert_eq!(
            filtered(b"*2\r\n$11\r\nrequirepass\r\n$0\r\n\r\n"),
            b"*0\r\n".to_vec()
        );
    }

    #[test]
    fn other_replies_pass_untouched() {
        for reply in [
            &b"*2\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n"[..],
            b"*0\r\n",
            b"-ERR unknown subcommand\r\n",
        ] {
            assert_eq!(filtered(reply), reply.to_vec());
        }
        // Cut short: cannot be read, so it is not forwarded.
        assert!(filtered(b"*2\r\n$11\r\nrequirepass\r\n").starts_with(b"-"));
    }

    #[test]
    fn config_get_is_recognised_as_redis_reads_it() {
        assert!(is_config_get(b"config", b"get"));
        assert!(is_config_get(b"CONFIG", b"Get\0x"));
        assert!(!is_config_get(b"CONFIG", b"SET"));
        assert!(!is_config_get(b"GET", b"x"));
    }
}
