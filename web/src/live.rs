//! The live page's feed: one sampler thread looks at every runtime on the host
//! (through `neuron-top`'s collector, which uses the datastore reader API) and publishes
//! each look, encoded once, to every connected page. The last minute of looks is kept,
//! so that a page that connects starts with it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use neuron_datastore::ranks::GroupView;
use neuron_datastore::sample::Collector;
use neuron_datastore::sample::model::Snapshot;
use neuron_datastore::topology::Topology;
use serde::Serialize;
use tokio::sync::watch;

/// The largest update sent to a page.
pub(crate) const MAX_UPDATE_BYTES: usize = 64 * 1024;

/// One update: a look at the host, stamped so a page can tell how late it arrived.
#[derive(Debug, Serialize)]
struct Update<'a> {
    seq: u64,
    /// Wall-clock milliseconds since the Unix epoch when the update was sent.
    sent_at_ms: f64,
    /// Seconds since the previous look (rates are over it).
    interval_s: f64,
    #[serde(flatten)]
    snapshot: &'a Snapshot,
    /// What was left out to keep the update under [`MAX_UPDATE_BYTES`].
    omitted: Omitted,
}

#[derive(Debug, Default, Serialize)]
struct Omitted {
    models: usize,
    runtimes: usize,
    /// Communicators whose collectives went without each rank's wait.
    collective_waits: usize,
    /// Older collectives left out of the communicators' recent ones.
    collectives: usize,
}

fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Encodes a look, leaving out the per-core history (pages keep their own) and the
/// collectives' arrival times (the ranks' lateness says the same) and, when it is still
/// too large, the collectives' waits, the loaded models and then the last runtimes.
pub(crate) fn encode(snapshot: &mut Snapshot, seq: u64, interval: Duration) -> Bytes {
    for core in snapshot.runtimes.iter_mut().flat_map(|r| r.cores.iter_mut()) {
        core.history.clear();
    }
    for collective in snapshot.ranks.iter_mut().flat_map(|g| g.collectives.iter_mut()) {
        collective.arrivals.clear();
    }
    let mut omitted = Omitted::default();
    loop {
        let update = Update {
            seq,
            sent_at_ms: now_ms(),
            interval_s: interval.as_secs_f64(),
            snapshot,
            omitted: Omitted { ..omitted },
        };
        let json = serde_json::to_vec(&update).unwrap_or_default();
        if json.len() <= MAX_UPDATE_BYTES {
            return Bytes::from(json);
        }
        let waits = |g: &GroupView| g.collectives.iter().any(|c| !c.waits_ns.is_empty());
        let longest = (0..snapshot.ranks.len())
            .max_by_key(|&i| snapshot.ranks[i].collectives.len() * snapshot.ranks[i].members.len())
            .filter(|&i| snapshot.ranks[i].collectives.len() > MIN_COLLECTIVES);
        if let Some(group) = snapshot.ranks.iter_mut().find(|g| waits(g)) {
            group.collectives.iter_mut().for_each(|c| c.waits_ns.clear());
            omitted.collective_waits += 1;
        } else if let Some(group) = longest.map(|i| &mut snapshot.ranks[i]) {
            // The older half of its collectives, from every rank's lateness too.
            let drop = group.collectives.len() - (group.collectives.len() / 2).max(MIN_COLLECTIVES);
            group.collectives.drain(..drop);
            group.members.iter_mut().for_each(|m| drop_oldest(&mut m.lateness_ns, drop));
            omitted.collectives += drop;
        } else if snapshot.runtimes.is_empty() {
            return Bytes::from(json);
        } else if let Some(runtime) = snapshot.runtimes.iter_mut().find(|r| !r.models.is_empty()) {
            omitted.models += runtime.models.len();
            runtime.models.clear();
        } else {
            snapshot.runtimes.pop();
            omitted.runtimes += 1;
        }
    }
}

/// The fewest recent collectives a communicator keeps in an update.
const MIN_COLLECTIVES: usize = 8;

fn drop_oldest<T>(values: &mut Vec<T>, n: usize) {
    values.drain(..n.min(values.len()));
}

/// How much past a page gets when it connects.
const HISTORY: Duration = Duration::from_secs(60);
/// The most the kept past may weigh.
const HISTORY_BYTES: usize = 8 << 20;

/// The feed: the latest update, to wait on, and the last minute of them, for a page that
/// connects.
#[derive(Debug)]
pub(crate) struct Live {
    latest: watch::Sender<Option<Bytes>>,
    history: Mutex<VecDeque<Bytes>>,
}

impl Live {
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<Bytes>> {
        self.latest.subscribe()
    }

    /// The updates of the last minute, oldest first.
    pub(crate) fn history(&self) -> Vec<Bytes> {
        self.history.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }

    fn publish(&self, update: Bytes, keep: usize) {
        {
            let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
            history.push_back(update.clone());
            let mut bytes: usize = history.iter().map(Bytes::len).sum();
            while history.len() > keep || bytes > HISTORY_BYTES {
                bytes -= history.pop_front().map_or(0, |b| b.len());
            }
        }
        self.latest.send_replace(Some(update));
    }
}

/// Starts the sampler: a look every `interval`, kept for a minute, until the returned
/// feed is dropped.
pub(crate) fn start(dir: PathBuf, topology: Topology, interval: Duration) -> std::io::Result<Arc<Live>> {
    let live = Arc::new(Live { latest: watch::channel(None).0, history: Mutex::new(VecDeque::new()) });
    let feed = Arc::clone(&live);
    let keep = (HISTORY.as_secs_f64() / interval.as_secs_f64()).ceil() as usize;
    std::thread::Builder::new().name("dashboard-live".into()).spawn(move || {
        let mut collector = Collector::new(dir, topology);
        collector.sample();
        let mut last = Instant::now();
        let mut seq = 0u64;
        while Arc::strong_count(&feed) > 1 {
            if let Some(wait) = (last + interval).checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let mut snapshot = collector.sample();
            let now = Instant::now();
            seq += 1;
            feed.publish(encode(&mut snapshot, seq, now - last), keep);
            last = now;
        }
    })?;
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_datastore::sample::model::{Core, Model, Runtime};

    fn runtime(pid: u32, cores: u32, models: u32) -> Runtime {
        Runtime {
            pid,
            tag: format!("job-{pid}"),
            cores: (0..cores)
                .map(|index| Core { index, utilization: Some(50.0), history: vec![1.0; 120], ..Core::default() })
                .collect(),
            models: (0..models)
                .map(|model_id| Model {
                    model_id,
                    name: format!("model-with-a-long-name-{model_id}"),
                    ..Model::default()
                })
                .collect(),
            ..Runtime::default()
        }
    }

    #[test]
    fn a_small_look_is_sent_whole_without_history() {
        let mut snapshot = Snapshot { runtimes: vec![runtime(1, 2, 3)], ..Snapshot::default() };
        let bytes = encode(&mut snapshot, 7, Duration::from_millis(200));
        let value: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(value["seq"], 7);
        assert_eq!(value["runtimes"][0]["models"].as_array().map(Vec::len), Some(3));
        assert_eq!(value["runtimes"][0]["cores"][1]["history"].as_array().map(Vec::len), Some(0));
        assert_eq!(value["omitted"]["models"], 0);
    }

    #[test]
    fn a_large_communicator_goes_without_arrivals_then_waits_then_older_collectives_but_keeps_every_rank() {
        use neuron_datastore::flight::Position;
        use neuron_datastore::ranks::{CollectiveView, GroupView, MemberView, RankState};
        let ranks = 128u32;
        let collectives: Vec<CollectiveView> = (0..32)
            .map(|sequence| CollectiveView {
                position: Position { sequence, index: 0 },
                operation: "all-reduce",
                algorithm: "ring",
                group: 0,
                bytes: 1 << 20,
                arrivals: (0..ranks).map(|r| (r, 1_000_000_000 + u64::from(r) * 1000)).collect(),
                complete: true,
                skew_ns: 127_000,
                last: Some(ranks - 1),
                waits_ns: (0..ranks).map(|r| (r, u64::from(ranks - 1 - r) * 1000)).collect(),
            })
            .collect();
        let members: Vec<MemberView> = (0..ranks)
            .map(|rank| MemberView {
                rank,
                pid: 10_000 + rank,
                host: format!("trn1-host-{}", rank / 32),
                core: Some(rank % 32),
                state: RankState::Idle,
                enqueued: Some(Position { sequence: 32, index: 0 }),
                started: Some(Position { sequence: 31, index: 0 }),
                completed: Some(Position { sequence: 31, index: 0 }),
                lateness_ns: vec![Some(u64::from(rank) * 1000); 32],
                arrived_last: 0,
                median_lateness_ns: Some(u64::from(rank) * 1000),
                uncertainty_ns: 20_000,
                doing: Some("executing `train_step` at `all-reduce.7`".into()),
            })
            .collect();
        let group = GroupView {
            id: 1,
            name: "grads".into(),
            ranks,
            across: true,
            members,
            collectives,
            straggler: None,
            hang: None,
            uncertainty_ns: 20_000,
            admission: None,
        };
        let mut snapshot = Snapshot { runtimes: vec![runtime(1, 2, 3)], ranks: vec![group], ..Snapshot::default() };
        let bytes = encode(&mut snapshot, 1, Duration::from_millis(200));
        assert!(bytes.len() <= MAX_UPDATE_BYTES, "{} bytes", bytes.len());
        let value: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        let group = &value["ranks"][0];
        assert_eq!(group["members"].as_array().map(Vec::len), Some(128));
        assert_eq!(group["collectives"][0]["arrivals"].as_array().map(Vec::len), Some(0));
        assert_eq!(value["omitted"]["collective_waits"], 1, "the waits went to fit");
        let kept = group["collectives"].as_array().map_or(0, Vec::len);
        assert!((8..32).contains(&kept), "the older collectives went: {kept} kept");
        assert_eq!(value["omitted"]["collectives"], 32 - kept);
        assert_eq!(group["members"][5]["lateness_ns"].as_array().map(Vec::len), Some(kept), "every rank's too");
        assert_eq!(value["omitted"]["models"], 0, "before any model");
    }

    #[test]
    fn a_large_look_leaves_out_models_then_runtimes_to_fit() {
        let mut snapshot =
            Snapshot { runtimes: (0..64).map(|pid| runtime(pid, 32, 64)).collect(), ..Snapshot::default() };
        let bytes = encode(&mut snapshot, 1, Duration::from_millis(200));
        assert!(bytes.len() <= MAX_UPDATE_BYTES, "{} bytes", bytes.len());
        let value: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(value["omitted"]["models"], 64 * 64);
        let kept = value["runtimes"].as_array().map_or(0, Vec::len);
        assert!(kept > 0 && kept < 64, "{kept} runtimes kept");
        assert_eq!(value["omitted"]["runtimes"], 64 - kept);
    }
}
