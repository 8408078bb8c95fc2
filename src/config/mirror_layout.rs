//! `mirror:` within the whole configuration: its checks against the rest (its upstream's
//! mode, the route it mirrors), the node it mirrors and the configuration its pool reads.

use serde_saphyr::Location;

use super::routes::RouteNode;
use super::{Config, Located, MirrorConfig, Problem, UpstreamMode, percent};
use crate::topology::routes::{DEFAULT_ROUTE, ON_CLUSTER};

impl Config {
    /// Problems of `mirror:`.
    pub(super) fn mirror_problems(&self, problems: &mut Vec<Problem>) {
        let Some(mirror) = &self.mirror else {
            return;
        };
        let alone = Config {
            upstream: mirror.upstream.clone(),
            ..Config::default()
        };
        problems.extend(alone.problems().into_iter().filter_map(|p| {
            let field = format!("mirror.upstream.{}", p.field.strip_prefix("upstream.")?);
            Some(Problem { field, ..p })
        }));
        let mut push = |loc: &Location, field: &str, message: String| {
            problems.push(Problem {
                line: loc.line(),
                field: field.to_string(),
                message,
            });
        };
        match (&mirror.route, self.routes.is_empty()) {
            (None, false) => push(
                &mirror.upstream.address.referenced,
                "mirror.route",
                "with `routes:`, name the route whose server the mirror copies (`route: <name>`, \
                 or `default` for `upstream:`); one route at a time (docs/migration.md)"
                    .into(),
            ),
            (Some(route), true) => push(
                &route.referenced,
                "mirror.route",
                "names a route, but the file has no `routes:`; remove it to mirror every write"
                    .into(),
            ),
            (Some(route), false) => self.mirrored_route_problems(route, &mut push),
            (None, true) => {}
        }
        if mirror.upstream.address.value == self.upstream.address.value
            && self.upstream.mode.value == UpstreamMode::Standalone
            && mirror.upstream.mode.value == UpstreamMode::Standalone
        {
            push(
                &mirror.upstream.address.referenced,
                "mirror.upstream.address",
                format!(
                    "`{}` is the primary itself: every write would run twice there",
                    mirror.upstream.address.value
                ),
            );
        }
        if mirror.max_queue_bytes.value < 1 << 16 {
            push(
                &mirror.max_queue_bytes.referenced,
                "mirror.max_queue_bytes",
                "must be at least 65536 (one large batch must fit)".into(),
            );
        }
        if let Some(compare) = &mirror.compare
            && let Err(why) = percent::parse(&compare.share.value)
        {
            push(&compare.share.referenced, "mirror.compare.share", why);
        }
    }
}

impl Config {
    /// Problems of `mirror.route` with `routes:`: a route that exists and goes to one server.
    fn mirrored_route_problems(
        &self,
        route: &Located<String>,
        push: &mut impl FnMut(&Location, &str, String),
    ) {
        let name = route.value.as_str();
        if name == DEFAULT_ROUTE {
            return;
        }
        let Some(found) = self.routes.iter().find(|r| r.name.value == name) else {
            let mut names: Vec<&str> = vec![DEFAULT_ROUTE];
            names.extend(self.routes.iter().map(|r| r.name.value.as_str()));
            push(
                &route.referenced,
                "mirror.route",
                format!("`{name}` is not a route (routes: {})", names.join(", ")),
            );
            return;
        };
        if self.route_node(found) == ON_CLUSTER {
            push(
                &route.referenced,
                "mirror.route",
                format!(
                    "route `{name}` goes to a Redis Cluster: mirroring a cluster route is not \
                     built yet (mirror a cluster as the whole upstream, docs/migration.md)"
                ),
            );
        }
    }
}

impl MirrorConfig {
    /// The whole file as the mirror's pool reads it: `upstream:` replaced by the mirror's, in
    /// the mirrored route's database (a route's writes carry no `SELECT`: its pool selects).
    pub(crate) fn as_upstream_of(&self, config: &Config) -> Config {
        let mut upstream = self.upstream.clone();
        if let Some((_, node)) = self.mirrored_node(config) {
            upstream.db = node.db;
        }
        Config {
            upstream,
            upstreams: Default::default(),
            routes: Vec::new(),
            mirror: None,
            ..config.clone()
        }
    }

    /// With routes, the router node whose writes are mirrored (its number in
    /// [`Config::route_nodes`]) and where it lives; `None` without routes (every write is
    /// mirrored) or when `route` names nothing (`mirror_problems` refuses that file).
    pub(crate) fn mirrored_node(&self, config: &Config) -> Option<(u16, RouteNode)> {
        let name = &self.route.as_ref()?.value;
        let nodes = config.route_nodes();
        if name == DEFAULT_ROUTE {
            return Some((0, nodes.into_iter().next()?));
        }
        let route = config.routes.iter().find(|r| r.name.value == *name)?;
        let node = config.route_node(route);
        Some((node, nodes.get(usize::from(node))?.clone()))
    }
}
