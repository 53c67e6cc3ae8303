//! `neuron-top`: every Neuron runtime on the host in a terminal, refreshed each second.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use neuron_datastore::config::{ReaderConfig, parse_duration};
use neuron_datastore::sample::Collector;
use neuron_top::state::State;
use neuron_top::view::{self, Theme};
use neuron_top::{input, term};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{self, Event};

/// Every Neuron runtime on this host: NeuronCore utilisation, latency, errors, memory,
/// vCPU and trace loss, refreshed every second. Press ? for the keys.
#[derive(Debug, Parser)]
#[command(name = "neuron-top", version)]
struct Cli {
    /// Time between looks: 500ms, 1s, 2s…
    #[arg(short = 'd', long, value_name = "DURATION", default_value = "1s", value_parser = refresh)]
    refresh: Duration,
    /// Print one frame as plain text on stdout and exit (no terminal needed).
    #[arg(long, conflicts_with = "json")]
    once: bool,
    /// Print one snapshot of everything shown as JSON on stdout and exit.
    #[arg(long)]
    json: bool,
    /// Start on the Ranks tab (with --once: print it): every communicator's ranks,
    /// the straggler and any hang.
    #[arg(long)]
    ranks: bool,
    /// No colours (also when NO_COLOR is set).
    #[arg(long)]
    no_color: bool,
    /// Directory of the runtimes' datastores (default: the per-user directory).
    #[arg(long, env = "NEURON_VIRT_DATASTORE_DIR", value_name = "DIR")]
    datastore_dir: Option<PathBuf>,
}

fn refresh(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(100) {
        return Err(format!("{text} is too short; the refresh is at least 100ms"));
    }
    Ok(d)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("neuron-top: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<()> {
    // The directory, and the instance shown when no runtime is there to say which it
    // runs on.
    let config = ReaderConfig::from_env()?;
    let dir = cli.datastore_dir.clone().unwrap_or(config.datastore_dir);
    let mut collector = Collector::new(dir, config.instance_type.topology());
    let color = !cli.no_color && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let theme = Theme { color };
    if cli.once || cli.json {
        // Two looks, so that rates have an interval.
        collector.sample();
        std::thread::sleep(cli.refresh);
        let mut state = State::new(collector.sample());
        state.refresh = cli.refresh;
        if cli.ranks {
            state.apply(input::Action::RanksTab);
        }
        let text = if cli.json {
            serde_json::to_string_pretty(&state.snapshot)? + "\n"
        } else if cli.ranks && state.snapshot.ranks.is_empty() {
            // No Ranks tab to print: say why instead of printing another.
            let runtimes = state.snapshot.runtimes.len();
            format!(
                "{} ({runtimes} runtime{} running)\n",
                view::ranks::NO_COMMUNICATOR,
                if runtimes == 1 { "" } else { "s" }
            )
        } else {
            plain_frame(&state, Theme { color: false })?
        };
        return match std::io::stdout().lock().write_all(text.as_bytes()) {
            // The reader went away (`neuron-top --json | head`): nothing left to do.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => other.context("cannot write to stdout"),
        };
    }
    let mut screen = term::enter().context("cannot take over the terminal")?;
    term::leave_on_termination().context("cannot handle termination signals")?;
    let result = interactive(&mut screen, &mut collector, (cli.refresh, cli.ranks), theme);
    term::leave();
    result
}

/// The screen as text, at the terminal's size if there is one, else 120×40.
fn plain_frame(state: &State, theme: Theme) -> Result<String> {
    let (width, height) = match ratatui::crossterm::terminal::size() {
        Ok((width, height)) if width > 0 && height > 0 => (width, height),
        _ => (120, 40),
    };
    let mut terminal = Terminal::new(TestBackend::new(width, height))?;
    terminal.draw(|frame| view::draw(frame, state, theme))?;
    let buffer = terminal.backend().buffer();
    let mut text = String::new();
    for y in 0..buffer.area.height {
        let line: String = (0..buffer.area.width).map(|x| buffer[(x, y)].symbol()).collect();
        text.push_str(line.trim_end());
        text.push('\n');
    }
    Ok(text)
}

/// Redraws when a key changes the state, the terminal is resized, or a look brings
/// new data; sleeps in between.
fn interactive(
    terminal: &mut term::Screen,
    collector: &mut Collector,
    (refresh, ranks): (Duration, bool),
    theme: Theme,
) -> Result<()> {
    let mut state = State::new(collector.sample());
    state.refresh = refresh;
    if ranks {
        state.apply(input::Action::RanksTab);
    }
    let mut next_look = Instant::now() + refresh;
    let mut dirty = true;
    loop {
        if dirty {
            terminal.draw(|frame| view::draw(frame, &state, theme)).context("cannot draw")?;
            dirty = false;
        }
        if event::poll(next_look.saturating_duration_since(Instant::now()))? {
            match event::read()? {
                Event::Key(key) => {
                    if let Some(action) = input::action(key) {
                        state.apply(action);
                        dirty = true;
                    }
                }
                Event::Resize(..) => dirty = true,
                _ => {}
            }
            if state.quit {
                return Ok(());
            }
        } else {
            let snapshot = collector.sample();
            dirty = snapshot != state.snapshot;
            state.update(snapshot);
            next_look = Instant::now() + refresh;
        }
    }
}
