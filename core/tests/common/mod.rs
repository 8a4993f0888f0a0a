//! A real redis-server per test, on a free loopback port, that a test may kill and
//! restart. Never a mock.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use delayq::{Queue, QueueOptions};

pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A free port whose cluster bus port (port + 10000, Redis's fixed offset before 7.0
/// added `cluster-port`) is free too. Both lie below Linux's ephemeral range (from
/// 32768), where the kernel hands out no port on its own; the counter keeps this
/// process's tests apart.
pub fn free_port_with_bus() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    const FIRST: u16 = 12_000;
    const SPAN: u16 = 10_000;
    let offset = (std::process::id() % u32::from(SPAN)) as u16;
    for _ in 0..SPAN {
        let step = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = FIRST + (offset.wrapping_add(step) % SPAN);
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port pair below the ephemeral range")
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Extra redis-server arguments, e.g. `["--appendonly", "yes"]`.
    pub fn start_with(args: &[&str]) -> Self {
        Self::start_on(free_port(), args, &[])
    }

    /// With extra environment variables, e.g. an `LD_PRELOAD`.
    pub fn start_with_env(env: &[(&str, &str)]) -> Self {
        Self::start_on(free_port(), &[], env)
    }

    fn start_on(port: u16, args: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("delayq-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut server = Self {
            port,
            dir,
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            child: None,
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut con) = self.raw_client().get_connection()
                && redis::cmd("PING").query::<String>(&mut con).is_ok()
            {
                // A replica gets the functions from its master.
                if functions_installed() {
                    let loaded: redis::RedisResult<redis::Value> = redis::cmd("FUNCTION")
                        .arg("LOAD")
                        .arg("REPLACE")
                        .arg(&delayq::scripts::LIBRARY.text)
                        .query(&mut con);
                    if let Err(e) = loaded {
                        assert_eq!(
                            e.kind(),
                            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                            "{e}"
                        );
                    }
                }
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn raw_client(&self) -> redis::Client {
        let password = self
            .args
            .iter()
            .position(|a| a == "--requirepass")
            .map(|i| self.args[i + 1].clone());
        let url = match password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.port),
            None => self.url(),
        };
        redis::Client::open(url).expect("client")
    }

    /// A plain connection for inspecting keys.
    pub fn con(&self) -> redis::Connection {
        self.raw_client().get_connection().expect("connect to test redis")
    }

    /// The server's version as (major, minor), from `INFO server`.
    pub fn version(&self) -> (u32, u32) {
        let info: String = redis::cmd("INFO").arg("server").query(&mut self.con()).expect("INFO");
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .expect("redis_version in INFO");
        let mut parts = version
            .trim()
            .split('.')
            .map(|p| p.parse::<u32>().expect("numeric version"));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    /// kill -9: no shutdown, no save.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn queue(&self, name: &str) -> Queue {
        Queue::new(&self.url(), name, QueueOptions::default()).expect("queue")
    }

    pub fn queue_with(&self, name: &str, opts: QueueOptions) -> Queue {
        Queue::new(&self.url(), name, opts).expect("queue")
    }

    /// The server's clock, Unix ms: the one delayq computes due times with.
    pub fn now_ms(&self) -> i64 {
        let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut self.con()).expect("TIME");
        s * 1000 + us / 1000
    }

    /// Every key and its type: a test's proof that nothing was written.
    pub fn dump_keys(&self) -> Vec<String> {
        let mut con = self.con();
        let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).expect("KEYS");
        keys.sort();
        keys
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Wait until `cond` holds, failing the test after `limit`.
/// Per message id, each handler run's start and end (None while it runs).
pub type Runs = Mutex<HashMap<String, Vec<(Instant, Option<Instant>)>>>;

/// Runs `work` as a handler run of `id`, noting its start and end in `runs`.
pub fn timed_run(runs: &Runs, id: &str, work: impl FnOnce()) {
    let index = {
        let mut r = runs.lock().expect("lock");
        let list = r.entry(id.to_owned()).or_default();
        list.push((Instant::now(), None));
        list.len() - 1
    };
    work();
    runs.lock().expect("lock").get_mut(id).expect("run")[index].1 = Some(Instant::now());
}

pub fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A script of src/lua called directly on queue `tag`'s keys, as the core never would:
/// its words after the layout and the wake-up channel.
pub fn call_script(
    con: &mut redis::Connection,
    name: &str,
    tag: &str,
    words: &[String],
) -> redis::RedisResult<redis::Value> {
    // Composed once: a test that calls a script every few milliseconds (to keep a
    // pool's claims going) must not spend them composing.
    static SCRIPTS: std::sync::OnceLock<Vec<delayq::scripts::ComposedScript>> = std::sync::OnceLock::new();
    let scripts = SCRIPTS.get_or_init(|| {
        delayq::scripts::compose_from_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lua"))
            .expect("scripts")
    });
    let script = scripts.iter().find(|s| s.name == name).expect("a script of that name");
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(&script.text).arg(script.keys.len());
    for role in &script.keys {
        cmd.arg(format!("{{dq:{tag}}}:{role}"));
    }
    cmd.arg("native").arg("wake").arg(words).query(con)
}

/// HLEN of the message hash equals the entries of all states: no envelope leaks. What
/// runs is what has a lease: held by a claim, whose counts add up to the leases (or an
/// older delayq's delivery, in the in-flight set).
pub fn assert_no_leak(server: &RedisServer, tag: &str) {
    let mut con = server.con();
    let k = |s: &str| format!("{tag}:{s}");
    let hlen: u64 = redis::cmd("HLEN").arg(k("messages")).query(&mut con).expect("HLEN");
    let leases: u64 = redis::cmd("HLEN").arg(k("leases")).query(&mut con).expect("HLEN");
    let mut states = leases;
    for z in ["scheduled", "dead"] {
        states += redis::cmd("ZCARD").arg(k(z)).query::<u64>(&mut con).expect("ZCARD");
    }
    assert_eq!(hlen, states, "message hash and states disagree under {tag}");
    for h in ["attempts", "errors", "traces"] {
        let n: u64 = redis::cmd("HLEN").arg(k(h)).query(&mut con).expect("HLEN");
        assert!(n <= hlen, "{h} holds {n} entries for {hlen} messages");
    }
    let older: u64 = redis::cmd("ZCARD").arg(k("inflight")).query(&mut con).expect("ZCARD");
    let held: u64 = redis::cmd("EVAL")
        .arg(
            "local n = 0 for _, t in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do \
             n = n + (tonumber(redis.call('HGET', KEYS[2], t .. '#')) or 0) end return n",
        )
        .arg(2)
        .arg(k("claims"))
        .arg(k("claim_ids"))
        .query(&mut con)
        .expect("EVAL");
    assert_eq!(
        leases,
        held + older,
        "leases and what the claims hold disagree under {tag}"
    );
    let stray: u64 = redis::cmd("EVAL")
        .arg(
            "local n = 0 for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do \
             if not redis.call('ZSCORE', KEYS[2], id) then n = n + 1 end end return n",
        )
        .arg(2)
        .arg(k("quarantine"))
        .arg(k("scheduled"))
        .query(&mut con)
        .expect("EVAL");
    assert_eq!(stray, 0, "quarantined messages that do not wait under {tag}");
}

/// `n` messages `{"n": i}`, the i-th due `step * i` from now, in one `push_many`.
pub fn push_spread(q: &Queue, n: u64, step: Duration) {
    let batch: Vec<delayq::NewMessage> = (0..n)
        .map(|i| {
            let due = step * u32::try_from(i).expect("a small batch");
            delayq::NewMessage::new(&serde_json::json!({ "n": i }), due).expect("msg")
        })
        .collect();
    q.push_many(&batch).expect("push");
}

/// Stops a pool when dropped, also while a failed assertion unwinds: inside
/// `thread::scope`, a pool that keeps running turns a failing test into a hang.
pub struct StopOnDrop(pub delayq::Stopper);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// A TCP proxy in front of a test server that can cut every connection (as a
/// restarted load balancer or a NAT timeout does) or stop forwarding while keeping
/// the sockets open (a partition: the client sees no error, only silence).
pub struct Proxy {
    pub port: u16,
    state: std::sync::Arc<ProxyState>,
}

#[derive(Default)]
struct ProxyState {
    /// Bumped by `cut`: pumps of an older generation close their sockets.
    generation: std::sync::atomic::AtomicU64,
    stalled: std::sync::atomic::AtomicBool,
    /// Replies from the server are read and dropped: the server ran the request, the
    /// client never hears of it.
    swallow_replies: std::sync::atomic::AtomicBool,
    stopped: std::sync::atomic::AtomicBool,
    /// Reads from clients forwarded to the server.
    requests: std::sync::atomic::AtomicU64,
}

impl Proxy {
    pub fn start(upstream_port: u16) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let state = Arc::new(ProxyState::default());
        let st = Arc::clone(&state);
        std::thread::spawn(move || {
            while !st.stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream_port)) else {
                            continue;
                        };
                        let generation = st.generation.load(Ordering::Relaxed);
                        for (from, to, replies) in [
                            (
                                client.try_clone().expect("clone"),
                                server.try_clone().expect("clone"),
                                false,
                            ),
                            (server, client, true),
                        ] {
                            let st = Arc::clone(&st);
                            std::thread::spawn(move || pump(&from, &to, &st, generation, replies));
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { port, state }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Close every open connection, mid-command or not; new ones are accepted.
    pub fn cut(&self) {
        self.state.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Stop (`true`) or resume (`false`) forwarding bytes on every connection.
    pub fn stall(&self, on: bool) {
        self.state.stalled.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many reads from clients were passed on to the server so far.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Drop (`true`) or forward (`false`) what the server sends back.
    pub fn swallow_replies(&self, on: bool) {
        self.state
            .swallow_replies
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, std::sync::atomic::Ordering::Relaxed);
        self.cut();
    }
}

fn pump(from: &std::net::TcpStream, to: &std::net::TcpStream, st: &ProxyState, generation: u64, replies: bool) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let mut buf = [0u8; 16 * 1024];
    let (mut from_r, mut to_w) = (from, to);
    loop {
        if st.generation.load(Ordering::Relaxed) != generation {
            break;
        }
        if st.stalled.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        match from_r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // Bytes read just as the stall began are held back too.
                while st.stalled.load(Ordering::Relaxed) && st.generation.load(Ordering::Relaxed) == generation {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if replies && st.swallow_replies.load(Ordering::Relaxed) {
                    continue;
                }
                if st.generation.load(Ordering::Relaxed) != generation || to_w.write_all(&buf[..n]).is_err() {
                    break;
                }
                if !replies {
                    st.requests.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// A Redis Cluster on loopback ports: `masters` masters, each with `replicas_each`
/// replicas, made by `redis-cli --cluster create` (no Docker).
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    pub fn start(masters: usize, replicas_each: usize) -> Self {
        // RUST_LOG=delayq=debug shows the pool's view of redirects and failovers.
        let _ = env_logger::builder().is_test(true).try_init();
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas_each))
            .map(|_| {
                // The bus listens on port + 10000; `cluster-port` would move it, but
                // Redis 6 does not have it.
                RedisServer::start_on(
                    free_port_with_bus(),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-node-timeout",
                        "2000",
                        // Redis 7.0 judges a fresh replica's data too old to fail over
                        // ("Disconnected from master for longer than allowed"): let any
                        // replica take over, as most deployments do.
                        "--cluster-replica-validity-factor",
                        "0",
                        "--appendonly",
                        "no",
                    ],
                    &[],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas_each.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
        let cluster = Self { nodes };
        cluster.wait_ok();
        if replicas_each > 0 {
            // A replica is only elected once every master knows it as a replica: wait
            // until gossip has told every node about every other.
            let total = cluster.nodes.len();
            wait_for(Duration::from_secs(30), "every node knows every other", || {
                cluster.nodes.iter().all(|n| {
                    redis::cmd("CLUSTER")
                        .arg("NODES")
                        .query::<String>(&mut n.con())
                        .is_ok_and(|view| {
                            let lines: Vec<&str> = view.lines().collect();
                            lines.len() == total
                                && lines
                                    .iter()
                                    .all(|l| l.contains(" connected") && !l.contains("handshake"))
                                && lines.iter().filter(|l| l.contains("slave")).count() == masters * replicas_each
                        })
                })
            });
            wait_for(Duration::from_secs(30), "replicas in sync", || {
                cluster.masters().iter().all(|&m| {
                    redis::cmd("INFO")
                        .arg("replication")
                        .query::<String>(&mut cluster.nodes[m].con())
                        .is_ok_and(|i| i.contains(&format!("connected_slaves:{replicas_each}")))
                })
            });
        }
        cluster
    }

    /// Wait until every live node says the cluster is up and agrees on the masters.
    pub fn wait_ok(&self) {
        wait_for(Duration::from_secs(30), "cluster_state:ok", || {
            self.nodes.iter().filter(|n| n.is_running()).all(|n| {
                redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query::<String>(&mut n.con())
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            })
        });
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Indexes of the live nodes that are masters now.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.nodes[i].is_running()
                    && redis::cmd("ROLE")
                        .query::<Vec<redis::Value>>(&mut self.nodes[i].con())
                        .ok()
                        .and_then(|r| r.first().cloned())
                        .is_some_and(|v| matches!(v, redis::Value::BulkString(b) if b == b"master"))
            })
            .collect()
    }

    /// The live master that serves `key` now.
    pub fn master_of(&self, key: &str) -> usize {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.nodes[self.masters()[0]].con())
            .expect("KEYSLOT");
        self.masters()
            .into_iter()
            .find(|&m| {
                let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query(&mut self.nodes[m].con())
                    .expect("CLUSTER SLOTS");
                let me = self.nodes[m].port;
                ranges.iter().any(|r| {
                    let int = |v: &redis::Value| match v {
                        redis::Value::Int(n) => *n,
                        _ => -1,
                    };
                    let owner_port = match r.get(2) {
                        Some(redis::Value::Array(node)) => node.get(1).map_or(-1, int),
                        _ => -1,
                    };
                    (int(&r[0])..=int(&r[1])).contains(&i64::from(slot)) && owner_port == i64::from(me)
                })
            })
            .expect("a master serves every slot")
    }

    pub fn node_id(&self, node: usize) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.nodes[node].con())
            .expect("CLUSTER MYID")
    }
}

/// A master, one replica and `count` sentinels watching them as `mymaster` (quorum 1,
/// down after 2 s), all on loopback ports.
pub struct Sentinels {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub ports: Vec<u16>,
    children: Vec<Child>,
    dir: PathBuf,
    sentinel_password: Option<String>,
}

impl Sentinels {
    pub fn start(count: usize) -> Self {
        Self::start_with_passwords(count, None, None)
    }

    /// `password` guards master and replica; `sentinel_password` the sentinels.
    pub fn start_with_passwords(count: usize, password: Option<&str>, sentinel_password: Option<&str>) -> Self {
        let _ = env_logger::builder().is_test(true).try_init();
        let auth: Vec<&str> = password.map_or_else(Vec::new, |p| vec!["--requirepass", p, "--masterauth", p]);
        let master = RedisServer::start_with(&auth);
        let mut replica_args = auth.clone();
        let master_port = master.port.to_string();
        replica_args.extend(["--replicaof", "127.0.0.1", &master_port]);
        let replica = RedisServer::start_with(&replica_args);
        wait_for(Duration::from_secs(20), "the replica in sync", || {
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut replica.con())
                .is_ok_and(|i| i.contains("master_link_status:up"))
        });
        let dir = std::env::temp_dir().join(format!("delayq-sentinels-{}-{}", std::process::id(), master.port));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut set = Self {
            master,
            replica,
            ports: Vec::new(),
            children: Vec::new(),
            dir,
            sentinel_password: None,
        };
        for _ in 0..count {
            let port = free_port();
            let conf = set.dir.join(format!("sentinel-{port}.conf"));
            let mut text = format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds mymaster 2000\nsentinel failover-timeout mymaster 5000\n",
                set.dir.display(),
                set.master.port
            );
            if let Some(p) = password {
                text.push_str(&format!("sentinel auth-pass mymaster {p}\n"));
            }
            if let Some(p) = sentinel_password {
                text.push_str(&format!("requirepass {p}\n"));
            }
            std::fs::write(&conf, text).expect("sentinel.conf");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel");
            set.children.push(child);
            set.ports.push(port);
        }
        set.sentinel_password = sentinel_password.map(str::to_owned);
        let replica_port = set.replica.port;
        wait_for(Duration::from_secs(30), "every sentinel knows the replica", || {
            (0..count).all(|i| {
                set.sentinel_con(i).is_some_and(|mut con| {
                    redis::cmd("SENTINEL")
                        .arg("replicas")
                        .arg("mymaster")
                        .query::<Vec<HashMap<String, String>>>(&mut con)
                        .is_ok_and(|r| {
                            r.iter().any(|r| {
                                r.get("port") == Some(&replica_port.to_string())
                                    && r.get("flags").is_some_and(|f| f == "slave")
                            })
                        })
                })
            })
        });
        set
    }

    fn sentinel_con(&self, i: usize) -> Option<redis::Connection> {
        let url = match &self.sentinel_password {
            Some(p) => format!("redis://:{p}@127.0.0.1:{}", self.ports[i]),
            None => format!("redis://127.0.0.1:{}", self.ports[i]),
        };
        redis::Client::open(url).ok()?.get_connection().ok()
    }

    /// `redis+sentinel://` naming every sentinel.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+sentinel://{}/mymaster", hosts.join(","))
    }

    /// The port of the master that sentinel 0 names now.
    pub fn named_master(&self) -> Option<u16> {
        let mut con = self.sentinel_con(0)?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("mymaster")
            .query::<Option<(String, u16)>>(&mut con)
            .ok()
            .flatten()
            .map(|(_, port)| port)
    }

    /// Ask sentinel 0 for a failover now (the master stays up, and stays a master until
    /// Sentinel demotes it, seconds later).
    pub fn failover(&self) {
        let mut con = self.sentinel_con(0).expect("sentinel");
        let _: () = redis::cmd("SENTINEL")
            .arg("failover")
            .arg("mymaster")
            .query(&mut con)
            .expect("SENTINEL FAILOVER");
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the server on `port` says it is a master.
pub fn is_master(server: &RedisServer) -> bool {
    redis::cmd("ROLE")
        .query::<Vec<redis::Value>>(&mut server.con())
        .ok()
        .and_then(|r| r.first().cloned())
        .is_some_and(|v| matches!(v, redis::Value::BulkString(b) if b == b"master"))
}

/// Run `worker` with `threads` handler threads, each delivery going to `handle` with
/// the record it keeps, until `done` holds for that record (`limit` at most); returns
/// the record.
pub fn run_until<R: Default + Send>(
    worker: &delayq::Worker,
    threads: usize,
    limit: Duration,
    handle: impl Fn(&delayq::Delivery, &parking_lot::Mutex<R>) -> Result<(), String> + Sync,
    done: impl Fn(&R) -> bool + Sync,
) -> R {
    let record = parking_lot::Mutex::new(R::default());
    let stopper = worker.stopper();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(stopper.clone());
            wait_for(limit, "the deliveries awaited", || done(&record.lock()));
            stopper.stop();
        });
        worker.run(threads, |d| handle(d, &record)).expect("run");
    });
    record.into_inner()
}

/// Run `worker` with 2 handler threads on messages whose payload is a number, until
/// `done` says so (90 s at most); returns how often each number ran.
pub fn consume_until(worker: &delayq::Worker, done: impl Fn(&HashMap<u64, u32>) -> bool + Sync) -> HashMap<u64, u32> {
    run_until(
        worker,
        2,
        Duration::from_secs(90),
        |d, seen| {
            let n: u64 = d.payload().map_err(|e| e.to_string())?;
            *seen.lock().entry(n).or_default() += 1;
            Ok(())
        },
        done,
    )
}

/// Push number `i` under id `m<i>`, due within 20 ms, retrying a retryable failure
/// (a failover under way) with the same id for up to 60 s: a retry never doubles it.
pub fn push_numbered_retrying(q: &Queue, i: u64) {
    let opts = delayq::PushOptions {
        id: Some(format!("m{i}")),
        ..Default::default()
    };
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        match q.push_json(i.to_string(), delayq::Due::In(Duration::from_millis(i % 20)), &opts) {
            Ok(_) => return,
            Err(e) if e.is_retryable() && Instant::now() < give_up => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("push {i}: {e}"),
        }
    }
}

/// On `q`, with two messages due, `doomed` among them pushed with `max_attempts` 1:
/// a consumer with two handler slots fails `doomed` into the dead-letter set and holds
/// the other one, running. Returns the consumer and that running delivery.
pub fn one_dead_one_running(q: &Queue, doomed: &str) -> (delayq::Consumer, delayq::Delivery) {
    // Two slots: the held delivery must not keep the doomed one back.
    let consumer = delayq::Worker::new(q.clone(), delayq::WorkerOptions::default())
        .expect("worker")
        .start_with(2)
        .expect("start");
    let mut held = None;
    for _ in 0..2 {
        match consumer.recv_timeout(Duration::from_secs(10)) {
            delayq::Received::Message(d) if d.id == doomed => {
                consumer.fail(d, "gave up");
            }
            delayq::Received::Message(d) => held = Some(d),
            other => panic!("expected a delivery, got {other:?}"),
        }
    }
    wait_for(Duration::from_secs(10), "the doomed message dead", || {
        q.stats().is_ok_and(|s| s.dead == 1)
    });
    (consumer, held.expect("the other message, running"))
}

/// Run one handler thread over `q` until it is empty (`stop_when_empty`, one fetcher,
/// the rest of `opts` as given) and return the run's counts.
pub fn run_until_empty(
    q: &Queue,
    opts: delayq::WorkerOptions,
    handler: impl Fn(&delayq::Delivery) -> Result<(), String> + Sync,
) -> delayq::Summary {
    let worker = delayq::Worker::new(
        q.clone(),
        delayq::WorkerOptions {
            threads: 1,
            stop_when_empty: true,
            ..opts
        },
    )
    .expect("worker");
    worker.run(1, handler).expect("run")
}

/// DELAYQ_TEST_FUNCTIONS=1 runs a suite with delayq's library of functions installed
/// on every server it starts (Redis 7.0+): the calls go as FCALL.
pub fn functions_installed() -> bool {
    std::env::var_os("DELAYQ_TEST_FUNCTIONS").is_some_and(|v| v == "1")
}

/// The script rights of the rules a suite makes: FCALL when it runs with functions.
pub fn script_rights() -> delayq::ScriptRights {
    if functions_installed() {
        delayq::ScriptRights::Functions
    } else {
        delayq::ScriptRights::Load
    }
}

/// The next delivery of `c`, within 5 s.
pub fn receive(c: &delayq::Consumer) -> delayq::Delivery {
    match c.recv_timeout(Duration::from_secs(5)) {
        delayq::Received::Message(d) => d,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

/// A consumer of one handler that "hangs": its heartbeat leaves a delivery out once
/// past a 50 ms timeout, so the lease of what it holds ends 500 ms after its claim.
pub fn hung_consumer(q: &Queue) -> delayq::Consumer {
    let opts = delayq::WorkerOptions {
        prefetch: 1,
        threads: 1,
        lease: Duration::from_millis(500),
        timeout: Some(Duration::from_millis(50)),
        ..delayq::WorkerOptions::default()
    };
    delayq::Worker::new(q.clone(), opts)
        .and_then(|w| w.start())
        .expect("a hung consumer")
}
