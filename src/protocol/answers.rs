//! Every reply the proxy makes itself, as named constructors: the RESP builders (OK, bulk,
//! null…) and every proxy-made error text. Texts that copy Redis's own are word for word, so
//! a client cannot tell who answered; `error::error_reply` maps the proxy's error types, the
//! policy composes its refusals from the rules, and both go through `error::simple_error`.

use bytes::{Bytes, BytesMut};

use crate::protocol::error::simple_error;

/// `+OK`.
pub(crate) fn ok() -> Bytes {
    Bytes::from_static(b"+OK\r\n")
}

/// `+QUEUED`, a command's reply inside MULTI.
pub(crate) fn queued() -> Bytes {
    Bytes::from_static(b"+QUEUED\r\n")
}

/// `+RESET`, RESET's reply.
pub(crate) fn reset() -> Bytes {
    Bytes::from_static(b"+RESET\r\n")
}

/// A simple string (`+text`); `text` holds no CR or LF.
pub(crate) fn simple(text: &str) -> Bytes {
    Bytes::from(format!("+{text}\r\n"))
}

/// An integer reply.
pub(crate) fn integer(n: i64) -> Bytes {
    Bytes::from(format!(":{n}\r\n"))
}

/// A bulk string.
pub(crate) fn bulk(text: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(text.len() + 16);
    crate::protocol::codec::put_bulk(&mut out, text);
    out.freeze()
}

/// A gathered SORT (cluster mode) that would read more pattern keys than the proxy holds
/// for one command.
pub(crate) fn sort_gather_too_large(max: usize) -> Bytes {
    Bytes::from(format!(
        "-ERR SORT with BY/GET patterns across a cluster is answered by redis-policy-proxy, \
         which reads each pattern's key on its node: at most {max} per command; sort fewer \
         elements, use LIMIT or fewer GET patterns\r\n"
    ))
}

/// SORT's error for a weight (or element) that is not a number, as Redis words it.
pub(crate) fn sort_not_double() -> Bytes {
    Bytes::from_static(b"-ERR One or more scores can't be converted into double\r\n")
}

/// A null bulk string in the client's RESP version (`_` in RESP3).
pub(crate) fn null(proto: u8) -> Bytes {
    Bytes::from_static(if proto == 3 { b"_\r\n" } else { b"$-1\r\n" })
}

/// A null array in the client's RESP version: EXEC's answer when a watched key changed.
pub(crate) fn null_array(proto: u8) -> Bytes {
    Bytes::from_static(if proto >= 3 { b"_\r\n" } else { b"*-1\r\n" })
}

// --- Redis's own errors, word for word --------------------------------------------------------

/// A command before AUTH when authentication is required.
pub(crate) fn noauth() -> Bytes {
    simple_error("NOAUTH", "Authentication required.")
}

/// HELLO without AUTH when authentication is required.
pub(crate) fn hello_noauth() -> Bytes {
    simple_error(
        "NOAUTH",
        "HELLO must be called with the client already authenticated, otherwise the HELLO \
         <proto> AUTH <user> <pass> option can be used to authenticate the client and select \
         the RESP protocol version at the same time",
    )
}

/// Wrong credentials.
pub(crate) fn wrongpass() -> Bytes {
    simple_error(
        "WRONGPASS",
        "invalid username-password pair or user is disabled.",
    )
}

/// HELLO with a protocol version other than 2 or 3.
pub(crate) fn noproto() -> Bytes {
    simple_error("NOPROTO", "unsupported protocol version")
}

/// HELLO whose version is not a number.
pub(crate) fn hello_bad_version() -> Bytes {
    simple_error("ERR", "Protocol version is not an integer or out of range")
}

/// HELLO with an option it does not know.
pub(crate) fn hello_bad_option(option: &[u8]) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "Syntax error in HELLO option '{}'",
            String::from_utf8_lossy(option)
        ),
    )
}

/// CLIENT SETNAME or HELLO SETNAME with a name Redis refuses.
pub(crate) fn bad_client_name() -> Bytes {
    simple_error(
        "ERR",
        "Client names cannot contain spaces, newlines or special characters.",
    )
}

/// A command's arguments Redis would not parse.
pub(crate) fn syntax_error() -> Bytes {
    simple_error("ERR", "syntax error")
}

/// EXEC of a transaction in which a command was refused at queue time.
pub(crate) fn execabort() -> Bytes {
    simple_error(
        "EXECABORT",
        "Transaction discarded because of previous errors.",
    )
}

/// The text of a C string argument as Redis's `%.*s` prints it: up to its first NUL byte and
/// at most `max` bytes.
fn c_text(arg: &[u8], max: usize) -> String {
    let end = arg
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(arg.len())
        .min(max);
    String::from_utf8_lossy(&arg[..end]).into_owned()
}

/// Redis's refusal of a command name it does not know, in its words: the name and the
/// arguments as its `printf` shows them (each ends at a NUL byte; 128 bytes of them at most).
pub(crate) fn unknown_command<'a>(name: &[u8], rest: impl Iterator<Item = &'a [u8]>) -> Bytes {
    let mut args = String::new();
    for arg in rest {
        if args.len() >= 128 {
            break;
        }
        let text = c_text(arg, 128 - args.len());
        args.push_str(&format!("'{text}' "));
    }
    simple_error(
        "ERR",
        &format!(
            "unknown command '{}', with args beginning with: {args}",
            c_text(name, 128)
        ),
    )
}

/// Redis's refusal of a subcommand name it does not know, in its words.
pub(crate) fn unknown_subcommand(container: &[u8], sub: &[u8]) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "unknown subcommand '{}'. Try {} HELP.",
            c_text(sub, 128),
            c_text(container, usize::MAX).to_ascii_uppercase()
        ),
    )
}

/// EXEC rejected before it runs (`error`, an `-ERR …` reply): Redis answers it as an aborted
/// transaction naming the error (its `execCommandAbort`).
pub(crate) fn exec_rejected(error: &[u8]) -> Bytes {
    let text = error.strip_prefix(b"-ERR ").unwrap_or(error);
    let text = text.strip_suffix(b"\r\n").unwrap_or(text);
    simple_error(
        "EXECABORT",
        &format!(
            "Transaction discarded because of: {}",
            String::from_utf8_lossy(text)
        ),
    )
}

/// A command sent after a MULTI the proxy could not open upstream (no dedicated connection).
pub(crate) fn not_queued_unopened_multi() -> Bytes {
    simple_error(
        "ERR",
        "not queued: the transaction's MULTI failed (no upstream connection), so EXEC will abort",
    )
}

/// MULTI inside MULTI.
pub(crate) fn nested_multi() -> Bytes {
    simple_error("ERR", "MULTI calls can not be nested")
}

/// A command a RESP2 subscriber may not send.
pub(crate) fn not_in_subscribed_context(command: &[u8]) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET \
             are allowed in this context",
            String::from_utf8_lossy(command).to_ascii_lowercase()
        ),
    )
}

/// A command whose keys are in several slots (Redis Cluster's own text).
pub(crate) fn crossslot() -> Bytes {
    Bytes::from_static(b"-CROSSSLOT Keys in request don't hash to the same slot\r\n")
}

/// Why a command whose keys are in several slots is refused rather than split or gathered,
/// in the words [`crossslot_for`] adds to Redis's CROSSSLOT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CrossSlotWhy {
    /// It writes (SUNIONSTORE, RENAME, SMOVE…): its keys change together or not at all, which
    /// only one node can promise.
    Writes,
    /// The proxy splits or gathers it elsewhere (MGET, SUNION…), but inside MULTI the node
    /// holding the transaction must run it whole.
    InTransaction,
    /// The proxy splits or gathers it elsewhere, but the session holds state on one node's
    /// connection (WATCH, an AUTH as another user…), where the command must run whole.
    Pinned,
    /// Any other command that reads its keys together (PFCOUNT of several keys, a script,
    /// a blocking pop): no node sees them all.
    Together,
}

/// CROSSSLOT for `command` (as the client named it), in Redis Cluster's words first so
/// clients recognise the code, then why this command cannot be split and how to fix it:
/// one slot for its keys, through a hash tag. `command` holds no CR or LF (a command-table
/// name).
pub(crate) fn crossslot_for(command: &str, why: CrossSlotWhy) -> Bytes {
    let command = command.replace('|', " ").to_ascii_uppercase();
    let because = match why {
        CrossSlotWhy::Writes => format!("{command} writes atomically and cannot span slots"),
        CrossSlotWhy::InTransaction => format!("{command} cannot span slots inside MULTI"),
        CrossSlotWhy::Pinned => format!(
            "{command} cannot span slots while the connection holds state on one node \
             (WATCH, AUTH as another user...)"
        ),
        CrossSlotWhy::Together => format!("{command} cannot span slots"),
    };
    simple_error(
        "CROSSSLOT",
        &format!(
            "Keys in request don't hash to the same slot ({because}: put its keys in one slot \
             with a hash tag, e.g. {{user1}}:a and {{user1}}:b)"
        ),
    )
}

/// Routes mode: a command whose keys (or channels) belong to routes on different upstreams,
/// and that cannot be split; named like CROSSSLOT so clients that know it recognise it.
pub(crate) fn crossroute(first: &str, second: &str) -> Bytes {
    simple_error(
        "CROSSROUTE",
        &format!(
            "Keys in request belong to different routes ({first}, {second}), which are \
             separate Redis servers; keep keys used together under one route's prefixes"
        ),
    )
}

/// Routes mode: SELECT n (n ≠ 0); each route names its database.
pub(crate) fn select_with_routes() -> Bytes {
    simple_error(
        "ERR",
        "SELECT is not allowed with routes: each route names its database (`db:` in the \
         proxy's routes)",
    )
}

/// A slot no node serves (Redis Cluster's own text).
pub(crate) fn clusterdown() -> Bytes {
    Bytes::from_static(b"-CLUSTERDOWN Hash slot not served\r\n")
}

/// A plain Redis's answer to cluster commands, so cluster-aware clients fall back to treating
/// the proxy as one server (which is what it is to them).
pub(crate) fn cluster_disabled() -> Bytes {
    simple_error("ERR", "This instance has cluster support disabled")
}

/// SELECT n (n ≠ 0) in front of a cluster, as Redis Cluster answers it.
pub(crate) fn select_in_cluster() -> Bytes {
    simple_error("ERR", "SELECT is not allowed in cluster mode")
}

/// A SCAN cursor that is not a number.
pub(crate) fn invalid_cursor() -> Bytes {
    simple_error("ERR", "invalid cursor")
}

/// A command with fewer arguments than its arity allows (`name` as Redis spells it,
/// `client|kill`).
pub(crate) fn wrong_arity(name: &str) -> Bytes {
    simple_error(
        "ERR",
        &format!("wrong number of arguments for '{name}' command"),
    )
}

/// CLIENT KILL's old form (`CLIENT KILL addr`) when no client has that address.
pub(crate) fn no_such_client() -> Bytes {
    simple_error("ERR", "No such client")
}

/// CLIENT KILL ID with a value that is not a positive integer.
pub(crate) fn kill_bad_id() -> Bytes {
    simple_error("ERR", "client-id should be greater than 0")
}

/// CLIENT KILL MAXAGE with a value that is not an integer (Redis 7.4's text).
pub(crate) fn kill_bad_maxage() -> Bytes {
    simple_error("ERR", "maxage is not an integer or out of range")
}

/// CLIENT KILL TYPE with a type Redis does not know (printed up to a NUL, as `%s` prints).
pub(crate) fn unknown_client_type(name: &[u8]) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "Unknown client type '{}'",
            String::from_utf8_lossy(upto_nul(name))
        ),
    )
}

/// A client's argument as C's `%s` prints it: up to its first NUL.
fn upto_nul(arg: &[u8]) -> &[u8] {
    let end = arg.iter().position(|&b| b == 0).unwrap_or(arg.len());
    &arg[..end]
}

/// CLIENT TRACKING's own prefixes overlap, as Redis words it (each printed up to a NUL, as
/// `%s` prints; CR and LF become spaces, as in every error reply).
pub(crate) fn tracking_prefixes_overlap(prefix: &[u8], other: &[u8]) -> Bytes {
    let mut message = b"Prefix '".to_vec();
    message.extend_from_slice(upto_nul(prefix));
    message.extend_from_slice(b"' overlaps with another provided prefix '");
    message.extend_from_slice(upto_nul(other));
    message.extend_from_slice(b"'. Prefixes for a single client must not overlap.");
    crate::protocol::error::simple_error_bytes("ERR", &message)
}

/// CLIENT KILL USER naming a user that does not exist.
pub(crate) fn no_such_user(name: &[u8]) -> Bytes {
    simple_error(
        "ERR",
        &format!("No such user '{}'", String::from_utf8_lossy(name)),
    )
}

// --- The proxy's own errors -------------------------------------------------------------------

/// `CLIENT NO-TOUCH ON` in front of a server that crashes when such a client's write wakes
/// a client blocked on the key (`session::route`).
pub(crate) fn no_touch_stops_the_server() -> Bytes {
    simple_error(
        "ERR",
        "CLIENT NO-TOUCH ON is refused by redis-policy-proxy in front of this server (Redis 8, \
         Valkey 8.1): it stops when a no-touch client's write wakes a client blocked on that key (BLPOP, \
         XREAD BLOCK…), for every client of the server; send the reads without it (it only \
         keeps them from updating the keys' LRU/LFU data)",
    )
}

/// CLIENT TRACKING … REDIRECT to a live client of the tenant whose session could not give the
/// redirect an upstream connection to name (see `session::summon`).
pub(crate) fn redirect_target_unreachable(client: u64, why: &str) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "the client ID you want redirect to ({client}) has no upstream connection of its \
             own and the proxy could not open one: {why}"
        ),
    )
}

/// An AUTH for a user throttled at this address, not even checked: how long to wait.
pub(crate) fn auth_throttled(wait: std::time::Duration) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "too many failed AUTH attempts for this user from this address; retry in {} ms",
            wait.as_millis().max(1)
        ),
    )
}

/// SCAN or KEYS inside MULTI from a namespaced tenant: EXEC's reply would carry the names with
/// the prefix.
pub(crate) fn namespace_scan_in_multi() -> Bytes {
    simple_error(
        "NOPERM",
        "policy namespace: SCAN and KEYS are not available inside MULTI for this client",
    )
}

/// A SUBSCRIBE-family command inside MULTI that Redis would confirm with several frames in
/// EXEC's reply, out of step with its count (redis/redis#12207).
pub(crate) fn pubsub_several_in_multi(command: &[u8]) -> Bytes {
    let name = String::from_utf8_lossy(command).to_ascii_uppercase();
    simple_error(
        "ERR",
        &format!(
            "{name} of several channels (or of all, while subscribed) inside MULTI is refused \
             by redis-policy-proxy: Redis answers EXEC with more replies than commands \
             (redis/redis#12207); name one channel per {name} command"
        ),
    )
}

/// A command the proxy answers itself (CLIENT GETNAME/SETNAME/ID…, HELLO, CLIENT KILL)
/// inside MULTI, where Redis would queue it: its answer cannot go into EXEC's reply.
pub(crate) fn proxy_answered_in_multi(name: &str) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "{} inside MULTI is refused by redis-policy-proxy: the proxy answers it itself and \
             cannot defer its answer to EXEC; send it before MULTI or after EXEC",
            name.to_ascii_uppercase().replace('|', " ")
        ),
    )
}

/// HELLO with a proxy user's AUTH that changes the protocol of a connection holding state
/// (MULTI, WATCH, subscriptions, tracking, SELECT…): the proxy checks the login itself and
/// cannot also switch the held upstream connection's protocol in the same step.
pub(crate) fn hello_login_switch_held() -> Bytes {
    simple_error(
        "ERR",
        "HELLO with AUTH and a protocol change is refused by redis-policy-proxy while the \
         connection holds state (a transaction, WATCH, subscriptions, tracking, SELECT): send \
         AUTH <user> <password>, then HELLO <protover>",
    )
}

/// CLIENT REPLY inside MULTI, in Valkey's words (the proxy keeps the reply mode, which
/// cannot wait for EXEC).
pub(crate) fn client_reply_in_multi() -> Bytes {
    simple_error(
        "ERR",
        "Command 'client|reply' not allowed inside a transaction",
    )
}

/// Cluster mode, CLIENT TRACKING in broadcasting mode (`session::cluster::tracking`): the
/// tracking of `node` cannot hold any more, so the client is disconnected after this.
pub(crate) fn tracking_lost(node: &str) -> Bytes {
    simple_error("ERR", &tracking_lost_reason(node))
}

/// Why client-side caching cannot go on: `node` has no tracking connection (see
/// `tracking_lost`).
pub(crate) fn tracking_lost_reason(node: &str) -> String {
    format!(
        "client-side caching lost: {node} has no tracking connection (a failover, a new \
         primary or a lost connection), so its writes would not invalidate this client's \
         cache; the connection closes, reconnect and turn tracking on again"
    )
}

/// Cluster mode, the client logged in as its own user over every primary, and `node` (a
/// primary the map gained, or one whose connection ended) has no connection logged in as
/// it: its keys would be reached as the proxy's user.
pub(crate) fn own_login_lost(node: &str) -> Bytes {
    simple_error("ERR", &own_login_lost_reason(node))
}

/// Why the client's own login cannot go on (see `own_login_lost`).
pub(crate) fn own_login_lost_reason(node: &str) -> String {
    format!(
        "{node} has no connection logged in as this client's user (a failover, a new primary \
         or a lost connection), so its keys would be reached with the proxy's rights; the \
         connection closes, reconnect and log in again"
    )
}

/// Cluster mode, the client logged in as its own user over every primary: an AUTH queued in
/// MULTI would run at EXEC on the transaction's node only, leaving the client another user
/// on the other primaries.
pub(crate) fn own_login_in_multi() -> Bytes {
    simple_error(
        "ERR",
        "AUTH and HELLO AUTH are refused inside MULTI in front of a Redis Cluster while this \
         client is logged in as its own user: the transaction runs on one node, the login is \
         on every primary; log in before MULTI",
    )
}

/// Cluster mode, tracking spread over every primary: a tracking command queued in MULTI
/// would run on the transaction's node only, while the tracking state is on every primary.
pub(crate) fn tracking_in_multi() -> Bytes {
    simple_error(
        "ERR",
        "CLIENT tracking commands cannot be queued in MULTI in front of a Redis Cluster while \
         tracking is on (it is on every primary, the transaction runs on one); send it \
         outside the transaction",
    )
}

/// Cluster mode, tracking spread over every primary: a REDIRECT to a client that does not
/// hear every primary would move the invalidations of every primary to one client's
/// connection on one node.
pub(crate) fn tracking_redirect_while_bcast() -> Bytes {
    simple_error(
        "ERR",
        "CLIENT TRACKING ... REDIRECT is refused in front of a Redis Cluster while tracking \
         is on, unless the client it names is subscribed to __redis__:invalidate (then it \
         hears every primary); turn tracking off first",
    )
}

/// Cluster mode, OPTOUT tracking spread over every primary: the command after `CLIENT
/// CACHING no` goes to several nodes, and the flag would stay on the others' connections,
/// where a later read would not be tracked.
pub(crate) fn caching_no_over_nodes() -> Bytes {
    simple_error(
        "ERR",
        "the command after CLIENT CACHING no must go to one node in front of a Redis Cluster \
         (the flag would stay on the other nodes' connections, and a later read there would \
         not be tracked); send CLIENT CACHING no before each single-node command",
    )
}

/// Redis's answer to a REDIRECT naming a client that is not there: the named client's
/// connection on a node ended between the proxy's check and the command.
pub(crate) fn tracking_redirect_gone() -> Bytes {
    simple_error("ERR", "The client ID you want redirect to does not exist")
}

/// Cluster mode, default-mode tracking on: why the client's own AUTH is refused (it needs a
/// connection of its own, whose reads Redis would not track for it); the reason of the
/// error `Session::not_established` answers.
pub(crate) fn tracking_own_login() -> String {
    "AUTH with other credentials is refused in front of a Redis Cluster while CLIENT TRACKING \
     is on in the default mode: the login needs a connection of its own, whose reads would \
     not invalidate this client's cache; turn tracking off first"
        .to_string()
}

/// Cluster mode, default-mode tracking on: OFF would close the tracking connections, one of
/// which holds the client's WATCH or subscriptions.
pub(crate) fn tracking_off_while_pinned() -> Bytes {
    simple_error(
        "ERR",
        "CLIENT TRACKING OFF is refused in front of a Redis Cluster while this client holds \
         WATCH, subscriptions or another connection state on a tracking connection (it \
         would close with them); end that state first (UNWATCH, UNSUBSCRIBE), or RESET",
    )
}

/// A rewrite the command's route cannot carry (a pub/sub or local command): refused rather
/// than forwarded as it came.
pub(crate) fn cannot_rewrite() -> Bytes {
    simple_error(
        "NOPERM",
        "policy: this command cannot be rewritten as the policy requires",
    )
}

/// Why a command that needs a dedicated connection got none: its tenant holds its whole
/// share of them (`upstream.dedicated_caps`).
pub(crate) fn dedicated_tenant_limit(
    tenant: &str,
    limit: usize,
    max: usize,
    waited_ms: u128,
) -> String {
    format!(
        "tenant '{tenant}' holds all {limit} of its dedicated upstream connections \
         (upstream.dedicated_caps.per_tenant_percent of upstream.dedicated_max {max}); waited \
         {waited_ms} ms (upstream.dedicated_wait_ms)"
    )
}

/// A script that cannot run as the proxy's script user (`upstream.script_acl: confine`), so
/// the deny rules would not hold inside it: refused, saying why and what the operator can
/// choose (`upstream.unconfined_scripts`). `why` holds no CR or LF.
pub(crate) fn script_unconfined(why: &str) -> Bytes {
    simple_error(
        "NOPERM",
        &format!(
            "policy script-acl: scripts are refused because they cannot run confined to the \
             deny rules here ({why}); the operator can set upstream.unconfined_scripts: run \
             to run them unconfined"
        ),
    )
}

/// `max_value_bytes`' reason for a RESTORE whose DUMP payload holds a value of `n` bytes
/// (its stored, uncompressed length), above `max`.
pub(crate) fn restore_value_above(command: &str, n: u64, max: u64) -> String {
    format!("{command} payload holds a value of {n} bytes (uncompressed), above {max}")
}

/// `max_value_bytes`' reason for a RESTORE whose payload packs elements in a blob of `n`
/// bytes, above `max`: an element may be that long.
pub(crate) fn restore_value_may_be_above(command: &str, n: u64, max: u64) -> String {
    format!(
        "{command} payload packs its elements in {n} bytes, above {max}: an element may be that \
         long"
    )
}

/// `max_value_bytes`' reason for a RESTORE whose payload the proxy cannot size (`why`):
/// refused, since the cap could not be checked.
pub(crate) fn restore_size_unknown(command: &str, why: &str, max: u64) -> String {
    format!(
        "{command} refused: the size of the value in its payload cannot be checked against \
         {max} bytes ({why})"
    )
}

/// SYNC, PSYNC or REPLCONF from a client: a replication stream cannot pass through a command
/// proxy, and REPLCONF ACK/GETACK are never answered.
pub(crate) fn replication_not_proxied() -> Bytes {
    simple_error(
        "ERR",
        "SYNC, PSYNC and REPLCONF cannot pass through redis-policy-proxy: a replica connects \
         to the server itself",
    )
}

/// SCRIPT DEBUG YES or SYNC (`classify::script_debugger`): a debugger session cannot run
/// on a connection the proxy shares, and its commands would run unjudged.
pub(crate) fn script_debugger_not_proxied() -> Bytes {
    simple_error(
        "ERR",
        "SCRIPT DEBUG YES and SYNC cannot pass through redis-policy-proxy: the Lua debugger \
         holds the server connection (SYNC blocks the whole server) and runs commands no \
         policy rule sees; debug scripts against a development server directly \
         (redis-cli --ldb)",
    )
}

/// CONFIG GET inside MULTI: its reply would come back inside EXEC's, where the proxy does not
/// remove the upstream's secret parameters.
pub(crate) fn config_get_in_multi() -> Bytes {
    simple_error(
        "ERR",
        "CONFIG GET is not available inside MULTI through redis-policy-proxy (its reply \
         could carry the upstream's credentials); send it outside the transaction",
    )
}

/// A CONFIG GET reply the proxy could not read to remove the secret parameters from: not
/// forwarded.
pub(crate) fn config_get_unreadable() -> Bytes {
    simple_error(
        "ERR",
        "redis-policy-proxy could not read the upstream's CONFIG GET reply to remove secret \
         parameters from it",
    )
}

/// A whole-keyspace command inside MULTI in front of a cluster: EXEC's reply would hold one
/// node's answer only.
pub(crate) fn fanout_in_multi(command: &[u8]) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "{} inside MULTI is not supported across a cluster by redis-policy-proxy",
            String::from_utf8_lossy(command).to_ascii_uppercase()
        ),
    )
}

/// CONFIG SET inside MULTI of a parameter each cluster node has for itself (`own`: its
/// port, files…), which goes to the client's home node, with parameters every primary
/// shares: EXEC's element could not say how each half went.
pub(crate) fn config_set_mixes_node_own(own: &[u8]) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "CONFIG SET inside MULTI of {} (each cluster node's own: set on the client's home \
             node only) with parameters redis-policy-proxy sets on every primary: set them in \
             separate commands",
            String::from_utf8_lossy(own).to_ascii_lowercase()
        ),
    )
}

/// A whole-keyspace command (sent to every primary) from a client logged in as its own Redis
/// user on one node's connection only: the other primaries would run it over the proxy's
/// connections, with the proxy's rights, not the user's.
pub(crate) fn fanout_own_login(command: &[u8]) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "{} goes to every primary of the cluster, and this connection is logged in as its \
             own Redis user on one node only (it logged in while holding state there, with \
             CLIENT TRACKING on, or where logins are not spread): the other primaries would \
             run it with the proxy's rights; reconnect and log in first",
            String::from_utf8_lossy(command).to_ascii_uppercase()
        ),
    )
}

/// A node's SCAN cursor too large for the proxy's composite cursor.
pub(crate) fn scan_cursor_too_large() -> Bytes {
    simple_error(
        "ERR",
        "a node's SCAN cursor does not fit redis-policy-proxy's composite cursor",
    )
}

/// Redirections followed up to `max_redirects` without an answer, for `slot` (a number, or
/// what stands for it, "in migration").
pub(crate) fn too_many_redirections(slot: impl std::fmt::Display) -> Bytes {
    simple_error(
        "ERR",
        &format!("too many cluster redirections for slot {slot}"),
    )
}

/// XREAD … BLOCK of streams in several slots, one of whose slots moved to another node while
/// it blocked there (`session::cluster::blocking_read`): nothing was read.
pub(crate) fn blocking_read_moved() -> Bytes {
    simple_error(
        "ERR",
        "a stream's slot moved to another node while XREAD blocked on it; nothing was read, \
         send the command again",
    )
}

/// XREAD … BLOCK of streams in several slots whose client left while it blocked: the reply
/// no one reads, which ends the session's wait.
pub(crate) fn blocking_read_cancelled() -> Bytes {
    simple_error("ERR", "the client left while XREAD blocked")
}

/// XREAD … BLOCK of streams in several slots whose every connection ended without a reply.
pub(crate) fn blocking_read_lost() -> Bytes {
    simple_error(
        "ERR",
        "every connection of a blocking XREAD across slots ended without a reply",
    )
}

/// Sharded pub/sub outside cluster mode, which the session never routes there.
pub(crate) fn shard_pubsub_needs_cluster() -> Bytes {
    simple_error(
        "ERR",
        "sharded pub/sub through the proxy needs a cluster upstream",
    )
}

/// `PROXY KEYSPACE` while the keyspace statistics are off.
pub(crate) fn keyspace_off() -> Bytes {
    simple_error(
        "ERR",
        "keyspace statistics are off; set keyspace.sample (1 counts every keyed command)",
    )
}

/// A `PROXY` command from a tenant that is not an admin tenant.
pub(crate) fn proxy_commands_for_admins() -> Bytes {
    simple_error(
        "NOPERM",
        "PROXY commands are for admin tenants (access.admin_tenants)",
    )
}

/// `PROXY RELOAD` that failed: the problems, and that the running policy stays.
pub(crate) fn reload_failed(problems: &str) -> Bytes {
    simple_error(
        "ERR",
        &format!("reload failed, the running policy stays: {problems}"),
    )
}

/// `PROXY RELOAD` on a proxy started without a policy file.
pub(crate) fn nothing_to_reload() -> Bytes {
    simple_error("ERR", "no policy file to reload (started without --config)")
}

/// An unknown `PROXY` subcommand.
pub(crate) fn unknown_proxy_subcommand(sub: &[u8]) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "unknown subcommand or wrong number of arguments for '{}'. Try PROXY HELP.",
            String::from_utf8_lossy(sub)
        ),
    )
}

/// `PROXY SLOWLOG GET` with a count below -1 (Redis's SLOWLOG wording).
pub(crate) fn slowlog_bad_count() -> Bytes {
    simple_error("ERR", "count should be greater than or equal to -1")
}

/// `PROXY SLOWLOG` misused.
pub(crate) fn slowlog_usage() -> Bytes {
    simple_error("ERR", "PROXY SLOWLOG GET [<count>] | LEN | RESET")
}

/// A cluster node's reply without the shape its command promises (its first bytes quoted).
pub(crate) fn unexpected_node_reply(reply: &[u8]) -> Bytes {
    simple_error(
        "ERR",
        &format!(
            "unexpected reply from a cluster node: {}",
            String::from_utf8_lossy(&reply[..reply.len().min(64)])
        ),
    )
}

/// What a plaintext client on a TLS-only listener gets before it is closed: readable by
/// `redis-cli` without `--tls`, where a silent close would leave the user guessing.
pub(crate) fn tls_required() -> Bytes {
    simple_error(
        "ERR",
        "this port serves TLS only; connect with TLS (redis-cli --tls)",
    )
}
