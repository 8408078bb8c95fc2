//! Gradual enforcement: a rule with `share: 10%` is enforced for that share of clients and
//! audited for the rest, so a TTL rule or a read guard goes out to 1%, 10%, 100% with each
//! part's counts side by side (`denied` for the enforced part, `audited` for the rest).
//!
//! Which clients: a stable hash of the rule's id and the client's identity (`share_by`: its IP
//! address, its tenant's name, or the user it logged in as) picks a bucket in 0..10,000; the rule is enforced where the
//! bucket is below the share in hundredths of a percent. So the same client stays in or out
//! across reloads and restarts while the rule's id and `share_by` stay, raising the share keeps
//! every client already in, and two rules at 10% pick different clients (a client is not the
//! test subject of every rollout at once).
//!
//! The hash is FNV-1a (64-bit), written here: it must give the same bucket in every build and
//! version (std's hashers are randomly keyed or may change between releases), and a dozen
//! lines do not justify a dependency.

use std::net::IpAddr;

use super::config::ShareBy;
use super::{Client, Mode};

/// Buckets a client can fall in: a share is given to a hundredth of a percent.
const BUCKETS: u64 = 10_000;

/// A rule's share of enforced clients.
#[derive(Debug, Clone)]
pub(super) struct Share {
    /// Enforced below this bucket (hundredths of a percent: 1,000 is 10%).
    below: u64,
    /// Which identity picks the bucket.
    by: ShareBy,
    /// FNV state after the rule's id: each rule picks its own clients.
    salt: u64,
    /// By tenant: whether each tenant (by index) is in, computed from its name once.
    tenants_in: Vec<bool>,
}

impl Share {
    /// `percent` of clients (0 to 100, two decimals), chosen by `by`, for the rule `rule_id`;
    /// `tenant_names` in tenant-index order.
    pub(super) fn new(rule_id: &str, hundredths: u64, by: ShareBy, tenant_names: &[&str]) -> Share {
        let salt = fnv(FNV_OFFSET, rule_id.as_bytes());
        let mut share = Share {
            below: hundredths.min(BUCKETS),
            by,
            salt,
            tenants_in: Vec::new(),
        };
        share.tenants_in = tenant_names
            .iter()
            .map(|name| share.bucket(name.as_bytes()) < share.below)
            .collect();
        share
    }

    /// Whether it picks clients by their login (`share_by: user`).
    pub(super) fn by_user(&self) -> bool {
        self.by == ShareBy::User
    }

    /// Whether the rule is enforced for `client`.
    pub(super) fn includes(&self, client: &Client) -> bool {
        match self.by {
            ShareBy::Tenant => self
                .tenants_in
                .get(usize::from(client.tenant))
                .copied()
                .unwrap_or(false),
            ShareBy::User => (mix(self.salt ^ client.user) % BUCKETS) < self.below,
            ShareBy::Address => match client.addr {
                IpAddr::V4(a) => self.bucket(&a.octets()) < self.below,
                IpAddr::V6(a) => match a.to_ipv4_mapped() {
                    Some(v4) => self.bucket(&v4.octets()) < self.below,
                    None => self.bucket(&a.octets()) < self.below,
                },
            },
        }
    }

    /// The mode for `client` of a rule whose file mode is `mode`.
    pub(super) fn mode_for(&self, mode: Mode, client: &Client) -> Mode {
        if mode == Mode::Enforce && self.includes(client) {
            Mode::Enforce
        } else {
            Mode::Audit
        }
    }

    /// The share in words (`10% of addresses`), for the start-up line and `--explain`.
    pub(super) fn describe(&self) -> String {
        let whole = self.below / 100;
        let frac = self.below % 100;
        let pct = if frac == 0 {
            format!("{whole}%")
        } else {
            format!("{}%", format!("{whole}.{frac:02}").trim_end_matches('0'))
        };
        let of = match self.by {
            ShareBy::Address => "client addresses",
            ShareBy::Tenant => "tenants",
            ShareBy::User => "users",
        };
        format!("{pct} of {of}")
    }

    /// The bucket of an identity for this rule.
    fn bucket(&self, identity: &[u8]) -> u64 {
        fnv(fnv(self.salt, &[0xff]), identity) % BUCKETS
    }
}

pub(super) use crate::config::percent::parse;

/// The key `share_by: user` reads a client's login by (`Client::user`): FNV-1a of the name,
/// 0 without one. Hashed once here so that `Client` stays `Copy` and free of the name.
pub(crate) fn user_key(user: Option<&[u8]>) -> u64 {
    user.map_or(0, |name| fnv(FNV_OFFSET, name))
}

/// splitmix64's finaliser: the rule's salt and a user key mixed into a well-spread value (an
/// XOR alone would keep FNV's low bits, which the bucket is taken from).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a's 64-bit offset basis.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a, 64-bit, continuing from `state`.
fn fnv(mut state: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        state ^= u64::from(b);
        state = state.wrapping_mul(0x0000_0100_0000_01b3);
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(addr: [u8; 4]) -> Client {
        Client {
            id: 1,
            addr: IpAddr::from(addr),
            tenant: 0,
            user: 0,
            again: false,
        }
    }

    #[test]
    fn a_share_is_read_as_a_percentage() {
        assert_eq!(parse("10%"), Ok(1_000));
        assert_eq!(parse("0.5%"), Ok(50));
        assert_eq!(parse("12.34%"), Ok(1_234));
        assert_eq!(parse("100%"), Ok(10_000));
        assert_eq!(parse("0%"), Ok(0));
        assert_eq!(parse("25"), Ok(2_500));
        for bad in ["101%", "-1%", "ten", "1.234%", "", "%", ".5%"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn about_the_share_of_addresses_is_in_and_raising_it_keeps_them() {
        let ten = Share::new("ttl", 1_000, ShareBy::Address, &[]);
        let fifty = Share::new("ttl", 5_000, ShareBy::Address, &[]);
        let addrs: Vec<[u8; 4]> = (0..10_000u32)
            .map(|i| [10, (i >> 16) as u8, (i >> 8) as u8, i as u8])
            .collect();
        let in_ten: Vec<bool> = addrs.iter().map(|a| ten.includes(&client(*a))).collect();
        let count = in_ten.iter().filter(|&&x| x).count();
        assert!((800..1_200).contains(&count), "{count} of 10,000 at 10%");
        for (a, was_in) in addrs.iter().zip(&in_ten) {
            if *was_in {
                assert!(
                    fifty.includes(&client(*a)),
                    "{a:?} left when the share grew"
                );
            }
        }
        // Another rule picks other clients.
        let other = Share::new("guard", 1_000, ShareBy::Address, &[]);
        let both = addrs
            .iter()
            .filter(|a| ten.includes(&client(**a)) && other.includes(&client(**a)))
            .count();
        assert!(both < 300, "{both} in both rules' 10%");
        assert!(!Share::new("x", 0, ShareBy::Address, &[]).includes(&client([1, 2, 3, 4])));
        assert!(Share::new("x", 10_000, ShareBy::Address, &[]).includes(&client([1, 2, 3, 4])));
    }

    #[test]
    fn by_user_about_the_share_of_names_is_in() {
        let share = Share::new("r", 1_000, ShareBy::User, &[]);
        let names: Vec<String> = (0..10_000).map(|i| format!("user{i}")).collect();
        let count = names
            .iter()
            .filter(|n| {
                let mut c = client([127, 0, 0, 1]);
                c.user = user_key(Some(n.as_bytes()));
                share.includes(&c)
            })
            .count();
        assert!(
            (800..1_200).contains(&count),
            "{count} of 10,000 users at 10%"
        );
        assert_eq!(user_key(None), 0);
        assert_eq!(share.describe(), "10% of users");
    }

    #[test]
    fn by_tenant_the_tenants_name_decides() {
        let names: Vec<String> = (0..1_000).map(|i| format!("t{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let share = Share::new("r", 2_000, ShareBy::Tenant, &refs);
        let count = share.tenants_in.iter().filter(|&&x| x).count();
        assert!(
            (150..250).contains(&count),
            "{count} of 1,000 tenants at 20%"
        );
        // The same names in another order: the same tenants are in.
        let mut reversed = refs.clone();
        reversed.reverse();
        let again = Share::new("r", 2_000, ShareBy::Tenant, &reversed);
        for (i, name) in refs.iter().enumerate() {
            let j = reversed.iter().position(|n| n == name).unwrap();
            assert_eq!(share.tenants_in[i], again.tenants_in[j], "{name}");
        }
        assert_eq!(share.describe(), "20% of tenants");
        assert_eq!(
            Share::new("r", 50, ShareBy::Address, &[]).describe(),
            "0.5% of client addresses"
        );
    }
}
