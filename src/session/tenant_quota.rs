//! Each tenant's share of the dedicated upstream connections (`upstream.dedicated_caps`).
//! The node's own cap (`upstream.dedicated_max`, `upstream::dedicated`) bounds them all;
//! without a share per tenant, one tenant's clients blocked in BLPOP or SUBSCRIBE could hold
//! every one of them, and another tenant's MULTI, BLPOP and SUBSCRIBE would fail (issue 26).
//! A session holds a [`Share`] beside its dedicated connection and gives it back with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

/// Dedicated connections held per tenant, against each tenant's limit.
#[derive(Default)]
pub(crate) struct TenantQuota {
    /// Connections held now, by tenant index.
    held: Mutex<HashMap<u16, usize>>,
    /// Wakes sessions waiting for their tenant's share: one was given back.
    freed: Notify,
}

/// One dedicated connection counted against a tenant until dropped.
pub(crate) struct Share {
    /// The quota it is counted in.
    quota: Arc<TenantQuota>,
    /// The tenant it is counted for (the client's tenant when it took it).
    tenant: u16,
}

impl TenantQuota {
    /// A share for `tenant`, whose limit is `limit`: at once when one is free, else the
    /// first one given back within `wait`; `None` when none was.
    pub(crate) async fn take(
        self: &Arc<Self>,
        tenant: u16,
        limit: usize,
        wait: Duration,
    ) -> Option<Share> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before looking, so a share given back in between is not missed.
            let freed = self.freed.notified();
            if self.try_take(tenant, limit) {
                return Some(Share {
                    quota: self.clone(),
                    tenant,
                });
            }
            tokio::select! {
                () = freed => {}
                () = tokio::time::sleep_until(deadline) => return None,
            }
        }
    }

    /// Counts one more for `tenant` if it is under `limit`.
    fn try_take(&self, tenant: u16, limit: usize) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let n = held.entry(tenant).or_insert(0);
        if *n >= limit {
            return false;
        }
        *n += 1;
        true
    }

    #[cfg(test)]
    /// Connections `tenant` holds now.
    pub(crate) fn held(&self, tenant: u16) -> usize {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(&tenant).copied().unwrap_or(0)
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        {
            let mut held = self
                .quota
                .held
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = held.get_mut(&self.tenant) {
                *n = n.saturating_sub(1);
            }
        }
        self.quota.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tenant_at_its_limit_waits_for_its_own_share_only() {
        let quota = Arc::new(TenantQuota::default());
        let wait = Duration::from_millis(100);
        let a1 = quota.take(1, 2, wait).await.unwrap();
        let _a2 = quota.take(1, 2, wait).await.unwrap();
        assert!(quota.take(1, 2, wait).await.is_none(), "over the limit");
        assert!(quota.take(2, 2, wait).await.is_some(), "another tenant");
        let waiting = tokio::spawn({
            let quota = quota.clone();
            async move { quota.take(1, 2, Duration::from_secs(5)).await }
        });
        tokio::task::yield_now().await;
        drop(a1);
        let taken = waiting.await.unwrap();
        assert!(taken.is_some(), "a share given back goes to a waiter");
        assert_eq!(quota.held(1), 2);
        drop(taken);
        assert_eq!(quota.held(1), 1);
    }
}
