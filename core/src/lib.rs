//! delayq: a reliable delay queue on Redis.
//!
//! Messages are scheduled in a sorted set by due time and handed to consumers under a
//! lease: a consumer that dies or hangs loses its lease and the message is delivered
//! again; a consumer that fails it retries with backoff until a dead-letter set takes
//! it. Every operation is one Lua script on keys that share one hash tag.
//!
//! ```no_run
//! use std::time::Duration;
//! use delayq::{Queue, QueueOptions, Worker, WorkerOptions};
//!
//! let queue = Queue::new("redis://127.0.0.1:6379", "orders", QueueOptions::default())?;
//! queue.push(&serde_json::json!({"order_id": 10086, "action": "close"}), Duration::from_secs(1800))?;
//!
//! let worker = Worker::new(queue, WorkerOptions::default())?;
//! let summary = worker.run(4, |delivery| {
//!     let order: serde_json::Value = delivery.payload().map_err(|e| e.to_string())?;
//!     println!("closing {order}");
//!     Ok(())
//! })?;
//! # Ok::<(), delayq::Error>(())
//! ```

// A library users read on docs.rs: every public item says what it is.
#![warn(missing_docs)]

mod acl;
mod backoff;
mod conn;
mod envelope;
mod error;
mod fork;
pub mod host;
mod keys;
mod lines;
mod logs;
pub mod metrics;
pub mod options;
pub mod payload;
mod queue;
pub mod records;
pub mod registry;
pub mod repeat;
pub mod scale;
pub mod scripts;
pub mod threads;
mod time;
mod worker;

pub use acl::ScriptRights;
pub use conn::ConnectOptions;
#[doc(hidden)]
pub use conn::set_eviction_recheck;
pub use envelope::{MAX_DEPTH, decode_payload, decode_payload_with, parse_payload, path_for_error};
pub use error::{Category, Error, Result};
pub use keys::{Layout, MAX_PARTITIONS};
pub use logs::{LogRecord, capture_logs, logger_name, set_log_level, take_logs};
pub use payload::{PayloadFault, PayloadJson, PayloadWriter};
pub use queue::{
    COUNTERS, CancelOptions, DEFAULT_MAX_PAYLOAD_BYTES, DeadLetter, GroupLimit, Listing, MAX_ERROR_TEXT_BYTES,
    MAX_ID_BYTES, MAX_KEEP_COMPLETED, MAX_PAGE_START, MAX_PAYLOAD_BYTES, MAX_RATE_LIMIT_PERIOD, MAX_SHARED_QUEUES,
    MessageInfo, NewMessage, PushOptions, QUEUE_OPTIONS, Queue, QueueOptions, RateLimit, State, Stats, WorkerInfo,
    queue_option,
};
pub use registry::{MAX_REGISTRY_PAGE, RegisteredQueue, RegistryPage};
pub use repeat::{RepeatInfo, RepeatOptions, Schedule};
pub use scripts::MAX_BATCH;
pub use time::{Due, MAX_DELAY, delay_from_secs};
pub use worker::{
    CancelFlag, Consumer, Delivery, Fate, MAX_TRACE_BYTES, MAX_WORKER_QUEUES, Receipt, Received, Releaser, Retry,
    Stopper, Summary, Worker, WorkerOptions,
};
