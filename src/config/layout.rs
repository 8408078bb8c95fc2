//! A configuration's routes laid out: the upstream of a name, the nodes (upstream and
//! database) the routes need and the node of each route, a config per node, and the checks
//! of `upstreams:` and `routes:` against each other.

use std::collections::{BTreeMap, HashMap};

use serde_saphyr::Location;

use super::routes::{RouteConfig, RouteNode};
use super::{Config, Problem, UpstreamConfig, UpstreamMode};
use crate::topology::routes::{DEFAULT_ROUTE, ON_CLUSTER};

impl Config {
    /// Whether keys are routed to several upstreams (a `routes:` section).
    pub(crate) fn has_routes(&self) -> bool {
        !self.routes.is_empty()
    }

    /// The upstream named `name`: `upstream:` for `default`, else one under `upstreams:`.
    pub fn named_upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        match name {
            DEFAULT_ROUTE => Some(&self.upstream),
            _ => self.upstreams.get(name),
        }
    }

    /// The distinct (upstream, database) pairs the routes use, `default` database 0 first:
    /// one pool each. A cluster upstream is not one of them (its nodes are discovered).
    pub(crate) fn route_nodes(&self) -> Vec<RouteNode> {
        let mut nodes = vec![RouteNode {
            upstream: DEFAULT_ROUTE.to_string(),
            db: 0,
        }];
        for route in self.routes.iter().filter(|r| !self.routes_to_cluster(r)) {
            let node = RouteNode::of(route);
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        nodes
    }

    /// The node index of `route` in [`Config::route_nodes`], or [`ON_CLUSTER`] for a route
    /// to a cluster.
    pub(crate) fn route_node(&self, route: &RouteConfig) -> u16 {
        if self.routes_to_cluster(route) {
            return ON_CLUSTER;
        }
        let node = RouteNode::of(route);
        self.route_nodes()
            .iter()
            .position(|n| *n == node)
            .map_or(0, |i| i as u16)
    }

    /// Whether `route`'s upstream is a Redis Cluster.
    fn routes_to_cluster(&self, route: &RouteConfig) -> bool {
        self.named_upstream(&route.upstream.value)
            .is_some_and(|u| u.mode.value == UpstreamMode::Cluster)
    }

    /// The name of the Redis Cluster upstream a route sends keys to, if any (one at most).
    pub(crate) fn route_cluster(&self) -> Option<&str> {
        self.routes
            .iter()
            .find(|r| self.routes_to_cluster(r))
            .map(|r| r.upstream.value.as_str())
    }

    /// The configuration one node's pool is started from: this one with `upstream` replaced
    /// by the node's upstream and database (pools read their settings from `upstream`).
    pub(crate) fn for_upstream(&self, node: &RouteNode) -> Option<Config> {
        let mut upstream = self.named_upstream(&node.upstream)?.clone();
        upstream.db = node.db;
        Some(Config {
            upstream,
            upstreams: BTreeMap::new(),
            routes: Vec::new(),
            ..self.clone()
        })
    }

    /// Problems of `upstreams:` and `routes:`.
    pub(super) fn route_problems(&self, problems: &mut Vec<Problem>) {
        for (name, upstream) in &self.upstreams {
            self.named_upstream_problems(name, upstream, problems);
        }
        self.unused_upstream_problems(problems);
        if self.routes.is_empty() {
            return;
        }
        if self.upstream.mode.value == UpstreamMode::Cluster {
            problems.push(problem(
                &self.upstream.mode.referenced,
                "upstream.mode".into(),
                "cluster cannot be the default route's upstream: name the cluster under \
                 `upstreams:` and route its prefixes there (docs/routes.md)",
            ));
        }
        self.sentinel_route_problems(problems);
        self.cluster_route_problems(problems);
        self.route_name_problems(problems);
        for (i, route) in self.routes.iter().enumerate() {
            self.route_target_problems(i, route, problems);
        }
    }

    /// Upstreams under `upstreams:` that no route names.
    fn unused_upstream_problems(&self, problems: &mut Vec<Problem>) {
        for (name, u) in &self.upstreams {
            if !self.routes.iter().any(|r| r.upstream.value == *name) {
                problems.push(problem(
                    &u.address.referenced,
                    format!("upstreams.{name}"),
                    &format!(
                        "is used by no route: name it in a route's `upstream: {name}`, or \
                         remove it"
                    ),
                ));
            }
        }
    }

    /// Sentinel upstreams behind routes: primary reads only (no replica reads yet).
    fn sentinel_route_problems(&self, problems: &mut Vec<Problem>) {
        let upstreams = std::iter::once((DEFAULT_ROUTE, &self.upstream))
            .chain(self.upstreams.iter().map(|(n, u)| (n.as_str(), u)));
        for (name, u) in upstreams {
            let Some(s) = &u.sentinel else { continue };
            if s.read_from() != super::ReadFrom::Primary {
                let field = match name {
                    DEFAULT_ROUTE => "upstream.sentinel.read_from".to_string(),
                    _ => format!("upstreams.{name}.sentinel.read_from"),
                };
                problems.push(problem(
                    &s.read_from.referenced,
                    field,
                    "replica reads are not supported with routes yet: use primary",
                ));
            }
        }
    }

    /// Route names (unique, label-safe, not `default`) and prefixes (non-empty, each in one
    /// route for the same tenants).
    fn route_name_problems(&self, problems: &mut Vec<Problem>) {
        let mut names: HashMap<&str, ()> = HashMap::new();
        let mut prefixes: HashMap<(&str, Option<&Vec<String>>), &str> = HashMap::new();
        for (i, route) in self.routes.iter().enumerate() {
            let name = route.name.value.as_str();
            let at = &route.name.referenced;
            if name.is_empty() || name == DEFAULT_ROUTE || !valid_label(name) {
                problems.push(problem(
                    at,
                    format!("routes[{i}].name"),
                    "must be a name of letters, digits, `_` or `-`, and not `default` (the \
                     route of every other key)",
                ));
            } else if names.insert(name, ()).is_some() {
                let message = format!("`{name}` names two routes");
                problems.push(problem(at, format!("routes[{i}].name"), &message));
            }
            if route.prefixes.is_empty() {
                problems.push(problem(
                    at,
                    format!("routes[{i}].prefixes"),
                    "must list at least one key prefix such as `cache:`",
                ));
            }
            for (j, prefix) in route.prefixes.iter().enumerate() {
                let field = format!("routes[{i}].prefixes[{j}]");
                let key = (prefix.value.as_str(), route.tenants.as_ref());
                if prefix.value.is_empty() {
                    problems.push(problem(&prefix.referenced, field, "must not be empty"));
                } else if let Some(other) = prefixes.insert(key, name) {
                    let message =
                        format!("`{}` is already a prefix of route `{other}`", prefix.value);
                    problems.push(problem(&prefix.referenced, field, &message));
                }
            }
        }
    }

    /// Where route `i` sends its keys: a known upstream, a database it has, tenants with a
    /// namespace.
    fn route_target_problems(&self, i: usize, route: &RouteConfig, problems: &mut Vec<Problem>) {
        let field = |f: &str| format!("routes[{i}].{f}");
        match self.named_upstream(&route.upstream.value) {
            None => problems.push(problem(
                &route.upstream.referenced,
                field("upstream"),
                &format!(
                    "no upstream `{}`: name one under `upstreams:`, or `default`",
                    route.upstream.value
                ),
            )),
            Some(u) if u.mode.value == UpstreamMode::Cluster && route.db.is_some() => problems
                .push(problem(
                    &route.upstream.referenced,
                    field("db"),
                    "a cluster has only database 0",
                )),
            Some(_) => {}
        }
        if let Some(db) = route.db.as_ref().filter(|d| d.value > 15) {
            problems.push(problem(
                &db.referenced,
                field("db"),
                "must be between 0 and 15 (Redis's default `databases 16`)",
            ));
        }
        for tenant in route.tenants.iter().flatten() {
            if !self.access.namespaces.contains_key(tenant) {
                problems.push(problem(
                    &route.name.referenced,
                    field("tenants"),
                    &format!(
                        "tenant `{tenant}` has no namespace (access.namespaces): a route by \
                         tenant needs the tenant's keys to carry its prefix"
                    ),
                ));
            }
        }
    }

    /// A cluster behind a route: one at most, primary reads only, no brace in a namespace
    /// (it would become the hash tag of every key of the tenant, as in cluster mode).
    fn cluster_route_problems(&self, problems: &mut Vec<Problem>) {
        let clusters: Vec<&String> = self
            .upstreams
            .iter()
            .filter(|(n, u)| {
                u.mode.value == UpstreamMode::Cluster
                    && self.routes.iter().any(|r| r.upstream.value == **n)
            })
            .map(|(n, _)| n)
            .collect();
        if clusters.len() > 1 {
            let u = &self.upstreams[clusters[1]];
            problems.push(problem(
                &u.mode.referenced,
                format!("upstreams.{}.mode", clusters[1]),
                &format!(
                    "one Redis Cluster behind the routes at most (`{}` is one already)",
                    clusters[0]
                ),
            ));
        }
        for name in clusters {
            let Some(c) = &self.upstreams[name].cluster else {
                continue;
            };
            if c.read_from() != super::ReadFrom::Primary {
                problems.push(problem(
                    &c.read_from.referenced,
                    format!("upstreams.{name}.cluster.read_from"),
                    "replica reads are not supported with routes yet: use primary",
                ));
            }
            for (tenant, prefix) in &self.access.namespaces {
                if prefix.contains('{') || prefix.contains('}') {
                    problems.push(problem(
                        &Location::UNKNOWN,
                        format!("access.namespaces.{tenant}"),
                        "must not contain `{` or `}` when a route's upstream is a cluster: it \
                         would change the hash slot of every key of the tenant",
                    ));
                }
            }
        }
    }

    /// A named upstream's own problems, found as `upstream:`'s are and named after it.
    fn named_upstream_problems(
        &self,
        name: &str,
        upstream: &UpstreamConfig,
        problems: &mut Vec<Problem>,
    ) {
        if name == DEFAULT_ROUTE || !valid_label(name) {
            problems.push(problem(
                &upstream.address.referenced,
                format!("upstreams.{name}"),
                "must be named with letters, digits, `_` or `-`, and not `default` (that is \
                 `upstream:`)",
            ));
        }
        let alone = Config {
            upstream: upstream.clone(),
            ..Config::default()
        };
        let within = format!("upstreams.{name}.");
        problems.extend(alone.problems().into_iter().filter_map(|p| {
            let field = format!("{within}{}", p.field.strip_prefix("upstream.")?);
            Some(Problem { field, ..p })
        }));
    }
}

/// Whether `name` can be a metrics label value and a word in errors as it is.
fn valid_label(name: &str) -> bool {
    name.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn problem(loc: &Location, field: String, message: &str) -> Problem {
    Problem {
        line: loc.line(),
        field,
        message: message.to_string(),
    }
}
