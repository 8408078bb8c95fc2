//! `ROLE` on the node a sentinel named, to confirm it is a primary now (a partitioned
//! sentinel may be stale). Hand-written, unlike the sentinel side: it must ask the node with
//! no credentials and read `-NOAUTH` as an answer, and fred cannot do that. A fred client
//! opens every connection with `PING` (or `AUTH`/`HELLO` when given a password), then
//! `CLIENT ID` and `INFO`, before any command of ours (fred 10.1 `Connection::setup`); on a
//! password-protected primary that `PING` fails with `NOAUTH` and the connection is
//! refused, so `ROLE` is never sent. The primary's password is the pool's to use, and the
//! pool checks it anyway when it connects. One plain connection per check, with the same
//! timeout as a sentinel's.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::protocol::codec::encode;
use crate::upstream::read_reply;

/// Largest `ROLE` reply read: a primary lists each replica in it, a few dozen bytes each.
const MAX_REPLY: usize = 1024 * 1024;

/// What a `ROLE` reply says about the node.
#[derive(Debug, PartialEq, Eq)]
enum Role {
    /// `*3 master …`: a primary now.
    Master,
    /// `-NOAUTH …`: password-protected, so the role cannot be read without the pool's
    /// credentials; the sentinel's answer is accepted.
    Unknown,
    /// A replica, a sentinel, or any other reply.
    Other,
}

/// Reads the role off the reply's raw bytes: only its first element matters, so no reply
/// type is needed. `ROLE` is asked without `HELLO`, so the reply is RESP2: an array whose
/// first element is the bulk string `master`, `slave` or `sentinel`.
fn role(reply: &[u8]) -> Role {
    if reply.starts_with(b"-NOAUTH") {
        return Role::Unknown;
    }
    let Some(rest) = reply.strip_prefix(b"*") else {
        return Role::Other;
    };
    let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
        return Role::Other;
    };
    let first = &rest[end + 2..];
    if first.starts_with(b"$6\r\nmaster\r\n") || first.starts_with(b"+master\r\n") {
        Role::Master
    } else {
        Role::Other
    }
}

/// Checks with `ROLE` that `addr` is a primary now; the error names the node.
pub(super) async fn confirm_primary(addr: &str, timeout: Duration) -> Result<(), String> {
    let reply = ask_role(addr, timeout)
        .await
        .map_err(|e| format!("primary {addr}: {e}"))?;
    match role(&reply) {
        Role::Master | Role::Unknown => Ok(()),
        Role::Other => Err(format!("{addr} is not a primary (stale sentinel)")),
    }
}

/// One `ROLE` round trip on a fresh connection, each step bounded by `timeout`.
async fn ask_role(addr: &str, timeout: Duration) -> Result<BytesMut, String> {
    let mut node = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect failed: {e}"))?;
    tokio::time::timeout(timeout, node.write_all(&encode(&[b"ROLE"])))
        .await
        .map_err(|_| "write timed out".to_string())?
        .map_err(|e| format!("write failed: {e}"))?;
    tokio::time::timeout(
        timeout,
        read_reply(&mut node, &mut BytesMut::new(), MAX_REPLY),
    )
    .await
    .map_err(|_| "no reply in time".to_string())?
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_element_of_role_decides() {
        assert_eq!(role(b"*3\r\n$6\r\nmaster\r\n:42\r\n*0\r\n"), Role::Master);
        assert_eq!(
            role(b"*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:6379\r\n$9\r\nconnected\r\n:1\r\n"),
            Role::Other
        );
        assert_eq!(role(b"*2\r\n$8\r\nsentinel\r\n*0\r\n"), Role::Other);
        assert_eq!(role(b"-NOAUTH Authentication required.\r\n"), Role::Unknown);
        assert_eq!(role(b"-ERR unknown command\r\n"), Role::Other);
        assert_eq!(role(b"$6\r\nmaster\r\n"), Role::Other, "not an array");
    }
}
