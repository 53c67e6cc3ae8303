//! The live page's feed: one sampler thread looks at every runtime on the host
//! (through `neuron-top`'s collector, which uses the datastore reader API) and publishes
//! each look, encoded once, to every connected page. It looks only while a page is
//! connected.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use neuron_runtime::topology::Topology;
use neuron_top::collect::Collector;
use neuron_top::model::Snapshot;
use serde::Serialize;
use tokio::sync::watch;

/// The largest update sent to a page.
pub const MAX_UPDATE_BYTES: usize = 64 * 1024;

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

pub fn now_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Encodes a look, leaving out the per-core history (pages keep their own) and, when
/// it is still too large, the loaded models and then the last runtimes.
pub fn encode(snapshot: &mut Snapshot, seq: u64, interval: Duration) -> Bytes {
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

/// The latest update, and the way to wait for the next.
pub type Feed = watch::Receiver<Option<Bytes>>;

/// Starts the sampler: a look every `interval` while anyone listens.
pub fn start(
    dir: PathBuf,
    topology: Topology,
    interval: Duration,
) -> std::io::Result<Arc<watch::Sender<Option<Bytes>>>> {
    let (tx, _) = watch::channel(None);
    let tx = Arc::new(tx);
    let sender = Arc::clone(&tx);
    std::thread::Builder::new().name("dashboard-live".into()).spawn(move || {
        let mut collector: Option<Collector> = None;
        let mut seq = 0u64;
        let mut last = Instant::now();
        loop {
            if sender.receiver_count() == 0 {
                // Nobody is looking: forget the rates' base, so the next look starts afresh.
                collector = None;
                if Arc::strong_count(&sender) == 1 {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            let collector = collector.get_or_insert_with(|| {
                let mut c = Collector::new(dir.clone(), topology.clone());
                c.sample();
                last = Instant::now();
                c
            });
            let deadline = last + interval;
            if let Some(wait) = deadline.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let mut snapshot = collector.sample();
            let now = Instant::now();
            seq += 1;
            let update = encode(&mut snapshot, seq, now - last);
            last = now;
            sender.send_replace(Some(update));
        }
    })?;
    Ok(tx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_top::model::{Core, Model, Runtime};

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
