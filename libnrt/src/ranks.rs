//! The global communicator of a job of several processes (`nrt_experimental.h`):
//! `nrt_build_global_comm` joins this process's rank, `nrt_barrier` and
//! `nrt_all_gather` run on it. Rank 0's process listens at `NEURON_RT_ROOT_COMM_ID`;
//! see `neuron_runtime::Runtime::join_communicator`.

use std::ffi::c_void;

use neuron_runtime::collectives::Communicator;
use neuron_runtime::{Collective, CollectiveCall, DType, GLOBAL_COMMUNICATOR, NrtResult, Runtime, TensorPlacement};

use crate::boundary::{Status, call, invalid, non_null};
use crate::state;

/// The core of rank `g_device_id` in this process: `vnc`, or with -1 the rank's place
/// among the process's cores (rank mod cores held).
pub(crate) fn rank_core(runtime: &Runtime, vnc: i64, g_device_id: u32) -> NrtResult<u32> {
    if vnc == -1 {
        let cores = runtime.cores()?;
        let held = cores.cores();
        return Ok(held[g_device_id as usize % held.len().max(1)]);
    }
    state::core_of(runtime, vnc, "vnc")
}

pub(crate) fn check_rank(g_device_id: u32, g_device_count: u32) -> NrtResult<()> {
    if g_device_count == 0 || g_device_id >= g_device_count {
        return Err(invalid(
            "g_device_id",
            format!("is {g_device_id}, not a rank of {g_device_count} (0 to g_device_count - 1)"),
        ));
    }
    Ok(())
}

/// Rank `g_device_id` of the job's global communicator, joined on `vnc`.
fn global(vnc: i32, g_device_id: u32, g_device_count: u32) -> NrtResult<(Runtime, Communicator)> {
    check_rank(g_device_id, g_device_count)?;
    let runtime = state::runtime()?;
    let core = rank_core(&runtime, i64::from(vnc), g_device_id)?;
    let communicator = runtime.join_communicator(GLOBAL_COMMUNICATOR, core, g_device_id, g_device_count)?;
    Ok((runtime, communicator))
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_build_global_comm(vnc: i32, g_device_id: u32, g_device_count: u32) -> Status {
    call("nrt_build_global_comm", || global(vnc, g_device_id, g_device_count).map(drop))
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_cc_global_comm_init(vnc: u32, g_device_id: u32, g_device_count: u32) -> Status {
    call("nrt_cc_global_comm_init", || {
        let vnc = i32::try_from(vnc).map_err(|_| invalid("vnc", format!("is {vnc}, not a NeuronCore")))?;
        global(vnc, g_device_id, g_device_count).map(drop)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_barrier(vnc: i32, g_device_id: u32, g_device_count: u32) -> Status {
    call("nrt_barrier", || {
        let (_, communicator) = global(vnc, g_device_id, g_device_count)?;
        communicator.run(g_device_id, &CollectiveCall::new(Collective::Barrier, DType::U8), None, None)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_all_gather(
    vnc: i32,
    g_device_id: u32,
    g_device_count: u32,
    rank_input_size: u32,
    input: *mut c_void,
    output: *mut c_void,
) -> Status {
    call("nrt_all_gather", || {
        let (runtime, communicator) = global(vnc, g_device_id, g_device_count)?;
        let size = rank_input_size as usize;
        let total = size * g_device_count as usize;
        if size == 0 {
            return Err(invalid("rank_input_size", "is 0: give each rank's bytes"));
        }
        let input = non_null(input, "input")?;
        let output = non_null(output, "output")?;
        // SAFETY: the header's contract: `input` holds `rank_input_size` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(input.cast::<u8>(), size) };
        let x = runtime.allocate_tensor(TensorPlacement::Host, size as u64, "all_gather_input")?;
        x.write(0, bytes)?;
        let y = runtime.allocate_tensor(TensorPlacement::Host, total as u64, "all_gather_output")?;
        communicator.run(g_device_id, &CollectiveCall::new(Collective::AllGather, DType::U8), Some(&x), Some(&y))?;
        let gathered = y.read_all()?;
        // SAFETY: the header's contract: `output` holds `rank_input_size * g_device_count`
        // writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(gathered.as_ptr(), output.cast::<u8>(), total) };
        Ok(())
    })
}
