//! Comparing two profiles over HTTP: each side says how many executions it has, and a
//! difference per instruction within the profiles' run-to-run spread is marked as noise
//! (or as impossible to tell, with too few traced executions).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use neuron_dashboard::{Dashboard, Options};
use neuron_test_support::process::{Sandbox, profiler_binary};
use serde_json::Value;

fn capture(sandbox: &Sandbox, file: &Path, executions: &str) {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let out = sandbox
        .env(&mut Command::new(profiler_binary("neuron-profile")))
        .args(["capture", "-n"])
        .arg(model)
        .arg("-s")
        .arg(file)
        .args(["--num-exec", executions])
        .output()
        .expect("neuron-profile runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn compare(addr: std::net::SocketAddr, a: &str, b: &str) -> Value {
    let mut stream = TcpStream::connect(addr).expect("connects");
    write!(stream, "GET /api/compare?a={a}&b={b} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("sends");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("reads");
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(body).expect("json")
}

#[test]
fn a_comparison_says_how_many_executions_and_which_changes_are_noise() {
    let sandbox = Sandbox::new();
    let profiles = sandbox.path().join("profiles");
    std::fs::create_dir(&profiles).expect("mkdir");
    // The two profiles of the same model are captured side by side, so that a change in
    // the host's load (other tests) while they run weighs on both alike.
    std::thread::scope(|scope| {
        for name in ["a.ntff", "b.ntff"] {
            let (sandbox, file) = (&sandbox, profiles.join(name));
            scope.spawn(move || capture(sandbox, &file, "30"));
        }
    });
    capture(&sandbox, &profiles.join("one.ntff"), "1");
    let mut options = Options::new(([127, 0, 0, 1], 0).into()).expect("options");
    options.datastore_dir = sandbox.path().join("datastores");
    options.profiles = Some(profiles);
    let dashboard = Dashboard::start(options).expect("starts");

    // The same model twice: both sides have a spread, every shared row is told.
    let c = compare(dashboard.addr(), "a.ntff", "b.ntff");
    for side in ["a", "b"] {
        assert_eq!(c[side]["executions"], 30, "{}", c[side]);
        assert_eq!(c[side]["device_traced"], 15, "every other one: {}", c[side]);
        assert!(c[side]["spread"].as_f64().is_some_and(|s| s >= 0.05), "{}", c[side]);
    }
    let rows = c["hlo_instructions"].as_array().expect("rows");
    assert!(!rows.is_empty());
    assert!(rows.iter().all(|r| r["within_noise"].is_boolean()), "{rows:?}");
    // Each row is told by the rule the page states: a change within the larger of the
    // two sides' spreads (their p90 over p50 of device latency) is noise. (Whether a row
    // is noise depends on the host's load during the captures, which no test controls.)
    let limit = (1.0 + c["a"]["spread"].as_f64().unwrap_or(0.0).max(c["b"]["spread"].as_f64().unwrap_or(0.0))).ln();
    let mut told = 0;
    for r in rows {
        let (a, b) = (r["a_time_s"].as_f64().unwrap_or(0.0), r["b_time_s"].as_f64().unwrap_or(0.0));
        let noise = a > 0.0 && b > 0.0 && (b / a).ln().abs() <= limit;
        assert_eq!(r["within_noise"], noise, "{r} against a spread of {limit}");
        told += usize::from(a > 0.0 && b > 0.0);
    }
    assert!(told > 0, "rows with time on both sides: {rows:?}");

    // One execution on a side: nothing can be told apart from noise.
    let c = compare(dashboard.addr(), "a.ntff", "one.ntff");
    assert_eq!(c["b"]["executions"], 1);
    assert!(c["b"]["spread"].is_null(), "{}", c["b"]);
    let rows = c["hlo_instructions"].as_array().expect("rows");
    assert!(rows.iter().all(|r| r["within_noise"].is_null()), "{rows:?}");
}
