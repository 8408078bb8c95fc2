//! Commands in forms drawn from the server's own argument grammar (`COMMAND DOCS`: tokens,
//! optional and repeated arguments, one-of choices, blocks), for the sweeps
//! (`tests/reply_sweep.rs`, `tests/namespace_sweep.rs`), and reading a conversation's
//! replies up to a `PING <token>` sentinel.

use std::time::Duration;

use super::{Raw, Rng, show};

/// Commands (`container|sub` for subcommands) the sweeps do not send: those that change the
/// conversation itself are the state fuzzer's (`tests/state_fuzz.rs`; AUTH and HELLO would
/// also log the sweep's tenant in as another); the rest would stop, pause or rewire the
/// servers the sweeps run on (SCRIPT DEBUG stops a server directly, and the proxy refuses
/// it; Valkey's import mode changes how the server expires keys for later steps).
pub(crate) const LEFT_OUT: &[&str] = &[
    // The conversation's state.
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
    "client|import-source",
];

/// What a sweep's proxy is in front of: one server, or a cluster of three primaries (the
/// proxy presents it as one server).
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Upstream {
    Server,
    Cluster,
}

impl Upstream {
    /// A server's `label` as the sweep reports it: ` cluster` added in front of a cluster.
    pub(crate) fn name(self, label: &str) -> String {
        match self {
            Upstream::Server => label.to_string(),
            Upstream::Cluster => format!("{label} cluster"),
        }
    }
}

/// How long one step may take: a blocking command waits at most 0.01 s or 100 ms, so this
/// only tells a stall from a slow step on a loaded machine (CI once saw a cluster PING take
/// over 5 s while the two sweeps shared two cores; seed 611227973 did not repeat it).
pub(crate) const STEP: Duration = Duration::from_secs(20);

/// One argument of a command's documented grammar.
#[derive(Debug, Clone, Default)]
pub(crate) struct Arg {
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
pub(crate) struct Doc {
    /// `get`, or `client|list` for a subcommand.
    pub(crate) name: String,
    pub(crate) args: Vec<Arg>,
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

pub(crate) fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

pub(crate) fn items(v: &redis::Value) -> &[redis::Value] {
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
pub(crate) fn parse_docs(reply: &redis::Value, out: &mut Vec<Doc>) {
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

/// The keys the sweeps' commands name: a few, so that commands meet each other's data.
pub(crate) const KEYS: &[&str] = &["k1", "k2", "{t}k3", "{t}k4", "s1"];

/// The strings (values, patterns, names) the sweeps' forms use. With the protocol's own
/// words among them, a list or set read back can start like a pub/sub frame, which a
/// dedicated connection's reader once took for one (docs/fuzzing.md, 2026-12-07).
const STRINGS: &[&str] = &[
    "v",
    "x",
    "*",
    "hello world",
    "",
    "1",
    "subscribe",
    "message",
];

/// One form of `doc`, its arguments drawn from the grammar.
pub(crate) fn form(doc: &Doc, rng: &mut Rng) -> Vec<String> {
    form_with(doc, rng, KEYS, STRINGS)
}

/// One form of `doc` whose keys come from `keys` and string arguments from `strings`.
pub(crate) fn form_with(doc: &Doc, rng: &mut Rng, keys: &[&str], strings: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = doc.name.split('|').map(str::to_string).collect();
    let pools = Pools { keys, strings };
    for a in &doc.args {
        draw(a, rng, &pools, &mut out);
    }
    out
}

/// Where a form's keys and strings come from.
struct Pools<'a> {
    keys: &'a [&'a str],
    strings: &'a [&'a str],
}

fn draw(arg: &Arg, rng: &mut Rng, pools: &Pools<'_>, out: &mut Vec<String>) {
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
                draw(&required, rng, pools, out);
            }
            "block" => {
                for child in &arg.children {
                    draw(child, rng, pools, out);
                }
            }
            "key" => out.push(pools.keys[rng.below(pools.keys.len())].to_string()),
            // A timeout of 0 blocks forever: the shortest others instead.
            "double" if arg.name == "timeout" => out.push("0.01".into()),
            "integer" if arg.name == "timeout" || arg.name == "milliseconds" => {
                out.push("100".into())
            }
            "integer" => out.push(["1", "2", "-1", "3", "100"][rng.below(5)].into()),
            "double" => out.push(["1.5", "0.5", "-2", "3"][rng.below(4)].into()),
            "unix-time" => out.push("4102444800".into()),
            _ => out.push(pools.strings[rng.below(pools.strings.len())].into()),
        }
    }
}

/// Each of `docs`, `tries` times, in forms drawn from a generator seeded with `seed`: the
/// step's number (from 1) and the command's arguments.
pub(crate) fn forms(
    docs: &[Doc],
    seed: u64,
    tries: usize,
) -> impl Iterator<Item = (u64, Vec<String>)> {
    let mut rng = Rng(seed | 1);
    docs.iter()
        .flat_map(move |doc| std::iter::repeat_n(doc, tries))
        .map(move |doc| form(doc, &mut rng))
        .zip(1u64..)
        .map(|(args, step)| (step, args))
}

/// The sentinel after step `step`: its `PING <token>` request and the reply Redis gives it
/// in every state the sweeps reach.
pub(crate) fn sentinel_for(step: u64) -> (Vec<u8>, Vec<u8>) {
    let token = format!("sweep-{step}");
    let reply = format!("${}\r\n{token}\r\n", token.len()).into_bytes();
    (super::resp(&["PING", token.as_str()]), reply)
}

/// Frames up to and including the sentinel's reply; `None` when it never came.
pub(crate) async fn until_sentinel(c: &mut Raw, sentinel: &[u8]) -> Result<Vec<Vec<u8>>, String> {
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

/// Every command and subcommand `COMMAND DOCS` documents on the server at `url`, sorted by
/// name, without those in [`LEFT_OUT`] and without HELP subcommands.
pub(crate) async fn documented(url: &str) -> Vec<Doc> {
    let mut con = super::connect(url).await;
    let reply: redis::Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .query_async(&mut con)
        .await
        .expect("COMMAND DOCS");
    let mut docs = Vec::new();
    parse_docs(&reply, &mut docs);
    docs.retain(|d| !LEFT_OUT.contains(&d.name.as_str()) && !d.name.ends_with("|help"));
    docs.sort_by(|a, b| a.name.cmp(&b.name));
    docs
}

/// The seed of a sweep: `var` if set, else from the clock; printed either way.
pub(crate) fn seed(var: &str) -> u64 {
    let seed = super::env_or_clock_seed(var, 1_000_000_007);
    eprintln!("seed {seed} ({var}={seed} draws the same forms)");
    seed
}
