//! The exceptions: `NrtError` for every runtime failure (with `.status`, the public
//! `NRT_STATUS` name, and `.code`, its number), `CompileError` for HLO the compiler
//! refuses (its message names the operator and the line).

use neuron_runtime::{CompileError as RustCompileError, NrtError as RustNrtError};
use pyo3::prelude::*;

pyo3::create_exception!(
    neuron_virt,
    NrtError,
    pyo3::exceptions::PyRuntimeError,
    "A Neuron runtime call failed: `.status` is the NRT_STATUS name (NRT_EXEC_BAD_INPUT, ...), `.code` its number."
);
pyo3::create_exception!(
    neuron_virt,
    CompileError,
    pyo3::exceptions::PyValueError,
    "The compiler refused the HLO: the message names the operator and the line."
);

/// The Python exception of a runtime error, with its status name and code.
pub(crate) fn nrt_error(error: RustNrtError) -> PyErr {
    Python::attach(|py| {
        let exception = NrtError::new_err(format!("{}: {}", error.status, error.message));
        let value = exception.value(py);
        // Setting attributes on a fresh exception object cannot fail short of memory.
        let _ = value.setattr("status", error.status.name());
        let _ = value.setattr("code", error.code());
        exception
    })
}

pub(crate) fn compile_error(error: RustCompileError) -> PyErr {
    CompileError::new_err(error.to_string())
}

/// `NrtError` with status `NRT_INVALID` for a bad argument from Python.
pub(crate) fn invalid(message: impl Into<String>) -> PyErr {
    nrt_error(RustNrtError::new(neuron_runtime::NrtStatus::Invalid, message))
}
