//! A reference model of what a writer was given, per stream, and a comparison of it
//! with what a reader gives back.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use ntff::{
    Arg, ArgValue, Chunk, Clock, Descriptor, DeviceEvent, Metadata, NtffFile, Phase, SyncPoint, SystemEvent, Writer,
};
use proptest::prelude::*;

/// What one stream (a core, or the host) holds, with loss positions counted from the
/// stream's first event.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stream {
    pub system: Vec<SystemEvent>,
    pub device: Vec<DeviceEvent>,
    /// (device?, events before it in the stream, events lost)
    pub losses: Vec<(bool, u64, u64)>,
    pub sync_points: Vec<SyncPoint>,
}

pub type Streams = BTreeMap<Option<u32>, Stream>;

/// Adds a decoded chunk to the streams read so far.
pub fn add_chunk(streams: &mut Streams, chunk: Chunk) {
    let stream = streams.entry(chunk.core).or_default();
    let (system_before, device_before) = (stream.system.len() as u64, stream.device.len() as u64);
    for loss in chunk.losses {
        let before = if loss.device { device_before } else { system_before };
        stream.losses.push((loss.device, before + u64::from(loss.before), loss.events));
    }
    stream.system.extend(chunk.system);
    stream.device.extend(chunk.device);
    stream.sync_points.extend(chunk.sync_points);
}

/// Every stream of a file, reading each chunk; panics on a damaged one.
pub fn read_all(file: &NtffFile) -> Streams {
    let mut streams = Streams::new();
    for info in file.chunks() {
        add_chunk(&mut streams, file.read_chunk(info).expect("chunk decodes"));
    }
    streams
}

/// The descriptor of a device event as owned strings, for comparing across files.
pub fn describe(file: &NtffFile, d: &Descriptor) -> String {
    match *d {
        Descriptor::Instruction { model_id, engine, opcode, hlo, step, flops, bytes_read, bytes_written } => format!(
            "{model_id} {} {} {} {step} {flops} {bytes_read} {bytes_written}",
            file.string_or_placeholder(engine),
            file.string_or_placeholder(opcode),
            file.string_or_placeholder(hlo)
        ),
        Descriptor::Dma { model_id, queue, index, bytes } => {
            format!("{model_id} {} {index} {bytes}", file.string_or_placeholder(queue))
        }
    }
}

/// Random streams: any field values, in any order, with losses, sync points and flushes.
pub const NAMES: [&str; 5] = ["nrt_execute", "nrt_load", "nc_exec_running", "hw_notify", "timestamp_sync_point"];
pub const KEYS: [&str; 4] = ["status", "bytes", "tensor_name", "message"];

#[derive(Debug, Clone)]
pub enum Op {
    System {
        core: Option<u32>,
        name: usize,
        phase: u8,
        device_clock: bool,
        fields: [u64; 6],
        args: Vec<(usize, u8, u64)>,
    },
    Device {
        core: u32,
        descriptor: (bool, u32, u64),
        fields: [u64; 4],
        exec: Option<u64>,
    },
    Loss {
        core: Option<u32>,
        device: bool,
        events: u64,
    },
    Sync {
        core: u32,
        host: u64,
        device: u64,
    },
    Flush,
}

pub fn any_u64() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..1000, any::<u64>(), Just(u64::MAX - 1)]
}

pub fn op() -> impl Strategy<Value = Op> {
    let core = prop::option::of(0u32..3);
    prop_oneof![
        4 => (core.clone(), 0..NAMES.len(), 0u8..3, any::<bool>(), prop::array::uniform6(any_u64()),
              prop::collection::vec((0..KEYS.len(), 0u8..3, any::<u64>()), 0..4))
            .prop_map(|(core, name, phase, device_clock, fields, args)| Op::System { core, name, phase, device_clock, fields, args }),
        6 => (0u32..3, (any::<bool>(), 0u32..6, 0u64..4), prop::array::uniform4(any_u64()), prop::option::of(0u64..u64::MAX))
            .prop_map(|(core, descriptor, fields, exec)| Op::Device { core, descriptor, fields, exec }),
        1 => (core, any::<bool>(), 1u64..1_000_000).prop_map(|(core, device, events)| Op::Loss { core, device, events }),
        1 => (0u32..3, any::<u64>(), any::<u64>()).prop_map(|(core, host, device)| Op::Sync { core, host, device }),
        1 => Just(Op::Flush),
    ]
}

/// Writes `ops`; returns the file and the reference streams (with the writer's ids).
pub fn write(ops: &[Op]) -> (Vec<u8>, Streams) {
    let metadata = Metadata { runtime_version: "test".into(), pid: 42, ..Metadata::default() };
    let mut writer = Writer::new(Vec::new(), &metadata).expect("header");
    let mut streams = Streams::new();
    for op in ops {
        match op {
            Op::System { core, name, phase, device_clock, fields, args } => {
                let args = args
                    .iter()
                    .map(|&(key, kind, value)| Arg {
                        key: writer.intern(KEYS[key]),
                        value: match kind {
                            0 => ArgValue::U64(value),
                            1 => ArgValue::I64(value as i64),
                            _ => ArgValue::Str(writer.intern(&format!("value {}", value % 7))),
                        },
                    })
                    .collect();
                let event = SystemEvent {
                    core: *core,
                    id: fields[0],
                    name: writer.intern(NAMES[*name]),
                    phase: [Phase::Start, Phase::Stop, Phase::Instant][*phase as usize],
                    clock: if *device_clock { Clock::Device } else { Clock::Host },
                    timestamp_ns: fields[1],
                    tracking_id: fields[2],
                    thread_id: fields[3] as u32,
                    exec_id: (fields[4] % 3 != 0).then(|| fields[4].min(u64::MAX - 1)),
                    model_id: (fields[5] % 2 == 0).then_some((fields[5] >> 1) as u32 % (u32::MAX - 1)),
                    nrta_seq_id: (fields[5] % 3 == 0).then(|| fields[0].min(u64::MAX - 1)),
                    args,
                };
                writer.system(&event).expect("write");
                streams.entry(*core).or_default().system.push(event);
            }
            Op::Device { core, descriptor: (instruction, step, model), fields, exec } => {
                let descriptor = if *instruction {
                    Descriptor::Instruction {
                        model_id: *model as u32,
                        engine: writer.intern(["PE", "ACT", "DVE"][*step as usize % 3]),
                        opcode: writer.intern(&format!("op{step}")),
                        hlo: writer.intern(&format!("dot.{step}")),
                        step: *step,
                        flops: u64::from(*step) * 1000,
                        bytes_read: 64,
                        bytes_written: 32,
                    }
                } else {
                    Descriptor::Dma {
                        model_id: *model as u32,
                        queue: writer.intern("input"),
                        index: *step,
                        bytes: 4096,
                    }
                };
                let descriptor = writer.descriptor(&descriptor);
                let event = DeviceEvent {
                    core: *core,
                    id: fields[0],
                    exec_id: *exec,
                    start_ns: fields[1],
                    end_ns: fields[2],
                    descriptor,
                };
                writer.device(&event).expect("write");
                streams.entry(Some(*core)).or_default().device.push(event);
            }
            Op::Loss { core, device, events } => {
                writer.loss(*core, *device, *events).expect("write");
                let stream = streams.entry(*core).or_default();
                let before = if *device { stream.device.len() } else { stream.system.len() } as u64;
                stream.losses.push((*device, before, *events));
            }
            Op::Sync { core, host, device } => {
                let point = SyncPoint { host_ns: *host, device_ns: *device };
                writer.sync_point(*core, point).expect("write");
                streams.entry(Some(*core)).or_default().sync_points.push(point);
            }
            Op::Flush => writer.flush().expect("flush"),
        }
    }
    let (bytes, summary) = writer.finish().expect("finish");
    assert_eq!(summary.bytes, bytes.len() as u64);
    (bytes, streams)
}

/// A system event of core 0 and model 1 for execution `exec` (its tracking id too), at
/// `t` on `clock`: the spine of an execution (`nrt_execute`, `nc_exec_running`).
pub fn execution_event(name: ntff::Sym, phase: Phase, clock: Clock, t: u64, exec: u64) -> SystemEvent {
    SystemEvent {
        core: Some(0),
        id: 0,
        name,
        phase,
        clock,
        timestamp_ns: t,
        tracking_id: exec,
        thread_id: 1,
        exec_id: Some(exec),
        model_id: Some(1),
        nrta_seq_id: None,
        args: Vec::new(),
    }
}
