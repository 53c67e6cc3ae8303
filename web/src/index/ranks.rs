//! The profiles of a job's ranks (`profile_rank_<id>.ntff`) as one timeline: each file
//! indexed on its own, its times moved onto rank 0's clock by the offsets its
//! `clock_offset` events measured ([`RootClock`]), all framed by the same origin and
//! end so that one view asks every rank for the same columns; the tracks of each rank
//! in turn, named after it. Each collective that two or more ranks ran is joined across
//! them: its parts (`cc_running` spans, matched by communicator, sequence and position
//! in the execution) are sent with a view as a flow from the first rank to arrive to
//! the last, which the page draws as arrows.

use std::collections::HashMap;

use neuron_datastore::flight::{CollectiveEntry, Position};
use neuron_datastore::ranks::{GroupView, RuntimeRecords, StragglerRule, TracedCollective, count_ranks, group_views};
use neuron_datastore::{ClockOffsetRecord, CollectiveAlgorithm, CollectiveOp};
use ntff::{ArgValue, NtffFile, RootClock};
use serde::Serialize;

use super::{ProfileIndex, TrackKind, TrackView};

/// Collectives a view sends flows for, at most: more would hide the spans; the page
/// says how many were left out, to zoom in on.
const MAX_FLOWS: usize = 500;

/// One rank's profile in the job's timeline.
#[derive(Debug)]
pub(crate) struct RankPart {
    /// The lowest rank of the file's process (from its name).
    pub rank: u32,
    pub name: String,
    pub host: String,
    pub pid: u32,
    /// The offset its times moved by onto rank 0's clock and the largest uncertainty of
    /// its measures; `None` without any (on rank 0's clock already).
    pub clock: Option<(i64, u64)>,
    pub index: ProfileIndex,
    /// Its first track among the job's.
    first_track: usize,
}

/// One collective as two or more ranks ran it.
#[derive(Debug)]
struct Collective {
    /// The first arrival and the last departure, on the root's clock.
    start: u64,
    end: u64,
    /// Each rank's part: its track among the job's, and its start; by start.
    parts: Vec<(usize, u64)>,
}

/// The job's timeline.
#[derive(Debug)]
pub(crate) struct RanksIndex {
    pub parts: Vec<RankPart>,
    pub origin: u64,
    pub end: u64,
    /// Of every track of the job: its part and its index there, and its name.
    tracks: Vec<(usize, usize, String)>,
    /// By start.
    collectives: Vec<Collective>,
    longest_collective: u64,
    /// Each communicator as the live tools' group view shows it, over every collective
    /// of the profiles: the straggler by the same rule.
    pub groups: Vec<GroupView>,
}

/// What one view of the job's timeline sends: the tracks as one profile's view does
/// (labels numbered per rank), and the collectives' flows.
#[derive(Debug, Serialize)]
pub(crate) struct RanksView {
    pub t0: u64,
    pub t1: u64,
    pub columns: u32,
    pub tracks: Vec<TrackView>,
    pub labels: HashMap<u64, String>,
    /// Per collective in range, its parts by arrival: `[track, start]`, start from the
    /// origin.
    pub flows: Vec<Vec<[u64; 2]>>,
    /// Collectives in range whose flows were not sent (more than [`MAX_FLOWS`]).
    pub flows_left_out: usize,
}

impl RanksIndex {
    /// Indexes `files` (rank, name, file), each on the root's clock.
    pub(crate) fn build(files: Vec<(u32, String, NtffFile)>) -> RanksIndex {
        let mut parts: Vec<RankPart> = files
            .into_iter()
            .map(|(rank, name, file)| {
                let root = RootClock::of(&file);
                let (host, pid) = (file.metadata().host.clone(), file.metadata().pid);
                let clock = root.latest();
                RankPart { rank, name, host, pid, clock, index: ProfileIndex::build_part(file, &root), first_track: 0 }
            })
            .collect();
        parts.sort_by_key(|p| (p.rank, p.name.clone()));
        let origin = parts.iter().map(|p| p.index.origin).min().unwrap_or(0);
        let end = parts.iter().map(|p| p.index.end).max().unwrap_or(origin);
        let mut tracks = Vec::new();
        for (k, part) in parts.iter_mut().enumerate() {
            part.index.frame(origin, end);
            part.first_track = tracks.len();
            for (i, track) in part.index.tracks.iter().enumerate() {
                tracks.push((k, i, format!("r{} {}", part.rank, track.name)));
            }
        }
        let mut index = RanksIndex {
            parts,
            origin,
            end,
            tracks,
            collectives: Vec::new(),
            longest_collective: 0,
            groups: Vec::new(),
        };
        let traced = index.traced();
        index.collectives = RanksIndex::join_collectives(&traced);
        index.longest_collective = index.collectives.iter().map(|c| c.end - c.start).max().unwrap_or(0);
        let rule = StragglerRule { window: usize::MAX, ..StragglerRule::default() };
        index.groups = group_views(&index.records(&traced), &rule, 0);
        index
    }

    /// Each part's collectives as its trace recorded them (`cc_running` spans), on the
    /// job's clock, with their track among the job's: read once, for the flows and for
    /// the group view.
    fn traced(&self) -> Vec<Vec<(usize, TracedCollective)>> {
        let mut traced = Vec::with_capacity(self.parts.len());
        for part in &self.parts {
            let index = &part.index;
            let file = index.file();
            let mut collectives = Vec::new();
            let Some(running) = file.find_string("cc_running") else {
                traced.push(collectives);
                continue;
            };
            let key = |name: &str| file.find_string(name);
            let keys = ["communicator", "sequence", "op_id", "rank", "bytes", "operation", "algorithm"].map(key);
            for (i, track) in index.tracks.iter().enumerate().filter(|(_, t)| t.kind == TrackKind::System) {
                for span in &track.spans {
                    let Some(detail) = index.details.get(span.detail as usize).filter(|d| d.name == running) else {
                        continue;
                    };
                    let arg = |k: usize| detail.args.iter().find(|a| Some(a.key) == keys[k]).map(|a| a.value);
                    let number = |k: usize| match arg(k) {
                        Some(ArgValue::U64(v)) => Some(v),
                        _ => None,
                    };
                    let text = |k: usize| match arg(k) {
                        Some(ArgValue::Str(s)) => file.string(s),
                        _ => None,
                    };
                    let (Some(comm), Some(sequence), Some(op), Some(rank), Some(bytes)) =
                        (number(0), number(1), number(2), number(3), number(4))
                    else {
                        continue;
                    };
                    let (Some(Ok(operation)), Some(Ok(algorithm))) =
                        (text(5).map(str::parse::<CollectiveOp>), text(6).map(str::parse::<CollectiveAlgorithm>))
                    else {
                        continue;
                    };
                    let position = Position { sequence: sequence as u32, index: op.min(u64::from(u16::MAX)) as u16 };
                    let entry = CollectiveEntry {
                        position,
                        operation,
                        algorithm,
                        group: 0,
                        bytes,
                        arrived_ns: span.start,
                        departed_ns: Some(span.end),
                        before: None,
                    };
                    let collective =
                        TracedCollective { communicator: comm as u32, rank: rank as u32, core: track.core, entry };
                    collectives.push((part.first_track + i, collective));
                }
            }
            traced.push(collectives);
        }
        traced
    }

    /// Each rank's collectives as a runtime's records, for the group view (as
    /// `neuron-profile view -d` reads them).
    fn records(&self, traced: &[Vec<(usize, TracedCollective)>]) -> Vec<RuntimeRecords> {
        let mut records: Vec<RuntimeRecords> = self
            .parts
            .iter()
            .zip(traced)
            .map(|(part, collectives)| {
                let clock =
                    part.clock.map(|(offset_ns, uncertainty_ns)| ClockOffsetRecord { offset_ns, uncertainty_ns });
                RuntimeRecords::from_profile(part.pid, &part.host, clock, collectives.iter().map(|(_, c)| c.clone()))
            })
            .collect();
        count_ranks(&mut records);
        records
    }

    /// The collectives two or more ranks ran, by start.
    fn join_collectives(traced: &[Vec<(usize, TracedCollective)>]) -> Vec<Collective> {
        // By (communicator, sequence, position): each part's track, start and end.
        type Parts = Vec<(usize, u64, u64)>;
        let mut by_key: HashMap<(u32, u32, u16), Parts> = HashMap::new();
        for (track, c) in traced.iter().flatten() {
            let (e, key) = (&c.entry, (c.communicator, c.entry.position.sequence, c.entry.position.index));
            by_key.entry(key).or_default().push((*track, e.arrived_ns, e.departed_ns.unwrap_or(e.arrived_ns)));
        }
        let mut collectives: Vec<Collective> = by_key
            .into_values()
            .filter(|parts| parts.len() > 1)
            .map(|mut parts| {
                parts.sort_by_key(|p| p.1);
                Collective {
                    start: parts[0].1,
                    end: parts.iter().map(|p| p.2).max().unwrap_or(parts[0].1),
                    parts: parts.into_iter().map(|(track, start, _)| (track, start)).collect(),
                }
            })
            .collect();
        collectives.sort_by_key(|c| c.start);
        collectives
    }

    /// Every track's name, in order.
    pub(crate) fn track_names(&self) -> impl Iterator<Item = (&str, &super::Track)> {
        self.tracks.iter().map(|(part, i, name)| (name.as_str(), &self.parts[*part].index.tracks[*i]))
    }

    /// Collectives joined across two or more ranks.
    pub(crate) fn collectives(&self) -> usize {
        self.collectives.len()
    }

    pub(crate) fn events(&self) -> u64 {
        self.parts.iter().map(|p| p.index.events).sum()
    }

    /// The job's tracks in `[t0, t1)` (from the origin) at `columns` pixels across, and
    /// the flows of the collectives in range.
    pub(crate) fn view(&self, t0: u64, t1: u64, columns: u32) -> RanksView {
        let mut out = RanksView {
            t0,
            t1,
            columns,
            tracks: Vec::new(),
            labels: HashMap::new(),
            flows: Vec::new(),
            flows_left_out: 0,
        };
        for (k, part) in self.parts.iter().enumerate() {
            // Labels are the file's string ids: numbered per rank above 32 bits.
            let label = |id: u64| (k as u64) << 32 | id;
            let view = part.index.view(t0, t1, columns);
            (out.t0, out.t1, out.columns) = (view.t0, view.t1, view.columns);
            out.labels.extend(view.labels.into_iter().map(|(id, name)| (label(u64::from(id)), name)));
            for mut track in view.tracks {
                match &mut track {
                    TrackView::Raw { track, spans } => {
                        *track += part.first_track;
                        spans.iter_mut().for_each(|s| s[2] = label(s[2]));
                    }
                    TrackView::Bins { track, bins } => {
                        *track += part.first_track;
                        bins.iter_mut().for_each(|b| b[3] = label(b[3]));
                    }
                }
                out.tracks.push(track);
            }
        }
        let (a, b) = (self.origin + out.t0, self.origin + out.t1);
        let last = self.collectives.partition_point(|c| c.start <= b);
        let first = self.collectives[..last].partition_point(|c| c.start + self.longest_collective < a);
        let in_range: Vec<&Collective> = self.collectives[first..last].iter().filter(|c| c.end >= a).collect();
        if in_range.len() > MAX_FLOWS {
            out.flows_left_out = in_range.len();
        } else {
            out.flows = in_range
                .into_iter()
                .map(|c| c.parts.iter().map(|&(track, start)| [track as u64, start - self.origin]).collect())
                .collect();
        }
        out
    }

    /// The part and its own track of the job's track `track`.
    fn locate(&self, track: usize) -> Option<(&RankPart, usize)> {
        let &(part, i, _) = self.tracks.get(track)?;
        Some((&self.parts[part], i))
    }

    /// Everything known of span `k` of `track`, with its rank.
    pub(crate) fn details(&self, track: usize, k: usize) -> Option<serde_json::Value> {
        let (part, i) = self.locate(track)?;
        let mut out = part.index.details(i, k)?;
        out["track"] = self.tracks[track].2.clone().into();
        out["rank"] = part.rank.into();
        out["host"] = part.host.clone().into();
        out["pid"] = part.pid.into();
        if let Some(t) = out["execution"]["track"].as_u64() {
            out["execution"]["track"] = (t as usize + part.first_track).into();
        }
        Some(out)
    }

    /// The longest span of HLO instruction `hlo` on any rank.
    pub(crate) fn longest_of_hlo(&self, hlo: &str) -> Option<(usize, usize)> {
        self.parts
            .iter()
            .filter_map(|part| {
                let (i, k) = part.index.longest_of_hlo(hlo)?;
                let (start, end) = part.index.span_time(i, k)?;
                Some((end - start, part.first_track + i, k))
            })
            .max_by_key(|found| found.0)
            .map(|(_, track, k)| (track, k))
    }

    /// Where span `k` of `track` is, from the origin.
    pub(crate) fn span_time(&self, track: usize, k: usize) -> Option<(u64, u64)> {
        let (part, i) = self.locate(track)?;
        part.index.span_time(i, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ntff::{Arg, Clock, Metadata, Phase, SystemEvent, Writer};

    /// Rank `rank`'s profile: three all-reduces on its core 0, each `lateness` after
    /// rank 0's on the root's clock, on a host whose clock reads `shift` ahead of the
    /// root's (which its `clock_offset` event says).
    fn rank_file(rank: u64, shift: u64, lateness: u64) -> NtffFile {
        let metadata = Metadata { runtime_version: "test".into(), pid: 100 + rank as u32, ..Metadata::default() };
        let mut w = Writer::new(Vec::new(), &metadata).expect("header");
        let names = ["cc_running", "clock_offset"].map(|n| w.intern(n));
        let keys =
            ["communicator", "sequence", "op_id", "rank", "bytes", "offset_ns", "uncertainty_ns"].map(|k| w.intern(k));
        let event = |name, phase, ts, tracking_id, args| SystemEvent {
            core: Some(0),
            id: ts,
            name,
            phase,
            clock: Clock::Host,
            timestamp_ns: ts,
            tracking_id,
            thread_id: 1,
            exec_id: None,
            model_id: None,
            nrta_seq_id: None,
            args,
        };
        if shift > 0 {
            let args = vec![
                Arg { key: keys[5], value: ArgValue::I64(-(shift as i64)) },
                Arg { key: keys[6], value: ArgValue::U64(10_000) },
            ];
            let measured = event(names[1], Phase::Instant, shift + 10_000_000, 0, args);
            w.system(&SystemEvent { core: None, ..measured }).expect("write");
        }
        for sequence in 1..=3u64 {
            let at = shift + sequence * 10_000_000 + lateness;
            let mut args: Vec<Arg> = [0, sequence, 0, rank, 4096]
                .into_iter()
                .zip(keys)
                .map(|(v, key)| Arg { key, value: ArgValue::U64(v) })
                .collect();
            for (key, value) in [("operation", "all-reduce"), ("algorithm", "all-to-all")] {
                args.push(Arg { key: w.intern(key), value: ArgValue::Str(w.intern(value)) });
            }
            let start = event(names[0], Phase::Start, at, sequence, args);
            w.system(&start).expect("write");
            w.system(&SystemEvent { phase: Phase::Stop, timestamp_ns: at + 2_000_000 - lateness, ..start })
                .expect("write");
        }
        NtffFile::from_bytes(w.finish().expect("finish").0).expect("opens")
    }

    #[test]
    fn ranks_on_clocks_five_seconds_apart_line_up_and_their_collectives_are_joined() {
        const SHIFT: u64 = 5_000_000_000;
        const LATE: u64 = 1_000_000;
        let job = RanksIndex::build(vec![
            (1, "profile_rank_1.ntff".into(), rank_file(1, SHIFT, LATE)),
            (0, "profile_rank_0.ntff".into(), rank_file(0, 0, 0)),
        ]);
        assert_eq!(
            job.parts.iter().map(|p| (p.rank, p.clock)).collect::<Vec<_>>(),
            [(0, None), (1, Some((-(SHIFT as i64), 10_000)))]
        );
        let names: Vec<&str> = job.track_names().map(|(name, _)| name).collect();
        assert_eq!(names, ["r0 nc0", "r1 nc0", "r1 host"]);
        // On the root's clock the job lasts 22 ms, not 5 s.
        assert_eq!(job.end - job.origin, 22_000_000);
        let view = job.view(0, u64::MAX, 1000);
        let starts: Vec<Vec<u64>> = view
            .tracks
            .iter()
            .map(|t| match t {
                TrackView::Raw { spans, .. } => spans.iter().map(|s| s[0]).collect(),
                TrackView::Bins { .. } => panic!("three spans are sent raw"),
            })
            .collect();
        assert_eq!(starts, [vec![0, 10_000_000, 20_000_000], vec![1_000_000, 11_000_000, 21_000_000], vec![0]]);
        // Each rank's labels stay its own.
        let labels: Vec<&String> = view
            .tracks
            .iter()
            .flat_map(|t| match t {
                TrackView::Raw { spans, .. } => spans.iter().map(|s| &view.labels[&s[2]]).collect::<Vec<_>>(),
                TrackView::Bins { .. } => Vec::new(),
            })
            .collect();
        assert_eq!(labels.iter().filter(|l| **l == "cc_running").count(), 6, "{:?}", view.labels);
        assert_eq!(*labels[6], "clock_offset");
        // Each all-reduce: one flow from rank 0 (first in) to rank 1.
        assert_eq!(
            view.flows,
            [
                vec![[0, 0], [1, 1_000_000]],
                vec![[0, 10_000_000], [1, 11_000_000]],
                vec![[0, 20_000_000], [1, 21_000_000]]
            ]
        );
        assert_eq!(job.collectives(), 3);
        // A view of the second collective alone has its flow only.
        assert_eq!(job.view(10_500_000, 10_600_000, 100).flows, [vec![[0, 10_000_000], [1, 11_000_000]]]);
        let details = job.details(1, 0).expect("a span");
        assert_eq!((details["rank"].as_u64(), details["track"].as_str()), (Some(1), Some("r1 nc0")));
        assert_eq!(details["args"]["sequence"].as_u64(), Some(1));
        // The group view of the live tools over them: rank 1 last in each, 1 ms late;
        // three collectives are too few to name a straggler.
        let [group] = job.groups.as_slice() else { panic!("one group: {:?}", job.groups) };
        assert_eq!(group.members.len(), 2);
        assert!(group.collectives.iter().all(|c| c.last == Some(1) && c.skew_ns == LATE && c.complete));
        assert_eq!(group.collectives.len(), 3);
        assert!(group.straggler.is_none());
    }
}
