//! What a command does to the session's state (`Effect`, `LocalEffect`).

use super::client::ReplyMode;
use super::pause;
use crate::protocol::reply::SubKind;
use crate::upstream::ReplyWait;
use bytes::Bytes;

/// State changes a command makes once it is actually dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effect {
    None,
    Multi,
    EndMulti,
    Watch,
    Unwatch,
    /// SUBSCRIBE-family: the dedicated connection holds subscriptions of this kind.
    Subscribe(SubKind),
    /// UNSUBSCRIBE-family: once the confirmations count none left, classic subscriptions
    /// stop pinning the session (see `Handling::unsubscribe`).
    Unsubscribe(SubKind),
    Select(i64),
    Auth,
    /// HELLO with AUTH: authenticates and switches RESP version.
    AuthHello(u8),
    Hello(u8),
    Monitor,
    /// RESET forwarded on the dedicated connection that holds the client's subscriptions:
    /// Redis drops them before anything after it runs (a connection merely closed keeps them
    /// until Redis reads the close, and a PUBLISH on another connection would still count
    /// them); the session resets once it is answered (`Handling::reset`).
    Reset,
    ConnectionState,
    /// No state change, but the command may block for as long as it says (see
    /// `Handling::blocking`).
    Blocking(ReplyWait),
    /// A script (EVAL, FCALL… on the session's own connection, `route_script`): blocking,
    /// answered when it ends; in cluster mode, while it runs, keyless commands go to its node
    /// (`Handling::script`).
    Script,
    /// WAIT/WAITAOF: blocking, and it must count the client's earlier writes (see
    /// `WAIT_BARRIER`).
    Wait(ReplyWait),
    /// CLIENT INFO: the reply describes the upstream connection; rewrite it to describe the
    /// client (id, name, addresses).
    ClientInfo,
    /// INFO asking for the default sections (or `proxy`): append the `# Proxy` section, and
    /// `connected_clients` counts the proxy's clients (`replies::info_as_seen`).
    Info,
    /// INFO naming `clients` but none of the sets `Info` is for: `connected_clients` counts
    /// the proxy's clients, as it does in the default sections.
    InfoClients,
    /// CONFIG GET: the secret parameters' pairs are removed from the reply (`config_get`).
    ConfigGet,
    /// EXEC of a transaction in which the policy refused a command: DISCARD it upstream and
    /// answer EXECABORT, as Redis does after a command rejected at queue time.
    AbortExec,
    /// CLIENT PAUSE for this long (ms): what it holds back is routed around (`pause`).
    Pause(pause::Paused, u64),
    /// CLIENT UNPAUSE.
    Unpause,
    /// CLIENT GETREDIR/TRACKINGINFO: the redirect id in the reply is made the client's.
    NamesRedirect,
    /// CLIENT UNBLOCK naming another client's dedicated connection (`client_ids`): Redis
    /// finds it only on its own node, which the target names; cluster placement keeps it.
    NamesClient,
    /// CLIENT TRACKING … REDIRECT naming another client's dedicated connection: the state of
    /// `ConnectionState`, on the connection's node, which the target names (Redis redirects
    /// invalidations only to a client of its own); cluster placement keeps it.
    TracksToClient,
}

/// Session state changed by a command the proxy answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum LocalEffect {
    None,
    SetName(Option<Bytes>),
    /// CLIENT SETINFO: `LIB-VER` (true) or `LIB-NAME`, kept by the proxy for this client.
    SetLib(bool, Bytes),
    ReplyMode(ReplyMode),
    /// AUTH accepted by the proxy: the session is now this user (and its tenant).
    Login(Bytes),
    /// Cluster mode: MULTI answered by the proxy, sent later, as the client spelled it, with
    /// the first queued command.
    DeferMulti,
    /// Cluster mode: EXEC or DISCARD of a MULTI that was never sent (nothing queued).
    EndMulti,
    /// Cluster mode: a keyless command queued in a deferred MULTI, answered `+QUEUED` and
    /// held until a command with keys names the node (`ClusterState::held_in_multi`).
    HoldInMulti,
}

/// What the proxy changes in an INFO reply (`replies::info_as_seen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InfoEdit {
    /// `connected_clients` counts the proxy's clients (`INFO clients`).
    Count,
    /// That, and the `# Proxy` section appended (the default sections, `all`, `proxy`…).
    CountAndSection,
}

impl Effect {
    /// How an INFO reply with this effect is edited; `None` for any other command.
    pub(super) fn info_edit(self) -> Option<InfoEdit> {
        match self {
            Effect::Info => Some(InfoEdit::CountAndSection),
            Effect::InfoClients => Some(InfoEdit::Count),
            _ => None,
        }
    }

    /// Whether a command with this effect may join a run of plain commands; the others need
    /// `execute` (extra commands, a raw connection, or the blocking mark).
    pub(super) fn batchable(self) -> bool {
        !matches!(
            self,
            Effect::Blocking(_)
                | Effect::Script
                | Effect::Wait(_)
                | Effect::Auth
                | Effect::AuthHello(_)
                | Effect::Hello(_)
                | Effect::ClientInfo
                | Effect::Info
                | Effect::InfoClients
                | Effect::ConfigGet
                | Effect::AbortExec
                | Effect::EndMulti
                | Effect::Unsubscribe(_)
                | Effect::NamesRedirect
                // Sent alone: the commands after it wait for its reply (`resetting`).
                | Effect::Reset
        )
    }
}
