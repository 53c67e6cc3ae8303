//! The runtime: init, load, tensors, synchronous execution, unload, close.
//!
//! A [`Runtime`] follows the Neuron runtime's lifecycle: created uninitialised,
//! [`Runtime::init`] reserves its NeuronCores (exclusively, host-wide) and starts the
//! host compute slots, and [`Runtime::close`] releases them. Calls before `init` fail
//! with `NRT_UNINITIALIZED` and calls after `close` with `NRT_CLOSED`, including calls
//! through tensor and model handles that outlive the runtime.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::backend::{Destination, Executable, Input, Output, RunError, Value, ValueRef};
use crate::collectives::{self, Algorithm, CollectiveCall, Communicator, OpPosition, Request};
use crate::config::{Config, MAX_EXEC_TIMEOUT, NumericalErrorsVerbosity};
use crate::dtype::{ArrayType, DType};
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::fault::{Degraded, FaultKind, Faults, Strike};
use crate::isa::{BufferKind, CollectiveKind, CollectiveOp, DmaQueueKind, IoTensor, Op, Program, format_groups};
use crate::lifecycle::{Lifecycle, Stage};
use crate::memory::{Charge, DeviceUsage, HostUsage, MemoryCharge, MemoryLedger, MemoryMirror};
use crate::neff::{DecodeOptions, Neff};
use crate::nrta::{self, CompletionHandle, ErrorTracker, PendingRead, SeqId, Unit, Xu};
use crate::pool::HostPool;
use crate::reservation::CoreReservation;
use crate::tensor::{ExecutionLocks, Tensor, TensorPlacement, TensorSet, TensorTracing};
use crate::trace::classify;
#[cfg(feature = "trace-probe")]
use crate::trace::{ProbeProgram, TraceProbe};
use neuron_datastore::clock::{self, DeviceClock, ticks};
use neuron_datastore::counters::{core as counter, model as model_field};
use neuron_datastore::event::{DmaQueueType, EventType, Phase};
use neuron_datastore::record::{DEVICE_KIND_DMA, DeviceRecord, FLAG_DEVICE_CLOCK, FLAG_STATUS};
use neuron_datastore::topology::{CoreSet, Topology};
use neuron_datastore::{
    CreateParams, DEFAULT_INSTRUCTION_TABLE_BYTES, DEFAULT_MODEL_SLOTS, DEFAULT_STRING_TABLE_BYTES, DatastoreError,
    DatastoreWriter, DeviceCategory, EccCounter, ErrorClass, EventIds, ExecOutcome, HostCategory, INSTRUCTION_BYTES,
    InstructionTrace, ModelEntry, RingPos, SysTraceConfig, SysTraceFetch, TraceSession, Tracer,
};

/// How often the runtime marks its datastore alive.
pub(crate) const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(250);

/// Device memory the runtime keeps per DMA descriptor of a loaded model.
pub(crate) const DMA_DESCRIPTOR_BYTES: u64 = 64;

/// A Neuron runtime instance driving virtual NeuronCores.
#[derive(Debug, Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: Config,
    topology: Topology,
    lifecycle: Arc<Lifecycle>,
    ledger: Arc<MemoryLedger>,
    running: Mutex<Option<Running>>,
    models: Mutex<HashMap<u32, Arc<LoadedModel>>>,
    next_model_id: AtomicU32,
}

#[derive(Debug)]
struct Running {
    reservation: CoreReservation,
    pool: Arc<HostPool>,
    /// One lock per reserved core: a core executes one thing at a time.
    core_locks: Arc<HashMap<u32, Mutex<()>>>,
    tracer: Arc<Tracer>,
    /// The `nrt_sys_trace_*` session over the tracer's rings.
    trace_session: TraceSession,
    /// Injected faults, and the cores they have degraded.
    faults: Arc<Faults>,
    /// The execution units started so far, by unit id.
    units: Mutex<HashMap<u16, Arc<Unit>>>,
    /// Dropping it stops the heartbeat thread.
    _heartbeat: crossbeam_channel::Sender<()>,
    #[cfg(feature = "trace-probe")]
    probe_program: Arc<ProbeProgram>,
}

impl Running {
    fn shut_down_units(&self) {
        let units: Vec<Arc<Unit>> = lock(&self.units).drain().map(|(_, u)| u).collect();
        units.iter().for_each(|u| u.shut_down());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shut_down_units();
    }
}

/// A model loaded on a NeuronCore.
#[derive(Debug, Clone)]
pub struct Model {
    inner: Arc<LoadedModel>,
}

#[derive(Debug)]
struct LoadedModel {
    id: u32,
    name: String,
    uuid: Uuid,
    core: u32,
    executable: Executable,
    flops_per_execution: u64,
    /// Released at unload (or close), even while handles to the model remain.
    charges: Mutex<Vec<MemoryCharge>>,
    /// The core's position among the held cores (its counters and rings).
    slot: usize,
    ring: RingPos,
    name_id: u32,
    /// The model's slot in the datastore's models table, if it got one.
    table_slot: Option<u32>,
    /// What each instruction's device event says, in execution order.
    instructions: Vec<InstructionTrace>,
    /// The instructions are in the datastore's instruction table, so device events
    /// can be recorded as runs.
    instructions_in_table: bool,
    input_bytes: u64,
    output_bytes: u64,
    /// For a program with collectives: its communicator and rank.
    rank: Option<(Communicator, u32)>,
    /// The program's collective instructions.
    collectives: u32,
}

/// What one execution did.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionReport {
    /// From the call to its return, queueing included.
    pub total_latency: Duration,
    /// The program's run on the core, from first input DMA to last output DMA.
    pub device_latency: Duration,
    /// NaN or infinite values written to outputs.
    pub numerical_errors: u64,
    pub flops: u64,
}

impl Runtime {
    /// Creates an uninitialised runtime.
    pub fn new(config: Config) -> Runtime {
        let topology = config.instance_type.topology();
        Runtime {
            shared: Arc::new(Shared {
                ledger: MemoryLedger::new(&topology),
                topology,
                config,
                lifecycle: Arc::new(Lifecycle::default()),
                running: Mutex::new(None),
                models: Mutex::new(HashMap::new()),
                next_model_id: AtomicU32::new(1),
            }),
        }
    }

    /// Creates and initialises a runtime.
    pub fn start(config: Config) -> NrtResult<Runtime> {
        let runtime = Runtime::new(config);
        runtime.init()?;
        Ok(runtime)
    }

    /// Reserves the configured NeuronCores and sets up the host compute slots.
    pub fn init(&self) -> NrtResult<()> {
        let shared = &self.shared;
        let mut running = lock(&shared.running);
        match shared.lifecycle.stage() {
            Stage::Running => return Err(NrtError::invalid("the runtime is already initialised")),
            Stage::Closed => {
                return Err(NrtError::new(NrtStatus::Closed, "the runtime has been closed; create a new one"));
            }
            _ => {}
        }
        let reservation = CoreReservation::acquire(&shared.config.lock_dir, &shared.topology, &shared.config.cores)?;
        // Each core runs one execution at a time, so at most `cores` slots hold jobs;
        // the others are lent to large matrix products.
        let pool = HostPool::new(shared.config.host_threads.max(1));
        tracing::info!(
            instance = %shared.topology.instance_type,
            cores = %reservation.cores(),
            host_threads = pool.threads(),
            "runtime initialised"
        );
        let tracer = Arc::new(self.create_tracer(reservation.cores().cores())?);
        let mirror = Arc::clone(&tracer);
        shared.ledger.set_mirror(MemoryMirror(Box::new(move |charge, bytes, add| match charge {
            Charge::Host(category) => mirror.store().add_host_memory(category, bytes, add),
            Charge::Device { core, category } => mirror.store().add_device_memory(core, category, bytes, add),
        })));
        let heartbeat = start_heartbeat(Arc::clone(&tracer))?;
        tracing::info!(datastore = %tracer.store().path().display(), "datastore created");
        let core_locks = reservation.cores().cores().iter().map(|&c| (c, Mutex::new(()))).collect();
        *running = Some(Running {
            reservation,
            pool: Arc::new(pool),
            core_locks: Arc::new(core_locks),
            tracer,
            faults: Arc::new(Faults::new(shared.config.faults.clone())),
            units: Mutex::new(HashMap::new()),
            trace_session: TraceSession::default(),
            _heartbeat: heartbeat,
            #[cfg(feature = "trace-probe")]
            probe_program: Arc::default(),
        });
        shared.lifecycle.set(Stage::Running);
        Ok(())
    }

    /// Creates the datastore for the held `cores` and the tracer writing into it.
    fn create_tracer(&self, cores: &[u32]) -> NrtResult<Tracer> {
        let config = &self.shared.config;
        let topology = &self.shared.topology;
        let (calibration, ns_per_tick) = clock::measure(Duration::from_millis(2));
        let device_clocks: Vec<DeviceClock> =
            cores.iter().map(|&c| DeviceClock::for_core(c, calibration.ticks, ns_per_tick)).collect();
        let params = CreateParams {
            dir: config.datastore_dir.clone(),
            tag: config.process_tag.clone(),
            instance_type: topology.instance_type.to_string(),
            device_count: topology.device_count,
            cores_per_device: topology.cores_per_device(),
            device_memory_bytes: topology.device_memory_bytes,
            instance_core_count: topology.core_count(),
            cores: cores.to_vec(),
            ring_capacity: config.inspect.max_events_per_nc.next_power_of_two(),
            model_slots: DEFAULT_MODEL_SLOTS,
            string_table_bytes: DEFAULT_STRING_TABLE_BYTES,
            instruction_table_bytes: DEFAULT_INSTRUCTION_TABLE_BYTES,
            tick_source: clock::tick_source(),
            calibration,
            ns_per_tick,
            device_clocks: device_clocks.clone(),
            recording: 0,
        };
        let store = DatastoreWriter::create(&params).map_err(|e| datastore_error(&e))?;
        Ok(Tracer::new(store, &config.inspect, cores, device_clocks, ns_per_tick))
    }

    /// Unloads every model, stops the host threads and releases the NeuronCores.
    pub fn close(&self) -> NrtResult<()> {
        self.shared.lifecycle.check()?;
        let mut running = lock(&self.shared.running);
        self.shared.lifecycle.set(Stage::Closed);
        for (_, model) in lock(&self.shared.models).drain() {
            lock(&model.charges).clear();
        }
        if let Some(r) = running.as_ref() {
            // Queued requests fail with NRT_CLOSED; the workers finish them and stop.
            r.shut_down_units();
            r.tracer.store().close();
        }
        *running = None;
        tracing::info!("runtime closed");
        Ok(())
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    pub fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// The NeuronCores this runtime holds.
    pub fn cores(&self) -> NrtResult<CoreSet> {
        self.shared.lifecycle.check()?;
        Ok(lock(&self.shared.running).as_ref().map(|r| r.reservation.cores().clone()).unwrap_or_default())
    }

    pub fn device_memory_usage(&self, core: u32) -> DeviceUsage {
        self.shared.ledger.device_usage(core)
    }

    pub fn host_memory_usage(&self) -> HostUsage {
        self.shared.ledger.host_usage()
    }

    /// The datastore file tools read this runtime from.
    pub fn datastore_path(&self) -> NrtResult<PathBuf> {
        Ok(self.tracer()?.store().path().to_owned())
    }

    /// Starts a system trace session (`nrt_sys_trace_start` with its configuration).
    pub fn sys_trace_start(&self, config: &SysTraceConfig) -> NrtResult<()> {
        self.with_running(|r| r.trace_session.start(&r.tracer, config))?.map_err(|e| NrtError::invalid(e.to_string()))
    }

    /// Stops the session; what it recorded can still be fetched.
    pub fn sys_trace_stop(&self) -> NrtResult<()> {
        self.with_running(|r| r.trace_session.stop(&r.tracer))?.map_err(|e| NrtError::invalid(e.to_string()))
    }

    /// Returns the session's events not fetched before (`nrt_sys_trace_fetch_events`).
    pub fn sys_trace_fetch_events(&self) -> NrtResult<SysTraceFetch> {
        self.with_running(|r| r.trace_session.fetch(&r.tracer))?.map_err(|e| NrtError::invalid(e.to_string()))
    }

    /// Switches every trace ring on or off at once, overriding the
    /// `NEURON_RT_INSPECT_*` configuration (used to measure tracing overhead).
    pub fn set_trace_recording(&self, on: bool) -> NrtResult<()> {
        self.set_trace_recording_of(on, on)
    }

    /// Switches the system trace rings and the device trace rings on or off
    /// separately, overriding the `NEURON_RT_INSPECT_*` configuration (a profiler
    /// records the device trace of chosen executions only).
    pub fn set_trace_recording_of(&self, system: bool, device: bool) -> NrtResult<()> {
        self.tracer()?.set_recording(system, device);
        Ok(())
    }

    /// Records events on `core` through the runtime's own emit path, with no program
    /// around them: for the trace benchmarks and ring stress tests.
    #[cfg(feature = "trace-probe")]
    pub fn trace_probe(&self, core: u32) -> NrtResult<TraceProbe> {
        self.with_running(|r| {
            TraceProbe::new(Arc::clone(&r.tracer), Arc::clone(&r.probe_program), Arc::clone(&r.core_locks), core)
        })?
        .ok_or_else(|| NrtError::invalid(format!("nc{core} is not held by this runtime")))
    }

    fn tracer(&self) -> NrtResult<Arc<Tracer>> {
        self.with_running(|r| Arc::clone(&r.tracer))
    }

    /// Applies `f` to the state of an initialised, not yet closed runtime.
    fn with_running<T>(&self, f: impl FnOnce(&Running) -> T) -> NrtResult<T> {
        self.shared.lifecycle.check()?;
        lock(&self.shared.running)
            .as_ref()
            .map(f)
            .ok_or_else(|| NrtError::new(NrtStatus::Closed, "the runtime has been closed"))
    }

    /// Loads a NEFF onto `core`, or onto the held core with the fewest models. A program
    /// with collectives runs as a single rank; see [`Runtime::load_collectives`].
    pub fn load(&self, neff_bytes: &[u8], core: Option<u32>) -> NrtResult<Model> {
        self.load_rank(neff_bytes, core, None)
    }

    /// Loads a NEFF once per core of `cores`, as ranks `0..cores.len()` of one
    /// communicator (`nrt_load_collectives`): the program's collectives (HLO
    /// `all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all`) exchange data between
    /// the ranks. Every rank is executed like any model, each from its own thread or
    /// execution unit; a rank's collective waits for the other ranks of its replica
    /// group, up to `NEURON_RT_EXEC_TIMEOUT`. The replica groups must split the ranks.
    pub fn load_collectives(&self, neff_bytes: &[u8], cores: &[u32]) -> NrtResult<Vec<Model>> {
        self.shared.lifecycle.check()?;
        let name = Neff::decode(neff_bytes, DecodeOptions { validate_hash: false })?.name;
        let communicator = self.communicator_named(Some(&name), cores)?;
        let mut models = Vec::with_capacity(cores.len());
        for (rank, &core) in cores.iter().enumerate() {
            match self.load_rank(neff_bytes, Some(core), Some((communicator.clone(), rank as u32))) {
                Ok(model) => models.push(model),
                Err(error) => {
                    for model in &models {
                        let _ = self.unload(model);
                    }
                    return Err(error);
                }
            }
        }
        Ok(models)
    }

    /// A communicator whose ranks `0..cores.len()` run on `cores`, for collectives called
    /// through [`Communicator::run`] or [`Runtime::collective_schedule`].
    pub fn communicator(&self, cores: &[u32]) -> NrtResult<Communicator> {
        self.communicator_named(None, cores)
    }

    fn communicator_named(&self, name: Option<&str>, cores: &[u32]) -> NrtResult<Communicator> {
        self.shared.lifecycle.check()?;
        for &core in cores {
            self.check_held(core)?;
        }
        Communicator::new(
            name,
            cores,
            &self.shared.topology,
            self.tracer()?,
            Arc::clone(&self.shared.lifecycle),
            self.shared.config.exec_timeout.min(MAX_EXEC_TIMEOUT),
        )
    }

    fn load_rank(&self, neff_bytes: &[u8], core: Option<u32>, rank: Option<(Communicator, u32)>) -> NrtResult<Model> {
        let called = ticks();
        self.shared.lifecycle.check()?;
        let tracer = self.tracer()?;
        let neff = Neff::decode(neff_bytes, DecodeOptions { validate_hash: self.shared.config.validate_hash })?;
        let program = &neff.program;
        if program.target != self.shared.topology.core_version {
            return Err(NrtError::invalid(format!(
                "NEFF `{}` was compiled for NeuronCore-{} but {} has NeuronCore-{}; recompile with a matching --target",
                neff.name, program.target, self.shared.topology.instance_type, self.shared.topology.core_version
            )));
        }
        let core = self.pick_core(core)?;
        let ranks = rank.as_ref().map_or(1, |(c, _)| c.ranks());
        check_collectives(program, &neff.name, ranks)?;
        let rank = match rank {
            Some(rank) => Some(rank),
            None if program.instructions().any(|i| matches!(i.op, Op::Collective(_))) => {
                Some((self.communicator_named(Some(&neff.name), &[core])?, 0))
            }
            None => None,
        };
        let slot = tracer.store().core_slot(core).ok_or_else(|| NrtError::invalid(format!("nc{core} is not held")))?;
        let ring = tracer.ring_of(Some(core));
        let id = self.shared.next_model_id.fetch_add(1, Ordering::Relaxed);
        let name_id = tracer.store().intern(&neff.name);
        let ids = EventIds { model_id: id, ..EventIds::default() };
        let tracking_id = if tracer.enabled(ring, EventType::NrtLoad) {
            let tracking_id = tracer.tracking_id();
            tracer.emit_at(called, ring, EventType::NrtLoad, Phase::Start, tracking_id, ids, name_id, [0; 4], 0);
            tracking_id
        } else {
            0
        };
        let loaded = self.load_on(&tracer, neff, neff_bytes.len() as u64, core, slot, ring, id, name_id, rank);
        tracer.stop(
            ring,
            EventType::NrtLoad,
            tracking_id,
            ids,
            name_id,
            loaded.as_ref().err().map(|e| e.status.code()),
        );
        let model = loaded?;
        tracing::info!(model = %model.inner.name, id, core, "model loaded");
        Ok(model)
    }

    #[allow(clippy::too_many_arguments)]
    fn load_on(
        &self,
        tracer: &Tracer,
        neff: Neff,
        neff_len: u64,
        core: u32,
        slot: usize,
        ring: RingPos,
        id: u32,
        name_id: u32,
        rank: Option<(Communicator, u32)>,
    ) -> NrtResult<Model> {
        let program = &neff.program;
        let collectives = program.instructions().filter(|i| matches!(i.op, Op::Collective(_))).count() as u32;
        let charges = self.charge_model(program, neff_len, core)?;
        let size_of = |b: u32| program.buffers[b as usize].ty.size_bytes().unwrap_or(0);
        let input_bytes = program.inputs.iter().map(|io| size_of(io.buffer)).sum();
        let output_bytes = program.outputs.iter().map(|io| size_of(io.buffer)).sum();
        let executable = Executable::new(neff.program, self.shared.config.fusion);
        let program = executable.program();
        let instructions = executable
            .steps()
            .map(|instruction| {
                let operand_types: Vec<&ArrayType> =
                    instruction.operands.iter().map(|&o| &program.buffers[o as usize].ty).collect();
                let output_type = &program.buffers[instruction.output as usize].ty;
                let hlo = program.hlo_names.get(instruction.hlo as usize).map_or("", String::as_str);
                InstructionTrace {
                    engine: instruction.op.engine() as u8,
                    opcode_id: tracer.store().intern(instruction.op.opcode()),
                    hlo_id: tracer.store().intern(hlo),
                    step: instruction.step,
                    flops: instruction.op.flops(&operand_types, output_type),
                    bytes_read: operand_types.iter().map(|t| t.size_bytes().unwrap_or(0)).sum(),
                    bytes_written: output_type.size_bytes().unwrap_or(0),
                }
            })
            .collect::<Vec<_>>();
        let device_memory = |category| {
            charges.iter().filter(|c| c.charge() == (Charge::Device { core, category })).map(|c| c.bytes()).sum()
        };
        let entry = ModelEntry {
            model_id: id,
            core,
            name: neff.name.clone(),
            uuid: neff.uuid,
            loaded_ticks: ticks(),
            flops_per_execution: program.flops_per_execution(),
            instructions: instructions.len() as u64,
            device_memory: std::array::from_fn(|k| device_memory(DeviceCategory::ALL[k])),
            host_memory: charges.iter().filter(|c| matches!(c.charge(), Charge::Host(_))).map(|c| c.bytes()).sum(),
        };
        let instructions_in_table = tracer.store().add_instructions(id, &instructions);
        if !instructions_in_table {
            tracing::warn!(
                model = %neff.name,
                "the datastore's instruction table is full: this model's device events take one record per instruction"
            );
        }
        let table_slot = tracer.store().publish_model(&entry);
        self.emit_weight_transfers(tracer, program, core, slot, id);
        let model = Arc::new(LoadedModel {
            id,
            name: neff.name,
            uuid: neff.uuid,
            core,
            flops_per_execution: entry.flops_per_execution,
            executable,
            charges: Mutex::new(charges),
            slot,
            ring,
            name_id,
            table_slot,
            instructions,
            instructions_in_table,
            input_bytes,
            output_bytes,
            rank,
            collectives,
        });
        {
            // Checked again under the models lock: a concurrent close drains the table
            // after marking the runtime closed, so a model inserted here is never missed.
            let mut models = lock(&self.shared.models);
            if let Err(e) = self.shared.lifecycle.check() {
                if let Some(s) = table_slot {
                    tracer.store().retract_model(s);
                }
                return Err(e);
            }
            models.insert(id, Arc::clone(&model));
        }
        Ok(Model { inner: model })
    }

    /// Weights DMA at load: one device event per constant (viewed in place from the
    /// NEFF, so the transfers take no time), under the core's lock as every device
    /// event is.
    fn emit_weight_transfers(&self, tracer: &Tracer, program: &Program, core: u32, slot: usize, model_id: u32) {
        let weights: u64 = program
            .buffers
            .iter()
            .filter(|b| matches!(b.kind, BufferKind::Constant { .. }))
            .map(|b| b.ty.size_bytes().unwrap_or(0))
            .sum();
        tracer.add(slot, counter::DMA_BYTES + DmaQueueType::Weights as u64, weights);
        if !tracer.device_enabled(slot) {
            return;
        }
        let core_locks = lock(&self.shared.running).as_ref().map(|r| Arc::clone(&r.core_locks));
        let Some(core_locks) = core_locks else { return };
        let _busy = core_locks.get(&core).map(|l| l.lock().unwrap_or_else(|e| e.into_inner()));
        let now = tracer.device_ns(slot, ticks());
        for queue in program.dma_queues.iter().filter(|q| q.kind == DmaQueueKind::Weights) {
            for transfer in &queue.transfers {
                tracer.emit_device(
                    slot,
                    &DeviceRecord {
                        start_ns: now,
                        end_ns: now,
                        model_id,
                        kind: DEVICE_KIND_DMA,
                        unit: DmaQueueType::Weights as u8,
                        opcode_or_index: transfer.index,
                        flops_or_bytes: transfer.bytes,
                        ..DeviceRecord::default()
                    },
                );
            }
        }
    }

    /// Unloads a model; its handle is invalid afterwards.
    pub fn unload(&self, model: &Model) -> NrtResult<()> {
        let tracer = self.tracer()?;
        let m = &model.inner;
        let ids = EventIds { model_id: m.id, ..EventIds::default() };
        let tracking_id = tracer.start(m.ring, EventType::NrtUnload, ids, m.name_id);
        let removed = lock(&self.shared.models).remove(&m.id);
        let result = match removed {
            Some(loaded) => {
                lock(&loaded.charges).clear();
                if let Some(slot) = loaded.table_slot {
                    tracer.store().retract_model(slot);
                }
                tracing::info!(model = %m.name, id = m.id, "model unloaded");
                Ok(())
            }
            None => Err(stale_model(model)),
        };
        tracer.stop(
            m.ring,
            EventType::NrtUnload,
            tracking_id,
            ids,
            m.name_id,
            result.as_ref().err().map(|e| e.status.code()),
        );
        result
    }

    /// Allocates a zero-filled tensor of `size` bytes.
    pub fn allocate_tensor(&self, placement: TensorPlacement, size: u64, name: &str) -> NrtResult<Tensor> {
        self.allocate(placement, size, None, name)
    }

    /// Allocates a zero-filled tensor sized and typed for `ty`; executions check the type.
    pub fn allocate_tensor_for(&self, placement: TensorPlacement, ty: &ArrayType, name: &str) -> NrtResult<Tensor> {
        let size = ty.size_bytes().ok_or_else(|| NrtError::invalid(format!("{ty} is too large to allocate")))?;
        self.allocate(placement, size, Some(ty.clone()), name)
    }

    fn allocate(&self, placement: TensorPlacement, size: u64, ty: Option<ArrayType>, name: &str) -> NrtResult<Tensor> {
        let tracer = self.tracer()?;
        let (charge, core) = match placement {
            TensorPlacement::Host => (Charge::Host(HostCategory::Tensors), None),
            TensorPlacement::Device { core } => {
                self.check_held(core)?;
                (Charge::Device { core, category: DeviceCategory::Tensors }, Some(core))
            }
        };
        let charge = self.shared.ledger.charge(charge, size)?;
        let tracing = TensorTracing { ring: tracer.ring_of(core), name_id: tracer.store().intern(name), tracer };
        Tensor::allocate(name, placement, size, ty, charge, Arc::clone(&self.shared.lifecycle), Some(tracing))
    }

    /// The execution unit `xu` of `core` (started on first use), with the fault state.
    fn unit(&self, core: u32, xu: Xu) -> NrtResult<(Arc<Unit>, Arc<Faults>)> {
        self.check_held(core)?;
        let running = lock(&self.shared.running);
        let running =
            running.as_ref().ok_or_else(|| NrtError::new(NrtStatus::Closed, "the runtime has been closed"))?;
        let id = nrta::unit_id(core, xu);
        let mut units = lock(&running.units);
        let unit = match units.get(&id) {
            Some(unit) => Arc::clone(unit),
            None => {
                let unit = Unit::start(id, self.shared.config.xu_queue)?;
                units.insert(id, Arc::clone(&unit));
                unit
            }
        };
        Ok((unit, Arc::clone(&running.faults)))
    }

    /// Schedules an execution of `model` on its core's compute unit and returns its
    /// sequence id at once (`nrta_execute_schedule`). `NRT_QUEUE_FULL` when
    /// `NEURON_RT_XU_COMPUTE_MAX_QUEUED_REQUESTS` requests are in flight on the unit
    /// (counted as `failed_to_queue`); `NRT_EXEC_UNIT_UNRECOVERABLE` on a degraded core.
    /// A failure of the execution itself goes to `tracker`, if given. The tensors are
    /// read and written when the execution runs.
    pub fn execute_schedule(
        &self,
        model: &Model,
        inputs: &TensorSet,
        outputs: &TensorSet,
        tracker: Option<&ErrorTracker>,
    ) -> NrtResult<SeqId> {
        let called = ticks();
        self.shared.lifecycle.check()?;
        if !lock(&self.shared.models).contains_key(&model.inner.id) {
            return Err(stale_model(model));
        }
        let m = &*model.inner;
        let tracer = self.tracer()?;
        let mut ids = EventIds { model_id: m.id, ..EventIds::default() };
        let tracking_id = if tracer.enabled(m.ring, EventType::NrtaExecuteSchedule) { tracer.tracking_id() } else { 0 };
        let start = |ids: EventIds| {
            if tracking_id != 0 {
                let (event, phase) = (EventType::NrtaExecuteSchedule, Phase::Start);
                tracer.emit_at(called, m.ring, event, phase, tracking_id, ids, 0, [0; 4], 0);
            }
        };
        let (runtime, owned) = (self.clone(), (model.clone(), inputs.clone(), outputs.clone()));
        let work: nrta::Work = Box::new(move |seq| {
            let (model, inputs, outputs) = &owned;
            runtime.execute_as(model, inputs, outputs, seq.0).map(|_| ())
        });
        // The start carries the sequence id, so it is recorded once the id exists and
        // before the worker can record the execution's events.
        let result = self.schedule(m.core, Xu::Compute, tracker, &format!("`{}`", m.name), work, |seq| {
            ids.nrta_seq_id = seq.0;
            start(ids);
        });
        if result.is_err() && ids.nrta_seq_id == 0 {
            start(ids);
        }
        tracer.stop(
            m.ring,
            EventType::NrtaExecuteSchedule,
            tracking_id,
            ids,
            0,
            result.as_ref().err().map(|e| e.status.code()),
        );
        // Counted after the events, as executions are.
        if let Err(error) = &result
            && error.status == NrtStatus::QueueFull
        {
            tracer.add(m.slot, counter::EXECUTIONS + ExecOutcome::FailedToQueue as u64, 1);
            tracer.add(m.slot, counter::ERRORS + ErrorClass::Transient as u64, 1);
        }
        result
    }

    /// Schedules a read of `size` bytes of `tensor` from `offset` on `core`'s tensor-read
    /// unit (`nrta_tensor_read`); the bytes are in the returned [`PendingRead`] once the
    /// request completes. Its `nrt_tensor_read` events carry the sequence id.
    pub fn tensor_read_schedule(
        &self,
        core: u32,
        tensor: &Tensor,
        offset: u64,
        size: u64,
        tracker: Option<&ErrorTracker>,
    ) -> NrtResult<(SeqId, PendingRead)> {
        self.shared.lifecycle.check()?;
        tensor.check_range("read", offset, size)?;
        let len = usize::try_from(size).map_err(|_| NrtError::invalid("a read that large does not fit in memory"))?;
        let pending = PendingRead::default();
        let (tensor_owned, filled) = (tensor.clone(), pending.clone());
        let work: nrta::Work = Box::new(move |seq| {
            let mut bytes = vec![0u8; len];
            tensor_owned.read_as(offset, &mut bytes, seq.0)?;
            *lock(&filled.0) = Some(bytes);
            Ok(())
        });
        let what = format!("a read of tensor `{}`", tensor.name());
        let seq = self.schedule(core, Xu::TensorRead, tracker, &what, work, |_| {})?;
        Ok((seq, pending))
    }

    /// Schedules writing `data` into `tensor` at `offset` on `core`'s tensor-write unit
    /// (`nrta_tensor_write`).
    pub fn tensor_write_schedule(
        &self,
        core: u32,
        tensor: &Tensor,
        offset: u64,
        data: Vec<u8>,
        tracker: Option<&ErrorTracker>,
    ) -> NrtResult<SeqId> {
        self.shared.lifecycle.check()?;
        tensor.check_range("write", offset, data.len() as u64)?;
        let tensor_owned = tensor.clone();
        let work: nrta::Work = Box::new(move |seq| tensor_owned.write_as(offset, &data, seq.0));
        self.schedule(core, Xu::TensorWrite, tracker, &format!("a write of tensor `{}`", tensor.name()), work, |_| {})
    }

    /// Schedules copying `size` bytes from `src` at `src_offset` to `dst` at
    /// `dst_offset` on `core`'s tensor-op unit (`nrta_tensor_copy`).
    #[allow(clippy::too_many_arguments)]
    pub fn tensor_copy_schedule(
        &self,
        core: u32,
        src: &Tensor,
        src_offset: u64,
        dst: &Tensor,
        dst_offset: u64,
        size: u64,
        tracker: Option<&ErrorTracker>,
    ) -> NrtResult<SeqId> {
        self.shared.lifecycle.check()?;
        src.check_range("copy from", src_offset, size)?;
        dst.check_range("copy into", dst_offset, size)?;
        let (src_owned, dst_owned) = (src.clone(), dst.clone());
        let work: nrta::Work =
            Box::new(move |seq| src_owned.copy_to_as(src_offset, &dst_owned, dst_offset, size, seq.0));
        let what = format!("a copy from tensor `{}` to `{}`", src.name(), dst.name());
        self.schedule(core, Xu::TensorOp, tracker, &what, work, |_| {})
    }

    /// Schedules `call` as rank `rank` of `communicator` on the rank core's collectives
    /// unit (`nrta_cc_schedule`); see [`Communicator::run`]. The `cc_running` events of
    /// the request carry its sequence id.
    pub fn collective_schedule(
        &self,
        communicator: &Communicator,
        rank: u32,
        call: CollectiveCall,
        input: Option<&Tensor>,
        output: Option<&Tensor>,
        tracker: Option<&ErrorTracker>,
    ) -> NrtResult<SeqId> {
        self.shared.lifecycle.check()?;
        let core = communicator.core(rank).ok_or_else(|| {
            NrtError::invalid(format!(
                "rank {rank} does not exist: {} has {} ranks",
                communicator.name(),
                communicator.ranks()
            ))
        })?;
        let (communicator_owned, input, output) = (communicator.clone(), input.cloned(), output.cloned());
        let what = format!("{} of rank {rank}", call.op.name());
        let work: nrta::Work =
            Box::new(move |seq| communicator_owned.run_as(rank, &call, input.as_ref(), output.as_ref(), seq.0));
        self.schedule(core, Xu::Collectives, tracker, &what, work, |_| {})
    }

    /// Queues `work` on `core`'s unit `xu`: checks the tracker belongs to the core and
    /// the core is not degraded. `what` names the request in errors.
    fn schedule(
        &self,
        core: u32,
        xu: Xu,
        tracker: Option<&ErrorTracker>,
        what: &str,
        work: nrta::Work,
        scheduled: impl FnOnce(SeqId),
    ) -> NrtResult<SeqId> {
        if let Some(tracker) = tracker
            && tracker.core() != core
        {
            return Err(NrtError::invalid(format!(
                "the error tracker belongs to nc{}, but {what} is scheduled on nc{core}",
                tracker.core()
            )));
        }
        let (unit, faults) = self.unit(core, xu)?;
        if let Some(degraded) = faults.degraded(core) {
            return Err(unit_unrecoverable(core, &degraded));
        }
        unit.schedule(work, tracker.cloned(), scheduled)
    }

    /// Whether request `seq` has completed, successfully or not (`nrta_is_completed`).
    pub fn is_completed(&self, seq: SeqId) -> NrtResult<bool> {
        self.scheduled_unit(seq)?.is_completed(seq)
    }

    /// Waits up to `timeout` for request `seq` to complete (`NRT_TIMEOUT` otherwise).
    pub fn wait_sequence(&self, seq: SeqId, timeout: Duration) -> NrtResult<()> {
        self.scheduled_unit(seq)?.wait(seq, timeout)
    }

    /// The last request of `core`'s unit `xu` that completed (`nrta_get_sequence`).
    pub fn get_sequence(&self, core: u32, xu: Xu) -> NrtResult<Option<SeqId>> {
        Ok(self.unit(core, xu)?.0.last_completed())
    }

    /// A pollable handle that becomes readable whenever a request of `core`'s unit `xu`
    /// completes.
    pub fn completion_handle(&self, core: u32, xu: Xu) -> NrtResult<CompletionHandle> {
        Ok(CompletionHandle(self.unit(core, xu)?.0))
    }

    /// An error tracker for the requests of `core` (`nrta_error_tracker_create`).
    pub fn error_tracker_create(&self, core: u32) -> NrtResult<ErrorTracker> {
        self.shared.lifecycle.check()?;
        self.check_held(core)?;
        Ok(ErrorTracker::new(core))
    }

    fn scheduled_unit(&self, seq: SeqId) -> NrtResult<Arc<Unit>> {
        self.shared.lifecycle.check()?;
        let running = lock(&self.shared.running);
        let running =
            running.as_ref().ok_or_else(|| NrtError::new(NrtStatus::Closed, "the runtime has been closed"))?;
        lock(&running.units).get(&seq.unit()).cloned().ok_or_else(|| {
            NrtError::invalid(format!("sequence id {:#x} names no execution unit of this runtime", seq.0))
        })
    }

    /// Executes `model` synchronously: reads `inputs`, writes `outputs`.
    pub fn execute(&self, model: &Model, inputs: &TensorSet, outputs: &TensorSet) -> NrtResult<ExecutionReport> {
        self.execute_as(model, inputs, outputs, 0)
    }

    /// An execution, as request `nrta_seq_id` of an execution unit when not 0 (its
    /// events carry the id).
    pub(crate) fn execute_as(
        &self,
        model: &Model,
        inputs: &TensorSet,
        outputs: &TensorSet,
        nrta_seq_id: u64,
    ) -> NrtResult<ExecutionReport> {
        let called = ticks();
        self.shared.lifecycle.check()?;
        if !lock(&self.shared.models).contains_key(&model.inner.id) {
            return Err(stale_model(model));
        }
        let (pool, core_locks, tracer, faults) = {
            let running = lock(&self.shared.running);
            let running =
                running.as_ref().ok_or_else(|| NrtError::new(NrtStatus::Closed, "the runtime has been closed"))?;
            (
                Arc::clone(&running.pool),
                Arc::clone(&running.core_locks),
                Arc::clone(&running.tracer),
                Arc::clone(&running.faults),
            )
        };
        let m = &*model.inner;
        let ids = EventIds { exec_id: tracer.next_exec_id(), model_id: m.id, nrta_seq_id };
        let execute_tracking = if tracer.enabled(m.ring, EventType::NrtExecute) {
            let tracking_id = tracer.tracking_id();
            tracer.emit_at(called, m.ring, EventType::NrtExecute, Phase::Start, tracking_id, ids, 0, [0; 4], 0);
            tracking_id
        } else {
            0
        };
        if let Some(slot) = m.table_slot {
            tracer.store().model_counter(slot, model_field::RUNNING).fetch_add(1, Ordering::Relaxed);
        }
        let wait_tracking = tracer.start(m.ring, EventType::KblExecWait, ids, 0);
        let job = CoreJob {
            model: m,
            inputs,
            outputs,
            tracer: &tracer,
            ids,
            timeout: self.shared.config.exec_timeout,
            check_outputs: self.shared.config.numerical_errors != NumericalErrorsVerbosity::None,
            pool: &pool,
            faults: &faults,
            device: self.shared.topology.device_of(m.core),
            collectives_algorithm: self.shared.config.collectives_algorithm,
        };
        // The core first, then a host compute slot: an execution waiting for the core
        // holds no slot, which a rank of a collective on that core may need back.
        let kmgr_tracking = tracer.start(m.ring, EventType::KmgrExecCore, ids, 0);
        let busy = core_locks.get(&m.core).map(|l| l.lock().unwrap_or_else(|e| e.into_inner()));
        let outcome = pool.run(|| {
            job.switch_model();
            job.tracer.stop(job.model.ring, EventType::KmgrExecCore, kmgr_tracking, job.ids, 0, None);
            job.run()
        });
        drop(busy);
        let ran = outcome.unwrap_or_else(|panic| {
            let error = NrtError::new(NrtStatus::Failure, format!("execution failed inside the backend: {}", panic.0));
            tracer.emit(
                m.ring,
                EventType::HwNotify,
                Phase::Instant,
                0,
                ids,
                tracer.store().intern(&error.message),
                [error.status.code() as u64, 0, 0, 0],
                0,
            );
            CoreRun { result: Err(error), device_ticks: None, instructions: 0 }
        });
        let mut result = ran.result.map(|numerical_errors| ExecutionReport {
            total_latency: Duration::ZERO,
            device_latency: tracer_duration(&tracer, ran.device_ticks.unwrap_or(0)),
            numerical_errors,
            flops: m.flops_per_execution,
        });
        if let Ok(report) = &result
            && report.numerical_errors > 0
        {
            tracing::warn!(model = %m.name, numerical_errors = report.numerical_errors, "execution produced NaN or Inf");
            if self.shared.config.numerical_errors == NumericalErrorsVerbosity::Critical {
                result = Err(NrtError::new(
                    NrtStatus::ExecCompletedWithNumErr,
                    format!(
                        "execution of `{}` completed with {} NaN/Inf value(s) in its outputs \
                         (NEURON_RT_NUMERICAL_ERRORS_VERBOSITY=critical)",
                        m.name, report.numerical_errors
                    ),
                ));
            }
        }
        let status = result.as_ref().err().map(|e| e.status.code());
        tracer.stop(m.ring, EventType::KblExecWait, wait_tracking, ids, 0, None);
        let total_ticks = ticks().saturating_sub(called);
        tracer.stop(m.ring, EventType::NrtExecute, execute_tracking, ids, 0, status);
        // Counted after its last event: a reader that sees the counters grow finds the
        // whole execution in the ring (`neuron-profile inspect` on failure relies on it).
        self.count_execution(&tracer, m, &result, ran.device_ticks, ran.instructions, total_ticks);
        let mut report = result?;
        report.total_latency = tracer_duration(&tracer, total_ticks);
        tracing::debug!(model = %m.name, latency_us = report.total_latency.as_micros() as u64, "executed");
        Ok(report)
    }

    /// Adds one execution to the core's and the model's counters.
    fn count_execution(
        &self,
        tracer: &Tracer,
        m: &LoadedModel,
        result: &NrtResult<ExecutionReport>,
        device_ticks: Option<u64>,
        instructions: u64,
        total_ticks: u64,
    ) {
        let numerical_errors = result.as_ref().map_or(0, |r| r.numerical_errors);
        let (outcome, class) = classify(result.as_ref().err().map(|e| e.status), numerical_errors);
        let slot = m.slot;
        tracer.add(slot, counter::EXECUTIONS + outcome as u64, 1);
        if let Some(class) = class {
            tracer.add(slot, counter::ERRORS + class as u64, 1);
        }
        tracer.add(slot, counter::NUMERICAL_ERROR_VALUES, numerical_errors);
        tracer.add(slot, counter::INSTRUCTIONS, instructions);
        if let Some(device_ticks) = device_ticks {
            tracer.add(slot, counter::DMA_BYTES + DmaQueueType::Input as u64, m.input_bytes);
            tracer.add(slot, counter::DMA_BYTES + DmaQueueType::Instructions as u64, instructions * INSTRUCTION_BYTES);
            tracer.store().record_latency(slot, false, tracer.ticks_to_ns(device_ticks));
        }
        if result.is_ok() || outcome == ExecOutcome::CompletedWithNumErr {
            tracer.add(slot, counter::FLOPS, m.flops_per_execution);
            tracer.add(slot, counter::DMA_BYTES + DmaQueueType::Output as u64, m.output_bytes);
        }
        tracer.store().record_latency(slot, true, tracer.ticks_to_ns(total_ticks));
        if let Some(table_slot) = m.table_slot {
            tracer.store().model_counter(table_slot, model_field::EXECUTIONS).fetch_add(1, Ordering::Relaxed);
            tracer.store().model_counter(table_slot, model_field::RUNNING).fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn check_held(&self, core: u32) -> NrtResult<()> {
        let held = self.cores()?;
        if held.contains(core) {
            Ok(())
        } else {
            Err(NrtError::invalid(format!(
                "nc{core} is not one of this process's NeuronCores ({held}); set NEURON_RT_VISIBLE_CORES to include it"
            )))
        }
    }

    fn pick_core(&self, wanted: Option<u32>) -> NrtResult<u32> {
        if let Some(core) = wanted {
            self.check_held(core)?;
            return Ok(core);
        }
        let held = self.cores()?;
        let models = lock(&self.shared.models);
        held.cores()
            .iter()
            .copied()
            .min_by_key(|&c| models.values().filter(|m| m.core == c).count())
            .ok_or_else(|| NrtError::new(NrtStatus::LoadNotEnoughNc, "this runtime holds no NeuronCores"))
    }

    /// Charges a model's memory: constants, code, descriptors and scratchpad on the
    /// device, and the runtime's copy of the program on the host.
    fn charge_model(&self, program: &Program, neff_len: u64, core: u32) -> NrtResult<Vec<MemoryCharge>> {
        let ledger = &self.shared.ledger;
        let device = |category| Charge::Device { core, category };
        let descriptors: u64 = program.dma_queues.iter().map(|q| q.transfers.len() as u64).sum();
        let code_bytes = neff_len.saturating_sub(program.constant_bytes());
        Ok(vec![
            ledger.charge(device(DeviceCategory::Constants), program.constant_bytes())?,
            ledger.charge(device(DeviceCategory::ModelCode), code_bytes)?,
            ledger.charge(device(DeviceCategory::RuntimeMemory), descriptors * DMA_DESCRIPTOR_BYTES)?,
            ledger.charge(device(DeviceCategory::ModelSharedScratchpad), program.scratchpad_bytes)?,
            ledger.charge(Charge::Host(HostCategory::ApplicationMemory), code_bytes)?,
        ])
    }
}

impl Model {
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn uuid(&self) -> Uuid {
        self.inner.uuid
    }

    /// The NeuronCore the model is loaded on.
    pub fn core(&self) -> u32 {
        self.inner.core
    }

    pub fn program(&self) -> &Program {
        self.inner.executable.program()
    }

    pub fn inputs(&self) -> &[IoTensor] {
        &self.program().inputs
    }

    pub fn outputs(&self) -> &[IoTensor] {
        &self.program().outputs
    }

    /// The type of a model input or output buffer.
    pub fn tensor_type(&self, io: &IoTensor) -> &ArrayType {
        &self.program().buffers[io.buffer as usize].ty
    }

    pub fn flops_per_execution(&self) -> u64 {
        self.inner.flops_per_execution
    }

    /// Device memory this model holds, by category (zero once unloaded).
    pub fn device_memory(&self, category: DeviceCategory) -> u64 {
        lock(&self.inner.charges)
            .iter()
            .filter(|c| c.charge() == (Charge::Device { core: self.inner.core, category }))
            .map(MemoryCharge::bytes)
            .sum()
    }

    /// Host memory this model holds, by category (zero once unloaded).
    pub fn host_memory(&self, category: HostCategory) -> u64 {
        lock(&self.inner.charges).iter().filter(|c| c.charge() == Charge::Host(category)).map(MemoryCharge::bytes).sum()
    }
}

/// The error of a request on a degraded core.
fn unit_unrecoverable(core: u32, degraded: &Degraded) -> NrtError {
    NrtError::new(
        NrtStatus::ExecUnitUnrecoverable,
        format!(
            "nc{core}'s execution unit is degraded: execution id {} hit an {} ({}), so nothing more runs on this core until the runtime restarts; other cores are unaffected",
            degraded.exec_id,
            degraded.kind.description(),
            degraded.kind.failure().unwrap_or(NrtStatus::HwError),
        ),
    )
}

fn stale_model(model: &Model) -> NrtError {
    NrtError::new(
        NrtStatus::InvalidHandle,
        format!(
            "model {} (`{}`) is not loaded; it was unloaded or its runtime closed",
            model.inner.id, model.inner.name
        ),
    )
}

/// Checks at load that a program's collectives fit `ranks` ranks: their replica groups
/// split the ranks, and a gather, scatter or exchange over every rank divides its
/// dimension by the number of ranks.
fn check_collectives(program: &Program, name: &str, ranks: usize) -> NrtResult<()> {
    for instruction in program.instructions() {
        let Op::Collective(op) = &instruction.op else { continue };
        let hlo = program.hlo_names.get(instruction.hlo as usize).map_or("", String::as_str);
        let needed = op.groups.iter().flatten().map(|&r| r as usize + 1).max().unwrap_or(1);
        let operand = &program.buffers[instruction.operands[0] as usize].ty;
        let output = &program.buffers[instruction.output as usize].ty;
        let factor = match op.kind {
            CollectiveKind::AllGather { dim } => output.dims[dim as usize] / operand.dims[dim as usize].max(1),
            CollectiveKind::ReduceScatter { dim, .. } => operand.dims[dim as usize] / output.dims[dim as usize].max(1),
            _ => 1,
        };
        let hint = |need: usize| {
            format!(
                "; load it on {need} cores as {need} ranks (Runtime::load_collectives, or neuron-bench exec --cores 0-{})",
                need.saturating_sub(1)
            )
        };
        if let Err(error) = collectives::check_groups(&op.groups, ranks) {
            let hint = if needed > ranks { hint(needed) } else { String::new() };
            return Err(NrtError::invalid(format!(
                "`{name}` is loaded as {ranks} rank(s), but its {} (HLO `{hlo}`) with replica_groups={}: {}{hint}",
                op.kind.name(),
                format_groups(&op.groups),
                error.message
            )));
        }
        let gathers = matches!(op.kind, CollectiveKind::AllGather { .. } | CollectiveKind::ReduceScatter { .. });
        if gathers && op.groups.is_empty() && factor as usize != ranks {
            return Err(NrtError::invalid(format!(
                "`{name}` is loaded as {ranks} rank(s), but its {} (HLO `{hlo}`) of {operand} into {output} is over {factor} ranks{}",
                op.kind.name(),
                hint(factor as usize)
            )));
        }
        if let CollectiveKind::AllToAll { dim } = op.kind {
            let sizes: Vec<usize> =
                if op.groups.is_empty() { vec![ranks] } else { op.groups.iter().map(Vec::len).collect() };
            if let Some(group) = sizes.into_iter().find(|&g| !operand.dims[dim as usize].is_multiple_of(g as u64)) {
                return Err(NrtError::invalid(format!(
                    "`{name}`: all-to-all (HLO `{hlo}`) splits dimension {dim} of {operand} into {group} parts, which does not divide it"
                )));
            }
        }
    }
    Ok(())
}

/// Matches a tensor set against a model's inputs or outputs, by name, size and type.
fn bind(model: &str, what: &str, ios: &[IoTensor], program: &Program, set: &TensorSet) -> NrtResult<Vec<Tensor>> {
    let expected: Vec<&str> = ios.iter().map(|io| io.name.as_str()).collect();
    if let Some(unknown) = set.names().find(|n| !expected.contains(n)) {
        return Err(NrtError::bad_input(format!(
            "`{unknown}` is not an {what} of model `{model}` (its {what}s: {})",
            expected.join(", ")
        )));
    }
    ios.iter()
        .map(|io| {
            let ty = &program.buffers[io.buffer as usize].ty;
            let tensor = set.get(&io.name).ok_or_else(|| {
                NrtError::bad_input(format!(
                    "{what} `{}` ({ty}, HLO `{}`) of model `{model}` has no tensor",
                    io.name, io.hlo_name
                ))
            })?;
            let size = ty.size_bytes().unwrap_or(0);
            if tensor.size() != size {
                return Err(NrtError::bad_input(format!(
                    "{what} `{}` of model `{model}` is {ty} ({size} bytes) but tensor `{}` is {} bytes",
                    io.name,
                    tensor.name(),
                    tensor.size()
                )));
            }
            if let Some(tensor_ty) = tensor.array_type()
                && tensor_ty.dtype != ty.dtype
            {
                return Err(NrtError::bad_input(format!(
                    "{what} `{}` of model `{model}` is {ty} but tensor `{}` holds {tensor_ty}",
                    io.name,
                    tensor.name()
                )));
            }
            Ok(tensor.clone())
        })
        .collect()
}

/// One execution as the core runs it, in a host compute slot.
struct CoreJob<'a> {
    model: &'a LoadedModel,
    inputs: &'a TensorSet,
    outputs: &'a TensorSet,
    tracer: &'a Tracer,
    ids: EventIds,
    timeout: Duration,
    check_outputs: bool,
    /// The host compute slots, whose idle ones large matrix products may borrow.
    pool: &'a HostPool,
    faults: &'a Faults,
    /// The Neuron Device of the model's core.
    device: u32,
    /// `NEURON_RT_COLLECTIVES_ALGORITHM`.
    collectives_algorithm: Option<Algorithm>,
}

/// What the core did: the NaN/Inf count or the error, the program's device time
/// (`None` if it never started) and the instructions it executed.
struct CoreRun {
    result: NrtResult<u64>,
    device_ticks: Option<u64>,
    instructions: u64,
}

fn tracer_duration(tracer: &Tracer, ticks: u64) -> Duration {
    Duration::from_nanos(tracer.ticks_to_ns(ticks))
}

impl CoreJob<'_> {
    /// Counts and records a change of model on the core (the caller holds its lock).
    fn switch_model(&self) {
        let m = self.model;
        if let Some(previous) = self.tracer.switch_model(m.slot, m.id) {
            self.tracer.add(m.slot, counter::MODEL_SWITCHES, 1);
            self.tracer.emit(
                m.ring,
                EventType::NrtModelSwitch,
                Phase::Instant,
                0,
                self.ids,
                0,
                [u64::from(previous), 0, 0, 0],
                0,
            );
        }
    }

    /// Validation and copy-in, the program, copy-out, with their events; the caller
    /// holds the core's lock.
    fn run(&self) -> CoreRun {
        let started = ticks();
        let strikes = match self.faults.degraded(self.model.core) {
            Some(degraded) => Err(unit_unrecoverable(self.model.core, &degraded)),
            None => Ok(self.faults.strike(self.model.core)),
        };
        let mut run = match &strikes {
            Ok(strikes) => self.run_phases(strikes),
            Err(error) => CoreRun { result: Err(error.clone()), device_ticks: None, instructions: 0 },
        };
        let tracer = self.tracer;
        let m = self.model;
        tracer.add(m.slot, counter::BUSY_NS, tracer.ticks_to_ns(ticks().saturating_sub(started)));
        for strike in strikes.iter().flatten() {
            self.struck(strike, &run.result);
        }
        if let Err(error) = &run.result {
            tracer.emit(
                m.ring,
                EventType::HwNotify,
                Phase::Instant,
                0,
                self.ids,
                tracer.store().intern(&error.message),
                [error.status.code() as u64, 0, 0, 0],
                0,
            );
        }
        if let Ok(count) = run.result
            && count > 0
        {
            tracer.emit(m.ring, EventType::NumericalErr, Phase::Instant, 0, self.ids, 0, [count, 0, 0, 0], 0);
        }
        if tracer.enabled(m.ring, EventType::TimestampSyncPoint) {
            let now = ticks();
            let args = [now, tracer.device_ns(m.slot, now), 0, 0];
            tracer.emit_at(now, m.ring, EventType::TimestampSyncPoint, Phase::Instant, 0, self.ids, 0, args, 0);
        }
        run.instructions = run.instructions.min(m.instructions.len() as u64);
        run
    }

    /// Records what an injected fault did once the execution is over: the log line, the
    /// ECC counters and, for corrected errors, the `hw_notify` event and the transient
    /// error count (failures get theirs as every failure does); an uncorrectable error
    /// degrades the core.
    fn struck(&self, strike: &Strike, result: &NrtResult<u64>) {
        let (tracer, m) = (self.tracer, self.model);
        let kind = strike.kind;
        let ecc = match kind {
            FaultKind::EccCorrected => Some(EccCounter::MemCorrected),
            FaultKind::SramEccCorrected => Some(EccCounter::SramCorrected),
            FaultKind::HbmUe => Some(EccCounter::MemUncorrected),
            FaultKind::NcUe => Some(EccCounter::SramUncorrected),
            _ => None,
        };
        if let Some(ecc) = ecc {
            tracer.store().add_ecc(self.device, ecc);
        }
        let place = format!("nc{} (Neuron Device {})", m.core, self.device);
        let what = format!(
            "in execution id {} of `{}`; injected by NEURON_RT_FAULT_INJECT rule `{}`",
            self.ids.exec_id, m.name, strike.rule
        );
        match (kind, result) {
            (FaultKind::EccCorrected | FaultKind::SramEccCorrected, _) => {
                // The event carries the execution id; its message is the same each time,
                // so the string table holds it once.
                let message = format!("{place}: {} [corrected, the execution continues]", kind.description());
                tracing::warn!("{message} {what}");
                let message_id = tracer.store().intern(&message);
                tracer.emit(m.ring, EventType::HwNotify, Phase::Instant, 0, self.ids, message_id, [0; 4], 0);
                tracer.add(m.slot, counter::ERRORS + ErrorClass::Transient as u64, 1);
            }
            (FaultKind::Nan, _) => {
                tracing::warn!("{place}: {} [counted as a numerical error] {what}", kind.description())
            }
            (_, Err(error)) => {
                let degraded = if kind.degrades() {
                    self.faults.degrade(m.core, kind, self.ids.exec_id);
                    format!(
                        "; nc{}'s execution unit is now degraded: later executions on it fail with {}",
                        m.core,
                        NrtStatus::ExecUnitUnrecoverable
                    )
                } else {
                    String::new()
                };
                tracing::error!("{place}: {} [{}] {what}{degraded}", kind.description(), error.status);
            }
            (_, Ok(_)) => {}
        }
    }

    /// Runs collective `op` of this execution as the model's rank, with the host
    /// compute slot given back while it waits for the other ranks.
    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        communicator: &Communicator,
        rank: u32,
        at: OpPosition,
        op: &CollectiveOp,
        operand: ValueRef<'_>,
        out: &ArrayType,
        deadline: Instant,
    ) -> NrtResult<Value> {
        let shape = operand.shape();
        let mut input = vec![0u8; shape.iter().product::<usize>() * out.dtype.size_bytes() as usize];
        operand.write_le_bytes(&mut input);
        let mut output = vec![0u8; out.size_bytes().unwrap_or(0) as usize];
        let outer = match op.kind {
            CollectiveKind::AllReduce(_) => 1,
            CollectiveKind::AllGather { dim }
            | CollectiveKind::ReduceScatter { dim, .. }
            | CollectiveKind::AllToAll { dim } => shape[..dim as usize].iter().product(),
        };
        let request = Request {
            op: collectives::from_kind(op.kind),
            dtype: out.dtype,
            groups: &op.groups,
            algorithm: self.collectives_algorithm,
            outer,
            input: &input,
            output: &mut output,
        };
        self.pool.released(|| communicator.exchange(rank, || at, request, deadline, self.ids))?;
        Ok(Value::from_le_bytes(out, &output))
    }

    /// The failure an injected fault turns a finished execution into.
    fn injected_failure(&self, strike: &Strike, status: NrtStatus) -> NrtError {
        let m = self.model;
        let degraded = if strike.kind.degrades() {
            format!(
                "; nc{} is now degraded and fails later executions with {}",
                m.core,
                NrtStatus::ExecUnitUnrecoverable
            )
        } else {
            String::new()
        };
        NrtError::new(
            status,
            format!(
                "{} on Neuron Device {} nc{} while executing `{}` (injected by NEURON_RT_FAULT_INJECT rule `{}`){degraded}",
                strike.kind.description(),
                self.device,
                m.core,
                m.name,
                strike.rule
            ),
        )
    }

    fn run_phases(&self, strikes: &[Strike]) -> CoreRun {
        let (tracer, m, ids) = (self.tracer, self.model, self.ids);
        let (ring, slot) = (m.ring, m.slot);
        let program = m.executable.program();
        let device = tracer.device_enabled(slot);
        let failed = |error: NrtError| CoreRun { result: Err(error), device_ticks: None, instructions: 0 };

        let pre = tracer.start(ring, EventType::KblExecPre, ids, 0);
        let bound = bind(&m.name, "input", &program.inputs, program, self.inputs)
            .and_then(|i| Ok((i, bind(&m.name, "output", &program.outputs, program, self.outputs)?)));
        let (input_tensors, output_tensors) = match bound {
            Ok(bound) => bound,
            Err(error) => {
                tracer.stop(ring, EventType::KblExecPre, pre, ids, 0, Some(error.status.code()));
                return failed(error);
            }
        };
        // Inputs are read in place from their tensors while the program runs (copied only
        // when unaligned), and outputs that share memory with nothing else are written in
        // place; the rest are copied out after the locks are released.
        let mut locks = ExecutionLocks::new(&input_tensors, &output_tensors);
        let (input_bytes, output_bytes) = locks.split();
        if device {
            let now = tracer.device_ns(slot, ticks());
            for (k, stream) in program.streams.iter().enumerate() {
                let bytes = stream.instructions.len() as u64 * INSTRUCTION_BYTES;
                self.dma(DmaQueueType::Instructions, k as u32, bytes, now, now);
            }
        }
        let values: Vec<Input<'_>> = program
            .inputs
            .iter()
            .zip(input_bytes)
            .zip(&input_tensors)
            .enumerate()
            .map(|(k, ((io, bytes), tensor))| {
                let ty = &program.buffers[io.buffer as usize].ty;
                let start = ticks();
                let input = match ValueRef::from_le_bytes(ty, bytes) {
                    Some(view) => Input::InPlace(view),
                    None => Input::Copied(Value::from_le_bytes(ty, bytes)),
                };
                self.copied(EventType::DmemBufCopyin, DmaQueueType::Input, k, tensor, start, device);
                input
            })
            .collect();
        let destinations: Vec<Option<Destination<'_>>> = program
            .outputs
            .iter()
            .zip(output_bytes)
            .map(|(io, bytes)| Destination::from_le_bytes(program.buffers[io.buffer as usize].ty.dtype, bytes?))
            .collect();
        tracer.stop(ring, EventType::KblExecPre, pre, ids, 0, None);

        let running = tracer.enabled(ring, EventType::NcExecRunning);
        let run_start = ticks();
        let running_tracking = if running {
            let tracking_id = tracer.tracking_id();
            let at = tracer.device_ns(slot, run_start);
            tracer.emit_at(
                at,
                ring,
                EventType::NcExecRunning,
                Phase::Start,
                tracking_id,
                ids,
                0,
                [0; 4],
                FLAG_DEVICE_CLOCK,
            );
            tracking_id
        } else {
            0
        };
        let timeout_ticks = (self.timeout.min(MAX_EXEC_TIMEOUT).as_nanos() as f64 / tracer.ns_per_tick()) as u64;
        // This execution is the rank's next unit: its collectives meet the other ranks' in
        // their executions with the same unit, until the execution's deadline.
        let unit = m.rank.as_ref().map(|(communicator, rank)| {
            (communicator, *rank, communicator.begin(*rank), Instant::now() + self.timeout.min(MAX_EXEC_TIMEOUT))
        });
        let mut run_collective = |index: u32, op: &CollectiveOp, operand: ValueRef<'_>, out: &ArrayType| {
            let Some((communicator, rank, unit, deadline)) = unit else {
                unreachable!("a program with collectives is loaded with a communicator")
            };
            self.collective(
                communicator,
                rank,
                OpPosition { unit, index, count: m.collectives },
                op,
                operand,
                out,
                deadline,
            )
        };
        let mut executed = 0u64;
        // Instruction k runs from boundaries[k] to boundaries[k + 1]; their device
        // events are recorded once the program stops, as run records.
        let mut boundaries = Vec::with_capacity(if device { m.instructions.len() + 1 } else { 0 });
        let hang = strikes.iter().any(|s| s.kind == FaultKind::Timeout);
        let results = if hang {
            // The core stops making progress: nothing runs, and the deadline passes.
            drop((values, destinations));
            std::thread::sleep(self.timeout.min(MAX_EXEC_TIMEOUT));
            Err(RunError::DeadlineExceeded { step: 0, steps: m.instructions.len() })
        } else {
            let deadline_ticks = run_start.saturating_add(timeout_ticks);
            m.executable.run(values, destinations, deadline_ticks, self.pool, &mut run_collective, |_, a, b| {
                executed += 1;
                if device {
                    if boundaries.is_empty() {
                        boundaries.push(a);
                    }
                    boundaries.push(b);
                }
            })
        };
        let run_end = ticks();
        if device {
            tracer.emit_instructions(slot, ids, &m.instructions, m.instructions_in_table, &boundaries);
        }
        let results = results.map_err(|e| match e {
            RunError::DeadlineExceeded { step, steps } => NrtError::new(
                NrtStatus::Timeout,
                format!(
                    "execution of `{}` on nc{} did not finish within NEURON_RT_EXEC_TIMEOUT ({:.3} s): stopped before instruction {step} of {steps}; {}",
                    m.name,
                    m.core,
                    self.timeout.as_secs_f64(),
                    if hang {
                        "the core stopped making progress (injected by NEURON_RT_FAULT_INJECT rule `timeout`)"
                    } else {
                        "raise the timeout if the model is expected to take this long"
                    }
                ),
            ),
            RunError::OutOfBounds { step, detail } => {
                let (opcode, hlo) = m
                    .executable
                    .steps()
                    .nth(step)
                    .map(|i| (i.op.opcode(), m.executable.program().hlo_names[i.hlo as usize].as_str()))
                    .unwrap_or_default();
                NrtError::new(
                    NrtStatus::ExecOob,
                    format!(
                        "failed to run scatter/gather (indirect memory copy), due to out-of-bound access: instruction {step} ({opcode}, HLO `{hlo}`) of `{}` on nc{}: {detail}",
                        m.name, m.core
                    ),
                )
            }
            RunError::Collective { error, .. } => error,
        });
        // A fault that fails the execution is seen when it completes, as the runtime
        // reads the core's status.
        let failing = strikes.iter().find_map(|s| Some((s, s.kind.failure()?)));
        let results = match (results, failing) {
            (Ok(_), Some((strike, status))) => Err(self.injected_failure(strike, status)),
            (results, _) => results,
        };
        if running {
            let (args, flags) = match &results {
                Err(e) => ([0, 0, 0, e.status.code() as u64], FLAG_DEVICE_CLOCK | FLAG_STATUS),
                Ok(_) => ([0; 4], FLAG_DEVICE_CLOCK),
            };
            let at = tracer.device_ns(slot, run_end);
            tracer.emit_at(at, ring, EventType::NcExecRunning, Phase::Stop, running_tracking, ids, 0, args, flags);
        }
        let device_ticks = Some(run_end.saturating_sub(run_start));
        let results = match results {
            Ok(results) => results,
            Err(error) => return CoreRun { result: Err(error), device_ticks, instructions: executed },
        };

        let post = tracer.start(ring, EventType::KblExecPost, ids, 0);
        let mut non_finite = 0;
        let mut to_copy = Vec::new();
        for (k, result) in results.into_iter().enumerate() {
            match result {
                Output::Written(view) => {
                    if self.check_outputs {
                        non_finite += view.non_finite_count();
                    }
                    to_copy.push((k, None));
                }
                Output::Value(value) => {
                    if self.check_outputs {
                        non_finite += value.view().non_finite_count();
                    }
                    to_copy.push((k, Some(value)));
                }
            }
        }
        drop(locks);
        for (k, value) in to_copy {
            let start = ticks();
            if let Some(value) = value {
                output_tensors[k].with_bytes_mut(|bytes| value.write_le_bytes(bytes));
            }
            self.copied(EventType::DmemBufCopyout, DmaQueueType::Output, k, &output_tensors[k], start, device);
        }
        if strikes.iter().any(|s| s.kind == FaultKind::Nan)
            && self.poison_first_float_output(&output_tensors)
            && self.check_outputs
        {
            non_finite += 1;
        }
        tracer.stop(ring, EventType::KblExecPost, post, ids, 0, None);
        CoreRun { result: Ok(non_finite), device_ticks, instructions: executed }
    }

    /// Writes a NaN over the first element of the first floating-point output; `true`
    /// when that element was finite before (so that one more non-finite value exists).
    fn poison_first_float_output(&self, outputs: &[Tensor]) -> bool {
        let program = self.model.executable.program();
        let Some((k, dtype)) = program
            .outputs
            .iter()
            .map(|io| &program.buffers[io.buffer as usize].ty)
            .enumerate()
            .find(|(_, ty)| ty.dtype.is_float() && ty.element_count().is_some_and(|n| n > 0))
            .map(|(k, ty)| (k, ty.dtype))
        else {
            return false;
        };
        let mut was_finite = false;
        outputs[k].with_bytes_mut(|bytes| match dtype {
            DType::F32 => {
                was_finite = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]).is_finite();
                bytes[..4].copy_from_slice(&f32::NAN.to_le_bytes());
            }
            DType::F16 => {
                was_finite = half::f16::from_le_bytes([bytes[0], bytes[1]]).is_finite();
                bytes[..2].copy_from_slice(&half::f16::NAN.to_le_bytes());
            }
            DType::BF16 => {
                was_finite = half::bf16::from_le_bytes([bytes[0], bytes[1]]).is_finite();
                bytes[..2].copy_from_slice(&half::bf16::NAN.to_le_bytes());
            }
            _ => {}
        });
        was_finite
    }

    /// Records a tensor's copy-in or copy-out, which started at `start` and ends now:
    /// a `dmem_buf_copy*` event and a DMA transfer on the device trace.
    fn copied(
        &self,
        event_type: EventType,
        queue: DmaQueueType,
        index: usize,
        tensor: &Tensor,
        start: u64,
        device: bool,
    ) {
        let (tensor_id, name_id) = tensor.trace_ids();
        let bytes = tensor.size();
        let end = ticks();
        if self.tracer.enabled(self.model.ring, event_type) {
            let args = [tensor_id, bytes, 0, 0];
            self.tracer.emit_at(end, self.model.ring, event_type, Phase::Instant, 0, self.ids, name_id, args, 0);
        }
        if device {
            let slot = self.model.slot;
            self.dma(queue, index as u32, bytes, self.tracer.device_ns(slot, start), self.tracer.device_ns(slot, end));
        }
    }

    fn dma(&self, queue: DmaQueueType, index: u32, bytes: u64, start_ns: u64, end_ns: u64) {
        self.tracer.emit_device(
            self.model.slot,
            &DeviceRecord {
                start_ns,
                end_ns,
                exec_id: self.ids.exec_id,
                model_id: self.ids.model_id,
                kind: DEVICE_KIND_DMA,
                unit: queue as u8,
                opcode_or_index: index,
                flops_or_bytes: bytes,
                ..DeviceRecord::default()
            },
        );
    }
}

impl Drop for Shared {
    /// A runtime dropped without `close` still removes its datastore file: the
    /// heartbeat thread holds the tracer, and may outlive `main` by a heartbeat.
    fn drop(&mut self) {
        if let Some(r) = lock(&self.running).as_ref() {
            r.tracer.store().close();
        }
    }
}

/// Bytes of ring faulted in at a time by the heartbeat thread.
const PREFAULT_CHUNK_BYTES: u64 = 8 << 20;

/// Starts the thread that faults the datastore's rings in, then refreshes its
/// heartbeat until the returned sender is dropped.
fn start_heartbeat(tracer: Arc<Tracer>) -> NrtResult<crossbeam_channel::Sender<()>> {
    let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
    std::thread::Builder::new()
        .name("neuron-datastore-heartbeat".into())
        .spawn(move || {
            // First fault the rings in, a chunk at a time, so that events never take a
            // page fault; stop early if the runtime closes meanwhile.
            let mut last_beat = std::time::Instant::now();
            for (offset, len) in tracer.store().prefault_chunks(PREFAULT_CHUNK_BYTES) {
                if !matches!(stopped.try_recv(), Err(crossbeam_channel::TryRecvError::Empty)) {
                    return;
                }
                tracer.store().prefault(offset, len);
                if last_beat.elapsed() >= HEARTBEAT_INTERVAL {
                    tracer.store().heartbeat();
                    last_beat = std::time::Instant::now();
                }
            }
            while let Err(crossbeam_channel::RecvTimeoutError::Timeout) = stopped.recv_timeout(HEARTBEAT_INTERVAL) {
                tracer.store().heartbeat();
            }
        })
        .map_err(|e| NrtError::new(NrtStatus::Resource, format!("cannot start the heartbeat thread: {e}")))?;
    Ok(stop)
}

fn datastore_error(error: &DatastoreError) -> NrtError {
    NrtError::new(NrtStatus::Resource, format!("cannot create the runtime's datastore: {error}"))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
