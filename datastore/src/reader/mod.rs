//! The tools' side of the datastore: discover runtimes, map one read-only, take
//! counter snapshots and deltas, read the models table, tail the event rings.
//!
//! A reader never writes to the file. It trusts nothing in it: the header is checked
//! against the layout arithmetic and the file's real length before any other offset is
//! used, and ring records are accepted only when their sequence and check agree.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

use uuid::Uuid;

use crate::clock::{CalibrationPoint, TickConverter, monotonic_ns};
use crate::event::{DeviceEvent, SystemEvent};
use crate::instructions::{InstructionCache, InstructionTable};
use crate::kinds::{DeviceCategory, HostCategory};
use crate::kinds::{ErrorClass, ExecOutcome};
use crate::layout::{self, Layout, Sizes, header, model};
use crate::record::{SystemRecord, decode_device, device_record_events};
use crate::ring::{Payload, RingCursor, RingRef};
use crate::shm::{Mapping, Region};
use crate::strings::StringTable;
use crate::{DatastoreError, directory, histogram};

mod discovery;
mod liveness;
pub(crate) use discovery::remove_dead_runtimes;
pub use discovery::{RuntimeEntry, discover, discover_new};
pub use liveness::{ExitReason, HEARTBEAT_STALE_AFTER, Liveness};

/// What a header says about its runtime process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub pid: u32,
    /// `NEURON_PROCESS_TAG`, if set.
    pub tag: Option<String>,
    pub runtime_version: String,
    pub instance_type: String,
    pub device_count: u32,
    pub cores_per_device: u32,
    pub device_memory_bytes: u64,
    pub instance_core_count: u32,
    /// Global indexes of the NeuronCores the process holds.
    pub cores: Vec<u32>,
    pub ring_capacity: u64,
    pub created_realtime_ns: u64,
    pub system_trace_recording: bool,
    pub device_trace_recording: bool,
    pub discard_mode: bool,
    /// Host threads a core computes on at most (0: not recorded by this runtime).
    pub host_threads: u32,
    /// The kernel of its bf16-rounded matrix products, which PE's defined peak follows.
    pub product_kernel: crate::peaks::ProductKernel,
    /// The command that runs the runtime (empty in files of older runtimes).
    pub command: crate::CommandIdentity,
}

impl RuntimeInfo {
    /// The label tools show: the tag, else the command's name (stable across
    /// restarts), else the pid.
    pub fn label(&self) -> String {
        match (&self.tag, self.command.name.is_empty()) {
            (Some(tag), _) => tag.clone(),
            (None, false) => self.command.name.clone(),
            (None, true) => self.pid.to_string(),
        }
    }
}

/// Executions by outcome, in `neuron-monitor`'s `execution_summary` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExecutionCounts(pub [u64; 6]);

impl ExecutionCounts {
    pub fn get(&self, outcome: ExecOutcome) -> u64 {
        self.0[outcome as usize]
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// Errors by class, in `neuron-monitor`'s `error_summary` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorCounts(pub [u64; 6]);

impl ErrorCounts {
    pub fn get(&self, class: ErrorClass) -> u64 {
        self.0[class as usize]
    }
}

/// One core's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreSnapshot {
    pub core: u32,
    pub busy_ns: u64,
    pub executions: ExecutionCounts,
    pub errors: ErrorCounts,
    pub flops: u64,
    /// `DmaQueueType` order: input, output, weights, instructions.
    pub dma_bytes: [u64; 4],
    pub instructions: u64,
    /// `DeviceCategory` order.
    pub device_memory: [u64; 5],
    pub model_switches: u64,
    pub numerical_error_values: u64,
    /// Collective operations the core's ranks took part in, and the ns spent in them.
    pub collectives: u64,
    pub collectives_ns: u64,
    pub device_latency: Vec<u64>,
    pub total_latency: Vec<u64>,
}

impl CoreSnapshot {
    pub fn device_memory(&self, category: DeviceCategory) -> u64 {
        self.device_memory[category as usize]
    }
}

/// Events produced into one ring and refused by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingStats {
    /// `None` for the process ring (events tied to no core).
    pub core: Option<u32>,
    pub device: bool,
    /// Events produced into the ring (a device record may hold several).
    pub produced: u64,
    /// Events refused in discard mode.
    pub dropped: u64,
}

/// All counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Host `CLOCK_MONOTONIC` when taken.
    pub taken_ns: u64,
    pub cores: Vec<CoreSnapshot>,
    /// `HostCategory` order.
    pub host_memory: [u64; 4],
    /// Per device: mem corrected, mem uncorrected, sram corrected, sram uncorrected.
    pub ecc: Vec<[u64; 4]>,
    pub strings_dropped: u64,
    /// Models whose instructions did not fit the instruction table (their device
    /// events take a record each).
    pub instruction_tables_refused: u64,
    pub model_slots_overflowed: u64,
    pub rings: Vec<RingStats>,
}

impl Snapshot {
    pub fn host_memory(&self, category: HostCategory) -> u64 {
        self.host_memory[category as usize]
    }

    pub fn core(&self, core: u32) -> Option<&CoreSnapshot> {
        self.cores.iter().find(|c| c.core == core)
    }
}

/// Latency percentiles in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyPercentiles {
    pub p0: f64,
    pub p1: f64,
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
    pub p99: f64,
    pub p100: f64,
    pub count: u64,
}

/// One core's activity between two snapshots.
#[derive(Debug, Clone, PartialEq)]
pub struct CoreDelta {
    pub core: u32,
    pub utilization_percent: f64,
    pub flops_per_second: f64,
    pub executions: ExecutionCounts,
    pub errors: ErrorCounts,
    pub dma_bytes: [u64; 4],
    pub instructions: u64,
    /// `None` when nothing completed in the interval.
    pub device_latency: Option<LatencyPercentiles>,
    pub total_latency: Option<LatencyPercentiles>,
}

/// What happened between two snapshots.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    pub seconds: f64,
    pub cores: Vec<CoreDelta>,
    pub ecc: Vec<[u64; 4]>,
}

impl Delta {
    /// Activity from `earlier` to `later` (counters are monotonic; memory is a level,
    /// read it from the snapshot).
    pub fn between(earlier: &Snapshot, later: &Snapshot) -> Delta {
        let seconds = later.taken_ns.saturating_sub(earlier.taken_ns) as f64 / 1e9;
        let cores = later
            .cores
            .iter()
            .map(|now| {
                let before = earlier.core(now.core);
                let sub = |f: fn(&CoreSnapshot) -> u64| f(now).saturating_sub(before.map_or(0, f));
                let sub6 = |a: [u64; 6], b: Option<[u64; 6]>| {
                    let mut out = [0u64; 6];
                    for (k, o) in out.iter_mut().enumerate() {
                        *o = a[k].saturating_sub(b.map_or(0, |b| b[k]));
                    }
                    out
                };
                let mut dma_bytes = [0u64; 4];
                for (k, d) in dma_bytes.iter_mut().enumerate() {
                    *d = now.dma_bytes[k].saturating_sub(before.map_or(0, |b| b.dma_bytes[k]));
                }
                let per_second = |n: u64| if seconds > 0.0 { n as f64 / seconds } else { 0.0 };
                CoreDelta {
                    core: now.core,
                    utilization_percent: if seconds > 0.0 {
                        (sub(|c| c.busy_ns) as f64 / 1e9 / seconds * 100.0).min(100.0)
                    } else {
                        0.0
                    },
                    flops_per_second: per_second(sub(|c| c.flops)),
                    executions: ExecutionCounts(sub6(now.executions.0, before.map(|b| b.executions.0))),
                    errors: ErrorCounts(sub6(now.errors.0, before.map(|b| b.errors.0))),
                    dma_bytes,
                    instructions: sub(|c| c.instructions),
                    device_latency: percentiles(&now.device_latency, before.map(|b| b.device_latency.as_slice())),
                    total_latency: percentiles(&now.total_latency, before.map(|b| b.total_latency.as_slice())),
                }
            })
            .collect();
        let ecc = later
            .ecc
            .iter()
            .enumerate()
            .map(|(d, now)| {
                let before = earlier.ecc.get(d).copied().unwrap_or_default();
                [0, 1, 2, 3].map(|k| now[k].saturating_sub(before[k]))
            })
            .collect();
        Delta { seconds, cores, ecc }
    }
}

/// Percentiles of the latencies of every core's executions from `earlier` to `later`:
/// the cores' histograms added up. `device`: the device latency, else the total
/// (host call to return) latency. `None` when nothing completed in the interval.
pub fn latency_of_all_cores(earlier: &Snapshot, later: &Snapshot, device: bool) -> Option<LatencyPercentiles> {
    fn buckets(c: &CoreSnapshot, device: bool) -> &[u64] {
        if device { &c.device_latency } else { &c.total_latency }
    }
    let (mut now, mut before) = (Vec::new(), Vec::new());
    for core in &later.cores {
        add_buckets(&mut now, buckets(core, device));
        if let Some(earlier) = earlier.core(core.core) {
            add_buckets(&mut before, buckets(earlier, device));
        }
    }
    percentiles(&now, Some(&before))
}

fn add_buckets(sum: &mut Vec<u64>, buckets: &[u64]) {
    if sum.len() < buckets.len() {
        sum.resize(buckets.len(), 0);
    }
    for (s, &n) in sum.iter_mut().zip(buckets) {
        *s += n;
    }
}

/// Latencies above this (an hour) count as this in percentiles.
const MAX_LATENCY_NS: u64 = 3_600_000_000_000;

/// Percentiles of the bucket counts gained from `before` to `now`, read straight off the
/// buckets: a percentile is the midpoint of the bucket holding its rank (buckets are at
/// most about 3% wide). `None` when nothing was gained.
fn percentiles(now: &[u64], before: Option<&[u64]>) -> Option<LatencyPercentiles> {
    percentiles_with(now, before, histogram::bucket_bounds)
}

/// [`percentiles`] over buckets whose bounds `bounds` gives.
fn percentiles_with(
    now: &[u64],
    before: Option<&[u64]>,
    bounds: fn(usize) -> (u64, u64),
) -> Option<LatencyPercentiles> {
    let gained = |bucket: usize| now[bucket].saturating_sub(before.and_then(|b| b.get(bucket).copied()).unwrap_or(0));
    let count: u64 = (0..now.len()).map(gained).sum();
    if count == 0 {
        return None;
    }
    let seconds = |bucket: usize| {
        let (low, high) = bounds(bucket);
        (low + (high - low) / 2).min(MAX_LATENCY_NS) as f64 / 1e9
    };
    // The ranks wanted, in increasing order: the value at quantile q is the one with
    // rank ceil(q × count), at least 1.
    const QUANTILES: [f64; 7] = [0.0, 0.01, 0.25, 0.50, 0.75, 0.99, 1.0];
    let ranks = QUANTILES.map(|q| ((q * count as f64).ceil() as u64).clamp(1, count));
    let mut values = [0.0; 7];
    let (mut next, mut seen) = (0, 0u64);
    for bucket in 0..now.len() {
        seen += gained(bucket);
        while next < ranks.len() && seen >= ranks[next] {
            values[next] = seconds(bucket);
            next += 1;
        }
        if next == ranks.len() {
            break;
        }
    }
    let [p0, p1, p25, p50, p75, p99, p100] = values;
    Some(LatencyPercentiles { p0, p1, p25, p50, p75, p99, p100, count })
}

/// A loaded model, from the models table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub model_id: u32,
    pub core: u32,
    pub name: String,
    pub uuid: Uuid,
    pub flops_per_execution: u64,
    pub instructions: u64,
    /// `DeviceCategory` order.
    pub device_memory: [u64; 5],
    pub host_memory: u64,
    pub executions: u64,
    /// Executions in flight right now.
    pub running: u64,
    /// Latency of its executions (the whole `execute` call), in the model histogram's
    /// buckets (`histogram::MODEL_BUCKETS`).
    pub latency: Vec<u64>,
}

impl ModelInfo {
    /// Latency percentiles of the executions between `earlier` (the same model, read
    /// before) and `self`; of every execution since the load when `earlier` is `None`.
    pub fn latency_since(&self, earlier: Option<&ModelInfo>) -> Option<LatencyPercentiles> {
        percentiles_with(&self.latency, earlier.map(|e| e.latency.as_slice()), histogram::model_bucket_bounds)
    }
}

/// One event from a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceEvent {
    System(SystemEvent),
    Device(DeviceEvent),
}

/// Where a new tail starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailStart {
    /// At the oldest event still in each ring.
    Oldest,
    /// At the next event produced (like `tail -f`).
    Now,
}

/// Cursors over a runtime's rings, with a filter.
#[derive(Debug, Clone)]
pub struct Tail {
    rings: Vec<TailRing>,
    strings: HashMap<u32, String>,
    instructions: InstructionTable,
    tables: InstructionCache,
    system_types: u64,
}

#[derive(Debug, Clone)]
struct TailRing {
    ring: RingRef,
    core: Option<u32>,
    device: bool,
    /// Records read and lost (for system rings, also the events).
    cursor: RingCursor,
    /// Device rings: events, which a record may hold several of.
    events: EventCount,
}

/// A device ring's events: a record holds one or more, numbered in the ring, so a
/// gap in the numbering between two delivered records is the exact number of events
/// lost between them.
#[derive(Debug, Clone, Copy, Default)]
struct EventCount {
    /// The number of the next event expected (`None` until the first record).
    next: Option<u64>,
    delivered: u64,
    lost: u64,
}

impl Tail {
    /// Events lost so far (overwritten before they were read), over all rings.
    pub fn lost(&self) -> u64 {
        self.cursors().map(|(_, _, c)| c.lost).sum()
    }

    /// Events read so far (before filtering by type).
    pub fn delivered(&self) -> u64 {
        self.cursors().map(|(_, _, c)| c.delivered).sum()
    }

    /// The cursor of each ring: `(core, device ring?, cursor)`; `next` counts records,
    /// `delivered` and `lost` count events.
    pub fn cursors(&self) -> impl Iterator<Item = (Option<u32>, bool, RingCursor)> + '_ {
        self.rings.iter().map(|r| {
            let cursor = if r.device {
                RingCursor { next: r.cursor.next, delivered: r.events.delivered, lost: r.events.lost }
            } else {
                r.cursor
            };
            (r.core, r.device, cursor)
        })
    }

    /// Reads up to `max` records per ring into `out`, decoded and filtered. With
    /// `writer_done`, events whose producer never finished them are counted lost.
    pub fn poll(&mut self, reader: &DatastoreReader, max: usize, writer_done: bool, out: &mut Vec<TraceEvent>) {
        self.poll_region(&reader.region, reader.strings, &reader.converter(), max, writer_done, out);
    }

    pub(crate) fn poll_region(
        &mut self,
        region: &Region,
        strings: StringTable,
        converter: &TickConverter,
        max: usize,
        writer_done: bool,
        out: &mut Vec<TraceEvent>,
    ) {
        let host_ns = |ticks: u64| converter.to_ns(ticks);
        let types = self.system_types;
        let cache = &mut self.strings;
        let mut string = |id: u32| -> String {
            if id == 0 {
                return String::new();
            }
            if let Some(s) = cache.get(&id) {
                return s.clone();
            }
            match strings.get(region, id) {
                Some(s) => {
                    cache.insert(id, s.clone());
                    s
                }
                None => String::new(),
            }
        };
        let (instructions, tables) = (self.instructions, &mut self.tables);
        let mut table = |model_id: u32| tables.model(region, instructions, model_id);
        for ring in &mut self.rings {
            let core = ring.core;
            if ring.device {
                let events = &mut ring.events;
                ring.cursor.poll(region, ring.ring, max, writer_done, |_, payload| {
                    let (first, count) = device_record_events(payload);
                    if let Some(next) = events.next {
                        events.lost += first.saturating_sub(next);
                    }
                    events.next = Some(first + count);
                    events.delivered += count;
                    decode_device(payload, core.unwrap_or(0), &mut string, &mut table, &mut |event| {
                        out.push(TraceEvent::Device(event))
                    });
                });
                if writer_done && ring.cursor.next >= ring.ring.produced(region) {
                    // Events after the last record read were lost.
                    let produced = ring.ring.events(region).load(Ordering::Acquire);
                    let next = events.next.get_or_insert(produced);
                    events.lost += produced.saturating_sub(*next);
                    *next = (*next).max(produced);
                }
            } else {
                ring.cursor.poll(region, ring.ring, max, writer_done, |id, payload| {
                    let record = SystemRecord::decode(payload);
                    if types & (1u64 << record.event_type.min(63)) == 0 {
                        return;
                    }
                    if let Some(event) = record.to_event(id, core, &mut string, &host_ns) {
                        out.push(TraceEvent::System(event));
                    }
                });
            }
        }
    }

    /// Builds a tail over the rings of a file with `layout` whose held cores are
    /// `held`; see [`DatastoreReader::tail`].
    pub(crate) fn new(
        region: &Region,
        layout: &Layout,
        held: &[u32],
        start: TailStart,
        cores: Option<&[u32]>,
        system_types: u64,
        device: bool,
    ) -> Tail {
        let capacity = layout.sizes.ring_capacity;
        let at = |ring: RingRef| match start {
            TailStart::Now => RingCursor::at(ring.produced(region)),
            TailStart::Oldest => RingCursor::at(ring.produced(region).saturating_sub(ring.capacity)),
        };
        let system = |ring: RingRef, core| TailRing {
            ring,
            core,
            device: false,
            cursor: at(ring),
            events: EventCount::default(),
        };
        let mut rings = Vec::new();
        if cores.is_none() && system_types != 0 {
            rings.push(system(RingRef { base: layout.host_ring(), capacity }, None));
        }
        for (slot, &core) in held.iter().enumerate() {
            if cores.is_some_and(|wanted| !wanted.contains(&core)) {
                continue;
            }
            if system_types != 0 {
                rings.push(system(RingRef { base: layout.core_ring(slot, false), capacity }, Some(core)));
            }
            if device {
                let ring = RingRef { base: layout.core_ring(slot, true), capacity };
                let (cursor, next) = device_start(region, ring, start);
                let events = EventCount { next, ..EventCount::default() };
                rings.push(TailRing { ring, core: Some(core), device: true, cursor, events });
            }
        }
        Tail {
            rings,
            strings: HashMap::new(),
            instructions: InstructionTable::of(layout),
            tables: InstructionCache::default(),
            system_types,
        }
    }

    /// Each ring's base offset and the index its cursor will read next.
    pub(crate) fn positions(&self) -> impl Iterator<Item = (RingRef, u64)> + '_ {
        self.rings.iter().map(|r| (r.ring, r.cursor.next))
    }

    /// Reads up to `max` records per ring, checking them but not decoding them;
    /// returns how many were read. (The transport alone, for throughput tests.)
    pub fn skim(&mut self, reader: &DatastoreReader, max: usize, writer_done: bool) -> u64 {
        let mut read = 0;
        for ring in &mut self.rings {
            read += ring.cursor.poll(&reader.region, ring.ring, max, writer_done, |_, _: &Payload| {}) as u64;
        }
        read
    }
}

/// Where a tail starts in a device ring: the record index, and the number of the first
/// event it will count (`None`: the number the first record it reads carries).
///
/// Starting now, the record index and the ring's event count must be read as a
/// consistent pair: the producer advances the count after claiming a record and before
/// publishing it, so the pair is taken when the last claimed record is finished and no
/// new one is claimed meanwhile. Starting at the oldest record of a ring that has not
/// wrapped, that is event 0; once it has wrapped, events older than the first record
/// read are not this tail's.
fn device_start(region: &Region, ring: RingRef, start: TailStart) -> (RingCursor, Option<u64>) {
    if start == TailStart::Oldest {
        let head = ring.produced(region);
        return if head <= ring.capacity {
            (RingCursor::at(0), Some(0))
        } else {
            (RingCursor::at(head - ring.capacity), None)
        };
    }
    let began = std::time::Instant::now();
    loop {
        let head = ring.produced(region);
        if head > 0 && ring.in_flight(region, head - 1) && began.elapsed() < Duration::from_millis(10) {
            std::hint::spin_loop();
            continue;
        }
        let events = ring.events(region).load(Ordering::Acquire);
        if ring.produced(region) == head {
            return (RingCursor::at(head), Some(events));
        }
        if began.elapsed() >= Duration::from_millis(10) {
            // A producer stuck mid-record: count from the first record read.
            return (RingCursor::at(head), None);
        }
    }
}

/// A datastore mapped read-only.
#[derive(Debug)]
pub struct DatastoreReader {
    region: Region,
    layout: Layout,
    path: PathBuf,
    info: RuntimeInfo,
    process_start: u64,
    strings: StringTable,
    fallback_ns_per_tick: f64,
}

impl DatastoreReader {
    /// Opens and validates a datastore file.
    pub fn open(path: &Path) -> Result<DatastoreReader, DatastoreError> {
        let refused = |reason: String| DatastoreError::Refused { path: path.to_owned(), reason };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            let meta = std::fs::symlink_metadata(parent).map_err(|e| DatastoreError::io(parent, e))?;
            if meta.file_type().is_symlink() {
                return Err(refused(format!("its directory {} is a symbolic link", parent.display())));
            }
        }
        let meta = std::fs::symlink_metadata(path).map_err(|e| DatastoreError::io(path, e))?;
        if meta.file_type().is_symlink() {
            return Err(refused("it is a symbolic link".into()));
        }
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| DatastoreError::io(path, e))?;
        let meta = file.metadata().map_err(|e| DatastoreError::io(path, e))?;
        let uid = nix::unistd::geteuid().as_raw();
        if !meta.is_file() {
            return Err(refused("it is not a regular file".into()));
        }
        if meta.uid() != uid {
            return Err(refused(format!("it is owned by uid {}, not by you (uid {uid})", meta.uid())));
        }
        if meta.len() < layout::HEADER_BYTES {
            return Err(DatastoreError::Corrupt {
                path: path.to_owned(),
                reason: format!("{} bytes is shorter than a header", meta.len()),
            });
        }
        // SAFETY: mapped read-only; the writer only ever grows nothing and accesses are
        // atomic (see `shm`).
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| DatastoreError::io(path, e))?;
        let region = Region::new(Mapping::ReadOnly(map));
        DatastoreReader::validate(region, path)
    }

    fn validate(region: Region, path: &Path) -> Result<DatastoreReader, DatastoreError> {
        let corrupt = |reason: String| DatastoreError::Corrupt { path: path.to_owned(), reason };
        let word = |o| region.u64(o).load(Ordering::Acquire);
        let half = |o| region.u32(o).load(Ordering::Acquire);
        if word(header::MAGIC) != layout::MAGIC {
            return Err(corrupt("the magic number is wrong".into()));
        }
        let version = half(header::LAYOUT_VERSION);
        if version != layout::LAYOUT_VERSION {
            return Err(DatastoreError::UnsupportedVersion {
                path: path.to_owned(),
                found: version,
                supported: layout::LAYOUT_VERSION,
            });
        }
        let sizes = Sizes {
            core_count: half(header::CORE_COUNT),
            ring_capacity: word(header::RING_CAPACITY),
            model_slots: half(header::MODEL_SLOTS),
            string_table_bytes: word(header::STRING_TABLE_BYTES),
            instruction_table_bytes: word(header::INSTRUCTION_TABLE_BYTES),
            histogram_buckets: half(header::HISTOGRAM_BUCKETS),
        };
        let layout = Layout::new(sizes).ok_or_else(|| corrupt(format!("impossible sizes {sizes:?}")))?;
        let (header_bytes, file_bytes) = (u64::from(half(header::HEADER_BYTES)), word(header::FILE_BYTES));
        let mismatch = if header_bytes != layout::HEADER_BYTES {
            Some(format!("its header says the header is {header_bytes} bytes, not {}", layout::HEADER_BYTES))
        } else if file_bytes != layout.file_bytes {
            Some(format!("its header says the file is {file_bytes} bytes, its sizes make {}", layout.file_bytes))
        } else if region.len() != layout.file_bytes {
            Some(format!("the file is {} bytes but its header describes {} bytes", region.len(), layout.file_bytes))
        } else {
            None
        };
        if let Some(mismatch) = mismatch {
            return Err(corrupt(mismatch));
        }
        let device_count = half(header::DEVICE_COUNT);
        if device_count > layout::MAX_DEVICES {
            return Err(corrupt(format!("{device_count} devices is more than {}", layout::MAX_DEVICES)));
        }
        let cores: Vec<u32> = (0..u64::from(sizes.core_count)).map(|slot| half(header::CORES + 4 * slot)).collect();
        if cores.iter().any(|&c| c >= layout::MAX_CORES) {
            return Err(corrupt("a core index is out of range".into()));
        }
        let string = |offset: u64, max: u64| {
            let len = u64::from(half(offset)).min(max);
            String::from_utf8_lossy(&region.read_bytes(offset + 4, len)).into_owned()
        };
        let recording = half(header::RECORDING);
        let tag = string(header::TAG, header::TAG_MAX);
        let info = RuntimeInfo {
            pid: half(header::PID),
            tag: (!tag.is_empty()).then_some(tag),
            runtime_version: string(header::RUNTIME_VERSION, header::RUNTIME_VERSION_MAX),
            instance_type: string(header::INSTANCE_TYPE, header::INSTANCE_TYPE_MAX),
            device_count,
            cores_per_device: half(header::CORES_PER_DEVICE),
            device_memory_bytes: word(header::DEVICE_MEMORY_BYTES),
            instance_core_count: half(header::INSTANCE_CORE_COUNT),
            cores,
            ring_capacity: sizes.ring_capacity,
            created_realtime_ns: word(header::CREATED_REALTIME_NS),
            system_trace_recording: recording & layout::RECORDING_SYSTEM != 0,
            device_trace_recording: recording & layout::RECORDING_DEVICE != 0,
            discard_mode: recording & layout::RECORDING_DISCARD_MODE != 0,
            host_threads: half(header::HOST_THREADS),
            product_kernel: crate::peaks::ProductKernel::from_code(half(header::PRODUCT_KERNEL)),
            command: crate::CommandIdentity {
                name: string(header::COMMAND_NAME, header::COMMAND_NAME_MAX),
                line: {
                    // Arguments are NUL-separated; an empty one stays an argument.
                    let line = string(header::COMMAND_LINE, header::COMMAND_LINE_MAX);
                    if line.is_empty() { Vec::new() } else { line.split('\0').map(str::to_owned).collect() }
                },
            },
        };
        let fallback_ns_per_tick = word(header::INITIAL_NS_PER_TICK_FP32) as f64 / 4_294_967_296.0;
        Ok(DatastoreReader {
            strings: StringTable { base: layout.strings, capacity: layout.sizes.string_table_bytes },
            process_start: word(header::PROCESS_START_TICKS),
            region,
            layout,
            path: path.to_owned(),
            info,
            fallback_ns_per_tick,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn info(&self) -> &RuntimeInfo {
        &self.info
    }

    /// Whether the writer is alive, by [`Liveness::of`]: exited when closed, or when
    /// its process is gone, a zombie, or replaced by another of the same pid; stale
    /// (or stopped) when the process is there but its heartbeat is old.
    pub fn liveness(&self) -> Liveness {
        let closed = self.region.u32(header::STATE).load(Ordering::Acquire) == layout::STATE_CLOSED;
        let process = if closed { None } else { directory::process_status(self.info.pid) };
        let heartbeat = self.region.u64(header::HEARTBEAT_MONO_NS).load(Ordering::Acquire);
        Liveness::of(closed, process, self.process_start, monotonic_ns().saturating_sub(heartbeat))
    }

    /// Host tick conversion from the header's calibration points.
    pub fn converter(&self) -> TickConverter {
        converter_of(&self.region, self.fallback_ns_per_tick)
    }

    /// Every counter, now.
    pub fn snapshot(&self) -> Snapshot {
        let r = &self.region;
        let l = &self.layout;
        let load = |offset: u64| r.u64(offset).load(Ordering::Relaxed);
        let cores = self
            .info
            .cores
            .iter()
            .enumerate()
            .map(|(slot, &core)| {
                let w = |word: u64| load(l.core_word(slot, word));
                let array = |start: u64| -> [u64; 6] { std::array::from_fn(|k| w(start + k as u64)) };
                let histogram = |total: bool| -> Vec<u64> {
                    (0..histogram::BUCKETS).map(|b| load(l.histogram_bucket(slot, total, b))).collect()
                };
                CoreSnapshot {
                    core,
                    busy_ns: w(layout::core::BUSY_NS),
                    executions: ExecutionCounts(array(layout::core::EXECUTIONS)),
                    errors: ErrorCounts(array(layout::core::ERRORS)),
                    flops: w(layout::core::FLOPS),
                    dma_bytes: std::array::from_fn(|k| w(layout::core::DMA_BYTES + k as u64)),
                    instructions: w(layout::core::INSTRUCTIONS),
                    device_memory: std::array::from_fn(|k| w(layout::core::DEVICE_MEMORY + k as u64)),
                    model_switches: w(layout::core::MODEL_SWITCHES),
                    numerical_error_values: w(layout::core::NUMERICAL_ERROR_VALUES),
                    collectives: w(layout::core::COLLECTIVES),
                    collectives_ns: w(layout::core::COLLECTIVES_NS),
                    device_latency: histogram(false),
                    total_latency: histogram(true),
                }
            })
            .collect();
        let process = |word: u64| load(l.process_word(word));
        let ecc = (0..u64::from(self.info.device_count))
            .map(|d| std::array::from_fn(|k| process(layout::process::ECC + 4 * d + k as u64)))
            .collect();
        let mut rings = vec![RingStats {
            core: None,
            device: false,
            produced: self.host_ring().produced(r),
            dropped: self.host_ring().dropped(r),
        }];
        for (slot, &core) in self.info.cores.iter().enumerate() {
            for device in [false, true] {
                let ring = self.core_ring(slot, device);
                rings.push(RingStats {
                    core: Some(core),
                    device,
                    produced: if device { ring.events(r).load(Ordering::Acquire) } else { ring.produced(r) },
                    dropped: ring.dropped(r),
                });
            }
        }
        Snapshot {
            taken_ns: monotonic_ns(),
            cores,
            host_memory: std::array::from_fn(|k| process(layout::process::HOST_MEMORY + k as u64)),
            ecc,
            strings_dropped: self.strings.dropped(r),
            instruction_tables_refused: InstructionTable::of(&self.layout).refused(r),
            model_slots_overflowed: process(layout::process::MODEL_SLOTS_OVERFLOWED),
            rings,
        }
    }

    /// The loaded models, by model id.
    pub fn models(&self) -> Vec<ModelInfo> {
        let mut models: Vec<ModelInfo> = (0..self.layout.sizes.model_slots).filter_map(|s| self.model(s)).collect();
        models.sort_by_key(|m| m.model_id);
        models
    }

    fn model(&self, slot: u32) -> Option<ModelInfo> {
        let r = &self.region;
        let base = self.layout.model_slot(slot);
        for _ in 0..1000 {
            let seq = r.u64(base + model::SEQ).load(Ordering::Acquire);
            if seq % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let model_id = r.u32(base + model::MODEL_ID).load(Ordering::Relaxed);
            let name_len = u64::from(r.u32(base + model::NAME_LEN).load(Ordering::Relaxed)).min(model::NAME_MAX);
            let uuid = u128::from(r.u64(base + model::UUID).load(Ordering::Relaxed))
                | u128::from(r.u64(base + model::UUID + 8).load(Ordering::Relaxed)) << 64;
            let info = ModelInfo {
                model_id,
                core: r.u32(base + model::CORE).load(Ordering::Relaxed),
                name: String::from_utf8_lossy(&r.read_bytes(base + model::NAME, name_len)).into_owned(),
                uuid: Uuid::from_u128(uuid),
                flops_per_execution: r.u64(base + model::FLOPS_PER_EXECUTION).load(Ordering::Relaxed),
                instructions: r.u64(base + model::INSTRUCTIONS).load(Ordering::Relaxed),
                device_memory: std::array::from_fn(|k| {
                    r.u64(base + model::DEVICE_MEMORY + 8 * k as u64).load(Ordering::Relaxed)
                }),
                host_memory: r.u64(base + model::HOST_MEMORY).load(Ordering::Relaxed),
                executions: r.u64(base + model::EXECUTIONS).load(Ordering::Relaxed),
                running: r.u64(base + model::RUNNING).load(Ordering::Relaxed),
                latency: (0..histogram::MODEL_BUCKETS)
                    .map(|b| r.u64(self.layout.model_histogram_bucket(slot, b)).load(Ordering::Relaxed))
                    .collect(),
            };
            fence(Ordering::Acquire);
            if r.u64(base + model::SEQ).load(Ordering::Relaxed) == seq {
                return (model_id != 0).then_some(info);
            }
        }
        None
    }

    /// A tail over the rings of `cores` (all held cores when `None`; the process ring
    /// is included only then), reading system events of the types in `system_types`
    /// (a mask of `EventType::bit`s) and device events when `device` is set.
    pub fn tail(&self, start: TailStart, cores: Option<&[u32]>, system_types: u64, device: bool) -> Tail {
        Tail::new(&self.region, &self.layout, &self.info.cores, start, cores, system_types, device)
    }

    fn host_ring(&self) -> RingRef {
        RingRef { base: self.layout.host_ring(), capacity: self.layout.sizes.ring_capacity }
    }

    fn core_ring(&self, slot: usize, device: bool) -> RingRef {
        RingRef { base: self.layout.core_ring(slot, device), capacity: self.layout.sizes.ring_capacity }
    }
}

/// Host tick conversion from a datastore header's calibration points.
pub(crate) fn converter_of(region: &Region, fallback_ns_per_tick: f64) -> TickConverter {
    let r = region;
    let first = CalibrationPoint {
        ticks: r.u64(header::CALIBRATION_FIRST_TICKS).load(Ordering::Relaxed),
        ns: r.u64(header::CALIBRATION_FIRST_NS).load(Ordering::Relaxed),
    };
    let mut latest = first;
    for _ in 0..100 {
        let seq = r.u64(header::CALIBRATION_SEQ).load(Ordering::Acquire);
        if seq % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let ticks = r.u64(header::CALIBRATION_LATEST_TICKS).load(Ordering::Relaxed);
        let ns = r.u64(header::CALIBRATION_LATEST_NS).load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if r.u64(header::CALIBRATION_SEQ).load(Ordering::Relaxed) == seq {
            latest = CalibrationPoint { ticks, ns };
            break;
        }
    }
    TickConverter::new(first, latest, fallback_ns_per_tick)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_read_off_the_buckets_gained() {
        let mut now = vec![0u64; histogram::BUCKETS];
        // 1 µs, 2 µs, …, 100 µs, once each, and an older 5 s one already counted before.
        for us in 1..=100u64 {
            now[histogram::bucket_of(us * 1000)] += 1;
        }
        let mut before = vec![0u64; histogram::BUCKETS];
        now[histogram::bucket_of(5_000_000_000)] += 1;
        before[histogram::bucket_of(5_000_000_000)] += 1;
        let p = percentiles(&now, Some(&before)).expect("gained");
        assert_eq!(p.count, 100);
        let near = |value: f64, us: f64| (value - us * 1e-6).abs() <= us * 1e-6 * 0.035;
        for (value, us) in
            [(p.p0, 1.0), (p.p1, 1.0), (p.p25, 25.0), (p.p50, 50.0), (p.p75, 75.0), (p.p99, 99.0), (p.p100, 100.0)]
        {
            assert!(near(value, us), "{value} for {us} µs in {p:?}");
        }
        assert_eq!(percentiles(&before, Some(&before)), None, "nothing gained");
    }
}
