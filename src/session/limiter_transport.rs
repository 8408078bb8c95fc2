//! The proxy's [`Transport`]: the upstream's control connection, whose raw replies decode
//! into [`Frame`]s here. In the session, which hands it to the policy's Redis-counted rate
//! limits, so neither `upstream` knows of rate limiting nor `ratelimit` (and the policy
//! behind it) of upstream connections.

use crate::policy::ratelimit::redis::{Frame, Transport};
use crate::protocol::error::UpstreamError;
use crate::upstream::pool::Control;

impl Transport for Control {
    type Error = UpstreamError;

    async fn call(&self, args: &[&[u8]]) -> Result<Frame, UpstreamError> {
        let reply = self.request(args).await?;
        Frame::from_resp(&reply).map_err(|e| UpstreamError::Lost {
            addr: "control".into(),
            reason: e.to_string().into(),
        })
    }
}
