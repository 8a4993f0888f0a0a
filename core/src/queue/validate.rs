//! Checks of caller input before anything is written: ids, serial keys, repeat
//! names, per-push attempts and expiry, against the queue's layout.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::keys::Layout;
use crate::time::MAX_DELAY;

/// Longest caller-supplied id.
pub const MAX_ID_BYTES: usize = 200;

pub(super) fn validate_id(id: &str) -> Result<()> {
    validate_key("id", id)
}

/// A serial key is enforced within one partition: it picks the partition, and a
/// partition key beside it must not pick another.
pub(super) fn validate_serial_key(layout: &Layout, key: &str, partition_key: Option<&str>) -> Result<()> {
    validate_key("serial_key", key)?;
    if matches!(layout, Layout::Seed { .. }) {
        return Err(Error::invalid(
            "serial_key",
            "is not available in the seed layout (the recipe's own consumers would not respect it)",
        ));
    }
    if partition_key.is_some_and(|p| p != key) {
        return Err(Error::invalid(
            "partition_key",
            "differs from serial_key, which picks the partition: messages of one serial key must share one",
        ));
    }
    Ok(())
}

/// A group, like a serial key, lives in one partition, which it picks.
pub(super) fn validate_group(layout: &Layout, group: &str, options: &crate::PushOptions) -> Result<()> {
    validate_key("group", group)?;
    if matches!(layout, Layout::Seed { .. }) {
        return Err(Error::invalid(
            "group",
            "is not available in the seed layout (the recipe's own consumers would not respect it)",
        ));
    }
    if options.serial_key.is_some() {
        return Err(Error::invalid(
            "group",
            "and serial_key were both given: a serial key is a group of limit 1, give one of them",
        ));
    }
    if options.partition_key.as_deref().is_some_and(|p| p != group) {
        return Err(Error::invalid(
            "partition_key",
            "differs from group, which picks the partition: messages of one group must share one",
        ));
    }
    Ok(())
}

pub(super) fn validate_key(what: &str, id: &str) -> Result<()> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(Error::invalid(
            what,
            format!("must be 1 to {MAX_ID_BYTES} bytes, got {}", id.len()),
        ));
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(
            what,
            format!("{id:?} contains the control character {c:?}"),
        ));
    }
    Ok(())
}

pub(super) fn validate_repeat_name(name: &str) -> Result<()> {
    // The occurrence ids ("repeat:<name>:<due_ms>") must stay within the id limit.
    const ROOM: usize = MAX_ID_BYTES - "repeat::".len() - 20;
    if name.is_empty() || name.len() > ROOM || name.chars().any(char::is_control) {
        return Err(Error::invalid(
            "repeat name",
            format!("must be 1 to {ROOM} bytes without control characters, got {name:?}"),
        ));
    }
    Ok(())
}

/// A message's own `max_attempts` lives in its envelope: the seed layout stores the
/// bare payload, so it would be dropped without a word.
pub(super) fn validate_max_attempts(layout: &Layout, n: Option<u32>) -> Result<()> {
    match n {
        Some(_) if matches!(layout, Layout::Seed { .. }) => Err(Error::invalid(
            "max_attempts",
            "needs the native layout: the seed layout stores the bare payload, with no room for it \
             (the worker's max_attempts applies)",
        )),
        Some(0) => Err(Error::invalid("max_attempts", "must be at least 1")),
        _ => Ok(()),
    }
}

/// `expire_after` in ms, once checked.
pub(super) fn expire_after_ms(layout: &Layout, expire_after: Option<Duration>) -> Result<Option<u64>> {
    let Some(d) = expire_after else { return Ok(None) };
    if matches!(layout, Layout::Seed { .. }) {
        return Err(Error::invalid(
            "expire_after",
            "needs the native layout: the seed layout stores the bare payload, with no room for a deadline",
        ));
    }
    if d < Duration::from_millis(1) || d > MAX_DELAY {
        return Err(Error::invalid(
            "expire_after",
            format!("must be between 0.001 s and {} s, got {d:?}", MAX_DELAY.as_secs()),
        ));
    }
    Ok(Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
}
