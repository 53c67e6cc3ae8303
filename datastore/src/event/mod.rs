//! The event model: system-trace and device-trace records, typed and as stored.
//!
//! System events use the public Neuron names and phases. Each is stored as one ring
//! slot (see `datastore/FORMAT.md`): a timestamp (host ticks, or device nanoseconds for
//! `nc_exec_running`), ids, and four argument words whose meaning depends on the event
//! type. Device events are one per executed instruction or DMA transfer, timed by the
//! core's device clock. Decoding needs the string table and the tick calibration, so it
//! happens in readers, never when emitting.
//!
//! Each system event type's payload is declared once, in `schema.rs`: the emitters'
//! [`payload`] types, the decoded [`EventData`], the slot encoding, the JSON fields and
//! the NTFF arguments all come from that declaration.

mod fields;
mod json;
mod schema;

pub use fields::{Code, FieldValue, Payload, Slots, StringId, Word};
pub use schema::{EventData, payload, sample};

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
    ClockOffset = 20,
    CcWaiting = 21,
    GraphCompile = 22,
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

impl EventData {
    /// Hands each field to `f` as its key and value (see
    /// [`EventData::try_for_each_field`]).
    pub fn for_each_field(&self, mut f: impl FnMut(&'static str, FieldValue<'_>)) {
        let visited = self.try_for_each_field(|key, value| {
            f(key, value);
            Ok::<(), std::convert::Infallible>(())
        });
        match visited {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }
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
    /// The core's rank when the event happened: its rank in the communicator it last
    /// joined (in a job of several processes, its global rank); `None` for a core that
    /// holds no rank, or an event tied to no core.
    pub rank: Option<u32>,
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
