//! Payload JSON text on its way in, and the one writer the bindings drive.
//!
//! A push stores a payload's JSON text byte for byte, so the text must be one JSON value
//! within the limits every language can read back: nesting at most `MAX_DEPTH`, finite
//! numbers, integers within 64 signed bits. Text from outside (`push_json`, a serde
//! value, a stored message moved to another queue) is checked once, at push.
//! `PayloadWriter` writes text that needs no check: a binding walks its language's
//! values and calls it, and the writer enforces the same limits as it goes, so the
//! values are walked once and the text is never read again before Redis.

use crate::envelope::{self, MAX_DEPTH};
use crate::error::{Error, Result};

/// A payload's JSON text, and whether it is known to be valid.
#[derive(Debug, Clone)]
pub struct PayloadJson {
    text: String,
    /// Written by `PayloadWriter`, or checked already: push checks only its size.
    valid: bool,
}

impl PayloadJson {
    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The JSON text, owned.
    pub fn into_string(self) -> String {
        self.text
    }

    /// Text that `validate_payload` has accepted.
    pub(crate) fn checked(text: String) -> Self {
        Self { text, valid: true }
    }

    /// Check what is not known yet: the size always (a queue's limit), the rest unless
    /// the writer wrote it or it was checked before.
    pub(crate) fn validate(&self, max_bytes: usize) -> Result<()> {
        if self.valid {
            envelope::check_size(&self.text, max_bytes)
        } else {
            envelope::validate_payload(&self.text, max_bytes)
        }
    }
}

/// Equal texts are equal payloads, however each was made.
impl PartialEq for PayloadJson {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for PayloadJson {}

/// Text from outside: checked at push.
impl From<String> for PayloadJson {
    fn from(text: String) -> Self {
        Self { text, valid: false }
    }
}

/// Text from outside: checked at push.
impl From<&str> for PayloadJson {
    fn from(text: &str) -> Self {
        text.to_owned().into()
    }
}

/// Text from outside: checked at push.
impl From<&String> for PayloadJson {
    fn from(text: &String) -> Self {
        text.clone().into()
    }
}

impl std::ops::Deref for PayloadJson {
    type Target = str;

    fn deref(&self) -> &str {
        &self.text
    }
}

/// Why a value could not be written. The binding knows where the value is and passes
/// that path (`$payload["a"][0]`, `payload['a'][0]`) to `message`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PayloadFault {
    /// One more level of nesting than `MAX_DEPTH` (or a value that contains itself).
    TooDeep,
    /// NaN or an infinity.
    NotFinite(f64),
}

impl PayloadFault {
    /// The error text for the value at `path`.
    pub fn message(&self, path: &str) -> String {
        match self {
            Self::TooDeep => format!(
                "{path} is nested deeper than {MAX_DEPTH} levels (or contains itself); the limit is {MAX_DEPTH}, so that every consumer language can decode it"
            ),
            Self::NotFinite(f) => format!("{path} is {f}, which JSON cannot represent"),
        }
    }
}

/// Writes one JSON value as a binding walks its language's value: scalars, and lists
/// and objects opened and closed around their items. Strings are escaped as serde_json
/// does, floats written as serde_json writes them (ryu, `.0` on a whole number).
///
/// The writer keeps the structure itself (commas, colons, which container is open), so
/// a binding cannot make it pass off text that is not JSON: a call out of place (a key
/// in a list, a close that does not match) leaves the text unchecked, and push checks it
/// in full as it checks text from outside.
#[derive(Debug)]
pub struct PayloadWriter {
    out: String,
    /// The open containers, innermost last.
    open: Open,
    /// Levels of the binding's own that write nothing (see `enter`).
    entered: usize,
    /// A value was written at this level: the next one needs a comma.
    comma: bool,
    /// In an object, a key was written and its value not yet.
    after_key: bool,
    /// Whole values written at the top.
    roots: u32,
    misused: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    List,
    Object,
}

/// The open containers as bits, one a level (set: an object): a payload is written
/// without a heap allocation for them, as `MAX_DEPTH` levels fit in one word.
#[derive(Debug, Default)]
struct Open {
    objects: u128,
    depth: usize,
}

const _: () = assert!(MAX_DEPTH <= u128::BITS as usize);

impl Open {
    fn push(&mut self, c: Container) {
        let bit = 1u128 << self.depth;
        match c {
            Container::Object => self.objects |= bit,
            Container::List => self.objects &= !bit,
        }
        self.depth += 1;
    }

    fn pop(&mut self) -> Option<Container> {
        let last = self.last()?;
        self.depth -= 1;
        Some(last)
    }

    fn last(&self) -> Option<Container> {
        let top = self.depth.checked_sub(1)?;
        Some(if self.objects >> top & 1 == 1 {
            Container::Object
        } else {
            Container::List
        })
    }

    fn is_empty(&self) -> bool {
        self.depth == 0
    }
}

impl Default for PayloadWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl PayloadWriter {
    /// A writer with nothing written.
    pub fn new() -> Self {
        Self {
            out: String::with_capacity(64),
            open: Open::default(),
            entered: 0,
            comma: false,
            after_key: false,
            roots: 0,
            misused: false,
        }
    }

    /// The text written, valid unless the writer was misused.
    pub fn finish(self) -> PayloadJson {
        debug_assert!(self.is_whole(), "a payload writer was misused: {self:?}");
        self.into_payload()
    }

    /// One whole value, every container closed, every call in its place.
    fn is_whole(&self) -> bool {
        !self.misused && self.open.is_empty() && self.entered == 0 && self.roots == 1
    }

    fn into_payload(self) -> PayloadJson {
        PayloadJson {
            valid: self.is_whole(),
            text: self.out,
        }
    }

    /// `null`.
    pub fn null(&mut self) {
        self.scalar("null");
    }

    /// `true` or `false`.
    pub fn bool(&mut self, b: bool) {
        self.scalar(if b { "true" } else { "false" });
    }

    /// An integer: 64 signed bits, which every consumer language reads exactly.
    pub fn int(&mut self, n: i64) {
        self.scalar(itoa::Buffer::new().format(n));
    }

    /// A finite float; NaN and the infinities are refused.
    pub fn float(&mut self, f: f64) -> std::result::Result<(), PayloadFault> {
        if !f.is_finite() {
            return Err(PayloadFault::NotFinite(f));
        }
        self.before_value();
        // SAFETY: serde_json writes a number in ASCII: `out` stays UTF-8.
        let _ = serde_json::to_writer(unsafe { self.out.as_mut_vec() }, &f);
        self.after_value();
        Ok(())
    }

    /// A string (a `&str` is UTF-8: a binding turns its bytes into one first).
    pub fn str(&mut self, s: &str) {
        self.before_value();
        self.push_str_escaped(s);
        self.after_value();
    }

    /// Open a list; refused one level past `MAX_DEPTH`.
    pub fn begin_list(&mut self) -> std::result::Result<(), PayloadFault> {
        self.begin(Container::List)
    }

    /// Close the open list.
    pub fn end_list(&mut self) {
        self.end(Container::List);
    }

    /// Open an object; refused one level past `MAX_DEPTH`.
    pub fn begin_object(&mut self) -> std::result::Result<(), PayloadFault> {
        self.begin(Container::Object)
    }

    /// The key of the next value in the open object.
    pub fn key(&mut self, k: &str) {
        if self.open.last() != Some(Container::Object) || self.after_key {
            self.misused = true;
        }
        if self.comma {
            self.out.push(',');
        }
        self.push_str_escaped(k);
        self.out.push(':');
        self.comma = false;
        self.after_key = true;
    }

    /// Close the open object.
    pub fn end_object(&mut self) {
        self.end(Container::Object);
    }

    /// A level of the binding's own that writes nothing (PHP's `jsonSerialize()`
    /// returning another value). It does not deepen the text, but such levels in a row
    /// are held to the same limit, so that a value whose conversion never ends (an
    /// object that returns itself) is refused as too deep. Close it with `leave`.
    pub fn enter(&mut self) -> std::result::Result<(), PayloadFault> {
        if self.entered >= MAX_DEPTH {
            return Err(PayloadFault::TooDeep);
        }
        self.entered += 1;
        Ok(())
    }

    /// Close the level `enter` opened.
    pub fn leave(&mut self) {
        match self.entered.checked_sub(1) {
            Some(n) => self.entered = n,
            None => self.misused = true,
        }
    }

    fn scalar(&mut self, text: &str) {
        self.before_value();
        self.out.push_str(text);
        self.after_value();
    }

    fn begin(&mut self, container: Container) -> std::result::Result<(), PayloadFault> {
        if self.open.depth >= MAX_DEPTH {
            return Err(PayloadFault::TooDeep);
        }
        self.before_value();
        self.out.push(match container {
            Container::List => '[',
            Container::Object => '{',
        });
        self.open.push(container);
        self.comma = false;
        self.after_key = false;
        Ok(())
    }

    fn end(&mut self, container: Container) {
        if self.open.pop() != Some(container) || self.after_key {
            self.misused = true;
        }
        self.out.push(match container {
            Container::List => ']',
            Container::Object => '}',
        });
        self.after_value();
    }

    fn before_value(&mut self) {
        match self.open.last() {
            None => self.misused |= self.roots > 0,
            Some(Container::List) => {
                if self.comma {
                    self.out.push(',');
                }
            }
            Some(Container::Object) => self.misused |= !self.after_key,
        }
    }

    fn after_value(&mut self) {
        self.comma = true;
        self.after_key = false;
        if self.open.is_empty() {
            self.roots += 1;
        }
    }

    fn push_str_escaped(&mut self, s: &str) {
        // SAFETY: serde_json writes a &str escaped, which is UTF-8: `out` stays UTF-8.
        let _ = serde_json::to_writer(unsafe { self.out.as_mut_vec() }, s);
    }
}

/// A serde value's text (`Queue::push`): serde writes JSON, but neither limits its
/// depth nor keeps integers within 64 signed bits, so push checks it.
pub(crate) fn to_json<T: serde::Serialize + ?Sized>(payload: &T) -> Result<PayloadJson> {
    serde_json::to_string(payload)
        .map(PayloadJson::from)
        .map_err(|e| Error::PayloadNotSerializable(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(f: impl FnOnce(&mut PayloadWriter) -> std::result::Result<(), PayloadFault>) -> PayloadJson {
        let mut w = PayloadWriter::new();
        f(&mut w).expect("writes");
        w.finish()
    }

    #[test]
    fn writes_what_serde_json_writes_and_marks_it_valid() {
        let p = written(|w| {
            w.begin_object()?;
            w.key("a");
            w.begin_list()?;
            w.int(i64::MIN);
            w.float(1.0)?;
            w.float(-0.5e-300)?;
            w.str("é\"\\\n\u{1}");
            w.null();
            w.bool(true);
            w.begin_object()?;
            w.end_object();
            w.begin_list()?;
            w.end_list();
            w.end_list();
            w.key("");
            w.bool(false);
            w.end_object();
            Ok(())
        });
        let expected =
            serde_json::json!({"a": [i64::MIN, 1.0, -0.5e-300, "é\"\\\n\u{1}", null, true, {}, []], "": false});
        assert_eq!(p.as_str(), serde_json::to_string(&expected).expect("json"));
        assert!(p.valid);
        assert!(envelope::validate_payload(p.as_str(), 1 << 20).is_ok());
    }

    /// `value` through the writer, as a binding walks its own values.
    fn write_value(w: &mut PayloadWriter, value: &serde_json::Value) -> std::result::Result<(), PayloadFault> {
        use serde_json::Value;
        match value {
            Value::Null => w.null(),
            Value::Bool(b) => w.bool(*b),
            Value::Number(n) => match n.as_i64() {
                Some(i) => w.int(i),
                None => w.float(n.as_f64().expect("a float"))?,
            },
            Value::String(s) => w.str(s),
            Value::Array(items) => {
                w.begin_list()?;
                for item in items {
                    write_value(w, item)?;
                }
                w.end_list();
            }
            Value::Object(map) => {
                w.begin_object()?;
                for (k, v) in map {
                    w.key(k);
                    write_value(w, v)?;
                }
                w.end_object();
            }
        }
        Ok(())
    }

    /// A value of every JSON kind, up to `depth` deep, from a small deterministic
    /// generator (xorshift): strings with escapes and non-ASCII text, integers at
    /// their bounds, floats large and small.
    fn random_value(state: &mut u64, depth: u32) -> serde_json::Value {
        use serde_json::{Map, Value, json};
        fn next(state: &mut u64) -> u64 {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            *state
        }
        const TEXTS: [&str; 8] = [
            "",
            "plain",
            "del \u{7f} and \u{1f}",
            "a\"b\\c",
            "line\nbreak\t\u{1}",
            "日本語 ✓",
            "\u{1F600} emoji",
            "/slash",
        ];
        match next(state) % if depth == 0 { 5 } else { 7 } {
            0 => Value::Null,
            1 => Value::Bool(next(state).is_multiple_of(2)),
            2 => Value::from([i64::MIN, i64::MAX, 0, -1][(next(state) % 4) as usize]),
            3 => {
                let mantissa = (next(state) % 2_000_000) as f64 - 1_000_000.0;
                let exponent = (next(state) % 40) as i32 - 20;
                json!(mantissa * 10f64.powi(exponent) + 0.5)
            }
            4 => Value::String(TEXTS[(next(state) % TEXTS.len() as u64) as usize].to_owned()),
            5 => Value::Array((0..next(state) % 4).map(|_| random_value(state, depth - 1)).collect()),
            _ => {
                let mut map = Map::new();
                for i in 0..next(state) % 4 {
                    let key = format!("{}{i}", TEXTS[(next(state) % TEXTS.len() as u64) as usize]);
                    map.insert(key, random_value(state, depth - 1));
                }
                Value::Object(map)
            }
        }
    }

    #[test]
    fn random_values_are_written_as_serde_json_writes_them() {
        let mut state = 0x2545_f491_4f6c_dd1d;
        for round in 0..2_000 {
            let value = random_value(&mut state, 5);
            let mut w = PayloadWriter::new();
            write_value(&mut w, &value).expect("writes");
            let p = w.finish();
            let expected = serde_json::to_string(&value).expect("json");
            assert_eq!(p.as_str(), expected, "round {round}");
            assert!(
                p.valid && envelope::validate_payload(p.as_str(), 1 << 20).is_ok(),
                "round {round}"
            );
        }
    }

    #[test]
    fn a_scalar_alone_is_a_payload() {
        let p = written(|w| w.float(2.5));
        assert_eq!((p.as_str(), p.valid), ("2.5", true));
    }

    #[test]
    fn nesting_stops_at_the_limit_that_push_checks() {
        let mut w = PayloadWriter::new();
        for _ in 0..MAX_DEPTH {
            w.begin_list().expect("within the limit");
        }
        assert_eq!(w.begin_list(), Err(PayloadFault::TooDeep));
        assert_eq!(w.begin_object(), Err(PayloadFault::TooDeep));
        for _ in 0..MAX_DEPTH {
            w.end_list();
        }
        let p = w.finish();
        assert!(p.valid);
        // The deepest text the writer gives is the deepest push takes, and one more
        // level is refused by both.
        assert!(envelope::validate_payload(p.as_str(), 1 << 20).is_ok());
        let deeper = format!("[{}]", p.as_str());
        assert!(envelope::validate_payload(&deeper, 1 << 20).is_err());
    }

    #[test]
    fn levels_that_write_nothing_have_a_limit_of_their_own() {
        let mut w = PayloadWriter::new();
        for _ in 0..MAX_DEPTH {
            w.enter().expect("within the limit");
        }
        assert_eq!(w.enter(), Err(PayloadFault::TooDeep));
        // They do not deepen the text: the text may still be as deep as any.
        for _ in 0..MAX_DEPTH {
            w.begin_list().expect("within the limit");
        }
        assert_eq!(w.begin_list(), Err(PayloadFault::TooDeep));
        for _ in 0..MAX_DEPTH {
            w.end_list();
            w.leave();
        }
        assert!(w.finish().valid);
    }

    #[test]
    fn nan_and_infinities_are_refused_and_named() {
        let mut w = PayloadWriter::new();
        for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let fault = w.float(f).expect_err("not finite");
            assert!(fault.message("payload[0]").starts_with("payload[0] is "), "{fault:?}");
        }
        assert_eq!(
            PayloadFault::NotFinite(f64::INFINITY).message("$payload"),
            "$payload is inf, which JSON cannot represent"
        );
        assert_eq!(
            PayloadFault::TooDeep.message("$payload[0]"),
            format!(
                "$payload[0] is nested deeper than {MAX_DEPTH} levels (or contains itself); the limit is {MAX_DEPTH}, so that every consumer language can decode it"
            )
        );
    }

    #[test]
    fn a_misused_writer_gives_text_that_push_checks_in_full() {
        type Misuse = fn(&mut PayloadWriter);
        let cases: [(&str, Misuse); 8] = [
            ("nothing", |_| {}),
            ("two values", |w| {
                w.null();
                w.null();
            }),
            ("an unclosed list", |w| {
                let _ = w.begin_list();
            }),
            ("a value with no key", |w| {
                let _ = w.begin_object();
                w.int(1);
                w.end_object();
            }),
            ("a key with no value", |w| {
                let _ = w.begin_object();
                w.key("a");
                w.end_object();
            }),
            ("a key in a list", |w| {
                let _ = w.begin_list();
                w.key("a");
                w.int(1);
                w.end_list();
            }),
            ("a close that does not match", |w| {
                let _ = w.begin_list();
                w.end_object();
            }),
            ("a leave with no enter", |w| {
                w.null();
                w.leave();
            }),
        ];
        for (what, misuse) in cases {
            let mut w = PayloadWriter::new();
            misuse(&mut w);
            // finish() asserts in debug builds; what a release build gives is this.
            let p = w.into_payload();
            assert!(!p.valid, "{what}: {:?} taken as valid", p.as_str());
        }
    }

    #[test]
    fn outside_text_is_checked_and_written_text_only_measured() {
        assert!(PayloadJson::from("{oops").validate(100).is_err());
        assert!(PayloadJson::from("[1]").validate(100).is_ok());
        let p = written(|w| {
            w.str("long");
            Ok(())
        });
        let err = p.validate(3).expect_err("too large").to_string();
        assert!(err.contains('6'), "{err}");
    }
}
