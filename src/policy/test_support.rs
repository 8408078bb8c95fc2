//! What the policy's unit tests share: a policy from YAML rules, and a command checked as a
//! client of the default tenant.

use std::net::IpAddr;

use serde::Deserialize;

use super::{Client, Policy, RuleConfig, Verdict};

#[derive(Deserialize)]
pub(super) struct File {
    pub(super) rules: Vec<RuleConfig>,
}

pub(super) fn policy(yaml: &str) -> Policy {
    let f: File = serde_saphyr::from_str(yaml).unwrap();
    Policy::compile(&f.rules).unwrap()
}

pub(super) fn check(p: &Policy, line: &str) -> Verdict {
    check_as(p, 1, line)
}

pub(super) fn check_as(p: &Policy, id: u64, line: &str) -> Verdict {
    let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
    let client = Client {
        id,
        addr: IpAddr::from([127, 0, 0, 1]),
        tenant: 0,
        user: 0,
        again: false,
    };
    p.check(&client, &args[..])
}

pub(super) fn refused(v: Verdict) -> String {
    match v {
        Verdict::Refuse(b) => String::from_utf8(b.to_vec()).unwrap(),
        other => panic!("not refused: {other:?}"),
    }
}
