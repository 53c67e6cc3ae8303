//! `Runtime`: a runtime started with the `NEURON_RT_*` environment plus the
//! constructor's overrides.

use neuron_datastore::topology::CoreSet;
use neuron_runtime::config::CoreRequest;
use neuron_runtime::{Config, InstanceType};
use pyo3::prelude::*;

use crate::errors::{invalid, nrt_error};
use crate::model::Model;
use crate::neff::Neff;

/// A Neuron runtime holding virtual NeuronCores; tools see it as any runtime process.
#[pyclass(frozen, module = "neuron_virt._native")]
pub(crate) struct Runtime {
    pub(crate) inner: neuron_runtime::Runtime,
}

/// The cores a `cores=` argument asks for: a count, a list of indices, or text as
/// `NEURON_RT_VISIBLE_CORES` takes it (`"0-1"`).
fn core_request(cores: &Bound<'_, PyAny>, core_count: u32) -> PyResult<CoreRequest> {
    if let Ok(count) = cores.extract::<u32>() {
        if count == 0 || count > core_count {
            return Err(invalid(format!(
                "cores={count}: a runtime holds 1 to {core_count} NeuronCores on this instance type"
            )));
        }
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

/// The runtime this process's framework plugin (torch-xla's `PJRT_DEVICE=NEURON`) runs
/// on, started on first use: models loaded on it share the NeuronCores torch-xla holds.
#[pyfunction]
pub(crate) fn framework_runtime(py: Python<'_>) -> PyResult<Runtime> {
    let inner = py.detach(neuronpjrt::process_runtime).map_err(nrt_error)?;
    Ok(Runtime { inner })
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
        if let Some(tag) = &tag {
            neuron_runtime::config::check_process_tag(tag).map_err(|why| invalid(format!("tag: {why}")))?;
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
        Model::new(self.inner.clone(), model)
    }

    /// Loads `neff` once per core of `cores` (instance core indices), as collectives
    /// ranks 0, 1, … in that order (`nrt_load_collectives`); the ranks' models in rank
    /// order.
    fn load_collectives(&self, py: Python<'_>, neff: &Neff, cores: Vec<u32>) -> PyResult<Vec<Model>> {
        let models = py.detach(|| self.inner.load_collectives(&neff.bytes, &cores)).map_err(nrt_error)?;
        models.into_iter().map(|model| Model::new(self.inner.clone(), model)).collect()
    }

    /// Loads `neff` on NeuronCore `core` as rank `rank` of `count` ranks spread over the
    /// job's processes (`nrt_load_collectives` with `NEURON_RT_ROOT_COMM_ID` set): every
    /// process loads the ranks it holds, rank 0's process listens at that address and
    /// the others connect to it; the ranks' collectives meet once all are loaded.
    fn load_collectives_across(
        &self,
        py: Python<'_>,
        neff: &Neff,
        core: u32,
        rank: u32,
        count: u32,
    ) -> PyResult<Model> {
        let model =
            py.detach(|| self.inner.load_collectives_across(&neff.bytes, core, rank, count)).map_err(nrt_error)?;
        Model::new(self.inner.clone(), model)
    }

    /// The global ranks that `cores` NeuronCores of this process hold in the job its
    /// launcher started (torchrun, `mpirun`, Slurm, Neuron's PJRT variables), one per
    /// core, and the job's rank count; `None` for a process on its own.
    fn job_ranks(&self, cores: u32) -> PyResult<Option<(Vec<u32>, u32)>> {
        let Some(launch) = &self.inner.config().launch else { return Ok(None) };
        let (ranks, count) = launch.ranks(cores).map_err(nrt_error)?;
        Ok(Some((ranks.collect(), count)))
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
