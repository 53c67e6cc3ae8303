//! The dashboard's entry points in the profiler's binaries: `neuron-profile view`
//! without an output format serves it on the file, and `neuron-bench demo` serves it
//! in its own process.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::http::http_get;
use neuron_test_support::process::{Running, Sandbox};

const PROFILE: &str = env!("CARGO_BIN_EXE_neuron-profile");
const BENCH: &str = env!("CARGO_BIN_EXE_neuron-bench");

/// The address of the first `http://…` in a line of `lines`, and the line.
fn address(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> (SocketAddr, String) {
    for line in lines.map_while(Result::ok) {
        if let Some(word) = line.split_whitespace().find(|w| w.starts_with("http://")) {
            let base = word.trim_start_matches("http://").split('/').next().expect("host:port");
            return (base.parse().expect("an address"), line);
        }
    }
    panic!("no address printed");
}

#[test]
fn view_without_an_output_format_serves_the_dashboard_on_the_file() {
    let sandbox = Sandbox::new();
    let file = sandbox.path().join("mlp run.ntff");
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let out = sandbox
        .env(&mut Command::new(PROFILE))
        .arg("capture")
        .arg("-n")
        .arg(&examples)
        .arg("-s")
        .arg(&file)
        .args(["--num-exec", "3"])
        .output()
        .expect("capture runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let mut view = Running(
        sandbox
            .env(&mut Command::new(PROFILE))
            .args(["view", "-s"])
            .arg(&file)
            .args(["--port", "0"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("view runs"),
    );
    let stderr = BufReader::new(view.0.stderr.take().expect("stderr"));
    let (base, line) = address(&mut stderr.lines());
    assert!(line.contains("#/profile/mlp%20run.ntff"), "opened on the file: {line}");
    let (status, meta) = http_get(base, "/api/profiles/mlp%20run.ntff");
    assert_eq!(status, 200, "{meta}");
    let meta: serde_json::Value = serde_json::from_str(&meta).expect("json");
    assert!(meta["tracks"].as_array().is_some_and(|t| !t.is_empty()), "{meta}");
    let (status, summary) = http_get(base, "/api/profiles/mlp%20run.ntff/summary");
    assert_eq!(status, 200);
    assert!(summary.contains("\"executions\""), "{summary}");
    // Bound to loopback only.
    assert!(base.ip().is_loopback(), "{base}");

    // Without --port, a taken 3001 (a dashboard already running there) is no error.
    let _taken = std::net::TcpListener::bind("127.0.0.1:3001");
    let mut fallback = Running(
        sandbox
            .env(&mut Command::new(PROFILE))
            .args(["view", "-s"])
            .arg(&file)
            .stderr(Stdio::piped())
            .spawn()
            .expect("view runs"),
    );
    let mut lines = BufReader::new(fallback.0.stderr.take().expect("stderr")).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(first.contains("port 3001 is taken, using "), "{first}");
    let (base, _) = address(&mut lines);
    assert_ne!(base.port(), 3001);
    assert_eq!(http_get(base, "/api/profiles/mlp%20run.ntff").0, 200);

    let other = sandbox.path().join("trace.bin");
    std::fs::copy(&file, &other).expect("copy");
    let out = sandbox.env(&mut Command::new(PROFILE)).args(["view", "-s"]).arg(&other).output().expect("view runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--output-format summary-text"), "says what to do instead");
}

#[test]
fn the_demo_serves_its_dashboard() {
    let sandbox = Sandbox::new();
    let mut demo = Running(
        sandbox
            .env(&mut Command::new(BENCH))
            .args(["demo", "--duration", "120s", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("the demo runs"),
    );
    let mut lines = BufReader::new(demo.0.stdout.take().expect("stdout")).lines();
    let (base, line) = address(&mut lines);
    assert!(line.starts_with("dashboard: "), "{line}");
    // The demo prints a status line every second: keep reading them.
    std::thread::spawn(move || lines.for_each(drop));
    // The live feed shows the demo itself, busy.
    let mut stream = TcpStream::connect(base).expect("connects");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    write!(stream, "GET /api/live HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("sends");
    let deadline = Instant::now() + Duration::from_secs(120);
    let pid = demo.0.id();
    for line in BufReader::new(stream).lines() {
        let line = line.expect("an update");
        assert!(Instant::now() < deadline, "the demo never showed busy on its own dashboard");
        let Some(data) = line.strip_prefix("data:") else { continue };
        let update: serde_json::Value = serde_json::from_str(data.trim()).expect("json");
        let ours = update["runtimes"].as_array().into_iter().flatten().find(|r| r["pid"] == pid);
        if ours.is_some_and(|r| {
            r["cores"].as_array().into_iter().flatten().any(|c| c["utilization"].as_f64().is_some_and(|u| u > 0.0))
        }) {
            return;
        }
    }
    panic!("the live feed ended");
}
