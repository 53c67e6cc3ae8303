//! `neuron-monitor`'s Prometheus exposition: the series the Neuron tool's companion
//! exporter publishes, with its names, labels and arithmetic, so that existing
//! dashboards work unchanged, and this project's extensions (prefixed `neuron_`).
//!
//! Levels (utilisation, memory, CPU, latency percentiles) come from the JSON report,
//! exactly as the companion exporter reads them. Counters count from when the monitor
//! began following a process (from its start when it started after the monitor), out
//! of the runtime's own cumulative counters, so that no period is counted twice or
//! lost. Processes that share a tag share their series: counts, memory and CPU add up;
//! a latency percentile is the highest of theirs.

use std::collections::{BTreeMap, HashMap};

use neuron_datastore::histogram::bucket_bounds;
use neuron_datastore::{Delta, Snapshot};
use neuron_datastore::{ErrorClass, ExecOutcome};
use serde_json::Value;

use crate::collectives::{Observations, Tally};

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds, in seconds, of `neuron_execution_latency_seconds`'s buckets.
pub const LATENCY_BUCKETS: [f64; 19] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
];

/// The device-memory categories of `neuroncore_memory_usage_<category>`.
const MEMORY_CATEGORIES: [&str; 5] =
    ["constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors"];

/// ECC event types of `hardware_ecc_events_total`, in the report's device order.
const ECC_EVENTS: [&str; 4] =
    ["mem_ecc_corrected", "mem_ecc_uncorrected", "sram_ecc_corrected", "sram_ecc_uncorrected"];

/// A runtime process in the report, for its counters: the runtime's cumulative
/// counters when the monitor began following it (`since`) and at this report (`now`).
#[derive(Debug, Clone, Copy)]
pub struct RuntimeCounters<'a> {
    pub pid: u32,
    pub since: &'a Snapshot,
    pub now: &'a Snapshot,
    /// The loaded models now: their counters run from their load.
    pub models: &'a [neuron_datastore::ModelInfo],
}

/// The exposition of one report. `ecc_total` is each device's ECC events since the
/// monitor started (mem corrected, mem uncorrected, sram corrected, sram uncorrected);
/// `collectives`, the communicators' counts since then.
pub fn exposition(
    report: &Value,
    runtimes: &[RuntimeCounters<'_>],
    ecc_total: &[[u64; 4]],
    collectives: &Tally,
) -> String {
    // Every series carries the instance's labels.
    let mut out = Families::new(instance_labels(&report["instance_info"]));
    let info = Labels::default();
    out.add("instance_info", "EC2 instance information", Kind::Gauge, info.clone(), 1.0);
    let hardware = &report["neuron_hardware_info"];
    let mut labels = info.clone();
    for field in [
        "neuron_device_count",
        "neuroncore_per_device_count",
        "neuron_device_type",
        "neuroncore_version",
        "neuron_device_memory_size",
        "logical_neuroncore_config",
    ] {
        labels = labels.with(field, text(&hardware[field]));
    }
    out.add("neuron_hardware_info", "Neuron hardware information", Kind::Gauge, labels, 1.0);
    out.add(
        "neuron_monitor_build_info",
        "neuron-monitor's version (constant 1)",
        Kind::Gauge,
        info.clone().with("version", env!("CARGO_PKG_VERSION").to_string()),
        1.0,
    );

    for runtime in report["neuron_runtime_data"].as_array().into_iter().flatten() {
        let tag = text(&runtime["neuron_runtime_tag"]);
        let labels = info.clone().with("runtime_tag", tag);
        let groups = &runtime["report"];
        runtime_levels(&mut out, groups, &labels);
        let pid = runtime["pid"].as_u64();
        if let Some(counters) = runtimes.iter().find(|r| Some(u64::from(r.pid)) == pid) {
            runtime_counters(&mut out, groups, &labels, counters);
        }
    }
    system_levels(&mut out, &report["system_data"], &info);
    if report["system_data"]["neuron_hw_counters"].is_object() {
        for (device, counts) in ecc_total.iter().enumerate() {
            for (event, &n) in ECC_EVENTS.iter().zip(counts) {
                let labels =
                    info.clone().with("event_type", event.to_string()).with("neuron_device_index", device.to_string());
                out.add("hardware_ecc_events_total", "Hardware ECC events", Kind::Counter, labels, n as f64);
            }
        }
    }
    if report["system_data"]["collectives"].is_object() {
        collective_series(&mut out, collectives, &info);
    }
    out.encode()
}

/// The communicators' series: per rank its wait and arrivals last, per communicator
/// its skew, and the straggler and hang the group view names.
fn collective_series(out: &mut Families, tally: &Tally, info: &Labels) {
    let histogram = |o: &Observations| latency_histogram(&o.buckets, None);
    for (&id, comm) in &tally.communicators {
        let labels = info.clone().with("communicator", comm.name.clone()).with("communicator_id", id.to_string());
        if comm.skew.count() > 0 {
            out.add_histogram(
                "neuron_collective_skew_seconds",
                "Last arrival minus first in each complete collective the monitor saw",
                labels.clone(),
                histogram(&comm.skew),
            );
        }
        for (&rank, waits) in &comm.waits {
            let labels = labels.clone().with("rank", rank.to_string());
            out.add_histogram(
                "neuron_collective_wait_seconds",
                "A rank's wait for the last of its group in each complete collective the monitor saw",
                labels.clone(),
                histogram(waits),
            );
            out.add(
                "neuron_collective_arrived_last_total",
                "Complete collectives the rank arrived last in, beyond the clocks' uncertainty",
                Kind::Counter,
                labels,
                comm.arrived_last.get(&rank).copied().unwrap_or(0) as f64,
            );
        }
    }
    for view in &tally.views {
        let labels = info.clone().with("communicator", view.name.clone()).with("communicator_id", view.id.to_string());
        for member in &view.members {
            if let Some(done) = member.completed {
                out.add_max(
                    "neuron_collective_last_completed_sequence",
                    "The sequence (unit) of the last collective the rank completed",
                    labels.clone().with("rank", member.rank.to_string()),
                    f64::from(done.sequence),
                );
            }
        }
        if let Some(straggler) = &view.straggler {
            out.add_max(
                "neuron_collective_straggler",
                "1 for the rank named the communicator's straggler (arrived last in most recent collectives)",
                labels.clone().with("rank", straggler.rank.to_string()),
                1.0,
            );
        }
        if let Some(hang) = &view.hang {
            let class = serde_json::to_value(hang.class).ok().and_then(|v| v.as_str().map(str::to_owned));
            out.add_max(
                "neuron_collective_hang_seconds",
                "How long ranks of the communicator have waited in a collective that does not complete",
                labels.clone().with("class", class.unwrap_or_default()).with("sequence", hang.position.to_string()),
                hang.waited_ns as f64 / 1e9,
            );
        }
    }
}

/// The instance labels every series carries.
fn instance_labels(info: &Value) -> Vec<(&'static str, String)> {
    [
        ("instance_name", "instance_name"),
        ("instance_id", "instance_id"),
        ("instance_type", "instance_type"),
        ("availability_zone", "instance_availability_zone"),
        ("region", "instance_region"),
        ("subnet_id", "subnet_id"),
    ]
    .into_iter()
    .map(|(label, field)| (label, text(&info[field])))
    .collect()
}

/// A JSON value as a label value: strings as they are, anything else as JSON.
fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Whether a report group is present and without error (the companion exporter skips
/// a group with an error).
fn group<'a>(groups: &'a Value, name: &str) -> Option<&'a Value> {
    let g = groups.get(name)?;
    (g.is_object() && g["error"].as_str().is_none_or(str::is_empty)).then_some(g)
}

fn runtime_levels(out: &mut Families, groups: &Value, labels: &Labels) {
    if let Some(g) = group(groups, "neuroncore_counters") {
        for (core, counters) in g["neuroncores_in_use"].as_object().into_iter().flatten() {
            let labels = labels.clone().with("neuroncore", core.clone());
            if let Some(percent) = counters["neuroncore_utilization"].as_f64() {
                out.add(
                    "neuroncore_utilization_ratio",
                    "NeuronCore utilization ratio",
                    Kind::Gauge,
                    labels.clone(),
                    percent / 100.0,
                );
            }
            if let Some(flops) = counters["flops"].as_f64() {
                out.add(
                    "neuron_neuroncore_flops",
                    "Floating-point operations per second the NeuronCore executed over the last period",
                    Kind::Gauge,
                    labels,
                    flops,
                );
            }
        }
    }
    if let Some(g) = group(groups, "neuron_runtime_vcpu_usage") {
        for usage in ["user", "system"] {
            if let Some(percent) = g["vcpu_usage"][usage].as_f64() {
                let labels = labels.clone().with("usage_type", usage.to_string());
                out.add(
                    "neuron_runtime_vcpu_usage_ratio",
                    "Runtime vCPU utilization ratio",
                    Kind::Gauge,
                    labels,
                    percent / 100.0,
                );
            }
        }
    }
    if let Some(g) = group(groups, "memory_used") {
        let used = &g["neuron_runtime_used_bytes"];
        for location in ["host", "neuron_device"] {
            if let Some(bytes) = used[location].as_f64() {
                let labels = labels.clone().with("memory_location", location.to_string());
                out.add("neuron_runtime_memory_used_bytes", "Runtime memory used bytes", Kind::Gauge, labels, bytes);
            }
        }
        for (core, categories) in used["usage_breakdown"]["neuroncore_memory_usage"].as_object().into_iter().flatten() {
            for category in MEMORY_CATEGORIES {
                if let Some(bytes) = categories[category].as_f64() {
                    let labels = labels.clone().with("neuroncore", core.clone());
                    out.add_named(
                        format!("neuroncore_memory_usage_{category}"),
                        "NeuronCore memory usage by category, in bytes",
                        Kind::Gauge,
                        labels,
                        bytes,
                    );
                }
            }
        }
    }
    if let Some(g) = group(groups, "execution_stats")
        && let Some(total) = g["latency_stats"]["total_latency"].as_object()
    {
        for (percentile, seconds) in total {
            if let Some(seconds) = seconds.as_f64() {
                let labels = labels.clone().with("percentile", percentile.clone());
                out.add_max("execution_latency_seconds", "Execution latency in seconds", labels, seconds);
            }
        }
    }
}

fn runtime_counters(out: &mut Families, groups: &Value, labels: &Labels, counters: &RuntimeCounters<'_>) {
    let (since, now) = (counters.since, counters.now);
    if group(groups, "execution_stats").is_some() {
        let delta = Delta::between(since, now);
        for &class in ErrorClass::ALL {
            let n: u64 = delta.cores.iter().map(|c| c.errors.get(class)).sum();
            let labels = labels.clone().with("error_type", class.name().to_string());
            out.add("execution_errors_total", "Execution errors", Kind::Counter, labels, n as f64);
        }
        for &outcome in ExecOutcome::ALL {
            let n: u64 = delta.cores.iter().map(|c| c.executions.get(outcome)).sum();
            let labels = labels.clone().with("status_type", outcome.name().to_string());
            out.add("execution_status_total", "Execution outcomes", Kind::Counter, labels, n as f64);
        }
        for core in &now.cores {
            let before = since.core(core.core).map(|c| c.total_latency.as_slice());
            let labels = labels.clone().with("neuroncore", core.core.to_string());
            out.add_histogram(
                "neuron_execution_latency_seconds",
                "Execution latency (host call to return), from the runtime's own histogram (bucket edges within 3%)",
                labels,
                latency_histogram(&core.total_latency, before),
            );
        }
        // Per model, from its load: a model loaded again starts from zero, as counters
        // of a restarted process do.
        for model in counters.models {
            let labels = labels.clone().with("model", model.name.clone()).with("neuroncore", model.core.to_string());
            out.add(
                "neuron_model_executions_total",
                "Executions of a loaded model since its load",
                Kind::Counter,
                labels.clone(),
                model.executions as f64,
            );
            out.add_histogram(
                "neuron_model_execution_latency_seconds",
                "Execution latency of a loaded model (host call to return) since its load (bucket edges within 6%)",
                labels,
                histogram_of(&model.latency, None, neuron_datastore::histogram::model_bucket_bounds),
            );
        }
    }
    for device in [false, true] {
        let rings = |s: &Snapshot, f: fn(&neuron_datastore::RingStats) -> u64| -> u64 {
            s.rings.iter().filter(|r| r.device == device).map(f).sum()
        };
        let produced = rings(now, |r| r.produced).saturating_sub(rings(since, |r| r.produced));
        let dropped = rings(now, |r| r.dropped).saturating_sub(rings(since, |r| r.dropped));
        let labels = labels.clone().with("trace", if device { "device" } else { "system" }.to_string());
        out.add(
            "neuron_trace_events_total",
            "Trace events the runtime produced into its rings",
            Kind::Counter,
            labels.clone(),
            produced as f64,
        );
        out.add(
            "neuron_trace_events_dropped_total",
            "Trace events a full ring refused (lost to every reader)",
            Kind::Counter,
            labels,
            dropped as f64,
        );
    }
}

fn system_levels(out: &mut Families, system: &Value, labels: &Labels) {
    if let Some(g) = group(system, "vcpu_usage") {
        if let Some(cpus) = g["usage_data"].as_object() {
            out.add("system_vcpu_count", "System vCPU count", Kind::Gauge, labels.clone(), cpus.len() as f64);
        }
        let average = &g["average_usage"];
        for (usage, fields) in [("user", &["user", "nice"][..]), ("system", &["system", "io_wait", "irq", "soft_irq"])]
        {
            let percent: f64 = fields.iter().filter_map(|f| average[f].as_f64()).sum();
            let labels = labels.clone().with("usage_type", usage.to_string());
            out.add(
                "system_vcpu_usage_ratio",
                "System CPU utilization ratio",
                Kind::Gauge,
                labels,
                percent.min(100.0) / 100.0,
            );
        }
    }
    if let Some(g) = group(system, "memory_info") {
        for (name, field, help) in [
            ("system_memory_total_bytes", "memory_total_bytes", "System memory total bytes"),
            ("system_memory_used_bytes", "memory_used_bytes", "System memory used bytes"),
            ("system_swap_total_bytes", "swap_total_bytes", "System swap total bytes"),
            ("system_swap_used_bytes", "swap_used_bytes", "System swap used bytes"),
        ] {
            if let Some(bytes) = g[field].as_f64() {
                out.add(name, help, Kind::Gauge, labels.clone(), bytes);
            }
        }
    }
}

/// A cumulative latency histogram in `LATENCY_BUCKETS`, from the runtime's fine
/// buckets gained since `before`: each fine bucket (at most 3% wide) counts in the
/// first bound at or above its midpoint, and adds its midpoint to the sum.
pub fn latency_histogram(now: &[u64], before: Option<&[u64]>) -> Histogram {
    histogram_of(now, before, bucket_bounds)
}

/// [`latency_histogram`] of fine buckets whose bounds `bounds` gives.
fn histogram_of(now: &[u64], before: Option<&[u64]>, bounds: fn(usize) -> (u64, u64)) -> Histogram {
    let mut counts = [0u64; LATENCY_BUCKETS.len()];
    let (mut count, mut sum) = (0u64, 0.0f64);
    for (bucket, &n) in now.iter().enumerate() {
        let gained = n.saturating_sub(before.and_then(|b| b.get(bucket).copied()).unwrap_or(0));
        if gained == 0 {
            continue;
        }
        let (low, high) = bounds(bucket);
        let seconds = (low as f64 + (high - low) as f64 / 2.0) / 1e9;
        count += gained;
        sum += seconds * gained as f64;
        if let Some(first) = LATENCY_BUCKETS.iter().position(|&le| seconds <= le) {
            counts[first] += gained;
        }
    }
    let mut cumulative = 0;
    let buckets = counts
        .iter()
        .map(|&n| {
            cumulative += n;
            cumulative
        })
        .collect();
    Histogram { buckets, count, sum }
}

/// A histogram's cumulative counts per `LATENCY_BUCKETS` bound (the `+Inf` bucket is
/// `count`), with the number and sum of the observations.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

/// A series' labels, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Labels(Vec<(&'static str, String)>);

impl Labels {
    fn with(mut self, name: &'static str, value: String) -> Labels {
        self.0.push((name, value));
        self
    }
}

/// How two samples of the same series (processes sharing a tag) combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Combine {
    Sum,
    Max,
}

#[derive(Debug)]
enum Sample {
    Value(f64),
    Histogram(Histogram),
}

#[derive(Debug)]
struct Family {
    name: String,
    help: &'static str,
    kind: FamilyType,
    combine: Combine,
    samples: BTreeMap<Labels, Sample>,
}

/// The families of one exposition, in the order they were first added, and the labels
/// every series starts with.
#[derive(Debug, Default)]
struct Families {
    families: Vec<Family>,
    index: HashMap<String, usize>,
    common: Vec<(&'static str, String)>,
}

impl Families {
    fn new(common: Vec<(&'static str, String)>) -> Families {
        Families { common, ..Families::default() }
    }

    fn family(&mut self, name: String, help: &'static str, kind: FamilyType, combine: Combine) -> &mut Family {
        let at = match self.index.get(&name) {
            Some(&at) => at,
            None => {
                self.index.insert(name.clone(), self.families.len());
                self.families.push(Family { name, help, kind, combine, samples: BTreeMap::new() });
                self.families.len() - 1
            }
        };
        &mut self.families[at]
    }

    fn add(&mut self, name: &str, help: &'static str, kind: Kind, labels: Labels, value: f64) {
        self.add_named(name.to_string(), help, kind, labels, value);
    }

    fn add_named(&mut self, name: String, help: &'static str, kind: Kind, labels: Labels, value: f64) {
        let kind = match kind {
            Kind::Gauge => FamilyType::Gauge,
            Kind::Counter => FamilyType::Counter,
        };
        self.add_value(name, help, kind, Combine::Sum, labels, value);
    }

    fn add_max(&mut self, name: &str, help: &'static str, labels: Labels, value: f64) {
        self.add_value(name.to_string(), help, FamilyType::Gauge, Combine::Max, labels, value);
    }

    fn add_value(
        &mut self,
        name: String,
        help: &'static str,
        kind: FamilyType,
        combine: Combine,
        labels: Labels,
        value: f64,
    ) {
        let family = self.family(name, help, kind, combine);
        let combine = family.combine;
        family
            .samples
            .entry(labels)
            .and_modify(|s| {
                if let Sample::Value(v) = s {
                    *v = match combine {
                        Combine::Sum => *v + value,
                        Combine::Max => v.max(value),
                    };
                }
            })
            .or_insert(Sample::Value(value));
    }

    fn add_histogram(&mut self, name: &str, help: &'static str, labels: Labels, histogram: Histogram) {
        let family = self.family(name.to_string(), help, FamilyType::Histogram, Combine::Sum);
        family
            .samples
            .entry(labels)
            .and_modify(|s| {
                if let Sample::Histogram(h) = s {
                    h.buckets.iter_mut().zip(&histogram.buckets).for_each(|(a, b)| *a += b);
                    h.count += histogram.count;
                    h.sum += histogram.sum;
                }
            })
            .or_insert_with(|| Sample::Histogram(histogram.clone()));
    }

    /// The text format (version 0.0.4): each family's `# HELP` and `# TYPE`, then its
    /// samples, a histogram as its cumulative buckets, `+Inf`, `_sum` and `_count`,
    /// as the `prometheus` crate's encoder writes them (the tests hold the two to the
    /// same bytes), without the crate's intermediate messages: a job of many ranks has
    /// tens of thousands of samples at every report.
    fn encode(self) -> String {
        use std::fmt::Write;
        let mut common = String::new();
        for (name, value) in &self.common {
            push_label(&mut common, name, value);
        }
        let mut text = String::with_capacity(1 << 16);
        let mut labels = String::new();
        let bounds: Vec<String> = LATENCY_BUCKETS.iter().map(f64::to_string).collect();
        for f in self.families.into_iter().filter(|f| !f.samples.is_empty()) {
            let name = &f.name;
            if !f.help.is_empty() {
                let _ = writeln!(text, "# HELP {name} {}", escape(f.help, false));
            }
            let _ = writeln!(text, "# TYPE {name} {}", f.kind.name());
            for (series, sample) in f.samples {
                labels.clone_from(&common);
                for (label, value) in &series.0 {
                    push_label(&mut labels, label, value);
                }
                match sample {
                    Sample::Value(value) => write_sample(&mut text, (name, ""), &labels, None, value),
                    Sample::Histogram(h) => {
                        for (le, &n) in bounds.iter().zip(&h.buckets) {
                            write_sample(&mut text, (name, "_bucket"), &labels, Some(le), n as f64);
                        }
                        write_sample(&mut text, (name, "_bucket"), &labels, Some("+Inf"), h.count as f64);
                        write_sample(&mut text, (name, "_sum"), &labels, None, h.sum);
                        write_sample(&mut text, (name, "_count"), &labels, None, h.count as f64);
                    }
                }
            }
        }
        text
    }
}

/// A family's type, as its `# TYPE` line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FamilyType {
    Counter,
    Gauge,
    Histogram,
}

impl FamilyType {
    fn name(self) -> &'static str {
        match self {
            FamilyType::Counter => "counter",
            FamilyType::Gauge => "gauge",
            FamilyType::Histogram => "histogram",
        }
    }
}

/// Appends `name="value"` to a series' rendered labels (comma-separated).
fn push_label(labels: &mut String, name: &str, value: &str) {
    if !labels.is_empty() {
        labels.push(',');
    }
    labels.push_str(name);
    labels.push_str("=\"");
    labels.push_str(&escape(value, true));
    labels.push('"');
}

/// One sample line: `name{labels,le="0.5"} value`.
fn write_sample(text: &mut String, (name, suffix): (&str, &str), labels: &str, le: Option<&str>, value: f64) {
    text.push_str(name);
    text.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        text.push('{');
        text.push_str(labels);
        if let Some(le) = le {
            if !labels.is_empty() {
                text.push(',');
            }
            text.push_str("le=\"");
            text.push_str(le);
            text.push('"');
        }
        text.push('}');
    }
    text.push(' ');
    push_number(text, value);
    text.push('\n');
}

/// `value` as `f64`'s `Display` writes it; whole numbers (most samples: counts, bytes)
/// without the formatting machinery.
fn push_number(text: &mut String, value: f64) {
    if value.fract() != 0.0 || value.abs() >= 1e15 || (value == 0.0 && value.is_sign_negative()) {
        use std::fmt::Write;
        let _ = write!(text, "{value}");
        return;
    }
    let (mut n, mut digits, mut at) = (value.abs() as u64, [0u8; 20], 20);
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if value < 0.0 {
        text.push('-');
    }
    text.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// `value` with backslashes and line feeds escaped, and double quotes too in a label
/// value.
fn escape(value: &str, quotes: bool) -> std::borrow::Cow<'_, str> {
    let special = |c: char| c == '\\' || c == '\n' || (quotes && c == '"');
    if !value.contains(special) {
        return value.into();
    }
    let mut escaped = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        if special(c) {
            escaped.extend(c.escape_default());
        } else {
            escaped.push(c);
        }
    }
    escaped.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_datastore::histogram::bucket_of;

    #[test]
    fn latency_histogram_counts_each_value_under_its_bound_and_only_what_was_gained() {
        let mut before = vec![0u64; 1920];
        let mut now = vec![0u64; 1920];
        // 3 executions at 80 µs, 2 at 3 ms, 1 at 40 s (past every bound), one earlier.
        now[bucket_of(80_000)] += 3;
        now[bucket_of(3_000_000)] += 2;
        now[bucket_of(40_000_000_000)] += 1;
        now[bucket_of(1_000_000)] += 1;
        before[bucket_of(1_000_000)] += 1;
        let h = latency_histogram(&now, Some(&before));
        assert_eq!(h.count, 6);
        let le = |bound: f64| h.buckets[LATENCY_BUCKETS.iter().position(|&b| b == bound).expect("bound")];
        assert_eq!(le(0.000_05), 0);
        assert_eq!(le(0.000_1), 3);
        assert_eq!(le(0.002_5), 3);
        assert_eq!(le(0.005), 5);
        assert_eq!(le(30.0), 5, "40 s is only in +Inf");
        let expected = 3.0 * 80e-6 + 2.0 * 3e-3 + 40.0;
        assert!((h.sum - expected).abs() / expected < 0.03, "{} vs {expected}", h.sum);
    }

    #[test]
    fn series_of_processes_sharing_a_tag_add_up_and_percentiles_take_the_highest() {
        let mut out = Families::default();
        let labels = Labels::default().with("runtime_tag", "a".into());
        out.add("execution_status_total", "h", Kind::Counter, labels.clone(), 2.0);
        out.add("execution_status_total", "h", Kind::Counter, labels.clone(), 3.0);
        out.add_max("execution_latency_seconds", "h", labels.clone(), 0.5);
        out.add_max("execution_latency_seconds", "h", labels, 0.25);
        let text = out.encode();
        assert!(text.contains("execution_status_total{runtime_tag=\"a\"} 5\n"), "{text}");
        assert!(text.contains("execution_latency_seconds{runtime_tag=\"a\"} 0.5\n"), "{text}");
        assert!(text.contains("# TYPE execution_status_total counter\n"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = Families::default();
        out.add("m", "h", Kind::Gauge, Labels::default().with("runtime_tag", "a\"b\\c\nd".into()), 1.0);
        assert!(out.encode().contains(r#"m{runtime_tag="a\"b\\c\nd"} 1"#));
    }
    /// What the `prometheus` crate's encoder writes of `families`: the bytes the
    /// exposition is held to.
    fn by_the_crate(families: Families) -> String {
        use prometheus::proto::{self, MetricType};
        let common = families.common;
        let encoded: Vec<proto::MetricFamily> = (families.families.into_iter())
            .filter(|f| !f.samples.is_empty())
            .map(|f| {
                let mut family = proto::MetricFamily::default();
                family.set_name(f.name);
                family.set_help(f.help.to_string());
                family.set_field_type(match f.kind {
                    FamilyType::Counter => MetricType::COUNTER,
                    FamilyType::Gauge => MetricType::GAUGE,
                    FamilyType::Histogram => MetricType::HISTOGRAM,
                });
                let metrics = (f.samples.into_iter())
                    .map(|(labels, sample)| {
                        let pairs = (common.iter().cloned().chain(labels.0))
                            .map(|(name, value)| {
                                let mut pair = proto::LabelPair::default();
                                pair.set_name(name.to_string());
                                pair.set_value(value);
                                pair
                            })
                            .collect();
                        let mut metric = proto::Metric::from_label(pairs);
                        match (sample, f.kind) {
                            (Sample::Value(v), FamilyType::Counter) => {
                                let mut counter = proto::Counter::default();
                                counter.set_value(v);
                                metric.set_counter(counter);
                            }
                            (Sample::Value(v), _) => {
                                let mut gauge = proto::Gauge::default();
                                gauge.set_value(v);
                                metric.set_gauge(gauge);
                            }
                            (Sample::Histogram(h), _) => {
                                let mut histogram = proto::Histogram::default();
                                histogram.set_sample_count(h.count);
                                histogram.set_sample_sum(h.sum);
                                let buckets = (LATENCY_BUCKETS.iter().zip(&h.buckets))
                                    .map(|(&le, &n)| {
                                        let mut bucket = proto::Bucket::default();
                                        bucket.set_upper_bound(le);
                                        bucket.set_cumulative_count(n);
                                        bucket
                                    })
                                    .collect();
                                histogram.set_bucket(buckets);
                                metric.set_histogram(histogram);
                            }
                        }
                        metric
                    })
                    .collect();
                family.set_metric(metrics);
                family
            })
            .collect();
        let mut text = String::new();
        prometheus::TextEncoder::new().encode_utf8(&encoded, &mut text).expect("encodes");
        text
    }

    #[test]
    fn the_exposition_is_byte_for_byte_what_the_prometheus_crate_writes() {
        let families = || {
            let common = vec![("instance_name", String::new()), ("instance_type", "trn1.32xlarge".into())];
            let mut out = Families::new(common);
            let labels = Labels::default().with("runtime_tag", "train \"a\"\\b\nc".into());
            out.add("execution_status_total", "Executions\\by status\nand tag", Kind::Counter, labels.clone(), 3.0);
            out.add("system_vcpu_count", "", Kind::Gauge, Labels::default(), 16.0);
            for (k, v) in
                [-3.0, 0.0, -0.0, 1e15, 123_456_789_012.0, 0.1, -2.5e-7, f64::NAN, f64::INFINITY].iter().enumerate()
            {
                out.add("numbers", "n", Kind::Gauge, Labels::default().with("k", k.to_string()), *v);
            }
            out.add_max("execution_latency_seconds", "p", labels.clone().with("percentile", "p99".into()), 1.25e-4);
            let mut now = vec![0u64; 1920];
            now[bucket_of(80_000)] += 3;
            now[bucket_of(40_000_000_000)] += 1;
            out.add_histogram("neuron_execution_latency_seconds", "h", labels, latency_histogram(&now, None));
            out.add("empty", "never sampled", Kind::Gauge, Labels::default(), 0.0);
            out.families.last_mut().expect("a family").samples.clear();
            out
        };
        let ours = families().encode();
        assert_eq!(ours, by_the_crate(families()));
        assert!(ours.contains("neuron_execution_latency_seconds_bucket{instance_name=\"\",instance_type=\"trn1.32xlarge\",runtime_tag=\"train \\\"a\\\"\\\\b\\nc\",le=\"0.0001\"} 3\n"), "{ours}");
        assert!(!ours.contains("empty"), "{ours}");
        // With no common labels, a series of no labels has no braces.
        let mut bare = Families::default();
        bare.add("up", "", Kind::Gauge, Labels::default(), 1.0);
        assert_eq!(bare.encode(), "# TYPE up gauge\nup 1\n");
    }
}
