//! What the group view is built from: each runtime's records, read from its datastore
//! or from a profile, and what its process is doing.

use std::collections::BTreeMap;

use crate::flight::CollectiveEntry;
use crate::reader::{ClockOffsetRecord, CommunicatorRecord, RankRecord};

/// What one runtime's datastore holds for the group view.
#[derive(Debug, Clone)]
pub struct RuntimeRecords {
    pub pid: u32,
    pub clock: Option<ClockOffsetRecord>,
    /// How its job admits its processes (`None`: not in a job, or not recorded).
    pub admission: Option<crate::flight::JobAdmission>,
    pub communicators: Vec<CommunicatorRecord>,
    /// What the process is doing now, to say of a rank the others wait for.
    pub activity: Activity,
}

/// One collective of a rank as its own trace recorded it (a profile's `cc_running`
/// span), its times on the job's clock.
#[derive(Debug, Clone)]
pub struct TracedCollective {
    pub communicator: u32,
    pub rank: u32,
    pub core: Option<u32>,
    pub entry: CollectiveEntry,
}

impl RuntimeRecords {
    /// What a profile of process `pid` on `host`, its clock `clock`, holds of its
    /// collectives, as a runtime's records: a member per communicator and rank, in this
    /// process, its collectives by position. Each group's rank count is left at 0: see
    /// [`count_ranks`] over the profiles read together.
    pub fn from_profile(
        pid: u32,
        host: &str,
        clock: Option<ClockOffsetRecord>,
        collectives: impl IntoIterator<Item = TracedCollective>,
    ) -> RuntimeRecords {
        let uncertainty_ns = clock.map_or(0, |c| c.uncertainty_ns);
        let mut members: BTreeMap<(u32, u32), RankRecord> = BTreeMap::new();
        for c in collectives {
            let member = members.entry((c.communicator, c.rank)).or_insert_with(|| RankRecord {
                rank: c.rank,
                pid,
                host: host.to_owned(),
                core: c.core,
                in_this_process: true,
                gone: false,
                enqueued: None,
                started: None,
                operation: None,
                completed: None,
                uncertainty_ns,
                waiting: None,
                history: Vec::new(),
                heard: None,
            });
            member.completed = member.completed.max(Some(c.entry.position));
            member.history.push(c.entry);
        }
        let mut communicators: BTreeMap<u32, CommunicatorRecord> = BTreeMap::new();
        for ((id, _), mut member) in members {
            member.history.sort_by_key(|e| e.position);
            let comm = communicators.entry(id).or_insert_with(|| CommunicatorRecord {
                id,
                name: format!("communicator {id}"),
                ranks: 0,
                across: true,
                members: Vec::new(),
            });
            comm.members.push(member);
        }
        RuntimeRecords {
            pid,
            clock,
            admission: None,
            communicators: communicators.into_values().collect(),
            activity: Activity::default(),
        }
    }
}

/// Sets each communicator's rank count to the ranks `records` hold of it, for profiles
/// read together (they say no more).
pub fn count_ranks(records: &mut [RuntimeRecords]) {
    let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
    for comm in records.iter().flat_map(|r| &r.communicators) {
        *counts.entry(comm.id).or_default() += comm.members.len() as u32;
    }
    for comm in records.iter_mut().flat_map(|r| r.communicators.iter_mut()) {
        comm.ranks = counts.get(&comm.id).copied().unwrap_or(0);
    }
}

/// What a runtime process is doing, from its datastore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activity {
    /// The models with an execution in flight, by name, each with the HLO instruction
    /// it is at when known.
    pub executing: Vec<(String, Option<String>)>,
    /// `live`, `stopped`, `stale` or `exited` (see [`crate::Liveness`]), and for a
    /// stopped or stale one the age of its heartbeat in seconds.
    pub liveness: &'static str,
    pub heartbeat_age_s: u64,
}

impl Activity {
    /// What the models `models` of a runtime whose liveness is `liveness` say.
    pub fn of_models(models: impl IntoIterator<Item = crate::ModelInfo>, liveness: crate::Liveness) -> Activity {
        Activity {
            executing: models.into_iter().filter(|m| m.running > 0).map(|m| (m.name, m.at_instruction)).collect(),
            liveness: liveness.word(),
            heartbeat_age_s: match liveness {
                crate::Liveness::Stale { seconds, .. } => seconds,
                _ => 0,
            },
        }
    }

    /// `executing `train_step` at `dot.12``, `stopped (its heartbeat is 12 s old)`, or
    /// `in no execution (in the program, between runtime calls)`.
    pub fn describe(&self) -> String {
        match self.liveness {
            "stopped" | "stale" => {
                format!("its process is {} (its heartbeat is {} s old)", self.liveness, self.heartbeat_age_s)
            }
            "exited" => "its process has exited".to_owned(),
            _ if self.executing.is_empty() => "in no execution (in the program, between runtime calls)".to_owned(),
            _ => {
                let models: Vec<String> = self
                    .executing
                    .iter()
                    .map(|(model, at)| match at {
                        Some(at) => format!("`{model}` at `{at}`"),
                        None => format!("`{model}`"),
                    })
                    .collect();
                format!("executing {}", models.join(", "))
            }
        }
    }
}

impl RuntimeRecords {
    /// What `reader`'s runtime holds now; `liveness` is its latest (see
    /// [`crate::Followed::liveness`]).
    pub fn read(reader: &crate::DatastoreReader, liveness: crate::Liveness) -> RuntimeRecords {
        RuntimeRecords::read_with(reader, liveness, |_, _| true)
    }

    /// What the runtimes `readers` hold now (each with its latest liveness), read
    /// together for [`super::group_views`]: a rank's history is read from its own
    /// process only when that process is among them (the others' copies of its
    /// arrivals add nothing there, and a job of many ranks has many copies).
    pub fn read_all(readers: &[(&crate::DatastoreReader, crate::Liveness)]) -> Vec<RuntimeRecords> {
        let own: std::collections::HashSet<(u32, u32)> =
            readers.iter().flat_map(|(reader, _)| reader.own_ranks_across()).collect();
        let history_of = |id: u32, m: &RankRecord| m.in_this_process || !own.contains(&(id, m.rank));
        readers.iter().map(|&(reader, liveness)| RuntimeRecords::read_with(reader, liveness, history_of)).collect()
    }

    fn read_with(
        reader: &crate::DatastoreReader,
        liveness: crate::Liveness,
        history_of: impl Fn(u32, &RankRecord) -> bool,
    ) -> RuntimeRecords {
        RuntimeRecords {
            pid: reader.info().pid,
            clock: reader.clock_offset(),
            admission: reader.job_admission(),
            communicators: reader.communicators_with(history_of),
            activity: Activity::of_models(reader.models(), liveness),
        }
    }
}

/// Now on the job's one clock, as these runtimes of one host measured it (this
/// host's clock when none is in a job of several processes).
pub fn root_now(runtimes: &[RuntimeRecords]) -> u64 {
    let offset = runtimes.iter().find_map(|r| r.clock).map_or(0, |c| c.offset_ns);
    crate::clock::monotonic_ns().saturating_add_signed(offset)
}
