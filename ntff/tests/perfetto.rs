//! The Perfetto and Chrome JSON exports: read back with our proto subset and checked
//! for the trace format's rules, compared with the events written, and parsed with the
//! official Perfetto protos.

mod common;

use std::collections::HashMap;
use std::process::Command;

use common::{op, write};
use ntff::export::{ExportOptions, ExportSummary, Format, TraceCheck, export, verify_perfetto};
use ntff::{Arg, ArgValue, Clock, Descriptor, DeviceEvent, Metadata, NtffFile, Phase, SyncPoint, SystemEvent, Writer};
use proptest::prelude::*;

fn export_to(file: NtffFile, format: Format, options: &ExportOptions) -> (Vec<u8>, ExportSummary) {
    export(&[file], options, format, Vec::new(), &mut |_| {}).expect("export")
}

/// A plausible capture: `executions` executions spread over `cores` cores, each with
/// its host spans, device execution, instructions on three engines, an input DMA, a
/// sync point, and tensor allocations; with a device ring loss on core 0 if asked.
struct Simulation {
    cores: u32,
    executions: u32,
    device_loss: bool,
}

/// What a simulation wrote.
#[derive(Debug, Default)]
struct Written {
    /// (core, engine or "DMA input") → events.
    device: HashMap<(u32, String), u64>,
    executions_per_core: HashMap<u32, u64>,
}

/// The device clock of a core runs `DEVICE_OFFSET` behind host time, plus a drift.
const DEVICE_OFFSET: u64 = 7_000_000;

impl Simulation {
    fn run(&self) -> (Vec<u8>, Written) {
        let metadata =
            Metadata { runtime_version: "test".into(), pid: 4242, process_tag: "sim".into(), ..Metadata::default() };
        let mut w = Writer::new(Vec::new(), &metadata).expect("header");
        let mut written = Written::default();
        let engines = ["PE", "ACT", "DVE"];
        let descriptors: Vec<_> = (0..9u32)
            .map(|k| {
                let d = Descriptor::Instruction {
                    model_id: 1,
                    engine: w.intern(engines[k as usize % 3]),
                    opcode: w.intern(["MatMult", "Activate", "TensorTensor"][k as usize % 3]),
                    hlo: w.intern(&format!("op.{k}")),
                    step: k,
                    flops: 1000,
                    bytes_read: 64,
                    bytes_written: 64,
                };
                w.descriptor(&d)
            })
            .collect();
        let dma = Descriptor::Dma { model_id: 1, queue: w.intern("input"), index: 0, bytes: 4096 };
        let dma = w.descriptor(&dma);
        let names: HashMap<&str, ntff::Sym> = [
            "nrt_execute",
            "kbl_exec_pre",
            "nc_exec_running",
            "timestamp_sync_point",
            "nrt_tensor_allocate",
            "nrt_tensor_free",
        ]
        .into_iter()
        .map(|n| (n, w.intern(n)))
        .collect();
        let size = w.intern("size");
        let mut t = 1_000_000_000u64;
        let mut tracking = 1u64;
        let mut ids = HashMap::new();
        let mut device_ids = HashMap::new();
        for k in 0..self.executions {
            let core = k % self.cores;
            let tid = 100 + core;
            let exec = u64::from(k) + 1;
            let drift = u64::from(k) * 3;
            let device = |host: u64| host - DEVICE_OFFSET - u64::from(core) * 1000 + drift;
            let mut system =
                |w: &mut Writer<Vec<u8>>, name: &str, phase: Phase, clock: Clock, ts: u64, tr: u64, args: Vec<Arg>| {
                    let id = ids.entry(core).or_insert(0u64);
                    *id += 1;
                    let e = SystemEvent {
                        core: Some(core),
                        id: *id,
                        name: names[name],
                        phase,
                        clock,
                        timestamp_ns: ts,
                        tracking_id: tr,
                        thread_id: tid,
                        exec_id: Some(exec),
                        model_id: Some(1),
                        nrta_seq_id: None,
                        args,
                    };
                    w.system(&e).expect("write");
                };
            let alloc = tracking;
            tracking += 1;
            let bytes = vec![Arg { key: size, value: ArgValue::U64(1 << 20) }];
            system(&mut w, "nrt_tensor_allocate", Phase::Start, Clock::Host, t, alloc, bytes.clone());
            system(&mut w, "nrt_tensor_allocate", Phase::Stop, Clock::Host, t + 100, alloc, bytes.clone());
            let (execute, pre, running) = (tracking, tracking + 1, tracking + 2);
            tracking += 3;
            system(&mut w, "nrt_execute", Phase::Start, Clock::Host, t + 200, execute, vec![]);
            system(&mut w, "kbl_exec_pre", Phase::Start, Clock::Host, t + 300, pre, vec![]);
            system(&mut w, "kbl_exec_pre", Phase::Stop, Clock::Host, t + 900, pre, vec![]);
            let start = t + 1000;
            system(&mut w, "nc_exec_running", Phase::Start, Clock::Device, device(start), running, vec![]);
            if self.device_loss && k == self.executions / 2 {
                w.loss(Some(core), true, 17).expect("loss");
            }
            let mut next_device = |w: &mut Writer<Vec<u8>>, s: u64, e: u64, descriptor| {
                let id = device_ids.entry(core).or_insert(0u64);
                *id += 1;
                let event = DeviceEvent {
                    core,
                    id: *id,
                    exec_id: Some(exec),
                    start_ns: device(s),
                    end_ns: device(e),
                    descriptor,
                };
                w.device(&event).expect("write");
            };
            next_device(&mut w, start, start + 400, dma);
            *written.device.entry((core, "DMA input".into())).or_default() += 1;
            for (i, &d) in descriptors.iter().enumerate() {
                let s = start + 500 + i as u64 * 500;
                next_device(&mut w, s, s + 450, d);
                *written.device.entry((core, engines[i % 3].into())).or_default() += 1;
            }
            let stop = start + 500 + 9 * 500;
            system(&mut w, "nc_exec_running", Phase::Stop, Clock::Device, device(stop), running, vec![]);
            let sync = stop + 100;
            system(&mut w, "timestamp_sync_point", Phase::Instant, Clock::Host, sync, 0, vec![]);
            w.sync_point(core, SyncPoint { host_ns: sync, device_ns: device(sync) }).expect("sync");
            system(&mut w, "nrt_execute", Phase::Stop, Clock::Host, sync + 200, execute, vec![]);
            let free = tracking;
            tracking += 1;
            system(&mut w, "nrt_tensor_free", Phase::Start, Clock::Host, sync + 300, free, bytes.clone());
            system(&mut w, "nrt_tensor_free", Phase::Stop, Clock::Host, sync + 400, free, bytes);
            *written.executions_per_core.entry(core).or_default() += 1;
            t = sync + 10_000;
            if k % 7 == 6 {
                w.flush().expect("flush");
            }
        }
        (w.finish().expect("finish").0, written)
    }
}

fn track<'a>(check: &'a TraceCheck, parent: &str, name: &str) -> &'a ntff::export::TrackCheck {
    let parents: Vec<u64> = check.tracks.iter().filter(|t| t.name == parent).map(|t| t.uuid).collect();
    check
        .tracks
        .iter()
        .find(|t| t.name == name && t.parent_uuid.is_some_and(|p| parents.contains(&p)))
        .unwrap_or_else(|| panic!("no track {name:?} under {parent:?} in {:?}", names(check)))
}

fn names(check: &TraceCheck) -> Vec<&str> {
    check.tracks.iter().map(|t| t.name.as_str()).collect()
}

#[test]
fn a_simulated_capture_exports_every_event_on_its_track() {
    let sim = Simulation { cores: 2, executions: 40, device_loss: true };
    let (bytes, written) = sim.run();
    let file = NtffFile::from_bytes(bytes).expect("opens");
    let (trace, summary) = export_to(file, Format::Perfetto, &ExportOptions::default());
    let check = verify_perfetto(&trace).expect("valid trace");
    assert_eq!(summary.bytes, trace.len() as u64);
    assert_eq!(check.open_at_end, 0);
    assert_eq!(check.slices, summary.slices());
    for ((core, unit), &events) in &written.device {
        let lane = track(&check, &format!("NeuronCore {core}"), unit);
        assert_eq!(lane.slices, events, "{unit} of core {core}");
        assert_eq!(lane.max_depth, 1, "instructions on one engine do not overlap");
    }
    assert_eq!(summary.device_slices, written.device.values().sum::<u64>());
    for (core, &executions) in &written.executions_per_core {
        let group = format!("NeuronCore {core}");
        assert_eq!(track(&check, &group, "executions").slice_names["nc_exec_running"], executions);
        assert!(track(&check, &group, "utilisation").counter_values > 0);
        // Allocation and free: one value each per execution.
        assert_eq!(track(&check, &group, "tensor memory").counter_values, 2 * executions);
    }
    let pe = track(&check, "NeuronCore 0", "PE");
    assert_eq!(pe.slice_names["MatMult op.0"], written.executions_per_core[&0]);
    // A flow from each nrt_execute to its device execution.
    assert_eq!(check.flows, u64::from(sim.executions));
    assert_eq!(summary.flows, u64::from(sim.executions));
    // The device ring's loss: a counter, and the device sequences of core 0 restart
    // with previous_packet_dropped.
    assert_eq!(summary.ring_events_lost, 17);
    assert!(check.dropped_markers >= 4, "{} dropped markers", check.dropped_markers);
    assert_eq!(track(&check, "NeuronCore 0", "device events lost").counter_values, 2);
    let threads: Vec<_> = check.tracks.iter().filter(|t| t.name.starts_with("thread ")).collect();
    assert_eq!(threads.len(), 2);
    // Host spans: nrt_execute, kbl_exec_pre, and the allocations (the sync points are not drawn).
    let thread_slices: u64 = threads.iter().map(|t| t.slices).sum();
    assert_eq!(thread_slices, 4 * u64::from(sim.executions));
    assert!(summary.problems().iter().all(|p| p.contains("lost to ring overwrites")), "{:?}", summary.problems());

    // Device slices cost under 30 bytes each, their sequences' set-up included.
    let device_tracks: Vec<_> =
        check.tracks.iter().filter(|t| ["PE", "ACT", "DVE", "DMA input"].contains(&t.name.as_str())).collect();
    let bytes: u64 = device_tracks.iter().map(|t| t.bytes).sum();
    let slices: u64 = device_tracks.iter().map(|t| t.slices).sum();
    let per_slice = bytes as f64 / slices as f64;
    assert!(per_slice <= 30.0, "{per_slice:.1} bytes per device slice");
}

#[test]
fn device_times_are_moved_onto_the_host_clock() {
    let sim = Simulation { cores: 1, executions: 5, device_loss: false };
    let (bytes, _) = sim.run();
    let file = NtffFile::from_bytes(bytes).expect("opens");
    let (json, _) = export_to(file, Format::ChromeJson, &ExportOptions::default());
    let trace: serde_json::Value = serde_json::from_slice(&json).expect("valid JSON");
    let events = trace["traceEvents"].as_array().expect("events");
    let begins = |name: &str| -> Vec<f64> {
        events.iter().filter(|e| e["ph"] == "B" && e["name"] == name).map(|e| e["ts"].as_f64().expect("ts")).collect()
    };
    let execute = begins("nrt_execute");
    let running = begins("nc_exec_running");
    let first_pe = begins("MatMult op.0");
    assert_eq!((execute.len(), running.len(), first_pe.len()), (5, 5, 5));
    for k in 0..5 {
        // nrt_execute starts at t+200 ns, the device at t+1000, its first instruction at t+1500.
        assert!((running[k] - execute[k] - 0.8).abs() < 1e-6, "{} vs {}", running[k], execute[k]);
        assert!((first_pe[k] - execute[k] - 1.3).abs() < 1e-6);
    }
    // Flows start on the host and finish on the device execution.
    let flows: Vec<_> = events.iter().filter(|e| e["ph"] == "s" || e["ph"] == "f").collect();
    assert_eq!(flows.len(), 10);
}

#[test]
fn chrome_json_has_balanced_slices_in_time_order_per_thread() {
    let sim = Simulation { cores: 2, executions: 12, device_loss: false };
    let (bytes, _) = sim.run();
    let (json, summary) =
        export_to(NtffFile::from_bytes(bytes).expect("opens"), Format::ChromeJson, &ExportOptions::default());
    let trace: serde_json::Value = serde_json::from_slice(&json).expect("valid JSON");
    let mut open: HashMap<(u64, u64), (i64, f64)> = HashMap::new();
    let mut begins = 0;
    for e in trace["traceEvents"].as_array().expect("events") {
        let ph = e["ph"].as_str().expect("ph");
        if ph == "M" || ph == "C" {
            continue;
        }
        let key = (e["pid"].as_u64().expect("pid"), e["tid"].as_u64().expect("tid"));
        let ts = e["ts"].as_f64().expect("ts");
        let state = open.entry(key).or_insert((0, f64::MIN));
        assert!(ts >= state.1, "time goes back on {key:?}");
        state.1 = ts;
        match ph {
            "B" => {
                state.0 += 1;
                begins += 1;
            }
            "E" => {
                state.0 -= 1;
                assert!(state.0 >= 0);
            }
            _ => {}
        }
    }
    assert!(open.values().all(|s| s.0 == 0));
    assert_eq!(begins, summary.slices());
}

#[test]
fn filters_select_cores_and_event_types() {
    let sim = Simulation { cores: 2, executions: 10, device_loss: false };
    let (bytes, _) = sim.run();
    let options = ExportOptions { cores: Some(vec![1]), ..ExportOptions::default() };
    let (trace, _) = export_to(NtffFile::from_bytes(bytes.clone()).expect("opens"), Format::Perfetto, &options);
    let check = verify_perfetto(&trace).expect("valid");
    assert!(names(&check).contains(&"NeuronCore 1"));
    assert!(!names(&check).contains(&"NeuronCore 0"));
    let options = ExportOptions { system_types: Some(vec!["nrt_execute".into()]), ..ExportOptions::default() };
    let (trace, summary) = export_to(NtffFile::from_bytes(bytes).expect("opens"), Format::Perfetto, &options);
    let check = verify_perfetto(&trace).expect("valid");
    assert_eq!(summary.device_slices, 0);
    assert_eq!(check.slices, 10);
    assert!(check.tracks.iter().filter(|t| t.slices > 0).all(|t| t.slice_names.keys().all(|n| n == "nrt_execute")));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever a file holds (times in any order, unpaired stops, overlapping device
    /// events, losses anywhere), the export is a valid trace holding every device event
    /// that has a sync point to place it.
    #[test]
    fn any_streams_export_to_a_valid_trace(ops in prop::collection::vec(op(), 0..300)) {
        let (bytes, _) = write(&ops);
        let file = NtffFile::from_bytes(bytes.clone()).expect("opens");
        let device_events: u64 = file.chunks().iter().map(|c| u64::from(c.device_events)).sum();
        let (trace, summary) = export_to(file, Format::Perfetto, &ExportOptions::default());
        let check = verify_perfetto(&trace);
        prop_assert!(check.is_ok(), "{:?}", check.err());
        let check = check.expect("checked");
        prop_assert_eq!(check.slices, summary.slices());
        prop_assert_eq!(summary.device_slices + summary.unaligned_device_events, device_events);
        let (json, _) = export_to(NtffFile::from_bytes(bytes).expect("opens"), Format::ChromeJson, &ExportOptions::default());
        prop_assert!(serde_json::from_slice::<serde_json::Value>(&json).is_ok());
    }
}

/// The interpreter to run `perfetto_check.py` with: `NTFF_PERFETTO_PYTHON`, else
/// `python3`; `None` (outside CI) when it lacks the `perfetto` package.
fn perfetto_python() -> Option<String> {
    let python = std::env::var("NTFF_PERFETTO_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python).args(["-c", "import perfetto.protos.perfetto.trace.perfetto_trace_pb2"]).output();
    if probe.is_ok_and(|o| o.status.success()) {
        return Some(python);
    }
    neuron_test_support::ci::missing(
        &format!("{python} has no `perfetto` package (pip install perfetto, or set NTFF_PERFETTO_PYTHON)"),
        "the official-protos check",
    );
    None
}

#[test]
fn official_perfetto_protos_parse_every_packet_without_unknown_fields() {
    let Some(python) = perfetto_python() else { return };
    let sim = Simulation { cores: 2, executions: 30, device_loss: true };
    let (bytes, _) = sim.run();
    let (trace, summary) =
        export_to(NtffFile::from_bytes(bytes).expect("opens"), Format::Perfetto, &ExportOptions::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sim.pftrace");
    std::fs::write(&path, &trace).expect("write");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/perfetto_check.py");
    let out = Command::new(python).arg(script).arg(&path).output().expect("runs python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).expect("a JSON report");
    assert_eq!(report["slices"].as_u64(), Some(summary.slices()));
    assert_eq!(report["problems"].as_array().map(Vec::len), Some(0));
}

/// One execution of a process of a job whose host clock reads `shift` ns ahead of the
/// root's: `nrt_execute` on the host, one instruction on core 0's device clock (placed
/// through a sync point), and, unless it is the root, the `clock_offset` its runtime
/// measured (−`shift`).
fn rank_file(pid: u32, shift: u64) -> NtffFile {
    let metadata = Metadata { runtime_version: "test".into(), pid, ..Metadata::default() };
    let mut w = Writer::new(Vec::new(), &metadata).expect("header");
    let pe = Descriptor::Instruction {
        model_id: 1,
        engine: w.intern("PE"),
        opcode: w.intern("MatMult"),
        hlo: w.intern("dot.1"),
        step: 0,
        flops: 1000,
        bytes_read: 64,
        bytes_written: 64,
    };
    let pe = w.descriptor(&pe);
    let event = |w: &mut Writer<Vec<u8>>, name: &str, phase, ts: u64, args: Vec<Arg>| SystemEvent {
        core: None,
        id: ts,
        name: w.intern(name),
        phase,
        clock: Clock::Host,
        timestamp_ns: ts,
        tracking_id: 1,
        thread_id: 1,
        exec_id: Some(1),
        model_id: Some(1),
        nrta_seq_id: None,
        args,
    };
    let t = 2_000_000_000 + shift;
    if shift > 0 {
        let args = vec![
            Arg { key: w.intern("offset_ns"), value: ArgValue::I64(-(shift as i64)) },
            Arg { key: w.intern("uncertainty_ns"), value: ArgValue::U64(20_000) },
        ];
        let e = event(&mut w, "clock_offset", Phase::Instant, t - 1_000_000, args);
        w.system(&e).expect("write");
    }
    for (phase, ts) in [(Phase::Start, t), (Phase::Stop, t + 50_000)] {
        let e = event(&mut w, "nrt_execute", phase, ts, vec![]);
        w.system(&e).expect("write");
    }
    // The device clock runs 7 ms behind this host's.
    let device = |host: u64| host - DEVICE_OFFSET;
    w.sync_point(0, SyncPoint { host_ns: t + 40_000, device_ns: device(t + 40_000) }).expect("sync");
    let instruction = DeviceEvent {
        core: 0,
        id: 1,
        exec_id: Some(1),
        start_ns: device(t + 10_000),
        end_ns: device(t + 30_000),
        descriptor: pe,
    };
    w.device(&instruction).expect("write");
    NtffFile::from_bytes(w.finish().expect("finish").0).expect("opens")
}

/// Start times (µs) of the Chrome JSON trace's slices of `name`, per process id.
fn starts_by_pid(json: &[u8], name: &str) -> HashMap<u64, Vec<f64>> {
    let trace: serde_json::Value = serde_json::from_slice(json).expect("json");
    let mut starts: HashMap<u64, Vec<f64>> = HashMap::new();
    for e in trace["traceEvents"].as_array().expect("events") {
        if e["name"].as_str().is_some_and(|n| n.starts_with(name)) && matches!(e["ph"].as_str(), Some("X" | "B")) {
            let (Some(pid), Some(ts)) = (e["pid"].as_u64(), e["ts"].as_f64()) else { continue };
            starts.entry(pid).or_default().push(ts);
        }
    }
    starts
}

#[test]
fn the_ranks_of_a_job_are_moved_onto_the_root_clock_by_their_measured_offsets() {
    // Rank 0's process, and one on a host whose clock reads 5 s ahead of it.
    const SHIFT: u64 = 5_000_000_000;
    let files = || [rank_file(100, 0), rank_file(200, SHIFT)];
    let on_root = ExportOptions { root_clock: true, ..ExportOptions::default() };
    let (json, summary) = export(&files(), &on_root, Format::ChromeJson, Vec::new(), &mut |_| {}).expect("export");
    assert_eq!(summary.root_clock_offsets, vec![None, Some((-(SHIFT as i64), 20_000))]);
    for name in ["nrt_execute", "MatMult"] {
        let starts = starts_by_pid(&json, name);
        assert_eq!(starts.len(), 2, "{name} on both ranks: {starts:?}");
        assert_eq!(starts[&100], starts[&200], "{name} at the same time on the root's clock");
    }
    // Left on their own clocks, the same events are 5 s apart.
    let (json, summary) =
        export(&files(), &ExportOptions::default(), Format::ChromeJson, Vec::new(), &mut |_| {}).expect("export");
    assert_eq!(summary.root_clock_offsets, vec![None, None]);
    let starts = starts_by_pid(&json, "nrt_execute");
    assert!((starts[&200][0] - starts[&100][0] - SHIFT as f64 / 1e3).abs() < 1.0, "{starts:?}");
}
