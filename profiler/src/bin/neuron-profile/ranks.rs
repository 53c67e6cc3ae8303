//! The profiles of a job's ranks, read together: each file's `cc_running` spans put on
//! the job's one clock through the file's own `clock_offset` events, then the same
//! group view the live tools show (`neuron_datastore::ranks`) over every collective of
//! the profiles: a table per collective (operation, bytes, algorithm, arrival skew, last
//! arriver, duration, algbw, busbw) and the straggler finding, with the clocks'
//! uncertainty stated.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use neuron_datastore::flight::{CollectiveEntry, Position};
use neuron_datastore::ranks::{
    GroupView, RuntimeRecords, Straggler, StragglerRule, TracedCollective, count_ranks, format_ns, group_views,
};
use neuron_datastore::{ClockOffsetRecord, CollectiveAlgorithm, CollectiveOp, EventData, Phase};
use neuron_record::to_system_event;
use ntff::NtffFile;

use crate::activity::{self, BeforeArrival};
use serde::Serialize;

/// One profile's collectives, on the job's clock.
#[derive(Debug)]
pub(crate) struct RankProfile {
    pub(crate) path: PathBuf,
    /// The host the profile was recorded on.
    pub(crate) host: String,
    pub(crate) records: RuntimeRecords,
    /// How many `clock_offset` anchors the file holds (0: its clock is taken as the
    /// root's, which holds for rank 0's process and a job of one process).
    pub(crate) anchors: usize,
    /// The communicators the file recorded its process in, with their members.
    pub(crate) membership: Vec<ntff::Communicator>,
    /// Its host clock onto the job's.
    pub(crate) clock: ntff::RootClock,
    /// Its collectives that ended with a status (left out of the views).
    pub(crate) failed: u64,
}

/// A collective's start, until its stop.
struct Open {
    at_ns: u64,
    entry: CollectiveEntry,
    rank: u32,
    communicator: u32,
}

/// Reads `path`'s collectives; `None` when it holds none.
pub(crate) fn read(path: &Path) -> Result<Option<RankProfile>> {
    let file = NtffFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (pid, host) = (file.metadata().pid, file.metadata().host.clone());
    let membership = file.communicators().to_vec();
    let mut anchors: Vec<(u64, i64, u64)> = Vec::new();
    let mut opened: HashMap<u64, Open> = HashMap::new();
    let mut spans: Vec<(Open, u64)> = Vec::new();
    let mut failed = 0u64;
    let infos = file.chunks().to_vec();
    file.for_each_chunk(&infos, 2, |_, chunk| -> Result<()> {
        let chunk = chunk?;
        for e in &chunk.system {
            let Some(event) = to_system_event(&file, e) else { continue };
            match (&event.data, event.phase) {
                (EventData::ClockOffset { offset_ns, uncertainty_ns }, _) => {
                    anchors.push((event.timestamp_ns, *offset_ns, *uncertainty_ns));
                }
                (
                    EventData::Collective { operation, algorithm, bytes, op_id, rank, sequence, communicator, .. },
                    Phase::Start,
                ) => {
                    let (Ok(operation), Ok(algorithm)) =
                        (operation.parse::<CollectiveOp>(), algorithm.parse::<CollectiveAlgorithm>())
                    else {
                        continue;
                    };
                    let entry = CollectiveEntry {
                        position: Position { sequence: *sequence, index: (*op_id).min(u32::from(u16::MAX)) as u16 },
                        operation,
                        algorithm,
                        group: 0,
                        bytes: *bytes,
                        arrived_ns: 0,
                        departed_ns: None,
                        before: None,
                    };
                    let open = Open { at_ns: event.timestamp_ns, entry, rank: *rank, communicator: *communicator };
                    opened.insert(event.tracking_id, open);
                }
                (EventData::Collective { status, .. }, Phase::Stop) => {
                    let open = opened.remove(&event.tracking_id);
                    if status.is_some() {
                        failed += 1;
                    } else if let Some(open) = open {
                        spans.push((open, event.timestamp_ns));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    })?;
    if spans.is_empty() && failed == 0 {
        return Ok(None);
    }
    let clock = ntff::RootClock::new(anchors);
    let root = |t: u64| clock.to_root(t);
    let offset = clock.latest().map(|(offset_ns, uncertainty_ns)| ClockOffsetRecord { offset_ns, uncertainty_ns });
    let collectives = spans.into_iter().map(|(open, stop)| TracedCollective {
        communicator: open.communicator,
        rank: open.rank,
        core: None,
        entry: CollectiveEntry { arrived_ns: root(open.at_ns), departed_ns: Some(root(stop)), ..open.entry },
    });
    let records = RuntimeRecords::from_profile(pid, &host, offset, collectives);
    Ok(Some(RankProfile { path: path.to_owned(), host, records, anchors: clock.anchors(), membership, clock, failed }))
}

/// The group views of the profiles' communicators, over every collective they hold.
pub(crate) fn views(profiles: &[RankProfile]) -> Vec<GroupView> {
    let mut records: Vec<RuntimeRecords> = profiles.iter().map(|p| p.records.clone()).collect();
    count_ranks(&mut records);
    let rule = StragglerRule { window: usize::MAX, ..StragglerRule::default() };
    group_views(&records, &rule, 0)
}

/// The ranks' report: the profiles, and per communicator the clocks, the findings and
/// the collectives (`summary-text` prints it, `summary-json` gives it as `ranks`).
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// Profiles of the directory whose recording did not finish (`*.ntff.partial`): a
    /// process that died, or a recording that was stopped.
    unfinished: Vec<Unfinished>,
    profiles: Vec<ProfileLine>,
    communicators: Vec<CommunicatorReport>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Unfinished {
    pub(crate) file: String,
    pub(crate) bytes: u64,
}

#[derive(Debug, Serialize)]
struct ProfileLine {
    file: String,
    host: String,
    pid: u32,
    ranks: Vec<u32>,
    /// `clock_offset` events in the file (0: on the root's clock).
    clock_anchors: usize,
    /// Collectives that ended with a status.
    failed_collectives: u64,
}

#[derive(Debug, Serialize)]
struct CommunicatorReport {
    id: u32,
    /// The group's ranks: as recorded with the profiles, else those with a profile.
    ranks: usize,
    /// Its members as the profiles recorded them (empty in older files).
    members: Vec<MemberLine>,
    /// Members without a profile here: their arrivals are unknown.
    without_profile: Vec<u32>,
    /// Orderings closer than this are ties.
    clock_uncertainty_ns: u64,
    /// Ranked by the time they could save; the straggler first.
    findings: Vec<String>,
    straggler: Option<Straggler>,
    /// What the straggler was doing before it arrived, from its profile.
    straggler_before: Option<BeforeArrival>,
    /// The other ranks' time from their previous collective to their arrival, median of
    /// their medians.
    others_since_previous_ns: Option<u64>,
    collectives: Vec<CollectiveRow>,
}

#[derive(Debug, Serialize)]
struct MemberLine {
    rank: u32,
    pid: u32,
    host: String,
}

#[derive(Debug, Serialize)]
struct CollectiveRow {
    sequence: u32,
    index: u16,
    operation: &'static str,
    bytes: u64,
    algorithm: &'static str,
    complete: bool,
    skew_ns: u64,
    /// `None`: a tie within the clocks' uncertainty, or a rank missing.
    last_arriver: Option<u32>,
    /// From the last arrival to the last departure (the data's time).
    duration_ns: Option<u64>,
    algbw_gb_per_s: Option<f64>,
    busbw_gb_per_s: Option<f64>,
}

pub(crate) fn report(profiles: &[RankProfile], views: &[GroupView], unfinished: Vec<Unfinished>) -> Report {
    let profiles_out = profiles
        .iter()
        .map(|p| ProfileLine {
            file: p.path.file_name().map_or_else(|| p.path.display().to_string(), |n| n.to_string_lossy().into_owned()),
            host: p.host.clone(),
            pid: p.records.pid,
            ranks: {
                let mut ranks: Vec<u32> =
                    p.records.communicators.iter().flat_map(|c| c.members.iter().map(|m| m.rank)).collect();
                if ranks.is_empty() {
                    // No complete collective: the ranks its file recorded for its process.
                    let own = p.membership.iter().flat_map(|c| &c.members).filter(|m| m.pid == p.records.pid);
                    ranks = own.map(|m| m.rank).collect();
                }
                ranks
            },
            clock_anchors: p.anchors,
            failed_collectives: p.failed,
        })
        .collect();
    let communicators = views
        .iter()
        .map(|view| {
            let n = view.members.len().max(1) as f64;
            let collectives = view
                .collectives
                .iter()
                .map(|c| {
                    let last_arrival = c.arrivals.iter().map(|a| a.1).max().unwrap_or(0);
                    let departures = view
                        .members
                        .iter()
                        .filter_map(|m| profiles.iter().find_map(|p| departure(p, view.id, m.rank, c.position)))
                        .max();
                    let duration_ns = departures.map(|d| d.saturating_sub(last_arrival));
                    let algbw = duration_ns.filter(|&d| d > 0).map(|d| c.bytes as f64 / d as f64);
                    let factor = if c.operation == "all-reduce" { 2.0 * (n - 1.0) / n } else { (n - 1.0) / n };
                    CollectiveRow {
                        sequence: c.position.sequence,
                        index: c.position.index,
                        operation: c.operation,
                        bytes: c.bytes,
                        algorithm: c.algorithm,
                        complete: c.complete,
                        skew_ns: c.skew_ns,
                        last_arriver: c.last,
                        duration_ns,
                        algbw_gb_per_s: algbw,
                        busbw_gb_per_s: algbw.map(|a| a * factor),
                    }
                })
                .collect();
            let recorded = profiles.iter().flat_map(|p| &p.membership).find(|c| c.id == view.id);
            let members: Vec<MemberLine> = recorded.map_or_else(Vec::new, |c| {
                c.members.iter().map(|m| MemberLine { rank: m.rank, pid: m.pid, host: m.host.clone() }).collect()
            });
            let without_profile =
                members.iter().map(|m| m.rank).filter(|r| !view.members.iter().any(|v| v.rank == *r)).collect();
            // The straggler's time before its arrivals at the collective of its steps it
            // was late at, against the other ranks'.
            let late_at = view.straggler.as_ref().map_or(0, |s| s.at.index);
            let before = |rank: u32| {
                let profile = profiles.iter().find(|p| {
                    p.records.communicators.iter().any(|c| c.id == view.id && c.members.iter().any(|m| m.rank == rank))
                })?;
                let gaps = gaps(profile, view.id, rank, late_at);
                activity::before_arrivals(&profile.path, &profile.clock, &gaps).ok().flatten()
            };
            let straggler_before = view.straggler.as_ref().and_then(|s| before(s.rank));
            let others_since_previous_ns = view.straggler.as_ref().and_then(|s| {
                let others: Vec<u64> = view
                    .members
                    .iter()
                    .filter(|m| m.rank != s.rank)
                    .filter_map(|m| before(m.rank))
                    .map(|b| b.since_previous_ns)
                    .collect();
                let mut sorted = others;
                sorted.sort_unstable();
                sorted.get(sorted.len() / 2).copied()
            });
            CommunicatorReport {
                straggler_before,
                others_since_previous_ns,
                id: view.id,
                ranks: recorded.map_or(view.members.len(), |c| c.ranks as usize),
                members,
                without_profile,
                clock_uncertainty_ns: view.uncertainty_ns,
                findings: view.straggler.iter().map(|s| s.text.clone()).collect(),
                straggler: view.straggler.clone(),
                collectives,
            }
        })
        .collect();
    Report { unfinished, profiles: profiles_out, communicators }
}

impl Report {
    /// For people.
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        // What failed first.
        for u in &self.unfinished {
            let _ = writeln!(
                out,
                "FAILED: {} ({} bytes) was never finished: its process died, or its recording was stopped; its \
                 collectives are not in this report (read what it holds with -s)",
                u.file, u.bytes
            );
        }
        for p in self.profiles.iter().filter(|p| p.failed_collectives > 0) {
            let _ = writeln!(
                out,
                "FAILED: {} collective{} of {} ended with an error (its summary below says which first)",
                p.failed_collectives,
                if p.failed_collectives == 1 { "" } else { "s" },
                p.file
            );
        }
        let anchored = self.profiles.iter().filter(|p| p.clock_anchors > 0).count();
        let _ = writeln!(
            out,
            "Ranks: {} profile{} with collectives; {} of them with clock anchors (the others are on the root's clock)",
            self.profiles.len(),
            if self.profiles.len() == 1 { "" } else { "s" },
            anchored
        );
        for p in &self.profiles {
            let ranks: Vec<String> = p.ranks.iter().map(u32::to_string).collect();
            let _ = writeln!(out, "  {}: host {}, pid {}, rank {}", p.file, p.host, p.pid, ranks.join(", "));
        }
        for comm in &self.communicators {
            let _ = writeln!(
                out,
                "\ncommunicator {}: {} ranks; orderings closer than ±{} (the clocks' uncertainty) are ties",
                comm.id,
                comm.ranks,
                format_ns(comm.clock_uncertainty_ns)
            );
            if !comm.members.is_empty() {
                let members: Vec<String> = comm
                    .members
                    .iter()
                    .map(|m| match (m.pid, m.host.as_str()) {
                        (0, _) => format!("{} (not yet known)", m.rank),
                        (pid, "") => format!("{} (pid {pid})", m.rank),
                        (pid, host) => format!("{} (pid {pid} on {host})", m.rank),
                    })
                    .collect();
                let _ = writeln!(out, "members, as recorded: {}", members.join(", "));
            }
            if !comm.without_profile.is_empty() {
                let ranks: Vec<String> = comm.without_profile.iter().map(u32::to_string).collect();
                let _ = writeln!(
                    out,
                    "no profile here of rank{} {}: their arrivals are not in these files, so the table and findings leave them out",
                    if ranks.len() == 1 { "" } else { "s" },
                    ranks.join(", ")
                );
            }
            let _ = writeln!(out, "Findings:");
            if comm.findings.is_empty() {
                let complete = comm.collectives.iter().filter(|c| c.complete).count();
                let steps: std::collections::BTreeSet<u32> =
                    comm.collectives.iter().filter(|c| c.complete).map(|c| c.sequence).collect();
                let _ = writeln!(
                    out,
                    "  none: no rank arrived last in most of the {} steps of the {complete} complete collectives",
                    steps.len()
                );
            }
            for (k, finding) in comm.findings.iter().enumerate() {
                let _ = writeln!(out, "  {}. {finding}", k + 1);
                if let (0, Some(before)) = (k, &comm.straggler_before) {
                    let others = comm
                        .others_since_previous_ns
                        .map_or_else(String::new, |ns| format!("; the other ranks: {} since theirs", format_ns(ns)));
                    let _ = writeln!(
                        out,
                        "     before it arrived there, on median over {} steps, from its profile: {}{others}",
                        before.collectives,
                        before.text()
                    );
                }
            }
            let _ = writeln!(
                out,
                "Collectives ({}):\n  {:>8} {:<14} {:>10} {:<10} {:>10} {:>6} {:>10} {:>9} {:>9}",
                comm.collectives.len(),
                "seq",
                "operation",
                "bytes",
                "algorithm",
                "skew",
                "last",
                "duration",
                "algbw",
                "busbw"
            );
            let gbs = |v: Option<f64>| v.map_or_else(|| "N/A".to_owned(), |v| format!("{v:.3}"));
            for c in &comm.collectives {
                let position = Position { sequence: c.sequence, index: c.index };
                let last = match (c.last_arriver, c.complete) {
                    (Some(r), _) => r.to_string(),
                    (None, true) => "tie".to_owned(),
                    (None, false) => "?".to_owned(),
                };
                let _ = writeln!(
                    out,
                    "  {:>8} {:<14} {:>10} {:<10} {:>10} {:>6} {:>10} {:>9} {:>9}",
                    position.to_string(),
                    c.operation,
                    c.bytes,
                    c.algorithm,
                    format_ns(c.skew_ns),
                    last,
                    c.duration_ns.map_or_else(|| "N/A".to_owned(), format_ns),
                    gbs(c.algbw_gb_per_s),
                    gbs(c.busbw_gb_per_s),
                );
            }
        }
        out
    }
}

/// Rank `rank`'s time from each collective's end to its arrival at the next of index
/// `index` in its step, in its profile of communicator `id`, on the job's clock:
/// (previous departure, arrival).
fn gaps(profile: &RankProfile, id: u32, rank: u32, index: u16) -> Vec<(u64, u64)> {
    let Some(member) = profile
        .records
        .communicators
        .iter()
        .find(|c| c.id == id)
        .and_then(|c| c.members.iter().find(|m| m.rank == rank))
    else {
        return Vec::new();
    };
    member
        .history
        .windows(2)
        .filter(|w| w[1].position.index == index)
        .filter_map(|w| Some((w[0].departed_ns?, w[1].arrived_ns)).filter(|(a, b)| b > a))
        .collect()
}

fn departure(profile: &RankProfile, id: u32, rank: u32, at: Position) -> Option<u64> {
    let comm = profile.records.communicators.iter().find(|c| c.id == id)?;
    let member = comm.members.iter().find(|m| m.rank == rank)?;
    member.history.iter().find(|e| e.position == at)?.departed_ns
}
