//! A reference model of what a writer was given, per stream, and a comparison of it
//! with what a reader gives back.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use ntff::{Chunk, Descriptor, DeviceEvent, NtffFile, SyncPoint, SystemEvent};

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
