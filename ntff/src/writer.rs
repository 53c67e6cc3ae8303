//! The streaming writer. Events go into one open chunk per stream; a chunk is written
//! when it holds [`MAX_CHUNK_EVENTS`] events (or [`MAX_CHUNK_ARGS`] arguments), or on
//! [`Writer::flush`]. New strings and descriptors are written just before the first chunk
//! that uses them, so every prefix of the file that ends on a record boundary is a
//! readable trace. Memory stays bounded by the open chunks and the interning tables.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::codec::ChunkEncoder;
use crate::format::{self, Frame, RecordKind};
use crate::model::{ChunkInfo, Descriptor, DescriptorId, DeviceEvent, SyncPoint, SystemEvent, stream_code};
use crate::proto;
use crate::{NtffError, Sym};

/// Events in a chunk before it is written.
pub const MAX_CHUNK_EVENTS: usize = 65_536;
/// System event arguments in a chunk before it is written.
pub const MAX_CHUNK_ARGS: usize = 262_144;
/// Strings or descriptors in one table record at most.
const MAX_TABLE_ENTRIES: usize = 16_384;

/// What a finished file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteSummary {
    pub system_events: u64,
    pub device_events: u64,
    pub lost_events: u64,
    pub chunks: u64,
    pub bytes: u64,
}

/// Writes an NTFF v2 file, record by record.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
    offset: u64,
    strings: HashMap<String, Sym>,
    pending_strings: Vec<String>,
    descriptors: HashMap<Descriptor, DescriptorId>,
    pending_descriptors: Vec<Descriptor>,
    /// Open chunks by stream code.
    open: Vec<Option<ChunkEncoder>>,
    /// Encoders of written chunks, kept for their buffers.
    spare: Vec<ChunkEncoder>,
    index: Vec<ChunkInfo>,
    tables: Vec<u64>,
    buffer: Vec<u8>,
    summary: WriteSummary,
    /// Host minus device clock of each core at its latest sync point.
    clock_offsets: Vec<Option<i64>>,
}

impl Writer<ProfileFile> {
    /// Starts a profile that will replace `path` (see [`ProfileFile`]) and writes the
    /// header and `metadata`.
    pub fn create(path: &Path, metadata: &proto::Metadata) -> Result<Writer<ProfileFile>, NtffError> {
        Writer::new(ProfileFile::create(path)?, metadata)
    }
}

/// What a profile being written is named until it is placed: `NAME` + this.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// The profiles of `dir` whose writing never finished (`NAME.ntff.partial`: the process
/// writing it died, or was stopped), as (file name, bytes), by name.
pub fn unfinished_profiles(dir: &Path) -> std::io::Result<Vec<(String, u64)>> {
    let mut found: Vec<(String, u64)> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let bytes = e.metadata().map_or(0, |m| m.len());
            name.strip_suffix(PARTIAL_SUFFIX)?.ends_with(".ntff").then_some((name, bytes))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// A profile file being written. The bytes go to `NAME.partial` beside `path`, which is
/// renamed into place by [`ProfileFile::place`] (or, after an error, when it is
/// dropped): a reader of the previous file at `path` (a dashboard serving it, a
/// download in progress) goes on reading that one whole, and no reader sees a
/// half-written profile under the final name. A process killed while writing leaves
/// `NAME.partial`, readable up to its last complete record.
#[derive(Debug)]
pub struct ProfileFile {
    out: Option<BufWriter<File>>,
    partial: PathBuf,
    path: PathBuf,
}

impl ProfileFile {
    /// Creates `path` + `.partial` (replacing a file there).
    pub fn create(path: &Path) -> Result<ProfileFile, NtffError> {
        let mut partial = path.as_os_str().to_owned();
        partial.push(PARTIAL_SUFFIX);
        let partial = PathBuf::from(partial);
        let file = File::create(&partial).map_err(|e| NtffError::io(&partial, e))?;
        Ok(ProfileFile { out: Some(BufWriter::with_capacity(1 << 20, file)), partial, path: path.to_owned() })
    }

    /// Where the profile goes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes what is buffered and renames the file into place.
    pub fn place(mut self) -> Result<(), NtffError> {
        self.put_in_place()
    }

    fn put_in_place(&mut self) -> Result<(), NtffError> {
        let Some(mut out) = self.out.take() else { return Ok(()) };
        out.flush().map_err(|e| NtffError::io(&self.partial, e))?;
        drop(out);
        std::fs::rename(&self.partial, &self.path).map_err(|e| NtffError::io(&self.path, e))
    }
}

impl Write for ProfileFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.out {
            Some(out) => out.write(buf),
            None => Err(std::io::Error::other("the profile was already put in place")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.as_mut().map_or(Ok(()), BufWriter::flush)
    }
}

impl Drop for ProfileFile {
    fn drop(&mut self) {
        // What was written is a readable profile up to its last complete record: put it
        // where it was asked for, as an unfinished one.
        if let Err(e) = self.put_in_place() {
            eprintln!("the profile stays at {}: {e}", self.partial.display());
        }
    }
}

impl<W: Write> Writer<W> {
    /// Starts a file on `out` with `metadata`.
    pub fn new(mut out: W, metadata: &proto::Metadata) -> Result<Writer<W>, NtffError> {
        out.write_all(&format::header(format::VERSION)).map_err(NtffError::write)?;
        let mut writer = Writer {
            out,
            offset: format::HEADER_BYTES as u64,
            strings: HashMap::new(),
            pending_strings: Vec::new(),
            descriptors: HashMap::new(),
            pending_descriptors: Vec::new(),
            open: Vec::new(),
            spare: Vec::new(),
            index: Vec::new(),
            tables: Vec::new(),
            buffer: Vec::new(),
            summary: WriteSummary::default(),
            clock_offsets: Vec::new(),
        };
        let payload = prost::Message::encode_to_vec(metadata);
        let offset = writer.record(RecordKind::Metadata, 0, &payload)?;
        writer.tables.push(offset);
        Ok(writer)
    }

    /// The id of `s` in the string table, adding it if new.
    pub fn intern(&mut self, s: &str) -> Sym {
        if s.is_empty() {
            return Sym::EMPTY;
        }
        if let Some(&sym) = self.strings.get(s) {
            return sym;
        }
        let sym = Sym(self.strings.len() as u32 + 1);
        self.strings.insert(s.to_owned(), sym);
        self.pending_strings.push(s.to_owned());
        sym
    }

    /// The id of `descriptor` in the descriptor table, adding it if new.
    pub fn descriptor(&mut self, descriptor: &Descriptor) -> DescriptorId {
        if let Some(&id) = self.descriptors.get(descriptor) {
            return id;
        }
        let id = DescriptorId(self.descriptors.len() as u32);
        self.descriptors.insert(*descriptor, id);
        self.pending_descriptors.push(*descriptor);
        id
    }

    /// Records the models of the traced process (written at once).
    pub fn models(&mut self, models: &[proto::Model]) -> Result<(), NtffError> {
        let payload = prost::Message::encode_to_vec(&proto::Models { models: models.to_vec() });
        let offset = self.record(RecordKind::Models, 0, &payload)?;
        self.tables.push(offset);
        Ok(())
    }

    /// Records the communicators of the traced process (written at once; a later record
    /// replaces an earlier one).
    pub fn communicators(&mut self, communicators: &[proto::Communicator]) -> Result<(), NtffError> {
        let payload = prost::Message::encode_to_vec(&proto::Communicators { communicators: communicators.to_vec() });
        let offset = self.record(RecordKind::Communicators, 0, &payload)?;
        self.tables.push(offset);
        Ok(())
    }

    pub fn system(&mut self, event: &SystemEvent) -> Result<(), NtffError> {
        check_optional(event.exec_id, event.model_id, event.nrta_seq_id)?;
        let chunk = self.chunk(event.core, event.timestamp_ns)?;
        chunk.push_system(event);
        self.summary.system_events += 1;
        self.close_if_full(event.core)
    }

    pub fn device(&mut self, event: &DeviceEvent) -> Result<(), NtffError> {
        check_optional(event.exec_id, None, None)?;
        let chunk = self.chunk(Some(event.core), event.start_ns)?;
        chunk.push_device(event);
        self.summary.device_events += 1;
        self.close_if_full(Some(event.core))
    }

    /// Records that the source dropped `events` events of `core`'s system or device
    /// ring at this point of the stream.
    pub fn loss(&mut self, core: Option<u32>, device: bool, events: u64) -> Result<(), NtffError> {
        if events == 0 {
            return Ok(());
        }
        let chunk = self.chunk(core, 0)?;
        chunk.push_loss(device, events);
        self.summary.lost_events += events;
        Ok(())
    }

    /// Records a reading of `core`'s device clock paired with the host clock.
    pub fn sync_point(&mut self, core: u32, point: SyncPoint) -> Result<(), NtffError> {
        self.chunk(Some(core), point.device_ns)?.push_sync_point(point);
        let slot = core as usize;
        if slot >= self.clock_offsets.len() {
            self.clock_offsets.resize(slot + 1, None);
        }
        self.clock_offsets[slot] = Some(point.host_ns.wrapping_sub(point.device_ns) as i64);
        Ok(())
    }

    /// Writes every open chunk and flushes the output, so a reader (or a crash) sees
    /// everything given so far.
    pub fn flush(&mut self) -> Result<(), NtffError> {
        for code in 0..self.open.len() {
            self.close(code)?;
        }
        self.out.flush().map_err(NtffError::write)
    }

    /// Writes the open chunks, the index and the trailer; returns the output and what
    /// the file holds.
    pub fn finish(mut self) -> Result<(W, WriteSummary), NtffError> {
        self.flush()?;
        let index = proto::Index {
            chunks: self
                .index
                .iter()
                .map(|c| proto::ChunkEntry {
                    offset: c.offset,
                    stream: stream_code(c.core),
                    system_events: c.system_events,
                    device_events: c.device_events,
                    lost_events: c.lost_events,
                    host_min_ns: c.host_span.map_or(0, |s| s.0),
                    host_max_ns: c.host_span.map_or(0, |s| s.1),
                    device_min_ns: c.device_span.map_or(0, |s| s.0),
                    device_max_ns: c.device_span.map_or(0, |s| s.1),
                })
                .collect(),
            tables: std::mem::take(&mut self.tables),
        };
        let payload = prost::Message::encode_to_vec(&index);
        let at = self.record(RecordKind::Index, 0, &payload)?;
        self.out.write_all(&format::trailer(at)).map_err(NtffError::write)?;
        self.offset += format::TRAILER_BYTES as u64;
        self.out.flush().map_err(NtffError::write)?;
        self.summary.bytes = self.offset;
        Ok((self.out, self.summary))
    }

    /// What has been given so far.
    pub fn summary(&self) -> WriteSummary {
        WriteSummary { bytes: self.offset, ..self.summary }
    }

    fn chunk(&mut self, core: Option<u32>, base_ns: u64) -> Result<&mut ChunkEncoder, NtffError> {
        let code = stream_code(core) as usize;
        if code >= self.open.len() {
            self.open.resize_with(code + 1, || None);
        }
        let slot = &mut self.open[code];
        if slot.is_none() {
            *slot = Some(match self.spare.pop() {
                Some(mut encoder) => {
                    encoder.reset(core, base_ns);
                    encoder
                }
                None => ChunkEncoder::new(core, base_ns),
            });
        }
        Ok(slot.as_mut().expect("filled above"))
    }

    fn close_if_full(&mut self, core: Option<u32>) -> Result<(), NtffError> {
        let code = stream_code(core) as usize;
        if let Some(chunk) = &self.open[code]
            && (chunk.len() >= MAX_CHUNK_EVENTS || chunk.args() >= MAX_CHUNK_ARGS)
        {
            self.close(code)?;
        }
        Ok(())
    }

    /// Writes the chunk of stream `code`, after the tables it may use.
    fn close(&mut self, code: usize) -> Result<(), NtffError> {
        let Some(chunk) = self.open.get_mut(code).and_then(Option::take) else { return Ok(()) };
        self.write_tables()?;
        let mut buffer = std::mem::take(&mut self.buffer);
        let mut info = chunk.finish(&mut buffer);
        // The index's host span covers the device events too, through the core's clock
        // offset (which drifts by parts per million, so the latest one serves).
        let offset = info.core.and_then(|c| self.clock_offsets.get(c as usize).copied().flatten());
        if let (Some((low, high)), Some(offset)) = (info.device_span, offset) {
            let (low, high) = (low.wrapping_add(offset as u64), high.wrapping_add(offset as u64));
            info.host_span = Some(match info.host_span {
                Some((a, b)) => (a.min(low), b.max(high)),
                None => (low, high),
            });
        }
        let events = info.system_events + info.device_events;
        let written = self.record(RecordKind::Chunk, events, &buffer);
        self.buffer = buffer;
        self.spare.push(chunk);
        info.offset = written?;
        self.index.push(info);
        self.summary.chunks += 1;
        Ok(())
    }

    fn write_tables(&mut self) -> Result<(), NtffError> {
        let first_string = (self.strings.len() - self.pending_strings.len()) as u32 + 1;
        let strings = std::mem::take(&mut self.pending_strings);
        for (k, part) in strings.chunks(MAX_TABLE_ENTRIES).enumerate() {
            let record =
                proto::Strings { first_id: first_string + (k * MAX_TABLE_ENTRIES) as u32, values: part.to_vec() };
            let offset = self.record(RecordKind::Strings, 0, &prost::Message::encode_to_vec(&record))?;
            self.tables.push(offset);
        }
        let first_descriptor = (self.descriptors.len() - self.pending_descriptors.len()) as u32;
        let descriptors = std::mem::take(&mut self.pending_descriptors);
        for (k, part) in descriptors.chunks(MAX_TABLE_ENTRIES).enumerate() {
            let record = proto::Descriptors {
                first_id: first_descriptor + (k * MAX_TABLE_ENTRIES) as u32,
                values: part.iter().map(descriptor_to_proto).collect(),
            };
            let offset = self.record(RecordKind::Descriptors, 0, &prost::Message::encode_to_vec(&record))?;
            self.tables.push(offset);
        }
        Ok(())
    }

    /// Writes one framed record; returns its offset.
    fn record(&mut self, kind: RecordKind, events: u32, payload: &[u8]) -> Result<u64, NtffError> {
        let at = self.offset;
        self.out.write_all(&Frame::encode(kind, events, payload)).map_err(NtffError::write)?;
        self.out.write_all(payload).map_err(NtffError::write)?;
        self.offset += (format::FRAME_BYTES + payload.len()) as u64;
        Ok(at)
    }
}

fn check_optional(exec_id: Option<u64>, model_id: Option<u32>, nrta_seq_id: Option<u64>) -> Result<(), NtffError> {
    if exec_id == Some(u64::MAX) || nrta_seq_id == Some(u64::MAX) || model_id == Some(u32::MAX) {
        return Err(NtffError::InvalidEvent("exec, model and nrta sequence ids must be below their type's maximum"));
    }
    Ok(())
}

pub(crate) fn descriptor_to_proto(d: &Descriptor) -> proto::Descriptor {
    match *d {
        Descriptor::Instruction { model_id, engine, opcode, hlo, step, flops, bytes_read, bytes_written } => {
            proto::Descriptor {
                model_id,
                kind: Some(proto::descriptor::Kind::Instruction(proto::InstructionDescriptor {
                    engine: engine.0,
                    opcode: opcode.0,
                    hlo: hlo.0,
                    step,
                    flops,
                    bytes_read,
                    bytes_written,
                })),
            }
        }
        Descriptor::Dma { model_id, queue, index, bytes } => proto::Descriptor {
            model_id,
            kind: Some(proto::descriptor::Kind::Dma(proto::DmaDescriptor { queue: queue.0, index, bytes })),
        },
    }
}
