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
    in_flight: Mutex<VecDeque<InFlight>>,
    /// Executions of this model may take long: run them interruptibly (until one is seen
    /// to be quick).
    slow: AtomicBool,
    unloaded: AtomicBool,
}

/// A request in flight: its arrays, and the memory ranges it writes.
struct InFlight {
    seq: SeqId,
    /// Held to keep the arrays' memory alive.
    _arrays: Vec<Py<PyAny>>,
    writes: Vec<(usize, usize)>,
}

/// Requests of models that went away before their requests completed: their arrays
/// live on here until a completion is seen, however the model was dropped.
static ORPHANS: Mutex<Vec<(neuron_runtime::Runtime, InFlight)>> = Mutex::new(Vec::new());

impl Drop for Model {
    fn drop(&mut self) {
        let left: Vec<InFlight> = self.in_flight.get_mut().unwrap_or_else(|e| e.into_inner()).drain(..).collect();
        if !left.is_empty() {
            let mut orphans = ORPHANS.lock().unwrap_or_else(|e| e.into_inner());
            orphans.extend(left.into_iter().map(|entry| (self.runtime.clone(), entry)));
        }
    }
}

/// Forgets the orphaned requests seen completed (their arrays are dropped once the
/// lock is released: dropping an array may run Python code).
fn settle_orphans() {
    let done: Vec<(neuron_runtime::Runtime, InFlight)> = {
        let mut orphans = ORPHANS.lock().unwrap_or_else(|e| e.into_inner());
        let (done, pending) = std::mem::take(&mut *orphans)
            .into_iter()
            .partition(|(runtime, entry)| runtime.is_completed(entry.seq).unwrap_or(false));
        *orphans = pending;
        done
    };
    drop(done);
}

/// `NRT_INVALID` when two of the memory ranges overlap and one of them is written.
fn check_apart(ranges: &[(usize, usize, bool, &str)]) -> PyResult<()> {
    for (i, &(start, end, writes, name)) in ranges.iter().enumerate() {
        for &(other_start, other_end, other_writes, other_name) in &ranges[..i] {
            if (writes || other_writes) && start < other_end && other_start < end {
                return Err(invalid(format!(
                    "{name} and {other_name} share memory and one of them is written: pass separate arrays"
                )));
            }
        }
    }
    Ok(())
}

/// A scheduled execution.
#[pyclass(frozen, module = "neuron_virt._native")]
pub(crate) struct Request {
    model: Py<Model>,
    seq: SeqId,
    /// Its failure, or none, once waited for (a second wait gives the same answer).
    outcome: Mutex<Option<Option<NrtError>>>,
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
            unloaded: AtomicBool::new(false),
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
            let ty = self.inner.tensor_type(io);
            let memory =
                array_memory(array, &io.name, ty.size_bytes().unwrap_or_default(), ty.dtype.size_bytes(), false)?;
            memories.push((io.name.clone(), memory));
        }
        for (array, io) in outputs.iter().zip(outs) {
            let ty = self.inner.tensor_type(io);
            let memory =
                array_memory(array, &io.name, ty.size_bytes().unwrap_or_default(), ty.dtype.size_bytes(), true)?;
            memories.push((io.name.clone(), memory));
        }
        let inputs_count = ins.len();
        let ranges: Vec<(usize, usize, bool, &str)> = memories
            .iter()
            .enumerate()
            .map(|(k, (name, m))| {
                let start = m.start.as_ptr() as usize;
                (start, start + m.len as usize, k >= inputs_count, name.as_str())
            })
            .collect();
        check_apart(&ranges)?;
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
        let mut done = Vec::new();
        {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            while in_flight.front().is_some_and(|entry| self.runtime.is_completed(entry.seq).unwrap_or(false)) {
                done.extend(in_flight.pop_front());
            }
        }
        // Dropped once the lock is released: dropping an array may run Python code.
        drop(done);
        settle_orphans();
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        for failure in self.tracker.take() {
            failures.insert(failure.seq_id.0, NrtError::new(failure.status, failure.message));
        }
    }

    /// Schedules an execution on the arrays; the outer error is about the arrays, the
    /// inner one the runtime's refusal to schedule (`NRT_QUEUE_FULL`, ...).
    fn schedule_arrays(
        this: &Bound<'_, Model>,
        inputs: &[Bound<'_, PyUntypedArray>],
        outputs: &[Bound<'_, PyUntypedArray>],
    ) -> PyResult<NrtResult<Request>> {
        let model = this.get();
        let memories = model.memories(inputs, outputs)?;
        model.settle();
        let inputs_count = model.inner.inputs().len();
        let ranges = |from: usize| -> Vec<(usize, usize)> {
            memories[from..]
                .iter()
                .map(|(_, m)| (m.start.as_ptr() as usize, m.start.as_ptr() as usize + m.len as usize))
                .collect()
        };
        let (touched, writes) = (ranges(0), ranges(inputs_count));
        let busy =
            model.in_flight.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|entry| {
                entry.writes.iter().any(|&(start, end)| touched.iter().any(|&(s, e)| s < end && start < e))
            });
        if busy {
            return Err(invalid(
                "an array of this request is written by a request of this model still in flight: pass separate arrays",
            ));
        }
        let (input_set, output_set) = model.tensor_sets(&memories).map_err(nrt_error)?;
        let seq = match model.runtime.execute_schedule(&model.inner, &input_set, &output_set, Some(&model.tracker)) {
            Ok(seq) => seq,
            Err(error) => return Ok(Err(error)),
        };
        let arrays = inputs.iter().chain(outputs).map(|a| a.clone().into_any().unbind()).collect();
        model.in_flight.lock().unwrap_or_else(|e| e.into_inner()).push_back(InFlight { seq, _arrays: arrays, writes });
        Ok(Ok(Request { model: this.clone().unbind(), seq, outcome: Mutex::new(None) }))
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
            match Model::schedule_arrays(slf, &inputs, &outputs)? {
                Ok(request) => {
                    request.wait_for(slf.py(), None)?;
                    if started.elapsed() < SLOW_EXECUTION {
                        model.slow.store(false, Ordering::Relaxed);
                    }
                    return Ok(());
                }
                // The unit's queue is full of scheduled requests: run on this thread.
                Err(error) if error.status == NrtStatus::QueueFull => {}
                Err(error) => return Err(nrt_error(error)),
            }
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
        Model::schedule_arrays(slf, &inputs, &outputs)?.map_err(nrt_error)
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
        if self.unloaded.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        py.detach(|| self.runtime.unload(&self.inner)).map_err(|error| {
            self.unloaded.store(false, Ordering::Release);
            nrt_error(error)
        })
    }

    fn __repr__(&self) -> String {
        format!("<Model {} (id {}) on nc{}>", self.inner.name(), self.inner.id(), self.inner.core())
    }
}

impl Request {
    /// Waits (GIL released, Ctrl-C honoured) until the request completes, or `timeout`
    /// seconds pass; raises its failure, if it failed.
    fn wait_for(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        if let Some(outcome) = self.outcome.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return outcome.clone().map_or(Ok(()), |failure| Err(nrt_error(failure)));
        }
        let model = self.model.get();
        // A timeout too large for a deadline is no timeout.
        let deadline = timeout
            .and_then(|t| Duration::try_from_secs_f64(t.max(0.0)).ok())
            .and_then(|t| Instant::now().checked_add(t));
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
        let failure = model.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.seq.0);
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(failure.clone());
        failure.map_or(Ok(()), |failure| Err(nrt_error(failure)))
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
