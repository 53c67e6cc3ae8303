//! The track layout both encoders share: interned names, the tracks of each process,
//! NeuronCore and thread, their lanes and counters, and busy-time buckets.

use super::*;

/// Names shared by every file of an export.
#[derive(Debug)]
pub(super) struct Names {
    pub(super) text: Vec<String>,
    pub(super) ids: HashMap<String, NameId>,
}

/// Names every export has, at fixed ids.
pub(super) const KEY_EXEC_ID: NameId = 0;
pub(super) const KEY_MODEL_ID: NameId = 1;
pub(super) const KEY_NRTA_SEQ_ID: NameId = 2;

impl Default for Names {
    fn default() -> Names {
        let mut names = Names { text: Vec::new(), ids: HashMap::new() };
        for (id, key) in [(KEY_EXEC_ID, "exec_id"), (KEY_MODEL_ID, "model_id"), (KEY_NRTA_SEQ_ID, "nrta_seq_id")] {
            let interned = names.intern(key);
            debug_assert_eq!(interned, id);
        }
        names
    }
}

impl Names {
    pub(super) fn intern(&mut self, s: &str) -> NameId {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.text.len() as NameId;
        self.text.push(s.to_owned());
        self.ids.insert(s.to_owned(), id);
        id
    }
}

/// Per-track state the layout keeps.
#[derive(Debug, Default)]
pub(super) struct TrackState {
    /// The latest time written on the track.
    pub(super) last: u64,
    /// Device lanes: the ends of the open slices, innermost last.
    pub(super) open_ends: Vec<u64>,
    /// Thread and execution tracks: the tracking ids of the open slices, innermost last.
    pub(super) open_ids: Vec<u64>,
}

pub(super) struct Layout<S: Sink> {
    pub(super) sink: S,
    pub(super) names: Names,
    pub(super) tracks: Vec<TrackState>,
    pub(super) summary: ExportSummary,
    pub(super) progress: Progress,
}

impl<S: Sink> Layout<S> {
    pub(super) fn add_track(
        &mut self,
        file_key: u64,
        parent: Option<(TrackIx, u64)>,
        rank: i32,
        pid: u32,
        kind: TrackKind,
    ) -> Result<TrackIx, NtffError> {
        let ix = self.tracks.len() as TrackIx;
        let track = Track {
            ix,
            uuid: file_key << 40 | (u64::from(ix) + 1),
            parent: parent.map(|p| p.0),
            parent_uuid: parent.map(|p| p.1),
            rank,
            pid,
            kind,
        };
        self.tracks.push(TrackState::default());
        self.sink.track(&track).map_err(NtffError::write)?;
        Ok(ix)
    }

    /// The time to write an event at on `track`: `ts`, or the track's latest time when
    /// `ts` is earlier.
    pub(super) fn at(&mut self, track: TrackIx, ts: u64) -> u64 {
        let state = &mut self.tracks[track as usize];
        if ts < state.last {
            self.summary.reordered += 1;
            return state.last;
        }
        state.last = ts;
        ts
    }

    pub(super) fn end(&mut self, track: TrackIx, ts: u64) -> Result<(), NtffError> {
        let ts = self.at(track, ts);
        self.sink.end(track, ts).map_err(NtffError::write)
    }

    pub(super) fn instant(
        &mut self,
        track: TrackIx,
        ts: u64,
        name: NameId,
        args: &[OwnedAnnotation],
    ) -> Result<(), NtffError> {
        let ts = self.at(track, ts);
        self.summary.instants += 1;
        let args: Vec<Annotation<'_>> = args.iter().map(|a| a.borrow(&self.names)).collect();
        let name = Name { id: name, text: &self.names.text[name as usize] };
        self.sink.instant(track, ts, name, &args).map_err(NtffError::write)
    }

    pub(super) fn counter(&mut self, track: TrackIx, ts: u64, value: f64) -> Result<(), NtffError> {
        let ts = self.at(track, ts);
        self.summary.counter_values += 1;
        self.sink.counter(track, ts, value).map_err(NtffError::write)
    }

    /// Places a device slice on the first lane where it nests; false when it fits none.
    pub(super) fn place(
        &mut self,
        track: TrackIx,
        start: u64,
        end: u64,
        name: NameId,
        force: bool,
    ) -> Result<bool, NtffError> {
        let (mut start, mut end) = (start, end);
        let state = &mut self.tracks[track as usize];
        if start < state.last {
            if !force {
                return Ok(false);
            }
            self.summary.reordered += 1;
            start = state.last;
            end = end.max(start);
        }
        while let Some(&top) = self.tracks[track as usize].open_ends.last() {
            if top > start {
                break;
            }
            self.tracks[track as usize].open_ends.pop();
            self.end(track, top)?;
        }
        let state = &mut self.tracks[track as usize];
        if let Some(&top) = state.open_ends.last()
            && top < end
        {
            if !force {
                return Ok(false);
            }
            self.summary.reordered += 1;
            end = top;
        }
        state.open_ends.push(end);
        state.last = start;
        self.summary.device_slices += 1;
        let name = Name { id: name, text: &self.names.text[name as usize] };
        self.sink.begin(track, start, name, &[], None, None).map_err(NtffError::write)?;
        Ok(true)
    }

    /// Closes the open device slices of `track`.
    pub(super) fn close_lane(&mut self, track: TrackIx) -> Result<(), NtffError> {
        while let Some(top) = self.tracks[track as usize].open_ends.pop() {
            self.end(track, top)?;
        }
        Ok(())
    }
}

/// Lanes a device track may grow to before overlapping events are clamped into the last.
pub(super) const MAX_LANES: usize = 8;

/// What the layout does with a system event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SystemKind {
    /// `nrt_execute`: starts the flow to the device.
    Execute,
    /// `nc_exec_running`: on the core's execution track.
    DeviceExecution,
    TensorAllocate,
    TensorFree,
    /// `timestamp_sync_point`: used to align clocks, not drawn.
    SyncPoint,
    /// `cc_running`: a rank's part of a collective, joined by a flow to the other ranks'
    /// parts (in formats whose flows chain).
    Collective,
    Other,
}

impl SystemKind {
    pub(super) fn of(name: &str) -> SystemKind {
        match name {
            "nrt_execute" => SystemKind::Execute,
            "nc_exec_running" => SystemKind::DeviceExecution,
            "nrt_tensor_allocate" => SystemKind::TensorAllocate,
            "nrt_tensor_free" => SystemKind::TensorFree,
            "timestamp_sync_point" => SystemKind::SyncPoint,
            "cc_running" => SystemKind::Collective,
            _ => SystemKind::Other,
        }
    }
}

/// Engines and DMA queues in the order their tracks are shown.
pub(super) const ENGINE_ORDER: [&str; 5] = ["PE", "ACT", "DVE", "POOL", "SP"];
pub(super) const QUEUE_ORDER: [&str; 4] = ["input", "output", "weights", "instructions"];

/// Sibling ranks inside a core's group.
pub(super) const RANK_EXECUTION: i32 = 0;
pub(super) const RANK_ENGINE: i32 = 16;
pub(super) const RANK_QUEUE: i32 = 256;
pub(super) const RANK_COUNTER: i32 = 512;
/// Host threads come before the cores in a process.
pub(super) const RANK_THREAD: i32 = -1;
/// Sibling rank of the process-wide counters, after the cores.
pub(super) const RANK_PROCESS_COUNTER: i32 = 1 << 20;

/// The tracks of one NeuronCore.
#[derive(Debug)]
pub(super) struct CoreTracks {
    pub(super) group: TrackIx,
    pub(super) group_uuid: u64,
    pub(super) execution: Option<TrackIx>,
    /// The open `nc_exec_running`: (tracking id, host time).
    pub(super) execution_start: Option<(u64, u64)>,
    /// Engine and queue tracks: the lanes of each, and which is whose (keyed by
    /// whether it is a DMA queue and the engine or queue string id).
    pub(super) lane_sets: Vec<Vec<TrackIx>>,
    pub(super) sets: HashMap<(bool, Sym), usize>,
    pub(super) set_keys: Vec<(bool, Sym)>,
    /// The lane set of each descriptor, once seen.
    pub(super) by_descriptor: Vec<Option<usize>>,
    pub(super) utilisation: Option<TrackIx>,
    pub(super) busy: Busy,
    pub(super) memory: Option<TrackIx>,
    pub(super) memory_bytes: i64,
    pub(super) system_lost: LostCounter,
    pub(super) device_lost: LostCounter,
    /// Sync points by device time.
    pub(super) sync: SyncClock,
}

/// Busy time of a core per fixed bucket, from its execution spans (which do not overlap
/// and come in time order).
#[derive(Debug)]
pub(crate) struct Busy {
    pub(super) origin: u64,
    pub(super) width: u64,
    /// The first bucket not yet written.
    pub(super) next: u64,
    /// Busy nanoseconds of the buckets from `next` on.
    pub(super) pending: VecDeque<u64>,
    pub(super) last_value: Option<f64>,
}

impl Busy {
    pub(crate) fn new(origin: u64, width: u64) -> Busy {
        Busy { origin, width, next: 0, pending: VecDeque::new(), last_value: None }
    }

    pub(super) fn bucket(&self, ts: u64) -> u64 {
        ts.saturating_sub(self.origin) / self.width
    }

    /// Start time of bucket `k`.
    pub(super) fn time_of(&self, k: u64) -> u64 {
        self.origin.saturating_add(k.saturating_mul(self.width))
    }

    /// Adds a busy interval, and returns the finished buckets' (time, percent) values
    /// that differ from the one before. Times past `MAX_BUCKETS` buckets (which only a
    /// damaged file holds) count in the last.
    pub(crate) fn add(&mut self, start: u64, end: u64, out: &mut Vec<(u64, f64)>) {
        let limit = self.time_of(MAX_BUCKETS);
        let start = start.clamp(self.origin, limit);
        let end = end.clamp(start, limit);
        self.drain_before(self.bucket(start), out);
        let mut t = start.max(self.time_of(self.next));
        while t < end {
            let k = self.bucket(t);
            let upto = end.min(self.time_of(k + 1));
            let slot = (k - self.next) as usize;
            if self.pending.len() <= slot {
                self.pending.resize(slot + 1, 0);
            }
            self.pending[slot] += upto - t;
            t = upto;
        }
    }

    /// Writes out the buckets before `k`.
    pub(super) fn drain_before(&mut self, k: u64, out: &mut Vec<(u64, f64)>) {
        while self.next < k {
            let busy = self.pending.pop_front().unwrap_or(0);
            let value = (busy as f64 / self.width as f64 * 100.0).min(100.0);
            if self.last_value != Some(value) {
                out.push((self.time_of(self.next), value));
                self.last_value = Some(value);
            }
            self.next += 1;
            if self.pending.is_empty() && self.next < k {
                // Idle until `k`: one zero says it.
                if self.last_value != Some(0.0) {
                    out.push((self.time_of(self.next), 0.0));
                    self.last_value = Some(0.0);
                }
                self.next = k;
            }
        }
    }

    /// Writes out every bucket that has busy time, then a zero.
    pub(crate) fn finish(&mut self, out: &mut Vec<(u64, f64)>) {
        let end = self.next + self.pending.len() as u64 + 1;
        self.drain_before(end, out);
    }
}

/// Utilisation buckets a file may span; 1000 is usual.
pub(super) const MAX_BUCKETS: u64 = 1 << 20;

/// A bucket width giving about 1000 buckets over `span` nanoseconds: 1, 2 or 5 times a
/// power of ten, at least 10 µs.
pub(crate) fn bucket_width(span: u64) -> u64 {
    let target = (span / 1000).max(10_000);
    let mut unit = 1u64;
    loop {
        for m in [1, 2, 5] {
            if unit * m >= target {
                return unit * m;
            }
        }
        unit *= 10;
    }
}

/// A cumulative count of lost events and its counter track, once it has one.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct LostCounter {
    pub(super) track: Option<TrackIx>,
    pub(super) total: u64,
}

/// Which ring lost events: a core's device or system ring (by core slot), or the host's.
#[derive(Debug, Clone, Copy)]
pub(super) enum LostIn {
    Device(usize),
    System(usize),
    Host,
}

/// An annotation kept until it is written (strings by their id in the name table).
#[derive(Debug)]
pub(super) struct OwnedAnnotation {
    pub(super) key: NameId,
    pub(super) value: OwnedValue,
}

#[derive(Debug)]
pub(super) enum OwnedValue {
    U64(u64),
    I64(i64),
    /// A string, by its id in the name table.
    Str(NameId),
}

impl OwnedAnnotation {
    pub(super) fn borrow<'a>(&'a self, names: &'a Names) -> Annotation<'a> {
        Annotation {
            key: self.key,
            key_text: &names.text[self.key as usize],
            value: match &self.value {
                OwnedValue::U64(v) => AnnotationValue::U64(*v),
                OwnedValue::I64(v) => AnnotationValue::I64(*v),
                OwnedValue::Str(id) => AnnotationValue::Str(*id, &names.text[*id as usize]),
            },
        }
    }
}
