//! msgpack bytes → [`EventBatch`], accepting every layout SGLang has used
//! (see [`crate::event`] for the layouts and where they were read).
//!
//! Lenient where msgspec evolves compatibly: elements after the known
//! positional fields and unknown map keys are skipped; optional trailing
//! fields that are missing become None; an unknown event tag becomes
//! [`KvEvent::Unknown`]. Strict where a lenient reading would guess: wrong
//! types, truncated input and trailing bytes are errors.

use crate::error::DecodeError;
use crate::event::{BlockRemoved, BlockStored, EventBatch, KvEvent, TokenIds};
use crate::msgpack::Reader;

/// Decode one PUB payload (the third frame).
pub fn decode_batch(bytes: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut r = Reader::new(bytes);
    let len = r.read_array_len()?;
    if len < 2 {
        return Err(DecodeError::TooShort {
            what: "EventBatch",
            len,
            min: 2,
        });
    }
    let ts = r.read_f64()?;
    let n_events = r.read_array_len()?;
    let mut events = Vec::with_capacity(r.capacity_for(n_events));
    for _ in 0..n_events {
        events.push(read_event(&mut r)?);
    }
    let attn_dp_rank = if len >= 3 {
        read_opt_i64(&mut r, "attn_dp_rank")?
    } else {
        None
    };
    for _ in 3..len {
        r.skip_value()?;
    }
    if r.remaining() > 0 {
        return Err(DecodeError::TrailingBytes {
            extra: r.remaining(),
        });
    }
    Ok(EventBatch {
        ts,
        events,
        attn_dp_rank,
    })
}

fn read_event(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let at = r.pos();
    let m = r.peek()?;
    if r.next_is_array() {
        read_array_event(r)
    } else if r.next_is_map() {
        read_map_event(r)
    } else {
        Err(DecodeError::UnexpectedType {
            expected: "event (array or map)",
            marker: m.to_u8(),
            at,
        })
    }
}

fn read_opt_i64(r: &mut Reader<'_>, field: &'static str) -> Result<Option<i64>, DecodeError> {
    if r.read_nil()? {
        Ok(None)
    } else {
        r.read_i64(field).map(Some)
    }
}

fn read_opt_str(r: &mut Reader<'_>) -> Result<Option<String>, DecodeError> {
    if r.read_nil()? {
        Ok(None)
    } else {
        r.read_str().map(|s| Some(s.to_owned()))
    }
}

fn read_hashes(r: &mut Reader<'_>) -> Result<Vec<i64>, DecodeError> {
    let n = r.read_array_len()?;
    let mut out = Vec::with_capacity(r.capacity_for(n));
    for _ in 0..n {
        out.push(r.read_i64("block_hashes")?);
    }
    Ok(out)
}

fn read_block_size(r: &mut Reader<'_>) -> Result<u32, DecodeError> {
    let at = r.pos();
    let v = r.read_u64("block_size")?;
    u32::try_from(v).map_err(|_| DecodeError::IntOutOfRange {
        field: "block_size",
        at,
    })
}

/// Token ids: all ints, or all two-element arrays (bigram pairs). The first
/// element decides which; a mix is an error.
fn read_tokens(r: &mut Reader<'_>) -> Result<TokenIds, DecodeError> {
    let n = r.read_array_len()?;
    if n == 0 {
        return Ok(TokenIds::Flat(Vec::new()));
    }
    if r.next_is_array() {
        let mut pairs = Vec::with_capacity(r.capacity_for(n));
        for _ in 0..n {
            let at = r.pos();
            if !r.next_is_array() || r.read_array_len()? != 2 {
                return Err(DecodeError::MixedTokens { at });
            }
            pairs.push([r.read_u64("token_ids")?, r.read_u64("token_ids")?]);
        }
        Ok(TokenIds::Bigram(pairs))
    } else {
        let mut ids = Vec::with_capacity(r.capacity_for(n));
        for _ in 0..n {
            let at = r.pos();
            if !r.next_is_int() {
                return Err(DecodeError::MixedTokens { at });
            }
            ids.push(r.read_u64("token_ids")?);
        }
        Ok(TokenIds::Flat(ids))
    }
}

/// Array layout (SGLang 0.5.18 and before): `[tag, field, field, ...]`.
fn read_array_event(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let len = r.read_array_len()?;
    if len == 0 {
        return Err(DecodeError::TooShort {
            what: "event",
            len,
            min: 1,
        });
    }
    let tag = r.read_str()?;
    // Elements consumed so far, tag included; the rest are skipped at the end.
    let mut used = 1;
    let event = match tag {
        "BlockStored" => {
            if len < 5 {
                return Err(DecodeError::TooShort {
                    what: "BlockStored",
                    len,
                    min: 5,
                });
            }
            let block_hashes = read_hashes(r)?;
            let parent_block_hash = read_opt_i64(r, "parent_block_hash")?;
            let token_ids = read_tokens(r)?;
            let block_size = read_block_size(r)?;
            used = 5;
            let mut lora_id = None;
            if len > used {
                lora_id = read_opt_i64(r, "lora_id")?;
                used += 1;
            }
            let mut medium = None;
            if len > used {
                medium = read_opt_str(r)?;
                used += 1;
            }
            // 0.5.18's BlockStoredWithMetadata: a map {"cache_salt": str}.
            let mut cache_salt = None;
            if len > used && r.next_is_map() {
                let entries = r.read_map_len()?;
                for _ in 0..entries {
                    if r.read_str()? == "cache_salt" {
                        cache_salt = read_opt_str(r)?;
                    } else {
                        r.skip_value()?;
                    }
                }
                used += 1;
            }
            KvEvent::BlockStored(BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                medium,
                cache_salt,
                session_id: None,
                lora_name: None,
            })
        }
        "BlockRemoved" => {
            if len < 2 {
                return Err(DecodeError::TooShort {
                    what: "BlockRemoved",
                    len,
                    min: 2,
                });
            }
            let block_hashes = read_hashes(r)?;
            used = 2;
            let mut medium = None;
            if len > used {
                medium = read_opt_str(r)?;
                used += 1;
            }
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes,
                medium,
            })
        }
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        other => KvEvent::Unknown {
            tag: other.to_owned(),
        },
    };
    for _ in used..len {
        r.skip_value()?;
    }
    Ok(event)
}

/// Fields a map-layout event may carry, gathered before the tag is known:
/// msgspec writes the tag first, but nothing requires a writer to.
#[derive(Default)]
struct MapFields {
    tag: Option<String>,
    block_hashes: Option<Vec<i64>>,
    parent_block_hash: Option<i64>,
    token_ids: Option<TokenIds>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<String>,
    cache_salt: Option<String>,
    session_id: Option<String>,
    lora_name: Option<String>,
}

/// Map layout (SGLang 0.5.23): `{"type": tag, field: value, ...}`.
fn read_map_event(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let entries = r.read_map_len()?;
    let mut f = MapFields::default();
    for _ in 0..entries {
        match r.read_str()? {
            "type" => f.tag = Some(r.read_str()?.to_owned()),
            "block_hashes" => f.block_hashes = Some(read_hashes(r)?),
            "parent_block_hash" => f.parent_block_hash = read_opt_i64(r, "parent_block_hash")?,
            "token_ids" => f.token_ids = Some(read_tokens(r)?),
            "block_size" => f.block_size = Some(read_block_size(r)?),
            "lora_id" => f.lora_id = read_opt_i64(r, "lora_id")?,
            "medium" => f.medium = read_opt_str(r)?,
            "cache_salt" => f.cache_salt = read_opt_str(r)?,
            "session_id" => f.session_id = read_opt_str(r)?,
            "lora_name" => f.lora_name = read_opt_str(r)?,
            _ => r.skip_value()?,
        }
    }
    let tag = f.tag.ok_or(DecodeError::MissingField {
        event: "event",
        field: "type",
    })?;
    Ok(match tag.as_str() {
        "BlockStored" => KvEvent::BlockStored(BlockStored {
            block_hashes: f.block_hashes.ok_or(DecodeError::MissingField {
                event: "BlockStored",
                field: "block_hashes",
            })?,
            parent_block_hash: f.parent_block_hash,
            token_ids: f.token_ids.ok_or(DecodeError::MissingField {
                event: "BlockStored",
                field: "token_ids",
            })?,
            block_size: f.block_size.ok_or(DecodeError::MissingField {
                event: "BlockStored",
                field: "block_size",
            })?,
            lora_id: f.lora_id,
            medium: f.medium,
            cache_salt: f.cache_salt,
            session_id: f.session_id,
            lora_name: f.lora_name,
        }),
        "BlockRemoved" => KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: f.block_hashes.ok_or(DecodeError::MissingField {
                event: "BlockRemoved",
                field: "block_hashes",
            })?,
            medium: f.medium,
        }),
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => KvEvent::Unknown { tag },
    })
}
