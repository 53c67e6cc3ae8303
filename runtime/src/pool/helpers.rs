//! The helper threads that run the parts of lent-slot work beyond the caller's own.
//!
//! A helper that has just run a part keeps looking for the next offer for a while
//! ([`LINGER`]) before it sleeps, as long as a slot of the pool is free for it to run
//! in. Waking a sleeping thread costs tens of microseconds on a virtual machine (30 µs
//! on average, measured, against 170 µs for the half of a 256×256×256 product), and
//! the large products of one execution come a few hundred microseconds apart; parts
//! are taken from a shared counter, so that a helper that comes late takes fewer.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a helper keeps looking for work after its last part, while a slot is free.
const LINGER: Duration = Duration::from_micros(300);

/// Threads that take the parts of offered work.
#[derive(Debug)]
pub(super) struct Helpers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    /// The offers standing, oldest first (jobs on several cores may share at once).
    offers: Mutex<Vec<Offer>>,
    offered: Condvar,
    /// Counts offers (and names each), so that a lingering helper sees a new one
    /// without the lock.
    generation: AtomicU64,
    /// Helpers asleep on `offered`.
    sleeping: AtomicUsize,
    stop: AtomicBool,
}

/// Work on offer: a task each helper that joins runs once, and the count of helpers
/// inside it.
#[derive(Debug, Clone, Copy)]
struct Offer {
    id: u64,
    /// The caller's task, with its lifetime erased. It stays valid while the offer
    /// stands and until every helper that joined has left: [`Helpers::share`] withdraws
    /// the offer and waits for `inside` to fall to zero before it returns.
    task: *const (dyn Fn() + Sync),
    inside: *const AtomicUsize,
    /// How many more helpers may join.
    seats: usize,
}

// SAFETY: an offer's pointers are dereferenced only by a helper that joined it while it
// stood, and their targets outlive every such helper's use (see `Offer::task`).
unsafe impl Send for Offer {}

impl Helpers {
    /// `count` helper threads; `free` is the pool's count of free slots, which a helper
    /// looks at to decide whether to linger.
    pub(super) fn new(count: usize, free: Arc<AtomicIsize>) -> std::io::Result<Helpers> {
        let shared = Arc::new(Shared {
            offers: Mutex::new(Vec::new()),
            offered: Condvar::new(),
            generation: AtomicU64::new(0),
            sleeping: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let mut threads = Vec::with_capacity(count);
        for i in 0..count {
            let (ours, free) = (Arc::clone(&shared), Arc::clone(&free));
            let thread =
                std::thread::Builder::new().name(format!("neuron-helper-{i}")).spawn(move || serve(&ours, &free));
            match thread {
                Ok(thread) => threads.push(thread),
                Err(error) => {
                    // The ones started stop with the others (`Drop`).
                    drop(Helpers { shared, threads });
                    return Err(error);
                }
            }
        }
        Ok(Helpers { shared, threads })
    }

    /// Runs `task` on the calling thread and on up to `seats` helpers at once, and
    /// returns when every run of it has returned. A panic in the caller's run is raised
    /// here once all have returned; a helper's run must hand its panics over itself
    /// (`Lent::run`'s task catches each part's), as a helper only survives them.
    pub(super) fn share(&self, seats: usize, task: &(dyn Fn() + Sync)) {
        let inside = AtomicUsize::new(0);
        // SAFETY: only the lifetime is erased; the offer is withdrawn and `inside` seen
        // at zero below, on every path out of this function, before `task` and
        // `inside` go out of scope.
        let erased: *const (dyn Fn() + Sync + 'static) = unsafe { std::mem::transmute(task) };
        let id = {
            let mut offers = self.shared.offers.lock().unwrap_or_else(PoisonError::into_inner);
            let id = self.shared.generation.fetch_add(1, Ordering::AcqRel) + 1;
            offers.push(Offer { id, task: erased, inside: &inside, seats });
            id
        };
        if self.shared.sleeping.load(Ordering::Acquire) > 0 {
            self.shared.offered.notify_all();
        }
        let ours = catch_unwind(AssertUnwindSafe(task));
        self.shared.offers.lock().unwrap_or_else(PoisonError::into_inner).retain(|o| o.id != id);
        let mut spins = 0u32;
        while inside.load(Ordering::Acquire) > 0 {
            spins += 1;
            if spins < 1 << 10 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Err(panic) = ours {
            resume_unwind(panic);
        }
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            // Under the lock, so that no helper is between its check and its sleep.
            let _offers = self.shared.offers.lock().unwrap_or_else(PoisonError::into_inner);
            self.shared.offered.notify_all();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A helper's life: join each offer it finds (lingering for the next while a slot is
/// free, sleeping otherwise) until the helpers are dropped.
fn serve(shared: &Shared, free: &AtomicIsize) {
    // From the first offer on: the one that had the helpers started may stand already.
    let mut seen = 0;
    let mut last_work = Instant::now();
    // Right after a part, another offer may stand already: look before waiting.
    let mut look = false;
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let generation = shared.generation.load(Ordering::Acquire);
        if generation == seen && !look {
            if free.load(Ordering::Relaxed) > 0 && last_work.elapsed() < LINGER {
                std::hint::spin_loop();
                continue;
            }
            let mut offers = shared.offers.lock().unwrap_or_else(PoisonError::into_inner);
            shared.sleeping.fetch_add(1, Ordering::AcqRel);
            while shared.generation.load(Ordering::Acquire) == seen && !shared.stop.load(Ordering::Acquire) {
                offers = shared.offered.wait(offers).unwrap_or_else(PoisonError::into_inner);
            }
            shared.sleeping.fetch_sub(1, Ordering::AcqRel);
            continue;
        }
        (seen, look) = (generation, false);
        let joined = {
            let mut offers = shared.offers.lock().unwrap_or_else(PoisonError::into_inner);
            match offers.iter_mut().find(|o| o.seats > 0) {
                Some(o) => {
                    o.seats -= 1;
                    // SAFETY: the offer stands (we hold its lock), so `inside` is alive.
                    unsafe { &*o.inside }.fetch_add(1, Ordering::AcqRel);
                    Some(*o)
                }
                None => None,
            }
        };
        if let Some(offer) = joined {
            /// Leaves the offer however the task ends.
            struct Leave(*const AtomicUsize);
            impl Drop for Leave {
                fn drop(&mut self) {
                    // SAFETY: the caller waits for this count to fall to zero before
                    // `inside` goes out of scope.
                    unsafe { &*self.0 }.fetch_sub(1, Ordering::AcqRel);
                }
            }
            let _leave = Leave(offer.inside);
            // SAFETY: we joined while the offer stood; the caller keeps the task alive
            // until `inside` falls to zero, which `_leave` does after the task returns.
            // A panic in the task is the caller's to see: tasks catch their parts'
            // panics and hand them over (see `Lent::run`); this only keeps the thread.
            let _ = catch_unwind(AssertUnwindSafe(|| unsafe { (*offer.task)() }));
            (last_work, look) = (Instant::now(), true);
        }
    }
}

/// A panic raised by one part, kept to raise on the caller's thread.
pub(super) type Panic = Box<dyn Any + Send>;
