//! The boundary between C callers and the Rust runtime: every exported function runs
//! its body through [`call`] (or a sibling), which turns an [`NrtError`] into its public
//! status code with a log line, and a panic into `NRT_FAILURE` with a log line, so that
//! no unwind ever crosses the C ABI. The argument helpers check what C hands us (NULL
//! pointers, strings that are not UTF-8) and name the argument when they refuse it.

use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use neuron_runtime::{NrtError, NrtResult, NrtStatus};

/// An `NRT_STATUS` as the C functions return it (a C enum is an `int`).
pub type Status = u32;

pub(crate) const SUCCESS: Status = 0;

/// Runs the body of the exported function `function` and returns its status.
pub(crate) fn call(function: &'static str, body: impl FnOnce() -> NrtResult<()>) -> Status {
    guarded(function, NrtStatus::Failure.code(), || match body() {
        Ok(()) => SUCCESS,
        Err(error) => failed(function, &error),
    })
}

/// Runs the body of an exported function that returns no status (its errors are only
/// logged).
pub(crate) fn call_void(function: &'static str, body: impl FnOnce() -> NrtResult<()>) {
    guarded(function, (), || {
        if let Err(error) = body() {
            failed(function, &error);
        }
    });
}

/// Runs the body of an exported function that returns a value, or `fallback` (logged)
/// when it fails.
pub(crate) fn call_value<T>(function: &'static str, fallback: T, body: impl FnOnce() -> NrtResult<T>) -> T {
    let value = guarded(function, None, || match body() {
        Ok(value) => Some(value),
        Err(error) => {
            failed(function, &error);
            None
        }
    });
    value.unwrap_or(fallback)
}

/// `body`'s result, or `on_panic` (logged) when it panicked. Everything an exported
/// function does, its logging included, runs inside.
fn guarded<T>(function: &'static str, on_panic: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(|| {
        crate::state::init_logging();
        body()
    })) {
        Ok(result) => result,
        Err(panic) => {
            let message = neuron_runtime::panic_message(&*panic);
            tracing::error!(
                "{function}: internal error ({message}); returning NRT_FAILURE. Please report it with the log above"
            );
            on_panic
        }
    }
}

/// Logs `error` for `function` and returns its code. A full queue is the expected
/// answer of a caller that schedules until the queue is full, so it is not an error.
fn failed(function: &str, error: &NrtError) -> Status {
    let status = c_status(error.status);
    match status {
        NrtStatus::QueueFull => tracing::debug!("{function}: {status}: {}", error.message),
        _ => tracing::error!("{function}: {status}: {}", error.message),
    }
    status.code()
}

/// The status C callers get for `status`. A tensor set that does not match the model
/// is `NRT_EXEC_BAD_INPUT` in the Rust API but `NRT_INVALID` here, as libnrt's header
/// documents it ("input tensor name/size does not match the model").
pub(crate) fn c_status(status: NrtStatus) -> NrtStatus {
    match status {
        NrtStatus::ExecBadInput => NrtStatus::Invalid,
        other => other,
    }
}

/// An `NRT_INVALID` error about argument `argument`.
pub(crate) fn invalid(argument: &str, problem: impl std::fmt::Display) -> NrtError {
    NrtError::new(NrtStatus::Invalid, format!("argument `{argument}` {problem}"))
}

/// `NRT_INVALID` for a function that means nothing on virtual NeuronCores.
pub(crate) fn unsupported(why: &str) -> NrtError {
    NrtError::new(NrtStatus::Invalid, format!("not supported on virtual NeuronCores: {why}"))
}

/// The pointer, or `NRT_INVALID` naming `argument` when it is NULL.
pub(crate) fn non_null<T>(pointer: *mut T, argument: &str) -> NrtResult<*mut T> {
    if pointer.is_null() { Err(invalid(argument, "is NULL")) } else { Ok(pointer) }
}

/// Stores `value` through the out-pointer `out`.
pub(crate) fn write_out<T>(out: *mut T, argument: &str, value: T) -> NrtResult<()> {
    let out = non_null(out, argument)?;
    // SAFETY: `out` is not NULL, and the C caller passes a pointer to writable storage
    // of type `T`, as the header declares.
    unsafe { out.write(value) };
    Ok(())
}

/// The string `text` points to, or `default` when it is NULL.
pub(crate) fn optional_str<'a>(text: *const c_char, argument: &str, default: &'a str) -> NrtResult<&'a str> {
    if text.is_null() {
        return Ok(default);
    }
    // SAFETY: a non-NULL `const char *` argument points to a NUL-terminated string
    // that stays valid for the call, as the header requires.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map_err(|_| invalid(argument, "is not UTF-8 text"))
}

/// The string `text` points to; `NRT_INVALID` when it is NULL.
pub(crate) fn required_str<'a>(text: *const c_char, argument: &str) -> NrtResult<&'a str> {
    non_null(text.cast_mut(), argument)?;
    optional_str(text, argument, "")
}

/// Copies `value` into the C struct at `out`, at most `capacity` bytes of it (the size
/// the caller's header gave the struct); returns how many were written.
pub(crate) fn write_versioned<T: Copy>(out: *mut T, capacity: usize, argument: &str, value: &T) -> NrtResult<usize> {
    let out = non_null(out, argument)?;
    let bytes = capacity.min(size_of::<T>());
    // SAFETY: the caller gives `capacity` writable bytes at `out`; at most that many and
    // at most the struct's size are copied from a valid `T`.
    unsafe { std::ptr::copy_nonoverlapping(std::ptr::from_ref(value).cast::<u8>(), out.cast::<u8>(), bytes) };
    Ok(bytes)
}

/// Copies `text` into the C char array `out` of `N` bytes, NUL-terminated (cut if long).
pub(crate) fn c_chars<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (slot, byte) in out.iter_mut().zip(text.bytes().take(N.saturating_sub(1))) {
        *slot = byte as c_char;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_nrt_failure_and_an_error_its_code() {
        assert_eq!(call("test_panic", || panic!("an internal error")), NrtStatus::Failure.code());
        assert_eq!(call_value("test_panic", 7usize, || panic!("an internal error")), 7);
        call_void("test_panic", || panic!("an internal error"));
        let timeout = || Err(NrtError::new(NrtStatus::Timeout, "too long"));
        assert_eq!(call("test_error", timeout), NrtStatus::Timeout.code());
        let bad_input = || Err(NrtError::new(NrtStatus::ExecBadInput, "wrong size"));
        assert_eq!(call("test_error", bad_input), NrtStatus::Invalid.code(), "as libnrt documents it");
        assert_eq!(call("test_ok", || Ok(())), SUCCESS);
    }
}
