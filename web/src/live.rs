//! The live page's feed: one sampler thread looks at every runtime on the host
//! (through `neuron-top`'s collector, which uses the datastore reader API) and publishes
//! each look, encoded once, to every connected page. The last minute of looks is kept,
//! so that a page that connects starts with it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
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
}

fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Encodes a look, leaving out the per-core history (pages keep their own) and, when
/// it is still too large, the loaded models and then the last runtimes.
pub(crate) fn encode(snapshot: &mut Snapshot, seq: u64, interval: Duration) -> Bytes {
    for core in snapshot.runtimes.iter_mut().flat_map(|r| r.cores.iter_mut()) {
        core.history.clear();
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
        if json.len() <= MAX_UPDATE_BYTES || snapshot.runtimes.is_empty() {
            return Bytes::from(json);
        }
        if let Some(runtime) = snapshot.runtimes.iter_mut().find(|r| !r.models.is_empty()) {
            omitted.models += runtime.models.len();
            runtime.models.clear();
        } else {
            snapshot.runtimes.pop();
            omitted.runtimes += 1;
        }
    }
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
