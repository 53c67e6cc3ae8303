//! The runtime: init, load, tensors, synchronous execution, unload, close.
//!
//! A [`Runtime`] follows the Neuron runtime's lifecycle: created uninitialised,
//! [`Runtime::init`] reserves its NeuronCores (exclusively, host-wide) and starts the
//! host thread pool, and [`Runtime::close`] releases them. Calls before `init` fail
//! with `NRT_UNINITIALIZED` and calls after `close` with `NRT_CLOSED`, including calls
//! through tensor and model handles that outlive the runtime.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::backend::{Destination, Executable, Input, Output, RunError, Value, ValueRef};
use crate::config::{Config, MAX_EXEC_TIMEOUT, NumericalErrorsVerbosity};
use crate::dtype::ArrayType;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::isa::{IoTensor, Program};
use crate::memory::{Charge, DeviceCategory, DeviceUsage, HostCategory, HostUsage, MemoryCharge, MemoryLedger};
use crate::neff::{DecodeOptions, Neff};
use crate::pool::HostPool;
use crate::reservation::CoreReservation;
use crate::tensor::{ExecutionLocks, Tensor, TensorPlacement, TensorSet};
use crate::topology::{CoreSet, Topology};

/// Device memory the runtime keeps per DMA descriptor of a loaded model.
pub(crate) const DMA_DESCRIPTOR_BYTES: u64 = 64;

/// Where a runtime is in its lifecycle; shared with every handle it gives out.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle(AtomicU8);

const UNINITIALIZED: u8 = 0;
const RUNNING: u8 = 1;
const CLOSED: u8 = 2;

impl Lifecycle {
    /// Fails unless the runtime is initialised and not closed.
    pub(crate) fn check(&self) -> NrtResult<()> {
        match self.0.load(Ordering::Acquire) {
            RUNNING => Ok(()),
            UNINITIALIZED => {
                Err(NrtError::new(NrtStatus::Uninitialized, "the runtime is not initialised; call init first"))
            }
            _ => Err(NrtError::new(NrtStatus::Closed, "the runtime has been closed")),
        }
    }
}

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

    /// Reserves the configured NeuronCores and starts the host thread pool.
    pub fn init(&self) -> NrtResult<()> {
        let shared = &self.shared;
        let mut running = lock(&shared.running);
        match shared.lifecycle.0.load(Ordering::Acquire) {
            RUNNING => return Err(NrtError::invalid("the runtime is already initialised")),
            CLOSED => {
                return Err(NrtError::new(NrtStatus::Closed, "the runtime has been closed; create a new one"));
            }
            _ => {}
        }
        let reservation = CoreReservation::acquire(&shared.config.lock_dir, &shared.topology, &shared.config.cores)?;
        let threads = shared.config.host_threads.min(reservation.cores().len()).max(1);
        let pool = HostPool::new(threads)
            .map_err(|e| NrtError::new(NrtStatus::Resource, format!("cannot start host threads: {e}")))?;
        tracing::info!(
            instance = %shared.topology.instance_type,
            cores = %reservation.cores(),
            host_threads = pool.threads(),
            "runtime initialised"
        );
        let core_locks = reservation.cores().cores().iter().map(|&c| (c, Mutex::new(()))).collect();
        *running = Some(Running { reservation, pool: Arc::new(pool), core_locks: Arc::new(core_locks) });
        shared.lifecycle.0.store(RUNNING, Ordering::Release);
        Ok(())
    }

    /// Unloads every model, stops the host threads and releases the NeuronCores.
    pub fn close(&self) -> NrtResult<()> {
        self.shared.lifecycle.check()?;
        let mut running = lock(&self.shared.running);
        self.shared.lifecycle.0.store(CLOSED, Ordering::Release);
        for (_, model) in lock(&self.shared.models).drain() {
            lock(&model.charges).clear();
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

    /// Loads a NEFF onto `core`, or onto the held core with the fewest models.
    pub fn load(&self, neff_bytes: &[u8], core: Option<u32>) -> NrtResult<Model> {
        self.shared.lifecycle.check()?;
        let neff = Neff::decode(neff_bytes, DecodeOptions { validate_hash: self.shared.config.validate_hash })?;
        let program = &neff.program;
        if program.target != self.shared.topology.core_version {
            return Err(NrtError::invalid(format!(
                "NEFF `{}` was compiled for NeuronCore-{} but {} has NeuronCore-{}; recompile with a matching --target",
                neff.name, program.target, self.shared.topology.instance_type, self.shared.topology.core_version
            )));
        }
        let core = self.pick_core(core)?;
        let charges = self.charge_model(program, neff_bytes.len() as u64, core)?;
        let id = self.shared.next_model_id.fetch_add(1, Ordering::Relaxed);
        let model = Arc::new(LoadedModel {
            id,
            name: neff.name.clone(),
            uuid: neff.uuid,
            core,
            flops_per_execution: program.flops_per_execution(),
            executable: Executable::new(neff.program),
            charges: Mutex::new(charges),
        });
        {
            // Checked again under the models lock: a concurrent close drains the table
            // after marking the runtime closed, so a model inserted here is never missed.
            let mut models = lock(&self.shared.models);
            self.shared.lifecycle.check()?;
            models.insert(id, Arc::clone(&model));
        }
        tracing::info!(model = %model.name, id, core, "model loaded");
        Ok(Model { inner: model })
    }

    /// Unloads a model; its handle is invalid afterwards.
    pub fn unload(&self, model: &Model) -> NrtResult<()> {
        self.shared.lifecycle.check()?;
        match lock(&self.shared.models).remove(&model.inner.id) {
            Some(loaded) => {
                lock(&loaded.charges).clear();
                tracing::info!(model = %model.inner.name, id = model.inner.id, "model unloaded");
                Ok(())
            }
            None => Err(stale_model(model)),
        }
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
        self.shared.lifecycle.check()?;
        let charge = match placement {
            TensorPlacement::Host => Charge::Host(HostCategory::Tensors),
            TensorPlacement::Device { core } => {
                self.check_held(core)?;
                Charge::Device { core, category: DeviceCategory::Tensors }
            }
        };
        let charge = self.shared.ledger.charge(charge, size)?;
        Tensor::allocate(name, placement, size, ty, charge, Arc::clone(&self.shared.lifecycle))
    }

    /// Executes `model` synchronously: reads `inputs`, writes `outputs`.
    pub fn execute(&self, model: &Model, inputs: &TensorSet, outputs: &TensorSet) -> NrtResult<ExecutionReport> {
        let started = Instant::now();
        self.shared.lifecycle.check()?;
        if !lock(&self.shared.models).contains_key(&model.inner.id) {
            return Err(stale_model(model));
        }
        let program = model.inner.executable.program();
        let input_tensors = bind(&model.inner.name, "input", &program.inputs, program, inputs)?;
        let output_tensors = bind(&model.inner.name, "output", &program.outputs, program, outputs)?;
        let (pool, core_locks) = {
            let running = lock(&self.shared.running);
            let running =
                running.as_ref().ok_or_else(|| NrtError::new(NrtStatus::Closed, "the runtime has been closed"))?;
            (Arc::clone(&running.pool), Arc::clone(&running.core_locks))
        };
        let model_inner = Arc::clone(&model.inner);
        let timeout = self.shared.config.exec_timeout;
        let check_outputs = self.shared.config.numerical_errors != NumericalErrorsVerbosity::None;
        let outcome = pool.run(move || {
            let core_lock = core_locks.get(&model_inner.core);
            let _busy = core_lock.map(|l| l.lock().unwrap_or_else(|e| e.into_inner()));
            run_on_core(&model_inner, &input_tensors, &output_tensors, timeout, check_outputs)
        });
        let (device_latency, numerical_errors) = outcome.map_err(|panic| {
            NrtError::new(NrtStatus::Failure, format!("execution failed inside the backend: {}", panic.0))
        })??;
        let report = ExecutionReport {
            total_latency: started.elapsed(),
            device_latency,
            numerical_errors,
            flops: model.inner.flops_per_execution,
        };
        if numerical_errors > 0 {
            tracing::warn!(model = %model.inner.name, numerical_errors, "execution produced NaN or Inf");
            if self.shared.config.numerical_errors == NumericalErrorsVerbosity::Critical {
                return Err(NrtError::new(
                    NrtStatus::ExecCompletedWithNumErr,
                    format!(
                        "execution of `{}` completed with {numerical_errors} NaN/Inf value(s) in its outputs \
                         (NEURON_RT_NUMERICAL_ERRORS_VERBOSITY=critical)",
                        model.inner.name
                    ),
                ));
            }
        }
        tracing::debug!(model = %model.inner.name, latency_us = report.total_latency.as_micros() as u64, "executed");
        Ok(report)
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

fn stale_model(model: &Model) -> NrtError {
    NrtError::new(
        NrtStatus::InvalidHandle,
        format!(
            "model {} (`{}`) is not loaded; it was unloaded or its runtime closed",
            model.inner.id, model.inner.name
        ),
    )
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

/// Input DMA, the program, output DMA; returns the device time and the NaN/Inf count
/// (zero when outputs are not checked).
fn run_on_core(
    model: &LoadedModel,
    inputs: &[Tensor],
    outputs: &[Tensor],
    timeout: Duration,
    check_outputs: bool,
) -> NrtResult<(Duration, u64)> {
    let started = Instant::now();
    let program = model.executable.program();
    // Inputs are read in place from their tensors while the program runs (copied only
    // when unaligned), and outputs that share memory with nothing else are written in
    // place; the rest are copied out after the locks are released.
    let mut locks = ExecutionLocks::new(inputs, outputs);
    let (input_bytes, output_bytes) = locks.split();
    let values: Vec<Input<'_>> = program
        .inputs
        .iter()
        .zip(input_bytes)
        .map(|(io, bytes)| {
            let ty = &program.buffers[io.buffer as usize].ty;
            match ValueRef::from_le_bytes(ty, bytes) {
                Some(view) => Input::InPlace(view),
                None => Input::Copied(Value::from_le_bytes(ty, bytes)),
            }
        })
        .collect();
    let destinations: Vec<Option<Destination<'_>>> = program
        .outputs
        .iter()
        .zip(output_bytes)
        .map(|(io, bytes)| Destination::from_le_bytes(program.buffers[io.buffer as usize].ty.dtype, bytes?))
        .collect();
    let deadline = started.checked_add(timeout).unwrap_or_else(|| started + MAX_EXEC_TIMEOUT);
    let results = model.executable.run(values, destinations, deadline).map_err(|e| match e {
        RunError::DeadlineExceeded { step, steps } => NrtError::new(
            NrtStatus::Timeout,
            format!(
                "execution of `{}` on nc{} did not finish within NEURON_RT_EXEC_TIMEOUT ({:.3} s): stopped before instruction {step} of {steps}; raise the timeout if the model is expected to take this long",
                model.name,
                model.core,
                timeout.as_secs_f64()
            ),
        ),
    })?;
    let mut non_finite = 0;
    let mut to_copy = Vec::new();
    for (k, result) in results.into_iter().enumerate() {
        match result {
            Output::Written(view) => {
                if check_outputs {
                    non_finite += view.non_finite_count();
                }
            }
            Output::Value(value) => {
                if check_outputs {
                    non_finite += value.view().non_finite_count();
                }
                to_copy.push((k, value));
            }
        }
    }
    drop(locks);
    for (k, value) in to_copy {
        outputs[k].with_bytes_mut(|bytes| value.write_le_bytes(bytes));
    }
    Ok((started.elapsed(), non_finite))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
