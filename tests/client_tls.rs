//! TLS from clients: the proxy's own certificate, client certificates naming the user, bad
//! clients closed with a reason, certificate reload. Real redis-cli (`--tls`), redis-py
//! (`ssl=True`) and a rustls client against a real redis-server behind the proxy.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{DEADLINE, Proxy, RedisServer, free_port, http_get, redis_cli, sample, temp_dir};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// A CA and what it signs, written as PEM files into a test directory.
struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    /// A CA (`<name>-ca.pem`) in `dir`.
    fn new(dir: &Path, name: &str) -> Pki {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join(format!("{name}-ca.pem")), cert.pem()).unwrap();
        Pki {
            dir: dir.to_path_buf(),
            issuer: Issuer::new(params, key),
        }
    }

    /// `<file>.pem` and `<file>.key`: a certificate with subject CN `cn` and `sans`, valid
    /// now unless `expired`.
    fn issue(&self, file: &str, cn: &str, sans: &[&str], expired: bool) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        if expired {
            params.not_before = rcgen::date_time_ymd(2001, 1, 1);
            params.not_after = rcgen::date_time_ymd(2002, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (pem, k) = (
            self.dir.join(format!("{file}.pem")),
            self.dir.join(format!("{file}.key")),
        );
        std::fs::write(&pem, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (pem, k)
    }
}

/// The files one test uses: the server's CA and certificate, the client CA and clients.
struct Files {
    dir: PathBuf,
    server: Pki,
    clients: Pki,
}

fn files(tag: &str) -> Files {
    let dir = temp_dir(tag);
    let server = Pki::new(&dir, "server");
    server.issue("proxy", "proxy", &["localhost", "127.0.0.1"], false);
    let clients = Pki::new(&dir, "client");
    Files {
        dir,
        server,
        clients,
    }
}

impl Files {
    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// The proxy's configuration: `tls_yaml` is the `tls:` section's extra lines, `rest` more
/// top-level YAML.
fn config(
    redis: &RedisServer,
    f: &Files,
    tls_yaml: &str,
    rest: &str,
) -> redis_policy_proxy::Config {
    let yaml = format!(
        "upstream:\n  address: {}\ntls:\n  cert_file: {}\n  key_file: {}\n{tls_yaml}{rest}",
        redis.addr(),
        f.path("proxy.pem"),
        f.path("proxy.key"),
    );
    redis_policy_proxy::setup::from_yaml(&yaml, Path::new("client-tls.yaml")).unwrap()
}

/// A rustls client trusting the test's server CA, with a client certificate if given.
fn connector(f: &Files, client: Option<(&Path, &Path)>) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(f.dir.join("server-ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((pem, key)) => {
            let chain: Vec<_> = CertificateDer::pem_file_iter(pem)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_file(key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    TlsConnector::from(Arc::new(config))
}

/// Sends `request` over TLS to `port` and reads until `expect` bytes came or the stream
/// ended; `Err` when the handshake failed.
async fn tls_exchange(
    connector: &TlsConnector,
    port: u16,
    request: &[u8],
    expect: usize,
) -> std::io::Result<Vec<u8>> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = tokio::time::timeout(DEADLINE, connector.connect(name, tcp))
        .await
        .expect("handshake ended in time")?;
    tls.write_all(request).await?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < expect {
        let n = tokio::time::timeout(DEADLINE, tls.read(&mut buf))
            .await
            .expect("reply in time")?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(out)
}

/// Polls until a TLS `PING` to `port` is answered, within the deadline (the plain readiness
/// check of `Proxy::start` does not apply to a TLS-only or password-protected port).
async fn wait_tls_ready(connector: &TlsConnector, port: u16) {
    let until = std::time::Instant::now() + DEADLINE;
    while tls_exchange(connector, port, b"PING\r\n", 7)
        .await
        .map_or(true, |r| r != b"+PONG\r\n")
    {
        assert!(std::time::Instant::now() < until, "no TLS PONG on {port}");
        tokio::time::sleep(common::POLL).await;
    }
}

/// Polls `/metrics` until `series` reaches `at_least`, within the deadline.
async fn wait_metric(proxy: &Proxy, series: &str, at_least: f64) -> String {
    let until = std::time::Instant::now() + DEADLINE;
    loop {
        let (_, text) = http_get(proxy.admin, "/metrics").await;
        if sample(&text, series) >= at_least {
            return text;
        }
        assert!(
            std::time::Instant::now() < until,
            "{series} stayed below {at_least}:\n{text}"
        );
        tokio::time::sleep(common::POLL).await;
    }
}

fn handshakes(outcome: &str) -> String {
    format!("rpp_tls_handshakes_total{{outcome=\"{outcome}\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_and_redis_py_work_over_tls_beside_plaintext() {
    let redis = RedisServer::start();
    let f = files("client-tls");
    let tls_port = free_port();
    let proxy = Proxy::start(config(
        &redis,
        &f,
        &format!("  listen: 127.0.0.1:{tls_port}\n"),
        "",
    ))
    .await;
    let ca = f.path("server-ca.pem");
    let tls = ["--tls", "--cacert", &ca, "--sni", "localhost"];
    let out = redis_cli(tls_port, &[&tls[..], &["SET", "tls:cli", "v"]].concat()).await;
    assert_eq!(out.stdout.trim(), "OK", "{}", out.stderr);
    let out = redis_cli(tls_port, &[&tls[..], &["GET", "tls:cli"]].concat()).await;
    assert_eq!(out.stdout.trim(), "v", "{}", out.stderr);
    // Plaintext stays on `listen`.
    let out = redis_cli(proxy.port(), &["GET", "tls:cli"]).await;
    assert_eq!(out.stdout.trim(), "v");
    let script = format!(
        "import redis\n\
         r = redis.Redis(host='localhost', port={tls_port}, ssl=True, ssl_ca_certs='{ca}')\n\
         r.set('tls:py', 'p')\n\
         print(r.get('tls:py').decode())\n\
         r3 = redis.Redis(host='localhost', port={tls_port}, ssl=True, ssl_ca_certs='{ca}', protocol=3)\n\
         print(r3.hgetall('nothing'))\n"
    );
    let out = tokio::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .await
        .expect("python3 with redis-py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "p\n{}\n");
    assert_eq!(redis.direct(&["GET", "tls:py"]).await, b"$1\r\np\r\n");
    // A pipeline larger than one TLS record comes back whole and in order.
    let mut pipeline = Vec::new();
    for i in 0..2000 {
        pipeline.extend_from_slice(format!("SET tls:p{i} {i}\r\nGET tls:p{i}\r\n").as_bytes());
    }
    let mut expected = Vec::new();
    for i in 0..2000 {
        let v = i.to_string();
        expected.extend_from_slice(format!("+OK\r\n${}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let got = tls_exchange(&connector(&f, None), tls_port, &pipeline, expected.len())
        .await
        .unwrap();
    assert_eq!(got, expected);
    wait_metric(&proxy, &handshakes("ok"), 5.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_names_the_user_and_its_tenant() {
    let redis = RedisServer::start();
    let f = files("client-mtls");
    let (svc_pem, svc_key) = f.clients.issue("billing", "billing-svc", &[], false);
    let (san_pem, san_key) = f
        .clients
        .issue("reports", "not-listed", &["reports.internal"], false);
    let (other_pem, other_key) = f.clients.issue("other", "somebody", &[], false);
    let tls_port = free_port();
    let proxy = Proxy::spawn(config(
        &redis,
        &f,
        &format!(
            "  listen: 127.0.0.1:{tls_port}\n  client_ca_file: {}\n  client_certs: optional\n",
            f.path("client-ca.pem")
        ),
        "access:\n  require_auth: true\n  cert_users: [billing-svc, reports.internal]\n  identities:\n    - tenant: billing\n      user: billing-svc\n    - tenant: reports\n      user: reports.internal\n  namespaces:\n    billing: \"bill:\"\n    reports: \"rep:\"\n",
    ))
    .await;
    // PING is refused without AUTH, but the certificate's user needs none.
    wait_tls_ready(&connector(&f, Some((&svc_pem, &svc_key))), tls_port).await;
    let ca = f.path("server-ca.pem");
    let cli = |pem: &Path, key: &Path| {
        vec![
            "--tls".to_string(),
            "--cacert".into(),
            ca.clone(),
            "--sni".into(),
            "localhost".into(),
            "--cert".into(),
            pem.display().to_string(),
            "--key".into(),
            key.display().to_string(),
        ]
    };
    let args = [
        cli(&svc_pem, &svc_key),
        vec!["SET".into(), "k".into(), "1".into()],
    ]
    .concat();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = redis_cli(tls_port, &args).await;
    assert_eq!(out.stdout.trim(), "OK", "{}", out.stderr);
    // No password was given: the certificate's CN is the user, mapped to `billing`.
    assert_eq!(redis.direct(&["GET", "bill:k"]).await, b"$1\r\n1\r\n");
    let args = [
        cli(&san_pem, &san_key),
        vec!["SET".into(), "k".into(), "2".into()],
    ]
    .concat();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = redis_cli(tls_port, &args).await;
    assert_eq!(out.stdout.trim(), "OK", "{}", out.stderr);
    // The CN is not listed; the DNS SAN is.
    assert_eq!(redis.direct(&["GET", "rep:k"]).await, b"$1\r\n2\r\n");
    // A verified certificate naming no listed user is anonymous: require_auth refuses it.
    let got = tls_exchange(
        &connector(&f, Some((&other_pem, &other_key))),
        tls_port,
        b"GET k\r\n",
        1,
    )
    .await
    .unwrap();
    assert!(
        got.starts_with(b"-NOAUTH"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // redis-py with a client certificate.
    let script = format!(
        "import redis\n\
         r = redis.Redis(host='localhost', port={tls_port}, ssl=True, ssl_ca_certs='{ca}', \
         ssl_certfile='{}', ssl_keyfile='{}')\n\
         print(r.get('k').decode())\n",
        svc_pem.display(),
        svc_key.display()
    );
    let out = tokio::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .await
        .expect("python3 with redis-py");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_clients_are_closed_with_a_reason_without_blocking_others() {
    let redis = RedisServer::start();
    let f = files("client-tls-bad");
    let (good_pem, good_key) = f.clients.issue("good", "good", &[], false);
    let (old_pem, old_key) = f.clients.issue("old", "old", &[], true);
    let stranger = Pki::new(&f.dir, "stranger");
    let (bad_pem, bad_key) = stranger.issue("untrusted", "intruder", &[], false);
    let tls_port = free_port();
    let proxy = Proxy::start(config(
        &redis,
        &f,
        &format!(
            "  listen: 127.0.0.1:{tls_port}\n  client_ca_file: {}\n  handshake_timeout_ms: 500\n",
            f.path("client-ca.pem")
        ),
        "",
    ))
    .await;
    // A handshake that never finishes: a record header, then silence. It is held open
    // while the other clients below are served.
    let mut stalled = TcpStream::connect(("127.0.0.1", tls_port)).await.unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let good = connector(&f, Some((&good_pem, &good_key)));
    assert_eq!(
        tls_exchange(&good, tls_port, b"PING\r\n", 7).await.unwrap(),
        b"+PONG\r\n"
    );
    // Plaintext on the TLS port: told why, then closed.
    let mut plain = common::Raw::connect(format!("127.0.0.1:{tls_port}")).await;
    plain.send(b"PING\r\n").await;
    let (text, closed) = plain.read_to_close(DEADLINE).await;
    assert!(closed);
    assert!(
        String::from_utf8_lossy(&text).contains("TLS only"),
        "{}",
        String::from_utf8_lossy(&text)
    );
    let failed = |c: TlsConnector| async move {
        match tls_exchange(&c, tls_port, b"PING\r\n", 7).await {
            Err(_) => true,
            Ok(reply) => reply.is_empty(),
        }
    };
    assert!(failed(connector(&f, Some((&bad_pem, &bad_key)))).await);
    assert!(failed(connector(&f, Some((&old_pem, &old_key)))).await);
    assert!(failed(connector(&f, None)).await);
    // The stalled client is closed once the handshake timeout passes.
    let mut rest = Vec::new();
    let n = tokio::time::timeout(DEADLINE, stalled.read_to_end(&mut rest))
        .await
        .expect("the stalled handshake was closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let text = wait_metric(&proxy, &handshakes("timeout"), 1.0).await;
    for outcome in ["plaintext", "untrusted", "expired", "no_certificate"] {
        assert_eq!(
            sample(&text, &handshakes(outcome)),
            1.0,
            "{outcome}:\n{text}"
        );
    }
    assert_eq!(sample(&text, &handshakes("ok")), 1.0, "{text}");
    // Still serving.
    assert_eq!(
        tls_exchange(&good, tls_port, b"PING\r\n", 7).await.unwrap(),
        b"+PONG\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_port_serves_tls_and_plaintext_when_allowed() {
    let redis = RedisServer::start();
    let f = files("client-tls-same");
    // Proxy::start waits for a plaintext PING, which `plaintext: true` answers.
    let proxy = Proxy::start(config(
        &redis,
        &f,
        "  plaintext: true\n  handshake_timeout_ms: 300\n",
        "",
    ))
    .await;
    assert_eq!(
        tls_exchange(&connector(&f, None), proxy.port(), b"PING\r\n", 7)
            .await
            .unwrap(),
        b"+PONG\r\n"
    );
    let out = redis_cli(proxy.port(), &["PING"]).await;
    assert_eq!(out.stdout.trim(), "PONG");
    // A plain client that connects and stays silent is not timed out like a handshake: it
    // outlives a stalled TLS handshake begun after it, which is closed.
    let mut idle = common::Raw::connect(proxy.addr).await;
    let mut stalled = TcpStream::connect(proxy.addr).await.unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(DEADLINE, stalled.read_to_end(&mut rest))
        .await
        .expect("the stalled handshake was closed")
        .ok();
    assert_eq!(idle.call(&["PING"]).await, b"+PONG\r\n");
    let ca = f.path("server-ca.pem");
    let out = redis_cli(
        proxy.port(),
        &["--tls", "--cacert", &ca, "--sni", "localhost", "PING"],
    )
    .await;
    assert_eq!(out.stdout.trim(), "PONG", "{}", out.stderr);
}

/// Without `plaintext`, `listen` itself is TLS only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_alone_serves_tls_only() {
    let redis = RedisServer::start();
    let f = files("client-tls-only");
    let proxy = Proxy::spawn(config(&redis, &f, "", "")).await;
    wait_tls_ready(&connector(&f, None), proxy.port()).await;
    let mut plain = common::Raw::connect(proxy.addr).await;
    plain.send(b"PING\r\n").await;
    let (text, closed) = plain.read_to_close(DEADLINE).await;
    assert!(
        closed && text.starts_with(b"-ERR"),
        "{}",
        String::from_utf8_lossy(&text)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_certificate_is_loaded_and_a_broken_one_refused() {
    let redis = RedisServer::start();
    let f = files("client-tls-reload");
    let tls_port = free_port();
    let proxy = Proxy::start(config(
        &redis,
        &f,
        &format!("  listen: 127.0.0.1:{tls_port}\n  reload_check_ms: 100\n"),
        "",
    ))
    .await;
    let served_cn = || async {
        let tcp = TcpStream::connect(("127.0.0.1", tls_port)).await.unwrap();
        let tls = connector(&f, None)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let cert = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
        redis_policy_proxy::listen::cert_name::names(&cert)[0].clone()
    };
    assert_eq!(served_cn().await, "proxy");
    // Renewed: a new certificate with another CN, written over the old files.
    f.server
        .issue("proxy", "proxy-renewed", &["localhost", "127.0.0.1"], false);
    wait_metric(&proxy, "rpp_tls_reloads_total{result=\"ok\"}", 1.0).await;
    assert_eq!(served_cn().await, "proxy-renewed");
    // A broken key: refused, the renewed certificate stays in use. (Counted from what the
    // renewal left: a check between its two file writes may have seen a mismatched pair.)
    let failed = "rpp_tls_reloads_total{result=\"failed\"}";
    let before = sample(&http_get(proxy.admin, "/metrics").await.1, failed);
    std::fs::write(f.dir.join("proxy.key"), "not a key").unwrap();
    wait_metric(&proxy, failed, before + 1.0).await;
    assert_eq!(served_cn().await, "proxy-renewed");
}
