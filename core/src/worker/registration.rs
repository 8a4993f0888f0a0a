//! The pool's entry in the queue's list of live pools (`Queue::workers`), as data:
//! its id and lifetime, the renewal waiting for a claim to carry it, and the
//! lateness of handler starts it reports. The heartbeat builds and sends renewals
//! (see heartbeat.rs); this file only holds what they are made of.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::options::WorkerOptions;

/// This pool's entry in the queue's list of live pools (`Queue::workers`). The
/// heartbeat prepares each renewal and the next claim carries it (a claim runs at
/// least every `idle_check`, so an idle pool sends Redis nothing more); one that no
/// claim took within a heartbeat is sent on its own.
pub(super) struct Registration {
    pub(super) id: String,
    pub(super) host: String,
    pub(super) started_at_ms: i64,
    pub(super) ttl: Duration,
    /// The renewal waiting for a claim to carry it: its info JSON.
    pub(super) pending: Mutex<Option<String>>,
}

/// Handler starts and their lateness (ms).
#[derive(Clone, Copy, Default)]
pub(super) struct Lateness {
    pub(super) started: u64,
    pub(super) sum_ms: i64,
    pub(super) max_ms: i64,
}

impl Lateness {
    pub(super) fn add(&mut self, ms: i64) {
        self.started += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
        self.max_ms = self.max_ms.max(ms);
    }

    pub(super) fn merge(&mut self, other: Self) {
        self.started += other.started;
        self.sum_ms = self.sum_ms.saturating_add(other.sum_ms);
        self.max_ms = self.max_ms.max(other.max_ms);
    }
}

pub(super) static POOLS_STARTED: AtomicU64 = AtomicU64::new(0);

pub(super) fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl Registration {
    pub(super) fn new(opts: &WorkerOptions) -> Self {
        let host = host_name();
        let n = POOLS_STARTED.fetch_add(1, Ordering::Relaxed) + 1;
        Self {
            id: format!("{host}:{}:{n}", std::process::id()),
            host,
            started_at_ms: crate::time::now_unix_ms(),
            // A renewal can wait up to two heartbeats (one for a claim to carry it);
            // one more, and a margin for a slow Redis.
            ttl: opts.heartbeat() * 3 + Duration::from_secs(1),
            pending: Mutex::new(None),
        }
    }

    pub(super) fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// A claim that was to carry `info` failed: the next one carries it.
    pub(super) fn put_back(&self, info: String) {
        self.pending.lock().get_or_insert(info);
    }
}
