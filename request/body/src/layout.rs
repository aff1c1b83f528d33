//! Where a validated body's top-level fields are, kept (a few words per
//! field) instead of the body itself, so that the fields a decision
//! requires can be spliced in later without parsing the body again.

use serde_json::value::RawValue;

use crate::BodyError;

/// The positions of a body's top-level fields, from [`crate::RequestBody::layout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Length of the body it describes.
    len: usize,
    /// Offset of the object's closing `}`.
    close: usize,
    fields: Vec<Span>,
}

/// One top-level field: its key and the byte range of its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) key: Key,
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// A field's key: where it is in the body when it has no escapes (the
/// usual case, which costs no copy), else the unescaped text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Key {
    At(usize, usize),
    Text(String),
}

impl Layout {
    pub(crate) fn new(len: usize, close: usize, fields: Vec<Span>) -> Self {
        Layout { len, close, fields }
    }

    /// The body `raw` (the one this layout was taken from) with `fields`
    /// set: existing keys get their value replaced in place, new keys are
    /// appended before the closing brace. Every other byte is the client's.
    /// When `fields` names a key twice, the last one wins.
    pub fn with_fields(&self, raw: &[u8], fields: &[(&str, &str)]) -> Result<Vec<u8>, BodyError> {
        if raw.len() != self.len {
            return Err(BodyError::NotItsBody);
        }
        // (start, end, replacement): sorted, non-overlapping edits of `raw`.
        let mut edits: Vec<(usize, usize, Vec<u8>)> = Vec::with_capacity(fields.len());
        let mut appended = Vec::new();
        for (i, &(key, value)) in fields.iter().enumerate() {
            if fields[i + 1..].iter().any(|(k, _)| *k == key) {
                continue; // a later entry sets this key
            }
            if serde_json::from_str::<&RawValue>(value).is_err() {
                return Err(BodyError::InvalidInjection(key.to_string()));
            }
            let mut found = false;
            for f in self.fields.iter().filter(|f| f.key.is(raw, key)) {
                found = true;
                edits.push((f.start, f.end, value.as_bytes().to_vec()));
            }
            if !found {
                if !self.fields.is_empty() || !appended.is_empty() {
                    appended.push(b',');
                }
                let quoted = serde_json::to_string(key)
                    .map_err(|_| BodyError::InvalidInjection(key.to_string()))?;
                appended.extend_from_slice(quoted.as_bytes());
                appended.push(b':');
                appended.extend_from_slice(value.as_bytes());
            }
        }
        if !appended.is_empty() {
            edits.push((self.close, self.close, appended));
        }
        edits.sort_by_key(|e| e.0);

        let extra: usize = edits.iter().map(|e| e.2.len()).sum();
        let mut out = Vec::with_capacity(raw.len() + extra);
        let mut at = 0;
        for (start, end, bytes) in edits {
            out.extend_from_slice(&raw[at..start]);
            out.extend_from_slice(&bytes);
            at = end;
        }
        out.extend_from_slice(&raw[at..]);
        Ok(out)
    }
}

impl Key {
    /// True when this key, in `raw`, is `name`.
    fn is(&self, raw: &[u8], name: &str) -> bool {
        match self {
            Key::At(start, end) => raw.get(*start..*end) == Some(name.as_bytes()),
            Key::Text(text) => text == name,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::RequestBody;

    #[test]
    fn a_layout_edits_its_body_as_a_fresh_parse_does() {
        let body = br#"{"rid":"c", "a\u0062":1, "model":"m"}"#;
        let parsed = RequestBody::parse(body).unwrap();
        let layout = parsed.layout();
        drop(parsed);
        for fields in [
            &[("rid", "\"ours\"")][..],
            &[("ab", "2"), ("new", "[1]")],
            &[],
        ] {
            let fresh = RequestBody::parse(body).unwrap().with_fields(fields);
            assert_eq!(layout.with_fields(body, fields), fresh, "{fields:?}");
        }
        assert_eq!(
            String::from_utf8(layout.with_fields(body, &[("ab", "2")]).unwrap()).unwrap(),
            r#"{"rid":"c", "a\u0062":2, "model":"m"}"#,
            "an escaped key is matched by its text"
        );
    }

    #[test]
    fn a_layout_refuses_another_body() {
        let layout = RequestBody::parse(br#"{"a":1}"#).unwrap().layout();
        assert_eq!(
            layout.with_fields(br#"{"a":12}"#, &[]),
            Err(crate::BodyError::NotItsBody)
        );
    }
}
