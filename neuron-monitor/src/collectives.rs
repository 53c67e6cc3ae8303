//! The `collectives` group (a `system_metrics` group of ours): every communicator the
//! followed runtimes take part in, as their flight records show it
//! (`neuron_datastore::ranks`: the same rules as `neuron-top` and the dashboard), and
//! the counts behind its Prometheus series.
//!
//! Each look counts the complete collectives it has not counted before: each rank's
//! wait, the group's skew, the last arriver. A rank's record holds its last 32
//! collectives, so a job running more than 32 collectives per look is sampled, and
//! the report says how many were seen.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use neuron_datastore::flight::Position;
use neuron_datastore::histogram;
use neuron_datastore::ranks::{GroupView, StragglerRule};

/// Collectives remembered as counted, per communicator (more than any record holds).
const REMEMBERED: usize = 4096;

/// Durations counted in the datastore's fine histogram buckets (at most 1/32 wide),
/// as the runtime counts latencies, so that the exposition turns both into its buckets
/// the same way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observations {
    pub buckets: Vec<u64>,
}

impl Observations {
    fn observe(&mut self, ns: u64) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; histogram::BUCKETS];
        }
        self.buckets[histogram::bucket_of(ns)] += 1;
    }

    /// How many were counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// What the monitor counted of one communicator since it began following it.
#[derive(Debug, Clone, Default)]
pub struct CommunicatorTally {
    pub name: String,
    /// Each rank's wait per collective, by rank.
    pub waits: BTreeMap<u32, Observations>,
    /// The group's skew (last arrival minus first) per collective.
    pub skew: Observations,
    /// Collectives each rank arrived last in (beyond the clocks' uncertainty), by rank.
    pub arrived_last: BTreeMap<u32, u64>,
    /// Complete collectives counted.
    pub seen: u64,
    counted: BTreeSet<(Position, u16)>,
}

/// The tallies of every communicator seen, by id, and the latest views.
#[derive(Debug, Default)]
pub struct Tally {
    pub communicators: BTreeMap<u32, CommunicatorTally>,
    pub views: Vec<GroupView>,
}

impl Tally {
    /// Counts what `views` show that was not counted before, and keeps them.
    pub fn observe(&mut self, views: Vec<GroupView>) {
        for view in &views {
            let tally = self.communicators.entry(view.id).or_default();
            tally.name.clone_from(&view.name);
            for c in view.collectives.iter().filter(|c| c.complete) {
                if !tally.counted.insert((c.position, c.group)) {
                    continue;
                }
                tally.seen += 1;
                tally.skew.observe(c.skew_ns);
                for &(rank, wait) in &c.waits_ns {
                    tally.waits.entry(rank).or_default().observe(wait);
                }
                if let Some(last) = c.last {
                    *tally.arrived_last.entry(last).or_default() += 1;
                }
            }
            while tally.counted.len() > REMEMBERED {
                tally.counted.pop_first();
            }
        }
        self.views = views;
    }
}

/// The `collectives` group of a report.
pub fn group(tally: &Tally, rule: &Result<StragglerRule, String>, seconds: f64) -> Value {
    let (rule, error) = match rule {
        Ok(rule) => (*rule, String::new()),
        Err(refused) => (StragglerRule::default(), format!("{refused}; the default straggler rule applies")),
    };
    let communicators: Vec<Value> = tally.views.iter().map(|v| communicator(v, tally)).collect();
    let mut group = json!({
        "period": seconds,
        "error": error,
        "straggler_rule": {
            "window": rule.window,
            "share": rule.share,
            "min_lateness_ns": rule.min_lateness.as_nanos() as u64,
        },
    });
    // Moved in: `json!` would copy what it is given (a job of many ranks makes these
    // large), as below.
    group["communicators"] = Value::Array(communicators);
    group
}

fn communicator(view: &GroupView, tally: &Tally) -> Value {
    let members: Vec<Value> = view
        .members
        .iter()
        .map(|m| {
            json!({
                "rank": m.rank,
                "host": m.host,
                "pid": m.pid,
                "neuroncore": m.core,
                "state": m.state.name(),
                "last_enqueued": m.enqueued.map(|p| p.to_string()),
                "last_started": m.started.map(|p| p.to_string()),
                "last_completed": m.completed.map(|p| p.to_string()),
                "arrived_last": m.arrived_last,
                "median_lateness_ns": m.median_lateness_ns,
                "lateness_ns": m.lateness_ns,
                "doing": m.doing,
            })
        })
        .collect();
    let collectives: Vec<Value> = view
        .collectives
        .iter()
        .map(|c| {
            let waits: Map<String, Value> = c.waits_ns.iter().map(|(r, w)| (r.to_string(), json!(w))).collect();
            let mut collective = json!({
                "sequence": c.position.sequence,
                "index": c.position.index,
                "operation": c.operation,
                "algorithm": c.algorithm,
                "bytes": c.bytes,
                "replica_group": c.group,
                "complete": c.complete,
                "skew_ns": c.skew_ns,
                "last_arriver": c.last,
            });
            collective["waits_ns"] = Value::Object(waits);
            collective
        })
        .collect();
    let mut diagnosis = Vec::new();
    if let Some(hang) = &view.hang {
        diagnosis.push(hang.text.clone());
    }
    if let Some(straggler) = &view.straggler {
        diagnosis.push(straggler.text.clone());
    }
    let mut communicator = json!({
        "id": view.id,
        "name": view.name,
        "ranks": view.ranks,
        "across_processes": view.across,
        "clock_uncertainty_ns": view.uncertainty_ns,
        "admits": view.admission,
        "diagnosis": diagnosis,
        "straggler": view.straggler,
        "hang": view.hang,
        "collectives_seen": tally.communicators.get(&view.id).map_or(0, |t| t.seen),
    });
    communicator["members"] = Value::Array(members);
    communicator["collectives"] = Value::Array(collectives);
    communicator
}
