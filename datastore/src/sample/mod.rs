//! The figures the live viewers draw (`neuron-top`, the dashboard's live page): every
//! runtime's datastore and the host's `/proc`, turned into a [`Snapshot`] of plain
//! records ([`model`]) at each look. Rates are over the time since the previous look;
//! a figure with nothing to measure yet is `None`.

pub mod model;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::follow::{Followed, Runtimes};
use crate::host::{CpuStat, MemoryInfo, ProcessCpu, clock_ticks_per_second};
use crate::kinds::{DeviceCategory, ExecOutcome, HostCategory};
use crate::ranks::{RuntimeRecords, StragglerRule, group_views, root_now};
use crate::reader::{Delta, Snapshot as Counters};
use crate::topology::{InstanceType, Topology};
use model::{Core, CpuShare, DeviceMemory, HostMemory, Instance, Model, Runtime, Snapshot, System};

/// Outcomes of executions that ran: not those refused as incorrect input or not queued.
const RAN: [ExecOutcome; 4] =
    [ExecOutcome::Completed, ExecOutcome::CompletedWithErr, ExecOutcome::CompletedWithNumErr, ExecOutcome::TimedOut];

/// Utilisation samples kept per core for its history (two minutes at the default refresh).
pub const HISTORY: usize = 120;
/// How long an exited runtime stays on screen (dimmed) before it is removed, at least
/// one look.
const EXITED_FOR: Duration = Duration::from_secs(3);

/// What the collector keeps per runtime between looks.
#[derive(Debug)]
struct Seen {
    tag: String,
    command: String,
    /// The instance the runtime runs on, as it says.
    topology: Option<Topology>,
    /// Counters at the previous look.
    previous: Counters,
    /// The models at the previous look, by id.
    previous_models: BTreeMap<u32, crate::ModelInfo>,
    cpu: Option<ProcessCpu>,
    /// Its CPU share as last measured (shown again while its reading is the same).
    vcpu: Option<CpuShare>,
    history: BTreeMap<u32, CoreHistory>,
    /// PE's defined peak of one of its cores, in FLOP/s (see [`crate::peaks`]).
    peak_flops_per_core: Option<f64>,
    /// Not looked at yet since it was found: nothing to measure a rate over.
    fresh: bool,
}

/// Follows every runtime of a datastore directory, and the host.
#[derive(Debug)]
pub struct Collector {
    /// The instance when no runtime says which it runs on.
    topology: Topology,
    runtimes: Runtimes<Seen>,
    host_cpu: Option<CpuStat>,
    ticks_per_second: u64,
    cpus: usize,
    /// When a rank is named a straggler, or why the environment's rule was refused.
    straggler_rule: Result<StragglerRule, String>,
}

impl Collector {
    pub fn new(dir: PathBuf, topology: Topology) -> Collector {
        let host_cpu = CpuStat::read().ok();
        let cpus = host_cpu.as_ref().map_or(1, |c| c.cpus.len().max(1));
        Collector {
            topology,
            runtimes: Runtimes::new(dir),
            host_cpu,
            ticks_per_second: clock_ticks_per_second(),
            cpus,
            straggler_rule: StragglerRule::from_env(),
        }
    }

    /// Looks at every runtime and the host.
    pub fn sample(&mut self) -> Snapshot {
        // Runtimes shown as exited at the last look have had their time.
        self.runtimes.forget_exited(EXITED_FOR);
        let mut warnings = self.find_new();
        let system = self.system();
        self.runtimes.mark_exited();
        let mut runtimes = Vec::new();
        for followed in self.runtimes.iter_mut() {
            let now = followed.reader.snapshot();
            let cores_per_device = followed.state.topology.as_ref().unwrap_or(&self.topology).cores_per_device();
            runtimes.push(runtime(followed, &now, self.ticks_per_second, self.cpus, cores_per_device));
            followed.state.previous = now;
        }
        let readers: Vec<_> = self.runtimes.iter().map(|f| (&f.reader, f.liveness)).collect();
        let records = RuntimeRecords::read_all(&readers);
        let rule = self.straggler_rule.clone().unwrap_or_else(|refused| {
            warnings.push(format!("{refused}; the default straggler rule applies"));
            StragglerRule::default()
        });
        let ranks = group_views(&records, &rule, root_now(&records));
        let declared = Topology::declared(self.runtimes.iter().map(|f| f.reader.info().instance_type.as_str()));
        let t = declared.as_ref().unwrap_or(&self.topology);
        Snapshot {
            time: utc_time(),
            instance: Instance {
                instance_type: t.instance_type.to_string(),
                device_count: t.device_count,
                cores_per_device: t.cores_per_device(),
                core_version: format!("{:?}", t.core_version).to_lowercase(),
            },
            system,
            runtimes,
            ranks,
            warnings,
        }
    }

    /// Starts following the runtimes that appeared; what could not be read.
    fn find_new(&mut self) -> Vec<String> {
        let admit = |reader: &crate::DatastoreReader, label: &str| {
            let info = reader.info();
            Some(Seen {
                tag: label.to_owned(),
                command: info.command.shell_line(),
                topology: info.instance_type.parse::<InstanceType>().ok().map(|t| t.topology()),
                previous: reader.snapshot(),
                previous_models: BTreeMap::new(),
                cpu: ProcessCpu::read(info.pid).ok(),
                vcpu: None,
                history: BTreeMap::new(),
                peak_flops_per_core: (info.host_threads > 0)
                    .then(crate::peaks::HostVector::detect)
                    .flatten()
                    .map(|host| host.peaks(info.host_threads, info.product_kernel).pe_flops),
                fresh: true,
            })
        };
        match self.runtimes.discover(admit) {
            Ok(failures) => {
                failures.into_iter().map(|f| format!("cannot read the runtime of pid {}: {}", f.pid, f.error)).collect()
            }
            Err(e) => vec![format!("cannot list the runtimes: {e}")],
        }
    }

    fn system(&mut self) -> System {
        let now = CpuStat::read().ok();
        let vcpu = match (&self.host_cpu, &now) {
            (Some(before), Some(now)) if now.all.total() > before.all.total() => {
                let u = now.all.usage_since(&before.all);
                Some(CpuShare { user: u.user + u.nice, system: u.system + u.io_wait + u.irq + u.soft_irq })
            }
            _ => None,
        };
        if now.is_some() {
            self.host_cpu = now;
        }
        let memory = MemoryInfo::read().ok();
        System {
            vcpu,
            memory_total_bytes: memory.map(|m| m.memory_total_bytes),
            memory_used_bytes: memory.map(|m| m.memory_used_bytes),
        }
    }
}

/// The last [`HISTORY`] measured intervals of one core, oldest first.
#[derive(Debug, Default)]
struct CoreHistory {
    utilization: VecDeque<f64>,
    flops: VecDeque<f64>,
    latency_p50: VecDeque<Option<f64>>,
}

impl CoreHistory {
    fn push(&mut self, (utilization, flops, latency_p50): (f64, f64, Option<f64>)) {
        self.utilization.push_back(utilization);
        self.flops.push_back(flops);
        self.latency_p50.push_back(latency_p50);
        if self.utilization.len() > HISTORY {
            self.utilization.pop_front();
            self.flops.pop_front();
            self.latency_p50.pop_front();
        }
    }
}

fn runtime(
    followed: &mut Followed<Seen>,
    now: &Counters,
    ticks_per_second: u64,
    cpus: usize,
    cores_per_device: u32,
) -> Runtime {
    let (pid, exited, reader) = (followed.pid, followed.exited(), &followed.reader);
    // The CPU time this look's liveness read already took.
    let cpu_now = followed.cpu;
    let state = if exited { "exited" } else { followed.liveness.word() };
    let f = &mut followed.state;
    let delta = Delta::between(&f.previous, now);
    let measured = delta.seconds > 0.0 && !std::mem::take(&mut f.fresh);
    let rate = |n: u64| measured.then(|| n as f64 / delta.seconds);
    let cores = now
        .cores
        .iter()
        .map(|c| {
            let d = delta.cores.iter().find(|d| d.core == c.core);
            let utilization = d.filter(|_| measured).map(|d| d.utilization_percent);
            let history = f.history.entry(c.core).or_default();
            let flops_per_second = d.filter(|_| measured).map(|d| d.flops_per_second);
            let latency_p50 = d.and_then(|d| d.total_latency.map(|l| l.p50));
            if let Some(u) = utilization {
                history.push((u, flops_per_second.unwrap_or(0.0), latency_p50));
            }
            Core {
                index: c.core,
                device: c.core / cores_per_device.max(1),
                utilization,
                flops_per_second,
                executions_per_second: d.and_then(|d| rate(RAN.iter().map(|&o| d.executions.get(o)).sum())),
                latency_p50,
                latency_p99: d.and_then(|d| d.total_latency.map(|l| l.p99)),
                history: history.utilization.iter().copied().collect(),
                flops_history: history.flops.iter().copied().collect(),
                latency_history: history.latency_p50.iter().copied().collect(),
                device_memory: device_memory(|k| c.device_memory(k)),
            }
        })
        .collect();
    let mut errors = [0u64; 6];
    for core in &now.cores {
        for (total, n) in errors.iter_mut().zip(core.errors.0) {
            *total += n;
        }
    }
    let ring_sum = |s: &Counters, dropped: bool| -> u64 {
        s.rings.iter().map(|r| if dropped { r.dropped } else { r.produced }).sum()
    };
    let vcpu = match (&f.cpu, &cpu_now) {
        (Some(before), Some(now)) if measured => match now.seconds_since(before) {
            // The same reading as the last look's: the figure measured last.
            Some(seconds) if seconds <= 0.0 => f.vcpu,
            seconds => {
                let seconds = seconds.unwrap_or(delta.seconds);
                let (user, system) = now.usage_since(before, seconds * ticks_per_second as f64, cpus);
                Some(CpuShare { user, system })
            }
        },
        _ => None,
    };
    // A new reading becomes the next look's baseline.
    if cpu_now.is_some_and(|now| f.cpu.is_none_or(|before| now.at_ns != before.at_ns || now.at_ns == 0)) {
        f.cpu = cpu_now;
    }
    f.vcpu = vcpu;
    Runtime {
        pid,
        tag: f.tag.clone(),
        command: f.command.clone(),
        exited,
        state,
        vcpu,
        cores,
        resident_bytes: crate::host::resident_bytes(pid),
        host_memory: HostMemory {
            application_memory: now.host_memory(HostCategory::ApplicationMemory),
            constants: now.host_memory(HostCategory::Constants),
            dma_buffers: now.host_memory(HostCategory::DmaBuffers),
            tensors: now.host_memory(HostCategory::Tensors),
        },
        models: models(reader.models(), &mut f.previous_models, measured.then_some(delta.seconds)),
        errors,
        trace_events_per_second: rate(ring_sum(now, false).saturating_sub(ring_sum(&f.previous, false))),
        trace_events_dropped: ring_sum(now, true),
        peak_flops_per_core: f.peak_flops_per_core,
    }
}

/// The loaded models, with their rates and latency since the previous look (`seconds`
/// ago; `None` for a first look), which `previous` is then replaced by.
fn models(
    now: Vec<crate::ModelInfo>,
    previous: &mut BTreeMap<u32, crate::ModelInfo>,
    seconds: Option<f64>,
) -> Vec<Model> {
    let models = now
        .iter()
        .map(|m| {
            let before = previous.get(&m.model_id);
            let measured = seconds.filter(|&s| s > 0.0).zip(before);
            let latency = measured.and_then(|_| m.latency_since(before));
            Model {
                model_id: m.model_id,
                name: m.name.clone(),
                core: m.core,
                device_memory: device_memory(|k| m.device_memory[k as usize]),
                host_memory: m.host_memory,
                executions: m.executions,
                executions_per_second: measured.map(|(s, b)| m.executions.saturating_sub(b.executions) as f64 / s),
                latency_p50: latency.map(|l| l.p50),
                latency_p99: latency.map(|l| l.p99),
            }
        })
        .collect();
    *previous = now.into_iter().map(|m| (m.model_id, m)).collect();
    models
}

fn device_memory(bytes: impl Fn(DeviceCategory) -> u64) -> DeviceMemory {
    DeviceMemory {
        tensors: bytes(DeviceCategory::Tensors),
        constants: bytes(DeviceCategory::Constants),
        model_code: bytes(DeviceCategory::ModelCode),
        runtime_memory: bytes(DeviceCategory::RuntimeMemory),
        model_shared_scratchpad: bytes(DeviceCategory::ModelSharedScratchpad),
    }
}

/// `HH:MM:SSZ` (UTC).
fn utc_time() -> String {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) % 86_400;
    format!("{:02}:{:02}:{:02}Z", seconds / 3600, seconds / 60 % 60, seconds % 60)
}
