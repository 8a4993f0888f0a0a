//! Connections: URL parsing, TLS, timeouts, cluster, Sentinel, reconnects with backoff,
//! and fork safety (a process that inherited a connection never uses or closes it).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::{ConnectionLike, RedisResult};

use crate::error::{Error, Result};

/// Connection settings shared by a queue and the workers built on it.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// A master that Redis Sentinel names: asked for on every (re)connect.
    Sentinel(Box<Sentinels>),
}

/// The sentinels of one replicated Redis, and how to reach the master they name.
struct Sentinels {
    /// (host:port as given, a client for it)
    nodes: Vec<(String, redis::Client)>,
    /// The sentinels' ACL user ("default" when the URL names none), for messages.
    user: String,
    service: String,
    /// The master's URL around its address: `scheme://userinfo@` and `/db#fragment`.
    master_prefix: String,
    master_suffix: String,
    db: i64,
    tls_root: Option<Vec<u8>>,
    /// The sentinel that answered last is asked first, as the Sentinel client
    /// specification asks: a sentinel that is down costs one connect timeout once.
    first: AtomicUsize,
}

/// A parsed, validated place to connect to. Creating one does not connect.
pub(crate) struct Endpoint {
    client: ClientKind,
    /// The URL without its password, for messages.
    pub(crate) display: String,
    /// The ACL user the URL names ("default" when it names none), for messages.
    pub(crate) user: String,
    /// The database the URL selects, for messages.
    db: i64,
    pub(crate) opts: ConnectOptions,
    /// Raised when a sentinel announces a new master: connections made before it are
    /// to the old one, which may still accept writes until Sentinel demotes it.
    master_epoch: AtomicU64,
    /// The server has this build's library of functions (`scripts::LIBRARY`) and lets
    /// the user call them: script calls go as FCALL, else as EVALSHA. Asked at each
    /// new connection; a call that finds the library gone goes back to EVALSHA.
    pub(crate) functions: AtomicBool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.display)
            .finish_non_exhaustive()
    }
}

/// Where the query of `rest` (what follows `scheme://`) starts: at the first `?name=`.
/// A `?` that no `name=` follows may be part of a password.
fn query_start(rest: &str) -> Option<usize> {
    rest.match_indices('?').map(|(i, _)| i).find(|&i| {
        let name = rest[i + 1..]
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
            .count();
        name > 0 && rest.as_bytes().get(i + 1 + name) == Some(&b'=')
    })
}

/// The userinfo of `rest` (what follows `scheme://`), `None` without one, and what
/// follows it. A password may hold `@`, `/`, `?` and `#`: the userinfo ends at the last
/// `@` before the query (whose `sentinel_password` may hold an `@` too).
fn split_userinfo(rest: &str) -> (Option<&str>, &str) {
    let end = query_start(rest).unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    }
}

/// The user of `scheme://[user[:password]@]host...`: "default" without one, as Redis
/// names the user of a connection that gives only a password.
fn url_user(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    match split_userinfo(rest).0.and_then(|info| info.split(':').next()) {
        Some(user) if !user.is_empty() => user.to_owned(),
        _ => "default".to_owned(),
    }
}

/// `url` for messages: its userinfo and its query (a sentinel's password rides there)
/// left out. An `@` after the start of the query may end a userinfo whose password
/// holds `?name=`: then nothing after the scheme is shown. A port that is not a number
/// may be a password whose `@host` is missing: it is left out too.
fn redact(url: &str) -> String {
    let (prefix, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    if query_start(rest).is_some_and(|q| rest[q..].contains('@')) {
        return format!("{prefix}***");
    }
    let (userinfo, after) = split_userinfo(rest);
    let after = after.split('?').next().unwrap_or_default();
    let (hosts, path) = after.split_at(after.find(['/', '#']).unwrap_or(after.len()));
    let hosts: Vec<String> = hosts
        .split(',')
        .map(|h| match h.rsplit_once(':') {
            Some((name, port)) if !port.ends_with(']') && !port.bytes().all(|b| b.is_ascii_digit()) => {
                format!("{name}:***")
            }
            _ => h.to_owned(),
        })
        .collect();
    let host = format!("{}{path}", hosts.join(","));
    match userinfo {
        Some(_) => format!("{prefix}***@{host}"),
        None => format!("{prefix}{host}"),
    }
}

/// A user or password that a URL parser would cut short, in `rest` (what follows
/// `scheme://`).
fn userinfo_problem(rest: &str) -> Option<String> {
    split_userinfo(rest).0.filter(|u| u.contains(['/', '?', '#'])).map(|_| {
        "the user or password holds a /, ? or #, which a URL reads as the end of the host: percent-encode them \
         (/ as %2F, ? as %3F, # as %23)"
            .to_owned()
    })
}

/// What is wrong with one node's `url` (`scheme://[userinfo@]host[:port][/db]`), in words
/// that name the part, where redis-rs would only say that it did not parse; `None`
/// when nothing is found. Never quotes the userinfo.
fn url_problem(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    if let Some(problem) = userinfo_problem(rest) {
        return Some(problem);
    }
    let after = split_userinfo(rest).1;
    // An `@` after the query's start: what looks like the port may be in the password.
    let ambiguous = query_start(rest).is_some_and(|q| rest[q..].contains('@'));
    let port = || {
        if ambiguous {
            return None;
        }
        let host = after.split(['/', '?', '#']).next().unwrap_or_default();
        host.rsplit_once(':')
            .filter(|(_, port)| !port.ends_with(']'))
            .map(|(_, port)| port)
    };
    match url::Url::parse(url) {
        // Only a number is quoted: letters there may be a password whose `@` is missing.
        Err(url::ParseError::InvalidPort) => Some(match port() {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                format!("port {p} is out of range (1-65535)")
            }
            _ => "the port is not a number".into(),
        }),
        Err(url::ParseError::EmptyHost) => Some("the host is missing".into()),
        Err(e) => Some(format!("it does not parse: {e}")),
        Ok(parsed) if parsed.port() == Some(0) => Some("port 0 is out of range (1-65535)".into()),
        Ok(_) => None,
    }
}

fn read_ca(opts: &ConnectOptions) -> Result<Option<Vec<u8>>> {
    opts.tls_ca_file
        .as_ref()
        .map(|ca| std::fs::read(ca).map_err(|e| Error::invalid("tls_ca_file", format!("{}: {e}", ca.display()))))
        .transpose()
}

/// `url` parsed, without redis-rs's `CLIENT SETINFO` on connect: a round trip that
/// Redis before 7.2 refuses anyway, paid by every PHP-FPM request that connects. Over
/// TLS it stays: it makes the handshake happen while connecting, so that a certificate
/// the CA does not vouch for is reported as a connection error naming the server, not
/// as a connection lost during the first call.
fn connection_info(url: &str) -> redis::RedisResult<redis::ConnectionInfo> {
    let info = redis::IntoConnectionInfo::into_connection_info(url)?;
    if url.starts_with("rediss://") {
        return Ok(info);
    }
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    Ok(info.set_redis_settings(settings))
}

fn open_client(url: &str, tls_root: Option<&Vec<u8>>) -> redis::RedisResult<redis::Client> {
    let url = connection_info(url)?;
    match tls_root {
        Some(root) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root.clone()),
            },
        ),
        None => redis::Client::open(url),
    }
}

/// `redis+sentinel://[user:password@]host[:port][,host[:port]...]/master-name[/db]
/// [?sentinel_username=...&sentinel_password=...]`: the user and password are the
/// master's; sentinels with a password of their own take it from the query.
fn parse_sentinels(
    scheme: &str,
    rest: &str,
    opts: &ConnectOptions,
    bad: impl Fn(String) -> Error,
) -> Result<Sentinels> {
    let node_scheme = scheme.trim_end_matches("+sentinel");
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, format!("#{f}")),
        None => (rest, String::new()),
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (format!("{u}@"), r),
        None => (String::new(), rest),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut path = path.split('/').filter(|p| !p.is_empty());
    let service = path
        .next()
        .ok_or_else(|| {
            bad("a sentinel URL names the master after the hosts: redis+sentinel://host:26379/mymaster".into())
        })?
        .to_owned();
    let db = match path.next() {
        Some(db) => db.parse::<i64>().map_err(|_| {
            bad(format!(
                "the database after the master name must be a number, not {db:?}"
            ))
        })?,
        None => 0,
    };
    if let Some(extra) = path.next() {
        return Err(bad(format!("unexpected {extra:?} after the master name and database")));
    }
    let mut sentinel_userinfo = (String::new(), String::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sentinel_username", v)) => sentinel_userinfo.0 = v.to_owned(),
            Some(("sentinel_password", v)) => sentinel_userinfo.1 = v.to_owned(),
            _ => {
                let name = pair.split('=').next().unwrap_or_default();
                return Err(bad(format!(
                    "unknown query parameter {name:?} (expected sentinel_username, sentinel_password)"
                )));
            }
        }
    }
    let sentinel_user = match sentinel_userinfo.0.as_str() {
        "" => "default".to_owned(),
        user => user.to_owned(),
    };
    let sentinel_userinfo = match sentinel_userinfo {
        (u, p) if u.is_empty() && p.is_empty() => String::new(),
        (u, p) => format!("{u}:{p}@"),
    };
    let tls_root = read_ca(opts)?;
    let nodes = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            let h = if h
                .rsplit_once(':')
                .is_some_and(|(_, p)| p.chars().all(|c| c.is_ascii_digit()))
                && !h.ends_with(']')
            {
                h.to_owned()
            } else {
                format!("{h}:26379")
            };
            let url = format!("{node_scheme}://{sentinel_userinfo}{h}{fragment}");
            if let Some(problem) = url_problem(&url) {
                return Err(bad(format!("sentinel {h}: {problem}")));
            }
            let client = open_client(&url, tls_root.as_ref()).map_err(|e| bad(format!("sentinel {h}: {e}")))?;
            Ok((h, client))
        })
        .collect::<Result<Vec<_>>>()?;
    if nodes.is_empty() {
        return Err(bad("a sentinel URL needs at least one sentinel host[:port]".into()));
    }
    Ok(Sentinels {
        nodes,
        user: sentinel_user,
        service,
        master_prefix: format!("{node_scheme}://{userinfo}"),
        master_suffix: format!("/{db}{fragment}"),
        db,
        tls_root,
        first: AtomicUsize::new(0),
    })
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
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            bad(
                "expected redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// or \
                     rediss+sentinel://"
                    .into(),
            )
        })?;
        if let Some(problem) = userinfo_problem(rest) {
            return Err(bad(problem));
        }
        if opts.tls_ca_file.is_some() && !scheme.starts_with("rediss") {
            return Err(Error::invalid("tls_ca_file", "only applies to rediss:// URLs"));
        }
        let mut db = 0;
        let client = match scheme {
            "redis" | "rediss" => {
                if let Some(problem) = url_problem(url) {
                    return Err(bad(problem));
                }
                let info = connection_info(url).map_err(|e| bad(e.to_string()))?;
                db = info.redis_settings().db();
                let client = match read_ca(&opts)? {
                    Some(root) => redis::Client::build_with_tls(
                        info,
                        redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(root),
                        },
                    ),
                    None => redis::Client::open(info),
                }
                .map_err(|e| bad(e.to_string()))?;
                ClientKind::Single(client)
            }
            "redis+sentinel" | "rediss+sentinel" => {
                let sentinels = parse_sentinels(scheme, rest, &opts, bad)?;
                db = sentinels.db;
                ClientKind::Sentinel(Box::new(sentinels))
            }
            "redis+cluster" | "rediss+cluster" => {
                // One URL, several seed nodes: the userinfo applies to all of them.
                let node_scheme = scheme.trim_end_matches("+cluster");
                let (userinfo, hosts) = match split_userinfo(rest) {
                    (Some(u), h) => (format!("{u}@"), h),
                    (None, h) => (String::new(), h),
                };
                // Not shown: what follows may hold a password the split above missed.
                if hosts.contains(['?', '#']) {
                    return Err(bad("a cluster URL takes no query or fragment (after `?` or `#`)".into()));
                }
                let (hosts, path) = hosts.split_once('/').unwrap_or((hosts, ""));
                // A cluster serves database 0 only (SELECT is refused there).
                if !matches!(path.trim_matches('/'), "" | "0") {
                    return Err(bad(format!(
                        "a cluster has database 0 only, the URL's path asks for {:?}",
                        path.trim_matches('/')
                    )));
                }
                let nodes: Vec<String> = hosts
                    .split(',')
                    .filter(|h| !h.is_empty())
                    .map(|h| format!("{node_scheme}://{userinfo}{h}"))
                    .collect();
                if nodes.is_empty() {
                    return Err(bad("a cluster URL needs at least one host:port".into()));
                }
                if let Some(problem) = nodes.iter().find_map(|n| url_problem(n)) {
                    return Err(bad(problem));
                }
                let ca = read_ca(&opts)?;
                let seeds = nodes
                    .iter()
                    .map(|n| open_client(n, ca.as_ref()).map_err(|e| bad(e.to_string())))
                    .collect::<Result<Vec<_>>>()?;
                let mut builder = redis::cluster::ClusterClient::builder(nodes)
                    .connection_timeout(opts.connect_timeout)
                    .response_timeout(opts.read_timeout);
                if let Some(root) = ca {
                    builder = builder.certs(redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(root),
                    });
                }
                let client = builder.build().map_err(|e| bad(e.to_string()))?;
                ClientKind::Cluster(client, seeds)
            }
            other => return Err(bad(format!("unsupported scheme {other:?}"))),
        };
        Ok(Self {
            client,
            display,
            user: url_user(url),
            db,
            opts,
            master_epoch: AtomicU64::new(0),
            functions: AtomicBool::new(false),
        })
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.client, ClientKind::Cluster(..))
    }

    /// The master name, when a sentinel names the master.
    pub(crate) fn sentinel_service(&self) -> Option<&str> {
        match &self.client {
            ClientKind::Sentinel(s) => Some(&s.service),
            _ => None,
        }
    }

    pub(crate) fn master_epoch(&self) -> u64 {
        self.master_epoch.load(Ordering::Acquire)
    }

    /// A sentinel announced a new master: every connection made before is to be
    /// dropped at its next use, and a new one asks the sentinels again.
    pub(crate) fn master_switched(&self) {
        self.master_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// A connection to sentinel `attempt` (modulo their number), for watching its
    /// announcements; `None` unless a sentinel names the master.
    pub(crate) fn sentinel_connection(&self, attempt: usize) -> Option<Result<(String, redis::Connection)>> {
        let ClientKind::Sentinel(s) = &self.client else {
            return None;
        };
        let (host, client) = &s.nodes[attempt % s.nodes.len()];
        Some(
            self.timed_connection(client)
                .map(|c| (host.clone(), c))
                .map_err(|e| self.connect_error_as(&e, &s.user)),
        )
    }

    /// A new connection through `client`, within the connect timeout.
    fn open(&self, client: &redis::Client) -> redis::RedisResult<redis::Connection> {
        client
            .get_connection_with_timeout(self.opts.connect_timeout)
            .map_err(|e| self.why_auth_failed(client.get_connection_info(), e))
    }

    /// redis-rs reports every refused AUTH as "Password authentication failed": when
    /// `err` is that, send the AUTH again over a connection without credentials to `info`'s
    /// server, and when Redis answers that the user has no password, return that answer
    /// (what to do differs: remove the password, not correct it). Otherwise `err`.
    fn why_auth_failed(&self, info: &redis::ConnectionInfo, err: redis::RedisError) -> redis::RedisError {
        let settings = info.redis_settings();
        let Some(password) = settings
            .password()
            .filter(|_| err.kind() == redis::ErrorKind::AuthenticationFailed)
        else {
            return err;
        };
        let bare = info
            .clone()
            .set_redis_settings(redis::RedisConnectionInfo::default().set_skip_set_lib_name());
        let Ok(mut con) =
            redis::Client::open(bare).and_then(|c| c.get_connection_with_timeout(self.opts.connect_timeout))
        else {
            return err;
        };
        let _ = con.set_read_timeout(Some(self.opts.read_timeout));
        let mut auth = |user: Option<&str>| {
            let mut cmd = redis::cmd("AUTH");
            cmd.arg(user).arg(password);
            cmd.query::<()>(&mut con)
        };
        let mut reply = auth(settings.username());
        // As redis-rs does: Redis before 6 knows AUTH only with the password.
        if settings.username().is_some()
            && reply
                .as_ref()
                .is_err_and(|e| e.to_string().contains("wrong number of arguments"))
        {
            reply = auth(None);
        }
        match reply {
            Err(e) if e.to_string().contains("without any password configured") => redis::RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "Password authentication failed",
                e.detail().unwrap_or_default().to_owned(),
            )),
            _ => err,
        }
    }

    fn timed_connection(&self, client: &redis::Client) -> redis::RedisResult<redis::Connection> {
        let con = self.open(client)?;
        con.set_read_timeout(Some(self.opts.read_timeout))?;
        con.set_write_timeout(Some(self.opts.read_timeout))?;
        Ok(con)
    }

    /// Sentinel `i`'s answer: the master's `host:port`, `None` if it knows no master
    /// of that name. Over `cached` when given (and kept there), else a new connection.
    fn ask_sentinel(
        &self,
        s: &Sentinels,
        i: usize,
        cached: Option<&mut Option<redis::Connection>>,
    ) -> redis::RedisResult<Option<String>> {
        let mut fresh = None;
        let slot = cached.unwrap_or(&mut fresh);
        if slot.is_none() {
            *slot = Some(self.timed_connection(&s.nodes[i].1)?);
        }
        let Some(con) = slot.as_mut() else {
            return Ok(None);
        };
        let named: redis::RedisResult<Option<(String, u16)>> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&s.service)
            .query(con);
        if named.is_err() {
            *slot = None;
        }
        Ok(named?.map(|(ip, port)| {
            if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }
        }))
    }

    /// The master a sentinel names now, asked over `cached` (kept for the next time);
    /// `None` when no sentinel answers (the connection in use is then kept).
    fn named_master(&self, cached: &mut Option<(usize, redis::Connection)>) -> Option<String> {
        let ClientKind::Sentinel(s) = &self.client else {
            return None;
        };
        let (i, con) = cached
            .take()
            .map_or((s.first.load(Ordering::Relaxed), None), |(i, c)| (i, Some(c)));
        let mut con = con;
        let named = self.ask_sentinel(s, i, Some(&mut con)).ok().flatten();
        *cached = con.map(|c| (i, c));
        if cached.is_none() {
            // This sentinel failed: ask the next one next time.
            s.first.store((i + 1) % s.nodes.len(), Ordering::Relaxed);
        }
        named
    }

    /// Ask the sentinels in turn for the master, and connect to it once it says it is
    /// one: a sentinel's view may be a failover behind. Returns the master's address.
    fn connect_via_sentinels(&self, s: &Sentinels) -> Result<(redis::Connection, String)> {
        let count = s.nodes.len();
        let first = s.first.load(Ordering::Relaxed);
        let mut why = Vec::new();
        for k in 0..count {
            let i = (first + k) % count;
            let host = &s.nodes[i].0;
            let addr = match self.ask_sentinel(s, i, None) {
                Ok(Some(addr)) => addr,
                Ok(None) => {
                    why.push(format!("sentinel {host} knows no master named {:?}", s.service));
                    continue;
                }
                Err(e) => match self.connect_error_as(&e, &s.user) {
                    Error::AuthFailed(text) => return Err(Error::AuthFailed(format!("sentinel {host}: {text}"))),
                    e => {
                        why.push(format!("sentinel {host}: {e}"));
                        continue;
                    }
                },
            };
            let master = open_client(
                &format!("{}{addr}{}", s.master_prefix, s.master_suffix),
                s.tls_root.as_ref(),
            )
            .and_then(|client| self.timed_connection(&client))
            .and_then(|mut con| {
                let role: redis::RedisResult<Vec<redis::Value>> = redis::cmd("ROLE").query(&mut con);
                let is_master = match role {
                    Ok(role) => matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master"),
                    // A least-privilege ACL user may not run ROLE: trust the sentinel.
                    Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => true,
                    Err(e) => return Err(e),
                };
                Ok((con, is_master))
            });
            match master {
                Ok((con, true)) => {
                    s.first.store(i, Ordering::Relaxed);
                    return Ok((con, addr));
                }
                Ok((_, false)) => why.push(format!(
                    "sentinel {host} named {addr}, which is not a master (a failover is under way)"
                )),
                Err(e) => match self.connect_error(&e) {
                    e @ (Error::AuthFailed(_) | Error::InvalidUrl { .. }) => return Err(e),
                    e => why.push(format!("sentinel {host} named {addr}: {e}")),
                },
            }
        }
        Err(Error::Connection {
            addr: self.display.clone(),
            reason: why.join("; "),
        })
    }

    pub(crate) fn error(&self, err: &redis::RedisError, operation: &str) -> Error {
        let timeout = u64::try_from(self.opts.read_timeout.as_millis()).unwrap_or(u64::MAX);
        Error::from_redis(err, &self.display, &self.user, operation, timeout)
    }

    /// A new connection, and under Sentinel the master's address it goes to.
    pub(crate) fn connect(&self) -> Result<(Conn, Option<String>)> {
        let conn = match &self.client {
            ClientKind::Single(client) => {
                Conn::single(self.timed_connection(client).map_err(|e| self.connect_error(&e))?)
            }
            ClientKind::Cluster(client, seeds) => Conn::Cluster(Box::new(client.get_connection().map_err(|e| {
                // The cluster client reports a refused AUTH as a failure to reach every
                // node: one seed, asked alone, says why.
                if e.to_string().contains("Password authentication failed")
                    && let Some(Err(seed)) = seeds.first().map(|seed| self.open(seed))
                    && seed.kind() == redis::ErrorKind::AuthenticationFailed
                {
                    return self.connect_error(&seed);
                }
                self.connect_error(&e)
            })?)),
            ClientKind::Sentinel(s) => {
                let (con, addr) = self.connect_via_sentinels(s)?;
                return Ok((Conn::single(con), Some(addr)));
            }
        };
        Ok((conn, None))
    }

    fn connect_error(&self, err: &redis::RedisError) -> Error {
        self.connect_error_as(err, &self.user)
    }

    /// `connect_error` for a connection as `user` (a sentinel's may differ).
    fn connect_error_as(&self, err: &redis::RedisError, user: &str) -> Error {
        // redis-rs's words when Redis refuses the SELECT of the URL's database: no retry
        // can make it exist.
        if err.to_string().contains("refused to switch database") {
            let said = err.detail().unwrap_or("refused");
            let hint = if said.contains("out of range") {
                " (the server has fewer databases: see its `databases` setting)"
            } else {
                ""
            };
            return Error::InvalidUrl {
                url: self.display.clone(),
                reason: format!("Redis refused to select database {}: {said}{hint}", self.db),
            };
        }
        let timeout = u64::try_from(self.opts.read_timeout.as_millis()).unwrap_or(u64::MAX);
        match Error::from_redis(err, &self.display, user, "connect", timeout) {
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
            ClientKind::Sentinel(s) => return self.connect_via_sentinels(s).map(|(con, _)| con),
        };
        self.open(client).map_err(|e| self.connect_error(&e))
    }
}

/// One live connection.
pub(crate) enum Conn {
    Single {
        con: redis::Connection,
        /// The scripts a stream has seen its server run (see `scripts::Stream`).
        streamed: Vec<&'static str>,
    },
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl Conn {
    fn single(con: redis::Connection) -> Self {
        Self::Single {
            con,
            streamed: Vec::new(),
        }
    }

    pub(crate) fn as_dyn(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Self::Single { con, .. } => con,
            Self::Cluster(c) => &mut **c,
        }
    }

    /// Run a keyless command (WAIT) on the master that serves `key`, over the same
    /// connection that wrote to it.
    pub(crate) fn query_on_key_node(&mut self, cmd: &redis::Cmd, key: &str) -> RedisResult<i64> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match self {
            Self::Single { con, .. } => cmd.query(con),
            Self::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let v = c.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)))?;
                Ok(redis::FromRedisValue::from_redis_value(v)?)
            }
        }
    }
}

/// What this process last saw of each server's eviction policy: when, and whether
/// it evicts. A new connection looks once per server (not on every connection, which
/// would cost a PHP-FPM request that connects to push a second round trip); a running
/// pool looks again at its heartbeat, at most every `eviction_recheck()`, so that a
/// policy changed under it is reported too.
static EVICTION_SEEN: std::sync::Mutex<std::collections::BTreeMap<String, (Instant, bool)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Milliseconds between a pool's looks at the eviction policy (5 minutes).
static EVICTION_RECHECK_MS: AtomicU64 = AtomicU64::new(300_000);

/// How often a running pool looks at the server's eviction policy again; for tests,
/// which cannot wait the default 5 minutes.
#[doc(hidden)]
pub fn set_eviction_recheck(every: Duration) {
    EVICTION_RECHECK_MS.store(u64::try_from(every.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Look at `server`'s maxmemory-policy unless this process did within `again` (`None`:
/// ever), and warn when it evicts and did not at the last look.
fn warn_if_evicting(conn: &mut Conn, server: &str, again: Option<Duration>) {
    let was_evicting = {
        let Ok(mut seen) = EVICTION_SEEN.lock() else { return };
        let now = Instant::now();
        match seen.get_mut(server) {
            Some((at, evicting)) => {
                if again.is_none_or(|every| now.duration_since(*at) < every) {
                    return;
                }
                *at = now;
                *evicting
            }
            None => {
                seen.insert(server.to_owned(), (now, false));
                false
            }
        }
    };
    // Managed Redis often forbids CONFIG: then there is nothing to check.
    let policy: RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query(conn.as_dyn());
    let Ok(reply) = policy else { return };
    let Some(policy) = reply.get(1) else { return };
    let evicting = policy.starts_with("allkeys-");
    if let Ok(mut seen) = EVICTION_SEEN.lock()
        && let Some((_, last)) = seen.get_mut(server)
    {
        *last = evicting;
    }
    if evicting && !was_evicting {
        log::warn!(
            "Redis at {server}: maxmemory-policy is {policy}: under memory pressure Redis may evict delayq's \
             keys, and an evicted message is lost; use noeviction (or a volatile-* policy) for queues"
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
    /// A read without the reconnect loop (one more try on a new connection after a
    /// dropped one, none after a timeout): for a caller with other duties that must
    /// not wait out a Redis that is down or hangs (a supervisor's look at the backlog).
    Once,
}

/// A lazily opened, fork-aware connection that reconnects with backoff.
pub(crate) struct ConnSlot {
    conn: Option<Conn>,
    forks: u64,
    /// The endpoint's master epoch when `conn` was made.
    epoch: u64,
    /// Under Sentinel: the master `conn` goes to, and when a sentinel last said so.
    master: Option<(String, Instant)>,
    /// Under Sentinel: a connection to the sentinel asked last, and its index.
    sentinel: Option<(usize, redis::Connection)>,
}

/// How often a connection under Sentinel asks whether its master still is one. A pool
/// also hears of a failover at once (it watches the sentinels); this bounds how long a
/// producer writes to a master that Sentinel replaced but has not demoted yet.
const SENTINEL_RECHECK: Duration = Duration::from_secs(1);

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

impl Drop for ConnSlot {
    /// A child process that drops a queue or a pool it inherited leaves the parent's
    /// connection alone, as a call would.
    fn drop(&mut self) {
        self.take_over_after_fork();
    }
}

impl ConnSlot {
    pub(crate) fn new() -> Self {
        Self {
            conn: None,
            forks: crate::fork::generation(),
            epoch: 0,
            master: None,
            sentinel: None,
        }
    }

    /// Drop a connection made before the endpoint's master changed, or, under Sentinel,
    /// one to a master that a sentinel no longer names.
    fn forget_old_master(&mut self, ep: &Endpoint) {
        let epoch = ep.master_epoch();
        if epoch != self.epoch {
            self.conn = None;
            self.epoch = epoch;
            return;
        }
        if let (Some(_), Some((master, confirmed))) = (&self.conn, &mut self.master)
            && confirmed.elapsed() >= SENTINEL_RECHECK
        {
            *confirmed = Instant::now();
            if let Some(named) = ep.named_master(&mut self.sentinel)
                && named != *master
            {
                log::warn!(
                    "{}: a sentinel names {named} as the master now, not {master}",
                    ep.display
                );
                // The other connections of this process follow at their next use.
                ep.master_switched();
                self.conn = None;
                self.epoch = ep.master_epoch();
            }
        }
    }

    fn connected(&mut self, ep: &Endpoint) -> Result<&mut Conn> {
        let (mut conn, master) = ep.connect()?;
        warn_if_evicting(&mut conn, master.as_deref().unwrap_or(&ep.display), None);
        // Any failure (Redis 6 has no FCALL, the user may not run it, an admin did not
        // load the library) leaves the calls to EVALSHA.
        let library = &*crate::scripts::LIBRARY_NAME;
        let probe = redis::cmd("FCALL").arg(library).arg(0).query::<String>(conn.as_dyn());
        ep.functions
            .store(probe.is_ok_and(|name| name == *library), Ordering::Relaxed);
        self.master = master.map(|m| (m, Instant::now()));
        Ok(self.conn.insert(conn))
    }

    fn take_over_after_fork(&mut self) {
        let forks = crate::fork::generation();
        if forks != self.forks {
            // The socket (and any TLS session) belongs to the parent: closing it, or a
            // TLS close_notify, would disturb the parent's connection. Leak it instead.
            if let Some(conn) = self.conn.take() {
                std::mem::forget(conn);
            }
            if let Some(sentinel) = self.sentinel.take() {
                std::mem::forget(sentinel);
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
        let mut reconnected_once = false;
        let mut pause = Duration::from_millis(20);
        loop {
            self.forget_old_master(ep);
            let attempt = match self.conn.as_mut() {
                Some(conn) => Ok(conn),
                None => self.connected(ep),
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
            if replay == Replay::Once {
                // One more try on a new connection, at once: the socket may be left
                // from before a restart. A timeout (a Redis that hangs) is final.
                if reconnected_once || err.is_timeout() {
                    return Err(err);
                }
                reconnected_once = true;
                continue;
            }
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
        self.forget_old_master(ep);
        if self.conn.is_none() {
            self.connected(ep)?;
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

    /// At a pool's heartbeat: look at the eviction policy again when the last look is
    /// older than `eviction_recheck` (over the connection this slot holds, if any).
    pub(crate) fn recheck_eviction(&mut self, ep: &Endpoint) {
        let every = Duration::from_millis(EVICTION_RECHECK_MS.load(Ordering::Relaxed));
        let server = self
            .master
            .as_ref()
            .map_or_else(|| ep.display.clone(), |(m, _)| m.clone());
        if let Some(conn) = self.conn.as_mut() {
            warn_if_evicting(conn, &server, Some(every));
        }
    }
}

impl Endpoint {
    /// Under Sentinel: listens for `+switch-master` and moves the whole process to the new
    /// master at once. Until Sentinel demotes it (seconds later, or never while it is cut
    /// off), the old master still takes writes, which it then throws away: claims there
    /// would run messages twice and acks there would be lost. Runs until `stopped`;
    /// logs as the pool it serves (`delayq.worker`), as it did before it moved here;
    /// `pause_for` waits between tries, `on_switch` follows each switch.
    pub(crate) fn watch_sentinels(
        &self,
        label: &str,
        stopped: &dyn Fn() -> bool,
        pause_for: &dyn Fn(Duration),
        on_switch: &dyn Fn(),
    ) {
        let endpoint = self;
        let Some(service) = endpoint.sentinel_service() else {
            return;
        };
        let mut pause = Duration::from_millis(50);
        let mut attempt = 0;
        while !stopped() {
            let (host, mut conn) = match endpoint.sentinel_connection(attempt) {
                Some(Ok(c)) => c,
                Some(Err(e)) => {
                    log::debug!(
                        target: "delayq::worker",
                        "delayq[{}]: sentinel watch: {e}", label
                    );
                    attempt += 1;
                    pause_for(pause);
                    pause = (pause * 2).min(Duration::from_secs(2));
                    continue;
                }
                None => return,
            };
            let mut pubsub = conn.as_pubsub();
            if pubsub.subscribe("+switch-master").is_err()
                || pubsub.set_read_timeout(Some(Duration::from_millis(250))).is_err()
            {
                attempt += 1;
                pause_for(pause);
                continue;
            }
            pause = Duration::from_millis(50);
            while !stopped() {
                match pubsub.get_message() {
                    Ok(msg) => {
                        // "<name> <old ip> <old port> <new ip> <new port>"
                        let text = msg.get_payload::<String>().unwrap_or_default();
                        if text.split(' ').next() == Some(service) {
                            log::warn!(
                                target: "delayq::worker",
                                "delayq[{}]: sentinel {host} announced a new master: {text}", label
                            );
                            endpoint.master_switched();
                            on_switch();
                        }
                    }
                    Err(e) if e.is_timeout() => {}
                    Err(e) => {
                        log::debug!(
                            target: "delayq::worker",
                            "delayq[{}]: sentinel watch on {host} lost: {e}", label
                        );
                        attempt += 1;
                        break;
                    }
                }
            }
        }
    }
}
/// `pipe`'s commands in one round trip, their replies in order, where every command
/// names a key of one hash slot: a cluster connection refuses a pipeline, but takes
/// the same packed commands, routed by the first one's key.
pub(crate) fn query_one_slot<T: redis::FromRedisValue>(
    con: &mut dyn ConnectionLike,
    pipe: &redis::Pipeline,
) -> RedisResult<T> {
    let n = pipe.cmd_iter().count();
    let replies = if n == 0 {
        Vec::new()
    } else {
        con.req_packed_commands(&pipe.get_packed_pipeline(), 0, n)?
    };
    Ok(T::from_redis_value(redis::Value::Array(replies))?)
}
