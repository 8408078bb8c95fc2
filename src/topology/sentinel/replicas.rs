//! The replicas of a Sentinel-managed primary, for `upstream.sentinel.read_from: replica`:
//! which ones the sentinels consider usable now. Asked with `SENTINEL REPLICAS`, again after
//! every primary change and every [`REFRESH`], and published as a sorted address list that
//! `upstream::replicas` turns into pools. Like the rest of this module, no pool knowledge.
//! The question goes through fred (`node`); the entries come back as fred `Value`s.

use std::sync::Arc;
use std::time::Duration;

use fred::types::Value;
use tokio::sync::watch;

use super::node::{Node, join_host_port, text};
use super::{Primary, SentinelSpec};

/// How often the replica list is asked again when no failover prompts it: a replica that
/// went down, came back or finished its sync is noticed within this (the same period as
/// the primary's re-check).
pub(crate) const REFRESH: Duration = Duration::from_secs(2);

/// Sentinel flags that make a replica unusable: down for one or a quorum of sentinels, or
/// not connected to the sentinel at all.
const BAD_FLAGS: [&str; 3] = ["s_down", "o_down", "disconnected"];

/// The usable replicas one sentinel lists, as sorted `host:port`; `primary` (the address
/// published now) is left out: a replica promoted a moment ago may still be listed.
async fn ask(node: &Node, master: &str, primary: Option<&str>) -> Result<Vec<Arc<str>>, String> {
    let entries = node.replicas(master).await?;
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
fn usable(entry: &Value) -> Option<String> {
    let Value::Array(fields) = entry else {
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
pub(crate) async fn follow_replicas(
    spec: SentinelSpec,
    mut primary: watch::Receiver<Option<Primary>>,
    tx: watch::Sender<Vec<Arc<str>>>,
) {
    let sentinels = Node::for_questions(&spec);
    while !tx.is_closed() {
        let current = primary.borrow_and_update().as_ref().map(|p| p.addr.clone());
        let mut tried = Vec::new();
        for (sentinel, node) in spec.sentinels.iter().zip(&sentinels) {
            let answer = match node {
                Ok(node) => ask(node, &spec.master_name, current.as_deref()).await,
                Err(e) => Err(e.clone()),
            };
            match answer {
                Ok(list) => {
                    publish(&tx, &spec.master_name, list);
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

/// Publishes the replica list when it changed, saying so in the log.
fn publish(tx: &watch::Sender<Vec<Arc<str>>>, master: &str, list: Vec<Arc<str>>) {
    tx.send_if_modified(|cur| {
        if *cur == list {
            return false;
        }
        tracing::info!(master = %master, replicas = ?list, "sentinel: replicas changed");
        *cur = list;
        true
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fields: &[(&str, &str)]) -> Value {
        Value::Array(
            fields
                .iter()
                .flat_map(|(k, v)| [Value::from(*k), Value::from(*v)])
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
        assert_eq!(usable(&Value::Null), None);
    }
}
