//! Asynchronous requests (`nrta_*`): tensor reads, writes and copies, executions,
//! completion, and error trackers, over the runtime's execution units.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, IntoRawFd};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::Duration;

use neuron_runtime::{ErrorTracker, NrtError, NrtResult, NrtStatus, SeqId, Xu};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::boundary::{Status, c_status, call, call_void, invalid, non_null, unsupported, write_out};
use crate::handles::Registry;
use crate::models;
use crate::sets::SETS;
use crate::state;
use crate::tensors::{caller_bytes, check_apart, check_same_core, tensor, unit_core};

/// `nrta_error_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NrtaError {
    pub seq_id: u64,
    pub error_code: u64,
}

/// An error tracker as C programs hold it, with the list it last returned.
#[derive(Debug)]
pub(crate) struct CTracker {
    tracker: ErrorTracker,
    returned: Mutex<Vec<NrtaError>>,
}

pub(crate) static TRACKERS: Registry<CTracker> = Registry::new("error tracker", 4);

/// How long a completion handle's waiter waits for its request: requests complete or
/// fail long before (NEURON_RT_EXEC_TIMEOUT is at most a week).
const COMPLETION_WAIT: Duration = Duration::from_secs(8 * 24 * 3600);

/// The tracker of handle `err`, which may be NULL.
fn tracker(err: *mut c_void) -> NrtResult<Option<ErrorTracker>> {
    if err.is_null() {
        return Ok(None);
    }
    Ok(Some(TRACKERS.get(err, "err")?.tracker.clone()))
}

/// Only queue 0 exists.
fn check_queue(queue: c_int) -> NrtResult<()> {
    if queue == 0 { Ok(()) } else { Err(invalid("queue", format!("is {queue}; each execution unit has queue 0 only"))) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_tensor_write(
    tensor: *mut c_void,
    buf: *const c_void,
    offset: u64,
    size: u64,
    queue: c_int,
    err: *mut c_void,
    req_sequence: *mut u64,
) -> Status {
    call("nrta_tensor_write", || {
        non_null(req_sequence, "req_sequence")?;
        check_queue(queue)?;
        let target = self::tensor(tensor, "tensor")?;
        // Before the caller's bytes are viewed: their claimed size is what is checked.
        target.check_range("write", offset, size)?;
        check_apart(&target, buf, size, "buf")?;
        // SAFETY: the caller gives `size` readable bytes at `buf`; the runtime copies them
        // before returning.
        let data = unsafe { caller_bytes(buf, size, "buf")? };
        let core = unit_core(&target)?;
        let seq = state::runtime()?.tensor_write_schedule(core, &target, offset, data, tracker(err)?.as_ref())?;
        write_out(req_sequence, "req_sequence", seq.0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_tensor_read(
    buf: *mut c_void,
    tensor: *mut c_void,
    offset: u64,
    size: u64,
    queue: c_int,
    err: *mut c_void,
    req_sequence: *mut u64,
) -> Status {
    call("nrta_tensor_read", || {
        non_null(req_sequence, "req_sequence")?;
        check_queue(queue)?;
        let source = self::tensor(tensor, "tensor")?;
        check_apart(&source, buf, size, "buf")?;
        let core = unit_core(&source)?;
        let runtime = state::runtime()?;
        let destination = match NonNull::new(buf.cast::<u8>()) {
            Some(start) => start,
            None if size == 0 => NonNull::dangling(),
            None => return Err(invalid("buf", "is NULL")),
        };
        // SAFETY: the header makes the caller keep `size` writable bytes at `buf` for the
        // request until it completes.
        let seq = unsafe {
            runtime.tensor_read_into_schedule(core, &source, offset, destination, size, tracker(err)?.as_ref())?
        };
        write_out(req_sequence, "req_sequence", seq.0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_tensor_copy(
    src: *mut c_void,
    src_offset: u64,
    dst: *mut c_void,
    dst_offset: u64,
    size: u64,
    queue: c_int,
    err: *mut c_void,
    req_sequence: *mut u64,
) -> Status {
    call("nrta_tensor_copy", || {
        non_null(req_sequence, "req_sequence")?;
        check_queue(queue)?;
        let (source, target) = (tensor(src, "src")?, tensor(dst, "dst")?);
        check_same_core(&source, &target)?;
        let core = unit_core(&source)?;
        let tracker = tracker(err)?;
        let seq = state::runtime()?.tensor_copy_schedule(
            core,
            &source,
            src_offset,
            &target,
            dst_offset,
            size,
            tracker.as_ref(),
        )?;
        write_out(req_sequence, "req_sequence", seq.0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_execute_schedule(
    model: *mut c_void,
    input: *const c_void,
    output: *mut c_void,
    queue: c_int,
    err: *mut c_void,
    req_sequence: *mut u64,
) -> Status {
    call("nrta_execute_schedule", || {
        non_null(req_sequence, "req_sequence")?;
        check_queue(queue)?;
        let c_model = models::model(model)?;
        let inputs = SETS.get(input, "input")?.bound("input")?;
        let outputs = SETS.get(output, "output")?.bound("output")?;
        let tracker = tracker(err)?;
        let seq = c_model.runtime.execute_schedule(&c_model.model, &inputs, &outputs, tracker.as_ref())?;
        write_out(req_sequence, "req_sequence", seq.0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_cc_prepare(
    _comm: *mut c_void,
    _input: *mut c_void,
    _output: *mut c_void,
    _dtype: u32,
    _op: u32,
    _cc_op: u32,
    _cc_ctx: *mut *mut c_void,
) -> Status {
    call("nrta_cc_prepare", || {
        Err(unsupported(
            "host-driven collectives are not available through the C API yet; collectives inside a NEFF (nrt_load_collectives) work",
        ))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_cc_schedule(
    _cc_ctx: *mut *mut c_void,
    _queue: c_int,
    _err: *mut c_void,
    _req_sequence: *mut u64,
) -> Status {
    call("nrta_cc_schedule", || {
        Err(unsupported(
            "host-driven collectives are not available through the C API yet; collectives inside a NEFF (nrt_load_collectives) work",
        ))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_is_completed(seq: u64, is_completed: *mut bool) -> Status {
    call("nrta_is_completed", || {
        non_null(is_completed, "is_completed")?;
        let completed = state::runtime()?.is_completed(SeqId(seq))?;
        write_out(is_completed, "is_completed", completed)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_get_sequence(lnc: u32, xu: u32, queue: c_int, seq: *mut u64) -> Status {
    call("nrta_get_sequence", || {
        non_null(seq, "seq")?;
        check_queue(queue)?;
        let xu = Xu::ALL
            .get(xu as usize)
            .copied()
            .ok_or_else(|| invalid("xu", format!("is {xu}, not an NRTA_XU_* (0 to {})", Xu::ALL.len() - 1)))?;
        let runtime = state::runtime()?;
        let core = state::core_of(&runtime, i64::from(lnc), "lnc")?;
        let last = runtime.get_sequence(core, xu)?.unwrap_or(SeqId::new(SeqId::unit_of(core, xu), 0));
        write_out(seq, "seq", last.0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_get_completion_handle(seq: u64, fd: *mut c_int) -> Status {
    call("nrta_get_completion_handle", || {
        non_null(fd, "fd")?;
        let runtime = state::runtime()?;
        let seq = SeqId(seq);
        let completed = runtime.is_completed(seq)?;
        let resource = |e: &dyn std::fmt::Display| {
            NrtError::new(NrtStatus::Resource, format!("cannot create a completion eventfd: {e}"))
        };
        let handle = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK).map_err(|e| resource(&e))?;
        if completed {
            handle.write(1).map_err(|e| resource(&e))?;
        } else {
            // The waiter signals its own descriptor of the same eventfd, so the caller may
            // close theirs at any time.
            let signal = handle.as_fd().try_clone_to_owned().map_err(|e| resource(&e))?;
            std::thread::Builder::new()
                .name("nrta-completion".into())
                .spawn(move || {
                    let _ = runtime.wait_sequence(seq, COMPLETION_WAIT);
                    let _ = nix::unistd::write(&signal, &1u64.to_ne_bytes());
                })
                .map_err(|e| NrtError::new(NrtStatus::Resource, format!("cannot start a completion waiter: {e}")))?;
        }
        write_out(fd, "fd", std::os::fd::OwnedFd::from(handle).into_raw_fd())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_error_tracker_create(lnc_idx: u32, error_tracker: *mut *mut c_void) -> Status {
    call("nrta_error_tracker_create", || {
        non_null(error_tracker, "error_tracker")?;
        let runtime = state::runtime()?;
        let core = state::core_of(&runtime, i64::from(lnc_idx), "lnc_idx")?;
        let tracker = CTracker { tracker: runtime.error_tracker_create(core)?, returned: Mutex::new(Vec::new()) };
        write_out(error_tracker, "error_tracker", TRACKERS.insert(tracker))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_error_tracker_destroy(error_tracker: *mut c_void) {
    call_void("nrta_error_tracker_destroy", || TRACKERS.free(error_tracker, "error_tracker"));
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_error_tracker_get_list(
    error_tracker: *mut c_void,
    list: *mut *const NrtaError,
    error_count: *mut usize,
) -> Status {
    call("nrta_error_tracker_get_list", || {
        non_null(list, "list")?;
        non_null(error_count, "error_count")?;
        let c_tracker = TRACKERS.get(error_tracker, "error_tracker")?;
        let mut returned = c_tracker.returned.lock().unwrap_or_else(|e| e.into_inner());
        *returned = c_tracker
            .tracker
            .take()
            .into_iter()
            .map(|e| {
                let status = c_status(e.status);
                tracing::error!(
                    "nrta_error_tracker_get_list: request {:#x} failed: {status}: {}",
                    e.seq_id.0,
                    e.message
                );
                NrtaError { seq_id: e.seq_id.0, error_code: u64::from(status.code()) }
            })
            .collect();
        // The list lives in the tracker, which the caller keeps until destroying it; the
        // `Arc` the registry holds keeps it in place after this call returns.
        write_out(list, "list", if returned.is_empty() { std::ptr::null() } else { returned.as_ptr() })?;
        write_out(error_count, "error_count", returned.len())
    })
}
