//! The group view of a communicator: every rank's state, when each arrived at each
//! recent collective, who was late, the straggler (named only with evidence) and a
//! hang, from the flight records of the runtimes a tool reads (`flight.rs`).
//!
//! Every tool (`neuron-top`, `neuron-monitor`, the dashboard) builds its ranks view
//! here, so they name the same ranks by the same rules:
//!
//! - **Lateness** of a rank in a collective: its arrival minus the first arrival of
//!   its replica group, on the job's one clock.
//! - **Last arriver**: the rank that arrived last, unless the runner-up arrived
//!   within the two ranks' clock uncertainties of it: then the collective has a tie,
//!   never an order.
//! - **Straggler**: judged per step (an execution, or a call of the collectives
//!   API), not per collective: see `straggler.rs`.
//! - **Hang**: a rank of the group has waited long for another (the runtime marks the
//!   wait after 5 s, or half `NEURON_RT_EXEC_TIMEOUT` when shorter): the rank it waits
//!   for never reached the collective (*missing*, or *gone* with its process), or
//!   reached it and no data moves (*transport stalled*).

use std::collections::BTreeMap;

use serde::Serialize;

mod records;
mod straggler;

pub use crate::clock::format_ns;
pub use records::{Activity, RuntimeRecords, TracedCollective, count_ranks, root_now};
pub use straggler::{BeforeArrival, Cause, LateAt, MIN_EVIDENCE, Straggler, StragglerRule};

use crate::flight::{CollectiveEntry, Position, STALE_HEARTBEAT_NS};
use crate::kinds::CollectiveOp;
use crate::reader::{CommunicatorRecord, RankRecord};

/// What a rank is doing, as the flight record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RankState {
    /// Its process is gone.
    Gone,
    /// Inside a collective, waiting long for another rank.
    Waiting,
    /// Inside a collective.
    InCollective,
    /// Given a unit (an execution or a call) whose collective it has not reached.
    Running,
    /// Between units.
    Idle,
    /// Nothing recorded yet.
    Unknown,
}

impl RankState {
    pub fn name(self) -> &'static str {
        match self {
            RankState::Gone => "gone",
            RankState::Waiting => "waiting",
            RankState::InCollective => "in collective",
            RankState::Running => "running",
            RankState::Idle => "idle",
            RankState::Unknown => "unknown",
        }
    }
}

/// One rank in the group view.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemberView {
    pub rank: u32,
    pub pid: u32,
    pub host: String,
    pub core: Option<u32>,
    pub state: RankState,
    pub enqueued: Option<Position>,
    pub started: Option<Position>,
    pub completed: Option<Position>,
    /// Its lateness in each of the view's collectives (`None` where it took no part or
    /// its arrival is not known here), ns.
    pub lateness_ns: Vec<Option<u64>>,
    /// Of the complete steps looked at (see `straggler.rs`), those it arrived last in,
    /// and its median lateness in them (summed over each step's collectives).
    pub arrived_last: usize,
    pub median_lateness_ns: Option<u64>,
    /// The most its clock may be off the root's, ns.
    pub uncertainty_ns: u64,
    /// What it is doing now: `executing `train_step` at `dot.12`` from its process's
    /// datastore read here, or `last seen executing … 0.4 s ago` from what its process
    /// said (see [`crate::flight::Heard`]); `None` when neither is known here.
    pub doing: Option<String>,
}

/// One collective of one replica group, as every rank's arrival tells it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CollectiveView {
    pub position: Position,
    pub operation: &'static str,
    pub algorithm: &'static str,
    pub group: u16,
    pub bytes: u64,
    /// Each known rank's arrival (root clock ns), by rank.
    pub arrivals: Vec<(u32, u64)>,
    /// Whether every rank of the group is among them (the group's size is the number
    /// of ranks that took part, known only when every rank is recorded).
    pub complete: bool,
    /// Last arrival minus first, ns.
    pub skew_ns: u64,
    /// The last arriver; `None` when the runner-up is within the clocks' uncertainty.
    pub last: Option<u32>,
    /// Each known rank's wait (last arrival minus its own), by rank.
    pub waits_ns: Vec<(u32, u64)>,
}

/// Why a collective does not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HangClass {
    /// The awaited rank never reached the collective.
    Missing,
    /// The awaited rank's process is gone.
    Gone,
    /// The awaited rank's process answers nothing: stopped (a signal, a debugger), or
    /// its host cut off; its heartbeat is stale.
    Stopped,
    /// Every rank reached it and no data moves.
    TransportStalled,
}

impl HangClass {
    /// The heading every tool gives it: `Rank gone` for a rank whose process died,
    /// `Hang` for the others.
    pub fn title(self) -> &'static str {
        match self {
            HangClass::Gone => "Rank gone",
            _ => "Hang",
        }
    }
}

/// A collective some rank has waited long in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hang {
    pub class: HangClass,
    pub position: Position,
    /// The ranks waiting long, and since when (root clock ns), by rank.
    pub waiting: Vec<(u32, u64)>,
    /// The ranks they wait for.
    pub awaited: Vec<u32>,
    /// How long the first of them has waited, ns.
    pub waited_ns: u64,
    /// One line for people.
    pub text: String,
}

/// A communicator as the records read show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupView {
    pub id: u32,
    pub name: String,
    pub ranks: u32,
    pub across: bool,
    /// The ranks known, by rank.
    pub members: Vec<MemberView>,
    /// The collectives the records hold, oldest first (about the last
    /// [`crate::flight::HISTORY`] from datastores; every one from profiles).
    pub collectives: Vec<CollectiveView>,
    pub straggler: Option<Straggler>,
    pub hang: Option<Hang>,
    /// The largest clock uncertainty of its ranks, ns: orderings closer than twice
    /// this are ties.
    pub uncertainty_ns: u64,
    /// How the job of a communicator across processes admits its processes, the most
    /// open of what the processes read recorded (`None`: unknown, or one process).
    pub admission: Option<crate::flight::JobAdmission>,
}

/// The group views of the communicators in `runtimes` (one host's runtimes, each
/// read once), merged by communicator: a communicator across processes is the same
/// in every process, one of a process is that process's own. `now_ns` is the root
/// clock now (for how long a hang has lasted).
pub fn group_views(runtimes: &[RuntimeRecords], rule: &StragglerRule, now_ns: u64) -> Vec<GroupView> {
    let key_of =
        |runtime: &RuntimeRecords, comm: &CommunicatorRecord| (comm.id, if comm.across { 0 } else { runtime.pid });
    // The ranks whose own process is read: what the others recorded of them (the same
    // arrivals, without departures) adds nothing but whether they saw it go.
    let mut own = std::collections::HashSet::new();
    for runtime in runtimes {
        for comm in &runtime.communicators {
            own.extend(comm.members.iter().filter(|m| m.in_this_process).map(|m| (key_of(runtime, comm), m.rank)));
        }
    }
    // (id, pid for a communicator of one process) → the merged record.
    let mut merged: BTreeMap<(u32, u32), (CommunicatorRecord, BTreeMap<u32, RankRecord>)> = BTreeMap::new();
    let mut admissions: BTreeMap<(u32, u32), crate::flight::JobAdmission> = BTreeMap::new();
    let mut gone = Vec::new();
    for runtime in runtimes {
        for comm in &runtime.communicators {
            let key = key_of(runtime, comm);
            if let Some(admission) = runtime.admission.filter(|_| comm.across) {
                let known = admissions.entry(key).or_insert(admission);
                *known = (*known).max(admission);
            }
            let (_, members) = merged.entry(key).or_insert_with(|| {
                (CommunicatorRecord { members: Vec::new(), ..comm.clone_header() }, BTreeMap::new())
            });
            for member in &comm.members {
                if !member.in_this_process && own.contains(&(key, member.rank)) {
                    if member.gone {
                        gone.push((key, member.rank));
                    }
                    continue;
                }
                let mut member = member.clone();
                if member.in_this_process && member.uncertainty_ns == 0 {
                    member.uncertainty_ns = runtime.clock.map_or(0, |c| c.uncertainty_ns);
                }
                match members.get_mut(&member.rank) {
                    None => {
                        members.insert(member.rank, member);
                    }
                    Some(known) => merge_rank(known, member),
                }
            }
        }
    }
    for (key, rank) in gone {
        if let Some(member) = merged.get_mut(&key).and_then(|(_, members)| members.get_mut(&rank)) {
            member.gone = true;
        }
    }
    let activities: BTreeMap<u32, &Activity> = runtimes.iter().map(|r| (r.pid, &r.activity)).collect();
    merged
        .into_iter()
        .map(|(key, (comm, members))| {
            let mut view = view_of(comm, members, rule, (now_ns, &activities));
            view.admission = admissions.get(&key).copied();
            view
        })
        .collect()
}

/// Merges what another process recorded of a rank into what is known of it: the
/// rank's own process knows its state; every process's history adds arrivals.
fn merge_rank(known: &mut RankRecord, other: RankRecord) {
    let history = std::mem::take(&mut known.history);
    if other.in_this_process && !known.in_this_process {
        let mut history = history;
        let (gone, uncertainty) = (known.gone, known.uncertainty_ns);
        *known = other;
        known.gone |= gone;
        known.uncertainty_ns = known.uncertainty_ns.max(uncertainty);
        history.append(&mut known.history);
        known.history = history;
    } else {
        known.history = history;
        known.history.extend(other.history);
        known.gone |= other.gone;
        known.uncertainty_ns = known.uncertainty_ns.max(other.uncertainty_ns);
        // What its process said last, as whichever process heard it last.
        if other.heard.as_ref().map(|h| h.at_ns) > known.heard.as_ref().map(|h| h.at_ns) {
            known.heard = other.heard;
        }
    }
    // The rank's own entry has its departure: keep it over another's copy.
    known.history.sort_by_key(|e| (e.position, e.departed_ns.is_none()));
    known.history.dedup_by_key(|e| e.position);
}

fn view_of(
    comm: CommunicatorRecord,
    members: BTreeMap<u32, RankRecord>,
    rule: &StragglerRule,
    (now_ns, activities): (u64, &BTreeMap<u32, &Activity>),
) -> GroupView {
    let uncertainty_ns = members.values().map(|m| m.uncertainty_ns).max().unwrap_or(0);
    let collectives = collectives_of(&members);
    // Each collective's first arrival, which every rank's lateness is measured from.
    let firsts: Vec<u64> = collectives.iter().map(|c| c.arrivals.iter().map(|a| a.1).min().unwrap_or(0)).collect();
    let mut views: Vec<MemberView> = members
        .values()
        .map(|m| MemberView {
            rank: m.rank,
            pid: m.pid,
            host: m.host.clone(),
            core: m.core,
            state: state_of(m),
            enqueued: m.enqueued,
            started: m.started,
            completed: m.completed,
            lateness_ns: collectives
                .iter()
                .zip(&firsts)
                .map(|(c, &first)| c.arrivals.iter().find(|a| a.0 == m.rank).map(|a| a.1 - first))
                .collect(),
            arrived_last: 0,
            median_lateness_ns: None,
            uncertainty_ns: m.uncertainty_ns,
            doing: doing_now(m, activities, now_ns, false),
        })
        .collect();
    let straggler = straggler::name_straggler(&mut views, &collectives, rule).map(|(mut straggler, late_at)| {
        straggler.add_before(&members, &late_at);
        straggler
    });
    let hang = diagnose_hang(&comm, &members, (now_ns, activities));
    GroupView {
        id: comm.id,
        name: comm.name,
        ranks: comm.ranks,
        across: comm.across,
        members: views,
        collectives,
        straggler,
        hang,
        uncertainty_ns,
        admission: None,
    }
}

/// Ranks and their arrivals (one clock, ns).
type Arrivals = Vec<(u32, u64)>;

/// The collectives of the ranks' histories, by (position, group), oldest first.
fn collectives_of(members: &BTreeMap<u32, RankRecord>) -> Vec<CollectiveView> {
    let mut by_key: BTreeMap<(Position, u16), (CollectiveEntry, Arrivals)> = BTreeMap::new();
    for member in members.values() {
        for entry in &member.history {
            let (_, arrivals) = by_key.entry((entry.position, entry.group)).or_insert_with(|| (*entry, Vec::new()));
            arrivals.push((member.rank, entry.arrived_ns));
        }
    }
    // Ranks that took part in a group: a group of all (group 0 and no other group at
    // that position) has every rank of the communicator.
    let ranks = members.len();
    let groups_at = |position: Position| by_key.keys().filter(|(p, _)| *p == position).count();
    let uncertainty = |rank: u32| members.get(&rank).map_or(0, |m| m.uncertainty_ns);
    let mut views: Vec<CollectiveView> = by_key
        .iter()
        .map(|(&(position, group), (entry, arrivals))| {
            let first = arrivals.iter().map(|a| a.1).min().unwrap_or(0);
            let last_at = arrivals.iter().map(|a| a.1).max().unwrap_or(0);
            let mut sorted = arrivals.clone();
            sorted.sort_by_key(|a| std::cmp::Reverse(a.1));
            let last = match sorted.as_slice() {
                [(rank, at), (other, next), ..] => {
                    (at - next > uncertainty(*rank) + uncertainty(*other)).then_some(*rank)
                }
                _ => None,
            };
            CollectiveView {
                position,
                operation: entry.operation.name(),
                algorithm: entry.algorithm.name(),
                group,
                bytes: entry.bytes,
                arrivals: arrivals.clone(),
                complete: groups_at(position) == 1 && arrivals.len() == ranks && ranks > 1,
                skew_ns: last_at - first,
                last,
                waits_ns: arrivals.iter().map(|&(rank, at)| (rank, last_at - at)).collect(),
            }
        })
        .collect();
    views.sort_by_key(|c| (c.position, c.group));
    views
}

fn state_of(m: &RankRecord) -> RankState {
    if m.gone {
        RankState::Gone
    } else if m.waiting.is_some() {
        RankState::Waiting
    } else if m.started.is_some() && m.started > m.completed {
        RankState::InCollective
    } else if m.enqueued.is_some_and(|e| m.completed.is_none_or(|c| e.sequence > c.sequence)) {
        RankState::Running
    } else if m.enqueued.is_some() || m.completed.is_some() {
        RankState::Idle
    } else {
        RankState::Unknown
    }
}

/// The hang of a group, when a rank waits long: whom for, and why; or, when nobody
/// waits, the ranks whose processes are gone (the collectives that needed them
/// failed at once).
fn diagnose_hang(
    comm: &CommunicatorRecord,
    members: &BTreeMap<u32, RankRecord>,
    (now_ns, activities): (u64, &BTreeMap<u32, &Activity>),
) -> Option<Hang> {
    let describe = |rank: u32| match members.get(&rank) {
        Some(m) => format!("rank {rank}{}", place(m.pid, &m.host)),
        None => format!("rank {rank}"),
    };
    let last_completed = |m: &RankRecord| m.completed.map_or_else(|| "none".to_owned(), |p| p.to_string());
    let waiting: Vec<&RankRecord> = members.values().filter(|m| m.waiting.is_some() && !m.gone).collect();
    let Some(first) = waiting.iter().min_by_key(|m| m.waiting.map(|w| w.0)) else {
        let gone: Vec<&RankRecord> = members.values().filter(|m| m.gone).collect();
        let position = gone.iter().filter_map(|m| m.completed).max().unwrap_or(Position { sequence: 0, index: 0 });
        let named: Vec<String> = gone
            .iter()
            .map(|m| match m.completed {
                Some(p) => format!("{} died after completing {p}", describe(m.rank)),
                None => format!("{} died before completing any collective", describe(m.rank)),
            })
            .collect();
        return (!gone.is_empty()).then(|| Hang {
            class: HangClass::Gone,
            position,
            waiting: Vec::new(),
            awaited: gone.iter().map(|m| m.rank).collect(),
            waited_ns: 0,
            text: format!(
                "comm `{}` ({} ranks): {} (its process is gone); the collectives that need it fail",
                comm.name,
                comm.ranks,
                named.join(", ")
            ),
        });
    };
    let position = first.started?;
    let (since, _) = first.waiting?;
    let mut awaited: Vec<u32> = waiting.iter().filter_map(|m| m.waiting.map(|w| w.1)).collect();
    awaited.sort_unstable();
    awaited.dedup();
    let reached = |rank: u32| members.get(&rank).and_then(|m| m.started).is_some_and(|s| s >= position);
    let gone = |rank: u32| members.get(&rank).is_some_and(|m| m.gone);
    // Its process's own datastore says so on this host; elsewhere, what its process said
    // last through the root is old.
    let stopped = |rank: u32| {
        members.get(&rank).is_some_and(|m| match activities.get(&m.pid).filter(|_| m.in_this_process) {
            Some(activity) => matches!(activity.liveness, "stopped" | "stale"),
            None => m.heard.as_ref().is_some_and(|h| now_ns.saturating_sub(h.at_ns) >= STALE_HEARTBEAT_NS),
        })
    };
    let class = if awaited.iter().any(|&r| gone(r)) {
        HangClass::Gone
    } else if awaited.iter().any(|&r| stopped(r)) {
        HangClass::Stopped
    } else if awaited.iter().all(|&r| reached(r)) {
        HangClass::TransportStalled
    } else {
        HangClass::Missing
    };
    let named: Vec<String> = awaited.iter().map(|&r| describe(r)).collect();
    let waited_ns = now_ns.saturating_sub(since);
    let waited = format_ns(waited_ns);
    let detail = match class {
        HangClass::Gone => "whose process is gone".to_owned(),
        HangClass::Stopped => {
            let said: Vec<String> = (awaited.iter().filter(|&&r| stopped(r)))
                .filter_map(|&r| Some(format!("rank {r}: {}", doing_now(members.get(&r)?, activities, now_ns, true)?)))
                .collect();
            format!("which answers nothing ({})", said.join("; "))
        }
        HangClass::TransportStalled => "which arrived; no data moves (transport stalled)".to_owned(),
        HangClass::Missing => {
            let doing: Vec<String> = awaited
                .iter()
                .filter_map(|&r| {
                    let m = members.get(&r)?;
                    let running = match m.enqueued {
                        Some(unit) if unit.sequence >= position.sequence => {
                            format!(", running unit #{}", unit.sequence)
                        }
                        _ => String::new(),
                    };
                    let doing = match doing_now(m, activities, now_ns, true) {
                        Some(doing) => format!(", {doing}"),
                        None => String::new(),
                    };
                    // Of a rank of another process, only its arrivals came here.
                    let progress = match (m.completed, m.history.last()) {
                        (None, Some(reached)) => format!("last reached {}", reached.position),
                        _ => format!("last completed {}", last_completed(m)),
                    };
                    Some(format!("rank {r}: {progress}{running}{doing}"))
                })
                .collect();
            if doing.is_empty() {
                "which never reached it".to_owned()
            } else {
                format!("which never reached it ({})", doing.join("; "))
            }
        }
    };
    let operation = first.operation.map_or("collective", CollectiveOp::name);
    let text = format!(
        "{operation} {position} of comm `{}` ({} ranks): {} waiting {waited} for {}, {detail}",
        comm.name,
        comm.ranks,
        if waiting.len() == 1 { format!("rank {}", first.rank) } else { format!("{} ranks", waiting.len()) },
        named.join(", ")
    );
    Some(Hang {
        class,
        position,
        waiting: waiting.iter().filter_map(|m| Some((m.rank, m.waiting?.0))).collect(),
        awaited,
        waited_ns,
        text,
    })
}

/// What rank `m` is doing now: from its own process's datastore when it is read here
/// (this host); else what its process last said (its heartbeat through the root);
/// else, `with_arrivals`, when it was last heard of at all: its latest arrival or
/// departure that came here with the collectives' data.
fn doing_now(
    m: &RankRecord,
    activities: &BTreeMap<u32, &Activity>,
    now_ns: u64,
    with_arrivals: bool,
) -> Option<String> {
    if let Some(activity) = activities.get(&m.pid).filter(|_| m.in_this_process) {
        return Some(activity.describe());
    }
    if let Some(heard) = &m.heard {
        return Some(heard.describe(now_ns));
    }
    if !with_arrivals {
        return None;
    }
    let (at, position) = m
        .history
        .iter()
        .map(|e| (e.departed_ns.unwrap_or(0).max(e.arrived_ns), e.position))
        .max_by_key(|(at, _)| *at)
        .filter(|(at, _)| *at > 0 && now_ns > *at)?;
    Some(format!("last heard of {} ago (at {position})", format_ns(now_ns - at)))
}

/// ` (pid 812 on host a)`, or nothing when not known.
fn place(pid: u32, host: &str) -> String {
    match (pid, host.is_empty()) {
        (0, _) => String::new(),
        (pid, true) => format!(" (pid {pid})"),
        (pid, false) => format!(" (pid {pid} on host {host})"),
    }
}

#[cfg(test)]
mod tests;
