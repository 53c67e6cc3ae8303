//! The outbox: where this process puts the large messages it sends to processes of its
//! host, and where they read them in place.
//!
//! Streamed through a link's ring, a message is copied twice more than in one process
//! (into the ring, then out of it into a buffer of the receiver, by the receiver's link
//! thread). A large message to a process of this host instead lies in an **area** of
//! this process: anonymous shared memory (`memfd`), which the receiver maps once
//! through `/proc/<pid>/fd/<n>` (the kernel lets only this user's processes open it) and
//! reads where it lies; only an envelope naming the place goes through the link. An
//! area is in no directory, so nothing is left behind however a process ends. A rank's
//! input is read into the outbox directly ([`Message::for_peers`]), so that sending it
//! copies nothing.
//!
//! Each message in an area starts with a header whose count says how many handles
//! still read it: the sender's own, and one per receiver, taken before the envelope is
//! sent and dropped by the receiver once it is done ([`Received`]). Messages follow each
//! other in an area as in a ring; the space of the oldest is reused once its count is
//! zero. An area has room for two messages of the size that made it (a rank's next
//! message while a peer still reads the last), at least [`MIN_AREA`]; the areas of a
//! process hold at most [`MAX_BYTES`]. A message that finds no room (a peer that holds
//! its messages long, or died holding them) is streamed through the link as before.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::ops::Deref;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use memmap2::{MmapMut, MmapOptions};
use serde::{Deserialize, Serialize};

use super::lending::LentTensors;
use crate::collectives::buffers;

/// Messages from this size on go through the outbox to processes of this host.
pub(crate) const MIN_MESSAGE: usize = 64 << 10;
/// The most bytes the areas of a process hold.
pub(crate) const MAX_BYTES: usize = 512 << 20;
/// The least bytes of an area.
const MIN_AREA: usize = 16 << 20;
/// An area's header (magic, owner pid, id), then its messages, each after a header of
/// this size (its count of readers) and aligned to it.
const AREA_HEADER: usize = 64;
const MESSAGE_HEADER: usize = 64;
const MAGIC: u64 = u64::from_le_bytes(*b"NVOUTBOX");
/// How many areas of one peer a receiver keeps mapped (a sender makes a new one only
/// when its messages outgrow the old ones).
const MAPPED_PER_PEER: usize = 4;

/// Where a message lies in its sender's outbox, as its envelope says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Place {
    /// The sending process, the area's id there, and the descriptor it is open under.
    pub(crate) pid: u32,
    pub(crate) area: u64,
    pub(crate) fd: i32,
    pub(crate) area_len: u64,
    /// The message's header.
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// The bytes a collective moves: a buffer of this process, a message in its outbox, a
/// message in a peer's outbox mapped here, or a peer's lent tensors (the bytes are
/// its input; see `lending.rs`).
#[derive(Debug)]
pub(crate) enum Message {
    Heap(Vec<u8>),
    Outbox(Slot),
    Received(Received),
    Lent(LentTensors),
}

impl Deref for Message {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Message::Heap(bytes) => bytes,
            Message::Outbox(slot) => slot.bytes(),
            Message::Received(received) => received.bytes(),
            Message::Lent(lent) => lent.input(),
        }
    }
}

impl Message {
    /// A message of `len` bytes to be overwritten whole, for peers of this host when
    /// `outbox` has room (else a buffer of the process).
    pub(crate) fn for_peers(len: usize, outbox: Option<&Outbox>) -> Message {
        match outbox.filter(|_| len >= MIN_MESSAGE).and_then(|o| o.slot(len)) {
            Some(slot) => Message::Outbox(slot),
            None => Message::Heap(buffers::take(len)),
        }
    }

    /// The bytes to fill (a message not shared yet); a received message has none.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Message::Heap(bytes) => bytes,
            Message::Outbox(slot) => slot.bytes_mut(),
            Message::Received(_) | Message::Lent(_) => &mut [],
        }
    }

    /// The peer's lent tensors, when this is what it sent.
    pub(crate) fn lent(&self) -> Option<&LentTensors> {
        match self {
            Message::Lent(lent) => Some(lent),
            _ => None,
        }
    }

    /// Hands a buffer of the process back for later calls once nothing else holds it;
    /// a message in shared memory is released to its sender when the last handle goes.
    pub(crate) fn recycle(message: Arc<Message>) {
        if let Ok(Message::Heap(bytes)) = Arc::try_unwrap(message) {
            buffers::give(bytes);
        }
    }
}

/// This process's areas.
#[derive(Debug)]
pub(crate) struct Outbox {
    areas: Mutex<Vec<Arc<Area>>>,
    next_id: AtomicU64,
    /// The most bytes the areas hold ([`MAX_BYTES`]).
    limit: usize,
}

impl Default for Outbox {
    fn default() -> Outbox {
        Outbox::with_limit(MAX_BYTES)
    }
}

impl Outbox {
    fn with_limit(limit: usize) -> Outbox {
        Outbox { areas: Mutex::new(Vec::new()), next_id: AtomicU64::new(0), limit }
    }

    /// Room for a message of `len` bytes, its count at one (this handle); `None` when
    /// the areas are full and no new one fits within the limit, or the kernel
    /// gives no shared memory.
    pub(crate) fn slot(&self, len: usize) -> Option<Slot> {
        let size = MESSAGE_HEADER + len.next_multiple_of(MESSAGE_HEADER);
        let mut areas = self.areas.lock().unwrap_or_else(|e| e.into_inner());
        for area in areas.iter() {
            if let Some(offset) = area.reserve(size) {
                return Some(Slot { area: Arc::clone(area), offset, len });
            }
        }
        let want = (AREA_HEADER + 2 * size).next_multiple_of(1 << 20).max(MIN_AREA);
        // Areas with nothing in them give way to one that fits.
        let held = |areas: &Vec<Arc<Area>>| areas.iter().map(|a| a.len).sum::<usize>();
        while held(&areas) + want > self.limit {
            let idle = areas.iter().position(|a| a.is_idle())?;
            areas.swap_remove(idle);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let area = match Area::create(id, want) {
            Ok(area) => Arc::new(area),
            Err(e) => {
                tracing::debug!("no outbox area of {want} bytes: {e}; streaming instead");
                return None;
            }
        };
        let offset = area.reserve(size)?;
        areas.push(Arc::clone(&area));
        Some(Slot { area, offset, len })
    }
}

/// One area of this process's outbox.
#[derive(Debug)]
struct Area {
    id: u64,
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
    _map: MmapMut,
    /// The messages that may still be read, oldest first: (offset, size).
    live: Mutex<VecDeque<(usize, usize)>>,
}

// SAFETY: `base` points into `_map`, which lives as long as the area; the header words
// are accessed atomically, and a message's bytes are written only through its one
// `Slot` before it is shared (see `Slot::bytes_mut`), read only after.
unsafe impl Send for Area {}
// SAFETY: as above.
unsafe impl Sync for Area {}

impl Area {
    fn create(id: u64, len: usize) -> io::Result<Area> {
        let fd = nix::sys::memfd::memfd_create("neuron-virt-outbox", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)?;
        // Reserved now, so that a full /dev/shm or memory limit is an error here, not a
        // SIGBUS when a page is first written.
        nix::fcntl::posix_fallocate(&fd, 0, len as i64)?;
        let file = File::from(fd.try_clone()?);
        // SAFETY: the memory is this process's, shared only with the peers it names it
        // to, which write only the count words.
        let mut map = unsafe { MmapOptions::new().len(len).populate().map_mut(&file)? };
        let base = map.as_mut_ptr();
        let area = Area { id, fd, base, len, _map: map, live: Mutex::new(VecDeque::new()) };
        area.word64(0).store(MAGIC, Ordering::Relaxed);
        area.word64(8).store(u64::from(std::process::id()), Ordering::Relaxed);
        area.word64(16).store(id, Ordering::Release);
        Ok(area)
    }

    fn word64(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: an 8-aligned offset of the area header, inside the mapping.
        unsafe { &*self.base.add(offset).cast::<AtomicU64>() }
    }

    fn count(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: `offset` is a message header's: 64-aligned, inside the mapping.
        unsafe { &*self.base.add(offset).cast::<AtomicU32>() }
    }

    /// Forgets the oldest messages nobody reads any more.
    fn reclaim(&self, live: &mut VecDeque<(usize, usize)>) {
        while let Some(&(offset, _)) = live.front() {
            if self.count(offset).load(Ordering::Acquire) != 0 {
                break;
            }
            live.pop_front();
        }
    }

    fn is_idle(&self) -> bool {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        self.reclaim(&mut live);
        live.is_empty()
    }

    /// The offset of `size` free bytes after the newest message (or from the start,
    /// before the oldest), counted at one.
    fn reserve(&self, size: usize) -> Option<usize> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        self.reclaim(&mut live);
        let offset = match (live.front(), live.back()) {
            (Some(&(oldest, _)), Some(&(newest, newest_size))) => {
                let end = newest + newest_size;
                if end > oldest {
                    // Messages from `oldest` to `end`: room after them, or before them.
                    if end + size <= self.len {
                        end
                    } else if AREA_HEADER + size <= oldest {
                        AREA_HEADER
                    } else {
                        return None;
                    }
                } else if end + size <= oldest {
                    end
                } else {
                    return None;
                }
            }
            _ if AREA_HEADER + size <= self.len => AREA_HEADER,
            _ => return None,
        };
        self.count(offset).store(1, Ordering::Release);
        live.push_back((offset, size));
        Some(offset)
    }
}

/// A message in this process's outbox, counted as one reader while this handle lives.
#[derive(Debug)]
pub(crate) struct Slot {
    area: Arc<Area>,
    offset: usize,
    len: usize,
}

impl Slot {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the message's bytes follow its header inside the mapping; they are
        // written only through `bytes_mut`, which needs the only handle.
        unsafe { std::slice::from_raw_parts(self.area.base.add(self.offset + MESSAGE_HEADER), self.len) }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`; a `&mut Slot` is the only handle, and the message has not
        // been sent to any peer yet (a sent one is behind an `Arc`).
        unsafe { std::slice::from_raw_parts_mut(self.area.base.add(self.offset + MESSAGE_HEADER), self.len) }
    }

    /// Counts one more reader (a peer about to be told the place); its handle's drop
    /// there takes it back, as [`Slot::unread`] does when the telling failed.
    pub(crate) fn read_by_one_more(&self) -> Place {
        self.area.count(self.offset).fetch_add(1, Ordering::AcqRel);
        Place {
            pid: std::process::id(),
            area: self.area.id,
            fd: self.area.fd.as_raw_fd(),
            area_len: self.area.len as u64,
            offset: self.offset as u64,
            len: self.len as u64,
        }
    }

    pub(crate) fn unread(&self) {
        self.area.count(self.offset).fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.area.count(self.offset).fetch_sub(1, Ordering::AcqRel);
    }
}

/// A peer's area mapped here.
#[derive(Debug)]
struct Mapped {
    base: *mut u8,
    len: usize,
    _map: MmapMut,
}

// SAFETY: `base` points into `_map`; messages are only read, and their count words
// changed atomically.
unsafe impl Send for Mapped {}
// SAFETY: as above.
unsafe impl Sync for Mapped {}

/// A message of a peer's outbox, read in place; dropping it tells the peer it is done.
#[derive(Debug)]
pub(crate) struct Received {
    area: Arc<Mapped>,
    offset: usize,
    len: usize,
}

impl Received {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `Areas::receive` checked that the message lies inside the mapping;
        // its sender does not write it while this handle counts as a reader.
        unsafe { std::slice::from_raw_parts(self.area.base.add(self.offset + MESSAGE_HEADER), self.len) }
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        // SAFETY: the header is 64-aligned inside the mapping.
        let count = unsafe { &*self.area.base.add(self.offset).cast::<AtomicU32>() };
        count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The areas of one peer process mapped here (by its link's reader).
#[derive(Debug, Default)]
pub(crate) struct PeerAreas {
    mapped: VecDeque<((u32, u64), Arc<Mapped>)>,
}

impl PeerAreas {
    /// The message at `place` of the peer's outbox (its area mapped on first use, after
    /// checking that it is this user's, of the size said, and the peer's outbox area).
    pub(crate) fn receive(&mut self, place: Place) -> io::Result<Received> {
        let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let end = place.offset.checked_add(MESSAGE_HEADER as u64).and_then(|o| o.checked_add(place.len));
        if place.offset < AREA_HEADER as u64
            || !place.offset.is_multiple_of(MESSAGE_HEADER as u64)
            || end.is_none_or(|end| end > place.area_len)
        {
            return Err(invalid(format!("a message at {} of {} bytes lies outside its area", place.offset, place.len)));
        }
        let id = (place.pid, place.area);
        let area = match self.mapped.iter().find(|(known, _)| *known == id) {
            Some((_, area)) if area.len as u64 == place.area_len => Arc::clone(area),
            _ => {
                let area = Arc::new(self.map(place)?);
                if self.mapped.len() == MAPPED_PER_PEER {
                    self.mapped.pop_front();
                }
                self.mapped.retain(|(known, _)| *known != id);
                self.mapped.push_back((id, Arc::clone(&area)));
                area
            }
        };
        Ok(Received { area, offset: place.offset as usize, len: place.len as usize })
    }

    fn map(&self, place: Place) -> io::Result<Mapped> {
        use std::os::unix::fs::MetadataExt;
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
        let path = format!("/proc/{}/fd/{}", place.pid, place.fd);
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path)?;
        let meta = file.metadata()?;
        if meta.uid() != nix::unistd::getuid().as_raw() || meta.len() != place.area_len {
            return Err(invalid("the peer's outbox area is not this user's, or not of the size said"));
        }
        let len = usize::try_from(place.area_len).map_err(|_| invalid("an outbox area larger than memory"))?;
        // SAFETY: the peer writes a message's bytes only before it names it, and its
        // count words only atomically, as this side does.
        let mut map = unsafe { MmapOptions::new().len(len).populate().map_mut(&file)? };
        let base = map.as_mut_ptr();
        let mapped = Mapped { base, len, _map: map };
        let word = |offset: usize| {
            // SAFETY: 8-aligned words of the area header, inside the mapping.
            unsafe { &*mapped.base.add(offset).cast::<AtomicU64>() }.load(Ordering::Acquire)
        };
        if word(0) != MAGIC || word(8) != u64::from(place.pid) || word(16) != place.area {
            return Err(invalid("the descriptor the peer named is not its outbox area"));
        }
        Ok(mapped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_read_in_place_and_its_space_reused_once_every_reader_is_done() {
        let outbox = Outbox::default();
        let mut peer = PeerAreas::default();
        let mut slot = outbox.slot(MIN_MESSAGE).expect("shared memory");
        slot.bytes_mut().iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let place = slot.read_by_one_more();
        let received = peer.receive(place).expect("maps the area");
        assert!(received.bytes().iter().enumerate().all(|(i, &b)| b == i as u8));
        drop(slot);
        // Filling the area: the first message's space is not reused while it is read.
        let size = MESSAGE_HEADER + MIN_MESSAGE;
        let fits = (place.area_len as usize - AREA_HEADER) / size;
        let area = Arc::clone(&outbox.areas.lock().expect("lock")[0]);
        let held: Vec<Slot> = (1..fits).map(|_| outbox.slot(MIN_MESSAGE).expect("room")).collect();
        assert!(held.iter().all(|s| Arc::ptr_eq(&s.area, &area) && s.offset != place.offset as usize));
        drop(held);
        // The oldest message is still read: the next goes to a second area.
        let next = outbox.slot(MIN_MESSAGE).expect("a second area");
        assert!(!Arc::ptr_eq(&next.area, &area));
        drop(received);
        let again = outbox.slot(MIN_MESSAGE).expect("room");
        assert!(Arc::ptr_eq(&again.area, &area) && again.offset == place.offset as usize, "reused once read");
        assert_eq!(outbox.areas.lock().expect("lock").len(), 2);
    }

    #[test]
    fn a_receiver_maps_only_a_place_inside_an_outbox_area_of_its_peer() {
        let outbox = Outbox::default();
        let slot = outbox.slot(MIN_MESSAGE).expect("shared memory");
        let place = slot.read_by_one_more();
        slot.unread();
        let mut peer = PeerAreas::default();
        let outside = Place { offset: place.area_len - 64, ..place };
        assert!(peer.receive(outside).is_err());
        let unaligned = Place { offset: place.offset + 1, ..place };
        assert!(peer.receive(unaligned).is_err());
        let other_file = std::fs::File::open("/proc/self/exe").expect("exe");
        let not_an_area = Place { fd: other_file.as_raw_fd(), ..place };
        assert!(peer.receive(not_an_area).is_err());
        let wrong_id = Place { area: place.area + 1, ..place };
        assert!(peer.receive(wrong_id).is_err());
        assert!(peer.receive(place).is_ok());
    }

    #[test]
    fn the_areas_hold_at_most_their_bound_and_idle_ones_make_way_for_larger_messages() {
        const MIB: usize = 1 << 20;
        let outbox = Outbox::with_limit(40 * MIB);
        let areas = || outbox.areas.lock().expect("lock").iter().map(|a| a.len).collect::<Vec<_>>();
        // An area has room for two messages of the size that made it.
        let (a, b) = (outbox.slot(8 * MIB).expect("room"), outbox.slot(8 * MIB).expect("room"));
        assert!(Arc::ptr_eq(&a.area, &b.area));
        let (c, d) = (outbox.slot(8 * MIB).expect("a second area"), outbox.slot(8 * MIB).expect("room"));
        assert_eq!(areas(), [17 * MIB, 17 * MIB]);
        assert!(outbox.slot(8 * MIB).is_none(), "a third area would pass the bound");
        drop((a, b, c, d));
        // Neither idle area fits 19 MiB: both give way to one that does.
        let large = outbox.slot(19 * MIB).expect("room once the idle areas are gone");
        assert_eq!(areas(), [39 * MIB]);
        assert_eq!(large.bytes().len(), 19 * MIB);
    }
}
