//! A small bounds-checked msgpack reader over a byte slice.
//!
//! Hand-written rather than a generic `Value` decoder because the input is
//! untrusted: every read is checked against the slice (no indexing that can
//! panic), container lengths never drive an up-front allocation larger than
//! the bytes left (each element takes at least one byte), and skipping an
//! unknown value is iterative, so nesting depth cannot exhaust the stack.

use crate::error::DecodeError;

/// The msgpack type family a marker byte opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Nil,
    Bool,
    Int,
    Float,
    Str,
    Bin,
    Array,
    Map,
    Ext,
    /// 0xc1, which the spec never uses.
    Reserved,
}

/// Classify a marker byte.
pub(crate) fn kind_of(marker: u8) -> Kind {
    match marker {
        0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => Kind::Int,
        0x80..=0x8f | 0xde | 0xdf => Kind::Map,
        0x90..=0x9f | 0xdc | 0xdd => Kind::Array,
        0xa0..=0xbf | 0xd9..=0xdb => Kind::Str,
        0xc0 => Kind::Nil,
        0xc2 | 0xc3 => Kind::Bool,
        0xc4..=0xc6 => Kind::Bin,
        0xca | 0xcb => Kind::Float,
        0xc7..=0xc9 | 0xd4..=0xd8 => Kind::Ext,
        0xc1 => Kind::Reserved,
    }
}

/// A cursor over one msgpack document.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// An integer as msgpack stores it: the uint family reaches `u64::MAX`, the
/// int family `i64::MIN`, so neither Rust type holds both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Int {
    Unsigned(u64),
    Signed(i64),
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Current offset, for error messages.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// A safe initial capacity for a container claiming `len` elements: never
    /// more than the bytes left, since each element is at least one byte.
    pub(crate) fn capacity_for(&self, len: usize) -> usize {
        len.min(self.remaining())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(DecodeError::Truncated { at: self.pos })?;
        let out = self
            .buf
            .get(self.pos..end)
            .ok_or(DecodeError::Truncated { at: self.pos })?;
        self.pos = end;
        Ok(out)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let bytes = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    /// The next marker byte, without consuming it.
    pub(crate) fn peek(&self) -> Result<u8, DecodeError> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or(DecodeError::Truncated { at: self.pos })
    }

    fn next_marker(&mut self) -> Result<u8, DecodeError> {
        let m = self.peek()?;
        self.pos += 1;
        Ok(m)
    }

    fn unexpected(&self, expected: &'static str, marker: u8, at: usize) -> DecodeError {
        DecodeError::UnexpectedType {
            expected,
            marker,
            at,
        }
    }

    fn read_be_len<const N: usize>(&mut self) -> Result<usize, DecodeError> {
        let bytes = self.take_array::<N>()?;
        let mut v: u64 = 0;
        for b in bytes {
            v = (v << 8) | u64::from(b);
        }
        // On 32-bit targets a 4-byte length can still exceed usize; treat it
        // as truncated input, which it necessarily is.
        usize::try_from(v).map_err(|_| DecodeError::Truncated { at: self.pos })
    }

    /// Read an array header and return its element count.
    pub(crate) fn read_array_len(&mut self) -> Result<usize, DecodeError> {
        let at = self.pos;
        let m = self.next_marker()?;
        match m {
            0x90..=0x9f => Ok(usize::from(m & 0x0f)),
            0xdc => self.read_be_len::<2>(),
            0xdd => self.read_be_len::<4>(),
            _ => Err(self.unexpected("array", m, at)),
        }
    }

    /// Read a map header and return its entry count.
    pub(crate) fn read_map_len(&mut self) -> Result<usize, DecodeError> {
        let at = self.pos;
        let m = self.next_marker()?;
        match m {
            0x80..=0x8f => Ok(usize::from(m & 0x0f)),
            0xde => self.read_be_len::<2>(),
            0xdf => self.read_be_len::<4>(),
            _ => Err(self.unexpected("map", m, at)),
        }
    }

    /// Read a UTF-8 string.
    pub(crate) fn read_str(&mut self) -> Result<&'a str, DecodeError> {
        let at = self.pos;
        let m = self.next_marker()?;
        let len = match m {
            0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => self.read_be_len::<1>()?,
            0xda => self.read_be_len::<2>()?,
            0xdb => self.read_be_len::<4>()?,
            _ => return Err(self.unexpected("string", m, at)),
        };
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8 { at })
    }

    /// Read an integer of any width.
    pub(crate) fn read_int(&mut self) -> Result<Int, DecodeError> {
        let at = self.pos;
        let m = self.next_marker()?;
        Ok(match m {
            0x00..=0x7f => Int::Unsigned(u64::from(m)),
            // Negative fixint: the byte is the two's-complement value.
            0xe0..=0xff => Int::Signed(i64::from(m as i8)),
            0xcc => Int::Unsigned(u64::from(u8::from_be_bytes(self.take_array()?))),
            0xcd => Int::Unsigned(u64::from(u16::from_be_bytes(self.take_array()?))),
            0xce => Int::Unsigned(u64::from(u32::from_be_bytes(self.take_array()?))),
            0xcf => Int::Unsigned(u64::from_be_bytes(self.take_array()?)),
            0xd0 => Int::Signed(i64::from(i8::from_be_bytes(self.take_array()?))),
            0xd1 => Int::Signed(i64::from(i16::from_be_bytes(self.take_array()?))),
            0xd2 => Int::Signed(i64::from(i32::from_be_bytes(self.take_array()?))),
            0xd3 => Int::Signed(i64::from_be_bytes(self.take_array()?)),
            _ => return Err(self.unexpected("integer", m, at)),
        })
    }

    /// Read an integer that must fit an `i64` (block hashes, lora ids).
    pub(crate) fn read_i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        let at = self.pos;
        match self.read_int()? {
            Int::Signed(v) => Ok(v),
            Int::Unsigned(v) => {
                i64::try_from(v).map_err(|_| DecodeError::IntOutOfRange { field, at })
            }
        }
    }

    /// Read a non-negative integer (token ids, sizes).
    pub(crate) fn read_u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let at = self.pos;
        match self.read_int()? {
            Int::Unsigned(v) => Ok(v),
            Int::Signed(v) => {
                u64::try_from(v).map_err(|_| DecodeError::IntOutOfRange { field, at })
            }
        }
    }

    /// Read a float; integers are accepted too, as a lenient reading of a
    /// timestamp written by something other than Python's float.
    pub(crate) fn read_f64(&mut self) -> Result<f64, DecodeError> {
        let at = self.pos;
        let m = self.peek()?;
        match m {
            0xca => {
                self.pos += 1;
                Ok(f64::from(f32::from_be_bytes(self.take_array()?)))
            }
            0xcb => {
                self.pos += 1;
                Ok(f64::from_be_bytes(self.take_array()?))
            }
            _ if kind_of(m) == Kind::Int => Ok(match self.read_int()? {
                Int::Unsigned(v) => v as f64,
                Int::Signed(v) => v as f64,
            }),
            _ => Err(self.unexpected("float", m, at)),
        }
    }

    /// Consume a nil if one is next; report whether it was.
    pub(crate) fn read_nil(&mut self) -> Result<bool, DecodeError> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Skip one complete value of any type, including nested containers.
    ///
    /// Iterative: `pending` counts the values still to skip, and a container
    /// adds its children to it. Every value consumes at least one byte, so
    /// the loop ends within `remaining()` iterations whatever the headers
    /// claim.
    pub(crate) fn skip_value(&mut self) -> Result<(), DecodeError> {
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            let at = self.pos;
            let m = self.peek()?;
            match kind_of(m) {
                Kind::Nil | Kind::Bool => self.pos += 1,
                Kind::Int => {
                    self.read_int()?;
                }
                Kind::Float => {
                    self.read_f64()?;
                }
                Kind::Str => {
                    // Skipped strings need not be UTF-8: only their length matters.
                    self.pos += 1;
                    let len = match m {
                        0xa0..=0xbf => usize::from(m & 0x1f),
                        0xd9 => self.read_be_len::<1>()?,
                        0xda => self.read_be_len::<2>()?,
                        _ => self.read_be_len::<4>()?,
                    };
                    self.take(len)?;
                }
                Kind::Bin => {
                    self.pos += 1;
                    let len = match m {
                        0xc4 => self.read_be_len::<1>()?,
                        0xc5 => self.read_be_len::<2>()?,
                        _ => self.read_be_len::<4>()?,
                    };
                    self.take(len)?;
                }
                Kind::Ext => {
                    self.pos += 1;
                    let len = match m {
                        0xd4 => 1,
                        0xd5 => 2,
                        0xd6 => 4,
                        0xd7 => 8,
                        0xd8 => 16,
                        0xc7 => self.read_be_len::<1>()?,
                        0xc8 => self.read_be_len::<2>()?,
                        _ => self.read_be_len::<4>()?,
                    };
                    // One type byte, then the data.
                    self.take(len.saturating_add(1))?;
                }
                Kind::Array => {
                    let n = self.read_array_len()?;
                    pending = pending.saturating_add(n as u64);
                }
                Kind::Map => {
                    let n = self.read_map_len()?;
                    pending = pending.saturating_add((n as u64).saturating_mul(2));
                }
                Kind::Reserved => return Err(self.unexpected("a msgpack value", m, at)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_of_every_width_decode() {
        let cases: &[(&[u8], Int)] = &[
            (&[0x05], Int::Unsigned(5)),
            (&[0xfb], Int::Signed(-5)),
            (&[0xcd, 0x01, 0x2c], Int::Unsigned(300)),
            (&[0xd0, 0x9c], Int::Signed(-100)),
            (
                &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                Int::Unsigned(u64::MAX),
            ),
            (&[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], Int::Signed(i64::MIN)),
        ];
        for (bytes, want) in cases {
            let mut r = Reader::new(bytes);
            assert_eq!(r.read_int().unwrap(), *want, "{bytes:02x?}");
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn u64_above_i64_max_is_out_of_range_for_hashes() {
        let mut r = Reader::new(&[0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            r.read_i64("block_hashes"),
            Err(DecodeError::IntOutOfRange { .. })
        ));
    }

    #[test]
    fn huge_array_header_is_bounded_by_input() {
        // array32 claiming 2^32-1 elements with two bytes behind it.
        let mut r = Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02]);
        let n = r.read_array_len().unwrap();
        assert_eq!(n, 0xffff_ffff);
        assert_eq!(r.capacity_for(n), 2);
    }

    #[test]
    fn skip_handles_nesting_and_reports_truncation() {
        // [[1, {"a": nil}], "xy"] followed by 0x07.
        let bytes = [
            0x92, 0x92, 0x01, 0x81, 0xa1, b'a', 0xc0, 0xa2, b'x', b'y', 0x07,
        ];
        let mut r = Reader::new(&bytes);
        r.skip_value().unwrap();
        assert_eq!(r.remaining(), 1);
        // A map claiming 15 entries with one present.
        let mut r = Reader::new(&[0x8f, 0x01, 0x02]);
        assert!(matches!(r.skip_value(), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn deep_nesting_does_not_recurse() {
        // 100k nested single-element arrays around a nil.
        let mut bytes = vec![0x91u8; 100_000];
        bytes.push(0xc0);
        let mut r = Reader::new(&bytes);
        r.skip_value().unwrap();
        assert_eq!(r.remaining(), 0);
    }
}
