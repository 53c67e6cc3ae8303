//! Data collection: the runtimes' datastores (through the reader API) and the host's
//! `/proc`, turned into a `Snapshot` at each look. Rates are over the time since the
//! previous look; a figure with nothing to measure yet is `None`.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use neuron_monitor::host::{CpuStat, MemoryInfo, ProcessCpu, clock_ticks_per_second};
use neuron_runtime::datastore::{CoreSnapshot, DatastoreReader, Delta, Liveness, Snapshot as Counters, discover_new};
use neuron_runtime::memory::{DeviceCategory, HostCategory};
use neuron_runtime::topology::Topology;

use crate::model::{Core, CpuShare, DeviceMemory, HostMemory, Instance, Model, Runtime, Snapshot, System};

/// Utilisation samples kept per core for its history (two minutes at the default refresh).
pub const HISTORY: usize = 120;
/// Looks an exited runtime stays on screen (dimmed) before it is removed.
const EXITED_LOOKS: u32 = 3;

#[derive(Debug)]
struct Followed {
    reader: DatastoreReader,
    pid: u32,
    tag: String,
    /// Counters when first seen, and at the previous look.
    first: Counters,
    previous: Counters,
    cpu: Option<ProcessCpu>,
    history: BTreeMap<u32, VecDeque<f64>>,
    /// Looks since the process was seen to exit.
    exited_looks: Option<u32>,
    /// Not looked at yet since it was found: nothing to measure a rate over.
    fresh: bool,
}

/// Follows every runtime of a datastore directory, and the host.
#[derive(Debug)]
pub struct Collector {
    dir: PathBuf,
    topology: Topology,
    followed: BTreeMap<u32, Followed>,
    host_cpu: Option<CpuStat>,
    ticks_per_second: u64,
    cpus: usize,
}

impl Collector {
    pub fn new(dir: PathBuf, topology: Topology) -> Collector {
        let host_cpu = CpuStat::read().ok();
        let cpus = host_cpu.as_ref().map_or(1, |c| c.cpus.len().max(1));
        Collector {
            dir,
            topology,
            followed: BTreeMap::new(),
            host_cpu,
            ticks_per_second: clock_ticks_per_second(),
            cpus,
        }
    }

    /// Looks at every runtime and the host.
    pub fn sample(&mut self) -> Snapshot {
        self.find_new();
        let system = self.system();
        let mut runtimes = Vec::new();
        for followed in self.followed.values_mut() {
            let now = followed.reader.snapshot();
            if followed.exited_looks.is_none() && matches!(followed.reader.liveness(), Liveness::Exited(_)) {
                followed.exited_looks = Some(0);
            }
            runtimes.push(runtime(followed, &now, self.ticks_per_second, self.cpus, self.topology.cores_per_device()));
            followed.previous = now;
            if let Some(looks) = &mut followed.exited_looks {
                *looks += 1;
            }
        }
        self.followed.retain(|_, f| f.exited_looks.is_none_or(|n| n < EXITED_LOOKS));
        let t = &self.topology;
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
        }
    }

    fn find_new(&mut self) {
        let known = |pid: u32| self.followed.contains_key(&pid);
        let Ok(entries) = discover_new(&self.dir, &known) else { return };
        for entry in entries {
            let Ok(reader) = entry.reader else { continue };
            if matches!(entry.liveness, Some(Liveness::Exited(_))) {
                continue;
            }
            let info = reader.info();
            let (pid, tag) = (info.pid, info.tag.clone().unwrap_or_else(|| info.pid.to_string()));
            let first = reader.snapshot();
            self.followed.insert(
                pid,
                Followed {
                    pid,
                    tag,
                    previous: first.clone(),
                    first,
                    cpu: ProcessCpu::read(pid).ok(),
                    history: BTreeMap::new(),
                    exited_looks: None,
                    fresh: true,
                    reader,
                },
            );
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

fn runtime(f: &mut Followed, now: &Counters, ticks_per_second: u64, cpus: usize, cores_per_device: u32) -> Runtime {
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
            if let Some(u) = utilization {
                history.push_back(u);
                if history.len() > HISTORY {
                    history.pop_front();
                }
            }
            Core {
                index: c.core,
                device: c.core / cores_per_device.max(1),
                utilization,
                flops_per_second: d.filter(|_| measured).map(|d| d.flops_per_second),
                executions_per_second: d.and_then(|d| rate(d.executions.0.iter().sum())),
                latency_p50: d.and_then(|d| d.total_latency.map(|l| l.p50)),
                latency_p99: d.and_then(|d| d.total_latency.map(|l| l.p99)),
                history: history.iter().copied().collect(),
                device_memory: device_memory(|k| c.device_memory(k)),
            }
        })
        .collect();
    let mut errors = [0u64; 6];
    for core in &now.cores {
        let before = f.first.core(core.core);
        for (k, total) in errors.iter_mut().enumerate() {
            *total += core.errors.0[k].saturating_sub(before.map_or(0, |b: &CoreSnapshot| b.errors.0[k]));
        }
    }
    let ring_sum = |s: &Counters, dropped: bool| -> u64 {
        s.rings.iter().map(|r| if dropped { r.dropped } else { r.produced }).sum()
    };
    let cpu_now = ProcessCpu::read(f.pid).ok();
    let vcpu = match (&f.cpu, &cpu_now) {
        (Some(before), Some(now)) if measured => {
            let (user, system) = now.usage_since(before, delta.seconds * ticks_per_second as f64, cpus);
            Some(CpuShare { user, system })
        }
        _ => None,
    };
    if cpu_now.is_some() {
        f.cpu = cpu_now;
    }
    Runtime {
        pid: f.pid,
        tag: f.tag.clone(),
        exited: f.exited_looks.is_some(),
        vcpu,
        cores,
        host_memory: HostMemory {
            application_memory: now.host_memory(HostCategory::ApplicationMemory),
            constants: now.host_memory(HostCategory::Constants),
            dma_buffers: now.host_memory(HostCategory::DmaBuffers),
            tensors: now.host_memory(HostCategory::Tensors),
        },
        models: f
            .reader
            .models()
            .into_iter()
            .map(|m| Model {
                model_id: m.model_id,
                name: m.name,
                core: m.core,
                device_memory: device_memory(|k| m.device_memory[k as usize]),
                host_memory: m.host_memory,
            })
            .collect(),
        errors,
        trace_events_per_second: rate(ring_sum(now, false).saturating_sub(ring_sum(&f.previous, false))),
        trace_events_dropped: ring_sum(now, true).saturating_sub(ring_sum(&f.first, true)),
    }
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
