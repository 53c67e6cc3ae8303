//! NeuronCores are reserved exclusively per process across the host: a second
//! process asking for a held core is refused at once, and the reservation dies with
//! its holder, even when the holder is killed with SIGKILL; the next runtime to start
//! removes the datastore file the killed holder left behind.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const MODEL: &str = "HloModule tiny\nENTRY e {\n  x = f32[4]{0} parameter(0)\n  ROOT y = f32[4]{0} negate(x)\n}\n";

fn bench(lock_dir: &Path, model: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_neuron-bench"));
    command
        .env("NEURON_VIRT_LOCK_DIR", lock_dir)
        // The killed holder's datastore file stays behind until the next runtime starts:
        // keep it in the test's directory.
        .env("NEURON_VIRT_DATASTORE_DIR", lock_dir.with_file_name("datastores"))
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .args(["exec", "--cores", "0"])
        .args(extra)
        .arg(model);
    command
}

#[test]
fn a_held_core_is_refused_until_its_holder_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("tiny.hlo");
    std::fs::write(&model, MODEL).expect("write model");
    let lock_dir = dir.path().join("run");

    let mut holder = bench(&lock_dir, &model, &["--duration", "300s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the holder");
    // The holder prints a progress line once it has run for a second: by then it
    // holds nc0.
    let mut progress = String::new();
    BufReader::new(holder.stderr.take().expect("piped")).read_line(&mut progress).expect("holder progress");
    assert!(progress.contains("executions"), "holder did not start: {progress:?}");

    let refused = bench(&lock_dir, &model, &["--iterations", "1"]).output().expect("run the second process");
    assert!(!refused.status.success(), "the second process must fail");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("NRT_EXEC_NC_BUSY (1005)"), "{stderr}");
    assert!(stderr.contains("NeuronCore(s) not available - Requested:nc0-nc0 Available:1"), "{stderr}");
    assert!(stderr.contains(&format!("nc0 is held by pid {} (neuron-bench)", holder.id())), "{stderr}");

    kill(Pid::from_raw(holder.id() as i32), Signal::SIGKILL).expect("SIGKILL the holder");
    holder.wait().expect("reap the holder");
    let datastores = lock_dir.with_file_name("datastores");
    let holder_file = datastores.join(format!("nrt-{}-0.ds", holder.id()));
    assert!(holder_file.exists(), "a killed runtime cannot remove its own file");

    let after = bench(&lock_dir, &model, &["--iterations", "1"]).output().expect("run a third process");
    assert!(after.status.success(), "the core must be free again: {}", String::from_utf8_lossy(&after.stderr));
    assert!(!holder_file.exists(), "the next runtime removes the file of the killed one");
}
