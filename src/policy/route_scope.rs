//! Rules scoped to routes (`routes: [cache]` on a rule, like `tenants:`): a rule applies to
//! a command when one of its keys belongs to one of the rule's routes. A keyless command
//! counts as every route's: the whole-keyspace ones (KEYS, FLUSHALL, SCAN) walk them all,
//! and a rule meant for a route must not be stepped around by leaving the key out.

use super::{Client, CommandLine, Kind, Policy, Problems, Rule, RuleConfig};
use crate::commands;
use crate::topology::routes::RouteTable;

/// `routes:` of a rule as a set by route index; `None`: every route.
pub(super) fn route_set(
    rc: &RuleConfig,
    kind: &Kind,
    table: Option<&RouteTable>,
    out: &mut Problems<'_>,
) -> Option<Vec<bool>> {
    let names = rc.routes.as_ref()?;
    let line = out.line;
    let Some(table) = table else {
        out.push(
            "routes",
            line,
            "names routes, but the config has no `routes:` section".into(),
        );
        return None;
    };
    if matches!(kind, Kind::SharedRateLimit { .. }) {
        out.push(
            "routes",
            line,
            "cannot scope a `backend: redis` rate limit (it counts on the default route's \
             server for every route); use `backend: local` or drop `routes:`"
                .into(),
        );
        return None;
    }
    let mut set = vec![false; table.names().len()];
    for name in names {
        match table.index(name) {
            Some(i) => set[usize::from(i)] = true,
            None => out.push(
                "routes",
                line,
                format!("no route `{name}` (routes: {})", table.names().join(", ")),
            ),
        }
    }
    Some(set)
}

impl Policy {
    /// Whether `rule` applies to the command in `line` by its routes: always for a rule
    /// without `routes:`; else when a key (as `client` names it, before its namespace) is in
    /// one of them, or the command has no keys.
    pub(super) fn in_scope<L: CommandLine + ?Sized>(
        &self,
        rule: &Rule,
        client: &Client,
        line: &L,
    ) -> bool {
        let (Some(set), Some(table)) = (&rule.routes, &self.route_table) else {
            return true;
        };
        // Only scoped rules get here: the argument list is built for them alone.
        let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
        let mut keys = commands::KeyPositions::with_capacity(0);
        if commands::keys_into(&args, &mut keys).is_err() || keys.indices().next().is_none() {
            return true;
        }
        let namespace = self.access.namespace(client.tenant);
        keys.indices().any(|i| {
            let route = table.route_of_client_key(namespace, args[i]);
            set.get(usize::from(route)).copied().unwrap_or(false)
        })
    }
}
