//! The exact Redis ACL rule for one queue: its keys by their exact hash tags, its
//! wake-up channels, and the commands delayq sends, those of the scripts read from the
//! scripts themselves (see scripts.rs), so the rule cannot fall behind them.

use std::collections::BTreeSet;

use crate::conn::Replay;
use crate::keys::Layout;
use crate::queue::Queue;
use crate::scripts;

/// What delayq sends outside its scripts: the script calls themselves, the pool's
/// wake-up subscription, and its read of the envelopes a claim handed out (see
/// claim.lua) and of their sizes (see `WorkerOptions::max_payload_bytes`). `PING`
/// answers `Queue::ping`.
const CLIENT_COMMANDS: [&str; 6] = ["EVALSHA", "SUBSCRIBE", "UNSUBSCRIBE", "PING", "HMGET", "HSTRLEN"];

/// What loads delayq's scripts when the server does not have them: with it, a user
/// may load and run any Lua (which Redis runs under the same ACL, but a loop of its
/// own stalls every client); without it, an admin loads them (`Queue::load_scripts`).
const SCRIPT_LOAD: &str = "SCRIPT|LOAD";

/// How a queue's user runs delayq's scripts, as its ACL rule grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptRights {
    /// EVALSHA, and SCRIPT LOAD of a script the server lacks: works without an admin,
    /// and lets the user run any Lua of its own (under its ACL, but a loop stalls every
    /// client).
    Load,
    /// EVALSHA of the scripts an admin loaded ([`Queue::load_scripts`]) after each
    /// restart, failover or SCRIPT FLUSH; the user can still run a script it finds the
    /// hash of.
    Preloaded,
    /// FCALL of the functions an admin installed ([`Queue::install_functions`], Redis
    /// 7.0+): no EVALSHA, no SCRIPT LOAD, so no Lua but delayq's (and other libraries'
    /// an admin loaded). Functions are kept across restarts and replicated.
    Functions,
}

/// An ACL pattern matching exactly `literal` (ACL patterns are globs).
fn exact(literal: &str) -> String {
    let mut out = String::with_capacity(literal.len());
    for c in literal.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The rule's words after `ACL SETUSER <user>`: `channels` false leaves out the
/// channel rules (Redis before 6.2 has none).
pub(crate) fn rule_words(
    user: &str,
    layout: &Layout,
    tags: &[String],
    channels: &[String],
    extra: &[&str],
    with_channels: bool,
    rights: ScriptRights,
) -> Vec<String> {
    let mut words = vec![user.to_owned(), "on".into(), ">PASSWORD".into(), "resetkeys".into()];
    match layout {
        Layout::Native => words.extend(tags.iter().map(|t| format!("~{}:*", exact(t)))),
        Layout::Seed { zset_key, payload_key } => {
            words.push(format!("~{}", exact(zset_key)));
            words.push(format!("~{}", exact(payload_key)));
            words.push(format!("~{}:*", exact(zset_key)));
        }
    }
    if with_channels {
        words.push("resetchannels".into());
        words.extend(channels.iter().map(|c| format!("&{}", exact(c))));
    }
    words.push("-@all".into());
    let commands: BTreeSet<String> = scripts::all()
        .iter()
        .flat_map(|s| s.commands.iter().cloned())
        .chain(
            CLIENT_COMMANDS
                .iter()
                .filter(|c| rights != ScriptRights::Functions || **c != "EVALSHA")
                .map(|c| (*c).to_owned()),
        )
        .chain(match rights {
            ScriptRights::Load => Some(SCRIPT_LOAD.to_owned()),
            ScriptRights::Preloaded => None,
            ScriptRights::Functions => Some("FCALL".to_owned()),
        })
        .chain(extra.iter().map(|c| (*c).to_owned()))
        .map(|c| c.to_ascii_lowercase())
        .collect();
    words.extend(commands.into_iter().map(|c| format!("+{c}")));
    words
}

impl Queue {
    /// The `ACL SETUSER` line that grants `user` exactly this queue: each partition's
    /// keys by their exact hash tag, its wake-up channels, and the commands delayq
    /// sends (those its scripts run included). Replace `PASSWORD` with the user's
    /// password. Channel rules are left out when the server is older than 6.2 (it has
    /// none); when the server cannot be asked, they are kept. With `wait_replicas`,
    /// `WAIT` is granted; behind Sentinel, `ROLE` (a new connection checks that the
    /// master it was named is one).
    pub fn acl_rule(&self, user: &str) -> String {
        self.acl_rule_for(user, ScriptRights::Load)
    }

    /// As [`acl_rule`](Self::acl_rule), granting the scripts as `rights` says: with
    /// [`ScriptRights::Preloaded`] or [`ScriptRights::Functions`], the user's calls
    /// fail, saying so, until an admin loaded the scripts or installed the functions.
    pub fn acl_rule_for(&self, user: &str, rights: ScriptRights) -> String {
        let inner = &*self.inner;
        let tags: Vec<String> = (0..self.partitions()).filter_map(|p| self.hash_tag(p)).collect();
        let channels: Vec<String> = inner.parts.iter().map(|k| k.wake_channel.clone()).collect();
        let mut extra = Vec::new();
        if inner.opts.wait_replicas > 0 {
            extra.push("WAIT");
        }
        if inner.endpoint.sentinel_service().is_some() {
            extra.push("ROLE");
        }
        let with_channels = self.server_version().is_none_or(|v| v >= (6, 2));
        let words = rule_words(
            user,
            &inner.opts.layout,
            &tags,
            &channels,
            &extra,
            with_channels,
            rights,
        );
        format!("ACL SETUSER {}", words.join(" "))
    }

    /// Load every script of delayq on the server (each node of a cluster), for users
    /// whose rule lacks `SCRIPT LOAD` ([`ScriptRights::Preloaded`]); run it as an admin
    /// after each restart, failover or `SCRIPT FLUSH`. Returns how many were loaded.
    pub fn load_scripts(&self) -> crate::error::Result<usize> {
        let inner = &*self.inner;
        let all = scripts::all();
        inner
            .conn
            .lock()
            .run(&inner.endpoint, "load_scripts", Replay::Safe, |con| {
                for s in &all {
                    s.script.load(con)?;
                }
                Ok(all.len())
            })
    }

    /// Install this build's library of functions (`FUNCTION LOAD REPLACE`, on each
    /// master of a cluster), Redis 7.0+, for users whose rule grants FCALL
    /// ([`ScriptRights::Functions`]); run it as an admin once per build: Redis keeps
    /// functions across restarts and replicates them. Connections made after it call
    /// the functions; a build's library is named by its scripts, so the libraries of
    /// the builds of a rolling deploy live side by side. Returns the library's name.
    pub fn install_functions(&self) -> crate::error::Result<String> {
        let inner = &*self.inner;
        let library = &*scripts::LIBRARY;
        let name = inner
            .conn
            .lock()
            .run(&inner.endpoint, "install_functions", Replay::Safe, |con| {
                redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg("REPLACE")
                    .arg(&library.text)
                    .query::<redis::Value>(con)
            })
            .map(|_| library.name.clone())?;
        inner
            .endpoint
            .functions
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(name)
    }

    /// The server's (major, minor) version, if it answers.
    fn server_version(&self) -> Option<(u32, u32)> {
        let inner = &*self.inner;
        let info: String = inner
            .conn
            .lock()
            .run(&inner.endpoint, "acl_rule", Replay::Safe, |con| {
                redis::cmd("INFO").arg("server").query::<String>(con)
            })
            .ok()?;
        let version = info.lines().find_map(|l| l.strip_prefix("redis_version:"))?;
        let mut parts = version.trim().split('.').map(|p| p.parse::<u32>().ok());
        Some((parts.next()??, parts.next()??))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_only_the_literal() {
        assert_eq!(exact("{dq:a*b?[c]}"), "{dq:a\\*b\\?\\[c\\]}");
    }

    #[test]
    fn the_rule_names_each_partition_and_every_script_command() {
        let tags = vec!["{dq:orders:p0of2~3}".to_owned(), "{dq:orders:p1of2~0}".to_owned()];
        let channels: Vec<String> = tags.iter().map(|t| format!("{t}:wake")).collect();
        let words = rule_words("app", &Layout::Native, &tags, &channels, &[], true, ScriptRights::Load);
        let line = words.join(" ");
        assert!(
            line.starts_with(
                "app on >PASSWORD resetkeys ~{dq:orders:p0of2~3}:* ~{dq:orders:p1of2~0}:* resetchannels \
                 &{dq:orders:p0of2~3}:wake &{dq:orders:p1of2~0}:wake -@all "
            ),
            "{line}"
        );
        for s in scripts::all() {
            for c in &s.commands {
                assert!(
                    words.contains(&format!("+{}", c.to_ascii_lowercase())),
                    "{c} of {}",
                    s.name
                );
            }
        }
        assert!(words.contains(&"+evalsha".to_owned()) && words.contains(&"+script|load".to_owned()));
        let old = rule_words("app", &Layout::Native, &tags, &channels, &[], false, ScriptRights::Load).join(" ");
        let with = |rights| rule_words("app", &Layout::Native, &tags, &channels, &[], true, rights);
        let strict = with(ScriptRights::Preloaded);
        assert!(strict.contains(&"+evalsha".to_owned()) && !strict.contains(&"+script|load".to_owned()));
        let functions = with(ScriptRights::Functions);
        assert!(
            functions.contains(&"+fcall".to_owned())
                && !functions.contains(&"+evalsha".to_owned())
                && !functions.contains(&"+script|load".to_owned()),
            "{functions:?}"
        );
        assert!(!old.contains("channels") && !old.contains('&'), "{old}");
    }

    #[test]
    fn the_seed_layout_grants_the_recipes_keys() {
        let words = rule_words(
            "app",
            &Layout::seed(),
            &[],
            &["delay_queue:zset:wake".into()],
            &[],
            true,
            ScriptRights::Load,
        );
        let line = words.join(" ");
        assert!(
            line.contains(
                "~delay_queue:zset ~delay_queue:payload ~delay_queue:zset:* resetchannels &delay_queue:zset:wake"
            ),
            "{line}"
        );
    }
}
