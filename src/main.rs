//! `redis-policy-proxy`: command line, logging, signals.

#![forbid(
    unsafe_code,
    reason = "the proxy parses hostile input; safe Rust is its first line of defence"
)]

use std::path::PathBuf;
use std::process::ExitCode;

use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;
use clap::{CommandFactory, FromArgMatches, Parser};
use redis_policy_proxy::metrics::Metrics;
use redis_policy_proxy::mirror::MirrorSlot;
use redis_policy_proxy::mirror::cutover::Cutover;
use redis_policy_proxy::ops::{Ops, Reload};
use redis_policy_proxy::policy::Policy;
use redis_policy_proxy::{Config, setup};

/// Exit status for a configuration that cannot be used (sysexits' EX_USAGE... EX_DATAERR is
/// 65; 64 is what operators' tooling expects from `--check`).
const EXIT_CONFIG: u8 = 64;

/// What `--help` says before the flags.
const LONG_ABOUT: &str = "\
A Redis-protocol proxy that enforces Redis best practices in-line. Point any Redis client at it
instead of Redis: a YAML policy says what it refuses (with a message naming the better pattern),
rewrites (a TTL on every key, capped streams), rate-limits or confines to a tenant's namespace.";

/// What `--help` says after the flags: examples, precedence, signals and exit codes.
const AFTER_LONG_HELP: &str = "\
Examples:
  redis-policy-proxy --config policy/default.yaml
      clients on 127.0.0.1:6380, Redis on 127.0.0.1:6379, the best-practice rules,
      metrics on http://127.0.0.1:8379/metrics
  redis-policy-proxy -c policy/default.yaml --listen 0.0.0.0:6380 --upstream redis.internal:6379
  RPP_CONFIG=policy/default.yaml RPP_LISTEN=0.0.0.0:6380 redis-policy-proxy --log-format json
  redis-policy-proxy --check policy/default.yaml          validate only: exit 0, or 64
  redis-policy-proxy --explain policy/default.yaml 'KEYS *'
  redis-policy-proxy replay --policy new.yaml audit.jsonl   what new.yaml would do to that traffic
  redis-policy-proxy -c policy.yaml backfill --to new:6379 --state b.json
                                                          copy the upstream's keys to another server
  kill -HUP <pid>                                         reload the --config file (without
                                                          one: logged, nothing else)

Each value comes from its flag, else its RPP_* environment variable, else the file, else the
built-in default; an empty RPP_* variable counts as unset.
The container image sets RPP_CONFIG, RPP_LISTEN and RPP_ADMIN, so arguments given to
`docker run IMAGE ...` add to those defaults instead of replacing them.

Signals: SIGHUP reloads the policy (so does any change to the file), SIGTERM stops accepting
and drains for shutdown_grace_ms, SIGINT exits at once.
Exit status: 0 after a drain, 64 for an unusable configuration, 1 when the proxy cannot start
(an address already in use), 130 after SIGINT; --survey and backfill: 69 when a server cannot
be read or written (unreachable, no answer, login refused), with one line saying why.
Docs: README.md, policy/README.md (the file), docs/operations.md (metrics, logs, deploying).";

/// A Redis-protocol proxy that enforces Redis best practices in-line.
#[derive(Parser, Debug)]
#[command(
    version = redis_policy_proxy::LONG_VERSION,
    about,
    long_about = LONG_ABOUT,
    after_help = "Examples and precedence rules: --help",
    after_long_help = AFTER_LONG_HELP
)]
struct Cli {
    /// Policy/config file (YAML): listen, upstream, limits, admin and the rules.
    ///
    /// Without one the proxy runs on built-in defaults with no rules, forwarding every command
    /// unchanged (it warns at start). The rules and access sections are reloaded on SIGHUP and
    /// whenever the file changes. Example: --config policy/default.yaml
    #[arg(long, short = 'c', value_name = "FILE", env = "RPP_CONFIG")]
    config: Option<PathBuf>,
    /// Address clients connect to, overriding `listen` in the file (default 127.0.0.1:6380).
    ///
    /// Example: --listen 0.0.0.0:6380 to accept clients from other hosts or containers.
    #[arg(long, value_name = "IP:PORT", env = "RPP_LISTEN")]
    listen: Option<String>,
    /// Upstream Redis, overriding `upstream.address` (default 127.0.0.1:6379).
    ///
    /// Standalone mode only (cluster and sentinel modes take their nodes from the file).
    /// Example: --upstream redis.internal:6379
    #[arg(long, value_name = "HOST:PORT", env = "RPP_UPSTREAM")]
    upstream: Option<String>,
    /// Admin endpoint (/metrics, /healthz, /readyz), overriding `admin.listen`; `off` disables it.
    ///
    /// Default 127.0.0.1:8379. The proxy does not start if the address cannot be bound.
    /// Example: --admin 0.0.0.0:8379 so that Prometheus and probes reach it from outside.
    #[arg(long, value_name = "IP:PORT|off", env = "RPP_ADMIN")]
    admin: Option<String>,
    /// Log format on stderr: `text` (human-readable) or `json` (one object per line).
    ///
    /// Example: --log-format json for log shippers. The level comes from `log_level` in the
    /// file, or RUST_LOG (e.g. RUST_LOG=info,redis_policy_proxy::upstream=debug).
    #[arg(long, value_enum, default_value = "text", env = "RPP_LOG_FORMAT")]
    log_format: LogFormat,
    /// Validate FILE (or the --config file), print every problem, and exit (0 valid, 64
    /// invalid).
    ///
    /// Problems are printed as FILE:LINE: field `...`: message, parse errors included. The
    /// --listen, --upstream and --admin values given (flags or RPP_* variables) are checked
    /// with it, as the proxy would start; a bad one is named as its flag or variable.
    /// Warnings (FILE:LINE: warning: ...) leave the exit status 0: an audit.output file that
    /// the user running the check cannot create or append to (the proxy refuses to start
    /// with it, exit 64, unless it runs as another user or its directory is made first).
    /// Example: --check policy/default.yaml, or -c policy/default.yaml --check
    #[arg(long, value_name = "FILE", num_args = 0..=1)]
    check: Option<Option<PathBuf>>,
    /// Print what the policy in FILE does to COMMAND, or to each line of standard input
    /// without COMMAND, then exit: 0, or 1 when a command would be refused.
    ///
    /// Each rule's verdict (audited ones too) and what is sent; COMMAND is written as in
    /// redis-cli. Example: --explain policy/default.yaml 'SET user:1 alice'
    #[arg(long, value_names = ["FILE", "COMMAND"], num_args = 1..=2)]
    explain: Option<Vec<String>>,
    /// With --explain: as this proxy user (access.users), as after a successful AUTH.
    ///
    /// Example: --explain policy.yaml 'GET k' --as-user app
    #[arg(long, value_name = "USER", requires = "explain")]
    as_user: Option<String>,
    /// With --explain: from this client address (default 127.0.0.1), which picks the tenant.
    ///
    /// Example: --explain policy.yaml 'GET k' --from 10.1.2.3
    #[arg(long, value_name = "IP", requires = "explain")]
    from: Option<std::net::IpAddr>,
    /// Print the `ACL SETUSER` line that keeps scripts from running what the policy in FILE
    /// denies (for the proxy's upstream user), then exit.
    #[arg(long, value_name = "FILE")]
    print_acl: Option<PathBuf>,
    /// Read the upstream (read-only: SCAN, PTTL, TYPE, STRLEN) and report what the policy in
    /// FILE would change in the data it holds, then exit: 0, 64 when FILE cannot be used, 69
    /// when the upstream cannot be read (one line naming it and why). `--upstream` picks the
    /// node.
    #[arg(long, value_name = "FILE")]
    survey: Option<PathBuf>,
    /// With --survey: read at most N keys.
    #[arg(long, value_name = "N", default_value_t = 100_000, requires = "survey")]
    sample: u64,
    /// With --survey: read at most N keys a second.
    #[arg(long, value_name = "N", default_value_t = 1_000, requires = "survey")]
    rate: u64,
    /// `replay`: what a policy would have done to recorded traffic.
    #[command(subcommand)]
    tool: Option<Tool>,
}

/// Tools run as a subcommand.
#[derive(clap::Subcommand, Debug)]
enum Tool {
    /// Replay an audit log (or a MONITOR capture) against a policy and report what it would
    /// have refused, rewritten or rate-limited, per rule and tenant, with examples; with two
    /// --policy files, the commands the change treats differently. Nothing is sent to Redis.
    ///
    /// Example: replay --policy policy/default.yaml /var/log/redis-policy-proxy/audit.jsonl
    Replay {
        /// The policy file; give it twice (OLD, then NEW) for the difference.
        #[arg(long, value_name = "FILE", required = true, num_args = 1)]
        policy: Vec<PathBuf>,
        /// Examples shown per row.
        #[arg(long, value_name = "N", default_value_t = redis_policy_proxy::tools::replay::EXAMPLES)]
        examples: usize,
        /// The audit log (JSON lines) or MONITOR capture; `-` for standard input.
        log: PathBuf,
    },
    /// Copy the keys the --config file's upstream holds (or --from's) to another server, with
    /// their TTLs (SCAN, DUMP, RESTORE), before a migration. Keys the target already holds are
    /// kept (--replace overwrites them). With --state FILE it resumes where it stopped.
    /// Exit status: 0 done, 64 the file or flags, 69 a server could not be read or written, or
    /// the target refused keys.
    ///
    /// Example: -c policy/default.yaml backfill --to 127.0.0.1:6391 --state backfill.json
    Backfill {
        /// The source node, instead of the file's upstream (in a cluster, each primary).
        #[arg(long, value_name = "HOST:PORT")]
        from: Option<String>,
        /// The target node.
        #[arg(long, value_name = "HOST:PORT")]
        to: String,
        /// ACL user on the target.
        #[arg(long, value_name = "USER")]
        to_user: Option<String>,
        /// Environment variable holding the target's password.
        #[arg(long, value_name = "VAR")]
        to_password_env: Option<String>,
        /// Keys copied per second at most.
        #[arg(long, value_name = "N", default_value_t = 1_000)]
        rate: u64,
        /// Stop after N keys (run again with the same --state to go on).
        #[arg(long, value_name = "N")]
        max_keys: Option<u64>,
        /// Progress file: written after every page of keys, read to resume.
        #[arg(long, value_name = "FILE")]
        state: Option<PathBuf>,
        /// Overwrite keys the target already holds.
        #[arg(long)]
        replace: bool,
        /// Only keys matching this glob pattern (SCAN MATCH).
        #[arg(long = "match", value_name = "PATTERN")]
        pattern: Option<String>,
    },
}

/// The variables behind flags that take a value, by argument id.
const ENV_VARS: [(&str, &str); 5] = [
    ("config", "RPP_CONFIG"),
    ("listen", "RPP_LISTEN"),
    ("upstream", "RPP_UPSTREAM"),
    ("admin", "RPP_ADMIN"),
    ("log_format", "RPP_LOG_FORMAT"),
];

/// The settings a flag or variable can override: argument id, flag, and the field of the
/// file it replaces.
const OVERRIDES: [(&str, &str, &str); 3] = [
    ("listen", "--listen", "listen"),
    ("upstream", "--upstream", "upstream.address"),
    ("admin", "--admin", "admin.listen"),
];

/// A value that replaces the file's, and where it came from (`--listen 0.0.0.0:6380`,
/// `RPP_LISTEN=0.0.0.0:6380`): a problem with it is reported as that flag's or variable's,
/// not the file's.
struct Override {
    /// The field of the file it replaces.
    field: &'static str,
    /// The value.
    value: String,
    /// The flag or variable and the value, as the operator wrote them.
    from: String,
}

/// Parses the command line. An empty variable (`RPP_CONFIG=`) counts as unset, so a
/// deployment can clear an image's default (clap would refuse the empty value). A variable
/// clap refuses (`RPP_LOG_FORMAT=yaml`) is named as the variable, not as the flag it stands
/// for, and exits as a configuration problem.
fn parse_cli() -> (Cli, Vec<Override>) {
    let mut command = Cli::command();
    for (id, var) in ENV_VARS {
        if std::env::var_os(var).is_some_and(|v| v.is_empty()) {
            command = command.mut_arg(id, |a| a.env(None::<&str>));
        }
    }
    let matches = match command.try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            if let Some(message) = bad_variable(&e) {
                eprintln!("{message}");
                std::process::exit(i32::from(EXIT_CONFIG));
            }
            e.exit()
        }
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let values = [&cli.listen, &cli.upstream, &cli.admin];
    let overrides = OVERRIDES
        .iter()
        .zip(values)
        .filter_map(|(&(id, flag, field), value)| {
            let value = given(value.clone())?;
            let from = match matches.value_source(id) {
                Some(clap::parser::ValueSource::EnvVariable) => {
                    let var = ENV_VARS.iter().find(|(i, _)| *i == id).map_or("", |v| v.1);
                    format!("{var}={value} (environment variable)")
                }
                _ => format!("{flag} {value}"),
            };
            Some(Override { field, value, from })
        })
        .collect();
    (cli, overrides)
}

/// The message for a value clap refused that came from an `RPP_*` variable rather than the
/// command line; `None` for anything else (clap's own message names the flag).
fn bad_variable(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    if e.kind() != clap::error::ErrorKind::InvalidValue {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let Some(ContextValue::String(value)) = e.get(ContextKind::InvalidValue) else {
        return None;
    };
    let (id, var) = ENV_VARS
        .iter()
        .find(|(id, _)| arg.starts_with(&format!("--{} ", id.replace('_', "-"))))?;
    let flag = format!("--{}", id.replace('_', "-"));
    let on_command_line = std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    if on_command_line || std::env::var(var).ok().as_deref() != Some(value.as_str()) {
        return None;
    }
    let valid = match e.get(ContextKind::ValidValue) {
        Some(ContextValue::Strings(v)) => format!(": must be one of {}", v.join(", ")),
        _ => String::new(),
    };
    Some(format!(
        "{var}={value} (environment variable, for {flag}){valid}, not `{value}`"
    ))
}

/// Applies the flags' and variables' values to `config`.
fn apply(config: &mut Config, overrides: &[Override]) {
    for o in overrides {
        match o.field {
            "listen" => config.set_listen(o.value.clone()),
            "upstream.address" => config.set_upstream(o.value.clone()),
            _ => config.set_admin(o.value.clone()),
        }
    }
}

/// `config` with the overrides, validated; an error names the flag or variable of a value
/// that came from one, and the file for the rest.
fn validated(mut config: Config, overrides: &[Override], source: &Path) -> Result<Config, String> {
    apply(&mut config, overrides);
    match setup::validate(&config, source) {
        Ok(()) => Ok(config),
        Err(e) => Err(blamed(&e, overrides)),
    }
}

/// The problems of `e`, each on its line: one of a value from a flag or variable as
/// `--listen nowhere: sets `listen`, which …`, without the file.
fn blamed(e: &redis_policy_proxy::config::ConfigError, overrides: &[Override]) -> String {
    let redis_policy_proxy::config::ConfigError::Invalid { path, problems } = e else {
        return e.to_string();
    };
    problems
        .iter()
        .map(|p| match overrides.iter().find(|o| o.field == p.field) {
            Some(o) if p.line == 0 => {
                format!("{}: sets `{}`, which {}", o.from, o.field, p.message)
            }
            _ => p.render(path),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// An empty value given on the command line (`--listen ''`) counts as unset too.
fn given<T: AsRef<std::ffi::OsStr>>(value: Option<T>) -> Option<T> {
    value.filter(|v| !v.as_ref().is_empty())
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs to stderr in `format`; `RUST_LOG` wins over `level` (the file's `log_level`).
fn init_logging(format: LogFormat, level: &str) {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr);
    match format {
        // One JSON object per line, fields flattened, for log shippers.
        LogFormat::Json => logs.json().flatten_event(true).init(),
        // Colour codes only on a terminal, not in files, journald or container logs.
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

/// An operator tool's outcome: its report on stdout (success), or its error on stderr with
/// the configuration exit code.
fn printed<E: std::fmt::Display>(result: Result<String, E>) -> ExitCode {
    match result {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// A tool that reads a server (`--survey`, `backfill`) stopped: the file or the flags (64,
/// its problems as they are), or a server (69, one line naming the tool).
fn tool_failed(tool: &str, failure: redis_policy_proxy::tools::survey::Failure) -> ExitCode {
    use redis_policy_proxy::tools::survey::{EXIT_UPSTREAM, Failure};
    match failure {
        Failure::Config(e) => {
            eprintln!("{e}");
            ExitCode::from(EXIT_CONFIG)
        }
        Failure::Upstream(e) => {
            eprintln!("redis-policy-proxy {tool}: {e}");
            ExitCode::from(EXIT_UPSTREAM)
        }
    }
}

/// A `--check` warning, in the form of its problems: `FILE:LINE: warning: field `…`: …`.
fn warning(path: &Path, w: &redis_policy_proxy::config::Problem) -> String {
    let at = match w.line {
        0 => path.display().to_string(),
        line => format!("{}:{line}", path.display()),
    };
    format!("{at}: warning: field `{}`: {}", w.field, w.message)
}

fn main() -> ExitCode {
    let (cli, overrides) = parse_cli();
    if cli.check.is_some() || cli.explain.is_some() {
        init_logging(cli.log_format, "warn");
    }

    if let Some(Tool::Replay {
        policy,
        examples,
        log,
    }) = &cli.tool
    {
        init_logging(cli.log_format, "error");
        if policy.len() > 2 {
            eprintln!("replay takes one --policy, or two (OLD then NEW)");
            return ExitCode::from(EXIT_CONFIG);
        }
        let policies: Vec<&Path> = policy.iter().map(PathBuf::as_path).collect();
        return printed(redis_policy_proxy::tools::replay::replay(
            &policies, log, *examples,
        ));
    }

    if let Some(Tool::Backfill {
        from,
        to,
        to_user,
        to_password_env,
        rate,
        max_keys,
        state,
        replace,
        pattern,
    }) = &cli.tool
    {
        init_logging(cli.log_format, "error");
        let Some(path) = &cli.config else {
            eprintln!(
                "backfill needs the policy file for the source's login: -c FILE backfill --to HOST:PORT"
            );
            return ExitCode::from(EXIT_CONFIG);
        };
        let to_password = match to_password_env {
            Some(var) => match std::env::var(var) {
                Ok(p) if !p.is_empty() => Some(p),
                _ => {
                    eprintln!("--to-password-env {var}: the variable is not set");
                    return ExitCode::from(EXIT_CONFIG);
                }
            },
            None => None,
        };
        let options = redis_policy_proxy::tools::backfill::Options {
            from: from.clone(),
            to: to.clone(),
            to_user: to_user.clone(),
            to_password,
            rate: *rate,
            max_keys: *max_keys,
            state: state.clone(),
            replace: *replace,
            pattern: pattern.clone(),
        };
        use redis_policy_proxy::tools::survey::EXIT_UPSTREAM;
        let done = redis_policy_proxy::tools::backfill::backfill(path, &options, |p| {
            eprintln!("backfill: {}", p.summary());
        });
        return match done {
            Ok(p) => {
                println!("{}", p.summary());
                for f in &p.failures {
                    println!("  refused: {f}");
                }
                if !p.complete {
                    println!("stopped before the end: run again with the same --state to go on");
                }
                if p.failed > 0 {
                    eprintln!(
                        "redis-policy-proxy backfill: the target refused {} keys (listed above: up to five)",
                        p.failed
                    );
                    return ExitCode::from(EXIT_UPSTREAM);
                }
                ExitCode::SUCCESS
            }
            Err(e) => tool_failed("backfill", e),
        };
    }

    if let Some(check) = &cli.check {
        let Some(path) = check.as_ref().or(cli.config.as_ref()) else {
            eprintln!("--check needs a file: --check FILE, or -c FILE --check");
            return ExitCode::from(EXIT_CONFIG);
        };
        // The flags and variables given with it are checked too: they are what the proxy
        // would start with.
        let checked = setup::load(path)
            .map_err(|e| e.to_string())
            .and_then(|c| validated(c, &overrides, path));
        return match checked {
            Ok(config) => {
                for w in setup::warnings(&config) {
                    eprintln!("{}", warning(path, &w));
                }
                println!("{}: OK", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_CONFIG)
            }
        };
    }

    if let Some(path) = &cli.print_acl {
        return match redis_policy_proxy::tools::print_acl::print_acl(path) {
            Ok((line, notes)) => {
                println!("{line}");
                notes.iter().for_each(|n| eprintln!("{n}"));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_CONFIG)
            }
        };
    }

    if let Some(path) = &cli.survey {
        init_logging(cli.log_format, "warn");
        let options = redis_policy_proxy::tools::survey::Options {
            sample: cli.sample,
            rate: cli.rate,
        };
        return match redis_policy_proxy::tools::survey::survey(
            path,
            given(cli.upstream.as_deref()),
            options,
        ) {
            Ok(report) => {
                print!("{report}");
                ExitCode::SUCCESS
            }
            Err(e) => tool_failed("--survey", e),
        };
    }

    if let Some(args) = &cli.explain {
        let addr = cli.from.unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
        let mut out = String::new();
        let result = redis_policy_proxy::tools::explain::explain(
            Path::new(&args[0]),
            args.get(1).map(String::as_str),
            addr,
            cli.as_user.as_deref(),
            &mut out,
        );
        print!("{out}");
        return match result {
            Ok(redis_policy_proxy::tools::explain::Outcome::Allowed) => ExitCode::SUCCESS,
            Ok(redis_policy_proxy::tools::explain::Outcome::Refused) => ExitCode::from(1),
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_CONFIG)
            }
        };
    }

    let policy_file = given(cli.config.clone());
    let config = match &policy_file {
        Some(path) => match setup::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        None => Config::default(),
    };
    // The file as the proxy starts with it, before the command line's overrides: a reload
    // compares the file with it to report the settings only a restart applies.
    let started = Arc::new(config.clone());
    let source = policy_file
        .clone()
        .unwrap_or_else(|| PathBuf::from("<command line>"));
    let config = match validated(config, &overrides, &source).and_then(|c| {
        setup::open_files(&c, &source)
            .map(|()| c)
            .map_err(|e| e.to_string())
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    init_logging(cli.log_format, &config.log_level.value);

    // Every runtime is tokio's current-thread scheduler: no work stealing and no cross-thread
    // wake-ups, which is what a proxy sharing a small host with Redis wants. With one worker
    // the main thread runs everything; with more, it accepts and runs the background tasks,
    // and each worker thread its clients and its own upstream connections
    // (`operations::workers`, docs/performance.md "Scaling past one core").
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let worker_count = match config.workers.value {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    // Stopped when dropped, after the runtime below has drained the clients.
    let _workers = if worker_count > 1 {
        match redis_policy_proxy::workers::start(worker_count) {
            Ok(w) => Some(w),
            Err(e) => {
                eprintln!("cannot start {worker_count} workers: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let result = runtime.block_on(async move {
        let (listener, admin) = bind(&config).await?;
        let policy = setup::policy(&config).map_err(|p| {
            std::io::Error::other(
                p.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })?;
        redis_policy_proxy::startup::log(&redis_policy_proxy::startup::Started {
            listen: listener.local_addr()?,
            admin: admin.as_ref().and_then(|a| a.local_addr().ok()),
            config: &config,
            policy_file: policy_file.as_deref(),
            policy: &policy,
        });
        let policy = Arc::new(ArcSwap::from_pointee(policy));
        let mut ops = Ops::new(&config, policy.clone(), None);
        if let Some(path) = policy_file.clone() {
            let on_command: Reload = {
                let (path, policy, metrics) = (path.clone(), policy.clone(), ops.metrics.clone());
                let (started, mirror) = (started.clone(), ops.mirror.clone());
                let cutover = ops.cutover.clone();
                Arc::new(move || {
                    let live = Live {
                        policy: &policy,
                        metrics: &metrics,
                        mirror: &mirror,
                        cutover: &cutover,
                    };
                    reload(&path, &started, &live, "PROXY RELOAD")
                })
            };
            ops.reload = Some(on_command);
            // Registered before serving, so a SIGHUP can never hit the default action (exit).
            let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
            let (policy, metrics, mirror) =
                (policy.clone(), ops.metrics.clone(), ops.mirror.clone());
            let cutover = ops.cutover.clone();
            let watched = path.clone();
            let on_signal = move |trigger| {
                let live = Live {
                    policy: &policy,
                    metrics: &metrics,
                    mirror: &mirror,
                    cutover: &cutover,
                };
                reload(&path, &started, &live, trigger)
            };
            tokio::spawn(reload_on_change(watched, on_signal, hup));
        } else {
            // SIGHUP's default action is to exit: a proxy on built-in defaults has nothing to
            // reload, and an operator's (or a log rotator's) SIGHUP must not stop it.
            let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
            tokio::spawn(nothing_to_reload(hup));
        }
        redis_policy_proxy::serve(listener, admin, config, policy, ops, shutdown_signal()).await
    });
    // Sessions still running after the grace period are dropped with the runtime.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redis-policy-proxy: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Binds the client listener and the admin endpoint (unless it is off). Either failing stops
/// the start with an error naming the address and the setting: a proxy without its admin
/// endpoint would serve with no metrics and no health checks, which is worse than not
/// starting where an orchestrator is watching.
async fn bind(
    config: &Config,
) -> std::io::Result<(tokio::net::TcpListener, Option<tokio::net::TcpListener>)> {
    let at = &config.listen.value;
    let listener = tokio::net::TcpListener::bind(at).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen for clients on {at} (listen, --listen, RPP_LISTEN): {e}"),
        )
    })?;
    let admin = match config.admin.listen_addr() {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot start the admin endpoint on {addr} (admin.listen, --admin, RPP_ADMIN; \
                     `off` disables it): {e}"
                ),
            )
        })?),
        None => None,
    };
    Ok((listener, admin))
}

/// Resolves on SIGTERM (graceful drain). SIGINT exits at once: an operator at a terminal
/// pressing Ctrl-C wants the process gone, not a grace period.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::info!("SIGINT: exiting now");
            std::process::exit(130);
        }
    });
    term.recv().await;
    tracing::info!("SIGTERM: draining clients");
}

/// Reloads the policy on SIGHUP and when the file changes (polled once a second: content
/// length, modification time and inode of the file the path resolves to, so editors that
/// write a new file and rename it, and Kubernetes ConfigMaps that swap a symlink, are seen).
/// Only `rules` and `access` are reloaded; `listen`, `upstream` and `limits` need a restart.
async fn reload_on_change(
    path: PathBuf,
    reload: impl Fn(&'static str) -> Result<String, String>,
    mut hup: tokio::signal::unix::Signal,
) {
    let mut seen = fingerprint(&path);
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            signal = hup.recv() => {
                if signal.is_none() {
                    return;
                }
                seen = fingerprint(&path);
                let _ = reload("SIGHUP");
            }
            _ = tick.tick() => {
                let now = fingerprint(&path);
                if now.is_some() && now != seen {
                    seen = now;
                    let _ = reload("file change");
                }
            }
        }
    }
}

/// Answers each SIGHUP of a proxy started without `--config` with a log line: there is no
/// file to reload, and it keeps serving.
async fn nothing_to_reload(mut hup: tokio::signal::unix::Signal) {
    while hup.recv().await.is_some() {
        tracing::warn!(
            trigger = "SIGHUP",
            "nothing to reload: the proxy was started without --config (built-in defaults); \
             still serving"
        );
    }
}

/// What identifies a version of the file without reading it.
fn fingerprint(path: &Path) -> Option<(u64, std::time::SystemTime, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?, m.ino()))
}

/// What a reload replaces in the running proxy.
struct Live<'a> {
    /// The policy every command is checked against.
    policy: &'a ArcSwap<Policy>,
    /// Where reloads are counted.
    metrics: &'a Arc<Metrics>,
    /// The migration's mirror (`mirror:`), started, replaced or stopped.
    mirror: &'a Arc<MirrorSlot>,
    /// Switches a standalone upstream whose address the file changed.
    cutover: &'a Arc<Cutover>,
}

/// Parses, validates, compiles and swaps in the policy (and the mirror); on any error the
/// running ones stay. Returns the new version, or every problem. `trigger` (SIGHUP, file
/// change, PROXY RELOAD) is logged, so an operator can tell a reload they asked for from one
/// the file watch did.
fn reload(path: &Path, started: &Config, live: &Live<'_>, trigger: &str) -> Result<String, String> {
    let Live {
        policy,
        metrics,
        mirror,
        cutover,
    } = *live;
    // An empty file is valid at start (all defaults), but on reload it is far more likely a
    // file caught mid-rewrite than an operator dropping every rule.
    if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
        metrics.reloads_failed.inc();
        let why = format!(
            "{}: the file is empty; keeping the running policy",
            path.display()
        );
        tracing::error!(file = %path.display(), trigger, "reload failed: the file is empty; keeping the running policy");
        return Err(why);
    }
    match setup::load(path).map(|c| (setup::policy(&c), started.restart_needed(&c), c)) {
        Ok((Ok(new), restart, config)) => {
            // The upstream and the mirror first: a mirror that cannot start (its TLS files)
            // fails the reload whole. A switch of the upstream starts the next mirror itself,
            // once the old server has answered everything.
            let changed = if cutover.busy() {
                Ok(Some(
                    "a switch of the upstream is running: the upstream and mirror settings \
                     wait for the next reload"
                        .to_string(),
                ))
            } else if config.mirror.as_ref().is_some_and(|m| m.route.is_some())
                && restart.iter().any(|s| matches!(*s, "routes" | "upstreams"))
            {
                // The running router still numbers the routes' servers as before: a mirror
                // started from the new file could copy another server's writes.
                Ok(Some(
                    "`routes:` or `upstreams:` changed: the mirror of a route stays as it \
                     runs until the restart"
                        .to_string(),
                ))
            } else if cutover.wanted_by(&config) {
                cutover
                    .start(config.clone(), mirror.clone(), metrics.clone())
                    .map(Some)
            } else {
                mirror.apply(&config, metrics)
            };
            let mirrored = match changed {
                Ok(change) => change,
                Err(e) => {
                    metrics.reloads_failed.inc();
                    tracing::error!(trigger, error = %e, "reload failed: the mirror cannot start; keeping the running policy and mirror");
                    return Err(format!("{}: mirror: {e}", path.display()));
                }
            };
            let version = new.version().to_string();
            tracing::info!(file = %path.display(), trigger, %version, rules = %new.rules_summary(), "policy reloaded");
            policy.store(Arc::new(new));
            metrics.reloads_ok.inc();
            let version = match mirrored {
                Some(change) => format!("{version}; {change}"),
                None => version,
            };
            if restart.is_empty() {
                return Ok(version);
            }
            let settings = restart.join(", ");
            tracing::warn!(file = %path.display(), %settings, "changed settings need a restart; the running ones stay");
            Ok(format!(
                "{version}; rules and access reloaded, but {settings} changed and need a restart (the running ones stay)"
            ))
        }
        Ok((Err(problems), ..)) => {
            metrics.reloads_failed.inc();
            let mut text = Vec::new();
            for p in problems {
                tracing::error!(file = %path.display(), trigger, problem = %p, "reload failed; keeping the running policy");
                text.push(format!("{}: {p}", path.display()));
            }
            Err(text.join("; "))
        }
        Err(e) => {
            metrics.reloads_failed.inc();
            tracing::error!(trigger, error = %e, "reload failed; keeping the running policy");
            Err(e.to_string())
        }
    }
}
