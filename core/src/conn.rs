//! Connections: URL parsing, TLS, timeouts, cluster, reconnects with backoff, and fork
//! safety (a process that inherited a connection never uses or closes it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::{ConnectionLike, RedisResult};

use crate::error::{Error, Result};

/// Connection settings shared by a queue and the workers built on it.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// Longest wait for one reply.
    pub read_timeout: Duration,
    /// How long a call keeps reconnecting after a dropped connection or a restarted
    /// Redis before it gives up with an error.
    pub retry_timeout: Duration,
    /// PEM file of the CA that signed the server's certificate, for `rediss://` with a
    /// private CA (otherwise the system's roots are used).
    pub tls_ca_file: Option<std::path::PathBuf>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(5),
            retry_timeout: Duration::from_secs(5),
            tls_ca_file: None,
        }
    }
}

enum ClientKind {
    Single(redis::Client),
    /// The cluster client, and one plain client per seed node for the wake-up
    /// subscription (a cluster delivers every PUBLISH to every node).
    Cluster(redis::cluster::ClusterClient, Vec<redis::Client>),
}

/// A parsed, validated place to connect to. Creating one does not connect.
pub(crate) struct Endpoint {
    client: ClientKind,
    /// The URL without its password, for messages.
    pub(crate) display: String,
    pub(crate) opts: ConnectOptions,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.display)
            .finish_non_exhaustive()
    }
}

fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, host)) => format!("{scheme}://***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl Endpoint {
    pub(crate) fn parse(url: &str, opts: ConnectOptions) -> Result<Self> {
        let display = redact(url);
        let bad = |reason: String| Error::InvalidUrl {
            url: display.clone(),
            reason,
        };
        for (name, d) in [
            ("connect_timeout", opts.connect_timeout),
            ("read_timeout", opts.read_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::invalid(name, "must be greater than zero"));
            }
        }
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected redis://, rediss://, redis+cluster:// or rediss+cluster://".into()))?;
        let client = match scheme {
            "redis" | "rediss" => {
                let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| bad(e.to_string()))?;
                let client = match (&opts.tls_ca_file, scheme) {
                    (Some(ca), "rediss") => {
                        let root = std::fs::read(ca)
                            .map_err(|e| Error::invalid("tls_ca_file", format!("{}: {e}", ca.display())))?;
                        redis::Client::build_with_tls(
                            info,
                            redis::TlsCertificates {
                                client_tls: None,
                                root_cert: Some(root),
                            },
                        )
                    }
                    (Some(_), _) => return Err(Error::invalid("tls_ca_file", "only applies to rediss:// URLs")),
                    (None, _) => redis::Client::open(info),
                }
                .map_err(|e| bad(e.to_string()))?;
                ClientKind::Single(client)
            }
            "redis+cluster" | "rediss+cluster" => {
                // One URL, several seed nodes: userinfo and path apply to all of them.
                let node_scheme = scheme.trim_end_matches("+cluster");
                let (userinfo, hosts) = match rest.rsplit_once('@') {
                    Some((u, h)) => (format!("{u}@"), h),
                    None => (String::new(), rest),
                };
                let hosts = hosts.split('/').next().unwrap_or_default();
                let nodes: Vec<String> = hosts
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(|h| format!("{node_scheme}://{userinfo}{h}"))
                    .collect();
                if nodes.is_empty() {
                    return Err(bad("a cluster URL needs at least one host:port".into()));
                }
                let seeds = nodes
                    .iter()
                    .map(|n| redis::Client::open(n.as_str()).map_err(|e| bad(e.to_string())))
                    .collect::<Result<Vec<_>>>()?;
                let client = redis::cluster::ClusterClient::builder(nodes)
                    .connection_timeout(opts.connect_timeout)
                    .response_timeout(opts.read_timeout)
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                ClientKind::Cluster(client, seeds)
            }
            other => return Err(bad(format!("unsupported scheme {other:?}"))),
        };
        Ok(Self { client, display, opts })
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.client, ClientKind::Cluster(..))
    }

    pub(crate) fn error(&self, err: &redis::RedisError, operation: &str) -> Error {
        let timeout = u64::try_from(self.opts.read_timeout.as_millis()).unwrap_or(u64::MAX);
        Error::from_redis(err, &self.display, operation, timeout)
    }

    pub(crate) fn connect(&self) -> Result<Conn> {
        let conn = match &self.client {
            ClientKind::Single(client) => {
                let con = client
                    .get_connection_with_timeout(self.opts.connect_timeout)
                    .map_err(|e| self.connect_error(&e))?;
                con.set_read_timeout(Some(self.opts.read_timeout))
                    .map_err(|e| self.connect_error(&e))?;
                con.set_write_timeout(Some(self.opts.read_timeout))
                    .map_err(|e| self.connect_error(&e))?;
                Conn::Single(con)
            }
            ClientKind::Cluster(client, _) => {
                Conn::Cluster(Box::new(client.get_connection().map_err(|e| self.connect_error(&e))?))
            }
        };
        Ok(conn)
    }

    fn connect_error(&self, err: &redis::RedisError) -> Error {
        match self.error(err, "connect") {
            e @ (Error::AuthFailed(_) | Error::InvalidUrl { .. }) => e,
            Error::Timeout { .. } => Error::Connection {
                addr: self.display.clone(),
                reason: format!("no answer within {:?} (connect_timeout)", self.opts.connect_timeout),
            },
            other => Error::Connection {
                addr: self.display.clone(),
                reason: match other {
                    Error::Connection { reason, .. } => reason,
                    e => e.to_string(),
                },
            },
        }
    }

    /// A plain connection for pub/sub. On a cluster, to seed node `attempt` (modulo
    /// their number), so that a caller that counts its attempts goes round the seeds
    /// while some are down.
    pub(crate) fn pubsub_connection(&self, attempt: usize) -> Result<redis::Connection> {
        let client = match &self.client {
            ClientKind::Single(client) => client,
            ClientKind::Cluster(_, seeds) => &seeds[attempt % seeds.len()],
        };
        client
            .get_connection_with_timeout(self.opts.connect_timeout)
            .map_err(|e| self.connect_error(&e))
    }
}

/// One live connection.
pub(crate) enum Conn {
    Single(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Conn {
    pub(crate) fn as_dyn(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Self::Single(c) => c,
            Self::Cluster(c) => &mut **c,
        }
    }

    /// Run a keyless command (WAIT) on the master that serves `key`, over the same
    /// connection that wrote to it.
    pub(crate) fn query_on_key_node(&mut self, cmd: &redis::Cmd, key: &str) -> RedisResult<i64> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match self {
            Self::Single(c) => cmd.query(c),
            Self::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let v = c.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)))?;
                Ok(redis::FromRedisValue::from_redis_value(v)?)
            }
        }
    }
}

static EVICTION_WARNED: AtomicBool = AtomicBool::new(false);

fn warn_if_evicting(conn: &mut Conn) {
    if EVICTION_WARNED.load(Ordering::Relaxed) {
        return;
    }
    // Managed Redis often forbids CONFIG: then there is nothing to check.
    let policy: RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query(conn.as_dyn());
    if let Ok(reply) = policy
        && let Some(policy) = reply.get(1)
        && policy.starts_with("allkeys-")
        && !EVICTION_WARNED.swap(true, Ordering::Relaxed)
    {
        log::warn!(
            "Redis maxmemory-policy is {policy}: under memory pressure Redis may evict delayq's keys, \
             and an evicted message is lost; use noeviction (or a volatile-* policy) for queues"
        );
    }
}

/// Whether a failed call may be sent again safely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    /// Running it twice has the effect of running it once (push with its id, reads).
    Safe,
    /// Not retried after a timeout, when the first call may still be running.
    IfNotSent,
}

/// A lazily opened, fork-aware connection that reconnects with backoff.
pub(crate) struct ConnSlot {
    conn: Option<Conn>,
    forks: u64,
}

impl std::fmt::Debug for ConnSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnSlot").field("open", &self.conn.is_some()).finish()
    }
}

impl Default for ConnSlot {
    fn default() -> Self {
        Self::new()
    }
}

impl ConnSlot {
    pub(crate) fn new() -> Self {
        Self {
            conn: None,
            forks: crate::fork::generation(),
        }
    }

    fn take_over_after_fork(&mut self) {
        let forks = crate::fork::generation();
        if forks != self.forks {
            // The socket (and any TLS session) belongs to the parent: closing it, or a
            // TLS close_notify, would disturb the parent's connection. Leak it instead.
            if let Some(conn) = self.conn.take() {
                std::mem::forget(conn);
            }
            self.forks = forks;
        }
    }

    /// Run `op` once; on a connection fault reconnect and try again (as `replay`
    /// allows) until `ep.opts.retry_timeout` has passed.
    pub(crate) fn run<T>(
        &mut self,
        ep: &Endpoint,
        operation: &str,
        replay: Replay,
        mut op: impl FnMut(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<T> {
        self.run_conn(ep, operation, replay, |con| op(con.as_dyn()))
    }

    /// `run`, for an `op` that needs the connection itself (cluster routing).
    pub(crate) fn run_conn<T>(
        &mut self,
        ep: &Endpoint,
        operation: &str,
        replay: Replay,
        mut op: impl FnMut(&mut Conn) -> RedisResult<T>,
    ) -> Result<T> {
        self.take_over_after_fork();
        let deadline = Instant::now() + ep.opts.retry_timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            let attempt = match self.conn.as_mut() {
                Some(conn) => Ok(conn),
                None => ep.connect().map(|mut conn| {
                    warn_if_evicting(&mut conn);
                    self.conn.insert(conn)
                }),
            };
            let err = match attempt {
                Ok(conn) => match op(conn) {
                    Ok(v) => return Ok(v),
                    Err(e) => {
                        let err = ep.error(&e, operation);
                        if !err.is_retryable() {
                            return Err(err);
                        }
                        self.conn = None;
                        // A timeout is the ambiguous case: the server may be executing
                        // the call right now. A dropped connection almost always means
                        // the request never ran (Redis restarted, the socket was stale).
                        if replay == Replay::IfNotSent && err.is_timeout() {
                            return Err(err);
                        }
                        err
                    }
                },
                Err(e) if e.is_retryable() => e,
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now + pause > deadline {
                return Err(err);
            }
            log::debug!("{operation}: {err}; retrying in {pause:?}");
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// One try, for the pool's threads, which do their own stop-aware backoff: a
    /// retryable failure drops the connection so that the next call reconnects.
    pub(crate) fn run_once<T>(
        &mut self,
        ep: &Endpoint,
        operation: &str,
        op: impl FnOnce(&mut dyn ConnectionLike) -> RedisResult<T>,
    ) -> Result<T> {
        self.take_over_after_fork();
        if self.conn.is_none() {
            let mut conn = ep.connect()?;
            warn_if_evicting(&mut conn);
            self.conn = Some(conn);
        }
        let Some(conn) = self.conn.as_mut() else {
            return Err(Error::State("connection vanished".into()));
        };
        op(conn.as_dyn()).map_err(|e| {
            let err = ep.error(&e, operation);
            if err.is_retryable() {
                self.conn = None;
            }
            err
        })
    }
}
