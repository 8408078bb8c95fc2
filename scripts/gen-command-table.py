#!/usr/bin/env python3
"""Generate src/commands/table.rs from a real redis-server's COMMAND INFO.

Usage:
    python3 scripts/gen-command-table.py            # write src/commands/table.rs
    python3 scripts/gen-command-table.py --check    # exit 1 if the checked-in file is stale
    python3 scripts/gen-command-table.py --redis-server /path/to/redis-server --out FILE

What it does:
  1. starts a throwaway redis-server on a free loopback port (no persistence, its own temp
     directory), waits until it answers PING (bounded, no fixed sleeps as readiness checks);
  2. speaks RESP3 (HELLO 3) over a plain socket and runs COMMAND INFO, INFO server, ACL CAT;
  3. writes a Rust table, sorted by command name (subcommands sorted within their container),
     with arity, command flags, ACL categories, command tips, key specs and, where Redis uses a
     hand-written key-finding function instead of (or in addition to) its key specs, which one.

Only the Python standard library is used. The output is deterministic: the same Redis binary
always produces the same file.

Redis does not report which commands have a `getkeys_proc` (a C function that finds keys where
the key specs cannot). That list is below (KEYS_PROCS, from Redis 7.0's src/commands.c); the
script refuses to generate a table where a command's key specs need such a function and the
list has none, so a new Redis version cannot silently produce a table with wrong keys.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "src", "commands", "table.rs")

# Commands whose key positions Redis computes (also, or only) with a getkeys_proc, and the
# Rust `KeysProc` variant that mirrors that C function (see src/commands/keys.rs).
KEYS_PROCS = {
    "zunionstore": "ZunionInterDiffStore",
    "zinterstore": "ZunionInterDiffStore",
    "zdiffstore": "ZunionInterDiffStore",
    "zunion": "ZunionInterDiff",
    "zinter": "ZunionInterDiff",
    "zdiff": "ZunionInterDiff",
    "zintercard": "ZunionInterDiff",
    "sintercard": "Sintercard",
    "eval": "Eval",
    "evalsha": "Eval",
    "eval_ro": "Eval",
    "evalsha_ro": "Eval",
    "fcall": "Function",
    "fcall_ro": "Function",
    "lmpop": "Lmpop",
    "blmpop": "Blmpop",
    "zmpop": "Zmpop",
    "bzmpop": "Bzmpop",
    "sort": "Sort",
    "sort_ro": "SortRo",
    "migrate": "Migrate",
    "georadius": "Georadius",
    "georadiusbymember": "Georadius",
    "xread": "Xread",
    "xreadgroup": "Xread",
    "set": "Set",
    "bitfield": "Bitfield",
}

# Name reported by Redis -> Rust constant, in bit order. An unknown name fails generation.
COMMAND_FLAGS = [
    ("write", "WRITE"),
    ("readonly", "READONLY"),
    ("denyoom", "DENYOOM"),
    ("module", "MODULE"),
    ("admin", "ADMIN"),
    ("pubsub", "PUBSUB"),
    ("noscript", "NOSCRIPT"),
    ("blocking", "BLOCKING"),
    ("loading", "LOADING"),
    ("stale", "STALE"),
    ("skip_monitor", "SKIP_MONITOR"),
    ("skip_slowlog", "SKIP_SLOWLOG"),
    ("asking", "ASKING"),
    ("fast", "FAST"),
    ("no_auth", "NO_AUTH"),
    ("no_mandatory_keys", "NO_MANDATORY_KEYS"),
    ("no_async_loading", "NO_ASYNC_LOADING"),
    ("no_multi", "NO_MULTI"),
    ("movablekeys", "MOVABLE_KEYS"),
    ("allow_busy", "ALLOW_BUSY"),
]

ACL_CATEGORIES = [
    "keyspace", "read", "write", "set", "sortedset", "list", "hash", "string", "bitmap",
    "hyperloglog", "geo", "stream", "pubsub", "admin", "fast", "slow", "blocking", "dangerous",
    "connection", "transaction", "scripting",
]

KEY_SPEC_FLAGS = [
    ("RO", "RO"),
    ("RW", "RW"),
    ("OW", "OW"),
    ("RM", "RM"),
    ("access", "ACCESS"),
    ("update", "UPDATE"),
    ("insert", "INSERT"),
    ("delete", "DELETE"),
    ("not_key", "NOT_KEY"),
    ("incomplete", "INCOMPLETE"),
    ("variable_flags", "VARIABLE_FLAGS"),
]

DEADLINE = 10.0


# --------------------------------------------------------------------------------------------
# A minimal RESP2/RESP3 client
# --------------------------------------------------------------------------------------------

class RespError(Exception):
    pass


class Resp:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
        self.buf = b""

    def close(self):
        self.sock.close()

    def _fill(self):
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("redis-server closed the connection")
        self.buf += chunk

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line, self.buf = self.buf[:i], self.buf[i + 2:]
                return line
            self._fill()

    def _exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def read(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t in (b"+",):
            return rest.decode()
        if t == b"-":
            return RespError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b",":
            return float(rest)
        if t == b"#":
            return rest == b"t"
        if t == b"_":
            return None
        if t in (b"$", b"=", b"!"):
            n = int(rest)
            if n < 0:
                return None
            data = self._exact(n)
            if t == b"!":
                return RespError(data.decode())
            if t == b"=":
                data = data[4:]  # "txt:" / "mkd:"
            return data.decode()
        if t in (b"*", b"~", b">"):
            n = int(rest)
            if n < 0:
                return None
            return [self.read() for _ in range(n)]
        if t == b"%":
            out = {}
            for _ in range(int(rest)):
                k = self.read()
                out[k] = self.read()
            return out
        if t == b"|":  # attributes: skip, then read the real reply
            for _ in range(int(rest) * 2):
                self.read()
            return self.read()
        raise ValueError(f"unexpected RESP type {line!r}")

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        reply = self.read()
        if isinstance(reply, RespError):
            raise reply
        return reply


# --------------------------------------------------------------------------------------------
# The throwaway server
# --------------------------------------------------------------------------------------------

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(binary, workdir):
    """Starts redis-server on a free port; returns (process, port). Retries a lost port race."""
    for _attempt in range(5):
        port = free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir, "--daemonize", "no",
             "--logfile", os.path.join(workdir, "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break  # exited: most likely the port was taken meanwhile; try another
            try:
                c = Resp(port)
                try:
                    if c.call("PING") == "PONG":
                        return proc, port
                finally:
                    c.close()
            except (OSError, RespError):
                pass
            time.sleep(0.02)  # poll interval, not a readiness assumption
        stop_server(proc)
    sys.exit(f"could not start {binary} (see {workdir}/redis.log)")


def stop_server(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------------------------
# Conversion to Rust
# --------------------------------------------------------------------------------------------

def rust_str(s):
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= ord(ch) < 127:
            out.append(ch)
        else:
            out.append("\\u{%x}" % ord(ch))
    out.append('"')
    return "".join(out)


def bitset(type_name, table, names, what, cmd):
    known = dict(table)
    unknown = [n for n in names if n not in known]
    if unknown and what == "command flag":
        # A command flag no rule reads (Valkey 9.1's `skip_commandlog`) is left out with a
        # warning; the proxy's runtime learning (src/commands/learned.rs) does the same.
        print(f"warning: {cmd}: command flag(s) {unknown} left out (unknown to mod.rs)",
              file=sys.stderr)
    elif unknown:
        sys.exit(f"{cmd}: unknown {what} {unknown}: add them to the generator and to mod.rs")
    consts = [const for name, const in table if name in names]
    if not consts:
        return f"{type_name}::EMPTY"
    return f"{type_name}(" + " | ".join(f"{type_name}::{c}.0" for c in consts) + ")"


def categories(names, cmd):
    bare = []
    for n in names:
        if not n.startswith("@") or n[1:] not in ACL_CATEGORIES:
            sys.exit(f"{cmd}: unknown ACL category {n!r}: add it to the generator and to mod.rs")
        bare.append(n[1:])
    consts = [c.upper() for c in ACL_CATEGORIES if c in bare]
    if not consts:
        return "A::EMPTY"
    return "A(" + " | ".join(f"A::{c}.0" for c in consts) + ")"


def as_map(x):
    """COMMAND INFO maps arrive as dicts in RESP3 and as flat [k, v, ...] lists in RESP2."""
    if isinstance(x, dict):
        return x
    return {x[i]: x[i + 1] for i in range(0, len(x), 2)}


def begin_search(bs, cmd):
    bs = as_map(bs)
    spec = as_map(bs["spec"])
    if bs["type"] == "index":
        return f"BeginSearch::Index({int(spec['index'])})"
    if bs["type"] == "keyword":
        return (f"BeginSearch::Keyword {{ keyword: {rust_str(spec['keyword'])}, "
                f"startfrom: {int(spec['startfrom'])} }}")
    if bs["type"] == "unknown":
        return "BeginSearch::Unknown"
    sys.exit(f"{cmd}: unknown begin_search type {bs['type']!r}")


def find_keys(fk, cmd):
    fk = as_map(fk)
    spec = as_map(fk["spec"])
    if fk["type"] == "range":
        return (f"FindKeys::Range {{ lastkey: {int(spec['lastkey'])}, "
                f"keystep: {int(spec['keystep'])}, limit: {int(spec['limit'])} }}")
    if fk["type"] == "keynum":
        return (f"FindKeys::Keynum {{ keynumidx: {int(spec['keynumidx'])}, "
                f"firstkey: {int(spec['firstkey'])}, keystep: {int(spec['keystep'])} }}")
    if fk["type"] == "unknown":
        return "FindKeys::Unknown"
    sys.exit(f"{cmd}: unknown find_keys type {fk['type']!r}")


def check_keys_proc(name, flags, specs):
    """Fails generation when the key specs alone cannot find a command's keys and the generator
    has no getkeys_proc for it (a new Redis version added one): fail closed, at build time."""
    proc = KEYS_PROCS.get(name)
    needs_proc = []
    for s in specs:
        s = as_map(s)
        bs, fk = as_map(s["begin_search"]), as_map(s["find_keys"])
        if bs["type"] == "unknown" or fk["type"] == "unknown":
            needs_proc.append("unknown key spec")
        if "incomplete" in s["flags"]:
            needs_proc.append("incomplete key spec")
        if "variable_flags" in s["flags"]:
            needs_proc.append("variable_flags key spec")
    if needs_proc and proc is None:
        sys.exit(f"{name}: {', '.join(sorted(set(needs_proc)))} but no KEYS_PROCS entry: "
                 "mirror Redis's getkeys_proc in src/commands/keys.rs and list it here")
    only_fixed = all(as_map(as_map(s)["begin_search"])["type"] == "index"
                     and as_map(as_map(s)["find_keys"])["type"] == "range" for s in specs)
    if proc is None and "movablekeys" in flags and only_fixed:
        sys.exit(f"{name}: movablekeys with only fixed-position key specs means Redis has a "
                 "getkeys_proc for it: mirror it in src/commands/keys.rs and list it in KEYS_PROCS")
    if proc is not None and "movablekeys" not in flags and not needs_proc:
        sys.exit(f"{name}: listed in KEYS_PROCS but Redis reports neither movablekeys nor "
                 "variable flags: is the list out of date?")
    return proc or "None"


def entry(info, indent, parent=None):
    name, arity, flags, _first, _last, _step, cats, tips, specs, subs = info[:10]
    name = name.lower()
    if parent is not None and not name.startswith(parent + "|"):
        sys.exit(f"subcommand {name!r} not named after its container {parent!r}")
    p = " " * indent
    lines = [f"{p}CommandSpec {{"]
    lines.append(f"{p}    name: {rust_str(name)},")
    lines.append(f"{p}    arity: {int(arity)},")
    lines.append(f"{p}    flags: {bitset('F', COMMAND_FLAGS, flags, 'command flag', name)},")
    lines.append(f"{p}    acl_categories: {categories(cats, name)},")
    if tips:
        lines.append(f"{p}    tips: &[{', '.join(rust_str(t) for t in tips)}],")
    else:
        lines.append(f"{p}    tips: &[],")
    if specs:
        lines.append(f"{p}    key_specs: &[")
        for s in specs:
            s = as_map(s)
            lines.append(f"{p}        KeySpec {{")
            lines.append(f"{p}            notes: {rust_str(s.get('notes', ''))},")
            lines.append(
                f"{p}            flags: {bitset('K', KEY_SPEC_FLAGS, s['flags'], 'key spec flag', name)},")
            lines.append(f"{p}            begin_search: {begin_search(s['begin_search'], name)},")
            lines.append(f"{p}            find_keys: {find_keys(s['find_keys'], name)},")
            lines.append(f"{p}        }},")
        lines.append(f"{p}    ],")
    else:
        lines.append(f"{p}    key_specs: &[],")
    lines.append(f"{p}    keys_proc: KeysProc::{check_keys_proc(name, flags, specs)},")
    if subs:
        lines.append(f"{p}    subcommands: &[")
        for sub in sorted(subs, key=lambda s: s[0].lower()):
            lines.extend(entry(sub, indent + 8, name))
        lines.append(f"{p}    ],")
    else:
        lines.append(f"{p}    subcommands: &[],")
    lines.append(f"{p}}},")
    return lines


def generate(binary):
    workdir = tempfile.mkdtemp(prefix="gen-command-table-")
    proc = None
    try:
        proc, port = start_server(binary, workdir)
        c = Resp(port)
        try:
            c.call("HELLO", "3")
            server_info = c.call("INFO", "server")
            infos = c.call("COMMAND", "INFO")
            acl_cats = c.call("ACL", "CAT")
        finally:
            c.close()
    finally:
        if proc is not None:
            stop_server(proc)
        shutil.rmtree(workdir, ignore_errors=True)

    version = None
    for line in server_info.splitlines():
        if line.startswith("redis_version:"):
            version = line.split(":", 1)[1].strip()
    if version is None:
        sys.exit("INFO server has no redis_version")
    unknown_cats = sorted(set(acl_cats) - set(ACL_CATEGORIES))
    if unknown_cats:
        sys.exit(f"ACL CAT lists categories the generator does not know: {unknown_cats}")

    infos = sorted((i for i in infos if i is not None), key=lambda i: i[0].lower())
    total = sum(1 + len(i[9]) for i in infos)

    out = [
        "// @generated by scripts/gen-command-table.py from Redis "
        f"{version} (COMMAND INFO). Do not edit.",
        "//",
        "// Regenerate (needs a redis-server binary; starts a throwaway one on a free port):",
        "//     python3 scripts/gen-command-table.py [--redis-server PATH]",
        "// Check that this file is up to date:",
        "//     python3 scripts/gen-command-table.py --check",
        "//",
        f"// {len(infos)} commands, {total} entries with subcommands; sorted by name.",
        "",
        "use super::{",
        "    AclCategories as A, BeginSearch, CommandFlags as F, CommandSpec, FindKeys,",
        "    KeySpecFlags as K, KeySpec, KeysProc,",
        "};",
        "",
        "/// The Redis version this table was generated from.",
        f"pub(super) const REDIS_VERSION: &str = {rust_str(version)};",
        "",
        "/// Every command Redis reported, sorted by (lower-case) name.",
        f"pub(super) static COMMANDS: [CommandSpec; {len(infos)}] = [",
    ]
    for info in infos:
        out.extend(entry(info, 4))
    out.append("];")
    out.append("")
    return "\n".join(out), version, len(infos), total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server",
                    help="redis-server binary to ask (default: from PATH)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="file to write (default: %(default)s)")
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 when the file differs from what would be generated")
    args = ap.parse_args()

    text, version, commands, total = generate(args.redis_server)
    if args.check:
        try:
            with open(args.out, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != text:
            print(f"{args.out} is stale: regenerate with scripts/gen-command-table.py", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date (Redis {version}, {commands} commands, {total} entries)")
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out} (Redis {version}, {commands} commands, {total} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
