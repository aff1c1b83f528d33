//! A bounds-checked msgpack cursor over a byte slice, on `rmp`'s low-level
//! decoder.
//!
//! `rmp::decode` does the format work: marker classification
//! ([`rmp::Marker`]), integer and float widths with their range checks, and
//! every length prefix, all reading from an [`rmp::decode::Bytes`] that
//! cannot read past the slice. What remains here is what `rmp` leaves to its
//! caller, held to what untrusted input needs:
//!
//! * mapping `rmp`'s errors into [`DecodeError`], with byte offsets;
//! * borrowing string bytes as `&str` and stepping over payloads (`rmp`'s
//!   readers copy into caller buffers instead);
//! * [`Reader::capacity_for`]: a container's claimed length never drives an
//!   up-front allocation larger than the bytes left;
//! * [`Reader::skip_value`]: iterative, so nesting depth cannot exhaust the
//!   stack. `rmp::decode::MessageLen` (0.8.15) cannot stand in for it: it
//!   panics (`todo!()`) on ext values and recurses into containers.
//!
//! Not `rmpv` or `rmp-serde`: the decoder reads two layouts leniently (see
//! [`crate::decode`]) straight into its types, and a generic value tree would
//! be built only to be walked again.

use crate::error::DecodeError;
use rmp::decode::bytes::BytesReadError;
use rmp::decode::{self, Bytes, NumValueReadError, ValueReadError};
use rmp::Marker;

/// A cursor over one msgpack document.
pub(crate) struct Reader<'a> {
    rd: Bytes<'a>,
    /// Length of the whole document, to turn what is left into an offset.
    len: usize,
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
        Reader {
            rd: Bytes::new(buf),
            len: buf.len(),
        }
    }

    /// Current offset, for error messages.
    pub(crate) fn pos(&self) -> usize {
        self.len.saturating_sub(self.remaining())
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.rd.remaining_slice().len()
    }

    /// A safe initial capacity for a container claiming `len` elements: never
    /// more than the bytes left, since each element is at least one byte.
    pub(crate) fn capacity_for(&self, len: usize) -> usize {
        len.min(self.remaining())
    }

    /// `rmp`'s reader fails without consuming when bytes run out, so the
    /// current offset is where more were needed.
    fn truncated(&self) -> DecodeError {
        DecodeError::Truncated { at: self.pos() }
    }

    /// Map an `rmp` error for a value of type `expected` (stored in `field`)
    /// whose marker sits at `at`. `rmp` converts its plain value errors into
    /// the integer ones, whose extra case, `OutOfRange`, means the value did
    /// not fit the type asked for.
    fn err(
        &self,
        e: impl Into<NumValueReadError<BytesReadError>>,
        expected: &'static str,
        field: &'static str,
        at: usize,
    ) -> DecodeError {
        match e.into() {
            NumValueReadError::TypeMismatch(m) => DecodeError::UnexpectedType {
                expected,
                marker: m.to_u8(),
                at,
            },
            NumValueReadError::OutOfRange => DecodeError::IntOutOfRange { field, at },
            NumValueReadError::InvalidMarkerRead(_) | NumValueReadError::InvalidDataRead(_) => {
                self.truncated()
            }
        }
    }

    /// Step over `n` payload bytes.
    fn advance(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let rest = self.rd.remaining_slice();
        let (taken, tail) = rest.split_at_checked(n).ok_or_else(|| self.truncated())?;
        // `Bytes` has no skip; a fresh one over the tail is the same cursor
        // (its own position is unused: offsets come from `len`).
        self.rd = Bytes::new(tail);
        Ok(taken)
    }

    /// The next marker, without consuming it.
    pub(crate) fn peek(&self) -> Result<Marker, DecodeError> {
        let mut probe = self.rd;
        decode::read_marker(&mut probe).map_err(|_| self.truncated())
    }

    /// Whether the next value is of the type `read` reads: `read` runs on a
    /// copy of the cursor, and only a type mismatch answers no (a truncated
    /// header still opens that type; reading it for real reports where).
    fn next_is<T>(
        &self,
        read: impl FnOnce(&mut Bytes<'a>) -> Result<T, ValueReadError<BytesReadError>>,
    ) -> bool {
        let mut probe = self.rd;
        !matches!(read(&mut probe), Err(ValueReadError::TypeMismatch(_)))
    }

    /// Whether an array comes next.
    pub(crate) fn next_is_array(&self) -> bool {
        self.next_is(decode::read_array_len)
    }

    /// Whether a map comes next.
    pub(crate) fn next_is_map(&self) -> bool {
        self.next_is(decode::read_map_len)
    }

    /// Whether an integer comes next.
    pub(crate) fn next_is_int(&self) -> bool {
        let mut probe = self.rd;
        !matches!(
            decode::read_int::<f64, _>(&mut probe),
            Err(NumValueReadError::TypeMismatch(_))
        )
    }

    /// A `u32` length as `usize`. On 16-bit targets it may not fit; such a
    /// length necessarily overruns the input, so it is reported as truncated.
    fn len_usize(&self, n: u32) -> Result<usize, DecodeError> {
        usize::try_from(n).map_err(|_| self.truncated())
    }

    /// Read an array header and return its element count.
    pub(crate) fn read_array_len(&mut self) -> Result<usize, DecodeError> {
        let at = self.pos();
        let n =
            decode::read_array_len(&mut self.rd).map_err(|e| self.err(e, "array", "array", at))?;
        self.len_usize(n)
    }

    /// Read a map header and return its entry count.
    pub(crate) fn read_map_len(&mut self) -> Result<usize, DecodeError> {
        let at = self.pos();
        let n = decode::read_map_len(&mut self.rd).map_err(|e| self.err(e, "map", "map", at))?;
        self.len_usize(n)
    }

    /// Read a string's header and step over its bytes, UTF-8 or not.
    fn read_str_bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let at = self.pos();
        let n =
            decode::read_str_len(&mut self.rd).map_err(|e| self.err(e, "string", "string", at))?;
        let n = self.len_usize(n)?;
        self.advance(n)
    }

    /// Read a UTF-8 string, borrowed from the input.
    pub(crate) fn read_str(&mut self) -> Result<&'a str, DecodeError> {
        let at = self.pos();
        let bytes = self.read_str_bytes()?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8 { at })
    }

    /// Read an integer of any width, keeping the family it was written in.
    pub(crate) fn read_int(&mut self) -> Result<Int, DecodeError> {
        let at = self.pos();
        let unsigned = matches!(
            self.peek()?,
            Marker::FixPos(_) | Marker::U8 | Marker::U16 | Marker::U32 | Marker::U64
        );
        // Within its own family every value fits the 64-bit type, so
        // `OutOfRange` cannot occur; it is mapped all the same.
        let int = if unsigned {
            decode::read_int(&mut self.rd).map(Int::Unsigned)
        } else {
            decode::read_int(&mut self.rd).map(Int::Signed)
        };
        int.map_err(|e| self.err(e, "integer", "integer", at))
    }

    /// Read an integer that must fit an `i64` (block hashes, lora ids).
    pub(crate) fn read_i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        let at = self.pos();
        decode::read_int(&mut self.rd).map_err(|e| self.err(e, "integer", field, at))
    }

    /// Read a non-negative integer (token ids, sizes).
    pub(crate) fn read_u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let at = self.pos();
        decode::read_int(&mut self.rd).map_err(|e| self.err(e, "integer", field, at))
    }

    /// Read a float; integers are accepted too, as a lenient reading of a
    /// timestamp written by something other than Python's float.
    pub(crate) fn read_f64(&mut self) -> Result<f64, DecodeError> {
        let at = self.pos();
        match self.peek()? {
            Marker::F32 => decode::read_f32(&mut self.rd)
                .map(f64::from)
                .map_err(|e| self.err(e, "float", "float", at)),
            Marker::F64 => {
                decode::read_f64(&mut self.rd).map_err(|e| self.err(e, "float", "float", at))
            }
            // Any integer, converted as `as f64` does (rounding above 2^53).
            _ => decode::read_int::<f64, _>(&mut self.rd)
                .map_err(|e| self.err(e, "float", "float", at)),
        }
    }

    /// Consume a nil if one is next; report whether it was.
    pub(crate) fn read_nil(&mut self) -> Result<bool, DecodeError> {
        let mut probe = self.rd;
        match decode::read_nil(&mut probe) {
            Ok(()) => {
                self.rd = probe;
                Ok(true)
            }
            Err(ValueReadError::TypeMismatch(_)) => Ok(false),
            Err(_) => Err(self.truncated()),
        }
    }

    /// Skip one complete value of any type, including nested containers.
    ///
    /// Iterative: `pending` counts the values still to skip, and a container
    /// adds its children to it. Every value consumes at least one byte, so
    /// the loop ends within `remaining()` iterations whatever the headers
    /// claim. Each type is read by `rmp`'s reader for it.
    pub(crate) fn skip_value(&mut self) -> Result<(), DecodeError> {
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            let at = self.pos();
            match self.peek()? {
                Marker::Null | Marker::True | Marker::False => {
                    self.advance(1)?;
                }
                Marker::F32 | Marker::F64 => {
                    self.read_f64()?;
                }
                // Skipped strings need not be UTF-8: only their length matters.
                Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                    self.read_str_bytes()?;
                }
                Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                    let n = decode::read_bin_len(&mut self.rd)
                        .map_err(|e| self.err(e, "binary", "binary", at))?;
                    self.advance(self.len_usize(n)?)?;
                }
                Marker::FixExt1
                | Marker::FixExt2
                | Marker::FixExt4
                | Marker::FixExt8
                | Marker::FixExt16
                | Marker::Ext8
                | Marker::Ext16
                | Marker::Ext32 => {
                    // Reads the length and the type byte; the data follows.
                    let meta = decode::read_ext_meta(&mut self.rd)
                        .map_err(|e| self.err(e, "ext", "ext", at))?;
                    self.advance(self.len_usize(meta.size)?)?;
                }
                Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => {
                    let n = self.read_array_len()?;
                    pending = pending.saturating_add(n as u64);
                }
                Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => {
                    let n = self.read_map_len()?;
                    pending = pending.saturating_add((n as u64).saturating_mul(2));
                }
                m @ Marker::Reserved => {
                    return Err(DecodeError::UnexpectedType {
                        expected: "a msgpack value",
                        marker: m.to_u8(),
                        at,
                    })
                }
                // What is left are the integers.
                _ => {
                    self.read_int()?;
                }
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
    fn skip_reads_every_type_rmp_knows() {
        // [true, 1.5f32, bin8 "ab", fixext1, ext8 of 2 bytes, str8 of 0xff
        // (not UTF-8), -1] then 0x07.
        let bytes = [
            0x97, 0xc3, 0xca, 0x3f, 0xc0, 0, 0, 0xc4, 2, b'a', b'b', 0xd4, 0x01, 0x00, 0xc7, 2,
            0x05, 0xaa, 0xbb, 0xd9, 1, 0xff, 0xff, 0x07,
        ];
        let mut r = Reader::new(&bytes);
        r.skip_value().unwrap();
        assert_eq!(r.remaining(), 1);
        // 0xc1 is never a value.
        let mut r = Reader::new(&[0xc1]);
        assert!(matches!(
            r.skip_value(),
            Err(DecodeError::UnexpectedType {
                marker: 0xc1,
                at: 0,
                ..
            })
        ));
        // An ext8 claiming more data than follows.
        let mut r = Reader::new(&[0xc7, 9, 0x05, 0x00]);
        assert_eq!(r.skip_value(), Err(DecodeError::Truncated { at: 3 }));
    }

    #[test]
    fn nil_probe_and_lenient_float() {
        let mut r = Reader::new(&[0x05, 0xc0]);
        assert!(!r.read_nil().unwrap());
        assert_eq!(r.pos(), 0);
        assert_eq!(r.read_f64().unwrap(), 5.0);
        assert!(r.read_nil().unwrap());
        assert_eq!(r.remaining(), 0);
        let mut r = Reader::new(&[0xa1, b'x']);
        assert!(matches!(
            r.read_f64(),
            Err(DecodeError::UnexpectedType {
                expected: "float",
                marker: 0xa1,
                at: 0
            })
        ));
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
