//! `redis-policy-proxy`: command line, logging, signals.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use redis_policy_proxy::Config;

/// Exit status for a configuration that cannot be used (sysexits' EX_USAGE... EX_DATAERR is
/// 65; 64 is what operators' tooling expects from `--check`).
const EXIT_CONFIG: u8 = 64;

/// A Redis-protocol proxy that enforces Redis best practices in-line.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Policy/config file (YAML).
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Address to listen on, overriding the file (e.g. 127.0.0.1:6380).
    #[arg(long)]
    listen: Option<String>,
    /// Upstream Redis host:port, overriding the file.
    #[arg(long)]
    upstream: Option<String>,
    /// Validate FILE, print every problem, and exit (0 valid, 64 invalid).
    #[arg(long, value_name = "FILE")]
    check: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal, not in files, journald or container logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    if let Some(path) = &cli.check {
        return match Config::load(path) {
            Ok(_) => {
                println!("{}: OK", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_CONFIG)
            }
        };
    }

    let mut config = match &cli.config {
        Some(path) => match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(EXIT_CONFIG);
            }
        },
        None => Config::default(),
    };
    if let Some(l) = cli.listen {
        config.set_listen(l);
    }
    if let Some(u) = cli.upstream {
        config.set_upstream(u);
    }
    let source = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from("<command line>"));
    if let Err(e) = config.validate(&source) {
        eprintln!("{e}");
        return ExitCode::from(EXIT_CONFIG);
    }

    // One worker runs on tokio's current-thread scheduler: no work stealing and no cross-thread
    // wake-ups, which is what a proxy sharing a small host with Redis wants (docs/performance.md).
    let mut runtime = if config.workers.value == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if config.workers.value > 1 {
            b.worker_threads(config.workers.value);
        }
        b
    };
    let runtime = match runtime.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&config.listen.value).await?;
        redis_policy_proxy::run(listener, config, shutdown_signal()).await
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
