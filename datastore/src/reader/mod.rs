//! The tools' side of the datastore: discover runtimes, map one read-only, take
//! counter snapshots and deltas, read the models table, tail the event rings.
//!
//! A reader never writes to the file. It trusts nothing in it: the header is checked
//! against the layout arithmetic and the file's real length before any other offset is
//! used, and ring records are accepted only when their sequence and check agree.
//!
//! Here: the reader itself (opening, the header, the models table, liveness, tails and
//! snapshots handed out); `snapshot.rs`: counters, deltas and latency percentiles;
//! `tail.rs`: the event rings read in order; `liveness.rs`: the rule that tells a
//! stopped runtime from an exited one; `discovery.rs`: the runtimes of a directory.

use std::fs::OpenOptions;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{Ordering, fence};

use uuid::Uuid;

use crate::clock::{CalibrationPoint, TickConverter, monotonic_ns};
use crate::instructions::InstructionTable;
use crate::layout::{self, Layout, Sizes, header, model};
use crate::ring::RingRef;
use crate::shm::{Mapping, Region};
use crate::strings::StringTable;
use crate::{DatastoreError, directory, histogram};

mod discovery;
mod flight;
mod liveness;
mod snapshot;
mod tail;
pub(crate) use discovery::remove_dead_runtimes;
pub use discovery::{RuntimeEntry, discover, discover_new};
pub use flight::{ClockOffsetRecord, CommunicatorRecord, RankRecord};
pub use liveness::{ExitReason, HEARTBEAT_STALE_AFTER, Liveness};
pub use snapshot::{
    CoreDelta, CoreSnapshot, Delta, ErrorCounts, ExecutionCounts, LatencyPercentiles, RingStats, Snapshot,
    latency_of_all_cores,
};
pub use tail::{Tail, TailStart, TraceEvent};

use snapshot::percentiles_with;

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
    /// The HLO instruction an execution in flight is at (its last one seen).
    pub at_instruction: Option<String>,
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
/// A heartbeat at most this old says the writer is there (it beats every 250 ms), without
/// a look at `/proc`: see [`DatastoreReader::liveness_and_cpu`].
pub(crate) const FRESH_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

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
        self.liveness_and_status().0
    }

    /// [`liveness`](Self::liveness), and the writer process's `/proc` status it was
    /// decided from (`None` once closed or gone): one read of `/proc/<pid>/stat` for
    /// both, which also holds the process's CPU time.
    pub fn liveness_and_status(&self) -> (Liveness, Option<directory::ProcessStatus>) {
        let closed = self.region.u32(header::STATE).load(Ordering::Acquire) == layout::STATE_CLOSED;
        let process = if closed { None } else { directory::process_status(self.info.pid) };
        let heartbeat = self.region.u64(header::HEARTBEAT_MONO_NS).load(Ordering::Acquire);
        (Liveness::of(closed, process, self.process_start, monotonic_ns().saturating_sub(heartbeat)), process)
    }

    /// The writer's liveness and its process's CPU time (`None`: gone, or unreadable),
    /// as a tool that looks every second needs them: while the heartbeat is fresh (at
    /// most 1 s old) the process is live and its CPU time is its own
    /// latest reading, in the file; else both come from `/proc/<pid>/stat`, as
    /// [`DatastoreReader::liveness_and_status`] says. (A tool that follows many runtimes
    /// spends most of its time in the kernel reading `/proc` otherwise: each read walks
    /// the process's threads.)
    pub fn liveness_and_cpu(&self, ticks_per_second: u64) -> (Liveness, Option<crate::host::ProcessCpu>) {
        let closed = self.region.u32(header::STATE).load(Ordering::Acquire) == layout::STATE_CLOSED;
        let heartbeat = self.region.u64(header::HEARTBEAT_MONO_NS).load(Ordering::Acquire);
        if !closed
            && monotonic_ns().saturating_sub(heartbeat) <= FRESH_HEARTBEAT.as_nanos() as u64
            && let Some(cpu) = self.cpu_time(ticks_per_second)
        {
            return (Liveness::Live, Some(cpu));
        }
        let at_ns = monotonic_ns();
        let (liveness, status) = self.liveness_and_status();
        (liveness, status.map(|s| crate::host::ProcessCpu::of(&s, at_ns)))
    }

    /// The CPU time the writer read at its latest heartbeat, in clock ticks.
    fn cpu_time(&self, ticks_per_second: u64) -> Option<crate::host::ProcessCpu> {
        use layout::process::{CPU_AT_NS, CPU_SEQ, CPU_SYSTEM_NS, CPU_USER_NS};
        let [user, system, at_ns] = self.process_words(CPU_SEQ, [CPU_USER_NS, CPU_SYSTEM_NS, CPU_AT_NS])?;
        let ticks = |ns: u64| (u128::from(ns) * u128::from(ticks_per_second) / 1_000_000_000) as u64;
        (at_ns != 0).then(|| crate::host::ProcessCpu { user: ticks(user), system: ticks(system), at_ns })
    }

    /// Process words `words`, read together under the seqlock in process word `seq`
    /// (`None` when a writer kept it busy throughout).
    pub(crate) fn process_words<const N: usize>(&self, seq: u64, words: [u64; N]) -> Option<[u64; N]> {
        let word = |w| self.region.u64(self.layout.process_word(w));
        for _ in 0..1000 {
            let before = word(seq).load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let values = words.map(|w| word(w).load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if word(seq).load(Ordering::Relaxed) == before {
                return Some(values);
            }
        }
        None
    }

    /// Host tick conversion from the header's calibration points.
    pub fn converter(&self) -> TickConverter {
        converter_of(&self.region, self.fallback_ns_per_tick)
    }

    /// The exemplars of the `slot`-th held core.
    /// (`converter` and `realtime_offset` turn their ticks into times: see
    /// [`DatastoreReader::exemplar_clock`].)
    fn exemplars(
        &self,
        slot: usize,
        (converter, realtime_offset): (&TickConverter, i64),
    ) -> crate::exemplar::CoreExemplars {
        use crate::exemplar::{LATENCY_SLOTS, read};
        let slot_at = |index: usize| {
            read(&self.region, self.layout.exemplar_slot(slot, index), |ticks| converter.to_ns(ticks), realtime_offset)
        };
        crate::exemplar::CoreExemplars {
            latency: (0..LATENCY_SLOTS).map(slot_at).collect(),
            errors: (0..crate::ErrorClass::ALL.len()).map(|k| slot_at(LATENCY_SLOTS + k)).collect(),
        }
    }

    /// The file's tick conversion, and `CLOCK_REALTIME` minus `CLOCK_MONOTONIC` as it
    /// was when the file was made: what turns an exemplar's ticks into its times.
    fn exemplar_clock(&self) -> (TickConverter, i64) {
        let created_mono = self.region.u64(header::CREATED_MONO_NS).load(Ordering::Relaxed);
        (self.converter(), (i128::from(self.info.created_realtime_ns) - i128::from(created_mono)) as i64)
    }

    /// Every counter, now.
    pub fn snapshot(&self) -> Snapshot {
        let r = &self.region;
        let l = &self.layout;
        let (converter, realtime_offset) = self.exemplar_clock();
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
                    rank: w(layout::core::RANK).checked_sub(1).map(|r| r as u32),
                    ranks: w(layout::core::RANKS) as u32,
                    device_latency: histogram(false),
                    total_latency: histogram(true),
                    exemplars: self.exemplars(slot, (&converter, realtime_offset)),
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
        read_model(&self.region, &self.layout, &self.strings, slot)
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
/// Model slot `slot` of the models table, unless empty (the reader's and, for what it
/// says of itself, the writer's).
pub(crate) fn read_model(r: &Region, layout: &Layout, strings: &StringTable, slot: u32) -> Option<ModelInfo> {
    let base = layout.model_slot(slot);
    for _ in 0..1000 {
        let seq = r.u64(base + model::SEQ).load(Ordering::Acquire);
        if seq % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let model_id = r.u32(base + model::MODEL_ID).load(Ordering::Relaxed);
        if model_id == 0 {
            // An empty slot: nothing more to read (most slots are).
            return None;
        }
        let name_len = u64::from(r.u32(base + model::NAME_LEN).load(Ordering::Relaxed)).min(model::NAME_MAX);
        let uuid = u128::from(r.u64(base + model::UUID).load(Ordering::Relaxed))
            | u128::from(r.u64(base + model::UUID + 8).load(Ordering::Relaxed)) << 64;
        let running = r.u64(base + model::RUNNING).load(Ordering::Relaxed);
        let at_instruction = r.u32(base + model::AT_INSTRUCTION).load(Ordering::Relaxed);
        let mut info = ModelInfo {
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
            running,
            at_instruction: None,
            latency: (0..histogram::MODEL_BUCKETS)
                .map(|b| r.u64(layout.model_histogram_bucket(slot, b)).load(Ordering::Relaxed))
                .collect(),
        };
        fence(Ordering::Acquire);
        if r.u64(base + model::SEQ).load(Ordering::Relaxed) == seq {
            if running > 0 && at_instruction != 0 {
                info.at_instruction = strings.get(r, at_instruction);
            }
            return Some(info);
        }
    }
    None
}

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
    use crate::host::{ProcessCpu, clock_ticks_per_second};
    use crate::test_support::open_pair;

    #[test]
    fn a_fresh_heartbeat_brings_the_process_cpu_time_without_a_look_at_proc() {
        let (_dir, writer, reader) = open_pair();
        let ticks = clock_ticks_per_second();
        // No reading in the file yet: from /proc.
        let (liveness, cpu) = reader.liveness_and_cpu(ticks);
        assert_eq!(liveness, crate::Liveness::Live);
        let from_proc = cpu.expect("this process's CPU time");
        // Burn some CPU, then beat: the file's reading, of this same process.
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(60) {
            std::hint::black_box(spin.elapsed());
        }
        writer.heartbeat();
        let (liveness, cpu) = reader.liveness_and_cpu(ticks);
        assert_eq!(liveness, crate::Liveness::Live);
        let from_file = cpu.expect("the writer's reading");
        assert!(from_file.at_ns > from_proc.at_ns, "{from_file:?} {from_proc:?}");
        let now = ProcessCpu::read(std::process::id()).expect("/proc");
        let total = |c: &ProcessCpu| c.user + c.system;
        assert!(
            total(&from_file) >= total(&from_proc) && total(&from_file) <= total(&now) + 1,
            "{from_file:?} {now:?}"
        );
        assert!(from_file.seconds_since(&from_proc).is_some_and(|s| s >= 0.05), "{from_file:?} {from_proc:?}");
    }
}
