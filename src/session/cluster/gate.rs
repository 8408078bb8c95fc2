//! A per-node connection's pushes passed to the session only while a gate the session
//! holds admits them (keyspace notifications, MONITOR lines).

use std::sync::Arc;

/// A per-node connection's push target (keyspace notifications, MONITOR): `push` behind a
/// task that passes a push only while `admits(gate, frame)`, judged and sent under the gate's
/// lock, so a change the session makes to the gate is seen either before a push is judged or
/// after it is in the session's channel; the push budget of what it drops is given back. The
/// connection's end passes; the proxy's own subscriptions (`Reply::Subscriptions`) have
/// nowhere to move and are dropped.
pub(super) fn gated<T: Send + 'static>(
    push: crate::upstream::conn::PushTarget,
    gate: Arc<std::sync::Mutex<T>>,
    admits: fn(&T, &[u8]) -> bool,
) -> crate::upstream::conn::PushTarget {
    use crate::upstream::Reply;
    let (tx, mut rx) = crate::upstream::reply_channel();
    let to = push.to.clone();
    let budget = push.budget.clone();
    tokio::spawn(async move {
        while let Some(reply) = rx.recv().await {
            match reply {
                Reply::Push(frame, permits, conn) => {
                    // A poisoned lock still holds a consistent gate (each change is one
                    // assignment or set operation).
                    let gate = gate.lock().unwrap_or_else(|e| e.into_inner());
                    if !admits(&gate, &frame) {
                        budget.add_permits(permits as usize);
                    } else if to.send(Reply::Push(frame, permits, conn)).is_err() {
                        return;
                    }
                }
                Reply::Subscriptions(..) => {}
                other => {
                    if to.send(other).is_err() {
                        return;
                    }
                }
            }
        }
    });
    crate::upstream::conn::PushTarget { to: tx, ..push }
}
