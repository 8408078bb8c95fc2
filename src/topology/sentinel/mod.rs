//! Sentinel-managed upstreams: which node is the primary now, and when that changes.
//!
//! Follows Redis's guidelines for Sentinel clients: ask the sentinels in turn for the primary's
//! address (`SENTINEL GET-MASTER-ADDR-BY-NAME`), confirm with `ROLE` on that address that it
//! really is a primary (a sentinel may be partitioned away and stale), and learn about
//! failovers from the `+switch-master` channel of any reachable sentinel rather than by
//! polling. [`follow_primary`] publishes each new address with an epoch (a count of
//! changes) on a `watch` channel of `upstream::address::AddrEpoch`; `upstream::address` is
//! the pool's side of it (connections follow the address, dedicated ones close when it
//! moves), and `server` starts both in `upstream.mode: sentinel`. This module has no pool
//! knowledge, and the pool none of this module.
//!
//! The sentinels are spoken to through fred ([`node`]: its `SentinelClient`, pub/sub and
//! reconnection); the `ROLE` check on the named node stays hand-written ([`role`] says why).
//! [`replicas`] lists the primary's usable replicas for `read_from: replica`.

mod node;
pub(crate) mod replicas;
mod role;
mod spec;

use std::time::Duration;

use tokio::sync::watch;

pub use crate::upstream::address::AddrEpoch as Primary;
use node::{MasterAddr, Node, Switch, Switches, join_host_port};
use role::confirm_primary;
pub use spec::SentinelSpec;

/// Why the primary could not be found.
#[derive(Debug, thiserror::Error)]
pub enum SentinelError {
    /// No sentinel gave a usable answer; each one's failure is listed.
    #[error("no sentinel knows a reachable primary for `{master}`: {}", .tried.join("; "))]
    NoPrimary { master: String, tried: Vec<String> },
}

/// The configured sentinels' clients, in the configured order; an entry that is not
/// `host:port` stays an error, reported at each attempt like an unreachable sentinel.
type Sentinels = Vec<Result<Node, String>>;

/// Asks one sentinel for the primary's address, then confirms it with `ROLE`.
async fn ask(node: &Node, spec: &SentinelSpec) -> Result<String, String> {
    let addr = match node.master_addr(&spec.master_name).await? {
        MasterAddr::Named(addr) => addr,
        MasterAddr::Unknown => return Err(format!("does not monitor `{}`", spec.master_name)),
    };
    confirm_primary(&addr, spec.timeout).await?;
    Ok(addr)
}

/// The current primary's address, from the first of `sentinels` with a confirmed answer.
async fn resolve(sentinels: &Sentinels, spec: &SentinelSpec) -> Result<String, SentinelError> {
    let mut tried = Vec::new();
    for (configured, node) in spec.sentinels.iter().zip(sentinels) {
        let answer = match node {
            Ok(node) => ask(node, spec).await,
            Err(e) => Err(e.clone()),
        };
        match answer {
            Ok(addr) => return Ok(addr),
            Err(e) => tried.push(format!("{configured}: {e}")),
        }
    }
    Err(SentinelError::NoPrimary {
        master: spec.master_name.clone(),
        tried,
    })
}

/// The current primary's address, from the first sentinel with a confirmed answer (one-off:
/// the connections are closed afterwards).
pub async fn resolve_primary(spec: &SentinelSpec) -> Result<String, SentinelError> {
    resolve(&Node::for_questions(spec), spec).await
}

/// Publishes the primary's address on `tx` until every receiver is gone: first as resolved,
/// then after every `+switch-master` for this name announced by any reachable sentinel. A
/// subscription fred could not keep (its reconnections spent) is re-established on the next
/// sentinel, and the address re-resolved, so a failover that happened meanwhile is not
/// missed; so it is after each reconnection fred makes.
pub async fn follow_primary(spec: SentinelSpec, tx: watch::Sender<Option<Primary>>) {
    let sentinels = Node::for_questions(&spec);
    let mut next = 0;
    while !tx.is_closed() {
        resolve_and_publish(&sentinels, &spec, &tx, "resolved").await;
        let Some(sentinel) = spec.sentinels.get(next % spec.sentinels.len().max(1)) else {
            return;
        };
        next += 1;
        let ended = tokio::select! {
            r = follow_switches(sentinel, &sentinels, &spec, &tx) => r,
            r = recheck(&sentinels, &spec, &tx) => r,
        };
        if let Err(e) = ended {
            tracing::debug!(%sentinel, error = %e, "sentinel subscription ended");
        }
        tokio::time::sleep(spec.timeout.min(Duration::from_secs(1))).await;
    }
}

/// Resolves the primary and publishes it; a failure is logged, the last address stands.
async fn resolve_and_publish(
    sentinels: &Sentinels,
    spec: &SentinelSpec,
    tx: &watch::Sender<Option<Primary>>,
    via: &str,
) {
    match resolve(sentinels, spec).await {
        Ok(addr) => publish(tx, &spec.master_name, addr, via),
        Err(e) => tracing::warn!(error = %e, "sentinel: primary not resolved"),
    }
}

/// How often the published primary is confirmed with `ROLE` while subscribed.
const RECHECK: Duration = Duration::from_secs(2);

/// Confirms the published primary every [`RECHECK`], and resolves it again when it is no
/// longer a primary or unreachable: a `+switch-master` missed (a sentinel that restarted, a
/// resolve that asked a stale sentinel during a failover) is corrected within seconds. A
/// primary that still says `master` is kept, so a sentinel that has not yet heard of a
/// failover cannot move the proxy back to a primary about to be demoted.
async fn recheck(
    sentinels: &Sentinels,
    spec: &SentinelSpec,
    tx: &watch::Sender<Option<Primary>>,
) -> Result<(), String> {
    loop {
        tokio::time::sleep(RECHECK).await;
        if tx.is_closed() {
            return Ok(());
        }
        let current = tx.borrow().as_ref().map(|p| p.addr.clone());
        let confirmed = match &current {
            Some(addr) => confirm_primary(addr, spec.timeout).await.is_ok(),
            None => false,
        };
        if !confirmed {
            resolve_and_publish(sentinels, spec, tx, "recheck").await;
        }
    }
}

/// Publishes `addr` if it differs from the current one, one epoch later, and logs the change
/// (operators correlate errors clients saw with this line).
fn publish(tx: &watch::Sender<Option<Primary>>, master: &str, addr: String, via: &str) {
    tx.send_if_modified(|cur| {
        let epoch = match cur {
            Some(old) if *old.addr == *addr => return false,
            Some(old) => {
                tracing::info!(master, old = %old.addr, new = %addr, via, "sentinel: primary changed");
                old.epoch + 1
            }
            None => {
                tracing::info!(master, primary = %addr, "sentinel: primary found");
                0
            }
        };
        *cur = Some(Primary {
            addr: addr.as_str().into(),
            epoch,
        });
        true
    });
}

/// The new primary in a `+switch-master <name> <old-ip> <old-port> <new-ip> <new-port>`
/// payload, when it is about `master`.
fn switched_to(payload: &str, master: &str) -> Option<String> {
    let parts: Vec<&str> = payload.split(' ').collect();
    match parts[..] {
        [name, _, _, ip, port] if name == master => Some(join_host_port(ip, port)),
        _ => None,
    }
}

/// Follows `+switch-master` on one sentinel; returns when fred gives up on its connection.
/// After each of fred's reconnections the primary is resolved again (a switch announced
/// while disconnected is lost with the connection).
async fn follow_switches(
    sentinel: &str,
    sentinels: &Sentinels,
    spec: &SentinelSpec,
    tx: &watch::Sender<Option<Primary>>,
) -> Result<(), String> {
    let mut switches = Switches::subscribe(sentinel, spec).await?;
    loop {
        match switches.next().await? {
            Switch::Message(payload) => {
                if let Some(addr) = switched_to(&payload, &spec.master_name) {
                    publish(tx, &spec.master_name, addr, "+switch-master");
                }
            }
            Switch::MayHaveMissed => {
                resolve_and_publish(sentinels, spec, tx, "resubscribed").await;
            }
        }
        if tx.is_closed() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_is_the_validated_config() {
        let config = crate::config::Config::from_yaml(
            "upstream:\n  mode: sentinel\n  sentinel:\n    sentinels: [10.0.0.1:26379, s2:26379]\n    master_name: mymaster\n",
            std::path::Path::new("s.yaml"),
        )
        .unwrap();
        let spec = SentinelSpec::of(config.upstream.sentinel.as_ref().unwrap());
        assert_eq!(spec.sentinels, ["10.0.0.1:26379", "s2:26379"]);
        assert_eq!(spec.master_name, "mymaster");
        assert_eq!(spec.timeout, Duration::from_millis(1000));
    }

    #[test]
    fn a_switch_names_the_new_primary_of_its_master_only() {
        let payload = "mymaster 127.0.0.1 7000 ::1 7001";
        assert_eq!(
            switched_to(payload, "mymaster").as_deref(),
            Some("[::1]:7001")
        );
        assert_eq!(switched_to(payload, "other"), None);
        assert_eq!(switched_to("mymaster 1 2 3", "mymaster"), None);
    }
}
