//! Tensor sets (`nrt_allocate_tensor_set`, ...): named tensors bound to a model's
//! inputs or outputs.
//!
//! A set keeps the C tensors added to it (so freeing a tensor while a set holds it
//! cannot free its memory) and, built on first use, the runtime [`TensorSet`] an
//! execution takes. That is rebuilt when the set changes or a buffer was attached to
//! any tensor since, so an execution always sees each tensor's current memory.

use std::ffi::{c_char, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use neuron_runtime::{NrtError, NrtResult, NrtStatus, TensorSet};

use crate::boundary::{Status, call, call_void, non_null, required_str, write_out};
use crate::handles::Registry;
use crate::tensors::{ATTACH_EPOCH, CTensor, TENSORS};

/// A tensor set as C programs hold it.
#[derive(Debug, Default)]
pub(crate) struct CTensorSet {
    bindings: RwLock<Bindings>,
}

#[derive(Debug, Default)]
struct Bindings {
    /// Name, tensor and the handle it was added with.
    tensors: Vec<(String, Arc<CTensor>, usize)>,
    /// The runtime set, and the attach epoch it was built in.
    bound: Option<(Arc<TensorSet>, u64)>,
}

pub(crate) static SETS: Registry<CTensorSet> = Registry::new("tensor set", 3);

impl CTensorSet {
    /// The runtime tensor set as it is now (`argument` names the set in messages).
    pub(crate) fn bound(&self, argument: &str) -> NrtResult<Arc<TensorSet>> {
        let epoch = ATTACH_EPOCH.load(Ordering::Acquire);
        if let Some((set, built)) = &self.bindings.read().unwrap_or_else(|e| e.into_inner()).bound
            && *built == epoch
        {
            return Ok(Arc::clone(set));
        }
        let mut bindings = self.bindings.write().unwrap_or_else(|e| e.into_inner());
        let mut set = TensorSet::new();
        for (name, tensor, _) in &bindings.tensors {
            let current = tensor.current().map_err(|e| {
                NrtError::new(e.status, format!("argument `{argument}`: `{name}` is bound to a tensor with no memory"))
            })?;
            set.add(name, current);
        }
        let set = Arc::new(set);
        bindings.bound = Some((Arc::clone(&set), epoch));
        Ok(set)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_allocate_tensor_set(result: *mut *mut c_void) -> Status {
    call("nrt_allocate_tensor_set", || {
        non_null(result, "result")?;
        write_out(result, "result", SETS.insert(CTensorSet::default()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_destroy_tensor_set(tensor_set: *mut *mut c_void) {
    call_void("nrt_destroy_tensor_set", || SETS.free_through(tensor_set, "tensor_set"));
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_add_tensor_to_tensor_set(
    tensor_set: *mut c_void,
    tensor_name: *const c_char,
    tensor: *mut c_void,
) -> Status {
    call("nrt_add_tensor_to_tensor_set", || {
        let set = SETS.get(tensor_set, "tensor_set")?;
        let name = required_str(tensor_name, "tensor_name")?;
        let c_tensor = TENSORS.get(tensor, "tensor")?;
        let mut bindings = set.bindings.write().unwrap_or_else(|e| e.into_inner());
        let entry = (name.to_owned(), c_tensor, tensor as usize);
        match bindings.tensors.iter_mut().find(|(n, _, _)| n == name) {
            Some(slot) => *slot = entry,
            None => bindings.tensors.push(entry),
        }
        bindings.bound = None;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_tensor_from_tensor_set(
    tensor_set: *mut c_void,
    tensor_name: *const c_char,
    tensor: *mut *mut c_void,
) -> Status {
    call("nrt_get_tensor_from_tensor_set", || {
        non_null(tensor, "tensor")?;
        let set = SETS.get(tensor_set, "tensor_set")?;
        let name = required_str(tensor_name, "tensor_name")?;
        let bindings = set.bindings.read().unwrap_or_else(|e| e.into_inner());
        let (_, bound, handle) = bindings.tensors.iter().find(|(n, _, _)| n == name).ok_or_else(|| {
            let names: Vec<&str> = bindings.tensors.iter().map(|(n, _, _)| n.as_str()).collect();
            NrtError::new(
                NrtStatus::Invalid,
                format!("the tensor set has no tensor named `{name}` (it has: {})", names.join(", ")),
            )
        })?;
        // The handle it was added with, unless that tensor has been freed since.
        let handle = *handle;
        if !TENSORS.get(handle as *const c_void, "tensor").is_ok_and(|live| Arc::ptr_eq(&live, bound)) {
            return Err(NrtError::new(
                NrtStatus::InvalidHandle,
                format!(
                    "the tensor bound to `{name}` was freed with nrt_tensor_free: the set keeps its memory for executions, but it has no handle any more"
                ),
            ));
        }
        write_out(tensor, "tensor", handle as *mut c_void)
    })
}
