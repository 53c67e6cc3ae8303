//! `neuron-bench`: runs models on virtual NeuronCores and reports throughput and latency.

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use neuron_datastore::DatastoreReader;
use neuron_datastore::config::{parse_duration, parse_listen_address};
use neuron_profiler::stats::{LatencyHistogram, LatencySummary, format_seconds};
use neuron_profiler::{
    InputFill, bind_tensors, init_logging, load_model_bytes, model_name, npy, read_inputs, si, target_for, thousands,
};
use neuron_runtime::config::{Config, ENV_VISIBLE_CORES};
use neuron_runtime::isa::Program;
use neuron_runtime::neff::DecodeOptions;
use neuron_runtime::{
    ArrayType, CompletionHandle, DType, DTypeClass, ErrorTracker, Model, Neff, NrtError, NrtStatus, Runtime, SeqId,
    TensorSet, TrackedError, Xu, compile_hlo,
};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

// mimalloc keeps freed buffers for reuse; glibc's allocator returns large ones to the
// kernel and faults them back in at every execution, which costs more than small models.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "neuron-bench",
    version,
    about = "Run models on virtual NeuronCores and measure throughput and latency",
    long_about = "Run models on virtual NeuronCores and measure throughput and latency.\n\n\
        Cores are reserved exclusively for this process, host-wide: a core another process \
        holds is refused at once. Runtime settings come from the NEURON_RT_* environment \
        variables (see the README); --cores overrides NEURON_RT_VISIBLE_CORES."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one model repeatedly, one copy per core, and report latency percentiles.
    ///
    /// A model with collectives (HLO all-reduce, all-gather, reduce-scatter, all-to-all)
    /// is loaded as one rank per core, and the ranks run together.
    ///
    /// A failed execution is reported on stderr (and in --json) and the run goes on; the
    /// exit status is 1 if any execution failed.
    Exec(ExecArgs),
    /// Run the bundled example models (an MLP and an attention block) on every core until Ctrl-C.
    Demo(DemoArgs),
}

#[derive(Args)]
struct ExecArgs {
    /// A NEFF, or HLO text (compiled on the fly for this instance's NeuronCore version).
    model: PathBuf,
    /// Cores to run on, one copy of the model each: `0`, `0-1` or `0,2` (default: NEURON_RT_VISIBLE_CORES, else all).
    #[arg(long)]
    cores: Option<String>,
    /// Executions per core [default: 100].
    #[arg(long, conflicts_with = "duration")]
    iterations: Option<u64>,
    /// Run for this long instead of a number of iterations: `10s`, `500ms`, `2m`.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Executions per core run first and left out of every figure printed: the first
    /// executions of a process pay for memory touched for the first time (the trace
    /// rings' pages, the kernels' buffers).
    #[arg(long, value_name = "N", default_value_t = 0)]
    warmup: u64,
    /// An input from a .npy file, by index, name (`input0`) or HLO parameter name; zero-filled otherwise.
    #[arg(long = "input", value_name = "NAME_OR_INDEX=PATH.npy")]
    inputs: Vec<String>,
    /// Write the outputs of the last execution (first core) to DIR/output0.npy, output1.npy, ...
    #[arg(long, value_name = "DIR")]
    save_outputs: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// `sync`: one thread per core, each execution waited for before the next.
    /// `async`: one thread schedules on every core's execution unit and keeps --inflight
    /// requests queued per core, woken by the units' completion descriptors; latency then
    /// includes the time a request waits behind earlier ones, and device latency is not
    /// reported per request.
    #[arg(long, value_enum, default_value_t = ExecMode::Sync)]
    exec_mode: ExecMode,
    /// Requests kept queued per core in async mode (at most
    /// NEURON_RT_XU_COMPUTE_MAX_QUEUED_REQUESTS, default 8).
    #[arg(long, value_name = "K", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    inflight: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ExecMode {
    Sync,
    Async,
}

#[derive(Args)]
struct DemoArgs {
    /// Stop after this long instead of waiting for Ctrl-C: `30s`, `5m`.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Where the web dashboard of the demo listens: HOST:PORT, or a PORT on 127.0.0.1.
    /// When the port is taken, another free one is used.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3001", value_parser = parse_listen_address)]
    listen: std::net::SocketAddr,
    /// NTFF profiles the dashboard's profile viewer lists.
    #[arg(long, value_name = "DIR")]
    profiles: Option<PathBuf>,
    /// Run without the web dashboard.
    #[arg(long)]
    no_dashboard: bool,
}

/// Executions per core when neither --iterations nor --duration is given.
const DEFAULT_ITERATIONS: u64 = 100;

const DEMO_MODELS: [(&str, &str); 2] = [
    ("mlp", include_str!("../../../examples/mlp.hlo")),
    ("attention", include_str!("../../../examples/attention.hlo")),
];

fn main() -> ExitCode {
    neuron_profiler::exit_quietly_on_closed_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Exec(args) => exec(args),
        Command::Demo(args) => demo(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime configuration from the environment, with `--cores` in place of
/// `NEURON_RT_VISIBLE_CORES` when given.
fn runtime_config(cores: Option<&str>) -> Result<Config> {
    let config = Config::from_lookup(|name| match (name, cores) {
        (ENV_VISIBLE_CORES, Some(cores)) => Some(cores.to_owned()),
        _ => std::env::var(name).ok(),
    });
    config.map_err(|e| match cores {
        Some(cores) => anyhow!("--cores {cores}: {e}"),
        None => anyhow!(e),
    })
}

/// One loaded copy of a model with its bound tensors.
struct Replica {
    model: Model,
    inputs: TensorSet,
    outputs: TensorSet,
}

impl Replica {
    fn new(runtime: &Runtime, neff: &[u8], core: u32, fill: &mut InputFill<'_>) -> Result<Replica> {
        Replica::bind(runtime, runtime.load(neff, Some(core))?, fill)
    }

    fn bind(runtime: &Runtime, model: Model, fill: &mut InputFill<'_>) -> Result<Replica> {
        let (inputs, outputs) = bind_tensors(runtime, &model, fill)?;
        Ok(Replica { model, inputs, outputs })
    }
}

/// The bytes of inputs given with `--input`, by model input index, checked against the model.
fn parse_inputs(specs: &[String], program: &Program) -> Result<Vec<Option<Vec<u8>>>> {
    let pairs = specs
        .iter()
        .map(|spec| spec.split_once('=').ok_or_else(|| anyhow!("--input {spec}: expected NAME_OR_INDEX=PATH.npy")))
        .collect::<Result<Vec<_>>>()?;
    read_inputs(&pairs, program)
}

/// The failed executions one core keeps individually; later ones are only counted.
const MAX_LISTED_FAILURES: usize = 10_000;
/// The failures per core printed as they happen; later ones are only counted.
const MAX_PRINTED_FAILURES: usize = 100;

/// What the worker of one core measured.
#[derive(Default)]
struct CoreResult {
    /// Executions attempted, failed ones included.
    executions: u64,
    numerical_errors: u64,
    /// Latencies of the executions that succeeded.
    total: LatencyHistogram,
    device: LatencyHistogram,
    /// (1-based execution number, status code) of the first `MAX_LISTED_FAILURES` failures.
    failures: Vec<(u64, u32)>,
    /// Every failure by status: (status, count, first message).
    by_status: Vec<(NrtStatus, u64, String)>,
    /// The execution each status first failed.
    first_of_status: Vec<(NrtStatus, u64)>,
}

impl CoreResult {
    /// Records that execution number `execution` (from 1) failed.
    fn failed(&mut self, core: u32, execution: u64, error: NrtError) {
        let failed: u64 = self.by_status.iter().map(|(_, n, _)| n).sum();
        let first = self.first_of_status.iter().find(|(s, _)| *s == error.status).map(|&(_, e)| e);
        let repeats = self.by_status.iter().find(|(s, ..)| *s == error.status).map_or(0, |(_, n, _)| *n);
        if (failed as usize) < MAX_PRINTED_FAILURES {
            // A status's first failure in full; its later ones point at it, once.
            match first {
                None => eprintln!("  nc{core} execution {execution} failed: {error}"),
                Some(first) if repeats == 1 => eprintln!(
                    "  nc{core} execution {execution} failed with {} as execution {first} did (above): \
                     later ones of that status are counted, not printed",
                    error.status
                ),
                Some(_) => {}
            }
            if failed as usize + 1 == MAX_PRINTED_FAILURES {
                eprintln!("  (further failures on nc{core} are counted, not printed)");
            }
        }
        if first.is_none() {
            self.first_of_status.push((error.status, execution));
        }
        if self.failures.len() < MAX_LISTED_FAILURES {
            self.failures.push((execution, error.code()));
        }
        match self.by_status.iter_mut().find(|(s, ..)| *s == error.status) {
            Some((_, n, _)) => *n += 1,
            None => self.by_status.push((error.status, 1, error.message)),
        }
    }

    fn failed_count(&self) -> u64 {
        self.by_status.iter().map(|(_, n, _)| n).sum()
    }
}

/// Loads a collectives program as one rank per core: the ranks of this process alone,
/// or, in a job of several processes with rank 0's address set, this process's ranks of
/// the job (in process order, see `Launch::ranks`).
fn load_ranks(runtime: &Runtime, neff: &[u8], cores: &[u32], timed: bool) -> Result<Vec<Model>> {
    let config = runtime.config();
    let Some(launch) = config.launch.as_ref().filter(|l| l.processes > 1 && config.root_comm.is_some()) else {
        return Ok(runtime.load_collectives(neff, cores)?);
    };
    if timed {
        bail!("--duration would stop the processes of the job at different executions; use --iterations");
    }
    let (ranks, world) = launch.ranks(cores.len() as u32)?;
    let place = match ranks.len() {
        1 => format!("rank {} of {world}", ranks.start),
        _ => format!("ranks {}-{} of {world}", ranks.start, ranks.end - 1),
    };
    // Each line this process prints says which ranks it is, as the job's processes
    // print to one terminal.
    let _ = JOB_PLACE.set(place);
    tracing::info!(
        "ranks {}-{} of {world}, across {} processes ({})",
        ranks.start,
        ranks.end - 1,
        launch.processes,
        launch.launcher.name()
    );
    let loaded: Result<Vec<Model>, NrtError> =
        cores.iter().zip(ranks).map(|(&core, rank)| runtime.load_collectives_across(neff, core, rank, world)).collect();
    Ok(loaded?)
}

fn exec(args: ExecArgs) -> Result<()> {
    let config = runtime_config(args.cores.as_deref())?;
    init_logging(config.log_level);
    let runtime = Runtime::start(config)?;
    let neff = load_model_bytes(&args.model, target_for(runtime.topology().core_version))?;
    let cores = runtime.cores()?;

    // The model's inputs, so that `--input` is checked before anything is loaded.
    let program = Neff::decode(&neff, DecodeOptions::default())?.program;
    let given = parse_inputs(&args.inputs, &program)?;
    let mut fill = |i: usize, _: &ArrayType| Ok(given[i].clone());
    // A program with collectives runs as one rank per core; each core's worker executes
    // its rank, and the ranks meet in the collectives.
    let lockstep = program.has_collectives();
    let replicas = if lockstep {
        let models = load_ranks(&runtime, &neff, cores.cores(), args.duration.is_some())?;
        models.into_iter().map(|model| Replica::bind(&runtime, model, &mut fill)).collect::<Result<Vec<_>>>()?
    } else {
        cores.cores().iter().map(|&core| Replica::new(&runtime, &neff, core, &mut fill)).collect::<Result<Vec<_>>>()?
    };

    let iterations = match args.duration {
        Some(_) => u64::MAX,
        None => args.iterations.unwrap_or(DEFAULT_ITERATIONS),
    };
    let deadline = match args.duration {
        Some(d) => Some(Instant::now().checked_add(d).ok_or_else(|| anyhow!("--duration is too long"))?),
        None => None,
    };
    if args.exec_mode == ExecMode::Async && args.inflight > runtime.config().xu_queue as u64 {
        bail!(
            "--inflight {} is more than an execution unit can queue (NEURON_RT_XU_COMPUTE_MAX_QUEUED_REQUESTS={}); \
             raise that variable or lower --inflight",
            args.inflight,
            runtime.config().xu_queue
        );
    }
    if args.warmup > 0 {
        let warm = Stop { iterations: args.warmup, deadline: None, lockstep, state: Mutex::new((None, 0)) };
        match args.exec_mode {
            ExecMode::Sync => drop(run_sync(&runtime, &replicas, &warm, Instant::now())),
            ExecMode::Async => drop(run_async(&runtime, &replicas, &warm, args.inflight as usize, Instant::now())?),
        }
    }
    let stop = Stop { iterations, deadline, lockstep, state: Mutex::new((None, 0)) };
    let started = Instant::now();
    let results = match args.exec_mode {
        ExecMode::Sync => run_sync(&runtime, &replicas, &stop, started),
        ExecMode::Async => run_async(&runtime, &replicas, &stop, args.inflight as usize, started)?,
    };
    let wall = started.elapsed();

    let failed: u64 = results.iter().map(CoreResult::failed_count).sum();
    let mut total = LatencyHistogram::default();
    let mut device = LatencyHistogram::default();
    for r in &results {
        total.merge(&r.total);
        device.merge(&r.device);
    }
    let executions: u64 = results.iter().map(|r| r.executions).sum();
    let numerical_errors: u64 = results.iter().map(|r| r.numerical_errors).sum();
    // Throughput counts the executions that completed.
    let throughput = (executions - failed) as f64 / wall.as_secs_f64();
    let flops = replicas[0].model.flops_per_execution();

    if let Some(dir) = &args.save_outputs {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let replica = &replicas[0];
        for (i, io) in replica.model.outputs().iter().enumerate() {
            let tensor = replica.outputs.get(&io.name).ok_or_else(|| anyhow!("output {} is not bound", io.name))?;
            npy::write(&dir.join(format!("output{i}.npy")), replica.model.tensor_type(io), &tensor.read_all()?)?;
        }
    }

    let name = model_name(&args.model);
    if args.json {
        let summary =
            |h: &LatencyHistogram| h.summary().map(|s: LatencySummary| serde_json::to_value(s).unwrap_or_default());
        let report = serde_json::json!({
            "model": name,
            "cores": cores.cores(),
            "exec_mode": if args.exec_mode == ExecMode::Async { "async" } else { "sync" },
            "inflight": if args.exec_mode == ExecMode::Async { Some(args.inflight) } else { None },
            "executions": executions,
            "duration_seconds": wall.as_secs_f64(),
            "throughput_per_second": throughput,
            "latency_seconds": summary(&total),
            "device_latency_seconds": summary(&device),
            "flops_per_execution": flops,
            "flops_per_second": flops as f64 * throughput,
            "numerical_errors": numerical_errors,
            "failed_executions": failed,
            "failures": replicas.iter().zip(&results).flat_map(|(replica, r)| {
                let core = replica.model.core();
                r.failures.iter().map(move |&(execution, code)| serde_json::json!({
                    "core": core, "execution": execution, "code": code,
                }))
            }).collect::<Vec<_>>(),
            "failures_listed_all": results.iter().all(|r| r.failures.len() as u64 == r.failed_count()),
            "failures_by_status": replicas.iter().zip(&results).flat_map(|(replica, r)| {
                let core = replica.model.core();
                r.by_status.iter().map(move |(status, count, message)| serde_json::json!({
                    "core": core, "status": status.name(), "code": status.code(), "count": count,
                    "first_message": message,
                }))
            }).collect::<Vec<_>>(),
        });
        println!("{report}");
    } else {
        // In one write, each line with the job place: the processes of a job share a
        // terminal.
        let mut text = String::new();
        let prefix = job_prefix();
        let mut line = |l: String| text.push_str(&format!("{prefix}{l}\n"));
        line(format!("model        {name} on {} ({})", cores, runtime.topology().instance_type));
        if args.exec_mode == ExecMode::Async {
            line(format!("mode         async, {} requests in flight per core", args.inflight));
        }
        line(format!(
            "executions   {} in {:.2} s ({} per core)",
            thousands(executions),
            wall.as_secs_f64(),
            thousands(executions / cores.len() as u64)
        ));
        line(format!("throughput   {:.1} executions/s, {}FLOP/s", throughput, si(flops as f64 * throughput)));
        for (label, h) in [("latency", &total), ("device", &device)] {
            if let Some(s) = h.summary() {
                line(format!("{label:<12} {}", s.describe(format_seconds)));
            }
        }
        if numerical_errors > 0 {
            line(format!("NaN/Inf      {} values in outputs", thousands(numerical_errors)));
        }
        for (replica, r) in replicas.iter().zip(&results) {
            for (status, count, _) in &r.by_status {
                line(format!("failed       {} on nc{} with {status}", thousands(*count), replica.model.core()));
            }
        }
        let mut out = std::io::stdout().lock();
        std::io::Write::write_all(&mut out, text.as_bytes())?;
        std::io::Write::flush(&mut out)?;
    }
    if failed > 0 {
        bail!("{} of {} executions failed (listed above)", thousands(failed), thousands(executions));
    }
    Ok(())
}

/// This process's ranks of a job of several processes (`ranks 2-3 of 4`), once loaded.
static JOB_PLACE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `[ranks 2-3 of 4] ` in a job of several processes, else nothing.
fn job_prefix() -> String {
    JOB_PLACE.get().map_or_else(String::new, |place| format!("[{place}] "))
}

/// Prints the executions done so far, once a second.
struct Progress {
    started: Instant,
    next: Instant,
}

impl Progress {
    fn new(started: Instant) -> Progress {
        Progress { started, next: started + Duration::from_secs(1) }
    }

    fn tick(&mut self, done: u64) {
        if Instant::now() >= self.next {
            self.next += Duration::from_secs(1);
            eprintln!(
                "{}  {:>4.0}s  {} executions",
                job_prefix(),
                self.started.elapsed().as_secs_f64(),
                thousands(done)
            );
        }
    }
}

/// When each core stops: after `iterations`, or at the deadline. In lockstep (the ranks
/// of a model with collectives) every core then runs up to the most executions any core
/// has started, so that no rank waits for a partner that has stopped.
struct Stop {
    iterations: u64,
    deadline: Option<Instant>,
    lockstep: bool,
    /// The execution count to stop at, once the deadline has passed, and the most
    /// executions any core has started.
    state: Mutex<(Option<u64>, u64)>,
}

impl Stop {
    /// Whether a core that has started `started` executions may start another.
    fn may_start(&self, started: u64) -> bool {
        if started >= self.iterations {
            return false;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.0.is_none() && self.deadline.is_some_and(|d| Instant::now() >= d) {
            state.0 = Some(if self.lockstep { state.1 } else { 0 });
        }
        match state.0 {
            Some(stop_at) => started < stop_at,
            None => {
                state.1 = state.1.max(started + 1);
                true
            }
        }
    }
}

/// Each core's executions from its own thread, one at a time.
fn run_sync(runtime: &Runtime, replicas: &[Replica], stop: &Stop, started: Instant) -> Vec<CoreResult> {
    let done = AtomicU64::new(0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = replicas
            .iter()
            .map(|replica| {
                let done = &done;
                scope.spawn(move || {
                    let mut result = CoreResult::default();
                    while stop.may_start(result.executions) {
                        result.executions += 1;
                        match runtime.execute(&replica.model, &replica.inputs, &replica.outputs) {
                            Ok(report) => {
                                result.numerical_errors += report.numerical_errors;
                                result.total.record(report.total_latency);
                                result.device.record(report.device_latency);
                            }
                            // Failures are reported and counted; the run goes on.
                            Err(e) => result.failed(replica.model.core(), result.executions, e),
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        let mut progress = Progress::new(started);
        while !workers.iter().all(|w| w.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
            progress.tick(done.load(Ordering::Relaxed));
        }
        workers.into_iter().map(|w| w.join().unwrap_or_default()).collect()
    })
}

/// A request in flight in async mode.
struct InFlight {
    seq: SeqId,
    /// The execution's number on its core, from 1.
    execution: u64,
    scheduled: Instant,
}

/// Every core's executions scheduled from this thread, `inflight` queued per core.
/// The thread sleeps in `poll(2)` on the compute units' completion descriptors.
fn run_async(
    runtime: &Runtime,
    replicas: &[Replica],
    stop: &Stop,
    inflight: usize,
    started: Instant,
) -> Result<Vec<CoreResult>> {
    struct Core<'r> {
        replica: &'r Replica,
        handle: CompletionHandle,
        tracker: ErrorTracker,
        queue: VecDeque<InFlight>,
        failures: HashMap<SeqId, TrackedError>,
        result: CoreResult,
    }
    let mut cores = replicas
        .iter()
        .map(|replica| {
            let core = replica.model.core();
            Ok(Core {
                replica,
                handle: runtime.completion_handle(core, Xu::Compute)?,
                tracker: runtime.error_tracker_create(core)?,
                queue: VecDeque::with_capacity(inflight),
                failures: HashMap::new(),
                result: CoreResult::default(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // The NaN/Inf count of a scheduled execution is in the datastore's counters.
    let datastore = DatastoreReader::open(&runtime.datastore_path()?)?;
    let numerical_errors = |core: u32| datastore.snapshot().core(core).map_or(0, |c| c.numerical_error_values);
    let numerical_before: Vec<u64> = replicas.iter().map(|r| numerical_errors(r.model.core())).collect();
    let mut progress = Progress::new(started);
    let mut done = 0u64;
    loop {
        for core in &mut cores {
            while core.queue.len() < inflight && stop.may_start(core.result.executions) {
                core.result.executions += 1;
                let execution = core.result.executions;
                let r = core.replica;
                match runtime.execute_schedule(&r.model, &r.inputs, &r.outputs, Some(&core.tracker)) {
                    Ok(seq) => core.queue.push_back(InFlight { seq, execution, scheduled: Instant::now() }),
                    Err(e) => {
                        core.result.failed(r.model.core(), execution, e);
                        done += 1;
                    }
                }
            }
        }
        if cores.iter().all(|c| c.queue.is_empty()) {
            break;
        }
        {
            let mut fds: Vec<PollFd<'_>> =
                cores.iter().map(|c| PollFd::new(c.handle.as_fd(), PollFlags::POLLIN)).collect();
            match poll(&mut fds, PollTimeout::from(100u16)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => bail!("cannot wait for completions: {e}"),
            }
        }
        for core in &mut cores {
            core.handle.acknowledge();
            let Some(last) = core.handle.last_completed() else { continue };
            // A failure reaches the tracker before its request counts as completed.
            core.failures.extend(core.tracker.take().into_iter().map(|e| (e.seq_id, e)));
            while let Some(request) = core.queue.front().filter(|r| r.seq.number() <= last.number()) {
                let latency = request.scheduled.elapsed();
                match core.failures.remove(&request.seq) {
                    Some(e) => core.result.failed(
                        core.replica.model.core(),
                        request.execution,
                        NrtError::new(e.status, e.message),
                    ),
                    None => core.result.total.record(latency),
                }
                core.queue.pop_front();
                done += 1;
            }
        }
        progress.tick(done);
    }
    for (core, before) in cores.iter_mut().zip(numerical_before) {
        core.result.numerical_errors = numerical_errors(core.replica.model.core()).saturating_sub(before);
    }
    Ok(cores.into_iter().map(|c| c.result).collect())
}

/// Counters one demo worker shares with the status line.
#[derive(Default)]
struct DemoCore {
    executions: AtomicU64,
    errors: AtomicU64,
    busy_nanos: AtomicU64,
    flops: AtomicU64,
    latency: Mutex<LatencyHistogram>,
}

fn demo(args: DemoArgs) -> Result<()> {
    let config = Config::from_env()?;
    init_logging(config.log_level);
    let datastore_dir = config.datastore_dir.clone();
    let runtime = Runtime::start(config)?;
    let target = target_for(runtime.topology().core_version);
    let cores = runtime.cores()?;
    let _dashboard = if args.no_dashboard { None } else { Some(demo_dashboard(&args, datastore_dir)?) };
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        ctrlc::set_handler(move || stop.store(true, Ordering::Relaxed)).context("cannot install the Ctrl-C handler")?;
    }

    let mut neffs = Vec::new();
    for (name, text) in DEMO_MODELS {
        let program = compile_hlo(text, target).map_err(|e| anyhow!("bundled example {name}: {e}"))?;
        println!(
            "compiled {name}: {} instructions, {} FLOPs per execution",
            program.instructions().count(),
            thousands(program.flops_per_execution())
        );
        neffs.push(Neff::new(name, program).encode());
    }
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut fill = |_: usize, ty: &ArrayType| -> Result<Option<Vec<u8>>> { Ok(Some(pseudo_random(ty, &mut seed))) };
    let mut replicas: Vec<Vec<Replica>> = Vec::new();
    for &core in cores.cores() {
        let per_core =
            neffs.iter().map(|neff| Replica::new(&runtime, neff, core, &mut fill)).collect::<Result<Vec<_>>>();
        replicas.push(per_core?);
    }
    let how_long = match args.duration {
        Some(d) => format!("for {:.1} s (Ctrl-C stops it sooner)", d.as_secs_f64()),
        None => "until Ctrl-C".to_string(),
    };
    println!(
        "running on {} of a virtual {} ({} per core) {how_long}",
        cores,
        runtime.topology().instance_type,
        DEMO_MODELS.map(|(n, _)| n).join(" + ")
    );

    let stats: Vec<DemoCore> = cores.cores().iter().map(|_| DemoCore::default()).collect();
    let started = Instant::now();
    let end = match args.duration {
        Some(d) => Some(started.checked_add(d).ok_or_else(|| anyhow!("--duration is too long"))?),
        None => None,
    };
    std::thread::scope(|scope| {
        for (models, core_stats) in replicas.iter().zip(&stats) {
            let (runtime, stop) = (&runtime, &stop);
            scope.spawn(move || {
                for replica in models.iter().cycle() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    match runtime.execute(&replica.model, &replica.inputs, &replica.outputs) {
                        Ok(report) => {
                            core_stats.executions.fetch_add(1, Ordering::Relaxed);
                            core_stats.flops.fetch_add(report.flops, Ordering::Relaxed);
                            core_stats.busy_nanos.fetch_add(report.device_latency.as_nanos() as u64, Ordering::Relaxed);
                            core_stats.latency.lock().unwrap_or_else(|e| e.into_inner()).record(report.total_latency);
                        }
                        Err(e) => {
                            core_stats.errors.fetch_add(1, Ordering::Relaxed);
                            tracing::error!("{}: {e}", replica.model.name());
                        }
                    }
                }
            });
        }
        let mut last = (Instant::now(), vec![(0u64, 0u64, 0u64); stats.len()]);
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            if end.is_some_and(|e| Instant::now() >= e) {
                stop.store(true, Ordering::Relaxed);
            }
            let elapsed = last.0.elapsed();
            if elapsed < Duration::from_secs(1) && !stop.load(Ordering::Relaxed) {
                continue;
            }
            let mut window = LatencyHistogram::default();
            let mut line = format!("[{:>5.0}s]", started.elapsed().as_secs_f64());
            let (mut executions, mut flops, mut errors) = (0u64, 0u64, 0u64);
            for (i, s) in stats.iter().enumerate() {
                let now = (
                    s.executions.load(Ordering::Relaxed),
                    s.busy_nanos.load(Ordering::Relaxed),
                    s.flops.load(Ordering::Relaxed),
                );
                let (prev_exec, prev_busy, prev_flops) = last.1[i];
                executions += now.0 - prev_exec;
                flops += now.2 - prev_flops;
                errors += s.errors.load(Ordering::Relaxed);
                let busy = (now.1 - prev_busy) as f64 / elapsed.as_nanos() as f64 * 100.0;
                line.push_str(&format!(" nc{} {:>5.1}%", cores.cores()[i], busy.min(100.0)));
                let mut h = s.latency.lock().unwrap_or_else(|e| e.into_inner());
                window.merge(&h);
                h.clear();
                last.1[i] = now;
            }
            let secs = elapsed.as_secs_f64();
            line.push_str(&format!(" | {:>8.1} exec/s | {}FLOP/s", executions as f64 / secs, si(flops as f64 / secs)));
            if let Some(s) = window.summary() {
                line.push_str(&format!(" | p50 {} p99 {}", format_seconds(s.p50), format_seconds(s.p99)));
            }
            line.push_str(&format!(" | errors {errors}"));
            println!("{line}");
            last.0 = Instant::now();
        }
    });
    let executions: u64 = stats.iter().map(|s| s.executions.load(Ordering::Relaxed)).sum();
    let errors: u64 = stats.iter().map(|s| s.errors.load(Ordering::Relaxed)).sum();
    println!(
        "stopped after {} executions in {:.1} s, {errors} errors",
        thousands(executions),
        started.elapsed().as_secs_f64()
    );
    runtime.close()?;
    if errors > 0 {
        bail!("{errors} executions failed; run with NEURON_RT_LOG_LEVEL=ERROR or higher to see why");
    }
    Ok(())
}

/// Starts the web dashboard in this process, on the demo's datastores, and says where.
fn demo_dashboard(args: &DemoArgs, datastore_dir: PathBuf) -> Result<neuron_dashboard::Dashboard> {
    let listen = args.listen;
    let mut options = neuron_dashboard::Options::new(listen)?;
    options.datastore_dir = datastore_dir;
    options.profiles = args.profiles.clone();
    let (dashboard, taken) = neuron_profiler::start_dashboard(options, true)?;
    if taken.is_some() {
        println!("dashboard: {listen} is taken, using port {} instead", dashboard.addr().port());
    }
    println!("dashboard: {}  (live view of this demo; --no-dashboard to run without)", dashboard.url(None));
    Ok(dashboard)
}

/// Deterministic values: floats in [-1, 1), signed integers in [-8, 8), unsigned ones
/// in [0, 16), or booleans.
fn pseudo_random(ty: &ArrayType, state: &mut u64) -> Vec<u8> {
    let count = ty.element_count().unwrap_or(0) as usize;
    let size = ty.dtype.size_bytes() as usize;
    let mut next = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    };
    let mut out = Vec::with_capacity(count * size);
    for _ in 0..count {
        let bits = next();
        let float = (bits >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        match ty.dtype.class() {
            DTypeClass::Pred => out.push((bits & 1) as u8),
            DTypeClass::Signed => out.extend_from_slice(&((bits % 16) as i64 - 8).to_le_bytes()[..size]),
            DTypeClass::Unsigned => out.extend_from_slice(&(bits % 16).to_le_bytes()[..size]),
            DTypeClass::Float => match ty.dtype {
                DType::F16 => out.extend_from_slice(&half::f16::from_f32(float).to_le_bytes()),
                DType::BF16 => out.extend_from_slice(&half::bf16::from_f32(float).to_le_bytes()),
                _ => out.extend_from_slice(&float.to_le_bytes()),
            },
        }
    }
    out
}
