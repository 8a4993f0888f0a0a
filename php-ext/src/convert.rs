//! PHP values to and from JSON text, as `json_encode` / `json_decode($json, true)`
//! would, but strict: invalid UTF-8, NAN/INF, resources, closures and arbitrary
//! objects are refused with the path of the culprit, and nothing is serialize()d.

use std::borrow::Cow;

use ext_php_rs::convert::IntoZval;
use ext_php_rs::exception::PhpException;
use ext_php_rs::flags::DataType;
use ext_php_rs::types::array::Iter;
use ext_php_rs::types::{ZendHashTable, ZendObject, Zval};
use ext_php_rs::zend::ClassEntry;

use delayq::options::{Kind as OptionKind, OptionRow, Value};
use delayq::{PayloadFault, PayloadJson, PayloadWriter};

use crate::values::{Invalid, type_name, utf8};
use crate::{args, errors};

type PhpResult<T> = Result<T, PhpException>;

/// A PHP payload as JSON text.
pub(crate) fn payload_to_json(value: &Zval) -> PhpResult<PayloadJson> {
    payload_to_json_named(value, || "$payload".into())
}

/// The same, with errors naming the payload `name` (e.g. "pushMany item 3 payload").
/// One walk drives the core's writer, which holds the limits; the path to a value that
/// cannot be written is put together only for the error, as it propagates.
pub(crate) fn payload_to_json_named(value: &Zval, name: impl FnOnce() -> String) -> PhpResult<PayloadJson> {
    let mut out = PayloadWriter::new();
    match write_json(value, &mut out) {
        Ok(()) => Ok(out.finish()),
        Err(fault) => {
            let mut path = name();
            for segment in fault.segments.iter().rev() {
                path.push_str(segment);
            }
            Err(errors::payload((fault.message)(&delayq::path_for_error(&path))))
        }
    }
}

/// A value that cannot be written: its message, given the path to it, and the path's
/// segments from the value up, each added by the array it is in.
struct Fault {
    segments: Vec<String>,
    message: Box<dyn FnOnce(&str) -> String>,
}

impl Fault {
    fn new(message: impl FnOnce(&str) -> String + 'static) -> Self {
        Self {
            segments: Vec::new(),
            message: Box::new(message),
        }
    }
}

impl From<PayloadFault> for Fault {
    fn from(fault: PayloadFault) -> Self {
        Self::new(move |path| fault.message(path))
    }
}

fn write_json(value: &Zval, out: &mut PayloadWriter) -> Result<(), Fault> {
    let value = value.dereference();
    match value.get_type() {
        DataType::Null | DataType::Undef => out.null(),
        DataType::True => out.bool(true),
        DataType::False => out.bool(false),
        DataType::Bool => out.bool(value.bool().unwrap_or(false)),
        DataType::Long => out.int(value.long().unwrap_or(0)),
        DataType::Double => out.float(value.double().unwrap_or(0.0))?,
        DataType::String => {
            let bytes = value.zend_str().map(|s| s.as_bytes()).unwrap_or_default();
            let text = std::str::from_utf8(bytes).map_err(|e| {
                let at = e.valid_up_to();
                Fault::new(move |path| format!("{path} is not valid UTF-8 (byte {at})"))
            })?;
            out.str(text);
        }
        DataType::Array => {
            let table = value
                .array()
                .ok_or_else(|| Fault::new(|path| format!("{path} is an unreadable array")))?;
            write_table(table, out, is_list(table))?;
        }
        DataType::Object(_) => {
            let object = value
                .object()
                .ok_or_else(|| Fault::new(|path| format!("{path} is an unreadable object")))?;
            write_object(object, out)?;
        }
        DataType::Resource => {
            return Err(Fault::new(|path| {
                format!("{path} is a resource, which cannot be a payload")
            }));
        }
        other => {
            return Err(Fault::new(move |path| {
                format!("{path} has the type {other}, which cannot be a payload")
            }));
        }
    }
    Ok(())
}

fn write_table(table: &ZendHashTable, out: &mut PayloadWriter, list: bool) -> Result<(), Fault> {
    if list {
        out.begin_list()?;
    } else {
        out.begin_object()?;
    }
    let mut items = Iter::new(table);
    // Keys are read in place, as PHP holds them: no copy of a key per element.
    while let Some((key, item)) = items.next_zval() {
        let index = key.long();
        if !list {
            match index {
                Some(n) => out.key(itoa::Buffer::new().format(n)),
                None => {
                    let bytes = key.zend_str().map(|s| s.as_bytes()).unwrap_or_default();
                    match utf8(bytes) {
                        Ok(name) => out.key(name),
                        Err(Invalid { shown, at }) => {
                            return Err(Fault::new(move |path| {
                                format!("{path}[\"{shown}\"]: the array key is not valid UTF-8 (byte {at})")
                            }));
                        }
                    }
                }
            }
        }
        if let Err(mut fault) = write_json(item, out) {
            // As PHP reads the element back: $payload[0], $payload["a"].
            fault.segments.push(match (index, key_of(&key)) {
                (Some(n), _) => format!("[{n}]"),
                (None, Key::Name(s)) => format!("[{s:?}]"),
                (None, _) => String::new(),
            });
            return Err(fault);
        }
    }
    if list {
        out.end_list();
    } else {
        out.end_object();
    }
    Ok(())
}

/// An array key as PHP holds it, read without ext-php-rs's `ArrayKey` conversion (its
/// iterators panic on a string key that is not valid UTF-8).
pub(crate) enum Key {
    Index(i64),
    Name(String),
    /// A string key that is not valid UTF-8: its bytes, escaped as in a PHP
    /// double-quoted string, and the offset of the first invalid one.
    Invalid {
        shown: String,
        at: usize,
    },
}

fn key_of(key: &Zval) -> Key {
    if let Some(n) = key.long() {
        return Key::Index(n);
    }
    let bytes = key.zend_str().map(|s| s.as_bytes()).unwrap_or_default();
    match utf8(bytes) {
        Ok(s) => Key::Name(s.to_owned()),
        Err(Invalid { shown, at }) => Key::Invalid { shown, at },
    }
}

/// The entries of a PHP array, in order, keys read as [`Key`]: unlike
/// `ZendHashTable::iter()` and `values()`, never panics.
pub(crate) struct Entries<'a>(Iter<'a>);

impl<'a> Iterator for Entries<'a> {
    type Item = (Key, &'a Zval);

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_zval().map(|(key, value)| (key_of(&key), value))
    }
}

pub(crate) fn entries(table: &ZendHashTable) -> Entries<'_> {
    Entries(Iter::new(table))
}

/// Whether the keys are 0, 1, 2…: a JSON list (`has_sequential_keys`, which panics on
/// a key that is not UTF-8).
fn is_list(table: &ZendHashTable) -> bool {
    // PHP's HASH_FLAG_PACKED (Zend/zend_hash.h, the same in every PHP we build for;
    // bindgen does not carry it). A packed array without holes has the keys 0, 1, 2…,
    // as PHP's own zend_array_is_list() tests first: a list known without a walk.
    const HASH_FLAG_PACKED: u32 = 1 << 2;
    // SAFETY: `flags` overlays the four one-byte fields of `u.v`: any value is valid.
    let packed = unsafe { table.u.flags } & HASH_FLAG_PACKED != 0;
    if packed && table.nNumUsed == table.nNumOfElements {
        return true;
    }
    // Keys read in place: an object's first string key ends the walk, with no copy.
    let mut items = Iter::new(table);
    let mut i = 0;
    while let Some((key, _)) = items.next_zval() {
        if key.long().and_then(|n| usize::try_from(n).ok()) != Some(i) {
            return false;
        }
        i += 1;
    }
    true
}

fn write_object(object: &ZendObject, out: &mut PayloadWriter) -> Result<(), Fault> {
    let class = object.get_class_name().unwrap_or_else(|_| "object".into());
    if let Some(json_serializable) = ClassEntry::try_find("JsonSerializable")
        && object.instance_of(json_serializable)
    {
        let data = object.try_call_method("jsonSerialize", vec![]).map_err(|e| {
            let e = e.to_string();
            Fault::new(move |path| format!("{path}: {class}::jsonSerialize() failed: {e}"))
        })?;
        // A level of its own: an object whose jsonSerialize() returns itself is too deep.
        out.enter()?;
        write_json(&data, out)?;
        out.leave();
        return Ok(());
    }
    if class == "stdClass" {
        let props = object.get_properties().map_err(|e| {
            let e = e.to_string();
            Fault::new(move |path| format!("{path}: cannot read the properties of stdClass: {e}"))
        })?;
        return write_table(props, out, false);
    }
    let hint = if class == "Closure" {
        "a Closure cannot be a payload".to_owned()
    } else {
        format!("objects of class {class} are not payloads: implement JsonSerializable or pass an array")
    };
    Err(Fault::new(move |path| format!("{path} is an object: {hint}")))
}

/// JSON text to a PHP value, as `json_decode($json, true)` returns it: built as the
/// text is read (the core's checks, no tree in between).
pub(crate) fn json_to_zval(json: &str) -> PhpResult<Zval> {
    delayq::decode_payload_with(json, ZvalSeed)
        .map_err(|e| errors::payload(format!("stored payload cannot be decoded: {e}")))
}

/// Builds a PHP value from JSON as serde_json reads it.
pub(crate) struct ZvalSeed;

impl<'de> serde::de::DeserializeSeed<'de> for ZvalSeed {
    type Value = Zval;

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<Zval, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ZvalSeed {
    type Value = Zval;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Zval, E> {
        let mut z = Zval::new();
        z.set_null();
        Ok(z)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Zval, E> {
        let mut z = Zval::new();
        z.set_bool(b);
        Ok(z)
    }

    fn visit_i64<E>(self, n: i64) -> Result<Zval, E> {
        let mut z = Zval::new();
        z.set_long(n);
        Ok(z)
    }

    fn visit_u64<E>(self, n: u64) -> Result<Zval, E> {
        let mut z = Zval::new();
        match i64::try_from(n) {
            Ok(i) => z.set_long(i),
            // Beyond 64 bits PHP has only floats, as json_decode does.
            Err(_) => z.set_double(n as f64),
        }
        Ok(z)
    }

    fn visit_f64<E>(self, f: f64) -> Result<Zval, E> {
        let mut z = Zval::new();
        z.set_double(f);
        Ok(z)
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Zval, E> {
        let mut z = Zval::new();
        z.set_string(s, false).map_err(E::custom)?;
        Ok(z)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Zval, A::Error> {
        let mut table = ZendHashTable::with_capacity(u32::try_from(seq.size_hint().unwrap_or(0)).unwrap_or(0));
        while let Some(item) = seq.next_element_seed(ZvalSeed)? {
            table.push(item).map_err(serde::de::Error::custom)?;
        }
        let mut z = Zval::new();
        z.set_hashtable(table);
        Ok(z)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Zval, A::Error> {
        let mut table = ZendHashTable::new();
        while let Some(key) = map.next_key::<KeyText<'de>>()? {
            let value = map.next_value_seed(ZvalSeed)?;
            // Numeric keys become integer keys, as in any PHP array.
            table.insert(key.as_str(), value).map_err(serde::de::Error::custom)?;
        }
        let mut z = Zval::new();
        z.set_hashtable(table);
        Ok(z)
    }
}

/// An object key as serde_json reads it: borrowed from the text unless it had escapes.
pub(crate) enum KeyText<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl KeyText<'_> {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Self::Borrowed(s) => s,
            Self::Owned(s) => s,
        }
    }
}

impl<'de> serde::Deserialize<'de> for KeyText<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Key;
        impl<'de> serde::de::Visitor<'de> for Key {
            type Value = KeyText<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object key")
            }

            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<KeyText<'de>, E> {
                Ok(KeyText::Borrowed(s))
            }

            fn visit_str<E>(self, s: &str) -> Result<KeyText<'de>, E> {
                Ok(KeyText::Owned(s.to_owned()))
            }
        }
        de.deserialize_str(Key)
    }
}

/// A number of seconds from an int or float (in PHP's default mode also a numeric
/// string, see `args::coerced`).
pub(crate) fn seconds(value: &Zval, name: &str) -> PhpResult<f64> {
    let value = value.dereference();
    let number = |v: &Zval| v.double().or_else(|| v.long().map(|i| i as f64));
    if let Some(f) = number(value).or_else(|| args::coerced(value, args::MAY_BE_NUMBER).as_ref().and_then(number)) {
        return Ok(f);
    }
    Err(errors::type_error(format!(
        "{name} must be a number of seconds (int|float), {} given",
        type_name(value)
    )))
}

/// Reads an options array, refusing keys nobody asked for. Its name is put together
/// only for an error: a `pushMany` of 1 000 items reads 1 000 arrays.
pub(crate) struct Options<'a> {
    table: Option<&'a ZendHashTable>,
    what: Cow<'static, str>,
    /// The item of a list the array is (`pushMany item 3 key`), its index and suffix.
    item: Option<(usize, &'static str)>,
    /// The keys asked for while some entry was not found yet: all of them when an
    /// entry is left over, which `finish` refuses and names them for.
    known: Known,
    /// Entries of the table found by `get` so far: once all are, every key left to read
    /// is absent, and every key present is known.
    found: usize,
}

/// The keys of an options array asked for: held in place up to `Known::INLINE`, as
/// a `pushMany` of 1 000 items reads 1 000 arrays.
struct Known {
    inline: [&'static str; Known::INLINE],
    len: usize,
    more: Vec<&'static str>,
}

impl Known {
    const INLINE: usize = 16;

    fn new() -> Self {
        Self {
            inline: [""; Self::INLINE],
            len: 0,
            more: Vec::new(),
        }
    }

    fn push(&mut self, key: &'static str) {
        match self.inline.get_mut(self.len) {
            Some(slot) => {
                *slot = key;
                self.len += 1;
            }
            None => self.more.push(key),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.inline[..self.len].iter().chain(&self.more).copied()
    }

    fn contains(&self, key: &str) -> bool {
        self.iter().any(|k| k == key)
    }
}

/// A seconds value without PHP's coercion (the common case), or None.
pub(crate) fn plain_seconds(value: &Zval) -> Option<f64> {
    let value = value.dereference();
    value.double().or_else(|| value.long().map(|i| i as f64))
}

impl<'a> Options<'a> {
    pub(crate) fn new(table: Option<&'a ZendHashTable>, what: impl Into<Cow<'static, str>>) -> Self {
        Self {
            table,
            what: what.into(),
            item: None,
            known: Known::new(),
            found: 0,
        }
    }

    /// The array that is item `index` of a list: errors name it "`list` `index` `suffix`".
    pub(crate) fn item(table: &'a ZendHashTable, list: &'static str, index: usize, suffix: &'static str) -> Self {
        let mut o = Self::new(Some(table), list);
        o.item = Some((index, suffix));
        o
    }

    /// What errors call these options ("DelayQueue option", "pushMany item 3 key").
    pub(crate) fn what(&self) -> Cow<'_, str> {
        match self.item {
            None => Cow::Borrowed(&self.what),
            Some((i, suffix)) => Cow::Owned(format!("{} {i} {suffix}", self.what)),
        }
    }

    pub(crate) fn get(&mut self, key: &'static str) -> Option<&'a Zval> {
        let table = self.table?;
        let again = self.known.contains(key);
        if self.found == table.len() && !again {
            // Every entry is found: this key is absent, and `finish` will not need it.
            return None;
        }
        if !again {
            self.known.push(key);
        }
        let value = table.get(key)?;
        if !again {
            self.found += 1;
        }
        Some(value).filter(|v| !v.dereference().is_null())
    }

    /// Every entry of the array was read: any other key is absent, and `finish`
    /// passes.
    pub(crate) fn exhausted(&self) -> bool {
        self.table.is_none_or(|t| self.found == t.len())
    }

    pub(crate) fn string(&mut self, key: &'static str) -> PhpResult<Option<String>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let v = v.dereference();
        if let Some(s) = v.zend_str() {
            return utf8(s.as_bytes()).map(|t| Some(t.to_owned())).map_err(|e| {
                errors::invalid(format!(
                    "{} '{key}' is not valid UTF-8 (byte {}): \"{}\"",
                    self.what(),
                    e.at,
                    e.shown
                ))
            });
        }
        v.string()
            .or_else(|| args::coerced(v, args::MAY_BE_STRING).and_then(|c| c.string()))
            .map(Some)
            .ok_or_else(|| {
                errors::type_error(format!(
                    "{} '{key}' must be a string, {} given",
                    self.what(),
                    type_name(v)
                ))
            })
    }

    pub(crate) fn seconds(&mut self, key: &'static str) -> PhpResult<Option<f64>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        match plain_seconds(v) {
            Some(s) => Ok(Some(s)),
            None => seconds(v, &format!("{} '{key}'", self.what())).map(Some),
        }
    }

    pub(crate) fn duration(&mut self, key: &'static str) -> PhpResult<Option<std::time::Duration>> {
        match self.seconds(key)? {
            Some(s) => delayq::delay_from_secs(key, s).map(Some).map_err(|e| match e {
                // Named as these options name it.
                delayq::Error::InvalidArgument { reason, .. } => {
                    errors::invalid(format!("invalid {} '{key}': {reason}", self.what()))
                }
                other => errors::to_php(&other),
            }),
            None => Ok(None),
        }
    }

    pub(crate) fn int(&mut self, key: &'static str, min: i64, max: i64) -> PhpResult<Option<i64>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let v = v.dereference();
        let n = v
            .long()
            .or_else(|| args::coerced(v, args::MAY_BE_LONG).and_then(|c| c.long()))
            .ok_or_else(|| {
                errors::type_error(format!(
                    "{} '{key}' must be an int, {} given",
                    self.what(),
                    type_name(v)
                ))
            })?;
        if n < min || n > max {
            return Err(errors::invalid(format!(
                "{} '{key}' must be between {min} and {max}, got {n}",
                self.what()
            )));
        }
        Ok(Some(n))
    }

    /// A count of an options table, within its range.
    pub(crate) fn count(&mut self, option: &'static OptionRow) -> PhpResult<Option<i64>> {
        let (min, max) = option.count_range();
        self.int(option.name, min, max)
    }

    /// Seconds of an options table, within its bounds.
    pub(crate) fn span(&mut self, option: &'static OptionRow) -> PhpResult<Option<std::time::Duration>> {
        match self.seconds(option.name)? {
            Some(s) => option.check_seconds(s).map(Some).map_err(|e| self.core_error(&e)),
            None => Ok(None),
        }
    }

    /// The value of an options table's row, read by its kind and checked against it.
    pub(crate) fn value(&mut self, option: &'static OptionRow) -> PhpResult<Option<Value>> {
        Ok(match option.kind {
            OptionKind::Count => self.count(option)?.map(Value::Count),
            OptionKind::Seconds => self.span(option)?.map(|d| Value::Seconds(d.as_secs_f64())),
            OptionKind::Flag => self.bool(option.name)?.map(Value::Flag),
            OptionKind::Text => match self.string(option.name)? {
                Some(t) => Some(Value::Text(option.check_text(t).map_err(|e| self.core_error(&e))?)),
                None => None,
            },
            other => unreachable!("{} is read by its binding ({other:?})", option.name),
        })
    }

    /// The core's error about an option, named as these options name it.
    pub(crate) fn core_error(&self, e: &delayq::Error) -> PhpException {
        match e {
            delayq::Error::InvalidArgument { name, reason } => {
                errors::invalid(format!("{} '{name}' {reason}", self.what()))
            }
            other => errors::to_php(other),
        }
    }

    /// Only a bool: PHP would coerce any string, and `'false'` would be true.
    pub(crate) fn bool(&mut self, key: &'static str) -> PhpResult<Option<bool>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        v.dereference().bool().map(Some).ok_or_else(|| {
            errors::type_error(format!(
                "{} '{key}' must be a bool, {} given",
                self.what(),
                type_name(v)
            ))
        })
    }

    /// Whether every key is one that was read: the common case, without copying a key.
    fn all_known(&self, table: &ZendHashTable) -> bool {
        let mut keys = Iter::new(table);
        while let Some((key, _)) = keys.next_zval() {
            let known = key
                .zend_str()
                .and_then(|k| std::str::from_utf8(k.as_bytes()).ok())
                .is_some_and(|k| self.known.contains(k));
            if !known {
                return false;
            }
        }
        true
    }

    /// Fails on any key that was not read, naming it and the accepted ones.
    pub(crate) fn finish(&self) -> PhpResult<()> {
        let Some(table) = self.table else { return Ok(()) };
        if self.found == table.len() || (table.len() <= self.known.iter().count() && self.all_known(table)) {
            return Ok(());
        }
        let mut known: Vec<&str> = self.known.iter().collect();
        known.sort_unstable();
        for (key, _) in entries(table) {
            let name = match key {
                Key::Index(n) => n.to_string(),
                Key::Name(s) => s,
                Key::Invalid { shown, at } => {
                    return Err(errors::invalid(format!(
                        "unknown {} \"{shown}\": not valid UTF-8 (byte {at}) (known: {})",
                        self.what(),
                        known.join(", ")
                    )));
                }
            };
            if !self.known.contains(&name) {
                return Err(errors::invalid(format!(
                    "unknown {} '{name}' (known: {})",
                    self.what(),
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }
}

pub(crate) fn zv<T: IntoZval>(v: T) -> Zval {
    v.into_zval(false).unwrap_or_default()
}

/// Unix milliseconds as PHP's float seconds.
pub(crate) fn ms_to_secs(ms: i64) -> f64 {
    ms as f64 / 1000.0
}

/// A PHP `float` parameter counting seconds; an int is accepted as PHP would coerce it.
#[derive(Debug, Clone, Copy)]
pub struct Seconds(pub(crate) f64);

impl<'a> ext_php_rs::convert::FromZval<'a> for Seconds {
    const TYPE: DataType = DataType::Double;

    fn from_zval(zval: &'a Zval) -> Option<Self> {
        let zval = zval.dereference();
        zval.double().or_else(|| zval.long().map(|i| i as f64)).map(Self)
    }
}

impl From<f64> for Seconds {
    fn from(s: f64) -> Self {
        Self(s)
    }
}

impl ext_php_rs::convert::StubLiteral for Seconds {
    fn stub_literal(&self) -> String {
        ext_php_rs::convert::StubLiteral::stub_literal(&self.0)
    }
}

/// An `array $options = []` parameter.
#[derive(Debug, Clone, Copy)]
pub struct OptionsArg<'a>(pub(crate) Option<&'a ZendHashTable>);

impl OptionsArg<'_> {
    pub(crate) const EMPTY: Self = Self(None);
}

impl<'a> ext_php_rs::convert::FromZval<'a> for OptionsArg<'a> {
    const TYPE: DataType = DataType::Array;

    fn from_zval(zval: &'a Zval) -> Option<Self> {
        zval.dereference().array().map(|t| Self(Some(t)))
    }
}

impl ext_php_rs::convert::StubLiteral for OptionsArg<'_> {
    fn stub_literal(&self) -> String {
        "[]".to_owned()
    }
}
