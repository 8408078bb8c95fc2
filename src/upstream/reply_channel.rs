//! The channel on which upstream connections answer a session: many senders (each
//! connection the session's batches went to), one receiver (the session's task).
//!
//! Written here rather than taken from tokio because of what it costs each client that is
//! using the proxy: tokio's unbounded channel allocates 2,080 bytes on creation (its shared
//! state, cache-padded, and a first block of 32 slots), which was 40% of the heap a client
//! holds right after a command (docs/performance.md, "Memory per idle client"); this one is a
//! mutex-guarded `VecDeque` that starts empty and grows to the replies actually in flight
//! (a few, one per batch), with the receiver's waker kept under the same lock. Each send and
//! receive takes the lock once, uncontended but for the moment a connection's reader and the
//! session meet; the receiver never allocates to wait (the allocation-per-GET test guards it).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::Reply;

/// What the senders and the receiver share.
struct Shared {
    /// The queue and the receiver's waker, under one lock so a send never misses a wait.
    inner: Mutex<Inner>,
}

/// The lock-protected part of [`Shared`].
#[derive(Default)]
struct Inner {
    /// Replies sent and not yet received, in the order they were sent.
    queue: VecDeque<Reply>,
    /// The receiver's task while it waits for a reply.
    waker: Option<Waker>,
    /// Live senders: when the last one goes, a waiting receiver learns the channel ended.
    senders: usize,
    /// The receiver is gone: sends fail (and return the reply) instead of queueing it.
    closed: bool,
}

impl Shared {
    /// The state, even if another thread panicked holding it: the queue stays consistent
    /// (every change to it is one call that cannot panic halfway).
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sending end: cloned for every batch that is to be answered on the channel.
pub(crate) struct ReplySender(Arc<Shared>);

/// The receiving end, held by the session's task.
pub(crate) struct ReplyReceiver(Arc<Shared>);

/// A new channel, empty and with nothing allocated for replies yet.
pub(crate) fn reply_channel() -> (ReplySender, ReplyReceiver) {
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            senders: 1,
            ..Inner::default()
        }),
    });
    (ReplySender(shared.clone()), ReplyReceiver(shared))
}

impl ReplySender {
    /// Queues `reply` for the receiver and wakes it; gives the reply back when the receiver
    /// is gone (its session ended).
    pub(crate) fn send(&self, reply: Reply) -> Result<(), Reply> {
        let waker = {
            let mut inner = self.0.lock();
            if inner.closed {
                return Err(reply);
            }
            inner.queue.push_back(reply);
            inner.waker.take()
        };
        // Woken outside the lock: the woken task may run at once on another thread and take
        // it.
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl Clone for ReplySender {
    fn clone(&self) -> Self {
        self.0.lock().senders += 1;
        ReplySender(self.0.clone())
    }
}

impl Drop for ReplySender {
    fn drop(&mut self) {
        let waker = {
            let mut inner = self.0.lock();
            inner.senders -= 1;
            if inner.senders == 0 {
                inner.waker.take()
            } else {
                None
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl std::fmt::Debug for ReplySender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplySender")
    }
}

impl ReplyReceiver {
    /// The next reply; `None` once every sender is gone and the queue is empty.
    pub(crate) async fn recv(&mut self) -> Option<Reply> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Reply>> {
        let mut inner = self.0.lock();
        if let Some(reply) = inner.queue.pop_front() {
            return Poll::Ready(Some(reply));
        }
        if inner.senders == 0 {
            return Poll::Ready(None);
        }
        match &mut inner.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The next reply if one is queued, without waiting.
    pub(crate) fn try_recv(&mut self) -> Option<Reply> {
        self.0.lock().queue.pop_front()
    }

    /// Whether no reply is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.lock().queue.is_empty()
    }
}

impl Drop for ReplyReceiver {
    fn drop(&mut self) {
        let queued = {
            let mut inner = self.0.lock();
            inner.closed = true;
            inner.waker = None;
            std::mem::take(&mut inner.queue)
        };
        // Dropped outside the lock: a reply may hold a push's flow-control permits, or the
        // last reference to a connection's read buffer.
        drop(queued);
    }
}

impl std::fmt::Debug for ReplyReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplyReceiver")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn push(n: u32) -> Reply {
        Reply::Push(Bytes::new(), n)
    }

    fn permits(r: Option<Reply>) -> Option<u32> {
        match r {
            Some(Reply::Push(_, n)) => Some(n),
            _ => None,
        }
    }

    #[tokio::test]
    async fn replies_arrive_in_order_and_the_end_is_seen_once_senders_are_gone() {
        let (tx, mut rx) = reply_channel();
        let tx2 = tx.clone();
        tx.send(push(1)).unwrap();
        tx2.send(push(2)).unwrap();
        assert!(!rx.is_empty());
        assert_eq!(permits(rx.try_recv()), Some(1));
        drop(tx);
        assert_eq!(permits(rx.recv().await), Some(2));
        assert!(rx.try_recv().is_none());
        drop(tx2);
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_send_from_another_task() {
        let (tx, mut rx) = reply_channel();
        let sender = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(push(7)).unwrap();
            tx
        });
        assert_eq!(permits(rx.recv().await), Some(7));
        drop(sender.await.unwrap());
        assert!(rx.recv().await.is_none());
    }

    #[test]
    fn a_send_after_the_receiver_is_gone_gives_the_reply_back() {
        let (tx, rx) = reply_channel();
        tx.send(push(1)).unwrap();
        drop(rx);
        assert_eq!(permits(tx.send(push(2)).err()), Some(2));
    }
}
