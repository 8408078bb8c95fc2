//! `upstream.dedicated_caps`: how much of `upstream.dedicated_max` one tenant may hold, so
//! one tenant's blocked BLPOP or SUBSCRIBE clients cannot take every dedicated connection
//! and leave another tenant's MULTI, BLPOP and SUBSCRIBE failing (issue 26).

use serde::Deserialize;

use super::{Located, Problem, located};

/// Shares of the dedicated connections.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct DedicatedCapsConfig {
    /// Percent of `upstream.dedicated_max` one tenant's clients may hold at once (rounded
    /// down, at least 1), when the policy has more than one tenant: half by default, so one
    /// tenant can never starve the others, and a tenant alone still gets most of the cap.
    /// With a single tenant the whole `dedicated_max` is its.
    pub(crate) per_tenant_percent: Located<u8>,
}

impl Default for DedicatedCapsConfig {
    fn default() -> Self {
        DedicatedCapsConfig {
            per_tenant_percent: located(50),
        }
    }
}

impl DedicatedCapsConfig {
    /// Every problem with the section's values.
    pub(super) fn problems(&self, problems: &mut Vec<Problem>) {
        let p = &self.per_tenant_percent;
        if !(1..=100).contains(&p.value) {
            problems.push(Problem {
                line: p.referenced.line(),
                field: "upstream.dedicated_caps.per_tenant_percent".into(),
                message: "must be between 1 and 100".into(),
            });
        }
    }

    /// The most dedicated connections one tenant may hold, of `max`, when the policy has
    /// `tenants` tenants.
    pub(crate) fn per_tenant(&self, max: usize, tenants: usize) -> usize {
        if tenants <= 1 {
            return max;
        }
        (max * usize::from(self.per_tenant_percent.value) / 100).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_share_applies_only_beside_other_tenants() {
        let caps = DedicatedCapsConfig::default();
        assert_eq!(
            caps.per_tenant(10, 1),
            10,
            "a single tenant gets the whole cap"
        );
        assert_eq!(caps.per_tenant(10, 3), 5);
        assert_eq!(caps.per_tenant(1, 3), 1, "never 0");
        let mut problems = Vec::new();
        let zero = DedicatedCapsConfig {
            per_tenant_percent: located(0),
        };
        zero.problems(&mut problems);
        assert_eq!(
            problems[0].field,
            "upstream.dedicated_caps.per_tenant_percent"
        );
    }
}
