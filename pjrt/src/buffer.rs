//! `PJRT_Buffer`: an array in a NeuronCore's device memory, allocated through the
//! runtime (so the tools' memory figures count it), dense and row-major.

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use neuron_runtime::{Tensor, TensorPlacement};

use crate::client::{Client, Device, Memory};
use crate::error::{Code, Error, Result, call, object};
use crate::event::{Completion, Event};
use crate::ffi::{Head, Of, OfList, OfValue};
use crate::pool::Pool;

/// `PJRT_Buffer_MemoryLayout_Type`.
pub(crate) const LAYOUT_TILED: c_int = 0;
pub(crate) const LAYOUT_STRIDES: c_int = 1;

/// `PJRT_Client_BufferFromHostBuffer_Args`.
#[repr(C)]
pub(crate) struct BufferFromHostArgs {
    pub(crate) head: Head,
    pub(crate) client: *mut Client,
    pub(crate) data: *const c_void,
    pub(crate) element_type: c_int,
    pub(crate) dims: *const i64,
    pub(crate) num_dims: usize,
    pub(crate) byte_strides: *const i64,
    pub(crate) num_byte_strides: usize,
    pub(crate) host_buffer_semantics: c_int,
    pub(crate) device: *mut Device,
    pub(crate) memory: *mut Memory,
    pub(crate) device_layout: *mut MemoryLayout,
    pub(crate) done_with_host_buffer: *mut Event,
    pub(crate) buffer: *mut Buffer,
}

/// `PJRT_Buffer_MemoryLayout_Tiled`; the strides variant shares its first four fields.
#[repr(C)]
pub(crate) struct TiledLayout {
    pub(crate) head: Head,
    pub(crate) minor_to_major: *const i64,
    pub(crate) minor_to_major_size: usize,
    pub(crate) tile_dims: *const i64,
    pub(crate) tile_dim_sizes: *const usize,
    pub(crate) num_tiles: usize,
}

/// `PJRT_Buffer_MemoryLayout`.
#[repr(C)]
pub(crate) struct MemoryLayout {
    pub(crate) head: Head,
    pub(crate) tiled: TiledLayout,
    pub(crate) kind: c_int,
}

/// `PJRT_Buffer_GetMemoryLayout_Args`.
#[repr(C)]
pub(crate) struct GetMemoryLayoutArgs {
    pub(crate) head: Head,
    pub(crate) buffer: *mut Buffer,
    pub(crate) layout: MemoryLayout,
}

/// `PJRT_Buffer_ToHostBuffer_Args`.
#[repr(C)]
pub(crate) struct ToHostArgs {
    pub(crate) head: Head,
    pub(crate) src: *mut Buffer,
    pub(crate) host_layout: *mut MemoryLayout,
    pub(crate) dst: *mut c_void,
    pub(crate) dst_size: usize,
    pub(crate) event: *mut Event,
}

/// `PJRT_Buffer_CopyToDevice_Args` and `PJRT_Buffer_CopyToMemory_Args`.
#[repr(C)]
pub(crate) struct CopyToArgs<T> {
    pub(crate) head: Head,
    pub(crate) buffer: *mut Buffer,
    pub(crate) destination: *mut T,
    pub(crate) dst_buffer: *mut Buffer,
}

/// `PJRT_Buffer_CopyRawToHost_Args`.
#[repr(C)]
pub(crate) struct CopyRawToHostArgs {
    pub(crate) head: Head,
    pub(crate) buffer: *mut Buffer,
    pub(crate) dst: *mut c_void,
    pub(crate) offset: i64,
    pub(crate) transfer_size: i64,
    pub(crate) event: *mut Event,
}

/// `PJRT_Buffer_Type` numbers.
pub(crate) mod element {
    pub(crate) const PRED: i32 = 1;
    pub(crate) const F64: i32 = 12;

    pub(crate) const BF16: i32 = 13;
    pub(crate) const C64: i32 = 14;
    pub(crate) const C128: i32 = 15;

    /// Bytes per element, for the types with whole-byte elements.
    pub(crate) fn size(element_type: i32) -> Option<u64> {
        Some(match element_type {
            PRED | 2 | 6 | 16..=20 => 1,
            3 | 7 | 10 | BF16 => 2,
            4 | 8 | 11 => 4,
            5 | 9 | F64 | C64 => 8,
            C128 => 16,
            _ => return None,
        })
    }

    /// The PJRT type of an XLA `PrimitiveType` (the numbering differs from BF16 on).
    pub(crate) fn from_primitive(primitive: i32) -> Option<i32> {
        Some(match primitive {
            1..=12 => primitive,
            16 => BF16,
            15 => C64,
            18 => C128,
            _ => return None,
        })
    }
}

/// What a `PJRT_Buffer*` points to.
pub(crate) struct Buffer {
    pub(crate) tensor: Tensor,
    pub(crate) element_type: c_int,
    pub(crate) dims: Vec<i64>,
    /// Row-major: the last dimension is the most minor.
    minor_to_major: Vec<i64>,
    pub(crate) device: *mut Device,
    deleted: AtomicBool,
    /// Done when the buffer's contents are (they are written before it is handed out).
    ready: Arc<Completion>,
    /// Where its tensor goes back when the buffer is destroyed, for the next array of
    /// the same kind.
    pool: Option<Arc<Pool>>,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.give(self.tensor.clone());
        }
    }
}

// SAFETY: `device` points to a device of a client, which outlives its buffers and is
// never mutated; the tensor is shared-safe.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    pub(crate) fn new(
        tensor: Tensor,
        element_type: c_int,
        dims: Vec<i64>,
        device: *mut Device,
        pool: Option<Arc<Pool>>,
    ) -> Buffer {
        let ready = Completion::new();
        ready.complete(None);
        let minor_to_major = (0..dims.len() as i64).rev().collect();
        Buffer { tensor, element_type, dims, minor_to_major, device, deleted: AtomicBool::new(false), ready, pool }
    }

    /// The tensor, unless the buffer was deleted.
    pub(crate) fn live_tensor(&self) -> Result<&Tensor> {
        if self.deleted.load(Ordering::Acquire) {
            return Err(Error::new(Code::FailedPrecondition, "the buffer has been deleted"));
        }
        Ok(&self.tensor)
    }

    fn bytes(&self) -> u64 {
        self.tensor.size()
    }
}

/// The byte size of an array of `element_type` and `dims`, refusing what cannot exist.
pub(crate) fn array_bytes(element_type: c_int, dims: &[i64]) -> Result<u64> {
    let size = element::size(element_type)
        .ok_or_else(|| Error::new(Code::Unimplemented, format!("buffers of PJRT element type {element_type}")))?;
    dims.iter().try_fold(size, |bytes, &d| {
        u64::try_from(d)
            .ok()
            .and_then(|d| bytes.checked_mul(d))
            .ok_or_else(|| Error::invalid(format!("bad dimensions {dims:?}")))
    })
}

/// A tensor of `bytes` in the device memory of `device` (a tensor is never empty: an
/// empty array keeps one byte).
pub(crate) fn allocate(client: &Client, device: &Device, bytes: u64, name: &str) -> Result<Tensor> {
    let core = device.core.ok_or_else(|| Error::invalid("the device is not one of this process's"))?;
    Ok(client.pool.take(&client.runtime, core, bytes, None, name)?)
}

/// # Safety
/// `slice` reads `len` values from `pointer` unless `len` is 0.
unsafe fn slice<'a, T>(pointer: *const T, len: usize) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if pointer.is_null() {
        return Err(Error::invalid("an array argument is NULL"));
    }
    // SAFETY: as the caller promises.
    Ok(unsafe { std::slice::from_raw_parts(pointer, len) })
}

/// `bytes` of a host array with `byte_strides` gathered into row-major order.
fn gather_strided(data: *const u8, element: usize, dims: &[i64], strides: &[i64]) -> Vec<u8> {
    let count: i64 = dims.iter().product();
    let mut out = Vec::with_capacity(count as usize * element);
    let mut index = vec![0i64; dims.len()];
    for _ in 0..count {
        let offset: i64 = index.iter().zip(strides).map(|(i, s)| i * s).sum();
        // SAFETY: the caller's host array covers every index its strides reach.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(data.offset(offset as isize), element) });
        for axis in (0..dims.len()).rev() {
            index[axis] += 1;
            if index[axis] < dims[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    out
}

pub(crate) unsafe extern "C" fn from_host(args: *mut BufferFromHostArgs) -> *mut Error {
    call("PJRT_Client_BufferFromHostBuffer", args, |args| {
        // SAFETY: a client this plugin made.
        let client = unsafe { object("client", args.client) }?;
        let device = if !args.device.is_null() {
            args.device
        } else if !args.memory.is_null() {
            // SAFETY: a memory this plugin made.
            unsafe { object("memory", args.memory) }?.device
        } else {
            return Err(Error::invalid("neither a device nor a memory was given"));
        };
        let device = client.addressable_device(device)?;
        // SAFETY: the caller's arrays of the sizes it gives.
        let dims = unsafe { slice(args.dims, args.num_dims) }?.to_vec();
        let bytes = array_bytes(args.element_type, &dims)?;
        if bytes > 0 && args.data.is_null() {
            return Err(Error::invalid("the host data is NULL"));
        }
        let tensor = allocate(client, device, bytes, "pjrt buffer")?;
        // SAFETY: as above.
        let strides = unsafe { slice(args.byte_strides, args.num_byte_strides) }?;
        let element = element::size(args.element_type).unwrap_or(1) as usize;
        let dense: Vec<i64> = dense_strides(&dims, element as i64);
        if bytes > 0 {
            if strides.is_empty() || strides == dense.as_slice() {
                // SAFETY: a dense host array of `bytes` bytes.
                let data = unsafe { std::slice::from_raw_parts(args.data.cast::<u8>(), bytes as usize) };
                tensor.write(0, data)?;
            } else {
                if strides.len() != dims.len() {
                    return Err(Error::invalid(format!(
                        "{} byte strides for {} dimensions",
                        strides.len(),
                        dims.len()
                    )));
                }
                tensor.write(0, &gather_strided(args.data.cast(), element, &dims, strides))?;
            }
        }
        // The host data was copied before this returns.
        args.done_with_host_buffer = Event::done(None);
        let device_pointer = device as *const Device as *mut Device;
        let pool = Some(Arc::clone(&client.pool));
        args.buffer = Box::into_raw(Box::new(Buffer::new(tensor, args.element_type, dims, device_pointer, pool)));
        Ok(())
    })
}

fn dense_strides(dims: &[i64], element: i64) -> Vec<i64> {
    let mut strides = vec![0; dims.len()];
    let mut stride = element;
    for axis in (0..dims.len()).rev() {
        strides[axis] = stride;
        stride *= dims[axis].max(1);
    }
    strides
}

pub(crate) unsafe extern "C" fn destroy(args: *mut Of<Buffer>) -> *mut Error {
    call("PJRT_Buffer_Destroy", args, |args| {
        if !args.object.is_null() {
            // SAFETY: a buffer this plugin made, destroyed once by its owner.
            drop(unsafe { Box::from_raw(args.object) });
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn element_type(args: *mut OfValue<Buffer, c_int>) -> *mut Error {
    call("PJRT_Buffer_ElementType", args, |args| {
        // SAFETY: a buffer this plugin made.
        args.value = unsafe { object("buffer", args.object) }?.element_type;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn dimensions(args: *mut OfList<Buffer, i64>) -> *mut Error {
    call("PJRT_Buffer_Dimensions", args, |args| {
        // SAFETY: a buffer this plugin made; its dimensions live as long as it.
        let buffer = unsafe { object("buffer", args.object) }?;
        (args.list, args.count) = (buffer.dims.as_ptr().cast(), buffer.dims.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn unpadded_dimensions(args: *mut OfList<Buffer, i64>) -> *mut Error {
    call("PJRT_Buffer_UnpaddedDimensions", args, |args| {
        // SAFETY: as above.
        let buffer = unsafe { object("buffer", args.object) }?;
        (args.list, args.count) = (buffer.dims.as_ptr().cast(), buffer.dims.len());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn dynamic_dimension_indices(args: *mut OfList<Buffer, usize>) -> *mut Error {
    call("PJRT_Buffer_DynamicDimensionIndices", args, |args| {
        // SAFETY: a buffer this plugin made; no dimension is dynamic.
        unsafe { object("buffer", args.object) }?;
        (args.list, args.count) = (std::ptr::null(), 0);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn memory_layout(args: *mut GetMemoryLayoutArgs) -> *mut Error {
    call("PJRT_Buffer_GetMemoryLayout", args, |args| {
        // SAFETY: a buffer this plugin made.
        let buffer = unsafe { object("buffer", args.buffer) }?;
        let head = || Head { struct_size: std::mem::size_of::<TiledLayout>(), extension_start: std::ptr::null_mut() };
        args.layout = MemoryLayout {
            head: Head { struct_size: std::mem::size_of::<MemoryLayout>(), extension_start: std::ptr::null_mut() },
            tiled: TiledLayout {
                head: head(),
                minor_to_major: buffer.minor_to_major.as_ptr(),
                minor_to_major_size: buffer.minor_to_major.len(),
                tile_dims: std::ptr::null(),
                tile_dim_sizes: std::ptr::null(),
                num_tiles: 0,
            },
            kind: LAYOUT_TILED,
        };
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn on_device_size(args: *mut OfValue<Buffer, usize>) -> *mut Error {
    call("PJRT_Buffer_OnDeviceSizeInBytes", args, |args| {
        // SAFETY: a buffer this plugin made.
        args.value = array_bytes_of(unsafe { object("buffer", args.object) }?) as usize;
        Ok(())
    })
}

fn array_bytes_of(buffer: &Buffer) -> u64 {
    array_bytes(buffer.element_type, &buffer.dims).unwrap_or_else(|_| buffer.bytes())
}

pub(crate) unsafe extern "C" fn device(args: *mut OfValue<Buffer, *mut Device>) -> *mut Error {
    call("PJRT_Buffer_Device", args, |args| {
        // SAFETY: a buffer this plugin made.
        args.value = unsafe { object("buffer", args.object) }?.device;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn memory(args: *mut OfValue<Buffer, *mut Memory>) -> *mut Error {
    call("PJRT_Buffer_Memory", args, |args| {
        // SAFETY: a buffer this plugin made, on a device of a live client.
        let buffer = unsafe { object("buffer", args.object) }?;
        args.value = unsafe { &mut *(*buffer.device).memory as *mut Memory };
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn delete(args: *mut Of<Buffer>) -> *mut Error {
    call("PJRT_Buffer_Delete", args, |args| {
        // SAFETY: a buffer this plugin made.
        unsafe { object("buffer", args.object) }?.deleted.store(true, Ordering::Release);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn is_deleted(args: *mut OfValue<Buffer, bool>) -> *mut Error {
    call("PJRT_Buffer_IsDeleted", args, |args| {
        // SAFETY: a buffer this plugin made.
        args.value = unsafe { object("buffer", args.object) }?.deleted.load(Ordering::Acquire);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn is_on_cpu(args: *mut OfValue<Buffer, bool>) -> *mut Error {
    call("PJRT_Buffer_IsOnCpu", args, |args| {
        // SAFETY: a buffer this plugin made: device memory, not the host's.
        unsafe { object("buffer", args.object) }?;
        args.value = false;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn ready_event(args: *mut OfValue<Buffer, *mut Event>) -> *mut Error {
    call("PJRT_Buffer_ReadyEvent", args, |args| {
        // SAFETY: a buffer this plugin made.
        args.value = Event::handle(&unsafe { object("buffer", args.object) }?.ready);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn unsafe_pointer(args: *mut OfValue<Buffer, usize>) -> *mut Error {
    call("PJRT_Buffer_UnsafePointer", args, |args| {
        // SAFETY: a buffer this plugin made.
        args.value = unsafe { object("buffer", args.object) }?.live_tensor()?.address() as usize;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn external_reference(args: *mut Of<Buffer>) -> *mut Error {
    call("PJRT_Buffer_IncreaseExternalReferenceCount", args, |args| {
        // SAFETY: a buffer this plugin made; its memory never moves while it lives.
        unsafe { object("buffer", args.object) }?.live_tensor()?;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn to_host(args: *mut ToHostArgs) -> *mut Error {
    call("PJRT_Buffer_ToHostBuffer", args, |args| {
        // SAFETY: a buffer this plugin made.
        let buffer = unsafe { object("buffer", args.src) }?;
        let bytes = array_bytes_of(buffer);
        if args.dst.is_null() {
            args.dst_size = bytes as usize;
            return Ok(());
        }
        if (args.dst_size as u64) < bytes {
            return Err(Error::invalid(format!(
                "the host buffer holds {} bytes; the array needs {bytes}",
                args.dst_size
            )));
        }
        // SAFETY: the caller's layout, if any.
        if let Some(layout) = unsafe { args.host_layout.as_ref() } {
            check_host_layout(layout, buffer)?;
        }
        let tensor = buffer.live_tensor()?;
        if bytes > 0 {
            // SAFETY: the caller's buffer of `dst_size` bytes.
            let out = unsafe { std::slice::from_raw_parts_mut(args.dst.cast::<u8>(), bytes as usize) };
            tensor.read(0, out)?;
        }
        args.event = Event::done(None);
        Ok(())
    })
}

/// A host layout other than the buffer's own (dense row-major) is not converted.
fn check_host_layout(layout: &MemoryLayout, buffer: &Buffer) -> Result<()> {
    let ours = match layout.kind {
        LAYOUT_TILED => {
            // SAFETY: the caller's array of `minor_to_major_size` values.
            let order = unsafe { slice(layout.tiled.minor_to_major, layout.tiled.minor_to_major_size) }?;
            layout.tiled.num_tiles == 0 && (order.is_empty() || order == buffer.minor_to_major.as_slice())
        }
        LAYOUT_STRIDES => {
            // The strides variant: `{ head; const int64_t* byte_strides; size_t count; }`.
            let strides = unsafe { slice(layout.tiled.minor_to_major, layout.tiled.minor_to_major_size) }?;
            let element = element::size(buffer.element_type).unwrap_or(1) as i64;
            strides == dense_strides(&buffer.dims, element).as_slice()
        }
        other => return Err(Error::invalid(format!("unknown memory layout type {other}"))),
    };
    if ours {
        Ok(())
    } else {
        Err(Error::unimplemented("PJRT_Buffer_ToHostBuffer", " for host layouts other than dense row-major"))
    }
}

pub(crate) unsafe extern "C" fn copy_raw_to_host(args: *mut CopyRawToHostArgs) -> *mut Error {
    call("PJRT_Buffer_CopyRawToHost", args, |args| {
        // SAFETY: a buffer this plugin made.
        let buffer = unsafe { object("buffer", args.buffer) }?;
        let (offset, size) = (u64::try_from(args.offset), u64::try_from(args.transfer_size));
        let (Ok(offset), Ok(size)) = (offset, size) else {
            return Err(Error::invalid("a negative offset or size"));
        };
        if args.dst.is_null() && size > 0 {
            return Err(Error::invalid("the destination is NULL"));
        }
        if size > 0 {
            // SAFETY: the caller's buffer of `transfer_size` bytes.
            let out = unsafe { std::slice::from_raw_parts_mut(args.dst.cast::<u8>(), size as usize) };
            buffer.live_tensor()?.read(offset, out)?;
        }
        args.event = Event::done(None);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn copy_to_device(args: *mut CopyToArgs<Device>) -> *mut Error {
    call("PJRT_Buffer_CopyToDevice", args, |args| {
        // SAFETY: a buffer this plugin made, and a device of the same client.
        let buffer = unsafe { object("buffer", args.buffer) }?;
        let device = unsafe { object("device", args.destination) }?;
        args.dst_buffer = copy(buffer, device)?;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn copy_to_memory(args: *mut CopyToArgs<Memory>) -> *mut Error {
    call("PJRT_Buffer_CopyToMemory", args, |args| {
        // SAFETY: a buffer this plugin made, and a memory of the same client.
        let buffer = unsafe { object("buffer", args.buffer) }?;
        let memory = unsafe { object("memory", args.destination) }?;
        args.dst_buffer = copy(buffer, unsafe { object("device", memory.device) }?)?;
        Ok(())
    })
}

fn copy(buffer: &Buffer, device: &Device) -> Result<*mut Buffer> {
    let core = device.core.ok_or_else(|| Error::invalid("the device is not one of this process's"))?;
    let source = buffer.live_tensor()?;
    let runtime = crate::client::shared_runtime()?;
    let tensor = runtime.allocate_tensor(TensorPlacement::Device { core }, source.size(), "pjrt buffer")?;
    source.copy_to(0, &tensor, 0, source.size())?;
    let device = device as *const Device as *mut Device;
    Ok(Box::into_raw(Box::new(Buffer::new(tensor, buffer.element_type, buffer.dims.clone(), device, None))))
}
