//! The runtime's side of the datastore: create the file, count, publish, close.
//!
//! The file is built under a temporary name and renamed into place, so a reader never
//! sees a half-written header. Counters are relaxed atomic additions; the models table
//! uses a per-slot seqlock; rings are written by `trace::Tracer`. Nothing here blocks
//! an execution except interning a new string and updating the models table, which
//! happen at load and allocation time.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use uuid::Uuid;

use crate::clock::{CalibrationPoint, DeviceClock, TickSource};
use crate::instructions::{InstructionTable, InstructionTrace};
use crate::kinds::{DeviceCategory, HostCategory};
use crate::layout::{self, Layout, Sizes, header, model};
use crate::ring::RingRef;
use crate::shm::{Mapping, Region};
use crate::strings::StringTable;
use crate::{DatastoreError, directory, histogram};

/// Runtimes this process has created, numbering their files.
static NEXT_INSTANCE: AtomicU32 = AtomicU32::new(0);

/// Everything the header records about the process and its runtime.
#[derive(Debug, Clone)]
pub struct CreateParams {
    pub dir: PathBuf,
    pub tag: Option<String>,
    pub instance_type: String,
    pub device_count: u32,
    pub cores_per_device: u32,
    pub device_memory_bytes: u64,
    pub instance_core_count: u32,
    /// Global indexes of the held cores, in ring order.
    pub cores: Vec<u32>,
    pub ring_capacity: u64,
    pub model_slots: u32,
    pub string_table_bytes: u64,
    pub instruction_table_bytes: u64,
    pub tick_source: TickSource,
    pub calibration: CalibrationPoint,
    pub ns_per_tick: f64,
    pub device_clocks: Vec<DeviceClock>,
    pub recording: u32,
    /// Host threads a core computes on at most.
    pub host_threads: u32,
    /// The kernel of bf16-rounded matrix products.
    pub product_kernel: crate::peaks::ProductKernel,
    /// The command's name and its arguments (see [`crate::CommandIdentity`]).
    pub command: crate::CommandIdentity,
}

/// What the models table shows about a loaded model.
#[derive(Debug, Clone)]
pub struct ModelEntry {
    pub model_id: u32,
    pub core: u32,
    pub name: String,
    pub uuid: Uuid,
    pub loaded_ticks: u64,
    pub flops_per_execution: u64,
    pub instructions: u64,
    pub device_memory: [u64; 5],
    pub host_memory: u64,
}

/// The ECC counters of a device, in their order in the process block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EccCounter {
    MemCorrected = 0,
    MemUncorrected = 1,
    SramCorrected = 2,
    SramUncorrected = 3,
}

/// An open, writable datastore.
#[derive(Debug)]
pub struct DatastoreWriter {
    pub(crate) region: Region,
    pub(crate) layout: Layout,
    path: PathBuf,
    /// Ring slot of each global core index (`u8::MAX`: not held).
    core_slot: Vec<u8>,
    cores: Vec<u32>,
    strings: StringTable,
    interned: Mutex<HashMap<String, u32>>,
    instructions: Mutex<InstructionTable>,
    /// Which model occupies each slot of the models table.
    model_slots: Mutex<Vec<Option<u32>>>,
    /// Which communicator slots are taken (`flight.rs`).
    pub(crate) comm_slots: Mutex<Vec<bool>>,
    removed: std::sync::atomic::AtomicBool,
    /// Held while the heartbeat's seqlocks are written: the heartbeat thread and a
    /// closing runtime may beat at once.
    beating: Mutex<()>,
    /// The file is on tmpfs (see [`DatastoreWriter::prefault_chunks`]).
    in_memory: bool,
}

impl DatastoreWriter {
    /// Creates `nrt-<pid>-<n>.ds` in `params.dir` (made private to this user if new).
    /// When the file system has too little room for rings of `params.ring_capacity`
    /// events, the rings are made smaller (down to [`MIN_EVENTS_PER_NC`](layout::MIN_EVENTS_PER_NC)) with a warning:
    /// a full tmpfs would otherwise kill the process with SIGBUS later.
    pub fn create(params: &CreateParams) -> Result<DatastoreWriter, DatastoreError> {
        directory::ensure_private_dir(&params.dir)?;
        let removed = crate::reader::remove_dead_runtimes(&params.dir);
        if !removed.is_empty() {
            tracing::info!(dir = %params.dir.display(), "removed {} datastore files of exited runtimes", removed.len());
        }
        let free = directory::free_space(&params.dir)?;
        let mut sizes = Sizes {
            core_count: params.cores.len() as u32,
            ring_capacity: params.ring_capacity,
            model_slots: params.model_slots,
            string_table_bytes: params.string_table_bytes,
            instruction_table_bytes: params.instruction_table_bytes,
            histogram_buckets: histogram::BUCKETS as u32,
        };
        let mut layout = Layout::new(sizes).ok_or_else(|| DatastoreError::Layout(format!("{sizes:?}")))?;
        while layout.file_bytes > free / 2 && sizes.ring_capacity > layout::MIN_EVENTS_PER_NC {
            sizes.ring_capacity /= 2;
            layout = Layout::new(sizes).ok_or_else(|| DatastoreError::Layout(format!("{sizes:?}")))?;
        }
        if layout.file_bytes > free {
            return Err(DatastoreError::NoSpace { dir: params.dir.clone(), needed: layout.file_bytes, free });
        }
        if sizes.ring_capacity < params.ring_capacity {
            tracing::warn!(
                dir = %params.dir.display(),
                free,
                "trace rings hold {} events per core instead of {}: the datastore directory is short of space",
                sizes.ring_capacity,
                params.ring_capacity
            );
        }
        let pid = std::process::id();
        let instance = NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed);
        let path = directory::file_path(&params.dir, pid, instance);
        // A file with our pid and instance belongs to a process that is gone (pids are
        // unique among live processes), so it is stale.
        let _ = std::fs::remove_file(&path);
        let temporary = params.dir.join(format!(".nrt-{pid}-{instance}.tmp"));
        let _ = std::fs::remove_file(&temporary);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&temporary)
            .map_err(|e| DatastoreError::io(&temporary, e))?;
        file.set_len(layout.file_bytes).map_err(|e| DatastoreError::io(&temporary, e))?;
        // SAFETY: the file is ours (just created, mode 0600); other processes only map
        // it read-only and every access goes through atomics (see `shm`).
        let map =
            unsafe { memmap2::MmapOptions::new().map_mut(&file) }.map_err(|e| DatastoreError::io(&temporary, e))?;
        let writer = DatastoreWriter {
            region: Region::new(Mapping::ReadWrite(map)),
            layout,
            strings: StringTable { base: layout.strings, capacity: layout.sizes.string_table_bytes },
            core_slot: {
                let mut slots = vec![u8::MAX; layout::MAX_CORES as usize];
                for (slot, &core) in params.cores.iter().enumerate() {
                    slots[core as usize] = slot as u8;
                }
                slots
            },
            cores: params.cores.clone(),
            interned: Mutex::new(HashMap::new()),
            instructions: Mutex::new(InstructionTable::of(&layout)),
            model_slots: Mutex::new(vec![None; params.model_slots as usize]),
            comm_slots: Mutex::new(vec![false; layout::COMM_SLOTS as usize]),
            removed: std::sync::atomic::AtomicBool::new(false),
            beating: Mutex::new(()),
            in_memory: directory::in_memory(&params.dir),
            path: path.clone(),
        };
        writer.write_header(params, pid);
        if let Err(e) = std::fs::rename(&temporary, &path) {
            let _ = std::fs::remove_file(&temporary);
            return Err(DatastoreError::io(&path, e));
        }
        Ok(writer)
    }

    fn write_header(&self, params: &CreateParams, pid: u32) {
        let r = &self.region;
        let l = &self.layout;
        r.u64(header::MAGIC).store(layout::MAGIC, Ordering::Relaxed);
        r.u32(header::LAYOUT_VERSION).store(layout::LAYOUT_VERSION, Ordering::Relaxed);
        r.u32(header::HEADER_BYTES).store(layout::HEADER_BYTES as u32, Ordering::Relaxed);
        r.u64(header::FILE_BYTES).store(l.file_bytes, Ordering::Relaxed);
        r.u32(header::PID).store(pid, Ordering::Relaxed);
        r.u64(header::PROCESS_START_TICKS).store(directory::process_start_time(pid).unwrap_or(0), Ordering::Relaxed);
        r.u64(header::HEARTBEAT_MONO_NS).store(params.calibration.ns, Ordering::Relaxed);
        r.u64(header::CREATED_REALTIME_NS).store(crate::clock::realtime_ns(), Ordering::Relaxed);
        r.u64(header::CREATED_MONO_NS).store(params.calibration.ns, Ordering::Relaxed);
        let source = match params.tick_source {
            TickSource::MonotonicNs => layout::TICK_SOURCE_MONOTONIC_NS,
            TickSource::Tsc => layout::TICK_SOURCE_TSC,
        };
        r.u32(header::TICK_SOURCE).store(source, Ordering::Relaxed);
        r.u32(header::RECORDING).store(params.recording, Ordering::Relaxed);
        r.u64(header::CALIBRATION_FIRST_TICKS).store(params.calibration.ticks, Ordering::Relaxed);
        r.u64(header::CALIBRATION_FIRST_NS).store(params.calibration.ns, Ordering::Relaxed);
        r.u64(header::CALIBRATION_LATEST_TICKS).store(params.calibration.ticks, Ordering::Relaxed);
        r.u64(header::CALIBRATION_LATEST_NS).store(params.calibration.ns, Ordering::Relaxed);
        r.u64(header::INITIAL_NS_PER_TICK_FP32).store((params.ns_per_tick * 4_294_967_296.0) as u64, Ordering::Relaxed);
        let epoch = params.device_clocks.first().map_or(params.calibration.ticks, |c| c.epoch_ticks);
        r.u64(header::DEVICE_CLOCK_EPOCH_TICKS).store(epoch, Ordering::Relaxed);
        r.u64(header::RING_CAPACITY).store(l.sizes.ring_capacity, Ordering::Relaxed);
        r.u32(header::CORE_COUNT).store(l.sizes.core_count, Ordering::Relaxed);
        r.u32(header::MODEL_SLOTS).store(l.sizes.model_slots, Ordering::Relaxed);
        r.u64(header::STRING_TABLE_BYTES).store(l.sizes.string_table_bytes, Ordering::Relaxed);
        r.u64(header::INSTRUCTION_TABLE_BYTES).store(l.sizes.instruction_table_bytes, Ordering::Relaxed);
        r.u32(header::DEVICE_COUNT).store(params.device_count, Ordering::Relaxed);
        r.u32(header::CORES_PER_DEVICE).store(params.cores_per_device, Ordering::Relaxed);
        r.u64(header::DEVICE_MEMORY_BYTES).store(params.device_memory_bytes, Ordering::Relaxed);
        r.u32(header::INSTANCE_CORE_COUNT).store(params.instance_core_count, Ordering::Relaxed);
        r.u32(header::HISTOGRAM_BUCKETS).store(l.sizes.histogram_buckets, Ordering::Relaxed);
        self.write_string(header::RUNTIME_VERSION, header::RUNTIME_VERSION_MAX, env!("CARGO_PKG_VERSION"));
        self.write_string(header::INSTANCE_TYPE, header::INSTANCE_TYPE_MAX, &params.instance_type);
        self.write_string(header::TAG, header::TAG_MAX, params.tag.as_deref().unwrap_or(""));
        r.u32(header::HOST_THREADS).store(params.host_threads, Ordering::Relaxed);
        r.u32(header::PRODUCT_KERNEL).store(params.product_kernel.code(), Ordering::Relaxed);
        self.write_string(header::COMMAND_NAME, header::COMMAND_NAME_MAX, &params.command.name);
        self.write_string(header::COMMAND_LINE, header::COMMAND_LINE_MAX, &params.command.line.join("\0"));
        for (slot, (&core, clock)) in params.cores.iter().zip(&params.device_clocks).enumerate() {
            r.u32(header::CORES + 4 * slot as u64).store(core, Ordering::Relaxed);
            r.u64(header::DEVICE_CLOCK_MULT + 8 * slot as u64).store(clock.mult_fp32, Ordering::Relaxed);
            r.u64(l.core_word(slot, layout::core::CORE_INDEX)).store(u64::from(core), Ordering::Relaxed);
        }
        let init_ring = |base: u64, core: u64, kind: u64| {
            r.u64(base + layout::ring::CAPACITY).store(l.sizes.ring_capacity, Ordering::Relaxed);
            r.u64(base + layout::ring::CORE).store(core, Ordering::Relaxed);
            r.u64(base + layout::ring::KIND).store(kind, Ordering::Relaxed);
        };
        init_ring(l.host_ring(), layout::HOST_RING_CORE, layout::RING_KIND_SYSTEM);
        for (slot, &core) in params.cores.iter().enumerate() {
            init_ring(l.core_ring(slot, false), u64::from(core), layout::RING_KIND_SYSTEM);
            init_ring(l.core_ring(slot, true), u64::from(core), layout::RING_KIND_DEVICE);
        }
        r.u32(header::STATE).store(layout::STATE_RUNNING, Ordering::Release);
    }

    fn write_string(&self, offset: u64, max: u64, text: &str) {
        let mut end = text.len().min(max as usize);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.region.write_bytes(offset + 4, &text.as_bytes()[..end]);
        self.region.u32(offset).store(end as u32, Ordering::Release);
    }

    /// Global indexes of the held cores, in ring order.
    #[inline]
    pub fn held_cores(&self) -> &[u32] {
        &self.cores
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ring slot of global core `core`, if this runtime holds it.
    #[inline]
    pub fn core_slot(&self, core: u32) -> Option<usize> {
        match self.core_slot.get(core as usize) {
            Some(&slot) if slot != u8::MAX => Some(slot as usize),
            _ => None,
        }
    }

    #[inline]
    pub fn core_counter(&self, slot: usize, word: u64) -> &AtomicU64 {
        self.region.u64(self.layout.core_word(slot, word))
    }

    #[inline]
    pub fn record_latency(&self, slot: usize, total: bool, ns: u64) {
        self.region
            .u64(self.layout.histogram_bucket(slot, total, histogram::bucket_of(ns)))
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps `exemplar` as the last execution of its latency range on the `slot`-th
    /// held core, and of `class` when it failed (`exemplar.rs`).
    pub fn record_exemplar(
        &self,
        slot: usize,
        exemplar: &crate::exemplar::Execution,
        class: Option<crate::ErrorClass>,
    ) {
        let latency = crate::exemplar::latency_slot(exemplar.latency_ns);
        crate::exemplar::write(&self.region, self.layout.exemplar_slot(slot, latency), exemplar);
        if let Some(class) = class {
            let index = crate::exemplar::LATENCY_SLOTS + class as usize;
            crate::exemplar::write(&self.region, self.layout.exemplar_slot(slot, index), exemplar);
        }
    }

    /// Keeps `exemplar` as the last execution of `class` on the `slot`-th held core, for
    /// an error counted while the execution goes on (its latency not known yet).
    pub fn record_error_exemplar(&self, slot: usize, exemplar: &crate::exemplar::Execution, class: crate::ErrorClass) {
        let index = crate::exemplar::LATENCY_SLOTS + class as usize;
        crate::exemplar::write(&self.region, self.layout.exemplar_slot(slot, index), exemplar);
    }

    pub fn add_host_memory(&self, category: HostCategory, bytes: u64, add: bool) {
        let counter = self.region.u64(self.layout.process_word(layout::process::HOST_MEMORY + category as u64));
        if add {
            counter.fetch_add(bytes, Ordering::Relaxed);
        } else {
            counter.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    pub fn add_device_memory(&self, core: u32, category: DeviceCategory, bytes: u64, add: bool) {
        if let Some(slot) = self.core_slot(core) {
            let counter = self.core_counter(slot, layout::core::DEVICE_MEMORY + category as u64);
            if add {
                counter.fetch_add(bytes, Ordering::Relaxed);
            } else {
                counter.fetch_sub(bytes, Ordering::Relaxed);
            }
        }
    }

    /// Counts one ECC event on `device` (of the instance).
    pub fn add_ecc(&self, device: u32, counter: EccCounter) {
        if device < layout::MAX_DEVICES {
            let word = layout::process::ECC + 4 * u64::from(device) + counter as u64;
            self.region.u64(self.layout.process_word(word)).fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_recording(&self, recording: u32) {
        self.region.u32(header::RECORDING).store(recording, Ordering::Release);
    }

    /// The id of `text` in the string table, appending it the first time.
    pub fn intern(&self, text: &str) -> u32 {
        let mut interned = self.interned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = interned.get(text) {
            return id;
        }
        let id = self.strings.append(&self.region, text);
        if id != 0 {
            interned.insert(text.to_owned(), id);
        }
        id
    }

    /// Adds model `model_id`'s instructions, in execution order, to the instruction
    /// table; `false` when the table is full.
    pub fn add_instructions(&self, model_id: u32, instructions: &[InstructionTrace]) -> bool {
        let table = self.instructions.lock().unwrap_or_else(|e| e.into_inner());
        table.append(&self.region, model_id, instructions)
    }

    /// Publishes a loaded model; returns its slot, or `None` (counted) when the table
    /// is full.
    pub fn publish_model(&self, entry: &ModelEntry) -> Option<u32> {
        let mut slots = self.model_slots.lock().unwrap_or_else(|e| e.into_inner());
        let Some(slot) = slots.iter().position(Option::is_none) else {
            self.region
                .u64(self.layout.process_word(layout::process::MODEL_SLOTS_OVERFLOWED))
                .fetch_add(1, Ordering::Relaxed);
            return None;
        };
        slots[slot] = Some(entry.model_id);
        let base = self.layout.model_slot(slot as u32);
        let r = &self.region;
        let seq = r.u64(base + model::SEQ);
        let odd = seq.load(Ordering::Relaxed) + 1;
        seq.store(odd, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        r.u32(base + model::MODEL_ID).store(entry.model_id, Ordering::Relaxed);
        r.u32(base + model::CORE).store(entry.core, Ordering::Relaxed);
        r.u64(base + model::LOADED_TICKS).store(entry.loaded_ticks, Ordering::Relaxed);
        let uuid = entry.uuid.as_u128();
        r.u64(base + model::UUID).store(uuid as u64, Ordering::Relaxed);
        r.u64(base + model::UUID + 8).store((uuid >> 64) as u64, Ordering::Relaxed);
        r.u64(base + model::FLOPS_PER_EXECUTION).store(entry.flops_per_execution, Ordering::Relaxed);
        r.u64(base + model::INSTRUCTIONS).store(entry.instructions, Ordering::Relaxed);
        for (k, bytes) in entry.device_memory.iter().enumerate() {
            r.u64(base + model::DEVICE_MEMORY + 8 * k as u64).store(*bytes, Ordering::Relaxed);
        }
        r.u64(base + model::HOST_MEMORY).store(entry.host_memory, Ordering::Relaxed);
        let mut end = entry.name.len().min(model::NAME_MAX as usize);
        while !entry.name.is_char_boundary(end) {
            end -= 1;
        }
        r.write_bytes(base + model::NAME, &entry.name.as_bytes()[..end]);
        r.u32(base + model::NAME_LEN).store(end as u32, Ordering::Relaxed);
        r.u64(base + model::EXECUTIONS).store(0, Ordering::Relaxed);
        r.u64(base + model::RUNNING).store(0, Ordering::Relaxed);
        r.u32(base + model::AT_INSTRUCTION).store(0, Ordering::Relaxed);
        for bucket in 0..histogram::MODEL_BUCKETS {
            r.u64(self.layout.model_histogram_bucket(slot as u32, bucket)).store(0, Ordering::Relaxed);
        }
        seq.store(odd + 1, Ordering::Release);
        Some(slot as u32)
    }

    /// Removes a model from the table.
    pub fn retract_model(&self, slot: u32) {
        let mut slots = self.model_slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = slots.get_mut(slot as usize) {
            *entry = None;
            let base = self.layout.model_slot(slot);
            let seq = self.region.u64(base + model::SEQ);
            let odd = seq.load(Ordering::Relaxed) + 1;
            seq.store(odd, Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Release);
            self.region.u32(base + model::MODEL_ID).store(0, Ordering::Relaxed);
            seq.store(odd + 1, Ordering::Release);
        }
    }

    /// Counts one execution of the model in table slot `slot` that took `ns` (the whole
    /// `execute` call).
    #[inline]
    pub fn record_model_latency(&self, slot: u32, ns: u64) {
        self.region
            .u64(self.layout.model_histogram_bucket(slot, histogram::model_bucket_of(ns)))
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A model slot's execution counter or in-flight count (`model::EXECUTIONS`, `model::RUNNING`).
    #[inline]
    pub fn model_counter(&self, slot: u32, field: u64) -> &AtomicU64 {
        self.region.u64(self.layout.model_slot(slot) + field)
    }

    /// Where an execution of the model in table slot `slot` is: the HLO name's string
    /// id of its instruction now (`model::AT_INSTRUCTION`; 0 for none).
    #[inline]
    pub fn model_at_instruction(&self, slot: u32) -> &AtomicU32 {
        self.region.u32(self.layout.model_slot(slot) + model::AT_INSTRUCTION)
    }

    /// What this process is doing now, as its models table says (what it tells the
    /// job's other processes: see [`crate::ranks::Activity`]).
    pub fn activity(&self) -> crate::ranks::Activity {
        let models = (0..self.layout.sizes.model_slots)
            .filter_map(|slot| crate::reader::read_model(&self.region, &self.layout, &self.strings, slot));
        crate::ranks::Activity::of_models(models, crate::Liveness::Live)
    }

    pub(crate) fn host_ring(&self) -> RingRef {
        RingRef { base: self.layout.host_ring(), capacity: self.layout.sizes.ring_capacity }
    }

    pub(crate) fn core_ring(&self, slot: usize, device: bool) -> RingRef {
        RingRef { base: self.layout.core_ring(slot, device), capacity: self.layout.sizes.ring_capacity }
    }

    pub(crate) fn strings(&self) -> StringTable {
        self.strings
    }

    /// The byte ranges of the rings, in chunks of at most `chunk` bytes, to fault in
    /// ahead of the producers with [`Region::prefault`]: otherwise every event that
    /// is the first in its page during a ring's first lap takes a page fault (about
    /// one in 32). Empty when the file is not on tmpfs, where that would mean writing
    /// the whole file to disk.
    pub fn prefault_chunks(&self, chunk: u64) -> Vec<(u64, u64)> {
        if !self.in_memory {
            return Vec::new();
        }
        let (start, end) = (self.layout.host_ring(), self.region.len());
        (start..end).step_by(chunk as usize).map(|offset| (offset, chunk.min(end - offset))).collect()
    }

    /// Faults in `len` bytes of the file from `offset` (one of
    /// [`DatastoreWriter::prefault_chunks`]).
    pub fn prefault(&self, offset: u64, len: u64) {
        self.region.prefault(offset, len);
    }

    /// Marks the writer alive now, and refreshes the tick calibration.
    pub fn heartbeat(&self) {
        let _beating = self.beating.lock().unwrap_or_else(|e| e.into_inner());
        let point = CalibrationPoint::now();
        let r = &self.region;
        let seq = r.u64(header::CALIBRATION_SEQ);
        let odd = seq.load(Ordering::Relaxed) + 1;
        seq.store(odd, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        r.u64(header::CALIBRATION_LATEST_TICKS).store(point.ticks, Ordering::Relaxed);
        r.u64(header::CALIBRATION_LATEST_NS).store(point.ns, Ordering::Relaxed);
        seq.store(odd + 1, Ordering::Release);
        self.record_cpu_time();
        r.u64(header::HEARTBEAT_MONO_NS).store(point.ns, Ordering::Release);
    }

    /// Records this process's CPU time now (see `layout::process::CPU_SEQ`).
    fn record_cpu_time(&self) {
        use nix::sys::resource::{UsageWho, getrusage};
        let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else { return };
        let ns = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000_000 + t.tv_usec() as u64 * 1_000;
        use layout::process::{CPU_AT_NS, CPU_SEQ, CPU_SYSTEM_NS, CPU_USER_NS};
        let at = crate::clock::monotonic_ns();
        let words = [(CPU_USER_NS, ns(usage.user_time())), (CPU_SYSTEM_NS, ns(usage.system_time())), (CPU_AT_NS, at)];
        self.set_process_words(CPU_SEQ, words);
    }

    /// Writes process words `(word, value)` together under the seqlock in process word
    /// `seq` (one writer at a time: the caller's).
    pub(crate) fn set_process_words<const N: usize>(&self, seq: u64, words: [(u64, u64); N]) {
        let word = |w| self.region.u64(self.layout.process_word(w));
        let odd = word(seq).load(Ordering::Relaxed) + 1;
        word(seq).store(odd, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        for (w, value) in words {
            word(w).store(value, Ordering::Relaxed);
        }
        word(seq).store(odd + 1, Ordering::Release);
    }

    /// Marks the file closed and removes it (a clean exit).
    pub fn close(&self) {
        self.heartbeat();
        self.region.u32(header::STATE).store(layout::STATE_CLOSED, Ordering::Release);
        if !self.removed.swap(true, Ordering::AcqRel) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for DatastoreWriter {
    fn drop(&mut self) {
        self.close();
    }
}
