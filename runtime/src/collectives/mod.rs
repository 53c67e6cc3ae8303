//! Collectives across the NeuronCores of a process.
//!
//! A [`Communicator`] joins N ranks, each on its own core. Ranks meet per operation:
//! the n-th collective a rank enters meets the n-th collective of the other ranks of its
//! replica group. Each rank deposits its data, waits until every rank of its group has
//! arrived (or the execution timeout passes), then moves data with one of two
//! algorithms:
//!
//! - **all-to-all**: each rank reads every other rank's data directly and combines it
//!   in rank order: one step, `n − 1` times the data read per rank;
//! - **ring**: ranks pass parts of the data to their successor around the group: a
//!   reduce-scatter phase and an all-gather phase of `n − 1` steps each, every step
//!   moving `1/n` of the data, so each rank moves about twice the data whatever `n`.
//!
//! The default is the ring from three ranks when a rank's message times the other ranks
//! reaches [`RING_MIN_TRAFFIC`] (what all-to-all makes each rank read), and all-to-all
//! otherwise: on host CPUs the ring's `2(n − 1)` hand-offs cost more than they save
//! until all-to-all's reads dominate (`cargo bench -p neuron-runtime --bench
//! collectives` measures both; BENCHMARKS.md has the figures). Either way every rank
//! ends with the same bits: in the ring each part is reduced by one rank and then
//! copied to the others.
//!
//! A rank that never arrives makes every waiting rank fail at the deadline with
//! `NRT_EXEC_HW_ERR_COLLECTIVES`. The communicator then starts the next operation of
//! every rank afresh, so the ranks meet again on their next call; a rank that was
//! still inside the abandoned operation fails at once.
//!
//! While a rank waits for the others, its execution gives its host compute slot back
//! (see `HostPool::released`): with more ranks than host CPUs, the ranks still running
//! need the slots to reach the meeting.
//!
//! The API types and the communicator are here; the meeting protocol (units,
//! meetings, failures) is in `meeting.rs` and the data-moving algorithms in
//! `algorithms.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::dtype::DType;
use crate::error::{NrtError, NrtResult};
use crate::isa::{CollectiveKind, ReduceOp};
use crate::lifecycle::Lifecycle;
use crate::shared_memory::SharedPlace;
use crate::tensor::Tensor;
use neuron_datastore::topology::Topology;
use neuron_datastore::{EventIds, RingPos, Tracer};

mod algorithms;
pub(crate) mod buffers;
pub(crate) mod flight;
mod meeting;
mod remote;
mod streaming;
pub(crate) mod world;

/// The flight record's own cost, timed on its path (`trace-probe`, for the benchmarks).
#[cfg(feature = "trace-probe")]
pub use flight::cost as flight_record_cost;
use meeting::State;
pub(crate) use meeting::check_groups;
pub use meeting::report_after;
pub(crate) use remote::Membership;
pub(crate) use world::Message;

/// From this many bytes of other ranks' data per rank (message × (ranks − 1)), the
/// default algorithm is the ring (with more than two ranks).
pub const RING_MIN_TRAFFIC: u64 = 16 << 20;

/// How the data of a collective moves between ranks (its name and event code are
/// the datastore's).
pub use neuron_datastore::CollectiveAlgorithm as Algorithm;

/// The default algorithm for `bytes` per rank in a group of `ranks` (an all-reduce
/// whose ranks are processes of one host is all-to-all at every size: see
/// `Communicator::exchange`).
pub fn choose_algorithm(bytes: u64, ranks: usize) -> Algorithm {
    if ranks > 2 && bytes.saturating_mul(ranks as u64 - 1) >= RING_MIN_TRAFFIC {
        Algorithm::Ring
    } else {
        Algorithm::AllToAll
    }
}

/// A collective operation called through the API (on whole tensors, along their
/// first dimension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// Every rank's output is the element-wise reduction of all inputs.
    AllReduce(ReduceOp),
    /// Every rank's output is the inputs concatenated in group order (`n` times as long).
    AllGather,
    /// The reduction of all inputs, split in `n` parts: rank `i` of a group gets part `i`.
    ReduceScatter(ReduceOp),
    /// Each input is split in `n` parts; part `j` of rank `i` becomes part `i` of rank `j`.
    AllToAll,
    /// Returns once every rank of the group has called it.
    Barrier,
    /// Queues the input for rank `peer` and returns; the peer's `Recv` takes it.
    Send { peer: u32 },
    /// Waits for the oldest input rank `peer` sent to this rank and writes it out.
    Recv { peer: u32 },
}

impl Collective {
    /// `all-reduce`, `all-gather`, …, as `cc_running` events name it.
    pub fn name(self) -> &'static str {
        self.kind().name()
    }

    /// The operation as events record it.
    fn kind(self) -> neuron_datastore::CollectiveOp {
        use neuron_datastore::CollectiveOp as Op;
        match self {
            Collective::AllReduce(_) => Op::AllReduce,
            Collective::AllGather => Op::AllGather,
            Collective::ReduceScatter(_) => Op::ReduceScatter,
            Collective::AllToAll => Op::AllToAll,
            Collective::Barrier => Op::Barrier,
            Collective::Send { .. } => Op::Send,
            Collective::Recv { .. } => Op::Recv,
        }
    }
}

/// One call of [`Communicator::run`]: the operation, the element type, the replica
/// groups (empty: one group of every rank) and the algorithm (`None`: by size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveCall {
    pub op: Collective,
    pub dtype: DType,
    pub groups: Vec<Vec<u32>>,
    pub algorithm: Option<Algorithm>,
}

impl CollectiveCall {
    pub fn new(op: Collective, dtype: DType) -> CollectiveCall {
        CollectiveCall { op, dtype, groups: Vec::new(), algorithm: None }
    }

    pub fn groups(mut self, groups: Vec<Vec<u32>>) -> CollectiveCall {
        self.groups = groups;
        self
    }

    pub fn algorithm(mut self, algorithm: Algorithm) -> CollectiveCall {
        self.algorithm = Some(algorithm);
        self
    }
}

/// Where a rank runs.
#[derive(Debug, Clone, Copy)]
struct RankPlace {
    core: u32,
    device: u32,
    /// The core's index on its device.
    local: u32,
    ring: RingPos,
    slot: Option<usize>,
}

impl RankPlace {
    /// Rank `rank` of a communicator of `ranks` on `core`, recorded in the core's
    /// block of the datastore for the tools.
    fn new(core: u32, (rank, ranks): (u32, u32), topology: &Topology, tracer: &Tracer) -> RankPlace {
        let slot = tracer.store().core_slot(core);
        if let Some(slot) = slot {
            tracer.set_rank(slot, rank, ranks);
        }
        RankPlace {
            core,
            device: topology.device_of(core),
            local: core % topology.cores_per_device().max(1),
            ring: tracer.ring_of(Some(core)),
            slot,
        }
    }
}

/// Ranks on distinct cores that run collectives together. Cloning gives another handle
/// to the same communicator.
#[derive(Debug, Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The model's name for a loaded model's ranks, else `communicator N`.
    name: String,
    /// The id `cc_running` events carry: the same in every rank and every process.
    id: u32,
    /// Each rank's place once it is known: from the start for a communicator of this
    /// process, when the rank joins for one across processes (never for the ranks of
    /// other processes).
    ranks: Vec<OnceLock<RankPlace>>,
    /// For a communicator across processes: this process's part in it.
    membership: Option<Membership>,
    /// Its slot in the process's flight record (`flight.rs`), and whether the ranks
    /// of other processes are recorded in it yet.
    record: Option<neuron_datastore::flight::CommSlot>,
    roster_recorded: OnceLock<()>,
    /// Each rank's time between its collectives (`flight.rs`).
    paces: Vec<Mutex<flight::Pace>>,
    tracer: Arc<Tracer>,
    lifecycle: Arc<Lifecycle>,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(slot) = self.record {
            self.tracer.store().close_communicator(slot);
        }
    }
}

/// Where a collective is in its unit, for the missing-rank message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpPosition {
    /// The unit: one execution of a model, or one API call.
    pub(crate) unit: u64,
    /// The operation's index among the unit's collectives, and their count.
    pub(crate) index: u32,
    pub(crate) count: u32,
}

/// What one rank asks of a meeting.
pub(crate) struct Request<'a> {
    pub(crate) op: Collective,
    pub(crate) dtype: DType,
    pub(crate) groups: &'a [Vec<u32>],
    pub(crate) algorithm: Option<Algorithm>,
    /// Rows before the dimension exchanged along (1 for whole tensors).
    pub(crate) outer: usize,
    /// Shared, so that the ranks that read it take it without a copy; empty while the
    /// input is lent.
    pub(crate) input: Arc<Message>,
    /// The input where it lies, when it may be lent to the ranks of other processes of
    /// this host with the output (see `world/lending.rs`).
    pub(crate) lent: Option<LentInput<'a>>,
    pub(crate) output: &'a mut [u8],
    /// Given to have the NaN and infinities of an `f32` output counted as it is
    /// written (an execution checks its outputs): left `None` by an algorithm that does
    /// not count, set to the count by one that does.
    pub(crate) non_finite: Option<&'a std::cell::Cell<Option<u64>>>,
}

/// A rank's input tensor's bytes, held for reading for the call (`None`: the input is
/// the output, summed in place), and where its input and output tensors lie in shared
/// memory.
pub(crate) struct LentInput<'a> {
    pub(crate) bytes: Option<&'a [u8]>,
    pub(crate) input: SharedPlace,
    pub(crate) output: SharedPlace,
}

impl Request<'_> {
    pub(crate) fn input_len(&self) -> usize {
        match &self.lent {
            Some(lent) => lent.bytes.map_or(self.output.len(), <[u8]>::len),
            None => self.input.len(),
        }
    }

    /// Makes a lent input an input of its own, for an algorithm that does not lend.
    fn unlend(&mut self, communicator: &Communicator) {
        if let Some(lent) = self.lent.take() {
            let bytes = lent.bytes.unwrap_or(self.output);
            let mut message = communicator.message_for_peers(bytes.len());
            message.bytes_mut().copy_from_slice(bytes);
            self.input = Arc::new(message);
        }
    }
}

static NEXT_COMMUNICATOR: AtomicU32 = AtomicU32::new(1);

impl Communicator {
    /// Ranks `0..cores.len()` on `cores`, one per core.
    pub(crate) fn new(
        name: Option<&str>,
        cores: &[u32],
        topology: &Topology,
        tracer: Arc<Tracer>,
        lifecycle: Arc<Lifecycle>,
        timeout: Duration,
    ) -> NrtResult<Communicator> {
        if cores.is_empty() {
            return Err(NrtError::invalid("a communicator needs at least one rank"));
        }
        for (i, core) in cores.iter().enumerate() {
            if cores[..i].contains(core) {
                return Err(NrtError::invalid(format!(
                    "nc{core} appears twice in the communicator's cores; each rank needs its own core"
                )));
            }
        }
        let ranks = cores
            .iter()
            .enumerate()
            .map(|(rank, &core)| {
                OnceLock::from(RankPlace::new(core, (rank as u32, cores.len() as u32), topology, &tracer))
            })
            .collect();
        let id = NEXT_COMMUNICATOR.fetch_add(1, Ordering::Relaxed);
        let name = name.map_or_else(|| format!("communicator {id}"), str::to_owned);
        Ok(Communicator::from_parts((name, id), ranks, None, tracer, lifecycle, timeout))
    }

    /// A communicator named and numbered `name`, `id`, of `ranks`, every one at its
    /// first unit.
    fn from_parts(
        (name, id): (String, u32),
        ranks: Vec<OnceLock<RankPlace>>,
        membership: Option<Membership>,
        tracer: Arc<Tracer>,
        lifecycle: Arc<Lifecycle>,
        timeout: Duration,
    ) -> Communicator {
        let state = Mutex::new(State::new(ranks.len()));
        let paces = (0..ranks.len()).map(|_| Mutex::default()).collect();
        let record = flight::open(&tracer, (&name, id), ranks.len(), membership.is_some());
        let communicator = Communicator {
            inner: Arc::new(Inner {
                name,
                id,
                ranks,
                membership,
                record,
                roster_recorded: OnceLock::new(),
                paces,
                tracer,
                lifecycle,
                timeout,
                state,
                changed: Condvar::new(),
            }),
        };
        for (rank, place) in communicator.inner.ranks.iter().enumerate() {
            if let Some(place) = place.get() {
                communicator.record_member(rank as u32, place);
            }
        }
        communicator
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.inner.ranks.len()
    }

    /// The core rank `rank` runs on (`None` for a rank of another process).
    pub fn core(&self, rank: u32) -> Option<u32> {
        self.place(rank).map(|r| r.core)
    }

    /// Where rank `rank` runs, if in this process.
    fn place(&self, rank: u32) -> Option<&RankPlace> {
        self.inner.ranks.get(rank as usize)?.get()
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Runs `call` as rank `rank`, on `input` and `output` (whole tensors, split and
    /// joined along their first dimension): blocks until the rank's part is done.
    /// Every rank of the communicator calls the same operations in the same order
    /// (ranks outside a replica group too); send and receive pair up per pair of
    /// ranks in order. Fails with `NRT_EXEC_HW_ERR_COLLECTIVES` when a rank does not
    /// arrive within `NEURON_RT_EXEC_TIMEOUT`; the output's contents are then
    /// unspecified (the ring may have written part of it).
    pub fn run(
        &self,
        rank: u32,
        call: &CollectiveCall,
        input: Option<&Tensor>,
        output: Option<&Tensor>,
    ) -> NrtResult<()> {
        self.run_as(rank, call, input, output, 0)
    }

    /// A call, as request `nrta_seq_id` of an execution unit when not 0.
    pub(crate) fn run_as(
        &self,
        rank: u32,
        call: &CollectiveCall,
        input: Option<&Tensor>,
        output: Option<&Tensor>,
        nrta_seq_id: u64,
    ) -> NrtResult<()> {
        self.inner.lifecycle.check()?;
        self.own_place(rank)?;
        let need = |tensor: Option<&Tensor>, what: &str| {
            tensor.cloned().ok_or_else(|| NrtError::invalid(format!("{} needs an {what} tensor", call.op.name())))
        };
        let deadline = Instant::now() + self.inner.timeout;
        match call.op {
            Collective::Send { peer } => {
                let input = need(input, "input")?;
                return self.send(rank, peer, input.read_all()?, deadline);
            }
            Collective::Recv { peer } => {
                let output = need(output, "output")?;
                return self.recv(rank, peer, &output, deadline);
            }
            _ => {}
        }
        let (input, output) = match call.op {
            Collective::Barrier => (None, None),
            _ => (Some(need(input, "input")?), Some(need(output, "output")?)),
        };
        // The call is checked before it takes the rank's next unit, so that one that
        // cannot run does not leave the other ranks waiting for it.
        let position = || OpPosition { unit: self.begin(rank), index: 0, count: 1 };
        let ids = EventIds { nrta_seq_id, ..EventIds::default() };
        let exchange = |output: &mut [u8], input: Arc<Message>, lent: Option<LentInput<'_>>| {
            let request = Request {
                op: call.op,
                dtype: call.dtype,
                groups: &call.groups,
                algorithm: call.algorithm,
                outer: 1,
                input,
                lent,
                output,
                non_finite: None,
            };
            self.exchange(rank, position, request, deadline, ids).map(drop)
        };
        if let (Some(input), Some(output)) = (&input, &output)
            && let Some((input_place, output_place)) = self.lendable(call.op, (input, output), deadline)
        {
            // Both tensors held for the whole call (the output for writing), unless
            // something holds them now: then the call copies as below.
            fn lend(bytes: Option<&[u8]>, (input, output): (SharedPlace, SharedPlace)) -> Option<LentInput<'_>> {
                Some(LentInput { bytes, input, output })
            }
            let places = (input_place, output_place);
            let empty = || Arc::new(Message::Heap(Vec::new()));
            let lending = |out: &mut [u8]| match input_place == output_place {
                // Summed in place: the input is the output, held for writing.
                true => Some(exchange(out, empty(), lend(None, places))),
                false => input.try_with_bytes(|bytes| exchange(out, empty(), lend(Some(bytes), places))).ok(),
            };
            if let Ok(Some(exchanged)) = output.try_with_bytes_mut(lending) {
                return exchanged;
            }
        }
        let input_bytes = match &input {
            Some(t) => {
                let mut message = self.message_for_peers(t.size() as usize);
                t.read(0, message.bytes_mut())?;
                Arc::new(message)
            }
            None => Arc::new(Message::Heap(Vec::new())),
        };
        let exchange = |output: &mut [u8]| exchange(output, Arc::clone(&input_bytes), None);
        let exchanged = match &output {
            None => exchange(&mut []),
            // The result is written into the output tensor where it lies, or through a
            // buffer when its memory is shared or in use.
            Some(output) => match output.try_with_bytes_mut(exchange) {
                Ok(exchanged) => exchanged,
                Err(exchange) => {
                    let mut bytes = buffers::take(output.size() as usize);
                    let written = exchange(&mut bytes).and_then(|()| output.write(0, &bytes));
                    buffers::give(bytes);
                    written
                }
            },
        };
        // Kept for later calls; the input only once the other ranks have read it.
        Message::recycle(input_bytes);
        exchanged
    }

    /// Where rank `rank` runs, which must be in this process.
    fn own_place(&self, rank: u32) -> NrtResult<RankPlace> {
        self.check_rank(rank)?;
        self.place(rank).copied().ok_or_else(|| {
            NrtError::invalid(format!(
                "rank {rank} of {} has not joined in this process; call as a rank this process joined",
                self.inner.name
            ))
        })
    }

    fn check_rank(&self, rank: u32) -> NrtResult<()> {
        if (rank as usize) < self.ranks() {
            Ok(())
        } else if self.inner.membership.is_some() {
            Err(NrtError::invalid(format!(
                "rank {rank} does not exist: {} has ranks 0 to {} across the job's processes",
                self.inner.name,
                self.ranks() - 1
            )))
        } else {
            Err(NrtError::invalid(format!(
                "rank {rank} does not exist: {} has ranks 0 to {}",
                self.inner.name,
                self.ranks() - 1
            )))
        }
    }
}

/// Converts a program's collective into an API one.
pub(crate) fn from_kind(kind: CollectiveKind) -> Collective {
    match kind {
        CollectiveKind::AllReduce(op) => Collective::AllReduce(op),
        CollectiveKind::AllGather { .. } => Collective::AllGather,
        CollectiveKind::ReduceScatter { op, .. } => Collective::ReduceScatter(op),
        CollectiveKind::AllToAll { .. } => Collective::AllToAll,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_algorithm_is_the_ring_only_for_large_exchanges_of_three_or_more_ranks() {
        assert_eq!(choose_algorithm(1 << 30, 2), Algorithm::AllToAll);
        assert_eq!(choose_algorithm(RING_MIN_TRAFFIC.div_ceil(3), 4), Algorithm::Ring);
        assert_eq!(choose_algorithm(RING_MIN_TRAFFIC.div_ceil(3) - 1, 4), Algorithm::AllToAll);
        assert_eq!(choose_algorithm(4 << 20, 8), Algorithm::Ring);
        assert_eq!(choose_algorithm(1 << 20, 8), Algorithm::AllToAll);
        assert_eq!(Algorithm::parse("auto"), Ok(None));
        assert_eq!(Algorithm::parse("ring"), Ok(Some(Algorithm::Ring)));
        assert!(Algorithm::parse("tree").is_err());
    }
}
