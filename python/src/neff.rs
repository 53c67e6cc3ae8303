//! `compile(hlo, ...)` and `Neff`: HLO text to a NEFF with the `neuron-cc` options.

use neuron_runtime::compile::{ShardedValue, Sharding, compile_hlo_sharded};
use neuron_runtime::{AutoCast, AutoCastType, CompileOptions, OptLevel, Target};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::arrays::{IoInfo, io_info};
use crate::errors::{compile_error, invalid, nrt_error};

/// A compiled program (a NEFF), ready to load.
#[pyclass(frozen, module = "neuron_virt._native")]
pub(crate) struct Neff {
    pub(crate) bytes: Vec<u8>,
    pub(crate) inner: neuron_runtime::Neff,
    /// How a multi-device program (`jax.shard_map`, `jax.pmap`) splits its values over
    /// its mesh, when compiled here from its HLO (a NEFF file does not say).
    sharding: Option<Sharding>,
}

fn parse<T: std::str::FromStr<Err = String>>(what: &str, text: &str) -> PyResult<T> {
    text.parse().map_err(|e: String| invalid(format!("{what} `{text}`: {e}")))
}

/// Compiles HLO text (as `jax.jit(f).lower(...).as_text(dialect="hlo")` prints it) into a
/// NEFF, with the options of `neuron-cc compile`.
#[pyfunction]
#[pyo3(signature = (hlo, *, name = "model", target = "trn1", auto_cast = "matmult", auto_cast_type = "bf16", optlevel = 2, mixed_precision_accumulation = false, saturate_infinity = false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn compile(
    py: Python<'_>,
    hlo: &str,
    name: &str,
    target: &str,
    auto_cast: &str,
    auto_cast_type: &str,
    optlevel: u8,
    mixed_precision_accumulation: bool,
    saturate_infinity: bool,
) -> PyResult<Neff> {
    let options = CompileOptions {
        target: parse::<Target>("target", target)?,
        auto_cast: parse::<AutoCast>("auto_cast", auto_cast)?,
        auto_cast_type: parse::<AutoCastType>("auto_cast_type", auto_cast_type)?,
        optlevel: parse::<OptLevel>("optlevel", &optlevel.to_string())?,
        mixed_precision_accumulation,
        saturate_infinity,
    };
    let (program, sharding) = py.detach(|| compile_hlo_sharded(hlo, &options)).map_err(compile_error)?;
    let inner = neuron_runtime::Neff::new(name, program);
    Ok(Neff { bytes: inner.encode(), inner, sharding })
}

#[pymethods]
impl Neff {
    /// A NEFF from its bytes (as `to_bytes` or `neuron-cc` wrote them).
    #[staticmethod]
    fn from_bytes(bytes: &[u8]) -> PyResult<Neff> {
        let options = neuron_runtime::neff::DecodeOptions { validate_hash: true };
        let inner = neuron_runtime::Neff::decode(bytes, options).map_err(nrt_error)?;
        Ok(Neff { bytes: bytes.to_vec(), inner, sharding: None })
    }

    /// Writes the NEFF to `path` (a file `neuron-bench` and `neuron-profile` take).
    fn save(&self, path: std::path::PathBuf) -> PyResult<()> {
        std::fs::write(&path, &self.bytes).map_err(|e| invalid(format!("cannot write {}: {e}", path.display())))
    }

    /// Reads a NEFF file (as `save` or `neuron-cc compile` wrote it).
    #[staticmethod]
    fn load(path: std::path::PathBuf) -> PyResult<Neff> {
        let bytes = std::fs::read(&path).map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
        Neff::from_bytes(&bytes)
    }

    /// The NEFF file's bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.bytes)
    }

    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The inputs: `(name, hlo_name, dtype, shape)` each, in order.
    #[getter]
    fn inputs(&self) -> Vec<IoInfo> {
        io_info(&self.inner.program, &self.inner.program.inputs)
    }

    /// The outputs: `(name, hlo_name, dtype, shape)` each, in order.
    #[getter]
    fn outputs(&self) -> Vec<IoInfo> {
        io_info(&self.inner.program, &self.inner.program.outputs)
    }

    /// For a multi-device program (`jax.shard_map`, `jax.pmap`) compiled here, how it
    /// splits its values over its mesh: `{"mesh": [(axis, size), …], "inputs": […],
    /// "outputs": […]}`, each value given per dimension as the mesh axes it is split
    /// over (`[["dp"], []]`); the program is one rank's, mesh device `d` being rank `d`.
    /// `None` for a program of one device, or one read from a file.
    #[getter]
    fn sharding<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(sharding) = &self.sharding else { return Ok(None) };
        let dict = PyDict::new(py);
        dict.set_item("mesh", &sharding.mesh)?;
        let axes = |values: &[ShardedValue]| values.iter().map(|v| v.axes.clone()).collect::<Vec<_>>();
        dict.set_item("inputs", axes(&sharding.inputs))?;
        dict.set_item("outputs", axes(&sharding.outputs))?;
        Ok(Some(dict))
    }

    fn __repr__(&self) -> String {
        format!(
            "<Neff {} ({} inputs, {} outputs, {} bytes)>",
            self.inner.name,
            self.inner.program.inputs.len(),
            self.inner.program.outputs.len(),
            self.bytes.len()
        )
    }
}
