//! The proxy's own commands: `PROXY INFO | POLICY | RELOAD | SLOWLOG | KEYSPACE | HELP`, for
//! admin tenants only (`access.admin_tenants`), and the `# Proxy` section INFO gains.

use super::Session;
use super::client::ClientState;
use super::context::Context;
use super::route::Args;
use crate::policy::Outcome;
use crate::protocol::{answers, codec};
use std::fmt::Write;

use bytes::{BufMut, Bytes, BytesMut};

const HELP: &[&str] = &[
    "PROXY <subcommand> [<arg> ...]. Subcommands are:",
    "INFO",
    "    The proxy's section of INFO: version, uptime, clients, policy version, rule counters.",
    "POLICY",
    "    The running policy: its version and, per rule, its counters by outcome.",
    "RELOAD",
    "    Reload the policy file now (as SIGHUP does); replies with the new version or the problems.",
    "SLOWLOG GET [<count>] | LEN | RESET",
    "    Batches slower than admin.slowlog_threshold_us (command names only, never values).",
    "KEYSPACE",
    "    Per tenant, the top key patterns (commands, bytes, writes without TTL, value sizes) and the hot keys, as JSON.",
    "HELP",
    "    Print this help.",
];

impl Session {
    /// Answers a PROXY command.
    pub(super) fn proxy_command(&self, args: &Args<'_>) -> Bytes {
        if !self.client.policy.access.is_admin(self.client.tenant) {
            return answers::proxy_commands_for_admins();
        }
        let sub = if args.len() > 1 { args.get(1) } else { b"" };
        let upper = sub.to_ascii_uppercase();
        match (upper.as_slice(), args.len()) {
            (b"INFO", 2) => answers::bulk(self.proxy_info().as_bytes()),
            (b"POLICY", 2) => answers::bulk(self.policy_report().as_bytes()),
            (b"RELOAD", 2) => match &self.ctx.ops.reload {
                Some(reload) => match reload() {
                    Ok(version) => answers::simple(&format!("OK policy version {version}")),
                    Err(problems) => answers::reload_failed(&problems.to_string()),
                },
                None => answers::nothing_to_reload(),
            },
            (b"SLOWLOG", _) => self.slowlog_command(args),
            (b"KEYSPACE", 2) => match &self.ctx.ops.keyspace {
                Some(keyspace) => answers::bulk(keyspace.report().to_string().as_bytes()),
                None => answers::keyspace_off(),
            },
            (b"HELP", 2) => {
                let mut out = BytesMut::new();
                out.put_slice(format!("*{}\r\n", HELP.len()).as_bytes());
                for line in HELP {
                    out.put_slice(format!("+{line}\r\n").as_bytes());
                }
                out.freeze()
            }
            _ => answers::unknown_proxy_subcommand(sub),
        }
    }

    fn slowlog_command(&self, args: &Args<'_>) -> Bytes {
        let log = &self.ctx.ops.slowlog;
        let op = if args.len() > 2 {
            args.get(2).to_ascii_uppercase()
        } else {
            b"GET".to_vec()
        };
        match (op.as_slice(), args.len()) {
            (b"LEN", 3) => answers::integer(log.len() as i64),
            (b"RESET", 3) => {
                log.reset();
                answers::ok()
            }
            (b"GET", 2..=4) => {
                let count = match args.len() {
                    4 => match codec::parse_int(args.get(3)) {
                        Some(n) if n >= -1 => usize::try_from(n).unwrap_or(usize::MAX),
                        _ => {
                            return answers::slowlog_bad_count();
                        }
                    },
                    _ => 10,
                };
                // Redis's SLOWLOG GET shape: id, unix time, microseconds, arguments, client
                // address, client name. Arguments are the command name only.
                let entries = log.latest(count);
                let mut out = BytesMut::new();
                out.put_slice(format!("*{}\r\n", entries.len()).as_bytes());
                for e in entries {
                    out.put_slice(
                        format!(
                            "*6\r\n:{}\r\n:{}\r\n:{}\r\n",
                            e.id,
                            e.at,
                            e.duration.as_micros()
                        )
                        .as_bytes(),
                    );
                    let mut argv = vec![e.command.clone()];
                    if e.others > 0 {
                        argv.push(format!("(+{} more in the same batch)", e.others));
                    }
                    out.put_slice(format!("*{}\r\n", argv.len()).as_bytes());
                    for a in argv {
                        codec::put_bulk(&mut out, a.as_bytes());
                    }
                    codec::put_bulk(&mut out, e.client.to_string().as_bytes());
                    codec::put_bulk(&mut out, b"");
                }
                out.freeze()
            }
            _ => answers::slowlog_usage(),
        }
    }

    /// The `# Proxy` section of this session's INFO (see [`proxy_info`]).
    pub(super) fn proxy_info(&self) -> String {
        proxy_info(&self.ctx, &self.client, self.routing.read_from())
    }

    /// The running policy and its counters, one rule per line.
    fn policy_report(&self) -> String {
        let mut s = format!("version: {}\n", self.client.policy.version());
        for (id, counts) in rule_counts(&self.client) {
            let _ = write!(s, "rule {id}:");
            for (outcome, n) in counts {
                let _ = write!(s, " {}={n}", outcome.name());
            }
            s.push('\n');
        }
        s
    }
}

/// The `# Proxy` section: INFO's `field:value` lines; `read_from` where reads go
/// (`Routing::read_from`).
pub(super) fn proxy_info(
    ctx: &Context,
    client: &ClientState,
    read_from: Option<crate::config::ReadFrom>,
) -> String {
    let m = &ctx.ops.metrics;
    let mut s = String::with_capacity(512);
    let _ = write!(
        s,
        "# Proxy\r\nproxy_version:{}\r\nproxy_uptime_in_seconds:{}\r\nproxy_connected_clients:{}\r\nproxy_upstream:{}\r\nproxy_upstream_connections:{}\r\nproxy_upstream_credentials_refused:{}\r\nproxy_policy_version:{}\r\nproxy_policy_rules:{}\r\n",
        env!("CARGO_PKG_VERSION"),
        m.started.elapsed().as_secs(),
        m.clients.get(),
        ctx.pool.addr(),
        m.upstream_connections.get(),
        m.upstream_credentials_refused_nodes.get(),
        client.policy.version(),
        client.policy.rule_ids().count(),
    );
    if let Some(read_from) = read_from {
        let _ = write!(
            s,
            "proxy_read_from:{}\r\nproxy_replica_reads:{}\r\n",
            read_from.as_str(),
            m.replica_reads.get(),
        );
    }
    s.push_str(&ctx.ops.mirror.info(m));
    let switch = ctx.ops.cutover.last();
    if !switch.is_empty() {
        let _ = write!(s, "proxy_upstream_switch:{switch}\r\n");
    }
    if let Some(server) = m.upstream_server.load().as_deref() {
        let _ = write!(
            s,
            "proxy_upstream_server:{}\r\nproxy_upstream_server_version:{}\r\nproxy_learned_commands:{}\r\n",
            server.name, server.version, server.learned.added
        );
    }
    if let Some(report) = m.memory_report.load().as_deref() {
        s.push_str(&report.info);
    }
    for (id, counts) in rule_counts(client) {
        let _ = write!(s, "proxy_rule_{id}:");
        for (i, (outcome, n)) in counts.iter().enumerate() {
            let sep = if i > 0 { "," } else { "" };
            let _ = write!(s, "{sep}{}={n}", outcome.name());
        }
        s.push_str("\r\n");
    }
    s
}

/// Every rule with its counts over all tenants, in file order.
fn rule_counts(client: &ClientState) -> Vec<(String, Vec<(Outcome, u64)>)> {
    let mut rules: Vec<(String, Vec<(Outcome, u64)>)> = client
        .policy
        .rule_ids()
        .map(|id| {
            (
                id.to_string(),
                Outcome::OF_RULES.iter().map(|&o| (o, 0)).collect(),
            )
        })
        .collect();
    client.policy.for_each_counter(|rule, _tenant, outcome, n| {
        if let Some((_, counts)) = rules.iter_mut().find(|(id, _)| id == rule) {
            if let Some(c) = counts.iter_mut().find(|(o, _)| *o == outcome) {
                c.1 += n;
            }
        }
    });
    rules
}
