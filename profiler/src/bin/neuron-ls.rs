//! `neuron-ls`: the instance's Neuron devices and cores, and which runtime process holds
//! which core, read from the runtimes' datastores.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use neuron_datastore::topology::Topology;
use neuron_datastore::{Liveness, RuntimeEntry, discover};
use neuron_runtime::Config;
use neuron_runtime::memory::HumanBytes;
use serde::Serialize;

/// List Neuron devices, their NeuronCores and memory, and the runtime processes using
/// them (live, or exited since the last look; an exited runtime's datastore is removed).
#[derive(Debug, Parser)]
#[command(name = "neuron-ls", version)]
struct Cli {
    /// Print JSON: one object per device, with the processes holding its cores.
    #[arg(long, short = 'j')]
    json_output: bool,
    /// Directory of the runtimes' datastores (default: the per-user directory).
    #[arg(long, env = "NEURON_VIRT_DATASTORE_DIR")]
    datastore_dir: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Device {
    neuron_device: u32,
    nc_count: u32,
    memory_size: u64,
    neuron_processes: Vec<Process>,
}

#[derive(Debug, Clone, Serialize)]
struct Process {
    pid: u32,
    tag: Option<String>,
    /// The command's name (the script's for an interpreter).
    command_name: String,
    /// The command line, quoted as a shell takes it.
    command: String,
    /// `live`, `stopped` or `stale` (the process is there but its heartbeat is old; it
    /// keeps its cores), or `exited`.
    state: &'static str,
    /// Why it is stale or exited.
    exit_reason: Option<String>,
    /// The global indexes of the cores it holds on this device.
    cores: Vec<u32>,
    /// The collectives rank each of those cores runs, where it runs one (in a job of
    /// processes, its global rank).
    ranks: Vec<CoreRank>,
    neuron_runtime_version: String,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct CoreRank {
    core: u32,
    rank: u32,
    /// The communicator's rank count.
    ranks: u32,
}

fn main() -> ExitCode {
    neuron_profiler::exit_quietly_on_closed_pipe();
    match run(&Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<()> {
    let config = Config::from_env().map_err(|e| anyhow::anyhow!("{e}"))?;
    let dir = cli.datastore_dir.clone().unwrap_or(config.datastore_dir);
    let entries = discover(&dir).with_context(|| format!("cannot list runtimes in {}", dir.display()))?;
    // The instance the runtimes run on, as they say; this process's configuration when
    // none runs.
    let declared = entries.iter().filter_map(|e| e.reader.as_ref().ok()).map(|r| r.info().instance_type.as_str());
    let topology = Topology::declared(declared).unwrap_or_else(|| config.instance_type.topology());
    let mut problems = Vec::new();
    let runtimes: Vec<(Vec<u32>, Process)> = entries
        .iter()
        .filter_map(|entry| match process(entry) {
            Ok(p) => Some(p),
            Err(e) => {
                problems.push(e);
                None
            }
        })
        .collect();
    let per_device = topology.cores_per_device();
    let devices: Vec<Device> = (0..topology.device_count)
        .map(|d| {
            let on_device = |c: &u32| c / per_device == d;
            Device {
                neuron_device: d,
                nc_count: per_device,
                memory_size: topology.device_memory_bytes,
                neuron_processes: runtimes
                    .iter()
                    .filter(|(cores, _)| cores.iter().any(on_device))
                    .map(|(cores, p)| Process {
                        cores: cores.iter().copied().filter(on_device).collect(),
                        ranks: p.ranks.iter().copied().filter(|r| on_device(&r.core)).collect(),
                        ..p.clone()
                    })
                    .collect(),
            }
        })
        .collect();
    if cli.json_output {
        println!("{}", serde_json::to_string_pretty(&devices)?);
    } else {
        print_table(&topology.instance_type.to_string(), &devices);
        for (_, p) in &runtimes {
            println!("{:>8}  {}", p.pid, printable(&p.command));
        }
    }
    for problem in problems {
        eprintln!("warning: {problem}");
    }
    Ok(())
}

fn process(entry: &RuntimeEntry) -> Result<(Vec<u32>, Process), String> {
    let reader = entry.reader.as_ref().map_err(|e| e.to_string())?;
    let info = reader.info();
    let (state, exit_reason) = match entry.liveness {
        Some(Liveness::Exited(reason)) => ("exited", Some(reason.to_string())),
        Some(l @ Liveness::Stale { seconds, .. }) => (l.word(), Some(format!("no heartbeat for {seconds} s"))),
        _ => ("live", None),
    };
    let snapshot = reader.snapshot();
    let ranks =
        snapshot.cores.iter().filter_map(|c| Some(CoreRank { core: c.core, rank: c.rank?, ranks: c.ranks })).collect();
    Ok((
        info.cores.clone(),
        Process {
            pid: info.pid,
            tag: info.tag.clone(),
            command_name: info.command.name.clone(),
            command: info.command.shell_line(),
            state,
            exit_reason,
            cores: info.cores.clone(),
            ranks,
            neuron_runtime_version: info.runtime_version.clone(),
        },
    ))
}

fn print_table(instance_type: &str, devices: &[Device]) {
    let rows: Vec<(&Device, Vec<String>)> = devices
        .iter()
        .map(|device| {
            let processes = device
                .neuron_processes
                .iter()
                .map(|p| {
                    let cores: Vec<String> = p
                        .cores
                        .iter()
                        .map(|&c| match p.ranks.iter().find(|r| r.core == c) {
                            Some(r) => format!("nc{c}(rank {}/{})", r.rank, r.ranks),
                            None => format!("nc{c}"),
                        })
                        .collect();
                    let state = match &p.exit_reason {
                        Some(reason) => format!("{}: {reason}", p.state),
                        None => p.state.to_string(),
                    };
                    let name =
                        p.tag.as_deref().unwrap_or(if p.command_name.is_empty() { "-" } else { &p.command_name });
                    format!("{} {} {} {}", p.pid, printable(name), cores.join(","), state)
                })
                .collect();
            (device, processes)
        })
        .collect();
    // The processes column is as wide as its longest line, 50 at least.
    let width = rows.iter().flat_map(|(_, p)| p.iter().map(|l| l.chars().count())).max().unwrap_or(0).max(50);
    println!("instance-type: {instance_type}");
    let rule = format!("+{:-<8}+{:-<8}+{:-<10}+{:-<w$}+", "", "", "", "", w = width + 2);
    println!("{rule}");
    println!("| {:<6} | {:<6} | {:<8} | {:<width$} |", "NEURON", "NEURON", "NEURON", "PROCESSES");
    println!("| {:<6} | {:<6} | {:<8} | {:<width$} |", "DEVICE", "CORES", "MEMORY", "(PID NAME CORES STATE)");
    println!("{rule}");
    for (device, processes) in &rows {
        let memory = HumanBytes(device.memory_size).to_string();
        let first = processes.first().map_or("", String::as_str);
        println!("| {:<6} | {:<6} | {:<8} | {:<width$} |", device.neuron_device, device.nc_count, memory, first);
        for more in processes.iter().skip(1) {
            println!("| {:<6} | {:<6} | {:<8} | {:<width$} |", "", "", "", more);
        }
    }
    println!("{rule}");
}

/// `text` with its control characters escaped (`\u{1b}`), so that a process's tag or
/// command line cannot drive the terminal or break the table.
fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_in_a_tag_are_shown_escaped() {
        assert_eq!(super::printable("job\u{1b}[2J\0x\ty"), "job\\u{1b}[2J\\u{0}x\\ty");
        assert_eq!(super::printable("train.py 🚀"), "train.py 🚀");
    }
}
