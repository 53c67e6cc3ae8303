//! The `collectives` group and its Prometheus series on a real job: four ranks of one
//! host under `mpirun`, each a `neuron-bench exec` process all-reducing, one of them
//! made late by `cc_delay`. The late rank is named in the JSON report and in the
//! exposition (how few collectives the rule needs is `neuron_datastore::ranks`'s
//! test); a balanced job names nobody.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::http::http_get;
use neuron_test_support::process::{Running, Sandbox, all_reduce_job};
use serde_json::Value;

const MONITOR: &str = env!("CARGO_BIN_EXE_neuron-monitor");
const FAULTS: &str = "NEURON_RT_FAULT_INJECT";

/// One 4-rank job at a time: two at once on a 2-CPU host time each other's ranks.
static ONE_JOB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_job() -> std::sync::MutexGuard<'static, ()> {
    ONE_JOB.lock().unwrap_or_else(|e| e.into_inner())
}

/// `neuron-monitor` reporting every 500 ms on stdout and on a Prometheus endpoint, and
/// the endpoint's address.
fn monitor(sandbox: &Sandbox) -> (Running, BufReader<std::process::ChildStdout>, SocketAddr) {
    let mut command = Command::new(MONITOR);
    let config = sandbox.path().join("collectives.json");
    std::fs::write(
        &config,
        r#"{"period": "500ms", "neuron_runtimes": [{"tag_filter": ".*", "metrics": [{"type": "execution_stats"}]}],
            "system_metrics": [{"type": "collectives"}]}"#,
    )
    .expect("config");
    sandbox.env(&mut command).arg("-c").arg(&config).args(["--prometheus-listen", "0"]);
    let mut running = Running(command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("starts"));
    let mut line = String::new();
    BufReader::new(running.0.stderr.take().expect("stderr")).read_line(&mut line).expect("the address");
    let addr = line.split_whitespace().find_map(|w| w.trim_start_matches("http://").split('/').next()?.parse().ok());
    let stdout = BufReader::new(running.0.stdout.take().expect("stdout"));
    (running, stdout, addr.unwrap_or_else(|| panic!("no address in {line:?}")))
}

/// Reads reports until `done` says one is what it waits for, for at most 60 s.
fn report_until(
    sandbox: &Sandbox,
    reports: &mut BufReader<std::process::ChildStdout>,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut line = String::new();
    let mut last = Value::Null;
    while Instant::now() < deadline {
        line.clear();
        if reports.read_line(&mut line).expect("a report") == 0 {
            break;
        }
        last = serde_json::from_str(&line).expect("JSON");
        if done(&last["system_data"]["collectives"]) {
            return last;
        }
    }
    panic!("no such report within 60 s; the last: {last:#}\n{}", sandbox.job_evidence());
}

/// The complete collectives the monitor saw of the report's first communicator.
fn seen(group: &Value) -> u64 {
    group["communicators"][0]["collectives_seen"].as_u64().unwrap_or(0)
}

#[test]
fn a_late_rank_is_named_in_the_report_and_the_exposition_and_a_balanced_job_names_nobody() {
    let _one = one_job();
    let sandbox = Sandbox::new();
    let (_monitor, mut reports, addr) = monitor(&sandbox);
    let Some(_job) = all_reduce_job(&sandbox, 4, 3000, &[(FAULTS, "cc_delay:rank=2:delay=20ms")]) else { return };
    let report = report_until(&sandbox, &mut reports, |g| g["communicators"][0]["straggler"].is_object());
    // The instance the job's runtimes declare, which the monitor was not told.
    assert_eq!(report["instance_info"]["instance_type"], "trn1.32xlarge", "{:#}", report["instance_info"]);
    assert_eq!(report["neuron_hardware_info"]["neuron_device_count"], 16);
    let group = &report["system_data"]["collectives"];
    let comm = &group["communicators"][0];
    assert_eq!(comm["ranks"], 4, "{comm:#}");
    assert_eq!(comm["members"].as_array().map(Vec::len), Some(4), "every rank: {comm:#}");
    assert_eq!(comm["straggler"]["rank"], 2, "{comm:#}");
    let (last_in, of) = (comm["straggler"]["last_in"].as_u64(), comm["straggler"]["of"].as_u64());
    // Last in every step but those of the job's start (its first two, while the ranks
    // still come up at different times).
    assert!(last_in.zip(of).is_some_and(|(l, o)| l + 2 >= o && o >= 5), "{comm:#}");
    let diagnosis = comm["diagnosis"][0].as_str().expect("a diagnosis");
    assert!(diagnosis.starts_with("rank 2 (pid ") && diagnosis.contains("arrived last in"), "{diagnosis}");
    // What it did before it arrived: the 20 ms it is made late by are spent inside its
    // execution, at its collective; the other ranks arrive soon after their previous
    // one ends (they waited in it for rank 2).
    let before = &comm["straggler"]["before"];
    let (since, executing) = (before["since_ns"].as_u64(), before["executing_ns"].as_u64());
    let others = before["others_since_ns"].as_u64();
    assert!(since.is_some_and(|s| s >= 20_000_000), "{comm:#}");
    assert!(executing.zip(since).is_some_and(|(e, s)| e >= 20_000_000 && e <= s), "{comm:#}");
    assert!(others.zip(since).is_some_and(|(o, s)| 2 * o < s), "{comm:#}");
    assert!(diagnosis.contains("; before it arrived, on median: "), "{diagnosis}");

    // The exposition says the same.
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let (status, body) = http_get(addr, "/metrics");
        assert_eq!(status, 200);
        if body.contains("neuron_collective_straggler") || Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let series = |prefix: &str| metrics.lines().filter(|l| l.starts_with(prefix)).collect::<Vec<_>>();
    let straggler = series("neuron_collective_straggler{");
    assert!(straggler.len() == 1 && straggler[0].contains(r#"rank="2""#), "{straggler:?}");
    // Counted from the collectives the monitor saw: rank 2 arrived last most often.
    let last_of = |rank: u32| -> f64 {
        series("neuron_collective_arrived_last_total{")
            .iter()
            .find(|l| l.contains(&format!(r#"rank="{rank}""#)))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("rank {rank}'s arrivals last: {metrics}"))
    };
    assert!([0, 1, 3].iter().all(|&r| last_of(2) > last_of(r)), "{metrics}");
    assert_eq!(series("neuron_collective_wait_seconds_count{").len(), 4, "a wait histogram per rank");
    assert_eq!(series("neuron_collective_skew_seconds_count{").len(), 1);
    assert_eq!(series("neuron_collective_last_completed_sequence{").len(), 4);
    // The Grafana dashboard's Ranks panels query only what is exported.
    let dashboard = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../grafana/neuron-monitor.json"))
        .expect("the dashboard");
    let queried = regex::Regex::new(r"neuron_collective_\w+").expect("regex");
    let mut names: Vec<&str> = queried.find_iter(&dashboard).map(|m| m.as_str()).collect();
    names.dedup();
    assert!(names.len() >= 5, "{names:?}");
    // (The hang's series is there while a hang lasts: the test below.)
    for name in names.into_iter().filter(|&n| n != "neuron_collective_hang_seconds") {
        assert!(metrics.lines().any(|l| l.starts_with(&format!("{name}{{"))), "{name} is not exported:\n{metrics}");
    }
    drop(_job);

    // Balanced: nobody, over more collectives than the rule looks at.
    let sandbox = Sandbox::new();
    let (_monitor, mut reports, _) = monitor(&sandbox);
    let Some(_job) = all_reduce_job(&sandbox, 4, 100_000, &[]) else { return };
    let report = report_until(&sandbox, &mut reports, |g| seen(g) >= 30);
    let comm = &report["system_data"]["collectives"]["communicators"][0];
    assert!(comm["straggler"].is_null(), "{comm:#}");
    assert!(comm["hang"].is_null(), "{comm:#}");
}

#[test]
fn a_hang_is_named_with_the_missing_rank_within_the_threshold_and_a_second() {
    let _one = one_job();
    // A 4 s timeout: the waiting ranks mark their wait after 2 s.
    let sandbox = Sandbox::new();
    let env = [(FAULTS, "cc_hang:rank=3:after=5"), ("NEURON_RT_EXEC_TIMEOUT", "4")];
    let (_monitor, mut reports, addr) = monitor(&sandbox);
    let Some(_job) = all_reduce_job(&sandbox, 4, 20, &env) else { return };
    let report = report_until(&sandbox, &mut reports, |g| g["communicators"][0]["hang"].is_object());
    let hang = &report["system_data"]["collectives"]["communicators"][0]["hang"];
    assert_eq!(hang["class"], "missing", "{hang:#}");
    assert_eq!(hang["awaited"], serde_json::json!([3]), "{hang:#}");
    let waited = hang["waited_ns"].as_u64().expect("how long");
    assert!((2_000_000_000..3_000_000_000).contains(&waited), "said within the threshold and a second: {hang:#}");
    let text = hang["text"].as_str().expect("text");
    assert!(
        text.contains("waiting") && text.contains("for rank 3 (pid ") && text.contains("never reached it"),
        "{text}"
    );
    // Rank 3's process is on this host: what it does is read from its datastore.
    assert!(text.contains("executing `allreduce` at `r`"), "{text}");
    let (_, metrics) = http_get(addr, "/metrics");
    let line = metrics.lines().find(|l| l.starts_with("neuron_collective_hang_seconds{"));
    assert!(line.is_some_and(|l| l.contains(r#"class="missing""#)), "{metrics}");
}
