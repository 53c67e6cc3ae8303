//! The meeting protocol: each rank's units, the meeting of a group in one operation,
//! its checks, its failures (a rank missing at the deadline, a mismatched request) and
//! how the ranks resynchronise after one; send and receive between two ranks.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::algorithms::{direct, local, ring};
use super::{Algorithm, Collective, Communicator, Message, OpPosition, Request, choose_algorithm, flight};
use crate::dtype::DType;
use crate::error::{NrtError, NrtResult, NrtStatus};
use crate::isa::{format_group, format_groups};
use crate::tensor::Tensor;
use neuron_datastore::clock::ticks;
use neuron_datastore::counters::core as counter;
use neuron_datastore::event::{EventType, payload};
use neuron_datastore::{At, EventIds};

/// A collective failure's message: its root cause first, then what it did here (the
/// parts after the first `; `). The root cause has no `; ` of its own, so that
/// [`root_of`] finds it again in a message passed on to another rank.
pub(super) fn root_first(root: &str, chain: &str) -> String {
    format!("{}; {chain}", root.replace("; ", ", "))
}

/// The root cause of a message [`root_first`] made (all of any other message).
pub(super) fn root_of(message: &str) -> &str {
    message.split_once("; ").map_or(message, |(root, _)| root)
}

#[derive(Debug, Default)]
pub(super) struct State {
    /// Open meetings by (unit, operation within the unit, group index).
    meetings: HashMap<(u64, u32, usize), Meeting>,
    /// Per rank, the next unit (an execution of a model, or one API call).
    next_unit: Vec<u64>,
    /// Units below this were abandoned by some rank: every rank starts at least here.
    resync: u64,
    /// Sent and not yet received, by (sender, receiver).
    mailboxes: HashMap<(u32, u32), VecDeque<Vec<u8>>>,
}

impl State {
    /// No meeting open and every one of `ranks` ranks at its first unit.
    pub(super) fn new(ranks: usize) -> State {
        State { next_unit: vec![0; ranks], ..State::default() }
    }
}

/// The ranks of one group in one operation.
#[derive(Debug)]
struct Meeting {
    /// What the first rank asked for; every other rank must ask for the same.
    signature: Signature,
    /// Each position's input, once its rank has arrived with a matching request.
    inputs: Vec<Option<Arc<Message>>>,
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
pub(super) struct Signature {
    pub(super) op: Collective,
    dtype: DType,
    pub(super) group: Vec<u32>,
    input_bytes: usize,
    output_bytes: usize,
    outer: usize,
    algorithm: Algorithm,
}

impl std::fmt::Display for Signature {
    /// `AllReduce(Add) of f32 in group {0,1}, 64 bytes in, 64 out, all-to-all algorithm`
    /// (with the rows exchanged along when more than one): what ranks of one operation
    /// must agree on, in words both sides of a mismatch can be named in.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} of {} in group {}, {} bytes in, {} out",
            self.op,
            self.dtype,
            format_group(&self.group),
            self.input_bytes,
            self.output_bytes
        )?;
        if self.outer > 1 {
            write!(f, " in {} rows", self.outer)?;
        }
        write!(f, ", {} algorithm", self.algorithm.name())
    }
}

#[derive(Debug, Clone)]
enum Failure {
    /// Positions that had not arrived when a rank's wait ran out.
    Missing(Vec<usize>),
    Mismatch(String),
}

/// What a checked request does: its group, the rank's position in it, the algorithm.
pub(super) struct Plan {
    group_index: usize,
    pub(super) group: Vec<u32>,
    pub(super) position: usize,
    pub(super) algorithm: Algorithm,
}

/// How long a collective waits for a rank before the waiting rank
/// says so (once, in a log line and a `cc_waiting` event): 5 s, or half the timeout
/// when that is shorter.
pub fn report_after(timeout: Duration) -> Duration {
    REPORT_AFTER.min(timeout / 2)
}

const REPORT_AFTER: Duration = Duration::from_secs(5);

impl Communicator {
    /// Starts rank `rank`'s next unit (an execution or an API call) and returns its
    /// number: its own next one, or later if the ranks were resynchronised after an
    /// abandoned operation.
    pub(crate) fn begin(&self, rank: u32) -> u64 {
        let mut state = self.lock();
        let unit = state.next_unit[rank as usize].max(state.resync);
        state.next_unit[rank as usize] = unit + 1;
        drop(state);
        self.record_enqueued(rank, unit);
        unit
    }

    /// Checks a request of rank `rank` (its groups split the ranks, its sizes fit the
    /// operation) and works out its group, position and algorithm.
    fn plan(&self, rank: u32, request: &Request<'_>) -> NrtResult<Plan> {
        let Request { op, dtype, groups, algorithm, outer, .. } = *request;
        let (input_len, output_len) = (request.input_len(), request.output.len());
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
        let place = self.own_place(rank)?;
        let (input_len, output_len) = (request.input_len(), request.output.len());
        let mut plan = self.plan(rank, &request)?;
        if request.algorithm.is_none()
            && matches!(request.op, Collective::AllReduce(_))
            && self.spans_processes_of_this_host(&plan.group, deadline)
        {
            plan.algorithm = Algorithm::AllToAll;
        }
        let at = at();
        let (n, algorithm) = (plan.group.len(), plan.algorithm);
        let group_name = inner.tracer.store().intern(&format_group(&plan.group));
        let tracer = &inner.tracer;
        let bytes = input_len.max(output_len) as u64;
        let operation = request.op.kind();
        let collective = |status: Option<NrtStatus>| payload::Collective {
            operation,
            algorithm,
            bytes,
            replica_group: group_name,
            op_id: at.index,
            rank,
            sequence: at.unit as u32,
            communicator: inner.id,
            status: status.map(NrtStatus::code),
        };
        let started = ticks();
        let running = tracer.span(place.ring, EventType::CcRunning, ids);
        tracer.open(At::Ticks(started), &running, collective(None));
        let arrived = self.record_started(rank, at, operation);
        let signature = Signature {
            op: request.op,
            dtype: request.dtype,
            group: plan.group.clone(),
            input_bytes: input_len,
            output_bytes: output_len,
            outer: request.outer,
            algorithm,
        };
        let result = if let Some(membership) = inner.membership.as_ref().filter(|_| n > 1) {
            self.meet_across(membership, rank, at, &plan, (signature, arrived), request, deadline)
        } else {
            // Lending is between processes only.
            let mut request = request;
            request.unlend(self);
            if n == 1 {
                local(request);
                Ok(Vec::new())
            } else {
                self.meet(rank, at, &plan, signature, request, deadline).map(|()| Vec::new())
            }
        };
        let done = flight::Done { operation, algorithm, group: plan.group_index, bytes, arrived };
        self.record_done(rank, at, &done, result.as_deref().unwrap_or_default(), result.is_ok());
        let result = result.map(drop);
        let status = result.as_ref().err().map(|e| e.status);
        if running.tracking_id != 0 {
            tracer.stop(&running, collective(status));
        }
        if let Some(slot) = place.slot {
            tracer.add(slot, counter::COLLECTIVES, 1);
            tracer.add(slot, counter::COLLECTIVES_NS, tracer.ticks_to_ns(ticks().saturating_sub(started)));
        }
        result.map(|()| algorithm)
    }

    pub(super) fn meet(
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
                let detail = format!("rank {rank} called {signature}, but its group called {}", meeting.signature);
                meeting.failure = Some(Failure::Mismatch(detail));
            }
            state.resync = state.resync.max(at.unit + 1);
            self.inner.changed.notify_all();
        } else {
            meeting.inputs[position] = Some(Arc::clone(&request.input));
            if meeting.inputs.iter().all(Option::is_some) {
                self.inner.changed.notify_all();
            }
        }
        // Wait for the group, the deadline, or another rank's failure; a long wait is
        // said once (as across processes).
        let started = deadline.checked_sub(self.inner.timeout).unwrap_or(deadline);
        let report_at = started + report_after(self.inner.timeout);
        let mut reported = false;
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
            if !reported && now >= report_at {
                reported = true;
                if let Some(p) = (0..n).find(|&p| meeting.inputs[p].is_none()) {
                    self.report_waiting(rank, at, (signature.op, n), group[p], &format!("rank {}", group[p]), started);
                }
            }
            if at.unit < state.resync {
                // Another group of this unit lost a rank: the ranks this one waits for
                // have moved on to their next unit.
                self.leave(&mut state, key, n);
                drop(state);
                return Err(self.abandoned(rank, at));
            }
            let wake = if reported { deadline } else { report_at.min(deadline) };
            state = self.inner.changed.wait_timeout(state, wake - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        let meeting = state.meetings.get(&key).unwrap_or_else(|| unreachable!("an open meeting is kept"));
        let inputs: Vec<Arc<Message>> = meeting.inputs.iter().flatten().cloned().collect();
        let to_next = meeting.channels[(position + 1) % n].0.clone();
        let from_previous = meeting.channels[position].1.clone();
        drop(state);

        let moved = match signature.algorithm {
            Algorithm::Ring => ring(&mut request, position, n, |part| {
                to_next.send(part.to_vec()).map_err(drop)?;
                from_previous.recv_deadline(deadline).map_err(drop)
            }),
            Algorithm::AllToAll => {
                direct(&mut request, position, &inputs.iter().map(|input| &input[..]).collect::<Vec<_>>());
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
                let root = format!(
                    "rank {} of replica group {} did not arrive within {:.3} s",
                    missing.join(", "),
                    format_group(group),
                    self.inner.timeout.as_secs_f64()
                );
                NrtError::new(NrtStatus::ExecHwErrCollectives, root_first(&root, &self.missing_message(rank, at)))
            }
            Failure::Mismatch(detail) => {
                NrtError::invalid(format!("collectives of {} do not match: {detail}", self.inner.name))
            }
        }
    }

    /// `all-reduce #12 of comm `grads` (4 ranks)`: the operation at `at`, of `op` in a
    /// group of `ranks`.
    pub(super) fn operation_at(&self, at: OpPosition, (op, ranks): (Collective, usize)) -> String {
        format!("{} #{} of comm `{}` ({ranks} ranks)", op.name(), at.unit, self.inner.name)
    }

    /// The Neuron runtime's message for a rank whose group never completed.
    /// `all-reduce #12 of comm `grads` (4 ranks): waiting 5.0 s for rank 3 (pid 4321 on
    /// host h2)`: rank `rank`'s operation at `at`, of `op` in a group of `ranks`, waiting
    /// since `started` for `peer` (as described).
    pub(super) fn waiting_for(
        &self,
        at: OpPosition,
        (op, ranks): (Collective, usize),
        peer: &str,
        started: Instant,
    ) -> String {
        format!("{}: waiting {:.1} s for {peer}", self.operation_at(at, (op, ranks)), started.elapsed().as_secs_f64())
    }

    /// Says that rank `rank`'s operation waits long for rank `peer`: a warning, and a
    /// `cc_waiting` event on the rank's core (once per operation: the callers see to it).
    pub(super) fn report_waiting(
        &self,
        rank: u32,
        at: OpPosition,
        operation: (Collective, usize),
        peer: u32,
        described: &str,
        started: Instant,
    ) {
        // At the error level, which the runtime logs by default: a job that waits this
        // long is hung or has a straggler, and its user needs to hear of it now.
        tracing::error!("{}", self.waiting_for(at, operation, described, started));
        self.record_waiting(rank, started, peer);
        if let Some(place) = self.place(rank) {
            let waited = payload::CcWaiting {
                peer,
                sequence: at.unit as u32,
                communicator: self.inner.id,
                rank,
                waited_ns: started.elapsed().as_nanos() as u64,
            };
            self.inner.tracer.instant(place.ring, EventType::CcWaiting, EventIds::default(), waited);
        }
    }

    pub(super) fn missing_message(&self, rank: u32, at: OpPosition) -> String {
        let (device, local) = self.place(rank).map_or((0, rank), |p| (p.device, p.local));
        format!(
            "missing collectives status on Neuron Device {device} NC {local}, model {} - suspected hang in collectives operation {} out of {}",
            self.inner.name, at.index, at.count
        )
    }

    pub(super) fn send(&self, rank: u32, peer: u32, data: Vec<u8>, deadline: Instant) -> NrtResult<()> {
        self.check_rank(peer)?;
        // A peer in another process of the job gets it through the job's links.
        let Some(data) = self.send_across(rank, peer, data, deadline)? else { return Ok(()) };
        let mut state = self.lock();
        state.mailboxes.entry((rank, peer)).or_default().push_back(data);
        self.inner.changed.notify_all();
        Ok(())
    }

    pub(super) fn recv(&self, rank: u32, peer: u32, output: &Tensor, deadline: Instant) -> NrtResult<()> {
        self.check_rank(peer)?;
        let place = self.own_place(rank)?;
        if let Some(data) = self.recv_across(rank, peer, deadline)? {
            return self.received(rank, peer, output, &data);
        }
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
        self.received(rank, peer, output, &data)
    }

    /// Writes what `peer` sent into `rank`'s output, which must be its size.
    fn received(&self, rank: u32, peer: u32, output: &Tensor, data: &[u8]) -> NrtResult<()> {
        if data.len() as u64 != output.size() {
            return Err(NrtError::invalid(format!(
                "rank {peer} sent {} bytes but rank {rank}'s output `{}` holds {}",
                data.len(),
                output.name(),
                output.size()
            )));
        }
        output.write(0, data)
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
