//! Profiles a C program writes itself (`nrt_profile_start`/`_stop`, `nrt_inspect_begin`/
//! `_stop`, `nrt_trace_start`/`_stop`): one recording at a time, drained from the
//! process's own datastore by a background thread into an NTFF file, exactly as
//! `neuron-profile capture` records a runtime (`neuron_record::Recorder`).
//!
//! While a recording runs, device tracing is on; stopping it returns the rings to what
//! `NEURON_RT_INSPECT_*` configured.

use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use neuron_datastore::{ALL_SYSTEM_EVENTS, DatastoreReader, TailStart, TraceEvent};
use neuron_record::{BackgroundRecording, Recorder, create_writer, metadata};
use neuron_runtime::{NrtError, NrtResult, NrtStatus, Runtime};

use crate::boundary::{Status, call, required_str};
use crate::models;
use crate::state;

/// How profiles written through this library name their tool.
pub(crate) const TOOL: &str = concat!("libnrt ", env!("CARGO_PKG_VERSION"));

/// What a running recording keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The executions of one model (`nrt_profile_start`).
    Model { model_id: u32, core: u32 },
    /// The process: these cores (all when `None`) and system event types, and the
    /// device trace or not (`nrt_inspect_begin`, `nrt_trace_start`).
    Process { cores: Option<Vec<u32>>, event_types: u64, device: bool },
}

impl Scope {
    /// Everything the process does.
    pub(crate) fn everything() -> Scope {
        Scope::Process { cores: None, event_types: ALL_SYSTEM_EVENTS, device: true }
    }
}

#[derive(Debug)]
struct Recording {
    /// `nrt_profile`, `inspect` or `nrt_trace`: which stop function ends it.
    kind: &'static str,
    path: PathBuf,
    /// The private directory a recording whose file name comes at the end writes into.
    scratch: Option<tempfile::TempDir>,
    runtime: Runtime,
    drainer: BackgroundRecording,
}

static RECORDING: Mutex<Option<Recording>> = Mutex::new(None);

/// Continuous profiling (`continuous.rs`) keeps the device trace on.
static CONTINUOUS: AtomicBool = AtomicBool::new(false);

/// Whether continuous profiling is on.
pub(crate) fn continuous_running() -> bool {
    CONTINUOUS.load(Ordering::Acquire)
}

/// Switches continuous profiling on or off; returns whether it was on.
pub(crate) fn set_continuous(on: bool) -> bool {
    CONTINUOUS.swap(on, Ordering::AcqRel)
}

fn recording() -> std::sync::MutexGuard<'static, Option<Recording>> {
    RECORDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts recording `scope` of `runtime` into `path`.
pub(crate) fn start(runtime: Runtime, path: PathBuf, scope: Scope, capture_kind: &'static str) -> NrtResult<()> {
    start_in(runtime, path, None, scope, capture_kind)
}

/// As [`start`], with the private directory `path` is in, removed with the recording.
fn start_in(
    runtime: Runtime,
    path: PathBuf,
    scratch: Option<tempfile::TempDir>,
    scope: Scope,
    capture_kind: &'static str,
) -> NrtResult<()> {
    let mut slot = recording();
    if let Some(running) = slot.as_ref() {
        return Err(NrtError::new(
            NrtStatus::Invalid,
            format!("a profile is already being recorded into {}; stop it first", running.path.display()),
        ));
    }
    let reader = DatastoreReader::open(&runtime.datastore_path()?)
        .map_err(|e| NrtError::new(NrtStatus::Failure, format!("cannot read this process's datastore: {e}")))?;
    let command: Vec<String> = std::env::args().collect();
    let writer = create_writer(&path, &metadata(reader.info(), TOOL, capture_kind, &command))
        .map_err(|e| NrtError::new(NrtStatus::Invalid, e.to_string()))?;
    let mut recorder = Recorder::new(writer);
    let (cores, event_types, device) = match scope {
        Scope::Model { model_id, core } => {
            recorder.keep_only(move |event| match event {
                TraceEvent::System(e) => e.model_id.is_none_or(|id| id == model_id),
                TraceEvent::Device(e) => e.model_id == model_id,
            });
            (Some(vec![core]), ALL_SYSTEM_EVENTS, true)
        }
        Scope::Process { cores, event_types, device } => (cores, event_types, device),
    };
    let tail = reader.tail(TailStart::Now, cores.as_deref(), event_types, device);
    runtime.set_trace_recording_of(true, device || runtime.config().inspect.device)?;
    let drainer = BackgroundRecording::start(reader, tail, recorder)
        .map_err(|e| NrtError::new(NrtStatus::Resource, format!("cannot start the profile thread: {e}")))?;
    *slot = Some(Recording { kind: capture_kind, path, scratch, runtime, drainer });
    Ok(())
}

/// Which recording a stop function ends.
#[derive(Debug, Clone, Copy)]
enum Ending<'a> {
    /// `nrt_profile_stop(path)`.
    Profile(&'a Path),
    /// `nrt_inspect_stop`, `nrt_trace_stop`: the recording of that kind.
    Kind(&'static str),
    /// `nrt_close`: whichever runs.
    Any,
}

/// Stops the recording `ending` names, writes its file and returns its path (and the
/// recording's private directory, if it has one, to move the file out of).
fn stop(ending: Ending<'_>) -> NrtResult<(PathBuf, Option<tempfile::TempDir>)> {
    let mut slot = recording();
    let Some(running) = slot.take_if(|r| match ending {
        Ending::Profile(path) => r.kind == "nrt_profile" && r.path == path,
        Ending::Kind(kind) => r.kind == kind,
        Ending::Any => true,
    }) else {
        return Err(match (slot.as_ref(), ending) {
            (Some(other), Ending::Profile(path)) => NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "no profile is being recorded into {}; the running recording ({}) goes to {}",
                    path.display(),
                    other.kind,
                    other.path.display()
                ),
            ),
            (Some(other), _) => NrtError::new(
                NrtStatus::Invalid,
                format!("the running recording is of another kind ({}); stop it with its own function", other.kind),
            ),
            (None, _) => NrtError::new(NrtStatus::Invalid, "no profile is being recorded; start one first"),
        });
    };
    let inspect = running.runtime.config().inspect.clone();
    let device = inspect.device || continuous_running();
    let restored = running.runtime.set_trace_recording_of(inspect.system, device);
    let summary = running.drainer.finish().map_err(|e| NrtError::new(NrtStatus::Failure, e.to_string()))?;
    // A closed runtime has nothing left to restore.
    if let Err(error) = restored
        && error.status != NrtStatus::Closed
    {
        return Err(error);
    }
    tracing::info!(
        "profile written to {}: {} system events, {} device events, {} lost",
        running.path.display(),
        summary.system_events,
        summary.device_events,
        summary.lost_events
    );
    Ok((running.path, running.scratch))
}

/// Finishes the running recording, if any (`nrt_close` calls it).
pub(crate) fn finish_before_close() {
    set_continuous(false);
    if recording().is_some()
        && let Err(error) = stop(Ending::Any)
    {
        tracing::error!("nrt_close: the running profile could not be finished: {error}");
    }
}

/// The name `neuron-profile inspect` gives the profile of this process in `session`.
pub(crate) fn inspect_file_name(session: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    format!("{}-pid{}-{session}.ntff", if host.is_empty() { "host" } else { &host }, std::process::id())
}

/// Creates the directory profiles are written into.
pub(crate) fn create_output_dir(directory: &Path) -> NrtResult<()> {
    std::fs::create_dir_all(directory).map_err(|e| {
        NrtError::new(NrtStatus::Invalid, format!("cannot create the output directory {}: {e}", directory.display()))
    })
}

/// Whether a recording is running.
pub(crate) fn recording_running() -> bool {
    recording().is_some()
}

/// The path of a C file name argument.
fn path_argument(filename: *const c_char) -> NrtResult<PathBuf> {
    let name = required_str(filename, "filename")?;
    if name.is_empty() {
        return Err(NrtError::new(NrtStatus::Invalid, "argument `filename` is empty"));
    }
    Ok(PathBuf::from(name))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_start(model: *mut c_void, filename: *const c_char) -> Status {
    call("nrt_profile_start", || {
        let c_model = models::model(model)?;
        let path = path_argument(filename)?;
        let scope = Scope::Model { model_id: c_model.model.id(), core: c_model.model.core() };
        start(c_model.runtime.clone(), path, scope, "nrt_profile")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_stop(filename: *const c_char) -> Status {
    call("nrt_profile_stop", || stop(Ending::Profile(&path_argument(filename)?)).map(drop))
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_inspect_begin() -> Status {
    call("nrt_inspect_begin", || {
        let runtime = state::runtime()?;
        let directory = runtime.config().inspect_output_dir.clone();
        create_output_dir(&directory)?;
        let session = neuron_datastore::clock::realtime_ns() / 1_000_000_000;
        start(runtime, directory.join(inspect_file_name(&session.to_string())), Scope::everything(), "inspect")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_inspect_stop() -> Status {
    call("nrt_inspect_stop", || stop(Ending::Kind("inspect")).map(drop))
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_trace_start(_trace_mem: bool) -> Status {
    call("nrt_trace_start", || {
        // The file name comes at the end; record into a private directory until then.
        let runtime = state::runtime()?;
        let scratch = tempfile::Builder::new()
            .prefix("nrt-trace-")
            .tempdir()
            .map_err(|e| NrtError::new(NrtStatus::Resource, format!("cannot create a directory for the trace: {e}")))?;
        let path = scratch.path().join("trace.ntff");
        start_in(runtime, path, Some(scratch), Scope::everything(), "nrt_trace")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_trace_stop(filename: *const c_char) -> Status {
    call("nrt_trace_stop", || {
        let target = path_argument(filename)?;
        let (written, _scratch) = stop(Ending::Kind("nrt_trace"))?;
        std::fs::rename(&written, &target)
            .or_else(|_| std::fs::copy(&written, &target).and_then(|_| std::fs::remove_file(&written)))
            .map_err(|e| NrtError::new(NrtStatus::Invalid, format!("cannot write {}: {e}", target.display())))
    })
}
