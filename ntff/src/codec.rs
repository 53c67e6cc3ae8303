//! Event chunks as columns: the encoder a writer fills one event at a time, and the
//! decoder that turns a chunk payload back into events. Timestamps, ids and
//! descriptors are delta coded against the previous event of the chunk, so a device
//! instruction usually costs one or two bytes per column on disk.

use crate::model::{
    Arg, ArgValue, Chunk, ChunkInfo, Clock, DescriptorId, DeviceEvent, Loss, Phase, SyncPoint, SystemEvent,
};
use crate::model::{core_of_stream, stream_code};
use crate::proto;
use crate::wire::{WIRE_BYTES, WIRE_VARINT, Wire, put_key, put_varint, varint_len};

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

/// Field numbers of the chunk message and its column messages (`proto/ntff.proto`).
const CHUNK_STREAM: u32 = 1;
const CHUNK_BASE_NS: u32 = 2;
const CHUNK_SYSTEM: u32 = 3;
const CHUNK_DEVICE: u32 = 4;
const CHUNK_LOSSES: u32 = 5;
const CHUNK_SYNC_POINTS: u32 = 6;
/// System columns are fields 1 to 12 in this order, device columns fields 1 to 5.
const SYSTEM_COLUMNS: usize = 12;
const DEVICE_COLUMNS: usize = 5;
const S_TIMESTAMP: usize = 0;
const S_ID: usize = 1;
const S_NAME: usize = 2;
const S_FLAGS: usize = 3;
const S_TRACKING: usize = 4;
const S_THREAD: usize = 5;
const S_EXEC: usize = 6;
const S_MODEL: usize = 7;
const S_NRTA: usize = 8;
const S_ARG_COUNT: usize = 9;
const S_ARG_KEY: usize = 10;
const S_ARG_VALUE: usize = 11;
const D_START: usize = 0;
const D_DURATION: usize = 1;
const D_DESCRIPTOR: usize = 2;
const D_ID: usize = 3;
const D_EXEC: usize = 4;

/// The encoded size of a message made of the non-empty packed `columns`.
fn columns_len(columns: &[Vec<u8>]) -> usize {
    columns
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.is_empty())
        .map(|(k, c)| varint_len(((k as u64 + 1) << 3) | 2) + varint_len(c.len() as u64) + c.len())
        .sum()
}

/// Appends the non-empty `columns` as packed fields 1, 2, ….
fn put_columns(buf: &mut Vec<u8>, columns: &[Vec<u8>]) {
    for (k, column) in columns.iter().enumerate() {
        if !column.is_empty() {
            put_key(buf, k as u32 + 1, WIRE_BYTES);
            put_varint(buf, column.len() as u64);
            buf.extend_from_slice(column);
        }
    }
}

/// A chunk being filled by a writer: each column is kept as the packed varints it is
/// written as, so closing a chunk only concatenates them. An encoder is reused for
/// the next chunk of its stream, buffers and all.
#[derive(Debug)]
pub(crate) struct ChunkEncoder {
    stream: u32,
    base_ns: u64,
    system: [Vec<u8>; SYSTEM_COLUMNS],
    device: [Vec<u8>; DEVICE_COLUMNS],
    losses: Vec<proto::Loss>,
    sync_points: Vec<proto::SyncPoint>,
    args: usize,
    previous: Previous,
    info: ChunkInfo,
}

impl ChunkEncoder {
    pub(crate) fn new(core: Option<u32>, base_ns: u64) -> ChunkEncoder {
        ChunkEncoder {
            stream: stream_code(core),
            base_ns,
            system: Default::default(),
            device: Default::default(),
            losses: Vec::new(),
            sync_points: Vec::new(),
            args: 0,
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

    /// Empties the encoder for a new chunk of stream `core`, keeping its buffers.
    pub(crate) fn reset(&mut self, core: Option<u32>, base_ns: u64) {
        let mut system = std::mem::take(&mut self.system);
        let mut device = std::mem::take(&mut self.device);
        let mut losses = std::mem::take(&mut self.losses);
        let mut sync_points = std::mem::take(&mut self.sync_points);
        system.iter_mut().for_each(Vec::clear);
        device.iter_mut().for_each(Vec::clear);
        losses.clear();
        sync_points.clear();
        *self = ChunkEncoder { system, device, losses, sync_points, ..ChunkEncoder::new(core, base_ns) };
    }

    /// Events in the chunk.
    pub(crate) fn len(&self) -> usize {
        (self.info.system_events + self.info.device_events) as usize
    }

    pub(crate) fn args(&self) -> usize {
        self.args
    }

    pub(crate) fn push_system(&mut self, e: &SystemEvent) {
        let p = &mut self.previous;
        let s = &mut self.system;
        put_varint(&mut s[S_TIMESTAMP], zigzag(delta(e.timestamp_ns, &mut p.system_timestamp)));
        put_varint(&mut s[S_ID], zigzag(delta(e.id, &mut p.system_id).wrapping_sub(1)));
        put_varint(&mut s[S_NAME], u64::from(e.name.0));
        let phase = match e.phase {
            Phase::Start => 0,
            Phase::Stop => 1,
            Phase::Instant => 2,
        };
        let clock = if e.clock == Clock::Device { FLAG_DEVICE_CLOCK } else { 0 };
        put_varint(&mut s[S_FLAGS], u64::from(phase | clock));
        put_varint(&mut s[S_TRACKING], zigzag(delta(e.tracking_id, &mut p.tracking_id)));
        put_varint(&mut s[S_THREAD], u64::from(e.thread_id));
        put_varint(&mut s[S_EXEC], zigzag(delta(optional(e.exec_id), &mut p.system_exec)));
        put_varint(&mut s[S_MODEL], u64::from(e.model_id.map_or(0, |m| m.wrapping_add(1))));
        put_varint(&mut s[S_NRTA], zigzag(delta(optional(e.nrta_seq_id), &mut p.nrta_seq)));
        put_varint(&mut s[S_ARG_COUNT], e.args.len() as u64);
        for arg in &e.args {
            let (kind, value) = match arg.value {
                ArgValue::U64(v) => (ARG_U64, v),
                ArgValue::I64(v) => (ARG_I64, zigzag(v)),
                ArgValue::Str(sym) => (ARG_STR, u64::from(sym.0)),
            };
            put_varint(&mut s[S_ARG_KEY], u64::from(arg.key.0 << 2 | kind));
            put_varint(&mut s[S_ARG_VALUE], value);
        }
        self.args += e.args.len();
        self.info.system_events += 1;
        let t = e.timestamp_ns;
        match e.clock {
            Clock::Host => self.info.host_span = Some(widen(self.info.host_span, t, t)),
            Clock::Device => self.info.device_span = Some(widen(self.info.device_span, t, t)),
        }
    }

    pub(crate) fn push_device(&mut self, e: &DeviceEvent) {
        let p = &mut self.previous;
        let d = &mut self.device;
        put_varint(&mut d[D_START], zigzag(delta(e.start_ns, &mut p.device_start)));
        put_varint(&mut d[D_DURATION], e.end_ns.wrapping_sub(e.start_ns));
        put_varint(&mut d[D_DESCRIPTOR], zigzag(delta(u64::from(e.descriptor.0), &mut p.descriptor)));
        put_varint(&mut d[D_ID], zigzag(delta(e.id, &mut p.device_id).wrapping_sub(1)));
        put_varint(&mut d[D_EXEC], zigzag(delta(optional(e.exec_id), &mut p.device_exec)));
        self.info.device_events += 1;
        let (low, high) = (e.start_ns.min(e.end_ns), e.start_ns.max(e.end_ns));
        self.info.device_span = Some(widen(self.info.device_span, low, high));
    }

    pub(crate) fn push_loss(&mut self, device: bool, events: u64) {
        let before = if device { self.info.device_events } else { self.info.system_events };
        self.losses.push(proto::Loss { device, before, events });
        self.info.lost_events = self.info.lost_events.saturating_add(events);
    }

    pub(crate) fn push_sync_point(&mut self, point: SyncPoint) {
        self.sync_points.push(proto::SyncPoint { host_ns: point.host_ns, device_ns: point.device_ns });
    }

    /// Encodes the chunk message into `buffer`; returns what the index says about it
    /// (its offset still to be set).
    pub(crate) fn finish(&self, buffer: &mut Vec<u8>) -> ChunkInfo {
        buffer.clear();
        if self.stream != 0 {
            put_key(buffer, CHUNK_STREAM, WIRE_VARINT);
            put_varint(buffer, u64::from(self.stream));
        }
        if self.base_ns != 0 {
            put_key(buffer, CHUNK_BASE_NS, WIRE_VARINT);
            put_varint(buffer, self.base_ns);
        }
        for (field, columns) in [(CHUNK_SYSTEM, &self.system[..]), (CHUNK_DEVICE, &self.device[..])] {
            let len = columns_len(columns);
            if len > 0 {
                put_key(buffer, field, WIRE_BYTES);
                put_varint(buffer, len as u64);
                put_columns(buffer, columns);
            }
        }
        for loss in &self.losses {
            prost::encoding::message::encode(CHUNK_LOSSES, loss, buffer);
        }
        for point in &self.sync_points {
            prost::encoding::message::encode(CHUNK_SYNC_POINTS, point, buffer);
        }
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

/// Decodes a chunk payload into events: straight from the packed columns, or through
/// the generated types for a payload laid out otherwise (unpacked or split columns,
/// which protobuf allows but the writer does not produce) or damaged, so that every
/// error is reported the same way.
pub(crate) fn decode_chunk(payload: &[u8]) -> Result<Chunk, BadChunk> {
    decode_chunk_reusing(payload, Chunk::default())
}

/// [`decode_chunk`] into the buffers of `spare`, a chunk done with: a reader going
/// through many chunks allocates (and the kernel zeroes) their memory once.
pub(crate) fn decode_chunk_reusing(payload: &[u8], spare: Chunk) -> Result<Chunk, BadChunk> {
    match decode_direct(payload, spare) {
        Some(chunk) => Ok(chunk),
        None => decode_chunk_generated(payload),
    }
}

/// Values in a packed column, when it is well formed at its end.
fn packed_count(column: &[u8]) -> Option<usize> {
    match column.last() {
        Some(&last) if last >= 0x80 => None,
        _ => Some(column.iter().filter(|&&b| b < 0x80).count()),
    }
}

/// The packed columns (fields 1 to N) of a column message; `None` when a column is
/// unpacked or split.
fn columns<const N: usize>(message: &[u8]) -> Option<[&[u8]; N]> {
    let mut columns: [Option<&[u8]>; N] = [None; N];
    let mut wire = Wire::new(message);
    while !wire.done() {
        let (field, kind) = wire.key()?;
        let slot = field as usize - 1;
        if slot < N {
            if kind != WIRE_BYTES || columns[slot].is_some() {
                return None;
            }
            columns[slot] = Some(wire.bytes()?);
        } else {
            wire.skip(kind)?;
        }
    }
    Some(columns.map(|c| c.unwrap_or_default()))
}

/// The direct decoding; `None` for anything it does not take (the generated types
/// then decode the payload, or say what is wrong with it).
fn decode_direct(payload: &[u8], spare: Chunk) -> Option<Chunk> {
    let (mut stream, mut base_ns) = (0u32, 0u64);
    let (mut system, mut device): (Option<&[u8]>, Option<&[u8]>) = (None, None);
    let Chunk { system: mut system_events, device: mut device_events, mut losses, mut sync_points, .. } = spare;
    system_events.clear();
    device_events.clear();
    losses.clear();
    sync_points.clear();
    let mut wire = Wire::new(payload);
    while !wire.done() {
        match wire.key()? {
            (CHUNK_STREAM, WIRE_VARINT) => stream = wire.varint()? as u32,
            (CHUNK_BASE_NS, WIRE_VARINT) => base_ns = wire.varint()?,
            (CHUNK_SYSTEM, WIRE_BYTES) if system.is_none() => system = Some(wire.bytes()?),
            (CHUNK_DEVICE, WIRE_BYTES) if device.is_none() => device = Some(wire.bytes()?),
            (CHUNK_LOSSES, WIRE_BYTES) => {
                let l: proto::Loss = prost::Message::decode(wire.bytes()?).ok()?;
                losses.push(Loss { device: l.device, before: l.before, events: l.events });
            }
            (CHUNK_SYNC_POINTS, WIRE_BYTES) => {
                let s: proto::SyncPoint = prost::Message::decode(wire.bytes()?).ok()?;
                sync_points.push(SyncPoint { host_ns: s.host_ns, device_ns: s.device_ns });
            }
            (CHUNK_STREAM..=CHUNK_SYNC_POINTS, _) => return None,
            (_, kind) => wire.skip(kind)?,
        }
    }
    let core = core_of_stream(stream);
    let mut previous = Previous::at(base_ns);
    let system = match system {
        Some(message) => system_direct(columns::<SYSTEM_COLUMNS>(message)?, core, &mut previous, system_events)?,
        None => system_events,
    };
    let device = match device {
        Some(message) => device_direct(columns::<DEVICE_COLUMNS>(message)?, core, &mut previous, device_events)?,
        None => device_events,
    };
    for l in &losses {
        let len = if l.device { device.len() } else { system.len() };
        if l.before as usize > len {
            return None;
        }
    }
    Some(Chunk { core, system, device, losses, sync_points })
}

/// The system events of a chunk, appended to `events` (empty).
fn system_direct(
    columns: [&[u8]; SYSTEM_COLUMNS],
    core: Option<u32>,
    p: &mut Previous,
    mut events: Vec<SystemEvent>,
) -> Option<Vec<SystemEvent>> {
    let n = packed_count(columns[S_TIMESTAMP])?;
    let mut c = columns.map(Wire::new);
    events.reserve(n);
    for _ in 0..n {
        let timestamp = c[S_TIMESTAMP].packed()?;
        let id = c[S_ID].packed()?;
        let name = c[S_NAME].packed()?;
        let flags = c[S_FLAGS].packed()? as u32;
        let tracking = c[S_TRACKING].packed()?;
        let thread = c[S_THREAD].packed()?;
        let exec = c[S_EXEC].packed()?;
        let model = c[S_MODEL].packed()?;
        let nrta = c[S_NRTA].packed()?;
        let count = c[S_ARG_COUNT].packed()? as u32 as usize;
        let phase = match flags & FLAG_PHASE_MASK {
            0 => Phase::Start,
            1 => Phase::Stop,
            2 => Phase::Instant,
            _ => return None,
        };
        let mut args = Vec::with_capacity(count);
        for _ in 0..count {
            let key = c[S_ARG_KEY].packed()? as u32;
            let raw = c[S_ARG_VALUE].packed()?;
            let value = match key & 0b11 {
                ARG_U64 => ArgValue::U64(raw),
                ARG_I64 => ArgValue::I64(unzigzag(raw)),
                ARG_STR => ArgValue::Str(crate::Sym(u32::try_from(raw).ok()?)),
                _ => return None,
            };
            args.push(Arg { key: crate::Sym(key >> 2), value });
        }
        events.push(SystemEvent {
            core,
            id: undelta(unzigzag(id).wrapping_add(1), &mut p.system_id),
            name: crate::Sym(name as u32),
            phase,
            clock: if flags & FLAG_DEVICE_CLOCK != 0 { Clock::Device } else { Clock::Host },
            timestamp_ns: undelta(unzigzag(timestamp), &mut p.system_timestamp),
            tracking_id: undelta(unzigzag(tracking), &mut p.tracking_id),
            thread_id: thread as u32,
            exec_id: from_optional(undelta(unzigzag(exec), &mut p.system_exec)),
            model_id: (model as u32).checked_sub(1),
            nrta_seq_id: from_optional(undelta(unzigzag(nrta), &mut p.nrta_seq)),
            args,
        });
    }
    // Every column read to its end: none held more values than the events.
    c.iter().all(Wire::done).then_some(events)
}

/// The device events of a chunk, appended to `events` (empty).
fn device_direct(
    columns: [&[u8]; DEVICE_COLUMNS],
    core: Option<u32>,
    p: &mut Previous,
    mut events: Vec<DeviceEvent>,
) -> Option<Vec<DeviceEvent>> {
    let n = packed_count(columns[D_START])?;
    if n > 0 && core.is_none() {
        return None;
    }
    let core = core.unwrap_or(0);
    // The five columns side by side: their decodings do not depend on each other, so
    // the processor overlaps them.
    let [mut start, mut duration, mut descriptor, mut id, mut exec] = columns.map(Wire::new);
    events.reserve(n);
    for _ in 0..n {
        let (s, d, x, i, e) = (start.packed()?, duration.packed()?, descriptor.packed()?, id.packed()?, exec.packed()?);
        let start_ns = undelta(unzigzag(s), &mut p.device_start);
        let descriptor = u32::try_from(undelta(unzigzag(x), &mut p.descriptor)).ok()?;
        events.push(DeviceEvent {
            core,
            id: undelta(unzigzag(i).wrapping_add(1), &mut p.device_id),
            exec_id: from_optional(undelta(unzigzag(e), &mut p.device_exec)),
            start_ns,
            end_ns: start_ns.wrapping_add(d),
            descriptor: DescriptorId(descriptor),
        });
    }
    [start, duration, descriptor, id, exec].iter().all(Wire::done).then_some(events)
}

/// Decodes a chunk payload through the generated types: any valid layout, and the
/// reason when it is not valid.
pub(crate) fn decode_chunk_generated(payload: &[u8]) -> Result<Chunk, BadChunk> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sym;

    fn system(k: u64) -> SystemEvent {
        SystemEvent {
            core: Some(1),
            id: 10 + k,
            name: Sym(3 + (k % 2) as u32),
            phase: [Phase::Start, Phase::Stop, Phase::Instant][k as usize % 3],
            clock: if k.is_multiple_of(4) { Clock::Device } else { Clock::Host },
            timestamp_ns: 1_000_000_000 + k * 12_345 + (k % 3) * 1_000_000_007,
            tracking_id: k / 2,
            thread_id: 12_642,
            exec_id: (!k.is_multiple_of(5)).then_some(k * 3),
            model_id: k.is_multiple_of(2).then_some(7),
            nrta_seq_id: k.is_multiple_of(7).then_some(u64::MAX - 2 - k),
            args: (0..k % 4)
                .map(|a| Arg {
                    key: Sym(9 + a as u32),
                    value: [ArgValue::U64(k << 40), ArgValue::I64(-(k as i64) * 1_000), ArgValue::Str(Sym(11))]
                        [a as usize % 3],
                })
                .collect(),
        }
    }

    fn device(k: u64) -> DeviceEvent {
        DeviceEvent {
            core: 1,
            id: 100 + k * (1 + k % 3),
            exec_id: (!k.is_multiple_of(9)).then_some(k / 10),
            start_ns: 5_000_000 + k * 700 - (k % 5) * 3,
            end_ns: 5_000_000 + k * 700 + 450 + (k % 11) * 100_000_000,
            descriptor: DescriptorId((k % 17) as u32 * 1_000),
        }
    }

    fn encoded() -> Vec<u8> {
        let mut encoder = ChunkEncoder::new(Some(1), 999);
        for k in 0..500 {
            encoder.push_system(&system(k));
            encoder.push_device(&device(k));
            if k % 100 == 0 {
                encoder.push_loss(k % 200 == 0, k + 1);
                encoder.push_sync_point(SyncPoint { host_ns: k, device_ns: k * 2 });
            }
        }
        let mut payload = Vec::new();
        encoder.finish(&mut payload);
        payload
    }

    #[test]
    fn direct_decoding_matches_the_generated_types() {
        let payload = encoded();
        let direct = decode_direct(&payload, Chunk::default()).expect("the writer's layout is read directly");
        assert_eq!(direct, decode_chunk_generated(&payload).expect("valid"));
        assert_eq!(direct.system, (0..500).map(system).collect::<Vec<_>>());
        assert_eq!(direct.device, (0..500).map(device).collect::<Vec<_>>());
    }

    #[test]
    fn other_valid_layouts_decode_through_the_generated_types() {
        // The same chunk re-encoded by prost, then with one column split in two
        // packed runs (valid protobuf, which the direct path leaves to prost).
        let chunk: proto::Chunk = prost::Message::decode(encoded().as_slice()).expect("valid");
        let reencoded = prost::Message::encode_to_vec(&chunk);
        assert_eq!(decode_chunk(&reencoded), decode_chunk_generated(&reencoded));
        let mut columns = chunk.device.clone().expect("device columns");
        let tail = columns.duration_ns.split_off(250);
        let mut message = prost::Message::encode_to_vec(&columns);
        let extra = proto::DeviceColumns { duration_ns: tail, ..Default::default() };
        message.extend(prost::Message::encode_to_vec(&extra));
        let mut split = chunk.clone();
        split.device = None;
        let mut payload = prost::Message::encode_to_vec(&split);
        prost::encoding::encode_key(CHUNK_DEVICE, prost::encoding::WireType::LengthDelimited, &mut payload);
        prost::encoding::encode_varint(message.len() as u64, &mut payload);
        payload.extend(message);
        assert!(decode_direct(&payload, Chunk::default()).is_none());
        assert_eq!(decode_chunk(&payload).expect("valid").device, (0..500).map(device).collect::<Vec<_>>());
    }

    #[test]
    fn damaged_payloads_fail_the_same_way_on_both_paths() {
        let payload = encoded();
        for cut in [1, 7, payload.len() / 3, payload.len() / 2, payload.len() - 1] {
            let cut = &payload[..cut];
            assert_eq!(decode_chunk(cut), decode_chunk_generated(cut), "cut at {}", cut.len());
        }
        let mut flipped = payload.clone();
        for k in (0..flipped.len()).step_by(97) {
            flipped[k] ^= 0x55;
            assert_eq!(decode_chunk(&flipped), decode_chunk_generated(&flipped), "byte {k}");
            flipped[k] ^= 0x55;
        }
    }
}
