//! Whether a runtime's writer is there: the rule every tool applies to a datastore
//! (`datastore/FORMAT.md`, "Liveness").

use std::time::Duration;

use crate::directory;

/// A writer whose heartbeat is older than this, while its process is still there, is
/// reported stale (or stopped); only a process that is gone is reported exited.
pub const HEARTBEAT_STALE_AFTER: Duration = Duration::from_secs(10);

/// Whether the writing process is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Live,
    /// The process is there (same pid and start time) but its heartbeat is
    /// `seconds` old: `stopped` (Ctrl-Z, SIGSTOP, a debugger), or not scheduled (heavy
    /// swap, a frozen cgroup). It keeps its cores and its file, and is live again when
    /// it resumes.
    Stale {
        seconds: u64,
        stopped: bool,
    },
    Exited(ExitReason),
}

impl Liveness {
    /// The word tools show: `live`, `stopped`, `stale` or `exited`.
    pub fn word(&self) -> &'static str {
        match self {
            Liveness::Live => "live",
            Liveness::Stale { stopped: true, .. } => "stopped",
            Liveness::Stale { stopped: false, .. } => "stale",
            Liveness::Exited(_) => "exited",
        }
    }

    /// The rule, from what was observed: the datastore's state says `closed`; `process`
    /// is the writer's pid's status (`None`: no such process); `recorded_start` is the
    /// start time the writer recorded (0: unknown); `heartbeat_age_ns` is the age of
    /// its latest heartbeat.
    pub fn of(
        closed: bool,
        process: Option<directory::ProcessStatus>,
        recorded_start: u64,
        heartbeat_age_ns: u64,
    ) -> Liveness {
        if closed {
            return Liveness::Exited(ExitReason::Closed);
        }
        let Some(process) = process else { return Liveness::Exited(ExitReason::ProcessGone) };
        if recorded_start != 0 && process.start_ticks != recorded_start {
            return Liveness::Exited(ExitReason::PidReused);
        }
        // Exited, not yet reaped by its parent: gone for every purpose of a tool.
        if matches!(process.state, 'Z' | 'X' | 'x') {
            return Liveness::Exited(ExitReason::ProcessGone);
        }
        if heartbeat_age_ns > HEARTBEAT_STALE_AFTER.as_nanos() as u64 {
            let stopped = matches!(process.state, 'T' | 't');
            return Liveness::Stale { seconds: heartbeat_age_ns / 1_000_000_000, stopped };
        }
        Liveness::Live
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// The runtime closed cleanly.
    Closed,
    /// No process has the pid any more.
    ProcessGone,
    /// Another process now has the pid.
    PidReused,
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitReason::Closed => f.write_str("closed"),
            ExitReason::ProcessGone => f.write_str("process gone"),
            ExitReason::PidReused => f.write_str("pid reused by another process"),
        }
    }
}
