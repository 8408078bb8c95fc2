//! Drop-in fidelity where Redis's own test suite found the proxy differing from Redis (issue
//! 14): each test replays, against a real redis-server, what a unit of the Tcl suite does, and
//! compares with the same conversation held directly with Redis where the bytes are comparable.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::*;

/// `UNSUBSCRIBE a b c` from a client that never subscribed: Redis confirms each channel (count
/// 0); the proxy once answered the first frame only and the client waited for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsubscribe_without_subscriptions_confirms_every_channel() {
    let pair = Pair::start().await;
    for resp3 in [false, true] {
        let hello: &[u8] = if resp3 { b"HELLO 3\r\n" } else { b"" };
        let steps = [
            step(0, hello, usize::from(resp3)),
            step(0, b"UNSUBSCRIBE foo bar quux\r\n", 3),
            step(0, b"PUNSUBSCRIBE foo.* bar.*\r\n", 2),
            step(0, b"SUNSUBSCRIBE a b c d\r\n", 4),
            // The reply after them is its own, not a stray confirmation.
            step(0, b"PING\r\n", 1),
            step(0, b"UNSUBSCRIBE\r\nPUNSUBSCRIBE\r\nSUNSUBSCRIBE\r\nPING\r\n", 4),
        ];
        pair.compare_steps(&steps).await;
    }
}
