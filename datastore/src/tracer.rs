//! Event emission: the runtime's actions as system-trace and device-trace records in
//! the datastore rings, and the lossless counters beside them.
//!
//! [`Tracer`] is what the runtime calls. Whether a kind of event is recorded is one
//! relaxed load of a per-ring mask and a branch; recording one is a tick read, a
//! claimed slot and sixteen stores. Nothing here allocates, locks or makes a system
//! call on that path (the thread id is cached per thread). Counting is relaxed atomic
//! additions into the same file.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::clock::{self, DeviceClock};
use crate::event::{EventType, Payload, Phase};
use crate::instructions::{InstructionSpan, InstructionTrace};
use crate::layout::{self, DEFAULT_MAX_EVENTS_PER_NC};
use crate::record::{
    DEVICE_KIND_INSTRUCTION, DEVICE_RECORD_WORDS, DeviceRecord, FLAG_DEVICE_CLOCK, FLAG_NRTA_SEQ, FLAG_STATUS,
    InstructionRun, RUN_MAX, SYSTEM_RECORD_WORDS, SystemRecord,
};
use crate::ring::{Claim, RingRef};
use crate::topology::CoreSet;
use crate::writer::DatastoreWriter;

/// A mask with every system event type.
pub const ALL_SYSTEM_EVENTS: u64 = (1 << EventType::ALL.len()) - 1;

/// A name in an event filter that is neither an event type nor a group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown event type `{0}`; use hardware, software or one of {names}",
    names = EventType::ALL.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
)]
pub struct UnknownEventType(pub String);

/// Parses `NEURON_RT_INSPECT_EVENT_FILTER_TYPE`: event names and the groups
/// `hardware` and `software`, comma-separated; `^x` excludes `x`. Only exclusions
/// means "everything but".
pub fn parse_event_filter(text: &str) -> Result<u64, UnknownEventType> {
    let mut include = 0u64;
    let mut exclude = 0u64;
    let mut any_include = false;
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (negate, name) = match item.strip_prefix('^') {
            Some(rest) => (true, rest.trim()),
            None => (false, item),
        };
        let mask = match name {
            "hardware" => EventType::ALL.iter().filter(|t| t.is_hardware()).fold(0, |m, t| m | t.bit()),
            "software" => EventType::ALL.iter().filter(|t| !t.is_hardware()).fold(0, |m, t| m | t.bit()),
            _ => EventType::from_name(name).map(EventType::bit).ok_or_else(|| UnknownEventType(name.to_owned()))?,
        };
        if negate {
            exclude |= mask;
        } else {
            include |= mask;
            any_include = true;
        }
    }
    Ok(if any_include { include } else { ALL_SYSTEM_EVENTS } & !exclude)
}

/// What the rings record, from the `NEURON_RT_INSPECT_*` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectConfig {
    /// System trace rings record (`NEURON_RT_INSPECT_ENABLE`, `_SYSTEM_PROFILE`).
    pub system: bool,
    /// Device trace rings record (`NEURON_RT_INSPECT_ENABLE`, `_DEVICE_PROFILE`).
    pub device: bool,
    /// Only these cores record (`NEURON_RT_INSPECT_EVENT_FILTER_NC`).
    pub cores: Option<CoreSet>,
    /// System event types recorded (`NEURON_RT_INSPECT_EVENT_FILTER_TYPE`).
    pub event_types: u64,
    /// Ring size; rounded up to a power of two.
    pub max_events_per_nc: u64,
    /// Refuse new events instead of overwriting the oldest (`NEURON_VIRT_TRACE_DISCARD`).
    pub discard: bool,
}

impl Default for InspectConfig {
    fn default() -> InspectConfig {
        InspectConfig {
            system: true,
            device: true,
            cores: None,
            event_types: ALL_SYSTEM_EVENTS,
            max_events_per_nc: DEFAULT_MAX_EVENTS_PER_NC,
            discard: false,
        }
    }
}

/// Emits events into a datastore's rings and counts into its counters.
#[derive(Debug)]
pub struct Tracer {
    pub(crate) store: DatastoreWriter,
    /// Per ring position (0: process ring, 1 + slot: core rings), the system event
    /// types recorded now.
    system_masks: Vec<AtomicU64>,
    /// The masks the configuration asks for, restored when a trace session stops.
    configured_system_masks: Vec<u64>,
    /// Per core slot: whether device events are recorded.
    device_enabled: Vec<AtomicBool>,
    configured_device: Vec<bool>,
    /// Per ring position (system rings, then device rings): events consumed by the
    /// in-process trace session; discard mode refuses events a whole ring ahead.
    consumed: Vec<AtomicU64>,
    /// Every ring, in the same positions as `consumed`.
    rings: Vec<RingRef>,
    discard: bool,
    device_clocks: Vec<DeviceClock>,
    /// Nanoseconds per tick, measured at init (for durations).
    pub(crate) ns_per_tick: f64,
    next_tracking_id: AtomicU64,
    next_exec_id: AtomicU64,
    /// Per core slot: the model that ran last (for `nrt_model_switch`).
    last_model: Vec<AtomicU64>,
}

/// Identifies the ring an event goes to: 0 is the process ring, `1 + slot` a core's.
pub type RingPos = usize;

/// When an event happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// Now: the clock is read once the event's type is known to be recorded.
    Now,
    /// At a host tick read earlier (`clock::ticks`).
    Ticks(u64),
    /// At a time on the core's device clock, in nanoseconds.
    DeviceNs(u64),
}

/// What a system event shares with the other events of its span: the ring it goes to,
/// its type and ids, and the tracking id its start and stop carry (0 for an instant,
/// and for a span whose type was not recorded when it opened).
#[derive(Debug, Clone, Copy)]
pub struct EventHead {
    pub ring: RingPos,
    pub event_type: EventType,
    pub ids: EventIds,
    pub tracking_id: u64,
}

impl EventHead {
    /// The head of an instant event.
    #[inline(always)]
    pub fn instant(ring: RingPos, event_type: EventType, ids: EventIds) -> EventHead {
        EventHead { ring, event_type, ids, tracking_id: 0 }
    }
}

/// The ids an execution's events carry.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventIds {
    pub exec_id: u64,
    pub model_id: u32,
    /// The sequence id of the asynchronous request the event belongs to; 0 for none.
    pub nrta_seq_id: u64,
}

thread_local! {
    static THREAD_ID: Cell<u32> = const { Cell::new(0) };
}

/// The kernel thread id, read once per thread.
#[inline]
fn thread_id() -> u32 {
    THREAD_ID.with(|cached| {
        let id = cached.get();
        if id != 0 {
            return id;
        }
        let id = nix::unistd::gettid().as_raw() as u32;
        cached.set(id);
        id
    })
}

impl Tracer {
    pub fn new(
        store: DatastoreWriter,
        inspect: &InspectConfig,
        cores: &[u32],
        device_clocks: Vec<DeviceClock>,
        ns_per_tick: f64,
    ) -> Tracer {
        let core_on = |core: u32| inspect.cores.as_ref().is_none_or(|set| set.contains(core));
        let mut configured_system_masks = vec![if inspect.system { inspect.event_types } else { 0 }];
        configured_system_masks
            .extend(cores.iter().map(|&c| if inspect.system && core_on(c) { inspect.event_types } else { 0 }));
        let configured_device: Vec<bool> = cores.iter().map(|&c| inspect.device && core_on(c)).collect();
        let rings = std::iter::once(store.host_ring())
            .chain((0..cores.len()).map(|slot| store.core_ring(slot, false)))
            .chain((0..cores.len()).map(|slot| store.core_ring(slot, true)))
            .collect();
        let tracer = Tracer {
            store,
            system_masks: configured_system_masks.iter().map(|&m| AtomicU64::new(m)).collect(),
            configured_system_masks,
            device_enabled: configured_device.iter().map(|&d| AtomicBool::new(d)).collect(),
            configured_device,
            consumed: (0..1 + 2 * cores.len()).map(|_| AtomicU64::new(0)).collect(),
            rings,
            discard: inspect.discard,
            device_clocks,
            ns_per_tick,
            next_tracking_id: AtomicU64::new(1),
            next_exec_id: AtomicU64::new(1),
            last_model: cores.iter().map(|_| AtomicU64::new(0)).collect(),
        };
        tracer.publish_recording();
        tracer
    }

    /// The datastore the events go to.
    #[inline]
    pub fn store(&self) -> &DatastoreWriter {
        &self.store
    }

    /// Nanoseconds per tick, measured at init.
    #[inline]
    pub fn ns_per_tick(&self) -> f64 {
        self.ns_per_tick
    }

    /// The ring position of `core` (`None`: the process ring).
    #[inline]
    pub fn ring_of(&self, core: Option<u32>) -> RingPos {
        core.and_then(|c| self.store.core_slot(c)).map_or(0, |slot| slot + 1)
    }

    #[inline]
    pub fn next_exec_id(&self) -> u64 {
        self.next_exec_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether `event_type` is recorded in ring `ring` now.
    #[inline]
    pub fn enabled(&self, ring: RingPos, event_type: EventType) -> bool {
        self.system_masks[ring].load(Ordering::Relaxed) & event_type.bit() != 0
    }

    /// Whether device events of core slot `slot` are recorded now.
    #[inline]
    pub fn device_enabled(&self, slot: usize) -> bool {
        self.device_enabled[slot].load(Ordering::Relaxed)
    }

    /// Records an instant system event now (when its type is recorded in `ring`).
    #[inline(always)]
    pub fn instant<P: Payload>(&self, ring: RingPos, event_type: EventType, ids: EventIds, payload: P) {
        self.emit(At::Now, EventHead::instant(ring, event_type, ids), Phase::Instant, payload);
    }

    /// Records an instant system event that happened at `at`.
    #[inline(always)]
    pub fn instant_at<P: Payload>(&self, at: At, ring: RingPos, event_type: EventType, ids: EventIds, payload: P) {
        self.emit(at, EventHead::instant(ring, event_type, ids), Phase::Instant, payload);
    }

    /// A span of `event_type` whose start is yet to be emitted ([`Tracer::open`]): its
    /// tracking id is 0 when the type is not recorded in `ring` now.
    #[inline]
    pub fn span(&self, ring: RingPos, event_type: EventType, ids: EventIds) -> EventHead {
        let tracking_id = if self.enabled(ring, event_type) { self.tracking_id() } else { 0 };
        EventHead { ring, event_type, ids, tracking_id }
    }

    /// Opens a span now: emits its start and returns the head its stop repeats.
    #[inline]
    pub fn start<P: Payload>(&self, ring: RingPos, event_type: EventType, ids: EventIds, payload: P) -> EventHead {
        let span = self.span(ring, event_type, ids);
        self.open(At::Now, &span, payload);
        span
    }

    /// Emits the start of `span` (made by [`Tracer::span`]) as of `at`, unless its
    /// type was not recorded when the span was made.
    #[inline]
    pub fn open<P: Payload>(&self, at: At, span: &EventHead, payload: P) {
        if span.tracking_id != 0 {
            self.emit(at, *span, Phase::Start, payload);
        }
    }

    /// Closes `span` now.
    #[inline]
    pub fn stop<P: Payload>(&self, span: &EventHead, payload: P) {
        self.emit(At::Now, *span, Phase::Stop, payload);
    }

    /// Closes `span` as of `at`.
    #[inline]
    pub fn close<P: Payload>(&self, at: At, span: &EventHead, payload: P) {
        self.emit(at, *span, Phase::Stop, payload);
    }

    /// Records one system event when its type is recorded in its ring now. The check is
    /// inlined into the caller, so a disabled type costs a load and a branch, not a
    /// call; the head (taken by value, so that nothing is stored before the check) and
    /// the payload's slot words, mostly constants, are built there too.
    #[inline(always)]
    pub fn emit<P: Payload>(&self, at: At, head: EventHead, phase: Phase, payload: P) {
        debug_assert!(
            P::EVENT_TYPES.contains(&head.event_type),
            "{} does not carry {}",
            head.event_type,
            std::any::type_name::<P>()
        );
        if !self.enabled(head.ring, head.event_type) {
            return;
        }
        let (timestamp, clock_flag) = match at {
            At::Now => (clock::ticks(), 0),
            At::Ticks(ticks) => (ticks, 0),
            At::DeviceNs(ns) => (ns, FLAG_DEVICE_CLOCK),
        };
        let slots = payload.slots();
        let status_flag = if slots.status { FLAG_STATUS } else { 0 };
        let nrta_flag = if head.ids.nrta_seq_id != 0 { FLAG_NRTA_SEQ } else { 0 };
        let record = SystemRecord {
            timestamp,
            tracking_id: head.tracking_id,
            exec_id: head.ids.exec_id,
            nrta_seq_id: head.ids.nrta_seq_id,
            event_type: head.event_type as u16,
            phase: phase as u8,
            flags: clock_flag | status_flag | nrta_flag,
            thread_id: 0,
            model_id: head.ids.model_id,
            string_id: slots.string_id,
            args: slots.args,
            rank: 0,
        };
        self.push_system(head.ring, record.encode());
    }

    /// Writes a system record's words into ring `ring` (its type already checked),
    /// adding the calling thread's id. The words are put together where the event is
    /// emitted, mostly from constants, and taken by value: the caller's temporary is
    /// completed in place, not copied.
    #[inline(never)]
    fn push_system(&self, ring: RingPos, mut words: [u64; SYSTEM_RECORD_WORDS]) {
        words[SystemRecord::THREAD_WORD] |= u64::from(thread_id()) << 32;
        if let Some(slot) = ring.checked_sub(1) {
            // The core's rank as it is now: every event of a core carries it.
            words[SystemRecord::RANK_WORD] =
                self.store.core_counter(slot, crate::layout::core::RANK).load(Ordering::Relaxed);
        }
        let claim = if self.discard { Claim::Discard { consumed: &self.consumed[ring] } } else { Claim::Shared };
        self.rings[ring].push(&self.store.region, claim, &words);
    }

    /// Allocates a tracking id for a span.
    #[inline]
    fn tracking_id(&self) -> u64 {
        self.next_tracking_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Records a device event for core slot `slot`, whose execution lock the caller
    /// holds (so it is the ring's only producer).
    #[inline]
    pub fn emit_device(&self, slot: usize, record: &DeviceRecord) {
        self.push_device(slot, 1, |first_event| DeviceRecord { first_event, ..*record }.encode());
    }

    /// Appends a device record holding `count` events, numbered from the ring's event
    /// count, which is advanced before the record is published (single producer: the
    /// caller holds the core's execution lock). Events of a record refused in discard
    /// mode are counted dropped, and readers see them as a gap in the numbering.
    #[inline]
    fn push_device(&self, slot: usize, count: u64, record: impl FnOnce(u64) -> [u64; DEVICE_RECORD_WORDS]) {
        let position = 1 + self.device_clocks.len() + slot;
        let ring = &self.rings[position];
        let region = &self.store.region;
        let events = ring.events(region);
        let first = events.load(Ordering::Relaxed);
        let claim = if self.discard { Claim::Discard { consumed: &self.consumed[position] } } else { Claim::Exclusive };
        let pushed = ring.push_then(region, claim, &record(first), || events.store(first + count, Ordering::Release));
        if !pushed {
            events.store(first + count, Ordering::Release);
            ring.add_dropped(region, count - 1);
        }
    }

    /// Records an instruction's device event, run from host `start` to `end` ticks,
    /// for core slot `slot`, whose execution lock the caller holds.
    #[inline]
    pub fn emit_instruction(&self, slot: usize, ids: EventIds, it: &InstructionTrace, start: u64, end: u64) {
        self.emit_device(
            slot,
            &DeviceRecord {
                first_event: 0,
                start_ns: self.device_ns(slot, start),
                end_ns: self.device_ns(slot, end),
                exec_id: ids.exec_id,
                model_id: ids.model_id,
                kind: DEVICE_KIND_INSTRUCTION,
                unit: it.engine,
                opcode_or_index: it.opcode_id,
                hlo_string: it.hlo_id,
                step: it.step,
                flops_or_bytes: it.flops,
                bytes_read: it.bytes_read,
                bytes_written: it.bytes_written,
            },
        );
    }

    /// Records the instructions an execution ran on core slot `slot` (whose execution
    /// lock the caller holds): each span names its entry in `instructions` and its host
    /// tick interval. When the model's instructions are in the datastore's instruction
    /// table (`in_table`), spans of consecutive entries that follow each other without
    /// a gap share run records of up to [`RUN_MAX`] durations (a loop's body, iteration
    /// after iteration, is one run per iteration); any other span, one longer than
    /// `u32::MAX` ns, or a model not in the table, gets a full record.
    pub fn emit_instruction_spans(
        &self,
        slot: usize,
        ids: EventIds,
        instructions: &[InstructionTrace],
        in_table: bool,
        spans: &[InstructionSpan],
    ) {
        // A span naming no instruction (not produced by the runtime) is skipped.
        let known = |s: &InstructionSpan| (s.entry as usize) < instructions.len();
        let single = |s: &InstructionSpan| {
            self.emit_instruction(slot, ids, &instructions[s.entry as usize], s.start, s.end);
        };
        if !in_table {
            spans.iter().filter(|s| known(s)).for_each(single);
            return;
        }
        let clock = self.device_clocks[slot];
        let mut k = 0;
        while k < spans.len() {
            let first = &spans[k];
            if !known(first) {
                k += 1;
                continue;
            }
            let start_ns = clock.at(first.start);
            let mut run = InstructionRun {
                exec_id: ids.exec_id,
                model_id: ids.model_id,
                first: first.entry,
                start_ns,
                ..InstructionRun::default()
            };
            let mut previous = start_ns;
            let mut count = 0;
            while count < RUN_MAX && k + count < spans.len() {
                let span = &spans[k + count];
                let follows = count == 0
                    || (known(span)
                        && span.entry == first.entry + count as u32
                        && span.start == spans[k + count - 1].end);
                if !follows {
                    break;
                }
                let end = clock.at(span.end);
                let Ok(duration) = u32::try_from(end.saturating_sub(previous)) else { break };
                run.durations[count] = duration;
                previous = end;
                count += 1;
            }
            if count == 0 {
                single(first);
                k += 1;
                continue;
            }
            run.count = count as u8;
            self.push_device(slot, count as u64, |first_event| {
                run.first_event = first_event;
                run.encode()
            });
            k += count;
        }
    }

    /// The device clock of core slot `slot` at host `ticks`.
    #[inline]
    pub fn device_ns(&self, slot: usize, ticks: u64) -> u64 {
        self.device_clocks[slot].at(ticks)
    }

    /// Records which model core slot `slot` runs; returns the previous one if it
    /// differs (a model switch).
    #[inline]
    pub fn switch_model(&self, slot: usize, model_id: u32) -> Option<u32> {
        let previous = self.last_model[slot].swap(u64::from(model_id), Ordering::Relaxed) as u32;
        (previous != 0 && previous != model_id).then_some(previous)
    }

    /// Adds `n` to counter `word` ([`crate::counters::core`]) of core slot `slot`.
    #[inline]
    pub fn add(&self, slot: usize, word: u64, n: u64) {
        self.store.core_counter(slot, word).fetch_add(n, Ordering::Relaxed);
    }

    /// Records that core slot `slot` runs rank `rank` of a communicator of `ranks`: the
    /// core's later system events carry it.
    pub fn set_rank(&self, slot: usize, rank: u32, ranks: u32) {
        self.store.core_counter(slot, crate::layout::core::RANKS).store(u64::from(ranks), Ordering::Relaxed);
        self.store.core_counter(slot, crate::layout::core::RANK).store(u64::from(rank) + 1, Ordering::Release);
    }

    /// A tick count in nanoseconds.
    #[inline]
    pub fn ticks_to_ns(&self, ticks: u64) -> u64 {
        (ticks as f64 * self.ns_per_tick) as u64
    }

    /// Applies a trace session's recording request on top of the configuration
    /// (`None` restores the configuration).
    pub(crate) fn set_session_recording(&self, session: Option<(u64, Option<&[u32]>)>) {
        for (ring, mask) in self.system_masks.iter().enumerate() {
            let configured = self.configured_system_masks[ring];
            let requested = match session {
                Some((types, cores)) => {
                    let core = (ring > 0).then(|| self.core_of_slot(ring - 1));
                    let wanted = match (core, cores) {
                        (Some(c), Some(list)) => list.contains(&c),
                        (None, Some(_)) => false,
                        (_, None) => true,
                    };
                    if wanted { types } else { 0 }
                }
                None => 0,
            };
            mask.store(configured | requested, Ordering::Relaxed);
        }
        for (slot, enabled) in self.device_enabled.iter().enumerate() {
            enabled.store(self.configured_device[slot], Ordering::Relaxed);
        }
        self.publish_recording();
    }

    /// Turns the system rings and the device rings on or off, every event type and
    /// core (benchmarks, and tools that record chosen executions).
    pub fn set_recording(&self, system: bool, device: bool) {
        for mask in &self.system_masks {
            mask.store(if system { ALL_SYSTEM_EVENTS } else { 0 }, Ordering::Relaxed);
        }
        for enabled in &self.device_enabled {
            enabled.store(device, Ordering::Relaxed);
        }
        self.publish_recording();
    }

    fn publish_recording(&self) {
        let system = self.system_masks.iter().any(|m| m.load(Ordering::Relaxed) != 0);
        let device = self.device_enabled.iter().any(|d| d.load(Ordering::Relaxed));
        let mut flags = 0;
        if system {
            flags |= layout::RECORDING_SYSTEM;
        }
        if device {
            flags |= layout::RECORDING_DEVICE;
        }
        if self.discard {
            flags |= layout::RECORDING_DISCARD_MODE;
        }
        self.store.set_recording(flags);
    }

    fn core_of_slot(&self, slot: usize) -> u32 {
        self.store.held_cores()[slot]
    }

    /// The in-process consumer position of ring position `position`.
    pub(crate) fn consumed(&self, position: usize) -> &AtomicU64 {
        &self.consumed[position]
    }

    /// The ring position (system rings, then device rings) of the ring at `base`.
    pub(crate) fn position_of(&self, base: u64) -> Option<usize> {
        self.rings.iter().position(|r| r.base == base)
    }
}
