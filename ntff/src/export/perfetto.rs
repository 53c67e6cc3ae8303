//! The Perfetto encoder: a protobuf `Trace`, written packet by packet.
//!
//! Track descriptors go on sequence 1, with the clock snapshot that makes
//! CLOCK_MONOTONIC the trace's clock. Every track with events has its own packet
//! sequence, which starts by clearing its incremental state and setting defaults: the
//! track's uuid, and a sequence-scoped incremental clock, so that each event carries
//! only the nanoseconds since the sequence's previous one. Event names and annotation
//! keys are interned per sequence. A sequence that lost data starts over with
//! `previous_packet_dropped` set on its first packet.
//!
//! Rare packets are built from the generated [`proto`] types; slice and counter
//! events, which are nearly all of a trace, are encoded by hand into reused buffers.

use crate::wire::{
    WIRE_BYTES, WIRE_FIXED64, put_bytes_field, put_fixed64_field, put_key, put_varint, put_varint_field,
};
use std::io::Write;

use prost::Message;

use super::{Annotation, AnnotationValue, CounterUnit, Name, NameId, Sink, Track, TrackIx, TrackKind};

/// The generated types of the subset of Perfetto's trace protos the exporter writes
/// (`ntff/proto/perfetto.proto`); tests decode traces with them.
#[allow(clippy::all, missing_debug_implementations, unreachable_pub, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
}

/// Perfetto's builtin clock ids.
const CLOCK_REALTIME: u32 = 1;
const CLOCK_MONOTONIC: u32 = 3;
/// The sequence-scoped clock each track sequence defines: incremental nanoseconds.
pub const CLOCK_INCREMENTAL: u32 = 64;
/// The sequence of the clock snapshot and the track descriptors.
pub const DESCRIPTOR_SEQUENCE: u32 = 1;

const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;

// Field numbers of the hand-encoded messages.
const TRACE_PACKET: u32 = 1;
const PACKET_TIMESTAMP: u32 = 8;
const PACKET_SEQUENCE_ID: u32 = 10;
const PACKET_TRACK_EVENT: u32 = 11;
const PACKET_INTERNED_DATA: u32 = 12;
const EVENT_TYPE: u32 = 9;
const EVENT_NAME_IID: u32 = 10;
const EVENT_ANNOTATIONS: u32 = 4;
const EVENT_DOUBLE_COUNTER_VALUE: u32 = 44;
const EVENT_FLOW_IDS: u32 = 47;
const EVENT_TERMINATING_FLOW_IDS: u32 = 48;
const INTERNED_EVENT_NAMES: u32 = 2;
const INTERNED_ANNOTATION_NAMES: u32 = 3;
const INTERNED_IID: u32 = 1;
const INTERNED_NAME: u32 = 2;
const ANNOTATION_NAME_IID: u32 = 1;
const ANNOTATION_UINT: u32 = 3;
const ANNOTATION_INT: u32 = 4;
const ANNOTATION_STRING_IID: u32 = 17;
const INTERNED_STRING_VALUES: u32 = 29;

const TYPE_SLICE_BEGIN: u64 = 1;
const TYPE_SLICE_END: u64 = 2;
const TYPE_INSTANT: u64 = 3;
const TYPE_COUNTER: u64 = 4;

/// Bytes gathered before a write to the output.
const FLUSH_BYTES: usize = 1 << 20;

/// The packet sequence of one track.
#[derive(Debug)]
struct Sequence {
    id: u32,
    uuid: u64,
    /// Time of the previous packet: the incremental clock's value.
    last: u64,
    /// Whether the sequence has cleared its state and set its defaults.
    started: bool,
    /// Loss reasons to report on the next packet.
    dropped: u32,
    names: BitSet,
    annotation_names: BitSet,
    string_values: BitSet,
}

#[derive(Debug, Default)]
struct BitSet(Vec<u64>);

impl BitSet {
    /// Adds `k`; false when it was there.
    fn insert(&mut self, k: NameId) -> bool {
        let (word, bit) = (k as usize / 64, k % 64);
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        let had = self.0[word] & (1 << bit) != 0;
        self.0[word] |= 1 << bit;
        !had
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

#[derive(Debug)]
pub(crate) struct PerfettoSink<W: Write> {
    out: W,
    /// Encoded packets not yet written.
    buf: Vec<u8>,
    packet: Vec<u8>,
    event: Vec<u8>,
    interned: Vec<u8>,
    scratch: Vec<u8>,
    intern_scratch: Vec<u8>,
    /// By track; `None` for tracks without events of their own.
    sequences: Vec<Option<Sequence>>,
    next_sequence: u32,
    bytes: u64,
}

impl<W: Write> PerfettoSink<W> {
    pub(crate) fn new(out: W) -> PerfettoSink<W> {
        PerfettoSink {
            out,
            buf: Vec::with_capacity(FLUSH_BYTES + 4096),
            packet: Vec::new(),
            event: Vec::new(),
            interned: Vec::new(),
            scratch: Vec::new(),
            intern_scratch: Vec::new(),
            sequences: Vec::new(),
            next_sequence: DESCRIPTOR_SEQUENCE + 1,
            bytes: 0,
        }
    }

    /// Appends a packet built from the generated types.
    fn message(&mut self, packet: &proto::TracePacket) -> std::io::Result<()> {
        put_key(&mut self.buf, TRACE_PACKET, WIRE_BYTES);
        put_varint(&mut self.buf, packet.encoded_len() as u64);
        packet.encode_raw(&mut self.buf);
        self.flush_if_full()
    }

    /// Appends the hand-encoded packet in `self.packet`.
    fn emit(&mut self) -> std::io::Result<()> {
        put_bytes_field(&mut self.buf, TRACE_PACKET, &self.packet);
        self.flush_if_full()
    }

    fn flush_if_full(&mut self) -> std::io::Result<()> {
        if self.buf.len() >= FLUSH_BYTES {
            self.out.write_all(&self.buf)?;
            self.bytes += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }

    /// Starts a packet on `track`'s sequence at `ts`: starts the sequence over first
    /// when it is new or lost data. Leaves the event and interned buffers empty.
    fn open(&mut self, track: TrackIx, ts: u64) -> std::io::Result<()> {
        let Some(seq) = self.sequences.get_mut(track as usize).and_then(Option::as_mut) else {
            return Err(std::io::Error::other(format!("track {track} has no sequence")));
        };
        if !seq.started || seq.dropped != 0 {
            let packet = proto::TracePacket {
                trusted_packet_sequence_id: Some(seq.id),
                sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
                previous_packet_dropped: (seq.dropped != 0).then_some(seq.dropped),
                trace_packet_defaults: Some(proto::TracePacketDefaults {
                    timestamp_clock_id: Some(CLOCK_INCREMENTAL),
                    track_event_defaults: Some(proto::TrackEventDefaults {
                        track_uuid: Some(seq.uuid),
                        extra_counter_track_uuids: Vec::new(),
                    }),
                }),
                clock_snapshot: Some(proto::ClockSnapshot {
                    clocks: vec![clock(CLOCK_MONOTONIC, ts, false), clock(CLOCK_INCREMENTAL, ts, true)],
                    primary_trace_clock: None,
                }),
                ..Default::default()
            };
            seq.started = true;
            seq.dropped = 0;
            seq.last = ts;
            seq.names.clear();
            seq.annotation_names.clear();
            seq.string_values.clear();
            self.message(&packet)?;
        }
        let seq = self.sequences[track as usize].as_mut().expect("checked above");
        let delta = ts.saturating_sub(seq.last);
        seq.last = seq.last.max(ts);
        self.packet.clear();
        self.event.clear();
        self.interned.clear();
        put_varint_field(&mut self.packet, PACKET_TIMESTAMP, delta);
        put_varint_field(&mut self.packet, PACKET_SEQUENCE_ID, u64::from(seq.id));
        Ok(())
    }

    /// Sets the event's name, interning it on the sequence when it is new there.
    fn name(&mut self, track: TrackIx, name: Name<'_>) {
        let seq = self.sequences[track as usize].as_mut().expect("opened");
        if seq.names.insert(name.id) {
            intern(&mut self.interned, &mut self.scratch, INTERNED_EVENT_NAMES, name.id, name.text);
        }
        put_varint_field(&mut self.event, EVENT_NAME_IID, u64::from(name.id) + 1);
    }

    fn annotations(&mut self, track: TrackIx, args: &[Annotation<'_>]) {
        for arg in args {
            let seq = self.sequences[track as usize].as_mut().expect("opened");
            if seq.annotation_names.insert(arg.key) {
                intern(&mut self.interned, &mut self.scratch, INTERNED_ANNOTATION_NAMES, arg.key, arg.key_text);
            }
            self.scratch.clear();
            put_varint_field(&mut self.scratch, ANNOTATION_NAME_IID, u64::from(arg.key) + 1);
            match arg.value {
                AnnotationValue::U64(v) => put_varint_field(&mut self.scratch, ANNOTATION_UINT, v),
                AnnotationValue::I64(v) => put_varint_field(&mut self.scratch, ANNOTATION_INT, v as u64),
                AnnotationValue::Str(id, text) => {
                    if seq.string_values.insert(id) {
                        intern(&mut self.interned, &mut self.intern_scratch, INTERNED_STRING_VALUES, id, text);
                    }
                    put_varint_field(&mut self.scratch, ANNOTATION_STRING_IID, u64::from(id) + 1);
                }
            }
            put_bytes_field(&mut self.event, EVENT_ANNOTATIONS, &self.scratch);
        }
    }

    /// Puts the event and interned data into the packet and appends it.
    fn close(&mut self) -> std::io::Result<()> {
        if !self.interned.is_empty() {
            put_bytes_field(&mut self.packet, PACKET_INTERNED_DATA, &self.interned);
        }
        put_bytes_field(&mut self.packet, PACKET_TRACK_EVENT, &self.event);
        self.emit()
    }
}

impl<W: Write> Sink for PerfettoSink<W> {
    type Out = W;

    fn start(&mut self, start: u64, realtime: Option<i64>) -> std::io::Result<()> {
        let mut clocks = vec![clock(CLOCK_MONOTONIC, start, false)];
        if let Some(offset) = realtime {
            clocks.push(clock(CLOCK_REALTIME, start.saturating_add_signed(offset), false));
        }
        self.message(&proto::TracePacket {
            trusted_packet_sequence_id: Some(DESCRIPTOR_SEQUENCE),
            sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
            clock_snapshot: Some(proto::ClockSnapshot {
                clocks,
                primary_trace_clock: Some(proto::BuiltinClock::Monotonic as i32),
            }),
            ..Default::default()
        })
    }

    fn track(&mut self, track: &Track) -> std::io::Result<()> {
        let mut descriptor = proto::TrackDescriptor {
            uuid: Some(track.uuid),
            parent_uuid: track.parent_uuid,
            sibling_order_rank: Some(track.rank),
            ..Default::default()
        };
        let has_events = match &track.kind {
            TrackKind::Process { pid, name, cmdline, labels } => {
                descriptor.process = Some(proto::ProcessDescriptor {
                    pid: Some(*pid as i32),
                    cmdline: cmdline.clone(),
                    process_name: Some(name.clone()),
                    process_labels: labels.clone(),
                });
                descriptor.child_ordering = Some(proto::track_descriptor::ChildTracksOrdering::Explicit as i32);
                false
            }
            TrackKind::Thread { pid, tid, name } => {
                descriptor.thread = Some(proto::ThreadDescriptor {
                    pid: Some(*pid as i32),
                    tid: Some(i64::from(*tid)),
                    thread_name: Some(name.clone()),
                });
                true
            }
            TrackKind::Group { name } => {
                descriptor.name = Some(name.clone());
                descriptor.child_ordering = Some(proto::track_descriptor::ChildTracksOrdering::Explicit as i32);
                false
            }
            TrackKind::Slices { name } => {
                descriptor.name = Some(name.clone());
                true
            }
            TrackKind::Counter { name, unit, description } => {
                descriptor.name = Some(name.clone());
                descriptor.description = Some(description.clone());
                descriptor.counter = Some(match unit {
                    CounterUnit::Percent => {
                        proto::CounterDescriptor { unit_name: Some("%".into()), ..Default::default() }
                    }
                    CounterUnit::Bytes => proto::CounterDescriptor {
                        unit: Some(proto::counter_descriptor::Unit::SizeBytes as i32),
                        ..Default::default()
                    },
                    CounterUnit::Count => proto::CounterDescriptor {
                        unit: Some(proto::counter_descriptor::Unit::Count as i32),
                        ..Default::default()
                    },
                });
                true
            }
        };
        let ix = track.ix as usize;
        if self.sequences.len() <= ix {
            self.sequences.resize_with(ix + 1, || None);
        }
        if has_events {
            self.sequences[ix] = Some(Sequence {
                id: self.next_sequence,
                uuid: track.uuid,
                last: 0,
                started: false,
                dropped: 0,
                names: BitSet::default(),
                annotation_names: BitSet::default(),
                string_values: BitSet::default(),
            });
            self.next_sequence += 1;
        }
        self.message(&proto::TracePacket {
            trusted_packet_sequence_id: Some(DESCRIPTOR_SEQUENCE),
            track_descriptor: Some(descriptor),
            ..Default::default()
        })
    }

    fn begin(
        &mut self,
        track: TrackIx,
        ts: u64,
        name: Name<'_>,
        args: &[Annotation<'_>],
        flow_out: Option<u64>,
        flow_in: Option<u64>,
    ) -> std::io::Result<()> {
        self.open(track, ts)?;
        put_varint_field(&mut self.event, EVENT_TYPE, TYPE_SLICE_BEGIN);
        self.name(track, name);
        self.annotations(track, args);
        if let Some(flow) = flow_out {
            put_fixed64_field(&mut self.event, EVENT_FLOW_IDS, flow);
        }
        if let Some(flow) = flow_in {
            put_fixed64_field(&mut self.event, EVENT_TERMINATING_FLOW_IDS, flow);
        }
        self.close()
    }

    fn end(&mut self, track: TrackIx, ts: u64) -> std::io::Result<()> {
        self.open(track, ts)?;
        put_varint_field(&mut self.event, EVENT_TYPE, TYPE_SLICE_END);
        self.close()
    }

    fn chains_flows(&self) -> bool {
        true
    }

    fn instant(&mut self, track: TrackIx, ts: u64, name: Name<'_>, args: &[Annotation<'_>]) -> std::io::Result<()> {
        self.open(track, ts)?;
        put_varint_field(&mut self.event, EVENT_TYPE, TYPE_INSTANT);
        self.name(track, name);
        self.annotations(track, args);
        self.close()
    }

    fn counter(&mut self, track: TrackIx, ts: u64, value: f64) -> std::io::Result<()> {
        self.open(track, ts)?;
        put_varint_field(&mut self.event, EVENT_TYPE, TYPE_COUNTER);
        put_key(&mut self.event, EVENT_DOUBLE_COUNTER_VALUE, WIRE_FIXED64);
        self.event.extend_from_slice(&value.to_le_bytes());
        self.close()
    }

    fn dropped(&mut self, track: TrackIx, reasons: u32) {
        if let Some(Some(seq)) = self.sequences.get_mut(track as usize)
            && seq.started
        {
            seq.dropped |= reasons;
        }
    }

    fn finish(mut self) -> std::io::Result<(W, u64)> {
        self.out.write_all(&self.buf)?;
        self.bytes += self.buf.len() as u64;
        self.out.flush()?;
        Ok((self.out, self.bytes))
    }
}

fn clock(id: u32, timestamp: u64, incremental: bool) -> proto::clock_snapshot::Clock {
    proto::clock_snapshot::Clock {
        clock_id: Some(id),
        timestamp: Some(timestamp),
        is_incremental: incremental.then_some(true),
        unit_multiplier_ns: None,
    }
}

/// Adds `{iid, name}` to the interned-data field `field` being built in `interned`.
fn intern(interned: &mut Vec<u8>, scratch: &mut Vec<u8>, field: u32, id: NameId, text: &str) {
    scratch.clear();
    put_varint_field(scratch, INTERNED_IID, u64::from(id) + 1);
    put_bytes_field(scratch, INTERNED_NAME, text.as_bytes());
    put_bytes_field(interned, field, scratch);
}
