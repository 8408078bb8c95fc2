//! Who sent a command, as the rules that count per client see it.

use std::net::IpAddr;

/// Who sent a command, for rules that count per client.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    /// The proxy's id for the connection.
    pub id: u64,
    /// The client's IP address.
    pub addr: IpAddr,
    /// The client's tenant (see [`Policy::tenant_of`](super::Policy::tenant_of)); 0 is `default`.
    pub tenant: u16,
    /// The user it logged in as, as [`crate::policy::user_key`] gives it (0: no login); read
    /// only by a rule's `share_by: user`.
    pub user: u64,
    /// The command is judged again: it was judged, allowed, then paused (to wait for replies)
    /// before it could run, so its rate budget and counts are spent already; judged again it
    /// spends nothing (before, a command that paused was charged twice).
    pub again: bool,
}
