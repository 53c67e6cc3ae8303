//! An all-reduce inside a program against the same all-reduce through the collectives
//! API (`nccom-test`), in the same run: 4 processes of one rank each under `mpirun`,
//! `f32`, 1 to 256 MiB per rank.
//!
//! The program is a one-instruction HLO all-reduce run by `neuron-bench exec` (its
//! input and output tensors copied in and out of the program as every execution does);
//! `nccom-test` all-reduces device tensors. Each side's figure is its slowest process's
//! mean time per operation (`nccom-test`'s `time(us)`; `neuron-bench`'s executions over
//! its wall time). The ratio is `nccom-test`'s time over the program's: 1 when a
//! program's all-reduce moves data as fast as the API's. The program runs twice: as
//! by default, every output then checked for NaN and infinities after each execution
//! (`NEURON_RT_NUMERICAL_ERRORS_VERBOSITY`, a read of the whole output that
//! `nccom-test` does not make), and with that check off (`none`).
//!
//! Four processes share this host's cores, so one run's figure moves with the
//! scheduler: each size runs the three sides in turn `ROUNDS` times, and each figure is
//! the median of its rounds.
//!
//! Run: `cargo bench -p neuron-profiler --bench program_collectives [-- MIB ...]`.
//! Results go in BENCHMARKS.md.

use std::process::Command;

use neuron_test_support::process::{Sandbox, all_reduce_hlo, free_port, mpirun};

const PROCESSES: usize = 4;
/// Runs of each side per size, interleaved; the median is reported.
const ROUNDS: usize = 5;

fn main() {
    let sizes: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![1, 4, 16, 64, 256] } else { sizes };
    let sandbox = Sandbox::new();
    println!(
        "{PROCESSES} processes of one rank under mpirun, f32 all-reduce, mean time per operation, slowest process, \
         median of {ROUNDS} interleaved runs"
    );
    println!(
        "{:>10} {:>12} {:>7} {:>14} {:>7} {:>10}",
        "bytes", "program ms", "ratio", "unchecked ms", "ratio", "nccom ms"
    );
    for mib in sizes {
        let bytes = mib << 20;
        // About 1 GiB per rank in all, and at least 4.
        let iterations = (1024 / mib).clamp(4, 300);
        let (mut program, mut unchecked, mut nccom) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let Some(checked) = program_ms(&sandbox, bytes, iterations, "warning") else { return };
            program.push(checked);
            unchecked.extend(program_ms(&sandbox, bytes, iterations, "none"));
            nccom.extend(nccom_ms(&sandbox, bytes, iterations));
        }
        let (program, unchecked, nccom) = (median(program), median(unchecked), median(nccom));
        println!(
            "{bytes:>10} {program:>12.2} {:>7.2} {unchecked:>14.2} {:>7.2} {nccom:>10.2}",
            nccom / program,
            nccom / unchecked
        );
    }
}

fn median(mut figures: Vec<f64>) -> f64 {
    figures.sort_by(f64::total_cmp);
    figures[figures.len() / 2]
}

/// The environment both sides run in: one core per process, a root address of its own.
fn job(sandbox: &Sandbox, binary: &str) -> Command {
    let mut command = Command::new(binary);
    sandbox
        .env(&mut command)
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
        .env("NEURON_RT_NUM_CORES", "1")
        .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{}", free_port()));
    command
}

fn run(mut mpirun: Command, what: &str) -> String {
    let output = mpirun.output().expect("mpirun runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{what}: {text}{}", String::from_utf8_lossy(&output.stderr));
    text
}

/// The program's mean time per execution, ms: the slowest process's wall time over its
/// executions (`neuron-bench exec --json`, one object per process), with
/// `NEURON_RT_NUMERICAL_ERRORS_VERBOSITY=verbosity`.
fn program_ms(sandbox: &Sandbox, bytes: u64, iterations: u64, verbosity: &str) -> Option<f64> {
    let hlo = all_reduce_hlo(sandbox.path(), (bytes / 4) as usize);
    let mut program = job(sandbox, env!("CARGO_BIN_EXE_neuron-bench"));
    program.env("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", verbosity);
    program.args(["exec", "--json", "--warmup", "2", "--iterations", &iterations.to_string()]).arg(&hlo);
    let text = run(mpirun(PROCESSES, &program)?, "neuron-bench exec");
    let slowest = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|report| report["throughput_per_second"].as_f64())
        .map(|per_second| 1e3 / per_second)
        .fold(None, |slowest: Option<f64>, ms| Some(slowest.map_or(ms, |s| s.max(ms))));
    Some(slowest.unwrap_or_else(|| panic!("no report from neuron-bench: {text}")))
}

/// `nccom-test`'s mean time per operation, ms (its `time(us)` column: the slowest rank's).
fn nccom_ms(sandbox: &Sandbox, bytes: u64, iterations: u64) -> Option<f64> {
    let size = bytes.to_string();
    let mut program = job(sandbox, env!("CARGO_BIN_EXE_nccom-test"));
    program.args(["-r", &PROCESSES.to_string(), "allr", "-b", &size, "-e", &size, "-n", &iterations.to_string()]);
    let text = run(mpirun(PROCESSES, &program)?, "nccom-test");
    let row = text.lines().find(|l| l.split_whitespace().next() == Some(size.as_str()));
    let time_us = row.and_then(|r| r.split_whitespace().nth(3)?.parse::<f64>().ok());
    Some(time_us.unwrap_or_else(|| panic!("no row for {size} bytes: {text}")) / 1e3)
}
