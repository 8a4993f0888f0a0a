//! What an error message says of a PHP value: its type as PHP names it in a
//! TypeError (`type_name`), and a string's bytes as UTF-8 or, when they are not,
//! shown escaped with the offset of the first invalid one (`utf8`).

use std::fmt::Write as _;

use ext_php_rs::flags::DataType;
use ext_php_rs::types::Zval;

pub(crate) fn type_name(value: &Zval) -> String {
    match value.get_type() {
        DataType::Object(_) => value
            .object()
            .and_then(|o| o.get_class_name().ok())
            .unwrap_or_else(|| "object".into()),
        DataType::Long => "int".into(),
        DataType::Double => "float".into(),
        DataType::True | DataType::False | DataType::Bool => "bool".into(),
        DataType::Null => "null".into(),
        other => other.to_string().to_lowercase(),
    }
}

/// A string's bytes as UTF-8, or the error naming it.
pub(crate) fn utf8(bytes: &[u8]) -> Result<&str, Invalid> {
    std::str::from_utf8(bytes).map_err(|e| Invalid {
        shown: escaped(bytes),
        at: e.valid_up_to(),
    })
}

/// Bytes that are not valid UTF-8, shown for a message.
pub(crate) struct Invalid {
    pub(crate) shown: String,
    pub(crate) at: usize,
}

/// `bytes` for a message: valid text as is (escaped like Rust's `{:?}`), every invalid
/// byte as `\xNN`.
fn escaped(bytes: &[u8]) -> String {
    let mut shown = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        shown.extend(chunk.valid().chars().flat_map(char::escape_debug));
        for b in chunk.invalid() {
            let _ = write!(shown, "\\x{b:02x}");
        }
    }
    shown
}
