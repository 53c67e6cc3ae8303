//! Typed runtime errors carrying the public `NRT_STATUS` codes.
//!
//! Every failure the runtime can report is an [`NrtError`]: a [`NrtStatus`] (the
//! public numeric code scripts already match on) plus a message that says what was
//! wrong and what to do about it.

use std::fmt;

/// The public Neuron runtime status codes (`NRT_STATUS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE", prefix = "NRT_")]
#[repr(u32)]
pub enum NrtStatus {
    Success = 0,
    Failure = 1,
    Invalid = 2,
    InvalidHandle = 3,
    Resource = 4,
    Timeout = 5,
    HwError = 6,
    QueueFull = 7,
    LoadNotEnoughNc = 9,
    UnsupportedNeffVersion = 10,
    Uninitialized = 13,
    Closed = 14,
    QueueEmpty = 15,
    ExecUnitUnrecoverable = 101,
    ExecBadInput = 1002,
    ExecCompletedWithNumErr = 1003,
    ExecCompletedWithErr = 1004,
    ExecNcBusy = 1005,
    ExecOob = 1006,
    CollPending = 1100,
    ExecHwErrCollectives = 1200,
    ExecHwErrHbmUe = 1201,
    ExecHwErrNcUe = 1202,
    ExecHwErrDmaAbort = 1203,
    ExecSwNqOverflow = 1204,
    ExecHwErrRepairableHbmUe = 1205,
    /// A peer of a collective across processes is unreachable (its connection closed).
    NetworkProxyFailure = 1206,
}

impl NrtStatus {
    /// The public numeric code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The public symbolic name, e.g. `NRT_EXEC_BAD_INPUT`.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for NrtStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

/// A failed runtime call: the public status and a message for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct NrtError {
    pub status: NrtStatus,
    pub message: String,
}

impl NrtError {
    pub fn new(status: NrtStatus, message: impl Into<String>) -> Self {
        NrtError { status, message: message.into() }
    }

    /// The public numeric status code of this error.
    pub fn code(&self) -> u32 {
        self.status.code()
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        NrtError::new(NrtStatus::Invalid, message)
    }

    pub(crate) fn bad_input(message: impl Into<String>) -> Self {
        NrtError::new(NrtStatus::ExecBadInput, message)
    }
}

pub type NrtResult<T> = Result<T, NrtError>;

/// What a caught panic says (its `&str` or `String` payload), for the C boundaries that
/// turn a panic into an error instead of unwinding through their callers.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_their_public_names() {
        for (status, name) in [
            (NrtStatus::Success, "NRT_SUCCESS"),
            (NrtStatus::Failure, "NRT_FAILURE"),
            (NrtStatus::Invalid, "NRT_INVALID"),
            (NrtStatus::InvalidHandle, "NRT_INVALID_HANDLE"),
            (NrtStatus::Resource, "NRT_RESOURCE"),
            (NrtStatus::Timeout, "NRT_TIMEOUT"),
            (NrtStatus::HwError, "NRT_HW_ERROR"),
            (NrtStatus::QueueFull, "NRT_QUEUE_FULL"),
            (NrtStatus::LoadNotEnoughNc, "NRT_LOAD_NOT_ENOUGH_NC"),
            (NrtStatus::UnsupportedNeffVersion, "NRT_UNSUPPORTED_NEFF_VERSION"),
            (NrtStatus::Uninitialized, "NRT_UNINITIALIZED"),
            (NrtStatus::Closed, "NRT_CLOSED"),
            (NrtStatus::QueueEmpty, "NRT_QUEUE_EMPTY"),
            (NrtStatus::ExecUnitUnrecoverable, "NRT_EXEC_UNIT_UNRECOVERABLE"),
            (NrtStatus::ExecBadInput, "NRT_EXEC_BAD_INPUT"),
            (NrtStatus::ExecCompletedWithNumErr, "NRT_EXEC_COMPLETED_WITH_NUM_ERR"),
            (NrtStatus::ExecCompletedWithErr, "NRT_EXEC_COMPLETED_WITH_ERR"),
            (NrtStatus::ExecNcBusy, "NRT_EXEC_NC_BUSY"),
            (NrtStatus::ExecOob, "NRT_EXEC_OOB"),
            (NrtStatus::CollPending, "NRT_COLL_PENDING"),
            (NrtStatus::ExecHwErrCollectives, "NRT_EXEC_HW_ERR_COLLECTIVES"),
            (NrtStatus::ExecHwErrHbmUe, "NRT_EXEC_HW_ERR_HBM_UE"),
            (NrtStatus::ExecHwErrNcUe, "NRT_EXEC_HW_ERR_NC_UE"),
            (NrtStatus::ExecHwErrDmaAbort, "NRT_EXEC_HW_ERR_DMA_ABORT"),
            (NrtStatus::ExecSwNqOverflow, "NRT_EXEC_SW_NQ_OVERFLOW"),
            (NrtStatus::ExecHwErrRepairableHbmUe, "NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE"),
            (NrtStatus::NetworkProxyFailure, "NRT_NETWORK_PROXY_FAILURE"),
        ] {
            assert_eq!(status.name(), name);
        }
        assert_eq!(NrtStatus::ExecOob.to_string(), "NRT_EXEC_OOB (1006)");
    }
}
