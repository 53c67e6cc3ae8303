//! The shared-memory transport between two processes of one host: a segment of two
//! single-producer, single-consumer byte rings, one per direction, read and written as
//! streams (`Read` / `Write`), so that the link's framing is the same as over TCP.
//!
//! The process that opens a link creates the segment in `/dev/shm` (mode `0600`, its
//! user only), maps it, and names it to the peer over the link's TCP connection; once
//! the peer has mapped it too, the creator unlinks the file, so that nothing is left
//! behind however either process ends. The TCP connection stays open beside it as the
//! liveness signal: the peer's death closes it (see [`Segment::peer_closed`]).
//!
//! Each ring is a header (positions and futex words) and `RING_BYTES` of data. The
//! producer copies into the free space and publishes its new position; the consumer
//! copies out and publishes its own. Either side waits on a futex word the other bumps
//! (only woken when the other says it waits), with a timeout so that a peer gone is
//! noticed. Positions only grow, so `head - tail` is what the ring holds.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use memmap2::MmapMut;
use rustix::thread::futex;

/// Data bytes of each ring.
pub(crate) const RING_BYTES: usize = 1 << 20;
/// The header of each ring: the producer's words, then the consumer's on their own
/// cache line.
const HEADER_BYTES: usize = 128;
const SEGMENT_BYTES: usize = 2 * (HEADER_BYTES + RING_BYTES);
/// How long a side waits before it looks again whether its peer is gone.
const WAIT: Duration = Duration::from_millis(100);

// Word offsets in a ring header.
const HEAD: usize = 0;
const DATA_FUTEX: usize = 8;
const CONSUMER_WAITING: usize = 12;
const WRITER_CLOSED: usize = 16;
const TAIL: usize = 64;
const SPACE_FUTEX: usize = 72;
const PRODUCER_WAITING: usize = 76;

/// Where segments are created, and how their names start (then the user id, the
/// creator's pid, the peer's index and a time).
const SEGMENT_DIR: &str = "/dev/shm";
const SEGMENT_PREFIX: &str = "neuron-virt-link-";

/// A segment's file, removed when dropped.
#[derive(Debug)]
pub(crate) struct SegmentFile(PathBuf);

impl SegmentFile {
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SegmentFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Removes the files in `dir` named `<prefix><pid>-…` whose creating process is gone.
fn remove_stale(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.strip_prefix(prefix).and_then(|rest| rest.split('-').next()).and_then(|p| p.parse::<i32>().ok());
        if let Some(pid) = pid
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH)
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A mapped segment and what both of its rings share.
#[derive(Debug)]
pub(crate) struct Segment {
    /// The mapping's first byte, taken once from the mapping held mutably.
    base: *mut u8,
    _map: MmapMut,
    /// Set when the link's TCP connection closed: the peer is gone.
    peer_closed: AtomicBool,
}

// SAFETY: `base` points into `_map`, which lives as long as the segment; every access
// through it is an atomic header word or a ring range that the ring discipline gives to
// one thread at a time (the producer below `tail + RING_BYTES`, the consumer below
// `head`).
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates a segment for a link to process `peer` and maps it; the file is removed
    /// when the returned [`SegmentFile`] is dropped (once the peer has mapped it, or
    /// failed to). Files left by processes of this user that died between creating and
    /// removing theirs are removed first.
    pub(crate) fn create(peer: u32) -> io::Result<(Arc<Segment>, SegmentFile)> {
        let uid = nix::unistd::getuid();
        remove_stale(Path::new(SEGMENT_DIR), &format!("{SEGMENT_PREFIX}{uid}-"));
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let name = format!("{SEGMENT_PREFIX}{uid}-{}-{peer}-{nanos}", std::process::id());
        let path = SegmentFile(Path::new(SEGMENT_DIR).join(name));
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path.path())?;
        file.set_len(SEGMENT_BYTES as u64)?;
        // SAFETY: the file is this process's and the peer's only, and both access it
        // through the atomics and the ring discipline of this module.
        let map = unsafe { MmapMut::map_mut(&file)? };
        Ok((Segment::new(map), path))
    }

    /// Maps the segment the peer created at `path`: a file directly in `/dev/shm`,
    /// named as `create` names them, of this user, private to it, of a segment's size.
    pub(crate) fn open(path: &Path) -> io::Result<Arc<Segment>> {
        use std::os::unix::fs::MetadataExt;
        let named = path.parent() == Some(Path::new(SEGMENT_DIR))
            && path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(SEGMENT_PREFIX));
        if !named {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a link segment"));
        }
        let file = OpenOptions::new().read(true).write(true).custom_flags(nix::libc::O_NOFOLLOW).open(path)?;
        let meta = file.metadata()?;
        if meta.uid() != nix::unistd::getuid().as_raw()
            || meta.mode() & 0o077 != 0
            || meta.len() != SEGMENT_BYTES as u64
        {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not this user's private link segment"));
        }
        // SAFETY: as in `create`.
        let map = unsafe { MmapMut::map_mut(&file)? };
        Ok(Segment::new(map))
    }

    fn new(mut map: MmapMut) -> Arc<Segment> {
        Arc::new(Segment { base: map.as_mut_ptr(), _map: map, peer_closed: AtomicBool::new(false) })
    }

    /// Marks the peer gone (its TCP connection closed): a reader returns what is left,
    /// then the end of the stream; a writer fails instead of waiting for space.
    pub(crate) fn peer_closed(&self) {
        self.peer_closed.store(true, Ordering::SeqCst);
        for ring in 0..2 {
            let r = Ring { segment: self, ring };
            let _ = futex::wake(r.u32(DATA_FUTEX), futex::Flags::empty(), u32::MAX);
            let _ = futex::wake(r.u32(SPACE_FUTEX), futex::Flags::empty(), u32::MAX);
        }
    }

    /// The writing end of ring `ring` (0: creator to peer, 1: peer to creator).
    pub(crate) fn writer(self: &Arc<Self>, ring: usize) -> RingWriter {
        RingWriter { segment: Arc::clone(self), ring, stall_limit: None }
    }

    pub(crate) fn reader(self: &Arc<Self>, ring: usize) -> RingReader {
        RingReader { segment: Arc::clone(self), ring }
    }
}

/// One ring of a segment, by index.
struct Ring<'a> {
    segment: &'a Segment,
    ring: usize,
}

impl Ring<'_> {
    fn base(&self) -> *mut u8 {
        // SAFETY: both rings lie inside the mapping.
        unsafe { self.segment.base.add(self.ring * (HEADER_BYTES + RING_BYTES)) }
    }

    fn u64(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: `offset` is an 8-aligned header word inside the mapping (page-aligned
        // itself), which lives as long as `self.segment`; the peer only touches it
        // atomically too.
        unsafe { &*self.base().add(offset).cast::<AtomicU64>() }
    }

    fn u32(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: as for `u64`, 4-aligned.
        unsafe { &*self.base().add(offset).cast::<AtomicU32>() }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the data follows the header inside the mapping.
        unsafe { self.base().add(HEADER_BYTES) }
    }

    /// Waits on `word` while it still reads `seen`, up to [`WAIT`].
    fn wait(&self, word: usize, seen: u32) {
        let timeout = futex::Timespec { tv_sec: 0, tv_nsec: WAIT.as_nanos() as _ };
        let _ = futex::wait(self.u32(word), futex::Flags::empty(), seen, Some(&timeout));
    }

    fn bump(&self, word: usize, waiting: usize) {
        self.u32(word).fetch_add(1, Ordering::SeqCst);
        if self.u32(waiting).load(Ordering::SeqCst) != 0 {
            let _ = futex::wake(self.u32(word), futex::Flags::empty(), 1);
        }
    }
}

/// The producer's end of a ring.
#[derive(Debug)]
pub(crate) struct RingWriter {
    segment: Arc<Segment>,
    ring: usize,
    /// How long a write may wait for room before it fails (`None`: as long as the
    /// peer lives).
    stall_limit: Option<Duration>,
}

impl RingWriter {
    /// This writer, failing a write that finds no room for `limit` (a peer that reads
    /// nothing, stopped or stuck, is no reason to hang).
    pub(crate) fn bounded(self, limit: Duration) -> RingWriter {
        RingWriter { stall_limit: Some(limit), ..self }
    }

    /// Says that nothing more will be written: the reader returns the end of the stream
    /// once it has read what was.
    pub(crate) fn close(&self) {
        let r = Ring { segment: &self.segment, ring: self.ring };
        r.u32(WRITER_CLOSED).store(1, Ordering::SeqCst);
        r.bump(DATA_FUTEX, CONSUMER_WAITING);
    }
}

impl Write for RingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let r = Ring { segment: &self.segment, ring: self.ring };
        let mut waiting_since: Option<std::time::Instant> = None;
        loop {
            let head = r.u64(HEAD).load(Ordering::Relaxed);
            let tail = r.u64(TAIL).load(Ordering::Acquire);
            let free = RING_BYTES - (head - tail) as usize;
            if free > 0 {
                let n = free.min(buf.len());
                let at = (head % RING_BYTES as u64) as usize;
                let first = n.min(RING_BYTES - at);
                // SAFETY: `at..at + first` and `0..n - first` are inside the data and
                // free: the consumer reads only below `head`.
                unsafe {
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), r.data().add(at), first);
                    std::ptr::copy_nonoverlapping(buf.as_ptr().add(first), r.data(), n - first);
                }
                r.u64(HEAD).store(head + n as u64, Ordering::Release);
                r.bump(DATA_FUTEX, CONSUMER_WAITING);
                return Ok(n);
            }
            if self.segment.peer_closed.load(Ordering::SeqCst) {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the peer is gone"));
            }
            let since = *waiting_since.get_or_insert_with(std::time::Instant::now);
            if self.stall_limit.is_some_and(|limit| since.elapsed() >= limit) {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the peer read nothing of the ring"));
            }
            let seen = r.u32(SPACE_FUTEX).load(Ordering::SeqCst);
            r.u32(PRODUCER_WAITING).store(1, Ordering::SeqCst);
            if r.u64(TAIL).load(Ordering::SeqCst) == tail {
                r.wait(SPACE_FUTEX, seen);
            }
            r.u32(PRODUCER_WAITING).store(0, Ordering::SeqCst);
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The consumer's end of a ring.
#[derive(Debug)]
pub(crate) struct RingReader {
    segment: Arc<Segment>,
    ring: usize,
}

impl Read for RingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let r = Ring { segment: &self.segment, ring: self.ring };
        loop {
            let tail = r.u64(TAIL).load(Ordering::Relaxed);
            let head = r.u64(HEAD).load(Ordering::Acquire);
            if head > tail {
                let n = ((head - tail) as usize).min(buf.len());
                let at = (tail % RING_BYTES as u64) as usize;
                let first = n.min(RING_BYTES - at);
                // SAFETY: `tail..tail + n` was published by the producer, which writes
                // only at `head` and beyond.
                unsafe {
                    std::ptr::copy_nonoverlapping(r.data().add(at), buf.as_mut_ptr(), first);
                    std::ptr::copy_nonoverlapping(r.data(), buf.as_mut_ptr().add(first), n - first);
                }
                r.u64(TAIL).store(tail + n as u64, Ordering::Release);
                r.bump(SPACE_FUTEX, PRODUCER_WAITING);
                return Ok(n);
            }
            if r.u32(WRITER_CLOSED).load(Ordering::SeqCst) != 0 || self.segment.peer_closed.load(Ordering::SeqCst) {
                // Everything published before the close or the death has been read.
                if r.u64(HEAD).load(Ordering::SeqCst) == tail {
                    return Ok(0);
                }
                continue;
            }
            let seen = r.u32(DATA_FUTEX).load(Ordering::SeqCst);
            r.u32(CONSUMER_WAITING).store(1, Ordering::SeqCst);
            if r.u64(HEAD).load(Ordering::SeqCst) == head {
                r.wait(DATA_FUTEX, seen);
            }
            r.u32(CONSUMER_WAITING).store(0, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_cross_a_segment_in_order_through_many_wraps_and_the_file_is_private() {
        let (creator, file) = Segment::create(1).expect("a segment in /dev/shm");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(file.path()).expect("exists").permissions().mode() & 0o777, 0o600);
        let peer = Segment::open(file.path()).expect("maps");
        let path = file.path().to_path_buf();
        drop(file);
        assert!(!path.exists(), "removed once both mapped");
        let total = 5 * RING_BYTES + 12_345;
        let data: Vec<u8> = (0..total).map(|i| (i * 7 + i / 251) as u8).collect();
        let sent = data.clone();
        let mut writer = creator.writer(0);
        let producer = std::thread::spawn(move || {
            for chunk in sent.chunks(77_777) {
                writer.write_all(chunk).expect("writes");
            }
            writer.close();
        });
        let mut received = Vec::new();
        peer.reader(0).read_to_end(&mut received).expect("reads to the end");
        producer.join().expect("producer");
        assert!(received == data, "{} bytes received of {}", received.len(), data.len());
        for elsewhere in ["/tmp/neuron-virt-link-x", "/dev/shm/../tmp/neuron-virt-link-x", "/dev/shm/other"] {
            assert!(Segment::open(Path::new(elsewhere)).is_err(), "{elsewhere}: only link segments are mapped");
        }
    }

    #[test]
    fn a_peer_gone_ends_the_stream_after_what_it_wrote_and_fails_a_blocked_writer() {
        let (creator, file) = Segment::create(2).expect("a segment");
        let peer = Segment::open(file.path()).expect("maps");
        drop(file);
        creator.writer(0).write_all(b"last words").expect("fits");
        peer.peer_closed();
        let mut received = Vec::new();
        peer.reader(0).read_to_end(&mut received).expect("reads");
        assert_eq!(received, b"last words");
        // Nobody reads ring 1: a writer that fills it fails once the peer is gone.
        let mut writer = peer.writer(1);
        let big = vec![0u8; RING_BYTES + 1];
        let error = writer.write_all(&big).expect_err("no reader");
        assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn a_bounded_writer_whose_reader_reads_nothing_fails_after_its_limit() {
        let (creator, file) = Segment::create(3).expect("a segment");
        let _peer = Segment::open(file.path()).expect("maps");
        let limit = std::time::Duration::from_millis(300);
        let mut writer = creator.writer(0).bounded(limit);
        let started = std::time::Instant::now();
        let error = writer.write_all(&vec![0u8; RING_BYTES + 1]).expect_err("nobody reads");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= limit, "{:?}", started.elapsed());
    }

    #[test]
    fn files_of_processes_that_died_are_removed_and_the_living_ones_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A pid no process has (above the kernel's maximum), and this process's.
        let dead = dir.path().join("link-4194400-1-5");
        let alive = dir.path().join(format!("link-{}-1-5", std::process::id()));
        let other = dir.path().join("unrelated");
        for file in [&dead, &alive, &other] {
            std::fs::write(file, b"").expect("write");
        }
        remove_stale(dir.path(), "link-");
        assert!(!dead.exists() && alive.exists() && other.exists());
    }
}
