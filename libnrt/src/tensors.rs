//! Tensors (`nrt_tensor_*`): allocation on a core's device memory or the host, reads,
//! writes, copies, slices, and tensors over the caller's own buffers.
//!
//! A C tensor handle names a [`CTensor`]: a name and the runtime [`Tensor`] it
//! currently is (none for `nrt_tensor_allocate_empty` until a buffer is attached).
//! Every access is bounds-checked by the runtime: out of range is `NRT_INVALID` and
//! changes nothing.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use neuron_runtime::{NrtError, NrtResult, NrtStatus, Tensor, TensorPlacement};

use crate::boundary::{Status, call, call_value, call_void, invalid, non_null, optional_str, unsupported, write_out};
use crate::handles::Registry;
use crate::state;

/// A tensor as C programs hold it.
#[derive(Debug)]
pub(crate) struct CTensor {
    name: String,
    tensor: RwLock<Option<Tensor>>,
}

pub(crate) static TENSORS: Registry<CTensor> = Registry::new("tensor", 2);

/// Counts `nrt_tensor_attach_buffer` calls: a tensor set built before the last one
/// binds its tensors again, as they may have new memory.
pub(crate) static ATTACH_EPOCH: AtomicU64 = AtomicU64::new(0);

/// Name of a tensor allocated without one.
const UNNAMED: &str = "unnamed";

impl CTensor {
    fn new(name: &str, tensor: Option<Tensor>) -> CTensor {
        CTensor { name: name.to_owned(), tensor: RwLock::new(tensor) }
    }

    /// The runtime tensor, or `NRT_INVALID` when no memory is attached yet.
    pub(crate) fn current(&self) -> NrtResult<Tensor> {
        self.tensor.read().unwrap_or_else(|e| e.into_inner()).clone().ok_or_else(|| {
            NrtError::new(
                NrtStatus::Invalid,
                format!("tensor `{}` has no memory yet; attach a buffer with nrt_tensor_attach_buffer", self.name),
            )
        })
    }
}

/// The runtime tensor of the C handle `handle` (parameter `argument`).
pub(crate) fn tensor(handle: *const c_void, argument: &str) -> NrtResult<Tensor> {
    TENSORS.get(handle, argument)?.current()
}

/// The core whose execution units serve requests on `tensor` (the first held core for
/// host tensors).
pub(crate) fn unit_core(tensor: &Tensor) -> NrtResult<u32> {
    match tensor.placement() {
        TensorPlacement::Device { core } => Ok(core),
        TensorPlacement::Host => state::core_of(&state::runtime()?, 0, "vnc"),
    }
}

/// `bytes` bytes of caller memory at `buf`, or `NRT_INVALID` when `buf` is NULL and
/// `bytes` is not 0.
///
/// # Safety
///
/// `buf` must point to `bytes` readable bytes that stay valid for `'a`.
pub(crate) unsafe fn caller_bytes<'a>(buf: *const c_void, bytes: u64, argument: &str) -> NrtResult<&'a [u8]> {
    let len = caller_length(bytes)?;
    if len == 0 {
        return Ok(&[]);
    }
    let buf = non_null(buf.cast_mut(), argument)?;
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
}

/// As [`caller_bytes`], writable.
///
/// # Safety
///
/// `buf` must point to `bytes` writable bytes that stay valid, and are not accessed
/// otherwise, for `'a`.
pub(crate) unsafe fn caller_bytes_mut<'a>(buf: *mut c_void, bytes: u64, argument: &str) -> NrtResult<&'a mut [u8]> {
    let len = caller_length(bytes)?;
    if len == 0 {
        return Ok(&mut []);
    }
    let buf = non_null(buf, argument)?;
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) })
}

/// A length of caller memory, as a slice may have it (at most `isize::MAX` bytes).
fn caller_length(bytes: u64) -> NrtResult<usize> {
    usize::try_from(bytes)
        .ok()
        .filter(|&len| len <= isize::MAX as usize)
        .ok_or_else(|| invalid("size", format!("is {bytes}, more than this host's address space holds")))
}

/// `NRT_INVALID` when the caller's `len` bytes at `buf` overlap `tensor`'s own memory
/// (as its `nrt_tensor_get_va` address would): the runtime would read and write the
/// same bytes through two views.
pub(crate) fn check_apart(tensor: &Tensor, buf: *const c_void, len: u64, argument: &str) -> NrtResult<()> {
    let (start, end) = (buf as usize as u64, (buf as usize as u64).saturating_add(len));
    let memory = tensor.address() as usize as u64;
    let memory_end = memory.saturating_add(tensor.size());
    if len > 0 && tensor.size() > 0 && start < memory_end && memory < end {
        return Err(invalid(
            argument,
            format!("overlaps the memory of tensor `{}`; copy between tensors with nrt_tensor_copy", tensor.name()),
        ));
    }
    Ok(())
}

const PLACEMENT_DEVICE: u32 = 0;
const PLACEMENT_HOST: u32 = 1;
const PLACEMENT_VIRTUAL: u32 = 2;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_allocate(
    tensor_placement: u32,
    vnc: c_int,
    size: usize,
    name: *const c_char,
    tensor: *mut *mut c_void,
) -> Status {
    call("nrt_tensor_allocate", || {
        non_null(tensor, "tensor")?;
        let name = optional_str(name, "name", UNNAMED)?;
        let runtime = state::runtime()?;
        let placement = match tensor_placement {
            PLACEMENT_DEVICE => TensorPlacement::Device { core: state::core_of(&runtime, i64::from(vnc), "vnc")? },
            PLACEMENT_HOST | PLACEMENT_VIRTUAL => TensorPlacement::Host,
            other => return Err(invalid("tensor_placement", format!("is {other}, not an NRT_TENSOR_PLACEMENT_*"))),
        };
        let allocated = runtime.allocate_tensor(placement, size as u64, name)?;
        write_out(tensor, "tensor", TENSORS.insert(CTensor::new(name, Some(allocated))))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_allocate_empty(name: *const c_char, tensor: *mut *mut c_void) -> Status {
    call("nrt_tensor_allocate_empty", || {
        non_null(tensor, "tensor")?;
        let name = optional_str(name, "name", UNNAMED)?;
        write_out(tensor, "tensor", TENSORS.insert(CTensor::new(name, None)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_free(tensor: *mut *mut c_void) {
    call_void("nrt_tensor_free", || TENSORS.free_through(tensor, "tensor"));
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_attach_buffer(tensor: *mut c_void, buffer: *mut c_void, size: usize) -> Status {
    call("nrt_tensor_attach_buffer", || {
        let c_tensor = TENSORS.get(tensor, "tensor")?;
        let start = NonNull::new(buffer.cast::<u8>()).ok_or_else(|| invalid("buffer", "is NULL"))?;
        // SAFETY: the header makes the caller keep `buffer` valid while the tensor exists
        // and stay off it while the runtime uses it, which is what `attach_buffer` needs.
        let attached = unsafe { state::runtime()?.attach_buffer(start, size as u64, &c_tensor.name)? };
        *c_tensor.tensor.write().unwrap_or_else(|e| e.into_inner()) = Some(attached);
        ATTACH_EPOCH.fetch_add(1, Ordering::Release);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_allocate_slice(
    tensor_source: *const c_void,
    offset: usize,
    size: usize,
    name: *const c_char,
    tensor_slice: *mut *mut c_void,
) -> Status {
    call("nrt_tensor_allocate_slice", || {
        non_null(tensor_slice, "tensor_slice")?;
        let source = tensor(tensor_source, "tensor_source")?;
        let name = optional_str(name, "name", UNNAMED)?;
        let slice = source.slice(offset as u64, size as u64, name)?;
        write_out(tensor_slice, "tensor_slice", TENSORS.insert(CTensor::new(name, Some(slice))))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_read(
    tensor: *const c_void,
    buf: *mut c_void,
    offset: usize,
    size: usize,
) -> Status {
    call("nrt_tensor_read", || {
        let source = self::tensor(tensor, "tensor")?;
        source.check_range("read", offset as u64, size as u64)?;
        check_apart(&source, buf, size as u64, "buf")?;
        // SAFETY: the caller gives `size` writable bytes at `buf` for the call.
        let out = unsafe { caller_bytes_mut(buf, size as u64, "buf")? };
        source.read(offset as u64, out)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_write(
    tensor: *mut c_void,
    buf: *const c_void,
    offset: usize,
    size: usize,
) -> Status {
    call("nrt_tensor_write", || {
        let target = self::tensor(tensor, "tensor")?;
        target.check_range("write", offset as u64, size as u64)?;
        check_apart(&target, buf, size as u64, "buf")?;
        // SAFETY: the caller gives `size` readable bytes at `buf` for the call.
        let data = unsafe { caller_bytes(buf, size as u64, "buf")? };
        target.write(offset as u64, data)
    })
}

/// `nrt_tensor_batch_op_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NrtTensorBatchOp {
    pub offset: u64,
    pub size: u64,
    pub buffer: *mut c_void,
}

/// `nrt_tensor_batch_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NrtTensorBatch {
    pub tensor: *const c_void,
    pub ops: *const NrtTensorBatchOp,
    pub num_ops: u32,
}

/// Runs `op` on every operation of every batch, in order.
///
/// # Safety
///
/// `batches` points to `num_batches` batches whose `ops` point to `num_ops` operations.
unsafe fn each_batch_op(
    batches: *const NrtTensorBatch,
    num_batches: u64,
    mut op: impl FnMut(&Tensor, &NrtTensorBatchOp) -> NrtResult<()>,
) -> NrtResult<()> {
    if num_batches == 0 {
        return Ok(());
    }
    let batches = non_null(batches.cast_mut(), "batches")?;
    let count = usize::try_from(num_batches).map_err(|_| invalid("num_batches", "is too large"))?;
    // SAFETY: the caller's promise.
    let batches = unsafe { std::slice::from_raw_parts(batches, count) };
    for (i, batch) in batches.iter().enumerate() {
        let target = tensor(batch.tensor, &format!("batches[{i}].tensor"))?;
        if batch.num_ops == 0 {
            continue;
        }
        let ops = non_null(batch.ops.cast_mut(), &format!("batches[{i}].ops"))?;
        // SAFETY: the caller's promise.
        for batch_op in unsafe { std::slice::from_raw_parts(ops, batch.num_ops as usize) } {
            op(&target, batch_op)?;
        }
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_read_batch(
    batches: *const NrtTensorBatch,
    num_batches: u64,
    _unsafe: bool,
) -> Status {
    call("nrt_tensor_read_batch", || {
        // SAFETY: the header's contract for `batches`, and each op's buffer holds `size`
        // writable bytes.
        unsafe {
            each_batch_op(batches, num_batches, |tensor, op| {
                tensor.check_range("read", op.offset, op.size)?;
                check_apart(tensor, op.buffer, op.size, "ops[].buffer")?;
                tensor.read(op.offset, caller_bytes_mut(op.buffer, op.size, "ops[].buffer")?)
            })
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_write_batch(
    batches: *const NrtTensorBatch,
    num_batches: u64,
    _unsafe: bool,
) -> Status {
    call("nrt_tensor_write_batch", || {
        // SAFETY: the header's contract for `batches`, and each op's buffer holds `size`
        // readable bytes.
        unsafe {
            each_batch_op(batches, num_batches, |tensor, op| {
                tensor.check_range("write", op.offset, op.size)?;
                check_apart(tensor, op.buffer, op.size, "ops[].buffer")?;
                tensor.write(op.offset, caller_bytes(op.buffer, op.size, "ops[].buffer")?)
            })
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_copy(
    src: *const c_void,
    src_offset: usize,
    dst: *mut c_void,
    dst_offset: usize,
    size: usize,
) -> Status {
    call("nrt_tensor_copy", || {
        let (source, target) = (tensor(src, "src")?, tensor(dst, "dst")?);
        check_same_core(&source, &target)?;
        source.copy_to(src_offset as u64, &target, dst_offset as u64, size as u64)
    })
}

/// Two device tensors must be on the same core to be copied between.
pub(crate) fn check_same_core(source: &Tensor, target: &Tensor) -> NrtResult<()> {
    match (source.placement(), target.placement()) {
        (TensorPlacement::Device { core: a }, TensorPlacement::Device { core: b }) if a != b => Err(NrtError::new(
            NrtStatus::Invalid,
            format!(
                "tensor `{}` is on nc{a} and tensor `{}` on nc{b}: a copy between device tensors stays on one core; copy through a host tensor",
                source.name(),
                target.name()
            ),
        )),
        _ => Ok(()),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_get_size(tensor: *const c_void) -> usize {
    call_value("nrt_tensor_get_size", 0, || {
        let c_tensor = TENSORS.get(tensor, "tensor")?;
        let size = c_tensor.tensor.read().unwrap_or_else(|e| e.into_inner()).as_ref().map_or(0, Tensor::size);
        Ok(size as usize)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_memset(tensor: *mut c_void, offset: u64, value: c_int, size: usize) -> Status {
    call("nrt_tensor_memset", || self::tensor(tensor, "tensor")?.memset(offset, value as u8, size as u64))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_get_va(tensor: *const c_void) -> *mut c_void {
    call_value("nrt_tensor_get_va", std::ptr::null_mut(), || Ok(self::tensor(tensor, "tensor")?.address().cast()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_get_device_allocation_info(
    _tensor: *const c_void,
    _alloc_info: *mut c_void,
) -> Status {
    call("nrt_tensor_get_device_allocation_info", || {
        Err(unsupported("virtual device memory has no physical addresses or HBM placement"))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_check_output_completion(
    _output_tensor: *const c_void,
    _timeout: i64,
    _expected_completion_count: u64,
) -> Status {
    call("nrt_tensor_check_output_completion", || {
        Err(unsupported("output completion counters; wait for the execution with nrt_execute or nrta_is_completed"))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_reset_output_completion(_output_tensor: *mut c_void) -> Status {
    call("nrt_tensor_reset_output_completion", || {
        Err(unsupported("output completion counters; wait for the execution with nrt_execute or nrta_is_completed"))
    })
}
