//! The reply sweep: every command the server documents, in forms drawn from its own argument
//! grammar (`COMMAND DOCS`: tokens, optional and repeated arguments, one-of choices, blocks),
//! sent to a server directly and, through the proxy without a policy, to a second server
//! over ONE shared upstream connection that another client uses between each command and
//! the next. Each command must get as many frames through the proxy as directly, and the
//! other client only its own replies.
//!
//! Why: a command Redis never answers (`REPLCONF ACK`), or answers with more than one frame,
//! shifts every later reply on a shared connection onto the wrong client; one that changes
//! the connection (`SCRIPT DEBUG SYNC`, `CLIENT CAPA`) changes it for every client on it. The
//! state fuzzer draws from a list of the commands known to do that; this sweep asks every
//! command the server has, newer servers' included, so a command nobody thought of is asked
//! too. Policy rules are the invariant fuzzer's; here no rule refuses anything.
//!
//! Each command is followed by a `PING <token>` sentinel, so its replies are read up to it
//! on both sides, no sleeping. Commands that change the conversation itself (MULTI, the
//! SUBSCRIBE family, HELLO, CLIENT REPLY/TRACKING, RESET, QUIT, MONITOR) are the state
//! fuzzer's; commands that would stop or reconfigure the server the test runs on (SHUTDOWN,
//! REPLICAOF, FAILOVER, DEBUG, CLIENT KILL/PAUSE, MIGRATE, SCRIPT DEBUG) are left out and
//! listed in `LEFT_OUT`.
//!
//! Commands the server documents no arguments for but that take some (REPLCONF, Valkey's
//! CLUSTER SYNCSLOTS) have no grammar to draw from: they are sent with each word the server
//! binary holds as a C string (the keywords its parsers compare with `strcasecmp` are among
//! them), which is how `REPLCONF ACK`, answered by nothing, is asked.
//!
//! Environment: `REPLY_SWEEP_TRIES` (forms per command, default 3), `REPLY_SWEEP_SEED`
//! (default: from the clock, printed).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::cluster::RedisCluster;
use common::{Proxy, Raw, RedisServer, Rng, resp, show};

/// Commands (container|sub for subcommands) the sweep does not send, and why in one word
/// each: the conversation ones are the state fuzzer's (`tests/state_fuzz.rs`), the rest would
/// stop, pause or rewire the servers this test runs on.
const LEFT_OUT: &[&str] = &[
    // The conversation's state: tests/state_fuzz.rs.
    "multi",
    "exec",
    "discard",
    "watch",
    "unwatch",
    "subscribe",
    "psubscribe",
    "ssubscribe",
    "unsubscribe",
    "punsubscribe",
    "sunsubscribe",
    "hello",
    "auth",
    "reset",
    "quit",
    "monitor",
    "client|reply",
    "client|tracking",
    "client|caching",
    // The servers themselves.
    "shutdown",
    "replicaof",
    "slaveof",
    "failover",
    "debug",
    "sync",
    "psync",
    "client|kill",
    "client|pause",
    "migrate",
    "script|debug",
    // Valkey: import mode changes how the server expires keys for the next steps' clients.
    "client|import-source",
];

/// How long one step may take (a blocking command waits at most 0.01 s or 100 ms).
const STEP: Duration = Duration::from_secs(5);

/// One argument of a command's documented grammar.
#[derive(Debug, Clone, Default)]
struct Arg {
    name: String,
    kind: String,
    token: Option<String>,
    optional: bool,
    multiple: bool,
    multiple_token: bool,
    children: Vec<Arg>,
}

/// A command (or subcommand) as the server documents it.
#[derive(Debug, Clone)]
struct Doc {
    /// `get`, or `client|list` for a subcommand.
    name: String,
    args: Vec<Arg>,
}

/// The pairs of a RESP2 flat map (`[k, v, k, v…]`) or a RESP3 map.
fn pairs(v: &redis::Value) -> Vec<(String, &redis::Value)> {
    match v {
        redis::Value::Array(items) => items
            .chunks(2)
            .filter_map(|c| match c {
                [k, v] => Some((text(k)?, v)),
                _ => None,
            })
            .collect(),
        redis::Value::Map(items) => items
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, v)))
            .collect(),
        _ => Vec::new(),
    }
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn items(v: &redis::Value) -> &[redis::Value] {
    match v {
        redis::Value::Array(items) | redis::Value::Set(items) => items,
        _ => &[],
    }
}

fn parse_arg(v: &redis::Value) -> Arg {
    let mut arg = Arg::default();
    for (k, v) in pairs(v) {
        match k.as_str() {
            "name" => arg.name = text(v).unwrap_or_default(),
            "type" => arg.kind = text(v).unwrap_or_default(),
            "token" => arg.token = text(v),
            "flags" => {
                for f in items(v).iter().filter_map(text) {
                    match f.as_str() {
                        "optional" => arg.optional = true,
                        "multiple" => arg.multiple = true,
                        "multiple_token" => arg.multiple_token = true,
                        _ => {}
                    }
                }
            }
            "arguments" => arg.children = items(v).iter().map(parse_arg).collect(),
            _ => {}
        }
    }
    arg
}

/// Every command and subcommand of a `COMMAND DOCS` reply (subcommands come named
/// `container|sub`).
fn parse_docs(reply: &redis::Value, out: &mut Vec<Doc>) {
    for (name, doc) in pairs(reply) {
        let full = name.to_ascii_lowercase();
        let mut args = Vec::new();
        let mut subs = None;
        for (k, v) in pairs(doc) {
            match k.as_str() {
                "arguments" => args = items(v).iter().map(parse_arg).collect(),
                "subcommands" => subs = Some(v),
                _ => {}
            }
        }
        if let Some(subs) = subs {
            parse_docs(subs, out);
        } else {
            out.push(Doc { name: full, args });
        }
    }
}

/// The keys the sweep's commands name: a few, so that commands meet each other's data.
const KEYS: &[&str] = &["k1", "k2", "{t}k3", "{t}k4", "s1"];

/// One form of `doc`, its arguments drawn from the grammar.
fn form(doc: &Doc, rng: &mut Rng) -> Vec<String> {
    let mut out: Vec<String> = doc.name.split('|').map(str::to_string).collect();
    for a in &doc.args {
        draw(a, rng, &mut out);
    }
    out
}

fn draw(arg: &Arg, rng: &mut Rng, out: &mut Vec<String>) {
    if arg.optional && rng.below(2) == 0 {
        return;
    }
    let times = if arg.multiple { 1 + rng.below(3) } else { 1 };
    for i in 0..times {
        if let Some(token) = &arg.token
            && (i == 0 || arg.multiple_token)
        {
            out.push(token.clone());
        }
        match arg.kind.as_str() {
            "pure-token" => {}
            "oneof" if !arg.children.is_empty() => {
                let child = &arg.children[rng.below(arg.children.len())];
                let mut required = child.clone();
                required.optional = false;
                draw(&required, rng, out);
            }
            "block" => {
                for child in &arg.children {
                    draw(child, rng, out);
                }
            }
            "key" => out.push(KEYS[rng.below(KEYS.len())].to_string()),
            // A timeout of 0 blocks forever: the shortest others instead.
            "double" if arg.name == "timeout" => out.push("0.01".into()),
            "integer" if arg.name == "timeout" || arg.name == "milliseconds" => {
                out.push("100".into())
            }
            "integer" => out.push(["1", "2", "-1", "3", "100"][rng.below(5)].into()),
            "double" => out.push(["1.5", "0.5", "-2", "3"][rng.below(4)].into()),
            "unix-time" => out.push("4102444800".into()),
            _ => out.push(["v", "x", "*", "hello world", "", "1"][rng.below(6)].into()),
        }
    }
}

/// The words of the server binary: the keyword-like tail (letters, digits, `-`, `_`; 2 to 24
/// bytes, starting with a letter) of each of its NUL-terminated strings, and those tails'
/// own tails of up to 6 bytes: the linker stores `"ack"` as the end of `"getack"`.
fn binary_words(bin: &Path) -> Vec<String> {
    let path = if bin.components().count() > 1 {
        bin.to_path_buf()
    } else {
        std::env::var_os("PATH")
            .and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(bin))
                    .find(|p| p.is_file())
            })
            .unwrap_or_else(|| panic!("{} is not on PATH", bin.display()))
    };
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut words = std::collections::BTreeSet::new();
    for run in bytes.split(|&b| b == 0) {
        let start = run
            .iter()
            .rposition(|b| !(b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_'))
            .map_or(0, |i| i + 1);
        let tail = &run[start..];
        if tail.len() > 24 {
            continue;
        }
        for i in 0..tail.len().saturating_sub(1) {
            let word = &tail[i..];
            if word[0].is_ascii_alphabetic() && (i == 0 || word.len() <= 6) {
                words.insert(String::from_utf8_lossy(word).into_owned());
            }
        }
    }
    words.into_iter().collect()
}

/// Frames up to and including the sentinel's reply; `None` when it never came.
async fn until_sentinel(c: &mut Raw, sentinel: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut frames = Vec::new();
    loop {
        let got = c.collect_frames(1, STEP).await;
        match got.frames.into_iter().next() {
            Some(f) if f == sentinel => return Ok(frames),
            Some(f) => frames.push(f),
            None => {
                return Err(format!(
                    "no sentinel within {STEP:?} (closed: {}); frames before it: {}; rest: {}",
                    got.closed,
                    frames.iter().map(|f| show(f)).collect::<Vec<_>>().join(" "),
                    show(&got.rest)
                ));
            }
        }
    }
}

/// What the proxy is in front of: one server, or a cluster of three primaries (against a
/// standalone server directly: the proxy presents a cluster as one server).
#[derive(Clone, Copy, PartialEq)]
enum Upstream {
    Server,
    Cluster,
}

/// The sweep in front of `bin`: what differed, one line per command form.
async fn sweep(
    label: &str,
    bin: &Path,
    upstream: Upstream,
    resp3: bool,
    seed: u64,
    tries: usize,
) -> Vec<String> {
    let direct = RedisServer::start_binary(bin, &[]);
    // Kept for the sweep's length: dropping either stops its servers.
    let (_server, _cluster, mut config) = match upstream {
        Upstream::Server => {
            let server = RedisServer::start_binary(bin, &[]);
            let config = common::config_for(&server.addr());
            (Some(server), None, config)
        }
        Upstream::Cluster => {
            let cluster = RedisCluster::start_binary(bin, 3, 0, &[]);
            let config = common::cluster::proxy_config(&cluster.live_addrs()[0], &[]);
            (None, Some(cluster), config)
        }
    };
    config.upstream.connections.value = 1;
    config.upstream.dedicated_warm.value = 0;
    let proxy = Proxy::start(config).await;
    let label = &match upstream {
        Upstream::Server => label.to_string(),
        Upstream::Cluster => format!("{label} cluster"),
    };

    let url = direct.url();
    let mut con = common::connect(&url).await;
    let reply: redis::Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .query_async(&mut con)
        .await
        .expect("COMMAND DOCS");
    let mut docs = Vec::new();
    parse_docs(&reply, &mut docs);
    docs.retain(|d| !LEFT_OUT.contains(&d.name.as_str()) && !d.name.ends_with("|help"));
    docs.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(
        docs.len() > 150,
        "{label}: {} commands documented",
        docs.len()
    );

    let mut d = Raw::connect(direct.addr()).await;
    let mut a = Raw::connect(proxy.addr).await;
    let mut b = Raw::connect(proxy.addr).await;
    if resp3 {
        for c in [&mut d, &mut a, &mut b] {
            let hello = c.call(&["HELLO", "3"]).await;
            assert!(hello.starts_with(b"%"), "{}", show(&hello));
        }
    }

    let mut rng = Rng(seed | 1);
    let mut found = Vec::new();
    let mut step = 0u64;
    for doc in &docs {
        for _ in 0..tries {
            step += 1;
            let args = form(doc, &mut rng);
            let token = format!("sweep-{step}");
            let sentinel = format!("${}\r\n{token}\r\n", token.len()).into_bytes();
            let mut input = resp(&args);
            input.extend(resp(&["PING", token.as_str()]));

            d.send(&input).await;
            let want = until_sentinel(&mut d, &sentinel).await;
            // The other client's command comes between this one and its sentinel, on the same
            // shared upstream connection.
            let other = format!("other-{step}");
            a.send(&resp(&args)).await;
            b.send(&resp(&["ECHO", other.as_str()])).await;
            a.send(&resp(&["PING", token.as_str()])).await;
            let got = until_sentinel(&mut a, &sentinel).await;
            let theirs = b.collect_frames(1, STEP).await;
            let echo = format!("${}\r\n{other}\r\n", other.len()).into_bytes();

            let case = format!("{label}: {}", show(&resp(&args)));
            if theirs.frames.first() != Some(&echo) {
                found.push(format!(
                    "{case}: the other client got {} for its ECHO",
                    show(&theirs.joined())
                ));
            }
            match (want, got) {
                (Ok(w), Ok(g)) if w.len() == g.len() || refused_by_proxy(&g) => {}
                (Ok(w), Ok(g)) => found.push(format!(
                    "{case}: {} frames directly, {} through the proxy: {} / {}",
                    w.len(),
                    g.len(),
                    w.iter().map(|f| show(f)).collect::<Vec<_>>().join(" "),
                    g.iter().map(|f| show(f)).collect::<Vec<_>>().join(" ")
                )),
                (Err(why), _) => {
                    // The server itself did not answer: the grammar drew a form that stops a
                    // connection (none known); start over on fresh connections.
                    found.push(format!("{case}: directly: {why}"));
                    return found;
                }
                (Ok(_), Err(why)) => {
                    found.push(format!("{case}: through the proxy: {why}"));
                    return found;
                }
            }
            if found.len() > 20 {
                return found;
            }
        }
    }
    // The undocumented ones: each word of the binary as their first argument.
    let info: redis::Value = redis::cmd("COMMAND")
        .query_async(&mut con)
        .await
        .expect("COMMAND");
    let mut undocumented = Vec::new();
    collect_undocumented(&info, &docs, &mut undocumented);
    // Framing does not depend on the protocol: the words go in the RESP2 pass only, and in
    // front of one server only (in front of a cluster these commands take the same path).
    let words = if resp3 || upstream == Upstream::Cluster {
        Vec::new()
    } else {
        binary_words(bin)
    };
    for (name, arity) in &undocumented {
        for chunk in words.chunks(500) {
            let mut input = Vec::new();
            let mut forms = Vec::new();
            for word in chunk {
                step += 1;
                let mut args: Vec<String> = name.split('|').map(str::to_string).collect();
                args.push(word.clone());
                while args.len() < arity.unsigned_abs() as usize || args.len() < 3 {
                    args.push("0".into());
                }
                input.extend(resp(&args));
                input.extend(resp(&["PING", &format!("sweep-{step}")]));
                forms.push((step, args));
            }
            d.send(&input).await;
            a.send(&input).await;
            for (n, args) in forms {
                let token = format!("sweep-{n}");
                let sentinel = format!("${}\r\n{token}\r\n", token.len()).into_bytes();
                let case = format!("{label}: {}", show(&resp(&args)));
                match (
                    until_sentinel(&mut d, &sentinel).await,
                    until_sentinel(&mut a, &sentinel).await,
                ) {
                    (Ok(w), Ok(g)) if w.len() == g.len() || refused_by_proxy(&g) => {}
                    (Ok(w), Ok(g)) => found.push(format!(
                        "{case}: {} frames directly, {} through the proxy",
                        w.len(),
                        g.len()
                    )),
                    (w, g) => {
                        // Pipelined: a command left unanswered shows at a later sentinel.
                        let shown = |r: Result<Vec<Vec<u8>>, String>| match r {
                            Ok(frames) => {
                                frames.iter().map(|f| show(f)).collect::<Vec<_>>().join(" ")
                            }
                            Err(why) => why,
                        };
                        found.push(format!(
                            "{case} (or a word before it, from {:?}): directly {}; through the \
                             proxy {}",
                            chunk.first(),
                            shown(w),
                            shown(g)
                        ));
                        return found;
                    }
                }
            }
            let other = format!("other-{step}");
            let echo = format!("${}\r\n{other}\r\n", other.len()).into_bytes();
            if b.call(&["ECHO", other.as_str()]).await != echo {
                found.push(format!(
                    "{label}: {name} words: the other client's ECHO strayed"
                ));
            }
            if found.len() > 20 {
                return found;
            }
        }
    }
    eprintln!(
        "reply sweep in front of {label} ({}): {} commands, undocumented {:?} with {} words \
         each, {step} forms, {} differences",
        if resp3 { "RESP3" } else { "RESP2" },
        docs.len(),
        undocumented.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        words.len(),
        found.len()
    );
    found
}

/// Commands (and subcommands) of a `COMMAND` reply that take arguments (arity beyond the
/// name and, for a subcommand, its container's) and name no key, whose documentation lists
/// none: (name, arity).
fn collect_undocumented(info: &redis::Value, docs: &[Doc], out: &mut Vec<(String, i64)>) {
    for entry in items(info) {
        let fields = items(entry);
        let (Some(name), Some(redis::Value::Int(arity)), Some(redis::Value::Int(first_key))) =
            (fields.first().and_then(text), fields.get(1), fields.get(3))
        else {
            continue;
        };
        let name = name.to_ascii_lowercase();
        let words = name.split('|').count() as i64;
        let takes_args = *arity < 0 || *arity > words;
        if takes_args && *first_key == 0 && docs.iter().any(|d| d.name == name && d.args.is_empty())
        {
            out.push((name, *arity));
        }
        // Subcommands: the tenth field (Redis 7+).
        if let Some(subs) = fields.get(9) {
            collect_undocumented(subs, docs, out);
        }
    }
}

/// The commands the proxy refuses whatever the policy, in its own words (README.md, Known
/// differences): one error frame where Redis may answer otherwise, or not at all.
fn refused_by_proxy(frames: &[Vec<u8>]) -> bool {
    const OWN: &[&str] = &[
        "-ERR SYNC, PSYNC and REPLCONF cannot pass through redis-policy-proxy",
        "-ERR SCRIPT DEBUG YES and SYNC cannot pass through redis-policy-proxy",
    ];
    matches!(frames, [f] if OWN.iter().any(|own| f.starts_with(own.as_bytes())))
}

fn seed() -> u64 {
    let seed = std::env::var("REPLY_SWEEP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_007)
        });
    eprintln!("reply sweep: seed {seed} (REPLY_SWEEP_SEED={seed} draws the same forms)");
    seed
}

fn tries() -> usize {
    std::env::var("REPLY_SWEEP_TRIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_gets_its_own_replies_through_a_shared_connection() {
    let seed = seed();
    let mut servers = vec![("redis-7.0", common::server_binary())];
    servers.extend(common::matrix_servers());
    let mut found = Vec::new();
    for (label, bin) in &servers {
        for resp3 in [false, true] {
            found.extend(sweep(label, bin, Upstream::Server, resp3, seed, tries()).await);
        }
    }
    assert!(
        found.is_empty(),
        "seed {seed}: replies differ:\n  {}",
        found.join("\n  ")
    );
}

/// The same in front of a cluster of three primaries: commands the proxy fans out to every
/// primary (KEYS, DBSIZE, FLUSHALL, SCRIPT…), splits by slot (MGET, DEL…) or answers itself
/// (CLUSTER, READONLY) must still come back as one reply each, and on the client that sent
/// them. Against one standalone server directly, so a count may differ only where the
/// cluster answers differently in kind, which none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_gets_its_own_replies_in_front_of_a_cluster() {
    let seed = seed();
    let mut servers = vec![("redis-7.0", common::server_binary())];
    servers.extend(common::matrix_servers());
    let mut found = Vec::new();
    for (label, bin) in &servers {
        for resp3 in [false, true] {
            found.extend(sweep(label, bin, Upstream::Cluster, resp3, seed, tries()).await);
        }
    }
    assert!(
        found.is_empty(),
        "seed {seed}: replies differ:\n  {}",
        found.join("\n  ")
    );
}
