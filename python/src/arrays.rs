//! NumPy arrays as tensor memory: the checks that make an array usable in place (its
//! byte size is the model's, it is C-contiguous, and writeable for outputs), and the
//! description of a model's inputs and outputs that the Python layer converts with.

use std::ptr::NonNull;

use neuron_runtime::isa::{IoTensor, Program};
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::errors::invalid;

/// `(name, hlo_name, dtype, shape)` of one input or output; `dtype` is the HLO name
/// (`f32`, `bf16`, `s32`, `pred`, ...).
pub(crate) type IoInfo = (String, String, String, Vec<u64>);

/// The descriptions of `ios`, inputs or outputs of `program`.
pub(crate) fn io_info(program: &Program, ios: &[IoTensor]) -> Vec<IoInfo> {
    ios.iter()
        .map(|io| {
            let ty = &program.buffers[io.buffer as usize].ty;
            (io.name.clone(), io.hlo_name.clone(), ty.dtype.hlo_name().to_owned(), ty.dims.clone())
        })
        .collect()
}

/// The memory of an array the runtime may use in place for `what` (`input0`, ...) of
/// `bytes` bytes in elements of `element_bytes`: its start, checked to be C-contiguous,
/// of plain elements of that size (never Python objects), the right size, and writeable
/// when `write` is set.
pub(crate) fn array_memory(
    array: &Bound<'_, PyUntypedArray>,
    what: &str,
    bytes: u64,
    element_bytes: u64,
    write: bool,
) -> PyResult<Memory> {
    let dtype = array.dtype();
    if dtype.has_object() || dtype.itemsize() as u64 != element_bytes {
        return Err(invalid(format!("{what}: elements of {dtype} are not the model's {element_bytes}-byte elements")));
    }
    if !array.is_c_contiguous() {
        return Err(invalid(format!("{what}: the array is not C-contiguous; pass np.ascontiguousarray(x)")));
    }
    let itemsize = array.dtype().itemsize() as u64;
    let size = array.len() as u64 * itemsize;
    if size != bytes {
        return Err(invalid(format!(
            "{what}: the array holds {size} bytes ({} of {}) but the model's tensor is {bytes} bytes",
            array.len(),
            array.dtype()
        )));
    }
    // SAFETY: `as_array_ptr` points to the live array object `array` holds; reading its
    // `data` and `flags` fields does not change it.
    let (data, flags) = unsafe {
        let raw = array.as_array_ptr();
        ((*raw).fields.data, (*raw).fields.flags)
    };
    if write && flags & numpy::npyffi::NPY_ARRAY_WRITEABLE == 0 {
        return Err(invalid(format!("{what}: the output array is read-only")));
    }
    Ok(Memory { start: NonNull::new(data.cast::<u8>()).unwrap_or(NonNull::dangling()), len: bytes })
}

/// Bytes of an array, lent to the runtime for one call (the array outlives it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memory {
    pub(crate) start: NonNull<u8>,
    pub(crate) len: u64,
}

// SAFETY: the memory belongs to a NumPy array the calling thread keeps alive for the
// whole call; the runtime reaches it only through the tensor it lends it to.
unsafe impl Send for Memory {}
// SAFETY: as for `Send`: shared references only hand the address on to that tensor.
unsafe impl Sync for Memory {}
