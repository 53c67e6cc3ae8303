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

use neuron_datastore::histogram::bucket_bounds;
use neuron_datastore::{Delta, Snapshot};
use neuron_datastore::{ErrorClass, ExecOutcome};
use serde_json::Value;

use crate::collectives::{Observations, Tally};
use crate::exposition::{EXEMPLAR_LABEL_CHARS, Kind, Labels};
pub use crate::exposition::{Exemplar, Families, Histogram, LATENCY_BUCKETS};

/// The `Content-Type` of the text exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The `Content-Type` of the OpenMetrics exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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

/// The series of one report, for either format ([`Families::text`],
/// [`Families::openmetrics`]). `ecc_total` is each device's ECC events since the
/// monitor started (mem corrected, mem uncorrected, sram corrected, sram uncorrected);
/// `collectives`, the communicators' counts since then.
pub fn exposition(
    report: &Value,
    runtimes: &[RuntimeCounters<'_>],
    ecc_total: &[[u64; 4]],
    collectives: &Tally,
) -> Families {
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
    out
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
        let examples = Examples { pid: counters.pid, since, models: counters.models };
        for &class in ErrorClass::ALL {
            let n: u64 = delta.cores.iter().map(|c| c.errors.get(class)).sum();
            let labels = labels.clone().with("error_type", class.name().to_string());
            // The last execution of the class on any of the process's cores.
            let last = (now.cores.iter())
                .filter_map(|c| c.exemplars.error(class).map(|e| (c.core, e)))
                .filter(|(_, e)| examples.counted(e))
                .max_by_key(|(_, e)| e.monotonic_ns)
                .map(|(core, e)| examples.exemplar(core, e, 1.0));
            out.add_counter("execution_errors_total", "Execution errors", labels, n as f64, last);
        }
        for &outcome in ExecOutcome::ALL {
            let n: u64 = delta.cores.iter().map(|c| c.executions.get(outcome)).sum();
            let labels = labels.clone().with("status_type", outcome.name().to_string());
            out.add("execution_status_total", "Execution outcomes", Kind::Counter, labels, n as f64);
        }
        for core in &now.cores {
            let before = since.core(core.core).map(|c| c.total_latency.as_slice());
            let labels = labels.clone().with("neuroncore", core.core.to_string());
            let mut histogram = latency_histogram(&core.total_latency, before);
            histogram.exemplars = examples.latency(core);
            out.add_histogram(
                "neuron_execution_latency_seconds",
                "Execution latency (host call to return), from the runtime's own histogram (bucket edges within 3%)",
                labels,
                histogram,
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
    Histogram { buckets, count, sum, exemplars: Vec::new() }
}

/// The bucket of `LATENCY_BUCKETS` (its length: `+Inf`) a latency of `ns` counts in:
/// the first bound at or above the midpoint of its fine bucket, as
/// [`latency_histogram`] counts it.
fn latency_bucket(ns: u64) -> usize {
    let (low, high) = bucket_bounds(neuron_datastore::histogram::bucket_of(ns));
    let seconds = (low as f64 + (high - low) as f64 / 2.0) / 1e9;
    LATENCY_BUCKETS.iter().position(|&le| seconds <= le).unwrap_or(LATENCY_BUCKETS.len())
}

/// The bucket an execution of `ns` is an exemplar of: the one that counted it or, when
/// its exact latency passes that bucket's bound (its fine bucket's midpoint did not),
/// the next, so that an exemplar's value is never above its bucket's bound.
fn exemplar_bucket(ns: u64) -> usize {
    latency_bucket(ns).max(neuron_datastore::exemplar::latency_slot(ns))
}

/// The executions a process's datastore names as exemplars, turned into the exposition's.
struct Examples<'a> {
    pid: u32,
    /// The counters are counted from this snapshot: older executions are not examples
    /// of them.
    since: &'a Snapshot,
    models: &'a [neuron_datastore::ModelInfo],
}

impl Examples<'_> {
    fn counted(&self, e: &neuron_datastore::exemplar::Exemplar) -> bool {
        e.monotonic_ns >= self.since.taken_ns
    }

    /// The latency histogram's exemplars of `core`: for each bucket, the last execution
    /// counted in it.
    fn latency(&self, core: &neuron_datastore::CoreSnapshot) -> Vec<Option<Exemplar>> {
        let mut last: Vec<Option<&neuron_datastore::exemplar::Exemplar>> = vec![None; LATENCY_BUCKETS.len() + 1];
        for e in core.exemplars.latency.iter().flatten().filter(|e| self.counted(e)) {
            let slot = &mut last[exemplar_bucket(e.latency_ns)];
            if slot.is_none_or(|s| s.monotonic_ns < e.monotonic_ns) {
                *slot = Some(e);
            }
        }
        let exemplar =
            |e: &neuron_datastore::exemplar::Exemplar| self.exemplar(core.core, e, e.latency_ns as f64 / 1e9);
        last.into_iter().map(|e| e.map(exemplar)).collect()
    }

    /// The exemplar of execution `e` of `core`, of value `value`.
    fn exemplar(&self, core: u32, e: &neuron_datastore::exemplar::Exemplar, value: f64) -> Exemplar {
        let name = self.models.iter().find(|m| m.model_id == e.model_id).map_or("", |m| m.name.as_str());
        execution_exemplar(self.pid, core, e, name, value)
    }
}

/// The exemplar of execution `e` of process `pid` on `core`, of value `value`: labelled
/// with the execution, process, core and model, and `execution` (`PID:ID`, the one
/// label a Grafana link carries, naming the execution on its host); the model's name
/// (empty when unloaded) cut to keep every label within OpenMetrics' 128 characters.
fn execution_exemplar(
    pid: u32,
    core: u32,
    e: &neuron_datastore::exemplar::Exemplar,
    model: &str,
    value: f64,
) -> Exemplar {
    let mut labels = vec![
        ("exec_id", e.exec_id.to_string()),
        ("pid", pid.to_string()),
        ("neuroncore", core.to_string()),
        ("execution", format!("{pid}:{}", e.exec_id)),
    ];
    let used: usize = labels.iter().map(|(n, v)| n.chars().count() + v.chars().count()).sum();
    let room = EXEMPLAR_LABEL_CHARS.saturating_sub(used + "model".len());
    labels.push(("model", model.chars().take(room).collect()));
    Exemplar { labels, value, timestamp_s: e.realtime_ns as f64 / 1e9 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_datastore::histogram::bucket_of;

    #[test]
    fn latency_buckets_are_written_as_the_exporter_always_wrote_them() {
        let written: Vec<String> = LATENCY_BUCKETS.iter().map(f64::to_string).collect();
        let expected =
            "0.000025 0.00005 0.0001 0.00025 0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 5 10 30";
        assert_eq!(written.join(" "), expected);
    }

    #[test]
    fn an_exemplar_names_its_execution_within_openmetrics_128_characters() {
        let execution = neuron_datastore::exemplar::Exemplar {
            exec_id: u64::MAX,
            model_id: 3,
            status: 0,
            latency_ns: 1_500_000,
            realtime_ns: 1_700_000_000_500_000_000,
            monotonic_ns: 1,
        };
        for name in ["mlp", &"long model name ".repeat(20)] {
            let e = execution_exemplar(4_194_304, 1, &execution, name, 0.0015);
            let chars: usize = e.labels.iter().map(|(n, v)| n.chars().count() + v.chars().count()).sum();
            assert!(chars <= EXEMPLAR_LABEL_CHARS, "{e:?}");
            let label = |k: &str| e.labels.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
            assert_eq!(label("exec_id"), Some("18446744073709551615"));
            assert_eq!(label("pid"), Some("4194304"));
            assert_eq!(label("neuroncore"), Some("1"));
            assert_eq!(label("execution"), Some("4194304:18446744073709551615"));
            assert!(name.starts_with(label("model").expect("the model")), "{e:?}");
            assert_eq!(e.timestamp_s, 1_700_000_000.5);
        }
        assert_eq!(latency_bucket(1_500_000), 6, "1.5 ms counts under 2.5 ms");
        // 25.05 µs counts under 25 µs (its fine bucket's midpoint is 24.83 µs), but is an
        // exemplar of the next bucket, whose bound holds its value.
        assert_eq!((latency_bucket(25_050), exemplar_bucket(25_050)), (0, 1));
        assert_eq!(exemplar_bucket(24_900), 0);
        assert_eq!(exemplar_bucket(40_000_000_000), LATENCY_BUCKETS.len(), "+Inf");
    }

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
}
