//! [`EventBatch`] → msgpack bytes, byte for byte what msgspec's encoder
//! writes for the same values (checked against msgspec 0.22 in the golden
//! tests): ints in the smallest form, non-negative ones in the uint family
//! (so `i64::MAX` is `0xcf ...`), floats always as float64, strings and
//! containers with the smallest header.
//!
//! The batch is always the 3-element array `[ts, events, attn_dp_rank]`.
//! Events follow the chosen [`Layout`].

use std::convert::Infallible;

use rmp::encode::{self, ByteBuf, ValueWriteError};

use crate::event::{BlockRemoved, BlockStored, EventBatch, KvEvent, TokenIds};

/// How events are laid out (see [`crate::event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// SGLang 0.5.23: tagged maps, None-valued optional fields omitted.
    #[default]
    Map,
    /// SGLang 0.5.18 and before: tagged arrays with every field. This layout has no
    /// place for `session_id` and `lora_name`, which are dropped; a
    /// `cache_salt` is written as 0.5.18's trailing `{"cache_salt": ...}`.
    Array,
}

/// Unwrap a write into a [`ByteBuf`], whose error type is uninhabited.
fn done<T>(r: Result<T, ValueWriteError<Infallible>>) -> T {
    match r {
        Ok(v) => v,
        Err(ValueWriteError::InvalidMarkerWrite(e) | ValueWriteError::InvalidDataWrite(e)) => {
            match e {}
        }
    }
}

/// Lengths above `u32::MAX` cannot be written in msgpack at all; saturating
/// keeps this infallible, and no real batch comes within orders of magnitude.
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

struct Writer {
    buf: ByteBuf,
}

impl Writer {
    fn nil(&mut self) {
        done(encode::write_nil(&mut self.buf).map_err(ValueWriteError::InvalidMarkerWrite));
    }
    fn int(&mut self, v: i64) {
        done(encode::write_sint(&mut self.buf, v));
    }
    fn uint(&mut self, v: u64) {
        done(encode::write_uint(&mut self.buf, v));
    }
    fn opt_int(&mut self, v: Option<i64>) {
        match v {
            Some(v) => self.int(v),
            None => self.nil(),
        }
    }
    fn str(&mut self, s: &str) {
        done(encode::write_str(&mut self.buf, s));
    }
    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.str(s),
            None => self.nil(),
        }
    }
    fn array(&mut self, n: usize) {
        done(encode::write_array_len(&mut self.buf, len32(n)));
    }
    fn map(&mut self, n: usize) {
        done(encode::write_map_len(&mut self.buf, len32(n)));
    }
    fn f64(&mut self, v: f64) {
        done(encode::write_f64(&mut self.buf, v));
    }
    fn hashes(&mut self, h: &[i64]) {
        self.array(h.len());
        for &v in h {
            self.int(v);
        }
    }
    fn tokens(&mut self, t: &TokenIds) {
        self.array(t.len());
        match t {
            TokenIds::Flat(ids) => ids.iter().for_each(|&v| self.uint(v)),
            TokenIds::Bigram(pairs) => {
                for &[a, b] in pairs {
                    self.array(2);
                    self.uint(a);
                    self.uint(b);
                }
            }
        }
    }
}

/// Encode a batch as SGLang's publisher would.
pub fn encode_batch(batch: &EventBatch, layout: Layout) -> Vec<u8> {
    let mut w = Writer {
        buf: ByteBuf::new(),
    };
    w.array(3);
    w.f64(batch.ts);
    w.array(batch.events.len());
    for ev in &batch.events {
        match layout {
            Layout::Map => map_event(&mut w, ev),
            Layout::Array => array_event(&mut w, ev),
        }
    }
    w.opt_int(batch.attn_dp_rank);
    w.buf.into_vec()
}

fn tag_of(ev: &KvEvent) -> &str {
    match ev {
        KvEvent::BlockStored(_) => "BlockStored",
        KvEvent::BlockRemoved(_) => "BlockRemoved",
        KvEvent::AllBlocksCleared => "AllBlocksCleared",
        KvEvent::Unknown { tag } => tag,
    }
}

fn map_event(w: &mut Writer, ev: &KvEvent) {
    match ev {
        KvEvent::BlockStored(s) => map_stored(w, s),
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes,
            medium,
        }) => {
            w.map(2 + usize::from(medium.is_some()));
            w.str("type");
            w.str("BlockRemoved");
            w.str("block_hashes");
            w.hashes(block_hashes);
            if let Some(m) = medium {
                w.str("medium");
                w.str(m);
            }
        }
        // An unknown event's fields were not kept: only its tag survives.
        KvEvent::AllBlocksCleared | KvEvent::Unknown { .. } => {
            w.map(1);
            w.str("type");
            w.str(tag_of(ev));
        }
    }
}

fn map_stored(w: &mut Writer, s: &BlockStored) {
    // Declaration order of SGLang 0.5.23's BlockStored; the four optional
    // fields have a None default, so msgspec omits them when None.
    let optional = [
        ("medium", &s.medium),
        ("cache_salt", &s.cache_salt),
        ("session_id", &s.session_id),
        ("lora_name", &s.lora_name),
    ];
    let present = optional.iter().filter(|(_, v)| v.is_some()).count();
    w.map(6 + present);
    w.str("type");
    w.str("BlockStored");
    w.str("block_hashes");
    w.hashes(&s.block_hashes);
    w.str("parent_block_hash");
    w.opt_int(s.parent_block_hash);
    w.str("token_ids");
    w.tokens(&s.token_ids);
    w.str("block_size");
    w.uint(u64::from(s.block_size));
    w.str("lora_id");
    w.opt_int(s.lora_id);
    for (key, value) in optional {
        if let Some(v) = value {
            w.str(key);
            w.str(v);
        }
    }
}

fn array_event(w: &mut Writer, ev: &KvEvent) {
    match ev {
        KvEvent::BlockStored(s) => {
            w.array(7 + usize::from(s.cache_salt.is_some()));
            w.str("BlockStored");
            w.hashes(&s.block_hashes);
            w.opt_int(s.parent_block_hash);
            w.tokens(&s.token_ids);
            w.uint(u64::from(s.block_size));
            w.opt_int(s.lora_id);
            w.opt_str(s.medium.as_deref());
            if let Some(salt) = &s.cache_salt {
                w.map(1);
                w.str("cache_salt");
                w.str(salt);
            }
        }
        KvEvent::BlockRemoved(r) => {
            w.array(3);
            w.str("BlockRemoved");
            w.hashes(&r.block_hashes);
            w.opt_str(r.medium.as_deref());
        }
        KvEvent::AllBlocksCleared | KvEvent::Unknown { .. } => {
            w.array(1);
            w.str(tag_of(ev));
        }
    }
}
