//! Where a pool's node is: a fixed `host:port`, or the primary Sentinel names, which moves on
//! failover. Connections read it only when they (re)connect and, for a followed address, stop
//! when it moves; nothing here is on the per-command path.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;

/// A moving node's address as last published (in sentinel mode, by `sentinel::follow_primary`:
/// the primary of the moment). Defined here so that connections depend on an address and
/// its epoch, not on whoever finds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrEpoch {
    /// `host:port` to connect to.
    pub addr: Arc<str>,
    /// How many times the address has changed since the first one; a WAIT compares epochs to
    /// know whether the writes it would cover may have gone to a previous node.
    pub epoch: u64,
}

/// A future that resolves, with the reason, when a connection must be given up although it
/// still works (its node is no longer the one the pool should talk to).
pub(crate) type Stop = Pin<Box<dyn Future<Output = String> + Send>>;

/// The address a pool connects to.
#[derive(Clone)]
pub enum Address {
    /// Standalone and cluster nodes: never changes.
    Fixed(Arc<str>),
    /// Sentinel mode: the primary as published by `sentinel::follow_primary`.
    Followed {
        /// The latest primary; `None` until a sentinel has named one.
        primary: watch::Receiver<Option<AddrEpoch>>,
        /// Names the node in messages while no primary is known (`sentinel:<master_name>`).
        label: Arc<str>,
    },
}

impl Address {
    /// The address to connect to now; `None` while no sentinel has named a primary. Marks the
    /// value seen, so [`Address::changed`] waits for the next one.
    pub(crate) fn current(&mut self) -> Option<Arc<str>> {
        match self {
            Address::Fixed(addr) => Some(addr.clone()),
            Address::Followed { primary, .. } => {
                primary.borrow_and_update().as_ref().map(|p| p.addr.clone())
            }
        }
    }

    /// The node's name for messages and INFO: its current address, else the label.
    pub(crate) fn name(&self) -> Arc<str> {
        match self {
            Address::Fixed(addr) => addr.clone(),
            Address::Followed { primary, label } => primary
                .borrow()
                .as_ref()
                .map_or_else(|| label.clone(), |p| p.addr.clone()),
        }
    }

    /// How many times the address has moved (always 0 when fixed).
    pub(crate) fn epoch(&self) -> u64 {
        match self {
            Address::Fixed(_) => 0,
            Address::Followed { primary, .. } => primary.borrow().as_ref().map_or(0, |p| p.epoch),
        }
    }

    /// Resolves at the next published address; never for a fixed one (or once the publisher
    /// is gone), so it can sit in a `select!` unconditionally.
    pub(crate) async fn changed(&mut self) {
        match self {
            Address::Fixed(_) => std::future::pending().await,
            Address::Followed { primary, .. } => {
                if primary.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// For a connection opened to `to`: a future that resolves once the address is something
    /// else (including right away, if it already is). `None` for a fixed address, so a
    /// standalone connection has no extra branch to poll.
    pub(crate) fn moved_from(&self, to: &Arc<str>) -> Option<Stop> {
        let Address::Followed { primary, .. } = self else {
            return None;
        };
        let mut primary = primary.clone();
        let to = to.clone();
        Some(Box::pin(async move {
            loop {
                if let Some(now) = primary.borrow_and_update().as_ref() {
                    if now.addr != to {
                        return format!("primary moved from {to} to {}", now.addr);
                    }
                }
                if primary.changed().await.is_err() {
                    // The follower is gone (proxy stopping): the address will not move again.
                    return std::future::pending().await;
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn primary(addr: &str, epoch: u64) -> Option<AddrEpoch> {
        Some(AddrEpoch {
            addr: addr.into(),
            epoch,
        })
    }

    #[tokio::test]
    async fn a_followed_address_stops_connections_to_the_old_primary() {
        let (tx, rx) = watch::channel(None);
        let mut address = Address::Followed {
            primary: rx,
            label: "sentinel:m".into(),
        };
        assert_eq!(address.current(), None);
        assert_eq!(&*address.name(), "sentinel:m");
        tx.send_replace(primary("a:1", 0));
        let a = address.current().unwrap();
        let mut stop = address.moved_from(&a).unwrap();
        assert!(futures_poll(&mut stop).is_none(), "still on a:1");
        tx.send_replace(primary("b:2", 1));
        assert_eq!(address.epoch(), 1);
        assert_eq!(&*address.name(), "b:2");
        let reason = futures_poll(&mut stop).expect("moved");
        assert_eq!(reason, "primary moved from a:1 to b:2");
        // Created after the move: resolves at once.
        let mut late = address.moved_from(&a).unwrap();
        assert!(futures_poll(&mut late).is_some());
    }

    #[test]
    fn a_fixed_address_never_moves() {
        let address = Address::Fixed("h:1".into());
        assert!(address.moved_from(&"h:1".into()).is_none());
        assert_eq!(address.epoch(), 0);
    }

    /// Polls once without a runtime-driven wake-up.
    fn futures_poll(stop: &mut Stop) -> Option<String> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match stop.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => Some(r),
            std::task::Poll::Pending => None,
        }
    }
}
