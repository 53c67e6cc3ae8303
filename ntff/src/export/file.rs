//! One file's export: its streams merged by host time, system events paired start to
//! stop per thread, device events moved onto the host clock through the sync points,
//! and the counters and losses written beside them.

use super::layout::{
    Busy, CoreTracks, ENGINE_ORDER, KEY_EXEC_ID, KEY_MODEL_ID, KEY_NRTA_SEQ_ID, Layout, LostCounter, LostIn, MAX_LANES,
    OwnedAnnotation, OwnedValue, QUEUE_ORDER, RANK_COUNTER, RANK_ENGINE, RANK_EXECUTION, RANK_PROCESS_COUNTER,
    RANK_QUEUE, RANK_THREAD, SystemKind, bucket_width,
};
use super::*;

/// One stream's place in the merge of system events.
#[derive(Debug)]
pub(super) struct Cursor<'f> {
    core: Option<u32>,
    chunks: VecDeque<&'f ChunkInfo>,
    chunk: Chunk,
    next: usize,
    /// System losses of the chunk: (before, events), by position.
    losses: VecDeque<(u32, u64)>,
    /// Host time of the last system event taken.
    last_ts: u64,
}

/// Chunks of a stream decoded ahead on another thread, in order.
pub(super) type Decoded<'f> = Receiver<(&'f ChunkInfo, Result<Chunk, NtffError>)>;

/// Streams up to which each gets a thread decoding its chunks ahead of the export.
pub(super) const MAX_DECODE_THREADS: usize = 8;

/// The export of one file.
pub(super) struct FileExport<'f> {
    file: &'f NtffFile,
    /// The file's host clock onto the times written (the job's root clock, or itself).
    root: RootClock,
    key: u64,
    pid: u32,
    process: TrackIx,
    process_uuid: u64,
    device: bool,
    types: Option<HashSet<Sym>>,
    /// The cores' tracks, and where each core's are.
    cores: Vec<CoreTracks>,
    core_slots: HashMap<u32, usize>,
    threads: HashMap<u32, TrackIx>,
    host_memory: (Option<TrackIx>, i64),
    host_lost: LostCounter,
    /// Name ids of the file's strings and descriptors, once used.
    sym_names: Vec<Option<NameId>>,
    descriptor_names: Vec<Option<NameId>>,
    kinds: Vec<Option<SystemKind>>,
    /// Flows started by `nrt_execute` and not yet ended.
    flows: HashSet<u64>,
    origin: u64,
    width: u64,
    cursors: Vec<Cursor<'f>>,
    /// Scratch for counter values.
    values: Vec<(u64, f64)>,
}

impl<'f> FileExport<'f> {
    pub(super) fn new<S: Sink>(
        layout: &mut Layout<S>,
        file: &'f NtffFile,
        key: u64,
        options: &'f ExportOptions,
        root: RootClock,
    ) -> Result<FileExport<'f>, NtffError> {
        let meta = file.metadata();
        let pid = meta.pid;
        let program = meta.command.first().map(|c| c.rsplit('/').next().unwrap_or(c).to_string());
        let name = match (meta.process_tag.is_empty(), program) {
            (false, _) => meta.process_tag.clone(),
            (true, Some(program)) => program,
            (true, None) => "neuron runtime".to_string(),
        };
        let mut labels = vec![format!("neuron runtime {}", meta.runtime_version)];
        if !meta.capture_kind.is_empty() {
            labels.push(meta.capture_kind.clone());
        }
        let process = layout.add_track(
            key,
            None,
            0,
            pid,
            TrackKind::Process { pid, name, cmdline: meta.command.clone(), labels },
        )?;
        let spans: Vec<(u64, u64)> = file.chunks().iter().filter_map(|c| c.host_span).collect();
        let origin = spans.iter().map(|s| root.to_root(s.0)).min().unwrap_or(0);
        let last = spans.iter().map(|s| root.to_root(s.1)).max().unwrap_or(origin);
        let types = options
            .system_types
            .as_ref()
            .map(|types| types.iter().filter_map(|t| file.find_string(t.trim())).collect::<HashSet<Sym>>());
        let mut export = FileExport {
            file,
            root,
            key,
            pid,
            process,
            process_uuid: key << 40 | (u64::from(process) + 1),
            device: options.system_types.is_none(),
            types,
            cores: Vec::new(),
            core_slots: HashMap::new(),
            threads: HashMap::new(),
            host_memory: (None, 0),
            host_lost: LostCounter::default(),
            sym_names: Vec::new(),
            descriptor_names: Vec::new(),
            kinds: Vec::new(),
            flows: HashSet::new(),
            origin,
            width: bucket_width(last.saturating_sub(origin)),
            cursors: Vec::new(),
            values: Vec::new(),
        };
        // Streams in the order of their first chunk, each with its chunks in file order.
        let mut streams: Vec<Option<u32>> = Vec::new();
        let mut by_stream: HashMap<Option<u32>, VecDeque<&'f ChunkInfo>> = HashMap::new();
        for info in file.select(options.cores.as_deref(), None) {
            if !by_stream.contains_key(&info.core) {
                streams.push(info.core);
            }
            by_stream.entry(info.core).or_default().push_back(info);
        }
        let mut clocks = file.core_clocks(options.cores.as_deref());
        for core in streams.iter().flatten() {
            let slot = export.core(layout, *core)?;
            let sync = clocks.remove(core).unwrap_or_default();
            export.cores[slot].sync = sync.map_host(|t| export.root.to_root(t));
        }
        export.cursors = streams
            .into_iter()
            .map(|core| Cursor {
                core,
                chunks: by_stream.remove(&core).unwrap_or_default(),
                chunk: Chunk::default(),
                next: 0,
                losses: VecDeque::new(),
                last_ts: origin,
            })
            .collect();
        Ok(export)
    }

    /// Merges the streams' system events by host time, reading each stream's chunks
    /// in turn and writing their device events as they are read.
    pub(super) fn run<S: Sink>(
        mut self,
        layout: &mut Layout<S>,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(), NtffError> {
        let file = self.file;
        std::thread::scope(|scope| {
            // Decoding a chunk costs about as much as laying it out: with a thread per
            // stream decoding one chunk ahead, the two overlap. The queues belong to
            // this closure, so that leaving it in any way (an error, a panic) closes
            // them and stops the threads, which the scope then joins.
            let mut queues: Vec<Option<Decoded<'f>>> = Vec::new();
            if self.cursors.len() <= MAX_DECODE_THREADS {
                for cursor in &mut self.cursors {
                    let chunks = std::mem::take(&mut cursor.chunks);
                    let (tx, rx) = std::sync::mpsc::sync_channel(1);
                    scope.spawn(move || {
                        for info in chunks {
                            if tx.send((info, file.read_chunk(info))).is_err() {
                                break;
                            }
                        }
                    });
                    queues.push(Some(rx));
                }
            }
            self.merge(layout, progress, &queues)
        })?;
        self.finish(layout)
    }

    fn merge<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        progress: &mut dyn FnMut(Progress),
        queues: &[Option<Decoded<'f>>],
    ) -> Result<(), NtffError> {
        let mut heap = BinaryHeap::new();
        for k in 0..self.cursors.len() {
            if let Some(ts) = self.advance(layout, k, progress, queues)? {
                heap.push(Reverse((ts, k)));
            }
        }
        while let Some(Reverse((_, k))) = heap.pop() {
            let cursor = &mut self.cursors[k];
            let index = cursor.next;
            cursor.next += 1;
            let event = std::mem::replace(&mut cursor.chunk.system[index], placeholder_event());
            let core = cursor.core;
            let ts = self.host_time(&event);
            self.cursors[k].last_ts = ts;
            while let Some(&(before, events)) = self.cursors[k].losses.front() {
                if before as usize > index {
                    break;
                }
                self.cursors[k].losses.pop_front();
                self.system_loss(layout, core, ts, events)?;
            }
            self.system_event(layout, core, &event)?;
            if let Some(ts) = self.advance(layout, k, progress, queues)? {
                heap.push(Reverse((ts, k)));
            }
        }
        Ok(())
    }

    /// The merge key of stream `k`'s next system event, reading chunks as needed.
    fn advance<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        k: usize,
        progress: &mut dyn FnMut(Progress),
        queues: &[Option<Decoded<'f>>],
    ) -> Result<Option<u64>, NtffError> {
        loop {
            let cursor = &self.cursors[k];
            if let Some(event) = cursor.chunk.system.get(cursor.next) {
                return Ok(Some(self.host_time(event)));
            }
            // Losses after the chunk's last system event.
            let (core, last) = (cursor.core, cursor.last_ts);
            while let Some((_, events)) = self.cursors[k].losses.pop_front() {
                self.system_loss(layout, core, last, events)?;
            }
            let next = match queues.get(k).and_then(Option::as_ref) {
                Some(queue) => queue.recv().ok(),
                None => self.cursors[k].chunks.pop_front().map(|info| (info, self.file.read_chunk(info))),
            };
            let Some((info, chunk)) = next else { return Ok(None) };
            layout.progress.events_done += u64::from(info.system_events) + u64::from(info.device_events);
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(_) => {
                    layout.summary.damaged_chunks += 1;
                    layout.summary.damaged_chunk_events +=
                        u64::from(info.system_events) + u64::from(info.device_events);
                    progress(layout.progress);
                    continue;
                }
            };
            if self.device {
                self.device_events(layout, &chunk)?;
            } else {
                let lost: u64 = chunk.losses.iter().filter(|l| l.device).map(|l| l.events).sum();
                layout.summary.ring_events_lost += lost;
            }
            let cursor = &mut self.cursors[k];
            cursor.losses = chunk.losses.iter().filter(|l| !l.device).map(|l| (l.before, l.events)).collect();
            cursor.chunk = chunk;
            cursor.chunk.device = Vec::new();
            cursor.next = 0;
            progress(layout.progress);
        }
    }

    /// Host time of a system event (device-clock events through their core's sync points).
    fn host_time(&self, e: &SystemEvent) -> u64 {
        match (e.clock, e.core) {
            (Clock::Host, _) | (Clock::Device, None) => self.root.to_root(e.timestamp_ns),
            (Clock::Device, Some(core)) => self
                .core_slots
                .get(&core)
                .and_then(|&slot| self.cores[slot].sync.to_host(e.timestamp_ns))
                .unwrap_or_else(|| self.root.to_root(e.timestamp_ns)),
        }
    }

    /// The slot of `core`'s tracks, creating its group on first use.
    fn core<S: Sink>(&mut self, layout: &mut Layout<S>, core: u32) -> Result<usize, NtffError> {
        if let Some(&slot) = self.core_slots.get(&core) {
            return Ok(slot);
        }
        {
            let group = layout.add_track(
                self.key,
                Some((self.process, self.process_uuid)),
                core as i32,
                self.pid,
                TrackKind::Group { name: format!("NeuronCore {core}") },
            )?;
            let tracks = CoreTracks {
                group,
                group_uuid: self.key << 40 | (u64::from(group) + 1),
                execution: None,
                execution_start: None,
                lane_sets: Vec::new(),
                sets: HashMap::new(),
                set_keys: Vec::new(),
                by_descriptor: Vec::new(),
                utilisation: None,
                busy: Busy::new(self.origin, self.width),
                memory: None,
                memory_bytes: 0,
                system_lost: LostCounter::default(),
                device_lost: LostCounter::default(),
                sync: SyncClock::default(),
            };
            self.cores.push(tracks);
        }
        let slot = self.cores.len() - 1;
        self.core_slots.insert(core, slot);
        Ok(slot)
    }

    /// A track in the group of the core in `slot`.
    fn core_track<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        slot: usize,
        rank: i32,
        kind: TrackKind,
    ) -> Result<TrackIx, NtffError> {
        let group = (self.cores[slot].group, self.cores[slot].group_uuid);
        layout.add_track(self.key, Some(group), rank, self.pid, kind)
    }

    fn sym_name<S: Sink>(&mut self, layout: &mut Layout<S>, sym: Sym) -> NameId {
        let k = sym.0 as usize;
        if self.sym_names.len() <= k {
            self.sym_names.resize(k + 1, None);
        }
        if let Some(id) = self.sym_names[k] {
            return id;
        }
        let id = layout.names.intern(&self.file.string_or_placeholder(sym));
        self.sym_names[k] = Some(id);
        id
    }

    fn kind(&mut self, sym: Sym) -> SystemKind {
        let k = sym.0 as usize;
        if let Some(Some(kind)) = self.kinds.get(k) {
            return *kind;
        }
        let kind = self.file.string(sym).map_or(SystemKind::Other, SystemKind::of);
        if self.kinds.len() <= k {
            self.kinds.resize(k + 1, None);
        }
        self.kinds[k] = Some(kind);
        kind
    }

    fn device_events<S: Sink>(&mut self, layout: &mut Layout<S>, chunk: &Chunk) -> Result<(), NtffError> {
        let Some(core) = chunk.core else { return Ok(()) };
        let slot = self.core(layout, core)?;
        let mut losses = chunk.losses.iter().filter(|l| l.device).peekable();
        for (index, e) in chunk.device.iter().enumerate() {
            while let Some(loss) = losses.next_if(|l| l.before as usize <= index) {
                let ts = self.cores[slot].sync.to_host(e.start_ns).unwrap_or(self.origin);
                self.device_loss(layout, slot, ts, loss.events)?;
            }
            self.device_event(layout, slot, e)?;
        }
        let end = chunk.device.last().and_then(|e| self.cores[slot].sync.to_host(e.end_ns)).unwrap_or(self.origin);
        for loss in losses {
            self.device_loss(layout, slot, end, loss.events)?;
        }
        Ok(())
    }

    fn device_event<S: Sink>(&mut self, layout: &mut Layout<S>, slot: usize, e: &DeviceEvent) -> Result<(), NtffError> {
        let tracks = &self.cores[slot];
        let (Some(start), Some(end)) = (tracks.sync.to_host(e.start_ns), tracks.sync.to_host(e.end_ns)) else {
            layout.summary.unaligned_device_events += 1;
            return Ok(());
        };
        let end = end.max(start);
        let set = match tracks.by_descriptor.get(e.descriptor.0 as usize) {
            Some(Some(set)) => *set,
            _ => match self.lane_set(layout, slot, e.descriptor)? {
                Some(set) => set,
                None => {
                    // Its descriptor was lost with a damaged record.
                    layout.summary.undescribed_device_events += 1;
                    return Ok(());
                }
            },
        };
        let name = match self.descriptor_names.get(e.descriptor.0 as usize) {
            Some(Some(name)) => *name,
            _ => self.descriptor_name(layout, e.descriptor),
        };
        let mut k = 0;
        while let Some(&lane) = self.cores[slot].lane_sets[set].get(k) {
            if layout.place(lane, start, end, name, k + 1 == MAX_LANES)? {
                return Ok(());
            }
            k += 1;
        }
        // It overlaps the open slices of every lane without nesting: a new lane.
        let lane = self.add_lane(layout, slot, set)?;
        layout.place(lane, start, end, name, true)?;
        Ok(())
    }

    /// The lane set of a descriptor's engine or queue, creating its first track.
    fn lane_set<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        slot: usize,
        id: DescriptorId,
    ) -> Result<Option<usize>, NtffError> {
        let key = match self.file.descriptor(id) {
            Some(Descriptor::Instruction { engine, .. }) => (false, *engine),
            Some(Descriptor::Dma { queue, .. }) => (true, *queue),
            None => return Ok(None),
        };
        let set = match self.cores[slot].sets.get(&key) {
            Some(&set) => set,
            None => {
                let tracks = &mut self.cores[slot];
                let set = tracks.lane_sets.len();
                tracks.lane_sets.push(Vec::new());
                tracks.set_keys.push(key);
                tracks.sets.insert(key, set);
                self.add_lane(layout, slot, set)?;
                set
            }
        };
        let tracks = &mut self.cores[slot];
        let k = id.0 as usize;
        if tracks.by_descriptor.len() <= k {
            tracks.by_descriptor.resize(k + 1, None);
        }
        tracks.by_descriptor[k] = Some(set);
        Ok(Some(set))
    }

    /// A slice name for a descriptor: `opcode hlo`, or `queue[index] size`.
    fn descriptor_name<S: Sink>(&mut self, layout: &mut Layout<S>, id: DescriptorId) -> NameId {
        let text = match self.file.descriptor(id) {
            Some(Descriptor::Instruction { opcode, hlo, .. }) => {
                format!("{} {}", self.file.string_or_placeholder(*opcode), self.file.string_or_placeholder(*hlo))
            }
            Some(Descriptor::Dma { queue, index, bytes, .. }) => {
                format!("{}[{index}] {}", self.file.string_or_placeholder(*queue), human_bytes(*bytes))
            }
            None => format!("<descriptor {}>", id.0),
        };
        let name = layout.names.intern(&text);
        let k = id.0 as usize;
        if self.descriptor_names.len() <= k {
            self.descriptor_names.resize(k + 1, None);
        }
        self.descriptor_names[k] = Some(name);
        name
    }

    /// Another lane for lane set `set` of core slot `slot`.
    fn add_lane<S: Sink>(&mut self, layout: &mut Layout<S>, slot: usize, set: usize) -> Result<TrackIx, NtffError> {
        let tracks = &self.cores[slot];
        let (dma, unit) = tracks.set_keys[set];
        let lane = tracks.lane_sets[set].len();
        let group = (tracks.group, tracks.group_uuid);
        let unit = self.file.string_or_placeholder(unit).into_owned();
        let (base, order) = if dma {
            (RANK_QUEUE, QUEUE_ORDER.iter().position(|q| *q == unit).unwrap_or(QUEUE_ORDER.len()))
        } else {
            (RANK_ENGINE, ENGINE_ORDER.iter().position(|e| *e == unit).unwrap_or(ENGINE_ORDER.len()))
        };
        let mut name = if dma { format!("DMA {unit}") } else { unit };
        if lane > 0 {
            name = format!("{name} ({})", lane + 1);
        }
        let rank = base + order as i32 * MAX_LANES as i32 + lane as i32;
        let track = layout.add_track(self.key, Some(group), rank, self.pid, TrackKind::Slices { name })?;
        self.cores[slot].lane_sets[set].push(track);
        Ok(track)
    }

    fn device_loss<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        slot: usize,
        ts: u64,
        events: u64,
    ) -> Result<(), NtffError> {
        for &lane in self.cores[slot].lane_sets.iter().flatten() {
            layout.sink.dropped(lane, LOSS_OVERWRITE);
        }
        self.count_lost(layout, LostIn::Device(slot), ts, events)
    }

    fn system_loss<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        core: Option<u32>,
        ts: u64,
        events: u64,
    ) -> Result<(), NtffError> {
        for &thread in self.threads.values() {
            layout.sink.dropped(thread, LOSS_OVERWRITE);
        }
        let place = match core {
            Some(core) => {
                let slot = self.core(layout, core)?;
                if let Some(execution) = self.cores[slot].execution {
                    layout.sink.dropped(execution, LOSS_OVERWRITE);
                }
                LostIn::System(slot)
            }
            None => LostIn::Host,
        };
        self.count_lost(layout, place, ts, events)
    }

    fn lost_counter(&mut self, place: LostIn) -> &mut LostCounter {
        match place {
            LostIn::Device(slot) => &mut self.cores[slot].device_lost,
            LostIn::System(slot) => &mut self.cores[slot].system_lost,
            LostIn::Host => &mut self.host_lost,
        }
    }

    /// Adds `events` to a cumulative counter of lost events, created at zero on first use.
    fn count_lost<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        place: LostIn,
        ts: u64,
        events: u64,
    ) -> Result<(), NtffError> {
        layout.summary.ring_events_lost += events;
        let track = match self.lost_counter(place).track {
            Some(track) => track,
            None => {
                let (parent, rank, name) = match place {
                    LostIn::Device(slot) => {
                        ((self.cores[slot].group, self.cores[slot].group_uuid), RANK_COUNTER + 3, "device events lost")
                    }
                    LostIn::System(slot) => {
                        ((self.cores[slot].group, self.cores[slot].group_uuid), RANK_COUNTER + 2, "system events lost")
                    }
                    LostIn::Host => {
                        ((self.process, self.process_uuid), RANK_PROCESS_COUNTER + 1, "host system events lost")
                    }
                };
                let kind = TrackKind::Counter {
                    name: name.into(),
                    unit: CounterUnit::Count,
                    description: "Events the ring overwrote before they were read, since the trace began".into(),
                };
                let track = layout.add_track(self.key, Some(parent), rank, self.pid, kind)?;
                layout.counter(track, self.origin, 0.0)?;
                self.lost_counter(place).track = Some(track);
                track
            }
        };
        let counter = self.lost_counter(place);
        counter.total += events;
        let total = counter.total;
        layout.counter(track, ts, total as f64)
    }

    fn system_event<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        core: Option<u32>,
        e: &SystemEvent,
    ) -> Result<(), NtffError> {
        let kind = self.kind(e.name);
        let ts = self.host_time(e);
        let shown = self.types.as_ref().is_none_or(|t| t.contains(&e.name));
        match kind {
            SystemKind::SyncPoint => return Ok(()),
            SystemKind::DeviceExecution => {
                let Some(core) = core else { return Ok(()) };
                let slot = self.core(layout, core)?;
                if e.clock == Clock::Device && self.cores[slot].sync.is_empty() {
                    layout.summary.unaligned_system_events += 1;
                    return Ok(());
                }
                self.execution_busy(layout, slot, e, ts)?;
                if !shown {
                    return Ok(());
                }
                let track = self.execution_track(layout, slot)?;
                let flow_in = match (e.phase, e.exec_id) {
                    (Phase::Start, Some(exec)) => Some(flow_id(self.key, core, exec)).filter(|f| self.flows.remove(f)),
                    _ => None,
                };
                return self.span(layout, track, e, ts, None, flow_in);
            }
            SystemKind::TensorAllocate | SystemKind::TensorFree => self.memory(layout, core, kind, e, ts)?,
            SystemKind::Execute | SystemKind::Collective | SystemKind::Other => {}
        }
        if !shown {
            return Ok(());
        }
        let track = self.thread_track(layout, e.thread_id)?;
        let flow_out = match (kind, e.phase, e.exec_id, core) {
            (SystemKind::Execute, Phase::Start, Some(exec), Some(core)) => {
                let flow = flow_id(self.key, core, exec);
                self.flows.insert(flow);
                Some(flow)
            }
            // The same id in every rank's profile: one flow through the collective's parts.
            (SystemKind::Collective, Phase::Start, ..) if layout.sink.chains_flows() => {
                let flow = self.collective_flow(e);
                layout.summary.collective_flows += u64::from(flow.is_some());
                flow
            }
            _ => None,
        };
        self.span(layout, track, e, ts, flow_out, None)
    }

    /// The flow of a `cc_running` start: from its communicator, sequence and index in
    /// the execution, which every rank of the collective shares.
    fn collective_flow(&self, e: &SystemEvent) -> Option<u64> {
        let arg = |key: &str| {
            let key = self.file.find_string(key)?;
            e.args.iter().find(|a| a.key == key).and_then(|a| match a.value {
                crate::ArgValue::U64(v) => Some(v),
                _ => None,
            })
        };
        let (communicator, sequence, index) = (arg("communicator")?, arg("sequence")?, arg("op_id")?);
        Some(collective_flow_id(communicator, sequence, index))
    }

    /// Writes a start, stop or instant on a track whose slices pair by tracking id.
    fn span<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        track: TrackIx,
        e: &SystemEvent,
        ts: u64,
        flow_out: Option<u64>,
        flow_in: Option<u64>,
    ) -> Result<(), NtffError> {
        let name = self.sym_name(layout, e.name);
        match e.phase {
            Phase::Start => {
                let args = self.annotations(layout, e);
                let ts = layout.at(track, ts);
                layout.tracks[track as usize].open_ids.push(e.tracking_id);
                layout.summary.system_slices += 1;
                layout.summary.flows += u64::from(flow_in.is_some());
                let args: Vec<Annotation<'_>> = args.iter().map(|a| a.borrow(&layout.names)).collect();
                let name = Name { id: name, text: &layout.names.text[name as usize] };
                layout.sink.begin(track, ts, name, &args, flow_out, flow_in).map_err(NtffError::write)
            }
            Phase::Stop => {
                let open = &layout.tracks[track as usize].open_ids;
                match open.iter().rposition(|&id| id == e.tracking_id) {
                    Some(at) => {
                        let inner = open.len() - at;
                        layout.summary.unfinished += inner as u64 - 1;
                        for _ in 0..inner {
                            layout.tracks[track as usize].open_ids.pop();
                            layout.end(track, ts)?;
                        }
                        Ok(())
                    }
                    None => {
                        layout.summary.stops_without_start += 1;
                        let text =
                            format!("{} (stop; its start is not in the trace)", layout.names.text[name as usize]);
                        let orphan = layout.names.intern(&text);
                        let args = self.annotations(layout, e);
                        layout.instant(track, ts, orphan, &args)
                    }
                }
            }
            Phase::Instant => {
                let args = self.annotations(layout, e);
                layout.instant(track, ts, name, &args)
            }
        }
    }

    /// The event's ids and arguments, as annotations.
    fn annotations<S: Sink>(&mut self, layout: &mut Layout<S>, e: &SystemEvent) -> Vec<OwnedAnnotation> {
        let mut args = Vec::with_capacity(e.args.len() + 3);
        if let Some(exec) = e.exec_id {
            args.push(OwnedAnnotation { key: KEY_EXEC_ID, value: OwnedValue::U64(exec) });
        }
        if let Some(model) = e.model_id {
            args.push(OwnedAnnotation { key: KEY_MODEL_ID, value: OwnedValue::U64(model.into()) });
        }
        if let Some(seq) = e.nrta_seq_id {
            args.push(OwnedAnnotation { key: KEY_NRTA_SEQ_ID, value: OwnedValue::U64(seq) });
        }
        for arg in &e.args {
            let key = self.sym_name(layout, arg.key);
            let value = match arg.value {
                ArgValue::U64(v) => OwnedValue::U64(v),
                ArgValue::I64(v) => OwnedValue::I64(v),
                ArgValue::Str(s) => OwnedValue::Str(self.sym_name(layout, s)),
            };
            args.push(OwnedAnnotation { key, value });
        }
        args
    }

    fn thread_track<S: Sink>(&mut self, layout: &mut Layout<S>, tid: u32) -> Result<TrackIx, NtffError> {
        if let Some(&track) = self.threads.get(&tid) {
            return Ok(track);
        }
        let track = layout.add_track(
            self.key,
            Some((self.process, self.process_uuid)),
            RANK_THREAD,
            self.pid,
            TrackKind::Thread { pid: self.pid, tid, name: format!("thread {tid}") },
        )?;
        self.threads.insert(tid, track);
        Ok(track)
    }

    fn execution_track<S: Sink>(&mut self, layout: &mut Layout<S>, slot: usize) -> Result<TrackIx, NtffError> {
        if let Some(track) = self.cores[slot].execution {
            return Ok(track);
        }
        let kind = TrackKind::Slices { name: "executions".into() };
        let track = self.core_track(layout, slot, RANK_EXECUTION, kind)?;
        self.cores[slot].execution = Some(track);
        Ok(track)
    }

    /// Adds an execution's busy time to its core's utilisation counter.
    fn execution_busy<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        slot: usize,
        e: &SystemEvent,
        ts: u64,
    ) -> Result<(), NtffError> {
        let tracks = &mut self.cores[slot];
        match e.phase {
            Phase::Start => {
                tracks.execution_start = Some((e.tracking_id, ts));
                Ok(())
            }
            Phase::Stop => {
                let Some((_, start)) = tracks.execution_start.take().filter(|(id, _)| *id == e.tracking_id) else {
                    return Ok(());
                };
                let mut values = std::mem::take(&mut self.values);
                values.clear();
                self.cores[slot].busy.add(start, ts.max(start), &mut values);
                let result = self.write_utilisation(layout, slot, &values);
                self.values = values;
                result
            }
            Phase::Instant => Ok(()),
        }
    }

    fn write_utilisation<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        slot: usize,
        values: &[(u64, f64)],
    ) -> Result<(), NtffError> {
        if values.is_empty() {
            return Ok(());
        }
        let track = match self.cores[slot].utilisation {
            Some(track) => track,
            None => {
                let description =
                    format!("Share of each {} the core spent executing (nc_exec_running)", human_duration(self.width));
                let kind = TrackKind::Counter { name: "utilisation".into(), unit: CounterUnit::Percent, description };
                let track = self.core_track(layout, slot, RANK_COUNTER, kind)?;
                self.cores[slot].utilisation = Some(track);
                track
            }
        };
        for &(ts, value) in values {
            layout.counter(track, ts, value)?;
        }
        Ok(())
    }

    /// Follows tensor allocations: device tensors per core, host tensors per process.
    fn memory<S: Sink>(
        &mut self,
        layout: &mut Layout<S>,
        core: Option<u32>,
        kind: SystemKind,
        e: &SystemEvent,
        ts: u64,
    ) -> Result<(), NtffError> {
        let Some(delta) = tensor_bytes(self.file, e, kind == SystemKind::TensorAllocate) else { return Ok(()) };
        let description = "Bytes of tensors allocated minus freed since the trace began".to_string();
        let (track, value) = match core {
            Some(core) => {
                let slot = self.core(layout, core)?;
                let track = match self.cores[slot].memory {
                    Some(track) => track,
                    None => {
                        let kind =
                            TrackKind::Counter { name: "tensor memory".into(), unit: CounterUnit::Bytes, description };
                        let track = self.core_track(layout, slot, RANK_COUNTER + 1, kind)?;
                        self.cores[slot].memory = Some(track);
                        track
                    }
                };
                self.cores[slot].memory_bytes = self.cores[slot].memory_bytes.saturating_add(delta);
                (track, self.cores[slot].memory_bytes)
            }
            None => {
                let track = match self.host_memory.0 {
                    Some(track) => track,
                    None => {
                        let kind = TrackKind::Counter {
                            name: "host tensor memory".into(),
                            unit: CounterUnit::Bytes,
                            description,
                        };
                        let process = Some((self.process, self.process_uuid));
                        let track = layout.add_track(self.key, process, RANK_PROCESS_COUNTER, self.pid, kind)?;
                        self.host_memory.0 = Some(track);
                        track
                    }
                };
                self.host_memory.1 = self.host_memory.1.saturating_add(delta);
                (track, self.host_memory.1)
            }
        };
        layout.counter(track, ts, value as f64)
    }

    /// Closes the device lanes and writes the last utilisation values.
    fn finish<S: Sink>(mut self, layout: &mut Layout<S>) -> Result<(), NtffError> {
        for slot in 0..self.cores.len() {
            for &lane in self.cores[slot].lane_sets.iter().flatten() {
                layout.close_lane(lane)?;
            }
            let mut values = Vec::new();
            self.cores[slot].busy.finish(&mut values);
            if self.cores[slot].utilisation.is_some() {
                self.write_utilisation(layout, slot, &values)?;
            }
            if let Some(execution) = self.cores[slot].execution {
                layout.summary.unfinished += layout.tracks[execution as usize].open_ids.len() as u64;
            }
        }
        for &thread in self.threads.values() {
            layout.summary.unfinished += layout.tracks[thread as usize].open_ids.len() as u64;
        }
        Ok(())
    }
}

/// A system event to leave in place of one taken out of a chunk.
/// The tensor bytes an `nrt_tensor_allocate` (`allocate`) or `nrt_tensor_free` event
/// adds to the allocated total, negative for a free: an allocation counts at its stop,
/// a free at its start, either as an instant; `None` for the other phase, or without a
/// `size`.
pub(crate) fn tensor_bytes(file: &NtffFile, e: &SystemEvent, allocate: bool) -> Option<i64> {
    let counted = match e.phase {
        Phase::Instant => true,
        Phase::Stop => allocate,
        Phase::Start => !allocate,
    };
    if !counted {
        return None;
    }
    let size = e.args.iter().find_map(|a| match a.value {
        ArgValue::U64(v) if file.string(a.key) == Some("size") => Some(i64::try_from(v).unwrap_or(i64::MAX)),
        _ => None,
    })?;
    Some(if allocate { size } else { -size })
}

pub(super) fn placeholder_event() -> SystemEvent {
    SystemEvent {
        core: None,
        id: 0,
        name: Sym::EMPTY,
        phase: Phase::Instant,
        clock: Clock::Host,
        timestamp_ns: 0,
        tracking_id: 0,
        thread_id: 0,
        exec_id: None,
        model_id: None,
        nrta_seq_id: None,
        args: Vec::new(),
    }
}

/// A flow id unique to one execution of one core of one file.
pub(super) fn flow_id(file: u64, core: u32, exec: u64) -> u64 {
    // Mixed so that ids of different files and cores do not collide in practice.
    let mut x = exec ^ (u64::from(core) << 48) ^ (file << 56);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

/// The flow of a collective: the same in every rank's profile, apart from executions'.
fn collective_flow_id(communicator: u64, sequence: u64, index: u64) -> u64 {
    let mut x = (communicator << 32 | sequence & 0xffff_ffff) ^ index.rotate_left(17) ^ 0x6363_5f72_756e_0000;
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

pub(super) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

pub(super) fn human_duration(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 && n.is_multiple_of(1_000_000_000) => format!("{} s", n / 1_000_000_000),
        n if n >= 1_000_000 && n.is_multiple_of(1_000_000) => format!("{} ms", n / 1_000_000),
        n if n >= 1_000 && n.is_multiple_of(1_000) => format!("{} µs", n / 1_000),
        n => format!("{n} ns"),
    }
}
