//! Communicators whose ranks are in several processes (a job started by torchrun,
//! `mpirun`, Slurm, …; see [`crate::launch`]).
//!
//! Such a communicator is identified across the job by its name; each process joins the
//! ranks it holds, and the roster from the root says where the others are. A group
//! whose ranks are all in this process meets as in any communicator. A group spanning
//! processes moves its data as messages through the [`World`]: all-to-all sends each
//! rank's input to every other rank of the group, the ring passes parts to the next
//! rank; every message carries its operation's signature, and a receiver whose own
//! differs fails naming both sides.
//!
//! A failure of a rank (a peer that never arrives, whose process is gone, or whose call
//! does not match) fails its operation, tells the other ranks of the group so that
//! they fail at once rather than at their deadline, and leaves the communicator failed
//! in this process: its later calls fail at once, and the job builds a new one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::algorithms::{direct, ring};
use super::meeting::{Plan, Signature, report_after, root_first, root_of};
use super::streaming;
use super::world::lending;
use super::world::wire::Key;
use super::world::{Arrival, Message, Missed, Roster, Stamp, World};
use super::{Algorithm, Collective, Communicator, OpPosition, RankPlace, Request};
use crate::backend;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::isa::ReduceOp;
use crate::lifecycle::Lifecycle;
use crate::shared_memory::SharedPlace;
use crate::tensor::Tensor;
use neuron_datastore::Tracer;
use neuron_datastore::topology::Topology;

/// How long a failing rank spends telling the others.
const ABORT_NOTICE: Duration = Duration::from_secs(1);

/// This process's part in a communicator across processes.
#[derive(Debug)]
pub(crate) struct Membership {
    pub(super) world: Arc<World>,
    /// The communicator's id at the root: from its key, the same in every process.
    comm: u64,
    /// How many communicators of the same key this process built before this one.
    generation: u32,
    /// A program's: the ranks that load one NEFF with one rank count (the NEFF's hash).
    program: Option<String>,
    /// Why the communicator failed in this process, once it has.
    failed: Mutex<Option<NrtError>>,
    /// Messages sent and received so far between each pair of ranks (from, to) whose
    /// processes differ: a send and a recv are matched by their place in this order.
    p2p: Mutex<HashMap<(u32, u32), u64>>,
}

/// The `index` of a send's message key, unlike any collective's.
const P2P_INDEX: u32 = u32::MAX - 1;

impl Communicator {
    /// A communicator named `name` of `count` ranks across the job's processes, none
    /// joined yet; `key` (with its generation) identifies it in every process; a
    /// program's communicator (`program`) is told apart from those of other programs
    /// the job's processes load instead.
    pub(crate) fn across(
        name: &str,
        (key, generation, program): (&str, u32, Option<String>),
        count: u32,
        world: Arc<World>,
        tracer: Arc<Tracer>,
        lifecycle: Arc<Lifecycle>,
        timeout: Duration,
    ) -> NrtResult<Communicator> {
        if count == 0 {
            return Err(NrtError::invalid("a communicator needs at least one rank"));
        }
        let comm = world.communicator_id(&format!("{key} #{generation}"));
        Ok(Communicator::from_parts(
            (name.to_owned(), comm as u32),
            (0..count).map(|_| std::sync::OnceLock::new()).collect(),
            Some(Membership {
                world,
                comm,
                generation,
                program,
                failed: Mutex::new(None),
                p2p: Mutex::new(HashMap::new()),
            }),
            tracer,
            lifecycle,
            timeout,
        ))
    }

    /// Joins rank `rank` of a communicator across processes, on `core` of this process.
    pub(crate) fn join(&self, rank: u32, core: u32, topology: &Topology) -> NrtResult<()> {
        let Some(membership) = &self.inner.membership else {
            return Err(NrtError::invalid(format!("{} is a communicator of this process only", self.inner.name)));
        };
        self.check_rank(rank)?;
        let ranks = self.ranks() as u32;
        let mut fresh = false;
        let held = self.inner.ranks[rank as usize].get_or_init(|| {
            fresh = true;
            RankPlace::new(core, (rank, ranks), topology, &self.inner.tracer)
        });
        if fresh {
            self.record_member(rank, held);
        }
        if held.core != core {
            return Err(NrtError::invalid(format!(
                "rank {rank} of `{}` already runs on nc{} in this process",
                self.inner.name, held.core
            )));
        }
        if rank == 0 {
            membership.world.serve_root()?;
        }
        let (comm, count) = (membership.comm, self.ranks() as u32);
        membership.world.join(comm, &self.inner.name, (count, rank), membership.program.clone());
        Ok(())
    }

    /// A rank's input of `len` bytes, to be overwritten whole: in the outbox when the
    /// communicator has ranks in other processes of this host, so that sending it to
    /// them copies nothing.
    pub(crate) fn message_for_peers(&self, len: usize) -> Message {
        Message::for_peers(len, self.inner.membership.as_ref().and_then(|m| m.world.outbox()))
    }

    /// The places of `input` and `output` when a call of them may lend them to the ranks
    /// of other processes of this host: an all-reduce of large tensors in shared memory,
    /// apart from each other or one and the same, in a job with processes on this host.
    pub(crate) fn lendable(
        &self,
        op: Collective,
        (input, output): (&Tensor, &Tensor),
        deadline: Instant,
    ) -> Option<(SharedPlace, SharedPlace)> {
        let membership = self.inner.membership.as_ref()?;
        if !matches!(op, Collective::AllReduce(_)) || input.size() < lending::MIN_BYTES {
            return None;
        }
        let places = (input.shared_place()?, output.shared_place()?);
        // Apart, or the very same bytes (summed in place).
        if input.shares_memory_with(output) && places.0 != places.1 {
            return None;
        }
        // The roster says where the ranks are (the call waits for it anyway).
        membership.world.roster(membership.comm, &self.inner.name, deadline).ok()?;
        membership.world.outbox().map(|_| places)
    }

    /// Whether `group` spans several processes, all of this host: there, an all-reduce
    /// by parts reads each byte fewer times than the ring at any size (see
    /// [`Exchange::all_reduce_by_parts`]).
    pub(super) fn spans_processes_of_this_host(&self, group: &[u32], deadline: Instant) -> bool {
        let Some(membership) = &self.inner.membership else { return false };
        let Ok(roster) = membership.world.roster(membership.comm, &self.inner.name, deadline) else { return false };
        let processes: Vec<u32> = group.iter().filter_map(|&r| roster.rank_process.get(r as usize).copied()).collect();
        processes.iter().any(|&p| p != roster.process) && processes.iter().all(|&p| roster.same_host(p, roster.process))
    }

    /// Whether this communicator across processes failed (and a new one is needed).
    pub(crate) fn has_failed(&self) -> bool {
        self.inner
            .membership
            .as_ref()
            .is_some_and(|m| m.failed.lock().unwrap_or_else(|e| e.into_inner()).is_some() || m.world.has_failed(m.comm))
    }

    /// Records, for each rank of process `process` (of the job), what that process said
    /// it was doing, once the roster says which ranks it holds.
    pub(crate) fn record_heard(&self, process: u32, heard: &neuron_datastore::flight::Heard) {
        let Some(membership) = &self.inner.membership else { return };
        let Some(roster) = membership.world.known_roster(membership.comm) else { return };
        let ranks = (0..roster.rank_process.len() as u32).filter(|&r| roster.rank_process[r as usize] == process);
        self.record_said(ranks, heard);
    }

    /// How many communicators of the same key this process built before this one.
    pub(crate) fn generation(&self) -> u32 {
        self.inner.membership.as_ref().map_or(0, |m| m.generation)
    }

    /// Waits until every rank of the communicator has joined, or `deadline`.
    pub fn wait_for_ranks(&self, deadline: Instant) -> NrtResult<()> {
        match &self.inner.membership {
            Some(m) => m.world.roster(m.comm, &self.inner.name, deadline).map(drop),
            None => Ok(()),
        }
    }

    /// Where `peer` is when it is in another process of the job (else `None`: the
    /// ranks meet in this process), with the roster that says so.
    fn remote_peer(&self, peer: u32, deadline: Instant) -> NrtResult<Option<(&Membership, Arc<Roster>)>> {
        let Some(membership) = &self.inner.membership else { return Ok(None) };
        let roster = membership.world.roster(membership.comm, &self.inner.name, deadline)?;
        let remote = roster.rank_process[peer as usize] != roster.process;
        Ok(remote.then_some((membership, roster)))
    }

    /// The place of the next message from `from` to `to` in their order.
    fn next_p2p(membership: &Membership, from: u32, to: u32) -> u64 {
        let mut counts = membership.p2p.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry((from, to)).or_default();
        *count += 1;
        *count - 1
    }

    /// Sends `data` from `rank` to `peer` when `peer` is in another process; gives the
    /// data back when it is in this one.
    pub(super) fn send_across(
        &self,
        rank: u32,
        peer: u32,
        data: Vec<u8>,
        deadline: Instant,
    ) -> NrtResult<Option<Vec<u8>>> {
        let Some((membership, roster)) = self.remote_peer(peer, deadline)? else { return Ok(Some(data)) };
        let unit = Self::next_p2p(membership, rank, peer);
        let key = Key { comm: membership.comm, unit, index: P2P_INDEX, step: 0, from: rank, to: peer };
        let process = roster.rank_process[peer as usize];
        let stamp = Stamp::of("send");
        membership.world.send(process, key, &stamp, Ok(Arc::new(Message::Heap(data))), deadline).map_err(|missed| {
            self.p2p_failure(missed, format!("rank {rank} could not send to {}", roster.describe(peer)))
        })?;
        Ok(None)
    }

    /// The next message from `peer` to `rank` when `peer` is in another process (`None`
    /// when it is in this one).
    pub(super) fn recv_across(&self, rank: u32, peer: u32, deadline: Instant) -> NrtResult<Option<Arc<Message>>> {
        let Some((membership, roster)) = self.remote_peer(peer, deadline)? else { return Ok(None) };
        let unit = Self::next_p2p(membership, peer, rank);
        let key = Key { comm: membership.comm, unit, index: P2P_INDEX, step: 0, from: peer, to: rank };
        let parcel = membership.world.receive(roster.rank_process[peer as usize], key, deadline).map_err(|missed| {
            self.p2p_failure(
                missed,
                format!("rank {rank} of {} got no data from {}", self.inner.name, roster.describe(peer)),
            )
        })?;
        Ok(Some(parcel.data))
    }

    /// The error of a message between two ranks that did not get through: `what`
    /// says which ("rank 0 could not send to rank 1 (pid 812 on host a)").
    fn p2p_failure(&self, missed: Missed, what: String) -> NrtError {
        match missed {
            Missed::Gone(reason) => {
                NrtError::new(NrtStatus::NetworkProxyFailure, format!("{what}: {reason}; its process is gone"))
            }
            Missed::LinkDown(reason) => NrtError::new(NrtStatus::NetworkProxyFailure, format!("{what}: {reason}")),
            Missed::Timeout | Missed::Aborted(_) => NrtError::new(
                NrtStatus::ExecHwErrCollectives,
                format!("{what} within {:.3} s", self.inner.timeout.as_secs_f64()),
            ),
        }
    }

    /// Rank `rank`'s part of an operation of a communicator across processes, which
    /// it reached at `arrived`. Gives the arrivals of the group's ranks of other
    /// processes when this rank is the lowest of this process in the group (which
    /// records them: `flight.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn meet_across(
        &self,
        membership: &Membership,
        rank: u32,
        at: OpPosition,
        plan: &Plan,
        (signature, arrived): (Signature, Arrival),
        mut request: Request<'_>,
        deadline: Instant,
    ) -> NrtResult<Vec<Arrival>> {
        if let Some(failed) = membership.failed.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            // One line that points at the first failure, not the whole of it again.
            return Err(NrtError::new(
                failed.status,
                format!(
                    "communicator `{}` is broken since an earlier failure and cannot be used again (build a new \
                     one); that failure: {}",
                    self.inner.name,
                    root_of(&failed.message)
                ),
            ));
        }
        let roster = membership.world.roster(membership.comm, &self.inner.name, deadline)?;
        self.record_roster(&roster);
        if plan.group.iter().all(|&r| roster.rank_process[r as usize] == roster.process) {
            request.unlend(self);
            return self.meet(rank, at, plan, signature, request, deadline).map(|()| Vec::new());
        }
        // An all-reduce of all-to-all runs by parts, lending where it can; any other
        // algorithm moves copies of the input.
        let by_parts = match request.op {
            Collective::AllReduce(op) if plan.algorithm == Algorithm::AllToAll => Some(op),
            _ => None,
        };
        if by_parts.is_none() {
            request.unlend(self);
        }
        let reported = std::cell::Cell::new(false);
        let known = std::cell::RefCell::new(vec![arrived]);
        let exchange = Exchange {
            communicator: self,
            membership,
            roster: &roster,
            rank,
            at,
            deadline,
            signature,
            reported,
            known,
        };
        let moved = match by_parts {
            Some(op) => exchange.all_reduce_by_parts(plan, op, request),
            None => exchange.run(plan, request),
        };
        if let Err(error) = &moved {
            exchange.abort(plan, error);
            *membership.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(error.clone());
            membership.world.forget(membership.comm);
        }
        moved?;
        let here = |r: u32| roster.rank_process[r as usize] == roster.process;
        let lowest_here = plan.group.iter().copied().filter(|&r| here(r)).min();
        let mut known = exchange.known.into_inner();
        known.retain(|a| !here(a.rank));
        Ok(if lowest_here == Some(rank) { known } else { Vec::new() })
    }
}

/// One rank's part of one operation across processes.
struct Exchange<'a> {
    communicator: &'a Communicator,
    membership: &'a Membership,
    roster: &'a Roster,
    rank: u32,
    at: OpPosition,
    deadline: Instant,
    signature: Signature,
    /// Whether this rank said already that the operation waits past [`report_after`].
    reported: std::cell::Cell<bool>,
    /// The arrivals this rank knows of: its own, and those its messages brought.
    known: std::cell::RefCell<Vec<Arrival>>,
}

impl Exchange<'_> {
    fn run(&self, plan: &Plan, mut request: Request<'_>) -> NrtResult<()> {
        let (group, p, n) = (&plan.group, plan.position, plan.group.len());
        let signature = self.signature.to_string();
        match plan.algorithm {
            Algorithm::AllToAll => {
                let mine = Arc::clone(&request.input);
                for &peer in group.iter().filter(|&&r| r != self.rank) {
                    self.send(peer, 0, &signature, Arc::clone(&mine))?;
                }
                let mut inputs = Vec::with_capacity(n);
                for &peer in group {
                    inputs.push(if peer == self.rank { Arc::clone(&mine) } else { self.receive(peer, 0, &signature)? });
                }
                direct(&mut request, p, &inputs.iter().map(|input| &input[..]).collect::<Vec<_>>());
                // What the peers sent is kept for later calls, or released to them.
                inputs.into_iter().filter(|input| !Arc::ptr_eq(input, &mine)).for_each(Message::recycle);
                Ok(())
            }
            Algorithm::Ring => {
                let (next, previous) = (group[(p + 1) % n], group[(p + n - 1) % n]);
                let mut step = 0;
                ring(&mut request, p, n, |part| {
                    // Made where the next rank reads it.
                    let mut message = self.communicator.message_for_peers(part.len());
                    part.write_to(message.bytes_mut());
                    self.send(next, step, &signature, Arc::new(message))?;
                    let received = self.receive(previous, step, &signature)?;
                    step += 1;
                    Ok(Arc::try_unwrap(received).unwrap_or_else(|shared| Message::Heap(shared.to_vec())))
                })
            }
        }
    }

    /// An all-reduce by parts: part `k` of the output (in group order) is the sum of
    /// part `k` of every input, which position `k` computes and the others copy. A
    /// rank's peers read its input and finished part where they lie when it lent them
    /// its tensors (`world/lending.rs`); else they read its input from its message, and
    /// a peer of its host its finished part from a second one (in the outbox), while
    /// a peer of another host computes that part itself. Every part is summed in group
    /// order whoever sums it, so all ranks get the same bits, as with `direct`.
    ///
    /// Messages from this rank to a peer: its input or lent tensors (step 0); its
    /// finished part, or only word that it is final when it lent (step 1, to peers it
    /// lent to or of its host); and, when either of the two lent to the other, "I am
    /// done with your memory" both ways (step 2), the last thing before returning.
    fn all_reduce_by_parts(&self, plan: &Plan, op: ReduceOp, request: Request<'_>) -> NrtResult<()> {
        let (group, p, n) = (&plan.group, plan.position, plan.group.len());
        let signature = self.signature.to_string();
        // This rank's own input: `None` when it is the output (summed in place), whose
        // part `k` still holds it until this rank writes that part.
        let mine: Option<&[u8]> = match &request.lent {
            Some(lent) => lent.bytes,
            None => Some(&request.input[..]),
        };
        let mut lent_to = vec![false; n];
        for (k, &peer) in group.iter().enumerate().filter(|&(k, _)| k != p) {
            lent_to[k] = match &request.lent {
                Some(lent) => {
                    let key = self.key(0, self.rank, peer);
                    let places = (lent.input, lent.output);
                    let world = &self.membership.world;
                    let bytes = lent.bytes.unwrap_or(request.output);
                    world
                        .send_lent(self.process_of(peer), key, &self.stamp(&signature), (bytes, places), self.deadline)
                        .map_err(|missed| self.missed(peer, missed))?
                }
                None => self.send(peer, 0, &signature, Arc::clone(&request.input)).map(|()| false)?,
            };
        }
        let mut theirs = Vec::with_capacity(n);
        for (k, &peer) in group.iter().enumerate() {
            theirs.push(if k == p { None } else { Some(self.receive(peer, 0, &signature)?) });
        }
        let len = request.output.len();
        let inputs: Vec<Option<&[u8]>> =
            theirs.iter().map(|input| input.as_ref().map_or(mine, |m| Some(&m[..]))).collect();
        if let Some(k) = inputs.iter().position(|input| input.is_some_and(|input| input.len() != len)) {
            return Err(self.malformed(group[k], format!("an input of {} bytes", inputs[k].map_or(0, <[u8]>::len))));
        }
        let element_bytes = request.dtype.size_bytes() as usize;
        let elements = len / element_bytes;
        let part = |k: usize| k * elements / n * element_bytes..(k + 1) * elements / n * element_bytes;
        let dtype = request.dtype;
        // The output's NaN and infinities, counted piece by piece as each is written
        // (while the cache holds it) when the execution checks its outputs.
        let counting = request.non_finite.filter(|_| dtype == crate::dtype::DType::F32);
        let non_finite = std::cell::Cell::new(0u64);
        let mut see = |bytes: &[u8]| non_finite.set(non_finite.get() + backend::non_finite_f32_le(bytes));
        // Written once, past the caches when large (`streaming.rs`); an input summed in
        // place is what the output holds there before.
        let sum = |out: &mut [u8], k: usize| {
            let start = part(k).start;
            streaming::write(out, |range, now, chunk| {
                let range = start + range.start..start + range.end;
                let input = |j: usize| inputs[j].map_or(now, |input| &input[range.clone()]);
                backend::combine_le_bytes_into(op, dtype, chunk, input(0), input(1));
                for j in 2..n {
                    backend::combine_le_bytes(op, dtype, chunk, input(j));
                }
                if counting.is_some() {
                    non_finite.set(non_finite.get() + backend::non_finite_f32_le(chunk));
                }
            });
        };
        let output = &mut *request.output;
        sum(&mut output[part(p)], p);
        let lent_by = |k: usize| theirs[k].as_ref().and_then(|m| m.lent());
        let same_host = |k: usize| self.roster.same_host(self.process_of(group[k]), self.roster.process);
        let final_word = Arc::new(Message::Heap(Vec::new()));
        let mut finished = None;
        for k in (0..n).filter(|&k| k != p) {
            if lent_to[k] {
                self.send(group[k], 1, &signature, Arc::clone(&final_word))?;
            } else if same_host(k) {
                let finished = finished.get_or_insert_with(|| {
                    let mut message = self.communicator.message_for_peers(part(p).len());
                    message.bytes_mut().copy_from_slice(&output[part(p)]);
                    Arc::new(message)
                });
                self.send(group[k], 1, &signature, Arc::clone(finished))?;
            }
        }
        for k in (0..n).filter(|&k| k != p) {
            if let Some(lent) = lent_by(k) {
                self.receive(group[k], 1, &signature)?;
                let theirs = lent.output().get(part(k)).ok_or_else(|| self.malformed(group[k], "a lent output"))?;
                streaming::copy(&mut output[part(k)], theirs, counting.map(|_| &mut see as streaming::See<'_>));
            } else if same_host(k) {
                let theirs = self.receive(group[k], 1, &signature)?;
                if theirs.len() != part(k).len() {
                    return Err(self.malformed(group[k], format!("a part of {} bytes", theirs.len())));
                }
                streaming::copy(&mut output[part(k)], &theirs, counting.map(|_| &mut see as streaming::See<'_>));
                Message::recycle(theirs);
            } else {
                sum(&mut output[part(k)], k);
            }
        }
        drop(inputs);
        if let Some(finished) = finished {
            Message::recycle(finished);
        }
        let pairs: Vec<usize> = (0..n).filter(|&k| k != p && (lent_to[k] || lent_by(k).is_some())).collect();
        for &k in &pairs {
            self.send(group[k], 2, &signature, Arc::clone(&final_word))?;
        }
        for &k in &pairs {
            self.receive(group[k], 2, &signature)?;
        }
        // What the peers sent is kept for later calls, or released to them.
        theirs.into_iter().flatten().for_each(Message::recycle);
        if let Some(counted) = counting {
            counted.set(Some(non_finite.get()));
        }
        Ok(())
    }

    /// The error of a message from `peer` that is not what the operation needs.
    fn malformed(&self, peer: u32, what: impl std::fmt::Display) -> NrtError {
        NrtError::new(
            NrtStatus::ExecHwErrCollectives,
            format!(
                "collectives of {}: {} sent {what} for {}, which does not fit it",
                self.communicator.inner.name,
                self.roster.describe(peer),
                self.signature
            ),
        )
    }

    fn key(&self, step: u32, from: u32, to: u32) -> Key {
        Key { comm: self.membership.comm, unit: self.at.unit, index: self.at.index, step, from, to }
    }

    fn process_of(&self, rank: u32) -> u32 {
        self.roster.rank_process[rank as usize]
    }

    /// What a message of this rank says beside its bytes: the signature, and the
    /// arrivals it knows of (unless the flight record is off).
    fn stamp(&self, signature: &str) -> Stamp {
        let arrivals = if self.communicator.inner.record.is_some() { self.known.borrow().clone() } else { Vec::new() };
        Stamp { signature: signature.to_owned(), arrivals }
    }

    fn send(&self, to: u32, step: u32, signature: &str, data: Arc<Message>) -> NrtResult<()> {
        let key = self.key(step, self.rank, to);
        self.membership
            .world
            .send(self.process_of(to), key, &self.stamp(signature), Ok(data), self.deadline)
            .map_err(|missed| self.missed(to, missed))
    }

    /// Adds the arrivals a message brought to those this rank knows of.
    fn learn(&self, arrivals: &[Arrival]) {
        let mut known = self.known.borrow_mut();
        for arrival in arrivals {
            if !known.iter().any(|k| k.rank == arrival.rank) {
                known.push(*arrival);
                self.communicator.record_arrived(*arrival, self.at, self.signature.op);
            }
        }
    }

    fn receive(&self, from: u32, step: u32, signature: &str) -> NrtResult<Arc<Message>> {
        let key = self.key(step, from, self.rank);
        let (world, process) = (&self.membership.world, self.process_of(from));
        let report_at = self.started() + report_after(self.communicator.inner.timeout);
        let received = match world.receive(process, key, self.deadline.min(report_at)) {
            Err(Missed::Timeout) if report_at < self.deadline => {
                self.report_waiting(from);
                world.receive(process, key, self.deadline)
            }
            received => received,
        };
        let parcel = received.map_err(|missed| self.missed(from, missed))?;
        self.learn(&parcel.stamp.arrivals);
        if parcel.stamp.signature != signature {
            return Err(NrtError::invalid(format!(
                "collectives of {} do not match: {} called {signature}, but {} called {}",
                self.communicator.inner.name,
                self.roster.describe(self.rank),
                self.roster.describe(from),
                parcel.stamp.signature
            )));
        }
        Ok(parcel.data)
    }

    fn started(&self) -> Instant {
        self.deadline.checked_sub(self.communicator.inner.timeout).unwrap_or(self.deadline)
    }

    /// `rank 3 (pid 4321 on host h2), last seen executing `train_step` at `dot.12` 0.4 s
    /// ago`: where rank `rank` runs, and what its process said it was doing last.
    fn describe_now(&self, rank: u32) -> String {
        let process = self.process_of(rank);
        if process == self.roster.process {
            return self.roster.describe(rank);
        }
        // A process of this host is looked at directly: stopped, or gone.
        let looked = self.roster.peers.get(process as usize).and_then(Option::as_ref).and_then(|peer| {
            let here = self.roster.same_host(process, self.roster.process);
            match here.then(|| neuron_datastore::process_status(peer.pid))? {
                None => Some("its process is gone"),
                Some(status) if status.state == 'T' => Some("its process is stopped by a signal (SIGSTOP, Ctrl-Z)"),
                Some(status) if status.state == 't' => Some("its process is stopped by a debugger"),
                Some(_) => None,
            }
        });
        let said = match (looked, self.membership.world.heard(process)) {
            (None, None) => String::new(),
            (Some(state), None) => format!(", {state}"),
            (None, Some((heard, now_ns))) => format!(", {}", heard.describe(now_ns)),
            (Some(state), Some((heard, now_ns))) => format!(
                ", {state}: no heartbeat for {}; it last said it was {}",
                neuron_datastore::ranks::format_ns(now_ns.saturating_sub(heard.at_ns)),
                heard.doing()
            ),
        };
        format!("{}{said}", self.roster.describe(rank))
    }

    /// Says once that this rank's operation has waited long for `peer`.
    fn report_waiting(&self, peer: u32) {
        if !self.reported.replace(true) {
            let operation = (self.signature.op, self.signature.group.len());
            let described = self.describe_now(peer);
            self.communicator.report_waiting(self.rank, self.at, operation, peer, &described, self.started());
        }
    }

    /// The error of a message from or to `peer` that did not get through: what went
    /// wrong first (the rank that never arrived, died, or whose link failed), then the
    /// Neuron runtime's line for this rank.
    fn missed(&self, peer: u32, missed: Missed) -> NrtError {
        let peer_rank = peer;
        let hang = self.communicator.missing_message(self.rank, self.at);
        let operation = self.communicator.operation_at(self.at, (self.signature.op, self.signature.group.len()));
        let peer = self.roster.describe(peer);
        match missed {
            Missed::Timeout => {
                let timeout = self.communicator.inner.timeout.as_secs_f64();
                // A peer whose arrival this rank heard of reached the collective and waits
                // itself (a ring passes data on only once it has its own): the ranks not
                // heard of are the likelier cause.
                let known = self.known.borrow();
                let heard = |r: u32| r == self.rank || known.iter().any(|a| a.rank == r);
                let unheard: Vec<String> =
                    self.signature.group.iter().copied().filter(|&r| !heard(r)).map(|r| r.to_string()).collect();
                let root = if !heard(peer_rank) || unheard.is_empty() {
                    format!(
                        "{} never reached {operation}: no word from it within {timeout:.3} s",
                        self.describe_now(peer_rank)
                    )
                } else {
                    format!(
                        "{} {} of the group never reached {operation} (no word within {timeout:.3} s), {peer} \
                         reached it and waits too",
                        if unheard.len() == 1 { "rank" } else { "ranks" },
                        unheard.join(", ")
                    )
                };
                NrtError::new(NrtStatus::ExecHwErrCollectives, root_first(&root, &hang))
            }
            Missed::Gone(reason) => {
                let process = self.process_of(peer_rank);
                let ranks = (0..self.roster.rank_process.len() as u32).filter(|&r| self.process_of(r) == process);
                self.communicator.record_gone(ranks);
                let root = format!("{peer} died during {operation}: its process is gone ({reason})");
                NrtError::new(NrtStatus::NetworkProxyFailure, root_first(&root, &hang))
            }
            // The reason is the other rank's root cause, then who gave up.
            Missed::Aborted(reason) => NrtError::new(NrtStatus::ExecHwErrCollectives, format!("{reason}; {hang}")),
            Missed::LinkDown(reason) => {
                let root = format!("the link to {peer} failed during {operation}: {reason}");
                NrtError::new(NrtStatus::NetworkProxyFailure, root_first(&root, &hang))
            }
        }
    }

    /// Tells every other rank of the group that this rank's operation failed, and why
    /// first.
    fn abort(&self, plan: &Plan, error: &NrtError) {
        let reason = format!("{}; {} gave the operation up", root_of(&error.message), self.roster.describe(self.rank));
        let deadline = Instant::now() + ABORT_NOTICE;
        for &peer in plan.group.iter().filter(|&&r| r != self.rank) {
            let key = self.key(u32::MAX, self.rank, peer);
            let stamp = Stamp::default();
            let _ = self.membership.world.send(self.process_of(peer), key, &stamp, Err(reason.clone()), deadline);
        }
    }
}
