//! `PJRT_Error`, and the boundary every exported function runs its body through:
//! arguments checked (NULL, a struct too short for the fields read), runtime errors
//! turned into PJRT errors that carry the Neuron status name, and panics caught so
//! that none unwinds across the C ABI.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

use neuron_runtime::{Config, NrtError, NrtStatus};

use crate::ffi::{Head, Of};

/// What a failed call returns: a code and a message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Error {
    pub(crate) code: Code,
    pub(crate) message: String,
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

/// `PJRT_Error_Code` (absl status codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum Code {
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Unimplemented = 12,
    Internal = 13,
}

/// `PJRT_Error_Message_Args`.
#[repr(C)]
pub(crate) struct ErrorMessageArgs {
    pub(crate) head: Head,
    pub(crate) error: *const Error,
    pub(crate) message: *const c_char,
    pub(crate) message_size: usize,
}

/// `PJRT_Error_GetCode_Args`.
#[repr(C)]
pub(crate) struct ErrorCodeArgs {
    pub(crate) head: Head,
    pub(crate) error: *const Error,
    pub(crate) code: c_int,
}

impl Error {
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Code::InvalidArgument, message)
    }

    pub(crate) fn unimplemented(function: &str, why: &str) -> Error {
        Error::new(Code::Unimplemented, format!("{function} is not implemented by the Neuron virtual plugin{why}"))
    }
}

/// A runtime error keeps its Neuron status name and code in the message
/// (`NRT_EXEC_HW_ERR_COLLECTIVES (1200): …`), and a PJRT code that says what kind of
/// failure it is.
impl From<NrtError> for Error {
    fn from(error: NrtError) -> Error {
        let code = match error.status {
            NrtStatus::Invalid | NrtStatus::InvalidHandle => Code::InvalidArgument,
            NrtStatus::Timeout => Code::DeadlineExceeded,
            NrtStatus::Resource | NrtStatus::QueueFull => Code::ResourceExhausted,
            NrtStatus::UnsupportedNeffVersion => Code::Unimplemented,
            NrtStatus::Closed | NrtStatus::Uninitialized => Code::FailedPrecondition,
            _ => Code::Internal,
        };
        Error::new(code, error.to_string())
    }
}

static LOGGING: Once = Once::new();

/// Logs to stderr at `NEURON_RT_LOG_LEVEL` (ERROR by default), unless the process
/// already has a subscriber.
fn init_logging() {
    LOGGING.call_once(|| {
        let level = Config::from_env().map_or(tracing::Level::ERROR, |c| c.log_level.as_tracing());
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(level)
            .with_target(false)
            .with_ansi(false)
            .try_init();
    });
}

/// Hands `error` to the caller, who frees it with `PJRT_Error_Destroy`.
pub(crate) fn into_raw(error: Error) -> *mut Error {
    Box::into_raw(Box::new(error))
}

/// Runs the body of the exported function `function` on its argument struct: NULL
/// and structs shorter than `T` are refused (a caller's older, shorter struct ends
/// before fields this plugin reads), errors and panics become a `PJRT_Error`.
pub(crate) fn call<T>(function: &'static str, args: *mut T, body: impl FnOnce(&mut T) -> Result<()>) -> *mut Error {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        init_logging();
        // SAFETY: the caller passes its argument struct or NULL; its size is read first.
        let args = unsafe { checked(function, args)? };
        body(args)
    }));
    match outcome {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(error)) => {
            match error.code {
                Code::Unimplemented => tracing::debug!("{function}: {}", error.message),
                _ => tracing::warn!("{function}: {}", error.message),
            }
            into_raw(error)
        }
        Err(panic) => {
            let message = neuron_runtime::panic_message(&*panic);
            tracing::error!("{function}: internal error ({message}); please report it with the log above");
            into_raw(Error::new(Code::Internal, format!("{function}: internal error in the Neuron plugin: {message}")))
        }
    }
}

/// # Safety
/// `args` is NULL or points to a struct whose first field is its size.
unsafe fn checked<'a, T>(function: &str, args: *mut T) -> Result<&'a mut T> {
    if args.is_null() {
        return Err(Error::invalid(format!("{function}: the argument struct is NULL")));
    }
    // SAFETY: every argument struct starts with `struct_size`.
    let size = unsafe { (*(args as *const Head)).struct_size };
    // A caller's struct may be shorter than ours only in fields this plugin does not
    // read; the fields read are all in the 0.54 layout, which every caller since has.
    let least = std::mem::size_of::<Head>();
    if size < least {
        return Err(Error::invalid(format!("{function}: struct_size {size} is too small for its argument struct")));
    }
    // SAFETY: non-NULL and at least as long as the caller says.
    Ok(unsafe { &mut *args })
}

/// A reference to an object the caller handed in, or an error naming the argument.
///
/// # Safety
/// `pointer` is NULL or an object this plugin handed out and the caller has not
/// destroyed.
pub(crate) unsafe fn object<'a, T>(what: &str, pointer: *mut T) -> Result<&'a T> {
    // SAFETY: as the caller promises.
    unsafe { pointer.as_ref() }.ok_or_else(|| Error::invalid(format!("the {what} is NULL")))
}

pub(crate) unsafe extern "C" fn error_destroy(args: *mut Of<Error>) -> *mut Error {
    let _ = catch_unwind(|| {
        // SAFETY: the caller's argument struct; the error is one this plugin made, or NULL.
        if let Some(args) = unsafe { args.as_ref() }
            && !args.object.is_null()
        {
            drop(unsafe { Box::from_raw(args.object) });
        }
    });
    std::ptr::null_mut()
}

pub(crate) unsafe extern "C" fn error_message(args: *mut ErrorMessageArgs) -> *mut Error {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller's argument struct, and an error this plugin made.
        if let Some(args) = unsafe { args.as_mut() } {
            match unsafe { args.error.as_ref() } {
                Some(error) => (args.message, args.message_size) = (error.message.as_ptr().cast(), error.message.len()),
                None => (args.message, args.message_size) = (c"".as_ptr(), 0),
            }
        }
    }));
    std::ptr::null_mut()
}

pub(crate) unsafe extern "C" fn error_get_code(args: *mut ErrorCodeArgs) -> *mut Error {
    call("PJRT_Error_GetCode", args, |args| {
        // SAFETY: an error this plugin made.
        let error = unsafe { args.error.as_ref() }.ok_or_else(|| Error::invalid("the error is NULL"))?;
        args.code = error.code as i32;
        Ok(())
    })
}

/// The entry of a function this plugin does not implement: it answers UNIMPLEMENTED,
/// naming itself.
pub(crate) fn unimplemented_entry(function: &'static str, args: *mut c_void) -> *mut Error {
    call(function, args.cast::<Head>(), |_| Err(Error::unimplemented(function, "")))
}
