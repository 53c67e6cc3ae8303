//! Tensors: byte buffers on a NeuronCore's device memory or on the host.
//!
//! Sizes and offsets are `u64` throughout, so tensors of 4 GiB and more work. Every
//! access is bounds-checked before it touches memory: an out-of-range read, write,
//! copy or memset fails with `NRT_INVALID` and changes nothing. Slices share their
//! parent's storage, and the storage (with its memory charge) lives until the last
//! tensor viewing it is dropped.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::dtype::ArrayType;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::memory::MemoryCharge;
use crate::runtime::Lifecycle;

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
}

struct Storage {
    bytes: RwLock<memmap2::MmapMut>,
    _charge: MemoryCharge,
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
    /// Allocates zero-filled storage of `size` bytes, already charged to `charge`.
    pub(crate) fn allocate(
        name: &str,
        placement: TensorPlacement,
        size: u64,
        array_type: Option<ArrayType>,
        charge: MemoryCharge,
        lifecycle: Arc<Lifecycle>,
    ) -> NrtResult<Tensor> {
        let len = usize::try_from(size).map_err(|_| {
            NrtError::new(NrtStatus::Resource, format!("{size} bytes do not fit in this host's address space"))
        })?;
        // An anonymous mapping is zero-filled lazily: untouched pages of a large tensor
        // cost no physical memory, and without a swap reservation device memory may
        // exceed the host's RAM. A request the host cannot map is an error instead of an
        // abort. (A zero-length mapping is not allowed, hence the max.)
        let bytes = memmap2::MmapOptions::new().len(len.max(1)).no_reserve_swap().map_anon().map_err(|e| {
            NrtError::new(
                NrtStatus::Resource,
                format!("the host could not provide {size} bytes for tensor `{name}`: {e}"),
            )
        })?;
        Ok(Tensor {
            inner: Arc::new(TensorInner {
                id: NEXT_TENSOR_ID.fetch_add(1, Ordering::Relaxed),
                name: name.to_owned(),
                placement,
                array_type,
                storage: Arc::new(Storage { bytes: RwLock::new(bytes), _charge: charge }),
                offset: 0,
                size,
                lifecycle,
            }),
        })
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
        self.check_range("slice", offset, size)?;
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
            }),
        })
    }

    /// Copies `data` into the tensor at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> NrtResult<()> {
        self.inner.lifecycle.check()?;
        self.check_range("write", offset, data.len() as u64)?;
        let start = (self.inner.offset + offset) as usize;
        self.storage_mut()[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }

    /// Copies `out.len()` bytes from the tensor at `offset` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> NrtResult<()> {
        self.inner.lifecycle.check()?;
        self.check_range("read", offset, out.len() as u64)?;
        let start = (self.inner.offset + offset) as usize;
        out.copy_from_slice(&self.storage()[start..start + out.len()]);
        Ok(())
    }

    /// Reads the whole tensor.
    pub fn read_all(&self) -> NrtResult<Vec<u8>> {
        let mut out =
            vec![0u8; usize::try_from(self.size()).map_err(|_| NrtError::invalid("tensor too large to read at once"))?];
        self.read(0, &mut out)?;
        Ok(out)
    }

    /// Sets `size` bytes from `offset` to `value`.
    pub fn memset(&self, offset: u64, value: u8, size: u64) -> NrtResult<()> {
        self.inner.lifecycle.check()?;
        self.check_range("memset", offset, size)?;
        let start = (self.inner.offset + offset) as usize;
        self.storage_mut()[start..start + size as usize].fill(value);
        Ok(())
    }

    /// Copies `size` bytes from `self` at `src_offset` to `dst` at `dst_offset`.
    pub fn copy_to(&self, src_offset: u64, dst: &Tensor, dst_offset: u64, size: u64) -> NrtResult<()> {
        self.inner.lifecycle.check()?;
        self.check_range("copy from", src_offset, size)?;
        dst.check_range("copy into", dst_offset, size)?;
        let src_start = (self.inner.offset + src_offset) as usize;
        let dst_start = (dst.inner.offset + dst_offset) as usize;
        let len = size as usize;
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
        Ok(())
    }

    /// Runs `f` on the tensor's bytes, mutably.
    pub(crate) fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut storage = self.storage_mut();
        let start = self.inner.offset as usize;
        f(&mut storage[start..start + self.inner.size as usize])
    }

    fn check_range(&self, what: &str, offset: u64, len: u64) -> NrtResult<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.size => Ok(()),
            _ => Err(NrtError::invalid(format!(
                "{what} of {len} bytes at offset {offset} is outside tensor `{}` of {} bytes; nothing was changed",
                self.inner.name, self.inner.size
            ))),
        }
    }

    fn storage(&self) -> RwLockReadGuard<'_, memmap2::MmapMut> {
        self.inner.storage.bytes.read().unwrap_or_else(|e| e.into_inner())
    }

    fn storage_mut(&self) -> RwLockWriteGuard<'_, memmap2::MmapMut> {
        self.inner.storage.bytes.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Read access to several tensors at once, for the length of an execution. Each
/// storage is locked once, however many of the tensors share it (a second read lock
/// would wait behind a queued writer), and storages are locked in address order.
pub(crate) struct ReadSet<'t> {
    tensors: &'t [Tensor],
    guards: Vec<RwLockReadGuard<'t, memmap2::MmapMut>>,
    /// For each tensor, the index of its storage's guard.
    guard_of: Vec<usize>,
}

impl<'t> ReadSet<'t> {
    pub(crate) fn new(tensors: &'t [Tensor]) -> ReadSet<'t> {
        // Lock each distinct storage once, in address order: the same global order
        // `copy_to` uses, so no two lockers can wait on each other in a cycle.
        let mut storages: Vec<(*const Storage, usize)> =
            tensors.iter().enumerate().map(|(i, t)| (Arc::as_ptr(&t.inner.storage), i)).collect();
        storages.sort_unstable();
        storages.dedup_by_key(|(storage, _)| *storage);
        let guards = storages.iter().map(|&(_, i)| tensors[i].storage()).collect();
        let guard_of = tensors
            .iter()
            .map(|t| {
                let storage = Arc::as_ptr(&t.inner.storage);
                storages.binary_search_by_key(&storage, |&(s, _)| s).unwrap_or_default()
            })
            .collect();
        ReadSet { tensors, guards, guard_of }
    }

    /// The bytes of tensor `i`.
    pub(crate) fn bytes(&self, i: usize) -> &[u8] {
        let inner = &self.tensors[i].inner;
        let start = inner.offset as usize;
        &self.guards[self.guard_of[i]][start..start + inner.size as usize]
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
