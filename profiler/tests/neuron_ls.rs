//! `neuron-ls` against real runtime processes: live ones, and one killed with SIGKILL
//! (which gets no chance to remove its datastore).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// How soon a killed runtime must be reported exited.
const REPORT_WITHIN: Duration = Duration::from_secs(2);

fn datastores(dir: &Path) -> PathBuf {
    dir.join("datastores")
}

/// `neuron-bench demo` in the background, with its own lock and datastore directories.
fn spawn_demo(dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_neuron-bench"))
        .args(["demo", "--duration", "60s"])
        .env("NEURON_VIRT_LOCK_DIR", dir.join("locks"))
        .env("NEURON_VIRT_DATASTORE_DIR", datastores(dir))
        .env("NEURON_PROCESS_TAG", "kill-me")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start neuron-bench demo")
}

/// `neuron-ls --json-output`: the processes it lists, by pid (a process holding cores
/// on several devices appears once per device).
fn neuron_ls(dir: &Path) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-ls"))
        .arg("--json-output")
        .env("NEURON_VIRT_DATASTORE_DIR", datastores(dir))
        .output()
        .expect("run neuron-ls");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let devices: Vec<Value> = serde_json::from_slice(&out.stdout).expect("neuron-ls prints a JSON array");
    devices.iter().flat_map(|d| d["neuron_processes"].as_array().cloned().unwrap_or_default()).collect()
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

#[test]
fn a_runtime_killed_with_sigkill_is_reported_exited_and_its_file_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut demo = spawn_demo(dir.path());
    let pid = demo.id();

    // Wait for the runtime to come up and be listed live, with its tag and cores.
    let started = Instant::now();
    let live = loop {
        let listed: Vec<Value> = neuron_ls(dir.path()).into_iter().filter(|p| p["pid"] == pid).collect();
        if let Some(p) = listed.first() {
            break p.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the demo never appeared in neuron-ls");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(live["state"], "live", "{live}");
    assert_eq!(live["tag"], "kill-me");
    assert_eq!(live["cores"], serde_json::json!([0, 1]));
    let files = files_in(&datastores(dir.path()));
    assert_eq!(files.len(), 1, "{files:?}");

    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("SIGKILL the demo");
    let killed = Instant::now();
    demo.wait().expect("reap the demo");
    assert!(files[0].exists(), "a killed writer cannot remove its own file");

    let exited = loop {
        let listed: Vec<Value> = neuron_ls(dir.path()).into_iter().filter(|p| p["pid"] == pid).collect();
        if let Some(p) = listed.iter().find(|p| p["state"] == "exited") {
            break p.clone();
        }
        assert!(killed.elapsed() < REPORT_WITHIN, "not reported exited within {REPORT_WITHIN:?}: {listed:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let reported_after = killed.elapsed();
    eprintln!("reported exited {reported_after:?} after SIGKILL: {exited}");
    assert!(reported_after < REPORT_WITHIN);
    assert_eq!(exited["exit_reason"], "process gone", "{exited}");
    assert!(!files[0].exists(), "the reader that saw it exited removed {}", files[0].display());
    assert!(neuron_ls(dir.path()).is_empty(), "an exited runtime is listed once, then forgotten");
}

#[test]
fn the_ranks_of_a_job_of_processes_are_listed_with_their_cores() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hlo = dir.path().join("allreduce.hlo");
    std::fs::write(
        &hlo,
        "HloModule allreduce\n\nsum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n\n\
         ENTRY main {\n  x = f32[16]{0} parameter(0)\n  ROOT r = f32[16]{0} all-reduce(x), replica_groups={}, to_apply=sum\n}\n",
    )
    .expect("write");
    let port = neuron_test_support::process::free_port();
    // Two processes of a torchrun-style job, one core and one rank each, running long,
    // on nc2 and nc3 of a trn1.32xlarge that neuron-ls is not told of: it shows the
    // instance the runtimes declare.
    let mut ranks: Vec<Child> = (0..2)
        .map(|rank| {
            Command::new(env!("CARGO_BIN_EXE_neuron-bench"))
                .args(["exec", "--iterations", "1000000"])
                .arg(&hlo)
                .env("NEURON_VIRT_LOCK_DIR", dir.path().join("locks"))
                .env("NEURON_VIRT_DATASTORE_DIR", datastores(dir.path()))
                .env("NEURON_RT_VISIBLE_CORES", (2 + rank).to_string())
                .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
                .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{port}"))
                .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".to_owned())])
                .env_remove("NEURON_RT_NUM_CORES")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let started = Instant::now();
    let listed = loop {
        let mut listed: Vec<(u64, Value)> = neuron_ls(dir.path())
            .into_iter()
            .filter(|p| p["ranks"].as_array().is_some_and(|r| !r.is_empty()))
            .map(|p| (p["ranks"][0]["rank"].as_u64().unwrap_or(u64::MAX), p))
            .collect();
        if listed.len() == 2 {
            listed.sort_by_key(|(rank, _)| *rank);
            break listed;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the ranks never appeared in neuron-ls: {listed:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let table = Command::new(env!("CARGO_BIN_EXE_neuron-ls"))
        .env("NEURON_VIRT_DATASTORE_DIR", datastores(dir.path()))
        .env_remove("NEURON_VIRT_INSTANCE_TYPE")
        .output()
        .expect("run neuron-ls");
    for rank in &mut ranks {
        let _ = rank.kill();
        let _ = rank.wait();
    }
    for (expected, (rank, process)) in listed.iter().enumerate() {
        assert_eq!(*rank, expected as u64, "{process}");
        assert_eq!(process["ranks"][0]["ranks"], 2, "{process}");
        assert_eq!(process["ranks"][0]["core"], process["cores"][0], "the rank's core is the process's: {process}");
        assert_eq!(process["cores"], serde_json::json!([2 + expected]), "{process}");
    }
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("instance-type: trn1.32xlarge"), "{table}");
}
