//! Observability from Python: the in-process system trace (`sys_trace_*`, the
//! `nrt_sys_trace_*` calls) and profiles of the executions of a block of code, written
//! to an NTFF file as `neuron-profile capture` writes them.

use std::path::PathBuf;
use std::sync::Mutex;

use neuron_datastore::{ALL_SYSTEM_EVENTS, DatastoreReader, EventType, FetchOptions, SysTraceConfig, TailStart};
use neuron_record::{BackgroundRecording, Recorder, create_writer, metadata};
use pyo3::prelude::*;

use crate::errors::{invalid, nrt_error};
use crate::runtime::Runtime;

/// How profiles written from Python name their tool.
const TOOL: &str = concat!("neuron_virt ", env!("CARGO_PKG_VERSION"));

/// Starts capturing system events of `cores` (instance core indices; all when None)
/// and `event_types` (names; all when None), keeping at most `max_events_per_nc` per core.
#[pyfunction]
#[pyo3(signature = (runtime, *, cores = None, event_types = None, max_events_per_nc = None))]
pub(crate) fn sys_trace_start(
    runtime: &Runtime,
    cores: Option<Vec<u32>>,
    event_types: Option<Vec<String>>,
    max_events_per_nc: Option<u64>,
) -> PyResult<()> {
    let mut config = SysTraceConfig { cores, ..SysTraceConfig::default() };
    if let Some(names) = event_types {
        config.event_types = 0;
        for name in names {
            let event = EventType::from_name(&name).ok_or_else(|| invalid(format!("`{name}` is not an event type")))?;
            config.event_types |= event.bit();
        }
        config.event_types &= ALL_SYSTEM_EVENTS;
    }
    if let Some(max) = max_events_per_nc {
        config.max_events_per_nc = max;
    }
    runtime.inner.sys_trace_start(&config).map_err(nrt_error)
}

/// Stops the capture; what it recorded can still be fetched.
#[pyfunction]
pub(crate) fn sys_trace_stop(runtime: &Runtime) -> PyResult<()> {
    runtime.inner.sys_trace_stop().map_err(nrt_error)
}

/// The captured events not fetched before, as `nrt_sys_trace_fetch_events` JSON text:
/// at most `max_events_per_nc` per core (the oldest), of `core` only when given; the
/// others stay for the next fetch.
#[pyfunction]
#[pyo3(signature = (runtime, *, core = None, max_events_per_nc = None))]
pub(crate) fn sys_trace_fetch_events(
    runtime: &Runtime,
    core: Option<u32>,
    max_events_per_nc: Option<u64>,
) -> PyResult<String> {
    let options = FetchOptions { core, max_events_per_nc: max_events_per_nc.unwrap_or(u64::MAX) };
    Ok(runtime.inner.sys_trace_fetch_events_with(&options).map_err(nrt_error)?.to_json())
}

/// A profile being recorded into an NTFF file.
#[pyclass(frozen, module = "neuron_virt._native")]
pub(crate) struct Profile {
    runtime: neuron_runtime::Runtime,
    path: PathBuf,
    recording: Mutex<Option<BackgroundRecording>>,
}

#[pymethods]
impl Profile {
    /// Starts recording every core's system trace, and the device trace when `device`,
    /// into `path`.
    #[staticmethod]
    fn start(py: Python<'_>, runtime: &Runtime, path: PathBuf, device: bool) -> PyResult<Profile> {
        let inner = runtime.inner.clone();
        let datastore = inner.datastore_path().map_err(nrt_error)?;
        let reader =
            DatastoreReader::open(&datastore).map_err(|e| invalid(format!("cannot read the datastore: {e}")))?;
        let command: Vec<String> =
            py.import("sys").and_then(|sys| sys.getattr("argv")).and_then(|argv| argv.extract()).unwrap_or_default();
        let writer = create_writer(&path, &metadata(reader.info(), TOOL, "python", &command))
            .map_err(|e| invalid(e.to_string()))?;
        let tail = reader.tail(TailStart::Now, None, ALL_SYSTEM_EVENTS, true);
        inner.set_trace_recording_of(true, device).map_err(nrt_error)?;
        let recording = BackgroundRecording::start(reader, tail, Recorder::new(writer))
            .map_err(|e| invalid(format!("cannot start the profile thread: {e}")))?;
        Ok(Profile { runtime: inner, path, recording: Mutex::new(Some(recording)) })
    }

    /// Switches the device trace on or off for the executions that start from now on.
    fn set_device_trace(&self, on: bool) -> PyResult<()> {
        self.runtime.set_trace_recording_of(true, on).map_err(nrt_error)
    }

    /// Stops recording and finishes the file; returns `(system_events, device_events,
    /// lost_events)` it holds.
    fn stop(&self, py: Python<'_>) -> PyResult<(u64, u64, u64)> {
        let recording = self.recording.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(recording) = recording else { return Err(invalid("the profile was stopped already")) };
        let inspect = self.runtime.config().inspect.clone();
        let restored = self.runtime.set_trace_recording_of(inspect.system, inspect.device);
        let summary = py.detach(|| recording.finish()).map_err(|e| invalid(e.to_string()))?;
        restored.map_err(nrt_error)?;
        Ok((summary.system_events, summary.device_events, summary.lost_events))
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }
}
