//! Request bytes read from the client and not yet dispatched (`Input`).

use bytes::BytesMut;
use std::ops::Range;
use tokio::time::Instant;

/// Read buffer headroom requested before each read once a client's reads have filled the
/// buffer (it pipelines or sends large values).
pub(super) const READ_CHUNK: usize = 16 * 1024;

/// Read buffer headroom of a client whose reads have all fitted so far. A 16 KiB buffer that
/// receives one small command touches a whole 4 KiB page of it: with every client's first
/// read at this size, 5,000 clients that each sent a command hold 1 KiB each instead
/// (docs/performance.md, Memory per idle client).
pub(super) const FIRST_READ: usize = 1024;

/// Request bytes read from the client and not yet dispatched, and whether to read more.
pub(super) struct Input {
    /// Unparsed request bytes.
    pub(super) rbuf: BytesMut,
    /// A read filled the buffer: the client pipelines or sends large values, so reads ask for
    /// `READ_CHUNK` from now on instead of `FIRST_READ` (until the idle release).
    pub(super) big_reads: bool,
    /// Argument ranges of the command being classified, reused to avoid allocation.
    pub(super) args: Vec<Range<usize>>,
    /// When the bytes being processed were read: the start of client-observed latency.
    pub(super) read_at: Instant,
    /// No more requests are read; the session ends when replies are written.
    pub(super) closing: bool,
    /// A CLIENT KILL named the client: the session ends at once, unanswered commands and
    /// all, as Redis frees a killed client.
    pub(super) killed: bool,
    /// Request processing paused until in-flight commands on the other target are answered.
    pub(super) paused: bool,
    /// The command processing paused at (first in the read buffer then) was judged by the
    /// policy already: decided again, it spends no rate budget and no count a second time
    /// (`policy::Client::again`). Set by `pause_decided`, taken by the next decision.
    pub(super) judged: bool,
    /// Traffic since the last idle tick: only a session quiet for a whole tick releases its
    /// memory, so a busy client never pays for re-creating its reply channel.
    pub(super) active: bool,
}
