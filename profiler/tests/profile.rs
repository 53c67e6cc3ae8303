//! `neuron-profile` end to end: capture, view, inspect and snapshot on real workloads,
//! a capture killed mid-write, and a recorded trace read back event for event.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use neuron_datastore::ALL_SYSTEM_EVENTS;
use neuron_datastore::{DatastoreReader, TailStart, TraceEvent, discover};
use neuron_record::{Recorder, metadata, to_device_event, to_system_event};
use neuron_runtime::{Config, Runtime, TensorPlacement, TensorSet};
use serde_json::Value;

const PROFILE: &str = env!("CARGO_BIN_EXE_neuron-profile");
const BENCH: &str = env!("CARGO_BIN_EXE_neuron-bench");

/// A private lock and datastore directory for one test's processes.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let env = Env { dir: tempfile::tempdir().expect("tempdir") };
        std::fs::create_dir(env.datastores()).expect("datastore dir");
        std::fs::set_permissions(env.datastores(), std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .expect("private");
        env
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn datastores(&self) -> PathBuf {
        self.path("datastores")
    }

    fn command(&self, binary: &str, args: &[&str]) -> Command {
        let mut command = Command::new(binary);
        command
            .current_dir(self.dir.path())
            .env("NEURON_VIRT_LOCK_DIR", self.dir.path())
            .env("NEURON_VIRT_DATASTORE_DIR", self.datastores())
            .env_remove("NEURON_RT_VISIBLE_CORES")
            .env_remove("NEURON_RT_NUM_CORES")
            .env_remove("NEURON_RT_INSPECT_ON_FAIL")
            .env_remove("NEURON_RT_INSPECT_OUTPUT_DIR")
            .args(args);
        command
    }

    fn run(&self, binary: &str, args: &[&str]) -> Output {
        self.command(binary, args).output().expect("run the binary")
    }

    fn spawn(&self, binary: &str, args: &[&str]) -> Child {
        self.command(binary, args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn")
    }
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name).to_string_lossy().into_owned()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn succeeded(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn summary_json(env: &Env, file: &Path) -> Value {
    let out = env.run(PROFILE, &["view", "-s", file.to_str().expect("utf-8"), "--output-format", "summary-json"]);
    serde_json::from_str(&succeeded(&out)).expect("summary JSON")
}

fn events_json(env: &Env, file: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["view", "-s", file.to_str().expect("utf-8"), "--output-format", "json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&succeeded(&env.run(PROFILE, &args))).expect("events JSON")
}

/// Polls `condition` every 10 ms for up to 60 s.
fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(started.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn capture_records_every_execution_and_the_device_trace_of_the_nth() {
    let env = Env::new();
    let file = env.path("mlp.ntff");
    let out = env.run(
        PROFILE,
        &[
            "capture",
            "-n",
            &example("mlp.hlo"),
            "-s",
            file.to_str().expect("utf-8"),
            "--num-exec",
            "5",
            "--profile-nth-exec",
            "2",
        ],
    );
    succeeded(&out);
    assert!(text(&out.stderr).contains("captured 5 executions of mlp"), "{}", text(&out.stderr));
    let s = summary_json(&env, &file);
    assert_eq!(s["executions"]["count"], 5);
    assert_eq!(s["executions"]["device_traced"], 1);
    assert_eq!(s["events"]["lost_in_rings"], 0);
    assert!(s["executions"]["latency"]["p50"].as_f64().expect("p50") > 0.0);
    // The traced execution's instructions add up to the model's FLOPs.
    let model_flops = s["models"][0]["flops_per_execution"].as_f64().expect("model flops");
    assert_eq!(s["flops"]["per_execution"].as_f64(), Some(model_flops));
    let mfu = s["flops"]["mfu"].as_f64().expect("mfu");
    assert!(mfu > 0.0 && mfu <= 1.0, "{mfu}");
    assert_eq!(s["executions"]["warmup"], 2, "two warm-up executions by default");
    assert_eq!(s["executions"]["traced"][0]["ordinal"], 2, "the second recorded execution is the traced one");
    assert!(s["engines"].as_array().expect("engines").iter().any(|e| e["engine"] == "PE"));
    let engine_percent: f64 =
        s["engines"].as_array().expect("engines").iter().map(|e| e["percent"].as_f64().unwrap_or(0.0)).sum();
    assert!(engine_percent > 50.0 && engine_percent <= 100.5, "{engine_percent}");
    assert!(s["dma"].as_array().expect("dma").iter().any(|q| q["queue"] == "input" && q["bytes"].as_u64() > Some(0)));

    // The text summary names the same figures for people.
    let out = env.run(PROFILE, &["view", "-s", file.to_str().expect("utf-8"), "--output-format", "summary-text"]);
    let summary = succeeded(&out);
    for needle in [
        "executions: 5 recorded, after 2 warm-up executions (1 with a device trace)",
        "traced     execution 2 on nc0:",
        "engines",
        "top HLO instructions",
        "MFU",
        "per core, defined: ",
        "DMA by queue",
        "one execution has a device trace",
    ] {
        assert!(summary.contains(needle), "{needle} missing from\n{summary}");
    }

    // json: the runtime's event shapes, filtered by type.
    let events = events_json(&env, &file, &["--system-trace-filter-event-type", "nrt_execute"]);
    let events = events["events"].as_array().expect("events");
    assert_eq!(events.len(), 10, "a start and a stop per execution");
    assert!(events.iter().all(|e| e["event_type"] == "nrt_execute"));
}

/// Issue 39: by default a capture of many executions device-traces executions spread
/// over all of them, not the first alone, and its percentiles say what they are over.
#[test]
fn capture_device_traces_executions_spread_over_the_recorded_ones_by_default() {
    let env = Env::new();
    let file = env.path("spread.ntff");
    let f = file.to_str().expect("utf-8");
    succeeded(&env.run(PROFILE, &["capture", "-n", &example("mlp.hlo"), "-s", f, "--num-exec", "50"]));
    let s = summary_json(&env, &file);
    assert_eq!(s["executions"]["count"], 50);
    assert_eq!(s["executions"]["device_traced"], 25, "every other one of 50");
    let ordinals: Vec<u64> =
        s["executions"]["traced"].as_array().expect("traced").iter().filter_map(|t| t["ordinal"].as_u64()).collect();
    // The summary lists the first few: the 1st, 3rd, 5th…
    assert!(!ordinals.is_empty() && ordinals.iter().enumerate().all(|(k, &o)| o == 2 * k as u64 + 1), "{ordinals:?}");
    // No DMA bandwidth above what the host's memory delivers: inputs read in place
    // copy nothing, and are said to.
    let memory = s["flops"]["memory_peak_bytes_per_s"].as_f64().expect("the host's bandwidth");
    for queue in s["dma"].as_array().expect("dma") {
        assert!(queue["bandwidth_bytes_per_s"].as_f64().is_none_or(|bw| bw <= memory), "{queue} over {memory}");
    }
    let summary = succeeded(&env.run(PROFILE, &["view", "-s", f, "--output-format", "summary-text"]));
    assert!(summary.contains("p99 –") && summary.contains("over 50 executions"), "{summary}");
    assert!(!summary.contains("one execution has a device trace"), "{summary}");

    // One execution: no percentiles at all.
    let one = env.path("one.ntff");
    let o = one.to_str().expect("utf-8");
    succeeded(&env.run(PROFILE, &["capture", "-n", &example("mlp.hlo"), "-s", o, "--num-exec", "1"]));
    let summary = succeeded(&env.run(PROFILE, &["view", "-s", o, "--output-format", "summary-text"]));
    assert!(summary.contains("one execution (no percentiles)"), "{summary}");
    assert!(!summary.contains("latency    p50"), "{summary}");
}

#[test]
fn a_capture_without_warm_up_says_its_traced_execution_ran_cold() {
    let env = Env::new();
    let file = env.path("cold.ntff");
    let f = file.to_str().expect("utf-8");
    succeeded(&env.run(
        PROFILE,
        &["capture", "-n", &example("mlp.hlo"), "-s", f, "--num-exec", "8", "--warmup", "0", "--profile-nth-exec", "1"],
    ));
    let s = summary_json(&env, &file);
    assert_eq!(s["executions"]["warmup"], 0);
    let traced = &s["executions"]["traced"][0];
    assert_eq!(traced["ordinal"], 1, "{traced}");
    let of_p50 = traced["of_p50"].as_f64().expect("compared with the p50");
    let summary = succeeded(&env.run(PROFILE, &["view", "-s", f, "--output-format", "summary-text"]));
    assert!(summary.contains("executions: 8 recorded (1 with a device trace)"), "{summary}");
    assert!(summary.contains("traced     execution 1 on nc0: "), "{summary}");
    assert!(summary.contains(&format!("{of_p50:.2}× the p50 on device")), "{summary}");
    // Whether the cold execution was slow enough to warn about depends on the host;
    // when it was, the summary says why.
    let warned = summary.contains("is the first, run cold without a warm-up");
    assert_eq!(warned, of_p50 > 1.2, "{summary}");
}

/// A matrix product of the size the backend's rate is measured at, traced: its MFU is
/// against the defined peak, which no measured rate reaches.
#[test]
fn mfu_of_a_matrix_product_at_the_peak_shape_stays_at_most_100_percent() {
    let env = Env::new();
    let model = env.path("gemm.hlo");
    std::fs::write(
        &model,
        "HloModule gemm\n\nENTRY gemm {\n  a = f32[1024,1024] parameter(0)\n  b = f32[1024,1024] parameter(1)\n  \
         ROOT d = f32[1024,1024] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n",
    )
    .expect("write model");
    let file = env.path("gemm.ntff");
    let f = file.to_str().expect("utf-8");
    succeeded(&env.run(
        PROFILE,
        &["capture", "-n", model.to_str().expect("utf-8"), "-s", f, "--num-exec", "3", "--profile-all-execs"],
    ));
    let s = summary_json(&env, &file);
    let flops = &s["flops"];
    let (peak, measured) = (flops["peak_per_s"].as_f64().expect("defined peak"), flops["measured_per_s"].as_f64());
    assert!(measured.is_some_and(|m| m > 0.0 && m <= peak), "measured {measured:?} against the defined {peak}");
    let mfu = flops["mfu"].as_f64().expect("mfu");
    assert!(mfu > 0.0 && mfu <= 1.0, "MFU {mfu}");
    let pe = s["engines"].as_array().expect("engines").iter().find(|e| e["engine"] == "PE").expect("PE row").clone();
    let of_peak = pe["percent_of_peak"].as_f64().expect("PE % of peak");
    assert!(of_peak > 0.0 && of_peak <= 100.0, "{pe}");
    assert!(s["caveats"].as_array().expect("caveats").iter().all(|c| !c.as_str().unwrap_or("").contains("above")));
}

#[test]
fn systrace_and_disable_profile_record_what_they_say() {
    let env = Env::new();
    let file = env.path("sys.ntff");
    let f = file.to_str().expect("utf-8");
    succeeded(&env.run(
        PROFILE,
        &["capture", "-n", &example("mlp.hlo"), "-s", f, "--num-exec", "3", "-t", "systrace", "--exec-mode", "async"],
    ));
    let s = summary_json(&env, &file);
    assert_eq!((s["executions"]["count"].as_u64(), s["events"]["device"].as_u64()), (Some(3), Some(0)));
    let none = env.path("none.ntff");
    let out = env.run(
        PROFILE,
        &[
            "capture",
            "-n",
            &example("mlp.hlo"),
            "-s",
            none.to_str().expect("utf-8"),
            "--disable-profile",
            "--check-output-determinism",
            "--num-exec",
            "3",
        ],
    );
    succeeded(&out);
    assert!(!none.exists());
    assert!(text(&out.stderr).contains("every execution produced the same outputs"), "{}", text(&out.stderr));
}

#[test]
fn a_newer_file_version_is_refused_by_view() {
    let env = Env::new();
    let file = env.path("new.ntff");
    let mut bytes = b"\x89NTFF\r\n\x1a".to_vec();
    bytes.extend_from_slice(&[9, 0, 0, 0, 0, 0, 0, 0]);
    std::fs::write(&file, bytes).expect("write");
    let out = env.run(PROFILE, &["view", "-s", file.to_str().expect("utf-8"), "--output-format", "summary-text"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("NTFF version 9 is not supported in this version of the tool (supported: 2 - 2)"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_capture_killed_mid_write_is_readable_with_a_loss_report() {
    let env = Env::new();
    let file = env.path("killed.ntff");
    let mut child = env.spawn(
        PROFILE,
        &[
            "capture",
            "-n",
            &example("mlp.hlo"),
            "-s",
            file.to_str().expect("utf-8"),
            "--num-exec",
            "1000000",
            "--profile-all-execs",
        ],
    );
    // The capture writes aside, and renames into place only when it ends: killed
    // outright, it leaves the `.partial` file and nothing half-written under its name.
    let partial = env.path("killed.ntff.partial");
    // At least one flushed chunk beyond the tables.
    wait_for("the capture to write", || std::fs::metadata(&partial).is_ok_and(|m| m.len() > 40_000));
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    assert!(!file.exists(), "nothing at the final name");
    let s = summary_json(&env, &partial);
    let problems: Vec<String> =
        s["file_problems"].as_array().expect("problems").iter().map(|p| p.as_str().unwrap_or("").to_string()).collect();
    assert!(problems.iter().any(|p| p.contains("not finished")), "{problems:?}");
    assert!(s["executions"]["count"].as_u64() > Some(0), "{s}");
    assert!(s["events"]["device"].as_u64() > Some(0), "{s}");
}

#[test]
fn inspect_writes_one_file_per_runtime_process() {
    let env = Env::new();
    let out_dir = env.path("traces");
    let script = format!(
        "{BENCH} exec {} --cores 0 --iterations 3 && {BENCH} exec {} --cores 0 --iterations 2",
        example("mlp.hlo"),
        example("mlp.hlo")
    );
    let out = env.run(PROFILE, &["inspect", "-o", out_dir.to_str().expect("utf-8"), "--", "sh", "-c", &script]);
    succeeded(&out);
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&out_dir).expect("list").map(|e| e.expect("entry").path()).collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}\n{}", text(&out.stderr));
    let mut counts: Vec<u64> =
        files.iter().map(|f| summary_json(&env, f)["executions"]["count"].as_u64().expect("count")).collect();
    counts.sort();
    assert_eq!(counts, [2, 3]);
    for f in &files {
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        let pid = summary_json(&env, f)["process"]["pid"].as_u64().expect("pid");
        assert!(name.contains(&format!("-pid{pid}-")), "{name}");
    }
}

#[test]
fn inspect_on_fail_writes_the_rings_when_an_execution_fails() {
    let env = Env::new();
    let out_dir = env.path("fails");
    let mut command = env.command(
        PROFILE,
        &[
            "inspect",
            "-o",
            out_dir.to_str().expect("utf-8"),
            "--",
            BENCH,
            "exec",
            &example("mlp.hlo"),
            "--cores",
            "0",
            "--iterations",
            "4",
        ],
    );
    command.env("NEURON_RT_INSPECT_ON_FAIL", "1").env("NEURON_RT_FAULT_INJECT", "oob:core=0:every=3");
    let out = command.output().expect("run");
    let files: Vec<PathBuf> = std::fs::read_dir(&out_dir).expect("list").map(|e| e.expect("entry").path()).collect();
    assert_eq!(files.len(), 1, "{files:?}\n{}", text(&out.stderr));
    assert!(files[0].to_string_lossy().ends_with("-fail1.ntff"));
    let s = summary_json(&env, &files[0]);
    assert!(s["executions"]["count"].as_u64() >= Some(3), "{s}");
}

#[test]
fn snapshot_of_a_running_bench_holds_the_newest_events() {
    let env = Env::new();
    let mut command = env.command(BENCH, &["exec", &example("mlp.hlo"), "--cores", "0", "--duration", "60s"]);
    command.env("NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC", "256").stdout(Stdio::null()).stderr(Stdio::null());
    let mut bench = command.spawn().expect("spawn");
    let pid = bench.id();
    let mut reader: Option<DatastoreReader> = None;
    wait_for("the bench's system ring to wrap", || {
        if reader.is_none() {
            reader = discover(&env.datastores())
                .unwrap_or_default()
                .into_iter()
                .find(|e| e.pid == pid)
                .and_then(|e| e.reader.ok());
        }
        reader.as_ref().is_some_and(|r| {
            r.snapshot().rings.iter().any(|ring| ring.core == Some(0) && !ring.device && ring.produced > 600)
        })
    });
    let reader = reader.expect("reader");
    let produced = |r: &DatastoreReader| {
        r.snapshot()
            .rings
            .iter()
            .find(|ring| ring.core == Some(0) && !ring.device)
            .map(|ring| ring.produced)
            .expect("ring")
    };
    let before = produced(&reader);
    let file = env.path("snap.ntff");
    let out = env.run(PROFILE, &["snapshot", &pid.to_string(), "-o", file.to_str().expect("utf-8")]);
    let after = produced(&reader);
    bench.kill().expect("kill");
    bench.wait().expect("reap");
    succeeded(&out);
    let events = events_json(&env, &file, &["--system-trace-filter-neuron-core", "0"]);
    let ids: Vec<u64> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e.get("timestamp_ns").is_some())
        .map(|e| e["id"].as_u64().expect("id"))
        .collect();
    let (low, high) = (*ids.iter().min().expect("events"), *ids.iter().max().expect("events"));
    // The newest events: nothing older than the ring held when the snapshot began, and
    // everything up to then.
    assert!(low + 256 >= before, "oldest {low}, ring at {before}");
    assert!(high + 1 >= before && high < after, "newest {high}, ring from {before} to {after}");
}

#[test]
fn a_recorded_trace_reads_back_event_for_event() {
    let env = Env::new();
    let config = Config::from_lookup(|name| match name {
        "NEURON_VIRT_LOCK_DIR" => Some(env.dir.path().to_string_lossy().into_owned()),
        "NEURON_VIRT_DATASTORE_DIR" => Some(env.datastores().to_string_lossy().into_owned()),
        "NEURON_RT_VISIBLE_CORES" => Some("0".into()),
        _ => None,
    })
    .expect("config");
    let runtime = Runtime::start(config).expect("runtime");
    let reader = DatastoreReader::open(&runtime.datastore_path().expect("path")).expect("reader");
    let mut recorder = Recorder::new(
        ntff::Writer::new(Vec::new(), &metadata(reader.info(), neuron_profiler::PROFILE_TOOL, "test", &[]))
            .expect("writer"),
    );
    let mut tail = reader.tail(TailStart::Now, None, ALL_SYSTEM_EVENTS, true);
    let mut reference = reader.tail(TailStart::Now, None, ALL_SYSTEM_EVENTS, true);
    let neff =
        neuron_profiler::load_model_bytes(Path::new(&example("mlp.hlo")), neuron_runtime::Target::Trn1).expect("model");
    let model = runtime.load(&neff, Some(0)).expect("load");
    let placement = TensorPlacement::Device { core: 0 };
    let (mut inputs, mut outputs) = (TensorSet::new(), TensorSet::new());
    for io in model.inputs() {
        inputs.add(&io.name, runtime.allocate_tensor_for(placement, model.tensor_type(io), &io.name).expect("input"));
    }
    for io in model.outputs() {
        outputs.add(&io.name, runtime.allocate_tensor_for(placement, model.tensor_type(io), &io.name).expect("output"));
    }
    // The reference reads right after the recorder: a reader converts ticks with the
    // calibration of the moment it reads, which the heartbeat refreshes every 250 ms.
    let mut expected = Vec::new();
    for _ in 0..3 {
        runtime.execute(&model, &inputs, &outputs).expect("execute");
        recorder.drain(&reader, &mut tail, false).expect("drain");
        reference.poll(&reader, usize::MAX, false, &mut expected);
    }
    recorder.drain(&reader, &mut tail, true).expect("drain");
    reference.poll(&reader, usize::MAX, true, &mut expected);
    let (bytes, _) = recorder.finish().expect("finish");
    let file = ntff::NtffFile::from_bytes(bytes).expect("opens");
    let mut read = Vec::new();
    for info in file.chunks() {
        let chunk = file.read_chunk(info).expect("chunk");
        read.extend(chunk.system.iter().map(|e| TraceEvent::System(to_system_event(&file, e).expect("runtime event"))));
        read.extend(chunk.device.iter().map(|e| TraceEvent::Device(to_device_event(&file, e).expect("runtime event"))));
    }
    let key = |e: &TraceEvent| match e {
        TraceEvent::System(s) => (s.nc_idx, 0, s.id),
        TraceEvent::Device(d) => (Some(d.nc_idx), 1, d.id),
    };
    expected.sort_by_key(key);
    read.sort_by_key(key);
    assert!(expected.len() > 100, "{} events", expected.len());
    assert!(expected.iter().any(|e| matches!(e, TraceEvent::Device(_))));
    assert_eq!(read, expected);
}

/// The interpreter with the official Perfetto protos: `NTFF_PERFETTO_PYTHON`, else
/// `python3`; `None` outside CI when it lacks the `perfetto` package.
fn perfetto_python() -> Option<String> {
    let python = std::env::var("NTFF_PERFETTO_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python).args(["-c", "import perfetto.protos.perfetto.trace.perfetto_trace_pb2"]).output();
    if probe.is_ok_and(|o| o.status.success()) {
        return Some(python);
    }
    neuron_test_support::ci::missing(
        &format!("{python} has no `perfetto` package (pip install perfetto)"),
        "the official-protos check",
    );
    None
}

#[test]
fn a_real_capture_exports_to_perfetto_and_chrome_json() {
    let env = Env::new();
    let file = env.path("attention.ntff");
    let capture = [
        "capture",
        "-n",
        &example("attention.hlo"),
        "-s",
        file.to_str().expect("utf-8"),
        "--num-exec",
        "6",
        "--profile-all-execs",
    ];
    succeeded(&env.run(PROFILE, &capture));
    let events = events_json(&env, &file, &[]);
    let device_events =
        events["events"].as_array().expect("events").iter().filter(|e| e.get("start_ns").is_some()).count() as u64;
    assert!(device_events > 0);

    let trace = env.path("attention.pftrace");
    let out = env.run(
        PROFILE,
        &[
            "view",
            "-s",
            file.to_str().expect("utf-8"),
            "--output-format",
            "perfetto",
            "--output-file",
            trace.to_str().expect("utf-8"),
        ],
    );
    succeeded(&out);
    assert!(text(&out.stderr).contains(&format!("({device_events} device)")), "{}", text(&out.stderr));
    let bytes = std::fs::read(&trace).expect("trace written");
    let check = ntff::export::verify_perfetto(&bytes).expect("a valid trace");
    assert_eq!(check.open_at_end, 0);
    let names: Vec<&str> = check.tracks.iter().map(|t| t.name.as_str()).collect();
    for track in ["NeuronCore 0", "executions", "PE", "DMA input", "utilisation", "tensor memory"] {
        assert!(names.contains(&track), "no {track} track in {names:?}");
    }
    let executions = check.tracks.iter().find(|t| t.name == "executions").expect("executions track");
    assert_eq!(executions.slices, 6);
    assert_eq!(check.flows, 6, "one flow from each nrt_execute to its device execution");
    let device: u64 = check
        .tracks
        .iter()
        .filter(|t| ["PE", "ACT", "DVE", "POOL", "SP"].contains(&t.name.as_str()) || t.name.starts_with("DMA "))
        .map(|t| t.slices)
        .sum();
    assert_eq!(device, device_events);

    if let Some(python) = perfetto_python() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ntff/tests/perfetto_check.py");
        let out = Command::new(python).arg(script).arg(&trace).output().expect("python runs");
        let report: Value = serde_json::from_str(succeeded(&out).trim()).expect("report");
        assert_eq!(report["slices"].as_u64(), Some(check.slices));
    }

    // Chrome JSON: the same slices, to stdout.
    let out = env.run(PROFILE, &["view", "-s", file.to_str().expect("utf-8"), "--output-format", "chrome-json"]);
    let json: Value = serde_json::from_str(&succeeded(&out)).expect("JSON");
    let begins = json["traceEvents"].as_array().expect("events").iter().filter(|e| e["ph"] == "B").count() as u64;
    assert_eq!(begins, check.slices);
}
