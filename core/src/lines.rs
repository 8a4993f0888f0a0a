//! Serial keys and groups as the scripts store them (`lua/include/serial.lua`): a
//! serial key as given, a group's name after a mark no serial key holds (keys have
//! no control character). The two share the scripts' lines and holders.

use std::borrow::Cow;

/// The first character of a group's stored key.
pub(crate) const GROUP_MARK: char = '\u{1}';

/// What the scripts store for a serial key or a group.
pub(crate) fn encode<'a>(serial_key: Option<&'a str>, group: Option<&str>) -> Option<Cow<'a, str>> {
    match (serial_key, group) {
        (Some(key), _) => Some(key.into()),
        (None, Some(group)) => Some(group_key(group).into()),
        (None, None) => None,
    }
}

/// A group's stored key; the default for every group is the mark alone.
pub(crate) fn group_key(group: &str) -> String {
    format!("{GROUP_MARK}{group}")
}

/// A stored key as (serial key, group).
pub(crate) fn decode(stored: String) -> (Option<String>, Option<String>) {
    match stored.strip_prefix(GROUP_MARK) {
        Some(group) => (None, Some(group.to_owned())),
        None => (Some(stored), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_and_a_serial_key_of_one_name_are_stored_apart() {
        let key = encode(Some("order-1"), None).expect("key");
        let group = encode(None, Some("order-1")).expect("group");
        assert_ne!(key, group);
        assert_eq!(decode(key.into_owned()), (Some("order-1".to_owned()), None));
        assert_eq!(decode(group.into_owned()), (None, Some("order-1".to_owned())));
        assert_eq!(encode(None, None), None);
    }
}
