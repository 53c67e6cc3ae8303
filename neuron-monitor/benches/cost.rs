//! What `neuron-monitor` costs to leave running: CPU time as a share of one core, and
//! resident memory, at a 1 s period while 4 workload processes keep 2 virtual cores
//! each busy (`trn1.32xlarge`, the MLP example).
//!
//! Measured side by side over the same window, so that they share the same load:
//!
//! - `neuron-monitor` writing its JSON reports (to a file, read back at the end to check
//!   that every report covered the 4 workloads);
//! - `neuron-monitor --prometheus-listen --no-stdout`, its `/metrics` fetched every second;
//! - the baseline: Prometheus's `node_exporter` (Debian's `prometheus-node-exporter`),
//!   one scraped every 1 s (the monitor's rate) and one every 10 s (the usual setting).
//!   Without it the ratios are not printed.
//!
//! CPU time is the sum of the process's threads' run time (`/proc/PID/task/*/schedstat`,
//! nanoseconds) over the window; memory is `VmRSS` at the end and `VmHWM` (the peak).
//!
//! Run: `cargo bench -p neuron-monitor --bench cost`. Results go in BENCHMARKS.md.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::process::{Running, Sandbox, cpu_ns, memory};

const MONITOR: &str = env!("CARGO_BIN_EXE_neuron-monitor");
const NODE_EXPORTER: &str = "prometheus-node-exporter";

const WORKLOADS: u32 = 4;
const WARM_UP: Duration = Duration::from_secs(5);
const WINDOW: Duration = Duration::from_secs(60);

/// `GET /metrics`, the body's length (0 on failure).
fn scrape(addr: SocketAddr) -> usize {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else { return 0 };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    if write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").is_err() {
        return 0;
    }
    let mut body = Vec::new();
    let _ = stream.read_to_end(&mut body);
    body.len()
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port")
}

struct Measured {
    name: String,
    pid: u32,
    cpu_before: u64,
}

fn main() {
    let bench_exe = neuron_test_support::process::neuron_bench();
    let sandbox = Sandbox::new();
    let env = |c: &mut Command| {
        sandbox.env(c).env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge").stdout(Stdio::null()).stderr(Stdio::null());
    };
    let mlp = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp.hlo");
    let seconds = (WARM_UP + WINDOW).as_secs() + 30;
    let _workloads: Vec<Running> = (0..WORKLOADS)
        .map(|k| {
            let mut c = Command::new(&bench_exe);
            env(&mut c);
            let cores = format!("{}-{}", 2 * k, 2 * k + 1);
            c.env("NEURON_PROCESS_TAG", format!("bench-{k}")).args([
                "exec",
                mlp.to_str().expect("utf-8"),
                "--cores",
                &cores,
                "--duration",
                &format!("{seconds}s"),
            ]);
            Running(c.spawn().expect("neuron-bench"))
        })
        .collect();

    let config = sandbox.every_group_config("1s");
    let reports = sandbox.path().join("reports.jsonl");
    let mut json = Command::new(MONITOR);
    env(&mut json);
    let json = Running(
        json.arg("-c")
            .arg(&config)
            .stdout(std::fs::File::create(&reports).expect("reports file"))
            .spawn()
            .expect("neuron-monitor"),
    );
    let exporter_addr = free_addr();
    let mut exporter = Command::new(MONITOR);
    env(&mut exporter);
    let exporter = Running(
        exporter
            .arg("-c")
            .arg(&config)
            .args(["--no-stdout", "--prometheus-listen", &exporter_addr.to_string()])
            .spawn()
            .expect("neuron-monitor --prometheus-listen"),
    );
    let node_exporter = |addr: SocketAddr| {
        Command::new(NODE_EXPORTER)
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
            .map(Running)
    };
    let (node_fast_addr, node_slow_addr) = (free_addr(), free_addr());
    let node_fast = node_exporter(node_fast_addr);
    let node_slow = node_exporter(node_slow_addr);
    if node_fast.is_none() {
        eprintln!("note: {NODE_EXPORTER} is not installed (apt-get install prometheus-node-exporter): no baseline");
    }

    eprintln!(
        "{WORKLOADS} workloads of 2 busy cores; warming up {} s, then measuring {} s",
        WARM_UP.as_secs(),
        WINDOW.as_secs()
    );
    std::thread::sleep(WARM_UP);
    let mut measured = vec![
        Measured { name: "neuron-monitor, JSON reports".into(), pid: json.0.id(), cpu_before: 0 },
        Measured { name: "neuron-monitor, Prometheus, fetched every 1 s".into(), pid: exporter.0.id(), cpu_before: 0 },
    ];
    if let (Some(fast), Some(slow)) = (&node_fast, &node_slow) {
        measured.push(Measured { name: "node_exporter, scraped every 1 s".into(), pid: fast.0.id(), cpu_before: 0 });
        measured.push(Measured { name: "node_exporter, scraped every 10 s".into(), pid: slow.0.id(), cpu_before: 0 });
    }
    let began = Instant::now();
    for m in &mut measured {
        m.cpu_before = cpu_ns(m.pid);
    }
    let (mut exporter_bytes, mut node_bytes) = (0, 0);
    let mut second = 0u64;
    while began.elapsed() < WINDOW {
        exporter_bytes = exporter_bytes.max(scrape(exporter_addr));
        if node_fast.is_some() {
            node_bytes = node_bytes.max(scrape(node_fast_addr));
            if second.is_multiple_of(10) {
                scrape(node_slow_addr);
            }
        }
        second += 1;
        let next = began + Duration::from_secs(second);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let wall = began.elapsed().as_secs_f64();
    let results: Vec<(String, f64, (u64, u64))> = measured
        .iter()
        .map(|m| {
            let share = cpu_ns(m.pid).saturating_sub(m.cpu_before) as f64 / 1e9 / wall * 100.0;
            (m.name.clone(), share, memory(m.pid))
        })
        .collect();

    // Check that the monitors measured something: every report saw the 4 workloads.
    let text = std::fs::read_to_string(&reports).expect("reports");
    let runtimes_per_report: Vec<usize> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|r| r["neuron_runtime_data"].as_array().map_or(0, Vec::len))
        .collect();
    let full = runtimes_per_report.iter().filter(|&&n| n == WORKLOADS as usize).count();
    assert!(full + 10 >= runtimes_per_report.len(), "reports without the 4 workloads: {runtimes_per_report:?}");
    assert!(exporter_bytes > 0, "the exporter answered");

    println!("neuron-monitor's cost, 1 s period, {WORKLOADS} workloads × 2 busy cores, over {wall:.1} s:");
    println!("  {} reports, {} of them with all {WORKLOADS} workloads", runtimes_per_report.len(), full);
    println!("  /metrics: {exporter_bytes} bytes; node_exporter's: {node_bytes} bytes");
    for (name, share, (rss, peak)) in &results {
        println!(
            "  {name:<48} CPU {share:>6.3}% of one core   RSS {:>5.1} MiB (peak {:.1} MiB)",
            *rss as f64 / 1048576.0,
            *peak as f64 / 1048576.0
        );
    }
    if let (Some((_, fast, (node_rss, _))), Some((_, slow, _))) = (results.get(2), results.get(3)) {
        for (name, share, (rss, _)) in &results[..2] {
            println!(
                "  {name}: {:.2}× the CPU of node_exporter scraped every 1 s ({:.2}× every 10 s), {:.2}× its RSS",
                share / fast.max(1e-9),
                share / slow.max(1e-9),
                *rss as f64 / (*node_rss).max(1) as f64
            );
        }
    }
    println!("  goals: CPU ≤ 0.5% of one core, RSS ≤ 30 MiB");
}
