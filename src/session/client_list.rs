//! `CLIENT LIST` answered by the proxy about its own clients. Redis would list the proxy's
//! upstream connections, which a client cannot map to anything it knows (its id, its name,
//! its address); an operator asking who is connected means the clients. Each session keeps a
//! row here, written when the client connects and when what the list shows changes (name,
//! db, RESP version, user, subscriber or monitor flag, subscription counts), never per
//! command: the one thing that changes per command, the last command's name, is an atomic
//! store in the [`Live`] part the session and its row share. The same part carries what other
//! sessions ask of this one (`CLIENT KILL`, a `REDIRECT` that needs its upstream connection).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use dashmap::DashMap;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::client_kill::{Candidate, KillFilter};
use super::sub_counts::SubCounts;
use crate::commands::CommandSpec;

/// Every connected client's row, by the id the proxy gave it.
#[derive(Default)]
pub(crate) struct ClientList(DashMap<u64, Row>);

/// What `CLIENT LIST` shows of one client.
pub(super) struct Row {
    /// The client's address.
    pub(crate) addr: SocketAddr,
    /// The proxy address it connected to.
    pub(crate) laddr: SocketAddr,
    /// The proxy user it authenticated as and its CLIENT SETNAME.
    pub(crate) names: Names,
    /// Selected database.
    pub(crate) db: i64,
    /// RESP version.
    pub(crate) resp: u8,
    /// When it connected, for `age`.
    pub(crate) since: Instant,
    /// `P` subscriber, `O` monitor, `N` neither.
    pub(crate) flag: char,
    /// The client's tenant: a client may name only clients of its own tenant by id (CLIENT
    /// TRACKING REDIRECT, KILL ID, UNBLOCK).
    pub(crate) tenant: u16,
    /// Its channels, patterns and shard channels, as Redis's confirmations counted them
    /// (`sub=`, `psub=`, `ssub=`; libraries find subscribers by them).
    pub(crate) subs: SubCounts,
    /// What the session and the rest of the proxy share without a lookup in this map.
    live: Arc<Live>,
}

impl Row {
    /// Whether CLIENT KILL's (or a CLIENT LIST filter's) `filter` names this client, `id`,
    /// when `caller` asks.
    fn named_by(&self, filter: &KillFilter, id: u64, caller: u64) -> bool {
        let (addr, laddr) = (self.addr.to_string(), self.laddr.to_string());
        filter.matches(&Candidate {
            addr: &addr,
            laddr: &laddr,
            id,
            pubsub: self.flag == 'P',
            user: self.names.user().map_or(&b"default"[..], |u| &u[..]),
            age: self.since.elapsed().as_secs(),
            is_caller: id == caller,
        })
    }
}

/// The part of a client's row its session holds too: written per command by the session
/// (one relaxed store, no map lookup), or by other sessions asking something of it, which
/// then wake every session through the idle tick (`Context::idle_tick`; such requests are
/// rare, and a session that finds nothing for itself goes back to sleep).
#[derive(Default)]
pub(super) struct Live {
    /// The address of the table entry of the client's latest command (0: none yet), for
    /// `cmd=`: an address, because a `&'static CommandSpec` cannot be stored atomically
    /// without unsafe code; [`Live::last_command`] finds the entry again.
    last: AtomicUsize,
    /// A `CLIENT KILL` named the client: its session closes the connection at once.
    killed: AtomicBool,
    /// Sessions waiting for the upstream id of this client's dedicated connection (a
    /// `CLIENT TRACKING … REDIRECT` to it, see `session::summon`); `summoned` says whether
    /// any wait, without taking the lock on every tick.
    summons: Mutex<Vec<oneshot::Sender<Result<u64, String>>>>,
    /// See `summons`.
    summoned: AtomicBool,
}

impl Live {
    /// Records the client's latest command.
    pub(super) fn note_command(&self, spec: &'static CommandSpec) {
        self.last
            .store(spec as *const CommandSpec as usize, Ordering::Relaxed);
    }

    /// The client's latest command's full name (`client|list`), if it sent one Redis knows.
    fn last_command(&self) -> Option<&'static str> {
        let at = self.last.load(Ordering::Relaxed);
        if at == 0 {
            return None;
        }
        crate::commands::all_commands()
            .find(|s| *s as *const CommandSpec as usize == at)
            .map(|s| s.name)
    }

    /// Whether a `CLIENT KILL` named the client.
    pub(super) fn killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }

    /// Whether another session waits for this client's upstream connection.
    pub(super) fn summoned(&self) -> bool {
        self.summoned.load(Ordering::Acquire)
    }

    /// The sessions waiting for this client's upstream connection, taken to be answered.
    pub(super) fn take_summons(&self) -> Vec<oneshot::Sender<Result<u64, String>>> {
        self.summoned.store(false, Ordering::Release);
        std::mem::take(&mut *self.summons.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A client's proxy user and CLIENT SETNAME, boxed: most clients have neither, and both the
/// session (in every client's task, `size_tests`) and its row here hold them.
#[derive(Default)]
pub(super) struct Names(Option<Box<NamePair>>);

/// See [`Names`].
#[derive(Default)]
struct NamePair {
    /// The proxy user the client authenticated as (proxy-side users only).
    user: Option<Bytes>,
    /// CLIENT SETNAME value, answered by CLIENT GETNAME.
    name: Option<Bytes>,
    /// CLIENT SETINFO LIB-NAME and LIB-VER (Redis 7.2+, Valkey): the client's own, shown in
    /// its CLIENT INFO, never set on a shared upstream connection.
    lib: Option<Box<(Bytes, Bytes)>>,
}

impl Names {
    /// The proxy user the client authenticated as.
    pub(super) fn user(&self) -> Option<&Bytes> {
        self.0.as_ref()?.user.as_ref()
    }

    /// The CLIENT SETNAME value.
    pub(super) fn name(&self) -> Option<&Bytes> {
        self.0.as_ref()?.name.as_ref()
    }

    /// Sets (or with `None` clears) the user.
    pub(super) fn set_user(&mut self, user: Option<Bytes>) {
        self.change(|n| n.user = user);
    }

    /// CLIENT SETINFO's library name and version (empty when not set).
    pub(super) fn lib(&self) -> (&[u8], &[u8]) {
        match self.0.as_ref().and_then(|p| p.lib.as_deref()) {
            Some((name, ver)) => (name, ver),
            None => (b"", b""),
        }
    }

    /// Sets CLIENT SETINFO's `LIB-NAME` (`version: false`) or `LIB-VER` to `value`.
    pub(super) fn set_lib(&mut self, version: bool, value: Bytes) {
        self.change(|n| {
            let lib = n.lib.get_or_insert_with(Box::default);
            if version {
                lib.1 = value;
            } else {
                lib.0 = value;
            }
            if lib.0.is_empty() && lib.1.is_empty() {
                n.lib = None;
            }
        });
    }

    /// Sets (or with `None` clears) the CLIENT SETNAME value.
    pub(super) fn set_name(&mut self, name: Option<Bytes>) {
        self.change(|n| n.name = name);
    }

    /// Applies `change`, keeping the box only while a name is set.
    fn change(&mut self, change: impl FnOnce(&mut NamePair)) {
        let pair = self.0.get_or_insert_with(Box::default);
        change(pair);
        if pair.user.is_none() && pair.name.is_none() && pair.lib.is_none() {
            self.0 = None;
        }
    }
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
    /// Valkey 8.1+'s filters, read as CLIENT KILL's.
    Kill(Box<KillFilter>),
}

impl ClientList {
    /// Lists client `id` until the returned guard is dropped with its session.
    pub(super) fn join(
        self: &Arc<Self>,
        id: u64,
        addr: SocketAddr,
        laddr: SocketAddr,
        tenant: u16,
    ) -> Listed {
        let live = Arc::new(Live::default());
        self.0.insert(
            id,
            Row {
                addr,
                laddr,
                names: Names::default(),
                db: 0,
                resp: 2,
                since: Instant::now(),
                flag: 'N',
                tenant,
                subs: SubCounts::default(),
                live: live.clone(),
            },
        );
        Listed {
            list: self.clone(),
            id,
            live,
        }
    }

    /// Closes every client of `tenant` that `filter` names (`caller` is the client asking),
    /// as Redis's CLIENT KILL: each one's session is told and woken through `wake`; the
    /// caller's own connection, when named, is left to the caller (`KillOutcome::caller`).
    pub(super) fn kill(
        &self,
        caller: u64,
        tenant: u16,
        filter: &KillFilter,
        wake: &tokio::sync::Notify,
    ) -> KillOutcome {
        let mut outcome = KillOutcome::default();
        for entry in self.0.iter() {
            let (id, row) = (*entry.key(), entry.value());
            if row.tenant != tenant || row.live.killed() {
                continue;
            }
            if !row.named_by(filter, id, caller) {
                continue;
            }
            outcome.killed += 1;
            if id == caller {
                outcome.caller = true;
            } else {
                row.live.killed.store(true, Ordering::Release);
            }
        }
        if outcome.killed > outcome.caller as usize {
            wake.notify_waiters();
        }
        outcome
    }

    /// How many clients of `tenant` are connected and not being closed: INFO's
    /// `connected_clients` as a client of the proxy counts them, the clients CLIENT KILL can
    /// name.
    pub(super) fn connected(&self, tenant: u16) -> usize {
        self.0
            .iter()
            .filter(|e| e.value().tenant == tenant && !e.value().live.killed())
            .count()
    }

    /// Asks client `id` (of `tenant`) for the upstream id of its dedicated connection, which
    /// its session opens if it has none; `None` when there is no such client in the tenant.
    /// The session is woken through `wake`.
    pub(super) fn summon(
        &self,
        id: u64,
        tenant: u16,
        wake: &tokio::sync::Notify,
    ) -> Option<oneshot::Receiver<Result<u64, String>>> {
        let live = {
            let row = self.0.get(&id)?;
            (row.tenant == tenant && !row.live.killed()).then(|| row.live.clone())?
        };
        let (tx, rx) = oneshot::channel();
        live.summons
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tx);
        live.summoned.store(true, Ordering::Release);
        wake.notify_waiters();
        Some(rx)
    }

    /// The proxy address client `id` connected to.
    pub(super) fn laddr(&self, id: u64) -> Option<SocketAddr> {
        self.0.get(&id).map(|row| row.laddr)
    }

    /// The tenant of client `id`, while it is connected.
    pub(super) fn tenant(&self, id: u64) -> Option<u16> {
        self.0.get(&id).map(|row| row.tenant)
    }

    /// The RESP version client `id` speaks, while it is connected.
    pub(super) fn resp(&self, id: u64) -> Option<u8> {
        self.0.get(&id).map(|row| row.resp)
    }

    /// Whether client `id`'s subscriptions, as Redis's confirmations counted them, are any.
    pub(super) fn subscribed(&self, id: u64) -> bool {
        self.0.get(&id).is_some_and(|row| row.subs.any())
    }

    /// Changes client `id`'s row.
    pub(super) fn update(&self, id: u64, change: impl FnOnce(&mut Row)) {
        if let Some(mut row) = self.0.get_mut(&id) {
            change(&mut row);
        }
    }

    /// The `CLIENT LIST` text for `filter`, as `requester` of `tenant` (whose line names the
    /// command and, as `qbuf`, its length: what Redis's query buffer holds while it runs).
    /// Only `tenant`'s clients: the ones CLIENT KILL can name and INFO's `connected_clients`
    /// counts (another tenant's addresses, names and commands are not the caller's to see).
    pub(super) fn render(
        &self,
        requester: u64,
        tenant: u16,
        qbuf: usize,
        filter: &Filter,
    ) -> String {
        let mut rows: Vec<(u64, String)> = Vec::new();
        for entry in self.0.iter() {
            let (id, row) = (*entry.key(), entry.value());
            if row.tenant != tenant {
                continue;
            }
            let wanted = match filter {
                Filter::All => true,
                Filter::Pubsub(pubsub) => (row.flag == 'P') == *pubsub,
                Filter::Ids(ids) => ids.contains(&id),
                Filter::Nothing => false,
                Filter::Kill(kill) => row.named_by(kill, id, requester),
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

/// What a `CLIENT KILL` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct KillOutcome {
    /// Clients named, the caller included when it is.
    pub(crate) killed: usize,
    /// The caller is among them (`SKIPME no`, or the old form naming its own address): it
    /// closes after its reply, as Redis closes a client that killed itself.
    pub(crate) caller: bool,
}

/// One client's line, in Redis 7.0's field order; the fields about Redis's own buffers of a
/// connection (obl, tot-mem…) are the proxy's unknowns and read 0, and so does `qbuf` but on
/// the requester's line (`own`: its command's length).
fn line(id: u64, row: &Row, own: Option<usize>) -> String {
    let mut l = String::with_capacity(256);
    let name = row
        .names
        .name()
        .map(|n| String::from_utf8_lossy(n))
        .unwrap_or_default();
    let user = row
        .names
        .user()
        .map(|u| String::from_utf8_lossy(u))
        .unwrap_or("default".into());
    let cmd = match own {
        Some(_) => "client|list",
        None => row.live.last_command().unwrap_or("NULL"),
    };
    let qbuf = own.unwrap_or(0);
    let SubCounts { sub, psub, ssub } = row.subs;
    let _ = writeln!(
        l,
        "id={id} addr={} laddr={} fd=-1 name={name} age={} idle=0 flags={} db={} sub={sub} \
         psub={psub} ssub={ssub} multi=-1 qbuf={qbuf} qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 \
         rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={cmd} user={user} redir=-1 resp={}",
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
    /// The part of the row the session writes per command and reads on each tick.
    live: Arc<Live>,
}

impl Listed {
    /// The part of the row shared with the session.
    pub(super) fn live(&self) -> &Live {
        &self.live
    }
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
        let one = list.join(1, a, l, 0);
        let two = list.join(2, a, l, 0);
        list.update(2, |r| {
            r.names.set_name(Some(Bytes::from_static(b"worker")));
            r.flag = 'P';
        });
        let all = list.render(1, 0, 26, &Filter::All);
        assert!(
            all.starts_with("id=1 addr=127.0.0.1:5000 laddr=127.0.0.1:6380 "),
            "{all}"
        );
        assert!(all.contains("cmd=client|list"));
        assert!(all.contains("id=2 ") && all.contains("name=worker") && all.contains("flags=P"));
        assert_eq!(
            list.render(1, 0, 26, &Filter::Pubsub(true)).lines().count(),
            1
        );
        assert_eq!(
            list.render(1, 0, 26, &Filter::Ids(vec![2])).lines().count(),
            1
        );
        // Another tenant's client is not listed, nor counted.
        let other = list.join(3, a, l, 1);
        assert_eq!(list.render(1, 0, 26, &Filter::All).lines().count(), 2);
        assert_eq!(list.render(3, 1, 26, &Filter::All).lines().count(), 1);
        assert_eq!((list.connected(0), list.connected(1)), (2, 1));
        drop(other);
        drop(two);
        assert_eq!(list.render(1, 0, 26, &Filter::All).lines().count(), 1);
        drop(one);
        assert!(list.render(1, 0, 26, &Filter::All).is_empty());
    }
}
