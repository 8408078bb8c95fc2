//! Who a client is: proxy-side users (AUTH checked by the proxy against SHA-256 digests) and
//! identities that map a client's address and user to a tenant. Rules can then apply to some
//! tenants only (`tenants:`, `except_tenants:`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

use super::config::Access;
use crate::config::Problem;

/// The tenant of clients no identity matches.
pub(crate) const DEFAULT_TENANT: &str = "default";

/// Compiled `access:` section.
#[derive(Default)]
pub(crate) struct Identities {
    /// Tenant names; a client's tenant is an index into this. Index 0 is `default`.
    tenants: Vec<String>,
    /// Identity rules in file order; the first match wins.
    rules: Vec<Identity>,
    /// User name → SHA-256 of the password.
    users: HashMap<Vec<u8>, [u8; 32]>,
    /// Users a verified client certificate logs in as (`access.cert_users`).
    cert_users: Vec<Vec<u8>>,
    /// Commands other than AUTH/HELLO AUTH/QUIT/RESET need an authenticated client.
    pub(crate) require_auth: bool,
    /// Key prefix by tenant index; `None`: the tenant sees the whole keyspace.
    namespaces: Vec<Option<Vec<u8>>>,
    /// Lower-case hex SHA1 of the scripts namespaced tenants may run.
    scripts: Vec<[u8; 40]>,
    /// By tenant index: may use the `PROXY` command family.
    admins: Vec<bool>,
    /// Failed AUTH attempts by address (shared by every client of this policy).
    throttle: AuthThrottle,
}

struct Identity {
    tenant: u16,
    user: Option<Vec<u8>>,
    net: Option<(IpAddr, u8)>,
}

impl Identities {
    /// Compiles the section, collecting every problem with its line.
    pub(crate) fn compile(access: &Access, problems: &mut Vec<Problem>) -> Identities {
        let mut ids = Identities {
            tenants: vec![DEFAULT_TENANT.to_string()],
            require_auth: access.require_auth,
            ..Identities::default()
        };
        for (i, u) in access.users.iter().enumerate() {
            match parse_digest(&u.password_sha256.value) {
                Some(d) => {
                    ids.users.insert(u.name.as_bytes().to_vec(), d);
                }
                None => problems.push(Problem {
                    line: u.password_sha256.referenced.line(),
                    field: format!("access.users[{i}].password_sha256"),
                    message: "must be 64 hex digits (printf %s 'password' | sha256sum)".into(),
                }),
            }
        }
        ids.cert_users = access
            .cert_users
            .iter()
            .map(|u| u.as_bytes().to_vec())
            .collect();
        for (i, id) in access.identities.iter().enumerate() {
            let line = id.tenant.referenced.line();
            let tenant = ids.tenant_index_or_add(&id.tenant.value);
            let net = match &id.cidr {
                None => None,
                Some(c) => match parse_cidr(c) {
                    Some(n) => Some(n),
                    None => {
                        problems.push(Problem {
                            line,
                            field: format!("access.identities[{i}].cidr"),
                            message: format!("`{c}` is not a network like 10.0.0.0/8 or ::1/128"),
                        });
                        None
                    }
                },
            };
            if let Some(user) = &id.user {
                if !ids.users.contains_key(user.as_bytes())
                    && !ids.cert_users.iter().any(|c| c == user.as_bytes())
                {
                    problems.push(Problem {
                        line,
                        field: format!("access.identities[{i}].user"),
                        message: format!("no user `{user}` in access.users or access.cert_users"),
                    });
                }
            }
            ids.rules.push(Identity {
                tenant,
                user: id.user.as_ref().map(|u| u.as_bytes().to_vec()),
                net,
            });
        }
        ids.namespaces = vec![None; ids.tenants.len()];
        for (tenant, prefix) in &access.namespaces {
            match ids.tenant_index(tenant) {
                Some(i) if !prefix.is_empty() => {
                    ids.namespaces[usize::from(i)] = Some(prefix.as_bytes().to_vec())
                }
                Some(_) => problems.push(Problem {
                    line: 0,
                    field: format!("access.namespaces.{tenant}"),
                    message: "the prefix must not be empty".into(),
                }),
                None => problems.push(Problem {
                    line: 0,
                    field: format!("access.namespaces.{tenant}"),
                    message: format!("no tenant `{tenant}` in access.identities (or `default`)"),
                }),
            }
        }
        for (i, sha) in access.scripts.iter().enumerate() {
            let lower = sha.trim().to_ascii_lowercase();
            match <[u8; 40]>::try_from(lower.as_bytes()) {
                Ok(hex) if hex.iter().all(u8::is_ascii_hexdigit) => ids.scripts.push(hex),
                _ => problems.push(Problem {
                    line: 0,
                    field: format!("access.scripts[{i}]"),
                    message: format!("`{sha}` is not a SHA1 digest (40 hex digits; sha1sum FILE)"),
                }),
            }
        }
        ids.admins = vec![false; ids.tenants.len()];
        for (i, tenant) in access.admin_tenants.iter().enumerate() {
            match ids.tenant_index(tenant) {
                Some(t) => ids.admins[usize::from(t)] = true,
                None => problems.push(Problem {
                    line: 0,
                    field: format!("access.admin_tenants[{i}]"),
                    message: format!("no tenant `{tenant}` in access.identities (or `default`)"),
                }),
            }
        }
        if ids.require_auth && ids.users.is_empty() && ids.cert_users.is_empty() {
            problems.push(Problem {
                line: 0,
                field: "access.require_auth".into(),
                message: "needs at least one user in access.users or access.cert_users".into(),
            });
        }
        ids
    }

    fn tenant_index_or_add(&mut self, name: &str) -> u16 {
        match self.tenants.iter().position(|t| t == name) {
            Some(i) => i as u16,
            None => {
                self.tenants.push(name.to_string());
                (self.tenants.len() - 1) as u16
            }
        }
    }

    /// The index of a tenant named in a rule, if any identity defines it.
    pub(crate) fn tenant_index(&self, name: &str) -> Option<u16> {
        self.tenants
            .iter()
            .position(|t| t == name)
            .map(|i| i as u16)
    }

    /// Whether a tenant may use the `PROXY` command family.
    pub(crate) fn is_admin(&self, tenant: u16) -> bool {
        self.admins
            .get(usize::from(tenant))
            .copied()
            .unwrap_or(false)
    }

    /// Number of tenants, `default` included.
    pub(crate) fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// A tenant's name.
    pub(crate) fn tenant_name(&self, index: u16) -> &str {
        self.tenants
            .get(usize::from(index))
            .map_or(DEFAULT_TENANT, String::as_str)
    }

    /// The tenant of a client at `addr`, authenticated as `user` if any.
    pub(crate) fn tenant_of(&self, addr: IpAddr, user: Option<&[u8]>) -> u16 {
        for id in &self.rules {
            let user_ok = match &id.user {
                Some(u) => user == Some(u.as_slice()),
                None => true,
            };
            let net_ok = match id.net {
                Some((net, bits)) => in_network(addr, net, bits),
                None => true,
            };
            if user_ok && net_ok {
                return id.tenant;
            }
        }
        0
    }

    /// The key prefix of a tenant, if it is namespaced.
    pub(crate) fn namespace(&self, tenant: u16) -> Option<&[u8]> {
        self.namespaces
            .get(usize::from(tenant))
            .and_then(|n| n.as_deref())
    }

    /// Whether a script (by the hex SHA1 a client names, any case) is allowed.
    pub(crate) fn script_allowed(&self, sha_hex: &[u8]) -> bool {
        sha_hex.len() == 40
            && self
                .scripts
                .iter()
                .any(|s| s.as_slice().eq_ignore_ascii_case(sha_hex))
    }

    /// Whether any tenant is namespaced.
    pub(crate) fn has_namespaces(&self) -> bool {
        self.namespaces.iter().any(Option::is_some)
    }

    /// The user a verified client certificate logs in as: the first of its names (CN, then
    /// SANs) listed in `access.cert_users`.
    pub(crate) fn cert_user(&self, names: &[String]) -> Option<&[u8]> {
        names.iter().find_map(|name| {
            self.cert_users
                .iter()
                .find(|u| u.as_slice() == name.as_bytes())
                .map(Vec::as_slice)
        })
    }

    /// Whether the policy has password users (`access.users`): CLIENT KILL's `USER` then
    /// names the proxy's users.
    pub(crate) fn has_users(&self) -> bool {
        !self.users.is_empty()
    }

    /// Whether `name` is one of the proxy's users (`access.users` or `access.cert_users`):
    /// an AUTH naming it is the proxy's to check (any other is the client's own Redis login,
    /// unless `require_auth`), and `CLIENT KILL USER` refuses a user it does not have, as
    /// Redis does.
    pub(crate) fn knows_user(&self, name: &[u8]) -> bool {
        self.users.contains_key(name) || self.cert_users.iter().any(|c| c == name)
    }

    /// Checks a user's password; the digest comparison takes the same time wherever the
    /// digests differ.
    /// [`Identities::authenticate`] from `addr`, under the brute-force throttle.
    pub(crate) fn authenticate_from(
        &self,
        addr: IpAddr,
        user: &[u8],
        password: &[u8],
    ) -> Result<(), AuthFailure> {
        // A user the proxy does not know never logs in: all such names share one key per
        // address, so guessing names cannot grow the table beyond one entry per address
        // and user.
        let key = ThrottleKey {
            addr,
            user: self
                .users
                .contains_key(user)
                .then(|| user.to_vec().into_boxed_slice()),
        };
        self.throttle
            .attempt(key, Instant::now(), || self.authenticate(user, password))
    }

    pub(crate) fn authenticate(&self, user: &[u8], password: &[u8]) -> bool {
        let digest = ring::digest::digest(&ring::digest::SHA256, password);
        let Some(expected) = self.users.get(user) else {
            return false;
        };
        constant_time_eq(expected, digest.as_ref())
    }
}

/// Failed attempts allowed from one address before each further attempt must wait.
const FREE_FAILURES: u32 = 5;
/// First wait after the free failures; doubles with each further failure.
const FIRST_WAIT: Duration = Duration::from_millis(100);
/// Longest wait: enough to make guessing useless (a few thousand tries a day), short enough
/// that a legitimate client with a fixed password recovers quickly.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// Failures older than this are forgotten.
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// (Address, user) pairs tracked at most; beyond it only those being made to wait are kept,
/// so a spray of source addresses cannot grow memory without bound.
const MAX_TRACKED: usize = 100_000;

/// Why a proxy-side AUTH failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthFailure {
    /// Wrong user or password.
    Wrong,
    /// Too many failures for this user from this address: not even checked; retry after
    /// this long.
    Throttled(Duration),
}

/// Brute-force throttling of proxy-side AUTH by client address and user: after a few
/// failures each attempt must wait, doubling up to 30 s; a success clears the pair. The
/// password is not checked while a pair must wait, so waiting cannot be skipped by guessing
/// faster. Keyed by the user too, because clients behind one NAT, node or sidecar share an
/// address: one tenant's failed logins must never make another user's correct AUTH fail
/// (issue 26), and a guesser still waits for every user it tries.
#[derive(Debug, Default)]
pub(crate) struct AuthThrottle {
    /// Failures by address and user; bounded by `MAX_TRACKED`.
    failures: DashMap<ThrottleKey, Failures>,
}

/// Whose failures count together.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ThrottleKey {
    /// The client's address.
    pub(crate) addr: IpAddr,
    /// The proxy user it tried; `None` for every name the proxy does not know.
    pub(crate) user: Option<Box<[u8]>>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    /// Consecutive failures.
    count: u32,
    /// The latest, to forget old ones.
    last: Instant,
    /// No attempt is checked before this.
    wait_until: Instant,
}

impl AuthThrottle {
    /// Checks the credentials `key` tries with `check`, applying the throttle.
    pub(crate) fn attempt(
        &self,
        key: ThrottleKey,
        now: Instant,
        check: impl FnOnce() -> bool,
    ) -> Result<(), AuthFailure> {
        if let Some(f) = self.failures.get(&key) {
            if now < f.wait_until {
                return Err(AuthFailure::Throttled(f.wait_until - now));
            }
        }
        if check() {
            self.failures.remove(&key);
            return Ok(());
        }
        if self.failures.len() >= MAX_TRACKED {
            self.failures.retain(|_, f| f.wait_until > now);
        }
        let mut f = self.failures.entry(key).or_insert(Failures {
            count: 0,
            last: now,
            wait_until: now,
        });
        if now.duration_since(f.last) > FORGET_AFTER {
            f.count = 0;
        }
        f.count += 1;
        f.last = now;
        if f.count > FREE_FAILURES {
            let doublings = (f.count - FREE_FAILURES - 1).min(16);
            f.wait_until = now + (FIRST_WAIT * 2u32.pow(doublings)).min(MAX_WAIT);
        }
        Err(AuthFailure::Wrong)
    }
}

/// Compares secrets in time independent of where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn parse_cidr(text: &str) -> Option<(IpAddr, u8)> {
    let (addr, bits) = match text.split_once('/') {
        Some((a, b)) => (a.parse::<IpAddr>().ok()?, b.parse::<u8>().ok()?),
        None => {
            let a = text.parse::<IpAddr>().ok()?;
            (a, if a.is_ipv4() { 32 } else { 128 })
        }
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (bits <= max).then_some((addr, bits))
}

fn in_network(addr: IpAddr, net: IpAddr, bits: u8) -> bool {
    let addr = match (addr, net) {
        // An IPv4 client seen through an IPv6 socket still matches IPv4 networks.
        (IpAddr::V6(a), IpAddr::V4(_)) => a.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        _ => addr,
    };
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_failures_make_an_address_wait_doubling_and_success_clears_it() {
        let t = AuthThrottle::default();
        let key = |last: u8| ThrottleKey {
            addr: IpAddr::from([10, 0, 0, last]),
            user: Some(b"app".to_vec().into_boxed_slice()),
        };
        let (a, b) = (key(1), key(2));
        let t0 = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(t.attempt(a.clone(), t0, || false), Err(AuthFailure::Wrong));
        }
        // The sixth failure starts the wait; during it even the right password is not checked.
        assert_eq!(t.attempt(a.clone(), t0, || false), Err(AuthFailure::Wrong));
        let mut checked = false;
        let r = t.attempt(a.clone(), t0 + Duration::from_millis(50), || {
            checked = true;
            true
        });
        assert_eq!(r, Err(AuthFailure::Throttled(Duration::from_millis(50))));
        assert!(!checked);
        // Another address is unaffected, and so is another user from the same address.
        assert_eq!(t.attempt(b.clone(), t0, || true), Ok(()));
        let other_user = ThrottleKey {
            user: Some(b"ops".to_vec().into_boxed_slice()),
            ..a.clone()
        };
        assert_eq!(t.attempt(other_user, t0, || true), Ok(()));
        // After the wait, another failure doubles it.
        let t1 = t0 + FIRST_WAIT;
        assert_eq!(t.attempt(a.clone(), t1, || false), Err(AuthFailure::Wrong));
        assert_eq!(
            t.attempt(a.clone(), t1, || true),
            Err(AuthFailure::Throttled(FIRST_WAIT * 2))
        );
        // Success after the wait clears the address.
        let t2 = t1 + FIRST_WAIT * 2;
        assert_eq!(t.attempt(a.clone(), t2, || true), Ok(()));
        assert_eq!(t.attempt(a.clone(), t2, || false), Err(AuthFailure::Wrong));
        // The wait is capped.
        for _ in 0..40 {
            let _ = t.attempt(b.clone(), t0, || false);
            let now = t.failures.get(&b).map(|f| f.wait_until).unwrap();
            assert!(now <= t0 + MAX_WAIT);
        }
    }

    #[test]
    fn networks_match_by_prefix() {
        let (net, bits) = parse_cidr("10.0.0.0/8").unwrap();
        assert!(in_network("10.1.2.3".parse().unwrap(), net, bits));
        assert!(!in_network("11.0.0.1".parse().unwrap(), net, bits));
        assert!(in_network("::ffff:10.0.0.1".parse().unwrap(), net, bits));
        let (any, zero) = parse_cidr("0.0.0.0/0").unwrap();
        assert!(in_network("192.168.1.1".parse().unwrap(), any, zero));
        assert!(parse_cidr("10.0.0.0/33").is_none());
        assert!(parse_cidr("nope").is_none());
    }

    #[test]
    fn digests_are_64_hex_digits() {
        let d = parse_digest("2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b");
        assert_eq!(
            d.map(|d| d[0]),
            Some(0x2b),
            "sha256('secret') starts with 2b"
        );
        assert!(parse_digest("xyz").is_none());
    }
}
