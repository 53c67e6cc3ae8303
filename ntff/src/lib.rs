//! NTFF v2: the trace file format of `neuron-profile`, specified in `ntff/FORMAT.md`.
//!
//! A file is a header, then framed, checksummed records (metadata, string and
//! descriptor tables, event chunks), then an index and a trailer. [`Writer`] streams
//! events into it with bounded memory; [`NtffFile`] maps a file and decodes chunks
//! lazily, and recovers every complete chunk of a file that was cut short or damaged.
//! The crate takes plain event records and knows nothing of the runtime.

mod clock;
mod codec;
pub mod export;
mod format;
mod model;
mod reader;
pub mod stats;
pub mod summary;
#[cfg(feature = "parquet")]
pub mod tables;
mod wire;
mod writer;

#[allow(clippy::all, missing_debug_implementations, unreachable_pub)]
mod proto {
    include!(concat!(env!("OUT_DIR"), "/ntff.v2.rs"));
}

use std::path::{Path, PathBuf};

pub use clock::{RootClock, SyncClock};
pub use format::{MAX_READ_VERSION, MIN_READ_VERSION, VERSION};
pub use model::{
    Arg, ArgValue, Chunk, ChunkInfo, Clock, Descriptor, DescriptorId, DeviceEvent, Loss, Phase, Sym, SyncPoint,
    SystemEvent,
};
pub use proto::{ClockCalibration, Communicator, CommunicatorMember, Metadata, Model, Topology};
pub use reader::{Damage, NtffFile, Recovery};
pub use writer::{
    MAX_CHUNK_ARGS, MAX_CHUNK_EVENTS, PARTIAL_SUFFIX, ProfileFile, WriteSummary, Writer, unfinished_profiles,
};

/// Why a file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum NtffError {
    /// (Not a `source` error: the message holds it already, and error chains would
    /// repeat it.)
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("cannot write the trace: {0}")]
    Write(std::io::Error),
    #[error("not an NTFF file (the header does not start with the NTFF magic)")]
    NotNtff,
    #[error("the file is {bytes} bytes long, shorter than an NTFF header: nothing was captured")]
    Truncated { bytes: u64 },
    #[error("NTFF version {found} is not supported in this version of the tool (supported: {min} - {max})")]
    UnsupportedVersion { found: u32, min: u32, max: u32 },
    #[error("damaged record at offset {offset}: {reason}")]
    Damaged { offset: u64, reason: String },
    #[error("invalid event: {0}")]
    InvalidEvent(&'static str),
}

impl NtffError {
    fn io(path: &Path, source: std::io::Error) -> NtffError {
        NtffError::Io { path: path.to_owned(), error: source }
    }

    fn write(source: std::io::Error) -> NtffError {
        NtffError::Write(source)
    }
}
