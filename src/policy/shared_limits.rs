//! The policy's last phase: rate limits counted in Redis (`backend: redis`), shared by every
//! proxy replica in front of that Redis. Asynchronous (one round trip per rule that applies),
//! so the session awaits it after the synchronous phases passed; the verdict, audit and
//! refusal text are the policy's like every other phase's.

use bytes::Bytes;

use super::{Client, Outcome, Policy};
use crate::ratelimit::redis::{RedisLimiter, Transport};

impl Policy {
    /// Checks the Redis-counted rate limits that apply to `client`; `Some(refusal)` when one is
    /// exceeded and enforced. `transport` opens the connection the script runs on. Redis
    /// unreachable: the limit is not applied (fail open, logged), as a limiter outage must not
    /// stop traffic. An audited rule logs through the policy's audit-log budget and counts.
    pub async fn check_shared_limits<T: Transport>(
        &self,
        client: &Client,
        command: &str,
        transport: impl Fn() -> T,
    ) -> Option<Bytes> {
        for check in self.shared_limits(client) {
            let limiter = match RedisLimiter::new(transport(), check.prefix, check.limit) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(rule = %check.rule, error = %e, "shared rate limit not applied");
                    continue;
                }
            };
            match Box::pin(limiter.check(&check.key)).await {
                Ok(crate::ratelimit::Decision::Allowed { .. }) => {}
                Ok(crate::ratelimit::Decision::Limited { retry_after }) => {
                    if check.audit {
                        check.counters.add(client.tenant, Outcome::Audited);
                        self.log_audit(check.rule, command, client, "would rate-limit");
                        continue;
                    }
                    check.counters.add(client.tenant, Outcome::RateLimited);
                    self.log_denial(check.rule, command, client, Outcome::RateLimited);
                    let text = crate::ratelimit::refusal(check.rule, &check.limit, retry_after);
                    let text = match check.message {
                        Some(m) => format!("{text}; {m}"),
                        None => text,
                    };
                    return Some(crate::error::simple_error("ERR", &text));
                }
                Err(e) => {
                    tracing::warn!(rule = %check.rule, error = %e, "shared rate limit not applied");
                }
            }
        }
        None
    }
}
