//! Tensor allocation, charged to the memory category of its placement.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::collectives::world::lending;
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

    /// Wraps `len` bytes at `start`, which the caller owns, as a host tensor
    /// (`nrt_tensor_attach_buffer`): reads, writes and executions use that memory
    /// directly. The runtime charges nothing for it.
    ///
    /// # Safety
    ///
    /// `start` must be valid for reads and writes of `len` bytes for as long as any
    /// view of the returned tensor (clones, slices, tensor sets, scheduled requests)
    /// exists, and the caller must not access that memory while the runtime may
    /// (during an execution, read, write or copy of the tensor).
    pub unsafe fn attach_buffer(&self, start: NonNull<u8>, len: u64, name: &str) -> NrtResult<Tensor> {
        let tracer = self.tracer()?;
        let tracing = TensorTracing { ring: tracer.ring_of(None), name_id: tracer.store().intern(name), tracer };
        // SAFETY: the caller's promise.
        unsafe { self.lent(start, len, name, Some(tracing)) }
    }

    /// Like [`Runtime::attach_buffer`], for memory lent to one call (the arrays a
    /// Python call executes on): no `nrt_tensor_allocate` / `nrt_tensor_free` events,
    /// which would only repeat each execution's own.
    ///
    /// # Safety
    ///
    /// As for [`Runtime::attach_buffer`].
    pub unsafe fn lend_buffer(&self, start: NonNull<u8>, len: u64, name: &str) -> NrtResult<Tensor> {
        self.shared.lifecycle.check()?;
        // SAFETY: the caller's promise.
        unsafe { self.lent(start, len, name, None) }
    }

    /// A tensor over the caller's memory, traced or not.
    ///
    /// # Safety
    ///
    /// As for [`Runtime::attach_buffer`].
    unsafe fn lent(
        &self,
        start: NonNull<u8>,
        len: u64,
        name: &str,
        tracing: Option<TensorTracing>,
    ) -> NrtResult<Tensor> {
        let charge = self.shared.ledger.charge(Charge::Host(HostCategory::Tensors), 0)?;
        // SAFETY: the caller's promise is the one `Tensor::lent` needs.
        unsafe { Tensor::lent(name, start, len, charge, Arc::clone(&self.shared.lifecycle), tracing) }
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
        // In a job of several processes, the ranks of this host read a large device
        // tensor where it lies when it is a collective's input or output.
        let shared = core.is_some() && size >= lending::MIN_BYTES && self.shared.config.root_comm.is_some();
        let lifecycle = Arc::clone(&self.shared.lifecycle);
        Tensor::allocate(name, placement, size, shared, ty, charge, lifecycle, Some(tracing))
    }
}
