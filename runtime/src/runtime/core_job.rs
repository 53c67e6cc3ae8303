//! One execution on its core ([`CoreJob`]): its phases and their events, injected
//! faults, collectives, and the DMA and instruction traces.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::backend::{CollectiveStep, Destination, Input, Output, RunError, Value, ValueRef};
use crate::collectives::{self, Algorithm, Communicator, OpPosition, Request};
use crate::config::MAX_EXEC_TIMEOUT;
use crate::dtype::DType;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::fault::{FaultKind, Faults, Strike};
use crate::isa::{CollectiveKind, IoTensor, Program};
use crate::pool::HostPool;
use crate::tensor::{ExecutionLocks, Tensor, TensorSet};
use neuron_datastore::clock::ticks;
use neuron_datastore::counters::core as counter;
use neuron_datastore::event::payload::{self, Execution};
use neuron_datastore::event::{DmaQueueType, EventType};
use neuron_datastore::record::{DEVICE_KIND_DMA, DeviceRecord};
use neuron_datastore::{At, EccCounter, ErrorClass, EventIds, INSTRUCTION_BYTES, InstructionSpan, Tracer};

use super::*;

/// Instruction spans kept before they are recorded while an execution runs: a long
/// loop's are recorded in batches of this many instead of all at its end.
const MAX_PENDING_SPANS: usize = 1 << 14;

/// One execution as the core runs it, in a host compute slot.
pub(super) struct CoreJob<'a> {
    pub(super) model: &'a LoadedModel,
    pub(super) inputs: &'a TensorSet,
    pub(super) outputs: &'a TensorSet,
    pub(super) tracer: &'a Tracer,
    pub(super) ids: EventIds,
    pub(super) timeout: Duration,
    pub(super) check_outputs: bool,
    /// The host compute slots, whose idle ones large matrix products may borrow.
    pub(super) pool: &'a HostPool,
    pub(super) faults: &'a Faults,
    /// The Neuron Device of the model's core.
    pub(super) device: u32,
    /// `NEURON_RT_COLLECTIVES_ALGORITHM`.
    pub(super) collectives_algorithm: Option<Algorithm>,
}

/// What the core did: the NaN/Inf count or the error, the program's device time
/// (`None` if it never started), the instructions it executed and their FLOPs (an
/// instruction inside a loop counts once per iteration).
pub(super) struct CoreRun {
    pub(super) result: NrtResult<u64>,
    pub(super) device_ticks: Option<u64>,
    pub(super) instructions: u64,
    pub(super) flops: u64,
}

pub(super) fn tracer_duration(tracer: &Tracer, ticks: u64) -> Duration {
    Duration::from_nanos(tracer.ticks_to_ns(ticks))
}

impl CoreJob<'_> {
    /// Counts and records a change of model on the core (the caller holds its lock).
    pub(super) fn switch_model(&self) {
        let m = self.model;
        if let Some(previous) = self.tracer.switch_model(m.slot, m.id) {
            self.tracer.add(m.slot, counter::MODEL_SWITCHES, 1);
            let switch = payload::ModelSwitch { from_model_id: previous };
            self.tracer.instant(m.ring, EventType::NrtModelSwitch, self.ids, switch);
        }
    }

    /// Validation and copy-in, the program, copy-out, with their events; the caller
    /// holds the core's lock.
    pub(super) fn run(&self) -> CoreRun {
        let started = ticks();
        let strikes = match self.faults.degraded(self.model.core) {
            Some(degraded) => Err(unit_unrecoverable(self.model.core, &degraded)),
            None => Ok(self.faults.strike(self.model.core, self.model.rank.as_ref().map(|(_, rank)| *rank))),
        };
        let run = match &strikes {
            Ok(strikes) => self.run_phases(strikes),
            Err(error) => CoreRun { result: Err(error.clone()), device_ticks: None, instructions: 0, flops: 0 },
        };
        let tracer = self.tracer;
        let m = self.model;
        tracer.add(m.slot, counter::BUSY_NS, tracer.ticks_to_ns(ticks().saturating_sub(started)));
        for strike in strikes.iter().flatten() {
            self.struck(strike, &run.result);
        }
        if let Err(error) = &run.result {
            let notify = payload::HwNotify {
                status: error.status.code() as i32,
                message: tracer.store().intern(&error.message),
            };
            tracer.instant(m.ring, EventType::HwNotify, self.ids, notify);
        }
        if let Ok(count) = run.result
            && count > 0
        {
            tracer.instant(m.ring, EventType::NumericalErr, self.ids, payload::NumericalError { count });
        }
        if tracer.enabled(m.ring, EventType::TimestampSyncPoint) {
            let now = ticks();
            let point = payload::SyncPoint { cpu_timestamp_ns: now, nc_timestamp_ns: tracer.device_ns(m.slot, now) };
            tracer.instant_at(At::Ticks(now), m.ring, EventType::TimestampSyncPoint, self.ids, point);
        }
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
                let notify = payload::HwNotify { status: 0, message: message_id };
                tracer.instant(m.ring, EventType::HwNotify, self.ids, notify);
                tracer.add(m.slot, counter::ERRORS + ErrorClass::Transient as u64, 1);
                let exemplar = neuron_datastore::exemplar::Execution {
                    exec_id: self.ids.exec_id,
                    model_id: m.id,
                    status: 0,
                    latency_ns: 0,
                    at_ticks: ticks(),
                };
                tracer.store().record_error_exemplar(m.slot, &exemplar, ErrorClass::Transient);
            }
            (FaultKind::Nan, _) => {
                tracing::warn!("{place}: {} [counted as a numerical error] {what}", kind.description())
            }
            (FaultKind::Slow, result) => {
                let delay = strike.rule.delay.unwrap_or(crate::fault::DEFAULT_SLOW_DELAY);
                let outcome = match result {
                    Ok(_) => "the execution continues".to_string(),
                    Err(error) => error.status.to_string(),
                };
                tracing::warn!("{place}: {} for {:.3} s [{outcome}] {what}", kind.description(), delay.as_secs_f64())
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

    /// Runs collective `step` of this execution as the model's rank, with the host
    /// compute slot given back while it waits for the other ranks; `fault` is a `cc_`
    /// fault striking this collective. The result goes into the step's destination when
    /// it has one (the output tensor's memory); an all-reduce of an input read in place
    /// into an output written in place, both tensors in shared memory, lends them to the
    /// ranks of other processes of this host as an API call of the same tensors does
    /// (`tensors`: the execution's input and output tensors). When `counted` is given,
    /// an algorithm that counts the NaN and infinities of what it writes into the
    /// destination as it writes them sets it to the count.
    fn collective<'a>(
        &self,
        (communicator, rank, at): (&Communicator, u32, OpPosition),
        step: CollectiveStep<'_, 'a>,
        (inputs, outputs): (&[Tensor], &[Tensor]),
        (deadline, counted): (Instant, Option<&Cell<Option<u64>>>),
        fault: Option<&Strike>,
    ) -> NrtResult<Output<'a>> {
        let CollectiveStep { op, operand, out, .. } = step;
        let shape = operand.shape();
        let element = out.dtype.size_bytes() as usize;
        let outer = match op.kind {
            CollectiveKind::AllReduce(_) => 1,
            CollectiveKind::AllGather { dim }
            | CollectiveKind::ReduceScatter { dim, .. }
            | CollectiveKind::AllToAll { dim } => shape[..dim as usize].iter().product(),
        };
        let (mut more_in, mut more_out) = (0, 0);
        if let Some(strike) = fault
            && self.rank_fault(communicator, strike, rank, at, deadline)?
        {
            // One element more per rank of the group, as the operation's shapes require.
            let n = op.groups.first().map_or(communicator.ranks(), Vec::len);
            (more_in, more_out) = match op.kind {
                CollectiveKind::AllReduce(_) => (1, 1),
                CollectiveKind::AllGather { .. } => (1, n),
                CollectiveKind::ReduceScatter { .. } => (n, 1),
                CollectiveKind::AllToAll { .. } => (n, n),
            };
        }
        let call = collectives::from_kind(op.kind);
        let exchange = |input: std::sync::Arc<collectives::Message>,
                        lent: Option<collectives::LentInput<'_>>,
                        (output, non_finite): (&mut [u8], Option<&Cell<Option<u64>>>)| {
            let request = Request {
                op: call,
                dtype: out.dtype,
                groups: &op.groups,
                algorithm: self.collectives_algorithm,
                outer,
                input,
                lent,
                output,
                non_finite,
            };
            self.pool.released(|| communicator.exchange(rank, || at, request, deadline, self.ids)).map(drop)
        };
        let destination = step.destination.filter(|_| more_out == 0);
        // Lent: the operand is input tensor `i` where it lies, the result goes to output
        // tensor `k`, both in shared memory.
        let operand_bytes = match &operand {
            ValueRef::F32(a) if more_in == 0 => a.as_slice().map(bytemuck::cast_slice::<f32, u8>),
            _ => None,
        };
        let places = match (step.input, &destination, operand_bytes) {
            (Some(i), Some((k, _)), Some(_)) => match (inputs.get(i), outputs.get(*k)) {
                (Some(input), Some(output)) => {
                    communicator.lendable(call, (input, output), deadline).filter(|(a, b)| a != b)
                }
                _ => None,
            },
            _ => None,
        };
        let destination = match (places, destination, operand_bytes) {
            (Some((input, output)), Some((_, destination)), Some(bytes)) => {
                let empty = std::sync::Arc::new(collectives::Message::Heap(Vec::new()));
                let lent = collectives::LentInput { bytes: Some(bytes), input, output };
                let (view, exchanged) =
                    destination.fill_le(out, |output| exchange(empty, Some(lent), (output, counted)));
                return exchanged.map(|()| Output::Written(view));
            }
            (_, destination, _) => destination,
        };
        // The input is overwritten whole, made where the ranks of other processes of
        // this host read it.
        let operand_bytes = shape.iter().product::<usize>() * element;
        let mut input = communicator.message_for_peers(operand_bytes + more_in * outer * element);
        let bytes = input.bytes_mut();
        operand.write_le_bytes(&mut bytes[..operand_bytes]);
        bytes[operand_bytes..].fill(0);
        let input = std::sync::Arc::new(input);
        let exchange = |output: &mut [u8], counted| exchange(std::sync::Arc::clone(&input), None, (output, counted));
        let result = match destination {
            // The result is written where the output tensor keeps it.
            Some((_, destination)) => {
                let (view, exchanged) = destination.fill_le(out, |output| exchange(output, counted));
                exchanged.map(|()| Output::Written(view))
            }
            None if more_out == 0 => {
                // The result is written where the value keeps it.
                let (value, exchanged) = Value::filled_le(out, |output| exchange(output, None));
                exchanged.map(|()| Output::Value(value))
            }
            None => {
                let out_bytes = out.size_bytes().unwrap_or(0) as usize;
                let mut output = collectives::buffers::take(out_bytes + more_out * outer * element);
                let value = exchange(&mut output, None)
                    .map(|()| Output::Value(Value::from_le_bytes(out, &output[..out_bytes])));
                collectives::buffers::give(output);
                value
            }
        };
        collectives::Message::recycle(input);
        result
    }

    /// Does what a `cc_` fault does to rank `rank` at collective `at`: arrives late,
    /// never arrives (failing at the deadline), or exits the process; `Ok(true)` when
    /// the rank is to call the collective with another count.
    fn rank_fault(
        &self,
        communicator: &Communicator,
        strike: &Strike,
        rank: u32,
        at: OpPosition,
        deadline: Instant,
    ) -> NrtResult<bool> {
        let rank_name = format!("rank {rank} of `{}` on nc{}", self.model.name, self.model.core);
        let rule = format!("injected by NEURON_RT_FAULT_INJECT rule `{}`", strike.rule);
        let operation = format!("collective operation {} out of {}", at.index, at.count);
        match strike.kind {
            FaultKind::CcDelay => {
                let delay = strike.rule.delay.unwrap_or(crate::fault::DEFAULT_CC_DELAY);
                tracing::warn!("{rank_name} arrives {:.3} s late at {operation} ({rule})", delay.as_secs_f64());
                self.pool.released(|| std::thread::sleep(delay));
            }
            FaultKind::CcHang => {
                tracing::warn!("{rank_name} never arrives at {operation} ({rule})");
                self.pool.released(|| std::thread::sleep(deadline.saturating_duration_since(Instant::now())));
                return Err(NrtError::new(
                    NrtStatus::ExecHwErrCollectives,
                    format!("{rank_name} never arrived at {operation} ({rule})"),
                ));
            }
            FaultKind::CcExit => {
                // Inside the collective: once the others know the rank is there.
                communicator.wait_for_ranks(deadline)?;
                tracing::error!("{rank_name}: the process exits inside {operation} ({rule})");
                std::process::exit(1);
            }
            FaultKind::CcMismatch => {
                tracing::warn!("{rank_name} calls {operation} with one element more than the other ranks ({rule})");
                return Ok(true);
            }
            _ => {}
        }
        Ok(false)
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
        let failed = |error: NrtError| CoreRun { result: Err(error), device_ticks: None, instructions: 0, flops: 0 };

        let pre = tracer.start(ring, EventType::KblExecPre, ids, Execution::NO_STATUS);
        let bound = bind(&m.name, "input", &program.inputs, program, self.inputs)
            .and_then(|i| Ok((i, bind(&m.name, "output", &program.outputs, program, self.outputs)?)));
        let (input_tensors, output_tensors) = match bound {
            Ok(bound) => bound,
            Err(error) => {
                tracer.stop(&pre, Execution { status: Some(error.status.code()) });
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
        tracer.stop(&pre, Execution::NO_STATUS);

        let running = tracer.span(ring, EventType::NcExecRunning, ids);
        let run_start = ticks();
        if running.tracking_id != 0 {
            tracer.open(At::DeviceNs(tracer.device_ns(slot, run_start)), &running, Execution::NO_STATUS);
        }
        let timeout_ticks = (self.timeout.min(MAX_EXEC_TIMEOUT).as_nanos() as f64 / tracer.ns_per_tick()) as u64;
        // This execution is the rank's next unit: its collectives meet the other ranks' in
        // their executions with the same unit, until the execution's deadline.
        let unit = m.rank.as_ref().map(|(communicator, rank)| {
            (communicator, *rank, communicator.begin(*rank), Instant::now() + self.timeout.min(MAX_EXEC_TIMEOUT))
        });
        // A `cc_` fault strikes the execution's first collective, or the one it names.
        let rank_fault = strikes.iter().find(|s| s.kind.is_rank_fault());
        // For a rank: each engine's busy time (ticks) since its last collective, given
        // to its pace before each collective and at the end (what it did before it
        // arrived: `collectives/flight.rs`); a collective's own interval, reported once
        // it is over, is not busy time.
        let engine_ticks: [Cell<u64>; collectives::flight::ENGINES] = Default::default();
        let collective_reported_next = Cell::new(false);
        let give_engines = |communicator: &Communicator, rank: u32| {
            let ns = std::array::from_fn(|e| tracer.ticks_to_ns(engine_ticks[e].take()));
            communicator.engines_busy(rank, &ns);
        };
        // The outputs a collective counted the NaN and infinities of as it wrote them.
        let counted_outputs = std::cell::RefCell::new(vec![None; program.outputs.len()]);
        let mut run_collective = collective_runner(|step| {
            let Some((communicator, rank, unit, deadline)) = unit else {
                unreachable!("a program with collectives is loaded with a communicator")
            };
            give_engines(communicator, rank);
            collective_reported_next.set(true);
            let index = step.index;
            // An output written in place is checked as it is written where the algorithm
            // can (it counts while the data is in the cache), else after the run.
            let written = step.destination.as_ref().map(|(k, _)| *k).filter(|_| self.check_outputs);
            let counted = Cell::new(None);
            let output = self.collective(
                (communicator, rank, OpPosition { unit, index, count: m.collectives }),
                step,
                (&input_tensors, &output_tensors),
                (deadline, written.map(|_| &counted)),
                rank_fault.filter(|s| index == u32::from(s.rule.at.unwrap_or(0))),
            );
            if let (Some(k), Ok(Output::Written(_)), Some(count)) = (written, &output, counted.get()) {
                counted_outputs.borrow_mut()[k] = Some(count);
            }
            output
        });
        let mut watch = Watch {
            tracer,
            model: m,
            ids,
            at_instruction: m.table_slot.map(|slot| tracer.store().model_at_instruction(slot)),
            engine_ticks: &engine_ticks,
            collective_reported_next: &collective_reported_next,
            device,
            executed: 0,
            flops: 0,
            spans: Vec::with_capacity(match device {
                true => m.instructions.len().max(m.spans_last.load(Ordering::Relaxed)).min(MAX_PENDING_SPANS),
                false => 0,
            }),
        };
        // A stalled core: the execution starts late, on the core's time; a stall as long
        // as the execution timeout is a hang.
        let stall = strikes
            .iter()
            .find(|s| s.kind == FaultKind::Slow)
            .map(|s| s.rule.delay.unwrap_or(crate::fault::DEFAULT_SLOW_DELAY));
        let hang = strikes.iter().any(|s| s.kind == FaultKind::Timeout)
            || stall.is_some_and(|stall| stall >= self.timeout.min(MAX_EXEC_TIMEOUT));
        if let Some(stall) = stall.filter(|_| !hang) {
            std::thread::sleep(stall);
        }
        let results = if hang {
            // The core stops making progress: nothing runs, and the deadline passes.
            drop((values, destinations));
            std::thread::sleep(self.timeout.min(MAX_EXEC_TIMEOUT));
            Err(RunError::DeadlineExceeded { step: 0 })
        } else {
            let deadline_ticks = run_start.saturating_add(timeout_ticks);
            watch.at(0);
            let partition = m.rank.as_ref().map_or(0, |(_, rank)| *rank);
            // The rank's time inside its executions, for what it did before each
            // collective (see `collectives/flight.rs`).
            if let Some((communicator, rank)) = &m.rank {
                communicator.executing(*rank, true);
            }
            let results = crate::backend::as_partition(partition, || {
                m.executable.run(values, destinations, deadline_ticks, self.pool, &mut run_collective, &mut watch)
            });
            if let Some((communicator, rank)) = &m.rank {
                give_engines(communicator, *rank);
                communicator.executing(*rank, false);
            }
            results
        };
        let run_end = ticks();
        let Watch { executed, flops, spans, .. } = watch;
        m.spans_last.store(spans.len(), Ordering::Relaxed);
        if device {
            tracer.emit_instruction_spans(slot, ids, &m.instructions, m.instructions_in_table, &spans);
        }
        let results = results.map_err(|e| match e {
            RunError::DeadlineExceeded { step } => NrtError::new(
                NrtStatus::Timeout,
                format!(
                    "execution of `{}` on nc{} did not finish within NEURON_RT_EXEC_TIMEOUT ({:.3} s): stopped before instruction {step} of {} ({}); {}",
                    m.name,
                    m.core,
                    self.timeout.as_secs_f64(),
                    m.instructions.len(),
                    m.executable.describe_entry(step),
                    if hang {
                        "the core stopped making progress (injected by NEURON_RT_FAULT_INJECT rule `timeout`)"
                    } else {
                        "raise the timeout if the model is expected to take this long"
                    }
                ),
            ),
            RunError::OutOfBounds { step, detail } => {
                let instruction = m.executable.describe_entry(step);
                NrtError::new(
                    NrtStatus::ExecOob,
                    format!(
                        "failed to run scatter/gather (indirect memory copy), due to out-of-bound access: instruction {step} ({instruction}) of `{}` on nc{}: {detail}",
                        m.name, m.core
                    ),
                )
            }
            RunError::OutOfMemory { step, bytes } => NrtError::new(
                NrtStatus::Resource,
                format!(
                    "execution of `{}` on nc{} stopped before instruction {step} ({}): it needs {} of host memory, \
                     which this host cannot allocate now; free tensors, unload models, or raise the address-space limit",
                    m.name,
                    m.core,
                    m.executable.describe_entry(step),
                    crate::memory::HumanBytes(bytes)
                ),
            ),
            RunError::Collective { error, .. } => error,
        });
        // A fault that fails the execution is seen when it completes, as the runtime
        // reads the core's status.
        let failing = strikes.iter().find_map(|s| Some((s, s.kind.failure()?)));
        let results = match (results, failing) {
            (Ok(_), Some((strike, status))) => Err(self.injected_failure(strike, status)),
            (results, _) => results,
        };
        if running.tracking_id != 0 {
            let status = results.as_ref().err().map(|e| e.status.code());
            tracer.close(At::DeviceNs(tracer.device_ns(slot, run_end)), &running, Execution { status });
        }
        let device_ticks = Some(run_end.saturating_sub(run_start));
        let results = match results {
            Ok(results) => results,
            Err(error) => return CoreRun { result: Err(error), device_ticks, instructions: executed, flops },
        };

        let post = tracer.start(ring, EventType::KblExecPost, ids, Execution::NO_STATUS);
        let mut non_finite = 0;
        let mut to_copy = Vec::new();
        let counted = counted_outputs.into_inner();
        for (k, result) in results.into_iter().enumerate() {
            match result {
                Output::Written(view) => {
                    if self.check_outputs {
                        non_finite += counted[k].unwrap_or_else(|| view.non_finite_count());
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
        tracer.stop(&post, Execution::NO_STATUS);
        CoreRun { result: Ok(non_finite), device_ticks, instructions: executed, flops }
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
        let copy = payload::Copy { tensor_id, tensor_name: name_id, bytes };
        self.tracer.instant_at(At::Ticks(end), self.model.ring, event_type, self.ids, copy);
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

/// Sees an execution's instructions as they run: where it is (for what the process
/// says it is doing), each engine's busy time for a rank, the instructions and FLOPs
/// executed, and the intervals to record as device events (once the program stops, or
/// in batches while a long loop runs).
struct Watch<'a> {
    tracer: &'a Tracer,
    model: &'a LoadedModel,
    ids: EventIds,
    /// The model's "at instruction" word: the instruction after the last one done.
    at_instruction: Option<&'a std::sync::atomic::AtomicU32>,
    /// For a rank: each engine's busy time since its last collective (see `run_phases`).
    engine_ticks: &'a [Cell<u64>; collectives::flight::ENGINES],
    collective_reported_next: &'a Cell<bool>,
    device: bool,
    executed: u64,
    flops: u64,
    spans: Vec<InstructionSpan>,
}

impl Watch<'_> {
    /// Says the execution is at trace entry `k`.
    fn at(&self, k: usize) {
        if let Some(at) = self.at_instruction {
            at.store(self.model.instructions.get(k).map_or(0, |i| i.hlo_id), Ordering::Relaxed);
        }
    }

    /// Adds entry `k`'s interval to its engine's busy time, unless it is the collective
    /// reported just now.
    fn busy(&self, k: usize, start: u64, end: u64) {
        if !self.collective_reported_next.replace(false)
            && let Some(busy) =
                self.model.instructions.get(k).and_then(|i| self.engine_ticks.get(usize::from(i.engine)))
        {
            busy.set(busy.get() + end.saturating_sub(start));
        }
    }

    fn record_if_many(&mut self) {
        if self.spans.len() >= MAX_PENDING_SPANS {
            let m = self.model;
            self.tracer.emit_instruction_spans(m.slot, self.ids, &m.instructions, m.instructions_in_table, &self.spans);
            self.spans.clear();
        }
    }
}

impl crate::backend::Observe for Watch<'_> {
    fn instruction(&mut self, k: usize, start: u64, end: u64) {
        self.spans(&[InstructionSpan { entry: k as u32, start, end }]);
    }

    fn spans(&mut self, spans: &[InstructionSpan]) {
        let instructions = &self.model.instructions;
        self.executed += spans.len() as u64;
        self.flops += spans.iter().map(|s| instructions.get(s.entry as usize).map_or(0, |i| i.flops)).sum::<u64>();
        if self.model.rank.is_some() {
            spans.iter().for_each(|s| self.busy(s.entry as usize, s.start, s.end));
        }
        if self.device {
            self.spans.extend_from_slice(spans);
        }
        if let Some(last) = spans.last() {
            self.at(last.entry as usize + 1);
        }
        self.record_if_many();
    }
}

/// `run` as a program's collective runner for the outputs of lifetime `'a` (which a
/// closure's signature cannot name).
fn collective_runner<'a, F>(run: F) -> F
where
    F: FnMut(CollectiveStep<'_, 'a>) -> NrtResult<Output<'a>>,
{
    run
}
