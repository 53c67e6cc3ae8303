//! Why a datastore could not be created or opened.

use std::path::{Path, PathBuf};

/// Why a datastore could not be created or opened.
#[derive(Debug, thiserror::Error)]
pub enum DatastoreError {
    /// (Not a `source` error: the message holds it already, and error chains would
    /// repeat it.)
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
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
        DatastoreError::Io { path: path.to_owned(), error: source }
    }
}
