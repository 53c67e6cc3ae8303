//! `nrt_inspect_config_*` and `nrt_inspect_begin_with_options`: the inspect recording of
//! `nrt_inspect_begin`, configured through an options object instead of the
//! `NEURON_RT_INSPECT_*` variables; `nrt_inspect_stop` ends either.

use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::Mutex;

use neuron_datastore::ALL_SYSTEM_EVENTS;
use neuron_runtime::config::DEFAULT_INSPECT_OUTPUT_DIR;
use neuron_runtime::{NrtError, NrtResult, NrtStatus};

use crate::boundary::{Status, call, call_void, invalid, non_null, required_str, unsupported, write_out};
use crate::handles::Registry;
use crate::profile::{Scope, create_output_dir, inspect_file_name, start};
use crate::state;
use crate::sys_trace::{c_string_array, event_type, free_string_array};

/// The activity types, in their bit order.
const ACTIVITIES: [&str; 4] = ["system_profile", "device_profile", "host_memory", "cpu_util"];
const SYSTEM_PROFILE: u8 = 1;
const DEVICE_PROFILE: u8 = 2;
const ALL_ACTIVITIES: u8 = 0b1111;

#[derive(Debug, Clone)]
struct Options {
    session_id: c_int,
    output_dir: PathBuf,
    disabled_cores: BTreeSet<u32>,
    event_types: u64,
    activities: u8,
    enable_inspect: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            session_id: 1,
            output_dir: PathBuf::from(DEFAULT_INSPECT_OUTPUT_DIR),
            disabled_cores: BTreeSet::new(),
            event_types: ALL_SYSTEM_EVENTS,
            activities: ALL_ACTIVITIES,
            enable_inspect: false,
        }
    }
}

/// `nrt_inspect_config_t`.
#[derive(Debug, Default)]
pub(crate) struct CInspectConfig(Mutex<Options>);

static CONFIGS: Registry<CInspectConfig> = Registry::new("inspect config", 8);

/// Applies `change` to the options of handle `options`.
fn update(options: *mut c_void, change: impl FnOnce(&mut Options) -> NrtResult<()>) -> NrtResult<()> {
    change(&mut CONFIGS.get(options, "options")?.0.lock().unwrap_or_else(|e| e.into_inner()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_allocate(options: *mut *mut c_void) -> Status {
    call("nrt_inspect_config_allocate", || {
        non_null(options, "options")?;
        write_out(options, "options", CONFIGS.insert(CInspectConfig::default()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_set_defaults(options: *mut c_void) -> Status {
    call("nrt_inspect_config_set_defaults", || {
        update(options, |o| {
            *o = Options::default();
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_free(options: *mut c_void) -> Status {
    call("nrt_inspect_config_free", || CONFIGS.free(options, "options"))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_set_session_id(options: *mut c_void, session_id: c_int) -> Status {
    call("nrt_inspect_config_set_session_id", || {
        update(options, |o| {
            o.session_id = session_id;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_set_output_dir(options: *mut c_void, output_dir: *const c_char) -> Status {
    call("nrt_inspect_config_set_output_dir", || {
        let dir = required_str(output_dir, "output_dir")?;
        if dir.is_empty() {
            return Err(invalid("output_dir", "is empty"));
        }
        update(options, |o| {
            o.output_dir = PathBuf::from(dir);
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_set_sys_trace_max_events_per_nc(
    options: *mut c_void,
    _sys_trace_max_events_per_nc: u64,
) -> Status {
    call("nrt_inspect_config_set_sys_trace_max_events_per_nc", || {
        // The rings keep the size nrt_init gave them; the recording drains them every
        // 10 ms, so a smaller bound would only lose events.
        update(options, |_| Ok(()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_set_capture_enabled_for_nc(
    options: *mut c_void,
    nc_idx: u32,
    enabled: bool,
) -> Status {
    call("nrt_inspect_config_set_capture_enabled_for_nc", || {
        update(options, |o| {
            if enabled {
                o.disabled_cores.remove(&nc_idx);
            } else {
                o.disabled_cores.insert(nc_idx);
            }
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_set_capture_enabled_for_event_type_string(
    options: *mut c_void,
    event_type: *const c_char,
    enabled: bool,
) -> Status {
    call("nrt_inspect_config_set_capture_enabled_for_event_type_string", || {
        let bit = self::event_type(required_str(event_type, "event_type")?)?.bit();
        update(options, |o| {
            if enabled {
                o.event_types |= bit;
            } else {
                o.event_types &= !bit;
            }
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_set_enable_inspect(options: *mut c_void, enable_inspect: bool) -> Status {
    call("nrt_inspect_config_set_enable_inspect", || {
        update(options, |o| {
            o.enable_inspect = enable_inspect;
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_set_enable_inspect_on_fail(
    options: *mut c_void,
    enable_inspect_on_fail: bool,
) -> Status {
    call("nrt_inspect_config_set_enable_inspect_on_fail", || {
        update(options, |_| match enable_inspect_on_fail {
            false => Ok(()),
            true => Err(unsupported(
                "profiles of failed executions only; run the program under `neuron-profile inspect` with NEURON_RT_INSPECT_ON_FAIL=1",
            )),
        })
    })
}

/// The bit of activity type `name` (`all`: every one).
fn activity_bits(name: &str) -> NrtResult<u8> {
    if name == "all" {
        return Ok(ALL_ACTIVITIES);
    }
    ACTIVITIES
        .iter()
        .position(|a| *a == name)
        .map(|i| 1 << i)
        .ok_or_else(|| invalid("activity_type", format!("is `{name}`, not one of {} or all", ACTIVITIES.join(", "))))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_set_activity(
    options: *mut c_void,
    activity_type: *const c_char,
    enabled: bool,
) -> Status {
    call("nrt_inspect_config_set_activity", || {
        let bits = activity_bits(required_str(activity_type, "activity_type")?)?;
        update(options, |o| {
            if enabled {
                o.activities |= bits;
            } else {
                o.activities &= !bits;
            }
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_get_all_activity_types(
    activity_types: *mut *mut *const c_char,
    count: *mut usize,
) -> Status {
    call("nrt_inspect_config_get_all_activity_types", || c_string_array(&ACTIVITIES, activity_types, count))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_get_enabled_activity_types(
    options: *mut c_void,
    activity_types: *mut *mut *const c_char,
    count: *mut usize,
) -> Status {
    call("nrt_inspect_config_get_enabled_activity_types", || {
        let mut enabled = Vec::new();
        update(options, |o| {
            enabled = (0..ACTIVITIES.len()).filter(|i| o.activities & (1 << i) != 0).map(|i| ACTIVITIES[i]).collect();
            Ok(())
        })?;
        c_string_array(&enabled, activity_types, count)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_config_free_activity_types(activity_types: *mut *const c_char, count: usize) {
    call_void("nrt_inspect_config_free_activity_types", || {
        if !activity_types.is_null() {
            // SAFETY: the header requires an array from nrt_inspect_config_get_*_activity_types
            // with its count.
            unsafe { free_string_array(activity_types, count) };
        }
        Ok(())
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_inspect_begin_with_options(options: *mut c_void) -> Status {
    call("nrt_inspect_begin_with_options", || {
        let options = match options.is_null() {
            true => Options::default(),
            false => CONFIGS.get(options, "options")?.0.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        };
        let runtime = state::runtime()?;
        if !options.enable_inspect {
            tracing::info!(
                "nrt_inspect_begin_with_options: inspect is not enabled in the options; nothing is recorded"
            );
            return Ok(());
        }
        if options.activities & (SYSTEM_PROFILE | DEVICE_PROFILE) == 0 {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                "neither system_profile nor device_profile is enabled: there is nothing to record",
            ));
        }
        let cores = match options.disabled_cores.is_empty() {
            true => None,
            false => {
                Some(runtime.cores()?.cores().iter().copied().filter(|c| !options.disabled_cores.contains(c)).collect())
            }
        };
        let event_types = if options.activities & SYSTEM_PROFILE != 0 { options.event_types } else { 0 };
        let scope = Scope::Process { cores, event_types, device: options.activities & DEVICE_PROFILE != 0 };
        create_output_dir(&options.output_dir)?;
        let path = options.output_dir.join(inspect_file_name(&format!("session{}", options.session_id)));
        start(runtime, path, scope, "inspect")
    })
}
