//! Where a runtime is in its lifecycle: created uninitialised, running after `init`,
//! closed after `close`. One [`Lifecycle`] is shared by the runtime and every handle it
//! gives out (tensors, communicators), so each call checks it the same way.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{NrtError, NrtResult, NrtStatus};

/// A runtime's stage, shared with every handle it gives out.
#[derive(Debug, Default)]
pub(crate) struct Lifecycle(AtomicU8);

/// The stages, in the order a runtime goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Uninitialized = 0,
    Running = 1,
    Closed = 2,
}

impl Lifecycle {
    pub(crate) fn stage(&self) -> Stage {
        match self.0.load(Ordering::Acquire) {
            0 => Stage::Uninitialized,
            1 => Stage::Running,
            _ => Stage::Closed,
        }
    }

    pub(crate) fn set(&self, stage: Stage) {
        self.0.store(stage as u8, Ordering::Release);
    }

    /// Fails unless the runtime is initialised and not closed.
    pub(crate) fn check(&self) -> NrtResult<()> {
        match self.stage() {
            Stage::Running => Ok(()),
            Stage::Uninitialized => {
                Err(NrtError::new(NrtStatus::Uninitialized, "the runtime is not initialised; call init first"))
            }
            Stage::Closed => Err(NrtError::new(NrtStatus::Closed, "the runtime has been closed")),
        }
    }
}
