//! A msgpack reader over a borrowed payload, for the KV-event hot path:
//! values are read in place (a string or byte string is a slice of the
//! payload), nothing is allocated, and any value can be skipped without
//! recursion. Truncated or reserved (`0xc1`) input is an error, never a panic.

/// The payload ended inside a value, or held the reserved byte `0xc1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// What a value is, read from its marker (and length bytes, consumed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind<'a> {
    Nil,
    Bool,
    /// Non-negative, any encoding.
    Uint(u64),
    /// Negative.
    Int(i64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    Ext,
}

#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes not read yet (a bound on how many values can follow).
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let end = self.pos.checked_add(n).ok_or(Malformed)?;
        let s = self.buf.get(self.pos..end).ok_or(Malformed)?;
        self.pos = end;
        Ok(s)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        let s = self.take(N)?;
        s.try_into().map_err(|_| Malformed)
    }

    fn len8(&mut self) -> Result<usize, Malformed> {
        Ok(usize::from(self.be::<1>()?[0]))
    }

    fn len16(&mut self) -> Result<usize, Malformed> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }

    fn len32(&mut self) -> Result<usize, Malformed> {
        usize::try_from(u32::from_be_bytes(self.be()?)).map_err(|_| Malformed)
    }

    /// The next marker byte, not consumed.
    pub fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// A non-negative integer below 2³² (a token id) by the short path, or
    /// `None` with nothing consumed: the caller falls back to [`Reader::next`].
    #[inline]
    pub fn small_uint(&mut self) -> Option<u32> {
        let rest = self.buf.get(self.pos..)?;
        let (v, n) = match *rest {
            [b, ..] if b < 0x80 => (u32::from(b), 1),
            [0xcc, b, ..] => (u32::from(b), 2),
            [0xcd, b0, b1, ..] => (u32::from(u16::from_be_bytes([b0, b1])), 3),
            [0xce, b0, b1, b2, b3, ..] => (u32::from_be_bytes([b0, b1, b2, b3]), 5),
            _ => return None,
        };
        self.pos += n;
        Some(v)
    }

    /// Read one value's head: scalars whole, strings and byte strings with
    /// their bytes, arrays and maps only their length (their items follow).
    pub fn next(&mut self) -> Result<Kind<'a>, Malformed> {
        let m = self.be::<1>()?[0];
        Ok(match m {
            0x00..=0x7f => Kind::Uint(u64::from(m)),
            0x80..=0x8f => Kind::Map(usize::from(m & 0x0f)),
            0x90..=0x9f => Kind::Array(usize::from(m & 0x0f)),
            0xa0..=0xbf => Kind::Str(self.take(usize::from(m & 0x1f))?),
            0xc0 => Kind::Nil,
            0xc1 => return Err(Malformed),
            0xc2 | 0xc3 => Kind::Bool,
            0xc4 => {
                let n = self.len8()?;
                Kind::Bin(self.take(n)?)
            }
            0xc5 => {
                let n = self.len16()?;
                Kind::Bin(self.take(n)?)
            }
            0xc6 => {
                let n = self.len32()?;
                Kind::Bin(self.take(n)?)
            }
            0xc7 => {
                let n = self.len8()?;
                self.take(n + 1)?;
                Kind::Ext
            }
            0xc8 => {
                let n = self.len16()?;
                self.take(n + 1)?;
                Kind::Ext
            }
            0xc9 => {
                let n = self.len32()?;
                self.take(n.checked_add(1).ok_or(Malformed)?)?;
                Kind::Ext
            }
            0xca => Kind::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Kind::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Kind::Uint(u64::from(self.be::<1>()?[0])),
            0xcd => Kind::Uint(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Kind::Uint(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Kind::Uint(u64::from_be_bytes(self.be()?)),
            0xd0 => signed(i64::from(i8::from_be_bytes(self.be()?))),
            0xd1 => signed(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => signed(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => signed(i64::from_be_bytes(self.be()?)),
            0xd4 => {
                self.take(2)?;
                Kind::Ext
            }
            0xd5 => {
                self.take(3)?;
                Kind::Ext
            }
            0xd6 => {
                self.take(5)?;
                Kind::Ext
            }
            0xd7 => {
                self.take(9)?;
                Kind::Ext
            }
            0xd8 => {
                self.take(17)?;
                Kind::Ext
            }
            0xd9 => {
                let n = self.len8()?;
                Kind::Str(self.take(n)?)
            }
            0xda => {
                let n = self.len16()?;
                Kind::Str(self.take(n)?)
            }
            0xdb => {
                let n = self.len32()?;
                Kind::Str(self.take(n)?)
            }
            0xdc => Kind::Array(self.len16()?),
            0xdd => Kind::Array(self.len32()?),
            0xde => Kind::Map(self.len16()?),
            0xdf => Kind::Map(self.len32()?),
            0xe0..=0xff => Kind::Int(i64::from(m as i8)),
        })
    }

    /// Skip one whole value (items of arrays and maps included), iteratively:
    /// each item takes at least a byte, so this ends within the payload.
    pub fn skip(&mut self) -> Result<(), Malformed> {
        let mut pending: usize = 1;
        while pending > 0 {
            pending -= 1;
            match self.next()? {
                Kind::Array(n) => pending = pending.checked_add(n).ok_or(Malformed)?,
                Kind::Map(n) => {
                    let items = n.checked_mul(2).ok_or(Malformed)?;
                    pending = pending.checked_add(items).ok_or(Malformed)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The bytes of the next value, skipped.
    pub fn value(&mut self) -> Result<&'a [u8], Malformed> {
        let start = self.pos;
        self.skip()?;
        self.buf.get(start..self.pos).ok_or(Malformed)
    }
}

/// A signed encoding may carry a non-negative number.
fn signed(v: i64) -> Kind<'static> {
    match u64::try_from(v) {
        Ok(u) => Kind::Uint(u),
        Err(_) => Kind::Int(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_encoding_of_an_integer_and_truncation() {
        let cases: &[(&[u8], Kind<'_>)] = &[
            (&[0x05], Kind::Uint(5)),
            (&[0xff], Kind::Int(-1)),
            (&[0xcd, 0x01, 0x00], Kind::Uint(256)),
            (&[0xd0, 0x05], Kind::Uint(5)),
            (&[0xd1, 0xff, 0xfe], Kind::Int(-2)),
            (
                &[0xcf, 0xff, 0, 0, 0, 0, 0, 0, 1],
                Kind::Uint(0xff00_0000_0000_0001),
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(Reader::new(bytes).next(), Ok(*want), "{bytes:?}");
        }
        assert_eq!(Reader::new(&[0xcd, 0x01]).next(), Err(Malformed));
        assert_eq!(Reader::new(&[0xc1]).next(), Err(Malformed));
        // An array that claims more items than there are bytes.
        assert_eq!(
            Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff, 1]).skip(),
            Err(Malformed)
        );
        let mut r = Reader::new(&[0x92, 0xa1, b'x', 0x81, 0x01, 0xc0, 0x07]);
        assert_eq!(r.value(), Ok(&[0x92, 0xa1, b'x', 0x81, 0x01, 0xc0][..]));
        assert_eq!(r.next(), Ok(Kind::Uint(7)));
    }
}
