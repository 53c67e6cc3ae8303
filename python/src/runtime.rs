//! `Runtime` and `Model`: a runtime started with the `NEURON_RT_*` environment plus
//! the constructor's overrides, and models executed on NumPy arrays in place, with the
//! GIL released.

use std::sync::Mutex;

use neuron_datastore::topology::CoreSet;
use neuron_runtime::config::CoreRequest;
use neuron_runtime::{Config, InstanceType, NrtResult, TensorSet};
use numpy::PyUntypedArray;
use pyo3::prelude::*;

use crate::arrays::{IoInfo, Memory, array_memory, io_info};
use crate::errors::{invalid, nrt_error};
use crate::neff::Neff;

/// A Neuron runtime holding virtual NeuronCores; tools see it as any runtime process.
#[pyclass(frozen, module = "neuron_virt._native")]
pub(crate) struct Runtime {
    inner: neuron_runtime::Runtime,
}

/// A model loaded on a NeuronCore.
#[pyclass(frozen, module = "neuron_virt._native")]
pub(crate) struct Model {
    runtime: neuron_runtime::Runtime,
    inner: neuron_runtime::Model,
    /// Unloaded already.
    unloaded: Mutex<bool>,
}

/// The cores a `cores=` argument asks for: a count, a list of indices, or text as
/// `NEURON_RT_VISIBLE_CORES` takes it (`"0-1"`).
fn core_request(cores: &Bound<'_, PyAny>, core_count: u32) -> PyResult<CoreRequest> {
    if let Ok(count) = cores.extract::<u32>() {
        return Ok(CoreRequest::Count(count));
    }
    let text = match cores.extract::<String>() {
        Ok(text) => text,
        Err(_) => {
            let list: Vec<u32> = cores.extract().map_err(|_| {
                invalid("cores: give a number of cores, a list of core indices, or text such as \"0-1\"")
            })?;
            list.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        }
    };
    CoreSet::parse(&text, core_count).map(CoreRequest::Visible).map_err(|e| invalid(format!("cores `{text}`: {e}")))
}

#[pymethods]
impl Runtime {
    /// Starts a runtime: the `NEURON_RT_*` and `NEURON_VIRT_*` environment, with
    /// `cores`, `instance_type` and `tag` (the `NEURON_PROCESS_TAG` tools show) overriding it.
    #[new]
    #[pyo3(signature = (*, cores = None, instance_type = None, tag = None))]
    fn new(
        py: Python<'_>,
        cores: Option<&Bound<'_, PyAny>>,
        instance_type: Option<&str>,
        tag: Option<String>,
    ) -> PyResult<Runtime> {
        let mut config = Config::from_env().map_err(nrt_error)?;
        if let Some(name) = instance_type {
            config.instance_type = name.parse::<InstanceType>().map_err(|e| invalid(e.to_string()))?;
        }
        if let Some(cores) = cores {
            config.cores = core_request(cores, config.instance_type.topology().core_count())?;
        }
        if tag.is_some() {
            config.process_tag = tag;
        }
        let inner = py.detach(|| neuron_runtime::Runtime::start(config)).map_err(nrt_error)?;
        Ok(Runtime { inner })
    }

    /// Loads `neff` on NeuronCore `core` (an instance core index), or on the held core
    /// with the fewest models.
    #[pyo3(signature = (neff, *, core = None))]
    fn load(&self, py: Python<'_>, neff: &Neff, core: Option<u32>) -> PyResult<Model> {
        let model = py.detach(|| self.inner.load(&neff.bytes, core)).map_err(nrt_error)?;
        Ok(Model { runtime: self.inner.clone(), inner: model, unloaded: Mutex::new(false) })
    }

    /// The NeuronCores this runtime holds.
    #[getter]
    fn cores(&self) -> PyResult<Vec<u32>> {
        Ok(self.inner.cores().map_err(nrt_error)?.cores().to_vec())
    }

    #[getter]
    fn instance_type(&self) -> &'static str {
        self.inner.topology().instance_type.name()
    }

    /// Where the tools read this runtime from.
    #[getter]
    fn datastore_path(&self) -> PyResult<String> {
        Ok(self.inner.datastore_path().map_err(nrt_error)?.display().to_string())
    }

    /// Unloads every model and releases the NeuronCores.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.close()).map_err(nrt_error)
    }

    fn __repr__(&self) -> String {
        let cores = self.inner.cores().map(|c| c.to_string()).unwrap_or_else(|_| "closed".into());
        format!("<Runtime {} {cores}>", self.inner.topology().instance_type)
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
        &self,
        py: Python<'_>,
        inputs: Vec<Bound<'_, PyUntypedArray>>,
        outputs: Vec<Bound<'_, PyUntypedArray>>,
    ) -> PyResult<()> {
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
        let inputs_count = ins.len();
        // The arrays stay alive in `inputs` and `outputs` for the whole call.
        py.detach(|| self.run_on(&memories, inputs_count)).map_err(nrt_error)
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

impl Model {
    /// Binds the arrays' memory as tensors (the first `inputs_count` are inputs) and
    /// executes.
    fn run_on(&self, memories: &[(String, Memory)], inputs_count: usize) -> NrtResult<()> {
        let (mut inputs, mut outputs) = (TensorSet::new(), TensorSet::new());
        for (k, (name, memory)) in memories.iter().enumerate() {
            // SAFETY: each array outlives this call (the caller holds it), is used by this
            // execution alone while it runs, and spans `len` bytes (checked).
            let tensor = unsafe { self.runtime.attach_buffer(memory.start, memory.len, name)? };
            if k < inputs_count { inputs.add(name, tensor) } else { outputs.add(name, tensor) }
        }
        self.runtime.execute(&self.inner, &inputs, &outputs).map(drop)
    }
}
