//! Performance bounds and findings: how fast the traced executions could have been if
//! each resource ran at its peak, where the gap to the measured time goes, and what
//! is worth fixing, ranked by the time it could save.
//!
//! Over the executions with a device trace:
//! - the **compute bound**: each engine's FLOPs at its defined peak, the largest;
//! - the **memory bound**: the DMA bytes at the fastest rate a transfer of at least
//!   [`DMA_PEAK_MIN_BYTES`] lasting at least `MIN_BANDWIDTH_BASIS_S` reached in the
//!   same profile (there is no defined DMA peak; without such a transfer, none);
//! - the **pipeline bound**: the busiest engine's or DMA queue's active time;
//! - the measured **device time** (`nc_exec_running`) and **host time** (`nrt_execute`).
//!
//! Each bound is at most the device time: an engine cannot be busier than the device,
//! nor faster than its peak. Over every recorded execution, the device's **idle time**
//! between executions is the rest of each core's time from the first execution's start
//! to the last one's end. A finding is only made from these figures, and only when it
//! could save at least [`MIN_FINDING_PERCENT`] of the recorded time.

use std::collections::HashMap;

use serde::Serialize;

use super::{DmaSummary, EngineSummary, HloSummary, InCollectives, LongWait, duration};

/// Transfers this large or larger set the memory bound's bandwidth: smaller ones
/// measure the per-transfer cost more than the bandwidth.
pub const DMA_PEAK_MIN_BYTES: u64 = 64 * 1024;
/// Findings that could save less than this share of the recorded time are left out.
pub const MIN_FINDING_PERCENT: f64 = 5.0;
/// An HLO instruction is worth a finding when it takes at least this share of the
/// device time and runs below this share of its roofline.
const HLO_FINDING_MIN_PERCENT: f64 = 10.0;
const HLO_FINDING_BELOW_ROOFLINE: f64 = 30.0;

/// The bounds of the traced executions, and the idle time of all recorded ones.
#[derive(Debug, Clone, Serialize)]
pub struct Bounds {
    /// Executions with a device trace, which the device bounds are over.
    pub executions: u64,
    /// Their `nc_exec_running` time.
    pub device_s: f64,
    /// Their `nrt_execute` time, when the file has it.
    pub host_s: Option<f64>,
    /// The busiest engine or DMA queue, and its active time.
    pub pipeline_s: f64,
    pub pipeline_resource: String,
    /// The engine whose FLOPs take longest at its defined peak, and that time.
    pub compute_s: Option<f64>,
    pub compute_engine: Option<String>,
    /// The DMA bytes at `dma_peak_bytes_per_s`.
    pub memory_s: Option<f64>,
    pub dma_peak_bytes_per_s: Option<f64>,
    /// What separates the bounds from each other and from the measured times.
    pub gaps: Vec<Gap>,
    /// Over every recorded execution: each core's time from its first execution's
    /// start to its last one's end, summed, and the part of it no execution ran.
    pub recorded_s: f64,
    pub idle_s: f64,
    /// Executions recorded on the cores with a trace.
    pub recorded_executions: u64,
}

/// A named part of the time between two bounds or measured times.
#[derive(Debug, Clone, Serialize)]
pub struct Gap {
    pub name: String,
    pub seconds: f64,
}

/// Something worth fixing, with the figures behind it.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// What kind of finding: `idle`, `host overhead`, `busy resource`, `roofline`,
    /// `engine overlap`; with `about`, what identifies it when two profiles are compared.
    pub kind: String,
    /// The resource or instruction it is about: `host`, an engine, `DMA <queue>`,
    /// `engine overlap`.
    pub about: String,
    pub text: String,
    pub evidence: String,
    /// The most it could save, over the recorded executions, and that share of the
    /// recorded time (or of the host calls' time, when they took longer: a synchronous
    /// loop's calls begin before its first device run and end after its last).
    pub saves_s: f64,
    pub saves_percent: f64,
    pub suggestion: Option<String>,
}

/// What `summarise` measured, for the bounds.
pub(super) struct Inputs<'a> {
    pub engines: &'a [EngineSummary],
    pub dma: &'a [DmaSummary],
    /// By device time, largest first.
    pub hlos: &'a [HloSummary],
    /// The engine each HLO instruction spent most time on.
    pub hlo_engine: &'a HashMap<String, (String, u64)>,
    /// The traced executions' time inside collectives.
    pub collectives: Option<&'a InCollectives>,
    /// The ranks this process's ranks waited for past the runtime's warning.
    pub long_waits: &'a [LongWait],
    /// Device windows of the traced executions, by (core, execution).
    pub windows: &'a HashMap<(u32, Option<u64>), (u64, u64)>,
    /// Start and `nc_exec_running` length of every recorded execution.
    pub runs: &'a HashMap<(u32, u64), (u64, u64)>,
    /// `nrt_execute` length of every recorded execution.
    pub host_runs: &'a HashMap<(u32, u64), u64>,
    pub peaks: super::DefinedPeaks,
    pub dma_peak: Option<f64>,
    /// The executions were scheduled (`nrta_execute_schedule`), not called.
    pub asynchronous: bool,
    pub advice: super::advice::Advice,
}

/// The bounds, and the findings ranked by the time they could save (none when nothing
/// is worth saying, or nothing was traced).
pub(super) fn analyse(i: &Inputs<'_>) -> (Option<Bounds>, Vec<Finding>) {
    let traced: Vec<(u32, u64)> = i.windows.keys().filter_map(|&(core, exec)| Some((core, exec?))).collect();
    let device_ns: u64 = traced.iter().filter_map(|k| i.runs.get(k)).map(|&(_, ns)| ns).sum();
    if traced.is_empty() || device_ns == 0 {
        return (None, Vec::new());
    }
    let device_s = device_ns as f64 / 1e9;
    let host: Vec<u64> = traced.iter().filter_map(|k| i.host_runs.get(k).copied()).collect();
    let host_s = (host.len() == traced.len()).then(|| host.iter().sum::<u64>() as f64 / 1e9);
    let peak_of = |engine: &str| i.peaks.of(engine);
    // Busiest resource: an engine, or a DMA queue.
    let mut resources: Vec<(String, f64)> = i.engines.iter().map(|e| (e.engine.clone(), e.active_s)).collect();
    resources.extend(i.dma.iter().map(|q| (format!("DMA {}", q.queue), q.time_s)));
    resources.sort_by(|a, b| b.1.total_cmp(&a.1));
    let (pipeline_resource, pipeline_s) = resources.first().cloned().unwrap_or_default();
    let pipeline_s = pipeline_s.min(device_s);
    let compute = i
        .engines
        .iter()
        .filter_map(|e| Some((e.engine.clone(), e.flops as f64 / peak_of(&e.engine)?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    // Bytes that moved: queues busy long enough to have copied something (inputs bound
    // in place and instruction fetches take no time), not the instruction queue.
    let dma_bytes: u64 = i
        .dma
        .iter()
        .filter(|q| q.queue != "instructions" && q.time_s >= super::MIN_BANDWIDTH_BASIS_S)
        .map(|q| q.bytes)
        .sum();
    let memory_s = i.dma_peak.map(|bw| dma_bytes as f64 / bw);
    let floor = compute.as_ref().map(|c| c.1).into_iter().chain(memory_s).fold(0.0, f64::max);

    // Idle between executions, core by core, over every recorded execution.
    let cores: Vec<u32> = {
        let mut c: Vec<u32> = traced.iter().map(|&(core, _)| core).collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    let (mut recorded_ns, mut idle_ns, mut recorded_executions) = (0u64, 0u64, 0u64);
    for core in &cores {
        let mut spans: Vec<(u64, u64)> = i
            .runs
            .iter()
            .filter(|((c, _), _)| c == core)
            .map(|(_, &(start, ns))| (start, start.saturating_add(ns)))
            .collect();
        spans.sort_unstable();
        let (Some(first), Some(last)) = (spans.first(), spans.iter().map(|s| s.1).max()) else { continue };
        let wall = last.saturating_sub(first.0);
        let busy: u64 = spans.iter().fold(0u64, |sum, (a, b)| sum.saturating_add(b - a));
        recorded_ns = recorded_ns.saturating_add(wall);
        idle_ns = idle_ns.saturating_add(wall.saturating_sub(busy));
        recorded_executions += spans.len() as u64;
    }
    let recorded_s = (recorded_ns as f64 / 1e9).max(device_s);
    let idle_s = idle_ns as f64 / 1e9;

    let mut gaps = Vec::new();
    if let Some(host_s) = host_s {
        gaps.push(Gap { name: "host time around the device run".into(), seconds: (host_s - device_s).max(0.0) });
    }
    let collective_s = i.collectives.map_or(0.0, |c| c.time_s.min(device_s - pipeline_s));
    if collective_s > 0.0 {
        gaps.push(Gap {
            name: "inside collectives (waiting for the other ranks, passing data)".into(),
            seconds: collective_s,
        });
    }
    gaps.push(Gap {
        name: "engines waiting on each other and on DMA (no resource busy)".into(),
        seconds: (device_s - pipeline_s - collective_s).max(0.0),
    });
    if floor > 0.0 {
        gaps.push(Gap {
            name: format!("{pipeline_resource} busy beyond the larger of the compute and memory bounds"),
            seconds: (pipeline_s - floor).max(0.0),
        });
    }
    gaps.push(Gap { name: "device idle between executions".into(), seconds: idle_s });
    gaps.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));

    // Per traced execution to every recorded one.
    let scale = recorded_executions.max(traced.len() as u64) as f64 / traced.len() as f64;
    // What the findings' savings are shares of: the recorded time, or the host calls'
    // time when that is longer, so that no finding saves more than all of it.
    let run_s = recorded_s.max(host_s.map_or(0.0, |h| h * scale));
    let share = |s: f64| 100.0 * s / run_s;
    let n = traced.len();
    let mut findings = Vec::new();
    if idle_s > 0.0 {
        let suggestion = i.advice.host_bound(i.asynchronous);
        findings.push(Finding {
            kind: "idle".into(),
            about: "host".into(),
            text: format!(
                "the device is idle {:.0}% of the time between executions, waiting for the host",
                100.0 * idle_s / recorded_s
            ),
            evidence: format!(
                "{} idle of {} from the first execution's start to the last one's end, over {recorded_executions} executions",
                duration(idle_s),
                duration(recorded_s)
            ),
            saves_s: idle_s,
            saves_percent: share(idle_s),
            suggestion: Some(suggestion),
        });
    }
    if let Some(host_s) = host_s.filter(|&h| h > device_s) {
        let saves = (host_s - device_s) * scale;
        findings.push(Finding {
            kind: "host overhead".into(),
            about: "host".into(),
            text: format!(
                "{:.0}% of each nrt_execute call is spent outside the device run (checks, copies, waiting for the core)",
                100.0 * (host_s - device_s) / host_s
            ),
            evidence: format!("{} per call against {} on the device, over {n} traced executions", duration(host_s / n as f64), duration(device_s / n as f64)),
            saves_s: saves,
            saves_percent: share(saves),
            suggestion: Some("put more work in each execution (a larger batch), so that the fixed cost of a call is paid less often".into()),
        });
    }
    if let Some(c) = i.collectives.filter(|c| c.time_s > 0.0) {
        let within = (collective_s, 100.0 * collective_s / device_s);
        findings.push(waiting_finding(c, within, i.long_waits, (n, scale), share(collective_s * scale)));
    }
    // What bringing the busiest resource to its peak would save: no more can be saved by
    // making one of the instructions that run on it faster.
    let mut resource_saves = None;
    if pipeline_s > 0.0 {
        let at_peak = if pipeline_resource.starts_with("DMA ") {
            i.dma
                .iter()
                .find(|q| format!("DMA {}", q.queue) == pipeline_resource)
                .zip(i.dma_peak)
                .map(|(q, bw)| q.bytes as f64 / bw)
        } else {
            i.engines
                .iter()
                .find(|e| e.engine == pipeline_resource)
                .and_then(|e| Some(e.flops as f64 / peak_of(&e.engine)?))
        };
        let saves = (pipeline_s - at_peak.unwrap_or(0.0)).max(0.0) * scale;
        resource_saves = Some(saves);
        let top = i.hlos.iter().find(|h| i.hlo_engine.get(&h.hlo).is_some_and(|(e, _)| *e == pipeline_resource));
        let of_peak = i.engines.iter().find(|e| e.engine == pipeline_resource).and_then(|e| e.percent_of_peak);
        let mut evidence = format!(
            "{} active of {} on the device over {n} traced executions",
            duration(pipeline_s),
            duration(device_s)
        );
        if let Some(p) = of_peak {
            evidence.push_str(&format!(", at {p:.1}% of its defined peak"));
        }
        if let Some(top) = top {
            evidence.push_str(&format!("; `{}` takes {}", top.hlo, duration(top.time_s)));
        }
        findings.push(Finding {
            kind: "busy resource".into(),
            about: pipeline_resource.clone(),
            text: format!(
                "the executions are {pipeline_resource}-bound: it is busy {:.0}% of the device time",
                100.0 * pipeline_s / device_s
            ),
            evidence,
            saves_s: saves,
            saves_percent: share(saves),
            suggestion: suggestion_for(&pipeline_resource, top.map(|t| t.hlo.as_str()), &i.advice),
        });
    }
    // The instructions that take the time and are far below their roofline; those of
    // the same bound, engine and remedy as one finding that lists them.
    let mut groups: Vec<RooflineGroup<'_>> = Vec::new();
    for h in i.hlos.iter().take(super::TOP_HLO) {
        let (Some(r), Some(bound)) = (h.roofline_percent, h.bound.as_deref()) else { continue };
        if h.percent < HLO_FINDING_MIN_PERCENT || r >= HLO_FINDING_BELOW_ROOFLINE {
            continue;
        }
        let saves = h.time_s * (1.0 - (r / 100.0).min(1.0)) * scale;
        let suggestion = if bound == "memory" {
            Some("it moves more bytes than it computes on: fuse it with the instructions around it, or make its operands smaller (bf16)".into())
        } else {
            suggestion_for(&h.engine, None, &i.advice)
        };
        match groups.iter_mut().find(|g| g.0 == bound && g.1 == h.engine && g.2 == suggestion) {
            Some(group) => group.3.push((h, r, saves)),
            None => groups.push((bound, &h.engine, suggestion, vec![(h, r, saves)])),
        }
    }
    // The remedy the busy resource's finding gives, which is not said twice.
    let resource_remedy = findings
        .iter()
        .any(|f| f.kind == "busy resource")
        .then(|| suggestion_for(&pipeline_resource, None, &i.advice))
        .flatten();
    for (bound, engine, suggestion, members) in groups {
        let mut saves: f64 = members.iter().map(|m| m.2).sum();
        if engine == pipeline_resource
            && let Some(most) = resource_saves
        {
            // Ranked after its resource's finding when they save the same.
            saves = saves.min(most);
        }
        let evidence: Vec<String> = members.iter().map(|(h, _, _)| roofline_evidence(h)).collect();
        let names: Vec<String> = members.iter().map(|(h, _, _)| format!("`{}`", h.hlo)).collect();
        let text = match members.as_slice() {
            [(h, r, _)] => format!(
                "`{}` takes {:.0}% of the device time at {r:.0}% of its roofline: it is {bound}-bound on {engine}",
                h.hlo, h.percent
            ),
            _ => {
                let share: f64 = members.iter().map(|m| m.0.percent).sum();
                let low = members.iter().map(|m| m.1).fold(f64::INFINITY, f64::min);
                let high = members.iter().map(|m| m.1).fold(0.0, f64::max);
                let range = if format!("{low:.0}") == format!("{high:.0}") {
                    format!("{high:.0}%")
                } else {
                    format!("{low:.0}–{high:.0}%")
                };
                format!(
                    "{} take {share:.0}% of the device time at {range} of their rooflines: they are {bound}-bound on {engine}",
                    list(&names)
                )
            }
        };
        let repeated = engine == pipeline_resource && resource_remedy.is_some() && resource_remedy == suggestion;
        // One instruction is named; a group by what it shares, which stays the same when
        // its members change between two profiles.
        let about = match names.as_slice() {
            [one] => one.clone(),
            _ => format!("{bound}-bound on {engine}"),
        };
        findings.push(Finding {
            kind: "roofline".into(),
            about,
            text,
            evidence: evidence.join("; "),
            saves_s: saves,
            saves_percent: share(saves),
            suggestion: if repeated { Some(format!("see the {engine} finding")) } else { suggestion },
        });
    }
    // The time no resource is busy, less the collectives' (their own finding's).
    let unoverlapped = device_s - pipeline_s - collective_s;
    if unoverlapped > 0.0 {
        let saves = unoverlapped * scale;
        findings.push(Finding {
            kind: "engine overlap".into(),
            about: "engine overlap".into(),
            text: format!(
                "no engine or DMA queue is busy {:.0}% of the device time{}: the engines wait on each other and on DMA",
                100.0 * unoverlapped / device_s,
                if collective_s > 0.0 { " outside collectives" } else { "" }
            ),
            evidence: format!(
                "{} of {} on the device with the busiest resource ({pipeline_resource}) idle{}",
                duration(unoverlapped),
                duration(device_s),
                if collective_s > 0.0 {
                    format!(", besides {} inside collectives", duration(collective_s))
                } else {
                    String::new()
                }
            ),
            saves_s: saves,
            saves_percent: share(saves),
            suggestion: None,
        });
    }
    findings.retain(|f| f.saves_percent >= MIN_FINDING_PERCENT);
    // A stable sort: findings that save the same keep the order they were made in (a
    // resource before the instructions that run on it).
    findings.sort_by(|a, b| b.saves_s.total_cmp(&a.saves_s));
    let bounds = Bounds {
        executions: n as u64,
        device_s,
        host_s,
        pipeline_s,
        pipeline_resource,
        compute_s: compute.as_ref().map(|c| c.1),
        compute_engine: compute.map(|c| c.0),
        memory_s,
        dma_peak_bytes_per_s: i.dma_peak,
        gaps,
        recorded_s,
        idle_s,
        recorded_executions,
    };
    (Some(bounds), findings)
}

/// Time inside collectives is waiting, not work: the finding says so and points to where
/// the rank waited for is named, instead of a roofline remedy.
/// `within` is the collectives' time as the device time holds it (at most what no
/// engine or queue was busy), and its share of the device time.
fn waiting_finding(
    c: &InCollectives,
    (seconds, share): (f64, f64),
    long_waits: &[LongWait],
    (n, scale): (usize, f64),
    percent: f64,
) -> Finding {
    let names: Vec<String> = c.hlos.iter().take(3).map(|h| format!("`{h}`")).collect();
    let more = c.hlos.len().saturating_sub(names.len());
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    let mut evidence =
        format!("{} in {} collective instructions over {n} traced executions", duration(seconds), c.instructions);
    for w in long_waits {
        evidence.push_str(&format!(
            "; waited past the runtime's warning for rank {} in {} collective{}",
            w.peer,
            w.count,
            if w.count == 1 { "" } else { "s" }
        ));
    }
    Finding {
        kind: "collective wait".into(),
        about: "collectives".into(),
        text: format!(
            "{:.0}% of the device time is inside collectives ({}{more}): there the rank waits for the other ranks of \
             its group and passes data to them, which is no engine's work",
            share,
            names.join(", ")
        ),
        evidence,
        saves_s: seconds * scale,
        saves_percent: percent,
        suggestion: Some(
            "find the rank the others wait for: `neuron-profile view -d DIR --output-format summary-text` over the \
             ranks' profiles, or the Ranks view of neuron-top or neuron-monitor during the job, names the straggler \
             (and what it did before it arrived) or the rank that never arrived"
                .into(),
        ),
    }
}

/// Instructions far below their roofline with the same bound, engine and remedy, each
/// with its percent of the roofline and what it could save.
type RooflineGroup<'a> = (&'a str, &'a str, Option<String>, Vec<(&'a HloSummary, f64, f64)>);

/// The figures behind one instruction's roofline finding.
fn roofline_evidence(h: &HloSummary) -> String {
    let rates = match (h.achieved_flops_per_s, h.achieved_bytes_per_s) {
        (Some(f), Some(b)) => format!("{}FLOP/s and {}B/s", crate::stats::si(f), crate::stats::si(b)),
        (None, Some(b)) => format!("{}B/s", crate::stats::si(b)),
        (Some(f), None) => format!("{}FLOP/s", crate::stats::si(f)),
        (None, None) => String::new(),
    };
    let intensity = h.intensity.map_or(String::new(), |x| format!(", {x:.2} FLOP per byte"));
    format!(
        "`{}`: {}FLOP and {}B in {} over {} instructions{intensity}: {rates}",
        h.hlo,
        crate::stats::si(h.flops as f64),
        crate::stats::si(h.bytes as f64),
        duration(h.time_s),
        h.instructions
    )
}

/// `a`, `a and b`, `a, b and c`.
fn list(names: &[String]) -> String {
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.concat(),
    }
}

/// Where one HLO instruction sits on the roofline.
#[derive(Debug, Default)]
pub(super) struct Roofline {
    pub intensity: Option<f64>,
    pub achieved_flops_per_s: Option<f64>,
    pub achieved_bytes_per_s: Option<f64>,
    pub bound: Option<&'static str>,
    pub percent: Option<f64>,
}

/// The roofline of work of `flops` and `bytes` that took `seconds`, under an engine's
/// compute ceiling and the memory ceiling: the lower ceiling at its intensity is what
/// bounds it, and the achieved rate is compared with that ceiling (FLOP/s when it
/// computes, bytes/s when it only moves data).
pub(super) fn roofline(
    flops: u64,
    bytes: u64,
    seconds: f64,
    engine_peak: Option<f64>,
    memory_peak: Option<f64>,
) -> Roofline {
    if seconds <= 0.0 {
        return Roofline::default();
    }
    let intensity = (bytes > 0).then(|| flops as f64 / bytes as f64);
    let achieved_flops = (flops > 0).then(|| flops as f64 / seconds);
    let achieved_bytes = (bytes > 0).then(|| bytes as f64 / seconds);
    let (bound, percent) = match (intensity, engine_peak, memory_peak) {
        (Some(i), Some(compute), Some(memory)) if flops > 0 => {
            let ceiling = compute.min(i * memory);
            let bound = if compute <= i * memory { "compute" } else { "memory" };
            (Some(bound), Some(100.0 * flops as f64 / seconds / ceiling))
        }
        (_, _, Some(memory)) if bytes > 0 && flops == 0 => {
            (Some("memory"), Some(100.0 * bytes as f64 / seconds / memory))
        }
        (None, Some(compute), _) if flops > 0 => (Some("compute"), Some(100.0 * flops as f64 / seconds / compute)),
        _ => (None, None),
    };
    Roofline { intensity, achieved_flops_per_s: achieved_flops, achieved_bytes_per_s: achieved_bytes, bound, percent }
}

/// What to do about a busy resource, where something concrete is known.
fn suggestion_for(resource: &str, top: Option<&str>, advice: &super::advice::Advice) -> Option<String> {
    let top = top.map_or(String::new(), |t| format!(" (`{t}` the most)"));
    match resource {
        "DMA input" => Some(format!(
            "the inputs are copied to the device at every execution{top}: allocate the input tensors on the device once and write only what changes, or keep weights as constants of the model"
        )),
        "DMA output" => Some(
            "the outputs are copied back at every execution: read only the outputs you need, or return smaller ones"
                .into(),
        ),
        "ACT" => Some(format!(
            "transcendental functions (exp, tanh, logistic, …) take the time{top}; ACT runs them element by element: compute them on fewer elements (before a broadcast) or use a cheaper form"
        )),
        "DVE" => Some(format!(
            "element-wise arithmetic takes the time{top}: check that chains of f32 element-wise instructions run fused (NEURON_VIRT_FUSION is on by default) and avoid broadcasts materialised in between"
        )),
        "PE" => Some(advice.products(&top)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::advice::{Advice, FrontEnd};

    const ADVICE: Advice = Advice { front_end: FrontEnd::Cli, bf16_in_effect: false, bf16_faster: None };

    fn hlo(name: &str, percent: f64, roofline: f64) -> HloSummary {
        HloSummary {
            hlo: name.into(),
            instructions: 1,
            time_s: percent * 1e-5,
            median_s: Some(percent * 1e-5),
            percent,
            flops: 1_000_000,
            bytes: 1_000,
            engine: "PE".into(),
            intensity: Some(1_000.0),
            achieved_flops_per_s: Some(1e9),
            achieved_bytes_per_s: Some(1e6),
            bound: Some("compute".into()),
            roofline_percent: Some(roofline),
        }
    }

    /// PE busy 90% of a traced execution of 1 ms, with `hlos`.
    fn pe_row(instructions: u64) -> EngineSummary {
        EngineSummary {
            engine: "PE".into(),
            active_s: 0.9e-3,
            percent: 90.0,
            instructions,
            flops: 4_000_000,
            percent_of_peak: Some(1.0),
        }
    }

    /// The findings of one traced execution of 1 ms (as long as its host call) in which
    /// `pe` ran `hlos`, against a PE peak of 1 TFLOP/s.
    fn findings_of(pe: EngineSummary, hlos: &[HloSummary], advice: Advice) -> Vec<Finding> {
        let hlo_engine: HashMap<String, (String, u64)> =
            hlos.iter().map(|h| (h.hlo.clone(), ("PE".to_string(), (h.time_s * 1e9) as u64))).collect();
        let windows = HashMap::from([((0, Some(1)), (0, 1_000_000))]);
        let runs = HashMap::from([((0, 1), (0, 1_000_000))]);
        let host_runs = HashMap::from([((0, 1), 1_000_000)]);
        analyse(&Inputs {
            engines: &[pe],
            dma: &[],
            hlos,
            hlo_engine: &hlo_engine,
            collectives: None,
            long_waits: &[],
            windows: &windows,
            runs: &runs,
            host_runs: &host_runs,
            peaks: super::super::DefinedPeaks { pe: Some(1e12), vector: None },
            dma_peak: None,
            asynchronous: false,
            advice,
        })
        .1
    }

    fn pe_bound(hlos: &[HloSummary], advice: Advice) -> Vec<Finding> {
        findings_of(pe_row(hlos.len() as u64), hlos, advice)
    }

    #[test]
    fn instructions_with_the_same_remedy_make_one_finding_that_lists_them() {
        let hlos =
            [hlo("dot.11", 30.0, 9.0), hlo("dot.6", 25.0, 12.0), hlo("dot.7", 20.0, 20.0), hlo("dot.8", 15.0, 23.0)];
        let findings = pe_bound(&hlos, ADVICE);
        let roofline: Vec<&Finding> = findings.iter().filter(|f| f.kind == "roofline").collect();
        assert_eq!(roofline.len(), 1, "{findings:#?}");
        let folded = roofline[0];
        assert!(
            folded.text.starts_with("`dot.11`, `dot.6`, `dot.7` and `dot.8` take 90% of the device time at 9–23%"),
            "{}",
            folded.text
        );
        assert_eq!(folded.suggestion.as_deref(), Some("see the PE finding"), "PE's finding gives the remedy");
        for name in ["dot.11", "dot.6", "dot.7", "dot.8"] {
            assert!(folded.evidence.contains(&format!("`{name}`: ")), "{}", folded.evidence);
        }
        assert!(findings.iter().all(|f| f.saves_percent <= 100.0));
    }

    #[test]
    fn product_advice_holds_for_what_is_in_effect_and_what_the_host_measured() {
        let hlos = [hlo("dot.1", 90.0, 5.0)];
        let pe = |advice: Advice| {
            pe_bound(&hlos, advice)
                .into_iter()
                .find(|f| f.kind == "busy resource")
                .and_then(|f| f.suggestion)
                .expect("a PE remedy")
        };
        let in_effect = pe(Advice { bf16_in_effect: true, bf16_faster: Some(true), ..ADVICE });
        assert!(in_effect.contains("already as bf16 products") && !in_effect.contains("--auto-cast"), "{in_effect}");
        let slower = pe(Advice { bf16_faster: Some(false), ..ADVICE });
        assert!(slower.contains("no faster than f32") && !slower.contains("(the default) to run"), "{slower}");
        let faster = pe(Advice { bf16_faster: Some(true), ..ADVICE });
        assert!(faster.contains("--auto-cast matmult"), "{faster}");
    }

    #[test]
    fn a_host_bound_finding_speaks_the_front_end_of_the_program() {
        let advice = |front_end| Advice { front_end, ..ADVICE };
        assert!(advice(FrontEnd::Python).host_bound(false).contains("Model.schedule(...)"));
        assert!(!advice(FrontEnd::Python).host_bound(false).contains("nrta_"));
        assert!(advice(FrontEnd::C).host_bound(false).contains("nrta_execute_schedule"));
        assert!(!advice(FrontEnd::C).host_bound(false).contains("--exec-mode"));
        assert!(advice(FrontEnd::Cli).host_bound(false).contains("--exec-mode async"));
        assert!(advice(FrontEnd::TorchXla).host_bound(false).contains("MpDeviceLoader"));
        assert!(!advice(FrontEnd::TorchXla).host_bound(true).contains("Model.schedule"));
        let meta = |kind: &str, command: &[&str]| crate::Metadata {
            capture_kind: kind.into(),
            command: command.iter().map(|c| c.to_string()).collect(),
            ..crate::Metadata::default()
        };
        assert_eq!(FrontEnd::of_metadata(&meta("python", &["python3", "q.py"])), FrontEnd::Python);
        assert_eq!(FrontEnd::of_metadata(&meta("capture", &["neuron-profile", "capture"])), FrontEnd::Cli);
        assert_eq!(FrontEnd::of_metadata(&meta("inspect", &["/usr/bin/python3.12", "train.py"])), FrontEnd::Python);
        assert_eq!(FrontEnd::of_metadata(&meta("continuous", &["./my_app"])), FrontEnd::C);
    }

    #[test]
    fn a_finding_saves_a_share_of_the_host_calls_when_they_take_longer_than_the_device_span() {
        // One 1 ms device run inside a 3 ms call: 2 ms of host overhead, two thirds of the
        // run (not twice the 1 ms the device recorded).
        let windows = HashMap::from([((0, Some(1)), (0, 1_000_000))]);
        let runs = HashMap::from([((0, 1), (0, 1_000_000))]);
        let host_runs = HashMap::from([((0, 1), 3_000_000)]);
        let (_, findings) = analyse(&Inputs {
            engines: &[],
            dma: &[],
            hlos: &[],
            hlo_engine: &HashMap::new(),
            collectives: None,
            long_waits: &[],
            windows: &windows,
            runs: &runs,
            host_runs: &host_runs,
            peaks: super::super::DefinedPeaks { pe: None, vector: None },
            dma_peak: None,
            asynchronous: false,
            advice: ADVICE,
        });
        let host = findings.iter().find(|f| f.kind == "host overhead").expect("a host overhead finding");
        assert!((host.saves_s - 2e-3).abs() < 1e-12, "{host:?}");
        assert!((host.saves_percent - 200.0 / 3.0).abs() < 1e-9, "{host:?}");
    }

    #[test]
    fn an_instruction_saves_no_more_than_its_busy_resource_and_ranks_after_it() {
        // One traced execution of 1 ms: PE busy all of it at 0.1% of its peak, all of it
        // `d`, whose own time reads a little longer (it is measured on its own spans).
        let pe =
            EngineSummary { active_s: 1e-3, percent: 100.0, flops: 1_000_000, percent_of_peak: Some(0.1), ..pe_row(1) };
        let hlos = [HloSummary { time_s: 1.2e-3, ..hlo("d", 100.0, 0.1) }];
        let findings = findings_of(pe, &hlos, ADVICE);
        let ranked: Vec<(&str, &str, f64)> =
            findings.iter().map(|f| (f.kind.as_str(), f.about.as_str(), f.saves_s)).collect();
        assert_eq!(ranked[..2], [("busy resource", "PE", 0.999e-3), ("roofline", "`d`", 0.999e-3)], "{ranked:?}");
    }

    #[test]
    fn the_lower_ceiling_at_an_instructions_intensity_bounds_it() {
        // 100 GFLOP/s of compute, 10 GB/s of memory: the ridge is at 10 FLOP per byte.
        let (compute, memory) = (Some(100e9), Some(10e9));
        let dense = roofline(1_000_000_000, 10_000_000, 0.02, compute, memory);
        assert_eq!((dense.bound, dense.intensity), (Some("compute"), Some(100.0)));
        assert!((dense.percent.expect("percent") - 50.0).abs() < 1e-9, "50 GFLOP/s of 100: {dense:?}");
        let sparse = roofline(1_000_000, 4_000_000, 0.001, compute, memory);
        assert_eq!(sparse.bound, Some("memory"));
        // 1 GFLOP/s against a ceiling of 0.25 FLOP/B × 10 GB/s = 2.5 GFLOP/s.
        assert!((sparse.percent.expect("percent") - 40.0).abs() < 1e-9, "{sparse:?}");
        let copy = roofline(0, 8_000_000, 0.001, compute, memory);
        assert_eq!((copy.bound, copy.percent.map(|p| p.round())), (Some("memory"), Some(80.0)));
        let unknown = roofline(1_000, 8, 0.001, None, None);
        assert_eq!((unknown.bound, unknown.percent), (None, None));
        assert_eq!(unknown.achieved_flops_per_s, Some(1e6));
    }

    #[test]
    fn time_inside_collectives_is_waiting_and_points_to_the_straggler_not_to_a_remedy() {
        // 1 ms on the device, 0.8 ms of it in an all-reduce of 4 bytes.
        let windows = HashMap::from([((0, Some(1)), (0, 1_000_000))]);
        let runs = HashMap::from([((0, 1), (0, 1_000_000))]);
        let host_runs = HashMap::from([((0, 1), 1_000_000)]);
        let dot = EngineSummary { active_s: 2e-4, percent: 20.0, ..pe_row(1) };
        let waited = InCollectives { instructions: 1, time_s: 8e-4, percent: 80.0, hlos: vec!["all-reduce.3".into()] };
        let late = [LongWait { peer: 3, count: 2, longest_s: 5.0 }];
        let (bounds, findings) = analyse(&Inputs {
            engines: &[dot],
            dma: &[],
            hlos: &[],
            hlo_engine: &HashMap::new(),
            collectives: Some(&waited),
            long_waits: &late,
            windows: &windows,
            runs: &runs,
            host_runs: &host_runs,
            peaks: super::super::DefinedPeaks { pe: Some(1e12), vector: None },
            dma_peak: None,
            asynchronous: false,
            advice: ADVICE,
        });
        let first = &findings[0];
        assert_eq!(first.kind, "collective wait", "{findings:#?}");
        assert!(
            first.text.starts_with("80% of the device time is inside collectives (`all-reduce.3`)"),
            "{}",
            first.text
        );
        assert!(first.evidence.contains("for rank 3 in 2 collectives"), "{}", first.evidence);
        let advice = first.suggestion.as_deref().unwrap_or_default();
        assert!(advice.contains("straggler") && !advice.contains("bf16") && !advice.contains("fuse"), "{advice}");
        let gaps = bounds.expect("bounds").gaps;
        let inside = gaps.iter().find(|g| g.name.starts_with("inside collectives")).expect("a gap for the collectives");
        assert!((inside.seconds - 8e-4).abs() < 1e-12, "{gaps:?}");
        let idle = gaps.iter().find(|g| g.name.starts_with("engines waiting")).expect("the pipeline gap");
        assert!(idle.seconds.abs() < 1e-12, "the collectives' time is not counted twice: {gaps:?}");
    }
}
