//! The virtual Neuron runtime: virtual NeuronCores that run real tensor programs on
//! the host CPU with correct numerics, and account for every resource they use.
//!
//! The pipeline: HLO text is parsed ([`hlo`]) and lowered to engine instructions
//! ([`compile`]), packed into a NEFF ([`neff`]), loaded onto a NeuronCore of a
//! [`Runtime`], and executed by the CPU backend with [`Tensor`]s bound to its inputs
//! and outputs. Every failure is an [`NrtError`] carrying the public `NRT_STATUS` code.

pub mod collectives;
pub mod compile;
pub mod config;
mod dtype;
mod error;
pub mod fault;
mod hlo;
pub mod isa;
pub mod launch;
pub mod memory;
pub mod neff;
pub mod trace;

mod nrta;

mod backend;
mod lifecycle;
mod pool;
mod reservation;
mod runtime;
mod shared_memory;

mod tensor;

pub use collectives::world::clock::ClockOffset;
pub use collectives::{Algorithm, Collective, CollectiveCall, Communicator};
pub use compile::{
    AutoCast, AutoCastType, CompileError, CompileOptions, OptLevel, Target, compile_hlo, compile_hlo_with,
};
pub use config::Config;
pub use dtype::{ArrayType, DType, DTypeClass};
pub use error::{NrtError, NrtResult, NrtStatus, panic_message};
pub use neff::Neff;
pub use neuron_datastore::topology::{CoreSet, InstanceType, Topology};
pub use neuron_datastore::{FetchOptions, SysTraceConfig, SysTraceFetch};
pub use nrta::{CompletionHandle, ErrorTracker, PendingRead, SeqId, TrackedError, Xu};
pub use reservation::CoreReservation;
pub use runtime::{ExecutionReport, GLOBAL_COMMUNICATOR, Model, Runtime};
pub use tensor::{Tensor, TensorPlacement, TensorSet};
