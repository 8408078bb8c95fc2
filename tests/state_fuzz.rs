//! The session-state fuzzer: one client's conversation, drawn at random from the commands that
//! change a connection's state (MULTI/EXEC/DISCARD, WATCH, the SUBSCRIBE family, SELECT,
//! HELLO, CLIENT REPLY/TRACKING/SETNAME, RESET, scripts) mixed with ordinary reads and writes, each
//! spelled the ways Redis still accepts or refuses (wrong argument counts, NUL-suffixed
//! keywords, other case, inline form, several commands in one write), sent to a Redis
//! directly and to a second Redis through the proxy (no policy). Every step's replies must
//! be the same bytes. The proxy keeps its own model of each client's state to route it
//! (which connection, how many replies a command gets, which frames are pushes); a command
//! that Redis refuses but the proxy counts as done (`MULTI x`, a nested MULTI) leaves the two
//! apart, and the steps after it show it: a reply that never comes, or one too many.
//!
//! Each step is followed by a `PING <token>` sentinel: Redis answers it in every state (a
//! bulk string, `pong` inside a RESP2 subscription, `+QUEUED` inside MULTI), so the steps'
//! replies are read up to it on both sides, no sleeping and no idle guess.
//!
//! Half the conversations are two clients' (a case's `b ` lines are the second's): after
//! each step the other client sends a `PING` probe of its own, and what the step did to it
//! (a message it subscribed to, a WATCH another's write spoiled, an invalidation) must come
//! before the probe's reply as from Redis. RESP3 pushes are compared per client over the
//! whole conversation (`converse` says why).
//!
//! Environment: `STATE_FUZZ_SECS` (default 30; 0 replays the regression cases only),
//! `STATE_FUZZ_SEED` (default: from the clock, printed). A difference prints the case
//! (the conversation so far, shortened to the steps that still show it) as a test to add.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::time::{Duration, Instant};

use common::{Pair, Raw, Rng, mask_ids, show};

/// How long the proxy may take for a step Redis answered at once.
const STEP_TIMEOUT: Duration = Duration::from_secs(3);

/// One step: the bytes one write sends (one or several commands), before the sentinel.
#[derive(Clone, Debug)]
struct Step {
    /// Which of the conversation's two clients sends it (0 or 1; `b ` in a case).
    client: usize,
    commands: Vec<Vec<Vec<u8>>>,
    /// Sent as inline commands (`SET k v\r\n`) rather than RESP arrays.
    inline: bool,
}

impl Step {
    fn bytes(&self, token: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for c in &self.commands {
            if self.inline {
                out.extend(c.join(&b' '));
                out.extend_from_slice(b"\r\n");
            } else {
                out.extend(common::resp(c));
            }
        }
        // CLIENT REPLY OFF or SKIP would swallow the sentinel's reply too: `CLIENT REPLY ON`
        // after the step turns replies back on (its own reply is the one SKIP skips).
        if self.commands.iter().any(|c| {
            c.len() >= 2
                && c[0].eq_ignore_ascii_case(b"CLIENT")
                && c[1].eq_ignore_ascii_case(b"REPLY")
        }) {
            out.extend(common::resp(&["CLIENT", "REPLY", "ON"]));
        }
        out.extend(common::resp(&[b"PING".as_slice(), token.as_bytes()]));
        out
    }

    fn show(&self) -> String {
        let cmds: Vec<String> = self
            .commands
            .iter()
            .map(|c| {
                c.iter()
                    .map(|a| show(a).trim_matches('"').to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        format!(
            "{}{}{}",
            if self.client == 1 { "b " } else { "" },
            if self.inline { "inline " } else { "" },
            cmds.join(" | ")
        )
    }
}

/// Arguments that are printable with no space: the inline form can carry them.
fn inline_safe(c: &[Vec<u8>]) -> bool {
    c.iter().all(|a| {
        !a.is_empty()
            && a.iter()
                .all(|&b| b.is_ascii_graphic() && b != b'"' && b != b'\'')
    })
}

/// Commands whose effect on the connection the proxy follows, and the plain ones around them.
/// `KEY`/`CH` stand for one of a few names, so commands meet each other's keys and channels.
const VOCABULARY: &[&str] = &[
    "MULTI",
    "EXEC",
    "DISCARD",
    "WATCH KEY",
    "WATCH KEY KEY",
    "UNWATCH",
    "SUBSCRIBE CH",
    "SUBSCRIBE CH CH",
    "UNSUBSCRIBE",
    "UNSUBSCRIBE CH",
    "PSUBSCRIBE CH*",
    "PUNSUBSCRIBE",
    "SSUBSCRIBE CH",
    "SUNSUBSCRIBE",
    "PUBLISH CH hello",
    "SPUBLISH CH hello",
    "SELECT 0",
    "SELECT 1",
    "SELECT 99",
    "SELECT x",
    "HELLO 2",
    "HELLO 3",
    "HELLO 4",
    "HELLO",
    "HELLO 3 SETNAME fuzz",
    "HELLO 2 AUTH default wrong",
    "HELLO 3 AUTH nobody wrong",
    "HELLO 2 AUTH nobody wrong",
    "CLIENT SETNAME fuzzy",
    "CLIENT GETNAME",
    "CLIENT REPLY SKIP",
    "CLIENT REPLY OFF",
    "CLIENT REPLY ON",
    "CLIENT TRACKING ON",
    "CLIENT TRACKING ON BCAST PREFIX k",
    "CLIENT TRACKING OFF",
    "CLIENT CACHING YES",
    "CLIENT TRACKINGINFO",
    "CLIENT GETREDIR",
    "CLIENT NO-EVICT ON",
    "RESET",
    "PING",
    "PING x",
    "ECHO e",
    "SET KEY v",
    "GET KEY",
    "INCR KEY",
    "DEL KEY",
    "LPUSH KEY a",
    "BLPOP KEY 0.01",
    "XREAD BLOCK 10 STREAMS KEY 0",
    "EXISTS KEY KEY",
    "AUTH default wrong",
    "AUTH nobody wrong",
    // A Redis ACL user every server has (`first_difference`): the client's own login, on
    // its dedicated connection or, in front of a cluster, on every primary.
    "AUTH fuzzer pw",
    "HELLO 3 AUTH fuzzer pw",
    "HELLO 2 AUTH fuzzer pw SETNAME fz",
    "NOSUCHCOMMAND",
    // Scripts run on the session's own connection (not pinned), so they change the target
    // between the shared and the dedicated connection like a blocking command; inside MULTI
    // and a subscription they are queued or refused like any other command.
    "EVAL return(1) 0",
    "EVAL return(redis.call('GET',KEYS[1])) 1 KEY",
    "EVAL return(redis.call('INCR',KEYS[1])) 1 KEY",
    "EVAL_RO return(redis.call('EXISTS',KEYS[1])) 1 KEY",
    "EVAL return(redis.call('SELECT','1')) 0",
    "EVALSHA 0123456789012345678901234567890123456789 0",
    "WAIT 0 0",
    "GETEX KEY PERSIST",
    // In front of a cluster these go to every primary; inside MULTI, after EXEC ran them
    // on the transaction's node.
    "FLUSHDB",
    "CONFIG SET maxmemory-samples 5",
];

const KEYS: &[&str] = &["k1", "k2", "{s}k3"];
/// In front of a cluster: one hash slot, so a multi-key command is one node's, as on one
/// server (across slots the proxy splits or refuses, on purpose: docs/cluster.md).
const CLUSTER_KEYS: &[&str] = &["{s}k1", "{s}k2", "{s}k3"];
const CHANNELS: &[&str] = &["c1", "c2"];

fn draw(rng: &mut Rng, keys: &[&str]) -> Vec<Vec<u8>> {
    let mut line = VOCABULARY[rng.below(VOCABULARY.len())];
    if keys == CLUSTER_KEYS && line.starts_with("PUBLISH") {
        // In front of a cluster a PUBLISH counts the receivers of the node it runs on, which
        // for a session pinned to another node is not the proxy's pub/sub node
        // (docs/cluster.md): not a difference to look for. SPUBLISH's count is the shard's.
        line = "SPUBLISH CH hello";
    }
    let mut args: Vec<Vec<u8>> = line
        .split(' ')
        .map(|w| match w {
            "KEY" => keys[rng.below(keys.len())].as_bytes().to_vec(),
            "CH" => CHANNELS[rng.below(CHANNELS.len())].as_bytes().to_vec(),
            "CH*" => b"c*".to_vec(),
            w => w.as_bytes().to_vec(),
        })
        .collect();
    match rng.below(10) {
        // An argument too many: Redis refuses the command before anything else. Not to a
        // shard (un)subscription, which takes any number: `extra` is a channel of another
        // slot, which a cluster refuses (CROSSSLOT, a documented difference) and which
        // CLIENT REPLY SKIP hides (seed 34641666).
        0 if !args[0].eq_ignore_ascii_case(b"SSUBSCRIBE")
            && !args[0].eq_ignore_ascii_case(b"SUNSUBSCRIBE") =>
        {
            args.push(b"extra".to_vec())
        }
        // One too few (the name stays).
        1 if args.len() > 1 => {
            args.pop();
        }
        // A keyword Redis reads up to the NUL (`strcasecmp`), which the proxy must read
        // the same. Not a subcommand's name (CLIENT's, CONFIG's): Redis finds those in a
        // hash table whose seed is random per process, so `NO-EVICT\0` is an unknown
        // subcommand to most servers and NO-EVICT to about one in 32, and two servers need
        // not agree; the proxy answers every such name as unknown (docs/compatibility.md,
        // the NUL row), where Redis 7.0 runs some (`CONFIG SET\0`, seed 38862202).
        2 if args.len() > 1 => {
            let i = 1 + rng.below(args.len() - 1);
            let container = [&b"CLIENT"[..], b"CONFIG"]
                .iter()
                .any(|c| args[0].eq_ignore_ascii_case(c));
            if !(i == 1 && container) {
                args[i].push(0);
            }
        }
        // Case.
        3 => args[0] = args[0].to_ascii_lowercase(),
        _ => {}
    }
    args
}

/// A step of client 0, or of either client in a conversation of two.
fn draw_step(rng: &mut Rng, keys: &[&str], clients: usize) -> Step {
    let n = if rng.below(5) == 0 {
        2 + rng.below(2)
    } else {
        1
    };
    let commands: Vec<_> = (0..n).map(|_| draw(rng, keys)).collect();
    let inline = rng.below(6) == 0 && commands.iter().all(|c| inline_safe(c));
    Step {
        client: rng.below(clients),
        commands,
        inline,
    }
}

/// Whether `frame` is the sentinel's reply, in any state: the bulk token, RESP2's
/// `pong` inside a subscription, or `+QUEUED` inside MULTI when it is not the first frame
/// (the step's own command answered first).
fn ends_step(frame: &[u8], token: &str, read: usize) -> bool {
    let bulk = common::bulk(token.as_bytes());
    let mut pong = b"*2\r\n$4\r\npong\r\n".to_vec();
    pong.extend(&bulk);
    frame == bulk || frame == pong || (frame == b"+QUEUED\r\n" && read > 0)
}

/// Whether `frame` is the reply to the other client's probe (`PING <token>` alone): its
/// bulk string, `pong` in a RESP2 subscription, or `+QUEUED` inside MULTI.
fn ends_probe(frame: &[u8], token: &str) -> bool {
    ends_step(frame, token, 1)
}

/// The channel of a (P|S)UNSUBSCRIBE confirmation frame, either protocol.
fn unsubscribed(frame: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    for kind in ["unsubscribe", "punsubscribe", "sunsubscribe"] {
        for head in ["*3", ">3"] {
            let prefix = format!("{head}\r\n${}\r\n{kind}\r\n", kind.len());
            if let Some(rest) = frame.strip_prefix(prefix.as_bytes()) {
                let end = common::frame_len(rest)?;
                return Some((frame[..prefix.len()].to_vec(), rest[..end].to_vec()));
            }
        }
    }
    None
}

/// Redis unsubscribes from all channels in its hash table's order, which differs between
/// two servers (a random hash seed each): a run of confirmations gets its channel names
/// sorted, the counts left where they are.
fn normalize(frames: &mut [Vec<u8>]) {
    let mut i = 0;
    while i < frames.len() {
        let mut j = i;
        let mut names = Vec::new();
        while let Some((_, name)) = frames.get(j).and_then(|f| unsubscribed(f)) {
            names.push(name);
            j += 1;
        }
        if j - i > 1 {
            names.sort();
            for (f, name) in frames[i..j].iter_mut().zip(names) {
                let (head, old) = unsubscribed(f).expect("a confirmation");
                let mut out = head.clone();
                out.extend(&name);
                out.extend(&f[head.len() + old.len()..]);
                *f = out;
            }
        }
        i = j.max(i + 1);
    }
}

/// A refusal the proxy makes on purpose (README.md, "Known differences from talking to Redis
/// directly"): inside MULTI, a SUBSCRIBE that Redis would confirm with several frames, and a
/// command the proxy answers itself (CLIENT REPLY, GETNAME…, HELLO). The
/// conversation is not compared past it.
fn documented_refusal(frames: &[Vec<u8>]) -> bool {
    let has = |f: &[u8], text: &[u8]| f.windows(text.len()).any(|w| w == text);
    frames.iter().any(|f| {
        f.starts_with(b"-")
            && (has(f, b"redis/redis#12207")
                || has(f, b"'client|reply' not allowed inside a transaction")
                || has(f, b"by redis-policy-proxy")
                // The policy's own refusals (the default policy's run).
                || f.starts_with(b"-NOPERM policy ")
                // In front of a cluster (docs/cluster.md): SELECT, the keys of other nodes
                // once a session is pinned to one.
                || has(f, b"SELECT is not allowed in cluster mode")
                || f.starts_with(b"-CROSSSLOT")
                // Tracking spread over every primary: a tracking command in MULTI, REDIRECT,
                // the client's own AUTH, OFF over a held connection.
                || has(f, b"in front of a Redis Cluster while")
                // A whole-keyspace command from a client whose own login is on one node.
                || has(f, b"logged in as its own Redis user on one node only"))
            // A script's SELECT refused by a cluster node, inside EXEC's reply (seed
            // 89816556): the same documented difference, one level down.
            || (f.starts_with(b"*") && has(f, b"-ERR SELECT is not allowed in cluster mode"))
    })
}

/// In front of a cluster: a client that turned its replies off (CLIENT REPLY OFF or SKIP)
/// and then sent what a cluster refuses by design (SELECT of another database, a login
/// while tracking is spread, shard channels of several slots: documented differences) got
/// no refusal to show it; Redis ran it. Not compared past it (seeds 34641666, 35420542).
fn hidden_refusal(steps: &[Step]) -> bool {
    let is = |c: &[Vec<u8>], i: usize, w: &str| {
        c.get(i)
            .is_some_and(|a| a.eq_ignore_ascii_case(w.as_bytes()))
    };
    [0, 1].into_iter().any(|client| {
        let mut off = false;
        steps.iter().filter(|s| s.client == client).any(|s| {
            s.commands.iter().any(|c| {
                if is(c, 0, "CLIENT") && is(c, 1, "REPLY") && (is(c, 2, "OFF") || is(c, 2, "SKIP"))
                {
                    off = true;
                    return false;
                }
                let refused = (is(c, 0, "SELECT") && !is(c, 1, "0"))
                    || is(c, 0, "AUTH")
                    || (is(c, 0, "HELLO") && c.iter().any(|a| a.eq_ignore_ascii_case(b"AUTH")))
                    || (is(c, 0, "SSUBSCRIBE") && c.len() > 2);
                off && refused
            })
        })
    })
}

/// One step's frames: all of them up to the sentinel's reply, or (`Err`) those that came
/// before the side went silent or closed. In a conversation of two clients, the acting
/// client's frames, [`OTHER`], then the other client's up to its probe's reply.
type Seen = Result<Vec<Vec<u8>>, Vec<Vec<u8>>>;

/// Between the acting client's frames and the other client's in a step's [`Seen`].
const OTHER: &[u8] = b"(the other client:)";

/// How many frames (pushes aside) each step got from Redis: the acting client's, and the
/// other client's probe in a conversation of two.
type Counts = (usize, Option<usize>);

/// Reads one client's frames for a step, RESP3 pushes (`>`) apart into `pushes`: `n` of
/// them, or (without `n`) up to the reply `ends` recognises. After a `+QUEUED` that may be
/// the sentinel's (several commands of one step may answer `+QUEUED` inside MULTI) the
/// step ends only once nothing more arrives for a moment.
async fn read_step(
    c: &mut Raw,
    n: Option<usize>,
    within: Duration,
    ends: impl Fn(&[u8], usize) -> bool,
    pushes: &mut Vec<Vec<u8>>,
) -> Seen {
    let until = Instant::now() + within;
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut settling = false;
    loop {
        if n == Some(frames.len()) {
            return Ok(frames);
        }
        let wait = if settling {
            Duration::from_millis(25)
        } else {
            until.saturating_duration_since(Instant::now())
        };
        let got = c.collect_frames(1, wait).await;
        let Some(f) = got.frames.into_iter().next() else {
            return if settling { Ok(frames) } else { Err(frames) };
        };
        if f.starts_with(b">") {
            pushes.push(mask_ids(&f));
            continue;
        }
        let last = n.is_none() && ends(&f, frames.len());
        let queued = f == b"+QUEUED\r\n";
        frames.push(f);
        if last && !queued {
            return Ok(frames);
        }
        settling = last;
    }
}

/// A conversation's replies, step by step, from one side, then (last) each client's RESP3
/// pushes. `Err` where a step got no sentinel within `within` (the side stalled) or the
/// connection closed. `counts`: how many frames each step got from Redis, read as many from
/// the proxy.
///
/// Pushes are compared per client over the whole conversation, not per step: RESP3 puts
/// them out of band, and through the proxy a RESP3 subscriber's messages come on its own
/// connection while its other commands take the shared one (README, Known differences), so a
/// message may arrive a step later than from Redis; their content and order still count.
async fn converse(
    addr: &str,
    steps: &[Step],
    within: Duration,
    counts: Option<&[Counts]>,
    want_pushes: Option<[usize; 2]>,
) -> Vec<Seen> {
    let two = steps.iter().any(|s| s.client == 1);
    let mut clients = vec![Raw::connect(addr).await];
    if two {
        clients.push(Raw::connect(addr).await);
    }
    let mut pushes: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
    let mut out = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let token = format!("sentinel-{i}");
        let count = counts.and_then(|n| n.get(i));
        let x = s.client;
        clients[x].send(&s.bytes(&token)).await;
        let mine = read_step(
            &mut clients[x],
            count.map(|c| c.0),
            within,
            |f, read| ends_step(f, &token, read),
            &mut pushes[x],
        )
        .await;
        let mut frames = match mine {
            Ok(frames) => frames,
            Err(partial) => {
                out.push(Err(partial.iter().map(|f| mask_ids(f)).collect()));
                // The rest cannot be compared step by step: stop here.
                return out;
            }
        };
        normalize(&mut frames);
        if two {
            // What the step did to the other client (a message, WATCH spoiled…): its
            // frames up to a probe of its own, which Redis answers after them.
            let y = 1 - x;
            let probe = format!("probe-{i}");
            clients[y]
                .send(&common::resp(&[b"PING".as_slice(), probe.as_bytes()]))
                .await;
            let theirs = read_step(
                &mut clients[y],
                count.and_then(|c| c.1),
                within,
                |f, _| ends_probe(f, &probe),
                &mut pushes[y],
            )
            .await;
            frames.push(OTHER.to_vec());
            match theirs {
                Ok(theirs) => frames.extend(theirs),
                Err(partial) => {
                    frames.extend(partial);
                    out.push(Err(frames.iter().map(|f| mask_ids(f)).collect()));
                    return out;
                }
            }
        }
        out.push(Ok(frames.iter().map(|f| mask_ids(f)).collect()));
    }
    // Pushes still on their way through the proxy: wait for as many as Redis sent.
    if let Some(want) = want_pushes {
        for (c, (client, want)) in clients.iter_mut().zip(want).enumerate() {
            while pushes[c].len() < want {
                let got = client.collect_frames(1, within).await;
                let Some(f) = got.frames.into_iter().next() else {
                    break;
                };
                pushes[c].push(mask_ids(&f));
            }
        }
    }
    for log in &mut pushes {
        normalize(log);
    }
    let mut last = pushes[0].clone();
    if two {
        last.push(OTHER.to_vec());
        last.extend(pushes[1].iter().cloned());
    }
    out.push(Ok(last));
    out
}

/// The two sides a conversation is held with.
struct Sides {
    /// A Redis reached directly.
    direct: String,
    /// The proxy, in front of another Redis (or a cluster).
    proxy: String,
    /// The servers to empty before each conversation: the direct one and the proxy's.
    servers: Vec<String>,
    /// The key names conversations use.
    keys: &'static [&'static str],
    /// The proxy is in front of a cluster (its documented refusals may be hidden).
    cluster: bool,
}

/// The first step at which the proxy's replies differ from Redis's, with both.
async fn first_difference(sides: &Sides, steps: &[Step]) -> Option<(usize, String, String)> {
    // Each conversation starts from an empty keyspace on both sides.
    // And every server has the ACL user `fuzzer` (password `pw`, every right).
    for addr in &sides.servers {
        let mut c = Raw::connect(addr).await;
        assert_eq!(c.call(&["FLUSHALL"]).await, b"+OK\r\n");
        let user = ["ACL", "SETUSER", "fuzzer", "on", ">pw", "~*", "&*", "+@all"];
        assert_eq!(c.call(&user).await, b"+OK\r\n");
    }
    let want = converse(&sides.direct, steps, Duration::from_secs(10), None, None).await;
    let counts: Vec<Counts> = want
        .iter()
        .take(steps.len())
        .flatten()
        .map(|frames| match frames.iter().position(|f| f == OTHER) {
            Some(at) => (at, Some(frames.len() - at - 1)),
            None => (frames.len(), None),
        })
        .collect();
    // The last entry: each client's pushes, `OTHER` between the two.
    let want_pushes = match want.get(steps.len()) {
        Some(Ok(pushes)) => match pushes.iter().position(|f| f == OTHER) {
            Some(at) => [at, pushes.len() - at - 1],
            None => [pushes.len(), 0],
        },
        _ => [0, 0],
    };
    let got = converse(
        &sides.proxy,
        steps,
        STEP_TIMEOUT,
        Some(&counts),
        Some(want_pushes),
    )
    .await;
    let render = |r: Option<&Seen>| match r {
        Some(Ok(frames)) => show(&frames.concat()),
        Some(Err(partial)) => format!(
            "{} then nothing (a reply missing, or the connection closed)",
            show(&partial.concat())
        ),
        None => "(not reached)".to_string(),
    };
    // Where Redis itself went silent (CLIENT REPLY OFF, then a subscription that refuses the
    // CLIENT REPLY ON after it) nothing more can be compared.
    let comparable = want
        .iter()
        .position(Result::is_err)
        .unwrap_or(steps.len() + 1);
    let i = (0..comparable).find(|&i| want.get(i) != got.get(i))?;
    if let Some(Ok(frames) | Err(frames)) = got.get(i)
        && documented_refusal(frames)
    {
        return None;
    }
    if sides.cluster && hidden_refusal(&steps[..(i + 1).min(steps.len())]) {
        return None;
    }
    // Past the last step: each client's RESP3 pushes over the whole conversation.
    let label = if i == steps.len() { "(pushes) " } else { "" };
    Some((
        i,
        format!("{label}{}", render(want.get(i))),
        format!("{label}{}", render(got.get(i))),
    ))
}

/// Drops steps while the conversation still shows a difference.
async fn shorten(sides: &Sides, mut steps: Vec<Step>) -> Vec<Step> {
    let mut i = 0;
    while i < steps.len() {
        let mut shorter = steps.clone();
        shorter.remove(i);
        if !shorter.is_empty() && first_difference(sides, &shorter).await.is_some() {
            steps = shorter;
        } else {
            i += 1;
        }
    }
    steps
}

fn parse_case(text: &str) -> Vec<Step> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (client, l) = match l.strip_prefix("b ") {
                Some(rest) => (1, rest),
                None => (0, l),
            };
            let (inline, l) = match l.strip_prefix("inline ") {
                Some(rest) => (true, rest),
                None => (false, l),
            };
            let commands = l
                .split(" | ")
                .map(|c| {
                    c.split(' ')
                        .map(|a| a.replace("\\x00", "\0").into_bytes())
                        .collect()
                })
                .collect();
            Step {
                client,
                commands,
                inline,
            }
        })
        .collect()
}

/// Conversations that once left the proxy's model of the client apart from Redis's.
const REGRESSIONS: &[(&str, &str)] = &[
    (
        // State fuzzer seed 23750171, in front of a cluster: FLUSHDB sent to every primary
        // flushed each node, and each told the tracking client "everything" (a null): three
        // invalidations where one Redis sends one.
        "FLUSHDB while tracking in RESP3, then RESET",
        "b CLIENT REPLY ON | CLIENT CACHING | HELLO 3 SETNAME fuzz\nb CLIENT TRACKING ON\nb FLUSHDB | RESET | WATCH {s}k1",
    ),
    (
        // State fuzzer seed 98716988, in front of a cluster (in CI): the nulls were dropped
        // only while the first was unwritten, so one that came after it was written went
        // through: two for one FLUSHDB of another client.
        "another client's FLUSHDB is one invalidation, however late the nodes tell it",
        "b HELLO 3 SETNAME fuzz\nb CLIENT TRACKING ON BCAST PREFIX k\ninline FLUSHDB | AUTH default",
    ),
    (
        // And the count: two flushes are two invalidations, as from one Redis, though no
        // reply of the tracking client lies between them.
        "two flushes in a row are two invalidations",
        "b HELLO 3\nb CLIENT TRACKING ON BCAST\nFLUSHDB | FLUSHALL\nFLUSHDB",
    ),
    (
        // Invariant fuzzer seed 52316624: the proxy opened a transaction for a MULTI Redis
        // refused, then waited for SUBSCRIBE's +QUEUED; in RESP3 the confirmation is a push,
        // so the PING after it never got its reply.
        "MULTI with an argument, then SUBSCRIBE in RESP3",
        "HELLO 3\nMULTI STORE 1001\nSUBSCRIBE c1 | PING",
    ),
    (
        // The nested MULTI reset the proxy's transaction: a command refused in it no longer
        // aborted EXEC (shown here with one Redis refuses at queue time).
        "a nested MULTI keeps the transaction",
        "MULTI\nSET k1 v\nMULTI\nNOSUCHCOMMAND\nEXEC\nGET k1",
    ),
    (
        "RESET with an argument is an error, not a reset",
        "SELECT 1\nRESET extra\nSET k1 v\nSELECT 0\nGET k1",
    ),
    (
        "EXEC with an argument spoils the transaction, which stays open",
        "MULTI\nSET k1 v\nEXEC extra\nGET k1\nEXEC\nGET k1",
    ),
    (
        // Counted as a plain reply, the push-framed confirmation left every later reply one
        // command late.
        "UNSUBSCRIBE without subscriptions, RESP3, on the client's own connection",
        "CLIENT TRACKING OFF\nHELLO 3\nUNSUBSCRIBE | CLIENT GETNAME | EXISTS k2",
    ),
    (
        // Still read as subscribed, CLIENT REPLY OFF went to Redis and silenced the upstream
        // connection.
        "CLIENT REPLY OFF after unsubscribing from everything, RESP2",
        "SUBSCRIBE c1\nUNSUBSCRIBE c1\ninline PING extra | CLIENT REPLY OFF | SELECT 1 extra",
    ),
    (
        "a command pipelined behind SUBSCRIBE is read in the subscribed context",
        "SUBSCRIBE c1 | CLIENT SETNAME x | UNSUBSCRIBE c1 | CLIENT GETNAME",
    ),
    (
        "keywords the proxy reads itself end at NUL, as in Redis",
        "CLIENT REPLY ON\\x00\nCLIENT PAUSE 10 NOSUCHMODE\nGET k1",
    ),
    (
        "HELLO SETNAME on the client's own connection names the client",
        "CLIENT NO-EVICT ON\nHELLO 3 SETNAME fuzz | CLIENT GETNAME",
    ),
    (
        "CLIENT REPLY SKIP skips RESET's reply",
        "CLIENT REPLY SKIP | RESET | CLIENT CACHING YES",
    ),
    (
        // The protocol was taken when the HELLO was sent: a refused AUTH left the session
        // reading the connection's RESP3 replies as RESP2.
        "a refused HELLO AUTH keeps the protocol, on the client's own connection too",
        "HELLO 3\nCLIENT TRACKING OFF\nHELLO 2 AUTH nobody wrong\nCLIENT GETNAME | GET k1\nHELLO 2 AUTH nobody wrong\nCLIENT GETNAME",
    ),
    (
        // The proxy answered RESET and closed the subscriptions' connection; Redis drops a
        // closed connection's subscriptions only once it reads the close, so the PUBLISH
        // after it (on the shared connection) often still counted the client. A race: the
        // case repeats it.
        "RESET drops the subscriptions before the next command runs",
        "SUBSCRIBE c1\nRESET | PUBLISH c1 hello\nSUBSCRIBE c1\nRESET | PUBLISH c1 hello\nSSUBSCRIBE c2\nRESET | SPUBLISH c2 hello\nHELLO 3\nSUBSCRIBE c1\nRESET | PUBLISH c1 hello\nb SUBSCRIBE c2\nb RESET | PUBLISH c2 hello\nb SUBSCRIBE c2\nb RESET | PUBLISH c2 hello",
    ),
    (
        // In front of a cluster the proxy answers SSUBSCRIBE itself, and with replies off it
        // kept the confirmations Redis sends as it sends messages.
        "shard subscription confirmations with CLIENT REPLY OFF",
        "HELLO 3\nCLIENT REPLY OFF | SSUBSCRIBE c1 | SUNSUBSCRIBE c1\nCLIENT REPLY SKIP | SSUBSCRIBE c2 | GET k1",
    ),
    (
        // In front of a cluster the proxy answers a transaction's keyless commands before its
        // first key itself (`+QUEUED`): one Redis refuses at queue time got `+QUEUED` too.
        "a transaction's command refused at queue time, before any key",
        "MULTI\nSELECT\nPUBLISH c2 hello extra | NOSUCHCOMMAND\nCLIENT NOSUCH\nEXEC\nGET k1",
    ),
    (
        // In front of a cluster the MULTI waits for its first key with no connection yet; the
        // end of the connection RESET dropped then closed the session.
        "a MULTI pipelined after RESET of a session on its own connection",
        "CLIENT NO-EVICT ON\nRESET | MULTI\nGET k1\nEXEC\nCLIENT TRACKING OFF\nRESET | MULTI | ECHO e extra\nBLPOP k1 0.01\nEXEC",
    ),
    (
        // In front of a cluster, UNSUBSCRIBE's last confirmation (count 0) released the session
        // from subscribing though a SUBSCRIBE after it was in flight: the EXEC after them went
        // to Redis instead of the subscribed context's refusal.
        "UNSUBSCRIBE then SUBSCRIBE pipelined, RESP2",
        "SUBSCRIBE c2\nUNSUBSCRIBE | SUBSCRIBE c2 | EXEC\nUNSUBSCRIBE | PING",
    ),
    (
        // The blocking XREAD's connection (RESP2) was replaced for the CLIENT TRACKING after
        // HELLO 3 while the XREAD ran on it: its reply was lost.
        "a dedicated connection is not replaced under a blocking command",
        "XREAD BLOCK 10 STREAMS k2 0 | HELLO 3 SETNAME fuzz | CLIENT TRACKING OFF",
    ),
    (
        // In front of a cluster (seed 42830715): with tracking on over every primary, a
        // tracking command without its argument was read past its arguments; the session's
        // task panicked and the client's connection closed.
        "CLIENT TRACKING without ON or OFF while tracking is on",
        "CLIENT TRACKING ON BCAST PREFIX k | UNSUBSCRIBE | CLIENT TRACKING\nCLIENT CACHING",
    ),
    (
        // In front of a cluster (seed 31143294): a RESP2 client's tracking is spread over
        // every primary; its HELLO 3, forwarded on the dedicated connection its AUTH opened,
        // switched that connection only, and TRACKINGINFO came from another one in RESP2.
        "HELLO forwarded on the dedicated connection while tracking is spread",
        "inline CLIENT TRACKING ON BCAST PREFIX k\nAUTH default\\x00 wrong\nHELLO 3\nCLIENT TRACKINGINFO | CLIENT SETNAME fuzzy | UNWATCH",
    ),
    (
        // Seed 22006596: a PSUBSCRIBE run by EXEC put the RESP2 client in the subscribed
        // context, where Redis refuses HELLO before reading its version; the proxy, which
        // had not counted the subscription, answered NOPROTO itself.
        "HELLO with a bad version after EXEC subscribed the client",
        "b MULTI\nb PSUBSCRIBE c* | select 99 | SELECT x\\x00\nb EXEC\nb HELLO 4\nb HELLO x",
    ),
    (
        // Seed 92563583: the subscription counts were read from top-level confirmations
        // only; a SUBSCRIBE run by EXEC left the RESP2 client subscribed while the proxy
        // counted none, and it answered CLIENT SETNAME itself where Redis refuses it.
        "CLIENT SETNAME after EXEC subscribed the client",
        "b MULTI | DEL {s}k3\\x00 | PUNSUBSCRIBE\nb SUBSCRIBE c2 | EXEC | HELLO 3 AUTH nobody wrong\nb inline CLIENT SETNAME fuzzy",
    ),
    (
        // Seed 22006596 again: `EXEC extra` ends the transaction (EXECABORT); the proxy kept
        // it open in its view, took the SUBSCRIBE pipelined after it for queued, and the
        // next commands' replies were waited for in vain.
        "a SUBSCRIBE pipelined after an EXEC with an argument",
        "b MULTI\nb inline EXEC extra | SUBSCRIBE c1\nb PSUBSCRIBE c* | select 99 | SELECT x\\x00",
    ),
    (
        // PING refuses more than one argument itself; the proxy's own answer in a RESP2
        // shard subscriber's context (in front of a cluster) refused it as not allowed there.
        "PING with two arguments while subscribed to a shard channel",
        "SSUBSCRIBE c2\nPING x extra\nSUNSUBSCRIBE",
    ),
    (
        // Cluster seed 34641666: a HELLO whose AUTH Redis takes, then refuses a later option,
        // has logged the client in and named it (Redis 7.0 runs the options in order); the
        // proxy took the error for a refused login, in front of one server and of a cluster.
        "an accepted AUTH in a HELLO refused for a later option",
        "HELLO 2 AUTH fuzzer pw SETNAME fz extra\nCLIENT GETNAME | ACL WHOAMI",
    ),
    (
        // In front of a cluster (seed 35420542): a SUBSCRIBE queued in a discarded MULTI
        // left the session held as a subscriber; a shard subscription after it was then not
        // seen as the subscribed context, and PING was answered as outside it.
        "SSUBSCRIBE after a discarded transaction that queued a SUBSCRIBE",
        "MULTI\nSUBSCRIBE c2\nDISCARD\nSSUBSCRIBE c1\nPING",
    ),
    (
        // Seed 70117499: the same from a RESP3 client, whose AUTH ran on a connection
        // dialled raw (RESP2); the proxy kept it and the next command found it in the wrong
        // protocol (its dedicated connection lost).
        "a HELLO logged in then refused, from a RESP3 client",
        "hello 3\nHELLO 2 AUTH default wrong extra\nGET k1\nHELLO 2 AUTH fuzzer pw SETNAME\nGET k1",
    ),
    (
        // Redis runs HELLO's options in order: an AUTH refused before a bad option is what
        // it answers, a SETNAME before one is done.
        "HELLO's options in order",
        "HELLO 3 AUTH nobody wrong extra\nHELLO 3 SETNAME fuzz extra | CLIENT GETNAME",
    ),
    (
        // Default policy (seed 95630048): the TTL rule's hidden scripts around a write read
        // the key's PTTL, which Redis tracked for a client with CLIENT TRACKING on; it then
        // got two invalidations of a key it never read. The scripts only write now.
        "the TTL rule's hidden scripts are not tracked reads",
        "HELLO 3\nCLIENT TRACKING ON\nINCR {s}k3 | EVAL return(redis.call('INCR',KEYS[1])) 1 {s}k3",
    ),
    (
        // Namespace (seed 49885352): Redis's refusal of an overlapping BCAST prefix quoted
        // the prefix as sent, the tenant's namespace included.
        "an error quoting tracking prefixes shows them as the client wrote them",
        "HELLO 3\nCLIENT TRACKING ON BCAST PREFIX k\nCLIENT TRACKING ON BCAST PREFIX k",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_follows_every_state_change_redis_makes() {
    let pair = Pair::start().await;
    let sides = Sides {
        direct: pair.direct.addr(),
        proxy: pair.proxy.addr.to_string(),
        servers: vec![pair.direct.addr(), pair.upstream.addr()],
        keys: KEYS,
        cluster: false,
    };
    fuzz(&sides, REGRESSIONS, "", secs("STATE_FUZZ_SECS", 30)).await;
}

/// The same conversations through the proxy running `policy/default.yaml` with its
/// data-changing rules enforced (as after the rollout): every key a write creates gets a
/// TTL by hidden commands the proxy adds (their replies masked out of the client's, inside
/// MULTI out of EXEC's array too), PERSIST is refused, audited commands are recorded. None of
/// that may change what the client sees of its connection's state; the policy's own
/// refusals (`-NOPERM policy …`) end a conversation's comparison. Random conversations for
/// `STATE_FUZZ_POLICY_SECS` (default 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_default_policy_the_proxy_follows_every_state_change() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let yaml = common::default_policy_enforced();
    fuzz_with_policy(&yaml, &path, " (default policy)", "STATE_FUZZ_POLICY_SECS").await;
}

/// The conversations through a proxy running `yaml` (read as the file `path`) in front of
/// one Redis, against another; random ones for `var` seconds (default 20).
async fn fuzz_with_policy(yaml: &str, path: &std::path::Path, what: &str, var: &str) {
    let direct = common::RedisServer::start();
    let upstream = common::RedisServer::start();
    let mut config = redis_policy_proxy::setup::from_yaml(yaml, path).expect("the policy loads");
    config.set_upstream(upstream.addr());
    let proxy = common::Proxy::start(config).await;
    let sides = Sides {
        direct: direct.addr(),
        proxy: proxy.addr.to_string(),
        servers: vec![direct.addr(), upstream.addr()],
        keys: KEYS,
        cluster: false,
    };
    fuzz(&sides, REGRESSIONS, what, secs(var, 20)).await;
}

/// The same conversations as a tenant whose keys and channels live under a namespace
/// (`a:`, every loopback client is tenant `a`): the proxy prefixes every key and channel it
/// sends and takes the prefix off every name in a reply (a subscription's confirmation, a
/// message, an invalidation), so the client sees its connection as one Redis shows it.
/// Random conversations for `STATE_FUZZ_NAMESPACE_SECS` (default 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_namespace_the_proxy_follows_every_state_change() {
    let yaml = "access:\n  identities:\n    - {tenant: a, cidr: 127.0.0.0/8}\n  namespaces:\n    a: 'a:'\n";
    let path = std::path::Path::new("namespace.yaml");
    fuzz_with_policy(yaml, path, " (namespace)", "STATE_FUZZ_NAMESPACE_SECS").await;
}

/// The same conversations as production runs them in front of a cluster: the default policy
/// enforced and a tenant's namespace (`a:`, every loopback client), against one Redis. The
/// regressions always; random conversations for `STATE_FUZZ_CLUSTER_POLICY_SECS` (default 0:
/// by hand, each of the three is also fuzzed on its own above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_front_of_a_cluster_with_a_policy_and_a_namespace() {
    let yaml = format!(
        "{}\naccess:\n  identities:\n    - {{tenant: a, cidr: 127.0.0.0/8}}\n  namespaces:\n    a: 'a:'\n",
        common::default_policy_enforced()
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let policy = redis_policy_proxy::setup::from_yaml(&yaml, &path).expect("the policy loads");
    fuzz_in_front_of_a_cluster(
        Some(policy),
        " (cluster, default policy, namespace)",
        secs("STATE_FUZZ_CLUSTER_POLICY_SECS", 0),
    )
    .await;
}

/// The conversations through the proxy in front of a 3-primary cluster, against one Redis;
/// with `policy`'s rules (its upstream made the cluster's) or none.
async fn fuzz_in_front_of_a_cluster(
    policy: Option<redis_policy_proxy::Config>,
    what: &str,
    secs: u64,
) {
    let direct = common::RedisServer::start();
    let cluster = common::cluster::RedisCluster::start(3, 0);
    let mut config =
        common::cluster::proxy_config(&cluster.live_addrs()[0], &["refresh_interval_ms: 600000"]);
    if let Some(mut policy) = policy {
        policy.upstream = config.upstream;
        config = policy;
    }
    let proxy = common::Proxy::start(config).await;
    let mut servers = cluster.primaries();
    servers.push(direct.addr());
    let sides = Sides {
        direct: direct.addr(),
        proxy: proxy.addr.to_string(),
        servers,
        keys: CLUSTER_KEYS,
        cluster: true,
    };
    fuzz(&sides, REGRESSIONS, what, secs).await;
}

/// Seconds of random conversations from `var`, else `default`.
fn secs(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs the regressions, then random conversations for `STATE_FUZZ_SECS`, and fails with
/// every difference found (`what` names the setup in the message).
async fn fuzz(sides: &Sides, regressions: &[(&str, &str)], what: &str, secs: u64) {
    let mut failures = Vec::new();
    for (name, case) in regressions {
        if let Some((i, want, got)) = first_difference(sides, &parse_case(case)).await {
            failures.push(format!("{name}: step {i}\n redis: {want}\n proxy: {got}"));
        }
    }

    let seed = common::env_or_clock_seed("STATE_FUZZ_SEED", 100_000_000);
    eprintln!("state fuzzer{what}: seed {seed} (STATE_FUZZ_SEED), {secs} s");
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let start = Instant::now();
    let mut conversations = 0;
    while start.elapsed() < Duration::from_secs(secs) && failures.len() < 3 {
        conversations += 1;
        // Half the conversations are two clients': what one does to the other (a message,
        // a spoiled WATCH, an invalidation) must reach it as from Redis.
        let clients = 1 + rng.below(2);
        let steps: Vec<Step> = (0..4 + rng.below(12))
            .map(|_| draw_step(&mut rng, sides.keys, clients))
            .collect();
        if first_difference(sides, &steps).await.is_none() {
            continue;
        }
        let steps = shorten(sides, steps).await;
        let Some((i, want, got)) = first_difference(sides, &steps).await else {
            continue;
        };
        let case: Vec<String> = steps.iter().map(Step::show).collect();
        failures.push(format!(
            "seed {seed}, conversation {conversations}, step {i}\n redis: {want}\n proxy: {got}\n case:\n{}",
            case.join("\n")
        ));
    }
    eprintln!("state fuzzer{what}: {conversations} conversations");
    assert!(
        failures.is_empty(),
        "the proxy's replies{what} differ from Redis's:\n{}",
        failures.join("\n\n")
    );
}

/// The same conversations (keys in one hash slot) through the proxy in front of a 3-primary
/// cluster, against one Redis: the proxy presents a cluster as one server. Differences the
/// proxy makes on purpose there (SELECT, CROSSSLOT for a pinned session's other nodes, a
/// sharded subscription across slots: docs/cluster.md) end the comparison. The regressions
/// always; random conversations for `STATE_FUZZ_CLUSTER_SECS` (default 30, as the
/// standalone run's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_front_of_a_cluster_the_proxy_follows_state_changes_as_one_redis() {
    fuzz_in_front_of_a_cluster(None, " (cluster)", secs("STATE_FUZZ_CLUSTER_SECS", 30)).await;
}
