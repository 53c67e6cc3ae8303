//! Asynchronous work (`nrta_*`): requests scheduled on a core's execution units,
//! their sequence numbers, completion and error trackers.

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use crate::collectives::{CollectiveCall, Communicator};
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::fault::Faults;
use crate::nrta::{self, CompletionHandle, ErrorTracker, PendingRead, SeqId, Unit, Xu};
use crate::tensor::{Tensor, TensorSet};
use neuron_datastore::clock::ticks;
use neuron_datastore::counters::core as counter;
use neuron_datastore::event::EventType;
use neuron_datastore::event::payload::Execution;
use neuron_datastore::{At, ErrorClass, EventIds, ExecOutcome};

use super::*;

/// Memory a caller lent to a request until it completes.
struct CallerMemory(NonNull<u8>);

// SAFETY: the lender gave the memory to the request alone until it completes, so the
// worker thread running it may write it.
unsafe impl Send for CallerMemory {}

impl CallerMemory {
    fn start(&self) -> *mut u8 {
        self.0.as_ptr()
    }
}

impl Runtime {
    /// The execution unit `xu` of `core` (started on first use), with the fault state.
    pub(super) fn unit(&self, core: u32, xu: Xu) -> NrtResult<(Arc<Unit>, Arc<Faults>)> {
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
        let ids = EventIds { model_id: m.id, ..EventIds::default() };
        let mut schedule = tracer.span(m.ring, EventType::NrtaExecuteSchedule, ids);
        let (runtime, owned) = (self.clone(), (model.clone(), inputs.clone(), outputs.clone()));
        let work: nrta::Work = Box::new(move |seq| {
            let (model, inputs, outputs) = &owned;
            runtime.execute_as(model, inputs, outputs, seq.0).map(|_| ())
        });
        // The start carries the sequence id, so it is recorded once the id exists and
        // before the worker can record the execution's events.
        let result = self.schedule(m.core, Xu::Compute, tracker, &format!("`{}`", m.name), work, |seq| {
            schedule.ids.nrta_seq_id = seq.0;
            tracer.open(At::Ticks(called), &schedule, Execution::NO_STATUS);
        });
        if result.is_err() && schedule.ids.nrta_seq_id == 0 {
            tracer.open(At::Ticks(called), &schedule, Execution::NO_STATUS);
        }
        tracer.stop(&schedule, Execution { status: result.as_ref().err().map(|e| e.status.code()) });
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

    /// Schedules a read like [`Runtime::tensor_read_schedule`] that copies the bytes
    /// straight into `destination` when it runs (`nrta_tensor_read` of the C API).
    ///
    /// # Safety
    ///
    /// `destination` must be valid for writes of `size` bytes, and not be accessed
    /// otherwise, until the request has completed.
    pub unsafe fn tensor_read_into_schedule(
        &self,
        core: u32,
        tensor: &Tensor,
        offset: u64,
        destination: NonNull<u8>,
        size: u64,
        tracker: Option<&ErrorTracker>,
    ) -> NrtResult<SeqId> {
        self.shared.lifecycle.check()?;
        tensor.check_range("read", offset, size)?;
        let len = usize::try_from(size).map_err(|_| NrtError::invalid("a read that large does not fit in memory"))?;
        let (tensor_owned, destination) = (tensor.clone(), CallerMemory(destination));
        let work: nrta::Work = Box::new(move |seq| {
            // SAFETY: the caller keeps `len` bytes at `destination` for this request alone
            // until it completes, which is after this runs.
            let out = unsafe { std::slice::from_raw_parts_mut(destination.start(), len) };
            tensor_owned.read_as(offset, out, seq.0)
        });
        let what = format!("a read of tensor `{}`", tensor.name());
        self.schedule(core, Xu::TensorRead, tracker, &what, work, |_| {})
    }

    /// Schedules writing `data` into `tensor` at `offset` on `core`'s tensor-write unit
    /// (`nrta_tensor_write`). The bytes are copied now, once the range is known to fit
    /// (`NRT_RESOURCE`, not an abort, when the host cannot hold the copy).
    pub fn tensor_write_schedule(
        &self,
        core: u32,
        tensor: &Tensor,
        offset: u64,
        data: &[u8],
        tracker: Option<&ErrorTracker>,
    ) -> NrtResult<SeqId> {
        self.shared.lifecycle.check()?;
        tensor.check_range("write", offset, data.len() as u64)?;
        let mut owned = Vec::new();
        owned.try_reserve_exact(data.len()).map_err(|_| {
            NrtError::new(NrtStatus::Resource, format!("the host cannot hold a copy of {} bytes to write", data.len()))
        })?;
        owned.extend_from_slice(data);
        let tensor_owned = tensor.clone();
        let work: nrta::Work = Box::new(move |seq| tensor_owned.write_as(offset, &owned, seq.0));
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
        src.check_range("copy", src_offset, size)?;
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
    pub(super) fn schedule(
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

    pub(super) fn scheduled_unit(&self, seq: SeqId) -> NrtResult<Arc<Unit>> {
        self.shared.lifecycle.check()?;
        let running = lock(&self.shared.running);
        let running =
            running.as_ref().ok_or_else(|| NrtError::new(NrtStatus::Closed, "the runtime has been closed"))?;
        lock(&running.units).get(&seq.unit()).cloned().ok_or_else(|| {
            NrtError::invalid(format!("sequence id {:#x} names no execution unit of this runtime", seq.0))
        })
    }
}
