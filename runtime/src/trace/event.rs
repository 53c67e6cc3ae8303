//! The event model: system-trace and device-trace records, typed and as stored.
//!
//! System events use the public Neuron names and phases. Each is stored as one ring
//! slot (see `runtime/FORMAT.md`): a timestamp (host ticks, or device nanoseconds for
//! `nc_exec_running`), ids, and four argument words whose meaning depends on the event
//! type. Device events are one per executed instruction or DMA transfer, timed by the
//! core's device clock. Decoding needs the string table and the tick calibration, so it
//! happens in readers, never when emitting.

use std::fmt;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use crate::datastore::InstructionTrace;
use crate::isa::Engine;

/// System trace event types, with their public names. The numeric codes are part of
/// the datastore layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum EventType {
    NrtLoad = 0,
    NrtUnload = 1,
    NrtExecute = 2,
    KblExecPre = 3,
    KmgrExecCore = 4,
    KblExecWait = 5,
    KblExecPost = 6,
    NcExecRunning = 7,
    DmemBufCopyin = 8,
    DmemBufCopyout = 9,
    NrtTensorAllocate = 10,
    NrtTensorFree = 11,
    NrtTensorRead = 12,
    NrtTensorWrite = 13,
    NrtModelSwitch = 14,
    NumericalErr = 15,
    HwNotify = 16,
    TimestampSyncPoint = 17,
    NrtaExecuteSchedule = 18,
    CcRunning = 19,
}

impl EventType {
    pub const ALL: [EventType; 20] = [
        EventType::NrtLoad,
        EventType::NrtUnload,
        EventType::NrtExecute,
        EventType::KblExecPre,
        EventType::KmgrExecCore,
        EventType::KblExecWait,
        EventType::KblExecPost,
        EventType::NcExecRunning,
        EventType::DmemBufCopyin,
        EventType::DmemBufCopyout,
        EventType::NrtTensorAllocate,
        EventType::NrtTensorFree,
        EventType::NrtTensorRead,
        EventType::NrtTensorWrite,
        EventType::NrtModelSwitch,
        EventType::NumericalErr,
        EventType::HwNotify,
        EventType::TimestampSyncPoint,
        EventType::NrtaExecuteSchedule,
        EventType::CcRunning,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EventType::NrtLoad => "nrt_load",
            EventType::NrtUnload => "nrt_unload",
            EventType::NrtExecute => "nrt_execute",
            EventType::KblExecPre => "kbl_exec_pre",
            EventType::KmgrExecCore => "kmgr_exec_core",
            EventType::KblExecWait => "kbl_exec_wait",
            EventType::KblExecPost => "kbl_exec_post",
            EventType::NcExecRunning => "nc_exec_running",
            EventType::DmemBufCopyin => "dmem_buf_copyin",
            EventType::DmemBufCopyout => "dmem_buf_copyout",
            EventType::NrtTensorAllocate => "nrt_tensor_allocate",
            EventType::NrtTensorFree => "nrt_tensor_free",
            EventType::NrtTensorRead => "nrt_tensor_read",
            EventType::NrtTensorWrite => "nrt_tensor_write",
            EventType::NrtModelSwitch => "nrt_model_switch",
            EventType::NumericalErr => "numerical_err",
            EventType::HwNotify => "hw_notify",
            EventType::NrtaExecuteSchedule => "nrta_execute_schedule",
            EventType::CcRunning => "cc_running",
            EventType::TimestampSyncPoint => "timestamp_sync_point",
        }
    }

    pub fn from_name(name: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.name() == name)
    }

    pub fn from_code(code: u16) -> Option<EventType> {
        EventType::ALL.get(code as usize).copied()
    }

    /// Whether the type is in the public `hardware` group (the others are `software`).
    pub fn is_hardware(self) -> bool {
        matches!(
            self,
            EventType::NcExecRunning
                | EventType::CcRunning
                | EventType::NrtModelSwitch
                | EventType::NumericalErr
                | EventType::HwNotify
                | EventType::TimestampSyncPoint
        )
    }

    /// The type's bit in an event mask.
    pub fn bit(self) -> u64 {
        1 << self as u16
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether an event opens a span, closes it, or stands alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Phase {
    Start = 0,
    Stop = 1,
    Instant = 2,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Start => "start",
            Phase::Stop => "stop",
            Phase::Instant => "instant",
        }
    }

    fn from_code(code: u8) -> Option<Phase> {
        [Phase::Start, Phase::Stop, Phase::Instant].get(code as usize).copied()
    }
}

/// Which clock a timestamp was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockDomain {
    /// Host `CLOCK_MONOTONIC` nanoseconds.
    Host,
    /// The NeuronCore's device clock; align with `timestamp_sync_point`.
    Device,
}

/// What a system event says beyond its common fields; the variant follows the type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventData {
    /// `nrt_load`, `nrt_unload`.
    Model {
        name: String,
        status: Option<i32>,
    },
    /// `nrt_execute` and its phases, `nc_exec_running`.
    Execution {
        status: Option<i32>,
    },
    /// `dmem_buf_copyin`, `dmem_buf_copyout`.
    Copy {
        tensor_id: u64,
        tensor_name: String,
        bytes: u64,
    },
    /// `nrt_tensor_allocate`, `nrt_tensor_free`.
    Tensor {
        tensor_id: u64,
        tensor_name: String,
        size: u64,
    },
    /// `nrt_tensor_read`, `nrt_tensor_write`.
    TensorAccess {
        tensor_id: u64,
        tensor_name: String,
        offset: u64,
        bytes: u64,
    },
    ModelSwitch {
        from_model_id: u32,
    },
    /// NaN or infinite values written by an execution.
    NumericalError {
        count: u64,
    },
    /// An error notification: the status the execution failed with.
    HwNotify {
        status: i32,
        message: String,
    },
    SyncPoint {
        cpu_timestamp_ns: u64,
        nc_timestamp_ns: u64,
    },
    /// `cc_running`: one collective on one rank.
    Collective {
        /// `all-reduce`, `all-gather`, `reduce-scatter`, `all-to-all`, `barrier`.
        operation: &'static str,
        /// `ring` or `all-to-all`.
        algorithm: &'static str,
        /// Bytes of the larger of the rank's input and output.
        bytes: u64,
        /// The rank's replica group, as ranks: `{0,1}`.
        replica_group: String,
        /// The collective's index among its execution's collectives (0 for API calls).
        op_id: u32,
        status: Option<i32>,
    },
}

/// One decoded system trace event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemEvent {
    pub event_type: EventType,
    pub phase: Phase,
    /// Position in its ring: unique per (`nc_idx`, ring).
    pub id: u64,
    /// The NeuronCore, or `None` for events tied to no core (host tensors).
    pub nc_idx: Option<u32>,
    /// Shared by a start and its stop.
    pub tracking_id: u64,
    pub thread_id: u32,
    pub timestamp_ns: u64,
    pub clock: ClockDomain,
    pub exec_id: Option<u64>,
    pub model_id: Option<u32>,
    pub nrta_seq_id: Option<u64>,
    pub data: EventData,
}

/// DMA queue types of the device trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DmaQueueType {
    Input = 0,
    Output = 1,
    Weights = 2,
    Instructions = 3,
}

impl DmaQueueType {
    pub const ALL: [DmaQueueType; 4] =
        [DmaQueueType::Input, DmaQueueType::Output, DmaQueueType::Weights, DmaQueueType::Instructions];

    pub fn name(self) -> &'static str {
        match self {
            DmaQueueType::Input => "input",
            DmaQueueType::Output => "output",
            DmaQueueType::Weights => "weights",
            DmaQueueType::Instructions => "instructions",
        }
    }
}

/// What a device event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceActivity {
    Instruction {
        engine: Engine,
        opcode: String,
        /// The HLO instruction it was lowered from.
        hlo: String,
        /// Position in the program's global order.
        step: u32,
        flops: u64,
        bytes_read: u64,
        bytes_written: u64,
    },
    Dma {
        queue: DmaQueueType,
        /// Input, output or constant index (instructions: the engine's stream index).
        index: u32,
        bytes: u64,
    },
}

/// One decoded device trace event; times are the core's device clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEvent {
    pub id: u64,
    pub nc_idx: u32,
    pub exec_id: Option<u64>,
    pub model_id: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub activity: DeviceActivity,
}

impl DeviceEvent {
    /// `instruction` or `dma`: the name `--types` filters use.
    pub fn type_name(&self) -> &'static str {
        match self.activity {
            DeviceActivity::Instruction { .. } => "instruction",
            DeviceActivity::Dma { .. } => "dma",
        }
    }
}

/// Payload words a system record uses (the rest of its slot stays zero).
pub(crate) const SYSTEM_RECORD_WORDS: usize = 10;
/// Payload words a device record uses: all of them.
pub(crate) const DEVICE_RECORD_WORDS: usize = crate::datastore::PAYLOAD_WORDS;
/// Instructions one run record holds: one duration beside the first position, two
/// in each of the words after the first five.
pub(crate) const RUN_MAX: usize = 19;
const _: () = assert!(RUN_MAX == 2 * (DEVICE_RECORD_WORDS - 5) + 1);

/// Record flags.
pub(crate) const FLAG_DEVICE_CLOCK: u8 = 1;
pub(crate) const FLAG_STATUS: u8 = 2;
pub(crate) const FLAG_NRTA_SEQ: u8 = 4;

/// A system event as stored in a ring slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SystemRecord {
    pub(crate) timestamp: u64,
    pub(crate) tracking_id: u64,
    /// 0 when the event belongs to no execution.
    pub(crate) exec_id: u64,
    pub(crate) nrta_seq_id: u64,
    pub(crate) event_type: u16,
    pub(crate) phase: u8,
    pub(crate) flags: u8,
    pub(crate) thread_id: u32,
    /// 0 when the event belongs to no model.
    pub(crate) model_id: u32,
    pub(crate) string_id: u32,
    pub(crate) args: [u64; 4],
}

impl SystemRecord {
    #[inline]
    pub(crate) fn encode(&self) -> [u64; SYSTEM_RECORD_WORDS] {
        let mut p = [0u64; SYSTEM_RECORD_WORDS];
        p[0] = self.timestamp;
        p[1] = self.tracking_id;
        p[2] = self.exec_id;
        p[3] = self.nrta_seq_id;
        p[4] = u64::from(self.event_type)
            | u64::from(self.phase) << 16
            | u64::from(self.flags) << 24
            | u64::from(self.thread_id) << 32;
        p[5] = u64::from(self.model_id) | u64::from(self.string_id) << 32;
        p[6..10].copy_from_slice(&self.args);
        p
    }

    pub(crate) fn decode(p: &crate::datastore::Payload) -> SystemRecord {
        SystemRecord {
            timestamp: p[0],
            tracking_id: p[1],
            exec_id: p[2],
            nrta_seq_id: p[3],
            event_type: p[4] as u16,
            phase: (p[4] >> 16) as u8,
            flags: (p[4] >> 24) as u8,
            thread_id: (p[4] >> 32) as u32,
            model_id: p[5] as u32,
            string_id: (p[5] >> 32) as u32,
            args: [p[6], p[7], p[8], p[9]],
        }
    }

    /// The typed event, or `None` for an unknown type or phase code. `string` resolves
    /// string ids and `host_ns` converts host ticks.
    pub(crate) fn to_event(
        self,
        id: u64,
        nc_idx: Option<u32>,
        string: &mut dyn FnMut(u32) -> String,
        host_ns: &dyn Fn(u64) -> u64,
    ) -> Option<SystemEvent> {
        let event_type = EventType::from_code(self.event_type)?;
        let phase = Phase::from_code(self.phase)?;
        let device_clock = self.flags & FLAG_DEVICE_CLOCK != 0;
        let status = (self.flags & FLAG_STATUS != 0).then_some(self.args[3] as i32);
        let a = self.args;
        let data = match event_type {
            EventType::NrtLoad | EventType::NrtUnload => EventData::Model { name: string(self.string_id), status },
            EventType::NrtExecute
            | EventType::NrtaExecuteSchedule
            | EventType::KblExecPre
            | EventType::KmgrExecCore
            | EventType::KblExecWait
            | EventType::KblExecPost
            | EventType::NcExecRunning => EventData::Execution { status },
            EventType::DmemBufCopyin | EventType::DmemBufCopyout => {
                EventData::Copy { tensor_id: a[0], tensor_name: string(self.string_id), bytes: a[1] }
            }
            EventType::NrtTensorAllocate | EventType::NrtTensorFree => {
                EventData::Tensor { tensor_id: a[0], tensor_name: string(self.string_id), size: a[1] }
            }
            EventType::NrtTensorRead | EventType::NrtTensorWrite => EventData::TensorAccess {
                tensor_id: a[0],
                tensor_name: string(self.string_id),
                offset: a[1],
                bytes: a[2],
            },
            EventType::NrtModelSwitch => EventData::ModelSwitch { from_model_id: a[0] as u32 },
            EventType::NumericalErr => EventData::NumericalError { count: a[0] },
            EventType::HwNotify => EventData::HwNotify { status: a[0] as i32, message: string(self.string_id) },
            EventType::TimestampSyncPoint => {
                EventData::SyncPoint { cpu_timestamp_ns: host_ns(a[0]), nc_timestamp_ns: a[1] }
            }
            EventType::CcRunning => EventData::Collective {
                operation: crate::collectives::Collective::name_of_code(a[2] & 0xff),
                algorithm: crate::collectives::algorithm_name_of_code(a[2] >> 8 & 0xff),
                bytes: a[1],
                replica_group: string(self.string_id),
                op_id: a[0] as u32,
                status,
            },
        };
        Some(SystemEvent {
            event_type,
            phase,
            id,
            nc_idx,
            tracking_id: self.tracking_id,
            thread_id: self.thread_id,
            timestamp_ns: if device_clock { self.timestamp } else { host_ns(self.timestamp) },
            clock: if device_clock { ClockDomain::Device } else { ClockDomain::Host },
            exec_id: (self.exec_id != 0).then_some(self.exec_id),
            model_id: (self.model_id != 0).then_some(self.model_id),
            nrta_seq_id: (self.flags & FLAG_NRTA_SEQ != 0).then_some(self.nrta_seq_id),
            data,
        })
    }
}

pub(crate) const DEVICE_KIND_INSTRUCTION: u8 = 0;
pub(crate) const DEVICE_KIND_DMA: u8 = 1;
pub(crate) const DEVICE_KIND_RUN: u8 = 2;

/// A device event as stored in a ring slot (one instruction or one transfer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct DeviceRecord {
    /// The ring's device event number of this event.
    pub(crate) first_event: u64,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) exec_id: u64,
    pub(crate) model_id: u32,
    pub(crate) kind: u8,
    /// `Engine` for instructions, `DmaQueueType` for transfers.
    pub(crate) unit: u8,
    /// Instructions: opcode string id; transfers: the transfer index.
    pub(crate) opcode_or_index: u32,
    pub(crate) hlo_string: u32,
    pub(crate) step: u32,
    /// Instructions: FLOPs; transfers: bytes.
    pub(crate) flops_or_bytes: u64,
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
}

impl DeviceRecord {
    #[inline]
    pub(crate) fn encode(&self) -> [u64; DEVICE_RECORD_WORDS] {
        let mut p = [0u64; DEVICE_RECORD_WORDS];
        p[0] = device_word0(self.model_id, self.kind, self.unit, 1);
        p[1] = self.exec_id;
        p[2] = self.first_event;
        p[3] = self.start_ns;
        p[4] = self.end_ns;
        p[5] = u64::from(self.opcode_or_index) | u64::from(self.hlo_string) << 32;
        p[6] = self.flops_or_bytes;
        p[7] = self.bytes_read;
        p[8] = self.bytes_written;
        p[9] = u64::from(self.step);
        p
    }

    fn decode(p: &crate::datastore::Payload) -> DeviceRecord {
        DeviceRecord {
            model_id: p[0] as u32,
            kind: (p[0] >> 32) as u8,
            unit: (p[0] >> 40) as u8,
            exec_id: p[1],
            first_event: p[2],
            start_ns: p[3],
            end_ns: p[4],
            opcode_or_index: p[5] as u32,
            hlo_string: (p[5] >> 32) as u32,
            flops_or_bytes: p[6],
            bytes_read: p[7],
            bytes_written: p[8],
            step: p[9] as u32,
        }
    }

    fn to_event(self, nc_idx: u32, string: &mut dyn FnMut(u32) -> String) -> Option<DeviceEvent> {
        let activity = match self.kind {
            DEVICE_KIND_INSTRUCTION => DeviceActivity::Instruction {
                engine: *Engine::ALL.get(self.unit as usize)?,
                opcode: string(self.opcode_or_index),
                hlo: string(self.hlo_string),
                step: self.step,
                flops: self.flops_or_bytes,
                bytes_read: self.bytes_read,
                bytes_written: self.bytes_written,
            },
            DEVICE_KIND_DMA => DeviceActivity::Dma {
                queue: *DmaQueueType::ALL.get(self.unit as usize)?,
                index: self.opcode_or_index,
                bytes: self.flops_or_bytes,
            },
            _ => return None,
        };
        Some(DeviceEvent {
            id: self.first_event,
            nc_idx,
            exec_id: (self.exec_id != 0).then_some(self.exec_id),
            model_id: self.model_id,
            start_ns: self.start_ns,
            end_ns: self.end_ns,
            activity,
        })
    }
}

fn device_word0(model_id: u32, kind: u8, unit: u8, count: u8) -> u64 {
    u64::from(model_id) | u64::from(kind) << 32 | u64::from(unit) << 40 | u64::from(count) << 48
}

/// Up to [`RUN_MAX`] consecutive instructions of one execution, as one record: each
/// starts when the one before it ends, so their durations are enough. What each
/// instruction is comes from the model's entry in the instruction table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct InstructionRun {
    pub(crate) first_event: u64,
    pub(crate) exec_id: u64,
    pub(crate) model_id: u32,
    /// Position of the first instruction in the model's execution order.
    pub(crate) first: u32,
    pub(crate) count: u8,
    pub(crate) start_ns: u64,
    /// Device nanoseconds each instruction took.
    pub(crate) durations: [u32; RUN_MAX],
}

impl InstructionRun {
    #[inline]
    pub(crate) fn encode(&self) -> [u64; DEVICE_RECORD_WORDS] {
        let mut p = [0u64; DEVICE_RECORD_WORDS];
        p[0] = device_word0(self.model_id, DEVICE_KIND_RUN, 0, self.count);
        p[1] = self.exec_id;
        p[2] = self.first_event;
        p[3] = self.start_ns;
        p[4] = u64::from(self.first) | u64::from(self.durations[0]) << 32;
        for (k, pair) in self.durations[1..].chunks_exact(2).enumerate() {
            p[5 + k] = u64::from(pair[0]) | u64::from(pair[1]) << 32;
        }
        p
    }

    fn decode(p: &crate::datastore::Payload) -> InstructionRun {
        let mut durations = [0u32; RUN_MAX];
        durations[0] = (p[4] >> 32) as u32;
        for (k, pair) in durations[1..].chunks_exact_mut(2).enumerate() {
            pair[0] = p[5 + k] as u32;
            pair[1] = (p[5 + k] >> 32) as u32;
        }
        InstructionRun {
            model_id: p[0] as u32,
            count: (p[0] >> 48) as u8,
            exec_id: p[1],
            first_event: p[2],
            start_ns: p[3],
            first: p[4] as u32,
            durations,
        }
    }
}

/// The device event number of a record's first event, and how many it holds.
pub(crate) fn device_record_events(p: &crate::datastore::Payload) -> (u64, u64) {
    (p[2], if (p[0] >> 32) as u8 == DEVICE_KIND_RUN { (p[0] >> 48) as u8 as u64 } else { 1 })
}

/// Decodes a device record into its events. A run is expanded through `table`, the
/// model's instructions (`None`: not in the table, and then nothing is decoded).
pub(crate) fn decode_device(
    p: &crate::datastore::Payload,
    nc_idx: u32,
    string: &mut dyn FnMut(u32) -> String,
    table: &mut dyn FnMut(u32) -> Option<std::sync::Arc<[InstructionTrace]>>,
    out: &mut dyn FnMut(DeviceEvent),
) {
    if (p[0] >> 32) as u8 != DEVICE_KIND_RUN {
        if let Some(event) = DeviceRecord::decode(p).to_event(nc_idx, string) {
            out(event);
        }
        return;
    }
    let run = InstructionRun::decode(p);
    let Some(instructions) = table(run.model_id) else { return };
    let mut start = run.start_ns;
    for k in 0..usize::from(run.count).min(RUN_MAX) {
        let Some(it) = instructions.get(run.first as usize + k) else { return };
        let Some(&engine) = Engine::ALL.get(usize::from(it.engine)) else { return };
        let end = start + u64::from(run.durations[k]);
        out(DeviceEvent {
            id: run.first_event + k as u64,
            nc_idx,
            exec_id: (run.exec_id != 0).then_some(run.exec_id),
            model_id: run.model_id,
            start_ns: start,
            end_ns: end,
            activity: DeviceActivity::Instruction {
                engine,
                opcode: string(it.opcode_id),
                hlo: string(it.hlo_id),
                step: it.step,
                flops: it.flops,
                bytes_read: it.bytes_read,
                bytes_written: it.bytes_written,
            },
        });
        start = end;
    }
}

/// The `nrt_sys_trace_fetch_events` shape: `event_type`, `phase`, `id`, `nc_idx`,
/// `tracking_id`, `thread_id`, `data`, `timestamp_ns`, then `nrta_seq_id` when present.
impl Serialize for SystemEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("event_type", self.event_type.name())?;
        map.serialize_entry("phase", self.phase.name())?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("nc_idx", &self.nc_idx)?;
        map.serialize_entry("tracking_id", &self.tracking_id)?;
        map.serialize_entry("thread_id", &self.thread_id)?;
        map.serialize_entry("data", &DataJson(self))?;
        map.serialize_entry("timestamp_ns", &self.timestamp_ns)?;
        if let Some(seq) = self.nrta_seq_id {
            map.serialize_entry("nrta_seq_id", &seq)?;
        }
        map.end()
    }
}

struct DataJson<'a>(&'a SystemEvent);

impl Serialize for DataJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let event = self.0;
        let mut map = serializer.serialize_map(None)?;
        if let Some(exec_id) = event.exec_id {
            map.serialize_entry("exec_id", &exec_id)?;
        }
        if let Some(model_id) = event.model_id {
            map.serialize_entry("model_id", &model_id)?;
        }
        match &event.data {
            EventData::Model { name, status } => {
                map.serialize_entry("model_name", name)?;
                if let Some(status) = status {
                    map.serialize_entry("status", status)?;
                }
            }
            EventData::Execution { status } => {
                if let Some(status) = status {
                    map.serialize_entry("status", status)?;
                }
            }
            EventData::Copy { tensor_id, tensor_name, bytes } => {
                map.serialize_entry("tensor_id", tensor_id)?;
                map.serialize_entry("tensor_name", tensor_name)?;
                map.serialize_entry("bytes", bytes)?;
            }
            EventData::Tensor { tensor_id, tensor_name, size } => {
                map.serialize_entry("tensor_id", tensor_id)?;
                map.serialize_entry("tensor_name", tensor_name)?;
                map.serialize_entry("size", size)?;
            }
            EventData::TensorAccess { tensor_id, tensor_name, offset, bytes } => {
                map.serialize_entry("tensor_id", tensor_id)?;
                map.serialize_entry("tensor_name", tensor_name)?;
                map.serialize_entry("offset", offset)?;
                map.serialize_entry("bytes", bytes)?;
            }
            EventData::ModelSwitch { from_model_id } => map.serialize_entry("from_model_id", from_model_id)?,
            EventData::NumericalError { count } => map.serialize_entry("count", count)?,
            EventData::HwNotify { status, message } => {
                map.serialize_entry("status", status)?;
                map.serialize_entry("message", message)?;
            }
            EventData::SyncPoint { cpu_timestamp_ns, nc_timestamp_ns } => {
                map.serialize_entry("cpu_timestamp_ns", cpu_timestamp_ns)?;
                map.serialize_entry("nc_timestamp_ns", nc_timestamp_ns)?;
            }
            EventData::Collective { operation, algorithm, bytes, replica_group, op_id, status } => {
                map.serialize_entry("operation", operation)?;
                map.serialize_entry("algorithm", algorithm)?;
                map.serialize_entry("bytes", bytes)?;
                map.serialize_entry("replica_group", replica_group)?;
                map.serialize_entry("op_id", op_id)?;
                if let Some(status) = status {
                    map.serialize_entry("status", status)?;
                }
            }
        }
        map.end()
    }
}

/// A device event as one JSON object: `event_type` (`instruction` or `dma`), `id`,
/// `nc_idx`, `data`, `start_ns`, `end_ns` (device clock).
impl Serialize for DeviceEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("event_type", self.type_name())?;
        map.serialize_entry("id", &self.id)?;
        map.serialize_entry("nc_idx", &self.nc_idx)?;
        map.serialize_entry("data", &DeviceDataJson(self))?;
        map.serialize_entry("start_ns", &self.start_ns)?;
        map.serialize_entry("end_ns", &self.end_ns)?;
        map.end()
    }
}

struct DeviceDataJson<'a>(&'a DeviceEvent);

impl Serialize for DeviceDataJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let event = self.0;
        let mut map = serializer.serialize_map(None)?;
        if let Some(exec_id) = event.exec_id {
            map.serialize_entry("exec_id", &exec_id)?;
        }
        map.serialize_entry("model_id", &event.model_id)?;
        match &event.activity {
            DeviceActivity::Instruction { engine, opcode, hlo, step, flops, bytes_read, bytes_written } => {
                map.serialize_entry("engine", engine.name())?;
                map.serialize_entry("opcode", opcode)?;
                map.serialize_entry("hlo", hlo)?;
                map.serialize_entry("step", step)?;
                map.serialize_entry("flops", flops)?;
                map.serialize_entry("bytes_read", bytes_read)?;
                map.serialize_entry("bytes_written", bytes_written)?;
            }
            DeviceActivity::Dma { queue, index, bytes } => {
                map.serialize_entry("queue", queue.name())?;
                map.serialize_entry("index", index)?;
                map.serialize_entry("bytes", bytes)?;
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::PAYLOAD_WORDS;

    fn payload(words: [u64; DEVICE_RECORD_WORDS]) -> crate::datastore::Payload {
        let mut p = [0u64; PAYLOAD_WORDS];
        p[..DEVICE_RECORD_WORDS].copy_from_slice(&words);
        p
    }

    #[test]
    fn a_run_record_expands_into_one_event_per_instruction_from_the_table() {
        let table: std::sync::Arc<[InstructionTrace]> = (0..40u32)
            .map(|k| InstructionTrace {
                engine: (k % 5) as u8,
                opcode_id: 100 + k,
                step: k,
                flops: 7 * u64::from(k),
                ..InstructionTrace::default()
            })
            .collect();
        let mut durations = [0u32; RUN_MAX];
        for (k, d) in durations.iter_mut().enumerate() {
            *d = 1000 + k as u32;
        }
        durations[RUN_MAX - 1] = u32::MAX;
        let run = InstructionRun {
            first_event: 500,
            exec_id: 9,
            model_id: 3,
            first: 20,
            count: RUN_MAX as u8,
            start_ns: 1_000_000,
            durations,
        };
        let words = payload(run.encode());
        assert_eq!(InstructionRun::decode(&words), run);
        assert_eq!(device_record_events(&words), (500, RUN_MAX as u64));
        let mut events = Vec::new();
        decode_device(
            &words,
            2,
            &mut |id| format!("s{id}"),
            &mut |model| (model == 3).then(|| table.clone()),
            &mut |e| events.push(e),
        );
        assert_eq!(events.len(), RUN_MAX);
        let mut start = 1_000_000;
        for (k, e) in events.iter().enumerate() {
            assert_eq!((e.id, e.nc_idx, e.exec_id, e.model_id), (500 + k as u64, 2, Some(9), 3));
            assert_eq!((e.start_ns, e.end_ns), (start, start + u64::from(durations[k])));
            let DeviceActivity::Instruction { engine, ref opcode, step, flops, .. } = e.activity else {
                panic!("not an instruction: {e:?}")
            };
            let position = 20 + k as u32;
            assert_eq!(
                (engine as u32, opcode.as_str(), step, flops),
                (position % 5, &*format!("s{}", 100 + position), position, 7 * u64::from(position))
            );
            start = e.end_ns;
        }
        // A model missing from the table decodes to nothing (the events still count).
        let mut none = 0;
        decode_device(&words, 2, &mut |_| String::new(), &mut |_| None, &mut |_| none += 1);
        assert_eq!(none, 0);
    }

    #[test]
    fn a_full_device_record_round_trips() {
        let record = DeviceRecord {
            first_event: 77,
            start_ns: 10,
            end_ns: 20,
            exec_id: 4,
            model_id: 6,
            kind: DEVICE_KIND_DMA,
            unit: DmaQueueType::Output as u8,
            opcode_or_index: 2,
            flops_or_bytes: 4096,
            ..DeviceRecord::default()
        };
        let words = payload(record.encode());
        assert_eq!(DeviceRecord::decode(&words), record);
        assert_eq!(device_record_events(&words), (77, 1));
    }
}
