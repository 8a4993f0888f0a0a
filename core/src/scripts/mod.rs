//! The Lua scripts, one file each under `lua/`, called with EVALSHA and loaded on
//! NOSCRIPT; or, where an admin installed this build's library of them (Redis 7.0+,
//! [`Library`]), called as functions with FCALL. Each script's header says what it
//! needs:
//!
//! - `-- @include NAME` pulls in `lua/include/NAME.lua` (which may name its own);
//! - `-- KEYS: role ...` lists the queue's keys it touches, by role ([`ROLES`]); it is
//!   sent exactly those, in that order;
//! - `-- @guarded`: it runs without the preflight (include/guard.lua);
//! - `-- @adds`: it adds messages, or what grows with them; as a function (see
//!   [`Library`]), a Redis at its maxmemory refuses it before it starts.
//!
//! From the composed text this module also reads every command the script can run,
//! so that (1) each script starts with a preflight that checks, before its first
//! write, that the user may run each of them and that no key holds a stray type, and
//! (2) `Queue::acl_rule` grants exactly what the scripts run.

use std::collections::BTreeSet;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::{FromRedisValue, ParsingError, Value};

use crate::error::Error;

pub(crate) mod admin;
pub(crate) mod beat;
pub(crate) mod claim;
pub(crate) mod complete;
pub(crate) mod dead;
pub(crate) mod extend;
pub(crate) mod inspect;
pub(crate) mod minutes;
pub(crate) mod now;
pub(crate) mod orphans;
pub(crate) mod push;
pub(crate) mod repeat;
pub(crate) mod replies;

/// A script call's arguments: they know their script and the type of its reply, so
/// one contract lives in one place.
pub(crate) trait Call {
    /// What the script replies.
    type Reply: FromRedisValue;
    /// The script the arguments are for.
    fn script(&self) -> &'static LuaScript;
    /// Add the arguments after the layout and the wake-up channel.
    fn add_to(&self, inv: &mut Invocation<'_>);
}

/// One call of a script, written as it is added into the command that is sent
/// (FCALL and the function, or EVALSHA and the hash; the keys, the arguments): no
/// buffer of its own per argument, which a batch of a thousand ids would pay for a
/// thousand times.
pub(crate) struct Invocation<'a> {
    script: &'a LuaScript,
    cmd: redis::Cmd,
    /// The server's flag for this build's library (see `Endpoint::functions`).
    library: Option<&'a AtomicBool>,
    /// It goes as FCALL.
    fcall: bool,
}

impl<'a> Invocation<'a> {
    /// A call of `script` with `keys`, which must be as many as its header declares;
    /// as FCALL when `library` says the server has this build's functions.
    pub(crate) fn new<'k>(
        script: &'a LuaScript,
        keys: impl ExactSizeIterator<Item = &'k str>,
        library: Option<&'a AtomicBool>,
    ) -> Self {
        debug_assert_eq!(keys.len(), script.keys.len(), "the keys of {}", script.name);
        let fcall = library.is_some_and(|f| f.load(Ordering::Relaxed));
        let mut cmd = if fcall {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(&script.function);
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(script.script.get_hash());
            cmd
        };
        cmd.arg(keys.len());
        for key in keys {
            cmd.arg(key);
        }
        Self {
            script,
            cmd,
            library,
            fcall,
        }
    }

    /// Add one argument (or several, as `ToRedisArgs` writes them).
    pub(crate) fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Run it, loading the script first if the server does not know it. A function
    /// the server does not have (FUNCTION FLUSH, a restart without persistence) runs
    /// as EVALSHA, as every call after it will (see [`learn`]).
    pub(crate) fn invoke<T: FromRedisValue>(&self, con: &mut dyn redis::ConnectionLike) -> redis::RedisResult<T> {
        let eval;
        let cmd = match self.cmd.query(con) {
            Err(e) if self.fcall && function_missing(&e) => {
                eval = self.as_eval();
                &eval
            }
            result => {
                let result = self.loaded_if_missing(result, &self.cmd, con);
                learn(self.library, false, result.as_ref().err());
                return result;
            }
        };
        let result = cmd.query(con);
        let result = self.loaded_if_missing(result, cmd, con);
        learn(self.library, true, result.as_ref().err());
        result
    }

    fn loaded_if_missing<T: FromRedisValue>(
        &self,
        result: redis::RedisResult<T>,
        cmd: &redis::Cmd,
        con: &mut dyn redis::ConnectionLike,
    ) -> redis::RedisResult<T> {
        match result {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.script.load(con)?;
                cmd.query(con)
            }
            result => result,
        }
    }

    /// The same call as EVALSHA.
    fn as_eval(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.script.get_hash());
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        cmd
    }
}

/// What a call's answer teaches of the server's library (`after_missing`: an EVALSHA
/// sent because the function was missing). EVALSHA refused for want of the permission
/// means a rule made for functions: the next call tries FCALL again, which works once
/// an admin installed them. FCALL refused so means a rule without it, and EVALSHA
/// answered after a missing function means the library is gone: EVALSHA from then on.
fn learn(library: Option<&AtomicBool>, after_missing: bool, error: Option<&redis::RedisError>) {
    let Some(flag) = library else { return };
    let refused = |command: &str| {
        error.is_some_and(|e| {
            e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
                && e.to_string().contains(&format!("'{command}' command"))
        })
    };
    if refused("evalsha") {
        flag.store(true, Ordering::Relaxed);
    } else if after_missing || refused("fcall") {
        flag.store(false, Ordering::Relaxed);
    }
}

/// The server has no such function: its library was never loaded, or is gone.
fn function_missing(e: &redis::RedisError) -> bool {
    e.detail().is_some_and(|d| d.starts_with("Function not found"))
}

/// Commands written to one connection each as soon as it is built, their replies read
/// after the last: Redis runs one call while the client builds the next, where a
/// pipeline would build them all before Redis starts. Every reply is read, errors
/// included, so the connection stays in step.
pub(crate) struct Stream<'c, 's> {
    con: &'c mut redis::Connection,
    /// The scripts this connection's server has run for a stream: no need to load.
    streamed: &'c mut Vec<&'static str>,
    sent: Vec<Sent<'s>>,
    packed: Vec<u8>,
}

/// One command of a stream, to read its reply as.
enum Sent<'s> {
    Load,
    /// A call, with the server's flag for the library and whether it went as FCALL.
    Call(&'s LuaScript, Option<&'s AtomicBool>, bool),
    Command,
}

/// What Redis answered to one call or plain command of a stream.
pub(crate) enum Answer<'s> {
    /// It ran and replied: a call with its script, a plain command with `None`.
    Reply(Option<&'s LuaScript>, Value),
    /// An error reply. A script's is raised before its first write (the preflight,
    /// a full Redis's refusal of that write, or its checks of the arguments): it wrote
    /// nothing.
    Refused,
    /// NOSCRIPT, or no such function: it ran nothing; a later stream loads its script
    /// before its first call (and calls it with EVALSHA).
    Missing,
}

/// What a stream's replies came to.
#[derive(Default)]
pub(crate) struct Finished<'s> {
    /// One answer per call or plain command, in the order sent, as far as they were
    /// read: after a `cut`, the rest may or may not have run.
    pub(crate) answers: Vec<Answer<'s>>,
    /// The first error reply of a call or a command, other than NOSCRIPT.
    pub(crate) refused: Option<redis::RedisError>,
    /// The first refused load: it matters only when a call found its script missing
    /// (a user whose rule lacks `SCRIPT LOAD` runs scripts an admin loaded).
    pub(crate) load_refused: Option<redis::RedisError>,
    /// The connection failed, or sent what is not a reply, before every reply was
    /// read: the connection goes (an I/O error is one the caller reconnects after).
    pub(crate) cut: Option<redis::RedisError>,
}

impl Finished<'_> {
    /// A call found its script missing.
    pub(crate) fn scripts_missing(&self) -> bool {
        self.answers.iter().any(|a| matches!(a, Answer::Missing))
    }
}

impl<'c, 's> Stream<'c, 's> {
    /// A stream on a single server's connection; a cluster routes command by command.
    pub(crate) fn new(con: &'c mut crate::conn::Conn) -> redis::RedisResult<Self> {
        match con {
            crate::conn::Conn::Single { con, streamed } => Ok(Self {
                con,
                streamed,
                sent: Vec::new(),
                packed: Vec::new(),
            }),
            crate::conn::Conn::Cluster(_) => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "a stream needs one server's connection, not a cluster's",
            ))),
        }
    }

    /// Send a script call; a script that no stream has seen this connection's
    /// server run is loaded before it: a NOSCRIPT reply would come back only after
    /// the calls behind it were sent.
    pub(crate) fn send(&mut self, inv: Invocation<'s>) -> redis::RedisResult<()> {
        let script = inv.script;
        if inv.fcall {
            self.write(&inv.cmd)?;
            self.sent.push(Sent::Call(script, inv.library, true));
            return Ok(());
        }
        let loading = !self.streamed.contains(&script.name)
            && !self
                .sent
                .iter()
                .any(|s| matches!(s, Sent::Call(c, _, false) if c.name == script.name));
        if loading {
            let mut load = redis::pipe();
            load.load_script(&script.script);
            self.con.send_packed_command(&load.get_packed_pipeline())?;
            self.sent.push(Sent::Load);
        }
        self.write(&inv.cmd)?;
        self.sent.push(Sent::Call(script, inv.library, false));
        Ok(())
    }

    /// Send a plain command.
    pub(crate) fn send_command(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<()> {
        self.write(cmd)?;
        self.sent.push(Sent::Command);
        Ok(())
    }

    fn write(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<()> {
        self.packed.clear();
        cmd.write_packed_command(&mut self.packed);
        self.con.send_packed_command(&self.packed)
    }

    /// Read every reply, errors included (Redis sends them as replies), until the
    /// connection fails.
    pub(crate) fn finish(self) -> Finished<'s> {
        let mut done = Finished {
            answers: Vec::with_capacity(self.sent.len()),
            refused: None,
            load_refused: None,
            cut: None,
        };
        for sent in self.sent {
            let error = match self.con.recv_response() {
                Ok(Value::ServerError(e)) => redis::RedisError::from(e),
                Ok(v) => {
                    match sent {
                        Sent::Load => {}
                        Sent::Call(script, _, fcall) => {
                            if !fcall && !self.streamed.contains(&script.name) {
                                self.streamed.push(script.name);
                            }
                            done.answers.push(Answer::Reply(Some(script), v));
                        }
                        Sent::Command => done.answers.push(Answer::Reply(None, v)),
                    }
                    continue;
                }
                // The replies left cannot be told apart.
                Err(e) if e.is_io_error() => {
                    done.cut = Some(e);
                    return done;
                }
                Err(e) => {
                    done.cut = Some(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("a streamed reply could not be read: {e}"),
                    )));
                    return done;
                }
            };
            match sent {
                Sent::Call(script, _, false)
                    if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    self.streamed.retain(|name| *name != script.name);
                    done.answers.push(Answer::Missing);
                }
                Sent::Call(_, library, true) if function_missing(&error) => {
                    learn(library, true, None);
                    done.answers.push(Answer::Missing);
                }
                Sent::Load => {
                    done.load_refused.get_or_insert(error);
                }
                Sent::Call(_, library, _) => {
                    learn(library, false, Some(&error));
                    done.refused.get_or_insert(error);
                    done.answers.push(Answer::Refused);
                }
                Sent::Command => {
                    done.refused.get_or_insert(error);
                    done.answers.push(Answer::Refused);
                }
            }
        }
        done
    }
}

/// One part of a reply as `T`, or why not: never a default.
pub(crate) fn decode<T: FromRedisValue>(v: &Value) -> Result<T, ParsingError> {
    T::from_redis_value_ref(v)
}

/// A reply that is a list, as its items; anything else is refused: redis-rs reads a
/// nil as an empty list, which would pass for a reply of nothing. `what` names the
/// part in the error ("the reply", "part 2 (ids)").
pub(crate) fn decode_list(v: Value, what: impl std::fmt::Display) -> Result<Vec<Value>, ParsingError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(format!("{what} is {}, not a list", shown(&other)).into()),
    }
}

/// A value as an error shows it: its start only, as a part can hold a whole envelope.
fn shown(v: &Value) -> String {
    const MAX: usize = 60;
    if *v == Value::Nil {
        return "nil".to_owned();
    }
    let text = format!("{v:?}");
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// A count or index, which the scripts send as an integer: refused when negative or
/// past `T` (redis-rs would wrap it).
pub(crate) fn decode_unsigned<T: TryFrom<i64>>(v: &Value) -> Result<T, ParsingError> {
    let n: i64 = decode(v)?;
    T::try_from(n).map_err(|_| format!("{n} where a count or index was due").into())
}

/// A script's whole reply as its reply type; one that does not decode is a
/// protocol error naming the script.
pub(crate) fn read<T: FromRedisValue>(script: &LuaScript, v: Value) -> Result<T, Error> {
    T::from_redis_value(v).map_err(|e| Error::Protocol {
        script: script.name.to_owned(),
        reason: e.to_string(),
    })
}

/// One kind of key a queue has, in the order of `Keys::all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    /// Its name, as the key's suffix (`{dq:orders}:inflight`) and in script headers.
    pub name: &'static str,
    /// The Lua local the script reads it from.
    pub(crate) var: &'static str,
    /// What `TYPE` answers for it.
    pub kind: &'static str,
}

const fn role(name: &'static str, var: &'static str, kind: &'static str) -> Role {
    Role { name, var, kind }
}

/// Every key role, in `Keys::all` order (documented in `lua/include/base.lua`).
pub const ROLES: [Role; 28] = [
    role("scheduled", "K_SCHED", "zset"),
    role("messages", "K_MSG", "hash"),
    role("inflight", "K_INFLIGHT", "zset"),
    role("leases", "K_LEASE", "hash"),
    role("attempts", "K_ATT", "hash"),
    role("errors", "K_ERR", "hash"),
    role("dead", "K_DEAD", "zset"),
    role("stats", "K_STATS", "hash"),
    role("seq", "K_SEQ", "string"),
    role("workers", "K_WORKERS", "hash"),
    role("paused", "K_PAUSED", "hash"),
    role("repeats", "K_REPEATS", "hash"),
    role("repeat_marks", "K_MARKS", "hash"),
    role("limit", "K_LIMIT", "hash"),
    role("limit_log", "K_LIMIT_LOG", "zset"),
    role("control", "K_CONTROL", "hash"),
    role("completed", "K_DONE", "zset"),
    role("completed_messages", "K_DONE_MSG", "hash"),
    role("traces", "K_TRACE", "hash"),
    role("serial_keys", "K_SERIAL", "hash"),
    role("serial_holders", "K_SERIAL_HOLD", "hash"),
    role("serial_line", "K_SERIAL_LINE", "zset"),
    role("serial_lined", "K_SERIAL_LINED", "hash"),
    role("minutes", "K_MINUTES", "hash"),
    role("claims", "K_CLAIMS", "zset"),
    role("claim_ids", "K_CLAIM_IDS", "hash"),
    role("quarantine", "K_QUARANTINE", "hash"),
    role("group_grants", "K_GROUP_GRANTS", "zset"),
];

/// Redis's arity of each command the scripts run (COMMAND INFO: `n` exactly n words,
/// `-n` at least n, the command's name included). The preflight's permission check
/// passes that many words: Redis 8 refuses a `redis.acl_check_cmd` call whose count
/// does not fit. A script that runs a command missing here does not compose, and a
/// test holds the table to the server's COMMAND INFO.
pub const ARITIES: &[(&str, i32)] = &[
    ("EXISTS", -2),
    ("HDEL", -3),
    ("HEXISTS", 3),
    ("HGET", 3),
    ("HGETALL", 2),
    ("HINCRBY", 4),
    ("HLEN", 2),
    ("HMGET", -3),
    ("HSCAN", -3),
    ("HSET", -4),
    ("HSETNX", 4),
    ("HSTRLEN", 3),
    ("INCRBY", 3),
    // A fixed arity before Redis took its NX/XX/GT/LT options: the same words fit both.
    ("PEXPIRE", -3),
    ("PUBLISH", 3),
    ("TIME", 1),
    ("TYPE", 2),
    ("UNLINK", -2),
    ("ZADD", -4),
    ("ZCARD", 2),
    ("ZCOUNT", 4),
    ("ZRANGE", -4),
    ("ZRANGEBYLEX", -4),
    ("ZRANGEBYSCORE", -4),
    ("ZREM", -3),
    ("ZREVRANGE", -4),
    ("ZREVRANGEBYSCORE", -4),
    ("ZSCORE", 3),
];

/// The commands of [`ARITIES`] that write (PUBLISH too: Redis refuses it in a script
/// flagged `no-writes`). A script that runs none is registered `no-writes`, so a
/// Redis at its maxmemory still answers it.
const WRITES: &[&str] = &[
    "HDEL", "HINCRBY", "HSET", "HSETNX", "INCRBY", "PEXPIRE", "PUBLISH", "UNLINK", "ZADD", "ZREM",
];

/// The command the preflight's type check runs, where the user may: rules written
/// before delayq asked for it go on working, without that check.
pub const TYPE_CHECK: &str = "TYPE";

/// One script, composed and ready to run.
#[derive(Debug)]
pub struct LuaScript {
    /// Its file name without `.lua`.
    pub name: &'static str,
    pub(crate) script: redis::Script,
    /// Indexes into [`ROLES`] of the keys it receives, in KEYS order.
    pub(crate) keys: Vec<usize>,
    /// Every command it can run (upper case, sorted), its includes' too. A user
    /// without one of them gets an auth error before the script writes anything,
    /// except for [`TYPE_CHECK`], which the script then goes without.
    pub commands: Vec<String>,
    /// It runs without the preflight (include/guard.lua): a command it runs only to
    /// undo its writes after a fault is not needed for a call to succeed.
    pub guarded: bool,
    /// Its part of the library, and the flags it is registered with.
    block: String,
    flags: &'static str,
    /// The name of its function in this build's library.
    function: String,
}

impl LuaScript {
    /// The roles of the keys it receives, in KEYS order.
    pub fn key_roles(&self) -> impl Iterator<Item = &'static Role> + '_ {
        self.keys.iter().map(|&i| &ROLES[i])
    }
}

/// A script as the composer makes it: its text, the roles it declares, the K_ names
/// it uses and the commands it runs.
#[derive(Debug)]
pub(crate) struct Composed {
    pub(crate) text: String,
    /// Its part of delayq's library (see [`Library`]): its definitions, then
    /// `dq_function`, which a registration and an `end` must follow.
    pub(crate) block: String,
    /// The flags its function is registered with.
    pub(crate) flags: &'static str,
    pub(crate) keys: Vec<usize>,
    /// The K_ names it and its includes use (the unit tests hold `keys` to them).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) used: BTreeSet<String>,
    pub(crate) commands: Vec<String>,
    pub(crate) guarded: bool,
}

/// `-- @include` and `-- KEYS:` lines of a file's leading comment block.
fn header(text: &str) -> (Vec<&str>, Option<Vec<&str>>, bool, bool) {
    let mut includes = Vec::new();
    let mut keys = None;
    let mut guarded = false;
    let mut adds = false;
    for line in text.lines().take_while(|l| l.starts_with("--")) {
        let rest = line.trim_start_matches('-').trim();
        if rest == "@guarded" {
            guarded = true;
        } else if rest == "@adds" {
            adds = true;
        } else if let Some(name) = rest.strip_prefix("@include ") {
            includes.push(name.trim());
        } else if let Some(list) = rest.strip_prefix("KEYS:") {
            keys = Some(list.split_whitespace().collect());
        }
    }
    (includes, keys, guarded, adds)
}

/// The text with comments cut, for reading the names and commands it uses (no string
/// literal in the scripts holds "--").
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| l.find("--").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `(COMMAND, first argument)` of every `redis.call(`/`redis.pcall(` whose command is
/// a string literal.
fn calls_in(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (start, _) in code.match_indices("redis.") {
        let rest = &code[start + 6..];
        let Some(rest) = rest.strip_prefix("call(").or_else(|| rest.strip_prefix("pcall(")) else {
            continue;
        };
        let rest = rest.trim_start();
        let Some(rest) = rest.strip_prefix('\'') else { continue };
        let Some(end) = rest.find('\'') else { continue };
        let command = rest[..end].to_ascii_uppercase();
        let after = rest[end + 1..].trim_start();
        let first = after
            .strip_prefix(',')
            .map(|a| {
                a.trim_start()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .unwrap_or_default();
        out.push((command, first));
    }
    out
}

fn words(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (start, _) in code.match_indices(prefix) {
        let before_ok = code[..start]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if before_ok {
            let word: String = code[start..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(word);
        }
    }
    out
}

/// The includes' texts without the top-level functions (`local function NAME(` to a
/// line `end` at the left margin) that neither `body` nor any function it keeps names:
/// Redis runs a script whole at every call, so an unused function's definition costs
/// every call. Comments and other top-level lines stay.
fn without_unused_functions(texts: &[String], body: &str) -> Vec<String> {
    // Each include as pieces: (function name or None, text).
    let pieces: Vec<Vec<(Option<String>, String)>> = texts
        .iter()
        .map(|text| {
            let mut out: Vec<(Option<String>, String)> = Vec::new();
            let mut open: Option<(String, String)> = None;
            for line in text.lines() {
                if let Some((name, mut acc)) = open.take() {
                    acc.push_str(line);
                    acc.push('\n');
                    if line == "end" {
                        out.push((Some(name), acc));
                    } else {
                        open = Some((name, acc));
                    }
                } else if let Some(rest) = line.strip_prefix("local function ") {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    open = Some((name, format!("{line}\n")));
                } else {
                    out.push((None, format!("{line}\n")));
                }
            }
            if let Some((name, acc)) = open {
                out.push((Some(name), acc));
            }
            out
        })
        .collect();
    let mut reachable = code_of(body);
    for (name, text) in pieces.iter().flatten() {
        if name.is_none() {
            reachable.push_str(&code_of(text));
        }
    }
    let mut kept: BTreeSet<&str> = BTreeSet::new();
    loop {
        let named: BTreeSet<String> = words_in(&reachable).into_iter().map(str::to_owned).collect();
        let mut grew = false;
        for (name, text) in pieces.iter().flatten() {
            if let Some(name) = name
                && !kept.contains(name.as_str())
                && named.contains(name)
            {
                kept.insert(name);
                reachable.push_str(&code_of(text));
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    pieces
        .iter()
        .map(|p| {
            p.iter()
                .filter(|(name, _)| name.as_deref().is_none_or(|n| kept.contains(n)))
                .map(|(_, text)| text.as_str())
                .collect()
        })
        .collect()
}

/// Every identifier in `code`.
fn words_in(code: &str) -> BTreeSet<&str> {
    code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect()
}

/// Compose script `name` from files that `load` reads (`"claim.lua"`,
/// `"include/serial.lua"`), as the crate does at start and `examples/scripts.rs` does
/// for the benches' copies.
pub(crate) fn compose(name: &str, load: &dyn Fn(&str) -> Option<String>) -> Result<Composed, String> {
    let body = load(&format!("{name}.lua")).ok_or_else(|| format!("no script {name}.lua"))?;
    let (includes, declared, guarded, adds) = header(&body);
    let declared = declared.ok_or_else(|| format!("{name}.lua: its header has no `-- KEYS:` line"))?;
    let mut keys = Vec::new();
    for role in &declared {
        let i = ROLES
            .iter()
            .position(|r| r.name == *role)
            .ok_or_else(|| format!("{name}.lua: KEYS names {role:?}, which is no key role"))?;
        keys.push(i);
    }

    // Includes before what names them, each once; base first.
    let mut order: Vec<String> = Vec::new();
    let mut texts: Vec<String> = Vec::new();
    fn visit(
        inc: &str,
        load: &dyn Fn(&str) -> Option<String>,
        order: &mut Vec<String>,
        texts: &mut Vec<String>,
        path: &mut Vec<String>,
    ) -> Result<(), String> {
        if order.iter().any(|o| o == inc) {
            return Ok(());
        }
        if path.iter().any(|p| p == inc) {
            return Err(format!("include cycle: {} -> {inc}", path.join(" -> ")));
        }
        let text = load(&format!("include/{inc}.lua")).ok_or_else(|| format!("no include/{inc}.lua"))?;
        path.push(inc.to_owned());
        for dep in header(&text).0 {
            visit(dep, load, order, texts, path)?;
        }
        path.pop();
        order.push(inc.to_owned());
        texts.push(text);
        Ok(())
    }
    for inc in std::iter::once("base").chain(includes) {
        visit(inc, load, &mut order, &mut texts, &mut Vec::new()).map_err(|e| format!("{name}.lua: {e}"))?;
    }
    // The includes after guard call Redis through it; without it, through the preflight.
    if guarded != (order.get(1).map(String::as_str) == Some("guard")) {
        return Err(format!(
            "{name}.lua: a `-- @guarded` script has guard as its first include, and only it"
        ));
    }
    if !guarded && order.iter().any(|o| o == "guard") {
        return Err(format!("{name}.lua: includes guard without `-- @guarded`"));
    }

    let mut code = String::new();
    for t in &texts {
        code.push_str(&code_of(t));
        code.push('\n');
    }
    code.push_str(&code_of(&body));
    if guarded {
        // The includes after base call Redis through include/guard.lua's table, which
        // has these only.
        let after_base: String = texts[1..]
            .iter()
            .chain(std::iter::once(&body))
            .map(|t| code_of(t))
            .collect();
        for (at, _) in after_base.match_indices("redis.") {
            let field: String = after_base[at + 6..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !["call", "pcall", "error_reply"].contains(&field.as_str()) {
                return Err(format!(
                    "{name}.lua: a guarded script calls redis.{field}, which guard.lua lacks"
                ));
            }
        }
    }
    let used: BTreeSet<String> = words(&code, "K_");
    let calls = calls_in(&code);
    // TYPE too: the preflight below runs it.
    let commands: BTreeSet<String> = calls
        .iter()
        .map(|(c, _)| c.clone())
        .chain(std::iter::once(TYPE_CHECK.to_owned()))
        .collect();

    // The preflight, written out line by line: a table of its arguments, built at
    // every call, cost more than the checks around it.
    let vars: Vec<&str> = keys.iter().map(|&i| ROLES[i].var).collect();
    let any_key = vars.first().copied();
    let mut preflight = String::from("-- preflight: permissions (scripts::compose writes it, see include/base.lua)\n");
    preflight.push_str("if redis.acl_check_cmd then\n");
    for command in commands.iter().filter(|c| *c != TYPE_CHECK) {
        let arity = ARITIES
            .iter()
            .find(|(c, _)| c == command)
            .map(|&(_, a)| a.unsigned_abs() as usize)
            .ok_or_else(|| format!("{name}.lua runs {command}, which scripts::ARITIES does not list"))?;
        let firsts: BTreeSet<&str> = calls
            .iter()
            .filter(|(c, _)| c == command)
            .map(|(_, f)| f.as_str())
            .collect();
        let mut words = vec![format!("'{command}'")];
        if arity > 1 {
            if let Some(ch) = firsts.iter().find(|f| **f == "CHANNEL") {
                words.push((*ch).to_owned());
            } else if let Some(k) = firsts.iter().find(|f| vars.contains(f)) {
                words.push((*k).to_owned());
            } else if let Some(k) = any_key {
                words.push(k.to_owned());
            }
        }
        let fault = match words.get(1) {
            Some(target) => format!("'NOPERM delayq script {name} runs {command} on ' .. {target}"),
            None => format!("'NOPERM delayq script {name} runs {command}'"),
        };
        while words.len() < arity {
            words.push("'0'".to_owned());
        }
        preflight.push_str(&format!(
            "  if not redis.acl_check_cmd({}) then\n    \
             return redis.error_reply({fault})\n  end\n",
            words.join(", ")
        ));
    }
    preflight.push_str("end -- preflight: permissions\n-- preflight: key types\ndo\n  local held\n");
    for &i in &keys {
        let Role { var, kind, .. } = ROLES[i];
        preflight.push_str(&format!(
            "  held = redis.pcall('TYPE', {var}).ok\n  \
             if held and held ~= 'none' and held ~= '{kind}' then\n    \
             return redis.error_reply('WRONGTYPE delayq script {name}: key ' .. {var} .. ' holds a ' .. held\n      \
             .. ', delayq keeps a {kind} there')\n  end\n"
        ));
    }
    preflight.push_str("end -- preflight: key types\n");

    // The includes and the script share one scope: a second function of one name would
    // shadow the first, and without_unused_functions would keep the callees of one only.
    let mut defined = BTreeSet::new();
    for line in texts.iter().chain([&body]).flat_map(|t| t.lines()) {
        if let Some(rest) = line.strip_prefix("local function ") {
            let function: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !defined.insert(function.clone()) {
                return Err(format!(
                    "{name}.lua: {function} is defined twice in it and its includes"
                ));
            }
        }
    }
    let texts = without_unused_functions(&texts, &body);
    // What the script defines before it runs: the includes, and what guard names a
    // fault with.
    let mut head = String::new();
    if guarded {
        head.push_str(&format!("local SCRIPT = '{name}'\nlocal function KIND_OF(key)\n"));
        for &i in &keys {
            let Role { var, kind, .. } = ROLES[i];
            head.push_str(&format!("  if key == {var} then return '{kind}' end\n"));
        }
        head.push_str("  return '?'\nend\n");
    }
    for t in &texts {
        head.push_str(t);
        head.push('\n');
    }
    let mut run = String::new();
    if !guarded {
        run.push_str(&preflight);
    }
    run.push_str(&body);

    let key_list = vars.join(", ");
    let slots: Vec<String> = (1..=vars.len()).map(|i| format!("KEYS[{i}]")).collect();
    let bind_keys = if vars.is_empty() {
        String::new()
    } else {
        format!("{key_list} = {}\n", slots.join(", "))
    };
    const BIND_ARGS: &str = "LAYOUT, CHANNEL = ARGV[1], ARGV[2]\nSEED = LAYOUT == 'seed'\n";

    // As EVAL runs it: the whole text at every call.
    let mut text = String::new();
    if !vars.is_empty() {
        text.push_str(&format!("local {bind_keys}"));
    }
    text.push_str("local LAYOUT, CHANNEL = ARGV[1], ARGV[2]\nlocal SEED = LAYOUT == 'seed'\n");
    text.push_str(&head);
    text.push_str(&run);

    // As a function of delayq's library (Redis 7): the definitions run once, when Redis
    // loads the library; each call binds the keys and arguments, and sets again what
    // an include keeps for one call (its lines marked `-- per call`). `dq_bind` sets
    // the names the includes see; the body sees its own locals, since Lua lets one
    // function reach at most 60 names of the functions around it.
    let resets: String = texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| l.strip_suffix(" -- per call")?.strip_prefix("local "))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut block = String::from("do\nlocal KEYS, ARGV\n");
    if !vars.is_empty() {
        block.push_str(&format!("local {key_list}\n"));
    }
    block.push_str(&format!(
        "local LAYOUT, CHANNEL, SEED\n{head}local function dq_bind(keys, args)\nKEYS, ARGV = keys, args\n\
         {bind_keys}{BIND_ARGS}{resets}end\nlocal function dq_function(KEYS, ARGV)\ndq_bind(KEYS, ARGV)\n"
    ));
    if !vars.is_empty() {
        block.push_str(&format!("local {bind_keys}"));
    }
    block.push_str(&format!(
        "local LAYOUT, CHANNEL = ARGV[1], ARGV[2]\nlocal SEED = LAYOUT == 'seed'\n{run}\nend\n"
    ));
    // A Redis at its maxmemory refuses a function at its start unless it is flagged:
    // a call that adds messages is refused whole, as a push script is; every other
    // runs, as a script that drains the queue does (include/oom.lua), and reads.
    let flags = if !commands.iter().any(|c| WRITES.contains(&c.as_str())) {
        "'no-writes'"
    } else if adds {
        ""
    } else {
        "'allow-oom'"
    };
    Ok(Composed {
        text,
        block,
        flags,
        keys,
        used,
        commands: commands.into_iter().collect(),
        guarded,
    })
}

macro_rules! lua_files {
    ($($file:literal),* $(,)?) => {
        /// Every one of the crate's own Lua files, for the library's name.
        const LUA_TEXTS: &[&str] = &[$(include_str!(concat!("../lua/", $file))),*];

        /// The crate's own Lua files, by their path under `lua/`.
        pub(crate) fn builtin(path: &str) -> Option<String> {
            match path {
                $($file => Some(include_str!(concat!("../lua/", $file)).to_owned()),)*
                _ => None,
            }
        }
    };
}

lua_files!(
    "include/base.lua",
    "include/claims.lua",
    "include/clock.lua",
    "include/completed.lua",
    "include/dead.lua",
    "include/forget.lua",
    "include/group_gate.lua",
    "include/group_limits.lua",
    "include/guard.lua",
    "include/hashtable.lua",
    "include/hdel_if_any.lua",
    "include/minutes.lua",
    "include/oom.lua",
    "include/order.lua",
    "include/pools.lua",
    "include/push_runs.lua",
    "include/quarantine.lua",
    "include/repeat.lua",
    "include/replace.lua",
    "include/schedule.lua",
    "include/seq.lua",
    "include/stall.lua",
    "include/stamp.lua",
    "include/restamp.lua",
    "include/serial.lua",
    "include/shown.lua",
    "ack.lua",
    "beat.lua",
    "cancel.lua",
    "claim.lua",
    "dead.lua",
    "dead_matching.lua",
    "delete_dead.lua",
    "extend.lua",
    "find.lua",
    "get.lua",
    "group_limit.lua",
    "limit.lua",
    "list.lua",
    "minutes.lua",
    "minutes_add.lua",
    "nack.lua",
    "now.lua",
    "orphans.lua",
    "pause.lua",
    "purge.lua",
    "push.lua",
    "push_one.lua",
    "push_replace.lua",
    "release.lua",
    "repeat_del.lua",
    "repeat_next.lua",
    "repeat_set.lua",
    "repeats.lua",
    "requeue.lua",
    "reschedule.lua",
    "restart.lua",
    "stats.lua",
    "workers.lua",
);

fn load(name: &'static str) -> LuaScript {
    match compose(name, &builtin) {
        Ok(c) => LuaScript {
            name,
            script: redis::Script::new(&c.text),
            keys: c.keys,
            commands: c.commands,
            guarded: c.guarded,
            block: c.block,
            flags: c.flags,
            function: format!("{}_{name}", *LIBRARY_NAME),
        },
        // The files are compiled in and the unit tests compose each one.
        Err(e) => panic!("delayq's Lua script {name} does not compose: {e}"),
    }
}

macro_rules! scripts {
    ($($static:ident = $name:literal),* $(,)?) => {
        $(pub(crate) static $static: LazyLock<LuaScript> = LazyLock::new(|| load($name));)*
        /// Every script, for tools (the ACL rule, the fault tests).
        pub fn all() -> Vec<&'static LuaScript> {
            vec![$(&*$static),*]
        }
    };
}

scripts!(
    PUSH = "push",
    PUSH_ONE = "push_one",
    PUSH_REPLACE = "push_replace",
    CLAIM = "claim",
    ACK = "ack",
    NACK = "nack",
    RELEASE = "release",
    EXTEND = "extend",
    CANCEL = "cancel",
    RESCHEDULE = "reschedule",
    GET = "get",
    STATS = "stats",
    DEAD = "dead",
    REQUEUE = "requeue",
    DELETE_DEAD = "delete_dead",
    DEAD_MATCHING = "dead_matching",
    PURGE = "purge",
    BEAT = "beat",
    WORKERS = "workers",
    PAUSE = "pause",
    LIMIT = "limit",
    GROUP_LIMIT = "group_limit",
    RESTART = "restart",
    LIST = "list",
    REPEAT_SET = "repeat_set",
    REPEAT_NEXT = "repeat_next",
    REPEAT_DEL = "repeat_del",
    REPEATS = "repeats",
    FIND = "find",
    MINUTES_ADD = "minutes_add",
    MINUTES = "minutes",
    NOW = "now",
    ORPHANS = "orphans",
);

/// Every script as one function of a library, for a Redis with Functions (7.0+): what
/// a script defines runs once, when Redis loads the library, not at every call; and a
/// user may be granted FCALL of functions an admin loaded, where EVALSHA with SCRIPT
/// LOAD would let it run any Lua. The library and its functions are named by this
/// build's scripts, so the libraries of two builds, in a rolling deploy, live side by
/// side.
#[derive(Debug)]
pub struct Library {
    /// [`LIBRARY_NAME`].
    pub name: String,
    /// What FUNCTION LOAD is sent. A function named as the library answers that name:
    /// a connection calls it to learn whether the server has this build's library.
    pub text: String,
}

/// This build's library's name: `delayq_` and 12 hex digits of a hash (FNV-1a) of what
/// makes its text, the Lua files and the code that composes them (this file). Every
/// new connection asks for it, so it is made without composing a script.
pub static LIBRARY_NAME: LazyLock<String> = LazyLock::new(|| {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for text in LUA_TEXTS.iter().chain([&include_str!("mod.rs")]) {
        // Each text ends with a byte no text holds, so that no two splits hash alike.
        for b in text.bytes().chain([0xff]) {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("delayq_{:012x}", hash >> 16)
});

/// This build's library: every script composed, for its install.
pub static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let name = LIBRARY_NAME.clone();
    // A guarded script's block shadows `redis` (include/guard.lua).
    let mut text = format!("#!lua name={name}\nlocal dq_register = redis.register_function\n");
    for s in all() {
        text.push_str(&s.block);
        let (function, flags) = (&s.function, s.flags);
        text.push_str(&format!(
            "dq_register{{function_name = '{function}', callback = dq_function, flags = {{{flags}}}}}\nend\n"
        ));
    }
    text.push_str(&format!(
        "dq_register{{function_name = '{name}', callback = function() return '{name}' end, \
         flags = {{'no-writes', 'allow-stale'}}}}\n"
    ));
    Library { name, text }
});

/// One script as [`compose_from_dir`] makes it.
#[doc(hidden)]
#[derive(Debug)]
pub struct ComposedScript {
    /// Its file name without `.lua`.
    pub name: String,
    /// The text sent to Redis.
    pub text: String,
    /// The roles of the keys it receives, in KEYS order.
    pub keys: Vec<&'static str>,
    /// Every command it can run.
    pub commands: Vec<String>,
}

/// Compose the scripts from the files under `dir` (a changed copy of `lua/`, for the
/// benches): those it has a file for.
#[doc(hidden)]
pub fn compose_from_dir(dir: &std::path::Path) -> Result<Vec<ComposedScript>, String> {
    let load = |p: &str| std::fs::read_to_string(dir.join(p)).ok();
    all()
        .into_iter()
        // A copy from before a script was written lacks it.
        .filter(|s| dir.join(format!("{}.lua", s.name)).exists())
        .map(|s| {
            let c = compose(s.name, &load)?;
            Ok(ComposedScript {
                name: s.name.to_owned(),
                text: c.text,
                keys: c.keys.iter().map(|&i| ROLES[i].name).collect(),
                commands: c.commands,
            })
        })
        .collect()
}

/// Most ids one script call handles; bounds how long any call blocks Redis.
pub const MAX_BATCH: usize = 1000;

/// The arguments that `add_to` gives a script call, as sent.
#[cfg(test)]
pub(crate) fn sent_args(add_to: impl FnOnce(&mut Invocation<'_>)) -> Vec<String> {
    let script = LuaScript {
        name: "test",
        script: redis::Script::new("return 1"),
        keys: Vec::new(),
        commands: Vec::new(),
        guarded: false,
        block: String::new(),
        flags: "",
        function: String::new(),
    };
    let mut inv = Invocation::new(&script, std::iter::empty(), None);
    add_to(&mut inv);
    // The words as sent: EVALSHA, the hash, the key count, then the arguments.
    let packed = inv.cmd.get_packed_command();
    let text = String::from_utf8(packed).expect("text");
    text.split("\r\n")
        .skip(2)
        .step_by(2)
        .skip(3)
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_script_declares_exactly_the_keys_it_uses() {
        for s in all() {
            let c = compose(s.name, &builtin).expect("composes");
            let declared: BTreeSet<String> = c.keys.iter().map(|&i| ROLES[i].var.to_owned()).collect();
            assert_eq!(
                declared, c.used,
                "{}.lua: its `-- KEYS:` line must list exactly the roles of the K_ names it and its includes use",
                s.name
            );
            assert_eq!(c.keys.len(), declared.len(), "{}.lua names a key twice", s.name);
        }
    }

    #[test]
    fn base_lua_documents_every_role_with_its_type() {
        let doc: Vec<(String, String)> = builtin("include/base.lua")
            .expect("base")
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix("--   ")?;
                let mut w = rest.split_whitespace();
                let (name, kind) = (w.next()?, w.next()?);
                ["ZSET", "HASH", "STRING"]
                    .contains(&kind)
                    .then(|| (name.to_owned(), kind.to_ascii_lowercase()))
            })
            .collect();
        let roles: Vec<(String, String)> = ROLES.iter().map(|r| (r.name.to_owned(), r.kind.to_owned())).collect();
        assert_eq!(doc, roles);
    }

    #[test]
    fn commands_are_read_from_the_calls() {
        let calls =
            calls_in("redis.call('zadd', K_SCHED, 1, 'a') redis.pcall( 'TIME') redis.call('PUBLISH', CHANNEL, x)");
        assert_eq!(
            calls,
            vec![
                ("ZADD".to_owned(), "K_SCHED".to_owned()),
                ("TIME".to_owned(), String::new()),
                ("PUBLISH".to_owned(), "CHANNEL".to_owned()),
            ]
        );
        let claim = &*CLAIM;
        for c in ["ZADD", "ZREM", "HSET", "INCRBY", "TIME", "TYPE", "HMGET"] {
            assert!(
                claim.commands.iter().any(|x| x == c),
                "claim runs {c}: {:?}",
                claim.commands
            );
        }
    }

    #[test]
    fn the_preflight_comes_before_the_scripts_own_code() {
        for s in all() {
            let c = compose(s.name, &builtin).expect("composes");
            let body = builtin(&format!("{}.lua", s.name)).expect("body");
            if header(&body).2 {
                // A guarded script names its faults through include/guard.lua.
                assert!(!c.text.contains("-- preflight:"), "{}", s.name);
                assert!(c.text.contains(&format!("local SCRIPT = '{}'", s.name)), "{}", s.name);
                continue;
            }
            let pre = c.text.find("-- preflight: permissions").expect("a preflight");
            assert!(c.text.contains(&format!("delayq script {} runs", s.name)), "{}", s.name);
            assert!(pre < c.text.rfind(&body).expect("the body"), "{}", s.name);
        }
    }

    #[test]
    fn functions_no_code_names_are_left_out() {
        let include = "-- a comment\nlocal function used()\n  return helper()\nend\n\
                       local function helper()\n  return 1\nend\n\
                       local function unused()\n  return 2\nend\n\
                       local function at_top()\n  return 3\nend\nlocal TOP = at_top()\n";
        let kept = without_unused_functions(&[include.to_owned()], "return used() -- unused()");
        let kept = &kept[0];
        for name in ["used", "helper", "at_top"] {
            assert!(kept.contains(&format!("local function {name}()")), "{name}: {kept}");
        }
        assert!(!kept.contains("unused"), "{kept}");
        assert!(
            kept.contains("-- a comment") && kept.contains("local TOP = at_top()"),
            "{kept}"
        );
    }

    #[test]
    fn a_guarded_script_has_guard_first_and_no_preflight() {
        let files = |p: &str| match p {
            "g.lua" => Some("-- @guarded\n-- @include guard\n-- KEYS: scheduled\nreturn 1".to_owned()),
            "h.lua" => Some("-- @guarded\n-- KEYS: scheduled\nreturn 1".to_owned()),
            "i.lua" => Some("-- @include guard\n-- KEYS: scheduled\nreturn 1".to_owned()),
            "include/base.lua" | "include/guard.lua" => Some(String::new()),
            _ => None,
        };
        let g = compose("g", &files).expect("composes");
        assert!(g.guarded && !g.text.contains("-- preflight:"), "{}", g.text);
        assert!(g.text.contains("local SCRIPT = 'g'") && g.text.contains("if key == K_SCHED then return 'zset'"));
        for bad in ["h", "i"] {
            assert!(compose(bad, &files).expect_err(bad).contains("guard"), "{bad}");
        }
    }

    #[test]
    fn the_library_registers_every_script_with_the_flags_its_work_calls_for() {
        let lib = &*LIBRARY;
        assert!(
            lib.text.starts_with(&format!("#!lua name={}\n", lib.name)),
            "{}",
            &lib.text[..80]
        );
        let flags_of = |name: &str| -> &str {
            let at = lib
                .text
                .find(&format!("function_name = '{}_{name}'", lib.name))
                .unwrap_or_else(|| panic!("{name} is not registered"));
            let rest = &lib.text[at..];
            let start = rest.find("flags = {").expect("flags") + 9;
            &rest[start..start + rest[start..].find('}').expect("end")]
        };
        for s in all() {
            flags_of(s.name);
        }
        // Adding messages is refused whole by a full Redis; draining, the bookkeeping
        // of reads and deleting are not; reads are registered as such.
        for name in [
            "push",
            "push_one",
            "push_replace",
            "repeat_set",
            "repeat_next",
            "minutes_add",
        ] {
            assert_eq!(flags_of(name), "", "{name}");
        }
        for name in [
            "claim",
            "ack",
            "nack",
            "release",
            "extend",
            "beat",
            "cancel",
            "purge",
            "delete_dead",
            "stats",
        ] {
            assert_eq!(flags_of(name), "'allow-oom'", "{name}");
        }
        for name in ["dead", "find", "repeats"] {
            assert_eq!(flags_of(name), "'no-writes'", "{name}");
        }
    }

    #[test]
    fn what_an_include_keeps_for_one_call_is_set_again_at_each_call() {
        let files = |p: &str| match p {
            "s.lua" => Some("-- @include kept\n-- KEYS: scheduled\nreturn seen()".to_owned()),
            "include/base.lua" => Some(String::new()),
            "include/kept.lua" => Some(
                "local marks = {} -- per call\nlocal function seen()\n  marks[1] = true\n  return K_SCHED\nend\n"
                    .to_owned(),
            ),
            _ => None,
        };
        let c = compose("s", &files).expect("composes");
        let bind = &c.block[c.block.find("local function dq_bind").expect("bind")..];
        let bind = &bind[..bind.find("\nend\n").expect("end of bind")];
        assert!(
            bind.contains("marks = {}") && bind.contains("K_SCHED = KEYS[1]"),
            "{bind}"
        );
        // Defined once, before the function; the body binds its own keys.
        let function = c.block.find("local function dq_function").expect("function");
        assert!(c.block.find("local function seen()").expect("seen") < function);
        assert!(c.block[function..].contains("local K_SCHED = KEYS[1]"), "{}", c.block);
        // The script as EVAL sends it is unchanged by all this.
        assert!(
            c.text.starts_with("local K_SCHED = KEYS[1]\n") && !c.text.contains("dq_"),
            "{}",
            c.text
        );
    }

    #[test]
    fn bad_headers_are_refused_with_the_file_named() {
        let files = |p: &str| match p {
            "x.lua" => Some("-- KEYS: scheduled nonsense\nreturn 1".to_owned()),
            "y.lua" => Some("-- no keys line\nreturn 1".to_owned()),
            "z.lua" => Some("-- @include a\n-- KEYS:\nreturn 1".to_owned()),
            "w.lua" => Some("-- @include c\n-- KEYS:\nlocal function f()\n  return 2\nend\nreturn f()".to_owned()),
            "include/base.lua" => Some(String::new()),
            "include/c.lua" => Some("local function f()\n  return 1\nend\n".to_owned()),
            "include/a.lua" => Some("-- @include b\n".to_owned()),
            "include/b.lua" => Some("-- @include a\n".to_owned()),
            _ => None,
        };
        assert!(compose("x", &files).expect_err("refused").contains("\"nonsense\""));
        assert!(
            compose("y", &files)
                .expect_err("refused")
                .contains("no `-- KEYS:` line")
        );
        assert!(compose("z", &files).expect_err("refused").contains("include cycle"));
        assert!(
            compose("w", &files)
                .expect_err("refused")
                .contains("f is defined twice")
        );
    }
}
