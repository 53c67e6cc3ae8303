//! Timelines from NTFF files, for Perfetto (protobuf `Trace`) and for Chrome's JSON
//! trace format.
//!
//! One layout feeds both encoders. Each file becomes a process; under it a track group
//! per NeuronCore holds the core's executions (`nc_exec_running`), one track per engine
//! and per DMA queue, and counters (utilisation, tensor memory, events lost). Host
//! threads get thread tracks with the system events as slices, and a flow joins each
//! `nrt_execute` to the `nc_exec_running` it caused. Device times are moved onto the
//! host clock through the execution's own sync point.
//!
//! Every track is written in time order with strict nesting: system events nest by
//! their start/stop pairs; device events that overlap without nesting (which the
//! runtime does not produce on one engine) go to an extra lane of their track. The
//! exporter streams: it holds, per stream, the chunk being merged and one decoded
//! ahead of it, and small per-track state.

mod chrome;
pub mod perfetto;
mod verify;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::io::Write;
use std::sync::mpsc::Receiver;

use crate::model::{ArgValue, Chunk, ChunkInfo, Clock, Descriptor, DescriptorId, DeviceEvent, Phase, Sym, SystemEvent};
use crate::{NtffError, NtffFile, SyncClock, SyncPoint};

pub use verify::{TraceCheck, TrackCheck, verify_perfetto};

/// What to export.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Only these NeuronCores (`None`: all, and the host stream).
    pub cores: Option<Vec<u32>>,
    /// Only system events of these types (`None`: all). Device events are left out
    /// when a type list is given, as in the JSON output.
    pub system_types: Option<Vec<String>>,
}

/// The output encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A Perfetto `Trace` protobuf (`.pftrace`), for ui.perfetto.dev and trace_processor.
    Perfetto,
    /// Chrome's JSON trace event format, for small traces and older viewers.
    ChromeJson,
}

/// How far an export has come, in events read from the files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub events_done: u64,
    pub events_total: u64,
}

/// What an export wrote, and what it could not place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportSummary {
    pub processes: u32,
    pub tracks: u32,
    /// Slices from device events (instructions and DMA transfers).
    pub device_slices: u64,
    /// Slices from system events.
    pub system_slices: u64,
    pub instants: u64,
    pub counter_values: u64,
    pub flows: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Events the rings dropped, as recorded in the files.
    pub ring_events_lost: u64,
    /// Chunks that could not be read (damaged files), and the events they held.
    pub damaged_chunks: u64,
    pub damaged_chunk_events: u64,
    /// Stops whose start is not in the trace: written as instants.
    pub stops_without_start: u64,
    /// Starts whose stop never came: left open at the end, or closed by an enclosing stop.
    pub unfinished: u64,
    /// Events written at a later time than recorded to keep a track in time order.
    pub reordered: u64,
    /// Device events, and device-clock system events, left out: their core has no sync
    /// point to place them on the host clock.
    pub unaligned_device_events: u64,
    pub unaligned_system_events: u64,
}

impl ExportSummary {
    pub fn slices(&self) -> u64 {
        self.device_slices + self.system_slices
    }

    /// Sentences about what was not exported as recorded; empty when everything was.
    pub fn problems(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if self.ring_events_lost > 0 {
            lines.push(format!(
                "{} events were lost to ring overwrites while recording (see the \"events lost\" counters)",
                self.ring_events_lost
            ));
        }
        if self.damaged_chunks > 0 {
            lines.push(format!(
                "{} damaged chunks ({} events) could not be read",
                self.damaged_chunks, self.damaged_chunk_events
            ));
        }
        if self.stops_without_start > 0 {
            lines.push(format!(
                "{} stop events had no start in the trace and are shown as instants",
                self.stops_without_start
            ));
        }
        if self.unfinished > 0 {
            lines.push(format!("{} spans have no stop in the trace", self.unfinished));
        }
        if self.reordered > 0 {
            lines.push(format!("{} events were moved later to keep their track in time order", self.reordered));
        }
        if self.unaligned_device_events + self.unaligned_system_events > 0 {
            lines.push(format!(
                "{} device events and {} device-clock system events were left out: their core has no clock sync point",
                self.unaligned_device_events, self.unaligned_system_events
            ));
        }
        lines
    }
}

/// Writes `files` as one trace in `format`, a process per file. `progress` is called
/// after each chunk.
pub fn export<W: Write>(
    files: &[NtffFile],
    options: &ExportOptions,
    format: Format,
    out: W,
    progress: &mut dyn FnMut(Progress),
) -> Result<(W, ExportSummary), NtffError> {
    match format {
        Format::Perfetto => run(files, options, perfetto::PerfettoSink::new(out), progress),
        Format::ChromeJson => run(files, options, chrome::ChromeSink::new(out), progress),
    }
}

fn run<S: Sink>(
    files: &[NtffFile],
    options: &ExportOptions,
    sink: S,
    progress: &mut dyn FnMut(Progress),
) -> Result<(S::Out, ExportSummary), NtffError> {
    let events_total = files
        .iter()
        .flat_map(|f| f.select(options.cores.as_deref(), None))
        .map(|c| u64::from(c.system_events) + u64::from(c.device_events))
        .sum();
    let mut layout = Layout {
        sink,
        names: Names::default(),
        tracks: Vec::new(),
        summary: ExportSummary::default(),
        progress: Progress { events_done: 0, events_total },
    };
    let start =
        files.iter().flat_map(|f| f.chunks().iter().filter_map(|c| c.host_span)).map(|(low, _)| low).min().unwrap_or(0);
    let realtime = files.first().and_then(|f| f.metadata().clock.as_ref()).map(|c| c.realtime_minus_monotonic_ns);
    layout.sink.start(start, realtime).map_err(NtffError::write)?;
    for (k, file) in files.iter().enumerate() {
        FileExport::new(&mut layout, file, k as u64 + 1, options)?.run(&mut layout, progress)?;
        layout.summary.processes += 1;
    }
    layout.summary.tracks = layout.tracks.len() as u32;
    let (out, bytes) = layout.sink.finish().map_err(NtffError::write)?;
    layout.summary.bytes = bytes;
    Ok((out, layout.summary))
}

/// An index into the layout's tracks.
pub(crate) type TrackIx = u32;
/// An index into the layout's name table, shared by every file of an export.
pub(crate) type NameId = u32;

/// What a track is.
#[derive(Debug, Clone)]
pub(crate) enum TrackKind {
    Process {
        pid: u32,
        name: String,
        cmdline: Vec<String>,
        labels: Vec<String>,
    },
    Thread {
        pid: u32,
        tid: u32,
        name: String,
    },
    /// A group of tracks, without events of its own.
    Group {
        name: String,
    },
    Slices {
        name: String,
    },
    Counter {
        name: String,
        unit: CounterUnit,
        description: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CounterUnit {
    Percent,
    Bytes,
    Count,
}

#[derive(Debug, Clone)]
pub(crate) struct Track {
    pub(crate) ix: TrackIx,
    pub(crate) uuid: u64,
    pub(crate) parent: Option<TrackIx>,
    pub(crate) parent_uuid: Option<u64>,
    /// Position among its siblings.
    pub(crate) rank: i32,
    /// The process it belongs to.
    pub(crate) pid: u32,
    pub(crate) kind: TrackKind,
}

impl Track {
    /// The name with its group's, for encodings without groups.
    pub(crate) fn name(&self) -> &str {
        match &self.kind {
            TrackKind::Process { name, .. }
            | TrackKind::Thread { name, .. }
            | TrackKind::Group { name }
            | TrackKind::Slices { name }
            | TrackKind::Counter { name, .. } => name,
        }
    }
}

/// An argument shown with an event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Annotation<'a> {
    pub(crate) key: NameId,
    pub(crate) key_text: &'a str,
    pub(crate) value: AnnotationValue<'a>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum AnnotationValue<'a> {
    U64(u64),
    I64(i64),
    /// A string with its id in the name table (encodings may intern it).
    Str(NameId, &'a str),
}

/// A named event: its id in the name table and its text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Name<'a> {
    pub(crate) id: NameId,
    pub(crate) text: &'a str,
}

/// Ring overwrites, as Perfetto's `DATA_LOSS_PRESENT | DATA_LOSS_OVERWRITE`.
pub(crate) const LOSS_OVERWRITE: u32 = 1 | 64;

/// An encoder. Calls for one track come in time order (the layout clamps), slices on a
/// track nest, and a track is described before its first event and after its parent.
pub(crate) trait Sink {
    type Out;
    /// `start`: the earliest host time in the files; `realtime`: CLOCK_REALTIME minus
    /// CLOCK_MONOTONIC, when known.
    fn start(&mut self, start: u64, realtime: Option<i64>) -> std::io::Result<()>;
    fn track(&mut self, track: &Track) -> std::io::Result<()>;
    fn begin(
        &mut self,
        track: TrackIx,
        ts: u64,
        name: Name<'_>,
        args: &[Annotation<'_>],
        flow_out: Option<u64>,
        flow_in: Option<u64>,
    ) -> std::io::Result<()>;
    fn end(&mut self, track: TrackIx, ts: u64) -> std::io::Result<()>;
    fn instant(&mut self, track: TrackIx, ts: u64, name: Name<'_>, args: &[Annotation<'_>]) -> std::io::Result<()>;
    fn counter(&mut self, track: TrackIx, ts: u64, value: f64) -> std::io::Result<()>;
    /// Data of `track` was lost before its next event (`reasons`: Perfetto's bits).
    fn dropped(&mut self, track: TrackIx, reasons: u32);
    /// Flushes; returns the output and the bytes written.
    fn finish(self) -> std::io::Result<(Self::Out, u64)>;
}

/// Names shared by every file of an export.
#[derive(Debug)]
struct Names {
    text: Vec<String>,
    ids: HashMap<String, NameId>,
}

/// Names every export has, at fixed ids.
const KEY_EXEC_ID: NameId = 0;
const KEY_MODEL_ID: NameId = 1;
const KEY_NRTA_SEQ_ID: NameId = 2;

impl Default for Names {
    fn default() -> Names {
        let mut names = Names { text: Vec::new(), ids: HashMap::new() };
        for (id, key) in [(KEY_EXEC_ID, "exec_id"), (KEY_MODEL_ID, "model_id"), (KEY_NRTA_SEQ_ID, "nrta_seq_id")] {
            let interned = names.intern(key);
            debug_assert_eq!(interned, id);
        }
        names
    }
}

impl Names {
    fn intern(&mut self, s: &str) -> NameId {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.text.len() as NameId;
        self.text.push(s.to_owned());
        self.ids.insert(s.to_owned(), id);
        id
    }
}

/// Per-track state the layout keeps.
#[derive(Debug, Default)]
struct TrackState {
    /// The latest time written on the track.
    last: u64,
    /// Device lanes: the ends of the open slices, innermost last.
    open_ends: Vec<u64>,
    /// Thread and execution tracks: the tracking ids of the open slices, innermost last.
    open_ids: Vec<u64>,
}

struct Layout<S: Sink> {
    sink: S,
    names: Names,
    tracks: Vec<TrackState>,
    summary: ExportSummary,
    progress: Progress,
}

impl<S: Sink> Layout<S> {
    fn add_track(
        &mut self,
        file_key: u64,
        parent: Option<(TrackIx, u64)>,
        rank: i32,
        pid: u32,
        kind: TrackKind,
    ) -> Result<TrackIx, NtffError> {
        let ix = self.tracks.len() as TrackIx;
        let track = Track {
            ix,
            uuid: file_key << 40 | (u64::from(ix) + 1),
            parent: parent.map(|p| p.0),
            parent_uuid: parent.map(|p| p.1),
            rank,
            pid,
            kind,
        };
        self.tracks.push(TrackState::default());
        self.sink.track(&track).map_err(NtffError::write)?;
        Ok(ix)
    }

    /// The time to write an event at on `track`: `ts`, or the track's latest time when
    /// `ts` is earlier.
    fn at(&mut self, track: TrackIx, ts: u64) -> u64 {
        let state = &mut self.tracks[track as usize];
        if ts < state.last {
            self.summary.reordered += 1;
            return state.last;
        }
        state.last = ts;
        ts
    }

    fn end(&mut self, track: TrackIx, ts: u64) -> Result<(), NtffError> {
        let ts = self.at(track, ts);
        self.sink.end(track, ts).map_err(NtffError::write)
    }

    fn instant(&mut self, track: TrackIx, ts: u64, name: NameId, args: &[OwnedAnnotation]) -> Result<(), NtffError> {
        let ts = self.at(track, ts);
        self.summary.instants += 1;
        let args: Vec<Annotation<'_>> = args.iter().map(|a| a.borrow(&self.names)).collect();
        let name = Name { id: name, text: &self.names.text[name as usize] };
        self.sink.instant(track, ts, name, &args).map_err(NtffError::write)
    }

    fn counter(&mut self, track: TrackIx, ts: u64, value: f64) -> Result<(), NtffError> {
        let ts = self.at(track, ts);
        self.summary.counter_values += 1;
        self.sink.counter(track, ts, value).map_err(NtffError::write)
    }

    /// Places a device slice on the first lane where it nests; false when it fits none.
    fn place(&mut self, track: TrackIx, start: u64, end: u64, name: NameId, force: bool) -> Result<bool, NtffError> {
        let (mut start, mut end) = (start, end);
        let state = &mut self.tracks[track as usize];
        if start < state.last {
            if !force {
                return Ok(false);
            }
            self.summary.reordered += 1;
            start = state.last;
            end = end.max(start);
        }
        while let Some(&top) = self.tracks[track as usize].open_ends.last() {
            if top > start {
                break;
            }
            self.tracks[track as usize].open_ends.pop();
            self.end(track, top)?;
        }
        let state = &mut self.tracks[track as usize];
        if let Some(&top) = state.open_ends.last()
            && top < end
        {
            if !force {
                return Ok(false);
            }
            self.summary.reordered += 1;
            end = top;
        }
        state.open_ends.push(end);
        state.last = start;
        self.summary.device_slices += 1;
        let name = Name { id: name, text: &self.names.text[name as usize] };
        self.sink.begin(track, start, name, &[], None, None).map_err(NtffError::write)?;
        Ok(true)
    }

    /// Closes the open device slices of `track`.
    fn close_lane(&mut self, track: TrackIx) -> Result<(), NtffError> {
        while let Some(top) = self.tracks[track as usize].open_ends.pop() {
            self.end(track, top)?;
        }
        Ok(())
    }
}

/// Lanes a device track may grow to before overlapping events are clamped into the last.
const MAX_LANES: usize = 8;

/// What the layout does with a system event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SystemKind {
    /// `nrt_execute`: starts the flow to the device.
    Execute,
    /// `nc_exec_running`: on the core's execution track.
    DeviceExecution,
    TensorAllocate,
    TensorFree,
    /// `timestamp_sync_point`: used to align clocks, not drawn.
    SyncPoint,
    Other,
}

impl SystemKind {
    fn of(name: &str) -> SystemKind {
        match name {
            "nrt_execute" => SystemKind::Execute,
            "nc_exec_running" => SystemKind::DeviceExecution,
            "nrt_tensor_allocate" => SystemKind::TensorAllocate,
            "nrt_tensor_free" => SystemKind::TensorFree,
            "timestamp_sync_point" => SystemKind::SyncPoint,
            _ => SystemKind::Other,
        }
    }
}

/// Engines and DMA queues in the order their tracks are shown.
const ENGINE_ORDER: [&str; 5] = ["PE", "ACT", "DVE", "POOL", "SP"];
const QUEUE_ORDER: [&str; 4] = ["input", "output", "weights", "instructions"];

/// Sibling ranks inside a core's group.
const RANK_EXECUTION: i32 = 0;
const RANK_ENGINE: i32 = 16;
const RANK_QUEUE: i32 = 256;
const RANK_COUNTER: i32 = 512;
/// Host threads come before the cores in a process.
const RANK_THREAD: i32 = -1;
/// Sibling rank of the process-wide counters, after the cores.
const RANK_PROCESS_COUNTER: i32 = 1 << 20;

/// The tracks of one NeuronCore.
#[derive(Debug)]
struct CoreTracks {
    group: TrackIx,
    group_uuid: u64,
    execution: Option<TrackIx>,
    /// The open `nc_exec_running`: (tracking id, host time).
    execution_start: Option<(u64, u64)>,
    /// Engine and queue tracks: the lanes of each, and which is whose (keyed by
    /// whether it is a DMA queue and the engine or queue string id).
    lane_sets: Vec<Vec<TrackIx>>,
    sets: HashMap<(bool, Sym), usize>,
    set_keys: Vec<(bool, Sym)>,
    /// The lane set of each descriptor, once seen.
    by_descriptor: Vec<Option<usize>>,
    utilisation: Option<TrackIx>,
    busy: Busy,
    memory: Option<TrackIx>,
    memory_bytes: i64,
    system_lost: LostCounter,
    device_lost: LostCounter,
    /// Sync points by device time.
    sync: SyncClock,
}

/// Busy time of a core per fixed bucket, from its execution spans (which do not overlap
/// and come in time order).
#[derive(Debug)]
struct Busy {
    origin: u64,
    width: u64,
    /// The first bucket not yet written.
    next: u64,
    /// Busy nanoseconds of the buckets from `next` on.
    pending: VecDeque<u64>,
    last_value: Option<f64>,
}

impl Busy {
    fn new(origin: u64, width: u64) -> Busy {
        Busy { origin, width, next: 0, pending: VecDeque::new(), last_value: None }
    }

    fn bucket(&self, ts: u64) -> u64 {
        ts.saturating_sub(self.origin) / self.width
    }

    /// Start time of bucket `k`.
    fn time_of(&self, k: u64) -> u64 {
        self.origin.saturating_add(k.saturating_mul(self.width))
    }

    /// Adds a busy interval, and returns the finished buckets' (time, percent) values
    /// that differ from the one before. Times past `MAX_BUCKETS` buckets (which only a
    /// damaged file holds) count in the last.
    fn add(&mut self, start: u64, end: u64, out: &mut Vec<(u64, f64)>) {
        let limit = self.time_of(MAX_BUCKETS);
        let start = start.clamp(self.origin, limit);
        let end = end.clamp(start, limit);
        self.drain_before(self.bucket(start), out);
        let mut t = start.max(self.time_of(self.next));
        while t < end {
            let k = self.bucket(t);
            let upto = end.min(self.time_of(k + 1));
            let slot = (k - self.next) as usize;
            if self.pending.len() <= slot {
                self.pending.resize(slot + 1, 0);
            }
            self.pending[slot] += upto - t;
            t = upto;
        }
    }

    /// Writes out the buckets before `k`.
    fn drain_before(&mut self, k: u64, out: &mut Vec<(u64, f64)>) {
        while self.next < k {
            let busy = self.pending.pop_front().unwrap_or(0);
            let value = (busy as f64 / self.width as f64 * 100.0).min(100.0);
            if self.last_value != Some(value) {
                out.push((self.time_of(self.next), value));
                self.last_value = Some(value);
            }
            self.next += 1;
            if self.pending.is_empty() && self.next < k {
                // Idle until `k`: one zero says it.
                if self.last_value != Some(0.0) {
                    out.push((self.time_of(self.next), 0.0));
                    self.last_value = Some(0.0);
                }
                self.next = k;
            }
        }
    }

    /// Writes out every bucket that has busy time, then a zero.
    fn finish(&mut self, out: &mut Vec<(u64, f64)>) {
        let end = self.next + self.pending.len() as u64 + 1;
        self.drain_before(end, out);
    }
}

/// Utilisation buckets a file may span; 1000 is usual.
const MAX_BUCKETS: u64 = 1 << 20;

/// A bucket width giving about 1000 buckets over `span` nanoseconds: 1, 2 or 5 times a
/// power of ten, at least 10 µs.
fn bucket_width(span: u64) -> u64 {
    let target = (span / 1000).max(10_000);
    let mut unit = 1u64;
    loop {
        for m in [1, 2, 5] {
            if unit * m >= target {
                return unit * m;
            }
        }
        unit *= 10;
    }
}

/// One stream's place in the merge of system events.
#[derive(Debug)]
struct Cursor<'f> {
    core: Option<u32>,
    chunks: VecDeque<&'f ChunkInfo>,
    chunk: Chunk,
    next: usize,
    /// System losses of the chunk: (before, events), by position.
    losses: VecDeque<(u32, u64)>,
    /// Host time of the last system event taken.
    last_ts: u64,
}

/// Chunks of a stream decoded ahead on another thread, in order.
type Decoded<'f> = Receiver<(&'f ChunkInfo, Result<Chunk, NtffError>)>;

/// Streams up to which each gets a thread decoding its chunks ahead of the export.
const MAX_DECODE_THREADS: usize = 8;

/// A cumulative count of lost events and its counter track, once it has one.
#[derive(Debug, Default, Clone, Copy)]
struct LostCounter {
    track: Option<TrackIx>,
    total: u64,
}

/// Which ring lost events: a core's device or system ring (by core slot), or the host's.
#[derive(Debug, Clone, Copy)]
enum LostIn {
    Device(usize),
    System(usize),
    Host,
}

/// The export of one file.
struct FileExport<'f> {
    file: &'f NtffFile,
    key: u64,
    pid: u32,
    process: TrackIx,
    process_uuid: u64,
    device: bool,
    types: Option<HashSet<Sym>>,
    /// The cores' tracks, and where each core's are.
    cores: Vec<CoreTracks>,
    core_slots: HashMap<u32, usize>,
    threads: HashMap<u32, TrackIx>,
    host_memory: (Option<TrackIx>, i64),
    host_lost: LostCounter,
    /// Name ids of the file's strings and descriptors, once used.
    sym_names: Vec<Option<NameId>>,
    descriptor_names: Vec<Option<NameId>>,
    kinds: Vec<Option<SystemKind>>,
    /// Flows started by `nrt_execute` and not yet ended.
    flows: HashSet<u64>,
    origin: u64,
    width: u64,
    cursors: Vec<Cursor<'f>>,
    /// Scratch for counter values.
    values: Vec<(u64, f64)>,
}

impl<'f> FileExport<'f> {
    fn new<S: Sink>(
        layout: &mut Layout<S>,
        file: &'f NtffFile,
        key: u64,
        options: &'f ExportOptions,
    ) -> Result<FileExport<'f>, NtffError> {
        let meta = file.metadata();
        let pid = meta.pid;
        let program = meta.command.first().map(|c| c.rsplit('/').next().unwrap_or(c).to_string());
        let name = match (meta.process_tag.is_empty(), program) {
            (false, _) => meta.process_tag.clone(),
            (true, Some(program)) => program,
            (true, None) => "neuron runtime".to_string(),
        };
        let mut labels = vec![format!("neuron runtime {}", meta.runtime_version)];
        if !meta.capture_kind.is_empty() {
            labels.push(meta.capture_kind.clone());
        }
        let process = layout.add_track(
            key,
            None,
            0,
            pid,
            TrackKind::Process { pid, name, cmdline: meta.command.clone(), labels },
        )?;
        let spans: Vec<(u64, u64)> = file.chunks().iter().filter_map(|c| c.host_span).collect();
        let origin = spans.iter().map(|s| s.0).min().unwrap_or(0);
        let last = spans.iter().map(|s| s.1).max().unwrap_or(origin);
        let types = options
            .system_types
            .as_ref()
            .map(|types| types.iter().filter_map(|t| file.find_string(t.trim())).collect::<HashSet<Sym>>());
        let mut export = FileExport {
            file,
            key,
            pid,
            process,
            process_uuid: key << 40 | (u64::from(process) + 1),
            device: options.system_types.is_none(),
            types,
            cores: Vec::new(),
            core_slots: HashMap::new(),
            threads: HashMap::new(),
            host_memory: (None, 0),
            host_lost: LostCounter::default(),
            sym_names: Vec::new(),
            descriptor_names: Vec::new(),
            kinds: Vec::new(),
            flows: HashSet::new(),
            origin,
            width: bucket_width(last.saturating_sub(origin)),
            cursors: Vec::new(),
            values: Vec::new(),
        };
        // Streams in the order of their first chunk, each with its chunks in file order.
        let mut streams: Vec<Option<u32>> = Vec::new();
        let mut by_stream: HashMap<Option<u32>, VecDeque<&'f ChunkInfo>> = HashMap::new();
        let mut sync: HashMap<u32, Vec<SyncPoint>> = HashMap::new();
        for info in file.select(options.cores.as_deref(), None) {
            if !by_stream.contains_key(&info.core) {
                streams.push(info.core);
            }
            by_stream.entry(info.core).or_default().push_back(info);
            if let Some(core) = info.core
                && let Ok(points) = file.read_sync_points(info)
            {
                sync.entry(core).or_default().extend(points);
            }
        }
        for core in streams.iter().flatten() {
            let points = sync.remove(core).unwrap_or_default();
            let slot = export.core(layout, *core)?;
            export.cores[slot].sync = SyncClock::new(points);
        }
        export.cursors = streams
            .into_iter()
            .map(|core| Cursor {
                core,
                chunks: by_stream.remove(&core).unwrap_or_default(),
                chunk: Chunk::default(),
                next: 0,
                losses: VecDeque::new(),
                last_ts: origin,
            })
            .collect();
        Ok(export)
    }

    /// Merges the streams' system events by host time, reading each stream's chunks
    /// in turn and writing their device events as they are read.
    fn run<S: Sink>(mut self, layout: &mut Layout<S>, progress: &mut dyn FnMut(Progress)) -> Result<(), NtffError> {
        let file = self.file;
        std::thread::scope(|scope| {
            // Decoding a chunk costs about as much as laying it out: with a thread per
            // stream decoding one chunk ahead, the two overlap. The queues belong to
            // this closure, so that leaving it in any way (an error, a panic) closes
            // them and stops the threads, which the scope then joins.
            let mut queues: Vec<Option<Decoded<'f>>> = Vec::new();
            if self.cursors.len() <= MAX_DECODE_THREADS {
                for cursor in &mut self.cursors {
                    let chunks = std::mem::take(&mut cursor.chunks);
                    let (tx, rx) = std::sync::mpsc::sync_channel(1);
                    scope.spawn(move || {
                        for info in chunks {
                            if tx.send((info, file.read_chunk(info))).is_err() {
                                break;
                            }
                        }
                    });
                    queues.push(Some(rx));
                }
            }
            self.merge(layout, progress, &queues)
        })?;
        self.finish(layout)
    }

    fn merge<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        progress: &mut dyn FnMut(Progress),
        queues: &[Option<Decoded<'f>>],
    ) -> Result<(), NtffError> {
        let mut heap = BinaryHeap::new();
        for k in 0..self.cursors.len() {
            if let Some(ts) = self.advance(layout, k, progress, queues)? {
                heap.push(Reverse((ts, k)));
            }
        }
        while let Some(Reverse((_, k))) = heap.pop() {
            let cursor = &mut self.cursors[k];
            let index = cursor.next;
            cursor.next += 1;
            let event = std::mem::replace(&mut cursor.chunk.system[index], placeholder_event());
            let core = cursor.core;
            let ts = self.host_time(&event);
            self.cursors[k].last_ts = ts;
            while let Some(&(before, events)) = self.cursors[k].losses.front() {
                if before as usize > index {
                    break;
                }
                self.cursors[k].losses.pop_front();
                self.system_loss(layout, core, ts, events)?;
            }
            self.system_event(layout, core, &event)?;
            if let Some(ts) = self.advance(layout, k, progress, queues)? {
                heap.push(Reverse((ts, k)));
            }
        }
        Ok(())
    }

    /// The merge key of stream `k`'s next system event, reading chunks as needed.
    fn advance<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        k: usize,
        progress: &mut dyn FnMut(Progress),
        queues: &[Option<Decoded<'f>>],
    ) -> Result<Option<u64>, NtffError> {
        loop {
            let cursor = &self.cursors[k];
            if let Some(event) = cursor.chunk.system.get(cursor.next) {
                return Ok(Some(self.host_time(event)));
            }
            // Losses after the chunk's last system event.
            let (core, last) = (cursor.core, cursor.last_ts);
            while let Some((_, events)) = self.cursors[k].losses.pop_front() {
                self.system_loss(layout, core, last, events)?;
            }
            let next = match queues.get(k).and_then(Option::as_ref) {
                Some(queue) => queue.recv().ok(),
                None => self.cursors[k].chunks.pop_front().map(|info| (info, self.file.read_chunk(info))),
            };
            let Some((info, chunk)) = next else { return Ok(None) };
            layout.progress.events_done += u64::from(info.system_events) + u64::from(info.device_events);
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(_) => {
                    layout.summary.damaged_chunks += 1;
                    layout.summary.damaged_chunk_events +=
                        u64::from(info.system_events) + u64::from(info.device_events);
                    progress(layout.progress);
                    continue;
                }
            };
            if self.device {
                self.device_events(layout, &chunk)?;
            } else {
                let lost: u64 = chunk.losses.iter().filter(|l| l.device).map(|l| l.events).sum();
                layout.summary.ring_events_lost += lost;
            }
            let cursor = &mut self.cursors[k];
            cursor.losses = chunk.losses.iter().filter(|l| !l.device).map(|l| (l.before, l.events)).collect();
            cursor.chunk = chunk;
            cursor.chunk.device = Vec::new();
            cursor.next = 0;
            progress(layout.progress);
        }
    }

    /// Host time of a system event (device-clock events through their core's sync points).
    fn host_time(&self, e: &SystemEvent) -> u64 {
        match (e.clock, e.core) {
            (Clock::Host, _) => e.timestamp_ns,
            (Clock::Device, Some(core)) => self
                .core_slots
                .get(&core)
                .and_then(|&slot| self.cores[slot].sync.to_host(e.timestamp_ns))
                .unwrap_or(e.timestamp_ns),
            (Clock::Device, None) => e.timestamp_ns,
        }
    }

    /// The slot of `core`'s tracks, creating its group on first use.
    fn core<S: Sink>(&mut self, layout: &mut Layout<S>, core: u32) -> Result<usize, NtffError> {
        if let Some(&slot) = self.core_slots.get(&core) {
            return Ok(slot);
        }
        {
            let group = layout.add_track(
                self.key,
                Some((self.process, self.process_uuid)),
                core as i32,
                self.pid,
                TrackKind::Group { name: format!("NeuronCore {core}") },
            )?;
            let tracks = CoreTracks {
                group,
                group_uuid: self.key << 40 | (u64::from(group) + 1),
                execution: None,
                execution_start: None,
                lane_sets: Vec::new(),
                sets: HashMap::new(),
                set_keys: Vec::new(),
                by_descriptor: Vec::new(),
                utilisation: None,
                busy: Busy::new(self.origin, self.width),
                memory: None,
                memory_bytes: 0,
                system_lost: LostCounter::default(),
                device_lost: LostCounter::default(),
                sync: SyncClock::default(),
            };
            self.cores.push(tracks);
        }
        let slot = self.cores.len() - 1;
        self.core_slots.insert(core, slot);
        Ok(slot)
    }

    /// A track in the group of the core in `slot`.
    fn core_track<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        slot: usize,
        rank: i32,
        kind: TrackKind,
    ) -> Result<TrackIx, NtffError> {
        let group = (self.cores[slot].group, self.cores[slot].group_uuid);
        layout.add_track(self.key, Some(group), rank, self.pid, kind)
    }

    fn sym_name<S: Sink>(&mut self, layout: &mut Layout<S>, sym: Sym) -> NameId {
        let k = sym.0 as usize;
        if self.sym_names.len() <= k {
            self.sym_names.resize(k + 1, None);
        }
        if let Some(id) = self.sym_names[k] {
            return id;
        }
        let id = layout.names.intern(&self.file.string_or_placeholder(sym));
        self.sym_names[k] = Some(id);
        id
    }

    fn kind(&mut self, sym: Sym) -> SystemKind {
        let k = sym.0 as usize;
        if let Some(Some(kind)) = self.kinds.get(k) {
            return *kind;
        }
        let kind = self.file.string(sym).map_or(SystemKind::Other, SystemKind::of);
        if self.kinds.len() <= k {
            self.kinds.resize(k + 1, None);
        }
        self.kinds[k] = Some(kind);
        kind
    }

    fn device_events<S: Sink>(&mut self, layout: &mut Layout<S>, chunk: &Chunk) -> Result<(), NtffError> {
        let Some(core) = chunk.core else { return Ok(()) };
        let slot = self.core(layout, core)?;
        let mut losses = chunk.losses.iter().filter(|l| l.device).peekable();
        for (index, e) in chunk.device.iter().enumerate() {
            while let Some(loss) = losses.next_if(|l| l.before as usize <= index) {
                let ts = self.cores[slot].sync.to_host(e.start_ns).unwrap_or(self.origin);
                self.device_loss(layout, slot, ts, loss.events)?;
            }
            self.device_event(layout, slot, e)?;
        }
        let end = chunk.device.last().and_then(|e| self.cores[slot].sync.to_host(e.end_ns)).unwrap_or(self.origin);
        for loss in losses {
            self.device_loss(layout, slot, end, loss.events)?;
        }
        Ok(())
    }

    fn device_event<S: Sink>(&mut self, layout: &mut Layout<S>, slot: usize, e: &DeviceEvent) -> Result<(), NtffError> {
        let tracks = &self.cores[slot];
        let (Some(start), Some(end)) = (tracks.sync.to_host(e.start_ns), tracks.sync.to_host(e.end_ns)) else {
            layout.summary.unaligned_device_events += 1;
            return Ok(());
        };
        let end = end.max(start);
        let set = match tracks.by_descriptor.get(e.descriptor.0 as usize) {
            Some(Some(set)) => *set,
            _ => match self.lane_set(layout, slot, e.descriptor)? {
                Some(set) => set,
                None => {
                    // Its descriptor was lost with a damaged record.
                    layout.summary.damaged_chunk_events += 1;
                    return Ok(());
                }
            },
        };
        let name = match self.descriptor_names.get(e.descriptor.0 as usize) {
            Some(Some(name)) => *name,
            _ => self.descriptor_name(layout, e.descriptor),
        };
        let mut k = 0;
        while let Some(&lane) = self.cores[slot].lane_sets[set].get(k) {
            if layout.place(lane, start, end, name, k + 1 == MAX_LANES)? {
                return Ok(());
            }
            k += 1;
        }
        // It overlaps the open slices of every lane without nesting: a new lane.
        let lane = self.add_lane(layout, slot, set)?;
        layout.place(lane, start, end, name, true)?;
        Ok(())
    }

    /// The lane set of a descriptor's engine or queue, creating its first track.
    fn lane_set<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        slot: usize,
        id: DescriptorId,
    ) -> Result<Option<usize>, NtffError> {
        let key = match self.file.descriptor(id) {
            Some(Descriptor::Instruction { engine, .. }) => (false, *engine),
            Some(Descriptor::Dma { queue, .. }) => (true, *queue),
            None => return Ok(None),
        };
        let set = match self.cores[slot].sets.get(&key) {
            Some(&set) => set,
            None => {
                let tracks = &mut self.cores[slot];
                let set = tracks.lane_sets.len();
                tracks.lane_sets.push(Vec::new());
                tracks.set_keys.push(key);
                tracks.sets.insert(key, set);
                self.add_lane(layout, slot, set)?;
                set
            }
        };
        let tracks = &mut self.cores[slot];
        let k = id.0 as usize;
        if tracks.by_descriptor.len() <= k {
            tracks.by_descriptor.resize(k + 1, None);
        }
        tracks.by_descriptor[k] = Some(set);
        Ok(Some(set))
    }

    /// A slice name for a descriptor: `opcode hlo`, or `queue[index] size`.
    fn descriptor_name<S: Sink>(&mut self, layout: &mut Layout<S>, id: DescriptorId) -> NameId {
        let text = match self.file.descriptor(id) {
            Some(Descriptor::Instruction { opcode, hlo, .. }) => {
                format!("{} {}", self.file.string_or_placeholder(*opcode), self.file.string_or_placeholder(*hlo))
            }
            Some(Descriptor::Dma { queue, index, bytes, .. }) => {
                format!("{}[{index}] {}", self.file.string_or_placeholder(*queue), human_bytes(*bytes))
            }
            None => format!("<descriptor {}>", id.0),
        };
        let name = layout.names.intern(&text);
        let k = id.0 as usize;
        if self.descriptor_names.len() <= k {
            self.descriptor_names.resize(k + 1, None);
        }
        self.descriptor_names[k] = Some(name);
        name
    }

    /// Another lane for lane set `set` of core slot `slot`.
    fn add_lane<S: Sink>(&mut self, layout: &mut Layout<S>, slot: usize, set: usize) -> Result<TrackIx, NtffError> {
        let tracks = &self.cores[slot];
        let (dma, unit) = tracks.set_keys[set];
        let lane = tracks.lane_sets[set].len();
        let group = (tracks.group, tracks.group_uuid);
        let unit = self.file.string_or_placeholder(unit).into_owned();
        let (base, order) = if dma {
            (RANK_QUEUE, QUEUE_ORDER.iter().position(|q| *q == unit).unwrap_or(QUEUE_ORDER.len()))
        } else {
            (RANK_ENGINE, ENGINE_ORDER.iter().position(|e| *e == unit).unwrap_or(ENGINE_ORDER.len()))
        };
        let mut name = if dma { format!("DMA {unit}") } else { unit };
        if lane > 0 {
            name = format!("{name} ({})", lane + 1);
        }
        let rank = base + order as i32 * MAX_LANES as i32 + lane as i32;
        let track = layout.add_track(self.key, Some(group), rank, self.pid, TrackKind::Slices { name })?;
        self.cores[slot].lane_sets[set].push(track);
        Ok(track)
    }

    fn device_loss<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        slot: usize,
        ts: u64,
        events: u64,
    ) -> Result<(), NtffError> {
        for &lane in self.cores[slot].lane_sets.iter().flatten() {
            layout.sink.dropped(lane, LOSS_OVERWRITE);
        }
        self.count_lost(layout, LostIn::Device(slot), ts, events)
    }

    fn system_loss<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        core: Option<u32>,
        ts: u64,
        events: u64,
    ) -> Result<(), NtffError> {
        for &thread in self.threads.values() {
            layout.sink.dropped(thread, LOSS_OVERWRITE);
        }
        let place = match core {
            Some(core) => {
                let slot = self.core(layout, core)?;
                if let Some(execution) = self.cores[slot].execution {
                    layout.sink.dropped(execution, LOSS_OVERWRITE);
                }
                LostIn::System(slot)
            }
            None => LostIn::Host,
        };
        self.count_lost(layout, place, ts, events)
    }

    fn lost_counter(&mut self, place: LostIn) -> &mut LostCounter {
        match place {
            LostIn::Device(slot) => &mut self.cores[slot].device_lost,
            LostIn::System(slot) => &mut self.cores[slot].system_lost,
            LostIn::Host => &mut self.host_lost,
        }
    }

    /// Adds `events` to a cumulative counter of lost events, created at zero on first use.
    fn count_lost<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        place: LostIn,
        ts: u64,
        events: u64,
    ) -> Result<(), NtffError> {
        layout.summary.ring_events_lost += events;
        let track = match self.lost_counter(place).track {
            Some(track) => track,
            None => {
                let (parent, rank, name) = match place {
                    LostIn::Device(slot) => {
                        ((self.cores[slot].group, self.cores[slot].group_uuid), RANK_COUNTER + 3, "device events lost")
                    }
                    LostIn::System(slot) => {
                        ((self.cores[slot].group, self.cores[slot].group_uuid), RANK_COUNTER + 2, "system events lost")
                    }
                    LostIn::Host => {
                        ((self.process, self.process_uuid), RANK_PROCESS_COUNTER + 1, "host system events lost")
                    }
                };
                let kind = TrackKind::Counter {
                    name: name.into(),
                    unit: CounterUnit::Count,
                    description: "Events the ring overwrote before they were read, since the trace began".into(),
                };
                let track = layout.add_track(self.key, Some(parent), rank, self.pid, kind)?;
                layout.counter(track, self.origin, 0.0)?;
                self.lost_counter(place).track = Some(track);
                track
            }
        };
        let counter = self.lost_counter(place);
        counter.total += events;
        let total = counter.total;
        layout.counter(track, ts, total as f64)
    }

    fn system_event<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        core: Option<u32>,
        e: &SystemEvent,
    ) -> Result<(), NtffError> {
        let kind = self.kind(e.name);
        let ts = self.host_time(e);
        let shown = self.types.as_ref().is_none_or(|t| t.contains(&e.name));
        match kind {
            SystemKind::SyncPoint => return Ok(()),
            SystemKind::DeviceExecution => {
                let Some(core) = core else { return Ok(()) };
                let slot = self.core(layout, core)?;
                if e.clock == Clock::Device && self.cores[slot].sync.is_empty() {
                    layout.summary.unaligned_system_events += 1;
                    return Ok(());
                }
                self.execution_busy(layout, slot, e, ts)?;
                if !shown {
                    return Ok(());
                }
                let track = self.execution_track(layout, slot)?;
                let flow_in = match (e.phase, e.exec_id) {
                    (Phase::Start, Some(exec)) => Some(flow_id(self.key, core, exec)).filter(|f| self.flows.remove(f)),
                    _ => None,
                };
                return self.span(layout, track, e, ts, None, flow_in);
            }
            SystemKind::TensorAllocate | SystemKind::TensorFree => self.memory(layout, core, kind, e, ts)?,
            SystemKind::Execute | SystemKind::Other => {}
        }
        if !shown {
            return Ok(());
        }
        let track = self.thread_track(layout, e.thread_id)?;
        let flow_out = match (kind, e.phase, e.exec_id, core) {
            (SystemKind::Execute, Phase::Start, Some(exec), Some(core)) => {
                let flow = flow_id(self.key, core, exec);
                self.flows.insert(flow);
                Some(flow)
            }
            _ => None,
        };
        self.span(layout, track, e, ts, flow_out, None)
    }

    /// Writes a start, stop or instant on a track whose slices pair by tracking id.
    fn span<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        track: TrackIx,
        e: &SystemEvent,
        ts: u64,
        flow_out: Option<u64>,
        flow_in: Option<u64>,
    ) -> Result<(), NtffError> {
        let name = self.sym_name(layout, e.name);
        match e.phase {
            Phase::Start => {
                let args = self.annotations(layout, e);
                let ts = layout.at(track, ts);
                layout.tracks[track as usize].open_ids.push(e.tracking_id);
                layout.summary.system_slices += 1;
                layout.summary.flows += u64::from(flow_in.is_some());
                let args: Vec<Annotation<'_>> = args.iter().map(|a| a.borrow(&layout.names)).collect();
                let name = Name { id: name, text: &layout.names.text[name as usize] };
                layout.sink.begin(track, ts, name, &args, flow_out, flow_in).map_err(NtffError::write)
            }
            Phase::Stop => {
                let open = &layout.tracks[track as usize].open_ids;
                match open.iter().rposition(|&id| id == e.tracking_id) {
                    Some(at) => {
                        let inner = open.len() - at;
                        layout.summary.unfinished += inner as u64 - 1;
                        for _ in 0..inner {
                            layout.tracks[track as usize].open_ids.pop();
                            layout.end(track, ts)?;
                        }
                        Ok(())
                    }
                    None => {
                        layout.summary.stops_without_start += 1;
                        let text =
                            format!("{} (stop; its start is not in the trace)", layout.names.text[name as usize]);
                        let orphan = layout.names.intern(&text);
                        let args = self.annotations(layout, e);
                        layout.instant(track, ts, orphan, &args)
                    }
                }
            }
            Phase::Instant => {
                let args = self.annotations(layout, e);
                layout.instant(track, ts, name, &args)
            }
        }
    }

    /// The event's ids and arguments, as annotations.
    fn annotations<S: Sink>(&mut self, layout: &mut Layout<S>, e: &SystemEvent) -> Vec<OwnedAnnotation> {
        let mut args = Vec::with_capacity(e.args.len() + 3);
        if let Some(exec) = e.exec_id {
            args.push(OwnedAnnotation { key: KEY_EXEC_ID, value: OwnedValue::U64(exec) });
        }
        if let Some(model) = e.model_id {
            args.push(OwnedAnnotation { key: KEY_MODEL_ID, value: OwnedValue::U64(model.into()) });
        }
        if let Some(seq) = e.nrta_seq_id {
            args.push(OwnedAnnotation { key: KEY_NRTA_SEQ_ID, value: OwnedValue::U64(seq) });
        }
        for arg in &e.args {
            let key = self.sym_name(layout, arg.key);
            let value = match arg.value {
                ArgValue::U64(v) => OwnedValue::U64(v),
                ArgValue::I64(v) => OwnedValue::I64(v),
                ArgValue::Str(s) => OwnedValue::Str(self.sym_name(layout, s)),
            };
            args.push(OwnedAnnotation { key, value });
        }
        args
    }

    fn thread_track<S: Sink>(&mut self, layout: &mut Layout<S>, tid: u32) -> Result<TrackIx, NtffError> {
        if let Some(&track) = self.threads.get(&tid) {
            return Ok(track);
        }
        let track = layout.add_track(
            self.key,
            Some((self.process, self.process_uuid)),
            RANK_THREAD,
            self.pid,
            TrackKind::Thread { pid: self.pid, tid, name: format!("thread {tid}") },
        )?;
        self.threads.insert(tid, track);
        Ok(track)
    }

    fn execution_track<S: Sink>(&mut self, layout: &mut Layout<S>, slot: usize) -> Result<TrackIx, NtffError> {
        if let Some(track) = self.cores[slot].execution {
            return Ok(track);
        }
        let kind = TrackKind::Slices { name: "executions".into() };
        let track = self.core_track(layout, slot, RANK_EXECUTION, kind)?;
        self.cores[slot].execution = Some(track);
        Ok(track)
    }

    /// Adds an execution's busy time to its core's utilisation counter.
    fn execution_busy<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        slot: usize,
        e: &SystemEvent,
        ts: u64,
    ) -> Result<(), NtffError> {
        let tracks = &mut self.cores[slot];
        match e.phase {
            Phase::Start => {
                tracks.execution_start = Some((e.tracking_id, ts));
                Ok(())
            }
            Phase::Stop => {
                let Some((_, start)) = tracks.execution_start.take().filter(|(id, _)| *id == e.tracking_id) else {
                    return Ok(());
                };
                let mut values = std::mem::take(&mut self.values);
                values.clear();
                self.cores[slot].busy.add(start, ts.max(start), &mut values);
                let result = self.write_utilisation(layout, slot, &values);
                self.values = values;
                result
            }
            Phase::Instant => Ok(()),
        }
    }

    fn write_utilisation<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        slot: usize,
        values: &[(u64, f64)],
    ) -> Result<(), NtffError> {
        if values.is_empty() {
            return Ok(());
        }
        let track = match self.cores[slot].utilisation {
            Some(track) => track,
            None => {
                let description =
                    format!("Share of each {} the core spent executing (nc_exec_running)", human_duration(self.width));
                let kind = TrackKind::Counter { name: "utilisation".into(), unit: CounterUnit::Percent, description };
                let track = self.core_track(layout, slot, RANK_COUNTER, kind)?;
                self.cores[slot].utilisation = Some(track);
                track
            }
        };
        for &(ts, value) in values {
            layout.counter(track, ts, value)?;
        }
        Ok(())
    }

    /// Follows tensor allocations: device tensors per core, host tensors per process.
    fn memory<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        core: Option<u32>,
        kind: SystemKind,
        e: &SystemEvent,
        ts: u64,
    ) -> Result<(), NtffError> {
        let counted = match kind {
            SystemKind::TensorAllocate => matches!(e.phase, Phase::Stop | Phase::Instant),
            _ => matches!(e.phase, Phase::Start | Phase::Instant),
        };
        if !counted {
            return Ok(());
        }
        let Some(size) = e.args.iter().find_map(|a| match a.value {
            ArgValue::U64(v) if self.file.string(a.key) == Some("size") => Some(v),
            _ => None,
        }) else {
            return Ok(());
        };
        let delta = if kind == SystemKind::TensorAllocate { size as i64 } else { -(size as i64) };
        let description = "Bytes of tensors allocated minus freed since the trace began".to_string();
        let (track, value) = match core {
            Some(core) => {
                let slot = self.core(layout, core)?;
                let track = match self.cores[slot].memory {
                    Some(track) => track,
                    None => {
                        let kind =
                            TrackKind::Counter { name: "tensor memory".into(), unit: CounterUnit::Bytes, description };
                        let track = self.core_track(layout, slot, RANK_COUNTER + 1, kind)?;
                        self.cores[slot].memory = Some(track);
                        track
                    }
                };
                self.cores[slot].memory_bytes += delta;
                (track, self.cores[slot].memory_bytes)
            }
            None => {
                let track = match self.host_memory.0 {
                    Some(track) => track,
                    None => {
                        let kind = TrackKind::Counter {
                            name: "host tensor memory".into(),
                            unit: CounterUnit::Bytes,
                            description,
                        };
                        let process = Some((self.process, self.process_uuid));
                        let track = layout.add_track(self.key, process, RANK_PROCESS_COUNTER, self.pid, kind)?;
                        self.host_memory.0 = Some(track);
                        track
                    }
                };
                self.host_memory.1 += delta;
                (track, self.host_memory.1)
            }
        };
        layout.counter(track, ts, value as f64)
    }

    /// Closes the device lanes and writes the last utilisation values.
    fn finish<S: Sink>(mut self, layout: &mut Layout<S>) -> Result<(), NtffError> {
        for slot in 0..self.cores.len() {
            for &lane in self.cores[slot].lane_sets.iter().flatten() {
                layout.close_lane(lane)?;
            }
            let mut values = Vec::new();
            self.cores[slot].busy.finish(&mut values);
            if self.cores[slot].utilisation.is_some() {
                self.write_utilisation(layout, slot, &values)?;
            }
            if let Some(execution) = self.cores[slot].execution {
                layout.summary.unfinished += layout.tracks[execution as usize].open_ids.len() as u64;
            }
        }
        for &thread in self.threads.values() {
            layout.summary.unfinished += layout.tracks[thread as usize].open_ids.len() as u64;
        }
        Ok(())
    }
}

/// An annotation kept until it is written (strings by their id in the name table).
#[derive(Debug)]
struct OwnedAnnotation {
    key: NameId,
    value: OwnedValue,
}

#[derive(Debug)]
enum OwnedValue {
    U64(u64),
    I64(i64),
    /// A string, by its id in the name table.
    Str(NameId),
}

impl OwnedAnnotation {
    fn borrow<'a>(&'a self, names: &'a Names) -> Annotation<'a> {
        Annotation {
            key: self.key,
            key_text: &names.text[self.key as usize],
            value: match &self.value {
                OwnedValue::U64(v) => AnnotationValue::U64(*v),
                OwnedValue::I64(v) => AnnotationValue::I64(*v),
                OwnedValue::Str(id) => AnnotationValue::Str(*id, &names.text[*id as usize]),
            },
        }
    }
}

/// A system event to leave in place of one taken out of a chunk.
fn placeholder_event() -> SystemEvent {
    SystemEvent {
        core: None,
        id: 0,
        name: Sym::EMPTY,
        phase: Phase::Instant,
        clock: Clock::Host,
        timestamp_ns: 0,
        tracking_id: 0,
        thread_id: 0,
        exec_id: None,
        model_id: None,
        nrta_seq_id: None,
        args: Vec::new(),
    }
}

/// A flow id unique to one execution of one core of one file.
fn flow_id(file: u64, core: u32, exec: u64) -> u64 {
    // Mixed so that ids of different files and cores do not collide in practice.
    let mut x = exec ^ (u64::from(core) << 48) ^ (file << 56);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

fn human_duration(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 && n.is_multiple_of(1_000_000_000) => format!("{} s", n / 1_000_000_000),
        n if n >= 1_000_000 && n.is_multiple_of(1_000_000) => format!("{} ms", n / 1_000_000),
        n if n >= 1_000 && n.is_multiple_of(1_000) => format!("{} µs", n / 1_000),
        n => format!("{n} ns"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_widths_are_round() {
        assert_eq!(bucket_width(0), 10_000);
        assert_eq!(bucket_width(25_000_000), 50_000);
        assert_eq!(bucket_width(1_000_000_000), 1_000_000);
        assert_eq!(bucket_width(3_000_000_000), 5_000_000);
    }

    #[test]
    fn busy_time_is_shared_across_buckets() {
        let mut busy = Busy::new(1000, 100);
        let mut out = Vec::new();
        busy.add(1050, 1250, &mut out);
        assert!(out.is_empty(), "no bucket is finished before the next span");
        busy.add(1600, 1650, &mut out);
        // 50% of [1000,1100), 100% of [1100,1200), 50% of [1200,1300), then idle.
        assert_eq!(out, vec![(1000, 50.0), (1100, 100.0), (1200, 50.0), (1300, 0.0)]);
        out.clear();
        busy.finish(&mut out);
        assert_eq!(out, vec![(1600, 50.0), (1700, 0.0)]);
    }

    #[test]
    fn device_times_use_the_next_sync_point() {
        let sync = [SyncPoint { host_ns: 1_000, device_ns: 100 }, SyncPoint { host_ns: 2_010, device_ns: 1_100 }];
        let clock = SyncClock::new(sync.to_vec());
        for _ in 0..2 {
            assert_eq!(clock.to_host(50), Some(950));
            assert_eq!(clock.to_host(100), Some(1_000));
            assert_eq!(clock.to_host(500), Some(1_410));
            assert_eq!(clock.to_host(5_000), Some(5_910));
            assert_eq!(clock.to_host(60), Some(960));
        }
        assert_eq!(SyncClock::default().to_host(5), None);
    }
}
