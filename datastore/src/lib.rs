//! The datastore: the shared-memory contract between a Neuron runtime process and the
//! tools that watch it, end to end.
//!
//! One file per runtime process holds lossless counters, a models table, lossy event
//! rings (system trace and device trace, per NeuronCore), a string table and an
//! instruction table (`FORMAT.md` specifies every byte). The runtime is the only writer
//! ([`DatastoreWriter`], with [`Tracer`] on the emit path); tools in other processes map
//! the file read-only through [`DatastoreReader`] and never slow the writer down.
//! Readers refuse layout versions they do not know, files owned by another user and
//! files reached through symbolic links.
//!
//! Beside the file itself, this crate holds what every side of it shares: the event
//! model, each system event's payload declared once, and the JSON shapes ([`event`]), the slot encodings ([`record`]), the clocks
//! ([`clock`]), the plain enums the records carry ([`kinds`], [`topology`]), the
//! directory and the tools' common flags ([`config`]), the host's `/proc` figures
//! ([`host`]), following the runtimes of a directory ([`Runtimes`]) and the sampled
//! figures the viewers draw ([`sample`]). It knows nothing of the compiler, the
//! backend, terminals or HTTP.

mod directory;
mod error;
mod follow;
mod identity;
mod instructions;
mod layout;
mod reader;
mod ring;
mod session;
mod shm;
mod strings;
mod tracer;
mod writer;

#[cfg(test)]
mod test_support;

pub mod clock;
pub mod config;
pub mod event;
pub mod exemplar;
pub mod flight;
pub mod histogram;
pub mod host;
pub mod kinds;
pub mod peaks;
pub mod ranks;
pub mod record;
pub mod sample;
pub mod topology;

pub use directory::{ProcessStatus, default_dir, file_path, pid_of_file_name, process_start_time, process_status};
pub use error::DatastoreError;
pub use event::{
    ClockDomain, DeviceActivity, DeviceEvent, DmaQueueType, EventData, EventType, FieldValue, Payload, Phase,
    SystemEvent, payload,
};
pub use follow::{Followed, OpenFailure, Runtimes};
pub use identity::CommandIdentity;
pub use instructions::{InstructionSpan, InstructionTrace};
pub use kinds::{CollectiveAlgorithm, CollectiveOp, DeviceCategory, Engine, ErrorClass, ExecOutcome, HostCategory};
pub use layout::{
    DEFAULT_INSTRUCTION_TABLE_BYTES, DEFAULT_MAX_EVENTS_PER_NC, DEFAULT_MODEL_SLOTS, DEFAULT_STRING_TABLE_BYTES,
    INSPECT_MAX_EVENTS_PER_NC, INSTRUCTION_BYTES, LAYOUT_VERSION, MAX_CORES, MAX_EVENTS_PER_NC, MIN_EVENTS_PER_NC,
};
pub use reader::{
    ClockOffsetRecord, CommunicatorRecord, CoreDelta, CoreSnapshot, DatastoreReader, Delta, ErrorCounts,
    ExecutionCounts, ExitReason, HEARTBEAT_STALE_AFTER, LatencyPercentiles, Liveness, ModelInfo, RankRecord, RingStats,
    RuntimeEntry, RuntimeInfo, Snapshot, Tail, TailStart, TraceEvent, discover, discover_new, latency_of_all_cores,
};
pub use ring::RingCursor;
pub use session::{
    FETCH_DATA_VERSION, FetchOptions, SessionError, SysTraceConfig, SysTraceFetch, TraceSession, event_type_names,
};
pub use strings::MAX_STRING_BYTES;
pub use topology::{CoreSet, InstanceType, Topology};
pub use tracer::{
    ALL_SYSTEM_EVENTS, At, EventHead, EventIds, InspectConfig, RingPos, Tracer, UnknownEventType, parse_event_filter,
};
pub use writer::{CreateParams, DatastoreWriter, EccCounter, ModelEntry};

/// Word offsets of the counters a writer adds to, as `FORMAT.md` lists them: per
/// NeuronCore ([`core`](counters::core)) and per model slot
/// ([`model`](counters::model)).
pub mod counters {
    pub use crate::layout::{core, model};
}
