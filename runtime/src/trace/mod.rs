//! The runtime's side of event emission, beyond what [`neuron_datastore::Tracer`] does:
//! which outcome and error class each status counts as ([`classify`]) and, for the
//! runtime's own benchmarks and tests only (feature `trace-probe`), a probe that
//! records events through the runtime's emit path with no program around them.

#[cfg(feature = "trace-probe")]
mod probe;

use neuron_datastore::{ErrorClass, ExecOutcome};

use crate::error::NrtStatus;

#[cfg(feature = "trace-probe")]
pub(crate) use probe::ProbeProgram;
#[cfg(feature = "trace-probe")]
pub use probe::{DeviceProbe, PROBE_MODEL_ID, PROBE_PROGRAM_LEN, TraceProbe};

/// The outcome and error class of an execution that returned `status` (`None` for
/// success) having produced `numerical_errors` NaN/Inf values.
pub(crate) fn classify(status: Option<NrtStatus>, numerical_errors: u64) -> (ExecOutcome, Option<ErrorClass>) {
    match status {
        None if numerical_errors > 0 => (ExecOutcome::CompletedWithNumErr, Some(ErrorClass::Numerical)),
        None => (ExecOutcome::Completed, None),
        Some(NrtStatus::ExecCompletedWithNumErr) => (ExecOutcome::CompletedWithNumErr, Some(ErrorClass::Numerical)),
        Some(NrtStatus::Timeout) => (ExecOutcome::TimedOut, Some(ErrorClass::Transient)),
        Some(NrtStatus::ExecBadInput | NrtStatus::Invalid) => (ExecOutcome::IncorrectInput, Some(ErrorClass::Generic)),
        Some(NrtStatus::QueueFull) => (ExecOutcome::FailedToQueue, Some(ErrorClass::Transient)),
        Some(
            NrtStatus::HwError
            | NrtStatus::ExecHwErrCollectives
            | NrtStatus::ExecHwErrHbmUe
            | NrtStatus::ExecHwErrNcUe
            | NrtStatus::ExecHwErrDmaAbort
            | NrtStatus::ExecHwErrRepairableHbmUe
            | NrtStatus::NetworkProxyFailure
            | NrtStatus::ExecUnitUnrecoverable,
        ) => (ExecOutcome::CompletedWithErr, Some(ErrorClass::Hardware)),
        Some(NrtStatus::ExecOob | NrtStatus::ExecCompletedWithErr) => {
            (ExecOutcome::CompletedWithErr, Some(ErrorClass::Model))
        }
        Some(_) => (ExecOutcome::CompletedWithErr, Some(ErrorClass::Runtime)),
    }
}
