//! `neuron_virt._native`: the Rust side of the `neuron_virt` Python package.
//!
//! It exposes the runtime as Python sees it — `compile` and `Neff`, `Runtime`, `Model`
//! — and raises every runtime failure as `NrtError` carrying the public status name and
//! code. The friendly layer (`jit`, array conversion, pytrees) is Python, in
//! `neuron_virt/`; this module takes arrays already of the model's dtype and C order,
//! and executes with the GIL released, reading inputs and writing outputs in place in
//! the NumPy arrays' memory.
//!
//! The library also carries the PJRT plugin (`neuron-pjrt`): it exports `GetPjrtApi`,
//! and `libneuronxla.libneuronpjrt_path()` names this file, so that torch-xla and
//! `neuron_virt` share one runtime per process.

mod arrays;
mod errors;
mod model;
mod neff;
mod observe;
mod runtime;

use pyo3::prelude::*;

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("NrtError", py.get_type::<errors::NrtError>())?;
    module.add("CompileError", py.get_type::<errors::CompileError>())?;
    module.add_function(wrap_pyfunction!(neff::compile, module)?)?;
    module.add_class::<neff::Neff>()?;
    module.add_class::<runtime::Runtime>()?;
    module.add_function(wrap_pyfunction!(runtime::framework_runtime, module)?)?;
    module.add_class::<model::Model>()?;
    module.add_class::<model::Request>()?;
    module.add_class::<observe::Profile>()?;
    module.add_function(wrap_pyfunction!(observe::sys_trace_start, module)?)?;
    module.add_function(wrap_pyfunction!(observe::sys_trace_stop, module)?)?;
    module.add_function(wrap_pyfunction!(observe::sys_trace_fetch_events, module)?)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
