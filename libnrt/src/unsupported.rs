//! Functions of the public headers that mean nothing on virtual NeuronCores (EFA,
//! dma-buf, physical device memory, microcode): they
//! exist so that programs link, check their arguments no further, and return
//! `NRT_INVALID` with a log line saying why — never a crash.

use std::ffi::{c_char, c_int, c_void};

use crate::boundary::{Status, call, call_value, non_null, unsupported};

#[unsafe(no_mangle)]
pub extern "C" fn nrt_get_dmabuf_fd(_va: u64, _size: u64, _fd: *mut c_int) -> Status {
    call("nrt_get_dmabuf_fd", || Err(unsupported("virtual device memory is not registered for EFA peer direct")))
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_host_device_id_rid_map_get(_count: *mut u32, _host_did_to_rid_map: *mut u32) -> Status {
    call("nrt_host_device_id_rid_map_get", || Err(unsupported("virtual devices have no routing ids")))
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_get_hbm_mmap_va(
    _device_id: c_int,
    _hbm_idx: c_int,
    _addr: *mut *mut c_void,
    _size: *mut usize,
) -> Status {
    call("nrt_get_hbm_mmap_va", || {
        Err(unsupported("virtual device memory has no HBM regions to map; use nrt_tensor_get_va"))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_get_attached_efa_bdf(_va: *const c_void, _efa_bdf: *mut c_char, _len: *mut usize) -> Status {
    call("nrt_get_attached_efa_bdf", || Err(unsupported("virtual devices have no attached EFA devices")))
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_set_pool_eng_ucode(_ucode_info: *const c_void) -> Status {
    call("nrt_set_pool_eng_ucode", || Err(unsupported("virtual engines run no microcode")))
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_register_async_exec_callback(
    _callback: Option<unsafe extern "C" fn()>,
    _params: *mut c_void,
) -> Status {
    call("nrt_register_async_exec_callback", || {
        Err(unsupported(
            "the callback form of asynchronous execution; schedule with nrta_execute_schedule and track errors with nrta_error_tracker_*",
        ))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_libnccl_net(
    err: *mut c_int,
    err_msg: *mut c_char,
    err_msg_size: usize,
) -> *mut c_void {
    const REASON: &str = "not supported on virtual NeuronCores: there is no NCCL network plugin";
    call_value("nrt_get_libnccl_net", std::ptr::null_mut(), || {
        if !err.is_null() {
            // SAFETY: a non-NULL `err` points to the caller's int.
            unsafe { err.write(1) };
        }
        if !err_msg.is_null() && err_msg_size > 0 {
            let bytes = REASON.len().min(err_msg_size - 1);
            // SAFETY: the caller gives `err_msg_size` writable bytes at `err_msg`.
            unsafe {
                std::ptr::copy_nonoverlapping(REASON.as_ptr(), err_msg.cast::<u8>(), bytes);
                err_msg.add(bytes).write(0);
            }
        }
        Ok(std::ptr::null_mut())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_memcpy_to_device(dest: *mut c_void, src: *const c_void, size: usize) -> Status {
    call("nrt_memcpy_to_device", || {
        if size == 0 {
            return Ok(());
        }
        let dest = non_null(dest, "dest")?;
        let src = non_null(src.cast_mut(), "src")?;
        // SAFETY: the header requires `dest` to be memory from nrt_tensor_get_va with
        // `size` bytes left, and `src` to hold `size` readable bytes.
        unsafe { std::ptr::copy(src.cast::<u8>(), dest.cast::<u8>(), size) };
        Ok(())
    })
}
