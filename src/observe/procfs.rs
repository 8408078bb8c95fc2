//! The proxy process's own resource use, read from `/proc/self` at scrape time for the
//! standard Prometheus `process_*` metrics (what every client library exports, and what
//! dashboards and alerts for any service expect).
//!
//! Read by hand rather than through a crate: three small text files and a directory listing.
//! Off Linux, or where `/proc` is hidden, the values are simply absent.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The kernel reports CPU times and the start time in USER_HZ ticks, which Linux fixes at
/// 100 for every architecture's user-space ABI (it is not the kernel's internal HZ).
const USER_HZ: f64 = 100.0;

/// One reading of the process's resource use; `None` for what could not be read.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ProcessStats {
    /// User plus system CPU time, in seconds.
    pub(crate) cpu_seconds: Option<f64>,
    /// Resident set size, in bytes.
    pub(crate) resident_memory_bytes: Option<u64>,
    /// Virtual memory size, in bytes.
    pub(crate) virtual_memory_bytes: Option<u64>,
    /// Open file descriptors: clients, upstream connections, listeners.
    pub(crate) open_fds: Option<u64>,
    /// The soft limit on open file descriptors, which `limits.max_clients` must stay under.
    pub(crate) max_fds: Option<u64>,
    /// When the process started, in seconds since the Unix epoch.
    pub(crate) start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads `/proc/self`. `started` is the fallback start time where the boot time cannot
    /// be read (systemd's `ProcSubset=pid` hides `/proc/stat`).
    pub(crate) fn read(started: SystemTime) -> ProcessStats {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let stat = stat.as_deref().and_then(parse_stat);
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time(&s));
        let start_time_seconds = match (stat, boot) {
            (Some(st), Some(boot)) => Some(boot as f64 + st.start_ticks as f64 / USER_HZ),
            _ => Some(epoch_seconds(started)),
        };
        ProcessStats {
            cpu_seconds: stat.map(|s| s.cpu_ticks as f64 / USER_HZ),
            resident_memory_bytes: std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| status_kib(&s, "VmRSS:"))
                .map(|kib| kib * 1024),
            virtual_memory_bytes: stat.map(|s| s.vsize),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
            max_fds: std::fs::read_to_string("/proc/self/limits")
                .ok()
                .and_then(|s| soft_limit(&s, "Max open files")),
            start_time_seconds,
        }
    }
}

/// The fields of `/proc/self/stat` the metrics use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// utime + stime, in USER_HZ ticks.
    cpu_ticks: u64,
    /// Start time after boot, in USER_HZ ticks.
    start_ticks: u64,
    /// Virtual memory size in bytes.
    vsize: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may contain
/// spaces and parentheses itself, so fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0, so field N is index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: field(14)? + field(15)?,
        start_ticks: field(22)?,
        vsize: field(23)?,
    })
}

/// The `btime` line of `/proc/stat`: boot time in seconds since the epoch.
fn boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// A `Name:   1234 kB` line of `/proc/self/status`, in KiB.
fn status_kib(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The soft limit of a `/proc/self/limits` row (`Max open files  1024  4096  files`);
/// `None` for `unlimited`.
fn soft_limit(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Seconds since the epoch of a wall-clock time, for the fallback start time.
pub(crate) fn epoch_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A name with a space and a parenthesis, as a thread may set it.
        let line = "4242 (redis (policy) x) S 1 4242 4242 0 -1 4194560 1093 0 0 0 \
                    250 125 0 0 20 0 2 0 987654 123456789 2048 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                cpu_ticks: 375,
                start_ticks: 987654,
                vsize: 123456789
            })
        );
        assert_eq!(parse_stat("4242 (truncated"), None);
    }

    #[test]
    fn status_limits_and_boot_time_lines() {
        let status = "Name:\tredis-policy-pr\nVmSize:\t  20480 kB\nVmRSS:\t    5120 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(5120));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            65536                524288               files\n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(65536));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_limit(unlimited, "Max open files"), None);
        assert_eq!(
            boot_time("cpu  1 2 3\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_can_be_read() {
        let s = ProcessStats::read(SystemTime::now());
        assert!(s.resident_memory_bytes.unwrap() > 0);
        assert!(s.open_fds.unwrap() >= 3, "stdin, stdout, stderr at least");
        assert!(s.cpu_seconds.is_some());
        let start = s.start_time_seconds.unwrap();
        assert!(start > 1.0e9 && start <= epoch_seconds(SystemTime::now()) + 1.0);
    }
}
