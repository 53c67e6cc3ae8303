//! Where a metric's exemplar leads: `/api/execution/ID` finds an execution of a running
//! workload in its runtime's rings (the slow one a fault made, by the id the runtime's
//! log names), with the spans the live timeline draws, and says plainly when an id is
//! not there, with how far back each runtime's rings reach.

use neuron_dashboard::{Dashboard, Options};
use neuron_test_support::http::http_get;
use neuron_test_support::process::{Sandbox, slow_workload};
use serde_json::Value;

#[test]
fn an_execution_in_the_rings_is_found_with_its_spans_and_one_gone_is_said_gone() {
    let sandbox = Sandbox::new();
    let (bench, exec_id) = slow_workload(&sandbox);
    let pid = bench.0.id();
    let mut options = Options::new(([127, 0, 0, 1], 0).into()).expect("options");
    options.datastore_dir = sandbox.path().join("datastores");
    let dashboard = Dashboard::start(options).expect("starts");

    let (status, body) = http_get(dashboard.addr(), &format!("/api/execution/{exec_id}"));
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("JSON");
    let found = answer["found"].as_array().expect("found");
    assert_eq!(found.len(), 1, "{answer}");
    let execution = &found[0];
    assert_eq!(execution["pid"], pid);
    assert_eq!(execution["core"], 0);
    let (start, end) = (execution["start_ns"].as_u64().expect("start"), execution["end_ns"].as_u64().expect("end"));
    assert!(end - start >= 150_000_000, "the stall is in it: {execution}");
    let spans = execution["spans"].as_array().expect("spans");
    let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    for name in ["nrt_execute", "nc_exec_running"] {
        assert!(names.contains(&name), "{names:?}");
    }
    assert!(spans.iter().all(|s| s["exec"] == exec_id && s["pid"] == pid), "only its spans: {spans:?}");
    assert!(spans.iter().any(|s| s["lane"] != "runtime"), "device spans too: {names:?}");
    let now = answer["now_ns"].as_u64().expect("now");
    assert!(end <= now);

    // Of the process asked for only, and not of another.
    let (_, body) = http_get(dashboard.addr(), &format!("/api/execution/{exec_id}?pid={pid}"));
    assert_eq!(serde_json::from_str::<Value>(&body).expect("JSON")["found"].as_array().map(Vec::len), Some(1));
    let (_, body) = http_get(dashboard.addr(), &format!("/api/execution/{exec_id}?pid={}", pid + 1));
    assert_eq!(serde_json::from_str::<Value>(&body).expect("JSON")["found"].as_array().map(Vec::len), Some(0));

    // An id the rings do not hold: not found, and how far back they reach.
    let (status, body) = http_get(dashboard.addr(), "/api/execution/1000000000000");
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(answer["found"].as_array().map(Vec::len), Some(0), "{answer}");
    let runtime = answer["runtimes"].as_array().and_then(|r| r.iter().find(|r| r["pid"] == pid)).expect("the workload");
    let oldest = runtime["oldest_ns"].as_u64().expect("its rings hold events");
    assert!(oldest <= answer["now_ns"].as_u64().expect("now"), "{runtime}");
    // Not an id at all.
    assert_eq!(http_get(dashboard.addr(), "/api/execution/latest").0, 400);
    drop(bench);
}
