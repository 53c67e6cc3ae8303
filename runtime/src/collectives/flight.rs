//! What the collectives write into the process's flight record (the datastore's
//! `flight.rs`): each communicator's slot, where its ranks run, each rank's progress
//! (given a unit, reached a collective, left it), its history with every arrival on
//! the job's one clock, and a long wait while it lasts.
//!
//! A rank records itself. The arrivals of ranks of other processes come with the
//! collectives' messages (`Stamp::arrivals`); of the ranks of this process in a group,
//! the lowest records them, so each is written once.
//!
//! Each arrival also says what the rank did since its previous collective: how long
//! since it left it, and how much of that it spent inside its executions (the rest is
//! the program's host time: between executions, runtime calls, inputs). Its [`Pace`]
//! keeps the count from boundaries alone (an execution's start and end, a collective's
//! arrival and departure), nothing per instruction.

use std::time::Instant;

use super::world::{Arrival, Roster};
use super::{Communicator, OpPosition, RankPlace};
use neuron_datastore::flight::{Before, CollectiveEntry, CommSlot, CommunicatorEntry, Position, Progress, RankMember};
use neuron_datastore::{CollectiveAlgorithm, CollectiveOp, Tracer};

/// With the `trace-probe` feature, the time this process spends in the record's work
/// (the methods below, timed where the collectives call them), for
/// `benches/flight.rs`; without it, nothing.
#[cfg(feature = "trace-probe")]
pub mod cost {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    static NS: AtomicU64 = AtomicU64::new(0);
    static SPANS: AtomicU64 = AtomicU64::new(0);

    /// One method's work, timed until dropped.
    pub(crate) struct Span(Instant);

    impl Span {
        pub(crate) fn start() -> Span {
            Span(Instant::now())
        }
    }

    impl Drop for Span {
        fn drop(&mut self) {
            NS.fetch_add(self.0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            SPANS.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The nanoseconds spent in the record's work and the spans timed since the last
    /// call, which starts both again from zero.
    pub fn take() -> (u64, u64) {
        (NS.swap(0, Ordering::Relaxed), SPANS.swap(0, Ordering::Relaxed))
    }

    /// What a span with nothing in it measures (ns, the mean of many): the timing's own
    /// share of each span, to take off. Leaves the counts at zero.
    pub fn empty_span_ns() -> f64 {
        const N: u64 = 200_000;
        take();
        for _ in 0..N {
            drop(std::hint::black_box(Span::start()));
        }
        take().0 as f64 / N as f64
    }
}

#[cfg(not(feature = "trace-probe"))]
mod cost {
    pub(super) struct Span;

    impl Span {
        #[inline(always)]
        pub(super) fn start() -> Span {
            Span
        }
    }
}

/// The host's name, as tools show it.
fn host_name() -> String {
    nix::unistd::gethostname().map_or_else(|_| "?".into(), |h| h.to_string_lossy().into_owned())
}

/// A communicator's slot, taken at creation (`None`: every slot is taken, and the
/// communicator runs unrecorded).
pub(super) fn open(tracer: &Tracer, (name, id): (&str, u32), ranks: usize, across: bool) -> Option<CommSlot> {
    let entry = CommunicatorEntry { id, name: name.to_owned(), ranks: ranks as u32, across };
    tracer.store().open_communicator(&entry)
}

/// A rank's time between its collectives, counted at the boundaries.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    /// When it left its previous collective (root clock ns).
    departed_ns: Option<u64>,
    /// Inside an execution now, and since when it has counted executing time.
    executing: bool,
    counting_from: Option<u64>,
    /// Executing time since it left its previous collective, ns.
    executing_ns: u64,
    /// Each engine's busy time since then, ns (`Engine` order).
    engines_ns: [u64; ENGINES],
}

pub(crate) const ENGINES: usize = neuron_datastore::Engine::ALL.len();

impl Pace {
    fn execution(&mut self, running: bool, now_ns: u64) {
        if let Some(from) = self.counting_from.take() {
            self.executing_ns += now_ns.saturating_sub(from);
        }
        self.executing = running;
        self.counting_from = running.then_some(now_ns);
    }

    /// At its arrival: what it did since its previous collective.
    fn arrive(&mut self, now_ns: u64) -> Option<Before> {
        if let Some(from) = self.counting_from.take() {
            self.executing_ns += now_ns.saturating_sub(from);
        }
        let executing = std::mem::take(&mut self.executing_ns);
        let engines = std::mem::take(&mut self.engines_ns);
        let since = now_ns.saturating_sub(self.departed_ns?);
        let busiest = (0..ENGINES)
            .max_by_key(|&e| engines[e])
            .filter(|&e| engines[e] > 0)
            .and_then(|e| Some((neuron_datastore::Engine::from_repr(e as u8)?, engines[e])));
        Some(Before { since_ns: since, executing_ns: executing.min(since), busiest })
    }

    fn depart(&mut self, now_ns: u64) {
        self.departed_ns = Some(now_ns);
        self.executing_ns = 0;
        self.engines_ns = [0; ENGINES];
        self.counting_from = self.executing.then_some(now_ns);
    }
}

/// What a collective of a rank was, for its history.
pub(super) struct Done {
    pub(super) operation: CollectiveOp,
    pub(super) algorithm: CollectiveAlgorithm,
    pub(super) group: usize,
    pub(super) bytes: u64,
    pub(super) arrived: Arrival,
}

fn position(at: OpPosition) -> Position {
    Position { sequence: at.unit as u32, index: at.index.min(u32::from(u16::MAX)) as u16 }
}

impl Communicator {
    /// Records where rank `rank` of this process runs.
    pub(super) fn record_member(&self, rank: u32, place: &RankPlace) {
        if let Some(slot) = self.inner.record {
            let member = RankMember {
                pid: std::process::id(),
                host: host_name(),
                core: Some(place.core),
                in_this_process: true,
            };
            self.inner.tracer.store().set_rank_member(slot, rank, &member);
        }
    }

    /// Records where the ranks of other processes run, once the roster says.
    pub(super) fn record_roster(&self, roster: &Roster) {
        let Some(slot) = self.inner.record else { return };
        self.inner.roster_recorded.get_or_init(|| {
            for (rank, &process) in roster.rank_process.iter().enumerate() {
                let Some(peer) = roster.peers.get(process as usize).and_then(Option::as_ref) else { continue };
                if process != roster.process {
                    let member =
                        RankMember { pid: peer.pid, host: peer.host.clone(), core: None, in_this_process: false };
                    self.inner.tracer.store().set_rank_member(slot, rank as u32, &member);
                }
            }
        });
    }

    /// Records that the process of the ranks `ranks` is gone.
    pub(super) fn record_gone(&self, ranks: impl IntoIterator<Item = u32>) {
        if let Some(slot) = self.inner.record {
            ranks.into_iter().for_each(|rank| self.inner.tracer.store().set_rank_gone(slot, rank));
        }
    }

    /// Records what the process of the ranks `ranks` (another process) said it was
    /// doing.
    pub(super) fn record_said(&self, ranks: impl IntoIterator<Item = u32>, heard: &neuron_datastore::flight::Heard) {
        if let Some(slot) = self.inner.record {
            ranks.into_iter().for_each(|rank| self.inner.tracer.store().set_rank_heard(slot, rank, heard));
        }
    }

    /// Now on the job's one clock (the root's), and the most that may be off by.
    pub(super) fn root_now(&self) -> (u64, u64) {
        match &self.inner.membership {
            Some(membership) => membership.world.root_now(),
            None => (neuron_datastore::clock::monotonic_ns(), 0),
        }
    }

    /// Records that rank `rank` was given unit `unit`.
    pub(super) fn record_enqueued(&self, rank: u32, unit: u64) {
        let _cost = cost::Span::start();
        if let Some(slot) = self.inner.record {
            let at = Position { sequence: unit as u32, index: 0 };
            self.inner.tracer.store().record_progress(slot, rank, Progress::Enqueued, at);
        }
    }

    /// Records that rank `rank` reached a collective of `operation` at `at`, now.
    pub(super) fn record_started(&self, rank: u32, at: OpPosition, operation: CollectiveOp) -> Arrival {
        let _cost = cost::Span::start();
        let (at_ns, uncertainty_ns) = self.root_now();
        let before = self.pace(rank, |pace| pace.arrive(at_ns)).flatten();
        if let Some(slot) = self.inner.record {
            self.inner.tracer.store().record_progress(slot, rank, Progress::Started(operation), position(at));
        }
        Arrival { rank, at_ns, uncertainty_ns, before }
    }

    /// Adds each engine's busy time (ns, `Engine` order) of rank `rank`'s instructions
    /// since the last call.
    pub(crate) fn engines_busy(&self, rank: u32, engines_ns: &[u64; ENGINES]) {
        let _cost = cost::Span::start();
        self.pace(rank, |pace| pace.engines_ns.iter_mut().zip(engines_ns).for_each(|(total, ns)| *total += ns));
    }

    /// Says that rank `rank` of this process begins (`true`) or ends an execution.
    pub(crate) fn executing(&self, rank: u32, running: bool) {
        let _cost = cost::Span::start();
        let (now_ns, _) = self.root_now();
        self.pace(rank, |pace| pace.execution(running, now_ns));
    }

    fn pace<T>(&self, rank: u32, f: impl FnOnce(&mut Pace) -> T) -> Option<T> {
        let pace = self.inner.paces.get(rank as usize)?;
        Some(f(&mut pace.lock().unwrap_or_else(|e| e.into_inner())))
    }

    /// Records that a rank of another process reached the collective at `at` (its
    /// message says so).
    pub(super) fn record_arrived(&self, arrival: Arrival, at: OpPosition, operation: super::Collective) {
        let _cost = cost::Span::start();
        if let Some(slot) = self.inner.record {
            let started = Progress::Started(operation.kind());
            self.inner.tracer.store().record_progress(slot, arrival.rank, started, position(at));
        }
    }

    /// Records that rank `rank` has waited since `since` for rank `peer`.
    pub(super) fn record_waiting(&self, rank: u32, since: Instant, peer: u32) {
        if let Some(slot) = self.inner.record {
            let (now, _) = self.root_now();
            let since = now.saturating_sub(since.elapsed().as_nanos() as u64);
            self.inner.tracer.store().set_waiting(slot, rank, Some((since, peer)));
        }
    }

    /// Records rank `rank`'s collective at `at`, and what it learnt of the arrivals of
    /// `others` (ranks of other processes); moves its completed word when it `succeeded`.
    pub(super) fn record_done(&self, rank: u32, at: OpPosition, done: &Done, others: &[Arrival], succeeded: bool) {
        let _cost = cost::Span::start();
        let (departed, _) = self.root_now();
        self.pace(rank, |pace| pace.depart(departed));
        let Some(slot) = self.inner.record else { return };
        let store = self.inner.tracer.store();
        store.set_waiting(slot, rank, None);
        let entry = |arrival: &Arrival, departed_ns: Option<u64>| CollectiveEntry {
            position: position(at),
            operation: done.operation,
            algorithm: done.algorithm,
            group: done.group.min(usize::from(u16::MAX)) as u16,
            bytes: done.bytes,
            arrived_ns: arrival.at_ns,
            departed_ns,
            before: arrival.before,
        };
        if succeeded {
            store.record_collective(slot, rank, &entry(&done.arrived, Some(departed)));
            store.record_progress(slot, rank, Progress::Completed, position(at));
        }
        for other in others.iter().filter(|a| a.rank != rank) {
            store.record_collective(slot, other.rank, &entry(other, None));
            store.set_rank_uncertainty(slot, other.rank, other.uncertainty_ns);
        }
    }
}
