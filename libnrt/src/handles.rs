//! The handles C programs hold (`nrt_model_t *`, `nrt_tensor_t *`, ...): opaque values
//! that name an entry of a registry, never addresses the library dereferences.
//!
//! A handle packs the registry's tag, a slot index and the slot's generation. Looking
//! one up checks all three, so a NULL handle, a handle of another kind, a freed handle
//! (its slot's generation has moved on) or a made-up value is refused with
//! `NRT_INVALID` / `NRT_INVALID_HANDLE`, and a double free is detected, instead of
//! touching freed memory. Lookups take a read lock and clone an `Arc`, so the entry
//! outlives a concurrent free for as long as the call that found it uses it.

use std::ffi::c_void;
use std::sync::{Arc, RwLock};

use neuron_runtime::{NrtError, NrtResult, NrtStatus};

use crate::boundary::{invalid, non_null, write_out};

/// Bits of a handle that hold the registry's tag.
const TAG_BITS: u32 = 4;
/// Generations count modulo 2^28: with the tag and a 32-bit slot number they fill the
/// 64 bits of a handle.
const GENERATION_MASK: u32 = (1 << 28) - 1;

/// The live entries of one kind of handle.
#[derive(Debug)]
pub(crate) struct Registry<T> {
    kind: &'static str,
    tag: usize,
    slab: RwLock<Slab<T>>,
}

#[derive(Debug)]
struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<Arc<T>>,
}

impl<T> Registry<T> {
    /// A registry of `kind` (for messages) whose handles carry `tag` (1 to 15, one per
    /// registry, so a handle of one kind is never taken for another).
    pub(crate) const fn new(kind: &'static str, tag: usize) -> Registry<T> {
        Registry { kind, tag, slab: RwLock::new(Slab { slots: Vec::new(), free: Vec::new() }) }
    }

    /// Registers `value` and returns its new handle.
    pub(crate) fn insert(&self, value: T) -> *mut c_void {
        let mut slab = self.slab.write().unwrap_or_else(|e| e.into_inner());
        let index = match slab.free.pop() {
            Some(index) => index,
            None => {
                slab.slots.push(Slot { generation: 0, value: None });
                (slab.slots.len() - 1) as u32
            }
        };
        let slot = &mut slab.slots[index as usize];
        slot.value = Some(Arc::new(value));
        self.handle(index, slot.generation)
    }

    /// The entry `handle` names; `argument` is the parameter's name, for the message.
    pub(crate) fn get(&self, handle: *const c_void, argument: &str) -> NrtResult<Arc<T>> {
        let (index, generation) = self.decode(handle, argument)?;
        let slab = self.slab.read().unwrap_or_else(|e| e.into_inner());
        match slab.slots.get(index as usize) {
            Some(Slot { generation: g, value: Some(value) }) if *g == generation => Ok(Arc::clone(value)),
            _ => Err(self.unknown(handle, argument)),
        }
    }

    /// Removes the entry `handle` names; the handle is invalid from now on.
    pub(crate) fn remove(&self, handle: *const c_void, argument: &str) -> NrtResult<Arc<T>> {
        let (index, generation) = self.decode(handle, argument)?;
        let mut slab = self.slab.write().unwrap_or_else(|e| e.into_inner());
        let value = match slab.slots.get_mut(index as usize) {
            Some(slot) if slot.generation == generation && slot.value.is_some() => {
                slot.generation = slot.generation.wrapping_add(1) & GENERATION_MASK;
                slot.value.take()
            }
            _ => None,
        };
        let value = value.ok_or_else(|| self.unknown(handle, argument))?;
        slab.free.push(index);
        Ok(value)
    }

    /// Removes the entry `handle` names, as a `*_free` / `*_destroy` function does: a NULL
    /// handle is nothing to free, like `free(NULL)`.
    pub(crate) fn free(&self, handle: *const c_void, argument: &str) -> NrtResult<()> {
        if handle.is_null() { Ok(()) } else { self.remove(handle, argument).map(drop) }
    }

    /// Frees the entry whose handle the caller's variable `*slot` holds and sets that
    /// variable to NULL (`nrt_tensor_free(&tensor)`); a NULL handle is nothing to free.
    pub(crate) fn free_through(&self, slot: *mut *mut c_void, argument: &str) -> NrtResult<()> {
        let slot = non_null(slot, argument)?;
        // SAFETY: `slot` is not NULL and points to the caller's handle variable.
        let handle = unsafe { *slot };
        if handle.is_null() {
            return Ok(());
        }
        self.remove(handle, &format!("*{argument}"))?;
        write_out(slot, argument, std::ptr::null_mut())
    }

    fn handle(&self, index: u32, generation: u32) -> *mut c_void {
        let slot = (u64::from(generation) << 32) | (u64::from(index) + 1);
        let packed = (slot << TAG_BITS) | self.tag as u64;
        packed as usize as *mut c_void
    }

    fn decode(&self, handle: *const c_void, argument: &str) -> NrtResult<(u32, u32)> {
        if handle.is_null() {
            return Err(invalid(argument, "is NULL"));
        }
        let packed = handle as usize as u64;
        let slot = packed >> TAG_BITS;
        let index = (slot & u64::from(u32::MAX)).wrapping_sub(1);
        if packed & ((1 << TAG_BITS) - 1) != self.tag as u64 || index >= u64::from(u32::MAX) {
            return Err(self.unknown(handle, argument));
        }
        Ok((index as u32, (slot >> 32) as u32))
    }

    fn unknown(&self, handle: *const c_void, argument: &str) -> NrtError {
        NrtError::new(
            NrtStatus::InvalidHandle,
            format!(
                "argument `{argument}` ({handle:p}) is not a live {} handle: it was freed already, or did not come from this library",
                self.kind
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_foreign_and_null_handles_are_refused() {
        let registry: Registry<u32> = Registry::new("test", 1);
        let other: Registry<u32> = Registry::new("other", 2);
        let first = registry.insert(7);
        assert_eq!(*registry.get(first, "h").expect("live"), 7);
        assert_eq!(registry.remove(first, "h").map(|v| *v), Ok(7));
        let status = |r: NrtResult<Arc<u32>>| r.expect_err("refused").status;
        assert_eq!(status(registry.get(first, "h")), NrtStatus::InvalidHandle, "freed");
        assert_eq!(status(registry.remove(first, "h")), NrtStatus::InvalidHandle, "double free");
        let second = registry.insert(8);
        assert_ne!(second, first, "a reused slot gets a new generation");
        assert_eq!(status(registry.get(first, "h")), NrtStatus::InvalidHandle, "stale after reuse");
        assert_eq!(status(other.get(second, "h")), NrtStatus::InvalidHandle, "another kind");
        assert_eq!(status(registry.get(std::ptr::null(), "h")), NrtStatus::Invalid);
        assert_eq!(status(registry.get(0xdead_beef as *const c_void, "h")), NrtStatus::InvalidHandle);
    }

    #[test]
    fn a_slot_reused_past_the_generation_range_still_gives_live_handles() {
        let registry: Registry<u32> = Registry::new("test", 1);
        registry.slab.write().expect("lock").slots.push(Slot { generation: GENERATION_MASK, value: None });
        registry.slab.write().expect("lock").free.push(0);
        let last = registry.insert(1);
        assert_eq!(registry.remove(last, "h").map(|v| *v), Ok(1));
        let wrapped = registry.insert(2);
        assert_eq!(registry.get(wrapped, "h").map(|v| *v), Ok(2), "generation wrapped to 0");
        assert_eq!(registry.get(last, "h").expect_err("stale").status, NrtStatus::InvalidHandle);
    }
}
