//! The terminal: raw mode and the alternate screen while `neuron-top` runs, and the
//! terminal given back as it was on every way out, a panic included.

use std::io::{Stdout, stdout};

use nix::sys::signal::{SigSet, Signal};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::cursor::Show;
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode};

pub type Screen = Terminal<CrosstermBackend<Stdout>>;

/// Takes the terminal over; a panic from here on first gives it back. Mouse capture
/// stays off, so the terminal's own selection keeps working.
pub fn enter() -> std::io::Result<Screen> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        leave();
        previous(info);
    }));
    enable_raw_mode()?;
    if let Err(e) = execute!(stdout(), EnterAlternateScreen) {
        leave();
        return Err(e);
    }
    Terminal::new(CrosstermBackend::new(stdout())).inspect_err(|_| leave())
}

/// Gives the terminal back: cursor shown, main screen, cooked mode. Safe to call twice.
pub fn leave() {
    let _ = execute!(stdout(), Show, LeaveAlternateScreen);
    let _ = disable_raw_mode();
}

/// Gives the terminal back before exiting when the process is told to end (SIGTERM,
/// SIGHUP, or SIGINT sent from elsewhere: Ctrl-C itself arrives as a key in raw mode).
/// The signals are blocked in this thread, and so in the threads it starts, and a
/// thread of their own waits for them. Call before starting other threads.
pub fn leave_on_termination() -> std::io::Result<()> {
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGINT] {
        signals.add(signal);
    }
    signals.thread_block()?;
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        if let Ok(signal) = signals.wait() {
            leave();
            std::process::exit(128 + signal as i32);
        }
    })?;
    Ok(())
}
