//! Where a queue lives in Redis. Every key of one queue shares one hash tag, so each
//! script touches a single slot and the queue runs unchanged on Redis Cluster.

use crate::error::{Error, Result};

/// How messages are laid out in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// delayq's own keys under the `{prefix:queue}` hash tag.
    Native,
    /// The hand-made recipe's keys: a ZSET scored by due time in whole seconds and a
    /// HASH id -> payload JSON. Leases, attempts, errors and dead letters live in extra
    /// keys named after the ZSET (`<zset_key>:inflight`, ...), which the recipe ignores.
    Seed {
        /// The ZSET of ids by due second (the recipe's `delay_queue:zset`).
        zset_key: String,
        /// The HASH of id -> payload JSON (the recipe's `delay_queue:payload`).
        payload_key: String,
    },
}

impl Layout {
    /// The recipe's own key names.
    pub fn seed() -> Self {
        Self::Seed {
            zset_key: "delay_queue:zset".to_owned(),
            payload_key: "delay_queue:payload".to_owned(),
        }
    }

    pub(crate) fn script_name(&self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Seed { .. } => "seed",
        }
    }

    /// The due time (Unix ms) that a schedule score stands for; mirrors `due_of` in
    /// include/base.lua (native scores keep a sequence number in their low 12 bits).
    pub(crate) fn due_ms_of_score(&self, score: f64) -> i64 {
        match self {
            Self::Native => (score / SEQ_SPAN as f64).floor() as i64,
            Self::Seed { .. } => (score * 1000.0) as i64,
        }
    }
}

/// Places in one millisecond of native scores: include/base.lua's `SEQ_SPAN`.
pub(crate) const SEQ_SPAN: u64 = 4096;

/// The schedule score in a lease string "<token>:<score>" (see include/base.lua): the
/// score the message was claimed at, which gives its due time. `None` when malformed.
pub(crate) fn lease_score(lease: &str) -> Option<f64> {
    let (token, score) = lease.split_once(':')?;
    if token.is_empty() || score.contains(':') {
        return None;
    }
    score.parse().ok()
}

/// The key names of one queue, in the order of `scripts::ROLES`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) all: [String; 2 + SUFFIXES.len()],
    pub(crate) wake_channel: String,
}

pub(crate) const MAX_NAME_BYTES: usize = 200;

pub(crate) fn validate_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid(what, "must not be empty"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::invalid(
            what,
            format!("is {} bytes, the limit is {MAX_NAME_BYTES}", name.len()),
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_control() || c.is_whitespace() || *c == '{' || *c == '}')
    {
        return Err(Error::invalid(
            what,
            format!(
                "{name:?} contains {c:?}; braces would break the hash tag, blanks and control characters are refused"
            ),
        ));
    }
    if name.contains('~') {
        return Err(Error::invalid(
            what,
            format!(
                "{name:?} contains '~', which only partition tags hold (prefix:queue:p<i>of<n>~<salt>): \
                 a queue named so could share another queue's partition keys"
            ),
        ));
    }
    Ok(())
}

/// Redis Cluster's hash slot of a hash tag's content (CRC16/XMODEM mod 16384).
pub(crate) fn slot_of(tag: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % SLOTS
}

const SLOTS: u16 = 16384;

/// Most partitions one queue may have.
pub const MAX_PARTITIONS: u32 = 1024;

/// The hash tag contents of each partition of queue `queue`.
///
/// One partition keeps the plain `prefix:queue` tag, so a queue keeps its keys when it
/// has never been partitioned. With `n` > 1, partition `i` gets the tag
/// `prefix:queue:p<i>of<n>~<salt>` with the smallest salt whose slot falls in the
/// middle half of the `i`-th of `n` equal slot ranges. `redis-cli --cluster create`
/// gives each master one contiguous, equal range, so `n` partitions on `n` masters (or
/// a multiple of them) land on different masters. Every language computes the same
/// tags, since only this function names them.
pub(crate) fn partition_tags(prefix: &str, queue: &str, n: u32) -> Vec<String> {
    if n <= 1 {
        return vec![format!("{prefix}:{queue}")];
    }
    let width = f64::from(SLOTS) / f64::from(n);
    (0..n)
        .map(|i| {
            let lo = (f64::from(i) + 0.25) * width;
            let hi = (f64::from(i) + 0.75) * width;
            (0u32..)
                .map(|salt| format!("{prefix}:{queue}:p{i}of{n}~{salt}"))
                .find(|tag| {
                    let slot = f64::from(slot_of(tag));
                    slot >= lo.floor() && slot < hi.ceil()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// The partition (of `n`) that a message with this id, or this caller's partition
/// key, belongs to: FNV-1a, the same in every process and language.
pub(crate) fn partition_of(key: &str, n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (hash % n as u64) as usize
}

/// The names after the first two keys (the schedule and the messages), in the order
/// of `scripts::ROLES`; native keys put them after the hash tag, the seed layout after
/// the recipe's ZSET name.
const SUFFIXES: [&str; 26] = [
    "inflight",
    "leases",
    "attempts",
    "errors",
    "dead",
    "stats",
    "seq",
    "workers",
    "paused",
    "repeats",
    "repeat_marks",
    "limit",
    "limit_log",
    "control",
    "completed",
    "completed_messages",
    "traces",
    "serial_keys",
    "serial_holders",
    "serial_line",
    "serial_lined",
    "minutes",
    "claims",
    "claim_ids",
    "quarantine",
    "group_grants",
];

impl Keys {
    /// The keys of a queue (native layout: of one partition, given its hash tag).
    pub(crate) fn new(tag: &str, queue: &str, layout: &Layout) -> Result<Self> {
        validate_name("queue name", queue)?;
        let (base, scheduled, messages) = match layout {
            Layout::Native => {
                let base = format!("{{{tag}}}");
                let (scheduled, messages) = (format!("{base}:scheduled"), format!("{base}:messages"));
                (base, scheduled, messages)
            }
            Layout::Seed { zset_key, payload_key } => {
                for (what, name) in [("zset_key", zset_key), ("payload_key", payload_key)] {
                    if name.is_empty() || name.len() > MAX_NAME_BYTES {
                        return Err(Error::invalid(what, format!("must be 1 to {MAX_NAME_BYTES} bytes")));
                    }
                }
                (zset_key.clone(), zset_key.clone(), payload_key.clone())
            }
        };
        let mut firsts = [scheduled, messages].into_iter();
        let all = std::array::from_fn(|i| match firsts.next() {
            Some(first) => first,
            None => format!("{base}:{}", SUFFIXES[i - 2]),
        });
        Ok(Self {
            all,
            wake_channel: format!("{base}:wake"),
        })
    }

    #[cfg(test)]
    pub(crate) fn scheduled(&self) -> &str {
        &self.all[0]
    }
    /// The messages hash (the seed layout's payload hash).
    pub(crate) fn messages(&self) -> &str {
        &self.all[1]
    }
    #[cfg(test)]
    pub(crate) fn inflight(&self) -> &str {
        &self.all[2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_keys_share_one_hash_tag() {
        let keys = Keys::new("dq:orders", "orders", &Layout::Native).expect("valid names");
        for key in keys.all.iter().chain([&keys.wake_channel]) {
            assert!(key.starts_with("{dq:orders}:"), "{key}");
        }
    }

    /// The scripts receive keys by role (scripts::ROLES); each role must be the key
    /// the crate writes at its index.
    #[test]
    fn the_script_roles_are_the_keys_the_crate_writes() {
        let keys = Keys::new("dq:orders", "orders", &Layout::Native).expect("valid names");
        let written: Vec<&str> = keys.all.iter().map(|k| k.trim_start_matches("{dq:orders}:")).collect();
        let roles: Vec<&str> = crate::scripts::ROLES.iter().map(|r| r.name).collect();
        assert_eq!(written, roles);
    }

    #[test]
    fn names_that_could_be_a_partition_tag_are_refused() {
        let tags = partition_tags("dq", "orders", 3);
        let plain = tags[0].trim_start_matches("dq:");
        let err = validate_name("queue name", plain).expect_err("refused").to_string();
        assert!(err.contains("contains '~'") && err.contains("queue name"), "{err}");
        assert!(validate_name("prefix", "dq~x").is_err());
        assert!(validate_name("queue name", "orders:payouts").is_ok());
    }

    #[test]
    fn seed_keys_are_the_recipes() {
        let keys = Keys::new("dq", "ignored", &Layout::seed()).expect("valid names");
        assert_eq!(keys.scheduled(), "delay_queue:zset");
        assert_eq!(keys.messages(), "delay_queue:payload");
        assert_eq!(keys.inflight(), "delay_queue:zset:inflight");
    }

    #[test]
    fn leases_give_the_due_time_per_layout() {
        let due_ms_of_lease = |layout: &Layout, lease: &str| lease_score(lease).map(|s| layout.due_ms_of_score(s));
        // 1_764_460_800_123 ms with sequence 7 in the low 12 bits.
        let native = format!("42:{}", 1_764_460_800_123_f64 * 4096.0 + 7.0);
        assert_eq!(due_ms_of_lease(&Layout::Native, &native), Some(1_764_460_800_123));
        assert_eq!(
            due_ms_of_lease(&Layout::seed(), "42:1764460801"),
            Some(1_764_460_801_000)
        );
        // Redis may print a large score in exponent form.
        assert_eq!(
            due_ms_of_lease(&Layout::Native, "1:7.2272307e+15"),
            Some(1_764_460_620_117)
        );
        for bad in ["", "1", ":2", "1:x", "1.1:2:3", "1:2:3"] {
            assert_eq!(due_ms_of_lease(&Layout::Native, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn names_that_break_the_hash_tag_are_refused() {
        let err = Keys::new("dq:a}b", "a}b", &Layout::Native).expect_err("brace");
        assert!(err.to_string().contains("queue name"), "{err}");
        assert!(Keys::new("dq:", "", &Layout::Native).is_err());
        assert!(Keys::new("dq:has space", "has space", &Layout::Native).is_err());
    }

    #[test]
    fn slots_are_redis_clusters() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("dq:orders"), slot_of("dq:orders"));
        assert_eq!(slot_of("123456789"), 12739);
    }

    #[test]
    fn one_partition_keeps_the_plain_tag() {
        assert_eq!(partition_tags("dq", "orders", 1), ["dq:orders"]);
    }

    #[test]
    fn partitions_spread_over_equal_slot_ranges() {
        for n in [2u32, 3, 6, 16, MAX_PARTITIONS] {
            let tags = partition_tags("dq", "orders", n);
            assert_eq!(tags.len(), n as usize);
            let width = 16384.0 / f64::from(n);
            for (i, tag) in tags.iter().enumerate() {
                assert!(tag.starts_with(&format!("dq:orders:p{i}of{n}~")), "{tag}");
                let range = (f64::from(slot_of(tag)) / width).floor() as usize;
                assert_eq!(range, i, "{tag} is in slot {} of range {range}", slot_of(tag));
            }
        }
        // Three partitions on three masters made by `redis-cli --cluster create`
        // (slots 0-5460, 5461-10922, 10923-16383): one on each.
        let masters: Vec<usize> = partition_tags("dq", "q", 3)
            .iter()
            .map(|t| match slot_of(t) {
                0..=5460 => 0,
                5461..=10922 => 1,
                _ => 2,
            })
            .collect();
        assert_eq!(masters, [0, 1, 2]);
    }

    #[test]
    fn partition_choice_is_stable_and_spread() {
        assert_eq!(partition_of("anything", 1), 0);
        assert_eq!(partition_of("order-42", 8), partition_of("order-42", 8));
        let mut counts = [0usize; 4];
        for i in 0..4000 {
            counts[partition_of(&format!("0190a5b2-{i:04}"), 4)] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
    }
}
