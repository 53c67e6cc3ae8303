//! The live timeline's feed: one thread tails the event rings of every runtime on the
//! host and publishes batches of spans on the host clock to every connected page.
//! System events are paired start with stop on the server; device events are moved
//! onto the host clock through their core's latest `timestamp_sync_point`. An
//! execution's system spans and device spans on its core form one [`Group`], sent or
//! left out whole; a system span of no execution is a group of its own.
//!
//! A batch stays under [`MAX_BATCH_BYTES`], and a page gets at most one batch per poll
//! ([`POLL`]). When the groups do not fit, each core of each runtime gets an equal
//! share of the room and keeps groups evenly spread through its time ([`spans::select`];
//! an execution still running after three polls is sent in parts); what is left out is
//! counted, and every batch also carries each core's busy fraction from the lossless
//! counters, which the page draws as a band, so a core whose executions were thinned
//! never looks idle.
//!
//! The thread starts reading when the first page connects, from the oldest events the
//! rings still hold, and goes on for [`BACKLOG`] after the last page left; it keeps
//! what it sent for that long. A page that opens gets, as its first batch and in place
//! of the next live one, the kept spans thinned again to one batch's budget, and the
//! busy fractions in coarser steps ([`Feed::catch_up`]): its window is full at once,
//! and its first second costs no more than any other.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use neuron_datastore::clock::monotonic_ns;
use neuron_datastore::event::{ClockDomain, DeviceEvent, EventData, EventType, Phase, SystemEvent};
use neuron_datastore::{DatastoreReader, Followed, Runtimes, Tail, TailStart, TraceEvent};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::broadcast;

mod spans;

use spans::{Group, device_span, select, select_groups, system_span};

/// The largest batch sent to a page.
pub(crate) const MAX_BATCH_BYTES: usize = 64 * 1024;
/// How often the rings are read.
pub(crate) const POLL: Duration = Duration::from_millis(100);
/// How long batches are kept for pages that open later, and the rings read after the
/// last page closed.
pub(crate) const BACKLOG: Duration = Duration::from_secs(60);
/// The most bytes of spans kept.
const BACKLOG_BYTES: usize = 16 << 20;
/// Starts waiting for their stop, per runtime, at most.
const MAX_OPEN: usize = 4096;
/// Device events waiting for their core's first sync point, per core, at most.
const MAX_PENDING: usize = 4096;
/// Polls an execution's spans wait for its `nc_exec_running` to stop.
const MAX_WAIT_POLLS: u8 = 3;
/// What a batch's fields other than spans and busy fractions take, at most.
const BATCH_FIELDS_BYTES: usize = 256;
/// What one busy fraction takes in a batch, about.
const BUSY_ENTRY_BYTES: usize = 100;

/// The feed pages subscribe to.
#[derive(Debug)]
pub(crate) struct Feed {
    /// Which feed this is (its start, host ns): sequence numbers count from 1 in each,
    /// so a page that reconnects to a restarted dashboard starts over.
    id: u64,
    tx: broadcast::Sender<(u64, Bytes)>,
    /// What recent batches held, oldest first.
    backlog: Mutex<VecDeque<Arc<Kept>>>,
}

/// What one batch sent: its spans, still in their groups, and its counts.
#[derive(Debug)]
struct Kept {
    at: Instant,
    seq: u64,
    groups: Vec<Group>,
    busy: Vec<Busy>,
    thinned: u64,
    thinned_executions: u64,
    lost: u64,
    runtimes: String,
    /// What its spans and busy fractions take.
    bytes: usize,
}

/// A core's busy fraction from its counter, over a stretch of host time.
#[derive(Debug, Clone, Copy, Serialize)]
struct Busy {
    pid: u32,
    core: u32,
    start_ns: u64,
    end_ns: u64,
    fraction: f64,
}

impl Feed {
    /// Live batches from now on, with their sequence numbers. The first batch a page
    /// gets should come from [`Feed::catch_up`], up to the first live one received.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<(u64, Bytes)> {
        self.tx.subscribe()
    }

    /// One batch of at most [`MAX_BATCH_BYTES`] standing for every kept batch up to
    /// `seq` (which it takes the number of): their spans thinned again as one batch's
    /// are, and each core's busy fractions in steps as coarse as the room needs. `None`
    /// when nothing is kept up to `seq`.
    pub(crate) fn catch_up(&self, seq: u64) -> Option<Bytes> {
        let kept: Vec<Arc<Kept>> = self
            .backlog
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|k| k.seq <= seq)
            .cloned()
            .collect();
        let latest = kept.last()?;
        let mut batch = Batch::new(self.id, seq, BATCH_FIELDS_BYTES + 64 + latest.runtimes.len());
        let busy: Vec<Busy> = kept.iter().flat_map(|k| k.busy.iter().copied()).collect();
        batch.busy = coarser(&busy, MAX_BATCH_BYTES / 4);
        batch.bytes += batch.busy.len() * BUSY_ENTRY_BYTES;
        for k in &kept {
            batch.thinned += k.thinned;
            batch.thinned_executions += k.thinned_executions;
            batch.lost += k.lost;
        }
        let groups: Vec<&Group> = kept.iter().flat_map(|k| k.groups.iter()).collect();
        let chosen = select(&groups, MAX_BATCH_BYTES.saturating_sub(batch.bytes));
        let mut sent = Vec::new();
        for (group, keep) in groups.into_iter().zip(chosen) {
            if keep {
                sent.push(group);
            } else {
                batch.left_out(group);
            }
        }
        let from_ns = kept.iter().flat_map(|k| k.busy.iter().map(|b| b.start_ns)).min();
        batch.catch_up = Some(json!({"batches": kept.len(), "from_ns": from_ns}).to_string());
        Some(batch.encode(&latest.runtimes, &sent))
    }

    fn publish(&self, batch: Bytes, kept: Kept) {
        let mut backlog = self.backlog.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = kept.seq;
        backlog.push_back(Arc::new(kept));
        let mut bytes: usize = backlog.iter().map(|k| k.bytes).sum();
        while let Some(oldest) = backlog.front() {
            if oldest.at.elapsed() <= BACKLOG && bytes <= BACKLOG_BYTES {
                break;
            }
            bytes -= oldest.bytes;
            backlog.pop_front();
        }
        drop(backlog);
        let _ = self.tx.send((seq, batch));
    }
}

/// `busy` merged, per core, into steps of equal length, so that all of them take about
/// `room` bytes; each step's fraction is the time-weighted mean of the entries in it.
fn coarser(busy: &[Busy], room: usize) -> Vec<Busy> {
    let mut by_core: BTreeMap<(u32, u32), Vec<Busy>> = BTreeMap::new();
    for b in busy {
        by_core.entry((b.pid, b.core)).or_default().push(*b);
    }
    let steps = (room / BUSY_ENTRY_BYTES / by_core.len().max(1)).max(1) as u64;
    let mut merged = Vec::new();
    for (_, mut list) in by_core {
        list.sort_by_key(|b| b.start_ns);
        let first = list[0].start_ns;
        let last = list.iter().map(|b| b.end_ns).max().unwrap_or(first);
        let step = ((last - first) / steps + 1).max(POLL.as_nanos() as u64);
        let mut current: Option<(u64, Busy, f64)> = None;
        for b in list {
            let index = (b.start_ns - first) / step;
            let weight = (b.end_ns - b.start_ns) as f64;
            match &mut current {
                Some((at, m, total)) if *at == index => {
                    m.end_ns = m.end_ns.max(b.end_ns);
                    m.fraction += b.fraction * weight;
                    *total += weight;
                }
                _ => {
                    merged.extend(current.take().map(finish));
                    current = Some((index, Busy { fraction: b.fraction * weight, ..b }, weight));
                }
            }
        }
        merged.extend(current.map(finish));
    }
    merged
}

fn finish((_, mut b, total): (u64, Busy, f64)) -> Busy {
    b.fraction = if total > 0.0 { (b.fraction / total).clamp(0.0, 1.0) } else { 0.0 };
    b
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
    /// Spans of executions still running, by (core, execution).
    building: HashMap<(u32, Option<u64>), Group>,
    /// Executions whose `nc_exec_running` stopped since the last poll.
    finished: HashSet<(u32, u64)>,
    /// Those of the poll before: a span of theirs read late goes out at once.
    finished_before: HashSet<(u32, u64)>,
    /// Each core's busy counter at the last poll, and when.
    busy: HashMap<u32, (u64, u64)>,
    lost_reported: u64,
}

/// A batch under construction.
struct Batch {
    feed: u64,
    seq: u64,
    /// What its fields take so far; the groups sent are chosen to fit the rest.
    bytes: usize,
    /// Spans left out.
    thinned: u64,
    /// Executions whose spans were left out.
    thinned_executions: u64,
    /// Events the rings overwrote before they were read.
    lost: u64,
    /// Busy fractions of each core since the last batch.
    busy: Vec<Busy>,
    /// For a page's first batch: what it stands for.
    catch_up: Option<String>,
}

impl Batch {
    /// An empty batch whose other fields take `bytes`.
    fn new(feed: u64, seq: u64, bytes: usize) -> Batch {
        Batch { feed, seq, bytes, thinned: 0, thinned_executions: 0, lost: 0, busy: Vec::new(), catch_up: None }
    }

    /// Counts `group` as not sent.
    fn left_out(&mut self, group: &Group) {
        self.thinned += group.spans.len() as u64;
        self.thinned_executions += u64::from(group.execution);
    }

    /// The batch as the page reads it, with the spans of `groups`.
    fn encode(&self, runtimes: &str, groups: &[&Group]) -> Bytes {
        let busy: Vec<String> = self.busy.iter().filter_map(|b| serde_json::to_string(b).ok()).collect();
        let spans: Vec<&str> = groups.iter().flat_map(|g| g.spans.iter().map(String::as_str)).collect();
        let catch_up = self.catch_up.as_ref().map(|c| format!(r#","catch_up":{c}"#)).unwrap_or_default();
        Bytes::from(format!(
            r#"{{"feed":{},"seq":{},"now_ns":{},"spans":[{}],"busy":[{}],"thinned":{},"thinned_executions":{},"lost":{},"runtimes":{runtimes}{catch_up}}}"#,
            self.feed,
            self.seq,
            monotonic_ns(),
            spans.join(","),
            busy.join(","),
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
            seq += 1;
            let (batch, kept) = read_once(&shared, &mut followed, seq);
            shared.publish(batch, kept);
            std::thread::sleep(POLL);
        }
    })?;
    Ok(feed)
}

/// One poll of every followed runtime: the batch to send, and what it holds.
fn read_once(feed: &Feed, followed: &mut Runtimes<Tailed>, seq: u64) -> (Bytes, Kept) {
    // A directory that cannot be read, or a datastore that does not open, shows as no
    // runtime: the live page says what the problem is.
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
    // The batch's other fields count against its budget too.
    let mut batch = Batch::new(feed.id, seq, BATCH_FIELDS_BYTES + runtimes.len());
    let mut done = Vec::new();
    for f in followed.iter_mut() {
        poll(f, &mut batch, &mut done, None);
    }
    let (kept, left_out) = select_groups(done, MAX_BATCH_BYTES.saturating_sub(batch.bytes));
    for group in &left_out {
        batch.left_out(group);
    }
    followed.mark_exited();
    followed.forget_exited(Duration::ZERO);
    let encoded = batch.encode(&runtimes, &kept.iter().collect::<Vec<_>>());
    let record = Kept {
        at: Instant::now(),
        seq,
        bytes: kept.iter().map(|g| g.bytes).sum::<usize>() + batch.busy.len() * BUSY_ENTRY_BYTES,
        groups: kept,
        busy: batch.busy,
        thinned: batch.thinned,
        thinned_executions: batch.thinned_executions,
        lost: batch.lost,
        runtimes,
    };
    (encoded, record)
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
        finished_before: HashSet::new(),
        busy: HashMap::new(),
        lost_reported: 0,
    })
}

/// Reads `f`'s rings: the groups of spans that are complete (an execution whose
/// `nc_exec_running` stopped, or that waited long enough; a system span of no
/// execution) go into `done`, and each core's busy fraction since the last poll into
/// `batch.busy`. Returns the events read (at most 65,536 of each ring).
/// Reads what `followed` added since the last poll into `done` (groups complete or
/// waited for long enough); with `only`, the events of that execution alone (and the
/// clock sync points), as the execution lookup wants, which saves making spans of the
/// rest. Gives the events read, and with `only` the host time of the oldest of them.
fn poll(
    followed: &mut Followed<Tailed>,
    batch: &mut Batch,
    done: &mut Vec<Group>,
    only: Option<u64>,
) -> (usize, Option<u64>) {
    let mut events = Vec::new();
    let reader = &followed.reader;
    let f = &mut followed.state;
    let models = reader.models();
    f.models = models.iter().map(|m| (m.model_id, m.name.clone())).collect();
    f.tail.poll(reader, 65_536, false, &mut events);
    let read = events.len();
    // On the host's clock: device times through their core's offset, once known.
    let on_host = |core: Option<u32>, t: u64| {
        let offset = f.offsets.get(&core?)?;
        Some((i128::from(t) + offset).clamp(0, i128::from(u64::MAX)) as u64)
    };
    // Only the lookup asks: the live feed's polls do not pay for it.
    let oldest = only.and_then(|_| {
        events
            .iter()
            .filter_map(|e| match e {
                TraceEvent::System(s) if s.clock == ClockDomain::Host => Some(s.timestamp_ns),
                TraceEvent::System(s) => on_host(s.nc_idx, s.timestamp_ns),
                TraceEvent::Device(d) => on_host(Some(d.nc_idx), d.start_ns),
            })
            .min()
    });
    if let Some(exec) = only {
        events.retain(|e| match e {
            TraceEvent::System(s) => s.exec_id == Some(exec) || matches!(s.data, EventData::SyncPoint { .. }),
            TraceEvent::Device(d) => d.exec_id == Some(exec),
        });
    }
    let lost = f.tail.lost();
    batch.lost += lost - f.lost_reported;
    f.lost_reported = lost;
    let mut device = Vec::new();
    for event in events {
        match event {
            TraceEvent::System(e) => system(f, e, batch, done),
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
            (core, Some(exec)) => finished.contains(&(core, exec)) || f.finished_before.contains(&(core, exec)),
            (_, None) => true,
        };
        let Some(group) = f.building.get_mut(&key) else { continue };
        group.polls += 1;
        if ready || group.polls > MAX_WAIT_POLLS {
            done.extend(f.building.remove(&key));
        }
    }
    f.finished_before = finished;
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
            batch.bytes += BUSY_ENTRY_BYTES;
            batch.busy.push(Busy { pid: f.pid, core: core.core, start_ns: at, end_ns: now, fraction });
        }
    }
    (read, oldest)
}

/// Where execution `exec_id` is in the rings of the runtimes in `dir` now (of process
/// `pid` only, when given), for a link from a metric's exemplar: its spans, as the live
/// timeline draws them, for each runtime whose rings still hold it; and for each
/// runtime looked at, the host time of the oldest event its rings still hold, so that
/// a page can say when the execution has gone. Reads every ring from its oldest event
/// with the live feed's own pairing, once.
pub(crate) fn find_execution(dir: PathBuf, exec_id: u64, pid: Option<u32>) -> Value {
    let mut followed: Runtimes<Tailed> = Runtimes::new(dir);
    let _ = followed.discover(admit);
    let (mut found, mut runtimes) = (Vec::new(), Vec::new());
    for f in followed.iter_mut().filter(|f| pid.is_none_or(|p| f.pid == p)) {
        let mut batch = Batch::new(0, 0, 0);
        let mut oldest_ns: Option<u64> = None;
        // Its spans by core: an execution's group may be sent in parts (the feed waits
        // a few polls for its last spans).
        let mut mine: BTreeMap<Option<u32>, Vec<String>> = BTreeMap::new();
        let mut keep = |groups: &mut dyn Iterator<Item = Group>| {
            for g in groups.filter(|g| g.exec_id == Some(exec_id)) {
                mine.entry(g.core).or_default().extend(g.spans);
            }
        };
        // Rings of 2²⁴ events at most, 65,536 of each a poll: bounded. Only the
        // execution's events are made spans.
        for _ in 0..1024 {
            let mut done = Vec::new();
            let (read, oldest) = poll(f, &mut batch, &mut done, Some(exec_id));
            oldest_ns = match (oldest_ns, oldest) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            keep(&mut done.into_iter());
            if read == 0 {
                break;
            }
        }
        keep(&mut f.state.building.drain().map(|(_, g)| g));
        for (core, spans) in mine {
            let spans: Vec<Value> = spans.iter().filter_map(|s| serde_json::from_str(s).ok()).collect();
            let start_ns = spans.iter().filter_map(|s| s["start_ns"].as_u64()).min();
            let end_ns = spans.iter().filter_map(|s| s["end_ns"].as_u64()).max();
            found.push(json!({
                "pid": f.pid,
                "tag": f.state.tag,
                "core": core,
                "start_ns": start_ns,
                "end_ns": end_ns,
                "spans": spans,
            }));
        }
        runtimes.push(json!({"pid": f.pid, "tag": f.state.tag, "oldest_ns": oldest_ns, "lost": f.state.tail.lost()}));
    }
    json!({"exec_id": exec_id, "now_ns": monotonic_ns(), "found": found, "runtimes": runtimes})
}

fn add_device(f: &mut Tailed, e: &DeviceEvent, offset: i128) {
    let span = device_span(f.pid, e, offset, f.models.get(&e.model_id).map(String::as_str));
    let start = (i128::from(e.start_ns) + offset).max(0) as u64;
    // Transfers outside executions (weights at load) form groups of their own.
    let group =
        f.building.entry((e.nc_idx, e.exec_id)).or_insert_with(|| Group::new(f.pid, Some(e.nc_idx), e.exec_id, start));
    group.add(span, start);
}

/// A system span joins its execution's group when it has one (on a core), else goes
/// out as a group of its own.
fn add_system(f: &mut Tailed, e: &SystemEvent, span: String, start: u64, done: &mut Vec<Group>) {
    match (e.nc_idx, e.exec_id) {
        (Some(core), Some(exec)) => {
            let group = f
                .building
                .entry((core, Some(exec)))
                .or_insert_with(|| Group::new(f.pid, Some(core), Some(exec), start));
            group.add(span, start);
        }
        (core, _) => {
            let mut group = Group::new(f.pid, core, None, start);
            group.add(span, start);
            done.push(group);
        }
    }
}

fn system(f: &mut Tailed, e: SystemEvent, batch: &mut Batch, done: &mut Vec<Group>) {
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
            let span = system_span(f.pid, &e, t0, t1.max(t0), model, details);
            add_system(f, &start, span, t0, done);
        }
        Phase::Instant => {
            let Some(t) = host_time(f, &e) else {
                batch.thinned += 1;
                return;
            };
            let details = serde_json::to_value(&e).unwrap_or_default();
            let model = model(f, &e);
            let span = system_span(f.pid, &e, t, t, model, details);
            add_system(f, &e, span, t, done);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(core: u32, start_ns: u64, fraction: f64) -> Busy {
        Busy { pid: 1, core, start_ns, end_ns: start_ns + 100_000_000, fraction }
    }

    #[test]
    fn busy_fractions_merge_into_fewer_steps_with_their_mean() {
        // A minute of polls on two cores: 1200 entries, room for about 160.
        let all: Vec<Busy> = (0..600u64)
            .flat_map(|k| {
                [busy(0, k * 100_000_000, if k % 2 == 0 { 1.0 } else { 0.5 }), busy(1, k * 100_000_000, 0.25)]
            })
            .collect();
        let merged = coarser(&all, 16 * 1024);
        assert!(merged.len() <= 16 * 1024 / BUSY_ENTRY_BYTES + 2 && merged.len() >= 100, "{}", merged.len());
        for core in [0, 1] {
            let steps: Vec<&Busy> = merged.iter().filter(|b| b.core == core).collect();
            assert_eq!(steps.first().map(|b| b.start_ns), Some(0));
            assert_eq!(steps.last().map(|b| b.end_ns), Some(600 * 100_000_000));
            assert!(steps.windows(2).all(|w| w[0].end_ns <= w[1].start_ns), "steps in order, apart");
            let expected = if core == 0 { 0.75 } else { 0.25 };
            let covered: u64 = steps.iter().map(|b| b.end_ns - b.start_ns).sum();
            let mean = steps.iter().map(|b| b.fraction * (b.end_ns - b.start_ns) as f64).sum::<f64>() / covered as f64;
            assert!((mean - expected).abs() < 0.02, "core {core}: {mean}");
        }
    }
}
