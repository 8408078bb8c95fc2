//! The wire: what clients and servers say, and what the proxy says itself.
//!
//! - [`codec`]: request framing with limits checked before buffering (RESP multibulk and
//!   inline), Redis's protocol errors.
//! - [`reply`]: cheap scanner for RESP2/RESP3 reply boundaries, pub/sub frame classification.
//! - [`resp_value`]: the one bounded decoder of replies the proxy reads itself (topology,
//!   Sentinel, rate-limit scripts), `redis-protocol` behind depth and completeness checks.
//! - [`error`]: every error, tagged with the side that failed, and the one mapping to replies;
//!   [`answers`]: every reply the proxy makes itself, as named constructors.
//! - [`pem`]: the PEM certificates, keys and CA roots both TLS sides load.
//! - [`double_text`]: doubles as each server writes and reads them, for scores the proxy
//!   computes.

pub(crate) mod answers;
pub mod codec;
pub(crate) mod double_text;
pub(crate) mod error;
pub(crate) mod find;
pub(crate) mod pem;
pub mod reply;
pub(crate) mod resp_value;
