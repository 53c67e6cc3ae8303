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

use ntff::{ArgValue, Clock, Descriptor, DescriptorId, NtffFile, Phase, Sym, SyncClock, SystemEvent};
use rayon::prelude::*;
use serde::Serialize;

/// Spans a track sends raw, per pixel column of the view, at most.
const RAW_PER_COLUMN: f64 = 0.5;

/// What a track shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrackKind {
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
pub struct Track {
    pub core: Option<u32>,
    pub kind: TrackKind,
    pub name: String,
    spans: Vec<Span>,
    /// Nesting depth of each span (system tracks only; empty otherwise).
    depth: Vec<u8>,
    /// The longest span, so that a range lookup finds spans that began before it.
    longest: u64,
}

impl Track {
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Nesting levels drawn (1 for device tracks).
    pub fn depth(&self) -> u8 {
        self.depth.iter().copied().max().map_or(1, |d| d + 1)
    }

    /// Indices of the spans that may overlap `[t0, t1)`.
    fn range(&self, t0: u64, t1: u64) -> std::ops::Range<usize> {
        let from = t0.saturating_sub(self.longest);
        let lo = self.spans.partition_point(|s| s.start < from);
        let hi = self.spans.partition_point(|s| s.start < t1);
        lo..hi.max(lo)
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
pub struct ProfileIndex {
    file: NtffFile,
    /// Host time of the first and last event.
    pub origin: u64,
    pub end: u64,
    pub tracks: Vec<Track>,
    details: Vec<SystemDetail>,
    /// Device events without a sync point on their core: they cannot be placed.
    pub unplaced: u64,
    pub events: u64,
}

/// The view of one track in a range.
#[derive(Debug, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum TrackView {
    /// `[start, duration, label, depth, index]`, start relative to the profile's origin.
    Raw { track: usize, spans: Vec<[u64; 5]> },
    /// `[column, busy per mille, spans, label]` for each column with anything in it.
    Bins { track: usize, bins: Vec<[u64; 4]> },
}

/// What one view of the timeline sends.
#[derive(Debug, Serialize)]
pub struct View {
    pub t0: u64,
    pub t1: u64,
    pub columns: u32,
    pub tracks: Vec<TrackView>,
    /// Names of the labels used in `tracks`.
    pub labels: HashMap<u32, String>,
}

/// Key of a track while building: core, kind, and the engine or queue name.
type TrackKey = (Option<u32>, TrackKind, u32);

#[derive(Default)]
struct Partial {
    device: HashMap<TrackKey, Vec<Span>>,
    unplaced: u64,
}

impl Partial {
    fn merge(mut self, other: Partial) -> Partial {
        for (key, mut spans) in other.device {
            self.device.entry(key).or_default().append(&mut spans);
        }
        self.unplaced += other.unplaced;
        self
    }
}

impl ProfileIndex {
    /// Decodes every chunk of `file` into tracks.
    pub fn build(file: NtffFile) -> ProfileIndex {
        let chunks = file.chunks();
        let mut sync_points: HashMap<u32, Vec<ntff::SyncPoint>> = HashMap::new();
        for info in chunks {
            if let Some(core) = info.core
                && let Ok(points) = file.read_sync_points(info)
            {
                sync_points.entry(core).or_default().extend(points);
            }
        }
        let clocks_of = || -> HashMap<u32, SyncClock> {
            sync_points.iter().map(|(&c, p)| (c, SyncClock::new(p.clone()))).collect()
        };
        // Device events in parallel; system events come back per chunk, in file order,
        // to be paired start with stop across chunks.
        let decoded: Vec<(Partial, Option<u32>, Vec<SystemEvent>)> = chunks
            .par_iter()
            .map_init(clocks_of, |clocks, info| {
                let Ok(chunk) = file.read_chunk(info) else { return (Partial::default(), info.core, Vec::new()) };
                let mut partial = Partial::default();
                let clock = clocks.get(&chunk.core.unwrap_or(u32::MAX));
                for e in &chunk.device {
                    let placed = clock.and_then(|c| Some((c.to_host(e.start_ns)?, c.to_host(e.end_ns)?)));
                    let (Some((start, end)), Some(descriptor)) = (placed, file.descriptor(e.descriptor)) else {
                        partial.unplaced += 1;
                        continue;
                    };
                    let (kind, name, label) = match *descriptor {
                        Descriptor::Instruction { engine, opcode, .. } => (TrackKind::Engine, engine, opcode),
                        Descriptor::Dma { queue, .. } => (TrackKind::Dma, queue, queue),
                    };
                    partial.device.entry((Some(e.core), kind, name.0)).or_default().push(Span {
                        start,
                        end: end.max(start),
                        label: label.0,
                        detail: e.descriptor.0,
                    });
                }
                (partial, chunk.core, chunk.system)
            })
            .collect();
        let mut partial = Partial::default();
        let mut system_chunks = Vec::with_capacity(decoded.len());
        for (p, core, system) in decoded {
            partial = partial.merge(p);
            system_chunks.push((core, system));
        }
        let mut index = ProfileIndex {
            file,
            origin: 0,
            end: 0,
            tracks: Vec::new(),
            details: Vec::new(),
            unplaced: partial.unplaced,
            events: 0,
        };
        let system = index.pair_system_events(system_chunks, &clocks_of());
        let mut keyed: Vec<(TrackKey, Vec<Span>)> = partial.device.into_iter().chain(system).collect();
        keyed.sort_by_key(|(key, _)| (key.0.map_or(u64::MAX, u64::from), key.1, index.sym_name(key.2)));
        index.tracks = keyed
            .into_par_iter()
            .map(|((core, kind, name), mut spans)| {
                if !spans.is_sorted_by_key(|s| s.start) {
                    spans.sort_by_key(|s| s.start);
                }
                let depth = if kind == TrackKind::System { nesting(&spans) } else { Vec::new() };
                let longest = spans.iter().map(|s| s.end - s.start).max().unwrap_or(0);
                (core, kind, name, spans, depth, longest)
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|(core, kind, name, spans, depth, longest)| Track {
                core,
                kind,
                name: index.track_name(core, kind, name),
                spans,
                depth,
                longest,
            })
            .collect();
        index.origin = index.tracks.iter().filter_map(|t| t.spans.first()).map(|s| s.start).min().unwrap_or(0);
        index.end = index.tracks.iter().flat_map(|t| t.spans.iter().map(|s| s.end)).max().unwrap_or(index.origin);
        index.events = index.tracks.iter().map(|t| t.spans.len() as u64).sum();
        index
    }

    pub fn file(&self) -> &NtffFile {
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
                    Clock::Host => Some(e.timestamp_ns),
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
    pub fn view(&self, t0: u64, t1: u64, columns: u32) -> View {
        let columns = columns.clamp(1, 8192);
        let (a, b) = (self.origin + t0, self.origin + t1.max(t0 + 1));
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
        let range = track.range(a, b);
        let spans = &track.spans[range.clone()];
        if (spans.len() as f64) <= f64::from(columns) * RAW_PER_COLUMN {
            let raw = spans
                .iter()
                .zip(range)
                .filter(|(s, _)| s.end >= a)
                .map(|(s, k)| {
                    let depth = track.depth.get(k).copied().unwrap_or(0);
                    [s.start - self.origin, s.end - s.start, u64::from(s.label), u64::from(depth), k as u64]
                })
                .collect();
            return TrackView::Raw { track: i, spans: raw };
        }
        let n = columns as usize;
        let mut busy = vec![0u64; n];
        let mut count = vec![0u64; n];
        let mut best = vec![(0u64, 0u32); n];
        let width = (b - a) as f64 / n as f64;
        let column_of = |t: u64| (((t - a) as f64 / width) as usize).min(n - 1);
        for s in spans {
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

    /// Everything known of span `k` of track `track`, for people.
    pub fn details(&self, track: usize, k: usize) -> Option<serde_json::Value> {
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
        Some(out)
    }
}

/// Depth of each span in a stack of nested spans, sorted by start.
fn nesting(spans: &[Span]) -> Vec<u8> {
    let mut stack: Vec<u64> = Vec::new();
    spans
        .iter()
        .map(|s| {
            while stack.last().is_some_and(|&end| end <= s.start) {
                stack.pop();
            }
            let depth = stack.len().min(u8::MAX as usize) as u8;
            stack.push(s.end);
            depth
        })
        .collect()
}
