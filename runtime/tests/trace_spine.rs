//! The trace spine seen from outside: what an execution leaves in the datastore (read
//! back through the reader API), and the in-process `nrt_sys_trace_*` API.

use neuron_datastore::{
    ALL_SYSTEM_EVENTS, ClockDomain, DeviceActivity, DeviceEvent, DmaQueueType, EventData, EventType, ExecOutcome,
    Phase, SysTraceConfig,
};
use neuron_datastore::{DatastoreReader, Delta, TailStart, TraceEvent, latency_of_all_cores};
use neuron_runtime::{
    ArrayType, CompileOptions, Config, CoreSet, DType, Neff, OptLevel, Runtime, Target, TensorPlacement, TensorSet,
    compile_hlo, compile_hlo_with,
};

use neuron_test_support::runtime as common;

const ADD_EXP: &str = include_str!("data/add_exp.hlo");

/// A runtime on core 0.
fn started(adjust: impl FnOnce(&mut Config)) -> common::Fixture {
    common::started(CoreSet::range(0, 0), adjust)
}

fn bound(rt: &Runtime) -> (neuron_runtime::Model, TensorSet, TensorSet) {
    let neff = Neff::new("add_exp", compile_hlo(ADD_EXP, Target::Trn1).expect("compiles")).encode();
    common::bind_f32(rt, &neff, 4)
}

#[test]
fn an_execution_leaves_its_counters_and_events_in_the_datastore() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let before = reader.snapshot();
    let began = std::time::Instant::now();
    let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
    let (model, inputs, outputs) = bound(rt);
    let x = inputs.get("input0").expect("bound");
    for _ in 0..3 {
        x.write(0, &[0u8; 16]).expect("write");
        rt.execute(&model, &inputs, &outputs).expect("runs");
    }
    let after = reader.snapshot();
    let core = after.core(0).expect("nc0 counters");
    assert_eq!(core.executions.get(ExecOutcome::Completed), 3);
    assert_eq!(core.executions.total(), 3);
    assert_eq!(core.instructions, 6);
    assert_eq!(core.flops, 3 * model.flops_per_execution());
    assert_eq!(core.dma_bytes[DmaQueueType::Input as usize], 48);
    assert_eq!(core.dma_bytes[DmaQueueType::Output as usize], 48);
    let delta = Delta::between(&before, &after);
    let latency = delta.cores[0].total_latency.expect("latencies");
    assert_eq!(latency.count, 3);
    assert!(latency.p0 > 0.0 && latency.p0 <= latency.p50 && latency.p50 <= latency.p100);
    // In seconds: an execution takes at least a microsecond, and less than the test.
    assert!(latency.p0 > 1e-6 && latency.p100 < began.elapsed().as_secs_f64(), "{latency:?}");
    // The process's percentiles over all its cores: here one core's.
    assert_eq!(latency_of_all_cores(&before, &after, false), Some(latency));
    assert_eq!(latency_of_all_cores(&before, &after, true).map(|l| l.count), Some(3));
    assert_eq!(latency_of_all_cores(&after, &after, true), None);
    assert_eq!(reader.models().len(), 1);
    assert_eq!(reader.models()[0].executions, 3);
    assert_eq!(reader.models()[0].name, "add_exp");

    let mut events = Vec::new();
    tail.poll(&reader, usize::MAX, false, &mut events);
    assert_eq!(tail.lost(), 0);
    let system: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::System(e) if e.nc_idx == Some(0) => Some(e),
            _ => None,
        })
        .collect();
    let names: Vec<String> = system.iter().map(|e| format!("{} {}", e.event_type, e.phase.name())).collect();
    let first_execution = names.iter().position(|n| n == "nrt_execute start").expect("an execution");
    assert_eq!(
        names[first_execution..first_execution + 16],
        [
            "nrt_execute start",
            "kbl_exec_wait start",
            "kmgr_exec_core start",
            "kmgr_exec_core stop",
            "kbl_exec_pre start",
            "dmem_buf_copyin instant",
            "kbl_exec_pre stop",
            "nc_exec_running start",
            "nc_exec_running stop",
            "kbl_exec_post start",
            "dmem_buf_copyout instant",
            "kbl_exec_post stop",
            "timestamp_sync_point instant",
            "kbl_exec_wait stop",
            "nrt_execute stop",
            "nrt_tensor_write start",
        ]
    );
    assert_eq!(names.iter().filter(|n| *n == "nrt_execute stop").count(), 3);
    assert!(names.contains(&"nrt_load start".to_string()) && names.contains(&"nrt_tensor_allocate stop".to_string()));
    for pair in system.windows(2) {
        assert!(pair[0].id < pair[1].id, "events arrive in ring order");
    }
    let start = system.iter().find(|e| e.event_type == EventType::NrtExecute).expect("start");
    let stop = system.iter().find(|e| e.event_type == EventType::NrtExecute && e.phase == Phase::Stop).expect("stop");
    assert_eq!(start.tracking_id, stop.tracking_id);
    assert_eq!(start.exec_id, stop.exec_id);
    assert_eq!(start.model_id, Some(model.id()));

    // Device time maps to host time through the sync point that follows it.
    let running_stop = system
        .iter()
        .find(|e| e.event_type == EventType::NcExecRunning && e.phase == Phase::Stop)
        .expect("nc_exec_running");
    assert_eq!(running_stop.clock, ClockDomain::Device);
    let sync = system.iter().find(|e| e.event_type == EventType::TimestampSyncPoint).expect("sync point");
    let EventData::SyncPoint { cpu_timestamp_ns, nc_timestamp_ns } = sync.data else { panic!("{sync:?}") };
    assert!(nc_timestamp_ns.abs_diff(cpu_timestamp_ns) > 1_000_000, "the device clock is not the host clock");
    let aligned = cpu_timestamp_ns as i128 + (running_stop.timestamp_ns as i128 - nc_timestamp_ns as i128);
    let post_stop =
        system.iter().find(|e| e.event_type == EventType::KblExecPost && e.phase == Phase::Stop).expect("post");
    assert!(aligned <= post_stop.timestamp_ns as i128 + 1000, "{aligned} after {}", post_stop.timestamp_ns);
    assert!(aligned >= start.timestamp_ns as i128, "{aligned} before {}", start.timestamp_ns);

    let device: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::Device(e) => Some(e),
            _ => None,
        })
        .collect();
    let instructions: Vec<_> =
        device.iter().filter(|e| matches!(e.activity, DeviceActivity::Instruction { .. })).collect();
    assert_eq!(instructions.len(), 6);
    let DeviceActivity::Instruction { opcode, hlo, bytes_read, bytes_written, .. } = &instructions[1].activity else {
        unreachable!()
    };
    // `e` runs fused after the `add` it reads: its operand never leaves the tile, so it
    // moves only the 16 bytes it writes (issue 39: fused instructions are charged what
    // the group moves).
    assert_eq!((opcode.as_str(), hlo.as_str(), *bytes_read, *bytes_written), ("Exp", "e", 0, 16));
    assert!(instructions.iter().all(|e| e.start_ns <= e.end_ns));
    let queues: Vec<DmaQueueType> = device
        .iter()
        .filter_map(|e| match e.activity {
            DeviceActivity::Dma { queue, .. } => Some(queue),
            _ => None,
        })
        .collect();
    assert_eq!(queues.iter().filter(|q| **q == DmaQueueType::Input).count(), 3);
    assert_eq!(queues.iter().filter(|q| **q == DmaQueueType::Output).count(), 3);
    assert!(queues.contains(&DmaQueueType::Instructions));
}

/// Issue 39: the datastore says which kernel runs the bf16-rounded products, which the
/// tools' defined PE peak follows. Tests are unoptimised builds, which run the f32
/// multiply-adds (the bf16 kernel is for optimised builds on CPUs that have it).
#[test]
fn the_datastore_says_which_kernel_runs_bf16_rounded_products() {
    let f = started(|_| {});
    let reader = DatastoreReader::open(&f.runtime.datastore_path().expect("path")).expect("opens");
    assert_eq!(reader.info().product_kernel, neuron_datastore::peaks::ProductKernel::F32);
}

#[test]
fn switches_off_what_the_inspect_configuration_excludes() {
    let f = started(|c| {
        c.inspect.device = false;
        c.inspect.event_types = EventType::NrtExecute.bit();
    });
    let rt = &f.runtime;
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
    let (model, inputs, outputs) = bound(rt);
    rt.execute(&model, &inputs, &outputs).expect("runs");
    let mut events = Vec::new();
    tail.poll(&reader, usize::MAX, false, &mut events);
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events.iter().all(|e| matches!(e, TraceEvent::System(s) if s.event_type == EventType::NrtExecute)));
    assert!(!reader.info().device_trace_recording);
}

#[test]
fn sys_trace_fetch_matches_the_golden_shape_and_consumes_events() {
    let f = started(|c| c.inspect.system = false);
    let rt = &f.runtime;
    let (model, inputs, outputs) = bound(rt);
    let config = SysTraceConfig {
        event_types: EventType::NrtExecute.bit()
            | EventType::DmemBufCopyin.bit()
            | EventType::TimestampSyncPoint.bit()
            | EventType::NrtTensorRead.bit(),
        ..SysTraceConfig::default()
    };
    rt.sys_trace_start(&config).expect("starts");
    rt.execute(&model, &inputs, &outputs).expect("runs");
    outputs.get("output0").expect("bound").read_all().expect("reads");
    rt.sys_trace_stop().expect("stops");
    let fetch = rt.sys_trace_fetch_events().expect("fetch");
    assert_eq!(fetch.lost, 0);
    // Times, thread ids and tensor ids differ from run to run; the shape, the key
    // order and everything else do not. One event per line keeps diffs readable.
    let mut actual = fetch.to_json();
    for key in ["timestamp_ns", "thread_id", "cpu_timestamp_ns", "nc_timestamp_ns", "tensor_id"] {
        actual = zero_numbers_after(&actual, &format!("\"{key}\":"));
    }
    let actual = actual.replace("},{\"event_type\"", "},\n{\"event_type\"") + "\n";
    let golden_path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/trace/fetch_events.json");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(golden_path, &actual).expect("writes golden file");
    }
    let golden = std::fs::read_to_string(golden_path).expect("golden file (UPDATE_GOLDEN=1 writes it)");
    assert_eq!(actual, golden, "fetch JSON differs from {golden_path}");
    let again = rt.sys_trace_fetch_events().expect("fetch");
    assert!(again.events.is_empty(), "a fetch consumes what it returns");
    assert_eq!(again.to_json(), r#"{"events":[],"data_version":2}"#);
}

/// Replaces the number after every `prefix` with 0.
fn zero_numbers_after(json: &str, prefix: &str) -> String {
    let mut out = String::new();
    let mut rest = json;
    while let Some(at) = rest.find(prefix) {
        let (head, tail) = rest.split_at(at + prefix.len());
        out.push_str(head);
        out.push('0');
        rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

#[test]
fn a_gather_past_the_table_fails_with_nrt_exec_oob_and_is_counted_as_an_error() {
    // rows = table[ids]: an embedding lookup of 3 rows from a 5-row table.
    const GATHER: &str = "HloModule lookup\nENTRY e {\n  table = f32[5,2]{1,0} parameter(0)\n  \
        ids = s32[3]{0} parameter(1)\n  ROOT rows = f32[3,2]{1,0} gather(table, ids), offset_dims={1}, \
        collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,2}\n}\n";
    let f = started(|_| {});
    let rt = &f.runtime;
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let model = rt.load(&Neff::new("lookup", compile_hlo(GATHER, Target::Trn1).expect("compiles")).encode(), None);
    let model = model.expect("loads");
    let table_ty = ArrayType::new(DType::F32, vec![5, 2]);
    let ids_ty = ArrayType::new(DType::S32, vec![3]);
    let table = rt.allocate_tensor_for(TensorPlacement::Device { core: 0 }, &table_ty, "table").expect("alloc");
    let table_values: Vec<u8> = (0..10).flat_map(|i| (i as f32).to_le_bytes()).collect();
    table.write(0, &table_values).expect("write");
    let ids = rt.allocate_tensor_for(TensorPlacement::Device { core: 0 }, &ids_ty, "ids").expect("alloc");
    let output = rt.allocate_tensor_for(TensorPlacement::Host, &ArrayType::new(DType::F32, vec![3, 2]), "rows");
    let mut inputs = TensorSet::new();
    inputs.add("input0", table);
    inputs.add("input1", ids);
    let mut outputs = TensorSet::new();
    outputs.add("output0", output.expect("alloc"));
    let set_ids = |values: [i32; 3]| {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        inputs.get("input1").expect("bound").write(0, &bytes).expect("write");
    };

    set_ids([4, 0, 2]);
    rt.execute(&model, &inputs, &outputs).expect("in-range lookup runs");
    let rows = outputs.get("output0").expect("bound").read_all().expect("read");
    let rows: Vec<f32> = rows.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(rows, [8.0, 9.0, 0.0, 1.0, 4.0, 5.0]);

    // XLA would clamp index 5 to 4; the Neuron runtime fails the execution.
    for bad in [[1, 5, 0], [0, 1, -1]] {
        set_ids(bad);
        let err = rt.execute(&model, &inputs, &outputs).expect_err("out of bounds");
        assert_eq!(err.status, neuron_runtime::NrtStatus::ExecOob);
        assert!(
            err.message.starts_with(
                "failed to run scatter/gather (indirect memory copy), due to out-of-bound access: instruction 0 (Gather, HLO `rows`) of `lookup` on nc0"
            ),
            "{}",
            err.message
        );
    }
    let core = reader.snapshot().core(0).expect("nc0 counters").clone();
    assert_eq!(core.executions.get(ExecOutcome::Completed), 1);
    assert_eq!(core.executions.get(ExecOutcome::CompletedWithErr), 2);
    assert_eq!(core.errors.get(neuron_datastore::ErrorClass::Model), 2);
}

/// A softmax row: `bc`, `scaled`, `shifted` and `e` fuse (the broadcast read in place),
/// and `n`, which does not depend on them, runs before the group (compiled at
/// `--optlevel 1`, which leaves `n` an instruction rather than a constant).
const FUSED: &str = r#"
HloModule fused
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[64,256] parameter(0)
  c = f32[] constant(0.125)
  bc = f32[64,256] broadcast(c), dimensions={}
  scaled = f32[64,256] multiply(x, bc)
  n = f32[] negate(c)
  shifted = f32[64,256] subtract(scaled, bc)
  e = f32[64,256] exponential(shifted)
  lo = f32[64] reduce(e, n), dimensions={1}, to_apply=max
  ROOT t = (f32[64,256], f32[64]) tuple(e, lo)
}
"#;

/// The instruction events of one execution of `FUSED`, with fusion on or off:
/// (hlo, step, start, end) in the order they were recorded.
fn fused_instructions(fusion: bool) -> Vec<(String, u32, u64, u64)> {
    let shapes = ([vec![64, 256]], [vec![64, 256], vec![64]]);
    instruction_events(FUSED, fusion, &shapes.0, &shapes.1)
        .into_iter()
        .filter_map(|e| match &e.activity {
            DeviceActivity::Instruction { hlo, step, .. } => Some((hlo.clone(), *step, e.start_ns, e.end_ns)),
            _ => None,
        })
        .collect()
}

/// The instruction events of one execution of `hlo`, compiled at level 1 (so that
/// values of constants stay instructions), with fusion on or off, on f32 inputs and
/// outputs of the given shapes.
fn instruction_events(hlo: &str, fusion: bool, inputs: &[Vec<u64>], outputs: &[Vec<u64>]) -> Vec<DeviceEvent> {
    let f = started(|config| {
        config.fusion = fusion;
        config.inspect.device = true;
    });
    let rt = &f.runtime;
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
    let options = CompileOptions { optlevel: OptLevel::O1, ..CompileOptions::new(Target::Trn1) };
    let neff = Neff::new("events", compile_hlo_with(hlo, &options).expect("compiles")).encode();
    let model = rt.load(&neff, Some(0)).expect("loads");
    let tensors = |prefix: &str, shapes: &[Vec<u64>]| {
        let mut set = TensorSet::new();
        for (k, dims) in shapes.iter().enumerate() {
            let ty = ArrayType::new(DType::F32, dims.clone());
            let name = format!("{prefix}{k}");
            set.add(&name, rt.allocate_tensor_for(TensorPlacement::Host, &ty, &name).expect("alloc"));
        }
        set
    };
    rt.execute(&model, &tensors("input", inputs), &tensors("output", outputs)).expect("runs");
    let mut events = Vec::new();
    tail.poll(&reader, usize::MAX, false, &mut events);
    events
        .into_iter()
        .filter_map(|e| match e {
            TraceEvent::Device(e) if matches!(e.activity, DeviceActivity::Instruction { .. }) => Some(e),
            _ => None,
        })
        .collect()
}

#[test]
fn a_fused_group_shows_every_instruction_with_its_share_of_the_time() {
    let plain = fused_instructions(false);
    let fused = fused_instructions(true);
    let names = |list: &[(String, u32, u64, u64)]| list.iter().map(|(h, ..)| h.clone()).collect::<Vec<_>>();
    // Unfused, in step order; fused, `n` runs first and the group's members follow each
    // other, each with its own step number.
    let mut steps: Vec<u32> = plain.iter().map(|(_, s, ..)| *s).collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{plain:?}");
    assert_eq!(names(&plain), ["bc", "scaled", "n", "shifted", "e", "lo"]);
    assert_eq!(names(&fused), ["n", "bc", "scaled", "shifted", "e", "lo"]);
    let mut fused_steps: Vec<u32> = fused.iter().map(|(_, s, ..)| *s).collect();
    fused_steps.sort_unstable();
    steps.sort_unstable();
    assert_eq!(fused_steps, steps);
    // Back to back: the group's interval is split between its members.
    for pair in fused.windows(2) {
        assert_eq!(pair[0].3, pair[1].2, "{fused:?}");
    }
}

/// Issue 39: a reshape of an intermediate that dies with it takes the array over, so
/// its instruction table entry moves no bytes (a roofline would read it far above what
/// memory delivers); one of a parameter copies, and says so.
#[test]
fn a_reshape_that_takes_over_its_operand_moves_no_bytes() {
    const RESHAPES: &str = "HloModule r\nENTRY e {\n  x = f32[16] parameter(0)\n  n = f32[16] negate(x)\n  \
        r = f32[4,4] reshape(n)\n  t = f32[4,4] transpose(r), dimensions={1,0}\n  \
        p = f32[4,4] reshape(x)\n  ROOT s = (f32[4,4], f32[4,4]) tuple(t, p)\n}\n";
    let events = instruction_events(RESHAPES, true, &[vec![16]], &[vec![4, 4], vec![4, 4]]);
    let moved = |name: &str| {
        events
            .iter()
            .find_map(|e| match &e.activity {
                DeviceActivity::Instruction { hlo, bytes_read, bytes_written, .. } if hlo == name => {
                    Some((*bytes_read, *bytes_written))
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("no event of {name}: {events:?}"))
    };
    assert_eq!(moved("r"), (0, 0), "the reshape of `n`, which dies with it");
    assert_eq!(moved("p"), (64, 64), "the reshape of a parameter, returned");
    assert_eq!(moved("t"), (64, 64));
}

/// Each loaded model has its own latency histogram: two models on one core keep their
/// latencies apart, as the core's histogram cannot.
#[test]
fn each_model_counts_its_own_executions_and_latency() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let tanh = |n: u64| {
        let hlo =
            format!("HloModule tanh{n}\nENTRY e {{\n  x = f32[{n}] parameter(0)\n  ROOT y = f32[{n}] tanh(x)\n}}\n");
        Neff::new(&format!("tanh{n}"), compile_hlo(&hlo, Target::Trn1).expect("compiles")).encode()
    };
    let (small, small_in, small_out) = common::bind_f32(rt, &tanh(4), 4);
    let (large, large_in, large_out) = common::bind_f32(rt, &tanh(1 << 20), 1 << 20);
    let first = reader.models();
    for _ in 0..20 {
        rt.execute(&small, &small_in, &small_out).expect("runs");
    }
    for _ in 0..5 {
        rt.execute(&large, &large_in, &large_out).expect("runs");
    }
    let models = reader.models();
    let find = |list: &[neuron_datastore::ModelInfo], name: &str| {
        list.iter().find(|m| m.name == name).cloned().expect("the model is listed")
    };
    let (small_now, large_now) = (find(&models, "tanh4"), find(&models, "tanh1048576"));
    let small_latency = small_now.latency_since(Some(&find(&first, "tanh4"))).expect("small latencies");
    let large_latency = large_now.latency_since(None).expect("large latencies");
    assert_eq!((small_now.executions, small_latency.count), (20, 20));
    assert_eq!((large_now.executions, large_latency.count), (5, 5));
    assert!(large_latency.p50 > small_latency.p99, "{large_latency:?} against {small_latency:?}");
    assert_eq!(small_now.latency_since(Some(&small_now)), None, "nothing new since itself");
}
