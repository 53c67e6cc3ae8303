//! A profile's timeline, indexed for drawing at any zoom.
//!
//! Opening a profile decodes its chunks once (in parallel) into one sorted array of
//! spans per track: per NeuronCore its system events (start/stop pairs, nested by
//! depth), one track per engine and one per DMA queue; the host's own events on a track
//! of their own. Device times are moved onto the host clock through the core's sync
//! points, as the Perfetto export does. A view asks for a time range and a width in
//! pixels: a track with few spans in range answers with the spans themselves, a busy
//! one with one bin per pixel column (busy time, count, the label that took most of it).

use std::collections::HashMap;

use ntff::{ArgValue, Clock, Descriptor, DescriptorId, NtffFile, Phase, RootClock, Sym, SyncClock, SystemEvent};
use rayon::prelude::*;
use serde::Serialize;

mod ranks;

pub(crate) use ranks::RanksIndex;

/// Spans a track sends raw, per pixel column of the view, at most.
const RAW_PER_COLUMN: f64 = 0.5;

/// What a track shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TrackKind {
    /// System events (runtime API calls, executions) of a core, or of the host.
    System,
    /// Instructions of one engine.
    Engine,
    /// Transfers of one DMA queue.
    Dma,
}

/// One span on a track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: u64,
    end: u64,
    /// A string id of the file: opcode, DMA queue or event name.
    label: u32,
    /// Device spans: the descriptor id. System spans: the index of its details.
    detail: u32,
}

/// A track: its spans sorted by start.
#[derive(Debug)]
pub(crate) struct Track {
    pub core: Option<u32>,
    pub kind: TrackKind,
    pub name: String,
    spans: Vec<Span>,
    /// Nesting depth of each span (system tracks only; empty otherwise).
    depth: Vec<u8>,
    /// The longest span but for `long`, so that a range lookup finds spans that began
    /// before it.
    longest: u64,
    /// The few longest spans (an `nrt_load`, a span the capture cut), by position: looked
    /// at one by one, so that they do not widen every lookup.
    long: Vec<usize>,
    /// Busy time in fixed bins over the whole profile, for views zoomed far out.
    coarse: Option<Coarse>,
}

/// Bins at which a busy track is summarised once, so that a view zoomed out reads bins
/// instead of every span.
const COARSE_BINS: usize = 1 << 16;
/// A view uses the bins when each of its columns spans this many of them at least.
const BINS_PER_COLUMN: f64 = 8.0;

/// A track's busy time, span count and main label per bin of `width` ns from the
/// profile's origin.
#[derive(Debug)]
struct Coarse {
    width: f64,
    busy: Vec<u64>,
    count: Vec<u32>,
    label: Vec<u32>,
}

impl Coarse {
    fn build(spans: &[Span], origin: u64, end: u64) -> Coarse {
        let n = COARSE_BINS;
        let width = ((end - origin) as f64 / n as f64).max(1.0);
        let mut c = Coarse { width, busy: vec![0; n], count: vec![0; n], label: vec![0; n] };
        let mut best = vec![0u64; n];
        let bin_of = |t: u64| (((t - origin) as f64 / width) as usize).min(n - 1);
        for s in spans {
            // A span counts in the bin it starts in; its time in every bin it covers.
            let (first, last) = (bin_of(s.start), bin_of(s.end));
            c.count[first] += 1;
            if first == last {
                c.add(&mut best, first, s.end - s.start, s.label);
                continue;
            }
            for k in first..=last {
                let lo = origin + (k as f64 * width) as u64;
                let hi = origin + ((k + 1) as f64 * width) as u64;
                c.add(&mut best, k, s.end.min(hi).saturating_sub(s.start.max(lo)), s.label);
            }
        }
        c
    }

    /// Adds `overlap` ns of a span labelled `label` to bin `k`; `best` is the largest
    /// overlap of a span in each bin so far.
    fn add(&mut self, best: &mut [u64], k: usize, overlap: u64, label: u32) {
        self.busy[k] += overlap;
        if overlap >= best[k] {
            best[k] = overlap;
            self.label[k] = label;
        }
    }
}

impl Track {
    pub(crate) fn len(&self) -> usize {
        self.spans.len()
    }

    /// Nesting levels drawn (1 for device tracks).
    pub(crate) fn depth(&self) -> u16 {
        self.depth.iter().copied().max().map_or(1, |d| u16::from(d) + 1)
    }

    /// The spans that may overlap `[t0, t1)`: a range of positions, and long spans
    /// before it.
    fn range(&self, t0: u64, t1: u64) -> (std::ops::Range<usize>, Vec<usize>) {
        let from = t0.saturating_sub(self.longest);
        let lo = self.spans.partition_point(|s| s.start < from);
        let hi = self.spans.partition_point(|s| s.start < t1).max(lo);
        let before = self.long.iter().copied().filter(|&k| k < lo && self.spans[k].end >= t0).collect();
        (lo..hi, before)
    }

    /// Sets `longest` and `long`: spans longer than all but about a thousandth of the
    /// track's (judged on an even sample of them) are kept apart.
    fn split_long(&mut self) {
        const SAMPLE: usize = 1 << 16;
        let step = self.spans.len().div_ceil(SAMPLE).max(1);
        let mut durations: Vec<u64> = self.spans.iter().step_by(step).map(|s| s.end - s.start).collect();
        if durations.is_empty() {
            return;
        }
        let at = durations.len() - 1 - durations.len() / 1000;
        let bound = *durations.select_nth_unstable(at).1;
        self.long = (0..self.spans.len()).filter(|&k| self.spans[k].end - self.spans[k].start > bound).collect();
        self.longest = bound;
    }
}

/// A system span's details, kept for the click on it.
#[derive(Debug, Clone)]
struct SystemDetail {
    name: Sym,
    tracking_id: u64,
    thread_id: u32,
    exec_id: Option<u64>,
    model_id: Option<u32>,
    args: Vec<ntff::Arg>,
    /// The event had no stop in the file (the capture ended first).
    unfinished: bool,
}

/// The indexed timeline of one file.
#[derive(Debug)]
pub(crate) struct ProfileIndex {
    file: NtffFile,
    /// Host time of the first and last event.
    pub origin: u64,
    pub end: u64,
    pub tracks: Vec<Track>,
    details: Vec<SystemDetail>,
    /// Device events without a sync point on their core: they cannot be placed.
    pub unplaced: u64,
    pub events: u64,
    /// What is missing from the file: damaged or cut records, and chunks that could not
    /// be read (the same lines as the summary's `file_problems`).
    pub problems: Vec<String>,
    /// Events in the chunks that could not be read.
    pub events_lost_in_file: u64,
}

/// The view of one track in a range.
#[derive(Debug, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub(crate) enum TrackView {
    /// `[start, duration, label, depth, index]`, start relative to the profile's origin.
    Raw { track: usize, spans: Vec<[u64; 5]> },
    /// `[column, busy per mille, spans, label]` for each column with anything in it.
    Bins { track: usize, bins: Vec<[u64; 4]> },
}

/// What one view of the timeline sends.
#[derive(Debug, Serialize)]
pub(crate) struct View {
    pub t0: u64,
    pub t1: u64,
    pub columns: u32,
    pub tracks: Vec<TrackView>,
    /// Names of the labels used in `tracks`.
    pub labels: HashMap<u32, String>,
}

/// Key of a track while building: core, kind, and the engine or queue name.
type TrackKey = (Option<u32>, TrackKind, u32);
/// Key of a device track while decoding: core, and the engine or queue as a slot.
type SlotKey = (Option<u32>, usize);

/// What one chunk gave: its device spans by track slot, its system events as they are.
#[derive(Default)]
struct Decoded {
    core: Option<u32>,
    device: Vec<Vec<Span>>,
    system: Vec<SystemEvent>,
    unplaced: u64,
    /// Why the chunk could not be read, and the events it held.
    unreadable: Option<(String, u64)>,
}

impl ProfileIndex {
    /// Decodes every chunk of `file` into tracks.
    pub(crate) fn build(file: NtffFile) -> ProfileIndex {
        let mut index = ProfileIndex::build_part(file, &RootClock::default());
        let (origin, end) = (index.origin, index.end);
        index.frame(origin, end);
        index
    }

    /// Decodes every chunk of `file` into tracks, its host times moved by `root` (onto
    /// its job's root clock, or left as they are), framed by its own first and last
    /// event but not yet summarised for views zoomed out ([`ProfileIndex::frame`]).
    pub(crate) fn build_part(file: NtffFile, root: &RootClock) -> ProfileIndex {
        let chunks = file.chunks();
        let sync_points = file.sync_points_by_core(None);
        let clocks_of = || -> HashMap<u32, SyncClock> {
            sync_points.iter().map(|(&c, p)| (c, SyncClock::new(p.clone()).map_host(|t| root.to_root(t)))).collect()
        };
        // The track (engine or DMA queue, as a slot) and label of each descriptor, once.
        let mut slots: Vec<(TrackKind, u32)> = Vec::new();
        let by_descriptor: Vec<Option<(usize, u32)>> = file
            .descriptors()
            .iter()
            .map(|d| {
                let (kind, name, label) = match (*d)? {
                    Descriptor::Instruction { engine, opcode, .. } => (TrackKind::Engine, engine.0, opcode.0),
                    Descriptor::Dma { queue, .. } => (TrackKind::Dma, queue.0, queue.0),
                };
                let slot = slots.iter().position(|&s| s == (kind, name)).unwrap_or_else(|| {
                    slots.push((kind, name));
                    slots.len() - 1
                });
                Some((slot, label))
            })
            .collect();
        // Device events in parallel; system events come back per chunk, in file order,
        // to be paired start with stop across chunks.
        let decoded: Vec<Decoded> = chunks
            .par_iter()
            .map_init(clocks_of, |clocks, info| {
                let mut out = Decoded { core: info.core, device: vec![Vec::new(); slots.len()], ..Decoded::default() };
                let chunk = match file.read_chunk(info) {
                    Ok(chunk) => chunk,
                    Err(e) => {
                        let events = u64::from(info.system_events) + u64::from(info.device_events);
                        out.unreadable = Some((ntff::summary::unreadable_chunk(info, &e), events));
                        return out;
                    }
                };
                let clock = chunk.core.and_then(|c| clocks.get(&c));
                // Each slot's array sized once.
                let mut counts = vec![0usize; slots.len()];
                for e in &chunk.device {
                    if let Some(Some((slot, _))) = by_descriptor.get(e.descriptor.0 as usize) {
                        counts[*slot] += 1;
                    }
                }
                for (spans, n) in out.device.iter_mut().zip(counts) {
                    spans.reserve_exact(n);
                }
                for e in &chunk.device {
                    let placed = clock.and_then(|c| Some((c.to_host(e.start_ns)?, c.to_host(e.end_ns)?)));
                    let track = by_descriptor.get(e.descriptor.0 as usize).copied().flatten();
                    let (Some((start, end)), Some((slot, label))) = (placed, track) else {
                        out.unplaced += 1;
                        continue;
                    };
                    out.device[slot].push(Span { start, end: end.max(start), label, detail: e.descriptor.0 });
                }
                out.system = chunk.system;
                out
            })
            .collect();
        // One array per (core, slot), its chunks' spans in file order, put together in
        // parallel.
        let mut segments: HashMap<SlotKey, Vec<Vec<Span>>> = HashMap::new();
        let mut unplaced = 0;
        let mut problems = file.recovery().describe();
        let mut events_lost_in_file = file.recovery().events_lost();
        let mut system_chunks = Vec::with_capacity(decoded.len());
        for d in decoded {
            unplaced += d.unplaced;
            if let Some((problem, events)) = d.unreadable {
                problems.push(problem);
                events_lost_in_file += events;
            }
            for (slot, spans) in d.device.into_iter().enumerate().filter(|(_, s)| !s.is_empty()) {
                segments.entry((d.core, slot)).or_default().push(spans);
            }
            system_chunks.push((d.core, d.system));
        }
        let device: Vec<(SlotKey, Vec<Span>)> = segments
            .into_par_iter()
            .map(|(key, parts)| {
                let mut spans = Vec::with_capacity(parts.iter().map(Vec::len).sum());
                for part in parts {
                    spans.extend_from_slice(&part);
                }
                (key, spans)
            })
            .collect();
        let mut index = ProfileIndex {
            file,
            origin: 0,
            end: 0,
            tracks: Vec::new(),
            details: Vec::new(),
            unplaced,
            events: 0,
            problems,
            events_lost_in_file,
        };
        let system = index.pair_system_events(system_chunks, &clocks_of(), root);
        let device = device.into_iter().map(|((core, slot), spans)| ((core, slots[slot].0, slots[slot].1), spans));
        let mut keyed: Vec<(TrackKey, Vec<Span>)> = device.chain(system).collect();
        keyed.sort_by_key(|(key, _)| (key.0.map_or(u64::MAX, u64::from), key.1, index.sym_name(key.2)));
        index.tracks = keyed
            .into_par_iter()
            .map(|((core, kind, name), mut spans)| {
                if !spans.is_sorted_by_key(|s| s.start) {
                    spans.sort_by_key(|s| s.start);
                }
                let depth = if kind == TrackKind::System { nesting(&spans) } else { Vec::new() };
                let mut track =
                    Track { core, kind, name: String::new(), spans, depth, longest: 0, long: Vec::new(), coarse: None };
                track.split_long();
                (name, track)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|(name, mut track)| {
                track.name = index.track_name(track.core, track.kind, name);
                track
            })
            .collect();
        index.origin = index.tracks.iter().filter_map(|t| t.spans.first()).map(|s| s.start).min().unwrap_or(0);
        index.end = index.tracks.iter().flat_map(|t| t.spans.iter().map(|s| s.end)).max().unwrap_or(index.origin);
        index.events = index.tracks.iter().map(|t| t.spans.len() as u64).sum();
        index
    }

    /// Sets the times views are asked from and cut at (the profile's own first and last
    /// event, or those of the job it is shown with: `origin` no later than its first
    /// span, `end` no earlier than its last), and summarises busy tracks over them for
    /// views zoomed out.
    pub(crate) fn frame(&mut self, origin: u64, end: u64) {
        (self.origin, self.end) = (origin.min(self.origin), end.max(self.end));
        let (origin, end) = (self.origin, self.end);
        self.tracks.par_iter_mut().filter(|t| t.spans.len() > COARSE_BINS / 8).for_each(|t| {
            t.coarse = Some(Coarse::build(&t.spans, origin, end));
        });
    }

    pub(crate) fn file(&self) -> &NtffFile {
        &self.file
    }

    fn sym_name(&self, id: u32) -> String {
        self.file.string_or_placeholder(Sym(id)).into_owned()
    }

    fn track_name(&self, core: Option<u32>, kind: TrackKind, name: u32) -> String {
        let owner = core.map_or_else(|| "host".to_string(), |c| format!("nc{c}"));
        match kind {
            TrackKind::System => owner,
            TrackKind::Engine => format!("{owner} {}", self.sym_name(name)),
            TrackKind::Dma => format!("{owner} DMA {}", self.sym_name(name)),
        }
    }

    /// Pairs each stream's starts with their stops (by tracking id and name) into spans,
    /// one system track per stream; a start without a stop ends at its stream's last
    /// event, marked unfinished.
    fn pair_system_events(
        &mut self,
        chunks: Vec<(Option<u32>, Vec<SystemEvent>)>,
        clocks: &HashMap<u32, SyncClock>,
        root: &RootClock,
    ) -> Vec<(TrackKey, Vec<Span>)> {
        let sync = self.file.find_string("timestamp_sync_point");
        let mut tracks: HashMap<Option<u32>, Vec<Span>> = HashMap::new();
        let mut open: HashMap<(Option<u32>, u64, u32), (u64, usize)> = HashMap::new();
        let mut last: HashMap<Option<u32>, u64> = HashMap::new();
        for (core, events) in chunks {
            for e in events {
                if Some(e.name) == sync {
                    continue;
                }
                let at = match e.clock {
                    Clock::Host => Some(root.to_root(e.timestamp_ns)),
                    Clock::Device => e.core.and_then(|c| clocks.get(&c)).and_then(|c| c.to_host(e.timestamp_ns)),
                };
                let Some(at) = at else {
                    self.unplaced += 1;
                    continue;
                };
                let latest = last.entry(core).or_insert(at);
                *latest = (*latest).max(at);
                match e.phase {
                    Phase::Start => {
                        let detail = self.detail_of(&e, true);
                        open.insert((core, e.tracking_id, e.name.0), (at, detail));
                    }
                    Phase::Stop => {
                        let Some((start, detail)) = open.remove(&(core, e.tracking_id, e.name.0)) else { continue };
                        let d = &mut self.details[detail];
                        d.unfinished = false;
                        d.args.extend(e.args.iter().copied());
                        if d.exec_id.is_none() {
                            d.exec_id = e.exec_id;
                        }
                        let end = at.max(start);
                        tracks.entry(core).or_default().push(Span {
                            start,
                            end,
                            label: e.name.0,
                            detail: detail as u32,
                        });
                    }
                    Phase::Instant => {
                        let detail = self.detail_of(&e, false) as u32;
                        tracks.entry(core).or_default().push(Span { start: at, end: at, label: e.name.0, detail });
                    }
                }
            }
        }
        for ((core, _, name), (start, detail)) in open {
            let end = last.get(&core).copied().unwrap_or(start).max(start);
            tracks.entry(core).or_default().push(Span { start, end, label: name, detail: detail as u32 });
        }
        tracks.into_iter().map(|(core, spans)| ((core, TrackKind::System, 0), spans)).collect()
    }

    fn detail_of(&mut self, e: &SystemEvent, unfinished: bool) -> usize {
        self.details.push(SystemDetail {
            name: e.name,
            tracking_id: e.tracking_id,
            thread_id: e.thread_id,
            exec_id: e.exec_id,
            model_id: e.model_id,
            args: e.args.clone(),
            unfinished,
        });
        self.details.len() - 1
    }

    /// The tracks in `[t0, t1)` (relative to the origin) at `columns` pixels across.
    pub(crate) fn view(&self, t0: u64, t1: u64, columns: u32) -> View {
        let columns = columns.clamp(1, 8192);
        // Any range is accepted, and cut to the profile (at least a nanosecond wide).
        let duration = self.end - self.origin;
        let t0 = t0.min(duration);
        let (a, b) = (self.origin + t0, self.origin + t1.clamp(t0 + 1, duration.max(t0 + 1)));
        let tracks: Vec<TrackView> =
            self.tracks.par_iter().enumerate().map(|(i, track)| self.track_view(i, track, a, b, columns)).collect();
        let mut labels = HashMap::new();
        for view in &tracks {
            let ids: Box<dyn Iterator<Item = u64>> = match view {
                TrackView::Raw { spans, .. } => Box::new(spans.iter().map(|s| s[2])),
                TrackView::Bins { bins, .. } => Box::new(bins.iter().map(|b| b[3])),
            };
            for id in ids {
                labels.entry(id as u32).or_insert_with(|| self.sym_name(id as u32));
            }
        }
        View { t0, t1: b - self.origin, columns, tracks, labels }
    }

    fn track_view(&self, i: usize, track: &Track, a: u64, b: u64, columns: u32) -> TrackView {
        let (range, before) = track.range(a, b);
        let positions = || before.iter().copied().chain(range.clone());
        if ((range.len() + before.len()) as f64) <= f64::from(columns) * RAW_PER_COLUMN {
            let raw = positions()
                .map(|k| (&track.spans[k], k))
                .filter(|(s, _)| s.end >= a)
                .map(|(s, k)| {
                    let depth = track.depth.get(k).copied().unwrap_or(0);
                    [s.start - self.origin, s.end - s.start, u64::from(s.label), u64::from(depth), k as u64]
                })
                .collect();
            return TrackView::Raw { track: i, spans: raw };
        }
        let n = columns as usize;
        let width = (b - a) as f64 / n as f64;
        if let Some(coarse) = track.coarse.as_ref().filter(|c| width >= BINS_PER_COLUMN * c.width) {
            return TrackView::Bins { track: i, bins: self.coarse_bins(coarse, a, width, n) };
        }
        let mut busy = vec![0u64; n];
        let mut count = vec![0u64; n];
        let mut best = vec![(0u64, 0u32); n];
        let column_of = |t: u64| (((t - a) as f64 / width) as usize).min(n - 1);
        for s in positions().map(|k| &track.spans[k]) {
            if s.end < a {
                continue;
            }
            let (start, end) = (s.start.max(a), s.end.min(b));
            let (first, last) = (column_of(start), column_of(end.max(start)));
            for c in first..=last {
                let lo = (a as f64 + c as f64 * width) as u64;
                let hi = (a as f64 + (c + 1) as f64 * width) as u64;
                let overlap = end.min(hi).saturating_sub(start.max(lo));
                busy[c] += overlap;
                count[c] += 1;
                if overlap >= best[c].0 {
                    best[c] = (overlap, s.label);
                }
            }
        }
        let bins = (0..n)
            .filter(|&c| count[c] > 0)
            .map(|c| {
                let permille = ((busy[c] as f64 / width) * 1000.0).round().min(1000.0) as u64;
                [c as u64, permille, count[c], u64::from(best[c].1)]
            })
            .collect();
        TrackView::Bins { track: i, bins }
    }

    /// The columns of a view from a track's bins: each bin's time and spans shared out by
    /// its overlap with the column; the label of the column's busiest bin.
    fn coarse_bins(&self, coarse: &Coarse, a: u64, width: f64, n: usize) -> Vec<[u64; 4]> {
        let bins = coarse.busy.len();
        let mut out = Vec::new();
        for c in 0..n {
            let lo = (a - self.origin) as f64 + c as f64 * width;
            let hi = lo + width;
            let (first, last) = ((lo / coarse.width) as usize, ((hi / coarse.width).ceil() as usize).min(bins));
            let (mut busy, mut count, mut label, mut top) = (0.0, 0.0, 0u32, 0u64);
            for k in first..last {
                let (bl, bh) = (k as f64 * coarse.width, (k + 1) as f64 * coarse.width);
                let share = ((hi.min(bh) - lo.max(bl)) / coarse.width).clamp(0.0, 1.0);
                busy += coarse.busy[k] as f64 * share;
                count += f64::from(coarse.count[k]) * share;
                if coarse.busy[k] > top {
                    top = coarse.busy[k];
                    label = coarse.label[k];
                }
            }
            if busy > 0.0 || count > 0.0 {
                let permille = ((busy / width) * 1000.0).round().min(1000.0) as u64;
                out.push([c as u64, permille, count.round().max(1.0) as u64, u64::from(label)]);
            }
        }
        out
    }

    /// Everything known of span `k` of track `track`, for people.
    pub(crate) fn details(&self, track: usize, k: usize) -> Option<serde_json::Value> {
        let t = self.tracks.get(track)?;
        let s = t.spans.get(k)?;
        let mut out = serde_json::json!({
            "track": t.name,
            "start_ns": s.start - self.origin,
            "duration_ns": s.end - s.start,
        });
        let name = |sym: Sym| self.file.string_or_placeholder(sym).into_owned();
        match t.kind {
            TrackKind::System => {
                let d = self.details.get(s.detail as usize)?;
                out["name"] = name(d.name).into();
                out["tracking_id"] = d.tracking_id.into();
                out["thread_id"] = d.thread_id.into();
                out["exec_id"] = d.exec_id.into();
                out["model_id"] = d.model_id.into();
                out["unfinished"] = d.unfinished.into();
                let mut args = serde_json::Map::new();
                for arg in &d.args {
                    let value = match arg.value {
                        ArgValue::U64(v) => v.into(),
                        ArgValue::I64(v) => v.into(),
                        ArgValue::Str(sym) => name(sym).into(),
                    };
                    args.insert(name(arg.key), value);
                }
                out["args"] = args.into();
            }
            TrackKind::Engine | TrackKind::Dma => match *self.file.descriptor(DescriptorId(s.detail))? {
                Descriptor::Instruction { model_id, engine, opcode, hlo, step, flops, bytes_read, bytes_written } => {
                    out["name"] = name(opcode).into();
                    out["engine"] = name(engine).into();
                    out["hlo"] = name(hlo).into();
                    out["model_id"] = model_id.into();
                    out["step"] = step.into();
                    out["flops"] = flops.into();
                    out["bytes_read"] = bytes_read.into();
                    out["bytes_written"] = bytes_written.into();
                }
                Descriptor::Dma { model_id, queue, index, bytes } => {
                    out["name"] = format!("DMA {}", name(queue)).into();
                    out["queue"] = name(queue).into();
                    out["index"] = index.into();
                    out["model_id"] = model_id.into();
                    out["bytes"] = bytes.into();
                }
            },
        }
        // For people: the model's name, and where the span sits in its execution.
        if let Some(id) = out["model_id"].as_u64() {
            let model = self.file.models().iter().find(|m| u64::from(m.model_id) == id && Some(m.core) == t.core);
            if let Some(m) = model {
                out["model"] = m.name.clone().into();
            }
        }
        if let Some((execution_track, index, start, exec_id)) = t.core.and_then(|core| self.execution_at(core, s.start))
            && (execution_track, index) != (track, k)
        {
            out["execution"] = serde_json::json!({
                "exec_id": exec_id,
                "offset_ns": s.start.saturating_sub(start),
                "track": execution_track,
                "index": index,
            });
        }
        Some(out)
    }

    /// The longest span of an instruction lowered from HLO instruction `hlo`: its track
    /// and index, for a page to show it.
    pub(crate) fn longest_of_hlo(&self, hlo: &str) -> Option<(usize, usize)> {
        let sym = self.file.find_string(hlo)?;
        let mut best: Option<(u64, usize, usize)> = None;
        for (track, t) in self.tracks.iter().enumerate().filter(|(_, t)| t.kind == TrackKind::Engine) {
            for (k, s) in t.spans.iter().enumerate() {
                let is_hlo = matches!(self.file.descriptor(DescriptorId(s.detail)), Some(Descriptor::Instruction { hlo: h, .. }) if *h == sym);
                if is_hlo && best.is_none_or(|(length, _, _)| s.end - s.start > length) {
                    best = Some((s.end - s.start, track, k));
                }
            }
        }
        best.map(|(_, track, k)| (track, k))
    }

    /// Where span `k` of `track` is, from the profile's start.
    pub(crate) fn span_time(&self, track: usize, k: usize) -> Option<(u64, u64)> {
        let s = self.tracks.get(track)?.spans.get(k)?;
        Some((s.start - self.origin, s.end - self.origin))
    }

    /// The `nc_exec_running` span of `core` that contains host time `t`: its track,
    /// index, start and execution id.
    fn execution_at(&self, core: u32, t: u64) -> Option<(usize, usize, u64, u64)> {
        let running = self.file.find_string("nc_exec_running")?;
        let track = self.tracks.iter().position(|x| x.core == Some(core) && x.kind == TrackKind::System)?;
        let spans = &self.tracks[track].spans;
        let after = spans.partition_point(|s| s.start <= t);
        // Executions do not overlap on a core; the API calls around them are few.
        (after.saturating_sub(64)..after).rev().find_map(|k| {
            let s = &spans[k];
            let d = self.details.get(s.detail as usize)?;
            (d.name == running && s.end >= t).then(|| (track, k, s.start, d.exec_id.unwrap_or(0)))
        })
    }
}

/// The level of each span, sorted by start: the lowest level free when it starts, so
/// that nested spans stack up and overlapping ones (two threads on one core) share
/// levels as they free up. Levels past 255 share the last.
fn nesting(spans: &[Span]) -> Vec<u8> {
    let mut ends: Vec<u64> = Vec::new();
    spans
        .iter()
        .map(|s| {
            let level = ends.iter().position(|&end| end <= s.start).unwrap_or(ends.len());
            if level == ends.len() {
                ends.push(s.end);
            } else {
                ends[level] = s.end;
            }
            level.min(u8::MAX as usize) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ntff::{Arg, Metadata, SyncPoint, Writer};

    /// Executions of 10 µs on core 0, one every 20 µs: an `nrt_execute` span (host clock)
    /// around an `nc_exec_running` span (device clock, 1 ms behind), each with one PE
    /// instruction of 4 µs and one input DMA of 1 µs.
    fn profile(executions: u64) -> ProfileIndex {
        let mut w = Writer::new(Vec::new(), &Metadata::default()).expect("header");
        let (execute, running) = (w.intern("nrt_execute"), w.intern("nc_exec_running"));
        let key = w.intern("status");
        let instruction = Descriptor::Instruction {
            model_id: 1,
            engine: w.intern("PE"),
            opcode: w.intern("MatMul"),
            hlo: w.intern("dot.1"),
            step: 0,
            flops: 1000,
            bytes_read: 1,
            bytes_written: 1,
        };
        let instruction = w.descriptor(&instruction);
        let dma = Descriptor::Dma { model_id: 1, queue: w.intern("input"), index: 0, bytes: 64 };
        let dma = w.descriptor(&dma);
        for k in 0..executions {
            let host = 1_000_000 + k * 20_000;
            let device = host - 1_000;
            let event = |name, phase, clock, ts, args: Vec<Arg>| SystemEvent {
                core: Some(0),
                id: k,
                name,
                phase,
                clock,
                timestamp_ns: ts,
                tracking_id: k + 1,
                thread_id: 1,
                exec_id: Some(k + 1),
                model_id: Some(1),
                nrta_seq_id: None,
                args,
            };
            w.system(&event(execute, Phase::Start, Clock::Host, host, Vec::new())).expect("write");
            w.system(&event(running, Phase::Start, Clock::Device, device + 1_000, Vec::new())).expect("write");
            let device_event = |id, start, end, descriptor| ntff::DeviceEvent {
                core: 0,
                id,
                exec_id: Some(k + 1),
                start_ns: start,
                end_ns: end,
                descriptor,
            };
            w.device(&device_event(2 * k, device + 2_000, device + 3_000, dma)).expect("write");
            w.device(&device_event(2 * k + 1, device + 3_000, device + 7_000, instruction)).expect("write");
            let status = vec![Arg { key, value: ArgValue::U64(0) }];
            w.system(&event(running, Phase::Stop, Clock::Device, device + 9_000, status)).expect("write");
            w.sync_point(0, SyncPoint { host_ns: host + 9_000, device_ns: device + 9_000 }).expect("write");
            w.system(&event(execute, Phase::Stop, Clock::Host, host + 10_000, Vec::new())).expect("write");
        }
        let (bytes, _) = w.finish().expect("finish");
        ProfileIndex::build(NtffFile::from_bytes(bytes).expect("opens"))
    }

    #[test]
    fn tracks_per_core_engine_and_queue_on_the_host_clock() {
        let index = profile(100);
        let names: Vec<&str> = index.tracks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["nc0", "nc0 PE", "nc0 DMA input"]);
        assert_eq!(index.events, 400);
        assert_eq!(index.unplaced, 0);
        assert_eq!((index.origin, index.end), (1_000_000, 1_000_000 + 99 * 20_000 + 10_000));
        // nc_exec_running nests inside nrt_execute, moved by the sync point onto the host clock.
        let system = &index.tracks[0];
        assert_eq!(system.depth(), 2);
        assert_eq!(system.spans[0].start, 1_000_000);
        assert_eq!((system.spans[1].start, system.spans[1].end), (1_001_000, 1_009_000));
        let pe = &index.tracks[1];
        assert_eq!((pe.spans[0].start, pe.spans[0].end), (1_003_000, 1_007_000));
    }

    #[test]
    fn a_view_sends_spans_when_few_and_bins_when_many() {
        let index = profile(100);
        let duration = index.end - index.origin;
        // Zoomed in on one execution: raw spans, relative to the origin.
        let view = index.view(20_000, 40_000, 1000);
        let TrackView::Raw { spans, .. } = &view.tracks[1] else { panic!("raw: {:?}", view.tracks[1]) };
        assert_eq!(spans.as_slice(), [[23_000, 4_000, spans[0][2], 0, 1]]);
        assert_eq!(view.labels[&(spans[0][2] as u32)], "MatMul");
        // The whole profile at 100 columns: 100 instructions, one per column, 4 µs of
        // each column's 19.9 µs busy.
        let view = index.view(0, duration, 100);
        let TrackView::Bins { bins, .. } = &view.tracks[1] else { panic!("bins: {:?}", view.tracks[1]) };
        let spans: u64 = bins.iter().map(|b| b[2]).sum();
        assert!((100..=110).contains(&spans), "{spans} (a span crossing a column edge counts in both)");
        let busy: f64 = bins.iter().map(|b| b[1] as f64 / 1000.0 * duration as f64 / 100.0).sum();
        assert!((busy - 400_000.0).abs() < 4_000.0, "{busy} ns busy");
        // Out-of-range requests are cut to the profile.
        assert_eq!(index.view(u64::MAX, u64::MAX, 10).t1, duration.max(duration + 1));
        assert!(index.view(5, 1, 0).tracks.len() == 3);
    }

    #[test]
    fn zoomed_far_out_a_busy_track_is_read_from_its_bins() {
        let index = profile(10_000);
        let pe = &index.tracks[1];
        assert!(pe.coarse.is_some() && index.tracks[0].coarse.is_some());
        let duration = index.end - index.origin;
        let view = index.view(0, duration, 200);
        let TrackView::Bins { bins, .. } = &view.tracks[1] else { panic!("bins") };
        let busy: f64 = bins.iter().map(|b| b[1] as f64 / 1000.0 * duration as f64 / 200.0).sum();
        let spans: u64 = bins.iter().map(|b| b[2]).sum();
        assert!((busy / 40_000_000.0 - 1.0).abs() < 0.01, "{busy} ns busy of 40 ms");
        assert!((spans as f64 / 10_000.0 - 1.0).abs() < 0.02, "{spans} spans of 10000");
        assert!(bins.iter().all(|b| view.labels[&(b[3] as u32)] == "MatMul"));
        // Zoomed in, the spans themselves again.
        assert!(matches!(index.view(0, 100_000, 200).tracks[1], TrackView::Raw { .. }));
    }

    #[test]
    fn overlapping_spans_reuse_levels_and_nested_ones_stack() {
        let span = |start, end| Span { start, end, label: 0, detail: 0 };
        // Two threads pipelining on one core: never more than two at once.
        let chained = [span(0, 10), span(5, 15), span(12, 20), span(18, 25), span(22, 30)];
        assert_eq!(nesting(&chained), [0, 1, 0, 1, 0]);
        let nested = [span(0, 100), span(10, 50), span(20, 30), span(60, 70), span(150, 160)];
        assert_eq!(nesting(&nested), [0, 1, 2, 1, 0]);
        let many: Vec<Span> = (0..1000).map(|k| span(k, 10_000)).collect();
        assert_eq!(nesting(&many).last(), Some(&255));
    }

    #[test]
    fn a_long_span_does_not_hide_the_others_when_zoomed_in() {
        let span = |start, end| Span { start, end, label: 0, detail: 0 };
        let mut spans = vec![span(0, 1_000_000)];
        spans.extend((0..5000).map(|k| span(k * 200, k * 200 + 100)));
        spans.sort_by_key(|s| s.start);
        let mut track = Track {
            core: Some(0),
            kind: TrackKind::System,
            name: "nc0".into(),
            depth: nesting(&spans),
            spans,
            longest: 0,
            long: Vec::new(),
            coarse: None,
        };
        track.split_long();
        assert_eq!((track.longest, track.long.as_slice()), (100, [0].as_slice()));
        // Around 500 µs: the long span (found apart) and two short ones.
        let (range, before) = track.range(500_000, 500_300);
        assert_eq!(before, [0]);
        let ends: Vec<u64> = range.map(|k| track.spans[k].end).filter(|&e| e >= 500_000).collect();
        assert_eq!(ends, [500_100, 500_300]);
    }

    #[test]
    fn details_name_what_ran() {
        let index = profile(3);
        let pe = index.details(1, 2).expect("a PE span");
        assert_eq!(
            (pe["name"].as_str(), pe["hlo"].as_str(), pe["flops"].as_u64()),
            (Some("MatMul"), Some("dot.1"), Some(1000))
        );
        let running = index.details(0, 1).expect("a system span");
        assert_eq!(running["name"], "nc_exec_running");
        assert_eq!(running["args"]["status"], 0);
        assert_eq!(running["exec_id"], 1);
        assert!(running.get("execution").is_none(), "an execution is not inside itself");
        assert_eq!(
            (pe["execution"]["exec_id"].as_u64(), pe["execution"]["offset_ns"].as_u64()),
            (Some(3), Some(2000)),
            "{pe}"
        );
        assert_eq!(pe["execution"]["track"], 0, "{pe}");
        assert!(index.details(9, 0).is_none() && index.details(0, 99).is_none());
    }
}
