//! The plain records a trace holds: system events, device events and their
//! descriptors, losses and clock sync points. Names are interned: a [`Sym`] is an id in
//! the file's string table, a [`DescriptorId`] an id in its descriptor table.

/// An id in the string table; `Sym(0)` is the empty string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Sym(pub u32);

impl Sym {
    pub const EMPTY: Sym = Sym(0);
}

/// An id in the descriptor table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DescriptorId(pub u32);

/// Whether a system event opens a span, closes it, or stands alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Start,
    Stop,
    Instant,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Start => "start",
            Phase::Stop => "stop",
            Phase::Instant => "instant",
        }
    }
}

/// Which clock a system event's timestamp was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Clock {
    /// Host `CLOCK_MONOTONIC` nanoseconds.
    Host,
    /// The NeuronCore's device clock (see the sync points).
    Device,
}

/// One system trace event (`nrt_execute` start, `nrt_tensor_read` stop, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemEvent {
    /// The NeuronCore, or `None` for events tied to no core.
    pub core: Option<u32>,
    /// Position in the source ring.
    pub id: u64,
    /// The public event name.
    pub name: Sym,
    pub phase: Phase,
    pub clock: Clock,
    pub timestamp_ns: u64,
    /// Shared by a start and its stop.
    pub tracking_id: u64,
    pub thread_id: u32,
    /// Below `u64::MAX`.
    pub exec_id: Option<u64>,
    /// Below `u32::MAX`.
    pub model_id: Option<u32>,
    /// Below `u64::MAX`.
    pub nrta_seq_id: Option<u64>,
    /// What the event says beyond the common fields.
    pub args: Vec<Arg>,
}

/// A named argument of a system event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arg {
    pub key: Sym,
    pub value: ArgValue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArgValue {
    U64(u64),
    I64(i64),
    Str(Sym),
}

/// One device trace event: an instruction on an engine or a DMA transfer, timed by the
/// core's device clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceEvent {
    pub core: u32,
    /// Position in the source ring.
    pub id: u64,
    /// Below `u64::MAX`.
    pub exec_id: Option<u64>,
    pub start_ns: u64,
    pub end_ns: u64,
    /// What ran: the static part, shared by every execution of it.
    pub descriptor: DescriptorId,
}

/// The static part of a device event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Descriptor {
    Instruction {
        model_id: u32,
        /// `PE`, `ACT`, `DVE`, `POOL`, `SP`.
        engine: Sym,
        opcode: Sym,
        /// The HLO instruction it was lowered from.
        hlo: Sym,
        /// Position in the program's global order.
        step: u32,
        flops: u64,
        bytes_read: u64,
        bytes_written: u64,
    },
    Dma {
        model_id: u32,
        /// `input`, `output`, `weights`, `instructions`.
        queue: Sym,
        index: u32,
        bytes: u64,
    },
}

impl Descriptor {
    pub fn model_id(&self) -> u32 {
        match *self {
            Descriptor::Instruction { model_id, .. } | Descriptor::Dma { model_id, .. } => model_id,
        }
    }
}

/// Events a source ring dropped, before the event at `before` of its chunk's system or
/// device events (`before` equal to their count: after the last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loss {
    pub device: bool,
    pub before: u32,
    pub events: u64,
}

/// A device clock reading paired with the host clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncPoint {
    pub host_ns: u64,
    pub device_ns: u64,
}

/// The events of one stream (a NeuronCore, or the host) in one chunk of a file, each
/// kind in the order it was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunk {
    /// The NeuronCore, or `None` for events tied to no core.
    pub core: Option<u32>,
    pub system: Vec<SystemEvent>,
    pub device: Vec<DeviceEvent>,
    pub losses: Vec<Loss>,
    pub sync_points: Vec<SyncPoint>,
}

/// Where a chunk is and what it holds (from the index, or found by a recovery scan).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    pub offset: u64,
    pub core: Option<u32>,
    pub system_events: u32,
    pub device_events: u32,
    pub lost_events: u64,
    /// Host-clock span of its events: the host-timed system events, and the device
    /// events through their core's latest sync point when the writer had one.
    pub host_span: Option<(u64, u64)>,
    /// Device-clock span of its device events and device-timed system events.
    pub device_span: Option<(u64, u64)>,
}

pub(crate) fn stream_code(core: Option<u32>) -> u32 {
    core.map_or(0, |c| c + 1)
}

pub(crate) fn core_of_stream(stream: u32) -> Option<u32> {
    stream.checked_sub(1)
}
