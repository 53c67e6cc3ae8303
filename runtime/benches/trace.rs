//! What tracing costs, each figure against a baseline measured in the same run:
//!
//! - `emit`: one event through the runtime's emit path (a disabled kind, an enabled
//!   system event, an enabled device instruction event) against an empty loop, beside
//!   the floor any timestamped event in a shared ring has (a clock read and an atomic
//!   claim);
//! - `readers`: a producer's event rate with no reader against three reader processes
//!   tailing its ring, one, and three processes that only spin (a control); and how
//!   fast a reader process drains a ring (transport only, and decoded into events);
//! - `overhead`: executions of the attention example and of a model of 240 tiny
//!   element-wise operations with every ring off against system + device rings on,
//!   alternating.
//!
//! Run: `cargo bench -p neuron-runtime --bench trace [-- emit|readers|overhead]` (all
//! parts by default). Results go in BENCHMARKS.md.

use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use neuron_datastore::clock::ticks;
use neuron_datastore::payload::TensorAccess;
use neuron_datastore::{ALL_SYSTEM_EVENTS, EventType, InstructionSpan};
use neuron_datastore::{DatastoreReader, TailStart, TraceEvent};
use neuron_runtime::config::CoreRequest;
use neuron_runtime::trace::TraceProbe;
use neuron_runtime::{Config, CoreSet, Model, Neff, Runtime, Target, TensorPlacement, TensorSet, compile_hlo};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Set in the reader processes this benchmark starts (to the datastore path).
const READER_ENV: &str = "NEURON_VIRT_BENCH_READER";
/// How a reader process reads: `tail` (follow the producer), `skim` or `decode`
/// (drain what the ring holds, timed).
const READER_MODE_ENV: &str = "NEURON_VIRT_BENCH_READER_MODE";
/// The CPU a reader process pins itself to (unset: not pinned). Passed explicitly
/// because a child inherits the producer's pinning to its own CPU.
const READER_CPU_ENV: &str = "NEURON_VIRT_BENCH_READER_CPU";

/// Events per timed batch in `emit`, and batches per variant.
const EMIT_BATCH: u64 = 1000;
const EMIT_BATCHES: usize = 20_000;
/// Instructions per execution in the device instruction variant (the tiny-operations
/// model has 241).
const RUN_LENGTH: usize = 256;
/// Events per producer burst in `readers`, and bursts per variant.
const BURST: u64 = 20_000_000;
const BURST_ROUNDS: usize = 5;
const READERS: usize = 3;
const READER_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);
/// Executions per timed sample in `overhead`, and samples per side.
const OVERHEAD_ROUNDS: usize = 40;

fn main() {
    if let Some(path) = std::env::var_os(READER_ENV) {
        return reader_process(Path::new(&path));
    }
    let part = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wants = |name: &str| part.as_deref().is_none_or(|p| p == name);
    let dirs = tempfile::tempdir().expect("tempdir");
    if wants("emit") {
        emit(dirs.path());
    }
    if wants("readers") {
        readers(dirs.path());
    }
    if wants("overhead") {
        overhead(dirs.path());
    }
}

/// A runtime on nc0 recording the system event types in `event_types`, with rings of
/// `events_per_ring` events (`None`: as configured by
/// `NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC`). Its datastore goes where any
/// runtime's goes (the default directory is on tmpfs; see `NEURON_VIRT_DATASTORE_DIR`).
fn runtime_with(dirs: &Path, event_types: u64, events_per_ring: Option<u64>) -> Runtime {
    let mut config = Config {
        lock_dir: dirs.join("locks"),
        cores: CoreRequest::Visible(CoreSet::range(0, 0)),
        ..Config::from_env().expect("configuration")
    };
    config.inspect.event_types = event_types;
    if let Some(events) = events_per_ring {
        config.inspect.max_events_per_nc = events;
    }
    Runtime::start(config).expect("runtime")
}

/// The payload of the system events the benchmark emits: a 64-byte access of tensor `i`.
#[inline(always)]
fn access(i: u64) -> TensorAccess {
    TensorAccess { tensor_id: i, tensor_name: 0, offset: 0, bytes: 64 }
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Dependent arithmetic standing for the work a runtime thread does between two
/// events (about 40 ns here); the spaced emit measurements add it to both sides.
#[inline(always)]
fn work(mut v: u64) -> u64 {
    for _ in 0..WORK_STEPS {
        v = v.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(7);
    }
    v
}
const WORK_STEPS: usize = 32;

fn emit(dirs: &Path) {
    println!("emit cost per event: median of {EMIT_BATCHES} batches of {EMIT_BATCH} events, all variants interleaved");
    println!("  back to back: events emitted in a tight loop, against an empty loop (throughput, worst case);");
    println!(
        "  spaced: each event after ~{WORK_STEPS} dependent multiply-rotates of other work, against that work alone"
    );
    for events_per_ring in
        [4096, neuron_datastore::DEFAULT_MAX_EVENTS_PER_NC, neuron_datastore::INSPECT_MAX_EVENTS_PER_NC]
    {
        emit_with_ring(dirs, events_per_ring);
    }
}

fn emit_with_ring(dirs: &Path, events_per_ring: u64) {
    // Every type recorded but `nrt_tensor_write`: the disabled kind.
    let rt = runtime_with(dirs, ALL_SYSTEM_EVENTS & !EventType::NrtTensorWrite.bit(), Some(events_per_ring));
    let probe = rt.trace_probe(0).expect("probe");
    let time_batch = |samples: &mut Vec<f64>, f: &mut dyn FnMut(u64) -> u64| {
        let mut v = 1;
        let start = Instant::now();
        for i in 0..EMIT_BATCH {
            v = f(black_box(i) ^ v);
        }
        samples.push(start.elapsed().as_nanos() as f64 / EMIT_BATCH as f64);
        black_box(v);
    };
    let variants = [
        "baseline",
        "disabled kind",
        "enabled system",
        "enabled device instruction",
        "device, a record each",
        "clock read alone",
        "floor: clock + atomic claim",
    ];
    // What any timestamped event in a ring shared by threads needs at least: a clock
    // read and one atomic increment to claim its slot (no record written).
    let claims = std::sync::atomic::AtomicU64::new(0);
    // Instructions are recorded as the runtime records them: each one's span (entry,
    // start and end tick) kept while the program runs, and run records written when it
    // stops, here every RUN_LENGTH instructions.
    // Their ticks advance by 100 per instruction (read from the clock by the backend
    // anyway, so not counted here).
    let mut spans = Vec::with_capacity(RUN_LENGTH);
    let mut tick = ticks();
    let mut tight: Vec<Vec<f64>> = variants.iter().map(|_| Vec::with_capacity(EMIT_BATCHES)).collect();
    let mut spaced: Vec<Vec<f64>> = variants.iter().map(|_| Vec::with_capacity(EMIT_BATCHES)).collect();
    probe.with_device(|dev| {
        for _ in 0..EMIT_BATCHES {
            for (samples, space) in [(&mut tight, false), (&mut spaced, true)] {
                let w = |v: u64| if space { work(v) } else { v };
                time_batch(&mut samples[0], &mut |i| w(i));
                time_batch(&mut samples[1], &mut |i| {
                    let v = w(i);
                    probe.system(EventType::NrtTensorWrite, v, access(i));
                    v
                });
                time_batch(&mut samples[2], &mut |i| {
                    let v = w(i);
                    probe.system(EventType::NrtTensorRead, v, access(i));
                    v
                });
                time_batch(&mut samples[3], &mut |i| {
                    let v = w(i);
                    tick += 100;
                    spans.push(InstructionSpan { entry: spans.len() as u32, start: tick - 100, end: tick });
                    if spans.len() == RUN_LENGTH {
                        dev.run(v, &spans);
                        spans.clear();
                    }
                    v
                });
                time_batch(&mut samples[4], &mut |i| {
                    let v = w(i);
                    dev.instruction(v, 2 * i, i, i + 1);
                    v
                });
                time_batch(&mut samples[5], &mut |i| {
                    // As an event reads it: the work does not wait for the value.
                    black_box(ticks());
                    w(i)
                });
                time_batch(&mut samples[6], &mut |i| {
                    let v = w(i);
                    black_box(ticks());
                    black_box(claims.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
                    v
                });
            }
        }
    });
    println!(
        "ring of {events_per_ring} events ({:.1} MiB per ring):",
        (events_per_ring * 128) as f64 / f64::from(1 << 20)
    );
    println!("  {:<28} {:>9} {:>9} {:>7}   {:>9} {:>9} {:>7}", "", "tight", "cost", "ratio", "spaced", "cost", "ratio");
    let medians = |samples: Vec<Vec<f64>>| samples.into_iter().map(median).collect::<Vec<f64>>();
    let (tight, spaced) = (medians(tight), medians(spaced));
    for (k, name) in variants.iter().enumerate() {
        println!(
            "  {name:<28} {:>9.2} {:>9.2} {:>7.2}   {:>9.2} {:>9.2} {:>7.2}",
            tight[k],
            tight[k] - tight[0],
            tight[k] / tight[0],
            spaced[k],
            spaced[k] - spaced[0],
            spaced[k] / spaced[0]
        );
    }
    println!("  (ns per event; cost = above the baseline; ratio = to the baseline)");
    rt.close().expect("close");
}

/// The CPUs the calling thread may run on.
fn allowed_cpus() -> Vec<usize> {
    use nix::sched::{CpuSet, sched_getaffinity};
    let Ok(allowed) = sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).collect()
}

/// Pins the calling thread (and what it starts afterwards) to `cpu`; returns the CPUs
/// it was allowed before, to restore with [`unpin`], or `None` if it could not.
fn pin_to(cpu: usize) -> Option<nix::sched::CpuSet> {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let allowed = sched_getaffinity(Pid::from_raw(0)).ok()?;
    let mut set = CpuSet::new();
    set.set(cpu).ok()?;
    sched_setaffinity(Pid::from_raw(0), &set).ok()?;
    Some(allowed)
}

fn unpin(allowed: Option<nix::sched::CpuSet>) {
    if let Some(set) = allowed {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// A reader process started by `readers`.
struct ReaderProcess {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl ReaderProcess {
    fn spawn(path: &Path, mode: &str, cpu: Option<usize>) -> ReaderProcess {
        let mut command = Command::new(std::env::current_exe().expect("benchmark binary"));
        if let Some(cpu) = cpu {
            command.env(READER_CPU_ENV, cpu.to_string());
        }
        let mut child = command
            .env(READER_ENV, path)
            .env(READER_MODE_ENV, mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a reader process");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let ready = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(ready, "ready", "the reader process did not start");
        ReaderProcess { child, lines }
    }

    /// Tells it to stop and returns its report line.
    fn finish(mut self) -> String {
        drop(self.child.stdin.take());
        let report = self.lines.next().and_then(Result::ok).unwrap_or_default();
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "reader process failed: {status}");
        report
    }
}

/// A reader process: reads the nc0 system ring of the datastore at `path`.
fn reader_process(path: &Path) {
    if let Some(cpu) = std::env::var(READER_CPU_ENV).ok().and_then(|c| c.parse().ok()) {
        pin_to(cpu).unwrap_or_else(|| panic!("cannot pin a reader process to CPU {cpu}"));
    }
    let reader = DatastoreReader::open(path).expect("open the datastore");
    let mode = std::env::var(READER_MODE_ENV).unwrap_or_default();
    let types = EventType::NrtTensorRead.bit();
    let mut out = std::io::stdout();
    if mode == "tail" || mode == "spin" {
        // Run until told to stop (stdin closes).
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_line(&mut String::new());
            watcher.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let mut tail = reader.tail(TailStart::Now, Some(&[0]), types, false);
        writeln!(out, "ready").and_then(|()| out.flush()).expect("report");
        let mut spun = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if mode == "spin" {
                // Keep a CPU busy without touching the ring or much memory.
                spun = black_box(work(spun));
            } else if tail.skim(&reader, 4096, false) < 4096 {
                // Follow the producer as the tools do: drain what is there, and when
                // caught up, sleep a poll interval instead of spinning on the head.
                std::thread::sleep(READER_POLL_INTERVAL);
            }
        }
        let cpu = nix::sched::sched_getcpu().map_or(-1, |c| c as i64);
        writeln!(out, "{} {} {cpu}", tail.delivered(), tail.lost()).expect("report");
        return;
    }
    // Drain what the ring holds (the producer is idle), timed.
    writeln!(out, "ready").and_then(|()| out.flush()).expect("report");
    let mut tail = reader.tail(TailStart::Oldest, Some(&[0]), types, false);
    let mut events: Vec<TraceEvent> = Vec::with_capacity(4096);
    let start = Instant::now();
    loop {
        let read = if mode == "skim" {
            tail.skim(&reader, 4096, true)
        } else {
            events.clear();
            let before = tail.delivered();
            tail.poll(&reader, 4096, true, &mut events);
            black_box(&events);
            tail.delivered() - before
        };
        if read == 0 {
            break;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let _ = std::io::stdin().read_line(&mut String::new());
    writeln!(out, "{} {} {seconds}", tail.delivered(), tail.lost()).expect("report");
}

/// One burst of `BURST` system events from one thread; returns events per second.
fn burst(probe: &TraceProbe) -> f64 {
    let start = Instant::now();
    for i in 0..BURST {
        probe.system(EventType::NrtTensorRead, i, access(i));
    }
    BURST as f64 / start.elapsed().as_secs_f64()
}

fn readers(dirs: &Path) {
    let rt = runtime_with(dirs, ALL_SYSTEM_EVENTS, Some(neuron_datastore::INSPECT_MAX_EVENTS_PER_NC));
    let events_per_ring = rt.config().inspect.max_events_per_nc;
    let path: PathBuf = rt.datastore_path().expect("path");
    let probe = rt.trace_probe(0).expect("probe");
    // The producer on one CPU and the readers on another, when there are two.
    let (pinned, reader_cpu) = match allowed_cpus()[..] {
        [producer_cpu, reader_cpu, ..] => match pin_to(producer_cpu) {
            Some(allowed) => (Some(allowed), Some(reader_cpu)),
            None => (None, None),
        },
        _ => (None, None),
    };
    burst(&probe);
    let (mut alone, mut watched, mut watched_by_one, mut beside_spinners) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut reader_reports, mut one_reader_reports) = (Vec::new(), Vec::new());
    let with_processes = |mode: &str, count: usize| -> (f64, Vec<String>) {
        let processes: Vec<ReaderProcess> = (0..count).map(|_| ReaderProcess::spawn(&path, mode, reader_cpu)).collect();
        let rate = burst(&probe);
        (rate, processes.into_iter().map(ReaderProcess::finish).collect())
    };
    for _ in 0..BURST_ROUNDS {
        alone.push(burst(&probe));
        let (rate, reports) = with_processes("tail", READERS);
        watched.push(rate);
        reader_reports.extend(reports);
        let (rate, reports) = with_processes("tail", 1);
        watched_by_one.push(rate);
        one_reader_reports.extend(reports);
        beside_spinners.push(with_processes("spin", READERS).0);
    }
    let (alone, watched, watched_by_one, beside_spinners) =
        (median(alone), median(watched), median(watched_by_one), median(beside_spinners));
    println!(
        "producer: bursts of {BURST} system events on one thread into a ring of {events_per_ring}, median of {BURST_ROUNDS}, alternating"
    );
    let mut reader_cpus: Vec<&str> = reader_reports.iter().filter_map(|r| r.split(' ').nth(2)).collect();
    reader_cpus.sort_unstable();
    reader_cpus.dedup();
    match reader_cpu {
        Some(cpu) => println!(
            "  producer pinned to CPU {}, readers to CPU {cpu} (readers last ran on CPU {})",
            nix::sched::sched_getcpu().map_or(-1, |c| c as i64),
            reader_cpus.join(", ")
        ),
        None => println!("  not pinned (one CPU available, or pinning refused): producer and readers share the CPUs"),
    }
    println!(
        "  readers tail the ring with `Tail::skim`, sleeping {} ms whenever they have caught up",
        READER_POLL_INTERVAL.as_millis()
    );
    println!("  no reader:               {:>7.1} M events/s", alone / 1e6);
    let read_share = |reports: &[String]| {
        let (mut delivered, mut lost) = (0u64, 0u64);
        for report in reports {
            let counts: Vec<u64> = report.split(' ').filter_map(|n| n.parse().ok()).collect();
            delivered += counts.first().copied().unwrap_or(0);
            lost += counts.get(1).copied().unwrap_or(0);
        }
        100.0 * delivered as f64 / (delivered + lost).max(1) as f64
    };
    for (label, rate, reports) in [
        (format!("{READERS} reader processes:"), watched, &reader_reports),
        ("1 reader process:".to_string(), watched_by_one, &one_reader_reports),
    ] {
        println!(
            "  {label:<24} {:>7.1} M events/s   ratio {:.3} (slowdown {:.1}%); each reader read {:.1}% of the events, the rest overwritten first",
            rate / 1e6,
            rate / alone,
            (1.0 - rate / alone) * 100.0,
            read_share(reports)
        );
    }
    println!(
        "  control, {READERS} processes spinning on the readers' CPU without reading: {:.1} M events/s   ratio {:.3}",
        beside_spinners / 1e6,
        beside_spinners / alone,
    );

    // The ring now holds its last full capacity of events; drain it from a reader process.
    println!("reader drain rate (a reader process, the ring full and the producer idle, median of 3):");
    for mode in ["skim", "decode"] {
        let mut samples = Vec::new();
        for _ in 0..3 {
            let report = ReaderProcess::spawn(&path, mode, reader_cpu).finish();
            let fields: Vec<f64> = report.split(' ').filter_map(|n| n.parse().ok()).collect();
            samples.push(fields[0] / fields[2]);
        }
        let rate = median(samples);
        let what = if mode == "skim" { "transport and check only" } else { "decoded into events" };
        println!("  {mode:<6} ({what}): {:>7.1} M events/s   ratio to producer {:.2}", rate / 1e6, rate / alone);
    }
    rt.close().expect("close");
    unpin(pinned);
}

/// A model of `ops` element-wise operations on `f32[16]`, chained.
fn tiny_ops_hlo(ops: usize) -> String {
    let cycle = ["add", "maximum", "subtract", "minimum", "negate", "tanh", "multiply", "abs"];
    let mut hlo =
        String::from("HloModule tiny_ops\nENTRY main {\n  p = f32[16] parameter(0)\n  v0 = f32[16] tanh(p)\n");
    for k in 1..=ops {
        let op = cycle[k % cycle.len()];
        let operands = match op {
            "negate" | "tanh" | "abs" => format!("v{}", k - 1),
            _ => format!("v{}, p", k - 1),
        };
        let root = if k == ops { "ROOT " } else { "" };
        hlo.push_str(&format!("  {root}v{k} = f32[16] {op}({operands})\n"));
    }
    hlo.push_str("}\n");
    hlo
}

/// Loads `hlo` and binds device tensors to every input and output.
fn bound(rt: &Runtime, name: &str, hlo: &str) -> (Model, TensorSet, TensorSet) {
    let neff = Neff::new(name, compile_hlo(hlo, Target::Trn1).expect("compiles")).encode();
    let model = rt.load(&neff, Some(0)).expect("loads");
    let placement = TensorPlacement::Device { core: 0 };
    let mut sets = (TensorSet::new(), TensorSet::new());
    for (ios, set) in [(model.inputs(), &mut sets.0), (model.outputs(), &mut sets.1)] {
        for io in ios {
            let tensor = rt.allocate_tensor_for(placement, model.tensor_type(io), &io.name).expect("alloc");
            // Small normal values (every bound tensor here is f32).
            let values: Vec<u8> =
                (0..tensor.size() / 4).flat_map(|k| (0.01 * (k % 97) as f32 - 0.4).to_le_bytes()).collect();
            tensor.write(0, &values).expect("write");
            set.add(&io.name, tensor);
        }
    }
    (model, sets.0, sets.1)
}

fn overhead(dirs: &Path) {
    let rt = runtime_with(dirs, ALL_SYSTEM_EVENTS, None);
    let attention = include_str!("../../examples/attention.hlo");
    let tiny = tiny_ops_hlo(240);
    println!("profiling overhead: executions with every ring off (A) and system + device rings on (B), alternating");
    println!("{:<22} {:>7} {:>12} {:>12} {:>9} {:>10}", "model", "instrs", "A median", "B median", "ratio", "overhead");
    for (name, hlo, per_sample) in [("attention", attention, 5), ("tiny_ops (240 ops)", tiny.as_str(), 200)] {
        let (model, inputs, outputs) = bound(&rt, name.split(' ').next().unwrap_or(name), hlo);
        let sample = |on: bool| {
            rt.set_trace_recording(on).expect("switch rings");
            let start = Instant::now();
            for _ in 0..per_sample {
                rt.execute(&model, &inputs, &outputs).expect("runs");
            }
            start.elapsed().as_secs_f64() / per_sample as f64
        };
        sample(false);
        sample(true);
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for round in 0..OVERHEAD_ROUNDS {
            // ABBA order, so that neither side always runs first.
            let first_on = round % 2 == 1;
            let a = sample(first_on);
            let b = sample(!first_on);
            let (x, y) = if first_on { (b, a) } else { (a, b) };
            off.push(x);
            on.push(y);
        }
        let (off, on) = (median(off), median(on));
        println!(
            "{name:<22} {:>7} {:>10.2}µs {:>10.2}µs {:>9.4} {:>9.2}%",
            model.program().instructions().count(),
            off * 1e6,
            on * 1e6,
            on / off,
            (on / off - 1.0) * 100.0
        );
        rt.unload(&model).expect("unload");
    }
    rt.set_trace_recording(true).expect("switch rings");
    rt.close().expect("close");
}
