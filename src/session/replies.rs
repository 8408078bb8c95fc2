//! Shaping upstream replies for the client: hidden replies removed, EXEC's array filtered,
//! CLIENT INFO and HELLO made about the client.

use bytes::{Bytes, BytesMut};

use super::Session;
use crate::protocol::codec;

/// Removes the results of hidden commands from EXEC's array; any other reply (nil after a
/// WATCH conflict, EXECABORT) is returned as is.
pub(super) fn filter_exec(data: Bytes, keep: &[bool]) -> Bytes {
    if data.first() != Some(&b'*') {
        return data;
    }
    let Some(cr) = memchr::memchr(b'\r', &data) else {
        return data;
    };
    if codec::parse_int(&data[1..cr]) != Some(keep.len() as i64) {
        return data;
    }
    let mut out = BytesMut::with_capacity(data.len());
    let kept = keep.iter().filter(|&&k| k).count();
    out.extend_from_slice(format!("*{kept}\r\n").as_bytes());
    let mut pos = cr + 2;
    for &k in keep {
        let Ok(Some(len)) = crate::protocol::reply::scan(&data[pos..]) else {
            return data;
        };
        if k {
            out.extend_from_slice(&data[pos..pos + len]);
        }
        pos += len;
    }
    out.freeze()
}

/// Keeps the reply frames `mask` marks visible. `received` frames arrived (fewer than the
/// mask's length when the upstream failed); returns the client's replies and how many of the
/// client's own commands got none.
pub(super) fn apply_mask(data: Bytes, received: u32, mask: &[bool]) -> (Bytes, u32) {
    let mut out = BytesMut::with_capacity(data.len());
    let mut pos = 0;
    for &keep in mask.iter().take(received as usize) {
        let Ok(Some(len)) = crate::protocol::reply::scan(&data[pos..]) else {
            break;
        };
        if keep {
            out.extend_from_slice(&data[pos..pos + len]);
        }
        pos += len;
    }
    let missing = mask.iter().skip(received as usize).filter(|&&k| k).count() as u32;
    (out.freeze(), missing)
}

impl Session {
    /// Makes a CLIENT INFO reply (about the upstream connection) describe this client: its id,
    /// name, addresses and protocol. Other fields (age, buffers…) stay the upstream
    /// connection's.
    pub(super) fn rewrite_client_info(&self, data: Bytes) -> Bytes {
        let Some((verbatim, body)) = text_of(&data) else {
            return data;
        };
        let body = body.strip_suffix(b"\n").unwrap_or(body);
        let mut fields: Vec<u8> = Vec::with_capacity(body.len() + 32);
        for (i, field) in body.split(|&c| c == b' ').enumerate() {
            if i > 0 {
                fields.push(b' ');
            }
            match field.split(|&c| c == b'=').next().unwrap_or(b"") {
                b"id" => fields.extend_from_slice(format!("id={}", self.client.id).as_bytes()),
                b"addr" => {
                    fields.extend_from_slice(format!("addr={}", self.client.peer).as_bytes())
                }
                // The session does not keep it: its row in the client list has it.
                b"laddr" => match self.ctx.client_list.laddr(self.client.id) {
                    Some(laddr) => fields.extend_from_slice(format!("laddr={laddr}").as_bytes()),
                    None => fields.extend_from_slice(field),
                },
                b"resp" => {
                    fields.extend_from_slice(format!("resp={}", self.client.proto).as_bytes())
                }
                b"name" => {
                    fields.extend_from_slice(b"name=");
                    fields.extend_from_slice(self.client.names.name().map_or(&b""[..], |n| &n[..]));
                }
                b"lib-name" => {
                    fields.extend_from_slice(b"lib-name=");
                    fields.extend_from_slice(self.client.names.lib().0);
                }
                b"lib-ver" => {
                    fields.extend_from_slice(b"lib-ver=");
                    fields.extend_from_slice(self.client.names.lib().1);
                }
                // Valkey 8+: the shared connection's traffic, which is every client's; the
                // proxy does not count these per client.
                name @ (b"tot-cmds" | b"tot-net-in" | b"tot-net-out") => {
                    fields.extend_from_slice(name);
                    fields.extend_from_slice(b"=0");
                }
                _ => fields.extend_from_slice(field),
            }
        }
        fields.push(b'\n');
        text_reply(verbatim, &fields)
    }
}

/// The text of a bulk (`$`) or verbatim (`=`, RESP3) string reply, and which it was.
pub(super) fn text_of(data: &[u8]) -> Option<(bool, &[u8])> {
    let verbatim = match data.first() {
        Some(b'$') => false,
        Some(b'=') => true,
        _ => return None,
    };
    let nl = memchr::memchr(b'\n', data)?;
    let text = data.get(nl + 1..data.len().checked_sub(2)?)?;
    Some((verbatim, if verbatim { text.get(4..)? } else { text }))
}

/// `text` as a reply of the same kind `text_of` found.
pub(super) fn text_reply(verbatim: bool, text: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(text.len() + 24);
    if verbatim {
        out.extend_from_slice(format!("={}\r\ntxt:", text.len() + 4).as_bytes());
    } else {
        out.extend_from_slice(format!("${}\r\n", text.len()).as_bytes());
    }
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

/// An INFO reply as a client of the proxy sees it: `connected_clients` counts `clients`, the
/// proxy's clients that CLIENT LIST shows and CLIENT KILL can name (Redis's own count is of
/// the proxy's upstream connections, which no client can tell apart: the proxy's section
/// gives it as `proxy_upstream_connected_clients`), and `section` is appended after Redis's
/// sections (separated by a blank line, as Redis separates its own); anything but a text
/// reply is returned as is.
pub(crate) fn info_as_seen(data: Bytes, section: Option<&str>, clients: usize) -> Bytes {
    let Some((verbatim, body)) = text_of(&data) else {
        return data;
    };
    let mut text = Vec::with_capacity(body.len() + section.map_or(0, str::len) + 48);
    const FIELD: &[u8] = b"connected_clients:";
    let mut upstream: &[u8] = b"";
    match memchr::memmem::find(body, FIELD)
        .filter(|&at| at == 0 || body[at - 1] == b'\n')
        .map(|at| at + FIELD.len())
    {
        Some(value) => {
            let end = value
                + body[value..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
            upstream = &body[value..end];
            text.extend_from_slice(&body[..value]);
            text.extend_from_slice(clients.to_string().as_bytes());
            text.extend_from_slice(&body[end..]);
        }
        None => text.extend_from_slice(body),
    }
    let Some(section) = section else {
        return text_reply(verbatim, &text);
    };
    if !text.is_empty() && !text.ends_with(b"\r\n\r\n") {
        if !text.ends_with(b"\r\n") {
            text.extend_from_slice(b"\r\n");
        }
        text.extend_from_slice(b"\r\n");
    }
    text.extend_from_slice(section.as_bytes());
    if !upstream.is_empty() {
        text.extend_from_slice(b"proxy_upstream_connected_clients:");
        text.extend_from_slice(upstream);
        text.extend_from_slice(b"\r\n");
    }
    text_reply(verbatim, &text)
}

/// The upstream's HELLO reply with its `id` value replaced by this client's id, so HELLO and
/// CLIENT ID agree. The reply is a flat map/array of known shape; if `id` is not found the
/// reply is returned as is.
pub(super) fn with_client_id(hello: &Bytes, id: u64) -> Bytes {
    const KEY: &[u8] = b"$2\r\nid\r\n:";
    let Some(at) = memchr::memmem::find(hello, KEY) else {
        return hello.clone();
    };
    let start = at + KEY.len();
    let Some(len) = memchr::memchr(b'\r', &hello[start..]) else {
        return hello.clone();
    };
    let mut out = Vec::with_capacity(hello.len() + 20);
    out.extend_from_slice(&hello[..start]);
    out.extend_from_slice(id.to_string().as_bytes());
    out.extend_from_slice(&hello[start + len..]);
    Bytes::from(out)
}

/// A `CLIENT GETREDIR` (`:<id>`) or `CLIENT TRACKINGINFO` (`redirect` field) reply with the
/// redirect connection's upstream id replaced by its client's proxy id (`client`); ids it does
/// not know (0, -1, a connection that is gone) are left as Redis gave them.
pub(super) fn map_redirect(data: Bytes, client: impl Fn(u64) -> Option<u64>) -> Bytes {
    const FIELD: &[u8] = b"$8\r\nredirect\r\n:";
    let at = if data.starts_with(b":") {
        1
    } else {
        match memchr::memmem::find(&data, FIELD) {
            Some(i) => i + FIELD.len(),
            None => return data,
        }
    };
    let digits = data[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    let Some(proxy) = std::str::from_utf8(&data[at..at + digits])
        .ok()
        .and_then(|d| d.parse::<u64>().ok())
        .filter(|&id| id > 0)
        .and_then(client)
    else {
        return data;
    };
    let mut out = Vec::with_capacity(data.len() + 8);
    out.extend_from_slice(&data[..at]);
    out.extend_from_slice(proxy.to_string().as_bytes());
    out.extend_from_slice(&data[at + digits..]);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::codec::{CodecLimits, Decoded};
    use crate::session::reply_queue::WAIT_BARRIER;

    #[test]
    fn info_counts_the_proxys_clients_and_gains_its_section() {
        let info =
            "# Clients\r\nconnected_clients:11\r\ncluster_connections:0\r\nmaxclients:10000\r\n";
        let bulk = Bytes::from(format!("${}\r\n{info}\r\n", info.len()));
        let seen = info_as_seen(bulk, Some("# Proxy\r\nproxy_version:1\r\n"), 3);
        let (verbatim, text) = text_of(&seen).unwrap();
        assert!(!verbatim);
        assert_eq!(
            std::str::from_utf8(text).unwrap(),
            "# Clients\r\nconnected_clients:3\r\ncluster_connections:0\r\nmaxclients:10000\r\n\r\n# Proxy\r\nproxy_version:1\r\nproxy_upstream_connected_clients:11\r\n"
        );
        // RESP3's verbatim string keeps its kind; a section without the field is kept whole.
        let memory = "# Memory\r\nused_memory:1\r\n";
        let verbatim = Bytes::from(format!("={}\r\ntxt:{memory}\r\n", memory.len() + 4));
        let seen = info_as_seen(verbatim, Some("# Proxy\r\n"), 3);
        let (verbatim, text) = text_of(&seen).unwrap();
        assert!(verbatim);
        assert!(text.starts_with(memory.as_bytes()));
        // INFO clients: the count alone.
        let bulk = Bytes::from(format!("${}\r\n{info}\r\n", info.len()));
        let seen = info_as_seen(bulk, None, 0);
        let text = std::str::from_utf8(text_of(&seen).unwrap().1).unwrap();
        assert_eq!(text, info.replace(":11", ":0"));
        // An error is returned as is.
        let error = Bytes::from_static(b"-ERR x\r\n");
        assert_eq!(info_as_seen(error.clone(), Some("# Proxy\r\n"), 3), error);
    }

    #[test]
    fn wait_barrier_is_one_well_formed_command() {
        let mut args = Vec::new();
        let decoded = codec::decode(WAIT_BARRIER, &CodecLimits::default(), &mut args);
        assert_eq!(
            decoded,
            Ok(Some(Decoded::Command {
                len: WAIT_BARRIER.len()
            }))
        );
        assert_eq!(
            &WAIT_BARRIER[args[1].clone()],
            b"__redis-policy-proxy__:wait"
        );
    }

    #[test]
    fn masked_replies_are_stripped() {
        let data = Bytes::from_static(b":1\r\n+OK\r\n$1\r\nx\r\n");
        assert_eq!(
            apply_mask(data.clone(), 3, &[false, true, true]),
            (Bytes::from_static(b"+OK\r\n$1\r\nx\r\n"), 0)
        );
        assert_eq!(
            apply_mask(data.slice(..9), 2, &[true, false]),
            (Bytes::from_static(b":1\r\n"), 0)
        );
        // The upstream failed after the hidden reply: the client's own reply is missing.
        assert_eq!(
            apply_mask(data.slice(..4), 1, &[false, true]),
            (Bytes::new(), 1)
        );
    }

    #[test]
    fn exec_reply_loses_hidden_results_only() {
        let exec = Bytes::from_static(b"*3\r\n:1\r\n:1\r\n+OK\r\n");
        assert_eq!(
            &filter_exec(exec.clone(), &[true, false, true])[..],
            b"*2\r\n:1\r\n+OK\r\n"
        );
        // Nil after a WATCH conflict, or a length that does not match: untouched.
        let nil = Bytes::from_static(b"*-1\r\n");
        assert_eq!(filter_exec(nil.clone(), &[true, false]), nil);
        assert_eq!(filter_exec(exec.clone(), &[true, false]), exec);
    }

    #[test]
    fn hello_reply_carries_the_client_id() {
        let hello = Bytes::from_static(b"%2\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:17\r\n");
        assert_eq!(
            &with_client_id(&hello, 4242)[..],
            b"%2\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:4242\r\n"
        );
    }
}
