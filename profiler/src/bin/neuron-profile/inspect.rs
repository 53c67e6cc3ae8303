//! `neuron-profile inspect`: runs a program with profiling switched on and records
//! each runtime process it starts (itself or any descendant) into its own NTFF file,
//! draining the process's rings while it runs and after it exits. A process that holds
//! ranks of a job is written as `profile_rank_<id>.ntff` (its lowest rank), as Neuron
//! names them, so that a directory of them is the job (`view -d` reads them together).
//! With `NEURON_RT_INSPECT_ON_FAIL`, it writes what the rings hold when an execution
//! fails instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use neuron_datastore::ALL_SYSTEM_EVENTS;
use neuron_datastore::{DatastoreReader, Liveness, Tail, TailStart, pid_of_file_name};
use neuron_record::{Recorder, create_writer, metadata};
use neuron_runtime::Config;
use neuron_runtime::config::{ENV_DATASTORE_DIR, ENV_INSPECT_ENABLE, ENV_INSPECT_MAX_EVENTS_PER_NC};

/// How often the datastore directory is searched and the rings drained.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// Directory for the NTFF files.
    #[arg(short = 'o', long = "output-dir", env = "NEURON_RT_INSPECT_OUTPUT_DIR", default_value = "output")]
    output_dir: PathBuf,
    /// Events each ring keeps (NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC for the program).
    #[arg(short = 'n', long = "max-events", value_name = "MAX_EVENTS")]
    max_events: Option<u64>,
    /// Write a file only when an execution fails: what the rings hold then.
    #[arg(long, env = "NEURON_RT_INSPECT_ON_FAIL", value_parser = parse_flag, default_value = "0")]
    on_fail: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn parse_flag(text: &str) -> Result<bool, String> {
    match text.trim() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        other => Err(format!("`{other}` is not 0 or 1")),
    }
}

/// A runtime process being recorded.
struct Traced {
    reader: DatastoreReader,
    path: PathBuf,
    mode: Mode,
}

enum Mode {
    /// Everything, as it happens.
    Stream { tail: Box<Tail>, recorder: Box<Recorder<ntff::ProfileFile>> },
    /// The rings, whenever the error count grows.
    OnFail { errors: u64, captures: u32 },
}

pub(crate) fn inspect(args: InspectArgs) -> Result<()> {
    std::fs::create_dir_all(&args.output_dir)
        .with_context(|| format!("cannot create the output directory {}", args.output_dir.display()))?;
    let datastore_dir = Config::from_env().map_err(|e| anyhow::anyhow!("{e}"))?.datastore_dir;
    let mut command = Command::new(&args.command[0]);
    command.args(&args.command[1..]).env(ENV_INSPECT_ENABLE, "1").env(ENV_DATASTORE_DIR, &datastore_dir);
    if let Some(n) = args.max_events {
        command.env(ENV_INSPECT_MAX_EVENTS_PER_NC, n.to_string());
    }
    // Ctrl-C reaches the program too; this process stays to finish the files.
    ctrlc::set_handler(|| {}).context("cannot install the Ctrl-C handler")?;
    let mut child = command.spawn().with_context(|| format!("cannot run {}", args.command[0]))?;
    let root = child.id();
    let session = neuron_datastore::clock::realtime_ns() / 1_000_000_000;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let mut traced: HashMap<u32, Traced> = HashMap::new();
    let mut seen: Vec<u32> = Vec::new();
    let mut written: Vec<PathBuf> = Vec::new();
    let status: ExitStatus = loop {
        let exited = child.try_wait().context("cannot wait for the program")?;
        // Only new files of the program's processes are opened.
        for (pid, path) in datastore_files(&datastore_dir) {
            if seen.contains(&pid) || !descends_from(pid, root) {
                continue;
            }
            let Ok(reader) = DatastoreReader::open(&path) else { continue };
            seen.push(pid);
            let name = format!("{}-pid{pid}-{session}.ntff", if host.is_empty() { "host" } else { &host });
            let path = args.output_dir.join(name);
            let mode = if args.on_fail {
                Mode::OnFail { errors: error_count(&reader), captures: 0 }
            } else {
                let command: Vec<String> = args.command.clone();
                let recorder = Recorder::new(create_writer(
                    &path,
                    &metadata(reader.info(), neuron_profiler::PROFILE_TOOL, "inspect", &command),
                )?);
                let tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
                Mode::Stream { tail: Box::new(tail), recorder: Box::new(recorder) }
            };
            traced.insert(pid, Traced { reader, path, mode });
        }
        let mut finished = Vec::new();
        for (&pid, t) in &mut traced {
            let done = matches!(t.reader.liveness(), Liveness::Exited(_));
            if let Some(path) = step(t, done, &args.command)? {
                written.push(path);
            }
            if done {
                finished.push(pid);
            }
        }
        for pid in finished {
            if let Some(Traced { mode: Mode::Stream { mut recorder, .. }, path, reader }) = traced.remove(&pid) {
                // Closed ones too: a process closes its communicators as it ends, and
                // their records stay.
                let communicators = reader.communicators_with_closed();
                let rank = own_rank(&communicators);
                recorder.communicators(&communicators)?;
                let (file, summary) = recorder.finish()?;
                file.place()?;
                let path = rank.map_or(Ok(path.clone()), |rank| named_after_rank(&path, rank))?;
                eprintln!(
                    "neuron-profile: pid {pid}: {} system events, {} device events, {} lost: {}",
                    summary.system_events,
                    summary.device_events,
                    summary.lost_events,
                    path.display()
                );
                written.push(path);
            }
        }
        if let Some(status) = exited {
            // Runtimes of the program that are still alive are recorded until they exit.
            if traced.is_empty() {
                break status;
            }
        }
        std::thread::sleep(POLL_INTERVAL);
    };
    if seen.is_empty() {
        eprintln!("neuron-profile: {} started no Neuron runtime; nothing was recorded", args.command[0]);
    } else if written.is_empty() {
        eprintln!("neuron-profile: no execution failed; nothing was written");
    }
    if !status.success() {
        use std::os::unix::process::ExitStatusExt;
        let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        eprintln!("neuron-profile: {} exited with status {code}", args.command[0]);
        std::process::exit(code);
    }
    Ok(())
}

/// Drains or watches one process; returns the path of a file written by an
/// on-failure capture.
fn step(t: &mut Traced, done: bool, command: &[String]) -> Result<Option<PathBuf>> {
    match &mut t.mode {
        Mode::Stream { tail, recorder } => {
            recorder.models(&t.reader.models(), &|_| String::new())?;
            recorder.drain(&t.reader, tail, done)?;
            recorder.flush_when_due()?;
            Ok(None)
        }
        Mode::OnFail { errors, captures } => {
            let now = error_count(&t.reader);
            if now <= *errors {
                return Ok(None);
            }
            *errors = now;
            *captures += 1;
            let path = numbered(&t.path, *captures);
            let mut recorder = Recorder::new(create_writer(
                &path,
                &metadata(t.reader.info(), neuron_profiler::PROFILE_TOOL, "inspect-on-fail", command),
            )?);
            recorder.models(&t.reader.models(), &|_| String::new())?;
            let mut tail = t.reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
            recorder.drain(&t.reader, &mut tail, done)?;
            recorder.communicators(&t.reader.communicators_with_closed())?;
            recorder.finish()?.0.place()?;
            eprintln!(
                "neuron-profile: an execution of pid {} failed; its rings are in {}",
                t.reader.info().pid,
                path.display()
            );
            Ok(Some(path))
        }
    }
}

/// The lowest rank the process holds in a communicator across processes, from its
/// flight record (`None` before it joins one, or when it runs none).
fn own_rank(comms: &[neuron_datastore::CommunicatorRecord]) -> Option<u32> {
    comms.iter().filter(|c| c.across).flat_map(|c| &c.members).filter(|m| m.in_this_process).map(|m| m.rank).min()
}

/// Renames a finished file to `profile_rank_<rank>.ntff` beside it; keeps its name
/// when that one is taken (the same rank of another run).
fn named_after_rank(path: &Path, rank: u32) -> Result<PathBuf> {
    let named = path.with_file_name(format!("profile_rank_{rank}.ntff"));
    if named.exists() {
        eprintln!("neuron-profile: {} exists; rank {rank}'s profile stays {}", named.display(), path.display());
        return Ok(path.to_owned());
    }
    std::fs::rename(path, &named)
        .with_context(|| format!("cannot rename {} to {}", path.display(), named.display()))?;
    Ok(named)
}

/// `x-pid1-1.ntff` → `x-pid1-1-fail2.ntff`.
fn numbered(path: &Path, n: u32) -> PathBuf {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!("{stem}-fail{n}.ntff"))
}

/// Failed executions of every core, from the lossless counters.
fn error_count(reader: &DatastoreReader) -> u64 {
    reader.snapshot().cores.iter().map(|c| c.errors.0.iter().sum::<u64>()).sum()
}

/// The datastore files in `dir`, by the pid they belong to.
fn datastore_files(dir: &Path) -> Vec<(u32, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(pid_of_file_name).map(|pid| (pid, e.path())))
        .collect()
}

/// Whether `pid` is `root` or one of its descendants.
fn descends_from(pid: u32, root: u32) -> bool {
    let mut current = pid;
    for _ in 0..64 {
        if current == root {
            return true;
        }
        match parent_of(current) {
            Some(parent) if parent > 1 => current = parent,
            _ => return false,
        }
    }
    false
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name is in parentheses and may hold spaces: the fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}
