//! The cluster's slot map, built from `CLUSTER SHARDS` (Redis 7) or `CLUSTER SLOTS` (older
//! servers), and the `-MOVED`/`-ASK` redirections that keep it current.
//!
//! Everything here parses bytes from the network and so returns errors instead of panicking:
//! a confused or hostile node must cost one failed refresh, never the proxy.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::ClusterError;
use super::slot::SLOTS;
use crate::protocol::resp_value::{Value, decode};

/// Marks a slot that no shard owns (an incomplete cluster, or a shard that failed without a
/// replica to take over): commands for it get Redis's own CLUSTERDOWN error.
const UNOWNED: u16 = u16::MAX;

/// One node, as the topology reply describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// `host:port` to connect to (an IPv6 host in brackets); the key under which the router
    /// keeps the node's connections, and the form MOVED/ASK addresses are normalised to.
    pub addr: Arc<str>,
    /// The node's 40-hex-digit id when the reply gives it: it survives address changes, so a
    /// refresh can tell a moved node from a new one.
    pub id: Option<Arc<str>>,
    /// Whether the node said it is serving (`health: online`). Replica reads must skip a
    /// replica that is still loading its data set or has failed. `CLUSTER SLOTS` gives no
    /// health and leaves out failed replicas, so its nodes are taken as online.
    pub online: bool,
}

/// A primary and its replicas: the unit that owns slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Where every write, and by default every read, for the shard's slots goes.
    pub primary: Node,
    /// Copies of the primary, for optional replica reads and to know who may take over.
    pub replicas: Vec<Node>,
}

/// Which shard owns each of the 16384 slots.
#[derive(Clone, PartialEq, Eq)]
pub struct SlotMap {
    /// Shards that own at least one slot, in reply order. A shard without slots can serve no
    /// command, so it is left out (after a failover the failed primary shows up as one).
    shards: Vec<Shard>,
    /// Slot → index into `shards`, or [`UNOWNED`]. A flat table makes routing one load.
    owners: Box<[u16]>,
}

/// A redirection error from a node: the command was not executed there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// `-MOVED slot addr`: the slot now lives at `addr` for good. Update the map (and refresh
    /// it, since other slots probably moved too), then resend there.
    Moved {
        /// The slot of the command's key(s).
        slot: u16,
        /// The new owner, `host:port`; an empty host in the error has been replaced by the
        /// host of the node that answered.
        addr: Arc<str>,
    },
    /// `-ASK slot addr`: the slot is being migrated and this key is already at `addr`. Send
    /// `ASKING` and the command there once, and leave the map alone.
    Ask {
        /// The slot of the command's key(s).
        slot: u16,
        /// The importing node, `host:port`, normalised as for `Moved`.
        addr: Arc<str>,
    },
}

impl Redirect {
    /// Reads a reply frame; `Ok(None)` when it is not a MOVED or ASK error (any other reply,
    /// including other errors). `answered_by` is the `host:port` of the node that sent the
    /// reply: Redis leaves the host out (`-MOVED 3999 :6381`) when its preferred endpoint type
    /// is `unknown-endpoint`, meaning "the host you are talking to".
    pub fn parse(reply: &[u8], answered_by: &str) -> Result<Option<Redirect>, ClusterError> {
        let Some(text) = error_text(reply) else {
            return Ok(None);
        };
        let (moved, rest) = if let Some(rest) = text.strip_prefix(b"MOVED ") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix(b"ASK ") {
            (false, rest)
        } else {
            return Ok(None);
        };
        let malformed = || ClusterError::Malformed(format!("redirection {:?}", lossy(&text)));
        let mut parts = rest.split(|&b| b == b' ').filter(|p| !p.is_empty());
        let slot = parts.next().and_then(parse_slot).ok_or_else(malformed)?;
        let target = parts.next().ok_or_else(malformed)?;
        if parts.next().is_some() {
            return Err(malformed());
        }
        let target = std::str::from_utf8(target).map_err(|_| malformed())?;
        let (host, port) = split_host_port(target).ok_or_else(malformed)?;
        let host = if host.is_empty() {
            split_host_port(answered_by).map_or("", |(h, _)| h)
        } else {
            host
        };
        if host.is_empty() {
            return Err(malformed());
        }
        let addr = join_host_port(host, port);
        Ok(Some(if moved {
            Redirect::Moved { slot, addr }
        } else {
            Redirect::Ask { slot, addr }
        }))
    }

    /// The slot the redirection is about.
    pub fn slot(&self) -> u16 {
        match self {
            Redirect::Moved { slot, .. } | Redirect::Ask { slot, .. } => *slot,
        }
    }

    /// Where to send the command instead.
    pub(crate) fn addr(&self) -> &Arc<str> {
        match self {
            Redirect::Moved { addr, .. } | Redirect::Ask { addr, .. } => addr,
        }
    }
}

/// Deepest nesting a topology reply may have. Topology replies nest at most five levels
/// (CLUSTER SHARDS: shards → shard → nodes → node → value); a little headroom tolerates
/// attributes.
const MAX_DEPTH: usize = 16;

/// The message of a simple (`-`) or blob (`!`) error frame; a simple one (what Redis sends)
/// is read in place, as every error reply in cluster mode is checked for MOVED/ASK.
fn error_text(reply: &[u8]) -> Option<Cow<'_, [u8]>> {
    match reply.first()? {
        b'-' => {
            let body = &reply[1..];
            let end = memchr::memchr(b'\r', body).unwrap_or(body.len());
            Some(Cow::Borrowed(&body[..end]))
        }
        b'!' => match decode(reply, 0) {
            Ok((Value::Error(text), _)) => Some(Cow::Owned(text.into_bytes())),
            _ => None,
        },
        _ => None,
    }
}

impl SlotMap {
    /// Routes mode's map: this (cluster) map's shards and slots, then one shard per fixed node
    /// named in `names`, fixed node `i` owning "slot" `SLOTS + i` alone (a route's keys).
    pub(crate) fn with_fixed(mut self, names: &[Arc<str>]) -> SlotMap {
        let mut owners = self.owners.into_vec();
        owners.truncate(SLOTS);
        for name in names {
            owners.push(self.shards.len() as u16);
            self.shards.push(Shard {
                primary: Node {
                    addr: name.clone(),
                    id: None,
                    online: true,
                },
                replicas: Vec::new(),
            });
        }
        SlotMap {
            shards: self.shards,
            owners: owners.into_boxed_slice(),
        }
    }

    /// The cluster's own map inside a routes map with `fixed` fixed nodes (see
    /// [`SlotMap::with_fixed`]): the shards before them and the 16384 slots.
    pub(crate) fn cluster_part(&self, fixed: usize) -> SlotMap {
        let mut shards = self.shards.clone();
        shards.truncate(shards.len().saturating_sub(fixed));
        SlotMap {
            shards,
            owners: self.owners[..SLOTS.min(self.owners.len())].into(),
        }
    }

    /// A map in which no slot has an owner.
    pub(crate) fn empty() -> SlotMap {
        SlotMap {
            shards: Vec::new(),
            owners: Box::new([UNOWNED; SLOTS]),
        }
    }

    /// Builds the map from a `CLUSTER SHARDS` reply (RESP2 or RESP3). `answered_by` is the
    /// node that sent it (for nodes whose endpoint is unknown); `tls` picks each node's
    /// `tls-port` over its plain `port` when both are given.
    pub(crate) fn from_cluster_shards(
        reply: &[u8],
        answered_by: &str,
        tls: bool,
    ) -> Result<SlotMap, ClusterError> {
        let (value, _) = decode(reply, MAX_DEPTH)?;
        refused(&value)?;
        let shards = value
            .as_array()
            .ok_or_else(|| malformed("CLUSTER SHARDS reply is not an array"))?;
        let mut builder = Builder::new();
        for shard in shards {
            let fields = shard
                .fields()
                .ok_or_else(|| malformed("CLUSTER SHARDS entry is not a record"))?;
            let mut ranges = Vec::new();
            let mut nodes = Vec::new();
            for (name, value) in fields {
                match name {
                    b"slots" => {
                        let bounds = value
                            .as_array()
                            .ok_or_else(|| malformed("CLUSTER SHARDS slots is not an array"))?;
                        if bounds.len() % 2 != 0 {
                            return Err(malformed("CLUSTER SHARDS slots has an odd length"));
                        }
                        for pair in bounds.chunks_exact(2) {
                            ranges.push(slot_range(&pair[0], &pair[1])?);
                        }
                    }
                    b"nodes" => {
                        for node in value
                            .as_array()
                            .ok_or_else(|| malformed("CLUSTER SHARDS nodes is not an array"))?
                        {
                            nodes.push(shards_node(node, answered_by, tls)?);
                        }
                    }
                    _ => {}
                }
            }
            if ranges.is_empty() {
                continue;
            }
            // The primary is the node whose role says so; should a reply list two (a failed
            // primary not yet demoted next to its promoted replica), the online one wins.
            let primary = nodes
                .iter()
                .enumerate()
                .filter(|(_, (_, is_primary))| *is_primary)
                .max_by_key(|(_, (node, _))| node.online)
                .map(|(i, _)| i)
                .ok_or_else(|| malformed("CLUSTER SHARDS shard with slots has no primary"))?;
            let (primary, _) = nodes.remove(primary);
            let replicas = nodes
                .into_iter()
                .filter(|(_, is_primary)| !is_primary)
                .map(|(node, _)| node)
                .collect();
            builder.add(primary, replicas, &ranges)?;
        }
        Ok(builder.finish())
    }

    /// Builds the map from a `CLUSTER SLOTS` reply (RESP2 or RESP3), the fallback for servers
    /// older than Redis 7. A primary owning several ranges appears once per range there; the
    /// ranges are merged into one shard.
    pub(crate) fn from_cluster_slots(
        reply: &[u8],
        answered_by: &str,
    ) -> Result<SlotMap, ClusterError> {
        let (value, _) = decode(reply, MAX_DEPTH)?;
        refused(&value)?;
        let entries = value
            .as_array()
            .ok_or_else(|| malformed("CLUSTER SLOTS reply is not an array"))?;
        let mut builder = Builder::new();
        for entry in entries {
            let items = entry
                .as_array()
                .ok_or_else(|| malformed("CLUSTER SLOTS entry is not an array"))?;
            let [start, end, primary, replicas @ ..] = items else {
                return Err(malformed("CLUSTER SLOTS entry is too short"));
            };
            let range = slot_range(start, end)?;
            let primary = slots_node(primary, answered_by)?;
            let replicas = replicas
                .iter()
                .map(|r| slots_node(r, answered_by))
                .collect::<Result<Vec<_>, _>>()?;
            builder.add(primary, replicas, &[range])?;
        }
        Ok(builder.finish())
    }

    /// The shard that owns `slot`, if any (`None` also for a slot number out of range).
    pub fn slot_owner(&self, slot: u16) -> Option<&Shard> {
        self.owner_index(slot).map(|i| &self.shards[i])
    }

    /// Index into [`SlotMap::shards`] of the owner of `slot`; lets a router keep per-shard
    /// state in a parallel vector.
    pub(crate) fn owner_index(&self, slot: u16) -> Option<usize> {
        match self.owners.get(usize::from(slot)) {
            Some(&UNOWNED) | None => None,
            Some(&i) => Some(usize::from(i)),
        }
    }

    /// Every shard that owns slots: the primaries a whole-keyspace command must visit.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// How many of the 16384 slots have an owner.
    pub(crate) fn covered(&self) -> usize {
        self.owners[..SLOTS.min(self.owners.len())]
            .iter()
            .filter(|&&o| o != UNOWNED)
            .count()
    }

    /// Whether every slot has an owner.
    pub fn is_complete(&self) -> bool {
        self.covered() == SLOTS
    }

    /// Applies a MOVED without waiting for a full refresh: `slot` now belongs to the primary
    /// at `addr`, which becomes a new shard if the map does not know it as a primary (a
    /// promoted replica, or a node added since the last refresh). The full refresh a MOVED
    /// also triggers fills in the rest (replicas, the other slots that moved with this one).
    pub(crate) fn apply_moved(&mut self, slot: u16, addr: &str) {
        if usize::from(slot) >= SLOTS {
            return;
        }
        let index = match self.shards.iter().position(|s| &*s.primary.addr == addr) {
            Some(i) => i,
            None => {
                self.shards.push(Shard {
                    primary: Node {
                        addr: addr.into(),
                        id: None,
                        online: true,
                    },
                    replicas: Vec::new(),
                });
                self.shards.len() - 1
            }
        };
        self.owners[usize::from(slot)] = index as u16;
        // A shard emptied by the move would otherwise be visited by whole-keyspace commands.
        let mut owned = vec![false; self.shards.len()];
        for &o in self.owners.iter().filter(|&&o| o != UNOWNED) {
            owned[usize::from(o)] = true;
        }
        if owned.iter().any(|o| !o) {
            let mut builder = Builder::new();
            let mut ranges: Vec<Vec<(u16, u16)>> = vec![Vec::new(); self.shards.len()];
            for (slot, &o) in self.owners.iter().enumerate() {
                if o != UNOWNED {
                    ranges[usize::from(o)].push((slot as u16, slot as u16));
                }
            }
            for (shard, ranges) in std::mem::take(&mut self.shards).into_iter().zip(ranges) {
                if !ranges.is_empty() {
                    // Cannot fail: the slots came from a consistent map.
                    let _ = builder.add(shard.primary, shard.replicas, &ranges);
                }
            }
            *self = builder.finish();
        }
    }
}

impl std::fmt::Debug for SlotMap {
    /// Ranges per primary rather than 16384 numbers.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut list = f.debug_list();
        for (i, shard) in self.shards.iter().enumerate() {
            let mut ranges = Vec::new();
            let mut start = None;
            for slot in 0..=SLOTS {
                let mine = self.owners.get(slot) == Some(&(i as u16));
                match (mine, start) {
                    (true, None) => start = Some(slot),
                    (false, Some(s)) => {
                        ranges.push(format!("{s}-{}", slot - 1));
                        start = None;
                    }
                    _ => {}
                }
            }
            list.entry(&format_args!(
                "{} [{}] replicas {:?}",
                shard.primary.addr,
                ranges.join(","),
                shard.replicas.iter().map(|r| &*r.addr).collect::<Vec<_>>()
            ));
        }
        list.finish()
    }
}

/// Collects shards and their slot ranges, merging shards with the same primary and refusing
/// a slot claimed by two different primaries (a map that routes one slot two ways would be
/// worse than a failed refresh: the caller tries another node).
struct Builder {
    /// The shards so far.
    shards: Vec<Shard>,
    /// Primary address → index in `shards`, to merge repeated primaries.
    by_primary: HashMap<Arc<str>, u16>,
    /// Slot owners so far.
    owners: Box<[u16]>,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            shards: Vec::new(),
            by_primary: HashMap::new(),
            owners: Box::new([UNOWNED; SLOTS]),
        }
    }

    fn add(
        &mut self,
        primary: Node,
        replicas: Vec<Node>,
        ranges: &[(u16, u16)],
    ) -> Result<(), ClusterError> {
        let index = match self.by_primary.get(&primary.addr) {
            Some(&i) => {
                let shard = &mut self.shards[usize::from(i)];
                for r in replicas {
                    if !shard.replicas.iter().any(|known| known.addr == r.addr) {
                        shard.replicas.push(r);
                    }
                }
                i
            }
            None => {
                // Every shard added owns at least one slot and no slot is owned twice, so
                // there are never more than 16384 shards and the index fits below UNOWNED.
                let i = self.shards.len() as u16;
                self.by_primary.insert(primary.addr.clone(), i);
                self.shards.push(Shard { primary, replicas });
                i
            }
        };
        for &(start, end) in ranges {
            let (start, end) = (usize::from(start), usize::from(end));
            let owners = &mut self.owners[start..=end];
            if let Some(taken) = owners.iter().position(|&o| o != UNOWNED && o != index) {
                let other = usize::from(owners[taken]);
                return Err(ClusterError::Malformed(format!(
                    "slot {} is claimed by both {} and {}",
                    start + taken,
                    self.shards[other].primary.addr,
                    self.shards[usize::from(index)].primary.addr
                )));
            }
            owners.fill(index);
        }
        Ok(())
    }

    fn finish(self) -> SlotMap {
        SlotMap {
            shards: self.shards,
            owners: self.owners,
        }
    }
}

fn malformed(what: &str) -> ClusterError {
    ClusterError::Malformed(what.to_string())
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An error reply where a topology was expected becomes [`ClusterError::Refused`], so the
/// caller can tell "this node cannot answer" (not a cluster, no permission, unknown command)
/// from garbage.
fn refused(value: &Value) -> Result<(), ClusterError> {
    match value {
        Value::Error(text) => Err(ClusterError::Refused(text.clone())),
        _ => Ok(()),
    }
}

fn parse_slot(s: &[u8]) -> Option<u16> {
    crate::protocol::codec::parse_int(s)
        .and_then(|n| u16::try_from(n).ok())
        .filter(|&n| usize::from(n) < SLOTS)
}

fn slot_range(start: &Value, end: &Value) -> Result<(u16, u16), ClusterError> {
    let bound = |v: &Value| {
        v.as_int()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|&n| usize::from(n) < SLOTS)
    };
    match (bound(start), bound(end)) {
        (Some(s), Some(e)) if s <= e => Ok((s, e)),
        _ => Err(ClusterError::Malformed(format!(
            "invalid slot range {start:?}..{end:?}"
        ))),
    }
}

/// `host:port` → (host, port), with IPv6 brackets removed; the split is at the last colon,
/// because Redis writes IPv6 addresses without brackets in MOVED errors.
fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|&p| p != 0)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port))
}

/// The connectable form: IPv6 hosts in brackets.
fn join_host_port(host: &str, port: u16) -> Arc<str> {
    if host.contains(':') {
        format!("[{host}]:{port}").into()
    } else {
        format!("{host}:{port}").into()
    }
}

/// The host to use for a node. `endpoint` is the node's preferred endpoint from the reply:
/// - missing, null or empty: Redis's `unknown-endpoint` type, documented as "use the host you
///   sent this command to", which is the host of the node that answered;
/// - `?`: the preferred type is `hostname` but this node has none, so its IP (when the reply
///   gives it) is the only address that can reach it;
/// - anything else: the endpoint itself (an IP or a hostname).
fn node_host<'a>(
    endpoint: Option<&'a [u8]>,
    ip: Option<&'a [u8]>,
    answered_by: &'a str,
) -> Result<&'a str, ClusterError> {
    let asked = || {
        split_host_port(answered_by)
            .map(|(h, _)| h)
            .ok_or_else(|| ClusterError::Malformed(format!("bad address {answered_by:?}")))
    };
    let text =
        |b: &'a [u8]| std::str::from_utf8(b).map_err(|_| malformed("node address is not UTF-8"));
    match endpoint {
        None | Some(b"") => asked(),
        Some(b"?") => match ip {
            Some(ip) if !ip.is_empty() && ip != b"?" => text(ip),
            _ => asked(),
        },
        Some(e) => text(e),
    }
}

fn port_of(v: &Value) -> Option<u16> {
    v.as_int()
        .and_then(|n| u16::try_from(n).ok())
        .filter(|&p| p != 0)
}

/// One node of a `CLUSTER SHARDS` shard, and whether it is the primary.
fn shards_node(node: &Value, answered_by: &str, tls: bool) -> Result<(Node, bool), ClusterError> {
    let fields = node
        .fields()
        .ok_or_else(|| malformed("CLUSTER SHARDS node is not a record"))?;
    let (mut id, mut port, mut tls_port, mut ip, mut endpoint) = (None, None, None, None, None);
    let (mut is_primary, mut online) = (false, true);
    for (name, value) in fields {
        match name {
            b"id" => id = value.as_str(),
            b"port" => port = port_of(value),
            b"tls-port" => tls_port = port_of(value),
            b"ip" => ip = value.as_str(),
            b"endpoint" => endpoint = value.as_str(),
            b"role" => is_primary = matches!(value.as_str(), Some(b"master" | b"primary")),
            b"health" => online = value.as_str() == Some(b"online"),
            _ => {}
        }
    }
    // The port matching the proxy's transport, else whichever the node has (a TLS-only node
    // reports only `tls-port`, a plain one only `port`).
    let port = if tls {
        tls_port.or(port)
    } else {
        port.or(tls_port)
    }
    .ok_or_else(|| malformed("CLUSTER SHARDS node has no port"))?;
    let host = node_host(endpoint, ip, answered_by)?;
    Ok((
        Node {
            addr: join_host_port(host, port),
            id: node_id(id),
            online,
        },
        is_primary,
    ))
}

/// One node of a `CLUSTER SLOTS` entry: `[endpoint, port, id?, metadata?]`.
fn slots_node(node: &Value, answered_by: &str) -> Result<Node, ClusterError> {
    let items = node
        .as_array()
        .ok_or_else(|| malformed("CLUSTER SLOTS node is not an array"))?;
    let [endpoint, port, rest @ ..] = items else {
        return Err(malformed("CLUSTER SLOTS node is too short"));
    };
    let port = port_of(port).ok_or_else(|| malformed("CLUSTER SLOTS node has no port"))?;
    let id = rest.first().and_then(Value::as_str);
    // Redis 7 adds a metadata record (`ip`, `hostname`) after the id.
    let ip = rest
        .get(1)
        .and_then(Value::fields)
        .and_then(|f| f.into_iter().find(|(k, _)| *k == b"ip"))
        .and_then(|(_, v)| v.as_str());
    let endpoint = match endpoint {
        Value::Nil => None,
        other => Some(
            other
                .as_str()
                .ok_or_else(|| malformed("CLUSTER SLOTS node endpoint is not a string"))?,
        ),
    };
    let host = node_host(endpoint, ip, answered_by)?;
    Ok(Node {
        addr: join_host_port(host, port),
        id: node_id(id),
        online: true,
    })
}

fn node_id(id: Option<&[u8]>) -> Option<Arc<str>> {
    id.filter(|id| !id.is_empty())
        .and_then(|id| std::str::from_utf8(id).ok())
        .map(Arc::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from a Redis 7.0.15 cluster of three primaries (30001-30003) and three
    // replicas (30004-30006), made with `redis-cli --cluster create … --cluster-replicas 1`,
    // by sending the command on a raw socket and saving the reply bytes.
    const SHARDS_RESP2: &[u8] = include_bytes!("testdata/shards-resp2.resp");
    const SHARDS_RESP3: &[u8] = include_bytes!("testdata/shards-resp3.resp");
    const SLOTS_RESP2: &[u8] = include_bytes!("testdata/slots-resp2.resp");
    const SLOTS_RESP3: &[u8] = include_bytes!("testdata/slots-resp3.resp");
    // The same with `cluster-preferred-endpoint-type unknown-endpoint` on the answering node.
    const SHARDS_UNKNOWN: &[u8] = include_bytes!("testdata/shards-unknown-endpoint.resp");
    const SLOTS_UNKNOWN: &[u8] = include_bytes!("testdata/slots-unknown-endpoint.resp");
    // With `cluster-preferred-endpoint-type hostname` and a hostname on node 30001 only.
    const SHARDS_HOSTNAME: &[u8] = include_bytes!("testdata/shards-hostname.resp");
    const SLOTS_HOSTNAME: &[u8] = include_bytes!("testdata/slots-hostname.resp");
    // After 30003 was shut down and its replica 30005 took over.
    const SHARDS_FAILOVER: &[u8] = include_bytes!("testdata/shards-after-failover.resp");
    const SLOTS_FAILOVER: &[u8] = include_bytes!("testdata/slots-after-failover.resp");
    const MOVED: &[u8] = include_bytes!("testdata/moved.resp");
    const MOVED_UNKNOWN: &[u8] = include_bytes!("testdata/moved-unknown-endpoint.resp");
    const ASK: &[u8] = include_bytes!("testdata/ask.resp");

    const SEED: &str = "127.0.0.1:30001";

    fn owner(map: &SlotMap, slot: u16) -> &str {
        &map.slot_owner(slot).unwrap().primary.addr
    }

    fn replicas(map: &SlotMap, slot: u16) -> Vec<&str> {
        let shard = map.slot_owner(slot).unwrap();
        shard.replicas.iter().map(|r| &*r.addr).collect()
    }

    /// The layout `redis-cli --cluster create` made for the captures.
    fn assert_healthy_layout(map: &SlotMap) {
        assert!(map.is_complete());
        assert_eq!(map.shards().len(), 3);
        for (slots, primary, replica) in [
            ([0, 5460], "127.0.0.1:30001", "127.0.0.1:30006"),
            ([5461, 10922], "127.0.0.1:30002", "127.0.0.1:30004"),
            ([10923, 16383], "127.0.0.1:30003", "127.0.0.1:30005"),
        ] {
            for slot in slots {
                assert_eq!(owner(map, slot), primary, "slot {slot}");
                assert_eq!(replicas(map, slot), [replica], "slot {slot}");
            }
        }
        assert_eq!(
            map.slot_owner(0).unwrap().primary.id.as_deref(),
            Some("f0ff6ec994cb6424f30724362ef379ea6366d62e")
        );
    }

    #[test]
    fn cluster_shards_in_both_protocols() {
        let two = SlotMap::from_cluster_shards(SHARDS_RESP2, SEED, false).unwrap();
        let three = SlotMap::from_cluster_shards(SHARDS_RESP3, SEED, false).unwrap();
        assert_healthy_layout(&two);
        assert_eq!(two, three);
        assert!(two.shards().iter().all(|s| s.primary.online));
    }

    #[test]
    fn cluster_slots_in_both_protocols() {
        let two = SlotMap::from_cluster_slots(SLOTS_RESP2, SEED).unwrap();
        let three = SlotMap::from_cluster_slots(SLOTS_RESP3, SEED).unwrap();
        assert_healthy_layout(&two);
        assert_eq!(two, three);
        // The two commands describe the same cluster, apart from health, which only SHARDS
        // reports.
        let shards = SlotMap::from_cluster_shards(SHARDS_RESP2, SEED, false).unwrap();
        for slot in [0, 8000, 16383] {
            assert_eq!(owner(&two, slot), owner(&shards, slot));
        }
    }

    #[test]
    fn unknown_endpoint_means_the_host_that_answered() {
        for map in [
            SlotMap::from_cluster_shards(SHARDS_UNKNOWN, "localhost:30001", false).unwrap(),
            SlotMap::from_cluster_slots(SLOTS_UNKNOWN, "localhost:30001").unwrap(),
        ] {
            assert!(map.is_complete());
            assert_eq!(owner(&map, 0), "localhost:30001");
            assert_eq!(owner(&map, 16383), "localhost:30003");
            assert_eq!(replicas(&map, 16383), ["localhost:30005"]);
        }
    }

    #[test]
    fn hostname_endpoints_and_nodes_without_one() {
        for map in [
            SlotMap::from_cluster_shards(SHARDS_HOSTNAME, SEED, false).unwrap(),
            SlotMap::from_cluster_slots(SLOTS_HOSTNAME, SEED).unwrap(),
        ] {
            assert_eq!(owner(&map, 0), "node1.example:30001");
            // `?`: no hostname, so the node's IP.
            assert_eq!(owner(&map, 6000), "127.0.0.1:30002");
            assert_eq!(replicas(&map, 0), ["127.0.0.1:30006"]);
        }
    }

    #[test]
    fn after_a_failover() {
        let shards = SlotMap::from_cluster_shards(SHARDS_FAILOVER, SEED, false).unwrap();
        let slots = SlotMap::from_cluster_slots(SLOTS_FAILOVER, SEED).unwrap();
        for map in [&shards, &slots] {
            assert!(map.is_complete());
            // The failed primary owns nothing any more and is no shard.
            assert_eq!(map.shards().len(), 3);
            assert_eq!(owner(map, 16383), "127.0.0.1:30005");
            assert!(replicas(map, 16383).is_empty());
            assert!(
                map.shards()
                    .iter()
                    .all(|s| &*s.primary.addr != "127.0.0.1:30003")
            );
        }
    }

    #[test]
    fn replica_health() {
        let reply = b"*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*3\r\n\
            *8\r\n$4\r\nport\r\n:7000\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$6\r\nhealth\r\n$6\r\nonline\r\n\
            *8\r\n$4\r\nport\r\n:7001\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n$4\r\nrole\r\n$7\r\nreplica\r\n$6\r\nhealth\r\n$7\r\nloading\r\n\
            *8\r\n$8\r\ntls-port\r\n:7102\r\n$8\r\nendpoint\r\n$3\r\n::1\r\n$4\r\nrole\r\n$7\r\nreplica\r\n$6\r\nhealth\r\n$6\r\nonline\r\n";
        let map = SlotMap::from_cluster_shards(reply, SEED, false).unwrap();
        let shard = map.slot_owner(42).unwrap();
        assert_eq!(&*shard.primary.addr, "127.0.0.1:7000");
        assert_eq!(
            shard
                .replicas
                .iter()
                .map(|r| (&*r.addr, r.online))
                .collect::<Vec<_>>(),
            [("127.0.0.1:7001", false), ("[::1]:7102", true)]
        );
        assert!(shard.primary.id.is_none());
    }

    #[test]
    fn tls_port_preferred_with_tls() {
        let reply = b"*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n\
            *8\r\n$4\r\nport\r\n:7000\r\n$8\r\ntls-port\r\n:7100\r\n$8\r\nendpoint\r\n$4\r\nhost\r\n$4\r\nrole\r\n$6\r\nmaster\r\n";
        let plain = SlotMap::from_cluster_shards(reply, SEED, false).unwrap();
        let tls = SlotMap::from_cluster_shards(reply, SEED, true).unwrap();
        assert_eq!(owner(&plain, 0), "host:7000");
        assert_eq!(owner(&tls, 0), "host:7100");
    }

    #[test]
    fn primary_in_several_ranges_is_one_shard() {
        let reply = b"*3\r\n\
            *3\r\n:0\r\n:99\r\n*2\r\n$1\r\na\r\n:1\r\n\
            *3\r\n:100\r\n:16000\r\n*2\r\n$1\r\nb\r\n:1\r\n\
            *3\r\n:16001\r\n:16383\r\n*2\r\n$1\r\na\r\n:1\r\n";
        let map = SlotMap::from_cluster_slots(reply, SEED).unwrap();
        assert!(map.is_complete());
        assert_eq!(map.shards().len(), 2);
        assert_eq!(map.owner_index(0), map.owner_index(16383));
        assert_eq!(owner(&map, 100), "b:1");
    }

    #[test]
    fn partial_coverage_and_unowned_slots() {
        let reply = b"*1\r\n*3\r\n:0\r\n:99\r\n*2\r\n$1\r\na\r\n:1\r\n";
        let map = SlotMap::from_cluster_slots(reply, SEED).unwrap();
        assert_eq!(map.covered(), 100);
        assert!(!map.is_complete());
        assert!(map.slot_owner(100).is_none());
        assert!(map.slot_owner(u16::MAX).is_none());
        let empty = SlotMap::from_cluster_slots(b"*0\r\n", SEED).unwrap();
        assert_eq!(empty, SlotMap::empty());
    }

    #[test]
    fn inconsistent_or_malformed_topologies_are_errors() {
        for (reply, why) in [
            (
                &b"*2\r\n*3\r\n:0\r\n:10\r\n*2\r\n$1\r\na\r\n:1\r\n*3\r\n:10\r\n:20\r\n*2\r\n$1\r\nb\r\n:1\r\n"[..],
                "slot 10 is claimed",
            ),
            (b"*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\na\r\n:1\r\n", "invalid slot range"),
            (b"*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\na\r\n:1\r\n", "invalid slot range"),
            (b"*1\r\n*3\r\n:0\r\n:1\r\n*2\r\n$1\r\na\r\n:0\r\n", "no port"),
            (b"*1\r\n*2\r\n:0\r\n:1\r\n", "too short"),
            (b":1\r\n", "not an array"),
        ] {
            let err = SlotMap::from_cluster_slots(reply, SEED).unwrap_err();
            assert!(err.to_string().contains(why), "{err} (wanted {why})");
        }
        let err = SlotMap::from_cluster_slots(b"*2\r\n", SEED).unwrap_err();
        assert!(matches!(err, ClusterError::Decode(_)), "{err}");
        // A shard with slots but no primary cannot be routed to.
        let no_primary = b"*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:1\r\n$5\r\nnodes\r\n*1\r\n\
            *4\r\n$4\r\nport\r\n:7000\r\n$4\r\nrole\r\n$7\r\nreplica\r\n";
        assert!(SlotMap::from_cluster_shards(no_primary, SEED, false).is_err());
    }

    #[test]
    fn error_replies_are_refusals() {
        let err = SlotMap::from_cluster_shards(
            b"-ERR unknown subcommand 'SHARDS'. Try CLUSTER HELP.\r\n",
            SEED,
            false,
        )
        .unwrap_err();
        assert!(
            matches!(err, ClusterError::Refused(ref m) if m.starts_with("ERR unknown subcommand"))
        );
        assert!(matches!(
            SlotMap::from_cluster_slots(
                b"-ERR This instance has cluster support disabled\r\n",
                SEED
            ),
            Err(ClusterError::Refused(_))
        ));
    }

    /// Every prefix and every single-byte corruption (by a byte that changes framing) of the
    /// captures: errors are fine, panics are not.
    #[test]
    fn never_panics_on_damaged_captures() {
        for (capture, shards) in [
            (SHARDS_RESP2, true),
            (SHARDS_RESP3, true),
            (SLOTS_RESP2, false),
            (SLOTS_RESP3, false),
            (SLOTS_FAILOVER, false),
        ] {
            let parse = |bytes: &[u8]| {
                let _ = if shards {
                    SlotMap::from_cluster_shards(bytes, SEED, false)
                } else {
                    SlotMap::from_cluster_slots(bytes, SEED)
                };
            };
            let mut damaged = capture.to_vec();
            for i in 0..capture.len() {
                parse(&capture[..i]);
                for b in [b'*', b'%', b'$', b'\r', b'9'] {
                    let was = damaged[i];
                    damaged[i] = b;
                    parse(&damaged);
                    damaged[i] = was;
                }
            }
        }
        for redirect in [MOVED, MOVED_UNKNOWN, ASK] {
            for i in 0..redirect.len() {
                let _ = Redirect::parse(&redirect[..i], SEED);
                let _ = Redirect::parse(&redirect[i..], SEED);
                let mut damaged = redirect.to_vec();
                for b in [b' ', b':', b'\r', b'-', b'!', b'9'] {
                    damaged[i] = b;
                    let _ = Redirect::parse(&damaged, SEED);
                    let _ = Redirect::parse(&damaged, "");
                }
            }
        }
    }

    #[test]
    fn moved_and_ask() {
        assert_eq!(
            Redirect::parse(MOVED, SEED).unwrap(),
            Some(Redirect::Moved {
                slot: 12182,
                addr: "127.0.0.1:30003".into()
            })
        );
        assert_eq!(
            Redirect::parse(ASK, "127.0.0.1:30003").unwrap(),
            Some(Redirect::Ask {
                slot: 12182,
                addr: "127.0.0.1:30001".into()
            })
        );
        // `-MOVED 12182 :30003`: the host of the node that answered.
        assert_eq!(
            Redirect::parse(MOVED_UNKNOWN, "10.0.0.5:30001").unwrap(),
            Some(Redirect::Moved {
                slot: 12182,
                addr: "10.0.0.5:30003".into()
            })
        );
        assert_eq!(
            Redirect::parse(b"-MOVED 1 :7000\r\n", "[::1]:7001")
                .unwrap()
                .unwrap()
                .addr()
                .as_ref(),
            "[::1]:7000"
        );
        // Redis writes IPv6 hosts without brackets.
        assert_eq!(
            Redirect::parse(b"-ASK 16383 fe80::1:7000\r\n", SEED).unwrap(),
            Some(Redirect::Ask {
                slot: 16383,
                addr: "[fe80::1]:7000".into()
            })
        );
        // RESP3 blob error form.
        assert_eq!(
            Redirect::parse(b"!20\r\nMOVED 3999 host:6381\r\n", SEED)
                .unwrap()
                .map(|r| r.slot()),
            Some(3999)
        );
    }

    #[test]
    fn other_replies_are_not_redirects() {
        for reply in [
            &b"+OK\r\n"[..],
            b"$-1\r\n",
            b"-ERR unknown command\r\n",
            b"-CLUSTERDOWN Hash slot not served\r\n",
            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n",
            b"-MOVEDX 1 a:1\r\n",
            b"",
        ] {
            assert_eq!(Redirect::parse(reply, SEED).unwrap(), None);
        }
        for reply in [
            &b"-MOVED \r\n"[..],
            b"-MOVED 16384 a:1\r\n",
            b"-MOVED -1 a:1\r\n",
            b"-MOVED 1 a\r\n",
            b"-MOVED 1 a:0\r\n",
            b"-MOVED 1 a:70000\r\n",
            b"-ASK 1 a:1 extra\r\n",
            b"-ASK 1\r\n",
            b"-MOVED 1 :1\r\n",
        ] {
            let answered_by = if reply == b"-MOVED 1 :1\r\n" {
                "nohost"
            } else {
                SEED
            };
            assert!(
                Redirect::parse(reply, answered_by).is_err(),
                "{:?}",
                String::from_utf8_lossy(reply)
            );
        }
    }

    #[test]
    fn moved_updates_the_map() {
        let mut map = SlotMap::from_cluster_slots(SLOTS_RESP2, SEED).unwrap();
        // To a known primary.
        map.apply_moved(0, "127.0.0.1:30002");
        assert_eq!(owner(&map, 0), "127.0.0.1:30002");
        assert_eq!(owner(&map, 1), "127.0.0.1:30001");
        // To a node the map does not know as a primary (a promoted replica).
        map.apply_moved(16383, "127.0.0.1:30005");
        assert_eq!(owner(&map, 16383), "127.0.0.1:30005");
        assert_eq!(map.shards().len(), 4);
        assert!(map.is_complete());
        // A shard left without slots disappears.
        let mut tiny = SlotMap::from_cluster_slots(
            b"*2\r\n*3\r\n:0\r\n:0\r\n*2\r\n$1\r\na\r\n:1\r\n*3\r\n:1\r\n:16383\r\n*2\r\n$1\r\nb\r\n:1\r\n",
            SEED,
        )
        .unwrap();
        tiny.apply_moved(0, "b:1");
        assert_eq!(tiny.shards().len(), 1);
        assert_eq!(owner(&tiny, 0), "b:1");
        assert!(tiny.is_complete());
        tiny.apply_moved(16384, "c:1");
        assert_eq!(tiny.shards().len(), 1);
    }
}
