//! The tables derived from the events: executions, counters and per-execution bounds,
//! gathered while the event tables are written; and the summary's per-HLO bounds,
//! findings and the `profile` row.

use std::collections::HashMap;

use super::columns::{Column, Kind, Table};
use crate::export::{Busy, bucket_width, tensor_bytes};
use crate::model::{ArgValue, Phase, Sym, SystemEvent};
use crate::summary::{DefinedPeaks, Summary};
use crate::{NtffError, NtffFile};

const EXECUTIONS: &[Column] = &[
    ("core", Kind::U32, false),
    ("exec_id", Kind::U64, false),
    ("model_id", Kind::U32, true),
    ("model", Kind::Dict, true),
    ("start", Kind::Time, true),
    ("device_ns", Kind::U64, true),
    ("host_ns", Kind::U64, true),
    ("status", Kind::I32, true),
    ("device_traced", Kind::Bool, false),
];
const COUNTERS: &[Column] = &[
    ("core", Kind::U32, true),
    ("time", Kind::Time, true),
    ("counter", Kind::Dict, false),
    ("unit", Kind::Dict, false),
    ("value", Kind::F64, false),
];
const EXECUTION_BOUNDS: &[Column] = &[
    ("core", Kind::U32, false),
    ("exec_id", Kind::U64, false),
    ("model", Kind::Dict, true),
    ("device_s", Kind::F64, true),
    ("host_s", Kind::F64, true),
    ("pipeline_s", Kind::F64, false),
    ("pipeline_resource", Kind::Dict, false),
    ("compute_s", Kind::F64, true),
    ("compute_engine", Kind::Dict, true),
    ("memory_s", Kind::F64, true),
    ("flops", Kind::U64, false),
    ("dma_bytes", Kind::U64, false),
];
const HLO_BOUNDS: &[Column] = &[
    ("hlo", Kind::Text, false),
    ("engine", Kind::Dict, false),
    ("instructions", Kind::U64, false),
    ("time_s", Kind::F64, false),
    ("percent", Kind::F64, false),
    ("flops", Kind::U64, false),
    ("bytes", Kind::U64, false),
    ("intensity", Kind::F64, true),
    ("achieved_flops_per_s", Kind::F64, true),
    ("achieved_bytes_per_s", Kind::F64, true),
    ("bound", Kind::Dict, true),
    ("roofline_percent", Kind::F64, true),
];
const FINDINGS: &[Column] = &[
    ("rank", Kind::U32, false),
    ("kind", Kind::Dict, false),
    ("about", Kind::Text, false),
    ("text", Kind::Text, false),
    ("evidence", Kind::Text, false),
    ("saves_s", Kind::F64, false),
    ("saves_percent", Kind::F64, false),
    ("suggestion", Kind::Text, true),
];
const PROFILE: &[Column] = &[
    ("tool", Kind::Text, false),
    ("runtime_version", Kind::Text, false),
    ("capture_kind", Kind::Text, false),
    ("capture_time", Kind::TimeUs, true),
    ("instance_type", Kind::Text, false),
    ("process_tag", Kind::Text, false),
    ("command", Kind::Text, false),
    ("system_events", Kind::U64, false),
    ("device_events", Kind::U64, false),
    ("lost_in_rings", Kind::U64, false),
    ("lost_in_file", Kind::U64, false),
    ("recovered", Kind::Bool, false),
    ("file_problems", Kind::Text, true),
    ("pe_peak_flops_per_s", Kind::F64, true),
    ("vector_peak_flops_per_s", Kind::F64, true),
    ("memory_peak_bytes_per_s", Kind::F64, true),
    ("dma_peak_bytes_per_s", Kind::F64, true),
];

/// Positions in the tables' full column lists (the three file columns first) of the
/// columns the writers key.
const EXE_MODEL: usize = 6;
const CNT_COUNTER: usize = 5;
const CNT_UNIT: usize = 6;
const EB_MODEL: usize = 5;
const EB_RESOURCE: usize = 9;
const EB_ENGINE: usize = 11;
const HB_ENGINE: usize = 4;
const HB_BOUND: usize = 13;
const FI_KIND: usize = 4;

pub(super) fn columns_of(table: &str) -> &'static [Column] {
    match table {
        "executions" => EXECUTIONS,
        "counters" => COUNTERS,
        "execution_bounds" => EXECUTION_BOUNDS,
        "hlo_bounds" => HLO_BOUNDS,
        "findings" => FINDINGS,
        "profile" => PROFILE,
        other => unreachable!("no table {other}"),
    }
}

/// An execution of a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ExecKey {
    pub(super) core: u32,
    pub(super) exec: u64,
}

#[derive(Default)]
struct Execution {
    model_id: Option<u32>,
    /// Host time of its `nc_exec_running` start, else of its `nrt_execute` start.
    start: Option<u64>,
    execute_start: Option<u64>,
    device_ns: Option<u64>,
    host_ns: Option<u64>,
    status: Option<i32>,
    /// Per resource: busy nanoseconds, and FLOPs (engines) or bytes (DMA queues).
    work: Vec<(u64, u64)>,
}

/// A counter value, written at the end.
struct CounterValue {
    core: Option<u32>,
    time: Option<u64>,
    counter: &'static str,
    unit: &'static str,
    value: f64,
}

/// An open `nrt_execute` (true) or `nc_exec_running` span: its core and tracking id.
type OpenSpan = (Option<u32>, u64, bool);
/// Its start: timestamp, host time, execution.
type SpanStart = (u64, Option<u64>, Option<u64>);

/// What the derived tables gather while the events go by.
pub(super) struct Derived<'a> {
    file: &'a NtffFile,
    execute: Option<Sym>,
    running: Option<Sym>,
    allocate: Option<Sym>,
    free: Option<Sym>,
    status: Option<Sym>,
    open: HashMap<OpenSpan, SpanStart>,
    index: HashMap<ExecKey, usize>,
    executions: Vec<(ExecKey, Execution)>,
    last: Option<(ExecKey, usize)>,
    /// Engines and DMA queues (`DMA <queue>`), and whether each is an engine.
    resources: Vec<(String, bool)>,
    busy: HashMap<u32, Busy>,
    origin: u64,
    width: u64,
    memory: HashMap<Option<u32>, i64>,
    lost: HashMap<Option<u32>, u64>,
    counters: Vec<CounterValue>,
    values: Vec<(u64, f64)>,
}

impl<'a> Derived<'a> {
    pub(super) fn new(file: &'a NtffFile, cores: Option<&[u32]>) -> Derived<'a> {
        let spans: Vec<(u64, u64)> = file.select(cores, None).filter_map(|c| c.host_span).collect();
        let origin = spans.iter().map(|s| s.0).min().unwrap_or(0);
        let last = spans.iter().map(|s| s.1).max().unwrap_or(origin);
        Derived {
            file,
            execute: file.find_string("nrt_execute"),
            running: file.find_string("nc_exec_running"),
            allocate: file.find_string("nrt_tensor_allocate"),
            free: file.find_string("nrt_tensor_free"),
            status: file.find_string("status"),
            open: HashMap::new(),
            index: HashMap::new(),
            executions: Vec::new(),
            last: None,
            resources: Vec::new(),
            busy: HashMap::new(),
            origin,
            width: bucket_width(last.saturating_sub(origin)),
            memory: HashMap::new(),
            lost: HashMap::new(),
            counters: Vec::new(),
            values: Vec::new(),
        }
    }

    /// The resource index of an engine.
    pub(super) fn engine(&mut self, name: &str) -> usize {
        self.resource(name.to_string(), true)
    }

    /// The resource index of a DMA queue.
    pub(super) fn queue(&mut self, name: &str) -> usize {
        self.resource(format!("DMA {name}"), false)
    }

    fn resource(&mut self, name: String, engine: bool) -> usize {
        if let Some(k) = self.resources.iter().position(|r| r.0 == name) {
            return k;
        }
        self.resources.push((name, engine));
        self.resources.len() - 1
    }

    fn execution(&mut self, key: ExecKey) -> &mut Execution {
        let k = match self.last {
            Some((last, k)) if last == key => k,
            _ => {
                let next = self.executions.len();
                let k = *self.index.entry(key).or_insert(next);
                if k == next {
                    self.executions.push((key, Execution::default()));
                }
                self.last = Some((key, k));
                k
            }
        };
        &mut self.executions[k].1
    }

    /// Work of a device event: busy time on `resource`, and its FLOPs or bytes.
    pub(super) fn device_work(&mut self, key: ExecKey, resource: usize, ns: u64, amount: u64) {
        let resources = self.resources.len();
        let work = &mut self.execution(key).work;
        if work.len() < resources {
            work.resize(resources, (0, 0));
        }
        work[resource].0 = work[resource].0.saturating_add(ns);
        work[resource].1 = work[resource].1.saturating_add(amount);
    }

    /// Follows executions, busy time and tensor memory; `host` is the event's host time.
    pub(super) fn system_event(&mut self, e: &SystemEvent, host: Option<u64>) {
        let name = Some(e.name);
        if name == self.execute || name == self.running {
            self.span(e, host, name == self.execute);
        } else if (name == self.allocate || name == self.free)
            && let Some(change) = tensor_bytes(self.file, e, name == self.allocate)
        {
            let total = self.memory.entry(e.core).or_default();
            *total = total.saturating_add(change);
            let value = *total as f64;
            let counter = if e.core.is_some() { "tensor memory" } else { "host tensor memory" };
            self.counters.push(CounterValue { core: e.core, time: host, counter, unit: "bytes", value });
        }
    }

    fn span(&mut self, e: &SystemEvent, host: Option<u64>, execute: bool) {
        let key = (e.core, e.tracking_id, execute);
        match e.phase {
            Phase::Start => {
                self.open.insert(key, (e.timestamp_ns, host, e.exec_id));
            }
            Phase::Stop => {
                let Some((start, start_host, start_exec)) = self.open.remove(&key) else { return };
                let (Some(core), Some(exec)) = (e.core, e.exec_id.or(start_exec)) else { return };
                let ns = e.timestamp_ns.saturating_sub(start);
                let status = e.args.iter().find_map(|a| match a.value {
                    ArgValue::I64(v) if Some(a.key) == self.status => i32::try_from(v).ok(),
                    _ => None,
                });
                let x = self.execution(ExecKey { core, exec });
                x.model_id = x.model_id.or(e.model_id);
                x.status = x.status.or(status);
                if execute {
                    x.host_ns = Some(ns);
                    x.execute_start = start_host;
                } else {
                    x.device_ns = Some(ns);
                    x.start = start_host;
                    if let Some(start) = start_host {
                        let (origin, width) = (self.origin, self.width);
                        let busy = self.busy.entry(core).or_insert_with(|| Busy::new(origin, width));
                        busy.add(start, start.saturating_add(ns), &mut self.values);
                        self.utilisation(core);
                    }
                }
            }
            Phase::Instant => {}
        }
    }

    fn utilisation(&mut self, core: u32) {
        for (time, value) in self.values.drain(..) {
            self.counters.push(CounterValue {
                core: Some(core),
                time: Some(time),
                counter: "utilisation",
                unit: "percent",
                value,
            });
        }
    }

    /// Events a ring dropped: the core's running total of lost events.
    pub(super) fn loss(&mut self, core: Option<u32>, events: u64, time: Option<u64>) {
        let total = self.lost.entry(core).or_default();
        *total = total.saturating_add(events);
        let value = *total as f64;
        self.counters.push(CounterValue { core, time, counter: "events lost", unit: "events", value });
    }

    /// Writes the derived tables, each created by `create`.
    pub(super) fn finish(
        mut self,
        summary: &Summary,
        mut create: impl FnMut(&'static str) -> Result<Table, NtffError>,
        pid: u32,
        wall: &dyn Fn(u64) -> Option<i64>,
        problems: &[String],
    ) -> Result<Vec<(&'static str, Table)>, NtffError> {
        let mut cores: Vec<u32> = self.busy.keys().copied().collect();
        cores.sort_unstable();
        for core in cores {
            if let Some(busy) = self.busy.get_mut(&core) {
                busy.finish(&mut self.values);
            }
            self.utilisation(core);
        }
        let models: HashMap<u32, &str> = self.file.models().iter().map(|m| (m.model_id, m.name.as_str())).collect();
        let mut out = Vec::new();

        let mut t = create("profile")?;
        self.profile_row(summary, &mut t, pid, problems)?;
        out.push(("profile", t));

        let mut t = create("counters")?;
        for c in &self.counters {
            let (counter, unit) = (t.key(CNT_COUNTER, c.counter), t.key(CNT_UNIT, c.unit));
            t.row(|r| {
                r.constant()
                    .u32(Some(pid))
                    .constant()
                    .u32(c.core)
                    .time(c.time.and_then(wall))
                    .key(Some(counter))
                    .key(Some(unit))
                    .f64(Some(c.value));
            })?;
        }
        out.push(("counters", t));

        self.executions.sort_by_key(|x| x.0);
        let mut t = create("executions")?;
        for (key, x) in &self.executions {
            let model = x.model_id.and_then(|m| models.get(&m)).map(|m| t.key(EXE_MODEL, m));
            t.row(|r| {
                r.constant()
                    .u32(Some(pid))
                    .constant()
                    .u32(Some(key.core))
                    .u64(Some(key.exec))
                    .u32(x.model_id)
                    .key(model)
                    .time(x.start.or(x.execute_start).and_then(wall))
                    .u64(x.device_ns)
                    .u64(x.host_ns)
                    .i32(x.status)
                    .bool(!x.work.is_empty());
            })?;
        }
        out.push(("executions", t));

        let mut t = create("execution_bounds")?;
        self.execution_bounds(summary, &mut t, pid, &models)?;
        out.push(("execution_bounds", t));

        let mut t = create("hlo_bounds")?;
        for h in &summary.hlo_instructions {
            let engine = t.key(HB_ENGINE, &h.engine);
            let bound = h.bound.as_deref().map(|b| t.key(HB_BOUND, b));
            t.row(|r| {
                r.constant()
                    .u32(Some(pid))
                    .constant()
                    .text(Some(&h.hlo))
                    .key(Some(engine))
                    .u64(Some(h.instructions))
                    .f64(Some(h.time_s))
                    .f64(Some(h.percent))
                    .u64(Some(h.flops))
                    .u64(Some(h.bytes))
                    .f64(h.intensity)
                    .f64(h.achieved_flops_per_s)
                    .f64(h.achieved_bytes_per_s)
                    .key(bound)
                    .f64(h.roofline_percent);
            })?;
        }
        out.push(("hlo_bounds", t));

        let mut t = create("findings")?;
        for (rank, f) in summary.findings.iter().enumerate() {
            let kind = t.key(FI_KIND, &f.kind);
            t.row(|r| {
                r.constant()
                    .u32(Some(pid))
                    .constant()
                    .u32(Some(rank as u32 + 1))
                    .key(Some(kind))
                    .text(Some(&f.about))
                    .text(Some(&f.text))
                    .text(Some(&f.evidence))
                    .f64(Some(f.saves_s))
                    .f64(Some(f.saves_percent))
                    .text(f.suggestion.as_deref());
            })?;
        }
        out.push(("findings", t));
        Ok(out)
    }

    /// The bounds of each execution with a device trace, as the summary defines them
    /// over all of them (`ntff::summary::Bounds`).
    fn execution_bounds(
        &self,
        summary: &Summary,
        t: &mut Table,
        pid: u32,
        models: &HashMap<u32, &str>,
    ) -> Result<(), NtffError> {
        let peaks = DefinedPeaks::of_metadata(self.file.metadata());
        let dma_peak = summary.bounds.as_ref().and_then(|b| b.dma_peak_bytes_per_s);
        for (key, x) in self.executions.iter().filter(|x| !x.1.work.is_empty()) {
            let device_s = x.device_ns.map(|ns| ns as f64 / 1e9);
            let busiest = x.work.iter().enumerate().max_by_key(|w| w.1.0).map(|w| w.0).unwrap_or(0);
            let pipeline_s = x.work.get(busiest).map_or(0.0, |w| w.0 as f64 / 1e9);
            let pipeline_s = device_s.map_or(pipeline_s, |d| pipeline_s.min(d));
            let compute = x
                .work
                .iter()
                .zip(&self.resources)
                .filter(|(_, r)| r.1)
                .filter_map(|(w, r)| Some((r.0.as_str(), w.1 as f64 / peaks.of(&r.0)?)))
                .max_by(|a, b| a.1.total_cmp(&b.1));
            let sum = |engine: bool| -> u64 {
                x.work
                    .iter()
                    .zip(&self.resources)
                    .filter(|(_, r)| r.1 == engine)
                    .fold(0u64, |a, (w, _)| a.saturating_add(w.1))
            };
            let (flops, dma_bytes) = (sum(true), sum(false));
            let memory_s = dma_peak.filter(|p| *p > 0.0).map(|p| dma_bytes as f64 / p);
            let model = x.model_id.and_then(|m| models.get(&m)).map(|m| t.key(EB_MODEL, m));
            let resource = t.key(EB_RESOURCE, self.resources.get(busiest).map_or("", |r| r.0.as_str()));
            let engine = compute.map(|c| t.key(EB_ENGINE, c.0));
            t.row(|r| {
                r.constant()
                    .u32(Some(pid))
                    .constant()
                    .u32(Some(key.core))
                    .u64(Some(key.exec))
                    .key(model)
                    .f64(device_s)
                    .f64(x.host_ns.map(|ns| ns as f64 / 1e9))
                    .f64(Some(pipeline_s))
                    .key(Some(resource))
                    .f64(compute.map(|c| c.1))
                    .key(engine)
                    .f64(memory_s)
                    .u64(Some(flops))
                    .u64(Some(dma_bytes));
            })?;
        }
        Ok(())
    }

    fn profile_row(&self, summary: &Summary, t: &mut Table, pid: u32, problems: &[String]) -> Result<(), NtffError> {
        let meta = self.file.metadata();
        let s = summary;
        let positive = |v: f64| (v > 0.0).then_some(v);
        let capture = i64::try_from(meta.capture_unix_ns).ok().filter(|&t| t > 0);
        let problems = (!problems.is_empty()).then(|| problems.join("; "));
        t.row(|r| {
            r.constant()
                .u32(Some(pid))
                .constant()
                .text(Some(&meta.tool))
                .text(Some(&meta.runtime_version))
                .text(Some(&meta.capture_kind))
                .time(capture)
                .text(Some(&meta.instance_type))
                .text(Some(&meta.process_tag))
                .text(Some(&meta.command.join(" ")))
                .u64(Some(s.events.system))
                .u64(Some(s.events.device))
                .u64(Some(s.events.lost_in_rings))
                .u64(Some(s.events.lost_in_file))
                .bool(!self.file.recovery().is_clean())
                .text(problems.as_deref())
                .f64(positive(meta.defined_pe_flops_per_core))
                .f64(positive(meta.defined_vector_flops_per_core))
                .f64(positive(meta.peak_memory_bytes_per_s))
                .f64(s.bounds.as_ref().and_then(|b| b.dma_peak_bytes_per_s));
        })
    }
}
