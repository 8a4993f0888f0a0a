//! rediss:// with a private CA, a wrong CA refused, and the warning about an evicting
//! maxmemory-policy. Certificates are made here with openssl.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use common::RedisServer;
use delayq::{ConnectOptions, Error, Queue, QueueOptions};

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be installed");
    assert!(
        status.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 signed by it, and an unrelated CA.
fn make_certs(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=delayq test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "other.pem",
            "-days",
            "2",
            "-subj",
            "/CN=some other CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .expect("ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

/// A redis-server that also listens with TLS on `tls_port`, with `make_certs`'s
/// certificates in `dir`, and `extra` arguments.
fn tls_server(dir: &Path, tls_port: u16, extra: &[&str]) -> RedisServer {
    let path = |name: &str| dir.join(name).to_str().expect("path").to_owned();
    let (port, cert, key, ca) = (
        tls_port.to_string(),
        path("server.pem"),
        path("server.key"),
        path("ca.pem"),
    );
    let mut args = extra.to_vec();
    args.extend([
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
    RedisServer::start_with(&args)
}

fn tls_queue(url: &str, ca: &Path) -> Queue {
    Queue::new(
        url,
        "secure",
        QueueOptions {
            connect: ConnectOptions {
                tls_ca_file: Some(ca.to_path_buf()),
                retry_timeout: Duration::from_millis(300),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .expect("valid")
}

#[test]
fn rediss_with_a_private_ca_works_and_a_wrong_ca_is_refused() {
    let dir = std::env::temp_dir().join(format!("delayq-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    make_certs(&dir);
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let ca = dir.join("ca.pem");
    let server = tls_server(&dir, tls_port, &[]);
    let q = tls_queue(&format!("rediss://127.0.0.1:{tls_port}"), &ca);
    let id = q
        .push(&serde_json::json!({"secret": "over TLS"}), Duration::ZERO)
        .expect("push over TLS");
    assert_eq!(
        q.get(&id).expect("get").expect("exists").payload_json,
        r#"{"secret":"over TLS"}"#
    );
    // The plain port of the same server sees the message: it really went through TLS.
    assert_eq!(server.queue("secure").stats().expect("stats").ready, 1);

    let wrong = tls_queue(&format!("rediss://127.0.0.1:{tls_port}"), &dir.join("other.pem"));
    let err = wrong.stats().expect_err("an unknown CA must be refused");
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `rediss+cluster://` takes `tls_ca_file` too: the seed nodes and every node the
/// cluster names are verified against the private CA.
#[test]
fn rediss_cluster_with_a_private_ca_works_and_a_wrong_ca_is_refused() {
    let dir = std::env::temp_dir().join(format!("delayq-tls-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    make_certs(&dir);
    let tls_port = common::free_port_with_bus();
    let ca = dir.join("ca.pem");
    // One master holding every slot, its bus over TLS too, so that the cluster names
    // its TLS port.
    let server = tls_server(&dir, tls_port, &["--cluster-enabled", "yes", "--tls-cluster", "yes"]);
    let mut admin = server.con();
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query(&mut admin)
        .expect("slots");
    common::wait_for(Duration::from_secs(30), "cluster_state:ok", || {
        redis::cmd("CLUSTER")
            .arg("INFO")
            .query::<String>(&mut admin)
            .is_ok_and(|i| i.contains("cluster_state:ok"))
    });
    let url = format!("rediss+cluster://127.0.0.1:{tls_port}");
    let q = tls_queue(&url, &ca);
    let id = q
        .push(&serde_json::json!({"secret": "over TLS"}), Duration::ZERO)
        .expect("push over TLS to the cluster");
    assert!(q.get(&id).expect("get").is_some());
    let err = tls_queue(&url, &dir.join("other.pem"))
        .stats()
        .expect_err("an unknown CA must be refused");
    assert_eq!(err.category(), delayq::Category::Connection, "{err:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

struct Captured(Mutex<Vec<String>>);

impl log::Log for Captured {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            self.0.lock().expect("lock").push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

static LOGGED: Captured = Captured(Mutex::new(Vec::new()));

#[test]
fn an_evicting_maxmemory_policy_is_warned_about_once() {
    log::set_logger(&LOGGED).expect("logger");
    log::set_max_level(log::LevelFilter::Warn);
    let server = RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]);
    let q = server.queue("evict");
    q.push(&1, Duration::ZERO).expect("push");
    server.queue("evict2").push(&2, Duration::ZERO).expect("push");
    let warnings: Vec<String> = LOGGED
        .0
        .lock()
        .expect("lock")
        .iter()
        .filter(|m| m.contains("maxmemory-policy"))
        .cloned()
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("allkeys-lru") && warnings[0].contains("noeviction"),
        "{warnings:?}"
    );
}

#[test]
fn rediss_sentinel_reaches_sentinels_and_master_over_tls() {
    let dir = std::env::temp_dir().join(format!("delayq-tls-sentinel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    make_certs(&dir);
    let (cert, key, ca) = (dir.join("server.pem"), dir.join("server.key"), dir.join("ca.pem"));
    let path = |p: &Path| p.to_str().expect("path").to_owned();
    let master_tls = common::free_port();
    let master = RedisServer::start_with(&[
        "--tls-port",
        &master_tls.to_string(),
        "--tls-cert-file",
        &path(&cert),
        "--tls-key-file",
        &path(&key),
        "--tls-ca-cert-file",
        &path(&ca),
        "--tls-auth-clients",
        "no",
    ]);
    // Only a TLS port: the sentinel is reachable over TLS alone, and reaches the master
    // over TLS too (tls-replication).
    let sentinel_port = common::free_port();
    let conf = dir.join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port 0\nbind 127.0.0.1\ndir {}\ntls-port {sentinel_port}\ntls-cert-file {}\ntls-key-file {}\n\
             tls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n\
             sentinel monitor mymaster 127.0.0.1 {master_tls} 1\n",
            path(&dir),
            path(&cert),
            path(&key),
            path(&ca)
        ),
    )
    .expect("sentinel.conf");
    let mut sentinel = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server --sentinel");
    let url = format!("rediss+sentinel://127.0.0.1:{sentinel_port}/mymaster");
    let queue = |ca: &Path| {
        Queue::new(
            &url,
            "secure",
            QueueOptions {
                connect: ConnectOptions {
                    tls_ca_file: Some(ca.to_path_buf()),
                    retry_timeout: Duration::from_secs(5),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .expect("valid")
    };
    let pushed = queue(&ca).push(&serde_json::json!({"secret": "via sentinel"}), Duration::ZERO);
    let wrong = queue(&dir.join("other.pem")).stats();
    let _ = sentinel.kill();
    let _ = sentinel.wait();
    let _ = std::fs::remove_dir_all(&dir);
    pushed.expect("push through a TLS sentinel to a TLS master");
    // The master's plain port sees the message: it went to the master the sentinel named.
    assert_eq!(master.queue("secure").stats().expect("stats").ready, 1);
    let err = wrong.expect_err("an unknown CA must be refused");
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!("sentinel 127.0.0.1:{sentinel_port}")),
        "{err}"
    );
}
