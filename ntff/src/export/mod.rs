//! Timelines from NTFF files, for Perfetto (protobuf `Trace`) and for Chrome's JSON
//! trace format.
//!
//! One layout feeds both encoders. Each file becomes a process; under it a track group
//! per NeuronCore holds the core's executions (`nc_exec_running`), one track per engine
//! and per DMA queue, and counters (utilisation, tensor memory, events lost). Host
//! threads get thread tracks with the system events as slices, and a flow joins each
//! `nrt_execute` to the `nc_exec_running` it caused. In Perfetto, whose flows chain,
//! one flow also runs through the `cc_running` slices of a collective in every file
//! (every rank's profile of a job). Device times are moved onto the host clock through
//! the execution's own sync point.
//!
//! Every track is written in time order with strict nesting: system events nest by
//! their start/stop pairs; device events that overlap without nesting (which the
//! runtime does not produce on one engine) go to an extra lane of their track. The
//! exporter streams: it holds, per stream, the chunk being merged and one decoded
//! ahead of it, and small per-track state.

mod chrome;
mod file;
mod layout;
pub mod perfetto;
mod verify;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::io::Write;
use std::sync::mpsc::Receiver;

use crate::model::{ArgValue, Chunk, ChunkInfo, Clock, Descriptor, DescriptorId, DeviceEvent, Phase, Sym, SystemEvent};
use crate::{NtffError, NtffFile, RootClock, SyncClock};

use file::FileExport;
#[cfg(feature = "parquet")]
pub(crate) use file::tensor_bytes;
#[cfg(any(test, feature = "parquet"))]
pub(crate) use layout::{Busy, bucket_width};
use layout::{Layout, Names};
pub use verify::{TraceCheck, TraceRuleBroken, TrackCheck, verify_perfetto};

/// What to export.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Only these NeuronCores (`None`: all, and the host stream).
    pub cores: Option<Vec<u32>>,
    /// Only system events of these types (`None`: all). Device events are left out
    /// when a type list is given, as in the JSON output.
    pub system_types: Option<Vec<String>>,
    /// Move each file's times onto its job's root clock (rank 0's process's) by the
    /// offsets its `clock_offset` events record ([`crate::RootClock`]), so that the
    /// ranks of a job on several hosts line up; a file without them stays as it is.
    pub root_clock: bool,
}

/// The output encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A Perfetto `Trace` protobuf (`.pftrace`), for ui.perfetto.dev and trace_processor.
    Perfetto,
    /// Chrome's JSON trace event format, for small traces and older viewers.
    ChromeJson,
}

/// How far an export has come, in events read from the files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub events_done: u64,
    pub events_total: u64,
}

/// What an export wrote, and what it could not place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportSummary {
    pub processes: u32,
    pub tracks: u32,
    /// Slices from device events (instructions and DMA transfers).
    pub device_slices: u64,
    /// Slices from system events.
    pub system_slices: u64,
    pub instants: u64,
    pub counter_values: u64,
    pub flows: u64,
    /// Slices of a rank's part of a collective joined to the other ranks' parts by
    /// one flow (Perfetto).
    pub collective_flows: u64,
    /// Per file, with [`ExportOptions::root_clock`]: the offset its times were moved by
    /// onto the root clock (the one measured last, in ns) and the largest uncertainty of
    /// its measures; `None` for a file left on its own clock.
    pub root_clock_offsets: Vec<Option<(i64, u64)>>,
    /// Bytes written.
    pub bytes: u64,
    /// Events the rings dropped, as recorded in the files.
    pub ring_events_lost: u64,
    /// Chunks that could not be read (damaged files), and the events they held.
    pub damaged_chunks: u64,
    pub damaged_chunk_events: u64,
    /// Stops whose start is not in the trace: written as instants.
    pub stops_without_start: u64,
    /// Starts whose stop never came: left open at the end, or closed by an enclosing stop.
    pub unfinished: u64,
    /// Events written at a later time than recorded to keep a track in time order.
    pub reordered: u64,
    /// Device events, and device-clock system events, left out: their core has no sync
    /// point to place them on the host clock.
    pub unaligned_device_events: u64,
    pub unaligned_system_events: u64,
    /// Device events left out: what they did (their descriptor) was lost with a
    /// damaged descriptor table.
    pub undescribed_device_events: u64,
}

impl ExportSummary {
    pub fn slices(&self) -> u64 {
        self.device_slices + self.system_slices
    }

    /// Sentences about what was not exported as recorded; empty when everything was.
    pub fn problems(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if self.ring_events_lost > 0 {
            lines.push(format!(
                "{} events were lost to ring overwrites while recording (see the \"events lost\" counters)",
                self.ring_events_lost
            ));
        }
        if self.damaged_chunks > 0 {
            lines.push(format!(
                "{} damaged chunks ({} events) could not be read",
                self.damaged_chunks, self.damaged_chunk_events
            ));
        }
        if self.stops_without_start > 0 {
            lines.push(format!(
                "{} stop events had no start in the trace and are shown as instants",
                self.stops_without_start
            ));
        }
        if self.unfinished > 0 {
            lines.push(format!("{} spans have no stop in the trace", self.unfinished));
        }
        if self.reordered > 0 {
            lines.push(format!("{} events were moved later to keep their track in time order", self.reordered));
        }
        if self.undescribed_device_events > 0 {
            lines.push(format!(
                "{} device events were left out: their descriptors were lost with a damaged descriptor table",
                self.undescribed_device_events
            ));
        }
        if self.unaligned_device_events + self.unaligned_system_events > 0 {
            lines.push(format!(
                "{} device events and {} device-clock system events were left out: their core has no clock sync point",
                self.unaligned_device_events, self.unaligned_system_events
            ));
        }
        lines
    }
}

/// Writes `files` as one trace in `format`, a process per file. `progress` is called
/// after each chunk.
pub fn export<W: Write>(
    files: &[NtffFile],
    options: &ExportOptions,
    format: Format,
    out: W,
    progress: &mut dyn FnMut(Progress),
) -> Result<(W, ExportSummary), NtffError> {
    match format {
        Format::Perfetto => run(files, options, perfetto::PerfettoSink::new(out), progress),
        Format::ChromeJson => run(files, options, chrome::ChromeSink::new(out), progress),
    }
}

fn run<S: Sink>(
    files: &[NtffFile],
    options: &ExportOptions,
    sink: S,
    progress: &mut dyn FnMut(Progress),
) -> Result<(S::Out, ExportSummary), NtffError> {
    let events_total = files
        .iter()
        .flat_map(|f| f.select(options.cores.as_deref(), None))
        .map(|c| u64::from(c.system_events) + u64::from(c.device_events))
        .sum();
    let mut layout = Layout {
        sink,
        names: Names::default(),
        tracks: Vec::new(),
        summary: ExportSummary::default(),
        progress: Progress { events_done: 0, events_total },
    };
    let clocks: Vec<RootClock> =
        files.iter().map(|f| if options.root_clock { RootClock::of(f) } else { RootClock::default() }).collect();
    let start = files
        .iter()
        .zip(&clocks)
        .flat_map(|(f, clock)| f.chunks().iter().filter_map(|c| c.host_span).map(|(low, _)| clock.to_root(low)))
        .min()
        .unwrap_or(0);
    let realtime = files.first().and_then(|f| f.metadata().clock.as_ref()).map(|c| c.realtime_minus_monotonic_ns);
    layout.sink.start(start, realtime).map_err(NtffError::write)?;
    for (k, (file, clock)) in files.iter().zip(clocks).enumerate() {
        // Chunks the reader already found damaged or cut (a file without its index):
        // counted with those that fail when read, as the summary counts them.
        let recovery = file.recovery();
        layout.summary.damaged_chunks +=
            recovery.damaged.iter().chain(&recovery.truncated).filter(|d| d.kind == Some("event chunk")).count() as u64;
        layout.summary.damaged_chunk_events += recovery.events_lost();
        layout.summary.root_clock_offsets.push(clock.latest());
        FileExport::new(&mut layout, file, k as u64 + 1, options, clock)?.run(&mut layout, progress)?;
        layout.summary.processes += 1;
    }
    layout.summary.tracks = layout.tracks.len() as u32;
    let (out, bytes) = layout.sink.finish().map_err(NtffError::write)?;
    layout.summary.bytes = bytes;
    Ok((out, layout.summary))
}

/// An index into the layout's tracks.
pub(crate) type TrackIx = u32;
/// An index into the layout's name table, shared by every file of an export.
pub(crate) type NameId = u32;

/// What a track is.
#[derive(Debug, Clone)]
pub(crate) enum TrackKind {
    Process {
        pid: u32,
        name: String,
        cmdline: Vec<String>,
        labels: Vec<String>,
    },
    Thread {
        pid: u32,
        tid: u32,
        name: String,
    },
    /// A group of tracks, without events of its own.
    Group {
        name: String,
    },
    Slices {
        name: String,
    },
    Counter {
        name: String,
        unit: CounterUnit,
        description: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CounterUnit {
    Percent,
    Bytes,
    Count,
}

#[derive(Debug, Clone)]
pub(crate) struct Track {
    pub(crate) ix: TrackIx,
    pub(crate) uuid: u64,
    pub(crate) parent: Option<TrackIx>,
    pub(crate) parent_uuid: Option<u64>,
    /// Position among its siblings.
    pub(crate) rank: i32,
    /// The process it belongs to.
    pub(crate) pid: u32,
    pub(crate) kind: TrackKind,
}

impl Track {
    /// The name with its group's, for encodings without groups.
    pub(crate) fn name(&self) -> &str {
        match &self.kind {
            TrackKind::Process { name, .. }
            | TrackKind::Thread { name, .. }
            | TrackKind::Group { name }
            | TrackKind::Slices { name }
            | TrackKind::Counter { name, .. } => name,
        }
    }
}

/// An argument shown with an event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Annotation<'a> {
    pub(crate) key: NameId,
    pub(crate) key_text: &'a str,
    pub(crate) value: AnnotationValue<'a>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum AnnotationValue<'a> {
    U64(u64),
    I64(i64),
    /// A string with its id in the name table (encodings may intern it).
    Str(NameId, &'a str),
}

/// A named event: its id in the name table and its text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Name<'a> {
    pub(crate) id: NameId,
    pub(crate) text: &'a str,
}

/// Ring overwrites, as Perfetto's `DATA_LOSS_PRESENT | DATA_LOSS_OVERWRITE`.
pub(crate) const LOSS_OVERWRITE: u32 = 1 | 64;

/// An encoder. Calls for one track come in time order (the layout clamps), slices on a
/// track nest, and a track is described before its first event and after its parent.
pub(crate) trait Sink {
    type Out;
    /// `start`: the earliest host time in the files; `realtime`: CLOCK_REALTIME minus
    /// CLOCK_MONOTONIC, when known.
    fn start(&mut self, start: u64, realtime: Option<i64>) -> std::io::Result<()>;
    fn track(&mut self, track: &Track) -> std::io::Result<()>;
    fn begin(
        &mut self,
        track: TrackIx,
        ts: u64,
        name: Name<'_>,
        args: &[Annotation<'_>],
        flow_out: Option<u64>,
        flow_in: Option<u64>,
    ) -> std::io::Result<()>;
    fn end(&mut self, track: TrackIx, ts: u64) -> std::io::Result<()>;
    /// Whether a flow id given to several slices chains them in time order (Perfetto's
    /// `flow_ids`), so that one flow can join the parts of a collective on every rank.
    fn chains_flows(&self) -> bool {
        false
    }
    fn instant(&mut self, track: TrackIx, ts: u64, name: Name<'_>, args: &[Annotation<'_>]) -> std::io::Result<()>;
    fn counter(&mut self, track: TrackIx, ts: u64, value: f64) -> std::io::Result<()>;
    /// Data of `track` was lost before its next event (`reasons`: Perfetto's bits).
    fn dropped(&mut self, track: TrackIx, reasons: u32);
    /// Flushes; returns the output and the bytes written.
    fn finish(self) -> std::io::Result<(Self::Out, u64)>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_widths_are_round() {
        assert_eq!(bucket_width(0), 10_000);
        assert_eq!(bucket_width(25_000_000), 50_000);
        assert_eq!(bucket_width(1_000_000_000), 1_000_000);
        assert_eq!(bucket_width(3_000_000_000), 5_000_000);
    }

    #[test]
    fn busy_time_is_shared_across_buckets() {
        let mut busy = Busy::new(1000, 100);
        let mut out = Vec::new();
        busy.add(1050, 1250, &mut out);
        assert!(out.is_empty(), "no bucket is finished before the next span");
        busy.add(1600, 1650, &mut out);
        // 50% of [1000,1100), 100% of [1100,1200), 50% of [1200,1300), then idle.
        assert_eq!(out, vec![(1000, 50.0), (1100, 100.0), (1200, 50.0), (1300, 0.0)]);
        out.clear();
        busy.finish(&mut out);
        assert_eq!(out, vec![(1600, 50.0), (1700, 0.0)]);
    }

    #[test]
    fn device_times_use_the_next_sync_point() {
        let sync = [
            crate::SyncPoint { host_ns: 1_000, device_ns: 100 },
            crate::SyncPoint { host_ns: 2_010, device_ns: 1_100 },
        ];
        let clock = SyncClock::new(sync.to_vec());
        for _ in 0..2 {
            assert_eq!(clock.to_host(50), Some(950));
            assert_eq!(clock.to_host(100), Some(1_000));
            assert_eq!(clock.to_host(500), Some(1_410));
            assert_eq!(clock.to_host(5_000), Some(5_910));
            assert_eq!(clock.to_host(60), Some(960));
        }
        assert_eq!(SyncClock::default().to_host(5), None);
    }
}
