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
//! listed in `common::docs_grammar::LEFT_OUT`.
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

use common::cluster::RedisCluster;
use common::docs_grammar::{Doc, STEP, Upstream, forms, items, sentinel_for, text, until_sentinel};
use common::{Proxy, Raw, RedisServer, resp, show};

/// What the reply sweep leaves out besides `docs_grammar::LEFT_OUT`: tracking's
/// invalidations arrive as pushes whenever another command touches a key, so their count
/// depends on timing (the state fuzzer compares them per client over a conversation).
const ALSO_LEFT_OUT: &[&str] = &["client|tracking", "client|caching"];

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
    let label = &upstream.name(label);

    let url = direct.url();
    let mut con = common::connect(&url).await;
    let mut docs = common::docs_grammar::documented(&url).await;
    docs.retain(|d| !ALSO_LEFT_OUT.contains(&d.name.as_str()));
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

    let mut found = Vec::new();
    let mut step = 0u64;
    // The slowest step through the proxy and its command, printed at the end: a step that
    // once took over 5 s in CI (docs/fuzzing.md) is then seen coming before it is a stall.
    let mut slowest = (std::time::Duration::ZERO, String::new());
    // The form sent through the proxy before the current one, and what came back: the
    // cause of a connection the proxy closed before the current form (an error reply).
    let mut previous = String::new();
    for (n, args) in forms(&docs, seed, tries) {
        step = n;
        let (ping, sentinel) = sentinel_for(step);
        let mut input = resp(&args);
        input.extend(&ping);

        d.send(&input).await;
        let want = until_sentinel(&mut d, &sentinel).await;
        // The other client's command comes between this one and its sentinel, on the same
        // shared upstream connection.
        let other = format!("other-{step}");
        let started = std::time::Instant::now();
        // A reset of the client's connection to the proxy is a finding, printed with the
        // form, the step before and the proxy's CLIENT LIST (whether it still had the
        // session). Seen under load until 2026-12-07: a reply that only looked like a
        // subscription confirmation (COMMAND LIST starting with `subscribe`) left the pinned
        // connection's last command looking unanswered until its command timeout ended the
        // session (docs/fuzzing.md).
        let sent = a.try_send(&resp(&args)).await;
        b.send(&resp(&["ECHO", other.as_str()])).await;
        let sent = match sent {
            Ok(()) => a.try_send(&ping).await,
            Err(e) => Err(e),
        };
        let got = match sent {
            Ok(()) => until_sentinel(&mut a, &sentinel).await,
            Err(e) => {
                let _ = b.collect_frames(1, STEP).await;
                let clients = b.call(&["CLIENT", "LIST"]).await;
                found.push(format!(
                    "{label}: {}: the connection to the proxy was reset ({e}); the step \
                     before and its replies through the proxy: {previous}; the proxy's CLIENT \
                     LIST then: {}",
                    show(&resp(&args)),
                    show(&clients)
                ));
                return found;
            }
        };
        previous = format!(
            "{} -> {}",
            show(&resp(&args)),
            match &got {
                Ok(frames) => frames.iter().map(|f| show(f)).collect::<Vec<_>>().join(" "),
                Err(why) => why.clone(),
            }
        );
        let theirs = b.collect_frames(1, STEP).await;
        if started.elapsed() > slowest.0 {
            slowest = (started.elapsed(), show(&resp(&args)));
        }
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
    eprintln!(
        "{label}: {step} forms, the slowest through the proxy {:?}: {}",
        slowest.0, slowest.1
    );
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
                input.extend(sentinel_for(step).0);
                forms.push((step, args));
            }
            d.send(&input).await;
            a.send(&input).await;
            for (n, args) in forms {
                let (_, sentinel) = sentinel_for(n);
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
    common::docs_grammar::seed("REPLY_SWEEP_SEED")
}

fn tries() -> usize {
    std::env::var("REPLY_SWEEP_TRIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
}

/// The sweep in front of 7.0 and each matrix server, both protocols; panics with every
/// difference.
async fn sweep_every_server(upstream: Upstream) {
    let seed = seed();
    let mut servers = vec![("redis-7.0", common::server_binary())];
    servers.extend(common::matrix_servers());
    let mut found = Vec::new();
    for (label, bin) in &servers {
        for resp3 in [false, true] {
            found.extend(sweep(label, bin, upstream, resp3, seed, tries()).await);
        }
    }
    assert!(
        found.is_empty(),
        "seed {seed}: replies differ:\n  {}",
        found.join("\n  ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_gets_its_own_replies_through_a_shared_connection() {
    sweep_every_server(Upstream::Server).await;
}

/// The same in front of a cluster of three primaries: commands the proxy fans out to every
/// primary (KEYS, DBSIZE, FLUSHALL, SCRIPT…), splits by slot (MGET, DEL…) or answers itself
/// (CLUSTER, READONLY) must still come back as one reply each, and on the client that sent
/// them. Against one standalone server directly, so a count may differ only where the
/// cluster answers differently in kind, which none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_gets_its_own_replies_in_front_of_a_cluster() {
    sweep_every_server(Upstream::Cluster).await;
}
