//! The byte buffers of collective calls, kept for the next calls of the process.
//!
//! A call moves whole tensors through buffers of their size: a rank's input, its
//! output, what a peer process sent. Allocated fresh each time, a large buffer comes
//! from the kernel as untouched pages, which the kernel zeroes on first touch: 14–20%
//! of the ranks bench's samples. Buffers of at least [`MIN_BYTES`] are handed back
//! after a call and reused by the next one; at most [`KEEP_BYTES`] in [`KEEP_COUNT`]
//! buffers are kept (the smallest are dropped first).

use std::sync::{Mutex, MutexGuard};

/// Smaller buffers come from the allocator, which recycles them itself.
const MIN_BYTES: usize = 64 << 10;
/// The most bytes kept in all.
pub(crate) const KEEP_BYTES: usize = 256 << 20;
/// The most buffers kept.
const KEEP_COUNT: usize = 16;

/// Kept buffers; the process has one pool ([`take`], [`give`] use it).
struct Pool(Mutex<Vec<Vec<u8>>>);

static POOL: Pool = Pool(Mutex::new(Vec::new()));

impl Pool {
    fn free(&self) -> MutexGuard<'_, Vec<Vec<u8>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The smallest kept buffer with room for `len` bytes, if any.
    fn reuse(&self, len: usize) -> Option<Vec<u8>> {
        if len < MIN_BYTES {
            return None;
        }
        let mut free = self.free();
        let best = (0..free.len()).filter(|&k| free[k].capacity() >= len).min_by_key(|&k| free[k].capacity())?;
        Some(free.swap_remove(best))
    }

    fn take(&self, len: usize) -> Vec<u8> {
        match self.reuse(len) {
            Some(mut buffer) => {
                if buffer.len() >= len {
                    buffer.truncate(len);
                } else {
                    buffer.resize(len, 0);
                }
                buffer
            }
            None => vec![0; len],
        }
    }

    fn give(&self, buffer: Vec<u8>) {
        if buffer.capacity() < MIN_BYTES {
            return;
        }
        let mut free = self.free();
        free.push(buffer);
        while free.len() > KEEP_COUNT || free.iter().map(Vec::capacity).sum::<usize>() > KEEP_BYTES {
            let smallest = (0..free.len()).min_by_key(|&k| free[k].capacity()).unwrap_or_default();
            free.swap_remove(smallest);
        }
    }
}

/// A buffer of `len` bytes to be overwritten whole: its bytes are whatever a previous
/// call left (zeros when new).
pub(crate) fn take(len: usize) -> Vec<u8> {
    POOL.take(len)
}

/// Hands a buffer back for later calls.
pub(crate) fn give(buffer: Vec<u8>) {
    POOL.give(buffer);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_smallest_fitting_first_within_the_bounds() {
        let pool = Pool(Mutex::new(Vec::new()));
        let (small, large) = (MIN_BYTES * 3, MIN_BYTES * 5);
        pool.give(vec![1; large]);
        pool.give(vec![2; small]);
        let reused = pool.take(small - 8);
        assert_eq!((reused.len(), reused.capacity(), reused[0]), (small - 8, small, 2), "the smallest that fits");
        let grown = pool.take(large);
        assert_eq!((grown.len(), grown.capacity(), grown[0]), (large, large, 1), "kept bytes, not zeroed");
        assert!(pool.free().is_empty());
        pool.give(vec![3; 16]);
        assert!(pool.free().is_empty(), "small buffers are not kept");
        // More than the budget: the smallest go first.
        for k in 0..KEEP_COUNT + 4 {
            pool.give(Vec::with_capacity(MIN_BYTES * (k + 1)));
        }
        pool.give(Vec::with_capacity(KEEP_BYTES / 2));
        let kept = pool.free();
        assert!(kept.len() <= KEEP_COUNT && kept.iter().map(Vec::capacity).sum::<usize>() <= KEEP_BYTES);
        assert!(kept.iter().any(|b| b.capacity() == KEEP_BYTES / 2), "the largest is kept");
    }
}
