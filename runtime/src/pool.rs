//! The bounded pool of host threads that virtual NeuronCores execute on.
//!
//! Virtual cores own no threads: work for any core is queued here and taken by one of
//! a fixed number of workers, so a 64-core trn2 instance runs on a 2-CPU host. Each
//! core still executes one thing at a time (the runtime serialises per core); the pool
//! only bounds how many cores compute at once. A job that panics is reported to its
//! caller as a failure and the worker carries on.
//!
//! Both sides of a hand-off spin briefly before they sleep: waking a sleeping thread
//! costs tens of microseconds on an idle (virtual) CPU, which would dwarf the runtime's
//! own per-execution cost for small models.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvError, Sender, TryRecvError};

/// How long a worker waiting for work, or a caller waiting for a result, spins before
/// it sleeps.
pub(crate) const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(100);

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Debug)]
pub(crate) struct HostPool {
    jobs: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

/// A job that panicked instead of returning.
#[derive(Debug)]
pub(crate) struct JobPanicked(pub String);

impl HostPool {
    pub(crate) fn new(threads: usize) -> std::io::Result<HostPool> {
        let (sender, receiver): (Sender<Job>, Receiver<Job>) = crossbeam_channel::unbounded();
        let workers = (0..threads.max(1))
            .map(|i| {
                let receiver = receiver.clone();
                std::thread::Builder::new().name(format!("neuron-core-worker-{i}")).spawn(move || {
                    while let Ok(job) = receive(&receiver) {
                        job();
                    }
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(HostPool { jobs: Some(sender), workers })
    }

    pub(crate) fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Runs `f` on a worker and waits for its result.
    pub(crate) fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> Result<R, JobPanicked> {
        let (reply, result) = crossbeam_channel::bounded(1);
        let job: Job = Box::new(move || {
            let outcome = catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                JobPanicked(message)
            });
            let _ = reply.send(outcome);
        });
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(job));
        match sent {
            Some(Ok(())) => {
                receive(&result).unwrap_or_else(|_| Err(JobPanicked("worker exited before replying".into())))
            }
            _ => Err(JobPanicked("the host thread pool is shut down".into())),
        }
    }
}

/// Receives a message, spinning for up to [`SPIN_BEFORE_SLEEP`] before blocking.
fn receive<T>(receiver: &Receiver<T>) -> Result<T, RecvError> {
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        match receiver.try_recv() {
            Ok(message) => return Ok(message),
            Err(TryRecvError::Disconnected) => return Err(RecvError),
            Err(TryRecvError::Empty) => {}
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(64) && start.elapsed() >= SPIN_BEFORE_SLEEP {
            return receiver.recv();
        }
        std::hint::spin_loop();
    }
}

impl Drop for HostPool {
    fn drop(&mut self) {
        self.jobs.take();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_jobs_and_survives_panics() {
        let pool = HostPool::new(2).expect("threads");
        assert_eq!(pool.run(|| 6 * 7).expect("ran"), 42);
        let err = pool.run(|| -> u32 { panic!("boom") }).expect_err("panicked");
        assert!(err.0.contains("boom"));
        assert_eq!(pool.run(|| 1).expect("still works"), 1);
    }
}
