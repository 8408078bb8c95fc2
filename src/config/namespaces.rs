//! Tenant namespaces that overlap: one tenant's prefix beginning with another's (`app:` and
//! `app:2:`) lets tenant `app` name `2:x` and reach tenant `app2`'s `x` (equal prefixes share
//! every key). Refused at `--check` and at load, with the line of the longer prefix.
//!
//! `access.namespaces` is read by the policy without locations, so the lines come from a
//! second, lenient reading of the file's text that keeps only this map.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::Problem;

/// The part of the file this check reads: everything else is ignored here (the strict
/// reading of the whole file reports it).
#[derive(Deserialize, Default)]
#[serde(default)]
struct File {
    /// `access:`.
    access: Access,
}

/// `access:`, its namespaces only.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Access {
    /// Tenant -> key prefix, with where each prefix is written.
    namespaces: BTreeMap<String, Spanned<String>>,
}

/// The line each tenant's namespace is written on, read from `text` (empty when it does not
/// parse: the strict reading reports why).
pub(super) fn lines(text: &str) -> BTreeMap<String, u64> {
    serde_saphyr::from_str::<File>(text)
        .map(|f| {
            f.access
                .namespaces
                .into_iter()
                .map(|(tenant, prefix)| (tenant, prefix.referenced.line()))
                .collect()
        })
        .unwrap_or_default()
}

/// A problem for every pair of tenants whose namespaces overlap, on the line of the longer
/// (or, for equal ones, the later) prefix; `lines` as [`lines`] found them.
pub(super) fn overlaps(
    namespaces: &BTreeMap<String, String>,
    lines: &BTreeMap<String, u64>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let all: Vec<(&String, &String)> = namespaces.iter().filter(|(_, p)| !p.is_empty()).collect();
    for (i, (tenant, prefix)) in all.iter().enumerate() {
        for (other, shorter) in &all[..i].iter().chain(&all[i + 1..]).collect::<Vec<_>>() {
            let equal = prefix == shorter;
            // Equal prefixes: reported once, on the tenant named later.
            if !prefix.starts_with(shorter.as_str()) || (equal && other > tenant) {
                continue;
            }
            problems.push(Problem {
                line: lines.get(*tenant).copied().unwrap_or(0),
                field: format!("access.namespaces.{tenant}"),
                message: if equal {
                    format!(
                        "`{prefix}` is tenant {other}'s namespace too: the two would share every key; give each tenant its own prefix"
                    )
                } else {
                    format!(
                        "`{prefix}` begins with tenant {other}'s namespace `{shorter}`: {other} would reach {tenant}'s keys (as `{}…`); use prefixes where neither begins with the other, such as `{shorter}` and `{}`",
                        &prefix[shorter.len()..],
                        suggestion(prefix, shorter)
                    )
                },
            });
        }
    }
    problems
}

/// A prefix for the longer namespace that no longer begins with the shorter one: the shorter
/// one's separator replaced (`app:2:` under `app:` -> `app2:`).
fn suggestion(prefix: &str, shorter: &str) -> String {
    let base = shorter.trim_end_matches(|c: char| !c.is_alphanumeric());
    let rest = &prefix[shorter.len()..];
    format!("{base}{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(t, p)| (t.to_string(), p.to_string()))
            .collect()
    }

    #[test]
    fn a_prefix_of_another_is_refused_on_the_longer_ones_line() {
        let text =
            "access:\n  namespaces:\n    app: 'app:'\n    app2: 'app:2:'\n    other: 'other:'\n";
        let ns = map(&[("app", "app:"), ("app2", "app:2:"), ("other", "other:")]);
        let problems = overlaps(&ns, &lines(text));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].line, 4);
        assert_eq!(problems[0].field, "access.namespaces.app2");
        assert!(
            problems[0].message.contains("such as `app:` and `app2:`"),
            "{}",
            problems[0].message
        );
    }

    #[test]
    fn equal_prefixes_are_refused_once_and_apart_ones_pass() {
        let ns = map(&[("a", "x:"), ("b", "x:")]);
        let problems = overlaps(&ns, &BTreeMap::new());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, "access.namespaces.b");
        let ns = map(&[("app", "app:"), ("app2", "app2:"), ("ap", "ap|")]);
        assert!(overlaps(&ns, &BTreeMap::new()).is_empty());
    }
}
