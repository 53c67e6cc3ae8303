//! The append-only string table: names referenced from fixed-size records by id.
//!
//! An entry is a `u32` length plus one (zero while unpublished), four bytes of
//! padding, and the UTF-8 bytes padded to 8. An id is the entry's word offset plus
//! one, so id 0 means "no string". The writer interns (one entry per distinct string,
//! under a mutex, off the hot path: at load and allocation time); when the table is
//! full it returns id 0 and counts the string as dropped.

use std::sync::atomic::Ordering;

use crate::shm::Region;

/// Longest string stored; longer ones are cut at a character boundary.
pub const MAX_STRING_BYTES: usize = 1024;

/// Word offsets in the string table header.
const USED: u64 = 0;
const COUNT: u64 = 8;
pub(crate) const DROPPED: u64 = 16;
const HEADER_BYTES: u64 = 64;

#[derive(Debug, Clone, Copy)]
pub(crate) struct StringTable {
    pub(crate) base: u64,
    pub(crate) capacity: u64,
}

impl StringTable {
    /// Appends `text`; returns its id, or 0 when the table is full. Callers serialise.
    pub(crate) fn append(&self, region: &Region, text: &str) -> u32 {
        let mut end = text.len().min(MAX_STRING_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let bytes = &text.as_bytes()[..end];
        let need = 8 + (bytes.len() as u64).div_ceil(8) * 8;
        let used = region.u64(self.base + USED);
        let offset = used.load(Ordering::Relaxed);
        let id = offset / 8 + 1;
        if offset + need > self.capacity || id > u64::from(u32::MAX) {
            region.u64(self.base + DROPPED).fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        let entry = self.base + HEADER_BYTES + offset;
        region.write_bytes(entry + 8, bytes);
        region.u32(entry).store(bytes.len() as u32 + 1, Ordering::Release);
        used.store(offset + need, Ordering::Release);
        region.u64(self.base + COUNT).fetch_add(1, Ordering::Relaxed);
        id as u32
    }

    /// The string with id `id`, if it exists and is published.
    pub(crate) fn get(&self, region: &Region, id: u32) -> Option<String> {
        let offset = (u64::from(id).checked_sub(1)?) * 8;
        if offset + 8 > self.capacity {
            return None;
        }
        let entry = self.base + HEADER_BYTES + offset;
        let len = u64::from(region.u32(entry).load(Ordering::Acquire).checked_sub(1)?);
        if len > MAX_STRING_BYTES as u64 || offset + 8 + len > self.capacity {
            return None;
        }
        Some(String::from_utf8_lossy(&region.read_bytes(entry + 8, len)).into_owned())
    }

    pub(crate) fn dropped(&self, region: &Region) -> u64 {
        region.u64(self.base + DROPPED).load(Ordering::Relaxed)
    }
}
