//! The profile summary: where the time went, per engine, opcode and HLO instruction;
//! FLOPs against the virtual core's defined peaks (the backend's measured rate beside
//! them); DMA traffic; execution latency; which executions were traced and how they
//! compare with the others; what was lost, and which figures stand on too little.
//! Computed in one pass over a file's chunks; printed as text (`summary-text`) or
//! JSON (`summary-json`), and shown by the dashboard's profile viewer.

use std::collections::HashMap;

use crate::stats::{LatencyHistogram, LatencySummary};
use crate::{Clock, Descriptor, DescriptorId, NtffError, NtffFile, Phase};
use serde::Serialize;

/// HLO instructions listed in the summary.
pub const TOP_HLO: usize = 10;

pub mod advice;
pub mod bounds;
mod compiles;
mod failures;
mod text;
pub use bounds::{Bounds, Finding, Gap};
pub use compiles::RECOMPILED_AFTER;
pub use failures::{COLLECTIVE_OPCODES, Failures, FirstFailure, InCollectives, LongWait};
pub(crate) use text::duration;
pub use text::to_text;

#[derive(Debug, Serialize)]
pub struct Summary {
    pub process: Process,
    pub models: Vec<ModelSummary>,
    /// Host time from the first to the last event.
    pub total_time_s: f64,
    pub events: EventCounts,
    /// What failed, and the long waits for another rank: said before the figures.
    pub failures: Failures,
    pub executions: Executions,
    /// Device time of the executions whose device trace was recorded.
    pub device_time_s: f64,
    pub engines: Vec<EngineSummary>,
    pub opcodes: Vec<OpcodeSummary>,
    /// The first [`TOP_HLO`] of `hlo_instructions`.
    pub top_hlo_instructions: Vec<HloSummary>,
    /// Every HLO instruction, by device time.
    #[serde(skip)]
    pub hlo_instructions: Vec<HloSummary>,
    pub flops: Flops,
    pub dma: Vec<DmaSummary>,
    /// The traced executions' time inside collectives (`None` when they ran none).
    pub collectives: Option<InCollectives>,
    /// Damage or truncation of the file, one line each.
    pub file_problems: Vec<String>,
    /// Figures to read with care, and why, one sentence each: a ratio above 100%, a
    /// figure that rests on one execution or a few microseconds.
    pub caveats: Vec<String>,
    /// How fast the traced executions could have been, and where the time went
    /// (`None` without a device trace).
    pub bounds: Option<Bounds>,
    /// What is worth fixing, by the time it could save, largest first.
    pub findings: Vec<Finding>,
}

#[derive(Debug, Serialize)]
pub struct Process {
    pub pid: u32,
    pub tag: String,
    /// The program's name, as the live tools label it (empty in older files).
    pub program: String,
    pub instance_type: String,
    pub runtime_version: String,
    pub tool: String,
    pub capture_kind: String,
}

#[derive(Debug, Serialize)]
pub struct ModelSummary {
    pub model_id: u32,
    pub name: String,
    pub core: u32,
    pub flops_per_execution: u64,
    pub neff_sha256: String,
}

#[derive(Debug, Default, Serialize)]
pub struct EventCounts {
    pub system: u64,
    pub device: u64,
    /// Dropped by the rings before they were recorded.
    pub lost_in_rings: u64,
    /// In damaged or cut records of the file.
    pub lost_in_file: u64,
}

#[derive(Debug, Serialize)]
pub struct Executions {
    /// Completed `nrt_execute` spans.
    pub count: u64,
    /// Executions with a device trace.
    pub device_traced: u64,
    /// `nrt_execute`, start to stop, in seconds.
    pub latency: Option<LatencySummary>,
    /// `nc_exec_running`: the program's run on the core, in seconds.
    pub device_latency: Option<LatencySummary>,
    /// Executions run unrecorded before these, to warm up.
    pub warmup: u32,
    /// The first [`TRACED_LISTED`] executions with a device trace.
    pub traced: Vec<TracedExecution>,
}

/// An execution whose device trace was recorded, against the others.
#[derive(Debug, Clone, Serialize)]
pub struct TracedExecution {
    pub core: u32,
    /// Its place among the recorded executions of its core, from 1 (warm-up excluded).
    pub ordinal: u64,
    /// Its `nc_exec_running`, in seconds.
    pub device_s: f64,
    /// `device_s` over the p50 of every recorded execution's `nc_exec_running`.
    pub of_p50: Option<f64>,
}

/// Traced executions listed in the summary.
pub const TRACED_LISTED: usize = 5;
/// A DMA queue busy for less than this shows no bandwidth: a few transfers of a few
/// hundred nanoseconds measure the clock more than the queue.
pub const MIN_BANDWIDTH_BASIS_S: f64 = 10e-6;

#[derive(Debug, Serialize)]
pub struct EngineSummary {
    pub engine: String,
    pub active_s: f64,
    /// Of the device time.
    pub percent: f64,
    pub instructions: u64,
    pub flops: u64,
    /// FLOPs over active time, against the engine's defined peak.
    pub percent_of_peak: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct OpcodeSummary {
    pub engine: String,
    pub opcode: String,
    pub count: u64,
    pub time_s: f64,
    pub percent: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct HloSummary {
    pub hlo: String,
    pub instructions: u64,
    pub time_s: f64,
    /// Its device time in the median traced execution (an execution it did not run in
    /// counts as zero): what the rows are ranked by, so that one slow execution among
    /// many does not reorder them. `None` when no execution was device-traced.
    pub median_s: Option<f64>,
    pub percent: f64,
    pub flops: u64,
    /// Bytes its instructions read and wrote.
    pub bytes: u64,
    /// The engine it spent most time on.
    pub engine: String,
    /// FLOPs per byte.
    pub intensity: Option<f64>,
    pub achieved_flops_per_s: Option<f64>,
    pub achieved_bytes_per_s: Option<f64>,
    /// `compute` or `memory`: which ceiling of the roofline is lower at its intensity.
    pub bound: Option<String>,
    /// Its achieved rate over that ceiling, in percent.
    pub roofline_percent: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Flops {
    /// FLOPs of the traced instructions.
    pub total: u64,
    /// Per device-traced execution.
    pub per_execution: Option<f64>,
    /// Total FLOPs over device time.
    pub achieved_per_s: Option<f64>,
    /// The virtual core's defined PE peak, and how it is defined.
    pub peak_per_s: Option<f64>,
    pub peak_basis: String,
    /// The defined peak of the vector engines (ACT, DVE, POOL).
    pub vector_peak_per_s: Option<f64>,
    /// The backend's measured matrix-product rate, as context, and how it was measured.
    pub measured_per_s: Option<f64>,
    pub measured_method: String,
    /// Achieved over the defined PE peak.
    pub mfu: Option<f64>,
    /// The host's memory bandwidth (the roofline's memory ceiling), and how measured.
    pub memory_peak_bytes_per_s: Option<f64>,
    pub memory_peak_method: String,
}

#[derive(Debug, Serialize)]
pub struct DmaSummary {
    pub queue: String,
    pub transfers: u64,
    pub bytes: u64,
    pub time_s: f64,
    /// Bytes over the transfers' busy time; `None` when that time is below
    /// [`MIN_BANDWIDTH_BASIS_S`].
    pub bandwidth_bytes_per_s: Option<f64>,
}

/// Opcodes whose device events enclose the instructions they ran (one span per loop
/// iteration, one per conditional): they count toward their HLO instruction's time,
/// inclusive of what ran inside, and not toward any engine's or opcode's time.
pub const ENCLOSING_OPCODES: &[&str] = &["While", "Conditional"];

#[derive(Default)]
struct Totals {
    count: u64,
    ns: u64,
    flops: u64,
    bytes: u64,
    /// The shortest occurrence (DMA transfers: the fastest one).
    min_ns: Option<u64>,
}

/// Adds without overflowing: a damaged or hostile file can hold any values.
fn add(total: &mut u64, value: u64) {
    *total = total.saturating_add(value);
}

/// The defined peaks a file's metadata carries (FLOP/s), `None` when it has none.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DefinedPeaks {
    pub pe: Option<f64>,
    /// ACT, DVE and POOL.
    pub vector: Option<f64>,
}

impl DefinedPeaks {
    pub(crate) fn of_metadata(meta: &crate::Metadata) -> DefinedPeaks {
        DefinedPeaks {
            pe: (meta.defined_pe_flops_per_core > 0.0).then_some(meta.defined_pe_flops_per_core),
            vector: (meta.defined_vector_flops_per_core > 0.0).then_some(meta.defined_vector_flops_per_core),
        }
    }

    /// The peak of `engine`; SP and unknown engines have none.
    pub(crate) fn of(&self, engine: &str) -> Option<f64> {
        match engine {
            "PE" => self.pe,
            "ACT" | "DVE" | "POOL" => self.vector,
            _ => None,
        }
    }
}

/// An open span of `summarise`: its core, tracking id, and whether it is `nrt_execute`.
type OpenKey = (Option<u32>, u64, bool);

/// Summarises the events of `cores` (`None`: all) in `file`.
pub fn summarise(file: &NtffFile, cores: Option<&[u32]>) -> Summary {
    let mut summariser = Summariser::new(file, cores);
    let mut spare = crate::Chunk::default();
    for info in file.select(cores, None) {
        match file.read_chunk_reusing(info, std::mem::take(&mut spare)) {
            Ok(chunk) => {
                summariser.chunk(info, Ok(&chunk));
                spare = chunk;
            }
            Err(e) => summariser.chunk(info, Err(&e)),
        }
    }
    summariser.finish()
}

/// A (core, execution)'s device-time window.
type WindowKey = (u32, Option<u64>);

/// The summary gathered a chunk at a time, for callers that read the chunks for
/// something else as well ([`summarise`] reads them itself).
pub struct Summariser<'a> {
    file: &'a NtffFile,
    cores: Option<&'a [u32]>,
    events: EventCounts,
    /// Device-time window of each (core, execution), and the one being extended
    /// (device events of an execution come together).
    windows: HashMap<WindowKey, (u64, u64)>,
    window: Option<(WindowKey, (u64, u64))>,
    /// Start time and execution of each open `nrt_execute` or `nc_exec_running`, by
    /// core, tracking id and which of the two.
    starts: HashMap<OpenKey, (u64, Option<u64>)>,
    /// `nrt_execute` time (host call to return) of each execution, by core and execution.
    host_runs: HashMap<(u32, u64), u64>,
    scheduled: u64,
    latency: LatencyHistogram,
    device_latency: LatencyHistogram,
    executions: u64,
    /// Start and length of each recorded execution's run on its core.
    runs: HashMap<(u32, u64), (u64, u64)>,
    first: u64,
    last: u64,
    execute: Option<crate::Sym>,
    running: Option<crate::Sym>,
    status: Option<crate::Sym>,
    schedule: Option<crate::Sym>,
    /// Totals per descriptor, by descriptor id; names are resolved once per descriptor
    /// at the end. Ids the file does not describe are not counted there, but in
    /// `undescribed`.
    by_descriptor: Vec<Totals>,
    /// Device events whose descriptor the file does not have (lost with a damaged table).
    undescribed: u64,
    /// Device time of each descriptor in each traced execution, by descriptor id, core
    /// and execution: the HLO instructions' medians.
    by_execution: HashMap<(u32, WindowKey), u64>,
    /// One line per chunk that could not be read.
    chunk_problems: Vec<String>,
    failures: failures::Gatherer,
    compiles: compiles::Gatherer,
}

impl std::fmt::Debug for Summariser<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Summariser").field("events", &self.events).finish_non_exhaustive()
    }
}

impl<'a> Summariser<'a> {
    /// For the events of `cores` (`None`: all) of `file`.
    pub fn new(file: &'a NtffFile, cores: Option<&'a [u32]>) -> Summariser<'a> {
        Summariser {
            file,
            cores,
            events: EventCounts { lost_in_file: file.recovery().events_lost(), ..EventCounts::default() },
            windows: HashMap::new(),
            window: None,
            starts: HashMap::new(),
            host_runs: HashMap::new(),
            scheduled: 0,
            latency: LatencyHistogram::default(),
            device_latency: LatencyHistogram::default(),
            executions: 0,
            runs: HashMap::new(),
            first: u64::MAX,
            last: 0,
            execute: file.find_string("nrt_execute"),
            running: file.find_string("nc_exec_running"),
            status: file.find_string("status"),
            schedule: file.find_string("nrta_execute_schedule"),
            by_descriptor: (0..file.descriptors().len()).map(|_| Totals::default()).collect(),
            undescribed: 0,
            by_execution: HashMap::new(),
            chunk_problems: Vec::new(),
            failures: failures::Gatherer::new(file),
            compiles: compiles::Gatherer::new(file),
        }
    }

    /// Adds the chunk `info` describes: `chunk` is its events, or why it could not be
    /// read (its events count as lost in the file, and the summary says which chunk).
    pub fn chunk(&mut self, info: &crate::ChunkInfo, chunk: Result<&crate::Chunk, &NtffError>) {
        if let Some((low, high)) = info.host_span {
            self.first = self.first.min(low);
            self.last = self.last.max(high);
        }
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                let events = u64::from(info.system_events) + u64::from(info.device_events);
                add(&mut self.events.lost_in_file, events);
                self.chunk_problems.push(unreadable_chunk(info, e));
                return;
            }
        };
        let events = &mut self.events;
        events.system += chunk.system.len() as u64;
        events.device += chunk.device.len() as u64;
        add(&mut events.lost_in_rings, chunk.losses.iter().fold(0u64, |sum, l| sum.saturating_add(l.events)));
        for e in &chunk.system {
            let is_execute = Some(e.name) == self.execute;
            self.failures.system(self.file, e, is_execute);
            self.compiles.system(self.file, e);
            if self.schedule.is_some() && Some(e.name) == self.schedule && e.phase != Phase::Stop {
                self.scheduled += 1;
            }
            if !is_execute && Some(e.name) != self.running {
                continue;
            }
            let key = (e.core, e.tracking_id, is_execute);
            match e.phase {
                Phase::Start => {
                    self.starts.insert(key, (e.timestamp_ns, e.exec_id));
                }
                Phase::Stop => {
                    if let Some((start, start_exec)) = self.starts.remove(&key) {
                        let ns = e.timestamp_ns.saturating_sub(start);
                        let status_ok = !e.args.iter().any(|a| Some(a.key) == self.status);
                        if is_execute {
                            self.executions += 1;
                            if status_ok {
                                self.latency.record(std::time::Duration::from_nanos(ns));
                            }
                            if let (Some(core), Some(exec)) = (e.core, e.exec_id.or(start_exec)) {
                                self.host_runs.insert((core, exec), ns);
                            }
                        } else if e.clock == Clock::Device && status_ok {
                            self.device_latency.record(std::time::Duration::from_nanos(ns));
                            if let (Some(core), Some(exec)) = (e.core, e.exec_id) {
                                self.runs.insert((core, exec), (start, ns));
                            }
                        }
                    }
                }
                Phase::Instant => {}
            }
        }
        for e in &chunk.device {
            let ns = e.end_ns.saturating_sub(e.start_ns);
            match self.by_descriptor.get_mut(e.descriptor.0 as usize) {
                Some(t) => {
                    t.count += 1;
                    t.ns = t.ns.saturating_add(ns);
                    t.min_ns = Some(t.min_ns.map_or(ns, |m| m.min(ns)));
                }
                None => self.undescribed += 1,
            }
            let key = (e.core, e.exec_id);
            if e.exec_id.is_some() {
                add(self.by_execution.entry((e.descriptor.0, key)).or_default(), ns);
            }
            match &mut self.window {
                Some((k, window)) if *k == key => {
                    window.0 = window.0.min(e.start_ns);
                    window.1 = window.1.max(e.end_ns);
                }
                current => {
                    if let Some((k, window)) = current.replace((key, (e.start_ns, e.end_ns))) {
                        merge_window(&mut self.windows, k, window);
                    }
                }
            }
        }
    }

    /// The summary of the chunks added.
    pub fn finish(mut self) -> Summary {
        if let Some((k, window)) = self.window.take() {
            merge_window(&mut self.windows, k, window);
        }
        let Summariser {
            file,
            cores,
            events,
            windows,
            host_runs,
            scheduled,
            latency,
            device_latency,
            executions,
            runs,
            first,
            last,
            by_descriptor,
            undescribed,
            by_execution,
            chunk_problems,
            failures,
            compiles,
            ..
        } = self;
        let meta = file.metadata();
        let mut engines: HashMap<String, Totals> = HashMap::new();
        let mut opcodes: HashMap<(String, String), Totals> = HashMap::new();
        let mut hlos: HashMap<String, Totals> = HashMap::new();
        let mut dma: HashMap<String, (Totals, u64)> = HashMap::new();
        // The engine each HLO instruction ran on most, and the fastest DMA transfer of at
        // least `bounds::DMA_PEAK_MIN_BYTES` (the memory bound's bandwidth).
        let mut hlo_engine_time: HashMap<(String, String), u64> = HashMap::new();
        let mut hlo_of_descriptor: HashMap<u32, String> = HashMap::new();
        let mut dma_peak: Option<f64> = None;
        let mut undescribed = undescribed;
        // Collectives: their time is waiting and the data's passage, not an engine's work.
        let mut in_collectives = Totals::default();
        let mut collective_hlos: HashMap<String, u64> = HashMap::new();
        for (id, t) in by_descriptor.iter().enumerate().filter(|(_, t)| t.count > 0) {
            let Some(descriptor) = file.descriptor(DescriptorId(id as u32)) else {
                add(&mut undescribed, t.count);
                continue;
            };
            match *descriptor {
                Descriptor::Instruction { engine, opcode, hlo, flops, bytes_read, bytes_written, .. } => {
                    let engine = file.string_or_placeholder(engine).into_owned();
                    let opcode = file.string_or_placeholder(opcode).into_owned();
                    let hlo = file.string_or_placeholder(hlo).into_owned();
                    let flops = flops.saturating_mul(t.count);
                    // A loop or conditional span encloses the instructions it ran: its time
                    // is the HLO instruction's (inclusive), not work of its engine.
                    let collective = COLLECTIVE_OPCODES.contains(&opcode.as_str());
                    if collective {
                        add(&mut in_collectives.count, t.count);
                        add(&mut in_collectives.ns, t.ns);
                        add(collective_hlos.entry(hlo.clone()).or_default(), t.ns);
                    }
                    if !ENCLOSING_OPCODES.contains(&opcode.as_str()) {
                        add(hlo_engine_time.entry((hlo.clone(), engine.clone())).or_default(), t.ns);
                        if !collective {
                            let e = engines.entry(engine.clone()).or_default();
                            add(&mut e.count, t.count);
                            add(&mut e.ns, t.ns);
                            add(&mut e.flops, flops);
                        }
                        let o = opcodes.entry((engine, opcode)).or_default();
                        add(&mut o.count, t.count);
                        add(&mut o.ns, t.ns);
                    }
                    hlo_of_descriptor.insert(id as u32, hlo.clone());
                    let h = hlos.entry(hlo).or_default();
                    add(&mut h.count, t.count);
                    add(&mut h.ns, t.ns);
                    add(&mut h.flops, flops);
                    add(&mut h.bytes, bytes_read.saturating_add(bytes_written).saturating_mul(t.count));
                }
                Descriptor::Dma { queue, bytes, .. } => {
                    // A transfer shorter than the bandwidth basis measures nothing (a
                    // device-resident input is bound in place, not copied).
                    if bytes >= bounds::DMA_PEAK_MIN_BYTES
                        && let Some(fastest) = t.min_ns.filter(|&ns| ns as f64 >= MIN_BANDWIDTH_BASIS_S * 1e9)
                    {
                        dma_peak = Some(dma_peak.unwrap_or(0.0).max(bytes as f64 / (fastest as f64 / 1e9)));
                    }
                    let q = dma.entry(file.string_or_placeholder(queue).into_owned()).or_default();
                    add(&mut q.0.count, t.count);
                    add(&mut q.0.ns, t.ns);
                    add(&mut q.1, bytes.saturating_mul(t.count));
                }
            }
        }
        // Each HLO instruction's engine: the one it spent most time on in all (ties: by name).
        let mut hlo_engine: HashMap<String, (String, u64)> = HashMap::new();
        for ((hlo, engine), ns) in hlo_engine_time {
            let on = hlo_engine.entry(hlo).or_insert_with(|| (engine.clone(), ns));
            if ns > on.1 || (ns == on.1 && engine < on.0) {
                *on = (engine, ns);
            }
        }
        let device_executions = windows.keys().filter(|(_, exec)| exec.is_some()).count() as u64;
        let medians = median_per_execution(&by_execution, &hlo_of_descriptor, device_executions);
        // The executions' device time: device work outside any execution (a tensor's
        // copy between steps) spans from the first to the last of it, not a busy time.
        let in_executions = device_executions > 0;
        let device_ns: u64 = windows
            .iter()
            .filter(|((_, exec), _)| exec.is_some() || !in_executions)
            .fold(0u64, |sum, (_, (a, b))| sum.saturating_add(b.saturating_sub(*a)));
        let seconds = |ns: u64| ns as f64 / 1e9;
        let percent = |ns: u64| if device_ns == 0 { 0.0 } else { 100.0 * ns as f64 / device_ns as f64 };
        let peaks = DefinedPeaks::of_metadata(meta);
        let mut caveats = Vec::new();
        let mut engine_rows: Vec<EngineSummary> = engines
            .iter()
            .map(|(engine, t)| {
                let peak = peaks.of(engine);
                let percent_of_peak =
                    peak.filter(|_| t.ns > 0 && t.flops > 0).map(|p| 100.0 * t.flops as f64 / seconds(t.ns) / p);
                if let Some(share) = percent_of_peak.filter(|&s| s > 100.0) {
                    caveats.push(format!("{engine} ran at {share:.0}% of its defined peak: {ABOVE_PEAK}"));
                }
                EngineSummary {
                    engine: engine.clone(),
                    active_s: seconds(t.ns),
                    percent: percent(t.ns),
                    instructions: t.count,
                    flops: t.flops,
                    percent_of_peak,
                }
            })
            .collect();
        engine_rows.sort_by(|a, b| b.active_s.total_cmp(&a.active_s).then_with(|| a.engine.cmp(&b.engine)));
        let mut opcode_rows: Vec<OpcodeSummary> = opcodes
            .into_iter()
            .map(|((engine, opcode), t)| OpcodeSummary {
                engine,
                opcode,
                count: t.count,
                time_s: seconds(t.ns),
                percent: percent(t.ns),
            })
            .collect();
        opcode_rows.sort_by(|a, b| b.time_s.total_cmp(&a.time_s).then_with(|| a.opcode.cmp(&b.opcode)));
        let memory_peak = (meta.peak_memory_bytes_per_s > 0.0).then_some(meta.peak_memory_bytes_per_s);
        let mut hlo_rows: Vec<HloSummary> = hlos
            .into_iter()
            .map(|(hlo, t)| {
                let engine = hlo_engine.get(&hlo).map_or_else(String::new, |(e, _)| e.clone());
                let mut roofline = bounds::roofline(t.flops, t.bytes, seconds(t.ns), peaks.of(&engine), memory_peak);
                if collective_hlos.contains_key(&hlo) {
                    // Waiting has no roofline.
                    roofline = bounds::Roofline { bound: Some("collective"), ..bounds::Roofline::default() };
                }
                HloSummary {
                    median_s: medians.get(&hlo).map(|&ns| seconds(ns)),
                    hlo,
                    instructions: t.count,
                    time_s: seconds(t.ns),
                    percent: percent(t.ns),
                    flops: t.flops,
                    bytes: t.bytes,
                    engine,
                    intensity: roofline.intensity,
                    achieved_flops_per_s: roofline.achieved_flops_per_s,
                    achieved_bytes_per_s: roofline.achieved_bytes_per_s,
                    bound: roofline.bound.map(str::to_owned),
                    roofline_percent: roofline.percent,
                }
            })
            .collect();
        hlo_rows.sort_by(|a, b| {
            let median = |h: &HloSummary| h.median_s.unwrap_or(-1.0);
            median(b).total_cmp(&median(a)).then(b.time_s.total_cmp(&a.time_s)).then_with(|| a.hlo.cmp(&b.hlo))
        });
        let collectives = (in_collectives.count > 0).then(|| {
            let mut hlos: Vec<(String, u64)> = collective_hlos.into_iter().collect();
            hlos.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            InCollectives {
                instructions: in_collectives.count,
                time_s: seconds(in_collectives.ns),
                percent: percent(in_collectives.ns),
                hlos: hlos.into_iter().map(|(hlo, _)| hlo).collect(),
            }
        });
        let failures = failures.finish(first);
        let above: Vec<String> = hlo_rows
            .iter()
            .filter_map(|h| Some((h, h.roofline_percent.filter(|&r| r > 100.0)?)))
            .map(|(h, r)| format!("`{}` {r:.0}%", h.hlo))
            .collect();
        if !above.is_empty() {
            caveats.push(format!(
                "{} above 100% of their roofline ({}): {ABOVE_ROOFLINE}",
                if above.len() == 1 {
                    "one HLO instruction is".to_string()
                } else {
                    format!("{} HLO instructions are", above.len())
                },
                above.join(", ")
            ));
        }
        let mut dma_rows: Vec<DmaSummary> = dma
            .into_iter()
            .map(|(queue, (t, bytes))| DmaSummary {
                queue,
                transfers: t.count,
                bytes,
                time_s: seconds(t.ns),
                bandwidth_bytes_per_s: (seconds(t.ns) >= MIN_BANDWIDTH_BASIS_S).then(|| bytes as f64 / seconds(t.ns)),
            })
            .collect();
        dma_rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.queue.cmp(&b.queue)));
        // A queue faster than the host's memory copied nothing: the virtual device reads
        // device-resident tensors in place. Its bytes over its time is no bandwidth.
        let mut in_place: Vec<String> = Vec::new();
        for r in &mut dma_rows {
            if let (Some(bw), Some(memory)) = (r.bandwidth_bytes_per_s, memory_peak)
                && bw > memory
            {
                r.bandwidth_bytes_per_s = None;
                in_place.push(r.queue.clone());
            }
        }
        if !in_place.is_empty() {
            caveats.push(format!(
                "no bandwidth is shown for DMA queues that read faster than the host's memory ({}): the virtual device reads device-resident tensors in place, so their transfers copy nothing",
                in_place.join(", ")
            ));
        }
        let thin_queues: Vec<&str> = dma_rows
            .iter()
            .filter(|r| r.bandwidth_bytes_per_s.is_none() && r.transfers > 0 && !in_place.contains(&r.queue))
            .map(|r| r.queue.as_str())
            .collect();
        if !thin_queues.is_empty() {
            caveats.push(format!(
                "no bandwidth is shown for DMA queues busy less than {:.0} µs in all ({}): too short to measure",
                MIN_BANDWIDTH_BASIS_S * 1e6,
                thin_queues.join(", ")
            ));
        }
        let total_flops: u64 = engines.values().map(|t| t.flops).sum();
        let achieved = (device_ns > 0 && total_flops > 0).then(|| total_flops as f64 / seconds(device_ns));
        let mfu = achieved.zip(peaks.pe).map(|(a, p)| a / p);
        if let Some(m) = mfu.filter(|&m| m > 1.0) {
            caveats.push(format!("MFU is {:.0}%, above the defined peak: {ABOVE_PEAK}", 100.0 * m));
        }
        let measured = (meta.peak_flops_per_core > 0.0).then_some(meta.peak_flops_per_core);
        // Transfers faster than the host's memory were not copies (see above).
        let dma_peak = dma_peak.filter(|&bw| memory_peak.is_none_or(|memory| bw <= memory));
        let (bounds, mut findings) = bounds::analyse(&bounds::Inputs {
            engines: &engine_rows,
            dma: &dma_rows,
            hlos: &hlo_rows,
            hlo_engine: &hlo_engine,
            collectives: collectives.as_ref(),
            long_waits: &failures.long_waits,
            windows: &windows,
            runs: &runs,
            host_runs: &host_runs,
            peaks,
            dma_peak,
            asynchronous: scheduled > 0,
            advice: advice::Advice {
                front_end: advice::FrontEnd::of_file(file),
                bf16_in_effect: opcode_rows.iter().any(|o| o.engine == "PE" && o.opcode == "MatMulBf16"),
                bf16_faster: meta.bf16_products_faster,
            },
        });
        let mut chunk_problems = chunk_problems;
        if undescribed > 0 {
            chunk_problems.push(format!(
                "{undescribed} device events name no instruction or transfer the file describes (their descriptors \
                 were lost): the engine, opcode, HLO and DMA figures leave them out, and no finding is drawn from them"
            ));
            findings.clear();
        }
        // Not drawn from device events: kept whatever became of those.
        findings.extend(compiles.findings(if last > first { seconds(last - first) } else { 0.0 }));
        findings.sort_by(|a, b| b.saves_s.total_cmp(&a.saves_s));
        let device_p50 = device_latency.summary().map(|l| l.p50);
        let traced = traced_executions(&windows, &runs, device_p50);
        if device_executions == 1 {
            caveats.push(
                "one execution has a device trace: engine, opcode, HLO and FLOP figures describe that execution alone"
                    .into(),
            );
        }
        for t in &traced {
            match t.of_p50 {
            // Only a capture starts the model with the recording: elsewhere the first
            // recorded execution may follow many unrecorded ones.
            Some(r) if t.ordinal == 1 && meta.capture_kind == "capture" && meta.warmup_executions == 0 && r > 1.2 => caveats.push(format!(
                "the traced execution on nc{} is the first, run cold without a warm-up: it took {r:.2}× the p50 on device",
                t.core
            )),
            Some(r) if !(1.0 / 1.5..=1.5).contains(&r) => caveats.push(format!(
                "traced execution {} on nc{} took {r:.2}× the p50 on device: its breakdown may not be the usual one",
                t.ordinal, t.core
            )),
            _ => {}
        }
        }
        if let Some(b) = &bounds
            && b.recorded_executions > b.executions
            && !findings.is_empty()
        {
            caveats.push(format!(
                "{} of {} recorded executions {} a device trace: the findings' savings are {} scaled to all {}",
                b.executions,
                b.recorded_executions,
                if b.executions == 1 { "has" } else { "have" },
                if b.executions == 1 { "that one's" } else { "theirs" },
                b.recorded_executions
            ));
        }
        if executions > 0 && last > first && last - first < 10_000_000 {
            caveats.push(format!(
                "the profile spans {}: rates over so short a time vary a lot",
                duration(seconds(last - first))
            ));
        }
        Summary {
            process: Process {
                pid: meta.pid,
                tag: meta.process_tag.clone(),
                program: meta.program.clone(),
                instance_type: meta.instance_type.clone(),
                runtime_version: meta.runtime_version.clone(),
                tool: meta.tool.clone(),
                capture_kind: meta.capture_kind.clone(),
            },
            models: file
                .models()
                .iter()
                .filter(|m| cores.is_none_or(|c| c.contains(&m.core)))
                .map(|m| ModelSummary {
                    model_id: m.model_id,
                    name: m.name.clone(),
                    core: m.core,
                    flops_per_execution: m.flops_per_execution,
                    neff_sha256: m.neff_sha256.clone(),
                })
                .collect(),
            total_time_s: if last > first { seconds(last - first) } else { 0.0 },
            events,
            failures,
            executions: Executions {
                count: executions,
                device_traced: device_executions,
                latency: latency.summary(),
                device_latency: device_latency.summary(),
                warmup: meta.warmup_executions,
                traced,
            },
            device_time_s: seconds(device_ns),
            engines: engine_rows,
            opcodes: opcode_rows,
            top_hlo_instructions: hlo_rows.iter().take(TOP_HLO).cloned().collect(),
            hlo_instructions: hlo_rows,
            flops: Flops {
                total: total_flops,
                per_execution: (device_executions > 0).then(|| total_flops as f64 / device_executions as f64),
                achieved_per_s: achieved,
                peak_per_s: peaks.pe,
                peak_basis: meta.defined_peak_basis.clone(),
                vector_peak_per_s: peaks.vector,
                measured_per_s: measured,
                measured_method: meta.peak_flops_method.clone(),
                mfu,
                memory_peak_bytes_per_s: memory_peak,
                memory_peak_method: meta.peak_memory_method.clone(),
            },
            dma: dma_rows,
            collectives,
            file_problems: file.recovery().describe().into_iter().chain(chunk_problems).collect(),
            caveats,
            bounds,
            findings,
        }
    }
}

/// Adds `window` to the windows of `key`.
/// Each HLO instruction's device time in the median of the `executions` traced ones, in
/// nanoseconds (the mean of the middle two for an even count); an execution it did not
/// run in counts as zero.
fn median_per_execution(
    by_execution: &HashMap<(u32, WindowKey), u64>,
    hlo_of_descriptor: &HashMap<u32, String>,
    executions: u64,
) -> HashMap<String, u64> {
    let mut runs: HashMap<&str, HashMap<WindowKey, u64>> = HashMap::new();
    for ((descriptor, key), ns) in by_execution {
        if let Some(hlo) = hlo_of_descriptor.get(descriptor) {
            add(runs.entry(hlo).or_default().entry(*key).or_default(), *ns);
        }
    }
    runs.into_iter()
        .map(|(hlo, per_run)| {
            let mut times: Vec<u64> = per_run.into_values().collect();
            let executions = (executions as usize).max(times.len());
            times.resize(executions, 0);
            times.sort_unstable();
            let middle = executions / 2;
            let median = if executions % 2 == 1 {
                times[middle]
            } else {
                times[middle - 1] / 2 + times[middle] / 2 + (times[middle - 1] % 2 + times[middle] % 2) / 2
            };
            (hlo.to_owned(), median)
        })
        .collect()
}

/// The line that says a chunk could not be read, in every output that reads chunks.
pub fn unreadable_chunk(info: &crate::ChunkInfo, e: &NtffError) -> String {
    let events = u64::from(info.system_events) + u64::from(info.device_events);
    let reason = match e {
        NtffError::Damaged { reason, .. } => reason.clone(),
        other => other.to_string(),
    };
    format!("a chunk of {events} events at offset {} could not be read: {reason}", info.offset)
}

fn merge_window(windows: &mut HashMap<WindowKey, (u64, u64)>, key: WindowKey, window: (u64, u64)) {
    let w = windows.entry(key).or_insert(window);
    w.0 = w.0.min(window.0);
    w.1 = w.1.max(window.1);
}

/// Why a figure can exceed a defined peak.
const ABOVE_ROOFLINE: &str = "an instruction fused with others is timed by its measured share of the group's time, and the bytes the group reads are charged to the member that first reads them, so a member's rate can read above what memory delivers while the group's does not; operands small enough to stay in the CPU's caches move faster than the memory ceiling, which is measured on copies of 16 MiB; the host clock may also run above the one the definition assumes";

const ABOVE_PEAK: &str =
    "the host CPU ran above the clock the definition assumes (a turbo clock /proc/cpuinfo does not report)";

/// The executions with a device trace, placed among the recorded ones of their core.
fn traced_executions(
    windows: &HashMap<(u32, Option<u64>), (u64, u64)>,
    runs: &HashMap<(u32, u64), (u64, u64)>,
    device_p50: Option<f64>,
) -> Vec<TracedExecution> {
    let mut starts: HashMap<u32, Vec<u64>> = HashMap::new();
    for (&(core, _), &(start, _)) in runs {
        starts.entry(core).or_default().push(start);
    }
    starts.values_mut().for_each(|s| s.sort_unstable());
    let mut traced: Vec<TracedExecution> = windows
        .keys()
        .filter_map(|&(core, exec)| {
            let (start, ns) = *runs.get(&(core, exec?))?;
            let ordinal = starts.get(&core).map_or(0, |s| s.partition_point(|&t| t < start)) as u64 + 1;
            let device_s = ns as f64 / 1e9;
            Some(TracedExecution {
                core,
                ordinal,
                device_s,
                of_p50: device_p50.filter(|&p| p > 0.0).map(|p| device_s / p),
            })
        })
        .collect();
    traced.sort_by_key(|t| (t.ordinal, t.core));
    traced.truncate(TRACED_LISTED);
    traced
}
