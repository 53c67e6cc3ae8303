//! `neuron-monitor`: one JSON report per line on stdout, the first at once and then
//! every period, on every runtime process of the host that the configuration selects
//! and on the host itself, in the shape of the Neuron tool's reports.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use clap::Parser;
use neuron_datastore::clock::{monotonic_ns, realtime_ns};
use neuron_datastore::config::{ReaderConfig, parse_listen_address};
use neuron_datastore::host::{CpuStat, MemoryInfo, ProcessCpu, clock_ticks_per_second};
use neuron_datastore::ranks::{RuntimeRecords, StragglerRule, group_views, root_now};
use neuron_datastore::topology::Topology;
use neuron_datastore::{DatastoreReader, Runtimes, Snapshot};
use neuron_monitor::collectives::{self, Tally};
use neuron_monitor::config::{Group, MonitorConfig, RuntimeGroup, SystemGroup};
use neuron_monitor::prometheus::{self, RuntimeCounters};
use neuron_monitor::report::{CpuClock, HostSample, RuntimeSample, runtime_group, system_group};
use serde_json::{Map, Value, json};

/// Report on the Neuron runtime processes of this host and on the host, as one JSON
/// document per line on stdout: the first at once, then every period.
#[derive(Debug, Parser)]
#[command(name = "neuron-monitor", version)]
struct Cli {
    /// A JSON configuration: which processes (a regex on NEURON_PROCESS_TAG, else the
    /// pid), which metric groups, how often. Default: every process, every group, 5 s.
    #[arg(short = 'c', long = "config-file", value_name = "CONFIG")]
    config: Option<PathBuf>,
    /// Diagnostics on stderr: 0 errors only, 1 warnings, 2 and more each period's work.
    #[arg(long, value_name = "N", default_value_t = 0)]
    verbose: u8,
    /// Write one report, over a measured period of 1 s, and exit.
    #[arg(long)]
    once: bool,
    /// Directory of the runtimes' datastores (default: the per-user directory).
    #[arg(long, env = "NEURON_VIRT_DATASTORE_DIR", value_name = "DIR")]
    datastore_dir: Option<PathBuf>,
    /// Serve the reports as Prometheus metrics on http://ADDR/metrics, updated at each
    /// report. ADDR is HOST:PORT, or a port alone for 127.0.0.1:PORT (port 0 picks a
    /// free one). Without ADDR: 127.0.0.1:8000. The address served is printed on stderr.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "8000", conflicts_with = "once")]
    prometheus_listen: Option<String>,
    /// Do not write the JSON reports on stdout (with --prometheus-listen).
    #[arg(long, requires = "prometheus_listen")]
    no_stdout: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match &cli.config {
        None => MonitorConfig::default(),
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => match MonitorConfig::parse(&text) {
                Ok(config) => config,
                Err(e) => {
                    eprintln!("neuron-monitor: invalid configuration {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            },
            Err(e) => {
                eprintln!("neuron-monitor: cannot read the configuration {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        },
    };
    if config.runtimes.is_empty() {
        eprintln!(
            "neuron-monitor: the configuration has no \"neuron_runtimes\" entry, so no runtime is reported; add one such as {{\"tag_filter\": \".*\", \"metrics\": [{{\"type\": \"neuroncore_counters\"}}, {{\"type\": \"execution_stats\"}}]}}"
        );
    }
    let server = match &cli.prometheus_listen {
        None => None,
        Some(addr) => match MetricsServer::start(addr) {
            Ok(server) => {
                eprintln!("neuron-monitor: serving Prometheus metrics on http://{}/metrics", server.addr);
                Some(server)
            }
            Err(e) => {
                eprintln!("neuron-monitor: {e:#}");
                return ExitCode::FAILURE;
            }
        },
    };
    match run(&cli, &config, server.as_ref()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("neuron-monitor: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The period the one report of `--once` covers.
const ONCE_PERIOD: Duration = Duration::from_secs(1);

/// A metric group being followed: its sample at the start of its period, and its
/// latest value.
#[derive(Debug)]
struct Followed<G, S> {
    group: Group<G>,
    since: S,
    since_at: Instant,
    value: Value,
}

impl Process {
    /// The counters at the last look: every group was brought up to date for a report.
    fn newest(&self) -> &Snapshot {
        self.groups.iter().max_by_key(|g| g.since_at).map_or(&self.since, |g| &g.since.snapshot)
    }

    /// The loaded models at the last look.
    fn newest_models(&self) -> &[neuron_datastore::ModelInfo] {
        self.groups.iter().max_by_key(|g| g.since_at).map_or(&[], |g| &g.since.models)
    }
}

/// What the monitor keeps for a runtime process it reports on.
#[derive(Debug)]
struct Process {
    tag: String,
    /// Selected by a `neuron_runtimes` entry, so reported under `neuron_runtime_data`;
    /// the others are followed for the `collectives` group alone.
    listed: bool,
    /// Each group's sample at the start of its period, shared by the groups looked at
    /// together.
    groups: Vec<Followed<RuntimeGroup, Arc<RuntimeSample>>>,
    /// The counters when the monitor began following the process.
    since: Snapshot,
    /// ECC counts at the last `neuron_hw_counters` report.
    ecc_since: Vec<[u64; 4]>,
}

struct Monitor<'a> {
    config: &'a MonitorConfig,
    cli: &'a Cli,
    /// The instance the running runtimes declare, or `configured` when none runs.
    topology: Topology,
    configured: Topology,
    clock: CpuClock,
    processes: Runtimes<Process>,
    system: Vec<Followed<SystemGroup, HostSample>>,
    /// CLOCK_REALTIME when the monitor started.
    started_realtime_ns: u64,
    /// Each device's ECC events since the monitor started.
    ecc_total: Vec<[u64; 4]>,
    /// The communicators' counts since the monitor started, and the latest views.
    collectives: Tally,
    straggler_rule: Result<StragglerRule, String>,
}

fn run(cli: &Cli, config: &MonitorConfig, server: Option<&MetricsServer>) -> Result<()> {
    let reader_config = ReaderConfig::from_env()?;
    let topology = reader_config.instance_type.topology();
    let dir = cli.datastore_dir.clone().unwrap_or(reader_config.datastore_dir);
    let host = host_sample();
    let cpus = host.cpu.as_ref().map_or(1, |c| c.cpus.len().max(1));
    let now = Instant::now();
    let mut monitor = Monitor {
        config,
        cli,
        clock: CpuClock { ticks_per_second: clock_ticks_per_second(), cpus },
        processes: Runtimes::new(dir),
        system: config
            .system
            .iter()
            .map(|&group| Followed { group, since: host.clone(), since_at: now, value: Value::Null })
            .collect(),
        started_realtime_ns: realtime_ns(),
        ecc_total: vec![[0; 4]; topology.device_count as usize],
        configured: topology.clone(),
        topology,
        collectives: Tally::default(),
        straggler_rule: StragglerRule::from_env(),
    };
    // Every group is looked at as often as the shortest period asks; a report goes
    // out every root period.
    let tick = config
        .runtimes
        .iter()
        .flat_map(|r| r.groups.iter().map(|g| g.period))
        .chain(config.system.iter().map(|g| g.period))
        .chain([config.period])
        .min()
        .unwrap_or(config.period);
    let mut next_report = Instant::now();
    if cli.once {
        // One report is worth its figures only over a period: find the runtimes and
        // take their counters now, report what happened in the next ONCE_PERIOD.
        monitor.look(false)?;
        next_report += ONCE_PERIOD;
        std::thread::sleep(ONCE_PERIOD);
    }
    let stdout = std::io::stdout();
    loop {
        let due_report = Instant::now() >= next_report;
        monitor.look(due_report)?;
        if due_report {
            let report = monitor.report();
            if let Some(server) = server {
                server.publish(monitor.exposition(&report));
            }
            let line = (!cli.no_stdout).then(|| serde_json::to_vec(&report));
            monitor.give_back(report);
            if let Some(line) = line {
                let mut line = line?;
                line.push(b'\n');
                let mut out = stdout.lock();
                match out.write_all(&line).and_then(|()| out.flush()) {
                    Ok(()) => {}
                    // The reader went away (`neuron-monitor | head`): nothing left to do.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    Err(e) => return Err(e).context("cannot write the report"),
                }
            }
            monitor.forget_exited();
            if cli.once {
                return Ok(());
            }
            next_report += config.period;
        }
        let wake = next_report.min(Instant::now() + tick);
        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
    }
}

fn host_sample() -> HostSample {
    HostSample {
        taken_ns: monotonic_ns(),
        cpu: CpuStat::read().map_err(|e| format!("cannot read /proc/stat: {e}")),
        memory: MemoryInfo::read().map_err(|e| format!("cannot read /proc/meminfo: {e}")),
    }
}

fn sample(reader: &DatastoreReader, pid: u32) -> RuntimeSample {
    RuntimeSample { snapshot: reader.snapshot(), models: reader.models(), cpu: ProcessCpu::read(pid).ok() }
}

impl Monitor<'_> {
    /// Finds new and exited processes, and brings every due group up to date (all of
    /// them when `all_due`, for a report).
    fn look(&mut self, all_due: bool) -> Result<()> {
        self.find_new()?;
        let declared = self.processes.iter().map(|p| p.reader.info().instance_type.as_str());
        self.topology = Topology::declared(declared).unwrap_or_else(|| self.configured.clone());
        if self.ecc_total.len() < self.topology.device_count as usize {
            self.ecc_total.resize(self.topology.device_count as usize, [0; 4]);
        }
        let now = Instant::now();
        let cores_per_device = self.topology.cores_per_device();
        let host_due: Vec<bool> = self.system.iter().map(|g| all_due || due(g.since_at, g.group.period, now)).collect();
        let ecc_due =
            self.system.iter().zip(&host_due).any(|(g, &d)| d && g.group.group == SystemGroup::NeuronHwCounters);
        // ECC events per device since the last hardware-counter look, over every process
        // (an exited one's too, in the look before it is dropped).
        let mut ecc = vec![[0u64; 4]; self.topology.device_count as usize];
        self.processes.mark_exited();
        for followed in self.processes.iter_mut().filter(|p| p.state.listed) {
            let exited = followed.exited();
            let process = &mut followed.state;
            let is_due = |g: &Followed<RuntimeGroup, Arc<RuntimeSample>>| {
                all_due || exited || due(g.since_at, g.group.period, now)
            };
            if !ecc_due && !process.groups.iter().any(is_due) {
                continue;
            }
            // The CPU time the look's liveness read already holds.
            let cpu = followed.cpu;
            let current = RuntimeSample { snapshot: followed.reader.snapshot(), models: followed.reader.models(), cpu };
            let current = Arc::new(current);
            for followed in process.groups.iter_mut().filter(|g| is_due(g)) {
                followed.value =
                    runtime_group(followed.group.group, &followed.since, &current, cores_per_device, self.clock);
                followed.since = Arc::clone(&current);
                followed.since_at = now;
            }
            if ecc_due {
                for (d, counts) in current.snapshot.ecc.iter().enumerate() {
                    let before = process.ecc_since.get(d).copied().unwrap_or_default();
                    if let Some(total) = ecc.get_mut(d) {
                        for k in 0..4 {
                            total[k] += counts[k].saturating_sub(before[k]);
                        }
                    }
                }
                process.ecc_since = current.snapshot.ecc.clone();
            }
        }
        for (total, gained) in self.ecc_total.iter_mut().zip(&ecc) {
            for k in 0..4 {
                total[k] += gained[k];
            }
        }
        // The flight records hold each rank's last collectives only: they are read at
        // every look, so that the counts miss as few as they can.
        if self.system.iter().any(|g| g.group.group == SystemGroup::Collectives) {
            let readers: Vec<_> = self.processes.iter().map(|p| (&p.reader, p.liveness)).collect();
            let records = RuntimeRecords::read_all(&readers);
            let rule = self.straggler_rule.clone().unwrap_or_default();
            self.collectives.observe(group_views(&records, &rule, root_now(&records)));
        }
        if host_due.contains(&true) {
            let host = host_sample();
            for (followed, _) in self.system.iter_mut().zip(&host_due).filter(|(_, d)| **d) {
                followed.value = match followed.group.group {
                    SystemGroup::Collectives => {
                        let seconds = host.taken_ns.saturating_sub(followed.since.taken_ns) as f64 / 1e9;
                        collectives::group(&self.collectives, &self.straggler_rule, seconds)
                    }
                    group => system_group(group, &followed.since, &host, &ecc),
                };
                followed.since = host.clone();
                followed.since_at = now;
            }
        }
        Ok(())
    }

    /// Starts following the runtime processes that appeared since the last look and
    /// that the configuration selects. Known processes are not opened again.
    fn find_new(&mut self) -> Result<()> {
        let (config, started_realtime_ns) = (self.config, self.started_realtime_ns);
        let admit = |reader: &DatastoreReader, label: &str| {
            let info = reader.info();
            let tag = label.to_owned();
            // The collectives group reads every runtime's flight record: a job's ranks are
            // watched whatever the `neuron_runtimes` entries select.
            let selector = config.runtimes.iter().find(|r| r.selects(&tag));
            let collectives = config.system.iter().any(|g| g.group == SystemGroup::Collectives);
            if selector.is_none() && !collectives {
                return None;
            }
            let mut first = sample(reader, info.pid);
            // A process that started after the monitor: measured from its start, so
            // that nothing it did before it was found is lost.
            if info.created_realtime_ns >= started_realtime_ns {
                let age = realtime_ns().saturating_sub(info.created_realtime_ns);
                first = first.at_start(monotonic_ns().saturating_sub(age));
            }
            let now = Instant::now();
            let ecc_since = first.snapshot.ecc.clone();
            let since = first.snapshot.clone();
            let first = Arc::new(first);
            let groups = selector
                .iter()
                .flat_map(|s| &s.groups)
                .map(|&group| Followed { group, since: Arc::clone(&first), since_at: now, value: Value::Null })
                .collect();
            Some(Process { tag, listed: selector.is_some(), groups, since, ecc_since })
        };
        let failures = self
            .processes
            .discover(admit)
            .with_context(|| format!("cannot list runtimes in {}", self.processes.dir().display()))?;
        if self.cli.verbose >= 1 {
            for failure in failures {
                eprintln!("neuron-monitor: cannot open the datastore of pid {}: {}", failure.pid, failure.error);
            }
        }
        Ok(())
    }

    /// Drops processes that exited, once their last period has been reported.
    fn forget_exited(&mut self) {
        self.processes.forget_exited(Duration::ZERO);
    }

    /// The Prometheus series of `report`, made of this look.
    fn exposition(&self, report: &Value) -> prometheus::Families {
        let counters: Vec<RuntimeCounters<'_>> = self
            .processes
            .iter()
            .filter(|p| p.state.listed)
            .map(|p| RuntimeCounters {
                pid: p.pid,
                since: &p.state.since,
                now: p.state.newest(),
                models: p.state.newest_models(),
            })
            .collect();
        prometheus::exposition(report, &counters, &self.ecc_total, &self.collectives)
    }

    /// The report of the latest look. Its groups' values are lent to it, not copied (a
    /// job of many ranks makes them large): [`Monitor::give_back`] returns them once the
    /// report is written, for the groups not due at the next look.
    fn report(&mut self) -> Value {
        let runtimes: Vec<Value> = self
            .processes
            .iter_mut()
            .filter(|p| p.state.listed)
            .map(|p| {
                let groups = lend(p.state.groups.iter_mut().map(|g| (g.group.group.name(), &mut g.value)));
                // Moved in: `json!` would copy it.
                let mut entry = json!({"pid": p.pid, "neuron_runtime_tag": p.state.tag, "error": ""});
                entry["report"] = Value::Object(groups);
                entry
            })
            .collect();
        let system = lend(self.system.iter_mut().map(|g| (g.group.group.name(), &mut g.value)));
        let t = &self.topology;
        let mut report = json!({
            // A virtual instance has no cloud identity: these are empty, as the Neuron
            // tool leaves them off EC2.
            "instance_info": {
                "instance_name": "",
                "instance_id": "",
                "instance_type": t.instance_type.to_string(),
                "instance_availability_zone": "",
                "instance_availability_zone_id": "",
                "instance_region": "",
                "ami_id": "",
                "subnet_id": "",
                "error": "",
            },
            "neuron_hardware_info": {
                "neuron_device_type": t.device_type,
                "neuron_device_version": format!("{:?}", t.core_version).to_lowercase(),
                "neuroncore_version": format!("{:?}", t.core_version).to_lowercase(),
                "neuron_device_count": t.device_count,
                "neuron_device_memory_size": t.device_memory_bytes,
                "neuroncore_per_device_count": t.cores_per_device(),
                "logical_neuroncore_config": t.logical_core_size,
                "error": "",
            },
        });
        report["neuron_runtime_data"] = Value::Array(runtimes);
        report["system_data"] = Value::Object(system);
        report
    }
}

impl Monitor<'_> {
    /// Takes back the group values lent to `report` (made by [`Monitor::report`] of
    /// the same look: the same processes and groups, in the same order).
    fn give_back(&mut self, mut report: Value) {
        let mut runtimes = std::mem::take(&mut report["neuron_runtime_data"]);
        let listed = self.processes.iter_mut().filter(|p| p.state.listed);
        for (p, runtime) in listed.zip(runtimes.as_array_mut().into_iter().flatten()) {
            take_back(&mut runtime["report"], p.state.groups.iter_mut().map(|g| (g.group.group.name(), &mut g.value)));
        }
        let system = &mut report["system_data"];
        take_back(system, self.system.iter_mut().map(|g| (g.group.group.name(), &mut g.value)));
    }
}

/// A report's groups, by name, their values moved out of `groups` (a group named
/// twice in the configuration is reported once, as its first).
fn lend<'a>(groups: impl Iterator<Item = (&'static str, &'a mut Value)>) -> Map<String, Value> {
    let mut lent = Map::new();
    for (name, value) in groups {
        if !lent.contains_key(name) {
            lent.insert(name.to_string(), std::mem::take(value));
        }
    }
    lent
}

/// Moves the values [`lend`] moved out of `groups` back from `lent`.
fn take_back<'a>(lent: &mut Value, groups: impl Iterator<Item = (&'static str, &'a mut Value)>) {
    for (name, value) in groups {
        if value.is_null()
            && let Some(lent) = lent.get_mut(name)
        {
            *value = lent.take();
        }
    }
}

/// Whether a group looked at `since` with period `period` is due at `now` (a little
/// early rather than a whole tick late).
fn due(since: Instant, period: Duration, now: Instant) -> bool {
    now.saturating_duration_since(since) + Duration::from_millis(5) >= period
}

/// The latest exposition, `None` before the first report.
type Latest = Arc<Mutex<Option<Arc<Published>>>>;

/// A report's series: in the text format, written when published, and in OpenMetrics,
/// written for the first scraper that asks for it.
struct Published {
    families: prometheus::Families,
    text: Bytes,
    openmetrics: std::sync::OnceLock<Bytes>,
}

/// The `/metrics` endpoint: an HTTP server on its own thread, serving the exposition
/// of the latest report.
struct MetricsServer {
    addr: SocketAddr,
    latest: Latest,
}

impl MetricsServer {
    /// Binds `addr` (a port alone means 127.0.0.1) and starts serving.
    fn start(addr: &str) -> Result<MetricsServer> {
        let addr = parse_listen_address(addr).map_err(|e| anyhow::anyhow!("--prometheus-listen {e}"))?;
        let listener =
            std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr} for Prometheus"))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let latest: Latest = Arc::default();
        let state = latest.clone();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        std::thread::Builder::new().name("prometheus".into()).spawn(move || {
            runtime.block_on(async move {
                let app = axum::Router::new()
                    .route("/metrics", axum::routing::get(metrics))
                    .route("/", axum::routing::get(index))
                    .with_state(state);
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => {
                        if let Err(e) = axum::serve(listener, app).await {
                            eprintln!("neuron-monitor: the Prometheus endpoint stopped: {e}");
                        }
                    }
                    Err(e) => eprintln!("neuron-monitor: the Prometheus endpoint cannot start: {e}"),
                }
            });
        })?;
        Ok(MetricsServer { addr, latest })
    }

    fn publish(&self, families: prometheus::Families) {
        let text = Bytes::from(families.text());
        let published = Arc::new(Published { families, text, openmetrics: std::sync::OnceLock::new() });
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some(published);
        }
    }
}

/// The latest report's series: in OpenMetrics (with exemplars) when the scraper's
/// `Accept` names `application/openmetrics-text`, else in the text format.
async fn metrics(State(latest): State<Latest>, headers: axum::http::HeaderMap) -> Response {
    let latest = latest.lock().ok().and_then(|l| l.clone());
    let Some(published) = latest else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no report yet\n").into_response();
    };
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|accept| accept.split(',').any(accepts_openmetrics));
    let vary = (header::VARY, "Accept");
    if openmetrics {
        let body = published.openmetrics.get_or_init(|| Bytes::from(published.families.openmetrics())).clone();
        ([(header::CONTENT_TYPE, prometheus::OPENMETRICS_CONTENT_TYPE), vary], body).into_response()
    } else {
        ([(header::CONTENT_TYPE, prometheus::CONTENT_TYPE), vary], published.text.clone()).into_response()
    }
}

/// Whether one media range of an `Accept` header asks for OpenMetrics (and not with
/// `q=0`, which refuses it).
fn accepts_openmetrics(range: &str) -> bool {
    let mut parts = range.split(';').map(str::trim);
    let asked = parts.next().is_some_and(|media| media.eq_ignore_ascii_case("application/openmetrics-text"));
    let refused = parts
        .filter_map(|p| p.split_once('='))
        .any(|(k, v)| k.trim().eq_ignore_ascii_case("q") && v.trim().parse::<f64>().is_ok_and(|q| q <= 0.0));
    asked && !refused
}

async fn index() -> Html<&'static str> {
    Html(
        "<!doctype html><title>neuron-monitor</title><h1>neuron-monitor</h1>\
         <p><a href=\"/metrics\">Metrics</a> (Prometheus text format; OpenMetrics, with exemplars, \
         to a scraper whose Accept header asks for application/openmetrics-text)</p>\n",
    )
}

#[cfg(test)]
mod tests {
    use super::accepts_openmetrics;

    #[test]
    fn openmetrics_is_served_to_a_scraper_that_asks_for_it_and_not_to_one_that_refuses_it() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(prometheus.split(',').any(accepts_openmetrics));
        assert!(accepts_openmetrics(" Application/OpenMetrics-Text ; q=0.3"));
        assert!(!accepts_openmetrics("application/openmetrics-text;q=0"));
        assert!(!accepts_openmetrics("text/plain;version=0.0.4"));
        assert!(!"text/plain, */*".split(',').any(accepts_openmetrics));
    }
}
