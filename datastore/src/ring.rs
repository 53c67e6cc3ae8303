//! The lossy event ring: fixed-size slots with per-slot sequence numbers.
//!
//! Producers never wait. A producer claims the next index (`head`), marks the slot
//! odd (`2·index + 1`), stores fifteen payload words (the last a check over the index
//! and the other fourteen), and marks it even (`2·index + 2`). Overwrite-oldest is the
//! normal mode; in discard mode a producer refuses an event, and counts it, when the
//! in-process consumer is a whole ring behind.
//!
//! Readers never write. A reader that wants index `i` accepts the slot only if its
//! sequence is `2·i + 2` before and after copying the payload and the check matches;
//! a larger sequence means the event was overwritten, and so does a smaller one once
//! `head` shows the slot has since been claimed again. Every index is therefore either
//! delivered or counted lost, exactly once, whatever the producers and the scheduler
//! do — including a producer preempted mid-write while others lap the ring, whose
//! interleaved stores the check catches.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use crate::layout::{RING_HEADER_BYTES, SLOT_BYTES, SLOT_WORDS, ring};
use crate::shm::Region;

/// Payload words of a slot, the check word excluded.
pub(crate) const PAYLOAD_WORDS: usize = SLOT_WORDS - 2;

/// How many slots ahead of the one being written [`prefetch`] fetches.
const PREFETCH_AHEAD: u64 = 4;

/// Fetches `slot`'s cache lines, which a writer fills a few records later: a ring is
/// written faster than the hardware prefetcher follows, and a record whose lines are
/// not in the cache waits for memory (a loop's device events, one record per
/// iteration, took a quarter of the loop's time).
#[inline(always)]
fn prefetch(slot: &[AtomicU64; SLOT_WORDS]) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..SLOT_BYTES as usize).step_by(64) {
        let address = slot.as_ptr().cast::<i8>().wrapping_add(line);
        // SAFETY: a prefetch reads nothing the program sees and cannot fault, and the
        // address is inside the slot.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}
pub(crate) type Payload = [u64; PAYLOAD_WORDS];

/// Where a ring is in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingRef {
    pub(crate) base: u64,
    pub(crate) capacity: u64,
}

/// How a producer claims a slot.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Claim<'a> {
    /// Any thread may produce (one atomic increment).
    Shared,
    /// The caller guarantees no other producer for this ring runs concurrently.
    Exclusive,
    /// Shared, but refuse when `consumed` is a whole ring behind.
    Discard { consumed: &'a AtomicU64 },
}

/// What a reader found at an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SlotRead {
    Ready(Payload),
    /// Overwritten, or torn by a producer that had been lapped.
    Lost,
    /// Not written yet (or its producer has not finished).
    NotYet,
}

impl RingRef {
    #[inline]
    fn head<'r>(&self, region: &'r Region) -> &'r AtomicU64 {
        region.u64(self.base + ring::HEAD)
    }

    #[inline]
    fn slot<'r>(&self, region: &'r Region, index: u64) -> &'r [AtomicU64; SLOT_WORDS] {
        region.words::<SLOT_WORDS>(self.base + RING_HEADER_BYTES + (index & (self.capacity - 1)) * SLOT_BYTES)
    }

    /// Events claimed so far.
    pub(crate) fn produced(&self, region: &Region) -> u64 {
        self.head(region).load(Ordering::Acquire)
    }

    /// Events refused in discard mode.
    pub(crate) fn dropped(&self, region: &Region) -> u64 {
        region.u64(self.base + ring::DROPPED).load(Ordering::Relaxed)
    }

    /// Device rings: the device events produced (a record may hold several).
    pub(crate) fn events<'r>(&self, region: &'r Region) -> &'r AtomicU64 {
        region.u64(self.base + ring::EVENTS)
    }

    /// Counts `n` more events refused in discard mode.
    pub(crate) fn add_dropped(&self, region: &Region, n: u64) {
        region.u64(self.base + ring::DROPPED).fetch_add(n, Ordering::Relaxed);
    }

    /// Appends one event; `false` when discard mode refused it.
    #[inline]
    ///
    /// A record type may use fewer than [`PAYLOAD_WORDS`] words (`N`): the others are
    /// not written, so they stay zero as the file was created, provided every record
    /// in a ring has the same length (which the check then covers as if zero-padded).
    pub(crate) fn push<const N: usize>(&self, region: &Region, claim: Claim<'_>, payload: &[u64; N]) -> bool {
        self.push_then(region, claim, payload, || {})
    }

    /// [`RingRef::push`], calling `written` after the payload is stored and before the
    /// slot is published (a claim refused in discard mode never calls it).
    #[inline]
    pub(crate) fn push_then<const N: usize>(
        &self,
        region: &Region,
        claim: Claim<'_>,
        payload: &[u64; N],
        written: impl FnOnce(),
    ) -> bool {
        const { assert!(N <= PAYLOAD_WORDS) };
        let head = self.head(region);
        let index = match claim {
            Claim::Shared => head.fetch_add(1, Ordering::Relaxed),
            Claim::Exclusive => {
                let index = head.load(Ordering::Relaxed);
                head.store(index + 1, Ordering::Relaxed);
                index
            }
            Claim::Discard { consumed } => loop {
                let index = head.load(Ordering::Relaxed);
                if index.wrapping_sub(consumed.load(Ordering::Acquire)) >= self.capacity {
                    region.u64(self.base + ring::DROPPED).fetch_add(1, Ordering::Relaxed);
                    return false;
                }
                if head.compare_exchange_weak(index, index + 1, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                    break index;
                }
            },
        };
        let slot = self.slot(region, index);
        prefetch(self.slot(region, index + PREFETCH_AHEAD));
        slot[0].store(2 * index + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (word, value) in slot[1..=N].iter().zip(payload) {
            word.store(*value, Ordering::Relaxed);
        }
        slot[SLOT_WORDS - 1].store(check(index, payload), Ordering::Relaxed);
        written();
        slot[0].store(2 * index + 2, Ordering::Release);
        true
    }

    /// Whether the slot of `index` is claimed and still being written.
    pub(crate) fn in_flight(&self, region: &Region, index: u64) -> bool {
        self.slot(region, index)[0].load(Ordering::Acquire) == 2 * index + 1
    }

    /// Reads the event at `index`.
    #[inline]
    pub(crate) fn read(&self, region: &Region, index: u64) -> SlotRead {
        let slot = self.slot(region, index);
        let expected = 2 * index + 2;
        let before = slot[0].load(Ordering::Acquire);
        if before > expected {
            return SlotRead::Lost;
        }
        if before < expected {
            return SlotRead::NotYet;
        }
        let mut payload = [0u64; PAYLOAD_WORDS];
        for (value, word) in payload.iter_mut().zip(&slot[1..=PAYLOAD_WORDS]) {
            *value = word.load(Ordering::Relaxed);
        }
        let stored_check = slot[SLOT_WORDS - 1].load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let after = slot[0].load(Ordering::Relaxed);
        if after == before && stored_check == check(index, &payload) {
            SlotRead::Ready(payload)
        } else {
            SlotRead::Lost
        }
    }
}

/// A reader's position in one ring, with exact delivery and loss counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingCursor {
    /// The next index to read.
    pub next: u64,
    pub delivered: u64,
    pub lost: u64,
}

impl RingCursor {
    /// A cursor that starts at index `next`.
    pub fn at(next: u64) -> RingCursor {
        RingCursor { next, ..RingCursor::default() }
    }

    /// Reads up to `max` events, calling `deliver` for each. With `writer_done` (the
    /// producer has exited or closed) an event that was claimed but never finished is
    /// counted lost instead of waited for. Returns the number delivered.
    pub(crate) fn poll(
        &mut self,
        region: &Region,
        ring: RingRef,
        max: usize,
        writer_done: bool,
        mut deliver: impl FnMut(u64, &Payload),
    ) -> usize {
        let head = ring.produced(region);
        if head > self.next + ring.capacity {
            self.lost += head - ring.capacity - self.next;
            self.next = head - ring.capacity;
        }
        let mut delivered = 0;
        while self.next < head && delivered < max {
            match ring.read(region, self.next) {
                SlotRead::Ready(payload) => {
                    deliver(self.next, &payload);
                    self.delivered += 1;
                    delivered += 1;
                }
                SlotRead::Lost => self.lost += 1,
                SlotRead::NotYet => {
                    if !writer_done && ring.produced(region) <= self.next + ring.capacity {
                        break;
                    }
                    self.lost += 1;
                }
            }
            self.next += 1;
        }
        delivered
    }
}

/// A check over a slot's index and payload. Products with distinct odd constants are
/// summed (independent multiplies, so it costs a few cycles), and a record spliced
/// from two writes differs from both in at least one term.
#[inline(always)]
fn check<const N: usize>(index: u64, payload: &[u64; N]) -> u64 {
    const K: [u64; PAYLOAD_WORDS + 1] = [
        0x9E37_79B9_7F4A_7C15,
        0xC2B2_AE3D_27D4_EB4F,
        0x1656_67B1_9E37_79F9,
        0x85EB_CA77_C2B2_AE63,
        0x27D4_EB2F_1656_67C5,
        0xFF51_AFD7_ED55_8CCD,
        0xC4CE_B9FE_1A85_EC53,
        0x8CB9_2BA7_2F3D_8DD7,
        0x5851_F42D_4C95_7F2D,
        0x1405_7B7E_F767_814F,
        0x2545_F491_4F6C_DD1D,
        0xD6E8_FEB8_6659_FD93,
        0xA076_1D64_78BD_642F,
        0xE703_7ED1_A0B4_28DB,
        0x8EBC_6AF0_9C88_C6E3,
    ];
    let mut sum = index.wrapping_mul(K[0]);
    for (value, k) in payload.iter().zip(&K[1..]) {
        sum = sum.wrapping_add(value.wrapping_mul(*k));
    }
    sum ^ (sum >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Mapping;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    fn region(capacity: u64) -> (Region, RingRef) {
        let len = (RING_HEADER_BYTES + capacity * SLOT_BYTES) as usize;
        let map = memmap2::MmapOptions::new().len(len).map_anon().expect("anonymous map");
        (Region::new(Mapping::ReadWrite(map)), RingRef { base: 0, capacity })
    }

    fn payload(n: u64) -> Payload {
        std::array::from_fn(|k| n.wrapping_mul(31).wrapping_add(k as u64))
    }

    #[derive(Debug, Clone)]
    enum Step {
        Push(u8),
        Read(u8),
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(prop_oneof![(1u8..40).prop_map(Step::Push), (1u8..40).prop_map(Step::Read)], 1..60)
    }

    proptest! {
        /// Against a reference: a bounded queue that forgets its oldest entries.
        #[test]
        fn ring_matches_a_bounded_queue(capacity_log in 0u32..6, steps in steps()) {
            let capacity = 1u64 << capacity_log;
            let (region, ring) = region(capacity);
            let mut reference: VecDeque<u64> = VecDeque::new();
            let mut reference_lost = 0u64;
            let mut produced = 0u64;
            let mut cursor = RingCursor::default();
            for step in steps {
                match step {
                    Step::Push(n) => {
                        for _ in 0..n {
                            ring.push(&region, Claim::Shared, &payload(produced));
                            reference.push_back(produced);
                            produced += 1;
                            if reference.len() as u64 > capacity {
                                reference.pop_front();
                                reference_lost += 1;
                            }
                        }
                    }
                    Step::Read(n) => {
                        let mut got = Vec::new();
                        cursor.poll(&region, ring, n as usize, false, |index, p| got.push((index, *p)));
                        let want: Vec<u64> = (0..n).filter_map(|_| reference.pop_front()).collect();
                        prop_assert_eq!(got.len(), want.len());
                        for ((index, p), w) in got.iter().zip(&want) {
                            prop_assert_eq!(*index, *w);
                            prop_assert_eq!(*p, payload(*w));
                        }
                        prop_assert_eq!(cursor.lost, reference_lost);
                    }
                }
            }
            cursor.poll(&region, ring, usize::MAX, true, |_, _| {});
            prop_assert_eq!(cursor.delivered + cursor.lost, produced);
            prop_assert_eq!(ring.produced(&region), produced);
        }
    }

    #[test]
    fn discard_mode_refuses_events_a_ring_ahead_of_the_consumer() {
        let (region, ring) = region(4);
        let consumed = AtomicU64::new(0);
        let accepted =
            (0..10).filter(|&n| ring.push(&region, Claim::Discard { consumed: &consumed }, &payload(n))).count();
        assert_eq!(accepted, 4);
        assert_eq!(ring.dropped(&region), 6);
        let mut cursor = RingCursor::default();
        let mut got = Vec::new();
        cursor.poll(&region, ring, 10, false, |index, _| got.push(index));
        assert_eq!(got, [0, 1, 2, 3]);
        consumed.store(cursor.next, Ordering::Release);
        assert!(ring.push(&region, Claim::Discard { consumed: &consumed }, &payload(10)));
    }

    #[test]
    fn a_torn_slot_is_counted_lost_not_delivered() {
        let (region, ring) = region(2);
        ring.push(&region, Claim::Shared, &payload(0));
        // A lapped producer finishing late overwrites one payload word of slot 0.
        region.u64(RING_HEADER_BYTES + 24).store(12345, Ordering::Relaxed);
        let mut cursor = RingCursor::default();
        let delivered = cursor.poll(&region, ring, 10, false, |_, _| {});
        assert_eq!((delivered, cursor.lost, cursor.next), (0, 1, 1));
    }
}
