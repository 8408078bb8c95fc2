//! The entry layer's composer: a configuration file with everything it names checked — its
//! own values (`config`), the upstream TLS files (`upstream::tls`) and the rules (`policy`) —
//! every problem with file, line and field, reported at once. Here, above the three, so none
//! of them imports another to validate itself.

use std::path::Path;

use std::sync::Arc;

use crate::config::{Config, ConfigError, Problem};
use crate::policy::Policy;
use crate::topology::routes::{RouteSpec, RouteTable};

/// Reads, parses and validates a configuration file: [`Config::read`], then [`validate`].
/// A file that does not parse gets every problem reported, not only the parser's first
/// ([`recovered`]).
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let config = match Config::read(path) {
        Err(ConfigError::Parse { .. }) => {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            return Err(recovered(&text, path));
        }
        other => other?,
    };
    validate(&config, path)?;
    Ok(config)
}

/// [`load`] for the tools that never connect (`--explain`, `replay`): a `password_env` not
/// set or a `password_file` not readable here is no problem for them, so a policy can be
/// checked against traffic where the upstream's secret is not.
pub(crate) fn load_without_secrets(path: &Path) -> Result<Config, ConfigError> {
    let mut config = match Config::read(path) {
        Err(ConfigError::Parse { .. }) => {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            return Err(recovered(&text, path));
        }
        other => other?,
    };
    config.secret_problems.clear();
    validate(&config, path)?;
    Ok(config)
}

/// Parses and validates YAML text: [`Config::parse`], then [`validate`]; `path` is only used
/// in messages.
pub fn from_yaml(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let config = match Config::parse(text, path) {
        Err(ConfigError::Parse { .. }) => return Err(recovered(text, path)),
        other => other?,
    };
    validate(&config, path)?;
    Ok(config)
}

/// Every problem of `text`, which does not parse: each parse error (`config_recovery`), then
/// the validation problems of what parses once their entries are removed, less those that
/// only follow from a removal.
fn recovered(text: &str, path: &Path) -> ConfigError {
    let mut r = crate::config::recovery::recover(text);
    let mut problems = std::mem::take(&mut r.problems);
    if let Some(config) = &r.config {
        for mut p in all_problems(config) {
            p.field = r.original_path(&p.field);
            if !r.follows_from_removal(&p) {
                problems.push(p);
            }
        }
    }
    problems.sort_by_key(|p| p.line);
    ConfigError::Invalid {
        path: path.to_path_buf(),
        problems,
    }
}

/// Every problem of `config`: its own values, then the TLS files, then the rules.
pub fn validate(config: &Config, path: &Path) -> Result<(), ConfigError> {
    ConfigError::unless_none(path, all_problems(config))
}

/// The problems [`validate`] reports.
fn all_problems(config: &Config) -> Vec<Problem> {
    let mut problems = config.problems();
    if let Some(tls) = &config.upstream.tls {
        let host = config.tls_host();
        if let Err(e) = crate::upstream::tls::build(tls, &host) {
            problems.push(Problem {
                line: tls.ca_file.referenced.line(),
                field: "upstream.tls".to_string(),
                message: e,
            });
        }
    }
    if let Err(rule_problems) = policy(config) {
        problems.extend(rule_problems);
    }
    place(&mut problems, config);
    problems
}

/// Opens what a start needs that the file names and nothing has opened yet (the audit
/// file, `audit.output`): a problem there is the file's, reported like the others with its
/// line and field (exit 64), before the proxy binds or logs that it started.
pub fn open_files(config: &Config, path: &Path) -> Result<(), ConfigError> {
    match crate::observe::audit::open_output(&config.audit) {
        Ok(()) => Ok(()),
        Err(problem) => ConfigError::unless_none(path, vec![problem]),
    }
}

/// What `--check` warns about without failing: what depends on the machine and the user the
/// proxy runs as rather than on the file (an audit directory that does not exist yet or that
/// the user running the check cannot write; systemd's `LogsDirectory=` creates it at start,
/// and the check may run as another user than the proxy).
pub fn warnings(config: &Config) -> Vec<Problem> {
    crate::observe::audit::probe_output(&config.audit)
        .into_iter()
        .collect()
}

/// Gives a problem without a line (its value carries no location: a default, a setting
/// inside `ttl:`, a missing one) the line of its field's key in the file, else of the nearest
/// section above it that is written (`rules[1].id` missing: the rule's `- ` line). A value
/// from the command line or the environment keeps none: it is not the file's.
fn place(problems: &mut [Problem], config: &Config) {
    for p in problems.iter_mut() {
        if p.line != 0 || p.field.is_empty() || config.overridden.contains(&p.field.as_str()) {
            continue;
        }
        let mut field = p.field.as_str();
        loop {
            if let Some(&line) = config.key_lines.get(field) {
                p.line = line;
                break;
            }
            match field.rfind(['.', '[']) {
                Some(i) => field = &field[..i],
                None => break,
            }
        }
    }
}

/// The policy of a whole configuration: its rules and `access:` section, its version, the
/// log budget `admin.denial_logs_per_second` sets, and the routes its rules may be scoped to.
pub fn policy(config: &Config) -> Result<Policy, Vec<Problem>> {
    Policy::from_parts(
        &config.rules,
        &config.access,
        config.version.clone(),
        config.admin.denial_logs_per_second.value,
        route_table(config),
    )
}

/// The route table of `routes:`, `None` without routes: each route's prefixes on the node
/// [`Config::route_node`] numbers, entered behind every tenant namespace they apply to.
pub fn route_table(config: &Config) -> Option<Arc<RouteTable>> {
    if !config.has_routes() {
        return None;
    }
    let namespace = |tenant: &str| {
        config
            .access
            .namespaces
            .get(tenant)
            .map(|p| p.as_bytes().to_vec())
    };
    let specs: Vec<RouteSpec> = config
        .routes
        .iter()
        .map(|r| RouteSpec {
            name: r.name.value.clone(),
            node: config.route_node(r),
            prefixes: r
                .prefixes
                .iter()
                .map(|p| p.value.as_bytes().to_vec())
                .collect(),
            namespaces: r
                .tenants
                .as_ref()
                .map(|t| t.iter().filter_map(|t| namespace(t)).collect()),
        })
        .collect();
    let all: Vec<Vec<u8>> = config
        .access
        .namespaces
        .values()
        .map(|p| p.as_bytes().to_vec())
        .collect();
    Some(Arc::new(RouteTable::new(&specs, &all)))
}

/// [`policy`] for the operator's tools (`--explain`, `--print-acl`): every problem on its own
/// line, prefixed with the file it came from.
pub(crate) fn policy_or_report(config: &Config, path: &Path) -> Result<Policy, String> {
    policy(config).map_err(|problems| {
        problems
            .iter()
            .map(|p| format!("{}: {p}", path.display()))
            .collect::<Vec<_>>()
            .join("\n")
    })
}
