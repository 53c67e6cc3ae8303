//! `neuron-profile`: record runtime traces into NTFF files and read them.
//!
//! `capture` runs a model and records it; `inspect` records any program that uses the
//! runtime; `snapshot` writes what a running process's rings hold now; `view`
//! summarises a file or exports it (Perfetto, Chrome JSON, JSON); `tail` prints a
//! running process's events as they happen.

mod activity;
mod capture;
mod inspect;
mod ranks;
mod snapshot;
mod view;
mod workers;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use neuron_datastore::ALL_SYSTEM_EVENTS;
use neuron_datastore::{DatastoreReader, Liveness, TailStart, TraceEvent, discover};
use neuron_runtime::{Config, CoreSet};

/// How often `tail` looks for new events.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

#[derive(Debug, Parser)]
#[command(name = "neuron-profile", version, about = "Profile Neuron runtime processes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a model and record the system trace of its executions and the device trace
    /// of the chosen ones into an NTFF file.
    Capture(capture::CaptureArgs),
    /// Run a program with profiling switched on (the `NEURON_RT_INSPECT_*` variables)
    /// and record every runtime process it starts into its own NTFF file.
    Inspect(inspect::InspectArgs),
    /// Write what a running process's trace rings hold now into an NTFF file, without
    /// stopping it (the flight recorder).
    Snapshot(snapshot::SnapshotArgs),
    /// Summarise an NTFF file, or export it as Perfetto, Chrome JSON or JSON.
    View(view::ViewArgs),
    /// Print a running process's trace events as they happen, until it exits or you
    /// press Ctrl-C; then say how many events were lost (overwritten before they could
    /// be read).
    Tail {
        /// The runtime process.
        pid: u32,
        /// One JSON object per line, in the `nrt_sys_trace_fetch_events` event shape.
        #[arg(long)]
        json: bool,
        /// Only these NeuronCores, e.g. `0,1` or `0-3` (default: all, and host events).
        #[arg(long)]
        cores: Option<String>,
        /// Only these event types, comma-separated: system event names, the groups
        /// `hardware` and `software`, and `instruction` / `dma` for device events.
        #[arg(long, value_delimiter = ',')]
        types: Option<Vec<String>>,
        /// Start with the events still in the rings instead of new ones only.
        #[arg(long)]
        from_start: bool,
        /// Directory of the runtimes' datastores (default: the per-user directory).
        #[arg(long, env = "NEURON_VIRT_DATASTORE_DIR")]
        datastore_dir: Option<PathBuf>,
    },
}

// As in neuron-bench: mimalloc keeps freed buffers for reuse where glibc's allocator
// returns large ones to the kernel and faults them back in (at every execution of a
// capture, at every batch of the Parquet tables).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    neuron_profiler::exit_quietly_on_closed_pipe();
    let result = match Cli::parse().command {
        Command::Capture(args) => capture::capture(args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Snapshot(args) => snapshot::snapshot(args),
        Command::View(args) => view::view(args),
        Command::Tail { pid, json, cores, types, from_start, datastore_dir } => {
            tail(pid, json, cores.as_deref(), types.as_deref(), from_start, datastore_dir)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The datastore of the live runtime process `pid`, in `dir` or the configured directory.
fn live_runtime(pid: u32, dir: Option<PathBuf>) -> Result<DatastoreReader> {
    let dir = match dir {
        Some(dir) => dir,
        None => Config::from_env().map_err(|e| anyhow::anyhow!("{e}"))?.datastore_dir,
    };
    let entries = discover(&dir).with_context(|| format!("cannot list runtimes in {}", dir.display()))?;
    for entry in entries.into_iter().filter(|e| e.pid == pid) {
        match (entry.reader, entry.liveness) {
            // A stopped or stale one too: the flight recorder of a hung process.
            (Ok(reader), Some(Liveness::Live | Liveness::Stale { .. })) => return Ok(reader),
            (Ok(_), Some(Liveness::Exited(reason))) => bail!("process {pid} has exited ({reason})"),
            (Err(e), _) => bail!("{e}"),
            _ => {}
        }
    }
    bail!("no Neuron runtime with pid {pid} in {}; `neuron-ls` lists the running ones", dir.display())
}

/// System event mask and whether device events are wanted, from `--types`.
fn parse_types(types: Option<&[String]>) -> Result<(u64, bool)> {
    let Some(types) = types else { return Ok((ALL_SYSTEM_EVENTS, true)) };
    let mut device = false;
    let mut system = Vec::new();
    for t in types.iter().map(|t| t.trim()).filter(|t| !t.is_empty()) {
        match t {
            "instruction" | "dma" => device = true,
            other => system.push(other),
        }
    }
    let mask = if system.is_empty() {
        0
    } else {
        neuron_datastore::parse_event_filter(&system.join(",")).map_err(|e| anyhow::anyhow!("--types: {e}"))?
    };
    Ok((mask, device))
}

fn tail(
    pid: u32,
    json: bool,
    cores: Option<&str>,
    types: Option<&[String]>,
    from_start: bool,
    datastore_dir: Option<PathBuf>,
) -> Result<()> {
    let (system_types, device_types) = parse_types(types)?;
    let wanted_device: Option<&'static str> = match types {
        Some(t) if t.iter().any(|x| x == "instruction") && !t.iter().any(|x| x == "dma") => Some("instruction"),
        Some(t) if t.iter().any(|x| x == "dma") && !t.iter().any(|x| x == "instruction") => Some("dma"),
        _ => None,
    };
    let readers = [live_runtime(pid, datastore_dir)?];
    let core_filter: Option<Vec<u32>> = match cores {
        Some(text) => {
            let count = readers[0].info().instance_core_count;
            Some(CoreSet::parse(text, count).map_err(|e| anyhow::anyhow!("--cores {text:?}: {e}"))?.cores().to_vec())
        }
        None => None,
    };
    let start = if from_start { TailStart::Oldest } else { TailStart::Now };
    let mut tails: Vec<_> =
        readers.iter().map(|r| r.tail(start, core_filter.as_deref(), system_types, device_types)).collect();
    let interrupted = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&interrupted);
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed)).context("cannot install the Ctrl-C handler")?;
    let mut events = Vec::new();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    loop {
        let stopping = interrupted.load(Ordering::Relaxed);
        let mut all_done = true;
        for (reader, tail) in readers.iter().zip(&mut tails) {
            let done = matches!(reader.liveness(), Liveness::Exited(_));
            all_done &= done;
            events.clear();
            tail.poll(reader, 65_536, done, &mut events);
            for event in &events {
                print_event(&mut out, event, json, wanted_device)?;
            }
        }
        std::io::Write::flush(&mut out)?;
        if all_done || stopping {
            break;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    let lost: u64 = tails.iter().map(|t| t.lost()).sum();
    let delivered: u64 = tails.iter().map(|t| t.delivered()).sum();
    eprintln!("{lost} events lost ({delivered} read)");
    Ok(())
}

fn print_event(
    out: &mut impl std::io::Write,
    event: &TraceEvent,
    json: bool,
    wanted_device: Option<&str>,
) -> Result<()> {
    if let (TraceEvent::Device(d), Some(wanted)) = (event, wanted_device)
        && d.type_name() != wanted
    {
        return Ok(());
    }
    if json {
        match event {
            TraceEvent::System(e) => serde_json::to_writer(&mut *out, e)?,
            TraceEvent::Device(e) => serde_json::to_writer(&mut *out, e)?,
        }
        writeln!(out)?;
        return Ok(());
    }
    match event {
        TraceEvent::System(e) => {
            let value = serde_json::to_value(e)?;
            let core = e.nc_idx.map_or_else(|| "host".to_string(), |c| format!("nc{c}"));
            let tracking = if e.tracking_id != 0 { format!(" #{}", e.tracking_id) } else { String::new() };
            writeln!(
                out,
                "{:>18} {core:<5} {:<21} {:<7}{tracking} tid={} {}",
                e.timestamp_ns,
                e.event_type.name(),
                e.phase.name(),
                e.thread_id,
                value["data"]
            )?;
        }
        TraceEvent::Device(e) => {
            let value = serde_json::to_value(e)?;
            writeln!(
                out,
                "{:>18} nc{:<3} {:<21} {:>9} ns {}",
                e.start_ns,
                e.nc_idx,
                e.type_name(),
                e.end_ns.saturating_sub(e.start_ns),
                value["data"]
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_datastore::EventType;

    #[test]
    fn types_split_into_system_events_and_device_kinds() {
        let (mask, device) = parse_types(Some(&["nrt_execute".into(), "dma".into()])).expect("valid");
        assert_eq!((mask, device), (EventType::NrtExecute.bit(), true));
        assert!(parse_types(Some(&["nrt_exec".into()])).is_err());
        assert_eq!(parse_types(None).expect("valid"), (ALL_SYSTEM_EVENTS, true));
    }
}
