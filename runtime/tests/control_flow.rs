//! Loops and conditionals at the runtime's boundary: what an execution returns, what
//! its device trace shows for each iteration, and how the execution timeout ends a
//! loop that never stops.

use std::time::Duration;

use neuron_datastore::{ALL_SYSTEM_EVENTS, DatastoreReader, DeviceActivity, TailStart, TraceEvent};
use neuron_runtime::{ArrayType, Config, CoreSet, DType, NrtStatus, Runtime, TensorPlacement, TensorSet};
use neuron_test_support::runtime::{self as common, f32_bytes, floats, ints, neff};

const COUNTED_LOOP: &str = include_str!("data/control/counted_loop.hlo");

fn started(adjust: impl FnOnce(&mut Config)) -> common::Fixture {
    common::started(CoreSet::range(0, 0), adjust)
}

/// Runs the counted loop (halve `x` until the counter reaches `stop`); its outputs.
fn run_counted_loop(
    rt: &Runtime,
    model: &neuron_runtime::Model,
    x: [f32; 4],
    stop: i32,
) -> Result<(Vec<f32>, i32), neuron_runtime::NrtError> {
    let tensor = |ty: ArrayType, name: &str| rt.allocate_tensor_for(TensorPlacement::Host, &ty, name).expect("alloc");
    let scalar = ArrayType::new(DType::S32, vec![]);
    let vector = ArrayType::new(DType::F32, vec![4]);
    let (input_x, input_stop) = (tensor(vector.clone(), "x"), tensor(scalar.clone(), "stop"));
    input_x.write(0, &f32_bytes(&x)).expect("write");
    input_stop.write(0, &stop.to_le_bytes()).expect("write");
    let mut inputs = TensorSet::new();
    inputs.add("input0", input_x);
    inputs.add("input1", input_stop);
    let mut outputs = TensorSet::new();
    outputs.add("output0", tensor(vector, "y"));
    outputs.add("output1", tensor(scalar, "n"));
    rt.execute(model, &inputs, &outputs)?;
    let read = |name: &str| outputs.get(name).expect("bound").read_all().expect("read");
    Ok((floats(&read("output0")), ints(&read("output1"))[0]))
}

#[test]
fn a_loop_runs_until_its_condition_fails_and_traces_every_iteration() {
    let f = started(|config| config.inspect.device = true);
    let rt = &f.runtime;
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
    let model = rt.load(&neff(COUNTED_LOOP, neuron_runtime::Target::Trn1), Some(0)).expect("loads");

    let (y, n) = run_counted_loop(rt, &model, [32.0, -64.0, 1.0, 0.0], 5).expect("runs");
    assert_eq!((y, n), (vec![1.0, -2.0, 1.0 / 32.0, 0.0], 5));

    let mut events = Vec::new();
    tail.poll(&reader, usize::MAX, false, &mut events);
    let instructions: Vec<(String, String, u64, u64)> = events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::Device(e) => match &e.activity {
                DeviceActivity::Instruction { hlo, opcode, .. } => {
                    Some((hlo.clone(), opcode.clone(), e.start_ns, e.end_ns))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    let count = |name: &str| instructions.iter().filter(|(hlo, ..)| hlo == name).count();
    assert_eq!(count("scaled"), 5, "the body's multiply runs once per iteration: {instructions:?}");
    assert_eq!(count("going"), 6, "the condition runs before each iteration and once more to stop");
    assert_eq!(count("loop"), 6, "one loop span per iteration, and one for the final check");
    let spans: Vec<(u64, u64)> =
        instructions.iter().filter(|(hlo, ..)| hlo == "loop").map(|&(_, _, start, end)| (start, end)).collect();
    for (hlo, opcode, start, end) in instructions.iter().filter(|(hlo, ..)| hlo == "scaled") {
        assert_eq!(opcode, "Multiply");
        assert!(
            spans.iter().any(|&(s, e)| s <= *start && *end <= e),
            "{hlo} at {start}..{end} lies inside an iteration span: {spans:?}"
        );
    }
}

#[test]
fn a_loop_that_never_stops_ends_at_the_execution_timeout_and_the_core_runs_again() {
    let f = started(|config| config.exec_timeout = Duration::from_millis(300));
    let rt = &f.runtime;
    let model = rt.load(&neff(COUNTED_LOOP, neuron_runtime::Target::Trn1), Some(0)).expect("loads");
    // The counter counts up from 0 and never equals -1 (before it wraps, ~4e9 iterations on).
    let err = run_counted_loop(rt, &model, [1.0; 4], -1).expect_err("never stops");
    assert_eq!(err.status, NrtStatus::Timeout);
    assert!(err.message.contains("NEURON_RT_EXEC_TIMEOUT"), "{}", err.message);
    assert!(err.message.contains("HLO `"), "the message names where it stopped: {}", err.message);
    let (y, n) = run_counted_loop(rt, &model, [8.0; 4], 3).expect("the core runs the next execution");
    assert_eq!((y, n), (vec![1.0; 4], 3));
}
