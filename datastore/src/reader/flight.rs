//! Reading the flight record (`flight.rs` says what it holds and who writes it).

use std::sync::atomic::{Ordering, fence};

use serde::Serialize;

use super::DatastoreReader;
use crate::flight::{CollectiveEntry, Heard, Position};
use crate::kinds::CollectiveOp;
use crate::layout::{self, COMM_HISTORY, COMM_RANKS, COMM_SLOTS, comm};

/// A communicator's slot, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommunicatorRecord {
    pub id: u32,
    pub name: String,
    pub ranks: u32,
    pub across: bool,
    /// The ranks this process knows of (at most [`crate::flight::MAX_RANKS`]), by rank.
    pub members: Vec<RankRecord>,
}

impl CommunicatorRecord {
    /// The slot's header without its ranks.
    pub fn clone_header(&self) -> CommunicatorRecord {
        CommunicatorRecord {
            id: self.id,
            name: self.name.clone(),
            ranks: self.ranks,
            across: self.across,
            members: Vec::new(),
        }
    }
}

/// One rank's row and history, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankRecord {
    pub rank: u32,
    /// Where it runs (0 and empty while this process does not know).
    pub pid: u32,
    pub host: String,
    pub core: Option<u32>,
    pub in_this_process: bool,
    /// Its process is gone.
    pub gone: bool,
    pub enqueued: Option<Position>,
    pub started: Option<Position>,
    /// The operation of the collective it started last.
    #[serde(serialize_with = "serialize_op")]
    pub operation: Option<CollectiveOp>,
    pub completed: Option<Position>,
    /// The most its clock may be off the root's, ns (0: not known here).
    pub uncertainty_ns: u64,
    /// Since when (root clock ns) it has waited long for which rank.
    pub waiting: Option<(u64, u32)>,
    /// Its last collectives, oldest first.
    pub history: Vec<CollectiveEntry>,
    /// For a rank of another process: what its process last said it was doing.
    pub heard: Option<Heard>,
}

fn serialize_op<S: serde::Serializer>(op: &Option<CollectiveOp>, s: S) -> Result<S::Ok, S::Error> {
    match op {
        Some(op) => s.serialize_str(op.name()),
        None => s.serialize_none(),
    }
}

/// A process's clock against the root's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ClockOffsetRecord {
    /// The root's host clock minus this process's, ns.
    pub offset_ns: i64,
    /// The most the offset may be off by, ns.
    pub uncertainty_ns: u64,
}

impl DatastoreReader {
    /// The communicators the runtime takes part in, by slot.
    pub fn communicators(&self) -> Vec<CommunicatorRecord> {
        self.communicators_with(|_, _| true)
    }

    /// The communicators as [`DatastoreReader::communicators`] gives them, with the
    /// history of only the ranks that `history_of(communicator id, rank)` asks for (the
    /// others' left empty): a tool that reads every process of a job takes each rank's
    /// history from its own process, and need not read the copies the others keep.
    pub fn communicators_with(&self, history_of: impl Fn(u32, &RankRecord) -> bool) -> Vec<CommunicatorRecord> {
        (0..COMM_SLOTS).filter_map(|slot| self.communicator(slot, false, &history_of)).collect()
    }

    /// The communicators as [`DatastoreReader::communicators`] gives them, and those the
    /// process has closed whose records are still there (until their slot is taken
    /// again): what a process that has ended took part in.
    pub fn communicators_with_closed(&self) -> Vec<CommunicatorRecord> {
        (0..COMM_SLOTS).filter_map(|slot| self.communicator(slot, true, &|_, _| true)).collect()
    }

    /// The ranks this process holds of its communicators across processes, as
    /// (communicator id, rank): the rows' flags alone, for a tool that reads every
    /// process of a job to know whose copy of a rank's history it need not read.
    pub fn own_ranks_across(&self) -> Vec<(u32, u32)> {
        let r = &self.region;
        let mut own = Vec::new();
        for slot in 0..COMM_SLOTS {
            let base = self.layout.comm_slot(slot);
            let flags = r.u32(base + comm::FLAGS).load(Ordering::Acquire);
            let id = r.u32(base + comm::ID).load(Ordering::Relaxed);
            if id == 0 || flags & comm::ACROSS == 0 || flags & comm::CLOSED != 0 {
                continue;
            }
            let ranks = r.u32(base + comm::RANKS).load(Ordering::Relaxed).min(COMM_RANKS);
            for rank in 0..ranks {
                let row = self.layout.comm_row(slot, rank);
                if r.u32(row + comm::ROW_FLAGS).load(Ordering::Relaxed) & comm::ROW_IN_THIS_PROCESS != 0 {
                    own.push((id, rank));
                }
            }
        }
        own
    }

    /// This process's clock against the root's (`None`: not in a job of several
    /// processes, or not measured yet).
    pub fn clock_offset(&self) -> Option<ClockOffsetRecord> {
        use layout::process::{CLOCK_OFFSET, CLOCK_SEQ, CLOCK_UNCERTAINTY};
        let [offset, uncertainty_ns] = self.process_words(CLOCK_SEQ, [CLOCK_OFFSET, CLOCK_UNCERTAINTY])?;
        (uncertainty_ns != 0).then_some(ClockOffsetRecord { offset_ns: offset as i64, uncertainty_ns })
    }

    /// How this process's job admits its processes (`None`: not in a job of several
    /// processes).
    pub fn job_admission(&self) -> Option<crate::flight::JobAdmission> {
        let word = self.region.u64(self.layout.process_word(layout::process::JOB_ADMISSION));
        crate::flight::JobAdmission::of_code(word.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn communicator(
        &self,
        slot: u32,
        closed_too: bool,
        history_of: &dyn Fn(u32, &RankRecord) -> bool,
    ) -> Option<CommunicatorRecord> {
        let r = &self.region;
        let base = self.layout.comm_slot(slot);
        for _ in 0..100 {
            let seq = r.u64(base + comm::SEQ).load(Ordering::Acquire);
            if seq % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let id = r.u32(base + comm::ID).load(Ordering::Relaxed);
            if id == 0 {
                return None;
            }
            let ranks = r.u32(base + comm::RANKS).load(Ordering::Relaxed);
            let name = self.strings.get(r, r.u32(base + comm::NAME).load(Ordering::Relaxed)).unwrap_or_default();
            let flags = r.u32(base + comm::FLAGS).load(Ordering::Relaxed);
            if flags & comm::CLOSED != 0 && !closed_too {
                return None;
            }
            let across = flags & comm::ACROSS != 0;
            // Most rows name the same few hosts.
            let mut hosts = std::collections::HashMap::new();
            let members = (0..ranks.min(COMM_RANKS))
                .filter_map(|rank| {
                    let mut record = self.rank_record(slot, rank, &mut hosts)?;
                    if history_of(id, &record) {
                        record.history = self.history(slot, rank);
                    }
                    Some(record)
                })
                .collect();
            fence(Ordering::Acquire);
            if r.u64(base + comm::SEQ).load(Ordering::Relaxed) == seq {
                return Some(CommunicatorRecord { id, name, ranks, across, members });
            }
        }
        None
    }

    fn rank_record(
        &self,
        slot: u32,
        rank: u32,
        hosts: &mut std::collections::HashMap<u32, String>,
    ) -> Option<RankRecord> {
        let r = &self.region;
        let row = self.layout.comm_row(slot, rank);
        let flags = r.u32(row + comm::ROW_FLAGS).load(Ordering::Acquire);
        let recorded = r.u64(row + comm::ROW_RECORDED).load(Ordering::Acquire);
        let position = |field| Position::of_word(r.u64(row + field).load(Ordering::Acquire));
        let (enqueued, started, completed) =
            (position(comm::ROW_ENQUEUED), position(comm::ROW_STARTED), position(comm::ROW_COMPLETED));
        if flags == 0 && recorded == 0 && enqueued.is_none() {
            return None;
        }
        let since = r.u64(row + comm::ROW_WAITING_SINCE).load(Ordering::Acquire);
        let peer = r.u64(row + comm::ROW_WAITING_FOR).load(Ordering::Relaxed);
        let heard_at = r.u64(row + comm::ROW_HEARD_AT).load(Ordering::Acquire);
        let heard = (heard_at != 0).then(|| {
            let doing = r.u64(row + comm::ROW_DOING).load(Ordering::Relaxed);
            let at = r.u64(row + comm::ROW_DOING_AT).load(Ordering::Relaxed) as u32;
            let models = ((doing >> 32) as u32).saturating_sub(1);
            let name = |id: u32| (id != 0).then(|| self.strings.get(r, id)).flatten();
            let executing = (models > 0).then(|| (name(doing as u32).unwrap_or_default(), name(at)));
            Heard { at_ns: heard_at, executing, models }
        });
        let core = r.u32(row + comm::ROW_CORE).load(Ordering::Relaxed);
        let host_id = r.u32(row + comm::ROW_HOST).load(Ordering::Relaxed);
        let host = hosts.entry(host_id).or_insert_with(|| self.strings.get(r, host_id).unwrap_or_default()).clone();
        Some(RankRecord {
            rank,
            pid: r.u32(row + comm::ROW_PID).load(Ordering::Relaxed),
            host,
            core: core.checked_sub(1),
            in_this_process: flags & comm::ROW_IN_THIS_PROCESS != 0,
            gone: flags & comm::ROW_GONE != 0,
            enqueued,
            started,
            operation: (r.u64(row + comm::ROW_OPERATION).load(Ordering::Relaxed) as u8)
                .checked_sub(1)
                .and_then(CollectiveOp::from_repr),
            completed,
            uncertainty_ns: r.u64(row + comm::ROW_UNCERTAINTY).load(Ordering::Relaxed),
            waiting: (since != 0 && peer != 0).then(|| (since, (peer - 1) as u32)),
            history: Vec::new(),
            heard,
        })
    }

    /// A rank's last collectives, oldest first: the entries from `recorded − HISTORY`
    /// on.
    fn history(&self, slot: u32, rank: u32) -> Vec<CollectiveEntry> {
        let row = self.layout.comm_row(slot, rank);
        let recorded = self.region.u64(row + comm::ROW_RECORDED).load(Ordering::Acquire);
        let history_len = u64::from(COMM_HISTORY);
        let mut history: Vec<CollectiveEntry> = (recorded.saturating_sub(history_len)..recorded)
            .filter_map(|k| self.entry(slot, rank, (k % history_len) as u32))
            .collect();
        history.sort_by_key(|e| e.position);
        history.dedup_by_key(|e| e.position);
        history
    }

    /// A history entry, unless it is being written.
    fn entry(&self, slot: u32, rank: u32, k: u32) -> Option<CollectiveEntry> {
        let r = &self.region;
        let at = self.layout.comm_entry(slot, rank, k);
        let tag = r.u64(at + comm::ENTRY_TAG).load(Ordering::Acquire);
        let [arrived, departed, bytes, before, busiest] =
            [comm::ENTRY_ARRIVED, comm::ENTRY_DEPARTED, comm::ENTRY_BYTES, comm::ENTRY_BEFORE, comm::ENTRY_BUSIEST]
                .map(|field| r.u64(at + field).load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        if r.u64(at + comm::ENTRY_TAG).load(Ordering::Relaxed) != tag {
            return None;
        }
        CollectiveEntry::of_words([tag, arrived, departed, bytes, before, busiest])
    }
}

#[cfg(test)]
mod tests {
    use crate::flight::{CollectiveEntry, CommunicatorEntry, Position, Progress, RankMember};
    use crate::kinds::{CollectiveAlgorithm, CollectiveOp};
    use crate::layout::COMM_HISTORY;
    use crate::test_support::open_pair;

    fn entry(sequence: u32, arrived_ns: u64) -> CollectiveEntry {
        CollectiveEntry {
            position: Position { sequence, index: 0 },
            operation: CollectiveOp::AllReduce,
            algorithm: CollectiveAlgorithm::AllToAll,
            group: 0,
            bytes: 1 << 20,
            arrived_ns,
            departed_ns: Some(arrived_ns + 500),
            // At microsecond grain, as the record keeps it.
            before: (sequence > 0).then_some(crate::flight::Before {
                since_ns: 7_000,
                executing_ns: 3_000,
                busiest: (sequence > 1).then_some((crate::Engine::Pe, 2_000)),
            }),
        }
    }

    #[test]
    fn a_communicators_ranks_and_history_read_back_as_written_and_its_slot_is_reused_empty() {
        let (dir, writer, reader) = open_pair();
        let comm_entry = CommunicatorEntry { id: 7, name: "grads".into(), ranks: 4, across: true };
        let slot = writer.open_communicator(&comm_entry).expect("a free slot");
        let member = RankMember { pid: 42, host: "h1".into(), core: Some(3), in_this_process: true };
        writer.set_rank_member(slot, 1, &member);
        writer.record_progress(slot, 1, Progress::Enqueued, Position { sequence: 40, index: 0 });
        writer.record_progress(
            slot,
            1,
            Progress::Started(CollectiveOp::AllGather),
            Position { sequence: 39, index: 2 },
        );
        writer.set_waiting(slot, 1, Some((1_000, 3)));
        for sequence in 0..40 {
            writer.record_collective(slot, 1, &entry(sequence, 1_000 * u64::from(sequence)));
        }
        writer.set_clock_offset(-1_500, 20);
        assert_eq!(reader.job_admission(), None, "not recorded yet");
        writer.set_job_admission(crate::flight::JobAdmission::TrustedNetwork);
        // Rank 2 is another process's: only what its process said is known.
        let elsewhere = RankMember { pid: 43, host: "h2".into(), core: None, in_this_process: false };
        writer.set_rank_member(slot, 2, &elsewhere);
        let said = crate::flight::Heard::of(9_000, &[("step".into(), Some("dot.3".into())), ("eval".into(), None)]);
        writer.set_rank_heard(slot, 2, &said);

        let comms = reader.communicators();
        assert_eq!(comms.len(), 1);
        let comm = &comms[0];
        assert_eq!((comm.id, comm.name.as_str(), comm.ranks, comm.across), (7, "grads", 4, true));
        assert_eq!(comm.members.len(), 2, "only ranks 1 and 2 were written");
        let heard = comm.members[1].heard.as_ref().expect("heard");
        assert_eq!(heard, &said);
        assert_eq!(heard.doing(), "executing `step` at `dot.3` and 1 more model");
        let rank = &comm.members[0];
        assert_eq!(rank.heard, None);
        assert_eq!((rank.rank, rank.pid, rank.host.as_str(), rank.core), (1, 42, "h1", Some(3)));
        assert!(rank.in_this_process && !rank.gone);
        assert_eq!(rank.enqueued, Some(Position { sequence: 40, index: 0 }));
        assert_eq!(rank.started.map(|p| p.to_string()).as_deref(), Some("#39.2"));
        assert_eq!(rank.completed, None);
        assert_eq!(rank.operation, Some(CollectiveOp::AllGather));
        assert_eq!(rank.waiting, Some((1_000, 3)));
        // The last HISTORY of 40, oldest first.
        assert_eq!(rank.history.len(), COMM_HISTORY as usize);
        assert_eq!(rank.history[0], entry(40 - COMM_HISTORY, 1_000 * u64::from(40 - COMM_HISTORY)));
        assert_eq!(rank.history.last().map(|e| e.position.sequence), Some(39));
        let clock = reader.clock_offset().expect("measured");
        assert_eq!((clock.offset_ns, clock.uncertainty_ns), (-1_500, 20));
        assert_eq!(reader.job_admission(), Some(crate::flight::JobAdmission::TrustedNetwork));

        writer.close_communicator(slot);
        assert!(reader.communicators().is_empty());
        // Closed, its record stays for a tool that reads the process as it ends.
        let closed = reader.communicators_with_closed();
        assert_eq!((closed.len(), closed[0].id, closed[0].members.len()), (1, 7, 2), "{closed:?}");
        let again = writer.open_communicator(&CommunicatorEntry { id: 8, ..comm_entry.clone() }).expect("freed");
        assert_eq!(again, slot);
        let comms = reader.communicators();
        assert_eq!(comms[0].id, 8);
        assert!(comms[0].members.is_empty(), "{:?}", comms[0].members);
        assert_eq!(reader.communicators_with_closed().len(), 1, "the slot taken again replaces the closed one");
        drop(dir);
    }

    #[test]
    fn slots_run_out_gracefully_and_ranks_past_the_recorded_ones_are_ignored() {
        let (_dir, writer, reader) = open_pair();
        let comm_entry = CommunicatorEntry { id: 1, name: "c".into(), ranks: 1000, across: false };
        let slots: Vec<_> = (0..crate::flight::SLOTS).map(|_| writer.open_communicator(&comm_entry)).collect();
        assert!(slots.iter().all(Option::is_some));
        assert!(writer.open_communicator(&comm_entry).is_none(), "the table is full");
        let slot = slots[0].expect("taken");
        writer.record_collective(slot, 999, &entry(0, 1));
        writer.record_collective(slot, 5, &entry(0, 1));
        let comms = reader.communicators();
        assert_eq!(comms.len(), crate::flight::SLOTS as usize);
        assert_eq!(comms[0].members.iter().map(|m| m.rank).collect::<Vec<_>>(), [5]);
        assert_eq!(reader.clock_offset(), None);
    }
    #[test]
    fn read_together_each_rank_history_comes_from_its_own_process_and_the_view_is_the_same() {
        use crate::ranks::{RuntimeRecords, StragglerRule, group_views};
        // Two processes of one job, each with its own rank and, from the messages, the
        // other's arrivals; rank 1 arrives 3 ms after rank 0 each time.
        let pairs = [open_pair(), open_pair()];
        let comm_entry = CommunicatorEntry { id: 9, name: "grads".into(), ranks: 2, across: true };
        for (me, (_, writer, _)) in pairs.iter().enumerate() {
            let slot = writer.open_communicator(&comm_entry).expect("a slot");
            for rank in 0..2u32 {
                let own = rank as usize == me;
                let member =
                    RankMember { pid: 40 + rank, host: "h".into(), core: own.then_some(0), in_this_process: own };
                writer.set_rank_member(slot, rank, &member);
                for sequence in 0..10 {
                    let mut e = entry(sequence, 1_000_000 * u64::from(sequence + 1) + 3_000_000 * u64::from(rank));
                    if !own {
                        e.departed_ns = None;
                    }
                    writer.record_collective(slot, rank, &e);
                }
            }
        }
        let readers: Vec<_> = pairs.iter().map(|(_, _, reader)| (reader, crate::Liveness::Live)).collect();
        let together = RuntimeRecords::read_all(&readers);
        let apart: Vec<RuntimeRecords> = readers.iter().map(|&(r, l)| RuntimeRecords::read(r, l)).collect();
        // Each process's copy of the other's rank is read without its history.
        for (me, records) in together.iter().enumerate() {
            for m in &records.communicators[0].members {
                assert_eq!(m.history.is_empty(), m.rank as usize != me, "{m:?}");
            }
        }
        assert!(apart.iter().all(|r| r.communicators[0].members.iter().all(|m| m.history.len() == 10)));
        let rule = StragglerRule::default();
        assert_eq!(group_views(&together, &rule, 0), group_views(&apart, &rule, 0));
        // Alone, a process still reads both histories.
        let alone = RuntimeRecords::read_all(&readers[..1]);
        assert!(alone[0].communicators[0].members.iter().all(|m| m.history.len() == 10));
    }
}
