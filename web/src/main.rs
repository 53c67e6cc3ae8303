//! `neuron-dashboard`: the web dashboard of every Neuron runtime on the host, and a
//! viewer of the profiles in a directory.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use neuron_dashboard::{Dashboard, Options};
use neuron_datastore::config::{parse_duration, parse_listen_address};

/// The web dashboard: live utilisation, memory, latency and errors of every Neuron
/// runtime on this host; their trace events as they happen; and a viewer of NTFF
/// profiles (timeline, summary, per-opcode and per-HLO tables, comparison).
#[derive(Debug, Parser)]
#[command(
    name = "neuron-dashboard",
    version,
    after_help = "\
Security: the dashboard listens on 127.0.0.1 unless told otherwise. Listening on any \
other address needs a token (--token or NEURON_DASHBOARD_TOKEN); every request must then \
carry it (open the page once with ?token=TOKEN, or send Authorization: Bearer TOKEN)."
)]
struct Cli {
    /// Where to listen: HOST:PORT, or a PORT on 127.0.0.1.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3001", value_parser = parse_listen_address)]
    listen: SocketAddr,
    /// A directory of NTFF profiles for the profile viewer (as `neuron-profile capture`
    /// or `inspect` write them).
    #[arg(long, value_name = "DIR")]
    profiles: Option<PathBuf>,
    /// A secret every request must present; required to listen beyond loopback.
    #[arg(long, value_name = "TOKEN", env = "NEURON_DASHBOARD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Time between two live updates (at least 100ms).
    #[arg(long, value_name = "DURATION", default_value = "200ms", value_parser = parse_duration)]
    interval: Duration,
    /// Event streams (open pages) served at once; more are refused with 503.
    #[arg(long, value_name = "N", default_value_t = 128)]
    max_streams: usize,
    /// Where the runtimes' datastores are (default: $XDG_RUNTIME_DIR/neuron-virt, else
    /// /dev/shm/neuron-virt-UID).
    #[arg(long, env = "NEURON_VIRT_DATASTORE_DIR", value_name = "DIR")]
    datastore_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("neuron-dashboard: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let mut options = Options::new(cli.listen)?;
    options.profiles = cli.profiles;
    options.token = cli.token;
    options.interval = cli.interval;
    options.max_streams = cli.max_streams;
    if let Some(dir) = cli.datastore_dir {
        options.datastore_dir = dir;
    }
    let dashboard = Dashboard::start(options)?;
    eprintln!("neuron-dashboard: serving {}", dashboard.url(None));
    dashboard.wait();
    Ok(())
}
