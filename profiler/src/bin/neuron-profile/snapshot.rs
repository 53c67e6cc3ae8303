//! `neuron-profile snapshot`: the flight recorder. Copies what a running process's
//! trace rings hold now into an NTFF file. The rings are shared memory the process
//! keeps writing; reading them takes nothing from it (no lock, no signal, no pause).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, anyhow};
use clap::Args;
use neuron_datastore::{ALL_SYSTEM_EVENTS, EventData, EventType};
use neuron_datastore::{TailStart, TraceEvent};
use neuron_record::{Recorder, create_writer, metadata};

use crate::live_runtime;

#[derive(Debug, Args)]
pub(crate) struct SnapshotArgs {
    /// The runtime process (`neuron-ls` lists them).
    pid: u32,
    /// The NTFF file to write (default: `snapshot-PID.ntff`).
    #[arg(short = 'o', long, value_name = "OUT.ntff")]
    output: Option<PathBuf>,
    /// Only the events of the last DURATION (e.g. 10s, 500ms); default: all the rings hold.
    #[arg(long, value_name = "DURATION", value_parser = neuron_datastore::config::parse_duration)]
    last: Option<Duration>,
    /// Directory of the runtimes' datastores (default: the per-user directory).
    #[arg(long, env = "NEURON_VIRT_DATASTORE_DIR")]
    datastore_dir: Option<PathBuf>,
}

pub(crate) fn snapshot(args: SnapshotArgs) -> Result<()> {
    let reader = live_runtime(args.pid, args.datastore_dir)?;
    let now = neuron_datastore::clock::monotonic_ns();
    let since = args.last.map(|d| now.saturating_sub(d.as_nanos() as u64));
    // Device clocks are aligned through the sync points the rings hold, read first.
    let mut offsets: HashMap<u32, i64> = HashMap::new();
    if since.is_some() {
        let mut tail = reader.tail(TailStart::Oldest, None, EventType::TimestampSyncPoint.bit(), false);
        let mut events = Vec::new();
        tail.poll(&reader, usize::MAX, false, &mut events);
        for event in events {
            if let TraceEvent::System(e) = event
                && let (EventData::SyncPoint { cpu_timestamp_ns, nc_timestamp_ns }, Some(core)) = (e.data, e.nc_idx)
            {
                offsets.insert(core, cpu_timestamp_ns as i64 - nc_timestamp_ns as i64);
            }
        }
    }
    let output = args.output.unwrap_or_else(|| PathBuf::from(format!("snapshot-{}.ntff", args.pid)));
    let command = std::env::args().collect::<Vec<_>>();
    let mut recorder = Recorder::new(create_writer(
        &output,
        &metadata(reader.info(), neuron_profiler::PROFILE_TOOL, "snapshot", &command),
    )?);
    recorder.models(&reader.models(), &|_| String::new())?;
    if let Some(since) = since {
        recorder.keep_only(move |event| match event {
            TraceEvent::System(e) => match e.clock {
                neuron_datastore::ClockDomain::Host => e.timestamp_ns >= since,
                neuron_datastore::ClockDomain::Device => device_since(&offsets, e.nc_idx, e.timestamp_ns, since),
            },
            TraceEvent::Device(e) => device_since(&offsets, Some(e.nc_idx), e.end_ns, since),
        });
    }
    let mut tail = reader.tail(TailStart::Oldest, None, ALL_SYSTEM_EVENTS, true);
    recorder.drain(&reader, &mut tail, false)?;
    let (file, summary) = recorder.finish().map_err(|e| anyhow!("{e:#}"))?;
    file.place()?;
    eprintln!(
        "wrote {} system events and {} device events of pid {} to {} ({} bytes); {} events were overwritten while reading",
        summary.system_events,
        summary.device_events,
        args.pid,
        output.display(),
        summary.bytes,
        summary.lost_events
    );
    Ok(())
}

/// Whether device time `t` of `core` is at or after host time `since` (kept when the
/// core has no sync point to tell).
fn device_since(offsets: &HashMap<u32, i64>, core: Option<u32>, t: u64, since: u64) -> bool {
    match core.and_then(|c| offsets.get(&c)) {
        Some(&offset) => (t as i64).saturating_add(offset) >= since as i64,
        None => true,
    }
}
