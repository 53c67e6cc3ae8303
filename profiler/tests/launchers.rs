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
    // A program without collectives pays nothing for the job: no bootstrap is attempted
    // (`node0` would not even resolve).
    assert!(!log.contains("Connect to") && !log.contains("root address"), "{log}");

    let refused = bench(work.path())
        .env("NEURON_RT_ROOT_COMM_ID", "no-such-host.invalid:41211")
        .output()
        .expect("neuron-bench runs");
    let log = text(&refused);
    assert!(!refused.status.success(), "{log}");
    assert!(
        log.contains(
            "Invalid NCCL_COMM_ID [no-such-host.invalid:41211], please use format: <ipv4>:<port> or [<ipv6>]:<port>"
        ),
        "{log}"
    );
}

/// An all-reduce of 1024 floats over every rank, as HLO text in `dir`.
fn all_reduce_hlo(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("allreduce.hlo");
    let hlo = "HloModule allreduce\n\nsum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n\n\
               ENTRY main {\n  x = f32[1024]{0} parameter(0)\n  ROOT r = f32[1024]{0} all-reduce(x), replica_groups={}, to_apply=sum\n}\n";
    std::fs::write(&path, hlo).expect("write");
    path
}

fn free_root() -> String {
    let port = neuron_test_support::process::free_port();
    format!("127.0.0.1:{port}")
}

/// `neuron-bench exec` of a collectives program as one process of a job of two, with
/// two cores each.
fn rank_process(work: &std::path::Path, root: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_neuron-bench"));
    command
        .env("NEURON_VIRT_LOCK_DIR", work.join("locks"))
        .env("NEURON_VIRT_DATASTORE_DIR", work.join("datastores"))
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
        .env("NEURON_RT_LOG_LEVEL", "info")
        .env("NEURON_RT_NUM_CORES", "2")
        .env("NEURON_RT_ROOT_COMM_ID", root)
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .args(["exec", "--iterations", "20"])
        .arg(all_reduce_hlo(work));
    command
}

fn assert_two_processes_of_two_ranks(log: &str) {
    for ranks in ["ranks 0-1 of 4, across 2 processes", "ranks 2-3 of 4, across 2 processes"] {
        assert!(log.contains(ranks), "no `{ranks}`: {log}");
    }
    assert_eq!(log.matches("executions   40 in").count(), 2, "each process runs its two ranks 20 times: {log}");
}

#[test]
fn neuron_bench_runs_the_ranks_of_a_job_across_mpirun_processes() {
    let work = tempfile::tempdir().expect("tempdir");
    let program = rank_process(work.path(), &free_root());
    let Some(mut mpirun) = neuron_test_support::process::mpirun(2, &program) else { return };
    let output = mpirun.output().expect("mpirun runs");
    let log = text(&output);
    assert!(output.status.success(), "{log}");
    assert_two_processes_of_two_ranks(&log);
    // Each line of a process says which ranks it is: the processes share a terminal.
    assert!(log.lines().any(|l| l.starts_with("[ranks 2-3 of 4] executions   40 in")), "{log}");

    // On the default instance (2 NeuronCores) the job does not fit: the process that
    // finds the cores taken names their holder, the job's other process, and the
    // instance that has enough.
    let work = tempfile::tempdir().expect("tempdir");
    let mut program = rank_process(work.path(), &free_root());
    program.env_remove("NEURON_VIRT_INSTANCE_TYPE");
    let Some(mut mpirun) = neuron_test_support::process::mpirun(2, &program) else { return };
    let output = mpirun.output().expect("mpirun runs");
    let log = text(&output);
    assert!(!output.status.success(), "{log}");
    let refusal = log.lines().find(|l| l.contains("NRT_EXEC_NC_BUSY")).unwrap_or_else(|| panic!("{log}"));
    assert!(
        refusal.contains("(neuron-bench), process ") && refusal.contains(" of a job (OMPI_COMM_WORLD_RANK)"),
        "{refusal}"
    );
    assert!(
        refusal.contains(
            "need 4 NeuronCores (2 each) and trn1.2xlarge has 2: set NEURON_VIRT_INSTANCE_TYPE=trn1.32xlarge"
        ),
        "{refusal}"
    );
}

#[test]
fn neuron_bench_runs_the_ranks_of_a_job_started_with_torchrun_variables() {
    let work = tempfile::tempdir().expect("tempdir");
    let root = free_root();
    let children: Vec<std::process::Child> = (0..2)
        .map(|rank| {
            rank_process(work.path(), &root)
                .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".into())])
                .envs([("LOCAL_RANK", rank.to_string()), ("LOCAL_WORLD_SIZE", "2".into())])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("starts")
        })
        .collect();
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().expect("ends")).collect();
    let log: String = outputs.iter().map(text).collect();
    assert!(outputs.iter().all(|o| o.status.success()), "{log}");
    assert_two_processes_of_two_ranks(&log);
}
