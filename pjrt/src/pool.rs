//! Device arrays kept for reuse after their buffers are destroyed.

use std::collections::HashMap;
use std::sync::Mutex;

use neuron_runtime::{ArrayType, NrtResult as Result, Runtime, Tensor, TensorPlacement};

/// Device arrays whose buffers were destroyed, kept for the next array of the same
/// core, size and type, as XLA's device allocators keep freed memory: torch-xla
/// destroys every step's arrays and asks for the same ones at the next step, and a
/// reused tensor costs no allocation (nor its trace events). The tools count kept
/// tensors as the process's tensor memory, which they are.
#[derive(Default)]
pub(crate) struct Pool {
    free: Mutex<HashMap<PoolKey, Vec<Tensor>>>,
}

/// A tensor's core, size and declared type.
type PoolKey = (Option<u32>, u64, Option<ArrayType>);

/// Kept tensors per kind: a step's arrays of one kind, with room for two steps.
const KEPT_PER_KIND: usize = 8;

impl Pool {
    fn key(tensor: &Tensor) -> PoolKey {
        let core = match tensor.placement() {
            TensorPlacement::Device { core } => Some(core),
            TensorPlacement::Host => None,
        };
        (core, tensor.size(), tensor.array_type().cloned())
    }

    /// A kept tensor of this kind, or a new one.
    pub(crate) fn take(
        &self,
        runtime: &Runtime,
        core: u32,
        size: u64,
        ty: Option<&ArrayType>,
        name: &str,
    ) -> Result<Tensor> {
        let key = (Some(core), size.max(1), ty.cloned());
        if let Some(tensor) = self.free.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&key).and_then(Vec::pop) {
            return Ok(tensor);
        }
        let placement = TensorPlacement::Device { core };
        Ok(match ty {
            Some(ty) => runtime.allocate_tensor_for(placement, ty, name)?,
            None => runtime.allocate_tensor(placement, size.max(1), name)?,
        })
    }

    pub(crate) fn give(&self, tensor: Tensor) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let kept = free.entry(Pool::key(&tensor)).or_default();
        if kept.len() < KEPT_PER_KIND {
            kept.push(tensor);
        }
    }
}
