//! Every event written is read back identical, per stream and in order, with its
//! strings, descriptors, losses and sync points.

mod common;

use common::{Stream, Streams, read_all};
use ntff::{
    Arg, ArgValue, Clock, Descriptor, DeviceEvent, Metadata, NtffFile, Phase, Sym, SyncPoint, SystemEvent, Writer,
};
use proptest::prelude::*;

const NAMES: [&str; 5] = ["nrt_execute", "nrt_load", "nc_exec_running", "hw_notify", "timestamp_sync_point"];
const KEYS: [&str; 4] = ["status", "bytes", "tensor_name", "message"];

#[derive(Debug, Clone)]
enum Op {
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

fn any_u64() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..1000, any::<u64>(), Just(u64::MAX - 1)]
}

fn op() -> impl Strategy<Value = Op> {
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
fn write(ops: &[Op]) -> (Vec<u8>, Streams) {
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

/// Losses at the same position are one gap to a reader; merge them for comparing.
fn merged(streams: &Streams) -> Streams {
    let mut out = streams.clone();
    for stream in out.values_mut() {
        let mut losses: Vec<(bool, u64, u64)> = Vec::new();
        let mut sorted = stream.losses.clone();
        sorted.sort_by_key(|&(device, before, _)| (device, before));
        for (device, before, events) in sorted {
            match losses.last_mut() {
                Some(last) if last.0 == device && last.1 == before => last.2 += events,
                _ => losses.push((device, before, events)),
            }
        }
        stream.losses = losses;
    }
    out.retain(|_, s| *s != Stream::default());
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_event_written_is_read_back_identical(ops in prop::collection::vec(op(), 0..300)) {
        let (bytes, expected) = write(&ops);
        let file = NtffFile::from_bytes(bytes).expect("opens");
        prop_assert!(file.recovery().is_clean(), "{:?}", file.recovery());
        prop_assert_eq!(file.metadata().pid, 42);
        let read = read_all(&file);
        prop_assert_eq!(merged(&read), merged(&expected));
        // Names resolve to what was interned.
        for stream in read.values() {
            for e in &stream.system {
                let name = file.string(e.name).expect("name is in the table");
                prop_assert!(NAMES.contains(&name));
            }
            for e in &stream.device {
                prop_assert!(file.descriptor(e.descriptor).is_some());
            }
        }
    }
}

#[test]
fn large_streams_span_many_chunks_and_read_back_identical() {
    let mut ops = Vec::new();
    let mut t = 1_000_000_000u64;
    for k in 0..300_000u64 {
        t += 700 + k % 13;
        ops.push(Op::Device {
            core: (k % 2) as u32,
            descriptor: (true, (k % 5) as u32, 1),
            fields: [k, t, t + 650, 0],
            exec: Some(k / 100),
        });
        if k % 1000 == 0 {
            ops.push(Op::System {
                core: Some((k % 2) as u32),
                name: 0,
                phase: 0,
                device_clock: false,
                fields: [k, t, k, 7, k + 1, 4],
                args: vec![(0, 1, 3)],
            });
        }
    }
    let (bytes, expected) = write(&ops);
    let file = NtffFile::from_bytes(bytes).expect("opens");
    assert!(file.chunks().len() >= 4, "{} chunks", file.chunks().len());
    assert!(file.chunks().iter().all(|c| (c.system_events + c.device_events) as usize <= ntff::MAX_CHUNK_EVENTS));
    assert_eq!(merged(&read_all(&file)), merged(&expected));
    // The index seeks by core and by host time.
    let core1: Vec<_> = file.select(Some(&[1]), None).collect();
    assert!(!core1.is_empty() && core1.iter().all(|c| c.core == Some(1)));
    let early = file.select(None, Some(0..1_000_000_100)).count();
    assert!(early < file.chunks().len());
    let names: Vec<Sym> = read_all(&file).values().flat_map(|s| s.system.iter().map(|e| e.name)).collect();
    assert!(names.iter().all(|&n| file.string(n) == Some("nrt_execute")));
}
