//! TLS to the upstream: a real redis-server with a TLS port and a CA made for the test.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::{Proxy, Raw, RedisServer, free_port, temp_dir};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use redis_policy_proxy::Config;

/// Writes ca.pem, server.pem, server.key into `dir`; the server certificate names 127.0.0.1
/// and localhost.
fn make_pki(dir: &Path) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server_params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), server_cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), server_key.serialize_pem()).unwrap();
}

fn tls_redis(dir: &Path) -> (RedisServer, u16) {
    let tls_port = free_port();
    let p = |f: &str| dir.join(f).display().to_string();
    let (cert, key, ca) = (p("server.pem"), p("server.key"), p("ca.pem"));
    let port = tls_port.to_string();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ]);
    (server, tls_port)
}

fn config(tls_port: u16, ca_file: &Path, server_name: &str) -> Config {
    let yaml = format!(
        "upstream:\n  address: 127.0.0.1:{tls_port}\n  tls:\n    ca_file: {}\n    server_name: {server_name}\n",
        ca_file.display()
    );
    redis_policy_proxy::setup::from_yaml(&yaml, Path::new("tls.yaml")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_over_tls() {
    let dir = temp_dir("tls");
    make_pki(&dir);
    let (redis, tls_port) = tls_redis(&dir);
    let proxy = Proxy::start(config(tls_port, &dir.join("ca.pem"), "localhost")).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["SET", "tls:k", "v"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["GET", "tls:k"]).await, b"$1\r\nv\r\n");
    // The write really reached the TLS-fronted server.
    assert_eq!(redis.direct(&["GET", "tls:k"]).await, b"$1\r\nv\r\n");
    // A dedicated connection (MULTI) goes over TLS too.
    c.send(b"MULTI\r\nINCR tls:n\r\nEXEC\r\n").await;
    assert_eq!(
        c.collect_frames(3, common::DEADLINE).await.joined(),
        b"+OK\r\n+QUEUED\r\n*1\r\n:1\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_server_name_is_refused_with_a_clear_error() {
    let dir = temp_dir("tls-bad");
    make_pki(&dir);
    let (_redis, tls_port) = tls_redis(&dir);
    let proxy = Proxy::spawn(config(tls_port, &dir.join("ca.pem"), "not-the-server")).await;
    let mut c = Raw::connect(proxy.addr).await;
    let reply = c.call(&["PING"]).await;
    let text = String::from_utf8_lossy(&reply);
    // Not sent (no connection could be made): LOADING, which clients retry as transient.
    assert!(text.starts_with("-LOADING upstream 127.0.0.1:"), "{text}");
    assert!(text.contains("TLS"), "{text}");
}

#[test]
fn missing_ca_file_names_the_file_and_field() {
    let yaml = "upstream:\n  tls:\n    ca_file: /nonexistent/ca.pem\n";
    let err = redis_policy_proxy::setup::from_yaml(yaml, Path::new("p.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("p.yaml:3: field `upstream.tls`"), "{err}");
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
}
