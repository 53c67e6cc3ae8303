//! The per-process shared-memory datastore: lossless counters, the models table,
//! lossy event rings, a string table and an instruction table, in one file per runtime
//! process.
//!
//! The runtime is the only writer ([`writer`], crate-private); tools in other
//! processes map the file read-only through [`DatastoreReader`] and never slow the
//! writer down. The layout is specified in `runtime/FORMAT.md` and carries a version:
//! readers refuse versions they do not know, files owned by another user and files
//! reached through symbolic links.

mod directory;
mod instructions;
pub(crate) mod layout;
mod reader;
mod ring;
mod shm;
mod strings;
pub(crate) mod writer;

pub mod histogram;

use std::path::{Path, PathBuf};

pub use directory::{default_dir, file_path, pid_of_file_name, process_start_time};
pub(crate) use instructions::InstructionTrace;
pub use layout::{LAYOUT_VERSION, MAX_CORES};
pub(crate) use reader::converter_of;
pub use reader::{
    CoreDelta, CoreSnapshot, DatastoreReader, Delta, ErrorCounts, ExecutionCounts, ExitReason, HEARTBEAT_STALE_AFTER,
    LatencyPercentiles, Liveness, ModelInfo, RingStats, RuntimeEntry, RuntimeInfo, Snapshot, Tail, TailStart,
    TraceEvent, discover, discover_new, latency_of_all_cores,
};
pub use ring::RingCursor;
pub(crate) use ring::{Claim, PAYLOAD_WORDS, Payload, RingRef};
pub use strings::MAX_STRING_BYTES;

/// Why a datastore could not be created or opened.
#[derive(Debug, thiserror::Error)]
pub enum DatastoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("refusing {path}: {reason}")]
    Refused { path: PathBuf, reason: String },
    #[error(
        "{path} has datastore layout version {found}, but this tool reads version {supported}; use tools from the same release as the runtime"
    )]
    UnsupportedVersion { path: PathBuf, found: u32, supported: u32 },
    #[error("{path} is not a valid datastore: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "{dir} has {free} bytes free but the datastore needs {needed}; free space there, or lower NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC"
    )]
    NoSpace { dir: PathBuf, needed: u64, free: u64 },
    #[error("datastore sizes are out of range: {0}")]
    Layout(String),
}

impl DatastoreError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> DatastoreError {
        DatastoreError::Io { path: path.to_owned(), source }
    }
}
