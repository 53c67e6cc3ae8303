//! The command-line contracts of `neuron-cc` and `neuron-bench`.

use std::path::Path;
use std::process::{Command, Output};

fn run(binary: &str, lock_dir: &Path, args: &[&str]) -> Output {
    Command::new(binary)
        .env("NEURON_VIRT_LOCK_DIR", lock_dir)
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .args(args)
        .output()
        .expect("run the binary")
}

/// Writes a one-operator HLO model into `dir` and returns its path.
fn negate_model(dir: &Path) -> std::path::PathBuf {
    let hlo = dir.join("neg.hlo");
    std::fs::write(&hlo, "HloModule neg\nENTRY e {\n  x = f32[8]{0} parameter(0)\n  ROOT y = f32[8]{0} negate(x)\n}\n")
        .expect("write");
    hlo
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn an_unknown_operator_names_operator_instruction_and_line_and_writes_no_neff() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hlo = dir.path().join("bad.hlo");
    std::fs::write(&hlo, "HloModule bad\n\nENTRY e {\n  x = f32[4,4]{1,0} parameter(0)\n  ROOT y = f32[4,4]{1,0} cholesky(x), lower=true\n}\n")
        .expect("write");
    let neff = dir.path().join("bad.neff");
    let out = run(
        env!("CARGO_BIN_EXE_neuron-cc"),
        dir.path(),
        &["compile", hlo.to_str().expect("utf-8"), "-o", neff.to_str().expect("utf-8")],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("line 5, instruction `y`: operator `cholesky` is not supported"), "{stderr}");
    assert!(!neff.exists(), "no NEFF may be written");
    let leftovers = std::fs::read_dir(dir.path()).expect("list").count();
    assert_eq!(leftovers, 1, "no temporary file is left behind");
}

#[test]
fn compile_prints_a_summary_and_list_operators_names_engines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hlo = dir.path().join("mm.hlo");
    std::fs::write(
        &hlo,
        "HloModule mm\nENTRY e {\n  a = f32[2,3]{1,0} parameter(0)\n  w = f32[3,2]{1,0} constant({ { 1, 2 }, { 3, 4 }, { 5, 6 } })\n  \
         d = f32[2,2]{1,0} dot(a, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n  ROOT t = f32[2,2]{1,0} tanh(d)\n}\n",
    )
    .expect("write");
    let out = run(env!("CARGO_BIN_EXE_neuron-cc"), dir.path(), &["compile", hlo.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    // By default the product's operands are rounded to bf16: the weight once, here, and
    // the parameter by the product itself, as it reads it.
    assert!(stdout.contains("auto-cast           matmult, bf16; reductions accumulate in narrow type"), "{stdout}");
    assert!(stdout.contains("instructions        2 (PE 1, ACT 1)"), "{stdout}");
    assert!(stdout.contains("weights             24 B in 1 constants"), "{stdout}");
    assert!(stdout.contains("FLOPs/execution     28"), "{stdout}");
    let out = run(
        env!("CARGO_BIN_EXE_neuron-cc"),
        dir.path(),
        &["compile", hlo.to_str().expect("utf-8"), "--auto-cast", "none"],
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("instructions        2 (PE 1, ACT 1)"), "{stdout}");
    assert!(stdout.contains("FLOPs/execution     28"), "{stdout}");
    assert!(dir.path().join("mm.neff").exists());

    let list = text(&run(env!("CARGO_BIN_EXE_neuron-cc"), dir.path(), &["list-operators"]).stdout);
    assert!(list.lines().any(|l| l.starts_with("dot") && l.ends_with("PE")), "{list}");
    assert!(list.lines().any(|l| l.starts_with("exponential") && l.ends_with("ACT")), "{list}");
    // One engine column for all, after the longest name.
    for (name, engine) in [("abs", "DVE"), ("shift-right-arithmetic", "DVE"), ("exponential-minus-one", "ACT")] {
        let line = format!("{name:<22}  {engine}");
        assert!(list.lines().any(|l| l == line), "no line `{line}` in\n{list}");
    }
}

#[test]
fn exec_json_reports_counts_throughput_and_latency_percentiles() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hlo = negate_model(dir.path());
    let out = run(
        env!("CARGO_BIN_EXE_neuron-bench"),
        dir.path(),
        &["exec", hlo.to_str().expect("utf-8"), "--cores", "0-1", "--iterations", "25", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["executions"], 50, "25 per core on two cores");
    assert_eq!(report["cores"], serde_json::json!([0, 1]));
    assert!(report["throughput_per_second"].as_f64().is_some_and(|t| t > 0.0));
    let latency = &report["latency_seconds"];
    let (p50, p90, p99, max) = (
        latency["p50"].as_f64().expect("p50"),
        latency["p90"].as_f64().expect("p90"),
        latency["p99"].as_f64().expect("p99"),
        latency["max"].as_f64().expect("max"),
    );
    assert!(0.0 < p50 && p50 <= p90 && p90 <= p99 && p99 <= max, "{latency}");
}

#[test]
fn exec_leaves_the_warm_up_executions_out_of_its_figures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hlo = negate_model(dir.path());
    let args = ["exec", hlo.to_str().expect("utf-8"), "--cores", "0-1", "--warmup", "7", "--iterations", "5", "--json"];
    // Every execution after each core's seventh fails: the warm-up's succeed, the
    // measured ones fail.
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-bench"))
        .args(args)
        .env("NEURON_RT_FAULT_INJECT", "oob:after=7")
        .env("NEURON_VIRT_LOCK_DIR", dir.path().join("locks"))
        .env("NEURON_VIRT_DATASTORE_DIR", dir.path().join("datastores"))
        .output()
        .expect("runs");
    assert!(!out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["executions"], 10, "5 per core on two cores, after 7 each: {report}");
    assert_eq!(report["failed_executions"], 10, "{report}");
}

#[test]
fn exec_reports_each_failed_execution_keeps_going_and_exits_with_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hlo = negate_model(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-bench"))
        .env("NEURON_VIRT_LOCK_DIR", dir.path())
        .env("NEURON_RT_FAULT_INJECT", "oob:core=0:every=3,hbm_ue:core=1:after=4")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .args(["exec", hlo.to_str().expect("utf-8"), "--cores", "0-1", "--iterations", "10", "--json"])
        .output()
        .expect("run neuron-bench");
    assert_eq!(out.status.code(), Some(1), "failed executions make the exit status 1");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("nc0 execution 3 failed: NRT_EXEC_OOB (1006): failed to run scatter/gather"), "{stderr}");
    assert!(stderr.contains("nc1 execution 5 failed: NRT_EXEC_HW_ERR_HBM_UE (1201)"), "{stderr}");
    assert!(stderr.contains("nc1 execution 6 failed: NRT_EXEC_UNIT_UNRECOVERABLE (101)"), "{stderr}");
    // A status's later failures point at its first, once, instead of a bare line each.
    assert!(stderr.contains("nc0 execution 6 failed with NRT_EXEC_OOB (1006) as execution 3 did (above)"), "{stderr}");
    assert!(!stderr.contains("nc0 execution 9 failed"), "{stderr}");
    assert!(stderr.contains("9 of 20 executions failed"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["executions"], 20, "every execution was attempted");
    assert_eq!(report["failed_executions"], 9, "3 on nc0 (3, 6, 9), 6 on nc1 (5 to 10)");
    let failures: Vec<(u64, u64, u64)> = report["failures"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|f| {
            let field = |name: &str| f[name].as_u64().unwrap_or_else(|| panic!("{name} in {f}"));
            (field("core"), field("execution"), field("code"))
        })
        .collect();
    assert_eq!(
        failures,
        [
            (0, 3, 1006),
            (0, 6, 1006),
            (0, 9, 1006),
            (1, 5, 1201),
            (1, 6, 101),
            (1, 7, 101),
            (1, 8, 101),
            (1, 9, 101),
            (1, 10, 101)
        ]
    );
    assert_eq!(report["failures_listed_all"], true);
    let by_status = report["failures_by_status"].as_array().expect("a list");
    assert_eq!(by_status.len(), 3, "{by_status:?}");
    assert_eq!(by_status[2]["status"], "NRT_EXEC_UNIT_UNRECOVERABLE");
    assert_eq!(by_status[2]["count"], 5);
}

#[test]
fn async_exec_keeps_requests_queued_and_reports_failures_by_execution() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hlo = negate_model(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-bench"))
        .env("NEURON_VIRT_LOCK_DIR", dir.path())
        .env("NEURON_RT_FAULT_INJECT", "oob:core=1:every=4")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .args(["exec", hlo.to_str().expect("utf-8"), "--cores", "0-1", "--iterations", "12", "--json"])
        .args(["--exec-mode", "async", "--inflight", "3"])
        .output()
        .expect("run neuron-bench");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!((report["exec_mode"].as_str(), report["inflight"].as_u64()), (Some("async"), Some(3)));
    assert_eq!(report["executions"], 24);
    assert_eq!(report["failed_executions"], 3);
    let failed: Vec<(u64, u64)> = report["failures"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|f| (f["core"].as_u64().expect("core"), f["execution"].as_u64().expect("execution")))
        .collect();
    assert_eq!(failed, [(1, 4), (1, 8), (1, 12)]);
    let latency = &report["latency_seconds"];
    assert!(latency["p50"].as_f64().is_some_and(|p| p > 0.0), "{latency}");

    let too_many = run(
        env!("CARGO_BIN_EXE_neuron-bench"),
        dir.path(),
        &["exec", hlo.to_str().expect("utf-8"), "--cores", "0", "--exec-mode", "async", "--inflight", "9"],
    );
    assert_eq!(too_many.status.code(), Some(1));
    assert!(
        text(&too_many.stderr).contains(
            "--inflight 9 is more than an execution unit can queue (NEURON_RT_XU_COMPUTE_MAX_QUEUED_REQUESTS=8)"
        ),
        "{}",
        text(&too_many.stderr)
    );
}

#[test]
fn bad_arguments_get_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hlo = negate_model(dir.path());
    let model = hlo.to_str().expect("utf-8");
    let bench = env!("CARGO_BIN_EXE_neuron-bench");

    let out = run(bench, dir.path(), &["exec", model, "--cores", "7"]);
    assert!(text(&out.stderr).contains("--cores 7"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("core 7 does not exist"), "{}", text(&out.stderr));

    let out = run(bench, dir.path(), &["exec", model, "--cores", "0", "--input", "x.9=nowhere.npy"]);
    assert!(text(&out.stderr).contains("no input `x.9`"), "{}", text(&out.stderr));

    let out = run(bench, dir.path(), &["exec", "missing.neff", "--cores", "0"]);
    assert!(text(&out.stderr).contains("cannot read model file missing.neff"), "{}", text(&out.stderr));

    let garbage = dir.path().join("garbage.neff");
    std::fs::write(&garbage, b"not a neff").expect("write");
    let out = run(bench, dir.path(), &["exec", garbage.to_str().expect("utf-8"), "--cores", "0"]);
    assert!(text(&out.stderr).contains("NRT_INVALID (2): not a NEFF"), "{}", text(&out.stderr));
}

#[test]
fn logs_follow_neuron_rt_log_level() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hlo = negate_model(dir.path());
    let args = ["exec", hlo.to_str().expect("utf-8"), "--cores", "0", "--iterations", "1"];
    let bench = env!("CARGO_BIN_EXE_neuron-bench");

    let quiet = run(bench, dir.path(), &args);
    assert!(quiet.status.success());
    assert!(!text(&quiet.stderr).contains("model loaded"), "ERROR is the default: {}", text(&quiet.stderr));

    let verbose = Command::new(bench)
        .env("NEURON_VIRT_LOCK_DIR", dir.path())
        .env("NEURON_RT_LOG_LEVEL", "INFO")
        .args(args)
        .output()
        .expect("run");
    assert!(verbose.status.success());
    let stderr = text(&verbose.stderr);
    assert!(stderr.contains("runtime initialised") && stderr.contains("model loaded"), "{stderr}");

    let bad = Command::new(bench).env("NEURON_RT_LOG_LEVEL", "LOUD").args(args).output().expect("run");
    assert!(text(&bad.stderr).contains("NEURON_RT_LOG_LEVEL=\"LOUD\" is not valid"), "{}", text(&bad.stderr));
}

#[test]
fn demo_runs_the_bundled_models_on_every_core_and_reports_each_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(env!("CARGO_BIN_EXE_neuron-bench"), dir.path(), &["demo", "--duration", "2500ms"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("compiled mlp:") && stdout.contains("compiled attention:"), "{stdout}");
    assert!(stdout.contains("running on nc0-nc1 of a virtual trn1.2xlarge"), "{stdout}");
    assert!(stdout.contains("for 2.5 s (Ctrl-C stops it sooner)") && !stdout.contains("Ctrl-C to stop"), "{stdout}");
    let status_lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('[')).collect();
    assert!(status_lines.len() >= 2, "one status line per second: {stdout}");
    for line in &status_lines {
        assert!(line.contains("nc0") && line.contains("nc1") && line.contains("exec/s"), "{line}");
        assert!(line.ends_with("errors 0"), "{line}");
    }
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("stopped after") && last.ends_with("0 errors"), "{last}");
}

/// Compiles `hlo` and checks that `neuron-cc` exits with status 1, prints `expected`,
/// and leaves no NEFF (nor any temporary file) behind.
fn assert_refused(hlo: &str, expected: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("model.hlo");
    std::fs::write(&path, hlo).expect("write");
    let neff = dir.path().join("model.neff");
    let out = run(
        env!("CARGO_BIN_EXE_neuron-cc"),
        dir.path(),
        &["compile", path.to_str().expect("utf-8"), "-o", neff.to_str().expect("utf-8")],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(expected), "expected `{expected}` in: {stderr}");
    assert!(!neff.exists(), "no NEFF may be written");
    assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 1, "no temporary file is left behind");
}

#[test]
fn a_convolution_whose_kernel_does_not_fit_the_input_features_is_refused() {
    assert_refused(
        "HloModule conv\nENTRY e {\n  x = f32[1,8,8,3]{3,2,1,0} parameter(0)\n  k = f32[3,3,2,4]{3,2,1,0} parameter(1)\n  \
         ROOT y = f32[1,6,6,4]{3,2,1,0} convolution(x, k), window={size=3x3}, dim_labels=b01f_01io->b01f\n}\n",
        "line 5, instruction `y`: convolution of f32[1,8,8,3] by f32[3,3,2,4]: 3 input features must be 2 kernel inputs x 1 groups",
    );
}

#[test]
fn a_loop_body_that_changes_the_state_type_is_refused() {
    assert_refused(
        "HloModule loop\ncond {\n  c = s32[] parameter(0)\n  ten = s32[] constant(10)\n  ROOT lt = pred[] compare(c, ten), direction=LT\n}\n\
         body {\n  b = s32[] parameter(0)\n  ROOT f = f32[] convert(b)\n}\n\
         ENTRY e {\n  i = s32[] parameter(0)\n  ROOT w = s32[] while(i), condition=cond, body=body\n}\n",
        "line 13, instruction `w`: the loop body's outputs are (f32[]) but should be (s32[])",
    );
}

#[test]
fn a_sort_comparator_that_does_not_return_pred_is_refused() {
    assert_refused(
        "HloModule sort\nless {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT d = f32[] subtract(a, b)\n}\n\
         ENTRY e {\n  x = f32[8]{0} parameter(0)\n  ROOT s = f32[8]{0} sort(x), dimensions={0}, to_apply=less\n}\n",
        "line 9, instruction `s`: the comparator must take two elements of each array and return one pred",
    );
}

#[test]
fn a_lapack_custom_call_is_refused_with_the_jax_function_that_emits_it() {
    assert_refused(
        "HloModule cc\nENTRY e {\n  x = f32[3,3]{1,0} parameter(0)\n  \
         ROOT y = (f32[3,3]{1,0}, s32[3]{0}, s32[]) custom-call(x), custom_call_target=\"lapack_sgetrf_ffi\"\n}\n",
        "line 4, instruction `y`: custom-call target `lapack_sgetrf_ffi` is a host library routine, which NeuronCores \
         do not run; JAX emits it for an LU factorisation (jnp.linalg.inv, solve, det, slogdet or jax.scipy.linalg.lu)",
    );
}

#[test]
fn an_unknown_custom_call_target_is_refused_with_the_supported_list() {
    assert_refused(
        "HloModule cc\nENTRY e {\n  x = f32[8]{0} parameter(0)\n  \
         ROOT y = f32[8]{0} custom-call(x), custom_call_target=\"my_kernel\"\n}\n",
        "line 4, instruction `y`: custom-call target `my_kernel` is not supported (supported, with one operand: Sharding, SPMDFullToShardShape, SPMDShardToFullShape, xla.sdy.FuncResultSharding)",
    );
}

#[test]
fn an_all_reduce_model_runs_as_one_rank_per_core() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hlo = dir.path().join("ar.hlo");
    std::fs::write(
        &hlo,
        "HloModule ar\nsum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n\
         ENTRY e {\n  x = f32[8]{0} parameter(0)\n  ROOT y = f32[8]{0} all-reduce(x), replica_groups={{0,1}}, to_apply=sum\n}\n",
    )
    .expect("write");
    let bench = env!("CARGO_BIN_EXE_neuron-bench");
    let model = hlo.to_str().expect("utf-8");
    let one = run(bench, dir.path(), &["exec", model, "--cores", "0", "--iterations", "2"]);
    assert_eq!(one.status.code(), Some(1));
    let stderr = text(&one.stderr);
    assert!(
        stderr.contains("is loaded as 1 rank(s), but its all-reduce (HLO `y`) with replica_groups={{0,1}}")
            && stderr.contains(
                "load it on 2 cores as 2 ranks (Runtime::load_collectives, or neuron-bench exec --cores 0-1)"
            ),
        "{stderr}"
    );
    let two = run(bench, dir.path(), &["exec", model, "--cores", "0-1", "--iterations", "20", "--json"]);
    assert!(two.status.success(), "{}", text(&two.stderr));
    let report: serde_json::Value = serde_json::from_slice(&two.stdout).expect("one JSON object");
    assert_eq!((report["executions"].as_u64(), report["failed_executions"].as_u64()), (Some(40), Some(0)));
    // Run for a time, both ways: the ranks stop together, so none waits for a partner.
    for mode in ["sync", "async"] {
        let timed = Command::new(bench)
            .env("NEURON_VIRT_LOCK_DIR", dir.path())
            .env("NEURON_RT_EXEC_TIMEOUT", "5")
            .env_remove("NEURON_RT_VISIBLE_CORES")
            .args(["exec", model, "--cores", "0-1", "--duration", "500ms", "--json", "--exec-mode", mode])
            .output()
            .expect("run neuron-bench");
        assert!(timed.status.success(), "{mode}: {}", text(&timed.stderr));
        let report: serde_json::Value = serde_json::from_slice(&timed.stdout).expect("one JSON object");
        assert_eq!(report["failed_executions"], 0, "{mode}");
        assert!(report["duration_seconds"].as_f64().is_some_and(|d| d < 3.0), "{mode}: {report}");
    }
}

#[test]
fn f64_is_refused() {
    assert_refused(
        "HloModule d\nENTRY e {\n  x = f64[8]{0} parameter(0)\n  ROOT y = f64[8]{0} negate(x)\n}\n",
        "line 3, instruction `x`: element type `f64` is not supported: NeuronCores have no 64-bit floating point",
    );
}

#[test]
fn a_clean_exit_removes_the_datastore_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stores = dir.path().join("stores");
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-bench"))
        .env("NEURON_VIRT_LOCK_DIR", dir.path())
        .env("NEURON_VIRT_DATASTORE_DIR", &stores)
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .args(["exec", "--cores", "0", "--iterations", "3"])
        .arg(negate_model(dir.path()))
        .output()
        .expect("run neuron-bench");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let left: Vec<_> = std::fs::read_dir(&stores).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "datastore files left behind: {left:?}");
}

/// Issue 39: builds are reproducible. The same HLO compiled twice with the same options
/// gives the same NEFF, byte for byte; other options give another.
#[test]
fn the_same_hlo_and_options_compile_to_the_same_neff_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for model in ["mlp", "attention"] {
        let hlo = examples.join(format!("{model}.hlo"));
        let compile = |name: &str, extra: &[&str]| {
            let neff = dir.path().join(name);
            let mut args = vec!["compile", hlo.to_str().expect("utf-8"), "-o", neff.to_str().expect("utf-8")];
            args.extend_from_slice(extra);
            let out = run(env!("CARGO_BIN_EXE_neuron-cc"), dir.path(), &args);
            assert!(out.status.success(), "{}", text(&out.stderr));
            std::fs::read(neff).expect("the NEFF")
        };
        let (first, second) = (compile("a.neff", &[]), compile("b.neff", &[]));
        assert!(first == second, "{model}: two compilations differ");
        assert!(compile("c.neff", &["--auto-cast", "none"]) != first, "{model}: other options, another NEFF");
    }
}
