//! The core's records (`delayq::records`) as PHP arrays: the one converter of every
//! read call (`get`, `stats`, `workers`, ...) and of a worker's summary.

use ext_php_rs::boxed::ZBox;
use ext_php_rs::exception::PhpException;
use ext_php_rs::types::{ZendHashTable, Zval};

use delayq::records::{Field, Record};

use crate::{convert, errors};

type PhpResult<T> = Result<T, PhpException>;

/// A record as a PHP array, so PHP shows what Python shows.
pub(crate) fn record(r: Record) -> PhpResult<ZBox<ZendHashTable>> {
    let mut table = ZendHashTable::with_capacity(u32::try_from(r.0.len()).unwrap_or(u32::MAX));
    for (name, field) in r.0 {
        table
            .insert(name, value(field)?)
            .map_err(|e| errors::payload(e.to_string()))?;
    }
    Ok(table)
}

/// Records as a PHP list of arrays.
pub(crate) fn list(rs: impl IntoIterator<Item = Record>) -> PhpResult<ZBox<ZendHashTable>> {
    let mut list = ZendHashTable::new();
    for r in rs {
        list.push(record(r)?).map_err(|e| errors::payload(e.to_string()))?;
    }
    Ok(list)
}

fn value(field: Field) -> PhpResult<Zval> {
    Ok(match field {
        Field::Null => Zval::null(),
        Field::Int(n) => convert::zv(n),
        Field::Float(x) => convert::zv(x),
        Field::Text(s) => convert::zv(s),
        Field::Bool(b) => convert::zv(b),
        Field::Json(text) => convert::json_to_zval(&text).unwrap_or_else(|_| convert::zv(text)),
        Field::Record(r) => {
            let mut z = Zval::new();
            z.set_hashtable(record(r)?);
            z
        }
    })
}
