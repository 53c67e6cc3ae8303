//! The profile summary: where the time went, per engine, opcode and HLO instruction;
//! FLOPs against the measured peak; DMA traffic; execution latency; what was lost.
//! Computed in one pass over a file's chunks; printed as text (`summary-text`) or
//! JSON (`summary-json`), and shown by the dashboard's profile viewer.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::stats::{LatencyHistogram, LatencySummary, si, thousands};
use crate::{Clock, Descriptor, DescriptorId, NtffFile, Phase};
use serde::Serialize;

/// HLO instructions listed in the summary.
pub const TOP_HLO: usize = 10;

#[derive(Debug, Serialize)]
pub struct Summary {
    pub process: Process,
    pub models: Vec<ModelSummary>,
    /// Host time from the first to the last event.
    pub total_time_s: f64,
    pub events: EventCounts,
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
    /// Damage or truncation of the file, one line each.
    pub file_problems: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Process {
    pub pid: u32,
    pub tag: String,
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
}

#[derive(Debug, Serialize)]
pub struct EngineSummary {
    pub engine: String,
    pub active_s: f64,
    /// Of the device time.
    pub percent: f64,
    pub instructions: u64,
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
    pub percent: f64,
    pub flops: u64,
}

#[derive(Debug, Serialize)]
pub struct Flops {
    /// FLOPs of the traced instructions.
    pub total: u64,
    /// Per device-traced execution.
    pub per_execution: Option<f64>,
    /// Total FLOPs over device time.
    pub achieved_per_s: Option<f64>,
    /// Measured peak of one core, and how.
    pub peak_per_s: Option<f64>,
    pub peak_method: String,
    /// Achieved over peak.
    pub mfu: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct DmaSummary {
    pub queue: String,
    pub transfers: u64,
    pub bytes: u64,
    pub time_s: f64,
    /// Bytes over the transfers' busy time.
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
}

/// Summarises the events of `cores` (`None`: all) in `file`.
pub fn summarise(file: &NtffFile, cores: Option<&[u32]>) -> Summary {
    let meta = file.metadata();
    let mut events = EventCounts { lost_in_file: file.recovery().events_lost(), ..EventCounts::default() };
    let mut engines: HashMap<String, Totals> = HashMap::new();
    let mut opcodes: HashMap<(String, String), Totals> = HashMap::new();
    let mut hlos: HashMap<String, Totals> = HashMap::new();
    let mut dma: HashMap<String, (Totals, u64)> = HashMap::new();
    // Device-time window of each (core, execution).
    let mut windows: HashMap<(u32, Option<u64>), (u64, u64)> = HashMap::new();
    let mut starts: HashMap<(Option<u32>, u64, bool), u64> = HashMap::new();
    let mut latency = LatencyHistogram::default();
    let mut device_latency = LatencyHistogram::default();
    let mut executions = 0u64;
    let (mut first, mut last) = (u64::MAX, 0u64);
    let execute = file.find_string("nrt_execute");
    let running = file.find_string("nc_exec_running");
    let status = file.find_string("status");
    // Per-descriptor totals first; names are resolved once per descriptor at the end.
    let mut by_descriptor: HashMap<u32, Totals> = HashMap::new();
    for info in file.select(cores, None) {
        if let Some((low, high)) = info.host_span {
            first = first.min(low);
            last = last.max(high);
        }
        let Ok(chunk) = file.read_chunk(info) else { continue };
        events.system += chunk.system.len() as u64;
        events.device += chunk.device.len() as u64;
        events.lost_in_rings += chunk.losses.iter().map(|l| l.events).sum::<u64>();
        for e in &chunk.system {
            let is_execute = Some(e.name) == execute;
            if !is_execute && Some(e.name) != running {
                continue;
            }
            let key = (e.core, e.tracking_id, is_execute);
            match e.phase {
                Phase::Start => {
                    starts.insert(key, e.timestamp_ns);
                }
                Phase::Stop => {
                    if let Some(start) = starts.remove(&key) {
                        let ns = e.timestamp_ns.saturating_sub(start);
                        let status_ok = !e.args.iter().any(|a| Some(a.key) == status);
                        if is_execute {
                            executions += 1;
                            if status_ok {
                                latency.record(std::time::Duration::from_nanos(ns));
                            }
                        } else if e.clock == Clock::Device && status_ok {
                            device_latency.record(std::time::Duration::from_nanos(ns));
                        }
                    }
                }
                Phase::Instant => {}
            }
        }
        for e in &chunk.device {
            let ns = e.end_ns.saturating_sub(e.start_ns);
            let t = by_descriptor.entry(e.descriptor.0).or_default();
            t.count += 1;
            t.ns += ns;
            let window = windows.entry((e.core, e.exec_id)).or_insert((e.start_ns, e.end_ns));
            window.0 = window.0.min(e.start_ns);
            window.1 = window.1.max(e.end_ns);
        }
    }
    for (&id, t) in &by_descriptor {
        let Some(descriptor) = file.descriptor(DescriptorId(id)) else { continue };
        match *descriptor {
            Descriptor::Instruction { engine, opcode, hlo, flops, .. } => {
                let engine = file.string_or_placeholder(engine).into_owned();
                let opcode = file.string_or_placeholder(opcode).into_owned();
                let flops = flops * t.count;
                // A loop or conditional span encloses the instructions it ran: its time
                // is the HLO instruction's (inclusive), not work of its engine.
                if !ENCLOSING_OPCODES.contains(&opcode.as_str()) {
                    let e = engines.entry(engine.clone()).or_default();
                    (e.count, e.ns, e.flops) = (e.count + t.count, e.ns + t.ns, e.flops + flops);
                    let o = opcodes.entry((engine, opcode)).or_default();
                    (o.count, o.ns) = (o.count + t.count, o.ns + t.ns);
                }
                let h = hlos.entry(file.string_or_placeholder(hlo).into_owned()).or_default();
                (h.count, h.ns, h.flops) = (h.count + t.count, h.ns + t.ns, h.flops + flops);
            }
            Descriptor::Dma { queue, bytes, .. } => {
                let q = dma.entry(file.string_or_placeholder(queue).into_owned()).or_default();
                (q.0.count, q.0.ns, q.1) = (q.0.count + t.count, q.0.ns + t.ns, q.1 + bytes * t.count);
            }
        }
    }
    let device_executions = windows.keys().filter(|(_, exec)| exec.is_some()).count() as u64;
    let device_ns: u64 = windows.values().map(|(a, b)| b.saturating_sub(*a)).sum();
    let seconds = |ns: u64| ns as f64 / 1e9;
    let percent = |ns: u64| if device_ns == 0 { 0.0 } else { 100.0 * ns as f64 / device_ns as f64 };
    let mut engine_rows: Vec<EngineSummary> = engines
        .iter()
        .map(|(engine, t)| EngineSummary {
            engine: engine.clone(),
            active_s: seconds(t.ns),
            percent: percent(t.ns),
            instructions: t.count,
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
    let mut hlo_rows: Vec<HloSummary> = hlos
        .into_iter()
        .map(|(hlo, t)| HloSummary {
            hlo,
            instructions: t.count,
            time_s: seconds(t.ns),
            percent: percent(t.ns),
            flops: t.flops,
        })
        .collect();
    hlo_rows.sort_by(|a, b| b.time_s.total_cmp(&a.time_s).then_with(|| a.hlo.cmp(&b.hlo)));
    let mut dma_rows: Vec<DmaSummary> = dma
        .into_iter()
        .map(|(queue, (t, bytes))| DmaSummary {
            queue,
            transfers: t.count,
            bytes,
            time_s: seconds(t.ns),
            bandwidth_bytes_per_s: (t.ns > 0).then(|| bytes as f64 / seconds(t.ns)),
        })
        .collect();
    dma_rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.queue.cmp(&b.queue)));
    let total_flops: u64 = engines.values().map(|t| t.flops).sum();
    let achieved = (device_ns > 0 && total_flops > 0).then(|| total_flops as f64 / seconds(device_ns));
    let peak = (meta.peak_flops_per_core > 0.0).then_some(meta.peak_flops_per_core);
    Summary {
        process: Process {
            pid: meta.pid,
            tag: meta.process_tag.clone(),
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
        executions: Executions {
            count: executions,
            device_traced: device_executions,
            latency: latency.summary(),
            device_latency: device_latency.summary(),
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
            peak_per_s: peak,
            peak_method: meta.peak_flops_method.clone(),
            mfu: achieved.zip(peak).map(|(a, p)| a / p),
        },
        dma: dma_rows,
        file_problems: file.recovery().describe(),
    }
}

fn duration(s: f64) -> String {
    match s {
        s if s >= 1.0 => format!("{s:.3} s"),
        s if s >= 1e-3 => format!("{:.3} ms", s * 1e3),
        s => format!("{:.1} us", s * 1e6),
    }
}

fn latency_line(label: &str, l: &Option<LatencySummary>) -> String {
    match l {
        Some(l) => format!(
            "  {label:<10} p50 {}  p90 {}  p99 {}  max {}\n",
            duration(l.p50),
            duration(l.p90),
            duration(l.p99),
            duration(l.max)
        ),
        None => format!("  {label:<10} N/A (no completed executions)\n"),
    }
}

/// The summary as text for people.
pub fn to_text(s: &Summary, file_name: &str) -> String {
    let mut out = String::new();
    let p = &s.process;
    let tag = if p.tag.is_empty() { String::new() } else { format!(", tag {}", p.tag) };
    let _ = writeln!(
        out,
        "{file_name}: {} of pid {}{tag} on {}, runtime {}",
        p.capture_kind, p.pid, p.instance_type, p.runtime_version
    );
    for m in &s.models {
        let sha = if m.neff_sha256.is_empty() {
            String::new()
        } else {
            format!(", NEFF sha256 {}", &m.neff_sha256[..16.min(m.neff_sha256.len())])
        };
        let _ = writeln!(
            out,
            "model {} (id {}) on nc{}: {}FLOP per execution{sha}",
            m.name,
            m.model_id,
            m.core,
            si(m.flops_per_execution as f64)
        );
    }
    let e = &s.events;
    let _ = writeln!(
        out,
        "total time {} (host time, first to last event); {} system events, {} device events; events lost: {} in the rings, {} in the file",
        duration(s.total_time_s),
        thousands(e.system),
        thousands(e.device),
        thousands(e.lost_in_rings),
        thousands(e.lost_in_file)
    );
    for problem in &s.file_problems {
        let _ = writeln!(out, "warning: {problem}");
    }
    let x = &s.executions;
    let _ = writeln!(out, "\nexecutions: {} ({} with a device trace)", thousands(x.count), thousands(x.device_traced));
    out.push_str(&latency_line("latency", &x.latency));
    out.push_str(&latency_line("on device", &x.device_latency));
    let _ = writeln!(out, "\nengines (device time of the traced executions: {})", duration(s.device_time_s));
    let _ = writeln!(out, "  {:<6} {:>12} {:>7} {:>13}", "engine", "active", "%", "instructions");
    for r in &s.engines {
        let _ = writeln!(
            out,
            "  {:<6} {:>12} {:>6.1}% {:>13}",
            r.engine,
            duration(r.active_s),
            r.percent,
            thousands(r.instructions)
        );
    }
    let _ = writeln!(out, "\nopcodes by device time");
    let _ = writeln!(out, "  {:<6} {:<24} {:>10} {:>12} {:>7}", "engine", "opcode", "count", "time", "%");
    for r in &s.opcodes {
        let _ = writeln!(
            out,
            "  {:<6} {:<24} {:>10} {:>12} {:>6.1}%",
            r.engine,
            r.opcode,
            thousands(r.count),
            duration(r.time_s),
            r.percent
        );
    }
    let _ = writeln!(out, "\ntop HLO instructions by device time (a loop or conditional includes what it ran)");
    let _ =
        writeln!(out, "  {:<32} {:>12} {:>12} {:>7} {:>12}", "HLO instruction", "instructions", "time", "%", "FLOPs");
    for r in &s.top_hlo_instructions {
        let _ = writeln!(
            out,
            "  {:<32} {:>12} {:>12} {:>6.1}% {:>12}",
            r.hlo,
            thousands(r.instructions),
            duration(r.time_s),
            r.percent,
            si(r.flops as f64).trim_end()
        );
    }
    let f = &s.flops;
    let _ = writeln!(out, "\nFLOPs: {}FLOP traced", si(f.total as f64));
    if let Some(per) = f.per_execution {
        let _ = writeln!(out, "  per execution  {}FLOP", si(per));
    }
    match (f.achieved_per_s, f.peak_per_s, f.mfu) {
        (Some(a), Some(p), Some(m)) => {
            let _ = writeln!(
                out,
                "  achieved       {}FLOP/s on device\n  peak           {}FLOP/s per core: {}\n  MFU            {:.1}%",
                si(a),
                si(p),
                f.peak_method,
                100.0 * m
            );
        }
        (Some(a), _, _) => {
            let _ = writeln!(
                out,
                "  achieved       {}FLOP/s on device\n  MFU            N/A (no measured peak in the file)",
                si(a)
            );
        }
        _ => {
            let _ = writeln!(out, "  achieved       N/A (no device trace)");
        }
    }
    let _ = writeln!(out, "\nDMA by queue");
    let _ = writeln!(out, "  {:<13} {:>10} {:>12} {:>12} {:>14}", "queue", "transfers", "bytes", "time", "bandwidth");
    for r in &s.dma {
        let bandwidth = r.bandwidth_bytes_per_s.map_or("N/A".to_string(), |b| format!("{}B/s", si(b)));
        let _ = writeln!(
            out,
            "  {:<13} {:>10} {:>12} {:>12} {:>14}",
            r.queue,
            thousands(r.transfers),
            thousands(r.bytes),
            duration(r.time_s),
            bandwidth
        );
    }
    out
}
