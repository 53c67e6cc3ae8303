//! Exemplars: per core, the last execution whose total latency fell in each range of
//! [`LATENCY_BOUNDS_NS`], and the last execution that failed in each error class, so
//! that a metric (a histogram bucket, an error counter) can name an execution behind
//! it (`neuron-monitor`'s OpenMetrics exposition does).
//!
//! Each is a 64-byte slot after the core's histograms (`datastore/FORMAT.md`), written
//! under its own seqlock when an execution is counted. Two executions of one core
//! finishing at once may race for a slot: the one that finds it being written leaves
//! it (an exemplar is an example, not a count).

use std::sync::atomic::{Ordering, fence};

use crate::ErrorClass;
use crate::shm::Region;

/// Upper bounds (nanoseconds, inclusive) of the latency ranges whose last execution a
/// core keeps: the bucket bounds of `neuron-monitor`'s execution latency histograms.
/// Longer executions have a slot of their own, the last.
pub const LATENCY_BOUNDS_NS: [u64; 19] = [
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
];

/// Latency slots: one per bound and one past the last.
pub const LATENCY_SLOTS: usize = LATENCY_BOUNDS_NS.len() + 1;
/// Slots per core: the latency slots, then one per [`ErrorClass`].
pub(crate) const SLOTS: usize = LATENCY_SLOTS + ErrorClass::ALL.len();
/// Bytes per slot.
pub(crate) const SLOT_BYTES: u64 = 64;

/// Slot fields (byte offsets).
mod field {
    /// Seqlock (odd while written; 0: never written).
    pub(super) const SEQ: u64 = 0;
    pub(super) const EXEC_ID: u64 = 8;
    /// The model id (bits 0–31) and the execution's status code (bits 32–63; 0: success).
    pub(super) const MODEL_STATUS: u64 = 16;
    pub(super) const LATENCY_NS: u64 = 24;
    /// The host clock's ticks when it returned (readers convert them with the header's
    /// calibration: the writer reads no clock for an exemplar).
    pub(super) const AT_TICKS: u64 = 32;
}

/// The latency slot of an execution of `ns` nanoseconds.
pub fn latency_slot(ns: u64) -> usize {
    LATENCY_BOUNDS_NS.iter().position(|&bound| ns <= bound).unwrap_or(LATENCY_BOUNDS_NS.len())
}

/// One execution, as the runtime records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Execution {
    pub exec_id: u64,
    pub model_id: u32,
    /// The execution's `NRT_STATUS` code (0: success).
    pub status: u32,
    /// Its total latency (the whole `execute` call; 0 when not known yet).
    pub latency_ns: u64,
    /// The host clock's ticks when it returned (or when its error was counted).
    pub at_ticks: u64,
}

/// One execution, as a reader sees a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exemplar {
    pub exec_id: u64,
    pub model_id: u32,
    /// The execution's `NRT_STATUS` code (0: success).
    pub status: u32,
    /// Its total latency (the whole `execute` call).
    pub latency_ns: u64,
    /// When it returned: `CLOCK_REALTIME` (through the offset measured when the file
    /// was made) and `CLOCK_MONOTONIC` nanoseconds.
    pub realtime_ns: u64,
    pub monotonic_ns: u64,
}

/// A core's exemplars: by latency slot, and by error class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoreExemplars {
    /// [`LATENCY_SLOTS`] entries, `None` where no execution has fallen yet (or where a
    /// writer kept the slot busy while it was read).
    pub latency: Vec<Option<Exemplar>>,
    /// One entry per [`ErrorClass`], in its order.
    pub errors: Vec<Option<Exemplar>>,
}

impl CoreExemplars {
    pub fn error(&self, class: ErrorClass) -> Option<&Exemplar> {
        self.errors.get(class as usize).and_then(Option::as_ref)
    }
}

/// Writes `exemplar` into the slot at byte offset `at`, unless another writer holds it.
pub(crate) fn write(region: &Region, at: u64, exemplar: &Execution) {
    let seq = region.u64(at + field::SEQ);
    let even = seq.load(Ordering::Relaxed);
    if even % 2 == 1 || seq.compare_exchange(even, even + 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
        return;
    }
    fence(Ordering::Release);
    let word = |offset: u64, value: u64| region.u64(at + offset).store(value, Ordering::Relaxed);
    word(field::EXEC_ID, exemplar.exec_id);
    word(field::MODEL_STATUS, u64::from(exemplar.model_id) | u64::from(exemplar.status) << 32);
    word(field::LATENCY_NS, exemplar.latency_ns);
    word(field::AT_TICKS, exemplar.at_ticks);
    seq.store(even + 2, Ordering::Release);
}

/// The slot at byte offset `at`, its ticks made `CLOCK_MONOTONIC` ns by `monotonic` and
/// `CLOCK_REALTIME` ns by adding `realtime_offset`: `None` when never written, or when
/// a writer kept it busy through a few tries.
pub(crate) fn read(region: &Region, at: u64, monotonic: impl Fn(u64) -> u64, realtime_offset: i64) -> Option<Exemplar> {
    let seq = region.u64(at + field::SEQ);
    let word = |offset: u64| region.u64(at + offset).load(Ordering::Relaxed);
    for _ in 0..100 {
        let before = seq.load(Ordering::Acquire);
        if before == 0 {
            return None;
        }
        if before % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let (exec_id, model_status, latency_ns, at_ticks) =
            (word(field::EXEC_ID), word(field::MODEL_STATUS), word(field::LATENCY_NS), word(field::AT_TICKS));
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) == before {
            let monotonic_ns = monotonic(at_ticks);
            return Some(Exemplar {
                exec_id,
                model_id: model_status as u32,
                status: (model_status >> 32) as u32,
                latency_ns,
                realtime_ns: monotonic_ns.saturating_add_signed(realtime_offset),
                monotonic_ns,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::open_pair;

    /// An execution returning now, on the clock the test file was calibrated with
    /// (`ticks()`: the TSC once a test of this process chose it).
    fn execution(exec_id: u64, latency_ns: u64, status: u32) -> Execution {
        Execution { exec_id, model_id: 7, status, latency_ns, at_ticks: crate::clock::ticks() }
    }

    /// What a reader sees of `e`, its times aside.
    fn fields(e: &Exemplar) -> (u64, u32, u32, u64) {
        (e.exec_id, e.model_id, e.status, e.latency_ns)
    }

    #[test]
    fn a_reader_sees_each_cores_last_execution_per_range_and_per_error_class() {
        let (_dir, writer, reader) = open_pair();
        let empty = &reader.snapshot().cores[0].exemplars;
        assert_eq!(empty.latency, vec![None; LATENCY_SLOTS]);
        assert_eq!(empty.errors, vec![None; ErrorClass::ALL.len()]);
        writer.record_exemplar(0, &execution(1, 30_000, 0), None);
        writer.record_exemplar(0, &execution(2, 40_000, 0), None);
        writer.record_exemplar(0, &execution(3, 90_000_000_000, 1006), Some(ErrorClass::Transient));
        writer.record_error_exemplar(0, &execution(4, 0, 0), ErrorClass::Hardware);
        let seen = &reader.snapshot().cores[0].exemplars;
        let latency = |k: usize| seen.latency[k].as_ref().map(fields);
        assert_eq!(latency(1), Some((2, 7, 0, 40_000)), "the last of the 25–50 µs range");
        assert_eq!(latency(LATENCY_SLOTS - 1), Some((3, 7, 1006, 90_000_000_000)));
        assert_eq!(seen.latency.iter().flatten().count(), 2);
        assert_eq!(seen.error(ErrorClass::Transient).map(fields), Some((3, 7, 1006, 90_000_000_000)));
        assert_eq!(seen.error(ErrorClass::Hardware).map(fields), Some((4, 7, 0, 0)));
        assert_eq!(seen.errors.iter().flatten().count(), 2);
        // Its ticks, as the file's clock: CLOCK_MONOTONIC, and CLOCK_REALTIME by the
        // offset measured when the file was made.
        let e = seen.latency[1].expect("the 25–50 µs range");
        let now = crate::clock::monotonic_ns();
        assert!(e.monotonic_ns > now - 1_000_000_000 && e.monotonic_ns < now + 1_000_000_000, "{e:?} at {now}");
        let offset = crate::clock::realtime_ns() as i128 - crate::clock::monotonic_ns() as i128;
        assert!((i128::from(e.realtime_ns) - i128::from(e.monotonic_ns) - offset).abs() < 1_000_000_000, "{e:?}");
    }

    #[test]
    fn a_slot_being_written_is_left_to_its_writer() {
        let (_dir, writer, reader) = open_pair();
        writer.record_exemplar(0, &execution(1, 10, 0), None);
        let at = writer.layout.exemplar_slot(0, 0);
        let seq = writer.region.u64(at + field::SEQ);
        // A writer holds the slot (odd): another leaves it, and a reader gives up on it.
        seq.fetch_add(1, Ordering::Relaxed);
        writer.record_exemplar(0, &execution(2, 10, 0), None);
        assert_eq!(reader.snapshot().cores[0].exemplars.latency[0], None);
        seq.fetch_add(1, Ordering::Relaxed);
        assert_eq!(reader.snapshot().cores[0].exemplars.latency[0].as_ref().map(fields), Some((1, 7, 0, 10)));
    }

    #[test]
    fn an_execution_falls_in_the_first_range_whose_bound_holds_it() {
        assert_eq!(latency_slot(0), 0);
        assert_eq!(latency_slot(25_000), 0);
        assert_eq!(latency_slot(25_001), 1);
        assert_eq!(latency_slot(1_000_000), 5);
        assert_eq!(latency_slot(30_000_000_000), LATENCY_BOUNDS_NS.len() - 1);
        assert_eq!(latency_slot(30_000_000_001), LATENCY_SLOTS - 1);
        assert_eq!(latency_slot(u64::MAX), LATENCY_SLOTS - 1);
    }
}
