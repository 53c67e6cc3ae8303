//! The dashboard in a real headless browser: Chromium (Debian's) driven by
//! `playwright-core` (from npm, `web/e2e`), against a running workload and two captured
//! profiles, against a job of four ranks under `mpirun`, against that job's rank
//! profiles, and where a metric's exemplar leads (an execution in the rings). The checks
//! are in `web/e2e/dashboard.mjs`, `web/e2e/ranks.mjs`, `web/e2e/job.mjs` and
//! `web/e2e/execution.mjs`; screenshots of each page are left in
//! `target/dashboard-screenshots`.

use std::path::{Path, PathBuf};
use std::process::Command;

use neuron_test_support::process::{Sandbox, profiler_binary};

/// The dashboard binary these tests run.
const DASHBOARD: &str = env!("CARGO_BIN_EXE_neuron-dashboard");

/// One browser test at a time: each runs a workload or a job of ranks beside Chromium,
/// and two at once on a small host make the ranks' timing the host's, not the job's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the browser test needs, or why it cannot run: in CI, a failure; elsewhere, a note.
fn tools(e2e: &Path) -> Option<(PathBuf, PathBuf)> {
    let chromium = PathBuf::from(std::env::var_os("CHROMIUM").unwrap_or_else(|| "/usr/bin/chromium".into()));
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    let missing = match (node, chromium.exists(), e2e.join("node_modules/playwright-core").exists()) {
        (false, ..) => Some("node is not installed"),
        (_, false, _) => Some("chromium is not installed"),
        (_, _, false) => Some("playwright-core is not installed (npm ci --prefix web/e2e)"),
        _ => None,
    };
    if let Some(why) = missing {
        neuron_test_support::ci::missing(why, "the browser test");
        return None;
    }
    Some((PathBuf::from("node"), chromium))
}

#[test]
fn the_dashboard_in_a_headless_browser() {
    let _turn = one_at_a_time();
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e");
    let Some((node, chromium)) = tools(&e2e) else { return };
    let sandbox = Sandbox::new();
    let profiles = sandbox.path().join("profiles");
    std::fs::create_dir(&profiles).expect("mkdir");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for (model, executions) in [("mlp", "40"), ("attention", "20")] {
        let out = sandbox
            .env(&mut Command::new(profiler_binary("neuron-profile")))
            .args(["capture", "-n"])
            .arg(examples.join(format!("{model}.hlo")))
            .arg("-s")
            .arg(profiles.join(format!("{model}.ntff")))
            .args(["--num-exec", executions, "--profile-all-execs"])
            .output()
            .expect("neuron-profile runs");
        assert!(out.status.success(), "capture {model}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let _workload = neuron_test_support::process::demo(&sandbox, &["--duration", "300s"], &[]);
    let (_dashboard, url) = neuron_test_support::process::dashboard(
        &sandbox,
        DASHBOARD.as_ref(),
        &["--profiles".as_ref(), profiles.as_os_str()],
    );
    let measured = browser_checks((&node, &chromium, &e2e), "dashboard.mjs", &[&url, "mlp.ntff", "attention.ntff"]);
    assert!(measured["profile"]["tables"]["hlo"].as_u64().is_some_and(|n| n > 0));
}

#[test]
fn the_ranks_page_names_a_late_rank_in_a_headless_browser() {
    let _turn = one_at_a_time();
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e");
    let Some((node, chromium)) = tools(&e2e) else { return };
    let sandbox = Sandbox::new();
    let faults = [("NEURON_RT_FAULT_INJECT", "cc_delay:rank=2:delay=20ms")];
    let Some(_job) = neuron_test_support::process::all_reduce_job(&sandbox, 4, 3000, &faults) else { return };
    let (_dashboard, url) = neuron_test_support::process::dashboard(&sandbox, DASHBOARD.as_ref(), &[]);
    let measured = browser_checks((&node, &chromium, &e2e), "ranks.mjs", &[&url]);
    assert!(measured["ranks"]["straggler"].as_str().is_some_and(|s| s.starts_with("Straggler: rank 2")));
}

#[test]
fn a_jobs_rank_profiles_open_on_one_timeline_in_a_headless_browser() {
    let _turn = one_at_a_time();
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e");
    let Some((node, chromium)) = tools(&e2e) else { return };
    let sandbox = Sandbox::new();
    let profiles = sandbox.path().join("profiles");
    let hlo = neuron_test_support::process::all_reduce_hlo(sandbox.path(), 4096);
    // Four ranks, each process recording itself into the directory as its rank.
    let port = neuron_test_support::process::free_port();
    let mut program = Command::new(profiler_binary("neuron-profile"));
    sandbox
        .env(&mut program)
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
        .env("NEURON_RT_NUM_CORES", "1")
        .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{port}"))
        .env("NEURON_RT_FAULT_INJECT", "cc_delay:rank=2:delay=10ms")
        .args(["inspect", "-o"])
        .arg(&profiles)
        .arg(neuron_test_support::process::neuron_bench())
        .args(["exec", "--iterations", "60"])
        .arg(&hlo);
    let Some(mut mpirun) = neuron_test_support::process::mpirun(4, &program) else { return };
    let output = mpirun.output().expect("mpirun runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    // A fifth rank whose process died before its recording finished.
    std::fs::write(profiles.join("profile_rank_4.ntff.partial"), b"").expect("write");
    let (_dashboard, url) = neuron_test_support::process::dashboard(
        &sandbox,
        DASHBOARD.as_ref(),
        &["--profiles".as_ref(), profiles.as_os_str()],
    );
    let measured = browser_checks((&node, &chromium, &e2e), "job.mjs", &[&url, "4", "2"]);
    assert!(measured["arrows"]["drawn"].as_u64().is_some_and(|n| n > 0));
    // The job's page says first that rank 4's recording never finished.
    let addr = url.trim_start_matches("http://").trim_end_matches('/').parse().expect("the dashboard's address");
    let (status, body) = neuron_test_support::http::http_get(addr, "/api/job");
    assert_eq!(status, 200, "{body}");
    let meta: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let first = meta["problems"][0].as_str().unwrap_or_default();
    assert!(first.starts_with("profile_rank_4.ntff.partial was never finished"), "{:#}", meta["problems"]);
}

#[test]
fn an_exemplars_execution_opens_on_the_timeline_in_a_headless_browser() {
    let _turn = one_at_a_time();
    let e2e = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e");
    let Some((node, chromium)) = tools(&e2e) else { return };
    let sandbox = Sandbox::new();
    // A workload whose every 10th execution stalls 150 ms; the first such, by its id.
    let (bench, exec_id) = neuron_test_support::process::slow_workload(&sandbox);
    let exec_id = exec_id.to_string();
    let (_dashboard, url) = neuron_test_support::process::dashboard(&sandbox, DASHBOARD.as_ref(), &[]);
    let pid = bench.0.id().to_string();
    let measured = browser_checks((&node, &chromium, &e2e), "execution.mjs", &[&url, &pid, &exec_id]);
    assert!(measured["found"]["banner"].as_str().is_some_and(|b| b.contains(&exec_id)));
    drop(bench);
}

/// Runs the checks of `script` (in `e2e`) with `args` and the screenshot directory;
/// fails with what they printed, else gives their measurements.
fn browser_checks((node, chromium, e2e): (&Path, &Path, &Path), script: &str, args: &[&str]) -> serde_json::Value {
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots");
    let out = Command::new(node)
        .current_dir(e2e)
        .env("CHROMIUM", chromium)
        .arg(script)
        .args(args)
        .arg(&shots)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the browser checks failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let measured: serde_json::Value = serde_json::from_str(stdout.trim()).expect("measurements");
    eprintln!("{measured:#}");
    measured
}
