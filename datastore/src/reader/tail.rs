//! Tailing a datastore's event rings: system and device events in order, from the
//! oldest kept or from now, with what the rings overwrote counted.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::clock::TickConverter;
use crate::event::{DeviceEvent, SystemEvent};
use crate::instructions::{InstructionCache, InstructionTable};
use crate::layout::Layout;
use crate::record::{SystemRecord, decode_device, device_record_events};
use crate::ring::{Payload, RingCursor, RingRef};
use crate::shm::Region;
use crate::strings::StringTable;

use super::DatastoreReader;

/// One event from a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceEvent {
    System(SystemEvent),
    Device(DeviceEvent),
}

/// Where a new tail starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailStart {
    /// At the oldest event still in each ring.
    Oldest,
    /// At the next event produced (like `tail -f`).
    Now,
}

/// Cursors over a runtime's rings, with a filter.
#[derive(Debug, Clone)]
pub struct Tail {
    rings: Vec<TailRing>,
    strings: HashMap<u32, String>,
    instructions: InstructionTable,
    tables: InstructionCache,
    system_types: u64,
}

#[derive(Debug, Clone)]
struct TailRing {
    ring: RingRef,
    core: Option<u32>,
    device: bool,
    /// Records read and lost (for system rings, also the events).
    cursor: RingCursor,
    /// Device rings: events, which a record may hold several of.
    events: EventCount,
}

/// A device ring's events: a record holds one or more, numbered in the ring, so a
/// gap in the numbering between two delivered records is the exact number of events
/// lost between them.
#[derive(Debug, Clone, Copy, Default)]
struct EventCount {
    /// The number of the next event expected (`None` until the first record).
    next: Option<u64>,
    delivered: u64,
    lost: u64,
}

impl Tail {
    /// Events lost so far (overwritten before they were read), over all rings.
    pub fn lost(&self) -> u64 {
        self.cursors().map(|(_, _, c)| c.lost).sum()
    }

    /// Events read so far (before filtering by type).
    pub fn delivered(&self) -> u64 {
        self.cursors().map(|(_, _, c)| c.delivered).sum()
    }

    /// The cursor of each ring: `(core, device ring?, cursor)`; `next` counts records,
    /// `delivered` and `lost` count events.
    pub fn cursors(&self) -> impl Iterator<Item = (Option<u32>, bool, RingCursor)> + '_ {
        self.rings.iter().map(|r| {
            let cursor = if r.device {
                RingCursor { next: r.cursor.next, delivered: r.events.delivered, lost: r.events.lost }
            } else {
                r.cursor
            };
            (r.core, r.device, cursor)
        })
    }

    /// Reads up to `max` records per ring into `out`, decoded and filtered. With
    /// `writer_done`, events whose producer never finished them are counted lost.
    pub fn poll(&mut self, reader: &DatastoreReader, max: usize, writer_done: bool, out: &mut Vec<TraceEvent>) {
        self.poll_region(&reader.region, reader.strings, &reader.converter(), max, writer_done, out);
    }

    pub(crate) fn poll_region(
        &mut self,
        region: &Region,
        strings: StringTable,
        converter: &TickConverter,
        max: usize,
        writer_done: bool,
        out: &mut Vec<TraceEvent>,
    ) {
        let host_ns = |ticks: u64| converter.to_ns(ticks);
        let types = self.system_types;
        let cache = &mut self.strings;
        let mut string = |id: u32| -> String {
            if id == 0 {
                return String::new();
            }
            if let Some(s) = cache.get(&id) {
                return s.clone();
            }
            match strings.get(region, id) {
                Some(s) => {
                    cache.insert(id, s.clone());
                    s
                }
                None => String::new(),
            }
        };
        let (instructions, tables) = (self.instructions, &mut self.tables);
        let mut table = |model_id: u32| tables.model(region, instructions, model_id);
        for ring in &mut self.rings {
            let core = ring.core;
            if ring.device {
                let events = &mut ring.events;
                ring.cursor.poll(region, ring.ring, max, writer_done, |_, payload| {
                    let (first, count) = device_record_events(payload);
                    if let Some(next) = events.next {
                        events.lost += first.saturating_sub(next);
                    }
                    events.next = Some(first + count);
                    events.delivered += count;
                    decode_device(payload, core.unwrap_or(0), &mut string, &mut table, &mut |event| {
                        out.push(TraceEvent::Device(event))
                    });
                });
                if writer_done && ring.cursor.next >= ring.ring.produced(region) {
                    // Events after the last record read were lost.
                    let produced = ring.ring.events(region).load(Ordering::Acquire);
                    let next = events.next.get_or_insert(produced);
                    events.lost += produced.saturating_sub(*next);
                    *next = (*next).max(produced);
                }
            } else {
                ring.cursor.poll(region, ring.ring, max, writer_done, |id, payload| {
                    let record = SystemRecord::decode(payload);
                    if types & (1u64 << record.event_type.min(63)) == 0 {
                        return;
                    }
                    if let Some(event) = record.to_event(id, core, &mut string, &host_ns) {
                        out.push(TraceEvent::System(event));
                    }
                });
            }
        }
    }

    /// Builds a tail over the rings of a file with `layout` whose held cores are
    /// `held`; see [`DatastoreReader::tail`].
    pub(crate) fn new(
        region: &Region,
        layout: &Layout,
        held: &[u32],
        start: TailStart,
        cores: Option<&[u32]>,
        system_types: u64,
        device: bool,
    ) -> Tail {
        let capacity = layout.sizes.ring_capacity;
        let at = |ring: RingRef| match start {
            TailStart::Now => RingCursor::at(ring.produced(region)),
            TailStart::Oldest => RingCursor::at(ring.produced(region).saturating_sub(ring.capacity)),
        };
        let system = |ring: RingRef, core| TailRing {
            ring,
            core,
            device: false,
            cursor: at(ring),
            events: EventCount::default(),
        };
        let mut rings = Vec::new();
        if cores.is_none() && system_types != 0 {
            rings.push(system(RingRef { base: layout.host_ring(), capacity }, None));
        }
        for (slot, &core) in held.iter().enumerate() {
            if cores.is_some_and(|wanted| !wanted.contains(&core)) {
                continue;
            }
            if system_types != 0 {
                rings.push(system(RingRef { base: layout.core_ring(slot, false), capacity }, Some(core)));
            }
            if device {
                let ring = RingRef { base: layout.core_ring(slot, true), capacity };
                let (cursor, next) = device_start(region, ring, start);
                let events = EventCount { next, ..EventCount::default() };
                rings.push(TailRing { ring, core: Some(core), device: true, cursor, events });
            }
        }
        Tail {
            rings,
            strings: HashMap::new(),
            instructions: InstructionTable::of(layout),
            tables: InstructionCache::default(),
            system_types,
        }
    }

    /// Each ring's base offset and the index its cursor will read next.
    pub(crate) fn positions(&self) -> impl Iterator<Item = (RingRef, u64)> + '_ {
        self.rings.iter().map(|r| (r.ring, r.cursor.next))
    }

    /// Reads up to `max` records per ring, checking them but not decoding them;
    /// returns how many were read. (The transport alone, for throughput tests.)
    pub fn skim(&mut self, reader: &DatastoreReader, max: usize, writer_done: bool) -> u64 {
        let mut read = 0;
        for ring in &mut self.rings {
            read += ring.cursor.poll(&reader.region, ring.ring, max, writer_done, |_, _: &Payload| {}) as u64;
        }
        read
    }
}

/// Where a tail starts in a device ring: the record index, and the number of the first
/// event it will count (`None`: the number the first record it reads carries).
///
/// Starting now, the record index and the ring's event count must be read as a
/// consistent pair: the producer advances the count after claiming a record and before
/// publishing it, so the pair is taken when the last claimed record is finished and no
/// new one is claimed meanwhile. Starting at the oldest record of a ring that has not
/// wrapped, that is event 0; once it has wrapped, events older than the first record
/// read are not this tail's.
pub(super) fn device_start(region: &Region, ring: RingRef, start: TailStart) -> (RingCursor, Option<u64>) {
    if start == TailStart::Oldest {
        let head = ring.produced(region);
        return if head <= ring.capacity {
            (RingCursor::at(0), Some(0))
        } else {
            (RingCursor::at(head - ring.capacity), None)
        };
    }
    let began = std::time::Instant::now();
    loop {
        let head = ring.produced(region);
        if head > 0 && ring.in_flight(region, head - 1) && began.elapsed() < Duration::from_millis(10) {
            std::hint::spin_loop();
            continue;
        }
        let events = ring.events(region).load(Ordering::Acquire);
        if ring.produced(region) == head {
            return (RingCursor::at(head), Some(events));
        }
        if began.elapsed() >= Duration::from_millis(10) {
            // A producer stuck mid-record: count from the first record read.
            return (RingCursor::at(head), None);
        }
    }
}
