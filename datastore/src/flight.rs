//! The flight record: what each rank of each communicator a process takes part in has
//! done, written by the runtime as its collectives run and read by the tools.
//!
//! A slot per communicator (at most [`COMM_SLOTS`] at once) holds a row per rank:
//! where it runs (pid, host, core), the last collective it was given (enqueued),
//! reached (started) and left (completed), whether it is waiting long for another
//! rank; and the rank's last [`COMM_HISTORY`] collectives: when it arrived and left,
//! on the job's one clock (the root's host clock, see [`DatastoreWriter::set_clock_offset`]).
//! A process records its own ranks and, as the collectives' messages tell it, when the
//! other ranks of their groups arrived; so every process holds its groups' whole
//! table, and the tools of any host where a rank runs show every rank.
//!
//! Rows are written by one thread each (a rank's own, or for a rank of another process
//! the lowest rank of this process in its group), so a row needs no lock: each word
//! is atomic, and a history entry is published by its tag word, written last. The
//! reading side is `reader/flight.rs`; the rules that name stragglers and hangs from
//! it are in [`crate::ranks`].

use std::sync::atomic::{Ordering, fence};

use serde::Serialize;

use crate::DatastoreWriter;
use crate::kinds::{CollectiveAlgorithm, CollectiveOp};
use crate::layout::{self, COMM_HISTORY, COMM_RANKS, COMM_SLOTS, comm};

pub use crate::layout::{COMM_HISTORY as HISTORY, COMM_RANKS as MAX_RANKS, COMM_SLOTS as SLOTS};

/// A communicator, as its slot describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommunicatorEntry {
    /// The id `cc_running` events carry: the same in every process of the job.
    pub id: u32,
    pub name: String,
    pub ranks: u32,
    /// Its ranks are in several processes.
    pub across: bool,
}

/// Where a rank runs, as the process recording it knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankMember {
    pub pid: u32,
    /// The host's name.
    pub host: String,
    /// Its NeuronCore, for a rank of this process.
    pub core: Option<u32>,
    pub in_this_process: bool,
}

/// A collective's place in a rank's sequence: the rank's unit (an execution of a
/// model, or one API call: the `sequence` of `cc_running` events, the same in every
/// rank that met) and the collective's index within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Position {
    pub sequence: u32,
    pub index: u16,
}

impl Position {
    fn word(self) -> u64 {
        (u64::from(self.sequence) + 1) & 0xffff_ffff | u64::from(self.index) << 32
    }

    /// The position a word holds (`None` for 0: nothing yet).
    pub(crate) fn of_word(word: u64) -> Option<Position> {
        let sequence = (word & 0xffff_ffff) as u32;
        (sequence != 0).then(|| Position { sequence: sequence - 1, index: (word >> 32) as u16 })
    }
}

impl std::fmt::Display for Position {
    /// `#12`, or `#12.3` for the fourth collective of unit 12.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.index {
            0 => write!(f, "#{}", self.sequence),
            index => write!(f, "#{}.{index}", self.sequence),
        }
    }
}

/// One collective of one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CollectiveEntry {
    pub position: Position,
    #[serde(serialize_with = "serialize_op")]
    pub operation: CollectiveOp,
    #[serde(serialize_with = "serialize_algorithm")]
    pub algorithm: CollectiveAlgorithm,
    /// The replica group's index among the call's groups (0 for one group of all).
    pub group: u16,
    pub bytes: u64,
    /// When the rank reached the collective and left it, root clock ns (`departed_ns`
    /// unknown for a rank of another process).
    pub arrived_ns: u64,
    pub departed_ns: Option<u64>,
    /// What the rank did between its previous collective and this arrival, as it said
    /// (`None` at its first collective, or where not known).
    pub before: Option<Before>,
}

/// A rank's time from its previous collective's end to its arrival at the next, at
/// microsecond grain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Before {
    pub since_ns: u64,
    /// The part of it inside its executions (the rest is host time: between executions,
    /// runtime calls, inputs).
    pub executing_ns: u64,
    /// The engine its instructions kept busiest meanwhile, and for how long.
    pub busiest: Option<(crate::Engine, u64)>,
}

impl Before {
    /// The entry's word: microseconds since + 1 in bits 0–31 (0: not known), of them
    /// executing in bits 32–63, each at most `u32::MAX − 1`.
    fn word(self) -> u64 {
        let us = |ns: u64| (ns / 1_000).min(u64::from(u32::MAX - 1));
        (us(self.since_ns) + 1) | us(self.executing_ns) << 32
    }

    fn of_words(word: u64, busiest: u64) -> Option<Before> {
        let since = (word & 0xffff_ffff).checked_sub(1)?;
        let engine = ((busiest >> 56) as u8).checked_sub(1).and_then(crate::Engine::from_repr);
        let busiest = engine.map(|e| (e, (busiest & 0x00ff_ffff_ffff_ffff) * 1_000));
        Some(Before { since_ns: since * 1_000, executing_ns: (word >> 32) * 1_000, busiest })
    }

    /// The busiest engine's word: its code + 1 in bits 56–63 (0: none), microseconds in
    /// bits 0–55.
    fn busiest_word(self) -> u64 {
        self.busiest.map_or(0, |(engine, ns)| (u64::from(engine as u8) + 1) << 56 | (ns / 1_000).min((1 << 56) - 1))
    }
}

fn serialize_op<S: serde::Serializer>(op: &CollectiveOp, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(op.name())
}

fn serialize_algorithm<S: serde::Serializer>(algorithm: &CollectiveAlgorithm, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(algorithm.name())
}

impl CollectiveEntry {
    fn tag(&self) -> u64 {
        self.position.word() | u64::from(self.operation as u8) << 48 | u64::from(self.algorithm as u8) << 56
    }

    /// The entry a tag and its five words describe (`None` for an empty or unknown tag).
    pub(crate) fn of_words([tag, arrived, departed, bytes, before, busiest]: [u64; 6]) -> Option<CollectiveEntry> {
        Some(CollectiveEntry {
            position: Position::of_word(tag & 0xffff_ffff_ffff)?,
            operation: CollectiveOp::from_repr((tag >> 48) as u8)?,
            algorithm: CollectiveAlgorithm::from_repr((tag >> 56) as u8)?,
            group: (bytes >> 48) as u16,
            bytes: bytes & 0xffff_ffff_ffff,
            arrived_ns: arrived,
            departed_ns: (departed != 0).then_some(departed),
            before: Before::of_words(before, busiest),
        })
    }
}

/// How a job admits its processes (the runtime's `NEURON_VIRT_JOB_SECRET`,
/// `NEURON_VIRT_TRUSTED_NETWORK`): what every tool says of a job across processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobAdmission {
    /// Processes that prove they hold the job's secret.
    Secret,
    /// No secret: processes of one user on one host.
    ThisUser,
    /// No secret, and the network said trusted: anyone who speaks the protocol.
    TrustedNetwork,
}

impl JobAdmission {
    fn code(self) -> u64 {
        match self {
            JobAdmission::Secret => 1,
            JobAdmission::ThisUser => 2,
            JobAdmission::TrustedNetwork => 3,
        }
    }

    pub(crate) fn of_code(code: u64) -> Option<JobAdmission> {
        match code {
            1 => Some(JobAdmission::Secret),
            2 => Some(JobAdmission::ThisUser),
            3 => Some(JobAdmission::TrustedNetwork),
            _ => None,
        }
    }

    /// `admits processes holding the job's secret`, for a tool's line.
    pub fn describe(self) -> &'static str {
        match self {
            JobAdmission::Secret => "admits processes holding the job's secret",
            JobAdmission::ThisUser => "admits this user's processes of this host (no job secret)",
            JobAdmission::TrustedNetwork => "trusts its network: anyone who speaks its protocol joins (no job secret)",
        }
    }
}

/// A process heard from last this long ago has stopped, or its host is unreachable:
/// processes say what they do about once a second.
pub const STALE_HEARTBEAT_NS: u64 = 3_000_000_000;

/// What a rank's process last said it was doing (its heartbeat to the job's other
/// processes, about once a second), as the process recording it heard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Heard {
    /// When rank 0's process heard it, root clock ns.
    pub at_ns: u64,
    /// The first model it was executing, and the HLO instruction that execution was
    /// at, when known (`None`: it was in no execution).
    pub executing: Option<(String, Option<String>)>,
    /// How many models it was executing.
    pub models: u32,
}

impl Heard {
    /// What a process executing `executing` (each model's name and instruction) said
    /// at `at_ns`.
    pub fn of(at_ns: u64, executing: &[(String, Option<String>)]) -> Heard {
        Heard { at_ns, executing: executing.first().cloned(), models: executing.len() as u32 }
    }

    /// `executing `train_step` at `dot.12``, `executing `a` and 1 more model`, or `in no
    /// execution (in the program, between runtime calls)`.
    pub fn doing(&self) -> String {
        match &self.executing {
            None => "in no execution (in the program, between runtime calls)".to_owned(),
            Some((model, at)) => {
                let at = at.as_ref().map_or_else(String::new, |at| format!(" at `{at}`"));
                let more = match self.models.saturating_sub(1) {
                    0 => String::new(),
                    1 => " and 1 more model".to_owned(),
                    n => format!(" and {n} more models"),
                };
                format!("executing `{model}`{at}{more}")
            }
        }
    }

    /// `last seen executing `train_step` at `dot.12` 1.2 s ago`, at root clock `now_ns`;
    /// when nothing was heard for [`STALE_HEARTBEAT_NS`] or longer, `stopped: no
    /// heartbeat for 4.8 s (or its host is unreachable); it last said it was executing …`.
    pub fn describe(&self, now_ns: u64) -> String {
        let age = now_ns.saturating_sub(self.at_ns);
        let age_text = crate::clock::format_ns(age);
        if age >= STALE_HEARTBEAT_NS {
            format!(
                "stopped: no heartbeat for {age_text} (or its host is unreachable); it last said it was {}",
                self.doing()
            )
        } else {
            format!("last seen {} {age_text} ago", self.doing())
        }
    }
}

/// Which of a rank's sequence words a call moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The rank was given the unit (an execution or call begins).
    Enqueued,
    /// The rank reached the collective, of this operation.
    Started(CollectiveOp),
    /// The rank left it, done.
    Completed,
}

/// A communicator's slot in this process's flight record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommSlot(u32);

impl DatastoreWriter {
    /// Records no communicator from now on (`NEURON_VIRT_FLIGHT_RECORD=false`).
    pub fn turn_flight_record_off(&self) {
        *self.comm_slots.lock().unwrap_or_else(|e| e.into_inner()) = Vec::new();
    }

    /// Takes a slot for `entry`; `None` when every slot is taken (counted) or the
    /// flight record is off.
    pub fn open_communicator(&self, entry: &CommunicatorEntry) -> Option<CommSlot> {
        let mut slots = self.comm_slots.lock().unwrap_or_else(|e| e.into_inner());
        if slots.is_empty() {
            return None;
        }
        let name = self.intern(&entry.name);
        let Some(slot) = slots.iter().position(|taken| !taken) else {
            self.region
                .u64(self.layout.process_word(layout::process::COMM_SLOTS_OVERFLOWED))
                .fetch_add(1, Ordering::Relaxed);
            return None;
        };
        slots[slot] = true;
        let slot = slot as u32;
        let (r, base) = (&self.region, self.layout.comm_slot(slot));
        let seq = r.u64(base + comm::SEQ);
        let odd = seq.load(Ordering::Relaxed) + 1;
        seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        // A slot used before starts empty.
        for rank in 0..COMM_RANKS {
            let row = self.layout.comm_row(slot, rank);
            let used = |field| r.u64(row + field).load(Ordering::Relaxed) != 0;
            if used(comm::ROW_PID) || used(comm::ROW_RECORDED) || used(comm::ROW_ENQUEUED) {
                for word in 0..layout::COMM_ROW_BYTES / 8 {
                    r.u64(row + 8 * word).store(0, Ordering::Relaxed);
                }
                for k in 0..COMM_HISTORY {
                    r.u64(self.layout.comm_entry(slot, rank, k) + comm::ENTRY_TAG).store(0, Ordering::Relaxed);
                }
            }
        }
        r.u32(base + comm::ID).store(entry.id, Ordering::Relaxed);
        r.u32(base + comm::RANKS).store(entry.ranks, Ordering::Relaxed);
        r.u32(base + comm::NAME).store(name, Ordering::Relaxed);
        r.u32(base + comm::FLAGS).store(if entry.across { comm::ACROSS } else { 0 }, Ordering::Relaxed);
        seq.store(odd + 1, Ordering::Release);
        Some(CommSlot(slot))
    }

    /// Frees a communicator's slot. Its record stays, marked closed, until the slot is
    /// taken again: a tool that reads the process as it ends (`neuron-profile inspect`)
    /// still finds its ranks and members.
    pub fn close_communicator(&self, slot: CommSlot) {
        let mut slots = self.comm_slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(taken) = slots.get_mut(slot.0 as usize) {
            *taken = false;
            let base = self.layout.comm_slot(slot.0);
            let seq = self.region.u64(base + comm::SEQ);
            let odd = seq.load(Ordering::Relaxed) + 1;
            seq.store(odd, Ordering::Relaxed);
            fence(Ordering::Release);
            self.region.u32(base + comm::FLAGS).fetch_or(comm::CLOSED, Ordering::Relaxed);
            seq.store(odd + 1, Ordering::Release);
        }
    }

    /// Says where rank `rank` runs (ranks past [`MAX_RANKS`] are not recorded).
    pub fn set_rank_member(&self, slot: CommSlot, rank: u32, member: &RankMember) {
        let Some(row) = self.comm_row(slot, rank) else { return };
        let r = &self.region;
        r.u32(row + comm::ROW_PID).store(member.pid, Ordering::Relaxed);
        r.u32(row + comm::ROW_HOST).store(self.intern(&member.host), Ordering::Relaxed);
        r.u32(row + comm::ROW_CORE).store(member.core.map_or(0, |c| c + 1), Ordering::Relaxed);
        let flags = comm::ROW_KNOWN | if member.in_this_process { comm::ROW_IN_THIS_PROCESS } else { 0 };
        r.u32(row + comm::ROW_FLAGS).fetch_or(flags, Ordering::Release);
    }

    /// Says that rank `rank`'s process is gone.
    pub fn set_rank_gone(&self, slot: CommSlot, rank: u32) {
        if let Some(row) = self.comm_row(slot, rank) {
            self.region.u32(row + comm::ROW_FLAGS).fetch_or(comm::ROW_GONE, Ordering::Release);
        }
    }

    /// Moves one of rank `rank`'s sequence words to `position`.
    pub fn record_progress(&self, slot: CommSlot, rank: u32, progress: Progress, position: Position) {
        let Some(row) = self.comm_row(slot, rank) else { return };
        let field = match progress {
            Progress::Enqueued => comm::ROW_ENQUEUED,
            Progress::Started(operation) => {
                let code = u64::from(operation as u8) + 1;
                self.region.u64(row + comm::ROW_OPERATION).store(code, Ordering::Relaxed);
                comm::ROW_STARTED
            }
            Progress::Completed => comm::ROW_COMPLETED,
        };
        self.region.u64(row + field).store(position.word(), Ordering::Release);
    }

    /// Says that rank `rank` has waited since `since_ns` (root clock) for rank `peer`,
    /// or (`None`) that it no longer waits long.
    pub fn set_waiting(&self, slot: CommSlot, rank: u32, waiting: Option<(u64, u32)>) {
        let Some(row) = self.comm_row(slot, rank) else { return };
        let (since, peer) = waiting.map_or((0, 0), |(since, peer)| (since.max(1), u64::from(peer) + 1));
        self.region.u64(row + comm::ROW_WAITING_FOR).store(peer, Ordering::Relaxed);
        self.region.u64(row + comm::ROW_WAITING_SINCE).store(since, Ordering::Release);
    }

    /// Records what the process of rank `rank` (another process) said it was doing, as
    /// rank 0's process heard it at `heard.at_ns` (root clock). Its model's and
    /// instruction's names are interned (names the job's processes share), never the
    /// sentence.
    pub fn set_rank_heard(&self, slot: CommSlot, rank: u32, heard: &Heard) {
        let Some(row) = self.comm_row(slot, rank) else { return };
        let (model, at) = match &heard.executing {
            Some((model, at)) => (self.intern(model), at.as_deref().map_or(0, |at| self.intern(at))),
            None => (0, 0),
        };
        let doing = (u64::from(heard.models.min(0xffff)) + 1) << 32 | u64::from(model);
        self.region.u64(row + comm::ROW_DOING).store(doing, Ordering::Relaxed);
        self.region.u64(row + comm::ROW_DOING_AT).store(u64::from(at), Ordering::Relaxed);
        self.region.u64(row + comm::ROW_HEARD_AT).store(heard.at_ns.max(1), Ordering::Release);
    }

    /// Says how far rank `rank`'s clock may be off the root's (its process's
    /// uncertainty, as its messages tell).
    pub fn set_rank_uncertainty(&self, slot: CommSlot, rank: u32, uncertainty_ns: u64) {
        if let Some(row) = self.comm_row(slot, rank) {
            self.region.u64(row + comm::ROW_UNCERTAINTY).store(uncertainty_ns, Ordering::Relaxed);
        }
    }

    /// Adds a collective to rank `rank`'s history, over its oldest.
    pub fn record_collective(&self, slot: CommSlot, rank: u32, entry: &CollectiveEntry) {
        let Some(row) = self.comm_row(slot, rank) else { return };
        let r = &self.region;
        let k = r.u64(row + comm::ROW_RECORDED).fetch_add(1, Ordering::Relaxed);
        let at = self.layout.comm_entry(slot.0, rank, (k % u64::from(COMM_HISTORY)) as u32);
        let tag = r.u64(at + comm::ENTRY_TAG);
        tag.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        r.u64(at + comm::ENTRY_ARRIVED).store(entry.arrived_ns, Ordering::Relaxed);
        r.u64(at + comm::ENTRY_DEPARTED).store(entry.departed_ns.unwrap_or(0), Ordering::Relaxed);
        let bytes = entry.bytes.min(0xffff_ffff_ffff) | u64::from(entry.group) << 48;
        r.u64(at + comm::ENTRY_BYTES).store(bytes, Ordering::Relaxed);
        r.u64(at + comm::ENTRY_BEFORE).store(entry.before.map_or(0, Before::word), Ordering::Relaxed);
        r.u64(at + comm::ENTRY_BUSIEST).store(entry.before.map_or(0, Before::busiest_word), Ordering::Relaxed);
        tag.store(entry.tag(), Ordering::Release);
    }

    /// Records this process's clock against the root's: the root's host clock minus
    /// this process's, and the most that may be off by.
    pub fn set_clock_offset(&self, offset_ns: i64, uncertainty_ns: u64) {
        use layout::process::{CLOCK_OFFSET, CLOCK_SEQ, CLOCK_UNCERTAINTY};
        self.set_process_words(
            CLOCK_SEQ,
            [(CLOCK_OFFSET, offset_ns as u64), (CLOCK_UNCERTAINTY, uncertainty_ns.max(1))],
        );
    }

    /// Records how this process's job admits its processes.
    pub fn set_job_admission(&self, admission: JobAdmission) {
        let word = self.region.u64(self.layout.process_word(layout::process::JOB_ADMISSION));
        word.store(admission.code(), std::sync::atomic::Ordering::Relaxed);
    }

    fn comm_row(&self, slot: CommSlot, rank: u32) -> Option<u64> {
        (slot.0 < COMM_SLOTS && rank < COMM_RANKS).then(|| self.layout.comm_row(slot.0, rank))
    }
}
