//! What `neuron-monitor` costs with a job of 32 ranks on the host: 32 `neuron-bench
//! exec` processes under `mpirun` (one core each, `trn1.32xlarge`), all-reducing 64 KiB
//! without end, so that every rank's flight record is full and moving.
//!
//! Measured side by side over the same window, at a 1 s period:
//!
//! - `neuron-monitor` with every group, the `collectives` group of the 32 ranks among
//!   them, its `/metrics` fetched every second;
//! - the baseline: the same without the `collectives` group;
//! - `neuron-monitor` with every group and `collectives`, its JSON reports alone (its
//!   default output; no Prometheus endpoint).
//!
//! CPU time is the sum of the process's threads' run time over the window, as a share of
//! one core. The last report is checked to show the 32 ranks.
//!
//! Run: `cargo bench -p neuron-monitor --bench ranks`. Results go in BENCHMARKS.md.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::http::http_get;
use neuron_test_support::process::{Running, Sandbox, all_reduce_job, cpu_ns};

const MONITOR: &str = env!("CARGO_BIN_EXE_neuron-monitor");
const RANKS: usize = 32;
const WINDOW: Duration = Duration::from_secs(30);

/// A monitor at 1 s with every group (`collectives` too, or not), serving `/metrics`
/// (or not: then no address); its reports go to `reports`.
fn monitor(
    sandbox: &Sandbox,
    (collectives, metrics): (bool, bool),
    reports: &std::path::Path,
) -> (Running, Option<SocketAddr>) {
    let system = if collectives {
        r#"[{"type": "vcpu_usage"}, {"type": "memory_info"}, {"type": "neuron_hw_counters"}, {"type": "collectives"}]"#
    } else {
        r#"[{"type": "vcpu_usage"}, {"type": "memory_info"}, {"type": "neuron_hw_counters"}]"#
    };
    let config = sandbox.path().join(format!("monitor-{collectives}-{metrics}.json"));
    std::fs::write(
        &config,
        format!(
            r#"{{"period": "1s", "neuron_runtimes": [{{"tag_filter": ".*", "metrics": [
                 {{"type": "neuroncore_counters"}}, {{"type": "execution_stats"}}, {{"type": "memory_used"}},
                 {{"type": "neuron_runtime_vcpu_usage"}}]}}], "system_metrics": {system}}}"#
        ),
    )
    .expect("config");
    let mut command = Command::new(MONITOR);
    sandbox.env(&mut command).arg("-c").arg(&config);
    if metrics {
        command.args(["--prometheus-listen", "0"]);
    }
    let mut running = Running(
        command
            .stdout(std::fs::File::create(reports).expect("reports file"))
            .stderr(Stdio::piped())
            .spawn()
            .expect("neuron-monitor"),
    );
    if !metrics {
        return (running, None);
    }
    let mut line = String::new();
    BufReader::new(running.0.stderr.take().expect("stderr")).read_line(&mut line).expect("the address");
    let addr = line.split_whitespace().find_map(|w| w.trim_start_matches("http://").split('/').next()?.parse().ok());
    (running, Some(addr.unwrap_or_else(|| panic!("no address in {line:?}"))))
}

/// The ranks of the first communicator of the last report in `reports`.
fn ranks_seen(reports: &std::path::Path) -> usize {
    let text = std::fs::read_to_string(reports).unwrap_or_default();
    let last = text.lines().rev().find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    last.and_then(|r| r["system_data"]["collectives"]["communicators"][0]["members"].as_array().map(Vec::len))
        .unwrap_or(0)
}

fn main() {
    let sandbox = Sandbox::new();
    let Some(_job) = all_reduce_job(&sandbox, RANKS, 1_000_000, &[]) else {
        eprintln!("no mpirun: nothing measured");
        return;
    };
    let (with_reports, without_reports) = (sandbox.path().join("with.jsonl"), sandbox.path().join("without.jsonl"));
    let json_reports = sandbox.path().join("json.jsonl");
    let (with, with_addr) = monitor(&sandbox, (true, true), &with_reports);
    let (without, without_addr) = monitor(&sandbox, (false, true), &without_reports);
    let (json, _) = monitor(&sandbox, (true, false), &json_reports);
    let (with_addr, without_addr) = (with_addr.expect("serving"), without_addr.expect("serving"));
    eprintln!("{RANKS} ranks starting; waiting until the monitor shows them all");
    let deadline = Instant::now() + Duration::from_secs(300);
    while ranks_seen(&with_reports) < RANKS {
        assert!(Instant::now() < deadline, "the monitor never showed {RANKS} ranks");
        std::thread::sleep(Duration::from_secs(1));
    }
    let pids = [with.0.id(), without.0.id(), json.0.id()];
    let before = pids.map(cpu_ns);
    let began = Instant::now();
    let (mut bytes_with, mut bytes_without) = (0, 0);
    let mut second = 0;
    while began.elapsed() < WINDOW {
        bytes_with = bytes_with.max(http_get(with_addr, "/metrics").1.len());
        bytes_without = bytes_without.max(http_get(without_addr, "/metrics").1.len());
        second += 1;
        std::thread::sleep((began + Duration::from_secs(second)).saturating_duration_since(Instant::now()));
    }
    let wall = began.elapsed().as_secs_f64();
    let share = |k: usize| (cpu_ns(pids[k]).saturating_sub(before[k])) as f64 / 1e9 / wall * 100.0;
    let (cpu_with, cpu_without, cpu_json) = (share(0), share(1), share(2));
    assert_eq!(ranks_seen(&with_reports), RANKS, "the last report shows every rank");
    assert_eq!(ranks_seen(&json_reports), RANKS, "the JSON-only monitor's last report shows every rank");
    println!("neuron-monitor at a 1 s period, a job of {RANKS} ranks on this host, over {wall:.1} s:");
    println!("  with the collectives group    CPU {cpu_with:>6.3}% of one core   /metrics {bytes_with} bytes");
    println!("  without it (baseline)         CPU {cpu_without:>6.3}% of one core   /metrics {bytes_without} bytes");
    println!("  with / without                {:>6.2}", cpu_with / cpu_without.max(1e-9));
    println!("  with the group, JSON reports alone (no /metrics)   CPU {cpu_json:>6.3}% of one core");
    println!("  goal: ≤ 1% of one core with {RANKS} ranks");
}
