//! The audit trail: who ran what. Sessions describe each audited command (`Audit::entry`)
//! once its outcome is known and hand it over (`Audit::record`) through a bounded queue to
//! the writer thread (`writer`), which writes JSON lines. A full queue drops the entry and
//! counts it; a client's command never waits for the audit trail.
//!
//! Cost: off (the default), `Ops::audit` is `None` and a session pays one branch per
//! command. On, an audited command costs its entry (a few small allocations: names and
//! sizes, never values) and one non-blocking channel send.

pub mod entry;
mod recorder;
pub(crate) mod trail;
pub(crate) mod writer;

pub use entry::{Arg, Entry, Outcome};
pub(crate) use recorder::{Audit, key_indices, now_ts, open_output, probe_output};
pub(crate) use trail::Trail;
