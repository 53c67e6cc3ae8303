//! The reader: finds a file's records through the index of a finished file or by
//! scanning the frames of one that was cut short or damaged. Opening reads the tables;
//! events are decoded chunk by chunk, when asked for, each record read from the open
//! file at its offset. The file is not mapped: a file that another program truncates or
//! rewrites in place while it is read gives "changed while read" errors for the records
//! past its new end, where a mapping would kill the reader with SIGBUS. (Profiles are
//! replaced by renaming a new file into place, which an open reader does not see.)
//!
//! Recovery guarantees: any byte string opens without a panic; every complete,
//! undamaged chunk of a file cut anywhere is read; a damaged record is skipped and
//! reported with its offset, and the scan resumes at the next frame; the report says
//! how many bytes (and, when the frame header survived, how many events) were lost.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::codec::{decode_chunk, decode_chunk_reusing};
use crate::format::{self, Frame, RecordKind};
use crate::model::{Chunk, ChunkInfo, Descriptor, DescriptorId, Sym, SyncPoint, core_of_stream};
use crate::proto;
use crate::{NtffError, SyncClock};

/// The bytes of a profile: an open file of the length it had when opened, read where
/// needed, or bytes in memory (for tests and fuzzing).
#[derive(Debug)]
enum Bytes {
    File { file: File, len: usize },
    Owned(Vec<u8>),
}

impl Bytes {
    fn len(&self) -> usize {
        match self {
            Bytes::File { len, .. } => *len,
            Bytes::Owned(v) => v.len(),
        }
    }

    /// The bytes of `range`, clamped to the length: borrowed from memory, or read from
    /// the file. Fewer than asked for only at the end; an error when the file no longer
    /// holds them (it was truncated or rewritten in place) or cannot be read.
    fn get(&self, range: Range<usize>) -> Result<Cow<'_, [u8]>, String> {
        let range = range.start.min(self.len())..range.end.min(self.len());
        match self {
            Bytes::Owned(v) => Ok(Cow::Borrowed(&v[range])),
            Bytes::File { file, len } => {
                let mut buffer = vec![0u8; range.len()];
                file.read_exact_at(&mut buffer, range.start as u64).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => {
                        format!(
                            "the file changed while it was read: it was {len} bytes, now it ends before byte {}",
                            range.end
                        )
                    }
                    _ => format!("the file could not be read at offset {}: {e}", range.start),
                })?;
                Ok(Cow::Owned(buffer))
            }
        }
    }
}

/// Appends the entries of a table record that starts at id `first` (entries it skips
/// are `None`: they were in a record that was lost).
fn append<T>(
    table: &mut Vec<Option<T>>,
    first: u32,
    values: impl Iterator<Item = Option<T>>,
    what: &str,
) -> Result<(), String> {
    let first = first as usize;
    if first < table.len() {
        return Err(format!("{what} ids from {first} were already defined"));
    }
    table.resize_with(first, || None);
    table.extend(values);
    Ok(())
}

/// A chunk record decoded for its sync points alone: prost skips the other fields.
#[derive(Clone, PartialEq, prost::Message)]
struct SyncPointsOnly {
    #[prost(message, repeated, tag = "6")]
    sync_points: Vec<proto::SyncPoint>,
}

/// A damaged or incomplete part of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub offset: u64,
    pub bytes: u64,
    /// What the record held, when its frame header survived.
    pub kind: Option<&'static str>,
    /// Events in it, when its frame header survived.
    pub events: Option<u32>,
    pub reason: String,
}

/// How complete a file is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The file ends with its index: the writer finished it.
    pub finished: bool,
    /// Damaged records that were skipped.
    pub damaged: Vec<Damage>,
    /// The incomplete record at the end of a file that was cut short.
    pub truncated: Option<Damage>,
}

impl Recovery {
    /// Nothing is missing.
    pub fn is_clean(&self) -> bool {
        self.finished && self.damaged.is_empty() && self.truncated.is_none()
    }

    /// Events known to be lost in damaged or cut records.
    pub fn events_lost(&self) -> u64 {
        self.damaged.iter().chain(&self.truncated).filter_map(|d| d.events).map(u64::from).sum()
    }

    /// One line per problem, for people.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.finished {
            lines.push("the file was not finished (no index at its end): the capture was interrupted; every complete record was recovered".to_string());
        }
        for d in self.damaged.iter().chain(&self.truncated) {
            let what = d.kind.unwrap_or("data");
            let events = d.events.map_or(String::new(), |n| format!(" holding {n} events"));
            lines.push(format!("{} bytes at offset {}: {what}{events} lost: {}", d.bytes, d.offset, d.reason));
        }
        lines
    }
}

/// An NTFF file, open for reading.
#[derive(Debug)]
pub struct NtffFile {
    bytes: Bytes,
    version: u32,
    metadata: proto::Metadata,
    models: Vec<proto::Model>,
    communicators: Vec<proto::Communicator>,
    /// `None` where a damaged record's strings were lost.
    strings: Vec<Option<String>>,
    descriptors: Vec<Option<Descriptor>>,
    chunks: Vec<ChunkInfo>,
    recovery: Recovery,
}

impl NtffFile {
    /// Opens `path`, as long as it is now: bytes a writer still appending adds later
    /// are not read. Only a regular file opens (a FIFO or device would block or never
    /// end).
    pub fn open(path: &Path) -> Result<NtffFile, NtffError> {
        let not_regular =
            || NtffError::io(path, std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
        // Before opening: opening a FIFO blocks until a writer comes.
        if !std::fs::metadata(path).map_err(|e| NtffError::io(path, e))?.is_file() {
            return Err(not_regular());
        }
        let file = File::open(path).map_err(|e| NtffError::io(path, e))?;
        let meta = file.metadata().map_err(|e| NtffError::io(path, e))?;
        if !meta.is_file() {
            return Err(not_regular());
        }
        let len = usize::try_from(meta.len()).map_err(|_| NtffError::Truncated { bytes: meta.len() })?;
        NtffFile::parse(Bytes::File { file, len })
    }

    /// Opens a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<NtffFile, NtffError> {
        NtffFile::parse(Bytes::Owned(bytes))
    }

    fn parse(bytes: Bytes) -> Result<NtffFile, NtffError> {
        let head = bytes
            .get(0..format::HEADER_BYTES)
            .map_err(|reason| NtffError::Damaged { offset: 0, reason: format!("its header: {reason}") })?;
        let version = check_header(&head, bytes.len())?;
        drop(head);
        let mut file = NtffFile {
            bytes,
            version,
            metadata: proto::Metadata::default(),
            models: Vec::new(),
            communicators: Vec::new(),
            strings: vec![Some(String::new())],
            descriptors: Vec::new(),
            chunks: Vec::new(),
            recovery: Recovery::default(),
        };
        if !file.open_by_index() {
            file.scan();
        }
        Ok(file)
    }

    /// The format version in the header.
    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &proto::Metadata {
        &self.metadata
    }

    pub fn models(&self) -> &[proto::Model] {
        &self.models
    }

    /// The communicators of the traced process as its recording ended (empty in files
    /// written before they were recorded, and for a process of none).
    pub fn communicators(&self) -> &[proto::Communicator] {
        &self.communicators
    }

    /// The string `sym` names (`None` when it was lost or never written).
    pub fn string(&self, sym: Sym) -> Option<&str> {
        self.strings.get(sym.0 as usize).and_then(Option::as_deref)
    }

    /// The string `sym` names, or a placeholder naming the id.
    pub fn string_or_placeholder(&self, sym: Sym) -> std::borrow::Cow<'_, str> {
        match self.string(sym) {
            Some(s) => std::borrow::Cow::Borrowed(s),
            None => std::borrow::Cow::Owned(format!("<string {}>", sym.0)),
        }
    }

    /// How many strings the file's string table has (symbols run below it).
    pub fn string_count(&self) -> usize {
        self.strings.len()
    }

    /// The id of `s` in the string table, if the file has it.
    pub fn find_string(&self, s: &str) -> Option<Sym> {
        self.strings.iter().position(|x| x.as_deref() == Some(s)).map(|k| Sym(k as u32))
    }

    pub fn descriptor(&self, id: DescriptorId) -> Option<&Descriptor> {
        self.descriptors.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// Every descriptor, by id (`None` where one was lost).
    pub fn descriptors(&self) -> &[Option<Descriptor>] {
        &self.descriptors
    }

    /// The chunks, in file order.
    pub fn chunks(&self) -> &[ChunkInfo] {
        &self.chunks
    }

    /// The chunks of `cores` (`None`: every stream, the host's too) whose host-time
    /// span meets `host_range` (`None`: any time; chunks of unknown span always meet).
    pub fn select<'a>(
        &'a self,
        cores: Option<&'a [u32]>,
        host_range: Option<Range<u64>>,
    ) -> impl Iterator<Item = &'a ChunkInfo> + 'a {
        self.chunks.iter().filter(move |c| {
            let core_ok = match (cores, c.core) {
                (None, _) => true,
                (Some(list), Some(core)) => list.contains(&core),
                (Some(_), None) => false,
            };
            let time_ok = match (&host_range, c.host_span) {
                (Some(range), Some((low, high))) => low < range.end && high >= range.start,
                _ => true,
            };
            core_ok && time_ok
        })
    }

    /// Decodes the chunk `info` describes, checking its checksum.
    pub fn read_chunk(&self, info: &ChunkInfo) -> Result<Chunk, NtffError> {
        self.read_chunk_reusing(info, Chunk::default())
    }

    /// [`NtffFile::read_chunk`] into the buffers of `spare`, a chunk the caller is done
    /// with: reading chunk after chunk this way allocates their memory once.
    pub fn read_chunk_reusing(&self, info: &ChunkInfo, spare: Chunk) -> Result<Chunk, NtffError> {
        let payload = self
            .payload(info.offset, RecordKind::Chunk)
            .map_err(|reason| NtffError::Damaged { offset: info.offset, reason })?;
        let chunk = decode_chunk_reusing(&payload, spare)
            .map_err(|e| NtffError::Damaged { offset: info.offset, reason: e.0 })?;
        // A damaged length (a zero-length frame with a recomputed checksum decodes as an
        // empty chunk) shows as fewer events than the index or frame promised.
        let (system, device) = (chunk.system.len(), chunk.device.len());
        if (system, device) != (info.system_events as usize, info.device_events as usize) {
            return Err(NtffError::Damaged {
                offset: info.offset,
                reason: format!(
                    "it holds {system} system and {device} device events where the file says {} and {}",
                    info.system_events, info.device_events
                ),
            });
        }
        Ok(chunk)
    }

    /// Decodes the chunks `infos` describe on up to `threads` threads and gives them to
    /// `f` in order, on the calling thread, a few chunks ahead of it: memory stays
    /// bounded by a few decoded chunks per thread. Stops at the first error `f` returns.
    pub fn for_each_chunk<E>(
        &self,
        infos: &[ChunkInfo],
        threads: usize,
        mut f: impl FnMut(&ChunkInfo, Result<Chunk, NtffError>) -> Result<(), E>,
    ) -> Result<(), E> {
        let threads = threads.clamp(1, infos.len().max(1));
        if threads == 1 {
            for info in infos {
                f(info, self.read_chunk(info))?;
            }
            return Ok(());
        }
        std::thread::scope(|scope| {
            // Thread t decodes chunks t, t + threads, …, into its own bounded queue, so
            // taking the queues in turn gives the chunks in order.
            let queues: Vec<_> = (0..threads)
                .map(|t| {
                    let (tx, rx) = std::sync::mpsc::sync_channel(2);
                    scope.spawn(move || {
                        for info in infos.iter().skip(t).step_by(threads) {
                            if tx.send(self.read_chunk(info)).is_err() {
                                break;
                            }
                        }
                    });
                    rx
                })
                .collect();
            for (k, info) in infos.iter().enumerate() {
                let chunk = queues[k % threads].recv().unwrap_or_else(|_| {
                    Err(NtffError::Damaged { offset: info.offset, reason: "the decoding thread stopped".into() })
                });
                // Returning drops the queues, which stops the threads.
                f(info, chunk)?;
            }
            Ok(())
        })
    }

    /// The clock sync points of the chunk `info` describes, checking its checksum but
    /// skipping over its event columns.
    pub fn read_sync_points(&self, info: &ChunkInfo) -> Result<Vec<SyncPoint>, NtffError> {
        let payload = self
            .payload(info.offset, RecordKind::Chunk)
            .map_err(|reason| NtffError::Damaged { offset: info.offset, reason })?;
        let chunk = <SyncPointsOnly as prost::Message>::decode(&*payload)
            .map_err(|e| NtffError::Damaged { offset: info.offset, reason: e.to_string() })?;
        Ok(chunk.sync_points.iter().map(|s| SyncPoint { host_ns: s.host_ns, device_ns: s.device_ns }).collect())
    }

    /// Each core's sync points, from its chunks among those of `cores` (`None`: all).
    /// A chunk that cannot be read adds none; reading its events reports it.
    pub fn sync_points_by_core(&self, cores: Option<&[u32]>) -> HashMap<u32, Vec<SyncPoint>> {
        let mut points: HashMap<u32, Vec<SyncPoint>> = HashMap::new();
        for info in self.select(cores, None) {
            if let Some(core) = info.core
                && let Ok(p) = self.read_sync_points(info)
            {
                points.entry(core).or_default().extend(p);
            }
        }
        points
    }

    /// Each core's clock, from [`NtffFile::sync_points_by_core`].
    pub fn core_clocks(&self, cores: Option<&[u32]>) -> HashMap<u32, SyncClock> {
        self.sync_points_by_core(cores).into_iter().map(|(core, p)| (core, SyncClock::new(p))).collect()
    }

    /// What is missing from the file.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The file's size in bytes.
    pub fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.len() == 0
    }

    /// The checked payload of the record of `kind` whose frame is at `offset`.
    fn payload(&self, offset: u64, kind: RecordKind) -> Result<Cow<'_, [u8]>, String> {
        let at = usize::try_from(offset).map_err(|_| "offset out of range".to_string())?;
        if at >= self.bytes.len() {
            return Err(format!("offset {offset} is past the end of the file"));
        }
        let header = self.bytes.get(at..at.saturating_add(format::FRAME_BYTES))?;
        let frame = Frame::decode(&header).ok_or_else(|| "no record frame there".to_string())?;
        if frame.kind_code != kind as u8 {
            return Err(format!("expected a {} record, found kind {}", kind.name(), frame.kind_code));
        }
        if frame.length as usize > format::MAX_RECORD_BYTES {
            return Err(format!("implausible record length {}", frame.length));
        }
        let start = at + format::FRAME_BYTES;
        let end = start + frame.length as usize;
        if end > self.bytes.len() {
            return Err("the record is cut short".to_string());
        }
        let payload = self.bytes.get(start..end)?;
        if !frame.verify(&header, &payload) {
            return Err("checksum mismatch".to_string());
        }
        Ok(payload)
    }

    /// Opens through the trailer and index; false when they are missing or damaged.
    fn open_by_index(&mut self) -> bool {
        let len = self.bytes.len();
        if len < format::HEADER_BYTES + format::TRAILER_BYTES {
            return false;
        }
        let Ok(trailer) = self.bytes.get(len - format::TRAILER_BYTES..len) else { return false };
        if trailer.len() != format::TRAILER_BYTES || trailer[8..] != format::TRAILER_MAGIC {
            return false;
        }
        let mut word = [0u8; 8];
        word.copy_from_slice(&trailer[..8]);
        let at = u64::from_le_bytes(word);
        let Ok(payload) = self.payload(at, RecordKind::Index) else { return false };
        if at as usize + format::FRAME_BYTES + payload.len() != len - format::TRAILER_BYTES {
            return false;
        }
        let Ok(index) = <proto::Index as prost::Message>::decode(&*payload) else { return false };
        let mut tables = Vec::with_capacity(index.tables.len());
        for &offset in &index.tables {
            let at = usize::try_from(offset).unwrap_or(usize::MAX);
            let header = self.bytes.get(at..at.saturating_add(format::FRAME_BYTES));
            let kind = match header.as_deref().ok().and_then(Frame::decode) {
                Some(frame) => RecordKind::from_code(frame.kind_code),
                None => None,
            };
            let Some(kind) = kind else { return false };
            let Ok(payload) = self.payload(offset, kind) else { return false };
            tables.push((offset, kind, payload.to_vec()));
        }
        for (offset, kind, payload) in tables {
            self.table(offset, kind, &payload);
        }
        self.chunks = index
            .chunks
            .iter()
            .map(|c| ChunkInfo {
                offset: c.offset,
                core: core_of_stream(c.stream),
                system_events: c.system_events,
                device_events: c.device_events,
                lost_events: c.lost_events,
                host_span: (c.host_max_ns != 0).then_some((c.host_min_ns, c.host_max_ns)),
                device_span: (c.device_max_ns != 0).then_some((c.device_min_ns, c.device_max_ns)),
            })
            .collect();
        self.recovery.finished = true;
        true
    }

    /// Walks the frames from the header on, keeping every sound record. The whole file
    /// is read for it (a file without its index is one being written, or damaged).
    fn scan(&mut self) {
        let source = std::mem::replace(&mut self.bytes, Bytes::Owned(Vec::new()));
        match source.get(0..source.len()) {
            Ok(all) => self.scan_bytes(&all),
            Err(reason) => self.recovery.damaged.push(Damage {
                offset: 0,
                bytes: source.len() as u64,
                kind: None,
                events: None,
                reason,
            }),
        }
        self.bytes = source;
    }

    /// [`NtffFile::scan`] over `bytes`, the whole file.
    fn scan_bytes(&mut self, bytes: &[u8]) {
        let len = bytes.len();
        let mut at = format::HEADER_BYTES;
        while at < len {
            let rest = &bytes[at..];
            let Some(frame) = Frame::decode(rest) else {
                if rest.len() < format::FRAME_BYTES && format::FRAME_SYNC.starts_with(&rest[..rest.len().min(4)]) {
                    self.recovery.truncated = Some(Damage {
                        offset: at as u64,
                        bytes: rest.len() as u64,
                        kind: None,
                        events: None,
                        reason: "the file ends inside a record header".into(),
                    });
                    break;
                }
                at = self.skip_to_next_frame(bytes, at, None, "no record frame where one should start".into());
                continue;
            };
            let kind = RecordKind::from_code(frame.kind_code);
            let length = frame.length as usize;
            let end = format::FRAME_BYTES.saturating_add(length);
            if length > format::MAX_RECORD_BYTES || kind.is_none() {
                at = self.skip_to_next_frame(
                    bytes,
                    at,
                    None,
                    format!("implausible record header (kind {})", frame.kind_code),
                );
                continue;
            }
            let kind_name = kind.map(RecordKind::name);
            let events = (kind == Some(RecordKind::Chunk)).then_some(frame.events);
            if end > rest.len() {
                // Cut short; unless a later frame shows that the length was damaged.
                if let Some(next) = find_frame(bytes, at + 1) {
                    let bad = Damage {
                        offset: at as u64,
                        bytes: (next - at) as u64,
                        kind: kind_name,
                        events,
                        reason: "record length runs past the next record".into(),
                    };
                    self.recovery.damaged.push(bad);
                    at = next;
                    continue;
                }
                self.recovery.truncated = Some(Damage {
                    offset: at as u64,
                    bytes: rest.len() as u64,
                    kind: kind_name,
                    events,
                    reason: format!("the file ends {} bytes into this {}-byte record", rest.len(), end),
                });
                break;
            }
            let payload = &rest[format::FRAME_BYTES..end];
            if !frame.verify(rest, payload) {
                // Trust the length only when a frame (or the end) follows it.
                let next = at + end;
                let follows = next == len || Frame::decode(&bytes[next..]).is_some() || is_trailer(&bytes[next..]);
                if follows {
                    self.recovery.damaged.push(Damage {
                        offset: at as u64,
                        bytes: end as u64,
                        kind: kind_name,
                        events,
                        reason: "checksum mismatch".into(),
                    });
                    at = next;
                } else {
                    at = self.skip_to_next_frame(bytes, at, kind_name, "checksum mismatch".into());
                }
                continue;
            }
            let kind = kind.unwrap_or(RecordKind::Index);
            let payload = payload.to_vec();
            match kind {
                RecordKind::Chunk => match decode_chunk(&payload) {
                    Ok(chunk) if (chunk.system.len() + chunk.device.len()) as u64 != u64::from(frame.events) => {
                        self.recovery.damaged.push(Damage {
                            offset: at as u64,
                            bytes: end as u64,
                            kind: kind_name,
                            events,
                            reason: format!(
                                "it holds {} events where its frame says {}",
                                chunk.system.len() + chunk.device.len(),
                                frame.events
                            ),
                        })
                    }
                    Ok(chunk) => self.chunks.push(info_of(at as u64, &chunk)),
                    Err(e) => self.recovery.damaged.push(Damage {
                        offset: at as u64,
                        bytes: end as u64,
                        kind: kind_name,
                        events,
                        reason: e.0,
                    }),
                },
                RecordKind::Index => {
                    // The index is written last: whatever follows should be the trailer.
                    let next = at + end;
                    if is_trailer(&bytes[next..]) {
                        self.recovery.finished = true;
                    } else if len - next < format::TRAILER_BYTES {
                        self.recovery.truncated = Some(Damage {
                            offset: next as u64,
                            bytes: (len - next) as u64,
                            kind: Some("trailer"),
                            events: None,
                            reason: "the file ends inside its trailer".into(),
                        });
                    }
                    if len - next <= format::TRAILER_BYTES {
                        break;
                    }
                }
                other => self.table(at as u64, other, &payload),
            }
            at += end;
        }
    }

    /// Records damage from `at` to the next frame and returns where that is.
    fn skip_to_next_frame(&mut self, bytes: &[u8], at: usize, kind: Option<&'static str>, reason: String) -> usize {
        let next = find_frame(bytes, at + 1).unwrap_or(bytes.len());
        self.recovery.damaged.push(Damage { offset: at as u64, bytes: (next - at) as u64, kind, events: None, reason });
        next
    }

    /// Applies a table record (metadata, models, strings, descriptors).
    fn table(&mut self, offset: u64, kind: RecordKind, payload: &[u8]) {
        let damaged = |reason: String| Damage {
            offset,
            bytes: (format::FRAME_BYTES + payload.len()) as u64,
            kind: Some(kind.name()),
            events: None,
            reason,
        };
        let result: Result<(), String> = match kind {
            RecordKind::Metadata => <proto::Metadata as prost::Message>::decode(payload)
                .map(|m| self.metadata = m)
                .map_err(|e| e.to_string()),
            RecordKind::Models => <proto::Models as prost::Message>::decode(payload)
                .map(|m| self.models.extend(m.models))
                .map_err(|e| e.to_string()),
            RecordKind::Communicators => <proto::Communicators as prost::Message>::decode(payload)
                .map(|c| self.communicators = c.communicators)
                .map_err(|e| e.to_string()),
            RecordKind::Strings => <proto::Strings as prost::Message>::decode(payload)
                .map_err(|e| e.to_string())
                .and_then(|s| append(&mut self.strings, s.first_id, s.values.into_iter().map(Some), "string")),
            RecordKind::Descriptors => {
                <proto::Descriptors as prost::Message>::decode(payload).map_err(|e| e.to_string()).and_then(|d| {
                    append(&mut self.descriptors, d.first_id, d.values.iter().map(descriptor_from_proto), "descriptor")
                })
            }
            RecordKind::Chunk | RecordKind::Index => Ok(()),
        };
        if let Err(reason) = result {
            self.recovery.damaged.push(damaged(reason));
        }
    }
}

/// Checks the header, `head` (the first bytes of a file of `len` bytes); returns the
/// version.
fn check_header(head: &[u8], len: usize) -> Result<u32, NtffError> {
    let magic_part = &head[..head.len().min(8)];
    if format::MAGIC[..magic_part.len()] != *magic_part {
        return Err(NtffError::NotNtff);
    }
    if head.len() < format::HEADER_BYTES {
        return Err(NtffError::Truncated { bytes: len as u64 });
    }
    let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if !(format::MIN_READ_VERSION..=format::MAX_READ_VERSION).contains(&version) {
        return Err(NtffError::UnsupportedVersion {
            found: version,
            min: format::MIN_READ_VERSION,
            max: format::MAX_READ_VERSION,
        });
    }
    Ok(version)
}

fn is_trailer(bytes: &[u8]) -> bool {
    bytes.len() == format::TRAILER_BYTES && bytes[8..] == format::TRAILER_MAGIC
}

/// The offset of the next frame sync word at or after `from`.
fn find_frame(bytes: &[u8], from: usize) -> Option<usize> {
    let rest = bytes.get(from..)?;
    rest.windows(format::FRAME_SYNC.len()).position(|w| w == format::FRAME_SYNC).map(|k| from + k)
}

fn info_of(offset: u64, chunk: &Chunk) -> ChunkInfo {
    let mut host: Option<(u64, u64)> = None;
    let mut device: Option<(u64, u64)> = None;
    let widen = |span: &mut Option<(u64, u64)>, low: u64, high: u64| {
        *span = Some(span.map_or((low, high), |(a, b)| (a.min(low), b.max(high))));
    };
    for e in &chunk.system {
        match e.clock {
            crate::Clock::Host => widen(&mut host, e.timestamp_ns, e.timestamp_ns),
            crate::Clock::Device => widen(&mut device, e.timestamp_ns, e.timestamp_ns),
        }
    }
    for e in &chunk.device {
        widen(&mut device, e.start_ns.min(e.end_ns), e.start_ns.max(e.end_ns));
    }
    if let (Some((low, high)), Some(point)) = (device, chunk.sync_points.last()) {
        let offset = point.host_ns.wrapping_sub(point.device_ns);
        widen(&mut host, low.wrapping_add(offset), high.wrapping_add(offset));
    }
    ChunkInfo {
        offset,
        core: chunk.core,
        system_events: chunk.system.len() as u32,
        device_events: chunk.device.len() as u32,
        lost_events: chunk.losses.iter().map(|l| l.events).fold(0, u64::saturating_add),
        host_span: host,
        device_span: device,
    }
}

fn descriptor_from_proto(d: &proto::Descriptor) -> Option<Descriptor> {
    Some(match d.kind.as_ref()? {
        proto::descriptor::Kind::Instruction(i) => Descriptor::Instruction {
            model_id: d.model_id,
            engine: Sym(i.engine),
            opcode: Sym(i.opcode),
            hlo: Sym(i.hlo),
            step: i.step,
            flops: i.flops,
            bytes_read: i.bytes_read,
            bytes_written: i.bytes_written,
        },
        proto::descriptor::Kind::Dma(m) => {
            Descriptor::Dma { model_id: d.model_id, queue: Sym(m.queue), index: m.index, bytes: m.bytes }
        }
    })
}
