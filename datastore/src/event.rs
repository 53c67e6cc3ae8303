//! The event model: system-trace and device-trace records, typed and as stored.
//!
//! System events use the public Neuron names and phases. Each is stored as one ring
//! slot (see `datastore/FORMAT.md`): a timestamp (host ticks, or device nanoseconds for
//! `nc_exec_running`), ids, and four argument words whose meaning depends on the event
//! type. Device events are one per executed instruction or DMA transfer, timed by the
//! core's device clock. Decoding needs the string table and the tick calibration, so it
//! happens in readers, never when emitting.

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use strum::{Display, EnumString, FromRepr, IntoStaticStr, VariantArray};

use crate::kinds::Engine;

/// System trace event types, with their public names. The numeric codes are part of
/// the datastore layout.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, IntoStaticStr, EnumString, VariantArray, FromRepr, Display,
)]
#[strum(serialize_all = "snake_case")]
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
    pub const ALL: &[EventType] = EventType::VARIANTS;

    /// The public name (`nrt_load`, `nc_exec_running`, …).
    pub fn name(self) -> &'static str {
        self.into()
    }

    pub fn from_name(name: &str) -> Option<EventType> {
        name.parse().ok()
    }

    pub fn from_code(code: u16) -> Option<EventType> {
        EventType::from_repr(code)
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

/// Whether an event opens a span, closes it, or stands alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, FromRepr)]
#[strum(serialize_all = "snake_case")]
#[repr(u8)]
pub enum Phase {
    Start = 0,
    Stop = 1,
    Instant = 2,
}

impl Phase {
    /// `start`, `stop` or `instant`.
    pub fn name(self) -> &'static str {
        self.into()
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

/// DMA queue types of the device trace; the code is the variant's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, VariantArray, FromRepr)]
#[strum(serialize_all = "snake_case")]
#[repr(u8)]
pub enum DmaQueueType {
    Input = 0,
    Output = 1,
    Weights = 2,
    Instructions = 3,
}

impl DmaQueueType {
    pub const ALL: &[DmaQueueType] = DmaQueueType::VARIANTS;

    /// `input`, `output`, `weights` or `instructions`.
    pub fn name(self) -> &'static str {
        self.into()
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
