//! The C API as C programs see it: the headers compile alone in C and C++, their
//! structs have the layout the library writes, and C programs built with the system
//! `cc` against `include/nrt/` and `libnrt.so` run correctly — the examples (outputs
//! compared with the Rust API's on the same NEFF and inputs) and a program that
//! exercises every function and its misuse (`tests/c/api_checks.c`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use neuron_datastore::DatastoreReader;
use neuron_runtime::{
    AutoCast, CompileOptions, Neff, Runtime, Target, TensorPlacement, TensorSet, compile_hlo, compile_hlo_with,
};
use neuron_test_support::process::{Sandbox, profiler_binary};
use serde_json::Value;

const HEADERS: &[&str] = &[
    "nrt/nrt",
    "nrt/nrt_status",
    "nrt/nrt_async",
    "nrt/nrt_experimental",
    "nrt/nrt_sys_trace",
    "nrt/nrt_profile",
    "nrt/nrt_version",
    "ndl/neuron_driver_shared_tensor_batch_op",
];

/// Adds two `f32[4]` inputs: `input0 + input1 -> output0`.
const ADD_HLO: &str = "HloModule add\n\nENTRY main {\n  x = f32[4]{0} parameter(0)\n  y = f32[4]{0} parameter(1)\n  ROOT sum = f32[4]{0} add(x, y)\n}\n";

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding this build's `libnrt.so`: this test's own, `target/<profile>/deps`,
/// where Cargo builds the library's every crate type before the tests that use it.
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable");
    let dir = exe.parent().expect("target/<profile>/deps").to_path_buf();
    assert!(dir.join("libnrt.so").exists(), "{} has no libnrt.so", dir.display());
    dir
}

/// A C program of the tests, loading the `libnrt.so` it was linked with: cargo puts
/// `target/<profile>` on `LD_LIBRARY_PATH` for tests, which would win over the rpath, and
/// a `libnrt.so` left there by an older build would be loaded instead.
fn c_program(binary: &Path) -> Command {
    let mut command = Command::new(binary);
    command.env("LD_LIBRARY_PATH", library_dir());
    command
}

fn run(command: &mut Command) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Compiles the C program `source` against the headers and `libnrt.so` into `dir`.
fn compile_c(source: &Path, dir: &Path) -> PathBuf {
    let lib = library_dir();
    let binary = dir.join(source.file_stem().expect("a file name"));
    run(Command::new("cc")
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir().join("include"))
        .arg(source)
        .arg("-o")
        .arg(&binary)
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lnrt", "-lpthread"]));
    binary
}

/// A NEFF of `hlo`, compiled with `neuron-cc`'s defaults.
fn neff(hlo: &str, name: &str) -> Vec<u8> {
    Neff::new(name, compile_hlo(hlo, Target::Trn1).expect("compiles")).encode()
}

fn example_mlp() -> String {
    std::fs::read_to_string(crate_dir().join("../examples/mlp.hlo")).expect("examples/mlp.hlo")
}

/// The examples' input pattern (`example_inputs.h`).
fn input_value(input: usize, k: usize) -> f32 {
    ((k * 7 + input * 13) % 101) as f32 - 50.0
}

/// Whether a C++ compiler is installed: without one the C++ half of the header test is
/// skipped with a note, except in CI (`CI=true`), where `.ci/run` installs it.
fn have_cpp() -> bool {
    let found = Command::new("c++").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        neuron_test_support::ci::missing("no C++ compiler (c++)", "compiling the headers as C++");
    }
    found
}

#[test]
fn every_header_compiles_alone_in_c_and_cpp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cpp = have_cpp();
    for header in HEADERS {
        let source = dir.path().join(format!("{}.c", header.replace('/', "_")));
        std::fs::write(&source, format!("#include \"{header}.h\"\nint main(void) {{ return 0; }}\n")).expect("write");
        let include = crate_dir().join("include");
        run(Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-fsyntax-only", "-I"])
            .arg(&include)
            .arg(&source));
        if cpp {
            run(Command::new("c++")
                .args(["-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-x", "c++", "-I"])
                .arg(&include)
                .arg(&source));
        }
    }
}

#[test]
fn every_header_function_is_exported() {
    let mut declared: Vec<String> = Vec::new();
    for header in HEADERS {
        let text = std::fs::read_to_string(crate_dir().join(format!("include/{header}.h"))).expect("header");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("nrt") {
            let tail = &rest[at..];
            let name: String = tail.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let preceded = at > 0 && rest.as_bytes()[at - 1].is_ascii_alphanumeric();
            if !preceded && tail[name.len()..].starts_with('(') && !declared.contains(&name) {
                declared.push(name.clone());
            }
            rest = &tail[name.len().max(1)..];
        }
    }
    let symbols = run(Command::new("nm").args(["-D", "--defined-only"]).arg(library_dir().join("libnrt.so")));
    let exported = String::from_utf8_lossy(&symbols.stdout);
    let exported: Vec<&str> = exported.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    let missing: Vec<&String> = declared.iter().filter(|d| !exported.contains(&d.as_str())).collect();
    assert!(declared.len() > 80, "found {} declarations", declared.len());
    assert!(missing.is_empty(), "declared in the headers but not exported: {missing:?}");
}

#[test]
fn structs_have_the_layout_the_library_writes() {
    use std::mem::{offset_of, size_of};
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("layout.c");
    let fields: &[(&str, &[&str], usize, Vec<usize>)] = &[
        (
            "nrt_instance_info_t",
            &["family", "size", "arch_name", "device_revision"],
            size_of::<nrt::NrtInstanceInfo>(),
            vec![
                offset_of!(nrt::NrtInstanceInfo, family),
                offset_of!(nrt::NrtInstanceInfo, size),
                offset_of!(nrt::NrtInstanceInfo, arch_name),
                offset_of!(nrt::NrtInstanceInfo, device_revision),
            ],
        ),
        (
            "nrt_version_t",
            &["rt_major", "rt_minor", "rt_patch", "rt_maintenance", "rt_detail", "git_hash"],
            size_of::<nrt::NrtVersion>(),
            vec![
                offset_of!(nrt::NrtVersion, rt_major),
                offset_of!(nrt::NrtVersion, rt_minor),
                offset_of!(nrt::NrtVersion, rt_patch),
                offset_of!(nrt::NrtVersion, rt_maintenance),
                offset_of!(nrt::NrtVersion, rt_detail),
                offset_of!(nrt::NrtVersion, git_hash),
            ],
        ),
        (
            "nrt_vnc_memory_stats_t",
            &["bytes_used", "bytes_limit"],
            size_of::<nrt::NrtVncMemoryStats>(),
            vec![offset_of!(nrt::NrtVncMemoryStats, bytes_used), offset_of!(nrt::NrtVncMemoryStats, bytes_limit)],
        ),
        (
            "nrt_tensor_batch_op_t",
            &["offset", "size", "buffer"],
            size_of::<nrt::NrtTensorBatchOp>(),
            vec![
                offset_of!(nrt::NrtTensorBatchOp, offset),
                offset_of!(nrt::NrtTensorBatchOp, size),
                offset_of!(nrt::NrtTensorBatchOp, buffer),
            ],
        ),
        (
            "nrt_tensor_batch_t",
            &["tensor", "ops", "num_ops"],
            size_of::<nrt::NrtTensorBatch>(),
            vec![
                offset_of!(nrt::NrtTensorBatch, tensor),
                offset_of!(nrt::NrtTensorBatch, ops),
                offset_of!(nrt::NrtTensorBatch, num_ops),
            ],
        ),
        (
            "nrt_tensor_info_t",
            &["name", "usage", "size", "dtype", "shape", "ndim"],
            size_of::<nrt::NrtTensorInfo>(),
            vec![
                offset_of!(nrt::NrtTensorInfo, name),
                offset_of!(nrt::NrtTensorInfo, usage),
                offset_of!(nrt::NrtTensorInfo, size),
                offset_of!(nrt::NrtTensorInfo, dtype),
                offset_of!(nrt::NrtTensorInfo, shape),
                offset_of!(nrt::NrtTensorInfo, ndim),
            ],
        ),
        (
            "nrt_tensor_info_array_t",
            &["tensor_count", "tensor_array"],
            size_of::<nrt::NrtTensorInfoArray>(),
            vec![offset_of!(nrt::NrtTensorInfoArray, tensor_count), offset_of!(nrt::NrtTensorInfoArray, tensor_array)],
        ),
        (
            "nrta_error_t",
            &["seq_id", "error_code"],
            size_of::<nrt::NrtaError>(),
            vec![offset_of!(nrt::NrtaError, seq_id), offset_of!(nrt::NrtaError, error_code)],
        ),
        ("nrt_model_info_t", &["vnc"], size_of::<nrt::NrtModelInfo>(), vec![offset_of!(nrt::NrtModelInfo, vnc)]),
    ];
    let mut program = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include \"nrt/nrt.h\"\n#include \"nrt/nrt_async.h\"\n\
         #include \"nrt/nrt_experimental.h\"\n#include \"nrt/nrt_version.h\"\nint main(void) {\n",
    );
    let mut expected = String::new();
    for (name, members, size, offsets) in fields {
        program.push_str(&format!("    printf(\"{name} %zu\", sizeof({name}));\n"));
        expected.push_str(&format!("{name} {size}"));
        for (member, offset) in members.iter().zip(offsets) {
            program.push_str(&format!("    printf(\" {member}=%zu\", offsetof({name}, {member}));\n"));
            expected.push_str(&format!(" {member}={offset}"));
        }
        program.push_str("    printf(\"\\n\");\n");
        expected.push('\n');
    }
    // Enums passed by value are C ints.
    for name in ["NRT_STATUS", "nrt_tensor_placement_t", "nrt_framework_type_t", "nrta_xu_t", "nrt_dtype_t"] {
        program.push_str(&format!("    printf(\"{name} %zu\\n\", sizeof({name}));\n"));
        expected.push_str(&format!("{name} {}\n", size_of::<nrt::Status>()));
    }
    program.push_str("    return 0;\n}\n");
    std::fs::write(&source, program).expect("write");
    let binary = dir.path().join("layout");
    run(Command::new("cc").arg("-I").arg(crate_dir().join("include")).arg(&source).arg("-o").arg(&binary));
    let printed = run(&mut c_program(&binary));
    assert_eq!(String::from_utf8_lossy(&printed.stdout), expected);
}

#[test]
fn the_api_checks_program_passes() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path();
    std::fs::write(dir.join("add.neff"), neff(ADD_HLO, "add")).expect("write");
    std::fs::write(dir.join("allreduce.neff"), allreduce_neff(4)).expect("write");
    let binary = compile_c(&crate_dir().join("tests/c/api_checks.c"), dir);
    let profile = dir.join("add.ntff");
    let output = run(sandbox
        .env(&mut c_program(&binary))
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.2xlarge")
        .env_remove("NEURON_RT_FAULT_INJECT")
        .arg(dir.join("add.neff"))
        .arg(dir.join("allreduce.neff"))
        .arg(&profile)
        .current_dir(dir));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("all checks passed"), "{stdout}");
    // Misuse is refused with a log line naming the argument.
    for line in [
        "nrt_tensor_read: NRT_INVALID (2): argument `tensor` is NULL",
        "nrt_tensor_free: NRT_INVALID_HANDLE (3): argument `*tensor`",
        "nrt_destroy_tensor_set: NRT_INVALID_HANDLE (3): argument `*tensor_set`",
        "nrt_execute: NRT_INVALID (2): input `input1` of model `add` is f32[4] (16 bytes) but tensor `small` is 8 bytes",
        "vnc -7 is not a NeuronCore: give one of this process's cores (0 or more), or -1 for any",
    ] {
        assert!(stderr.contains(line), "no `{line}` in the log:\n{stderr}");
    }
    // The profile is a file `neuron-profile view` reads: three executions of `add`,
    // traced on the device.
    let view = run(Command::new(profiler_binary("neuron-profile"))
        .args(["view", "--output-format", "summary-json", "-s"])
        .arg(&profile));
    let summary: Value = serde_json::from_slice(&view.stdout).expect("summary JSON");
    assert_eq!(summary["models"][0]["name"], "add");
    assert_eq!(summary["executions"]["count"], 3);
    assert_eq!(summary["executions"]["device_traced"], 3);
    assert_eq!(summary["process"]["capture_kind"], "nrt_profile");
    assert!(summary["events"]["device"].as_u64().unwrap_or(0) >= 3, "{summary}");
    // nrt_inspect_stop, nrt_trace_stop and nrt_profile_continuous_save wrote profiles
    // of one execution each; the inspect options left the device trace out.
    let only_file = |dir: PathBuf| -> PathBuf {
        let files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "ntff"))
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        files[0].clone()
    };
    let inspected = only_file(dir.join("inspected"));
    assert!(inspected.to_string_lossy().ends_with("-session7.ntff"), "{}", inspected.display());
    for (file, kind, device_events) in [
        (only_file(dir.join("output")), "inspect", true),
        (dir.join("trace.ntff"), "nrt_trace", true),
        (only_file(dir.join("continuous")), "continuous", true),
        (inspected, "inspect", false),
    ] {
        let view = run(Command::new(profiler_binary("neuron-profile"))
            .args(["view", "--output-format", "summary-json", "-s"])
            .arg(&file));
        let summary: Value = serde_json::from_slice(&view.stdout).expect("summary JSON");
        assert_eq!(summary["process"]["capture_kind"], kind, "{}", file.display());
        assert_eq!(summary["executions"]["count"], 1, "{}: {summary}", file.display());
        assert_eq!(
            summary["events"]["device"].as_u64().unwrap_or(0) > 0,
            device_events,
            "{}: {summary}",
            file.display()
        );
    }
}

/// A NEFF summing an `f32[elements]` over every rank of an all-reduce.
fn allreduce_neff(elements: usize) -> Vec<u8> {
    let hlo = format!(
        "HloModule allreduce\n\nsum {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}}\n\n\
         ENTRY main {{\n  x = f32[{elements}]{{0}} parameter(0)\n  \
         ROOT r = f32[{elements}]{{0}} all-reduce(x), replica_groups={{}}, to_apply=sum\n}}\n"
    );
    neff(&hlo, "allreduce")
}

/// A port of the loopback interface nobody listens at, for rank 0 to listen at.
/// Runs C program `binary` (with `args`, then the cores per process) as a job of 4
/// ranks under `mpirun`, as 4 processes of one core and as 2 of two; checks that every
/// rank printed `rank <g> ok` and returns each job's log (`None` without `mpirun`).
fn run_job_of_four_ranks(sandbox: &Sandbox, binary: &Path, args: &[&std::ffi::OsStr]) -> Option<Vec<String>> {
    let mut logs = Vec::new();
    for (processes, cores) in [(4usize, 1usize), (2, 2)] {
        let mut program = c_program(binary);
        sandbox
            .env(&mut program)
            .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
            .env("NEURON_RT_NUM_CORES", cores.to_string())
            .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{}", neuron_test_support::process::free_port()))
            .env("NEURON_RT_EXEC_TIMEOUT", "60")
            .env("NEURON_RT_LOG_LEVEL", "debug")
            .args(args)
            .arg(cores.to_string());
        let mut mpirun = neuron_test_support::process::mpirun(processes, &program)?;
        let output = run(&mut mpirun);
        let stdout = String::from_utf8_lossy(&output.stdout);
        for rank in 0..4 {
            assert!(stdout.contains(&format!("rank {rank} ok")), "{processes}x{cores}: no rank {rank}:\n{stdout}");
        }
        logs.push(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Some(logs)
}

/// The shard_map SGD step of `tests/data/jax_multi/` compiled to one rank's program as
/// `dir/dp_step.neff`, and `dp_step.c` built in `dir`: the fixture's directory and the
/// program.
fn dp_step(dir: &Path) -> (PathBuf, PathBuf) {
    let case = crate_dir().join("../tests/data/jax_multi/data_parallel_step");
    let hlo = std::fs::read_to_string(case.join("model.hlo")).expect("model.hlo");
    // As XLA computes: f32 products.
    let options = CompileOptions { auto_cast: AutoCast::None, ..CompileOptions::new(Target::Trn1) };
    let program = compile_hlo_with(&hlo, &options).expect("compiles to one rank's program");
    std::fs::write(dir.join("dp_step.neff"), Neff::new("dp_step", program).encode()).expect("write");
    (case, compile_c(&crate_dir().join("tests/c/dp_step.c"), dir))
}

/// A real training step (the shard_map SGD step, two all-reduces each) as 4 processes
/// under `neuron-profile inspect`, rank 2 spending 30 ms on the host before each step:
/// the ranks' profiles read together name rank 2, with host time before it arrived.
#[test]
fn a_rank_slow_on_the_host_before_each_training_step_is_named_with_host_time_in_the_merged_profile() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path();
    let (case, binary) = dp_step(dir);
    let profiles = dir.join("profiles");
    let mut program = Command::new(profiler_binary("neuron-profile"));
    sandbox
        .env(&mut program)
        .env("LD_LIBRARY_PATH", library_dir())
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
        .env("NEURON_RT_NUM_CORES", "1")
        .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{}", neuron_test_support::process::free_port()))
        .env("NEURON_RT_EXEC_TIMEOUT", "60")
        .env("DP_STEP_SLOW_RANK", "2")
        .env("DP_STEP_SLOW_MS", "30")
        .args(["inspect", "-o"])
        .arg(&profiles)
        .arg("--")
        .arg(&binary)
        .arg(dir.join("dp_step.neff"))
        .arg(&case)
        .arg("1");
    let Some(mut mpirun) = neuron_test_support::process::mpirun(4, &program) else { return };
    let output = run(&mut mpirun);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!((0..4).all(|r| stdout.contains(&format!("rank {r} ok"))), "the step still matches XLA: {stdout}");
    let view = run(Command::new(profiler_binary("neuron-profile"))
        .args(["view", "-d"])
        .arg(&profiles)
        .args(["--output-format", "summary-text"]));
    let text = String::from_utf8_lossy(&view.stdout);
    let finding = text.lines().find(|l| l.starts_with("  1. ")).unwrap_or_else(|| panic!("no finding: {text}"));
    assert!(finding.starts_with("  1. rank 2 (pid ") && finding.contains(" steps"), "{finding}");
    // Late at each step's first collective, with host time (its sleep) before it.
    assert!(finding.contains("late at each step's first collective (of 2)"), "{finding}");
    let before =
        text.lines().find(|l| l.trim_start().starts_with("before it arrived")).unwrap_or_else(|| panic!("{text}"));
    assert!(before.contains("mostly host time (its program between the runtime's calls"), "{before}");
    eprintln!("{finding}\n{before}");
}

/// The same step run long and watched live: through the tools' one reading of the
/// processes' flight records (`neuron_datastore::ranks`), then by `neuron-top --once
/// --ranks` and `neuron-monitor --once` themselves: rank 2 named, with host time as the
/// cause.
#[test]
fn a_rank_slow_on_the_host_before_each_training_step_is_named_live_with_host_time() {
    use neuron_datastore::ranks::{Cause, RuntimeRecords, StragglerRule, group_views, root_now};
    let sandbox = Sandbox::new();
    let dir = sandbox.path();
    let (case, binary) = dp_step(dir);
    let mut program = c_program(&binary);
    sandbox
        .env(&mut program)
        .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
        .env("NEURON_RT_NUM_CORES", "1")
        .env("NEURON_RT_ROOT_COMM_ID", format!("127.0.0.1:{}", neuron_test_support::process::free_port()))
        .env("NEURON_RT_EXEC_TIMEOUT", "60")
        .envs([("DP_STEP_SLOW_RANK", "2"), ("DP_STEP_SLOW_MS", "30"), ("DP_STEP_STEPS", "2000")])
        .arg(dir.join("dp_step.neff"))
        .arg(&case)
        .arg("1");
    let Some(mut mpirun) = neuron_test_support::process::mpirun(4, &program) else { return };
    let log = std::fs::File::create(sandbox.job_log()).expect("the job's log");
    let log_too = log.try_clone().expect("the job's log");
    let _job = neuron_test_support::process::Job(mpirun.stdout(log).stderr(log_too).spawn().expect("mpirun starts"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let straggler = loop {
        let entries = neuron_datastore::discover(&sandbox.datastores).expect("the datastores");
        let readers: Vec<_> = entries.iter().filter_map(|e| Some((e.reader.as_ref().ok()?, e.liveness?))).collect();
        let records = RuntimeRecords::read_all(&readers);
        let views = group_views(&records, &StragglerRule::default(), root_now(&records));
        if let Some(s) = views.iter().find_map(|v| v.straggler.clone()).filter(|s| s.before.is_some()) {
            break s;
        }
        assert!(Instant::now() < deadline, "no straggler named within 60 s\n{}", sandbox.job_evidence());
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("{}", straggler.text);
    assert_eq!(straggler.rank, 2, "{}", straggler.text);
    assert_eq!((straggler.at.index, straggler.at.collectives), (0, 2), "late at each step's first of two");
    assert_eq!(straggler.before.map(|b| b.cause), Some(Cause::Host), "{}", straggler.text);

    // The tools say the same, in the same words.
    let tool = |package: &str, args: &[&str]| {
        let output = Command::new(neuron_test_support::process::workspace_binary(package, package))
            .args(args)
            .env("NEURON_VIRT_DATASTORE_DIR", &sandbox.datastores)
            .env_remove("NEURON_VIRT_INSTANCE_TYPE")
            .output()
            .expect("the tool runs");
        assert!(output.status.success(), "{package}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let top = tool("neuron-top", &["--once", "--ranks", "--refresh", "300ms"]);
    let named = top.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(named.contains("STRAGGLER rank 2 (pid") && named.contains("host time"), "{top}");
    let config = dir.join("collectives.json");
    // The collectives group alone: it watches every runtime's ranks, whatever
    // `neuron_runtimes` selects (here nothing).
    std::fs::write(&config, r#"{"period": "500ms", "system_metrics": [{"type": "collectives"}]}"#).expect("config");
    let report = tool("neuron-monitor", &["-c", config.to_str().expect("utf-8"), "--once"]);
    let report: Value = serde_json::from_str(report.lines().next().unwrap_or_default()).expect("a JSON report");
    let comm = &report["system_data"]["collectives"]["communicators"][0];
    assert_eq!(comm["straggler"]["rank"], 2, "{report:#}");
    assert_eq!(comm["straggler"]["before"]["cause"], "host", "{comm:#}");
    assert_eq!(report["instance_info"]["instance_type"], "trn1.32xlarge", "as the job's runtimes declare");
    assert_eq!(report["neuron_runtime_data"], serde_json::json!([]), "no runtime selected for its own groups");
}

#[test]
fn a_c_program_runs_as_the_ranks_of_an_mpirun_job() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path();
    // 64 Ki floats: 256 KiB per rank.
    std::fs::write(dir.join("allreduce.neff"), allreduce_neff(65536)).expect("write");
    let binary = compile_c(&crate_dir().join("tests/c/ranks.c"), dir);
    let Some(logs) = run_job_of_four_ranks(&sandbox, &binary, &[dir.join("allreduce.neff").as_os_str()]) else {
        return;
    };
    // Processes of one host link through shared memory.
    for log in logs {
        assert!(log.contains("through shared memory") && !log.contains("through TCP"), "{log}");
    }
}

#[test]
fn a_rank_whose_process_exits_inside_a_collective_fails_the_others_at_once() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path();
    std::fs::write(dir.join("allreduce.neff"), allreduce_neff(4)).expect("write");
    let binary = compile_c(&crate_dir().join("tests/c/ranks.c"), dir);
    let root = format!("127.0.0.1:{}", neuron_test_support::process::free_port());
    let started = Instant::now();
    // Two processes as torchrun starts them; rank 1's exits in its first collective.
    let children: Vec<std::process::Child> = (0..2)
        .map(|rank| {
            sandbox
                .env(&mut c_program(&binary))
                .env("NEURON_VIRT_INSTANCE_TYPE", "trn1.32xlarge")
                .env("NEURON_RT_NUM_CORES", "1")
                .env("NEURON_RT_ROOT_COMM_ID", &root)
                .env("NEURON_RT_EXEC_TIMEOUT", "60")
                .env("NEURON_RT_FAULT_INJECT", "cc_exit:rank=1")
                .envs([("RANK", rank.to_string()), ("WORLD_SIZE", "2".to_owned())])
                .env_remove("OMPI_COMM_WORLD_RANK")
                .args([dir.join("allreduce.neff").as_os_str(), "1".as_ref()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("starts")
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(std::process::Child::id).collect();
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().expect("ends")).collect();
    let elapsed = started.elapsed();
    // The processes shared a segment of /dev/shm; none is left, whichever way they ended.
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let uid = nix::unistd::getuid();
    assert!(
        !left.iter().any(|name| pids.iter().any(|pid| name.starts_with(&format!("neuron-virt-link-{uid}-{pid}-")))),
        "segments left: {left:?}"
    );
    let log = |o: &Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!outputs[1].status.success(), "{}", log(&outputs[1]));
    assert!(
        log(&outputs[1]).contains("the process exits inside collective operation 0 out of 1"),
        "{}",
        log(&outputs[1])
    );

    // Rank 0 fails with the network status, naming rank 1, long before the timeout.
    let survivor = log(&outputs[0]);
    assert!(!outputs[0].status.success(), "{survivor}");
    assert!(survivor.contains("NRT_NETWORK_PROXY_FAILURE (1206)") && survivor.contains("rank 1 (pid"), "{survivor}");
    assert!(elapsed < Duration::from_secs(20), "the survivor took {elapsed:?}");
}

#[test]
fn python_loads_it_through_ctypes() {
    let found = Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        neuron_test_support::ci::missing("no python3", "the ctypes smoke test");
        return;
    }
    let sandbox = Sandbox::new();
    let neff_path = sandbox.path().join("add.neff");
    std::fs::write(&neff_path, neff(ADD_HLO, "add")).expect("write");
    let output = run(sandbox
        .env(&mut Command::new("python3"))
        .arg(crate_dir().join("tests/ctypes_smoke.py"))
        .arg(library_dir().join("libnrt.so"))
        .arg(&neff_path));
    assert!(String::from_utf8_lossy(&output.stdout).contains("ctypes ok"));
}

/// Runs the MLP through the Rust API with the examples' inputs; returns its output.
fn rust_mlp_output(sandbox: &Sandbox, neff: &[u8]) -> Vec<u8> {
    let config = neuron_runtime::Config {
        lock_dir: sandbox.path().to_path_buf(),
        datastore_dir: sandbox.datastores.clone(),
        ..neuron_runtime::Config::default()
    };
    let runtime = Runtime::start(config).expect("runtime");
    let model = runtime.load(neff, None).expect("loads");
    let placement = TensorPlacement::Device { core: model.core() };
    let mut inputs = TensorSet::new();
    for (i, io) in model.inputs().iter().enumerate() {
        let ty = model.tensor_type(io);
        let tensor = runtime.allocate_tensor_for(placement, ty, &io.name).expect("alloc");
        let count = ty.element_count().expect("sized") as usize;
        let bytes: Vec<u8> = (0..count).flat_map(|k| (input_value(i, k) / 128.0).to_le_bytes()).collect();
        tensor.write(0, &bytes).expect("write");
        inputs.add(&io.name, tensor);
    }
    let mut outputs = TensorSet::new();
    let io = &model.outputs()[0];
    let output = runtime.allocate_tensor_for(placement, model.tensor_type(io), &io.name).expect("alloc");
    outputs.add(&io.name, output.clone());
    runtime.execute(&model, &inputs, &outputs).expect("runs");
    let bytes = output.read_all().expect("read");
    runtime.close().expect("close");
    bytes
}

#[test]
fn the_async_example_matches_the_rust_api_and_shows_in_the_datastore() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path();
    let mlp = neff(&example_mlp(), "mlp");
    std::fs::write(dir.join("mlp.neff"), &mlp).expect("write");
    let binary = compile_c(&crate_dir().join("../examples/c/async_mlp.c"), dir);
    let outputs = dir.join("outputs.bin");
    let mut child = sandbox
        .env(&mut c_program(&binary))
        .env("NEURON_PROCESS_TAG", "c-example")
        .arg(dir.join("mlp.neff"))
        .arg("40")
        .arg(&outputs)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");

    // While it runs, its datastore says what any runtime's does: its tag, its model,
    // its executions (what neuron-ls, neuron-top, neuron-monitor and the dashboard read).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = None;
    while seen.is_none() && Instant::now() < deadline && child.try_wait().expect("wait").is_none() {
        for entry in std::fs::read_dir(&sandbox.datastores).into_iter().flatten().flatten() {
            let Ok(reader) = DatastoreReader::open(&entry.path()) else { continue };
            let completed: u64 = reader.snapshot().cores.iter().map(|c| c.executions.0[0]).sum();
            if completed > 0 {
                seen = Some((reader.info().tag.clone(), reader.models(), completed));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("finishes");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let (tag, models, completed) = seen.expect("the running example in the datastore");
    assert_eq!(tag.as_deref(), Some("c-example"));
    assert_eq!(models.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["mlp"]);
    assert!(completed > 0);

    assert!(stdout.contains("40 requests"), "{stdout}");
    assert!(stdout.contains("0 failed"), "{stdout}");
    let full: u64 = stdout
        .split("the queue was full ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("the queue-full count");
    assert!(full > 0, "40 requests never filled a queue of 8: {stdout}");
    let from_c = std::fs::read(&outputs).expect("the outputs file");
    assert_eq!(from_c, rust_mlp_output(&sandbox, &mlp), "the C example's output differs from the Rust API's");
}

#[test]
fn the_sync_example_fetches_each_event_once_with_visible_core_numbers() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path();
    std::fs::write(dir.join("mlp.neff"), neff(&example_mlp(), "mlp")).expect("write");
    let binary = compile_c(&crate_dir().join("../examples/c/sync_trace.c"), dir);
    let events_file = dir.join("events.json");
    let output = run(sandbox
        .env(&mut c_program(&binary))
        .env("NEURON_RT_VISIBLE_CORES", "1")
        .arg(dir.join("mlp.neff"))
        .arg("2")
        .arg(&events_file));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("a second fetch returns 0 events"), "{stdout}");
    let fetched: Value = serde_json::from_slice(&std::fs::read(&events_file).expect("events")).expect("JSON");
    assert_eq!(fetched["data_version"], 2);
    let events = fetched["events"].as_array().expect("events");
    let of_type = |t: &str| events.iter().filter(|e| e["event_type"] == t).collect::<Vec<_>>();
    assert_eq!(of_type("nrt_execute").len(), 4, "a start and a stop per execution");
    assert_eq!(of_type("nrt_load").len(), 2);
    // vnc 0 of a process holding nc1 is nc1, as every tool numbers it.
    assert!(of_type("nc_exec_running").iter().all(|e| e["nc_idx"] == 1));
    let raw = std::fs::read_to_string(&events_file).expect("events");
    let first = &raw[raw.find("[{").expect("an event") + 1..];
    let first = &first[..first.find("},{").unwrap_or(first.len())];
    let positions: Vec<usize> = [
        "{\"event_type\":",
        ",\"phase\":",
        ",\"id\":",
        ",\"nc_idx\":",
        ",\"tracking_id\":",
        ",\"thread_id\":",
        ",\"data\":",
        ",\"timestamp_ns\":",
    ]
    .iter()
    .map(|key| first.find(key).unwrap_or_else(|| panic!("no {key} in {first}")))
    .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "the documented key order: {first}");
    let mut ids: Vec<(Value, Value)> = events.iter().map(|e| (e["nc_idx"].clone(), e["id"].clone())).collect();
    let count = ids.len();
    ids.sort_by_key(|(core, id)| (core.as_u64(), id.as_u64()));
    ids.dedup();
    assert_eq!(ids.len(), count, "each event once");
}

#[test]
fn a_shard_map_training_step_runs_as_ranks_of_mpirun_processes_and_matches_xla() {
    let sandbox = Sandbox::new();
    let dir = sandbox.path();
    let (case, binary) = dp_step(dir);
    run_job_of_four_ranks(&sandbox, &binary, &[dir.join("dp_step.neff").as_os_str(), case.as_os_str()]);
}
