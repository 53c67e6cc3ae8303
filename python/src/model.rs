//! `Model` and `Request`: executions on NumPy arrays whose memory the runtime reads and
//! writes in place, synchronous (`execute`) or scheduled on the core's compute unit
//! (`schedule`, then `Request.wait`).
//!
//! Arrays lent to a scheduled execution are kept alive by the model until the request
//! has completed, whatever happens to the Python objects that asked for it (a dropped
//! request, a `KeyboardInterrupt` while waiting). Waiting releases the GIL and looks at
//! Python's signals every [`SIGNAL_CHECK`], so Ctrl-C interrupts a long wait promptly.
//! A synchronous execution runs that way too (scheduled, then waited for) until one
//! has been seen to take less than [`SLOW_EXECUTION`]: then it runs directly on the
//! calling thread, which costs a few microseconds less, while a model that takes long
//! stays interruptible. Ctrl-C interrupts the wait, not the execution: the core
//! finishes it, and the runtime stays usable.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use neuron_runtime::{ErrorTracker, NrtError, NrtResult, NrtStatus, SeqId, TensorSet};
use numpy::PyUntypedArray;
use pyo3::exceptions::PyTimeoutError;
use pyo3::prelude::*;

use crate::arrays::{IoInfo, Memory, array_memory, io_info};
use crate::errors::{invalid, nrt_error};

/// How often a wait looks for a pending Ctrl-C.
pub(crate) const SIGNAL_CHECK: Duration = Duration::from_millis(50);
/// Executions longer than this run interruptibly (scheduled, then waited for).
pub(crate) const SLOW_EXECUTION: Duration = Duration::from_millis(100);

/// A model loaded on a NeuronCore.
#[pyclass(frozen, module = "neuron_virt._native")]
pub(crate) struct Model {
    runtime: neuron_runtime::Runtime,
    inner: neuron_runtime::Model,
    tracker: ErrorTracker,
    /// Failures of requests not waited for yet, by sequence id.
    failures: Mutex<HashMap<u64, NrtError>>,
    /// The arrays of requests in flight, kept alive until they complete, in the order
    /// they were scheduled (and complete: one execution unit runs them in order).
    in_flight: Mutex<VecDeque<(SeqId, Vec<Py<PyAny>>)>>,
    /// Executions of this model may take long: run them interruptibly (until one is seen
    /// to be quick).
    slow: AtomicBool,
    unloaded: Mutex<bool>,
}

/// A scheduled execution.
#[pyclass(frozen, module = "neuron_virt._native")]
pub(crate) struct Request {
    model: Py<Model>,
    seq: SeqId,
}

impl Model {
    pub(crate) fn new(runtime: neuron_runtime::Runtime, inner: neuron_runtime::Model) -> PyResult<Model> {
        let tracker = runtime.error_tracker_create(inner.core()).map_err(nrt_error)?;
        Ok(Model {
            runtime,
            inner,
            tracker,
            failures: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(VecDeque::new()),
            slow: AtomicBool::new(true),
            unloaded: Mutex::new(false),
        })
    }

    /// The arrays' memory, checked against the model's inputs and outputs, by name.
    fn memories(
        &self,
        inputs: &[Bound<'_, PyUntypedArray>],
        outputs: &[Bound<'_, PyUntypedArray>],
    ) -> PyResult<Vec<(String, Memory)>> {
        let (ins, outs) = (self.inner.inputs(), self.inner.outputs());
        if inputs.len() != ins.len() || outputs.len() != outs.len() {
            return Err(invalid(format!(
                "model `{}` takes {} inputs and {} outputs; got {} and {}",
                self.inner.name(),
                ins.len(),
                outs.len(),
                inputs.len(),
                outputs.len()
            )));
        }
        let mut memories = Vec::with_capacity(ins.len() + outs.len());
        for (array, io) in inputs.iter().zip(ins) {
            let bytes = self.inner.tensor_type(io).size_bytes().unwrap_or_default();
            memories.push((io.name.clone(), array_memory(array, &io.name, bytes, false)?));
        }
        for (array, io) in outputs.iter().zip(outs) {
            let bytes = self.inner.tensor_type(io).size_bytes().unwrap_or_default();
            memories.push((io.name.clone(), array_memory(array, &io.name, bytes, true)?));
        }
        Ok(memories)
    }

    /// The tensor sets over the arrays' memory.
    fn tensor_sets(&self, memories: &[(String, Memory)]) -> NrtResult<(TensorSet, TensorSet)> {
        let inputs_count = self.inner.inputs().len();
        let (mut inputs, mut outputs) = (TensorSet::new(), TensorSet::new());
        for (k, (name, memory)) in memories.iter().enumerate() {
            // SAFETY: each array outlives the execution (held by the caller for a
            // synchronous one, by `in_flight` for a scheduled one), is used by this
            // execution alone while it runs, and spans `len` bytes (checked).
            let tensor = unsafe { self.runtime.lend_buffer(memory.start, memory.len, name)? };
            if k < inputs_count { inputs.add(name, tensor) } else { outputs.add(name, tensor) }
        }
        Ok((inputs, outputs))
    }

    /// Forgets the arrays of completed requests, and files the tracker's failures.
    fn settle(&self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        while in_flight.front().is_some_and(|(seq, _)| self.runtime.is_completed(*seq).unwrap_or(true)) {
            in_flight.pop_front();
        }
        drop(in_flight);
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        for failure in self.tracker.take() {
            failures.insert(failure.seq_id.0, NrtError::new(failure.status, failure.message));
        }
    }

    fn schedule_arrays(
        this: &Bound<'_, Model>,
        inputs: &[Bound<'_, PyUntypedArray>],
        outputs: &[Bound<'_, PyUntypedArray>],
    ) -> PyResult<Request> {
        let model = this.get();
        let memories = model.memories(inputs, outputs)?;
        let (input_set, output_set) = model.tensor_sets(&memories).map_err(nrt_error)?;
        model.settle();
        let seq = model
            .runtime
            .execute_schedule(&model.inner, &input_set, &output_set, Some(&model.tracker))
            .map_err(nrt_error)?;
        let kept = inputs.iter().chain(outputs).map(|a| a.clone().into_any().unbind()).collect();
        model.in_flight.lock().unwrap_or_else(|e| e.into_inner()).push_back((seq, kept));
        Ok(Request { model: this.clone().unbind(), seq })
    }
}

#[pymethods]
impl Model {
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The NeuronCore it is loaded on.
    #[getter]
    fn core(&self) -> u32 {
        self.inner.core()
    }

    #[getter]
    fn id(&self) -> u32 {
        self.inner.id()
    }

    /// The inputs: `(name, hlo_name, dtype, shape)` each, in order.
    #[getter]
    fn inputs(&self) -> Vec<IoInfo> {
        io_info(self.inner.program(), self.inner.inputs())
    }

    /// The outputs: `(name, hlo_name, dtype, shape)` each, in order.
    #[getter]
    fn outputs(&self) -> Vec<IoInfo> {
        io_info(self.inner.program(), self.inner.outputs())
    }

    /// Runs the model once, reading `inputs` and writing `outputs` in place: NumPy
    /// arrays of the model's dtypes and byte sizes, C-contiguous (outputs writeable).
    /// The GIL is released while it runs.
    fn execute(
        slf: &Bound<'_, Model>,
        inputs: Vec<Bound<'_, PyUntypedArray>>,
        outputs: Vec<Bound<'_, PyUntypedArray>>,
    ) -> PyResult<()> {
        let model = slf.get();
        let started = Instant::now();
        if model.slow.load(Ordering::Relaxed) {
            Model::schedule_arrays(slf, &inputs, &outputs)?.wait_for(slf.py(), None)?;
            if started.elapsed() < SLOW_EXECUTION {
                model.slow.store(false, Ordering::Relaxed);
            }
            return Ok(());
        }
        let memories = model.memories(&inputs, &outputs)?;
        // The arrays stay alive in `inputs` and `outputs` for the whole call.
        let result = slf.py().detach(|| {
            let (input_set, output_set) = model.tensor_sets(&memories)?;
            model.runtime.execute(&model.inner, &input_set, &output_set)
        });
        if started.elapsed() > SLOW_EXECUTION {
            model.slow.store(true, Ordering::Relaxed);
        }
        result.map(drop).map_err(nrt_error)
    }

    /// Schedules one execution on the core's compute unit and returns at once; the
    /// arrays must not be touched until the request has completed. `NrtError` with
    /// `NRT_QUEUE_FULL` when the unit's queue is full.
    fn schedule(
        slf: &Bound<'_, Model>,
        inputs: Vec<Bound<'_, PyUntypedArray>>,
        outputs: Vec<Bound<'_, PyUntypedArray>>,
    ) -> PyResult<Request> {
        Model::schedule_arrays(slf, &inputs, &outputs)
    }

    /// Times `count` executions straight through the Rust runtime, on zero-filled
    /// device tensors bound once, without Python in the loop: the baseline the Python
    /// call overhead is measured against (`bench/python_overhead.py`). Returns each
    /// execution's seconds.
    fn time_executions(&self, py: Python<'_>, count: usize) -> PyResult<Vec<f64>> {
        let placement = neuron_runtime::TensorPlacement::Device { core: self.inner.core() };
        let bind = |ios: &[neuron_runtime::isa::IoTensor]| -> NrtResult<TensorSet> {
            let mut set = TensorSet::new();
            for io in ios {
                set.add(&io.name, self.runtime.allocate_tensor_for(placement, self.inner.tensor_type(io), &io.name)?);
            }
            Ok(set)
        };
        let inputs = bind(self.inner.inputs()).map_err(nrt_error)?;
        let outputs = bind(self.inner.outputs()).map_err(nrt_error)?;
        py.detach(|| {
            (0..count)
                .map(|_| {
                    let started = Instant::now();
                    self.runtime.execute(&self.inner, &inputs, &outputs)?;
                    Ok(started.elapsed().as_secs_f64())
                })
                .collect::<NrtResult<Vec<f64>>>()
        })
        .map_err(nrt_error)
    }

    /// Unloads the model (calls fail with NRT_INVALID_HANDLE afterwards).
    fn unload(&self, py: Python<'_>) -> PyResult<()> {
        let mut unloaded = self.unloaded.lock().unwrap_or_else(|e| e.into_inner());
        if !*unloaded {
            py.detach(|| self.runtime.unload(&self.inner)).map_err(nrt_error)?;
            *unloaded = true;
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("<Model {} (id {}) on nc{}>", self.inner.name(), self.inner.id(), self.inner.core())
    }
}

impl Request {
    /// Waits (GIL released, Ctrl-C honoured) until the request completes, or `timeout`
    /// seconds pass; raises its failure, if it failed.
    fn wait_for(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let model = self.model.get();
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        loop {
            let slice =
                deadline.map_or(SIGNAL_CHECK, |d| d.saturating_duration_since(Instant::now()).min(SIGNAL_CHECK));
            match py.detach(|| model.runtime.wait_sequence(self.seq, slice)) {
                Ok(()) => break,
                Err(error) if error.status == NrtStatus::Timeout => {
                    py.check_signals()?;
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(PyTimeoutError::new_err(format!(
                            "request {:#x} of model `{}` did not complete within {:.3} s",
                            self.seq.0,
                            model.inner.name(),
                            timeout.unwrap_or_default()
                        )));
                    }
                }
                Err(error) => return Err(nrt_error(error)),
            }
        }
        model.settle();
        match model.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.seq.0) {
            Some(failure) => Err(nrt_error(failure)),
            None => Ok(()),
        }
    }
}

#[pymethods]
impl Request {
    /// Whether the request has completed (successfully or not).
    fn done(&self) -> PyResult<bool> {
        self.model.get().runtime.is_completed(self.seq).map_err(nrt_error)
    }

    /// Waits until it completes (at most `timeout` seconds: `TimeoutError`); raises
    /// `NrtError` if it failed. Ctrl-C interrupts the wait, not the execution.
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        self.wait_for(py, timeout)
    }

    /// The request's sequence id (`nrta_seq_t`).
    #[getter]
    fn seq(&self) -> u64 {
        self.seq.0
    }

    fn __repr__(&self) -> String {
        format!("<Request {:#x}>", self.seq.0)
    }
}
