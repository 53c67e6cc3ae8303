//! `neuron-monitor`'s metric groups, in the JSON shapes of the Neuron tool's report:
//! built from two samples of a runtime process (its datastore snapshot, loaded models
//! and CPU time) or of the host, taken a period apart. Counts are per period; levels
//! (memory) are the later sample's.

use neuron_datastore::{DeviceCategory, HostCategory};
use neuron_datastore::{ErrorClass, ExecOutcome};
use neuron_datastore::{LatencyPercentiles, ModelInfo, Snapshot, latency_of_all_cores};
use serde_json::{Map, Value, json};

use crate::config::{RuntimeGroup, SystemGroup};
use neuron_datastore::host::{CpuStat, MemoryInfo, ProcessCpu};

/// One look at a runtime process.
#[derive(Debug, Clone)]
pub struct RuntimeSample {
    pub snapshot: Snapshot,
    pub models: Vec<ModelInfo>,
    /// `None` when `/proc/PID/stat` could not be read (the process is gone).
    pub cpu: Option<ProcessCpu>,
}

impl RuntimeSample {
    /// The process as it was when it started, at host monotonic time `taken_ns`: no
    /// execution, error or ECC event yet. A process that starts while the monitor runs
    /// is measured from this, so that its first period counts all it did.
    pub fn at_start(&self, taken_ns: u64) -> RuntimeSample {
        let mut snapshot = self.snapshot.clone();
        snapshot.taken_ns = taken_ns.min(snapshot.taken_ns);
        for core in &mut snapshot.cores {
            core.busy_ns = 0;
            core.executions.0 = [0; 6];
            core.errors.0 = [0; 6];
            core.flops = 0;
            core.dma_bytes = [0; 4];
            core.instructions = 0;
            core.model_switches = 0;
            core.numerical_error_values = 0;
            core.collectives = 0;
            core.collectives_ns = 0;
            core.device_latency.iter_mut().for_each(|n| *n = 0);
            core.total_latency.iter_mut().for_each(|n| *n = 0);
        }
        snapshot.ecc.iter_mut().for_each(|d| *d = [0; 4]);
        for ring in &mut snapshot.rings {
            ring.produced = 0;
            ring.dropped = 0;
        }
        RuntimeSample { snapshot, models: self.models.clone(), cpu: Some(ProcessCpu::default()) }
    }
}

/// One look at the host.
#[derive(Debug, Clone)]
pub struct HostSample {
    /// Host `CLOCK_MONOTONIC` nanoseconds when taken.
    pub taken_ns: u64,
    pub cpu: Result<CpuStat, String>,
    pub memory: Result<MemoryInfo, String>,
}

/// How to turn CPU ticks into shares.
#[derive(Debug, Clone, Copy)]
pub struct CpuClock {
    pub ticks_per_second: u64,
    pub cpus: usize,
}

/// A metric group of a runtime process between two samples.
pub fn runtime_group(
    group: RuntimeGroup,
    earlier: &RuntimeSample,
    later: &RuntimeSample,
    cores_per_device: u32,
    clock: CpuClock,
) -> Value {
    let seconds = later.snapshot.taken_ns.saturating_sub(earlier.snapshot.taken_ns) as f64 / 1e9;
    let mut out = Map::new();
    out.insert("period".into(), json!(seconds));
    out.insert("error".into(), json!(""));
    let (a, b) = (&earlier.snapshot, &later.snapshot);
    match group {
        RuntimeGroup::NeuroncoreCounters => {
            let delta = neuron_datastore::Delta::between(a, b);
            let cores: Map<String, Value> = delta
                .cores
                .iter()
                .map(|c| {
                    let counters =
                        json!({"neuroncore_utilization": c.utilization_percent, "flops": c.flops_per_second});
                    (c.core.to_string(), counters)
                })
                .collect();
            out.insert("neuroncores_in_use".into(), Value::Object(cores));
        }
        RuntimeGroup::ExecutionStats => {
            let delta = neuron_datastore::Delta::between(a, b);
            let errors: Map<String, Value> = ErrorClass::ALL
                .iter()
                .map(|&class| {
                    (class.name().to_string(), json!(delta.cores.iter().map(|c| c.errors.get(class)).sum::<u64>()))
                })
                .collect();
            let outcomes: Map<String, Value> = ExecOutcome::ALL
                .iter()
                .map(|&outcome| {
                    (
                        outcome.name().to_string(),
                        json!(delta.cores.iter().map(|c| c.executions.get(outcome)).sum::<u64>()),
                    )
                })
                .collect();
            out.insert("error_summary".into(), Value::Object(errors));
            out.insert("execution_summary".into(), Value::Object(outcomes));
            out.insert(
                "latency_stats".into(),
                json!({
                    "total_latency": percentiles(latency_of_all_cores(a, b, false)),
                    "device_latency": percentiles(latency_of_all_cores(a, b, true)),
                }),
            );
            // Our extension: each loaded model's executions and latency in the period
            // (the core's figures mix the models that share it).
            let models: Vec<Value> = later
                .models
                .iter()
                .map(|m| {
                    let before = earlier.models.iter().find(|e| e.model_id == m.model_id);
                    json!({
                        "name": m.name,
                        "model_id": m.model_id,
                        "neuroncore": m.core,
                        "executions": m.executions.saturating_sub(before.map_or(0, |b| b.executions)),
                        "total_latency": percentiles(m.latency_since(before)),
                    })
                })
                .collect();
            out.insert("model_stats".into(), Value::Array(models));
        }
        RuntimeGroup::MemoryUsed => {
            out.insert("neuron_runtime_used_bytes".into(), used_bytes(b));
            let models: Vec<Value> = later.models.iter().map(|m| loaded_model(m, cores_per_device)).collect();
            out.insert("loaded_models".into(), Value::Array(models));
        }
        RuntimeGroup::NeuronRuntimeVcpuUsage => {
            match (&earlier.cpu, &later.cpu) {
                (Some(before), Some(now)) if now.seconds_since(before) == Some(0.0) => {
                    out.insert("vcpu_usage".into(), json!({"user": 0.0, "system": 0.0}));
                    out.insert(
                    "error".into(),
                    json!("no new reading of the process's CPU time in this period (the runtime reads it every 250 ms)"),
                );
                }
                (Some(before), Some(now)) => {
                    let ticks = now.seconds_since(before).unwrap_or(seconds) * clock.ticks_per_second as f64;
                    let (user, system) = now.usage_since(before, ticks, clock.cpus);
                    out.insert("vcpu_usage".into(), json!({"user": user, "system": system}));
                }
                _ => {
                    out.insert("vcpu_usage".into(), json!({"user": 0.0, "system": 0.0}));
                    out.insert("error".into(), json!("the process's CPU time could not be read"));
                }
            }
        }
    }
    Value::Object(out)
}

fn percentiles(p: Option<LatencyPercentiles>) -> Value {
    match p {
        Some(p) => {
            json!({"p0": p.p0, "p1": p.p1, "p25": p.p25, "p50": p.p50, "p75": p.p75, "p99": p.p99, "p100": p.p100})
        }
        None => Value::Null,
    }
}

fn host_breakdown(bytes: impl Fn(HostCategory) -> u64) -> Value {
    Value::Object(HostCategory::ALL.iter().map(|&c| (c.name().to_string(), json!(bytes(c)))).collect())
}

/// `neuron_runtime_used_bytes`: host memory by category, device memory per core.
fn used_bytes(snapshot: &Snapshot) -> Value {
    let host: u64 = snapshot.host_memory.iter().sum();
    let device: u64 = snapshot.cores.iter().flat_map(|c| c.device_memory.iter()).sum();
    let per_core: Map<String, Value> = snapshot
        .cores
        .iter()
        .map(|c| {
            let categories: Map<String, Value> =
                DeviceCategory::ALL.iter().map(|&d| (d.name().to_string(), json!(c.device_memory(d)))).collect();
            (c.core.to_string(), Value::Object(categories))
        })
        .collect();
    json!({
        "host": host,
        "neuron_device": device,
        "usage_breakdown": {
            "host": host_breakdown(|c| snapshot.host_memory(c)),
            "neuroncore_memory_usage": per_core,
        },
    })
}

/// A `loaded_models` entry: the model as one subgraph on its core.
fn loaded_model(m: &ModelInfo, cores_per_device: u32) -> Value {
    let device: u64 = m.device_memory.iter().sum();
    let device_category = |c: DeviceCategory| m.device_memory[c as usize];
    json!({
        "name": m.name,
        "uuid": m.uuid.simple().to_string(),
        "model_id": m.model_id,
        "is_running": m.running > 0,
        "subgraphs": {
            "sg_00": {
                "memory_used_bytes": {
                    "host": m.host_memory,
                    "neuron_device": device,
                    "usage_breakdown": {
                        "host": host_breakdown(|c| if c == HostCategory::ApplicationMemory { m.host_memory } else { 0 }),
                        "neuron_device": {
                            "constants": device_category(DeviceCategory::Constants),
                            "model_code": device_category(DeviceCategory::ModelCode),
                            "runtime_memory": device_category(DeviceCategory::RuntimeMemory),
                            // The breakdown has no scratchpad entry: the model's share of
                            // it counts as tensors, so that the parts add up to the total.
                            "tensors": device_category(DeviceCategory::Tensors) + device_category(DeviceCategory::ModelSharedScratchpad),
                        },
                    },
                },
                "neuroncore_index": m.core,
                "neuron_device_index": m.core / cores_per_device.max(1),
            },
        },
    })
}

/// A host metric group between two samples. `ecc` is each device's ECC events in the
/// period (mem corrected, mem uncorrected, sram corrected, sram uncorrected), from the
/// runtime processes.
pub fn system_group(group: SystemGroup, earlier: &HostSample, later: &HostSample, ecc: &[[u64; 4]]) -> Value {
    let seconds = later.taken_ns.saturating_sub(earlier.taken_ns) as f64 / 1e9;
    let mut out = Map::new();
    out.insert("period".into(), json!(seconds));
    out.insert("error".into(), json!(""));
    match group {
        SystemGroup::NeuronHwCounters => {
            let devices: Vec<Value> = ecc
                .iter()
                .enumerate()
                .map(|(d, e)| {
                    json!({
                        "neuron_device_index": d,
                        "mem_ecc_corrected": e[0],
                        "mem_ecc_uncorrected": e[1],
                        "sram_ecc_corrected": e[2],
                        "sram_ecc_uncorrected": e[3],
                    })
                })
                .collect();
            out.insert("neuron_devices".into(), Value::Array(devices));
        }
        SystemGroup::VcpuUsage => match (&earlier.cpu, &later.cpu) {
            (Ok(before), Ok(now)) => {
                out.insert("average_usage".into(), json!(now.all.usage_since(&before.all)));
                let per_cpu: Map<String, Value> = now
                    .cpus
                    .iter()
                    .filter_map(|(cpu, times)| {
                        before.cpus.get(cpu).map(|b| (cpu.to_string(), json!(times.usage_since(b))))
                    })
                    .collect();
                out.insert("usage_data".into(), Value::Object(per_cpu));
                out.insert(
                    "context_switch_count".into(),
                    json!(now.context_switches.saturating_sub(before.context_switches)),
                );
            }
            (Err(e), _) | (_, Err(e)) => {
                out.insert("error".into(), json!(e));
            }
        },
        // Made from the runtimes' flight records, not the host's figures: `collectives::group`.
        SystemGroup::Collectives => {}
        SystemGroup::MemoryInfo => match &later.memory {
            Ok(memory) => {
                if let Value::Object(fields) = json!(memory) {
                    out.extend(fields);
                }
            }
            Err(e) => {
                out.insert("error".into(), json!(e));
            }
        },
    }
    Value::Object(out)
}
