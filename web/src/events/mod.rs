//! The live timeline's feed: one thread tails the event rings of every runtime on the
//! host and publishes batches of spans on the host clock to every connected page.
//! System events are paired start with stop on the server; device events are moved
//! onto the host clock through their core's latest `timestamp_sync_point` and grouped
//! by execution.
//!
//! A batch stays under [`MAX_BATCH_BYTES`]. When the device spans do not fit, whole
//! executions are kept or left out, spread evenly over time and over the cores
//! ([`spans::select_executions`]; an execution still running after three polls is sent
//! in parts); what is left out is counted, and every
//! batch also carries each core's busy fraction from the lossless counters, which the
//! page draws as a band, so a core whose executions were thinned never looks idle.
//!
//! The thread starts reading when the first page connects, from the oldest events the
//! rings still hold, and goes on for [`BACKLOG`] after the last page left; it keeps the
//! batches of that long, which a page that opens gets first: its window is full at once.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use neuron_datastore::clock::monotonic_ns;
use neuron_datastore::event::{ClockDomain, DeviceEvent, EventData, EventType, Phase, SystemEvent};
use neuron_datastore::{DatastoreReader, Followed, Runtimes, Tail, TailStart, TraceEvent};
use serde_json::{Value, json};
use tokio::sync::broadcast;

mod spans;

use spans::{Execution, device_span, select_executions, system_span};

/// The largest batch sent to a page.
pub(crate) const MAX_BATCH_BYTES: usize = 64 * 1024;
/// How often the rings are read.
const POLL: Duration = Duration::from_millis(100);
/// How long batches are kept for pages that open later, and the rings read after the
/// last page closed.
pub(crate) const BACKLOG: Duration = Duration::from_secs(60);
/// The most bytes of batches kept.
const BACKLOG_BYTES: usize = 16 << 20;
/// Starts waiting for their stop, per runtime, at most.
const MAX_OPEN: usize = 4096;
/// Device events waiting for their core's first sync point, per core, at most.
const MAX_PENDING: usize = 4096;
/// Polls an execution's device spans wait for its `nc_exec_running` to stop.
const MAX_WAIT_POLLS: u8 = 3;

/// The feed pages subscribe to.
#[derive(Debug)]
pub(crate) struct Feed {
    /// Which feed this is (its start, host ns): sequence numbers count from 1 in each,
    /// so a page that reconnects to a restarted dashboard starts over.
    id: u64,
    tx: broadcast::Sender<Bytes>,
    /// Recent batches, oldest first, with when they were made.
    backlog: Mutex<VecDeque<(Instant, Bytes)>>,
}

impl Feed {
    /// Live batches from now on, and the kept ones before them. A batch may be in both:
    /// each carries a sequence number (`seq`) for the page to skip repeats.
    pub(crate) fn subscribe(&self) -> (broadcast::Receiver<Bytes>, Vec<Bytes>) {
        let rx = self.tx.subscribe();
        let kept = self.backlog.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|(_, b)| b.clone()).collect();
        (rx, kept)
    }

    fn publish(&self, batch: Bytes) {
        let mut backlog = self.backlog.lock().unwrap_or_else(PoisonError::into_inner);
        backlog.push_back((Instant::now(), batch.clone()));
        let mut bytes: usize = backlog.iter().map(|(_, b)| b.len()).sum();
        while let Some((at, oldest)) = backlog.front() {
            if at.elapsed() <= BACKLOG && bytes <= BACKLOG_BYTES {
                break;
            }
            bytes -= oldest.len();
            backlog.pop_front();
        }
        drop(backlog);
        let _ = self.tx.send(batch);
    }
}

/// What the tail thread keeps per runtime it follows.
struct Tailed {
    tail: Tail,
    pid: u32,
    tag: String,
    /// Model names by id, for the details pane.
    models: HashMap<u32, String>,
    /// Host minus device clock per core, from the latest sync point.
    offsets: HashMap<u32, i128>,
    /// Starts by (core, tracking id, event type).
    open: HashMap<(Option<u32>, u64, u8), SystemEvent>,
    /// Device events of cores without a sync point yet.
    pending: BTreeMap<u32, Vec<DeviceEvent>>,
    /// Device spans of executions still running, by (core, execution).
    building: HashMap<(u32, Option<u64>), Execution>,
    /// Executions whose `nc_exec_running` stopped since the last poll.
    finished: HashSet<(u32, u64)>,
    /// Each core's busy counter at the last poll, and when.
    busy: HashMap<u32, (u64, u64)>,
    lost_reported: u64,
}

/// A batch under construction: spans, each encoded once, until the byte budget; then
/// only counts.
struct Batch {
    feed: u64,
    seq: u64,
    spans: Vec<String>,
    bytes: usize,
    /// Spans left out because the batch was full.
    thinned: u64,
    /// Executions whose device spans were left out.
    thinned_executions: u64,
    /// Events the rings overwrote before they were read.
    lost: u64,
    /// Busy fractions of each core since the last batch.
    busy: Vec<String>,
}

impl Batch {
    fn push(&mut self, span: String) {
        if self.bytes + span.len() + 1 > MAX_BATCH_BYTES {
            self.thinned += 1;
        } else {
            self.bytes += span.len() + 1;
            self.spans.push(span);
        }
    }

    /// The batch as the page reads it.
    fn encode(self, runtimes: &str) -> Bytes {
        Bytes::from(format!(
            r#"{{"feed":{},"seq":{},"now_ns":{},"spans":[{}],"busy":[{}],"thinned":{},"thinned_executions":{},"lost":{},"runtimes":{runtimes}}}"#,
            self.feed,
            self.seq,
            monotonic_ns(),
            self.spans.join(","),
            self.busy.join(","),
            self.thinned,
            self.thinned_executions,
            self.lost
        ))
    }
}

/// Starts the tail thread; it reads while a page is connected and for [`BACKLOG`] after.
pub(crate) fn start(dir: PathBuf) -> std::io::Result<Arc<Feed>> {
    let (tx, _) = broadcast::channel(64);
    let feed = Arc::new(Feed { id: monotonic_ns(), tx, backlog: Mutex::new(VecDeque::new()) });
    let shared = Arc::clone(&feed);
    std::thread::Builder::new().name("dashboard-events".into()).spawn(move || {
        let mut followed: Runtimes<Tailed> = Runtimes::new(dir);
        let mut last_page = None::<Instant>;
        let mut seq = 0u64;
        loop {
            if Arc::strong_count(&shared) == 1 {
                return;
            }
            if shared.tx.receiver_count() > 0 {
                last_page = Some(Instant::now());
            }
            if last_page.is_none_or(|at| at.elapsed() > BACKLOG) {
                followed.clear();
                shared.backlog.lock().unwrap_or_else(PoisonError::into_inner).clear();
                last_page = None;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            // A directory that cannot be read, or a datastore that does not open, shows
            // as no runtime: the live page says what the problem is.
            let _ = followed.discover(admit);
            let runtimes: Value = followed
                .iter()
                .map(|f| {
                    let models: serde_json::Map<String, Value> =
                        f.state.models.iter().map(|(id, name)| (id.to_string(), name.as_str().into())).collect();
                    json!({"pid": f.pid, "tag": f.state.tag, "models": models})
                })
                .collect();
            let runtimes = runtimes.to_string();
            seq += 1;
            // The batch's other fields count against its budget too.
            let mut batch = Batch {
                feed: shared.id,
                seq,
                spans: Vec::new(),
                bytes: runtimes.len() + 256,
                thinned: 0,
                thinned_executions: 0,
                lost: 0,
                busy: Vec::new(),
            };
            // System events first: they are few, and they frame the device events.
            let mut done = Vec::new();
            for f in followed.iter_mut() {
                poll(f, &mut batch, &mut done);
            }
            let room = MAX_BATCH_BYTES.saturating_sub(batch.bytes);
            let (kept, left_out) = select_executions(done, room);
            for execution in kept {
                for span in execution.spans {
                    batch.push(span);
                }
            }
            for execution in left_out {
                batch.thinned += execution.spans.len() as u64;
                batch.thinned_executions += 1;
            }
            followed.mark_exited();
            followed.forget_exited(Duration::ZERO);
            shared.publish(batch.encode(&runtimes));
            std::thread::sleep(POLL);
        }
    })?;
    Ok(feed)
}

/// Starts tailing a runtime found live, from the oldest events its rings still hold.
fn admit(reader: &DatastoreReader, label: &str) -> Option<Tailed> {
    Some(Tailed {
        tail: reader.tail(TailStart::Oldest, None, u64::MAX, true),
        pid: reader.info().pid,
        tag: label.to_owned(),
        models: HashMap::new(),
        offsets: HashMap::new(),
        open: HashMap::new(),
        pending: BTreeMap::new(),
        building: HashMap::new(),
        finished: HashSet::new(),
        busy: HashMap::new(),
        lost_reported: 0,
    })
}

/// Reads `f`'s rings: system spans go into `batch`, the device spans of executions
/// that finished (or waited long enough) into `done`, and each core's busy fraction
/// since the last poll into `batch.busy`.
fn poll(followed: &mut Followed<Tailed>, batch: &mut Batch, done: &mut Vec<Execution>) {
    let mut events = Vec::new();
    let reader = &followed.reader;
    let f = &mut followed.state;
    let models = reader.models();
    f.models = models.iter().map(|m| (m.model_id, m.name.clone())).collect();
    f.tail.poll(reader, 65_536, false, &mut events);
    let lost = f.tail.lost();
    batch.lost += lost - f.lost_reported;
    f.lost_reported = lost;
    let mut device = Vec::new();
    for event in events {
        match event {
            TraceEvent::System(e) => system(f, e, batch),
            TraceEvent::Device(e) => device.push(e),
        }
    }
    for e in device {
        match f.offsets.get(&e.nc_idx) {
            Some(&offset) => add_device(f, &e, offset),
            None => {
                let pending = f.pending.entry(e.nc_idx).or_default();
                if pending.len() < MAX_PENDING {
                    pending.push(e);
                } else {
                    batch.thinned += 1;
                }
            }
        }
    }
    // Device events that waited for their core's first sync point.
    let ready: Vec<u32> = f.pending.keys().copied().filter(|c| f.offsets.contains_key(c)).collect();
    for core in ready {
        let offset = f.offsets[&core];
        for e in f.pending.remove(&core).unwrap_or_default() {
            add_device(f, &e, offset);
        }
    }
    let finished = std::mem::take(&mut f.finished);
    let keys: Vec<(u32, Option<u64>)> = f.building.keys().copied().collect();
    for key in keys {
        let ready = match key {
            (core, Some(exec)) => finished.contains(&(core, exec)),
            (_, None) => true,
        };
        let Some(execution) = f.building.get_mut(&key) else { continue };
        execution.polls += 1;
        if ready || execution.polls > MAX_WAIT_POLLS {
            done.extend(f.building.remove(&key));
        }
    }
    // Busy time is counted when an execution ends: a core in the middle of one that
    // outlasts the poll has gained nothing yet, but is busy the whole time.
    let running: HashSet<u32> = models.iter().filter(|m| m.running > 0).map(|m| m.core).collect();
    let now = monotonic_ns();
    for core in reader.snapshot().cores {
        if let Some((at, busy)) = f.busy.insert(core.core, (now, core.busy_ns))
            && now > at
        {
            let gained = core.busy_ns.saturating_sub(busy);
            let fraction = if gained == 0 && running.contains(&core.core) {
                1.0
            } else {
                (gained as f64 / (now - at) as f64).clamp(0.0, 1.0)
            };
            let entry = json!({"pid": f.pid, "core": core.core, "start_ns": at, "end_ns": now, "fraction": fraction})
                .to_string();
            batch.bytes += entry.len() + 1;
            batch.busy.push(entry);
        }
    }
}

fn add_device(f: &mut Tailed, e: &DeviceEvent, offset: i128) {
    let span = device_span(f.pid, e, offset, f.models.get(&e.model_id).map(String::as_str));
    let start = (i128::from(e.start_ns) + offset).max(0) as u64;
    let execution = f.building.entry((e.nc_idx, e.exec_id)).or_insert_with(|| Execution::new(f.pid, e.nc_idx, start));
    execution.add(span, start);
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
    let model = |f: &Tailed, e: &SystemEvent| e.model_id.and_then(|m| f.models.get(&m).cloned());
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
            if e.event_type == EventType::NcExecRunning
                && let (Some(core), Some(exec)) = (e.nc_idx, e.exec_id)
            {
                f.finished.insert((core, exec));
            }
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
            let model = model(f, &start);
            batch.push(system_span(f.pid, &e, t0, t1.max(t0), model, details));
        }
        Phase::Instant => {
            let Some(t) = host_time(f, &e) else {
                batch.thinned += 1;
                return;
            };
            let details = serde_json::to_value(&e).unwrap_or_default();
            let model = model(f, &e);
            batch.push(system_span(f.pid, &e, t, t, model, details));
        }
    }
}
