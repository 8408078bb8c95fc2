//! Names of commands newer than the built-in table (Redis 7.0.15), so a policy can name them
//! before the proxy has met a server that has them (`--check`, `--explain` offline), and the
//! commands that newer servers added as another spelling of a built-in one.
//!
//! Their facts (arity, flags, key specs) come from the server at connect
//! ([`super::learned`]); this list only says the names are real.

/// Commands and subcommands of Redis 7.2–8.x and Valkey 7.2–9.x that Redis 7.0.15 lacks,
/// lower-case, full names (`container|sub`).
pub(crate) const NAMES: &[&str] = &[
    // Redis 7.2 / Valkey 7.2
    "client|no-touch",
    "client|setinfo",
    "cluster|myshardid",
    "waitaof",
    // Redis 7.4+, Valkey 9: hash field expiry
    "hexpire",
    "hexpireat",
    "hexpiretime",
    "hgetdel",
    "hgetex",
    "hpersist",
    "hpexpire",
    "hpexpireat",
    "hpexpiretime",
    "hpttl",
    "hsetex",
    "httl",
    // Redis 8: vector sets
    "vadd",
    "vcard",
    "vdim",
    "vemb",
    "vgetattr",
    "vinfo",
    "vismember",
    "vlinks",
    "vrandmember",
    "vrem",
    "vsetattr",
    "vsim",
    // Redis 8.2+
    "delex",
    "digest",
    "xackdel",
    "xdelex",
    // Valkey 8–9
    "client|capa",
    "client|import-source",
    "cluster|cancelslotmigrations",
    "cluster|flushslot",
    "cluster|getslotmigrations",
    "cluster|migrateslots",
    "cluster|slot-stats",
    "cluster|syncslots",
    "clusterscan",
    "commandlog",
    "commandlog|get",
    "commandlog|help",
    "commandlog|len",
    "commandlog|reset",
    "delifeq",
    "msetex",
    "script|show",
];

/// A built-in command and the newer commands that do the same to the same state: a rule
/// naming the first concerns the others (denying `slowlog|reset` denies `commandlog|reset`).
pub(crate) const ALIASES: &[(&str, &[&str])] = &[
    ("slowlog", &["commandlog"]),
    ("slowlog|get", &["commandlog|get"]),
    ("slowlog|len", &["commandlog|len"]),
    ("slowlog|reset", &["commandlog|reset"]),
];

/// Whether `name` (full, any case) is a newer command this list knows.
pub(crate) fn is_known(name: &str) -> bool {
    NAMES.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// The newer commands that do what the built-in `name` does (full, any case).
pub(crate) fn aliases_of(name: &str) -> &'static [&'static str] {
    ALIASES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map_or(&[], |(_, a)| a)
}
