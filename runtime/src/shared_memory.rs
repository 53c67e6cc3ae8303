//! Memory of this process that processes of its host may map: anonymous shared memory
//! (`memfd`), in no directory, so nothing is left behind however a process ends.
//!
//! A file starts with a header page (magic, owner pid, id, a word the owner sets when
//! it lets the memory go), then its bytes. A peer finds it through
//! `/proc/<pid>/fd/<n>` (the kernel lets only this user's processes open it) and maps
//! it only after checking that it is this user's, of the size said, and the file the
//! owner named: the magic, pid and id of its header. Device tensors of a process in a
//! job of several processes live here (see `collectives/world/lending.rs`), so that
//! the ranks of its host read them where they lie.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use memmap2::{Mmap, MmapMut, MmapOptions};
use serde::{Deserialize, Serialize};

/// The header page before the bytes (which are therefore page-aligned).
pub(crate) const HEADER: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"NVSHARED");
const WORD_MAGIC: usize = 0;
const WORD_PID: usize = 8;
const WORD_ID: usize = 16;
const WORD_RELEASED: usize = 24;
/// The most files a process holds at once: each is a descriptor, which the process
/// needs for other things too.
const MAX_FILES: usize = 256;

/// How many files this process holds.
static FILES: AtomicUsize = AtomicUsize::new(0);

/// Where some bytes of a process's shared memory lie, as a peer is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SharedPlace {
    pub(crate) pid: u32,
    pub(crate) id: u64,
    pub(crate) fd: i32,
    /// The whole file's length (header included).
    pub(crate) file_len: u64,
    /// The bytes' offset in the file, and their length.
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// Shared memory of this process: `len` bytes after the header, zero-filled lazily as
/// an anonymous mapping is.
#[derive(Debug)]
pub(crate) struct SharedMemory {
    id: u64,
    fd: OwnedFd,
    map: MmapMut,
}

impl SharedMemory {
    /// `len` bytes, unless the process holds [`MAX_FILES`] already (or the kernel
    /// refuses).
    pub(crate) fn create(name: &str, id: u64, len: usize) -> io::Result<SharedMemory> {
        if FILES.fetch_add(1, Ordering::Relaxed) >= MAX_FILES {
            FILES.fetch_sub(1, Ordering::Relaxed);
            return Err(io::Error::other(format!("this process holds {MAX_FILES} already")));
        }
        let created = Self::create_file(name, id, len);
        if created.is_err() {
            FILES.fetch_sub(1, Ordering::Relaxed);
        }
        created
    }

    fn create_file(name: &str, id: u64, len: usize) -> io::Result<SharedMemory> {
        let fd = nix::sys::memfd::memfd_create(name, nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
        let file_len = HEADER.checked_add(len).ok_or_else(|| io::Error::other("too large"))?;
        let file = File::from(fd.try_clone()?);
        file.set_len(file_len as u64)?;
        // SAFETY: the memory is this process's; peers map it read-only.
        let map = unsafe { MmapOptions::new().len(file_len).map_mut(&file)? };
        let memory = SharedMemory { id, fd, map };
        memory.word(WORD_MAGIC).store(MAGIC, Ordering::Relaxed);
        memory.word(WORD_PID).store(u64::from(std::process::id()), Ordering::Relaxed);
        memory.word(WORD_ID).store(id, Ordering::Release);
        Ok(memory)
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: an 8-aligned word of the header page, inside the mapping, only ever
        // accessed atomically.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map[HEADER..]
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map[HEADER..]
    }

    /// The place of `len` bytes from `offset` of the bytes.
    pub(crate) fn place(&self, offset: u64, len: u64) -> SharedPlace {
        SharedPlace {
            pid: std::process::id(),
            id: self.id,
            fd: self.fd.as_raw_fd(),
            file_len: self.map.len() as u64,
            offset: HEADER as u64 + offset,
            len,
        }
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // Peers that still map the file let it go at their next look.
        self.word(WORD_RELEASED).store(1, Ordering::Release);
        FILES.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Shared memory of a peer process, mapped here read-only.
#[derive(Debug)]
pub(crate) struct PeerMemory {
    pid: u32,
    id: u64,
    map: Mmap,
}

impl PeerMemory {
    /// Maps the file `place` names, after checking that it is this user's, of the size
    /// said, and the one its owner made under that id, with the place inside it.
    pub(crate) fn open(place: SharedPlace) -> io::Result<PeerMemory> {
        use std::os::unix::fs::MetadataExt;
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
        let end = place.offset.checked_add(place.len);
        if place.offset < HEADER as u64 || end.is_none_or(|end| end > place.file_len) {
            return Err(invalid("the bytes named lie outside the peer's shared memory"));
        }
        let file = File::open(format!("/proc/{}/fd/{}", place.pid, place.fd))?;
        let meta = file.metadata()?;
        if meta.uid() != nix::unistd::getuid().as_raw() || meta.len() != place.file_len {
            return Err(invalid("the peer's shared memory is not this user's, or not of the size said"));
        }
        let len = usize::try_from(place.file_len).map_err(|_| invalid("shared memory larger than this host's"))?;
        // SAFETY: mapped read-only; the owner writes the bytes only while no peer reads
        // them (the protocol that named the place says when).
        let map = unsafe { MmapOptions::new().len(len).map(&file)? };
        let memory = PeerMemory { pid: place.pid, id: place.id, map };
        if memory.word(WORD_MAGIC) != MAGIC
            || memory.word(WORD_PID) != u64::from(place.pid)
            || memory.word(WORD_ID) != place.id
        {
            return Err(invalid("the descriptor the peer named is not its shared memory"));
        }
        Ok(memory)
    }

    fn word(&self, offset: usize) -> u64 {
        // SAFETY: an 8-aligned word of the header page, inside the mapping, which its
        // owner writes atomically.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }.load(Ordering::Acquire)
    }

    /// Whether this is the memory `place` names.
    pub(crate) fn is(&self, place: &SharedPlace) -> bool {
        self.pid == place.pid && self.id == place.id && self.map.len() as u64 == place.file_len
    }

    /// Whether its owner let it go (this mapping is all that keeps it).
    pub(crate) fn released(&self) -> bool {
        self.word(WORD_RELEASED) != 0
    }

    /// The bytes `place` names (checked inside the file when mapped; `None` if not).
    pub(crate) fn bytes(&self, place: &SharedPlace) -> Option<&[u8]> {
        let start = usize::try_from(place.offset).ok()?;
        let len = usize::try_from(place.len).ok()?;
        self.map.get(start..start.checked_add(len)?).filter(|_| start >= HEADER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_maps_only_what_the_owner_named_and_sees_its_bytes_and_its_release() {
        let mut memory = SharedMemory::create("test", 7, 3 << 12).expect("memfd");
        memory.bytes_mut().iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let place = memory.place(100, 200);
        let peer = PeerMemory::open(place).expect("maps");
        assert!(peer.is(&place));
        let bytes = peer.bytes(&place).expect("inside");
        assert!(bytes.iter().enumerate().all(|(i, &b)| b == (i + 100) as u8));
        assert!(PeerMemory::open(SharedPlace { id: 8, ..place }).is_err(), "another id");
        assert!(PeerMemory::open(SharedPlace { offset: 0, ..place }).is_err(), "the header");
        assert!(PeerMemory::open(SharedPlace { len: place.file_len, ..place }).is_err(), "past the end");
        let exe = File::open("/proc/self/exe").expect("exe");
        assert!(PeerMemory::open(SharedPlace { fd: exe.as_raw_fd(), ..place }).is_err(), "not shared memory");
        assert!(!peer.released());
        drop(memory);
        assert!(peer.released());
        assert_eq!(peer.bytes(&place).expect("still mapped")[0], 100);
    }
}
