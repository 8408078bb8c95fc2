//! The deployment files hold what the code does: the Dockerfile's defaults survive
//! `docker run IMAGE <args>` and its health check reads `/readyz` on the admin port; the
//! docker-compose example and the Kubernetes manifests name the ports the binary uses and
//! carry policies that validate; every metric the docs and deploy files name is exported;
//! the systemd unit lets the documented audit file be written and does not restart on the
//! binary's configuration exit code. Docker, Kubernetes and systemd are not needed: the files
//! are parsed, and what the image would run is run with the binary itself
//! (`systemd-analyze verify` runs where it is installed).

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_redis-policy-proxy");

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The admin endpoint's default port, from the code.
fn admin_port() -> u16 {
    let config = redis_policy_proxy::Config::default();
    config
        .admin
        .listen_addr()
        .expect("admin on by default")
        .port()
}

/// The default client port, from the code.
fn client_port() -> u16 {
    let listen = redis_policy_proxy::Config::default().listen.value;
    listen.rsplit_once(':').unwrap().1.parse().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Dockerfile
// ---------------------------------------------------------------------------------------------

/// The final stage's instructions (after the last FROM), keyword upper-cased, continuation
/// lines joined, comments dropped.
fn final_stage() -> Vec<(String, String)> {
    let mut all = Vec::new();
    let mut current = String::new();
    for line in read("Dockerfile").lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (keyword, args) = current.split_once(' ').unwrap_or((&current, ""));
                all.push((keyword.to_ascii_uppercase(), args.trim().to_string()));
                current.clear();
            }
        }
    }
    let last_from = all.iter().rposition(|(k, _)| k == "FROM").expect("a FROM");
    all.split_off(last_from)
}

fn instructions<'a>(stage: &'a [(String, String)], keyword: &str) -> Vec<&'a str> {
    stage
        .iter()
        .filter(|(k, _)| k == keyword)
        .map(|(_, a)| a.as_str())
        .collect()
}

/// `ENV A=1 B=2` instructions of the stage, merged.
fn image_env(stage: &[(String, String)]) -> BTreeMap<String, String> {
    instructions(stage, "ENV")
        .iter()
        .flat_map(|args| args.split_whitespace())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("ENV {kv}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn the_image_keeps_its_defaults_in_the_environment_and_has_no_cmd() {
    let stage = final_stage();
    let entrypoint = instructions(&stage, "ENTRYPOINT");
    assert_eq!(entrypoint.len(), 1, "{stage:?}");
    let entrypoint: Vec<String> = serde_json::from_str(entrypoint[0]).expect("exec form");
    assert_eq!(entrypoint, ["/usr/local/bin/redis-policy-proxy"]);
    // A CMD would be replaced wholesale by `docker run IMAGE <args>`: defaults go elsewhere.
    assert!(instructions(&stage, "CMD").is_empty(), "{stage:?}");

    let env = image_env(&stage);
    assert_eq!(env["RPP_LISTEN"], format!("0.0.0.0:{}", client_port()));
    assert_eq!(env["RPP_ADMIN"], format!("0.0.0.0:{}", admin_port()));
    // The policy is one the image ships and it validates.
    let shipped = image_policy(&stage, &env["RPP_CONFIG"]);
    redis_policy_proxy::setup::load(&shipped).expect("the image's policy validates");

    let expose: BTreeSet<u16> = instructions(&stage, "EXPOSE")
        .iter()
        .flat_map(|a| a.split_whitespace())
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(expose, BTreeSet::from([client_port(), admin_port()]));
}

/// The repository file a path in the image comes from, by the stage's `COPY src/ dest/`.
fn image_policy(stage: &[(String, String)], in_image: &str) -> PathBuf {
    for copy in instructions(stage, "COPY") {
        let parts: Vec<&str> = copy.split_whitespace().collect();
        if let [src, dest] = parts[..] {
            if let Some(rest) = in_image.strip_prefix(dest) {
                if !src.starts_with("--") {
                    let local = repo(src).join(rest);
                    assert!(local.exists(), "{in_image} comes from {}", local.display());
                    return local;
                }
            }
        }
    }
    panic!("no COPY puts {in_image} in the image: {stage:?}");
}

/// What `docker run IMAGE --log-format json` runs: the binary with the image's environment
/// (addresses moved to loopback port 0, the policy to its repository copy) and the extra
/// argument added. The policy, the listen address and the admin endpoint must all survive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_run_with_extra_arguments_keeps_the_image_defaults() {
    let redis = RedisServer::start();
    let stage = final_stage();
    let env = image_env(&stage);
    let policy = image_policy(&stage, &env["RPP_CONFIG"]);
    let dir = TempDir::new("image");
    let log = dir.path().join("proxy.log");
    let mut cmd = Command::new(BIN);
    for (k, v) in &env {
        let v = match k.as_str() {
            "RPP_CONFIG" => policy.to_str().unwrap(),
            // Loopback and any free port: tests run in parallel.
            "RPP_LISTEN" | "RPP_ADMIN" => "127.0.0.1:0",
            _ => v,
        };
        cmd.env(k, v);
    }
    let child = cmd
        .env("RPP_UPSTREAM", redis.addr())
        .env_remove("RUST_LOG")
        .env_remove("RPP_LOG_FORMAT")
        .arg("--log-format")
        .arg("json")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _child = KillOnDrop(child);

    let summary = wait_for_line(&log, "redis-policy-proxy started").await;
    let summary: Value = serde_json::from_str(&summary).expect("JSON logs, as asked");
    assert_eq!(
        summary["policy_file"],
        policy.to_str().unwrap(),
        "{summary}"
    );
    let listen = summary["listen"].as_str().unwrap().to_string();
    let admin: std::net::SocketAddr = summary["admin"].as_str().unwrap().parse().unwrap();
    let mut c = connect_raw(&listen).await;
    let reply = c.call(&["KEYS", "*"]).await;
    assert!(
        reply.starts_with(b"-NOPERM policy deny-keys"),
        "{}",
        show(&reply)
    );
    assert_eq!(http_get(admin, "/healthz").await.0, 200);
}

/// The image's HEALTHCHECK command, run as Docker would (bash, with RPP_ADMIN from the
/// environment): healthy while the proxy is ready, unhealthy when its upstream is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_check_reads_readyz_on_the_admin_port() {
    let stage = final_stage();
    let check = instructions(&stage, "HEALTHCHECK");
    assert_eq!(check.len(), 1);
    let cmd = check[0]
        .split_once("CMD ")
        .expect("HEALTHCHECK ... CMD [...]")
        .1;
    let argv: Vec<String> = serde_json::from_str(cmd).expect("exec form");

    let mut redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let run = |admin: &str| {
        Command::new(&argv[0])
            .args(&argv[1..])
            .env("RPP_ADMIN", admin)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    let admin = proxy.admin.to_string();
    assert!(run(&admin), "unhealthy while ready");
    redis.kill();
    let until = Instant::now() + DEADLINE;
    while run(&admin) {
        assert!(Instant::now() < until, "healthy with the upstream gone");
        tokio::time::sleep(POLL).await;
    }
    // Nothing on the port at all: unhealthy too.
    assert!(!run(&format!("127.0.0.1:{}", free_port())));
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first line of `log` containing `text`, bounded by the deadline.
async fn wait_for_line(log: &Path, text: &str) -> String {
    let until = Instant::now() + DEADLINE;
    loop {
        let content = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(l) = content.lines().find(|l| l.contains(text)) {
            return l.to_string();
        }
        assert!(Instant::now() < until, "no {text:?} in: {content}");
        tokio::time::sleep(POLL).await;
    }
}

/// A raw connection once the proxy answers PING.
async fn connect_raw(addr: &str) -> Raw {
    let until = Instant::now() + DEADLINE;
    loop {
        if let Some(mut c) = Raw::try_connect(addr, DEADLINE).await {
            c.send(b"PING\r\n").await;
            let got = c.collect_frames(1, Duration::from_secs(2)).await;
            if got.frames.first().is_some_and(|f| f == b"+PONG\r\n") {
                return c;
            }
        }
        assert!(Instant::now() < until, "no PONG from {addr}");
        tokio::time::sleep(POLL).await;
    }
}

// ---------------------------------------------------------------------------------------------
// docker-compose and Prometheus
// ---------------------------------------------------------------------------------------------

fn yaml(path: &str) -> Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml_docs(path: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn compose_runs_redis_the_proxy_and_prometheus_on_the_ports_the_binary_uses() {
    let compose = yaml("deploy/docker-compose.yaml");
    let services = &compose["services"];
    for name in ["redis", "proxy", "prometheus"] {
        assert!(services[name].is_object(), "no service {name}: {compose}");
    }
    let proxy = &services["proxy"];
    let context = proxy["build"]["context"].as_str().unwrap();
    assert!(repo("deploy").join(context).join("Dockerfile").exists());
    assert_eq!(proxy["environment"]["RPP_UPSTREAM"], "redis:6379");
    // Flags added to the image's defaults, not a command line replacing them.
    let command = proxy["command"].as_array().unwrap();
    assert!(
        command[0].as_str().unwrap().starts_with("--"),
        "{command:?}"
    );
    let ports: Vec<&str> = proxy["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    for port in [client_port(), admin_port()] {
        assert!(
            ports
                .iter()
                .any(|p| p.ends_with(&format!(":{port}:{port}"))),
            "{port} not published: {ports:?}"
        );
    }
    for volume in proxy["volumes"].as_array().unwrap() {
        let (src, _) = volume.as_str().unwrap().split_once(':').unwrap();
        assert!(repo("deploy").join(src).exists(), "{src}");
    }
    // SIGTERM drains for shutdown_grace_ms: compose must wait longer before SIGKILL.
    let grace = redis_policy_proxy::Config::default()
        .shutdown_grace_ms
        .value
        / 1000;
    let stop: u64 = proxy["stop_grace_period"]
        .as_str()
        .unwrap()
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(stop > grace, "stop_grace_period {stop}s <= {grace}s");

    // Prometheus scrapes the proxy's admin port and loads the alerts, both mounted.
    let mut mounted = BTreeMap::new();
    for volume in services["prometheus"]["volumes"].as_array().unwrap() {
        let parts: Vec<&str> = volume.as_str().unwrap().split(':').collect();
        assert!(repo("deploy").join(parts[0]).exists(), "{volume}");
        mounted.insert(parts[1].to_string(), parts[0].to_string());
    }
    let prometheus = yaml("deploy/prometheus/prometheus.yml");
    let job = &prometheus["scrape_configs"][0];
    assert_eq!(
        job["static_configs"][0]["targets"][0],
        format!("proxy:{}", admin_port())
    );
    for rules in prometheus["rule_files"].as_array().unwrap() {
        assert!(mounted.contains_key(rules.as_str().unwrap()), "{rules}");
    }
    assert!(mounted.contains_key("/etc/prometheus/prometheus.yml"));
    let alerts = yaml("deploy/prometheus/alerts.yml");
    assert!(!alerts["groups"][0]["rules"].as_array().unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Kubernetes
// ---------------------------------------------------------------------------------------------

#[test]
fn kubernetes_manifests_carry_valid_policies_and_probe_the_admin_port() {
    for path in [
        "deploy/kubernetes/redis-policy-proxy.yaml",
        "deploy/kubernetes/sidecar.yaml",
    ] {
        let docs = yaml_docs(path);
        let kind = |k: &'static str| docs.iter().filter(move |d| d["kind"] == k);
        let mut policies = BTreeMap::new();
        for map in kind("ConfigMap") {
            for (name, text) in map["data"].as_object().unwrap() {
                let text = text.as_str().unwrap();
                // The upstream password comes from the pod (a Secret): checked by
                // kubernetes_credentials_come_from_the_secret_the_policy_names.
                let mut config = redis_policy_proxy::Config::parse(text, Path::new(name))
                    .unwrap_or_else(|e| panic!("{path}: {e}"));
                config.secret_problems.clear();
                redis_policy_proxy::setup::validate(&config, Path::new(name))
                    .unwrap_or_else(|e| panic!("{path}: {e}"));
                policies.insert(name.clone(), text.to_string());
            }
        }
        let deployment = kind("Deployment").next().expect("a Deployment");
        let pod = &deployment["spec"]["template"];
        assert_eq!(
            pod["metadata"]["annotations"]["prometheus.io/port"],
            admin_port().to_string(),
            "{path}"
        );
        let spec = &pod["spec"];
        let containers = ["containers", "initContainers"]
            .iter()
            .filter_map(|k| spec[*k].as_array())
            .flatten();
        let proxy = containers
            .filter(|c| {
                c["image"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("redis-policy-proxy")
            })
            .collect::<Vec<_>>();
        assert_eq!(proxy.len(), 1, "{path}: one proxy container");
        let proxy = proxy[0];
        assert!(
            proxy["args"].is_null() && proxy["command"].is_null(),
            "{path}"
        );
        // Probes name the admin port, which is the default admin port.
        let ports: BTreeMap<&str, u64> = proxy["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap(),
                    p["containerPort"].as_u64().unwrap(),
                )
            })
            .collect();
        for probe in ["livenessProbe", "readinessProbe"] {
            let port = proxy[probe]["httpGet"]["port"].as_str().unwrap();
            assert_eq!(ports[port], u64::from(admin_port()), "{path} {probe}");
        }
        assert_eq!(proxy["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(proxy["livenessProbe"]["httpGet"]["path"], "/healthz");
        // RPP_CONFIG names a file of the mounted ConfigMap.
        let env: BTreeMap<&str, &str> = proxy["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| Some((e["name"].as_str().unwrap(), e["value"].as_str()?)))
            .collect();
        let config = env["RPP_CONFIG"];
        let mount = proxy["volumeMounts"][0]["mountPath"].as_str().unwrap();
        let file = config
            .strip_prefix(&format!("{mount}/"))
            .expect("in the mount");
        assert!(policies.contains_key(file), "{path}: {config}");
    }
}

/// A manifest's proxy container and what it needs to be checked against the rest: the
/// documents, the container, its pod spec, and the policy text RPP_CONFIG names.
struct Manifest {
    docs: Vec<Value>,
    container: Value,
    pod: Value,
    policy: String,
}

fn manifest(path: &str) -> Manifest {
    let docs = yaml_docs(path);
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let pod = deployment["spec"]["template"]["spec"].clone();
    let container = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| pod[*k].as_array())
        .flatten()
        .find(|c| {
            c["image"]
                .as_str()
                .unwrap_or("")
                .starts_with("redis-policy-proxy")
        })
        .expect("a proxy container")
        .clone();
    let env = |name: &str| {
        container["env"]
            .as_array()
            .and_then(|e| e.iter().find(|e| e["name"] == name))
            .and_then(|e| e["value"].as_str())
            .map(str::to_string)
    };
    let config = env("RPP_CONFIG").expect("RPP_CONFIG");
    let (dir, file) = config.rsplit_once('/').unwrap();
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == dir)
        .unwrap_or_else(|| panic!("{path}: nothing mounted on {dir}"));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the policy's volume");
    let map = volume["configMap"]["name"].as_str().expect("a ConfigMap");
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == map)
        .and_then(|d| d["data"][file].as_str())
        .unwrap_or_else(|| panic!("{path}: no {file} in ConfigMap {map}"))
        .to_string();
    Manifest {
        docs,
        container,
        pod,
        policy,
    }
}

impl Manifest {
    /// The value of `key` of the Secret `name` in the manifest (stringData, or base64 data).
    fn secret(&self, name: &str, key: &str) -> String {
        let secret = self
            .docs
            .iter()
            .find(|d| d["kind"] == "Secret" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Secret {name} in the manifest"));
        secret["stringData"][key]
            .as_str()
            .unwrap_or_else(|| panic!("Secret {name} has no stringData key {key}: {secret}"))
            .to_string()
    }
}

/// Kubernetes with a password-protected Redis (issue 28): the policy stays a ConfigMap and
/// names where the password comes from; the Deployment provides exactly that from a Secret
/// of the manifest, as the environment variable `upstream.password_env` names (env from a
/// secretKeyRef) or as the file `upstream.password_file` names (a Secret volume mounted on
/// its directory, the key as the file name). Then `--check` passes with the Secret's value
/// supplied the way the pod supplies it. The pod runs as the image's user, which must be
/// able to read the mounted file.
#[test]
fn kubernetes_credentials_come_from_the_secret_the_policy_names() {
    let image_user = final_stage()
        .iter()
        .find(|(k, _)| k == "USER")
        .map(|(_, v)| v.clone())
        .expect("the image's USER");
    let (uid, gid) = image_user.split_once(':').unwrap();
    let mut kinds = BTreeSet::new();
    for path in [
        "deploy/kubernetes/redis-policy-proxy.yaml",
        "deploy/kubernetes/sidecar.yaml",
    ] {
        let m = manifest(path);
        let security = &m.pod["securityContext"];
        assert_eq!(security["runAsUser"].as_u64(), uid.parse().ok(), "{path}");
        assert_eq!(security["runAsGroup"].as_u64(), gid.parse().ok(), "{path}");
        let config = redis_policy_proxy::Config::parse(&m.policy, Path::new(path))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let upstream = &config.upstream;
        assert!(
            upstream.password.is_none(),
            "{path}: a password in the ConfigMap"
        );
        let dir = TempDir::new("k8s-secret");
        let policy = dir.path().join("policy.yaml");
        let mut check_env: Vec<(String, String)> = Vec::new();
        let mut text = m.policy.clone();
        if let Some(var) = &upstream.password_env {
            kinds.insert("password_env");
            let var = &var.value;
            let entry = m.container["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == var.as_str())
                .unwrap_or_else(|| panic!("{path}: the container has no env {var}"));
            let from = &entry["valueFrom"]["secretKeyRef"];
            let (name, key) = (from["name"].as_str(), from["key"].as_str());
            let (Some(name), Some(key)) = (name, key) else {
                panic!("{path}: {var} does not come from a Secret: {entry}");
            };
            check_env.push((var.clone(), m.secret(name, key)));
        } else if let Some(file) = &upstream.password_file {
            kinds.insert("password_file");
            let file = &file.value;
            let mount = m.container["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| file.starts_with(v["mountPath"].as_str().unwrap()))
                .unwrap_or_else(|| panic!("{path}: nothing mounted over {file:?}"));
            let key = file
                .strip_prefix(mount["mountPath"].as_str().unwrap())
                .unwrap()
                .to_str()
                .unwrap();
            let volume = m.pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == mount["name"])
                .unwrap();
            let name = volume["secret"]["secretName"]
                .as_str()
                .unwrap_or_else(|| panic!("{path}: {file:?} is not from a Secret: {volume}"));
            assert!(
                volume["secret"]["items"].is_null(),
                "{path}: keys are file names"
            );
            // The kubelet writes the file root-owned: the image's user reads it through the
            // group (fsGroup) or a world-readable mode.
            let mode = match &volume["secret"]["defaultMode"] {
                Value::Null => 0o644,
                m => m
                    .as_u64()
                    .unwrap_or_else(|| panic!("{path}: defaultMode {m}")),
            };
            let readable = mode & 0o004 != 0
                || (mode & 0o040 != 0 && security["fsGroup"].as_u64() == gid.parse().ok());
            assert!(
                readable,
                "{path}: mode {mode:o}: the image's user cannot read {file:?}"
            );
            let local = dir.path().join(key);
            std::fs::write(&local, format!("{}\n", m.secret(name, key))).unwrap();
            text = text.replace(file.to_str().unwrap(), local.to_str().unwrap());
        } else {
            panic!("{path}: the policy names no upstream password (password_env, password_file)");
        }
        std::fs::write(&policy, text).unwrap();
        let out = Command::new(BIN)
            .arg("--check")
            .arg(&policy)
            .env_clear()
            .envs(check_env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("run --check");
        assert!(
            out.status.success(),
            "{path}: --check with the Secret supplied: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // And without it, the check names what is missing (what a pod without the Secret
        // wired in would log before exiting 64).
        let bare = dir.path().join("bare.yaml");
        std::fs::write(&bare, &m.policy).unwrap();
        let out = Command::new(BIN)
            .arg("--check")
            .arg(&bare)
            .env_clear()
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{path}");
    }
    assert_eq!(kinds.len(), 2, "both ways are shown: {kinds:?}");
}

// ---------------------------------------------------------------------------------------------
// Metric names
// ---------------------------------------------------------------------------------------------

/// Every sample name `/metrics` can render, from a fresh registry's `# TYPE` lines: a
/// counter `x` renders `x_total`, a histogram `x_bucket`, `x_sum` and `x_count` (docs name
/// the family `x` too).
fn exported_names() -> BTreeSet<String> {
    let policy = std::sync::Arc::new(arc_swap::ArcSwap::from_pointee(
        redis_policy_proxy::policy::Policy::default(),
    ));
    let text = redis_policy_proxy::metrics::Metrics::new(policy).render();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["", "_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

#[test]
fn every_metric_the_docs_and_deploy_files_name_is_exported() {
    let exported = exported_names();
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_cpu_seconds_total",
        "process_start_time_seconds",
        "rpp_client_received_bytes_total",
        "rpp_client_sent_bytes_total",
    ] {
        assert!(exported.contains(name), "{name} not exported: {exported:?}");
    }
    let pattern = regex::Regex::new(r"(?-u)\b(?:rpp|process)_[a-z0-9_]*[a-z0-9]\b").unwrap();
    let mut files = vec![
        repo("README.md"),
        repo("Dockerfile"),
        repo("policy/README.md"),
    ];
    for dir in [
        "docs",
        "deploy",
        "deploy/kubernetes",
        "deploy/prometheus",
        "deploy/grafana",
        "policy",
    ] {
        for entry in std::fs::read_dir(repo(dir)).unwrap() {
            let p = entry.unwrap().path();
            if p.is_file() {
                files.push(p);
            }
        }
    }
    let mut unknown = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for m in pattern.find_iter(&text) {
            if !exported.contains(m.as_str()) {
                unknown.push(format!("{}: {}", file.display(), m.as_str()));
            }
        }
    }
    assert!(unknown.is_empty(), "named but not exported: {unknown:#?}");
}

/// Every `expr` string anywhere in a Grafana dashboard (panels, rows' panels, templating).
fn exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_references_only_exported_metrics() {
    let exported = exported_names();
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/redis-policy-proxy.json")).unwrap();
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    assert!(all.len() >= 20, "{all:?}");
    let name = regex::Regex::new(r"(?-u)\b(?:rpp|process)_[a-z0-9_]*[a-z0-9]\b").unwrap();
    let mut used = BTreeSet::new();
    for expr in &all {
        let names: Vec<&str> = name.find_iter(expr).map(|m| m.as_str()).collect();
        assert!(
            !names.is_empty(),
            "an expression without a proxy metric: {expr}"
        );
        for n in names {
            assert!(
                exported.contains(n),
                "the dashboard names {n}, which is not exported: {expr}"
            );
            used.insert(n.to_string());
        }
    }
    // What the dashboard is for: refusals, rate limits, upstream errors and reconnects,
    // latency, connections, memory, and the insight features.
    for needed in [
        "rpp_policy_decisions_total",
        "rpp_upstream_errors_total",
        "rpp_upstream_reconnects_total",
        "rpp_request_duration_seconds_bucket",
        "rpp_client_connections",
        "process_resident_memory_bytes",
        "rpp_audit_entries_total",
        "rpp_keyspace_commands_total",
    ] {
        assert!(
            used.contains(needed),
            "the dashboard does not show {needed}"
        );
    }
    // Every panel with queries reads the dashboard's Prometheus data source.
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["targets"].is_array() {
            assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
        }
    }
}

#[test]
fn the_service_monitor_scrapes_the_admin_port() {
    let docs = yaml_docs("deploy/kubernetes/servicemonitor.yaml");
    let service = docs
        .iter()
        .find(|d| d["kind"] == "Service")
        .expect("a Service");
    let monitor = docs
        .iter()
        .find(|d| d["kind"] == "ServiceMonitor")
        .expect("a ServiceMonitor");
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "the monitor selects the Service"
        );
    }
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    let port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == endpoint["port"])
        .expect("the endpoint names a port of the Service");
    assert_eq!(port["port"], u64::from(admin_port()));
    // The Service's target is the Deployment's admin port, which is the binary's default.
    let deployment = yaml_docs("deploy/kubernetes/redis-policy-proxy.yaml")
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let target = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port["targetPort"])
        .expect("targetPort names a container port");
    assert_eq!(target["containerPort"], u64::from(admin_port()));
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["template"]["metadata"]["labels"]
    );
}

/// Every `docker run` command the README and the Dockerfile's header show, as its words:
/// continuation lines joined, shell comments and inline-code backticks dropped.
fn documented_docker_runs() -> Vec<(String, Vec<String>)> {
    let mut runs = Vec::new();
    for file in ["README.md", "Dockerfile"] {
        let text = read(file);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(at) = line.find("docker run") else {
                continue;
            };
            let mut command = String::new();
            let mut part = &line[at..];
            let mut next = i + 1;
            loop {
                // In prose the command is inline code: it ends at the closing backtick.
                let part_end = part.find('`').unwrap_or(part.len());
                let code = &part[..part_end];
                let code = code.split(" #").next().unwrap_or(code).trim_end();
                match code.strip_suffix('\\') {
                    Some(more) if next < lines.len() => {
                        command.push_str(more);
                        command.push(' ');
                        part = lines[next].trim_start_matches('#');
                        next += 1;
                    }
                    _ => {
                        command.push_str(code);
                        break;
                    }
                }
            }
            let words = command
                .split_whitespace()
                .map(|w| w.trim_matches('"').to_string())
                .collect();
            runs.push((format!("{file}:{}", i + 1), words));
        }
    }
    runs
}

/// "Nothing is exposed by accident": a documented `docker run` publishes ports on loopback
/// only (`-p 127.0.0.1:…`), and one on the host's network sets the listen and admin
/// addresses to loopback, since the image's defaults (0.0.0.0, for `-p`) would then be every
/// interface of the host.
#[test]
fn documented_docker_runs_listen_on_loopback_only() {
    let image = image_env(&final_stage());
    let runs = documented_docker_runs();
    assert!(runs.len() >= 3, "{runs:?}");
    for (at, words) in runs {
        let value_of = |flag: &str, var: &str| -> String {
            let mut value = image[var].clone();
            for pair in words.windows(2) {
                if pair[0] == "-e" {
                    if let Some(v) = pair[1].strip_prefix(&format!("{var}=")) {
                        value = v.to_string();
                    }
                }
                if pair[0] == flag {
                    value = pair[1].clone();
                }
            }
            value
        };
        for pair in words.windows(2) {
            if pair[0] == "-p" || pair[0] == "--publish" {
                assert!(
                    pair[1].starts_with("127.0.0.1:"),
                    "{at}: -p {} publishes on every interface of the host: {words:?}",
                    pair[1]
                );
            }
        }
        let host_network = words
            .windows(2)
            .any(|p| p[0] == "--network" && p[1] == "host")
            || words.iter().any(|w| w == "--network=host");
        if host_network {
            for (flag, var) in [("--listen", "RPP_LISTEN"), ("--admin", "RPP_ADMIN")] {
                let addr = value_of(flag, var);
                assert!(
                    addr.starts_with("127.0.0.1:") || addr == "off",
                    "{at}: with --network host, {var} is {addr}, on every interface of the host: {words:?}"
                );
            }
        }
    }
}

/// The base images can come from a registry mirror: the FROM lines take them from build
/// arguments whose defaults are the public images, as the Dockerfile's header documents.
#[test]
fn the_dockerfiles_base_images_can_come_from_a_mirror() {
    let dockerfile = read("Dockerfile");
    let froms: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .collect();
    assert_eq!(froms, ["${RUST_IMAGE} AS builder", "${RUNTIME_IMAGE}"]);
    for arg in [
        "ARG RUST_IMAGE=rust:1-bookworm",
        "ARG RUNTIME_IMAGE=debian:bookworm-slim",
        "--build-arg RUST_IMAGE=",
        "cargo vendor",
        "BuildKit",
    ] {
        assert!(dockerfile.contains(arg), "the Dockerfile lacks {arg:?}");
    }
    let readme = read("README.md");
    assert!(
        readme.contains("needs BuildKit"),
        "README does not say the build needs BuildKit"
    );
}

// ---------------------------------------------------------------------------------------------
// systemd
// ---------------------------------------------------------------------------------------------

const UNIT: &str = "deploy/systemd/redis-policy-proxy.service";

/// The unit's settings as (section, key, value), in file order; a key given twice appears
/// twice (systemd adds the values up for list settings).
fn unit_settings() -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in read(UNIT).lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
        } else if let Some((key, value)) = line.split_once('=') {
            out.push((section.clone(), key.trim().into(), value.trim().into()));
        }
    }
    out
}

/// The words of every `[Service]` value of `key`.
fn service_values(settings: &[(String, String, String)], key: &str) -> Vec<String> {
    settings
        .iter()
        .filter(|(s, k, _)| s == "Service" && k == key)
        .flat_map(|(_, _, v)| v.split_whitespace().map(str::to_string))
        .collect()
}

/// Every audit file path the docs and the unit's comments tell an operator to use
/// (`output: /…` in README.md, docs/operations.md and the unit).
fn documented_audit_files() -> Vec<(String, String)> {
    let mut found = Vec::new();
    for file in ["README.md", "docs/operations.md", UNIT] {
        let text = read(file);
        for (at, _) in text.match_indices("output: /") {
            let path: String = text[at + "output: ".len()..]
                .chars()
                .take_while(|c| !c.is_whitespace() && !"`'\"},".contains(*c))
                .collect();
            found.push((file.to_string(), path));
        }
    }
    found
}

/// The binary run to its exit with `args` (bounded: a process that does not exit fails).
fn exit_code(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redis-policy-proxy");
    let until = Instant::now() + DEADLINE;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > until {
            let _ = child.kill();
        }
        std::thread::sleep(POLL);
    }
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The README's audit-to-file step under the shipped unit (issue 28): ProtectSystem=strict
/// makes /var/log read-only, so the path the docs give must be one the unit makes writable
/// (LogsDirectory= or ReadWritePaths=), and the exit code of a configuration the proxy
/// cannot use (checked here with the binary: a bad file, an audit file that cannot be
/// opened) must be one the unit does not restart on.
#[test]
fn the_systemd_unit_lets_the_documented_audit_file_be_written_and_stops_on_config_errors() {
    let settings = unit_settings();
    assert_eq!(service_values(&settings, "ProtectSystem"), ["strict"]);
    let mut writable: Vec<String> = service_values(&settings, "LogsDirectory")
        .iter()
        .map(|d| format!("/var/log/{d}"))
        .collect();
    writable.extend(
        service_values(&settings, "ReadWritePaths")
            .iter()
            .map(|p| p.trim_start_matches(['-', '+']).to_string()),
    );
    let documented = documented_audit_files();
    assert!(
        documented.iter().any(|(f, _)| f == "README.md"),
        "README.md names no audit file: {documented:?}"
    );
    for (file, path) in &documented {
        assert!(
            writable
                .iter()
                .any(|dir| Path::new(path).starts_with(dir) && Path::new(path) != Path::new(dir)),
            "{file}: audit file {path} is not in a directory the unit makes writable {writable:?}"
        );
    }

    let no_restart = service_values(&settings, "RestartPreventExitStatus");
    let dir = TempDir::new("unit-exit");
    let typo = dir.path().join("typo.yaml");
    std::fs::write(&typo, "listn: 127.0.0.1:6380\n").unwrap();
    let audit = dir.path().join("audit.yaml");
    let unwritable = dir.path().join("no-such-dir/audit.jsonl");
    std::fs::write(
        &audit,
        format!(
            "audit:\n  commands: writes\n  output: {}\n",
            unwritable.display()
        ),
    )
    .unwrap();
    let start = |config: &Path| {
        exit_code(&[
            "--config",
            config.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "off",
        ])
    };
    for (what, (code, stderr)) in [
        ("a file with a typo", start(&typo)),
        ("an audit file that cannot be opened", start(&audit)),
    ] {
        let code = code.unwrap_or_else(|| panic!("{what}: killed by a signal: {stderr}"));
        assert!(
            no_restart.contains(&code.to_string()),
            "{what}: exit {code}, which RestartPreventExitStatus={no_restart:?} restarts: {stderr}"
        );
        assert!(!stderr.contains("started"), "{what}: {stderr}");
    }
}

/// `systemd-analyze verify` accepts the unit without a warning (an unknown or misspelt
/// setting is only a warning to systemd, and silently ignored at run time). Its ExecStart
/// is pointed at the built binary, which verify requires to exist. Skipped, saying so,
/// where systemd-analyze is not installed.
#[test]
fn systemd_analyze_verifies_the_unit() {
    let found = Command::new("systemd-analyze")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !found.is_ok_and(|s| s.success()) {
        println!(
            "SKIPPED: systemd-analyze is not installed; the unit's settings are checked above"
        );
        return;
    }
    let dir = TempDir::new("unit-verify");
    let unit = dir.path().join("redis-policy-proxy.service");
    let text = read(UNIT).replace("/usr/local/bin/redis-policy-proxy", BIN);
    assert!(text.contains(&format!("ExecStart={BIN} ")), "{text}");
    std::fs::write(&unit, text).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let about_the_unit: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("redis-policy-proxy"))
        .collect();
    assert!(
        out.status.success() && about_the_unit.is_empty(),
        "systemd-analyze verify {UNIT}: {stderr}"
    );
}
