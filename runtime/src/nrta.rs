//! Asynchronous execution (`nrta_*`): per core, execution units (XUs) that run requests
//! in order from a bounded queue, each request named by a sequence id.
//!
//! A unit is a worker thread fed through a channel. Scheduling assigns the next
//! sequence number and refuses with `NRT_QUEUE_FULL` when `capacity` requests are
//! already in flight (queued or running). Requests complete in order, so "completed"
//! is one number per unit: the last completed sequence number. Each completion also
//! adds one to the unit's eventfd, which a caller can poll (from `tokio` through
//! `AsyncFd`, or `poll(2)`), and wakes threads waiting in [`Unit::wait`]. A failed
//! request is still completed; an error tracker passed at schedule time records its
//! sequence id and status.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::error::{NrtError, NrtResult, NrtStatus};

/// The kinds of execution unit each core has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Xu {
    TensorRead = 0,
    TensorWrite = 1,
    TensorOp = 2,
    Compute = 3,
    Collectives = 4,
}

impl Xu {
    pub const ALL: &[Xu] = <Xu as strum::VariantArray>::VARIANTS;

    /// `tensor_read`, `tensor_write`, `tensor_op`, `compute` or `collectives`.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// A request's sequence id: the top 16 bits name the execution unit (`core << 3 | xu`),
/// the low 48 bits count that unit's requests from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl SeqId {
    const NUMBER_BITS: u32 = 48;

    pub fn new(unit: u16, number: u64) -> SeqId {
        SeqId(u64::from(unit) << Self::NUMBER_BITS | (number & ((1 << Self::NUMBER_BITS) - 1)))
    }

    /// The id of `core`'s execution unit of kind `xu`.
    pub fn unit_of(core: u32, xu: Xu) -> u16 {
        unit_id(core, xu)
    }

    /// The execution unit's id.
    pub fn unit(self) -> u16 {
        (self.0 >> Self::NUMBER_BITS) as u16
    }

    /// The request's number on its unit, from 1.
    pub fn number(self) -> u64 {
        self.0 & ((1 << Self::NUMBER_BITS) - 1)
    }

    /// The core of the unit.
    pub fn core(self) -> u32 {
        u32::from(self.unit() >> 3)
    }

    /// The kind of the unit, if the id names one.
    pub fn xu(self) -> Option<Xu> {
        Xu::ALL.get(usize::from(self.unit() & 7)).copied()
    }
}

/// The id of `core`'s unit of kind `xu`.
pub(crate) fn unit_id(core: u32, xu: Xu) -> u16 {
    ((core << 3) | xu as u32) as u16
}

/// A failed request an error tracker saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedError {
    pub seq_id: SeqId,
    pub status: NrtStatus,
    pub message: String,
}

/// Collects the failures of the requests it is passed to (`nrta_error_tracker_*`).
#[derive(Debug, Clone)]
pub struct ErrorTracker {
    core: u32,
    errors: Arc<Mutex<Vec<TrackedError>>>,
}

impl ErrorTracker {
    pub(crate) fn new(core: u32) -> ErrorTracker {
        ErrorTracker { core, errors: Arc::default() }
    }

    /// The core whose requests it may track.
    pub fn core(&self) -> u32 {
        self.core
    }

    /// The failures so far, in completion order.
    pub fn errors(&self) -> Vec<TrackedError> {
        lock(&self.errors).clone()
    }

    /// The failures so far, in completion order, leaving the tracker empty (for callers
    /// that run long and collect as they go).
    pub fn take(&self) -> Vec<TrackedError> {
        std::mem::take(&mut *lock(&self.errors))
    }
}

/// The bytes a scheduled tensor read fills in when it completes.
#[derive(Debug, Clone, Default)]
pub struct PendingRead(pub(crate) Arc<Mutex<Option<Vec<u8>>>>);

impl PendingRead {
    /// The bytes read, once the request has completed successfully (then `None` again:
    /// they are handed over once).
    pub fn take(&self) -> Option<Vec<u8>> {
        lock(&self.0).take()
    }
}

/// The work of one request; its result is what the error tracker sees.
pub(crate) type Work = Box<dyn FnOnce(SeqId) -> NrtResult<()> + Send>;

struct Job {
    seq: SeqId,
    work: Work,
    tracker: Option<ErrorTracker>,
}

/// One execution unit: a worker thread and its queue.
pub(crate) struct Unit {
    id: u16,
    capacity: u64,
    /// The channel to the worker (gone once the unit is shut down) and the last
    /// sequence number scheduled.
    queue: Mutex<(Option<crossbeam_channel::Sender<Job>>, u64)>,
    completed: AtomicU64,
    completed_lock: Mutex<()>,
    completion: Condvar,
    eventfd: EventFd,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unit").field("id", &self.id).field("completed", &self.completed).finish_non_exhaustive()
    }
}

impl Unit {
    /// Starts unit `id` with room for `capacity` requests in flight.
    pub(crate) fn start(id: u16, capacity: usize) -> NrtResult<Arc<Unit>> {
        let eventfd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| NrtError::new(NrtStatus::Resource, format!("cannot create a completion eventfd: {e}")))?;
        let (sender, receiver) = crossbeam_channel::unbounded::<Job>();
        let unit = Arc::new(Unit {
            id,
            capacity: capacity.max(1) as u64,
            queue: Mutex::new((Some(sender), 0)),
            completed: AtomicU64::new(0),
            completed_lock: Mutex::new(()),
            completion: Condvar::new(),
            eventfd,
            worker: Mutex::new(None),
        });
        let worker = Arc::clone(&unit);
        let name = format!("neuron-xu-nc{}-{}", id >> 3, SeqId::new(id, 0).xu().map_or("unit", Xu::name));
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                for job in receiver {
                    let result = (job.work)(job.seq);
                    if let (Err(error), Some(tracker)) = (result, &job.tracker) {
                        lock(&tracker.errors).push(TrackedError {
                            seq_id: job.seq,
                            status: error.status,
                            message: error.message,
                        });
                    }
                    worker.complete(job.seq);
                }
            })
            .map_err(|e| NrtError::new(NrtStatus::Resource, format!("cannot start an execution unit thread: {e}")))?;
        *lock(&unit.worker) = Some(handle);
        Ok(unit)
    }

    /// Marks `seq` completed: once the eventfd is readable, or a waiter returns, the
    /// completion is visible.
    fn complete(&self, seq: SeqId) {
        {
            let _guard = lock(&self.completed_lock);
            self.completed.store(seq.number(), Ordering::Release);
            // Only fails if the counter would overflow, which a count of completions cannot.
            let _ = self.eventfd.write(1);
        }
        self.completion.notify_all();
    }

    /// Queues `work`; `NRT_QUEUE_FULL` when `capacity` requests are in flight.
    /// `scheduled` sees the request's id before the worker can start it.
    pub(crate) fn schedule(
        &self,
        work: Work,
        tracker: Option<ErrorTracker>,
        scheduled: impl FnOnce(SeqId),
    ) -> NrtResult<SeqId> {
        let mut queue = lock(&self.queue);
        let in_flight = queue.1 - self.completed.load(Ordering::Acquire);
        if in_flight >= self.capacity {
            return Err(NrtError::new(
                NrtStatus::QueueFull,
                format!(
                    "the {} unit of nc{} already has {in_flight} requests in flight (its queue holds {}); wait for a completion and schedule again",
                    SeqId::new(self.id, 0).xu().map_or("execution", Xu::name),
                    self.id >> 3,
                    self.capacity
                ),
            ));
        }
        let seq = SeqId::new(self.id, queue.1 + 1);
        let sender = queue.0.as_ref().ok_or_else(|| NrtError::new(NrtStatus::Closed, "the runtime has been closed"))?;
        scheduled(seq);
        sender
            .send(Job { seq, work, tracker })
            .map_err(|_| NrtError::new(NrtStatus::Closed, "the runtime has been closed"))?;
        queue.1 = seq.number();
        Ok(seq)
    }

    /// The last completed request, if any.
    pub(crate) fn last_completed(&self) -> Option<SeqId> {
        match self.completed.load(Ordering::Acquire) {
            0 => None,
            n => Some(SeqId::new(self.id, n)),
        }
    }

    /// Whether request `seq` of this unit has completed (`NRT_INVALID` if it was never
    /// scheduled).
    pub(crate) fn is_completed(&self, seq: SeqId) -> NrtResult<bool> {
        if seq.number() == 0 || seq.number() > lock(&self.queue).1 {
            return Err(NrtError::invalid(format!("sequence id {:#x} was never scheduled on this unit", seq.0)));
        }
        Ok(self.completed.load(Ordering::Acquire) >= seq.number())
    }

    /// Waits until `seq` completes or `timeout` passes; `NRT_TIMEOUT` then.
    pub(crate) fn wait(&self, seq: SeqId, timeout: Duration) -> NrtResult<()> {
        self.is_completed(seq)?;
        let deadline = Instant::now() + timeout;
        let mut guard = lock(&self.completed_lock);
        while self.completed.load(Ordering::Acquire) < seq.number() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NrtError::new(
                    NrtStatus::Timeout,
                    format!("sequence id {:#x} did not complete within {:.3} s", seq.0, timeout.as_secs_f64()),
                ));
            }
            guard = self.completion.wait_timeout(guard, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(())
    }

    /// Stops taking requests, lets the worker finish the queued ones, and joins it.
    pub(crate) fn shut_down(&self) {
        lock(&self.queue).0 = None;
        if let Some(worker) = lock(&self.worker).take()
            && worker.thread().id() != std::thread::current().id()
        {
            let _ = worker.join();
        }
    }
}

/// A pollable completion handle of one execution unit: its eventfd becomes readable
/// when a request completes, and [`CompletionHandle::acknowledge`] reads (and resets)
/// the number of completions since the last read.
#[derive(Debug, Clone)]
pub struct CompletionHandle(pub(crate) Arc<Unit>);

impl CompletionHandle {
    /// Completions since the last call (0 when none, without blocking).
    pub fn acknowledge(&self) -> u64 {
        self.0.eventfd.read().unwrap_or(0)
    }

    /// The last completed request of the unit.
    pub fn last_completed(&self) -> Option<SeqId> {
        self.0.last_completed()
    }
}

impl AsFd for CompletionHandle {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.eventfd.as_fd()
    }
}

impl AsRawFd for CompletionHandle {
    fn as_raw_fd(&self) -> RawFd {
        self.0.eventfd.as_raw_fd()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execution_units_have_their_public_names() {
        let names: Vec<&str> = Xu::ALL.iter().map(|xu| xu.name()).collect();
        assert_eq!(names, ["tensor_read", "tensor_write", "tensor_op", "compute", "collectives"]);
    }

    #[test]
    fn sequence_ids_pack_unit_and_number() {
        let seq = SeqId::new(unit_id(5, Xu::Compute), 42);
        assert_eq!(seq.0, (5 << 3 | 3) << 48 | 42);
        assert_eq!((seq.core(), seq.xu(), seq.number()), (5, Some(Xu::Compute), 42));
    }

    #[test]
    fn a_full_unit_refuses_and_completions_come_in_order() {
        let unit = Unit::start(unit_id(0, Xu::Compute), 2).expect("starts");
        let (release, gate) = crossbeam_channel::bounded::<()>(0);
        let blocked = |gate: crossbeam_channel::Receiver<()>| -> Work {
            Box::new(move |_| {
                let _ = gate.recv();
                Ok(())
            })
        };
        let first = unit.schedule(blocked(gate.clone()), None, |_| {}).expect("room");
        let second = unit.schedule(blocked(gate.clone()), None, |_| {}).expect("room");
        let full = unit.schedule(Box::new(|_| Ok(())), None, |_| {}).expect_err("two in flight");
        assert_eq!(full.status, NrtStatus::QueueFull);
        assert_eq!(unit.last_completed(), None);
        assert!(!unit.is_completed(first).expect("scheduled"));
        release.send(()).expect("first runs");
        unit.wait(first, Duration::from_secs(10)).expect("completes");
        assert_eq!(unit.last_completed(), Some(first));
        assert!(!unit.is_completed(second).expect("scheduled"));
        let tracker = ErrorTracker::new(0);
        let third = unit
            .schedule(
                Box::new(|_| Err(NrtError::new(NrtStatus::ExecOob, "out of bounds"))),
                Some(tracker.clone()),
                |_| {},
            )
            .expect("room again");
        release.send(()).expect("second runs");
        unit.wait(third, Duration::from_secs(10)).expect("completes");
        assert_eq!(
            tracker.errors().iter().map(|e| (e.seq_id, e.status)).collect::<Vec<_>>(),
            [(third, NrtStatus::ExecOob)]
        );
        assert_eq!(CompletionHandle(Arc::clone(&unit)).acknowledge(), 3, "three completions on the eventfd");
        assert!(unit.is_completed(SeqId::new(unit.id, 4)).is_err(), "never scheduled");
        unit.shut_down();
    }
}
