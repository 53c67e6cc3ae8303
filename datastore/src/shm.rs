//! A mapped datastore file seen as 64-bit and 32-bit atomic words.
//!
//! This is the only module that turns raw mapped memory into references. Everything
//! in a datastore file is read and written through atomics, because another process
//! may be writing (the runtime) or reading (the tools) the same bytes at any moment.
//! Accessors check bounds and alignment and panic on a violation: offsets come either
//! from this crate's layout arithmetic or from a header the reader validated first.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

/// The mapping behind a [`Region`]: writable for the runtime, read-only for readers.
#[derive(Debug)]
pub(crate) enum Mapping {
    ReadWrite(memmap2::MmapMut),
    ReadOnly(memmap2::Mmap),
}

/// A mapped file addressed by byte offsets.
#[derive(Debug)]
pub(crate) struct Region {
    ptr: *const u8,
    len: usize,
    _mapping: Mapping,
}

// SAFETY: the region is only ever accessed through atomic types, which are safe to share
// between threads; the pointer stays valid for as long as the mapping is owned.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    pub(crate) fn new(mapping: Mapping) -> Region {
        let (ptr, len) = match &mapping {
            Mapping::ReadWrite(m) => (m.as_ptr(), m.len()),
            Mapping::ReadOnly(m) => (m.as_ptr(), m.len()),
        };
        Region { ptr, len, _mapping: mapping }
    }

    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }

    /// The 64-bit word at `offset` (a multiple of 8).
    #[inline]
    pub(crate) fn u64(&self, offset: u64) -> &AtomicU64 {
        let offset = self.checked(offset, 8);
        // SAFETY: `checked` proved the word lies inside the mapping and is 8-byte aligned
        // (the mapping itself is page aligned); mapped memory lives as long as `self`,
        // and all accesses to it are atomic.
        unsafe { &*(self.ptr.add(offset) as *const AtomicU64) }
    }

    /// The 32-bit word at `offset` (a multiple of 4).
    #[inline]
    pub(crate) fn u32(&self, offset: u64) -> &AtomicU32 {
        let offset = self.checked(offset, 4);
        // SAFETY: as in `u64`, for a 4-byte aligned word.
        unsafe { &*(self.ptr.add(offset) as *const AtomicU32) }
    }

    /// The `N` consecutive 64-bit words at `offset` (a multiple of 8), checked once.
    #[inline]
    pub(crate) fn words<const N: usize>(&self, offset: u64) -> &[AtomicU64; N] {
        let offset = self.checked_span(offset, 8, 8 * N as u64);
        // SAFETY: as in `u64`, for `N` words: `[AtomicU64; N]` has the layout of `N`
        // consecutive aligned words.
        unsafe { &*(self.ptr.add(offset) as *const [AtomicU64; N]) }
    }

    fn byte(&self, offset: u64) -> &AtomicU8 {
        let offset = self.checked(offset, 1);
        // SAFETY: as in `u64`, for one byte.
        unsafe { &*(self.ptr.add(offset) as *const AtomicU8) }
    }

    /// Faults in, writable, the pages of `len` bytes at `offset` of a read-write
    /// mapping (`MADV_POPULATE_WRITE`) without changing their contents, so that the
    /// first store to each does not take a page fault. Best effort: kernels before
    /// 5.14 refuse, and the pages are then faulted in on first use as usual.
    pub(crate) fn prefault(&self, offset: u64, len: u64) {
        if let Mapping::ReadWrite(m) = &self._mapping {
            let end = (offset.saturating_add(len)).min(self.len as u64);
            if offset < end {
                let _ = m.advise_range(memmap2::Advice::PopulateWrite, offset as usize, (end - offset) as usize);
            }
        }
    }

    /// Copies `len` bytes out, one atomic load per byte (for short strings only).
    pub(crate) fn read_bytes(&self, offset: u64, len: u64) -> Vec<u8> {
        (offset..offset + len).map(|o| self.byte(o).load(Ordering::Relaxed)).collect()
    }

    /// Stores `bytes` at `offset`; only the runtime's read-write mapping calls this.
    pub(crate) fn write_bytes(&self, offset: u64, bytes: &[u8]) {
        for (o, &b) in (offset..).zip(bytes) {
            self.byte(o).store(b, Ordering::Relaxed);
        }
    }

    #[inline]
    fn checked(&self, offset: u64, size: u64) -> usize {
        self.checked_span(offset, size, size)
    }

    #[inline]
    fn checked_span(&self, offset: u64, align: u64, size: u64) -> usize {
        assert!(
            offset.is_multiple_of(align) && offset.checked_add(size).is_some_and(|end| end <= self.len as u64),
            "datastore access of {size} bytes at offset {offset} is outside the {}-byte mapping",
            self.len
        );
        offset as usize
    }
}
