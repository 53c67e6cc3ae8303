//! The exposition of `neuron-monitor`'s series in the two formats Prometheus scrapes:
//! the text format (version 0.0.4), byte for byte what the `prometheus` crate's encoder
//! writes (the tests hold the two to the same bytes), and OpenMetrics 1.0 text for a
//! scraper that asks for it, with exemplars: the execution behind a latency bucket or
//! an error count. The text format carries no exemplars, so a scraper that does not ask
//! for OpenMetrics gets exactly what it got before they existed.

use std::collections::{BTreeMap, HashMap};

use neuron_datastore::exemplar::LATENCY_BOUNDS_NS;

/// Upper bounds, in seconds, of the latency histograms' buckets
/// (`neuron_execution_latency_seconds` and the others): the ranges whose last execution
/// the runtime keeps as their exemplar, 25 µs to 30 s.
pub const LATENCY_BUCKETS: [f64; LATENCY_BOUNDS_NS.len()] = {
    let mut seconds = [0.0; LATENCY_BOUNDS_NS.len()];
    let mut k = 0;
    while k < seconds.len() {
        seconds[k] = LATENCY_BOUNDS_NS[k] as f64 / 1e9;
        k += 1;
    }
    seconds
};

/// A histogram's cumulative counts per `LATENCY_BUCKETS` bound (the `+Inf` bucket is
/// `count`), with the number and sum of the observations, and an exemplar per bucket
/// where one is known (`+Inf`'s last).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum: f64,
    /// `LATENCY_BUCKETS.len() + 1` entries, or none.
    pub exemplars: Vec<Option<Exemplar>>,
}

/// An observation behind a sample, for the OpenMetrics exposition: its labels (at most
/// [`EXEMPLAR_LABEL_CHARS`] characters of names and values together), its value and
/// when it was observed (seconds since the Unix epoch).
#[derive(Debug, Clone, PartialEq)]
pub struct Exemplar {
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
    pub timestamp_s: f64,
}

/// The most characters an exemplar's label names and values may hold together
/// (OpenMetrics 1.0).
pub const EXEMPLAR_LABEL_CHARS: usize = 128;

impl Exemplar {
    /// The newer of two exemplars of one sample (processes sharing a tag).
    fn newer(a: Option<Exemplar>, b: Option<Exemplar>) -> Option<Exemplar> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.timestamp_s > a.timestamp_s { b } else { a }),
            (a, b) => a.or(b),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Gauge,
    Counter,
}

/// A series' labels, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Labels(Vec<(&'static str, String)>);

impl Labels {
    pub(crate) fn with(mut self, name: &'static str, value: String) -> Labels {
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
    Value(f64, Option<Exemplar>),
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
pub struct Families {
    families: Vec<Family>,
    index: HashMap<String, usize>,
    common: Vec<(&'static str, String)>,
}

impl Families {
    pub(crate) fn new(common: Vec<(&'static str, String)>) -> Families {
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

    pub(crate) fn add(&mut self, name: &str, help: &'static str, kind: Kind, labels: Labels, value: f64) {
        self.add_named(name.to_string(), help, kind, labels, value);
    }

    pub(crate) fn add_named(&mut self, name: String, help: &'static str, kind: Kind, labels: Labels, value: f64) {
        let kind = match kind {
            Kind::Gauge => FamilyType::Gauge,
            Kind::Counter => FamilyType::Counter,
        };
        self.add_value(name, help, kind, Combine::Sum, labels, value, None);
    }

    /// A counter's value, with the last observation that counted in it (the OpenMetrics
    /// exposition shows it).
    pub(crate) fn add_counter(
        &mut self,
        name: &str,
        help: &'static str,
        labels: Labels,
        value: f64,
        exemplar: Option<Exemplar>,
    ) {
        self.add_value(name.to_string(), help, FamilyType::Counter, Combine::Sum, labels, value, exemplar);
    }

    pub(crate) fn add_max(&mut self, name: &str, help: &'static str, labels: Labels, value: f64) {
        self.add_value(name.to_string(), help, FamilyType::Gauge, Combine::Max, labels, value, None);
    }

    #[allow(clippy::too_many_arguments)]
    fn add_value(
        &mut self,
        name: String,
        help: &'static str,
        kind: FamilyType,
        combine: Combine,
        labels: Labels,
        value: f64,
        exemplar: Option<Exemplar>,
    ) {
        let family = self.family(name, help, kind, combine);
        let combine = family.combine;
        match family.samples.entry(labels) {
            std::collections::btree_map::Entry::Occupied(mut s) => {
                if let Sample::Value(v, e) = s.get_mut() {
                    *v = match combine {
                        Combine::Sum => *v + value,
                        Combine::Max => v.max(value),
                    };
                    *e = Exemplar::newer(e.take(), exemplar);
                }
            }
            std::collections::btree_map::Entry::Vacant(s) => {
                s.insert(Sample::Value(value, exemplar));
            }
        }
    }

    pub(crate) fn add_histogram(&mut self, name: &str, help: &'static str, labels: Labels, histogram: Histogram) {
        let family = self.family(name.to_string(), help, FamilyType::Histogram, Combine::Sum);
        family
            .samples
            .entry(labels)
            .and_modify(|s| {
                if let Sample::Histogram(h) = s {
                    h.buckets.iter_mut().zip(&histogram.buckets).for_each(|(a, b)| *a += b);
                    h.count += histogram.count;
                    h.sum += histogram.sum;
                    if h.exemplars.is_empty() {
                        h.exemplars.clone_from(&histogram.exemplars);
                    } else {
                        for (a, b) in h.exemplars.iter_mut().zip(&histogram.exemplars) {
                            *a = Exemplar::newer(a.take(), b.clone());
                        }
                    }
                }
            })
            .or_insert_with(|| Sample::Histogram(histogram.clone()));
    }

    /// The text format (version 0.0.4): each family's `# HELP` and `# TYPE`, then its
    /// samples, a histogram as its cumulative buckets, `+Inf`, `_sum` and `_count`,
    /// as the `prometheus` crate's encoder writes them (the tests hold the two to the
    /// same bytes), without the crate's intermediate messages: a job of many ranks has
    /// tens of thousands of samples at every report.
    pub fn text(&self) -> String {
        self.encode(false)
    }

    /// The OpenMetrics 1.0 text format, for a scraper that asks for it (`Accept:
    /// application/openmetrics-text`): the same families and samples as [`Families::text`],
    /// with OpenMetrics' differences: a counter family is named without its `_total`
    /// (its samples keep it), `# HELP` escapes double quotes too, infinities and NaN are
    /// written `+Inf`, `-Inf` and `NaN`, the exposition ends with `# EOF`; and the
    /// exemplars: a histogram bucket's and a counter's last observation, after the
    /// sample (` # {labels} value timestamp`).
    pub fn openmetrics(&self) -> String {
        self.encode(true)
    }

    /// [`Families::text`], or [`Families::openmetrics`] when `openmetrics`.
    fn encode(&self, openmetrics: bool) -> String {
        use std::fmt::Write;
        let mut common = String::new();
        for (name, value) in &self.common {
            push_label(&mut common, name, value);
        }
        let mut text = String::with_capacity(1 << 16);
        let mut labels = String::new();
        let bounds: Vec<String> = LATENCY_BUCKETS.iter().map(f64::to_string).collect();
        for f in self.families.iter().filter(|f| !f.samples.is_empty()) {
            let name = &f.name;
            if openmetrics {
                let family = match f.kind {
                    FamilyType::Counter => name.strip_suffix("_total").unwrap_or(name),
                    _ => name,
                };
                // A counter without the suffix OpenMetrics requires of its samples is
                // exposed as `unknown`, under its own name.
                let kind = match f.kind {
                    FamilyType::Counter if family == name => "unknown",
                    kind => kind.name(),
                };
                let _ = writeln!(text, "# TYPE {family} {kind}");
                if !f.help.is_empty() {
                    let _ = writeln!(text, "# HELP {family} {}", escape(f.help, true));
                }
            } else {
                if !f.help.is_empty() {
                    let _ = writeln!(text, "# HELP {name} {}", escape(f.help, false));
                }
                let _ = writeln!(text, "# TYPE {name} {}", f.kind.name());
            }
            for (series, sample) in &f.samples {
                labels.clone_from(&common);
                for (label, value) in &series.0 {
                    push_label(&mut labels, label, value);
                }
                let mut line = |suffix: &str, le: Option<&str>, value: f64, exemplar: Option<&Exemplar>| {
                    if openmetrics {
                        write_openmetrics_sample(&mut text, (name, suffix), &labels, le, value, exemplar);
                    } else {
                        write_sample(&mut text, (name, suffix), &labels, le, value);
                    }
                };
                match sample {
                    Sample::Value(value, exemplar) => line("", None, *value, exemplar.as_ref()),
                    Sample::Histogram(h) => {
                        let exemplar = |k: usize| h.exemplars.get(k).and_then(Option::as_ref);
                        for (k, (le, &n)) in bounds.iter().zip(&h.buckets).enumerate() {
                            line("_bucket", Some(le), n as f64, exemplar(k));
                        }
                        line("_bucket", Some("+Inf"), h.count as f64, exemplar(bounds.len()));
                        line("_sum", None, h.sum, None);
                        line("_count", None, h.count as f64, None);
                    }
                }
            }
        }
        if openmetrics {
            text.push_str("# EOF\n");
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

/// One OpenMetrics sample line: as [`write_sample`]'s, numbers as OpenMetrics writes
/// them, and the exemplar after.
fn write_openmetrics_sample(
    text: &mut String,
    name: (&str, &str),
    labels: &str,
    le: Option<&str>,
    value: f64,
    exemplar: Option<&Exemplar>,
) {
    write_sample_with(text, name, labels, le, value, push_openmetrics_number);
    if let Some(exemplar) = exemplar {
        text.pop();
        text.push_str(" # {");
        let mut first = true;
        for (label, value) in &exemplar.labels {
            if !first {
                text.push(',');
            }
            first = false;
            text.push_str(label);
            text.push_str("=\"");
            text.push_str(&escape(value, true));
            text.push('"');
        }
        text.push_str("} ");
        push_openmetrics_number(text, exemplar.value);
        text.push(' ');
        push_openmetrics_number(text, exemplar.timestamp_s);
        text.push('\n');
    }
}

/// `value` as OpenMetrics writes numbers: as [`push_number`], with `+Inf`, `-Inf`, `NaN`.
fn push_openmetrics_number(text: &mut String, value: f64) {
    match value {
        v if v.is_nan() => text.push_str("NaN"),
        f64::INFINITY => text.push_str("+Inf"),
        f64::NEG_INFINITY => text.push_str("-Inf"),
        v => push_number(text, v),
    }
}

/// One sample line: `name{labels,le="0.5"} value`.
fn write_sample(text: &mut String, name: (&str, &str), labels: &str, le: Option<&str>, value: f64) {
    write_sample_with(text, name, labels, le, value, push_number);
}

/// [`write_sample`] with numbers written by `number`.
fn write_sample_with(
    text: &mut String,
    (name, suffix): (&str, &str),
    labels: &str,
    le: Option<&str>,
    value: f64,
    number: fn(&mut String, f64),
) {
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
    number(text, value);
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

    /// A histogram of 3 observations at 80 µs and 1 at 40 s (past every bound).
    fn observed() -> Histogram {
        let mut buckets = vec![0; LATENCY_BUCKETS.len()];
        buckets.iter_mut().skip(2).for_each(|n| *n = 3);
        Histogram { buckets, count: 4, sum: 40.00024, exemplars: Vec::new() }
    }

    #[test]
    fn series_of_processes_sharing_a_tag_add_up_and_percentiles_take_the_highest() {
        let mut out = Families::default();
        let labels = Labels::default().with("runtime_tag", "a".into());
        out.add("execution_status_total", "h", Kind::Counter, labels.clone(), 2.0);
        out.add("execution_status_total", "h", Kind::Counter, labels.clone(), 3.0);
        out.add_max("execution_latency_seconds", "h", labels.clone(), 0.5);
        out.add_max("execution_latency_seconds", "h", labels, 0.25);
        let text = out.text();
        assert!(text.contains("execution_status_total{runtime_tag=\"a\"} 5\n"), "{text}");
        assert!(text.contains("execution_latency_seconds{runtime_tag=\"a\"} 0.5\n"), "{text}");
        assert!(text.contains("# TYPE execution_status_total counter\n"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = Families::default();
        out.add("m", "h", Kind::Gauge, Labels::default().with("runtime_tag", "a\"b\\c\nd".into()), 1.0);
        assert!(out.text().contains(r#"m{runtime_tag="a\"b\\c\nd"} 1"#));
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
                            (Sample::Value(v, _), FamilyType::Counter) => {
                                let mut counter = proto::Counter::default();
                                counter.set_value(v);
                                metric.set_counter(counter);
                            }
                            (Sample::Value(v, _), _) => {
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

    fn example(exec_id: &str, value: f64) -> Exemplar {
        Exemplar {
            labels: vec![("exec_id", exec_id.into()), ("model", "m\"x".into())],
            value,
            timestamp_s: 1.7e9 + 0.25,
        }
    }

    #[test]
    fn openmetrics_names_counters_without_total_and_shows_exemplars() {
        let mut out = Families::new(vec![("instance_type", "trn1.2xlarge".into())]);
        let labels = Labels::default().with("runtime_tag", "a".into());
        out.add_counter(
            "execution_errors_total",
            "Execution \"errors\"",
            labels.clone(),
            3.0,
            Some(example("12", 1.0)),
        );
        out.add("neuron_trace_events_total", "t", Kind::Counter, labels.clone(), 5.0);
        out.add("inf", "", Kind::Gauge, Labels::default(), f64::INFINITY);
        let mut histogram = observed();
        histogram.exemplars = vec![None; LATENCY_BUCKETS.len() + 1];
        histogram.exemplars[2] = Some(example("7", 80e-6));
        histogram.exemplars[LATENCY_BUCKETS.len()] = Some(example("8", 40.0));
        out.add_histogram("neuron_execution_latency_seconds", "h", labels.clone(), histogram.clone());
        // Another process of the tag: the counts add up, the newer exemplar stays.
        let mut later = histogram;
        later.exemplars[2] = Some(Exemplar { timestamp_s: 1.8e9, ..example("70", 90e-6) });
        later.exemplars[LATENCY_BUCKETS.len()] = None;
        out.add_histogram("neuron_execution_latency_seconds", "h", labels, later);
        let text = out.openmetrics();
        let common = "instance_type=\"trn1.2xlarge\",runtime_tag=\"a\"";
        for line in [
            "# TYPE execution_errors counter\n# HELP execution_errors Execution \\\"errors\\\"\n".to_string(),
            format!("execution_errors_total{{{common}}} 3 # {{exec_id=\"12\",model=\"m\\\"x\"}} 1 1700000000.25\n"),
            "# TYPE neuron_trace_events counter\n".into(),
            format!("neuron_trace_events_total{{{common}}} 5\n"),
            "inf{instance_type=\"trn1.2xlarge\"} +Inf\n".into(),
            "# TYPE neuron_execution_latency_seconds histogram\n".into(),
            format!("neuron_execution_latency_seconds_bucket{{{common},le=\"0.00005\"}} 0\n"),
            format!(
                "neuron_execution_latency_seconds_bucket{{{common},le=\"0.0001\"}} 6 # {{exec_id=\"70\",model=\"m\\\"x\"}} 0.00009 1800000000\n"
            ),
            format!(
                "neuron_execution_latency_seconds_bucket{{{common},le=\"+Inf\"}} 8 # {{exec_id=\"8\",model=\"m\\\"x\"}} 40 1700000000.25\n"
            ),
            format!("neuron_execution_latency_seconds_count{{{common}}} 8\n"),
        ] {
            assert!(text.contains(&line), "no {line:?} in\n{text}");
        }
        assert!(text.ends_with("\n# EOF\n"), "{text}");
        assert!(!text.contains("# TYPE execution_errors_total"), "{text}");
        // The text format of the same families: no exemplar, no EOF.
        let plain = out.text();
        assert!(!plain.contains(" # {") && !plain.contains("# EOF"), "{plain}");
        assert!(plain.contains("# TYPE execution_errors_total counter\n"), "{plain}");
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
            // Exemplars, which the text format leaves out.
            let mut histogram = observed();
            histogram.exemplars = vec![None; LATENCY_BUCKETS.len() + 1];
            histogram.exemplars[2] = Some(example("7", 80e-6));
            out.add_histogram("neuron_execution_latency_seconds", "h", labels.clone(), histogram);
            out.add_counter("execution_errors_total", "e", labels, 2.0, Some(example("9", 1.0)));
            out.add("empty", "never sampled", Kind::Gauge, Labels::default(), 0.0);
            out.families.last_mut().expect("a family").samples.clear();
            out
        };
        let ours = families().text();
        assert_eq!(ours, by_the_crate(families()));
        assert!(ours.contains("neuron_execution_latency_seconds_bucket{instance_name=\"\",instance_type=\"trn1.32xlarge\",runtime_tag=\"train \\\"a\\\"\\\\b\\nc\",le=\"0.0001\"} 3\n"), "{ours}");
        assert!(!ours.contains("empty"), "{ours}");
        // With no common labels, a series of no labels has no braces.
        let mut bare = Families::default();
        bare.add("up", "", Kind::Gauge, Labels::default(), 1.0);
        assert_eq!(bare.text(), "# TYPE up gauge\nup 1\n");
    }
}
