//! Event chunks as columns: the encoder a writer fills one event at a time, and the
//! decoder that turns a chunk payload back into events. Timestamps, ids and
//! descriptors are delta coded against the previous event of the chunk, so a device
//! instruction usually costs one or two bytes per column on disk.

use crate::model::{
    Arg, ArgValue, Chunk, ChunkInfo, Clock, DescriptorId, DeviceEvent, Loss, Phase, SyncPoint, SystemEvent,
};
use crate::model::{core_of_stream, stream_code};
use crate::proto;

const FLAG_PHASE_MASK: u32 = 0b11;
const FLAG_DEVICE_CLOCK: u32 = 0b100;

const ARG_U64: u32 = 0;
const ARG_I64: u32 = 1;
const ARG_STR: u32 = 2;

/// An optional id as stored: value + 1, 0 for absent.
fn optional(value: Option<u64>) -> u64 {
    value.map_or(0, |v| v.wrapping_add(1))
}

fn from_optional(stored: u64) -> Option<u64> {
    stored.checked_sub(1)
}

fn delta(value: u64, previous: &mut u64) -> i64 {
    let d = value.wrapping_sub(*previous) as i64;
    *previous = value;
    d
}

fn undelta(d: i64, previous: &mut u64) -> u64 {
    *previous = previous.wrapping_add(d as u64);
    *previous
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// The running values delta coding refers to, one per delta column.
#[derive(Debug, Clone, Copy)]
struct Previous {
    system_timestamp: u64,
    system_id: u64,
    tracking_id: u64,
    system_exec: u64,
    nrta_seq: u64,
    device_start: u64,
    descriptor: u64,
    device_id: u64,
    device_exec: u64,
}

impl Previous {
    fn at(base_ns: u64) -> Previous {
        Previous {
            system_timestamp: base_ns,
            system_id: u64::MAX,
            tracking_id: 0,
            system_exec: 0,
            nrta_seq: 0,
            device_start: base_ns,
            descriptor: 0,
            device_id: u64::MAX,
            device_exec: 0,
        }
    }
}

/// A chunk being filled by a writer.
#[derive(Debug)]
pub(crate) struct ChunkEncoder {
    chunk: proto::Chunk,
    previous: Previous,
    info: ChunkInfo,
}

impl ChunkEncoder {
    pub(crate) fn new(core: Option<u32>, base_ns: u64) -> ChunkEncoder {
        ChunkEncoder {
            chunk: proto::Chunk {
                stream: stream_code(core),
                base_ns,
                system: Some(proto::SystemColumns::default()),
                device: Some(proto::DeviceColumns::default()),
                ..proto::Chunk::default()
            },
            previous: Previous::at(base_ns),
            info: ChunkInfo {
                offset: 0,
                core,
                system_events: 0,
                device_events: 0,
                lost_events: 0,
                host_span: None,
                device_span: None,
            },
        }
    }

    /// Events in the chunk.
    pub(crate) fn len(&self) -> usize {
        (self.info.system_events + self.info.device_events) as usize
    }

    pub(crate) fn args(&self) -> usize {
        self.chunk.system.as_ref().map_or(0, |s| s.arg_key.len())
    }

    pub(crate) fn push_system(&mut self, e: &SystemEvent) {
        let p = &mut self.previous;
        let s = self.chunk.system.get_or_insert_with(Default::default);
        s.timestamp_ns.push(delta(e.timestamp_ns, &mut p.system_timestamp));
        s.id.push(delta(e.id, &mut p.system_id).wrapping_sub(1));
        s.name.push(e.name.0);
        let phase = match e.phase {
            Phase::Start => 0,
            Phase::Stop => 1,
            Phase::Instant => 2,
        };
        let clock = if e.clock == Clock::Device { FLAG_DEVICE_CLOCK } else { 0 };
        s.flags.push(phase | clock);
        s.tracking_id.push(delta(e.tracking_id, &mut p.tracking_id));
        s.thread_id.push(e.thread_id);
        s.exec_id.push(delta(optional(e.exec_id), &mut p.system_exec));
        s.model_id.push(e.model_id.map_or(0, |m| m.wrapping_add(1)));
        s.nrta_seq_id.push(delta(optional(e.nrta_seq_id), &mut p.nrta_seq));
        s.arg_count.push(e.args.len() as u32);
        for arg in &e.args {
            let (kind, value) = match arg.value {
                ArgValue::U64(v) => (ARG_U64, v),
                ArgValue::I64(v) => (ARG_I64, zigzag(v)),
                ArgValue::Str(sym) => (ARG_STR, u64::from(sym.0)),
            };
            s.arg_key.push(arg.key.0 << 2 | kind);
            s.arg_value.push(value);
        }
        self.info.system_events += 1;
        let t = e.timestamp_ns;
        match e.clock {
            Clock::Host => self.info.host_span = Some(widen(self.info.host_span, t, t)),
            Clock::Device => self.info.device_span = Some(widen(self.info.device_span, t, t)),
        }
    }

    pub(crate) fn push_device(&mut self, e: &DeviceEvent) {
        let p = &mut self.previous;
        let d = self.chunk.device.get_or_insert_with(Default::default);
        d.start_ns.push(delta(e.start_ns, &mut p.device_start));
        d.duration_ns.push(e.end_ns.wrapping_sub(e.start_ns));
        d.descriptor.push(delta(u64::from(e.descriptor.0), &mut p.descriptor));
        d.id.push(delta(e.id, &mut p.device_id).wrapping_sub(1));
        d.exec_id.push(delta(optional(e.exec_id), &mut p.device_exec));
        self.info.device_events += 1;
        let (low, high) = (e.start_ns.min(e.end_ns), e.start_ns.max(e.end_ns));
        self.info.device_span = Some(widen(self.info.device_span, low, high));
    }

    pub(crate) fn push_loss(&mut self, device: bool, events: u64) {
        let before = if device { self.info.device_events } else { self.info.system_events };
        self.chunk.losses.push(proto::Loss { device, before, events });
        self.info.lost_events = self.info.lost_events.saturating_add(events);
    }

    pub(crate) fn push_sync_point(&mut self, point: SyncPoint) {
        self.chunk.sync_points.push(proto::SyncPoint { host_ns: point.host_ns, device_ns: point.device_ns });
    }

    /// The payload and what the index says about it (its offset still to be set).
    pub(crate) fn finish(self, buffer: &mut Vec<u8>) -> ChunkInfo {
        buffer.clear();
        prost::Message::encode(&self.chunk, buffer)
            .unwrap_or_else(|e| unreachable!("a Vec grows as needed, so encoding cannot fail: {e}"));
        self.info
    }
}

fn widen(span: Option<(u64, u64)>, low: u64, high: u64) -> (u64, u64) {
    match span {
        Some((a, b)) => (a.min(low), b.max(high)),
        None => (low, high),
    }
}

/// Why a chunk payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadChunk(pub(crate) String);

fn check_len(what: &str, len: usize, expected: usize) -> Result<(), BadChunk> {
    if len == expected { Ok(()) } else { Err(BadChunk(format!("column {what} has {len} values, expected {expected}"))) }
}

/// Decodes a chunk payload into events.
pub(crate) fn decode_chunk(payload: &[u8]) -> Result<Chunk, BadChunk> {
    let chunk: proto::Chunk = prost::Message::decode(payload).map_err(|e| BadChunk(e.to_string()))?;
    let core = core_of_stream(chunk.stream);
    let mut previous = Previous::at(chunk.base_ns);
    let system = match &chunk.system {
        Some(s) => decode_system(s, core, &mut previous)?,
        None => Vec::new(),
    };
    let device = match &chunk.device {
        Some(d) => decode_device(d, core, &mut previous)?,
        None => Vec::new(),
    };
    let mut losses = Vec::with_capacity(chunk.losses.len());
    for l in &chunk.losses {
        let len = if l.device { device.len() } else { system.len() };
        if l.before as usize > len {
            return Err(BadChunk(format!("a loss marker is placed after event {} of {len}", l.before)));
        }
        losses.push(Loss { device: l.device, before: l.before, events: l.events });
    }
    let sync_points =
        chunk.sync_points.iter().map(|s| SyncPoint { host_ns: s.host_ns, device_ns: s.device_ns }).collect();
    Ok(Chunk { core, system, device, losses, sync_points })
}

fn decode_system(s: &proto::SystemColumns, core: Option<u32>, p: &mut Previous) -> Result<Vec<SystemEvent>, BadChunk> {
    let n = s.timestamp_ns.len();
    check_len("id", s.id.len(), n)?;
    check_len("name", s.name.len(), n)?;
    check_len("flags", s.flags.len(), n)?;
    check_len("tracking_id", s.tracking_id.len(), n)?;
    check_len("thread_id", s.thread_id.len(), n)?;
    check_len("exec_id", s.exec_id.len(), n)?;
    check_len("model_id", s.model_id.len(), n)?;
    check_len("nrta_seq_id", s.nrta_seq_id.len(), n)?;
    check_len("arg_count", s.arg_count.len(), n)?;
    let args_total: u64 = s.arg_count.iter().map(|&c| u64::from(c)).sum();
    check_len("arg_key", s.arg_key.len(), usize::try_from(args_total).unwrap_or(usize::MAX))?;
    check_len("arg_value", s.arg_value.len(), s.arg_key.len())?;
    let mut events = Vec::with_capacity(n);
    let mut next_arg = 0;
    for k in 0..n {
        let flags = s.flags[k];
        let phase = match flags & FLAG_PHASE_MASK {
            0 => Phase::Start,
            1 => Phase::Stop,
            2 => Phase::Instant,
            other => return Err(BadChunk(format!("system event {k} has phase code {other}"))),
        };
        let count = s.arg_count[k] as usize;
        let mut args = Vec::with_capacity(count);
        for a in next_arg..next_arg + count {
            let key = s.arg_key[a];
            let raw = s.arg_value[a];
            let value = match key & 0b11 {
                ARG_U64 => ArgValue::U64(raw),
                ARG_I64 => ArgValue::I64(unzigzag(raw)),
                ARG_STR => ArgValue::Str(crate::Sym(
                    u32::try_from(raw).map_err(|_| BadChunk(format!("string id {raw} is out of range")))?,
                )),
                other => return Err(BadChunk(format!("argument {a} has type code {other}"))),
            };
            args.push(Arg { key: crate::Sym(key >> 2), value });
        }
        next_arg += count;
        let timestamp_ns = undelta(s.timestamp_ns[k], &mut p.system_timestamp);
        let id = undelta(s.id[k].wrapping_add(1), &mut p.system_id);
        events.push(SystemEvent {
            core,
            id,
            name: crate::Sym(s.name[k]),
            phase,
            clock: if flags & FLAG_DEVICE_CLOCK != 0 { Clock::Device } else { Clock::Host },
            timestamp_ns,
            tracking_id: undelta(s.tracking_id[k], &mut p.tracking_id),
            thread_id: s.thread_id[k],
            exec_id: from_optional(undelta(s.exec_id[k], &mut p.system_exec)),
            model_id: s.model_id[k].checked_sub(1),
            nrta_seq_id: from_optional(undelta(s.nrta_seq_id[k], &mut p.nrta_seq)),
            args,
        });
    }
    Ok(events)
}

fn decode_device(d: &proto::DeviceColumns, core: Option<u32>, p: &mut Previous) -> Result<Vec<DeviceEvent>, BadChunk> {
    let n = d.start_ns.len();
    check_len("duration_ns", d.duration_ns.len(), n)?;
    check_len("descriptor", d.descriptor.len(), n)?;
    check_len("id", d.id.len(), n)?;
    check_len("exec_id", d.exec_id.len(), n)?;
    if n > 0 && core.is_none() {
        return Err(BadChunk("device events in the host stream".into()));
    }
    let core = core.unwrap_or(0);
    let mut events = Vec::with_capacity(n);
    for k in 0..n {
        let start_ns = undelta(d.start_ns[k], &mut p.device_start);
        let descriptor = undelta(d.descriptor[k], &mut p.descriptor);
        let descriptor = u32::try_from(descriptor)
            .map_err(|_| BadChunk(format!("device event {k} has descriptor id {descriptor}")))?;
        events.push(DeviceEvent {
            core,
            id: undelta(d.id[k].wrapping_add(1), &mut p.device_id),
            exec_id: from_optional(undelta(d.exec_id[k], &mut p.device_exec)),
            start_ns,
            end_ns: start_ns.wrapping_add(d.duration_ns[k]),
            descriptor: DescriptorId(descriptor),
        });
    }
    Ok(events)
}
