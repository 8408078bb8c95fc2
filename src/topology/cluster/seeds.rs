//! Learning the slot map from the seed nodes: each asked in turn (`CLUSTER SHARDS`, then
//! `CLUSTER SLOTS` where the server lacks it), bounded in time and reply size.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::error::ClusterError;
use super::slot::SLOTS;
use super::topology::SlotMap;
use crate::protocol::resp_value::DecodeError;
use crate::upstream::handshake::{self, NodeSpec, UpstreamStream};
use crate::upstream::own_lines::{self, Says};
use crate::upstream::{ReadReplyError, read_reply};

/// Largest topology reply accepted. `CLUSTER SHARDS` costs a few hundred bytes per node, so
/// this allows clusters far larger than Redis supports while bounding what a broken node can
/// make the proxy buffer.
const MAX_REPLY: usize = 16 * 1024 * 1024;

/// Learns the cluster's slot map from the first seed that gives a complete one.
///
/// Seeds are tried in order, each with `node`'s login, TLS setup and timeout (its `addr` is
/// ignored); each attempt, connect plus query, is bounded by twice the connect timeout, so a
/// dead or hung seed costs at most that before the next one is tried. A seed whose map leaves
/// slots unowned (a shard down with no replica to take over, or a node that has not caught
/// up) does not stop the search, but the best such map is returned when no seed has a
/// complete one: the slots it covers can still be served.
pub async fn discover(seeds: &[String], node: &NodeSpec) -> Result<SlotMap, ClusterError> {
    if seeds.is_empty() {
        return Err(ClusterError::NoSeeds);
    }
    let mut best: Option<SlotMap> = None;
    let mut failures = Vec::new();
    for seed in seeds {
        let spec = NodeSpec {
            addr: seed.as_str().into(),
            ..node.clone()
        };
        match query_topology(&spec).await {
            Ok(map) if map.is_complete() => return Ok(map),
            Ok(map) => {
                failures.push(format!("{seed}: covers {} of {SLOTS} slots", map.covered()));
                if map.covered() > best.as_ref().map_or(0, SlotMap::covered) {
                    best = Some(map);
                }
            }
            Err(e) => failures.push(format!("{seed}: {e}")),
        }
    }
    best.ok_or_else(|| ClusterError::NoTopology(failures.join("; ")))
}

/// Connects to one node and asks it for the topology.
async fn query_topology(spec: &NodeSpec) -> Result<SlotMap, ClusterError> {
    // RESP2 on purpose: it is what every server since Redis 3 speaks, and the parsers take
    // both shapes anyway.
    let attempt = async {
        let (stream, _) = handshake::connect(spec, Some(2)).await?;
        // The query's lines are the proxy's own, not a client's (`own_lines`).
        let _own = own_lines::speaking(stream.peer_addr(), stream.local_addr(), Says::Everything);
        match stream {
            UpstreamStream::Tcp(mut tcp) => ask(&mut tcp, spec).await,
            UpstreamStream::Tls(mut tls) => ask(&mut *tls, spec).await,
        }
    };
    let bound = spec.connect_timeout.saturating_mul(2);
    tokio::time::timeout(bound, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(ClusterError::Io {
                addr: spec.addr.clone(),
                reason: format!("no topology within {} ms", bound.as_millis()),
            })
        })
}

/// `CLUSTER SHARDS`, or `CLUSTER SLOTS` when the node is older than Redis 7.
async fn ask<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    spec: &NodeSpec,
) -> Result<SlotMap, ClusterError> {
    let tls = spec.tls.is_some();
    let reply = request(stream, spec, &[b"CLUSTER", b"SHARDS"]).await?;
    match SlotMap::from_cluster_shards(&reply, &spec.addr, tls) {
        Err(ClusterError::Refused(message)) if unknown_command(&message) => {
            let reply = request(stream, spec, &[b"CLUSTER", b"SLOTS"]).await?;
            SlotMap::from_cluster_slots(&reply, &spec.addr)
        }
        other => other,
    }
}

/// Whether an error means "this server does not have that command": Redis 7 says
/// `unknown subcommand 'SHARDS'`, Redis 6 `Unknown subcommand or wrong number of arguments`,
/// and a proxy or a managed service may say `unknown command`.
fn unknown_command(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("unknown subcommand") || m.contains("unknown command")
}

/// Sends one command and reads its one reply.
async fn request<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    spec: &NodeSpec,
    args: &[&[u8]],
) -> Result<BytesMut, ClusterError> {
    let io = |reason: String| ClusterError::Io {
        addr: spec.addr.clone(),
        reason,
    };
    stream
        .write_all(&crate::protocol::codec::encode(args))
        .await
        .map_err(|e| io(format!("write failed: {e}")))?;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    read_reply(stream, &mut buf, MAX_REPLY)
        .await
        .map_err(|e| match e {
            ReadReplyError::Malformed(e) => DecodeError::from(e).into(),
            other => io(format!("topology reply: {other}")),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;
    use tokio::time::Instant;

    const SLOTS_CAPTURE: &[u8] = include_bytes!("testdata/slots-resp2.resp");

    /// Login settings with a short connect bound, as a test's seeds are local.
    fn login(connect_timeout: Duration) -> NodeSpec {
        NodeSpec {
            addr: "unused".into(),
            username: None,
            password: None,
            connect_timeout,
            tls: None,
            readonly: false,
            db: 0,
        }
    }

    /// A fake node on a free port: answers HELLO, and `CLUSTER SHARDS`/`CLUSTER SLOTS` with
    /// the given replies (`None`: never answer). Returns its address.
    async fn fake_node(shards: Option<&'static [u8]>, slots: Option<&'static [u8]>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 1024];
                        match conn.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        let has = |word: &[u8]| buf.windows(word.len()).any(|w| w == word);
                        let reply = if has(b"HELLO") {
                            Some(&b"%0\r\n"[..])
                        } else if has(b"SHARDS") {
                            shards
                        } else if has(b"SLOTS") {
                            slots
                        } else {
                            continue;
                        };
                        buf.clear();
                        match reply {
                            Some(r) => {
                                if conn.write_all(r).await.is_err() {
                                    return;
                                }
                            }
                            // Hold the connection open and silent.
                            None => std::future::pending::<()>().await,
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn falls_back_to_cluster_slots_on_older_servers() {
        let old = fake_node(
            Some(b"-ERR Unknown subcommand or wrong number of arguments for 'SHARDS'. Try CLUSTER HELP.\r\n"),
            Some(SLOTS_CAPTURE),
        )
        .await;
        let map = discover(&[old], &login(Duration::from_secs(2)))
            .await
            .unwrap();
        assert!(map.is_complete());
        assert_eq!(&*map.slot_owner(0).unwrap().primary.addr, "127.0.0.1:30001");
    }

    #[tokio::test]
    async fn other_refusals_do_not_fall_back() {
        let denied = fake_node(
            Some(b"-NOPERM this user has no permissions to run the 'cluster|shards' command\r\n"),
            Some(SLOTS_CAPTURE),
        )
        .await;
        let err = discover(
            std::slice::from_ref(&denied),
            &login(Duration::from_secs(2)),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains(&denied) && err.contains("NOPERM"), "{err}");
    }

    #[tokio::test]
    async fn a_silent_seed_costs_a_bounded_wait() {
        // Accepts and completes the handshake, then never answers the topology query.
        let silent = fake_node(None, None).await;
        let answering = fake_node(
            Some(b"-ERR unknown subcommand 'SHARDS'. Try CLUSTER HELP.\r\n"),
            Some(SLOTS_CAPTURE),
        )
        .await;
        let started = Instant::now();
        let map = discover(
            &[silent.clone(), answering],
            &login(Duration::from_millis(200)),
        )
        .await
        .unwrap();
        assert!(map.is_complete());
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(400) && took < Duration::from_secs(2),
            "{took:?}"
        );
        let err = discover(
            std::slice::from_ref(&silent),
            &login(Duration::from_millis(200)),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("no topology within 400 ms"), "{err}");
    }

    #[tokio::test]
    async fn best_partial_map_when_no_seed_is_complete() {
        const PARTIAL: &[u8] = b"*1\r\n*3\r\n:0\r\n:99\r\n*2\r\n$9\r\n127.0.0.1\r\n:7000\r\n";
        let disabled = fake_node(
            Some(b"-ERR This instance has cluster support disabled\r\n"),
            None,
        )
        .await;
        let partial = fake_node(Some(b"-ERR unknown command 'CLUSTER'\r\n"), Some(PARTIAL)).await;
        let spec = login(Duration::from_secs(2));
        let map = discover(&[disabled.clone(), partial], &spec).await.unwrap();
        assert_eq!(map.covered(), 100);
        let err = discover(std::slice::from_ref(&disabled), &spec)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("cluster support disabled"),
            "{err}"
        );
        assert!(matches!(
            discover(&[], &spec).await,
            Err(ClusterError::NoSeeds)
        ));
    }

    #[test]
    fn unknown_command_errors_of_each_version() {
        assert!(unknown_command(
            "ERR unknown subcommand 'SHARDS'. Try CLUSTER HELP."
        ));
        assert!(unknown_command(
            "ERR Unknown subcommand or wrong number of arguments for 'SHARDS'. Try CLUSTER HELP."
        ));
        assert!(unknown_command(
            "ERR unknown command 'CLUSTER', with args beginning with: 'SHARDS' "
        ));
        assert!(!unknown_command(
            "ERR This instance has cluster support disabled"
        ));
        assert!(!unknown_command(
            "NOPERM this user has no permissions to run the 'cluster|shards' command"
        ));
    }
}
