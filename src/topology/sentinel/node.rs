//! One sentinel, spoken to through fred's `SentinelClient`: the questions
//! (`SENTINEL GET-MASTER-ADDR-BY-NAME`, `SENTINEL REPLICAS`) and the `+switch-master`
//! subscription. fred owns the connection, its RESP decoding and its reconnection; this
//! module only maps the settings of [`SentinelSpec`] onto it and the replies onto plain
//! values. Sentinels are asked over plain TCP without AUTH, as before fred (the config has no
//! sentinel password or TLS), so fred is built without its TLS features.

use std::time::Duration;

use fred::clients::SentinelClient;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface, SentinelInterface};
use fred::types::config::{ConnectionConfig, PerformanceConfig, ReconnectPolicy, SentinelConfig};
use fred::types::{ConnectHandle, Message, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Mutex, broadcast};

use super::SentinelSpec;

/// Reconnect attempts of a subscription before giving up on its sentinel and moving to the
/// next one: a sentinel that restarts is back within them, a dead one is left soon.
const SUBSCRIPTION_RECONNECTS: u32 = 3;

/// What a sentinel answered to `GET-MASTER-ADDR-BY-NAME`.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum MasterAddr {
    /// `host:port` (IPv6 hosts bracketed), still to be confirmed with `ROLE`.
    Named(String),
    /// A nil reply: this sentinel does not monitor the name.
    Unknown,
}

/// One sentinel's fred client and the task that drives its connection.
pub(super) struct Node {
    /// fred's client: the connection is kept between questions and re-established by fred's
    /// reconnect policy when lost.
    client: SentinelClient,
    /// The task driving the client's connection, once started: a question starts it when
    /// absent or finished (fred gave up), as the first question did.
    task: Mutex<Option<ConnectHandle>>,
}

/// `host` and `port` of a configured `host:port` (`[v6]:port` too).
fn split_host_port(addr: &str) -> Result<(String, u16), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("`{addr}` is not host:port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = port
        .parse()
        .map_err(|_| format!("`{addr}` has no valid port"))?;
    Ok((host.to_string(), port))
}

/// `host:port`, bracketing IPv6 hosts.
pub(super) fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Text of a reply element: a bulk or simple string, or an integer (a port may come as
/// either).
pub(super) fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(_) | Value::Bytes(_) | Value::Integer(_) => value.as_string(),
        _ => None,
    }
}

impl Node {
    /// A client for the sentinel at `addr`, not connected yet. Every bound is the spec's
    /// timeout: connecting, the connection's opening commands, and each reply, so a dead or
    /// partitioned sentinel costs at most that per step. `reconnects` is fred's number of
    /// attempts after a lost connection (0: forever).
    fn new(addr: &str, spec: &SentinelSpec, reconnects: u32) -> Result<Node, String> {
        let (host, port) = split_host_port(addr)?;
        let config = SentinelConfig {
            host,
            port,
            ..SentinelConfig::default()
        };
        let perf = PerformanceConfig {
            default_command_timeout: spec.timeout,
            ..PerformanceConfig::default()
        };
        let connection = ConnectionConfig {
            connection_timeout: spec.timeout,
            internal_command_timeout: spec.timeout,
            // A control-plane question is asked again by its caller's loop; fred need not.
            max_command_attempts: 1,
            ..ConnectionConfig::default()
        };
        let delay = spec.timeout.min(Duration::from_secs(1)).as_millis() as u32;
        let policy = ReconnectPolicy::new_constant(reconnects, delay);
        Ok(Node {
            client: SentinelClient::new(config, Some(perf), Some(connection), Some(policy)),
            task: Mutex::new(None),
        })
    }

    /// One client per configured sentinel, for questions (reconnecting forever).
    pub(super) fn for_questions(spec: &SentinelSpec) -> Vec<Result<Node, String>> {
        spec.sentinels
            .iter()
            .map(|addr| Node::new(addr, spec, 0))
            .collect()
    }

    /// Connects unless connected. A client fred is reconnecting fails at once, as a refused
    /// connection did before fred: the caller moves on to the next sentinel rather than
    /// wait for this one.
    async fn ready(&self) -> Result<(), String> {
        let mut task = self.task.lock().await;
        if let Some(running) = task.as_ref() {
            if !running.is_finished() {
                return if self.client.is_connected() {
                    Ok(())
                } else {
                    Err("reconnecting".into())
                };
            }
        }
        let handle = self
            .client
            .init()
            .await
            .map_err(|e| format!("connect failed: {e}"))?;
        *task = Some(handle);
        Ok(())
    }

    /// `SENTINEL GET-MASTER-ADDR-BY-NAME master`.
    pub(super) async fn master_addr(&self, master: &str) -> Result<MasterAddr, String> {
        self.ready().await?;
        let reply: Value = self
            .client
            .get_master_addr_by_name(master)
            .await
            .map_err(|e| e.to_string())?;
        match reply {
            Value::Array(items) if items.len() == 2 => match (text(&items[0]), text(&items[1])) {
                (Some(host), Some(port)) => Ok(MasterAddr::Named(join_host_port(&host, &port))),
                _ => Err("malformed address reply".into()),
            },
            Value::Null => Ok(MasterAddr::Unknown),
            _ => Err("unexpected reply".into()),
        }
    }

    /// `SENTINEL REPLICAS master`: one entry per replica, each a field/value list.
    pub(super) async fn replicas(&self, master: &str) -> Result<Vec<Value>, String> {
        self.ready().await?;
        let reply: Value = self
            .client
            .replicas(master)
            .await
            .map_err(|e| e.to_string())?;
        match reply {
            Value::Array(entries) => Ok(entries),
            _ => Err("unexpected reply".into()),
        }
    }
}

impl Drop for Node {
    /// fred's connection task outlives the client handle: close it, or a follower that
    /// stops (proxy shutdown, a one-off resolve) would leave a connection behind.
    fn drop(&mut self) {
        let client = self.client.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = client.quit().await;
            });
        }
    }
}

/// The `+switch-master` channel of one sentinel: a client of its own (a subscribed
/// connection takes no other command), reconnected by fred a few times
/// ([`SUBSCRIPTION_RECONNECTS`]) and subscribed again after each reconnection.
pub(super) struct Switches {
    /// The subscribed client.
    node: Node,
    /// Published messages, taken before subscribing so none is missed.
    messages: broadcast::Receiver<Message>,
    /// A unit per reconnection: the subscription is renewed, and a failover that happened
    /// while disconnected must be looked up.
    reconnects: broadcast::Receiver<fred::types::config::Server>,
}

/// What the subscription delivered next.
pub(super) enum Switch {
    /// A `+switch-master` payload: `<name> <old-ip> <old-port> <new-ip> <new-port>`.
    Message(String),
    /// Messages may have been missed: fred reconnected (and this subscribed again), or the
    /// message queue overflowed.
    MayHaveMissed,
}

impl Switches {
    /// Connects to `addr` and subscribes to `+switch-master`.
    pub(super) async fn subscribe(addr: &str, spec: &SentinelSpec) -> Result<Switches, String> {
        let node = Node::new(addr, spec, SUBSCRIPTION_RECONNECTS)?;
        let messages = node.client.message_rx();
        let reconnects = node.client.reconnect_rx();
        node.ready().await?;
        node.client
            .subscribe("+switch-master")
            .await
            .map_err(|e| format!("subscribe failed: {e}"))?;
        Ok(Switches {
            node,
            messages,
            reconnects,
        })
    }

    /// The next message or reconnection; an error once fred has given up on the sentinel
    /// (its reconnect attempts spent) or the client closed. No timeout while idle:
    /// failovers are rare, and liveness comes from the connection's errors.
    pub(super) async fn next(&mut self) -> Result<Switch, String> {
        let Switches {
            node,
            messages,
            reconnects,
        } = self;
        let mut task = node.task.lock().await;
        let Some(running) = task.as_mut() else {
            return Err("not connected".into());
        };
        let ended = loop {
            tokio::select! {
                message = messages.recv() => match message {
                    Ok(m) => {
                        if let Some(payload) = text(&m.value) {
                            return Ok(Switch::Message(payload));
                        }
                    }
                    Err(RecvError::Lagged(_)) => return Ok(Switch::MayHaveMissed),
                    Err(RecvError::Closed) => return Err("client closed".into()),
                },
                reconnected = reconnects.recv() => match reconnected {
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        node.client
                            .subscribe("+switch-master")
                            .await
                            .map_err(|e| format!("subscribe failed: {e}"))?;
                        return Ok(Switch::MayHaveMissed);
                    }
                    Err(RecvError::Closed) => return Err("client closed".into()),
                },
                ended = &mut *running => break ended,
            }
        };
        *task = None;
        Err(match ended {
            Ok(Ok(())) => "connection closed".to_string(),
            Ok(Err(e)) => format!("connection lost: {e}"),
            Err(e) => format!("connection task failed: {e}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_split_and_join_with_ipv6_brackets() {
        assert_eq!(
            split_host_port("127.0.0.1:26379").unwrap(),
            ("127.0.0.1".to_string(), 26379)
        );
        assert_eq!(
            split_host_port("[::1]:26379").unwrap(),
            ("::1".to_string(), 26379)
        );
        assert!(split_host_port("nohost").is_err());
        assert!(split_host_port("h:port").is_err());
        assert_eq!(join_host_port("::1", "7002"), "[::1]:7002");
        assert_eq!(join_host_port("10.0.0.1", "7002"), "10.0.0.1:7002");
    }
}
