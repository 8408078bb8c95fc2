//! What `--check` says about the mistakes a newcomer makes in a policy file (issue 28): the
//! real binary run on a corpus of realistic typos, one mistake per file, each expected to get
//! exactly one message (no follow-on errors caused by the first), at the line of the offending
//! field, naming its path, in plain words (no parser jargon), with a "did you mean" for a
//! misspelt name. A bad flag or `RPP_*` environment value must be blamed on the flag or the
//! variable, never on the file.
//!
//! Every case is run and judged before the test fails, so a failure lists every bad message
//! with what is wrong with it (cascade, wrong line, wrong field, jargon, misblamed, unclear).

#![allow(
    clippy::disallowed_methods,
    reason = "runs the real binary as a subprocess, bounded in wall-clock time"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_redis-policy-proxy");

/// Exit status for an unusable configuration.
const EX_USAGE: i32 = 64;

/// Words of the YAML parser or of serde that an operator should never have to read.
const JARGON: &[&str] = &[
    "sequence",
    "mapping",
    "scalar",
    "invalid type",
    "invalid value",
    "invalid length",
    "did not find expected",
    "could not find expected",
    "found unexpected",
    "while parsing",
    "while scanning",
    "unknown variant",
    "unknown field",
    "missing field",
    "struct ",
    "unit value",
    "block end",
    "u64",
    "u32",
    "u16",
    "usize",
    "i64",
    "f64",
    "column",
    "Error",
    "error:",
];

/// Where a case's mistake is.
enum Blame {
    /// In the file: this line, this field path.
    File { line: u32, field: &'static str },
    /// In a flag or environment variable of this name (the file must not be named).
    Setting(&'static str),
}

/// One mistake: a policy file, extra arguments and environment, and what `--check` (or the
/// start) must say about it.
struct Case {
    name: &'static str,
    yaml: &'static str,
    /// Arguments; `FILE` is replaced by the file's path. Empty: `--check FILE`.
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    blame: Blame,
    /// Each must appear in the message.
    says: &'static [&'static str],
}

const fn file(
    name: &'static str,
    yaml: &'static str,
    line: u32,
    field: &'static str,
    says: &'static [&'static str],
) -> Case {
    Case {
        name,
        yaml,
        args: &[],
        env: &[],
        blame: Blame::File { line, field },
        says,
    }
}

/// A valid standalone file, for the flag and environment cases.
const GOOD: &str = "\
listen: 127.0.0.1:6380
upstream:
  address: 127.0.0.1:6379
rules:
  - id: deny-keys
    deny: [KEYS]
    message: use SCAN
";

const CLUSTER: &str = "\
upstream:
  mode: cluster
  cluster:
    seeds: [127.0.0.1:7000]
";

fn corpus() -> Vec<Case> {
    vec![
        file(
            "misspelt setting",
            "listen: 127.0.0.1:6380\nupstream:\n  adress: 127.0.0.1:6379\n  connections: 1\n",
            3,
            "upstream.adress",
            &["unknown setting `adress`", "did you mean `address`?"],
        ),
        file(
            "misspelt section",
            "listen: 127.0.0.1:6380\nlimts:\n  max_clients: 100\n  max_inflight: 64\n",
            2,
            "limts",
            &["did you mean `limits`?"],
        ),
        file(
            "misspelt rate-limit field",
            "rules:\n  - id: per-client\n    rate_limit:\n      reqests: 100\n      window_ms: 60000\n",
            4,
            "rules[0].rate_limit.reqests",
            &["did you mean `requests`?"],
        ),
        file(
            "rate-limit window without its unit",
            "rules:\n  - id: per-client\n    rate_limit:\n      requests: 100\n      window: 60s\n",
            5,
            "rules[0].rate_limit.window",
            &["did you mean `window_ms`?"],
        ),
        file(
            "rate-limit window misspelt",
            "rules:\n  - id: per-client\n    rate_limit:\n      requests: 100\n      windw_ms: 60000\n",
            5,
            "rules[0].rate_limit.windw_ms",
            &["did you mean `window_ms`?"],
        ),
        file(
            "rate-limit rule missing window",
            "rules:\n  - id: per-client\n    rate_limit:\n      requests: 100\n    message: slow down\n",
            3,
            "rules[0].rate_limit.window_ms",
            &["required"],
        ),
        file(
            "rule missing id",
            "rules:\n  - id: deny-keys\n    deny: [KEYS]\n  - deny: [FLUSHALL]\n    message: no\n",
            4,
            "rules[1].id",
            &["required"],
        ),
        file(
            "size with a unit",
            "rules:\n  - id: max-value-size\n    max_value_bytes: 100KB\n",
            3,
            "rules[0].max_value_bytes",
            &["bytes", "`100KB`"],
        ),
        file(
            "limit with a unit",
            "limits:\n  max_clients: 100\n  max_bulk_len: 512MB\n",
            3,
            "limits.max_bulk_len",
            &["bytes", "`512MB`"],
        ),
        file(
            "word where a number goes",
            "upstream:\n  address: 127.0.0.1:6379\n  connections: two\n",
            3,
            "upstream.connections",
            &["number", "`two`"],
        ),
        file(
            "milliseconds with a unit",
            "upstream:\n  address: 127.0.0.1:6379\n  connect_timeout_ms: 2s\n",
            3,
            "upstream.connect_timeout_ms",
            &["milliseconds", "`2s`"],
        ),
        file(
            "negative count",
            "workers: -1\n",
            1,
            "workers",
            &["number", "`-1`"],
        ),
        file(
            "TTL maximum with a word unit",
            "rules:\n  - id: ttl-default\n    ttl:\n      default: 1h\n      max: 7days\n      keys: created\n",
            5,
            "rules[0].ttl.max",
            &["duration", "`7days`"],
        ),
        file(
            "TTL default with a bad unit",
            "rules:\n  - id: ttl-default\n    ttl:\n      keys: created\n      default: 1hr\n",
            5,
            "rules[0].ttl.default",
            &["duration", "`1hr`"],
        ),
        file(
            "prefix TTL with a bad unit",
            "rules:\n  - id: ttl-default\n    ttl:\n      default: 1h\n      keys: created\n      prefixes:\n        - {prefix: \"cache:\", ttl: 15m}\n        - {prefix: \"session:\", ttl: 24hours}\n",
            8,
            "rules[0].ttl.prefixes[1].ttl",
            &["duration", "`24hours`"],
        ),
        file(
            "jitter as a percentage",
            "rules:\n  - id: ttl-default\n    ttl:\n      default: 1h\n      keys: created\n      jitter: 10%\n",
            6,
            "rules[0].ttl.jitter",
            &["0.1", "`10%`"],
        ),
        file(
            "unknown mode",
            "rules:\n  - id: deny-keys\n    deny: [KEYS]\n    mode: enforcing\n",
            4,
            "rules[0].mode",
            &["`enforcing`", "did you mean `enforce`?"],
        ),
        file(
            "unknown upstream mode",
            "upstream:\n  mode: clustered\n  cluster:\n    seeds: [127.0.0.1:7000]\n",
            2,
            "upstream.mode",
            &["`clustered`", "did you mean `cluster`?"],
        ),
        file(
            "misspelt TTL keys value",
            "rules:\n  - id: ttl-default\n    ttl:\n      default: 1h\n      keys: create\n",
            5,
            "rules[0].ttl.keys",
            &["did you mean `created`?"],
        ),
        file(
            "misspelt true",
            "rules:\n  - id: ttl-default\n    ttl:\n      default: 1h\n      keys: created\n      deny_persist: ture\n",
            6,
            "rules[0].ttl.deny_persist",
            &["true or false", "`ture`"],
        ),
        file(
            "one command where a list goes",
            "rules:\n  - id: deny-keys\n    deny: KEYS\n    message: use SCAN\n",
            3,
            "rules[0].deny",
            &["list", "`KEYS`"],
        ),
        file(
            "one tenant where a list goes",
            "access:\n  identities:\n    - tenant: admin\n      cidr: 10.0.0.0/8\nrules:\n  - id: deny-keys\n    deny: [KEYS]\n    except_tenants: admin\n",
            8,
            "rules[0].except_tenants",
            &["list", "`admin`"],
        ),
        file(
            "a list where one address goes",
            "upstream:\n  address:\n    - 127.0.0.1:6379\n  connections: 1\n",
            2,
            "upstream.address",
            &["list"],
        ),
        file(
            "an address where the section goes",
            "listen: 127.0.0.1:6380\nupstream: 127.0.0.1:6379\n",
            2,
            "upstream",
            &["`127.0.0.1:6379`", "address"],
        ),
        file(
            "rules without dashes",
            "rules:\n  id: deny-keys\n  deny: [KEYS]\n",
            1,
            "rules",
            &["list", "- "],
        ),
        file(
            "a rule written as one word",
            "rules:\n  - deny-keys\n",
            2,
            "rules[0]",
            &["`deny-keys`", "id"],
        ),
        file(
            "setting dedented out of its section",
            "upstream:\n  address: 127.0.0.1:6379\nconnections: 2\n",
            3,
            "connections",
            &["upstream"],
        ),
        file(
            "setting indented too far",
            "upstream:\n  address: 127.0.0.1:6379\n    connections: 2\n",
            3,
            "upstream.connections",
            &["indent", "`address`"],
        ),
        file(
            "rule setting one space short",
            "rules:\n  - id: deny-keys\n    deny: [KEYS]\n   message: use SCAN\n",
            4,
            "rules[0].message",
            &["indent"],
        ),
        file(
            "a tab for indentation",
            "upstream:\n\taddress: 127.0.0.1:6379\n",
            2,
            "upstream.address",
            &["tab", "spaces"],
        ),
        file(
            "a setting given twice",
            "upstream:\n  address: 127.0.0.1:6379\n  connections: 1\n  address: 10.0.0.5:6379\n",
            4,
            "upstream.address",
            &["twice", "line 2"],
        ),
        file(
            "a rule kind misspelt",
            "rules:\n  - id: per-client\n    ratelimit:\n      requests: 100\n      window_ms: 1000\n",
            3,
            "rules[0].ratelimit",
            &["did you mean `rate_limit`?"],
        ),
        file(
            "a rule kind invented",
            "rules:\n  - id: deny-keys\n    deny_commands: [KEYS]\n",
            3,
            "rules[0].deny_commands",
            &["did you mean `deny`?"],
        ),
        file(
            "password instead of its digest",
            "access:\n  users:\n    - name: app\n      password: secret\n",
            4,
            "access.users[0].password",
            &["did you mean `password_sha256`?"],
        ),
        file(
            "an unclosed quote",
            "rules:\n  - id: deny-keys\n    deny: [KEYS]\n    message: \"KEYS blocks the server; use SCAN\n  - id: deny-flush\n    deny: [FLUSHALL]\n",
            4,
            "rules[0].message",
            &["quote", "never closed"],
        ),
        file(
            "an unclosed bracket",
            "rules:\n  - id: deny-flush\n    deny: [FLUSHALL, FLUSHDB\n    message: scope deletes\n  - id: deny-keys\n    deny: [KEYS]\n",
            3,
            "rules[0].deny",
            &["`[`", "`]`"],
        ),
        file(
            "no space after the colon",
            "listen:127.0.0.1:6380\nupstream:\n  address: 127.0.0.1:6379\n",
            1,
            "listen",
            &["space after"],
        ),
        file(
            "address without a port",
            "upstream:\n  address: redis.internal\n",
            2,
            "upstream.address",
            &["host:port", "`redis.internal`"],
        ),
        file(
            "listen on a host name",
            "listen: localhost:6380\n",
            1,
            "listen",
            &["IP:port", "`localhost:6380`"],
        ),
        file(
            "misspelt command in a block list",
            "rules:\n  - id: deny-admin\n    deny:\n      - DEBUG\n      - SHUTDWN\n      - MONITOR\n",
            5,
            "rules[0].deny",
            &["unknown command `SHUTDWN`", "did you mean `SHUTDOWN`?"],
        ),
        file(
            "misspelt setting in a list at column 0",
            "rules:\n- id: deny-keys\n  denny: [KEYS]\n",
            3,
            "rules[0].denny",
            &["did you mean `deny`?"],
        ),
        file(
            "misspelt setting in the second rule",
            "rules:\n  - id: deny-keys\n    deny: [KEYS]\n  - id: scan-count\n    max_scan_cont: 1000\n  - id: max-keys\n    max_keys: 1000\n",
            5,
            "rules[1].max_scan_cont",
            &["did you mean `max_scan_count`?"],
        ),
        file(
            "misspelt setting inside a flow mapping",
            "rules:\n  - id: ttl-default\n    ttl: {default: 1h, keys: created, prefixes: [{prefix: \"a:\", tll: 1m}]}\n",
            3,
            "rules[0].ttl.prefixes[0].tll",
            &["did you mean `ttl`?"],
        ),
        file(
            "an empty section",
            "limits:\nupstream:\n  address: 127.0.0.1:6379\n",
            1,
            "limits",
            &["no value", "max_clients"],
        ),
        file(
            "a rule id used twice",
            "rules:\n  - id: deny-keys\n    deny: [KEYS]\n  - id: deny-keys\n    deny: [FLUSHALL]\n",
            4,
            "rules[1].id",
            &["already used on line 2"],
        ),
        file(
            "a required setting given empty",
            "upstream:\n  address:\n  connections: 2\n",
            2,
            "upstream.address",
            &["no value"],
        ),
        Case {
            name: "bad --listen at start",
            yaml: GOOD,
            args: &["--config", "FILE", "--listen", "nowhere"],
            env: &[],
            blame: Blame::Setting("--listen"),
            says: &["`nowhere`", "IP:port"],
        },
        Case {
            name: "bad --listen with --check",
            yaml: GOOD,
            args: &["--check", "FILE", "--listen", "6380"],
            env: &[],
            blame: Blame::Setting("--listen"),
            says: &["`6380`", "IP:port"],
        },
        Case {
            name: "bad --admin",
            yaml: GOOD,
            args: &["--check", "FILE", "--admin", "of"],
            env: &[],
            blame: Blame::Setting("--admin"),
            says: &["`of`", "off"],
        },
        Case {
            name: "--upstream with a cluster file",
            yaml: CLUSTER,
            args: &["--check", "FILE", "--upstream", "10.0.0.1:6379"],
            env: &[],
            blame: Blame::Setting("--upstream"),
            says: &["cluster"],
        },
        Case {
            name: "bad RPP_LISTEN",
            yaml: GOOD,
            args: &[],
            env: &[("RPP_LISTEN", "localhost:6380")],
            blame: Blame::Setting("RPP_LISTEN"),
            says: &["`localhost:6380`", "IP:port"],
        },
        Case {
            name: "bad RPP_ADMIN at start",
            yaml: GOOD,
            args: &["--config", "FILE"],
            env: &[("RPP_ADMIN", "8379")],
            blame: Blame::Setting("RPP_ADMIN"),
            says: &["`8379`", "IP:port"],
        },
        Case {
            name: "bad RPP_UPSTREAM",
            yaml: GOOD,
            args: &[],
            env: &[("RPP_UPSTREAM", "redis.internal")],
            blame: Blame::Setting("RPP_UPSTREAM"),
            says: &["`redis.internal`", "host:port"],
        },
        Case {
            name: "bad RPP_LOG_FORMAT",
            yaml: GOOD,
            args: &[],
            env: &[("RPP_LOG_FORMAT", "yaml")],
            blame: Blame::Setting("RPP_LOG_FORMAT"),
            says: &["`yaml`", "text", "json"],
        },
    ]
}

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the binary; one that does not exit in time (it started serving) is killed.
fn run(args: &[String], env: &[(&str, &str)]) -> Outcome {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in [
        "RPP_CONFIG",
        "RPP_LISTEN",
        "RPP_UPSTREAM",
        "RPP_ADMIN",
        "RPP_LOG_FORMAT",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn redis-policy-proxy");
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    Outcome {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// What is wrong with the message for `case` (empty: nothing).
fn judge(case: &Case, path: &Path, out: &Outcome) -> Vec<String> {
    let file = path.to_str().expect("utf-8 path");
    let mut bad = Vec::new();
    if out.code != Some(EX_USAGE) {
        bad.push(format!("exit {:?}, not {EX_USAGE}", out.code));
    }
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    match lines.len() {
        0 => {
            bad.push("no message".into());
            return bad;
        }
        1 => {}
        n => bad.push(format!("cascade: {n} messages")),
    }
    let message = lines[0];
    match &case.blame {
        Blame::File { line, field } => {
            let at = format!("{file}:{line}: ");
            if !message.starts_with(&at) {
                bad.push(format!("wrong line (want {line})"));
            }
            if !message.contains(&format!("field `{field}`: ")) {
                bad.push(format!("wrong field (want `{field}`)"));
            }
        }
        Blame::Setting(name) => {
            if out.stderr.contains(file) || !message.contains(name) {
                bad.push(format!("misblamed (want {name}, not the file)"));
            }
        }
    }
    // The part after the file, line and field: the words the operator reads.
    let words = message.rsplit_once("`: ").map_or(message, |(_, m)| m);
    let words = if matches!(case.blame, Blame::File { .. }) {
        words
    } else {
        message
    };
    for j in JARGON {
        if words.contains(j) {
            bad.push(format!("jargon ({j:?})"));
        }
    }
    for s in case.says {
        if !message.contains(s) {
            bad.push(format!("unclear (does not say {s:?})"));
        }
    }
    bad
}

#[test]
fn every_mistake_gets_one_plain_message_at_its_line() {
    let dir = std::env::temp_dir().join(format!("rpp-check-messages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let corpus = corpus();
    let mut report = Vec::new();
    let mut bad_cases = 0;
    let mut by_kind = std::collections::BTreeMap::<String, usize>::new();
    for (i, case) in corpus.iter().enumerate() {
        let path: PathBuf = dir.join(format!("case{i}.yaml"));
        std::fs::write(&path, case.yaml).expect("write case");
        let file = path.to_str().expect("utf-8 path").to_string();
        let args: Vec<String> = if case.args.is_empty() {
            vec!["--check".into(), file.clone()]
        } else {
            case.args
                .iter()
                .map(|a| {
                    if *a == "FILE" {
                        file.clone()
                    } else {
                        a.to_string()
                    }
                })
                .collect()
        };
        let out = run(&args, case.env);
        let bad = judge(case, &path, &out);
        if !bad.is_empty() {
            bad_cases += 1;
            // Each case counted once per kind of fault.
            let kinds: std::collections::BTreeSet<&str> = bad
                .iter()
                .map(|b| b.split([' ', ':']).next().unwrap_or(""))
                .collect();
            for kind in kinds {
                *by_kind.entry(kind.to_string()).or_default() += 1;
            }
            report.push(format!(
                "{}: {}\n    stderr: {}\n    stdout: {}",
                case.name,
                bad.join("; "),
                out.stderr.trim_end().replace('\n', "\n            "),
                out.stdout.trim_end(),
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        report.is_empty(),
        "{bad_cases} of {} messages are bad ({by_kind:?}):\n{}",
        corpus.len(),
        report.join("\n")
    );
}
