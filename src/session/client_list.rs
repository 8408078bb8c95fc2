//! `CLIENT LIST` answered by the proxy about its own clients. Redis would list the proxy's
//! upstream connections, which a client cannot map to anything it knows (its id, its name,
//! its address); an operator asking who is connected means the clients. Each session keeps a
//! row here, written when the client connects and when what the list shows changes (name,
//! db, RESP version, user, subscriber or monitor flag), never per command.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use dashmap::DashMap;
use tokio::time::Instant;

/// Every connected client's row, by the id the proxy gave it.
#[derive(Default)]
pub struct ClientList(DashMap<u64, Row>);

/// What `CLIENT LIST` shows of one client.
pub(super) struct Row {
    /// The client's address.
    pub addr: SocketAddr,
    /// The proxy address it connected to.
    pub laddr: SocketAddr,
    /// CLIENT SETNAME.
    pub name: Option<Bytes>,
    /// Selected database.
    pub db: i64,
    /// RESP version.
    pub resp: u8,
    /// Proxy user it authenticated as, if any.
    pub user: Option<Bytes>,
    /// When it connected, for `age`.
    pub since: Instant,
    /// `P` subscriber, `O` monitor, `N` neither.
    pub flag: char,
}

/// Which clients a `CLIENT LIST` asks for.
pub(super) enum Filter {
    /// Every client.
    All,
    /// `TYPE normal` (not subscribers) or `TYPE pubsub`.
    Pubsub(bool),
    /// `ID id …`.
    Ids(Vec<u64>),
    /// `TYPE master`/`replica`: none of the proxy's clients.
    Nothing,
}

impl ClientList {
    /// Lists client `id` until the returned guard is dropped with its session.
    pub(super) fn join(self: &Arc<Self>, id: u64, addr: SocketAddr, laddr: SocketAddr) -> Listed {
        self.0.insert(
            id,
            Row {
                addr,
                laddr,
                name: None,
                db: 0,
                resp: 2,
                user: None,
                since: Instant::now(),
                flag: 'N',
            },
        );
        Listed {
            list: self.clone(),
            id,
        }
    }

    /// Changes client `id`'s row.
    pub(super) fn update(&self, id: u64, change: impl FnOnce(&mut Row)) {
        if let Some(mut row) = self.0.get_mut(&id) {
            change(&mut row);
        }
    }

    /// The `CLIENT LIST` text for `filter`, as `requester` (whose line names the command and,
    /// as `qbuf`, its length: what Redis's query buffer holds while it runs).
    pub(super) fn render(&self, requester: u64, qbuf: usize, filter: &Filter) -> String {
        let mut rows: Vec<(u64, String)> = Vec::new();
        for entry in self.0.iter() {
            let (id, row) = (*entry.key(), entry.value());
            let wanted = match filter {
                Filter::All => true,
                Filter::Pubsub(pubsub) => (row.flag == 'P') == *pubsub,
                Filter::Ids(ids) => ids.contains(&id),
                Filter::Nothing => false,
            };
            if wanted {
                let own = (id == requester).then_some(qbuf);
                rows.push((id, line(id, row, own)));
            }
        }
        rows.sort_unstable_by_key(|(id, _)| *id);
        rows.into_iter().map(|(_, l)| l).collect()
    }
}

/// One client's line, in Redis 7.0's field order; the fields about Redis's own buffers of a
/// connection (obl, tot-mem…) are the proxy's unknowns and read 0, and so does `qbuf` but on
/// the requester's line (`own`: its command's length).
fn line(id: u64, row: &Row, own: Option<usize>) -> String {
    let mut l = String::with_capacity(256);
    let name = row
        .name
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    let user = row
        .user
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or("default".into());
    let cmd = if own.is_some() { "client|list" } else { "NULL" };
    let qbuf = own.unwrap_or(0);
    let _ = writeln!(
        l,
        "id={id} addr={} laddr={} fd=-1 name={name} age={} idle=0 flags={} db={} sub=0 psub=0 \
         ssub=0 multi=-1 qbuf={qbuf} qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 \
         omem=0 tot-mem=0 events=r cmd={cmd} user={user} redir=-1 resp={}",
        row.addr,
        row.laddr,
        row.since.elapsed().as_secs(),
        row.flag,
        row.db,
        row.resp,
    );
    l
}

/// A client's place in the [`ClientList`], removed when its session ends.
pub(super) struct Listed {
    /// The list it is in.
    list: Arc<ClientList>,
    /// The client's id.
    id: u64,
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.list.0.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rows_come_and_go_with_their_sessions() {
        let list = Arc::new(ClientList::default());
        let a: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let l: SocketAddr = "127.0.0.1:6380".parse().unwrap();
        let one = list.join(1, a, l);
        let two = list.join(2, a, l);
        list.update(2, |r| {
            r.name = Some(Bytes::from_static(b"worker"));
            r.flag = 'P';
        });
        let all = list.render(1, 26, &Filter::All);
        assert!(
            all.starts_with("id=1 addr=127.0.0.1:5000 laddr=127.0.0.1:6380 "),
            "{all}"
        );
        assert!(all.contains("cmd=client|list"));
        assert!(all.contains("id=2 ") && all.contains("name=worker") && all.contains("flags=P"));
        assert_eq!(list.render(1, 26, &Filter::Pubsub(true)).lines().count(), 1);
        assert_eq!(list.render(1, 26, &Filter::Ids(vec![2])).lines().count(), 1);
        drop(two);
        assert_eq!(list.render(1, 26, &Filter::All).lines().count(), 1);
        drop(one);
        assert!(list.render(1, 26, &Filter::All).is_empty());
    }
}
