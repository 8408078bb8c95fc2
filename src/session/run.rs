//! A run of consecutive commands forwarded together (`Run`).

use super::conn::Target;
use crate::commands::CommandSpec;
use bytes::BytesMut;

/// A run of consecutive commands forwarded together: the first `len` bytes of the read buffer,
/// sent as they are (zero copy) or, once the policy rewrote one of them, copied into `owned`.
#[derive(Default)]
pub(super) struct Run {
    /// Bytes of the read buffer the run has consumed.
    pub(super) len: usize,
    /// Reply frames the run's bytes produce (client commands plus hidden ones).
    pub(super) frames: u32,
    /// The connection the run goes to; `None` while empty.
    pub(super) target: Option<Target>,
    /// The bytes to send when they differ from the read buffer (a rewritten command).
    pub(super) owned: Option<BytesMut>,
    /// Which frames the client sees, once a hidden command joined the run.
    pub(super) mask: Option<Vec<bool>>,
    /// The run's first command, for the slow log.
    pub(super) first: Option<&'static CommandSpec>,
    /// Cluster mode: the hash slots of the run's keyed commands, for `Sent::hash_slots`.
    pub(super) hash_slots: Vec<u16>,
    /// Cluster mode, once parked (see `scatter`): the batch's `seq`, taken when its first
    /// segment got its slot.
    pub(super) seq: Option<u16>,
    /// Where its first segment's slot is in `Session::slots` (stable while runs are
    /// pending: nothing leaves the reply order during `process`).
    pub(super) head: Option<usize>,
    /// Frames already given a segment slot.
    pub(super) cut: u32,
}
