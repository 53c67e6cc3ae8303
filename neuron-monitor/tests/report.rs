//! `neuron-monitor`'s metric groups from real samples: a runtime in this process runs
//! the MLP example between two samples, and every group says what happened.

use std::path::Path;

use neuron_datastore::DatastoreReader;
use neuron_datastore::clock::monotonic_ns;
use neuron_datastore::host::{CpuStat, MemoryInfo, ProcessCpu, clock_ticks_per_second};
use neuron_monitor::config::{RuntimeGroup, SystemGroup};
use neuron_monitor::report::{CpuClock, HostSample, RuntimeSample, runtime_group, system_group};
use neuron_runtime::{Config, Runtime};
use neuron_test_support::process::Sandbox;
use serde_json::Value;

fn sample(reader: &DatastoreReader) -> RuntimeSample {
    RuntimeSample {
        snapshot: reader.snapshot(),
        models: reader.models(),
        cpu: ProcessCpu::read(std::process::id()).ok(),
    }
}

fn host() -> HostSample {
    HostSample {
        taken_ns: monotonic_ns(),
        cpu: CpuStat::read().map_err(|e| e.to_string()),
        memory: MemoryInfo::read().map_err(|e| e.to_string()),
    }
}

#[test]
fn every_group_reports_what_ran_between_two_samples() {
    let sandbox = Sandbox::new();
    let config = Config::from_lookup(|name| match name {
        "NEURON_VIRT_LOCK_DIR" => Some(sandbox.path().to_string_lossy().into_owned()),
        "NEURON_VIRT_DATASTORE_DIR" => Some(sandbox.datastores.to_string_lossy().into_owned()),
        "NEURON_RT_VISIBLE_CORES" => Some("0".into()),
        _ => None,
    })
    .expect("config");
    let runtime = Runtime::start(config).expect("runtime");
    let reader = DatastoreReader::open(&runtime.datastore_path().expect("path")).expect("reader");
    let hlo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let neff = neuron_profiler::load_model_bytes(&hlo, neuron_runtime::Target::Trn1).expect("model");
    let model = runtime.load(&neff, Some(0)).expect("load");
    let (inputs, outputs) = neuron_profiler::bind_tensors(&runtime, &model, &mut |_, _| Ok(None)).expect("tensors");

    let (before, host_before) = (sample(&reader), host());
    let began = std::time::Instant::now();
    for _ in 0..7 {
        runtime.execute(&model, &inputs, &outputs).expect("execute");
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (after, host_after) = (sample(&reader), host());
    let clock = CpuClock {
        ticks_per_second: clock_ticks_per_second(),
        cpus: host_after.cpu.as_ref().map_or(1, |c| c.cpus.len()),
    };
    let group = |g| runtime_group(g, &before, &after, reader.info().cores_per_device, clock);

    let counters = group(RuntimeGroup::NeuroncoreCounters);
    assert!(counters["period"].as_f64() > Some(0.0), "{counters}");
    assert_eq!(counters["error"], "");
    let nc0 = &counters["neuroncores_in_use"]["0"];
    assert!(nc0["neuroncore_utilization"].as_f64() > Some(0.0), "{counters}");
    assert!(nc0["flops"].as_f64() > Some(0.0), "{counters}");

    let stats = group(RuntimeGroup::ExecutionStats);
    assert_eq!(stats["execution_summary"]["completed"], 7, "{stats}");
    assert_eq!(stats["execution_summary"]["timed_out"], 0);
    assert_eq!(stats["error_summary"]["generic"], 0);
    let total = &stats["latency_stats"]["total_latency"];
    // Seconds: an execution takes more than a microsecond and less than all seven.
    let (p0, p100) = (total["p0"].as_f64().expect("p0"), total["p100"].as_f64().expect("p100"));
    assert!(p0 > 1e-6 && p0 <= p100 && p100 < began.elapsed().as_secs_f64(), "{stats}");
    assert!(stats["latency_stats"]["device_latency"]["p50"].as_f64() > Some(0.0));
    let mlp = &stats["model_stats"][0];
    assert_eq!(
        (mlp["name"].as_str(), mlp["executions"].as_u64(), mlp["neuroncore"].as_u64()),
        (Some("mlp"), Some(7), Some(0))
    );
    let model_p50 = mlp["total_latency"]["p50"].as_f64().expect("the model's p50");
    assert!(model_p50 >= p0 * 0.9 && model_p50 <= p100 * 1.1, "{stats}");
    // A period without executions has no percentiles.
    let idle = runtime_group(RuntimeGroup::ExecutionStats, &after, &after, 2, clock);
    assert_eq!(idle["latency_stats"]["total_latency"], Value::Null);
    assert_eq!(idle["execution_summary"]["completed"], 0);
    assert_eq!(
        (idle["model_stats"][0]["executions"].as_u64(), &idle["model_stats"][0]["total_latency"]),
        (Some(0), &Value::Null)
    );

    let memory = group(RuntimeGroup::MemoryUsed);
    let used = &memory["neuron_runtime_used_bytes"];
    let snapshot = &after.snapshot;
    assert_eq!(used["host"].as_u64(), Some(snapshot.host_memory.iter().sum()));
    assert_eq!(used["neuron_device"].as_u64(), Some(snapshot.cores[0].device_memory.iter().sum()), "{memory}");
    assert!(used["neuron_device"].as_u64() > Some(0));
    let nc0 = &used["usage_breakdown"]["neuroncore_memory_usage"]["0"];
    let parts: u64 = ["constants", "model_code", "model_shared_scratchpad", "runtime_memory", "tensors"]
        .iter()
        .map(|k| nc0[k].as_u64().expect("category"))
        .sum();
    assert_eq!(Some(parts), used["neuron_device"].as_u64());
    let model_entry = &memory["loaded_models"][0];
    assert_eq!(model_entry["name"], "mlp");
    assert_eq!(model_entry["is_running"], false);
    assert_eq!(model_entry["subgraphs"]["sg_00"]["neuroncore_index"], 0);
    assert!(model_entry["subgraphs"]["sg_00"]["memory_used_bytes"]["neuron_device"].as_u64() > Some(0));

    let cpu = group(RuntimeGroup::NeuronRuntimeVcpuUsage);
    let (user, system) = (cpu["vcpu_usage"]["user"].as_f64(), cpu["vcpu_usage"]["system"].as_f64());
    assert!(user >= Some(0.0) && system >= Some(0.0) && user.unwrap_or(0.0) + system.unwrap_or(0.0) <= 100.0, "{cpu}");

    let vcpu = system_group(SystemGroup::VcpuUsage, &host_before, &host_after, &[]);
    let average = &vcpu["average_usage"];
    let shares: f64 = ["user", "nice", "system", "idle", "io_wait", "irq", "soft_irq"]
        .iter()
        .map(|k| average[k].as_f64().expect("share"))
        .sum();
    assert!(shares <= 100.0 + 1e-6, "{vcpu}");
    assert_eq!(vcpu["usage_data"].as_object().map(|m| m.len()), Some(clock.cpus));
    let memory = system_group(SystemGroup::MemoryInfo, &host_before, &host_after, &[]);
    assert!(memory["memory_total_bytes"].as_u64() >= memory["memory_used_bytes"].as_u64(), "{memory}");
    let hw = system_group(SystemGroup::NeuronHwCounters, &host_before, &host_after, &[[1, 0, 2, 0]]);
    assert_eq!(hw["neuron_devices"][0]["mem_ecc_corrected"], 1);
    assert_eq!(hw["neuron_devices"][0]["sram_ecc_corrected"], 2);
}
