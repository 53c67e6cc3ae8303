//! What went wrong in a profile, which the summary says before its figures: the
//! executions and collectives that failed (how many, and the first failure's status and
//! message) and the long waits for another rank; and the time the traced executions
//! spent inside collectives, which is waiting for the other ranks and moving data
//! between them, not an engine's work.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{ArgValue, NtffFile, Phase, Sym, SystemEvent};

/// The opcodes of a collective's instruction: its time is the rank's wait for the
/// others of its group and the data's passage, not work of the engine it is issued on.
pub const COLLECTIVE_OPCODES: &[&str] = &["AllReduce", "AllGather", "ReduceScatter", "AllToAll"];

/// The executions and collectives that failed, and the long waits for another rank.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Failures {
    /// `nrt_execute` calls that ended with a status.
    pub executions: u64,
    /// `cc_running` collectives that ended with a status.
    pub collectives: u64,
    /// The first error the runtime noted (`hw_notify`), or the first failed call when it
    /// noted none.
    pub first: Option<FirstFailure>,
    /// The ranks this process's ranks waited for past the runtime's warning
    /// (`cc_waiting`), by peer.
    pub long_waits: Vec<LongWait>,
    /// The above for people, one line each (`lines`), as every viewer shows them.
    pub said: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FirstFailure {
    pub core: Option<u32>,
    /// The `NRT_STATUS` code.
    pub status: i64,
    /// The runtime's message (empty when the file has only the status).
    pub message: String,
    /// Host time from the profile's first event.
    pub at_s: f64,
}

/// Waits for one rank past the runtime's warning.
#[derive(Debug, Clone, Serialize)]
pub struct LongWait {
    /// The rank waited for.
    pub peer: u32,
    /// The collectives that waited for it that long.
    pub count: u64,
    /// The longest of those waits when it was noted, in seconds.
    pub longest_s: f64,
}

/// The traced executions' time inside collectives.
#[derive(Debug, Clone, Serialize)]
pub struct InCollectives {
    pub instructions: u64,
    pub time_s: f64,
    /// Of the device time.
    pub percent: f64,
    /// Their HLO instructions, by time.
    pub hlos: Vec<String>,
}

impl Failures {
    /// Whether anything failed or waited long.
    pub fn any(&self) -> bool {
        self.executions > 0 || self.collectives > 0 || !self.long_waits.is_empty()
    }

    /// One line per kind of trouble, the first failure first, for people.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(f) = &self.first {
            let core = f.core.map_or_else(String::new, |c| format!(" on nc{c}"));
            let message = if f.message.is_empty() { String::new() } else { format!(": {}", f.message) };
            lines.push(format!("first failure{core}, {:.3} s into the profile: status {}{message}", f.at_s, f.status));
        }
        if self.executions > 0 || self.collectives > 0 {
            lines.push(format!(
                "{} failed execution{}, {} failed collective{}",
                self.executions,
                if self.executions == 1 { "" } else { "s" },
                self.collectives,
                if self.collectives == 1 { "" } else { "s" }
            ));
        }
        for w in &self.long_waits {
            lines.push(format!(
                "waited long for rank {} in {} collective{} (the longest {:.1} s when noted): that rank was late or gone",
                w.peer,
                w.count,
                if w.count == 1 { "" } else { "s" },
                w.longest_s
            ));
        }
        lines
    }
}

/// Gathers [`Failures`] from a file's system events.
pub(super) struct Gatherer {
    status: Option<Sym>,
    message: Option<Sym>,
    peer: Option<Sym>,
    waited: Option<Sym>,
    notify: Option<Sym>,
    collective: Option<Sym>,
    waiting: Option<Sym>,
    failures: Failures,
    /// The first failed call, until an `hw_notify` names the error.
    first_call: Option<(u64, FirstFailure)>,
    first_notify: Option<(u64, FirstFailure)>,
    waits: BTreeMap<u32, (u64, u64)>,
}

impl Gatherer {
    pub(super) fn new(file: &NtffFile) -> Gatherer {
        Gatherer {
            status: file.find_string("status"),
            message: file.find_string("message"),
            peer: file.find_string("peer"),
            waited: file.find_string("waited_ns"),
            notify: file.find_string("hw_notify"),
            collective: file.find_string("cc_running"),
            waiting: file.find_string("cc_waiting"),
            failures: Failures::default(),
            first_call: None,
            first_notify: None,
            waits: BTreeMap::new(),
        }
    }

    fn arg(e: &SystemEvent, key: Option<Sym>) -> Option<ArgValue> {
        let key = key?;
        e.args.iter().find(|a| a.key == key).map(|a| a.value)
    }

    fn number(e: &SystemEvent, key: Option<Sym>) -> Option<i64> {
        match Gatherer::arg(e, key)? {
            ArgValue::I64(v) => Some(v),
            ArgValue::U64(v) => i64::try_from(v).ok(),
            ArgValue::Str(_) => None,
        }
    }

    /// Notes a system event; `execute` says whether it is `nrt_execute`.
    pub(super) fn system(&mut self, file: &NtffFile, e: &SystemEvent, execute: bool) {
        let failure = |status: i64, message: String| FirstFailure { core: e.core, status, message, at_s: 0.0 };
        let earlier = |first: &Option<(u64, FirstFailure)>| first.as_ref().is_none_or(|(t, _)| e.timestamp_ns < *t);
        if e.phase == Phase::Stop
            && (execute || Some(e.name) == self.collective)
            && let Some(status) = Gatherer::number(e, self.status).filter(|&s| s != 0)
        {
            if execute {
                self.failures.executions += 1;
            } else {
                self.failures.collectives += 1;
            }
            if earlier(&self.first_call) {
                self.first_call = Some((e.timestamp_ns, failure(status, String::new())));
            }
        } else if Some(e.name) == self.notify
            && let Some(status) = Gatherer::number(e, self.status).filter(|&s| s != 0)
            && earlier(&self.first_notify)
        {
            let message = match Gatherer::arg(e, self.message) {
                Some(ArgValue::Str(sym)) => file.string_or_placeholder(sym).into_owned(),
                _ => String::new(),
            };
            self.first_notify = Some((e.timestamp_ns, failure(status, message)));
        } else if Some(e.name) == self.waiting
            && let Some(peer) = Gatherer::number(e, self.peer).and_then(|p| u32::try_from(p).ok())
        {
            let waited = Gatherer::number(e, self.waited).unwrap_or(0).max(0) as u64;
            let w = self.waits.entry(peer).or_default();
            w.0 += 1;
            w.1 = w.1.max(waited);
        }
    }

    /// The failures, with times from `first_ns`, the profile's first event.
    pub(super) fn finish(self, first_ns: u64) -> Failures {
        let mut failures = self.failures;
        failures.first = self
            .first_notify
            .or(self.first_call)
            .map(|(t, f)| FirstFailure { at_s: t.saturating_sub(first_ns) as f64 / 1e9, ..f });
        failures.long_waits = self
            .waits
            .into_iter()
            .map(|(peer, (count, ns))| LongWait { peer, count, longest_s: ns as f64 / 1e9 })
            .collect();
        failures.said = failures.lines();
        failures
    }
}
