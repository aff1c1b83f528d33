//! `tojson` as transformers defines it for chat templates:
//! `json.dumps(x, ensure_ascii=False, indent=indent)`, so `", "` and `": "`
//! between items without an indent, keys in their given order, and no HTML
//! escaping (minijinja's own `tojson` escapes `<`, `>` and `&`).

use std::io;

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter, Serializer};

/// Python's default separators, `", "` and `": "`.
struct PythonCompact;

/// `", "` before every item but the first.
fn item_separator<W: ?Sized + io::Write>(w: &mut W, first: bool) -> io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

impl Formatter for PythonCompact {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        item_separator(w, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// The JSON text of `value`, as Python writes it.
pub(crate) fn dumps(value: &Value, indent: Option<usize>) -> Result<String, serde_json::Error> {
    let mut out = Vec::new();
    match indent {
        None => value.serialize(&mut Serializer::with_formatter(&mut out, PythonCompact))?,
        Some(n) => {
            let pad = vec![b' '; n];
            value.serialize(&mut Serializer::with_formatter(
                &mut out,
                PrettyFormatter::with_indent(&pad),
            ))?
        }
    }
    // serde_json writes valid UTF-8 only.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The `tojson` filter: `x | tojson` or `x | tojson(indent=2)`.
pub(crate) fn filter(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    dumps(&value, indent)
        .map(Value::from_safe_string)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap_or_default()
    }

    #[test]
    fn writes_what_python_json_dumps_writes() {
        // Expected strings from Python 3.11:
        // json.dumps({"b": [1, 2.5, None, True], "a": "é<\"\n"}, ensure_ascii=False)
        let v = parse(r#"{"b": [1, 2.5, null, true], "a": "é<\"\n"}"#);
        assert_eq!(
            dumps(&v, None).ok().as_deref(),
            Some(r#"{"b": [1, 2.5, null, true], "a": "é<\"\n"}"#)
        );
        // json.dumps({"k": {"x": []}}, indent=2)
        let v = parse(r#"{"k": {"x": []}}"#);
        assert_eq!(
            dumps(&v, Some(2)).ok().as_deref(),
            Some("{\n  \"k\": {\n    \"x\": []\n  }\n}")
        );
    }
}
