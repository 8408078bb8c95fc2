//! `CLIENT TRACKING … REDIRECT <id>` to a client that has no dedicated connection yet.
//!
//! Redis accepts any live client id as a redirect target and sends that client the
//! invalidations: as RESP3 pushes, or to a RESP2 client that is subscribed, as messages on
//! `__redis__:invalidate`. Through the proxy a client reaches Redis only through its own
//! dedicated connection (the shared ones carry every client's commands, so an invalidation
//! sent there belongs to nobody), and a client that never needed one has no upstream id for
//! the redirect to name. So the caller's session asks the target's session for one: it puts
//! a request in the target's `client_list::Live` and wakes the sessions through the idle tick;
//! the target's session opens its dedicated connection (in its own RESP version, on its
//! tenant's share, mapped in `client_ids`) without answering anything to its client, and
//! hands back Redis's id of it; the caller then sends its TRACKING naming that id. The target
//! keeps the connection for as long as its session lives, as a client that ran a blocking
//! command does, and pushes arriving on it reach the client like any other.
//!
//! In front of a Redis Cluster the target is asked for more: a connection on every primary
//! where it has none (`cluster::tracking`, `listen_everywhere`), as Redis sends a redirected
//! invalidation only to a connection on the key's node; the answer is then 0, and the caller
//! names each node's connection.
//!
//! Only a client of the caller's tenant is asked (`client_list::ClientList::summon`), and
//! the wait is bounded (`dedicated_wait_ms` plus the connect timeout): a target that cannot
//! open a connection, or does not answer in time, gives the caller an error saying so.

use super::Session;
use super::action::Lone;
use super::action::Summon;
use super::effect::Effect;
use crate::policy::rewrite::Rewrite;
use crate::protocol::answers;
use crate::upstream::Expect;

impl Session {
    /// Caller side: asks the target for its upstream id, then forwards the TRACKING command
    /// (occupying the first `len` bytes of the read buffer) naming it; on failure, answers
    /// the command with an error instead. Returns `false` when processing must pause.
    pub(super) async fn summon(&mut self, summon: Summon, lone: Lone) -> bool {
        let len = lone.len;
        let ctx = self.ctx.clone();
        let asked = ctx
            .client_list
            .summon(summon.client, self.client.tenant, &ctx.idle_tick);
        let wait = ctx.dedicated_caps.2 + ctx.pool.connect_timeout();
        let upstream = match asked {
            // Gone meanwhile: an id no connection has, so Redis answers as for any client
            // that is not there.
            None => Ok(i64::MAX as u64),
            Some(rx) => match tokio::time::timeout(wait, rx).await {
                Ok(Ok(Ok(id))) => Ok(id),
                Ok(Ok(Err(why))) => Err(why),
                Ok(Err(_)) => Ok(i64::MAX as u64),
                Err(_) => Err(format!("it did not answer within {} ms", wait.as_millis())),
            },
        };
        let upstream = match upstream {
            Ok(id) => id.to_string(),
            Err(why) => {
                self.answer_local(
                    len,
                    answers::redirect_target_unreachable(summon.client, &why),
                    super::effect::LocalEffect::None,
                );
                return true;
            }
        };
        let mut parts: Vec<&[u8]> = summon.args.iter().map(|a| &a[..]).collect();
        parts[summon.at] = upstream.as_bytes();
        let rewrite = Rewrite {
            command: Some(crate::protocol::codec::encode(&parts)),
            note: "client id mapped to its upstream connection".into(),
            ..Default::default()
        };
        self.forward(
            lone,
            summon.target,
            Expect::Frames(1),
            Effect::ConnectionState,
            Some(rewrite),
        )
        .await
    }

    /// Target side, on a wake-up that found requests: opens the dedicated connection if the
    /// session has no usable one, and answers every waiting caller with its upstream id or
    /// why there is none. Nothing is written to this session's own client.
    pub(super) async fn answer_summons(&mut self) {
        let waiting = self.listed.live().take_summons();
        if waiting.is_empty() {
            return;
        }
        // In a cluster the target is named on every primary: its listeners (`tracking`).
        let outcome = if let Some(mut cluster) = self.cluster_session() {
            Box::pin(cluster.listen_everywhere()).await
        } else {
            self.own_upstream_id().await
        };
        for caller in waiting {
            let _ = caller.send(outcome.clone());
        }
    }

    /// Redis's id of this session's dedicated connection, opened now if need be.
    async fn own_upstream_id(&mut self) -> Result<u64, String> {
        if self.input.closing {
            return Err("it is disconnecting".into());
        }
        if !self.dedicated_usable(false, 0) {
            if self.conn.dedicated.is_some() && self.pinned() {
                // Its state lives on a connection that is gone: the session is ending.
                return Err("its upstream connection was lost".into());
            }
            self.conn.dedicated = None;
            self.open_dedicated(false, 0).await?;
        }
        self.ctx
            .client_ids
            .upstream(self.client.id)
            .map(|upstream| upstream.id)
            .ok_or_else(|| "its upstream connection has no id the proxy knows".into())
    }
}
