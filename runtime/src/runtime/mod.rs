//! The runtime: init, load, tensors, synchronous execution, unload, close.
//!
//! A [`Runtime`] follows the Neuron runtime's lifecycle: created uninitialised,
//! [`Runtime::init`] reserves its NeuronCores (exclusively, host-wide) and starts the
//! host compute slots, and [`Runtime::close`] releases them. Calls before `init` fail
//! with `NRT_UNINITIALIZED` and calls after `close` with `NRT_CLOSED`, including calls
//! through tensor and model handles that outlive the runtime.

mod core_job;
mod execute;
mod load;
mod ranks;
mod scheduling;

pub use ranks::GLOBAL_COMMUNICATOR;
mod tensors;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use uuid::Uuid;

use crate::backend::Executable;
use crate::collectives::Communicator;
use crate::config::Config;
use crate::dtype::ArrayType;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::fault::{Degraded, Faults};
use crate::isa::{IoTensor, Program};
use crate::lifecycle::{Lifecycle, Stage};
use crate::memory::{Charge, DeviceUsage, HostUsage, MemoryCharge, MemoryLedger, MemoryMirror};
use crate::nrta::Unit;
use crate::pool::HostPool;
use crate::reservation::CoreReservation;
#[cfg(feature = "trace-probe")]
use crate::trace::{ProbeProgram, TraceProbe};
use neuron_datastore::clock::{self, DeviceClock};
use neuron_datastore::topology::{CoreSet, Topology};
use neuron_datastore::{
    CreateParams, DEFAULT_INSTRUCTION_TABLE_BYTES, DEFAULT_MODEL_SLOTS, DEFAULT_STRING_TABLE_BYTES, DatastoreError,
    DatastoreWriter, DeviceCategory, FetchOptions, HostCategory, InstructionTrace, RingPos, SysTraceConfig,
    SysTraceFetch, TraceSession, Tracer,
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
    /// This process among the job's processes, from the first communicator across them.
    world: std::sync::OnceLock<Arc<crate::collectives::world::World>>,
    /// Communicators across processes, by the key the processes know them by.
    across: Arc<Mutex<HashMap<String, Communicator>>>,
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
    /// How many instruction spans the last execution held at its end: the room the
    /// next one reserves (a loop's spans grow with its iterations).
    spans_last: std::sync::atomic::AtomicUsize,
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
        let reservation = CoreReservation::acquire(&shared.config.lock_dir, &shared.topology, &shared.config.cores)
            .map_err(|e| crate::reservation::for_the_job(e, &shared.topology, &shared.config))?;
        // Each core runs one execution at a time, so at most `cores` slots hold jobs;
        // the others are lent to large matrix products.
        let pool = HostPool::new(shared.config.host_threads.max(1));
        tracing::info!(
            instance = %shared.topology.instance_type,
            cores = %reservation.cores(),
            host_threads = pool.threads(),
            "runtime initialised"
        );
        for warning in &shared.config.warnings {
            tracing::warn!("{warning}");
        }
        if let Some(launch) = &shared.config.launch {
            let root = shared.config.root_comm.as_ref().map(|r| format!("; rank 0 at {r} ({})", r.from));
            tracing::info!(
                "process {} of {} ({}{}){}",
                launch.process,
                launch.processes,
                launch.launcher.name(),
                launch.local_process.map(|l| format!(", {l} on this host")).unwrap_or_default(),
                root.unwrap_or_default()
            );
        }
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
            world: std::sync::OnceLock::new(),
            across: Arc::new(Mutex::new(HashMap::new())),
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
            host_threads: config.host_threads.max(1) as u32,
            product_kernel: crate::backend::choose_product_kernel(config.bf16_products),
            command: neuron_datastore::CommandIdentity::of_this_process(),
        };
        let store = DatastoreWriter::create(&params).map_err(|e| datastore_error(&e))?;
        if !config.flight_record {
            store.turn_flight_record_off();
        }
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
        self.sys_trace_fetch_events_with(&FetchOptions::default())
    }

    /// Returns the session's events not fetched before that `options` asks for; the
    /// others stay for a later fetch.
    pub fn sys_trace_fetch_events_with(&self, options: &FetchOptions) -> NrtResult<SysTraceFetch> {
        self.with_running(|r| r.trace_session.fetch(&r.tracer, options))?.map_err(|e| NrtError::invalid(e.to_string()))
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

    /// Says in the trace that a framework compiled one of its graphs (`graph_compile`,
    /// in the process ring): `detail` names it and what made it new, after
    /// `executions_before` executions of this process, in `compile_us` (0 when it came
    /// from the compile cache). The tools name recompilations after the first steps
    /// from it.
    pub fn record_graph_compile(&self, detail: &str, executions_before: u64, compile_us: u64) -> NrtResult<()> {
        let tracer = self.tracer()?;
        let payload = neuron_datastore::event::payload::GraphCompile {
            detail: tracer.store().intern(detail),
            executions_before,
            compile_us,
        };
        tracer.instant(
            tracer.ring_of(None),
            neuron_datastore::event::EventType::GraphCompile,
            Default::default(),
            payload,
        );
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
