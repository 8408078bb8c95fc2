//! Which rules `check` runs for each command: a `Plan` per command of the built-in table,
//! made once at compile, and the plans of commands learned from the server, made on first
//! use through each rule's `Matcher` (`Policy::plan_of`, in `model`, finds them).

use std::sync::Arc;

use crate::commands::{AclCategories, CommandSpec};

/// Plans are found by their table entry's address: not chosen by clients, so the cheap hasher.
pub(super) type BuildPtrHasher = crate::internal_hash::BuildInternalHasher;

/// The rules `check` runs for one command, in the order it runs them.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Phases `Deny` and `ArgumentGuards`: the rules indexed by the command.
    pub(super) command: Box<[usize]>,
    /// The phases after them: the `global` rules that can act on the command.
    pub(super) global: Box<[usize]>,
}

/// Which commands learned from the server a command-indexed rule concerns.
#[derive(Debug, Default)]
pub(super) struct Matcher {
    /// Full lower-case names (`hsetex`, `commandlog|reset`; a container names its
    /// subcommands too).
    pub(super) names: Vec<String>,
    /// `@category` entries of `deny`: a command in any of them.
    pub(super) categories: Vec<AclCategories>,
    /// `deny_newer_in`: a learned command in any of these categories…
    pub(super) newer_in: Vec<AclCategories>,
    /// …unless named here (`allow_newer`).
    pub(super) allow_newer: Vec<String>,
}

impl Matcher {
    pub(super) fn is_empty(&self) -> bool {
        self.names.is_empty() && self.categories.is_empty() && self.newer_in.is_empty()
    }

    pub(super) fn matches(&self, spec: &CommandSpec) -> bool {
        let named = |names: &[String]| {
            names
                .iter()
                .any(|n| n == spec.name || n == spec.container_name())
        };
        named(&self.names)
            || self.categories.iter().any(|&c| spec.in_categories(c))
            || (self.newer_in.iter().any(|&c| spec.in_categories(c)) && !named(&self.allow_newer))
    }
}

/// The rules `check` runs for one command: the table's plan, or a learned command's.
pub(super) enum PlanOf<'a> {
    Table(&'a [usize], &'a [usize]),
    Learned(Arc<Plan>),
}

impl PlanOf<'_> {
    pub(super) fn parts(&self) -> (&[usize], &[usize]) {
        match self {
            PlanOf::Table(c, g) => (c, g),
            PlanOf::Learned(plan) => (&plan.command, &plan.global),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::commands;
    use crate::policy::act;
    use crate::policy::test_support::policy;
    use crate::policy::ttl;

    #[test]
    fn a_plan_leaves_out_only_rules_that_cannot_act() {
        // Every kind `may_act_on` filters, at limits any argument breaks; both TTL modes.
        let p = policy(
            "rules:\n  - id: created\n    ttl: {default: 60s, max: 1h, deny_persist: true, keys: created}\n  - id: written\n    ttl: {default: 60s, max: 1h, keys: written}\n  - id: cap\n    stream_maxlen: 1\n  - id: names\n    key_pattern: '^never$'\n  - id: big\n    max_value_bytes: 1\n  - id: many\n    max_keys: 1\n",
        );
        let big: &[u8] = b"12345678";
        let shapes: [&[&[u8]]; 14] = [
            &[],
            &[b"k"],
            &[b"k", big],
            &[b"k", b"100", big],
            &[b"k", b"f", big, b"g", big],
            &[b"2", b"k1", b"k2", big],
            &[b"1", b"k", big],
            &[b"k", b"EX", b"99999999"],
            &[b"k", big, b"KEEPTTL"],
            &[b"k", b"PERSIST"],
            &[b"k", b"*", b"f", big],
            &[b"k1", b"k2", b"k3"],
            &[b"k", b"SET", b"u8", b"800", b"1"],
            &[b"k", b"0", b"-1"],
        ];
        let mut left_out = 0;
        for spec in commands::all_commands() {
            let plan = p.plan_of(spec);
            let (_, planned) = plan.parts();
            for (r, rule) in p.rules.iter().enumerate() {
                if planned.contains(&r) {
                    continue;
                }
                left_out += 1;
                for shape in shapes {
                    let mut line: Vec<&[u8]> = spec.name.split('|').map(str::as_bytes).collect();
                    line.extend_from_slice(shape);
                    for build in [ttl::Build::Commands, ttl::Build::NoteOnly] {
                        assert!(
                            act(&rule.kind, spec, &line[..], build).is_none(),
                            "rule {} left out of {}'s plan acts on {:?}",
                            rule.id,
                            spec.name,
                            String::from_utf8_lossy(&line.join(&b' '))
                        );
                    }
                }
            }
        }
        assert!(
            left_out > 1000,
            "the plans leave out {left_out} rule checks"
        );
        let global_ids = |name: &str| -> Vec<&str> {
            let spec = commands::lookup_name(name.as_bytes()).unwrap();
            (p.plan_of(spec).parts().1.iter())
                .map(|&r| p.rules[r].id.as_str())
                .collect()
        };
        assert_eq!(global_ids("get"), ["names", "many"]);
        assert_eq!(global_ids("ping"), Vec::<&str>::new());
        assert_eq!(
            global_ids("xadd"),
            ["names", "big", "many", "cap", "created", "written"]
        );
        assert_eq!(
            global_ids("evalsha"),
            ["names", "big", "many", "created", "written"]
        );
        assert_eq!(global_ids("evalsha_ro"), ["names", "many"]);
    }
}
