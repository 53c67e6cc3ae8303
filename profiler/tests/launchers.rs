//! Processes started by a launcher know their place in the job: under a real `mpirun`
//! (Debian's Open MPI, which `.ci/run` installs) and with torchrun's variables, each
//! `neuron-bench` process logs which process of how many it is, and a malformed
//! `NEURON_RT_ROOT_COMM_ID` is refused in Neuron's words.

use std::process::{Command, Output};

fn bench(work: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_neuron-bench"));
    command
        .env("NEURON_VIRT_LOCK_DIR", work.join("locks"))
        .env("NEURON_VIRT_DATASTORE_DIR", work.join("datastores"))
        .env("NEURON_RT_LOG_LEVEL", "info")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .args(["exec", "--iterations", "2"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mlp.hlo"));
    command
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn each_process_of_an_mpirun_job_knows_which_it_is() {
    let work = tempfile::tempdir().expect("tempdir");
    let mut program = bench(work.path());
    // Each process takes one core of its own (the reservation is host-wide).
    program.env("NEURON_RT_NUM_CORES", "1");
    let Some(mut mpirun) = neuron_test_support::process::mpirun(2, &program) else { return };
    let output = mpirun.output().expect("mpirun runs");
    let log = text(&output);
    assert!(output.status.success(), "{log}");
    for rank in 0..2 {
        assert!(log.contains(&format!("process {rank} of 2 (Open MPI, {rank} on this host)")), "{log}");
    }
    assert!(log.contains("on nc0-nc0") && log.contains("on nc1-nc1"), "each process on its own core: {log}");
}

#[test]
fn torchrun_variables_and_the_root_address_are_read_as_torch_xla_reads_them() {
    let work = tempfile::tempdir().expect("tempdir");
    let output = bench(work.path())
        .envs([("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")])
        .env("MASTER_ADDR", "node0")
        .env_remove("NEURON_RT_ROOT_COMM_ID")
        .output()
        .expect("neuron-bench runs");
    let log = text(&output);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("process 1 of 2 (torchrun, 1 on this host); rank 0 at node0:62182 (MASTER_ADDR)"), "{log}");

    let refused = bench(work.path()).env("NEURON_RT_ROOT_COMM_ID", "host:41211").output().expect("neuron-bench runs");
    let log = text(&refused);
    assert!(!refused.status.success(), "{log}");
    assert!(
        log.contains("Invalid NCCL_COMM_ID [host:41211], please use format: <ipv4>:<port> or [<ipv6>]:<port>"),
        "{log}"
    );
}
