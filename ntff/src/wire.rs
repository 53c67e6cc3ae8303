//! The protobuf wire format, written by hand where the generated types would be slow
//! (the chunk codec's columns, the Perfetto encoder's packets) and read back by the
//! codec: keys, varints, fixed-width and length-delimited fields, and [`Wire`], a
//! reader of a message or packed column.

pub(crate) const WIRE_VARINT: u32 = 0;
pub(crate) const WIRE_FIXED64: u32 = 1;
pub(crate) const WIRE_BYTES: u32 = 2;
pub(crate) const WIRE_FIXED32: u32 = 5;

/// Appends `v` as a varint.
#[inline(always)]
pub(crate) fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// The bytes `v` takes as a varint.
pub(crate) fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

#[inline(always)]
pub(crate) fn put_key(buf: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(buf, u64::from(field << 3 | wire));
}

#[inline(always)]
pub(crate) fn put_varint_field(buf: &mut Vec<u8>, field: u32, value: u64) {
    put_key(buf, field, WIRE_VARINT);
    put_varint(buf, value);
}

pub(crate) fn put_fixed64_field(buf: &mut Vec<u8>, field: u32, value: u64) {
    put_key(buf, field, WIRE_FIXED64);
    buf.extend_from_slice(&value.to_le_bytes());
}

#[inline(always)]
pub(crate) fn put_bytes_field(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(buf, field, WIRE_BYTES);
    put_varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// A protobuf message or packed column being read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Wire<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Wire<'a> {
        Wire { buf, pos: 0 }
    }

    pub(crate) fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// The next varint, decoded without branching on its length when eight bytes are
    /// left to read (see `column`).
    #[inline(always)]
    pub(crate) fn packed(&mut self) -> Option<u64> {
        // One byte: most columns hold small deltas and ids, and then this branch is
        // predicted well.
        let b0 = *self.buf.get(self.pos)?;
        if b0 < 0x80 {
            self.pos += 1;
            return Some(u64::from(b0));
        }
        if let Some(window) = self.buf.get(self.pos..self.pos + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(window);
            let word = u64::from_le_bytes(word);
            let stops = !word & 0x8080_8080_8080_8080;
            if stops != 0 {
                let used = (stops.trailing_zeros() / 8 + 1) as usize;
                self.pos += used;
                return Some(pack7(word & (u64::MAX >> (64 - 8 * used))));
            }
        }
        self.varint()
    }

    #[inline(always)]
    pub(crate) fn varint(&mut self) -> Option<u64> {
        let b0 = *self.buf.get(self.pos)?;
        if b0 < 0x80 {
            self.pos += 1;
            return Some(u64::from(b0));
        }
        if let Some(&b1) = self.buf.get(self.pos + 1)
            && b1 < 0x80
        {
            self.pos += 2;
            return Some(u64::from(b0 & 0x7f) | u64::from(b1) << 7);
        }
        self.long_varint()
    }

    pub(crate) fn long_varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for k in 0..10 {
            let b = *self.buf.get(self.pos)?;
            self.pos += 1;
            // The tenth byte holds one bit; more is not a 64-bit varint.
            if k == 9 && b > 1 {
                return None;
            }
            value |= u64::from(b & 0x7f) << (7 * k);
            if b < 0x80 {
                return Some(value);
            }
        }
        None
    }

    pub(crate) fn key(&mut self) -> Option<(u32, u32)> {
        let key = u32::try_from(self.varint()?).ok()?;
        (key >> 3 != 0).then_some((key >> 3, key & 7))
    }

    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        let end = self.pos.checked_add(len)?;
        let bytes = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(bytes)
    }

    pub(crate) fn skip(&mut self, wire: u32) -> Option<()> {
        match wire {
            WIRE_VARINT => self.varint().map(drop),
            WIRE_FIXED64 => self.advance(8),
            WIRE_BYTES => self.bytes().map(drop),
            WIRE_FIXED32 => self.advance(4),
            _ => None,
        }
    }

    pub(crate) fn advance(&mut self, n: usize) -> Option<()> {
        let end = self.pos.checked_add(n)?;
        (end <= self.buf.len()).then(|| self.pos = end)
    }
}

/// Packs the 7-bit groups of the bytes of a varint of at most eight bytes (the bytes
/// after it zeroed) into its value.
#[inline(always)]
fn pack7(word: u64) -> u64 {
    let x = word & 0x7f7f_7f7f_7f7f_7f7f;
    let x = ((x & 0x7f00_7f00_7f00_7f00) >> 1) | (x & 0x007f_007f_007f_007f);
    let x = ((x & 0x3fff_0000_3fff_0000) >> 2) | (x & 0x0000_3fff_0000_3fff);
    ((x & 0x0fff_ffff_0000_0000) >> 4) | (x & 0x0000_0000_0fff_ffff)
}
