//! Cluster placement: the node a forwarded command goes to (the slot of its keys, a replica
//! for a plain read, the node a pinned session is on), and what the proxy answers itself
//! because a cluster cannot run it as one Redis would (CLUSTER, SELECT n, a MULTI deferred to
//! its first key, keys in several slots). Runs in `decide`, before anything is sent.

use super::ClusterView;
use super::gather::split;
use super::state::OwnConn;
use crate::commands::{CommandSpec, KeyPositions};
use crate::config::ReadFrom;
use crate::protocol::answers::CrossSlotWhy;
use crate::protocol::codec::Decoded;
use crate::protocol::{answers, codec};
use crate::session::action::{Action, Decision};
use crate::session::client_ids::Upstream;
use crate::session::conn::{Holds, Target};
use crate::session::effect::{Effect, LocalEffect};
use crate::session::replica_reads::replica_may_serve;
use crate::session::route::Args;
use crate::topology::cluster::{Router, slot};
use bytes::Bytes;

/// The most keyless commands a deferred MULTI holds before a key names its node: a bound
/// on the proxy's memory for a transaction of PINGs (`Session::holds_keyless`).
const HELD_IN_MULTI: usize = 64;

/// Commands of classic (not sharded) pub/sub, which all go to `Router::pubsub_node`: the
/// subscribers are there, so `PUBSUB CHANNELS/NUMSUB/NUMPAT` count them there.
const CLASSIC_PUBSUB: [&str; 6] = [
    "subscribe",
    "psubscribe",
    "publish",
    "pubsub|channels",
    "pubsub|numsub",
    "pubsub|numpat",
];

impl ClusterView<'_> {
    /// Cluster mode: picks the node for a forwarded command, or answers what a cluster cannot
    /// run as one Redis would (keys in several slots, cluster-only commands, SELECT n).
    /// Runs after the policy, on the command as rewritten, because a namespace prefix changes
    /// a key's slot. `spec` and `queued` (the target of the run not sent yet) decide whether
    /// a read may go to a replica.
    pub(in crate::session) fn place(
        &self,
        action: Action,
        args: &Args<'_>,
        spec: Option<&'static CommandSpec>,
        queued: Option<Target>,
    ) -> Decision {
        let router = &*self.cluster.router;
        // The common case first: a keyed command the policy left alone, from a session with
        // none of the state the checks below look at, goes to its slot's node. Each check
        // below is a no-op for it (they concern keyless commands, effects or that state);
        // skipping them is a fifth of cluster mode's instructions per command at `-P 16`
        // (docs/performance.md). Anything else (keyless, keys in several slots) takes the
        // full path with the slot already found.
        let known = if self.places_plainly(router, &action) && !super::sort::is_sort(spec) {
            match self.key_slot(router, args, None, spec) {
                Ok(Some(slot)) => {
                    let action = self.place_on_node(router, action, Some(slot), spec, queued);
                    return Decision {
                        action,
                        hash_slot: Some(slot),
                    };
                }
                other => Some(other),
            }
        } else {
            None
        };
        self.monitor_stops(&action);
        // Each command that goes upstream passes `caching_next` (a pending CLIENT CACHING).
        if let Some(answer) = self.shard_route(&action, args) {
            return self.caching_next(answer.into(), args);
        }
        if let Some(answer) = self.tracking_route(router, &action, args) {
            return answer.into();
        }
        if let Some(answer) = self.login_route(router, &action, args) {
            return answer.into();
        }
        let Some((target, effect, rewrite)) = action.forwarded() else {
            return action.into();
        };
        if let Some(answer) = self.cluster_command(args, effect, rewrite) {
            return answer.into();
        }
        // SORT with patterns naming other keys, which a node refuses: gathered (`sort`).
        // Not with routes: each route is one Redis, which reads the patterns itself.
        if super::sort::is_sort(spec)
            && router.routes().is_none()
            && !self.conn.in_multi()
            && matches!(target, Target::Shared(..))
            && let Some(sort) = super::sort::plan(args, rewrite)
        {
            return self.caching_next(
                Action::Gather(Box::new(super::plan::Gather::Sort(sort))).into(),
                args,
            );
        }
        let rewritten = rewrite.and_then(|r| r.command.as_ref());
        let slot = match known.unwrap_or_else(|| self.key_slot(router, args, rewritten, spec)) {
            Ok(slot) => slot,
            Err((a, b)) => {
                // XREAD … BLOCK blocks on connections of its own (`blocking_read`), which
                // carry the pool's login: not for a client logged in as its own user or
                // tracking its reads over its own connections, nor where a pinned session's
                // state must stay on one node.
                let blocking = match effect {
                    Effect::Blocking(wait)
                        if !self.conn.in_multi()
                            && !self.pinned()
                            && self.cluster.login.is_none()
                            && self.cluster.tracking.is_none() =>
                    {
                        Some(wait)
                    }
                    _ => None,
                };
                let split = split(router, args, rewrite, self.doubles(), blocking);
                let why = match split {
                    // EXEC's reply would hold the part of one node only, and a pinned
                    // session's state lives on one node.
                    Some(split)
                        if !self.conn.in_multi()
                            && (matches!(target, Target::Shared(..)) || blocking.is_some()) =>
                    {
                        return self.caching_next(split.into(), args);
                    }
                    Some(_) if self.conn.in_multi() => CrossSlotWhy::InTransaction,
                    Some(_) => CrossSlotWhy::Pinned,
                    _ if spec.is_some_and(CommandSpec::is_write) => CrossSlotWhy::Writes,
                    _ => CrossSlotWhy::Together,
                };
                return Action::Refused(cross_command(router, a, b, spec, why)).into();
            }
        };
        let action = self.place_on_node(router, action, slot, spec, queued);
        let decision = Decision {
            action: self.monitor_route(router, self.keyspace_route(router, action, args)),
            hash_slot: slot,
        };
        self.caching_next(decision, args)
    }

    /// Whether `place` may skip to the node of the command's slot: a plain forward (no
    /// effect, not rewritten) from a session without cluster tracking, a login over every
    /// primary, shard subscriptions or routes (whose slot lookup counts commands per route).
    /// For a keyed command every check it skips then returns without an answer:
    /// `shard_route` (SSUBSCRIBE, or shard subscriptions), `tracking_route` (tracking, or
    /// CLIENT), `login_route` (a login, or AUTH/HELLO), `cluster_command` (effects, and
    /// keyless commands by name), `keyspace_route` (SUBSCRIBE effects), `caching_next`
    /// (tracking).
    fn places_plainly(&self, router: &Router, action: &Action) -> bool {
        matches!(
            action,
            Action::Forward {
                effect: Effect::None,
                ..
            }
        ) && router.routes().is_none()
            && self.cluster.tracking.is_none()
            && self.cluster.login.is_none()
            && self.cluster.shard_subs.is_none()
    }

    /// The node a forwarded command whose keys hash to `slot` (`None`: keyless) goes to, and
    /// through which connection; or the refusal when the session's state forbids it.
    fn place_on_node(
        &self,
        router: &Router,
        action: Action,
        slot: Option<u16>,
        spec: Option<&'static CommandSpec>,
        queued: Option<Target>,
    ) -> Action {
        let Some((target, effect, rewrite)) = action.forwarded() else {
            return action;
        };
        if slot.is_none()
            && matches!(target, Target::Dedicated(_))
            && effect == Effect::None
            && rewrite.is_none()
            && self.holds_keyless()
        {
            return Action::Local(answers::queued(), LocalEffect::HoldInMulti);
        }
        let multi_slot = self.cluster.multi_slot;
        let snapshot = self.cluster.map();
        let node = match slot {
            Some(s) => snapshot.owner(s),
            // Keyless: stay where the session already is, so it need not wait for a switch.
            None => match (target, self.queue.inflight_target, &self.conn.dedicated) {
                // The node of the connection it names (`toward_named`).
                (Target::Shared(_, n), ..) if effect == Effect::NamesClient => Some(n),
                (Target::Dedicated(n), ..) if effect == Effect::TracksToClient => Some(n),
                (Target::Dedicated(_), _, Some(d)) => Some(d.node),
                // Not on a replica, though: a keyless command may write (EVAL with no keys).
                (Target::Shared(..), Some(Target::Shared(_, n)), _)
                    if router.read_from() == ReadFrom::Primary || snapshot.is_primary(n) =>
                {
                    Some(n)
                }
                _ if spec.is_some_and(|s| CLASSIC_PUBSUB.contains(&s.name)) => router.pubsub_node(),
                _ => router.keyless(self.client.id),
            },
        };
        let Some(node) = node else {
            router.refresh_soon();
            return Action::Refused(answers::clusterdown());
        };
        let target = match target {
            Target::Shared(proto, _) => {
                let replica = match slot {
                    // A slot with commands in flight (on its primary) is read there too: the
                    // read must see them, and elsewhere it would wait for them. (Asked second:
                    // with reads from primaries only, the default, `may_read_replica` is one
                    // comparison and the in-flight map is not looked up.)
                    Some(s)
                        if self.may_read_replica(router, spec, rewrite, queued, proto, node)
                            && !self.cluster.spread.in_flight(s) =>
                    {
                        router.read_node(&snapshot, s, proto, self.client.id)
                    }
                    _ => None,
                };
                Target::Shared(proto, replica.unwrap_or(node))
            }
            Target::Dedicated(_) => match self.conn.dedicated.as_ref().filter(|_| self.pinned()) {
                // A transaction's keys must share one slot (Redis answers EXEC with CROSSSLOT
                // otherwise): refused while queuing, so EXEC aborts and nothing runs.
                _ if self.conn.in_multi()
                    && slot.is_some()
                    && ![None, slot].contains(&multi_slot) =>
                {
                    return Action::Refused(cross(router, multi_slot, slot));
                }
                // The transaction's slot stays with the node holding the transaction even
                // when the map says it moved: that node answers with a redirection, and EXEC
                // replays the whole transaction on the new owner (`transaction`).
                Some(d) if self.conn.in_multi() && slot.is_some() && slot == multi_slot => {
                    Target::Dedicated(d.node)
                }
                // A pinned session's state lives on one node; a key elsewhere cannot join it.
                Some(d) if slot.is_some() && d.node != node => {
                    return Action::Refused(cross_nodes(router, d.node, node));
                }
                Some(d) => Target::Dedicated(d.node),
                None => Target::Dedicated(node),
            },
        };
        action.retarget(target)
    }

    /// Whether a plain keyless command queued now in a transaction is held by the proxy
    /// (`ClusterState::held_in_multi`): MULTI is still deferred, no other state pins the session to a
    /// node, and fewer than `HELD_IN_MULTI` are held (past it, they go to the client's home
    /// node, which then runs the transaction: the proxy's memory stays bounded).
    fn holds_keyless(&self) -> bool {
        self.conn.multi_deferred() && !self.pinned() && self.held_in_multi() < HELD_IN_MULTI
    }

    /// How many keyless commands the deferred MULTI holds (`ClusterState::held_in_multi`).
    fn held_in_multi(&self) -> usize {
        self.cluster.held_in_multi.len()
    }

    /// Where a CLIENT command sent to `target` that names another client's dedicated
    /// connection `named` must go for Redis to find that connection, which only its own node
    /// knows (ids are per node), and the effect that keeps it there: CLIENT UNBLOCK to that
    /// node, from any connection (`Effect::NamesClient`); CLIENT TRACKING … REDIRECT on this
    /// session's dedicated connection to that node (`Effect::TracksToClient`: Redis redirects
    /// invalidations only to a client of its own), which a session not pinned yet opens
    /// there. `None` for a session pinned to another node: it cannot name that connection,
    /// and Redis is to answer as for a client that is not there.
    pub(in crate::session) fn toward_named(
        &self,
        named: Upstream,
        target: Target,
    ) -> Option<(Target, Effect)> {
        match target {
            Target::Shared(proto, _) => {
                Some((Target::Shared(proto, named.node), Effect::NamesClient))
            }
            Target::Dedicated(_) => match &self.conn.dedicated {
                Some(d) if self.pinned() && d.node != named.node => None,
                _ => Some((Target::Dedicated(named.node), Effect::TracksToClient)),
            },
        }
    }

    /// Whether a command for the shared connection may be served by a replica of its slot's
    /// shard (`primary` is the slot's primary). Only plain reads qualify: read-only in the
    /// command table, not blocking, not a script (scripts are loaded on primaries only, so
    /// EVALSHA_RO would loop on NOSCRIPT), without hidden commands from the policy, and never
    /// inside MULTI (a transaction runs on the primary) — pinned sessions do not use the
    /// shared connection at all. A read that follows commands still queued or in flight on
    /// its primary stays with them: a pipelined write then read of one key reads the write,
    /// and the session does not pause to switch nodes. Nor a session whose commands go over
    /// connections of its own (its own login, default-mode tracking: `Routing::own_conn`):
    /// a replica's shared connection is the pool's login, and its reads are not tracked
    /// there, so it reads from the primaries.
    fn may_read_replica(
        &self,
        router: &Router,
        spec: Option<&'static CommandSpec>,
        rewrite: Option<&crate::policy::rewrite::Rewrite>,
        queued: Option<Target>,
        proto: u8,
        primary: u16,
    ) -> bool {
        router.read_from() != ReadFrom::Primary
            && matches!(self.cluster.own_conn(primary), OwnConn::Any)
            && replica_may_serve(
                self.conn,
                self.queue,
                spec,
                rewrite,
                queued,
                Target::Shared(proto, primary),
            )
    }

    /// Commands a cluster cannot take as they are: `Some(answer)` for those.
    fn cluster_command(
        &self,
        args: &Args<'_>,
        effect: Effect,
        rewrite: Option<&crate::policy::rewrite::Rewrite>,
    ) -> Option<Action> {
        if let Some(answer) = self.transaction_answer(args, effect) {
            return Some(answer);
        }
        if let Some(answer) = self.cluster_only_answer(args, rewrite) {
            return Some(answer);
        }
        if self.conn.in_multi()
            && let Some(own) = super::gather::mixes_node_own_config(args)
        {
            // EXEC's element would be one node's answer to both halves.
            return Some(Action::Refused(answers::config_set_mixes_node_own(own)));
        }
        let merge = self.fanout_merge(args, effect)?;
        if merge.runs_after_exec() && self.conn.in_multi() {
            // Queued on the transaction's node like any keyless command; the other primaries
            // get it once EXEC ran it there, and its element of EXEC's reply is merged with
            // theirs (`transaction::spread_after_exec`). Not for a client logged in as its
            // own user on one node: they would run it as the proxy.
            if self.conn.holds(Holds::OTHER_USER) {
                return Some(Action::Refused(answers::fanout_own_login(args.get(0))));
            }
            return None;
        }
        Some(self.fanout_action(args, effect, rewrite, merge))
    }

    /// What the session answers itself about its own state before anything reaches a node:
    /// SELECT n, and MULTI (answered here, sent later with the first queued command, whose
    /// keys name the node) with the EXEC/DISCARD of a transaction that never reached one.
    fn transaction_answer(&self, args: &Args<'_>, effect: Effect) -> Option<Action> {
        match effect {
            Effect::Select(db) if db != 0 => Some(Action::Local(
                match self.cluster.router.routes() {
                    Some(_) => answers::select_with_routes(),
                    None => answers::select_in_cluster(),
                },
                LocalEffect::None,
            )),
            Effect::Multi if !self.conn.in_multi() => {
                Some(Action::Local(answers::ok(), LocalEffect::DeferMulti))
            }
            Effect::Multi if self.conn.multi_deferred() => {
                Some(Action::Local(answers::nested_multi(), LocalEffect::None))
            }
            // EXEC of a transaction that reached no node yet runs on the client's home node:
            // MULTI, the held keyless commands, EXEC. With none held the node runs an empty
            // transaction, which changes nothing but is what one Redis shows its MONITOR
            // clients (`multi`, `exec`) and counts in its statistics; a spoiled one
            // (`Effect::AbortExec`) sends no held command and is answered EXECABORT
            // (`Forwarder::outgoing`).
            Effect::EndMulti | Effect::AbortExec
                if self.conn.multi_deferred() && args.get(0).eq_ignore_ascii_case(b"EXEC") =>
            {
                None
            }
            // DISCARD of a deferred MULTI, answered here; with a WATCH on the connection it
            // goes there (it also forgets the watched keys).
            Effect::EndMulti if self.conn.multi_deferred() && !self.conn.holds(Holds::WATCH) => {
                Some(Action::Local(answers::ok(), LocalEffect::EndMulti))
            }
            _ => None,
        }
    }

    /// Commands about the cluster itself, which the proxy hides (to its clients it is one
    /// server), and SCAN, which walks every primary with a composite cursor.
    fn cluster_only_answer(
        &self,
        args: &Args<'_>,
        rewrite: Option<&crate::policy::rewrite::Rewrite>,
    ) -> Option<Action> {
        let name = args.get(0);
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        let routes = self.cluster.router.routes().is_some();
        if is("CLUSTER") {
            // Routes front standalone servers, which answer every CLUSTER command so.
            if args.len() == 3 && args.get(1).eq_ignore_ascii_case(b"KEYSLOT") && !routes {
                let reply = answers::integer(i64::from(slot(args.get(2))));
                return Some(Action::Local(reply, LocalEffect::None));
            }
            return Some(Action::Local(
                answers::cluster_disabled(),
                LocalEffect::None,
            ));
        }
        if is("READONLY") || is("READWRITE") || is("ASKING") {
            return Some(Action::Local(
                answers::cluster_disabled(),
                LocalEffect::None,
            ));
        }
        if is("SCAN") {
            return Some(self.decide_scan(args, rewrite));
        }
        None
    }

    /// The one slot of the command's keys: `Ok(None)` for a command without keys (or one the
    /// table cannot read keys from: the node answers it, with MOVED followed if need be),
    /// `Err` with two of the slots when keys are in several. In routes mode a slot is a
    /// route's node, classic pub/sub channels count as keys (a channel is its route's), and
    /// the command is counted on the route of its first key.
    fn key_slot(
        &self,
        router: &Router,
        args: &Args<'_>,
        rewritten: Option<&Bytes>,
        spec: Option<&'static CommandSpec>,
    ) -> Result<Option<u16>, (Option<u16>, Option<u16>)> {
        // One key, the first argument (GET, SET, HSET…): its slot, without the general key
        // search. Routes count commands per route in `slot_of_keys`, so they take it.
        if rewritten.is_none()
            && router.routes().is_none()
            && spec.is_some_and(|s| s.only_key_is_first(args.len()) && s.arity_accepts(args.len()))
        {
            return Ok(Some(slot(args.get(1))));
        }
        let mut ranges = Vec::new();
        let decoded = match rewritten {
            Some(frame) => match codec::decode(frame, &self.ctx.codec, &mut ranges) {
                Ok(Some(Decoded::Command { .. })) => Some(frame),
                _ => None,
            },
            None => None,
        };
        // The command as decided (`spec`) unless the policy rewrote it.
        let spec = if decoded.is_none() { spec } else { None };
        match decoded {
            Some(frame) => with_argv(
                ranges.len(),
                ranges.iter().map(|r| &frame[r.clone()]),
                |argv| slot_of_keys(router, argv, spec),
            ),
            None => with_argv(args.len(), args.iter(), |argv| {
                slot_of_keys(router, argv, spec)
            }),
        }
    }

    /// The slot of `key` as stored, as the session's router places it: its hash slot, or its
    /// route's node in routes mode.
    pub(in crate::session) fn key_place(&self, key: &[u8]) -> u16 {
        self.cluster.router.slot_of(key)
    }

    /// The refusal of keys placed in `a` and `b` (see [`cross`]).
    pub(in crate::session) fn cross_places(&self, a: u16, b: u16) -> Bytes {
        cross(&self.cluster.router, Some(a), Some(b))
    }
}

/// The arguments of a command as one slice, on the stack for a command of up to `SHORT`
/// arguments: `key_slot` runs for every command in cluster mode, where a `Vec` of them was
/// one of its three allocations per command.
fn with_argv<'a, R>(
    n: usize,
    args: impl Iterator<Item = &'a [u8]>,
    f: impl FnOnce(&[&'a [u8]]) -> R,
) -> R {
    const SHORT: usize = 8;
    if n <= SHORT {
        let mut argv: [&[u8]; SHORT] = [&[]; SHORT];
        for (to, arg) in argv.iter_mut().zip(args) {
            *to = arg;
        }
        f(&argv[..n])
    } else {
        let argv: Vec<&[u8]> = args.collect();
        f(&argv)
    }
}

thread_local! {
    /// The key positions `slot_of_keys` fills, reused: one per thread rather than one
    /// allocation per command (no await runs while it is borrowed).
    static KEYS: std::cell::RefCell<KeyPositions> =
        std::cell::RefCell::new(KeyPositions::with_capacity(4));
}

/// The one slot of the keys of `argv` (see `Session::key_slot`); `spec` is its command when
/// known, else it is looked up.
fn slot_of_keys(
    router: &Router,
    argv: &[&[u8]],
    spec: Option<&'static CommandSpec>,
) -> Result<Option<u16>, (Option<u16>, Option<u16>)> {
    let routes = router.routes();
    let mut found = None;
    let mut place = |i: usize| {
        let s = match routes {
            Some(table) => {
                let key = channel_literal(argv[0], argv[i]);
                let route = table.route_of(key);
                if found.is_none() {
                    table.count(route);
                }
                router.route_slot(route, key)
            }
            None => slot(argv[i]),
        };
        match found {
            None => found = Some(s),
            Some(f) if f != s => return Err((Some(f), Some(s))),
            Some(_) => {}
        }
        Ok(())
    };
    let channels = channel_positions(argv, routes.is_some());
    if !channels.is_empty() {
        for i in channels {
            place(i)?;
        }
    } else {
        let listed = KEYS.with_borrow_mut(|keys| -> Result<bool, (Option<u16>, Option<u16>)> {
            let read = match spec {
                Some(spec) => spec.keys_into(argv, keys).is_ok(),
                None => crate::commands::keys_into(argv, keys).is_ok(),
            };
            if !read {
                return Ok(false);
            }
            for i in keys.indices() {
                place(i)?;
            }
            Ok(true)
        })?;
        if !listed {
            return Ok(None);
        }
    }
    if found.is_none()
        && let Some(table) = routes
    {
        table.count(0);
    }
    Ok(found)
}

/// The refusal of keys in two slots `a` and `b`: Redis Cluster's CROSSSLOT, or in routes
/// mode (unless both are slots of the cluster route) the routes they belong to, named.
pub(super) fn cross(router: &Router, a: Option<u16>, b: Option<u16>) -> Bytes {
    match routes_apart(router, a, b) {
        Some((first, second)) => answers::crossroute(&first, &second),
        None => answers::crossslot(),
    }
}

/// [`cross`] for a command the proxy could not split or gather (`why`): CROSSSLOT then says
/// why `spec`'s command cannot span slots and how to put its keys in one.
fn cross_command(
    router: &Router,
    a: Option<u16>,
    b: Option<u16>,
    spec: Option<&CommandSpec>,
    why: CrossSlotWhy,
) -> Bytes {
    match (routes_apart(router, a, b), spec) {
        (Some((first, second)), _) => answers::crossroute(&first, &second),
        (None, Some(spec)) => answers::crossslot_for(spec.name, why),
        (None, None) => answers::crossslot(),
    }
}

/// In routes mode, the names of the routes of slots `a` and `b` when they differ; `None`
/// when they are two slots of one cluster route (Redis Cluster's own CROSSSLOT then).
fn routes_apart(router: &Router, a: Option<u16>, b: Option<u16>) -> Option<(String, String)> {
    let (a, b) = (a?, b?);
    let (first, second) = (router.route_names(a), router.route_names(b));
    (router.routes().is_some() && first != second).then_some((first, second))
}

/// [`cross`] for keys on nodes `a` and `b` (a pinned session's node and a key's).
fn cross_nodes(router: &Router, a: u16, b: u16) -> Bytes {
    let (first, second) = (router.node_route_names(a), router.node_route_names(b));
    if router.routes().is_none() || first == second {
        return answers::crossslot();
    }
    answers::crossroute(&first, &second)
}

/// Where the arguments that place a command are when they are not the command table's keys:
/// the shard channels of SSUBSCRIBE, SUNSUBSCRIBE and SPUBLISH (Redis routes them by slot),
/// and in routes mode the channels of SUBSCRIBE, PSUBSCRIBE and PUBLISH (a channel goes to
/// its route's server, where its subscribers are). Unsubscribing goes wherever the
/// subscriptions are, so it is placed as a keyless command.
fn channel_positions(argv: &[&[u8]], routes: bool) -> std::ops::Range<usize> {
    let name = argv[0];
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    if is(b"SSUBSCRIBE")
        || is(b"SUNSUBSCRIBE")
        || (routes && (is(b"SUBSCRIBE") || is(b"PSUBSCRIBE")))
    {
        1..argv.len()
    } else if (is(b"SPUBLISH") || (routes && is(b"PUBLISH"))) && argv.len() > 1 {
        1..2
    } else {
        0..0
    }
}

/// The part of argument `arg` of command `name` a route is chosen by: a PSUBSCRIBE pattern's
/// literal start (`events:*` is `events:`'s), any other argument whole.
fn channel_literal<'a>(name: &[u8], arg: &'a [u8]) -> &'a [u8] {
    if !name.eq_ignore_ascii_case(b"PSUBSCRIBE") {
        return arg;
    }
    let end = arg
        .iter()
        .position(|b| matches!(b, b'*' | b'?' | b'[' | b'\\'))
        .unwrap_or(arg.len());
    &arg[..end]
}

/// The upstream's HELLO reply with `mode` saying `standalone`: to the client the proxy is one
/// server, and a client that switched to cluster mode on seeing `cluster` would then ask for
/// `CLUSTER SLOTS` and be refused.
pub(in crate::session) fn as_standalone(hello: Bytes) -> Bytes {
    const CLUSTER: &[u8] = b"$4\r\nmode\r\n$7\r\ncluster\r\n";
    match memchr::memmem::find(&hello, CLUSTER) {
        None => hello,
        Some(at) => [
            &hello[..at],
            b"$4\r\nmode\r\n$10\r\nstandalone\r\n",
            &hello[at + CLUSTER.len()..],
        ]
        .concat()
        .into(),
    }
}
