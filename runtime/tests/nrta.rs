//! Asynchronous execution (`nrta_*`) seen from outside: results, queue limits, error
//! trackers, completion handles polled from `tokio`, and the events requests leave.

use std::time::Duration;

use neuron_datastore::{ALL_SYSTEM_EVENTS, EventType, ExecOutcome, Phase};
use neuron_datastore::{DatastoreReader, TailStart, TraceEvent};
use neuron_runtime::fault::parse_rules;
use neuron_runtime::{
    ArrayType, Config, CoreSet, DType, Model, Neff, NrtStatus, Runtime, SeqId, Target, TensorPlacement, TensorSet, Xu,
    compile_hlo,
};

use neuron_test_support::runtime as common;

const ADD_EXP: &str = include_str!("data/add_exp.hlo");
const WAIT: Duration = Duration::from_secs(30);

/// A runtime on cores 0 and 1.
fn started(adjust: impl FnOnce(&mut Config)) -> common::Fixture {
    common::started(CoreSet::range(0, 1), adjust)
}

fn model(rt: &Runtime, core: u32) -> Model {
    let neff = Neff::new("add_exp", compile_hlo(ADD_EXP, Target::Trn1).expect("compiles")).encode();
    rt.load(&neff, Some(core)).expect("loads")
}

/// Input and output tensors of one request, the input holding `x`.
fn tensors(rt: &Runtime, x: [f32; 4]) -> (TensorSet, TensorSet) {
    let ty = ArrayType::new(DType::F32, vec![4]);
    let input = rt.allocate_tensor_for(TensorPlacement::Host, &ty, "x").expect("alloc");
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    input.write(0, &bytes).expect("write");
    let output = rt.allocate_tensor_for(TensorPlacement::Host, &ty, "y").expect("alloc");
    let mut inputs = TensorSet::new();
    inputs.add("input0", input);
    let mut outputs = TensorSet::new();
    outputs.add("output0", output);
    (inputs, outputs)
}

fn read(outputs: &TensorSet) -> Vec<u8> {
    outputs.get("output0").expect("bound").read_all().expect("reads")
}

#[test]
fn scheduled_executions_give_the_results_of_synchronous_ones() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let m = model(rt, 0);
    let requests: Vec<(TensorSet, TensorSet)> =
        (0..12).map(|i| tensors(rt, [i as f32 * 0.1, -1.0, 0.5, i as f32])).collect();
    let mut seqs: Vec<SeqId> = Vec::new();
    for (inputs, outputs) in &requests {
        let seq = loop {
            match rt.execute_schedule(&m, inputs, outputs, None) {
                Ok(seq) => break seq,
                // Eight requests in flight (the default queue): wait for the oldest.
                Err(e) if e.status == NrtStatus::QueueFull => {
                    let oldest = seqs.iter().copied().find(|&s| !rt.is_completed(s).expect("known"));
                    rt.wait_sequence(oldest.expect("something is in flight"), WAIT).expect("completes");
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!((seq.core(), seq.xu(), seq.number()), (0, Some(Xu::Compute), seqs.len() as u64 + 1));
        seqs.push(seq);
    }
    let last = *seqs.last().expect("scheduled");
    rt.wait_sequence(last, WAIT).expect("completes");
    assert!(rt.is_completed(last).expect("known"));
    assert_eq!(rt.get_sequence(0, Xu::Compute).expect("held"), Some(last));
    for (i, (inputs, outputs)) in requests.iter().enumerate() {
        let asynchronous = read(outputs);
        let (_, sync_outputs) = tensors(rt, [0.0; 4]);
        rt.execute(&m, inputs, &sync_outputs).expect("runs");
        assert_eq!(asynchronous, read(&sync_outputs), "request {i}");
    }
}

#[test]
fn a_full_queue_refuses_with_queue_full_and_counts_it() {
    // Every execution on nc0 hangs until its 0.5 s timeout, so the queue stays full.
    let f = started(|config| {
        config.xu_queue = 2;
        config.exec_timeout = Duration::from_millis(500);
        config.faults = parse_rules("timeout:core=0", 2).expect("rules");
    });
    let rt = &f.runtime;
    let m = model(rt, 0);
    let (inputs, outputs) = tensors(rt, [1.0; 4]);
    let tracker = rt.error_tracker_create(0).expect("tracker");
    let first = rt.execute_schedule(&m, &inputs, &outputs, Some(&tracker)).expect("room");
    let second = rt.execute_schedule(&m, &inputs, &outputs, Some(&tracker)).expect("room");
    let full = rt.execute_schedule(&m, &inputs, &outputs, Some(&tracker)).expect_err("two in flight");
    assert_eq!(full.status, NrtStatus::QueueFull, "{full}");
    rt.wait_sequence(second, WAIT).expect("completes");
    let failed: Vec<(SeqId, NrtStatus)> = tracker.errors().iter().map(|e| (e.seq_id, e.status)).collect();
    assert_eq!(failed, [(first, NrtStatus::Timeout), (second, NrtStatus::Timeout)]);
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let core = reader.snapshot().core(0).expect("nc0").clone();
    assert_eq!(core.executions.get(ExecOutcome::FailedToQueue), 1);
    assert_eq!(core.executions.get(ExecOutcome::TimedOut), 2);
}

#[test]
fn error_trackers_list_exactly_the_failed_requests() {
    let f = started(|config| config.faults = parse_rules("oob:core=0:every=3", 2).expect("rules"));
    let rt = &f.runtime;
    let m = model(rt, 0);
    let tracker = rt.error_tracker_create(0).expect("tracker");
    let (inputs, outputs) = tensors(rt, [1.0; 4]);
    let mut seqs = Vec::new();
    for _ in 0..7 {
        let seq = rt.execute_schedule(&m, &inputs, &outputs, Some(&tracker)).expect("room");
        rt.wait_sequence(seq, WAIT).expect("completes");
        seqs.push(seq);
    }
    let failed: Vec<(SeqId, NrtStatus)> = tracker.errors().iter().map(|e| (e.seq_id, e.status)).collect();
    assert_eq!(failed, [(seqs[2], NrtStatus::ExecOob), (seqs[5], NrtStatus::ExecOob)]);
    let other = rt.error_tracker_create(1).expect("tracker");
    let refused = rt.execute_schedule(&m, &inputs, &outputs, Some(&other)).expect_err("wrong core");
    assert_eq!(refused.status, NrtStatus::Invalid);
}

#[test]
fn a_degraded_core_refuses_schedules_at_once() {
    let f = started(|config| config.faults = parse_rules("dma_abort:core=0", 2).expect("rules"));
    let rt = &f.runtime;
    let m = model(rt, 0);
    let (inputs, outputs) = tensors(rt, [1.0; 4]);
    let seq = rt.execute_schedule(&m, &inputs, &outputs, None).expect("room");
    rt.wait_sequence(seq, WAIT).expect("completes");
    let refused = rt.execute_schedule(&m, &inputs, &outputs, None).expect_err("degraded");
    assert_eq!(refused.status, NrtStatus::ExecUnitUnrecoverable, "{refused}");
    let tensor = rt.allocate_tensor(TensorPlacement::Device { core: 0 }, 16, "t").expect("alloc");
    let refused = rt.tensor_write_schedule(0, &tensor, 0, &[1; 16], None).expect_err("degraded");
    assert_eq!(refused.status, NrtStatus::ExecUnitUnrecoverable, "{refused}");
    let refused = rt.tensor_read_schedule(0, &tensor, 0, 16, None).expect_err("degraded");
    assert_eq!(refused.status, NrtStatus::ExecUnitUnrecoverable, "{refused}");
    let healthy = model(rt, 1);
    let seq = rt.execute_schedule(&healthy, &inputs, &outputs, None).expect("nc1 takes work");
    rt.wait_sequence(seq, WAIT).expect("completes");
}

#[test]
fn a_completion_handle_wakes_a_tokio_task() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let m = model(rt, 1);
    let (inputs, outputs) = tensors(rt, [0.0; 4]);
    let handle = rt.completion_handle(1, Xu::Compute).expect("handle");
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
    let seq = tokio.block_on(async {
        // SAFETY: the handle owns the unit's eventfd (through an `Arc`), so the descriptor
        // stays open and the same for as long as the `AsyncFd` holds the handle.
        let fd =
            unsafe { tokio::io::unix::AsyncFd::register_with_interest(handle.clone(), tokio::io::Interest::READABLE) }
                .map_err(|e| e.to_string())
                .expect("registers");
        let seq = rt.execute_schedule(&m, &inputs, &outputs, None).expect("room");
        let mut guard = tokio::time::timeout(WAIT, fd.readable()).await.expect("woken in time").expect("readable");
        assert_eq!(handle.acknowledge(), 1, "one completion");
        guard.clear_ready();
        seq
    });
    assert_eq!(handle.last_completed(), Some(seq));
    assert_eq!(read(&outputs), [1.0f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
}

#[test]
fn requests_leave_schedule_events_and_execution_events_with_their_sequence_id() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
    let m = model(rt, 0);
    let (inputs, outputs) = tensors(rt, [0.0; 4]);
    let seq = rt.execute_schedule(&m, &inputs, &outputs, None).expect("room");
    rt.wait_sequence(seq, WAIT).expect("completes");
    rt.execute(&m, &inputs, &outputs).expect("a synchronous one");
    let mut events = Vec::new();
    tail.poll(&reader, usize::MAX, false, &mut events);
    let system: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::System(e) => Some(e),
            _ => None,
        })
        .collect();
    let schedule: Vec<(Phase, Option<u64>)> = system
        .iter()
        .filter(|e| e.event_type == EventType::NrtaExecuteSchedule)
        .map(|e| (e.phase, e.nrta_seq_id))
        .collect();
    assert_eq!(schedule, [(Phase::Start, Some(seq.0)), (Phase::Stop, Some(seq.0))]);
    let executes: Vec<Option<u64>> =
        system.iter().filter(|e| e.event_type == EventType::NrtExecute).map(|e| e.nrta_seq_id).collect();
    assert_eq!(executes, [Some(seq.0), Some(seq.0), None, None], "the scheduled execution, then the synchronous one");
}

#[test]
fn tensor_reads_writes_and_copies_run_on_their_units_in_order() {
    let f = started(|_| {});
    let rt = &f.runtime;
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens");
    let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
    let a = rt.allocate_tensor(TensorPlacement::Device { core: 1 }, 64, "a").expect("alloc");
    let b = rt.allocate_tensor(TensorPlacement::Device { core: 1 }, 64, "b").expect("alloc");
    let tracker = rt.error_tracker_create(1).expect("tracker");
    let data: Vec<u8> = (0..64).collect();
    let write = rt.tensor_write_schedule(1, &a, 0, &data, Some(&tracker)).expect("room");
    assert_eq!((write.core(), write.xu(), write.number()), (1, Some(Xu::TensorWrite), 1));
    rt.wait_sequence(write, WAIT).expect("completes");
    let copy = rt.tensor_copy_schedule(1, &a, 16, &b, 0, 48, Some(&tracker)).expect("room");
    assert_eq!(copy.xu(), Some(Xu::TensorOp));
    rt.wait_sequence(copy, WAIT).expect("completes");
    let (read, pending) = rt.tensor_read_schedule(1, &b, 0, 64, Some(&tracker)).expect("room");
    assert_eq!(read.xu(), Some(Xu::TensorRead));
    rt.wait_sequence(read, WAIT).expect("completes");
    let mut expected = data[16..].to_vec();
    expected.resize(64, 0);
    assert_eq!(pending.take(), Some(expected), "a[16..64] copied to the start of b");
    assert_eq!(pending.take(), None, "handed over once");
    assert_eq!(rt.get_sequence(1, Xu::TensorRead).expect("held"), Some(read));
    assert!(tracker.errors().is_empty());

    let outside = rt.tensor_read_schedule(1, &b, 60, 8, None).expect_err("past the end");
    assert_eq!(outside.status, NrtStatus::Invalid, "{outside}");
    let other = rt.error_tracker_create(0).expect("tracker");
    let refused = rt.tensor_write_schedule(1, &a, 0, &[0; 4], Some(&other)).expect_err("tracker of nc0");
    assert_eq!(refused.status, NrtStatus::Invalid, "{refused}");

    let mut events = Vec::new();
    tail.poll(&reader, usize::MAX, false, &mut events);
    let tensor_events: Vec<(EventType, Phase, Option<u64>)> = events
        .iter()
        .filter_map(|e| match e {
            TraceEvent::System(e) if matches!(e.event_type, EventType::NrtTensorRead | EventType::NrtTensorWrite) => {
                Some((e.event_type, e.phase, e.nrta_seq_id))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        tensor_events,
        [
            (EventType::NrtTensorWrite, Phase::Start, Some(write.0)),
            (EventType::NrtTensorWrite, Phase::Stop, Some(write.0)),
            (EventType::NrtTensorWrite, Phase::Start, Some(copy.0)),
            (EventType::NrtTensorWrite, Phase::Stop, Some(copy.0)),
            (EventType::NrtTensorRead, Phase::Start, Some(read.0)),
            (EventType::NrtTensorRead, Phase::Stop, Some(read.0)),
        ]
    );
}
