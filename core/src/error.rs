//! One error type for the whole crate. The bindings map its variants onto their own
//! exception classes in one place each, so every message here is written for users.

use std::fmt;

/// Everything that can go wrong in delayq.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The Redis URL could not be parsed or uses an unsupported scheme.
    #[error("invalid Redis URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL as given, its credentials masked.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// An option or argument was out of range; nothing was written.
    #[error("invalid {name}: {reason}")]
    InvalidArgument {
        /// The option or argument, as the caller's language names it.
        name: String,
        /// What is wrong with its value.
        reason: String,
    },

    /// Redis could not be reached (refused, unresolvable, dropped while connecting).
    #[error("cannot connect to Redis at {addr}: {reason}")]
    Connection {
        /// The host and port (or socket) tried.
        addr: String,
        /// Why the connection failed.
        reason: String,
    },

    /// An established connection broke before the reply arrived; the command may or
    /// may not have run.
    #[error("connection to Redis lost: {0}")]
    ConnectionLost(String),

    /// Redis did not answer within the configured timeout.
    #[error("Redis did not answer within {timeout_ms} ms ({operation})")]
    Timeout {
        /// What delayq was doing (`push`, `claim`, ...).
        operation: String,
        /// The timeout that passed, in milliseconds.
        timeout_ms: u64,
    },

    /// The push is on the master, but fewer replicas than `wait_replicas` confirmed it
    /// within `wait_timeout`: a failover now could lose it.
    #[error(
        "pushed, but only {confirmed} of {wanted} replicas confirmed it within {timeout_ms} ms (wait_replicas): \
         a failover now could lose it; pushing again with the same id is safe"
    )]
    NotReplicated {
        /// `wait_replicas`.
        wanted: u32,
        /// Replicas that confirmed the write in time.
        confirmed: u32,
        /// `wait_timeout`, in milliseconds.
        timeout_ms: u64,
    },

    /// Wrong password or user, or the ACL user lacks a needed command or key.
    #[error("Redis refused access: {0}")]
    AuthFailed(String),

    /// The payload cannot be represented as JSON (or is not valid JSON text).
    #[error("payload is not serialisable as JSON: {0}")]
    PayloadNotSerializable(String),

    /// The payload's JSON is larger than `max_payload_bytes`.
    #[error("payload is {size} bytes of JSON, over the limit of {max} bytes (max_payload_bytes)")]
    PayloadTooLarge {
        /// The payload's JSON, in bytes.
        size: usize,
        /// `max_payload_bytes`.
        max: usize,
    },

    /// No message with this id exists in the queue.
    #[error("no message with id {0:?} in this queue")]
    UnknownId(String),

    /// This delivery no longer holds the lease: it expired and the message was handed
    /// to another consumer, or it was completed already.
    #[error("lease lost for message {id:?}: {reason}")]
    LeaseLost {
        /// The message id.
        id: String,
        /// Why this delivery no longer holds it.
        reason: String,
    },

    /// Redis is at its `maxmemory` and refused a write that could take memory; nothing
    /// was written. Consumers keep draining the queue meanwhile, which frees memory.
    #[error(
        "Redis is out of memory (used memory is over its maxmemory) and refused the write; nothing was written \
         (consumers still drain the queue, which frees memory; or raise maxmemory): {0}"
    )]
    OutOfMemory(String),

    /// A delayq Lua script or Redis returned an error that is not one of the above.
    #[error("Redis error: {0}")]
    Redis(String),

    /// The worker was asked to do something its state forbids (e.g. run twice).
    #[error("{0}")]
    State(String),
}

/// What kind of fault an error is: the bindings pick their exception class from this,
/// so the mapping from the many variants lives here once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Category {
    /// Bad URL, option or argument.
    InvalidArgument,
    /// The payload cannot be stored.
    Payload,
    /// Redis unreachable or the connection broke.
    Connection,
    /// Redis did not answer in time.
    Timeout,
    /// Authentication or ACL permissions.
    Auth,
    /// A delivery that no longer holds its lease.
    LeaseLost,
    /// Redis is at its maxmemory.
    OutOfMemory,
    /// Anything else.
    Other,
}

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The kind of fault, for choosing an exception class.
    pub fn category(&self) -> Category {
        match self {
            Self::InvalidUrl { .. } | Self::InvalidArgument { .. } => Category::InvalidArgument,
            Self::PayloadNotSerializable(_) | Self::PayloadTooLarge { .. } => Category::Payload,
            Self::Connection { .. } | Self::ConnectionLost(_) => Category::Connection,
            Self::Timeout { .. } | Self::NotReplicated { .. } => Category::Timeout,
            Self::AuthFailed(_) => Category::Auth,
            Self::LeaseLost { .. } => Category::LeaseLost,
            Self::OutOfMemory(_) => Category::OutOfMemory,
            Self::UnknownId(_) | Self::Redis(_) | Self::State(_) => Category::Other,
        }
    }

    /// The operation ran out of time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::NotReplicated { .. })
    }

    /// Redis could not be reached or the connection broke.
    pub fn is_connection(&self) -> bool {
        matches!(self, Self::Connection { .. } | Self::ConnectionLost(_))
    }

    /// Trying again later may succeed (the fault is in the network or server, not in
    /// the request).
    pub fn is_retryable(&self) -> bool {
        self.is_connection() || self.is_timeout()
    }

    /// Redis is at its maxmemory: a push may succeed once consumers freed memory.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Self::OutOfMemory(_))
    }

    /// The caller passed something wrong; retrying the same call cannot succeed.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Self::InvalidUrl { .. }
                | Self::InvalidArgument { .. }
                | Self::PayloadNotSerializable(_)
                | Self::PayloadTooLarge { .. }
        )
    }

    pub(crate) fn invalid(name: impl Into<String>, reason: impl fmt::Display) -> Self {
        Self::InvalidArgument {
            name: name.into(),
            reason: reason.to_string(),
        }
    }

    /// Classify a redis-rs error raised while talking to `addr` during `operation`.
    pub(crate) fn from_redis(err: &redis::RedisError, addr: &str, operation: &str, timeout_ms: u64) -> Self {
        use redis::{ErrorKind, ServerErrorKind};
        if err.is_timeout() {
            return Self::Timeout {
                operation: operation.to_owned(),
                timeout_ms,
            };
        }
        if err.is_connection_refusal() {
            return Self::Connection {
                addr: addr.to_owned(),
                reason: err.to_string(),
            };
        }
        if err.is_connection_dropped() || err.is_io_error() {
            return Self::ConnectionLost(err.to_string());
        }
        match err.kind() {
            // Transient server states (loading its data after a restart, a failover or
            // resharding in progress): retried like a dropped connection.
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly,
            ) => Self::ConnectionLost(format!("Redis is not ready: {err}")),
            ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
                Self::AuthFailed(err.to_string())
            }
            ErrorKind::InvalidClientConfig => Self::InvalidUrl {
                url: addr.to_owned(),
                reason: err.to_string(),
            },
            _ if err.code() == Some("OOM") => Self::OutOfMemory(err.to_string()),
            _ => {
                let text = err.to_string();
                // Redis answers NOAUTH/WRONGPASS/NOPERM as plain error codes on some paths.
                if ["NOAUTH", "WRONGPASS", "NOPERM"].iter().any(|c| text.contains(c)) {
                    Self::AuthFailed(text)
                } else if text.contains("-OOM command not allowed") {
                    // Before 7.0 a script's refused write comes back wrapped in the script's
                    // error ("Error running script …: -OOM command not allowed …").
                    Self::OutOfMemory(text)
                } else {
                    Self::Redis(text)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{ErrorKind, ServerErrorKind};

    fn server_error(kind: ServerErrorKind, text: &'static str) -> Error {
        let err = redis::RedisError::from((ErrorKind::Server(kind), text));
        Error::from_redis(&err, "redis://127.0.0.1:6379", "push", 5000)
    }

    #[test]
    fn transient_server_states_are_retried() {
        for kind in [
            ServerErrorKind::BusyLoading,
            ServerErrorKind::TryAgain,
            ServerErrorKind::ClusterDown,
            ServerErrorKind::MasterDown,
            ServerErrorKind::ReadOnly,
        ] {
            let err = server_error(kind, "not ready");
            assert!(err.is_retryable(), "{kind:?}: {err:?}");
        }
    }

    #[test]
    fn permission_errors_are_auth_errors_and_final() {
        let err = server_error(ServerErrorKind::NoPerm, "NOPERM this user has no permissions");
        assert_eq!(err.category(), Category::Auth);
        assert!(!err.is_retryable());
    }

    #[test]
    fn a_write_refused_inside_a_script_by_a_full_redis_6_is_out_of_memory() {
        // What Redis 6.0 (Ubuntu 22.04's) answers when a script's first write meets maxmemory.
        let err = server_error(
            ServerErrorKind::ResponseError,
            "Error running script (call to f_a5e8): @user_script:84: @user_script: 84: -OOM command not allowed when used memory > 'maxmemory'.",
        );
        assert!(err.is_out_of_memory(), "{err:?}");
        assert!(!err.is_retryable());
    }
}
