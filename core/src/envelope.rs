//! The stored form of a message. Lua never parses it: the payload's JSON text is kept
//! byte for byte, so 64-bit integers, key order and unicode survive every language.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::keys::Layout;

/// Deepest JSON nesting (arrays and objects within each other) a payload may have:
/// push refuses deeper ones in every language, and every consumer decodes any payload
/// within it (`parse_payload`, `decode_payload`).
pub const MAX_DEPTH: usize = 128;

/// The depth limit, and with `integers` the 64-bit range: a push refuses what PHP and
/// most JSON readers would round, while a delivery decodes what its producer stored
/// (the recipe's own producers, for one, are not held to it).
fn check_shape(json: &str, integers: bool) -> Result<()> {
    check_scanned(json, &scan(json), integers)
}

fn check_scanned(json: &str, shape: &Shape, integers: bool) -> Result<()> {
    if shape.depth > MAX_DEPTH {
        return Err(Error::PayloadNotSerializable(format!(
            "nested {} levels deep, the limit is {MAX_DEPTH} (every consumer language must be able to decode it)",
            shape.depth
        )));
    }
    if integers
        && shape.long_digits
        && let Some((path, literal)) = integer_out_of_range(json)
    {
        return Err(Error::PayloadNotSerializable(format!(
            "{} is {literal}, outside the signed 64-bit range",
            path_for_error(&path)
        )));
    }
    Ok(())
}

/// A payload path as errors show it (`payload["a"][0]`): a path longer than a line keeps
/// its start and its end, where the culprit is, so that a payload nested 128 levels
/// deep (or one that contains itself) does not print a kilobyte of `[0]`.
pub fn path_for_error(path: &str) -> std::borrow::Cow<'_, str> {
    const KEEP: usize = 48;
    if path.len() <= 2 * KEEP + 8 {
        return path.into();
    }
    // Cut between segments ("][") where there is one near the mark, else at a character.
    let bytes = path.as_bytes();
    let mut head = KEEP;
    while !path.is_char_boundary(head) {
        head -= 1;
    }
    if let Some(end) = bytes[..head].iter().rposition(|&b| b == b']') {
        head = end + 1;
    }
    let mut tail = path.len() - KEEP;
    while !path.is_char_boundary(tail) {
        tail += 1;
    }
    if let Some(start) = bytes[tail..].iter().position(|&b| b == b'[') {
        tail += start;
    }
    format!("{}…{}", &path[..head], &path[tail..]).into()
}

/// Decode payload JSON into `T` as every consumer does: any payload push accepted
/// decodes (serde_json's own limit, 128 levels with the envelope around it, is one
/// level short), and a deeper one is refused by the same rule as at push.
pub fn decode_payload<T: serde::de::DeserializeOwned>(json: &str) -> Result<T> {
    decode_payload_with(json, std::marker::PhantomData::<T>)
}

/// Decode payload JSON through `seed`, with the checks of `decode_payload`: for a
/// binding that builds its language's values straight from the text, in one pass, with
/// no tree in between.
pub fn decode_payload_with<'de, S: serde::de::DeserializeSeed<'de>>(json: &'de str, seed: S) -> Result<S::Value> {
    check_shape(json, false)?;
    decode_checked_with(json, seed)
}

/// `decode_payload_with` for JSON whose shape was checked already (a claimed payload).
pub(crate) fn decode_checked_with<'de, S: serde::de::DeserializeSeed<'de>>(
    json: &'de str,
    seed: S,
) -> Result<S::Value> {
    let mut de = serde_json::Deserializer::from_str(json);
    // The depth is bounded above, so recursion is too.
    de.disable_recursion_limit();
    let value = seed
        .deserialize(&mut de)
        .map_err(|e| Error::PayloadNotSerializable(format!("not valid JSON: {e}")))?;
    de.end()
        .map_err(|e| Error::PayloadNotSerializable(format!("not valid JSON: {e}")))?;
    Ok(value)
}

/// Payload JSON as a tree, for the bindings to convert: `decode_payload` into a value.
pub fn parse_payload(json: &str) -> Result<serde_json::Value> {
    decode_payload(json)
}

/// Check that `json` is within a queue's size limit.
pub(crate) fn check_size(json: &str, max_bytes: usize) -> Result<()> {
    if json.len() > max_bytes {
        return Err(Error::PayloadTooLarge {
            size: json.len(),
            max: max_bytes,
        });
    }
    Ok(())
}

/// Check that `json` is one JSON value within the size limit.
pub(crate) fn validate_payload(json: &str, max_bytes: usize) -> Result<()> {
    check_size(json, max_bytes)?;
    // The common payload in one pass; anything it is not sure of goes to serde_json
    // (RawValue checks the syntax without building a tree, but does not limit depth),
    // whose errors are the ones users see.
    if let Some(shape) = quick_shape(json) {
        return check_scanned(json, &shape, true);
    }
    serde_json::from_str::<&RawValue>(json)
        .map_err(|e| Error::PayloadNotSerializable(format!("not valid JSON: {e}")))?;
    check_shape(json, true)
}

/// The shape of `json` in one pass, if it is sure the text is one valid JSON value
/// nested at most `MAX_DEPTH` deep: None for anything else, and for what it does not
/// judge itself (a `\u` escape of a surrogate). It never says yes where serde_json
/// would say no: a None only costs the slower check.
fn quick_shape(json: &str) -> Option<Shape> {
    let mut q = Quick {
        b: json.as_bytes(),
        i: 0,
        depth: 0,
        shape: Shape {
            depth: 0,
            long_digits: false,
        },
    };
    q.value()?;
    q.ws();
    (q.i == q.b.len()).then_some(q.shape)
}

struct Quick<'a> {
    b: &'a [u8],
    i: usize,
    depth: usize,
    shape: Shape,
}

impl Quick<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.ws();
        (self.peek()? == c).then(|| self.i += 1)
    }

    fn value(&mut self) -> Option<()> {
        self.ws();
        match self.peek()? {
            open @ (b'{' | b'[') => {
                let object = open == b'{';
                let close = if object { b'}' } else { b']' };
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return None;
                }
                self.shape.depth = self.shape.depth.max(self.depth);
                self.i += 1;
                self.ws();
                if self.peek()? == close {
                    self.i += 1;
                } else {
                    loop {
                        if object {
                            self.ws();
                            if self.peek()? != b'"' {
                                return None;
                            }
                            self.string()?;
                            self.eat(b':')?;
                        }
                        self.value()?;
                        self.ws();
                        match self.peek()? {
                            b',' => self.i += 1,
                            c if c == close => {
                                self.i += 1;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                self.depth -= 1;
                Some(())
            }
            b'"' => self.string(),
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn word(&mut self, w: &[u8]) -> Option<()> {
        self.b[self.i..].starts_with(w).then(|| self.i += w.len())
    }

    /// A string, from its opening quote. The text is valid UTF-8 already (a `&str`).
    fn string(&mut self) -> Option<()> {
        self.i += 1;
        loop {
            // The plain run first, in one tight loop.
            let plain = self.b[self.i..]
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
            self.i += plain;
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => match self.b.get(self.i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                    b'u' => {
                        let hex = self.b.get(self.i + 2..self.i + 6)?;
                        let code = u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) || (0xD800..=0xDFFF).contains(&code) {
                            return None;
                        }
                        self.i += 6;
                    }
                    _ => return None,
                },
                0..=0x1F => return None,
                _ => self.i += 1,
            }
        }
    }

    /// `-? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => {
                self.i += 1;
                if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    return None;
                }
            }
            b'1'..=b'9' => self.digits()?,
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.digits()?;
        }
        Some(())
    }

    /// `text`, byte for byte (no blanks before it).
    fn exactly(&mut self, text: &[u8]) -> Option<()> {
        self.b[self.i..].starts_with(text).then(|| self.i += text.len())
    }

    /// A JSON integer without a sign that fits in a u64.
    fn unsigned(&mut self) -> Option<u64> {
        digits_value(self.integer(false)?.as_bytes())
    }

    /// A JSON integer that fits in an i64.
    fn signed(&mut self) -> Option<i64> {
        let text = self.integer(true)?.as_bytes();
        match text.strip_prefix(b"-") {
            Some(digits) => 0i64.checked_sub_unsigned(digits_value(digits)?),
            None => i64::try_from(digits_value(text)?).ok(),
        }
    }

    /// The text of a JSON integer (no leading zeros, no "-0"), with a minus if `sign`
    /// allows.
    fn integer(&mut self, sign: bool) -> Option<&str> {
        let start = self.i;
        if sign && self.peek() == Some(b'-') {
            self.i += 1;
        }
        let digits = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        let run = &self.b[digits..self.i];
        // serde_json reads "-0" as a float, which an integer field refuses.
        if run.is_empty() || (run[0] == b'0' && (run.len() > 1 || digits > start)) {
            return None;
        }
        std::str::from_utf8(&self.b[start..self.i]).ok()
    }

    /// One digit or more; a run of 19 or more is what `Shape::long_digits` notes.
    fn digits(&mut self) -> Option<()> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        let run = self.i - start;
        self.shape.long_digits |= run >= 19;
        (run > 0).then_some(())
    }
}

struct Shape {
    /// Deepest array/object nesting.
    depth: usize,
    /// Whether a run of 19 or more digits stands outside strings: only then can an
    /// integer be outside the signed 64-bit range.
    long_digits: bool,
}

/// One pass over syntactically valid JSON text.
fn scan(json: &str) -> Shape {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    let (mut digits, mut long_digits) = (0usize, false);
    for b in json.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        if b.is_ascii_digit() {
            digits += 1;
            long_digits |= digits >= 19;
            continue;
        }
        digits = 0;
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Shape {
        depth: max,
        long_digits,
    }
}

/// The first integer literal outside the signed 64-bit range in valid JSON text of
/// bounded depth: its path (`payload["a"][0]`) and its text.
fn integer_out_of_range(json: &str) -> Option<(String, String)> {
    fn skip_ws(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    }
    /// End of the string starting at `i` (its opening quote), past its closing quote.
    fn string_end(b: &[u8], mut i: usize) -> usize {
        i += 1;
        while b[i] != b'"' {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        i + 1
    }
    /// Walks the value at `i`; returns its end, or the literal found.
    fn value(json: &str, i: usize, path: &mut String) -> std::result::Result<usize, String> {
        let b = json.as_bytes();
        let i = skip_ws(b, i);
        match b[i] {
            b'{' | b'[' => {
                let object = b[i] == b'{';
                let mut at = skip_ws(b, i + 1);
                let mut index = 0usize;
                while b[at] != b'}' && b[at] != b']' {
                    let len = path.len();
                    if object {
                        let end = string_end(b, at);
                        let key: String = serde_json::from_str(&json[at..end]).unwrap_or_default();
                        path.push_str(&format!("[{}]", serde_json::Value::String(key)));
                        at = skip_ws(b, end) + 1; // the colon
                    } else {
                        path.push_str(&format!("[{index}]"));
                    }
                    at = skip_ws(b, value(json, at, path)?);
                    path.truncate(len);
                    if b[at] == b',' {
                        at = skip_ws(b, at + 1);
                    }
                    index += 1;
                }
                Ok(at + 1)
            }
            b'"' => Ok(string_end(b, i)),
            _ => {
                let end = b[i..]
                    .iter()
                    .position(|c| !(c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.')))
                    .map_or(b.len(), |n| i + n);
                let literal = &json[i..end];
                let integer = literal.bytes().all(|c| c.is_ascii_digit() || c == b'-');
                if integer && literal.parse::<i64>().is_err() {
                    return Err(literal.to_owned());
                }
                Ok(end)
            }
        }
    }
    let mut path = String::from("payload");
    match value(json, 0, &mut path) {
        Err(literal) => Some((path, literal)),
        Ok(_) => None,
    }
}

/// `created_ms` is the producer's clock (informational; due times use Redis's).
/// With `expire_after_ms` the envelope ends with
/// `,"expire_after_ms":<n>,"expires_ms":0}`: the scripts that set a due time replace
/// the deadline with due + n on the server's clock (include/base.lua's `with_deadline`), which
/// finds it by reading the envelope's last bytes only.
/// With `client_stamp` (a schedule score) the native envelope starts with its stamp
/// (push.lua's "stamped" runs), which the push keeps when that score is the one the
/// message gets.
pub(crate) fn encode(
    layout: &Layout,
    id: &str,
    payload_json: &str,
    max_attempts: Option<u32>,
    expire_after_ms: Option<u64>,
    created_ms: i64,
    client_stamp: Option<u64>,
) -> String {
    let mut out = String::with_capacity(encoded_len(payload_json, id));
    encode_into(
        &mut out,
        layout,
        id,
        payload_json,
        max_attempts,
        expire_after_ms,
        created_ms,
        client_stamp,
    );
    out
}

/// About the length of an envelope (`encode`), to reserve for it.
pub(crate) fn encoded_len(payload_json: &str, id: &str) -> usize {
    payload_json.len() + id.len() + 128
}

/// `encode`, appended to `out`: a push writes a script's envelopes into one string.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_into(
    out: &mut String,
    layout: &Layout,
    id: &str,
    payload_json: &str,
    max_attempts: Option<u32>,
    expire_after_ms: Option<u64>,
    created_ms: i64,
    client_stamp: Option<u64>,
) {
    match layout {
        // The recipe stores the bare payload, so its own consumers can read ours.
        Layout::Seed { .. } => out.push_str(payload_json),
        Layout::Native => {
            // Written piece by piece: a push of 1 000 messages writes 1 000 envelopes.
            let mut n = itoa::Buffer::new();
            out.push('{');
            if let Some(score) = client_stamp {
                out.push_str(r#""at":[0,"#);
                out.push_str(n.format(score));
                out.push_str("],");
            }
            out.push_str(r#""v":1,"id":"#);
            if id.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
                out.push('"');
                out.push_str(id);
                out.push('"');
            } else {
                out.push_str(&serde_json::Value::String(id.to_owned()).to_string());
            }
            out.push_str(r#","created_ms":"#);
            out.push_str(n.format(created_ms));
            if let Some(attempts) = max_attempts {
                out.push_str(r#","max_attempts":"#);
                out.push_str(n.format(attempts));
            }
            out.push_str(r#","payload":"#);
            out.push_str(payload_json);
            if let Some(ms) = expire_after_ms {
                out.push_str(r#","expire_after_ms":"#);
                out.push_str(n.format(ms));
                out.push_str(r#","expires_ms":0"#);
            }
            out.push('}');
        }
    }
}

/// What push.lua takes of an envelope: a native one without its opening brace, which
/// the script writes with the stamp (lua/include/stamp.lua); a seed payload whole.
pub(crate) fn body<'a>(layout: &Layout, envelope: &'a str) -> &'a str {
    match layout {
        Layout::Native => envelope.strip_prefix('{').unwrap_or(envelope),
        Layout::Seed { .. } => envelope,
    }
}

/// The schedule score of the first place in millisecond `due_ms` (include/order.lua),
/// when its places are exact in a double (Redis's scores and Lua's numbers): until
/// the year 2039; later ones the push stamps itself.
pub(crate) fn first_place_score(due_ms: i64) -> Option<u64> {
    let score = u64::try_from(due_ms.max(0)).ok()?.checked_mul(crate::keys::SEQ_SPAN)?;
    (score + crate::keys::SEQ_SPAN <= 1 << 53).then_some(score)
}

/// How a stamped envelope begins (lua/include/stamp.lua's `STAMP_OPEN`).
const STAMP_OPEN: &str = r#"{"at":["#;

/// Whether a native envelope begins with a stamp (well formed or not): the scripts
/// stamp every one they schedule, so one without is a hand edit.
pub(crate) fn has_stamp(stored: &str) -> bool {
    stored.starts_with(STAMP_OPEN)
}

/// The schedule score in a native envelope's stamp, `{"at":[0,<score>],...`
/// (written by the scripts, see lua/include/stamp.lua; decoding skips it): the score
/// the message was last scheduled at, which gives its due time. `None` without one.
pub(crate) fn stamp_score(stored: &str) -> Option<f64> {
    // `[<digits>,<score>],`, read byte by byte: it is read for every claimed message.
    // The scripts write 0 before the score, or a cancel mark (-1, -2); any digits
    // there are skipped.
    let rest = stored.strip_prefix(STAMP_OPEN)?.as_bytes();
    let rest = rest.strip_prefix(b"-").unwrap_or(rest);
    let digit_run = |b: &[u8]| b.iter().position(|c| !c.is_ascii_digit()).unwrap_or(b.len());
    let claim_no = digit_run(rest);
    if claim_no == 0 || rest.get(claim_no) != Some(&b',') {
        return None;
    }
    let rest = &rest[claim_no + 1..];
    let score = digit_run(rest);
    if rest.get(score..score + 2) != Some(b"],") {
        return None;
    }
    // As Redis keeps it: a double (past 2^53 rounded alike).
    digits_value(&rest[..score]).map(|s| s as f64)
}

/// Whether a native envelope's stamp carries a cancel mark, `{"at":[-1,<score>],...` or
/// `-2` (written by cancel.lua while the message runs, see lua/include/stamp.lua's
/// `cancel_mark`): an older build's claim number there, which has no sign, is none.
pub(crate) fn cancel_marked(stored: &str) -> bool {
    let Some(rest) = stored
        .strip_prefix(STAMP_OPEN)
        .and_then(|r| r.strip_prefix("-1,").or_else(|| r.strip_prefix("-2,")))
    else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && rest[digits..].starts_with("],")
}

/// The value of a run of ASCII digits (at least one) that fits in a u64.
fn digits_value(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let d = d.wrapping_sub(b'0');
        (d < 10).then_some(())?;
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

#[derive(Deserialize)]
struct Stored<'a> {
    #[serde(borrow)]
    payload: &'a RawValue,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    created_ms: Option<i64>,
    #[serde(default)]
    expire_after_ms: Option<u64>,
    #[serde(default)]
    expires_ms: Option<i64>,
}

/// A decoded envelope: the payload's JSON text (within the envelope's) and the
/// per-message attempt limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decoded<'a> {
    pub(crate) payload_json: &'a str,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) created_ms: Option<i64>,
    /// (expire_after, deadline on the server's clock): not to be started after it.
    pub(crate) expiry: Option<(u64, i64)>,
}

pub(crate) fn decode<'a>(layout: &Layout, stored: &'a str) -> Result<Decoded<'a>, String> {
    if let Some(decoded) = decode_written(layout, stored) {
        return Ok(decoded);
    }
    let decoded = decode_envelope(layout, stored)?;
    // A payload no consumer could decode goes to the dead letters at its claim.
    check_shape(decoded.payload_json, false).map_err(|e| match e {
        Error::PayloadNotSerializable(reason) => format!("payload cannot be decoded: {reason}"),
        other => other.to_string(),
    })?;
    Ok(decoded)
}

impl Decoded<'_> {
    /// Where the payload lies in `stored`, the envelope it was decoded from.
    pub(crate) fn payload_span(&self, stored: &str) -> std::ops::Range<usize> {
        let start = (self.payload_json.as_ptr() as usize).wrapping_sub(stored.as_ptr() as usize);
        let span = start..start.wrapping_add(self.payload_json.len());
        debug_assert!(
            stored.get(span.clone()) == Some(self.payload_json),
            "not from this envelope"
        );
        span
    }
}

/// An envelope as `encode` writes it (the scripts may restamp it and set its
/// deadline), read in one pass that also checks the payload's syntax and depth, as
/// every claimed message is: what `decode_envelope` and `check_shape` would find.
/// None for anything else (a hand edit, a payload too deep), which they then read and judge.
fn decode_written<'a>(layout: &Layout, stored: &'a str) -> Option<Decoded<'a>> {
    let mut q = Quick {
        b: stored.as_bytes(),
        i: 0,
        depth: 0,
        shape: Shape {
            depth: 0,
            long_digits: false,
        },
    };
    if let Layout::Seed { .. } = layout {
        // The bare payload, without the blanks around it that a raw value leaves out.
        let trimmed = stored.trim_matches([' ', '\n', '\r', '\t']).len() == stored.len();
        q.value()?;
        return (trimmed && q.i == q.b.len()).then_some(Decoded {
            payload_json: stored,
            max_attempts: None,
            created_ms: None,
            expiry: None,
        });
    }
    q.exactly(b"{")?;
    if q.exactly(br#""at":["#).is_some() {
        // 0, or a cancel mark (-1, -2: lua/include/stamp.lua).
        q.signed()?;
        q.exactly(b",")?;
        q.unsigned()?;
        q.exactly(b"],")?;
    }
    q.exactly(br#""v":1,"id":"#)?;
    if q.peek()? != b'"' {
        return None;
    }
    q.string()?;
    q.exactly(br#","created_ms":"#)?;
    let created_ms = q.signed()?;
    let max_attempts = match q.exactly(br#","max_attempts":"#) {
        Some(()) => Some(u32::try_from(q.unsigned()?).ok()?),
        None => None,
    };
    q.exactly(br#","payload":"#)?;
    q.ws();
    let start = q.i;
    q.value()?;
    let payload_json = &stored[start..q.i];
    let expiry = match q.exactly(br#","expire_after_ms":"#) {
        Some(()) => {
            let after = q.unsigned()?;
            q.exactly(br#","expires_ms":"#)?;
            Some((after, q.signed()?))
        }
        None => None,
    };
    q.exactly(b"}")?;
    (q.i == q.b.len()).then_some(Decoded {
        payload_json,
        max_attempts,
        created_ms: Some(created_ms),
        expiry,
    })
}

fn decode_envelope<'a>(layout: &Layout, stored: &'a str) -> Result<Decoded<'a>, String> {
    match layout {
        Layout::Seed { .. } => match serde_json::from_str::<&RawValue>(stored) {
            Ok(raw) => Ok(Decoded {
                payload_json: raw.get(),
                max_attempts: None,
                created_ms: None,
                expiry: None,
            }),
            Err(e) => Err(format!("payload is not valid JSON: {e}")),
        },
        // serde would read a JSON array as the struct's fields in order: "[1,2,3]" must
        // not pass for an envelope with payload 1 and max_attempts 2.
        Layout::Native if !stored.trim_start().starts_with('{') => {
            Err("envelope is not a valid delayq envelope: not a JSON object".to_owned())
        }
        Layout::Native => match serde_json::from_str::<Stored<'_>>(stored) {
            Ok(s) => Ok(Decoded {
                payload_json: s.payload.get(),
                max_attempts: s.max_attempts,
                created_ms: s.created_ms,
                expiry: s.expire_after_ms.zip(s.expires_ms),
            }),
            Err(e) => Err(format!("envelope is not a valid delayq envelope: {e}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_stamp_proposes_a_place_of_its_millisecond() {
        let score = first_place_score(1_764_460_800_123).expect("exact");
        let stored = encode(&Layout::Native, "a", "[1]", None, Some(5), 1, Some(score + 1));
        assert!(
            stored.starts_with(r#"{"at":[0,7227231437303809],"v":1,"id":"a","#),
            "{stored}"
        );
        assert_eq!(stamp_score(&stored), Some(1_764_460_800_123.0 * 4096.0 + 1.0));
        assert_eq!(Layout::Native.due_ms_of_score(score as f64), 1_764_460_800_123);
        assert_eq!(decode(&Layout::Native, &stored).expect("decodes").payload_json, "[1]");
        assert_eq!(first_place_score(-5), Some(0), "a past time is due now");
        assert_eq!(first_place_score(i64::MAX), None, "past what a double holds exactly");
        assert_eq!(first_place_score((1 << 53) / 4096), None);
        assert!(first_place_score((1 << 53) / 4096 - 1).is_some());
    }

    #[test]
    fn a_cancel_mark_is_a_negative_one_or_two_before_the_score_as_stamp_lua_reads_it() {
        for marked in [r#"{"at":[-1,5],"v":1}"#, r#"{"at":[-2,7227230722048007],"v":1}"#] {
            assert!(cancel_marked(marked), "{marked:?}");
        }
        for unmarked in [
            r#"{"at":[0,5],"v":1}"#,
            // An older build's claim number.
            r#"{"at":[1,5],"v":1}"#,
            r#"{"at":[2,5],"v":1}"#,
            r#"{"at":[-3,5],"v":1}"#,
            r#"{"at":[-12,5],"v":1}"#,
            r#"{"at":[-1,],"v":1}"#,
            r#"{"at":[-1,5]"#,
            r#"{"v":1,"at":[-1,5]}"#,
            "",
        ] {
            assert!(!cancel_marked(unmarked), "{unmarked:?}");
        }
    }

    #[test]
    fn the_stamp_gives_the_score_and_decoding_skips_it() {
        let stamped = r#"{"at":[41,7227230722048007],"v":1,"id":"a","created_ms":1,"payload":[1]}"#;
        assert_eq!(stamp_score(stamped), Some(7_227_230_722_048_007.0));
        let decoded = decode(&Layout::Native, stamped).expect("decodes");
        assert_eq!(decoded.payload_json, "[1]");
        for without in [
            r#"{"v":1,"id":"a","created_ms":1,"payload":[1]}"#,
            r#"{"at":[41],"v":1}"#,
            r#"{"at":[41,-5],"v":1}"#,
            r#"{"at":[,5],"v":1}"#,
            r#"{"at":[4a,5],"v":1}"#,
            r#"{"at":[4,5.5],"v":1}"#,
            r#"{"at":[4,],"v":1}"#,
            r#"{"at":[4,5]}"#,
            r#"{"at":[4,5]"#,
            r#"{"at":[4,99999999999999999999],"v":1}"#,
            r#" {"at":[4,5],"v":1}"#,
            "[1,2]",
            "",
        ] {
            assert_eq!(stamp_score(without), None, "{without:?}");
        }
        // Begun (a stamp that does not parse, which buries the message) or not at all
        // (a hand edit).
        assert!(has_stamp(stamped));
        assert!(has_stamp(r#"{"at":[41],"v":1}"#));
        assert!(!has_stamp(r#"{"v":1,"id":"a","created_ms":1,"payload":[1]}"#));
        assert!(!has_stamp(r#" {"at":[4,5],"v":1}"#));
    }

    /// What the one-pass check says of `json`, held to serde_json and `scan`: it may
    /// leave a text to them (None), but where it answers it must agree.
    fn agrees(json: &str) -> bool {
        let serde_ok = serde_json::from_str::<&RawValue>(json).is_ok();
        match quick_shape(json) {
            None => true,
            Some(shape) => {
                let scanned = scan(json);
                serde_ok && shape.depth == scanned.depth && shape.long_digits == scanned.long_digits
            }
        }
    }

    #[test]
    fn the_one_pass_check_agrees_with_serde_json_and_takes_the_common_payloads() {
        let common = [
            r#"{"order_id":10086,"action":"close"}"#,
            r#"[1,-2.5e10,0,-0,1E+2,true,false,null,"a\"b\\c\/\n\u00e9\u001f"]"#,
            " { \"a\" : [ ] , \"b\" : { } }\n",
            "\"é中\"",
            r#"{"big":12345678901234567890}"#,
            "0",
        ];
        for json in common {
            assert!(quick_shape(json).is_some(), "{json}");
            assert!(agrees(json), "{json}");
        }
        let refused_or_left = [
            "",
            " ",
            "01",
            "1.",
            ".5",
            "+1",
            "-",
            "1e",
            "1e+",
            "[1,]",
            r#"{"a":1,}"#,
            "{1:2}",
            "[1 2]",
            "\"a",
            r#""\x""#,
            r#""\u12""#,
            r#""\u+041""#,
            "\"\t\"",
            "tru",
            "nulll",
            "[",
            "]",
            r#"{"a"}"#,
            "1 2",
            r#""\ud83d\ude00""#,
            r#""\ud800""#,
            "[]]",
            "{}{}",
        ];
        for json in refused_or_left {
            assert!(agrees(json), "{json}");
            assert!(
                quick_shape(json).is_none() || serde_json::from_str::<&RawValue>(json).is_ok(),
                "{json}"
            );
        }
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(quick_shape(&deep(MAX_DEPTH)).map(|s| s.depth), Some(MAX_DEPTH));
        assert!(quick_shape(&deep(MAX_DEPTH + 1)).is_none(), "left to the exact error");
    }

    #[test]
    fn the_one_pass_check_agrees_on_random_texts() {
        use rand::{Rng, SeedableRng};
        let pieces = [
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            "\"",
            "\"k\"",
            "\\",
            "\\u00",
            "\\ud800",
            "0",
            "1",
            "9",
            "-",
            ".",
            "e",
            "+",
            " ",
            "true",
            "nul",
            "null",
            "\u{1}",
            "x",
            "1234567890123456789",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(29);
        let mut answered = 0;
        for _ in 0..200_000 {
            let n = rng.random_range(1..12);
            let json: String = (0..n).map(|_| pieces[rng.random_range(0..pieces.len())]).collect();
            assert!(agrees(&json), "{json:?}");
            answered += usize::from(quick_shape(&json).is_some());
        }
        assert!(answered > 1000, "the random texts hold valid JSON too: {answered}");
    }

    /// What `decode` finds without its one-pass reading of written envelopes.
    fn by_serde<'a>(layout: &Layout, stored: &'a str) -> Result<Decoded<'a>, String> {
        let decoded = decode_envelope(layout, stored)?;
        check_shape(decoded.payload_json, false).map_err(|e| e.to_string())?;
        Ok(decoded)
    }

    fn written_envelopes() -> Vec<String> {
        let payloads = [
            r#"{"order_id":10086,"action":"close"}"#,
            r#"[1,-2.5e10,0,-0,1E+2,true,false,null,"a\"b\\c\/\n\u00e9\u001f"]"#,
            " { \"a\" : [ ] , \"b\" : { } }",
            "\"é中\"",
            r#"{"big":12345678901234567890}"#,
            "0",
        ];
        let mut out = Vec::new();
        for (i, payload) in payloads.iter().enumerate() {
            for (id, attempts, expiry, stamp) in [
                ("01a2-b", None, None, None),
                ("a\"b\\c\u{1}日", Some(3), Some(60_000), Some(7_358_308_274_262_016)),
                ("x", Some(0), None, Some(0)),
                ("y", None, Some(1), None),
            ] {
                out.push(encode(
                    &Layout::Native,
                    id,
                    payload,
                    attempts,
                    expiry,
                    1_700_000_000_123 - i as i64,
                    stamp,
                ));
            }
        }
        // As the scripts leave them: restamped by a claim, the deadline set.
        out.push(r#"{"at":[12,7358308274262017],"v":1,"id":"q","created_ms":-5,"payload":{},"expire_after_ms":60000,"expires_ms":1796462051021}"#.to_owned());
        out
    }

    #[test]
    fn written_envelopes_are_read_in_one_pass_as_serde_json_reads_them() {
        for stored in written_envelopes() {
            let fast = decode_written(&Layout::Native, &stored);
            assert!(fast.is_some(), "{stored}");
            assert_eq!(fast.map(Ok), Some(by_serde(&Layout::Native, &stored)), "{stored}");
        }
        for seed in [r#"{"order_id":1}"#, "[1,2]", "\"x\""] {
            let layout = Layout::seed();
            assert_eq!(
                decode_written(&layout, seed).map(Ok),
                Some(by_serde(&layout, seed)),
                "{seed}"
            );
        }
        let deep = format!(
            r#"{{"v":1,"id":"d","created_ms":1,"payload":{}{}}}"#,
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert_eq!(decode_written(&Layout::Native, &deep), None, "left to the exact error");
        assert!(decode(&Layout::Native, &deep).is_err());
    }

    #[test]
    fn envelopes_edited_at_random_are_read_as_serde_json_reads_them_or_left_to_it() {
        use rand::{Rng, SeedableRng};
        let pieces = [
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            "\"",
            "\\",
            " ",
            "0",
            "01",
            "-",
            "1e5",
            "18446744073709551616",
            r#""max_attempts":"#,
            r#","expires_ms":"#,
            r#""v":2,"#,
            "null",
            "\u{1}",
        ];
        let envelopes = written_envelopes();
        let mut rng = rand::rngs::StdRng::seed_from_u64(30);
        let (mut fast, mut left) = (0, 0);
        for _ in 0..100_000 {
            let mut stored = envelopes[rng.random_range(0..envelopes.len())].clone();
            for _ in 0..rng.random_range(1..3) {
                let mut at = rng.random_range(0..=stored.len());
                while !stored.is_char_boundary(at) {
                    at -= 1;
                }
                if rng.random_bool(0.5) {
                    stored.insert_str(at, pieces[rng.random_range(0..pieces.len())]);
                } else if let Some(c) = stored[at..].chars().next() {
                    stored.replace_range(at..at + c.len_utf8(), "");
                }
            }
            match decode_written(&Layout::Native, &stored) {
                Some(d) => {
                    fast += 1;
                    assert_eq!(Ok(d), by_serde(&Layout::Native, &stored), "{stored}");
                }
                None => left += 1,
            }
        }
        assert!(fast > 1000 && left > 1000, "both ways taken: {fast} read, {left} left");
    }

    #[test]
    fn payload_bytes_round_trip_exactly() {
        let payload = r#"{"z":1,"a":[9007199254740993,-1.5e300],"ü":"日本\n"}"#;
        let stored = encode(
            &Layout::Native,
            "id\"1",
            payload,
            Some(3),
            None,
            1_700_000_000_123,
            None,
        );
        let back = decode(&Layout::Native, &stored).expect("decodes");
        assert_eq!(back.payload_json, payload);
        assert_eq!(back.max_attempts, Some(3));
        assert_eq!(back.created_ms, Some(1_700_000_000_123));
        assert_eq!(back.expiry, None);
    }

    #[test]
    fn the_envelope_is_written_as_before_byte_for_byte() {
        // What older versions wrote with format! and serde_json: readers of either agree.
        assert_eq!(
            encode(
                &Layout::Native,
                "01a2-b",
                "[1]",
                Some(3),
                Some(60_000),
                1_700_000_000_123,
                None
            ),
            r#"{"v":1,"id":"01a2-b","created_ms":1700000000123,"max_attempts":3,"payload":[1],"expire_after_ms":60000,"expires_ms":0}"#
        );
        assert_eq!(
            encode(&Layout::Native, "a\"b\\c\u{1}日", "{}", None, None, -5, None),
            r#"{"v":1,"id":"a\"b\\c\u0001日","created_ms":-5,"payload":{}}"#
        );
    }

    #[test]
    fn the_expiry_is_the_envelope_tail() {
        // A payload that ends like the tail must not be taken for it.
        let payload = r#"{"expire_after_ms":1,"expires_ms":2}"#;
        let stored = encode(&Layout::Native, "x", payload, None, Some(60_000), 5, None);
        assert!(
            stored.ends_with(r#"2},"expire_after_ms":60000,"expires_ms":0}"#),
            "{stored}"
        );
        let back = decode(&Layout::Native, &stored).expect("decodes");
        assert_eq!((back.payload_json, back.expiry), (payload, Some((60_000, 0))));
        assert_eq!(
            decode(
                &Layout::Native,
                &encode(&Layout::Native, "x", payload, None, None, 5, None)
            )
            .expect("decodes")
            .expiry,
            None
        );
    }

    #[test]
    fn seed_layout_stores_the_bare_payload() {
        let stored = encode(&Layout::seed(), "x", "[1,2]", Some(3), Some(5), 1, None);
        assert_eq!(stored, "[1,2]");
        assert_eq!(decode(&Layout::seed(), "[1,2]").expect("ok").max_attempts, None);
    }

    #[test]
    fn invalid_payloads() {
        assert!(matches!(
            validate_payload("{", 100),
            Err(Error::PayloadNotSerializable(_))
        ));
        assert!(matches!(
            validate_payload("1 2", 100),
            Err(Error::PayloadNotSerializable(_))
        ));
        assert!(matches!(
            validate_payload("\"long\"", 3),
            Err(Error::PayloadTooLarge { size: 6, max: 3 })
        ));
        let deep = |n| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(validate_payload(&deep(MAX_DEPTH), 1 << 20).is_ok());
        assert!(validate_payload(&deep(MAX_DEPTH + 1), 1 << 20).is_err());
        // What push accepts, a consumer decodes; what it refuses, so does the consumer.
        assert!(parse_payload(&deep(MAX_DEPTH)).is_ok());
        assert!(
            serde_json::from_str::<serde_json::Value>(&deep(MAX_DEPTH)).is_err(),
            "serde_json's own limit"
        );
        let err = parse_payload(&deep(MAX_DEPTH + 1)).expect_err("too deep");
        assert!(err.to_string().contains("the limit is 128"), "{err}");
        assert_eq!(scan(r#"{"a":"[[[{{\"]]","b":[{}]}"#).depth, 3);
        // Integers past the signed 64-bit range, named by their path.
        for (json, error) in [
            (r#"{"n":9223372036854775808}"#, r#"payload["n"] is 9223372036854775808"#),
            (
                "[1, [2, -9223372036854775809]]",
                "payload[1][1] is -9223372036854775809",
            ),
            (
                r#"{"a\"b" : [18446744073709551616]}"#,
                r#"payload["a\"b"][0] is 18446744073709551616"#,
            ),
            (
                "123456789012345678901234567890",
                "payload is 123456789012345678901234567890",
            ),
        ] {
            let err = validate_payload(json, 1 << 20).expect_err(json).to_string();
            assert!(
                err.contains(&format!("{error}, outside the signed 64-bit range")),
                "{json}: {err}"
            );
        }
        let deep_path = format!("payload{}", "[0]".repeat(128));
        let shown = path_for_error(&deep_path);
        assert_eq!(shown, format!("payload{}…{}", "[0]".repeat(13), "[0]".repeat(16)));
        assert!(shown.len() < 110, "{shown}");
        assert_eq!(path_for_error(r#"payload["a"]"#), r#"payload["a"]"#);
        assert!(path_for_error(&format!("payload[\"{}\"]", "é".repeat(60))).is_char_boundary(0));
        let edges = r#"{"max":9223372036854775807,"min":-9223372036854775808,"f":1.00000000000000000000001,
            "e":12345678901234567890e3,"s":"99999999999999999999","k":{"99999999999999999999":true}}"#;
        assert!(validate_payload(edges, 1 << 20).is_ok());
        assert!(decode(&Layout::Native, "not json").is_err());
        assert!(decode(&Layout::Native, r#"[{"x":1},2,3]"#).is_err());
        assert!(decode(&Layout::Native, r#"{"v":1}"#).is_err());
    }
}
