//! `neuron-profile capture`: runs a model in this process and records the system
//! trace of every execution and the device trace of the chosen ones into an NTFF file.
//!
//! The runtime writes its rings as usual; this process reads its own datastore with
//! the same reader other tools use and drains it into the file between executions
//! (every 10 ms, and after every longer execution), so the recording path is the one
//! `inspect` and `snapshot` use.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, ValueEnum};
use neuron_datastore::ALL_SYSTEM_EVENTS;
use neuron_datastore::{DatastoreReader, TailStart};
use neuron_profiler::{bind_tensors, load_model_bytes, model_name, npy, read_inputs, target_for};
use neuron_record::{Recorder, create_writer, metadata};
use neuron_runtime::config::{ENV_INSPECT_MAX_EVENTS_PER_NC, ENV_NUM_CORES, ENV_VISIBLE_CORES};
use neuron_runtime::{Config, ErrorTracker, Model, Neff, NrtError, Runtime, SeqId, Target, TensorSet, compile_hlo};

#[derive(Debug, Args)]
pub(crate) struct CaptureArgs {
    /// The model: a NEFF, or HLO text (compiled with the `neuron-cc` defaults).
    #[arg(short = 'n', long = "neff", value_name = "MODEL")]
    model: PathBuf,
    /// The NTFF file to write.
    #[arg(short = 's', long = "session-file", value_name = "OUT.ntff", default_value = "profile.ntff")]
    session_file: PathBuf,
    /// Executions to run and record, after the warm-up. The default, 100, is the fewest
    /// the summary gives a p99 over (p90 needs 10); Neuron's tool records 1.
    #[arg(long, default_value_t = DEFAULT_NUM_EXEC, value_name = "N")]
    num_exec: u64,
    /// Executions run first, unrecorded: the first executions of a model are cold
    /// (caches, page faults, lazily built state), and a device trace of one would
    /// show a slower execution than the model's usual one.
    #[arg(long, default_value_t = DEFAULT_WARMUP, value_name = "N")]
    warmup: u64,
    /// The recorded execution (from 1) whose device trace is recorded; 0 records none.
    /// By default, up to 25 executions spread evenly over the recorded ones (every one
    /// of up to 25), so that the figures per instruction are over many executions.
    #[arg(long, value_name = "N")]
    profile_nth_exec: Option<u64>,
    /// Record the device trace of every execution, not only the Nth.
    #[arg(long)]
    profile_all_execs: bool,
    /// `profile`: system and device traces; `systrace`: the system trace only.
    #[arg(short = 't', long, value_enum, default_value_t = CaptureType::Profile)]
    capture_type: CaptureType,
    /// `sync`: one execution at a time; `async`: scheduled, several in flight;
    /// `async-wait`: scheduled, each waited for before the next.
    #[arg(long, value_enum, default_value_t = ExecMode::Sync)]
    exec_mode: ExecMode,
    /// Keep running after a failed execution (the failure is in the trace).
    #[arg(long)]
    ignore_exec_errors: bool,
    /// Run the executions without recording anything (no file is written).
    #[arg(long)]
    disable_profile: bool,
    /// Save the outputs of the last execution as `NAME.npy` beside the session file.
    #[arg(long)]
    save_output_npy: bool,
    /// Check that every execution produces the same outputs as the first.
    #[arg(long)]
    check_output_determinism: bool,
    /// Inputs as pairs: the input's name (or index) and a `.npy` file; zeros otherwise.
    #[arg(value_name = "NAME PATH.npy")]
    inputs: Vec<String>,
    #[command(flatten)]
    workers: crate::workers::WorkerArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum CaptureType {
    Profile,
    Systrace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ExecMode {
    Sync,
    Async,
    AsyncWait,
}

pub(crate) fn capture(args: CaptureArgs) -> Result<()> {
    if !args.inputs.len().is_multiple_of(2) {
        bail!("inputs come in pairs, NAME PATH.npy; got {} values", args.inputs.len());
    }
    if args.num_exec == 0 {
        bail!("--num-exec must be at least 1");
    }
    // The session file's directory is made if missing (`-s out/profile.ntff`).
    if let Some(dir) = args.session_file.parent().filter(|d| !d.as_os_str().is_empty() && !args.disable_profile) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create the directory {}", dir.display()))?;
    }
    if args.workers.workers_per_node.is_some() {
        let arguments = crate::workers::worker_arguments(std::env::args().skip(1));
        let dir = args.session_file.parent().map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d });
        return crate::workers::run(&args.workers, &arguments, if args.disable_profile { None } else { dir });
    }
    // One core unless the environment chooses: a capture should not hold the host's
    // cores. Its rings are the large ones a profile asks for, unless sized explicitly.
    let config = Config::from_lookup(|name| match name {
        ENV_NUM_CORES if std::env::var_os(ENV_VISIBLE_CORES).is_none() => {
            Some(std::env::var(name).unwrap_or_else(|_| "1".into()))
        }
        ENV_INSPECT_MAX_EVENTS_PER_NC => {
            Some(std::env::var(name).unwrap_or_else(|_| neuron_datastore::INSPECT_MAX_EVENTS_PER_NC.to_string()))
        }
        _ => std::env::var(name).ok(),
    })
    .map_err(|e| anyhow!(e))?;
    neuron_profiler::init_logging(config.log_level);
    let runtime = Runtime::start(config)?;
    let target = target_for(runtime.topology().core_version);
    let neff = load_model_bytes(&args.model, target)?;
    let core = runtime.cores()?.cores()[0];
    // A rank of a job (under a launcher, or a worker of `-r`) writes its own file, named
    // after its lowest rank as Neuron names them, beside the session file.
    let held = runtime.cores()?.cores().len() as u32;
    let job_rank = runtime.config().launch.as_ref().filter(|l| l.processes > 1).and_then(|l| l.ranks(held).ok());
    let session_file = match &job_rank {
        Some((ranks, _)) => args.session_file.with_file_name(format!("profile_rank_{}.ntff", ranks.start)),
        None => args.session_file.clone(),
    };
    runtime.set_trace_recording_of(false, false)?;
    let peak = if args.disable_profile { None } else { Some(measure_peak(&runtime, core, target)?) };

    let reader = DatastoreReader::open(&runtime.datastore_path()?)?;
    let mut recorder = match peak {
        Some(peak) => {
            let command: Vec<String> = std::env::args().collect();
            let mut meta = metadata(reader.info(), neuron_profiler::PROFILE_TOOL, "capture", &command);
            meta.peak_flops_per_core = peak;
            meta.peak_flops_method = PEAK_METHOD.into();
            meta.warmup_executions = u32::try_from(args.warmup).unwrap_or(u32::MAX);
            Some(Recorder::new(create_writer(&session_file, &meta)?))
        }
        None => None,
    };
    let mut tail = reader.tail(TailStart::Now, None, ALL_SYSTEM_EVENTS, true);
    // Executions count from 1; by default every `stride`th one from the first is traced.
    let stride = args.num_exec.div_ceil(DEFAULT_TRACED_EXECUTIONS).max(1);
    let device_for = |execution: u64| {
        args.capture_type == CaptureType::Profile
            && match (args.profile_all_execs, args.profile_nth_exec) {
                (true, _) => true,
                (false, Some(nth)) => nth != 0 && execution == nth,
                (false, None) => (execution - 1).is_multiple_of(stride),
            }
    };
    runtime.set_trace_recording_of(recorder.is_some(), false)?;

    // A collectives program in a job of several processes runs as this process's rank
    // of the job's communicator; elsewhere as a program of one rank.
    let collectives = Neff::decode(&neff, neuron_runtime::neff::DecodeOptions::default())?.program.has_collectives();
    let model = match &job_rank {
        Some((ranks, world)) if collectives && runtime.config().root_comm.is_some() => {
            runtime.load_collectives_across(&neff, core, ranks.start, *world)?
        }
        _ => runtime.load(&neff, Some(core))?,
    };
    if let Some(recorder) = &mut recorder {
        let sha = sha256_hex(&neff);
        recorder.models(&reader.models(), &|m| if m.model_id == model.id() { sha.clone() } else { String::new() })?;
    }
    let (inputs, outputs) = bind(&runtime, &model, &args.inputs)?;
    if args.warmup > 0 {
        // Unrecorded: neither ring records while the model warms up.
        runtime.set_trace_recording_of(false, false)?;
        for k in 1..=args.warmup {
            runtime.execute(&model, &inputs, &outputs).with_context(|| {
                format!("warm-up execution {k} of {} failed; --warmup 0 skips the warm-up", args.warmup)
            })?;
        }
        runtime.set_trace_recording_of(recorder.is_some(), false)?;
    }

    let progress = indicatif::ProgressBar::new(args.num_exec).with_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} executions {pos}/{len} [{elapsed_precise}] {wide_bar} {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut run = Run {
        runtime: &runtime,
        model: &model,
        inputs: &inputs,
        outputs: &outputs,
        tracker: runtime.error_tracker_create(core)?,
        failures: Vec::new(),
        first_outputs: None,
        nondeterministic: Vec::new(),
        check_outputs: args.check_output_determinism,
    };
    let mut in_flight: VecDeque<(u64, SeqId)> = VecDeque::new();
    let depth = runtime.config().xu_queue.max(1);
    let started = Instant::now();
    let mut stopped_by: Option<(u64, NrtError)> = None;
    let mut recording_device = false;
    for execution in 1..=args.num_exec {
        let device = recorder.is_some() && device_for(execution);
        // Device recording is switched between executions, with none in flight.
        if device != recording_device {
            run.wait_all(&mut in_flight)?;
            runtime.set_trace_recording_of(recorder.is_some(), device)?;
            recording_device = device;
        }
        match args.exec_mode {
            ExecMode::Sync => run.sync(execution)?,
            ExecMode::AsyncWait => {
                in_flight.push_back((execution, run.schedule()?));
                run.wait_all(&mut in_flight)?;
            }
            ExecMode::Async => {
                while in_flight.len() >= depth {
                    run.wait_one(&mut in_flight)?;
                }
                in_flight.push_back((execution, run.schedule()?));
            }
        }
        progress.set_position(execution - in_flight.len() as u64);
        if let Some(recorder) = &mut recorder {
            recorder.drain_when_due(&reader, &mut tail)?;
        }
        if !args.ignore_exec_errors
            && let Some(failure) = run.failures.first()
        {
            stopped_by = Some(failure.clone());
            break;
        }
    }
    run.wait_all(&mut in_flight)?;
    progress.finish_and_clear();
    let elapsed = started.elapsed();
    // A rank's clock offset, measured when its job formed (during the unrecorded
    // warm-up, perhaps), recorded once more: the file's anchor to rank 0's clock.
    runtime.trace_clock_offset();
    runtime.set_trace_recording_of(false, false)?;

    if args.save_output_npy {
        save_outputs(&model, &outputs, &session_file)?;
    }
    let executed = run.failures.len() as u64 + run.completed_count(args.num_exec, stopped_by.as_ref());
    match recorder {
        Some(mut recorder) => {
            recorder.drain(&reader, &mut tail, true)?;
            recorder.communicators(&reader.communicators())?;
            let (file, summary) = recorder.finish()?;
            file.place()?;
            eprintln!(
                "captured {executed} execution{} of {} in {:.3} s ({} each): {} system events, {} device events, {} lost; {} ({} bytes)",
                if executed == 1 { "" } else { "s" },
                model_name(&args.model),
                elapsed.as_secs_f64(),
                per_execution(elapsed, executed),
                summary.system_events,
                summary.device_events,
                summary.lost_events,
                session_file.display(),
                summary.bytes
            );
            eprintln!("view it with: neuron-profile view -s {}", session_file.display());
        }
        None => eprintln!(
            "ran {executed} executions in {:.3} s ({} each) without profiling",
            elapsed.as_secs_f64(),
            per_execution(elapsed, executed)
        ),
    }
    if !run.failures.is_empty() {
        eprintln!(
            "{} executions failed; the first: execution {}: {}",
            run.failures.len(),
            run.failures[0].0,
            run.failures[0].1
        );
    }
    if let Some((execution, error)) = stopped_by {
        bail!(
            "execution {execution} failed: {error}; the trace up to it was written; --ignore-exec-errors runs past failures"
        );
    }
    if !run.nondeterministic.is_empty() {
        bail!("outputs differ from the first execution's: {}", run.nondeterministic.join("; "));
    }
    if args.check_output_determinism {
        eprintln!("every execution produced the same outputs");
    }
    Ok(())
}

/// The state of the execution loop.
struct Run<'a> {
    runtime: &'a Runtime,
    model: &'a Model,
    inputs: &'a TensorSet,
    outputs: &'a TensorSet,
    tracker: ErrorTracker,
    /// (execution, error) of each failure.
    failures: Vec<(u64, NrtError)>,
    first_outputs: Option<Vec<Vec<u8>>>,
    nondeterministic: Vec<String>,
    check_outputs: bool,
}

impl Run<'_> {
    fn sync(&mut self, execution: u64) -> Result<()> {
        match self.runtime.execute(self.model, self.inputs, self.outputs) {
            Ok(_) => self.completed(execution),
            Err(e) => {
                self.failures.push((execution, e));
                Ok(())
            }
        }
    }

    fn schedule(&mut self) -> Result<SeqId> {
        Ok(self.runtime.execute_schedule(self.model, self.inputs, self.outputs, Some(&self.tracker))?)
    }

    fn wait_one(&mut self, in_flight: &mut VecDeque<(u64, SeqId)>) -> Result<()> {
        let Some((execution, seq)) = in_flight.pop_front() else { return Ok(()) };
        let timeout = self.runtime.config().exec_timeout + Duration::from_secs(5);
        self.runtime.wait_sequence(seq, timeout)?;
        match self.tracker.take().into_iter().find(|e| e.seq_id == seq) {
            Some(e) => self.failures.push((execution, NrtError::new(e.status, e.message))),
            None => self.completed(execution)?,
        }
        Ok(())
    }

    fn wait_all(&mut self, in_flight: &mut VecDeque<(u64, SeqId)>) -> Result<()> {
        while !in_flight.is_empty() {
            self.wait_one(in_flight)?;
        }
        Ok(())
    }

    fn completed(&mut self, execution: u64) -> Result<()> {
        if !self.check_outputs {
            return Ok(());
        }
        let outputs = read_outputs(self.model, self.outputs)?;
        match &self.first_outputs {
            None => self.first_outputs = Some(outputs),
            Some(first) => {
                for (k, (a, b)) in first.iter().zip(&outputs).enumerate() {
                    if a != b && self.nondeterministic.len() < 10 {
                        let name = &self.model.outputs()[k].name;
                        self.nondeterministic.push(format!("execution {execution}, output {name}"));
                    }
                }
            }
        }
        Ok(())
    }

    /// Executions that completed, from the number attempted.
    fn completed_count(&self, requested: u64, stopped_by: Option<&(u64, NrtError)>) -> u64 {
        let attempted = stopped_by.map_or(requested, |(execution, _)| *execution);
        attempted - self.failures.len() as u64
    }
}

fn read_outputs(model: &Model, outputs: &TensorSet) -> Result<Vec<Vec<u8>>> {
    model
        .outputs()
        .iter()
        .map(|io| {
            let tensor = outputs.get(&io.name).ok_or_else(|| anyhow!("output {} is not bound", io.name))?;
            let mut bytes = vec![0u8; tensor.size() as usize];
            tensor.read(0, &mut bytes)?;
            Ok(bytes)
        })
        .collect()
}

fn save_outputs(model: &Model, outputs: &TensorSet, session_file: &Path) -> Result<()> {
    let dir = session_file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    for (io, bytes) in model.outputs().iter().zip(read_outputs(model, outputs)?) {
        let path = dir.join(format!("{}.npy", io.name));
        npy::write(&path, model.tensor_type(io), &bytes)?;
        eprintln!("saved output {} to {}", io.name, path.display());
    }
    Ok(())
}

/// Allocates the model's tensors on its core and fills the inputs given as
/// `NAME PATH.npy` pairs (zeros for the others).
fn bind(runtime: &Runtime, model: &Model, pairs: &[String]) -> Result<(TensorSet, TensorSet)> {
    let pairs: Vec<(&str, &str)> = pairs.chunks_exact(2).map(|p| (p[0].as_str(), p[1].as_str())).collect();
    let mut given = read_inputs(&pairs, model.program())?;
    bind_tensors(runtime, model, &mut |i, _| Ok(given[i].take()))
}

/// Executions run before the recorded ones unless `--warmup` says otherwise.
const DEFAULT_WARMUP: u64 = 2;

/// Recorded executions by default: enough for the summary's p99 (it gives p90 over 10
/// executions or more, p99 over 100 or more).
const DEFAULT_NUM_EXEC: u64 = 100;

/// Executions whose device trace is recorded by default, spread over the recorded ones:
/// enough that one slow or fast execution does not decide the figures per instruction.
const DEFAULT_TRACED_EXECUTIONS: u64 = 25;

/// Side of the square matrices of the peak measurement.
const PEAK_SIZE: u64 = 1024;
const PEAK_RUNS: usize = 3;
const PEAK_METHOD: &str = "the best of 3 executions, after one to warm up, of a 1024x1024x1024 f32 matrix product (neuron-cc defaults) on the same backend and core, before the capture";

/// The backend's peak FLOP/s on `core`: a large matrix product through the runtime,
/// with tracing off.
fn measure_peak(runtime: &Runtime, core: u32, target: Target) -> Result<f64> {
    let n = PEAK_SIZE;
    let hlo = format!(
        "HloModule peak\n\nENTRY peak {{\n  a = f32[{n},{n}] parameter(0)\n  b = f32[{n},{n}] parameter(1)\n  ROOT d = f32[{n},{n}] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n"
    );
    let program = compile_hlo(&hlo, target).map_err(|e| anyhow!("cannot compile the peak measurement: {e}"))?;
    let model = runtime.load(&Neff::new("peak-gemm", program).encode(), Some(core))?;
    let (inputs, outputs) = bind(runtime, &model, &[])?;
    runtime.execute(&model, &inputs, &outputs).context("the peak measurement failed")?;
    let mut best = Duration::MAX;
    for _ in 0..PEAK_RUNS {
        let report = runtime.execute(&model, &inputs, &outputs).context("the peak measurement failed")?;
        best = best.min(report.device_latency);
    }
    drop((inputs, outputs));
    runtime.unload(&model)?;
    Ok(2.0 * (n * n * n) as f64 / best.as_secs_f64().max(1e-9))
}

/// The mean time of an execution, for people.
fn per_execution(elapsed: Duration, executions: u64) -> String {
    let micros = elapsed.as_secs_f64() * 1e6 / executions.max(1) as f64;
    if micros >= 1000.0 { format!("{:.2} ms", micros / 1000.0) } else { format!("{micros:.1} µs") }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
