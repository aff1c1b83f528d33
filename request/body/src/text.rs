//! The text the cache-aware policies match on.
//!
//! It only has to be stable and prefix-preserving: two requests whose prompts
//! share a prefix must yield texts that share a prefix. It is never sent to a
//! worker. Malformed fields give less text, never an error: the worker, not
//! the router, decides whether a request is well-formed.
//!
//! The walk is one streaming pass over each field (serde visitors writing
//! straight into the text), so its cost is linear in the field's size and it
//! allocates nothing per element. Visitors nest as the JSON does, but never
//! deeper than [`MAX_TEXT_DEPTH`] levels, whatever the client sends: anything
//! deeper is skipped by serde_json's iterative skipper and adds no text. A
//! client cannot make the walk use more stack than those few frames (a wasm
//! VM whose stack overflows stays dead for every later request).

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::{RequestBody, Route};

/// Nesting levels below a routing field that still add text. Chat content
/// parts need four (`messages`, a message, `content`, a part); a batch of
/// token lists needs two.
pub const MAX_TEXT_DEPTH: u8 = 8;

impl RequestBody<'_> {
    /// The routing text of this body for `route`: chat messages (and
    /// Responses API input items) as `role\ncontent\n`, else the
    /// prompt-like fields of the route.
    pub fn routing_text(&self, route: Route) -> String {
        let mut out = String::new();
        match route {
            Route::ChatCompletions => {
                if let Some(messages) = self.get("messages") {
                    walk(messages, Messages { out: &mut out });
                }
            }
            Route::Completions => self.append_first(&["prompt"], &mut out),
            Route::Generate => self.append_first(&["text", "input_ids", "prompt"], &mut out),
            Route::Embeddings | Route::Classify => self.append_first(&["input", "text"], &mut out),
            Route::Responses => {
                // The instructions are the system prompt: they come first.
                self.append_first(&["instructions"], &mut out);
                if let Some(input) = self.get("input") {
                    if input.get().starts_with('[') {
                        walk(input, Messages { out: &mut out });
                    } else {
                        walk(
                            input,
                            Textish {
                                out: &mut out,
                                depth: 0,
                            },
                        );
                    }
                }
            }
            Route::Rerank => {
                self.append_first(&["query"], &mut out);
                self.append_first(&["documents"], &mut out);
            }
        }
        out
    }

    fn append_first(&self, keys: &[&str], out: &mut String) {
        if let Some(v) = keys.iter().find_map(|k| self.get(k)) {
            walk(v, Textish { out, depth: 0 });
        }
    }
}

/// Runs `seed` over one raw value. The value was validated with the whole
/// body, so an error can only mean a shape the seed does not read; what it
/// appended until then stays.
fn walk<'de, S: DeserializeSeed<'de, Value = ()>>(value: &'de RawValue, seed: S) {
    let mut de = serde_json::Deserializer::from_str(value.get());
    let _ = seed.deserialize(&mut de);
}

/// Appends strings as they are, integers in decimal, other numbers in
/// shortest exponent form (so a short number never becomes a long text), and
/// arrays item by item with a space between; objects contribute their
/// `text` members (chat content parts); `null` and booleans nothing.
struct Textish<'o> {
    out: &'o mut String,
    /// How deep below the routing field this value is.
    depth: u8,
}

impl<'de> DeserializeSeed<'de> for Textish<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Textish<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, s: &str) -> Result<(), E> {
        self.out.push_str(s);
        Ok(())
    }

    fn visit_u64<E>(self, n: u64) -> Result<(), E> {
        use fmt::Write;
        let _ = write!(self.out, "{n}");
        Ok(())
    }

    fn visit_i64<E>(self, n: i64) -> Result<(), E> {
        use fmt::Write;
        let _ = write!(self.out, "{n}");
        Ok(())
    }

    fn visit_f64<E>(self, n: f64) -> Result<(), E> {
        use fmt::Write;
        let _ = write!(self.out, "{n:e}");
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let depth = self.depth.saturating_add(1);
        if depth > MAX_TEXT_DEPTH {
            return drain_seq(seq);
        }
        let mut first = true;
        loop {
            let more = if first {
                seq.next_element_seed(Textish {
                    out: &mut *self.out,
                    depth,
                })?
            } else {
                // The separator goes before the item, as for a present one.
                let at = self.out.len();
                self.out.push(' ');
                let more = seq.next_element_seed(Textish {
                    out: &mut *self.out,
                    depth,
                })?;
                if more.is_none() {
                    self.out.truncate(at);
                }
                more
            };
            if more.is_none() {
                return Ok(());
            }
            first = false;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let depth = self.depth.saturating_add(1);
        while let Some(key) = map.next_key::<Key>()? {
            if key == Key::Text && depth <= MAX_TEXT_DEPTH {
                map.next_value_seed(Textish {
                    out: &mut *self.out,
                    depth,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// Chat messages: each object appends `role\ncontent\n` (role first,
/// whatever the key order); anything that is not an object adds nothing.
struct Messages<'o> {
    out: &'o mut String,
}

impl<'de> DeserializeSeed<'de> for Messages<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Messages<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        // One buffer for every message's content, reused.
        let mut content = String::new();
        while seq
            .next_element_seed(Message {
                out: &mut *self.out,
                content: &mut content,
            })?
            .is_some()
        {}
        Ok(())
    }
}

/// One chat message (depth 1 below `messages`).
struct Message<'o> {
    out: &'o mut String,
    content: &'o mut String,
}

impl<'de> DeserializeSeed<'de> for Message<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Message<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a message object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut role: Option<std::borrow::Cow<'de, str>> = None;
        let mut has_content = false;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Role => role = map.next_value::<MaybeStr<'de>>()?.0,
                Key::Content => {
                    // The last `content` wins, as in Python's `json`.
                    self.content.clear();
                    has_content = true;
                    map.next_value_seed(Textish {
                        out: &mut *self.content,
                        depth: 2,
                    })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if let Some(role) = role {
            self.out.push_str(&role);
        }
        self.out.push('\n');
        if has_content {
            self.out.push_str(self.content);
        }
        self.out.push('\n');
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        drain_seq(seq)
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Skips the rest of an array without looking inside its items.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// The member names the walk cares about.
#[derive(PartialEq, Eq)]
enum Key {
    Role,
    Content,
    Text,
    Other,
}

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E>(self, s: &str) -> Result<Key, E> {
                Ok(match s {
                    "role" => Key::Role,
                    "content" => Key::Content,
                    "text" => Key::Text,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// A string, or `None` for any other value (which is skipped).
struct MaybeStr<'a>(Option<std::borrow::Cow<'a, str>>);

impl<'de> serde::Deserialize<'de> for MaybeStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MaybeStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(MaybeStr(Some(s.into())))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(MaybeStr(Some(s.to_owned().into())))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(MaybeStr(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq).map(|()| MaybeStr(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(MaybeStr(None))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;
