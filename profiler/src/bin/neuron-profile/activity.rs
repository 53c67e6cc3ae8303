//! What a rank was doing before it arrived at its collectives, from its own profile: for
//! each collective after its first, the time from its previous collective's end (its
//! departure) to its arrival, split into its NeuronCore executing (with each engine's
//! busy time), the runtime's calls outside an execution, and neither (the program's own
//! host work, or waiting for its inputs). Medians over the collectives, on the job's
//! clock.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use neuron_datastore::ranks::format_ns;
use ntff::{Clock, Descriptor, NtffFile, Phase, RootClock};
use serde::Serialize;

/// The opcodes of the collectives' own instructions (the runtime's ISA names).
const COLLECTIVE_OPCODES: [&str; 4] = ["AllReduce", "AllGather", "ReduceScatter", "AllToAll"];
/// The pseudo-engine their time is kept under.
const COLLECTIVE: &str = "collective";

/// A rank's time before its arrivals, medians over `collectives`, in nanoseconds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BeforeArrival {
    pub(crate) collectives: usize,
    /// From its previous collective's end to its arrival.
    pub(crate) since_previous_ns: u64,
    /// Its NeuronCore executing.
    pub(crate) executing_ns: u64,
    /// The busiest engines then, most first (at most three), the collectives' own
    /// instructions left out.
    pub(crate) engines: Vec<(String, u64)>,
    /// In its collective's own instruction before it arrived (a rank arrives when the
    /// instruction reaches the exchange).
    pub(crate) in_collective_ns: u64,
    /// In runtime calls (`nrt_*`), not executing.
    pub(crate) in_calls_ns: u64,
    /// Neither executing nor in a runtime call.
    pub(crate) neither_ns: u64,
}

impl BeforeArrival {
    /// For people: `21.3 ms since its previous collective: 20.9 ms executing (PE 15.1
    /// ms, ACT 3.2 ms), 0.2 ms in runtime calls, 0.2 ms in neither`.
    pub(crate) fn text(&self) -> String {
        let mut inside: Vec<String> = self.engines.iter().map(|(e, ns)| format!("{e} {}", format_ns(*ns))).collect();
        if self.in_collective_ns > 0 {
            inside.push(format!(
                "{} in the collective's own instruction before it arrived",
                format_ns(self.in_collective_ns)
            ));
        }
        // The cause, in the live tools' words: the largest of the three.
        let cause = if self.neither_ns >= self.executing_ns.max(self.in_calls_ns) {
            "host time (its program between the runtime's calls: data loading, Python)"
        } else if self.in_calls_ns >= self.executing_ns {
            "host time in the runtime's calls"
        } else {
            "device time (its executions)"
        };
        format!(
            "{} since its previous collective: {} executing{}, {} in runtime calls, {} in neither: mostly {cause}",
            format_ns(self.since_previous_ns),
            format_ns(self.executing_ns),
            match (inside.is_empty(), self.executing_ns) {
                (true, 0) => String::new(),
                (true, _) => " (no instruction running)".to_owned(),
                (false, _) => format!(" ({})", inside.join(", ")),
            },
            format_ns(self.in_calls_ns),
            format_ns(self.neither_ns)
        )
    }
}

/// Sorted, non-overlapping intervals.
#[derive(Debug, Default)]
struct Union(Vec<(u64, u64)>);

impl Union {
    fn of(mut spans: Vec<(u64, u64)>) -> Union {
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
        for (a, b) in spans {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        Union(merged)
    }

    /// Its time within `[a, b)`.
    fn within(&self, a: u64, b: u64) -> u64 {
        let first = self.0.partition_point(|s| s.1 <= a);
        self.0[first..].iter().take_while(|s| s.0 < b).map(|s| s.1.min(b).saturating_sub(s.0.max(a))).sum()
    }

    fn extend(&self, other: &Union) -> Union {
        Union::of(self.0.iter().chain(&other.0).copied().collect())
    }
}

fn median(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

/// What the profile at `path` (its host clock onto the job's by `root`) shows of the
/// rank before each of `gaps` (its previous departure and its arrival, on the job's
/// clock); `None` without any gap.
pub(crate) fn before_arrivals(path: &Path, root: &RootClock, gaps: &[(u64, u64)]) -> Result<Option<BeforeArrival>> {
    if gaps.is_empty() {
        return Ok(None);
    }
    let file = NtffFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let clocks: HashMap<u32, ntff::SyncClock> =
        file.core_clocks(None).into_iter().map(|(core, c)| (core, c.map_host(|t| root.to_root(t)))).collect();
    let running = file.find_string("nc_exec_running");
    // Each instruction's engine, or `COLLECTIVE` for the collectives' own.
    let engine_of: Vec<Option<String>> = file
        .descriptors()
        .iter()
        .map(|d| match d {
            Some(Descriptor::Instruction { opcode, .. })
                if file.string(*opcode).is_some_and(|o| COLLECTIVE_OPCODES.contains(&o)) =>
            {
                Some(COLLECTIVE.to_owned())
            }
            Some(Descriptor::Instruction { engine, .. }) => Some(file.string_or_placeholder(*engine).into_owned()),
            _ => None,
        })
        .collect();
    let (mut executing, mut calls) = (Vec::new(), Vec::new());
    let mut engines: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    let mut open: HashMap<(Option<u32>, u64, u32), u64> = HashMap::new();
    let infos = file.chunks().to_vec();
    file.for_each_chunk(&infos, 2, |_, chunk| -> Result<()> {
        let Ok(chunk) = chunk else { return Ok(()) };
        for e in &chunk.system {
            let at = match e.clock {
                Clock::Host => Some(root.to_root(e.timestamp_ns)),
                Clock::Device => e.core.and_then(|c| clocks.get(&c)).and_then(|c| c.to_host(e.timestamp_ns)),
            };
            let Some(at) = at else { continue };
            let key = (e.core, e.tracking_id, e.name.0);
            match e.phase {
                Phase::Start => {
                    open.insert(key, at);
                }
                Phase::Stop => {
                    let Some(start) = open.remove(&key) else { continue };
                    if Some(e.name) == running {
                        executing.push((start, at.max(start)));
                    } else if file.string(e.name).is_some_and(|n| n.starts_with("nrt_")) {
                        calls.push((start, at.max(start)));
                    }
                }
                Phase::Instant => {}
            }
        }
        let Some(clock) = chunk.core.and_then(|c| clocks.get(&c)) else { return Ok(()) };
        for d in &chunk.device {
            let Some(Some(engine)) = engine_of.get(d.descriptor.0 as usize) else { continue };
            if let (Some(a), Some(b)) = (clock.to_host(d.start_ns), clock.to_host(d.end_ns)) {
                engines.entry(engine.as_str()).or_default().push((a, b.max(a)));
            }
        }
        Ok(())
    })?;
    let executing = Union::of(executing);
    let busy = executing.extend(&Union::of(calls));
    let engines: Vec<(&str, Union)> = engines.into_iter().map(|(e, spans)| (e, Union::of(spans))).collect();
    let per_gap = |f: &dyn Fn(u64, u64) -> u64| median(gaps.iter().map(|&(a, b)| f(a, b)).collect());
    let executing_ns = per_gap(&|a, b| executing.within(a, b));
    let in_collective_ns =
        engines.iter().find(|(e, _)| *e == COLLECTIVE).map_or(0, |(_, u)| per_gap(&|a, b| u.within(a, b)));
    let mut busiest: Vec<(String, u64)> = engines
        .iter()
        .filter(|(e, _)| *e != COLLECTIVE)
        .map(|(e, u)| (e.to_string(), per_gap(&|a, b| u.within(a, b))))
        .filter(|e| e.1 > 0)
        .collect();
    busiest.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    busiest.truncate(3);
    Ok(Some(BeforeArrival {
        collectives: gaps.len(),
        since_previous_ns: per_gap(&|a, b| b - a),
        executing_ns,
        engines: busiest,
        in_collective_ns,
        in_calls_ns: per_gap(&|a, b| busy.within(a, b) - executing.within(a, b)),
        neither_ns: per_gap(&|a, b| (b - a) - busy.within(a, b)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_union_measures_what_it_covers_of_a_range() {
        let u = Union::of(vec![(10, 20), (15, 30), (40, 50), (45, 46)]);
        assert_eq!(u.0, [(10, 30), (40, 50)]);
        assert_eq!(u.within(0, 100), 30);
        assert_eq!(u.within(25, 45), 10);
        assert_eq!(u.within(30, 40), 0);
        assert_eq!(median(vec![5, 1, 3]), 3);
    }
}
