//! Bounds and findings on profiles with a known bottleneck: a large matrix product
//! (PE), a chain of transcendental functions (ACT), a synchronous loop of tiny
//! executions (the host), and tiny executions scheduled one at a time. The first
//! finding must name the bottleneck, and every bound must be at most the time it bounds.

mod common;

use std::path::Path;

use common::{TINY, neuron_profile};
use serde_json::Value;

const PE_BOUND: &str = "HloModule pe\nENTRY e {\n  a = f32[384,384] parameter(0)\n  b = f32[384,384] parameter(1)\n  \
                        ROOT d = f32[384,384] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n";
const ACT_BOUND: &str = "HloModule act\nENTRY e {\n  x = f32[131072] parameter(0)\n  a = f32[131072] exponential(x)\n  \
                         b = f32[131072] tanh(a)\n  c = f32[131072] sine(b)\n  d = f32[131072] logistic(c)\n  \
                         ROOT r = f32[131072] tanh(d)\n}\n";

/// One capture at a time: which engine or the host bounds a workload is a matter of
/// timing, and a capture of a large product running beside a loop of tiny executions
/// stretches the tiny ones' device time (their threads are preempted mid-instruction on
/// a 2-CPU host), which made the host-bound profile read DVE-bound.
static ONE_CAPTURE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Captures `hlo` with `args` and returns the summary as JSON.
fn summary(dir: &Path, name: &str, hlo: &str, args: &[&str]) -> Value {
    let _alone = ONE_CAPTURE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = dir.join(format!("{name}.hlo"));
    std::fs::write(&model, hlo).expect("write the model");
    let file = dir.join(format!("{name}.ntff"));
    let run = |args: &[&str]| neuron_profile(dir, args).stdout;
    let mut capture = vec!["capture", "-n", model.to_str().expect("utf-8"), "-s", file.to_str().expect("utf-8")];
    capture.extend_from_slice(args);
    run(&capture);
    let json = run(&["view", "-s", file.to_str().expect("utf-8"), "--output-format", "summary-json"]);
    let text = run(&["view", "-s", file.to_str().expect("utf-8"), "--output-format", "summary-text"]);
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("\nbounds (per traced execution") && text.contains("\nfindings, by the time"), "{text}");
    serde_json::from_slice(&json).expect("summary JSON")
}

/// The bounds order as they must: none above the time it bounds.
fn check_bounds(s: &Value) {
    let b = &s["bounds"];
    let device = b["device_s"].as_f64().expect("device time");
    let pipeline = b["pipeline_s"].as_f64().expect("pipeline bound");
    assert!(pipeline > 0.0 && pipeline <= device * 1.001, "{b}");
    for bound in ["compute_s", "memory_s"] {
        if let Some(v) = b[bound].as_f64() {
            assert!(v <= pipeline * 1.001, "{bound} {v} above the pipeline bound: {b}");
        }
    }
    if let Some(host) = b["host_s"].as_f64() {
        assert!(device <= host * 1.001, "the device run is inside the call: {b}");
    }
    let findings = s["findings"].as_array().expect("findings");
    let saves: Vec<f64> = findings.iter().map(|f| f["saves_s"].as_f64().expect("saves")).collect();
    assert!(saves.windows(2).all(|w| w[0] >= w[1]), "ranked by what they save: {saves:?}");
    for f in findings {
        assert!(!f["evidence"].as_str().unwrap_or("").is_empty(), "every finding has its figures: {f}");
        assert!(f["saves_percent"].as_f64() >= Some(bounds_min_percent()), "{f}");
        assert!(f["saves_percent"].as_f64() <= Some(100.0), "no finding saves more than all the time: {f}");
    }
}

fn bounds_min_percent() -> f64 {
    ntff::summary::bounds::MIN_FINDING_PERCENT
}

fn first(s: &Value) -> &Value {
    &s["findings"][0]
}

#[test]
fn a_large_matrix_product_is_pe_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = summary(dir.path(), "pe", PE_BOUND, &["--num-exec", "4", "--profile-all-execs"]);
    check_bounds(&s);
    assert_eq!(first(&s)["about"], "PE", "{}", s["findings"]);
    assert_eq!(s["bounds"]["pipeline_resource"], "PE");
    assert!(first(&s)["evidence"].as_str().unwrap_or("").contains("`d`"), "names the instruction: {}", first(&s));
    // The product on the roofline: dense, so compute-bound, below its ceiling.
    let d = &s["top_hlo_instructions"][0];
    assert_eq!(
        (d["hlo"].as_str(), d["engine"].as_str(), d["bound"].as_str()),
        (Some("d"), Some("PE"), Some("compute")),
        "{d}"
    );
    assert!(d["intensity"].as_f64() > Some(10.0), "{d}");
    let roofline = d["roofline_percent"].as_f64().expect("on the roofline");
    assert!(roofline > 0.0 && roofline <= 100.0, "{d}");
}

#[test]
fn a_chain_of_transcendental_functions_is_act_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = summary(dir.path(), "act", ACT_BOUND, &["--num-exec", "4", "--profile-all-execs"]);
    check_bounds(&s);
    assert_eq!(first(&s)["about"], "ACT", "{}", s["findings"]);
}

#[test]
fn a_synchronous_loop_of_tiny_executions_is_host_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = summary(dir.path(), "sync", TINY, &["--num-exec", "100", "--profile-all-execs"]);
    check_bounds(&s);
    assert_eq!(first(&s)["about"], "host", "{}", s["findings"]);
    // Which host finding leads (the device idle between calls, or the time inside each
    // call) depends on the machine's load; the idle one says what to do as the command
    // line says it: this profile is of `neuron-profile capture`.
    let findings = s["findings"].as_array().expect("findings");
    let idle = findings.iter().find(|f| f["kind"] == "idle").unwrap_or_else(|| panic!("an idle finding: {findings:?}"));
    let suggestion = idle["suggestion"].as_str().unwrap_or("");
    assert!(suggestion.contains("--exec-mode async") && !suggestion.contains("nrta_"), "{idle}");
}

#[test]
fn tiny_executions_scheduled_one_at_a_time_are_told_to_keep_more_in_flight() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s =
        summary(dir.path(), "async", TINY, &["--num-exec", "100", "--profile-all-execs", "--exec-mode", "async-wait"]);
    check_bounds(&s);
    let f = first(&s);
    assert_eq!(f["about"], "host", "{}", s["findings"]);
    assert!(f["suggestion"].as_str().unwrap_or("").contains("2 or more in flight (`--exec-mode async`)"), "{f}");
    assert!(f["text"].as_str().unwrap_or("").contains("idle"), "{f}");
}
