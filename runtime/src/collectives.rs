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

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::backend;
use crate::dtype::DType;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::isa::{CollectiveKind, ReduceOp, format_group, format_groups};
use crate::lifecycle::Lifecycle;
use crate::tensor::Tensor;
use neuron_datastore::clock::ticks;
use neuron_datastore::counters::core as counter;
use neuron_datastore::event::{EventType, Phase};
use neuron_datastore::record::FLAG_STATUS;
use neuron_datastore::topology::Topology;
use neuron_datastore::{EventIds, RingPos, Tracer};

/// From this many bytes of other ranks' data per rank (message × (ranks − 1)), the
/// default algorithm is the ring (with more than two ranks).
pub const RING_MIN_TRAFFIC: u64 = 16 << 20;

/// How the data of a collective moves between ranks (its name and event code are
/// the datastore's).
pub use neuron_datastore::CollectiveAlgorithm as Algorithm;

/// The default algorithm for `bytes` per rank in a group of `ranks`.
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
    ranks: Vec<RankPlace>,
    tracer: Arc<Tracer>,
    lifecycle: Arc<Lifecycle>,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Open meetings by (unit, operation within the unit, group index).
    meetings: HashMap<(u64, u32, usize), Meeting>,
    /// Per rank, the next unit (an execution of a model, or one API call).
    next_unit: Vec<u64>,
    /// Units below this were abandoned by some rank: every rank starts at least here.
    resync: u64,
    /// Sent and not yet received, by (sender, receiver).
    mailboxes: HashMap<(u32, u32), VecDeque<Vec<u8>>>,
}

/// The ranks of one group in one operation.
#[derive(Debug)]
struct Meeting {
    /// What the first rank asked for; every other rank must ask for the same.
    signature: Signature,
    /// Each position's input, once its rank has arrived with a matching request.
    inputs: Vec<Option<Arc<Vec<u8>>>>,
    /// Ranks that reached the meeting (matching or not), and ranks gone from it.
    arrived: usize,
    left: usize,
    failure: Option<Failure>,
    /// The channel into each position, for the ring.
    channels: Vec<Channel>,
}

/// Parts of data passed to one ring position.
type Channel = (Sender<Vec<u8>>, Receiver<Vec<u8>>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Signature {
    op: Collective,
    dtype: DType,
    group: Vec<u32>,
    input_bytes: usize,
    output_bytes: usize,
    outer: usize,
    algorithm: Algorithm,
}

#[derive(Debug, Clone)]
enum Failure {
    /// Positions that had not arrived when a rank's wait ran out.
    Missing(Vec<usize>),
    Mismatch(String),
}

/// What a checked request does: its group, the rank's position in it, the algorithm.
struct Plan {
    group_index: usize,
    group: Vec<u32>,
    position: usize,
    algorithm: Algorithm,
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
    pub(crate) input: &'a [u8],
    pub(crate) output: &'a mut [u8],
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
        let per_device = topology.cores_per_device().max(1);
        let ranks = cores
            .iter()
            .map(|&core| RankPlace {
                core,
                device: topology.device_of(core),
                local: core % per_device,
                ring: tracer.ring_of(Some(core)),
                slot: tracer.store().core_slot(core),
            })
            .collect();
        let id = NEXT_COMMUNICATOR.fetch_add(1, Ordering::Relaxed);
        let name = name.map_or_else(|| format!("communicator {id}"), str::to_owned);
        Ok(Communicator {
            inner: Arc::new(Inner {
                name,
                ranks,
                tracer,
                lifecycle,
                timeout,
                state: Mutex::new(State { next_unit: vec![0; cores.len()], ..State::default() }),
                changed: Condvar::new(),
            }),
        })
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.inner.ranks.len()
    }

    /// The core rank `rank` runs on.
    pub fn core(&self, rank: u32) -> Option<u32> {
        self.inner.ranks.get(rank as usize).map(|r| r.core)
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Runs `call` as rank `rank`, on `input` and `output` (whole tensors, split and
    /// joined along their first dimension): blocks until the rank's part is done.
    /// Every rank of the communicator calls the same operations in the same order
    /// (ranks outside a replica group too); send and receive pair up per pair of
    /// ranks in order. Fails with `NRT_EXEC_HW_ERR_COLLECTIVES` when a rank does not
    /// arrive within `NEURON_RT_EXEC_TIMEOUT`.
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
        self.check_rank(rank)?;
        let need = |tensor: Option<&Tensor>, what: &str| {
            tensor.cloned().ok_or_else(|| NrtError::invalid(format!("{} needs an {what} tensor", call.op.name())))
        };
        let deadline = Instant::now() + self.inner.timeout;
        match call.op {
            Collective::Send { peer } => {
                let input = need(input, "input")?;
                return self.send(rank, peer, input.read_all()?);
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
        let input_bytes = match &input {
            Some(t) => t.read_all()?,
            None => Vec::new(),
        };
        let mut output_bytes = vec![0u8; output.as_ref().map_or(0, |t| t.size() as usize)];
        // The call is checked before it takes the rank's next unit, so that one that
        // cannot run does not leave the other ranks waiting for it.
        let position = || OpPosition { unit: self.begin(rank), index: 0, count: 1 };
        let request = Request {
            op: call.op,
            dtype: call.dtype,
            groups: &call.groups,
            algorithm: call.algorithm,
            outer: 1,
            input: &input_bytes,
            output: &mut output_bytes,
        };
        self.exchange(rank, position, request, deadline, EventIds { nrta_seq_id, ..EventIds::default() })?;
        if let Some(output) = output {
            output.write(0, &output_bytes)?;
        }
        Ok(())
    }

    fn check_rank(&self, rank: u32) -> NrtResult<()> {
        if (rank as usize) < self.ranks() {
            Ok(())
        } else {
            Err(NrtError::invalid(format!(
                "rank {rank} does not exist: {} has ranks 0 to {}",
                self.inner.name,
                self.ranks() - 1
            )))
        }
    }

    /// Starts rank `rank`'s next unit (an execution or an API call) and returns its
    /// number: its own next one, or later if the ranks were resynchronised after an
    /// abandoned operation.
    pub(crate) fn begin(&self, rank: u32) -> u64 {
        let mut state = self.lock();
        let unit = state.next_unit[rank as usize].max(state.resync);
        state.next_unit[rank as usize] = unit + 1;
        unit
    }

    /// Checks a request of rank `rank` (its groups split the ranks, its sizes fit the
    /// operation) and works out its group, position and algorithm.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        rank: u32,
        op: Collective,
        dtype: DType,
        groups: &[Vec<u32>],
        algorithm: Option<Algorithm>,
        outer: usize,
        input_len: usize,
        output_len: usize,
    ) -> NrtResult<Plan> {
        check_groups(groups, self.ranks())?;
        let (group_index, group, position) = if groups.is_empty() {
            (0, (0..self.ranks() as u32).collect::<Vec<_>>(), rank as usize)
        } else {
            groups
                .iter()
                .enumerate()
                .find_map(|(g, group)| Some((g, group.clone(), group.iter().position(|&r| r == rank)?)))
                .ok_or_else(|| {
                    NrtError::invalid(format!("rank {rank} is in no replica group of {}", format_groups(groups)))
                })?
        };
        let n = group.len();
        let row = outer.max(1) * dtype.size_bytes() as usize;
        let shapes_fit = match op {
            Collective::AllReduce(_) => input_len == output_len,
            Collective::AllGather => output_len == input_len * n,
            Collective::ReduceScatter(_) => input_len == output_len * n,
            Collective::AllToAll => input_len == output_len && input_len.is_multiple_of(n * row),
            Collective::Barrier => true,
            Collective::Send { .. } | Collective::Recv { .. } => false,
        } && input_len.is_multiple_of(row)
            && output_len.is_multiple_of(row);
        if !shapes_fit {
            return Err(NrtError::invalid(format!(
                "{} in a group of {n} ranks cannot take {input_len} bytes in and give {output_len} bytes of {dtype}",
                op.name(),
            )));
        }
        // What all-to-all makes each rank read from each other rank: the whole buffer of
        // an all-reduce, the input of a gather, the output-sized part of a scatter.
        let message = input_len.min(output_len) as u64;
        let algorithm = match op {
            Collective::AllReduce(_) | Collective::AllGather | Collective::ReduceScatter(_) => {
                algorithm.unwrap_or_else(|| choose_algorithm(message, n))
            }
            _ => Algorithm::AllToAll,
        };
        Ok(Plan { group_index, group, position, algorithm })
    }

    /// Rank `rank`'s part of one collective: checks the request, meets its group, moves
    /// the data, and records a `cc_running` span and the collectives counters. `at`
    /// gives the collective's place once the request has passed its checks.
    pub(crate) fn exchange(
        &self,
        rank: u32,
        at: impl FnOnce() -> OpPosition,
        request: Request<'_>,
        deadline: Instant,
        ids: EventIds,
    ) -> NrtResult<Algorithm> {
        let inner = &*self.inner;
        let place = inner.ranks[rank as usize];
        let (input_len, output_len) = (request.input.len(), request.output.len());
        let plan = self.plan(
            rank,
            request.op,
            request.dtype,
            request.groups,
            request.algorithm,
            request.outer,
            input_len,
            output_len,
        )?;
        let at = at();
        let (n, algorithm) = (plan.group.len(), plan.algorithm);
        let group_name = inner.tracer.store().intern(&format_group(&plan.group));
        let tracer = &inner.tracer;
        let bytes = input_len.max(output_len) as u64;
        let op_code = request.op.kind() as u64;
        let args = |status: Option<NrtStatus>| {
            [u64::from(at.index), bytes, op_code | algorithm.code() << 8, status.map_or(0, |s| s.code() as u64)]
        };
        let started = ticks();
        let tracking_id = if tracer.enabled(place.ring, EventType::CcRunning) { tracer.tracking_id() } else { 0 };
        if tracking_id != 0 {
            tracer.emit_at(
                started,
                place.ring,
                EventType::CcRunning,
                Phase::Start,
                tracking_id,
                ids,
                group_name,
                args(None),
                0,
            );
        }
        let signature = Signature {
            op: request.op,
            dtype: request.dtype,
            group: plan.group.clone(),
            input_bytes: input_len,
            output_bytes: output_len,
            outer: request.outer,
            algorithm,
        };
        let result = if n == 1 {
            local(request);
            Ok(())
        } else {
            self.meet(rank, at, &plan, signature, request, deadline)
        };
        let status = result.as_ref().err().map(|e| e.status);
        if tracking_id != 0 {
            let flags = if status.is_some() { FLAG_STATUS } else { 0 };
            tracer.emit(
                place.ring,
                EventType::CcRunning,
                Phase::Stop,
                tracking_id,
                ids,
                group_name,
                args(status),
                flags,
            );
        }
        if let Some(slot) = place.slot {
            tracer.add(slot, counter::COLLECTIVES, 1);
            tracer.add(slot, counter::COLLECTIVES_NS, tracer.ticks_to_ns(ticks().saturating_sub(started)));
        }
        result.map(|()| algorithm)
    }

    fn meet(
        &self,
        rank: u32,
        at: OpPosition,
        plan: &Plan,
        signature: Signature,
        mut request: Request<'_>,
        deadline: Instant,
    ) -> NrtResult<()> {
        let (group, position) = (plan.group.as_slice(), plan.position);
        let n = group.len();
        let key = (at.unit, at.index, plan.group_index);
        let mut state = self.lock();
        if at.unit < state.resync {
            // The ranks gave this unit up (a rank went missing) after this rank began it.
            drop(state);
            return Err(self.abandoned(rank, at));
        }
        let meeting = state.meetings.entry(key).or_insert_with(|| Meeting {
            signature: signature.clone(),
            inputs: vec![None; n],
            arrived: 0,
            left: 0,
            failure: None,
            channels: (0..n).map(|_| crossbeam_channel::unbounded()).collect(),
        });
        meeting.arrived += 1;
        if meeting.signature != signature {
            if meeting.failure.is_none() {
                let describe = |s: &Signature| {
                    format!(
                        "{:?} of {} in group {}, {} bytes in, {} out, {} algorithm",
                        s.op,
                        s.dtype,
                        format_group(&s.group),
                        s.input_bytes,
                        s.output_bytes,
                        s.algorithm.name()
                    )
                };
                let detail = format!(
                    "rank {rank} called {}, but its group called {}",
                    describe(&signature),
                    describe(&meeting.signature)
                );
                meeting.failure = Some(Failure::Mismatch(detail));
            }
            state.resync = state.resync.max(at.unit + 1);
            self.inner.changed.notify_all();
        } else {
            meeting.inputs[position] = Some(Arc::new(request.input.to_vec()));
            if meeting.inputs.iter().all(Option::is_some) {
                self.inner.changed.notify_all();
            }
        }
        // Wait for the group, the deadline, or another rank's failure.
        loop {
            let meeting = state.meetings.get_mut(&key).unwrap_or_else(|| unreachable!("an open meeting is kept"));
            if let Some(failure) = meeting.failure.clone() {
                return Err(self.leave_failed(state, key, rank, at, group, failure));
            }
            if meeting.inputs.iter().all(Option::is_some) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..n).filter(|&p| meeting.inputs[p].is_none()).collect();
                meeting.failure = Some(Failure::Missing(missing.clone()));
                state.resync = state.resync.max(at.unit + 1);
                self.inner.changed.notify_all();
                return Err(self.leave_failed(state, key, rank, at, group, Failure::Missing(missing)));
            }
            if at.unit < state.resync {
                // Another group of this unit lost a rank: the ranks this one waits for
                // have moved on to their next unit.
                self.leave(&mut state, key, n);
                drop(state);
                return Err(self.abandoned(rank, at));
            }
            state = self.inner.changed.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        let meeting = state.meetings.get(&key).unwrap_or_else(|| unreachable!("an open meeting is kept"));
        let inputs: Vec<Arc<Vec<u8>>> = meeting.inputs.iter().flatten().cloned().collect();
        let to_next = meeting.channels[(position + 1) % n].0.clone();
        let from_previous = meeting.channels[position].1.clone();
        drop(state);

        let moved = match signature.algorithm {
            Algorithm::Ring => ring(&mut request, position, n, &to_next, &from_previous, deadline),
            Algorithm::AllToAll => {
                direct(&mut request, position, &inputs);
                Ok(())
            }
        };
        let mut state = self.lock();
        self.leave(&mut state, key, n);
        moved.map_err(|()| {
            NrtError::new(
                NrtStatus::ExecHwErrCollectives,
                format!(
                    "{}: a rank of group {} stopped passing data around the ring",
                    self.missing_message(rank, at),
                    format_group(group)
                ),
            )
        })
    }

    /// Marks this rank gone from a meeting. The meeting closes when every rank has left
    /// it, or, once it has failed, when every rank that arrived has (ranks arriving
    /// later fail before looking for it: the failure moved every rank past its unit).
    fn leave(&self, state: &mut State, key: (u64, u32, usize), n: usize) {
        if let Some(meeting) = state.meetings.get_mut(&key) {
            meeting.left += 1;
            let failed = meeting.failure.is_some() || key.0 < state.resync;
            if meeting.left == n || (failed && meeting.left == meeting.arrived) {
                state.meetings.remove(&key);
            }
        }
    }

    /// The error of a rank whose unit the ranks gave up while it was in it.
    fn abandoned(&self, rank: u32, at: OpPosition) -> NrtError {
        NrtError::new(
            NrtStatus::ExecHwErrCollectives,
            format!(
                "{} (the ranks gave this execution up after a rank went missing; they meet again from their next one)",
                self.missing_message(rank, at)
            ),
        )
    }

    fn leave_failed(
        &self,
        mut state: MutexGuard<'_, State>,
        key: (u64, u32, usize),
        rank: u32,
        at: OpPosition,
        group: &[u32],
        failure: Failure,
    ) -> NrtError {
        self.leave(&mut state, key, group.len());
        drop(state);
        match failure {
            Failure::Missing(positions) => {
                let missing: Vec<String> = positions.iter().map(|&p| group[p].to_string()).collect();
                NrtError::new(
                    NrtStatus::ExecHwErrCollectives,
                    format!(
                        "{} (rank {} of replica group {} did not arrive within {:.3} s)",
                        self.missing_message(rank, at),
                        missing.join(", "),
                        format_group(group),
                        self.inner.timeout.as_secs_f64()
                    ),
                )
            }
            Failure::Mismatch(detail) => {
                NrtError::invalid(format!("collectives of {} do not match: {detail}", self.inner.name))
            }
        }
    }

    /// The Neuron runtime's message for a rank whose group never completed.
    fn missing_message(&self, rank: u32, at: OpPosition) -> String {
        let place = self.inner.ranks[rank as usize];
        format!(
            "missing collectives status on Neuron Device {} NC {}, model {} - suspected hang in collectives operation {} out of {}",
            place.device, place.local, self.inner.name, at.index, at.count
        )
    }

    fn send(&self, rank: u32, peer: u32, data: Vec<u8>) -> NrtResult<()> {
        self.check_rank(peer)?;
        let mut state = self.lock();
        state.mailboxes.entry((rank, peer)).or_default().push_back(data);
        self.inner.changed.notify_all();
        Ok(())
    }

    fn recv(&self, rank: u32, peer: u32, output: &Tensor, deadline: Instant) -> NrtResult<()> {
        self.check_rank(peer)?;
        let place = self.inner.ranks[rank as usize];
        let mut state = self.lock();
        let data = loop {
            if let Some(data) = state.mailboxes.get_mut(&(peer, rank)).and_then(VecDeque::pop_front) {
                break data;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NrtError::new(
                    NrtStatus::ExecHwErrCollectives,
                    format!(
                        "missing collectives status on Neuron Device {} NC {}, model {} - rank {rank} waited {:.3} s for data from rank {peer}",
                        place.device,
                        place.local,
                        self.inner.name,
                        self.inner.timeout.as_secs_f64()
                    ),
                ));
            }
            state = self.inner.changed.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        };
        drop(state);
        if data.len() as u64 != output.size() {
            return Err(NrtError::invalid(format!(
                "rank {peer} sent {} bytes but rank {rank}'s output `{}` holds {}",
                data.len(),
                output.name(),
                output.size()
            )));
        }
        output.write(0, &data)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Checks that replica groups split ranks `0..ranks`: each rank in exactly one group
/// (or no groups: one group of all).
pub(crate) fn check_groups(groups: &[Vec<u32>], ranks: usize) -> NrtResult<()> {
    if groups.is_empty() {
        return Ok(());
    }
    let mut seen = vec![false; ranks];
    for &r in groups.iter().flatten() {
        match seen.get_mut(r as usize) {
            Some(s) if !*s => *s = true,
            Some(_) => {
                return Err(NrtError::invalid(format!("replica groups {} name rank {r} twice", format_groups(groups))));
            }
            None => {
                return Err(NrtError::invalid(format!(
                    "replica groups {} name rank {r}, but there are {ranks} ranks (0 to {})",
                    format_groups(groups),
                    ranks.saturating_sub(1)
                )));
            }
        }
    }
    if let Some(r) = seen.iter().position(|s| !s) {
        return Err(NrtError::invalid(format!(
            "replica groups {} leave out rank {r}; every rank of the {ranks} must be in one group",
            format_groups(groups)
        )));
    }
    Ok(())
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

/// How a buffer divides into the `n` parts ranks exchange.
#[derive(Debug, Clone, Copy)]
enum Parts {
    /// Consecutive element ranges of about equal size (an all-reduce's ring parts).
    Flat { elements: usize, element_bytes: usize, n: usize },
    /// `outer` rows of `n` segments of `segment` bytes: part `k` is segment `k` of each
    /// row (the parts along a gathered or scattered dimension).
    Strided { outer: usize, segment: usize, n: usize },
}

impl Parts {
    fn ranges(self, k: usize) -> Vec<Range<usize>> {
        match self {
            Parts::Flat { elements, element_bytes, n } => {
                let range = k * elements / n * element_bytes..(k + 1) * elements / n * element_bytes;
                vec![range]
            }
            Parts::Strided { outer, segment, n } => {
                (0..outer).map(|o| (o * n + k) * segment..(o * n + k + 1) * segment).collect()
            }
        }
    }

    fn pack(self, buffer: &[u8], k: usize) -> Vec<u8> {
        self.ranges(k).into_iter().flat_map(|r| buffer[r].iter().copied()).collect()
    }

    fn unpack(self, buffer: &mut [u8], k: usize, data: &[u8]) {
        let mut at = 0;
        for r in self.ranges(k) {
            let len = r.len();
            buffer[r].copy_from_slice(&data[at..at + len]);
            at += len;
        }
    }

    fn combine(self, buffer: &mut [u8], k: usize, data: &[u8], op: ReduceOp, dtype: DType) {
        let mut at = 0;
        for r in self.ranges(k) {
            let len = r.len();
            backend::combine_le_bytes(op, dtype, &mut buffer[r], &data[at..at + len]);
            at += len;
        }
    }
}

/// The segment size of the strided parts of a request in a group of `n`.
fn strided(request: &Request<'_>, n: usize) -> Parts {
    let outer = request.outer.max(1);
    let segment = match request.op {
        Collective::AllGather => request.input.len() / outer,
        Collective::ReduceScatter(_) => request.output.len() / outer,
        _ => request.input.len() / outer / n,
    };
    Parts::Strided { outer, segment, n }
}

/// A group of one: the output is the input (or its only part).
fn local(request: Request<'_>) {
    let len = request.output.len().min(request.input.len());
    request.output[..len].copy_from_slice(&request.input[..len]);
}

/// The all-to-all algorithm: every rank reads all inputs, in group order.
fn direct(request: &mut Request<'_>, position: usize, inputs: &[Arc<Vec<u8>>]) {
    let n = inputs.len();
    let parts = strided(request, n);
    let output = &mut *request.output;
    match request.op {
        Collective::AllReduce(op) => {
            output.copy_from_slice(&inputs[0]);
            for input in &inputs[1..] {
                backend::combine_le_bytes(op, request.dtype, output, input);
            }
        }
        Collective::AllGather => {
            for (j, input) in inputs.iter().enumerate() {
                parts.unpack(output, j, input);
            }
        }
        Collective::ReduceScatter(op) => {
            output.copy_from_slice(&parts.pack(&inputs[0], position));
            for input in &inputs[1..] {
                backend::combine_le_bytes(op, request.dtype, output, &parts.pack(input, position));
            }
        }
        Collective::AllToAll => {
            for (j, input) in inputs.iter().enumerate() {
                parts.unpack(output, j, &parts.pack(input, position));
            }
        }
        Collective::Barrier | Collective::Send { .. } | Collective::Recv { .. } => {}
    }
}

/// The ring algorithm: `n − 1` reduce-scatter steps after which position `p` holds the
/// finished part `p`, then `n − 1` all-gather steps that pass the finished parts on.
fn ring(
    request: &mut Request<'_>,
    p: usize,
    n: usize,
    to_next: &Sender<Vec<u8>>,
    from_previous: &Receiver<Vec<u8>>,
    deadline: Instant,
) -> Result<(), ()> {
    let part = |k: isize| k.rem_euclid(n as isize) as usize;
    let p = p as isize;
    let step = |data: Vec<u8>| -> Result<Vec<u8>, ()> {
        to_next.send(data).map_err(|_| ())?;
        from_previous.recv_deadline(deadline).map_err(|_| ())
    };
    let dtype = request.dtype;
    match request.op {
        Collective::AllReduce(op) | Collective::ReduceScatter(op) => {
            let element_bytes = dtype.size_bytes() as usize;
            let parts = match request.op {
                Collective::AllReduce(_) => {
                    Parts::Flat { elements: request.input.len() / element_bytes, element_bytes, n }
                }
                _ => strided(request, n),
            };
            let mut acc = request.input.to_vec();
            for s in 0..n as isize - 1 {
                let received = step(parts.pack(&acc, part(p - s - 1)))?;
                parts.combine(&mut acc, part(p - s - 2), &received, op, dtype);
            }
            if matches!(request.op, Collective::ReduceScatter(_)) {
                request.output.copy_from_slice(&parts.pack(&acc, part(p)));
                return Ok(());
            }
            for s in 0..n as isize - 1 {
                let received = step(parts.pack(&acc, part(p - s)))?;
                parts.unpack(&mut acc, part(p - s - 1), &received);
            }
            request.output.copy_from_slice(&acc);
        }
        Collective::AllGather => {
            let parts = strided(request, n);
            let input = request.input;
            let output = &mut *request.output;
            parts.unpack(output, part(p), input);
            for s in 0..n as isize - 1 {
                let received = step(parts.pack(output, part(p - s)))?;
                parts.unpack(output, part(p - s - 1), &received);
            }
        }
        Collective::AllToAll | Collective::Barrier | Collective::Send { .. } | Collective::Recv { .. } => {}
    }
    Ok(())
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

    #[test]
    fn parts_cover_a_buffer_exactly_once() {
        for parts in
            [Parts::Flat { elements: 13, element_bytes: 4, n: 4 }, Parts::Strided { outer: 3, segment: 8, n: 4 }]
        {
            let len = match parts {
                Parts::Flat { elements, element_bytes, .. } => elements * element_bytes,
                Parts::Strided { outer, segment, n } => outer * segment * n,
            };
            let mut covered = vec![0u8; len];
            for k in 0..4 {
                for range in parts.ranges(k) {
                    covered[range].iter_mut().for_each(|c| *c += 1);
                }
            }
            assert!(covered.iter().all(|&c| c == 1), "{parts:?}: {covered:?}");
        }
        let parts = Parts::Strided { outer: 2, segment: 2, n: 2 };
        let buffer = [0, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(parts.pack(&buffer, 1), [2, 3, 6, 7], "segment 1 of each row");
    }
}
