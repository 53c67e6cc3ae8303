//! The in-process system trace (`nrt_sys_trace_*`): capture configuration, start and
//! stop, and fetches as JSON, over the runtime's trace session.

use std::collections::BTreeSet;
use std::ffi::{c_char, c_void};
use std::sync::Mutex;

use neuron_datastore::{ALL_SYSTEM_EVENTS, EventType, FetchOptions, SysTraceConfig, event_type_names};
use neuron_runtime::{NrtError, NrtResult, NrtStatus};
use nix::libc;

use crate::boundary::{Status, call, call_void, invalid, non_null, required_str, write_out};
use crate::handles::Registry;
use crate::state;

/// A capture configuration (`nrt_sys_trace_config_t`).
#[derive(Debug)]
pub(crate) struct CConfig(Mutex<Capture>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Capture {
    max_events_per_nc: u64,
    /// Instance cores left out; every other held core is captured.
    disabled_cores: BTreeSet<u32>,
    event_types: u64,
}

impl Default for Capture {
    fn default() -> Capture {
        let defaults = SysTraceConfig::default();
        Capture {
            max_events_per_nc: defaults.max_events_per_nc,
            disabled_cores: BTreeSet::new(),
            event_types: defaults.event_types,
        }
    }
}

/// Fetch options (`nrt_sys_trace_fetch_options_t`).
#[derive(Debug)]
pub(crate) struct CFetchOptions(Mutex<FetchOptions>);

static CONFIGS: Registry<CConfig> = Registry::new("sys trace config", 5);
static FETCH_OPTIONS: Registry<CFetchOptions> = Registry::new("sys trace fetch options", 6);

impl CConfig {
    fn update(&self, change: impl FnOnce(&mut Capture)) {
        change(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn capture(&self) -> Capture {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_allocate(options: *mut *mut c_void) -> Status {
    call("nrt_sys_trace_config_allocate", || {
        non_null(options, "options")?;
        write_out(options, "options", CONFIGS.insert(CConfig(Mutex::default())))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_set_defaults(options: *mut c_void) {
    call_void("nrt_sys_trace_config_set_defaults", || {
        CONFIGS.get(options, "options")?.update(|c| *c = Capture::default());
        Ok(())
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_free(options: *mut c_void) {
    call_void("nrt_sys_trace_config_free", || CONFIGS.free(options, "options"));
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_set_max_events_per_nc(options: *mut c_void, max_events_per_nc: u64) {
    call_void("nrt_sys_trace_config_set_max_events_per_nc", || {
        CONFIGS.get(options, "options")?.update(|c| c.max_events_per_nc = max_events_per_nc);
        Ok(())
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_set_capture_enabled_for_nc(
    options: *mut c_void,
    nc_idx: u32,
    enabled: bool,
) {
    call_void("nrt_sys_trace_config_set_capture_enabled_for_nc", || {
        CONFIGS.get(options, "options")?.update(|c| {
            if enabled {
                c.disabled_cores.remove(&nc_idx);
            } else {
                c.disabled_cores.insert(nc_idx);
            }
        });
        Ok(())
    });
}

/// The event type named `name`, or `NRT_INVALID` listing the names.
pub(crate) fn event_type(name: &str) -> NrtResult<EventType> {
    EventType::from_name(name).ok_or_else(|| {
        invalid("event_type", format!("is `{name}`, not an event type (they are: {})", event_type_names().join(", ")))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_set_capture_enabled_for_event_type(
    options: *mut c_void,
    event_type: *const c_char,
    enabled: bool,
) -> Status {
    call("nrt_sys_trace_config_set_capture_enabled_for_event_type", || {
        let config = CONFIGS.get(options, "options")?;
        let bit = self::event_type(required_str(event_type, "event_type")?)?.bit();
        config.update(|c| if enabled { c.event_types |= bit } else { c.event_types &= !bit });
        Ok(())
    })
}

/// Hands `names` to C as a malloc'd array of malloc'd strings, as the header promises
/// (the caller may free them with free(3)).
pub(crate) fn c_string_array(names: &[&str], out: *mut *mut *const c_char, count: *mut usize) -> NrtResult<()> {
    non_null(out, "event_types")?;
    non_null(count, "count")?;
    let no_memory = || NrtError::new(NrtStatus::Resource, "out of host memory for the event type names");
    // SAFETY: malloc of a non-zero size; the result is checked before use.
    let array = unsafe { libc::malloc(size_of::<*const c_char>() * names.len().max(1)) }.cast::<*const c_char>();
    if array.is_null() {
        return Err(no_memory());
    }
    for (i, name) in names.iter().enumerate() {
        // SAFETY: malloc of the name plus its NUL; on failure the strings so far and the
        // array are freed.
        let text = unsafe { libc::malloc(name.len() + 1) }.cast::<u8>();
        if text.is_null() {
            // SAFETY: the first `i` entries and the array came from malloc above.
            unsafe { free_string_array(array, i) };
            return Err(no_memory());
        }
        // SAFETY: `text` has room for the name and its NUL; `array` for `names.len()` entries.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr(), text, name.len());
            text.add(name.len()).write(0);
            array.add(i).write(text.cast::<c_char>());
        }
    }
    write_out(out, "event_types", array)?;
    write_out(count, "count", names.len())
}

/// Frees `count` malloc'd strings and their malloc'd array.
///
/// # Safety
///
/// `array` and its first `count` entries came from malloc and are freed once.
pub(crate) unsafe fn free_string_array(array: *const *const c_char, count: usize) {
    for i in 0..count {
        // SAFETY: the caller's promise.
        unsafe { libc::free(array.add(i).read().cast_mut().cast()) };
    }
    // SAFETY: the caller's promise.
    unsafe { libc::free(array.cast_mut().cast()) };
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_get_event_types(
    event_types: *mut *mut *const c_char,
    count: *mut usize,
) -> Status {
    call("nrt_sys_trace_get_event_types", || c_string_array(&event_type_names(), event_types, count))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_free_event_types(event_types: *mut *const c_char, count: usize) {
    call_void("nrt_sys_trace_free_event_types", || {
        if !event_types.is_null() {
            // SAFETY: the header requires an array from nrt_sys_trace_get_event_types (or
            // nrt_sys_trace_config_get_enabled_event_types) with its count.
            unsafe { free_string_array(event_types, count) };
        }
        Ok(())
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_get_enabled_event_types(
    options: *mut c_void,
    event_types: *mut *mut *const c_char,
    count: *mut usize,
) -> Status {
    call("nrt_sys_trace_config_get_enabled_event_types", || {
        let mask = CONFIGS.get(options, "options")?.capture().event_types;
        let names: Vec<&str> = EventType::ALL.iter().filter(|t| mask & t.bit() != 0).map(|t| t.name()).collect();
        c_string_array(&names, event_types, count)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_start(options: *mut c_void) -> Status {
    call("nrt_sys_trace_start", || {
        let capture = if options.is_null() { Capture::default() } else { CONFIGS.get(options, "options")?.capture() };
        let runtime = state::runtime()?;
        let cores = if capture.disabled_cores.is_empty() {
            None
        } else {
            Some(runtime.cores()?.cores().iter().copied().filter(|c| !capture.disabled_cores.contains(c)).collect())
        };
        let config = SysTraceConfig {
            max_events_per_nc: capture.max_events_per_nc,
            cores,
            event_types: capture.event_types & ALL_SYSTEM_EVENTS,
        };
        runtime.sys_trace_start(&config)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nrt_sys_trace_stop() -> Status {
    call("nrt_sys_trace_stop", || state::runtime()?.sys_trace_stop())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_options_allocate(options: *mut *mut c_void) -> Status {
    call("nrt_sys_trace_fetch_options_allocate", || {
        non_null(options, "options")?;
        write_out(options, "options", FETCH_OPTIONS.insert(CFetchOptions(Mutex::default())))
    })
}

fn update_fetch_options(function: &'static str, options: *mut c_void, change: impl FnOnce(&mut FetchOptions)) {
    call_void(function, || {
        change(&mut FETCH_OPTIONS.get(options, "options")?.0.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(())
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_options_set_defaults(options: *mut c_void) {
    update_fetch_options("nrt_sys_trace_fetch_options_set_defaults", options, |o| *o = FetchOptions::default());
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_options_free(options: *mut c_void) {
    call_void("nrt_sys_trace_fetch_options_free", || FETCH_OPTIONS.free(options, "options"));
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_options_set_max_events_per_nc(
    options: *mut c_void,
    max_events_per_nc: u64,
) {
    update_fetch_options("nrt_sys_trace_fetch_options_set_max_events_per_nc", options, |o| {
        o.max_events_per_nc = max_events_per_nc;
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_options_set_nc_idx(options: *mut c_void, nc_idx: u64) {
    update_fetch_options("nrt_sys_trace_fetch_options_set_nc_idx", options, |o| {
        o.core = Some(u32::try_from(nc_idx).unwrap_or(u32::MAX));
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_events(
    buffer: *mut *mut c_char,
    written_size: *mut usize,
    options: *const c_void,
) -> Status {
    call("nrt_sys_trace_fetch_events", || {
        non_null(buffer, "buffer")?;
        non_null(written_size, "written_size")?;
        let options = if options.is_null() {
            FetchOptions::default()
        } else {
            FETCH_OPTIONS.get(options, "options")?.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
        };
        let fetch = state::runtime()?.sys_trace_fetch_events_with(&options)?;
        if fetch.lost > 0 {
            tracing::warn!(
                "nrt_sys_trace_fetch_events: {} events were dropped before this fetch (overwritten in the rings, or beyond max_events_per_nc)",
                fetch.lost
            );
        }
        let json = fetch.to_json();
        // SAFETY: malloc of the text plus its NUL, checked before use.
        let text = unsafe { libc::malloc(json.len() + 1) }.cast::<u8>();
        if text.is_null() {
            return Err(NrtError::new(NrtStatus::Resource, "out of host memory for the fetched events"));
        }
        // SAFETY: `text` has room for the JSON and its NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), text, json.len());
            text.add(json.len()).write(0);
        }
        write_out(buffer, "buffer", text.cast::<c_char>())?;
        write_out(written_size, "written_size", json.len())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_buffer_free(buffer: *mut c_char) {
    // SAFETY: the header requires a buffer from nrt_sys_trace_fetch_events (or NULL),
    // which is malloc'd memory.
    unsafe { libc::free(buffer.cast()) };
}
