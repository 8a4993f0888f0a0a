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

    /// A key of the queue holds another type than delayq keeps there (another program
    /// wrote it, or two queues share keys); the script stopped before writing.
    #[error("{0}")]
    WrongType(String),

    /// The queue's keys were written in a stored format newer than this build reads (a
    /// newer delayq recorded it): the script stopped before writing anything.
    #[error(
        "this queue's keys are in stored format {stored}, recorded by a newer delayq; this build reads format \
         {known} and stopped before writing anything: run the newer delayq here too (docs/workers.md, \
         \"Upgrading\")"
    )]
    Format {
        /// The format the queue records.
        stored: u64,
        /// The newest format this build reads.
        known: u64,
    },

    /// A script's reply did not have the shape this version of delayq reads: a bug, or
    /// a script of another version answering under the same name.
    #[error(
        "delayq's {script} script gave a reply this version cannot read ({reason}); nothing is lost, \
             the call can be retried once every process runs one delayq version"
    )]
    Protocol {
        /// The script.
        script: String,
        /// What did not fit.
        reason: String,
    },

    /// A batch of several scripts (`push_many` of more than `MAX_BATCH` messages of a
    /// partition, or of several partitions) failed after some of them were written, or
    /// when whether they were is unknown. Each script is written whole or not at all;
    /// the scripts of a batch are not. Its category, and the `is_*` tests, are those of
    /// `cause`. Pushing the whole batch again would push the written messages twice
    /// where delayq made their ids: push again only the messages not written, or the
    /// whole batch with each message given its id from `ids`, since a push under an id
    /// that exists does not push it twice (it leaves it as it is, or, with `replace`,
    /// replaces it).
    #[error("{}", partly_written_text(ids.len(), written.len(), unknown.len(), cause))]
    PartlyWritten {
        /// Every id of the batch, in batch order: the ones the caller gave and the ones
        /// delayq made.
        ids: Vec<String>,
        /// The ids of the messages written, in batch order.
        written: Vec<String>,
        /// The ids of the messages whose script was sent but whose reply never came
        /// (the connection failed): written or not, nobody can tell. Pushing them again
        /// under these ids is safe while they exist.
        unknown: Vec<String>,
        /// Why the others were not written: the first failure.
        cause: Box<Error>,
    },

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
            Self::PartlyWritten { cause, .. } => cause.category(),
            Self::UnknownId(_)
            | Self::Redis(_)
            | Self::WrongType(_)
            | Self::Format { .. }
            | Self::Protocol { .. }
            | Self::State(_) => Category::Other,
        }
    }

    /// The operation ran out of time.
    pub fn is_timeout(&self) -> bool {
        match self {
            Self::PartlyWritten { cause, .. } => cause.is_timeout(),
            other => matches!(other, Self::Timeout { .. } | Self::NotReplicated { .. }),
        }
    }

    /// Redis could not be reached or the connection broke.
    pub fn is_connection(&self) -> bool {
        match self {
            Self::PartlyWritten { cause, .. } => cause.is_connection(),
            other => matches!(other, Self::Connection { .. } | Self::ConnectionLost(_)),
        }
    }

    /// Trying again later may succeed (the fault is in the network or server, not in
    /// the request).
    pub fn is_retryable(&self) -> bool {
        self.is_connection() || self.is_timeout()
    }

    /// Redis is at its maxmemory: a push may succeed once consumers freed memory.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Self::PartlyWritten { cause, .. } => cause.is_out_of_memory(),
            other => matches!(other, Self::OutOfMemory(_)),
        }
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

    /// The ids a batch wrote before it failed (`PartlyWritten`), in batch order; empty
    /// for any other error, which writes nothing.
    pub fn written_ids(&self) -> &[String] {
        match self {
            Self::PartlyWritten { written, .. } => written,
            _ => &[],
        }
    }

    pub(crate) fn invalid(name: impl Into<String>, reason: impl fmt::Display) -> Self {
        Self::InvalidArgument {
            name: name.into(),
            reason: reason.to_string(),
        }
    }

    /// Classify a redis-rs error raised while talking to `addr`, as `user`, during
    /// `operation`.
    pub(crate) fn from_redis(
        err: &redis::RedisError,
        addr: &str,
        user: &str,
        operation: &str,
        timeout_ms: u64,
    ) -> Self {
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
            ErrorKind::Server(ServerErrorKind::NoPerm) => Self::AuthFailed(auth_text(&err.to_string(), user, true)),
            // redis-rs's own kind for a refused AUTH: Redis said WRONGPASS, or (the connection
            // asked again, see `Endpoint::why_auth_failed`) that the user has no password.
            ErrorKind::AuthenticationFailed => Self::AuthFailed(match err.detail() {
                Some(said) if said.contains(NO_PASSWORD) => auth_text(said, user, false),
                _ => auth_text(&format!("WRONGPASS {err}"), user, false),
            }),
            ErrorKind::InvalidClientConfig => Self::InvalidUrl {
                url: addr.to_owned(),
                reason: err.to_string(),
            },
            _ if err.code() == Some("OOM") => Self::OutOfMemory(err.to_string()),
            _ => {
                let text = err.to_string();
                // Redis answers NOAUTH/WRONGPASS/NOPERM as plain error codes on some paths;
                // a connection without a password that sends a long command first is
                // refused as a protocol error ("unauthenticated multibulk length").
                if ["NOAUTH", "WRONGPASS", "NOPERM"]
                    .iter()
                    .any(|c| text.to_ascii_uppercase().contains(c))
                    || ["unauthenticated", "can't run this command"]
                        .iter()
                        .any(|c| text.contains(c))
                {
                    Self::AuthFailed(auth_text(&text, user, false))
                } else if let Some(rest) = text
                    .to_ascii_uppercase()
                    .contains("WRONGTYPE")
                    .then(|| text.split_once("delayq script ").map(|(_, r)| r))
                    .flatten()
                {
                    Self::WrongType(wrong_type_text(rest))
                } else if let Some((stored, known)) = format_of(&text) {
                    Self::Format { stored, known }
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

/// `PartlyWritten`'s text: how many of the batch were written, how many not, how many
/// may have been, then the cause, whose words are said of its own script.
fn partly_written_text(total: usize, written: usize, unknown: usize, cause: &Error) -> String {
    let not = total - written - unknown;
    let what = match (written, unknown) {
        (w, 0) if w == total => format!("all {total} messages of the batch were written, then the push failed"),
        (w, 0) => format!("{w} of the batch's {total} messages were written and the other {not} were not"),
        (0, u) => format!(
            "none of the batch's {total} messages is known to be written: {not} were not, and whether the other {u} \
             were is unknown (their script was sent, its reply lost)"
        ),
        (w, u) => format!(
            "{w} of the batch's {total} messages were written and {not} were not; whether the other {u} were is \
             unknown (their script was sent, its reply lost)"
        ),
    };
    // A script refused before its first write says that nothing was written: true of
    // that script, not of the batch.
    let cause = cause
        .to_string()
        .replace("; nothing was written", "")
        .replace(" stopped before writing anything", " stopped");
    format!(
        "{what} (the error carries the ids written; push again only the rest, or the whole batch under the ids it \
         carries, which does not push those written twice): {cause}"
    )
}

/// The versions in a script's "DQERR format <stored> <known>" (include/clock.lua).
fn format_of(text: &str) -> Option<(u64, u64)> {
    // redis-rs prints an unknown error code quoted: "\"DQERR\": format 2 1 ...".
    let rest = text
        .split_once("DQERR")?
        .1
        .trim_start_matches(['"', ':', ' '])
        .strip_prefix("format ")?;
    let mut words = rest.split_whitespace();
    Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
}

/// What Redis answers to AUTH with a password for a user that has none ("AUTH
/// <password> called without any password configured for the default user...").
const NO_PASSWORD: &str = "without any password configured";

/// How to get the exact ACL rule, for every permission error.
fn acl_hint(user: &str) -> String {
    format!("`delayq acl --user {user}` (Queue::acl_rule) prints the queue's exact ACL rule")
}

/// An auth or permission error in words that say what to do.
fn auth_text(text: &str, user: &str, no_perm: bool) -> String {
    // Redis appends the script's sha and line to errors a script raises.
    let text = text.split(" script: ").next().unwrap_or(text).trim();
    let upper = text.to_ascii_uppercase();
    let no_perm = no_perm || upper.contains("NOPERM") || text.contains("can't run this command");
    if let Some(rest) = text.split_once("delayq script ").map(|(_, r)| r).filter(|_| no_perm) {
        // "<script> runs <COMMAND>[ on <key or channel>][ (undone)]", from the scripts'
        // preflight or include/guard.lua.
        let (script, what) = rest.split_once(" runs ").unwrap_or((rest, ""));
        let (what, written) = match what.find(" (undone)") {
            Some(end) => (&what[..end], "what it had written was taken back"),
            None => (what, "nothing was written"),
        };
        return format!(
            "user {user:?} may not run {what} (delayq's {script} script needs it); {written}. {}",
            acl_hint(user)
        );
    }
    // Redis 7 names the subcommand, Redis 6 only the command (SCRIPT LOAD is the one sent).
    if no_perm && (upper.contains("SCRIPT|LOAD") || upper.contains("'SCRIPT' COMMAND")) {
        return format!(
            "this Redis does not have delayq's scripts (after a restart, a failover or SCRIPT FLUSH), and user \
             {user:?} may not load them ({text}): an admin loads them with `delayq load-scripts` \
             (Queue::load_scripts), as the rule made with preloaded scripts requires"
        );
    }
    // The rule made for functions grants FCALL, not EVALSHA, which a call falls back to
    // when the server lacks this build's library.
    if no_perm && upper.contains("'EVALSHA' COMMAND") {
        return format!(
            "this Redis does not have this build's delayq functions (library {}), and user {user:?} may not run \
             delayq's scripts otherwise ({text}): an admin installs them with `delayq install-functions` \
             (Queue::install_functions), as the rule made for functions requires",
            *crate::scripts::LIBRARY_NAME
        );
    }
    if text.contains("permissions to access one of the keys") {
        return format!(
            "user {user:?} may not use this queue's keys ({text}): the rule grants another queue, or none. {}",
            acl_hint(user)
        );
    }
    // Redis's own refusal of a command sent alone names it: "... no permissions to run
    // the 'hstrlen' command". (Inside a script, before 7.0, the script may have written
    // before it: that text says "script", and falls to the words below.)
    if let Some(command) = text
        .split_once("permissions to run the '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(command, _)| command.to_ascii_uppercase())
        .filter(|_| no_perm && !text.contains("script"))
    {
        return format!(
            "user {user:?} may not run {command}, which delayq needs ({text}); nothing was written. {}",
            acl_hint(user)
        );
    }
    if no_perm {
        return format!(
            "user {user:?} lacks a permission delayq needs: {text}. {}",
            acl_hint(user)
        );
    }
    if text.contains(NO_PASSWORD) {
        return format!(
            "Redis has no password set for user {user:?}, yet the URL gives one ({text}): remove the password from \
             the URL, or set one in Redis (requirepass)"
        );
    }
    if let Some(rest) = text.split_once("WRONGPASS").map(|(_, r)| r.trim()) {
        return format!("wrong password for user {user:?} (or no such user, or it is disabled): {rest}");
    }
    if upper.contains("NOAUTH") || text.contains("unauthenticated") {
        return format!(
            "Redis needs a password: give it in the URL (redis://:PASSWORD@host or redis://USER:PASSWORD@host) ({text})"
        );
    }
    text.to_owned()
}

/// "<script>: key K holds a T, delayq keeps a U there", from the scripts' preflight.
fn wrong_type_text(rest: &str) -> String {
    let rest = rest.split(" script: ").next().unwrap_or(rest).trim();
    let (script, what) = rest.split_once(": ").unwrap_or(("", rest));
    let (what, stopped) = match what.find(" (undone)") {
        Some(end) => (&what[..end], "stopped and took back what it had written"),
        None => (what, "stopped before writing anything"),
    };
    format!(
        "{what} (another program wrote that key, or two queues share it); delayq's {script} script {stopped}: \
         rename or delete that key"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{ErrorKind, ServerErrorKind};

    fn server_error(kind: ServerErrorKind, text: &'static str) -> Error {
        let err = redis::RedisError::from((ErrorKind::Server(kind), text));
        Error::from_redis(&err, "redis://127.0.0.1:6379", "default", "push", 5000)
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
    fn a_refused_script_load_says_an_admin_loads_the_scripts_on_redis_6_and_7() {
        for text in [
            "this user has no permissions to run the 'script|load' command",
            "this user has no permissions to run the 'script' command or its subcommand",
        ] {
            let err = server_error(ServerErrorKind::NoPerm, text);
            assert!(err.to_string().contains("`delayq load-scripts`"), "{err}");
        }
    }

    #[test]
    fn permission_errors_are_auth_errors_and_final() {
        let err = server_error(ServerErrorKind::NoPerm, "NOPERM this user has no permissions");
        assert_eq!(err.category(), Category::Auth);
        assert!(!err.is_retryable());
    }

    #[test]
    fn auth_errors_say_what_is_missing_and_how_to_fix_it() {
        let preflight = server_error(
            ServerErrorKind::NoPerm,
            "delayq script claim runs ZADD on {dq:orders}:inflight script: 1f2e, on @user_script:80.",
        );
        assert_eq!(preflight.category(), Category::Auth);
        let text = preflight.to_string();
        for part in [
            "\"default\" may not run ZADD on {dq:orders}:inflight",
            "claim script",
            "delayq acl --user default",
        ] {
            assert!(text.contains(part), "{text}");
        }
        assert!(!text.contains("1f2e"), "{text}");
        let unauthenticated = server_error(
            ServerErrorKind::ResponseError,
            "Protocol error: unauthenticated multibulk length",
        );
        assert_eq!(unauthenticated.category(), Category::Auth);
        assert!(
            unauthenticated.to_string().contains("Redis needs a password"),
            "{unauthenticated}"
        );
        let keys = server_error(
            ServerErrorKind::NoPerm,
            "this user has no permissions to access one of the keys used as arguments",
        );
        assert!(
            keys.to_string()
                .contains("user \"default\" may not use this queue's keys"),
            "{keys}"
        );
        let wrongpass = server_error(
            ServerErrorKind::ResponseError,
            "WRONGPASS invalid username-password pair",
        );
        assert!(
            wrongpass.to_string().contains("wrong password for user \"default\""),
            "{wrongpass}"
        );
    }

    #[test]
    fn a_key_of_the_wrong_type_is_named_with_what_it_holds() {
        let err = server_error(
            ServerErrorKind::ResponseError,
            "WRONGTYPE delayq script claim: key {dq:orders}:attempts holds a string, delayq keeps a hash there script: 1f2e, on @user_script:90.",
        );
        let text = err.to_string();
        assert!(matches!(err, Error::WrongType(_)), "{err:?}");
        assert!(
            text.starts_with("key {dq:orders}:attempts holds a string, delayq keeps a hash there"),
            "{text}"
        );
        assert!(!err.is_retryable());
    }

    #[test]
    fn a_command_redis_refuses_alone_is_named() {
        let err = server_error(
            ServerErrorKind::NoPerm,
            "NOPERM this user has no permissions to run the 'hstrlen' command",
        );
        let text = err.to_string();
        assert!(
            text.contains("\"default\" may not run HSTRLEN, which delayq needs ("),
            "{text}"
        );
        assert!(
            text.contains("'hstrlen' command") && text.contains("); nothing was written"),
            "{text}"
        );
        assert!(text.contains("delayq acl --user default"), "{text}");
    }

    #[test]
    fn a_newer_stored_format_names_both_versions() {
        let err = server_error(
            ServerErrorKind::ResponseError,
            "DQERR format 2 1 script: 1f2e, on @user_script:90.",
        );
        assert!(matches!(err, Error::Format { stored: 2, known: 1 }), "{err:?}");
        assert_eq!(format_of("\"DQERR\": format 3 1 script: 1f2e"), Some((3, 1)));
        assert_eq!(format_of("DQERR malformed push run at argument 4"), None);
        let text = err.to_string();
        assert!(
            text.contains("stored format 2") && text.contains("reads format 1"),
            "{text}"
        );
        assert!(!err.is_retryable());
    }

    #[test]
    fn a_fault_after_a_write_that_was_undone_says_so() {
        let wrong = server_error(
            ServerErrorKind::ResponseError,
            "WRONGTYPE delayq script push_one: key {dq:o}:stats holds a string, delayq keeps a hash there (undone)",
        )
        .to_string();
        assert!(
            wrong.starts_with("key {dq:o}:stats holds a string, delayq keeps a hash there ("),
            "{wrong}"
        );
        assert!(
            wrong.contains("took back what it had written") && !wrong.contains("before writing"),
            "{wrong}"
        );
        let perm = server_error(
            ServerErrorKind::NoPerm,
            "NOPERM delayq script push_one runs HINCRBY on {dq:o}:stats (undone)",
        )
        .to_string();
        assert!(
            perm.contains("may not run HINCRBY on {dq:o}:stats (delayq's push_one"),
            "{perm}"
        );
        assert!(
            perm.contains("what it had written was taken back") && !perm.contains("nothing was written"),
            "{perm}"
        );
    }

    #[test]
    fn a_batch_written_in_part_says_how_much_keeps_its_category_and_never_says_nothing_was_written() {
        let ids: Vec<String> = (0..5).map(|i| format!("id-{i}")).collect();
        let partly = |cause: Error, written: usize, unknown: usize| Error::PartlyWritten {
            written: ids[..written].to_vec(),
            unknown: ids[written..written + unknown].to_vec(),
            ids: ids.clone(),
            cause: Box::new(cause),
        };
        let causes = [
            Error::OutOfMemory("OOM command not allowed".into()),
            server_error(
                ServerErrorKind::NoPerm,
                "delayq script push runs ZADD on {dq:o}:scheduled",
            ),
            server_error(
                ServerErrorKind::ResponseError,
                "WRONGTYPE delayq script push: key {dq:o}:stats holds a string, delayq keeps a hash there",
            ),
        ];
        for cause in causes {
            assert!(cause.to_string().contains("nothing was written") || cause.to_string().contains("before writing"));
            let category = cause.category();
            let err = partly(cause, 2, 0);
            assert_eq!(err.category(), category);
            let text = err.to_string();
            assert!(
                text.starts_with("2 of the batch's 5 messages were written and the other 3 were not"),
                "{text}"
            );
            assert!(
                !text.contains("nothing was written") && !text.contains("before writing"),
                "{text}"
            );
        }
        let oom = partly(Error::OutOfMemory("OOM command not allowed".into()), 2, 0);
        assert!(oom.is_out_of_memory() && !oom.is_retryable());
        assert_eq!(oom.written_ids(), &ids[..2]);
        let cut = partly(Error::ConnectionLost("reset".into()), 1, 2);
        assert!(cut.is_connection() && cut.is_retryable());
        assert!(
            cut.to_string().starts_with(
                "1 of the batch's 5 messages were written and 2 were not; whether the other 2 were is unknown"
            ),
            "{cut}"
        );
        let none = partly(Error::ConnectionLost("reset".into()), 0, 3);
        assert!(
            none.to_string().starts_with(
                "none of the batch's 5 messages is known to be written: 2 were not, and whether the other 3"
            ),
            "{none}"
        );
        assert!(Error::ConnectionLost("reset".into()).written_ids().is_empty());
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
