//! `upstreams:` and `routes:`: several Redis behind one proxy, keys sent to one of them by
//! prefix (docs/routes.md). Plain data (`layout` lays it out and checks it against the rest of
//! the file); the route table the router and the policy read is built from it by the
//! composer (`setup::route_table`).

use serde::Deserialize;

use super::Located;
use crate::topology::routes::DEFAULT_ROUTE;

/// One route: a set of key prefixes and the upstream (and database) their keys live in.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RouteConfig {
    /// Names the route in errors, metrics labels, `/readyz` and rules' `routes:`.
    pub(crate) name: Located<String>,
    /// Key prefixes (`cache:`) whose keys take this route; the longest matching prefix of
    /// all routes wins, a key no prefix names takes the `default` route (`upstream:`).
    pub(crate) prefixes: Vec<Located<String>>,
    /// The upstream the route's keys go to: a name under `upstreams:`, or `default` (the
    /// `upstream:` section, the default).
    #[serde(default = "default_upstream")]
    pub(crate) upstream: Located<String>,
    /// The database the route's keys live in on its upstream (`SELECT` on every connection);
    /// 0 by default. Routes sharing an upstream and database share its connections.
    #[serde(default)]
    pub(crate) db: Option<Located<u16>>,
    /// Only these tenants' keys take the route (others' keys with the prefix go on to the
    /// next match); every tenant's when absent. Each must have a namespace
    /// (`access.namespaces`), as it is the stored key that names the route.
    #[serde(default)]
    pub(crate) tenants: Option<Vec<String>>,
}

fn default_upstream() -> Located<String> {
    super::located(DEFAULT_ROUTE.to_string())
}

/// Where one node of the routes' layout lives: an upstream by name and a database. Nodes are
/// numbered in [`Config::route_nodes`](super::Config::route_nodes) order; node 0 is `upstream:` database 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteNode {
    /// `default` or a name under `upstreams:`.
    pub(crate) upstream: String,
    /// The database selected on its connections.
    pub(crate) db: u16,
}

impl RouteNode {
    /// Where `route`'s keys live.
    pub(super) fn of(route: &RouteConfig) -> RouteNode {
        RouteNode {
            upstream: route.upstream.value.clone(),
            db: route.db.as_ref().map_or(0, |d| d.value),
        }
    }
}
