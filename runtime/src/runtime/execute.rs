//! Synchronous execution: a model's tensors bound, the core job run, its outcome
//! counted.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::config::NumericalErrorsVerbosity;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::tensor::TensorSet;
use crate::trace::classify;
use neuron_datastore::clock::ticks;
use neuron_datastore::counters::{core as counter, model as model_field};
use neuron_datastore::event::payload::{self, Execution};
use neuron_datastore::event::{DmaQueueType, EventType};
use neuron_datastore::{At, EventIds, ExecOutcome, INSTRUCTION_BYTES, Tracer};

use super::core_job::{CoreJob, CoreRun, tracer_duration};
use super::*;

impl Runtime {
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
        let execute = tracer.span(m.ring, EventType::NrtExecute, ids);
        tracer.open(At::Ticks(called), &execute, Execution::NO_STATUS);
        if let Some(slot) = m.table_slot {
            tracer.store().model_counter(slot, model_field::RUNNING).fetch_add(1, Ordering::Relaxed);
        }
        let wait = tracer.start(m.ring, EventType::KblExecWait, ids, Execution::NO_STATUS);
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
        let kmgr = tracer.start(m.ring, EventType::KmgrExecCore, ids, Execution::NO_STATUS);
        let busy = core_locks.get(&m.core).map(|l| l.lock().unwrap_or_else(|e| e.into_inner()));
        let outcome = pool.run(|| {
            job.switch_model();
            job.tracer.stop(&kmgr, Execution::NO_STATUS);
            job.run()
        });
        drop(busy);
        let ran = outcome.unwrap_or_else(|panic| {
            let error = NrtError::new(NrtStatus::Failure, format!("execution failed inside the backend: {}", panic.0));
            let notify = payload::HwNotify {
                status: error.status.code() as i32,
                message: tracer.store().intern(&error.message),
            };
            tracer.instant(m.ring, EventType::HwNotify, ids, notify);
            CoreRun { result: Err(error), device_ticks: None, instructions: 0, flops: 0 }
        });
        let mut result = ran.result.map(|numerical_errors| ExecutionReport {
            total_latency: Duration::ZERO,
            device_latency: tracer_duration(&tracer, ran.device_ticks.unwrap_or(0)),
            numerical_errors,
            flops: ran.flops,
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
        tracer.stop(&wait, Execution::NO_STATUS);
        let returned = ticks();
        let total_ticks = returned.saturating_sub(called);
        tracer.stop(&execute, Execution { status });
        // Counted after its last event: a reader that sees the counters grow finds the
        // whole execution in the ring (`neuron-profile inspect` on failure relies on it).
        let work = (ran.device_ticks, ran.instructions, ran.flops);
        self.count_execution(&tracer, m, ids.exec_id, &result, work, (total_ticks, returned));
        let mut report = result?;
        report.total_latency = tracer_duration(&tracer, total_ticks);
        tracing::debug!(model = %m.name, latency_us = report.total_latency.as_micros() as u64, "executed");
        Ok(report)
    }

    /// Adds one execution to the core's and the model's counters.
    pub(super) fn count_execution(
        &self,
        tracer: &Tracer,
        m: &LoadedModel,
        exec_id: u64,
        result: &NrtResult<ExecutionReport>,
        (device_ticks, instructions, flops): (Option<u64>, u64, u64),
        (total_ticks, returned): (u64, u64),
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
            tracer.add(slot, counter::FLOPS, flops);
            tracer.add(slot, counter::DMA_BYTES + DmaQueueType::Output as u64, m.output_bytes);
        }
        let total_ns = tracer.ticks_to_ns(total_ticks);
        tracer.store().record_latency(slot, true, total_ns);
        // The example of its latency range (and of its error class) that a metric can
        // name, as it returns.
        let exemplar = neuron_datastore::exemplar::Execution {
            exec_id,
            model_id: m.id,
            status: result.as_ref().err().map_or(0, |e| e.status.code()),
            latency_ns: total_ns,
            at_ticks: returned,
        };
        tracer.store().record_exemplar(slot, &exemplar, class);
        if let Some(table_slot) = m.table_slot {
            tracer.store().record_model_latency(table_slot, total_ns);
            tracer.store().model_counter(table_slot, model_field::EXECUTIONS).fetch_add(1, Ordering::Relaxed);
            tracer.store().model_counter(table_slot, model_field::RUNNING).fetch_sub(1, Ordering::Relaxed);
        }
    }
}
