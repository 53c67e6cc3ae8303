//! The summary as text for people (`summary-text`, and the dashboard's "as
//! neuron-profile prints it").

use std::fmt::Write as _;

use super::Summary;
use crate::stats::{LatencySummary, si, thousands};

pub(crate) fn duration(s: f64) -> String {
    match s {
        s if s >= 1.0 => format!("{s:.3} s"),
        s if s >= 1e-3 => format!("{:.3} ms", s * 1e3),
        s => format!("{:.1} us", s * 1e6),
    }
}

fn latency_line(label: &str, l: &Option<LatencySummary>) -> String {
    match l {
        Some(l) => format!("  {label:<10} {}\n", l.describe(duration)),
        None => format!("  {label:<10} N/A (no completed executions)\n"),
    }
}

/// The summary as text for people.
pub fn to_text(s: &Summary, file_name: &str) -> String {
    let mut out = String::new();
    let p = &s.process;
    let tag = if p.tag.is_empty() { String::new() } else { format!(", tag {}", p.tag) };
    // Named as the live tools name it: the script, not the interpreter.
    let program = if p.program.is_empty() { String::new() } else { format!("{} ", p.program) };
    let _ = writeln!(
        out,
        "{file_name}: {} of {program}pid {}{tag} on {}, runtime {}",
        p.capture_kind, p.pid, p.instance_type, p.runtime_version
    );
    // What failed comes before the figures.
    for line in s.failures.lines() {
        let _ = writeln!(out, "FAILED: {line}");
    }
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
    let warmup = match x.warmup {
        0 => String::new(),
        1 => ", after 1 warm-up execution".into(),
        n => format!(", after {n} warm-up executions"),
    };
    let _ = writeln!(
        out,
        "\nexecutions: {} recorded{warmup} ({} with a device trace)",
        thousands(x.count),
        thousands(x.device_traced)
    );
    out.push_str(&latency_line("latency", &x.latency));
    out.push_str(&latency_line("on device", &x.device_latency));
    for t in &x.traced {
        let against = t.of_p50.map_or(String::new(), |r| format!(", {r:.2}× the p50 on device"));
        let _ = writeln!(
            out,
            "  traced     execution {} on nc{}: {} on device{against}",
            thousands(t.ordinal),
            t.core,
            duration(t.device_s)
        );
    }
    let _ = writeln!(out, "\nengines (device time of the traced executions: {})", duration(s.device_time_s));
    let _ = writeln!(
        out,
        "  {:<6} {:>12} {:>7} {:>13} {:>12} {:>10}",
        "engine", "active", "%", "instructions", "FLOPs", "% of peak"
    );
    for r in &s.engines {
        let of_peak = r.percent_of_peak.map_or("-".to_string(), |p| format!("{p:.1}%"));
        let _ = writeln!(
            out,
            "  {:<6} {:>12} {:>6.1}% {:>13} {:>12} {:>10}",
            r.engine,
            duration(r.active_s),
            r.percent,
            thousands(r.instructions),
            si(r.flops as f64).trim_end(),
            of_peak
        );
    }
    if let Some(c) = &s.collectives {
        let _ = writeln!(
            out,
            "  {:<6} {:>12} {:>6.1}% {:>13}   inside collectives: waiting for the other ranks and passing data, no engine's work",
            "-",
            duration(c.time_s),
            c.percent,
            thousands(c.instructions)
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
    let _ = writeln!(
        out,
        "\ntop HLO instructions by device time in the median traced execution, then in all (a loop or \
         conditional includes what it ran)"
    );
    let _ = writeln!(
        out,
        "  {:<32} {:>12} {:>12} {:>12} {:>7} {:>12} {:>12} {:>9} {:>10} {:>9}",
        "HLO instruction", "instructions", "median", "time", "%", "FLOPs", "bytes", "FLOP/B", "bound", "roofline"
    );
    for r in &s.top_hlo_instructions {
        let _ = writeln!(
            out,
            "  {:<32} {:>12} {:>12} {:>12} {:>6.1}% {:>12} {:>12} {:>9} {:>10} {:>9}",
            r.hlo,
            thousands(r.instructions),
            r.median_s.map_or("-".into(), duration),
            duration(r.time_s),
            r.percent,
            si(r.flops as f64).trim_end(),
            si(r.bytes as f64).trim_end(),
            r.intensity.map_or("-".into(), |x| format!("{x:.2}")),
            r.bound.as_deref().unwrap_or("-"),
            r.roofline_percent.map_or("-".into(), |p| format!("{p:.1}%"))
        );
    }
    let f = &s.flops;
    let _ = writeln!(out, "\nFLOPs: {}FLOP traced", si(f.total as f64));
    if let Some(per) = f.per_execution {
        let _ = writeln!(out, "  per execution  {}FLOP", si(per));
    }
    match f.achieved_per_s {
        Some(a) => {
            let _ = writeln!(out, "  achieved       {}FLOP/s on device", si(a));
        }
        None => {
            let _ = writeln!(out, "  achieved       N/A (no device trace)");
        }
    }
    match f.peak_per_s {
        Some(p) => {
            let _ = writeln!(out, "  peak           {}FLOP/s per core, defined: {}", si(p), f.peak_basis);
        }
        None => {
            let _ = writeln!(out, "  peak           N/A (the file does not say what the traced runtime ran on)");
        }
    }
    match f.mfu {
        Some(m) if m > 1.0 => {
            let _ = writeln!(out, "  MFU            {:.1}% (above 100%: see below)", 100.0 * m);
        }
        Some(m) => {
            let _ = writeln!(out, "  MFU            {:.1}%", 100.0 * m);
        }
        None => {
            let _ = writeln!(out, "  MFU            N/A");
        }
    }
    if let Some(measured) = f.measured_per_s {
        let share =
            f.peak_per_s.map_or(String::new(), |p| format!(", {:.0}% of the defined peak", 100.0 * measured / p));
        let _ = writeln!(out, "  backend        {}FLOP/s measured{share}: {}", si(measured), f.measured_method);
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
    if let Some(b) = &s.bounds {
        let n = b.executions.max(1) as f64;
        let per = |v: f64| duration(v / n);
        let _ = writeln!(out, "\nbounds (per traced execution, {} of them)", thousands(b.executions));
        if let Some(h) = b.host_s {
            let _ = writeln!(out, "  host           {}  nrt_execute, call to return", per(h));
        }
        let _ = writeln!(out, "  device         {}  nc_exec_running, measured", per(b.device_s));
        let _ = writeln!(out, "  pipeline       {}  the busiest resource: {}", per(b.pipeline_s), b.pipeline_resource);
        match (b.compute_s, &b.compute_engine) {
            (Some(c), Some(engine)) => {
                let _ = writeln!(out, "  compute        {}  {engine}'s FLOPs at its defined peak", per(c));
            }
            _ => {
                let _ = writeln!(out, "  compute        N/A (no defined peak in the file)");
            }
        }
        match (b.memory_s, b.dma_peak_bytes_per_s) {
            (Some(m), Some(bw)) => {
                let _ = writeln!(
                    out,
                    "  memory         {}  the DMA bytes at {}B/s, the fastest transfer of 64 KiB or more (and 10 µs) in this profile",
                    per(m),
                    si(bw)
                );
            }
            _ => {
                // The HLO rows' memory ceiling is another figure: the host's bandwidth.
                let host = s.flops.memory_peak_bytes_per_s.map_or(String::new(), |bw| {
                    format!("; the HLO roofline's memory ceiling is the host's measured bandwidth, {}B/s", si(bw))
                });
                let _ = writeln!(
                    out,
                    "  memory         N/A (no DMA transfer of 64 KiB or more lasted 10 µs: nothing to measure the DMA bandwidth by{host})"
                );
            }
        }
        let _ = writeln!(
            out,
            "  idle           {} of {} between the {} recorded executions",
            duration(b.idle_s),
            duration(b.recorded_s),
            thousands(b.recorded_executions)
        );
        let _ =
            writeln!(out, "  where the time goes, in total over the traced executions (idle: over all recorded ones):");
        for g in &b.gaps {
            let _ = writeln!(out, "    {:>12}  {}", duration(g.seconds), g.name);
        }
    }
    if !s.findings.is_empty() {
        let _ = writeln!(out, "\nfindings, by the time they could save");
        for (k, f) in s.findings.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {}. [{}] {}; up to {} ({:.0}% of the recorded time)",
                k + 1,
                f.about,
                f.text,
                duration(f.saves_s),
                f.saves_percent
            );
            let _ = writeln!(out, "     evidence: {}", f.evidence);
            if let Some(s) = &f.suggestion {
                let _ = writeln!(out, "     try: {s}");
            }
        }
    }
    if !s.caveats.is_empty() {
        let _ = writeln!(out, "\nread with care");
        for caveat in &s.caveats {
            let _ = writeln!(out, "  - {caveat}");
        }
    }
    out
}
