//! The datastore read from other processes, as every tool reads it.
//!
//! Each test re-runs this test binary as its child processes, selecting what a child
//! does through `ROLE_ENV`: the workload and the readers are separate processes that
//! share nothing but the datastore file. Children report to the parent with lines
//! that start with `@`, take orders from their standard input, and exit when it closes
//! (so a failed test leaves no process behind).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Lines, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use neuron_datastore::clock::ticks;
use neuron_datastore::payload::TensorAccess;
use neuron_datastore::{ALL_SYSTEM_EVENTS, DeviceActivity, DmaQueueType, EventData, EventType, ExecOutcome, Phase};
use neuron_datastore::{DatastoreReader, ExitReason, InstructionSpan, Liveness, TailStart, TraceEvent};
use neuron_runtime::trace::PROBE_MODEL_ID;
use neuron_runtime::{ArrayType, Config, DType, Neff, Runtime, Target, TensorPlacement, TensorSet, compile_hlo};

const ROLE_ENV: &str = "NEURON_VIRT_TEST_ROLE";

/// This test binary run as one child process in `role`, for test `test`.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    role: String,
}

impl Peer {
    fn spawn(test: &str, role: &str, env: &[(&str, OsString)]) -> Peer {
        let exe = std::env::current_exe().expect("test binary path");
        let mut command = Command::new(exe);
        command
            .args([test, "--exact", "--nocapture", "--test-threads=1", "-q"])
            .env(ROLE_ENV, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("spawn a child test process");
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        Peer { child, stdin, lines, role: role.to_owned() }
    }

    /// Reads lines until the child reports `@tag …`, and returns the rest of that line.
    fn expect(&mut self, tag: &str) -> String {
        let prefix = format!("@{tag}");
        for line in &mut self.lines {
            let line = line.expect("read the child's output");
            if let Some(rest) = line.strip_prefix(&prefix) {
                return rest.trim().to_owned();
            }
        }
        let status = self.child.wait().expect("wait for the child");
        panic!("the {} process ended ({status}) without reporting @{tag}", self.role);
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{line}").expect("write to the child");
        stdin.flush().expect("flush");
    }

    /// Closes the child's input and waits for it to exit successfully.
    fn finish(mut self) {
        drop(self.stdin.take());
        for line in &mut self.lines {
            let _ = line;
        }
        let status = self.child.wait().expect("wait for the child");
        assert!(status.success(), "the {} process failed: {status}", self.role);
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// In a child: blocks until the parent sends `word` (exits quietly if it hangs up).
fn wait_for(word: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        if std::io::stdin().read_line(&mut line).expect("read orders") == 0 {
            std::process::exit(0);
        }
        if line.trim() == word {
            return;
        }
    }
}

/// In a child: reports `@tag value` to the parent.
fn report(tag: &str, value: impl std::fmt::Display) {
    println!("@{tag} {value}");
}

fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// The environment children run with: isolated lock and datastore directories, one
/// core, and `events_per_ring` slots per ring.
fn child_env(dirs: &Path, events_per_ring: u64) -> Vec<(&'static str, OsString)> {
    vec![
        ("NEURON_VIRT_LOCK_DIR", dirs.join("locks").into_os_string()),
        ("NEURON_VIRT_DATASTORE_DIR", dirs.join("datastores").into_os_string()),
        ("NEURON_RT_VISIBLE_CORES", "0".into()),
        ("NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC", events_per_ring.to_string().into()),
    ]
}

fn start_runtime() -> Runtime {
    Runtime::start(Config::from_env().expect("configuration")).expect("runtime starts")
}

const ADD_EXP: &str = include_str!("data/add_exp.hlo");

/// What the workload process does, and what the reader expects to see of it.
const EXECUTIONS: u64 = 7;
const TENSOR_WRITES: u64 = 5;
const TENSOR_READS: u64 = 3;
const TENSOR_BYTES: u64 = 16;

#[test]
fn a_reader_process_sees_exactly_what_a_workload_process_did() {
    const TEST: &str = "a_reader_process_sees_exactly_what_a_workload_process_did";
    if role().as_deref() == Some("workload") {
        return workload();
    }
    let dirs = tempfile::tempdir().expect("tempdir");
    let mut workload = Peer::spawn(TEST, "workload", &child_env(dirs.path(), 4096));
    let path = PathBuf::from(workload.expect("ready"));
    let reader = DatastoreReader::open(&path).expect("the reader opens the workload's datastore");
    assert_eq!(reader.info().pid, workload.child.id());
    assert_eq!(reader.liveness(), Liveness::Live);
    let flops_per_execution: u64 = workload.expect("flops").parse().expect("a number");
    let before = reader.snapshot();
    let mut tail = reader.tail(TailStart::Now, None, ALL_SYSTEM_EVENTS, true);

    workload.send("go");
    workload.expect("done");
    let after = reader.snapshot();
    let mut events = Vec::new();
    tail.poll(&reader, usize::MAX, false, &mut events);
    assert_eq!(tail.lost(), 0);

    // Counters: exact, and only what happened after the tail started.
    let (was, core) = (before.core(0).expect("nc0"), after.core(0).expect("nc0"));
    assert_eq!(core.executions.get(ExecOutcome::Completed) - was.executions.get(ExecOutcome::Completed), EXECUTIONS);
    assert_eq!(core.executions.total() - was.executions.total(), EXECUTIONS);
    assert_eq!(core.instructions - was.instructions, 2 * EXECUTIONS);
    assert_eq!(core.flops - was.flops, EXECUTIONS * flops_per_execution);
    for queue in [DmaQueueType::Input, DmaQueueType::Output] {
        let k = queue as usize;
        assert_eq!(core.dma_bytes[k] - was.dma_bytes[k], EXECUTIONS * TENSOR_BYTES, "{} bytes", queue.name());
    }
    let latencies: u64 = core.total_latency.iter().sum::<u64>() - was.total_latency.iter().sum::<u64>();
    assert_eq!(latencies, EXECUTIONS);
    let models = reader.models();
    assert_eq!(models.len(), 1);
    assert_eq!((models[0].name.as_str(), models[0].executions), ("add_exp", EXECUTIONS));

    // Events: the matching spans and transfers, with their sizes.
    let mut count: HashMap<(EventType, Phase), u64> = HashMap::new();
    let mut bytes: HashMap<EventType, u64> = HashMap::new();
    let mut instructions = 0;
    let mut dma: HashMap<&'static str, u64> = HashMap::new();
    for event in &events {
        match event {
            TraceEvent::System(e) => {
                *count.entry((e.event_type, e.phase)).or_default() += 1;
                // A span's start and stop both carry its size: count the stops.
                let moved = match &e.data {
                    EventData::TensorAccess { bytes, .. } | EventData::Copy { bytes, .. } => *bytes,
                    _ => 0,
                };
                if e.phase != Phase::Start {
                    *bytes.entry(e.event_type).or_default() += moved;
                }
                assert!(e.thread_id != 0, "{e:?}");
            }
            TraceEvent::Device(e) => match e.activity {
                DeviceActivity::Instruction { .. } => instructions += 1,
                DeviceActivity::Dma { queue, bytes, .. } => *dma.entry(queue.name()).or_default() += bytes,
            },
        }
    }
    let n = |t: EventType, p: Phase| count.get(&(t, p)).copied().unwrap_or(0);
    for span in [EventType::NrtExecute, EventType::KblExecPre, EventType::KblExecPost, EventType::NcExecRunning] {
        assert_eq!((n(span, Phase::Start), n(span, Phase::Stop)), (EXECUTIONS, EXECUTIONS), "{span}");
    }
    assert_eq!(n(EventType::NrtTensorWrite, Phase::Stop), TENSOR_WRITES);
    assert_eq!(n(EventType::NrtTensorRead, Phase::Stop), TENSOR_READS);
    assert_eq!(n(EventType::DmemBufCopyin, Phase::Instant), EXECUTIONS);
    assert_eq!(n(EventType::DmemBufCopyout, Phase::Instant), EXECUTIONS);
    assert_eq!(n(EventType::TimestampSyncPoint, Phase::Instant), EXECUTIONS);
    assert_eq!(bytes[&EventType::NrtTensorWrite], TENSOR_WRITES * TENSOR_BYTES);
    assert_eq!(bytes[&EventType::NrtTensorRead], TENSOR_READS * TENSOR_BYTES);
    assert_eq!(bytes[&EventType::DmemBufCopyin], EXECUTIONS * TENSOR_BYTES);
    assert_eq!(bytes[&EventType::DmemBufCopyout], EXECUTIONS * TENSOR_BYTES);
    assert_eq!(instructions, 2 * EXECUTIONS);
    assert_eq!(dma["input"], EXECUTIONS * TENSOR_BYTES);
    assert_eq!(dma["output"], EXECUTIONS * TENSOR_BYTES);

    // A clean close: the reader sees it, and the file is gone.
    workload.send("close");
    workload.finish();
    assert_eq!(reader.liveness(), Liveness::Exited(ExitReason::Closed));
    assert!(!path.exists(), "{} removed on close", path.display());
}

/// The workload process: one model, `EXECUTIONS` executions, and tensor transfers.
fn workload() {
    let rt = start_runtime();
    let neff = Neff::new("add_exp", compile_hlo(ADD_EXP, Target::Trn1).expect("compiles")).encode();
    let model = rt.load(&neff, Some(0)).expect("loads");
    let ty = ArrayType::new(DType::F32, vec![4]);
    let input = rt.allocate_tensor_for(TensorPlacement::Device { core: 0 }, &ty, "x").expect("alloc");
    let output = rt.allocate_tensor_for(TensorPlacement::Device { core: 0 }, &ty, "y").expect("alloc");
    let mut inputs = TensorSet::new();
    inputs.add("input0", input.clone());
    let mut outputs = TensorSet::new();
    outputs.add("output0", output.clone());
    report("ready", rt.datastore_path().expect("path").display());
    report("flops", model.flops_per_execution());
    wait_for("go");
    for k in 0..EXECUTIONS {
        if k < TENSOR_WRITES {
            input.write(0, &[k as u8; TENSOR_BYTES as usize]).expect("write");
        }
        rt.execute(&model, &inputs, &outputs).expect("runs");
        if k < TENSOR_READS {
            let mut back = [0u8; TENSOR_BYTES as usize];
            output.read(0, &mut back).expect("read");
        }
    }
    report("done", "");
    wait_for("close");
    rt.close().expect("closes");
}

/// Events the stress test produces: system events from two threads into one ring,
/// device events from one (under the core's lock, as the backend records them).
const STRESS_SYSTEM_PER_THREAD: u64 = 3_000_000;
const STRESS_DEVICE: u64 = 4_000_000;
const STRESS_RING: u64 = 1024;
const STRESS_READERS: usize = 3;

#[test]
fn three_reader_processes_account_for_every_event_of_a_fast_writer() {
    const TEST: &str = "three_reader_processes_account_for_every_event_of_a_fast_writer";
    match role().as_deref() {
        Some("writer") => return stress_writer(),
        Some("reader") => return stress_reader(),
        _ => {}
    }
    let dirs = tempfile::tempdir().expect("tempdir");
    let env = child_env(dirs.path(), STRESS_RING);
    let mut writer = Peer::spawn(TEST, "writer", &env);
    let path = writer.expect("ready");
    let mut reader_env = env.clone();
    reader_env.push(("STRESS_DATASTORE", path.into()));
    let mut readers: Vec<Peer> = (0..STRESS_READERS).map(|_| Peer::spawn(TEST, "reader", &reader_env)).collect();
    for reader in &mut readers {
        reader.expect("ready");
    }
    writer.send("go");
    let produced: Vec<u64> = writer.expect("produced").split(' ').map(|n| n.parse().expect("count")).collect();
    assert_eq!(produced, [2 * STRESS_SYSTEM_PER_THREAD, STRESS_DEVICE], "the rings' heads");
    writer.send("close");
    writer.finish();

    for (k, mut reader) in readers.into_iter().enumerate() {
        for ring in ["system", "device"] {
            let line = reader.expect(ring);
            let [delivered, lost, bad]: [u64; 3] = line
                .split(' ')
                .map(|n| n.parse().expect("count"))
                .collect::<Vec<_>>()
                .try_into()
                .expect("three counts");
            let expected = if ring == "system" { produced[0] } else { produced[1] };
            eprintln!("reader {k}, {ring} ring: {delivered} delivered + {lost} lost of {expected}");
            assert_eq!(bad, 0, "reader {k} received corrupt {ring} records");
            assert_eq!(delivered + lost, expected, "reader {k}, {ring} ring: delivered + lost = produced");
            assert!(delivered >= STRESS_RING, "reader {k} read at least the last ring-full");
        }
        reader.finish();
    }
}

/// The payload words a stress event with sequence number `seq` carries, so that a
/// reader can tell a record put together from two different events.
fn stress_words(seq: u64) -> (u64, u64) {
    let mixed = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
    (mixed, !seq ^ mixed)
}

fn stress_writer() {
    let rt = start_runtime();
    report("ready", rt.datastore_path().expect("path").display());
    wait_for("go");
    std::thread::scope(|scope| {
        for thread in 0..2u64 {
            let probe = rt.trace_probe(0).expect("probe");
            scope.spawn(move || {
                for k in 0..STRESS_SYSTEM_PER_THREAD {
                    let seq = 1 + 2 * k + thread;
                    let (offset, bytes) = stress_words(seq);
                    probe.system(
                        EventType::NrtTensorRead,
                        seq,
                        TensorAccess { tensor_id: seq, tensor_name: 0, offset, bytes },
                    );
                }
            });
        }
        let probe = rt.trace_probe(0).expect("probe");
        scope.spawn(move || {
            // Device events alternate between one full record (event number n, its
            // execution id n + 1) and runs of 2 to 40 instructions of the probe's
            // program, many records long (execution id: the run's first event number
            // plus one; instruction k has k FLOPs).
            probe.with_device(|device| {
                let (mut produced, mut length) = (0u64, 1u64);
                let mut spans = Vec::new();
                while produced < STRESS_DEVICE {
                    let now = ticks();
                    let n = if length % 2 == 1 {
                        let seq = produced + 1;
                        device.instruction(seq, stress_words(seq).0, now, now);
                        1
                    } else {
                        let n = length.min(STRESS_DEVICE - produced);
                        spans.clear();
                        spans.extend((0..n).map(|k| InstructionSpan {
                            entry: k as u32,
                            start: now + 10 * k,
                            end: now + 10 * (k + 1),
                        }));
                        device.run(produced + 1, &spans);
                        n
                    };
                    produced += n;
                    length = length % 40 + 1;
                }
            })
        });
    });
    let reader = DatastoreReader::open(&rt.datastore_path().expect("path")).expect("opens its own datastore");
    let rings = reader.snapshot().rings;
    let head = |device: bool| {
        rings.iter().find(|r| r.core == Some(0) && r.device == device).map(|r| r.produced).expect("nc0 ring")
    };
    report("produced", format!("{} {}", head(false), head(true)));
    wait_for("close");
    rt.close().expect("closes");
}

fn stress_reader() {
    let path = PathBuf::from(std::env::var_os("STRESS_DATASTORE").expect("the datastore path"));
    let reader = DatastoreReader::open(&path).expect("opens");
    let mut tail = reader.tail(TailStart::Oldest, Some(&[0]), EventType::NrtTensorRead.bit(), true);
    report("ready", "");
    let (mut bad_system, mut bad_device) = (0u64, 0u64);
    let (mut last_system_id, mut last_device) = (None::<u64>, None::<u64>);
    let mut events = Vec::with_capacity(8192);
    loop {
        let done = matches!(reader.liveness(), Liveness::Exited(_));
        events.clear();
        tail.poll(&reader, 4096, done, &mut events);
        for event in &events {
            match event {
                TraceEvent::System(e) => {
                    let good = match e.data {
                        EventData::TensorAccess { tensor_id, offset, bytes, .. } => {
                            e.event_type == EventType::NrtTensorRead
                                && e.tracking_id == tensor_id
                                && (offset, bytes) == stress_words(tensor_id)
                        }
                        _ => false,
                    };
                    let ordered = last_system_id.is_none_or(|last| e.id > last);
                    last_system_id = Some(e.id);
                    bad_system += u64::from(!good || !ordered);
                }
                TraceEvent::Device(e) => {
                    // One producer: event numbers follow its sequence (see the writer).
                    let seq = e.exec_id.unwrap_or(0);
                    let good = match e.activity {
                        DeviceActivity::Instruction { flops, step, .. } if e.model_id == PROBE_MODEL_ID => {
                            u64::from(step) == flops && seq + flops == e.id + 1
                        }
                        DeviceActivity::Instruction { flops, .. } => flops == stress_words(seq).0 && seq == e.id + 1,
                        DeviceActivity::Dma { .. } => false,
                    } && last_device.is_none_or(|last| e.id > last)
                        && e.start_ns <= e.end_ns;
                    last_device = Some(e.id);
                    bad_device += u64::from(!good);
                }
            }
        }
        if done {
            break;
        }
        if events.is_empty() {
            std::thread::yield_now();
        }
    }
    for (_, device, cursor) in tail.cursors() {
        let bad = if device { bad_device } else { bad_system };
        report(if device { "device" } else { "system" }, format!("{} {} {bad}", cursor.delivered, cursor.lost));
    }
    wait_for("exit");
}
