//! The policy's last phase: rate limits counted in Redis (`backend: redis`), shared by every
//! proxy replica in front of that Redis. Asynchronous (one round trip per rule that applies),
//! so the session awaits it after the synchronous phases passed; the verdict, audit and
//! refusal text are the policy's like every other phase's. The `impl Policy` here lists the
//! limits that apply to a client ([`SharedCheck`], read synchronously from the compiled rules)
//! and checks them.

use bytes::Bytes;

use super::{Client, Counters, Kind, Mode, Outcome, Per, Policy};
use crate::policy::ratelimit::Limit;
use crate::policy::ratelimit::redis::{RedisLimiter, Transport};

/// One Redis-counted rate limit to check for a command.
pub(crate) struct SharedCheck<'a> {
    /// The rule's id, for the refusal.
    pub(crate) rule: &'a str,
    /// Requests per window.
    pub(crate) limit: Limit,
    /// Redis key prefix of the rule.
    pub(crate) prefix: &'a [u8],
    /// The identity counted (address or tenant name).
    pub(crate) key: Vec<u8>,
    /// Audit mode: log and count, never refuse.
    pub(crate) audit: bool,
    /// The operator's advice for the refusal.
    pub(crate) message: Option<&'a str>,
    /// The rule's counters.
    pub(crate) counters: &'a Counters,
}

impl Policy {
    /// Whether any rule counts in Redis (the session then awaits [`Policy::shared_limits`]).
    pub(crate) fn has_shared_limits(&self) -> bool {
        self.shared_limits
    }

    /// The Redis-counted rate limits that apply to `client`, for the session to check after the
    /// synchronous rules passed.
    pub(crate) fn shared_limits(&self, client: &Client) -> Vec<SharedCheck<'_>> {
        let mut out = Vec::new();
        for rule in &self.rules {
            let Kind::SharedRateLimit { limit, per, prefix } = &rule.kind else {
                continue;
            };
            if let Some(set) = &rule.tenants {
                if !set
                    .get(usize::from(client.tenant))
                    .copied()
                    .unwrap_or(false)
                {
                    continue;
                }
            }
            let key = match per {
                Per::Tenant => self.access.tenant_name(client.tenant).as_bytes().to_vec(),
                _ => client.addr.to_string().into_bytes(),
            };
            out.push(SharedCheck {
                rule: &rule.id,
                limit: *limit,
                prefix,
                key,
                audit: rule.mode_for(client) == Mode::Audit,
                message: rule.message.as_deref(),
                counters: &rule.counters,
            });
        }
        out
    }

    /// Checks the Redis-counted rate limits that apply to `client`; `Some(refusal)` when one is
    /// exceeded and enforced. `transport` opens the connection the script runs on. Redis
    /// unreachable: the limit is not applied (fail open, logged), as a limiter outage must not
    /// stop traffic. An audited rule logs through the policy's audit-log budget and counts.
    pub(crate) async fn check_shared_limits<T: Transport>(
        &self,
        client: &Client,
        command: &str,
        transport: impl Fn() -> T,
    ) -> Option<Bytes> {
        // Allowed when first judged, its budget spent then (`Client::again`).
        if client.again {
            return None;
        }
        for check in self.shared_limits(client) {
            let limiter = match RedisLimiter::new(transport(), check.prefix, check.limit) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(rule = %check.rule, error = %e, "shared rate limit not applied");
                    continue;
                }
            };
            match Box::pin(limiter.check(&check.key)).await {
                Ok(crate::policy::ratelimit::Decision::Allowed { .. }) => {}
                Ok(crate::policy::ratelimit::Decision::Limited { retry_after }) => {
                    if check.audit {
                        check.counters.add(client.tenant, Outcome::Audited);
                        self.log_audit(check.rule, command, client, "would rate-limit");
                        continue;
                    }
                    check.counters.add(client.tenant, Outcome::RateLimited);
                    self.log_denial(check.rule, command, client, Outcome::RateLimited);
                    let text =
                        crate::policy::ratelimit::refusal(check.rule, &check.limit, retry_after);
                    let text = match check.message {
                        Some(m) => format!("{text}; {m}"),
                        None => text,
                    };
                    return Some(crate::protocol::error::simple_error("ERR", &text));
                }
                Err(e) => {
                    tracing::warn!(rule = %check.rule, error = %e, "shared rate limit not applied");
                }
            }
        }
        None
    }
}
