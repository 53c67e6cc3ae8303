//! `neuron-monitor` end to end: invalid configurations are refused with their golden
//! message, and reports follow real workload processes as they start, run and exit.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::process::Sandbox;
use serde_json::Value;

const MONITOR: &str = env!("CARGO_BIN_EXE_neuron-monitor");

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/config")
}

#[test]
fn an_invalid_configuration_exits_1_naming_the_field_and_value() {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("golden dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    cases.sort();
    for case in cases {
        let golden = std::fs::read_to_string(case.with_extension("err")).expect("golden");
        let out = Command::new(MONITOR).arg("-c").arg(&case).arg("--once").output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {stderr}", case.display());
        assert!(out.stdout.is_empty(), "{}: wrote a report", case.display());
        assert!(stderr.contains(golden.trim_end()), "{}:\n{stderr}\nexpected: {golden}", case.display());
    }
    let out = Command::new(MONITOR).args(["-c", "/nonexistent/monitor.json"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/monitor.json"));
}

#[test]
fn reports_follow_a_workload_from_start_to_exit() {
    // Built before anything is timed.
    let bench_exe = neuron_test_support::process::neuron_bench();
    let sandbox = Sandbox::new();
    let config = sandbox.path().join("monitor.json");
    std::fs::write(
        &config,
        r#"{"period": "300ms", "neuron_runtimes": [{"tag_filter": "^train", "metrics": [
             {"type": "neuroncore_counters"}, {"type": "execution_stats"}, {"type": "memory_used"},
             {"type": "neuron_runtime_vcpu_usage"}]}],
           "system_metrics": [{"type": "vcpu_usage"}, {"type": "memory_info"}, {"type": "neuron_hw_counters", "period": "600ms"}]}"#,
    )
    .expect("config");
    let started = Instant::now();
    let mut monitor =
        sandbox.env(&mut Command::new(MONITOR)).arg("-c").arg(&config).stdout(Stdio::piped()).spawn().expect("monitor");
    let mut lines = BufReader::new(monitor.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a first report").expect("a line");
    assert!(started.elapsed() < Duration::from_secs(10), "the first report comes at once");
    let first: Value = serde_json::from_str(&first).expect("JSON");
    // At once: before a period went by.
    assert!(first["system_data"]["memory_info"]["period"].as_f64() < Some(0.3), "{first}");
    assert_eq!(first["neuron_hardware_info"]["neuron_device_count"].as_u64().map(|n| n > 0), Some(true));

    // A tagged workload of a known number of executions, every third failing with an
    // out-of-bounds access, and an untagged one the filter leaves out.
    let iterations = 40;
    let mlp = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let mut tagged = sandbox
        .env(&mut Command::new(&bench_exe))
        .env("NEURON_PROCESS_TAG", "trainer-1")
        .env("NEURON_RT_FAULT_INJECT", "oob:core=0:every=3")
        .args(["exec", mlp.to_str().expect("utf-8"), "--cores", "0", "--iterations", &iterations.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("bench");
    let mut untagged = sandbox
        .env(&mut Command::new(&bench_exe))
        .args(["exec", mlp.to_str().expect("utf-8"), "--cores", "1", "--duration", "2s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("bench");
    let pid = tagged.id();
    assert_eq!(tagged.wait().expect("bench ends").code(), Some(1), "the injected faults fail executions");
    let _ = untagged.wait();

    let (mut seen, mut completed, mut busy, mut device_bytes, mut after_exit) = (0, 0, false, 0, 0);
    let mut outcomes = std::collections::BTreeMap::<String, u64>::new();
    let mut errors = std::collections::BTreeMap::<String, u64>::new();
    for line in lines.by_ref() {
        let report: Value = serde_json::from_str(&line.expect("line")).expect("JSON");
        let runtimes = report["neuron_runtime_data"].as_array().expect("runtimes").clone();
        assert!(
            runtimes.iter().all(|r| r["neuron_runtime_tag"] == "trainer-1"),
            "the filter keeps out the untagged process"
        );
        match runtimes.iter().find(|r| r["pid"].as_u64() == Some(u64::from(pid))) {
            Some(r) => {
                seen += 1;
                let stats = &r["report"]["execution_stats"];
                completed += stats["execution_summary"]["completed"].as_u64().expect("count");
                let add = |into: &mut std::collections::BTreeMap<String, u64>, counts: &Value| {
                    for (name, n) in counts.as_object().expect("counts") {
                        *into.entry(name.clone()).or_default() += n.as_u64().expect("a count");
                    }
                };
                add(&mut outcomes, &stats["execution_summary"]);
                add(&mut errors, &stats["error_summary"]);
                busy |= r["report"]["neuroncore_counters"]["neuroncores_in_use"]["0"]["neuroncore_utilization"]
                    .as_f64()
                    > Some(0.0);
                device_bytes = device_bytes.max(
                    r["report"]["memory_used"]["neuron_runtime_used_bytes"]["neuron_device"].as_u64().unwrap_or(0),
                );
                let period = stats["period"].as_f64().expect("period");
                assert!(period > 0.0 && period < 5.0, "{period}");
            }
            None if seen > 0 => {
                after_exit += 1;
                if after_exit >= 2 {
                    break;
                }
            }
            None => {}
        }
        assert!(report["system_data"]["memory_info"]["memory_total_bytes"].as_u64() > Some(0));
        assert!(started.elapsed() < Duration::from_secs(60), "the workload never showed up");
    }
    let _ = monitor.kill();
    let _ = monitor.wait();
    assert!(seen > 0, "the tagged workload was reported");
    // Executions 3, 6, …, 39 failed: 13 of 40.
    assert_eq!(completed, iterations - 13, "every execution counted once, over the periods");
    let nonzero = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter().filter(|(_, n)| **n > 0).map(|(k, n)| (k.clone(), *n)).collect::<Vec<_>>()
    };
    assert_eq!(nonzero(&outcomes), [("completed".to_string(), 27), ("completed_with_err".to_string(), 13)]);
    assert_eq!(nonzero(&errors), [("model".to_string(), 13)], "an out-of-bounds access is the model's error");
    assert_eq!(errors.len(), 6, "every error class is reported: {errors:?}");
    assert!(busy, "the core was busy in some period");
    assert!(device_bytes > 0, "the model's device memory");
}

#[test]
fn once_reports_a_measured_period_of_a_busy_runtime() {
    let bench_exe = neuron_test_support::process::neuron_bench();
    let sandbox = Sandbox::new();
    let mlp = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let mut busy = sandbox
        .env(&mut Command::new(&bench_exe))
        .env("NEURON_PROCESS_TAG", "busy")
        .args(["exec", mlp.to_str().expect("utf-8"), "--cores", "0", "--duration", "60s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("bench");
    // Until the workload has executed once, as its datastore says.
    let started = Instant::now();
    loop {
        let executed = std::fs::read_dir(&sandbox.datastores).into_iter().flatten().flatten().any(|entry| {
            neuron_datastore::DatastoreReader::open(&entry.path())
                .is_ok_and(|r| r.snapshot().cores.iter().any(|c| c.executions.total() > 0))
        });
        if executed {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the workload never executed");
        std::thread::yield_now();
    }
    let out = sandbox.env(&mut Command::new(MONITOR)).arg("--once").output().expect("monitor");
    let _ = busy.kill();
    let _ = busy.wait();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    let runtime = report["neuron_runtime_data"]
        .as_array()
        .expect("runtimes")
        .iter()
        .find(|r| r["neuron_runtime_tag"] == "busy")
        .cloned()
        .expect("the busy runtime is reported");
    let stats = &runtime["report"]["execution_stats"];
    assert!(stats["period"].as_f64() >= Some(0.9), "a measured period: {stats}");
    assert!(stats["execution_summary"]["completed"].as_u64() > Some(0), "{stats}");
    let core = &runtime["report"]["neuroncore_counters"]["neuroncores_in_use"]["0"];
    assert!(core["neuroncore_utilization"].as_f64() > Some(0.0), "{core}");
}

#[test]
fn a_configuration_without_runtimes_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("monitor.json");
    std::fs::write(&config, r#"{"period": "1s"}"#).expect("config");
    let out = Command::new(MONITOR).arg("-c").arg(&config).arg("--once").output().expect("runs");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no \"neuron_runtimes\" entry, so no runtime is reported"), "{stderr}");
}
