//! `nccom-test` as users run it: ranks as processes of this host, every operation and a
//! few element types checked on every rank, the table's columns, every operation and
//! element type under a real `mpirun` (4 processes of one rank, 2 of two), and the
//! refusals.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use neuron_test_support::process::{Sandbox, cpu_ns, free_port, mpirun};

fn nccom_test(sandbox: &Sandbox) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nccom-test"));
    sandbox.env(&mut command).env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge").env_remove("NEURON_RT_ROOT_COMM_ID");
    command
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// One row of the table.
struct Row {
    size: u64,
    count: u64,
    dtype: String,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    check: String,
}

/// The table's rows.
fn rows(stdout: &str) -> Vec<Row> {
    stdout
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim_start().starts_with("size"))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert!(fields.len() >= 6, "a row of size count type time algbw busbw: {line}");
            let number = |i: usize| fields[i].parse::<f64>().unwrap_or_else(|_| panic!("{line}"));
            Row {
                size: number(0) as u64,
                count: number(1) as u64,
                dtype: fields[2].to_owned(),
                time_us: number(3),
                algbw: number(4),
                busbw: number(5),
                check: fields[6..].join(" "),
            }
        })
        .collect()
}

/// Whether `printed` is `exact` as the table prints it (3 decimals; the time's own
/// rounding to 0.1 µs allowed for).
fn printed_as(printed: f64, exact: f64) -> bool {
    (printed - exact).abs() <= 0.0005 + 0.01 * exact.abs()
}

#[test]
fn every_operation_gives_every_rank_the_expected_result() {
    let sandbox = Sandbox::new();
    for (operation, datatype, element) in
        [("allr", "fp32", 4), ("allg", "bf16", 2), ("redsc", "int32", 4), ("alltoall", "fp16", 2), ("allr", "uint8", 1)]
    {
        let output = nccom_test(&sandbox)
            .args(["-r", "3", operation, "-b", "8", "-e", "256K", "-f", "8", "-n", "3", "--check", "-d", datatype])
            .output()
            .expect("runs");
        let log = text(&output);
        assert!(output.status.success(), "{operation} {datatype}: {log}");
        let rows = rows(&String::from_utf8_lossy(&output.stdout));
        assert_eq!(rows.len(), 6, "8 B to 256 KiB by 8: {log}");
        // Bus bandwidth as NCCL defines it, from the row's own size and time.
        let factor = if operation == "allr" { 2.0 * 2.0 / 3.0 } else { 2.0 / 3.0 };
        for row in rows {
            assert_eq!(row.size, row.count * element, "{operation} {datatype}: {log}");
            let algbw = row.size as f64 / (row.time_us * 1e3);
            assert!(printed_as(row.algbw, algbw), "{operation} {datatype}: algbw is size / time: {log}");
            assert!(printed_as(row.busbw, algbw * factor), "{operation} {datatype}: busbw: {log}");
            assert_eq!(row.check, "ok", "{operation} {datatype}: every rank's result: {log}");
            assert!(!row.dtype.is_empty());
        }
    }
}

#[test]
fn every_operation_and_element_type_is_right_on_4_processes_of_1_rank_and_2_of_2_under_mpirun() {
    let sandbox = Sandbox::new();
    const TYPES: [&str; 5] = ["fp32", "fp16", "bf16", "int32", "uint8"];
    for (processes, cores) in [(4, "1"), (2, "2")] {
        for (operation, name) in
            [("allr", "all-reduce"), ("allg", "all-gather"), ("redsc", "reduce-scatter"), ("alltoall", "all-to-all")]
        {
            let mut program = nccom_test(&sandbox);
            program
                .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{}", neuron_test_support::process::free_port()))
                .env("NEURON_RT_NUM_CORES", cores)
                .args(["-r", "4"])
                .args([operation, "-b", "64", "-e", "64K", "-f", "32", "-n", "2", "--check"])
                .args(["-d", &TYPES.join(",")]);
            // Without -r, the rank count is the launcher's.
            if processes == 4 {
                let args: Vec<_> = program.get_args().skip(2).map(ToOwned::to_owned).collect();
                let envs: Vec<_> = program.get_envs().map(|(k, v)| (k.to_owned(), v.map(ToOwned::to_owned))).collect();
                program = Command::new(program.get_program());
                for (name, value) in envs {
                    match value {
                        Some(value) => program.env(name, value),
                        None => program.env_remove(name),
                    };
                }
                program.args(args);
            }
            let Some(mut mpirun) = mpirun(processes, &program) else { return };
            let output = mpirun.output().expect("mpirun runs");
            let log = text(&output);
            let job = format!("{processes} processes of {cores} rank(s), {operation}");
            assert!(output.status.success(), "{job}: {log}");
            for datatype in TYPES {
                assert!(log.contains(&format!("# nccom-test {name} on 4 ranks, {datatype},")), "{job}: {log}");
            }
            // Three sizes per type, each checked on every rank against the expected result.
            let rows = rows(&String::from_utf8_lossy(&output.stdout));
            assert!(rows.len() == 3 * TYPES.len() && rows.iter().all(|r| r.check == "ok"), "{job}: {log}");
        }
    }
}

#[test]
fn impossible_jobs_are_refused_saying_what_to_change() {
    let sandbox = Sandbox::new();
    let output = nccom_test(&sandbox)
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.2xlarge")
        .args(["-r", "4", "allr"])
        .output()
        .expect("runs");
    assert!(!output.status.success());
    assert!(
        text(&output).contains("-r 4 needs as many NeuronCores, one per rank, and this trn1.2xlarge has 2"),
        "{}",
        text(&output)
    );
    let output = nccom_test(&sandbox).args(["-r", "2", "-N", "2", "allr"]).output().expect("runs");
    assert!(!output.status.success());
    assert!(text(&output).contains("run under mpirun or srun"), "{}", text(&output));
}

#[test]
fn a_rank_whose_process_is_stopped_is_named_stopped_with_the_age_of_its_last_heartbeat() {
    let sandbox = Sandbox::new();
    let port = free_port();
    let ranks = [0, 1].map(|rank: u32| {
        nccom_test(&sandbox)
            .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{port}"))
            .env("NEURON_RT_EXEC_TIMEOUT", "6")
            .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".to_owned())])
            .args(["allr", "-b", "4K", "-e", "4K", "-n", "10000000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts")
    });
    let stopped = ranks[1].id();
    // Once rank 1 has run collectives for a while, it is stopped as Ctrl-Z stops it.
    let started = Instant::now();
    while cpu_ns(stopped) < 300_000_000 {
        assert!(started.elapsed() < Duration::from_secs(60), "rank 1 never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let kill = |signal: &str| Command::new("kill").args([signal, &stopped.to_string()]).status().expect("kill runs");
    kill("-STOP");
    let [rank0, rank1] = ranks;
    let output = rank0.wait_with_output().expect("ends");
    kill("-KILL");
    let _ = rank1.wait_with_output();
    let log = text(&output);
    assert!(!output.status.success(), "{log}");
    assert!(
        log.contains(&format!("rank 1 (pid {stopped} on host "))
            && log.contains("its process is stopped by a signal (SIGSTOP, Ctrl-Z): no heartbeat for "),
        "{log}"
    );
}
