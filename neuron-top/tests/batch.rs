//! `neuron-top --json` and `--once` against a real workload, without a terminal.

use std::path::Path;
use std::process::{Command, Stdio};

use neuron_test_support::process::{Running, Sandbox};
use serde_json::Value;

const TOP: &str = env!("CARGO_BIN_EXE_neuron-top");

#[test]
fn json_and_once_show_a_running_workload() {
    let bench = neuron_test_support::process::neuron_bench();
    let sandbox = Sandbox::new();
    let mlp = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let mut workload = Command::new(&bench);
    sandbox
        .env(&mut workload)
        .env("NEURON_PROCESS_TAG", "batch-e2e")
        .env("NEURON_RT_FAULT_INJECT", "oob:core=0:every=2");
    let _workload = Running(
        workload
            .args(["exec", mlp.to_str().expect("utf-8"), "--cores", "0", "--duration", "60s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("neuron-bench"),
    );
    let top = |args: &[&str]| {
        let mut c = Command::new(TOP);
        sandbox.env(&mut c).env_remove("NO_COLOR").args(args);
        let out = c.output().expect("neuron-top");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8")
    };

    // Until the workload has loaded its model and run a few executions.
    let started = std::time::Instant::now();
    let snapshot: Value = loop {
        let snapshot: Value = serde_json::from_str(&top(&["--json", "--refresh", "300ms"])).expect("JSON");
        let runtime = &snapshot["runtimes"][0];
        // Seen at both looks, so that its rates were measured.
        let measured = runtime["cores"][0]["utilization"].is_f64();
        if runtime["tag"] == "batch-e2e" && runtime["errors"]["model"].as_u64() > Some(0) && measured {
            break snapshot;
        }
        assert!(started.elapsed().as_secs() < 60, "the workload never showed up: {snapshot}");
    };
    let runtime = &snapshot["runtimes"][0];
    let core = &runtime["cores"][0];
    assert_eq!(core["index"], 0);
    assert!(core["utilization"].as_f64() > Some(0.0), "{core}");
    assert!(core["executions_per_second"].as_f64() > Some(0.0), "{core}");
    assert!(core["latency_p50"].as_f64() > Some(0.0), "{core}");
    assert_eq!(runtime["models"][0]["name"], "mlp");
    assert!(runtime["models"][0]["device_memory"]["model_code"].as_u64() > Some(0));
    assert_eq!(runtime["errors"].as_object().map(|e| e.len()), Some(6), "every class, by name");
    assert_eq!(runtime["errors"]["generic"], 0, "no generic errors, only model ones (out of bounds)");
    assert!(snapshot["system"]["memory_total_bytes"].as_u64() > Some(0));

    let frame = top(&["--once", "--refresh", "300ms"]);
    assert!(frame.contains("[2]:batch-e2e"), "{frame}");
    assert!(frame.contains("NeuronCore v2 Utilization"), "{frame}");
    assert!(!frame.contains('\u{1b}'), "plain text, no escape sequences");

    // Asked for the Ranks tab of a workload with no collectives: says so, not another tab.
    let ranks = top(&["--once", "--ranks", "--refresh", "300ms"]);
    assert_eq!(ranks, format!("{} (1 runtime running)\n", neuron_top::view::ranks::NO_COMMUNICATOR));
}
