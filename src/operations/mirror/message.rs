//! What a session tells the mirror's task over its queue, and which clients lost a batch on the way.

use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

/// What a session tells the mirror.
pub(super) enum Message {
    /// A batch the primary answered: the commands as sent and the replies as received.
    Answered {
        client: u64,
        proto: u8,
        commands: Bytes,
        replies: Bytes,
    },
    /// The client is gone: forget its database and open transaction.
    Gone(u64),
    /// Answered once everything queued before it was sent and the mirror replied to it
    /// (a cutover waits for it before the mirror becomes the primary).
    Flush(tokio::sync::oneshot::Sender<()>),
}

impl Message {
    /// Bytes it holds, against `max_queue_bytes`.
    pub(super) fn size(&self) -> usize {
        match self {
            Message::Answered {
                commands, replies, ..
            } => commands.len() + replies.len(),
            Message::Gone(_) | Message::Flush(_) => 0,
        }
    }
}

/// Clients a batch of which was dropped before the mirror's task got it: the task stops
/// mirroring them, as their database and transaction state are unknown from then on.
#[derive(Default)]
pub(crate) struct Lost {
    /// Whether `clients` holds any (one relaxed load per batch in the task otherwise).
    any: AtomicBool,
    /// The clients.
    clients: std::sync::Mutex<std::collections::HashSet<u64>>,
}

impl Lost {
    /// Notes that a batch of `client` was dropped.
    pub(super) fn add(&self, client: u64) {
        if let Ok(mut clients) = self.clients.lock() {
            clients.insert(client);
            self.any.store(true, Ordering::Relaxed);
        }
    }

    /// Whether any client was noted since the last `take` (one relaxed load).
    pub(super) fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// The clients noted since the last call.
    pub(super) fn take(&self) -> Vec<u64> {
        let Ok(mut clients) = self.clients.lock() else {
            return Vec::new();
        };
        self.any.store(false, Ordering::Relaxed);
        clients.drain().collect()
    }
}
