//! The channel on which upstream connections answer a session (`ReplySender`,
//! `ReplyReceiver`): many senders (each connection the session's batches went to), one
//! receiver (the session's task). Generic over what it carries, so that it depends on
//! nothing in `upstream`.
//!
//! Written here rather than taken from tokio because of what it costs each client that is
//! using the proxy: tokio's unbounded channel allocates 2,080 bytes on creation (its shared
//! state, cache-padded, and a first block of 32 slots), which was 40% of the heap a client
//! holds right after a command (docs/performance.md, "Memory per idle client"); this one is a
//! mutex-guarded `VecDeque` that starts empty and grows to the replies actually in flight
//! (a few, one per batch), with the receiver's waker kept under the same lock. Each send and
//! receive takes the lock once, uncontended but for the moment a connection's reader and the
//! session meet; a sender's clone and drop (once per batch: each batch carries one) are an
//! atomic add outside it, as in tokio's channel, but for the last sender's drop, which wakes
//! the receiver. The receiver never allocates to wait (the allocation-per-GET test guards it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// What the senders and the receiver share.
struct Shared<T> {
    /// The queue and the receiver's waker, under one lock so a send never misses a wait.
    inner: Mutex<Inner<T>>,
    /// Live senders: when the last one goes, a waiting receiver learns the channel ended.
    /// Outside the lock so that cloning and dropping a sender stay one atomic add; the last
    /// drop takes the lock to wake the receiver, so a receiver that saw a sender left and
    /// went to wait is woken to look again.
    senders: AtomicUsize,
}

/// The lock-protected part of [`Shared`].
struct Inner<T> {
    /// Messages sent and not yet received, in the order they were sent.
    queue: VecDeque<T>,
    /// The receiver's task while it waits for a message.
    waker: Option<Waker>,
    /// The receiver is gone: sends fail (and return the reply) instead of queueing it.
    closed: bool,
}

impl<T> Shared<T> {
    /// The state, even if another thread panicked holding it: the queue stays consistent
    /// (every change to it is one call that cannot panic halfway).
    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sending end: cloned for every batch that is to be answered on the channel.
pub(crate) struct Sender<T>(Arc<Shared<T>>);

/// The receiving end, held by the session's task.
pub(crate) struct Receiver<T>(Arc<Shared<T>>);

/// A new channel, empty and with nothing allocated for messages yet.
pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            queue: VecDeque::new(),
            waker: None,
            closed: false,
        }),
        senders: AtomicUsize::new(1),
    });
    (Sender(shared.clone()), Receiver(shared))
}

impl<T> Sender<T> {
    /// Queues `message` for the receiver and wakes it; gives the message back when the
    /// receiver is gone (its session ended).
    pub(crate) fn send(&self, message: T) -> Result<(), T> {
        let waker = {
            let mut inner = self.0.lock();
            if inner.closed {
                return Err(message);
            }
            inner.queue.push_back(message);
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

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.0.senders.fetch_add(1, Ordering::Relaxed);
        Sender(self.0.clone())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.0.senders.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let waker = self.0.lock().waker.take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("mailbox::Sender")
    }
}

impl<T> Receiver<T> {
    /// The next message; `None` once every sender is gone and the queue is empty.
    pub(crate) async fn recv(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut inner = self.0.lock();
        if let Some(message) = inner.queue.pop_front() {
            return Poll::Ready(Some(message));
        }
        if self.0.senders.load(Ordering::Acquire) == 0 {
            return Poll::Ready(None);
        }
        match &mut inner.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The next message if one is queued, without waiting.
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        self.0.lock().queue.pop_front()
    }

    /// Whether no message is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.lock().queue.is_empty()
    }
}

impl<T> Drop for Receiver<T> {
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

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("mailbox::Receiver")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replies_arrive_in_order_and_the_end_is_seen_once_senders_are_gone() {
        let (tx, mut rx) = channel();
        let tx2 = tx.clone();
        tx.send(1).unwrap();
        tx2.send(2).unwrap();
        assert!(!rx.is_empty());
        assert_eq!(rx.try_recv(), Some(1));
        drop(tx);
        assert_eq!(rx.recv().await, Some(2));
        assert!(rx.try_recv().is_none());
        drop(tx2);
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_send_from_another_task() {
        let (tx, mut rx) = channel();
        let sender = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(7).unwrap();
            tx
        });
        assert_eq!(rx.recv().await, Some(7));
        drop(sender.await.unwrap());
        assert!(rx.recv().await.is_none());
    }

    #[test]
    fn a_send_after_the_receiver_is_gone_gives_the_reply_back() {
        let (tx, rx) = channel();
        tx.send(1).unwrap();
        drop(rx);
        assert_eq!(tx.send(2).err(), Some(2));
    }
}
