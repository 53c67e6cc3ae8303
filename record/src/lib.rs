//! Records a runtime's trace events, read from its datastore rings, into an NTFF file;
//! and turns NTFF events back into the runtime's typed events.
//!
//! Everything that writes profiles uses it: `neuron-profile` (capture, inspect,
//! snapshot), and `nrt_profile_start`/`nrt_profile_stop` of the C API. It is the one
//! place that knows both the datastore's event model and the file's:
//! each payload field becomes a named argument (keyed as its declaration in the
//! datastore's `event/schema.rs` names it), device activities become descriptors, ring
//! overwrites become loss markers and `timestamp_sync_point` events become sync points.

mod background;

pub use background::BackgroundRecording;

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use neuron_datastore::Engine;
use neuron_datastore::{
    ClockDomain, DeviceActivity, DeviceEvent, DmaQueueType, EventData, EventType, FieldValue, Phase, SystemEvent,
};
use neuron_datastore::{DatastoreReader, ModelInfo, RuntimeInfo, Tail, TraceEvent};
use ntff::{Arg, ArgValue, Descriptor, DescriptorId, NtffError, Sym, SyncPoint, Writer};

/// Why a recording failed: the file could not be created or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot create the trace file {path}: {source}")]
    Create { path: std::path::PathBuf, source: NtffError },
    #[error("cannot write the trace file: {0}")]
    Write(#[from] NtffError),
    #[error("the thread recording the trace stopped with a panic")]
    Thread,
}

pub type Result<T, E = RecordError> = std::result::Result<T, E>;

/// Records read per ring per poll.
pub const POLL_RECORDS: usize = 65_536;

/// Which events a recorder keeps.
type EventFilter = dyn Fn(&TraceEvent) -> bool + Send;

/// Writes runtime events into an NTFF writer.
pub struct Recorder<W: Write> {
    writer: Writer<W>,
    names: HashMap<EventType, Sym>,
    /// The key of a system event's core rank argument, once interned.
    rank_key: Option<Sym>,
    /// Device activities by (model, kind, engine or queue, step or index), with their id.
    descriptors: HashMap<(u32, u8, u8, u32), (DeviceActivity, DescriptorId)>,
    /// Events lost so far per ring (core, device?), as the tail counted them.
    lost: HashMap<(Option<u32>, bool), u64>,
    models: Vec<u32>,
    buffer: Vec<TraceEvent>,
    /// Events not kept are left out on purpose (not losses).
    keep: Option<Box<EventFilter>>,
    last_drain: Instant,
    last_flush: Instant,
}

/// The NTFF argument of a system event that gives its core's rank.
const RANK_ARG: &str = "rank";

/// How often [`Recorder::drain_when_due`] drains the rings of a running process.
/// Draining after every short execution cost about 2% of the attention example's time
/// (see BENCHMARKS.md); a ring holds far more than short executions make in this time.
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(10);
/// How often a running recording writes its open chunks, so that a reader, or a file
/// left by a crash, has them.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

impl<W: Write> std::fmt::Debug for Recorder<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("summary", &self.writer.summary()).finish_non_exhaustive()
    }
}

impl<W: Write> Recorder<W> {
    pub fn new(writer: Writer<W>) -> Recorder<W> {
        Recorder {
            writer,
            names: HashMap::new(),
            rank_key: None,
            descriptors: HashMap::new(),
            lost: HashMap::new(),
            models: Vec::new(),
            buffer: Vec::new(),
            keep: None,
            last_drain: Instant::now(),
            last_flush: Instant::now(),
        }
    }

    /// Records only the events `keep` accepts from now on.
    pub fn keep_only(&mut self, keep: impl Fn(&TraceEvent) -> bool + Send + 'static) {
        self.keep = Some(Box::new(keep));
    }

    /// Records the models of `models` not recorded yet; `sha256` gives a NEFF's hash
    /// when the recorder's caller has the file.
    pub fn models(&mut self, models: &[ModelInfo], sha256: &dyn Fn(&ModelInfo) -> String) -> Result<()> {
        let new: Vec<ntff::Model> = models
            .iter()
            .filter(|m| !self.models.contains(&m.model_id))
            .map(|m| ntff::Model {
                model_id: m.model_id,
                core: m.core,
                name: m.name.clone(),
                uuid: m.uuid.as_bytes().to_vec(),
                neff_sha256: sha256(m),
                flops_per_execution: m.flops_per_execution,
                instructions: m.instructions,
            })
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        self.models.extend(new.iter().map(|m| m.model_id));
        self.writer.models(&new)?;
        Ok(())
    }

    /// Reads what `tail` has not read yet from `reader`'s rings (everything, with
    /// `writer_done`) and records it, losses first; returns the events recorded.
    pub fn drain(&mut self, reader: &DatastoreReader, tail: &mut Tail, writer_done: bool) -> Result<u64> {
        self.last_drain = Instant::now();
        let mut recorded = 0;
        loop {
            let mut events = std::mem::take(&mut self.buffer);
            events.clear();
            tail.poll(reader, POLL_RECORDS, writer_done, &mut events);
            self.record_losses(tail)?;
            for event in &events {
                if self.keep.as_ref().is_none_or(|keep| keep(event)) {
                    self.event(event)?;
                }
            }
            recorded += events.len() as u64;
            let more = events.len() >= POLL_RECORDS;
            self.buffer = events;
            if !more {
                return Ok(recorded);
            }
        }
    }

    /// Writes a loss marker for every ring whose lost count grew.
    fn record_losses(&mut self, tail: &Tail) -> Result<()> {
        for (core, device, cursor) in tail.cursors() {
            let seen = self.lost.entry((core, device)).or_insert(0);
            if cursor.lost > *seen {
                self.writer.loss(core, device, cursor.lost - *seen)?;
                *seen = cursor.lost;
            }
        }
        Ok(())
    }

    /// Records one event.
    pub fn event(&mut self, event: &TraceEvent) -> Result<()> {
        match event {
            TraceEvent::System(e) => self.system(e),
            TraceEvent::Device(e) => self.device(e),
        }
    }

    fn system(&mut self, e: &SystemEvent) -> Result<()> {
        let name = match self.names.get(&e.event_type) {
            Some(&sym) => sym,
            None => {
                let sym = self.writer.intern(e.event_type.name());
                self.names.insert(e.event_type, sym);
                sym
            }
        };
        let mut args = self.args(&e.data);
        if let Some(rank) = e.rank {
            // The core's rank, unless the event names a rank of its own (`cc_running`).
            let key = *self.rank_key.get_or_insert_with(|| self.writer.intern(RANK_ARG));
            if args.iter().all(|a| a.key != key) {
                args.push(Arg { key, value: ArgValue::U64(u64::from(rank)) });
            }
        }
        if let (EventData::SyncPoint { cpu_timestamp_ns, nc_timestamp_ns }, Some(core)) = (&e.data, e.nc_idx) {
            self.writer.sync_point(core, SyncPoint { host_ns: *cpu_timestamp_ns, device_ns: *nc_timestamp_ns })?;
        }
        self.writer.system(&ntff::SystemEvent {
            core: e.nc_idx,
            id: e.id,
            name,
            phase: match e.phase {
                Phase::Start => ntff::Phase::Start,
                Phase::Stop => ntff::Phase::Stop,
                Phase::Instant => ntff::Phase::Instant,
            },
            clock: match e.clock {
                ClockDomain::Host => ntff::Clock::Host,
                ClockDomain::Device => ntff::Clock::Device,
            },
            timestamp_ns: e.timestamp_ns,
            tracking_id: e.tracking_id,
            thread_id: e.thread_id,
            exec_id: e.exec_id,
            model_id: e.model_id,
            nrta_seq_id: e.nrta_seq_id,
            args,
        })?;
        Ok(())
    }

    /// The event's payload as NTFF arguments: one per field of its declaration, keyed
    /// by the field's name.
    fn args(&mut self, data: &EventData) -> Vec<Arg> {
        let w = &mut self.writer;
        let mut args = Vec::with_capacity(6);
        data.for_each_field(|key, value| {
            let value = match value {
                FieldValue::U64(v) => ArgValue::U64(v),
                FieldValue::I64(v) => ArgValue::I64(v),
                FieldValue::Str(s) => ArgValue::Str(w.intern(s)),
            };
            args.push(Arg { key: w.intern(key), value });
        });
        args
    }

    fn device(&mut self, e: &DeviceEvent) -> Result<()> {
        let key = match &e.activity {
            DeviceActivity::Instruction { engine, step, .. } => (e.model_id, 0, *engine as u8, *step),
            DeviceActivity::Dma { queue, index, .. } => (e.model_id, 1, *queue as u8, *index),
        };
        let descriptor = match self.descriptors.get(&key) {
            Some((activity, id)) if *activity == e.activity => *id,
            _ => {
                let descriptor = self.descriptor_of(e.model_id, &e.activity);
                let id = self.writer.descriptor(&descriptor);
                self.descriptors.insert(key, (e.activity.clone(), id));
                id
            }
        };
        self.writer.device(&ntff::DeviceEvent {
            core: e.nc_idx,
            id: e.id,
            exec_id: e.exec_id,
            start_ns: e.start_ns,
            end_ns: e.end_ns,
            descriptor,
        })?;
        Ok(())
    }

    fn descriptor_of(&mut self, model_id: u32, activity: &DeviceActivity) -> Descriptor {
        match activity {
            DeviceActivity::Instruction { engine, opcode, hlo, step, flops, bytes_read, bytes_written } => {
                Descriptor::Instruction {
                    model_id,
                    engine: self.writer.intern(engine.name()),
                    opcode: self.writer.intern(opcode),
                    hlo: self.writer.intern(hlo),
                    step: *step,
                    flops: *flops,
                    bytes_read: *bytes_read,
                    bytes_written: *bytes_written,
                }
            }
            DeviceActivity::Dma { queue, index, bytes } => {
                Descriptor::Dma { model_id, queue: self.writer.intern(queue.name()), index: *index, bytes: *bytes }
            }
        }
    }

    /// Writes what is buffered, so the file holds everything recorded so far.
    pub fn flush(&mut self) -> Result<()> {
        self.last_flush = Instant::now();
        Ok(self.writer.flush()?)
    }

    /// Drains the rings of a process that is still running when [`DRAIN_INTERVAL`] has
    /// passed since the last drain, and flushes when due.
    pub fn drain_when_due(&mut self, reader: &DatastoreReader, tail: &mut Tail) -> Result<()> {
        if self.last_drain.elapsed() < DRAIN_INTERVAL {
            return Ok(());
        }
        self.drain(reader, tail, false)?;
        self.flush_when_due()
    }

    /// Flushes when [`FLUSH_INTERVAL`] has passed since the last flush.
    pub fn flush_when_due(&mut self) -> Result<()> {
        if self.last_flush.elapsed() < FLUSH_INTERVAL {
            return Ok(());
        }
        self.flush()
    }

    /// What has been recorded so far.
    pub fn summary(&self) -> ntff::WriteSummary {
        self.writer.summary()
    }

    /// Finishes the file.
    /// Records the traced runtime's communicators, as its flight record has them now
    /// (nothing for a runtime of none).
    pub fn communicators(&mut self, communicators: &[neuron_datastore::CommunicatorRecord]) -> Result<()> {
        if communicators.is_empty() {
            return Ok(());
        }
        let records: Vec<ntff::Communicator> = communicators
            .iter()
            .map(|c| ntff::Communicator {
                id: c.id,
                name: c.name.clone(),
                ranks: c.ranks,
                across_processes: c.across,
                members: c
                    .members
                    .iter()
                    .map(|m| ntff::CommunicatorMember {
                        rank: m.rank,
                        pid: m.pid,
                        host: m.host.clone(),
                        core: m.core,
                        in_this_process: m.in_this_process,
                    })
                    .collect(),
            })
            .collect();
        Ok(self.writer.communicators(&records)?)
    }

    pub fn finish(self) -> Result<(W, ntff::WriteSummary)> {
        Ok(self.writer.finish()?)
    }
}

/// The file metadata for a trace of the runtime `info` describes, made by `tool` (its
/// name and version) as a capture of kind `capture_kind`.
pub fn metadata(info: &RuntimeInfo, tool: &str, capture_kind: &str, command: &[String]) -> ntff::Metadata {
    let realtime = neuron_datastore::clock::realtime_ns();
    let monotonic = neuron_datastore::clock::monotonic_ns();
    // The traced runtime runs on this host: its cores' peaks follow from this CPU and
    // the threads the runtime computes on (unknown for files of older runtimes).
    let peaks = (info.host_threads > 0)
        .then(neuron_datastore::peaks::HostVector::detect)
        .flatten()
        .map(|host| host.peaks(info.host_threads, info.product_kernel));
    ntff::Metadata {
        runtime_version: info.runtime_version.clone(),
        tool: format!("{tool} {capture_kind}"),
        capture_unix_ns: realtime,
        instance_type: info.instance_type.clone(),
        topology: Some(ntff::Topology {
            device_count: info.device_count,
            cores_per_device: info.cores_per_device,
            device_memory_bytes: info.device_memory_bytes,
            cores: info.cores.clone(),
        }),
        pid: info.pid,
        process_tag: info.tag.clone().unwrap_or_default(),
        clock: Some(ntff::ClockCalibration { realtime_minus_monotonic_ns: realtime as i64 - monotonic as i64 }),
        capture_kind: capture_kind.to_string(),
        peak_flops_per_core: 0.0,
        peak_flops_method: String::new(),
        command: command.to_vec(),
        defined_pe_flops_per_core: peaks.as_ref().map_or(0.0, |p| p.pe_flops),
        defined_vector_flops_per_core: peaks.as_ref().map_or(0.0, |p| p.vector_flops),
        defined_peak_basis: peaks.map(|p| p.basis).unwrap_or_default(),
        warmup_executions: 0,
        peak_memory_bytes_per_s: neuron_datastore::peaks::memory_bandwidth(),
        peak_memory_method: neuron_datastore::peaks::MEMORY_BANDWIDTH_METHOD.into(),
        host: host_name(),
        program: info.command.name.clone(),
        bf16_products_faster: match info.product_kernel {
            neuron_datastore::peaks::ProductKernel::Bf16 | neuron_datastore::peaks::ProductKernel::Amx => Some(true),
            neuron_datastore::peaks::ProductKernel::F32 => Some(false),
            neuron_datastore::peaks::ProductKernel::NotRecorded => None,
        },
    }
}

/// This host's name, as the kernel has it; empty when it cannot be read.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The runtime's typed event for an NTFF system event (`None` when its name or
/// arguments are not the runtime's). Its core's rank is its `rank` argument: for an
/// event naming a rank of its own (`cc_running`), that rank.
pub fn to_system_event(file: &ntff::NtffFile, e: &ntff::SystemEvent) -> Option<SystemEvent> {
    let event_type = EventType::from_name(file.string(e.name)?)?;
    let data = EventData::from_fields(event_type, &mut |key| {
        let arg = e.args.iter().find(|a| file.string(a.key) == Some(key))?;
        Some(match arg.value {
            ArgValue::U64(v) => FieldValue::U64(v),
            ArgValue::I64(v) => FieldValue::I64(v),
            ArgValue::Str(sym) => FieldValue::Str(file.string(sym)?),
        })
    })?;
    let rank = e.args.iter().find(|a| file.string(a.key) == Some(RANK_ARG)).and_then(|a| match a.value {
        ArgValue::U64(v) => u32::try_from(v).ok(),
        _ => None,
    });
    Some(SystemEvent {
        event_type,
        phase: match e.phase {
            ntff::Phase::Start => Phase::Start,
            ntff::Phase::Stop => Phase::Stop,
            ntff::Phase::Instant => Phase::Instant,
        },
        id: e.id,
        nc_idx: e.core,
        tracking_id: e.tracking_id,
        thread_id: e.thread_id,
        timestamp_ns: e.timestamp_ns,
        clock: match e.clock {
            ntff::Clock::Host => ClockDomain::Host,
            ntff::Clock::Device => ClockDomain::Device,
        },
        exec_id: e.exec_id,
        model_id: e.model_id,
        nrta_seq_id: e.nrta_seq_id,
        rank,
        data,
    })
}

/// The runtime's typed event for an NTFF device event (`None` when its descriptor was
/// lost or names an unknown engine or queue).
pub fn to_device_event(file: &ntff::NtffFile, e: &ntff::DeviceEvent) -> Option<DeviceEvent> {
    let descriptor = file.descriptor(e.descriptor)?;
    let activity = match *descriptor {
        Descriptor::Instruction { engine, opcode, hlo, step, flops, bytes_read, bytes_written, .. } => {
            let engine_name = file.string(engine)?;
            DeviceActivity::Instruction {
                engine: Engine::ALL.iter().copied().find(|x| x.name() == engine_name)?,
                opcode: file.string(opcode)?.to_owned(),
                hlo: file.string(hlo)?.to_owned(),
                step,
                flops,
                bytes_read,
                bytes_written,
            }
        }
        Descriptor::Dma { queue, index, bytes, .. } => {
            let queue_name = file.string(queue)?;
            DeviceActivity::Dma {
                queue: DmaQueueType::ALL.iter().copied().find(|q| q.name() == queue_name)?,
                index,
                bytes,
            }
        }
    };
    Some(DeviceEvent {
        id: e.id,
        nc_idx: e.core,
        exec_id: e.exec_id,
        model_id: descriptor.model_id(),
        start_ns: e.start_ns,
        end_ns: e.end_ns,
        activity,
    })
}

/// Starts a new trace that will replace `path` when finished (written aside until then:
/// see [`ntff::ProfileFile`]), with a clear error when the directory is missing.
pub fn create_writer(path: &std::path::Path, metadata: &ntff::Metadata) -> Result<Writer<ntff::ProfileFile>> {
    Writer::create(path, metadata).map_err(|source| RecordError::Create { path: path.to_owned(), source })
}
