//! Tensors: byte buffers on a NeuronCore's device memory or on the host.
//!
//! Sizes and offsets are `u64` throughout, so tensors of 4 GiB and more work. Every
//! access is bounds-checked before it touches memory: an out-of-range read, write,
//! copy or memset fails with `NRT_INVALID` and changes nothing. Slices share their
//! parent's storage, and the storage (with its memory charge) lives until the last
//! tensor viewing it is dropped.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::dtype::ArrayType;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::lifecycle::Lifecycle;
use crate::memory::MemoryCharge;
use crate::shared_memory::{SharedMemory, SharedPlace};
use neuron_datastore::event::{EventType, Payload, payload};
use neuron_datastore::{EventIds, RingPos, Tracer};

/// Where a tensor's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorPlacement {
    /// Device memory of a NeuronCore (global core index).
    Device {
        core: u32,
    },
    Host,
}

impl fmt::Display for TensorPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorPlacement::Device { core } => write!(f, "device memory of nc{core}"),
            TensorPlacement::Host => f.write_str("host memory"),
        }
    }
}

/// A handle to a tensor; clones refer to the same tensor.
#[derive(Clone)]
pub struct Tensor {
    inner: Arc<TensorInner>,
}

struct TensorInner {
    id: u64,
    name: String,
    placement: TensorPlacement,
    /// The element type and shape the tensor was allocated for, if any.
    array_type: Option<ArrayType>,
    storage: Arc<Storage>,
    offset: u64,
    size: u64,
    lifecycle: Arc<Lifecycle>,
    tracing: Option<TensorTracing>,
}

/// Where a tensor's events go: its core's ring, or the process ring for host tensors.
#[derive(Clone)]
pub(crate) struct TensorTracing {
    pub(crate) tracer: Arc<Tracer>,
    pub(crate) ring: RingPos,
    /// The tensor's name in the string table.
    pub(crate) name_id: u32,
}

/// A tensor's memory: the runtime's own anonymous mapping, shared memory that processes
/// of its host may read (a device tensor of a job of several processes), or a buffer
/// its caller lent it (`nrt_tensor_attach_buffer`). Either way it never moves.
enum Memory {
    Mapped(memmap2::MmapMut),
    Shared(SharedMemory),
    Lent { start: NonNull<u8>, len: usize },
}

// SAFETY: lent memory is reached only through its storage's lock, as a mapping is, and
// whoever lent it promised (`Runtime::attach_buffer`) that it stays valid meanwhile.
unsafe impl Send for Memory {}
// SAFETY: as for `Send`: shared access goes through the storage's read lock.
unsafe impl Sync for Memory {}

impl Deref for Memory {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Memory::Mapped(map) => map,
            Memory::Shared(memory) => memory.bytes(),
            // SAFETY: the lender promised `len` readable bytes at `start` while the
            // tensor exists, and the storage's lock orders this access with writes.
            Memory::Lent { start, len } => unsafe { std::slice::from_raw_parts(start.as_ptr(), *len) },
        }
    }
}

impl DerefMut for Memory {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Memory::Mapped(map) => map,
            Memory::Shared(memory) => memory.bytes_mut(),
            // SAFETY: as for `deref`, and `&mut self` means the write lock is held.
            Memory::Lent { start, len } => unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), *len) },
        }
    }
}

struct Storage {
    bytes: RwLock<Memory>,
    /// The address of the memory's first byte (exposed), which never changes.
    base: usize,
    /// Where the whole memory lies for processes of this host, when it is shared.
    shared: Option<SharedPlace>,
    _charge: MemoryCharge,
    /// Emits `nrt_tensor_free` when the last view of the memory goes.
    freed: Option<(TensorTracing, u64, u64)>,
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Some((tracing, tensor_id, size)) = &self.freed {
            tracing.instant(EventType::NrtTensorFree, tracing.tensor(*tensor_id, *size));
        }
    }
}

impl TensorTracing {
    /// The payload of `nrt_tensor_allocate` and `nrt_tensor_free` for this tensor.
    fn tensor(&self, tensor_id: u64, size: u64) -> payload::Tensor {
        payload::Tensor { tensor_id, tensor_name: self.name_id, size }
    }

    fn instant(&self, event_type: EventType, payload: impl Payload) {
        self.tracer.instant(self.ring, event_type, EventIds::default(), payload);
    }

    /// Runs `f` inside a start/stop span of `event_type` (both carry `payload`), as
    /// request `nrta_seq_id` of an execution unit when not 0.
    fn span<R>(&self, event_type: EventType, payload: impl Payload, nrta_seq_id: u64, f: impl FnOnce() -> R) -> R {
        let tracer = &self.tracer;
        let ids = EventIds { nrta_seq_id, ..EventIds::default() };
        let span = tracer.start(self.ring, event_type, ids, payload);
        let result = f();
        tracer.stop(&span, payload);
        result
    }
}

static NEXT_TENSOR_ID: AtomicU64 = AtomicU64::new(1);

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("id", &self.inner.id)
            .field("name", &self.inner.name)
            .field("placement", &self.inner.placement)
            .field("size", &self.inner.size)
            .field("offset", &self.inner.offset)
            .finish()
    }
}

impl Tensor {
    /// Allocates zero-filled storage of `size` bytes, already charged to `charge`: in
    /// shared memory when `shared` (and the kernel gives it), else private.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn allocate(
        name: &str,
        placement: TensorPlacement,
        size: u64,
        shared: bool,
        array_type: Option<ArrayType>,
        charge: MemoryCharge,
        lifecycle: Arc<Lifecycle>,
        tracing: Option<TensorTracing>,
    ) -> NrtResult<Tensor> {
        let len = usize::try_from(size).map_err(|_| {
            NrtError::new(NrtStatus::Resource, format!("{size} bytes do not fit in this host's address space"))
        })?;
        // An anonymous mapping is zero-filled lazily: untouched pages of a large tensor
        // cost no physical memory, and without a swap reservation device memory may
        // exceed the host's RAM. A request the host cannot map is an error instead of an
        // abort. (A zero-length mapping is not allowed, hence the max.)
        let id = NEXT_TENSOR_ID.fetch_add(1, Ordering::Relaxed);
        let map = || {
            if shared {
                // Named after the tensor, as `/proc/<pid>/maps` shows it.
                let mut label: String = name.chars().filter(|&c| c != '\0').collect();
                let mut end = label.len().min(200);
                while !label.is_char_boundary(end) {
                    end -= 1;
                }
                label.truncate(end);
                match SharedMemory::create(&format!("neuron-virt-tensor:{label}"), id, len) {
                    Ok(memory) => return Ok(Memory::Shared(memory)),
                    Err(e) => tracing::debug!("tensor `{name}` in private memory: no shared memory ({e})"),
                }
            }
            let map = memmap2::MmapOptions::new().len(len.max(1)).no_reserve_swap().map_anon().map_err(|e| {
                NrtError::new(
                    NrtStatus::Resource,
                    format!("the host could not provide {size} bytes for tensor `{name}`: {e}"),
                )
            })?;
            Ok(Memory::Mapped(map))
        };
        let bytes = match &tracing {
            Some(t) => t.span(EventType::NrtTensorAllocate, t.tensor(id, size), 0, map)?,
            None => map()?,
        };
        Ok(Tensor::over(id, name, placement, bytes, size, array_type, charge, lifecycle, tracing))
    }

    /// A host tensor over `len` bytes at `start` that its caller owns, charged to
    /// `charge`.
    ///
    /// # Safety
    ///
    /// As [`Runtime::attach_buffer`](crate::Runtime::attach_buffer) requires.
    pub(crate) unsafe fn lent(
        name: &str,
        start: NonNull<u8>,
        len: u64,
        charge: MemoryCharge,
        lifecycle: Arc<Lifecycle>,
        tracing: Option<TensorTracing>,
    ) -> NrtResult<Tensor> {
        let bytes = usize::try_from(len)
            .map_err(|_| NrtError::invalid(format!("{len} bytes do not fit in this host's address space")))?;
        let id = NEXT_TENSOR_ID.fetch_add(1, Ordering::Relaxed);
        if let Some(t) = &tracing {
            t.span(EventType::NrtTensorAllocate, t.tensor(id, len), 0, || ());
        }
        let memory = Memory::Lent { start, len: bytes };
        Ok(Tensor::over(id, name, TensorPlacement::Host, memory, len, None, charge, lifecycle, tracing))
    }

    #[allow(clippy::too_many_arguments)]
    fn over(
        id: u64,
        name: &str,
        placement: TensorPlacement,
        mut bytes: Memory,
        size: u64,
        array_type: Option<ArrayType>,
        charge: MemoryCharge,
        lifecycle: Arc<Lifecycle>,
        tracing: Option<TensorTracing>,
    ) -> Tensor {
        let base = bytes.as_mut_ptr().expose_provenance();
        let shared = match &bytes {
            Memory::Shared(memory) => Some(memory.place(0, size)),
            _ => None,
        };
        Tensor {
            inner: Arc::new(TensorInner {
                id,
                name: name.to_owned(),
                placement,
                array_type,
                storage: Arc::new(Storage {
                    bytes: RwLock::new(bytes),
                    base,
                    shared,
                    _charge: charge,
                    freed: tracing.clone().map(|t| (t, id, size)),
                }),
                offset: 0,
                size,
                lifecycle,
                tracing,
            }),
        }
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub fn placement(&self) -> TensorPlacement {
        self.inner.placement
    }

    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// The element type and shape given at allocation, if any.
    pub fn array_type(&self) -> Option<&ArrayType> {
        self.inner.array_type.as_ref()
    }

    /// A tensor viewing `size` bytes of this one from `offset`, sharing its memory.
    pub fn slice(&self, offset: u64, size: u64, name: &str) -> NrtResult<Tensor> {
        self.inner.lifecycle.check()?;
        self.check_range("take a slice of", offset, size)?;
        let tracing = self.inner.tracing.as_ref().map(|t| TensorTracing {
            tracer: Arc::clone(&t.tracer),
            ring: t.ring,
            name_id: t.tracer.store().intern(name),
        });
        Ok(Tensor {
            inner: Arc::new(TensorInner {
                id: NEXT_TENSOR_ID.fetch_add(1, Ordering::Relaxed),
                name: name.to_owned(),
                placement: self.inner.placement,
                array_type: None,
                storage: Arc::clone(&self.inner.storage),
                offset: self.inner.offset + offset,
                size,
                lifecycle: Arc::clone(&self.inner.lifecycle),
                tracing,
            }),
        })
    }

    /// Copies `data` into the tensor at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> NrtResult<()> {
        self.write_as(offset, data, 0)
    }

    /// A write, as request `nrta_seq_id` of an execution unit when not 0.
    pub(crate) fn write_as(&self, offset: u64, data: &[u8], nrta_seq_id: u64) -> NrtResult<()> {
        self.inner.lifecycle.check()?;
        self.check_range("write", offset, data.len() as u64)?;
        let start = (self.inner.offset + offset) as usize;
        self.traced(EventType::NrtTensorWrite, offset, data.len() as u64, nrta_seq_id, || {
            self.storage_mut()[start..start + data.len()].copy_from_slice(data);
        });
        Ok(())
    }

    /// Copies `out.len()` bytes from the tensor at `offset` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> NrtResult<()> {
        self.read_as(offset, out, 0)
    }

    /// A read, as request `nrta_seq_id` of an execution unit when not 0.
    pub(crate) fn read_as(&self, offset: u64, out: &mut [u8], nrta_seq_id: u64) -> NrtResult<()> {
        self.inner.lifecycle.check()?;
        self.check_range("read", offset, out.len() as u64)?;
        let start = (self.inner.offset + offset) as usize;
        let len = out.len();
        self.traced(EventType::NrtTensorRead, offset, len as u64, nrta_seq_id, || {
            out.copy_from_slice(&self.storage()[start..start + len]);
        });
        Ok(())
    }

    /// The address of the tensor's first byte in this process (`nrt_tensor_get_va`):
    /// virtual device memory is host memory. The memory never moves while the tensor
    /// exists; accesses through the address are not ordered with the runtime's, so a
    /// caller using it must not overlap them with executions or copies of the tensor.
    pub fn address(&self) -> *mut u8 {
        // In bounds: a tensor's offset is at most its storage's length.
        std::ptr::with_exposed_provenance_mut::<u8>(self.inner.storage.base).wrapping_add(self.inner.offset as usize)
    }

    /// Reads the whole tensor.
    pub fn read_all(&self) -> NrtResult<Vec<u8>> {
        let mut out = Vec::new();
        self.read_all_into(&mut out)?;
        Ok(out)
    }

    /// Appends the whole tensor to `out`: filled by the copy itself, not zeroed first.
    pub(crate) fn read_all_into(&self, out: &mut Vec<u8>) -> NrtResult<()> {
        self.inner.lifecycle.check()?;
        let len = usize::try_from(self.size()).map_err(|_| NrtError::invalid("tensor too large to read at once"))?;
        let start = self.inner.offset as usize;
        out.reserve(len);
        self.traced(EventType::NrtTensorRead, 0, len as u64, 0, || {
            out.extend_from_slice(&self.storage()[start..start + len]);
        });
        Ok(())
    }

    /// Sets `size` bytes from `offset` to `value`.
    pub fn memset(&self, offset: u64, value: u8, size: u64) -> NrtResult<()> {
        self.inner.lifecycle.check()?;
        self.check_range("memset", offset, size)?;
        let start = (self.inner.offset + offset) as usize;
        self.traced(EventType::NrtTensorWrite, offset, size, 0, || {
            self.storage_mut()[start..start + size as usize].fill(value);
        });
        Ok(())
    }

    /// Copies `size` bytes from `self` at `src_offset` to `dst` at `dst_offset`.
    pub fn copy_to(&self, src_offset: u64, dst: &Tensor, dst_offset: u64, size: u64) -> NrtResult<()> {
        self.copy_to_as(src_offset, dst, dst_offset, size, 0)
    }

    /// A copy, as request `nrta_seq_id` of an execution unit when not 0.
    pub(crate) fn copy_to_as(
        &self,
        src_offset: u64,
        dst: &Tensor,
        dst_offset: u64,
        size: u64,
        nrta_seq_id: u64,
    ) -> NrtResult<()> {
        self.inner.lifecycle.check()?;
        self.check_range("copy", src_offset, size)?;
        dst.check_range("copy into", dst_offset, size)?;
        let src_start = (self.inner.offset + src_offset) as usize;
        let dst_start = (dst.inner.offset + dst_offset) as usize;
        let len = size as usize;
        dst.traced(EventType::NrtTensorWrite, dst_offset, size, nrta_seq_id, || {
            self.copy_bytes(src_start, dst, dst_start, len)
        });
        Ok(())
    }

    fn copy_bytes(&self, src_start: usize, dst: &Tensor, dst_start: usize, len: usize) {
        if Arc::ptr_eq(&self.inner.storage, &dst.inner.storage) {
            self.storage_mut().copy_within(src_start..src_start + len, dst_start);
        } else {
            // Lock in address order so that two opposite copies cannot deadlock.
            let (src, mut dst_bytes) = if Arc::as_ptr(&self.inner.storage) < Arc::as_ptr(&dst.inner.storage) {
                let src = self.storage();
                (src, dst.storage_mut())
            } else {
                let dst_bytes = dst.storage_mut();
                (self.storage(), dst_bytes)
            };
            dst_bytes[dst_start..dst_start + len].copy_from_slice(&src[src_start..src_start + len]);
        }
    }

    /// Runs `f` inside an `nrt_tensor_read` or `nrt_tensor_write` span.
    fn traced<R>(&self, event_type: EventType, offset: u64, bytes: u64, nrta_seq_id: u64, f: impl FnOnce() -> R) -> R {
        match &self.inner.tracing {
            Some(t) => {
                let access = payload::TensorAccess { tensor_id: self.inner.id, tensor_name: t.name_id, offset, bytes };
                t.span(event_type, access, nrta_seq_id, f)
            }
            None => f(),
        }
    }

    /// The tensor's id and its name's string id, for the events that mention it.
    pub(crate) fn trace_ids(&self) -> (u64, u32) {
        (self.inner.id, self.inner.tracing.as_ref().map_or(0, |t| t.name_id))
    }

    /// Runs `f` on the tensor's bytes, mutably.
    pub(crate) fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut storage = self.storage_mut();
        let start = self.inner.offset as usize;
        f(&mut storage[start..start + self.inner.size as usize])
    }

    /// Runs `f` on the tensor's bytes, mutably, holding its memory for the whole run,
    /// when no other tensor shares that memory (a slice) and nothing holds it now; else
    /// gives `f` back without running it (then a caller that waits on other threads
    /// while `f` runs cannot keep them from a tensor they need).
    pub(crate) fn try_with_bytes_mut<R, F: FnOnce(&mut [u8]) -> R>(&self, f: F) -> Result<R, F> {
        if Arc::strong_count(&self.inner.storage) != 1 {
            return Err(f);
        }
        let Ok(mut storage) = self.inner.storage.bytes.try_write() else { return Err(f) };
        let start = self.inner.offset as usize;
        Ok(f(&mut storage[start..start + self.inner.size as usize]))
    }

    /// Where the tensor lies for processes of this host, when its memory is shared.
    pub(crate) fn shared_place(&self) -> Option<SharedPlace> {
        let whole = self.inner.storage.shared?;
        Some(SharedPlace { offset: whole.offset + self.inner.offset, len: self.inner.size, ..whole })
    }

    /// Whether this tensor's memory is `other`'s (a slice of it, or the same tensor).
    pub(crate) fn shares_memory_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.inner.storage, &other.inner.storage)
    }

    /// Runs `f` on the tensor's bytes, holding them for reading for the whole run, when
    /// nothing writes them now; else gives `f` back without running it (as
    /// [`Tensor::try_with_bytes_mut`], for the same reason).
    pub(crate) fn try_with_bytes<R, F: FnOnce(&[u8]) -> R>(&self, f: F) -> Result<R, F> {
        let Ok(storage) = self.inner.storage.bytes.try_read() else { return Err(f) };
        let start = self.inner.offset as usize;
        Ok(f(&storage[start..start + self.inner.size as usize]))
    }

    /// `NRT_INVALID` (naming `what`, the access) unless `len` bytes from `offset` lie
    /// inside the tensor.
    pub fn check_range(&self, what: &str, offset: u64, len: u64) -> NrtResult<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.size => Ok(()),
            _ => Err(NrtError::invalid(format!(
                "cannot {what} {len} bytes at offset {offset} of tensor `{}`, which holds {} bytes; nothing was changed",
                self.inner.name, self.inner.size
            ))),
        }
    }

    fn storage(&self) -> RwLockReadGuard<'_, Memory> {
        self.inner.storage.bytes.read().unwrap_or_else(|e| e.into_inner())
    }

    fn storage_mut(&self) -> RwLockWriteGuard<'_, Memory> {
        self.inner.storage.bytes.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// The tensor memory one execution works on, locked for its whole length.
///
/// Inputs are read-locked. An output is write-locked, so the program can write it in
/// place, when no input or other output shares its storage; other outputs are written
/// after the locks are released (which also serves a tensor bound as both input and
/// output). Each storage is locked once (a second read lock would wait behind a queued
/// writer), and all of them in address order, the order `Tensor::copy_to` uses, so no
/// two lockers can wait on each other in a cycle.
pub(crate) struct ExecutionLocks<'t> {
    inputs: &'t [Tensor],
    outputs: &'t [Tensor],
    read_guards: Vec<RwLockReadGuard<'t, Memory>>,
    /// For each input, the index of its storage's read guard.
    read_guard_of: Vec<usize>,
    /// Write guards of the outputs written in place, with the output's index.
    write_guards: Vec<(usize, RwLockWriteGuard<'t, Memory>)>,
}

impl<'t> ExecutionLocks<'t> {
    pub(crate) fn new(inputs: &'t [Tensor], outputs: &'t [Tensor]) -> ExecutionLocks<'t> {
        let storage = |t: &Tensor| Arc::as_ptr(&t.inner.storage);
        let shared = |k: usize| {
            let s = storage(&outputs[k]);
            inputs.iter().any(|t| storage(t) == s)
                || outputs.iter().enumerate().any(|(other, t)| other != k && storage(t) == s)
        };
        // (storage, Some(output) for a write lock or None for a read lock, a tensor on it)
        let mut plan: Vec<(*const Storage, Option<usize>, &'t Tensor)> =
            inputs.iter().map(|t| (storage(t), None, t)).collect();
        plan.extend((0..outputs.len()).filter(|&k| !shared(k)).map(|k| (storage(&outputs[k]), Some(k), &outputs[k])));
        plan.sort_unstable_by_key(|&(s, _, _)| s);
        plan.dedup_by_key(|(s, _, _)| *s);

        let mut read_storages = Vec::new();
        let mut read_guards = Vec::new();
        let mut write_guards = Vec::new();
        for (s, output, tensor) in plan {
            match output {
                Some(k) => write_guards.push((k, tensor.storage_mut())),
                None => {
                    read_storages.push(s);
                    read_guards.push(tensor.storage());
                }
            }
        }
        let read_guard_of =
            inputs.iter().map(|t| read_storages.iter().position(|&s| s == storage(t)).unwrap_or_default()).collect();
        ExecutionLocks { inputs, outputs, read_guards, read_guard_of, write_guards }
    }

    /// The bytes of every input, and of every output that is written in place (`None`
    /// for the others), by position.
    pub(crate) fn split(&mut self) -> (Vec<&[u8]>, Vec<Option<&mut [u8]>>) {
        let inputs = self
            .inputs
            .iter()
            .zip(&self.read_guard_of)
            .map(|(t, &g)| {
                let start = t.inner.offset as usize;
                &self.read_guards[g][start..start + t.inner.size as usize]
            })
            .collect();
        let mut outputs: Vec<Option<&mut [u8]>> = (0..self.outputs.len()).map(|_| None).collect();
        for (k, guard) in &mut self.write_guards {
            let t = &self.outputs[*k];
            let start = t.inner.offset as usize;
            outputs[*k] = Some(&mut guard[start..start + t.inner.size as usize]);
        }
        (inputs, outputs)
    }
}

/// Named tensors bound to a model's inputs or outputs.
#[derive(Debug, Clone, Default)]
pub struct TensorSet {
    entries: Vec<(String, Tensor)>,
}

impl TensorSet {
    pub fn new() -> TensorSet {
        TensorSet::default()
    }

    /// Binds `tensor` to `name`, replacing an earlier binding of the same name.
    pub fn add(&mut self, name: &str, tensor: Tensor) {
        match self.entries.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = tensor,
            None => self.entries.push((name.to_owned(), tensor)),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
