//! Tensor allocation, charged to the memory category of its placement.

use std::sync::Arc;

use crate::dtype::ArrayType;
use crate::error::{NrtError, NrtResult};
use crate::memory::Charge;
use crate::tensor::{Tensor, TensorPlacement, TensorTracing};
use neuron_datastore::{DeviceCategory, HostCategory};

use super::*;

impl Runtime {
    /// Allocates a zero-filled tensor of `size` bytes.
    pub fn allocate_tensor(&self, placement: TensorPlacement, size: u64, name: &str) -> NrtResult<Tensor> {
        self.allocate(placement, size, None, name)
    }

    /// Allocates a zero-filled tensor sized and typed for `ty`; executions check the type.
    pub fn allocate_tensor_for(&self, placement: TensorPlacement, ty: &ArrayType, name: &str) -> NrtResult<Tensor> {
        let size = ty.size_bytes().ok_or_else(|| NrtError::invalid(format!("{ty} is too large to allocate")))?;
        self.allocate(placement, size, Some(ty.clone()), name)
    }

    pub(super) fn allocate(
        &self,
        placement: TensorPlacement,
        size: u64,
        ty: Option<ArrayType>,
        name: &str,
    ) -> NrtResult<Tensor> {
        let tracer = self.tracer()?;
        let (charge, core) = match placement {
            TensorPlacement::Host => (Charge::Host(HostCategory::Tensors), None),
            TensorPlacement::Device { core } => {
                self.check_held(core)?;
                (Charge::Device { core, category: DeviceCategory::Tensors }, Some(core))
            }
        };
        let charge = self.shared.ledger.charge(charge, size)?;
        let tracing = TensorTracing { ring: tracer.ring_of(core), name_id: tracer.store().intern(name), tracer };
        Tensor::allocate(name, placement, size, ty, charge, Arc::clone(&self.shared.lifecycle), Some(tracing))
    }
}
