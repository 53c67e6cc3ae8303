//! Models (`nrt_load`, `nrt_unload`, introspection) and synchronous execution.

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use neuron_runtime::collectives::Communicator;
use neuron_runtime::{DType, Model, NrtError, NrtResult, NrtStatus, Runtime};

use crate::boundary::{Status, c_chars, call, invalid, non_null, write_out, write_versioned};
use crate::handles::Registry;
use crate::sets::SETS;
use crate::state;

/// A loaded model as C programs hold it, with the runtime that loaded it.
#[derive(Debug)]
pub(crate) struct CModel {
    pub(crate) runtime: Runtime,
    pub(crate) model: Model,
}

pub(crate) static MODELS: Registry<CModel> = Registry::new("model", 1);

/// A collectives program loaded rank by rank: its NEFF's hash, first core and ranks.
type CollectiveProgram = (u64, u32, u32);

/// The communicators of collectives programs loaded rank by rank.
static COMMUNICATORS: Mutex<Option<HashMap<CollectiveProgram, Communicator>>> = Mutex::new(None);

/// The model of handle `model`.
pub(crate) fn model(handle: *const c_void) -> NrtResult<Arc<CModel>> {
    MODELS.get(handle, "model")
}

/// Forgets the communicators of the closed runtime.
pub(crate) fn forget_communicators() {
    *COMMUNICATORS.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The NEFF bytes the caller passed.
///
/// # Safety
///
/// `neff_bytes` points to `size` readable bytes for the call.
unsafe fn neff<'a>(neff_bytes: *const c_void, size: usize) -> NrtResult<&'a [u8]> {
    let start = non_null(neff_bytes.cast_mut(), "neff_bytes")?;
    if size == 0 {
        return Err(invalid("size", "is 0: a NEFF is not empty"));
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(start.cast::<u8>(), size) })
}

/// `vnc_count` is deprecated: -1 or 1 (0 is taken as 1, as older callers pass it).
fn check_vnc_count(vnc_count: i32) -> NrtResult<()> {
    match vnc_count {
        -1..=1 => Ok(()),
        n => Err(invalid("vnc_count", format!("is {n}: a model uses one NeuronCore here; pass -1"))),
    }
}

/// The core `vnc` names for a load; `NRT_LOAD_NOT_ENOUGH_NC` when the process does not
/// hold it.
fn load_core(runtime: &Runtime, vnc: i64) -> NrtResult<Option<u32>> {
    if vnc == -1 {
        return Ok(None);
    }
    if vnc < 0 {
        return Err(NrtError::new(
            NrtStatus::LoadNotEnoughNc,
            format!("vnc {vnc} is not a NeuronCore: give one of this process's cores (0 or more), or -1 for any"),
        ));
    }
    let held = runtime.cores()?;
    match usize::try_from(vnc).ok().and_then(|v| held.cores().get(v)) {
        Some(&core) => Ok(Some(core)),
        None => Err(NrtError::new(
            NrtStatus::LoadNotEnoughNc,
            format!("NeuronCore(s) not available - Requested:nc{vnc}-nc{vnc} Available:{}", held.len()),
        )),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_load(
    neff_bytes: *const c_void,
    size: usize,
    vnc: i32,
    vnc_count: i32,
    model: *mut *mut c_void,
) -> Status {
    call("nrt_load", || {
        non_null(model, "model")?;
        check_vnc_count(vnc_count)?;
        // SAFETY: the header's contract for `neff_bytes`.
        let bytes = unsafe { neff(neff_bytes, size)? };
        let runtime = state::runtime()?;
        let loaded = runtime.load(bytes, load_core(&runtime, i64::from(vnc))?)?;
        write_out(model, "model", MODELS.insert(CModel { runtime, model: loaded }))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_load_collectives(
    neff_bytes: *const c_void,
    size: usize,
    vnc: i32,
    vnc_count: i32,
    ctx_device_id: u32,
    ctx_device_count: u32,
    model: *mut *mut c_void,
) -> Status {
    call("nrt_load_collectives", || {
        non_null(model, "model")?;
        check_vnc_count(vnc_count)?;
        if ctx_device_count == 0 || ctx_device_id >= ctx_device_count {
            return Err(invalid(
                "ctx_device_id",
                format!("is {ctx_device_id}, not a rank of {ctx_device_count} (0 to ctx_device_count - 1)"),
            ));
        }
        // SAFETY: the header's contract for `neff_bytes`.
        let bytes = unsafe { neff(neff_bytes, size)? };
        let runtime = state::runtime()?;
        if runtime.config().root_comm.is_some() {
            // A job of processes: this process holds some of the ranks, the root
            // introduces it to the others.
            let core = crate::ranks::rank_core(&runtime, i64::from(vnc), ctx_device_id)?;
            let loaded = runtime.load_collectives_across(bytes, core, ctx_device_id, ctx_device_count)?;
            return write_out(model, "model", MODELS.insert(CModel { runtime, model: loaded }));
        }
        let held = runtime.cores()?.len() as u32;
        if ctx_device_count > held {
            return Err(NrtError::new(
                NrtStatus::LoadNotEnoughNc,
                format!("{ctx_device_count} ranks need as many NeuronCores; this process holds {held}"),
            ));
        }
        let vnc = if vnc == -1 { i64::from(ctx_device_id) } else { i64::from(vnc) };
        let base = vnc - i64::from(ctx_device_id);
        if base < 0 {
            return Err(invalid(
                "vnc",
                format!("is {vnc}, below rank {ctx_device_id}: rank r runs on vnc (vnc - ctx_device_id + r)"),
            ));
        }
        let cores = (0..i64::from(ctx_device_count))
            .map(|rank| load_core(&runtime, base + rank).map(|core| core.unwrap_or_default()))
            .collect::<NrtResult<Vec<u32>>>()?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut hasher);
        let key = (hasher.finish(), cores[0], ctx_device_count);
        let communicator = {
            let mut groups = COMMUNICATORS.lock().unwrap_or_else(|e| e.into_inner());
            let groups = groups.get_or_insert_with(HashMap::new);
            match groups.get(&key) {
                Some(communicator) => communicator.clone(),
                None => {
                    let communicator = runtime.communicator(&cores)?;
                    groups.insert(key, communicator.clone());
                    communicator
                }
            }
        };
        let core = cores[ctx_device_id as usize];
        let loaded = runtime.load_collective_rank(bytes, core, &communicator, ctx_device_id)?;
        write_out(model, "model", MODELS.insert(CModel { runtime, model: loaded }))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_unload(model: *mut c_void) -> Status {
    call("nrt_unload", || {
        let c_model = MODELS.get(model, "model")?;
        let unloaded = c_model.runtime.unload(&c_model.model);
        // After nrt_close the model is gone with its runtime: the handle goes too.
        if unloaded.as_ref().is_ok() || unloaded.as_ref().is_err_and(|e| e.status == NrtStatus::Closed) {
            MODELS.remove(model, "model")?;
        }
        unloaded
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_nc_count(model: *const c_void, vnc_count: *mut u32) -> Status {
    call("nrt_get_model_nc_count", || {
        self::model(model)?;
        write_out(vnc_count, "vnc_count", 1)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_vnc_count(model: *const c_void, vnc_count: *mut u32) -> Status {
    call("nrt_get_model_vnc_count", || {
        self::model(model)?;
        write_out(vnc_count, "vnc_count", 1)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_instance_count(model: *mut c_void, instance_count: *mut u32) -> Status {
    call("nrt_get_model_instance_count", || {
        self::model(model)?;
        write_out(instance_count, "instance_count", 1)
    })
}

/// `nrt_model_info_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NrtModelInfo {
    pub vnc: u32,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_info(
    model: *const c_void,
    info: *mut NrtModelInfo,
    info_size_in: usize,
    info_size_out: *mut usize,
) -> Status {
    call("nrt_get_model_info", || {
        let c_model = self::model(model)?;
        let value = NrtModelInfo { vnc: state::vnc_of(&c_model.runtime, c_model.model.core())? };
        let written = write_versioned(info, info_size_in, "info", &value)?;
        if !info_size_out.is_null() {
            write_out(info_size_out, "info_size_out", written)?;
        }
        Ok(())
    })
}

/// `nrt_tensor_info_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NrtTensorInfo {
    pub name: [c_char; 256],
    pub usage: u32,
    pub size: usize,
    pub dtype: u32,
    pub shape: *mut u32,
    pub ndim: u32,
}

/// `nrt_tensor_info_array_t`: a count, then that many infos.
#[repr(C)]
#[derive(Debug)]
pub struct NrtTensorInfoArray {
    pub tensor_count: u64,
    pub tensor_array: [NrtTensorInfo; 0],
}

const USAGE_INPUT: u32 = 0;
const USAGE_OUTPUT: u32 = 1;

/// The arrays `nrt_get_model_tensor_info` handed out and not freed yet, with their
/// tensors' shape arrays (address and length): what freeing them releases, kept here
/// rather than read back from memory the caller can write.
static TENSOR_INFOS: Mutex<Option<HashMap<usize, Vec<ShapeAllocation>>>> = Mutex::new(None);

/// The address and length of one tensor's shape array.
type ShapeAllocation = (usize, usize);

/// `nrt_dtype_t` of an element type (`pred` is stored as one byte, 0 or 1).
fn nrt_dtype(dtype: DType) -> u32 {
    match dtype {
        DType::U64 => 0x1,
        DType::S8 => 0x2,
        DType::U8 | DType::Pred => 0x3,
        DType::S16 => 0x4,
        DType::U16 => 0x5,
        DType::BF16 => 0x6,
        DType::F16 => 0x7,
        DType::S32 => 0x8,
        DType::U32 => 0x9,
        DType::F32 => 0xA,
        DType::S64 => 0xC,
    }
}

fn info_layout(count: usize) -> NrtResult<Layout> {
    Layout::new::<NrtTensorInfoArray>()
        .extend(Layout::array::<NrtTensorInfo>(count).map_err(|_| invalid("model", "has too many tensors"))?)
        .map(|(layout, _)| layout.pad_to_align())
        .map_err(|_| invalid("model", "has too many tensors"))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_tensor_info(
    model: *mut c_void,
    tensor_info: *mut *mut NrtTensorInfoArray,
) -> Status {
    call("nrt_get_model_tensor_info", || {
        non_null(tensor_info, "tensor_info")?;
        let c_model = self::model(model)?;
        let m = &c_model.model;
        let tensors: Vec<NrtTensorInfo> = m
            .inputs()
            .iter()
            .map(|io| (io, USAGE_INPUT))
            .chain(m.outputs().iter().map(|io| (io, USAGE_OUTPUT)))
            .map(|(io, usage)| {
                let ty = m.tensor_type(io);
                let shape: Box<[u32]> = ty.dims.iter().map(|&d| u32::try_from(d).unwrap_or(u32::MAX)).collect();
                NrtTensorInfo {
                    name: c_chars(&io.name),
                    usage,
                    size: ty.size_bytes().unwrap_or_default() as usize,
                    dtype: nrt_dtype(ty.dtype),
                    ndim: shape.len() as u32,
                    shape: Box::into_raw(shape).cast::<u32>(),
                }
            })
            .collect();
        let layout = info_layout(tensors.len())?;
        // SAFETY: the layout is not zero-sized (it holds the count).
        let array = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<NrtTensorInfoArray>();
        if array.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `array` is a fresh allocation with room for the count and
        // `tensors.len()` infos after it, laid out as `NrtTensorInfoArray` says.
        unsafe {
            (&raw mut (*array).tensor_count).write(tensors.len() as u64);
            let first = (&raw mut (*array).tensor_array).cast::<NrtTensorInfo>();
            std::ptr::copy_nonoverlapping(tensors.as_ptr(), first, tensors.len());
        }
        let shapes = tensors.iter().map(|t| (t.shape as usize, t.ndim as usize)).collect();
        TENSOR_INFOS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(array as usize, shapes);
        write_out(tensor_info, "tensor_info", array)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_free_model_tensor_info(tensor_info: *mut NrtTensorInfoArray) -> Status {
    call("nrt_free_model_tensor_info", || {
        let array = non_null(tensor_info, "tensor_info")?;
        let shapes = TENSOR_INFOS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .and_then(|live| live.remove(&(array as usize)))
            .ok_or_else(|| {
                NrtError::new(
                    NrtStatus::InvalidHandle,
                    format!(
                        "argument `tensor_info` ({array:p}) did not come from nrt_get_model_tensor_info, or was freed already"
                    ),
                )
            })?;
        let layout = info_layout(shapes.len())?;
        // SAFETY: `array` and the shapes are live allocations this library made with
        // these layouts (the registry above says so), freed once: the entry is gone.
        unsafe {
            for (shape, ndim) in shapes {
                drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(shape as *mut u32, ndim)));
            }
            std::alloc::dealloc(array.cast(), layout);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_execute(model: *mut c_void, input_set: *const c_void, output_set: *mut c_void) -> Status {
    call("nrt_execute", || execute(model, input_set, output_set, 1))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_execute_repeat(
    model: *mut c_void,
    input_set: *const c_void,
    output_set: *mut c_void,
    repeat_count: c_int,
) -> Status {
    call("nrt_execute_repeat", || {
        let times = u32::try_from(repeat_count)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| invalid("repeat_count", format!("is {repeat_count}; run at least once")))?;
        execute(model, input_set, output_set, times)
    })
}

fn execute(model: *mut c_void, input_set: *const c_void, output_set: *mut c_void, times: u32) -> NrtResult<()> {
    let c_model = self::model(model)?;
    let inputs = SETS.get(input_set, "input_set")?.bound("input_set")?;
    let outputs = SETS.get(output_set, "output_set")?.bound("output_set")?;
    for _ in 0..times {
        c_model.runtime.execute(&c_model.model, &inputs, &outputs)?;
    }
    Ok(())
}
