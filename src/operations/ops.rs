//! What the proxy shares with its operators' tools (metrics, the slow log, the policy reload),
//! made once by the entry layer and handed to every session. Its own module so the session
//! can hold it without importing the server that starts sessions.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::observe::metrics::Metrics;
use crate::observe::slowlog::SlowLog;
use crate::policy::Policy;

/// The policy's counters as the metrics read them: the glue between `metrics` (which knows no
/// policy) and `policy` (which counts in the metrics' handles), here where both meet.
impl crate::observe::metrics::PolicyCounters for Policy {
    fn version(&self) -> &str {
        Policy::version(self)
    }

    fn for_each_counter(&self, f: &mut dyn FnMut(&str, &str, &str, u64)) {
        Policy::for_each_counter(self, |rule, tenant, outcome, n| {
            f(rule, tenant, outcome.name(), n)
        });
    }
}

/// Reloads the policy file and swaps it in: `Ok` with the new version, `Err` with every
/// problem (the running policy stays). Provided by whoever knows the file (`main`).
pub type Reload = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// What the proxy shares with its operators' tools: metrics, the slow log, and the reload
/// behind `PROXY RELOAD`.
#[derive(Clone)]
pub struct Ops {
    /// Every counter and histogram, rendered by the admin endpoint.
    pub metrics: Arc<Metrics>,
    /// Slow batches, for `PROXY SLOWLOG`.
    pub(crate) slowlog: Arc<SlowLog>,
    /// `None` when the configuration did not come from a file.
    pub reload: Option<Reload>,
    /// The audit trail (`audit.commands`); `None` when off, so sessions pay one branch.
    /// Started by `server::serve`, which reports an output it cannot open.
    pub(crate) audit: Option<Arc<crate::observe::audit::Audit>>,
    /// The key-pattern statistics (`keyspace.sample`); `None` when off. Started by
    /// `server::serve`, like `audit`.
    pub(crate) keyspace: Option<Arc<crate::observe::keyspace::Keyspace>>,
    /// The mirror of a migration (`mirror:`), started by `server::serve` and replaced on
    /// reload; sessions hand it their answered batches.
    pub mirror: Arc<crate::operations::mirror::MirrorSlot>,
    /// The gate every batch passes and what switches the standalone upstream by reload
    /// (`mirror::cutover`).
    pub cutover: Arc<crate::operations::mirror::cutover::Cutover>,
}

impl Ops {
    /// Metrics reading `policy`, and the slow log `config` asks for.
    pub fn new(config: &Config, policy: Arc<ArcSwap<Policy>>, reload: Option<Reload>) -> Ops {
        let admin = &config.admin;
        Ops {
            metrics: Metrics::new(policy),
            slowlog: Arc::new(SlowLog::new(
                Duration::from_micros(admin.slowlog_threshold_us.value),
                admin.slowlog_max_len.value,
            )),
            reload,
            audit: None,
            keyspace: None,
            mirror: Default::default(),
            cutover: Default::default(),
        }
    }
}
