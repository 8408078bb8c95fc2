//! Cluster mode: one batch per node for a pipeline whose commands alternate between nodes.
//!
//! A run (commands for one shared connection) is normally cut when the next command goes
//! elsewhere. In cluster mode that would make a batch, a channel message and a reply of one
//! or two commands at nearly every command of a pipeline over random keys. Instead the run
//! is *parked*: its bytes so far are copied out of the read buffer, and the commands it holds
//! get their reply position now, as a segment slot; the next command joins the run of its
//! own connection. When the runs are sent, each is one batch, and its reply is cut back into
//! its segments by frame count (`on_parts`).
//!
//! Segments never carry a mask (hidden reply frames): a command with hidden frames ends the
//! scatter (every run is sent first).

use bytes::{Bytes, BytesMut};

use super::cluster::ClusterSession;
use super::conn::Target;
use super::queue::observe;
use super::reply_queue::{Handling, ReplyQueue, Slot};
use super::run::Run;
use crate::protocol::error::{ProxyError, UpstreamError, error_reply};
use bytes::Buf;
use tokio::time::Instant;

/// Whether a command for `target` may leave the current run parked instead of sending it
/// (asked through `Routing::may_scatter`, in cluster mode only).
pub(super) fn may_scatter(run: &Run, target: Target, hidden: bool) -> bool {
    !hidden
        && run.mask.is_none()
        && matches!(
            (run.target, target),
            (Some(Target::Shared(..)), Target::Shared(..))
        )
}

/// Gives the run's commands not yet in a segment their reply position: a slot at the end of
/// the reply order, answered by the run's batch once sent; `read_at` is when they were read.
pub(super) fn cut_segment(queue: &mut ReplyQueue, run: &mut Run, read_at: Instant) {
    let commands = run.frames - run.cut;
    if commands == 0 {
        return;
    }
    let seq = *run.seq.get_or_insert_with(|| {
        let seq = queue.next_seq;
        queue.next_seq = seq.wrapping_add(1);
        seq
    });
    let first = match run.head {
        Some(head) => {
            if let Some(Slot::Upstream { parts, .. }) = queue.slots.get_mut(head) {
                *parts += 1;
            }
            false
        }
        None => {
            run.head = Some(queue.slots.len());
            true
        }
    };
    queue.queued += 1;
    queue.slots.push_back(Slot::Upstream {
        commands,
        handling: Handling {
            name: if first { run.first } else { None },
            ..Handling::default()
        },
        read_at,
        sent: None,
        seq,
        parts: u16::from(first),
    });
    run.cut = run.frames;
}

impl ClusterSession<'_> {
    /// Parks the current run and makes the run for `target` current (parked before, or new).
    pub(super) fn switch_run(&mut self, run: &mut Run, target: Target) {
        let c = &mut *self.cluster;
        let next = match c.parked.iter().position(|r| r.target == Some(target)) {
            Some(i) => c.parked.swap_remove(i),
            None => Run::default(),
        };
        c.parked_frames -= next.frames as usize;
        let mut current = std::mem::replace(run, next);
        // The run's bytes leave the read buffer now: the next commands belong to others.
        if current.owned.is_none() {
            // Room for the rest of what was read (the run's later commands are in it), up
            // to a read's worth more: the run's commands are appended without a growth per
            // doubling (cluster `-P 16`: 0.4 reallocations per request).
            let room = self
                .input
                .rbuf
                .len()
                .min(current.len + super::input::READ_CHUNK);
            let mut owned = BytesMut::with_capacity(room);
            owned.extend_from_slice(&self.input.rbuf[..current.len]);
            current.owned = Some(owned);
        }
        self.input.rbuf.advance(current.len);
        current.len = 0;
        cut_segment(self.queue, &mut current, self.input.read_at);
        self.cluster.parked_frames += current.frames as usize;
        self.cluster.parked.push(current);
    }

    /// The reply of a batch whose commands sit in several segments (`parts` > 1 on the slot
    /// at `at`): each segment gets its frames, and errors for those the upstream never
    /// answered.
    pub(super) fn on_parts(
        &mut self,
        at: usize,
        mut data: Bytes,
        missing: u32,
        error: Option<Box<UpstreamError>>,
    ) {
        let Some(Slot::Upstream {
            commands,
            parts,
            read_at,
            sent,
            seq,
            handling,
        }) = self
            .queue
            .slots
            .get_mut(at)
            .map(|s| std::mem::replace(s, Slot::Local(Bytes::new())))
        else {
            return;
        };
        // Its other segments are the later slots with its `seq`, found as they are needed
        // rather than collected: a vector here was a third of cluster mode's allocations at
        // `-P 16`.
        let mut total = commands;
        let mut from = at;
        for _ in 1..parts {
            let Some((i, n)) = next_segment(&self.queue.slots, from, seq) else {
                break;
            };
            total += n;
            from = i;
        }
        if let Some(capture) = handling.mirror {
            capture.answered(self.client.id, data.clone(), total);
        }
        self.queue.inflight -= total as usize;
        if self.queue.inflight == 0 {
            self.queue.inflight_target = None;
        }
        if let Some(sent) = sent {
            self.cluster.finished(sent);
        }
        if error.is_some() {
            self.cluster.router.refresh_soon();
        }
        observe(
            &self.ctx.ops,
            self.client.peer,
            read_at,
            total,
            handling.name,
        );
        let mut answered = total.saturating_sub(missing);
        let failed = error.map(|e| error_reply(&ProxyError::Upstream(*e)));
        let mut segment = Some((at, commands));
        for left in (0..parts).rev() {
            let Some((i, commands)) = segment else {
                break;
            };
            segment = match left {
                0 => None,
                _ => next_segment(&self.queue.slots, i, seq),
            };
            let frames = commands.min(answered);
            answered -= frames;
            // The last segment's frames are all that is left: the upstream hands over whole
            // frames only, the answered ones (not scanned a second time).
            let len = match left {
                0 => data.len(),
                _ => frames_len(&data, frames),
            };
            let mut reply = data.split_to(len);
            if let (Some(e), true) = (&failed, frames < commands) {
                let mut with_errors = BytesMut::from(&reply[..]);
                for _ in frames..commands {
                    with_errors.extend_from_slice(e);
                }
                reply = with_errors.freeze();
            }
            self.queue.slots[i] = Slot::Local(reply);
        }
        if at == 0 {
            self.queue.out_read = Some(read_at);
        }
        self.queue.flush_local_slots();
    }
}

/// The next slot after `from` holding a segment of the batch `seq`, and its command count.
fn next_segment(
    slots: &std::collections::VecDeque<Slot>,
    from: usize,
    seq: u16,
) -> Option<(usize, u32)> {
    slots
        .iter()
        .enumerate()
        .skip(from + 1)
        .find_map(|(i, slot)| match slot {
            Slot::Upstream {
                commands, seq: s, ..
            } if *s == seq => Some((i, *commands)),
            _ => None,
        })
}

/// Bytes of the first `frames` reply frames in `data` (all of it if they are not all there).
fn frames_len(data: &[u8], frames: u32) -> usize {
    let mut pos = 0;
    for _ in 0..frames {
        match crate::protocol::reply::scan(&data[pos..]) {
            Ok(Some(len)) => pos += len,
            _ => return data.len(),
        }
    }
    pos
}
