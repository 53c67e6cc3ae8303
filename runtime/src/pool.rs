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

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Condvar, Mutex, PoisonError};

#[derive(Debug)]
pub(crate) struct HostPool {
    slots: usize,
    free: Mutex<usize>,
    released: Condvar,
}

/// A job that panicked instead of returning.
#[derive(Debug)]
pub(crate) struct JobPanicked(pub String);

/// A held slot, released when dropped (also when the job panics).
struct Slot<'p>(&'p HostPool);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.0.released.notify_one();
    }
}

impl HostPool {
    /// A pool of `slots` compute slots (at least one).
    pub(crate) fn new(slots: usize) -> HostPool {
        let slots = slots.max(1);
        HostPool { slots, free: Mutex::new(slots), released: Condvar::new() }
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
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            free = self.released.wait(free).unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        Slot(self)
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
