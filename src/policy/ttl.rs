//! Forced TTLs: every key a write creates gets an expiry, by key prefix; explicit TTLs above
//! the maximum are cut; PERSIST can be refused.
//!
//! How each write family is handled (see also `policy/README.md`):
//! - `SET` without `EX/PX/EXAT/PXAT/KEEPTTL`: `PX <ttl>` is appended to the command itself, so
//!   the write and its TTL are one atomic command, inside MULTI too. `SET k v NX PX 5000` (the
//!   lock pattern) keeps its own PX; EX/PX above the maximum are cut to it.
//! - `SETEX`/`PSETEX`/`EXPIRE`/`PEXPIRE`/`GETEX EX|PX` above the maximum: rewritten to the
//!   millisecond form with the maximum (same reply).
//! - `PERSIST`, `GETEX … PERSIST`: refused when `deny_persist` is set.
//! - Every other write that may create a key (key spec flags insert, overwrite or update:
//!   HSET, SADD, ZADD, LPUSH, XADD, PFADD, INCR, SETNX, MSET, GETSET, COPY, RENAME's target,
//!   *STORE destinations…): a `PEXPIRE <key> <ttl> NX` follows the command in the same batch
//!   and its reply is hidden. `NX` (Redis 7) only sets a TTL on a key that has none, so a TTL
//!   the application chose is never changed. Inside MULTI the PEXPIRE is queued in the same
//!   transaction and removed from EXEC's reply.
//! - Absolute expiries (`EXAT`, `PXAT`, `EXPIREAT`, `PEXPIREAT`) are left as they are.

use std::borrow::Cow;

use super::line::CommandLine;
use super::rewrite::{Appended, Rewrite};
use crate::codec::{encode, itoa_buf, parse_int};
use crate::commands::{self, CommandSpec, KeySpecFlags};

/// A compiled `ttl:` rule.
pub struct Ttl {
    /// TTL for keys matching no prefix; `None` forces nothing.
    pub default_ms: Option<u64>,
    /// `(prefix, ttl)`, longest prefix first; a `None` TTL exempts the prefix (`lock:`).
    pub prefixes: Vec<(Vec<u8>, Option<u64>)>,
    /// Longest TTL a command may set.
    pub max_ms: Option<u64>,
    /// Refuse PERSIST and GETEX PERSIST.
    pub deny_persist: bool,
}

/// What the rule does to one command.
#[derive(Debug, PartialEq, Eq)]
pub enum TtlAction {
    /// Nothing to do.
    Keep,
    /// Refuse, with this reason.
    Refuse(String),
    /// Forward this instead.
    Rewrite(Rewrite),
}

impl Ttl {
    /// The TTL a key gets when written without one.
    pub fn ttl_for(&self, key: &[u8]) -> Option<u64> {
        for (prefix, ttl) in &self.prefixes {
            if key.starts_with(prefix) {
                return *ttl;
            }
        }
        self.default_ms
    }

    /// Applies the rule to one command.
    pub fn apply<L: CommandLine + ?Sized>(&self, spec: &CommandSpec, line: &L) -> TtlAction {
        let mut stack: [&[u8]; 8] = [&[]; 8];
        let heap: Vec<&[u8]>;
        // Arguments as a slice without allocating for the usual short commands.
        let args: &[&[u8]] = if line.argc() <= stack.len() {
            for (i, slot) in stack.iter_mut().enumerate().take(line.argc()) {
                *slot = line.arg(i);
            }
            &stack[..line.argc()]
        } else {
            heap = (0..line.argc()).map(|i| line.arg(i)).collect();
            &heap
        };
        match spec.name {
            "persist" if self.deny_persist => {
                TtlAction::Refuse("PERSIST would leave the key without a TTL".into())
            }
            "getex" => self.getex(args),
            "set" => self.set(args),
            "setex" => self.clamp_seconds(args, 2, "PSETEX"),
            "psetex" => self.clamp_millis(args, 2),
            "expire" => self.clamp_seconds(args, 2, "PEXPIRE"),
            "pexpire" => self.clamp_millis(args, 2),
            "expireat" | "pexpireat" | "persist" => TtlAction::Keep,
            _ if spec.is_write() => self.expire_written_keys(args),
            _ => TtlAction::Keep,
        }
    }

    fn set(&self, args: &[&[u8]]) -> TtlAction {
        if args.len() < 3 {
            return TtlAction::Keep;
        }
        let mut i = 3;
        while i < args.len() {
            let opt = args[i];
            if opt.eq_ignore_ascii_case(b"KEEPTTL")
                || opt.eq_ignore_ascii_case(b"EXAT")
                || opt.eq_ignore_ascii_case(b"PXAT")
            {
                return TtlAction::Keep;
            }
            if opt.eq_ignore_ascii_case(b"EX") {
                return self.clamp_seconds(args, i + 1, "");
            }
            if opt.eq_ignore_ascii_case(b"PX") {
                return self.clamp_millis(args, i + 1);
            }
            i += 1;
        }
        match self.ttl_for(args[1]) {
            Some(ms) => TtlAction::Rewrite(Rewrite {
                command: None,
                append: Some(Appended {
                    option: "PX",
                    value: ms,
                }),
                after: Vec::new(),
                note: Cow::Borrowed("SET without a TTL gets PX <ttl of its key prefix>"),
                strip: None,
            }),
            None => TtlAction::Keep,
        }
    }

    fn getex(&self, args: &[&[u8]]) -> TtlAction {
        for (i, a) in args.iter().enumerate().skip(2) {
            if a.eq_ignore_ascii_case(b"PERSIST") && self.deny_persist {
                return TtlAction::Refuse("GETEX PERSIST would leave the key without a TTL".into());
            }
            if a.eq_ignore_ascii_case(b"EX") {
                return self.clamp_seconds(args, i + 1, "");
            }
            if a.eq_ignore_ascii_case(b"PX") {
                return self.clamp_millis(args, i + 1);
            }
        }
        TtlAction::Keep
    }

    /// Cuts the seconds at `args[at]` to the maximum. `millis_command` renames the command to
    /// its millisecond form (SETEX → PSETEX); empty means the option before `at` becomes PX.
    fn clamp_seconds(&self, args: &[&[u8]], at: usize, millis_command: &str) -> TtlAction {
        let (Some(max), Some(v)) = (self.max_ms, args.get(at).and_then(|a| parse_int(a))) else {
            return TtlAction::Keep;
        };
        if v <= 0 || (v as u64).saturating_mul(1000) <= max {
            return TtlAction::Keep;
        }
        let max_text = max.to_string();
        let mut new: Vec<&[u8]> = args.to_vec();
        if millis_command.is_empty() {
            new[at - 1] = b"PX";
        } else {
            new[0] = millis_command.as_bytes();
        }
        new[at] = max_text.as_bytes();
        TtlAction::Rewrite(Rewrite {
            command: Some(encode(&new)),
            note: format!("TTL of {v} s cut to {max} ms").into(),
            ..Rewrite::default()
        })
    }

    fn clamp_millis(&self, args: &[&[u8]], at: usize) -> TtlAction {
        let (Some(max), Some(v)) = (self.max_ms, args.get(at).and_then(|a| parse_int(a))) else {
            return TtlAction::Keep;
        };
        if v <= 0 || v as u64 <= max {
            return TtlAction::Keep;
        }
        let max_text = max.to_string();
        let mut new: Vec<&[u8]> = args.to_vec();
        new[at] = max_text.as_bytes();
        TtlAction::Rewrite(Rewrite {
            command: Some(encode(&new)),
            note: format!("TTL of {v} ms cut to {max} ms").into(),
            ..Rewrite::default()
        })
    }

    fn expire_written_keys(&self, args: &[&[u8]]) -> TtlAction {
        let Ok(keys) = commands::keys(args) else {
            return TtlAction::Keep;
        };
        let creates = KeySpecFlags::INSERT
            .union(KeySpecFlags::OW)
            .union(KeySpecFlags::UPDATE);
        let mut after = Vec::new();
        for key in keys.keys() {
            if !key.flags.intersects(creates) {
                continue;
            }
            let name = args[key.index];
            if let Some(ms) = self.ttl_for(name) {
                let ms = itoa_buf(ms);
                let cmd = encode(&[b"PEXPIRE", name, ms.as_str().as_bytes(), b"NX"]);
                if !after.contains(&cmd) {
                    after.push(cmd);
                }
            }
        }
        if after.is_empty() {
            return TtlAction::Keep;
        }
        let note = Cow::Borrowed("each key it may create gets PEXPIRE <ttl> NX");
        TtlAction::Rewrite(Rewrite {
            after,
            note,
            ..Rewrite::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn rule() -> Ttl {
        Ttl {
            default_ms: Some(3_600_000),
            prefixes: vec![
                (b"session:".to_vec(), Some(86_400_000)),
                (b"lock:".to_vec(), None),
            ],
            max_ms: Some(604_800_000),
            deny_persist: true,
        }
    }

    fn run(line: &str) -> TtlAction {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        let spec = commands::lookup_args(&args).unwrap();
        rule().apply(spec, &args[..])
    }

    fn rewritten(line: &str) -> (Option<String>, Vec<String>) {
        match run(line) {
            TtlAction::Rewrite(r) => {
                let r = r.materialize(&line.split(' ').collect::<Vec<_>>()[..]);
                (
                    r.command.map(|c| String::from_utf8(c.to_vec()).unwrap()),
                    r.after
                        .iter()
                        .map(|c| String::from_utf8(c.to_vec()).unwrap())
                        .collect(),
                )
            }
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn set_gets_px_by_prefix_and_locks_keep_theirs() {
        assert_eq!(
            rewritten("SET user:1 v").0.unwrap(),
            "*5\r\n$3\r\nSET\r\n$6\r\nuser:1\r\n$1\r\nv\r\n$2\r\nPX\r\n$7\r\n3600000\r\n"
        );
        assert!(
            rewritten("SET session:9 v")
                .0
                .unwrap()
                .ends_with("$8\r\n86400000\r\n")
        );
        assert_eq!(run("SET lock:x v NX PX 5000"), TtlAction::Keep);
        assert_eq!(run("SET lock:x v NX"), TtlAction::Keep);
        assert_eq!(run("SET k v KEEPTTL"), TtlAction::Keep);
        assert_eq!(run("SET k v EX 60"), TtlAction::Keep);
    }

    #[test]
    fn long_ttls_are_cut_to_the_maximum() {
        assert!(
            rewritten("SET k v EX 99999999")
                .0
                .unwrap()
                .contains("$2\r\nPX\r\n$9\r\n604800000\r\n")
        );
        assert!(
            rewritten("SETEX k 99999999 v")
                .0
                .unwrap()
                .starts_with("*4\r\n$6\r\nPSETEX\r\n")
        );
        assert!(
            rewritten("EXPIRE k 99999999")
                .0
                .unwrap()
                .starts_with("*3\r\n$7\r\nPEXPIRE\r\n")
        );
        assert_eq!(run("EXPIRE k 60"), TtlAction::Keep);
        assert!(
            rewritten("PEXPIRE k 999999999999")
                .0
                .unwrap()
                .contains("604800000")
        );
    }

    #[test]
    fn appended_option_patches_the_header_of_any_argc() {
        let px = Appended {
            option: "PX",
            value: 3_600_000,
        };
        let mut out = BytesMut::new();
        assert!(px.extend_frame(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n", &mut out));
        assert_eq!(
            &out[..],
            b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nPX\r\n$7\r\n3600000\r\n"
        );
        // Two-digit headers grow in place; `9` becomes `11`.
        let nine: Vec<&[u8]> = vec![b"SET", b"k", b"v", b"NX", b"GET", b"a", b"b", b"c", b"d"];
        let mut out = BytesMut::new();
        assert!(px.extend_frame(&encode(&nine), &mut out));
        assert!(out.starts_with(b"*11\r\n$3\r\nSET\r\n"));
        // Not a multibulk frame: nothing written.
        let mut out = BytesMut::new();
        assert!(!px.extend_frame(b"SET k v\r\n", &mut out));
        assert!(!px.extend_frame(b"*x\r\n", &mut out));
        assert!(!px.extend_frame(b"*3", &mut out));
        assert!(out.is_empty());
    }

    #[test]
    fn persist_is_refused() {
        assert!(matches!(run("PERSIST k"), TtlAction::Refuse(_)));
        assert!(matches!(run("GETEX k PERSIST"), TtlAction::Refuse(_)));
    }

    #[test]
    fn other_writes_get_a_hidden_pexpire_nx_per_created_key() {
        let (cmd, after) = rewritten("HSET user:1 f v");
        assert_eq!(cmd, None);
        assert_eq!(
            after,
            vec!["*4\r\n$7\r\nPEXPIRE\r\n$6\r\nuser:1\r\n$7\r\n3600000\r\n$2\r\nNX\r\n"]
        );
        assert_eq!(rewritten("MSET a 1 session:b 2").1.len(), 2);
        // RENAME: only the destination is created.
        let after = rewritten("RENAME a b").1;
        assert_eq!(after.len(), 1);
        assert!(after[0].contains("$1\r\nb\r\n"));
        // Reads, deletes and pops create nothing; lock keys are exempt.
        assert_eq!(run("GET a"), TtlAction::Keep);
        assert_eq!(run("DEL a"), TtlAction::Keep);
        assert_eq!(run("LPOP a"), TtlAction::Keep);
        assert_eq!(run("SETNX lock:a 1"), TtlAction::Keep);
    }
}
