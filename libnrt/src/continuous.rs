//! Continuous device profiling (`nrt_profile_continuous_*`): while it runs, every
//! execution is traced on the device; `nrt_profile_continuous_save(vnc, options)`
//! writes the latest execution of that core, read back from the trace rings, to an
//! NTFF file of its own in the options' output directory. Executions that are not
//! saved cost only their trace records in the rings.

use std::ffi::{c_char, c_void};
use std::path::PathBuf;
use std::sync::Mutex;

use neuron_datastore::{ALL_SYSTEM_EVENTS, DatastoreReader, EventType, Phase, TailStart, TraceEvent};
use neuron_record::{POLL_RECORDS, Recorder, create_writer, metadata};
use neuron_runtime::config::DEFAULT_INSPECT_OUTPUT_DIR;
use neuron_runtime::{NrtError, NrtResult, NrtStatus};

use crate::boundary::{Status, call, non_null, required_str, write_out};
use crate::handles::Registry;
use crate::profile::{
    TOOL, continuous_running, create_output_dir, inspect_file_name, recording_running, set_continuous,
};
use crate::state;

/// `nrt_profile_continuous_options_t`: where saved profiles go.
#[derive(Debug)]
pub(crate) struct CContinuousOptions(Mutex<PathBuf>);

static OPTIONS: Registry<CContinuousOptions> = Registry::new("continuous profiling options", 7);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_continuous_options_allocate(options: *mut *mut c_void) -> Status {
    call("nrt_profile_continuous_options_allocate", || {
        non_null(options, "options")?;
        let defaults = CContinuousOptions(Mutex::new(PathBuf::from(DEFAULT_INSPECT_OUTPUT_DIR)));
        write_out(options, "options", OPTIONS.insert(defaults))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_continuous_options_free(options: *mut c_void) -> Status {
    call("nrt_profile_continuous_options_free", || OPTIONS.free(options, "options"))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_continuous_options_set_output_dir(
    options: *mut c_void,
    output_dir: *const c_char,
) -> Status {
    call("nrt_profile_continuous_options_set_output_dir", || {
        let entry = OPTIONS.get(options, "options")?;
        let dir = required_str(output_dir, "output_dir")?;
        if dir.is_empty() {
            return Err(NrtError::new(NrtStatus::Invalid, "argument `output_dir` is empty"));
        }
        *entry.0.lock().unwrap_or_else(|e| e.into_inner()) = PathBuf::from(dir);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_continuous_start(options: *mut c_void) -> Status {
    call("nrt_profile_continuous_start", || {
        if !options.is_null() {
            OPTIONS.get(options, "options")?;
        }
        let runtime = state::runtime()?;
        if set_continuous(true) {
            return Err(NrtError::new(NrtStatus::Invalid, "continuous profiling is already running"));
        }
        let system = runtime.config().inspect.system || recording_running();
        runtime.set_trace_recording_of(system, true).inspect_err(|_| {
            set_continuous(false);
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_profile_continuous_stop() -> Status {
    call("nrt_profile_continuous_stop", || {
        if !set_continuous(false) {
            return Err(NrtError::new(NrtStatus::Invalid, "continuous profiling is not running"));
        }
        if recording_running() {
            return Ok(());
        }
        let runtime = state::runtime()?;
        let inspect = runtime.config().inspect.clone();
        runtime.set_trace_recording_of(inspect.system, inspect.device)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_continuous_save(vnc: u32, options: *mut c_void) -> Status {
    call("nrt_profile_continuous_save", || {
        if !continuous_running() {
            return Err(NrtError::new(NrtStatus::Invalid, "continuous profiling is not running; start it first"));
        }
        let directory = match options.is_null() {
            true => PathBuf::from(DEFAULT_INSPECT_OUTPUT_DIR),
            false => OPTIONS.get(options, "options")?.0.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        };
        let runtime = state::runtime()?;
        let core = state::core_of(&runtime, i64::from(vnc), "vnc")?;
        save_latest_execution(&runtime.datastore_path()?, core, &directory).map(drop)
    })
}

/// Writes the latest completed execution of `core` that the rings hold into a new file
/// in `directory`; returns its path.
fn save_latest_execution(datastore: &std::path::Path, core: u32, directory: &std::path::Path) -> NrtResult<PathBuf> {
    let failure = |what: &str, e: &dyn std::fmt::Display| NrtError::new(NrtStatus::Failure, format!("{what}: {e}"));
    let reader = DatastoreReader::open(datastore).map_err(|e| failure("cannot read this process's datastore", &e))?;
    let mut tail = reader.tail(TailStart::Oldest, Some(&[core]), ALL_SYSTEM_EVENTS, true);
    let mut events = Vec::new();
    loop {
        let before = events.len();
        tail.poll(&reader, POLL_RECORDS, false, &mut events);
        if events.len() - before < POLL_RECORDS {
            break;
        }
    }
    let latest = events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::System(s) if s.event_type == EventType::NcExecRunning && s.phase == Phase::Stop => s.exec_id,
            _ => None,
        })
        .max()
        .ok_or_else(|| {
            NrtError::new(NrtStatus::Invalid, format!("no execution of nc{core} is in the trace rings yet"))
        })?;
    create_output_dir(directory)?;
    let path = directory.join(inspect_file_name(&format!("nc{core}-exec{latest}")));
    let command: Vec<String> = std::env::args().collect();
    let writer = create_writer(&path, &metadata(reader.info(), TOOL, "continuous", &command))
        .map_err(|e| NrtError::new(NrtStatus::Invalid, e.to_string()))?;
    let mut recorder = Recorder::new(writer);
    let write = |e: neuron_record::RecordError| failure("cannot write the profile", &e);
    recorder.models(&reader.models(), &|_| String::new()).map_err(write)?;
    for event in &events {
        let exec_id = match event {
            TraceEvent::System(s) => s.exec_id,
            TraceEvent::Device(d) => d.exec_id,
        };
        if exec_id == Some(latest) {
            recorder.event(event).map_err(write)?;
        }
    }
    recorder.finish().map_err(write)?;
    tracing::info!("nrt_profile_continuous_save: execution {latest} of nc{core} written to {}", path.display());
    Ok(path)
}
