//! Cluster mode: one `INFO` for the whole cluster, from every primary's. The first node's text
//! is the frame (server, memory, replication: one node's), with what one Redis holding every
//! key and serving every client would count summed over the nodes: the `# Keyspace` counts,
//! the counters of [`SUMMED_FIELDS`], and the per-command and per-error statistics
//! (`# Commandstats`, `# Errorstats`), whose lines a node that never ran a command lacks.
//! Pure functions of the replies, tested without a server.

use crate::protocol::{answers, codec};
use bytes::Bytes;

/// The first node's INFO text with the counts of every node summed in (keyspace lines,
/// [`SUMMED_FIELDS`], command and error statistics) and `cluster_enabled:1` turned to 0.
pub(super) fn merge_info(replies: &[Bytes]) -> Bytes {
    let Some(first) = replies.first() else {
        return answers::clusterdown();
    };
    let Some((verbatim, text)) = crate::session::replies::text_of(first) else {
        return answers::unexpected_node_reply(first);
    };
    let sums = keyspace_sums(replies);
    let counters = counter_sums(replies);
    let stats = Stats::of(replies);
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    for line in text.split_inclusive(|&b| b == b'\n') {
        if stats.is_replaced(line) {
            continue;
        }
        merged_info_line(line, &sums, &counters, &mut out);
        stats.after_header(line, &mut out);
    }
    crate::session::replies::text_reply(verbatim, &out)
}

/// INFO fields that count something of the whole dataset or of every client, which one
/// Redis holding every key would report as the sum of the nodes' (a client waiting for its
/// `BLPOP` to block polls `blocked_clients`, and the blocked connection is on its key's node,
/// not on the node whose INFO text is shown). The fields of [`MAX_FIELDS`] are among them,
/// merged by their largest value instead.
const SUMMED_FIELDS: [&str; 19] = [
    // The memory one Redis holding every key would use: what a client watching memory
    // come back after UNLINK or FLUSHDB ASYNC reads (the key was on one node).
    "used_memory",
    "used_memory_dataset",
    "used_memory_rss",
    "blocked_clients",
    "lazyfreed_objects",
    "lazyfree_pending_objects",
    "total_commands_processed",
    "total_error_replies",
    "rdb_changes_since_last_save",
    "tracking_clients",
    "clients_in_timeout_table",
    "total_blocking_keys",
    "total_blocking_keys_on_nokey",
    "expired_keys",
    "evicted_keys",
    "keyspace_hits",
    "keyspace_misses",
    "tracking_total_keys",
    "tracking_total_items",
];

/// Fields of [`SUMMED_FIELDS`] that count a client once on every primary: a tracking
/// client's tracking is spread over every primary, one connection each (`tracking`), so one
/// Redis would count it once, as the largest of the nodes' counts does. (A client whose
/// tracking stays on one node, behind routes or logged in as its own user, is then counted
/// only where it is the largest.)
const MAX_FIELDS: [&str; 1] = ["tracking_clients"];

/// Each of [`SUMMED_FIELDS`] summed over the nodes' INFO replies, or the largest for
/// [`MAX_FIELDS`] (absent when no node has it).
fn counter_sums(replies: &[Bytes]) -> Vec<(&'static str, i64)> {
    let mut sums: Vec<(&'static str, i64)> = Vec::new();
    for (name, v) in node_lines(replies).filter_map(summed_field) {
        match sums.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) if MAX_FIELDS.contains(&name) => *total = (*total).max(v),
            Some((_, total)) => *total += v,
            None => sums.push((name, v)),
        }
    }
    sums
}

/// Every line of every node's INFO text, without its line ending.
fn node_lines(replies: &[Bytes]) -> impl Iterator<Item = &[u8]> {
    replies
        .iter()
        .filter_map(|r| crate::session::replies::text_of(r).map(|(_, body)| body))
        .flat_map(|body| body.split(|&b| b == b'\n'))
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
}

/// `name:value` for one of [`SUMMED_FIELDS`] with an integer value.
fn summed_field(line: &[u8]) -> Option<(&'static str, i64)> {
    let colon = memchr::memchr(b':', line)?;
    let name = SUMMED_FIELDS
        .iter()
        .find(|n| n.as_bytes() == &line[..colon])?;
    Some((name, codec::parse_int(&line[colon + 1..])?))
}

/// Redis's `bytesToHuman`: bytes as `B`, or `K`/`M`/`G`/`T`/`P` with two decimals.
fn bytes_to_human(n: i64) -> String {
    let (mut d, mut unit) = (n as f64, "B");
    for next in ["K", "M", "G", "T", "P"] {
        if d < 1024.0 {
            break;
        }
        d /= 1024.0;
        unit = next;
    }
    match unit {
        "B" => format!("{n}B"),
        _ => format!("{d:.2}{unit}"),
    }
}

/// Per database, a keyspace count summed over every node's INFO.
type KeyspaceSums = Vec<(Vec<u8>, &'static str, i64)>;

/// (db, field) → sum over the nodes' INFO replies, for the integer fields worth adding up.
fn keyspace_sums(replies: &[Bytes]) -> KeyspaceSums {
    let mut sums = KeyspaceSums::new();
    for (db, fields) in node_lines(replies).filter_map(keyspace_line) {
        add_keyspace_counts(&mut sums, db, fields);
    }
    sums
}

/// Adds the `keys` and `expires` counts of one node's keyspace line for `db` to `sums`.
fn add_keyspace_counts(sums: &mut KeyspaceSums, db: &[u8], fields: &[u8]) {
    for name in ["keys", "expires"] {
        let Some(v) = field_value(fields, name) else {
            continue;
        };
        match sums.iter_mut().find(|(d, n, _)| d == db && *n == name) {
            Some((_, _, total)) => *total += v,
            None => sums.push((db.to_vec(), name, v)),
        }
    }
}

/// One line of the first node's INFO text (with its line ending) as the client gets it:
/// `cluster_enabled:0`, a keyspace line or a counter with the nodes' sums, any other line as
/// it is.
fn merged_info_line(
    line: &[u8],
    sums: &KeyspaceSums,
    counters: &[(&'static str, i64)],
    out: &mut Vec<u8>,
) {
    let bare = line.strip_suffix(b"\n").unwrap_or(line);
    let bare = bare.strip_suffix(b"\r").unwrap_or(bare);
    let ending = &line[bare.len()..];
    if bare == b"cluster_enabled:1" {
        out.extend_from_slice(b"cluster_enabled:0");
        out.extend_from_slice(ending);
        return;
    }
    if let Some((name, _)) = summed_field(bare)
        && let Some((_, total)) = counters.iter().find(|(n, _)| *n == name)
    {
        out.extend_from_slice(format!("{name}:{total}").as_bytes());
        out.extend_from_slice(ending);
        return;
    }
    // The human form of a summed memory field says what its number says.
    if let Some(name) = bare
        .split(|&b| b == b':')
        .next()
        .and_then(|n| n.strip_suffix(b"_human"))
        .and_then(|n| std::str::from_utf8(n).ok())
        && let Some((_, total)) = counters.iter().find(|(n, _)| *n == name)
    {
        out.extend_from_slice(format!("{name}_human:{}", bytes_to_human(*total)).as_bytes());
        out.extend_from_slice(ending);
        return;
    }
    let Some((db, fields)) = keyspace_line(bare) else {
        out.extend_from_slice(line);
        return;
    };
    out.extend_from_slice(db);
    out.push(b':');
    for (i, field) in fields.split(|&b| b == b',').enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let name = field.split(|&b| b == b'=').next().unwrap_or(b"");
        match sums
            .iter()
            .find(|(d, n, _)| d == db && n.as_bytes() == name)
        {
            Some((_, n, total)) => out.extend_from_slice(format!("{n}={total}").as_bytes()),
            None => out.extend_from_slice(field),
        }
    }
    out.extend_from_slice(ending);
}

/// `dbN` and its fields, for a `# Keyspace` line such as `db0:keys=3,expires=1,avg_ttl=0`.
fn keyspace_line(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = memchr::memchr(b':', line)?;
    let (db, fields) = (&line[..colon], &line[colon + 1..]);
    (db.len() > 2
        && db.starts_with(b"db")
        && db[2..].iter().all(u8::is_ascii_digit)
        && fields.starts_with(b"keys="))
    .then_some((db, fields))
}

/// The `# Commandstats` and `# Errorstats` sections summed over the nodes: one line per
/// command (or error) any node has, in the order first seen.
struct Stats {
    /// `cmdstat_<name>` → calls, usec, rejected_calls, failed_calls.
    commands: Vec<(Vec<u8>, [i64; 4])>,
    /// `errorstat_<code>` → count.
    errors: Vec<(Vec<u8>, i64)>,
}

/// The integer fields of a `cmdstat_` line, in the order Redis writes them (`usec_per_call`,
/// a ratio, is computed again from the sums).
const COMMAND_FIELDS: [&str; 4] = ["calls", "usec", "rejected_calls", "failed_calls"];

impl Stats {
    fn of(replies: &[Bytes]) -> Stats {
        let mut stats = Stats {
            commands: Vec::new(),
            errors: Vec::new(),
        };
        node_lines(replies).for_each(|line| stats.add(line));
        stats
    }

    /// Adds one node's line, if it is a command's or an error's.
    fn add(&mut self, line: &[u8]) {
        let Some(colon) = memchr::memchr(b':', line) else {
            return;
        };
        let (name, fields) = (&line[..colon], &line[colon + 1..]);
        if name.starts_with(b"cmdstat_") {
            let mut values = [0i64; 4];
            for (i, field) in COMMAND_FIELDS.iter().enumerate() {
                values[i] = field_value(fields, field).unwrap_or(0);
            }
            match self.commands.iter_mut().find(|(n, _)| n == name) {
                Some((_, sums)) => sums.iter_mut().zip(values).for_each(|(s, v)| *s += v),
                None => self.commands.push((name.to_vec(), values)),
            }
        } else if name.starts_with(b"errorstat_") {
            let count = field_value(fields, "count").unwrap_or(0);
            match self.errors.iter_mut().find(|(n, _)| n == name) {
                Some((_, sum)) => *sum += count,
                None => self.errors.push((name.to_vec(), count)),
            }
        }
    }

    /// Whether `line` of the first node's text is one of the lines the sums replace.
    fn is_replaced(&self, line: &[u8]) -> bool {
        line.starts_with(b"cmdstat_") || line.starts_with(b"errorstat_")
    }

    /// After a section header, the summed lines of that section.
    fn after_header(&self, line: &[u8], out: &mut Vec<u8>) {
        let bare = line.strip_suffix(b"\n").unwrap_or(line);
        let bare = bare.strip_suffix(b"\r").unwrap_or(bare);
        if bare.eq_ignore_ascii_case(b"# Commandstats") {
            for (name, [calls, usec, rejected, failed]) in &self.commands {
                let per_call = if *calls > 0 {
                    *usec as f64 / *calls as f64
                } else {
                    0.0
                };
                out.extend_from_slice(name);
                out.extend_from_slice(
                    format!(
                        ":calls={calls},usec={usec},usec_per_call={per_call:.2},\
                         rejected_calls={rejected},failed_calls={failed}\r\n"
                    )
                    .as_bytes(),
                );
            }
        } else if bare.eq_ignore_ascii_case(b"# Errorstats") {
            for (name, count) in &self.errors {
                out.extend_from_slice(name);
                out.extend_from_slice(format!(":count={count}\r\n").as_bytes());
            }
        }
    }
}

/// The integer value of `name=` in a `k=v,k=v` list.
fn field_value(fields: &[u8], name: &str) -> Option<i64> {
    fields.split(|&b| b == b',').find_map(|f| {
        f.strip_prefix(name.as_bytes())
            .and_then(|r| r.strip_prefix(b"="))
            .and_then(codec::parse_int)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_summed_with_its_human_form() {
        let node = |used: u64, human: &str| {
            let text = format!(
                "# Memory\r\nused_memory:{used}\r\nused_memory_human:{human}\r\nused_memory_peak:9\r\n"
            );
            Bytes::from(format!("${}\r\n{text}\r\n", text.len()))
        };
        let merged = merge_info(&[node(1_048_576, "1.00M"), node(2_097_152, "2.00M")]);
        let text = String::from_utf8_lossy(&merged);
        assert!(text.contains("used_memory:3145728\r\n"), "{text}");
        assert!(text.contains("used_memory_human:3.00M\r\n"), "{text}");
        // Not summed: one node's.
        assert!(text.contains("used_memory_peak:9\r\n"), "{text}");
        assert_eq!(bytes_to_human(1023), "1023B");
        assert_eq!(bytes_to_human(1536), "1.50K");
        assert_eq!(bytes_to_human(5 * 1024 * 1024 * 1024), "5.00G");
    }

    #[test]
    fn info_sums_the_keyspace() {
        let info = |keys: u32, expires: u32| {
            let text = format!(
                "# Server\r\nredis_version:7.2\r\n\r\n# Clients\r\nmaxclients:10000\r\nblocked_clients:{expires}\r\ntracking_clients:{expires}\r\n\r\n# Stats\r\nkeyspace_hits:{keys}\r\n\r\n# Cluster\r\ncluster_enabled:1\r\n\r\n# Keyspace\r\ndb0:keys={keys},expires={expires},avg_ttl=5\r\n"
            );
            Bytes::from(format!("${}\r\n{text}\r\n", text.len()))
        };
        let merged = merge_info(&[info(3, 1), info(4, 0), info(10, 2)]);
        let text = String::from_utf8_lossy(&merged).into_owned();
        assert!(text.contains("blocked_clients:3\r\n"), "{text}");
        // Each tracking client is on every primary: counted once, as the largest.
        assert!(text.contains("tracking_clients:2\r\n"), "{text}");
        assert!(text.contains("keyspace_hits:17\r\n"), "{text}");
        assert!(text.contains("maxclients:10000\r\n"), "not summed: {text}");
        assert!(
            text.contains("db0:keys=17,expires=3,avg_ttl=5\r\n"),
            "{text}"
        );
        assert!(text.contains("cluster_enabled:0\r\n"), "{text}");
        assert!(text.contains("redis_version:7.2\r\n"), "{text}");
        let header = format!(
            "${}\r\n",
            merged.len() - 2 - format!("{}", merged.len()).len() - 3
        );
        assert!(merged.starts_with(header.as_bytes()), "{text}");
    }

    #[test]
    fn keyspace_lines_are_recognised() {
        assert_eq!(
            keyspace_line(b"db12:keys=3,expires=1"),
            Some((&b"db12"[..], &b"keys=3,expires=1"[..]))
        );
        assert_eq!(keyspace_line(b"db:keys=3"), None);
        assert_eq!(keyspace_line(b"dbx:keys=3"), None);
        assert_eq!(keyspace_line(b"db0:expires=1"), None);
        assert_eq!(keyspace_line(b"used_memory:100"), None);
    }

    #[test]
    fn command_and_error_stats_are_summed_and_lines_only_others_have_are_added() {
        let info = |commands: &str, errors: &str| {
            let text = format!(
                "# Server\r\nredis_version:7.0\r\n\r\n# Commandstats\r\n{commands}\r\n# Errorstats\r\n{errors}\r\n# Cluster\r\ncluster_enabled:1\r\n"
            );
            Bytes::from(format!("${}\r\n{text}\r\n", text.len()))
        };
        let one = info(
            "cmdstat_get:calls=2,usec=10,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n",
            "",
        );
        let two = info(
            "cmdstat_get:calls=1,usec=5,usec_per_call=5.00,rejected_calls=1,failed_calls=0\r\ncmdstat_xreadgroup:calls=1,usec=7,usec_per_call=7.00,rejected_calls=0,failed_calls=1\r\n",
            "errorstat_NOGROUP:count=1\r\n",
        );
        let merged = merge_info(&[one, two]);
        let text = String::from_utf8_lossy(&merged).into_owned();
        assert!(
            text.contains("# Commandstats\r\ncmdstat_get:calls=3,usec=15,usec_per_call=5.00,rejected_calls=1,failed_calls=0\r\ncmdstat_xreadgroup:calls=1,usec=7,usec_per_call=7.00,rejected_calls=0,failed_calls=1\r\n\r\n# Errorstats\r\nerrorstat_NOGROUP:count=1\r\n\r\n# Cluster\r\ncluster_enabled:0\r\n"),
            "{text}"
        );
    }
}
