//! `libnrt`: the Neuron runtime's C API over the Rust runtime, built as `libnrt.so` and
//! `libnrt.a` with the headers in `include/nrt/`.
//!
//! Programs written against the AWS Neuron SDK's public `nrt/*.h` compile against
//! `include/nrt/` unchanged, link with `-lnrt`, and run on virtual NeuronCores: their
//! executions show up in `neuron-top`, `neuron-monitor`, `neuron-ls` and the dashboard
//! like a Rust program's, because every function is a thin translation onto
//! `neuron_runtime` (no second runtime). What the boundary guarantees:
//!
//! - no panic crosses it: each function runs through [`boundary`], which turns a
//!   panic into `NRT_FAILURE` and an error into its status code, with a log line;
//! - handles are checked, never trusted ([`handles`]): NULL, freed, foreign or
//!   made-up handles give `NRT_INVALID` / `NRT_INVALID_HANDLE`;
//! - every function may be called from any thread at any time.
//!
//! The exported functions are `unsafe extern "C"`: their safety contract is the one
//! the C header states for each pointer argument.

// The safety contract of each exported function is its declaration's comment in
// `include/nrt/*.h`, the document C callers read.
#![allow(clippy::missing_safety_doc)]

mod boundary;
mod continuous;
mod handles;
mod inspect_options;
mod lifecycle;
mod models;
mod nrta;
mod profile;
mod ranks;
mod sets;
mod state;
mod sys_trace;
mod tensors;
mod unsupported;

pub use boundary::Status;
pub use continuous::*;
pub use inspect_options::*;
pub use lifecycle::*;
pub use models::*;
pub use nrta::*;
pub use profile::*;
pub use ranks::*;
pub use sets::*;
pub use sys_trace::*;
pub use tensors::*;
pub use unsupported::*;
