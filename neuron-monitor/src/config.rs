//! `neuron-monitor`'s configuration: which runtime processes to report on (a regex on
//! their `NEURON_PROCESS_TAG`, else their pid), which metric groups, and how often.
//!
//! ```json
//! {"period": "5s",
//!  "neuron_runtimes": [{"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"},
//!      {"type": "memory_used"}, {"type": "neuron_runtime_vcpu_usage"}, {"type": "execution_stats"}]}],
//!  "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"},
//!      {"type": "neuron_hw_counters", "period": "2s"}]}
//! ```
//!
//! `period` may be given at the root, on a runtime entry or on a metric group; the
//! innermost wins. Anything else is an error that names the field and its value.

use std::fmt;
use std::time::Duration;

use regex::Regex;
use serde_json::{Map, Value};

use neuron_datastore::config::parse_duration;

/// The report period when the configuration gives none.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(5);

/// The metric groups reported per runtime process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum RuntimeGroup {
    NeuroncoreCounters,
    ExecutionStats,
    MemoryUsed,
    NeuronRuntimeVcpuUsage,
}

/// The metric groups reported for the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum SystemGroup {
    NeuronHwCounters,
    VcpuUsage,
    MemoryInfo,
    /// Ours: the communicators of the followed runtimes (`collectives.rs`).
    Collectives,
}

impl RuntimeGroup {
    pub const ALL: &[RuntimeGroup] = <RuntimeGroup as strum::VariantArray>::VARIANTS;

    /// The group's name in configurations and reports.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl SystemGroup {
    pub const ALL: &[SystemGroup] = <SystemGroup as strum::VariantArray>::VARIANTS;

    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// A metric group with the period it is reported at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group<G> {
    pub group: G,
    pub period: Duration,
}

/// Runtime processes to report on, and what about them.
#[derive(Debug, Clone)]
pub struct RuntimeSelector {
    /// Matched against a process's `NEURON_PROCESS_TAG`, or its pid when it has none.
    pub tag_filter: Regex,
    pub groups: Vec<Group<RuntimeGroup>>,
}

impl RuntimeSelector {
    /// Whether a process with this tag (or pid, for an untagged one) is selected.
    pub fn selects(&self, tag_or_pid: &str) -> bool {
        self.tag_filter.is_match(tag_or_pid)
    }
}

/// A whole configuration, with every period resolved.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// The root period: how often a report line is written when no group says otherwise.
    pub period: Duration,
    pub runtimes: Vec<RuntimeSelector>,
    pub system: Vec<Group<SystemGroup>>,
}

impl Default for MonitorConfig {
    /// Every runtime process, every group, every 5 s.
    fn default() -> MonitorConfig {
        let all = |period| RuntimeGroup::ALL.iter().map(|&group| Group { group, period }).collect();
        MonitorConfig {
            period: DEFAULT_PERIOD,
            runtimes: vec![RuntimeSelector {
                tag_filter: Regex::new(".*").expect("a valid regex"),
                groups: all(DEFAULT_PERIOD),
            }],
            system: SystemGroup::ALL.iter().map(|&group| Group { group, period: DEFAULT_PERIOD }).collect(),
        }
    }
}

/// What is wrong with a configuration: the field (a path such as
/// `neuron_runtimes[0].metrics[1].type`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

fn error(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError { field: field.to_string(), message: message.into() }
}

impl MonitorConfig {
    /// Parses and checks a configuration's JSON text.
    pub fn parse(text: &str) -> Result<MonitorConfig, ConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|e| error("", format!("invalid JSON: {e}")))?;
        let root = object(&value, "the configuration")?;
        known_keys(root, "", &["period", "neuron_runtimes", "system_metrics"])?;
        let root_period = period(root, "")?.unwrap_or(DEFAULT_PERIOD);
        let mut config = MonitorConfig { period: root_period, runtimes: Vec::new(), system: Vec::new() };
        let any = Regex::new(".*").expect("a valid regex");
        for (k, entry) in array(root, "", "neuron_runtimes")?.iter().enumerate() {
            let at = format!("neuron_runtimes[{k}]");
            let entry = object(entry, &at)?;
            known_keys(entry, &at, &["tag_filter", "period", "metrics"])?;
            let entry_period = period(entry, &at)?.unwrap_or(config.period);
            let tag_filter = match entry.get("tag_filter") {
                None => any.clone(),
                Some(Value::String(text)) => Regex::new(text).map_err(|e| {
                    // The parser's message draws a caret under the pattern; its last line says what is wrong.
                    let e = e.to_string();
                    let why = e.lines().last().unwrap_or_default().trim_start_matches("error: ");
                    error(&format!("{at}.tag_filter"), format!("invalid regex {text:?}: {why}"))
                })?,
                Some(other) => {
                    return Err(error(&format!("{at}.tag_filter"), format!("expected a string, found {other}")));
                }
            };
            let mut groups = Vec::new();
            for (g, metric) in array(entry, &at, "metrics")?.iter().enumerate() {
                let at = format!("{at}.metrics[{g}]");
                let (name, group_period) = metric_group(metric, &at, entry_period)?;
                let Some(group) = RuntimeGroup::ALL.iter().copied().find(|g| g.name() == name) else {
                    return Err(unknown_group(&at, &name, true));
                };
                groups.push(Group { group, period: group_period });
            }
            config.runtimes.push(RuntimeSelector { tag_filter, groups });
        }
        for (g, metric) in array(root, "", "system_metrics")?.iter().enumerate() {
            let at = format!("system_metrics[{g}]");
            let (name, group_period) = metric_group(metric, &at, config.period)?;
            let Some(group) = SystemGroup::ALL.iter().copied().find(|g| g.name() == name) else {
                return Err(unknown_group(&at, &name, false));
            };
            config.system.push(Group { group, period: group_period });
        }
        Ok(config)
    }
}

fn object<'a>(value: &'a Value, what: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    value.as_object().ok_or_else(|| error(what, format!("expected an object, found {value}")))
}

/// `at.key`, or `key` at the root.
fn field(at: &str, key: &str) -> String {
    if at.is_empty() { key.to_string() } else { format!("{at}.{key}") }
}

/// The array at `key` of the object at `at` (empty when absent).
fn array<'a>(object: &'a Map<String, Value>, at: &str, key: &str) -> Result<&'a [Value], ConfigError> {
    match object.get(key) {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(error(&field(at, key), format!("expected an array, found {other}"))),
    }
}

fn known_keys(object: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), ConfigError> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) => Err(error(&field(at, key), format!("unknown field (known here: {})", known.join(", ")))),
    }
}

/// The `period` of the object at `at`, if it has one.
fn period(object: &Map<String, Value>, at: &str) -> Result<Option<Duration>, ConfigError> {
    let field = &field(at, "period");
    let Some(value) = object.get("period") else { return Ok(None) };
    let Value::String(text) = value else {
        return Err(error(field, format!("expected a duration such as \"5s\", found {value}")));
    };
    let duration = parse_duration(text).map_err(|e| error(field, format!("invalid duration {text:?}: {e}")))?;
    if duration < Duration::from_millis(100) {
        return Err(error(field, format!("period {text:?} is shorter than the shortest supported, 100ms")));
    }
    Ok(Some(duration))
}

/// A metric group entry: its type and period.
fn metric_group(metric: &Value, at: &str, outer: Duration) -> Result<(String, Duration), ConfigError> {
    let metric = object(metric, at)?;
    known_keys(metric, at, &["type", "period"])?;
    let name = match metric.get("type") {
        Some(Value::String(name)) => name.clone(),
        Some(other) => return Err(error(&format!("{at}.type"), format!("expected a string, found {other}"))),
        None => return Err(error(&format!("{at}.type"), "missing: every metric group names its type")),
    };
    Ok((name, period(metric, at)?.unwrap_or(outer)))
}

fn unknown_group(at: &str, name: &str, runtime: bool) -> ConfigError {
    let field = format!("{at}.type");
    let runtime_names: Vec<&str> = RuntimeGroup::ALL.iter().map(|g| g.name()).collect();
    let system_names: Vec<&str> = SystemGroup::ALL.iter().map(|g| g.name()).collect();
    let (here, there, there_is) = if runtime {
        (&runtime_names, &system_names, "system_metrics")
    } else {
        (&system_names, &runtime_names, "neuron_runtimes[].metrics")
    };
    if there.contains(&name) {
        return error(&field, format!("{name:?} is a metric group of {there_is}, not of this list"));
    }
    error(&field, format!("unknown metric group type {name:?} (known here: {})", here.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_periods_win() {
        let config = MonitorConfig::parse(
            r#"{"period":"1s","neuron_runtimes":[{"tag_filter":"^train","period":"2s","metrics":[{"type":"neuroncore_counters"},{"type":"execution_stats","period":"500ms"}]}],
               "system_metrics":[{"type":"vcpu_usage"},{"period":"3s","type":"neuron_hw_counters"}]}"#,
        )
        .expect("valid");
        assert_eq!(config.period, Duration::from_secs(1));
        let runtime = &config.runtimes[0];
        assert!(runtime.selects("training-job") && !runtime.selects("serving"));
        assert_eq!(
            runtime.groups,
            vec![
                Group { group: RuntimeGroup::NeuroncoreCounters, period: Duration::from_secs(2) },
                Group { group: RuntimeGroup::ExecutionStats, period: Duration::from_millis(500) },
            ]
        );
        assert_eq!(
            config.system,
            vec![
                Group { group: SystemGroup::VcpuUsage, period: Duration::from_secs(1) },
                Group { group: SystemGroup::NeuronHwCounters, period: Duration::from_secs(3) },
            ]
        );
    }

    #[test]
    fn an_empty_configuration_reports_nothing_every_five_seconds() {
        let config = MonitorConfig::parse("{}").expect("valid");
        assert_eq!(config.period, DEFAULT_PERIOD);
        assert!(config.runtimes.is_empty() && config.system.is_empty());
        let default = MonitorConfig::default();
        assert_eq!(default.runtimes[0].groups.len(), 4);
        assert_eq!(default.system.len(), 4);
        assert!(default.runtimes[0].selects("1234"));
    }
}
