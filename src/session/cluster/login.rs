//! Cluster mode: a client logged in upstream as its own Redis user (`AUTH user pass`, `HELLO
//! 3 AUTH user pass`, forwarded to Redis rather than checked by the proxy) over every
//! primary.
//!
//! Redis checks a login per connection, and the nodes' shared connections are the proxy's
//! login. Standalone, the client's AUTH runs on its dedicated connection and every command
//! goes there. In a cluster that pinned the client to one node: keys of the others got
//! CROSSSLOT, so an application with its own ACL user could not use the cluster through the
//! proxy. Instead the login is sent on a connection of the session's own to every primary
//! (`ClusterLogin`), and the session's commands for a node go over its connection there
//! (`Routing::own_conn`, asked by `enqueue_to` and `send_shared`); it is also the session's
//! dedicated connection to that node (MULTI, WATCH, blocking commands, scripts:
//! `Session::own_dedicated`). Each runs what the client sends to that node's keys as the
//! client's user, as one connection would on one Redis; the session is not pinned.
//!
//! **All or nothing.** The first login opens the connections and sends each the command;
//! only when every node accepts it does the session switch to them. A refusal (WRONGPASS) is
//! the client's reply and changes nothing, as on one server. A login while logged in goes on
//! the same connections (the state the client holds on them stays): accepted or refused by
//! every node it is the client's reply; should the nodes disagree (their ACLs differ), the
//! client would be one user here and another there, so it gets the error and is disconnected.
//!
//! **Following the map.** A primary the map gains (a failover's promoted replica, a new
//! node) gets a login connection at the session's next command, once nothing is in flight:
//! the client's last accepted login is sent there again (`ClusterLogin::replay`, as a client
//! library logs in again on a new connection; `Prepare::LoginJoin`), and connections to
//! nodes no longer primaries are dropped. So a manual failover (the step of a rolling
//! upgrade) costs the client nothing; one command meeting Redis's MOVED before the proxy
//! has the new map is answered with an error (its redirection has no login connection to
//! go on yet), never run with the proxy's rights.
//!
//! **Fail closed.** A login connection to a primary that ends (its node failed, it was
//! killed) would leave that node's keys reachable only as the proxy's user: the client is
//! disconnected, as its one connection to Redis would have been. So is a client whose new
//! primary refuses the login or cannot be reached, or that holds state on a connection
//! (WATCH, MULTI, a blocking command, CLIENT NO-EVICT…) when the map changes, with an error
//! saying why. The end of a connection to a node no longer a primary costs nothing.
//!
//! **Every connection the user's.** The session's other connections to a node (shard
//! channels, keyspace notifications) are logged in as the user as they open
//! (`log_in_as_client`), and a new login goes on them too, so Redis checks the user's
//! channel rules on every node. A login on one connection only keeps both there
//! (`Session::own_login_on_one_node`): the other connections would be the pool's login.
//!
//! Not spread (the login stays on one node's dedicated connection, pinned, as before): a
//! login inside MULTI or from a session already holding state on a dedicated connection, a
//! client with CLIENT TRACKING on over every primary, routes, and a pool whose own login
//! Redis refuses (the client's AUTH then needs a raw connection). With replica reads
//! configured (`read_from`), a client logged in this way reads from the primaries: a
//! replica's shared connection is the pool's login.

use super::plan::{Gather, Login, LoginCommand};
use super::state::ClusterLogin;
use super::state::{NodeConn, Stock};
use super::tracking::{CONN_KIND, ask_every_or, primary_without};
use super::{ClusterSession, ClusterView};
use crate::protocol::answers::own_login_lost;
use crate::protocol::codec;
use crate::session::action::Action;
use crate::session::conn::Holds;
use crate::session::effect::Effect;
use crate::session::replies::with_client_id;
use crate::session::reply_queue::HelloOutcome;
use crate::session::route::Args;
use crate::topology::cluster::Router;
use bytes::Bytes;

/// The `conn_id` bits of the login connections: bit 61 alone, unlike every other kind's
/// (`tracking::CONN_KIND`), so no code takes their end for another connection's.
const LOGIN_CONN: u64 = 1 << 61;

/// Whether the connection id `id` (of a `Reply::PinnedClosed`) is a login connection's.
pub(in crate::session) fn is_login_conn(id: u64) -> bool {
    id & CONN_KIND == LOGIN_CONN
}

impl ClusterSession<'_> {
    /// Carries out a login command: the one reply the client gets.
    pub(in crate::session) async fn login_command(&mut self, command: LoginCommand) -> Bytes {
        match command {
            LoginCommand::Lost(reply) => {
                tracing::warn!(
                    id = self.client.id,
                    "a primary has no connection logged in as the client's user; the client is disconnected"
                );
                self.input.closing = true;
                reply
            }
            LoginCommand::Login(login) => {
                let options = login.options();
                let hello = login.hello;
                let spread = self.cluster.login.is_some();
                let reply = if spread {
                    self.login_again(login, options.as_ref()).await
                } else {
                    Box::pin(self.login_everywhere(login, options.as_ref())).await
                };
                let result = HelloOutcome::of_login(options.as_ref(), &reply);
                let (Some(proto), Some(options)) = (hello, options) else {
                    return reply;
                };
                if result == HelloOutcome::Accepted {
                    if let Some(login) = self.cluster.login.as_deref_mut() {
                        login.proto = proto;
                    }
                    self.client.set_proto(&self.ctx.client_list, proto);
                    self.conn.follow_proto(proto);
                    self.conns_follow_proto();
                }
                if result != HelloOutcome::Refused && options.name.is_some() {
                    self.client.set_name(&self.ctx.client_list, options.name);
                }
                match result {
                    HelloOutcome::Accepted => {
                        super::place::as_standalone(with_client_id(&reply, self.client.id))
                    }
                    _ => reply,
                }
            }
        }
    }

    /// The first login: a connection to every primary, each sent `login`; kept only when
    /// every node logged the client in (`HelloOutcome::of_login`; `options`: a HELLO's). A
    /// node's reply (the error when one refused, or when a HELLO logged in and then refused
    /// an option).
    async fn login_everywhere(
        &mut self,
        login: Login,
        options: Option<&crate::commands::grammar::HelloOptions>,
    ) -> Bytes {
        let (mut conns, checked) = match self.open_everywhere(LOGIN_CONN).await {
            Ok(opened) => opened,
            Err(reply) => return reply,
        };
        let senders: Vec<_> = conns.iter().map(|c| c.tx.clone()).collect();
        let replies = match ask_every_or(&senders, &login.command, own_login_lost).await {
            Ok(replies) => replies,
            // A node lost while logging in (the error says the connection closes).
            Err(reply) => {
                self.input.closing = true;
                return reply;
            }
        };
        if let Some(refused) = replies
            .iter()
            .find(|r| HelloOutcome::of_login(options, r) == HelloOutcome::Refused)
        {
            return refused.clone();
        }
        // Logged in as the client's user now, not as the proxy's script user.
        for conn in &mut conns {
            conn.confined = false;
        }
        let proto = self.client.proto;
        self.cluster.login = Some(Box::new(ClusterLogin {
            conns,
            proto,
            checked,
            replay: login,
        }));
        // A dedicated connection kept from a blocking command (not pinned: `login_route`)
        // is the pool's login; the next one is a login connection.
        self.conn.dedicated = None;
        // The error of a HELLO refused after its AUTH (logged in all the same), else any.
        let error = replies.iter().position(|r| r.first() == Some(&b'-'));
        replies
            .into_iter()
            .nth(error.unwrap_or(0))
            .unwrap_or_default()
    }

    /// A login while logged in: `login` on every login connection, whose state stays.
    /// Nodes that disagree (one accepts, another refuses) would leave the client two users:
    /// it gets the refusal and is disconnected.
    async fn login_again(
        &mut self,
        login: Login,
        options: Option<&crate::commands::grammar::HelloOptions>,
    ) -> Bytes {
        let Some(on) = self.cluster.login.as_deref() else {
            return own_login_lost("the cluster");
        };
        // The connections holding its shard channels and notifications are its user's too
        // (`log_in_as_client`): the next channel it subscribes there is the new user's.
        let shard = self.cluster.shard_subs().map(|s| s.conns());
        let keyspace = self.cluster.keyspace().map(|k| k.conns());
        let tracking = self.cluster.tracking.as_deref().map(|t| t.conns());
        let senders: Vec<_> = on
            .conns
            .iter()
            .map(|c| &c.tx)
            .chain(shard.into_iter().flatten())
            .chain(keyspace.into_iter().flatten())
            .chain(tracking.into_iter().flatten())
            .cloned()
            .collect();
        let replies = match ask_every_or(&senders, &login.command, own_login_lost).await {
            Ok(replies) => replies,
            Err(reply) => {
                self.input.closing = true;
                return reply;
            }
        };
        let refused = replies
            .iter()
            .filter(|r| HelloOutcome::of_login(options, r) == HelloOutcome::Refused)
            .count();
        if refused > 0 && refused < replies.len() {
            tracing::warn!(
                id = self.client.id,
                "the primaries disagree about the client's login; the client is disconnected"
            );
            self.input.closing = true;
        }
        if refused == 0
            && let Some(on) = self.cluster.login.as_deref_mut()
        {
            on.replay = login;
        }
        let first_refusal = replies.iter().find(|r| r.first() == Some(&b'-'));
        first_refusal
            .or(replies.first())
            .cloned()
            .unwrap_or_default()
    }

    /// The map gained `node` as a primary without a login connection there (a failover, a
    /// new node), and the session holds no state on a connection: a connection to it is
    /// opened and sent the client's last accepted login (`ClusterLogin::replay`), as a
    /// client library logs in again on a new connection; then the protocol the client
    /// speaks, should that login have been a HELLO of another version. The connections to
    /// nodes no longer primaries go (no command goes there now, and their later end, a
    /// restart of the demoted node, is then nothing to this session). Refused or
    /// unreachable, the client's reply says why and its connection closes: its commands for
    /// that node would otherwise run with the proxy's rights.
    pub(in crate::session) async fn login_join(&mut self, node: u16) -> Result<(), Bytes> {
        let router = self.cluster.router.clone();
        let c = &mut *self.cluster;
        c.own_starts += 1;
        let id = LOGIN_CONN | c.own_starts << 16;
        let push = self.push_target(id);
        // Logged in as the client by `open_node_conn` (`log_in_as_client`).
        let conn = self
            .open_node_conn(&router, node, id, push, Stock::Dial)
            .await?;
        let primaries: Vec<u16> = router.snapshot().primaries().to_vec();
        let Some(login) = self.cluster.login.as_deref_mut() else {
            return Err(own_login_lost(&router.addr(node)));
        };
        login.conns.retain(|c| primaries.contains(&c.node));
        login.conns.push(conn);
        // A dedicated connection kept from a blocking command may be one just dropped.
        self.conn.dedicated = None;
        tracing::info!(
            id = self.client.id,
            node = %router.addr(node),
            "logged the client in on a new primary"
        );
        Ok(())
    }

    /// A connection of the session's own just opened to `node` (a login connection for a
    /// new primary, a shard channel's, a keyspace notification's) while the client is logged
    /// in as its own user over every primary: logged in as that user too, by sending the
    /// client's last accepted login (`ClusterLogin::replay`), then the protocol the client
    /// speaks should that login have been a HELLO of another version. So no connection of
    /// the session runs with the proxy's rights. Nothing to do without such a login. Refused
    /// or lost, the client's error reply, and it is disconnected: a node that no longer
    /// takes its login is one it cannot use as itself.
    pub(super) async fn log_in_as_client(
        &mut self,
        router: &Router,
        node: u16,
        conn: &mut NodeConn,
    ) -> Result<(), Bytes> {
        let Some(login) = self.cluster.login.as_deref() else {
            return Ok(());
        };
        let (replay, proto) = (login.replay.clone(), login.proto);
        let addr = router.addr(node);
        let sender = std::slice::from_ref(&conn.tx);
        let options = replay.options();
        let mut ok = match ask_every_or(sender, &replay.command, own_login_lost).await {
            Ok(replies) => replies
                .iter()
                .all(|r| HelloOutcome::of_login(options.as_ref(), r) != HelloOutcome::Refused),
            Err(_) => false,
        };
        if ok && replay.hello.is_some_and(|spoken| spoken != proto) {
            let back = crate::upstream::hello_command(proto);
            ok = ask_every_or(sender, &back, own_login_lost)
                .await
                .is_ok_and(|replies| replies.iter().all(|r| r.first() != Some(&b'-')));
        }
        if !ok {
            tracing::warn!(
                id = self.client.id,
                node = %addr,
                "a node did not take the client's login on a new connection; the client is disconnected"
            );
            self.input.closing = true;
            return Err(own_login_lost(&addr));
        }
        conn.confined = false;
        Ok(())
    }

    /// A login connection ended: the client is disconnected (see the module comment). The
    /// end of one of an earlier login is nothing, and so is, for a session without state on
    /// a connection, the end of one to a node the map no longer has as a primary (its slots
    /// moved away, then it was removed).
    pub(in crate::session) fn login_ended(&mut self, id: u64) {
        let Some(node) = self
            .cluster
            .login
            .as_deref()
            .and_then(|l| l.conns.iter().find(|c| c.id == id))
            .map(|c| c.node)
        else {
            return;
        };
        // A node no longer a primary (demoted by a failover, then restarted or gone) runs
        // none of the session's commands now; without state on a connection, its end costs
        // nothing.
        let primary = self.cluster.router.snapshot().primaries().contains(&node);
        if !primary && !self.stateful() {
            if let Some(login) = self.cluster.login.as_deref_mut() {
                login.conns.retain(|c| c.id != id);
            }
            return;
        }
        tracing::warn!(
            id = self.client.id,
            "a connection logged in as the client's user ended; the client is disconnected"
        );
        self.input.closing = true;
    }
}

impl ClusterView<'_> {
    /// Whether the client is logged in upstream as its own user: on its dedicated connection
    /// (`Holds::OTHER_USER`) or over every primary (`ClusterLogin`). The proxy's own
    /// per-node connections (shard channels, keyspace notifications, tracking) would run
    /// with the pool's rights, not the user's.
    pub(in crate::session) fn own_login(&self) -> bool {
        self.conn.holds(Holds::OTHER_USER) || self.cluster.login.is_some()
    }

    /// Hook in `place`, after the policy: the client's own login becomes `Gather::Login`
    /// where it can be spread over every primary (see the module comment), and so does
    /// every login while spread. Also where a map that gained a primary without a login
    /// connection is noticed. `None`: nothing to do here.
    pub(in crate::session) fn login_route(
        &self,
        router: &Router,
        action: &Action,
        args: &Args<'_>,
    ) -> Option<Action> {
        let on = self.cluster.login.as_deref();
        let gather = |command| Some(Action::Gather(Box::new(Gather::Login(command))));
        if let Some(node) = on.and_then(|l| primary_without(router, &l.conns, &l.checked)) {
            // State on a connection (WATCH, MULTI, a blocking command, CLIENT NO-EVICT…)
            // may be on a node that is no longer a primary: that cannot follow the map.
            if self.stateful() {
                return gather(LoginCommand::Lost(own_login_lost(&router.addr(node))));
            }
            return Some(Action::Prepare(Box::new(super::plan::Prepare::LoginJoin(
                node,
            ))));
        }
        let (_, effect, rewrite) = action.forwarded()?;
        let hello = match effect {
            Effect::Auth => None,
            Effect::AuthHello(proto) => Some(proto),
            _ => return None,
        };
        let command = match rewrite.and_then(|r| r.command.as_ref()) {
            Some(frame) => frame.clone(),
            None => codec::encode(&args.iter().collect::<Vec<_>>()),
        };
        if on.is_some() {
            // Queued, it would run at EXEC on the transaction's node only.
            if self.conn.in_multi() {
                return Some(Action::Refused(
                    crate::protocol::answers::own_login_in_multi(),
                ));
            }
            return gather(LoginCommand::Login(Login { command, hello }));
        }
        let tracking = self.cluster.tracking.is_some();
        // With `read_from` other than `primary` the session reads from the primaries, over
        // its login connections (`may_read_replica`): a replica's are the pool's login.
        let spreads = router.routes().is_none()
            && !self.stateful()
            && !tracking
            && !self.ctx.pool.credentials_refused();
        spreads.then(|| gather(LoginCommand::Login(Login { command, hello })))?
    }

    /// Whether the client is logged in as its own user on one connection only (its
    /// dedicated one, `Holds::OTHER_USER`: not spread, see the module comment). The
    /// session's other connections would then be the proxy's login, so what needs one per
    /// node (shard channels, keyspace notifications) stays on that connection. A login
    /// spread over every primary logs in each such connection as well.
    pub(in crate::session) fn own_login_on_one_node(&self) -> bool {
        self.conn.holds(Holds::OTHER_USER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_connection_ids_are_told_from_the_others() {
        assert!(is_login_conn(LOGIN_CONN | 5 << 16 | 2));
        // Shard (1 << 63), keyspace (3 << 62), tracking (5 << 61), listener (7 << 61).
        for other in [1 << 63, 3 << 62, 5 << 61, 7 << 61, 3] {
            assert!(!is_login_conn(other | 1), "{other:x}");
        }
        assert!(!super::super::tracking::is_tracking_conn(LOGIN_CONN | 1));
        assert!(!super::super::keyspace::is_keyspace_conn(LOGIN_CONN | 1));
        assert!(!super::super::tracking::is_listener_conn(LOGIN_CONN | 1));
    }
}
