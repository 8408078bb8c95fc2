//! What mode-neutral code asks of a mode: the views mode code runs on (`cluster_session`,
//! `cluster_view`, `replica_reads`: `None` in another mode) and the entry points that make
//! them for a cluster step (`gather`, `spread`, `prepare`, `own_login`).

use super::Session;
use super::cluster;
use super::routing::Routing;

impl Session {
    /// The session as cluster code sees it, exclusively: `None` outside cluster mode.
    pub(super) fn cluster_session(&mut self) -> Option<cluster::ClusterSession<'_>> {
        let Routing::Cluster(cluster) = &mut self.routing else {
            return None;
        };
        Some(cluster::ClusterSession {
            ctx: &self.ctx,
            client: &mut self.client,
            conn: &mut self.conn,
            queue: &mut self.queue,
            input: &mut self.input,
            cluster,
        })
    }

    /// The session as Sentinel replica reads see it: `None` unless reads may go to
    /// replicas.
    pub(super) fn replica_reads(&self) -> Option<super::replica_reads::ReplicaReads<'_>> {
        Some(super::replica_reads::ReplicaReads {
            ctx: &self.ctx,
            client: &self.client,
            conn: &self.conn,
            queue: &self.queue,
            replicas: self.routing.replicas()?,
        })
    }

    /// The session as placement sees it, shared: `None` outside cluster mode.
    pub(super) fn cluster_view(&self) -> Option<cluster::ClusterView<'_>> {
        let Routing::Cluster(cluster) = &self.routing else {
            return None;
        };
        Some(cluster::ClusterView {
            ctx: &self.ctx,
            client: &self.client,
            conn: &self.conn,
            queue: &self.queue,
            cluster,
        })
    }

    // Entry points: what mode-neutral code asks of cluster mode, the view made here. Each
    // is reached only from an action or a reply that exists in cluster mode; elsewhere it
    // answers as a server without a cluster would.

    /// Carries out a cluster command the session answers itself (`Action::Gather`).
    pub(super) async fn gather(&mut self, gather: cluster::plan::Gather) -> bytes::Bytes {
        match self.cluster_session() {
            Some(mut cluster) => cluster.gather(gather).await,
            None => crate::protocol::answers::cluster_disabled(),
        }
    }

    /// Carries out an XREAD … BLOCK across slots (`Gather::blocks`): `Some` reply when
    /// answered now, `None` when its reply slot is answered later.
    pub(super) async fn blocking_read(
        &mut self,
        gather: cluster::plan::Gather,
    ) -> Option<bytes::Bytes> {
        match (self.cluster_session(), gather) {
            (Some(mut cluster), cluster::plan::Gather::Split(split)) => {
                cluster.blocking_read(split).await
            }
            _ => Some(crate::protocol::answers::cluster_disabled()),
        }
    }

    /// Carries out the other primaries' part of `spread` (`Action::Spread`), before the
    /// command goes to the home connection.
    pub(super) async fn spread(&mut self, spread: cluster::plan::Spread) {
        if let Some(mut cluster) = self.cluster_session() {
            cluster.spread(spread).await;
        }
    }

    /// Carries out `prepare` (`Action::Prepare`); the client's reply when it could not be.
    pub(super) async fn prepare(
        &mut self,
        prepare: cluster::plan::Prepare,
    ) -> Result<(), bytes::Bytes> {
        match self.cluster_session() {
            Some(mut cluster) => cluster.prepare(prepare).await,
            None => Ok(()),
        }
    }

    /// Whether the client logged in as its own upstream user: on its dedicated connection
    /// (any mode), or over every primary (`cluster::login`).
    pub(super) fn own_login(&self) -> bool {
        match self.cluster_view() {
            Some(cluster) => cluster.own_login(),
            None => self.conn.holds(super::conn::Holds::OTHER_USER),
        }
    }
}
