//! The shared backend: the same two-window estimate, run atomically on Redis by
//! `lua/sliding_window.lua`, so every proxy replica pointed at one Redis draws on one budget.
//!
//! # Protocol
//!
//! One round trip per check: `EVALSHA <sha1> 1 <prefix><key> <N> <W ms> [<now ms>]`. The SHA-1
//! of the script is computed once per process ([`script_sha1`]). If Redis answers `NOSCRIPT`
//! (after a restart, a failover or `SCRIPT FLUSH`), the same call is sent once more as `EVAL`
//! with the script's text, which runs it and caches it again on that server; later checks are
//! back to EVALSHA. The retry is safe: NOSCRIPT means nothing ran.
//!
//! The state is one small hash per limited key (`w`, `c`, `p`), with a TTL of two windows
//! refreshed on every allowed request: a key that stops sending disappears by itself.
//!
//! # Whose clock
//!
//! By default the script reads the Redis server's `TIME`: one clock for all replicas, so their
//! skew cannot bend the windows, and nothing depends on the proxies' clocks. The cost is that
//! tests cannot move that time; [`RedisLimiter::with_client_clock`] passes the proxy's time as
//! an argument instead, which tests use to replay exact sequences. In production that mode
//! needs clocks that agree across replicas (Unix time, NTP-synchronised): a replica whose clock
//! is ahead by `s` moves to the next window `s` early and weighs the previous window by up to
//! `s / W` less, so the shared limit loosens by about `N · s / W`; a replica whose clock is
//! behind the stored window is read at the stored window's start, the strictest point.
//!
//! # Decoupling
//!
//! The limiter sends through a [`Transport`]: one command in, one decoded [`Frame`] out. The
//! proxy implements it on its upstream control connections (`session::limiter_transport`; raw
//! reply bytes decode with [`Frame::from_resp`]); the tests implement it with the `redis`
//! crate.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use super::{Clock, Decision, Limit, RateLimitError};

/// The script's text, exactly as sent with EVAL and hashed for EVALSHA.
pub const SCRIPT: &str = include_str!("../../../lua/sliding_window.lua");

/// The hex SHA-1 of [`SCRIPT`], the name Redis caches it under; computed once per process.
pub fn script_sha1() -> &'static str {
    static SHA1: LazyLock<String> =
        LazyLock::new(|| sha1_smol::Sha1::from(SCRIPT).digest().to_string());
    &SHA1
}

/// A reply from Redis as the [`Transport`] hands it over: the crate's one control-plane
/// value ([`crate::protocol::resp_value::Value`]), under the name this module's users know.
pub use crate::protocol::resp_value::Value as Frame;

/// How the limiter reaches Redis: send one command, get its reply.
///
/// A trait rather than the proxy's upstream types, so this module does not depend on how
/// connections are pooled. The implementation must send the command on a connection in a
/// normal state (not inside a client's MULTI, not subscribed), and, for a Redis Cluster, to
/// the node owning the slot of `args[3]` (the script's one key).
pub trait Transport: Send + Sync {
    /// Why a command got no reply: connection refused, lost, timed out.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Sends `args` as one command (a RESP array of bulk strings) and returns its reply. An
    /// error reply from Redis is `Ok(Frame::Error(..))`, not `Err`: the limiter handles
    /// NOSCRIPT itself.
    fn call(&self, args: &[&[u8]]) -> impl Future<Output = Result<Frame, Self::Error>> + Send;
}

/// A sliding-window limiter whose counts live in Redis, shared by every proxy replica that
/// uses the same Redis, key prefix and limit.
pub struct RedisLimiter<T> {
    /// Sends the script's commands to Redis.
    transport: T,
    /// Prepended to each caller key to form the Redis key, e.g. `rpp:rl:<rule id>:`, so that
    /// rules (and anything else in that Redis) never share a key.
    prefix: Box<[u8]>,
    /// The limit as configured, for [`RedisLimiter::limit`] and refusal messages.
    limit: Limit,
    /// `N` formatted once as the script's ARGV[1].
    requests_arg: Box<[u8]>,
    /// `W` in milliseconds formatted once as the script's ARGV[2].
    window_arg: Box<[u8]>,
    /// `None`: the script reads the server's TIME (the default). `Some`: this clock's reading
    /// is passed as ARGV[3] (see the module docs for the trade-off).
    clock: Option<Arc<dyn Clock>>,
}

impl<T> fmt::Debug for RedisLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("limit", &self.limit)
            .field("client_clock", &self.clock.is_some())
            .finish_non_exhaustive()
    }
}

impl<T: Transport> RedisLimiter<T> {
    /// A limiter enforcing `limit` on the Redis behind `transport`, keys named
    /// `prefix` + caller key, timed by the server's clock. Fails if the limit is invalid (see
    /// [`Limit::validate`]). Sends nothing until the first check.
    pub fn new(transport: T, prefix: &[u8], limit: Limit) -> Result<Self, RateLimitError> {
        limit.validate()?;
        let params = limit.params();
        Ok(RedisLimiter {
            transport,
            prefix: prefix.into(),
            limit,
            requests_arg: params.requests.to_string().into_bytes().into(),
            window_arg: params.window_ms.to_string().into_bytes().into(),
            clock: None,
        })
    }

    /// Times windows with `clock` (milliseconds since the Unix epoch, or any epoch every
    /// replica sharing the keys agrees on) instead of the server's TIME. For tests and
    /// replays; see the module docs for what clock skew between replicas does.
    pub fn with_client_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Decides one request for `key`, counting it if allowed: one EVALSHA round trip (two
    /// after a NOSCRIPT). An error means no decision: the policy engine applies the rule's
    /// fail-open or fail-closed choice.
    pub async fn check(&self, key: &[u8]) -> Result<Decision, RateLimitError> {
        let mut redis_key = Vec::with_capacity(self.prefix.len() + key.len());
        redis_key.extend_from_slice(&self.prefix);
        redis_key.extend_from_slice(key);
        let now = self.clock.as_ref().map(|c| c.now_ms().to_string());
        let mut args: [&[u8]; 7] = [
            b"EVALSHA",
            script_sha1().as_bytes(),
            b"1",
            &redis_key,
            &self.requests_arg,
            &self.window_arg,
            now.as_deref().unwrap_or_default().as_bytes(),
        ];
        let argc = if now.is_some() { 7 } else { 6 };

        let mut reply = self.send(&args[..argc]).await?;
        if matches!(&reply, Frame::Error(e) if e.starts_with("NOSCRIPT")) {
            args[0] = b"EVAL";
            args[1] = SCRIPT.as_bytes();
            reply = self.send(&args[..argc]).await?;
        }
        decision(reply)
    }

    async fn send(&self, args: &[&[u8]]) -> Result<Frame, RateLimitError> {
        self.transport
            .call(args)
            .await
            .map_err(|e| RateLimitError::Transport(Box::new(e)))
    }
}

/// The script's reply as a decision: `{1, remaining}` or `{0, retry_after_ms}`.
fn decision(reply: Frame) -> Result<Decision, RateLimitError> {
    match reply {
        Frame::Array(items) => match items.as_slice() {
            [Frame::Integer(1), Frame::Integer(remaining)] => Ok(Decision::Allowed {
                remaining: (*remaining).clamp(0, i64::from(u32::MAX)) as u32,
            }),
            [Frame::Integer(0), Frame::Integer(ms)] if *ms > 0 => Ok(Decision::Limited {
                retry_after: Duration::from_millis(*ms as u64),
            }),
            _ => Err(RateLimitError::UnexpectedReply(format!("{items:?}"))),
        },
        Frame::Error(e) => Err(RateLimitError::Script(e)),
        other => Err(RateLimitError::UnexpectedReply(format!("{other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_is_the_scripts() {
        let sha = script_sha1();
        assert_eq!(sha.len(), 40);
        assert!(sha.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(
            sha1_smol::Sha1::from("return 1").digest().to_string(),
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
    }

    #[test]
    fn maps_script_replies_to_decisions() {
        let pair = |a, b| Frame::Array(vec![Frame::Integer(a), Frame::Integer(b)]);
        assert_eq!(
            decision(pair(1, 7)).unwrap(),
            Decision::Allowed { remaining: 7 }
        );
        assert_eq!(
            decision(pair(0, 1800)).unwrap(),
            Decision::Limited {
                retry_after: Duration::from_millis(1800)
            }
        );
        assert!(matches!(
            decision(Frame::Error("WRONGTYPE x".into())),
            Err(RateLimitError::Script(e)) if e == "WRONGTYPE x"
        ));
        assert!(matches!(
            decision(pair(0, 0)),
            Err(RateLimitError::UnexpectedReply(_))
        ));
        assert!(matches!(
            decision(Frame::Nil),
            Err(RateLimitError::UnexpectedReply(_))
        ));
    }
}
