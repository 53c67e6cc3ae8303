//! The bounded set of host compute slots that virtual NeuronCores execute in.
//!
//! Virtual cores own no threads, and a synchronous execution runs on the thread that
//! asked for it, as `nrt_execute` does: no hand-off to another thread, so nothing waits
//! for a wake-up and an execution's data and events stay on one CPU. What bounds the
//! host CPUs the runtime computes on is the number of slots: a thread holds one for
//! the length of its job, and a thread that finds none free sleeps until one is
//! released, so a 64-core trn2 instance runs on a 2-CPU host without oversubscribing
//! it. Each core still executes one thing at a time (the runtime serialises per core);
//! the slots only bound how many cores compute at once. A job that panics is reported
//! to its caller as a failure and its slot is released.
//!
//! A job may also borrow slots that are idle at that moment for data-parallel work (the
//! halves of a large matrix product): [`HostPool::lend`] takes them without waiting, and
//! the work runs on the job's thread plus one helper thread per lent slot. While they are
//! lent, other jobs wait for them as for any held slot, so the host CPUs in use never
//! exceed the slots.

mod helpers;

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

use helpers::{Helpers, Panic};

#[derive(Debug)]
pub(crate) struct HostPool {
    slots: usize,
    /// Slots free now; below zero while jobs that came back from waiting on other jobs
    /// run over the bound (see [`HostPool::released`]).
    free: Mutex<isize>,
    /// `free` as last set, for helpers deciding whether to linger (read without the lock).
    free_now: Arc<AtomicIsize>,
    released: Condvar,
    /// Threads that run the parts of lent-slot work beyond the first; built on first use.
    helpers: OnceLock<Option<Helpers>>,
}

/// A job that panicked instead of returning.
#[derive(Debug)]
pub(crate) struct JobPanicked(pub String);

/// A held slot, released when dropped (also when the job panics).
struct Slot<'p>(&'p HostPool);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.give_back(1);
    }
}

/// Idle slots lent to a running job, given back when dropped.
#[derive(Debug)]
pub(crate) struct Lent<'p> {
    pool: &'p HostPool,
    count: usize,
}

impl Lent<'_> {
    /// Threads the work may use: the job's own plus one per lent slot.
    pub(crate) fn threads(&self) -> usize {
        1 + self.count
    }

    /// Runs every part, on the calling thread and on helper threads, and returns when
    /// all have finished. At most [`Lent::threads`] parts run at once. Parts are taken
    /// in order, each by whichever thread is free first, so that a helper that starts
    /// late takes fewer. A part's panic is raised here once every part has finished.
    pub(crate) fn run<P: Send>(&self, parts: Vec<P>, work: impl Fn(P) + Sync) {
        let helpers = match (self.count, self.pool.helpers()) {
            (1.., Some(helpers)) if parts.len() > 1 => helpers,
            _ => return parts.into_iter().for_each(work),
        };
        let seats = self.count.min(parts.len() - 1);
        let parts: Vec<Mutex<Option<P>>> = parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
        let next = AtomicUsize::new(0);
        let panicked: Mutex<Option<Panic>> = Mutex::new(None);
        let task = || {
            while let Some(part) = parts.get(next.fetch_add(1, Ordering::Relaxed)) {
                let Some(part) = part.lock().unwrap_or_else(PoisonError::into_inner).take() else { continue };
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| work(part))) {
                    panicked.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(panic);
                }
            }
        };
        helpers.share(seats, &task);
        if let Some(panic) = panicked.into_inner().unwrap_or_else(PoisonError::into_inner) {
            resume_unwind(panic);
        }
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if self.count > 0 {
            self.pool.give_back(self.count);
        }
    }
}

impl HostPool {
    /// A pool of `slots` compute slots (at least one).
    pub(crate) fn new(slots: usize) -> HostPool {
        let slots = slots.max(1);
        HostPool {
            slots,
            free: Mutex::new(slots as isize),
            free_now: Arc::new(AtomicIsize::new(slots as isize)),
            released: Condvar::new(),
            helpers: OnceLock::new(),
        }
    }

    /// Takes up to `max` slots that are idle now, without waiting for any.
    pub(crate) fn lend(&self, max: usize) -> Lent<'_> {
        if max == 0 || self.slots == 1 {
            return Lent { pool: self, count: 0 };
        }
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        let count = max.min((*free).max(0) as usize);
        *free -= count as isize;
        self.free_now.store(*free, Ordering::Relaxed);
        Lent { pool: self, count }
    }

    fn give_back(&self, count: usize) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        *free += count as isize;
        self.free_now.store(*free, Ordering::Relaxed);
        drop(free);
        for _ in 0..count {
            self.released.notify_one();
        }
    }

    /// The helper threads (one fewer than the slots: the job's own thread does a part).
    fn helpers(&self) -> Option<&Helpers> {
        self.helpers
            .get_or_init(|| {
                Helpers::new(self.slots - 1, Arc::clone(&self.free_now))
                    .map_err(|e| tracing::warn!("no helper threads for large matrix products: {e}"))
                    .ok()
            })
            .as_ref()
    }

    pub(crate) fn threads(&self) -> usize {
        self.slots
    }

    /// Runs `f` on the calling thread once a slot is free, and returns its result.
    pub(crate) fn run<R>(&self, f: impl FnOnce() -> R) -> Result<R, JobPanicked> {
        let _slot = self.acquire();
        catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            JobPanicked(message)
        })
    }

    fn acquire(&self) -> Slot<'_> {
        self.take_one();
        Slot(self)
    }

    fn take_one(&self) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free <= 0 {
            free = self.released.wait(free).unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        self.free_now.store(*free, Ordering::Relaxed);
    }

    /// Runs `f`, for a job that waits on other jobs (a collective waiting for its other
    /// ranks), with the job's slot given back, and takes its slot back when `f` returns
    /// (or panics) without waiting: the job still holds its core and tensors, and jobs
    /// that took the slot meanwhile may be waiting for those, so the pool runs one over
    /// its bound until a job finishes. `f` itself runs outside the bound too (the
    /// collective's data movement, which every rank must do at once).
    pub(crate) fn released<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Retake<'p>(&'p HostPool);
        impl Drop for Retake<'_> {
            fn drop(&mut self) {
                let mut free = self.0.free.lock().unwrap_or_else(PoisonError::into_inner);
                *free -= 1;
                self.0.free_now.store(*free, Ordering::Relaxed);
            }
        }
        self.give_back(1);
        let _retake = Retake(self);
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn runs_jobs_and_survives_panics() {
        let pool = HostPool::new(2);
        assert_eq!(pool.run(|| 6 * 7).expect("ran"), 42);
        let err = pool.run(|| -> u32 { panic!("boom") }).expect_err("panicked");
        assert!(err.0.contains("boom"));
        assert_eq!(pool.run(|| 1).expect("still works"), 1);
        assert_eq!(*pool.free.lock().expect("lock"), 2, "the panicking job released its slot");
    }

    #[test]
    fn lent_slots_run_parts_in_parallel_and_come_back() {
        let pool = HostPool::new(3);
        let held = pool.acquire();
        let lent = pool.lend(8);
        assert_eq!(lent.threads(), 3, "the two idle slots are lent, the held one is not");
        assert_eq!(*pool.free.lock().expect("lock"), 0);
        let (running, most, done) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
        lent.run((0..9).collect(), |part: usize| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(2));
            running.fetch_sub(1, Ordering::SeqCst);
            done.fetch_add(part, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 36, "every part ran once");
        assert!(most.load(Ordering::SeqCst) <= 3);
        drop(lent);
        assert_eq!(*pool.free.lock().expect("lock"), 2);
        assert_eq!(pool.lend(8).threads(), 3);
        drop(held);
        assert_eq!(*pool.free.lock().expect("lock"), 3);
    }

    #[test]
    fn a_waiting_job_lets_another_run_in_its_slot() {
        let pool = HostPool::new(1);
        let (ready, wait) = crossbeam_channel::bounded::<()>(0);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| pool.run(|| pool.released(|| wait.recv().is_ok())).expect("ran"));
            // With the only slot held by the waiter, this job can run only if the slot
            // was given back while it waits.
            while !waiter.is_finished() {
                if pool.run(|| ready.try_send(()).is_ok()).expect("ran") {
                    break;
                }
                std::thread::yield_now();
            }
            assert!(waiter.join().expect("joins"));
        });
        assert_eq!(*pool.free.lock().expect("lock"), 1, "the slot was taken back and released once");
    }

    #[test]
    fn a_part_that_panics_fails_the_run_once_every_part_has_run_and_the_helpers_go_on() {
        let pool = HostPool::new(3);
        let done = AtomicUsize::new(0);
        let run = catch_unwind(AssertUnwindSafe(|| {
            pool.lend(2).run((0..12).collect(), |part: usize| {
                std::thread::sleep(std::time::Duration::from_millis(1));
                assert_ne!(part, 5, "part 5 fails");
                done.fetch_add(1, Ordering::SeqCst);
            })
        }));
        let panic = run.expect_err("the failed part's panic is raised");
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("part 5 fails"), "{message}");
        assert_eq!(done.load(Ordering::SeqCst), 11, "every other part ran");
        assert_eq!(*pool.free.lock().expect("lock"), 3, "the lent slots came back");
        let lent = pool.lend(2);
        assert_eq!(lent.threads(), 3);
        let sum = AtomicUsize::new(0);
        lent.run((1..=20).collect(), |p: usize| {
            sum.fetch_add(p, Ordering::SeqCst);
        });
        assert_eq!(sum.load(Ordering::SeqCst), 210, "the helpers still take parts");
    }

    #[test]
    fn jobs_on_several_threads_share_the_helpers_at_once() {
        let pool = HostPool::new(4);
        std::thread::scope(|scope| {
            let jobs: Vec<_> = (0..3usize)
                .map(|job| {
                    let pool = &pool;
                    scope.spawn(move || {
                        pool.run(|| {
                            let mut total = 0;
                            for round in 0..50usize {
                                let sum = AtomicUsize::new(0);
                                let lent = pool.lend(1);
                                lent.run((0..8usize).collect(), |p| {
                                    sum.fetch_add(p + round + job, Ordering::SeqCst);
                                });
                                total += sum.load(Ordering::SeqCst);
                            }
                            total
                        })
                        .expect("ran")
                    })
                })
                .collect();
            for (job, handle) in jobs.into_iter().enumerate() {
                // Each round adds 0 + 1 + … + 7 and eight times the round and the job.
                let expected: usize = (0..50).map(|round| 28 + 8 * (round + job)).sum();
                assert_eq!(handle.join().expect("joins"), expected, "job {job}: every part ran once");
            }
        });
        assert_eq!(*pool.free.lock().expect("lock"), 4);
    }

    #[test]
    fn nothing_is_lent_when_no_slot_is_idle() {
        let pool = HostPool::new(1);
        let lent = pool.lend(4);
        assert_eq!(lent.threads(), 1);
        let sum = AtomicUsize::new(0);
        lent.run(vec![1, 2, 3], |p| {
            sum.fetch_add(p, Ordering::SeqCst);
        });
        assert_eq!(sum.load(Ordering::SeqCst), 6);
    }

    #[test]
    fn no_more_jobs_run_at_once_than_there_are_slots() {
        let pool = HostPool::new(2);
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|scope| {
            for _ in 0..6 {
                scope.spawn(|| {
                    for _ in 0..20 {
                        pool.run(|| {
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_micros(200));
                            running.fetch_sub(1, Ordering::SeqCst);
                        })
                        .expect("ran");
                    }
                });
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }
}
