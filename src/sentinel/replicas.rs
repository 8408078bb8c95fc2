//! The replicas of a Sentinel-managed primary, for `upstream.sentinel.read_from: replica`:
//! which ones the sentinels consider usable now. Asked with `SENTINEL REPLICAS`, again after
//! every primary change and every [`REFRESH`], and published as a sorted address list that
//! `upstream::replicas` turns into pools. Like the rest of this module, no pool knowledge.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Primary, SentinelSpec, call, connect, join_host_port, text};
use crate::ratelimit::redis::Frame;

/// How often the replica list is asked again when no failover prompts it: a replica that
/// went down, came back or finished its sync is noticed within this (the same period as
/// the primary's re-check).
pub const REFRESH: Duration = Duration::from_secs(2);

/// Sentinel flags that make a replica unusable: down for one or a quorum of sentinels, or
/// not connected to the sentinel at all.
const BAD_FLAGS: [&str; 3] = ["s_down", "o_down", "disconnected"];

/// The usable replicas one sentinel lists, as sorted `host:port`; `primary` (the address
/// published now) is left out: a replica promoted a moment ago may still be listed.
async fn ask(
    sentinel: &str,
    spec: &SentinelSpec,
    primary: Option<&str>,
) -> Result<Vec<Arc<str>>, String> {
    let mut s = connect(sentinel, spec.timeout).await?;
    let reply = call(
        &mut s,
        &[b"SENTINEL", b"REPLICAS", spec.master_name.as_bytes()],
        spec.timeout,
    )
    .await?;
    let entries = match reply {
        Frame::Array(entries) => entries,
        Frame::Error(e) => return Err(e),
        _ => return Err("unexpected reply".into()),
    };
    let mut out: Vec<Arc<str>> = entries
        .iter()
        .filter_map(usable)
        .filter(|addr| Some(addr.as_str()) != primary)
        .map(Arc::from)
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// The address of one `SENTINEL REPLICAS` entry (a flat field/value array) when the
/// sentinel considers it healthy and in sync: no bad flag, and a replication link that is
/// `ok` (a replica still loading its first sync answers reads with stale or no data).
fn usable(entry: &Frame) -> Option<String> {
    let Frame::Array(fields) = entry else {
        return None;
    };
    let field = |name: &str| {
        fields
            .chunks_exact(2)
            .find(|kv| text(&kv[0]).as_deref() == Some(name))
            .and_then(|kv| text(&kv[1]))
    };
    let flags = field("flags").unwrap_or_default();
    if flags.split(',').any(|f| BAD_FLAGS.contains(&f)) {
        return None;
    }
    if field("master-link-status").as_deref() != Some("ok") {
        return None;
    }
    Some(join_host_port(&field("ip")?, &field("port")?))
}

/// Publishes the usable replicas on `tx` until every receiver is gone: asked of the first
/// sentinel that answers, again whenever `primary` changes (a failover reshapes the set:
/// the promoted replica leaves it, the old primary joins it once resynced) and every
/// [`REFRESH`]. When no sentinel answers, the last list stands: the pools' own connection
/// flags already keep reads off replicas that are down.
pub async fn follow_replicas(
    spec: SentinelSpec,
    mut primary: watch::Receiver<Option<Primary>>,
    tx: watch::Sender<Vec<Arc<str>>>,
) {
    while !tx.is_closed() {
        let current = primary.borrow_and_update().as_ref().map(|p| p.addr.clone());
        let mut tried = Vec::new();
        for sentinel in &spec.sentinels {
            match ask(sentinel, &spec, current.as_deref()).await {
                Ok(list) => {
                    tx.send_if_modified(|cur| {
                        if *cur == list {
                            return false;
                        }
                        tracing::info!(master = %spec.master_name, replicas = ?list, "sentinel: replicas changed");
                        *cur = list;
                        true
                    });
                    tried.clear();
                    break;
                }
                Err(e) => tried.push(format!("{sentinel}: {e}")),
            }
        }
        if !tried.is_empty() {
            tracing::warn!(master = %spec.master_name, tried = %tried.join("; "), "sentinel: replicas not listed");
        }
        tokio::select! {
            _ = tokio::time::sleep(REFRESH) => {}
            changed = primary.changed() => if changed.is_err() {
                return;
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn entry(fields: &[(&str, &str)]) -> Frame {
        Frame::Array(
            fields
                .iter()
                .flat_map(|(k, v)| {
                    [
                        Frame::String(Bytes::copy_from_slice(k.as_bytes())),
                        Frame::String(Bytes::copy_from_slice(v.as_bytes())),
                    ]
                })
                .collect(),
        )
    }

    #[test]
    fn only_healthy_synced_replicas_are_usable() {
        let ok = [
            ("name", "127.0.0.1:7001"),
            ("ip", "127.0.0.1"),
            ("port", "7001"),
            ("flags", "slave"),
            ("master-link-status", "ok"),
        ];
        assert_eq!(usable(&entry(&ok)).as_deref(), Some("127.0.0.1:7001"));
        for (field, value) in [
            ("flags", "s_down,slave"),
            ("flags", "slave,o_down"),
            ("flags", "slave,disconnected"),
            ("master-link-status", "err"),
        ] {
            let mut fields = ok.to_vec();
            fields.iter_mut().find(|kv| kv.0 == field).unwrap().1 = value;
            assert_eq!(usable(&entry(&fields)), None, "{field}: {value}");
        }
        let v6 = [
            ("ip", "::1"),
            ("port", "7002"),
            ("flags", "slave"),
            ("master-link-status", "ok"),
        ];
        assert_eq!(usable(&entry(&v6)).as_deref(), Some("[::1]:7002"));
        assert_eq!(usable(&Frame::Nil), None);
    }
}
