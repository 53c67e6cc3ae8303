//! The payload of every system event type, declared once.
//!
//! From this declaration come the emitters' payload types ([`payload`]), the decoded
//! [`EventData`], the slot encoding and decoding, the fields of the JSON `data` object
//! (`tail --json`, `nrt_sys_trace_fetch_events`) and the NTFF arguments in both
//! directions. Adding an event type is its code in [`EventType`], a line here (or a new
//! payload), its row in `FORMAT.md` and its emitter; the round-trip test
//! (`record/tests/event_round_trip.rs`) covers it from then on. Field kinds are
//! described in `fields.rs`.

use super::EventType;
use super::fields::system_payloads;
use crate::kinds::{CollectiveAlgorithm, CollectiveOp};

system_payloads! {
    /// `nrt_load`, `nrt_unload`.
    Model for NrtLoad, NrtUnload {
        name as "model_name": string,
        /// The call's status code, on a failed stop.
        status: status,
    }
    /// `nrt_execute` and its phases, `nc_exec_running`, `nrta_execute_schedule`.
    Execution for NrtExecute, NrtaExecuteSchedule, KblExecPre, KmgrExecCore, KblExecWait, KblExecPost, NcExecRunning {
        /// The call's status code, on a failed stop.
        status: status,
    }
    /// `dmem_buf_copyin`, `dmem_buf_copyout`.
    Copy for DmemBufCopyin, DmemBufCopyout {
        tensor_id: word(0, u64),
        tensor_name: string,
        bytes: word(1, u64),
    }
    /// `nrt_tensor_allocate`, `nrt_tensor_free`.
    Tensor for NrtTensorAllocate, NrtTensorFree {
        tensor_id: word(0, u64),
        tensor_name: string,
        /// Bytes.
        size: word(1, u64),
    }
    /// `nrt_tensor_read`, `nrt_tensor_write`.
    TensorAccess for NrtTensorRead, NrtTensorWrite {
        tensor_id: word(0, u64),
        tensor_name: string,
        /// Bytes from the tensor's start.
        offset: word(1, u64),
        bytes: word(2, u64),
    }
    /// `nrt_model_switch`: the core ran another model before this execution's.
    ModelSwitch for NrtModelSwitch {
        from_model_id: word(0, u32),
    }
    /// `numerical_err`: NaN or infinite values written by an execution.
    NumericalError for NumericalErr {
        count: word(0, u64),
    }
    /// `hw_notify`: an error notification.
    HwNotify for HwNotify {
        /// The `NRT_STATUS` code the execution failed with (0 for a corrected error).
        status: word(0, i32),
        message: string,
    }
    /// `timestamp_sync_point`: one instant on both clocks, to align the device clock
    /// with.
    SyncPoint for TimestampSyncPoint {
        cpu_timestamp_ns: host_ticks(0),
        nc_timestamp_ns: word(1, u64),
    }
    /// `cc_running`: one collective on one rank.
    Collective for CcRunning {
        /// `all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all`, `barrier`.
        operation: code(2, 0, CollectiveOp),
        /// `ring` or `all-to-all`.
        algorithm: code(2, 8, CollectiveAlgorithm),
        /// Bytes of the larger of the rank's input and output.
        bytes: word(1, u64),
        /// The rank's replica group, as ranks: `{0,1}`.
        replica_group: string,
        /// The collective's index among its execution's collectives (0 for API calls).
        op_id: word(0, u32),
        /// The rank's number in its communicator.
        rank: half(2, 16),
        /// Which of the rank's executions (or API calls) of the communicator this is,
        /// counted from 0 the same way in every rank: equal in the ranks that met.
        sequence: half(0, 32),
        /// The communicator's id, the same in every rank (and every process) of it.
        communicator: half(3, 32),
        /// The call's status code, on a failed stop.
        status: status,
    }
    /// `cc_waiting`: a rank's collective has waited long for another rank (5 s, or half
    /// `NEURON_RT_EXEC_TIMEOUT`); said once per collective.
    CcWaiting for CcWaiting {
        /// The rank waited for.
        peer: half(0, 0),
        /// As `cc_running`'s: equal in the ranks that met.
        sequence: half(0, 32),
        /// As `cc_running`'s.
        communicator: half(1, 0),
        /// The waiting rank.
        rank: half(1, 32),
        /// How long it had waited, in nanoseconds.
        waited_ns: word(2, u64),
    }
    /// `graph_compile`: a framework (torch-xla through the PJRT plugin) compiled one of
    /// its graphs, or took it from the compile cache; in the process ring.
    GraphCompile for GraphCompile {
        /// The graph, then what made it new when the process had run before: `graph
        /// SyncTensorsGraph.129: parameter 3 f32[32,64] -> f32[16,64] (aten::addmm at
        /// train.py:12)`.
        detail: string,
        /// Executions the process had run before it: 0 for the first graphs.
        executions_before: word(0, u64),
        /// How long compiling took, in microseconds (0 from the cache).
        compile_us: word(1, u64),
    }
    /// `clock_offset`: this process's host clock against the root's (rank 0's process),
    /// measured over its connection to the root at bootstrap and then periodically.
    ClockOffset for ClockOffset {
        /// The root's clock minus this process's, in nanoseconds.
        offset_ns: word(0, i64),
        /// The most the offset may be off by, in nanoseconds.
        uncertainty_ns: word(1, u64),
    }
}

impl payload::Execution {
    /// No status: a start, or a stop that did not fail.
    pub const NO_STATUS: payload::Execution = payload::Execution { status: None };
}
