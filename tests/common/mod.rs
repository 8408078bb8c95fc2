//! Fixtures shared by the integration tests: a real `redis-server` per test, the proxy running
//! in-process on the test's runtime, raw RESP clients that read exact frames, `redis` crate
//! connections and `redis-cli` subprocesses.
//!
//! Rules every helper follows: no fixed ports (bind port 0), unique temp directories, no
//! sleeps as readiness checks (poll with a short interval under a deadline), and every wait is
//! bounded so a bug fails a test instead of hanging it.

#![allow(
    dead_code,
    reason = "each test binary uses only some of the shared fixtures"
)]

pub(crate) mod cluster;
pub(crate) mod docs_grammar;
pub(crate) mod keys;
pub(crate) mod process;
pub(crate) mod relay;
pub(crate) mod sentinel;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis_policy_proxy::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Upper bound of any single wait in the tests (server start, a reply, a reconnect).
pub(crate) const DEADLINE: Duration = Duration::from_secs(10);
/// Interval of deadline-bounded polling loops.
pub(crate) const POLL: Duration = Duration::from_millis(10);

// ---------------------------------------------------------------------------------------------
// Temp dirs and ports
// ---------------------------------------------------------------------------------------------

/// A fresh, empty directory unique to this process and call.
pub(crate) fn temp_dir(tag: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rpp-test-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// A unique temp directory removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        TempDir(temp_dir(tag))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port that was free a moment ago (callers retry on a race).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

// ---------------------------------------------------------------------------------------------
// RESP encoding and frame scanning
// ---------------------------------------------------------------------------------------------

/// One command encoded as a RESP multibulk.
pub(crate) fn resp<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Several commands, each given as a whitespace-separated string (no quoting), concatenated.
pub(crate) fn resp_cmds(cmds: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in cmds {
        let args: Vec<&str> = c.split_whitespace().collect();
        out.extend_from_slice(&resp(&args));
    }
    out
}

/// A RESP bulk string reply.
pub(crate) fn bulk(s: &[u8]) -> Vec<u8> {
    let mut out = format!("${}\r\n", s.len()).into_bytes();
    out.extend_from_slice(s);
    out.extend_from_slice(b"\r\n");
    out
}

fn scan_line(buf: &[u8], from: usize) -> Option<(usize, usize)> {
    // Returns (end of content, index after "\r\n").
    let rel = buf[from..].windows(2).position(|w| w == b"\r\n")?;
    Some((from + rel, from + rel + 2))
}

fn parse_len(buf: &[u8], start: usize, end: usize) -> i64 {
    std::str::from_utf8(&buf[start..end])
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or_else(|| {
            panic!(
                "malformed RESP length in reply stream: {:?}",
                String::from_utf8_lossy(&buf[start.saturating_sub(1)..end])
            )
        })
}

fn scan_frame(buf: &[u8], pos: usize) -> Option<usize> {
    if pos >= buf.len() {
        return None;
    }
    let (content_end, after) = scan_line(buf, pos)?;
    match buf[pos] {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(after),
        b'$' | b'!' | b'=' => {
            let n = parse_len(buf, pos + 1, content_end);
            if n < 0 {
                Some(after)
            } else {
                let end = after + n as usize + 2;
                (buf.len() >= end).then_some(end)
            }
        }
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = parse_len(buf, pos + 1, content_end);
            if n < 0 {
                return Some(after);
            }
            let elems = if matches!(buf[pos], b'%' | b'|') {
                2 * n
            } else {
                n
            };
            let mut p = after;
            for _ in 0..elems {
                p = scan_frame(buf, p)?;
            }
            if buf[pos] == b'|' {
                // An attribute decorates the reply that follows it: one frame together.
                p = scan_frame(buf, p)?;
            }
            Some(p)
        }
        other => panic!(
            "not a RESP frame (type byte {:?}) in reply stream: {:?}",
            other as char,
            String::from_utf8_lossy(&buf[pos..buf.len().min(pos + 200)])
        ),
    }
}

/// Length of the first complete RESP2/RESP3 frame in `buf`, `None` while incomplete.
pub(crate) fn frame_len(buf: &[u8]) -> Option<usize> {
    scan_frame(buf, 0)
}

/// Splits `buf` into complete frames; returns them and the number of bytes consumed.
pub(crate) fn split_frames(buf: &[u8]) -> (Vec<Vec<u8>>, usize) {
    let mut frames = Vec::new();
    let mut pos = 0;
    while let Some(end) = scan_frame(buf, pos) {
        frames.push(buf[pos..end].to_vec());
        pos = end;
    }
    (frames, pos)
}

/// Shortened printable form of bytes for assertion messages.
pub(crate) fn show(bytes: &[u8]) -> String {
    const MAX: usize = 600;
    if bytes.len() <= MAX {
        format!("{:?}", String::from_utf8_lossy(bytes))
    } else {
        format!(
            "{:?}... ({} bytes in all)",
            String::from_utf8_lossy(&bytes[..MAX]),
            bytes.len()
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Raw TCP client
// ---------------------------------------------------------------------------------------------

/// What a bounded read collected.
#[derive(Debug)]
pub(crate) struct Collected {
    pub frames: Vec<Vec<u8>>,
    /// Bytes after the last complete frame.
    pub rest: Vec<u8>,
    /// The peer closed the connection (EOF or reset).
    pub closed: bool,
}

impl Collected {
    pub(crate) fn joined(&self) -> Vec<u8> {
        let mut out = self.frames.concat();
        out.extend_from_slice(&self.rest);
        out
    }
}

/// A raw RESP connection that reads exact frames with deadlines.
pub(crate) struct Raw {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    pub(crate) async fn connect(addr: impl std::fmt::Display) -> Raw {
        let addr = addr.to_string();
        let stream = tokio::time::timeout(DEADLINE, TcpStream::connect(&addr))
            .await
            .unwrap_or_else(|_| panic!("connect to {addr} timed out"))
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        stream.set_nodelay(true).ok();
        Raw {
            stream,
            buf: Vec::new(),
        }
    }

    /// A connection from the local address `source` (a loopback address other than
    /// 127.0.0.1 gives the proxy another client address to judge).
    pub(crate) async fn connect_from(
        addr: impl std::fmt::Display,
        source: std::net::IpAddr,
    ) -> Raw {
        let addr: std::net::SocketAddr = addr.to_string().parse().expect("a socket address");
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind(std::net::SocketAddr::new(source, 0))
            .unwrap_or_else(|e| panic!("bind {source}: {e}"));
        let stream = tokio::time::timeout(DEADLINE, socket.connect(addr))
            .await
            .unwrap_or_else(|_| panic!("connect to {addr} timed out"))
            .unwrap_or_else(|e| panic!("connect to {addr} from {source}: {e}"));
        stream.set_nodelay(true).ok();
        Raw {
            stream,
            buf: Vec::new(),
        }
    }

    /// A connection attempt bounded by `within`; `None` if refused or timed out.
    pub(crate) async fn try_connect(addr: impl std::fmt::Display, within: Duration) -> Option<Raw> {
        let addr = addr.to_string();
        match tokio::time::timeout(within, TcpStream::connect(&addr)).await {
            Ok(Ok(stream)) => {
                stream.set_nodelay(true).ok();
                Some(Raw {
                    stream,
                    buf: Vec::new(),
                })
            }
            _ => None,
        }
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) {
        self.try_send(bytes).await.expect("write failed");
    }

    /// `send`, with the error of a write the peer refused (it closed the connection).
    #[allow(
        dead_code,
        reason = "not every test binary that includes common writes so"
    )]
    pub(crate) async fn try_send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        tokio::time::timeout(DEADLINE, self.stream.write_all(bytes))
            .await
            .expect("write timed out")
    }

    /// Reads more bytes into the buffer; `Ok(false)` on EOF or reset.
    async fn fill(&mut self, until: Instant) -> Result<bool, ()> {
        let mut chunk = vec![0u8; 64 * 1024];
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.stream.read(&mut chunk)).await {
            Err(_) => Err(()),
            Ok(Ok(0)) | Ok(Err(_)) => Ok(false),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
        }
    }

    fn take_frames(&mut self, max: usize, frames: &mut Vec<Vec<u8>>) {
        let mut pos = 0;
        while frames.len() < max {
            match scan_frame(&self.buf, pos) {
                Some(end) => {
                    frames.push(self.buf[pos..end].to_vec());
                    pos = end;
                }
                None => break,
            }
        }
        self.buf.drain(..pos);
    }

    /// Reads up to `n` complete frames, stopping early on EOF or after `within`.
    pub(crate) async fn collect_frames(&mut self, n: usize, within: Duration) -> Collected {
        let until = Instant::now() + within;
        let mut frames = Vec::new();
        let mut closed = false;
        loop {
            self.take_frames(n, &mut frames);
            if frames.len() >= n {
                break;
            }
            match self.fill(until).await {
                Ok(true) => {}
                Ok(false) => {
                    self.take_frames(n, &mut frames);
                    closed = true;
                    break;
                }
                Err(()) => break,
            }
        }
        Collected {
            frames,
            rest: self.buf.clone(),
            closed,
        }
    }

    /// Reads exactly `n` frames or panics (closed early or deadline passed).
    pub(crate) async fn read_frames(&mut self, n: usize) -> Vec<Vec<u8>> {
        let c = self.collect_frames(n, DEADLINE).await;
        assert!(
            c.frames.len() == n,
            "expected {n} replies, got {} (closed: {}): {}",
            c.frames.len(),
            c.closed,
            show(&c.joined())
        );
        c.frames
    }

    /// One reply frame.
    pub(crate) async fn read_frame(&mut self) -> Vec<u8> {
        self.read_frames(1).await.remove(0)
    }

    /// Sends `bytes` and returns the next `n` reply frames concatenated.
    pub(crate) async fn request(&mut self, bytes: &[u8], n: usize) -> Vec<u8> {
        self.send(bytes).await;
        self.read_frames(n).await.concat()
    }

    /// Sends one command (RESP-encoded) and returns its reply frame.
    pub(crate) async fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Vec<u8> {
        self.request(&resp(args), 1).await
    }

    /// Reads exactly `n` bytes or panics.
    pub(crate) async fn read_bytes(&mut self, n: usize) -> Vec<u8> {
        let until = Instant::now() + DEADLINE;
        while self.buf.len() < n {
            match self.fill(until).await {
                Ok(true) => {}
                Ok(false) => panic!(
                    "connection closed after {} of {n} bytes: {}",
                    self.buf.len(),
                    show(&self.buf)
                ),
                Err(()) => panic!(
                    "timed out after {} of {n} bytes: {}",
                    self.buf.len(),
                    show(&self.buf)
                ),
            }
        }
        self.buf.drain(..n).collect()
    }

    /// Everything until the peer closes; the flag is false if `within` passed first.
    pub(crate) async fn read_to_close(&mut self, within: Duration) -> (Vec<u8>, bool) {
        let until = Instant::now() + within;
        loop {
            match self.fill(until).await {
                Ok(true) => {}
                Ok(false) => return (std::mem::take(&mut self.buf), true),
                Err(()) => return (std::mem::take(&mut self.buf), false),
            }
        }
    }

    /// Asserts nothing more arrives within `within` (used only after a reply that must be
    /// the last one, never as a readiness check).
    pub(crate) async fn assert_quiet(&mut self, within: Duration) {
        let until = Instant::now() + within;
        let _ = self.fill(until).await;
        assert!(
            self.buf.is_empty(),
            "unexpected extra bytes: {}",
            show(&self.buf)
        );
    }
}

/// `n` clients connected to `addr`, each running `work(index, client)` at the same moment
/// (a barrier once all are connected); their results, in client order.
pub(crate) async fn all_at_once<T, F, Fut>(
    addr: impl std::fmt::Display,
    n: usize,
    work: F,
) -> Vec<T>
where
    F: Fn(usize, Raw) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(Raw::connect(&addr).await);
    }
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let (start, job) = (start.clone(), work(i, c));
            tokio::spawn(async move {
                start.wait().await;
                job.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("client task"));
    }
    out
}

/// Sends `input` on a fresh connection and reads `n` frames.
pub(crate) async fn exchange(addr: impl std::fmt::Display, input: &[u8], n: usize) -> Vec<u8> {
    let mut c = Raw::connect(addr).await;
    c.request(input, n).await
}

/// Sends `input` on a fresh connection and reads until the server closes it.
pub(crate) async fn exchange_until_close(addr: impl std::fmt::Display, input: &[u8]) -> Vec<u8> {
    let mut c = Raw::connect(addr).await;
    c.send(input).await;
    let (bytes, closed) = c.read_to_close(DEADLINE).await;
    assert!(
        closed,
        "connection not closed within {DEADLINE:?}; got {}",
        show(&bytes)
    );
    bytes
}

/// Sends `input`, closes the writing half (EOF, as `nc -q0` or a client that exits does) and
/// reads everything until the server closes, within the deadline.
pub(crate) async fn exchange_half_closed(addr: impl std::fmt::Display, input: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr.to_string()).await.expect("connect");
    s.write_all(input).await.expect("write");
    s.shutdown().await.expect("half-close");
    let mut out = Vec::new();
    tokio::time::timeout(DEADLINE, s.read_to_end(&mut out))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "not closed within {DEADLINE:?} after EOF; input {}",
                show(input)
            )
        })
        .ok();
    out
}

/// Sends a big request and reads `n` frames concurrently, as real pipelining clients do (a
/// client that writes everything before reading can deadlock against any backpressure).
/// Stops early on EOF or after three deadlines.
pub(crate) async fn pipeline(addr: impl std::fmt::Display, input: Vec<u8>, n: usize) -> Collected {
    let c = Raw::connect(addr).await;
    let (mut rd, mut wr) = c.stream.into_split();
    let writer = tokio::spawn(async move {
        let r = wr.write_all(&input).await;
        (r, wr)
    });
    let until = Instant::now() + DEADLINE * 3;
    let mut buf = Vec::new();
    let mut frames = Vec::new();
    let mut closed = false;
    let mut chunk = vec![0u8; 256 * 1024];
    while frames.len() < n {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rd.read(&mut chunk)).await {
            Err(_) => break,
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            Ok(Ok(k)) => {
                buf.extend_from_slice(&chunk[..k]);
                let mut pos = 0;
                while frames.len() < n {
                    match scan_frame(&buf, pos) {
                        Some(end) => {
                            frames.push(buf[pos..end].to_vec());
                            pos = end;
                        }
                        None => break,
                    }
                }
                buf.drain(..pos);
            }
        }
    }
    writer.abort();
    Collected {
        frames,
        rest: buf,
        closed,
    }
}

// ---------------------------------------------------------------------------------------------
// redis-server fixture
// ---------------------------------------------------------------------------------------------

/// The server binary every fixture starts (`RedisServer`, `RedisCluster`, `SentinelSetup`):
/// the path in `RPP_REDIS_SERVER` if set and not empty, else `redis-server` from `PATH`
/// (Debian's 7.0.15 on CI). A Valkey binary takes the same arguments, so
/// `RPP_REDIS_SERVER=$CACHE/valkey-9.1/bin/valkey-server cargo test` runs the tests in front
/// of it (docs/compatibility.md; `scripts/build-servers.sh` builds the matrix's servers).
pub(crate) fn server_binary() -> PathBuf {
    match std::env::var_os("RPP_REDIS_SERVER") {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => PathBuf::from("redis-server"),
    }
}

// ---------------------------------------------------------------------------------------------
// The server matrix (docs/compatibility.md)
// ---------------------------------------------------------------------------------------------

/// The newer servers of the matrix, as `scripts/build-servers.sh` names them, and the binary
/// each has under its directory of the cache.
pub(crate) const MATRIX: &[(&str, &str)] = &[
    ("redis-8.0", "bin/redis-server"),
    ("valkey-9.1", "bin/valkey-server"),
];

/// Where `scripts/build-servers.sh` puts the servers it builds: `RPP_SERVER_CACHE`, else
/// `$XDG_CACHE_HOME/redis-policy-proxy/servers`, else `~/.cache/redis-policy-proxy/servers`
/// (the script's own rule).
pub(crate) fn server_cache() -> PathBuf {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = set("RPP_SERVER_CACHE") {
        return PathBuf::from(dir);
    }
    let cache = set("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("redis-policy-proxy/servers")
}

/// `RPP_SERVER_MATRIX=require` (set by `.ci/run` once `scripts/build-servers.sh` succeeded):
/// a matrix server that is not built fails the test instead of skipping it.
pub(crate) fn matrix_required() -> bool {
    std::env::var("RPP_SERVER_MATRIX").as_deref() == Ok("require")
}

/// The matrix's servers that are built in [`server_cache`]: `(name, binary)`, in [`MATRIX`]
/// order. One that is missing fails the calling test under `RPP_SERVER_MATRIX=require`;
/// otherwise it is left out with a `SKIPPED: <name> not built (scripts/build-servers.sh)` line
/// on stderr, so a local `cargo test` without them still passes and says what it did not run.
pub(crate) fn matrix_servers() -> Vec<(&'static str, PathBuf)> {
    let cache = server_cache();
    let mut found = Vec::new();
    for &(name, rel) in MATRIX {
        let bin = cache.join(name).join(rel);
        if is_executable(&bin) {
            found.push((name, bin));
        } else if matrix_required() {
            panic!(
                "{name} is not built ({} missing) although RPP_SERVER_MATRIX=require \
                 (run scripts/build-servers.sh; RPP_SERVER_CACHE names the cache)",
                bin.display()
            );
        } else {
            eprintln!("SKIPPED: {name} not built (scripts/build-servers.sh)");
        }
    }
    found
}

/// One server of the matrix by name, under the same rule as [`matrix_servers`]: `None` (after
/// the `SKIPPED` line) when it is not built and not required.
pub(crate) fn matrix_server(name: &str) -> Option<PathBuf> {
    let &(name, rel) = MATRIX
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("{name} is not a server of the matrix"));
    let bin = server_cache().join(name).join(rel);
    if is_executable(&bin) {
        return Some(bin);
    }
    assert!(
        !matrix_required(),
        "{name} is not built ({} missing) although RPP_SERVER_MATRIX=require \
         (run scripts/build-servers.sh; RPP_SERVER_CACHE names the cache)",
        bin.display()
    );
    eprintln!("SKIPPED: {name} not built (scripts/build-servers.sh)");
    None
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A real `redis-server` on a free loopback port, killed on drop.
pub(crate) struct RedisServer {
    pub port: u16,
    /// The binary it was started from (restarts use the same).
    bin: PathBuf,
    dir: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    /// Password to send before readiness PINGs are answered, if `--requirepass` was given.
    password: Option<String>,
}

impl RedisServer {
    pub(crate) fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts with extra `redis-server` arguments, e.g. `["--requirepass", "secret"]`.
    pub(crate) fn start_with(args: &[&str]) -> RedisServer {
        Self::start_binary(&server_binary(), args)
    }

    /// Starts `bin` (a `redis-server` or `valkey-server` of the server matrix, see
    /// [`matrix_servers`]) with extra arguments, whatever `RPP_REDIS_SERVER` says.
    pub(crate) fn start_binary(bin: &Path, args: &[&str]) -> RedisServer {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let password = args
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| args.get(i + 1).cloned());
        let mut last_err = String::new();
        for _ in 0..8 {
            // A directory of its own each try: a failed try's server is dropped, and the
            // drop removes its directory (retries once shared it, so one lost port race
            // made every later try fail on a missing `--dir`).
            let dir = temp_dir("redis");
            let mut server = RedisServer {
                port: free_port(),
                bin: bin.to_path_buf(),
                log: dir.join("redis.log"),
                dir,
                args: args.clone(),
                child: None,
                password: password.clone(),
            };
            match server.spawn(Instant::now() + DEADLINE) {
                Ok(()) => return server,
                Err(e) => last_err.push_str(&format!("\n  {e}")),
            }
        }
        panic!("could not start {}:{last_err}", bin.display());
    }

    /// The binary this server runs.
    pub(crate) fn binary(&self) -> &Path {
        &self.bin
    }

    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn log_len(&self) -> usize {
        std::fs::read(&self.log).map(|b| b.len()).unwrap_or(0)
    }

    fn spawn(&mut self, until: Instant) -> Result<(), String> {
        let log_start = self.log_len();
        let stderr_path = self.dir.join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|e| format!("create {}: {e}", stderr_path.display()))?;
        let mut child = Command::new(&self.bin)
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&self.log)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.bin.display()))?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read(&self.log).unwrap_or_default();
                // Configuration errors go to stderr, not the log file.
                let stderr = std::fs::read(&stderr_path).unwrap_or_default();
                return Err(format!(
                    "redis-server on port {} exited ({status}): {}{}",
                    self.port,
                    String::from_utf8_lossy(&log[log_start.min(log.len())..]),
                    String::from_utf8_lossy(&stderr)
                ));
            }
            let log = std::fs::read(&self.log).unwrap_or_default();
            let fresh = &log[log_start.min(log.len())..];
            let ready = fresh
                .windows(b"Ready to accept connections".len())
                .any(|w| w == b"Ready to accept connections");
            if ready && self.answers_ping() {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > until {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "redis-server on port {} not ready within deadline",
                    self.port
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// A blocking PING; an auth error also proves the server is up.
    fn answers_ping(&self) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(n) if n > 0 => buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"),
            _ => false,
        }
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    /// Sends `signal` (e.g. `-STOP`, `-CONT`) to the server process.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("server running")
            .id()
            .to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty dataset), retrying while the port is
    /// still busy, within the deadline.
    pub(crate) fn restart(&mut self) {
        self.kill();
        let until = Instant::now() + DEADLINE;
        let mut last_err = String::new();
        while Instant::now() < until {
            match self.spawn(until) {
                Ok(()) => return,
                Err(e) => last_err = e,
            }
            std::thread::sleep(POLL);
        }
        panic!(
            "could not restart redis-server on port {}: {last_err}",
            self.port
        );
    }

    /// A raw connection straight to Redis (authenticated if a password was configured).
    pub(crate) async fn raw(&self) -> Raw {
        let mut c = Raw::connect(self.addr()).await;
        if let Some(p) = &self.password {
            let r = c.call(&["AUTH", p]).await;
            assert_eq!(r, b"+OK\r\n", "direct AUTH failed");
        }
        c
    }

    /// Runs one command directly against Redis and returns the reply frame.
    pub(crate) async fn direct(&self, args: &[&str]) -> Vec<u8> {
        self.raw().await.call(args).await
    }

    /// `calls` of `cmdstat_<name>` in Redis's INFO commandstats (0 before the first).
    pub(crate) async fn command_calls(&self, name: &str) -> u64 {
        let info = self.direct(&["INFO", "commandstats"]).await;
        let prefix = format!("cmdstat_{name}:calls=");
        String::from_utf8_lossy(&info)
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }

    /// A `redis` crate connection straight to Redis.
    pub(crate) async fn conn(&self) -> redis::aio::MultiplexedConnection {
        let url = match &self.password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}/", self.port),
            None => self.url(),
        };
        connect(&url).await
    }

    /// Polls Redis's `INFO clients` until `blocked_clients` reaches `n`, within the deadline.
    pub(crate) async fn wait_blocked_clients(&self, n: usize) {
        let until = Instant::now() + DEADLINE;
        let mut c = self.raw().await;
        loop {
            let info = c.call(&["INFO", "clients"]).await;
            let text = String::from_utf8_lossy(&info).to_string();
            let blocked = text
                .lines()
                .find_map(|l| l.strip_prefix("blocked_clients:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if blocked >= n {
                return;
            }
            assert!(
                Instant::now() < until,
                "blocked_clients did not reach {n} within {DEADLINE:?}: {text}"
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// Proxy fixture
// ---------------------------------------------------------------------------------------------

/// `GET path` over HTTP/1.1 (the admin endpoint): status code and body.
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr)
        .await
        .expect("connect to admin endpoint");
    let request = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(DEADLINE, s.read_to_end(&mut out))
        .await
        .expect("admin endpoint answered in time")
        .unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

/// The value of one sample in a Prometheus text exposition (`name{labels}` exactly as
/// rendered), 0 when absent.
pub(crate) fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// A configuration pointing at `upstream` with defaults otherwise.
pub(crate) fn config_for(upstream: &str) -> Config {
    let mut config = Config::default();
    config.set_upstream(upstream.to_string());
    config
}

/// The proxy served by `redis_policy_proxy::run` on the test's runtime.
pub(crate) struct Proxy {
    pub addr: SocketAddr,
    /// The admin endpoint (/metrics, /healthz, /readyz), on its own free port.
    pub admin: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Proxy {
    /// Binds 127.0.0.1:0, runs the proxy with `config` and waits until it serves both
    /// protocols (a fresh connection answers `PING` and `HELLO 3`), like `RedisServer::start`
    /// waits for PING. Needs a reachable upstream; see `spawn` otherwise.
    pub(crate) async fn start(config: Config) -> Proxy {
        let proxy = Proxy::spawn(config).await;
        proxy.wait_ready().await;
        proxy
    }

    /// Polls fresh connections until `PING` gets `+PONG` and `HELLO 3` a map, within the
    /// deadline.
    pub(crate) async fn wait_ready(&self) {
        let addr = self.addr;
        let until = Instant::now() + DEADLINE;
        let mut last = Vec::new();
        loop {
            if let Some(mut c) = Raw::try_connect(addr, DEADLINE).await {
                c.send(b"PING\r\nHELLO 3\r\n").await;
                let got = c.collect_frames(2, DEADLINE).await;
                if got.frames.len() == 2
                    && got.frames[0] == b"+PONG\r\n"
                    && got.frames[1].starts_with(b"%")
                {
                    return;
                }
                last = got.joined();
            }
            assert!(
                Instant::now() < until,
                "proxy at {addr} not ready within {DEADLINE:?}; last answer {}",
                show(&last)
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Binds 127.0.0.1:0 and runs the proxy with `config` without waiting for readiness (its
    /// `listen` is set to the bound address for consistency; the listener is what counts).
    pub(crate) async fn spawn(mut config: Config) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let admin_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind admin");
        let admin = admin_listener.local_addr().unwrap();
        config.set_listen(addr.to_string());
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = rx.await;
        };
        let task = tokio::spawn(redis_policy_proxy::run_with_admin(
            listener,
            admin_listener,
            config,
            shutdown,
        ));
        Proxy {
            addr,
            admin,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// A proxy in front of `redis` with the default configuration.
    pub(crate) async fn to(redis: &RedisServer) -> Proxy {
        Proxy::start(config_for(&redis.addr())).await
    }

    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// Resolves the shutdown future; the proxy starts draining.
    pub(crate) fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Waits (bounded) for `run` to return and hands back its result.
    pub(crate) async fn wait_stopped(&mut self) -> std::io::Result<()> {
        let task = self.task.take().expect("proxy already stopped");
        match tokio::time::timeout(DEADLINE * 2, task).await {
            Err(_) => panic!(
                "proxy did not stop within {:?} after shutdown",
                DEADLINE * 2
            ),
            Ok(Err(join)) => panic!("proxy task failed: {join}"),
            Ok(Ok(result)) => result,
        }
    }

    /// Whether `run` has returned.
    pub(crate) fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Shuts down and asserts `run` returned `Ok`.
    pub(crate) async fn stop(mut self) {
        self.begin_shutdown();
        self.wait_stopped()
            .await
            .expect("proxy run() returned an error");
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.begin_shutdown();
    }
}

/// A fresh Redis reached directly, and a second fresh Redis behind the proxy: the same input
/// sent to both must produce the same bytes (the transparency check).
pub(crate) struct Pair {
    pub direct: RedisServer,
    pub upstream: RedisServer,
    pub proxy: Proxy,
}

impl Pair {
    pub(crate) async fn start() -> Pair {
        Self::start_with(&[]).await
    }

    pub(crate) async fn start_with(redis_args: &[&str]) -> Pair {
        let direct = RedisServer::start_with(redis_args);
        let upstream = RedisServer::start_with(redis_args);
        let proxy = Proxy::to(&upstream).await;
        Pair {
            direct,
            upstream,
            proxy,
        }
    }

    /// Sends `input` to both on fresh connections, reads `n` frames from each, asserts the
    /// bytes are identical and returns them.
    pub(crate) async fn compare(&self, input: &[u8], n: usize) -> Vec<u8> {
        let want = exchange(self.direct.addr(), input, n).await;
        let got = exchange(self.proxy.addr, input, n).await;
        assert!(
            got == want,
            "proxy reply differs from Redis for input {}\n redis: {}\n proxy: {}",
            show(input),
            show(&want),
            show(&got)
        );
        got
    }

    /// Like `compare`, for inputs after which the server closes the connection.
    /// Like `compare_until_close`, with the client's EOF right after `input`.
    pub(crate) async fn compare_half_closed(&self, input: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let want = exchange_half_closed(self.direct.addr(), input).await;
        let got = exchange_half_closed(self.proxy.addr, input).await;
        (want, got)
    }

    pub(crate) async fn compare_until_close(&self, input: &[u8]) -> Vec<u8> {
        let want = exchange_until_close(self.direct.addr(), input).await;
        let got = exchange_until_close(self.proxy.addr, input).await;
        assert!(
            got == want,
            "proxy reply differs from Redis for input {}\n redis: {}\n proxy: {}",
            show(input),
            show(&want),
            show(&got)
        );
        got
    }
}

/// One step of a scripted multi-connection conversation: send `send` (may be empty) on
/// connection `conn`, then read `replies` frames from it.
pub(crate) struct Step {
    pub conn: usize,
    pub send: Vec<u8>,
    pub replies: usize,
}

pub(crate) fn step(conn: usize, send: impl AsRef<[u8]>, replies: usize) -> Step {
    Step {
        conn,
        send: send.as_ref().to_vec(),
        replies,
    }
}

/// Runs `steps` against `addr` (connections opened on first use, in order) and returns the
/// replies of each step, with HELLO's connection `id` masked.
pub(crate) async fn transcript(addr: impl std::fmt::Display, steps: &[Step]) -> Vec<Vec<u8>> {
    let addr = addr.to_string();
    let mut conns: Vec<Raw> = Vec::new();
    let mut out = Vec::new();
    for s in steps {
        while conns.len() <= s.conn {
            conns.push(Raw::connect(&addr).await);
        }
        let c = &mut conns[s.conn];
        if !s.send.is_empty() {
            c.send(&s.send).await;
        }
        let got = c.read_frames(s.replies).await.concat();
        out.push(mask_ids(&got));
    }
    out
}

/// Replaces the value of every `id` field of a HELLO reply (`$2\r\nid\r\n:N\r\n`) with
/// `:<id>`: connection ids differ between any two connections, so they are not compared.
pub(crate) fn mask_ids(bytes: &[u8]) -> Vec<u8> {
    const KEY: &[u8] = b"$2\r\nid\r\n:";
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(KEY) {
            out.extend_from_slice(KEY);
            i += KEY.len();
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            out.extend_from_slice(b"<id>");
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

impl Pair {
    /// Runs the same scripted conversation against direct Redis and through the proxy and
    /// asserts every step's replies are byte-identical. Returns the proxy's transcript.
    pub(crate) async fn compare_steps(&self, steps: &[Step]) -> Vec<Vec<u8>> {
        let want = transcript(self.direct.addr(), steps).await;
        let got = transcript(self.proxy.addr, steps).await;
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert!(
                w == g,
                "step {i} (conn {}, sent {}) differs\n redis: {}\n proxy: {}",
                steps[i].conn,
                show(&steps[i].send),
                show(w),
                show(g)
            );
        }
        got
    }
}

// ---------------------------------------------------------------------------------------------
// redis crate connections
// ---------------------------------------------------------------------------------------------

fn async_config() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(DEADLINE))
        .set_response_timeout(Some(DEADLINE))
}

/// A multiplexed `redis` crate connection for `url` (RESP2 unless the URL says otherwise).
pub(crate) async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("bad url {url}: {e}"));
    client
        .get_multiplexed_async_connection_with_config(&async_config())
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

/// A RESP3 multiplexed connection whose push frames arrive on the returned channel.
pub(crate) async fn connect_resp3(
    url: &str,
) -> (
    redis::aio::MultiplexedConnection,
    tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
) {
    let url = if url.contains('?') {
        format!("{url}&protocol=resp3")
    } else {
        format!("{url}?protocol=resp3")
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let client = redis::Client::open(url.as_str()).unwrap_or_else(|e| panic!("bad url {url}: {e}"));
    let con = client
        .get_multiplexed_async_connection_with_config(&async_config().set_push_sender(tx))
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    (con, rx)
}

/// Receives the next push of `kind` within the deadline, skipping others.
pub(crate) async fn next_push(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
    kind: redis::PushKind,
) -> redis::PushInfo {
    let until = Instant::now() + DEADLINE;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let push = tokio::time::timeout(left, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no {kind:?} push within {DEADLINE:?}"))
            .unwrap_or_else(|| panic!("push channel closed while waiting for {kind:?}"));
        if push.kind == kind {
            return push;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// redis-cli subprocesses
// ---------------------------------------------------------------------------------------------

/// Output of a finished `redis-cli`.
pub(crate) struct CliOutput {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `redis-cli -h 127.0.0.1 -p PORT ARGS...` with `stdin`, bounded by the deadline.
pub(crate) async fn redis_cli_with_stdin(port: u16, args: &[&str], stdin: &[u8]) -> CliOutput {
    let mut child = tokio::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn redis-cli");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let feeder = tokio::spawn(async move {
        let _ = input.write_all(&data).await;
        drop(input);
    });
    let out = tokio::time::timeout(DEADLINE * 2, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("redis-cli {args:?} did not finish in time"))
        .expect("redis-cli output");
    let _ = feeder.await;
    CliOutput {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `redis-cli` with empty stdin.
pub(crate) async fn redis_cli(port: u16, args: &[&str]) -> CliOutput {
    redis_cli_with_stdin(port, args, b"").await
}

/// A long-running `redis-cli` (MONITOR, SUBSCRIBE) whose stdout is read line by line.
pub(crate) struct CliProcess {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl CliProcess {
    pub(crate) fn spawn(port: u16, args: &[&str]) -> CliProcess {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn redis-cli");
        let stdout = child.stdout.take().unwrap();
        CliProcess {
            child,
            lines: tokio::io::BufReader::new(stdout).lines(),
        }
    }

    /// The next stdout line, or panic at the deadline / EOF.
    pub(crate) async fn next_line(&mut self) -> String {
        tokio::time::timeout(DEADLINE, self.lines.next_line())
            .await
            .expect("no output line from redis-cli within deadline")
            .expect("reading redis-cli output")
            .expect("redis-cli exited")
    }

    /// Reads lines until one satisfies `pred`; returns all lines read.
    pub(crate) async fn read_until(&mut self, pred: impl Fn(&str) -> bool) -> Vec<String> {
        let until = Instant::now() + DEADLINE;
        let mut seen = Vec::new();
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let line = tokio::time::timeout(left, self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("expected line not seen in time; got {seen:?}"))
                .expect("reading redis-cli output")
                .unwrap_or_else(|| panic!("redis-cli exited; output was {seen:?}"));
            let hit = pred(&line);
            seen.push(line);
            if hit {
                return seen;
            }
        }
    }

    pub(crate) async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Polls until `probe` returns true, within the deadline; panics with `what` otherwise.
pub(crate) async fn wait_until<F, Fut>(what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + DEADLINE;
    loop {
        if probe().await {
            return;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Writes `text` to `dir/name` and returns the path.
pub(crate) fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write file");
    p
}

/// A randomised test's seed: `var` when set to a number, else from the clock, below
/// `modulus` (short enough to type back into `var`).
pub(crate) fn env_or_clock_seed(var: &str, modulus: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 % modulus)
        })
}

/// A small deterministic PRNG (xorshift64*): randomised tests draw the same inputs on every
/// run, so a failure reproduces.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The line `policy/default.yaml` starts its data-changing rules (ttl-default,
/// streams-capped) with: audit mode, for a safe rollout.
pub(crate) const ROLLOUT_AUDIT: &str =
    "    mode: audit  # changes data: enforce it after the rollout (README.md, Deployment)\n";

/// `policy/default.yaml` with its data-changing rules switched to enforce, as after the
/// rollout: what most policy tests exercise.
pub(crate) fn default_policy_enforced() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let text = std::fs::read_to_string(path).expect("read policy/default.yaml");
    assert_eq!(
        text.matches(ROLLOUT_AUDIT).count(),
        2,
        "default.yaml's rollout lines"
    );
    text.replace(ROLLOUT_AUDIT, "    mode: enforce\n")
}

/// `alicepw`'s SHA-256, for `access.users` of the two-tenant fixtures.
pub(crate) const ALICE_SHA256: &str =
    "6624974ea2baffac164422e4490376c1c31313cd97724ae8ce62fb3f0a0370f2";
/// `bobpw`'s SHA-256.
pub(crate) const BOB_SHA256: &str =
    "e8f318657ce39ec4edeecbbee28fd72dea2261d8a6b2155ce4977393e0ea721b";

/// A proxy in front of `redis` with two namespaced tenants and `require_auth`: `alice`
/// (password `alicepw`) is tenant `a` under `a:`, `bob` (`bobpw`) tenant `b` under `b:`;
/// returned once alice can log in, with both clients logged in.
pub(crate) async fn two_tenants(redis: &RedisServer) -> (Proxy, Raw, Raw) {
    let yaml = format!(
        "access:\n  require_auth: true\n  users:\n    - {{name: alice, password_sha256: {ALICE_SHA256}}}\n    - {{name: bob, password_sha256: {BOB_SHA256}}}\n  identities:\n    - {{tenant: a, user: alice}}\n    - {{tenant: b, user: bob}}\n  namespaces:\n    a: 'a:'\n    b: 'b:'\n"
    );
    let mut config = redis_policy_proxy::setup::from_yaml(&yaml, Path::new("ns.yaml")).unwrap();
    config.set_upstream(redis.addr());
    let proxy = Proxy::spawn(config).await;
    let addr = proxy.addr;
    wait_until("the proxy serves", || async move {
        match Raw::try_connect(addr, DEADLINE).await {
            Some(mut c) => c.call(&["AUTH", "alice", "alicepw"]).await == b"+OK\r\n",
            None => false,
        }
    })
    .await;
    let mut a = Raw::connect(proxy.addr).await;
    let mut b = Raw::connect(proxy.addr).await;
    assert_eq!(a.call(&["AUTH", "alice", "alicepw"]).await, b"+OK\r\n");
    assert_eq!(b.call(&["AUTH", "bob", "bobpw"]).await, b"+OK\r\n");
    (proxy, a, b)
}

/// Runs `python3 ARGS…` (a script of tests/clients/ driving redis-py, which `.ci/run`
/// installs) and gives its stdout; a failed run fails the test with its output.
pub(crate) async fn redis_py(args: &[&str]) -> String {
    let out = tokio::process::Command::new("python3")
        .args(args)
        .output()
        .await
        .expect("python3 (with redis-py: pip install redis) is needed for this test");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "python3 {args:?} failed (redis-py installed? `python3 -m pip install redis`): {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The guide's patterns that every server must serve through the proxy at `proxy`: a
/// sliding-window rate limit in Lua over a sorted set, a stream read by a consumer group, a
/// message published to a subscriber. `name` labels a failure (the server behind the proxy).
pub(crate) async fn guide_patterns(c: &mut Raw, proxy: SocketAddr, name: &str) {
    let window = "redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1] - 60000) \
                  local n = redis.call('ZCARD', KEYS[1]) \
                  if n < 10 then redis.call('ZADD', KEYS[1], ARGV[1], ARGV[1]) \
                  redis.call('PEXPIRE', KEYS[1], 60000) return 1 end return 0";
    assert_eq!(
        c.call(&["EVAL", window, "1", "ratelimit:u1", "1000"]).await,
        b":1\r\n",
        "{name}"
    );
    assert_eq!(
        c.call(&["XGROUP", "CREATE", "events", "g", "$", "MKSTREAM"])
            .await,
        b"+OK\r\n",
        "{name}"
    );
    let added = c.call(&["XADD", "events", "*", "type", "signup"]).await;
    assert!(added.starts_with(b"$"), "{name}: {added:?}");
    let read = c
        .call(&[
            "XREADGROUP",
            "GROUP",
            "g",
            "c1",
            "COUNT",
            "10",
            "STREAMS",
            "events",
            ">",
        ])
        .await;
    let read = String::from_utf8_lossy(&read);
    assert!(read.contains("signup"), "{name}: {read}");
    let mut sub = Raw::connect(proxy).await;
    sub.send(b"SUBSCRIBE news\r\n").await;
    assert_eq!(
        sub.collect_frames(1, DEADLINE).await.joined(),
        b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n",
        "{name}"
    );
    assert_eq!(c.call(&["PUBLISH", "news", "hi"]).await, b":1\r\n");
    assert_eq!(
        sub.collect_frames(1, DEADLINE).await.joined(),
        b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$2\r\nhi\r\n",
        "{name}"
    );
}

/// Loads the function library `spin` (`FCALL spin 0` loops until killed), for the tests of
/// busy scripts and FUNCTION KILL.
pub(crate) async fn load_spin_function(c: &mut Raw) {
    let load = c
        .call(&[
            "FUNCTION",
            "LOAD",
            "REPLACE",
            "#!lua name=spin\nredis.register_function('spin', function() while true do end end)",
        ])
        .await;
    assert_eq!(load, b"$4\r\nspin\r\n", "FUNCTION LOAD spin");
}
