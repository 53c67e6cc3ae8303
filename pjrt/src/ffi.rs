//! The C types of the PJRT C API (`xla/pjrt/c/pjrt_c_api.h`, version 0.90) that this
//! plugin reads and writes, laid out as the header lays them out.
//!
//! Every argument struct starts with `struct_size` and `extension_start`; fields are only
//! ever appended, so a caller built against an older header passes a shorter struct
//! whose first fields are these. Many functions share a shape (an object in, one value
//! out), and share one generic struct here.

use std::ffi::{c_char, c_int, c_void};

/// `PJRT_API_MAJOR` and `PJRT_API_MINOR` of the header this plugin follows.
pub(crate) const API_MAJOR: c_int = 0;
pub(crate) const API_MINOR: c_int = 90;

/// The head of every argument struct: its size and the extension chain (unused here).
#[repr(C)]
pub(crate) struct Head {
    pub(crate) struct_size: usize,
    pub(crate) extension_start: *mut c_void,
}

/// `{ head; object; }`: destroy, await, delete and the like.
#[repr(C)]
pub(crate) struct Of<T> {
    pub(crate) head: Head,
    pub(crate) object: *mut T,
}

/// `{ head; object; out value; }`: ids, counts, flags, the object a buffer lives on.
#[repr(C)]
pub(crate) struct OfValue<T, V> {
    pub(crate) head: Head,
    pub(crate) object: *mut T,
    pub(crate) value: V,
}

/// `{ head; object; out const char*; out size_t; }`: names, kinds, debug strings.
#[repr(C)]
pub(crate) struct OfString<T> {
    pub(crate) head: Head,
    pub(crate) object: *mut T,
    pub(crate) text: *const c_char,
    pub(crate) size: usize,
}

/// `{ head; object; out U* const*; out size_t; }`: lists of devices or memories.
#[repr(C)]
pub(crate) struct OfList<T, U> {
    pub(crate) head: Head,
    pub(crate) object: *mut T,
    pub(crate) list: *const *mut U,
    pub(crate) count: usize,
}

/// `PJRT_NamedValue_Type`.
pub(crate) const NAMED_STRING: c_int = 0;
pub(crate) const NAMED_INT64: c_int = 1;

/// `PJRT_NamedValue`: the union is one pointer or 64-bit value wide.
#[repr(C)]
pub(crate) struct NamedValue {
    pub(crate) head: Head,
    pub(crate) name: *const c_char,
    pub(crate) name_size: usize,
    pub(crate) kind: c_int,
    pub(crate) value: u64,
    pub(crate) value_size: usize,
}

// SAFETY: a named value the plugin hands out points at static or leaked, immutable data.
unsafe impl Send for NamedValue {}
unsafe impl Sync for NamedValue {}

/// `PJRT_Plugin_Attributes_Args`, `PJRT_DeviceDescription_Attributes_Args` (whose count
/// comes first) differ: see [`DeviceAttributesArgs`].
#[repr(C)]
pub(crate) struct AttributesArgs {
    pub(crate) head: Head,
    pub(crate) attributes: *const NamedValue,
    pub(crate) num_attributes: usize,
}

/// A function of the table: every entry takes its argument struct and returns an error
/// or NULL.
pub(crate) type Entry = unsafe extern "C" fn(*mut c_void) -> *mut c_void;

/// The number of functions in `PJRT_Api` at version 0.90.
pub(crate) const ENTRY_COUNT: usize = 128;
