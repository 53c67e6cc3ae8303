//! The live timeline's feed: one thread tails the event rings of every runtime on the
//! host (system and device events, from the moment a page connects) and publishes
//! batches of spans on the host clock to every connected page. System events are
//! paired start with stop on the server; device events are moved onto the host clock
//! through their core's latest `timestamp_sync_point`. A batch stays under
//! [`MAX_BATCH_BYTES`]: what does not fit is counted, never silently dropped.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use neuron_datastore::clock::monotonic_ns;
use neuron_datastore::event::{ClockDomain, DeviceActivity, DeviceEvent, EventData, Phase, SystemEvent};
use neuron_datastore::{DatastoreReader, Followed, Runtimes, Tail, TailStart, TraceEvent};
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// The largest batch sent to a page.
pub(crate) const MAX_BATCH_BYTES: usize = 64 * 1024;
/// How often the rings are read.
const POLL: Duration = Duration::from_millis(100);
/// Starts waiting for their stop, per runtime, at most.
const MAX_OPEN: usize = 4096;
/// Device events waiting for their core's first sync point, per core, at most.
const MAX_PENDING: usize = 4096;

/// What the tail thread keeps per runtime it follows.
struct Tailed {
    tail: Tail,
    pid: u32,
    tag: String,
    /// Host minus device clock per core, from the latest sync point.
    offsets: HashMap<u32, i128>,
    /// Starts by (core, tracking id, event type).
    open: HashMap<(Option<u32>, u64, u8), SystemEvent>,
    /// Device events of cores without a sync point yet.
    pending: BTreeMap<u32, Vec<DeviceEvent>>,
    lost_reported: u64,
}

/// A batch under construction: spans, each encoded once, until the byte budget; then
/// only counts.
struct Batch {
    spans: Vec<String>,
    bytes: usize,
    /// Spans left out because the batch was full.
    thinned: u64,
    /// Events the rings overwrote before they were read.
    lost: u64,
}

impl Batch {
    fn push(&mut self, span: &Value) {
        let span = span.to_string();
        if self.bytes + span.len() + 1 > MAX_BATCH_BYTES {
            self.thinned += 1;
        } else {
            self.bytes += span.len() + 1;
            self.spans.push(span);
        }
    }

    /// Adds what fits of `spans`, taken evenly through them (every core and engine gets
    /// its share), and counts the rest as thinned.
    fn push_evenly(&mut self, spans: Vec<String>) {
        let total: usize = spans.iter().map(|s| s.len() + 1).sum();
        let room = MAX_BATCH_BYTES.saturating_sub(self.bytes);
        // Keep one in `stride`, a little more sparsely than the average size says.
        let stride = if total <= room { 1.0 } else { total as f64 / room.max(1) as f64 * 1.05 };
        let mut next = 0.0;
        for (k, span) in spans.into_iter().enumerate() {
            if (k as f64) < next || self.bytes + span.len() + 1 > MAX_BATCH_BYTES {
                self.thinned += 1;
                continue;
            }
            next += stride;
            self.bytes += span.len() + 1;
            self.spans.push(span);
        }
    }

    /// The batch as the page reads it.
    fn encode(self, runtimes: &str) -> Bytes {
        Bytes::from(format!(
            r#"{{"now_ns":{},"spans":[{}],"thinned":{},"lost":{},"runtimes":{runtimes}}}"#,
            monotonic_ns(),
            self.spans.join(","),
            self.thinned,
            self.lost
        ))
    }
}

/// Starts the tail thread; it reads only while a page is connected.
pub(crate) fn start(dir: PathBuf) -> std::io::Result<Arc<broadcast::Sender<Bytes>>> {
    let (tx, _) = broadcast::channel(64);
    let tx = Arc::new(tx);
    let sender = Arc::clone(&tx);
    std::thread::Builder::new().name("dashboard-events".into()).spawn(move || {
        let mut followed: Runtimes<Tailed> = Runtimes::new(dir);
        loop {
            if sender.receiver_count() == 0 {
                followed.clear();
                if Arc::strong_count(&sender) == 1 {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            // A directory that cannot be read, or a datastore that does not open, shows
            // as no runtime: the live page says what the problem is.
            let _ = followed.discover(admit);
            let runtimes: Value = followed.iter().map(|f| json!({"pid": f.pid, "tag": f.state.tag})).collect();
            let runtimes = runtimes.to_string();
            // The batch's other fields count against its budget too.
            let mut batch = Batch { spans: Vec::new(), bytes: runtimes.len() + 128, thinned: 0, lost: 0 };
            // System events first: they are few, and they frame the device events.
            let mut device = Vec::new();
            for f in followed.iter_mut() {
                poll(f, &mut batch, &mut device);
            }
            batch.push_evenly(device);
            followed.mark_exited();
            followed.forget_exited(Duration::ZERO);
            let _ = sender.send(batch.encode(&runtimes));
            std::thread::sleep(POLL);
        }
    })?;
    Ok(tx)
}

/// Starts tailing a runtime found live, from now.
fn admit(reader: &DatastoreReader, label: &str) -> Option<Tailed> {
    Some(Tailed {
        tail: reader.tail(TailStart::Now, None, u64::MAX, true),
        pid: reader.info().pid,
        tag: label.to_owned(),
        offsets: HashMap::new(),
        open: HashMap::new(),
        pending: BTreeMap::new(),
        lost_reported: 0,
    })
}

/// Reads `f`'s rings: system spans go into `batch`, device spans (encoded) into
/// `device`, once their core's clock is known.
fn poll(followed: &mut Followed<Tailed>, batch: &mut Batch, device: &mut Vec<String>) {
    let mut events = Vec::new();
    let f = &mut followed.state;
    f.tail.poll(&followed.reader, 65_536, false, &mut events);
    let lost = f.tail.lost();
    batch.lost += lost - f.lost_reported;
    f.lost_reported = lost;
    for event in events {
        match event {
            TraceEvent::System(e) => system(f, e, batch),
            TraceEvent::Device(e) => match f.offsets.get(&e.nc_idx) {
                Some(&offset) => device.push(device_span(f.pid, &e, offset)),
                None => {
                    let pending = f.pending.entry(e.nc_idx).or_default();
                    if pending.len() < MAX_PENDING {
                        pending.push(e);
                    } else {
                        batch.thinned += 1;
                    }
                }
            },
        }
    }
    // Device events that waited for their core's first sync point.
    let ready: Vec<u32> = f.pending.keys().copied().filter(|c| f.offsets.contains_key(c)).collect();
    for core in ready {
        let offset = f.offsets[&core];
        for e in f.pending.remove(&core).unwrap_or_default() {
            device.push(device_span(f.pid, &e, offset));
        }
    }
}

/// A device span as the page draws it, on the host clock (`offset`: host minus device
/// time of its core), encoded.
fn device_span(pid: u32, e: &DeviceEvent, offset: i128) -> String {
    let host = |t: u64| (i128::from(t) + offset).clamp(0, i128::from(u64::MAX)) as u64;
    json!({
        "kind": "device",
        "pid": pid,
        "core": e.nc_idx,
        "name": device_name(e),
        "lane": device_lane(e),
        "start_ns": host(e.start_ns),
        "end_ns": host(e.end_ns),
        "details": e,
    })
    .to_string()
}

fn device_name(e: &DeviceEvent) -> String {
    match &e.activity {
        DeviceActivity::Instruction { opcode, .. } => opcode.clone(),
        DeviceActivity::Dma { queue, index, .. } => format!("{} {index}", queue.name()),
    }
}

/// The engine or DMA queue the event ran on.
fn device_lane(e: &DeviceEvent) -> String {
    match &e.activity {
        DeviceActivity::Instruction { engine, .. } => engine.name().to_string(),
        DeviceActivity::Dma { queue, .. } => format!("DMA {}", queue.name()),
    }
}

fn system(f: &mut Tailed, e: SystemEvent, batch: &mut Batch) {
    if let EventData::SyncPoint { cpu_timestamp_ns, nc_timestamp_ns } = e.data {
        if let Some(core) = e.nc_idx {
            f.offsets.insert(core, i128::from(cpu_timestamp_ns) - i128::from(nc_timestamp_ns));
        }
        return;
    }
    let host_time = |f: &Tailed, e: &SystemEvent| match e.clock {
        ClockDomain::Host => Some(e.timestamp_ns),
        ClockDomain::Device => e
            .nc_idx
            .and_then(|c| f.offsets.get(&c))
            .map(|&o| (i128::from(e.timestamp_ns) + o).clamp(0, i128::from(u64::MAX)) as u64),
    };
    let key = (e.nc_idx, e.tracking_id, e.event_type as u8);
    match e.phase {
        Phase::Start => {
            if f.open.len() >= MAX_OPEN {
                // Starts whose stop was lost (overwritten in the ring) would fill the
                // table: the oldest half goes, counted.
                let mut ids: Vec<u64> = f.open.values().map(|s| s.id).collect();
                let (_, &mut median, _) = ids.select_nth_unstable(MAX_OPEN / 2);
                f.open.retain(|_, s| s.id >= median);
                batch.thinned += (MAX_OPEN - f.open.len()) as u64;
            }
            f.open.insert(key, e);
        }
        Phase::Stop => {
            let Some(start) = f.open.remove(&key) else { return };
            let (Some(t0), Some(t1)) = (host_time(f, &start), host_time(f, &e)) else {
                // Device-clock spans of a core with no sync point yet cannot be placed.
                batch.thinned += 1;
                return;
            };
            // The start's fields, with what the stop adds to its data (a status).
            let mut details = serde_json::to_value(&start).unwrap_or_default();
            if let (Some(map), Value::Object(stop)) =
                (details["data"].as_object_mut(), serde_json::to_value(&e).unwrap_or_default()["data"].take())
            {
                map.extend(stop);
            }
            if let Some(map) = details.as_object_mut() {
                map.remove("phase");
                map.insert("stop_timestamp_ns".into(), e.timestamp_ns.into());
            }
            batch.push(&system_span(f.pid, &e, t0, t1.max(t0), details));
        }
        Phase::Instant => {
            let Some(t) = host_time(f, &e) else {
                batch.thinned += 1;
                return;
            };
            let details = serde_json::to_value(&e).unwrap_or_default();
            batch.push(&system_span(f.pid, &e, t, t, details));
        }
    }
}

/// A system span as the page draws it: on its runtime's row of its core.
fn system_span(pid: u32, e: &SystemEvent, start_ns: u64, end_ns: u64, details: Value) -> Value {
    json!({
        "kind": "system",
        "pid": pid,
        "core": e.nc_idx,
        "name": e.event_type.name(),
        "lane": "runtime",
        "start_ns": start_ns,
        "end_ns": end_ns,
        "details": details,
    })
}
