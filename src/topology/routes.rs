//! Routes: which upstream a key belongs to, by key prefix (`routes:` in the config,
//! docs/routes.md). A leaf both the policy (rules scoped with `routes:`) and the router
//! (where a command goes) read; it knows names and prefixes, not connections.
//!
//! Routes are matched on the key as Redis stores it, so the router can place a command after
//! the policy rewrote it (a tenant namespace prefixes keys): each route prefix is also
//! entered behind every namespace it applies to. The longest matching prefix wins; a key no
//! route names belongs to the `default` route (index 0), which is `upstream:`.

use std::sync::atomic::{AtomicU64, Ordering};

/// The name of the route of every key no route's prefix names: the `upstream:` section.
pub(crate) const DEFAULT_ROUTE: &str = "default";

/// The node number of a route whose upstream is a Redis Cluster: its keys go by hash slot to
/// the cluster's nodes, not to one node.
pub(crate) const ON_CLUSTER: u16 = u16::MAX;

/// One route as the table needs it: its name, where its keys go, which keys are its.
#[derive(Debug, Clone)]
pub(crate) struct RouteSpec {
    /// From the file; names the route in errors, metrics and rules' `routes:`.
    pub(crate) name: String,
    /// The node (the pool of one upstream and database) the route's keys go to, or
    /// [`ON_CLUSTER`].
    pub(crate) node: u16,
    /// Key prefixes of the route, as clients write them.
    pub(crate) prefixes: Vec<Vec<u8>>,
    /// Namespaces of the tenants whose keys the route takes (`tenants:` on the route);
    /// `None`: every client's.
    pub(crate) namespaces: Option<Vec<Vec<u8>>>,
}

/// A prefix entered in the table, and its route.
#[derive(Debug)]
struct Entry {
    /// The prefix as stored: a namespace (if any) then the route's prefix.
    stored: Box<[u8]>,
    /// Index into `RouteTable::names`.
    route: u16,
    /// Entered for a route's own tenants (`tenants:`): wins over an equally long entry of a
    /// route for every tenant.
    specific: bool,
}

/// Key prefix → route, built once at start.
#[derive(Debug)]
pub struct RouteTable {
    /// Route names by index; index 0 is `default`.
    names: Vec<String>,
    /// The node each route's keys go to, by route index.
    nodes: Vec<u16>,
    /// Every stored prefix, longest first (a tenant's own before others of its length), so
    /// the first match is the one that wins.
    entries: Vec<Entry>,
    /// Commands placed per route (by the route of their first key, or `default` when keyless),
    /// for `proxy_route_commands_total`.
    commands: Vec<AtomicU64>,
}

impl RouteTable {
    /// The table for `routes` behind the `default` route, whose keys go to node 0.
    /// `namespaces` are every namespaced tenant's prefixes: a route without `tenants:` takes
    /// its prefixes under each of them too, as a namespaced client's key is stored so.
    pub(crate) fn new(routes: &[RouteSpec], namespaces: &[Vec<u8>]) -> RouteTable {
        let mut names = vec![DEFAULT_ROUTE.to_string()];
        let mut nodes = vec![0];
        let mut entries = Vec::new();
        for spec in routes {
            let route = names.len() as u16;
            names.push(spec.name.clone());
            nodes.push(spec.node);
            let mut under: Vec<&[u8]> = Vec::new();
            match &spec.namespaces {
                Some(only) => under.extend(only.iter().map(Vec::as_slice)),
                None => {
                    under.push(b"");
                    under.extend(namespaces.iter().map(Vec::as_slice));
                }
            }
            for prefix in &spec.prefixes {
                for ns in &under {
                    let stored = [*ns, prefix.as_slice()].concat().into_boxed_slice();
                    let specific = spec.namespaces.is_some();
                    entries.push(Entry {
                        stored,
                        route,
                        specific,
                    });
                }
            }
        }
        entries.sort_by_key(|e| (std::cmp::Reverse(e.stored.len()), !e.specific));
        let commands = names.iter().map(|_| AtomicU64::new(0)).collect();
        RouteTable {
            names,
            nodes,
            entries,
            commands,
        }
    }

    /// The route of a key as stored.
    pub fn route_of(&self, key: &[u8]) -> u16 {
        self.entries
            .iter()
            .find(|e| key.starts_with(&e.stored))
            .map_or(0, |e| e.route)
    }

    /// The route of a key as a client of the tenant with namespace `namespace` names it
    /// (before the namespace phase prefixes it), without building the stored key.
    pub(crate) fn route_of_client_key(&self, namespace: Option<&[u8]>, key: &[u8]) -> u16 {
        let ns = namespace.unwrap_or_default();
        self.entries
            .iter()
            .find(|e| match e.stored.split_at_checked(ns.len()) {
                Some((head, rest)) => head == ns && key.starts_with(rest),
                None => ns.starts_with(&e.stored),
            })
            .map_or(0, |e| e.route)
    }

    /// The node of route `route`.
    pub(crate) fn node(&self, route: u16) -> u16 {
        self.nodes[usize::from(route)]
    }

    /// Whether a route's keys go to a Redis Cluster ([`ON_CLUSTER`]).
    pub(crate) fn has_cluster(&self) -> bool {
        self.nodes.contains(&ON_CLUSTER)
    }

    /// Route names by index, `default` first.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The index of the route called `name`.
    pub(crate) fn index(&self, name: &str) -> Option<u16> {
        self.names.iter().position(|n| n == name).map(|i| i as u16)
    }

    /// The names of the routes whose keys go to `node`, joined with `/` (several routes may
    /// share one upstream and database), for error messages.
    pub(crate) fn names_of_node(&self, node: u16) -> String {
        let names: Vec<&str> = self
            .nodes
            .iter()
            .zip(&self.names)
            .filter(|(n, _)| **n == node)
            .map(|(_, name)| name.as_str())
            .collect();
        names.join("/")
    }

    /// Counts one command placed on `route`.
    pub(crate) fn count(&self, route: u16) {
        self.commands[usize::from(route)].fetch_add(1, Ordering::Relaxed);
    }

    /// Commands placed per route so far, by name.
    pub(crate) fn counts(&self) -> impl Iterator<Item = (&str, u64)> {
        self.names
            .iter()
            .zip(&self.commands)
            .map(|(n, c)| (n.as_str(), c.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, node: u16, prefixes: &[&str], tenants: Option<&[&str]>) -> RouteSpec {
        RouteSpec {
            name: name.into(),
            node,
            prefixes: prefixes.iter().map(|p| p.as_bytes().to_vec()).collect(),
            namespaces: tenants.map(|t| t.iter().map(|n| n.as_bytes().to_vec()).collect()),
        }
    }

    fn table() -> RouteTable {
        RouteTable::new(
            &[
                spec("cache", 0, &["cache:", "session:"], None),
                spec("queue", 1, &["queue:", "stream:", "events:"], None),
                spec("queue-hot", 2, &["queue:hot:"], None),
                spec("vip", 3, &["cache:"], Some(&["vip:"])),
            ],
            &[b"t1:".to_vec(), b"vip:".to_vec()],
        )
    }

    #[test]
    fn longest_prefix_wins_and_the_rest_is_default() {
        let t = table();
        let name = |k: &str| t.names()[usize::from(t.route_of(k.as_bytes()))].clone();
        assert_eq!(name("cache:user:1"), "cache");
        assert_eq!(name("session:abc"), "cache");
        assert_eq!(name("queue:jobs"), "queue");
        assert_eq!(name("queue:hot:1"), "queue-hot");
        assert_eq!(name("events"), "default", "a prefix is matched whole");
        assert_eq!(name("user:1"), "default");
        assert_eq!(name(""), "default");
        assert_eq!(t.node(t.route_of(b"stream:x")), 1);
    }

    #[test]
    fn namespaced_keys_are_routed_by_the_key_the_client_named() {
        let t = table();
        let name = |k: &str| t.names()[usize::from(t.route_of(k.as_bytes()))].clone();
        assert_eq!(name("t1:queue:jobs"), "queue");
        assert_eq!(name("t1:cache:a"), "cache");
        assert_eq!(name("vip:cache:a"), "vip", "the tenant's own route wins");
        assert_eq!(name("t2:queue:jobs"), "default", "t2 has no namespace");
        let client = |ns: Option<&str>, k: &str| {
            t.names()[usize::from(t.route_of_client_key(ns.map(str::as_bytes), k.as_bytes()))]
                .clone()
        };
        assert_eq!(client(Some("t1:"), "queue:jobs"), "queue");
        assert_eq!(client(Some("vip:"), "cache:a"), "vip");
        assert_eq!(client(None, "cache:a"), "cache");
        assert_eq!(client(None, "vip:cache:a"), "vip");
        assert_eq!(client(Some("t1:"), "other"), "default");
        // Every stored key agrees with the client-side lookup of the same key.
        for ns in [None, Some("t1:"), Some("vip:")] {
            for key in ["cache:1", "queue:hot:2", "events:x", "x", "session:", ""] {
                let stored = format!("{}{key}", ns.unwrap_or(""));
                assert_eq!(
                    t.route_of(stored.as_bytes()),
                    t.route_of_client_key(ns.map(str::as_bytes), key.as_bytes()),
                    "{ns:?} {key}"
                );
            }
        }
    }

    #[test]
    fn node_names_join_routes_sharing_a_node() {
        let t = table();
        assert_eq!(t.names_of_node(0), "default/cache");
        assert_eq!(t.names_of_node(1), "queue");
        assert_eq!(t.index("queue"), Some(2));
        assert_eq!(t.index("nope"), None);
        t.count(2);
        t.count(2);
        assert_eq!(t.counts().nth(2), Some(("queue", 2)));
    }
}
