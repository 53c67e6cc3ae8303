//! The framing around the protobuf payloads: the file header, record frames and the
//! trailer. Frames carry a sync word, a length and a checksum, so a reader can find
//! every complete record of a file that was cut short or damaged in the middle.

/// The first 8 bytes of every NTFF file.
pub(crate) const MAGIC: [u8; 8] = *b"\x89NTFF\r\n\x1a";
/// The format version this crate writes.
pub const VERSION: u32 = 2;
/// The oldest format version this crate reads.
pub const MIN_READ_VERSION: u32 = 2;
/// The newest format version this crate reads.
pub const MAX_READ_VERSION: u32 = 2;
/// Bytes of the file header: magic, version, flags.
pub(crate) const HEADER_BYTES: usize = 16;

/// The first 4 bytes of every record frame.
pub(crate) const FRAME_SYNC: [u8; 4] = *b"NTr\x02";
/// Bytes of a frame header: sync, kind, 3 reserved, payload length, event count, CRC-32.
pub(crate) const FRAME_BYTES: usize = 20;
/// The largest payload a reader accepts (writers stay far below it).
pub(crate) const MAX_RECORD_BYTES: usize = 64 << 20;

/// The last 16 bytes of a finished file: the index frame's offset and this magic.
pub(crate) const TRAILER_MAGIC: [u8; 8] = *b"NTFFEND\n";
pub(crate) const TRAILER_BYTES: usize = 16;

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RecordKind {
    Metadata = 1,
    Strings = 2,
    Descriptors = 3,
    Chunk = 4,
    Models = 5,
    Index = 6,
    Communicators = 7,
}

impl RecordKind {
    pub(crate) fn from_code(code: u8) -> Option<RecordKind> {
        Some(match code {
            1 => RecordKind::Metadata,
            2 => RecordKind::Strings,
            3 => RecordKind::Descriptors,
            4 => RecordKind::Chunk,
            5 => RecordKind::Models,
            6 => RecordKind::Index,
            7 => RecordKind::Communicators,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            RecordKind::Metadata => "metadata",
            RecordKind::Strings => "string table",
            RecordKind::Descriptors => "descriptor table",
            RecordKind::Chunk => "event chunk",
            RecordKind::Models => "models",
            RecordKind::Communicators => "communicators",
            RecordKind::Index => "index",
        }
    }
}

pub(crate) fn header(version: u32) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h
}

/// A frame header as read (not yet checked against its payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) kind_code: u8,
    pub(crate) length: u32,
    pub(crate) events: u32,
    pub(crate) crc: u32,
}

impl Frame {
    pub(crate) fn encode(kind: RecordKind, events: u32, payload: &[u8]) -> [u8; FRAME_BYTES] {
        let mut f = [0u8; FRAME_BYTES];
        f[..4].copy_from_slice(&FRAME_SYNC);
        f[4] = kind as u8;
        f[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        f[12..16].copy_from_slice(&events.to_le_bytes());
        let crc = checksum(&f[4..16], payload);
        f[16..20].copy_from_slice(&crc.to_le_bytes());
        f
    }

    /// The frame at the start of `bytes`, if it starts with the sync word.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Frame> {
        let f = bytes.get(..FRAME_BYTES)?;
        if f[..4] != FRAME_SYNC {
            return None;
        }
        let word = |at: usize| u32::from_le_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]]);
        Some(Frame { kind_code: f[4], length: word(8), events: word(12), crc: word(16) })
    }

    /// Whether `payload` (and this header) match the checksum.
    pub(crate) fn verify(&self, header: &[u8], payload: &[u8]) -> bool {
        checksum(&header[4..16], payload) == self.crc
    }
}

fn checksum(header: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(header);
    hasher.update(payload);
    hasher.finalize()
}

pub(crate) fn trailer(index_offset: u64) -> [u8; TRAILER_BYTES] {
    let mut t = [0u8; TRAILER_BYTES];
    t[..8].copy_from_slice(&index_offset.to_le_bytes());
    t[8..].copy_from_slice(&TRAILER_MAGIC);
    t
}
